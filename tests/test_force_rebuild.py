"""Rerunning parts of the pipeline: force=["bpe"] rebuilds bpe and everything after it; only= runs one stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.params import TINY
from tasks.store import ArtifactStore
from tests.prefect_server import task_run_states
from tests.tiny import tiny_zip_url


@pytest.fixture(scope="module")
def tiny_run(prefect_server, tmp_path_factory):
    from flows.wiki_pipeline import wiki_pipeline

    tmp = tmp_path_factory.mktemp("force")
    params = {**TINY, "source_url": tiny_zip_url(tmp), "artifacts_dir": str(tmp / "art")}

    def run(**extra):
        state = wiki_pipeline(**{**params, **extra}, return_state=True)
        return state.result(), task_run_states(state.state_details.flow_run_id)

    return run, ArtifactStore(tmp / "art")


def test_force_bpe_rebuilds_bpe_and_everything_after_it(tiny_run):
    run, store = tiny_run
    first, states = run()
    assert set(states.values()) == {"Completed"} and len(states) == 5

    again, states = run()
    assert states == dict.fromkeys(["download", "bpe", "encode", "train", "sample"], "Cached")
    assert again == first

    forced, states = run(force=["bpe"])
    assert states == {"download": "Cached", "bpe": "Completed", "encode": "Completed", "train": "Completed",
                      "sample": "Completed"}
    assert forced["corpus"] == first["corpus"], "download reused"
    assert forced["tokenizer"]["version"] == first["tokenizer"]["version"], "same parameters, same version ..."
    assert forced["tokenizer"]["build_id"] != first["tokenizer"]["build_id"], "... rebuilt"
    for stage in ("shards", "model", "samples"):
        assert forced[stage]["version"] != first[stage]["version"], f"{stage}: new lineage, new version"
        assert store.verify(stage, first[stage]["version"]) == (True, "ok"), f"{stage}: old version kept"
        inputs = store.get(stage, forced[stage]["version"]).manifest["inputs"]
        assert all(ref["build_id"] == forced[name]["build_id"] for name, ref in inputs.items())


def test_only_sample_runs_one_stage_against_the_latest_model(tiny_run):
    run, store = tiny_run
    latest_model = store.versions("model")[-1]
    out, states = run(only="sample", prompt="In 1999 , the")
    assert states == {"sample": "Completed"}
    assert out["model"]["version"] == latest_model.version
    samples = json.loads((Path(out["samples"]["path"]) / "samples.json").read_text())
    assert samples[0]["prompt"] == "In 1999 , the"
    inputs = store.get("samples", out["samples"]["version"]).manifest["inputs"]
    assert inputs["model"]["version"] == latest_model.version

    out, states = run(only="train", steps=20)  # train follows the lineage: latest shards + their tokenizer
    assert states == {"train": "Completed"}
    shards = store.versions("shards")[-1]
    assert out["shards"]["version"] == shards.version
    assert out["tokenizer"]["version"] == shards.manifest["inputs"]["tokenizer"]["version"]
