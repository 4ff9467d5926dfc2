"""The chunked file encoder: same ids for any chunk size, in any order, safe cuts, resume, errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mygpt.errors import UserError
from mygpt.tokenizers.bpe import BPETokenizer
from mygpt.tokenizers.bpe_chunks import chunk_bounds, encode_chunk
from mygpt.tokenizers.bpe_word_encoder import EncodeStats
from mygpt.tokenizers.bpe_words import SAFE_CUT_RE
from tests.support.bpe_words import iter_encode_file


def _concat(parts, dtype=np.uint16):
    return np.concatenate([p[3] for p in parts]) if parts else np.zeros(0, dtype)


def _merged_stats(parts):
    total = EncodeStats()
    for p in parts:
        total.merge(p[4])
    return total


@pytest.fixture(scope="module")
def multibyte_file(tmp_path_factory, wikitext2_text):
    """~300 KB of real text with multibyte characters and unusual Unicode whitespace mixed in."""
    extra = " naïve café 你好世界 😀😀 x\u3000y\xa0z\u2028\u2029 \u200a—–… Ωμέγα \x1c\x85end\r\n"
    pieces = []
    text = wikitext2_text[:300_000]
    for i in range(0, len(text), 20_000):
        pieces.append(text[i : i + 20_000])
        pieces.append(extra)
    body = "".join(pieces)
    path = tmp_path_factory.mktemp("enc") / "mb.txt"
    path.write_bytes(body.encode("utf-8"))
    return path, body


@pytest.fixture(scope="module")
def tok(wikitext2_text):
    # trained on part of the text only, so 'skip' really drops characters (the CJK, emoji, ...)
    return BPETokenizer.from_corpus(wikitext2_text[:200_000], 300)


def test_chunking_never_changes_the_ids(multibyte_file, tok):
    path, body = multibyte_file
    want, want_stats = tok.encode_corpus(body, return_stats=True)
    assert want_stats.skipped_positions > 0
    for chunk in (64, 1000, 4099, 1 << 16, 8 << 20):
        parts = list(iter_encode_file(tok, path, chunk_bytes=chunk))
        np.testing.assert_array_equal(_concat(parts), want)
        st = _merged_stats(parts)
        assert st == want_stats
        data = body.encode("utf-8")
        assert [p[0] for p in parts] == list(range(len(parts)))
        assert parts[0][1] == 0 and parts[-1][2] == len(data)
        for (_, _, end, _, _), (_, start, _, _, _) in zip(parts, parts[1:]):
            assert end == start
            before = data[:end].decode("utf-8")  # raises if the cut splits a character
            after = data[end:].decode("utf-8")
            assert not before[-1].isspace() and after[0].isspace()
        if chunk == 64:
            assert len(parts) > 1000


def test_chunks_encoded_in_any_order_by_fresh_encoders_match(multibyte_file, tok):
    """What a Dask worker does: encode one chunk with its own tokenizer, in whatever order chunks arrive."""
    path, body = multibyte_file
    one = list(iter_encode_file(tok, path, chunk_bytes=20_000))
    bounds = list(chunk_bounds(path, 20_000))
    assert [p[:3] for p in one] == bounds
    workers = [BPETokenizer.from_state(tok.state()) for _ in range(2)]
    got = {}
    for k, (idx, start, end) in enumerate(reversed(bounds)):
        got[idx] = encode_chunk(workers[k % 2], path, start, end)
    for idx, _, _, ids, stats in one:
        np.testing.assert_array_equal(got[idx][0], ids)
        assert got[idx][1] == stats
    np.testing.assert_array_equal(np.concatenate([got[i][0] for i in sorted(got)]), tok.encode_corpus(body))


def test_tiny_chunks(multibyte_file, tok):
    path, body = multibyte_file
    small = body[:30_000]
    p2 = path.parent / "small.txt"
    p2.write_bytes(small.encode("utf-8"))
    parts = list(iter_encode_file(tok, p2, chunk_bytes=64))
    np.testing.assert_array_equal(_concat(parts), tok.encode_corpus(small))


def test_bounds_of_a_prefix_end_there(multibyte_file):
    path, body = multibyte_file
    data = body.encode("utf-8")
    end = len(data[:100_000].decode("utf-8", errors="ignore").encode("utf-8"))
    bounds = list(chunk_bounds(path, 7000, end=end))
    assert bounds[-1][2] == end and all(b[2] == c[1] for b, c in zip(bounds, bounds[1:]))
    assert bounds[:-1] == list(chunk_bounds(path, 7000))[: len(bounds) - 1]


def test_chunk_without_safe_cut_grows(tmp_path, tok):
    body = "x" * 5000 + "   " + "y" * 300 + " " + "\n\n\n"
    path = tmp_path / "long.txt"
    path.write_text(body, encoding="utf-8")
    bounds = list(chunk_bounds(path, 64))
    assert bounds == [(0, 0, 5000), (1, 5000, 5303), (2, 5303, len(body))]
    parts = list(iter_encode_file(tok, path, chunk_bytes=64))
    np.testing.assert_array_equal(_concat(parts), tok.encode_corpus(body))


def test_whitespace_only_and_empty_files(tmp_path, tok):
    ws = tmp_path / "ws.txt"
    ws.write_text(" \n\t  \n", encoding="utf-8")
    parts = list(iter_encode_file(tok, ws, chunk_bytes=2))
    assert len(parts) == 1
    np.testing.assert_array_equal(_concat(parts), tok.encode_corpus(" \n\t  \n"))
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert list(iter_encode_file(tok, empty)) == []


def test_not_utf8_names_file_and_offset(tmp_path, tok):
    good = ("the cat sat on the mat " * 40).encode()
    data = good + b"caf\xe9 au lait " + good
    path = tmp_path / "latin1.txt"
    path.write_bytes(data)
    with pytest.raises(UserError, match=rf"latin1\.txt.*offset {len(good) + 3}"):
        list(iter_encode_file(tok, path, chunk_bytes=100))
    with pytest.raises(UserError, match=rf"offset {len(good) + 3}"):
        list(iter_encode_file(tok, path, chunk_bytes=1 << 20))
    with pytest.raises(UserError, match=rf"latin1\.txt.*offset {len(good) + 3}"):
        encode_chunk(tok, path, 0, len(data))


def test_error_policy(tmp_path, tok):
    path = tmp_path / "unk.txt"
    path.write_text("the cat 你好 sat", encoding="utf-8")
    with pytest.raises(UserError, match="U\\+4F60"):
        list(iter_encode_file(tok, path, unk_policy="error"))


def test_byte_fallback_file_round_trip(multibyte_file, wikitext2_text):
    path, body = multibyte_file
    tok = BPETokenizer.from_corpus(wikitext2_text[:100_000], 100, byte_fallback=True)
    parts = list(iter_encode_file(tok, path, chunk_bytes=5000))
    ids = _concat(parts)
    np.testing.assert_array_equal(ids, tok.encode_corpus(body))
    assert tok.decode(ids) == body


def test_a_word_longer_than_the_bound_is_refused_not_read_whole(tmp_path):
    """One 2 MiB "word" (no whitespace after a non-space) used to become one 2 MiB chunk (40 MB: 40 MB, and a
    worker's memory grew with it): now the chunker refuses it, naming the file and where."""
    from mygpt.errors import UserError
    from mygpt.tokenizers.bpe_chunks import MAX_WORD_BYTES, chunk_bounds

    path = tmp_path / "oneword.txt"
    path.write_bytes(b"fine words here\n" + b"a" * (2 * MAX_WORD_BYTES) + b" end\n")
    with pytest.raises(UserError, match=rf"{path}: no word ends in the {MAX_WORD_BYTES:,} bytes after byte 1,000"):
        list(chunk_bounds(path, 1000))
    path.write_bytes(b"fine words here\n" + b"a" * (MAX_WORD_BYTES // 2) + b" end\n")  # long, within the bound
    bounds = list(chunk_bounds(path, 1000))
    assert bounds[0][1] == 0 and bounds[-1][2] == path.stat().st_size


_BYTE_TEXT = st.lists(
    st.sampled_from([*"ab1.' \n\t\r\u3000\x1c\x1f\x85\xa0é🚀sЖ語。", "'s", " the", "\n\n", " Это", "\u0301"]),
    max_size=40,
).map("".join)


@pytest.fixture(scope="module")
def byte_tokenizers(wikitext2_text):
    from mygpt.tokenizers.byte_bpe import ByteBPETokenizer

    toks = [ByteBPETokenizer.train(wikitext2_text[:50_000], 256 + 80 + 1, pattern=p) for p in ("gpt2", "gpt4")]
    odd = "a.\nb 's the\n\n1. é🚀\u3000 a  \n\t.\r\n " * 30  # merges across punctuation, newlines, spaces
    return [*toks, *(ByteBPETokenizer.train(odd, 256 + 40 + 1, pattern=p) for p in ("gpt2", "gpt4"))]


@settings(max_examples=200, deadline=None)
@given(text=_BYTE_TEXT)
def test_byte_safe_cuts_never_change_the_ids(byte_tokenizers, text):
    """Cut at every byte-level safe cut, either split pattern encodes the pieces to the whole text's ids."""
    from mygpt.tokenizers.bpe_chunks import BYTE_SAFE_CUT_RE

    cuts = [0, *(m.start() for m in BYTE_SAFE_CUT_RE.finditer(text)), len(text)]
    for tok in byte_tokenizers:
        pieces = [tok.encode_array(text[a:b]) for a, b in itertools.pairwise(cuts)]
        assert np.array_equal(np.concatenate(pieces) if pieces else np.zeros(0), tok.encode_array(text))


def test_the_chapters_safe_cut_is_not_safe_for_gpt4():
    """Why the byte kind has its own cut: GPT-4's pattern keeps a newline with the punctuation before it, so a
    merge of the two spans the chapter's cut (whitespace after non-whitespace)."""
    from mygpt.tokenizers.byte_bpe import ByteBPETokenizer

    tok = ByteBPETokenizer.train("a.\nB " * 50, 256 + 1 + 1, pattern="gpt4")
    assert tok.merges == ((b".", b"\n"),)
    text = "a.\nB"
    cut = SAFE_CUT_RE.search(text).start()
    chapter_cut = np.concatenate([tok.encode_array(text[:cut]), tok.encode_array(text[cut:])])
    assert chapter_cut.tolist() != tok.encode_array(text).tolist() == [97, 256, 66]


def test_text_in_any_script_is_cut_for_the_byte_kind(tmp_path, byte_tokenizers):
    """Cyrillic or CJK text with spaces but no ASCII letter is cut at its spaces (the rule was ASCII-only, so
    such a corpus found no cut within a bounded window and was refused), and the chunks' ids equal the whole's."""
    from mygpt.tokenizers.bpe_chunks import BYTE_SAFE_CUT_RE

    text = "Это русский текст без латиницы 日本語の 文章です。\n" * 400
    path = tmp_path / "ru.txt"
    path.write_text(text, encoding="utf-8")
    bounds = list(chunk_bounds(path, 1000, cut_re=BYTE_SAFE_CUT_RE))
    assert len(bounds) > 10
    data = path.read_bytes()
    for tok in byte_tokenizers:
        pieces = [tok.encode_array(data[a:b].decode("utf-8")) for _, a, b in bounds]
        assert np.array_equal(np.concatenate(pieces), tok.encode_array(text))
