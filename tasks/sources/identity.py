"""The content identity of the zip at a source URL (``{"sha256", "bytes"}``): what its stage's version names."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import cast

from mygpt.atomic import atomic_write_text
from mygpt.errors import UserError
from tasks.core.faults import fault_point
from tasks.core.settings import Settings
from tasks.core.stage import Stage
from tasks.core.urls import file_path
from tasks.sources.download import SourceUnreachable, fetch, probe
from tasks.sources.fallback import FALLBACK_PROBE_ATTEMPTS, last_known_version
from tasks.sources.fetched import FetchedSource, check_fetched, checked, source_line, stage_knobs, stage_sources
from tasks.sources.source_index import SourceIndex, trusted
from tasks.store import ArtifactStore


def fetched_identity(settings: FetchedSource, store: ArtifactStore, log, stage: Stage) -> dict:
    """The sha256 and size of the zip at ``source_url``, whatever URL served it (docs/CORPUS.md).

    From the source index when the server's answer now was recorded before (one probe, no download); else
    downloaded and hashed now, and recorded when the server's validators name one content. Unreachable
    (network, 5xx, 401/403): the version the address served last, with a warning, else ``UserError``; a
    404/410 is an answer: ``UserError``. A size or sha256 other than the expected one is refused."""
    index = stage_sources(store, stage.name)
    if settings.is_file:
        path = file_path(settings.source_url)
        if not path.is_file():
            raise UserError(f"source_url {settings.shown_url!r}: there is no file {path}; check the path")
        st = path.stat()
        key = {"file": str(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
        identity = index.recall(key)
        if identity is None:
            size, sha = check_fetched(path, settings, ours=False)
            identity = {"sha256": sha, "bytes": size}
            index.remember(key, identity)
        return checked(identity, settings)
    fallback = last_known_version(settings, store, stage)
    knobs = stage_knobs()
    if fallback is not None:  # something to fall back to: ask twice (one retry), not like a first download
        knobs = dataclasses.replace(knobs, attempts=min(knobs.attempts, FALLBACK_PROBE_ATTEMPTS))
    try:
        validators = probe(settings.source_url, knobs, log)
    except SourceUnreachable as e:  # not a 404/410 (SourceMissing): that is an answer, and it fails the run
        if fallback is None:
            raise
        log.warning(
            "corpus: cannot check %s now (%s); reusing corpus/%s (published %s), the zip it served last as far as "
            "this artifact root knows: the file there may have changed since",
            settings.shown_url,
            e,
            fallback.version,
            fallback.manifest.get("created_at"),
        )
        return fallback.manifest["source"]
    announced = validators.get("bytes")
    if settings.expected_bytes and announced is not None and announced != settings.expected_bytes:
        raise UserError(
            f"{settings.shown_url} is {announced:,} bytes but expected_bytes is {settings.expected_bytes:,}; "
            f"the mirror may serve a different file: check source_url, or pass expected_bytes={announced} "
            "(0 = no size check) if you trust it"
        )
    key = {"address": settings.address, **validators}
    is_trusted = trusted(validators)
    identity = index.recall(key) if is_trusted else None
    if identity is not None:
        return _served(settings, index, checked(identity, settings))
    if not is_trusted:
        log.warning(
            "corpus: %s sends no strong ETag (%s), so this run cannot tell whether the file there changed "
            "without downloading it: downloading it to hash it (every run does)",
            settings.shown_url,
            source_line(validators),
        )
    with index.downloading(settings.address) as dest:  # two runs of one address: one downloads at a time
        identity = _download_and_hash(settings, store, stage, key, validators, dest, log)
        return _served(settings, index, identity)


def _served(settings: FetchedSource, index: SourceIndex, identity: dict) -> dict:
    """``identity``, noted as what the address serves now (the offline fallback reuses what it served last)."""
    index.mark_served(settings.address, identity["sha256"])
    return identity


def _download_and_hash(
    settings: FetchedSource, store: ArtifactStore, stage: Stage, key: dict, validators: dict, dest: Path, log
) -> dict:
    """Download the zip to ``dest`` and hash it; record the answer when the validators name one content."""
    index = stage_sources(store, stage.name)
    announced = validators.get("bytes")
    is_trusted = trusted(validators)
    dest.unlink(missing_ok=True)  # a whole file left by a run that stopped before its build: not trusted
    log.info("download: fetching %s to learn its sha256", settings.shown_url)
    facts = fetch(
        settings.source_url,
        dest,
        knobs=stage_knobs(),
        identity={"bytes": announced} if announced is not None else {},
        max_bytes=settings.max_fetch_bytes,
        log=log,
        progress=_download_progress(stage, log),
    )
    got, sha = check_fetched(dest, settings, ours=True)
    identity = {"sha256": sha, "bytes": got}
    os.utime(dest)  # finished now (a .part completed earlier keeps its old time): gc's age counts from here
    # what the build reports of this download, and the sha256 it takes it for (a stray file at this path is not it)
    atomic_write_text(SourceIndex.facts_path(dest), json.dumps({**facts, "sha256": sha}))
    changed = [k for k in ("etag", "last_modified") if validators.get(k) != facts.get(k)]
    if is_trusted and changed:
        log.warning(
            "corpus: %s named the file %s when asked, and %s when it sent it: it changes them between requests "
            "(a load balancer?), so this run cannot tell whether the file changed without downloading it "
            "(every run does); the version follows the sha256 of the bytes (%s)",
            settings.shown_url,
            source_line(validators),
            source_line({k: facts.get(k) for k in changed}),
            sha,
        )
    elif is_trusted:
        index.remember(key, identity, shown=settings.shown_url)
    # the settings are the stage's own (a FetchedSource is the view of them this module needs)
    if store.read_manifest(stage.name, stage.version(cast(Settings, settings), {}, identity)) is not None:
        dest.unlink(missing_ok=True)  # those bytes are published already: the version is reused
        SourceIndex.facts_path(dest).unlink(missing_ok=True)
    return identity


def _download_progress(stage: Stage, log):
    """A log line every 10 %, and the stage's ``progress`` fault point (a crash leaves a ``.part`` to resume)."""
    shown = -10.0

    def progress(done: float, total: float, message: str) -> None:
        nonlocal shown
        fault_point(f"{stage.name}.progress")
        pct = 100.0 * done / total if total else 100.0
        if pct - shown >= 10 or done >= total:
            shown = pct
            log.info("corpus: %5.1f%% downloading %s (to learn its sha256)", pct, message)

    return progress
