"""The one corpus writer: each split's text, ``= Header =`` lines stripped (the chapter's strip, for every kind),
to ``wiki.{split}.txt``, with its metrics and, with the article index, where each article starts; the splits and
their files recorded for the manifest (:mod:`tasks.corpora.splits`). A source hands it either the splits it
already has, as streams of UTF-8 pieces (the wikitext zip: the text never becomes a Python ``str``), or
:class:`~tasks.corpora.source.Document` s, which it assigns to splits (the source's own, else
:func:`~tasks.corpora.source.split_of`) and renders in wikitext's shape first. Memory stays at a few blocks;
every file appears only whole."""

from __future__ import annotations

import time
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mygpt.atomic import atomic_open
from mygpt.errors import UserError
from mygpt.tokenizers.bpe_bytes import char_count
from tasks.corpora.header_strip import BLOCK_CHARS, count_titles, strip_headers
from tasks.corpora.source import SPLIT_NAMES, Document, split_of
from tasks.corpora.splits import SplitFiles, split_file_names
from tasks.corpora.unzip import BlockWriter, utf8_pieces

Hashed = Callable[[Path, int, str], None]


@dataclass
class SplitStream:
    """One split as its source has it: ``pieces`` yields ``(UTF-8 bytes, raw bytes consumed)``, each piece whole
    characters with ``\\n`` newlines; ``name`` says where it came from in messages; ``raw_bytes`` (what the
    source holds, for progress and metrics) and ``info`` (the source's own facts about it) go to the metrics."""

    split: str
    pieces: Iterator[tuple[bytes, int]]
    name: str
    raw_bytes: int = 0
    info: dict | None = None
    #: for rendered documents: how many ``= Title =`` lines the strip removes from each, its own title line first;
    #: the article index then marks only each document's own title (None: every ``= Title =`` line starts one)
    titles: list[int] | None = None


def write_splits(
    streams: Iterable[SplitStream],
    out_dir: Path,
    *,
    raw_total: int = 0,
    progress=None,
    block_chars: int = BLOCK_CHARS,
    article_index: bool = False,
    hashed: Hashed | None = None,
    damaged: tuple[type[BaseException], ...] = (),
    damaged_hint: str = "",
) -> dict:
    """Write each split in ``streams`` (in order) to ``out_dir``; returns ``{"splits": {split: metrics},
    "split_files": [...]}`` (what :func:`tasks.corpora.splits.split_files` reads back). ``hashed(path, size,
    sha256)`` (the store's ``Build.hashed``) is told each file's size and sha256 as written, hashed in the writer
    thread: publishing need not read the text back. ``progress(done, total, message)`` follows ``raw_total``.
    ``damaged``: exceptions of the source's reading that mean its bytes are damaged (``UserError`` with
    ``damaged_hint``)."""
    out: dict[str, dict] = {}
    files: list[SplitFiles] = []
    raw_done = 0
    with BlockWriter() as writer:
        for stream in streams:
            names = split_file_names(stream.split, article_index)

            def unzipped(raw_bytes: int, name=stream.name, raw_done=raw_done) -> None:
                if progress:
                    progress(raw_done + raw_bytes, raw_total or 1, f"writing {name}")

            out[stream.split] = _write_split(
                stream,
                out_dir,
                names,
                writer,
                block_chars=block_chars,
                unzipped=unzipped,
                hashed=hashed,
                damaged=damaged,
                damaged_hint=damaged_hint,
            )
            files.append(names)
            raw_done += out[stream.split]["raw_bytes"]
        writer.drain()
    return {"splits": out, "split_files": [f._asdict() for f in files]}


