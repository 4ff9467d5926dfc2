"""A team server: PostgreSQL, a Prefect server with basic auth, ``prefect.yaml``'s deployment and a real worker; two
runs at once on one root both complete, each version built once; the auth string is required and leaks nowhere."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from flows.allowed import WORK_POOL_TEMPLATE
from flows.server import PrefectServer, free_port, running_server
from tasks.registry import NAMES, open_store
from tests.support import REPO
from tests.support.processes import stop_processes
from tests.support.tiny import tiny_flow_parameters, tiny_zip_url
from tests.support.wait import wait_for

PG_BIN = Path(os.environ.get("WIKI_PIPELINE_PG_BIN", "/usr/lib/postgresql/15/bin"))
PASSWORD = uuid.uuid4().hex  # the team's basic-auth password: must appear in no log, manifest or artifact
AUTH = f"team:{PASSWORD}"


class Postgres:
    """A throwaway PostgreSQL cluster on 127.0.0.1 (run as the ``postgres`` user when the tests run as root)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="wiki-pg-"))  # not under pytest's 0700 root-owned basetemp
        self.data = self.dir / "data"
        self.port = free_port()
        self.as_user = []
        if os.geteuid() == 0:
            self.as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.dir, "postgres")
        self.url = f"postgresql+asyncpg://prefect@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        done = subprocess.run([*self.as_user, *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{args[0]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"

    def start(self) -> Postgres:
        self._run(
            str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "prefect", "--auth=trust", "-E", "UTF8", "--no-sync"
        )
        self._run(
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.dir / "postgres.log"),
            "-w",
            "-t",
            "120",
            "-o",
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.data} "
            "-c fsync=off -c max_connections=100",
            "start",
        )
        return self

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run(
                [*self.as_user, str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"],
                capture_output=True,
                timeout=120,
            )
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def team_server(tmp_path, monkeypatch):
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"no PostgreSQL server binaries at {PG_BIN} (Debian's postgresql-15; or set WIKI_PIPELINE_PG_BIN)")
    pg = Postgres().start()
    try:
        monkeypatch.setenv("PREFECT_SERVER_DATABASE_CONNECTION_URL", pg.url)
        monkeypatch.setenv("PREFECT_SERVER_API_AUTH_STRING", AUTH)  # the team setup: basic auth on
        with running_server(PrefectServer(tmp_path / "prefect-home")) as server:
            yield server
    finally:
        pg.stop()


