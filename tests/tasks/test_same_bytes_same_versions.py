"""Two independent tiny runs, each on a root of its own, every stage outside Prefect: a version names its inputs
by their content digest, so runs that write the same bytes agree on every version id."""

from __future__ import annotations

import json
from pathlib import Path

from flows.settings import TINY, Pipeline
from tasks.registry import STAGES
from tasks.store import content_digest
from tests.support.stages import every_stage
from tests.support.tiny import run_in, tiny_zip_url


def test_two_roots_agree_on_every_version_id(tmp_path):
    s = Pipeline.parse(**{**TINY, "corpus": {"source_url": tiny_zip_url(tmp_path)}})
    one, two = (every_stage(s, run_in(tmp_path / root)) for root in ("one", "two"))
    assert all(one[k]["build_id"] != two[k]["build_id"] for k in one), "two builds of each: not one reused"
    assert {k: r["version"] for k, r in one.items()} == {k: r["version"] for k, r in two.items()}

    def digest(ref) -> str:
        return content_digest(json.loads((Path(ref["path"]) / "manifest.json").read_text(encoding="utf-8")))

    # what the ids are made of: every input's bytes (a last stage's own files may hold timings: nothing names them)
    inputs = {name for stage in STAGES for name in stage.inputs}
    assert {k: digest(one[k]) for k in inputs} == {k: digest(two[k]) for k in inputs}
