"""Two real tokenizers for the export's tests: one with unknown characters, one with byte fallback."""

from __future__ import annotations

import pytest

from mygpt.tokenizers.bpe import BPETokenizer


@pytest.fixture(scope="package")
def skip_tok(wikitext2_text):
    """Trained on a slice: the rest of WikiText-2 (and Shakespeare) holds characters it does not know."""
    return BPETokenizer.from_corpus(wikitext2_text[:100_000], 1000)


@pytest.fixture(scope="package")
def fallback_tok(shakespeare_text):
    return BPETokenizer.from_corpus(shakespeare_text[:100_000], 500, byte_fallback=True)
