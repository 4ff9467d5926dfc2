"""``corpus.kind=text``: your own UTF-8 text. ``corpus.source_url`` names a file (``file:///path/to/book.txt``), a
folder of ``.txt`` files (``file:///path/to/folder``: every ``*.txt`` under it, sorted by relative path) or an
http(s):// URL of one file (allow-listed as the zip is). One document per file, or, where a file holds
blank-line-separated `` = Title = `` lines (wikitext's shape), one per block under each; the writer splits them by
a hash of each document's id (``corpus.valid_fraction`` / ``corpus.test_fraction``). Identity: the sha256 of the
file and its name (the documents' ids); for a folder, of its sorted ``(relative path, sha256)`` list, so a renamed
file is another corpus."""

from __future__ import annotations

import codecs
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

from mygpt.errors import UserError
from tasks.corpora.folder import changed, digest, folder_identity, folder_of, listing
from tasks.corpora.source import Document, SourceContext
from tasks.sources.fetched import fetched_file
from tasks.sources.identity import fetched_identity

_TITLE_RE = re.compile(r"^ = ([^=].*?) = $")
#: what the reading makes of a file's bytes; a change to it is a new number (a new version): 2, a leading byte order
#: mark is not text; 3, the article index marks only each document's own title line
READING_VERSION = 3


class TextSource:
    kind = "text"
    fields = frozenset({"source_url", "expected_sha256", "article_index", "valid_fraction", "test_fraction"})

    def identity(self, settings, ctx: SourceContext) -> dict:
        folder = folder_of(settings)
        if folder is None:  # the name too (its sha256: a URL's last segment may be a token), as it is the
            # documents' doc_id, which picks their splits
            name_sha256 = hashlib.sha256(_file_name(settings).encode("utf-8")).hexdigest()
            identity = fetched_identity(settings, ctx.store, ctx.log, ctx.stage)
            return {**identity, "name_sha256": name_sha256, "reading": READING_VERSION}
        return folder_identity(folder, settings, ctx.store, ".txt", READING_VERSION)

    def documents(self, settings, ctx) -> Iterator[Document]:
        folder = folder_of(settings)
        if folder is not None:
            files = listing(folder, settings, ctx.store, ".txt")
            if ctx.source and digest(files) != ctx.source.get("sha256"):
                raise UserError(changed(settings.shown_url))
            for rel, sha in files:
                yield from file_documents(rel, _read(folder / rel, settings.shown_url, sha))
            return
        with fetched_file(ctx, settings, ctx.stage) as got:
            yield from file_documents(_file_name(settings), _read(got.path, settings.shown_url, got.sha256))


def file_documents(rel: str, text: str) -> Iterator[Document]:
    """The documents of one file: one per block under each blank-line-separated `` = Title = `` line (a block
    before the first is a document of its own), or the whole file when it has none. ``doc_id``: the relative
    path, with ``#n`` and the title for a block (``n`` its place in the file, so equal titles stay apart)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    heads = [
        i
        for i, line in enumerate(lines)
        if _TITLE_RE.match(line)
        and (i == 0 or not lines[i - 1].strip())
        and (i + 1 == len(lines) or not lines[i + 1].strip())
    ]
    if not heads:
        if text.strip():
            yield Document(rel, Path(rel).stem, text)
        return
    if "\n".join(lines[: heads[0]]).strip():
        yield Document(f"{rel}#0", Path(rel).stem, "\n".join(lines[: heads[0]]))
    for n, (start, end) in enumerate(zip(heads, [*heads[1:], len(lines)], strict=True), start=1):
        m = _TITLE_RE.match(lines[start])
        assert m is not None
        body = "\n".join(lines[start + 2 : end]).strip("\n")
        yield Document(f"{rel}#{n} {m.group(1)}", m.group(1), body + "\n")


def _file_name(settings) -> str:
    """The name of the one file ``source_url`` names (its URL's last path segment): its documents' ``doc_id``."""
    return Path(settings.source_url.split("?")[0].rstrip("/")).name or "text"


def _read(path: Path, shown: str, sha256: str) -> str:
    """The text of ``path``, whose bytes must be the ones named by ``sha256`` (hashed when the version was named:
    a file rewritten since would give a version other bytes than its id names); a leading UTF-8 byte order mark
    (which Windows editors write) is not text."""
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise UserError(changed(shown))
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as e:  # the offset in the file, the mark counted
        raise UserError(
            f"{path.name} of {shown} is not valid UTF-8 (byte {e.object[e.start]:#04x} at offset {bom + e.start:,}); "
            "give UTF-8 text"
        ) from None


SOURCE = TextSource()
