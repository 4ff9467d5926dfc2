"""gc: what no run needs is listed and deleted, what a running build reads is kept (a directory and S3)."""

from __future__ import annotations

import json
from pathlib import Path

from flows.cli import main
from tasks.core.settings import RunOptions
from tasks.core.stage import Stage
from tasks.registry import code_versions, open_store
from tasks.store import Garbage
from tests.tasks.store.builds import SOURCE, Word, publish_locked


def test_gc_keeps_the_inputs_a_running_build_reads_and_deletes_lock_files(tmp_path, capsys):
    """`gc --stale --yes` during a build keeps the build's input, and deletes lock files of nothing."""
    run = RunOptions(artifacts_dir=str(tmp_path))
    corpus = SOURCE.reuse_or_build(Word(), run, {})
    store = open_store(tmp_path)
    # the corpus turns stale (built by an older code version), as an input rebuilt or replaced would
    manifest_path = Path(corpus["path"]) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["code_version"] = "0"
    manifest_path.write_text(json.dumps(manifest))
    assert (("corpus", corpus["version"])) in store.stale_versions(code_versions())
    seen = {}

    def reader(ctx, settings: Word, corpus: Path) -> dict:
        assert main(["gc", "--artifacts-dir", str(tmp_path), "--stale", "--yes"]) == 0
        seen["gc"] = capsys.readouterr().out
        (ctx.out / "b.txt").write_text((corpus / "a.txt").read_text().upper())  # the input is still there
        return {}

    upper = Stage("tokenizer", Word, code_versions()["tokenizer"], reader, lambda m: "")
    built = upper.reuse_or_build(Word(), run, {"corpus": corpus})
    assert f"corpus/{corpus['version']}  kept: a running build is writing or reading it" in seen["gc"]
    assert (tmp_path / "tokenizer" / built["version"] / "b.txt").read_text() == "HELLO X"

    # an orphan lock file (a version neither published nor being built) and the stale corpus: both collected now
    (tmp_path / "corpus" / ".locks" / "gone.lock").write_text("")
    assert main(["gc", "--artifacts-dir", str(tmp_path), "--stale", "--yes"]) == 0
    out = capsys.readouterr().out
    assert "corpus/.locks/gone.lock  the lock file of corpus/gone, which is neither published nor being built" in out
    assert not (tmp_path / "corpus" / corpus["version"]).exists()
    assert sorted(p.name for p in (tmp_path / "corpus" / ".locks").iterdir()) == []


def test_gc_on_s3_lists_and_deletes_what_no_run_needs_and_keeps_what_one_reads(s3_root, capsys):
    from flows.cli import main

    store = open_store(s3_root)
    publish_locked(store, "corpus", "c1", {"a.txt": b"a"})
    store.local_copy("corpus", "c1")
    with store.lock("shards", "s1"):  # an unfinished build whose resume state is in the bucket
        build = store.open_build("shards", "s1")
        (build.work / "progress.json").write_text("{}")
        build.save(build.work / "progress.json")
    found = {(g.key, g.local) for g in store.garbage()}
    assert ("shards/.staging/s1", False) in found  # the bucket's
    assert ("shards/.staging/s1", True) in found and ("corpus/c1", True) in found  # this machine's cache
    cli = ["gc", "--artifacts-dir", s3_root]
    with store.pin("corpus", "c1"):
        assert main(cli) == 0
        dry = capsys.readouterr()
        assert "would delete" in dry.out and "shards/.staging/s1" in dry.out and "(cache) corpus/c1" in dry.out
        assert s3_root in dry.out and "wikitestsecret" not in dry.out + dry.err
        assert main([*cli, "--yes"]) == 0
        done = capsys.readouterr().out
        assert "in use" in done and "(cache) corpus/c1" in done
    assert store.files.files("shards/.staging") == {} and not store.staging_path("shards", "s1").exists()
    assert store.verify("corpus", "c1", full=True) == (True, "ok")  # published versions stay
    assert store.version_path("corpus", "c1").is_dir()  # a build here was reading it: kept
    assert [g.key for g in store.garbage()] == ["corpus/c1"]


