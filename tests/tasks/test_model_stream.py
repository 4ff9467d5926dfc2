"""The model stage streams its shards on an s3:// root (a real S3 API server on 127.0.0.1): its first step comes
while most shards are still in the bucket, the cache stays within ``WIKI_PIPELINE_CACHE_MAX``, a shard changed
after publication is refused, and a bad budget is named."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import pytest

from mygpt.errors import UserError
from mygpt.training.stream import BLOCK_SHARDS, BlockSchedule
from tasks.core.shard_stream import ENV_CACHE_MAX, LOOKAHEAD_BLOCKS, cache_budget
from tasks.core.stage import BuildContext
from tasks.registry import open_store
from tasks.store.files import files_prefix
from tests.support import stages
from tests.support.tiny import TINY, tiny_zip_url

SHARD_TOKENS = 4500  # the tiny corpus in 130+ train shards
MODEL = {**TINY["model"], "steps": 150, "print_every": 50, "eval_every": 150, "checkpoint_every": 0}


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


def _train_shards(store, shards) -> list[dict]:
    import json

    manifest = store.get("shards", shards["version"]).manifest
    local = store.fetch_file("shards", shards["version"], "shards.json", Path(store.files.local) / "t", manifest)
    return json.loads(local.read_text())["splits"]["train"]["shards"]


def test_the_first_step_comes_while_most_shards_are_still_in_the_bucket(many_shards, monkeypatch):
    root, tokenizer, shards = many_shards
    store = open_store(root)
    train = _train_shards(store, shards)
    assert len(train) >= 130
    seen = _watch_first_step(monkeypatch)
    model = stages.model(root, shards, tokenizer, run=TINY["run"], **MODEL, seed=1)

    local_at_first_step = [n for n in seen["first"] if n.startswith("train-")]
    schedule = BlockSchedule([s["tokens"] for s in train], 1, 8 * 32, 33)
    first_block = {train[i]["file"].replace(".parquet", ".bin") for i in schedule.at(1).shards}
    assert first_block <= set(local_at_first_step), "step 1 read its block"
    assert len(local_at_first_step) < len(train) // 4, f"most shards are still remote: {local_at_first_step}"
    assert len(local_at_first_step) <= (1 + LOOKAHEAD_BLOCKS) * BLOCK_SHARDS, "a few blocks ahead at most"
    assert not store.version_path("shards", shards["version"]).exists(), "the shards were never copied whole"
    metrics = store.get("model", model["version"]).manifest["metrics"]
    assert metrics["train_tokens"] == sum(s["tokens"] for s in train) and metrics["final_val_loss"] is not None


def test_the_cache_stays_within_its_budget_deleting_what_training_has_read(many_shards, monkeypatch):
    root, tokenizer, shards = many_shards
    # the validation split (43k uint16 tokens) and one block of shards and a download: less than three blocks
    budget = 140_000
    monkeypatch.setenv(ENV_CACHE_MAX, str(budget))
    biggest, done = [0], threading.Event()
    folder = {}

    def size_on_disk(tokens) -> int:
        total = 0
        for p in tokens.rglob("*"):
            with contextlib.suppress(FileNotFoundError):  # renamed or deleted since the listing: not on disk now
                if p.is_file():
                    total += p.stat().st_size
        return total

    def watch() -> None:
        while not done.is_set():
            tokens = folder.get("tokens")
            if tokens is not None and tokens.exists():
                with contextlib.suppress(FileNotFoundError):  # a folder removed while it was walked
                    biggest[0] = max(biggest[0], size_on_disk(tokens))
            done.wait(0.002)

    report = BuildContext.progress

    def progress(self, done_, total, message="", force=False):
        folder.setdefault("tokens", self.work / "tokens")
        return report(self, done_, total, message, force)

    monkeypatch.setattr(BuildContext, "progress", progress)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        stages.model(root, shards, tokenizer, run=TINY["run"], **MODEL, seed=2)
    finally:
        done.set()
        watcher.join()
    assert BLOCK_SHARDS * SHARD_TOKENS * 2 < biggest[0] <= budget, biggest[0]


def test_a_shard_changed_after_publication_is_refused(many_shards):
    root, tokenizer, shards = many_shards
    store = open_store(root)
    train = _train_shards(store, shards)
    first = train[BlockSchedule([s["tokens"] for s in train], 3, 8 * 32, 33).at(1).shards[0]]
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


def test_a_budget_too_small_for_one_block_is_refused_before_training(many_shards, monkeypatch):
    root, tokenizer, shards = many_shards
    monkeypatch.setenv(ENV_CACHE_MAX, "20K")
    with pytest.raises(UserError, match=r"WIKI_PIPELINE_CACHE_MAX=20K .* cannot hold what training reads at once"):
        stages.model(root, shards, tokenizer, run=TINY["run"], **MODEL, seed=5)
