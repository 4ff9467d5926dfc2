"""``pull``'s two halves outside the store: the destination, checked before anything is read, and each file
copied out of a version without following a link, checked against its manifest as it is copied."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from mygpt.errors import UserError
from tasks.store.layout import enclosing_root


def check_destination(dest: Path, what: str) -> Path:
    """``dest`` made absolute, when a copy of ``what`` can appear there: it is new or an empty directory, not a
    link, not inside a published version, and its nearest existing parent is a directory this process may write
    into; else ``UserError``. Checked first, so a bad destination costs no download."""
    dest = Path(dest).expanduser().absolute()
    if dest.is_symlink():
        raise UserError(f"{dest} is a symbolic link; give a new directory to copy {what} into")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UserError(f"{dest} exists and is not an empty directory; give a new directory to copy {what} into")
    inside = enclosing_root(dest)  # a copy there would add files to a published version: damage
    if inside is not None:
        raise UserError(f"{dest} is inside {inside}; give a directory outside every artifact root's versions")
    for parent in dest.parents:
        if parent.is_symlink() and not parent.exists():
            raise UserError(
                f"{dest} is under {parent}, a symbolic link to {os.readlink(parent)}, which does not exist; "
                f"give a directory that can be made to copy {what} into"
            )
        if not parent.exists():
            continue
        if not parent.is_dir():
            raise UserError(
                f"{dest} is under {parent}, which is a file, not a directory; give a directory that can be made "
                f"to copy {what} into"
            )
        if not os.access(parent, os.W_OK | os.X_OK):
            raise UserError(f"{dest} cannot be made: {parent} is not writable by this user; give another directory")
        break
    return dest


def _open_inside(base: Path, rel: str) -> int:
    """A read descriptor of the regular file ``base/rel``, no link followed on the way (``base`` included)."""
    parts = rel.split("/")
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
        # O_NONBLOCK: a FIFO put there must not hang the copy (it is refused below)
        found = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(found).st_mode):
        os.close(found)
        raise OSError(f"{rel} is not a regular file")
    return found


def copy_checked(base: Path, rel: str, meta: dict, target: Path, what: str) -> None:
    """Copy the file ``rel`` of the version held in ``base`` to ``target``, refusing a link anywhere on its way
    and a copy whose size or sha256 is not the manifest's (``meta``)."""
    try:
        fd = _open_inside(base, rel)
    except OSError as exc:
        raise UserError(
            f"{what}: {rel} is not a regular file inside the version ({exc.strerror or exc}: a link, or gone); "
            "the version is damaged: rerun with force for its stage to rebuild it"
        ) from None
    digest, size = hashlib.sha256(), 0
    target.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(fd, "rb") as src, open(target, "xb") as out:
        while chunk := src.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
            out.write(chunk)
    if size != meta["size"] or digest.hexdigest() != meta["sha256"]:
        raise UserError(f"{what}: {rel} does not match its sha256 in the manifest; rerun with force to rebuild it")
