"""The model stage fetches its shards on an s3:// root (a real S3 API server on 127.0.0.1): every shard is local
before the first step (each step draws from the whole split), the version is never copied whole, the cache fits in
a ``WIKI_PIPELINE_CACHE_MAX`` of exactly what it needs and a byte less is refused before training, a shard changed
after publication is refused, and a bad budget is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from mygpt.errors import UserError
from tasks.core.shard_fetch import ENV_CACHE_MAX, cache_budget
from tasks.core.stage import BuildContext
from tasks.registry import open_store
from tasks.store.files import files_prefix
from tests.support import stages
from tests.support.tiny import TINY, tiny_zip_url

SHARD_TOKENS = 4500  # the tiny corpus in 130+ train shards
MODEL = {**TINY["model"], "steps": 20, "print_every": 10, "eval_every": 20, "checkpoint_every": 0}


@pytest.fixture(scope="module")
def bucket(s3_endpoint, tmp_path_factory):
    """``(root, tokenizer, shards)``: the tiny corpus in 130+ train shards in a bucket, built once."""
    from tests.support.s3 import aws_env, make_bucket, use_cache

    tmp = tmp_path_factory.mktemp("stream")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in aws_env(s3_endpoint).items():
            mp.setenv(name, value)
        use_cache(mp, tmp / "builder-cache")
        root = f"s3://{make_bucket(s3_endpoint)}/art"
        corpus = stages.corpus(root, run=TINY["run"], source_url=tiny_zip_url(tmp))
        tokenizer = stages.tokenizer(root, corpus, run=TINY["run"], **TINY["tokenizer"])
        shards = stages.shards(root, corpus, tokenizer, run=TINY["run"], shard_tokens=SHARD_TOKENS)
    return root, tokenizer, shards


@pytest.fixture
def many_shards(bucket, s3_endpoint, tmp_path, monkeypatch):
    """The bucket, seen from another machine (an empty cache of its own)."""
    from tests.support.s3 import aws_env, use_cache

    for name, value in aws_env(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    use_cache(monkeypatch, tmp_path / "cache")
    return bucket


def _watch_first_step(monkeypatch) -> dict:
    """What the model build's token folder holds when step 1 is reported (the step has run by then)."""
    seen: dict = {}
    report = BuildContext.progress

    def progress(self, done, total, message="", force=False):
        if self.stage == "model" and done == 1 and "first" not in seen:
            seen["first"] = sorted(p.name for p in (self.work / "tokens").glob("*.bin"))
        return report(self, done, total, message, force)

    monkeypatch.setattr(BuildContext, "progress", progress)
    return seen


def _index(store, shards) -> dict:
    import json

    manifest = store.get("shards", shards["version"]).manifest
    folder = Path(store.files.local) / "t"
    return json.loads(store.fetch_bytes("shards", shards["version"], "shards.json", folder, manifest))


def _train_shards(store, shards) -> list[dict]:
    return _index(store, shards)["splits"]["train"]["shards"]


def _need(store, shards) -> int:
    """The budget that holds exactly the token files (uint16) of train and valid and the largest downloads that
    can be in flight at once (one a fetch thread)."""
    from tasks.core.shard_fetch import fetch_threads

    splits = _index(store, shards)["splits"]
    files = store.get("shards", shards["version"]).manifest["files"]
    every = splits["train"]["shards"] + splits["valid"]["shards"]
    largest = sorted((files[s["file"]]["size"] for s in every), reverse=True)[: fetch_threads()]
    return 2 * sum(s["tokens"] for s in every) + sum(largest)


def test_every_shard_is_local_before_the_first_step_within_a_budget_of_exactly_that(many_shards, monkeypatch):
    root, tokenizer, shards = many_shards
    store = open_store(root)
    train = _train_shards(store, shards)
    assert len(train) >= 130
    monkeypatch.setenv(ENV_CACHE_MAX, str(_need(store, shards)))
    seen = _watch_first_step(monkeypatch)
    model = stages.model(root, shards, tokenizer, run=TINY["run"], **MODEL, seed=1)

    local_at_first_step = {n for n in seen["first"] if n.startswith("train-")}
    assert local_at_first_step == {s["file"].replace(".parquet", ".bin") for s in train}
    assert not store.version_path("shards", shards["version"]).exists(), "the shards were never copied whole"
    metrics = store.get("model", model["version"]).manifest["metrics"]
    assert metrics["train_tokens"] == sum(s["tokens"] for s in train) and metrics["final_val_loss"] is not None


def test_a_shard_changed_after_publication_is_refused(many_shards):
    root, tokenizer, shards = many_shards
    store = open_store(root)
    train = _train_shards(store, shards)
    first = train[len(train) // 2]
    manifest = store.get("shards", shards["version"]).manifest
    key = f"shards/{shards['version']}/{files_prefix(manifest)}{first['file']}"
    body, _ = store.files.get_object(key)
    store.files.put_object(key, body[:-9] + bytes(9))  # same size, other bytes
    try:
        with pytest.raises(UserError, match=rf"{first['file']} does not match the manifest.*sha256.*rerun with force"):
            stages.model(root, shards, tokenizer, run=TINY["run"], **MODEL, seed=3)
    finally:
        store.files.put_object(key, body)  # the module's other tests read this bucket


@pytest.mark.parametrize("value", ["lots", "0", "-5G", "2X"])
def test_a_bad_cache_budget_is_named(value, monkeypatch):
    monkeypatch.setenv(ENV_CACHE_MAX, value)
    with pytest.raises(UserError, match=rf"WIKI_PIPELINE_CACHE_MAX='{value}' is not a size.*e\.g\. .*=20G"):
        cache_budget()


def test_a_budget_a_byte_too_small_for_the_split_is_refused_before_training(many_shards, monkeypatch):
    root, tokenizer, shards = many_shards
    need = _need(open_store(root), shards)
    monkeypatch.setenv(ENV_CACHE_MAX, str(need - 1))
    seen = _watch_first_step(monkeypatch)
    with pytest.raises(UserError, match=rf"WIKI_PIPELINE_CACHE_MAX={need - 1} .* cannot hold what training reads.*"
                                        rf"at least \S+ \({need:,} bytes\)"):  # fmt: skip
        stages.model(root, shards, tokenizer, run=TINY["run"], **MODEL, seed=5)
    assert "first" not in seen, "refused before training"
