"""Version ids, the check of a published version, the listing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tasks.core.settings import RunOptions
from tasks.registry import open_store
from tasks.store import MANIFEST, version_id
from tests.tasks.store.builds import SOURCE, Word, publish_local, write_word


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


@pytest.mark.parametrize(
    "damage, full, expected",
    [
        (lambda d: (d / "a.txt").unlink(), False, "'a.txt' is missing"),
        (lambda d: (d / "a.txt").write_bytes(b"alp"), False, "'a.txt' is 3 bytes, manifest says 6"),
        (lambda d: (d / "a.txt").write_bytes(b"alphA\n"), False, "ok"),  # same size: only the full check sees it
        (lambda d: (d / "a.txt").write_bytes(b"alphA\n"), True, "'a.txt' does not match its sha256"),
        (lambda d: (d / MANIFEST).unlink(), False, "manifest.json in "),
        (lambda d: (d / MANIFEST).write_text("{not json"), False, "manifest.json in "),
        (lambda d: (d / "extra.txt").write_text("x"), False, "unexpected file(s) not in the manifest: 'extra.txt'"),
    ],
)
def test_verify_detects_damage(tmp_path, damage, full, expected):
    store = open_store(tmp_path)
    publish_local(store)
    damage(tmp_path / "corpus" / "v1")
    ok, reason = store.verify("corpus", "v1", full=full)
    assert reason.startswith(expected), reason
    assert ok == (expected == "ok")


def test_listing_shows_lineage(tmp_path):
    from flows.store_commands import format_listing
    from tasks.registry import open_store

    store = open_store(tmp_path)
    corpus = publish_local(store)
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


@pytest.mark.parametrize("full_check", [False, True])
def test_reuse_checks_every_sha256_under_full_check(tmp_path, full_check):
    """A file changed in place at the same size passes the quick check (sizes) but not ``full_check``."""
    builds = []

    def build(ctx, settings: Word) -> dict:
        builds.append(1)
        return write_word(ctx, settings)

    run = RunOptions(artifacts_dir=str(tmp_path), full_check=full_check)
    first = replace(SOURCE, build=build).reuse_or_build(Word(), run, {})
    (Path(first["path"]) / "a.txt").write_text("HELLO x")  # same size, other bytes
    again = replace(SOURCE, build=build).reuse_or_build(Word(), run, {})
    if full_check:
        assert len(builds) == 2 and again["build_id"] != first["build_id"]
        assert (Path(again["path"]) / "a.txt").read_text() == "hello x"
    else:
        assert len(builds) == 1 and again["build_id"] == first["build_id"]


def test_a_directory_versions_files_lie_in_the_version_itself(tmp_path):
    store = open_store(tmp_path)
    manifest = publish_local(store)
    assert "files_under" not in manifest  # the layout of a directory root is unchanged
    assert store.file_location("corpus", "v1", "sub/b.bin") == str(tmp_path / "corpus" / "v1" / "sub" / "b.bin")


def test_a_manifest_naming_a_folder_outside_its_version_is_damage(s3_root):
    import json

    from tests.tasks.store.builds import publish_locked

    store = open_store(s3_root)
    publish_locked(store, "corpus", "v1", {"a.txt": b"a"})
    key = f"{s3_root[5:]}/corpus/v1/{MANIFEST}"
    manifest = json.loads(store.files.fs.cat_file(key))
    for folder in ("..", "a/b", MANIFEST, ""):
        store.files.fs.pipe_file(key, json.dumps({**manifest, "files_under": folder}).encode())
        assert store.verify("corpus", "v1")[1].endswith("names a folder that is not one of the version's")


def test_fetch_bytes_hands_out_checked_bytes_and_refuses_a_file_changed_since(tmp_path):
    from mygpt.errors import UserError

    store = open_store(tmp_path / "art")
    version = "a1b2c3d4e5f6"
    publish_local(store, version, {"x.bin": b"0123456789", "y.bin": b"abc"})
    (store.version_path("corpus", version) / "y.bin").write_bytes(b"abd")  # same size, other bytes
    with pytest.raises(UserError, match=r"its manifest does not list 'z\.bin'"):
        store.fetch_bytes("corpus", version, "z.bin", tmp_path / "in")
    assert store.fetch_bytes("corpus", version, "x.bin", tmp_path / "in") == b"0123456789"
    with pytest.raises(UserError, match=r"y\.bin does not match the manifest of corpus/a1b2c3d4e5f6 \(its sha256"):
        store.fetch_bytes("corpus", version, "y.bin", tmp_path / "in")
