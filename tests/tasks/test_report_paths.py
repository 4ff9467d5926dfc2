"""An artifact root's path in the stages' reports and the run summary is literal text: a root holding backticks,
HTML or a markdown link stays inside its code span (``md_code``), never markup the UI renders."""

from __future__ import annotations

import re

from flows.reports import Outcome, run_summary
from tasks import evaluate, model, samples
from tasks.core.report import md_code
from tasks.registry import open_store
from tests.tasks.store.builds import publish_locked

HOSTILE = "a`<img src=x onerror=alert(1)>`[clickme](javascript:alert(1))"


def test_a_hostile_root_stays_code_in_the_run_summary(tmp_path):
    root = tmp_path / HOSTILE
    publish_locked(open_store(root), "corpus", "c1", {"wiki.test.txt": b"text"})
    md = run_summary(str(root), [Outcome("corpus", "c1", "Cached", 0.1)], {}, None)
    assert md_code(str(root)) in md
    assert not re.search(r"(?<!`)`" + re.escape(str(root)), md), "a one-backtick span the root's own backtick ends"


def test_a_hostile_root_stays_code_in_the_stage_reports(upstream, trained):
    store = open_store(upstream[0])
    for stage, report, files in (
        (model, model.report, ["model.ckpt"]),
        (samples, samples.report, ["samples.md", "samples.json"]),
        (evaluate, evaluate.report, ["evaluate.json"]),
    ):
        versions = store.versions(stage.STAGE.name)
        if not versions:  # samples and evaluate: built here from the session's tiny model
            from tests.support import stages
            from tests.support.tiny import TINY

            root, corpus, _, shards = upstream
            inputs = {"samples": (trained,), "evaluate": (corpus, shards, trained)}[stage.STAGE.name]
            getattr(stages, stage.STAGE.name)(root, *inputs, run=TINY["run"], **TINY[stage.STAGE.name])
            versions = store.versions(stage.STAGE.name)
        where = f"/tmp/{HOSTILE}/{stage.STAGE.name}/{versions[-1].version}"
        md = report({**versions[-1].manifest, "path": where})
        for name in files:
            assert md_code(f"{where}/{name}") in md, (stage.STAGE.name, md)
        assert not re.search(r"(?<!`)`" + re.escape(where), md), stage.STAGE.name
