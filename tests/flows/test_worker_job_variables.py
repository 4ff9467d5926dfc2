"""What a run's caller may vary on a ``prefect worker``: the work pool made from ``prefect-work-pool.json`` (the
documented ``prefect work-pool create``) refuses a run whose job variables set the worker's environment, command
or working directory, so the worker's own ``WIKI_PIPELINE_ALLOWED_ROOTS`` holds and no caller's command runs; a
real worker process runs what is allowed, confined by that setting."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from prefect.workers.process import ProcessWorker

from flows.allowed import ENV_ROOTS, WORK_POOL_TEMPLATE
from flows.server import HEARTBEAT_SECONDS
from tests.support import REPO
from tests.support.processes import stop_processes
from tests.support.wait import wait_for

PREFECT = str(Path(sys.executable).with_name("prefect"))


def _prefect(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PREFECT, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _client_call(fn):
    from prefect.client.orchestration import get_client

    async def call():
        async with get_client() as client:
            return await fn(client)

    return asyncio.run(call())


def test_the_template_fixes_what_the_deployment_needs_from_the_pool():
    """The heartbeat the crash automation expects, and no analytics: fixed by the template, which callers cannot
    vary, and no longer in prefect.yaml's job variables (the template declares no ``env`` for them to set)."""
    template = json.loads((REPO / WORK_POOL_TEMPLATE).read_text())
    config, variables = template["job_configuration"], template["variables"]
    assert config["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == str(HEARTBEAT_SECONDS)
    assert config["command"] is None and config["working_dir"] is None
    assert variables["additionalProperties"] is False
    assert not {"command", "env", "working_dir"} & set(variables["properties"])
    deployment = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"][0]
    assert not deployment["work_pool"]["job_variables"]


@pytest.fixture
def confined_pool(prefect_server, tmp_path):
    """A pool made the documented way (its own name: the session server is shared), a deployment of the flow in
    it (the checkout as its working directory, prefect.yaml's job variables), and a worker's environment that
    allows the artifact root tmp/allowed only."""
    pool = f"wiki-local-{uuid.uuid4().hex[:8]}"
    env = {**prefect_server.env, "PREFECT_API_URL": prefect_server.api_url}
    made = _prefect(env, "work-pool", "create", pool, "--type", "process", "--base-job-template", WORK_POOL_TEMPLATE)
    assert made.returncode == 0, made.stdout + made.stderr
    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"][0]

    from flows.wiki_pipeline import wiki_pipeline

    async def deploy(client):
        flow_id = await client.create_flow_from_name("wiki-pipeline")
        return await client.create_deployment(
            flow_id=flow_id,
            name=pool,
            entrypoint=spec["entrypoint"],
            work_pool_name=pool,
            work_queue_name="default",
            job_variables=spec["work_pool"]["job_variables"],
            pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}],
            tags=spec["tags"],
            parameter_openapi_schema=wiki_pipeline.parameters.model_dump(mode="json"),
        )

    deployment_id = _client_call(deploy)
    (tmp_path / "allowed").mkdir()
    worker_env = {**env, ENV_ROOTS: str(tmp_path / "allowed"), "PREFECT_WORKER_QUERY_SECONDS": "1"}
    return pool, deployment_id, env, worker_env