def _write_split(
    stream: SplitStream,
    out_dir: Path,
    names: SplitFiles,
    writer: BlockWriter,
    *,
    block_chars: int,
    unzipped,
    hashed: Hashed | None,
    damaged: tuple[type[BaseException], ...],
    damaged_hint: str,
) -> dict:
    """One split stripped and written; returns its metrics."""
    st: dict[str, Any] = {
        **(stream.info or {}),
        "raw_bytes": stream.raw_bytes,
        "raw_lines": 0,
        "bytes": 0,
        "chars": 0,
        "lines": 0,
        "headers_stripped": 0,
    }
    last = b""
    raw_last = b""
    articles: list[int] | None = [] if names.articles else None
    starts: list[int] = []
    keep = _document_titles(stream.titles)
    raw_seen = 0

    def raw_pieces():
        nonlocal raw_last, raw_seen
        for piece, raw_bytes in stream.pieces:
            st["raw_lines"] += newlines(piece)
            raw_last = piece
            raw_seen = raw_bytes
            unzipped(raw_bytes)
            yield piece

    def written(data: bytes) -> None:  # in the writer thread: numpy lets go of the GIL
        chars, lines = utf8_counts(data)
        st["chars"] += chars
        st["lines"] += lines

    path = out_dir / names.text
    try:
        with atomic_open(path, "wb") as f:
            try:
                pieces = strip_headers(raw_pieces(), block_chars, name=stream.name, articles=articles)
                for data, n in pieces:
                    starts.extend(st["bytes"] + a for a in articles or () if keep())
                    writer.write(data, f, after=written)
                    st["bytes"] += len(data)
                    st["headers_stripped"] += n
                    if data:
                        last = data
            finally:
                writer.settle()  # nothing touches f once it is synced and renamed (or dropped)
            writer.drain()
        if hashed:
            hashed(path, *writer.written(f))
    except damaged as e:
        raise UserError(f"{stream.name} is damaged ({e or type(e).__name__}){damaged_hint}") from None
    if not st["raw_bytes"]:
        st["raw_bytes"] = raw_seen
    if last and not last.endswith(b"\n"):
        st["lines"] += 1
    if raw_last and not raw_last.endswith(b"\n"):
        st["raw_lines"] += 1
    st["lines_removed"] = st["raw_lines"] - st["lines"]
    if names.articles:
        found = np.asarray(starts, dtype=np.uint64)  # in order; an empty article repeats its successor's start
        with atomic_open(out_dir / names.articles, "wb") as f:
            np.save(f, found)
        st["articles"] = int(found.size)
    return st


def _document_titles(titles: list[int] | None) -> Callable[[], bool]:
    """Asked once per removed ``= Title =`` line, in order: whether it starts an article. Without ``titles``
    every one does; with them (see :attr:`SplitStream.titles`) only the first of each document's."""
    if titles is None:
        return lambda: True
    counts = iter(titles)
    left = 0  # removed title lines still to come in the current document

    def keep() -> bool:
        nonlocal left
        starts = left == 0
        if starts:
            left = next(counts, 1)  # past the last document: never (the strip removes no more than counted)
        left -= 1
        return starts

    return keep


#: exceptions of reading a zip member that mean its bytes are damaged
ZIP_DAMAGED: tuple[type[BaseException], ...] = (zipfile.BadZipFile, zlib.error, EOFError)


# ---- documents --------------------------------------------------------------------------------------------------
def title_line(doc: Document) -> bytes:
    """The `` = Title = `` line the writer puts before a document: the header strip removes it and marks the
    article's start there. ``=`` and line breaks in the title become ``-`` and spaces (the line must match the
    chapter's regex to be stripped; the title itself is never written)."""
    title = " ".join((doc.title or doc.doc_id).replace("=", "-").split()) or "-"
    return f"\n = {title} = \n\n".encode()


