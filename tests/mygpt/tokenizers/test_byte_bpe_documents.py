"""A text of many documents encoded in one pass (``ByteBPETokenizer.encode_documents``, the shards stage's byte kind)
gives every document exactly the ids it has alone, ``<|endoftext|>`` after each: proved against the document-by-
document path and the plain reference on real articles and at boundaries chosen to break the split rules."""

from __future__ import annotations

import numpy as np
import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mygpt.errors import UserError
from mygpt.tokenizers import byte_bpe_pretokens
from mygpt.tokenizers import byte_bpe_reference as ref
from mygpt.tokenizers.bpe_chunks import encode_chunk
from mygpt.tokenizers.byte_bpe import ByteBPETokenizer

EOT = "<|endoftext|>"
# where the split rules look past a position: runs of spaces, a space before a letter, digit runs, contractions,
# every kind of whitespace, CJK, emoji, a combining mark, the special's own spelling
ADVERSARIAL = "a   b  \n\n x's don't I'LL 'll 12345 6\t\t7 中文😀😀 é\u0301 \u3000x\x85 .,;'ve <|endoftext|> end  "
_TEXT = st.lists(
    st.sampled_from([*"ab 1'\n\t\r\u3000\x85é中😀.,sdmtlvr", "'ll", "'ve", "'re", " the", "  "]), max_size=30
).map("".join)


def _article_ends(text: str) -> list[int]:
    """The corpus stage's article index as document ends: before the blank line above each `` = Title = `` line."""
    return [m.start() + 1 for m in regex.finditer(r"\n \n = [^=\n][^\n]* = \n", text)]


def _one_by_one(tok: ByteBPETokenizer, text: str, ends: list[int]) -> list[int]:
    """The document-by-document path: each document encoded alone, ``<|endoftext|>`` after each end."""
    eot = tok.special_ids[EOT]
    out: list[int] = []
    for a, b in zip([0, *ends], ends):
        out += [*tok.encode_array(text[a:b]).tolist(), eot]
    return out + tok.encode_array(text[ends[-1] if ends else 0 :]).tolist()


def _reference(tok: ByteBPETokenizer, text: str, ends: list[int]) -> list[int]:
    """The plain reference, document by document, joined by ``<|endoftext|>``."""
    eot = tok.special_ids[EOT]
    pattern = ref.PATTERNS[tok.pattern]
    out: list[int] = []
    for a, b in zip([0, *ends], [*ends, len(text)]):
        out += ref.encode(text[a:b], tok.merges, tok.specials, False, pattern) + [eot]
    return out[:-1]


@pytest.fixture(scope="module")
def toks(wikitext2_text) -> list[ByteBPETokenizer]:
    text = wikitext2_text[:60_000] + ADVERSARIAL * 20
    return [ByteBPETokenizer.train(text, 256 + 200 + 1, pattern=p) for p in ("gpt2", "gpt4")]


def _fresh(tok: ByteBPETokenizer) -> ByteBPETokenizer:
    return ByteBPETokenizer(merges=tok.merges, specials=tok.specials, pattern=tok.pattern)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_TEXT, st.lists(st.integers(0, 30), max_size=6))
def test_pretokens_with_document_bounds_equal_each_document_split_alone(text, cuts):
    bounds = np.array(sorted(min(c, len(text)) for c in cuts), dtype=np.int64)
    cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    starts, lens = byte_bpe_pretokens.pretoken_spans(cps, bounds)
    found = [text[s : s + n] for s, n in zip(starts.tolist(), lens.tolist())]
    edges = [0, *bounds.tolist(), len(text)]
    assert found == [t for a, b in zip(edges, edges[1:]) for t in regex.findall(ref.GPT2_PATTERN, text[a:b])]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_TEXT, st.lists(st.integers(0, 30), max_size=6))
def test_documents_at_any_boundary_equal_the_reference(toks, text, cuts):
    ends = sorted(min(c, len(text)) for c in cuts)  # repeats: empty documents
    for tok in toks:
        assert tok.encode_documents(text, ends).tolist() == _reference(tok, text, ends)


def test_real_articles_in_one_pass_equal_one_by_one_and_the_reference(toks, wikitext2_text):
    text = wikitext2_text[:150_000]
    ends = _article_ends(text)
    assert len(ends) >= 3
    for tok in toks:
        ids = _fresh(tok).encode_documents(text, ends)
        assert ids.dtype == np.uint16
        assert ids.tolist() == _one_by_one(tok, text, ends) == _reference(tok, text, ends)
        assert ids.tolist().count(tok.special_ids[EOT]) == len(ends)


