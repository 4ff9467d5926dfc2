"""A file declared joined from other files of its build (``Build.joined``) is made on S3 from their objects, not
sent again: the object holds exactly the local file's bytes, a claim whose sizes do not add up is refused before
anything is sent, a false one is never composed, and files too short to copy are uploaded as they are."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tasks.registry import open_store
from tasks.store import MANIFEST
from tasks.store.s3 import ObjectFiles
from tasks.store.s3_compose import plan_parts

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    "sizes",
    [
        [("a", 12), ("b", 1), ("c", 2)],
        [("a", 1), ("b", 12), ("c", 0), ("d", 3)],
        [("a", 4), ("b", 4), ("c", 4), ("d", 4)],
        [("a", 30)],
        [("a", 2)],
    ],
)
def test_the_plan_covers_every_byte_once_in_order_with_every_part_but_the_last_long_enough(sizes):
    parts = plan_parts(sizes, min_part=5, max_copy=11)
    ranges = []
    for i, part in enumerate(parts):
        pieces = [part[1:]] if part[0] == "copy" else part[1]
        length = sum(end - start for _, start, end in pieces)
        assert i == len(parts) - 1 or length >= 5, parts
        if part[0] == "copy":
            assert 5 <= length <= 11
        ranges += pieces
    covered = [(name, pos) for name, start, end in ranges for pos in range(start, end)]
    assert covered == [(name, pos) for name, size in sizes for pos in range(size)]


def _publish(store, files: dict[str, bytes], joined: dict[str, list[str]]) -> dict:
    with store.lock("corpus", "v1"):
        build = store.open_build("corpus", "v1")
        for rel, data in files.items():
            (build.out / rel).write_bytes(data)
        for target, parts in joined.items():
            build.joined(target, parts)
        return build.publish(settings={"a": 1}, inputs={}, code_version="1")


def test_a_joined_file_is_made_from_its_parts_objects_not_uploaded_again(s3_root, monkeypatch):
    rng = random.Random(7)
    parts = {
        "big.txt": rng.randbytes(6 * MIB),
        "small.txt": b"tiny\n" * 100,
        "long.txt": rng.randbytes(12 * MIB + 5),  # cut: its start sent with small.txt, the rest copied by range
    }
    whole = b"".join(parts.values())
    sent: list[str] = []
    upload = ObjectFiles.upload
    monkeypatch.setattr(
        ObjectFiles, "upload", lambda self, local, key: (sent.append(local.name), upload(self, local, key))
    )
    store = open_store(s3_root)
    manifest = _publish(store, {**parts, "all.txt": whole}, {"all.txt": list(parts)})
    assert manifest["joined"] == {"all.txt": ["big.txt", "small.txt", "long.txt"]}
    assert sorted(sent) == sorted(parts)  # all.txt was never sent
    folder = f"{s3_root[5:]}/corpus/v1/{manifest['files_under']}"
    assert store.files.fs.cat_file(f"{folder}/all.txt") == whole
    assert store.verify("corpus", "v1", full=True) == (True, "ok")


def test_a_joined_file_whose_parts_are_too_short_to_copy_is_uploaded_as_it_is(s3_root):
    store = open_store(s3_root)
    manifest = _publish(
        store, {"a.txt": b"alpha\n", "b.txt": b"beta\n", "ab.txt": b"alpha\nbeta\n"}, {"ab.txt": ["a.txt", "b.txt"]}
    )
    assert store.files.fs.cat_file(f"{s3_root[5:]}/corpus/v1/{manifest['files_under']}/ab.txt") == b"alpha\nbeta\n"
    assert store.verify("corpus", "v1", full=True) == (True, "ok")


def test_a_joined_claim_whose_sizes_do_not_add_up_is_refused_before_anything_is_sent(s3_root):
    store = open_store(s3_root)
    big = b"x" * (6 * MIB)
    with pytest.raises(RuntimeError, match="is declared to be"):
        _publish(store, {"a.txt": big, "b.txt": b"b", "ab.txt": big + b"bc"}, {"ab.txt": ["a.txt", "b.txt"]})
    assert not [k for k in store.files.files("corpus/v1") if k != MANIFEST]
    assert store.versions() == []


def test_a_false_joined_claim_of_the_right_size_is_never_composed_the_file_is_uploaded(s3_root, caplog):
    """The claim is not hashed on its own: every copied range is checked against the joined file's bytes there,
    so a claim that is false where a range is copied makes the file be uploaded as it is."""
    store = open_store(s3_root)
    big = random.Random(10).randbytes(6 * MIB)
    false = b"X" + big[1:] + b"b"  # a.txt then b.txt, but for its first byte
    manifest = _publish(store, {"a.txt": big, "b.txt": b"b", "ab.txt": false}, {"ab.txt": ["a.txt", "b.txt"]})
    assert store.files.fs.cat_file(f"{s3_root[5:]}/corpus/v1/{manifest['files_under']}/ab.txt") == false
    assert store.verify("corpus", "v1", full=True) == (True, "ok")
    assert "not made from its parts' objects" in caplog.text
    assert store.files._call("list_multipart_uploads").get("Uploads", []) == []


def test_a_part_named_twice_is_composed_from_the_joined_file_s_bytes(s3_root):
    store = open_store(s3_root)
    a = random.Random(11).randbytes(5 * MIB + 3)
    manifest = _publish(store, {"a.txt": a, "aa.txt": a + a}, {"aa.txt": ["a.txt", "a.txt"]})
    assert store.files.fs.cat_file(f"{s3_root[5:]}/corpus/v1/{manifest['files_under']}/aa.txt") == a + a
    assert store.verify("corpus", "v1", full=True) == (True, "ok")


def test_a_joined_claim_naming_no_file_of_the_build_is_a_bug(s3_root):
    store = open_store(s3_root)
    with pytest.raises(RuntimeError, match="not files of out/"):
        _publish(store, {"a.txt": b"a"}, {"ab.txt": ["a.txt"]})


def test_a_part_object_changed_after_its_upload_is_never_composed_into_the_joined_file(s3_root, monkeypatch):
    """Another writer replaces a part's object (same size, other bytes) between its upload and the compose: the
    copied part's ETag is not the local range's MD5, so the joined file is uploaded as it is -- its object is the
    local file, the one the manifest's sha256 names -- and no multipart upload is left behind."""
    rng = random.Random(8)
    parts = {"big.txt": rng.randbytes(6 * MIB), "small.txt": b"tiny\n" * 100}
    whole = b"".join(parts.values())
    sent: list[str] = []
    upload = ObjectFiles.upload

    def upload_then_overwrite(self, local, key):
        sent.append(local.name)
        upload(self, local, key)
        if local.name == "big.txt":
            self.put_object(key, b"X" * (6 * MIB))

    monkeypatch.setattr(ObjectFiles, "upload", upload_then_overwrite)
    store = open_store(s3_root)
    manifest = _publish(store, {**parts, "all.txt": whole}, {"all.txt": list(parts)})
    assert "all.txt" in sent  # the fallback: sent as it is
    folder = f"{s3_root[5:]}/corpus/v1/{manifest['files_under']}"
    assert store.files.fs.cat_file(f"{folder}/all.txt") == whole
    assert store.files._call("list_multipart_uploads").get("Uploads", []) == []


