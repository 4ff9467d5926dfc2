"""``corpus.kind=parquet``: Wikipedia's per-language Parquet exports (Hugging Face's ``wikimedia/wikipedia``, files
like ``20231101.en/train-00000-of-00041.parquet``), whose columns ``id``, ``title`` and ``text`` (plain text
already) are read; ``url`` and any other column are not. ``corpus.source_url`` names a file, a folder (every
``*.parquet`` under it, sorted by relative path: an export is several shards) or an http(s):// URL of one file
(fetched, resumed and allow-listed as the text kind's). One document per row, in file then row order:
``Document(str(id), title, wikitext_shape(text))``; a row whose text is blank is dropped and counted. The writer
splits them by a hash of the id, the page id: a page keeps its split across export dates. Identity: the content
(sha256 and size; a folder's sorted ``(relative path, sha256)`` list) and ``READING_VERSION``, never the URL.
One row group is read at a time, and only those three columns: memory grows with a row group, never with the file."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mygpt.errors import UserError
from tasks.corpora.folder import changed, digest, folder_identity, folder_of, listing
from tasks.corpora.source import Document, SourceContext, save_counts, saved_counts
from tasks.sources.fetched import fetched_file
from tasks.sources.identity import fetched_identity

#: what the reading makes of a file's rows (which are kept, how their text is laid out); a change is a new number
READING_VERSION = 1
COLUMNS = ("id", "title", "text")
METRICS = "parquet-metrics.json"  # in the work folder: the report's counts, for the writer once the documents end
_TYPES = {"id": "an integer or a string", "title": "a string", "text": "a string"}


class ParquetSource:
    """The adapter (``tasks.corpora.source.CorpusSource``); what it refuses, each with one ``UserError``:
    docs/CORPUS.md, "A Wikipedia Parquet export"."""

    kind = "parquet"
    fields = frozenset({"source_url", "expected_sha256", "article_index", "valid_fraction", "test_fraction"})

    def identity(self, settings, ctx: SourceContext) -> dict:
        folder = folder_of(settings)
        if folder is None:  # the ids are in the rows: the file's name picks nothing, so it is no part of it
            return {**fetched_identity(settings, ctx.store, ctx.log, ctx.stage), "reading": READING_VERSION}
        return folder_identity(folder, settings, ctx.store, ".parquet", READING_VERSION)

    def documents(self, settings, ctx) -> Iterator[Document]:
        shown = settings.shown_url
        folder = folder_of(settings)
        if folder is not None:
            files = listing(folder, settings, ctx.store, ".parquet")
            if ctx.source and digest(files) != ctx.source.get("sha256"):
                raise UserError(changed(shown))
            yield from _read_all([(f"{rel} of {shown}", folder / rel, sha) for rel, sha in files], ctx)
            return
        with fetched_file(ctx, settings, ctx.stage) as got:  # checked against the version's sha256 already
            yield from _read_all([(shown, got.path, got.sha256)], ctx)  # the bytes read are the ones it names

    def report_metrics(self, settings, ctx) -> dict[str, Any]:
        """What the last :meth:`documents` of this build counted (the report's rows), ``{}`` before it ended."""
        return saved_counts(ctx.work, METRICS)


def wikitext_shape(text: str) -> str:
    """``text`` laid out as wikitext-103 lays out an article: line ends ``\\n``, trailing whitespace stripped from
    each line, every non-blank line a paragraph of its own (one blank line between two), ending in ``\\n``; ``""``
    when nothing but whitespace. Nothing else changes: no heading is detected, no space is collapsed."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    kept = [line.rstrip() for line in lines if line.strip()]
    return "\n\n".join(kept) + "\n" if kept else ""


def _read_all(parts: list[tuple[str, Path, str | None]], ctx) -> Iterator[Document]:
    """The documents of each ``(where, path, sha256 to check or None)``, in order; then refused if two rows share
    an id (8 bytes a row are kept to tell), and the counts written for :meth:`ParquetSource.report_metrics`."""
    counts = {"parquet_files": len(parts), "parquet_rows": 0, "parquet_kept": 0, "parquet_dropped_empty": 0}
    keys: list[np.ndarray] = []
    for n, (where, path, sha) in enumerate(parts):
        with open(path, "rb") as f:
            if sha is not None and hashlib.file_digest(f, "sha256").hexdigest() != sha:
                raise UserError(changed(where))
            for rg, groups, (ids, titles, texts) in _row_groups(f, where, COLUMNS):
                ctx.progress(n + (rg + 1) / groups, len(parts), f"reading {where}")
                keys.append(np.fromiter((_key(i) for i in ids), np.uint64, len(ids)))
                counts["parquet_rows"] += len(ids)
                for doc_id, title, text in zip(ids, titles, texts, strict=True):
                    shaped = wikitext_shape(text)
                    if not shaped:
                        counts["parquet_dropped_empty"] += 1
                        continue
                    counts["parquet_kept"] += 1
                    yield Document(doc_id, title or "", shaped)
    _check_unique(parts, np.concatenate(keys) if keys else np.zeros(0, np.uint64))
    save_counts(ctx.work, METRICS, counts)


def _row_groups(f, where: str, columns: tuple[str, ...]) -> Iterator[tuple[int, int, list[list]]]:
    """``(row group, row groups, [values of each column])`` of the Parquet file ``f``, one row group at a time, ids
    as ``str``; ``UserError`` for a file that is not Parquet, damaged or truncated, a column missing or of another
    type, a null id or text."""
    import pyarrow as pa  # here: every process that imports the stages need not load it
    import pyarrow.parquet as pq

    f.seek(0)
    head = f.read(4)
    f.seek(0)
    if head != b"PAR1":
        raise UserError(f"{where} is not a Parquet file (it starts with {head!r}, not b'PAR1'); give a .parquet file")
    try:
        pf = pq.ParquetFile(f)
        schema = pf.schema_arrow
        for name in columns:
            if schema.names.count(name) > 1:
                raise UserError(
                    f"{where} has {schema.names.count(name)} columns named {name!r}; a Wikipedia Parquet export has "
                    "one each of id, url, title and text: give one"
                )
            if name not in schema.names:
                raise UserError(
                    f"{where} has no column {name!r} (its columns: {', '.join(schema.names)}); a Wikipedia "
                    "Parquet export has id, url, title and text: give one"
                )
            typ = schema.field(name).type
            ok = pa.types.is_string(typ) or pa.types.is_large_string(typ)
            if not (ok or (name == "id" and pa.types.is_integer(typ))):
                raise UserError(f"{where}: column {name!r} is {typ}, not {_TYPES[name]}; give a Wikipedia export")
        for rg in range(pf.num_row_groups):
            table = pf.read_row_group(rg, columns=list(columns))
            try:
                values = [table.column(name).to_pylist() for name in columns]
            except UnicodeDecodeError as e:  # Parquet does not check that a string column holds UTF-8
                raise UserError(
                    f"{where}: row group {rg} holds bytes that are not UTF-8 in a string column ({e.reason} at "
                    f"byte {e.start} of a value); the file is damaged or not a Wikipedia export: download it again"
                ) from None
            for name, column in zip(columns, values, strict=True):
                if name != "title" and None in column:
                    raise UserError(
                        f"{where}: row {column.index(None)} of row group {rg} has no {name} (null); every row "
                        "needs an id and a text (an empty text is dropped): fill or drop that row"
                    )
            values[0] = [str(i) for i in values[0]]
            yield rg, pf.num_row_groups, values
    except MemoryError:
        raise UserError(
            f"{where}: a row group does not fit in this machine's memory; read the export on a machine with more "
            "memory, or rewrite it with smaller row groups (pyarrow.parquet.write_table(..., row_group_size=...))"
        ) from None
    except (pa.ArrowException, OSError) as e:
        raise UserError(
            f"{where} is damaged or truncated ({e}); download it again (delete a partial copy first)"
        ) from None


def _key(doc_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(), "little")


def _check_unique(parts: list[tuple[str, Path, str | None]], keys: np.ndarray) -> None:
    """``UserError`` naming an id two rows share. Only ids whose 8-byte keys repeat are looked for, in a second
    pass over the ``id`` column; a key collision of two distinct ids is no refusal."""
    uniq, n = np.unique(keys, return_counts=True)
    repeated = {int(k) for k in uniq[n > 1]}
    if not repeated:
        return
    seen: dict[str, str] = {}
    for where, path, _ in parts:
        with open(path, "rb") as f:
            for rg, _, (ids,) in _row_groups(f, where, ("id",)):
                for row, doc_id in enumerate(ids):
                    if _key(doc_id) in repeated:
                        here = f"row {row} of row group {rg} of {where}"
                        if doc_id in seen:
                            raise UserError(
                                f"id {doc_id!r} is in two rows ({seen[doc_id]}, and {here}); an id is a page id, "
                                "once in an export: give the files of one export (one language, one date)"
                            )
                        seen[doc_id] = here


SOURCE = ParquetSource()
