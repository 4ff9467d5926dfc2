"""Sums a writer declares (``Build.hashed``): publish takes them for files still as declared, and hashes from disk
whatever was changed, replaced or never declared; the manifest is the same either way."""

from __future__ import annotations

import hashlib
import os

import pytest

from tasks.registry import open_store
from tasks.store import build as build_module

FILES = {"a.txt": b"alpha\n", "sub/b.bin": b"\x00\x01" * 5000}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _written(root, files=FILES, declare=True):
    """A build of corpus/v1 under ``root`` holding ``files``, each declared (or not) as its writer would."""
    build = open_store(root).open_build("corpus", "v1")
    for rel, data in files.items():
        path = build.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        if declare:
            build.hashed(path, len(data), _sha(data))
    return build


def _publish(build) -> dict:
    return build.publish(settings={"p": 1}, inputs={}, code_version="1")


@pytest.fixture()
def reads(monkeypatch):
    """The files publish reads to hash them (relative to their out/)."""
    seen: list[str] = []
    real = build_module.sha256_file

    def recorded(path):
        out = next(p for p in path.parents if p.name == "out")
        seen.append(path.relative_to(out).as_posix())
        return real(path)

    monkeypatch.setattr(build_module, "sha256_file", recorded)
    return seen


def test_declared_sums_give_the_manifest_that_hashing_from_disk_gives(tmp_path):
    declared = _publish(_written(tmp_path / "declared"))
    from_disk = _publish(_written(tmp_path / "plain", declare=False))
    assert (
        declared["files"]
        == from_disk["files"]
        == {rel: {"size": len(data), "sha256": _sha(data)} for rel, data in FILES.items()}
    )


def test_publish_does_not_read_a_file_still_as_declared(tmp_path, reads):
    build = _written(tmp_path, declare=False)
    build.hashed(build.out / "a.txt", 6, _sha(b"alpha\n"))
    manifest = _publish(build)
    assert reads == ["sub/b.bin"], "the declared a.txt must not be read back; the undeclared b.bin must be"
    assert manifest["files"]["a.txt"]["sha256"] == _sha(b"alpha\n")


def test_a_file_rewritten_after_its_declaration_is_hashed_from_disk(tmp_path, reads):
    build = _written(tmp_path)
    path = build.out / "a.txt"
    before = path.stat()
    path.write_bytes(b"omega\n")  # same size, same inode, other bytes
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    manifest = _publish(build)
    assert manifest["files"]["a.txt"] == {"size": 6, "sha256": _sha(b"omega\n")}
    assert reads == ["a.txt"]


def test_a_file_replaced_by_a_rename_after_its_declaration_is_hashed_from_disk(tmp_path, reads):
    build = _written(tmp_path)
    path = build.out / "a.txt"
    other = build.out / "other.part"
    other.write_bytes(b"omega\n")  # same size; same mtime too: only the inode tells it apart
    before = path.stat()
    os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(other, path)
    manifest = _publish(build)
    assert manifest["files"]["a.txt"] == {"size": 6, "sha256": _sha(b"omega\n")}
    assert reads == ["a.txt"]


def test_a_declaration_whose_size_is_not_the_files_is_no_declaration(tmp_path, reads):
    build = _written(tmp_path, declare=False)
    build.hashed(build.out / "a.txt", 5, "0" * 64)
    build.hashed(build.out / "sub/b.bin", 10000, _sha(FILES["sub/b.bin"]))
    manifest = _publish(build)
    assert manifest["files"]["a.txt"] == {"size": 6, "sha256": _sha(b"alpha\n")}
    assert reads == ["a.txt"]
