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
    (tmp_path / "deep.json").write_text("[" * 200_000 + "]" * 200_000, encoding="utf-8")  # past any recursion limit
    os.mkfifo(tmp_path / "fifo.json")  # never opened: reading one would wait for a writer
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
        (("encode", "--tokenizer", tmp_path / "deep.json", texts / "other.txt"), "deep.json nests its JSON objects"),
        (("encode", "--tokenizer", tmp_path / "fifo.json", texts / "other.txt"), "fifo.json is not a regular file"),
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


def _one_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], proc.stderr


def test_an_out_that_names_an_input_is_refused_and_the_input_kept(texts, tmp_path):
    assert mygpt("train", texts / "train.txt", "--vocab-size", 300, "--out", tmp_path / "tok").returncode == 0
    tok = tmp_path / "tok" / "tokenizer.json"
    text = tmp_path / "t.txt"
    text.write_text("hello world hello", encoding="utf-8")
    os.link(text, tmp_path / "hard.txt")
    os.symlink(tok, tmp_path / "link.json")
    before = {p: p.read_bytes() for p in (text, tok)}
    for out, what in ((text, "the text file"), (tok, "the tokenizer file"), (tmp_path / "hard.txt", "the text file"),
                      (tmp_path / "link.json", "the tokenizer file")):  # fmt: skip
        _one_error(mygpt("encode", "--tokenizer", tok, text, "--out", out), f"--out {out} is {what}")
    # train: DIR/tokenizer.json is the training text itself
    (tmp_path / "d").mkdir()
    own = tmp_path / "d" / "tokenizer.json"
    own.write_text("hello world hello", encoding="utf-8")
    _one_error(mygpt("train", own, "--vocab-size", 270, "--out", tmp_path / "d"), "is the text file")
    assert {p: p.read_bytes() for p in (text, tok)} == before and own.read_text() == "hello world hello"


def test_an_unwritable_out_is_refused_before_the_text_is_read(texts, tmp_path):
    tok = tmp_path / "tok"
    assert mygpt("train", texts / "train.txt", "--vocab-size", 270, "--out", tok).returncode == 0
    missing = tmp_path / "missing.txt"  # never read: the destination is checked first
    _one_error(mygpt("encode", "--tokenizer", tok / "tokenizer.json", missing, "--out", "/proc/x.npy"),
               "--out /proc/x.npy: cannot write in /proc")  # fmt: skip
    _one_error(mygpt("train", missing, "--vocab-size", 270, "--out", "/proc"), "--out /proc: cannot write in /proc")
    _one_error(mygpt("train", missing, "--vocab-size", 270, "--out", "/proc/new/dir"), "cannot write in /proc")
    _one_error(mygpt("train", missing, "--vocab-size", 270, "--out", texts / "train.txt"), "is not a directory")


