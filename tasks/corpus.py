"""Stage ``corpus`` (task ``download_corpus``): the wikitext-103-raw-v1 zip → plain-text splits + wikipedia.txt.

What the version holds (``corpus/<v>/``)::

    wiki.train.txt  wiki.valid.txt  wiki.test.txt   each split, = Header = lines stripped
    wikipedia.txt                                   train + valid + test stripped, in that order

``wikipedia.txt`` is byte-identical to what the chapter's ``experiments/50_download_wikipedia.py`` writes
from the same zip on Linux/macOS. The chapter reads each ``.raw`` member in text mode (strict UTF-8,
universal newlines: ``\\r\\n`` and a lone ``\\r`` both become ``\\n``), applies
``re.sub(r"^\\s*=+ [^=]+ =+\\s*$\\n?", "", text, flags=re.MULTILINE)`` and writes the result in text mode
(``\\n`` stays ``\\n`` where ``os.linesep`` is ``\\n``). We do exactly that, streamed: see
:func:`tasks.wikitext.header_strip.strip_headers` for why cutting the text into blocks gives the same result as one
``re.sub`` over a whole split, so memory stays at a few blocks (~4 Mi characters each) instead of a whole 540 MB
split.

The zip is *not* published: it lives in the build's ``work/`` folder (so an interrupted download resumes)
and is deleted on publish. Its size and sha256 are in the manifest metrics, so the published text can be
traced to the exact archive; re-fetch it from ``source_url`` if you need it.

**What the version depends on** (issue 21 item 4, issue 20 item 6): the zip's *content* -- the sha256 and size
of its bytes (:func:`source_identity`, recorded as the manifest's ``source``) -- plus ``expected_bytes``,
``expected_sha256`` and the code version; not ``source_url``, which says where the zip comes from, not what it
is (:meth:`CorpusSettings.version_params`). The same bytes from another mirror or port, a file:// copy or a
renewed signed URL give the same version, so every later stage is reused. A sha256 needs the bytes, so the
stage keeps an index under ``<root>/corpus/.sources/`` (atomic JSON files, no credentials, no query values):
what a server said -- the address (a sha256 of the URL without its user info:
:func:`tasks.core.urls.address_sha256`), a strong ``ETag`` (with the size and any ``Last-Modified``); for a
file:// zip its path, size and mtime -- to the sha256 of the bytes it served. When the probe (a one-byte
``Range`` request) matches an entry, that is the identity: no download. Otherwise the zip is downloaded first
(resumable, bounded, into ``corpus/.sources/downloads/``; the build moves it into its work folder, or it is
deleted when those bytes are published already) and hashed; when the server's validators cannot name a content
(no strong ETag: none, only a size, a weak ETag, a ``Last-Modified`` alone -- one-second resolution, a weak
validator -- or ETags that change between requests) a warning says the run cannot tell, every run downloads,
and the answer is not recorded. The build hashes what it reads and stops if that differs from the version's
sha256 (the file changed meanwhile; the index entry is dropped), and drops the entry too when the zip turns out
damaged. When the source cannot be reached (network, 5xx, 401/403 -- an expired signed URL), the newest version
published from the same address (``source_url_sha256`` in its metrics) and settings is reused, with a warning,
after two tries of the probe (so a finished pipeline reruns offline, without a download's back-off); a 404 or
410 is an answer, not unreachability: the run fails, naming the URL.

**Credentials** in ``source_url`` (``https://user:password@host/...``, or a signed URL's query) are used to
download and nowhere else: every URL the stage shows or stores -- logs, error messages, the manifest, the UI
report, the source index, the settings Prefect records for a run -- has its user info and query values replaced
by ``***`` (:func:`tasks.core.urls.redact_url`); messages that quote it in another encoding (an HTTP library's
errors quote the query percent-encoded) are redacted in that encoding too (:func:`tasks.core.urls.redact_text`).

**Bounds.** The download stops as soon as it exceeds ``expected_bytes`` (or
:data:`tasks.wikitext.download.MAX_ZIP_BYTES` without one); before anything is unzipped,
:func:`tasks.wikitext.unzip.check_members` refuses encrypted members, compression methods Python cannot read,
compressed sizes that run past the bytes really there, and zip bombs; while unzipping,
:func:`tasks.wikitext.unzip.member_bytes` counts the bytes each member really produces and stops, naming the member,
as soon as they pass its declared size (whatever the compression method), and the header strip keeps memory
bounded whatever the line length (:func:`tasks.wikitext.header_strip.strip_headers`).

**Where the work is done.** This module is the stage: its settings, where the zip comes from, the split files
it writes, its report. The machinery it uses: ``tasks/wikitext/download.py`` (the resumable download with
retries, streamed into ``work/source.zip.part``, and its ``WIKI_PIPELINE_*`` knobs, checked by
:meth:`DownloadKnobs.from_env` before the pipeline starts), ``tasks/wikitext/unzip.py`` (the zip checks and the
threaded unzip), ``tasks/wikitext/header_strip.py`` (the chapter's header strip, streamed) and
``tasks/core/urls.py`` (credentials out of URLs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import time
import urllib.parse
from datetime import datetime
from pathlib import Path

from pydantic import Field, field_validator, model_serializer

from mygpt.atomic import atomic_write_text
from mygpt.errors import UserError
from tasks.core.faults import fault_point
from tasks.core.report import human_bytes, md_code, summary_table
from tasks.core.settings import Settings
from tasks.core.stage import BuildContext, Stage, stage_task
from tasks.core.urls import address_sha256, file_path, redact_url, stored_url
from tasks.store.artifacts import ArtifactStore, VersionInfo, sha256_file
from tasks.wikitext.download import MAX_ZIP_BYTES, DownloadKnobs, SourceUnreachable, fetch, probe
from tasks.wikitext.extract import extract_text
from tasks.wikitext.header_strip import BLOCK_CHARS
from tasks.wikitext.source_index import SourceIndex, trusted
from tasks.wikitext.unzip import check_members

DEFAULT_URL = "https://wikitext.smerity.com/wikitext-103-raw-v1.zip"
PINNED_BYTES = 191_984_949  # the chapter's EXPECTED_BYTES for DEFAULT_URL
SPLITS = ("train", "valid", "test")
MEMBERS = {s: f"wikitext-103-raw/wiki.{s}.raw" for s in SPLITS}
SPLIT_FILES = {s: f"wiki.{s}.txt" for s in SPLITS}
CORPUS_FILE = "wikipedia.txt"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
#: Tries of the probe when a version published from the same address can stand in (one retry): an offline
#: rerun should not wait out a download's back-off (2+4+8+16+32 s by default) before reusing it.
FALLBACK_PROBE_ATTEMPTS = 2


# ---- settings ----------------------------------------------------------------------------------------
class CorpusSettings(Settings):
    """Where the wikitext-103-raw-v1 zip comes from and how it is checked."""

    source_url: str = Field(
        DEFAULT_URL,
        description="the wikitext-103-raw-v1 zip: an http(s):// URL, or file:///absolute/path for a local copy",
    )
    expected_bytes: int | None = Field(
        None,
        ge=0,
        description="the zip's exact size in bytes; null = the pinned "
        "191984949 for the default URL and no check for "
        "others; 0 = no size check",
    )
    expected_sha256: str | None = Field(
        None, description="the sha256 of the zip (64 hex digits, the output of sha256sum); checked when given"
    )

    @field_validator("source_url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        url = url.strip()
        if not url:
            raise ValueError("source_url must be an http(s):// or file:// URL of the wikitext-103-raw-v1 zip, got ''")
        shown = redact_url(url)
        odd = sorted({c for c in url if c == "\\" or c.isspace() or not c.isprintable()})
        if odd:  # parsers disagree on these (requests ends the host at a backslash, urllib.parse does not)
            raise ValueError(
                f"source_url {shown!r} holds {', '.join(map(repr, odd))}, which a URL cannot hold as it is; "
                "percent-encode it (e.g. %5C for a backslash, %20 for a space)"
            )
        parsed = urllib.parse.urlparse(url)
        scheme = parsed.scheme.lower()
        try:
            parsed.port  # noqa: B018 (raises for a port that is not a number in 0..65535)
        except ValueError:
            raise ValueError(f"source_url {shown!r} has a port that is not a number from 1 to 65535") from None
        if scheme not in ("http", "https", "file"):
            raise ValueError(
                f"source_url {shown!r} has scheme {parsed.scheme or '(none)'!r}; use an http://, "
                "https:// or file:// URL (for a local zip: "
                "file:///absolute/path/to/wikitext-103-raw-v1.zip)"
            )
        if scheme in ("http", "https") and not parsed.hostname:
            raise ValueError(f"source_url {shown!r} has no host; write it as {scheme}://host/path")
        if scheme == "file":
            if parsed.netloc not in ("", "localhost"):
                raise ValueError(
                    f"source_url {shown!r}: a file:// URL cannot name a host ({parsed.hostname or redact_url(url)!r}); "
                    "use file:///absolute/path"
                )
            if not parsed.path.startswith("/"):
                raise ValueError(f"source_url {shown!r}: a file:// URL needs an absolute path (file:///...)")
        return url

    @field_validator("expected_bytes", mode="before")
    @classmethod
    def _check_size(cls, value):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(
                f"expected_bytes must be a whole number of bytes >= 0 (0 = don't check the size), got {value!r}"
            )
        return value

    @field_validator("expected_sha256")
    @classmethod
    def _check_sha256(cls, value: str | None) -> str | None:
        if value is not None and not _SHA256_RE.match(value.strip().lower()):
            raise ValueError(f"expected_sha256 must be 64 hexadecimal digits (the output of sha256sum), got {value!r}")
        return value.strip().lower() if value is not None else None

    @model_serializer(mode="wrap")
    def _without_credentials(self, handler, info):
        """The JSON form -- the version id, the manifest, the UI's settings table, the parameters Prefect keeps
        of a run -- never carries credentials (see :func:`tasks.core.urls.credentials_revealed` for the one
        exception)."""
        data = handler(self)
        if info.mode_is_json() and "source_url" in data:
            data["source_url"] = stored_url(data["source_url"])
        return data

    def version_params(self) -> dict:
        """What the version id is computed from: the settings without ``source_url`` -- the URL says where the
        zip comes from, not what it is; the content identity (:func:`source_identity`) says what."""
        params = super().version_params()
        params.pop("source_url", None)
        return params

    def resolved(self) -> CorpusSettings:
        """``expected_bytes`` settled: the pinned size for the default URL, 0 (no check) for others."""
        if self.expected_bytes is not None:
            return self
        return self.model_copy(update={"expected_bytes": PINNED_BYTES if self.source_url == DEFAULT_URL else 0})

    def progress_unit(self) -> tuple[str, float]:
        return ("B", 1)  # download and unzip progress count bytes

    @property
    def shown_url(self) -> str:
        """``source_url`` without credentials: the only form logs and messages use."""
        return redact_url(self.source_url)

    @property
    def address(self) -> str:
        """The sha256 of ``source_url`` without its user info (:func:`tasks.core.urls.address_sha256`): what
        names the address in the source index, the download's file name and the fallback, where the redacted
        form would confuse ``?f=A.zip`` with ``?f=B.zip``."""
        return address_sha256(self.source_url)

    @property
    def is_file(self) -> bool:
        return self.source_url.lower().startswith("file:")

    @property
    def max_zip_bytes(self) -> int:
        """The most the download may bring: ``expected_bytes`` when given, else
        :data:`tasks.wikitext.download.MAX_ZIP_BYTES`."""
        return self.expected_bytes or MAX_ZIP_BYTES


# ---- what is at source_url: the content identity ---------------------------------------------------------------
def _index(store: ArtifactStore) -> SourceIndex:
    """``<root>/corpus/.sources/``: what servers said -> the sha256 of the bytes they served, and the downloads
    made to learn it."""
    return SourceIndex(store.stage_dir(STAGE.name) / ".sources")


def source_identity(settings: CorpusSettings, store: ArtifactStore, log) -> dict:
    """The content identity of the zip at ``source_url``, for the version id (``Stage.source``; see the module
    docstring): ``{"sha256", "bytes"}`` of its bytes, whatever URL served them.

    It comes from the index when what the server says now about the same address (a strong ``ETag``, with the
    size and ``Last-Modified`` it sends; for a file:// zip its path, size and mtime) was recorded with a sha256
    before: one probe, no download. Otherwise the zip is downloaded now (resumable, bounded, into
    ``corpus/.sources/downloads/``; the build then uses it) and hashed, and the answer recorded when the server's
    validators can be trusted -- with a warning when they cannot (no strong ETag: none, only a size, a weak
    ETag, only a ``Last-Modified``; or ETags changing between requests). Unreachable (network, 5xx, 401/403):
    the identity of the newest version published from the same address (reused, with a warning; the probe then
    tries twice, not ``WIKI_PIPELINE_DOWNLOAD_ATTEMPTS`` times), else ``UserError``. A 404/410 is an answer, not
    unreachability: ``UserError``, whatever was published before. A size that differs from ``expected_bytes``,
    or a sha256 that differs from ``expected_sha256``, is refused here."""
    if settings.is_file:
        path = file_path(settings.source_url)
        if not path.is_file():
            raise UserError(f"source_url {settings.shown_url!r}: there is no file {path}; check the path")
        st = path.stat()
        key = {"file": str(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
        identity = _index(store).recall(key)
        if identity is None:
            size, sha = _check_zip(path, settings, ours=False)
            identity = {"sha256": sha, "bytes": size}
            _index(store).remember(key, identity)
        return _checked(identity, settings)
    fallback = _last_known_version(settings, store)
    knobs = DownloadKnobs.from_env()
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
    identity = _index(store).recall(key) if is_trusted else None
    if identity is not None:
        return _served(settings, store, _checked(identity, settings))
    if not is_trusted:
        log.warning(
            "corpus: %s sends no strong ETag (%s), so this run cannot tell whether the file there changed "
            "without downloading it: downloading it to hash it (every run does)",
            settings.shown_url,
            _source_line(validators),
        )
    with _index(store).downloading(settings.address) as dest:  # two runs of one address: one downloads at a time
        return _served(settings, store, _download_and_hash(settings, store, key, validators, dest, log))


def _served(settings: CorpusSettings, store: ArtifactStore, identity: dict) -> dict:
    """``identity``, noted as what the address serves now (the offline fallback reuses what it served last)."""
    _index(store).mark_served(settings.address, identity["sha256"])
    return identity


def _download_and_hash(
    settings: CorpusSettings, store: ArtifactStore, key: dict, validators: dict, dest: Path, log
) -> dict:
    """Download the zip to ``dest`` and hash it (see :func:`source_identity`); record the answer when the
    server's validators name one content (the build forgets it again if the zip turns out damaged)."""
    announced = validators.get("bytes")
    is_trusted = trusted(validators)
    dest.unlink(missing_ok=True)  # a whole file left by a run that stopped before its build: not trusted
    log.info("download: fetching %s to learn its sha256", settings.shown_url)
    facts = fetch(
        settings.source_url,
        dest,
        knobs=DownloadKnobs.from_env(),
        identity={"bytes": announced} if announced is not None else {},
        max_bytes=settings.max_zip_bytes,
        log=log,
        progress=_download_progress(log),
    )
    got, sha = _check_zip(dest, settings, ours=True)
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
            _source_line(validators),
            _source_line({k: facts.get(k) for k in changed}),
            sha,
        )
    elif is_trusted:
        _index(store).remember(key, identity, shown=settings.shown_url)
    if store.read_manifest(STAGE.name, STAGE.version(settings, {}, identity)) is not None:
        dest.unlink(missing_ok=True)  # those bytes are published already: the version is reused
        SourceIndex.facts_path(dest).unlink(missing_ok=True)
    return identity


