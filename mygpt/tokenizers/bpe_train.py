"""The fast word-level BPE trainer behind ``BPETokenizer.from_corpus``: the merges of
:func:`mygpt.tokenizers.bpe_reference.train`, with pair counts kept up to date incrementally over the unique words
held as one linked numpy array of symbols, an index of where each pair may be and a max-heap of upper bounds; each
merge is applied to all its occurrences at once with numpy, so the Python work per merge is per neighbouring symbol,
not per occurrence (docs/TOKENIZERS.md)."""

from __future__ import annotations

import contextlib
import gc
import heapq

import numpy as np

from mygpt.tokenizers import bpe_bytes
from mygpt.tokenizers.bpe_bytes import add_counts

__all__ = ["add_counts", "count_words", "gc_paused", "train_and_count_tokens", "train_bpe", "train_from_word_counts"]

_SHIFT = 32
_LOW = (1 << _SHIFT) - 1


def count_words(text: str) -> dict[str, int]:
    """Pre-tokenise ``text`` with the chapter's regex and count each unique word
    (``Counter(WORD_RE.findall(text))``)."""
    with gc_paused():
        return bpe_bytes.count_words(text)


def train_bpe(text: str, num_merges: int) -> tuple[list[str], list[tuple[str, str]]]:
    """Return ``(chars, merges)`` for ``text``: :func:`mygpt.tokenizers.bpe_reference.train`, fast."""
    with gc_paused():
        return train_from_word_counts(count_words(text), num_merges)


def train_from_word_counts(word_counts: dict[str, int], num_merges: int) -> tuple[list[str], list[tuple[str, str]]]:
    """The trainer on a ``{word: frequency}`` table (the pre-tokenised corpus): ``(chars, merges)``."""
    chars, merges, _ = _train(word_counts, num_merges)
    return chars, merges


def train_and_count_tokens(
    word_counts: dict[str, int], num_merges: int
) -> tuple[list[str], list[tuple[str, str]], int | None]:
    """Like :func:`train_from_word_counts`, plus how many tokens ``encode_corpus`` gives for the counted text, read off
    the trainer's final state; ``None`` when two merges make one string and the caller must encode (why:
    docs/TOKENIZERS.md)."""
    chars, merges, state = _train(word_counts, num_merges)
    made = [a + b for a, b in merges]
    if len(set(made)) != len(made):
        return chars, merges, None
    if state is None:  # no merges: one token per character
        return chars, merges, sum(n * len(w) for w, n in word_counts.items())
    return chars, merges, state.tokens()


def _train(word_counts: dict[str, int], num_merges: int):
    chars = sorted(set("".join(word_counts)))
    if num_merges <= 0:
        return chars, [], None
    state = _PairState(chars, word_counts)
    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges:
        best = state.pop_best()  # step 3: the most frequent pair (greatest among ties)
        if best < 0:
            break  # no pairs remain
        a, b = best >> _SHIFT, best & _LOW
        merges.append((state.sym_str[a], state.sym_str[b]))
        state.merge(best, a, b)  # step 4, in the words that hold the pair, with the counts kept current
    return chars, merges, state


