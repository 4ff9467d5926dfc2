"""The word counter (words found in the UTF-8 bytes, told apart by Arrow) and the trainer's token-count shortcut,
each proved equal to the plain computation: ``Counter(WORD_RE.findall(...))``, a real ``encode_corpus``."""

from __future__ import annotations

import collections

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mygpt.tokenizers.bpe import BPETokenizer
from mygpt.tokenizers.bpe_reference import WORD_RE
from mygpt.tokenizers.bpe_train import count_words, train_and_count_tokens
from mygpt.tokenizers.bpe_words import WS_LIMIT

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# whitespace of every kind, repeated words, non-BMP characters, lone surrogates
_TEXT = st.text(st.sampled_from(list("ab \n\t\r\x0b\x0c\x1c\x85\xa0\u2028\u3000é戦😀=") + ["\ud800"]), max_size=60)


def test_every_whitespace_character_is_below_the_table_limit():
    assert [c for c in range(WS_LIMIT, 0x110000) if chr(c).isspace()] == []
    assert chr(0x3000).isspace()


def test_count_words_is_counter_of_findall(wikitext2_text, shakespeare_text):
    for text in (wikitext2_text, shakespeare_text, "", " ", "a"):
        assert count_words(text) == dict(collections.Counter(WORD_RE.findall(text)))


@SETTINGS
@given(_TEXT)
def test_count_words_any_text(text):
    assert count_words(text) == dict(collections.Counter(WORD_RE.findall(text)))


def _tokens_two_ways(text: str, n: int):
    chars, merges, tokens = train_and_count_tokens(count_words(text), n)
    tok = BPETokenizer(chars, merges)
    return tokens, tok.count_tokens(count_words(text)), len(tok.encode_corpus(text)), merges


def test_token_count_from_the_trainer_is_a_real_encode(wikitext2_text):
    for n in (0, 50, 1024):
        state, distinct, real, _ = _tokens_two_ways(wikitext2_text[:400_000], n)
        assert state == distinct == real


@SETTINGS
@given(st.text(st.sampled_from(list("ab c\n")), min_size=1, max_size=80), st.integers(0, 30))
def test_token_count_shortcut_holds_or_steps_aside(text, n):
    state, distinct, real, merges = _tokens_two_ways(text, n)
    assert distinct == real
    made = [a + b for a, b in merges]
    if len(set(made)) == len(made):
        assert state == real
    else:
        assert state is None  # two merges made one string: the caller encodes the distinct words


def test_count_tokens_with_unknown_characters_follows_the_policy(wikitext2_text):
    tok = BPETokenizer.from_corpus(wikitext2_text[:50_000], 100)
    text = "the cat 你好 sat 😀😀 on"
    assert tok.count_tokens(count_words(text)) == len(tok.encode_corpus(text))
    fb = BPETokenizer.from_corpus(wikitext2_text[:50_000], 100, byte_fallback=True)
    assert fb.count_tokens(count_words(text)) == len(fb.encode_corpus(text))