def _download_progress(log):
    """Progress of the download made to learn the zip's sha256 (before the build, so no build context): a log line
    every 10 %, and the stage's ``progress`` fault point (a crash here leaves a ``.part`` that the rerun resumes
    with ``Range``)."""
    shown = -10.0

    def progress(done: float, total: float, message: str) -> None:
        nonlocal shown
        fault_point(f"{STAGE.name}.progress")
        pct = 100.0 * done / total if total else 100.0
        if pct - shown >= 10 or done >= total:
            shown = pct
            log.info("corpus: %5.1f%% downloading %s (to learn its sha256)", pct, message)

    return progress


def _checked(identity: dict, settings: CorpusSettings) -> dict:
    """``identity``, unless its sha256 differs from ``expected_sha256`` (``UserError``)."""
    if settings.expected_sha256 and identity["sha256"] != settings.expected_sha256:
        raise UserError(
            f"{settings.shown_url} has sha256 {identity['sha256']} but expected_sha256 is "
            f"{settings.expected_sha256}; check source_url, or pass the right expected_sha256"
        )
    return identity


def _last_known_version(settings: CorpusSettings, store: ArtifactStore) -> VersionInfo | None:
    """The corpus version (same settings and code version) whose bytes the address served last, which a run that
    cannot reach the source reuses; None when there is none. When the address was last seen serving each zip comes
    from the source index's marks (:meth:`SourceIndex.mark_served`: every run that learns what the address holds
    notes it, whether or not its server's validators could be recorded), which also find a zip first published
    from another mirror or port; a version published from this address (``source_url_sha256`` in its metrics) with
    no mark counts from its creation. A version published before the address was recorded matches by its redacted
    ``source_url`` only when the URL has no query (``?f=***`` would match any file)."""
    params = settings.version_params()
    legacy_ok = not urllib.parse.urlsplit(settings.source_url).query
    served_here = _index(store).served_by(settings.address)  # sha256 -> when this address last served it

    def last_served(v: VersionInfo) -> float | None:
        """When this address last served ``v``'s bytes, as far as the store and the index know; None: never."""
        metrics, sha = v.manifest["metrics"], v.manifest["source"].get("sha256")
        if "source_url_sha256" in metrics:
            published_here = metrics["source_url_sha256"] == settings.address
        else:
            published_here = legacy_ok and metrics.get("source_url") == settings.shown_url
        if sha in served_here:  # this machine saw the address serve those bytes: its own clock, its last look
            return served_here[sha]
        if not published_here:
            return None
        with contextlib.suppress(ValueError, TypeError):  # published from it (here or elsewhere), not seen since
            return datetime.fromisoformat(str(v.manifest.get("created_at"))).timestamp()
        return 0.0

    ranked = [
        (when, n, v)
        for n, v in enumerate(store.versions("corpus"))
        if v.manifest.get("settings") == params
        and v.manifest.get("code_version") == STAGE.code_version
        and isinstance(v.manifest.get("metrics"), dict)
        and isinstance(v.manifest.get("source"), dict)
        and (when := last_served(v)) is not None
    ]
    return max(ranked, key=lambda r: (r[0], r[1]))[2] if ranked else None


