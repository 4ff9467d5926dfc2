"""The dump source end to end: the same documents for any worker count and chunking, from a file:// path or a
loopback server (resumed by Range when it drops the connection), named by its sha1 and size, never its URL; a build
killed with SIGKILL mid-extraction resumes from its checkpoints and gives the same bytes."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mygpt.errors import UserError
from tasks.corpora.dump.adapter import CHECKPOINTS, DumpSource
from tasks.corpora.dump.settings import DumpSettings
from tasks.corpora.dump.streams import range_size
from tasks.corpora.dump.wikitext import plain_text
from tests.support.mirror_faults import FaultyMirror

from .conftest import context

REPO = Path(__file__).resolve().parents[4]


def extract(url: str, work: Path, workers: int = 1, streams_per_range: int | None = 2, **settings):
    work.mkdir(parents=True, exist_ok=True)
    source = DumpSource(streams_per_range)
    ctx = context(work, workers)
    docs = list(source.documents(DumpSettings(source_url=url, **settings), ctx))
    return docs, source, ctx


@pytest.fixture(scope="module")
def reference(dump, tmp_path_factory):
    """The dump's documents in one range on one worker, and the run's source and context."""
    return extract(dump.dump.as_uri(), tmp_path_factory.mktemp("reference"), 1, 1000)


def test_articles_in_dump_order_with_the_drop_counts(dump, pages, reference):
    docs, source, ctx = reference
    articles = [p for p in pages if p.ns == 0 and p.redirect is None]
    assert [d.doc_id for d in docs] == [str(p.page_id) for p in articles]
    assert [d.title for d in docs] == [p.title for p in articles]
    assert [d.text for d in docs] == [plain_text(p.wikitext) for p in articles]
    assert {d.title for d in docs} >= {"東京の歴史", "Москва", "القاهرة"}
    assert any(d.title.endswith("(disambiguation)") for d in docs)  # kept: an article like any other
    m = source.report_metrics(None, ctx)
    assert m["sha1"] == dump.sha1 and m["wiki"] == "testwiki" and m["dump_date"] == "20261101"
    assert m["pages"] == len(pages) and m["articles"] == len(docs)
    assert m["dropped_redirect"] == sum(p.redirect is not None for p in pages) > 0
    assert m["dropped_namespace"] == sum(p.ns != 0 for p in pages) > 0
    done, total, message = ctx.progress_calls[-1]
    assert done == total == dump.dump.stat().st_size
    assert f"{m['streams']}/{m['streams']} streams" in message and f"{len(pages)} pages" in message


@pytest.mark.parametrize(("workers", "streams_per_range"), [(1, 1), (2, 3), (3, 7), (2, None)])
def test_same_documents_for_any_worker_count_and_chunking(dump, tmp_path, reference, workers, streams_per_range):
    docs, _, _ = extract(dump.dump.as_uri(), tmp_path / "w", workers, streams_per_range)
    assert docs == reference[0]


def test_on_an_existing_dask_cluster_the_same_documents(dump, tmp_path, reference):
    """A ``run.dask_address`` sends the ranges to that cluster's workers."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, processes=False, protocol="tcp", host="127.0.0.1", dashboard_address=None) as c:
        ctx = context(tmp_path / "w", 2)
        ctx.run = ctx.run.model_copy(update={"dask_address": c.scheduler_address})
        (tmp_path / "w").mkdir()
        docs = list(DumpSource(3).documents(DumpSettings(source_url=dump.dump.as_uri()), ctx))
        on_the_cluster = "dump-extract" in c.scheduler.task_prefixes  # the ranges' tasks, as Dask names them
    assert on_the_cluster
    assert docs == reference[0]


def test_a_small_dump_is_cut_into_ranges_of_fewer_streams():
    assert [range_size(n) for n in (1, 5, 31, 32, 47, 256, 10**6)] == [1, 1, 1, 2, 2, 16, 16]


def test_identity_is_the_dumps_sha1_and_size_not_its_url(dump, tmp_path):
    source = DumpSource()
    with FaultyMirror({f"/a/{p.name}": p for p in (dump.dump, dump.index, dump.sha1sums)}) as mirror:
        http = source.identity(DumpSettings(source_url=f"{mirror.base_url}/a/{dump.dump.name}"), None)
    local = source.identity(DumpSettings(source_url=dump.dump.as_uri()), None)
    assert http == local
    assert local["sha1"] == dump.sha1 and local["bytes"] == dump.dump.stat().st_size
    assert "url" not in json.dumps(local)


def test_over_http_a_dropped_connection_resumes_by_range(dump, tmp_path, reference):
    files = {f"/{p.name}": p for p in (dump.dump, dump.index, dump.sha1sums)}
    with FaultyMirror(files) as mirror:
        mirror.set_faults(drop_after=50_000, drop_times=-1)
        docs, _, _ = extract(f"{mirror.base_url}/{dump.dump.name}", tmp_path / "w")
        ranges = [r["range"] for r in mirror.requests if r["path"].endswith(dump.dump.name)]
    assert docs == reference[0]
    assert "bytes=50000-" in ranges  # the download went on from where the connection dropped


