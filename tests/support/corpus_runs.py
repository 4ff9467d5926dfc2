"""Helpers for the corpus stage's tests: the chapter's own output from a zip, what a run wrote."""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path

CHAPTER_RE = re.compile(r"^\s*=+ [^=]+ =+\s*$\n?", flags=re.MULTILINE)  # the chapter's regex, verbatim


def chapter_wikipedia_txt(zip_bytes: bytes, workdir: Path) -> bytes:
    """The chapter's ``wikipedia.txt`` from ``zip_bytes``, made as the chapter makes it (unzip, strip, join): the
    reference a wikitext corpus is compared with."""

    def _strip_wikitext_markup(text: str) -> str:
        return re.sub(r"^\s*=+ [^=]+ =+\s*$\n?", "", text, flags=re.MULTILINE)

    with zipfile.ZipFile(io.BytesIO(zip_bytes)) as z:
        z.extractall(workdir)
    out_path = workdir / "wikipedia.txt"
    with open(out_path, "w", encoding="utf-8") as out:
        for name in ("wiki.train.raw", "wiki.valid.raw", "wiki.test.raw"):
            with open(workdir / "wikitext-103-raw" / name, encoding="utf-8") as f:
                cleaned = _strip_wikitext_markup(f.read())
            out.write(cleaned)
    return out_path.read_bytes()


def joined_splits(folder) -> bytes:
    """``cat`` of a corpus version's split files in its manifest's order: the chapter's ``wikipedia.txt`` for a
    wikitext corpus (the corpus no longer writes that copy)."""
    from tasks.corpora.splits import split_files

    folder = Path(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    return b"".join((folder / f.text).read_bytes() for f in split_files(manifest))


def published(root: Path, stage: str = "corpus") -> list[str]:
    sdir = Path(root) / stage
    return sorted(p.name for p in sdir.iterdir() if not p.name.startswith(".")) if sdir.is_dir() else []


def metrics(ref) -> dict:
    return json.loads((Path(ref["path"]) / "manifest.json").read_text())["metrics"]


def train_text(ref) -> str:
    return (Path(ref["path"]) / "wiki.train.txt").read_text(encoding="utf-8")


def all_text_under(root: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in Path(root).rglob("*") if p.is_file())


def written_forms(secret: str) -> set[str]:
    """``secret`` as a message may quote it: raw, percent-encoded (either case of hex, ``+`` for a space)."""
    from urllib.parse import quote, quote_plus

    forms = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret)}
    return forms | {re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), f) for f in forms}
