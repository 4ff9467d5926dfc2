"""gc: what no run needs is listed and deleted, what a running build reads is kept (a directory and S3)."""

from __future__ import annotations

import json
from pathlib import Path

from flows.cli import main
from tasks.core.settings import RunOptions
from tasks.core.stage import Stage
from tasks.registry import code_versions, open_store
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
    upper.reuse_or_build(Word(), run, {"corpus": corpus})
    assert f"corpus/{corpus['version']}  kept: a running build is writing or reading it" in seen["gc"]
    assert (tmp_path / "tokenizer" / upper.version(Word(), {"corpus": corpus}) / "b.txt").read_text() == "HELLO X"

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
