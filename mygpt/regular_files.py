"""Only regular files are read as input or replaced as output: :func:`open_regular` opens a file to read without
waiting on a FIFO or reading a device (``/dev/zero`` has no end), :func:`write_target` says which file a write
replaces. Why: as root, renaming a temp file over ``/dev/null`` makes the machine's ``/dev/null`` a regular file."""

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
    """The file a write to ``path`` replaces: ``path``, or for a symbolic link the file it names (the link is
    kept, not replaced by a file). ``UserError`` naming ``label`` when something that is not a regular file is
    there (a device, a FIFO, a socket, a directory, ``/dev/stdout``): only a regular file or a new name is
    written."""
    path = os.fspath(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None  # a new name (or a link to one)
    if mode is not None and not stat.S_ISREG(mode):
        raise UserError(
            f"{label} {path} is {file_kind(mode)}, not a regular file; only a regular file or a new name is "
            "written (replacing it would destroy it): give a file path"
        )
    return os.path.realpath(path) if os.path.islink(path) else path
