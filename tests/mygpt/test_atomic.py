"""Atomic writes: the old file survives a crash mid-write; new files get the umask's permissions."""

from __future__ import annotations

import os

import pytest


def test_atomic_open_keeps_old_file_on_error(tmp_path):
    from mygpt.atomic import atomic_open

    target = tmp_path / "f.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_open(target, "w") as f:
        f.write("new but torn")
        raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["f.txt"]


def test_atomic_writes_get_umask_permissions(tmp_path):
    from mygpt.atomic import _UMASK, atomic_write_text

    atomic_write_text(tmp_path / "f.txt", "x")
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o666 & ~_UMASK


def test_a_scratch_write_appears_whole_by_its_rename_without_waiting_for_the_disk(tmp_path, monkeypatch):
    import mygpt.atomic as atomic

    synced: list[int] = []
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: synced.append(fd))
    target = tmp_path / "f.bin"
    with atomic.atomic_open(target, "wb", durable=False) as f:
        f.write(b"scratch")
        assert not target.exists()  # nothing under the name until the rename
    assert target.read_bytes() == b"scratch" and synced == []
    with pytest.raises(RuntimeError), atomic.atomic_open(target, "wb", durable=False) as f:
        f.write(b"torn")
        raise RuntimeError("crash mid-write")
    assert target.read_bytes() == b"scratch" and os.listdir(tmp_path) == ["f.bin"]
    atomic.atomic_write_bytes(target, b"kept")  # the default stays durable: the file, then its folder
    assert len(synced) == 2
