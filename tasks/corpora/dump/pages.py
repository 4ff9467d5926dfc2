"""The XML of a MediaWiki export: the dump's header (``<mediawiki>`` and ``<siteinfo>``) and its ``<page>``
elements, parsed with entity declarations and DTDs refused (``defusedxml``: an entity-expansion bomb is an error,
never expanded), each page's text bounded.

A multistream dump's first bz2 stream holds the header up to ``</siteinfo>``, each later one ~100 ``<page>``
elements without a root, the last also ``</mediawiki>``: a stream is parsed on its own, inside a root of ours.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from mygpt.errors import UserError

#: the most one page's wikitext may hold: MediaWiki refuses to save more than 2 MiB by default ($wgMaxArticleSize)
MAX_PAGE_BYTES = 8 << 20
_EXPORT_NS = re.compile(rb"<mediawiki\b[^>]*\bxmlns=\"http://www\.mediawiki\.org/xml/export-[0-9.]+/\"")
_TAG_NS = re.compile(r"^\{[^}]*\}")


class DumpError(UserError):
    """The dump's bytes are not a well-formed MediaWiki export; the message names the file, where, and what to do."""


@dataclass(frozen=True)
class SiteInfo:
    """The wiki the dump is of: its database name (``enwiki``) and its namespaces (number -> local name)."""

    dbname: str
    namespaces: dict[int, str]


@dataclass(frozen=True)
class Page:
    """One ``<page>``: its id, namespace, title, whether it is a redirect, and its latest revision's wikitext."""

    page_id: int
    ns: int
    title: str
    redirect: bool
    text: str


def parse_header(data: bytes, where: str) -> SiteInfo:
    """The ``<siteinfo>`` of a dump's first stream (``data``: its bytes, up to the first page)."""
    if not _EXPORT_NS.search(data[:4096]):
        raise DumpError(
            f'{where}: not a MediaWiki XML export (no <mediawiki xmlns="http://www.mediawiki.org/xml/export-..."> '
            "at its start); give the URL of a <wiki>-<date>-pages-articles-multistream.xml.bz2 dump"
        )
    end = data.rfind(b"</siteinfo>")
    if end < 0:
        raise DumpError(f"{where}: the dump's first bz2 stream has no </siteinfo>; the file is not a multistream dump")
    root = _parse(data[: end + len(b"</siteinfo>")] + b"</mediawiki>", where)
    site = _child(root, "siteinfo")
    if site is None:
        raise DumpError(f"{where}: the MediaWiki export has no <siteinfo>; the file is not a pages-articles dump")
    namespaces: dict[int, str] = {}
    spaces = _child(site, "namespaces")
    for ns in spaces if spaces is not None else ():
        try:
            namespaces[int(ns.get("key", ""))] = (ns.text or "").strip()
        except ValueError:
            raise DumpError(f"{where}: a <namespace> key {ns.get('key')!r} is not a number") from None
    dbname = _text(_child(site, "dbname"))
    return SiteInfo(dbname, namespaces)


def parse_pages(data: bytes, where: str) -> list[Page]:
    """The pages of one stream's bytes (``where`` names the stream in errors), in order; the latest revision of
    each (the last ``<revision>``: MediaWiki exports revisions oldest first)."""
    _check_utf8(data, where)
    body = data
    end = body.rfind(b"</mediawiki>")
    if end >= 0:
        body = body[:end]
    root = _parse(b"<pages>" + body + b"</pages>", where)
    pages = []
    for page in root:
        if _local(page.tag) != "page":
            raise DumpError(f"{where}: a <{_local(page.tag)}> where only <page> elements belong; not a pages dump")
        revisions = [r for r in page if _local(r.tag) == "revision"]
        text = _text(_child(revisions[-1], "text")) if revisions else ""
        title = _text(_child(page, "title"))
        if 4 * len(text) > MAX_PAGE_BYTES and len(text.encode("utf-8")) > MAX_PAGE_BYTES:
            raise DumpError(
                f"{where}: page {title!r} holds {len(text.encode('utf-8'))} bytes of wikitext, more than the "
                f"{MAX_PAGE_BYTES >> 20} MiB one page may (MediaWiki's own limit is 2 MiB); the dump is damaged"
            )
        try:
            page_id, ns = int(_text(_child(page, "id"))), int(_text(_child(page, "ns")) or "0")
        except ValueError:
            raise DumpError(f"{where}: page {title!r} has an <id> or <ns> that is not a number") from None
        pages.append(Page(page_id, ns, title, _child(page, "redirect") is not None, text))
    return pages


def _check_utf8(data: bytes, where: str) -> None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DumpError(
            f"{where}: invalid UTF-8 at byte {e.start} of the stream's text ({data[e.start : e.start + 4]!r}); "
            "a MediaWiki dump is UTF-8: the file is damaged, download it again"
        ) from None


def _parse(xml: bytes, where: str) -> ET.Element:
    import defusedxml
    import defusedxml.ElementTree as DET

    try:
        return DET.fromstring(xml, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except defusedxml.DefusedXmlException as e:
        raise DumpError(
            f"{where}: the XML declares a DTD or entities ({type(e).__name__}), which a MediaWiki export never "
            "does and which could expand without bound (an entity-expansion bomb); refused, not parsed"
        ) from None
    except ET.ParseError as e:
        raise DumpError(f"{where}: not well-formed XML ({e}); the dump is damaged or not a MediaWiki export") from None


def _local(tag: str) -> str:
    return _TAG_NS.sub("", tag)


def _child(element: ET.Element, name: str) -> ET.Element | None:
    for child in element:
        if _local(child.tag) == name:
            return child
    return None


def _text(element: ET.Element | None) -> str:
    return (element.text or "") if element is not None else ""
