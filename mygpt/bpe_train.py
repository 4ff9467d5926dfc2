"""The fast word-level BPE trainer behind :meth:`mygpt.bpe.BPETokenizer.from_corpus`.

It returns exactly the merges of the chapter's ``from_corpus`` (pre-tokenise with ``\\s*\\S+|\\s+``, count
adjacent pairs inside words weighted by word frequency, merge the winner left to right without overlap in
every word, stop when no pairs remain) under the fixed tie-break: highest count, then the
lexicographically greatest pair ``(a, b)``. Instead of recounting every pair of every word per merge it
keeps the counts up to date incrementally:

* the text becomes a table of *unique* words with frequencies (``Counter(re.findall(...))``); words of a
  single character have no pairs and are dropped;
* symbols are small ints (one per distinct symbol *string*, so two merges that produce the same string
  produce the same symbol, as with the chapter's strings); a pair is the int ``a * 2**32 + b``;
* ``counts[pair]`` is the frequency-weighted number of adjacent occurrences (overlapping ones included,
  as in the chapter: ``'aaa'`` counts ``('a','a')`` twice);
* an index pair -> words that contain it: built once with numpy (sorted word indices per initial pair)
  plus a set per pair for pairs created by merges; entries may be stale (a word that no longer holds the
  pair), which costs a wasted check but never a wrong result;
* a max-heap of ``(-count, inv(a), inv(b), pair)`` where ``inv(s)`` is a tuple of negated code points
  ending in ``1``, which orders strings in *reverse* lexicographic order, so the heap top is the highest
  count and, among ties, the greatest pair. Heap entries are upper bounds: a pair is re-pushed whenever its
  count grows, and a popped entry whose count has since shrunk is pushed back with the true count, so the
  first entry that matches its pair's current count is the winner.

A merge therefore touches only the words that contain the winning pair. Each touched word is rewritten
left to right without overlap (``list.index`` jumps to the next ``a``), and only the pairs around each
occurrence change: ``(a, b)`` loses the word's frequency, the left neighbour pair turns from
``(x, a)`` into ``(x', ab)`` (``x'`` is ``ab`` itself when the previous occurrence ended there, as in
``'aaaa'``), and the right neighbour pair from ``(b, y)`` into ``(ab, y)`` unless the next occurrence starts
at ``y``. The cyclic garbage collector is paused while training (it would otherwise rescan the many small
lists over and over, about a quarter of the run time, and find nothing to free).
"""

from __future__ import annotations

import collections
import contextlib
import gc
import heapq
import re

import numpy as np

__all__ = ["train_bpe", "train_from_word_counts", "count_words", "gc_paused"]

WORD_RE = re.compile(r"\s*\S+|\s+")
_SHIFT = 32
_LOW = (1 << _SHIFT) - 1


def count_words(text: str) -> collections.Counter:
    """Pre-tokenise ``text`` with the chapter's regex and count each unique word."""
    return collections.Counter(WORD_RE.findall(text))


def _inv_key(s: str) -> tuple:
    # Reverse lexicographic order: inv(s) < inv(t)  <=>  s > t.
    return tuple([-ord(c) for c in s]) + (1,)


def train_bpe(text: str, num_merges: int) -> tuple[list[str], list[tuple[str, str]]]:
    """Return ``(chars, merges)`` for ``text`` (see the module docstring)."""
    with gc_paused():
        word_counts = count_words(text)
        return train_from_word_counts(word_counts, num_merges)


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


