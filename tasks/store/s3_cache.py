"""This machine's cache of an object-store root's versions (``<cache>/roots/<root>/<stage>/<version>/``): the copy
a build published from (its staging ``out/``, renamed there) or a checked download, each with its manifest. Why
here: a reader on this machine takes a version's files from it instead of downloading the bytes it just sent."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path

from mygpt.atomic import sha256_file
from tasks.store.files import MANIFEST, safe_rel

INCOMING = ".incoming"  # downloads into the local cache in progress (a killed one is left there for gc)


def install(local: Path, source: Path, final: Path) -> None:
    """Make the directory ``source`` the cached copy ``final`` (under the cache ``local``) by one rename, the old
    one moved aside first."""
    if final.exists():
        aside = local / INCOMING / f"old-{uuid.uuid4().hex[:8]}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.rename(final, aside)
        shutil.rmtree(aside, ignore_errors=True)
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(source, final)
    except OSError:
        shutil.rmtree(source, ignore_errors=True)


def _cached_build(final: Path) -> object:
    try:
        cached = json.loads((final / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return cached.get("build_id") if isinstance(cached, dict) else None


def holds_build(final: Path, manifest: dict, full: bool = False) -> bool:
    """Whether ``final`` holds this build of the version (its ``build_id``, each file's size; ``full``: sha256)."""
    if _cached_build(final) != manifest.get("build_id"):
        return False
    files = manifest.get("files") or {}
    try:
        return all(
            safe_rel(r)
            and (final / r).is_file()
            and (final / r).stat().st_size == m["size"]
            and (not full or sha256_file(final / r) == m["sha256"])
            for r, m in files.items()
        )
    except (OSError, TypeError, KeyError):
        return False


def cached_file(final: Path, rel: str, build_id: str) -> Path | None:
    """The file ``rel`` of the cached copy ``final`` when that copy is of the build ``build_id``, else None.
    Unchecked: the caller checks its size and sha256 against the manifest before anyone reads it."""
    if not safe_rel(rel) or _cached_build(final) != build_id:
        return None
    path = final / rel
    return path if path.is_file() and not path.is_symlink() else None
