"""Stage ``corpus`` (task ``download_corpus``): the wikitext-103-raw-v1 zip → plain-text splits + wikipedia.txt.

What the version holds (``corpus/<v>/``)::

    wiki.train.txt  wiki.valid.txt  wiki.test.txt   each split, = Header = lines stripped
    wikipedia.txt                                   train + valid + test stripped, in that order

``wikipedia.txt`` is byte-identical to what the chapter's ``experiments/50_download_wikipedia.py`` writes
from the same zip on Linux/macOS. The chapter reads each ``.raw`` member in text mode (strict UTF-8,
universal newlines: ``\\r\\n`` and a lone ``\\r`` both become ``\\n``), applies
``re.sub(r"^\\s*=+ [^=]+ =+\\s*$\\n?", "", text, flags=re.MULTILINE)`` and writes the result in text mode
(``\\n`` stays ``\\n`` where ``os.linesep`` is ``\\n``). We do exactly that, streamed: see
:func:`strip_headers` for why cutting the text into blocks gives the same result as one ``re.sub`` over a
whole split, so memory stays at a few blocks (~4 Mi characters each) instead of a whole 540 MB split.

The zip is *not* published: it lives in the build's ``work/`` folder (so an interrupted download resumes)
and is deleted on publish. Its size and sha256 are in the manifest metrics, so the published text can be
traced to the exact archive; re-fetch it from ``source_url`` if you need it.

**What the version depends on.** Besides the settings, the corpus version depends on what is at
``source_url`` when the stage runs (:func:`source_identity`, recorded as the manifest's ``source``): for a
``file://`` zip its size and modification time; for http(s) what the server says about the file -- its
``ETag``, ``Last-Modified`` and size -- read from a one-byte ``Range`` request before anything else. New
content at the same address therefore gives a new version (and new downstream versions) instead of the old
corpus. A server that sends none of the three cannot be told apart over time: a warning says so; pass
``expected_sha256`` there. When the source cannot be reached at all, the newest version already published
from the same settings is reused, with a warning (so a finished pipeline reruns offline).

**Credentials** in ``source_url`` (``https://user:password@host/...``, or a signed URL's query) are used to
download and nowhere else: every URL the stage shows or stores -- logs, error messages, the manifest, the UI
report, the settings Prefect records for a run -- has its user info and query values replaced by ``***``
(:func:`redact_url`), and the version id is computed from that redacted form (plus the content identity).

**Bounds.** The download stops as soon as it exceeds ``expected_bytes`` (or :data:`MAX_ZIP_BYTES` without
one); before anything is unzipped, :func:`check_members` refuses encrypted members, compression methods
Python cannot read, and members whose declared sizes exceed :data:`MAX_UNZIPPED_BYTES` or
:data:`MAX_RATIO` times their compressed size (zip bombs). Reading a member never yields more than its
declared size (``zipfile`` stops there and checks the CRC), so those checks bound what is written.

Downloading (``requests``, streamed into ``work/source.zip.part``): a read timeout, retries with
exponential backoff on connection errors, timeouts, truncated bodies, 5xx, 408 and 429 (never on other 4xx,
which are reported at once), and resume with an HTTP ``Range`` request (checked: ``206`` with a matching
``Content-Range``; a server that ignores ``Range`` and answers ``200`` makes us start the file over, never
append). The retry loop lives inside the stage, not in Prefect task retries, so that it can keep the bytes
it already has and reset its failure count whenever a try makes progress. Knobs (environment, not part of
the version; checked by :meth:`DownloadKnobs.from_env` before the pipeline starts):
``WIKI_PIPELINE_DOWNLOAD_ATTEMPTS`` (failed tries in a row before giving up, a whole number >= 1, default 6),
``WIKI_PIPELINE_RETRY_BASE_DELAY`` (seconds before the first retry, doubled each time, capped at 60; >= 0,
default 2), ``WIKI_PIPELINE_READ_TIMEOUT`` (seconds without data, > 0, default 60).
"""

from __future__ import annotations

import codecs
import collections
import concurrent.futures
import contextlib
import contextvars
import hashlib
import itertools
import json
import math
import os
import queue
import re
import threading
import time
import urllib.parse
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from pydantic import Field, field_validator, model_serializer

from mygpt.atomic import atomic_open, atomic_write_text
from mygpt.errors import UserError
from tasks.core.settings import RunOptions, Settings
from tasks.core.stage import BuildContext, Stage, StageRef, stage_task, summary_table
from tasks.core.store import ArtifactStore, human_bytes, sha256_file

DEFAULT_URL = "https://wikitext.smerity.com/wikitext-103-raw-v1.zip"
PINNED_BYTES = 191_984_949  # the chapter's EXPECTED_BYTES for DEFAULT_URL
SPLITS = ("train", "valid", "test")
MEMBERS = {s: f"wikitext-103-raw/wiki.{s}.raw" for s in SPLITS}
SPLIT_FILES = {s: f"wiki.{s}.txt" for s in SPLITS}
CORPUS_FILE = "wikipedia.txt"
#: The chapter's header-strip regex, verbatim.
HEADER_RE = re.compile(r"^\s*=+ [^=]+ =+\s*$\n?", flags=re.MULTILINE)
USER_AGENT = "Mozilla/5.0 (compatible; wiki-pipeline)"  # the chapter: smerity's CDN rejects library UAs
CONNECT_TIMEOUT = 30.0
PIECE_BYTES = 4 << 20
BLOCK_CHARS = 4 << 20
#: Bounds (item 6 of issue 10). The real zip is 183 MiB and unzips to ~520 MiB (2.8x): these are ~10x that.
MAX_ZIP_BYTES = 2 << 30  # the most a download may bring without expected_bytes
MAX_UNZIPPED_BYTES = 4 << 30  # the most the three members may declare, together
MAX_RATIO = 20  # declared / compressed size of the three members (text deflates 3-4x; bombs 100-1000x)
#: The compression methods Python's zipfile reads (stored, deflate, bzip2, lzma).
READABLE_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate", zipfile.ZIP_BZIP2: "bzip2",
                    zipfile.ZIP_LZMA: "lzma"}
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_CONTENT_RANGE_RE = re.compile(r"^bytes\s+(\d+)-(\d+)/(\d+|\*)$")
_TRANSIENT_STATUS = (408, 429)  # and every 5xx

