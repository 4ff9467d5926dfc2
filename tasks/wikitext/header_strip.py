"""The chapter's header strip (``= Title =`` lines out of wikitext), streamed: :data:`HEADER_RE`, the chapter's
regex verbatim; :func:`strip_block`, one ``HEADER_RE.subn`` done faster; :func:`strip_headers`, the same over a
stream of text pieces, cut into blocks where cutting cannot change the result (:func:`_safe_cut`), so memory
stays at a few blocks (~4 Mi characters each) instead of a whole 540 MB split. Text with no such cut (a line of
hundreds of MB with no newline, issue 21 item 3) is cut where every match that could start before the cut is
already decided (:func:`_decided`), so memory stays bounded whatever the line length; only a header *candidate*
that stays undecided past :data:`MAX_PENDING_CHARS` (``= x`` followed by that much text with no ``=``) is refused.
"""

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

    ``buf`` starts at the start of the text or at an earlier safe cut. ``s`` is safe when, with line A the
    line that ends at ``s``:

    1. line A has a non-whitespace character, and
    2. its last non-whitespace character is not ``=``, and
    3. the last ``=`` before ``s`` is not part of a run of ``=`` that is the first non-whitespace thing on
       its line (no ``=`` at all in ``buf`` before ``s`` is fine: the earlier cut satisfied 3 already).

    Why that suffices: a match (or failed try) of ``^\\s*=+ [^=]+ =+\\s*$\\n?`` that starts before ``s``
    starts at a line start; its leading ``\\s*`` stops at line A's non-whitespace character at the latest
    (1); its first ``=+`` is a line-leading run, so its ``[^=]+`` stops at a later ``=`` that is still
    before ``s`` (3); the trailing ``=+\\s*`` stops at a non-whitespace character before ``s`` (2). So no
    try starting before ``s`` looks at ``s`` or beyond, and every try starting at or after ``s`` sees the
    same text either way (``^`` holds at ``s``, which follows a ``\\n``): cutting at ``s`` and running
    ``re.sub`` on both sides gives the same result as one ``re.sub``.
    """
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


def strip_block(text: str, line_start: bool = True) -> tuple[str, int]:
    """``HEADER_RE.subn("", text)``, without trying the pattern at every position of the text.

    A match of ``^\\s*=+ [^=]+ =+\\s*$\\n?`` can only start at a line start followed by whitespace and then
    ``=``. Take such a run of whitespace ending at an ``=``: tried from any line start inside it, the pattern's
    ``\\s*`` can stop only at that ``=`` (everything before it is whitespace, nothing after it is reached
    otherwise), so every line start of the run matches, or fails, exactly like its first one. ``re.sub`` takes
    the leftmost match at or after the end of the previous one (which always ends at a line start), so trying
    the first eligible line start of each run, in order, with ``HEADER_RE.match`` on the whole text finds the
    same matches. The runs are found by ``\\n\\s*=`` (plus one at the very start), a scan the regex engine
    does at memchr speed; on wikitext that is ~4x faster than ``subn`` (``tests/tasks/test_corpus_extract.py``
    holds it equal on generated and real text). ``line_start=False``: ``text`` continues a line (no match
    starts at its position 0)."""
    out: list[str] = []
    last = n = 0
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
    """Where ``HEADER_RE.match(t, x)`` ends, for a line start ``x``, if more text after ``t`` could not change
    it; ``None`` when it fails either way; :data:`_OPEN` when the answer needs text beyond ``t``.

    The pattern backtracks only in one place: ``\\s*`` is greedy up to the first non-whitespace (which must be
    ``=``), ``=+`` up to the first other character (which must be a space), ``[^=]+`` up to the next ``=``
    (the character before it must be a space, and not the one just matched), ``=+`` again, then ``\\s*$``
    backs off from the first non-whitespace to the last ``\\n`` before it (the match fails if there is none).
    """
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


def _decided(buf: str, line_start: bool) -> tuple[str, int, int]:
    """``(text, n, cut)``: ``buf[:cut]`` header-stripped (``n`` matches), where ``cut`` is the first line start
    whose match needs text beyond ``buf`` (``len(buf)`` if none). Every match that starts before ``cut`` is
    decided within ``buf`` and ends at or before ``cut``, so the rest can be stripped on its own, as text that
    starts at a line start when ``buf[cut - 1]`` is a newline (or ``cut`` is 0 and ``buf`` did)."""
    n = len(buf)
    p = len(buf.rstrip())  # line starts in the trailing whitespace wait for what follows
    if p == 0 and line_start:
        cut = 0
    else:
        k = buf.find("\n", p)
        cut = k + 1 if k >= 0 else n
    out: list[str] = []
    last = matches = 0
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
) -> Iterator[tuple[str, int]]:
    """Stream ``HEADER_RE.sub("", "".join(pieces))`` as ``(text, headers_removed)`` pieces.

    The text is buffered until it has ``block_chars`` characters, cut at the last safe point
    (:func:`_safe_cut`) and the part before it stripped on its own. Text without any safe point (a very long
    line) is cut after what is already decided (:func:`_decided`); ``UserError`` naming ``name`` when a header
    candidate stays undecided for more than ``max_pending`` characters.
    """
    buf = ""
    line_start = True  # buf starts at a line start
    scan_at = block_chars
    for piece in pieces:
        buf = buf + piece if buf else piece
        if len(buf) >= block_chars:
            s = _safe_cut(buf)
            if s > 0:
                head, buf = buf[:s], buf[s:]
                yield strip_block(head, line_start)
                line_start, scan_at = True, block_chars
            elif len(buf) >= scan_at:
                text, n, cut = _decided(buf, line_start)
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
        yield strip_block(buf, line_start)
