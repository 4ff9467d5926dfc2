"""Run a ``TrainJob``: ``nproc=1`` in this process (exactly ``mygpt.training.train.train``), more under torchrun.

``run_training(job, nproc, log=..., on_progress=..., on_checkpoint=...)`` returns the ``TrainResult``; with
``nproc > 1`` it starts ``python -m torch.distributed.run --standalone ... -m mygpt.training.worker JOB.json`` in
its own process group (NCCL on CUDA, gloo on CPU) and calls the callbacks with what rank 0 streams back, as they
would be called in-process. A failure raises the worker's ``UserError`` or a :class:`TrainingProcessError`
(:mod:`mygpt.training.failure`), never a hang; the launcher and ``mygpt.training.orphan_guard`` leave no training
process behind. Design notes: docs/TRAINING.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from mygpt.errors import UserError, check_int
from mygpt.training.failure import diagnose
from mygpt.training.job import TrainJob, train_job
from mygpt.training.worker import LAUNCHER_ENV, RUN_DIR_ENV

__all__ = ["resolve_nproc", "run_training"]

#: torchrun's ``--log-dir`` in the run directory (else torch elastic leaves a ``torchelastic_*`` dir in TMPDIR)
ELASTIC_DIR = "torchelastic"


def resolve_nproc(nproc: int | str, device: str = "auto") -> int:
    """``nproc`` as a number: ``"auto"`` = visible GPUs when ``device`` resolves to CUDA, else 1. Torch-free where
    ``device`` resolves to the CPU without it (:func:`mygpt.limits.resolves_to_cpu`)."""
    from mygpt.limits import resolves_to_cpu

    if resolves_to_cpu(device):
        kind, index = "cpu", None
    else:
        from mygpt.device import resolve_device

        dev = resolve_device(device)
        kind, index = dev.type, dev.index
    if isinstance(nproc, str):
        text = nproc.strip().lower()
        if text == "auto":
            return max(1, __import__("torch").cuda.device_count()) if kind == "cuda" else 1
        if not text.isdigit():
            raise UserError(f"nproc must be a positive integer or 'auto', got {nproc!r}")
        nproc = int(text)
    n = check_int("nproc", nproc, 1, "use 'auto' for one process per visible GPU")
    if n > 1:
        if kind == "mps":
            raise UserError("nproc > 1 is not supported on Apple MPS (no distributed backend); use nproc 1")
        if kind == "cuda":
            import torch

            if index is not None:
                raise UserError(
                    f"device {device!r} pins one GPU, but nproc is {n}; use device 'cuda' (or 'auto') "
                    f"and each process takes its own GPU"
                )
            if n > torch.cuda.device_count():
                raise UserError(
                    f"nproc ({n}) is more than the {torch.cuda.device_count()} visible GPU(s); "
                    f"lower nproc or use 'auto'"
                )
        if not hasattr(os, "killpg"):
            raise UserError("nproc > 1 needs a POSIX system (process groups); use nproc 1")
    return n


def run_training(
    job: TrainJob | dict,
    nproc: int = 1,
    *,
    log: Callable[[str], None] | None = print,
    on_progress: Callable[[dict], None] | None = None,
    on_checkpoint: Callable[[int, str], None] | None = None,
    env: dict | None = None,
    run_dir: str | os.PathLike | None = None,
):
    """Train ``job`` with ``nproc`` processes (a number, see :func:`resolve_nproc`); return the ``TrainResult``.

    ``env``: extra environment for the processes (``nproc > 1``). ``run_dir``: the job file, the event stream and
    the per-rank logs (default: a temporary directory, removed after success, kept after a failure).
    """
    if isinstance(job, dict):
        job = TrainJob.from_dict(job)
    log = log or (lambda _msg: None)
    check_int("nproc", nproc, 1, "resolve 'auto' with mygpt.training.launcher.resolve_nproc")
    job.check(nproc)
    if nproc == 1:
        return _train_here(job, log, on_progress, on_checkpoint)
    return _launch(job, nproc, log, on_progress, on_checkpoint, env or {}, run_dir)


def _train_here(job: TrainJob, log, on_progress, on_checkpoint):
    from mygpt.device import torch_threads
    from mygpt.training.parallel import World

    with torch_threads(job.threads):
        return train_job(job, job.device, World(), log, on_progress, on_checkpoint)


class _EventReader:
    """Complete JSON lines appended to a file since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: TextIO | None = None
        self.partial = ""

    def read(self) -> list[dict]:
        if self.file is None:
            try:
                self.file = open(self.path, encoding="utf-8")  # noqa: SIM115 (tailed across calls)
            except FileNotFoundError:
                return []
        chunk = self.file.read()
        if not chunk:
            return []
        *lines, self.partial = (self.partial + chunk).split("\n")
        return [json.loads(line) for line in lines if line.strip()]

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def _prepare_run_dir(run_dir) -> tuple[Path, bool]:
    if run_dir is None:
        return Path(tempfile.mkdtemp(prefix="mygpt-train-")), True
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    for pattern in (
        "events.jsonl",
        "result.json",
        "launcher.log",
        "rank-*.log",
        "rank-*.status.json",
        "rank-*.pid",
    ):  # a previous attempt's files must not be read as this one's
        for old in path.glob(pattern):
            old.unlink()
    shutil.rmtree(path / ELASTIC_DIR, ignore_errors=True)
    return path, False


