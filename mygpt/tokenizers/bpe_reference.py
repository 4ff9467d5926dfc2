"""Byte-pair encoding, stated plainly: the specification the fast trainer and encoder are tested against.

This is the chapter's word-level BPE (§28.4) written to be read, not to be fast (in the spirit of minbpe's
``basic.py`` and tiktoken's ``_educational.py``). :mod:`mygpt.tokenizers.bpe_train` and
:mod:`mygpt.tokenizers.bpe_word_encoder` are the fast paths; the test suite proves them equal to these functions
on real text and on generated edge cases.

Vocabulary: the sorted distinct characters of the training text, then one symbol per merge (``a + b``).

1. **Pre-tokenise** (:func:`words`): ``\\s*\\S+|\\s+`` -- a whitespace run plus the non-whitespace run after it
   is one word (``" the"``), a trailing whitespace run is a word of its own. Merges never cross words.
2. **Count pairs** (:func:`count_pairs`): every adjacent pair of symbols inside every word, weighted by the
   word's frequency; overlapping pairs count, so ``"aaa"`` holds ``("a", "a")`` twice.
3. **Pick the winner** (:func:`best_pair`): the highest count; among equal counts the lexicographically
   greatest pair ``(a, b)`` (Python tuple comparison). The chapter's ``max(pairs, key=pairs.get)`` took the
   first-inserted pair instead; a fixed rule makes every trainer agree on every input.
4. **Merge** (:func:`merge`): replace ``a, b`` by ``a + b`` left to right without overlap
   (``"a a a a"`` with ``("a", "a")`` becomes ``"aa aa"``).
5. **Train** (:func:`train`): repeat 2-4 ``num_merges`` times, stopping early when no pair is left.
6. **Encode a word** (:func:`encode_word`): repeatedly take the adjacent pair with the lowest merge rank
   (the leftmost on ties) and merge it from there to the end of the word, left to right without overlap --
   the chapter's ``_encode_word``. A character outside the vocabulary stays as itself: it never forms a
   pair with a rank, so it is a barrier that nothing merges across. :func:`encode` runs every word of a text
   through it; the tokenizer then drops the unknown characters (or spells them as UTF-8 byte tokens).

:func:`train_text` and :func:`encode_in_merge_order` are the chapter-23 teaching versions: the whole text is
one symbol sequence (no words), and encoding applies the merges one after the other over the whole text.
"""

from __future__ import annotations

import collections
import re

__all__ = [
    "WORD_PATTERN",
    "WORD_RE",
    "best_pair",
    "count_pairs",
    "encode",
    "encode_in_merge_order",
    "encode_word",
    "merge",
    "train",
    "train_text",
    "words",
]

#: The pre-tokeniser, the one definition every BPE path uses.
WORD_PATTERN = r"\s*\S+|\s+"
WORD_RE = re.compile(WORD_PATTERN)

Pair = tuple[str, str]


def words(text: str) -> list[str]:
    """The text cut into words (step 1)."""
    return WORD_RE.findall(text)


def count_pairs(word_symbols: dict[str, list[str]], word_freqs: dict[str, int]) -> collections.Counter:
    """Frequency-weighted counts of the adjacent symbol pairs inside the words (step 2)."""
    pairs: collections.Counter = collections.Counter()
    for word, symbols in word_symbols.items():
        for pair in zip(symbols, symbols[1:]):
            pairs[pair] += word_freqs[word]
    return pairs


def best_pair(pairs: dict[Pair, int]) -> Pair:
    """The pair to merge next: highest count, then the lexicographically greatest pair (step 3)."""
    return max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]


def merge(symbols: list[str], a: str, b: str) -> list[str]:
    """Replace every adjacent ``a, b`` by ``a + b``, left to right, without overlap (step 4)."""
    out: list[str] = []
    i = 0
    while i < len(symbols):
        if i + 1 < len(symbols) and symbols[i] == a and symbols[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def train(text: str, num_merges: int) -> tuple[list[str], list[Pair]]:
    """Word-level BPE training (step 5): ``(chars, merges)``."""
    chars = sorted(set(text))
    word_freqs = collections.Counter(words(text))
    word_symbols = {word: list(word) for word in word_freqs}
    merges: list[Pair] = []
    for _ in range(num_merges):
        pairs = count_pairs(word_symbols, word_freqs)
        if not pairs:
            break
        a, b = best_pair(pairs)
        merges.append((a, b))
        word_symbols = {
            word: merge(symbols, a, b) if a in symbols else symbols  # no `a`: nothing to merge
            for word, symbols in word_symbols.items()
        }
    return chars, merges


def train_text(text: str, num_merges: int) -> tuple[list[str], list[Pair]]:
    """Chapter 23's teaching trainer: the whole text is one symbol sequence (no pre-tokenisation)."""
    chars = sorted(set(text))
    symbols = list(text)
    merges: list[Pair] = []
    for _ in range(num_merges):
        pairs = collections.Counter(zip(symbols, symbols[1:]))
        if not pairs:
            break
        a, b = best_pair(pairs)
        merges.append((a, b))
        symbols = merge(symbols, a, b)
    return chars, merges


def encode_word(word: str, ranks: dict[Pair, int]) -> list[str]:
    """One word's symbols under the merges ``ranks`` (pair -> rank, lower first) (step 6).

    ``ranks`` is ``{pair: i for i, pair in enumerate(merges)}``, so a merge listed twice keeps its later rank.
    """
    symbols = list(word)
    while len(symbols) > 1:
        ranked = [(ranks[pair], i) for i, pair in enumerate(zip(symbols, symbols[1:])) if pair in ranks]
        if not ranked:
            break
        _, i = min(ranked)
        symbols = symbols[:i] + merge(symbols[i:], symbols[i], symbols[i + 1])
    return symbols


def encode(text: str, merges: list[Pair]) -> list[str]:
    """The symbols of a text: every word through :func:`encode_word`, concatenated."""
    ranks = {pair: i for i, pair in enumerate(merges)}
    return [symbol for word in words(text) for symbol in encode_word(word, ranks)]


def encode_in_merge_order(text: str, merges: list[Pair]) -> list[str]:
    """Chapter 23's teaching encoder: apply each merge, in order, over the whole text."""
    symbols = list(text)
    for a, b in merges:
        if a in symbols:  # a cheap check first: without `a` the merge changes nothing
            symbols = merge(symbols, a, b)
    return symbols
