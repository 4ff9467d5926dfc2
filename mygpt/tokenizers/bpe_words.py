"""The chapter's pre-tokeniser, vectorised: the words of a text as spans of a code-point array (:func:`word_spans`),
and a table of distinct words found by hash and always checked character by character (:class:`WordTable`;
docs/TOKENIZERS.md)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np

__all__ = [
    "PIECE_CHARS",
    "SAFE_CUT_RE",
    "WS_LIMIT",
    "HashIndex",
    "WordTable",
    "code_points",
    "count_words",
    "pieces",
    "word_hashes",
    "word_spans",
]

#: A safe cut: the position of a whitespace character that follows a non-whitespace character. Every word of
#: ``WORD_RE`` ends at one (or at the end of the text), so cutting there never changes the words on either side.
SAFE_CUT_RE = re.compile(r"(?<=\S)\s")
#: Text is handled in pieces of about this many characters (cut at safe points): bounded numpy temporaries.
PIECE_CHARS = 1 << 20

#: Every character Python calls whitespace is below U+3001 (the highest is U+3000 IDEOGRAPHIC SPACE; a test
#: checks all of Unicode), so a table of that size classifies any code point.
WS_LIMIT = 0x3001
_IS_WS = np.array([chr(c).isspace() for c in range(WS_LIMIT)] + [False], dtype=bool)

_U64 = np.uint64
_BASE = _U64(0x9E3779B97F4A7C15)  # odd, so invertible modulo 2**64
_BASE_INV = _U64(pow(int(_BASE), -1, 1 << 64))
_LEN_MIX = _U64(0xC2B2AE3D27D4EB4F)
_powers = (np.ones(1, dtype=np.uint64), np.ones(1, dtype=np.uint64))  # (B**i, B**-i) mod 2**64, grown on demand


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


def word_spans(cps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, lengths)`` of the words ``WORD_RE.findall`` finds in the text with code points ``cps``."""
    n = cps.size
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ws = _IS_WS[np.minimum(cps, WS_LIMIT)]
    starts = np.flatnonzero(ws[1:] & ~ws[:-1])
    starts += 1
    starts = np.concatenate((np.zeros(1, np.int64), starts))
    lens = np.diff(starts, append=n)
    return starts, lens


def _power_tables(n: int) -> tuple[np.ndarray, np.ndarray]:
    global _powers
    if _powers[0].size <= n:
        size = max(n + 1, 2 * _powers[0].size, 1 << 16)
        fwd = np.empty(size, np.uint64)
        inv = np.empty(size, np.uint64)
        fwd[0] = inv[0] = 1
        np.cumprod(np.full(size - 1, _BASE, dtype=np.uint64), out=fwd[1:])  # wraps modulo 2**64
        np.cumprod(np.full(size - 1, _BASE_INV, dtype=np.uint64), out=inv[1:])
        _powers = (fwd, inv)
    return _powers


