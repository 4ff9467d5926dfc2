"""The chapter's header strip (``= Title =`` lines out of wikitext), streamed in bounded memory whatever the line
length; cutting the text into blocks gives what one ``re.sub`` over the whole gives (docs/CORPUS.md, "The header
strip"). Every function takes the text as ``str`` or as its UTF-8 ``bytes`` and answers in the same form (for bytes:
the UTF-8 of the str answer, offsets in bytes), so the stage strips the text as the zip gives it, without decoding
and re-encoding all of it (docs/CORPUS.md, "Stripping bytes")."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator
from typing import Any, AnyStr, NamedTuple

from mygpt.errors import UserError

#: The chapter's header-strip regex, verbatim.
HEADER_RE = re.compile(r"^\s*=+ [^=]+ =+\s*$\n?", flags=re.MULTILINE)
BLOCK_CHARS = 4 << 20
#: The longest header candidate kept while undecided (a wikitext header is one short line).
MAX_PENDING_CHARS = 64 << 20

#: What ``\s`` of a str pattern matches (``str.isspace``), as UTF-8: one byte, or a wider character (the last one
#: is U+3000: ``tests/tasks/corpora/test_header_strip.py`` checks all of Unicode).
ASCII_SPACE = bytes(c for c in range(128) if chr(c).isspace())
WIDE_SPACE = tuple(chr(c).encode("utf-8") for c in range(128, 0x3001) if chr(c).isspace())
#: ``\s`` of a str pattern for UTF-8 bytes: one whitespace character, as many bytes as it takes.
UTF8_SPACE = rb"(?:[" + re.escape(ASCII_SPACE) + rb"]|" + b"|".join(map(re.escape, WIDE_SPACE)) + rb")"


class _Form(NamedTuple):
    """The patterns and characters of the strip in one form of the text (str, or UTF-8 bytes)."""

    header: re.Pattern
    start: re.Pattern  # what HEADER_RE needs at a line start before anything else
    candidate: re.Pattern  # the same after a newline: found by a fast scan for "\n"
    header_start: re.Pattern  # a candidate that can be a match, given all the text that follows it
    ws_run: re.Pattern
    eq_run: re.Pattern
    empty: Any  # str or bytes, as the text
    nl: Any  # str or bytes, as the text
    eq: Any  # str or bytes, as the text
    space: Any  # str or bytes, as the text
    unit: str


_STR = _Form(
    HEADER_RE, re.compile(r"\s*="), re.compile(r"\n\s*="), re.compile(r"\n\s*(?==+ [^=])"), re.compile(r"\s*"),
    re.compile(r"=*"), "", "\n", "=", " ", "characters",
)  # fmt: skip
_BYTES = _Form(
    re.compile(rb"^" + UTF8_SPACE + rb"*=+ [^=]+ =+" + UTF8_SPACE + rb"*$\n?", flags=re.MULTILINE),
    re.compile(UTF8_SPACE + rb"*="),
    re.compile(rb"\n" + UTF8_SPACE + rb"*="),
    re.compile(rb"\n" + UTF8_SPACE + rb"*(?==+ [^=])"),
    re.compile(UTF8_SPACE + rb"*"),
    re.compile(rb"=*"),
    b"",
    b"\n",
    b"=",
    b" ",
    "bytes",
)


def _form(text: str | bytes) -> _Form:
    return _BYTES if isinstance(text, bytes) else _STR


def _rstrip(text: AnyStr) -> AnyStr:
    """``text.rstrip()`` of the str form: for UTF-8 bytes, the wider whitespace characters go too."""
    if isinstance(text, str):
        return text.rstrip()
    while True:
        text = text.rstrip(ASCII_SPACE)
        wide = next((w for w in WIDE_SPACE if text.endswith(w)), None)
        if wide is None:
            return text
        text = text[: -len(wide)]


def _lstrip(text: AnyStr) -> AnyStr:
    """``text.lstrip()`` of the str form (see :func:`_rstrip`)."""
    if isinstance(text, str):
        return text.lstrip()
    while True:
        text = text.lstrip(ASCII_SPACE)
        wide = next((w for w in WIDE_SPACE if text.startswith(w)), None)
        if wide is None:
            return text
        text = text[len(wide) :]


def _safe_cut(buf: AnyStr) -> int:
    """The last position ``s`` (just after a ``\\n``) where ``buf`` may be cut for header stripping; -1 if none.

    Safe: the line ending at ``s`` has a non-whitespace character, its last one is not ``=``, and the last ``=``
    before ``s`` does not lead its line (why that suffices: docs/CORPUS.md)."""
    f = _form(buf)
    nl = buf.rfind(f.nl)
    for _ in range(256):
        if nl < 0:
            return -1
        ls = buf.rfind(f.nl, 0, nl) + 1
        line = _rstrip(buf[ls:nl])
        if line and line[-1:] != f.eq:
            q = buf.rfind(f.eq, 0, nl)
            if q < 0:
                return nl + 1
            r0 = q
            while r0 > 0 and buf[r0 - 1 : r0] == f.eq:
                r0 -= 1
            if _rstrip(buf[buf.rfind(f.nl, 0, r0) + 1 : r0]):
                return nl + 1
        nl = ls - 1
    return -1


def is_title(header: AnyStr) -> bool:
    """Whether a removed header match is a level-1 ``= Title =`` line (a wikitext article's first line)."""
    f = _form(header)
    return _lstrip(header)[:2] == f.eq + f.space


def count_titles(text: AnyStr) -> int:
    """How many level-1 ``= Title =`` lines the strip removes from ``text`` on its own."""
    return sum(1 for m in _form(text).header.finditer(text) if is_title(m.group()))


def strip_block(text: AnyStr, line_start: bool = True, articles: list[int] | None = None) -> tuple[AnyStr, int]:
    """``HEADER_RE.subn("", text)``, trying the pattern only at the first line start of each ``\\n\\s*=+ [^=]`` run (the
    same matches, docs/CORPUS.md). ``line_start=False``: ``text`` continues a line (no match starts at its position 0).
    ``articles``: where given, the offsets in the result where a ``= Title =`` match was removed are appended to it."""
    f = _form(text)
    out: list[AnyStr] = []
    last = n = size = 0
    first: list[int] = []
    if line_start and f.start.match(text):
        first.append(0)
    starts = itertools.chain(first, (m.start() + 1 for m in f.header_start.finditer(text)))
    for x in starts:
        if x < last:  # the previous match ended inside this run, at a line start: try from there
            x = last
            if not f.start.match(text, x):
                continue
        m = f.header.match(text, x)
        if m is not None:
            out.append(text[last:x])
            size += x - last
            if articles is not None and is_title(m.group()):
                articles.append(size)
            last = m.end()
            n += 1
    if not n:
        return text, 0
    out.append(text[last:])
    return f.empty.join(out), n


_OPEN = -1


def _try_at(t: AnyStr, x: int) -> int | None:
    """Where ``HEADER_RE.match(t, x)`` ends, for a line start ``x``, if more text could not change it; ``None`` when it
    fails either way; :data:`_OPEN` when the answer needs text beyond ``t``."""
    f = _form(t)
    n = len(t)
    a = f.ws_run.match(t, x).end()  # type: ignore[union-attr]
    if a == n:
        return _OPEN
    if t[a : a + 1] != f.eq:
        return None
    b = f.eq_run.match(t, a).end()  # type: ignore[union-attr]
    if b == n:
        return _OPEN
    if t[b : b + 1] != f.space:
        return None
    c = t.find(f.eq, b + 1)
    if c < 0:
        return _OPEN
    if c - 1 <= b + 1 or t[c - 1 : c] != f.space:
        return None
    d = f.eq_run.match(t, c).end()  # type: ignore[union-attr]
    e = f.ws_run.match(t, d).end()  # type: ignore[union-attr]
    if e == n:
        return _OPEN
    k = t.rfind(f.nl, d, e)
    return None if k < 0 else k + 1


def _decided(buf: AnyStr, line_start: bool, articles: list[int] | None = None) -> tuple[AnyStr, int, int]:
    """``(text, n, cut)``: ``buf[:cut]`` header-stripped (``n`` matches), ``cut`` the first line start whose match
    needs text beyond ``buf`` (``len(buf)`` if none); the rest can be stripped on its own. ``articles``: as for
    :func:`strip_block`."""
    f = _form(buf)
    n = len(buf)
    p = len(_rstrip(buf))  # line starts in the trailing whitespace wait for what follows
    if p == 0 and line_start:
        cut = 0
    else:
        k = buf.find(f.nl, p)
        cut = k + 1 if k >= 0 else n
    out: list[AnyStr] = []
    last = matches = size = 0
    starts: Iterable[int] = [0] if line_start and f.start.match(buf) else []
    starts = itertools.chain(starts, (m.start() + 1 for m in f.candidate.finditer(buf, 0, cut)))
    for x in starts:
        if x < last:
            x = last
            if not f.start.match(buf, x):
                continue
        if x >= cut:
            break
        end = _try_at(buf, x)
        if end == _OPEN:
            cut = x
            break
        if end is not None:
            out.append(buf[last:x])
            size += x - last
            if articles is not None and is_title(buf[x:end]):
                articles.append(size)
            last = end
            matches += 1
    out.append(buf[last:cut])
    return f.empty.join(out), matches, cut


def strip_headers(
    pieces: Iterable[AnyStr],
    block_chars: int = BLOCK_CHARS,
    *,
    name: str = "the text",
    max_pending: int = MAX_PENDING_CHARS,
    articles: list[int] | None = None,
) -> Iterator[tuple[AnyStr, int]]:
    """Stream ``HEADER_RE.sub("", "".join(pieces))`` as ``(text, headers_removed)`` pieces, in blocks of about
    ``block_chars``; ``UserError`` naming ``name`` as soon as more than ``max_pending`` characters of a header
    candidate are held undecided after a piece. Checked at every piece, so what is held is bounded exactly; a
    candidate that the same piece takes past ``max_pending`` and decides passes, so the longest that gets through
    is ``max_pending`` plus one piece (extract's pieces: at most ``PIECE_BYTES``). Exact to the character would mean
    deciding inside a piece, a rescan per piece for a bound that only has to be finite.
    ``articles``: where given, it holds, when each piece is yielded, the offsets in that piece where a
    ``= Title =`` line was removed (an article starts there; the list is emptied before each piece).
    Pieces of ``bytes``: each one valid UTF-8 on its own (no character cut in two; what is not UTF-8 has no str
    form to be equal to); ``block_chars``, ``max_pending`` and the offsets then count bytes."""
    buf = None
    line_start = True  # buf starts at a line start
    scan_at = block_chars
    for piece in pieces:
        buf = buf + piece if buf else piece
        s = _safe_cut(buf) if len(buf) >= block_chars else -1
        if s > 0:
            head, buf = buf[:s], buf[s:]
            _clear(articles)
            yield strip_block(head, line_start, articles)
            line_start, scan_at = True, block_chars
        # Past the bound, what is held is decided now, not at the next doubling: the bound is exact.
        if len(buf) >= scan_at or len(buf) > max_pending:
            _clear(articles)
            text, n, cut = _decided(buf, line_start, articles)
            if cut:
                yield text, n
                line_start, buf = buf[cut - 1 : cut] == _form(buf).nl, buf[cut:]
            if len(buf) > max_pending:
                raise UserError(
                    f"{name} has a line that starts like a `= Header =` line and runs on for more than "
                    f"{max_pending:,} {_form(buf).unit} without deciding; wikitext headers are short lines: "
                    "this is not the wikitext-103-raw-v1 text (check source_url)"
                )
            scan_at = max(block_chars, 2 * len(buf))
    if buf:
        _clear(articles)
        yield strip_block(buf, line_start, articles)


def _clear(articles: list[int] | None) -> None:
    if articles is not None:
        articles.clear()