# ---- unzip + strip ----------------------------------------------------------------------------------------
def extract_corpus(
    zip_path: Path, out_dir: Path, *, source: str, progress=None, block_chars: int = BLOCK_CHARS
) -> dict:
    """Unzip the three splits, strip headers, write the split files and wikipedia.txt. Returns per-split metrics."""
    members = {split: (MEMBERS[split], SPLIT_FILES[split]) for split in SPLITS}
    m = extract_text(
        zip_path,
        out_dir,
        members,
        CORPUS_FILE,
        source=source,
        progress=progress,
        block_chars=block_chars,
        layout_hint="source_url must point at the wikitext-103-raw-v1 zip",
    )
    return {"splits": m["members"], "wikipedia": m["joined"]}


# ---- the stage ---------------------------------------------------------------------------------------
def _check_zip(path: Path, settings: CorpusSettings, *, ours: bool) -> tuple[int, str]:
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
    if settings.expected_sha256 and sha != settings.expected_sha256:
        if ours:
            path.unlink(missing_ok=True)
        raise UserError(
            f"{shown} has sha256 {sha} but expected_sha256 is {settings.expected_sha256}; check "
            "source_url, or pass the right expected_sha256"
        )
    return size, sha


def _downloaded_zip(ctx: BuildContext, settings: CorpusSettings) -> tuple[Path, dict]:
    """The http(s) zip in the build's work/ folder: moved from the download :func:`source_identity` made to learn
    the sha256 this version names (its facts say so; it supersedes an earlier attempt's zip), reused from an
    earlier attempt, or fetched."""
    zip_path = ctx.work / "source.zip"
    cached = _index(ctx.store).download_path(settings.address)
    try:
        facts = json.loads(SourceIndex.facts_path(cached).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        facts = {}
    if isinstance(facts, dict) and ctx.source and facts.get("sha256") == ctx.source.get("sha256"):
        try:
            os.replace(cached, zip_path)  # the bytes this run's version names, downloaded to learn their sha256
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
            knobs=DownloadKnobs.from_env(),
            identity={"bytes": ctx.source["bytes"]} if ctx.source and ctx.source.get("bytes") else {},
            max_bytes=settings.max_zip_bytes,
            log=ctx.log,
            progress=lambda d, t, m: ctx.progress(d, t, "downloading " + m),
        )
        return zip_path, facts
    return zip_path, {"tries": 0, "range_requests": 0, "resumed_bytes": 0, "seconds": 0.0}


