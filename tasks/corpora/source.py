"""What a corpus source is: what its bytes are (``identity``) and the documents they hold, in order (``documents``).

A source names its content, never its address (a Dagster observable source asset): two URLs serving the same
bytes give one corpus version, and a changed file at one URL gives a new one. The corpus writer, not the source,
owns splits, the article index, hashing, bounds and publication, so a new kind of corpus is one adapter module.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from mygpt.atomic import atomic_write_text

#: the splits every corpus has, in the order they are written; a source may bring its own assignment
SPLIT_NAMES = ("train", "valid", "test")


@dataclass(frozen=True)
class Document:
    """One article. ``doc_id`` is stable across releases of the source (a page id, a file's relative path): it,
    and only it, decides the split of a source that has none. ``text`` is plain text in wikitext-103's shape
    (paragraphs separated by blank lines, section headings as `` = = Heading = = `` lines), without the title line:
    the writer marks where each article starts. ``split`` is the source's own split, or None."""

    doc_id: str
    title: str
    text: str
    split: str | None = None


def split_of(doc_id: str, valid_fraction: float, test_fraction: float) -> str:
    """The split of a document from a source without splits: a stable hash of its id alone, so the same page lands
    in the same split in every release (a test article never leaks into a later release's train split).
    ``u = sha256(doc_id)[:8] / 2**64``: test if ``u < test_fraction``, else valid if ``u < test + valid``, else
    train."""
    u = int.from_bytes(hashlib.sha256(doc_id.encode("utf-8")).digest()[:8], "big") / 2.0**64
    if u < test_fraction:
        return "test"
    if u < test_fraction + valid_fraction:
        return "valid"
    return "train"


class SourceContext(NamedTuple):
    """What ``identity`` gets: the artifact store (its source index, the versions to fall back to), the logger and
    the corpus stage (whose version a fetched source looks up)."""

    store: Any
    log: Any
    stage: Any


class CorpusSource(Protocol):
    """An adapter: one module per kind of corpus (``corpus.kind``). ``identity`` gets a :class:`SourceContext`,
    ``documents`` the build's ``BuildContext``. A source that has its splits already (the wikitext zip) may instead
    give the writer their bytes: a ``split_streams(settings, ctx)`` context manager yielding
    ``(streams, raw_total, metrics)`` (:class:`tasks.corpora.writer.SplitStream`), which the writer takes in
    place of ``documents``."""

    #: the ``corpus.kind`` that selects it
    kind: str
    #: the ``corpus.*`` settings this kind reads; any other a user sets for it is refused, never dropped
    fields: frozenset[str]

    def identity(self, settings: Any, ctx: Any) -> dict:
        """What the source's bytes are: a content digest and size (``{"sha256": ..., "bytes": ...}`` or the
        source's own checksum), never its address. Part of the corpus version id."""
        ...

    def documents(self, settings: Any, ctx: Any) -> Iterator[Document]:
        """The documents, in a deterministic order that depends only on the content named by ``identity``."""
        ...


def save_counts(work: Path | str, name: str, counts: dict) -> None:
    """Keep what a source counted while it gave its documents (the report's rows) as ``name`` in the build's work
    folder, for its ``report_metrics``. Why a file: the documents are a generator the writer drains, so the counts
    exist only once it has ended, and the writer asks for them after."""
    atomic_write_text(Path(work) / name, json.dumps(counts))


def saved_counts(work: Path | str, name: str) -> dict[str, Any]:
    """What :func:`save_counts` kept as ``name``; ``{}`` before the documents ended."""
    path = Path(work) / name
    return json.loads(path.read_text()) if path.exists() else {}
