"""The chapter BPE's encoder on UTF-8 bytes (mygpt.tokenizers.bpe_bytes, ``WordEncoder.encode_bytes``), proved equal
to the plain encoders (``encode_text`` and the reference ``bpe_reference.encode``) on real text: the ids, the
stats (characters, tokens, skipped characters by character), ``unk_policy="error"`` and byte fallback."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mygpt.errors import UserError
from mygpt.tokenizers import bpe_bytes, bpe_reference
from mygpt.tokenizers.bpe import BPETokenizer
from mygpt.tokenizers.bpe_reference import WORD_RE
from mygpt.tokenizers.bpe_words import WS_LIMIT

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_WIDE_WS = [chr(c) for c in range(0x80, WS_LIMIT) if chr(c).isspace()]
# every whitespace character, and non-whitespace ones that share their first UTF-8 bytes (U+00A9, U+2014, U+3001...)
_CHARS = list("ab \n\t\r\x0b\x0c\x1c\x1f\x1b") + _WIDE_WS + list("\xa9\xc2\u1681\u200b\u2014\u2030\u205e\u3001é戦😀")
_TEXT = st.text(st.sampled_from(_CHARS), max_size=60)


def _findall_from_bytes(text: str) -> list[str]:
    data = text.encode("utf-8")
    offsets = bpe_bytes.word_starts(np.frombuffer(data, dtype=np.uint8)).tolist()
    return [data[a:b].decode("utf-8") for a, b in zip(offsets, offsets[1:])]


def test_the_byte_rules_are_str_isspace():
    assert bytes(c for c in range(128) if chr(c).isspace()) == bpe_bytes.ASCII_WS
    assert tuple(sorted({c.encode("utf-8")[0] for c in _WIDE_WS})) == bpe_bytes.WIDE_LEADS


@SETTINGS
@given(_TEXT, st.integers(1, 8))
def test_word_starts_are_findall_in_slices_of_any_size(text, slice_bytes):
    saved = bpe_bytes.SLICE_BYTES
    bpe_bytes.SLICE_BYTES = slice_bytes  # slices cut inside multi-byte whitespace too
    try:
        assert _findall_from_bytes(text) == WORD_RE.findall(text)
    finally:
        bpe_bytes.SLICE_BYTES = saved


def test_word_starts_on_real_text(wikitext2_text, shakespeare_text):
    for text in (wikitext2_text, shakespeare_text, "", " ", "a", "\u3000x\u2029"):
        assert _findall_from_bytes(text) == WORD_RE.findall(text)


@SETTINGS
@given(st.binary(max_size=12) | _TEXT.map(lambda t: t.encode("utf-8")[:-1]))
def test_utf8_check_and_char_count_are_pythons(data):
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    assert bpe_bytes.is_utf8(data) == (text is not None)
    if text is not None:
        assert bpe_bytes.char_count(np.frombuffer(data, dtype=np.uint8)) == len(text)


@pytest.mark.parametrize("known", [None, [], [b" the", b"zz"], [b" the", b" of", b"\n", b" ,"]])
def test_distinct_words_put_the_known_words_first(shakespeare_text, known):
    """The distinct words of a text, the known ones ahead (in their order, met in the text or not) and the others in
    first-seen order, and each word's place among them: the text's words again, in order."""
    import pyarrow as pa

    data = shakespeare_text[:20_000].encode("utf-8")
    offsets = bpe_bytes.word_starts(np.frombuffer(data, dtype=np.uint8))
    words = [data[a:b] for a, b in zip(offsets.tolist(), offsets[1:].tolist())]
    ahead = pa.array(known, pa.binary()) if known is not None else None
    dictionary, index = bpe_bytes.distinct_words(data, offsets, ahead)
    first = list(known or [])
    want = first + [w for w in dict.fromkeys(words) if w not in first]
    assert dictionary.to_pylist() == want
    assert [want[i] for i in index.tolist()] == words


def test_distinct_words_of_an_empty_group_are_the_known_words():
    """No words and known words ahead: the dictionary is the known words, and no word has a place among them."""
    import pyarrow as pa

    known = pa.array([b" the", b"zz"], pa.binary())
    dictionary, index = bpe_bytes.distinct_words(b"", np.zeros(1, dtype=np.int32), known)
    assert dictionary.to_pylist() == [b" the", b"zz"]
    assert index.size == 0


@pytest.fixture(scope="module")
def tok(wikitext2_text) -> BPETokenizer:
    """Trained on a slice, so the rest of the text has characters outside its alphabet."""
    return BPETokenizer.from_corpus(wikitext2_text[:100_000], 300)


def _plain(tok: BPETokenizer, text: str, unk_policy: str = "skip"):
    return BPETokenizer.from_state(tok.state())._fast_encoder().encode_text(text, unk_policy)


def test_encode_bytes_is_the_reference_encoder(tok, wikitext2_text):
    text = wikitext2_text[200_000:260_000] + " \u2003x\u00a0y\u3000z 戦\u2028"
    symbols = bpe_reference.encode(text, tok.merges)
    want = [tok.stoi[s] for s in symbols if s in tok.stoi]  # the tokenizer drops what its alphabet lacks
    ids, stats = tok._fast_encoder().encode_bytes(text.encode("utf-8"))
    assert ids.tolist() == want
    assert stats.skipped_positions == len(symbols) - len(want) > 0


@pytest.mark.parametrize("name", ["wikitext2_text", "shakespeare_text"])
def test_encode_bytes_is_encode_text_on_real_text(tok, name, request):
    text = request.getfixturevalue(name)
    want, want_stats = _plain(tok, text)
    enc = BPETokenizer.from_state(tok.state())._fast_encoder()
    data = text.encode("utf-8")
    half = len(data) // 2
    while data[half] & 0xC0 == 0x80:
        half += 1
    ids, stats = enc.encode_bytes(data)
    again, _ = enc.encode_bytes(data[half:])  # its words all seen: from the cache
    assert ids.dtype == want.dtype and np.array_equal(ids, want)
    assert stats == want_stats
    assert np.array_equal(again, _plain(tok, data[half:].decode("utf-8"))[0])
    # the two paths one after the other on one encoder (each numbers the cached words its own way)
    assert np.array_equal(enc.encode_text(text)[0], want)
    assert np.array_equal(enc.encode_bytes(data[:half])[0], _plain(tok, data[:half].decode("utf-8"))[0])


def test_groups_and_cache_resets_change_nothing(tok, wikitext2_text, monkeypatch):
    text = wikitext2_text[:300_000]
    want, want_stats = _plain(tok, text)
    monkeypatch.setattr(bpe_bytes, "GROUP_WORDS", 1000)
    enc = BPETokenizer.from_state(tok.state())._fast_encoder()
    enc.cache_limit = 500
    ids, stats = enc.encode_bytes(text.encode("utf-8"))
    assert np.array_equal(ids, want) and stats == want_stats
    assert len(enc._slot_of_bytes) <= 500 + 1000


@pytest.mark.parametrize("hot", [1, 50, 5000])
@pytest.mark.parametrize("unk_policy", ["skip", "error"])
def test_words_found_among_the_hot_words_are_the_plain_encoders(tok, shakespeare_text, hot, unk_policy, monkeypatch):
    """Known words put ahead of each group (any number of them, across groups, chunks and a cache reset) give the
    plain encoder's ids and stats; the hot prefix holds the first words seen, in slot order."""
    fb = BPETokenizer(tok.chars, tok.merges, byte_fallback=True)  # "error" meets unknown characters: byte tokens
    t = fb if unk_policy == "error" else tok
    # unknown characters only in the first chunk: the second one's groups have hot words with unknowns not in them
    text = "\u2003x\u00a0y\u3000z 戦\u2028 " + shakespeare_text[:200_000] + shakespeare_text[:50_000]
    monkeypatch.setattr(bpe_bytes, "GROUP_WORDS", 3000)
    monkeypatch.setattr(bpe_bytes, "HOT_WORDS", hot)
    enc = BPETokenizer.from_state(t.state())._fast_encoder()
    enc.cache_limit = 4000
    data = text.encode("utf-8")
    cut = data.index(b" ", 20_000)  # a first chunk small enough to keep its words to the second one
    got = [enc.encode_bytes(part, unk_policy) for part in (data[:cut], data[cut:])]  # two chunks, one encoder
    want = [_plain(t, part.decode("utf-8"), unk_policy) for part in (data[:cut], data[cut:])]
    for (ids, stats), (want_ids, want_stats) in zip(got, want):
        assert np.array_equal(ids, want_ids) and stats == want_stats
    assert 0 < len(enc._hot) <= hot
    assert enc._hot.to_pylist() == list(enc._slot_of_bytes)[: len(enc._hot)]


