"""One rank of a data-parallel run, started by torchrun: ``python -m mygpt.training.worker JOB.json``.

Each rank logs to ``RUN_DIR/rank-R.log`` and leaves ``rank-R.status.json`` (``ok``, ``user_error``,
``peer_lost``, ``error``) and its pid; rank 0 streams its log, progress and checkpoints to the launcher as JSON
lines in ``RUN_DIR/events.jsonl`` and writes ``result.json``. Test hooks (the workers' environment):
``WORKER_STALL_ENV=1`` stalls rank 0 after its first periodic checkpoint; ``EXIT_RANK_ENV=R:S:C`` makes rank ``R``
exit with code ``C`` after step ``S``.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import cast

from mygpt.atomic import atomic_write_text
from mygpt.errors import UserError
from mygpt.training.job import TrainJob, train_job

__all__ = ["EXIT_RANK_ENV", "LAUNCHER_ENV", "RUN_DIR_ENV", "WORKER_STALL_ENV", "main"]

WORKER_STALL_ENV = "MYGPT_TEST_STALL_AFTER_CHECKPOINT"
EXIT_RANK_ENV = "MYGPT_TEST_EXIT_RANK"
RUN_DIR_ENV = "MYGPT_RUN_DIR"
LAUNCHER_ENV = "MYGPT_LAUNCHER_PID"


class _Events:
    """Rank 0's event stream to the launcher (JSON lines, flushed per event)."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the rank's life)

    def emit(self, event: str, **data) -> None:
        self.file.write(json.dumps({"event": event, **data}) + "\n")
        self.file.flush()

    def log(self, message: str) -> None:
        print(message, flush=True)  # the rank log keeps the text too
        self.emit("log", message=message)


def _redirect_output(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # The worker's own stdio: TextIOWrappers (typed TextIO, which lacks reconfigure).
    cast(io.TextIOWrapper, sys.stdout).reconfigure(line_buffering=True)
    cast(io.TextIOWrapper, sys.stderr).reconfigure(line_buffering=True)


def _exit_hook(rank: int):
    spec = os.environ.get(EXIT_RANK_ENV, "")
    if not spec:
        return None
    r, s, c = (int(v) for v in spec.split(":"))
    if r != rank:
        return None

    def hook(step: int) -> None:
        if step == s:
            print(f"{EXIT_RANK_ENV}={spec}: rank {rank} exits with code {c} after step {step}", flush=True)
            os._exit(c)

    return hook


def _is_peer_failure(e: BaseException) -> bool:
    import torch.distributed as dist

    if isinstance(e, dist.DistError):
        return True
    text = str(e)
    return any(
        s in text for s in ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "gloo", "NCCL")
    )


def _worker(job_path: str) -> int:
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    run_path = Path(os.environ[RUN_DIR_ENV])
    _redirect_output(run_path / f"rank-{rank}.log")
    from mygpt.training.orphan_guard import GUARDED_PID_ENV, die_with_parent, watch_process

    agent = int(os.environ.get(GUARDED_PID_ENV, os.getppid()))  # the torchrun agent
    die_with_parent(agent)
    if os.environ.get(LAUNCHER_ENV):
        watch_process(int(os.environ[LAUNCHER_ENV]), parent=agent)
    (run_path / f"rank-{rank}.pid").write_text(str(os.getpid()))
    status_path = run_path / f"rank-{rank}.status.json"
    print(f"rank {rank} (local rank {local_rank}) of {os.environ.get('WORLD_SIZE')}, pid {os.getpid()}", flush=True)
    try:
        _work(TrainJob.load(job_path), rank, local_rank, run_path)
    except UserError as e:
        print(f"error: {e}", flush=True)
        atomic_write_text(status_path, json.dumps({"status": "user_error", "message": str(e)}))
        return 2
    except BaseException as e:
        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0][:300]
        status = "peer_lost" if _is_peer_failure(e) else "error"
        atomic_write_text(status_path, json.dumps({"status": status, "message": f"{type(e).__name__}: {first}"}))
        return 1
    atomic_write_text(status_path, json.dumps({"status": "ok"}))
    return 0


def join_process_group(dev, local_rank: int):
    """Join the default process group for training on ``dev`` (a resolved ``torch.device``); returns this rank's
    device: on CUDA, GPU ``local_rank``, made current and given to NCCL (one GPU per process); else gloo on the
    CPU."""
    import torch
    import torch.distributed as dist

    if dev.type == "cuda":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=dev)
    else:
        dist.init_process_group("gloo")
    return dev


def _work(job: TrainJob, rank: int, local_rank: int, run_path: Path) -> None:
    import torch
    import torch.distributed as dist

    from mygpt.device import resolve_device
    from mygpt.training.parallel import World

    dev = join_process_group(resolve_device(job.device), local_rank)
    if job.threads:
        torch.set_num_threads(job.threads)
    try:
        world = World.current(step_hook=_exit_hook(rank))
        events = _Events(run_path / "events.jsonl") if rank == 0 else None
        stall = bool(os.environ.get(WORKER_STALL_ENV))

        def on_checkpoint(step: int, path: str) -> None:
            assert events is not None  # passed to training only when there are events
            events.emit("checkpoint", step=step, path=path)
            if stall and step < job.train.steps:
                events.log(f"{WORKER_STALL_ENV} is set: stalling after the checkpoint at step {step}")
                while True:
                    time.sleep(1)

        result = train_job(
            job,
            dev,
            world,
            events.log if events else None,
            (lambda point: events.emit("progress", point=point)) if events else None,
            on_checkpoint if events else None,
        )
        if rank == 0:
            atomic_write_text(run_path / "result.json", json.dumps(result.to_dict()))
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(
            "usage: python -m torch.distributed.run ... -m mygpt.training.worker JOB.json "
            "(started by mygpt.training.launcher.run_training)",
            file=sys.stderr,
        )
        return 2
    return _worker(argv[0])


def _leave(code: int) -> None:
    """End a worker once its outcome is on disk: flush its log and ``os._exit``. Not ``sys.exit``: shutting the
    interpreter down with a gloo/c10d thread still joinable makes libstdc++ abort (SIGABRT) a rank that had
    finished its work."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover - runs in the worker processes
    from mygpt.training.worker import _leave as _end
    from mygpt.training.worker import main as _main  # the package's copy of this module, not __main__'s

    _end(_main())
