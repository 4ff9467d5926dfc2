"""A build: publication with the manifest last, resume after a crash, rebuilds."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

from tasks.core.settings import RunOptions
from tasks.registry import open_store
from tasks.store import MANIFEST, ArtifactStore
from tests.support import REPO
from tests.tasks.store.builds import SOURCE, Word, publish_local


def test_publish_writes_manifest_last_and_drops_staging(tmp_path):
    store = open_store(tmp_path)
    manifest = publish_local(store)
    vdir = tmp_path / "corpus" / "v1"
    assert sorted(str(p.relative_to(vdir)) for p in vdir.rglob("*") if p.is_file()) == ["a.txt", MANIFEST, "sub/b.bin"]
    on_disk = json.loads((vdir / MANIFEST).read_text())
    assert on_disk == json.loads(json.dumps(manifest))
    assert on_disk["files"]["a.txt"]["size"] == 6
    assert on_disk["settings"] == {"p": 1} and on_disk["metrics"] == {"m": 2}
    assert not store.staging_path("corpus", "v1").exists(), "staging (and work/ resume state) must go on publish"
    assert store.verify("corpus", "v1") == (True, "ok")
    assert [v.version for v in store.versions("corpus")] == ["v1"]


def test_unpublished_build_is_invisible_and_resumable(tmp_path):
    store = open_store(tmp_path)
    build = store.open_build("corpus", "v1")
    assert not build.resumed
    (build.out / "a.txt").write_text("half")
    (build.work / ".ckpt.1234.tmp").write_text("torn temp file")
    # A reader sees nothing while the build is in progress.
    assert store.verify("corpus", "v1") == (False, "missing")
    assert store.versions() == []
    again = store.open_build("corpus", "v1")
    assert again.resumed and (again.out / "a.txt").read_text() == "half"
    assert not (again.work / ".ckpt.1234.tmp").exists(), "temp files of a killed writer are swept"


def test_rebuild_replaces_a_discarded_version(tmp_path):
    store = open_store(tmp_path)
    first = publish_local(store, files={"a.txt": b"one"})
    second = publish_local(store, files={"a.txt": b"two!"})
    assert first["build_id"] != second["build_id"]
    assert (tmp_path / "corpus" / "v1" / "a.txt").read_bytes() == b"two!"
    assert store.verify("corpus", "v1", full=True) == (True, "ok")
    assert not any((tmp_path / "corpus" / ".trash").iterdir())


_KILLED_BUILDER = textwrap.dedent(
    """
    import sys, time
    from tasks.store import ArtifactStore
    store = ArtifactStore(sys.argv[1])
    with store.lock("corpus", "v1"):
        build = store.open_build("corpus", "v1")
        (build.out / "a.txt").write_bytes(b"x" * 1000)
        (build.work / "progress.json").write_text('{"done": 1}')
        print("building", flush=True)
        time.sleep(60)
        build.publish(settings={}, inputs={}, code_version="1")
    """
)


def test_sigkill_mid_build_leaves_no_version_and_frees_the_lock(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_BUILDER, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "building"
    store = open_store(tmp_path)
    # While it builds, another builder has to wait for the lock.
    waited = []
    killer = subprocess.Popen(["sh", "-c", f"sleep 1; kill -9 {proc.pid}"])
    with store.lock("corpus", "v1", on_wait=lambda: waited.append(True)):
        # We were made to wait, and got the lock because the holder died: the kernel frees a flock as the
        # killed process exits, which can be before its parent may reap it, so wait for the exit (poll() may
        # still say None here) rather than expect it to be visible already.
        assert waited
        assert proc.wait(60) == -signal.SIGKILL
        assert store.verify("corpus", "v1") == (False, "missing")
        build = store.open_build("corpus", "v1")
        assert build.resumed and (build.work / "progress.json").read_text() == '{"done": 1}'
    killer.wait()


def test_a_leftover_manifest_in_staging_is_removed_before_the_build(tmp_path):
    """A publish killed after writing the manifest but before the rename leaves out/manifest.json in staging; the
    next build must remove it (publish refuses a manifest it did not write)."""
    run = RunOptions(artifacts_dir=str(tmp_path))
    version = SOURCE.version(Word().resolved(), {})
    out = ArtifactStore(tmp_path).staging_path("corpus", version) / "out"
    out.mkdir(parents=True)
    (out / "manifest.json").write_text('{"build_id": "left-over"}')
    ref = SOURCE.reuse_or_build(Word(), run, {})
    assert ref["version"] == version and ref["build_id"] != "left-over"
    assert ArtifactStore(tmp_path).verify("corpus", version, full=True) == (True, "ok")


def test_publish_hashes_the_files_of_a_version_at_once_and_records_each_ones_own_sha256(tmp_path, monkeypatch):
    import hashlib
    import threading

    from tasks.store import build as build_module

    both = threading.Barrier(2, timeout=10)  # sequential hashing never has two files in hand at once: it times out
    real = build_module.sha256_file

    def meeting(path):
        both.wait()
        return real(path)

    monkeypatch.setattr(build_module, "HASH_THREADS", 2)
    monkeypatch.setattr(build_module, "sha256_file", meeting)
    files = {"a.txt": b"alpha\n", "b.txt": b"beta\n" * 1000}
    manifest = publish_local(open_store(tmp_path), files=files)
    assert manifest["files"] == {
        rel: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for rel, data in files.items()
    }
