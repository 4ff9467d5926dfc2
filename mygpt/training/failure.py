"""Why a data-parallel run failed: the rank that failed first, how it ended, the tail of its log."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from pathlib import Path

from mygpt.errors import UserError

__all__ = ["TAIL_LINES", "TrainingProcessError", "diagnose"]

TAIL_LINES = 25


class TrainingProcessError(RuntimeError):
    """A training process failed (not a ``UserError``): which rank, how it ended, the tail of its log."""

    def __init__(
        self,
        message: str,
        *,
        rank: int | None,
        exit_code: int | None,
        world_size: int,
        log_tail: str,
        run_dir: str,
        checkpoint_step: int | None,
    ) -> None:
        super().__init__(message)
        self.rank, self.exit_code, self.world_size = rank, exit_code, world_size
        self.log_tail, self.run_dir, self.checkpoint_step = log_tail, run_dir, checkpoint_step


_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*exitcode\s*:\s*(-?\d+)")


def _parse_torchrun_failures(text: str) -> tuple[dict[int, int], int | None]:
    """``({rank: exit code}, root-cause rank)`` from torchrun's ChildFailedError summary."""
    failures = {int(r): int(c) for r, c in _FAILURE.findall(text)}
    root = None
    if "Root Cause" in text:
        m = _FAILURE.search(text.split("Root Cause", 1)[1])
        root = int(m.group(1)) if m else None
    return failures, root


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "failed"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit code {code})"
    return f"exited with code {code}"


def diagnose(rc: int, nproc: int, run_path: Path, checkpoint_step: int | None, checkpoint: str | None) -> Exception:
    """The error a failed torchrun run raises: the first failing rank's ``UserError`` as it is, else a
    :class:`TrainingProcessError` blaming the rank that failed first (not one that only lost its peer)."""
    statuses = {}
    for p in run_path.glob("rank-*.status.json"):
        with contextlib.suppress(OSError, ValueError):
            statuses[int(p.name.split("-")[1].split(".")[0])] = json.loads(p.read_text(encoding="utf-8"))
    user = sorted(r for r, s in statuses.items() if s.get("status") == "user_error")
    if user:
        return UserError(statuses[user[0]]["message"])
    launcher_text = (
        (run_path / "launcher.log").read_text(encoding="utf-8", errors="replace")
        if (run_path / "launcher.log").exists()
        else ""
    )
    failures, root = _parse_torchrun_failures(launcher_text)
    innocent = {"peer_lost", "ok"}
    culprits = [
        r
        for r, code in failures.items()
        if statuses.get(r, {}).get("status") not in innocent and code != -signal.SIGTERM
    ]
    rank: int | None
    if culprits:
        rank = root if root in culprits else min(culprits)
    elif root is not None:
        rank = root
    else:
        rank = min(failures) if failures else None
    if checkpoint_step is not None:
        resume = (
            f"the last checkpoint of this attempt is at step {checkpoint_step} ({checkpoint}); rerun to resume from it"
        )
    elif checkpoint and os.path.exists(checkpoint):
        resume = f"no new checkpoint was written; rerunning resumes from the existing {checkpoint}"
    else:
        resume = "no checkpoint was written; a rerun starts over"
    if rank is None:
        code: int | None = rc
        tail = _tail(run_path / "launcher.log")
        message = (
            f"training with {nproc} processes failed: torch.distributed.run exited with code {rc} before "
            f"naming a failed rank. Last lines of {run_path / 'launcher.log'}:\n{_indent(tail)}\n{resume}"
        )
    else:
        code = failures.get(rank)
        status = statuses.get(rank, {})
        log_path = run_path / f"rank-{rank}.log"
        tail = _tail(log_path)
        what = f" ({status['message']})" if status.get("message") else ""
        message = (
            f"training process rank {rank} of {nproc} {_describe_exit(code)}{what}; the other processes were "
            f"stopped. Last lines of its log {log_path}:\n{_indent(tail) or '    (empty)'}\n{resume}"
        )
    return TrainingProcessError(
        message,
        rank=rank,
        exit_code=code,
        world_size=nproc,
        log_tail=tail,
        run_dir=str(run_path),
        checkpoint_step=checkpoint_step,
    )


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
