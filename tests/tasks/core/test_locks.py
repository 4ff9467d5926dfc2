"""The store's locks for real (issue 21): a second builder waits until the first releases (a real second
process), a running build pins its inputs so gc keeps them, gc deletes lock files by the lock-file-deletion
protocol, and the stage runner's leftover-manifest and full-check paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from flows.cli import main
from tasks.core.settings import RunOptions, Settings
from tasks.core.stage import Stage
from tasks.registry import code_versions, open_store
from tasks.store.artifacts import ArtifactStore
from tests.support import REPO
from tests.support.wait import wait_for


def _flock_waiters(path: Path) -> int:
    """How many flock requests wait (blocked, ``->`` in /proc/locks) on the file ``path`` names now."""
    ino = os.stat(path).st_ino
    lines = Path("/proc/locks").read_text().splitlines()
    return sum(1 for line in lines if "->" in line.split() and any(f.endswith(f":{ino}") for f in line.split()))


_SECOND_BUILDER = textwrap.dedent(
    """
    import os, sys
    from tasks.store.artifacts import ArtifactStore
    store = ArtifactStore(sys.argv[1])
    with store.lock("corpus", "v1", on_wait=lambda: print("waiting", flush=True)):
        # the first holder deletes this file just before it releases the lock
        print("held by the first" if os.path.exists(sys.argv[2]) else "after the first", flush=True)
    """
)


def test_a_second_builder_really_waits_until_the_first_releases(tmp_path):
    store = ArtifactStore(tmp_path)
    holding = tmp_path / "first-holds"
    holding.write_text("")
    with store.lock("corpus", "v1"):
        second = subprocess.Popen(
            [sys.executable, "-c", _SECOND_BUILDER, str(tmp_path), str(holding)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert second.stdout.readline().strip() == "waiting"
        # the kernel shows the second process blocked on our lock file (a lock that never blocks shows no waiter
        # and lets the second one in while "first-holds" still exists)
        wait_for(
            lambda: _flock_waiters(store.lock_path("corpus", "v1")) or second.poll() is not None,
            "the second builder to block on the lock",
        )
        holding.unlink()
    assert second.stdout.read().strip() == "after the first"
    assert second.wait(60) == 0


def test_a_builder_that_locked_a_file_gc_deleted_starts_over(tmp_path):
    """gc deletes a lock file while holding it; a builder that opened the old file before the unlink and locks it
    after must notice (another inode) and lock the file the path names now, so it never builds beside the holder
    of the new file."""
    store = ArtifactStore(tmp_path)
    acquired, release = threading.Event(), threading.Event()

    def builder() -> None:
        with store.lock("corpus", "v1"):
            acquired.set()
            release.wait(60)

    thread = threading.Thread(target=builder)
    with store.try_lock("corpus", "v1") as taken:  # gc collecting corpus/v1
        assert taken
        path = store.lock_path("corpus", "v1")
        old_inode = os.stat(path).st_ino
        thread.start()
        wait_for(lambda: _flock_waiters(path), "the builder to block on the old lock file")
        store._unlink_lock("corpus", "v1")  # gc deletes the lock file, still holding it
        newcomer = store.lock("corpus", "v1")  # a builder arriving now locks a new file
        newcomer.__enter__()
        assert os.stat(path).st_ino != old_inode
    # gc released the old file: the waiting builder wakes on it, and must now wait for the newcomer
    wait_for(lambda: acquired.is_set() or _flock_waiters(path), "the builder to move to the new lock file")
    assert not acquired.is_set(), "the builder took the deleted lock file while another builder held the new one"
    newcomer.__exit__(None, None, None)
    assert acquired.wait(60)
    release.set()
    thread.join(60)


class _Word(Settings):
    word: str = "x"


def _source(ctx, settings: _Word) -> dict:
    (ctx.out / "a.txt").write_text("hello " + settings.word)
    return {}


SOURCE = Stage("corpus", _Word, code_versions()["corpus"], _source, lambda m: "")


def test_gc_keeps_the_inputs_a_running_build_reads_and_deletes_lock_files(tmp_path, capsys):
    """Issue 21 item 5: `gc --stale --yes` during a build deleted the build's input; item 10: lock files stayed."""
    run = RunOptions(artifacts_dir=str(tmp_path))
    corpus = SOURCE.reuse_or_build(_Word(), run, {})
    store = open_store(tmp_path)
    # the corpus turns stale (built by an older code version), as an input rebuilt or replaced would
    manifest_path = Path(corpus["path"]) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["code_version"] = "0"
    manifest_path.write_text(json.dumps(manifest))
    assert (("corpus", corpus["version"])) in store.stale_versions(code_versions())
    seen = {}

    def reader(ctx, settings: _Word, corpus: Path) -> dict:
        assert main(["gc", "--artifacts-dir", str(tmp_path), "--stale", "--yes"]) == 0
        seen["gc"] = capsys.readouterr().out
        (ctx.out / "b.txt").write_text((corpus / "a.txt").read_text().upper())  # the input is still there
        return {}

    upper = Stage("tokenizer", _Word, code_versions()["tokenizer"], reader, lambda m: "")
    upper.reuse_or_build(_Word(), run, {"corpus": corpus})
    assert f"corpus/{corpus['version']}  kept: a running build is writing or reading it" in seen["gc"]
    assert (tmp_path / "tokenizer" / upper.version(_Word(), {"corpus": corpus}) / "b.txt").read_text() == "HELLO X"

    # an orphan lock file (a version neither published nor being built) and the stale corpus: both collected now
    (tmp_path / "corpus" / ".locks" / "gone.lock").write_text("")
    assert main(["gc", "--artifacts-dir", str(tmp_path), "--stale", "--yes"]) == 0
    out = capsys.readouterr().out
    assert "corpus/.locks/gone.lock  the lock file of corpus/gone, which is neither published nor being built" in out
    assert not (tmp_path / "corpus" / corpus["version"]).exists()
    assert sorted(p.name for p in (tmp_path / "corpus" / ".locks").iterdir()) == []


