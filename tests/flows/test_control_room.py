"""The Prefect UI and the terminal as the pipeline's control room, through a real Prefect server, the
real deployment runner (`wiki-pipeline serve --tiny --source-url <loopback mirror>`, what `scripts/pipeline
--demo` starts) and the real `prefect deployment run --watch` command:

- a bare `prefect deployment run wiki-pipeline/wiki-pipeline` (what the UI's Run button does) runs the tiny
  preset offline, because the deployment's defaults are what `serve` was given;
- each stage's task run ends built (Completed) or Cached, its message naming the version and size (what
  `scripts/pipeline` prints per stage); `--watch` of a failed run shows the reason and exits 1;
- every run publishes `wiki-run-summary` (built vs Cached per stage) and the model/tokenizer comparisons;
- a run cancelled through the API (what the UI's Cancel button does) ends Cancelled with its process gone.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from flows.settings import TINY
from tasks.registry import NAMES, open_store
from tests.support.runner import alive, serving_process
from tests.support.wait import wait_for

STAGES = NAMES
MESSAGE = re.compile(r"^(built|reused) (\w+)/([0-9a-f]{12}) · [\d.]+ \w?B$")


@pytest.fixture(scope="module")
def served(prefect_server, mirror, tmp_path_factory):
    """`wiki-pipeline serve --tiny --source-url <mirror>`: the demo's runner (artifacts under a temp root)."""
    tmp = tmp_path_factory.mktemp("served")
    root = tmp / "art"
    args = ["--tiny", "--source-url", mirror.url(), "--artifacts-dir", str(root)]
    with serving_process(prefect_server.env, tmp / "runner.log", *args) as (proc, log_path):
        yield prefect_server.env, root, log_path, proc.pid


#: The rerun's ``--param``: a partial model group (only these fields), so its model and every stage after it are
#: built again while the data stages are reused, and its warmup is not shorter than its steps (a warning).
PARTIAL_MODEL = {"steps": 20, "warmup": 20}


@pytest.fixture(scope="module")
def two_runs(served) -> tuple[str, str]:
    """(first run id, rerun id): a bare `prefect deployment run` (the deployment's defaults), then one with
    ``--param model='<PARTIAL_MODEL>'``. Two whole pipeline runs, built once for the tests that read them (the
    built/Cached report and comparisons; the partial group's effective settings)."""
    env, _, runner_log, _ = served
    first = deployment_run(env, runner_log)[0]
    return first, deployment_run(env, runner_log, "--param", "model=" + json.dumps(PARTIAL_MODEL))[0]


