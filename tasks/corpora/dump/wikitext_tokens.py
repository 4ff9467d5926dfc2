"""The fast path of :func:`tasks.corpora.dump.wikitext.plain_text`: the same walk as the parse tree's, over the
tokens of ``mwparserfromhell``'s C tokenizer, without building the tree. Why: building the nodes (every link's
title and text wrapped as wikicode) is most of the parse's time, and a dropped template or reference needs no node
at all, only its tokens skipped. Whatever it does not expect (markup in a link's target or a tag's name, a tag in
an attribute, a token out of place) raises :class:`Unexpected` and the page goes the plain way; the tests prove
the two equal on real-shaped pages and on each construct.
"""

from __future__ import annotations

import html

from mwparserfromhell.parser import tokens as T
from mwparserfromhell.parser._tokenizer import CTokenizer

from tasks.corpora.dump.wikitext_rules import DROPPED_TAGS, LINE_TAGS, SiteNames, heading_line, link_shown

_TEXT = T.Text


class Unexpected(Exception):
    """A token sequence the walk does not read the way the tree does: take the plain path."""


def walk(wikitext: str, site: SiteNames, out: list[str]) -> None:
    """Append the text pieces of ``wikitext`` to ``out``, as the tree's walk appends them."""
    # context 0, skip_style_tags: as mwparserfromhell.parse(..., True); a tokenizer per call, as parse() makes one:
    # a CTokenizer holds its state in itself, so two threads of one Dask worker must not share one
    toks = CTokenizer().tokenize(wikitext, 0, True)
    if _seq(toks, 0, site, out, None) != len(toks):
        raise Unexpected("tokens left over")


def _seq(toks: list, i: int, site: SiteNames, out: list[str], stop: type | None) -> int:
    """Walk from ``toks[i]`` to the token of type ``stop`` (returned: its index) or the end (``stop`` None)."""
    n = len(toks)
    append = out.append
    while i < n:
        tok = toks[i]
        kind = type(tok)
        if kind is _TEXT:
            append(tok["text"])
            i += 1
        elif kind is stop:
            return i
        elif kind is T.HeadingStart:
            title: list[str] = []
            i = _seq(toks, i + 1, site, title, T.HeadingEnd) + 1
            line = heading_line(tok["level"], title)
            if line:
                append(line)
        else:
            step = _STEPS.get(kind)
            if step is None:
                raise Unexpected(kind.__name__)
            i = step(toks, i, site, out)
    if stop is not None:
        raise Unexpected(f"no {stop.__name__}")
    return i


def _skip(toks: list, i: int, open_: type, close: type) -> int:
    """The index after the ``close`` that matches ``toks[i]`` (an ``open_``)."""
    depth = 0
    for j in range(i, len(toks)):
        kind = type(toks[j])
        if kind is open_:
            depth += 1
        elif kind is close:
            depth -= 1
            if not depth:
                return j + 1
    raise Unexpected(f"no {close.__name__}")


def _texts(toks: list, i: int, ends: tuple[type, ...]) -> tuple[str, int]:
    """The raw text of ``toks[i:]`` up to a token of a type in ``ends`` (its index); only Text tokens allowed."""
    n = len(toks)
    if i + 1 < n and type(toks[i]) is _TEXT and type(toks[i + 1]) in ends:  # most often: one Text, then the end
        return toks[i]["text"], i + 1
    parts = []
    while i < n:
        tok = toks[i]
        if type(tok) is _TEXT:
            parts.append(tok["text"])
        elif type(tok) in ends:
            return "".join(parts), i
        else:
            raise Unexpected("markup where text was expected")
        i += 1
    raise Unexpected("no end")