def test_every_boundary_in_adversarial_text_equals_one_by_one(toks):
    """A boundary at each position of text made to break the rules (inside a run of spaces, after a space, before
    a letter, inside a digit run, around a contraction, between emoji), one at a time, then all at once, then
    every position twice (empty documents), and a text that is only document ends."""
    text = ADVERSARIAL
    for tok in toks:
        for p in range(len(text) + 1):
            assert tok.encode_documents(text, [p]).tolist() == _one_by_one(tok, text, [p]), (tok.pattern, p)
        every = list(range(len(text) + 1))
        assert (
            tok.encode_documents(text, every).tolist() == _one_by_one(tok, text, every) == _reference(tok, text, every)
        )
        twice = sorted(every * 2)
        assert tok.encode_documents(text, twice).tolist() == _one_by_one(tok, text, twice)
        assert tok.encode_documents("", [0, 0]).tolist() == [tok.special_ids[EOT]] * 2
        assert tok.encode_documents("", []).tolist() == []


def test_documents_across_pieces_and_a_full_table_change_no_id(toks, wikitext2_text, monkeypatch):
    """Pieces cut inside and at document ends and the table of pre-tokens emptied when full give the same ids."""
    from mygpt.tokenizers import byte_bpe

    tok = toks[0]
    text = wikitext2_text[:80_000] + ADVERSARIAL
    ends = _article_ends(text) + [len(text) - 10, len(text) - 10]
    expected = _one_by_one(tok, text, ends)
    real_bounds = byte_bpe_pretokens.piece_bounds
    monkeypatch.setattr(byte_bpe_pretokens, "piece_bounds", lambda t, size=0: real_bounds(t, 3_000))
    monkeypatch.setattr(byte_bpe, "CACHE_PRETOKENS", 500)
    fresh = _fresh(tok)
    assert fresh.encode_documents(text, ends).tolist() == expected
    assert fresh.encode_documents(text, ends).tolist() == expected  # from a table that holds the text already


def test_an_over_long_pre_token_is_judged_per_document(toks, monkeypatch):
    """A run that is long only across a document end encodes; one long within a document is refused as the
    document-by-document path refuses it."""
    monkeypatch.setattr(byte_bpe_pretokens, "MAX_PRETOKEN_BYTES", 1000)
    tok = _fresh(toks[0])
    text = "x " + "a" * 600 + "a" * 600 + " y"
    ends = [602]
    assert tok.encode_documents(text, ends).tolist() == _reference(tok, text, ends)
    with pytest.raises(UserError, match="holds one pre-token of 1,201 bytes"):
        tok.encode_documents(text, [1])
    with pytest.raises(UserError, match="document ends must be sorted offsets"):
        tok.encode_documents(text, [5, 3])


def test_a_chunk_with_byte_offsets_in_non_ascii_text_equals_its_documents(toks, wikitext2_text, tmp_path):
    """The shards stage's call: document ends as file offsets in bytes, in text with multi-byte characters."""
    text = "Ünïcödé 中文 😀 prologue\n" + wikitext2_text[:40_000] + ADVERSARIAL
    data = text.encode("utf-8")
    path = tmp_path / "c.txt"
    path.write_bytes(b"skip " + data)
    ends = [len(text[:e].encode("utf-8")) for e in [0, *_article_ends(text), 3, 3]]
    ends = sorted(5 + e for e in ends)
    for tok in toks:
        ids, stats = encode_chunk(_fresh(tok), path, 5, 5 + len(data), ends=ends)
        expected: list[int] = []
        for a, b in zip([5, *ends], ends):
            expected += [*tok.encode_array(path.read_bytes()[a:b].decode("utf-8")).tolist(), tok.special_ids[EOT]]
        expected += tok.encode_array(path.read_bytes()[ends[-1] :].decode("utf-8")).tolist()
        assert ids.tolist() == expected and stats.tokens == len(expected) and stats.chars == len(text)
        whole, _ = encode_chunk(tok, path, 5, 5 + len(data))  # a chunk in which no document ends
        assert whole.tolist() == tok.encode_array(text).tolist()
        with pytest.raises(UserError, match="inside a UTF-8 character"):
            encode_chunk(tok, path, 5, 5 + len(data), ends=[5 + 1])  # "Ü" is two bytes
