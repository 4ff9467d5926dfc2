"""`wiki-pipeline pull`: exactly the manifest's files, each checked against its sha256, never a file reached
through a symbolic link, and a destination that cannot be made refused before anything is read."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from flows.cli import main
from tasks.registry import open_store
from tasks.store import MANIFEST
from tests.tasks.store.builds import publish_locked


@pytest.fixture
def art(tmp_path):
    art = tmp_path / "art"
    publish_locked(open_store(art), "samples", "s1", {"samples.md": b"text", "sub/b.bin": b"\x00\x01"})
    return art


def _pull(capsys, art, dest, code: int) -> str:
    assert main(["pull", "samples/s1", str(dest), "--artifacts-dir", str(art)]) == code
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return out.out if code == 0 else out.err


def test_pull_copies_the_manifests_files_and_says_so(art, tmp_path, capsys):
    out = _pull(capsys, art, tmp_path / "new" / "copy", 0)
    assert "(2 file(s) its manifest lists, " in out and "each checked against its sha256" in out
    copy = tmp_path / "new" / "copy"
    assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file()) == [
        MANIFEST,
        "samples.md",
        "sub/b.bin",
    ]
    assert json.loads((copy / MANIFEST).read_text()) == open_store(art).get("samples", "s1").manifest
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["copy"]  # no temp dir left


@pytest.mark.parametrize("how", ["stray link", "listed file is a link", "linked folder", "stray file"])
def test_a_version_holding_a_link_or_a_stray_file_is_damaged_and_not_pulled(art, tmp_path, capsys, how):
    version = art / "samples" / "s1"
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0\n")
    if how == "stray link":
        (version / "passwd-link").symlink_to(secret)
    elif how == "listed file is a link":  # the manifest even says the linked file's size and sha256
        manifest = json.loads((version / MANIFEST).read_text())
        data = secret.read_bytes()
        manifest["files"]["samples.md"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (version / MANIFEST).write_text(json.dumps(manifest))
        (version / "samples.md").unlink()
        (version / "samples.md").symlink_to(secret)
    elif how == "linked folder":
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "elsewhere" / "b.bin").write_bytes(b"\x00\x01")
        os.rename(version / "sub", tmp_path / "gone")
        (version / "sub").symlink_to(tmp_path / "elsewhere")
    else:
        (version / "extra.txt").write_text("not listed")
    err = _pull(capsys, art, tmp_path / "copy", 2)
    assert err.startswith("error: samples/s1 under ") and "is damaged (" in err and "rerun with force" in err, err
    assert ("unexpected file(s) not in the manifest: 'extra.txt'" if how == "stray file" else "symbolic links") in err
    assert not (tmp_path / "copy").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_file_swapped_for_a_link_after_the_check_is_still_refused(art, tmp_path):
    """The copy itself opens no link (the check before it only narrows the window)."""
    from tasks.store.pull import copy_checked

    version = art / "samples" / "s1"
    meta = open_store(art).get("samples", "s1").manifest["files"]["samples.md"]
    (version / "samples.md").unlink()
    (version / "samples.md").symlink_to(tmp_path / "x")
    (tmp_path / "x").write_bytes(b"text")
    with pytest.raises(ValueError, match=r"samples\.md is not a regular file inside the version"):
        copy_checked(version, "samples.md", meta, tmp_path / "out" / "samples.md", "samples/s1")
    os.mkfifo(tmp_path / "fifo")
    (version / "samples.md").unlink()
    os.rename(tmp_path / "fifo", version / "samples.md")
    with pytest.raises(ValueError, match=r"samples\.md is not a regular file inside the version"):
        copy_checked(version, "samples.md", meta, tmp_path / "out" / "samples.md", "samples/s1")


@pytest.mark.parametrize("where", ["under a file", "under a dangling link", "a dangling link", "a file", "full dir"])
def test_a_destination_that_cannot_be_made_is_refused_before_any_download(tmp_path, s3_root, capsys, where):
    store = open_store(s3_root)
    publish_locked(store, "samples", "s1", {"samples.md": b"text"})
    cache = store.files.local
    shutil.rmtree(cache / "samples", ignore_errors=True)  # no cached copy: a pull would download
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("k")
    dest = {
        "under a file": tmp_path / "file" / "copy",
        "under a dangling link": tmp_path / "dangling" / "copy",
        "a dangling link": tmp_path / "dangling",
        "a file": tmp_path / "file",
        "full dir": tmp_path / "full",
    }[where]
    assert main(["pull", "samples/s1", str(dest), "--artifacts-dir", s3_root]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {dest}") and "Traceback" not in err, err
    assert not (cache / "samples" / "s1").exists(), "nothing was downloaded"
    assert not (tmp_path / "nowhere").exists() and (tmp_path / "file").read_text() == "x"
