"""The corpus stage's leftovers for gc: whole downloads made to learn a source's sha256 that no build took."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

# SourceIndex.download_path and facts_path under the stage's <folder>/.sources/
_DOWNLOADS = Path(".sources") / "downloads"
_DOWNLOAD_RE = re.compile(r"[0-9a-f]{32}\.zip(?:\.facts\.json)?")
UNTOUCHED_SECONDS = 600  # a younger one may be a running build's


def untaken_downloads(stage_dir: Path) -> Iterator[tuple[Path, int, str]]:
    """``(path, bytes, why)`` of each whole download (and its facts) in the stage folder ``stage_dir`` untouched
    for 10 minutes: a run stopped before its build took it, or a later download superseded it. Partial ones
    (``.part``) stay: a rerun resumes them."""
    why = "a download made to learn the source's sha256 that no build took"
    return untouched_files(stage_dir / _DOWNLOADS, _DOWNLOAD_RE, UNTOUCHED_SECONDS, why)


def untouched_files(folder: Path, names: re.Pattern, seconds: float, why: str) -> Iterator[tuple[Path, int, str]]:
    """``(path, bytes, why)`` of each regular file in ``folder`` whose name ``names`` matches whole and that is
    untouched for ``seconds``: the one scan behind every stage's leftover downloads. Why so strict: gc deletes
    what it yields, so a link, a folder or a name the stage never writes is not ours to judge."""
    if folder.is_symlink() or folder.parent.is_symlink() or not folder.is_dir():
        return  # not a folder the stage made: not ours to judge or delete
    for path in sorted(folder.iterdir()):
        if not names.fullmatch(path.name) or path.is_symlink() or not path.is_file():
            continue  # a name the stage never writes: not ours
        try:
            info = path.stat()
        except FileNotFoundError:  # taken by a build meanwhile
            continue
        if time.time() - info.st_mtime > seconds:
            yield path, info.st_size, why
