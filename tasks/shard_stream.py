"""The model stage's shards, streamed: a background thread brings a shards version's files into the build's work
directory as flat token files, in the order training reads them (:class:`mygpt.training.stream.BlockSchedule`),
each checked against its sha256 in the manifest before training may read it, a few blocks ahead and within the
cache budget (``WIKI_PIPELINE_CACHE_MAX``), deleting what training has read. Training starts as soon as its first
block is there, so the time to the first step does not grow with the number of shards. Design: docs/TRAINING.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mygpt.errors import UserError
from mygpt.training.stream import Block, BlockSchedule, failed_file, position_file
from tasks.core.report import human_bytes
from tasks.core.shard_format import flatten_shard
from tasks.store import ArtifactStore

ENV_CACHE_MAX = "WIKI_PIPELINE_CACHE_MAX"
LOOKAHEAD_BLOCKS = 2  # blocks fetched ahead of the one training reads (within the budget)
INDEX = "shards.json"
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def cache_budget() -> int | None:
    """``$WIKI_PIPELINE_CACHE_MAX`` in bytes (``20G``, ``512M``, ``1.5T``, ``1000000``: powers of 1024), or None
    (unset or empty: no limit). ``UserError`` naming the variable for anything else."""
    raw = os.environ.get(ENV_CACHE_MAX, "")
    if not raw.strip():
        return None
    m = _SIZE_RE.match(raw)
    value = int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2).lower() or " ")) if m else 0
    if value <= 0:
        raise UserError(
            f"{ENV_CACHE_MAX}={raw!r} is not a size: give a positive number of bytes, or one with K, M, G or T "
            f"(powers of 1024), e.g. {ENV_CACHE_MAX}=20G; unset it for no limit"
        )
    return value


@dataclass(frozen=True)
class Shard:
    name: str  # the Parquet file in the version
    tokens: int
    parquet_bytes: int

    @property
    def flat(self) -> str:
        return self.name.removesuffix(".parquet") + ".bin"


class ShardFetcher:
    """Fetches the shards of ``shards/<version>`` that steps ``start_step + 1 .. steps`` read into ``folder``
    (see the module): ``train`` and ``valid`` in index order, the validation split right after the first block
    and never deleted. ``readers`` processes report the block they read (``reading-<rank>``); a file no block from
    the slowest reader's on needs is deleted when the budget needs the room. A failure is written to
    ``folder/failed`` (the readers raise it) and kept in :attr:`error`."""

    def __init__(
        self,
        store: ArtifactStore,
        version: str,
        manifest: dict,
        folder: Path,
        train: list[Shard],
        valid: list[Shard],
        dtype: np.dtype,
        schedule: BlockSchedule,
        start_step: int,
        steps: int,
        readers: int,
        budget: int | None,
    ) -> None:
        self.store, self.version, self.manifest, self.folder = store, version, manifest, folder
        self.train, self.valid, self.dtype, self.readers, self.budget = train, valid, dtype, readers, budget
        self.blocks: list[Block] = list(schedule.blocks(start_step + 1, steps))
        self.error: BaseException | None = None
        self.fetched: list[str] = []  # the shards this fetcher brought, in order
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shard-fetcher", daemon=True)
        self.check_budget()

    def size(self, shard: Shard) -> int:
        return shard.tokens * self.dtype.itemsize

    def check_budget(self) -> None:
        """``UserError`` when the budget cannot hold the validation split and the largest block at once (and, on
        an object store, the download being turned into a token file)."""
        if self.budget is None:
            return
        block = max((sum(self.size(self.train[i]) for i in b.shards) for b in self.blocks), default=0)
        download = max((s.parquet_bytes for s in [*self.train, *self.valid]), default=0) if self.store.remote else 0
        need = sum(self.size(s) for s in self.valid) + block + download
        if need > self.budget:
            raise UserError(
                f"{ENV_CACHE_MAX}={os.environ.get(ENV_CACHE_MAX)} ({human_bytes(self.budget)}) cannot hold what "
                f"training reads at once: {human_bytes(need)} (the validation split and one block of shards"
                f"{', and one download' if download else ''}); raise it to at least {human_bytes(need)}, or unset it"
            )

    # ---- the thread ----------------------------------------------------------------------------------
    def start(self) -> ShardFetcher:
        self.folder.mkdir(parents=True, exist_ok=True)
        for stale in [failed_file(self.folder), *(position_file(self.folder, r) for r in range(self.readers))]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)  # a killed run's: the readers of this run report afresh
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop fetching (training ended); raises nothing: :attr:`error` says what failed."""
        self._stop.set()
        self._thread.join()
        shutil.rmtree(self.folder / ".incoming", ignore_errors=True)

    def _reading(self) -> int:
        """The position in :attr:`blocks` of the block the slowest reader reads (0 before it reports)."""
        first = self.blocks[0].index if self.blocks else 0
        least = None
        for rank in range(self.readers):
            try:
                with open(position_file(self.folder, rank), encoding="utf-8") as f:
                    at = int(f.read().strip() or first) - first
            except (OSError, ValueError):
                at = 0
            least = at if least is None else min(least, at)
        return max(least or 0, 0)

    def _order(self) -> list[tuple[int, Shard]]:
        """``(block position, shard)`` in the order training first reads them."""
        order: list[tuple[int, Shard]] = []
        for pos, block in enumerate(self.blocks):
            order += [(pos, self.train[i]) for i in block.shards]
            if pos == 0:
                order += [(0, s) for s in self.valid]
        return order

    def _run(self) -> None:
        try:
            held = {
                s.flat: self.size(s)
                for s in [*self.train, *self.valid]
                if (self.folder / s.flat).is_file() and (self.folder / s.flat).stat().st_size == self.size(s)
            }
            keep = {s.flat for s in self.valid}
            for pos, shard in self._order():
                if shard.flat in held:
                    continue
                need = self.size(shard) + (shard.parquet_bytes if self.store.remote else 0)
                while not self._room(pos, need, held, keep):
                    if self._stop.wait(0.02):
                        return
                if self._stop.is_set():
                    return
                self._fetch(shard)
                held[shard.flat] = self.size(shard)
        except BaseException as exc:  # handed to the readers (they raise it) and to the stage
            self.error = exc
            why = str(exc) if isinstance(exc, UserError) else f"fetching the shards failed: {type(exc).__name__}: {exc}"
            with contextlib.suppress(OSError):
                Path(failed_file(self.folder)).write_text(why + "\n", encoding="utf-8")

    def _room(self, pos: int, need: int, held: dict[str, int], keep: set[str]) -> bool:
        """Whether the shard for block position ``pos`` may be fetched now, deleting what no block from the
        slowest reader's to ``pos`` reads when the budget needs the room."""
        reading = self._reading()
        if pos > reading + LOOKAHEAD_BLOCKS:
            return False
        if self.budget is None or sum(held.values()) + need <= self.budget:
            return True
        wanted = keep | {self.train[i].flat for b in self.blocks[reading : pos + 1] for i in b.shards}
        for name in [n for n in held if n not in wanted]:
            (self.folder / name).unlink(missing_ok=True)
            del held[name]
        return sum(held.values()) + need <= self.budget

    def _fetch(self, shard: Shard) -> None:
        incoming = self.folder / ".incoming"
        local = self.store.fetch_file("shards", self.version, shard.name, incoming, self.manifest)
        try:
            flatten_shard(local, self.folder / shard.flat, self.dtype, shard.tokens)
        finally:
            if self.store.remote:
                local.unlink(missing_ok=True)
        self.fetched.append(shard.name)