def _prefect(env: dict, *args: str) -> str:
    done = subprocess.run(
        [str(Path(sys.executable).with_name("prefect")), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _client_call(fn):
    from prefect.client.orchestration import get_client

    async def call():
        async with get_client() as client:
            return await fn(client)

    return asyncio.run(call())


def test_two_runs_at_once_through_a_worker_on_postgres(team_server, tmp_path):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    env = {
        k: v
        for k, v in team_server.env.items()
        if k not in ("PREFECT_SERVER_DATABASE_CONNECTION_URL", "PREFECT_SERVER_API_AUTH_STRING")
    }
    assert env["PREFECT_API_AUTH_STRING"] == AUTH  # clients of the server send the string
    _assert_refused_without_auth(team_server.api_url, env)
    _prefect(env, "work-pool", "create", "wiki-local", "--type", "process", "--base-job-template", WORK_POOL_TEMPLATE)
    _prefect(env, "--no-prompt", "deploy", "--name", "wiki-pipeline")  # from prefect.yaml, in the repository root

    root = tmp_path / "art"
    params = tiny_flow_parameters(tiny_zip_url(tmp_path), root)
    # what the worker lets its runs touch: this root and the test's zips (unset, only the defaults)
    env = {**env, "WIKI_PIPELINE_ALLOWED_ROOTS": str(root), "WIKI_PIPELINE_ALLOWED_SOURCES": tmp_path.as_uri() + "/"}
    with temporary_settings(updates={PREFECT_API_URL: team_server.api_url, PREFECT_HOME: str(team_server.home)}):
        from prefect.deployments import run_deployment

        # both runs exist before the worker starts, so its first poll hands it both: they run at the same time
        runs = [run_deployment("wiki-pipeline/wiki-pipeline", parameters=params, timeout=0) for _ in range(2)]
        log_path = tmp_path / "worker.log"
        with open(log_path, "w") as log:
            worker = subprocess.Popen(
                [
                    str(Path(sys.executable).with_name("prefect")),
                    "worker",
                    "start",
                    "--pool",
                    "wiki-local",
                    "--limit",
                    "2",
                ],
                cwd=REPO,
                env={**env, "PREFECT_WORKER_QUERY_SECONDS": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            ids = [r.id for r in runs]

            def finished():
                got = [_client_call(lambda c, i=i: c.read_flow_run(i)) for i in ids]
                return got if all(r.state.is_final() for r in got) else None

            done = wait_for(finished, "both flow runs to end", timeout=600, every=0.2)
        finally:
            stop_processes(worker)
        assert [r.state.name for r in done] == ["Completed", "Completed"], log_path.read_text()[-4000:]
        a, b = done
        assert a.start_time < b.end_time and b.start_time < a.end_time  # they overlapped

        task_runs = _client_call(
            lambda c: c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
        )
        states = {}
        for tr in task_runs:
            states.setdefault(tr.name, []).append(tr.state.name)
        # each stage: built by one run, reused (Cached) by the other
        assert {s: sorted(v) for s, v in states.items()} == {s: ["Cached", "Completed"] for s in NAMES}, states
        arts = _client_call(
            lambda c: c.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"wiki-{s}" for s in NAMES]))
            )
        )
        assert sorted(x.key for x in arts) == sorted(f"wiki-{s}" for s in NAMES)  # one build per stage

    # Prefect's CLI follows a run with the string (exit 0: Completed)
    prefect = str(Path(sys.executable).with_name("prefect"))
    done_cli = subprocess.run(
        [prefect, "flow-run", "watch", str(ids[0])], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done_cli.returncode == 0 and "Completed" in done_cli.stdout, done_cli.stdout + done_cli.stderr

    _assert_secret_nowhere(
        {
            "server log": team_server.log_path.read_text(),
            "worker log": log_path.read_text(),
            "CLI output": done_cli.stdout + done_cli.stderr,
            **{str(p): p.read_text(errors="replace") for p in root.rglob("*") if p.is_file() and p.suffix != ".bin"},
            "UI artifacts": json.dumps([a.model_dump(mode="json") for a in arts]),
            "flow runs": json.dumps([r.model_dump(mode="json") for r in done]),
            "run logs": json.dumps(
                [log.message for log in _client_call_as(team_server, lambda c: c.read_logs(limit=200))]
            ),
        }
    )

    store = open_store(root)
    for stage in NAMES:
        versions = store.versions(stage)
        assert len(versions) == 1 and store.verify(stage, versions[0].version, full=True) == (True, "ok")
        assert versions[0].manifest["flow_run_id"] in {str(i) for i in ids}


def _assert_refused_without_auth(api_url: str, env: dict) -> None:
    """The API refuses a request with no or a wrong auth string (401); our CLI says what to set."""
    for header in (None, "Basic " + base64.b64encode(b"team:wrong").decode()):
        request = urllib.request.Request(api_url + "/flow_runs/filter", data=b"{}", method="POST")
        request.add_header("Content-Type", "application/json")
        if header:
            request.add_header("Authorization", header)
        try:
            urllib.request.urlopen(request, timeout=30)
        except urllib.error.HTTPError as e:
            assert e.code == 401, e
        else:
            raise AssertionError(f"the server answered a request with {header or 'no'} auth")
    no_auth = {k: v for k, v in env.items() if k != "PREFECT_API_AUTH_STRING"}
    wiki = str(Path(sys.executable).with_name("wiki-pipeline"))
    refused = subprocess.run(
        [wiki, "serve", "--tiny"], cwd=REPO, env=no_auth, capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines()[-1] == (
        f"error: the Prefect server at {api_url} refused this request (401 Unauthorized): it has basic auth on; "
        "set PREFECT_API_AUTH_STRING to its user:password (the server's PREFECT_SERVER_API_AUTH_STRING)"
    )


def _client_call_as(server, fn):
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: server.api_url, PREFECT_HOME: str(server.home)}):
        return _client_call(fn)


def _assert_secret_nowhere(texts: dict[str, str]) -> None:
    assert texts["server log"] and texts["worker log"] and texts["run logs"] != "[]"
    leaks = [where for where, text in texts.items() if PASSWORD in text]
    assert not leaks, f"the auth string's password appears in: {leaks}"
