"""A version being built: its staging area (``out/`` to publish, ``work/`` to resume from) and its publication."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import shutil
import socket
import time
import uuid
from pathlib import Path

from mygpt.atomic import atomic_write_text, sha256_file
from mygpt.errors import UserError
from tasks.store.files import FILES_UNDER, MANIFEST, MAX_MANIFEST_BYTES
from tasks.store.manifest_schema import CREATED_AT_FORMAT
from tasks.store.versions import Versions

MANIFEST_FORMAT = 1
HASH_THREADS = min(4, os.cpu_count() or 1)

log = logging.getLogger("wiki_pipeline.store")


def _is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


class Build:
    """The staging area of ``stage/version``, local (under the root, or an object-store root's cache); it survives
    a crash, and an object-store root keeps what :meth:`save` marks so another machine resumes from it."""

    def __init__(self, store: Versions, stage: str, version: str) -> None:
        self.store, self.stage, self.version = store, stage, version
        self.dir = store.staging_path(stage, version)
        self.out = self.dir / "out"
        self.work = self.dir / "work"
        self._kept_key = store._staging_key(stage, version)
        self._hashed: dict[str, tuple[tuple[int, int, int, int], str]] = {}  # rel -> (identity, sha256)
        self._lock_key = store._lock_key(stage, version)
        # what this build may replace, read under its lock: publish's last lock check comes after this read
        self._found = store.files.found(store._version_key(stage, version))
        # An earlier attempt that died leaves its staging dir: a stage may resume from it.
        self.resumed = self.dir.exists() and any(self.dir.rglob("*"))
        if not self.resumed:
            fetched = store.files.restore_state(self._kept_key, self.dir)
            self.resumed = fetched > 0
            if fetched:
                where = store.files.where(self._kept_key)
                log.info("%s/%s: fetched %d file(s) of an interrupted build from %s", stage, version, fetched, where)
        for d in (self.out, self.work):
            d.mkdir(parents=True, exist_ok=True)
        self._sweep_temp_files()
        # a publish killed between writing the manifest and the rename left one; publish refuses it
        (self.out / MANIFEST).unlink(missing_ok=True)

    def _sweep_temp_files(self) -> None:
        """Remove half-written temp files that a killed writer left (their real targets are intact)."""
        for p in self.dir.rglob("*"):
            if p.is_file() and _is_temp_name(p.name):
                p.unlink(missing_ok=True)

    def check_lease(self) -> None:
        """``UserError`` once this build's lock was taken over (another run builds the version): stop here."""
        self.store.files.check_held(self._lock_key, renew=False)

    def save(self, *paths: Path) -> None:
        """Mark ``paths`` (files under ``out/`` or ``work/``; one that is gone is dropped) as resume state."""
        for path in paths:
            self.store.files.check_held(self._lock_key)  # a build that lost its lock writes nothing more
            rel = Path(path).absolute().relative_to(self.dir.absolute()).as_posix()
            self.store.files.save_state(Path(path), f"{self._kept_key}/{rel}")

    def shared(self, path: Path, rel: str) -> str:
        """Where a worker on another machine reads ``path``, a file this build reads: on an object-store root, its
        copy kept as ``rel`` with this build's resume state (uploaded unless a copy of its size is there already:
        an upload is whole or absent; restored by a resume on another machine and dropped on publish, as
        :meth:`save`'s files are); on a local root ``path`` itself, which such a worker must share. Why: a Dask
        worker has no disk in common with the stage, but it can read the store by range."""
        files = self.store.files
        if not files.remote:
            return str(path)
        key = f"{self._kept_key}/{rel}"
        if files.files(self._kept_key).get(rel) != Path(path).stat().st_size:
            self.store.files.check_held(self._lock_key)  # a build that lost its lock writes nothing more
            files.save_state(Path(path), key)
        return files.where(key)

    def hashed(self, path: Path, size: int, sha256: str) -> None:
        """Declare the ``size`` and ``sha256`` of the file ``path`` of ``out/``, computed from exactly the bytes
        its writer wrote; call it right after that writer closed (and renamed) the file. :meth:`publish` then
        takes the sum instead of reading the file again, but only while the file is still the one declared: the
        same size, device, inode and ``st_mtime_ns`` as now; any other file (changed, replaced, or never
        declared) is hashed from disk. Why: the writers had every byte in hand, and reading a corpus back
        costs a pass over the disk and a core while nothing else runs. A ``size`` that is not the file's size
        now is no declaration at all."""
        path = Path(path)
        rel = path.absolute().relative_to(self.out.absolute()).as_posix()
        st = path.stat()
        if st.st_size == size:
            self._hashed[rel] = ((st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns), sha256)
        else:
            self._hashed.pop(rel, None)

    def _sha256(self, path: Path) -> str:
        """``path``'s sha256: the declared one while the file is still the one declared (:meth:`hashed`),
        otherwise read from disk."""
        known = self._hashed.get(path.relative_to(self.out).as_posix())
        if known is not None:
            st = path.stat()
            if (st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns) == known[0]:
                return known[1]
        return sha256_file(path)

    def reset(self) -> None:
        """Throw away everything an earlier attempt left (for stages that cannot resume)."""
        shutil.rmtree(self.dir, ignore_errors=True)
        self.store.files.check_held(self._lock_key)
        self.store.files.delete(self._kept_key)
        for d in (self.out, self.work):
            d.mkdir(parents=True, exist_ok=True)
        self._hashed.clear()
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
        """Write the manifest of ``out/`` (each file's size and sha256: declared by its writer, :meth:`hashed`, or
        read from disk), publish ``out/`` as the version (the manifest last), drop the staging area; the manifest.
        ``fault`` (a test hook) is called with ``"publish"`` before the manifest is visible and ``"published"``
        after."""
        self._sweep_temp_files()
        paths = [p for p in sorted(self.out.rglob("*")) if not p.is_dir()]
        if any(p.relative_to(self.out).as_posix() == MANIFEST for p in paths):
            raise RuntimeError(f"stage {self.stage} must not write its own {MANIFEST}")
        # what no writer declared (:meth:`hashed`) is hashed in threads (sha256 lets go of the GIL): the large
        # files of a version at once, not one after another
        with concurrent.futures.ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="publish-hash") as pool:
            sums = list(pool.map(self._sha256, paths))
        files = {
            p.relative_to(self.out).as_posix(): {"size": p.stat().st_size, "sha256": sha}
            for p, sha in zip(paths, sums, strict=True)
        }
        build_id = uuid.uuid4().hex[:12]
        under = self.store.files.build_folder(build_id)
        manifest = {
            "format": MANIFEST_FORMAT,
            "stage": self.stage,
            "version": self.version,
            "build_id": build_id,
            "code_version": code_version,
            "settings": settings,
            "inputs": inputs,
            "files": files,
            "metrics": metrics or {},
            "timings": timings or {},
            "created_at": time.strftime(CREATED_AT_FORMAT, time.gmtime()),
            "host": socket.gethostname(),
            **({FILES_UNDER: under} if under else {}),
            **(extra or {}),
        }
        text = json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n"
        if len(text.encode("utf-8")) > MAX_MANIFEST_BYTES:  # every reader would take it for damage: rebuilt forever
            raise UserError(
                f"{self.stage}/{self.version}: its manifest would be over the {MAX_MANIFEST_BYTES} bytes a manifest "
                f"may have ({len(files)} files); choose settings that write fewer, larger files"
            )
        atomic_write_text(self.out / MANIFEST, text)
        files_ = self.store.files
        files_.check_held(self._lock_key)
        key = self.store._version_key(self.stage, self.version)
        files_.place(self.out, key, self._found, fault, still_held=lambda: files_.check_held(self._lock_key))
        if fault:
            fault("published")
        self.store.drop_staging(self.stage, self.version)
        return manifest
