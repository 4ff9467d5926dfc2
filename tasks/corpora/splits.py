"""The corpus's splits and their files, as its manifest records them: the one reader every downstream stage (and
the shard format) asks which splits there are and where each one's text and article index lie, so no module outside
the corpus room names a split file or a fixed list of splits."""

from __future__ import annotations

from typing import Any, NamedTuple

from tasks.corpora.source import SPLIT_NAMES

#: the manifest's metrics key: ``[{"split", "text", "articles"}]``, in the order the splits were written
SPLIT_FILES_KEY = "split_files"
TRAIN = "train"  # the split a tokenizer trains on and a model trains on by default
TEST = "test"  # the split evaluate reads


class SplitFiles(NamedTuple):
    """One split of a corpus version: its name, its text file, its article index file (None without one)."""

    split: str
    text: str
    articles: str | None


def split_file_names(split: str, article_index: bool) -> SplitFiles:
    """The files the writer gives ``split`` (the chapter's names: ``wiki.train.txt``, ...)."""
    return SplitFiles(split, f"wiki.{split}.txt", f"wiki.{split}.articles.npy" if article_index else None)


def split_files(manifest: dict[str, Any]) -> list[SplitFiles]:
    """The splits of the corpus version ``manifest``, in order. A version published before the manifest recorded
    them (no ``split_files``) has wikitext's three, with an article index where its metrics count articles."""
    metrics = manifest.get("metrics") or {}
    recorded = metrics.get(SPLIT_FILES_KEY)
    if recorded:
        return [SplitFiles(r["split"], r["text"], r.get("articles")) for r in recorded]
    stats = metrics.get("splits") or {}
    return [split_file_names(s, "articles" in (stats.get(s) or {})) for s in SPLIT_NAMES]


def corpus_splits(store: Any, ref: Any) -> dict[str, SplitFiles]:
    """``{split: files}`` of the published corpus version ``ref`` (a stage's input) in ``store``."""
    manifest = store.read_manifest("corpus", ref["version"])
    if manifest is None:
        raise FileNotFoundError(f"corpus/{ref['version']} is not published")
    return {f.split: f for f in split_files(manifest)}
