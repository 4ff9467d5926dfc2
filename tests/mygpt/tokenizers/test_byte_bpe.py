"""The byte-level BPE: the fast pre-token counter, trainer and encoder proved equal to the plain reference
(mygpt.tokenizers.byte_bpe_reference) on real text, and its files equal to what Hugging Face loads."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mygpt.errors import UserError
from mygpt.tokenizers import byte_bpe_pretokens
from mygpt.tokenizers import byte_bpe_reference as ref
from mygpt.tokenizers.byte_bpe import ByteBPETokenizer, encode_with
from mygpt.tokenizers.byte_bpe_files import gpt2_vocab_and_merges, tiktoken_ranks
from mygpt.tokenizers.byte_bpe_train import train_byte_bpe

EOT = "<|endoftext|>"
# contractions, every kind of whitespace, letters, digits, punctuation, CJK, emoji, the special's spelling
_TEXT = st.lists(
    st.sampled_from(list("ab sdmtlvrSL'’ \n\t\r\x0b\x0c\x1c\x85\xa0\u2028\u3000é戦😀=.,1²<|>") + ["'ll", "'ve", "'re"]),
    max_size=40,
).map("".join)
# characters no training text below holds: the encoder must still round-trip them
UNSEEN = " 😀 中文 𝔘𝔫𝔦 ‽ \x00\x7f don't I'LL  \t\n\n x"


@pytest.fixture(scope="module")
def articles(wikitext2_text) -> str:
    """WikiText-2's first articles with ``<|endoftext|>`` after each (as the corpus stage would mark them)."""
    parts = regex.split(r"(?m)^ = [^=\n]+ = \n", wikitext2_text[:120_000])
    return EOT.join(parts)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_TEXT)
def test_pretoken_counts_equal_the_regex_on_generated_text(text):
    expected = collections.Counter(regex.findall(ref.GPT2_PATTERN, text))
    assert byte_bpe_pretokens.count_pretokens([text]) == expected


def test_pretoken_counts_equal_the_regex_on_real_text_in_pieces_and_processes(wikitext2_text, shakespeare_text):
    text = wikitext2_text[:300_000] + shakespeare_text[:100_000] + UNSEEN
    expected = collections.Counter(regex.findall(ref.GPT2_PATTERN, text))
    assert byte_bpe_pretokens.count_pretokens([text]) == expected
    many = list(byte_bpe_pretokens.pieces(text, 10_000))
    assert len(many) > 30 and "".join(many) == text
    assert byte_bpe_pretokens.count_pretokens([text], workers=2, piece_chars=10_000) == expected
    gpt4 = collections.Counter(regex.findall(ref.GPT4_PATTERN, text))
    assert byte_bpe_pretokens.count_pretokens([text], ref.GPT4_PATTERN, piece_chars=10_000) == gpt4


def test_pretoken_counts_equal_the_regex_on_one_thread_and_two(monkeypatch, wikitext2_text):
    text = wikitext2_text[:60_000] + UNSEEN
    expected = collections.Counter(regex.findall(ref.GPT2_PATTERN, text))
    for threads in (1, 2):
        monkeypatch.setattr(byte_bpe_pretokens, "THREADS", threads)
        assert byte_bpe_pretokens.count_pretokens([text, text[:999]], piece_chars=5_000) == expected + (
            collections.Counter(regex.findall(ref.GPT2_PATTERN, text[:999]))
        )


def test_character_classes_learnt_as_met_equal_the_regex_over_all_of_unicode():
    everything = "".join(map(chr, range(0x110000)))
    expected = np.full(0x110000, byte_bpe_pretokens.OTHER, dtype=np.uint8)
    for cls, pattern in ((byte_bpe_pretokens.WS, r"\s"), (byte_bpe_pretokens.LETTER, r"\p{L}")):
        expected[[ord(c) for c in regex.findall(pattern, everything)]] = cls
    expected[[ord(c) for c in regex.findall(r"\p{N}", everything)]] = byte_bpe_pretokens.NUMBER
    some = np.array([0x4E00, 32, 0x10FFFF, 0xD800, 0x661, 97, 32], dtype=np.uint32)  # a few first, then the rest
    assert byte_bpe_pretokens.classes(some).tolist() == expected[some].tolist()
    assert (byte_bpe_pretokens.classes(np.arange(0x110000, dtype=np.uint32)) == expected).all()


def test_anagrams_are_different_pre_tokens(shakespeare_text):
    """Pre-tokens made of the same characters ("on"/"no") are told apart (a hash of their sum would not)."""
    text = shakespeare_text[:50_000] + " on no"
    tok = ByteBPETokenizer.train(text, 256 + 100 + 1)
    assert byte_bpe_pretokens.count_pretokens([text]) == collections.Counter(regex.findall(ref.GPT2_PATTERN, text))
    assert tok.encode_array(text).tolist() == ref.encode(text, tok.merges, tok.specials)


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4"])
def test_fast_trainer_merges_equal_the_reference(pattern, articles, shakespeare_text):
    for text in (articles[:50_000], shakespeare_text[:40_000]):
        expected = ref.train(text, 150, [EOT], ref.PATTERNS[pattern])
        assert len(expected) == 150
        assert train_byte_bpe(text, 150, [EOT], ref.PATTERNS[pattern]) == expected


