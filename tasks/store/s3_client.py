"""This process's s3fs filesystem for its AWS environment, the local cache folder, and what a botocore error says."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

ENV_CACHE = "WIKI_PIPELINE_CACHE"


def s3_error(exc: BaseException) -> tuple[str, object] | None:
    """``(error code, HTTP status)`` of the botocore error behind ``exc`` (s3fs re-raises it as an OSError)."""
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


def precondition_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is a 412 or 409 (a conditional write that lost a race), whichever OSError s3fs made of it."""
    error = s3_error(exc)
    if error is not None:
        code, status = error
        return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412)
    return "pre-conditions you specified did not hold" in str(exc) or "ConditionalRequestConflict" in str(exc)


def no_bucket(exc: BaseException) -> bool:
    error = s3_error(exc)
    return error[0] == "NoSuchBucket" if error is not None else "bucket does not exist" in str(exc)


def cache_root() -> Path:
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env).expanduser().absolute()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "wiki-pipeline"


_S3FS_BY_ENVIRONMENT: dict[tuple, Any] = {}


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
    """This process's s3fs filesystem for its AWS environment, made once (a botocore client is slow to make): no
    listings cache (another machine may have just published), bounded retries (``AWS_MAX_ATTEMPTS``, default 4)."""
    import s3fs

    env = tuple(os.environ.get(name) for name in _AWS_ENV)
    fs = _S3FS_BY_ENVIRONMENT.get(env)
    if fs is not None and getattr(fs, "_pid", None) == os.getpid():
        return fs
    try:
        attempts = max(1, min(int(os.environ.get("AWS_MAX_ATTEMPTS") or 4), 20))
    except ValueError:
        attempts = 4
    fs = _S3FS_BY_ENVIRONMENT[env] = s3fs.S3FileSystem(
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


async def read_at_most(body: Any, limit: int) -> bytes:
    """The first ``limit`` bytes of the response ``body`` (all of it when shorter); one read may return less."""
    parts, got = [], 0
    while got < limit:
        chunk = await body.read(limit - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)
