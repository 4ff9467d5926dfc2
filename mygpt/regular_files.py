"""Only regular files are read as input or replaced as output: :func:`open_regular` opens a file to read without
waiting on a FIFO or reading a device (``/dev/zero`` has no end), :func:`write_target` checks that a write replaces
a regular file or makes a new one. Why: as root, renaming a temp file over ``/dev/null`` makes the machine's
``/dev/null`` a regular file."""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

from mygpt.errors import UserError

__all__ = ["file_kind", "open_regular", "write_target"]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words (``"a regular file"``, ``"a FIFO (named pipe)"``, ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str | os.PathLike, label: str, fix: str) -> BinaryIO:
    """``path`` opened to read in binary, if it is a regular file; else ``UserError`` ``<label> <path> is <kind>,
    not a regular file; <fix>``. Opened without blocking (a FIFO with no writer would wait for ever) and checked
    on the open file (``fstat``), so what is read is what was checked. ``OSError`` (missing, unreadable) is the
    caller's to word."""
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UserError(f"{label} {os.fspath(path)} is {file_kind(mode)}, not a regular file; {fix}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def write_target(path: str | os.PathLike, label: str = "output") -> str:
    """``path``, checked as a file a write may replace: a regular file or a new name. ``UserError`` naming
    ``label`` for anything else: a device, a FIFO, a socket, a directory, or a symbolic link (``/dev/stdout``
    among them), which would be replaced by a file or, followed, write where the link points (a link planted in
    a folder would aim a write anywhere)."""
    path = os.fspath(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path  # a new name
    if stat.S_ISLNK(mode):
        try:
            kind = f"a symbolic link to {file_kind(os.stat(path).st_mode)}"
        except OSError:
            kind = "a symbolic link to nothing"
        raise UserError(
            f"{label} {path} is {kind}, not a regular file; only a regular file or a new name is written (the "
            f"link would be replaced, or followed to {os.path.realpath(path)}): give the file's own path"
        )
    if not stat.S_ISREG(mode):
        raise UserError(
            f"{label} {path} is {file_kind(mode)}, not a regular file; only a regular file or a new name is "
            "written (replacing it would destroy it): give a file path"
        )
    return path
