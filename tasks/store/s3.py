"""An artifact root in object storage (``s3://bucket/prefix``): the files side of
:class:`tasks.store.artifacts.ArtifactStore` for any S3-compatible service (AWS, MinIO, R2, GCS's interoperability API).

It speaks S3 through fsspec's ``s3fs``, the layer Dask, pyarrow, pandas and DuckDB already use. Credentials and the
endpoint come from the standard AWS environment and files (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``~/.aws``), never from flow parameters; no message here names them.

- **Publication.** A version is visible only when its ``manifest.json`` is: :meth:`ObjectFiles.place` uploads
  every file of the finished local ``out/`` directory first and the manifest last; readers ignore a prefix without
  one. :meth:`ObjectFiles.discard` deletes the manifest first, so a version disappears in one request too.
- **Build locks** are leases (:class:`Lease`): an object created with a conditional write (``If-None-Match: *``),
  which its holder renews (a compare-and-swap on its ETag, ``If-Match``) every third of the lease time. A waiter
  that sees the same ETag for a whole lease time knows the holder stopped renewing (it was killed, or its machine
  died) and takes the lease over with a compare-and-swap on that ETag, so two waiters never both win. Judging
  expiry by "unchanged for a lease time on my own clock" needs no agreement between machines' clocks. Readers
  (``pin``) write a pin object of their own beside the lease, then check the lease; a builder takes the lease,
  then waits until no live pin is left: each side writes before it reads the other's mark, so they never both
  proceed.
- **The local side.** Builds stage on local disk, in a cache folder for this root (``$WIKI_PIPELINE_CACHE``, else
  ``~/.cache/wiki-pipeline``); the files a stage marks as resume state (:meth:`tasks.store.artifacts.Build.save`) are
  uploaded to ``<stage>/.staging/<version>/`` as it goes, and a build that finds no local staging downloads that
  prefix, so a rerun on another machine resumes there. Inputs are downloaded into the same cache, every file
  checked against its sha256 in the manifest (:meth:`ObjectFiles.local_copy`).
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
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mygpt.errors import UserError

SCHEME = "s3://"
ENV_CACHE = "WIKI_PIPELINE_CACHE"
UPLOAD_PART_BYTES = 8 << 20
ENV_LEASE = "WIKI_PIPELINE_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = 30.0
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
_MANIFEST = "manifest.json"
_UNSAFE = set("*?[]{}#\\")
MAX_PREFIX_BYTES = 512

log = logging.getLogger("wiki_pipeline.store")


def is_object_url(root: object) -> bool:
    return isinstance(root, str) and root.strip().lower().startswith(SCHEME)


def split_url(url: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of ``s3://bucket[/prefix]``; ``ValueError`` saying what is wrong with it otherwise."""
    text = url.strip()
    if not text.lower().startswith(SCHEME):
        raise ValueError(f"{url!r} is not an s3:// URL")
    rest = text[len(SCHEME) :]
    bucket, _, prefix = rest.partition("/")
    if "@" in bucket or ":" in bucket:
        raise ValueError(
            "an s3:// artifact root names a bucket and a prefix only (s3://bucket/prefix); credentials and the "
            "endpoint come from the AWS environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, "
            "AWS_PROFILE), never from the URL"
        )
    if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket:
        raise ValueError(
            f"s3:// artifact root: {bucket!r} is not a bucket name (3-63 characters: lower-case letters, digits, "
            "dots and hyphens, starting and ending with a letter or digit)"
        )
    if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", bucket):
        raise ValueError(f"s3:// artifact root: {bucket!r} is an IP address, not a bucket name")
    parts = [p for p in prefix.split("/") if p]
    if any(p in (".", "..") or any(c.isspace() or not c.isprintable() or c in _UNSAFE for c in p) for p in parts):
        raise ValueError(
            f"s3:// artifact root: the prefix {prefix!r} has '.'/'..' segments, spaces, backslashes or one of "
            f"{' '.join(sorted(_UNSAFE - {chr(92)}))} (glob and query characters, which fsspec would expand)"
        )
    if len("/".join(parts).encode()) > MAX_PREFIX_BYTES:
        raise ValueError(f"s3:// artifact root: the prefix is over {MAX_PREFIX_BYTES} bytes (S3 keys hold 1024)")
    return bucket, "/".join(parts)


