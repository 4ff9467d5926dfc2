"""The tokenizer stage (bpe): training slice, tokenizer file, the missing-character analysis, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.mirror import MEMBER, build_wikitext_zip, make_zip
from mygpt.bpe import BPETokenizer
from mygpt.errors import UserError
from tasks import tokenizer as B
from tests.support import stages


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, wikitext2_path):
    root = tmp_path_factory.mktemp("bpe-art")
    zpath = root / "w.zip"
    build_wikitext_zip(zpath, data_dir=wikitext2_path.parent)
    return root, stages.corpus(root, source_url=zpath.as_uri())


def test_tokenizer_and_stats(corpus):
    root, cref = corpus
    ref = stages.tokenizer(root, cref, num_merges=64, bpe_train_bytes=100_000)
    out = Path(ref["path"])
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "stats.json", "tokenizer.json"]
    tok = BPETokenizer.load(out / "tokenizer.json")
    raw = (Path(cref["path"]) / "wiki.train.txt").read_bytes()[:100_000]
    text = raw.decode("utf-8", errors="ignore")
    assert tok == BPETokenizer.from_corpus(text, 64)
    stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    assert stats["vocab_size"] == tok.vocab_size == len(tok.chars) + 64 and stats["alphabet_size"] == len(tok.chars)
    assert stats["first_merges"] == [list(m) for m in tok.merges[:30]]
    assert stats["train_bytes"] == 100_000 and stats["train_chars"] == len(text)
    assert stats["chars_per_token"] == round(len(text) / len(tok.encode_corpus(text)), 4)
    # the chapter's analysis, done naively over the full wikipedia.txt
    full = (Path(cref["path"]) / "wikipedia.txt").read_text(encoding="utf-8")
    missing = set(full) - set(text)
    assert stats["missing_distinct"] == len(missing) > 0
    assert stats["missing_positions"] == sum(1 for c in full if c in missing)
    assert stats["corpus_chars"] == len(full)
    assert stats["missing_fraction"] == pytest.approx(stats["missing_positions"] / len(full))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"] == {"num_merges": 64, "bpe_train_bytes": 100_000}
    assert manifest["inputs"]["corpus"]["version"] == cref["version"]
    md = B.STAGE.report(manifest)
    assert "vocab size" in md and "missing from the slice" in md


def test_whole_split_when_zero(corpus):
    root, cref = corpus
    ref = stages.tokenizer(root, cref, num_merges=0, bpe_train_bytes=0)
    stats = json.loads((Path(ref["path"]) / "stats.json").read_text())
    assert stats["train_bytes"] == (Path(cref["path"]) / "wiki.train.txt").stat().st_size
    train = (Path(cref["path"]) / "wiki.train.txt").read_text(encoding="utf-8")
    full = (Path(cref["path"]) / "wikipedia.txt").read_text(encoding="utf-8")
    assert stats["num_merges"] == 0 and stats["missing_distinct"] == len(set(full) - set(train))


def test_slice_is_cut_back_to_a_character_boundary(tmp_path):
    body = " ab 戦場 ab\n"  # '戦' is 3 bytes: offsets 4..6
    data = make_zip({MEMBER.format(split="train"): body * 10, MEMBER.format(split="valid"): " ü\n",
                     MEMBER.format(split="test"): " x\n"})
    zpath = tmp_path / "w.zip"
    zpath.write_bytes(data)
    cref = stages.corpus(tmp_path / "art", source_url=zpath.as_uri())
    text, used = B.read_slice(Path(cref["path"]) / "wiki.train.txt", 6)
    assert (text, used) == (" ab ", 4)
    ref = stages.tokenizer(tmp_path / "art", cref, num_merges=3, bpe_train_bytes=6)
    stats = json.loads((Path(ref["path"]) / "stats.json").read_text())
    assert stats["train_bytes"] == 4 and stats["alphabet_size"] == 3  # ' ', 'a', 'b'
    assert stats["missing_distinct"] == 5  # 戦 場 \n ü x
    assert stats["missing_positions"] == 10 + 10 + 10 + 2 + 2


def test_missing_char_stats_streams_across_multibyte_pieces(tmp_path):
    text = "aé戦😀b" * 50 + "\n"
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    got = B.missing_char_stats(path, {"a", "b"}, piece_bytes=7)
    assert got["corpus_chars"] == len(text)
    assert got["missing_distinct"] == 4 and got["missing_positions"] == 151
    assert {t["char"] for t in got["missing_top"]} == {"é", "戦", "😀", "\n"}


def test_empty_train_split_is_a_user_error(tmp_path):
    zpath = tmp_path / "w.zip"
    zpath.write_bytes(make_zip({MEMBER.format(split=s): (" = Only header = \n" if s == "train" else " x\n")
                                for s in ("train", "valid", "test")}))
    cref = stages.corpus(tmp_path / "art", source_url=zpath.as_uri())
    with pytest.raises(UserError, match="wiki.train.txt is empty"):
        stages.tokenizer(tmp_path / "art", cref, num_merges=3)
    assert not [p for p in (tmp_path / "art" / "tokenizer").iterdir() if not p.name.startswith(".")]


@pytest.mark.parametrize("kwargs, message", [
    ({"num_merges": -1}, "num_merges must be an integer >= 0"),
    ({"num_merges": 2.5}, "num_merges must be an integer >= 0"),
    ({"num_merges": True}, "num_merges must be an integer >= 0"),
    ({"bpe_train_bytes": -5}, "bpe_train_bytes must be an integer >= 0"),
    ({"bpe_train_bytes": "50MB"}, "bpe_train_bytes must be an integer >= 0"),
])
def test_settings_reject(kwargs, message):
    with pytest.raises(UserError, match=message):
        B.TokenizerSettings.parse(kwargs)


def test_settings_defaults_are_the_chapters():
    assert B.TokenizerSettings().version_params() == {"num_merges": 1024, "bpe_train_bytes": 50_000_000}