def test_a_leftover_manifest_in_staging_is_removed_before_the_build(tmp_path):
    """A publish killed after writing the manifest but before the rename leaves out/manifest.json in staging; the
    next build must remove it (publish refuses a manifest it did not write)."""
    run = RunOptions(artifacts_dir=str(tmp_path))
    version = SOURCE.version(_Word().resolved(), {})
    out = ArtifactStore(tmp_path).staging_path("corpus", version) / "out"
    out.mkdir(parents=True)
    (out / "manifest.json").write_text('{"build_id": "left-over"}')
    ref = SOURCE.reuse_or_build(_Word(), run, {})
    assert ref["version"] == version and ref["build_id"] != "left-over"
    assert ArtifactStore(tmp_path).verify("corpus", version, full=True) == (True, "ok")


@pytest.mark.parametrize("full_check", [False, True])
def test_reuse_checks_every_sha256_under_full_check(tmp_path, full_check):
    """A file changed in place at the same size passes the quick check (sizes) but not ``full_check``."""
    builds = []

    def build(ctx, settings: _Word) -> dict:
        builds.append(1)
        return _source(ctx, settings)

    run = RunOptions(artifacts_dir=str(tmp_path), full_check=full_check)
    first = replace(SOURCE, build=build).reuse_or_build(_Word(), run, {})
    (Path(first["path"]) / "a.txt").write_text("HELLO x")  # same size, other bytes
    again = replace(SOURCE, build=build).reuse_or_build(_Word(), run, {})
    if full_check:
        assert len(builds) == 2 and again["build_id"] != first["build_id"]
        assert (Path(again["path"]) / "a.txt").read_text() == "hello x"
    else:
        assert len(builds) == 1 and again["build_id"] == first["build_id"]
