"""Property tests: the fast trainer/encoder agree exactly with the plain reference on any input."""

from __future__ import annotations

import os
import tempfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mygpt.tokenizers import bpe_reference as ref
from mygpt.tokenizers.bpe import BPETokenizer
from tests.support.bpe_words import fast_word_symbols, iter_encode_file


def reference_train(text, n):
    return ref.train(text, n)


def reference_train_text(text, n):
    return ref.train_text(text, n)


def reference_encode_corpus(merges, text):
    return ref.encode(text, merges)


def reference_encode_word(merges, word):
    return ref.encode_word(word, {pair: i for i, pair in enumerate(merges)})


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Small alphabets provoke ties, repeats ('aaaa'), overlapping pairs and whitespace runs.
ALPHABETS = ["ab", "ab ", "a ", "abc ", "aab\n ", "xy \t", "é😀 ", "a\u3000b\xa0", "ab\r\n"]


@st.composite
def small_alphabet_text(draw, max_size=60):
    alphabet = draw(st.sampled_from(ALPHABETS))
    return draw(st.text(alphabet=alphabet, min_size=1, max_size=max_size))


any_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)),  # no lone surrogates (not valid UTF-8)
    min_size=0,
    max_size=40,
)


@SETTINGS
@given(text=st.one_of(small_alphabet_text(), small_alphabet_text(200)), n=st.integers(0, 40))
def test_from_corpus_equals_reference(text, n):
    chars, merges = reference_train(text, n)
    tok = BPETokenizer.from_corpus(text, n)
    assert tok.chars == chars
    assert tok.merges == merges


@SETTINGS
@given(text=st.text(min_size=1, max_size=80), n=st.integers(0, 20))
def test_from_corpus_equals_reference_any_unicode(text, n):
    assert BPETokenizer.from_corpus(text, n).merges == reference_train(text, n)[1]


@settings(max_examples=80, deadline=None)
@given(text=small_alphabet_text(), n=st.integers(0, 25))
def test_from_text_equals_reference(text, n):
    assert BPETokenizer.from_text(text, n).merges == reference_train_text(text, n)[1]


@SETTINGS
@given(train=small_alphabet_text(120), n=st.integers(0, 30), data=st.data())
def test_encoders_agree(train, n, data):
    tok = BPETokenizer.from_corpus(train, n)
    text = data.draw(st.text(alphabet="".join(tok.chars), max_size=80))
    fast = tok.encode_corpus(text, "error")
    assert fast.tolist() == [tok.stoi[s] for s in reference_encode_corpus(tok.merges, text)]
    assert fast.tolist() == tok.encode(text).tolist()  # word-level == whole-text teaching encoder
    assert tok.decode(fast) == text
    words = sorted(set(text.split(" ")) - {""})
    assert fast_word_symbols(tok, words) == [reference_encode_word(tok.merges, w) for w in words]


@SETTINGS
@given(train=small_alphabet_text(80), n=st.integers(0, 15), text=any_text)
def test_byte_fallback_round_trips_any_string(train, n, text):
    tok = BPETokenizer.from_corpus(train, n, byte_fallback=True)
    ids = tok.encode_corpus(text)
    assert tok.decode(ids) == text
    teach = tok.encode(text)
    assert teach.tolist() == ids.tolist()
    back = BPETokenizer.from_state(tok.state())
    assert back.decode(back.encode_corpus(text, "error")) == text


@SETTINGS
@given(train=small_alphabet_text(80), n=st.integers(0, 15), text=any_text)
def test_skip_drops_exactly_the_unknown_characters(train, n, text):
    tok = BPETokenizer.from_corpus(train, n)
    ids, stats = tok.encode_corpus(text, return_stats=True)
    known = set(tok.chars)
    kept = "".join(c for c in text if c in known)
    unknown = [c for c in text if c not in known]
    assert stats.skipped_positions == len(unknown)
    assert stats.skipped_chars == {c: unknown.count(c) for c in set(unknown)}
    assert stats.tokens == len(ids) and stats.chars == len(text)
    assert tok.decode(ids) == kept


@settings(max_examples=40, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from(list("ab é😀你\n\t\u3000\xa0\u2028")), max_size=300),
    chunk=st.integers(1, 80),
)
def test_streaming_equals_whole_text_for_any_chunk_size(text, chunk):
    tok = BPETokenizer.from_corpus("ab ab é😀 你你 a\n", 6, byte_fallback=False)
    fd, path = tempfile.mkstemp(suffix=".txt")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
        parts = list(iter_encode_file(tok, path, chunk_bytes=chunk))
        got = np.concatenate([p[3] for p in parts]) if parts else np.zeros(0, np.uint16)
        np.testing.assert_array_equal(got, tok.encode_corpus(text))
        data = text.encode("utf-8")
        prev_end = 0
        for i, (idx, start, end, _ids, _st) in enumerate(parts):
            assert idx == i and start == prev_end and end > start
            piece = data[start:end].decode("utf-8")  # cut on character boundaries
            if end < len(data):
                nxt = data[end:].decode("utf-8")
                assert not piece[-1].isspace() and nxt[0].isspace()  # a safe cut
            prev_end = end
        assert prev_end == len(data)
    finally:
        os.unlink(path)
