"""A source file in object storage (``s3://bucket/key``): its size, and its copy on this machine, resumed after a
crash from the bytes already copied. Credentials and endpoint come from the AWS environment, as the artifact
store's do (``tasks.store.filesystem``); a URL never carries them."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from mygpt.atomic import atomic_write_text
from mygpt.errors import UserError
from tasks.core.report import human_bytes

SCHEME = "s3"
BLOCK_BYTES = 8 << 20  # one ranged read: what a copy holds in memory


def is_s3(url: str) -> bool:
    return urllib.parse.urlsplit(url).scheme.lower() == SCHEME


def check_s3_url(url: str, field: str) -> str:
    """``url`` (its scheme in lower case) when it is ``s3://bucket/key``: a bucket's name, no credentials, query
    or fragment, no ``.``/``..`` segment or ``%``-escape (the allowed-sources list resolves those, S3 does not:
    a key read literally could lie outside the prefix the list admits); else ``ValueError``, never echoing the
    URL."""
    from tasks.store.s3_urls import _BUCKET_RE, _UNSAFE

    parts = urllib.parse.urlsplit(url)
    if not _BUCKET_RE.fullmatch(parts.netloc) or parts.query or parts.fragment or "#" in url:
        raise ValueError(
            f"{field}: an s3:// URL names a bucket and a key only (s3://bucket/path/file, the bucket's name 3-63 "
            "lower-case letters, digits, '.' or '-'); credentials and the endpoint come from the AWS environment "
            "(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)"
        )
    segments = parts.path.split("/")[1:]
    if not segments or not segments[-1]:
        raise ValueError(f"{field}: s3://{parts.netloc}{parts.path} names no object; write it s3://bucket/path/file")
    if any(p in (".", "..") or any(c in _UNSAFE or c == "%" for c in p) for p in segments):
        raise ValueError(
            f"{field}: s3://{parts.netloc}/...: a '.' or '..' segment, a %-escape or one of "
            f"{' '.join(sorted(_UNSAFE))} in the key; write the object's key as it is"
        )
    return urllib.parse.urlunsplit(parts._replace(scheme=SCHEME))


@contextlib.contextmanager
def _s3_errors(url: str) -> Iterator[None]:
    """A failure of the object store as a ``UserError`` naming ``url`` and what to check."""
    from tasks.store.s3_client import s3_error
    from tasks.store.s3_urls import scrub

    try:
        yield
    except UserError:
        raise
    except FileNotFoundError:
        raise UserError(f"{url}: no such object (or bucket); check the URL") from None
    except Exception as exc:
        code = (s3_error(exc) or ("",))[0]
        why = "access denied: check the credentials in the AWS environment" if code == "AccessDenied" else ""
        raise UserError(
            f"{url}: the object store failed ({why or f'{type(exc).__name__}: {scrub(str(exc))}'}); check the "
            "bucket exists and that AWS_ENDPOINT_URL and the credentials in the environment reach it, then rerun"
        ) from None


def s3_info(url: str) -> dict:
    """``{"bytes", "etag"}`` of the object at ``url``."""
    from tasks.store import filesystem

    with _s3_errors(url):
        info = filesystem().info(url)
    if info.get("type") == "directory":
        raise UserError(f"{url}: a folder, not an object; give the file's URL")
    return {"bytes": int(info["size"]), "etag": str(info.get("ETag") or "")}


def fetch_s3(url: str, dest: Path, *, max_bytes: int, log=None) -> dict:
    """Copy the object at ``url`` to ``dest`` (via ``dest.part``, resumed from its length while the object's
    ETag is the one the copy began with), in ranged reads of :data:`BLOCK_BYTES`; ``dest`` appears only whole.
    ``UserError`` past ``max_bytes`` (nothing copied) or when the store fails. The download's facts."""
    from tasks.store import filesystem

    info = s3_info(url)
    size = info["bytes"]
    if size > max_bytes:
        raise UserError(f"{url} is {human_bytes(size)}, over the {human_bytes(max_bytes)} a source may be")
    part = dest.with_name(dest.name + ".part")
    meta_path = dest.with_name(dest.name + ".json")
    try:
        began = json.loads(meta_path.read_text(encoding="utf-8")) if part.exists() else {}
    except (OSError, ValueError):
        began = {}
    if began != info or part.stat().st_size > size:  # another object, or the same one changed: from the start
        part.unlink(missing_ok=True)
        atomic_write_text(meta_path, json.dumps(info))
    have = part.stat().st_size if part.exists() else 0
    resumed, t0, shown_at = have, time.monotonic(), 0.0
    if log and have:
        log.info("download: resuming %s at %s of %s", url, human_bytes(have), human_bytes(size))
    with _s3_errors(url), filesystem().open(url, "rb", cache_type="none") as src, open(part, "ab") as out:
        src.seek(have)
        while have < size:
            block = src.read(min(BLOCK_BYTES, size - have))
            if not block:
                raise UserError(f"{url}: the object ended at {have:,} of its {size:,} bytes; rerun to resume")
            out.write(block)
            have += len(block)
            if log and time.monotonic() - shown_at > 10:
                shown_at = time.monotonic()
                log.info("download: %s of %s from %s", human_bytes(have), human_bytes(size), url)
    part.replace(dest)
    meta_path.unlink(missing_ok=True)
    return {"tries": 1, "range_requests": 1 if resumed else 0, "resumed_bytes": resumed,
            "seconds": round(time.monotonic() - t0, 3)}  # fmt: skip
