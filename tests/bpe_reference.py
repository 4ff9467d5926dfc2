"""A plain, obviously-correct re-statement of the chapter's BPE algorithms (tests and bench only).

``reference_train`` is the chapter's word-level ``from_corpus`` (Ch.28 §28.4) with one change: the
tie-break. The chapter picks ``max(pairs, key=pairs.get)`` (the first-inserted pair among equal counts);
here the winner is the highest count and, among equal counts, the lexicographically greatest pair
``(a, b)`` by Python tuple comparison. Everything else -- the pre-tokeniser ``\\s*\\S+|\\s+``, counting
every adjacent position (overlapping ones too: 'aaa' gives ('a','a') count 2), left-to-right
non-overlapping replacement, stopping when no pairs remain -- is the chapter's code, unoptimised.

``reference_train_text`` is the chapter's teaching ``from_text`` with the same tie-break,
``reference_encode`` the teaching ``encode`` (symbol strings) and ``reference_encode_word`` the
chapter's rank-based ``_encode_word`` (with the chapter's ``merge_ranks`` dict, where a repeated merge
keeps its last rank).
"""

from __future__ import annotations

import collections
import re

WORD_RE = re.compile(r"\s*\S+|\s+")


def _best(pairs: dict) -> tuple[str, str]:
    return max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]


def _merge(symbols: list[str], a: str, b: str) -> list[str]:
    merged = a + b
    out: list[str] = []
    i = 0
    n = len(symbols)
    while i < n:
        if i < n - 1 and symbols[i] == a and symbols[i + 1] == b:
            out.append(merged)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def reference_train(text: str, num_merges: int) -> tuple[list[str], list[tuple[str, str]]]:
    """The chapter's ``from_corpus`` loop, with the fixed tie-break; returns ``(chars, merges)``."""
    chars = sorted(set(text))
    word_freqs: collections.Counter = collections.Counter()
    for match in WORD_RE.finditer(text):
        word_freqs[match.group()] += 1
    word_symbols = {w: list(w) for w in word_freqs}
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs: collections.Counter = collections.Counter()
        for w, syms in word_symbols.items():
            if len(syms) < 2:
                continue
            f = word_freqs[w]
            for a, b in zip(syms, syms[1:]):
                pairs[(a, b)] += f
        if not pairs:
            break
        a, b = _best(pairs)
        merges.append((a, b))
        for w, syms in word_symbols.items():
            if len(syms) < 2 or a not in syms:  # the chapter's cheap precheck (changes nothing)
                continue
            word_symbols[w] = _merge(syms, a, b)
    return chars, merges


def reference_train_text(text: str, num_merges: int) -> tuple[list[str], list[tuple[str, str]]]:
    chars = sorted(set(text))
    symbols = list(text)
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs: collections.Counter = collections.Counter(zip(symbols, symbols[1:]))
        if not pairs:
            break
        a, b = _best(pairs)
        merges.append((a, b))
        symbols = _merge(symbols, a, b)
    return chars, merges


def reference_encode(merges: list[tuple[str, str]], text: str) -> list[str]:
    symbols = list(text)
    for a, b in merges:
        symbols = _merge(symbols, a, b)
    return symbols


def reference_encode_word(merges: list[tuple[str, str]], word: str) -> list[str]:
    ranks = {(a, b): i for i, (a, b) in enumerate(merges)}
    syms = list(word)
    while len(syms) > 1:
        best_rank = None
        best_pos = -1
        for i in range(len(syms) - 1):
            r = ranks.get((syms[i], syms[i + 1]))
            if r is not None and (best_rank is None or r < best_rank):
                best_rank, best_pos = r, i
        if best_rank is None:
            break
        a, b = syms[best_pos], syms[best_pos + 1]
        syms = syms[:best_pos] + _merge(syms[best_pos:], a, b)
    return syms


def reference_encode_corpus(merges: list[tuple[str, str]], text: str) -> list[str]:
    out: list[str] = []
    for w in WORD_RE.findall(text):
        out.extend(reference_encode_word(merges, w))
    return out


class ChapterEncoder:
    """The chapter's ``encode_corpus`` (per-word cache, Python list of ids, tensor at the end): bench baseline."""

    def __init__(self, chars: list[str], merges: list[tuple[str, str]]) -> None:
        vocab = list(chars) + [a + b for a, b in merges]
        self.stoi = {s: i for i, s in enumerate(vocab)}
        self.merge_ranks = {(a, b): i for i, (a, b) in enumerate(merges)}
        self._word_cache: dict[str, list[str]] = {}

    def _encode_word(self, word: str) -> list[str]:
        cached = self._word_cache.get(word)
        if cached is not None:
            return cached
        syms = list(word)
        if len(syms) < 2:
            self._word_cache[word] = syms
            return syms
        while True:
            best_rank = None
            best_pos = -1
            for i in range(len(syms) - 1):
                rank = self.merge_ranks.get((syms[i], syms[i + 1]))
                if rank is not None and (best_rank is None or rank < best_rank):
                    best_rank = rank
                    best_pos = i
            if best_rank is None:
                break
            a, b = syms[best_pos], syms[best_pos + 1]
            syms = syms[:best_pos] + _merge(syms[best_pos:], a, b)
        self._word_cache[word] = syms
        return syms

    def encode_corpus(self, text: str, unk_policy: str = "skip"):
        import torch

        ids: list[int] = []
        stoi = self.stoi
        for match in WORD_RE.finditer(text):
            for sym in self._encode_word(match.group()):
                tid = stoi.get(sym)
                if tid is not None:
                    ids.append(tid)
                elif unk_policy == "error":
                    raise KeyError(sym)
        return torch.tensor(ids, dtype=torch.long)