def safe_rel(rel: object) -> bool:
    """Whether ``rel`` (a file name from a manifest or a listing) names a file inside its version: relative, no
    ``.``/``..`` or empty segments, no backslash. Anything else could write outside the local copy."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or "\x00" in rel:
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def normal_url(url: str) -> str:
    bucket, prefix = split_url(url)
    return f"{SCHEME}{bucket}/{prefix}" if prefix else f"{SCHEME}{bucket}"


def _scrub(text: str) -> str:
    """``text`` without user info or query strings of URLs in it (an endpoint URL may carry a token)."""
    text = re.sub(r"//[^/@\s\"']+@", "//***@", text)
    return re.sub(r"(https?://[^\s\"'?]*)\?[^\s\"']*", r"\1?***", text)


def _s3_error(exc: BaseException) -> tuple[str, object] | None:
    """``(error code, HTTP status)`` of the botocore error behind ``exc`` (s3fs re-raises it as an OSError of its
    own choosing, with the botocore error as its cause), or None when there is none."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            break
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = str((response.get("Error") or {}).get("Code", ""))
            return code, (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        seen = seen.__cause__ or seen.__context__
    return None


def _precondition_failed(exc: BaseException) -> bool:
    """Whether ``exc`` (as s3fs raised it) is an HTTP 412 Precondition Failed or a 409 ConditionalRequestConflict
    (a conditional write that lost a race): s3fs maps them to FileExistsError or to OSError(EINVAL) depending on
    the request, so the botocore error behind it decides."""
    error = _s3_error(exc)
    if error is not None:
        code, status = error
        return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412)
    return "pre-conditions you specified did not hold" in str(exc) or "ConditionalRequestConflict" in str(exc)


def _no_bucket(exc: BaseException) -> bool:
    error = _s3_error(exc)
    return error[0] == "NoSuchBucket" if error is not None else "bucket does not exist" in str(exc)


def cache_root() -> Path:
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env).expanduser().absolute()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "wiki-pipeline"


def lease_seconds() -> float:
    raw = os.environ.get(ENV_LEASE, "").strip()
    if not raw:
        return DEFAULT_LEASE_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 1.0 <= value <= 3600.0:
        raise UserError(f"{ENV_LEASE}={raw!r}: give the build-lock lease time in seconds, 1 to 3600 (default 30)")
    return value


_FILESYSTEMS: dict[tuple, Any] = {}
_AWS_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_MAX_ATTEMPTS",
)


def filesystem():
    """This process's s3fs filesystem for the AWS environment it has now (made once: a botocore client takes a
    few hundred milliseconds to make): no listings cache (another machine may have just published), bounded
    retries (botocore's standard mode; ``AWS_MAX_ATTEMPTS``, default 4 attempts per request)."""
    import s3fs

    env = tuple(os.environ.get(name) for name in _AWS_ENV)
    fs = _FILESYSTEMS.get(env)
    if fs is not None and getattr(fs, "_pid", None) == os.getpid():
        return fs
    try:
        attempts = max(1, min(int(os.environ.get("AWS_MAX_ATTEMPTS") or 4), 20))
    except ValueError:
        attempts = 4
    fs = _FILESYSTEMS[env] = s3fs.S3FileSystem(
        use_listings_cache=False,
        skip_instance_cache=True,
        config_kwargs={
            "connect_timeout": 10,
            "read_timeout": 120,
            "retries": {"max_attempts": attempts, "mode": "standard"},
        },
    )
    fs._pid = os.getpid()  # a forked child makes its own (an event loop and its connections do not survive a fork)
    return fs


