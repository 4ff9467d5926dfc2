"""A full disk during a run: the artifact root on a small tmpfs that a filler file leaves almost no room on."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pytest

from tasks.registry import open_store
from tests.reliability.digests import all_digests
from tests.reliability.environment import Env, run_pipeline
from tests.support.small_disk import small_disk

DISK = "64m"  # the tmpfs: room for the whole tiny run once the filler is gone
ROOM = 512 * 1024  # what the filler leaves free: less than the corpus stage writes


def full_disk(env: Env, workdir: Path, reference: dict) -> dict:
    """``flows.cli run --tiny`` on a root the corpus stage fills: exit 2, one ``error:`` line naming the stage and
    the path, no traceback, nothing published (no version directory at all); then the filler deleted and the same
    root rerun: it completes and its data equal the uninterrupted run's. Not run (said so) where no tmpfs can be
    mounted."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    row: dict = {"case": f"artifact root on a {DISK} tmpfs with {ROOM // 1024} KiB free", "ok": False}
    with contextlib.ExitStack() as stack:
        try:
            disk = stack.enter_context(small_disk(workdir / "disk", DISK))
        except pytest.skip.Exception as e:
            return {**row, "outcome": f"not run: {e}", "ok": None}
        filler = disk / "filler"
        with open(filler, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, shutil.disk_usage(disk).free - ROOM)
        root = disk / "root"
        full = run_pipeline(env, root, log_path=workdir / "full.log")
        errors = [line for line in full.log.splitlines() if line.startswith("error: ")]
        row["code"] = full.rc
        row["message"] = errors[-1] if errors else full.log.strip()[-300:]
        row["error_lines"] = len(errors)
        row["traceback"] = "Traceback" in full.log
        left = sorted(str(p.relative_to(root)) for p in root.glob("*/*") if not p.name.startswith("."))
        row["nothing_published"] = not open_store(root).versions() and not left
        if left:
            row["message"] += f"; LEFT: {left}"
        named = row["message"].startswith(f"error: corpus: no space left on the device writing {root}")
        filler.unlink()
        again = run_pipeline(env, root, log_path=workdir / "rerun.log")
        row["rerun_code"] = again.rc
        row["rerun_equal"] = again.rc == 0 and all_digests(root) == reference
        row["staging_left"] = sorted(str(p.relative_to(root)) for p in root.glob("*/.staging/*"))
        row["violations"] = full.violations + again.violations
        row["outcome"] = "error, then the rerun recovered" if row["rerun_equal"] else "NOT RECOVERED"
        row["ok"] = (
            full.rc == 2
            and len(errors) == 1
            and named
            and not row["traceback"]
            and row["nothing_published"]
            and row["rerun_equal"]
            and not row["staging_left"]
            and not row["violations"]
        )
    return row
