"""The offline fallback: the published version whose bytes an unreachable address served last (the corpus's zip,
a pretrained tokenizer's file)."""

from __future__ import annotations

import contextlib
import urllib.parse
from datetime import datetime

from tasks.core.stage import Stage
from tasks.sources.fetched import FetchedSource, stage_sources
from tasks.store import ArtifactStore, VersionInfo

#: Tries of the probe when a version can stand in: an offline rerun should not wait out a download's back-off.
FALLBACK_PROBE_ATTEMPTS = 2


def last_known_version(settings: FetchedSource, store: ArtifactStore, stage: Stage) -> VersionInfo | None:
    """The corpus's: the version (same settings and code version) whose zip ``source_url`` served last; None when
    there is none. A version from before addresses were recorded matches by its redacted ``source_url`` only when
    the URL has no query (``?f=***`` would match any file)."""
    legacy = None if urllib.parse.urlsplit(settings.source_url).query else settings.shown_url
    return last_served_version(store, stage, settings.address, settings.version_params(), legacy)


def last_served_version(
    store: ArtifactStore, stage: Stage, address: str, params: dict | None = None, legacy_url: str | None = None
) -> VersionInfo | None:
    """The published version of ``stage`` (its code version; with ``params``, those settings) whose source the
    address ``address`` (:func:`tasks.core.urls.address_sha256`) served last; None when there is none. Any stage
    whose version names what it reads from an address (``Stage.source``) falls back by it.

    The source index's marks say when this machine last saw the address serve each content; a version published
    from the address (``source_url_sha256`` in its metrics) and not seen since counts from its creation; one
    published before addresses were recorded, only by its redacted ``metrics["source_url"]`` equal to
    ``legacy_url``."""
    served_here = stage_sources(store, stage.name).served_by(address)

    def last_served(v: VersionInfo) -> float | None:
        metrics, sha = v.manifest["metrics"], v.manifest["source"].get("sha256")
        if "source_url_sha256" in metrics:
            published_here = metrics["source_url_sha256"] == address
        else:
            published_here = legacy_url is not None and metrics.get("source_url") == legacy_url
        # this machine saw the address serve those bytes: its own clock, its last look
        if isinstance(sha, str) and sha in served_here:
            return served_here[sha]
        if not published_here:
            return None
        with contextlib.suppress(ValueError, TypeError):
            return datetime.fromisoformat(str(v.manifest.get("created_at"))).timestamp()
        return 0.0

    ranked = [
        (when, n, v)
        for n, v in enumerate(store.versions(stage.name))
        if (params is None or v.manifest.get("settings") == params)
        and v.manifest.get("code_version") == stage.code_version
        and isinstance(v.manifest.get("metrics"), dict)
        and isinstance(v.manifest.get("source"), dict)
        and (when := last_served(v)) is not None
    ]
    return max(ranked, key=lambda r: (r[0], r[1]))[2] if ranked else None
