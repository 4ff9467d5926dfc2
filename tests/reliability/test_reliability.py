"""The reliability harness's fast subset: one kill per stage, two runs at once, every network fault, damage
case and bad input, and a full disk, against one uninterrupted reference run (the long run:
``python -m tests.reliability.harness``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tasks.core.faults import FAULT_ENV, FAULT_TRACE_ENV, FaultInjected, fault_point, reset_faults
from tasks.core.settings import RunOptions, Settings
from tasks.core.stage import Stage
from tasks.registry import NAMES, open_store
from tests.reliability.bad_inputs import bad_inputs
from tests.reliability.damage import damage_cases
from tests.reliability.digests import all_digests
from tests.reliability.environment import environment, run_pipeline
from tests.reliability.full_disk import full_disk
from tests.reliability.kills import FAST_FAULTS, Kill, kill_chain, read_trace
from tests.reliability.network import network_faults, source_cases
from tests.reliability.scorecard import scorecard
from tests.reliability.two_runs import concurrent_runs
from tests.support import REPO


@pytest.fixture(scope="module")
def harness(prefect_server, tmp_path_factory, wikitext2_path):
    workdir = tmp_path_factory.mktemp("reliability")
    with environment(workdir, api_env=prefect_server.env) as env:
        trace = workdir / "reference.trace"
        res = run_pipeline(env, workdir / "reference", trace=trace, log_path=workdir / "reference.log")
        assert res.rc == 0, res.log[-3000:]
        assert res.violations == []
        yield env, all_digests(workdir / "reference"), read_trace(trace), workdir


# ---- the hook and the two publish edges it found --------------------------------------------------------
def test_fault_point_is_off_by_default_and_counts_per_point(monkeypatch, tmp_path):
    monkeypatch.delenv(FAULT_ENV, raising=False)
    monkeypatch.delenv(FAULT_TRACE_ENV, raising=False)
    reset_faults()
    fault_point("tokenizer.progress")  # no env: nothing happens, nothing is counted
    monkeypatch.setenv(FAULT_TRACE_ENV, str(tmp_path / "trace"))
    monkeypatch.setenv(FAULT_ENV, "tokenizer.progress@2:raise")
    fault_point("tokenizer.progress")
    fault_point("shards.progress")
    with pytest.raises(FaultInjected, match=r"tokenizer.progress@2"):
        fault_point("tokenizer.progress")
    reset_faults()
    assert (tmp_path / "trace").read_text().split("\n")[:3] == [
        "tokenizer.progress 1",
        "shards.progress 1",
        "tokenizer.progress 2",
    ]


@pytest.mark.parametrize(
    "spec",
    [
        "model.progress@3:hold",
        "model.progress@3:hold=",
        "model.progress@x",
        "model.progress@0",
        "model.progress@3:sigkill",
        "@3",
    ],
)
def test_fault_point_rejects_a_malformed_spec_instead_of_killing_or_holding(monkeypatch, spec):
    monkeypatch.setenv(FAULT_ENV, spec)
    reset_faults()
    with pytest.raises(ValueError, match=r"WIKI_PIPELINE_FAULT=.*is not a fault spec.*<point>@<n>:hold=<file>"):
        fault_point("model.progress")
    reset_faults()


def test_fault_point_hold_says_so_when_its_file_never_comes(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("tasks.core.faults.FAULT_HOLD_SECONDS", 0.2)
    monkeypatch.setenv(FAULT_ENV, f"model.progress@1:hold={tmp_path / 'never'}")
    reset_faults()
    fault_point("model.progress")
    reset_faults()
    assert "model.progress@1 held 0.2 s" in capsys.readouterr().err


def test_fault_point_sigkills_a_real_process():
    code = "from tasks.core.stage import fault_point\nfor _ in range(3): fault_point('model.progress')\nprint('alive')"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, FAULT_ENV: "model.progress@3"},
    )
    assert proc.returncode == -signal.SIGKILL and "alive" not in proc.stdout


class P(Settings):
    p: int = 1


def _run(calls: list, root) -> dict:
    def build(ctx, settings):
        calls.append(ctx.resumed)
        (ctx.out / "data.txt").write_text("same bytes\n")
        return {}

    return Stage(name="samples", settings=P, code_version="t", build=build, report=lambda m: "").reuse_or_build(
        P(), RunOptions(artifacts_dir=str(root)), {}
    )


@pytest.mark.parametrize("edge", ["publish", "published"])
def test_a_kill_at_either_publish_edge_is_recovered(tmp_path, monkeypatch, edge):
    """A publish killed after the manifest is written is rebuilt; one killed after the rename leaves no staging."""
    calls: list = []
    reset_faults()
    monkeypatch.setenv(FAULT_ENV, f"samples.{edge}@1:raise")
    with pytest.raises(FaultInjected):
        _run(calls, tmp_path)
    monkeypatch.delenv(FAULT_ENV)
    store = open_store(tmp_path)
    version = next((tmp_path / "samples" / ".staging").iterdir()).name
    assert store.verify("samples", version)[0] is (edge == "published")
    ref = _run(calls, tmp_path)
    assert store.verify("samples", ref["version"], full=True) == (True, "ok")
    assert not store.staging_path("samples", version).exists()
    assert calls == ([False, True] if edge == "publish" else [False])  # rebuilt / reused


# ---- kills ---------------------------------------------------------------------------------------------
def test_sigkill_inside_each_stage_then_rerun_recovers(harness):
    env, reference, trace, workdir = harness
    for task, fault in FAST_FAULTS:  # every fast kill point is one the reference run reached
        point, n = fault.split("@")
        assert (point, int(n)) in trace[task], (fault, trace[task])
    kills = kill_chain(env, workdir / "kills", FAST_FAULTS, reference)
    report = "\n".join(
        f"{k.task} {k.fault}: killed={k.killed} left={k.left!r} resumed={k.resumed!r} problems={k.problems}"
        for k in kills
    )
    assert all(k.killed for k in kills), report
    assert all(k.recovered for k in kills), report
    by_task = {k.task: k for k in kills}
    assert by_task["corpus"].resumed.startswith("HTTP Range bytes="), report
    assert by_task["corpus"].left.endswith("of the zip in corpus/.sources/downloads/ (.part)"), report
    assert by_task["shards"].resumed.startswith("kept its 13 recorded shard(s)"), report
    assert by_task["model"].left == "resume checkpoint at step 10" and by_task["model"].resumed == "from step 10"
    assert by_task["tokenizer"].left == "manifest written in staging out/, not renamed"
    assert by_task["samples"].left == "version published; its staging dir not yet deleted"
    assert by_task["export"].left == "manifest written in staging out/, not renamed"
    assert not list((workdir / "kills").glob("*/.staging/*")), "no staging left after the final run"


def test_two_runs_at_once_build_each_version_once(harness):
    env, reference, _, workdir = harness
    c = concurrent_runs(env, workdir / "concurrent")
    assert c["rcs"] == [0, 0], c
    assert c["built"] == dict.fromkeys(NAMES, 1), c
    assert c["waited"] >= 1 and c["refs_equal"] and c["verify_full"], c
    assert all(len(v) == 1 for v in c["versions"].values()), c
    assert c["violations"] == [] and c["checks"] > 0, c
    assert all_digests(workdir / "concurrent") == reference


# ---- network, damage, bad input ------------------------------------------------------------------------
def test_network_faults_end_in_the_corpus_or_a_clear_error(harness):
    env, reference, _, workdir = harness
    rows = network_faults(workdir / "net", env.zip_bytes, reference["corpus"])
    assert len(rows) >= 12
    bad = [r for r in rows if not r["handled"]]
    assert not bad, json.dumps(bad, indent=1)
    assert {r["outcome"] for r in rows} == {"corpus", "error"}


def test_new_content_gives_a_new_version_and_credentials_stay_secret(harness):
    env, reference, _, workdir = harness
    rows = source_cases(workdir / "source", env.zip_bytes, reference["corpus"])
    assert [r["outcome"] for r in rows] == ["new version", "corpus"], json.dumps(rows, indent=1)
    assert all(r["handled"] for r in rows), json.dumps(rows, indent=1)


def test_damaged_artifacts_are_detected_logged_and_rebuilt(harness):
    env, reference, _, workdir = harness
    zpath = workdir / "zip" / "wikitext-103-raw-v1.zip"
    zpath.parent.mkdir()
    zpath.write_bytes(env.zip_bytes)
    rows = damage_cases(workdir / "damage", zpath.as_uri(), reference)
    bad = [r for r in rows if not r["detected"]]
    assert not bad, json.dumps(bad, indent=1)
    flip = next(r for r in rows if "flipped" in r["case"])
    assert flip["quick_check"] == "missed (same size)", "only the sha256 (full_check) sees a same-size flip"
    assert len(rows) >= 10


def test_bad_inputs_are_refused_with_their_exact_message_and_publish_nothing(harness):
    env, _, _, workdir = harness
    rows = bad_inputs(workdir / "bad", env.url)
    assert len(rows) >= 91
    bad = [r for r in rows if not r["ok"]]
    assert not bad, json.dumps(bad, indent=1, ensure_ascii=False)


def test_a_full_disk_is_one_error_publishes_nothing_and_a_rerun_on_the_freed_disk_recovers(harness):
    env, reference, _, workdir = harness
    row = full_disk(env, workdir / "full-disk", reference)
    if row["ok"] is None:
        pytest.skip(row["outcome"])
    assert row["ok"], json.dumps(row, indent=1)


def test_scorecard_renders(harness):
    kills = [Kill("model", "model.progress@4", killed=True, left="x", resumed="from step 10", recovered=True)]
    text = scorecard(
        {
            "command": "cmd",
            "when": "now",
            "machine": "m",
            "seconds": 1.0,
            "kills": kills,
            "watcher": {"checks": 3, "runs": 2, "violations": []},
            "concurrent": {
                "rcs": [0, 0],
                "built": {"corpus": 1},
                "waited": 1,
                "refs_equal": True,
                "versions": {"corpus": ["v"]},
                "verify_full": True,
                "violations": [],
                "checks": 1,
                "same_as_reference": True,
            },
            "network": [],
            "damage": [],
            "bad_inputs": [],
        }
    )
    assert "| model | 1 | 1 | 1 | from step 10 |" in text and "Reproduce: `cmd`" in text
