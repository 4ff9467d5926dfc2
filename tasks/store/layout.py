"""The names under an artifact root: stage folders, version ids, and whether a directory lies inside another root."""

from __future__ import annotations

import re
from pathlib import Path

from tasks.store.files import UnreadableManifest, parse_manifest
from tasks.store.posix import read_manifest_file

STAGE_NAME_RE = re.compile(r"[a-z][a-z0-9_]*")  # a stage's folder: a plain name, never a path
VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # a version id (12 hex digits, see version_id)


def _is_version(d: Path) -> bool:
    """Whether ``d`` is a published version: its manifest names ``<d's parent>/<d>``."""
    try:
        manifest = parse_manifest(read_manifest_file(d))
    except (OSError, UnreadableManifest):
        return False
    return manifest is not None and (manifest.get("stage"), manifest.get("version")) == (d.parent.name, d.name)


def _is_stage_folder(d: Path) -> bool:
    """Whether ``d`` is a stage's folder of some root: it has build locks or staging areas."""
    try:
        return bool(STAGE_NAME_RE.fullmatch(d.name)) and ((d / ".locks").is_dir() or (d / ".staging").is_dir())
    except OSError:
        return False


def enclosing_root(path: Path) -> str | None:
    """What of another artifact root the directory ``path`` lies inside (a published version or a stage folder),
    or None; a root there would write into that root's versions. Checked as written and with links resolved (a
    symlink to a version writes into it all the same)."""
    written = [path, *path.parents]
    real = path.resolve()
    for d in [*written, *(r for r in (real, *real.parents) if r not in written)]:
        if _is_version(d):
            return f"the published version {d.parent.name}/{d.name} of the artifact root {d.parent.parent}"
        if _is_stage_folder(d):
            return f"the stage folder {d.name} of the artifact root {d.parent}"
    return None
