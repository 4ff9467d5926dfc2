"""Shared fixtures: real text from ../shared/data (where it is absent: a failure under CI, else a skip that says
where to put it, tests/support/shared_data.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flows.mirror import SHARED_DATA
from tests.support.shared_data import absent

# The suite shares 2 cores with the servers and runners it starts: one torch thread per process.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


#: The test files that take longest (real runs, servers, processes killed: tens of seconds each), longest first.
#: Under pytest-xdist's ``--dist loadfile`` (scripts/test) they are handed out before every other file, so that
#: the two workers end together rather than one running a long file alone at the end. A stale list costs time only.
LONGEST_FILES = (
    "tests/flows/test_control_room.py",
    "tests/reliability/test_reliability.py",
    "tests/flows/test_team_server.py",
    "tests/flows/test_small_truths.py",
    "tests/tasks/store/test_s3_lease.py",
    "tests/tasks/test_s3_pipeline.py",
    "tests/reliability/test_model_nproc.py",
    "tests/tasks/test_dask_encode.py",
    "tests/flows/test_worker_job_variables.py",
    "tests/flows/test_deployment.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with :data:`LONGEST_FILES` first (the others in xdist's own order after them)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongestFirst(LoadFileScheduling):
        ordered = False

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the queue is complete before the first file is handed out
                self.ordered = True
                rank = {name: i for i, name in enumerate(LONGEST_FILES)}
                for scope in sorted(self.workqueue, key=lambda scope: rank.get(scope, len(rank))):
                    self.workqueue.move_to_end(scope)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


def _shared_file(name: str) -> Path:
    path = SHARED_DATA / name
    if not path.is_file():
        absent(str(path))
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
def wiki_zip() -> bytes:
    """The tiny corpus's wikitext-103-style zip, from the shared text (the demo mirror's zip, byte for byte)."""
    from tests.support.corpora import shared_splits
    from tests.support.zips import wikitext_zip

    return wikitext_zip(shared_splits())


@pytest.fixture(scope="module")
def mirror(wiki_zip: bytes):
    """A loopback mirror (a ``FaultyMirror``) serving ``wiki_zip``: ``mirror.url()``; set faults with ``set_faults``."""
    from flows.mirror import ZIP_NAME
    from tests.support.mirror_faults import FaultyMirror

    with FaultyMirror({"/" + ZIP_NAME: wiki_zip}) as m:
        yield m


@pytest.fixture(autouse=True)
def _fresh_mirror(request):
    """Each test that uses ``mirror`` finds it without faults, with an empty request log and only the zip."""
    if "mirror" in request.fixturenames:
        from flows.mirror import ZIP_NAME

        m = request.getfixturevalue("mirror")
        m.set_faults()
        m.clear_log()
        m.files = {"/" + ZIP_NAME: request.getfixturevalue("wiki_zip")}


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A real Prefect server on 127.0.0.1 (temp PREFECT_HOME, SQLite); this process's settings point at it."""
    from flows.server import PrefectServer, running_server

    with running_server(PrefectServer(tmp_path_factory.mktemp("prefect-home"))) as server:
        yield server


# ---- the tiny pipeline's upstream versions, built once per session (train and sample stage tests) ------
@pytest.fixture(scope="session")
def upstream(tmp_path_factory):
    """(artifacts root, corpus, tokenizer, shards) built once with the tiny preset, outside Prefect."""
    from tasks.corpus import CorpusSettings, download_corpus
    from tasks.shards import encode_shards
    from tasks.tokenizer import train_tokenizer
    from tests.support.tiny import SETTINGS, run_in, tiny_zip_url

    tmp = tmp_path_factory.mktemp("upstream")
    root = tmp / "art"
    run = run_in(root)
    corpus = download_corpus.fn(CorpusSettings(source_url=tiny_zip_url(tmp)), run)
    tokenizer = train_tokenizer.fn(corpus, SETTINGS.tokenizer, run)
    shards = encode_shards.fn(corpus, tokenizer, SETTINGS.shards, run)
    return root, corpus, tokenizer, shards


@pytest.fixture(scope="session")
def trained(upstream):
    from tasks.model import train_model
    from tests.support.tiny import SETTINGS, run_in

    root, _, tokenizer, shards = upstream
    return train_model.fn(shards, tokenizer, SETTINGS.model, run_in(root))


@pytest.fixture(scope="session")
def s3_endpoint():
    """A moto S3 server on 127.0.0.1 for the whole session (tests/support/s3.py)."""
    from tests.support.s3 import moto_server

    with moto_server() as url:
        yield url


@pytest.fixture
def s3_root(s3_endpoint, tmp_path, monkeypatch) -> str:
    """``s3://<fresh bucket>/art`` on the session's S3 server; this process's AWS environment and cache point there."""
    from tests.support.s3 import aws_env, make_bucket, use_cache

    for name, value in aws_env(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    use_cache(monkeypatch, tmp_path / "cache")
    return f"s3://{make_bucket(s3_endpoint)}/art"