@contextlib.contextmanager
def gc_paused():
    """Pause the cyclic garbage collector (the trainer allocates many small, acyclic lists; the
    collector's passes over them cost ~25% of the run time and free nothing)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _inv_key(s: str) -> tuple:
    # Reverse lexicographic order: inv(s) < inv(t)  <=>  s > t.
    return tuple([-ord(c) for c in s]) + (1,)


class _PairState:
    """The distinct words as one linked array of symbol positions, the pair counts, where each pair may be found,
    and the max-heap of pairs.

    Position ``p`` holds symbol ``sym[p]`` (``-1`` once merged away) of a word of frequency ``freq[p]``; ``nxt[p]``
    and ``prv[p]`` are its neighbours in the word (``-1`` past either end, and index ``-1`` is a sentinel whose symbol
    is ``-1``, so a missing neighbour never matches). A pair lives at the position of its left symbol."""

    def __init__(self, chars: list[str], word_counts: dict[str, int]) -> None:
        self.sym_str: list[str] = list(chars)  # symbol id -> string
        self.str_id: dict[str, int] = {c: i for i, c in enumerate(chars)}
        self.inv: list[tuple] = [_inv_key(c) for c in chars]
        self.single_tokens = sum(n for w, n in word_counts.items() if len(w) == 1)  # no pairs: not in the arrays
        multi = [(w, f) for w, f in word_counts.items() if len(w) > 1]
        cps = np.frombuffer("".join(w for w, _ in multi).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        n = len(cps)
        lens = np.fromiter((len(w) for w, _ in multi), dtype=np.int64, count=len(multi))
        self.sym = np.full(n + 1, -1, dtype=np.int64)
        self.sym[:n] = np.searchsorted(np.array([ord(c) for c in chars], dtype=np.uint32), cps)
        self.freq = np.zeros(n + 1, dtype=np.int64)
        self.freq[:n] = np.repeat(np.fromiter((f for _, f in multi), dtype=np.int64, count=len(multi)), lens)
        last = np.cumsum(lens) - 1  # each word's last position
        self.nxt = np.arange(1, n + 2, dtype=np.int64)
        self.nxt[last] = -1
        self.nxt[n] = -1
        self.prv = np.arange(-1, n, dtype=np.int64)
        self.prv[last + 1] = -1  # each word's first position (and the sentinel)
        self.occ = np.zeros(n + 1, dtype=bool)  # scratch: the occurrences of the merge being applied
        # Where a pair may be: the initial pairs' positions grouped by pair; then, per symbol m made by merges,
        # right[m] (positions holding m: pairs (m, y)) and left[m] (their left neighbours: pairs (x, m)). Every
        # pair was there from the start or was made beside a merge, so these hold all of its positions (and stale
        # ones, which a check drops).
        self.right: dict[int, list[np.ndarray]] = {}
        self.left: dict[int, list[np.ndarray]] = {}
        pos = np.flatnonzero(self.nxt[:n] >= 0)
        keys = (self.sym[pos] << _SHIFT) | self.sym[pos + 1]
        order = np.argsort(keys, kind="stable")  # by pair, then by position
        keys = keys[order]
        self._grouped = pos[order]
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if n else np.zeros(0, dtype=np.int64)
        ukeys = keys[starts].tolist()
        sums = np.add.reduceat(self.freq[self._grouped], starts).tolist() if len(starts) else []
        self.counts: dict[int, int] = dict(zip(ukeys, sums))
        self._initial = dict(zip(ukeys, zip(starts.tolist(), np.r_[starts[1:], len(keys)].tolist())))
        self.heap = [(-c, self.inv[k >> _SHIFT], self.inv[k & _LOW], k) for k, c in self.counts.items()]
        heapq.heapify(self.heap)

    def tokens(self) -> int:
        """How many symbols the counted text is now: every live position once per occurrence of its word."""
        return self.single_tokens + int(self.freq[:-1][self.sym[:-1] >= 0].sum())

    def pop_best(self) -> int:
        """The pair with the highest count (the greatest among ties), or -1; a stale heap entry is pushed back."""
        heap, counts, inv = self.heap, self.counts, self.inv
        while heap:
            negc, _, _, k = heap[0]
            c = counts.get(k, 0)
            if c == -negc:
                return k
            heapq.heappop(heap)
            if 0 < c < -negc:
                heapq.heappush(heap, (-c, inv[k >> _SHIFT], inv[k & _LOW], k))
        return -1

    def _symbol(self, s: str) -> int:
        """The id of symbol string ``s`` (new ids for new strings; equal strings are one symbol)."""
        m = self.str_id.get(s)
        if m is None:
            m = len(self.sym_str)
            self.sym_str.append(s)
            self.str_id[s] = m
            self.inv.append(_inv_key(s))
        return m

    def _live(self, table: dict[int, list[np.ndarray]], s: int, live) -> list[np.ndarray]:
        """``table[s]`` cut down to the positions ``live`` keeps (they never come back: a position's symbol only
        grows), as one array."""
        arrays = table.get(s)
        if not arrays:
            return []
        arr = arrays[0] if len(arrays) == 1 else np.unique(np.concatenate(arrays))
        arr = arr[live(arr)]
        table[s] = [arr]
        return [arr]

    def _occurrences(self, best: int, a: int, b: int) -> np.ndarray:
        """The positions where ``(a, b)`` is merged: every occurrence, left to right without overlap."""
        sym, nxt = self.sym, self.nxt
        parts = self._live(self.right, a, lambda p: sym[p] == a)
        parts += self._live(self.left, b, lambda p: sym[nxt[p]] == b)
        g = self._initial.pop(best, None)
        if g is not None:
            parts.append(self._grouped[g[0] : g[1]])
        if not parts:
            return np.zeros(0, dtype=np.int64)
        cand = parts[0] if len(parts) == 1 else np.concatenate(parts)
        cand = cand[(sym[cand] == a) & (sym[nxt[cand]] == b)]
        if len(parts) > 1:
            cand = np.unique(cand)  # a pair can be listed twice (made by merge a, then remade by merge b)
        if a == b and len(cand) > 1:  # runs of a: merge the 1st, 3rd, ... pair of each run
            chained = np.r_[False, self.prv[cand[1:]] == cand[:-1]]
            i = np.arange(len(cand))
            run_start = np.maximum.accumulate(np.where(chained, 0, i))
            cand = cand[(i - run_start) % 2 == 0]
        return cand

    def merge(self, best: int, a: int, b: int) -> None:
        """Merge pair ``best`` = ``(a, b)`` left to right without overlap in every word that holds it, updating the
        counts of the pairs around each occurrence only: ``(x, a)`` becomes ``(x', ab)`` (``x'`` is ``ab`` where the
        previous occurrence ended at ``x``) and ``(b, y)`` becomes ``(ab, y)`` unless an occurrence starts at ``y``."""
        m = self._symbol(self.sym_str[a] + self.sym_str[b])
        sym, nxt, prv, occ = self.sym, self.nxt, self.prv, self.occ
        p = self._occurrences(best, a, b)
        q = nxt[p]
        r = nxt[q]
        f = self.freq[p]
        occ[p] = True
        has_l = prv[p] >= 0
        has_r = (r >= 0) & ~occ[r]  # a next occurrence right after takes (b, y) as its own left pair
        occ[p] = False
        f_l, f_r = f[has_l], f[has_r]
        x_gone, y = sym[prv[p][has_l]], sym[r[has_r]]
        sym[p] = m
        sym[q] = -1
        nxt[p] = r
        nxt[q] = -1
        prv[q] = -1
        prv[r[r >= 0]] = p[r >= 0]
        left = prv[p][has_l]  # after the relinking: the previous occurrence's position where it was adjacent
        x_made = sym[left]
        self.right.setdefault(m, []).append(p[has_r])
        self.left.setdefault(m, []).append(left)
        nsym = len(self.sym_str)
        made = []
        for ids, weights, key, sign in (
            (x_gone, f_l, lambda ids: (ids << _SHIFT) | a, -1),
            (y, f_r, lambda ids: (b << _SHIFT) | ids, -1),
            (x_made, f_l, lambda ids: (ids << _SHIFT) | m, 1),
            (y, f_r, lambda ids: (m << _SHIFT) | ids, 1),
        ):
            if len(ids):
                sums = np.bincount(ids, weights=weights, minlength=nsym)  # one pair per neighbour symbol
                nz = np.flatnonzero(sums)
                keys = key(nz).tolist()
                self._add(keys, (sums[nz] * sign).astype(np.int64).tolist())
                if sign > 0:
                    made += keys
        counts, inv, heap = self.counts, self.inv, self.heap
        for k in made:  # pairs that grew: pushed with their count (no pair both grows and shrinks in one merge)
            heapq.heappush(heap, (-counts[k], inv[k >> _SHIFT], inv[k & _LOW], k))
        counts.pop(best, None)  # every occurrence was merged

    def _add(self, keys: list[int], deltas: list[int]) -> None:
        counts = self.counts
        get = counts.get
        for k, d in zip(keys, deltas):
            c = get(k, 0) + d
            if c:
                counts[k] = c
            else:
                del counts[k]