ENV_ATTEMPTS = "WIKI_PIPELINE_DOWNLOAD_ATTEMPTS"
ENV_BASE_DELAY = "WIKI_PIPELINE_RETRY_BASE_DELAY"
ENV_READ_TIMEOUT = "WIKI_PIPELINE_READ_TIMEOUT"


# ---- credentials in URLs -----------------------------------------------------------------------------
def redact_url(url: str) -> str:
    """``url`` as it may be shown or stored: user info and every query value replaced by ``***``
    (``https://alice:pw@host/f.zip?token=abc&x`` -> ``https://***@host/f.zip?token=***&***``)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=_redact_query(parts.query)))


def _redact_query(query: str) -> str:
    return "&".join(f"{key}=***" if sep else "***"
                    for key, sep, _ in (item.partition("=") for item in query.split("&") if item))


def redact_text(text: str, url: str) -> str:
    """``text`` (e.g. an exception message, which may quote the URL or its query) without ``url``'s secrets."""
    parts = urllib.parse.urlsplit(url)
    secrets = {url: redact_url(url), parts.query: _redact_query(parts.query)}
    if "@" in parts.netloc:
        secrets[parts.netloc.rpartition("@")[0]] = "***"
    for secret, shown in sorted(secrets.items(), key=lambda kv: -len(kv[0])):
        if secret:
            text = text.replace(secret, shown)
    return text


#: Set while settings are dumped for something that must run them (a deployment's parameters): then
#: ``source_url`` keeps its credentials; everywhere else its JSON form is redacted.
_REVEAL_URL = contextvars.ContextVar("reveal_source_url", default=False)


@contextlib.contextmanager
def credentials_revealed() -> Iterator[None]:
    """Dump ``CorpusSettings.source_url`` with its credentials (for ``wiki-pipeline params`` / ``serve``, whose
    output is what a deployment runs with) instead of redacted."""
    token = _REVEAL_URL.set(True)
    try:
        yield
    finally:
        _REVEAL_URL.reset(token)


