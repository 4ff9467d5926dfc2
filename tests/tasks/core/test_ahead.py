"""What a run starts ahead (``tasks.core.ahead``): once a stage builds, the needs of the stages built from it -- the
run's local Dask cluster (real Dask), torch's import -- and nothing for stages that are not built from it; a start
that fails is raised by the stage that needs it, no other."""

from __future__ import annotations

import concurrent.futures
import logging

import pytest

from tasks.core import ahead, dask_shared, dask_work
from tasks.core.settings import RunOptions

LOG = logging.getLogger("test")

#: The pipeline's shape: samples and export are built from the model only.
PLAN = [
    ahead.Planned("corpus", (), ()),
    ahead.Planned("tokenizer", ("corpus",), ("dask",)),
    ahead.Planned("shards", ("corpus", "tokenizer"), ("dask",)),
    ahead.Planned("model", ("shards", "tokenizer"), ("torch",)),
    ahead.Planned("samples", ("model", "tokenizer"), ()),
]


@pytest.fixture
def imports(monkeypatch) -> list[str]:
    """The torch imports started, recorded instead of run (the test process may have torch already)."""
    done: list[str] = []
    monkeypatch.setattr(ahead, "import_torch", lambda: done.append("torch"))
    return done


def _counting(started: list):
    def start(n: int):
        started.append(dask_work._local_cluster(n))
        return started[-1]

    return start


def _wait_for(state: ahead._Run, need: str) -> None:
    future = state.started[need]
    assert future is not None
    future.result()


def test_a_stage_that_builds_starts_the_cluster_at_once_and_torch_once_the_cluster_is_closed(monkeypatch):
    clusters: list = []
    seen: list[str] = []  # the cluster's status when torch's import began
    monkeypatch.setattr(ahead, "import_torch", lambda: seen.append(clusters[0].status.name))
    run = RunOptions(workers=1)
    with dask_shared.shared_clusters(_counting(clusters), dask_work._quiet_close), ahead.planned(PLAN, run):
        state = ahead._current.get()
        assert state is not None
        ahead.building("corpus")
        ahead.built("corpus")
        ahead.building("tokenizer")  # started once for the run, whoever builds next
        with dask_work.dask_client(run, LOG) as client:  # the stage gets the cluster started ahead
            assert client.submit(sum, [1, 2]).result() == 3
        ahead.built("tokenizer")
        ahead.building("shards")
        assert "torch" not in state.started  # the shards still need the workers
        ahead.built("shards")
        _wait_for(state, "torch")
        ahead.ready("model")
    assert len(clusters) == 1 and seen == ["closed"]


def test_nothing_is_started_for_stages_not_built_from_the_one_that_builds(imports):
    started: list = []
    with dask_shared.shared_clusters(_counting(started), dask_work._quiet_close):
        with ahead.planned(PLAN, RunOptions(workers=1)):
            ahead.building("samples")  # nothing is built from it
        with ahead.planned(PLAN[:3], RunOptions(workers=1)):  # a run that stops before the model
            ahead.building("tokenizer")
            ahead.built("tokenizer")
            ahead.built("shards")
        assert imports == [] and len(started) == 1


def test_with_a_scheduler_address_no_local_cluster_is_started_and_outside_a_run_nothing(imports):
    started: list = []
    address = RunOptions(dask_address="tcp://127.0.0.1:8786")
    with dask_shared.shared_clusters(_counting(started), dask_work._quiet_close), ahead.planned(PLAN, address):
        ahead.building("corpus")
    ahead.building("corpus")  # no run plan: nothing
    ahead.built("shards")
    assert started == [] and imports == []


def test_a_failed_start_is_raised_by_the_stage_that_needs_it_and_no_other(monkeypatch):
    def broken(n: int):
        raise OSError("no ports left")

    def no_torch() -> None:
        raise ModuleNotFoundError("No module named 'torch'")

    monkeypatch.setattr(ahead, "import_torch", no_torch)
    run = RunOptions(workers=1)
    with dask_shared.shared_clusters(broken, dask_work._quiet_close), ahead.planned(PLAN, run):
        state = ahead._current.get()
        assert state is not None
        ahead.building("corpus")
        with pytest.raises(OSError, match="no ports left"), dask_work.dask_client(run, LOG):
            pass  # the tokenizer's
        ahead.built("tokenizer")
        ahead.built("shards")
        concurrent.futures.wait([state.started["torch"]])
        ahead.ready("samples")  # torch's error is not another stage's
        with pytest.raises(ModuleNotFoundError, match="torch"):
            ahead.ready("model")
