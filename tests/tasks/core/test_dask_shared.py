"""A flow run's stages share one local Dask cluster (``dask_work.shared_local_clusters``): started once, handed to
each stage that asks, replaced when it stopped, closed on ``release`` and on exit; outside a run each stage starts
and closes its own, as before."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import psutil
from distributed import Client

from tasks.core import dask_shared, dask_work
from tasks.core.settings import RunOptions
from tests.support.wait import wait_for

LOG = logging.getLogger("test")


def _worker_pids() -> set[int]:
    me = psutil.Process()
    return {p.pid for p in me.children(recursive=True) if "spawn_main" in " ".join(p.cmdline())}


def _gone(pids: set[int]) -> bool:
    return not [p for p in psutil.process_iter() if p.pid in pids and p.status() != psutil.STATUS_ZOMBIE]


def test_the_stages_of_a_run_share_one_cluster_closed_on_release():
    run = RunOptions(workers=2)
    started: list[int] = []
    start = dask_work._local_cluster
    with dask_shared.shared_clusters(lambda n: (started.append(n), start(n))[1], dask_work._quiet_close) as release:
        with dask_work.dask_client(run, LOG) as client:
            first = client.scheduler.address
            assert client.submit(sum, [1, 2]).result() == 3
            workers = _worker_pids()
        with dask_work.dask_client(run, LOG) as client:
            assert client.scheduler.address == first  # the same cluster, still up after the first stage
            assert client.submit(sum, [3, 4]).result() == 7
        assert started == [2] and len(workers) == 2
        release()
        wait_for(lambda: _gone(workers), "the shared cluster's workers to end", timeout=60)
        with dask_work.dask_client(run, LOG) as client:  # a stage after release gets a new one
            assert client.scheduler.address != first
            later = _worker_pids()
    assert started == [2, 2]
    wait_for(lambda: _gone(later), "the cluster's workers to end on exit", timeout=60)


def test_a_shared_cluster_that_stopped_is_replaced_and_outside_a_run_each_stage_has_its_own():
    run = RunOptions(workers=1)
    with dask_shared.shared_clusters(dask_work._local_cluster, dask_work._quiet_close):
        with dask_work.dask_client(run, LOG) as client:
            first = client.scheduler.address
        dask_shared._current.get().future(1).result().close()  # stopped under the run (a crash, a kill)
        with dask_work.dask_client(run, LOG) as client:
            assert client.scheduler.address != first
            assert client.submit(sum, [1, 1]).result() == 2
    assert not dask_shared.sharing()
    with dask_work.dask_client(run, LOG) as a:
        one = a.scheduler.address
    with dask_work.dask_client(run, LOG) as b:
        assert b.scheduler.address != one


def test_a_shared_cluster_closes_in_the_background_without_dask_info_lines(caplog):
    caplog.set_level(logging.INFO)
    run = RunOptions(workers=1)

    def dask_info() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name.startswith("distributed") and r.levelno < 30]

    with dask_shared.shared_clusters(dask_work._local_cluster, dask_work._quiet_close) as release:
        with dask_work.dask_client(run, LOG) as client:
            cluster = dask_shared._current.get().future(1).result()
            assert client.submit(sum, [1, 1]).result() == 2
        caplog.clear()
        release()
        wait_for(lambda: cluster.status.name == "closed", "the cluster to close", timeout=60)
    assert dask_info() == []


def _write_after(started: str, done: str, seconds: float) -> None:
    Path(started).write_text("started")
    time.sleep(seconds)
    Path(done).write_text("done")


def test_closing_the_runs_cluster_ends_its_workers_without_waiting_for_what_they_run(tmp_path):
    cluster = dask_work._quiet_start(2)
    started, done = tmp_path / "started", tmp_path / "done"
    with Client(cluster, set_as_default=False) as client:
        workers = _worker_pids()
        task = client.submit(_write_after, str(started), str(done), 2.0)
        wait_for(started.exists, "the task to start on a worker", timeout=60)
        dask_work._quiet_close(cluster)
        assert len(workers) == 2 and _gone(workers)  # ended by the time the close returns
        del task
    time.sleep(2.5)  # past the task's end, had its worker been left to finish it
    assert not done.exists()


def test_two_runs_closing_their_clusters_at_once_leave_the_nannys_warnings_on():
    """Two flow runs in one process (each in its thread) close their clusters at the same time: afterwards
    ``distributed.nanny`` logs its warnings again (a worker killed, a worker restarted for memory) as before."""
    nanny = logging.getLogger("distributed.nanny")
    before = nanny.level
    try:
        for _ in range(3):
            first, second = dask_work._quiet_start(2), dask_work._quiet_start(2)
            closing = threading.Thread(target=dask_work._quiet_close, args=(first,))
            closing.start()
            wait_for(lambda t=closing: nanny.level != before or not t.is_alive(), "a close to begin", every=0.0005)
            dask_work._quiet_close(second)  # the other run's close, begun while the first one's is under way
            closing.join(60)
            assert nanny.level == before, logging.getLevelName(nanny.level)
    finally:
        nanny.setLevel(before)
