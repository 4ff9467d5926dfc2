"""Wikimedia's names for a dump's files: from the URL of ``<wiki>-<date>-pages-articles-multistream.xml.bz2``,
the index and the checksum file beside it (Wikimedia's own folder layout, what a user pastes), or the whole URL
from the short form ``wiki`` + ``dump_date`` on a mirror; and the sha1 a ``<wiki>-<date>-sha1sums.txt`` gives.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from mygpt.errors import UserError
from tasks.sources.allowed import WIKIMEDIA_DUMPS

#: where the short form points (any mirror keeps Wikimedia's layout: <wiki>/<date>/<files>)
DEFAULT_MIRROR = WIKIMEDIA_DUMPS
DUMP_SUFFIX = "-pages-articles-multistream.xml.bz2"
INDEX_SUFFIX = "-pages-articles-multistream-index.txt.bz2"
_DUMP_NAME = re.compile(r"(?P<wiki>[a-z][a-z0-9_]*)-(?P<date>\d{8}|latest)" + re.escape(DUMP_SUFFIX))
_SHA1 = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class DumpNames:
    """Where a dump's three files are (URLs), and the wiki and date its file name says."""

    dump_url: str
    wiki: str
    dump_date: str

    @property
    def file_name(self) -> str:
        return f"{self.wiki}-{self.dump_date}{DUMP_SUFFIX}"

    @property
    def index_url(self) -> str:
        return self._beside(f"{self.wiki}-{self.dump_date}{INDEX_SUFFIX}")

    @property
    def sha1sums_url(self) -> str:
        return self._beside(f"{self.wiki}-{self.dump_date}-sha1sums.txt")

    def _beside(self, name: str) -> str:
        parts = urllib.parse.urlsplit(self.dump_url)
        folder = parts.path.rsplit("/", 1)[0]
        return urllib.parse.urlunsplit(parts._replace(path=f"{folder}/{name}"))


def dump_names(url: str, field: str = "corpus.source_url") -> DumpNames:
    """The names of the dump at ``url``; ``UserError`` when its file name is not Wikimedia's for such a dump."""
    name = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    m = _DUMP_NAME.fullmatch(name)
    if not m:
        raise UserError(
            f"{field}: {name!r} is not a multistream dump's name; give the URL of "
            f"<wiki>-<date>{DUMP_SUFFIX} (e.g. {DEFAULT_MIRROR}/dewiki/20261101/dewiki-20261101{DUMP_SUFFIX}): "
            "its index and sha1sums file are found beside it by Wikimedia's naming"
        )
    return DumpNames(url, m["wiki"], m["date"])


def short_form_url(wiki: str, dump_date: str, mirror: str = DEFAULT_MIRROR) -> str:
    """The dump URL of ``corpus.wiki`` + ``corpus.dump_date`` on ``mirror``."""
    return f"{mirror.rstrip('/')}/{wiki}/{dump_date}/{wiki}-{dump_date}{DUMP_SUFFIX}"


def sha1_from_sums(text: str, file_name: str, where: str) -> str:
    """The sha1 ``<wiki>-<date>-sha1sums.txt`` (``sha1sum``'s output: ``<40 hex>  <name>`` lines) gives
    ``file_name``."""
    for line in text.splitlines():
        digest, _, name = line.strip().partition(" ")
        if name.strip().lstrip("*") == file_name and _SHA1.fullmatch(digest.lower()):
            return digest.lower()
    raise UserError(f"{where} has no sha1 for {file_name}; set corpus.expected_sha1 to the dump's sha1 (40 hex digits)")