_KILLED_MID_COMPOSE = textwrap.dedent(
    """
    import os, random, signal, sys
    from tasks.registry import open_store
    from tasks.store.s3 import ObjectFiles
    from tests.tasks.store.test_s3_compose import MIB, _publish

    call = ObjectFiles._call
    def call_then_die(self, method, **kwargs):
        answer = call(self, method, **kwargs)
        if method == "upload_part_copy":
            os.kill(os.getpid(), signal.SIGKILL)
        return answer
    ObjectFiles._call = call_then_die
    parts = {"a.txt": random.Random(9).randbytes(6 * MIB), "b.txt": b"b" * 100}
    _publish(open_store(sys.argv[1]), {**parts, "ab.txt": b"".join(parts.values())}, {"ab.txt": list(parts)})
    """
)


def test_the_next_build_aborts_the_multipart_upload_a_killed_builder_left(s3_root, monkeypatch):
    """A builder SIGKILLed in the middle of a compose leaves its multipart upload unfinished (no object listing
    shows it, S3 keeps its parts); the next builder of that version, holding its lock, aborts it and publishes."""
    monkeypatch.setenv("WIKI_PIPELINE_LEASE_SECONDS", "1")  # the killed builder's lock goes dead soon
    child = subprocess.run([sys.executable, "-c", _KILLED_MID_COMPOSE, s3_root], cwd=REPO, check=False)
    assert child.returncode == -signal.SIGKILL
    store = open_store(s3_root)
    assert len(store.files._call("list_multipart_uploads").get("Uploads", [])) == 1
    parts = {"a.txt": random.Random(9).randbytes(6 * MIB), "b.txt": b"b" * 100}
    whole = b"".join(parts.values())
    manifest = _publish(store, {**parts, "ab.txt": whole}, {"ab.txt": list(parts)})
    assert store.files._call("list_multipart_uploads").get("Uploads", []) == []
    assert store.files.fs.cat_file(f"{s3_root[5:]}/corpus/v1/{manifest['files_under']}/ab.txt") == whole
