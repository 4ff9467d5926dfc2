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

from tasks.corpora.dump.wikitext_rules import (
    DROPPED_TAGS,
    ENGLISH,
    LINE_TAGS,
    SPACES,
    SiteNames,
    heading_line,
    link_shown,
)

__all__ = ["ENGLISH", "SiteNames", "plain_text"]

_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_STYLE_QUOTES = re.compile("'{2,}")  # italic and bold marks


def plain_text(wikitext: str, site: SiteNames = ENGLISH, fast: bool = True) -> str:
    """The article's text: paragraphs separated by a blank line, each section heading as a `` = = Heading = = ``
    line (one ``=`` per level, at least two), a heading whose section has no text left dropped; ``""`` when
    nothing is left. Each line is stripped and runs of spaces are one space. ``fast``: the same walk over the
    tokenizer's tokens, without building the tree (:mod:`tasks.corpora.dump.wikitext_tokens`; a page it does not
    expect goes the plain way); ``False``: the plain path, the tree's nodes."""
    import mwparserfromhell

    from tasks.corpora.dump import wikitext_tokens

    wikitext = wikitext.replace("\x00", "")
    parts: list[str] = []
    if fast:
        try:
            wikitext_tokens.walk(wikitext, site, parts)
        except wikitext_tokens.Unexpected:
            parts = []
            fast = False
    if not fast:
        # bold and italic quotes are dropped as text (_layout): parsing them as tags costs time, trips on unbalanced
        _walk(mwparserfromhell.parse(wikitext, skip_style_tags=True).nodes, site, parts)
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
            line = heading_line(node.level, title)
            if line:
                out.append(line)
        elif isinstance(node, n.ExternalLink):
            if node.title is not None:
                _walk(node.title.nodes, site, out)
            elif not node.brackets:
                out.append(str(node.url))
        elif isinstance(node, n.HTMLEntity):
            out.append(html.unescape(str(node)))
        # Template, Argument, Comment, anything else: dropped


def _link(node, site: SiteNames, out: list[str]) -> None:
    shown = link_shown(str(node.title), site)
    if shown is None:
        return
    if node.text is not None:
        _walk(node.text.nodes, site, out)
    else:
        out.append(shown)


def _layout(raw: str) -> str:
    """Lines stripped, blank runs collapsed, paragraphs and headings apart by one blank line, empty sections gone."""
    blocks: list[tuple[int, str]] = []  # (heading level or 0 for text, text)
    if "__" in raw:
        raw = _MAGIC_WORD.sub("", raw)
    for line in SPACES.sub(" ", _STYLE_QUOTES.sub("", raw)).split("\n"):
        level = 0
        if line.startswith("\x00"):  # a heading, as _walk marks it: NUL, its level, \x01, its line
            mark, _, line = line[1:].partition("\x01")
            level = int(mark)
        line = line.strip()
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
