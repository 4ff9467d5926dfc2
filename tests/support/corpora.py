"""A corpus of any kind made from text, through the corpus boundary (the stage's own build): tests state the text
they need, not how a kind packs it."""

from __future__ import annotations

from pathlib import Path

from flows.mirror import MEMBER, make_zip
from tasks.core.stage import StageRef
from tests.support import stages


def corpus_from_text(
    root, tmp: Path, splits: dict[str, str] | None = None, *, kind: str = "wikitext", text: str = "", **settings
) -> StageRef:
    """A published corpus version of ``kind`` under ``root``: for ``wikitext``, a zip of ``splits`` (``{split:
    raw text}``, the zip's three members); for ``text``, ``text`` in one file (the writer splits it by document).
    ``settings``: the corpus stage's others (``article_index``, ``valid_fraction``, ...)."""
    tmp.mkdir(parents=True, exist_ok=True)
    if kind == "wikitext":
        path = tmp / "wikitext-103-raw-v1.zip"
        path.write_bytes(make_zip({MEMBER.format(split=s): t for s, t in (splits or {}).items()}))
    else:
        path = tmp / "corpus.txt"
        path.write_text(text, encoding="utf-8")
    return stages.corpus(root, kind=kind, source_url=path.as_uri(), **settings)