@pytest.mark.parametrize("first_policy", ["skip", "error"])
def test_clean_text_after_a_word_with_unknown_characters_encodes_as_the_plain_encoder(tok, first_policy):
    """One encoder: a chunk holding a character outside the alphabet (skipped, or refused), then a chunk without
    any under unk_policy="error": the second gives the plain encoder's ids, as it would alone (the word with the
    unknown character is a hot word now, but the second chunk does not hold it)."""
    enc = BPETokenizer.from_state(tok.state())._fast_encoder()
    try:
        enc.encode_bytes("the \u6226 cat sat".encode(), first_policy)
    except UserError:
        assert first_policy == "error"
    ids, stats = enc.encode_bytes(b"the cat sat", "error")
    want, want_stats = _plain(tok, "the cat sat", "error")
    assert np.array_equal(ids, want) and stats == want_stats


def test_unknown_characters_error_and_byte_fallback(tok, wikitext2_text):
    text = wikitext2_text[150_000:250_000]
    with pytest.raises(UserError) as plain:
        _plain(tok, text, "error")
    with pytest.raises(UserError) as fast:
        tok._fast_encoder().encode_bytes(text.encode("utf-8"), "error")
    assert str(fast.value) == str(plain.value)
    fb = BPETokenizer(tok.chars, tok.merges, byte_fallback=True)
    want, want_stats = _plain(fb, text, "error")
    ids, stats = fb._fast_encoder().encode_bytes(text.encode("utf-8"), "error")
    assert np.array_equal(ids, want) and stats == want_stats and stats.fallback_positions > 0


def test_bytes_that_are_not_utf8_raise_the_decoders_error(tok):
    data = "héllo wörld".encode() + b"\xed\xa0\x80 tail"
    with pytest.raises(UnicodeDecodeError) as e:
        tok._fast_encoder().encode_bytes(data)
    assert e.value.start == data.index(b"\xed")


def test_empty_and_whitespace_only(tok):
    for text in ("", " ", "\n\n", "a"):
        ids, stats = tok._fast_encoder().encode_bytes(text.encode())
        want, want_stats = _plain(tok, text)
        assert np.array_equal(ids, want) and ids.dtype == want.dtype and stats == want_stats
