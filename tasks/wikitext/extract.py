"""Text members of a zip into files, ``= Header =`` lines stripped: each member to its own file and all of them, in
order, to one joined file, with per-member metrics; memory stays at a few blocks, every file appears only whole."""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mygpt.atomic import atomic_open
from mygpt.errors import UserError
from mygpt.tokenizers.bpe_bytes import char_count
from tasks.wikitext.header_strip import BLOCK_CHARS, strip_headers
from tasks.wikitext.unzip import BlockWriter, member_utf8, open_zip


def extract_text(
    zip_path: Path,
    out_dir: Path,
    members: dict[str, tuple[str, str]],
    joined: str,
    *,
    source: str,
    progress=None,
    block_chars: int = BLOCK_CHARS,
    layout_hint: str = "",
    article_files: dict[str, str] | None = None,
    hashed: Callable[[Path, int, str], None] | None = None,
) -> dict:
    """``members``: ``{key: (member in the zip, file name)}``, in order. Writes each member, stripped, to
    ``out_dir/<file name>`` and all of them to ``out_dir/<joined>``; returns ``{"members": {key: metrics},
    "joined": {bytes, chars, lines}}``. ``hashed(path, size, sha256)`` (the store's ``Build.hashed``) is called
    for each text file right after it appears, with the size and sha256 of the bytes written to it, hashed in the
    writer thread as they were written: publishing then need not read the files back (the metrics hold no sha256:
    the manifest lists them).
    ``progress(done, total, message)`` follows the unzipping. ``article_files`` (``{key: file name}``): also write,
    per member, the byte offsets in its stripped file where each article starts (where a ``= Title =`` line was
    removed) as a 1-D ``uint64`` ``.npy``."""
    with open_zip(zip_path, source) as zf:
        _check_layout(zf, [member for member, _ in members.values()], source, layout_hint)
        raw_total = sum(zf.getinfo(member).file_size for member, _ in members.values()) or 1
        raw_done = 0
        out: dict[str, dict] = {}
        with atomic_open(out_dir / joined, "wb") as all_f, BlockWriter() as writer:
            for key, (member, name) in members.items():

                def unzipped(raw_bytes: int, member=member, raw_done=raw_done) -> None:
                    if progress:
                        progress(raw_done + raw_bytes, raw_total, f"unzipping {member}")

                out[key] = _extract_member(
                    zf,
                    member,
                    out_dir / name,
                    writer,
                    all_f,
                    source=source,
                    block_chars=block_chars,
                    unzipped=unzipped,
                    articles_path=out_dir / article_files[key] if article_files else None,
                    hashed=hashed,
                )
                raw_done += out[key]["raw_bytes"]
            writer.drain()
        if hashed:
            hashed(out_dir / joined, *writer.written(all_f))
    totals = {key: sum(st[key] for st in out.values()) for key in ("bytes", "chars", "lines")}
    return {"members": out, "joined": totals}


def _check_layout(zf: zipfile.ZipFile, members: list[str], source: str, hint: str) -> None:
    """``UserError`` unless the zip holds every one of ``members``."""
    names = set(zf.namelist())
    for member in members:
        if member not in names:
            shown = ", ".join(sorted(names)[:8]) or "(no files)"
            raise UserError(f"{source} has no member {member!r} (it has: {shown}){'; ' + hint if hint else ''}")


def _extract_member(
    zf: zipfile.ZipFile,
    member: str,
    path: Path,
    writer: BlockWriter,
    corpus,
    *,
    source: str,
    block_chars: int,
    unzipped,
    articles_path: Path | None = None,
    hashed: Callable[[Path, int, str], None] | None = None,
) -> dict:
    """``member`` unzipped, stripped and written to ``path`` and to the joined file ``corpus``; returns its metrics.
    ``articles_path``: where the article starts go; ``hashed``: told ``path``'s size and sha256 (see
    :func:`extract_text`)."""
    st: dict[str, Any] = {
        "member": member,
        "raw_bytes": zf.getinfo(member).file_size,
        "raw_lines": 0,
        "bytes": 0,
        "chars": 0,
        "lines": 0,
        "headers_stripped": 0,
    }
    last = b""
    raw_last = b""
    articles: list[int] | None = [] if articles_path is not None else None
    starts: list[int] = []

    def raw_pieces():
        nonlocal raw_last
        for piece, raw_bytes in member_utf8(zf, member, source):
            st["raw_lines"] += newlines(piece)
            raw_last = piece
            unzipped(raw_bytes)
            yield piece

    def written(data: bytes) -> None:  # in the writer thread: numpy lets go of the GIL
        chars, lines = utf8_counts(data)
        st["chars"] += chars
        st["lines"] += lines

    try:
        with atomic_open(path, "wb") as f:
            try:
                pieces = strip_headers(raw_pieces(), block_chars, name=f"{member} in {source}", articles=articles)
                for data, n in pieces:
                    starts.extend(st["bytes"] + a for a in articles or ())
                    writer.write(data, f, corpus, after=written)
                    st["bytes"] += len(data)
                    st["headers_stripped"] += n
                    if data:
                        last = data
            finally:
                writer.settle()  # nothing touches f once it is synced and renamed (or dropped)
            writer.drain()
        if hashed:
            hashed(path, *writer.written(f))
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise UserError(
            f"{member} in {source} is damaged ({e or type(e).__name__}); rerun to download it again, or check "
            "source_url"
        ) from None
    if last and not last.endswith(b"\n"):
        st["lines"] += 1
    if raw_last and not raw_last.endswith(b"\n"):
        st["raw_lines"] += 1
    st["lines_removed"] = st["raw_lines"] - st["lines"]
    if articles_path is not None:
        found = np.asarray(starts, dtype=np.uint64)  # in order; an empty article repeats its successor's start
        with atomic_open(articles_path, "wb") as f:
            np.save(f, found)
        st["articles"] = int(found.size)
    return st


def newlines(data: bytes) -> int:
    """How many ``\\n`` bytes ``data`` holds; counted by numpy, which lets go of the GIL (``bytes.count`` does not)."""
    return int(np.count_nonzero(np.frombuffer(data, dtype=np.int8) == 10))


def utf8_counts(data: bytes) -> tuple[int, int]:
    """``(characters, newlines)`` in the UTF-8 ``data``, counted by numpy, which lets go of the GIL."""
    return char_count(np.frombuffer(data, dtype=np.uint8)), newlines(data)
