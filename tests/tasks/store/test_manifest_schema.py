"""The manifest schema: a manifest with a field missing or of another type is damage, seen before any reader uses
it (reuse rebuilds the version, listings show it as damaged, gc collects it), on a directory and on S3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.core.settings import RunOptions
from tasks.registry import open_store
from tasks.store import MANIFEST
from tests.tasks.store.builds import SOURCE, Word, publish_local, publish_locked


def _no_build_id(m: dict) -> None:
    del m["build_id"]


def _set(path: str, value):
    """Set the field at ``path`` (``files/a.txt/size``)."""

    def change(m: dict) -> None:
        *parents, last = path.split("/")
        for p in parents:
            m = m[p]
        m[last] = value

    return change


def _rename_file(new: str):
    def change(m: dict) -> None:
        m["files"][new] = m["files"].pop("a.txt")

    return change


DAMAGE = [
    (_no_build_id, "it has no build_id"),
    (_set("inputs", {"shards": "abc"}), "inputs.shards is of type str, not an object"),
    (_set("inputs", {"shards": {"version": "../x", "build_id": "b"}}), "inputs.shards.version is '../x'"),
    (_set("created_at", "| x |\n| injected |"), "created_at is '| x |\\n| injected |', not a time written"),
    (_set("created_at", "2026-11-25 10:00:00"), "not a time written %Y-%m-%dT%H:%M:%SZ"),
    (_set("files/a.txt/size", -1), "files.'a.txt'.size is -1, not a whole number of bytes"),
    (_set("files/a.txt/size", "6"), "files.'a.txt'.size is '6'"),
    (_set("files/a.txt/size", True), "files.'a.txt'.size is True"),
    (_set("files/a.txt/sha256", "abc"), "files.'a.txt'.sha256 is 'abc', not 64 hex digits"),
    (_rename_file("../a.txt"), "files lists '../a.txt', which is not a relative file name inside the version"),
    (_rename_file("/etc/passwd"), "files lists '/etc/passwd'"),
    (_rename_file("a\x00.txt"), "files lists 'a\\x00.txt'"),
    (_set("metrics", [1]), "metrics is of type list, not dict"),
    (_set("settings", None), "settings is of type null, not dict"),
    (_set("code_version", 1), "code_version is of type int, not str"),
    (_set("format", True), "format is of type bool"),
    (_set("version", "v2"), "it names 'corpus'/'v2'"),
]


@pytest.mark.parametrize("damage, why", DAMAGE, ids=[w for _, w in DAMAGE])
def test_a_manifest_the_schema_refuses_is_damage_to_every_reader(tmp_path, damage, why):
    store = open_store(tmp_path)
    publish_local(store, "v1", {"a.txt": b"alpha\n"})
    path = tmp_path / "corpus" / "v1" / MANIFEST
    manifest = json.loads(path.read_text())
    damage(manifest)
    path.write_text(json.dumps(manifest))
    ok, reason = store.verify("corpus", "v1")
    assert not ok and f"{MANIFEST} in {tmp_path / 'corpus' / 'v1'} is damaged: " in reason and why in reason, reason
    assert store.read_manifest("corpus", "v1") is None and store.versions() == []
    (listed,) = store.versions(damaged=True)
    assert (listed.version, listed.manifest, listed.damage) == ("v1", {}, reason)
    with pytest.raises(ValueError, match="corpus/v1 is damaged"):
        store.get("corpus", "v1")
    (item,) = [g for g in store.garbage() if g.published]  # gc collects it, no --stale needed
    assert item.reason.startswith(f"damaged: {reason}") and store.collect(item)
    assert not (tmp_path / "corpus" / "v1").exists()


def test_what_a_build_writes_passes_the_schema(tmp_path):
    store = open_store(tmp_path)
    manifest = publish_local(store)
    assert store.checked_manifest("corpus", "v1") == (manifest, None)


@pytest.mark.parametrize("damage", [_no_build_id, _set("inputs", {"corpus": "v1"}), _set("files", [])])
def test_a_damaged_manifest_is_rebuilt_not_reused(tmp_path, damage):
    run = RunOptions(artifacts_dir=str(tmp_path))
    first = SOURCE.reuse_or_build(Word(), run, {})
    path = Path(first["path"]) / MANIFEST
    manifest = json.loads(path.read_text())
    damage(manifest)
    path.write_text(json.dumps(manifest))
    again = SOURCE.reuse_or_build(Word(), run, {})  # was: reused, then KeyError: 'build_id'
    assert again["version"] == first["version"] and again["build_id"] != first["build_id"]
    assert open_store(tmp_path).verify("corpus", first["version"], full=True) == (True, "ok")
    assert SOURCE.reuse_or_build(Word(), run, {})["build_id"] == again["build_id"]  # reused from now on


def test_a_damaged_manifest_on_s3_is_refused_by_the_copy_and_listed_as_damaged(s3_root):
    store = open_store(s3_root)
    publish_locked(store, "corpus", "c1", {"a.txt": b"a"})
    key = f"{s3_root[5:]}/corpus/c1/{MANIFEST}"
    manifest = json.loads(store.files.fs.cat_file(key))
    manifest["inputs"] = {"shards": "x"}
    store.files.fs.pipe_file(key, json.dumps(manifest).encode())
    assert "is damaged: inputs.shards is of type str" in store.verify("corpus", "c1")[1]
    with pytest.raises(ValueError, match=r"manifest.json is damaged \(inputs.shards is of type str"):
        store.local_copy("corpus", "c1")
    assert [v.damage != "" for v in store.versions(damaged=True)] == [True] and store.versions() == []


def test_the_run_summarys_comparisons_skip_a_damaged_manifest(tmp_path):
    """An evaluate version whose inputs.model is a string (was: AttributeError in the comparison the run summary
    posts) is left out of the model comparison's joined columns; a sound one is in."""
    from flows.reports import joined_columns

    store = open_store(tmp_path)
    for version, model in (("e1", {"version": "m1", "build_id": "b1"}), ("e2", "m1")):
        with store.lock("evaluate", version):
            build = store.open_build("evaluate", version)
            (build.out / "metrics.json").write_text("{}")
            manifest = build.publish(
                settings={},
                inputs={"model": {"version": "m1", "build_id": "b1"}},
                code_version="1",
                metrics={"test_bpb": 1.5},
            )
        path = tmp_path / "evaluate" / version / MANIFEST
        path.write_text(json.dumps({**manifest, "inputs": {"model": model}}))
    joined = joined_columns(store, "model")
    assert joined and all(by == {"m1": {"test_bpb": 1.5}} for _, by in joined)