class ObjectFiles:
    """The root ``s3://bucket/prefix`` (see the module docstring)."""

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
        """``bucket/prefix/key``: s3fs's name for ``key``."""
        return "/".join(p for p in (self.bucket, self.prefix, key.strip("/")) if p)

    def where(self, key: str) -> str:
        return f"{SCHEME}{self._path(key)}"

    def path(self, key: str) -> Path:
        """The local cache's path for ``key``."""
        return self.local / key

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Turn a failure of the object store into a ``UserError`` that names the bucket and what was being done
        (never credentials: the AWS errors do not carry them). ``FileNotFoundError`` passes through."""
        try:
            yield
        except (FileNotFoundError, UserError):
            raise
        except Exception as exc:
            why = _scrub(str(exc))
            raise UserError(
                f"the artifact store {self.display} failed while {what}: {type(exc).__name__}: {why}. Check the "
                "bucket exists and that AWS_ENDPOINT_URL and the credentials in the environment reach it; nothing "
                "half-written is visible (a version appears only with its manifest), and a rerun resumes"
            ) from None  # the raw exception's text may carry an endpoint's query or user info

    # ---- reading ---------------------------------------------------------------------------------
    def read_text(self, key: str) -> str | None:
        with self._errors(f"reading {key}"):
            try:
                data = self.fs.cat_file(self._path(key))
            except (FileNotFoundError, IsADirectoryError):
                return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def _listing(self, key: str) -> dict[str, dict]:
        """``{relative key: info}`` of every object under ``key/``."""
        base = self._path(key).rstrip("/") + "/"
        with self._errors(f"listing {key}"):
            try:
                found = self.fs.find(base, detail=True, withdirs=False)
            except FileNotFoundError:
                return {}
        # a console's "folder" marker (a key ending in /) is no file
        return {
            name[len(base) :]: info
            for name, info in found.items()
            if name.startswith(base) and not name.endswith("/") and info.get("type") != "directory"
        }

    def files(self, key: str) -> dict[str, int]:
        return {rel: int(info.get("size") or 0) for rel, info in self._listing(key).items() if rel}

    def is_dir(self, key: str) -> bool:
        return bool(self.files(key))

    exists = is_dir

    def subdirs(self, key: str) -> list[str]:
        return sorted({rel.split("/", 1)[0] for rel in self.files(key) if "/" in rel})

    def names(self, key: str) -> list[str]:
        return sorted(rel for rel in self.files(key) if "/" not in rel)

    def sha256(self, key: str) -> str:
        h = hashlib.sha256()
        with self._errors(f"reading {key}"), self.fs.open(self._path(key), "rb", block_size=8 << 20) as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)
        return h.hexdigest()

    def usage(self, key: str) -> tuple[int, float]:
        total, newest = 0, 0.0
        for info in self._listing(key).values():
            total += int(info.get("size") or 0)
            modified = info.get("LastModified")
            if modified is not None and hasattr(modified, "timestamp"):
                newest = max(newest, modified.timestamp())
        return total, newest

    def local_copy(self, key: str, manifest: dict, full: bool = False) -> Path:
        """The published version ``key`` in the local cache, downloaded if the cache does not hold this build of
        it (its ``build_id``), every file checked against its sha256 in ``manifest`` before the copy is used; the
        copy appears by one rename, its manifest written last, so a killed download leaves nothing that looks
        complete."""
        from mygpt.atomic import atomic_write_text, sha256_file

        final = self.local / key
        files: dict[str, dict] = manifest.get("files") or {}
        if self._cached(final, manifest, full):
            return final
        incoming = self.local / ".incoming" / f"{key.replace('/', '-')}-{uuid.uuid4().hex[:8]}"
        incoming.mkdir(parents=True)
        try:
            for rel, meta in sorted(files.items()):
                if not safe_rel(rel) or not isinstance(meta, dict):
                    raise UserError(
                        f"{self.where(key)}: its manifest names the file {rel!r}, which is not a plain relative path "
                        "inside the version; refusing to download it (someone wrote the manifest by hand?)"
                    )
                target = incoming / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with self._errors(f"downloading {key}/{rel}"):
                    self.fs.get_file(self._path(f"{key}/{rel}"), str(target))
                if target.stat().st_size != meta["size"] or sha256_file(target) != meta["sha256"]:
                    raise UserError(
                        f"{self.where(key + '/' + rel)} does not match its sha256 in the manifest (it was changed "
                        "after publication); rerun with force for that stage to rebuild it"
                    )
            atomic_write_text(incoming / _MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            if self._cached(final, manifest, full):  # another process here fetched it meanwhile: it may read it
                return final
            self._install(incoming, final)
        finally:
            shutil.rmtree(incoming, ignore_errors=True)
        return final

    def _install(self, source: Path, final: Path) -> None:
        """Make the complete local directory ``source`` the cached copy ``final``: whatever was there is moved
        aside and deleted, then one rename (when another process of this machine got its copy there in between,
        ``source`` is dropped instead)."""
        if final.exists():
            aside = self.local / ".incoming" / f"old-{uuid.uuid4().hex[:8]}"
            aside.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                os.rename(final, aside)
            shutil.rmtree(aside, ignore_errors=True)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(source, final)
        except OSError:
            shutil.rmtree(source, ignore_errors=True)

    @staticmethod
    def _cached(final: Path, manifest: dict, full: bool = False) -> bool:
        """Whether the local copy ``final`` holds this build of the version (its manifest's ``build_id``, every
        file there with its size; the sha256s were checked when it was fetched, and with ``full`` again now)."""
        from mygpt.atomic import sha256_file

        try:
            cached = json.loads((final / _MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        if not isinstance(cached, dict) or cached.get("build_id") != manifest.get("build_id"):
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

    def download_tree(self, key: str, dest: Path) -> int:
        """Download every object under ``key`` into ``dest`` (a build's remote staging); how many files."""
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
        # 8 MiB parts, two in flight: s3fs's default (50 MiB parts) held 1 GB of memory for a 545 MB file, this
        # holds ~100 MB and is faster (measured against moto on loopback)
        with self._errors(f"uploading {key}"):
            self.fs.put_file(str(local), self._path(key), chunksize=UPLOAD_PART_BYTES, max_concurrency=2)

    def place(
        self,
        out: Path,
        key: str,
        fault: Callable[[str], None] | None = None,
        still_held: Callable[[], None] | None = None,
    ) -> None:
        """Publish the finished local directory ``out`` as ``key``: every file but the manifest, then the
        manifest (the version is visible from that request on). ``fault("publish")`` runs between the two.
        ``out`` then becomes this machine's cached copy of the version (the very bytes the manifest's sha256s
        were computed from), so the next stage here reads it without downloading it again."""
        rels = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
        for rel in rels:
            if rel != _MANIFEST:
                if still_held:
                    still_held()  # narrows the window in which a run that lost its lease writes over another's
                self.upload(out / rel, f"{key}/{rel}")
        if fault:
            fault("publish")
        if still_held:
            still_held()  # the lease, renewed right now: a run that lost it never makes its build visible
        self.upload(out / _MANIFEST, f"{key}/{_MANIFEST}")
        # an older build's copy (a forced rebuild) goes: no build of this machine reads it now
        self._install(out, self.local / key)

    def discard(self, key: str) -> bool:
        """Delete the version ``key``: its manifest first (it is gone for every reader from then on), then the
        rest; whether it was there."""
        listing = self.files(key)
        if not listing:
            return False
        with self._errors(f"deleting {key}"):
            if _MANIFEST in listing:
                self._delete_keys([f"{key}/{_MANIFEST}"])
            rest = [f"{key}/{rel}" for rel in listing if rel != _MANIFEST]
            if rest:
                self._delete_keys(rest)
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

    def check_held(self, key: str) -> None:
        """``UserError`` when this process took the lock ``key`` and has since lost it (it could not renew the
        lease in time and another run took it over): that run builds the version now, this one must not publish."""
        lease = self._held.get(key)
        if lease is not None and not lease.confirm():
            raise UserError(
                f"lost the build lock {self.where(key)} (its lease was not renewed in time, and another run took it "
                "over); that run builds this version, so this one stops without publishing"
            )

    def lock_exists(self, key: str) -> bool:
        return self._get(key) is not None or bool(self.files(key + ".pins"))

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

    def _modified(self, key: str) -> float | None:
        """When the server last wrote the object ``key`` (its clock, epoch seconds), or None."""
        try:
            info = self.fs.info(self._path(key))
        except FileNotFoundError:
            return None
        modified = info.get("LastModified")
        return modified.timestamp() if hasattr(modified, "timestamp") else None

    def _get(self, key: str) -> tuple[bytes, str] | None:
        """The object ``key``'s body and ETag from one GET (so they belong together), or None."""
        from fsspec.asyn import sync

        async def get() -> tuple[bytes, str] | None:
            try:
                resp = await self.fs._call_s3("get_object", Bucket=self.bucket, Key=self._object_key(key))
            except FileNotFoundError:
                return None
            body = resp["Body"]
            try:
                data = await body.read()
            finally:
                body.close()
            return data, resp["ETag"]

        return sync(self.fs.loop, get)

    def _put(self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None) -> str | None:
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
            if _no_bucket(exc):
                raise self._missing_bucket() from None
            if conditional and _precondition_failed(exc):
                return None  # the condition did not hold: another holds the lock, or took it over
            if if_match is not None and isinstance(exc, FileNotFoundError):
                return None  # If-Match on an object that is gone: the lease was deleted
            raise

    def _delete(self, key: str, if_match: str | None = None) -> bool:
        kwargs: dict[str, Any] = {"Key": self._object_key(key)}
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        try:
            self._call("delete_object", **kwargs)
        except OSError as exc:
            if _no_bucket(exc):
                raise self._missing_bucket() from None
            if isinstance(exc, FileNotFoundError) or _precondition_failed(exc):
                return False
            raise
        return True

    def _missing_bucket(self) -> UserError:
        return UserError(
            f"the artifact store {self.display}: the bucket {self.bucket!r} does not exist at this endpoint; create "
            "it, or check the root's spelling and AWS_ENDPOINT_URL"
        )

    def check_bucket(self) -> None:
        """``UserError`` naming the bucket when it does not exist (a listing of a missing bucket reads as empty)."""
        with self._errors("looking for the bucket"):
            try:
                self._call("head_bucket")
            except FileNotFoundError:
                raise self._missing_bucket() from None
            except OSError as exc:
                if _no_bucket(exc):
                    raise self._missing_bucket() from None
                raise


class Lease:
    """A build lock on an S3-compatible store (see the module docstring): ``acquire`` (exclusive, a builder) or
    ``acquire_shared`` (a reader's pin), renewed by a thread of its own until ``release``.

    A waiter judges another's lease dead when its ETag stayed the same for the longer of its own lease time and
    the one the holder wrote into the lease (machines configured differently still agree). A holder counts its
    lease lost when a renewal's compare-and-swap fails (another took it over) or when no renewal succeeded for a
    lease time (an outage: a waiter may have taken it meanwhile); :meth:`confirm` renews synchronously, and the
    store calls it before it makes a version visible."""

    def __init__(self, files: ObjectFiles, key: str, seconds: float) -> None:
        self.files, self.key, self.seconds = files, key, seconds
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.pin_key = f"{key}.pins/{self.holder.replace(':', '-')}"
        self.etag: str | None = None
        self.lost = False
        self._renewals = 0
        self._renewed_at = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shared = False
        self._mutex = threading.Lock()  # one renewal at a time (the thread's, or confirm's)

    def _body(self) -> bytes:
        self._renewals += 1
        return json.dumps(
            {"holder": self.holder, "renewal": self._renewals, "lease_seconds": self.seconds, "at": time.time()}
        ).encode()

    def _expiry(self, body: bytes) -> float:
        """How long another's lease must stay unchanged before it is dead: the longer of ours and the holder's."""
        try:
            theirs = float(json.loads(body).get("lease_seconds", 0))
        except (ValueError, TypeError, AttributeError):
            theirs = 0.0
        return max(self.seconds, min(theirs, 3600.0)) if theirs == theirs else self.seconds

    @property
    def _poll(self) -> float:
        return min(1.0, self.seconds / 4)

    def acquire(self, wait: bool, on_wait: Callable[[], None] | None) -> bool:
        seen: tuple[str, float] | None = None  # (ETag, when first seen) of the lease another holds
        while True:
            etag = self.files._put(self.key, self._body(), if_none_match=True)
            if etag is None:
                current = self.files._get(self.key)
                if current is None:
                    time.sleep(min(0.05, self._poll))  # released between our PUT and our GET
                    continue
                body, other = current
                if not wait:
                    return False
                now = time.monotonic()
                if seen is None or seen[0] != other:
                    if seen is None and on_wait:
                        on_wait()
                    seen = (other, now)
                elif now - seen[1] > self._expiry(body):
                    etag = self.files._put(self.key, self._body(), if_match=other)
                    if etag is not None:
                        log.warning(
                            "lock %s: its holder stopped renewing it for %.0f s (killed, or its machine died); "
                            "taking it over",
                            self.files.where(self.key),
                            now - seen[1],
                        )
                    seen = None
                if etag is None:
                    time.sleep(self._poll)
                    continue
            self.etag = etag
            self._renewed_at = time.monotonic()
            self._start_renewing()
            try:
                if self._wait_for_pins(wait, on_wait):
                    return True
            except BaseException:
                self.release()
                raise
            self.release()
            return False

    def _wait_for_pins(self, wait: bool, on_wait: Callable[[], None] | None) -> bool:
        """Holding the lease: wait until no reader's pin is live. A pin is dead when its ETag stayed the same for a
        lease time while we watched, or when the server last wrote it more than two lease times before it wrote
        our lease (both times the server's, so no clocks need to agree; its holder renews it every third of one)."""
        seen: dict[str, tuple[str, float, float]] = {}
        ours = None
        while True:
            listing = self.files._listing(self.key + ".pins")
            if listing and ours is None:
                ours = self.files._modified(self.key)
            now = time.monotonic()
            for rel, info in list(listing.items()):
                etag = str(info.get("ETag") or info.get("etag") or "")
                modified = info.get("LastModified")
                written = modified.timestamp() if modified is not None and hasattr(modified, "timestamp") else None
                first = seen.get(rel)
                if first is None or first[0] != etag:
                    pin = self.files._get(f"{self.key}.pins/{rel}")
                    seen[rel] = first = (etag, now, self._expiry(pin[0]) if pin else self.seconds)
                expiry = first[2]  # the longer of our lease time and the one its reader wrote into it
                stale = ours is not None and written is not None and ours - written > 2 * expiry
                if stale or now - first[1] > expiry:
                    self.files._delete(f"{self.key}.pins/{rel}", if_match=etag)  # its reader is gone
                    del listing[rel]
            if not listing:
                return True
            if not wait:
                return False
            if on_wait:
                on_wait()
                on_wait = None
            time.sleep(self._poll)

    def acquire_shared(self, wait: bool, on_wait: Callable[[], None] | None) -> bool:
        self._shared = True
        seen: tuple[str, float] | None = None
        while True:
            self.etag = self.files._put(self.pin_key, self._body())
            current = self.files._get(self.key)
            if current is None:
                self._renewed_at = time.monotonic()
                self._start_renewing()
                return True
            self.files._delete(self.pin_key)  # a builder holds the version: step back until it is done
            if not wait:
                return False
            body, other = current
            now = time.monotonic()
            if seen is None or seen[0] != other:
                if seen is None and on_wait:
                    on_wait()
                seen = (other, now)
            elif now - seen[1] > self._expiry(body):
                self.files._delete(self.key, if_match=other)  # its holder is gone
                seen = None
            time.sleep(self._poll)

    def _start_renewing(self) -> None:
        self._thread = threading.Thread(target=self._renew, name=f"lease {self.key}", daemon=True)
        self._thread.start()

    def _renew_once(self) -> None:
        """One renewal; sets :attr:`lost` when the lease is gone or has been unrenewed for a lease time."""
        with self._mutex:
            if self.lost:
                return
            try:
                if self._shared:
                    self.etag = self.files._put(self.pin_key, self._body())
                    self._renewed_at = time.monotonic()
                    return
                etag = self.files._put(self.key, self._body(), if_match=self.etag)
            except Exception as exc:  # an outage: keep trying while the lease lasts
                if time.monotonic() - self._renewed_at > self.seconds:
                    self.lost = True
                    log.error(
                        "lock %s: not renewed for a lease time (%s); another run may have taken it, so this build "
                        "will not publish",
                        self.files.where(self.key),
                        _scrub(str(exc)),
                    )
                else:
                    log.warning("lock %s: renewing failed (%s); retrying", self.files.where(self.key), _scrub(str(exc)))
                return
            if etag is None:
                self.lost = True
                log.error(
                    "lock %s: another run took this lock over (this one did not renew it in time); this build "
                    "will not publish",
                    self.files.where(self.key),
                )
                return
            self.etag, self._renewed_at = etag, time.monotonic()

    def _renew(self) -> None:
        while not self._stop.wait(self.seconds / 3) and not self.lost:
            self._renew_once()

    def confirm(self) -> bool:
        """Renew now (a compare-and-swap): whether this process still holds the lease."""
        self._renew_once()
        return not self.lost

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(Exception):
            if self._shared:
                self.files._delete(self.pin_key)
            elif not self.lost and self.etag is not None:
                self.files._delete(self.key, if_match=self.etag)
