"""What a published version's manifest must hold, field by field: one check, made before any reader uses it.

A manifest that fails it is damage (the version is discarded and rebuilt, and listings show it as damaged), so
no reader of a manifest (reuse, the listings, the reports, ``pull``, gc) meets a missing field or a field of
another type. Keys the store does not know are allowed: no reader uses them."""

from __future__ import annotations

import re
import time
from typing import Any

from tasks.store.files import MANIFEST, files_prefix, safe_rel
from tasks.store.layout import VERSION_RE

CREATED_AT_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # what Build.publish writes, always UTC
SHA256_RE = re.compile(r"[0-9a-f]{64}")
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a build id or a stage's code version

# field -> (the types it may have, whether a manifest must have it)
_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "format": ((int,), True),
    "stage": ((str,), True),
    "version": ((str,), True),
    "build_id": ((str,), True),
    "code_version": ((str,), True),
    "settings": ((dict,), True),
    "inputs": ((dict,), True),
    "files": ((dict,), True),
    "metrics": ((dict,), True),
    "timings": ((dict,), True),
    "created_at": ((str,), True),
    "host": ((str,), True),
    "files_under": ((str,), False),
    "flow_run_id": ((str, type(None)), False),
    "source": ((dict,), False),
}


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _created_at_problem(text: str) -> str | None:
    try:
        time.strptime(text, CREATED_AT_FORMAT)
    except ValueError:
        return f"created_at is {text!r}, not a time written {CREATED_AT_FORMAT}"
    return None


def _input_problem(name: Any, ref: Any) -> str | None:
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        return f"inputs names {name!r}, which is not a stage"
    if not isinstance(ref, dict):
        return f"inputs.{name} is of type {_type_name(ref)}, not an object"
    version, build_id = ref.get("version"), ref.get("build_id")
    if not isinstance(version, str) or not VERSION_RE.fullmatch(version):
        return f"inputs.{name}.version is {version!r}, not a version id"
    if not isinstance(build_id, str) or not _PLAIN.fullmatch(build_id):
        return f"inputs.{name}.build_id is {build_id!r}, not a build id"
    if "digest" in ref and not (isinstance(ref["digest"], str) and SHA256_RE.fullmatch(ref["digest"])):
        return f"inputs.{name}.digest is {ref['digest']!r}, not 64 hex digits"
    if not isinstance(ref.get("stage", name), str):
        return f"inputs.{name}.stage is of type {_type_name(ref.get('stage'))}, not a stage name"
    return None


def _file_problem(rel: Any, meta: Any) -> str | None:
    if not safe_rel(rel) or rel == MANIFEST:
        return f"files lists {rel!r}, which is not a relative file name inside the version"
    if not isinstance(meta, dict):
        return f"files.{rel!r} is of type {_type_name(meta)}, not an object"
    size, sha = meta.get("size"), meta.get("sha256")
    if not (isinstance(size, int) and not isinstance(size, bool) and size >= 0):
        return f"files.{rel!r}.size is {size!r}, not a whole number of bytes"
    if not isinstance(sha, str) or not SHA256_RE.fullmatch(sha):
        return f"files.{rel!r}.sha256 is {sha!r}, not 64 hex digits"
    return None


def manifest_problem(manifest: Any, stage: str, version: str) -> str | None:
    """What is wrong with ``manifest`` as the manifest of ``stage/version`` (the first thing found), or None."""
    if not isinstance(manifest, dict):
        return f"it is of type {_type_name(manifest)}, not a JSON object"
    for field, (types, required) in _FIELDS.items():
        if field not in manifest:
            if required:
                return f"it has no {field}"
            continue
        value = manifest[field]
        if not isinstance(value, types) or isinstance(value, bool):
            return f"{field} is of type {_type_name(value)}, not {' or '.join(_type_name(t()) for t in types)}"
    if not _is_int(manifest["format"]) or manifest["format"] < 1:
        return f"format is {manifest['format']!r}, not a format number"
    if (manifest["stage"], manifest["version"]) != (stage, version):
        return f"it names {manifest['stage']!r}/{manifest['version']!r}"
    for field in ("build_id", "code_version"):
        if not _PLAIN.fullmatch(manifest[field]):
            return f"{field} is {manifest[field]!r}, not a plain name"
    problem = _created_at_problem(manifest["created_at"])
    if problem:
        return problem
    if "files_under" in manifest and not files_prefix(manifest):
        return f"files_under {manifest['files_under']!r} names a folder that is not one of the version's"
    for name, ref in manifest["inputs"].items():
        problem = _input_problem(name, ref)
        if problem:
            return problem
    for rel, meta in manifest["files"].items():
        problem = _file_problem(rel, meta)
        if problem:
            return problem
    return None
