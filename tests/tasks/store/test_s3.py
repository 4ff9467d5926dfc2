"""An s3:// root against a real S3 API server (moto's, tests/support/s3.py): publication with the manifest
last, the local cache's checked copies, resume state, and what an unreachable store says."""

from __future__ import annotations

import json
import os
import shutil
import threading

import pytest

from flows.cli import main
from mygpt.errors import UserError
from tasks.core.faults import FaultInjected
from tasks.registry import open_store
from tasks.store import MANIFEST
from tests.tasks.store.builds import publish_locked


def test_publish_verify_copy_and_discard(s3_root, tmp_path):
    store = open_store(s3_root)
    assert store.remote and store.root == s3_root
    manifest = publish_locked(store, "corpus", "v1", {"train.txt": b"hello world\n", "sub/b.bin": bytes(range(256))})
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

    # the files lie in the build's own folder of the version, which the manifest names
    folder = f"{s3_root[5:]}/corpus/v1/{manifest['files_under']}"
    assert manifest["files_under"] == manifest["build_id"]
    assert set(store.files.files("corpus/v1")) == {
        "manifest.json",
        f"{manifest['build_id']}/sub/b.bin",
        f"{manifest['build_id']}/train.txt",
    }
    # where an external Dask cluster reads a file from (no local copy)
    assert store.file_location("corpus", "v1", "train.txt") == f"s3://{folder}/train.txt"
    # a published object changed behind the store's back: the quick check sees the size, the copy the sha256
    store.files.fs.pipe_file(f"{folder}/train.txt", b"HELLO WORLD\n")
    assert store.verify("corpus", "v1") == (True, "ok")  # same size: only the full check can tell
    assert store.verify("corpus", "v1", full=True) == (False, "'train.txt' does not match its sha256 in the manifest")

    shutil.rmtree(copy)
    with pytest.raises(UserError, match="does not match its sha256"):
        store.local_copy("corpus", "v1")
    store.files.fs.pipe_file(f"{folder}/stray.txt", b"x")
    assert store.verify("corpus", "v1") == (False, "unexpected file(s) not in the manifest: 'stray.txt'")
    store.discard("corpus", "v1", "test")
    assert store.verify("corpus", "v1") == (False, "missing") and store.versions() == []


def test_a_publish_killed_before_the_manifest_leaves_nothing_visible(s3_root):
    store = open_store(s3_root)

    def crash(where: str) -> None:
        if where == "publish":
            raise FaultInjected("killed between the files and the manifest")

    with pytest.raises(FaultInjected):
        publish_locked(store, "tokenizer", "t1", {"tokenizer.json": b"{}"}, fault=crash)
    # the files are there (in the build's own folder), the manifest is not
    assert [rel.split("/", 1)[1] for rel in store.files.files("tokenizer/t1")] == ["tokenizer.json"]
    assert store.verify("tokenizer", "t1")[1] == "manifest.json is missing in " + f"{s3_root}/tokenizer/t1"
    assert store.versions() == []
    killed = next(iter(store.files.files("tokenizer/t1"))).split("/")[0]
    manifest = publish_locked(store, "tokenizer", "t1", {"tokenizer.json": b"{}"})
    assert store.verify("tokenizer", "t1", full=True) == (True, "ok")
    # the killed build's folder is gc's: listed, collected, and the published build kept
    (item,) = [g for g in store.garbage() if g.key.startswith("tokenizer/t1") and not g.local]
    assert item.key == f"tokenizer/t1/{killed}" and "did not publish them" in item.reason
    assert store.collect(item)
    assert set(store.files.files("tokenizer/t1")) == {MANIFEST, f"{manifest['files_under']}/tokenizer.json"}
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


def test_a_manifest_naming_files_outside_its_version_is_refused(s3_root, tmp_path):
    store = open_store(s3_root)
    publish_locked(store, "corpus", "v1", {"a.txt": b"a"})
    key = f"{s3_root[5:]}/corpus/v1/manifest.json"
    manifest = json.loads(store.files.fs.cat_file(key))
    target = tmp_path / "outside.txt"
    manifest["files"] = {
        f"../../../../../../../..{target}": {"size": 1, "sha256": manifest["files"]["a.txt"]["sha256"]}
    }
    store.files.fs.pipe_file(key, json.dumps(manifest).encode())
    assert "which is not a relative file name inside the version" in store.verify("corpus", "v1")[1]

    shutil.rmtree(store.version_path("corpus", "v1"), ignore_errors=True)  # no cached copy: it must download
    with pytest.raises(UserError, match="which is not a relative file name inside the version"):
        store.local_copy("corpus", "v1")
    assert not target.exists()


def test_a_bucket_that_does_not_exist_is_one_line_naming_it(s3_root):
    with pytest.raises(UserError, match="the bucket 'no-such-bucket-zz' does not exist"):
        open_store("s3://no-such-bucket-zz/x")


def test_a_cached_copy_edited_since_is_fetched_again_by_full_check_and_pull(s3_root, tmp_path, capsys):

    store = open_store(s3_root)
    publish_locked(store, "corpus", "c1", {"a.txt": b"right"})
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


def _delete_bucket(root: str) -> str:
    """Delete the bucket of ``root`` with everything in it, as someone might while a run uses it; its name."""
    import boto3

    bucket = root[5:].split("/")[0]
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    for obj in client.list_objects_v2(Bucket=bucket).get("Contents", []):
        client.delete_object(Bucket=bucket, Key=obj["Key"])
    client.delete_bucket(Bucket=bucket)
    return bucket


