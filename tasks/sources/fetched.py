"""The file at a source URL (the corpus's zip or text, a pretrained tokenizer's file): what a stage needs to know of
it, its checks, and the copy its build reads."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from mygpt.atomic import sha256_file
from mygpt.errors import UserError
from tasks.core.report import human_bytes
from tasks.core.stage import BuildContext
from tasks.core.urls import file_path
from tasks.sources.allowed import SourcePolicy
from tasks.sources.download import DownloadKnobs, fetch
from tasks.sources.source_index import SourceIndex
from tasks.store import ArtifactStore

NO_DOWNLOAD = {"tries": 0, "range_requests": 0, "resumed_bytes": 0, "seconds": 0.0}


class FetchedSource(Protocol):
    """The settings of a stage that reads a file from ``source_url`` (the corpus's ``CorpusSettings``)."""

    @property
    def source_url(self) -> str: ...
    @property
    def expected_bytes(self) -> int | None: ...
    @property
    def expected_sha256(self) -> str | None: ...
    @property
    def shown_url(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def is_file(self) -> bool: ...
    @property
    def max_fetch_bytes(self) -> int: ...
    def version_params(self) -> dict: ...


def stage_knobs() -> DownloadKnobs:
    """What a stage downloads with: this environment's retry knobs, and its machine's source allow-list as the
    check for every redirect (a value handed to the download, read when the stage runs)."""
    return DownloadKnobs.from_env(SourcePolicy.from_env().check_redirect)


def stage_sources(store: ArtifactStore, stage: str) -> SourceIndex:
    """``<root>/<stage>/.sources/``: what servers said, and the downloads made to learn it."""
    return SourceIndex(store.stage_dir(stage) / ".sources")


def check_fetched(path: Path, settings: FetchedSource, *, ours: bool) -> tuple[int, str]:
    """Size and sha256 of the file at ``path``, checked against the settings (``ours``: delete it when refused)."""
    shown = settings.shown_url
    size = path.stat().st_size
    want = settings.expected_bytes
    if want and size != want:
        if ours:
            path.unlink(missing_ok=True)
        raise UserError(
            f"{shown} gave {size:,} bytes but expected_bytes is {want:,}; the mirror may serve a "
            f"different file: check source_url, or pass expected_bytes={size} (0 = no size check) "
            "if you trust it"
        )
    sha = sha256_file(path)
    if ours and settings.expected_sha256 and sha != settings.expected_sha256:
        path.unlink(missing_ok=True)
    checked({"sha256": sha}, settings)
    return size, sha


def checked(identity: dict, settings: FetchedSource) -> dict:
    """``identity``, unless its sha256 differs from ``expected_sha256`` (``UserError``)."""
    if settings.expected_sha256 and identity["sha256"] != settings.expected_sha256:
        raise UserError(
            f"{settings.shown_url} has sha256 {identity['sha256']} but expected_sha256 is "
            f"{settings.expected_sha256}; check source_url, or pass the right expected_sha256"
        )
    return identity


def downloaded_file(ctx: BuildContext, settings: FetchedSource, index: SourceIndex) -> tuple[Path, dict]:
    """The http(s) file in the build's ``work/``: the download that learnt this version's sha256 (its facts say
    so), else an earlier attempt's, else fetched now; with the download's facts."""
    zip_path = ctx.work / "source.zip"
    cached = index.download_path(settings.address)
    try:
        facts = json.loads(SourceIndex.facts_path(cached).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        facts = {}
    if isinstance(facts, dict) and ctx.source and facts.get("sha256") == ctx.source.get("sha256"):
        try:
            os.replace(cached, zip_path)
        except FileNotFoundError:  # taken by another build, or collected by gc, since: fetched below
            pass
        else:
            SourceIndex.facts_path(cached).unlink(missing_ok=True)
            facts.pop("sha256")
            return zip_path, facts
    if zip_path.exists():
        ctx.log.info("download: reusing %s downloaded by an earlier attempt", zip_path)
    else:
        ctx.log.info("download: fetching %s", settings.shown_url)
        facts = fetch(
            settings.source_url,
            zip_path,
            knobs=stage_knobs(),
            identity={"bytes": ctx.source["bytes"]} if ctx.source and ctx.source.get("bytes") else {},
            max_bytes=settings.max_fetch_bytes,
            log=ctx.log,
            progress=lambda d, t, m: ctx.progress(d, t, "downloading " + m),
        )
        return zip_path, facts
    return zip_path, dict(NO_DOWNLOAD)


def source_line(source: dict | None, markdown: bool = False) -> str:
    """What a source said (its validators, or an identity), as one line for logs, or with ``markdown`` for a
    report: names and values escaped (an ETag is the server's text, and must not read as markup)."""
    if not source:
        return "(no ETag, Last-Modified or size)"
    names = {
        "bytes": "size",
        "mtime_ns": "modified (ns)",
        "etag": "ETag",
        "last_modified": "Last-Modified",
        "sha256": "sha256",
    }
    if markdown:
        from tasks.core.report import Markdown, md_code, md_text

        return Markdown("; ".join(f"{md_text(names.get(k, k))} {md_code(v)}" for k, v in source.items()))
    return "; ".join(f"{names.get(k, k)} `{v}`" for k, v in source.items())


@dataclass(frozen=True)
class Fetched:
    """The file a build reads from ``source_url``, checked: where it is, its size and sha256, the download's facts
    (``NO_DOWNLOAD`` for a file:// one) and the seconds it took."""

    path: Path
    bytes: int
    sha256: str
    facts: dict
    seconds: float


@contextlib.contextmanager
def fetched_file(ctx: BuildContext, settings: FetchedSource, stage: str) -> Iterator[Fetched]:
    """The file at ``source_url`` for the build ``ctx`` (downloaded into its ``work/``, or the file:// one), checked
    against the settings and the version's identity (``ctx.source``). A ``UserError`` raised while the caller
    reads it means the bytes are bad: a download of ours is deleted and its sha256 forgotten for the address, so a
    rerun fetches again instead of reusing a bad file."""
    shown = settings.shown_url
    index = stage_sources(ctx.store, stage)
    t0 = time.monotonic()
    facts: dict = dict(NO_DOWNLOAD)
    ours = not settings.is_file
    if ours:
        path, facts = downloaded_file(ctx, settings, index)
    else:
        path = file_path(settings.source_url)
    size, sha = check_fetched(path, settings, ours=ours)
    if ctx.source and sha != ctx.source.get("sha256"):
        if ours:
            path.unlink(missing_ok=True)
            index.forget(settings.address, ctx.source.get("sha256", ""))
        raise UserError(
            f"{shown} now holds other bytes (sha256 {sha}) than the ones this run's version names "
            f"({ctx.source.get('sha256')}): the file changed while this run was using it; rerun to use the new file"
        )
    seconds = round(time.monotonic() - t0, 3)
    ctx.log.info("download: %s is %s, sha256 %s", shown, human_bytes(size), sha)
    try:
        yield Fetched(path, size, sha, facts, seconds)
    except UserError:
        if ours:
            path.unlink(missing_ok=True)  # a rerun fetches again instead of reusing a bad file ...
            index.forget(settings.address, sha)  # ... and does not take its sha256 for the address's
        raise
