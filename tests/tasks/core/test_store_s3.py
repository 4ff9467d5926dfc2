"""The artifact store on an s3:// root, against a real S3 API server (moto's, on 127.0.0.1: tests/support/s3.py):
publication with the manifest last, verification, the local cache's checked copies, the build lock's lease (a
conditional write) and its take-over when the holder is SIGKILLed, and what an unreachable store says."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from mygpt.errors import UserError
from tasks.core.faults import FaultInjected
from tasks.registry import open_store
from tasks.store.artifacts import ArtifactStore


def _publish(store: ArtifactStore, stage: str, version: str, files: dict[str, bytes], fault=None) -> dict:
    with store.lock(stage, version):
        build = store.open_build(stage, version)
        for rel, data in files.items():
            (build.out / rel).parent.mkdir(parents=True, exist_ok=True)
            (build.out / rel).write_bytes(data)
        return build.publish(settings={"a": 1}, inputs={}, code_version="1", fault=fault)


def test_publish_verify_copy_and_discard(s3_root, tmp_path):
    store = open_store(s3_root)
    assert store.remote and store.root == s3_root
    manifest = _publish(store, "corpus", "v1", {"train.txt": b"hello world\n", "sub/b.bin": bytes(range(256))})
    assert store.verify("corpus", "v1", full=True) == (True, "ok")
    assert [v.version for v in store.versions()] == ["v1"]
    assert store.versions()[0].path == f"{s3_root}/corpus/v1"
    # the staging prefix and the local staging dir are gone once published
    assert not store.files.files("corpus/.staging/v1") and not store.staging_path("corpus", "v1").exists()
    copy = store.local_copy("corpus", "v1")
    assert (copy / "train.txt").read_bytes() == b"hello world\n" and (copy / "sub/b.bin").read_bytes() == bytes(
        range(256)
    )
    assert json.loads((copy / "manifest.json").read_text())["build_id"] == manifest["build_id"]

    # a published object changed behind the store's back: the quick check sees the size, the copy the sha256
    store.files.fs.pipe_file(f"{s3_root[5:]}/corpus/v1/train.txt", b"HELLO WORLD\n")
    assert store.verify("corpus", "v1") == (True, "ok")  # same size: only the full check can tell
    assert store.verify("corpus", "v1", full=True) == (False, "train.txt does not match its sha256 in the manifest")
    import shutil

    shutil.rmtree(copy)
    with pytest.raises(UserError, match="does not match its sha256"):
        store.local_copy("corpus", "v1")
    store.files.fs.pipe_file(f"{s3_root[5:]}/corpus/v1/stray.txt", b"x")
    assert store.verify("corpus", "v1") == (False, "unexpected file(s) not in the manifest: stray.txt")
    store.discard("corpus", "v1", "test")
    assert store.verify("corpus", "v1") == (False, "missing") and store.versions() == []


def test_a_publish_killed_before_the_manifest_leaves_nothing_visible(s3_root):
    store = open_store(s3_root)

    def crash(where: str) -> None:
        if where == "publish":
            raise FaultInjected("killed between the files and the manifest")

    with pytest.raises(FaultInjected):
        _publish(store, "tokenizer", "t1", {"tokenizer.json": b"{}"}, fault=crash)
    assert store.files.files("tokenizer/t1") == {"tokenizer.json": 2}  # the files are there, the manifest is not
    assert (
        store.verify("tokenizer", "t1")[1] == "manifest.json is missing or unreadable in " + f"{s3_root}/tokenizer/t1"
    )
    assert store.versions() == []
    _publish(store, "tokenizer", "t1", {"tokenizer.json": b"{}"})
    assert store.verify("tokenizer", "t1", full=True) == (True, "ok")


def test_resume_state_saved_by_a_build_is_fetched_by_a_build_elsewhere(s3_root, tmp_path, monkeypatch):
    store = open_store(s3_root)
    with store.lock("shards", "s1"):
        build = store.open_build("shards", "s1")
        (build.out / "train-00000.parquet").write_bytes(b"shard zero")
        (build.work / "progress.json").write_text('{"done": 1}')
        (build.work / "scratch.bin").write_bytes(b"not saved")
        build.save(build.out / "train-00000.parquet", build.work / "progress.json")
    # another machine: another cache folder, nothing local
    monkeypatch.setenv("WIKI_PIPELINE_CACHE", str(tmp_path / "elsewhere"))
    other = open_store(s3_root)
    with other.lock("shards", "s1"):
        again = other.open_build("shards", "s1")
        assert again.resumed and again.dir != build.dir
        assert (again.out / "train-00000.parquet").read_bytes() == b"shard zero"
        assert (again.work / "progress.json").read_text() == '{"done": 1}'
        assert not (again.work / "scratch.bin").exists()
        again.publish(settings={}, inputs={}, code_version="1")
    assert other.files.files("shards/.staging/s1") == {}


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from tasks.registry import open_store
    store = open_store(sys.argv[1])
    with store.lock("model", "m1"):
        print("holding", flush=True)
        time.sleep(600)
    """
)


