"""``s3://bucket/prefix`` artifact roots: recognised, checked and written one way; URLs scrubbed for messages."""

from __future__ import annotations

import re

SCHEME = "s3://"
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
_UNSAFE = set("*?[]{}#\\")
MAX_PREFIX_BYTES = 512


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


def normal_url(url: str) -> str:
    bucket, prefix = split_url(url)
    return f"{SCHEME}{bucket}/{prefix}" if prefix else f"{SCHEME}{bucket}"


def scrub(text: str) -> str:
    """``text`` without user info or query strings of URLs in it (an endpoint URL may carry a token)."""
    text = re.sub(r"//[^/@\s\"']+@", "//***@", text)
    return re.sub(r"(https?://[^\s\"'?]*)\?[^\s\"']*", r"\1?***", text)
