"""The bench scripts run by hand: bad arguments are one `error:` line and exit code 2, as the project's CLIs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import REPO


@pytest.mark.parametrize("args", [["--workers", "0"], ["--workers", "-1"], ["--shard-tokens", "0"]])
def test_encode_profile_refuses_counts_it_cannot_use(args, upstream):
    """On a root that holds a corpus and a chapter tokenizer: a worker count or shard size below 1 names the option;
    none is taken as it stands (``--workers -1`` would profile every chunk, in reverse, as "a worker's share")."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.encode_profile", str(upstream[0]), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert args[0] in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_encode_profile_profiles_the_published_corpus_and_tokenizer(upstream):
    """On a root that holds a corpus and a chapter tokenizer: both parts run on the versions the store lists, and
    each reports what it profiled."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.encode_profile", str(upstream[0]), "--shards", "1", "--shard-tokens", "1000"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1. a worker's share: " in done.stdout and " chunks, " in done.stdout
    assert "2. the flow process's write: 1 shard(s) of up to 1,000 tokens" in done.stdout


@pytest.mark.parametrize(
    ("args", "names"),
    [(["--vs-nanogpt", "/nonexistent/nanoGPT"], "no nanoGPT model.py"), (["--rounds", "0"], "--rounds")],
)
def test_train_throughput_vs_nanogpt_refuses_what_it_cannot_race(args, names, tmp_path):
    """A nanoGPT path without its model.py, or no rounds to keep the best of, is one error line and exit code 2."""
    argv = ["--vs-nanogpt", str(tmp_path), *args] if args[0] != "--vs-nanogpt" else args
    done = subprocess.run(
        [sys.executable, "-m", "bench.train_throughput", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert names in done.stderr and "Traceback" not in done.stderr, done.stderr