def word_hashes(cps: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each word: ``sum((c_i + 1) * B**i)`` over its code points, plus its length, modulo 2**64.

    Computed for all words at once from prefix sums: the sum over ``[s, e)`` is ``(P[e] - P[s]) * B**-s``."""
    n = cps.size
    fwd, inv = _power_tables(n)
    prefix = np.zeros(n + 1, dtype=np.uint64)
    terms = cps.astype(np.uint64)
    terms += _U64(1)
    terms *= fwd[:n]
    np.cumsum(terms, out=prefix[1:])
    h = prefix[starts + lens]
    h -= prefix[starts]
    h *= inv[starts]
    h += lens.astype(np.uint64) * _LEN_MIX
    return h


def _mix(h: np.ndarray) -> np.ndarray:
    """murmur3's 64-bit finaliser: spreads every bit of ``h`` over the top bits (the index's home slots)."""
    h = h ^ (h >> _U64(33))
    h *= _U64(0xFF51AFD7ED558CCD)
    h ^= h >> _U64(33)
    h *= _U64(0xC4CEB9FE1A85EC53)
    h ^= h >> _U64(33)
    return h


class HashIndex:
    """uint64 hash -> int (>= 0): open addressing with linear probing in numpy arrays, at most half full."""

    def __init__(self, bits: int = 12) -> None:
        self._bits = bits
        self._keys = np.zeros(1 << bits, dtype=np.uint64)
        self._vals = np.full(1 << bits, -1, dtype=np.int64)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def _home(self, h: np.ndarray) -> np.ndarray:
        return (_mix(h) >> _U64(64 - self._bits)).astype(np.int64)

    def get(self, h: np.ndarray) -> np.ndarray:
        """The value of each hash, -1 where absent."""
        pos = self._home(h)
        v = self._vals[pos]
        out = np.where(self._keys[pos] == h, v, -1)  # an empty slot holds value -1 whatever its key
        todo = np.flatnonzero((out < 0) & (v >= 0))  # home slot taken by another key: probe on
        mask = (1 << self._bits) - 1
        pos = (pos[todo] + 1) & mask
        while todo.size:
            v = self._vals[pos]
            hit = (v >= 0) & (self._keys[pos] == h[todo])
            out[todo[hit]] = v[hit]
            go_on = (v >= 0) & ~hit
            todo, pos = todo[go_on], (pos[go_on] + 1) & mask
        return out

    def put(self, h: np.ndarray, vals: np.ndarray) -> None:
        """Insert distinct hashes that are not in the index yet."""
        if 2 * (self._n + h.size) > (1 << self._bits):
            self._grow(self._n + h.size)
        self._insert(h, vals)
        self._n += h.size

    def _insert(self, h: np.ndarray, vals: np.ndarray) -> None:
        todo = np.arange(h.size, dtype=np.int64)
        pos = self._home(h)
        mask = (1 << self._bits) - 1
        while todo.size:
            free = self._vals[pos] < 0
            cand, cpos = todo[free], pos[free]
            where, first = np.unique(cpos, return_index=True)  # one winner per free slot
            won = cand[first]
            self._keys[where] = h[won]
            self._vals[where] = vals[won]
            placed = np.zeros(h.size, dtype=bool)
            placed[won] = True
            left = ~placed[todo]
            todo, pos = todo[left], (pos[left] + 1) & mask

    def _grow(self, need: int) -> None:
        live = self._vals >= 0
        keys, vals = self._keys[live], self._vals[live]
        bits = self._bits
        while 2 * need > (1 << bits):
            bits += 1
        HashIndex.__init__(self, bits)
        self._insert(keys, vals)
        self._n = keys.size


class WordTable:
    """The distinct words seen so far: ``words[slot]``, found by hash and checked character by character.

    :meth:`slots` gives the slot of every word of a text, in order, adding the words it has not seen. ``spans`` cuts a
    text's code points into its words (``word_spans``, the chapter's; the byte-level BPE passes its pre-tokens')."""

    def __init__(self, spans=word_spans) -> None:
        self._spans = spans
        self.words: list[str] = []
        self._index = HashIndex()
        self._by_string: dict[str, int] = {}  # words whose hash another word in the table already has
        self._cps = np.zeros(1 << 16, dtype=np.uint32)  # slot -> code points at _cps[_cstart[slot]:][:_clen[slot]]
        self._cstart = np.zeros(1 << 10, dtype=np.int64)
        self._clen = np.zeros(1 << 10, dtype=np.int64)
        self._cused = 0

    def __len__(self) -> int:
        return len(self.words)

    def slots(
        self, text: str, cps: np.ndarray | None = None, spans: tuple[np.ndarray, np.ndarray] | None = None
    ) -> np.ndarray:
        """The slot of each word of ``text`` (``WORD_RE.findall`` order); new words get the next free slots.
        ``cps`` and ``spans``: the text's code points and its words' ``(starts, lengths)`` where the caller has
        them (default: found here, ``spans`` by the table's own rule)."""
        cps = code_points(text) if cps is None else cps
        starts, lens = self._spans(cps) if spans is None else spans
        if not starts.size:
            return starts
        h = word_hashes(cps, starts, lens)
        slots = self._index.get(h)
        missing = np.flatnonzero(slots < 0)
        if missing.size:
            self._resolve(text, cps, starts, lens, h, slots, missing)
        # Check every word against the word its slot holds: the words tile the text, so the slots' words put end
        # to end must give the text back, length by length and character by character.
        wrong = self._clen[slots] != lens
        ends = np.cumsum(lens)
        src = np.repeat(self._cstart[slots] - (ends - lens), lens)
        src += np.arange(cps.size, dtype=np.int64)
        np.clip(src, 0, self._cused - 1, out=src)
        differ = np.flatnonzero(self._cps[src] != cps)
        if differ.size:
            wrong[np.searchsorted(ends, differ, side="right")] = True
        for k in np.flatnonzero(wrong).tolist():  # a hash collision (rare): look the word up by its string
            w = text[starts[k] : starts[k] + lens[k]]
            s = self._by_string.get(w)
            if s is None:
                s = self._by_string[w] = int(self._append([w])[0])
            slots[k] = s
        return slots

    def _resolve(self, text, cps, starts, lens, h, slots, missing) -> None:
        """Slots for the words the index did not give (new words, or collisions): by hash, then checked."""
        uh, first, inverse = np.unique(h[missing], return_index=True, return_inverse=True)
        reps = missing[first]  # one occurrence per distinct hash
        words = [text[s : s + n] for s, n in zip(starts[reps].tolist(), lens[reps].tolist())]
        taken = self._index.get(uh) >= 0  # hash already used by a different word (a collision)
        if not taken.any():  # the usual case (a word in _by_string has its hash in the index)
            new = self._append(words)
            self._index.put(uh, new)
        else:
            new = np.empty(len(words), dtype=np.int64)
            fresh = []
            for i, w in enumerate(words):
                s = self._by_string.get(w)
                if s is None:
                    if taken[i]:
                        s = self._by_string[w] = int(self._append([w])[0])
                    else:
                        fresh.append(i)
                        continue
                new[i] = s
            if fresh:
                fi = np.array(fresh, dtype=np.int64)
                new[fi] = self._append([words[i] for i in fresh])
                self._index.put(uh[fi], new[fi])
        slots[missing] = new[inverse.reshape(-1)]

    def _append(self, words: list[str]) -> np.ndarray:
        first = len(self.words)
        self.words.extend(words)
        n = len(self.words)
        cps = code_points("".join(words))
        lens = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        if n > self._cstart.size:
            cap = max(n, 2 * self._cstart.size)
            self._cstart = np.resize(self._cstart, cap)
            self._clen = np.resize(self._clen, cap)
        end = self._cused + cps.size
        if end > self._cps.size:
            self._cps = np.resize(self._cps, max(end, 2 * self._cps.size))
        self._cps[self._cused : end] = cps
        self._cstart[first:n] = self._cused + np.cumsum(lens) - lens
        self._clen[first:n] = lens
        self._cused = end
        return np.arange(first, n, dtype=np.int64)


def count_words(text: str) -> dict[str, int]:
    """``Counter(WORD_RE.findall(text))`` as a dict (first-seen order), vectorised: one string per distinct word."""
    table = WordTable()
    counts = np.zeros(0, dtype=np.int64)
    for piece in pieces(text):
        slots = table.slots(piece)
        if slots.size:
            c = np.bincount(slots, minlength=len(table))
            c[: counts.size] += counts
            counts = c
    return dict(zip(table.words, counts.tolist()))