def deployment_run(env: dict, runner_log: Path, *args: str, ok: bool = True) -> tuple[str, str]:
    """`prefect deployment run wiki-pipeline/wiki-pipeline ARGS --watch`: (the flow run id, what it printed)."""
    prefect = str(Path(sys.executable).with_name("prefect"))
    done = subprocess.run(
        [prefect, "deployment", "run", "wiki-pipeline/wiki-pipeline", *args, "--watch", "--watch-timeout", "300"],
        env={**env, "DO_NOT_TRACK": "1", "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=360,
    )
    found = re.search(r"UUID: ([0-9a-f-]{36})", done.stdout)
    assert found and (done.returncode == 0) == ok, (
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\nrunner:\n{runner_log.read_text()[-3000:]}"
    )
    return found.group(1), done.stdout + done.stderr


def artifact(flow_run_id: str, key: str):
    """The flow run's artifact ``key``; a comparison's key is followed by its root's (``-<root slug>-<hash>``)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    found = [a for a in found if a.key == key or (key.endswith("-comparison") and (a.key or "").startswith(key + "-"))]
    assert len(found) == 1, f"flow run {flow_run_id} has {len(found)} {key} artifact(s), not one"
    return found[0]


def stage_ends(flow_run_id: str) -> dict[str, tuple[str, str]]:
    """{stage: (built|Cached, version)} from the run's task runs, in start order: each final state's name and its
    message (``built model/<version> · 70.8 KB``, ``reused ...`` when Cached), as `scripts/pipeline` prints them."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    found = {}
    for t in sorted(runs, key=lambda t: t.expected_start_time or t.created):
        m = MESSAGE.match(t.state.message or "")
        assert m and m.group(2) == t.name and t.state.name == {"built": "Completed", "reused": "Cached"}[m[1]], t.state
        found[t.name] = ("built" if m.group(1) == "built" else "Cached", m.group(3))
    return found


def test_the_demo_deployment_runs_offline_and_reports_built_cached_and_comparisons(two_runs):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("wiki-pipeline/wiki-pipeline")
    assert deployment.parameters["model"]["steps"] == TINY["model"]["steps"], "the UI form's defaults: the tiny preset"

    first, second = two_runs  # first: bare, the deployment's defaults, the loopback mirror
    lines = stage_ends(first)
    assert list(lines) == list(STAGES) and {v for v, _ in lines.values()} == {"built"}, lines
    summary = artifact(first, "wiki-run-summary")
    assert summary.data.count("| **built** |") == len(STAGES) and "| Cached |" not in summary.data, summary.data
    link = re.search(rf"\[{lines['model'][1]}\]\(/artifacts/artifact/([0-9a-f-]{{36}})\)", summary.data)
    assert link, f"the model's version links no artifact:\n{summary.data}"

    # second: fewer steps (PARTIAL_MODEL)
    lines2 = stage_ends(second)
    before_model = STAGES[: STAGES.index("model")]  # corpus, tokenizer, shards: reused; the model and after: built
    assert {s: v for s, (v, _) in lines2.items()} == {s: "Cached" if s in before_model else "built" for s in STAGES}, (
        lines2
    )
    assert lines2["corpus"][1] == lines["corpus"][1]
    summary = artifact(second, "wiki-run-summary")
    cached, built = summary.data.count("| Cached |"), summary.data.count("| **built** |")
    assert (cached, built) == (len(before_model), len(STAGES) - len(before_model)), summary.data

    comparison = artifact(second, "wiki-model-comparison").data
    rows = [r for r in comparison.splitlines() if r.startswith("| [")]
    assert len(rows) == 2, comparison
    assert rows[0].startswith(f"| [{lines2['model'][1]}]") and rows[1].startswith(f"| [{lines['model'][1]}]")
    head = next(r for r in comparison.splitlines() if r.startswith("| version |"))
    assert "`lr`" not in head and "`embed_dim`" not in head, head  # only the settings that differ
    assert "| 20 |" in rows[0] and "| 40 |" in rows[1]
    import base64

    svg = base64.b64decode(re.search(r"data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)", comparison).group(1)).decode()
    assert svg.count("<polyline") == 2 and lines["model"][1] in svg and lines2["model"][1] in svg
    tokenizers = artifact(second, "wiki-tokenizer-comparison").data
    assert len([r for r in tokenizers.splitlines() if r.startswith("| [")]) == 1, tokenizers


def test_watching_a_failed_run_shows_the_reason_and_exits_1(served):
    env, _, runner_log, _ = served
    bad = {**TINY["model"], "num_heads": 5}
    run_id, shown = deployment_run(env, runner_log, "--params", json.dumps({"model": bad}), ok=False)
    assert "num_heads (5) must divide embed_dim (32)" in shown, shown
    assert "Flow run finished in state 'Failed'" in shown, shown
    summary = artifact(run_id, "wiki-run-summary")  # refused before any stage: the summary says why
    assert summary.description.startswith("Failed: no stage ran"), summary.description
    assert "before any stage: its settings were refused" in summary.data, summary.data
    assert "num\\_heads (5) must divide embed\\_dim (32)" in summary.data, summary.data


def test_a_run_that_fails_in_a_stage_summarises_what_it_got_through(served):
    """The stages before the failing one are in the summary (Cached here), the failing one with its reason."""
    env, _, runner_log, _ = served
    run_id = deployment_run(
        env, runner_log, "--params", json.dumps({"samples": {"prompt": ["\u2603\u2603"]}}), ok=False
    )[0]
    summary = artifact(run_id, "wiki-run-summary")
    assert summary.description.startswith("Failed: "), summary.description
    rows = {r.split(" | ")[0].strip("| "): r for r in summary.data.splitlines() if r.startswith("| ")}
    assert "| Cached |" in rows["corpus"] and "| Cached |" in rows["tokenizer"], summary.data
    assert "shards" not in rows and "model" not in rows, "the run stopped after the tokenizer's early check"
    assert "**Failed after stage tokenizer**: UserError: prompt" in summary.data, summary.data


def test_only_runs_get_their_summary_too(served):
    env, root, runner_log, _ = served
    run_id = deployment_run(
        env, runner_log, "--params", json.dumps({"run": {"artifacts_dir": str(root), "only": "samples"}})
    )[0]
    summary = artifact(run_id, "wiki-run-summary")
    rows = [r for r in summary.data.splitlines() if r.startswith("| samples |")]
    assert len(rows) == 1 and "/artifacts/artifact/" in rows[0], summary.data
    assert artifact(run_id, "wiki-model-comparison").data.count("| [") >= 1

    empty = root / "empty-root"  # nothing published there: only=model cannot start
    run = {"artifacts_dir": str(empty), "only": "model"}
    failed = deployment_run(env, runner_log, "--params", json.dumps({"run": run}), ok=False)[0]
    summary = artifact(failed, "wiki-run-summary").data
    assert "**Failed before any stage ran**: UserError: only='model' needs a published shards version" in summary
    assert "| stage |" not in summary and "Built: made by this run" not in summary, summary


def test_a_partial_group_at_run_time_changes_only_the_fields_it_names(served, two_runs):
    """``--param model='{...}'`` on top of the deployment's model group, field by field (Prefect alone replaces the
    whole group: the run trained the chapter's model); a warmup not shorter than the steps is a warning in the
    log and the run summary; the log shows every group's effective settings."""
    _, root, runner_log, _ = served
    run_id = two_runs[1]  # the rerun with --param model='<PARTIAL_MODEL>'
    steps, warmup = PARTIAL_MODEL["steps"], PARTIAL_MODEL["warmup"]
    summary = artifact(run_id, "wiki-run-summary").data
    model_row = next(r for r in summary.splitlines() if r.startswith("| model |"))
    version = re.search(r"[0-9a-f]{12}", model_row).group(0)
    settings = open_store(root).get("model", version).manifest["settings"]
    assert (settings["steps"], settings["warmup"]) == (steps, warmup), settings
    tiny = {k: v for k, v in TINY["model"].items() if k not in ("steps", "warmup")}
    assert {k: settings[k] for k in tiny} == tiny, "the deployment's other model fields (the tiny model) kept"
    warning = f"model.warmup ({warmup}) is not shorter than steps ({steps}): the learning rate rises for the whole run"
    assert f"**Warning**: {warning}" in summary, summary
    log = runner_log.read_text().partition(run_id)[2]
    assert warning in log and "settings as this run uses them (every field of every group" in log, log[-3000:]
    assert re.search(rf"  model: .*embed_dim=32, .*steps={steps}, ", log) and re.search(r"  run: artifacts_dir=", log)


def flow_run_state(flow_run_id: str) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state
    return state.name if state else "?"


def test_a_run_cancelled_through_the_api_ends_cancelled_with_its_process(served):
    """Last in this module: it leaves a cancelled model build behind."""
    env, _, runner_log, runner_pid = served
    prefect = str(Path(sys.executable).with_name("prefect"))
    long_model = {**TINY["model"], "steps": 100_000}  # trains until cancelled
    started = subprocess.run(
        [prefect, "deployment", "run", "wiki-pipeline/wiki-pipeline", "--params", json.dumps({"model": long_model})],
        env={**env, "DO_NOT_TRACK": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = re.search(r"UUID: ([0-9a-f-]{36})", started.stdout).group(1)
    after_start = lambda: runner_log.read_text().partition(run_id)[2]  # noqa: E731 - this run's log lines
    wait_for(lambda: "step 10: loss" in after_start(), "the model's training loop", every=0.3)
    assert flow_run_state(run_id) == "Running"
    runs = [p for p in psutil.Process(runner_pid).children() if "spawn_main" in " ".join(p.cmdline())]
    assert len(runs) == 1, "the run's process: spawned by the runner"

    cancel = subprocess.run(
        [prefect, "flow-run", "cancel", run_id],
        env={**env, "DO_NOT_TRACK": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    wait_for(lambda: flow_run_state(run_id) == "Cancelled", "the run to end Cancelled", every=0.3)
    wait_for(lambda: not alive(runs[0]), "the cancelled run's process to end", timeout=60, every=0.2)
