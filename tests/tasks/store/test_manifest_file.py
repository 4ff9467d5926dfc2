"""What lies where a version's manifest should be: anything that is not a readable regular file of a manifest's
size (a FIFO, a link to a device, JSON nested past the parser, a directory, bad UTF-8, nothing) is damage that the
listing shows, gc collects and a run rebuilds; never a hang, a crash or a version left out. Names read from a
manifest or a listing reach no terminal raw."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.cli import main
from mygpt.errors import UserError
from tasks.registry import open_store
from tasks.store import MANIFEST
from tasks.store.files import MAX_MANIFEST_BYTES, safe_rel
from tests.support import REPO
from tests.tasks.store.builds import publish_local, publish_locked

ENV = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "OMP_NUM_THREADS": "1"}


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _dev_zero(p: Path) -> None:
    p.symlink_to("/dev/zero")


def _deep(p: Path) -> None:
    p.write_text("[" * 200_000 + "]" * 200_000)


def _too_big(p: Path) -> None:
    with open(p, "wb") as f:
        f.truncate(MAX_MANIFEST_BYTES + 1)  # sparse: no disk, all of it read by a reader without a cap


def _bad_utf8(p: Path) -> None:
    p.write_bytes(b'{"stage": "corpus\xff"}')


def _directory(p: Path) -> None:
    p.mkdir()


def _missing(p: Path) -> None:
    pass


def _link_to_good(p: Path) -> None:
    good = p.parent.parent / "elsewhere.json"
    good.write_bytes(p.with_suffix(".was").read_bytes())
    p.symlink_to(good)


# version -> (what replaces its manifest, why the listing gives)
KINDS = {
    "vfifo": (_fifo, "it is a FIFO, not a regular file"),
    "vzero": (_dev_zero, "it is a symbolic link"),
    "vdeep": (_deep, "it is not a JSON object"),
    "vbig": (_too_big, f"it is over {MAX_MANIFEST_BYTES >> 20} MiB, more than a manifest may have"),
    "vutf8": (_bad_utf8, "it is not UTF-8 text"),
    "vdir": (_directory, "it is a directory, not a regular file"),
    "vnone": (_missing, "it is missing (a published version always has one)"),
    "vlink": (_link_to_good, "it is a symbolic link"),
}


def _damaged_root(root: Path) -> None:
    store = open_store(root)
    for version, (damage, _) in KINDS.items():
        publish_local(store, version, {"a.txt": b"alpha\n"})
        manifest = root / "corpus" / version / MANIFEST
        manifest.rename(manifest.with_suffix(".was"))
        damage(manifest)
        manifest.with_suffix(".was").unlink()


def test_whatever_lies_as_the_manifest_is_listed_as_damage_and_collected(tmp_path):
    _damaged_root(tmp_path)
    listing = subprocess.run(  # a real process: a reader that blocks on the FIFO or reads /dev/zero never ends
        [sys.executable, "-m", "flows.cli", "artifacts", "--artifacts-dir", str(tmp_path)],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listing.returncode == 0, listing.stderr
    for version, (_, why) in KINDS.items():
        line = next(li for li in listing.stdout.splitlines() if li.startswith(f"corpus     {version}"))
        assert f"[damaged: {MANIFEST} in {tmp_path / 'corpus' / version} is damaged: {why}]" in line, line
    assert f"{len(KINDS)} damaged version(s)" in listing.stdout

    store = open_store(tmp_path)
    items = [g for g in store.garbage() if g.published]
    assert sorted(g.version for g in items) == sorted(KINDS)
    assert main(["gc", "--yes", "--artifacts-dir", str(tmp_path)]) == 0
    assert [p.name for p in (tmp_path / "corpus").iterdir() if not p.name.startswith(".")] == ["elsewhere.json"]
    assert store.versions(damaged=True) == [] and not any((tmp_path / "corpus" / ".trash").iterdir())


RUN = """
import os, sys
from pathlib import Path
from tasks.core.settings import RunOptions
from tests.tasks.store.builds import SOURCE, Word
run = RunOptions(artifacts_dir=sys.argv[1])
first = SOURCE.reuse_or_build(Word(), run, {})
manifest = Path(first["path"]) / "manifest.json"
manifest.unlink()
if sys.argv[2] == "fifo":
    os.mkfifo(manifest)
else:
    manifest.write_text("[" * 200_000 + "]" * 200_000)
