"""The chapter's header strip (``= Title =`` lines out of wikitext), streamed in bounded memory whatever the line
length; cutting the text into blocks gives what one ``re.sub`` over the whole gives (docs/CORPUS.md, "The header
strip")."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator

from mygpt.errors import UserError

#: The chapter's header-strip regex, verbatim.
HEADER_RE = re.compile(r"^\s*=+ [^=]+ =+\s*$\n?", flags=re.MULTILINE)
BLOCK_CHARS = 4 << 20
#: The longest header candidate kept while undecided (a wikitext header is one short line).
MAX_PENDING_CHARS = 64 << 20


def _safe_cut(buf: str) -> int:
    """The last position ``s`` (just after a ``\\n``) where ``buf`` may be cut for header stripping; -1 if none.

    Safe: the line ending at ``s`` has a non-whitespace character, its last one is not ``=``, and the last ``=``
    before ``s`` does not lead its line (why that suffices: docs/CORPUS.md)."""
    nl = buf.rfind("\n")
    for _ in range(256):
        if nl < 0:
            return -1
        ls = buf.rfind("\n", 0, nl) + 1
        line = buf[ls:nl].rstrip()
        if line.strip() and line[-1] != "=":
            q = buf.rfind("=", 0, nl)
            if q < 0:
                return nl + 1
            r0 = q
            while r0 > 0 and buf[r0 - 1] == "=":
                r0 -= 1
            if buf[buf.rfind("\n", 0, r0) + 1 : r0].strip():
                return nl + 1
        nl = ls - 1
    return -1


_HEADER_START_RE = re.compile(r"\s*=")  # what HEADER_RE needs at a line start before anything else
_HEADER_CANDIDATE_RE = re.compile(r"\n\s*=")  # the same after a newline: found by a fast scan for "\n"


def is_title(header: str) -> bool:
    """Whether a removed header match is a level-1 ``= Title =`` line (a wikitext article's first line)."""
    body = header.lstrip()
    return body.startswith("= ")


def strip_block(text: str, line_start: bool = True, articles: list[int] | None = None) -> tuple[str, int]:
    """``HEADER_RE.subn("", text)``, trying the pattern only at the first line start of each ``\\n\\s*=`` run (the same
    matches, docs/CORPUS.md). ``line_start=False``: ``text`` continues a line (no match starts at its position 0).
    ``articles``: where given, the character offsets in the result where a ``= Title =`` match was removed are
    appended to it."""
    out: list[str] = []
    last = n = size = 0
    first: list[int] = []
    if line_start and _HEADER_START_RE.match(text):
        first.append(0)
    starts = itertools.chain(first, (m.start() + 1 for m in _HEADER_CANDIDATE_RE.finditer(text)))
    for x in starts:
        if x < last:  # the previous match ended inside this run, at a line start: try from there
            x = last
            if not _HEADER_START_RE.match(text, x):
                continue
        m = HEADER_RE.match(text, x)
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
    return "".join(out), n


_WS_RUN = re.compile(r"\s*")
_EQ_RUN = re.compile(r"=*")
_OPEN = -1


def _try_at(t: str, x: int) -> int | None:
    """Where ``HEADER_RE.match(t, x)`` ends, for a line start ``x``, if more text could not change it; ``None`` when it
    fails either way; :data:`_OPEN` when the answer needs text beyond ``t``."""
    n = len(t)
    a = _WS_RUN.match(t, x).end()  # type: ignore[union-attr]
    if a == n:
        return _OPEN
    if t[a] != "=":
        return None
    b = _EQ_RUN.match(t, a).end()  # type: ignore[union-attr]
    if b == n:
        return _OPEN
    if t[b] != " ":
        return None
    c = t.find("=", b + 1)
    if c < 0:
        return _OPEN
    if c - 1 <= b + 1 or t[c - 1] != " ":
        return None
    d = _EQ_RUN.match(t, c).end()  # type: ignore[union-attr]
    e = _WS_RUN.match(t, d).end()  # type: ignore[union-attr]
    if e == n:
        return _OPEN
    k = t.rfind("\n", d, e)
    return None if k < 0 else k + 1


def _decided(buf: str, line_start: bool, articles: list[int] | None = None) -> tuple[str, int, int]:
    """``(text, n, cut)``: ``buf[:cut]`` header-stripped (``n`` matches), ``cut`` the first line start whose match
    needs text beyond ``buf`` (``len(buf)`` if none); the rest can be stripped on its own. ``articles``: as for
    :func:`strip_block`."""
    n = len(buf)
    p = len(buf.rstrip())  # line starts in the trailing whitespace wait for what follows
    if p == 0 and line_start:
        cut = 0
    else:
        k = buf.find("\n", p)
        cut = k + 1 if k >= 0 else n
    out: list[str] = []
    last = matches = size = 0
    starts: Iterable[int] = [0] if line_start and _HEADER_START_RE.match(buf) else []
    starts = itertools.chain(starts, (m.start() + 1 for m in _HEADER_CANDIDATE_RE.finditer(buf, 0, cut)))
    for x in starts:
        if x < last:
            x = last
            if not _HEADER_START_RE.match(buf, x):
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
    return "".join(out), matches, cut


def strip_headers(
    pieces: Iterable[str],
    block_chars: int = BLOCK_CHARS,
    *,
    name: str = "the text",
    max_pending: int = MAX_PENDING_CHARS,
    articles: list[int] | None = None,
) -> Iterator[tuple[str, int]]:
    """Stream ``HEADER_RE.sub("", "".join(pieces))`` as ``(text, headers_removed)`` pieces, in blocks of about
    ``block_chars``; ``UserError`` naming ``name`` as soon as more than ``max_pending`` characters of a header
    candidate are held undecided after a piece. Checked at every piece, so what is held is bounded exactly; a
    candidate that the same piece takes past ``max_pending`` and decides passes, so the longest that gets through
    is ``max_pending`` plus one piece (extract's pieces: at most ``PIECE_BYTES``, 4 Mi characters). Exact to the
    character would mean deciding inside a piece, a rescan per piece for a bound that only has to be finite.
    ``articles``: where given, it holds, when each piece is yielded, the character offsets in that piece where a
    ``= Title =`` line was removed (an article starts there; the list is emptied before each piece)."""
    buf = ""
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
                line_start, buf = buf[cut - 1] == "\n", buf[cut:]
            if len(buf) > max_pending:
                raise UserError(
                    f"{name} has a line that starts like a `= Header =` line and runs on for more than "
                    f"{max_pending:,} characters without deciding; wikitext headers are short lines: "
                    "this is not the wikitext-103-raw-v1 text (check source_url)"
                )
            scan_at = max(block_chars, 2 * len(buf))
    if buf:
        _clear(articles)
        yield strip_block(buf, line_start, articles)


def _clear(articles: list[int] | None) -> None:
    if articles is not None:
        articles.clear()
