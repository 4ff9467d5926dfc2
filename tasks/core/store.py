"""The artifact store: versioned, immutable, atomically published stage outputs.

Layout under the root (``artifacts/`` by default, ``WIKI_PIPELINE_ARTIFACTS`` or an explicit path)::

    <root>/<stage>/<version>/...files...   a published version; manifest.json is written last
    <root>/<stage>/.staging/<version>/     a build in progress: out/ (to publish) and work/ (resume state)
    <root>/<stage>/.locks/<version>.lock   one builder per version at a time (fcntl lock, freed on SIGKILL);
                                           builds hold their inputs' shared (so gc keeps them); gc deletes it
    <root>/<stage>/.trash/                 damaged or replaced versions, moved aside before deletion

A version id is a short hash of the stage name, its settings, its inputs (each upstream version plus
that version's build id, so rebuilding an upstream stage gives new downstream versions) and the stage's
code version. A version directory appears only through one ``os.rename`` of a complete staging
``out/`` directory whose files were fsynced and whose manifest was written last, so a reader never
sees a half-built version.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
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

from mygpt.atomic import atomic_write_text, fsync_dir, sha256_file

MANIFEST = "manifest.json"
_STAGE_NAME_RE = re.compile(r"[a-z][a-z0-9_]*")  # a stage's folder: a plain name, never a path
MANIFEST_FORMAT = 1
ENV_ROOT = "WIKI_PIPELINE_ARTIFACTS"
REPO_ROOT = Path(__file__).resolve().parents[2]

log = logging.getLogger("wiki_pipeline.store")


def default_root() -> Path:
    """``$WIKI_PIPELINE_ARTIFACTS`` if set, else ``artifacts/`` in the repository."""
    return Path(os.environ.get(ENV_ROOT) or REPO_ROOT / "artifacts")


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


def _flock(fh, how: int) -> bool:
    """``flock(fh, how)``; whether it was taken (False only when ``how`` has ``LOCK_NB`` and another holds it)."""
    try:
        fcntl.flock(fh, how)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return False
    return True


def _is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


@dataclass(frozen=True)
class VersionInfo:
    stage: str
    version: str
    path: Path
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
        self.root = Path(root) if root is not None else default_root()
        self.root = self.root.expanduser().absolute()
        self.stages = tuple(stages)

    # ---- paths -------------------------------------------------------------------------------
    def stage_dir(self, stage: str) -> Path:
        if not _STAGE_NAME_RE.fullmatch(stage) or (self.stages and stage not in self.stages):
            known = f"; stages are {', '.join(self.stages)}" if self.stages else ""
            raise ValueError(f"unknown stage {stage!r}{known}")
        return self.root / stage

    def _all_stages(self) -> tuple[str, ...]:
        if not self.stages:
            raise ValueError(
                "this ArtifactStore was opened without its stages; open it with "
                "tasks.registry.open_store to list the whole root"
            )
        return self.stages

    def version_path(self, stage: str, version: str) -> Path:
        return self.stage_dir(stage) / version

    def staging_path(self, stage: str, version: str) -> Path:
        return self.stage_dir(stage) / ".staging" / version

    # ---- reading -----------------------------------------------------------------------------
    def read_manifest(self, stage: str, version: str) -> dict | None:
        try:
            text = (self.version_path(stage, version) / MANIFEST).read_text(encoding="utf-8")
            manifest = json.loads(text)
        except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError, json.JSONDecodeError):
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
        path = self.version_path(stage, version)
        if not path.is_dir():
            return None, "missing"
        manifest = self.read_manifest(stage, version)
        if manifest is None:
            return None, f"{MANIFEST} is missing or unreadable in {path}"
        if manifest.get("stage") != stage or manifest.get("version") != version:
            return None, f"{MANIFEST} in {path} names {manifest.get('stage')}/{manifest.get('version')}"
        files = manifest.get("files")
        if not isinstance(files, dict):
            return None, f"{MANIFEST} in {path} has no file list"
        for rel, meta in sorted(files.items()):
            fpath = path / rel
            try:
                size = fpath.stat().st_size
            except FileNotFoundError:
                return None, f"{rel} is missing"
            if size != meta.get("size"):
                return None, f"{rel} is {size} bytes, manifest says {meta.get('size')}"
            if full and sha256_file(fpath) != meta.get("sha256"):
                return None, f"{rel} does not match its sha256 in the manifest"
        present = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()} - {MANIFEST}
        stray = sorted(present - set(files))
        if stray:
            return None, f"unexpected file(s) not in the manifest: {', '.join(stray[:5])}"
        return manifest, "ok"

    def get(self, stage: str, version: str) -> VersionInfo:
        manifest = self.read_manifest(stage, version)
        if manifest is None:
            raise FileNotFoundError(f"no published version {stage}/{version} under {self.root}")
        return VersionInfo(stage, version, self.version_path(stage, version), manifest)

    def versions(self, stage: str | None = None) -> list[VersionInfo]:
        """Published versions (those with a manifest), oldest first."""
        found = []
        order = self._all_stages() if stage is None else (stage,)
        for st in order:
            sdir = self.stage_dir(st)
            if not sdir.is_dir():
                continue
            for child in sdir.iterdir():
                if child.name.startswith(".") or not child.is_dir():
                    continue
                manifest = self.read_manifest(st, child.name)
                if manifest is not None:
                    found.append(VersionInfo(st, child.name, child, manifest))
        return sorted(found, key=lambda v: (order.index(v.stage), v.manifest.get("created_at", "")))

    # ---- writing -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, stage: str, version: str, on_wait=None) -> Iterator[None]:
        """Hold the per-version build lock. Blocks (calling ``on_wait`` once) while another holds it or reads the
        version (:meth:`pin`)."""
        with self._locked(stage, version, fcntl.LOCK_EX, on_wait) as taken:
            assert taken
            yield

    @contextlib.contextmanager
    def pin(self, stage: str, version: str, on_wait=None) -> Iterator[None]:
        """Hold a shared lock on ``stage/version`` while a build reads it: many readers at once, but no builder
        replaces it and ``gc`` (:meth:`collect`) keeps it meanwhile. Blocks (calling ``on_wait`` once) while a
        builder or ``gc`` holds the version's lock."""
        with self._locked(stage, version, fcntl.LOCK_SH, on_wait) as taken:
            assert taken
            yield

    @contextlib.contextmanager
    def try_lock(self, stage: str, version: str) -> Iterator[bool]:
        """Take the per-version build lock if nobody holds or reads it; yields whether it was taken (never waits)."""
        with self._locked(stage, version, fcntl.LOCK_EX | fcntl.LOCK_NB) as taken:
            yield taken

    def lock_path(self, stage: str, version: str) -> Path:
        return self.stage_dir(stage) / ".locks" / f"{version}.lock"

    @contextlib.contextmanager
    def _locked(self, stage: str, version: str, how: int, on_wait=None) -> Iterator[bool]:
        """``flock(how)`` on the version's lock file; yields whether it was taken (False only with ``LOCK_NB``).

        Lock files are deleted by :meth:`collect` (under the exclusive lock), so after taking the lock we check
        that the path still names the file we locked (same inode): if it was unlinked (or replaced) meanwhile,
        the lock guards nothing and we start over on the file the path names now."""
        path = self.lock_path(stage, version)
        while True:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a+") as fh:
                if not _flock(fh, how | fcntl.LOCK_NB):
                    if how & fcntl.LOCK_NB:
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

    def _unlink_lock(self, stage: str, version: str) -> None:
        """Delete the version's lock file; call only while holding it exclusively (see :meth:`_locked`)."""
        self.lock_path(stage, version).unlink(missing_ok=True)

    def discard(self, stage: str, version: str, reason: str) -> None:
        """Move a published (damaged or replaced) version aside atomically, then delete it."""
        path = self.version_path(stage, version)
        if not path.exists():
            return
        trash = self.stage_dir(stage) / ".trash"
        trash.mkdir(parents=True, exist_ok=True)
        target = trash / f"{version}.{uuid.uuid4().hex[:8]}"
        os.rename(path, target)
        fsync_dir(path.parent)
        log.info("discarded %s/%s (%s)", stage, version, reason)
        shutil.rmtree(target, ignore_errors=True)

    def open_build(self, stage: str, version: str) -> Build:
        """Staging area for building ``stage/version``. Call under ``lock``. Survives crashes for resume."""
        return Build(self, stage, version)

    def drop_staging(self, stage: str, version: str) -> None:
        """Delete the staging dir of ``stage/version`` (call under ``lock``, once the version is published)."""
        shutil.rmtree(self.staging_path(stage, version), ignore_errors=True)

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
        """What no run needs: staging dirs (unfinished builds, leftovers of published ones), interrupted
        deletions in ``.trash``, and with ``code_versions`` the stale published versions (:meth:`stale_versions`)."""
        found = []
        for st in self._all_stages():
            for d in _subdirs(self.stage_dir(st) / ".staging"):
                size, newest = _usage(d)
                if self.read_manifest(st, d.name) is not None:
                    why = f"leftover staging of the published {st}/{d.name} (a run stopped before deleting it)"
                else:
                    why = (
                        f"unfinished build of {st}/{d.name}, last written {newest}; a rerun with the "
                        "same settings would resume from it"
                    )
                found.append(Garbage(d, st, d.name, size, why, self.is_locked(st, d.name)))
            for d in _subdirs(self.stage_dir(st) / ".trash"):
                found.append(Garbage(d, st, "", dir_bytes(d), "a discarded version whose deletion was interrupted"))
            for f in sorted((self.stage_dir(st) / ".locks").glob("*.lock")):
                version = f.name.removesuffix(".lock")
                if not self.version_path(st, version).exists() and not self.staging_path(st, version).exists():
                    why = f"the lock file of {st}/{version}, which is neither published nor being built"
                    found.append(Garbage(f, st, version, 0, why, self.is_locked(st, version)))
        if code_versions is not None:
            for (st, version), why in self.stale_versions(code_versions).items():
                path = self.version_path(st, version)
                found.append(
                    Garbage(
                        path, st, version, dir_bytes(path), f"stale: {why}", self.is_locked(st, version), published=True
                    )
                )
        return found

    def is_locked(self, stage: str, version: str) -> bool:
        """Whether a run holds the build lock of ``stage/version`` (or reads the version) right now."""
        if not self.lock_path(stage, version).exists():
            return False
        with self.try_lock(stage, version) as taken:
            return not taken

    def collect(self, item: Garbage) -> bool:
        """Delete one :meth:`garbage` item under its version's lock, and the lock file with it; False (and nothing
        deleted) when a run builds or reads that version."""
        if not item.version:
            shutil.rmtree(item.path, ignore_errors=True)
            return True
        with self.try_lock(item.stage, item.version) as taken:
            if not taken:
                return False
            if item.published:
                self.discard(item.stage, item.version, item.reason)
            elif item.path.is_dir():
                shutil.rmtree(item.path, ignore_errors=True)
            if not self.version_path(item.stage, item.version).exists():
                self._unlink_lock(item.stage, item.version)  # under the lock: see _locked
            return True