def test_a_killed_builders_lease_is_taken_over(s3_root, s3_endpoint, tmp_path):
    from tests.support.s3 import LEASE_SECONDS, environ_with

    env = environ_with(s3_endpoint, WIKI_PIPELINE_CACHE=str(tmp_path / "holder"))
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, s3_root], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        store = open_store(s3_root)
        assert store.is_locked("model", "m1")
        with store.try_lock("model", "m1") as taken:
            assert not taken  # renewed: alive
        time.sleep(1.5 * float(LEASE_SECONDS))
        with store.try_lock("model", "m1") as taken:
            assert not taken  # still renewed after more than a lease time: a live holder keeps its lock
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        waited: list[bool] = []
        t0 = time.monotonic()
        with store.lock("model", "m1", on_wait=lambda: waited.append(True)):
            took = time.monotonic() - t0
            assert waited == [True]
            body = json.loads(store.files.fs.cat_file(f"{s3_root[5:]}/model/.locks/m1.lock"))
            assert body["holder"].split(":")[1] == str(os.getpid())
        assert float(LEASE_SECONDS) <= took < 6 * float(LEASE_SECONDS)
        assert not store.is_locked("model", "m1")
    finally:
        holder.kill()
        holder.wait()


def test_two_runs_never_hold_one_lock(s3_root):
    store = open_store(s3_root)
    inside, overlaps, done = [0], [0], []

    def builder() -> None:
        for _ in range(3):
            with store.lock("shards", "x1"):
                inside[0] += 1
                overlaps[0] = max(overlaps[0], inside[0])
                time.sleep(0.2)
                inside[0] -= 1
        done.append(True)

    threads = [threading.Thread(target=builder) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert done == [True] * 3 and overlaps[0] == 1


def test_a_pinned_input_holds_off_builders_and_gc(s3_root):
    store = open_store(s3_root)
    _publish(store, "corpus", "c1", {"a.txt": b"a"})
    with store.pin("corpus", "c1"), store.pin("corpus", "c1"):  # readers share
        with store.try_lock("corpus", "c1") as taken:
            assert not taken
        assert store.is_locked("corpus", "c1")
    with store.try_lock("corpus", "c1") as taken:
        assert taken
    assert not store.is_locked("corpus", "c1")


def test_an_unreachable_store_says_which_bucket_and_leaks_no_secret(tmp_path, monkeypatch):
    from flows.server import free_port
    from tests.support.s3 import aws_env

    dead = f"http://127.0.0.1:{free_port()}"
    for name, value in aws_env(dead).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WIKI_PIPELINE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(UserError) as err:
        open_store("s3://no-such-place/art").verify("corpus", "v1")
    text = str(err.value)
    assert "s3://no-such-place/art" in text and "rerun" in text
    assert "wikitestsecret" not in text and "wikitestkey" not in text


@pytest.mark.parametrize(
    "root, why",
    [
        ("s3://AKIA:secret@bucket/x", "never from the URL"),
        ("s3://Bad_Bucket/x", "is not a bucket name"),
        ("s3://bucket/../x", "'.'/'..' segments"),
        ("gs://bucket/x", "a local directory or an s3://bucket/prefix URL"),
        ("s3://bucket/team?", "glob and query characters"),
        ("s3://bucket/x?versionId=1", "glob and query characters"),
        ("s3:/bucket/x", "a local directory or an s3://bucket/prefix URL"),
    ],
)
def test_bad_object_store_roots_are_refused_with_the_fix(root, why):
    from pydantic import ValidationError

    from tasks.core.settings import RunOptions

    with pytest.raises(ValidationError) as err:
        RunOptions(artifacts_dir=root)
    assert why in str(err.value)


def test_gc_on_s3_lists_and_deletes_what_no_run_needs_and_keeps_what_one_reads(s3_root, capsys):
    from flows.cli import main

    store = open_store(s3_root)
    _publish(store, "corpus", "c1", {"a.txt": b"a"})
    store.local_copy("corpus", "c1")
    with store.lock("shards", "s1"):  # an unfinished build whose resume state is in the bucket
        build = store.open_build("shards", "s1")
        (build.work / "progress.json").write_text("{}")
        build.save(build.work / "progress.json")
    found = {(g.key, g.local) for g in store.garbage()}
    assert ("shards/.staging/s1", False) in found  # the bucket's
    assert ("shards/.staging/s1", True) in found and ("corpus/c1", True) in found  # this machine's cache
    cli = ["gc", "--artifacts-dir", s3_root]
    with store.pin("corpus", "c1"):
        assert main(cli) == 0
        dry = capsys.readouterr()
        assert "would delete" in dry.out and "shards/.staging/s1" in dry.out and "(cache) corpus/c1" in dry.out
        assert s3_root in dry.out and "wikitestsecret" not in dry.out + dry.err
        assert main([*cli, "--yes"]) == 0
        done = capsys.readouterr().out
        assert "in use" in done and "(cache) corpus/c1" in done
    assert store.files.files("shards/.staging") == {} and not store.staging_path("shards", "s1").exists()
    assert store.verify("corpus", "c1", full=True) == (True, "ok")  # published versions stay
    assert store.version_path("corpus", "c1").is_dir()  # a build here was reading it: kept
    assert [g.key for g in store.garbage()] == ["corpus/c1"]


def test_a_builder_whose_lease_was_taken_over_does_not_publish(s3_root):
    store = open_store(s3_root)
    with store.lock("corpus", "v9"):
        build = store.open_build("corpus", "v9")
        (build.out / "a.txt").write_text("mine")
        # meanwhile another run judged this lease dead and took it over (a compare-and-swap on its ETag)
        store.files.fs.pipe_file(f"{s3_root[5:]}/corpus/.locks/v9.lock", b'{"holder": "another run"}')
        with pytest.raises(UserError, match="lost the build lock"):
            build.publish(settings={}, inputs={}, code_version="1")
    assert store.verify("corpus", "v9") == (False, "missing")


def test_a_manifest_naming_files_outside_its_version_is_refused(s3_root, tmp_path):
    store = open_store(s3_root)
    _publish(store, "corpus", "v1", {"a.txt": b"a"})
    key = f"{s3_root[5:]}/corpus/v1/manifest.json"
    manifest = json.loads(store.files.fs.cat_file(key))
    target = tmp_path / "outside.txt"
    manifest["files"] = {
        f"../../../../../../../..{target}": {"size": 1, "sha256": manifest["files"]["a.txt"]["sha256"]}
    }
    store.files.fs.pipe_file(key, json.dumps(manifest).encode())
    assert "not a file of the version" in store.verify("corpus", "v1")[1]
    import shutil

    shutil.rmtree(store.version_path("corpus", "v1"), ignore_errors=True)  # no cached copy: it must download
    with pytest.raises(UserError, match="not a plain relative path"):
        store.local_copy("corpus", "v1")
    assert not target.exists()


def test_a_bucket_that_does_not_exist_is_one_line_naming_it(s3_root):
    with pytest.raises(UserError, match="the bucket 'no-such-bucket-zz' does not exist"):
        open_store("s3://no-such-bucket-zz/x")


def test_a_dead_readers_pin_does_not_keep_gc_away(s3_root):
    from tests.support.s3 import LEASE_SECONDS

    store = open_store(s3_root)
    _publish(store, "corpus", "c1", {"a.txt": b"a"})
    store.files.fs.pipe_file(f"{s3_root[5:]}/corpus/.locks/c1.lock.pins/a-killed-reader", b"{}")
    with store.try_lock("corpus", "c1") as taken:
        assert not taken  # it might be alive
    time.sleep(2 * float(LEASE_SECONDS) + 1.5)  # unrenewed for two lease times, by the server's clock
    with store.try_lock("corpus", "c1") as taken:
        assert taken
    assert store.files.files("corpus/.locks/c1.lock.pins") == {}


def test_a_cached_copy_edited_since_is_fetched_again_by_full_check_and_pull(s3_root, tmp_path, capsys):
    from flows.cli import main

    store = open_store(s3_root)
    _publish(store, "corpus", "c1", {"a.txt": b"right"})
    copy = store.local_copy("corpus", "c1")
    (copy / "a.txt").write_bytes(b"WRONG")  # same size: the quick check trusts it, as on a local root
    assert (store.local_copy("corpus", "c1", full=True) / "a.txt").read_bytes() == b"right"
    (copy / "a.txt").write_bytes(b"WRONG")
    assert main(["pull", "corpus/c1", str(tmp_path / "out"), "--artifacts-dir", s3_root]) == 0
    assert (tmp_path / "out" / "a.txt").read_bytes() == b"right"
    # a stray key under a stage's staging is not gc's to judge: listed nothing, no crash
    store.files.fs.pipe_file(f"{s3_root[5:]}/corpus/.staging/../x", b"x")
    assert main(["gc", "--artifacts-dir", s3_root]) == 0
    capsys.readouterr()
