"""What two runs are compared by: a digest of each published data file, timing fields left out."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from pathlib import Path

from mygpt.atomic import sha256_file
from tasks.registry import NAMES, open_store
from tasks.store import MANIFEST

# Fields that measure time, not content: they differ between any two runs.
TIMING_KEYS = re.compile(r"(^|_)seconds$|^tokens_per_sec$|^mb_per_s$")


def _strip_timings(obj):
    if isinstance(obj, dict):
        return {k: _strip_timings(v) for k, v in obj.items() if not TIMING_KEYS.search(k)}
    if isinstance(obj, list):
        return [_strip_timings(v) for v in obj]
    return obj


def file_digest(path: Path) -> str:
    """sha256 of a data file without its timing fields (JSON, loss_history.csv) or, in a checkpoint, its version.

    A checkpoint records its own version id, which depends on upstream build ids."""
    name = path.name
    if name.endswith(".json"):
        data = _strip_timings(json.loads(path.read_text(encoding="utf-8")))
        return "json:" + hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    if name == "loss_history.csv":
        rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))
        data = [{k: v for k, v in r.items() if not TIMING_KEYS.search(k)} for r in rows]
        return "csv:" + hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    if name.endswith(".ckpt"):
        import torch

        payload = torch.load(path, map_location="cpu", weights_only=False)
        h = hashlib.sha256()
        for k, t in sorted(payload.pop("model_state_dict").items()):
            h.update(k.encode())
            h.update(t.contiguous().numpy().tobytes())
        meta = dict(payload.get("meta") or {})
        meta.pop("version", None)
        payload["meta"] = meta
        h.update(json.dumps(payload, sort_keys=True, default=str).encode())
        return "ckpt:" + h.hexdigest()
    return sha256_file(path)


def stage_digests(root: Path, stage: str, version: str | None = None) -> dict[str, str]:
    """{file: digest} of a published version's data files (not the manifest); the newest version by default."""
    store = open_store(root)
    if version is None:
        versions = store.versions(stage)
        if not versions:
            return {}
        version = versions[-1].version
    path = store.version_path(stage, version)
    return {
        str(p.relative_to(path)): file_digest(p) for p in sorted(path.rglob("*")) if p.is_file() and p.name != MANIFEST
    }


def all_digests(root: Path) -> dict[str, dict[str, str]]:
    return {stage: stage_digests(root, stage) for stage in NAMES}
