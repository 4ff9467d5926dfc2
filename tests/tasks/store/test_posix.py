"""A directory root's build locks for real: a second process waits; a lock file gc deleted is not held."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from tasks.store import ArtifactStore
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
    from tasks.store import ArtifactStore
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
            lambda: _flock_waiters(store.files.path(store._lock_key("corpus", "v1"))) or second.poll() is not None,
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
        path = store.files.path(store._lock_key("corpus", "v1"))
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
