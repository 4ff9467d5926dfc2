"""A SIGKILLed ``wiki-pipeline run`` does not stay Running: its heartbeats stop and the server's automation (made by
the CLI when missing) marks the tagged run Crashed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from flows.server import (
    CRASH_AUTOMATION,
    CRASHED_AFTER,
    HEARTBEAT_TAG,
    crash_orphaned_task_runs,
    ensure_crash_automation,
    watched_runs,
)
from tests.support import REPO
from tests.support.wait import wait_for


def _client():
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def test_watched_runs_make_the_automation_once_and_tag_and_beat_their_runs(prefect_server):
    from prefect import flow
    from prefect.settings import get_current_settings

    seen = {}

    @flow(name="watched-run-test")
    def probe() -> None:
        from prefect.runtime import flow_run

        seen["tags"] = list(flow_run.tags)
        seen["beat"] = get_current_settings().flows.heartbeat_frequency

    with watched_runs():
        probe()
    ensure_crash_automation()  # idempotent: still one
    with _client() as client:
        found = client.read_automations_by_name(CRASH_AUTOMATION)
    assert len(found) == 1
    trigger = found[0].trigger
    assert trigger.posture == "Proactive" and trigger.within.total_seconds() == CRASHED_AFTER
    assert trigger.after == {"prefect.flow-run.heartbeat"} and trigger.expect == {"prefect.flow-run.*"}
    assert [a.state.value for a in found[0].actions] == ["CRASHED"]
    assert HEARTBEAT_TAG in seen["tags"] and seen["beat"] == 30


@pytest.mark.slow  # bounded by Prefect's minimum heartbeat and CRASHED_AFTER
def test_a_sigkilled_run_shows_crashed(prefect_server, tmp_path, mirror):
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterTags

    root = tmp_path / f"art-{uuid.uuid4().hex[:6]}"
    mirror.set_faults(stall=600, stall_after=1000, stall_times=-1)  # the download never ends
    env = {**prefect_server.env, "PREFECT_LOGGING_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("wiki-pipeline")),
            "run",
            "--tiny",
            "--source-url",
            mirror.url(),
            "--artifacts-dir",
            str(root),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:

        def running_corpus():
            with _client() as client:
                runs = client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[HEARTBEAT_TAG]))
                )
                mine = [r for r in runs if r.parameters.get("run", {}).get("artifacts_dir") == str(root)]
                if not mine or not mine[0].state.is_running():
                    return None
                tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[mine[0].id])))
                return mine[0] if any(t.state and t.state.is_running() for t in tasks) else None

        run = wait_for(running_corpus, "the run's corpus stage to be downloading", timeout=180, every=0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def crashed():
        with _client() as client:
            state = client.read_flow_run(run.id).state
        return state if state.is_final() else None

    state = wait_for(crashed, "the killed run to be marked Crashed", timeout=CRASHED_AFTER + 120, every=2)
    assert state.name == "Crashed" and "no heartbeat" in (state.message or "")
    crash_orphaned_task_runs()  # what the next `wiki-pipeline run` or `serve` does first
    with _client() as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
    states = {t.name: t.state.name for t in tasks}
    assert states.get("corpus") == "Crashed" and set(states.values()) == {"Crashed"}, states


def test_the_task_runs_a_crashed_run_left_running_are_set_crashed(prefect_server):
    from prefect import flow, task
    from prefect.states import Crashed, Running

    @flow(name="crashed-run-test")
    def dead() -> None:
        pass

    @task(name="stage-test")
    def stage() -> None:
        pass

    with _client() as client:
        run = client.create_flow_run(dead, tags=[HEARTBEAT_TAG], state=Running())
        other = client.create_flow_run(dead, state=Running())  # not ours (no tag): left alone
        tasks = [client.create_task_run(stage, r.id, dynamic_key="0", state=Running()) for r in (run, other)]
        for r in (run, other):
            client.set_flow_run_state(r.id, Crashed(message="no heartbeat"), force=True)
        assert crash_orphaned_task_runs() >= 1
        states = [client.read_task_run(t.id).state for t in tasks]
    assert [s.name for s in states] == ["Crashed", "Running"]
    assert states[0].message == "its flow run crashed (no heartbeat): the process was killed or lost"
