"""The artifact store: versioned, immutable, atomically published stage outputs.

Layout under the root (``artifacts/`` by default, ``WIKI_PIPELINE_ARTIFACTS`` or an explicit path, or an
``s3://bucket/prefix``)::

    <root>/<stage>/<version>/...files...   a published version; manifest.json is written last
    <root>/<stage>/.staging/<version>/     a build in progress: out/ (to publish) and work/ (resume state)
    <root>/<stage>/.locks/<version>.lock   one builder per version at a time; builds hold their inputs'
                                           shared (so gc keeps them); gc deletes it
    <root>/<stage>/.trash/                 damaged or replaced versions, moved aside before deletion (local)

This module holds the rules (version ids, manifests, verification, what is stale, what is garbage, the build
and its publication), once for both kinds of root; the files side is :class:`tasks.store.posix.PosixFiles`
(a directory: ``os.rename`` publication, ``flock`` locks) or :class:`tasks.store.s3.ObjectFiles` (object
storage: manifest uploaded last, leases taken with conditional writes, a local cache for builds and inputs).

A version id is a short hash of the stage name, its settings, its inputs (each upstream version plus
that version's build id, so rebuilding an upstream stage gives new downstream versions) and the stage's
code version. A version appears only complete: its files first, its manifest last (on a
directory, one ``os.rename`` of the fsynced staging ``out/``; on object storage, the manifest's upload), and
reuse verifies it against the manifest, so a reader never takes a half-built version.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mygpt.atomic import atomic_write_text, sha256_file
from mygpt.errors import UserError
from tasks.store.posix import PosixFiles
from tasks.store.s3 import ObjectFiles, is_object_url, normal_url, safe_rel

MANIFEST = "manifest.json"
_STAGE_NAME_RE = re.compile(r"[a-z][a-z0-9_]*")  # a stage's folder: a plain name, never a path
_VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # a version id (12 hex digits, see version_id)
#: A whole download a stage made to learn a source's sha256 (``SourceIndex.download_path``) and its facts.
_DOWNLOAD_RE = re.compile(r"[0-9a-f]{32}\.zip(?:\.facts\.json)?")
MANIFEST_FORMAT = 1
ENV_ROOT = "WIKI_PIPELINE_ARTIFACTS"
REPO_ROOT = Path(__file__).resolve().parents[2]

log = logging.getLogger("wiki_pipeline.store")


def default_root() -> str:
    """``$WIKI_PIPELINE_ARTIFACTS`` if set, else ``artifacts/`` in the repository."""
    root = os.environ.get(ENV_ROOT, "").strip()
    if is_object_url(root):
        try:
            normal_url(root)
        except ValueError as exc:
            raise UserError(f"{ENV_ROOT}: {exc}") from None
    return root or str(REPO_ROOT / "artifacts")


def absolute_root(root: str | os.PathLike) -> str:
    """An artifact root as the store names it: an absolute path, or ``s3://bucket/prefix`` as written."""
    text = os.fspath(root)
    if is_object_url(text):
        try:
            return normal_url(text)
        except ValueError as exc:
            shown = re.sub(r"//[^/@]*@", "//***@", text).replace("\n", "\\n")  # never echo credentials
            raise UserError(f"artifact root {shown}: {exc}") from None
    if re.match(r"(?i)s3:(?!//)", text.strip()):
        raise UserError(f"artifact root {text}: an object-store root is written s3://bucket/prefix")
    return os.path.abspath(os.path.expanduser(text))


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def version_id(
    stage: str, settings: dict, inputs: dict[str, str], code_version: str, source: dict | None = None
) -> str:
    """12 hex digits of sha256 over the stage, its settings, its inputs' ids, its code version and, for a stage
    that reads from outside the store (the corpus), the identity of what it reads (``source``)."""
    ingredients = {"stage": stage, "settings": settings, "inputs": inputs, "code": code_version}
    if source is not None:
        ingredients["source"] = source
    return hashlib.sha256(canonical_json(ingredients).encode("utf-8")).hexdigest()[:12]