def _wikilink(toks: list, i: int, site: SiteNames, out: list[str]) -> int:
    target, i = _texts(toks, i + 1, (T.WikilinkSeparator, T.WikilinkClose))
    shown = link_shown(target, site)
    if type(toks[i]) is T.WikilinkClose:
        if shown is not None:
            out.append(shown)
        return i + 1
    text: list[str] = []
    i = _seq(toks, i + 1, site, text, T.WikilinkClose)
    if shown is not None:
        out.extend(text)
    return i + 1


def _external_link(toks: list, i: int, site: SiteNames, out: list[str]) -> int:
    brackets = toks[i].get("brackets")
    url, i = _texts(toks, i + 1, (T.ExternalLinkSeparator, T.ExternalLinkClose))
    if type(toks[i]) is T.ExternalLinkClose:
        if not brackets:
            out.append(url)
        return i + 1
    return _seq(toks, i + 1, site, out, T.ExternalLinkClose) + 1


def _entity(toks: list, i: int, out: list[str]) -> int:
    """``&name;``, ``&#NNN;``, ``&#xHH;`` as its character (the tree's ``str(node)``, unescaped)."""
    j = i + 1
    prefix = "&"
    if type(toks[j]) is T.HTMLEntityNumeric:
        prefix += "#"
        j += 1
        if type(toks[j]) is T.HTMLEntityHex:
            prefix += toks[j]["char"]
            j += 1
    if type(toks[j]) is not _TEXT or type(toks[j + 1]) is not T.HTMLEntityEnd:
        raise Unexpected("entity")
    out.append(html.unescape(f"{prefix}{toks[j]['text']};"))
    return j + 2


_ATTRIBUTE_TOKENS = (T.TagAttrStart, T.TagAttrEquals, T.TagAttrQuote, T.Text)


def _tag(toks: list, i: int, site: SiteNames, out: list[str]) -> int:
    start = i
    name, i = _texts(toks, i + 1, (T.TagAttrStart, T.TagCloseOpen, T.TagCloseSelfclose))
    tag = name.strip().lower()
    if tag in DROPPED_TAGS:  # the tag whole: every TagOpenOpen inside ends with one TagCloseSelfclose or -Close
        depth = 0
        for j in range(start, len(toks)):
            kind = type(toks[j])
            if kind is T.TagOpenOpen:
                depth += 1
            elif kind is T.TagCloseSelfclose or kind is T.TagCloseClose:
                depth -= 1
                if not depth:
                    return j + 1
        raise Unexpected("no tag close")
    while type(toks[i]) is not T.TagCloseOpen and type(toks[i]) is not T.TagCloseSelfclose:  # attributes
        kind = type(toks[i])
        if kind in _ATTRIBUTE_TOKENS:
            i += 1
        elif kind is T.TemplateOpen:
            i = _skip(toks, i, T.TemplateOpen, T.TemplateClose)
        elif kind is T.CommentStart:
            i = _skip(toks, i, T.CommentStart, T.CommentEnd)
        else:
            raise Unexpected("markup in a tag's attributes")
    line = tag in LINE_TAGS
    if line:
        out.append("\n")
    if type(toks[i]) is T.TagCloseOpen:
        i = _seq(toks, i + 1, site, out, T.TagOpenClose)
        _, i = _texts(toks, i + 1, (T.TagCloseClose,))
    if line:
        out.append("\n")
    return i + 1


def _skipper(open_: type, close: type):
    return lambda toks, i, site, out: _skip(toks, i, open_, close)


#: what each token that opens a construct starts (a heading and text are read in _seq itself)
_STEPS = {
    T.TemplateOpen: _skipper(T.TemplateOpen, T.TemplateClose),
    T.ArgumentOpen: _skipper(T.ArgumentOpen, T.ArgumentClose),
    T.CommentStart: _skipper(T.CommentStart, T.CommentEnd),
    T.WikilinkOpen: _wikilink,
    T.TagOpenOpen: _tag,
    T.ExternalLinkOpen: _external_link,
    T.HTMLEntityStart: lambda toks, i, site, out: _entity(toks, i, out),
}
