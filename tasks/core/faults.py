"""Named crash points for the reliability harness: off unless ``WIKI_PIPELINE_FAULT`` says otherwise."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

# ---- fault injection (test hook, off by default) -------------------------------------------------------
FAULT_ENV = "WIKI_PIPELINE_FAULT"


FAULT_TRACE_ENV = "WIKI_PIPELINE_FAULT_TRACE"


FAULT_HOLD_SECONDS = 300  #: the longest a ``hold=`` fault waits for its file


_fault_calls: dict[str, int] = {}


class FaultInjected(BaseException):
    """Raised by :func:`fault_point` in ``raise`` mode: an in-process stand-in for a crash (BaseException, so
    no ``except Exception`` swallows it)."""


def reset_faults() -> None:
    """Forget the per-point call counts (for in-process use)."""
    _fault_calls.clear()


def fault_point(name: str) -> None:
    """A named point where the reliability harness can crash the pipeline. Does nothing unless the environment says so.

    Points (``<stage>`` is any stage of ``tasks.registry``): ``<stage>.start`` (staging opened,
    build not started), ``<stage>.progress`` (every :meth:`BuildContext.progress` call, before its throttling),
    ``<stage>.publish`` (manifest written in staging, not yet renamed into place) and ``<stage>.published``
    (renamed into place, staging not yet deleted).

    ``WIKI_PIPELINE_FAULT=<point>@<n>`` SIGKILLs this process at the n-th call of ``<point>`` (counted per
    process); ``<point>@<n>:raise`` raises :class:`FaultInjected` instead; ``<point>@<n>:hold=<file>`` waits
    there until ``<file>`` exists (a harness holds a build at a known point while another run meets it; after
    :data:`FAULT_HOLD_SECONDS` it says so and goes on). Any other spec is an error. ``WIKI_PIPELINE_FAULT_TRACE=<file>``
    appends ``<point> <n>`` for every call (so a harness can pick random points that a run really reaches).
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
    """``<point>@<n>[:raise|:hold=<file>]`` as (point, n, mode); a clear error for anything else, so that a mistyped
    spec neither kills the process nor holds it where the harness did not mean to."""
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
