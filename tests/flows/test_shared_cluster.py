"""The flow's tokenizer and shards stages run on one local Dask cluster, closed once the shards are published: one
start per run, not one per stage."""

from __future__ import annotations

from tasks.core import dask_work
from tasks.registry import NAMES
from tests.support.prefect_server import task_run_states
from tests.support.tiny import tiny_flow_parameters, tiny_zip_url


def test_one_local_cluster_serves_the_tokenizer_and_the_shards_of_a_run(prefect_server, tmp_path, monkeypatch):
    from flows.wiki_pipeline import wiki_pipeline

    start = dask_work._local_cluster
    clusters: list = []

    def counted(n: int):
        clusters.append(start(n))
        return clusters[-1]

    monkeypatch.setattr(dask_work, "_local_cluster", counted)
    url = tiny_zip_url(tmp_path)
    state = wiki_pipeline(**tiny_flow_parameters(url, tmp_path / "art", run={"workers": 2}), return_state=True)
    assert task_run_states(state.state_details.flow_run_id) == dict.fromkeys(NAMES, "Completed")
    assert len(clusters) == 1  # built: the tokenizer and the shards, on the one cluster
    assert clusters[0].status.name == "closed"  # and no worker process outlives the run