def test_ties_go_to_the_greatest_pair_of_byte_strings_and_specials_are_never_learnt():
    # "ab" and "cd" both occur 3 times: the greater pair (c, d) is merged first
    assert ref.train("ab cd ab cd ab cd", 2) == [(b"c", b"d"), (b"a", b"b")]
    assert train_byte_bpe("ab cd ab cd ab cd", 2) == [(b"c", b"d"), (b"a", b"b")]
    text = f"hello{EOT}hello{EOT}" * 50
    merges = train_byte_bpe(text, 20, [EOT])
    assert merges == ref.train(text, 20, [EOT])
    assert merges and all((a + b) in b"hello" for a, b in merges)  # no merge holds a byte of the special
    assert b"|" not in b"".join(a + b for a, b in train_byte_bpe(text, 20, [EOT]))


@pytest.fixture(scope="module", params=["gpt2", "gpt4"])
def trained(request, articles) -> ByteBPETokenizer:
    return ByteBPETokenizer.train(articles, 256 + 300 + 1, pattern=request.param)


def test_vocab_size_counts_bytes_merges_and_specials(trained):
    assert trained.vocab_size == 256 + 300 + 1 == len(trained.vocab)
    assert trained.special_ids == {EOT: 556}
    with pytest.raises(UserError, match="vocab_size must be an integer >= 257"):
        ByteBPETokenizer.train("some text", 100)
    for bad in (lambda: ByteBPETokenizer.train("a\ud800b", 300), lambda: trained.encode_array("ok \udfff")):
        with pytest.raises(UserError, match=r"lone surrogate U\+D(800|FFF)"):
            bad()


def test_encoder_equals_the_reference_on_real_text_and_round_trips_unseen_characters(trained, shakespeare_text):
    text = shakespeare_text[:60_000] + UNSEEN + f" {EOT} a{EOT}b"
    pattern = ref.PATTERNS[trained.pattern]
    ids = trained.encode_array(text)
    assert ids.tolist() == ref.encode(text, trained.merges, trained.specials, False, pattern)
    assert trained.decode(ids) == text
    assert 556 not in ids.tolist()  # the special's spelling in ordinary text is ordinary bytes
    allowed = trained.encode_array(text, allowed_special=True).tolist()
    assert allowed == ref.encode(text, trained.merges, trained.specials, True, pattern)
    assert allowed.count(556) == 2 and trained.decode(allowed) == text


def test_encoding_in_many_pieces_equals_the_reference(trained, wikitext2_text):
    text = wikitext2_text[:200_000] + UNSEEN + EOT
    expected = ref.encode(text, trained.merges, trained.specials, True, ref.PATTERNS[trained.pattern])
    dtype = np.uint16
    ids = encode_with(trained._hf, text, trained.special_ids, True, trained.pattern, dtype, piece_chars=3_000)
    assert ids.tolist() == expected and ids.dtype == dtype


def test_documents_encoded_one_after_another_share_pretokens_and_equal_the_reference(
    trained, wikitext2_text, monkeypatch
):
    """The pre-token ids kept between texts (and the store emptied when full) change no id."""
    from mygpt.tokenizers import byte_bpe

    monkeypatch.setattr(byte_bpe, "CACHE_PRETOKENS", 2_000)
    tok = ByteBPETokenizer(merges=trained.merges, specials=trained.specials, pattern=trained.pattern)
    pattern = ref.PATTERNS[trained.pattern]
    docs = regex.split(r"(?m)^ = [^=\n]+ = \n", wikitext2_text[:150_000])[:12] + [UNSEEN]
    sizes = []
    for doc in docs:
        assert tok.encode_array(doc).tolist() == ref.encode(doc, trained.merges, (), False, pattern)
        sizes.append(len(tok._document_ids))
    if trained.pattern == "gpt2":  # the pattern whose pre-tokens are found here (GPT-4's: by Hugging Face)
        assert max(sizes) > 2_000 and sizes != sorted(sizes)  # it filled, then was emptied


def test_tokenizer_json_loads_in_hugging_face_with_the_same_ids(trained, shakespeare_text, tmp_path):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    path = tmp_path / "tokenizer.json"
    path.write_text(trained.to_json(), encoding="utf-8")
    text = shakespeare_text[:30_000] + UNSEEN + f" {EOT}"
    ids = trained.encode_array(text, allowed_special=True).tolist()
    hf = Tokenizer.from_file(str(path))
    assert hf.encode(text).ids == ids
    assert hf.decode(ids, skip_special_tokens=False) == text
    fast = PreTrainedTokenizerFast(tokenizer_file=str(path))
    assert fast(text)["input_ids"] == ids
    merges = json.loads(path.read_text())["model"]["merges"]
    assert len(merges) == 300 and ByteBPETokenizer.load(path) == trained


def test_gpt2_vocab_and_merges_load_as_hugging_face_gpt2_with_the_same_ids(articles, shakespeare_text, tmp_path):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast

    tok = ByteBPETokenizer.train(articles, 256 + 300 + 1)
    vocab, merges = gpt2_vocab_and_merges(tok)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text(merges, encoding="utf-8")
    text = shakespeare_text[:30_000] + UNSEEN
    ids = tok.encode_array(text).tolist()
    assert ByteLevelBPETokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt")).encode(text).ids == ids
    gpt2 = GPT2TokenizerFast.from_pretrained(str(tmp_path))  # GPT-2's own loader: <|endoftext|> is its special
    assert gpt2(text + EOT)["input_ids"] == ids + [tok.special_ids[EOT]]


def test_tiktoken_ranks_file_lists_every_ordinary_token_by_rank(trained):
    import base64

    lines = tiktoken_ranks(trained).splitlines()
    assert len(lines) == trained.special_base
    parsed = {int(rank): base64.b64decode(token) for token, rank in (line.split() for line in lines)}
    assert parsed == {i: b for i, b in trained.vocab.items() if i < trained.special_base}
