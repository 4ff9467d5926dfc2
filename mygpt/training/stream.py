"""Training on token shards that arrive while it runs: which shards each step reads, known in advance from
``(seed, step)``, and token sources that wait for a shard's file to appear.

Batches are drawn uniformly from the tokens of the current *block* (a few shards, :data:`BLOCK_SHARDS`) instead
of the whole split, so the first step needs only its block's shards, and whoever fetches them knows the order
(:meth:`BlockSchedule.blocks`): a shuffle window, as MosaicML streaming and litdata read. A split of at most
:data:`BLOCK_SHARDS` shards is one block, read in index order: exactly the batches of the whole split as one
sequence. Design: docs/TRAINING.md (Streaming shards).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mygpt.errors import UserError

if TYPE_CHECKING:  # torch comes with it: imported where a stream is read, not by the schedule's users
    from mygpt.training.data import ConcatTokens

__all__ = [
    "BLOCK_SHARDS",
    "BlockSchedule",
    "PendingShard",
    "ShardStream",
    "failed_file",
    "heartbeat_file",
    "position_file",
]

#: shards per block: the shuffle window (4 shards of the pipeline's default size hold some 40 M tokens)
BLOCK_SHARDS = 4
FAILED = "failed"  # in a stream's directory: what the fetcher could not bring (its message), once it gave up
HEARTBEAT = "fetching"  # in a stream's directory: a counter the fetcher rewrites while it runs
POLL_SECONDS = 0.02
#: how long a reader waits for a file while the fetcher's heartbeat does not change before it calls the fetcher
#: gone: compared with the reader's own clock (never a file's mtime), so a skewed or cached clock cannot trip it
FETCHER_SILENT_SECONDS = 60.0


def position_file(folder: str | os.PathLike, rank: int) -> str:
    """Where rank ``rank`` says which block it reads (its index in :meth:`BlockSchedule.blocks`)."""
    return os.path.join(os.fspath(folder), f"reading-{rank}")


def failed_file(folder: str | os.PathLike) -> str:
    return os.path.join(os.fspath(folder), FAILED)


def heartbeat_file(folder: str | os.PathLike) -> str:
    """What the fetcher rewrites (a new counter) every second or so while it runs: a reader waiting for a file
    whose fetcher has died, unable to say so in :data:`FAILED`, ends instead of waiting for ever."""
    return os.path.join(os.fspath(folder), HEARTBEAT)


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


@dataclass(frozen=True)
class Block:
    """Block ``index`` of the run (counted over epochs): ``shards`` (indices, ascending) for steps ``first..last``."""

    index: int
    first: int
    last: int
    shards: tuple[int, ...]


class BlockSchedule:
    """Which shards of a split (``counts``: tokens per shard, in index order) step ``s`` draws from. Epoch ``e``
    permutes the shards with ``(seed, e)`` and cuts them into blocks of :data:`BLOCK_SHARDS` (a block shorter than
    one window joins its neighbour); a block lasts ``max(1, its tokens // tokens_per_step)`` steps, about one pass
    over it. A function of the data's shape, ``seed``, ``tokens_per_step`` and ``window`` only: never of timing."""

    def __init__(
        self, counts: list[int], seed: int, tokens_per_step: int, window: int, block_shards: int = BLOCK_SHARDS
    ):
        self.counts, self.seed, self.tokens_per_step, self.window = list(counts), seed, tokens_per_step, window
        self.block_shards = block_shards
        if sum(self.counts) < window:
            raise UserError(
                f"the training shards hold {sum(self.counts):,} tokens, fewer than one window of seq_len + 1 = "
                f"{window:,}; use more text or a smaller seq_len"
            )
        self._made: list[Block] = []
        self._epoch = 0

    def _epoch_groups(self, epoch: int) -> list[tuple[int, ...]]:
        shards = [i for i, c in enumerate(self.counts) if c]
        if len(shards) <= self.block_shards:
            return [tuple(shards)]
        order = np.random.default_rng([self.seed, epoch]).permutation(shards).tolist()
        groups = [order[i : i + self.block_shards] for i in range(0, len(order), self.block_shards)]
        merged: list[list[int]] = []
        for g in groups:
            if merged and sum(self.counts[i] for i in g) < self.window:
                merged[-1].extend(g)
            else:
                merged.append(list(g))
        if len(merged) > 1 and sum(self.counts[i] for i in merged[0]) < self.window:
            merged[1].extend(merged.pop(0))
        return [tuple(sorted(g)) for g in merged]

    def _extend(self) -> None:
        step = self._made[-1].last + 1 if self._made else 1
        for shards in self._epoch_groups(self._epoch):
            n = sum(self.counts[i] for i in shards)
            steps = max(1, n // self.tokens_per_step)
            self._made.append(Block(len(self._made), step, step + steps - 1, shards))
            step += steps
        self._epoch += 1

    def at(self, step: int) -> Block:
        """The block step ``step`` (1-based) draws from."""
        while not self._made or self._made[-1].last < step:
            self._extend()
        lo, hi = 0, len(self._made) - 1
        while lo < hi:  # the first block whose last step is >= step
            mid = (lo + hi) // 2
            if self._made[mid].last < step:
                lo = mid + 1
            else:
                hi = mid
        return self._made[lo]

    def blocks(self, first_step: int, last_step: int) -> Iterator[Block]:
        """The blocks steps ``first_step..last_step`` read, in order: the order to fetch them in."""
        if first_step > last_step:
            return
        block = self.at(first_step)
        while True:
            yield block
            if block.last >= last_step:
                return
            block = self.at(block.last + 1)


class PendingShard:
    """One shard's flat token file (native order, no header), which may appear while training runs: reading it
    waits until it is there (written whole, by one rename), or raises the fetcher's error (:data:`FAILED`)."""

    def __init__(self, path: str, tokens: int, dtype: np.dtype, folder: str) -> None:
        self.path, self.tokens, self.dtype, self.folder = path, tokens, dtype, folder
        self._array: np.ndarray | None = None

    def __len__(self) -> int:
        return self.tokens

    def open(self) -> np.ndarray:
        if self._array is None:
            self._wait()
            size = os.path.getsize(self.path)
            if size != self.tokens * self.dtype.itemsize:
                raise UserError(
                    f"token file {self.path} has {size:,} bytes, not {self.tokens:,} {self.dtype.name} tokens; "
                    "delete it and rerun"
                )
            self._array = np.memmap(self.path, dtype=self.dtype, mode="r") if self.tokens else np.zeros(0, self.dtype)
        return self._array

    def _wait(self) -> None:
        """Until the file is there; ``UserError`` with the fetcher's message once it failed, or naming the file
        once the fetcher's heartbeat has not changed for :data:`FETCHER_SILENT_SECONDS` (it died unheard)."""
        beat, since = None, time.monotonic()
        while not os.path.exists(self.path):
            failed = _read_text(failed_file(self.folder))
            if failed is not None:
                raise UserError(failed.strip() or f"fetching {self.path} failed")
            now, seen = time.monotonic(), _read_text(heartbeat_file(self.folder))
            if seen != beat:
                beat, since = seen, now
            elif now - since > FETCHER_SILENT_SECONDS:
                raise UserError(
                    f"token file {self.path} is not there and the shard fetcher that brings it has given no sign "
                    f"of life for {FETCHER_SILENT_SECONDS:g} s (it stopped; the log says why); rerun the stage"
                )
            time.sleep(POLL_SECONDS)

    def close(self) -> None:
        """Let go of the mapping (the fetcher may delete the file to keep within its budget)."""
        self._array = None

    def __getitem__(self, key: slice) -> np.ndarray:
        return self.open()[key]


class ShardStream:
    """A split as per-shard token files that arrive while training runs (``files``: ``[path, tokens]`` in index
    order, ``dtype``, ``folder`` the stream's directory). As validation data it is the whole split as one
    sequence (``len`` and slices, waiting for what a slice needs); for training, :meth:`batch` draws step ``s``'s
    windows from its block and reads only the shards this process's rows touch."""

    def __init__(self, files: list, dtype: str, folder: str) -> None:
        from mygpt.training.data import ConcatTokens

        dt = np.dtype(dtype)
        self.folder = folder
        self.parts = [PendingShard(os.fspath(p), int(n), dt, folder) for p, n in files]
        self.whole = ConcatTokens(self.parts)
        self.shape = self.whole.shape
        self.schedule: BlockSchedule | None = None
        self._block: Block | None = None
        self._view: ConcatTokens | None = None

    def __len__(self) -> int:
        return len(self.whole)

    def __getitem__(self, key: slice) -> np.ndarray:
        return self.whole[key]

    def batch(self, step: int, batch_size: int, seq_len: int, generator, device, rows: slice | None, rank: int):
        """``(x, y)`` of step ``step``: :func:`get_batch` over the tokens of its block (shards in index order)."""
        from mygpt.training.data import ConcatTokens, get_batch

        if self.schedule is None:
            raise RuntimeError("ShardStream.batch before schedule_for: the schedule needs the run's seed")
        block = self.schedule.at(step)
        if self._block is None or block.index != self._block.index:
            keep = set(block.shards)
            for i, part in enumerate(self.parts):
                if i not in keep:
                    part.close()
            self._view = ConcatTokens([self.parts[i] for i in block.shards])
            self._block = block
            _write_position(position_file(self.folder, rank), block.index)
        assert self._view is not None
        return get_batch(self._view, batch_size, seq_len, generator, device, rows=rows)

    def schedule_for(self, seed: int, batch_size: int, seq_len: int) -> BlockSchedule:
        """The run's schedule (``seed``, the global batch): set once, before the first :meth:`batch`."""
        self.schedule = BlockSchedule([len(p) for p in self.parts], seed, batch_size * seq_len, seq_len + 1)
        return self.schedule


def _write_position(path: str, index: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)  # the folder may have been deleted: the fetcher brings it back
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(str(index))
    os.replace(tmp, path)