def write_documents(
    documents: Iterable[Document],
    work: Path,
    out_dir: Path,
    *,
    valid_fraction: float,
    test_fraction: float,
    source: str,
    progress=None,
    article_index: bool = False,
    hashed: Hashed | None = None,
) -> dict:
    """The documents, each in its split (its own, else :func:`split_of` its ``doc_id``), in order, rendered in
    wikitext's shape (a title line, the text ending in a newline) into ``work/<split>.raw`` first, then written as
    :func:`write_splits` writes a source's splits. ``UserError`` when a split would be empty (a corpus needs text
    in each: the tokenizer trains on train, the model validates on valid, evaluate reads test)."""
    raws = {split: work / f"{split}.raw" for split in SPLIT_NAMES}
    counts = dict.fromkeys(SPLIT_NAMES, 0)
    titles: dict[str, list[int] | None] = {split: [] if article_index else None for split in SPLIT_NAMES}
    handles = {split: open(path, "wb") for split, path in raws.items()}  # noqa: SIM115 (closed below)
    try:
        for doc in documents:
            split = doc.split or split_of(doc.doc_id, valid_fraction, test_fraction)
            if split not in handles:
                raise UserError(f"{source}: document {doc.doc_id!r} names split {split!r}; use one of {SPLIT_NAMES}")
            text = doc.text.replace("\r\n", "\n").replace("\r", "\n")
            rendered = title_line(doc) + text.encode("utf-8") + (b"" if text.endswith("\n") else b"\n")
            handles[split].write(rendered)
            counts[split] += 1
            doc_titles = titles[split]
            if doc_titles is not None:
                doc_titles.append(count_titles(rendered))  # a document's own: the same inside its split
    finally:
        for f in handles.values():
            f.close()
    empty = [split for split, n in counts.items() if not n]
    if empty:
        raise UserError(
            f"{source}: the {' and '.join(empty)} split{'s' if len(empty) > 1 else ''} would be empty "
            f"({counts['train']} train, {counts['valid']} valid, {counts['test']} test documents of "
            f"{sum(counts.values())}); every split "
            "needs at least one document: give more documents (a split is chosen by a hash of each one's id), or "
            "raise corpus.valid_fraction / corpus.test_fraction"
        )
    streams = [
        SplitStream(
            split,
            _file_pieces(raws[split], source),
            f"the {split} documents of {source}",
            raws[split].stat().st_size,
            {"documents": counts[split]},
            titles[split],
        )
        for split in SPLIT_NAMES
    ]
    return write_splits(
        streams,
        out_dir,
        raw_total=sum(s.raw_bytes for s in streams),
        progress=progress,
        article_index=article_index,
        hashed=hashed,
    )


def _file_pieces(path: Path, source: str, piece: int = 1 << 22) -> Iterator[tuple[bytes, int]]:
    def raw() -> Iterator[bytes]:
        with open(path, "rb") as f:
            while data := f.read(piece):
                yield data

    done = 0
    for data, _ in utf8_pieces(raw(), path.name, source):
        done += len(data)
        yield data, done


def newlines(data: bytes) -> int:
    """How many ``\\n`` bytes ``data`` holds; counted by numpy, which lets go of the GIL (``bytes.count`` does not)."""
    return int(np.count_nonzero(np.frombuffer(data, dtype=np.int8) == 10))


def utf8_counts(data: bytes) -> tuple[int, int]:
    """``(characters, newlines)`` in the UTF-8 ``data``, counted by numpy, which lets go of the GIL."""
    return char_count(np.frombuffer(data, dtype=np.uint8)), newlines(data)


def write_corpus(source: Any, settings: Any, ctx: Any) -> dict:
    """The corpus version of ``source`` (a :class:`~tasks.corpora.source.CorpusSource`) into the build ``ctx``'s
    ``out/``: its own splits' bytes where it gives them (``split_streams``), else its documents, split here.
    Returns the metrics: the source's, the seconds, each split's and the split files."""
    progress = lambda d, t, m: ctx.progress(d, t, m)  # noqa: E731
    article_index = bool(settings.article_index)
    t0 = time.monotonic()
    if hasattr(source, "split_streams"):
        with source.split_streams(settings, ctx) as (streams, raw_total, metrics):
            t0 = time.monotonic()
            written = write_splits(
                streams,
                ctx.out,
                raw_total=raw_total,
                progress=progress,
                article_index=article_index,
                hashed=ctx.build.hashed,  # publish need not read the text back to hash it
                damaged=getattr(source, "damaged", ()),
                damaged_hint=getattr(source, "damaged_hint", ""),
            )
    else:
        metrics = {}
        written = write_documents(
            source.documents(settings, ctx),
            ctx.work,
            ctx.out,
            valid_fraction=settings.valid_fraction,
            test_fraction=settings.test_fraction,
            source=settings.shown_url,
            progress=progress,
            article_index=article_index,
            hashed=ctx.build.hashed,
        )
        if hasattr(source, "report_metrics"):  # what the source counted as it gave its documents
            metrics = source.report_metrics(settings, ctx)
    ctx.progress(1, 1, "done", force=True)
    return {**metrics, "extract_seconds": round(time.monotonic() - t0, 3), **written}
