"""The chapter's header strip (``= Title =`` lines out of wikitext), streamed: :data:`HEADER_RE`, the chapter's
regex verbatim; :func:`strip_block`, one ``HEADER_RE.subn`` done faster; :func:`strip_headers`, the same over a
stream of text pieces, cut into blocks where cutting cannot change the result (:func:`_safe_cut`), so memory
stays at a few blocks (~4 Mi characters each) instead of a whole 540 MB split.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator

#: The chapter's header-strip regex, verbatim.
HEADER_RE = re.compile(r"^\s*=+ [^=]+ =+\s*$\n?", flags=re.MULTILINE)
BLOCK_CHARS = 4 << 20


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


def strip_block(text: str) -> tuple[str, int]:
    """``HEADER_RE.subn("", text)``, without trying the pattern at every position of the text.

    A match of ``^\\s*=+ [^=]+ =+\\s*$\\n?`` can only start at a line start followed by whitespace and then
    ``=``. Take such a run of whitespace ending at an ``=``: tried from any line start inside it, the pattern's
    ``\\s*`` can stop only at that ``=`` (everything before it is whitespace, nothing after it is reached
    otherwise), so every line start of the run matches, or fails, exactly like its first one. ``re.sub`` takes
    the leftmost match at or after the end of the previous one (which always ends at a line start), so trying
    the first eligible line start of each run, in order, with ``HEADER_RE.match`` on the whole text finds the
    same matches. The runs are found by ``\\n\\s*=`` (plus one at the very start), a scan the regex engine
    does at memchr speed; on wikitext that is ~4x faster than ``subn`` (``tests/tasks/test_corpus_extract.py``
    holds it equal on generated and real text)."""
    out: list[str] = []
    last = n = 0
    first: list[int] = []
    if _HEADER_START_RE.match(text):
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


def strip_headers(pieces: Iterable[str], block_chars: int = BLOCK_CHARS) -> Iterator[tuple[str, int]]:
    """Stream ``HEADER_RE.sub("", "".join(pieces))`` as ``(text, headers_removed)`` pieces.

    The text is buffered until it has ``block_chars`` characters, cut at the last safe point
    (:func:`_safe_cut`) and the part before it stripped on its own. Text without any safe point (which real
    wikitext never is) just grows the buffer.
    """
    buf = ""
    for piece in pieces:
        buf = buf + piece if buf else piece
        if len(buf) >= block_chars:
            s = _safe_cut(buf)
            if s > 0:
                head, buf = buf[:s], buf[s:]
                yield strip_block(head)
    if buf:
        yield strip_block(buf)
