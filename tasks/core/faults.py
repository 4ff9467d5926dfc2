"""Named crash points for the reliability harness: off unless ``WIKI_PIPELINE_FAULT`` says otherwise."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

FAULT_ENV = "WIKI_PIPELINE_FAULT"
FAULT_TRACE_ENV = "WIKI_PIPELINE_FAULT_TRACE"
FAULT_HOLD_SECONDS = 300  # the longest a ``hold=`` fault waits for its file


_fault_calls: dict[str, int] = {}


class FaultInjected(BaseException):
    """A crash in ``raise`` mode (a BaseException, so no ``except Exception`` swallows it)."""


def reset_faults() -> None:
    """Forget the per-point call counts (for in-process use)."""
    _fault_calls.clear()


def fault_point(name: str) -> None:
    """Crash here when ``WIKI_PIPELINE_FAULT=<point>@<n>`` names this point's n-th call (SIGKILL; ``:raise``
    raises :class:`FaultInjected`; ``:hold=<file>`` waits for the file); ``WIKI_PIPELINE_FAULT_TRACE=<file>``
    logs every call. Points: ``<stage>.start``, ``.progress``, ``.publish``, ``.published`` (docs/RELIABILITY.md).
    """
    spec = os.environ.get(FAULT_ENV)
    trace = os.environ.get(FAULT_TRACE_ENV)
    if not spec and not trace:
        return
    n = _fault_calls[name] = _fault_calls.get(name, 0) + 1
    if trace:
        with open(trace, "a", encoding="utf-8") as f:
            f.write(f"{name} {n}\n")
    if spec:
        point, count, mode = _parse_fault(spec)
        if point == name and n == count:
            if mode == "raise":
                raise FaultInjected(f"fault injected at {name}@{n}")
            if mode.startswith("hold="):
                release = mode[len("hold=") :]
                deadline = time.monotonic() + FAULT_HOLD_SECONDS
                while not os.path.exists(release):
                    if time.monotonic() > deadline:
                        print(
                            f"{FAULT_ENV}: {name}@{n} held {FAULT_HOLD_SECONDS} s, {release} never appeared; going on",
                            file=sys.stderr,
                            flush=True,
                        )
                        break
                    time.sleep(0.05)
                return
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)


def _parse_fault(spec: str) -> tuple[str, int, str]:
    """``<point>@<n>[:raise|:hold=<file>]`` as (point, n, mode); ``ValueError`` for anything else (a mistyped
    spec must not kill the process)."""
    target, colon, mode = spec.partition(":")
    point, _, count = target.rpartition("@")
    if not point or not count.isdigit() or int(count) < 1 or (colon and mode != "raise" and not _is_hold(mode)):
        raise ValueError(
            f"{FAULT_ENV}={spec!r} is not a fault spec: write <point>@<n> (SIGKILL at the n-th call, n >= 1), "
            "<point>@<n>:raise or <point>@<n>:hold=<file>; unset it to run without faults"
        )
    return point, int(count), mode


def _is_hold(mode: str) -> bool:
    return mode.startswith("hold=") and len(mode) > len("hold=")
