"""The tokenizer stage (bpe): training slice, word counting on Dask, tokenizer file, stats, errors."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from mygpt.errors import UserError
from mygpt.tokenizers.bpe import BPETokenizer
from tasks import tokenizer as B
from tests.support import stages
from tests.support.corpora import corpus_from_text, shared_splits


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("bpe-art")
    return root, corpus_from_text(root, tmp_path_factory.mktemp("bpe-src"), shared_splits(), article_index=True)


def test_tokenizer_and_stats(corpus):
    root, cref = corpus
    ref = stages.tokenizer(
        root, cref, num_merges=64, bpe_train_bytes=100_000, run={"workers": 1, "chunk_bytes": 20_000}
    )
    out = Path(ref["path"])
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "stats.json", "tokenizer.json"]
    tok = BPETokenizer.load(out / "tokenizer.json")
    raw = (Path(cref["path"]) / "wiki.train.txt").read_bytes()[:100_000]
    text = raw.decode("utf-8", errors="ignore")
    assert tok == BPETokenizer.from_corpus(text, 64)  # counted in 5 chunks, trained: the in-memory trainer's merges
    stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    assert stats["vocab_size"] == tok.vocab_size == len(tok.chars) + 64 and stats["alphabet_size"] == len(tok.chars)
    assert stats["first_merges"] == [list(m) for m in tok.merges[:30]]
    assert stats["train_bytes"] == 100_000 and stats["train_chars"] == len(text)
    # chars per token from the trainer's final state = a real encode of the slice
    assert stats["train_tokens"] == len(tok.encode_corpus(text))
    assert stats["chars_per_token"] == round(len(text) / len(tok.encode_corpus(text)), 4)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"] == {"num_merges": 64, "bpe_train_bytes": 100_000}
    assert manifest["inputs"]["corpus"]["version"] == cref["version"]
    md = B.STAGE.report(manifest)
    assert "vocab size" in md and "missing from the slice" in md and "wiki-shards" in md


def test_merges_do_not_depend_on_workers_or_chunks(corpus, tmp_path):
    """One in-process worker, a local cluster of two processes, chunks of any size: the same tokenizer file."""
    root, cref = corpus
    one = stages.tokenizer(root, cref, num_merges=200, bpe_train_bytes=0, run={"workers": 1})
    shutil.copytree(Path(root) / "corpus", tmp_path / "art" / "corpus")
    two = stages.tokenizer(
        tmp_path / "art", cref, num_merges=200, bpe_train_bytes=0, run={"workers": 2, "chunk_bytes": 50_000}
    )
    assert two["version"] == one["version"]
    m1, m2 = (json.loads((Path(r["path"]) / "manifest.json").read_text()) for r in (one, two))
    assert m2["files"]["tokenizer.json"] == m1["files"]["tokenizer.json"]
    train = (Path(cref["path"]) / "wiki.train.txt").read_text(encoding="utf-8")
    assert BPETokenizer.load(Path(two["path"]) / "tokenizer.json") == BPETokenizer.from_corpus(train, 200)
    s1, s2 = (json.loads((Path(r["path"]) / "stats.json").read_text()) for r in (one, two))
    assert s1["train_tokens"] == s2["train_tokens"] == len(BPETokenizer.from_corpus(train, 200).encode_corpus(train))


def test_whole_split_when_zero(corpus):
    root, cref = corpus
    ref = stages.tokenizer(root, cref, num_merges=0, bpe_train_bytes=0, run={"workers": 1})
    stats = json.loads((Path(ref["path"]) / "stats.json").read_text())
    assert stats["train_bytes"] == (Path(cref["path"]) / "wiki.train.txt").stat().st_size
    train = (Path(cref["path"]) / "wiki.train.txt").read_text(encoding="utf-8")
    assert stats["num_merges"] == 0 and stats["train_chars"] == stats["train_tokens"] == len(train)
    assert stats["alphabet_size"] == len(set(train))


def test_slice_is_cut_back_to_a_character_boundary(tmp_path):
    body = " ab 戦場 ab\n"  # '戦' is 3 bytes: offsets 4..6
    cref = corpus_from_text(tmp_path / "art", tmp_path / "src", {"train": body * 10, "valid": " ü\n", "test": " x\n"})
    train = Path(cref["path"]) / "wiki.train.txt"
    raw = train.read_bytes()
    for n in range(len(raw) + 3):  # the rule: the longest prefix of at most n bytes that is whole characters
        want = min(n, len(raw)) if n else len(raw)
        while want and raw[:want].decode("utf-8", errors="ignore").encode() != raw[:want]:
            want -= 1
        assert B.slice_end(train, n) == want, n
    assert B.slice_end(train, 6) == 4
    ref = stages.tokenizer(tmp_path / "art", cref, num_merges=3, bpe_train_bytes=6, run={"workers": 1})
    stats = json.loads((Path(ref["path"]) / "stats.json").read_text())
    assert stats["train_bytes"] == 4 and stats["alphabet_size"] == 3  # ' ', 'a', 'b'


def test_not_utf8_slice_is_a_user_error(tmp_path, corpus):
    root, cref = corpus
    art = tmp_path / "art"
    shutil.copytree(Path(root) / "corpus", art / "corpus")
    train = art / "corpus" / cref["version"] / "wiki.train.txt"
    data = bytearray(train.read_bytes())
    data[5000] = 0xFF
    train.chmod(0o644)
    train.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"wiki\.train\.txt.* not valid UTF-8: invalid byte at offset 5000"):
        stages.tokenizer(art, cref, num_merges=3, bpe_train_bytes=0, run={"workers": 1, "chunk_bytes": 1000})


def test_empty_train_split_is_a_user_error(tmp_path):
    splits = {"train": " = Only header = \n", "valid": " x\n", "test": " x\n"}
    cref = corpus_from_text(tmp_path / "art", tmp_path / "src", splits)
    with pytest.raises(UserError, match=r"wiki\.train\.txt is empty"):
        stages.tokenizer(tmp_path / "art", cref, num_merges=3, run={"workers": 1})
    assert not [p for p in (tmp_path / "art" / "tokenizer").iterdir() if not p.name.startswith(".")]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_merges": -1}, "num_merges must be an integer >= 0"),
        ({"num_merges": 2.5}, "num_merges must be an integer >= 0"),
        ({"num_merges": True}, "num_merges must be an integer >= 0"),
        ({"bpe_train_bytes": -5}, "bpe_train_bytes must be an integer >= 0"),
        ({"bpe_train_bytes": "50MB"}, "bpe_train_bytes must be an integer >= 0"),
    ],
)
def test_settings_reject(kwargs, message):
    with pytest.raises(UserError, match=message):
        B.TokenizerSettings.parse(kwargs)


def test_settings_defaults_are_the_chapters():
    assert B.TokenizerSettings().version_params() == {"num_merges": 1024, "bpe_train_bytes": 50_000_000}


def test_byte_kind_equals_the_library_trained_on_the_same_slice(corpus):
    """kind=byte: the published tokenizer.json loads as the byte-level BPE the library trains on the same slice."""
    from mygpt.tokenizers.byte_bpe import ByteBPETokenizer

    root, cref = corpus
    ref = stages.tokenizer(root, cref, kind="byte", num_merges=60, bpe_train_bytes=100_000, run={"workers": 1})
    out = Path(ref["path"])
    tok = B.load_tokenizer(out)
    text = (Path(cref["path"]) / "wiki.train.txt").read_bytes()[:100_000].decode("utf-8", errors="ignore")
    assert tok == ByteBPETokenizer.train(text, 256 + 60 + 1)
    assert tok.vocab_size == 317 and tok.special_ids == {"<|endoftext|>": 316}
    stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    assert stats["vocab_size"] == 317 and stats["train_tokens"] == len(tok.encode_array(text))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"] == {"kind": "byte", "pattern": "gpt2", "num_merges": 60, "bpe_train_bytes": 100_000}
    md = B.STAGE.report(manifest)
    assert "byte-level BPE, gpt2 split" in md and "encode the slice" in md and "count words" not in md
    gpt4 = stages.tokenizer(root, cref, kind="byte", pattern="gpt4", num_merges=60, bpe_train_bytes=100_000)
    assert gpt4["version"] != ref["version"]
    assert B.load_tokenizer(Path(gpt4["path"])) == ByteBPETokenizer.train(text, 317, pattern="gpt4")


@pytest.mark.parametrize("kind", ["byte", "pretrained"])
def test_a_byte_level_kind_over_a_corpus_without_the_article_index_names_the_command(corpus, tmp_path, kind):
    """Its shards could not be built, so no tokenizer is published; the error says what to run."""
    root, indexed = corpus
    bare = corpus_from_text(root, tmp_path / "src", shared_splits())  # the same text, built without the index
    assert bare["version"] != indexed["version"]
    source = {}
    if kind == "pretrained":
        from mygpt.tokenizers.byte_bpe import ByteBPETokenizer

        (tmp_path / "tokenizer.json").write_text(ByteBPETokenizer.train("a b c ab ab", 256 + 2 + 1).to_json())
        source = {"source": str(tmp_path / "tokenizer.json")}
    message = (
        f"tokenizer.kind={kind} needs a corpus version with the article index (its shards end each article with "
        f"<|endoftext|>), and corpus/{bare['version']} has none (wiki.train.articles.npy); build one first: "
        "wiki-pipeline run --only corpus --param corpus.article_index=true"
    )
    with pytest.raises(UserError, match="^" + re.escape(message)):
        stages.tokenizer(root, bare, kind=kind, bpe_train_bytes=10_000, **source)


def test_chapter_kind_keeps_its_version_ids():
    """The default kind's version id stays what it is for a given corpus digest (pinned when inputs came to be
    named by their content digest); the byte kind's is another."""
    inputs = {"corpus": "0" * 64}
    assert B.STAGE.version(B.TokenizerSettings(), inputs) == "34f443058328"
    assert B.STAGE.version(B.TokenizerSettings(num_merges=48, bpe_train_bytes=200_000), inputs) == "6e3bb56c68c4"
    assert B.STAGE.version(B.TokenizerSettings(kind="byte"), inputs) != "34f443058328"
    with pytest.raises(UserError, match="pattern=gpt4 applies only to the byte-level BPE"):
        B.TokenizerSettings.parse({"pattern": "gpt4"}, "tokenizer")