def build_corpus(ctx: BuildContext, settings: CorpusSettings) -> dict:
    """Fetch the zip (or open the file:// one), check it, and write the stripped splits + wikipedia.txt."""
    shown = settings.shown_url
    t0 = time.monotonic()
    facts: dict = {"tries": 0, "range_requests": 0, "resumed_bytes": 0, "seconds": 0.0}
    ours = not settings.is_file
    if ours:
        zip_path, facts = _downloaded_zip(ctx, settings)
    else:
        zip_path = file_path(settings.source_url)
    size, sha = _check_zip(zip_path, settings, ours=ours)
    if ctx.source and sha != ctx.source.get("sha256"):
        if ours:
            zip_path.unlink(missing_ok=True)
            _index(ctx.store).forget(settings.address, ctx.source.get("sha256", ""))
        raise UserError(
            f"{shown} now holds other bytes (sha256 {sha}) than the ones this run's version names "
            f"({ctx.source.get('sha256')}): the file changed while this run was using it; rerun to use the new file"
        )
    download_seconds = round(time.monotonic() - t0, 3)
    ctx.log.info("download: %s is %s, sha256 %s", shown, human_bytes(size), sha)
    t1 = time.monotonic()
    try:
        check_members(zip_path, shown, MEMBERS.values())
        corpus = extract_corpus(zip_path, ctx.out, source=shown, progress=lambda d, t, m: ctx.progress(d, t, m))
    except UserError:
        if ours:
            zip_path.unlink(missing_ok=True)  # a rerun fetches again instead of reusing a bad archive ...
            _index(ctx.store).forget(settings.address, sha)  # ... and does not take its sha256 for the address's
        raise
    ctx.progress(1, 1, "done", force=True)
    return {
        "source_url": shown,
        "source_url_sha256": settings.address,  # the address, told apart where the redacted URL cannot
        "zip_bytes": size,
        "zip_sha256": sha,
        "zip_published": False,
        "download_seconds": download_seconds,
        "download": facts,
        "extract_seconds": round(time.monotonic() - t1, 3),
        **corpus,
    }


