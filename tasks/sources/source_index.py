"""What a source said about its bytes, remembered (``<root>/<stage>/.sources/``): the index that lets a
content-addressed version be found with one probe, not a download (docs/CORPUS.md, "The source index")."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

from mygpt.atomic import atomic_write_text
from tasks.store import canonical_json
from tasks.store.manifest_schema import SHA256_RE


def trusted(validators: dict) -> bool:
    """Whether a server's answer names one content: a strong ``ETag`` only (not a size, a weak ETag, nor a
    ``Last-Modified``, which a file replaced with its mtime kept repeats)."""
    etag = validators.get("etag") or ""
    return bool(etag and not etag.startswith("W/"))


class SourceIndex:
    """What sources said -> the content identity of the bytes they served (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def _path(self, key: dict) -> Path:
        return self.dir / (hashlib.sha256(canonical_json(key).encode("utf-8")).hexdigest()[:32] + ".json")

    def recall(self, key: dict) -> dict | None:
        """The content identity ``{"sha256", "bytes"}`` recorded for ``key``, or None."""
        try:
            entry = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("key") != key or not SHA256_RE.fullmatch(str(entry.get("sha256"))):
            return None
        return {"sha256": entry["sha256"], "bytes": entry.get("bytes")}

    def remember(self, key: dict, identity: dict, shown: str | None = None) -> None:
        """Record (atomically) that ``key`` named the bytes of ``identity``; ``shown``, the redacted URL, beside it."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        entry = {"key": key, **identity, **({"shown_url": shown} if shown else {})}
        atomic_write_text(path, json.dumps(entry, sort_keys=True))

    def _served_path(self, address: str) -> Path:
        return self.dir / "served" / f"{address[:32]}.json"

    def served_by(self, address: str) -> dict[str, float]:
        """{sha256: when ``address`` last served it, epoch seconds}: what an offline run of it may fall back to."""
        try:
            found = json.loads(self._served_path(address).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(found, dict) or found.get("address") != address or not isinstance(found.get("served"), dict):
            return {}
        return {
            sha: float(t)
            for sha, t in found["served"].items()
            if SHA256_RE.fullmatch(str(sha)) and isinstance(t, int | float)
        }

    def mark_served(self, address: str, sha256: str, forget: bool = False) -> None:
        """Note (atomically) that ``address`` serves ``sha256`` now -- every run that learns what an address holds
        does, whether its server's validators could be recorded or not -- or, with ``forget``, that it does not."""
        served = self.served_by(address)
        served.pop(sha256, None)
        if not forget:
            served[sha256] = time.time()
        path = self._served_path(address)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"address": address, "served": served}, sort_keys=True))

    def forget(self, address: str, sha256: str) -> None:
        """Drop every entry that says the address ``address`` (its sha256) serves ``sha256`` (it no longer does,
        or those bytes were damaged), and its mark as served there."""
        for path in self.dir.glob("*.json"):
            try:
                entry = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            key = entry.get("key") if isinstance(entry, dict) else None
            if isinstance(key, dict) and entry.get("sha256") == sha256 and key.get("address") == address:
                path.unlink(missing_ok=True)
        self.mark_served(address, sha256, forget=True)

    def download_path(self, address: str) -> Path:
        """Where a download made to learn the identity of the address ``address`` (its sha256) waits for its
        build."""
        return self.dir / "downloads" / f"{address[:32]}.zip"

    @staticmethod
    def facts_path(download: Path) -> Path:
        """What the server said when ``download`` was fetched (the build's metrics report it)."""
        return download.with_name(download.name + ".facts.json")

    @contextlib.contextmanager
    def downloading(self, address: str) -> Iterator[Path]:
        """The download path of ``address``, held exclusively: two runs of the same address download one at a
        time."""
        dest = self.download_path(address)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest.with_name(dest.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield dest
