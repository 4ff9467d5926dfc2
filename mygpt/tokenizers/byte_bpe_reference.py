"""Byte-level BPE stated plainly (the GPT-2 / CS336 tokenizer): the specification the fast paths are tested against.

Written to be read, not to be fast, in minbpe's style. :mod:`mygpt.tokenizers.byte_bpe_train` (the trainer) and
Hugging Face ``tokenizers`` loading our ``tokenizer.json`` (the encoder, :mod:`mygpt.tokenizers.byte_bpe`) are the
fast paths; the test suite proves them equal to these functions on real text.

Vocabulary: id ``b`` is the single byte ``b`` (0..255), id ``256 + i`` is merge ``i`` (the concatenation of its two
byte strings), then the special tokens in the order given. ``vocab_size = 256 + merges + specials``. The 256 byte
symbols encode any text: nothing is ever out of vocabulary.

1. **Cut at special tokens** (:func:`split_specials`): in training the specials are removed and each piece between
   them is pre-tokenised on its own, so no merge crosses a special; they get their ids after training and are
   never learnt.
2. **Pre-tokenise** (:func:`pretokens`): the GPT-2 split pattern (or GPT-4's cl100k pattern) cuts a piece into
   pre-tokens (``" the"``, ``"'s"``, ``" 42"``, ``"\\n\\n"``); merges never cross a pre-token. Each pre-token is a
   sequence of single UTF-8 bytes.
3. **Count pairs**: every adjacent pair inside every pre-token, weighted by its count (overlaps count).
4. **Pick the winner**: the highest count; among equal counts the lexicographically greatest pair of byte strings
   (``max`` over ``(count, (a, b))`` with ``a`` and ``b`` as ``bytes``), as CS336's assignment states.
5. **Merge** it left to right without overlap in every pre-token; repeat 3-5 until ``num_merges`` (or no pair left).
6. **Encode** (:func:`encode`): specials (only those the caller allows) are cut out and given their ids; every
   pre-token of the rest repeatedly merges the adjacent pair with the lowest merge rank (all its occurrences, left
   to right). Text that merely contains ``<|endoftext|>`` is ordinary bytes unless that special is allowed, so a
   user cannot inject a document boundary.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence

import regex

__all__ = [
    "GPT2_PATTERN",
    "GPT4_PATTERN",
    "PATTERNS",
    "best_pair",
    "decode",
    "encode",
    "encode_pretoken",
    "pretokens",
    "split_specials",
    "train",
    "vocab",
]

#: GPT-2's pre-tokeniser (``encoder.py`` in openai/gpt-2, with the contractions grouped).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
#: GPT-4's ``cl100k_base`` pre-tokeniser (tiktoken).
GPT4_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
)
#: The split patterns by name (the CLI's ``--pattern``).
PATTERNS = {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN}

Pair = tuple[bytes, bytes]


def split_specials(text: str, specials: Iterable[str]) -> list[str]:
    """``text`` cut at every occurrence of the ``specials``, the specials kept as pieces of their own (the longest
    special wins where two start at one place); no specials: ``[text]``."""
    specials = sorted(set(specials), key=lambda s: (-len(s), s))
    if not specials:
        return [text]
    cut = "(" + "|".join(regex.escape(s) for s in specials) + ")"
    return [piece for piece in regex.split(cut, text) if piece]


def pretokens(text: str, pattern: str = GPT2_PATTERN) -> list[str]:
    """The pre-tokens of ``text`` under ``pattern`` (step 2)."""
    return regex.findall(pattern, text)


def best_pair(pairs: dict[Pair, int]) -> Pair:
    """The pair to merge next: highest count, then the lexicographically greatest pair of byte strings (step 4)."""
    return max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]


def _merge(symbols: tuple[bytes, ...], pair: Pair) -> tuple[bytes, ...]:
    out: list[bytes] = []
    i = 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            out.append(pair[0] + pair[1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return tuple(out)


def train(text: str, num_merges: int, specials: Sequence[str] = (), pattern: str = GPT2_PATTERN) -> list[Pair]:
    """The merges (pairs of byte strings, in training order) of ``text`` (steps 1-5)."""
    counts: collections.Counter = collections.Counter()
    for piece in split_specials(text, specials):
        if piece in specials:
            continue
        for tok in pretokens(piece, pattern):
            counts[tuple(bytes([b]) for b in tok.encode("utf-8"))] += 1
    merges: list[Pair] = []
    while len(merges) < num_merges:
        pairs: collections.Counter = collections.Counter()
        for symbols, n in counts.items():
            for pair in zip(symbols, symbols[1:]):
                pairs[pair] += n
        if not pairs:
            break
        pair = best_pair(pairs)
        merges.append(pair)
        merged: collections.Counter = collections.Counter()
        for symbols, n in counts.items():
            merged[_merge(symbols, pair)] += n
        counts = merged
    return merges


def vocab(merges: Sequence[Pair], specials: Sequence[str] = ()) -> dict[int, bytes]:
    """Id -> bytes: the 256 bytes, the merges, the specials (UTF-8)."""
    table = {b: bytes([b]) for b in range(256)}
    for i, (a, b) in enumerate(merges):
        table[256 + i] = a + b
    for j, s in enumerate(specials):
        table[256 + len(merges) + j] = s.encode("utf-8")
    return table


def encode_pretoken(token: bytes, ranks: dict[Pair, int]) -> list[bytes]:
    """``token``'s symbols after merging, lowest rank first, every occurrence of that pair left to right."""
    symbols = tuple(bytes([b]) for b in token)
    while len(symbols) > 1:
        ranked = [ranks[p] for p in zip(symbols, symbols[1:]) if p in ranks]
        if not ranked:
            break
        symbols = _merge(symbols, next(p for p, r in ranks.items() if r == min(ranked)))
    return list(symbols)


def encode(
    text: str,
    merges: Sequence[Pair],
    specials: Sequence[str] = (),
    allowed_special: bool = False,
    pattern: str = GPT2_PATTERN,
) -> list[int]:
    """The ids of ``text`` (step 6). A byte string made by two merges gets the first one's id."""
    ranks = {pair: i for i, pair in enumerate(merges)}
    ids: dict[bytes, int] = {}
    for i, s in vocab(merges).items():
        ids.setdefault(s, i)
    special_ids = {s: 256 + len(merges) + j for j, s in enumerate(specials)}
    out: list[int] = []
    for piece in split_specials(text, specials if allowed_special else ()):
        if piece in special_ids and allowed_special:
            out.append(special_ids[piece])
            continue
        for tok in pretokens(piece, pattern):
            out.extend(ids[s] for s in encode_pretoken(tok.encode("utf-8"), ranks))
    return out


def decode(ids: Iterable[int], merges: Sequence[Pair], specials: Sequence[str] = ()) -> str:
    """The text of ``ids``; bytes that are not valid UTF-8 become U+FFFD."""
    table = vocab(merges, specials)
    return b"".join(table[i] for i in ids).decode("utf-8", errors="replace")
