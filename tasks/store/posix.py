"""An artifact root on a local (or shared POSIX) filesystem: ``os.rename`` publication, ``flock`` locks."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from mygpt.atomic import fsync_dir, sha256_file
from tasks.store.files import MANIFEST, MAX_MANIFEST_BYTES, Found, UnreadableManifest, manifest_text

log = logging.getLogger("wiki_pipeline.store")


def _flock(fh, how: int) -> bool:
    """``flock(fh, how)``; whether it was taken (False only when ``how`` has ``LOCK_NB`` and another holds it)."""
    try:
        fcntl.flock(fh, how)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return False
    return True


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "no regular file"


def read_manifest_file(folder: Path) -> str | None:
    """The text of ``folder``'s manifest; None when ``folder`` is no directory. :class:`UnreadableManifest` when
    the folder or its manifest is a symbolic link, the manifest is missing (a directory's version is renamed into
    place with its manifest), not a regular file (a FIFO would block the reader, a device never end), too big or
    not UTF-8: each opened without following a link and without waiting, then checked by ``fstat``."""
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnreadableManifest("the version's folder is a symbolic link") from None
        raise
    try:
        fd = os.open(MANIFEST, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        raise UnreadableManifest("it is missing (a published version always has one)") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnreadableManifest("it is a symbolic link") from None
        raise
    finally:
        os.close(dir_fd)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnreadableManifest(f"it is {_kind(mode)}, not a regular file")
        with open(fd, "rb", closefd=False) as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)
    finally:
        os.close(fd)
    return manifest_text(data)


class PosixFiles:
    """The root directory ``root`` (a :class:`tasks.store.files.Files`); builds stage under it."""

    remote = False

    def __init__(self, root: Path) -> None:
        self.root = root
        self.local = root
        self.display = str(root)

    def where(self, key: str) -> str:
        return str(self.root / key)

    def path(self, key: str) -> Path:
        return self.root / key

    # ---- reading ---------------------------------------------------------------------------------
    def read_manifest(self, key: str) -> str | None:
        return read_manifest_file(self.root / key)

    def exists(self, key: str) -> bool:
        return (self.root / key).exists()

    def subdirs(self, key: str) -> list[str]:
        d = self.root / key
        return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []

    def names(self, key: str) -> list[str]:
        d = self.root / key
        return sorted(p.name for p in d.iterdir() if p.is_file()) if d.is_dir() else []

    def files(self, key: str) -> dict[str, int]:
        base = self.root / key
        found = {}
        for p in base.rglob("*"):
            with contextlib.suppress(FileNotFoundError):
                if p.is_file():
                    found[p.relative_to(base).as_posix()] = p.stat().st_size
        return found

    def links(self, key: str) -> list[str]:
        """The symbolic links under ``key``, not followed: a version holding one could hand out a file from
        anywhere on this machine."""
        base = self.root / key
        if base.is_symlink():
            return ["."]
        found = []
        for dirpath, dirs, names in os.walk(base):
            for name in [*dirs, *names]:
                if os.path.islink(os.path.join(dirpath, name)):
                    found.append(Path(dirpath, name).relative_to(base).as_posix())
        return sorted(found)

    def sha256(self, key: str) -> str:
        return sha256_file(self.root / key)

    def usage(self, key: str) -> tuple[int, float]:
        total, newest = 0, 0.0
        for dirpath, dirs, names in os.walk(self.root / key):
            for name in [*dirs, *names, ""]:  # "" = the directory itself
                with contextlib.suppress(OSError):  # a file a running build just replaced
                    st = os.lstat(os.path.join(dirpath, name))
                    newest = max(newest, st.st_mtime)
                    if name in names:
                        total += st.st_size
        return total, newest

    def fetch(self, key: str, dest: Path) -> Path:
        return self.root / key  # read in place

    def local_copy(self, key: str, full: bool = False) -> Path:
        return self.root / key  # the version itself

    def cached(self, key: str, rel: str, build_id: str) -> Path | None:
        return None  # fetch reads the published file itself

    # ---- resume state: the staging area under the root already is it ----------------------------
    def save_state(self, local: Path, key: str) -> None:
        pass

    def restore_state(self, key: str, dest: Path) -> int:
        return 0

    # ---- writing ---------------------------------------------------------------------------------
    def build_folder(self, build_id: str) -> str:
        return ""  # the version is the renamed staging dir; its flock cannot be lost while its holder lives

    def found(self, key: str) -> Found | None:
        return None

    def place(
        self,
        out: Path,
        key: str,
        replaces: Found | None,
        fault: Callable[[str], None] | None = None,
        still_held: Callable[[], None] | None = None,
    ) -> None:
        """Discard the version ``key`` if there is one, fsync every file of ``out``, then one rename to ``key``."""
        if self.discard(key):
            log.info("discarded %s (replaced by a rebuild)", key)
        for p in sorted(out.rglob("*")):
            if p.is_file():
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
        for d in sorted({p.parent for p in out.rglob("*")} | {out}):
            fsync_dir(d)
        if fault:
            fault("publish")
        if still_held:
            still_held()
        final = self.root / key
        os.rename(out, final)
        fsync_dir(final.parent)

    def discard(self, key: str, still_held: Callable[[], None] | None = None) -> bool:
        """Rename the version ``key`` into its stage's ``.trash``, then delete it; whether it was there."""
        path = self.root / key
        if not path.exists() and not path.is_symlink():
            return False
        trash = path.parent / ".trash"
        trash.mkdir(parents=True, exist_ok=True)
        target = trash / f"{path.name}.{uuid.uuid4().hex[:8]}"
        os.rename(path, target)
        fsync_dir(path.parent)
        self.delete(target.relative_to(self.root).as_posix())
        return True

    def delete(self, key: str) -> None:
        """Delete the file or directory ``key``; a symbolic link itself, never what it points to."""
        path = self.root / key
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    # ---- locks -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(
        self, key: str, *, shared: bool = False, wait: bool = True, on_wait: Callable[[], None] | None = None
    ) -> Iterator[bool]:
        """``flock`` on the lock file ``key``; freed by the kernel when its holder dies.

        gc deletes lock files it holds, so a lock taken on a file the path no longer names (another inode) guards
        nothing: start over on the file it names now."""
        path = self.root / key
        how = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        while True:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a+") as fh:
                if not _flock(fh, how | fcntl.LOCK_NB):
                    if not wait:
                        yield False
                        return
                    if on_wait:
                        on_wait()
                        on_wait = None
                    fcntl.flock(fh, how)
                try:
                    current = os.stat(path).st_ino
                except FileNotFoundError:
                    current = None
                if current != os.fstat(fh.fileno()).st_ino:
                    fcntl.flock(fh, fcntl.LOCK_UN)
                    continue  # gc deleted the file between our open and our lock: lock the new one
                try:
                    yield True
                finally:
                    fcntl.flock(fh, fcntl.LOCK_UN)
                return

    def check_held(self, key: str, renew: bool = True) -> None:
        """A ``flock`` cannot be lost while its holder lives: nothing to check."""

    def lock_exists(self, key: str) -> bool:
        return (self.root / key).exists()

    def unlink_lock(self, key: str) -> None:
        (self.root / key).unlink(missing_ok=True)
