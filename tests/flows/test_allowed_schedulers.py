"""Which Dask scheduler a run may name (``WIKI_PIPELINE_ALLOWED_SCHEDULERS``, flows/allowed.py): Dask ships pickles,
so a scheduler runs code in the flow run. A deployment run may name only the schedulers its worker lists (unset:
none, a local cluster only), refused before any stage and without connecting; a listed one works, on a real
``dask scheduler``; a person's own run may name any unless the list is set, like the artifact roots."""

from __future__ import annotations

import socket

import pytest

from flows.allowed import ENV_SCHEDULERS
from flows.settings import Pipeline
from mygpt.errors import UserError
from tests.support import stages
from tests.support.prefect_server import task_run_states
from tests.tasks.test_dask_encode import ExternalCluster

DEPLOYMENT_ID = "2b3c1f8e-0000-4000-8000-000000000000"  # Prefect's documented test variable: a deployment run


@pytest.fixture
def listener():
    """A TCP port that records whether anything connected to it (nothing should: the refusal comes first)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        s.setblocking(False)
        yield s, f"tcp://127.0.0.1:{s.getsockname()[1]}"


def nobody_connected(sock: socket.socket) -> bool:
    try:
        sock.accept()[0].close()
    except BlockingIOError:
        return True
    return False


@pytest.fixture
def deployment_run(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_SCHEDULERS, raising=False)
    monkeypatch.setenv("PREFECT__RUNTIME__DEPLOYMENT__ID", DEPLOYMENT_ID)
    monkeypatch.setenv("WIKI_PIPELINE_ARTIFACTS", str(tmp_path / "art"))  # the default root: allowed
    return tmp_path / "art"


def parse(root, address):
    return Pipeline.parse(run={"artifacts_dir": str(root), "dask_address": address})


def test_a_deployment_run_may_name_no_scheduler_where_none_is_allowed(prefect_server, deployment_run, listener):
    """The flow itself refuses it on its first line, naming the setting: no task run, no connection."""
    from flows.wiki_pipeline import wiki_pipeline

    sock, address = listener
    state = wiki_pipeline(run={"artifacts_dir": str(deployment_run), "dask_address": address}, return_state=True)
    assert state.is_failed()
    with pytest.raises(UserError) as e:
        state.result()
    assert str(e.value) == (
        f"run.dask_address {address} is not a Dask scheduler this machine allows ({ENV_SCHEDULERS} is unset, so a "
        "deployment run may use only a local cluster it starts itself; a scheduler runs code in the flow run, as "
        "Dask ships pickles); leave dask_address unset for a local cluster, or ask whoever runs this worker to add "
        f"the scheduler to {ENV_SCHEDULERS} (docs/TEAM.md: a team's cluster over TLS)"
    )
    assert task_run_states(state.state_details.flow_run_id) == {}
    assert nobody_connected(sock)
    assert not deployment_run.exists()


def test_only_the_listed_schedulers_are_allowed(deployment_run, listener, monkeypatch):
    sock, address = listener
    port = address.rsplit(":", 1)[1]
    monkeypatch.setenv(ENV_SCHEDULERS, f"tls://10.0.0.5:8786, 127.0.0.1:{port}")
    for same in (address, f"127.0.0.1:{port}", f"TCP://127.0.0.1:{port}"):  # no scheme = tcp; case-blind
        assert parse(deployment_run, same).run.dask_address == same
    for other in (f"tcp://127.0.0.1:{int(port) + 1}", f"tcp://localhost:{port}", "tcp://10.0.0.5:8786"):
        with pytest.raises(
            UserError,
            match=rf"^run.dask_address {other} is not a Dask scheduler this machine "
            rf"allows \({ENV_SCHEDULERS}=tls://10.0.0.5:8786, 127.0.0.1:{port}; ",
        ):
            parse(deployment_run, other)
    assert nobody_connected(sock)


def test_a_persons_own_run_may_name_any_scheduler_unless_the_list_is_set(tmp_path, listener, monkeypatch):
    sock, address = listener
    monkeypatch.delenv(ENV_SCHEDULERS, raising=False)
    monkeypatch.delenv("PREFECT__RUNTIME__DEPLOYMENT__ID", raising=False)
    assert parse(tmp_path / "art", address).run.dask_address == address
    monkeypatch.setenv(ENV_SCHEDULERS, "tls://10.0.0.5:8786")  # set: it applies to every run on this machine
    with pytest.raises(UserError, match=rf"^run.dask_address {address} is not a Dask scheduler this machine"):
        parse(tmp_path / "art", address)
    assert nobody_connected(sock)


def test_an_entry_that_is_no_scheduler_address_is_a_user_error(deployment_run, monkeypatch):
    monkeypatch.setenv(ENV_SCHEDULERS, "tcp://10.0.0.5:8786 http://10.0.0.5:8787")
    with pytest.raises(UserError, match=rf"^{ENV_SCHEDULERS}: 'http://10.0.0.5:8787' is not a Dask scheduler"):
        parse(deployment_run, "tcp://10.0.0.5:8786")


def test_an_allowed_scheduler_runs_the_stage(deployment_run, tmp_path, monkeypatch):
    """A real ``dask scheduler`` and worker, listed: the run's settings pass, and the tokenizer's chunk work runs
    on that cluster."""
    from tests.support.tiny import tiny_zip_url

    cluster = ExternalCluster(tmp_path, workers=1)
    try:
        monkeypatch.setenv(ENV_SCHEDULERS, cluster.address)
        pipeline = parse(deployment_run, cluster.address)
        corpus = stages.corpus(tmp_path / "art", source_url=tiny_zip_url(tmp_path))
        stages.tokenizer(
            deployment_run,
            corpus,
            num_merges=32,
            bpe_train_bytes=60_000,
            run={"dask_address": pipeline.run.dask_address},
        )
        with cluster.client() as c:
            ran = c.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.task_prefixes))
        assert "count-words" in ran, ran
    finally:
        cluster.stop()


def test_default_in_the_scheduler_list_stands_for_none(tmp_path, listener, monkeypatch):
    """`default` means the defaults in every allow-list; for schedulers that is none (a local cluster), so a
    person's run naming one is refused and a run naming none goes on."""
    sock, address = listener
    monkeypatch.delenv("PREFECT__RUNTIME__DEPLOYMENT__ID", raising=False)
    monkeypatch.setenv(ENV_SCHEDULERS, "default")
    assert parse(tmp_path / "art", None).run.dask_address is None
    with pytest.raises(UserError, match=rf"^run.dask_address {address} is not a Dask scheduler this machine"):
        parse(tmp_path / "art", address)
    monkeypatch.setenv(ENV_SCHEDULERS, f"default, {address}")
    assert parse(tmp_path / "art", address).run.dask_address == address
    assert nobody_connected(sock)
