"""corpus → tokenizer → shards as Prefect tasks in a flow, on a real Prefect server and a loopback HTTP mirror."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.core.settings import RunOptions
from tasks.corpus import CorpusSettings, download_corpus
from tasks.registry import open_store
from tasks.shards import ShardsSettings, encode_shards
from tasks.tokenizer import TokenizerSettings, train_tokenizer
from tests.support.prefect_server import task_run_states


@pytest.fixture(scope="module")
def data_flow():
    from prefect import flow

    @flow(name="data-stages-test")
    def data_stages(root: str, source_url: str, num_merges: int = 64, force: list[str] = []):
        run = RunOptions(artifacts_dir=root, force=force, workers=1)
        corpus = download_corpus(CorpusSettings(source_url=source_url), run, return_state=True).result()
        tokenizer = train_tokenizer(
            corpus, TokenizerSettings(num_merges=num_merges, bpe_train_bytes=80_000), run, return_state=True
        ).result()
        shards = encode_shards(corpus, tokenizer, ShardsSettings(shard_tokens=100_000), run, return_state=True).result()
        return {"corpus": corpus, "tokenizer": tokenizer, "shards": shards}

    return data_stages


def run(flow_fn, *args, **kwargs):
    state = flow_fn(*args, return_state=True, **kwargs)
    return state.result(), task_run_states(state.state_details.flow_run_id)


def test_rerun_is_cached_and_a_parameter_change_makes_new_versions(prefect_server, tmp_path, mirror, data_flow):
    root = str(tmp_path / "art")
    refs1, states = run(data_flow, root, mirror.url())
    assert states == {"corpus": "Completed", "tokenizer": "Completed", "shards": "Completed"}
    n_requests = len(mirror.requests)

    refs2, states = run(data_flow, root, mirror.url())
    assert states == {"corpus": "Cached", "tokenizer": "Cached", "shards": "Cached"}
    # nothing downloaded again: one request, the one-byte probe that checks the file is still the same
    assert refs2 == refs1 and [r["range"] for r in mirror.requests[n_requests:]] == ["bytes=0-0"]

    refs3, states = run(data_flow, root, mirror.url(), num_merges=32)
    assert states == {"corpus": "Cached", "tokenizer": "Completed", "shards": "Completed"}
    assert refs3["corpus"] == refs1["corpus"]
    assert refs3["tokenizer"]["version"] != refs1["tokenizer"]["version"]
    assert refs3["shards"]["version"] != refs1["shards"]["version"]
    store = open_store(root)
    for stage, ref in (("tokenizer", refs1["tokenizer"]), ("shards", refs1["shards"])):  # old ones intact
        assert store.verify(stage, ref["version"], full=True) == (True, "ok")
    assert len(store.versions("tokenizer")) == 2 and len(store.versions("shards")) == 2
    merges = json.loads((Path(refs3["tokenizer"]["path"]) / "stats.json").read_text())["num_merges"]
    assert merges == 32

    # the UI artifacts exist under the fixed keys
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async def keys():
        async with get_client() as client:
            arts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(any_=["wiki-corpus", "wiki-tokenizer", "wiki-shards"])
                )
            )
            return {a.key for a in arts}

    assert asyncio.run(keys()) == {"wiki-corpus", "wiki-tokenizer", "wiki-shards"}


def test_failed_download_in_a_flow_publishes_nothing(prefect_server, tmp_path, mirror, data_flow):
    root = tmp_path / "art"
    state = data_flow(str(root), mirror.url("/missing.zip"), return_state=True)
    assert state.is_failed()
    with pytest.raises(Exception, match="HTTP 404"):
        state.result()
    assert open_store(root).versions() == []
    states = task_run_states(state.state_details.flow_run_id)
    assert states == {"corpus": "Failed"}
