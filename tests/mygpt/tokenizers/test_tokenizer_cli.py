"""``mygpt tokenizer train`` / ``mygpt tokenizer encode`` as a user runs them (subprocesses on real text): the files
load in Hugging Face with the reference's merges and ids, a GPT-2-style tokenizer.json encodes too, and every bad
file is one ``error:`` line with exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mygpt.tokenizers import byte_bpe_reference as ref
from tests.support import REPO

EOT = "<|endoftext|>"


def mygpt(*argv) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mygpt.cli", "tokenizer", *map(str, argv)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def texts(tmp_path_factory, shakespeare_text, wikitext2_text):
    d = tmp_path_factory.mktemp("texts")
    (d / "train.txt").write_text(shakespeare_text[:60_000], encoding="utf-8")
    (d / "other.txt").write_text(wikitext2_text[:60_000] + f" 😀 中文 {EOT} x{EOT}", encoding="utf-8")
    return d


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4"])
def test_train_writes_a_hugging_face_tokenizer_json_with_the_reference_merges(pattern, texts, tmp_path):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    out = tmp_path / "tok"
    proc = mygpt(
        "train", texts / "train.txt", "--vocab-size", 256 + 150 + 2, "--pattern", pattern, "--special-token", EOT,
        "--special-token", "<|pad|>", "--out", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "256 bytes + 150 merges + 2 special tokens = vocab 408" in proc.stdout
    path = out / "tokenizer.json"
    merges = ref.train((texts / "train.txt").read_text(encoding="utf-8"), 150, [EOT], ref.PATTERNS[pattern])
    hf_json = json.loads(path.read_text(encoding="utf-8"))
    assert len(hf_json["model"]["merges"]) == 150
    other = (texts / "other.txt").read_text(encoding="utf-8")
    expected = ref.encode(other, merges, [EOT, "<|pad|>"], True, ref.PATTERNS[pattern])
    assert Tokenizer.from_file(str(path)).encode(other).ids == expected
    fast = PreTrainedTokenizerFast(tokenizer_file=str(path))
    assert fast(other)["input_ids"] == expected
    assert fast.decode(expected) == other


def test_encode_writes_the_reference_ids_and_keeps_specials_ordinary_unless_allowed(texts, tmp_path):
    out = tmp_path / "tok"
    assert mygpt("train", texts / "train.txt", "--vocab-size", 256 + 150 + 1, "--out", out).returncode == 0
    merges = ref.train((texts / "train.txt").read_text(encoding="utf-8"), 150, [EOT])
    other = (texts / "other.txt").read_text(encoding="utf-8")
    for flags, allowed in (((), False), (("--allow-special",), True)):
        ids_path = tmp_path / f"ids-{allowed}.npy"
        proc = mygpt("encode", "--tokenizer", out / "tokenizer.json", texts / "other.txt", "--out", ids_path, *flags)
        assert proc.returncode == 0, proc.stderr
        ids = np.load(ids_path)
        assert ids.ndim == 1 and np.issubdtype(ids.dtype, np.integer)
        assert ids.tolist() == ref.encode(other, merges, [EOT], allowed)
        assert (406 in ids.tolist()) == allowed


def test_encode_takes_a_gpt2_style_tokenizer_json(texts, tmp_path):
    from tokenizers import ByteLevelBPETokenizer, normalizers

    from mygpt.tokenizers.byte_bpe import ByteBPETokenizer
    from mygpt.tokenizers.byte_bpe_files import gpt2_vocab_and_merges

    vocab, merges = gpt2_vocab_and_merges(
        ByteBPETokenizer.train((texts / "train.txt").read_text(encoding="utf-8"), 256 + 150 + 1)
    )
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text(merges, encoding="utf-8")
    gpt2 = ByteLevelBPETokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    gpt2.save(str(tmp_path / "gpt2.json"))
    proc = mygpt("encode", "--tokenizer", tmp_path / "gpt2.json", texts / "other.txt", "--out", tmp_path / "ids.npy")
    assert proc.returncode == 0, proc.stderr
    other = (texts / "other.txt").read_text(encoding="utf-8")
    assert np.load(tmp_path / "ids.npy").tolist() == gpt2.encode(other).ids
    # an ordinary added token ("thee") is matched wherever it stands, as HF does
    gpt2.add_tokens(["thee"])
    gpt2.save(str(tmp_path / "added.json"))
    (tmp_path / "thee.txt").write_text(other + " xtheex thee", encoding="utf-8")
    proc = mygpt("encode", "--tokenizer", tmp_path / "added.json", tmp_path / "thee.txt", "--out", tmp_path / "a.npy")
    assert proc.returncode == 0, proc.stderr
    assert np.load(tmp_path / "a.npy").tolist() == gpt2.encode(other + " xtheex thee").ids
    assert gpt2.token_to_id("thee") in np.load(tmp_path / "a.npy").tolist()
    # a file that lowercases first is encoded as that file says (HF's whole path), not as a plain GPT-2 one
    gpt2._tokenizer.normalizer = normalizers.Lowercase()
    gpt2.save(str(tmp_path / "lower.json"))
    proc = mygpt("encode", "--tokenizer", tmp_path / "lower.json", texts / "other.txt", "--out", tmp_path / "lower.npy")
    assert proc.returncode == 0, proc.stderr
    lowered = np.load(tmp_path / "lower.npy").tolist()
    assert lowered == gpt2.encode(other).ids != np.load(tmp_path / "ids.npy").tolist()


def test_bad_files_give_one_error_line_and_exit_2(texts, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "notjson.json").write_text("not json", encoding="utf-8")
    wordlevel = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    wordlevel.save(str(tmp_path / "wordlevel.json"))
    plain_bpe = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")]))
    plain_bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    plain_bpe.save(str(tmp_path / "plain_bpe.json"))
    assert mygpt("train", texts / "train.txt", "--vocab-size", 300, "--out", tmp_path / "tok").returncode == 0
    tok = tmp_path / "tok" / "tokenizer.json"
    ids = tmp_path / "ids.npy"
    cases = [
        (("encode", "--tokenizer", tmp_path / "missing.json", texts / "other.txt"), "does not exist"),
        (("encode", "--tokenizer", tmp_path / "notjson.json", texts / "other.txt"), "is not a JSON tokenizer.json"),
        (("encode", "--tokenizer", tmp_path / "wordlevel.json", texts / "other.txt"), "model type 'WordLevel'"),
        (("encode", "--tokenizer", tmp_path / "plain_bpe.json", texts / "other.txt"), "not a byte-level BPE"),
        (("encode", "--tokenizer", tok, tmp_path / "latin1.txt"), "is not valid UTF-8 (bad byte 0xe9"),
        (("encode", "--tokenizer", tok, tmp_path / "missing.txt"), "missing.txt does not exist"),
    ]
    for argv, message in cases:
        proc = mygpt(*argv, "--out", ids)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (argv, proc.stderr)
        assert message in lines[0], (argv, proc.stderr)
        assert not ids.exists()
    for argv, message in [
        (("train", tmp_path / "latin1.txt", "--vocab-size", 300), "is not valid UTF-8"),
        (("train", texts / "train.txt", "--vocab-size", 200), "--vocab-size must be an integer >= 257"),
    ]:
        proc = mygpt(*argv, "--out", tmp_path / "new")
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
        assert message in proc.stderr and not (tmp_path / "new").exists()