def test_a_write_that_fails_at_the_end_is_one_error_line_and_leaves_nothing(texts, tmp_path):
    """A file-size limit (RLIMIT_FSIZE; Python ignores SIGXFSZ, so the write fails with EFBIG) lets the checks pass
    and the final write fail: an ``error:`` line, no temp file, no directory made."""
    import resource

    assert mygpt("train", texts / "train.txt", "--vocab-size", 300, "--out", tmp_path / "tok").returncode == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def limited(*argv) -> subprocess.CompletedProcess:
        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))

        return subprocess.run([sys.executable, "-m", "mygpt.cli", "tokenizer", *map(str, argv)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300, preexec_fn=limit)  # fmt: skip

    out = tmp_path / "out"
    out.mkdir()
    proc = limited("encode", "--tokenizer", tmp_path / "tok" / "tokenizer.json", texts / "other.txt",
                   "--out", out / "ids.npy")  # fmt: skip
    _one_error(proc, f"--out: cannot write {out / 'ids.npy'} (")  # numpy reports the short write
    proc = limited("train", texts / "train.txt", "--vocab-size", 300, "--out", out / "new" / "tok")
    _one_error(proc, f"--out: cannot write {out / 'new' / 'tok' / 'tokenizer.json'} (File too large)")
    assert list(out.iterdir()) == []


def test_ids_past_the_token_count_choose_the_dtype(texts, tmp_path):
    from tokenizers import Tokenizer

    assert mygpt("train", texts / "train.txt", "--vocab-size", 267, "--out", tmp_path / "tok").returncode == 0
    data = json.loads((tmp_path / "tok" / "tokenizer.json").read_text(encoding="utf-8"))
    sample = "hello hello hello"
    used = Tokenizer.from_str(json.dumps(data)).encode(sample).ids[0]
    vocab = data["model"]["vocab"]
    vocab[next(s for s, i in vocab.items() if i == used)] = 70_000  # a vocabulary with a gap: 267 tokens, id 70000
    (tmp_path / "sparse.json").write_text(json.dumps(data), encoding="utf-8")
    (tmp_path / "h.txt").write_text(sample, encoding="utf-8")
    proc = mygpt("encode", "--tokenizer", tmp_path / "sparse.json", tmp_path / "h.txt", "--out", tmp_path / "h.npy")
    assert proc.returncode == 0, proc.stderr
    ids = np.load(tmp_path / "h.npy")
    expected = Tokenizer.from_file(str(tmp_path / "sparse.json")).encode(sample).ids
    assert ids.dtype == np.uint32 and ids.tolist() == expected and 70_000 in expected


def test_a_special_spelled_like_a_byte_is_refused_before_training_and_makes_nothing(tmp_path):
    out = tmp_path / "left"
    _one_error(
        mygpt("train", tmp_path / "not-read.txt", "--vocab-size", 270, "--special-token", "!", "--out", out),
        "special token '!' is spelled like the token of byte 0x21",
    )
    assert not out.exists()


def test_tokenizer_paths_that_are_not_files_say_what_they_are_and_an_empty_text_encodes_to_nothing(texts, tmp_path):
    tok = tmp_path / "tok"
    assert mygpt("train", texts / "train.txt", "--vocab-size", 270, "--out", tok).returncode == 0
    (tmp_path / "empty.txt").write_bytes(b"")
    ids = tmp_path / "ids.npy"
    _one_error(mygpt("encode", "--tokenizer", tok, tmp_path / "empty.txt", "--out", ids),
               f"tokenizer file {tok} is a directory (give {tok / 'tokenizer.json'})")  # fmt: skip
    _one_error(mygpt("encode", "--tokenizer", "/dev/null", tmp_path / "empty.txt", "--out", ids),
               "tokenizer file /dev/null is not a regular file")  # fmt: skip
    proc = mygpt("encode", "--tokenizer", tok / "tokenizer.json", tmp_path / "empty.txt", "--out", ids)
    assert proc.returncode == 0, proc.stderr
    empty = np.load(ids)
    assert empty.shape == (0,) and empty.dtype == np.uint16
    assert "add_special_tokens=False" in " ".join(mygpt("encode", "--help").stdout.split())


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4"])
def test_a_pre_token_past_the_bound_is_refused_with_its_byte_offset(pattern, texts, tmp_path, monkeypatch, capsys):
    """In process, with the bound made small: a pre-token of exactly the bound trains; the run of spaces (one
    pre-token up to its last space) and the run of letters are found at their byte offsets, and nothing is
    written."""
    from mygpt import cli
    from mygpt.tokenizers import byte_bpe_pretokens

    monkeypatch.setattr(byte_bpe_pretokens, "MAX_PRETOKEN_BYTES", 64)
    head = "héllo wörld,\n"  # 15 bytes in 13 characters: the offset is in bytes
    ok = tmp_path / "ok.txt"
    ok.write_text(head + "a" * 64 + " x", encoding="utf-8")
    assert cli.main(["tokenizer", "train", str(ok), "--vocab-size", "270", "--pattern", pattern,
                     "--out", str(tmp_path / "tok")]) == 0  # fmt: skip
    data = json.loads((tmp_path / "tok" / "tokenizer.json").read_text(encoding="utf-8"))
    data["added_tokens"].append({**data["added_tokens"][0], "id": 270, "content": "thee", "special": False})
    (tmp_path / "added.json").write_text(json.dumps(data), encoding="utf-8")  # split unknown: HF's own pre-tokens
    for body, length in (("x" + " " * 80 + "x", 79), ("é" * 40 + " x", 80)):
        bad = tmp_path / "bad.txt"
        bad.write_text(head + body, encoding="utf-8")
        offset = 15 + (1 if body.startswith("x") else 0)
        capsys.readouterr()
        for tok in (tmp_path / "tok" / "tokenizer.json", tmp_path / "added.json"):
            argv = ["tokenizer", "encode", "--tokenizer", str(tok), str(bad), "--out", str(tmp_path / "ids.npy")]
            assert cli.main(argv) == 2
        assert cli.main(["tokenizer", "train", str(bad), "--vocab-size", "270", "--pattern", pattern,
                         "--out", str(tmp_path / "new")]) == 2  # fmt: skip
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 3, lines  # two encodes (a known split, the file's own) and the training
        for line in lines:
            assert line.startswith(f"error: text file {bad} holds one pre-token of {length} bytes at byte offset "
                                   f"{offset} "), line  # fmt: skip
        assert not (tmp_path / "ids.npy").exists() and not (tmp_path / "new").exists()


def test_overlong_pretoken_is_the_first_long_match_of_the_pattern(wikitext2_text):
    import regex

    from mygpt.tokenizers.byte_bpe_pretokens import overlong_pretoken

    text = wikitext2_text[:20_000] + " " * 30 + "\n" + "中" * 9 + "x" + "'" * 40
    for pattern in ref.PATTERNS.values():
        for bound in (8, 12, 20, 30, 40, 200):
            first = next((m for m in regex.finditer(pattern, text) if len(m.group().encode()) > bound), None)
            want = None if first is None else (len(text[: first.start()].encode()), len(first.group().encode()))
            assert overlong_pretoken(text, (), pattern, bound) == want, (pattern, bound)