def train_from_word_counts(
    word_counts: dict[str, int], num_merges: int
) -> tuple[list[str], list[tuple[str, str]]]:
    """The trainer proper, on a ``{word: frequency}`` table (the pre-tokenised corpus)."""
    chars = sorted(set("".join(word_counts)))
    if num_merges <= 0:
        return chars, []

    # --- symbols -----------------------------------------------------------------------------
    sym_str: list[str] = list(chars)  # symbol id -> string
    str_id: dict[str, int] = {c: i for i, c in enumerate(chars)}
    inv: list[tuple] = [_inv_key(c) for c in chars]

    # --- words with >= 2 characters, as symbol-id lists ----------------------------------------
    multi = [(w, f) for w, f in word_counts.items() if len(w) > 1]
    if not multi:
        return chars, []
    nw = len(multi)
    freqs = [f for _, f in multi]
    joined = "".join(w for w, _ in multi)
    cps = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    char_cps = np.array([ord(c) for c in chars], dtype=np.uint32)
    ids = np.searchsorted(char_cps, cps).astype(np.int64)  # chars are sorted by code point
    lens = np.fromiter((len(w) for w, _ in multi), dtype=np.int64, count=nw)
    ends = np.cumsum(lens)
    starts = ends - lens
    flat = ids.tolist()
    words: list[list[int]] = [flat[s:e] for s, e in zip(starts.tolist(), ends.tolist())]

    # --- initial pair counts and the pair -> words index (vectorised) ---------------------------
    word_of = np.repeat(np.arange(nw, dtype=np.int64), lens)
    same = word_of[:-1] == word_of[1:]
    pos = np.nonzero(same)[0]
    keys = (ids[pos] << _SHIFT) | ids[pos + 1]
    pair_word = word_of[pos]
    ukeys, inverse = np.unique(keys, return_inverse=True)
    weights = np.asarray(freqs, dtype=np.int64)[pair_word]
    sums = np.zeros(len(ukeys), dtype=np.int64)
    np.add.at(sums, inverse, weights)
    order = np.argsort(inverse, kind="stable")
    grouped_words = pair_word[order]
    group_ends = np.cumsum(np.bincount(inverse, minlength=len(ukeys)))
    group_starts = group_ends - np.bincount(inverse, minlength=len(ukeys))
    ukeys_l = ukeys.tolist()
    counts: dict[int, int] = dict(zip(ukeys_l, sums.tolist()))
    init_group: dict[int, tuple[int, int]] = dict(zip(ukeys_l, zip(group_starts.tolist(), group_ends.tolist())))
    where: dict[int, set[int]] = {}

    heap = [(-c, inv[k >> _SHIFT], inv[k & _LOW], k) for k, c in counts.items()]
    heapq.heapify(heap)
    heappush, heappop = heapq.heappush, heapq.heappop
    cget = counts.get

    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges:
        # --- pick the winner --------------------------------------------------------------------
        best = -1
        while heap:
            negc, _, _, k = heap[0]
            c = counts.get(k, 0)
            if c == -negc:
                best = k
                break
            heappop(heap)
            if 0 < c < -negc:
                heappush(heap, (-c, inv[k >> _SHIFT], inv[k & _LOW], k))
        if best < 0:
            break  # no pairs remain
        a = best >> _SHIFT
        b = best & _LOW
        sa, sb = sym_str[a], sym_str[b]
        merges.append((sa, sb))
        ms = sa + sb
        m = str_id.get(ms)
        if m is None:
            m = len(sym_str)
            sym_str.append(ms)
            str_id[ms] = m
            inv.append(_inv_key(ms))

        # --- the words that may contain (a, b) ----------------------------------------------------
        cand: set[int] = set()
        g = init_group.pop(best, None)
        if g is not None:
            cand.update(grouped_words[g[0] : g[1]].tolist())
        extra = where.pop(best, None)
        if extra:
            cand |= extra

        # --- rewrite them, updating the counts around each occurrence -------------------------------
        # For an occurrence of (a, b) at i (old positions): (a, b) loses f; the pair on its left changes
        # from (s[i-1], a) to (t[-1], m), where t[-1] is m itself if the previous occurrence ended at i;
        # the pair on its right changes from (b, s[i+2]) to (m, s[i+2]) unless s[i+2:i+4] is the next
        # occurrence (then that occurrence's left step accounts for it).
        grown: set[int] = set()
        for wi in cand:
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
                    x = t[-1]
                    k = (x << _SHIFT) | m
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

        for k in grown:
            c = counts[k]
            if c > 0:
                heappush(heap, (-c, inv[k >> _SHIFT], inv[k & _LOW], k))
        counts.pop(best, None)  # every occurrence was merged
    return chars, merges
