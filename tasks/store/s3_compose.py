"""A file that is other files of its build one after another (``Build.joined``), made on S3 from the objects already
uploaded: a multipart upload whose parts are server-side copies of them (``UploadPartCopy``), so its bytes are sent
once, not twice. Why this way: a build's output that concatenates its other outputs (the corpus's wikipedia.txt)
would otherwise double what a publish sends. Each copied part is checked against the joined file's own bytes at
that place (its ETag, the MD5 of the bytes copied) before the upload is completed, and what is sent is read from
the joined file: so the object is the file the manifest's sha256 was computed from, and the build's claim needs
no hashing pass of its own. A part object changed since its upload, a claim that is false, or an ETag that is no
MD5 (as with SSE-KMS) makes the caller upload the file as it is -- never a wrong object."""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tasks.store.files import JOINED

log = logging.getLogger(__name__)

#: S3's bounds on a multipart upload's parts: every part but the last at least 5 MiB; a copied part at most 5 GiB.
MIN_PART_BYTES = 5 << 20
MAX_COPY_BYTES = 5 << 30

#: A part: ``("copy", file, start, end)`` (a range of an uploaded file) or ``("send", [(file, start, end), ...])``.
Part = tuple


def plan_parts(sizes: list[tuple[str, int]], min_part: int = MIN_PART_BYTES, max_copy: int = MAX_COPY_BYTES) -> list:
    """The parts that make the files ``sizes`` (``(name, bytes)``, in order) one object: a range is copied when it
    can be a part of its own (at least ``min_part``), the rest is sent, gathered into parts of exactly ``min_part``
    (the last one shorter). Every part but the last is then at least ``min_part``, as S3 requires."""
    parts: list[Part] = []
    pending: list[tuple[str, int, int]] = []
    held = 0
    for name, size in sizes:
        pos = 0
        while pos < size:
            left = size - pos
            if not held and left >= min_part:
                n = min(left, max_copy)
                parts.append(("copy", name, pos, pos + n))
            else:
                n = min(left, min_part - held)
                pending.append((name, pos, pos + n))
                held += n
                if held == min_part:
                    parts.append(("send", pending))
                    pending, held = [], 0
            pos += n
    if pending:
        parts.append(("send", pending))
    return parts


class _PartChanged(Exception):
    """A copied part's bytes are not the local file's range they stand for."""


def _range_md5(out: Path, name: str, start: int, end: int) -> str:
    """The MD5 (hex) of bytes ``start:end`` of ``out/name``: what S3 answers as the ETag of a part copied from the
    same bytes."""
    h = hashlib.md5(usedforsecurity=False)
    with open(out / name, "rb") as f:
        f.seek(start)
        left = end - start
        while left and (block := f.read(min(left, 1 << 20))):
            h.update(block)
            left -= len(block)
    return h.hexdigest()


def _read_range(out: Path, name: str, start: int, end: int) -> bytes:
    with open(out / name, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    if len(data) != end - start:
        raise RuntimeError(f"{out / name} is shorter than its {end:,} bytes while being published")
    return data


def compose(
    call: Callable[..., Any],
    bucket: str,
    object_key: Callable[[str], str],
    out: Path,
    target: str,
    parts: list[str],
    still_held: Callable[[], None] | None = None,
) -> bool:
    """Make the object ``object_key(target)`` from the objects ``object_key(part)`` (uploaded from ``out``), each
    range as :func:`plan_parts` cuts them; ``call(method, **kwargs)`` is one S3 request on ``bucket``. False (nothing
    done) when no range is long enough to be copied, or when a copied part is not the bytes of ``out/target`` at
    that place (its ETag, the copied bytes' MD5, differs: the part's object changed since its upload, or the
    claim is false): the caller uploads the file as it is. What is sent is read from ``out/target``. Why checked
    before completing: the object would be committed beside a manifest whose sha256 is the local file's. A
    failure aborts the multipart upload (nothing is left under the name) and raises."""
    sizes = [(str(i), (out / name).stat().st_size) for i, name in enumerate(parts)]  # a part named twice: two
    plan = plan_parts(sizes)
    if not any(p[0] == "copy" for p in plan):
        return False
    at, offset = {}, 0  # where each part's bytes lie in the joined file
    for i, size in sizes:
        at[i], offset = offset, offset + size
    dest = object_key(target)
    upload_id = call("create_multipart_upload", Key=dest)["UploadId"]
    try:
        done = []
        for number, part in enumerate(plan, 1):
            if still_held:
                still_held()  # a build that lost its lock sends nothing more
            common = dict(Key=dest, UploadId=upload_id, PartNumber=number)
            if part[0] == "copy":
                _, i, start, end = part
                source = {"Bucket": bucket, "Key": object_key(parts[int(i)])}
                answer = call(
                    "upload_part_copy", CopySource=source, CopySourceRange=f"bytes={start}-{end - 1}", **common
                )
                tag = answer["CopyPartResult"]["ETag"]
                if tag.strip('"') != _range_md5(out, target, at[i] + start, at[i] + end):
                    raise _PartChanged(f"{source['Key']} bytes {start:,}-{end - 1:,}")
            else:
                body = b"".join(_read_range(out, target, at[n] + a, at[n] + b) for n, a, b in part[1])
                tag = call("upload_part", Body=body, **common)["ETag"]
            done.append({"ETag": tag, "PartNumber": number})
        call("complete_multipart_upload", Key=dest, UploadId=upload_id, MultipartUpload={"Parts": done})
    except BaseException as e:
        with contextlib.suppress(Exception):
            call("abort_multipart_upload", Key=dest, UploadId=upload_id)
        if not isinstance(e, _PartChanged):
            raise
        log.warning(
            "store: %s not made from its parts' objects: the copy of %s is not the local file's bytes there (the "
            "object changed since its upload, the file is not its parts one after another, or its ETag is no MD5); "
            "uploading it as it is",
            dest,
            e,
        )
        return False
    return True


def checked_joined(manifest: dict, out: Path) -> dict[str, list[str]]:
    """The manifest's ``joined`` files (``{file: [its parts]}``), each checked against its size in the manifest
    (``RuntimeError``, a stage's bug, when its parts' sizes do not add up to it). Its bytes are not hashed again
    here: :func:`compose` checks every copied range against the file itself, so a false claim of the right size
    is never composed (the file is uploaded as it is)."""
    joined = manifest.get(JOINED) or {}
    files = manifest.get("files") or {}
    for target, parts in joined.items():
        size = (files.get(target) or {}).get("size")
        if size != sum((out / part).stat().st_size for part in parts):
            raise RuntimeError(f"{out / target} is declared to be {parts!r} one after another, and it is not")
    return joined


def upload_joined(files: Any, out: Path, folder: str, rel: str, parts: list[str], still_held=None) -> bool:
    """:func:`compose` for the ``ObjectFiles`` ``files``: ``out/<rel>`` made under ``folder`` (a key ending in ``/``)
    from its ``parts``' objects there; False when it must be uploaded as it is."""
    with files._errors(f"uploading {folder}{rel}"):
        key = files._object_key
        return compose(files._call, files.bucket, lambda n: key(folder + n), out, rel, parts, still_held)


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