again = SOURCE.reuse_or_build(Word(), run, {})
assert again["version"] == first["version"] and again["build_id"] != first["build_id"], (first, again)
print("rebuilt", again["build_id"])
"""


@pytest.mark.parametrize("kind", ["fifo", "deep"])
def test_a_run_rebuilds_a_version_whose_manifest_is_no_file_or_too_deep(tmp_path, kind):
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(tmp_path), kind], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "rebuilt" in done.stdout, done.stderr[-3000:]
    store = open_store(tmp_path)
    (v,) = store.versions(damaged=True)
    assert store.verify("corpus", v.version, full=True) == (True, "ok")


def test_a_damaged_manifest_on_s3_is_read_only_up_to_the_cap_and_listed(s3_root):
    store = open_store(s3_root)
    for version in ("big", "utf8"):
        publish_locked(store, "corpus", version, {"a.txt": b"a"})
    base = f"{s3_root[5:]}/corpus"
    store.files.fs.pipe_file(f"{base}/big/{MANIFEST}", b" " * (MAX_MANIFEST_BYTES + 1))
    store.files.fs.pipe_file(f"{base}/utf8/{MANIFEST}", b'{"x": "\xff"}')
    damage = {v.version: v.damage for v in store.versions(damaged=True)}
    assert f"is damaged: it is over {MAX_MANIFEST_BYTES >> 20} MiB, more than a manifest may" in damage["big"]
    assert damage["utf8"].endswith("is damaged: it is not UTF-8 text")
    with pytest.raises(UserError, match=r"damaged \(it is not UTF-8 text\)"):
        store.local_copy("corpus", "utf8")
    for item in [g for g in store.garbage() if g.published]:
        assert store.collect(item)
    assert store.versions(damaged=True) == []


def test_files_beside_no_manifest_on_s3_are_collected_under_the_lock(s3_root):
    """A version prefix with no manifest may be a build before its commit (its own folder, kept while locked);
    files in the version itself no build writes, so gc collects them too, never while a run holds the lock."""
    store = open_store(s3_root)
    store.files.fs.pipe_file(f"{s3_root[5:]}/corpus/v1/a.txt", b"old layout, manifest deleted")
    assert store.versions(damaged=True) == []  # no manifest on an object store: not published, not damage
    with store.lock("corpus", "v1"):
        (item,) = [g for g in store.garbage() if g.key == "corpus/v1/a.txt"]
        assert item.in_use and not store.collect(item)
    assert store.collect(item) and store.files.files("corpus/v1") == {}


ESC = "x\x1b]0;PWNED\x07\x1b[2K\r\u009b2J"


def test_a_name_with_control_characters_is_damage_and_reaches_no_terminal_raw(tmp_path, capsys):
    assert not any(safe_rel(n) for n in ("a\x1b[2K", "a\rb", "a\x7f", "a\u009bb", "a\ud800", "ok/\x07"))
    assert safe_rel("ok/naïve name.txt")
    store = open_store(tmp_path)
    publish_local(store, "v1", {"a.txt": b"alpha\n"})
    path = tmp_path / "corpus" / "v1" / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["files"][ESC] = manifest["files"].pop("a.txt")
    path.write_text(json.dumps(manifest))
    publish_local(store, "v2", {"a.txt": b"alpha\n"})
    (tmp_path / "corpus" / "v2" / ESC).write_text("stray")  # a name from the listing, not the manifest
    (tmp_path / "corpus" / ".trash" / ESC).mkdir(parents=True)  # gc's table shows listed names

    assert main(["artifacts", "--artifacts-dir", str(tmp_path)]) == 0
    assert main(["gc", "--artifacts-dir", str(tmp_path)]) == 0
    assert main(["pull", "corpus/v2", str(tmp_path / "out"), "--artifacts-dir", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert "[damaged: " in out and "unexpected file(s) not in the manifest: 'x\\x1b]0;PWNED\\x07" in err
    assert ".trash/x\\x1b]0;PWNED\\x07\\x1b[2K\\r\\x9b2J" in out
    assert not any(c in out + err for c in "\x1b\x07\r\u009b"), (out + err).encode()
    reason = store.verify("corpus", "v1")[1]
    assert "files lists 'x\\x1b]0;PWNED" in reason and "\x1b" not in reason


@pytest.mark.parametrize("command", [["artifacts"], ["gc"], ["pull", "corpus/v1", "dest"], ["run", "--tiny"]])
def test_an_empty_artifacts_dir_is_one_error_in_every_command(command, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # was: artifacts listed the working directory, run wrote to the default root
    assert main([*command, "--artifacts-dir", ""]) == 2
    assert capsys.readouterr().err.startswith("error: --artifacts-dir is empty; give a directory or s3://")
    with pytest.raises(UserError, match="the artifact root is empty"):
        open_store("")


def test_listing_an_s3_prefix_that_holds_nothing_is_an_error(s3_root, capsys):
    typo = f"{s3_root}-typo"
    for command in (["artifacts"], ["gc"]):
        assert main([*command, "--artifacts-dir", typo]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: the artifact root {typo} holds nothing (no object under that prefix); check")
    store = open_store(s3_root)
    publish_locked(store, "corpus", "c1", {"a.txt": b"a"})
    assert main(["artifacts", "--artifacts-dir", s3_root]) == 0 and "corpus     c1" in capsys.readouterr().out


def test_a_build_never_publishes_a_manifest_its_readers_would_take_for_damage(tmp_path, monkeypatch):
    """Over the cap, every reader would call the version damaged and every run rebuild it: publish refuses."""
    store = open_store(tmp_path)
    monkeypatch.setattr("tasks.store.build.MAX_MANIFEST_BYTES", 600)  # the cap scaled to a test's manifest
    with pytest.raises(UserError, match=r"corpus/v1: its manifest would be over the 600 bytes a manifest may have \(6"):
        publish_local(store, "v1", {f"f{i}.txt": b"x" for i in range(6)})
    assert store.versions(damaged=True) == [] and not (tmp_path / "corpus" / "v1").exists()
    publish_local(store, "v2", {"a.txt": b"x"})
    assert [v.version for v in store.versions()] == ["v2"]
