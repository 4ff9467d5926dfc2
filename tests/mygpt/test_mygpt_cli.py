"""`mygpt train` / `mygpt generate`: the chapter's header block, BPE wiring, and every bad input -> exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mygpt.checkpoint import load_checkpoint_payload
from mygpt.cli import _utf8_prefix, main
from tests.support import REPO
from tests.support.tiny_model import flags

TINY = flags(embed_dim=32, num_layers=1, num_heads=4, max_seq_len=32, seq_len=32, batch_size=4, device="cpu")


@pytest.fixture(scope="module")
def small_text(shakespeare_text, tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "small.txt"
    path.write_text(shakespeare_text[:30_000], encoding="utf-8")
    return path


def run_main(capsys, argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


HEADER = [
    "device: cpu",
    "precision: fp32",
    "tokenizer: char",
    "norm: layer",
    "position: learned",
    "num_heads: 4",
    "num_kv_heads: 4",
    "corpus chars: 30,000",
    "train chars: 27,000",
    "val chars: 3,000",
    "vocab_size: ",
    "params: ",
    "steps: 30",
    "schedule: constant (warmup=0)",
    "max_grad_norm: 0.0 (no clipping)",
    "checkpoint_every: 15",
]


def test_train_then_generate_char(capsys, small_text, tmp_path):
    ckpt = tmp_path / "m.ckpt"
    code, out, err = run_main(
        capsys,
        [
            "train",
            small_text,
            *TINY,
            "--steps",
            "30",
            "--print-every",
            "10",
            "--checkpoint-every",
            "15",
            "--val-fraction",
            "0.1",
            "--output",
            ckpt,
        ],
    )
    assert code == 0, err
    lines = out.splitlines()
    assert [line[: len(h)] for line, h in zip(lines, HEADER)] == HEADER
    steps = [line for line in lines if line.startswith("step ")]
    assert [s.split(":")[0] for s in steps] == ["step 1", "step 10", "step 20", "step 30"]
    assert all(" val_loss = " in s and " lr = " not in s for s in steps)
    assert "  [checkpoint saved at step 15]" in lines
    assert lines[-1] == f"saved checkpoint to {ckpt}"
    payload = load_checkpoint_payload(ckpt)
    assert payload["config"]["tokenizer_kind"] == "char" and payload["resume"]["step"] == 30
    assert payload["meta"]["tokenizer"] == "char"

    code, out, err = run_main(
        capsys, ["generate", "--checkpoint", ckpt, "--prompt", "ROMEO:", "--max-new-tokens", "20", "--device", "cpu"]
    )
    assert code == 0, err
    first, rest = out.split("\n", 1)
    assert first == "device: cpu"
    assert rest.startswith("ROMEO:") and len(rest) == len("ROMEO:") + 20 + 1  # + print's newline
    code, out2, _ = run_main(
        capsys,
        [
            "generate",
            "--checkpoint",
            ckpt,
            "--prompt",
            "ROMEO:",
            "--max-new-tokens",
            "20",
            "--device",
            "cpu",
            "--no-cache",
        ],
    )
    assert code == 0 and out2 == out


def test_train_bpe_modern_recipe(capsys, wikitext2_path, tmp_path):
    text_path = tmp_path / "wiki.txt"
    text_path.write_bytes(wikitext2_path.read_bytes()[:150_000].decode("utf-8", "ignore").encode("utf-8"))
    ckpt = tmp_path / "wiki.ckpt"
    code, out, err = run_main(
        capsys,
        [
            "train",
            text_path,
            "--tokenizer",
            "bpe",
            "--num-merges",
            "100",
            "--bpe-train-bytes",
            "50000",
            *flags(embed_dim=48, num_layers=1, num_heads=6, num_kv_heads=2, max_seq_len=32, seq_len=32, batch_size=4),
            *flags(norm="rms", position="rope", schedule="cosine", warmup=5, max_grad_norm=1.0, steps=20),
            *flags(print_every=10, device="cpu"),
            "--output",
            ckpt,
        ],
    )
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("training BPE tokenizer (100 merges, ") and lines[0].endswith(" chars)…")
    assert int(lines[0].split(", ")[1].split()[0].replace(",", "")) <= 50_000
    assert lines[1].startswith("BPE trained in ") and lines[1].endswith("s")
    assert lines[2].startswith("encoding corpus (") and lines[3].startswith("corpus encoded in ")
    assert "tokenizer: bpe" in lines and "num_kv_heads: 2" in lines and "norm: rms" in lines
    assert "schedule: cosine (warmup=5)" in lines and "max_grad_norm: 1.0" in lines
    assert any(line.startswith("step 1: loss = ") and line.endswith("lr = 2.00e-04") for line in lines)
    assert any(line.startswith("step 20: ") and line.endswith("lr = 0.00e+00") for line in lines)
    payload = load_checkpoint_payload(ckpt)
    assert payload["tokenizer_kind"] == "bpe" and len(payload["tokenizer_state"]["merges"]) == 100
    vocab = int(next(line for line in lines if line.startswith("vocab_size: ")).split()[1])
    assert vocab == payload["config"]["vocab_size"] == len(payload["tokenizer_state"]["chars"]) + 100

    code, out, err = run_main(
        capsys,
        [
            "generate",
            "--checkpoint",
            ckpt,
            "--prompt",
            "The history of",
            "--max-new-tokens",
            "15",
            "--device",
            "cpu",
            "--precision",
            "fp32",
        ],
    )
    assert code == 0, err
    assert out.startswith("device: cpu\nThe history of")


def test_utf8_prefix_cuts_at_character_boundary():
    raw = "ab€cd".encode()  # € is 3 bytes at offsets 2..4
    assert _utf8_prefix(raw, 3) == "ab" and _utf8_prefix(raw, 4) == "ab"
    assert _utf8_prefix(raw, 5) == "ab€" and _utf8_prefix(raw, 0) == "ab€cd" and _utf8_prefix(raw, 99) == "ab€cd"


@pytest.fixture(scope="module")
def trained_ckpt(small_text, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("ckpt") / "m.ckpt"
    assert main(["train", str(small_text), *TINY, "--steps", "2", "--output", str(ckpt)]) == 0
    return ckpt


def _bad_inputs(tmp: Path, small_text: Path, ckpt: Path):
    empty = tmp / "empty.txt"
    empty.write_bytes(b"")
    latin1 = tmp / "latin1.txt"
    latin1.write_bytes("hello wörld".encode("latin-1"))
    short = tmp / "short.txt"
    short.write_text("too short for a window\n", encoding="utf-8")
    corrupt = tmp / "corrupt.ckpt"
    corrupt.write_bytes(b"this is not a checkpoint" * 10)
    base = ["train", str(small_text), "--device", "cpu", "--steps", "1"]
    return [
        (["train", str(tmp / "missing.txt")], ["missing.txt", "does not exist"]),
        (["train", str(empty), "--device", "cpu"], ["empty.txt", "is empty"]),
        (["train", str(latin1), "--device", "cpu"], ["latin1.txt", "not valid UTF-8", "byte offset 7"]),
        ([*base, "--embed-dim", "64", "--num-heads", "5"], ["embed_dim (64)", "num_heads (5)"]),
        ([*base, "--num-heads", "4", "--num-kv-heads", "3"], ["num_heads (4)", "num_kv_heads (3)"]),
        ([*base, "--seq-len", "128", "--max-seq-len", "64"], ["--seq-len (128)", "--max-seq-len (64)"]),
        (["train", str(short), "--device", "cpu"], ["23 tokens", "seq_len + 1 = 65"]),
        ([*base, "--device", "tpu"], ["unknown device 'tpu'"]),
        ([*base, "--max-seq-len", "1000000000000"], ["--max-seq-len (1,000,000,000,000)", "GiB of memory on this"]),
        ([*base, "--batch-size", "1000000000000"], ["--batch-size (1,000,000,000,000)", "lower --batch-size or"]),
        (
            ["generate", "--checkpoint", str(ckpt), "--prompt", "Zoë ☃", "--device", "cpu"],
            ["'ë' (U+00EB)", "'☃' (U+2603)", "vocabulary"],
        ),
        (
            ["generate", "--checkpoint", str(tmp / "missing.ckpt"), "--device", "cpu"],
            ["missing.ckpt", "does not exist"],
        ),
        (["generate", "--checkpoint", str(corrupt), "--device", "cpu"], ["corrupt.ckpt", "corrupt"]),
    ]


def test_bad_inputs_exit_2_with_message(capsys, tmp_path, small_text, trained_ckpt):
    capsys.readouterr()
    for argv, fragments in _bad_inputs(tmp_path, small_text, trained_ckpt):
        code, out, err = run_main(capsys, argv)
        assert code == 2, (argv, out, err)
        assert err.startswith("error: ") and err.count("\n") == 1, (argv, err)
        for frag in fragments:
            assert frag in err, (argv, frag, err)
        assert "Traceback" not in err and "Traceback" not in out


def test_cuda_without_cuda_is_a_user_error(capsys, small_text):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, _, err = run_main(capsys, ["train", small_text, "--device", "cuda", "--steps", "1"])
    assert code == 2 and err.startswith("error: ") and "CUDA is not available" in err


def test_real_process_exit_codes(tmp_path, small_text, trained_ckpt):
    """The installed entry point path (python -m mygpt.cli) prints no traceback and exits 2; argparse too."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cases = [
        (["train", str(tmp_path / "missing.txt")], 2, "does not exist"),
        (["generate", "--checkpoint", str(trained_ckpt), "--prompt", "€uro", "--device", "cpu"], 2, "'€' (U+20AC)"),
        (["train", str(small_text), "--norm", "batch"], 2, "invalid choice"),
    ]
    for argv, want_code, frag in cases:
        proc = subprocess.run(
            [sys.executable, "-m", "mygpt.cli", *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == want_code, (argv, proc.stderr)
        assert frag in proc.stderr and "Traceback" not in proc.stderr, (argv, proc.stderr)


def test_resume_flag_continues_a_run(capsys, small_text, tmp_path):
    ckpt = tmp_path / "r.ckpt"
    args = ["train", small_text, *TINY, "--print-every", "1", "--output", ckpt]
    assert run_main(capsys, [*args, "--steps", "3"])[0] == 0
    code, out, err = run_main(capsys, [*args, "--steps", "5", "--resume"])
    assert code == 0, err
    assert f"resuming from {ckpt} at step 3" in out
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("step ")] == ["step 4", "step 5"]
    assert load_checkpoint_payload(ckpt)["resume"]["step"] == 5
    # without --resume the run starts over (the chapter's behaviour: the output is overwritten)
    code, out, _ = run_main(capsys, [*args, "--steps", "2"])
    assert code == 0 and "resuming" not in out and "step 1: loss" in out
