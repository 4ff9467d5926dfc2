"""Atomic file writes (temp file beside the target, fsync, ``os.replace``, fsync of the directory: a crash leaves
the old file or the new one, never a torn one; only a regular file or a new name is replaced,
:func:`mygpt.regular_files.write_target`) and ``sha256_file``, the one file checksum."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from typing import IO

from mygpt.regular_files import write_target

_UMASK = os.umask(0o022)
os.umask(_UMASK)


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a directory entry (after a rename/create inside it) to disk."""
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(
    path: str | os.PathLike, mode: str = "wb", encoding: str | None = None, *, durable: bool = True
) -> Iterator[IO]:
    """A temp file beside ``path``, renamed over it on a clean exit (removed, ``path`` untouched, on an error).
    ``UserError`` (before anything is written, and again before the rename) when ``path`` is a device, a FIFO, a
    socket, a directory or a symbolic link (:func:`~mygpt.regular_files.write_target`).
    ``durable=False`` skips the fsyncs: the file still appears whole, by the rename, to every reader on this
    machine, but a power cut may leave it torn; only for scratch files nobody trusts after a crash (why: an fsync
    waits for the disk, far longer than writing a file of a few MB to the page cache)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open supports modes 'w' and 'wb', not {mode!r}")
    path = write_target(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the usual permissions
        with os.fdopen(fd, mode, encoding=encoding if "b" not in mode else None) as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        write_target(path)  # made a FIFO (or a device) while this was written: still not replaced
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(directory)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(text)


def sha256_file(path: str | os.PathLike) -> str:
    """The sha256 of the file at ``path`` as 64 hex digits, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
