"""An artifact root's published versions: their ids and keys, manifests and checks, listing, locks, copies."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import stat
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mygpt.errors import UserError
from tasks.store.files import MANIFEST, UnreadableManifest, files_prefix, parse_manifest, safe_rel
from tasks.store.layout import STAGE_NAME_RE, VERSION_RE
from tasks.store.manifest_schema import manifest_problem
from tasks.store.pull import check_destination, copy_checked
from tasks.store.roots import absolute_root, default_root, open_files

log = logging.getLogger("wiki_pipeline.store")


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def version_id(
    stage: str, settings: dict, inputs: dict[str, str], code_version: str, source: dict | None = None
) -> str:
    """12 hex digits of sha256 over the stage, its settings, its inputs' ids, its code version and, for a stage
    that reads from outside the store, the identity of what it reads (``source``)."""
    ingredients = {"stage": stage, "settings": settings, "inputs": inputs, "code": code_version}
    if source is not None:
        ingredients["source"] = source
    return hashlib.sha256(canonical_json(ingredients).encode("utf-8")).hexdigest()[:12]


def content_digest(manifest: dict) -> str:
    """What a published version's bytes are: sha256 over each file's name and sha256 as its manifest records them.
    Why: a downstream version names its input by this, so equal bytes give equal version ids on any root, whatever
    build id (random, one per build) published them."""
    files = {rel: meta["sha256"] for rel, meta in manifest.get("files", {}).items()}
    return hashlib.sha256(canonical_json(files).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class VersionInfo:
    stage: str
    version: str
    path: str  # where it is published: a directory, or an s3:// URL
    manifest: dict  # checked against the manifest schema; {} for a damaged version
    damage: str = ""  # why its manifest is damage (listings show it; every other reader skips it)

    @property
    def size_bytes(self) -> int:
        return sum(f["size"] for f in self.manifest.get("files", {}).values())


class Versions:
    """The published versions under one artifact root (see :class:`tasks.store.artifacts.ArtifactStore`)."""

    def __init__(self, root: str | os.PathLike | None = None, stages: Sequence[str] = ()) -> None:
        """``stages``: the stages the root holds, in the order they run; only whole-root listings need them."""
        self.files = open_files(absolute_root(root if root is not None else default_root()))
        self.root: str = self.files.display  # what messages name: a directory or an s3:// URL
        self.remote = self.files.remote
        self.stages = tuple(stages)

    # ---- names -------------------------------------------------------------------------------
    def _stage_key(self, stage: str) -> str:
        if not STAGE_NAME_RE.fullmatch(stage) or (self.stages and stage not in self.stages):
            known = f"; stages are {', '.join(self.stages)}" if self.stages else ""
            raise ValueError(f"unknown stage {stage!r}{known}")
        return stage

    def _version_key(self, stage: str, version: str) -> str:
        if not VERSION_RE.fullmatch(version):
            raise ValueError(
                f"{version!r} is not a version id (12 hex digits, as `wiki-pipeline artifacts` lists them)"
            )
        return f"{self._stage_key(stage)}/{version}"

    def _lock_key(self, stage: str, version: str) -> str:
        return f"{self._stage_key(stage)}/.locks/{version}.lock"

    def _staging_key(self, stage: str, version: str) -> str:
        return f"{self._stage_key(stage)}/.staging/{version}"

    def _all_stages(self) -> tuple[str, ...]:
        if not self.stages:
            raise ValueError(
                "this ArtifactStore was opened without its stages; open it with "
                "tasks.registry.open_store to list the whole root"
            )
        return self.stages

    def stage_dir(self, stage: str) -> Path:
        """The stage's local folder: under the root, or under an object-store root's local cache."""
        return self.files.local / self._stage_key(stage)

    def location(self, stage: str, version: str) -> str:
        """Where ``stage/version`` is published: its directory, or its ``s3://`` URL."""
        return self.files.where(self._version_key(stage, version))

    def version_path(self, stage: str, version: str) -> Path:
        return self.files.path(self._version_key(stage, version))

    def staging_path(self, stage: str, version: str) -> Path:
        return self.files.local / self._staging_key(stage, version)

    # ---- reading -----------------------------------------------------------------------------
    def read_manifest(self, stage: str, version: str) -> dict | None:
        """The manifest of the published ``stage/version``, or None when there is none or it is damaged."""
        return self.checked_manifest(stage, version)[0]

    def checked_manifest(self, stage: str, version: str) -> tuple[dict | None, str | None]:
        """``(manifest, None)`` for a manifest the schema accepts (``manifest_schema``), ``(None, None)`` when
        there is none, ``(None, why)`` when it is damage: unreadable, or a field missing or of another type."""
        key = self._version_key(stage, version)
        try:
            text = self.files.read_manifest(key)
        except UnreadableManifest as exc:
            return None, f"{MANIFEST} in {self.files.where(key)} is damaged: {exc}"
        if text is None:
            return None, None
        manifest = parse_manifest(text)
        problem = "it is not a JSON object" if manifest is None else manifest_problem(manifest, stage, version)
        if problem:
            return None, f"{MANIFEST} in {self.files.where(key)} is damaged: {problem}"
        return manifest, None

    def verify(self, stage: str, version: str, full: bool = False) -> tuple[bool, str]:
        """``(ok, reason)`` of :meth:`intact_manifest`."""
        manifest, reason = self.intact_manifest(stage, version, full)
        return manifest is not None, reason

    def intact_manifest(self, stage: str, version: str, full: bool = False) -> tuple[dict | None, str]:
        """``(manifest, "ok")`` when every file the manifest lists is there with its size (``full``: its sha256)
        and no other is (in its folder, where it names one: other builds' folders are gc's); else
        ``(None, "missing")`` or ``(None, what is wrong)``."""
        key = self._version_key(stage, version)
        where = self.files.where(key)
        present = self.files.files(key)
        if not present:
            return None, "missing"
        manifest, damage = self.checked_manifest(stage, version)
        if manifest is None:
            return None, damage or f"{MANIFEST} is missing in {where}"
        links = self.files.links(key)
        if links:
            shown = ", ".join(map(repr, links[:5]))
            return None, f"{where} holds symbolic links ({shown}); a version holds only regular files"
        files, prefix = manifest["files"], files_prefix(manifest) or ""
        if prefix:
            present = {rel[len(prefix) :]: size for rel, size in present.items() if rel.startswith(prefix)}
        for rel, meta in sorted(files.items()):
            size = present.get(rel)
            if size is None:
                return None, f"{rel!r} is missing"
            if size != meta.get("size"):
                return None, f"{rel!r} is {size} bytes, manifest says {meta.get('size')}"
            if full and self.files.sha256(f"{key}/{prefix}{rel}") != meta.get("sha256"):
                return None, f"{rel!r} does not match its sha256 in the manifest"
        stray = sorted(set(present) - set(files) - {MANIFEST})
        if stray:
            return None, f"unexpected file(s) not in the manifest: {', '.join(map(repr, stray[:5]))}"
        return manifest, "ok"

    def get(self, stage: str, version: str) -> VersionInfo:
        """The published ``stage/version``: FileNotFoundError when there is none, UserError when it is damaged."""
        manifest, damage = self.checked_manifest(stage, version)
        if damage:
            raise UserError(f"{stage}/{version} is damaged ({damage}); the next run that needs it rebuilds it")
        if manifest is None:
            raise FileNotFoundError(f"no published version {stage}/{version} under {self.root}")
        return VersionInfo(stage, version, self.location(stage, version), manifest)

    def versions(self, stage: str | None = None, damaged: bool = False) -> list[VersionInfo]:
        """Published versions (those with a manifest the schema accepts), oldest first; with ``damaged`` those
        whose manifest is damage too (``VersionInfo.damage`` says why; listed first in their stage)."""
        found = []
        order = self._all_stages() if stage is None else (stage,)
        for st in order:
            for name in self.files.subdirs(self._stage_key(st)):
                if name.startswith(".") or not VERSION_RE.fullmatch(name):
                    continue
                manifest, damage = self.checked_manifest(st, name)
                if manifest is not None:
                    found.append(VersionInfo(st, name, self.location(st, name), manifest))
                elif damage and damaged:
                    found.append(VersionInfo(st, name, self.location(st, name), {}, damage))
        return sorted(found, key=lambda v: (order.index(v.stage), v.manifest.get("created_at", "")))

    def file_location(self, stage: str, version: str, rel: str) -> str:
        """Where the file ``rel`` of the published ``stage/version`` lies: a path, or an ``s3://`` URL."""
        manifest = self.get(stage, version).manifest
        prefix = files_prefix(manifest)
        if prefix is None or not safe_rel(rel):
            raise UserError(f"{self.location(stage, version)}: its manifest does not say where {rel!r} lies")
        return self.files.where(f"{self._version_key(stage, version)}/{prefix}{rel}")

    def fetch_bytes(self, stage: str, version: str, rel: str, folder: Path, manifest: dict | None = None) -> bytes:
        """The bytes of the file ``rel`` of the published ``stage/version``, read once and checked against its
        size and sha256 in the manifest before anyone reads them: what the caller gets is exactly what was hashed,
        so a change to the file after the check cannot reach it; ``UserError`` naming the file when it does not
        match (training must never read a damaged shard). ``manifest``: the version's, where the caller has it
        (one read for many files); ``folder``: where an object store's download goes (deleted here)."""
        key, meta, manifest = self._file_key(stage, version, rel, manifest)
        cached = self._from_cache(stage, version, rel, manifest, meta)
        if cached is not None:
            return cached
        folder.mkdir(parents=True, exist_ok=True)
        local = self.files.fetch(key, folder / f".{Path(rel).name}.{uuid.uuid4().hex[:8]}.part")
        try:
            data = local.read_bytes()
            problem = self._mismatch(meta, len(data), lambda: hashlib.sha256(data).hexdigest())
        except OSError as exc:
            data, problem = b"", f"it cannot be read ({exc.strerror or exc})"
        finally:
            if self.remote:
                local.unlink(missing_ok=True)
        self._refuse(stage, version, key, problem)
        return data

    def _file_key(self, stage: str, version: str, rel: str, manifest: dict | None) -> tuple[str, dict, dict]:
        manifest = manifest if manifest is not None else self.get(stage, version).manifest
        prefix, meta = files_prefix(manifest), manifest["files"].get(rel)
        if prefix is None or not safe_rel(rel) or not isinstance(meta, dict):
            raise UserError(f"{self.location(stage, version)}: its manifest does not list {rel!r}")
        return f"{self._version_key(stage, version)}/{prefix}{rel}", meta, manifest

    def _from_cache(self, stage: str, version: str, rel: str, manifest: dict, meta: dict) -> bytes | None:
        """The bytes of ``rel`` from this machine's copy of the version's build (``Files.cached``) when they are
        the manifest's (size and sha256), read once; else None (the caller downloads). Why: on an object store a
        stage reads what the one before it published from this machine without downloading the bytes it sent.
        What is opened is checked before a byte is read: a file of another size, or not a regular file (a link,
        a pipe, a device), is never read (it could be huge, or never end)."""
        path = self.files.cached(self._version_key(stage, version), rel, str(manifest.get("build_id")))
        if path is None:
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))  # a pipe: no wait
        except OSError:
            return None
        with open(fd, "rb") as f:
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_size != meta.get("size"):
                    return None
                data = f.read(st.st_size + 1)  # a file grown since is refused by its length below
            except OSError:
                return None
        return None if self._mismatch(meta, len(data), lambda: hashlib.sha256(data).hexdigest()) else data

    @staticmethod
    def _mismatch(meta: dict, size: int, sha256) -> str | None:
        if size != meta.get("size"):
            return f"it is {size:,} bytes, the manifest says {meta.get('size'):,}"
        return "its sha256 is not the manifest's" if sha256() != meta.get("sha256") else None

    def _refuse(self, stage: str, version: str, key: str, problem: str | None) -> None:
        if problem:
            raise UserError(
                f"{self.files.where(key)} does not match the manifest of {stage}/{version} ({problem}): it was "
                f"changed after publication; rerun with force for {stage} to rebuild it"
            )

    def local_copy(self, stage: str, version: str, full: bool = False) -> Path:
        """A local directory holding ``stage/version`` for a build to read (see :meth:`Files.local_copy`)."""
        return self.files.local_copy(self._version_key(stage, version), full)

    def pull(self, stage: str, version: str, dest: Path) -> VersionInfo:
        """Copy exactly the files the manifest of ``stage/version`` lists, and the manifest, into the new (or
        empty) directory ``dest``, each checked against its sha256 as it is copied, appearing by one rename. The
        destination is checked before anything is read; a damaged version (a symbolic link in it included:
        followed, it would hand out a file from anywhere on this machine) is refused."""
        what = f"{stage}/{version}"
        dest = check_destination(Path(dest), what)
        manifest, reason = self.intact_manifest(stage, version)
        if manifest is None and reason == "missing":
            raise FileNotFoundError(f"no published version {what} under {self.root}")
        if manifest is None:
            raise UserError(f"{what} under {self.root} is damaged ({reason}); rerun with force for {stage}")
        source = self.local_copy(stage, version, full=True)  # a cached copy edited since is fetched again
        made = [p for p in (dest.parent, *dest.parent.parents) if not p.exists()]
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            partial.mkdir()
            for rel, meta in sorted(manifest["files"].items()):
                copy_checked(source, rel, meta, partial / rel, what)
            (partial / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            if dest.exists():
                dest.rmdir()
            os.rename(partial, dest)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            for p in made:  # the parents this copy made, innermost first: nothing half-written left
                with contextlib.suppress(OSError):
                    p.rmdir()
            raise
        return VersionInfo(stage, version, self.location(stage, version), manifest)

    # ---- locks -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, stage: str, version: str, on_wait=None) -> Iterator[None]:
        """Hold the version's build lock; waits (calling ``on_wait`` once) while another builds or reads it."""
        with self.files.locked(self._lock_key(stage, version), on_wait=on_wait) as taken:
            assert taken
            yield

    @contextlib.contextmanager
    def pin(self, stage: str, version: str, on_wait=None) -> Iterator[None]:
        """Hold the version's lock shared while a build reads it: no builder replaces it and gc keeps it."""
        with self.files.locked(self._lock_key(stage, version), shared=True, on_wait=on_wait) as taken:
            assert taken
            yield

    @contextlib.contextmanager
    def try_lock(self, stage: str, version: str) -> Iterator[bool]:
        """Take the version's build lock unless another holds or reads it; yields whether it was taken."""
        with self.files.locked(self._lock_key(stage, version), wait=False) as taken:
            yield taken

    def is_locked(self, stage: str, version: str) -> bool:
        """Whether a run builds or reads ``stage/version`` right now."""
        if not self.files.lock_exists(self._lock_key(stage, version)):
            return False
        with self.try_lock(stage, version) as taken:
            return not taken

    def _unlink_lock(self, stage: str, version: str) -> None:
        """Delete the version's lock file; only while holding it exclusively."""
        self.files.unlink_lock(self._lock_key(stage, version))

    # ---- taking away -------------------------------------------------------------------------
    def discard(self, stage: str, version: str, reason: str) -> None:
        """Take a published (damaged or replaced) version away for every reader at once, then delete it."""
        lock = self._lock_key(stage, version)
        if self.files.discard(self._version_key(stage, version), lambda: self.files.check_held(lock)):
            log.info("discarded %s/%s (%s)", stage, version, reason)

    def drop_staging(self, stage: str, version: str) -> None:
        """Delete the staging area of ``stage/version``, local and kept (call under ``lock``, once published);
        kept while another run holds the lock this one lost (its resume state, now)."""
        try:
            self.files.check_held(self._lock_key(stage, version))
        except UserError:
            log.warning(
                "%s/%s: this run's lock was taken over; its staging is left to the run holding it", stage, version
            )
            return
        shutil.rmtree(self.staging_path(stage, version), ignore_errors=True)
        self.files.delete(self._staging_key(stage, version))  # an object store's copy (a directory's: gone now)