def _is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


@dataclass(frozen=True)
class VersionInfo:
    stage: str
    version: str
    path: str  # where it is published: a directory, or an s3:// URL
    manifest: dict

    @property
    def size_bytes(self) -> int:
        return sum(f["size"] for f in self.manifest.get("files", {}).values())


class ArtifactStore:
    """One artifact root. All stages read and publish through this class."""

    def __init__(self, root: str | os.PathLike | None = None, stages: Sequence[str] = ()) -> None:
        """``stages``: the stages this root holds, in the order they run (``tasks.registry.open_store`` passes
        them). Reading, building and publishing one stage's versions need none; the listings of the whole root
        (:meth:`versions` of every stage, :meth:`garbage`, :meth:`stale_versions`) need them."""
        where = absolute_root(root if root is not None else default_root())
        self.files: PosixFiles | ObjectFiles = ObjectFiles(where) if is_object_url(where) else PosixFiles(Path(where))
        if isinstance(self.files, ObjectFiles):
            self.files.check_bucket()  # a misspelt bucket is one clear line, not an empty listing or a wait
        self.root: str = self.files.display  # what messages name: a directory or an s3:// URL
        self.remote = self.files.remote
        self.stages = tuple(stages)

    # ---- names -------------------------------------------------------------------------------
    def _stage_key(self, stage: str) -> str:
        if not _STAGE_NAME_RE.fullmatch(stage) or (self.stages and stage not in self.stages):
            known = f"; stages are {', '.join(self.stages)}" if self.stages else ""
            raise ValueError(f"unknown stage {stage!r}{known}")
        return stage

    def _version_key(self, stage: str, version: str) -> str:
        if not _VERSION_RE.fullmatch(version):
            raise ValueError(
                f"{version!r} is not a version id (12 hex digits, as `wiki-pipeline artifacts` lists them)"
            )
        return f"{self._stage_key(stage)}/{version}"

    def _lock_key(self, stage: str, version: str) -> str:
        return f"{self._stage_key(stage)}/.locks/{version}.lock"

    def _staging_key(self, stage: str, version: str) -> str:
        return f"{self._stage_key(stage)}/.staging/{version}"

    def stage_dir(self, stage: str) -> Path:
        """The stage's local folder: under the root, or for an object-store root under its local cache."""
        return self.files.local / self._stage_key(stage)

    def _all_stages(self) -> tuple[str, ...]:
        if not self.stages:
            raise ValueError(
                "this ArtifactStore was opened without its stages; open it with "
                "tasks.registry.open_store to list the whole root"
            )
        return self.stages

    def location(self, stage: str, version: str) -> str:
        """Where ``stage/version`` is published: its directory, or its ``s3://`` URL."""
        return self.files.where(self._version_key(stage, version))

    def version_path(self, stage: str, version: str) -> Path:
        """The local directory of ``stage/version``: the version itself, or for an object-store root its place
        in the local cache (see :meth:`local_copy`)."""
        return self.files.path(self._version_key(stage, version))

    def staging_path(self, stage: str, version: str) -> Path:
        return self.files.local / self._staging_key(stage, version)

    def lock_path(self, stage: str, version: str) -> Path:
        return self.files.local / self._lock_key(stage, version)

    def local_copy(self, stage: str, version: str, full: bool = False) -> Path:
        """A local directory holding the published ``stage/version`` (for a build to read): the version itself,
        or a copy in the local cache, downloaded and checked against the manifest's sha256s (a cached copy is
        checked by size, and with ``full`` by sha256 too: downloaded again when it does not match)."""
        key = self._version_key(stage, version)
        if isinstance(self.files, PosixFiles):
            return self.files.path(key)
        manifest = self.read_manifest(stage, version)
        if manifest is None:
            raise FileNotFoundError(f"no published version {stage}/{version} under {self.root}")
        return self.files.local_copy(key, manifest, full)

    def pull(self, stage: str, version: str, dest: Path) -> VersionInfo:
        """Copy the published ``stage/version`` into the new (or empty) local directory ``dest``: every file checked
        against its sha256 in the manifest, the manifest written last, ``dest`` appearing by one rename."""
        info = self.get(stage, version)
        dest = Path(dest).expanduser().absolute()
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise UserError(
                f"{dest} exists and is not an empty directory; give a new directory to copy {stage}/{version} into"
            )
        source = self.local_copy(stage, version, full=True)  # a cached copy edited since is fetched again
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            shutil.copytree(source, partial)
            for rel, meta in info.manifest.get("files", {}).items():
                if sha256_file(partial / rel) != meta.get("sha256"):
                    raise UserError(
                        f"{stage}/{version}: {rel} does not match its sha256 in the manifest; rerun with force"
                    )
            if dest.exists():
                dest.rmdir()
            os.rename(partial, dest)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        return info

    # ---- reading -----------------------------------------------------------------------------
    def read_manifest(self, stage: str, version: str) -> dict | None:
        text = self.files.read_text(f"{self._version_key(stage, version)}/{MANIFEST}")
        if text is None:
            return None
        try:
            manifest = json.loads(text)
        except json.JSONDecodeError:
            return None
        return manifest if isinstance(manifest, dict) else None

    def verify(self, stage: str, version: str, full: bool = False) -> tuple[bool, str]:
        """Check a published version. Returns (ok, reason); reason is "ok", "missing" or what is wrong
        (see :meth:`verified`)."""
        manifest, reason = self.verified(stage, version, full)
        return manifest is not None, reason

    def verified(self, stage: str, version: str, full: bool = False) -> tuple[dict | None, str]:
        """Check a published version: ``(its manifest, "ok")``, or ``(None, reason)`` with reason "missing" or
        what is wrong. Reuse reads the manifest once, here.

        Quick check: manifest present and well-formed, every listed file present with its size, no stray
        files. ``full=True`` also recomputes every file's sha256.
        """
        key = self._version_key(stage, version)
        where = self.files.where(key)
        present = self.files.files(key)
        if not present:
            return None, "missing"
        manifest = self.read_manifest(stage, version)
        if manifest is None:
            return None, f"{MANIFEST} is missing or unreadable in {where}"
        if manifest.get("stage") != stage or manifest.get("version") != version:
            return None, f"{MANIFEST} in {where} names {manifest.get('stage')}/{manifest.get('version')}"
        files = manifest.get("files")
        if not isinstance(files, dict):
            return None, f"{MANIFEST} in {where} has no file list"
        for rel, meta in sorted(files.items()):
            if not safe_rel(rel) or not isinstance(meta, dict):
                return None, f"{MANIFEST} in {where} lists {rel!r}, which is not a file of the version"
            size = present.get(rel)
            if size is None:
                return None, f"{rel} is missing"
            if size != meta.get("size"):
                return None, f"{rel} is {size} bytes, manifest says {meta.get('size')}"
            if full and self.files.sha256(f"{key}/{rel}") != meta.get("sha256"):
                return None, f"{rel} does not match its sha256 in the manifest"
        stray = sorted(set(present) - set(files) - {MANIFEST})
        if stray:
            return None, f"unexpected file(s) not in the manifest: {', '.join(stray[:5])}"
        return manifest, "ok"

    def get(self, stage: str, version: str) -> VersionInfo:
        manifest = self.read_manifest(stage, version)
        if manifest is None:
            raise FileNotFoundError(f"no published version {stage}/{version} under {self.root}")
        return VersionInfo(stage, version, self.location(stage, version), manifest)

    def versions(self, stage: str | None = None) -> list[VersionInfo]:
        """Published versions (those with a manifest), oldest first."""
        found = []
        order = self._all_stages() if stage is None else (stage,)
        for st in order:
            for name in self.files.subdirs(self._stage_key(st)):
                if name.startswith(".") or not _VERSION_RE.fullmatch(name):
                    continue
                manifest = self.read_manifest(st, name)
                if manifest is not None:
                    found.append(VersionInfo(st, name, self.location(st, name), manifest))
        return sorted(found, key=lambda v: (order.index(v.stage), v.manifest.get("created_at", "")))

    # ---- writing -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, stage: str, version: str, on_wait=None) -> Iterator[None]:
        """Hold the per-version build lock. Blocks (calling ``on_wait`` once) while another holds it or reads the
        version (:meth:`pin`)."""
        with self.files.locked(self._lock_key(stage, version), on_wait=on_wait) as taken:
            assert taken
            yield

    @contextlib.contextmanager
    def pin(self, stage: str, version: str, on_wait=None) -> Iterator[None]:
        """Hold a shared lock on ``stage/version`` while a build reads it: many readers at once, but no builder
        replaces it and ``gc`` (:meth:`collect`) keeps it meanwhile. Blocks (calling ``on_wait`` once) while a
        builder or ``gc`` holds the version's lock."""
        with self.files.locked(self._lock_key(stage, version), shared=True, on_wait=on_wait) as taken:
            assert taken
            yield

    @contextlib.contextmanager
    def try_lock(self, stage: str, version: str) -> Iterator[bool]:
        """Take the per-version build lock if nobody holds or reads it; yields whether it was taken (never waits)."""
        with self.files.locked(self._lock_key(stage, version), wait=False) as taken:
            yield taken

    def _unlink_lock(self, stage: str, version: str) -> None:
        """Delete the version's lock file; call only while holding it exclusively."""
        self.files.unlink_lock(self._lock_key(stage, version))

    def discard(self, stage: str, version: str, reason: str) -> None:
        """Take a published (damaged or replaced) version away atomically (readers no longer see it), then delete
        it."""
        if self.files.discard(self._version_key(stage, version)):
            log.info("discarded %s/%s (%s)", stage, version, reason)

    def open_build(self, stage: str, version: str) -> Build:
        """Staging area for building ``stage/version``. Call under ``lock``. Survives crashes for resume."""
        return Build(self, stage, version)

    def drop_staging(self, stage: str, version: str) -> None:
        """Delete the staging area of ``stage/version`` (call under ``lock``, once the version is published): the
        local one and, for an object-store root, the uploaded resume state."""
        shutil.rmtree(self.staging_path(stage, version), ignore_errors=True)
        if self.remote:
            self.files.delete(self._staging_key(stage, version))

    # ---- what no run will use ----------------------------------------------------------------
    def stale_versions(
        self, code_versions: dict[str, str], versions: list[VersionInfo] | None = None
    ) -> dict[tuple[str, str], str]:
        """``{(stage, version): why}`` for the published versions that no run can reuse any more: built by an
        older code version of their stage (``code_versions``: each stage's current one), or from an input
        version that was rebuilt, deleted or is stale itself (a version id names its inputs' build ids).
        ``versions``: the whole root's listing (:meth:`versions`) when the caller has it, so each manifest is
        read once."""
        listing = self.versions() if versions is None else versions
        manifests = {(v.stage, v.version): v.manifest for v in listing}
        stale: dict[tuple[str, str], str] = {}
        for v in listing:  # stage order: an input's verdict is known before its users'
            code = code_versions.get(v.stage)
            if code is not None and str(v.manifest.get("code_version")) != str(code):
                stale[(v.stage, v.version)] = (
                    f"built by {v.stage} code version {v.manifest.get('code_version')}; "
                    f"the code is at version {code}, so no run reuses it"
                )
                continue
            for name, ref in sorted((v.manifest.get("inputs") or {}).items()):
                why = _input_problem(name, ref, manifests, stale)
                if why:
                    stale[(v.stage, v.version)] = f"{why}, so no run reuses it"
                    break
        return stale

    def garbage(self, code_versions: dict[str, str] | None = None) -> list[Garbage]:
        """What no run needs: staging areas (unfinished builds, leftovers of published ones), interrupted
        deletions in ``.trash``, lock files of nothing, downloads no build took, and with ``code_versions`` the
        stale published versions (:meth:`stale_versions`). For an object-store root, the local cache's copies and
        staging areas too."""
        found: list[Garbage] = []
        places = [(self.files, "")] if not self.remote else [(self.files, ""), (PosixFiles(self.files.local), "cache")]
        for files, where in places:
            for st in self._all_stages():
                found.extend(self._garbage_of(files, where, st))
        if self.remote:  # downloads a killed process left (not those of the last 10 minutes: one may be running)
            cache = PosixFiles(self.files.local)
            for name in cache.subdirs(".incoming"):
                size, newest = cache.usage(f".incoming/{name}")
                if time.time() - newest > 600:
                    why = "an interrupted download into this machine's cache"
                    found.append(
                        Garbage(f".incoming/{name}", cache.where(f".incoming/{name}"), "", "", size, why, local=True)
                    )
        found.extend(self._untaken_downloads())
        if code_versions is not None:
            for (st, version), why in self.stale_versions(code_versions).items():
                key = self._version_key(st, version)
                found.append(
                    Garbage(
                        key,
                        self.files.where(key),
                        st,
                        version,
                        self.files.usage(key)[0],
                        f"stale: {why}",
                        self.is_locked(st, version),
                        published=True,
                    )
                )
        return found

    def _untaken_downloads(self) -> Iterator[Garbage]:
        """Whole downloads a stage made to learn a source's content identity (``<stage>/.sources/downloads/``,
        on this machine) that no build took, untouched for 10 minutes: a run stopped between the two, or a later
        download superseded them. Partial ones (``.part``) are left: a rerun resumes them."""
        local = PosixFiles(self.files.local)
        for st in self._all_stages():
            folder = f"{st}/.sources/downloads"
            if local.path(folder).is_symlink() or local.path(f"{st}/.sources").is_symlink():
                continue  # not a folder the stage made: not ours to judge or delete
            for name in local.names(folder):
                if not _DOWNLOAD_RE.fullmatch(name) or local.path(f"{folder}/{name}").is_symlink():
                    continue  # a name the stage never writes (an address's sha256): not ours
                key = f"{folder}/{name}"
                try:
                    info = local.path(key).stat()
                except FileNotFoundError:  # taken by a build meanwhile
                    continue
                if time.time() - info.st_mtime > 600:
                    why = "a download made to learn the source's sha256 that no build took"
                    yield Garbage(key, local.where(key), st, "", info.st_size, why, local=self.remote)

    def _garbage_of(self, files: PosixFiles | ObjectFiles, where: str, st: str) -> Iterator[Garbage]:
        local = where == "cache"
        suffix = " (in this machine's cache)" if local else ""
        for name in files.subdirs(f"{st}/.staging"):
            if not _VERSION_RE.fullmatch(name):
                continue  # not a version's staging (a stray key): not ours to judge or delete
            key = f"{st}/.staging/{name}"
            size, newest = files.usage(key)
            if self.read_manifest(st, name) is not None:
                why = f"leftover staging of the published {st}/{name} (a run stopped before deleting it)"
            else:
                when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(newest))
                why = f"unfinished build of {st}/{name}, last written {when}; a rerun with the same settings would "
                why += "resume from it"
            yield Garbage(key, files.where(key), st, name, size, why + suffix, self.is_locked(st, name), local=local)
        for name in files.subdirs(f"{st}/.trash"):
            key = f"{st}/.trash/{name}"
            why = "a discarded version whose deletion was interrupted"
            yield Garbage(key, files.where(key), st, "", files.usage(key)[0], why + suffix, local=local)
        if local:  # cached copies of published versions: fetched again when needed
            for name in files.subdirs(st):
                if _VERSION_RE.fullmatch(name):
                    key = f"{st}/{name}"
                    why = f"this machine's copy of {st}/{name} (downloaded again when a build needs it)"
                    in_use = self.is_locked(st, name)  # a build here may be reading it
                    yield Garbage(key, files.where(key), st, name, files.usage(key)[0], why, in_use, local=True)
            return
        for name in files.names(f"{st}/.locks"):
            version = name.removesuffix(".lock")
            if not name.endswith(".lock") or not _VERSION_RE.fullmatch(version):
                continue
            if not files.exists(f"{st}/{version}") and not files.exists(f"{st}/.staging/{version}"):
                key = f"{st}/.locks/{name}"
                why = f"the lock file of {st}/{version}, which is neither published nor being built"
                yield Garbage(key, files.where(key), st, version, 0, why, self.is_locked(st, version))

    def is_locked(self, stage: str, version: str) -> bool:
        """Whether a run holds the build lock of ``stage/version`` (or reads the version) right now."""
        if not self.files.lock_exists(self._lock_key(stage, version)):
            return False
        with self.try_lock(stage, version) as taken:
            return not taken

    def collect(self, item: Garbage) -> bool:
        """Delete one :meth:`garbage` item under its version's lock, and the lock file with it; False (and nothing
        deleted) when a run builds or reads that version."""
        files: PosixFiles | ObjectFiles = PosixFiles(self.files.local) if item.local else self.files
        if not item.version:
            files.delete(item.key)
            return True
        with self.try_lock(item.stage, item.version) as taken:
            if not taken:
                return False
            if item.published:
                self.discard(item.stage, item.version, item.reason)
            else:
                files.delete(item.key)
            if not self.files.exists(self._version_key(item.stage, item.version)):
                self._unlink_lock(item.stage, item.version)  # under the lock
            return True


