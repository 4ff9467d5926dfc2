"""An artifact root in S3-compatible object storage through ``s3fs``; credentials only from the AWS environment."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mygpt.atomic import atomic_write_text, sha256_file
from mygpt.errors import UserError
from tasks.store.files import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
    Found,
    UnreadableManifest,
    files_prefix,
    manifest_text,
    parse_manifest,
    safe_rel,
)
from tasks.store.manifest_schema import manifest_problem
from tasks.store.s3_cache import INCOMING, cached_file, holds_build, install
from tasks.store.s3_client import cache_root, filesystem, no_bucket, precondition_failed, read_at_most
from tasks.store.s3_lease import Lease, lease_seconds
from tasks.store.s3_urls import SCHEME, normal_url, scrub, split_url

log = logging.getLogger(__name__)

UPLOAD_PART_BYTES = 8 << 20


class ObjectFiles:
    """The root ``s3://bucket/prefix`` (a :class:`tasks.store.files.Files`); see docs/STORE.md."""

    remote = True

    def __init__(self, url: str) -> None:
        self.display = normal_url(url)
        self.bucket, self.prefix = split_url(url)
        self.fs = filesystem()
        slug = re.sub(r"[^A-Za-z0-9.-]+", "-", f"{self.bucket}-{self.prefix}")[:60].strip("-")
        digest = hashlib.sha256(self.display.encode()).hexdigest()[:8]
        self.local = cache_root() / "roots" / f"{slug}-{digest}"
        self.lease_seconds = lease_seconds()
        self._held: dict[str, Lease] = {}

    # ---- names -----------------------------------------------------------------------------------
    def _path(self, key: str) -> str:
        return "/".join(p for p in (self.bucket, self.prefix, key.strip("/")) if p)

    def where(self, key: str) -> str:
        return f"{SCHEME}{self._path(key)}"

    def path(self, key: str) -> Path:
        return self.local / key

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """A failure of the object store as a ``UserError`` naming the root and ``what`` (a missing bucket's:
        :meth:`_missing_bucket`); a FileNotFoundError passes (an object that is not there) unless it is the
        bucket's."""
        try:
            yield
        except UserError:
            raise
        except Exception as exc:
            if no_bucket(exc):
                raise self._missing_bucket(what) from None
            if isinstance(exc, FileNotFoundError):
                raise
            why = scrub(str(exc))
            raise UserError(
                f"the artifact store {self.display} failed while {what}: {type(exc).__name__}: {why}. Check the "
                "bucket exists and that AWS_ENDPOINT_URL and the credentials in the environment reach it; nothing "
                "half-written is visible (a version appears only with its manifest), and a rerun resumes"
            ) from None  # the raw exception's text may carry an endpoint's query or user info

    # ---- reading ---------------------------------------------------------------------------------
    def read_manifest(self, key: str) -> str | None:
        """None when ``key`` has no manifest object: a build's files may be there before its commit (gc judges
        them, under the version's lock, as builds that did not publish)."""
        with self._errors(f"reading {key}/{MANIFEST}"):
            current = self.get_object(f"{key}/{MANIFEST}", MAX_MANIFEST_BYTES + 1)
        return None if current is None else manifest_text(current[0])

    def listing(self, key: str) -> dict[str, dict]:
        base = self._path(key).rstrip("/") + "/"
        with self._errors(f"listing {key}"):
            try:
                found = self.fs.find(base, detail=True, withdirs=False)
            except FileNotFoundError as exc:
                if no_bucket(exc):
                    raise
                return {}
        # a console's "folder" marker (a key ending in /) is no file
        return {
            name[len(base) :]: info
            for name, info in found.items()
            if name.startswith(base) and not name.endswith("/") and info.get("type") != "directory"
        }

    def files(self, key: str) -> dict[str, int]:
        return {rel: int(info.get("size") or 0) for rel, info in self.listing(key).items() if rel}

    def exists(self, key: str) -> bool:
        return bool(self.files(key))

    def subdirs(self, key: str) -> list[str]:
        return sorted({rel.split("/", 1)[0] for rel in self.files(key) if "/" in rel})

    def names(self, key: str) -> list[str]:
        return sorted(rel for rel in self.files(key) if "/" not in rel)

    def links(self, key: str) -> list[str]:  # an object store has none
        return []

    def sha256(self, key: str) -> str:
        h = hashlib.sha256()
        with self._errors(f"reading {key}"), self.fs.open(self._path(key), "rb", block_size=8 << 20) as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)
        return h.hexdigest()

    def usage(self, key: str) -> tuple[int, float]:
        total, newest = 0, 0.0
        for info in self.listing(key).values():
            total += int(info.get("size") or 0)
            modified = info.get("LastModified")
            if modified is not None and hasattr(modified, "timestamp"):
                newest = max(newest, modified.timestamp())
        return total, newest

    def fetch(self, key: str, dest: Path) -> Path:
        with self._errors(f"downloading {key}"):
            self.fs.get_file(self._path(key), str(dest))
        return dest

    def local_copy(self, key: str, full: bool = False) -> Path:
        """The cached copy of ``key``, downloaded unless the cache holds its build, every file checked first."""
        try:
            text = self.read_manifest(key)
            if text is None:
                raise FileNotFoundError(f"no published version {key} under {self.display}")
            manifest = parse_manifest(text)
            problem = "it is not a JSON object" if manifest is None else manifest_problem(manifest, *key.split("/", 1))
        except UnreadableManifest as exc:
            manifest, problem = None, str(exc)
        if manifest is None or problem:
            raise UserError(f"{self.where(key)}: its {MANIFEST} is damaged ({problem}); rerun with force to rebuild it")
        final = self.local / key
        files: dict[str, dict] = manifest.get("files") or {}
        if holds_build(final, manifest, full):
            return final
        prefix = files_prefix(manifest)
        incoming = self.local / INCOMING / f"{key.replace('/', '-')}-{uuid.uuid4().hex[:8]}"
        incoming.mkdir(parents=True)
        try:
            for rel, meta in sorted(files.items()):
                if not safe_rel(rel) or not isinstance(meta, dict) or prefix is None:
                    raise UserError(
                        f"{self.where(key)}: its manifest names the file {rel!r}, which is not a plain relative path "
                        "inside the version; refusing to download it (someone wrote the manifest by hand?)"
                    )
                target = incoming / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with self._errors(f"downloading {key}/{prefix}{rel}"):
                    self.fs.get_file(self._path(f"{key}/{prefix}{rel}"), str(target))
                if target.stat().st_size != meta["size"] or sha256_file(target) != meta["sha256"]:
                    where = self.where(f"{key}/{prefix}{rel}")
                    raise UserError(
                        f"{where} does not match its sha256 in the manifest (it was changed "
                        "after publication); rerun with force for that stage to rebuild it"
                    )
            atomic_write_text(incoming / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            if holds_build(final, manifest, full):  # another process here fetched it meanwhile: it may read it
                return final
            install(self.local, incoming, final)
        finally:
            shutil.rmtree(incoming, ignore_errors=True)
        return final

    def cached(self, key: str, rel: str, build_id: str) -> Path | None:
        return cached_file(self.local / key, rel, build_id)

    # ---- resume state: uploaded beside the version, so a build on another machine resumes ----------
    def save_state(self, local: Path, key: str) -> None:
        if local.is_file():
            self.upload(local, key)
        else:
            self.delete(key)

    def restore_state(self, key: str, dest: Path) -> int:
        listing = {rel: size for rel, size in self.files(key).items() if safe_rel(rel)}
        for rel in sorted(listing):
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:6]}.tmp")
            with self._errors(f"downloading {key}/{rel}"):
                self.fs.get_file(self._path(f"{key}/{rel}"), str(tmp))
            os.replace(tmp, target)
        return len(listing)

    # ---- writing ---------------------------------------------------------------------------------
    def upload(self, local: Path, key: str) -> None:
        # 8 MiB parts, two in flight: s3fs's default 50 MiB parts hold ten times the memory
        with self._errors(f"uploading {key}"):
            self.fs.put_file(str(local), self._path(key), chunksize=UPLOAD_PART_BYTES, max_concurrency=2)

    def build_folder(self, build_id: str) -> str:
        return build_id  # unique: a late upload of a build that lost its lock lands beside, never over, another's

    def found(self, key: str) -> Found | None:
        with self._errors(f"reading {key}/{MANIFEST}"):
            current = self.get_object(f"{key}/{MANIFEST}", MAX_MANIFEST_BYTES + 1)
        if current is None:
            return None
        body, tag = current
        try:
            text: str | None = manifest_text(body)
        except UnreadableManifest:
            text = None
        return Found(tag, parse_manifest(text))

    def place(
        self,
        out: Path,
        key: str,
        replaces: Found | None,
        fault: Callable[[str], None] | None = None,
        still_held: Callable[[], None] | None = None,
    ) -> None:
        """Upload every file of ``out`` into the build's own folder, then create the manifest only if ``key``
        still holds what ``replaces`` names (``If-None-Match: *`` or ``If-Match``), so a write that lands late
        changes nothing another build published; then delete the replaced build's files, by name. ``out``
        becomes the cached copy."""
        manifest = parse_manifest((out / MANIFEST).read_text(encoding="utf-8"))
        prefix = files_prefix(manifest) if manifest is not None else None
        if manifest is None or prefix is None:
            raise RuntimeError(f"{out / MANIFEST} is no manifest this store wrote")
        abort_unfinished(self, f"{key}/", still_held)  # a killed builder's uploads: the version's lock is ours
        rels = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
        mine = [f"{key}/{prefix}{rel}" for rel in rels if rel != MANIFEST]
        try:
            for rel, target in zip([r for r in rels if r != MANIFEST], mine, strict=True):
                if still_held:
                    still_held()  # a build that lost its lock uploads nothing more
                self.upload(out / rel, target)
            if still_held:
                still_held()
            if fault:
                fault("publish")
            try:
                with self._errors(f"publishing {key}/{MANIFEST}"):
                    tag = self.put_object(
                        f"{key}/{MANIFEST}",
                        (out / MANIFEST).read_bytes(),
                        if_none_match=replaces is None,
                        if_match=replaces.tag if replaces is not None else None,
                    )
            except UserError:
                tag = None
                if not self._is_ours(key, manifest):
                    raise
            if tag is None and not self._is_ours(key, manifest):  # a retried PUT meets the first one's manifest
                raise UserError(
                    f"{self.where(key)} was published by another run while this one was stopped (it lost its "
                    "build lock); that version stands unchanged, and this build's files are deleted"
                )
        except Exception:
            with contextlib.suppress(Exception):  # its own names: no other build's file, published or not
                self._delete_keys(mine)
            raise
        if replaces is not None and replaces.manifest is not None:
            with self._errors(f"deleting the files {key} held before"):
                self._delete_keys(self._named(key, replaces.manifest))
        # an older build's copy (a forced rebuild) goes: no build of this machine reads it now
        install(self.local, out, self.local / key)

    def _is_ours(self, key: str, manifest: dict) -> bool:
        """Whether the version ``key`` holds ``manifest``'s build (its commit landed, its answer did not)."""
        with contextlib.suppress(Exception):
            current = self.found(key)
            return current is not None and current.manifest is not None and current.manifest == manifest
        return False

    def _named(self, key: str, manifest: dict) -> list[str]:
        """The objects of the build ``manifest`` (of the version ``key``) publishes: its own folder's, or (files
        in the version itself) those it names."""
        prefix = files_prefix(manifest)
        files = manifest.get("files")
        if prefix:
            return [f"{key}/{prefix}{rel}" for rel in self.files(f"{key}/{prefix}")]
        if prefix is None or not isinstance(files, dict):
            return []
        return [f"{key}/{rel}" for rel in files if safe_rel(rel) and rel != MANIFEST]

    def discard(self, key: str, still_held: Callable[[], None] | None = None) -> bool:
        """Delete the manifest of ``key`` if it is unchanged since read (gone for every reader from then on),
        then the files it names; the objects of other builds there are gc's."""
        current = self.found(key)
        if current is None:
            return False
        if still_held:
            still_held()  # held after that read: no other run published since
        with self._errors(f"deleting {key}"):
            if not self.delete_object(f"{key}/{MANIFEST}", if_match=current.tag):
                return False
            if current.manifest is not None:
                self._delete_keys(self._named(key, current.manifest))
        return True

    def delete(self, key: str) -> None:
        listing = self.files(key)
        with self._errors(f"deleting {key}"):
            self._delete_keys([f"{key}/{rel}" for rel in listing] if listing else [key])

    # ---- locks -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(
        self, key: str, *, shared: bool = False, wait: bool = True, on_wait: Callable[[], None] | None = None
    ) -> Iterator[bool]:
        lease = Lease(self, key, self.lease_seconds)
        with self._errors(f"taking the lock {key}"):
            taken = lease.acquire_shared(wait, on_wait) if shared else lease.acquire(wait, on_wait)
        if taken and not shared:
            self._held[key] = lease
        try:
            yield taken
        finally:
            if taken:
                self._held.pop(key, None)
                lease.release()

    def check_held(self, key: str, renew: bool = True) -> None:
        lease = self._held.get(key)
        if lease is not None and not (lease.confirm() if renew else lease.holds()):
            raise UserError(
                f"lost the build lock {self.where(key)} (its lease was not renewed in time, and another run took it "
                "over); that run builds this version, so this one stops without publishing"
            )

    def lock_exists(self, key: str) -> bool:
        return self.get_object(key) is not None or bool(self.files(key + ".pins"))

    def unlink_lock(self, key: str) -> None:
        with self._errors(f"deleting the lock {key}"):
            self._delete_keys([key])

    # ---- conditional requests --------------------------------------------------------------------
    def _call(self, method: str, **kwargs: Any) -> Any:
        return self.fs.call_s3(method, Bucket=self.bucket, **kwargs)

    def _delete_keys(self, keys: list[str]) -> None:
        """Delete the objects ``keys`` (relative to the root) by name, never through fsspec's glob expansion."""
        names = sorted({self._object_key(k) for k in keys})
        for i in range(0, len(names), 1000):
            self._call("delete_objects", Delete={"Objects": [{"Key": n} for n in names[i : i + 1000]], "Quiet": True})

    def _object_key(self, key: str) -> str:
        return self._path(key)[len(self.bucket) + 1 :]

    def last_modified(self, key: str) -> float | None:
        """When the server last wrote the object ``key`` (its clock, epoch seconds), or None."""
        try:
            info = self.fs.info(self._path(key))
        except FileNotFoundError as exc:
            if no_bucket(exc):
                raise self._missing_bucket(f"reading {key}") from None
            return None
        modified = info.get("LastModified")
        return modified.timestamp() if hasattr(modified, "timestamp") else None

    def get_object(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str] | None:
        """The object ``key``'s body (its first ``max_bytes``: no more is read) and ETag from one GET (so they
        belong together), or None."""
        from fsspec.asyn import sync

        async def get() -> tuple[bytes, str] | None:
            try:
                resp = await self.fs._call_s3("get_object", Bucket=self.bucket, Key=self._object_key(key))
            except FileNotFoundError as exc:
                if no_bucket(exc):
                    raise self._missing_bucket(f"reading {key}") from None
                return None
            body = resp["Body"]
            try:
                data = await body.read() if max_bytes is None else await read_at_most(body, max_bytes)
            finally:
                body.close()
            return data, resp["ETag"]

        return sync(self.fs.loop, get)

    def put_object(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str | None:
        """PUT ``key``; with a condition, None when it did not hold (HTTP 412) instead of raising. The new ETag."""
        kwargs: dict[str, Any] = {"Key": self._object_key(key), "Body": body}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        conditional = if_none_match or if_match is not None
        try:
            return self._call("put_object", **kwargs)["ETag"]
        except OSError as exc:
            if no_bucket(exc):
                raise self._missing_bucket(f"writing {key}") from None
            if conditional and precondition_failed(exc):
                return None  # the condition did not hold: another holds the lock, or took it over
            if if_match is not None and isinstance(exc, FileNotFoundError):
                return None  # If-Match on an object that is gone: the lease was deleted
            raise

    def delete_object(self, key: str, if_match: str | None = None) -> bool:
        kwargs: dict[str, Any] = {"Key": self._object_key(key)}
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        try:
            self._call("delete_object", **kwargs)
        except OSError as exc:
            if no_bucket(exc):
                raise self._missing_bucket(f"deleting {key}") from None
            if isinstance(exc, FileNotFoundError) or precondition_failed(exc):
                return False
            raise
        return True

    def _missing_bucket(self, what: str) -> UserError:
        """The error for a bucket that is not there while ``what``: at the start, or deleted during a run."""
        return UserError(
            f"the artifact store {self.display} failed while {what}: the bucket {self.bucket!r} does not exist at "
            "this endpoint (never made, or deleted while in use); create it (or check the root's spelling and "
            "AWS_ENDPOINT_URL) and rerun: nothing half-written is visible, and a rerun resumes"
        )

    def is_empty(self) -> bool:
        """Whether no object at all lies under the root (one request, whatever the root holds)."""
        prefix = f"{self.prefix.strip('/')}/" if self.prefix.strip("/") else ""
        with self._errors("listing the root"):
            return not self._call("list_objects_v2", Prefix=prefix, MaxKeys=1).get("Contents")

    def check_bucket(self) -> None:
        """``UserError`` naming the bucket when it does not exist (its listing would read as empty)."""
        with self._errors("looking for the bucket"):
            try:
                self._call("head_bucket")
            except FileNotFoundError:  # a HEAD's 404 carries no error code
                raise self._missing_bucket("looking for the bucket") from None


def abort_unfinished(files: Any, folder: str, still_held: Callable[[], None] | None = None) -> int:
    """Abort every unfinished multipart upload under ``folder`` (a version's key and ``/``) of the ``ObjectFiles``
    ``files``; how many. Called by the builder that holds the version's lock before it uploads anything, so each
    one there is a builder's that was killed (or lost the lock) mid-upload: no listing of objects shows them,
    and S3 keeps their parts for ever. Best effort: a store that will not list them (a policy without
    ``s3:ListBucketMultipartUploads``) only gets a warning. ``still_held`` raises first if the lock was lost:
    then the uploads there may be the new holder's."""
    if still_held:
        still_held()
    prefix = files._object_key(folder.rstrip("/")) + "/"
    aborted = 0
    try:
        marker: dict[str, str] = {}
        while True:
            answer = files._call("list_multipart_uploads", Prefix=prefix, **marker)
            for upload in answer.get("Uploads") or []:
                files._call("abort_multipart_upload", Key=upload["Key"], UploadId=upload["UploadId"])
                aborted += 1
            if not answer.get("IsTruncated"):
                return aborted
            marker = {"KeyMarker": answer["NextKeyMarker"], "UploadIdMarker": answer["NextUploadIdMarker"]}
    except Exception as e:
        log.warning("store: could not abort the unfinished multipart uploads under %s (%s)", folder, e)
        return aborted