def _source_line(source: dict | None) -> str:
    if not source:
        return "(no ETag, Last-Modified or size)"
    names = {
        "bytes": "size",
        "mtime_ns": "modified (ns)",
        "etag": "ETag",
        "last_modified": "Last-Modified",
        "sha256": "sha256",
    }
    return "; ".join(f"{names.get(k, k)} `{v}`" for k, v in source.items())


def report(manifest: dict) -> str:
    m = manifest.get("metrics", {})
    d = m.get("download", {})
    lines = [
        f"# corpus `{manifest['version']}`",
        "",
        summary_table(
            [
                ("source", md_code(redact_url(m.get("source_url") or ""))),
                ("source identity (part of the version)", _source_line(manifest.get("source"))),
                ("zip", f"{m.get('zip_bytes', 0):,} bytes, sha256 `{m.get('zip_sha256')}` (not kept)"),
                (
                    "download",
                    f"{m.get('download_seconds', 0):.1f} s; {d.get('tries', 0)} request(s), "
                    f"{d.get('range_requests', 0)} of them resuming (Range); {d.get('resumed_bytes', 0):,} bytes kept "
                    "from an interrupted run",
                ),
                ("unzip + strip", f"{m.get('extract_seconds', 0):.1f} s"),
            ]
        ),
        "",
        "| file | bytes | chars | lines | header matches stripped | lines removed | sha256 |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for split in SPLITS:
        st = m.get("splits", {}).get(split)
        if not st:
            continue
        lines.append(
            f"| {SPLIT_FILES[split]} | {st['bytes']:,} | {st['chars']:,} | {st['lines']:,} | "
            f"{st['headers_stripped']:,} | {st['lines_removed']:,} | `{st['sha256'][:16]}…` |"
        )
    w = m.get("wikipedia")
    if w:
        lines.append(
            f"| **{CORPUS_FILE}** | {w['bytes']:,} | {w['chars']:,} | {w['lines']:,} | | | `{w['sha256'][:16]}…` |"
        )
    return "\n".join(lines) + "\n"


#: code version 3: the version also depends on what is at source_url and on the URL without its credentials;
#: 4: on the zip's content (sha256), not on the URL.
STAGE = Stage(
    name="corpus",
    settings=CorpusSettings,
    code_version="4",
    build=build_corpus,
    report=report,
    source=source_identity,
    alias="download",
    headline=lambda m: f"{(m.get('wikipedia') or {}).get('chars', 0):,} chars",
)
download_corpus = stage_task(STAGE, "download_corpus", "Download wikitext-103-raw-v1 (or reuse that version).")
