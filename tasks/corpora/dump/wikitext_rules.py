"""What the wikitext conversion keeps and drops, in one place for both of its walks (the parse tree's in
:mod:`tasks.corpora.dump.wikitext`, the tokens' in :mod:`tasks.corpora.dump.wikitext_tokens`): the tags whose
content goes, the links that go, and how a heading line is written (docs/CORPUS.md, "A MediaWiki dump").
"""

from __future__ import annotations

import functools
import re
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
#: what is written as one space: a run of two or more spaces, tabs and no-break spaces, or one tab or no-break space
#: (a lone space is left where it is: the same text as replacing every run, with far fewer replacements)
SPACES = re.compile(r"[ \t\u00a0]{2,}|[\t\u00a0]")


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


def heading_line(level: int, title_parts: list[str]) -> str | None:
    """A heading as _walk marks it for _layout (NUL, its level, \\x01, its `` = = Title = = `` line); None when its
    title has no text."""
    text = SPACES.sub(" ", "".join(title_parts).replace("\n", " ")).strip()
    if not text:
        return None
    level = max(2, level)
    marks = " ".join("=" * level)
    return f"\n\x00{level}\x01{marks} {text} {marks}\n"


@functools.lru_cache(maxsize=1 << 16)  # an article links to the same pages again and again
def link_shown(target: str, site: SiteNames) -> str | None:
    """What a wikilink to ``target`` (its raw title) shows when it has no text: None when the link is dropped (a
    file, a category, an interlanguage link), else the target without its leading colon and its #section."""
    target = target.strip()
    shown_as_link = target.startswith(":")  # [[:Category:X]] is a link to the page, not a categorisation
    prefix, colon, _ = target.lstrip(":").partition(":")
    prefix = prefix.strip().lower()
    if colon and not shown_as_link:
        if prefix in site.dropped:
            return None
        if prefix not in site.namespaces and _LANGUAGE_PREFIX.fullmatch(prefix):
            return None
    return target.lstrip(":").split("#", 1)[0] or target
