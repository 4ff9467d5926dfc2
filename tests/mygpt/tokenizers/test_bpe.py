"""BPETokenizer: the chapter's semantics, the fixed tie-break, the fast path, files and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mygpt.errors import UserError
from mygpt.tokenizers import bpe_reference as ref
from mygpt.tokenizers.bpe import BPETokenizer
from mygpt.tokenizers.bpe_word_encoder import EncodeStats
from tests.support.bpe_words import fast_word_symbols


def reference_train(text, n):
    return ref.train(text, n)


def reference_train_text(text, n):
    return ref.train_text(text, n)


def chapter_ids(tok: BPETokenizer, text: str) -> list[int]:
    """The chapter's ``encode_corpus`` (skip policy): every word's symbols, unknown characters dropped."""
    return [tok.stoi[s] for s in ref.encode(text, tok.merges) if s in tok.stoi]


# --- construction / vocabulary ------------------------------------------------------------------
def test_vocab_layout_and_attributes():
    tok = BPETokenizer(["a", "b", "c"], [("a", "b"), ("ab", "c")])
    assert tok.kind == "bpe"
    assert tok.chars == ["a", "b", "c"]
    assert tok.merges == [("a", "b"), ("ab", "c")]
    assert tok.vocab == ["a", "b", "c", "ab", "abc"]
    assert tok.vocab_size == 5
    assert tok.stoi == {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4}
    assert tok.state() == {"chars": ["a", "b", "c"], "merges": [["a", "b"], ["ab", "c"]]}
    assert tok.byte_fallback is False


def test_byte_fallback_layout_keeps_char_and_merge_ids():
    plain = BPETokenizer(["a", "b"], [("a", "b")])
    fb = BPETokenizer(["a", "b"], [("a", "b")], byte_fallback=True)
    assert fb.vocab[:3] == plain.vocab
    assert fb.stoi == plain.stoi
    assert fb.vocab_size == plain.vocab_size + 256
    assert fb.vocab[3] == "<0x00>" and fb.vocab[-1] == "<0xFF>"
    assert fb.state() == {"chars": ["a", "b"], "merges": [["a", "b"]], "byte_fallback": True}


# --- training: tie-break and the chapter's subtle cases -------------------------------------------
def test_tie_break_prefers_lexicographically_greatest_pair():
    # every pair has count 1: ('c','d') > ('a','b') > (' ','c')
    for trainer in (BPETokenizer.from_corpus, BPETokenizer.from_text):
        assert trainer("ab cd", 1).merges == [("c", "d")]


def test_tie_break_compares_whole_symbol_strings():
    # after ('b','b')... just check the full sequence matches the reference on a tie-heavy text
    text = "ba ab ba ab bb aa"
    assert BPETokenizer.from_corpus(text, 20).merges == reference_train(text, 20)[1]
    assert BPETokenizer.from_text(text, 20).merges == reference_train_text(text, 20)[1]


def test_overlapping_pairs_are_counted_at_every_position():
    # 'aaa' contributes ('a','a') twice (the chapter counts all adjacent positions), so it beats the
    # count-1 pairs of ' bc' even though only one non-overlapping merge fits in 'aaa'.
    assert BPETokenizer.from_corpus("aaa bc", 1).merges == [("a", "a")]
    tok = BPETokenizer.from_corpus("aaaa", 5)
    assert tok.merges == [("a", "a"), ("aa", "aa")]
    assert tok.encode_corpus("aaaaa").tolist() == [tok.stoi["aaaa"], tok.stoi["a"]]
    assert tok.encode("aaaaa").tolist() == [tok.stoi["aaaa"], tok.stoi["a"]]


def test_early_stop_when_no_pairs_remain():
    tok = BPETokenizer.from_corpus("ab", 10)
    assert tok.merges == [("a", "b")] and tok.vocab_size == 3
    # single-character words and whitespace-only input have no pairs inside words... except runs
    assert BPETokenizer.from_corpus("a b c", 10).merges == reference_train("a b c", 10)[1]
    assert BPETokenizer.from_corpus(" ", 3).merges == []
    assert BPETokenizer.from_corpus("x", 3).merges == []
    assert BPETokenizer.from_corpus("  \n\t ", 10).merges == reference_train("  \n\t ", 10)[1]
    assert BPETokenizer.from_corpus("abc", 0).merges == []


def test_word_level_never_merges_across_words_but_text_level_does():
    # from_text sees 'b a' as one sequence; from_corpus never merges 'b' with ' '
    corpus = BPETokenizer.from_corpus("ab ab ab", 10)
    assert all(not (a[-1:].strip() and b[:1].isspace()) for a, b in corpus.merges)
    assert corpus.merges == reference_train("ab ab ab", 10)[1]


@pytest.mark.parametrize(
    "text",
    [
        "héllo wörld 你好 你好世界 😀😀 😀 a\u3000b\xa0c\u2028d",
        "  leading and trailing  \n\n",
        "\t\t\n  \r\n",
        "abcabcabc bcabca cab cab",
        "aaaa aaaa aaaaa a aa",
    ],
)
def test_from_corpus_matches_reference_on_tricky_text(text):
    for n in (0, 1, 3, 10, 50):
        assert BPETokenizer.from_corpus(text, n).merges == reference_train(text, n)[1]
        assert BPETokenizer.from_text(text, n).merges == reference_train_text(text, n)[1]


def test_from_corpus_matches_reference_on_real_text(wikitext2_text, shakespeare_text):
    for text, n in ((wikitext2_text[:60_000], 200), (shakespeare_text[:40_000], 150)):
        chars, merges = reference_train(text, n)
        tok = BPETokenizer.from_corpus(text, n)
        assert tok.chars == chars
        assert tok.merges == merges


def test_from_corpus_on_full_wikitext2_is_deterministic_and_consistent(wikitext2_text):
    tok = BPETokenizer.from_corpus(wikitext2_text, 1024)
    assert tok.vocab_size == len(tok.chars) + 1024
    assert tok.merges == BPETokenizer.from_corpus(wikitext2_text, 1024).merges
    # every merge is a pair of known symbols, no duplicates, and the first one is the top pair
    _chars, first = reference_train(wikitext2_text, 1)
    assert tok.merges[:1] == first
    ids = tok.encode_corpus(wikitext2_text, "error")
    assert ids.dtype == np.uint16
    assert tok.decode(ids) == wikitext2_text


# --- encoding -------------------------------------------------------------------------------------
def test_encode_returns_long_tensor_and_round_trips():
    tok = BPETokenizer.from_text("hello hello world", 8)
    t = tok.encode("hello world")
    assert isinstance(t, torch.Tensor) and t.dtype == torch.long and t.ndim == 1
    assert tok.decode(t) == "hello world"
    assert tok.decode(t.tolist()) == "hello world"
    assert tok.decode(t.numpy()) == "hello world"
    assert tok.encode("").tolist() == []
    assert tok.decode([]) == ""


def test_encode_corpus_equals_teaching_encode_on_real_text(wikitext2_text):
    # the chapter's experiment 4: word-level encoding == the sequential teaching encoder
    train = wikitext2_text[:150_000]
    tok = BPETokenizer.from_corpus(train, 256)
    text = wikitext2_text[:120_000]
    fast = tok.encode_corpus(text, "error")
    slow = tok.encode(text).numpy()
    assert fast.dtype == np.uint16
    np.testing.assert_array_equal(fast, slow)
    assert fast.tolist() == [tok.stoi[s] for s in ref.encode(text, tok.merges)]
    assert fast.tolist() == chapter_ids(tok, text)


def test_encode_word_matches_chapter(shakespeare_text):
    tok = BPETokenizer.from_corpus(shakespeare_text[:50_000], 200)
    ranks = {pair: i for i, pair in enumerate(tok.merges)}
    words = sorted({" " + w for w in shakespeare_text[50_000:60_000].split(" ")} | {"a", " \u6226x"})
    assert fast_word_symbols(tok, words) == [ref.encode_word(w, ranks) for w in words]


def test_encode_corpus_dtype_uint32_for_big_vocab():
    chars = [chr(0x4E00 + i) for i in range(65_537)]
    tok = BPETokenizer(chars, [])
    ids = tok.encode_corpus(chars[0] + chars[-1])
    assert ids.dtype == np.uint32 and ids.tolist() == [0, 65_536]
    small = BPETokenizer(chars[:65_536], [])
    assert small.encode_corpus(chars[0]).dtype == np.uint16


def test_unknown_chars_error_names_them():
    tok = BPETokenizer.from_corpus("abc abc", 3)
    assert tok.unknown_chars("abZ€Z") == ["Z", "€"]
    with pytest.raises(UserError, match=r"'Z' \(U\+005A\), '€' \(U\+20AC\)"):
        tok.encode("ab Z€")
    with pytest.raises(UserError, match=r"'Z' \(U\+005A\), '€' \(U\+20AC\)"):
        tok.encode_corpus("ab Z€", unk_policy="error")
    with pytest.raises(ValueError):
        tok.encode_corpus("ab", unk_policy="ignore")


def test_skip_policy_drops_and_counts_unknown_chars():
    tok = BPETokenizer.from_corpus("abc abc ab", 3)
    text = "abZc Z€ ab"
    ids, stats = tok.encode_corpus(text, "skip", return_stats=True)
    assert isinstance(stats, EncodeStats)
    assert tok.decode(ids) == "abc  ab"
    assert stats.skipped_chars == {"Z": 2, "€": 1}
    assert stats.skipped_positions == 3
    assert stats.chars == len(text) and stats.tokens == len(ids)
    # the chapter's "chars missing / positions affected" analysis, from the stats
    assert stats.skipped_positions == sum(1 for c in text if c in set(tok.unknown_chars(text)))


def test_stats_merge_adds_up():
    a = EncodeStats(chars=3, tokens=2, skipped_positions=1, skipped_chars={"Z": 1})
    b = EncodeStats(chars=5, tokens=4, skipped_positions=2, skipped_chars={"Z": 1, "€": 1})
    a.merge(b)
    assert (a.chars, a.tokens, a.skipped_positions, a.skipped_chars) == (8, 6, 3, {"Z": 2, "€": 1})


def test_skipped_analysis_on_real_text(wikitext2_text):
    head, rest = wikitext2_text[:200_000], wikitext2_text[200_000:]
    tok = BPETokenizer.from_corpus(head, 64)
    missing = set(rest) - set(head)
    ids, stats = tok.encode_corpus(rest, return_stats=True)
    assert set(stats.skipped_chars) == missing
    assert stats.skipped_positions == sum(1 for c in rest if c in missing)
    assert stats.tokens == len(ids)


# --- byte fallback -----------------------------------------------------------------------------------
def test_byte_fallback_round_trip_and_ids():
    tok = BPETokenizer.from_corpus("hello world hello", 5, byte_fallback=True)
    text = "hello 😀 wörld\x00 你好"
    ids = tok.encode_corpus(text)
    assert tok.decode(ids) == text
    assert tok.decode(tok.encode(text)) == text
    np.testing.assert_array_equal(tok.encode(text).numpy(), ids)
    smile = [tok.byte_offset + b for b in "😀".encode()]
    assert smile == [int(i) for i in ids if i >= tok.byte_offset][:4]
    assert tok.unknown_chars(text) == []
    _, stats = tok.encode_corpus(text, "error", return_stats=True)
    assert stats.skipped_positions == 0
    assert stats.fallback_chars == {"😀": 1, "ö": 1, "\x00": 1, "你": 1, "好": 1}
    assert stats.fallback_positions == 5


def test_byte_fallback_state_round_trip(tmp_path):
    tok = BPETokenizer.from_corpus("abc abd", 4, byte_fallback=True)
    path = tmp_path / "tok.json"
    tok.save(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["byte_fallback"] is True
    back = BPETokenizer.load(path)
    assert back == tok and back.byte_fallback and back.vocab == tok.vocab
    assert BPETokenizer.from_state(tok.state()) == tok
    plain = BPETokenizer.from_corpus("abc abd", 4)
    assert "byte_fallback" not in plain.state()


# --- save / load ---------------------------------------------------------------------------------------
def test_save_load_round_trip(tmp_path, shakespeare_text):
    tok = BPETokenizer.from_corpus(shakespeare_text[:30_000], 100)
    path = tmp_path / "sub" / "tok.json"
    tok.save(path)
    assert set(json.loads(path.read_text(encoding="utf-8"))) == {"chars", "merges"}
    back = BPETokenizer.load(path)
    assert back.chars == tok.chars and back.merges == tok.merges and back.vocab == tok.vocab
    text = shakespeare_text[30_000:32_000]
    np.testing.assert_array_equal(back.encode_corpus(text), tok.encode_corpus(text))
    assert not [p for p in path.parent.iterdir() if p.name != "tok.json"]  # no temp files left


@pytest.mark.parametrize(
    "content, match",
    [
        ("not json {", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"chars": ["a"]}', "missing key"),
        ('{"merges": []}', "missing key"),
        ('{"chars": ["a", "b"], "merges": [["a", "c"]]}', "refers to 'c'"),
        ('{"chars": ["a", "b"], "merges": [["ab", "a"]]}', "refers to 'ab'"),
        ('{"chars": ["a", "b"], "merges": [["a", "b"], ["a", "b"]]}', "duplicate"),
        ('{"chars": ["a", "a"], "merges": []}', "duplicate characters"),
        ('{"chars": ["ab"], "merges": []}', "single characters"),
        ('{"chars": "ab", "merges": []}', "list of single characters"),
        ('{"chars": ["a"], "merges": [["a"]]}', "pair"),
        ('{"chars": ["a"], "merges": [["a", 1]]}', "pair"),
        ('{"chars": ["a"], "merges": {}}', "list of"),
        ('{"chars": ["a"], "merges": [], "byte_fallback": "yes"}', "byte_fallback"),
        ('{"chars": ["a"], "merges": [], "extra": 1}', "unknown key"),
    ],
)
def test_load_rejects_malformed_files(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(UserError, match=match) as info:
        BPETokenizer.load(path)
    assert "bad.json" in str(info.value)


def test_load_missing_file(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        BPETokenizer.load(tmp_path / "nope.json")


# --- bad input ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [-1, 1.5, "3", None, True])
def test_bad_num_merges(n):
    for trainer in (BPETokenizer.from_corpus, BPETokenizer.from_text):
        with pytest.raises(UserError, match="num_merges"):
            trainer("abc", n)


@pytest.mark.parametrize("text", ["", None, b"abc", 3])
def test_bad_training_text(text):
    for trainer in (BPETokenizer.from_corpus, BPETokenizer.from_text):
        with pytest.raises(UserError, match="text"):
            trainer(text, 3)


def test_bad_encode_and_decode_input():
    tok = BPETokenizer.from_corpus("abc", 1)
    with pytest.raises(UserError):
        tok.encode(b"abc")
    with pytest.raises(UserError):
        tok.encode_corpus(None)
    with pytest.raises(UserError, match="out of range"):
        tok.decode([0, 99])
    with pytest.raises(UserError, match="out of range"):
        tok.decode([-1])
    with pytest.raises(UserError, match="integers"):
        tok.decode([0.5])


def test_teaching_encode_matches_reference_sequence():
    text = "the cat sat on the mat, the end"
    tok = BPETokenizer.from_text(text, 12)
    assert tok.encode(text).tolist() == [tok.stoi[s] for s in ref.encode_in_merge_order(text, tok.merges)]


def test_big_vocab_encoder_path_matches_chapter(wikitext2_text):
    # > 2048 ids: the batched encoder looks pairs up with searchsorted instead of a dense table
    tok = BPETokenizer.from_corpus(wikitext2_text[:400_000], 2100)
    assert tok.vocab_size > 2048
    text = wikitext2_text[400_000:600_000]
    fast = tok.encode_corpus(text, "skip")
    assert fast.tolist() == chapter_ids(tok, text)


@pytest.mark.slow
def test_from_corpus_matches_reference_on_full_wikitext2(wikitext2_text):
    """The chapter's algorithm on the whole 1.1 MB file with 1024 merges (about a minute)."""
    chars, merges = reference_train(wikitext2_text, 1024)
    tok = BPETokenizer.from_corpus(wikitext2_text, 1024)
    assert (tok.chars, tok.merges) == (chars, merges)