@dataclass(frozen=True)
class Garbage:
    """Something under an artifact root that no run needs (see :meth:`ArtifactStore.garbage`)."""

    key: str  # relative to the root (or, with ``local``, to the root's local cache)
    where: str  # the full path or URL, for messages
    stage: str
    version: str  # the version whose build lock guards it ("" for .trash entries and cached copies)
    bytes: int
    reason: str
    in_use: bool = False  # a run held its lock when it was listed
    published: bool = False  # a stale published version (not a staging or trash dir)
    local: bool = False  # in the local cache of an object-store root


def _input_problem(name: str, ref: dict, manifests: dict, stale: dict) -> str | None:
    """Why the input ``name`` (``ref``: its lineage in a manifest) makes its user stale, or None."""
    key = (name, ref.get("version", ""))
    if key not in manifests:
        return f"its input {name}/{key[1]} is no longer published"
    if manifests[key].get("build_id") != ref.get("build_id"):
        return f"its input {name}/{key[1]} was rebuilt since"
    if key in stale:
        return f"its input {name}/{key[1]} is stale"
    return None


def dir_bytes(path: Path) -> int:
    """Bytes of the files under the local directory ``path`` (0 when it is gone)."""
    return PosixFiles(path).usage("")[0]


class Build:
    """A version being built: ``out/`` becomes the version on publish; ``work/`` is scratch/resume state.

    Both are local directories (under the root, or the local cache of an object-store root). For an object-store
    root, :meth:`save` uploads the files a stage names as its resume state, and a build that finds no local
    staging downloads what an earlier attempt (on any machine) saved."""

    def __init__(self, store: ArtifactStore, stage: str, version: str) -> None:
        self.store, self.stage, self.version = store, stage, version
        self.dir = store.staging_path(stage, version)
        self.out = self.dir / "out"
        self.work = self.dir / "work"
        self._remote_key = store._staging_key(stage, version)
        # An earlier attempt that died leaves its staging dir: a stage may resume from it.
        self.resumed = self.dir.exists() and any(self.dir.rglob("*"))
        if not self.resumed and isinstance(store.files, ObjectFiles):
            fetched = store.files.download_tree(self._remote_key, self.dir)
            self.resumed = fetched > 0
            if fetched:
                log.info(
                    "%s/%s: fetched %d file(s) of an interrupted build from %s",
                    stage,
                    version,
                    fetched,
                    store.files.where(self._remote_key),
                )
        for d in (self.out, self.work):
            d.mkdir(parents=True, exist_ok=True)
        self._sweep_temp_files()
        # A publish killed after writing the manifest but before the rename leaves out/manifest.json; the
        # rebuild writes a new one (and publish refuses a manifest it did not write).
        (self.out / MANIFEST).unlink(missing_ok=True)

    def _sweep_temp_files(self) -> None:
        """Remove half-written temp files that a killed writer left (their real targets are intact)."""
        for p in self.dir.rglob("*"):
            if p.is_file() and _is_temp_name(p.name):
                p.unlink(missing_ok=True)

    def save(self, *paths: Path) -> None:
        """Mark ``paths`` (files under ``out/`` or ``work/``) as resume state: for an object-store root, upload
        them to the build's staging prefix, so a rerun on another machine resumes from them (a file that is gone
        is deleted there). Nothing to do on a local root, where the staging area already is the resume state."""
        files = self.store.files
        if not isinstance(files, ObjectFiles):
            return
        for path in paths:
            rel = Path(path).absolute().relative_to(self.dir.absolute()).as_posix()
            if Path(path).is_file():
                files.upload(Path(path), f"{self._remote_key}/{rel}")
            else:
                files.delete(f"{self._remote_key}/{rel}")

    def reset(self) -> None:
        """Throw away everything an earlier attempt left (for stages that cannot resume)."""
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.store.remote:
            self.store.files.delete(self._remote_key)
        for d in (self.out, self.work):
            d.mkdir(parents=True, exist_ok=True)
        self.resumed = False

    def publish(
        self,
        *,
        settings: dict,
        inputs: dict[str, dict],
        code_version: str,
        metrics: dict | None = None,
        timings: dict | None = None,
        extra: dict | None = None,
        fault=None,
    ) -> dict:
        """Write the manifest of ``out/`` last, publish it (:meth:`PosixFiles.place`: fsync and rename;
        :meth:`ObjectFiles.place`: upload, manifest last), drop the staging area.

        ``fault`` (test hook, see ``tasks.core.stage.fault_point``) is called with ``"publish"`` when the version's
        files are in place but its manifest is not yet visible, and with ``"published"`` once it is, before the
        staging area is deleted."""
        self._sweep_temp_files()
        files: dict[str, dict] = {}
        for p in sorted(self.out.rglob("*")):
            if p.is_dir():
                continue
            rel = p.relative_to(self.out).as_posix()
            if rel == MANIFEST:
                raise RuntimeError(f"stage {self.stage} must not write its own {MANIFEST}")
            files[rel] = {"size": p.stat().st_size, "sha256": sha256_file(p)}
        manifest = {
            "format": MANIFEST_FORMAT,
            "stage": self.stage,
            "version": self.version,
            "build_id": uuid.uuid4().hex[:12],
            "code_version": code_version,
            "settings": settings,
            "inputs": inputs,
            "files": files,
            "metrics": metrics or {},
            "timings": timings or {},
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": socket.gethostname(),
            **(extra or {}),
        }
        atomic_write_text(self.out / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n")
        store = self.store
        lock_key = store._lock_key(self.stage, self.version)
        store.files.check_held(lock_key)
        key = store._version_key(self.stage, self.version)
        if store.files.exists(key):
            store.discard(self.stage, self.version, "replaced by a rebuild")
        store.files.place(self.out, key, fault, still_held=lambda: store.files.check_held(lock_key))
        if fault:
            fault("published")
        store.drop_staging(self.stage, self.version)
        return manifest
