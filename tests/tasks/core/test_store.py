"""The artifact store: version ids, atomic publish, verification, crash leftovers, the build lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tasks.registry import open_store
from tasks.store.artifacts import MANIFEST, ArtifactStore, version_id
from tests.support import REPO


def _publish(store: ArtifactStore, version: str = "v1", files: dict[str, bytes] | None = None) -> dict:
    build = store.open_build("corpus", version)
    for rel, data in (files or {"a.txt": b"alpha\n", "sub/b.bin": b"\x00\x01"}).items():
        (build.out / rel).parent.mkdir(parents=True, exist_ok=True)
        (build.out / rel).write_bytes(data)
    (build.work / "scratch.part").write_bytes(b"resume state")
    return build.publish(settings={"p": 1}, inputs={}, code_version="1", metrics={"m": 2})


def test_version_id_depends_on_every_ingredient():
    base = version_id("tokenizer", {"num_merges": 1024}, {"corpus": "abc.1"}, "1")
    assert base == version_id("tokenizer", {"num_merges": 1024}, {"corpus": "abc.1"}, "1")
    assert len(base) == 12 and int(base, 16) >= 0
    others = {
        version_id("shards", {"num_merges": 1024}, {"corpus": "abc.1"}, "1"),
        version_id("tokenizer", {"num_merges": 512}, {"corpus": "abc.1"}, "1"),
        version_id("tokenizer", {"num_merges": 1024}, {"corpus": "abc.2"}, "1"),
        version_id("tokenizer", {"num_merges": 1024}, {"corpus": "abc.1"}, "2"),
    }
    assert base not in others and len(others) == 4
    # Parameter order does not matter.
    assert version_id("corpus", {"a": 1, "b": 2}, {}, "1") == version_id("corpus", {"b": 2, "a": 1}, {}, "1")


def test_publish_writes_manifest_last_and_drops_staging(tmp_path):
    store = open_store(tmp_path)
    manifest = _publish(store)
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


@pytest.mark.parametrize(
    "damage, full, expected",
    [
        (lambda d: (d / "a.txt").unlink(), False, "a.txt is missing"),
        (lambda d: (d / "a.txt").write_bytes(b"alp"), False, "a.txt is 3 bytes, manifest says 6"),
        (lambda d: (d / "a.txt").write_bytes(b"alphA\n"), False, "ok"),  # same size: only the full check sees it
        (lambda d: (d / "a.txt").write_bytes(b"alphA\n"), True, "a.txt does not match its sha256"),
        (lambda d: (d / MANIFEST).unlink(), False, "manifest.json is missing or unreadable"),
        (lambda d: (d / MANIFEST).write_text("{not json"), False, "manifest.json is missing or unreadable"),
        (lambda d: (d / "extra.txt").write_text("x"), False, "unexpected file(s) not in the manifest: extra.txt"),
    ],
)
def test_verify_detects_damage(tmp_path, damage, full, expected):
    store = open_store(tmp_path)
    _publish(store)
    damage(tmp_path / "corpus" / "v1")
    ok, reason = store.verify("corpus", "v1", full=full)
    assert reason.startswith(expected), reason
    assert ok == (expected == "ok")


def test_rebuild_replaces_a_discarded_version(tmp_path):
    store = open_store(tmp_path)
    first = _publish(store, files={"a.txt": b"one"})
    second = _publish(store, files={"a.txt": b"two!"})
    assert first["build_id"] != second["build_id"]
    assert (tmp_path / "corpus" / "v1" / "a.txt").read_bytes() == b"two!"
    assert store.verify("corpus", "v1", full=True) == (True, "ok")
    assert not any((tmp_path / "corpus" / ".trash").iterdir())


_KILLED_BUILDER = textwrap.dedent(
    """
    import sys, time
    from tasks.store.artifacts import ArtifactStore
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


def test_listing_shows_lineage(tmp_path):
    from flows.store_commands import format_listing
    from tasks.registry import open_store

    store = open_store(tmp_path)
    corpus = _publish(store)
    build = store.open_build("tokenizer", "t1")
    (build.out / "tokenizer.json").write_text("{}")
    build.publish(
        settings={"num_merges": 8},
        inputs={"corpus": {"version": "v1", "build_id": corpus["build_id"]}},
        code_version="1",
    )
    text = format_listing(store)
    rows = {line.split()[0]: line.split() for line in text.splitlines()[2:]}
    assert rows["corpus"][1] == "v1" and rows["corpus"][-1] == "-"
    assert rows["tokenizer"][1] == "t1" and rows["tokenizer"][-1] == "corpus/v1"
    assert format_listing(open_store(tmp_path / "empty")).startswith("no published versions under")


def test_atomic_open_keeps_old_file_on_error(tmp_path):
    from mygpt.atomic import atomic_open

    target = tmp_path / "f.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_open(target, "w") as f:
        f.write("new but torn")
        raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["f.txt"]


def test_atomic_writes_get_umask_permissions(tmp_path):
    from mygpt.atomic import _UMASK, atomic_write_text

    atomic_write_text(tmp_path / "f.txt", "x")
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o666 & ~_UMASK
