"""A corpus of any kind made from text, through the corpus boundary (the stage's own build): tests state the text
they need, not how a kind packs it."""

from __future__ import annotations

from pathlib import Path

from tasks.core.stage import StageRef
from tests.support import stages
from tests.support.shared_data import absent


def source_file(splits: dict[str, str] | None = None, *, kind: str = "wikitext", text: str = "") -> tuple[str, bytes]:
    """The file a corpus source of ``kind`` reads, as ``(name, bytes)`` (to write, or to serve on the test's
    loopback server): for ``wikitext``, a zip of ``splits`` (``{split: raw text}``); for ``text``, ``text`` in one
    file (the writer splits it by document)."""
    if kind == "wikitext":
        from tests.support.zips import wikitext_zip

        return "wikitext-103-raw-v1.zip", wikitext_zip(splits or {})
    return "corpus.txt", text.encode("utf-8")


def source_url(tmp: Path, splits: dict[str, str] | None = None, *, kind: str = "wikitext", text: str = "") -> str:
    """:func:`source_file` written into ``tmp``, as the ``file://`` URL ``corpus.source_url`` takes."""
    name, data = source_file(splits, kind=kind, text=text)
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / name).write_bytes(data)
    return (tmp / name).as_uri()


def corpus_from_text(
    root, tmp: Path, splits: dict[str, str] | None = None, *, kind: str = "wikitext", text: str = "", **settings
) -> StageRef:
    """A published corpus version of ``kind`` under ``root``, its source (:func:`source_file`) written into
    ``tmp``. ``settings``: the corpus stage's others (``article_index``, ``valid_fraction``, ...)."""
    return stages.corpus(root, kind=kind, source_url=source_url(tmp, splits, kind=kind, text=text), **settings)


def shared_splits() -> dict[str, str]:
    """The real test text (WikiText-2's validation file in ../shared/data) cut at article boundaries into train,
    valid and test, as the demo mirror cuts it; the test stops (absent) where the file is not there."""
    from flows.mirror import wikitext_splits

    try:
        return wikitext_splits()
    except FileNotFoundError as e:
        absent(str(e))