def test_a_caller_cannot_set_the_workers_environment_command_or_directory(confined_pool, tmp_path):
    pool, deployment_id, env, worker_env = confined_pool
    outside = tmp_path / "outside"
    pwned = tmp_path / "pwned.txt"
    attacks = [
        ("env", json.dumps({ENV_ROOTS: "/"})),
        (f"env.{ENV_ROOTS}", "/"),
        ("command", f"sh -c 'id > {pwned}'"),
        ("working_dir", str(outside)),
    ]
    # one `prefect deployment run` per attack, all at once (each is its own CLI process, refused by the server)
    calls = {
        name: subprocess.Popen(
            [
                PREFECT,
                "deployment",
                "run",
                f"wiki-pipeline/{pool}",
                "--param",
                "run=" + json.dumps({"artifacts_dir": str(outside)}),
                "--job-variable",
                f"{name}={value}",
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, value in attacks
    }
    try:
        for name, call in calls.items():
            out, err = call.communicate(timeout=300)
            said = " ".join((out + err).split())  # the CLI wraps its lines
            assert call.returncode != 0, f"a run with job variable {name} was created: {said[-3000:]}"
            refusal = f"Failure reason: Additional properties are not allowed ('{name}' was unexpected)"
            assert f"Error creating flow run: Validation failed. {refusal}" in said, said[-3000:]
    finally:
        for call in calls.values():
            if call.poll() is None:
                call.kill()
            call.wait()

    async def through_the_api(client):  # what the CLI sends, straight to the API: the same refusal
        return await client.create_flow_run_from_deployment(deployment_id, job_variables={"env": {ENV_ROOTS: "/"}})

    from prefect.exceptions import PrefectHTTPStatusError

    with pytest.raises(PrefectHTTPStatusError, match="422"):
        _client_call(through_the_api)

    async def a_deployment_that_sets_env(client):  # nor can a deployment set what callers may not
        return await client.create_deployment(
            flow_id=await client.create_flow_from_name("wiki-pipeline"),
            name=f"{pool}-env",
            entrypoint="flows/wiki_pipeline.py:wiki_pipeline",
            work_pool_name=pool,
            job_variables={"env": {ENV_ROOTS: "/"}},
        )

    with pytest.raises(PrefectHTTPStatusError, match="422"):
        _client_call(a_deployment_that_sets_env)

    # a real worker takes what may run: a run whose root is outside the worker's allowed roots fails on the
    # flow's first line, confined by the worker's own environment; nothing of the refused runs ever ran
    async def allowed_run(client):
        return await client.create_flow_run_from_deployment(
            deployment_id, parameters={"run": {"artifacts_dir": str(outside)}}, job_variables={"stream_output": True}
        )

    run = _client_call(allowed_run)
    # the pool remade later with Prefect's stock template (as the docs once said): the next run is refused at once,
    # naming the fix, though its caller set nothing (another caller could have)
    stock = tmp_path / "stock.json"
    stock.write_text(json.dumps(ProcessWorker.get_default_base_job_template()))
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        worker = subprocess.Popen(
            [PREFECT, "worker", "start", "--pool", pool, "--limit", "1"],
            cwd=REPO,
            env=worker_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        done = wait_for(
            lambda: (r := _client_call(lambda c: c.read_flow_run(run.id))).state.is_final() and r,
            "the allowed run to end",
            timeout=300,
            every=0.5,
        )
        remade = _prefect(env, "work-pool", "update", pool, "--base-job-template", str(stock))
        assert remade.returncode == 0, remade.stdout + remade.stderr
        second = _client_call(allowed_run)
        refused = wait_for(
            lambda: (r := _client_call(lambda c: c.read_flow_run(second.id))).state.is_final() and r,
            "the run through the stock pool to end",
            timeout=300,
            every=0.5,
        )
        runs = _client_call(lambda c: c.read_flow_runs())
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGINT)  # a worker stops on SIGINT
        stop_processes(worker)
    log_text = log_path.read_text()
    assert done.state.name == "Failed" and refused.state.name == "Failed", log_text[-4000:]
    assert f"run.artifacts_dir {outside} (resolved: {outside}) is outside the artifact roots" in log_text
    assert (
        f"work pool {pool} lets whoever triggers a run set command, env, working_dir, any job variable it does "
        f"not declare (it lacks additionalProperties: false)" in " ".join(log_text.split())
    ), log_text[-4000:]
    assert sorted(r.id for r in runs if r.deployment_id == deployment_id) == sorted([run.id, second.id])
    assert not outside.exists() and not pwned.exists()
