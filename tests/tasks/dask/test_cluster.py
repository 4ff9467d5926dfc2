"""A stage's local Dask cluster (``dask_work.dask_client``): its worker processes end when the stage's block ends,
a failed one too; distributed's INFO lines stay out of the log, and two stages at once (two flow runs in one
process) leave the logger's level as it was."""

from __future__ import annotations

import contextlib
import logging
import threading

import psutil
import pytest

from tasks.core.settings import RunOptions
from tasks.dask import work as dask_work
from tests.support.wait import wait_for

LOG = logging.getLogger("test")


def _worker_pids() -> set[int]:
    """This process's Dask worker processes; a child that has ended (a zombie not yet reaped, or gone) is none."""
    found = set()
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.ZombieProcess, psutil.NoSuchProcess):
            if "spawn_main" in " ".join(p.cmdline()):
                found.add(p.pid)
    return found


def _gone(pids: set[int]) -> bool:
    def alive(p: psutil.Process) -> bool:
        try:
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return not [p for p in psutil.process_iter() if p.pid in pids and alive(p)]


def test_a_stages_cluster_ends_its_workers_when_the_block_ends_a_failed_one_too(caplog):
    caplog.set_level(logging.INFO)
    run = RunOptions(workers=2)
    with dask_work.dask_client(run, LOG) as client:
        assert client.submit(sum, [1, 2]).result() == 3
        workers = _worker_pids()
    assert len(workers) == 2
    wait_for(lambda: _gone(workers), "the cluster's workers to end", timeout=60)
    with pytest.raises(RuntimeError, match="stage failed"), dask_work.dask_client(run, LOG) as client:
        failed = _worker_pids()
        raise RuntimeError("stage failed")
    assert len(failed) == 2 and not failed & workers
    wait_for(lambda: _gone(failed), "the failed stage's workers to end", timeout=60)
    info = [r.getMessage() for r in caplog.records if r.name.startswith("distributed") and r.levelno < logging.WARNING]
    assert info == []


def test_two_stages_at_once_leave_distributeds_level_as_it_was():
    import distributed  # noqa: F401  # its import sets its loggers' levels from Dask's config: before is after it

    logger = logging.getLogger("distributed")
    before = logger.level
    inside = threading.Barrier(2, timeout=120)
    errors: list[BaseException] = []

    def stage() -> None:
        try:
            with dask_work.dask_client(RunOptions(workers=2), LOG) as client:
                assert client.submit(sum, [1, 1]).result() == 2
                inside.wait()  # both blocks open at once; the first to end must not restore over the other's
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=stage) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert errors == [] and logger.level == before, (errors, logging.getLevelName(logger.level))
