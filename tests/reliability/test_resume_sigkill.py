"""SIGKILL `wiki-pipeline run` after training's step-10 checkpoint (a test hook holds it there): the rerun reuses the
finished stages, resumes from step 10 and ends bit-identical to an uninterrupted run, even with the token files
the killed run left changed behind its back."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path

import torch

from tasks.model import CHECKPOINT, PIPELINE_STALL_ENV
from tests.support.prefect_server import rebuilt_from, task_run_states
from tests.support.tiny import SETTINGS, tiny_flow_parameters, tiny_run_command, tiny_zip_url


def _kill_after_first_checkpoint(cmd, env, root: Path, log_path: Path, timeout: float = 180) -> Path:
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ckpts = list(root.glob(f"model/.staging/*/work/{CHECKPOINT}"))
            if ckpts and "stalling after the checkpoint at step 10" in log_path.read_text():
                os.killpg(proc.pid, signal.SIGKILL)
                assert proc.wait(30) == -signal.SIGKILL
                return ckpts[0]
            assert proc.poll() is None, f"the run ended before the kill:\n{log_path.read_text()[-3000:]}"
            time.sleep(0.2)
        raise AssertionError(f"no checkpoint within {timeout}s:\n{log_path.read_text()[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _weights(ref) -> dict:
    return torch.load(Path(ref["path"]) / "model.ckpt", map_location="cpu", weights_only=True)["model_state_dict"]


def test_sigkill_mid_training_then_rerun_resumes_bit_identical(prefect_server, trained, tmp_path, monkeypatch, caplog):
    """``trained`` (tests/conftest.py) is the uninterrupted run: the tiny preset's model on the same zip's corpus,
    tokenizer and shards, built once per session."""
    from flows.wiki_pipeline import wiki_pipeline

    url = tiny_zip_url(tmp_path)
    killed_root = tmp_path / "killed"
    cmd = tiny_run_command(url, killed_root)
    env = {**prefect_server.env, PIPELINE_STALL_ENV: "1"}
    ckpt = _kill_after_first_checkpoint(cmd, env, killed_root, tmp_path / "killed.log")
    assert ckpt.is_file() and not list(killed_root.glob("model/*/model.ckpt")), "killed before publishing"
    tokens = list(killed_root.glob("model/.staging/*/work/tokens/*.bin"))
    assert tokens, "the killed run left its token files"
    for p in tokens:  # changed after the kill, same size: the rerun must not train on them
        p.write_bytes(bytes(p.stat().st_size))

    monkeypatch.delenv(PIPELINE_STALL_ENV, raising=False)
    caplog.set_level(logging.INFO)
    state = wiki_pipeline(**tiny_flow_parameters(url, killed_root), return_state=True)
    resumed = state.result()
    assert task_run_states(state.state_details.flow_run_id) == rebuilt_from("model")
    assert "model: resuming from step 10" in caplog.text
    manifest = json.loads((Path(resumed["model"]["path"]) / "manifest.json").read_text())
    assert manifest["metrics"]["resumed_from"] == 10 and manifest["metrics"]["steps"] == SETTINGS.model.steps
    assert not ckpt.exists(), "the resume state is deleted on publish"

    clean_manifest = json.loads((Path(trained["path"]) / "manifest.json").read_text())
    assert clean_manifest["settings"] == manifest["settings"] and clean_manifest["metrics"]["resumed_from"] == 0
    a, b = _weights(resumed["model"]), _weights(trained)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ from the uninterrupted run"
    assert manifest["metrics"]["loss_curve"] == clean_manifest["metrics"]["loss_curve"], "history survives too"
