"""A ``file://`` folder as a corpus source (``corpus.kind=text``'s ``.txt`` files, ``parquet``'s ``.parquet``
ones): the files of one suffix under it, sorted by relative path, checked, and named by their content. Why one
module: two kinds that read a folder must agree on which files it holds and what makes it another version."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from mygpt.atomic import sha256_file
from mygpt.errors import UserError
from tasks.core.urls import file_path
from tasks.sources.fetched import checked


def folder_of(settings) -> Path | None:
    """The folder ``source_url`` names, or None when it names a file or an http(s) URL."""
    if not settings.is_file:
        return None
    path = file_path(settings.source_url)
    return path if path.is_dir() else None


def listing(folder: Path, settings, store, suffix: str) -> list[tuple[str, str]]:
    """``[(relative path, sha256)]`` of every ``*suffix`` file under ``folder``, sorted; ``UserError`` for none, for
    a name that is not UTF-8 (it is hashed as UTF-8 into the identity, and text's documents' id), or for a file
    whose real path (a symbolic link's target) the allowed-sources list does not admit: the list judges the
    folder's URL, and a link planted in an allowed folder would otherwise read any file the run can; or for a
    folder that holds ``store``'s root (each run would read the corpus files the last one published, a new
    version every run)."""
    from tasks.sources.allowed import SourcePolicy

    if store is not None and not store.remote:
        root, top = os.path.realpath(store.root), os.path.realpath(folder)
        if root == top or root.startswith(top.rstrip("/") + "/"):
            raise UserError(
                f"corpus.source_url {settings.shown_url} holds the artifact root {store.root}, whose corpus files "
                "each run would read as your text; give a folder without it, or another run.artifacts_dir"
            )

    files = sorted((p.relative_to(folder).as_posix(), p) for p in folder.rglob(f"*{suffix}") if p.is_file())
    if not files:
        raise UserError(
            f"corpus.source_url {settings.shown_url}: the folder holds no {suffix} file; give a folder of "
            f"{suffix} files"
        )
    policy = SourcePolicy.from_env()
    for rel, p in files:
        try:
            rel.encode("utf-8")
        except UnicodeEncodeError:
            raise UserError(
                f"corpus.source_url {settings.shown_url}: the name {os.fsencode(rel)!r} is not UTF-8; rename the "
                "file (its relative path is part of the corpus's identity)"
            ) from None
        real = Path(os.path.realpath(p)).as_uri()
        if not policy.admits(real):
            raise UserError(
                f"corpus.source_url {settings.shown_url}: {rel} is a link to {real}, outside the sources this "
                f"machine allows ({policy.shown()}); copy the file into the folder, or remove the link"
            )
    return [(rel, sha256_file(p)) for rel, p in files]


def digest(files: list[tuple[str, str]]) -> str:
    """A folder's identity: the sha256 of its listing."""
    return hashlib.sha256(json.dumps(files, ensure_ascii=False).encode("utf-8")).hexdigest()


def folder_identity(folder: Path, settings, store, suffix: str, reading: int) -> dict:
    """The identity of the folder's ``*suffix`` files: its listing's digest, their bytes and count, and the kind's
    reading version; checked against ``expected_sha256``."""
    files = listing(folder, settings, store, suffix)
    total = sum((folder / rel).stat().st_size for rel, _ in files)
    return checked({"sha256": digest(files), "bytes": total, "files": len(files), "reading": reading}, settings)


def changed(shown: str) -> str:
    """The refusal of files that differ from the ones the run's version names."""
    return (
        f"{shown} changed while this run was using it (its files' sha256s differ from the ones this run's version "
        "names); rerun to use the new files"
    )
