"""Rerunning parts of the pipeline: force=["bpe"] rebuilds the tokenizer and everything after it; only= runs one
stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.registry import NAMES, open_store
from tests.support.prefect_server import rebuilt_from, task_run_states
from tests.support.tiny import tiny_flow_parameters, tiny_zip_url


@pytest.fixture(scope="module")
def tiny_run(prefect_server, tmp_path_factory):
    from flows.wiki_pipeline import wiki_pipeline

    tmp = tmp_path_factory.mktemp("force")
    url = tiny_zip_url(tmp)

    def parameters(**groups):
        return tiny_flow_parameters(url, tmp / "art", **groups)

    def run(**groups):
        state = wiki_pipeline(**parameters(**groups), return_state=True)
        return state.result(), task_run_states(state.state_details.flow_run_id)

    run.parameters = parameters  # type: ignore[attr-defined]  # for a run in another process
    return run, open_store(tmp / "art")


def test_force_bpe_rebuilds_bpe_and_everything_after_it(tiny_run):
    run, store = tiny_run
    first, states = run()
    assert states == dict.fromkeys(NAMES, "Completed")

    again, states = run()
    assert states == dict.fromkeys(NAMES, "Cached")
    assert again == first

    forced, states = run(run={"force": ["bpe"]})  # the old task name still works
    assert states == rebuilt_from("tokenizer")
    assert forced["corpus"] == first["corpus"], "download reused"
    assert forced["tokenizer"]["version"] == first["tokenizer"]["version"], "same parameters, same version ..."
    assert forced["tokenizer"]["build_id"] != first["tokenizer"]["build_id"], "... rebuilt"
    for stage in NAMES[NAMES.index("tokenizer") + 1 :]:  # the same bytes in: the same versions, rebuilt in place
        assert forced[stage]["version"] == first[stage]["version"], f"{stage}: inputs named by their bytes"
        assert forced[stage]["build_id"] != first[stage]["build_id"], f"{stage}: rebuilt"
        inputs = store.get(stage, forced[stage]["version"]).manifest["inputs"]
        assert all(ref["build_id"] == forced[name]["build_id"] for name, ref in inputs.items())


#: What a rerun whose stages are all Cached has no use for (each costs start-up time to import).
STAGE_NAMES = list(NAMES)
HEAVY = ("torch", "transformers", "safetensors", "tokenizers", "pyarrow", "dask", "distributed", "pandas")


def test_a_cached_rerun_runs_in_a_process_that_loads_no_torch(tiny_run, prefect_server):
    """An all-Cached rerun imports none of :data:`HEAVY`; the flow run carries the heartbeat tag and the user's,
    its task runs only the user's."""
    import subprocess
    import sys

    from mygpt.limits import resolves_to_cpu
    from tests.support import REPO

    if not resolves_to_cpu("auto"):
        pytest.skip("device auto may be an accelerator here: torch answers it")
    run, _ = tiny_run
    run()  # built here unless an earlier test built it
    code = f"""
import json, sys
from prefect import tags
from flows.server import HEARTBEAT_TAG
from flows.wiki_pipeline import wiki_pipeline
with tags(HEARTBEAT_TAG, "mine"):
    state = wiki_pipeline(**json.loads(sys.argv[1]), return_state=True)
state.result()
loaded = sorted(m for m in {HEAVY!r} if m in sys.modules)
print("RESULT " + json.dumps({{"flow_run_id": str(state.state_details.flow_run_id), "loaded": loaded}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(run.parameters())],
        cwd=REPO,
        env=prefect_server.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert task_run_states(result["flow_run_id"]) == dict.fromkeys(NAMES, "Cached")
    assert result["loaded"] == [], f"a cached rerun loaded {result['loaded']}"
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.server import HEARTBEAT_TAG

    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(result["flow_run_id"])
        task_runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))
    assert {HEARTBEAT_TAG, "mine"} <= set(flow_run.tags)
    assert {run.name: sorted(run.tags) for run in task_runs} == {name: ["mine"] for name in NAMES}


def test_only_sample_runs_one_stage_against_the_latest_model(tiny_run):
    run, store = tiny_run
    latest_model = store.versions("model")[-1]
    out, states = run(run={"only": "samples"}, samples={"prompt": "In 1999 , the"})
    assert states == {"samples": "Completed"}
    assert out["model"]["version"] == latest_model.version
    samples = json.loads((Path(out["samples"]["path"]) / "samples.json").read_text())
    assert samples[0]["prompt"] == "In 1999 , the"
    inputs = store.get("samples", out["samples"]["version"]).manifest["inputs"]
    assert inputs["model"]["version"] == latest_model.version

    out, states = run(run={"only": "train"}, model={"steps": 20})  # follows the lineage: latest shards + tokenizer
    assert states == {"model": "Completed"}
    shards = store.versions("shards")[-1]
    assert out["shards"]["version"] == shards.version
    assert out["tokenizer"]["version"] == shards.manifest["inputs"]["tokenizer"]["version"]
