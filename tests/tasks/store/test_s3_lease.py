"""The build lock on S3 (a lease): one holder at a time, taken over from a killed holder, readers' pins."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

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


# ---- a builder that lost its lease: its late writes change nothing another published -------------------------
_OTHER_RUN = textwrap.dedent(
    """
    import json, os, sys, traceback
    from tasks.registry import open_store
    from tests.tasks.store.builds import publish_locked
    for line in sys.stdin:  # one publish per line: [root, this machine's cache]
        try:
            root, os.environ["WIKI_PIPELINE_CACHE"] = json.loads(line)
            store = open_store(root)
            folder = publish_locked(store, "corpus", "v1", {"a.txt": b"the other run's"}).get("files_under", "")
            assert store.verify("corpus", "v1", full=True) == (True, "ok")
            print(json.dumps({
                rel: store.files.fs.cat_file(store.files._path(f"corpus/v1/{rel}")).hex()
                for rel in store.files.files("corpus/v1")
                if rel == "manifest.json" or not folder or rel.startswith(folder + "/")
            }), flush=True)
        except Exception:
            print(json.dumps({"error": traceback.format_exc()}), flush=True)
    """
)


@pytest.fixture(scope="module")
def other_run(s3_endpoint):
    """``other_run(root, cache)``: another run, in a process of its own (started once, its imports done), takes
    the lock of corpus/v1 under ``root`` and publishes it; returns what it published, {file: bytes}."""
    import select

    from tests.support.s3 import environ_with

    proc = subprocess.Popen(
        [sys.executable, "-c", _OTHER_RUN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=environ_with(s3_endpoint),
    )

    def publish(root: str, cache: str) -> dict[str, bytes]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps([root, cache]) + "\n")
        proc.stdin.flush()
        assert select.select([proc.stdout], [], [], 120)[0], "the other run did not answer within 120 s"
        answer = json.loads(proc.stdout.readline() or '{"error": "the other run exited"}')
        assert "error" not in answer, answer["error"]
        return {rel: bytes.fromhex(h) for rel, h in answer.items()}

    try:
        yield publish
    finally:
        proc.kill()
        proc.wait()


def _objects(store, key: str) -> dict[str, bytes]:
    """Every object under ``key``, with its bytes."""
    return {rel: store.files.fs.cat_file(store.files._path(f"{key}/{rel}")) for rel in store.files.files(key)}


@contextlib.contextmanager
def _one_request_held(store, operations: tuple[str, ...], which, other, published: dict[str, bytes]) -> Iterator[None]:
    """Hold this process's first request of ``operations`` whose URL ``which`` accepts, its event loop (every
    request of this process: its lease renewals too) frozen meanwhile, while ``other()`` (another process) takes
    the lock over and publishes corpus/v1 (its objects into ``published``); then send it as it was."""

    def hold(request, **_) -> None:
        if published or not which(request.url):
            return
        published.update(other())

    events = store.files.fs.s3.meta.events
    for op in operations:
        events.register_first(f"before-send.s3.{op}", hold, unique_id=f"held-{op}")
    try:
        yield
    finally:
        for op in operations:
            events.unregister(f"before-send.s3.{op}", unique_id=f"held-{op}")


@pytest.mark.parametrize("existing", [False, True], ids=["new version", "forced rebuild"])
@pytest.mark.parametrize("held", ["manifest", "data"])
def test_a_late_write_changes_nothing_another_run_published(s3_root, other_run, tmp_path, existing, held):
    store = open_store(s3_root)
    if existing:
        publish_locked(store, "corpus", "v1", {"a.txt": b"the first build"})
    other = lambda: other_run(s3_root, str(tmp_path / "other"))  # noqa: E731
    published: dict[str, bytes] = {}

    def which(url: str) -> bool:
        return "/corpus/v1/" in url and url.endswith("/manifest.json") == (held == "manifest")

    # a held data upload lands in its own folder, and the lock check before the next upload stops the run
    error = "was published by another run while this one was stopped" if held == "manifest" else "lost the build lock"
    held_put = _one_request_held(store, ("PutObject",), which, other, published)
    with held_put, pytest.raises(UserError, match=error):
        publish_locked(store, "corpus", "v1", {"a.txt": b"the late run's", "b.txt": b"more"})
    assert published and _objects(store, "corpus/v1") == published  # byte for byte; the late run's files gone
    assert (store.local_copy("corpus", "v1", full=True) / "a.txt").read_bytes() == b"the other run's"


def test_a_late_discard_deletes_nothing_another_run_published(s3_root, other_run, tmp_path):
    store = open_store(s3_root)
    publish_locked(store, "corpus", "v1", {"a.txt": b"the first build"})
    other = lambda: other_run(s3_root, str(tmp_path / "other"))  # noqa: E731
    published: dict[str, bytes] = {}
    deletes = ("DeleteObject", "DeleteObjects")
    held_delete = _one_request_held(store, deletes, lambda url: True, other, published)
    with held_delete, store.lock("corpus", "v1"):
        store.discard("corpus", "v1", "judged damaged")  # its deletion is held while another run publishes
    assert published and _objects(store, "corpus/v1") == published


_TRAINER = textwrap.dedent(
    """
    import sys, time
    from dataclasses import replace
    from tasks.core.settings import RunOptions
    from tests.tasks.store.builds import SOURCE, Word

    def train(ctx, settings):
        ckpt = ctx.work / "train.ckpt"
        for step in range(100000):
            ckpt.write_text(f"step {step}")
            ctx.save(ckpt)
            ctx.progress(step, 100000)
            print(f"step {step}", flush=True)
            time.sleep(0.05)

    replace(SOURCE, build=train).reuse_or_build(Word(), RunOptions(artifacts_dir=sys.argv[1]), {})
    """
)


def test_a_builder_whose_lease_was_taken_stops_and_writes_nothing_more(s3_root, s3_endpoint, tmp_path):
    from tests.support.s3 import LEASE_SECONDS, environ_with
    from tests.tasks.store.builds import SOURCE, Word

    version = SOURCE.version(Word().resolved(), {})
    env = environ_with(s3_endpoint, WIKI_PIPELINE_CACHE=str(tmp_path / "trainer"))
    trainer = subprocess.Popen(
        [sys.executable, "-c", _TRAINER, s3_root],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert trainer.stdout is not None
        while trainer.stdout.readline().strip() != "step 3":
            assert trainer.poll() is None
        os.kill(trainer.pid, signal.SIGSTOP)  # between two steps: no request of its own in flight
        store = open_store(s3_root)
        with store.lock("corpus", version):  # a lease time unrenewed: taken over
            staged = _objects(store, f"corpus/.staging/{version}")
            assert staged == {"work/train.ckpt": b"step 3"}
            errors: queue.Queue[str] = queue.Queue()
            threading.Thread(target=lambda: [errors.put(line) for line in trainer.stderr], daemon=True).start()
            os.kill(trainer.pid, signal.SIGCONT)
            t0 = time.monotonic()
            try:
                while "lost the build lock" not in errors.get(timeout=max(0.1, t0 + 60 - time.monotonic())):
                    pass
            except queue.Empty:
                pytest.fail("the builder whose lease was taken still runs a minute later")
            assert time.monotonic() - t0 < float(LEASE_SECONDS)  # it stopped, with the error naming why
            assert trainer.wait(60) != 0
            assert _objects(store, f"corpus/.staging/{version}") == staged  # nothing written after the loss
    finally:
        trainer.kill()
        trainer.wait()


def test_a_live_holder_with_a_longer_lease_does_not_look_dead_to_a_waiter_with_a_shorter_one(s3_root, monkeypatch):
    """The holder's lease is 6 s (renewed every 2 s), the waiter's 1 s: the waiter judges the lease by the longer of
    the two, so the gaps between the holder's renewals (longer than the waiter's own lease) never look like death;
    it gets the lock when the holder lets go."""
    from tasks.store.s3_lease import ENV_LEASE

    monkeypatch.setenv(ENV_LEASE, "6")
    holder = open_store(s3_root)
    monkeypatch.setenv(ENV_LEASE, "1")
    waiter = open_store(s3_root)
    waiting, entered, done = threading.Event(), threading.Event(), threading.Event()

    def wait_for_it() -> None:
        with waiter.lock("model", "m1", on_wait=waiting.set):
            entered.set()
        done.set()

    with holder.lock("model", "m1"):
        thread = threading.Thread(target=wait_for_it, daemon=True)
        thread.start()
        assert waiting.wait(60)
        assert not entered.wait(5)  # more than two of the holder's renewal gaps, five of the waiter's lease times
        holder.files.check_held(holder._lock_key("model", "m1"))  # renewed all along: not taken over
    thread.join(60)
    assert entered.is_set() and done.is_set()
