"""Shared fixtures: real text from ../shared/data (skipped with a reason where it is absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("WIKI_PIPELINE_SHARED_DATA", REPO.parent / "shared" / "data"))

# The suite shares 2 cores with the servers and runners it starts: one torch thread per process.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def _shared_file(name: str) -> Path:
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"real test text {path} is absent (set WIKI_PIPELINE_SHARED_DATA to the folder holding {name})")
    return path


@pytest.fixture(scope="session")
def shakespeare_path() -> Path:
    return _shared_file("tinyshakespeare.txt")


@pytest.fixture(scope="session")
def shakespeare_text(shakespeare_path: Path) -> str:
    return shakespeare_path.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def wikitext2_path() -> Path:
    return _shared_file("wikitext2-valid.txt")


@pytest.fixture(scope="session")
def wikitext2_text(wikitext2_path: Path) -> str:
    return wikitext2_path.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A real Prefect server on 127.0.0.1 (temp PREFECT_HOME, SQLite); this process's settings point at it."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    from tests.prefect_server import PrefectServer

    server = PrefectServer(tmp_path_factory.mktemp("prefect-home")).start()
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.api_url, PREFECT_HOME: str(server.home)}):
            yield server
    finally:
        # Flush Prefect's background log/event senders while the server still answers; otherwise they
        # retry a dead server for a minute at interpreter exit.
        from prefect._internal.concurrency.services import QueueService

        QueueService.drain_all(timeout=15)
        server.stop()


# ---- the tiny pipeline's upstream versions, built once per session (train and sample stage tests) ------
@pytest.fixture(scope="session")
def upstream(tmp_path_factory):
    """(artifacts root, corpus, tokenizer, shards) built once with the tiny preset, outside Prefect."""
    from tasks.bpe import bpe
    from tasks.download import download
    from tasks.encode import encode

    from tests.tiny import TINY, tiny_zip_url

    tmp = tmp_path_factory.mktemp("upstream")
    root = tmp / "art"
    corpus = download(root, source_url=tiny_zip_url(tmp))
    tokenizer = bpe(root, corpus, num_merges=TINY["num_merges"], bpe_train_bytes=TINY["bpe_train_bytes"])
    shards = encode(root, corpus, tokenizer, shard_tokens=TINY["shard_tokens"], workers=1)
    return root, corpus, tokenizer, shards


@pytest.fixture(scope="session")
def trained(upstream):
    from tasks import train as train_stage
    from tests.tiny import TRAIN

    root, _, tokenizer, shards = upstream
    return train_stage.train(root, shards, tokenizer, **TRAIN)
