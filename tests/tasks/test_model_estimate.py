"""The model stage logs the library's estimate of the run's wall time and carries it on its progress (the UI's
progress artifact has the same description as the progress log line)."""

from __future__ import annotations

import logging
import re


def test_the_model_stage_logs_the_run_estimate_and_shows_it_on_its_progress(upstream, caplog):
    from tasks.model import train_model
    from tests.support.tiny import SETTINGS, run_in

    root, _, tokenizer, shards = upstream
    settings = SETTINGS.model.model_copy(update={"seed": 4242})  # a version of its own: built, not reused
    with caplog.at_level(logging.INFO):
        train_model.fn(shards, tokenizer, settings, run_in(root))
    lines = caplog.text.splitlines()
    steps = settings.steps
    assert sum(f"estimate: the run's {steps} steps take about " in line for line in lines) == 1, caplog.text
    progress = [line for line in lines if re.search(rf"model: +\d+\.\d% step \d+/{steps} loss", line)]
    assert progress and f" · the run's {steps} steps take about " in progress[-1], progress
