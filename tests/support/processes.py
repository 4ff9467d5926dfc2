"""Stopping the processes a test started."""

from __future__ import annotations

import subprocess


def stop_processes(*procs: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM each of ``procs`` still running, then wait up to ``timeout`` s for each and SIGKILL what is left."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
