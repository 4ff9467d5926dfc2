"""The build lock on S3 (a lease): one holder at a time, taken over from a killed holder, readers' pins."""

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
from tasks.registry import open_store
from tests.tasks.store.builds import publish_locked

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
    publish_locked(store, "corpus", "c1", {"a.txt": b"a"})
    with store.pin("corpus", "c1"), store.pin("corpus", "c1"):  # readers share
        with store.try_lock("corpus", "c1") as taken:
            assert not taken
        assert store.is_locked("corpus", "c1")
    with store.try_lock("corpus", "c1") as taken:
        assert taken
    assert not store.is_locked("corpus", "c1")


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


def test_a_dead_readers_pin_does_not_keep_gc_away(s3_root):
    from tests.support.s3 import LEASE_SECONDS

    store = open_store(s3_root)
    publish_locked(store, "corpus", "c1", {"a.txt": b"a"})
    store.files.fs.pipe_file(f"{s3_root[5:]}/corpus/.locks/c1.lock.pins/a-killed-reader", b"{}")
    with store.try_lock("corpus", "c1") as taken:
        assert not taken  # it might be alive
    time.sleep(2 * float(LEASE_SECONDS) + 1.5)  # unrenewed for two lease times, by the server's clock
    with store.try_lock("corpus", "c1") as taken:
        assert taken
    assert store.files.files("corpus/.locks/c1.lock.pins") == {}