def open_stream(
    store: ArtifactStore,
    version: str,
    folder: Path,
    splits: tuple[str, ...],
    schedule_args: tuple[int, int, int],
    start_step: int,
    steps: int,
    readers: int,
) -> tuple[ShardFetcher, dict, str, int, int]:
    """The fetcher (not started) for training on ``splits`` of ``shards/<version>`` (``schedule_args``: seed,
    global batch size, seq_len), the job's ``stream`` (:class:`mygpt.training.job.TrainJob`), the token dtype,
    and the training and validation token counts. Reads the version's index (``shards.json``) only."""
    manifest = store.get("shards", version).manifest
    local = store.fetch_file("shards", version, INDEX, folder / ".incoming", manifest)
    try:
        index = json.loads(local.read_text(encoding="utf-8"))
    finally:
        if store.remote:
            local.unlink(missing_ok=True)
    files = manifest["files"]

    def shards(split: str) -> list[Shard]:
        return [
            Shard(s["file"], int(s["tokens"]), int(files[s["file"]]["size"])) for s in index["splits"][split]["shards"]
        ]

    train = [s for split in splits for s in shards(split)]
    valid = shards("valid")
    dtype = np.dtype(index["dtype"])
    seed, batch_size, seq_len = schedule_args
    schedule = BlockSchedule([s.tokens for s in train], seed, batch_size * seq_len, seq_len + 1)
    fetcher = ShardFetcher(
        store, version, manifest, folder, train, valid, dtype, schedule, start_step, steps, readers, cache_budget()
    )
    spec = {
        "dir": str(folder),
        "train": [[str(folder / s.flat), s.tokens] for s in train],
        "valid": [[str(folder / s.flat), s.tokens] for s in valid],
    }
    return fetcher, spec, dtype.name, sum(s.tokens for s in train), sum(s.tokens for s in valid)
