"""A small tmpfs to fill: a full disk for real (mounted as root; the test is skipped where mounting is refused)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(where: Path, size: str = "1m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` (made), unmounted afterwards."""
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)
