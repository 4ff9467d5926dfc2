"""The model stage's shards, streamed: a background thread brings a shards version's files into the build's work
directory as flat token files, in the order training reads them (:class:`mygpt.training.stream.BlockSchedule`),
each checked against its sha256 in the manifest before training may read it, a few blocks ahead and within the
cache budget (``WIKI_PIPELINE_CACHE_MAX``), deleting what training has read. Training starts as soon as its first
block is there, so the time to the first step does not grow with the number of shards. Design: docs/TRAINING.md.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import os
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mygpt.errors import UserError
from mygpt.training.stream import Block, BlockSchedule, failed_file, heartbeat_file, position_file
from tasks.core.report import human_bytes
from tasks.core.shard_format import flatten_shard
from tasks.store import ArtifactStore

ENV_CACHE_MAX = "WIKI_PIPELINE_CACHE_MAX"
LOOKAHEAD_BLOCKS = 2  # blocks fetched ahead of the one training reads (within the budget)
INDEX = "shards.json"
HEARTBEAT_SECONDS = 1.0  # how often the fetcher's heartbeat changes (readers allow it far longer)
POLL = 0.02
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


class ShardFetcher:
    """Fetches the shards of ``shards/<version>`` that steps ``start_step + 1 .. steps`` read into ``folder``
    (see the module): ``train`` and ``valid`` in index order, the validation split right after the first block
    and never deleted. ``readers`` processes report the block they read (``reading-<rank>``); a file no block from
    the slowest reader's on needs is deleted when the budget needs the room. A file that vanishes (deleted by
    hand) is brought again while a reader may still need it. Token files left by an earlier run are deleted, never
    reused: what training reads was checked against the manifest by this fetcher. A failure is written to
    ``folder/failed`` (the readers raise it) and kept in :attr:`error`; while the fetcher runs, its heartbeat
    (:func:`mygpt.training.stream.heartbeat_file`) changes, so readers end even where the marker cannot be
    written."""

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
        self._beating = threading.Thread(target=self._beat, name="shard-fetcher-heartbeat", daemon=True)
        self._positions: dict[int, int] = {}  # each reader's last reported block (a deleted report keeps it)
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
                f"{', and one download' if download else ''}); raise it to at least {size_at_least(need)} "
                f"({need:,} bytes), or unset it"
            )

    # ---- the thread ----------------------------------------------------------------------------------
    def start(self) -> ShardFetcher:
        """Clear what an earlier run left (its markers, its token files, and those it was writing when killed: a
        file is read only once this fetcher has checked it) and start fetching."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for stale in [failed_file(self.folder), *(position_file(self.folder, r) for r in range(self.readers))]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)  # a killed run's: the readers of this run report afresh
        for leftover in self.folder.glob("*.bin"):
            leftover.unlink(missing_ok=True)
        for partial in self.folder.glob(".*.bin.*.tmp"):  # a token file a killed run was writing (atomic_open's)
            if not partial.is_dir():
                partial.unlink(missing_ok=True)
        self._thread.start()
        self._beating.start()
        return self

    def close(self) -> None:
        """Stop fetching (training ended); raises nothing: :attr:`error` says what failed."""
        self._stop.set()
        self._thread.join()
        self._beating.join()
        shutil.rmtree(self.folder / ".incoming", ignore_errors=True)

    def _beat(self) -> None:
        """While the fetcher runs, give its heartbeat a new value every :data:`HEARTBEAT_SECONDS`; once it has
        failed, stop beating and keep trying to write its ``failed`` marker (the folder may have been deleted)."""
        count = 0
        while not self._stop.wait(HEARTBEAT_SECONDS if count else 0):
            count += 1
            if self._thread.is_alive():
                with contextlib.suppress(OSError):
                    _write_small(heartbeat_file(self.folder), str(count))
            elif self.error is not None and not os.path.exists(failed_file(self.folder)):
                self._mark_failed()

    def why(self) -> str:
        """What stopped the fetcher (:attr:`error`), as its readers and the stage say it."""
        exc = self.error
        return str(exc) if isinstance(exc, UserError) else f"fetching the shards failed: {type(exc).__name__}: {exc}"

    def _mark_failed(self) -> None:
        with contextlib.suppress(OSError):  # the heartbeat, stopped, tells the readers instead
            _write_small(failed_file(self.folder), self.why() + "\n")

    def _reading(self) -> int:
        """The position in :attr:`blocks` of the block the slowest reader reads (0 before it reports)."""
        first = self.blocks[0].index if self.blocks else 0
        for rank in range(self.readers):
            try:
                with open(position_file(self.folder, rank), encoding="utf-8") as f:
                    self._positions[rank] = max(self._positions.get(rank, 0), int(f.read().strip()) - first)
            except (OSError, ValueError):
                pass  # not yet reported, or deleted: its last report stands
        return max(min(self._positions.get(r, 0) for r in range(self.readers)), 0) if self.readers else 0

    def _order(self) -> list[tuple[int, Shard]]:
        """``(block position, shard)`` in the order training first reads them."""
        order: list[tuple[int, Shard]] = []
        for pos, block in enumerate(self.blocks):
            order += [(pos, self.train[i]) for i in block.shards]
            if pos == 0:
                order += [(0, s) for s in self.valid]
        return order

    def _next(self, order: list[tuple[int, Shard]], starts: list[int], held: dict[str, int]):
        """The first ``(block position, shard)`` a reader may still read that is not here, or None: the
        validation split (always), then the shards of the blocks from the slowest reader's to the last one the
        lookahead allows."""
        reading = self._reading()
        todo = [(reading, s) for s in self.valid] if reading else []
        lo, hi = bisect.bisect_left(starts, reading), bisect.bisect_right(starts, reading + LOOKAHEAD_BLOCKS)
        for pos, shard in todo + order[lo:hi]:
            if shard.flat not in held:
                return pos, shard
        return None

    def _run(self) -> None:
        try:
            held: dict[str, int] = {}
            keep = {s.flat for s in self.valid}
            order = self._order()
            starts = [pos for pos, _ in order]
            while not self._stop.is_set():
                for name in [n for n in held if not (self.folder / n).is_file()]:
                    del held[name]  # deleted by hand: brought again if a reader may still need it
                nxt = self._next(order, starts, held)
                if nxt is None or not self._room(nxt[0], self._need(nxt[1]), held, keep):
                    self._stop.wait(POLL)
                    continue
                self._fetch(nxt[1])
                held[nxt[1].flat] = self.size(nxt[1])
        except BaseException as exc:  # handed to the readers (they raise it) and to the stage
            self.error = exc
            self._mark_failed()

    def _need(self, shard: Shard) -> int:
        return self.size(shard) + (shard.parquet_bytes if self.store.remote else 0)

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
        """Bring ``shard`` as its flat token file: flattened from the very bytes checked against the manifest."""
        data = self.store.fetch_bytes("shards", self.version, shard.name, self.folder / ".incoming", self.manifest)
        self.folder.mkdir(parents=True, exist_ok=True)
        flatten_shard(data, self.folder / shard.flat, self.dtype, shard.tokens, name=shard.name)
        self.fetched.append(shard.name)


def _write_small(path: str, text: str) -> None:
    """``text`` into ``path`` by one rename (its folder made again if it was deleted)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{threading.get_ident()}.tmp"  # the fetcher and its heartbeat may both write `failed`
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


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
    index = json.loads(store.fetch_bytes("shards", version, INDEX, folder / ".incoming", manifest).decode("utf-8"))
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