def _launch(job, nproc, log, on_progress, on_checkpoint, env, run_dir):
    from mygpt.training.train import TrainResult

    run_path, temporary = _prepare_run_dir(run_dir)
    job_path = run_path / "job.json"
    job.save(job_path)
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
        f"--log-dir={run_path / ELASTIC_DIR}",  # torch elastic's own files: here, not a torchelastic_* in TMPDIR
        "-m",
        "mygpt.training.worker",
        str(job_path),
    ]
    cmd = [sys.executable, "-m", "mygpt.training.orphan_guard", str(os.getpid()), "--", *torchrun]
    child_env = {
        **os.environ,
        **{k: str(v) for k, v in env.items()},
        RUN_DIR_ENV: str(run_path),
        LAUNCHER_ENV: str(os.getpid()),
    }
    log(f"launching {nproc} training processes with torch.distributed.run (logs: {run_path})")
    reader = _EventReader(run_path / "events.jsonl")
    last_checkpoint: list = [None]

    def dispatch(events: list[dict]) -> None:
        for ev in events:
            kind = ev.get("event")
            if kind == "log":
                log(ev["message"])
            elif kind == "progress" and on_progress is not None:
                on_progress(ev["point"])
            elif kind == "checkpoint":
                last_checkpoint[0] = ev["step"]
                if on_checkpoint is not None:
                    on_checkpoint(ev["step"], ev["path"])

    with open(run_path / "launcher.log", "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env, start_new_session=True
        )
    ok = False
    try:
        while True:
            dispatch(reader.read())
            rc = proc.poll()
            if rc is not None:
                dispatch(reader.read())
                break
            time.sleep(0.05)
        if rc != 0:
            error = diagnose(rc, nproc, run_path, last_checkpoint[0], job.checkpoint)
            ok = isinstance(error, UserError)  # the message says it all: no logs to keep
            raise error
        result_path = run_path / "result.json"
        result = TrainResult.from_dict(json.loads(result_path.read_text(encoding="utf-8")))
        ok = True
        return result
    finally:
        reader.close()
        _stop(proc)
        _reap_workers(run_path, str(job_path))
        if ok and temporary:
            shutil.rmtree(run_path, ignore_errors=True)


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Stop the torchrun agent's process group: SIGTERM (it stops its workers), then SIGKILL."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # anything left in the group
    proc.wait()


def _is_ours(pid: int, marker: str) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return marker.encode() in f.read()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS): trust the pid file written moments ago
        return True


def _reap_workers(run_path: Path, marker: str, wait: float = 5.0) -> None:
    """Workers live in their own sessions (torchrun's choice): make sure none outlives the launch."""
    pids = []
    for pid_file in run_path.glob("rank-*.pid"):
        with contextlib.suppress(OSError, ValueError):
            pids.append(int(pid_file.read_text().strip()))
    deadline = time.monotonic() + wait
    alive = [p for p in pids if _is_ours(p, marker)]
    while alive and time.monotonic() < deadline:  # they die with the agent (PR_SET_PDEATHSIG); give them a moment
        time.sleep(0.05)
        alive = [p for p in alive if _is_ours(p, marker)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
