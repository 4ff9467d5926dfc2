"""`wiki-pipeline gc` and the stale marks of `wiki-pipeline artifacts`: a dry run lists what no
run needs -- what, how big, why --, `--yes` deletes it, and a build whose lock a running process holds is never
touched."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from flows.cli import main
from tasks import samples
from tasks.core.report import human_bytes
from tasks.registry import open_store

HOLD_LOCK = textwrap.dedent("""
    import fcntl, sys, time
    fh = open(sys.argv[1], "a+")
    fcntl.flock(fh, fcntl.LOCK_EX)
    print("locked", flush=True)
    time.sleep(120)
""")


def _cli(capsys, *argv) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


@pytest.fixture
def root(tmp_path):
    """corpus/v1 (published, current), tokenizer/t1 built from a corpus build that was since replaced (stale),
    samples/s1 built by an older code version (stale); staging: leftover of corpus/v1, an unfinished model
    build, an abandoned download, a build a live process is working on; and an interrupted deletion."""
    from tasks.registry import code_versions

    store = open_store(tmp_path / "art")
    codes = code_versions()

    def publish(stage, version, files, inputs=None, code=None):
        build = store.open_build(stage, version)
        for name, size in files.items():
            (build.out / name).write_bytes(b"x" * size)
        return build.publish(settings={}, inputs=inputs or {}, code_version=code or codes[stage])

    corpus = publish("corpus", "v1", {"wiki.train.txt": 1000})
    publish("tokenizer", "t1", {"tokenizer.json": 10}, inputs={"corpus": {"version": "v1", "build_id": "rebuilt"}})
    publish("samples", "s1", {"samples.md": 10}, code="0")

    def staged(stage, version, files):
        work = store.staging_path(stage, version) / "work"
        work.mkdir(parents=True)
        for name, size in files.items():
            (work / name).write_bytes(b"y" * size)

    staged("corpus", "v1", {"source.zip": 300})
    staged("model", "m1", {"train.ckpt": 200_000, "tokens-train.bin": 100_000})
    staged("corpus", "old", {"source.zip.part": 150_000})
    staged("model", "m2", {"train.ckpt": 5000})
    (tmp_path / "art" / "corpus" / ".trash" / "v0.1234abcd").mkdir(parents=True)
    (tmp_path / "art" / "corpus" / ".trash" / "v0.1234abcd" / "wiki.train.txt").write_bytes(b"z" * 700)

    (tmp_path / "art" / "model" / ".locks").mkdir(exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path / "art" / "model" / ".locks" / "m2.lock")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    yield tmp_path / "art", corpus
    holder.kill()
    holder.wait()


def _paths(root) -> set[str]:
    return (
        {str(p.relative_to(root)) for p in root.glob("*/.staging/*")}
        | {str(p.relative_to(root)) for p in root.glob("*/.trash/*")}
        | {str(p.relative_to(root)) for p in root.glob("*/*") if not p.name.startswith(".")}
    )


def test_gc_lists_deletes_and_spares_a_locked_build(root, capsys):
    art, corpus = root
    before = _paths(art)
    listing = _cli(capsys, "gc", "--artifacts-dir", str(art))
    assert _paths(art) == before, "a dry run deletes nothing"
    lines = {line.split()[2]: line for line in listing.splitlines()[1:-2]}  # "  292.9 KB  <where>  <why>"
    assert "unfinished build of model/m1, last written" in lines["model/.staging/m1"]
    assert lines["model/.staging/m1"].split()[:2] == ["293.0", "KB"]  # 300,000 bytes
    assert "unfinished build of corpus/old" in lines["corpus/.staging/old"]
    assert "leftover staging of the published corpus/v1" in lines["corpus/.staging/v1"]
    assert "a discarded version whose deletion was interrupted" in lines["corpus/.trash/v0.1234abcd"]
    assert "kept: a running build is writing or reading it" in lines["model/.staging/m2"]
    total = human_bytes(300_000 + 150_000 + 300 + 700)
    assert listing.splitlines()[-2] == f"would free {total} in 4 item(s); 1 in use, kept"
    assert "tokenizer/t1" not in listing, "published versions only with --stale"

    listing = _cli(capsys, "artifacts", "--artifacts-dir", str(art))
    rows = {
        line.split()[0]: line
        for line in listing.splitlines()[2:]
        if line and line.split()[0] in ("corpus", "tokenizer", "samples")
    }
    assert "stale" not in rows["corpus"]
    assert "[stale: its input corpus/v1 was rebuilt since, so no run reuses it]" in rows["tokenizer"]
    code = samples.STAGE.code_version
    assert f"[stale: built by samples code version 0; the code is at version {code}" in rows["samples"]
    assert "2 stale version(s)" in listing and "5 unfinished build or leftover dir(s)" in listing

    done = _cli(capsys, "gc", "--artifacts-dir", str(art), "--yes")
    assert done.splitlines()[-2] == f"freed {total} in 4 item(s); 1 in use, kept"
    assert _paths(art) == {"model/.staging/m2", "corpus/v1", "tokenizer/t1", "samples/s1"}
    assert (art / "model" / ".staging" / "m2" / "work" / "train.ckpt").stat().st_size == 5000

    done = _cli(capsys, "gc", "--artifacts-dir", str(art), "--stale", "--yes")
    assert "tokenizer/t1" in done and "samples/s1" in done
    assert _paths(art) == {"model/.staging/m2", "corpus/v1"}
    assert open_store(art).verify("corpus", "v1", full=True) == (True, "ok")
    assert open_store(art).get("corpus", "v1").manifest["build_id"] == corpus["build_id"]


def test_gc_on_a_clean_root(tmp_path, capsys):
    assert _cli(capsys, "gc", "--artifacts-dir", str(tmp_path)) == f"nothing to collect under {tmp_path}\n"


def test_gc_collects_downloads_no_build_took(tmp_path, capsys):
    """A whole download made to learn the corpus zip's sha256 that no build took (a run stopped between the two)
    is garbage once untouched for 10 minutes; a fresh one and a partial one (a rerun resumes it) are not."""
    import os
    import time

    art = tmp_path / "art"
    downloads = art / "corpus" / ".sources" / "downloads"
    downloads.mkdir(parents=True)
    names = ("a" * 32 + ".zip", "a" * 32 + ".zip.facts.json", "b" * 32 + ".zip", "c" * 32 + ".zip.part")
    names += ("my-own-copy.zip",)  # a name the stage never writes: not gc's to judge
    for name in names:
        (downloads / name).write_bytes(b"z" * 1000)
    (tmp_path / "elsewhere.zip").write_bytes(b"keep")
    (downloads / ("d" * 32 + ".zip")).symlink_to(tmp_path / "elsewhere.zip")
    hour_ago = time.time() - 3600
    for name in (names[0], names[1], names[3], names[4]):
        os.utime(downloads / name, (hour_ago, hour_ago))
    listing = _cli(capsys, "gc", "--artifacts-dir", str(art))
    assert listing.count("a download made to learn the source's sha256 that no build took") == 2, listing
    _cli(capsys, "gc", "--artifacts-dir", str(art), "--yes")
    assert sorted(p.name for p in downloads.iterdir()) == sorted([*names[2:], "d" * 32 + ".zip"]), "the rest stays"
    assert (tmp_path / "elsewhere.zip").read_bytes() == b"keep"


@pytest.mark.parametrize("command", ["artifacts", "gc", "pull"])
def test_a_root_that_does_not_exist_is_an_error_not_an_empty_listing(tmp_path, capsys, command):
    (tmp_path / "a-file").write_text("x")
    for root, what in ((tmp_path / "missing", "does not exist"), (tmp_path / "a-file", "is not a directory")):
        argv = [command, "--artifacts-dir", str(root)] + (
            ["corpus/abcdef012345", str(tmp_path / "o")] * (command == "pull")
        )
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert (
            err == f"error: the artifact root {root} {what}; give the directory a run published into "
            "(--artifacts-dir, or WIKI_PIPELINE_ARTIFACTS)\n"
        ), err
    assert not (tmp_path / "missing").exists()


def test_gc_says_how_many_stale_versions_it_keeps_and_how_to_collect_them(root, tmp_path, capsys):
    """`artifacts` counts 2 stale versions; `gc` without --stale says it keeps those 2 and how to delete them
    (was: "nothing to collect", or a total that never named them)."""
    art, _ = root
    kept = (
        "2 stale version(s) kept (no run reuses them; `wiki-pipeline artifacts` marks them): "
        "`wiki-pipeline gc --stale` lists them, `--stale --yes` deletes them"
    )
    assert _cli(capsys, "gc", "--artifacts-dir", str(art)).splitlines()[-1] == kept
    assert _cli(capsys, "gc", "--artifacts-dir", str(art), "--yes").splitlines()[-1] == kept
    assert kept not in _cli(capsys, "gc", "--artifacts-dir", str(art), "--stale")

    only_stale = tmp_path / "only-stale"
    build = open_store(only_stale).open_build("samples", "s1")
    (build.out / "samples.md").write_text("old")
    build.publish(settings={}, inputs={}, code_version="0")
    assert _cli(capsys, "gc", "--artifacts-dir", str(only_stale)) == (
        f"nothing to collect under {only_stale}; {kept.replace('2 stale', '1 stale')}\n"
    )


def test_artifacts_lists_a_damaged_manifest_as_damaged(root, capsys):
    """A manifest whose inputs.corpus is a string (was: a crash of `wiki-pipeline artifacts`) or whose created_at
    holds table markup: listed as damaged, with why, in the table and in --json; gc lists it for deletion."""
    import json

    art, _ = root
    path = art / "tokenizer" / "t1" / "manifest.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "inputs": {"corpus": "v1"}}))
    path = art / "samples" / "s1" / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "created_at": "| x |\n| injected |"}))
    listing = _cli(capsys, "artifacts", "--artifacts-dir", str(art))
    rows = {line.split()[0]: line for line in listing.splitlines()[2:] if line.startswith(("corpus ", "tok", "sam"))}
    assert "[damaged: manifest.json in " in rows["tokenizer"] and "inputs.corpus is of type str" in rows["tokenizer"]
    assert "created_at is '| x |\\n| injected |', not a time written" in rows["samples"]
    assert "injected |\n" not in listing and "damaged" not in rows["corpus"]
    assert "0 stale version(s) (no run reuses them); 2 damaged version(s); " in listing
    shown = {v["stage"]: v for v in json.loads(_cli(capsys, "artifacts", "--artifacts-dir", str(art), "--json"))}
    assert "inputs.corpus is of type str" in shown["tokenizer"]["damaged"] and shown["corpus"]["damaged"] is None
    gc = _cli(capsys, "gc", "--artifacts-dir", str(art), "--yes")
    assert "tokenizer/t1  damaged: " in gc and "samples/s1  damaged: " in gc
    assert [v.version for v in open_store(art).versions(damaged=True)] == ["v1"]