def test_a_bucket_deleted_mid_run_is_one_error_naming_root_bucket_and_operation(s3_root, capsys):
    """The bucket goes while a build holds its lock: the upload, and every read after, fail with one UserError
    that names the root, the bucket and what the store was doing (was: FileNotFoundError "The specified bucket
    does not exist", or an empty listing read as "nothing published")."""
    store = open_store(s3_root)
    publish_locked(store, "corpus", "c1", {"a.txt": b"a"})
    with store.lock("shards", "s1"):
        build = store.open_build("shards", "s1")
        (build.out / "x.parquet").write_bytes(b"rows")
        bucket = _delete_bucket(s3_root)
        with pytest.raises(UserError) as err:
            build.publish(settings={}, inputs={}, code_version="1")
    reads = {
        "listing corpus": store.versions,
        "reading corpus/c1/manifest.json": lambda: store.read_manifest("corpus", "c1"),
        "listing corpus/c1": lambda: store.verify("corpus", "c1"),
        "reading corpus/c2/manifest.json": lambda: store.local_copy("corpus", "c2"),
        "listing corpus/.staging": store.garbage,
    }
    errors = [("uploading shards/s1/", err.value)]
    for what, read in reads.items():
        with pytest.raises(UserError) as err:
            read()
        errors.append((what, err.value))
    for what, error in errors:
        text = str(error)
        assert text.startswith(f"the artifact store {s3_root} failed while {what}"), text
        assert f"the bucket {bucket!r} does not exist at this endpoint" in text and "create it" in text, text
    assert main(["artifacts", "--artifacts-dir", s3_root]) == 2
    out = capsys.readouterr().err
    assert out.startswith(f"error: the artifact store {s3_root} failed while looking for the bucket: the bucket")
    assert out.count("\n") == 1 and "Traceback" not in out


def test_a_file_this_machine_published_is_read_from_its_checked_cache_not_downloaded(s3_root, tmp_path, monkeypatch):
    store = open_store(s3_root)
    manifest = publish_locked(store, "shards", "s1", {"train-00000.parquet": b"shard zero", "shards.json": b"{}"})
    downloads: list[str] = []
    fetch = type(store.files).fetch

    def counted(self, key, dest):
        downloads.append(key.rsplit("/", 1)[-1])
        return fetch(self, key, dest)

    monkeypatch.setattr(type(store.files), "fetch", counted)
    # the publish left its out/ as the cache's copy of this build: read from there, checked, no request
    assert store.fetch_bytes("shards", "s1", "train-00000.parquet", tmp_path / "in", manifest) == b"shard zero"
    assert store.fetch_bytes("shards", "s1", "shards.json", tmp_path / "in") == b"{}" and downloads == []
    copy = store.version_path("shards", "s1")
    assert (copy / "shards.json").read_bytes() == b"{}"
    # the cached file changed since (same size): its sha256 differs, so the published object is downloaded
    (copy / "train-00000.parquet").write_bytes(b"SHARD ZERO")
    assert store.fetch_bytes("shards", "s1", "train-00000.parquet", tmp_path / "in") == b"shard zero"
    assert downloads == ["train-00000.parquet"]
    # a cached copy of another build of the version is never read for this one
    cached = json.loads((copy / MANIFEST).read_text())
    (copy / MANIFEST).write_text(json.dumps({**cached, "build_id": "otherbuild00"}))
    assert store.fetch_bytes("shards", "s1", "shards.json", tmp_path / "in") == b"{}"
    assert downloads == ["train-00000.parquet", "shards.json"]
    assert manifest["build_id"] != "otherbuild00" and list((tmp_path / "in").iterdir()) == []


def _bytes_read() -> int:
    """What this process has read so far, by any read call (``rchar`` of /proc/self/io)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def test_a_cached_copy_of_another_size_is_downloaded_again_without_being_read(s3_root, tmp_path):
    store = open_store(s3_root)
    manifest = publish_locked(store, "shards", "s1", {"train-00000.parquet": b"shard zero"})
    cached = store.version_path("shards", "s1") / "train-00000.parquet"
    cached.unlink()
    with open(cached, "wb") as f:
        f.truncate(64 << 20)  # sparse: nothing on disk, 64 MiB to whoever reads it
    before = _bytes_read()
    assert store.fetch_bytes("shards", "s1", "train-00000.parquet", tmp_path / "in", manifest) == b"shard zero"
    assert _bytes_read() - before < 1 << 20  # the download and the manifest: not the cached file's 64 MiB


def test_a_cached_path_that_is_not_a_regular_file_is_downloaded_again_without_being_read(
    s3_root, tmp_path, monkeypatch
):
    """A pipe where the cached file was (swapped in after the cache looked): refused as it is opened, not read
    (reading it would wait for a writer for good)."""
    store = open_store(s3_root)
    manifest = publish_locked(store, "shards", "s1", {"train-00000.parquet": b"shard zero"})
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    monkeypatch.setattr(type(store.files), "cached", lambda self, key, rel, build_id: pipe)
    got: list = []
    reader = threading.Thread(
        target=lambda: got.append(store.fetch_bytes("shards", "s1", "train-00000.parquet", tmp_path / "in", manifest)),
        daemon=True,
    )
    reader.start()
    reader.join(5)  # a liveness bound, not a timing: it returns at once
    try:
        assert got == [b"shard zero"]
    finally:  # let a reader that waits on the pipe go
        os.close(os.open(pipe, os.O_RDWR))
