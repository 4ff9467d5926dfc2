"""The flow's tokenizer and shards stages run on one local Dask cluster: one start per run, not one per stage;
started ahead, while the corpus stage builds; closed as soon as the shards are built, before torch's import for the
model stage begins (ahead of the model stage's own); and closed, its worker processes gone, when the run fails before
any stage used it."""

from __future__ import annotations

import zipfile

import psutil

from tasks.core import ahead, dask_work
from tasks.core.faults import FAULT_TRACE_ENV
from tasks.registry import NAMES
from tests.support.prefect_server import task_run_states
from tests.support.tiny import tiny_flow_parameters, tiny_zip_url
from tests.support.wait import wait_for


def _stages_started(trace) -> list[str]:
    """The stages whose build had begun (their ``<stage>.start`` fault point passed) by now."""
    lines = trace.read_text().split() if trace.exists() else []
    return [point.removesuffix(".start") for point in lines if point.endswith(".start")]


def _recorded_starts(monkeypatch, trace) -> tuple[list, dict]:
    """The local clusters the run starts, and for the cluster and torch's import, the stages begun when each was
    started (for torch also the cluster's status then, under ``"cluster"``)."""
    start = dask_work._local_cluster
    clusters: list = []
    begun: dict[str, list[str]] = {}

    def counted(n: int):
        begun.setdefault("dask", _stages_started(trace))
        clusters.append(start(n))
        return clusters[-1]

    monkeypatch.setattr(dask_work, "_local_cluster", counted)

    def torch() -> None:
        begun["torch"] = _stages_started(trace)
        begun["cluster"] = [c.status.name for c in clusters]

    monkeypatch.setattr(ahead, "import_torch", torch)
    monkeypatch.setenv(FAULT_TRACE_ENV, str(trace))
    return clusters, begun


def test_one_local_cluster_started_ahead_serves_the_tokenizer_and_the_shards_of_a_run(
    prefect_server, tmp_path, monkeypatch
):
    from flows.wiki_pipeline import wiki_pipeline

    clusters, begun = _recorded_starts(monkeypatch, tmp_path / "trace")
    url = tiny_zip_url(tmp_path)
    state = wiki_pipeline(**tiny_flow_parameters(url, tmp_path / "art", run={"workers": 2}), return_state=True)
    assert task_run_states(state.state_details.flow_run_id) == dict.fromkeys(NAMES, "Completed")
    assert len(clusters) == 1  # built: the tokenizer and the shards, on the one cluster
    assert clusters[0].status.name == "closed"  # and no worker process outlives the run
    assert set(begun["dask"]) <= {"corpus"}  # before any stage after the corpus began to build
    assert "shards" in begun["torch"]  # torch's import: after the shards' build (the model's may have begun) ...
    assert begun["cluster"] == ["closed"]  # ... and once the cluster is closed, its workers gone


def test_a_run_that_fails_in_the_corpus_stage_closes_the_cluster_started_ahead(prefect_server, tmp_path, monkeypatch):
    from flows.wiki_pipeline import wiki_pipeline

    clusters, begun = _recorded_starts(monkeypatch, tmp_path / "trace")
    bad = tmp_path / "wikitext-103-raw-v1.zip"  # the train split only: the corpus stage fails as it extracts
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("wikitext-103-raw/wiki.train.raw", " = A = \n \n text \n")
    params = tiny_flow_parameters(bad.as_uri(), tmp_path / "art", run={"workers": 2})
    state = wiki_pipeline(**params, return_state=True)
    assert state.is_failed()
    assert "wiki.valid.raw" in str(state.message) or "wiki.valid.raw" in repr(state.result(raise_on_failure=False))
    assert "dask" in begun and len(clusters) == 1  # the start ahead had begun
    assert clusters[0].status.name == "closed"
    wait_for(lambda: not _dask_workers(), "no Dask worker process left by the failed run", timeout=60)


def _dask_workers() -> list:
    """This process's Dask worker processes still running (not yet reaped ones excepted)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.NoSuchProcess:
            continue
    return found
