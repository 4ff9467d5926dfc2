"""The tokenizer export: HF token ids equal ``encode_corpus`` on whole files, decoding exact, refusals clean."""

from __future__ import annotations

import json

import pytest

from mygpt.errors import UserError
from mygpt.export import tokenizer as export_tokenizer
from mygpt.export.model import check_exportable
from mygpt.export.tokenizer import hf_tokenizer_json
from mygpt.gpt_config import GPTConfig
from mygpt.tokenizers.bpe import BPETokenizer
from mygpt.tokenizers.char_tokenizer import CharTokenizer


def hf_tokenizer(tok):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(json.dumps(hf_tokenizer_json(tok)))


@pytest.mark.parametrize("which", ["skip", "byte_fallback"])
def test_hf_ids_equal_encode_corpus_on_whole_files(which, skip_tok, fallback_tok, wikitext2_text, shakespeare_text):
    tok = skip_tok if which == "skip" else fallback_tok
    hf = hf_tokenizer(tok)
    for text in (wikitext2_text, shakespeare_text):
        want, stats = tok.encode_corpus(text, return_stats=True)
        got = hf.encode(text).ids
        assert got == want.tolist()
        decoded = hf.decode(got)
        assert decoded == tok.decode(want)
        if which == "skip":
            assert decoded == "".join(c for c in text if c not in stats.skipped_chars)
        else:
            assert decoded == text
    unknown = stats.skipped_positions + stats.fallback_positions  # Shakespeare's, for both tokenizers
    wiki_unknown = tok.encode_corpus(wikitext2_text, return_stats=True)[1]
    assert unknown > 0 or wiki_unknown.skipped_positions + wiki_unknown.fallback_positions > 0


def test_unknown_character_is_a_barrier():
    tok = BPETokenizer(["a", "b"], [("a", "b")])
    assert tok.encode_corpus("aZb ab").tolist() == [0, 1, 2]  # 'a', 'b' | ' ' is unknown too | 'ab'
    assert hf_tokenizer(tok).encode("aZb ab").ids == [0, 1, 2]


def test_whitespace_is_pythons():
    # Python's \s holds U+001C..U+001F, Oniguruma's does not: "a\x1ca" is two words here, never the merge a+\x1c.
    tok = BPETokenizer(["a", "\x1c"], [("a", "\x1c")])
    assert tok.encode_corpus("a\x1ca a\x1c").tolist() == [0, 1, 0, 0, 1]
    assert hf_tokenizer(tok).encode("a\x1ca a\x1c").ids == [0, 1, 0, 0, 1]


def test_char_tokenizer_maps_as_bpe_without_merges(shakespeare_text):
    tok = CharTokenizer.from_text(shakespeare_text)
    hf = hf_tokenizer(tok)
    ids = hf.encode(shakespeare_text).ids
    assert ids == tok.encode_array(shakespeare_text).tolist()
    assert hf.decode(ids) == shakespeare_text


def test_repeated_string_keeps_the_later_id_and_decodes_exactly():
    # 'aba' is made twice (ids 4 and 5); nothing uses it before the repeat, so HF's BPE agrees with mygpt.
    tok = BPETokenizer(["a", "b"], [("a", "b"), ("b", "a"), ("ab", "a"), ("a", "ba")])
    hf = hf_tokenizer(tok)
    words = [format(n, "b").replace("0", "a").replace("1", "b")[1:] for n in range(2, 2**11)]
    text = " ".join(words)
    assert hf.encode(text).ids == tok.encode_corpus(text).tolist()
    assert 5 in tok.encode_corpus(text).tolist() and 4 not in tok.encode_corpus(text).tolist()
    assert hf.decode([4, 0, 5, 1]) == tok.decode([4, 0, 5, 1]) == "abaaabab"


def test_repeat_used_before_it_is_made_again_is_refused(monkeypatch):
    # 'bbbb' is made by merge #2, used by merge #3 and made again by merge #4: HF's priority queue would merge
    # (bbbb, bb) right after the first #4 merge, mygpt finishes every #4 merge first.
    merges = [("b", "b"), ("bb", "b"), ("b", "bbb"), ("bbbb", "bb"), ("bb", "bb")]
    tok = BPETokenizer(["a", "b"], merges)
    with pytest.raises(UserError, match=r"merge #4 \['bb', 'bb'\] makes 'bbbb' again .* merge #3"):
        check_exportable(GPTConfig(tok.vocab_size, norm_type="rms", position_type="rope"), tok)
    monkeypatch.setattr(export_tokenizer, "_check_repeats_in_order", lambda merges: None)
    assert hf_tokenizer(tok).encode("bbbbbbbb").ids != tok.encode_corpus("bbbbbbbb").tolist()  # why it is refused


def test_byte_token_name_clash_is_refused():
    chars = ["0", "1", "<", ">", "x"]
    merges = [("<", "0"), ("<0", "x"), ("<0x", "1"), ("<0x1", "1"), ("<0x11", ">")]
    tok = BPETokenizer(chars, merges, byte_fallback=True)
    with pytest.raises(UserError, match=r"named like byte tokens \('<0x11>'\)"):
        hf_tokenizer_json(tok)
    assert hf_tokenizer(BPETokenizer(chars, merges)).encode("<0x11>").ids == [9]  # fine without byte fallback
