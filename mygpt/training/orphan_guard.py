"""Processes that die with their parent, so a killed launcher leaves no training process behind.

``python -m mygpt.training.orphan_guard PARENT_PID -- COMMAND...`` asks the kernel to SIGKILL it when its parent
dies (Linux ``PR_SET_PDEATHSIG``, which survives the ``exec`` of ``COMMAND``); elsewhere :func:`watch_process`
polls. Imports nothing heavy.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

__all__ = ["GUARDED_PID_ENV", "die_with_parent", "main", "watch_process"]

_PR_SET_PDEATHSIG = 1
#: set by ``main`` to its own pid, which the exec'd command keeps: its children know their parent's pid
GUARDED_PID_ENV = "MYGPT_GUARDED_PID"


def die_with_parent(expected_parent: int | None = None, sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent exits (exit at once if the parent is no longer
    ``expected_parent``); whether the kernel took the request. Usable as a ``Popen`` ``preexec_fn``."""
    armed = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
        except (OSError, AttributeError):  # pragma: no cover - exotic libc
            armed = False
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)  # the parent died before the request took effect
    return armed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - exists, owned by someone else
        return True
    return True


def watch_process(pid: int, parent: int | None = None, interval: float = 1.0) -> threading.Thread:
    """A daemon thread that ends this process (``os._exit(1)``) once ``pid`` is gone or, with ``parent``,
    once this process's parent is no longer ``parent``."""

    def run() -> None:
        while True:
            time.sleep(interval)
            if not _alive(pid) or (parent is not None and os.getppid() != parent):
                os._exit(1)

    thread = threading.Thread(target=run, name="mygpt-orphan-guard", daemon=True)
    thread.start()
    return thread


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: python -m mygpt.training.orphan_guard PARENT_PID -- COMMAND...")
    die_with_parent(int(argv[0]))
    os.environ[GUARDED_PID_ENV] = str(os.getpid())
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":  # pragma: no cover - exercised through the launcher
    main(sys.argv[1:])
