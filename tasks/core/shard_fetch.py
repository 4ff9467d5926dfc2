"""The model stage's shards, fetched: every shard of the splits training reads (and the validation split) brought
into the build's work directory as a flat token file, each checked against its sha256 in the manifest before a
token of it is written, within the cache budget (``WIKI_PIPELINE_CACHE_MAX``). Training draws each step's windows
uniformly from the whole split, so every step may read every shard: all of them are here before the first step.
Design: docs/TRAINING.md ("The shards training reads").
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mygpt.errors import UserError
from tasks.core.report import human_bytes
from tasks.core.shard_format import flatten_shard
from tasks.store import ArtifactStore

ENV_CACHE_MAX = "WIKI_PIPELINE_CACHE_MAX"
INDEX = "shards.json"
#: Shards fetched at once: reading, hashing, Parquet decoding and downloads let go of the GIL.
FETCH_THREADS = 4
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE | re.ASCII)
_UNITS = " kmgt"


def cache_budget() -> int | None:
    """``$WIKI_PIPELINE_CACHE_MAX`` in bytes (``20G``, ``512M``, ``1.5T``, ``1000000``: powers of 1024, ASCII
    digits), or None (unset or empty: no limit). ``UserError`` naming the variable for anything else."""
    raw = os.environ.get(ENV_CACHE_MAX, "")
    if not raw.strip():
        return None
    m = _SIZE_RE.match(raw)
    exact = float(m.group(1)) * 1024 ** _UNITS.index(m.group(2).lower() or " ") if m else 0.0
    if 0 < exact < 1:
        raise UserError(
            f"{ENV_CACHE_MAX}={raw!r} is below one byte: give at least 1 (a number of bytes), or a size with K, M, "
            f"G or T (powers of 1024), e.g. {ENV_CACHE_MAX}=20G; unset it for no limit"
        )
    if exact <= 0:
        raise UserError(
            f"{ENV_CACHE_MAX}={raw!r} is not a size: give a positive number of bytes, or one with K, M, G or T "
            f"(powers of 1024), e.g. {ENV_CACHE_MAX}=20G; unset it for no limit"
        )
    return int(exact)


def size_at_least(n: int) -> str:
    """A value of ``WIKI_PIPELINE_CACHE_MAX`` that :func:`cache_budget` reads as at least ``n`` bytes, short: the
    largest unit, one decimal, rounded up (a rounded-down figure would advise a value that is still refused)."""
    for power in range(len(_UNITS) - 1, 0, -1):
        unit = 1024**power
        if n >= unit:
            tenths = math.ceil(n * 10 / unit)
            while int(tenths / 10 * unit) < n:  # float rounding: the value as cache_budget computes it
                tenths += 1
            return f"{tenths / 10:g}{_UNITS[power].upper()}"
    return str(n)


@dataclass(frozen=True)
class Shard:
    name: str  # the Parquet file in the version
    tokens: int
    parquet_bytes: int

    @property
    def flat(self) -> str:
        return self.name.removesuffix(".parquet") + ".bin"


@dataclass(frozen=True)
class FetchedShards:
    """What :func:`fetch_shards` brought: the flat token files of the training splits and of ``valid`` (paths, in
    index order: each list read as one sequence), their dtype and token counts, and the seconds it took."""

    train: list[str]
    valid: list[str]
    dtype: str
    train_tokens: int
    valid_tokens: int
    seconds: float


def fetch_shards(store: ArtifactStore, version: str, folder: Path, splits: tuple[str, ...]) -> FetchedShards:
    """Every shard of ``splits`` and of ``valid`` of ``shards/<version>`` as a flat token file in ``folder``: each read
    once through :meth:`ArtifactStore.fetch_bytes`, :data:`FETCH_THREADS` at a time (the manifest's size and sha256
    checked; a mismatch is a ``UserError`` naming the file) and flattened from the very bytes that were hashed, so a
    file changed after the check cannot reach training. What ``folder`` holds from an earlier (killed) run is
    deleted first, never trusted by its size: every file training reads was checked by this call. ``UserError``
    before anything is fetched when ``WIKI_PIPELINE_CACHE_MAX`` cannot hold the token files (and, on an object
    store, the downloads in flight at once)."""
    t0 = time.perf_counter()
    incoming = folder / ".incoming"
    manifest = store.get("shards", version).manifest
    index = json.loads(store.fetch_bytes("shards", version, INDEX, incoming, manifest).decode("utf-8"))
    files = manifest["files"]

    def shards(split: str) -> list[Shard]:
        return [
            Shard(s["file"], int(s["tokens"]), int(files[s["file"]]["size"])) for s in index["splits"][split]["shards"]
        ]

    train = [s for split in splits for s in shards(split)]
    valid = shards("valid")
    dtype = np.dtype(index["dtype"])
    wanted = list(dict.fromkeys([*train, *valid]))  # once each: training on every split reads valid's shards too
    _check_budget(cache_budget(), wanted, dtype, store.remote)
    _clear(folder)
    shutil.rmtree(incoming, ignore_errors=True)  # the downloads a killed run left: not in the budget

    def fetch(shard: Shard) -> None:
        data = store.fetch_bytes("shards", version, shard.name, incoming, manifest)
        flatten_shard(data, folder / shard.flat, dtype, shard.tokens, name=shard.name)

    pool = concurrent.futures.ThreadPoolExecutor(fetch_threads(), "fetch-shard")
    try:
        for _ in pool.map(fetch, wanted):  # the first failure in index order is raised
            pass
    finally:
        pool.shutdown(cancel_futures=True)  # after a failure: the shards not yet started are not fetched
        shutil.rmtree(incoming, ignore_errors=True)
    return FetchedShards(
        train=[str(folder / s.flat) for s in train],
        valid=[str(folder / s.flat) for s in valid],
        dtype=dtype.name,
        train_tokens=sum(s.tokens for s in train),
        valid_tokens=sum(s.tokens for s in valid),
        seconds=time.perf_counter() - t0,
    )


def fetch_threads() -> int:
    """How many shards :func:`fetch_shards` fetches at once: :data:`FETCH_THREADS`, at most one a CPU."""
    return min(FETCH_THREADS, os.cpu_count() or 1)


def _check_budget(budget: int | None, shards: list[Shard], dtype: np.dtype, remote: bool) -> None:
    """``UserError`` when ``budget`` cannot hold every token file (and, on an object store, the largest downloads
    that can be on disk at once: one a fetch thread, each while it becomes a token file)."""
    if budget is None:
        return
    largest = sorted((s.parquet_bytes for s in shards), reverse=True)[: fetch_threads()] if remote else []
    download = sum(largest)
    need = sum(s.tokens for s in shards) * dtype.itemsize + download
    if need > budget:
        raise UserError(
            f"{ENV_CACHE_MAX}={os.environ.get(ENV_CACHE_MAX)} ({human_bytes(budget)}) cannot hold what training "
            f"reads: {human_bytes(need)} (every training and validation shard as a token file: each step draws "
            f"from the whole split{_downloads(len(largest)) if download else ''}); raise it to at least "
            f"{size_at_least(need)} ({need:,} bytes), or unset it"
        )


def _downloads(n: int) -> str:
    return ", and one download" if n == 1 else f", and {n} downloads at once"


def _clear(folder: Path) -> None:
    """Delete the token files an earlier run left in ``folder``, and those it was writing when killed (atomic_open's
    ``.<name>.bin.*.tmp``): only files of those patterns, never a folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for leftover in [*folder.glob("*.bin"), *folder.glob(".*.bin.*.tmp")]:
        if not leftover.is_dir():
            leftover.unlink(missing_ok=True)
