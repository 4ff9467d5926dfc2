"""Small truths of issue 20 (item 8): `mygpt train` is never silent for long and says what clipping does."""

from __future__ import annotations

import subprocess
import sys

from mygpt.cli import main
from tests.support import REPO

TINY = ["--embed-dim", "32", "--num-layers", "1", "--num-heads", "4", "--max-seq-len", "32", "--seq-len", "32"]


def test_mygpt_train_prints_every_tenth_of_the_steps_by_default(capsys, shakespeare_text, tmp_path):
    text = tmp_path / "small.txt"
    text.write_text(shakespeare_text[:20_000], encoding="utf-8")
    argv = ["train", str(text), *TINY, "--batch-size", "4", "--device", "cpu", "--steps", "30"]
    assert main([*argv, "--output", str(tmp_path / "m.ckpt")]) == 0
    lines = capsys.readouterr().out.splitlines()
    steps = [line.split(":")[0] for line in lines if line.startswith("step ")]
    assert steps == ["step 1", *(f"step {n}" for n in range(3, 31, 3))], lines
    assert "max_grad_norm: 0.0 (no clipping)" in lines


def test_mygpt_train_help_names_print_every():
    done = subprocess.run(
        [sys.executable, "-m", "mygpt.cli", "train", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert "--print-every" in done.stdout and "10%" in done.stdout, done.stdout
