"""The chapter's pre-tokeniser's safe cuts: a text in pieces that never cut a word, and its code points."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np

__all__ = ["PIECE_CHARS", "SAFE_CUT_RE", "WS_LIMIT", "code_points", "pieces"]

#: A safe cut: the position of a whitespace character that follows a non-whitespace character. Every word of
#: ``WORD_RE`` ends at one (or at the end of the text), so cutting there never changes the words on either side.
SAFE_CUT_RE = re.compile(r"(?<=\S)\s")
#: Text is handled in pieces of about this many characters (cut at safe points): bounded numpy temporaries.
PIECE_CHARS = 1 << 20

#: Every character Python calls whitespace is below U+3001 (the highest is U+3000 IDEOGRAPHIC SPACE; a test
#: checks all of Unicode), so a table of that size classifies any code point.
WS_LIMIT = 0x3001


def pieces(text: str, size: int = PIECE_CHARS) -> Iterator[str]:
    """``text`` in pieces of about ``size`` characters, cut at safe points (a piece without one runs on)."""
    n = len(text)
    start = 0
    while start < n:
        end = n
        if n - start > size:
            m = SAFE_CUT_RE.search(text, start + size)
            if m is not None:
                end = m.start()
        yield text[start:end] if (start or end < n) else text
        start = end


def code_points(text: str) -> np.ndarray:
    """``text`` as a uint32 array of code points (lone surrogates included)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
