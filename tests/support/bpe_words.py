"""The chapter BPE's fast paths in the shapes the tests compare with the plain ones: a file chunk by chunk, a word's
symbols as strings (``bpe_reference.encode_word``'s)."""

from __future__ import annotations

import numpy as np

from mygpt.tokenizers.bpe_chunks import chunk_bounds, encode_chunk


def iter_encode_file(tok, path, chunk_bytes: int = 8 << 20, unk_policy: str = "skip"):
    """Every chunk of the file encoded in order, as the shards stage's workers do:
    ``(index, start, end, ids, stats)``."""
    for idx, start, end in chunk_bounds(path, chunk_bytes):
        yield idx, start, end, *encode_chunk(tok, path, start, end, unk_policy)


def fast_word_symbols(tok, words: list[str]) -> list[list[str]]:
    """Each word's symbols from ``WordEncoder.batch_symbol_ids`` (all the words in one batch), as strings; an unknown
    character stays itself."""
    flat, lens = tok._fast_encoder().batch_symbol_ids(list(words))
    ends = np.cumsum(lens).tolist()
    ids = flat.tolist()
    symbols = [tok.vocab[i] if i >= 0 else chr(-1 - i) for i in ids]
    return [symbols[e - n : e] for e, n in zip(ends, lens.tolist())]