def test_long_words_and_many_new_words_match_reference():
    import random

    rng = random.Random(5)
    train = "".join(rng.choice("abcab  ") for _ in range(20_000))
    tok = BPETokenizer.from_corpus(train, 120)
    long_word = "".join(rng.choice("abc") for _ in range(3000))  # one word, batched path
    text = long_word + " " + " ".join("".join(rng.choice("abc") for _ in range(rng.randint(1, 12))) for _ in range(500))
    fast = tok.encode_corpus(text, "error")
    assert fast.tolist() == [tok.stoi[s] for s in ref.encode(text, tok.merges)]
    assert fast_word_symbols(tok, [long_word]) == [ref.encode_word(long_word, {p: i for i, p in enumerate(tok.merges)})]


def test_runs_of_one_symbol_and_back_to_back_pairs_match_reference():
    """Runs of one character of every length up to 40 (the trainer merges the 1st, 3rd, ... pair of each run) and
    back-to-back occurrences of a pair (``abab``: the pair between them is ``(ab, ab)``, counted once)."""
    words = ["a" * n for n in range(1, 41)] + ["ab" * n for n in range(1, 12)] + ["ba" * n + "b" for n in range(9)]
    text = " ".join(words * 3 + ["aab", "aaab", "aaaab", "baaa", "abba"] * 5)
    for n in (5, 40, 120):
        assert BPETokenizer.from_corpus(text, n).merges == reference_train(text, n)[1]