# ---- settings ----------------------------------------------------------------------------------------
class CorpusSettings(Settings):
    """Where the wikitext-103-raw-v1 zip comes from and how it is checked."""

    source_url: str = Field(DEFAULT_URL, description="the wikitext-103-raw-v1 zip: an http(s):// URL, or "
                                                     "file:///absolute/path for a local copy")
    expected_bytes: int | None = Field(None, ge=0, description="the zip's exact size in bytes; null = the pinned "
                                                              "191984949 for the default URL and no check for "
                                                              "others; 0 = no size check")
    expected_sha256: str | None = Field(None, description="the sha256 of the zip (64 hex digits, the output of "
                                                          "sha256sum); checked when given")

    @field_validator("source_url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        url = url.strip()
        if not url:
            raise ValueError("source_url must be an http(s):// or file:// URL of the wikitext-103-raw-v1 zip, got ''")
        parsed = urllib.parse.urlparse(url)
        scheme = parsed.scheme.lower()
        shown = redact_url(url)
        if scheme not in ("http", "https", "file"):
            raise ValueError(f"source_url {shown!r} has scheme {parsed.scheme or '(none)'!r}; use an http://, "
                             "https:// or file:// URL (for a local zip: file:///absolute/path/to/wikitext-103-raw-v1.zip)")
        if scheme in ("http", "https") and not parsed.hostname:
            raise ValueError(f"source_url {shown!r} has no host; write it as {scheme}://host/path")
        if scheme == "file":
            if parsed.netloc not in ("", "localhost"):
                raise ValueError(f"source_url {shown!r}: a file:// URL cannot name a host ({parsed.netloc!r}); "
                                 "use file:///absolute/path")
            if not parsed.path.startswith("/"):
                raise ValueError(f"source_url {shown!r}: a file:// URL needs an absolute path (file:///...)")
        return url

    @field_validator("expected_bytes", mode="before")
    @classmethod
    def _check_size(cls, value):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"expected_bytes must be a whole number of bytes >= 0 (0 = don't check the size), "
                             f"got {value!r}")
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
        of a run -- never carries credentials (see :func:`credentials_revealed` for the one exception)."""
        data = handler(self)
        if info.mode_is_json() and "source_url" in data and not _REVEAL_URL.get():
            data["source_url"] = redact_url(data["source_url"])
        return data

    def resolved(self) -> "CorpusSettings":
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
    def is_file(self) -> bool:
        return self.source_url.lower().startswith("file:")

    @property
    def max_zip_bytes(self) -> int:
        """The most the download may bring: ``expected_bytes`` when given, else :data:`MAX_ZIP_BYTES`."""
        return self.expected_bytes or MAX_ZIP_BYTES


def _file_path(url: str) -> Path:
    return Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))


# ---- download knobs (environment) ------------------------------------------------------------------------
@dataclass(frozen=True)
class DownloadKnobs:
    """How hard the download tries (environment variables, not part of any version; see the module docstring)."""

    attempts: int = 6
    base_delay: float = 2.0
    read_timeout: float = 60.0

    @classmethod
    def from_env(cls) -> "DownloadKnobs":
        """The knobs from the environment (unset or empty = default); ``UserError`` naming a bad one."""
        d = cls()
        return cls(
            attempts=_env_number(ENV_ATTEMPTS, d.attempts, "a whole number >= 1", lambda v: v >= 1 and v == int(v),
                                 "failed tries in a row before the download gives up"),
            base_delay=_env_number(ENV_BASE_DELAY, d.base_delay, "a number of seconds >= 0", lambda v: v >= 0,
                                   "wait before the first retry, doubled each time, at most 60 s"),
            read_timeout=_env_number(ENV_READ_TIMEOUT, d.read_timeout, "a number of seconds > 0", lambda v: v > 0,
                                     "seconds without data before a try fails"),
        )


def _env_number(name: str, default, what: str, ok, meaning: str):
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not ok(value):
        raise UserError(f"{name} must be {what}, got {raw!r} ({meaning}; default {default:g}); fix or unset it")
    return type(default)(value)


# ---- what is at source_url ---------------------------------------------------------------------------------
class _Transient(Exception):
    """A failure worth retrying (5xx, truncated body, ...)."""


class SourceUnreachable(UserError):
    """The source would not say what it holds: network down or server failing (retried, then given up), or
    refusing (4xx)."""


def source_identity(settings: CorpusSettings, store: ArtifactStore, log) -> dict:
    """What is at ``source_url`` now, for the version id (``Stage.source``; see the module docstring).

    ``{"bytes", "mtime_ns"}`` for a file:// zip; for http(s) whichever of ``bytes``, ``etag``,
    ``last_modified`` the server sends. Unreachable: the identity of the newest version published from the same
    settings (so it is reused, with a warning), else ``UserError``. A size that differs from ``expected_bytes``
    is refused here, before anything is downloaded."""
    if settings.is_file:
        identity = _file_identity(settings)
    else:
        try:
            identity = probe(settings.source_url, DownloadKnobs.from_env(), log)
        except SourceUnreachable as e:
            return _last_known_identity(settings, store, log, e)
        if not identity:
            log.warning("corpus: %s sends no ETag, Last-Modified or size, so new content there would not give a new "
                        "version; pass expected_sha256 to be sure of what you get", settings.shown_url)
    size = identity.get("bytes")
    if settings.expected_bytes and size is not None and size != settings.expected_bytes:
        raise UserError(f"{settings.shown_url} is {size:,} bytes but expected_bytes is {settings.expected_bytes:,}; "
                        f"the mirror may serve a different file: check source_url, or pass expected_bytes={size} "
                        "(0 = no size check) if you trust it")
    return identity


def _file_identity(settings: CorpusSettings) -> dict:
    path = _file_path(settings.source_url)
    if not path.is_file():
        raise UserError(f"source_url {settings.shown_url!r}: there is no file {path}; check the path")
    st = path.stat()
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def _last_known_identity(settings: CorpusSettings, store: ArtifactStore, log, error: SourceUnreachable) -> dict:
    params = settings.version_params()
    known = [v for v in store.versions("corpus")
             if v.manifest.get("settings") == params and v.manifest.get("code_version") == STAGE.code_version
             and isinstance(v.manifest.get("source"), dict)]
    if not known:
        raise error
    newest = known[-1]
    log.warning("corpus: cannot check %s now (%s); reusing corpus/%s, fetched from it on %s: the file there may "
                "have changed since", settings.shown_url, error, newest.version, newest.manifest.get("created_at"))
    return newest.manifest["source"]


def probe(url: str, knobs: DownloadKnobs, log=None) -> dict:
    """Ask the server what is at ``url`` with a one-byte ``Range`` GET (HEAD is refused by signed URLs):
    ``{"bytes", "etag", "last_modified"}``, each where the server says it. Retries like :func:`fetch`;
    :class:`SourceUnreachable` when every try failed or the server refused (4xx: e.g. an expired signed URL)."""
    import requests
    import urllib3

    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", "Range": "bytes=0-0"}
    failures = 0
    with requests.Session() as session:
        while True:
            try:
                with session.get(url, headers=headers, stream=True,
                                 timeout=(CONNECT_TIMEOUT, knobs.read_timeout)) as r:
                    _raise_for_status(url, r)
                    identity = _identity_of(r)
                    if r.status_code == 206:  # read the one byte, so the connection ends cleanly (no reset)
                        with contextlib.suppress(requests.RequestException, urllib3.exceptions.HTTPError, OSError):
                            r.raw.read(1024)
                    return identity
            except UserError as e:  # a 4xx: the server will not say
                raise SourceUnreachable(str(e)) from None
            except (_Transient, requests.RequestException, urllib3.exceptions.HTTPError, ConnectionError,
                    TimeoutError) as exc:
                failures += 1
                if failures >= knobs.attempts:
                    raise SourceUnreachable(
                        f"downloading {redact_url(url)} failed {failures} times in a row (last: "
                        f"{_describe(exc, url)}); check the network or the mirror, or pass another source_url") from None
                _back_off(knobs, failures, f"asking {redact_url(url)} what it holds", exc, url, log)


def _identity_of(r) -> dict:
    size = None
    m = _CONTENT_RANGE_RE.match(r.headers.get("Content-Range", "").strip())
    if r.status_code == 206 and m and m.group(3) != "*":
        size = int(m.group(3))
    elif r.status_code == 200 and r.headers.get("Content-Length", "").isdigit():
        size = int(r.headers["Content-Length"])
    found = {"bytes": size, "etag": r.headers.get("ETag"), "last_modified": r.headers.get("Last-Modified")}
    return {k: v for k, v in found.items() if v is not None}


def _raise_for_status(url: str, r) -> None:
    """``_Transient`` for a status worth retrying, ``UserError`` for any other that is not 200/206."""
    status = r.status_code
    if status >= 500 or status in _TRANSIENT_STATUS:
        raise _Transient(f"HTTP {status} {r.reason}")
    if status not in (200, 206):
        hint = ("the file is not there: check source_url" if status in (404, 410)
                else "the server refused the request: check source_url or try another mirror")
        raise UserError(f"downloading {redact_url(url)} failed: HTTP {status} {r.reason}; {hint}")


def _back_off(knobs: DownloadKnobs, failures: int, what: str, exc: BaseException, url: str, log,
              have: int | None = None) -> None:
    delay = min(60.0, knobs.base_delay * 2 ** (failures - 1))
    if log:
        kept = f" with {human_bytes(have)} downloaded" if have is not None else ""
        log.warning("download: %s failed (%s)%s; retrying in %.1fs", what, _describe(exc, url), kept, delay)
    time.sleep(delay)


# ---- downloading -------------------------------------------------------------------------------------
def fetch(url: str, dest: Path, *, knobs: DownloadKnobs = DownloadKnobs(), identity: dict | None = None,
          max_bytes: int = MAX_ZIP_BYTES, log=None, progress=None) -> dict:
    """Download ``url`` to ``dest`` (via ``dest.part``, resumable). Returns download facts for the metrics.

    ``dest`` appears only when the whole body arrived. A ``dest.part`` left by an earlier (crashed) attempt
    is resumed with ``Range``. ``identity`` (from :func:`probe`) is what the version was computed from: its
    size is the size to expect (a body that ends early is resumed), and a different ETag means the file
    changed meanwhile (``UserError``). The download stops with ``UserError`` as soon as it would exceed
    ``max_bytes``, and for 4xx answers, and when ``knobs.attempts`` tries in a row fail.
    """
    import requests
    import urllib3

    identity = identity or {}
    shown = redact_url(url)
    part = dest.with_name(dest.name + ".part")
    meta_path = dest.with_name(dest.name + ".json")
    meta = {}
    if part.exists() and meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
        except ValueError:
            meta = {}
    if meta.get("url") != shown:  # the .part came from another address (credentials never stored)
        part.unlink(missing_ok=True)
        meta = {"url": shown}
    resumed_bytes = part.stat().st_size if part.exists() else 0
    failures = tries = 0
    range_requests = 0
    t0 = time.monotonic()
    session = requests.Session()
    while True:
        tries += 1
        have = part.stat().st_size if part.exists() else 0
        start_have = have
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if have:
            headers["Range"] = f"bytes={have}-"
            validator = meta.get("etag") if meta.get("etag") and not meta["etag"].startswith("W/") \
                else meta.get("last_modified")
            if validator:
                headers["If-Range"] = validator
            range_requests += 1
        try:
            with session.get(url, headers=headers, stream=True, timeout=(CONNECT_TIMEOUT, knobs.read_timeout)) as r:
                status = r.status_code
                if status == 416 and have:
                    m = re.match(r"^bytes\s+\*/(\d+)$", r.headers.get("Content-Range", ""))
                    if m and int(m.group(1)) == have:
                        break  # the .part is already complete
                    part.unlink(missing_ok=True)
                    raise _Transient(f"the server rejected resuming at byte {have:,} (HTTP 416); starting over")
                _raise_for_status(url, r)
                _check_unchanged(shown, identity, r)
                total = None
                if status == 206:
                    m = _CONTENT_RANGE_RE.match(r.headers.get("Content-Range", "").strip())
                    if not have or not m or int(m.group(1)) != have:
                        part.unlink(missing_ok=True)
                        raise _Transient(f"the server answered a Range request for byte {have:,} with "
                                         f"Content-Range {r.headers.get('Content-Range')!r}; starting over")
                    total = int(m.group(3)) if m.group(3) != "*" else None
                    mode = "ab"
                else:
                    if have and log:
                        log.warning("download: %s ignored the Range request; starting the file over", shown)
                    have, mode = 0, "wb"
                    if r.headers.get("Content-Length", "").isdigit():
                        total = int(r.headers["Content-Length"])
                total = identity.get("bytes", total)  # what the version was computed from wins over one answer
                if total is not None and total > max_bytes:
                    part.unlink(missing_ok=True)
                    raise _too_big(shown, max_bytes, f"it announces {total:,} bytes")
                meta.update(etag=r.headers.get("ETag"), last_modified=r.headers.get("Last-Modified"), total=total)
                atomic_write_text(meta_path, json.dumps(meta))
                with open(part, mode) as f:
                    try:
                        # read1: whatever has arrived (up to 1 MiB), so a timeout loses no received bytes;
                        # never past the known size (a Content-Length that overstates it does not matter)
                        while chunk := r.raw.read1(_next_read(have, total), decode_content=False):
                            if have + len(chunk) > max_bytes:
                                f.close()
                                part.unlink(missing_ok=True)
                                raise _too_big(shown, max_bytes, f"it sent more; stopped at {have:,} bytes")
                            f.write(chunk)
                            have += len(chunk)
                            if progress:
                                progress(have, total or have, f"{human_bytes(have)} / {human_bytes(total or have)}")
                    finally:
                        if not f.closed:
                            f.flush()
                            os.fsync(f.fileno())
                if total is not None and have != total:
                    if have > total:
                        part.unlink(missing_ok=True)
                    raise _Transient(f"the connection ended after {have:,} of {total:,} bytes")
                break
        except UserError:
            raise
        except (_Transient, requests.RequestException, urllib3.exceptions.HTTPError, ConnectionError,
                TimeoutError) as exc:
            now_have = part.stat().st_size if part.exists() else 0
            failures = 1 if now_have > start_have else failures + 1
            if failures >= knobs.attempts:
                raise UserError(
                    f"downloading {shown} failed {failures} times in a row (last: {_describe(exc, url)}); check the "
                    f"network or the mirror, or pass another source_url; a rerun resumes from the "
                    f"{now_have:,} bytes already downloaded") from None
            _back_off(knobs, failures, f"try {tries}", exc, url, log, have=now_have)
    os.replace(part, dest)
    meta_path.unlink(missing_ok=True)
    return {"tries": tries, "range_requests": range_requests, "resumed_bytes": resumed_bytes,
            "seconds": round(time.monotonic() - t0, 3)}


def _next_read(have: int, total: int | None) -> int:
    return 1 << 20 if total is None else max(0, min(1 << 20, total - have))


def _check_unchanged(shown: str, identity: dict, r) -> None:
    """``UserError`` when the server now names the file differently from when the version was computed."""
    for key, header in (("etag", "ETag"), ("last_modified", "Last-Modified")):
        now = r.headers.get(header)
        if identity.get(key) and now and now != identity[key]:
            raise UserError(f"{shown} changed while this run was fetching it ({header} {identity[key]} became "
                            f"{now}); rerun to fetch the new file")


def _too_big(shown: str, limit: int, what: str) -> UserError:
    if limit == MAX_ZIP_BYTES:
        bound = (f"{human_bytes(limit)}, the most this stage downloads without expected_bytes (the "
                 "wikitext-103 zip is 183 MB)")
    else:
        bound = f"expected_bytes ({limit:,})"
    return UserError(f"{shown} is larger than {bound}: {what}, so nothing was kept; check source_url, or pass the "
                     "right expected_bytes")


def _describe(exc: BaseException, url: str = "") -> str:
    text = str(exc) or type(exc).__name__
    text = redact_text(text, url) if url else text
    return text if len(text) < 300 else text[:300] + "..."


# ---- header stripping --------------------------------------------------------------------------------
def _safe_cut(buf: str) -> int:
    """The last position ``s`` (just after a ``\\n``) where ``buf`` may be cut for header stripping; -1 if none.

    ``buf`` starts at the start of the text or at an earlier safe cut. ``s`` is safe when, with line A the
    line that ends at ``s``:

    1. line A has a non-whitespace character, and
    2. its last non-whitespace character is not ``=``, and
    3. the last ``=`` before ``s`` is not part of a run of ``=`` that is the first non-whitespace thing on
       its line (no ``=`` at all in ``buf`` before ``s`` is fine: the earlier cut satisfied 3 already).

    Why that suffices: a match (or failed try) of ``^\\s*=+ [^=]+ =+\\s*$\\n?`` that starts before ``s``
    starts at a line start; its leading ``\\s*`` stops at line A's non-whitespace character at the latest
    (1); its first ``=+`` is a line-leading run, so its ``[^=]+`` stops at a later ``=`` that is still
    before ``s`` (3); the trailing ``=+\\s*`` stops at a non-whitespace character before ``s`` (2). So no
    try starting before ``s`` looks at ``s`` or beyond, and every try starting at or after ``s`` sees the
    same text either way (``^`` holds at ``s``, which follows a ``\\n``): cutting at ``s`` and running
    ``re.sub`` on both sides gives the same result as one ``re.sub``.
    """
    nl = buf.rfind("\n")
    for _ in range(256):
        if nl < 0:
            return -1
        ls = buf.rfind("\n", 0, nl) + 1
        line = buf[ls:nl].rstrip()
        if line.strip() and line[-1] != "=":
            q = buf.rfind("=", 0, nl)
            if q < 0:
                return nl + 1
            r0 = q
            while r0 > 0 and buf[r0 - 1] == "=":
                r0 -= 1
            if buf[buf.rfind("\n", 0, r0) + 1:r0].strip():
                return nl + 1
        nl = ls - 1
    return -1


_HEADER_START_RE = re.compile(r"\s*=")  # what HEADER_RE needs at a line start before anything else
_HEADER_CANDIDATE_RE = re.compile(r"\n\s*=")  # the same after a newline: found by a fast scan for "\n"


def strip_block(text: str) -> tuple[str, int]:
    """``HEADER_RE.subn("", text)``, without trying the pattern at every position of the text.

    A match of ``^\\s*=+ [^=]+ =+\\s*$\\n?`` can only start at a line start followed by whitespace and then
    ``=``. Take such a run of whitespace ending at an ``=``: tried from any line start inside it, the pattern's
    ``\\s*`` can stop only at that ``=`` (everything before it is whitespace, nothing after it is reached
    otherwise), so every line start of the run matches, or fails, exactly like its first one. ``re.sub`` takes
    the leftmost match at or after the end of the previous one (which always ends at a line start), so trying
    the first eligible line start of each run, in order, with ``HEADER_RE.match`` on the whole text finds the
    same matches. The runs are found by ``\\n\\s*=`` (plus one at the very start), a scan the regex engine
    does at memchr speed; on wikitext that is ~4x faster than ``subn`` (``tests/tasks/test_corpus_extract.py``
    holds it equal on generated and real text)."""
    out: list[str] = []
    last = n = 0
    starts = []
    if _HEADER_START_RE.match(text):
        starts.append(0)
    starts = itertools.chain(starts, (m.start() + 1 for m in _HEADER_CANDIDATE_RE.finditer(text)))
    for x in starts:
        if x < last:  # the previous match ended inside this run, at a line start: try from there
            x = last
            if not _HEADER_START_RE.match(text, x):
                continue
        m = HEADER_RE.match(text, x)
        if m is not None:
            out.append(text[last:x])
            last = m.end()
            n += 1
    if not n:
        return text, 0
    out.append(text[last:])
    return "".join(out), n


def strip_headers(pieces: Iterable[str], block_chars: int = BLOCK_CHARS) -> Iterator[tuple[str, int]]:
    """Stream ``HEADER_RE.sub("", "".join(pieces))`` as ``(text, headers_removed)`` pieces.

    The text is buffered until it has ``block_chars`` characters, cut at the last safe point
    (:func:`_safe_cut`) and the part before it stripped on its own. Text without any safe point (which real
    wikitext never is) just grows the buffer.
    """
    buf = ""
    for piece in pieces:
        buf = buf + piece if buf else piece
        if len(buf) >= block_chars:
            s = _safe_cut(buf)
            if s > 0:
                head, buf = buf[:s], buf[s:]
                yield strip_block(head)
    if buf:
        yield strip_block(buf)


def decode_member(zf: zipfile.ZipFile, name: str, source: str, piece_bytes: int = PIECE_BYTES,
                  counter: dict | None = None) -> Iterator[str]:
    """Decode a zip member as strict UTF-8 with universal newlines (what ``open(path, encoding="utf-8")``
    gives), in pieces. ``UserError`` naming the member and byte offset on invalid UTF-8."""
    dec = codecs.getincrementaldecoder("utf-8")("strict")
    fed = 0
    carry_cr = False
    with zf.open(name) as f:
        while True:
            raw = f.read(piece_bytes)
            final = not raw
            pending = len(dec.getstate()[0])
            try:
                text = dec.decode(raw, final=final)
            except UnicodeDecodeError as e:
                offset = fed - pending + e.start
                raise UserError(
                    f"{name} in {source} is not valid UTF-8: byte {e.object[e.start]:#04x} at offset {offset:,} "
                    f"({e.reason}); the archive is not the wikitext-103-raw-v1 zip or is damaged: check "
                    "source_url and expected_sha256") from None
            fed += len(raw)
            if counter is not None:
                counter["raw_bytes"] = fed
            if carry_cr:
                text, carry_cr = "\r" + text, False
            if not final and text.endswith("\r"):
                text, carry_cr = text[:-1], True
            if "\r" in text:
                text = text.replace("\r\n", "\n").replace("\r", "\n")
            if text:
                yield text
            if final:
                return


def _count_lines(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def _read_ahead(items: Iterator, depth: int = 4) -> Iterator:
    """The items of ``items``, produced by a thread up to ``depth`` ahead of the consumer (errors re-raised here)."""
    q: queue.Queue = queue.Queue(depth)
    stop = threading.Event()
    done = object()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        pass
                if stop.is_set():
                    return
            q.put((done, None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            q.put((done, e))

    thread = threading.Thread(target=produce, name="corpus-reader", daemon=True)
    thread.start()
    try:
        while True:
            item, error = q.get()
            if item is done:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        thread.join()


class _Writer:
    """Writes and hashes blocks in one background thread, in order (file writes and sha256 let go of the GIL), at
    most a few blocks behind; :meth:`drain` waits for it and re-raises its errors."""

    def __init__(self, depth: int = 4) -> None:
        self.depth = depth
        self.pending: collections.deque = collections.deque()

    def __enter__(self) -> "_Writer":
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="corpus-writer")
        return self

    def __exit__(self, *exc) -> None:
        self.settle()
        self.pool.shutdown(wait=True)

    @staticmethod
    def _write(data: bytes, targets) -> None:
        for f, sha in targets:
            f.write(data)
            sha.update(data)

    def write(self, data: bytes, *targets) -> None:
        """Write ``data`` to each ``(file, sha256)`` target and add it to the hash."""
        self.pending.append(self.pool.submit(self._write, data, targets))
        while len(self.pending) > self.depth:
            self.pending.popleft().result()

    def settle(self) -> None:
        """Wait until every block is written (errors are kept for :meth:`drain`)."""
        concurrent.futures.wait(self.pending)

    def drain(self) -> None:
        """Wait until every block is written; re-raise the first error."""
        while self.pending:
            self.pending.popleft().result()


def extract_corpus(zip_path: Path, out_dir: Path, *, source: str, progress=None,
                   block_chars: int = BLOCK_CHARS) -> dict:
    """Unzip the three splits, strip headers, write the split files and wikipedia.txt. Returns per-split metrics."""
    with open_zip(zip_path, source) as zf:
        names = set(zf.namelist())
        for split in SPLITS:
            if MEMBERS[split] not in names:
                shown = ", ".join(sorted(names)[:8]) or "(no files)"
                raise UserError(f"{source} has no member {MEMBERS[split]!r} (it has: {shown}); source_url must "
                                "point at the wikitext-103-raw-v1 zip")
        raw_total = sum(zf.getinfo(MEMBERS[s]).file_size for s in SPLITS) or 1
        raw_done = 0
        splits: dict[str, dict] = {}
        all_sha = hashlib.sha256()
        all_chars = all_lines = all_bytes = 0
        with atomic_open(out_dir / CORPUS_FILE, "wb") as all_f, _Writer() as writer:
            for split in SPLITS:
                member = MEMBERS[split]
                sha = hashlib.sha256()
                counter: dict = {"raw_bytes": 0}
                st = {"member": member, "raw_bytes": zf.getinfo(member).file_size, "raw_lines": 0,
                      "bytes": 0, "chars": 0, "lines": 0, "headers_stripped": 0}
                last = ""
                raw_last = ""

                def unzipped():  # in a reader thread: inflating (zlib lets go of the GIL) runs beside the stripping
                    for piece in decode_member(zf, member, source, counter=counter):
                        yield piece, counter["raw_bytes"]

                def raw_pieces():
                    nonlocal raw_last
                    for piece, raw_bytes in _read_ahead(unzipped()):
                        st["raw_lines"] += piece.count("\n")
                        raw_last = piece
                        if progress:
                            progress(raw_done + raw_bytes, raw_total, f"unzipping {member}")
                        yield piece

                try:
                    with atomic_open(out_dir / SPLIT_FILES[split], "wb") as f:
                        try:
                            for text, n in strip_headers(raw_pieces(), block_chars):
                                data = text.encode("utf-8")
                                writer.write(data, (f, sha), (all_f, all_sha))  # in the writer thread
                                st["bytes"] += len(data)
                                st["chars"] += len(text)
                                st["lines"] += text.count("\n")
                                st["headers_stripped"] += n
                                if text:
                                    last = text
                        finally:
                            writer.settle()  # nothing touches f once it is synced and renamed (or dropped)
                        writer.drain()
                except (zipfile.BadZipFile, zlib.error, EOFError) as e:
                    raise UserError(f"{member} in {source} is damaged ({e}); rerun to download it again, or "
                                    "check source_url") from None
                if last and not last.endswith("\n"):
                    st["lines"] += 1
                if raw_last and not raw_last.endswith("\n"):
                    st["raw_lines"] += 1
                st["lines_removed"] = st["raw_lines"] - st["lines"]
                st["sha256"] = sha.hexdigest()
                raw_done += st["raw_bytes"]
                splits[split] = st
                all_chars += st["chars"]
                all_bytes += st["bytes"]
                all_lines += st["lines"]
            writer.drain()
    return {"splits": splits,
            "wikipedia": {"bytes": all_bytes, "chars": all_chars, "lines": all_lines, "sha256": all_sha.hexdigest()}}


# ---- what a zip may unpack to -------------------------------------------------------------------------
def open_zip(zip_path: Path, source: str) -> zipfile.ZipFile:
    """The zip at ``zip_path`` (fetched from ``source``, already redacted); ``UserError`` when it is not one."""
    try:
        return zipfile.ZipFile(zip_path)
    except zipfile.BadZipFile:
        raise UserError(f"{source} is not a zip archive; source_url must point at wikitext-103-raw-v1.zip "
                        "(or a copy of it)") from None


def check_members(zip_path: Path, source: str) -> None:
    """Refuse, before anything is unzipped, a zip whose split members cannot or should not be read: encrypted,
    compressed with a method Python cannot read, or declaring more than :data:`MAX_UNZIPPED_BYTES` or
    :data:`MAX_RATIO` times their compressed size. (A member that lies about its size fails its CRC check
    when read: ``zipfile`` never returns more than the declared size.)"""
    with open_zip(zip_path, source) as zf:
        infos = [zf.getinfo(name) for name in MEMBERS.values() if name in zf.NameToInfo]
        for info in infos:
            if info.flag_bits & 0x1:
                raise UserError(f"{info.filename} in {source} is encrypted; the wikitext-103-raw-v1 zip is not: "
                                "check source_url, or give an unencrypted copy")
            if info.compress_type not in READABLE_METHODS:
                raise UserError(f"{info.filename} in {source} is compressed with method {info.compress_type} "
                                f"({_METHOD_NAMES.get(info.compress_type, 'unknown')}), which Python's zipfile "
                                f"cannot read (it reads {', '.join(READABLE_METHODS.values())}); recompress it, "
                                "e.g. with `zip -Z deflate`, or check source_url")
        declared = sum(i.file_size for i in infos)
        packed = sum(i.compress_size for i in infos)
        if declared > MAX_UNZIPPED_BYTES:
            raise UserError(f"{source} would unzip to {human_bytes(declared)}, more than the "
                            f"{human_bytes(MAX_UNZIPPED_BYTES)} this stage accepts (wikitext-103 is ~520 MB); "
                            "nothing was extracted: check source_url")
        if declared > MAX_RATIO * max(packed, 1) and declared > 1 << 20:
            raise UserError(f"{source} would unzip {human_bytes(packed)} into {human_bytes(declared)} "
                            f"({declared / max(packed, 1):,.0f}x; text compresses 3-4x, this stage accepts at most "
                            f"{MAX_RATIO}x): it looks like a zip bomb, not wikitext; nothing was extracted: check "
                            "source_url")


_METHOD_NAMES = {9: "deflate64", 12: "bzip2", 14: "lzma", 93: "zstandard", 95: "xz", 98: "ppmd", 99: "AES"}


# ---- the stage ---------------------------------------------------------------------------------------
def _check_zip(path: Path, settings: CorpusSettings, *, ours: bool) -> tuple[int, str]:
    shown = settings.shown_url
    size = path.stat().st_size
    want = settings.expected_bytes
    if want and size != want:
        if ours:
            path.unlink(missing_ok=True)
        raise UserError(f"{shown} gave {size:,} bytes but expected_bytes is {want:,}; the mirror may serve a "
                        f"different file: check source_url, or pass expected_bytes={size} (0 = no size check) "
                        "if you trust it")
    sha = sha256_file(path)
    if settings.expected_sha256 and sha != settings.expected_sha256:
        if ours:
            path.unlink(missing_ok=True)
        raise UserError(f"{shown} has sha256 {sha} but expected_sha256 is {settings.expected_sha256}; check "
                        "source_url, or pass the right expected_sha256")
    return size, sha


def _local_zip(ctx: BuildContext, settings: CorpusSettings) -> Path:
    """The file:// zip, as it was when the version was computed (``UserError`` if it changed since)."""
    zip_path = _file_path(settings.source_url)
    if _file_identity(settings) != ctx.source:
        raise UserError(f"{settings.shown_url} changed while this run was reading it; rerun to use the new file")
    return zip_path


