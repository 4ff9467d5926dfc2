"""The files side of an artifact root: what the store asks of a directory (``posix``) or an object store (``s3``)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

MANIFEST = "manifest.json"
FILES_UNDER = "files_under"  # a manifest's folder (inside its version) holding the files; absent: the version itself
#: The most bytes a manifest may have, read or written. A manifest is one entry (~150 bytes) per file: the largest a
#: stage writes is ~12 KB (shards at the default shard size), so this holds ~100k files; and JSON grows up to some
#: twenty-five-fold into Python objects (``[[],[],...]``), so a hostile manifest at the cap costs a listing ~0.4 GB
#: of memory, not more. ``Build.publish`` refuses a bigger one: its readers would take it for damage.
MAX_MANIFEST_BYTES = 16 << 20
#: C0 and C1 control characters and DEL (in a name they could rewrite a terminal that shows it), and lone
#: surrogates (JSON can spell them; no file name or terminal has a form of them).
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def printable(name: str) -> str:
    """``name`` with each character :data:`CONTROL_RE` matches written as its escape (``\\x1b``), for showing a
    name read from a listing where the names are not quoted (gc's table)."""
    return CONTROL_RE.sub(lambda m: ascii(m.group(0))[1:-1], name)


class UnreadableManifest(Exception):
    """A version's manifest is there but cannot be one (why): not a regular file, too big, not UTF-8, or, where
    publication always brings one, missing from a version folder. Damage: the version is rebuilt."""


def manifest_text(data: bytes) -> str:
    """``data`` (read with at most one byte over :data:`MAX_MANIFEST_BYTES`) as a manifest's text;
    :class:`UnreadableManifest` when it is too big or not UTF-8."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise UnreadableManifest(f"it is over {MAX_MANIFEST_BYTES >> 20} MiB, more than a manifest may have")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UnreadableManifest("it is not UTF-8 text") from None


def safe_rel(rel: object) -> bool:
    """Whether ``rel`` (a name from a manifest or a listing) is a file inside its version: relative, no
    ``.``/``..``/empty segments, no backslash (anything else could write outside a local copy), no control
    character (one could rewrite the terminal of whoever lists it)."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or CONTROL_RE.search(rel):
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def parse_manifest(text: str | None) -> dict | None:
    """The manifest in ``text``, or None when there is none or it is not a JSON object (nested too deep for the
    parser included: that is damage, not a crash of whoever lists it)."""
    if text is None:
        return None
    try:
        manifest = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return manifest if isinstance(manifest, dict) else None


def files_prefix(manifest: dict) -> str | None:
    """Where the manifest's files lie, relative to its version: ``""`` or ``"<folder>/"``; None when the manifest
    names no single plain folder (damage, or a hand-written manifest pointing elsewhere)."""
    under = manifest.get(FILES_UNDER)
    if under is None:
        return ""
    if not safe_rel(under) or "/" in under or under == MANIFEST:
        return None
    return f"{under}/"


@dataclass(frozen=True)
class Found:
    """A version's manifest as a build found it under its lock: the one its publication may replace."""

    tag: str  # the object's ETag: the publication replaces it only while it is unchanged
    manifest: dict | None  # None when unreadable


class Files(Protocol):
    """An artifact root's files, named by ``/``-separated keys relative to the root (``shards/3f2a…/x.parquet``)."""

    remote: bool  # an object store, read and written through a local cache
    local: Path  # where builds stage and inputs are read: the root, or its local cache
    display: str  # what messages name: a directory or an s3:// URL

    def where(self, key: str) -> str: ...  # the full path or URL, for messages

    def path(self, key: str) -> Path: ...  # under :attr:`local`

    def read_manifest(self, key: str) -> str | None:
        """The text of the manifest of the version ``key``, at most :data:`MAX_MANIFEST_BYTES`, never waiting on
        it and never following a link; None when it has none (not published, or on an object store a build whose
        commit is still to come); :class:`UnreadableManifest` when what is there is damage."""
        ...

    def exists(self, key: str) -> bool: ...

    def subdirs(self, key: str) -> list[str]: ...

    def names(self, key: str) -> list[str]: ...  # the plain files directly under ``key``

    def files(self, key: str) -> dict[str, int]: ...  # ``{relative path: size}`` of every file under ``key``

    def links(self, key: str) -> list[str]: ...  # symbolic links under ``key`` (relative; "." for ``key``)

    def sha256(self, key: str) -> str: ...

    def usage(self, key: str) -> tuple[int, float]: ...  # bytes under ``key``, its newest mtime

    def fetch(self, key: str, dest: Path) -> Path:
        """A local file holding the object ``key``: on a directory root the file itself, on an object store a
        download to ``dest`` (the caller's to delete). Unchecked: ``Versions.fetch_bytes`` checks it."""
        ...

    def local_copy(self, key: str, full: bool = False) -> Path:
        """A local directory holding the published version ``key`` (checked by size, with ``full`` by sha256)."""
        ...

    def cached(self, key: str, rel: str, build_id: str) -> Path | None:
        """This machine's copy of the file ``rel`` of the version ``key`` as its build ``build_id`` published it,
        read without a request (an object store's cache: the copy this machine published or downloaded), or
        None (none here; a directory root: ``fetch`` reads the file itself). Unchecked, as :meth:`fetch`."""
        ...

    def save_state(self, local: Path, key: str) -> None:
        """Keep the local file ``local`` of a build as resume state at ``key`` (gone: deleted there)."""
        ...

    def restore_state(self, key: str, dest: Path) -> int:
        """Bring the resume state kept at ``key`` into the local directory ``dest``; how many files."""
        ...

    def build_folder(self, build_id: str) -> str:
        """The folder of a version that holds a new build's files ("" : the version itself), a name no other
        build uses where a builder that lost its lock could still write."""
        ...

    def found(self, key: str) -> Found | None:
        """The manifest of the version ``key`` as it is now (None: not there, or a directory's, whose lock holds)."""
        ...

    def place(
        self,
        out: Path,
        key: str,
        replaces: Found | None,
        fault: Callable[[str], None] | None = None,
        still_held: Callable[[], None] | None = None,
    ) -> None:
        """Publish the complete local directory ``out`` (its manifest inside) as ``key``, the manifest last; on
        an object store the manifest is created only if ``replaces`` is still what ``key`` holds."""
        ...

    def discard(self, key: str, still_held: Callable[[], None] | None = None) -> bool:
        """Take the version ``key`` away for every reader at once, then delete it; whether it was there."""
        ...

    def delete(self, key: str) -> None: ...

    def locked(
        self, key: str, *, shared: bool = False, wait: bool = True, on_wait: Callable[[], None] | None = None
    ) -> AbstractContextManager[bool]:
        """Hold the lock ``key`` (exclusive, or ``shared``); yields whether it was taken (only ``wait=False``
        gives up)."""
        ...

    def check_held(self, key: str, renew: bool = True) -> None:
        """UserError when this process took the lock ``key`` and lost it since; ``renew=False`` renews only a
        lease unrenewed for a lease time (cheap enough for every progress report)."""
        ...

    def lock_exists(self, key: str) -> bool: ...

    def unlink_lock(self, key: str) -> None: ...  # only while holding it exclusively
