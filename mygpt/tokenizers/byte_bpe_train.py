"""The fast byte-level BPE trainer: the merges of :func:`mygpt.tokenizers.byte_bpe_reference.train`, fast.

Two phases. The pre-tokens are counted once (:mod:`mygpt.tokenizers.byte_bpe_pretokens`: distinct pre-tokens with
their counts, the text cut at the special tokens first). Then the word-level trainer of the chapter's BPE
(:mod:`mygpt.tokenizers.bpe_train`: incremental pair counts, an index of where each pair is and a max-heap with the
same tie rule) runs on the pre-tokens' UTF-8 bytes, each byte spelled as the Latin-1 character of the same number.
Why that is exact: Latin-1 maps bytes to characters one to one and keeps their order, so "the greatest pair of
strings" there is "the greatest pair of byte strings" here, and a merge of two strings is the merge of their bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

from mygpt.tokenizers.bpe_train import gc_paused, train_from_word_counts
from mygpt.tokenizers.byte_bpe_pretokens import count_pretokens
from mygpt.tokenizers.byte_bpe_reference import GPT2_PATTERN, split_specials

__all__ = ["count_text", "train_byte_bpe", "train_from_pretoken_counts"]


def count_text(text: str, specials: Sequence[str] = (), pattern: str = GPT2_PATTERN, workers: int = 1) -> dict:
    """``{pre-token: count}`` of ``text`` cut at the ``specials`` (which are left out: they are never learnt)."""
    if not any(s in text for s in specials):
        return count_pretokens([text], pattern, workers=workers)  # no copy of a text with no special in it
    ordinary = [piece for piece in split_specials(text, specials) if piece not in specials]
    return count_pretokens(ordinary, pattern, workers=workers)


def train_from_pretoken_counts(counts: dict[str, int], num_merges: int) -> list[tuple[bytes, bytes]]:
    """The merges, in training order, of a ``{pre-token: count}`` table."""
    with gc_paused():
        words = {tok if tok.isascii() else tok.encode("utf-8").decode("latin-1"): n for tok, n in counts.items()}
        _, merges = train_from_word_counts(words, num_merges)
    return [(a.encode("latin-1"), b.encode("latin-1")) for a, b in merges]


def train_byte_bpe(
    text: str, num_merges: int, specials: Sequence[str] = (), pattern: str = GPT2_PATTERN, workers: int = 1
) -> list[tuple[bytes, bytes]]:
    """The merges of ``text``: equal to the reference's ``train(text, num_merges, specials, pattern)``."""
    return train_from_pretoken_counts(count_text(text, specials, pattern, workers), num_merges)
