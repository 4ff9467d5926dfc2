"""The fast word-level BPE trainer behind ``BPETokenizer.from_corpus``: the merges of
:func:`mygpt.tokenizers.bpe_reference.train`, with pair counts kept up to date incrementally over a table of unique
words, a pair -> words index and a max-heap of upper bounds (docs/TOKENIZERS.md)."""

from __future__ import annotations

import contextlib
import gc
import heapq

import numpy as np

from mygpt.tokenizers import bpe_words

__all__ = ["add_counts", "count_words", "gc_paused", "train_and_count_tokens", "train_bpe", "train_from_word_counts"]

_SHIFT = 32
_LOW = (1 << _SHIFT) - 1


def count_words(text: str) -> dict[str, int]:
    """Pre-tokenise ``text`` with the chapter's regex and count each unique word
    (``Counter(WORD_RE.findall(text))``)."""
    with gc_paused():
        return bpe_words.count_words(text)


def add_counts(total: dict[str, int], more: dict[str, int]) -> dict[str, int]:
    """Add the word counts ``more`` into ``total`` (in place; the reduce step of counting chunk by chunk)."""
    get = total.get
    for word, n in more.items():
        total[word] = get(word, 0) + n
    return total


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
    tokens = sum(n for w, n in word_counts.items() if len(w) == 1)  # one token each; not in the state
    tokens += sum(f * len(w) for w, f in zip(state.words, state.freqs))
    return chars, merges, tokens


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
    """Words as symbol-id lists, pair counts, the pair -> words index and the max-heap of pairs."""

    def __init__(self, chars: list[str], word_counts: dict[str, int]) -> None:
        self.sym_str: list[str] = list(chars)  # symbol id -> string
        self.str_id: dict[str, int] = {c: i for i, c in enumerate(chars)}
        self.inv: list[tuple] = [_inv_key(c) for c in chars]
        self.words: list[list[int]] = []
        self.freqs: list[int] = []
        self.counts: dict[int, int] = {}
        self.where: dict[int, set[int]] = {}  # pair -> words it was created in by a merge
        self._initial_words: dict[int, tuple[int, int]] = {}  # pair -> slice of _grouped_words
        self._grouped_words = np.zeros(0, dtype=np.int64)
        multi = [(w, f) for w, f in word_counts.items() if len(w) > 1]  # one character: no pairs
        if multi:
            self._index(chars, multi)
        self.heap = [(-c, self.inv[k >> _SHIFT], self.inv[k & _LOW], k) for k, c in self.counts.items()]
        heapq.heapify(self.heap)

    def _index(self, chars: list[str], multi: list[tuple[str, int]]) -> None:
        """Symbol-id words, initial pair counts and the pair -> words index, vectorised with numpy."""
        nw = len(multi)
        self.freqs = [f for _, f in multi]
        cps = np.frombuffer("".join(w for w, _ in multi).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        ids = np.searchsorted(np.array([ord(c) for c in chars], dtype=np.uint32), cps).astype(np.int64)
        lens = np.fromiter((len(w) for w, _ in multi), dtype=np.int64, count=nw)
        ends = np.cumsum(lens)
        flat = ids.tolist()
        self.words = [flat[s:e] for s, e in zip((ends - lens).tolist(), ends.tolist())]
        word_of = np.repeat(np.arange(nw, dtype=np.int64), lens)
        pos = np.nonzero(word_of[:-1] == word_of[1:])[0]  # adjacent positions inside one word
        keys = (ids[pos] << _SHIFT) | ids[pos + 1]
        pair_word = word_of[pos]
        ukeys, inverse = np.unique(keys, return_inverse=True)
        sums = np.zeros(len(ukeys), dtype=np.int64)
        np.add.at(sums, inverse, np.asarray(self.freqs, dtype=np.int64)[pair_word])
        self._grouped_words = pair_word[np.argsort(inverse, kind="stable")]
        sizes = np.bincount(inverse, minlength=len(ukeys))
        group_ends = np.cumsum(sizes)
        keys_l = ukeys.tolist()
        self.counts = dict(zip(keys_l, sums.tolist()))
        self._initial_words = dict(zip(keys_l, zip((group_ends - sizes).tolist(), group_ends.tolist())))

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

    def _words_with(self, best: int) -> set[int]:
        """The words that may hold pair ``best`` (a superset: stale entries cost a check, never a result)."""
        cand: set[int] = set()
        g = self._initial_words.pop(best, None)
        if g is not None:
            cand.update(self._grouped_words[g[0] : g[1]].tolist())
        extra = self.where.pop(best, None)
        if extra:
            cand |= extra
        return cand

    def merge(self, best: int, a: int, b: int) -> None:
        """Merge pair ``best`` = ``(a, b)`` left to right without overlap in every word that holds it, updating the
        counts of the pairs around each occurrence only."""
        m = self._symbol(self.sym_str[a] + self.sym_str[b])
        words, freqs, counts, where = self.words, self.freqs, self.counts, self.where
        cget = counts.get
        grown: set[int] = set()
        for wi in self._words_with(best):
            s = words[wi]
            n = len(s)
            last = n - 1
            pos = 0
            copied = 0
            t = None
            f = 0
            while True:
                try:
                    i = s.index(a, pos, last)
                except ValueError:
                    break
                if s[i + 1] != b:
                    pos = i + 1
                    continue
                if t is None:
                    t = s[:i]
                    f = freqs[wi]
                elif copied < i:
                    t.extend(s[copied:i])
                counts[best] -= f
                if i:
                    k = (s[i - 1] << _SHIFT) | a
                    counts[k] -= f
                    k = (t[-1] << _SHIFT) | m
                    counts[k] = cget(k, 0) + f
                    grown.add(k)
                    ws = where.get(k)
                    if ws is None:
                        where[k] = {wi}
                    else:
                        ws.add(wi)
                t.append(m)
                j = i + 2
                copied = pos = j
                if j < n:
                    y = s[j]
                    if not (y == a and j < last and s[j + 1] == b):
                        k = (b << _SHIFT) | y
                        counts[k] -= f
                        k = (m << _SHIFT) | y
                        counts[k] = cget(k, 0) + f
                        grown.add(k)
                        ws = where.get(k)
                        if ws is None:
                            where[k] = {wi}
                        else:
                            ws.add(wi)
            if t is not None:
                if copied < n:
                    t.extend(s[copied:])
                words[wi] = t
        inv, heap = self.inv, self.heap
        for k in grown:
            c = counts[k]
            if c > 0:
                heapq.heappush(heap, (-c, inv[k >> _SHIFT], inv[k & _LOW], k))
        counts.pop(best, None)  # every occurrence was merged
