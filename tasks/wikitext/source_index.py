"""What a source said about its bytes, remembered: the index behind a content-addressed stage version.

A stage whose version follows the *content* it reads from outside the store (the corpus: the sha256 of the zip
at ``source_url``) needs the bytes to know that content, and downloading them on every run to find out would
make a cached rerun cost a download. :class:`SourceIndex` keeps, in a stage's folder of the store
(``<root>/<stage>/.sources/``, one atomic JSON file an entry, never a credential; a query only inside the
address's sha256), what a server said about an address -- the address as :func:`tasks.core.urls.address_sha256`
names it (a sha256 of the URL without its user info and signing parameters), the server's strong ``ETag``, its
``Last-Modified`` and size when it sent them; for a local file its path, size and mtime -- and the
``{"sha256", "bytes"}`` of what it served then. When a probe gets the same answer, and the answer can name one
content (:func:`trusted`: a strong ``ETag``; a ``Last-Modified`` cannot -- one-second resolution, a weak
validator), that is the identity, with no download.
Downloads made to learn an identity wait in ``.sources/downloads/`` (named by the address's sha256) for the
build that uses them. ``.sources/served/`` notes, per address, when it was last seen serving each content
(:meth:`SourceIndex.mark_served`), for the offline fallback.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

from mygpt.atomic import atomic_write_text
from tasks.store import canonical_json

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def trusted(validators: dict) -> bool:
    """Whether a server's answer names one content: a strong ``ETag`` only. A size does not (the same size can
    hold other bytes), nor a weak ``W/`` ETag, nor a ``Last-Modified``: it has a one-second resolution and is a
    weak validator (RFC 9110 8.8.2.2) -- a file replaced by one of the same size with its mtime kept (``cp -p``,
    ``rsync -t``, ``tar x``) gives the same answer."""
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
        if not isinstance(entry, dict) or entry.get("key") != key or not _SHA256_RE.match(str(entry.get("sha256"))):
            return None
        return {"sha256": entry["sha256"], "bytes": entry.get("bytes")}

    def remember(self, key: dict, identity: dict, shown: str | None = None) -> None:
        """Record (atomically) that ``key`` named the bytes of ``identity``. ``key`` never holds credentials or
        query values (an address is its :func:`~tasks.core.urls.address_sha256`); ``shown``, the redacted URL,
        is kept beside it for whoever reads the file."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        entry = {"key": key, **identity, **({"shown_url": shown} if shown else {})}
        atomic_write_text(path, json.dumps(entry, sort_keys=True))

    def _served_path(self, address: str) -> Path:
        return self.dir / "served" / f"{address[:32]}.json"

    def served_by(self, address: str) -> dict[str, float]:
        """{sha256: when ``address`` (its :func:`~tasks.core.urls.address_sha256`) last served it, epoch seconds}
        (:meth:`mark_served`), whichever address first published those bytes: what an offline run of ``address``
        may fall back to, the latest first."""
        try:
            found = json.loads(self._served_path(address).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(found, dict) or found.get("address") != address or not isinstance(found.get("served"), dict):
            return {}
        return {
            sha: float(t)
            for sha, t in found["served"].items()
            if _SHA256_RE.match(str(sha)) and isinstance(t, int | float)
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
