"""The train stage with ``nproc=2`` (torchrun, gloo, CPU): after a SIGKILL of the whole group, or one rank dying
alone (an error naming it, no hang), the rerun resumes from the checkpoint to the uninterrupted run's weights."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mygpt.training.failure import TrainingProcessError
from mygpt.training.worker import EXIT_RANK_ENV
from tasks.model import CHECKPOINT, PIPELINE_STALL_ENV, train_model
from tasks.registry import NAMES
from tests.support.tiny import SETTINGS, run_in

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="nproc=2 needs 2 CPU cores")

NPROC2 = SETTINGS.model.model_copy(update={"nproc": 2, "device": "cpu", "precision": "fp32"})
# the stage task called plainly in a child process: argv[1] = {"shards", "tokenizer", "root"}
CHILD = (
    "import json, sys; from tasks.model import train_model; from tests.support.tiny import SETTINGS, run_in; "
    "a = json.loads(sys.argv[1]); train_model.fn(a['shards'], a['tokenizer'], "
    "SETTINGS.model.model_copy(update={'nproc': 2, 'device': 'cpu', 'precision': 'fp32'}), run_in(a['root']))"
)


def _copy_root(upstream, dest: Path) -> Path:
    """A root of its own holding the shared corpus, tokenizer and shards versions."""
    shutil.copytree(upstream[0], dest, ignore=shutil.ignore_patterns(*NAMES[NAMES.index("model") :]))
    return dest


def _weights(ref) -> dict:
    return torch.load(Path(ref["path"]) / "model.ckpt", map_location="cpu", weights_only=True)["model_state_dict"]


def _assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ from the uninterrupted nproc=2 run"


def _manifest(ref) -> dict:
    return json.loads((Path(ref["path"]) / "manifest.json").read_text())


@pytest.fixture(scope="module")
def uninterrupted(upstream, tmp_path_factory):
    """The tiny model trained once with nproc=2, never interrupted."""
    root = _copy_root(upstream, tmp_path_factory.mktemp("nproc2") / "art")
    ref = train_model.fn(upstream[3], upstream[2], NPROC2, run_in(root))
    m = _manifest(ref)
    assert m["settings"]["nproc"] == 2 and m["metrics"]["nproc"] == 2 and m["metrics"]["resumed_from"] == 0
    return ref


def test_two_processes_are_another_version_with_the_same_losses(trained, uninterrupted):
    one, two = _manifest(trained), _manifest(uninterrupted)
    assert trained["version"] != uninterrupted["version"], "nproc enters the version"
    assert {k: v for k, v in one["settings"].items() if k != "nproc"} == {
        k: v for k, v in two["settings"].items() if k != "nproc"
    }
    for (s1, l1, v1), (s2, l2, v2) in zip(one["metrics"]["loss_curve"], two["metrics"]["loss_curve"], strict=True):
        assert s1 == s2 and abs(l1 - l2) < 1e-4 and (v1 is None) == (v2 is None) and (v1 is None or abs(v1 - v2) < 1e-4)
    assert abs(one["metrics"]["final_val_bpb"] - two["metrics"]["final_val_bpb"]) < 1e-4


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
            if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                alive.append(pid)
    return alive


def test_sigkill_of_the_process_group_then_rerun_resumes_to_the_same_weights(upstream, uninterrupted, tmp_path, caplog):
    root = _copy_root(upstream, tmp_path / "art")
    args = json.dumps({"shards": upstream[3], "tokenizer": upstream[2], "root": str(root)})
    log_path = tmp_path / "killed.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, args],
            env={**os.environ, PIPELINE_STALL_ENV: "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            rank0 = list(root.glob("model/.staging/*/work/ranks/rank-0.log"))
            if rank0 and "stalling after the checkpoint at step 10" in rank0[0].read_text():
                break
            assert proc.poll() is None, f"the run ended before the kill:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no checkpoint in time:\n{log_path.read_text()[-3000:]}"
            time.sleep(0.2)
        ranks = rank0[0].parent
        pids = [int(p.read_text()) for p in ranks.glob("rank-*.pid")]
        assert len(pids) == 2
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    deadline = time.monotonic() + 30
    while _alive(pids) and time.monotonic() < deadline:  # the workers die with their parents (orphan guard)
        time.sleep(0.1)
    assert not _alive(pids), "training processes outlived the killed stage"
    assert (ranks.parent / CHECKPOINT).is_file() and not list(root.glob("model/*/model.ckpt"))

    caplog.set_level(logging.INFO)
    resumed = train_model.fn(upstream[3], upstream[2], NPROC2, run_in(root))
    assert "model: resuming from step 10" in caplog.text
    assert resumed["version"] == uninterrupted["version"]
    m, clean = _manifest(resumed), _manifest(uninterrupted)
    assert m["metrics"]["resumed_from"] == 10 and m["metrics"]["steps"] == NPROC2.steps
    _assert_same_weights(_weights(resumed), _weights(uninterrupted))
    assert m["metrics"]["loss_curve"] == clean["metrics"]["loss_curve"], "history survives too"


def test_one_rank_dying_fails_the_stage_and_the_rerun_resumes(upstream, uninterrupted, tmp_path, monkeypatch, caplog):
    root = _copy_root(upstream, tmp_path / "art")
    monkeypatch.setenv(EXIT_RANK_ENV, "1:15:3")  # rank 1 exits with code 3 after step 15 (checkpoint at 10)
    with pytest.raises(TrainingProcessError, match=r"training process rank 1 of 2 exited with code 3") as e:
        train_model.fn(upstream[3], upstream[2], NPROC2, run_in(root))
    assert e.value.rank == 1 and e.value.checkpoint_step == 10 and "rerun to resume" in str(e.value)
    assert Path(e.value.run_dir, "rank-1.log").is_file(), "the rank logs stay in the work dir for reading"

    monkeypatch.delenv(EXIT_RANK_ENV)
    caplog.set_level(logging.INFO)
    resumed = train_model.fn(upstream[3], upstream[2], NPROC2, run_in(root))
    assert "model: resuming from step 10" in caplog.text
    assert _manifest(resumed)["metrics"]["resumed_from"] == 10
    _assert_same_weights(_weights(resumed), _weights(uninterrupted))