@dataclass(frozen=True)
class Garbage:
    """Something under an artifact root that no run needs (see :meth:`ArtifactStore.garbage`)."""

    path: Path
    stage: str
    version: str  # the version whose build lock guards it ("" for .trash entries)
    bytes: int
    reason: str
    in_use: bool = False  # a run held its lock when it was listed
    published: bool = False  # a stale published version (not a staging or trash dir)


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


def _subdirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir()) if path.is_dir() else []


def dir_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (0 when it is gone)."""
    return _usage(path)[0]


def _usage(path: Path) -> tuple[int, str]:
    """Bytes of the files under ``path`` and when anything there was last written (UTC), in one walk."""
    total, newest = 0, 0.0
    for dirpath, dirs, names in os.walk(path):
        for name in [*dirs, *names, ""]:  # "" = the directory itself
            with contextlib.suppress(OSError):  # a file a running build just replaced
                st = os.lstat(os.path.join(dirpath, name))
                newest = max(newest, st.st_mtime)
                if name in names:
                    total += st.st_size
    return total, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(newest))


class Build:
    """A version being built: ``out/`` becomes the version on publish; ``work/`` is scratch/resume state."""

    def __init__(self, store: ArtifactStore, stage: str, version: str) -> None:
        self.store, self.stage, self.version = store, stage, version
        self.dir = store.staging_path(stage, version)
        self.out = self.dir / "out"
        self.work = self.dir / "work"
        # An earlier attempt that died leaves its staging dir: a stage may resume from it.
        self.resumed = self.dir.exists() and any(self.dir.rglob("*"))
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

    def reset(self) -> None:
        """Throw away everything an earlier attempt left (for stages that cannot resume)."""
        shutil.rmtree(self.dir, ignore_errors=True)
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
        """fsync every file of ``out/``, write the manifest last, rename into place, drop the staging dir.

        ``fault`` (test hook, see ``tasks.core.stage.fault_point``) is called with ``"publish"`` after the manifest is
        written and with ``"published"`` after the rename, before the staging dir is deleted."""
        self._sweep_temp_files()
        files: dict[str, dict] = {}
        for p in sorted(self.out.rglob("*")):
            if p.is_dir():
                continue
            rel = str(p.relative_to(self.out))
            if rel == MANIFEST:
                raise RuntimeError(f"stage {self.stage} must not write its own {MANIFEST}")
            with open(p, "rb") as f:
                os.fsync(f.fileno())
            files[rel] = {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for d in sorted({p.parent for p in self.out.rglob("*")} | {self.out}):
            fsync_dir(d)
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
        if fault:
            fault("publish")
        final = self.store.version_path(self.stage, self.version)
        if final.exists():
            self.store.discard(self.stage, self.version, "replaced by a rebuild")
        os.rename(self.out, final)
        fsync_dir(final.parent)
        if fault:
            fault("published")
        shutil.rmtree(self.dir, ignore_errors=True)
        return manifest


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def format_listing(
    store: ArtifactStore, versions: list[VersionInfo] | None = None, stale: dict[tuple[str, str], str] | None = None
) -> str:
    """Published versions (all, or ``versions``): stage, version, creation time, size, and lineage; those in
    ``stale`` (see :meth:`ArtifactStore.stale_versions`) are marked, with why."""
    versions = store.versions() if versions is None else versions
    stale = stale or {}
    if not versions:
        return f"no published versions under {store.root}"
    lines = [
        f"artifacts under {store.root}",
        f"{'stage':10s} {'version':12s} {'created (UTC)':20s} {'size':>9s}  inputs",
    ]
    for v in versions:
        inputs = ", ".join(f"{k}/{i['version']}" for k, i in sorted((v.manifest.get("inputs") or {}).items()))
        why = stale.get((v.stage, v.version))
        lines.append(
            f"{v.stage:10s} {v.version:12s} {v.manifest.get('created_at', ''):20s} "
            f"{human_bytes(v.size_bytes):>9s}  {inputs or '-'}" + (f"  [stale: {why}]" if why else "")
        )
    return "\n".join(lines)
