"""A multistream dump's index (``<wiki>-<date>-pages-articles-multistream-index.txt.bz2``): one
``offset:page_id:title`` line per page, ``offset`` the byte where the bz2 stream holding that page starts. What it
gives the extraction is the streams' start offsets, checked, and how many pages each holds; it is read as a stream
(English's index is ~1 GB of text), so memory holds one number per stream.
"""

from __future__ import annotations

import bz2
from dataclasses import dataclass
from pathlib import Path

from mygpt.errors import UserError

FIX = "the index must be the one published beside this dump (same wiki and date): download both again"


class DumpIndexError(UserError):
    """The index does not describe the dump beside it; the message names the line and what to do."""


@dataclass(frozen=True)
class StreamIndex:
    """The dump's page streams: ``offsets[i]`` where stream ``i`` starts (strictly increasing, after the header
    stream, before the file's end), ``pages[i]`` how many pages the index lists in it; ``size`` the dump's bytes.
    Stream ``i`` ends where ``i + 1`` starts; the last at the end of the file (it also holds ``</mediawiki>``)."""

    offsets: tuple[int, ...]
    pages: tuple[int, ...]
    size: int

    def end(self, i: int) -> int:
        return self.offsets[i + 1] if i + 1 < len(self.offsets) else self.size


def read_index(path: Path, dump_size: int, where: str) -> StreamIndex:
    """The stream index of a dump of ``dump_size`` bytes from its index file (``where`` names it in errors)."""
    offsets: list[int] = []
    pages: list[int] = []
    number = 0
    try:
        with bz2.open(path, "rb") as lines:
            for number, line in enumerate(lines, 1):
                _take(line, number, dump_size, where, offsets, pages)
    except UserError:
        raise
    except (OSError, EOFError, ValueError) as e:
        raise DumpIndexError(f"{where}: not a whole bz2 file (line {number + 1}: {e}); {FIX}") from None
    if not offsets:
        raise DumpIndexError(f"{where}: the index lists no page; the dump has no article to extract")
    return StreamIndex(tuple(offsets), tuple(pages), dump_size)


def _take(line: bytes, number: int, dump_size: int, where: str, offsets: list[int], pages: list[int]) -> None:
    line = line.rstrip(b"\r\n")
    if not line.strip():
        return
    head, colon, _ = line.partition(b":")
    if not colon or not head.strip().isdigit():
        raise DumpIndexError(f"{where} line {number}: {line[:80]!r} is not offset:page_id:title; {FIX}")
    offset = int(head)
    if offsets and offset == offsets[-1]:
        pages[-1] += 1
        return
    if offsets and offset < offsets[-1]:
        raise DumpIndexError(
            f"{where} line {number}: offset {offset} comes after {offsets[-1]} (out of order, or overlapping an "
            f"earlier stream); {FIX}"
        )
    if not 0 < offset < dump_size:
        raise DumpIndexError(
            f"{where} line {number}: offset {offset} is outside the dump's {dump_size} bytes (after the header "
            f"stream at 0, before the end); {FIX}"
        )
    offsets.append(offset)
    pages.append(1)
