"""A multistream dump cut into ranges of its bz2 streams, and a byte range decompressed one stream at a time.

A range's bytes are read from the file in blocks and fed to one ``bz2.BZ2Decompressor`` per stream, so memory is
bounded by the largest stream's decompressed text (:data:`MAX_STREAM_BYTES` at most), never by the range or the dump.
Every stream found must start at an offset the index names: an index that does not fit its dump is an error, not a
silently shifted page.
"""

from __future__ import annotations

import bz2
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO

from tasks.corpora.dump.index import FIX, DumpIndexError, StreamIndex
from tasks.corpora.dump.pages import DumpError

#: the most one stream (~100 pages) may decompress to: 100 pages at MediaWiki's 2 MiB page limit, rounded up
MAX_STREAM_BYTES = 256 << 20
#: the most streams a range (one task, one checkpoint) holds: ~1,600 pages, ~20-40 MB of text for English
STREAMS_PER_RANGE = 16
#: a dump of fewer than this many times STREAMS_PER_RANGE streams is cut into this many ranges (or one per stream)
MIN_RANGES = 16
READ_BLOCK = 1 << 20


@dataclass(frozen=True)
class StreamRange:
    """Streams ``first .. first + count - 1`` of the dump: bytes ``start .. end``."""

    number: int
    first: int
    count: int
    start: int
    end: int

    @property
    def name(self) -> str:
        """The checkpoint's name: the bytes it covers, so a checkpoint of another chunking is never taken for it."""
        return f"{self.start:012d}-{self.end:012d}"


def range_size(streams: int) -> int:
    """How many streams a range of a dump of ``streams`` streams holds: :data:`STREAMS_PER_RANGE`, or fewer so
    that the dump has :data:`MIN_RANGES` ranges. Why: a small dump in a few big ranges leaves workers idle; the
    size depends on the dump alone, so a resumed build cuts the same ranges with any worker count."""
    return max(1, min(STREAMS_PER_RANGE, streams // MIN_RANGES))


def stream_ranges(index: StreamIndex, streams_per_range: int | None = None) -> list[StreamRange]:
    """The dump's page streams in ranges of ``streams_per_range`` (default :func:`range_size`; the last may be
    shorter), in dump order."""
    n = len(index.offsets)
    streams_per_range = streams_per_range or range_size(n)
    out = []
    for number, first in enumerate(range(0, n, streams_per_range)):
        count = min(streams_per_range, n - first)
        out.append(StreamRange(number, first, count, index.offsets[first], index.end(first + count - 1)))
    return out


def decompressed_streams(
    open_file: Callable[[], IO[bytes]], start: int, end: int, starts: tuple[int, ...], where: str, last: bool = False
) -> Iterator[tuple[int, bytes]]:
    """``(offset, text)`` of each bz2 stream in bytes ``start .. end`` of the file ``open_file()`` opens; the
    streams must start exactly at ``starts`` (the index's offsets in the range), except, in the ``last`` range,
    the streams after them (the dump's footer, ``</mediawiki>``), which must hold no page."""
    expected = iter(starts)
    indexed = True
    with open_file() as f:
        f.seek(start)
        position = start  # the file offset of the next byte fed
        stream_start, size = start, 0
        decomp: bz2.BZ2Decompressor | None = None
        out: list[bytes] = []
        pending = b""
        while True:
            if not pending:
                want = min(READ_BLOCK, end - position)
                if want <= 0:
                    break
                pending = f.read(want)
                if not pending:
                    raise DumpError(
                        f"{where}: the file ends at byte {position}, before {end}; the download is incomplete"
                    )
                position += len(pending)
            if decomp is None:
                stream_start = position - len(pending)
                named = next(expected, None) if indexed else None
                indexed = named is not None
                if (named is not None and stream_start != named) or (named is None and not last):
                    raise DumpIndexError(
                        f"{where}: a bz2 stream starts at byte {stream_start}, where the index names none; {FIX}"
                    )
                decomp, out, size = bz2.BZ2Decompressor(), [], 0
            try:
                chunk = decomp.decompress(pending, max_length=MAX_STREAM_BYTES + 1 - size)
                pending = b""
                while not decomp.eof and not decomp.needs_input and size + len(chunk) <= MAX_STREAM_BYTES:
                    out.append(chunk)
                    size += len(chunk)
                    chunk = decomp.decompress(b"", max_length=MAX_STREAM_BYTES + 1 - size)
            except OSError as e:
                raise DumpError(
                    f"{where}: the bz2 stream at byte {stream_start} is damaged ({e}); download the dump again"
                ) from None
            out.append(chunk)
            size += len(chunk)
            if size > MAX_STREAM_BYTES:
                raise DumpError(
                    f"{where}: the bz2 stream at byte {stream_start} decompresses to more than "
                    f"{MAX_STREAM_BYTES >> 20} MiB (a stream holds ~100 pages of at most 2 MiB each); the dump is "
                    "damaged or not a Wikimedia multistream dump"
                )
            if decomp.eof:
                pending = decomp.unused_data
                if not indexed and any(b"<page>" in part for part in out):
                    raise DumpIndexError(
                        f"{where}: the bz2 stream at byte {stream_start} holds pages the index does not list; {FIX}"
                    )
                yield stream_start, b"".join(out)
                decomp, out = None, []
        if decomp is not None:
            raise DumpError(
                f"{where}: the bz2 stream at byte {stream_start} is truncated (it does not end before byte {end}); "
                "the dump is incomplete or damaged: download it again"
            )
    missing = next(expected, None)
    if missing is not None:
        raise DumpIndexError(f"{where}: the index names a stream at byte {missing}, where none starts; {FIX}")