def _downloaded_zip(ctx: BuildContext, settings: CorpusSettings) -> tuple[Path, dict]:
    """The http(s) zip in the build's work/ folder: reused from an earlier attempt, or fetched."""
    zip_path = ctx.work / "source.zip"
    if zip_path.exists():
        ctx.log.info("download: reusing %s downloaded by an earlier attempt", zip_path)
        return zip_path, {"tries": 0, "range_requests": 0, "resumed_bytes": 0, "seconds": 0.0}
    ctx.log.info("download: fetching %s", settings.shown_url)
    facts = fetch(settings.source_url, zip_path, knobs=DownloadKnobs.from_env(), identity=ctx.source,
                  max_bytes=settings.max_zip_bytes, log=ctx.log,
                  progress=lambda d, t, m: ctx.progress(d, t, "downloading " + m))
    return zip_path, facts


def build_corpus(ctx: BuildContext, settings: CorpusSettings) -> dict:
    """Fetch the zip (or open the file:// one), check it, and write the stripped splits + wikipedia.txt."""
    shown = settings.shown_url
    t0 = time.monotonic()
    facts: dict = {"tries": 0, "range_requests": 0, "resumed_bytes": 0, "seconds": 0.0}
    ours = not settings.is_file
    if ours:
        zip_path, facts = _downloaded_zip(ctx, settings)
    else:
        zip_path = _local_zip(ctx, settings)
    size, sha = _check_zip(zip_path, settings, ours=ours)
    download_seconds = round(time.monotonic() - t0, 3)
    ctx.log.info("download: %s is %s, sha256 %s", shown, human_bytes(size), sha)
    t1 = time.monotonic()
    try:
        check_members(zip_path, shown)
        corpus = extract_corpus(zip_path, ctx.out, source=shown,
                                progress=lambda d, t, m: ctx.progress(d, t, m))
    except UserError:
        if ours:
            zip_path.unlink(missing_ok=True)  # a rerun fetches again instead of reusing a bad archive
        raise
    ctx.progress(1, 1, "done", force=True)
    return {
        "source_url": shown,
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
        return "(the server named no ETag, Last-Modified or size)"
    names = {"bytes": "size", "mtime_ns": "modified (ns)", "etag": "ETag", "last_modified": "Last-Modified"}
    return "; ".join(f"{names.get(k, k)} `{v}`" for k, v in source.items())


def report(manifest: dict) -> str:
    m = manifest.get("metrics", {})
    d = m.get("download", {})
    lines = [
        f"# corpus `{manifest['version']}`",
        "",
        summary_table([
            ("source", redact_url(m.get("source_url") or "")),
            ("source identity (part of the version)", _source_line(manifest.get("source"))),
            ("zip", f"{m.get('zip_bytes', 0):,} bytes, sha256 `{m.get('zip_sha256')}` (not kept)"),
            ("download", f"{m.get('download_seconds', 0):.1f} s; {d.get('tries', 0)} request(s), "
             f"{d.get('range_requests', 0)} of them resuming (Range); {d.get('resumed_bytes', 0):,} bytes kept "
             "from an interrupted run"),
            ("unzip + strip", f"{m.get('extract_seconds', 0):.1f} s"),
        ]),
        "",
        "| file | bytes | chars | lines | header matches stripped | lines removed | sha256 |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for split in SPLITS:
        st = m.get("splits", {}).get(split)
        if not st:
            continue
        lines.append(f"| {SPLIT_FILES[split]} | {st['bytes']:,} | {st['chars']:,} | {st['lines']:,} | "
                     f"{st['headers_stripped']:,} | {st['lines_removed']:,} | `{st['sha256'][:16]}…` |")
    w = m.get("wikipedia")
    if w:
        lines.append(f"| **{CORPUS_FILE}** | {w['bytes']:,} | {w['chars']:,} | {w['lines']:,} | | | "
                     f"`{w['sha256'][:16]}…` |")
    return "\n".join(lines) + "\n"


#: code version 3: the version also depends on what is at source_url (source_identity) and on the URL without
#: its credentials (issue 10).
STAGE = Stage(name="corpus", settings=CorpusSettings, code_version="3", report=report, source=source_identity,
              alias="download")


@stage_task(STAGE)
def download_corpus(settings: CorpusSettings = CorpusSettings(), run: RunOptions = RunOptions()) -> StageRef:
    """Download wikitext-103-raw-v1 (or reuse that version): the stripped splits and wikipedia.txt.

    Retry/timeout knobs come from the environment (see the module docstring), not from the version."""
    return STAGE.run(build_corpus, settings, run)
