"""Polling for an event a test waits on (a process, a file, a scheduler state), failing with what it was."""

from __future__ import annotations

import time

import pytest


def wait_for(condition, what: str, timeout: float = 120.0, every: float = 0.005):
    """Poll ``condition()`` until it returns something truthy and return that; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = condition()
        if got:
            return got
        time.sleep(every)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
