"""``only=`` never starts from a stale version: after ``--force tokenizer --only tokenizer`` the latest shards come
from the replaced tokenizer, and ``only=model`` must not take them."""

from __future__ import annotations

import pytest

from flows.only import latest_upstream
from mygpt.errors import UserError
from tasks.registry import code_versions, open_store
from tasks.store import ArtifactStore

_CLOCK = iter(range(10, 60))  # created_at has whole seconds: give each version its own, in order


def _publish(store: ArtifactStore, stage: str, version: str, **inputs: dict) -> dict:
    build = store.open_build(stage, version)
    (build.out / "x").write_text(version)
    lineage = {name: {"stage": name, "version": m["version"], "build_id": m["build_id"]} for name, m in inputs.items()}
    created = f"2026-01-01T00:00:{next(_CLOCK)}Z"
    return build.publish(
        settings={}, inputs=lineage, code_version=code_versions()[stage], extra={"created_at": created}
    )


@pytest.mark.parametrize("where", ["local", "s3"])
def test_only_takes_the_latest_current_upstream_and_refuses_when_all_are_stale(where, tmp_path, request):
    store = open_store(tmp_path if where == "local" else request.getfixturevalue("s3_root"))
    corpus = _publish(store, "corpus", "c1")
    tok = _publish(store, "tokenizer", "t1", corpus=corpus)
    older = _publish(store, "shards", "s1", corpus=corpus, tokenizer=tok)
    tok2 = _publish(store, "tokenizer", "t2", corpus=corpus)
    newer = _publish(store, "shards", "s2", corpus=corpus, tokenizer=tok2)
    _publish(store, "tokenizer", "t2", corpus=corpus)  # --force tokenizer: t2 rebuilt, so s2 is stale
    assert ("shards", "s2") in store.stale_versions(code_versions())

    refs = latest_upstream(store, "model")
    assert {k: v["version"] for k, v in refs.items()} == {"shards": "s1", "tokenizer": "t1"}
    assert refs["shards"]["build_id"] == older["build_id"] and newer["version"] == "s2"

    _publish(store, "tokenizer", "t1", corpus=corpus)  # and t1 too: every shards version is stale now
    with pytest.raises(UserError) as err:
        latest_upstream(store, "model")
    assert str(err.value) == (
        f"only='model' needs a current shards version under {store.root}, and every published one is stale (the "
        "latest, shards/s2: its input tokenizer/t2 was rebuilt since, so no run reuses it); run only='shards' "
        "first (or the whole pipeline) to build one from the current upstream versions"
    )
    # what only=shards would start from is current
    assert {k: v["version"] for k, v in latest_upstream(store, "shards").items()} == {"corpus": "c1", "tokenizer": "t1"}
