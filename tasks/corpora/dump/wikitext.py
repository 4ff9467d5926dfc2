"""One article's wikitext as plain text in wikitext-103's shape, by ``mwparserfromhell``'s parse tree.

What is kept and dropped is stated in docs/CORPUS.md ("A MediaWiki dump"): templates, references, tables, files,
categories, interlanguage links, comments and magic words go; link text, bold/italic text, list items and section
headings stay. Why a parse tree and not regular expressions (wikiextractor's way): nesting (a template inside a
link inside a file caption, a table inside a template) is where regexes leave markup behind.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from dataclasses import dataclass

#: tags whose whole content is dropped: footnotes, tables, media, formulas, code and anything rendered by an extension
DROPPED_TAGS = frozenset(
    {"ref", "references", "table", "gallery", "imagemap", "math", "chem", "ce", "score", "timeline", "graph",
     "mapframe", "maplink", "templatestyles", "templatedata", "syntaxhighlight", "source", "pre", "categorytree",
     "inputbox", "hiero", "charinsert", "section", "indicator"}
)  # fmt: skip
#: tags that end a line where they stand
LINE_TAGS = frozenset(["br", "li", "dt", "dd", "p", "div", "hr"])
#: the namespaces (canonical numbers) whose links are dropped: media, files, categories
DROPPED_LINK_NAMESPACES = frozenset({-2, 6, 14})
#: English aliases MediaWiki accepts in every language for those namespaces
CANONICAL_LINK_PREFIXES = frozenset({"media", "file", "image", "category"})
_LANGUAGE_PREFIX = re.compile(r"[a-z]{2,3}(?:-[a-z0-9]+)*")  # an interlanguage link: [[de:...]], [[zh-yue:...]]
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_STYLE_QUOTES = re.compile("'{2,}")  # italic and bold marks
_SPACES = re.compile(r"[ \t\u00a0]+")


@dataclass(frozen=True)
class SiteNames:
    """What a wiki calls its namespaces (from the dump's ``<siteinfo>``): the prefixes of links that are dropped,
    and every namespace prefix (so an interwiki-looking prefix that is a namespace is not taken for a language)."""

    dropped: frozenset[str]
    namespaces: frozenset[str]

    @classmethod
    def of(cls, namespaces: dict[int, str]) -> SiteNames:
        dropped = {name.lower() for key, name in namespaces.items() if key in DROPPED_LINK_NAMESPACES}
        return cls(
            frozenset(dropped | CANONICAL_LINK_PREFIXES),
            frozenset(name.lower() for name in namespaces.values() if name) | CANONICAL_LINK_PREFIXES,
        )


ENGLISH = SiteNames.of({-2: "Media", 6: "File", 14: "Category"})


def plain_text(wikitext: str, site: SiteNames = ENGLISH) -> str:
    """The article's text: paragraphs separated by a blank line, each section heading as a `` = = Heading = = ``
    line (one ``=`` per level, at least two), a heading whose section has no text left dropped; ``""`` when
    nothing is left. Each line is stripped and runs of spaces are one space."""
    import mwparserfromhell

    parts: list[str] = []
    # bold and italic quotes are dropped as text (_layout): parsing them as tags costs time and trips on unbalanced ones
    _walk(mwparserfromhell.parse(wikitext.replace("\x00", ""), skip_style_tags=True).nodes, site, parts)
    return _layout("".join(parts))


def _walk(nodes: Iterable, site: SiteNames, out: list[str]) -> None:
    from mwparserfromhell import nodes as n

    for node in nodes:
        if isinstance(node, n.Text):
            out.append(node.value)
        elif isinstance(node, n.Wikilink):
            _link(node, site, out)
        elif isinstance(node, n.Tag):
            tag = str(node.tag).strip().lower()
            if tag in DROPPED_TAGS:
                continue
            if tag in LINE_TAGS:
                out.append("\n")
            if node.contents is not None and not node.self_closing:
                _walk(node.contents.nodes, site, out)
            if tag in LINE_TAGS:
                out.append("\n")
        elif isinstance(node, n.Heading):
            title: list[str] = []
            _walk(node.title.nodes, site, title)
            text = _SPACES.sub(" ", "".join(title).replace("\n", " ")).strip()
            if text:
                marks = " ".join("=" * max(2, node.level))
                out.append(f"\n\x00{max(2, node.level)}\x01{marks} {text} {marks}\n")
        elif isinstance(node, n.ExternalLink):
            if node.title is not None:
                _walk(node.title.nodes, site, out)
            elif not node.brackets:
                out.append(str(node.url))
        elif isinstance(node, n.HTMLEntity):
            out.append(html.unescape(str(node)))
        # Template, Argument, Comment, anything else: dropped


def _link(node, site: SiteNames, out: list[str]) -> None:
    target = str(node.title).strip()
    shown_as_link = target.startswith(":")  # [[:Category:X]] is a link to the page, not a categorisation
    prefix, colon, _ = target.lstrip(":").partition(":")
    prefix = prefix.strip().lower()
    if colon and not shown_as_link:
        if prefix in site.dropped:
            return
        if prefix not in site.namespaces and _LANGUAGE_PREFIX.fullmatch(prefix):
            return
    if node.text is not None:
        _walk(node.text.nodes, site, out)
    else:
        out.append(target.lstrip(":").split("#", 1)[0] or target)


def _layout(raw: str) -> str:
    """Lines stripped, blank runs collapsed, paragraphs and headings apart by one blank line, empty sections gone."""
    blocks: list[tuple[int, str]] = []  # (heading level or 0 for text, text)
    for line in _STYLE_QUOTES.sub("", _MAGIC_WORD.sub("", raw)).split("\n"):
        level = 0
        if line.startswith("\x00"):  # a heading, as _walk marks it: NUL, its level, \x01, its line
            mark, _, line = line[1:].partition("\x01")
            level = int(mark)
        line = _SPACES.sub(" ", line).strip()
        if line:
            blocks.append((level, line))
    kept: list[str] = []
    pending: list[tuple[int, str]] = []  # headings not yet followed by text: (level, line)
    for level, line in blocks:
        if level:
            while pending and pending[-1][0] >= level:
                pending.pop()
            pending.append((level, f" {line} "))
        else:
            kept.extend(h for _, h in pending)
            pending.clear()
            kept.append(line)
    return "\n\n".join(kept) + "\n" if kept else ""