def _stale_corpus(store, s3: bool = False) -> str:
    """A published corpus version built by an older code version: stale, so ``gc --stale`` lists it."""
    manifest = publish_locked(store, "corpus", "c1", {"a.txt": b"a"})
    key = "corpus/c1/manifest.json"
    manifest["code_version"] = "0"
    if s3:
        store.files.fs.pipe_file(f"{store.root[5:]}/{key}", json.dumps(manifest).encode())
    else:
        (store.files.root / key).write_text(json.dumps(manifest))
    return manifest["build_id"]


def test_a_version_pinned_after_the_listing_is_not_collected(tmp_path, s3_root):
    """gc lists a stale version nobody reads; a build then pins it as its input before gc deletes: the lock taken
    at deletion, not the listing's verdict, decides (a directory root and an S3 root)."""
    for store, s3 in ((open_store(tmp_path / "art"), False), (open_store(s3_root), True)):
        build_id = _stale_corpus(store, s3)
        (item,) = [g for g in store.garbage(code_versions()) if g.published]
        assert (item.key, item.in_use) == ("corpus/c1", False)
        with store.pin("corpus", "c1"):
            assert store.collect(item) is False
        assert store.verify("corpus", "c1", full=True) == (True, "ok")
        with store.lock("corpus", "c1"):  # a builder's lock, taken after the listing, keeps it too
            assert store.collect(item) is False
        assert store.get("corpus", "c1").manifest["build_id"] == build_id
        assert store.collect(item) is True and store.versions() == []  # nobody holds it now


def test_gc_items_locked_after_the_listing_are_kept(tmp_path):
    """The siblings: an unfinished build's staging and a lock file of nothing, listed free, then locked by a run
    that starts building that version before gc deletes them."""
    store = open_store(tmp_path)
    staging = store.staging_path("model", "m1") / "work"
    staging.mkdir(parents=True)
    (staging / "train.ckpt").write_bytes(b"resume")
    (tmp_path / "shards" / ".locks").mkdir(parents=True)
    (tmp_path / "shards" / ".locks" / "s1.lock").write_text("")
    items = {g.key: g for g in store.garbage()}
    assert not items["model/.staging/m1"].in_use and not items["shards/.locks/s1.lock"].in_use
    with store.lock("model", "m1"), store.lock("shards", "s1"):
        assert not store.collect(items["model/.staging/m1"]) and not store.collect(items["shards/.locks/s1.lock"])
        assert (staging / "train.ckpt").read_bytes() == b"resume"
        assert (tmp_path / "shards" / ".locks" / "s1.lock").exists()


def test_a_damaged_version_rebuilt_after_the_listing_is_not_collected(tmp_path):
    """gc lists a damaged version; a run rebuilds it (and lets go of its lock) before gc deletes: the new, sound
    version stays. Likewise a stale version replaced by another build since."""
    run = RunOptions(artifacts_dir=str(tmp_path))
    first = SOURCE.reuse_or_build(Word(), run, {})
    path = Path(first["path"]) / "manifest.json"
    path.write_text(path.read_text().replace('"build_id"', '"build_idx"'))
    store = open_store(tmp_path)
    (item,) = [g for g in store.garbage() if g.published]
    assert item.reason.startswith("damaged: ") and "it has no build_id" in item.reason
    again = SOURCE.reuse_or_build(Word(), run, {})  # discards the damaged one, publishes a sound one
    assert store.collect(item) is False
    assert store.verify("corpus", again["version"], full=True) == (True, "ok")

    stale = Garbage(item.key, item.where, "corpus", again["version"], 0, "stale", published=True, build_id="other")
    assert (
        store.collect(stale) is False
        and store.get("corpus", again["version"]).manifest["build_id"] == again["build_id"]
    )
