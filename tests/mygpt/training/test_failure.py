"""The failure report of a data-parallel run: the rank that failed first is blamed."""

from __future__ import annotations

import json

from mygpt.errors import UserError
from mygpt.training.failure import TrainingProcessError, diagnose


def test_failure_report_blames_the_first_failure(tmp_path):
    """torchrun may list the rank that only lost its peer as the root cause; the status files decide."""
    (tmp_path / "rank-0.status.json").write_text(json.dumps({"status": "peer_lost", "message": "RuntimeError: gloo"}))
    (tmp_path / "rank-1.log").write_text("rank 1 starting\nSegmentation fault\n")
    (tmp_path / "launcher.log").write_text(
        "Root Cause (first observed failure):\n[0]:\n  time      : x\n  host      : h\n"
        "  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 11)\n  error_file: <N/A>\nFailures:\n[1]:\n"
        "  rank      : 1 (local_rank: 1)\n  exitcode  : -11 (pid: 12)\n"
    )
    e = diagnose(1, 2, tmp_path, None, None)
    assert isinstance(e, TrainingProcessError) and (e.rank, e.exit_code) == (1, -11)
    assert "rank 1 of 2 was killed by SIGSEGV" in str(e) and "Segmentation fault" in e.log_tail
    (tmp_path / "rank-1.status.json").write_text(json.dumps({"status": "user_error", "message": "lr differs"}))
    e = diagnose(2, 2, tmp_path, None, None)
    assert isinstance(e, UserError) and str(e) == "lr differs"


def test_a_failure_that_names_no_rank_shows_torchruns_own_log(tmp_path):
    (tmp_path / "launcher.log").write_text("torchrun could not start\n")
    e = diagnose(3, 2, tmp_path, None, None)
    assert isinstance(e, TrainingProcessError) and (e.rank, e.exit_code, e.world_size) == (None, 3, 2)
    assert "exited with code 3 before naming a failed rank" in str(e) and "torchrun could not start" in e.log_tail
    assert str(e).endswith("no checkpoint was written; a rerun starts over")
