"""`wiki-pipeline gc` and the stale marks of `wiki-pipeline artifacts`: a dry run lists what no
run needs -- what, how big, why --, `--yes` deletes it, and a build whose lock a running process holds is never
touched."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from flows.cli import main
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
    lines = {line.split()[2]: line for line in listing.splitlines()[1:-1]}  # "  292.9 KB  <where>  <why>"
    assert "unfinished build of model/m1, last written" in lines["model/.staging/m1"]
    assert lines["model/.staging/m1"].split()[:2] == ["293.0", "KB"]  # 300,000 bytes
    assert "unfinished build of corpus/old" in lines["corpus/.staging/old"]
    assert "leftover staging of the published corpus/v1" in lines["corpus/.staging/v1"]
    assert "a discarded version whose deletion was interrupted" in lines["corpus/.trash/v0.1234abcd"]
    assert "kept: a running build is writing or reading it" in lines["model/.staging/m2"]
    total = human_bytes(300_000 + 150_000 + 300 + 700)
    assert listing.splitlines()[-1] == f"would free {total} in 4 item(s); 1 in use, kept"
    assert "tokenizer/t1" not in listing, "published versions only with --stale"

    listing = _cli(capsys, "artifacts", "--artifacts-dir", str(art))
    rows = {
        line.split()[0]: line
        for line in listing.splitlines()[2:]
        if line and line.split()[0] in ("corpus", "tokenizer", "samples")
    }
    assert "stale" not in rows["corpus"]
    assert "[stale: its input corpus/v1 was rebuilt since, so no run reuses it]" in rows["tokenizer"]
    assert "[stale: built by samples code version 0; the code is at version 2" in rows["samples"]
    assert "2 stale version(s)" in listing and "5 unfinished build or leftover dir(s)" in listing

    done = _cli(capsys, "gc", "--artifacts-dir", str(art), "--yes")
    assert done.splitlines()[-1] == f"freed {total} in 4 item(s); 1 in use, kept"
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