def test_a_server_that_ignores_range_after_a_drop_is_one_error(dump, tmp_path, monkeypatch):
    monkeypatch.setenv("WIKI_PIPELINE_RETRY_BASE_DELAY", "0.01")
    files = {f"/{p.name}": p for p in (dump.dump, dump.index, dump.sha1sums)}
    with FaultyMirror(files) as mirror:
        mirror.set_faults(drop_after=50_000, drop_times=-1, ignore_range=True)
        with pytest.raises(UserError, match=rf"downloading {mirror.base_url}/{dump.dump.name} failed \d+ times"):
            extract(f"{mirror.base_url}/{dump.dump.name}", tmp_path / "w")
    assert not list((tmp_path / "w").glob(f"{CHECKPOINTS}/*.json"))  # nothing extracted


def test_sigkill_mid_extraction_resumes_from_the_checkpoints_with_the_same_bytes(dump, tmp_path):
    url = dump.dump.as_uri()
    whole, killed = tmp_path / "whole.txt", tmp_path / "killed.txt"
    run = [sys.executable, "-m", "tasks.corpora.dump", url, "--streams-per-range", "1", "--workers", "1"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    first = subprocess.run([*run, "--work", str(tmp_path / "w1"), "--out", str(whole)], check=True, cwd=REPO,
                           env=env, capture_output=True, text=True)  # fmt: skip
    checkpoints = tmp_path / "w2" / CHECKPOINTS
    killer = {**env, "WIKI_PIPELINE_FAULT": "corpus.dump_range@3"}  # SIGKILLs itself once 3 ranges are saved
    proc = subprocess.run([*run, "--work", str(tmp_path / "w2"), "--out", str(killed)], cwd=REPO, env=killer,
                          capture_output=True, timeout=300)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    done = sorted(p.name for p in checkpoints.glob("*.json"))
    total = len(list((tmp_path / "w1" / CHECKPOINTS).glob("*.json")))
    assert len(done) == 3 < total and not killed.exists()  # killed mid-extraction, before the output
    stamps = {p: (tmp_path / "w2" / CHECKPOINTS / p).stat().st_mtime_ns for p in done}
    out = subprocess.run([*run, "--work", str(tmp_path / "w2"), "--out", str(killed)], check=True, cwd=REPO,
                         env=env, capture_output=True, text=True)  # fmt: skip
    assert killed.read_bytes() == whole.read_bytes()
    assert hashlib.sha256(killed.read_bytes()).hexdigest() == hashlib.sha256(whole.read_bytes()).hexdigest()
    # the ranges finished before the kill were read back, not extracted again
    assert {p: (tmp_path / "w2" / CHECKPOINTS / p).stat().st_mtime_ns for p in done} == stamps
    assert json.loads(out.stdout.splitlines()[-1]) == json.loads(first.stdout.splitlines()[-1])


def test_a_download_whose_sha1_is_wrong_is_fetched_again_by_the_rerun(dump, tmp_path, reference):
    """The error says "download it again": the rerun (the same version, so the same work folder) must, not reuse
    the damaged copy for ever once the server serves the right bytes."""
    bad = bytearray(dump.dump.read_bytes())
    bad[len(bad) // 2] ^= 0xFF  # the same size: only the sha1 tells
    docs = _rerun_after_damaged(dump, tmp_path, dump.dump, bytes(bad), r"its sha1 is [0-9a-f]{40}, not the")
    assert docs == reference[0]


def test_a_downloaded_index_that_is_not_whole_is_fetched_again_by_the_rerun(dump, tmp_path, reference):
    half = dump.index.read_bytes()[: dump.index.stat().st_size // 2]
    assert _rerun_after_damaged(dump, tmp_path, dump.index, half, r"not a whole bz2 file") == reference[0]


def _rerun_after_damaged(dump, tmp_path, damaged, bad: bytes, refusal: str) -> list:
    """The documents of a rerun that finds ``damaged`` served whole, after a first run that got ``bad`` for it and
    was refused with ``refusal``: the two runs share the version's work folder."""
    files = {f"/{p.name}": p for p in (dump.dump, dump.index, dump.sha1sums) if p != damaged}
    with FaultyMirror({**files, f"/{damaged.name}": bad}) as mirror:
        url = f"{mirror.base_url}/{dump.dump.name}"
        with pytest.raises(UserError, match=refusal):
            extract(url, tmp_path / "w")
        mirror.add(f"/{damaged.name}", damaged.read_bytes())
        docs, _, _ = extract(url, tmp_path / "w")
    return docs


def test_the_collector_is_off_while_a_thread_extracts_and_as_it_was_after_the_last():
    import gc
    import threading

    from tasks.corpora.dump.extract import gc_paused

    assert gc.isenabled()
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with gc_paused():
            inside.set()
            leave.wait(60)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(60)
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled(), "the other thread is still inside"
    leave.set()
    t.join(60)
    assert gc.isenabled(), "back on after the last one left"
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled(), "a collector that was off stays off"
    finally:
        gc.enable()
