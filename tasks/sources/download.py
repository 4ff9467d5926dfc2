"""The resumable download of one file over http(s) (:func:`fetch`), and what a server says is at an address
(:func:`probe`); its retry knobs come from the environment (:class:`DownloadKnobs`). URLs shown are redacted."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from mygpt.atomic import atomic_write_text
from mygpt.errors import UserError
from tasks.core.report import human_bytes
from tasks.core.urls import address_sha256, redact_text, redact_url
from tasks.sources.allowed import RedirectCheck, RedirectRefused, origin, same_origin_only

USER_AGENT = "Mozilla/5.0 (compatible; wiki-pipeline)"  # the chapter: smerity's CDN rejects library UAs
CONNECT_TIMEOUT = 30.0
#: The real zip is 183 MiB: this bound is ~10x that.
MAX_ZIP_BYTES = 2 << 30  # the most a download may bring without expected_bytes
_CONTENT_RANGE_RE = re.compile(r"^bytes\s+(\d+)-(\d+)/(\d+|\*)$")
_TRANSIENT_STATUS = (408, 429)  # and every 5xx

ENV_ATTEMPTS = "WIKI_PIPELINE_DOWNLOAD_ATTEMPTS"
ENV_BASE_DELAY = "WIKI_PIPELINE_RETRY_BASE_DELAY"
ENV_READ_TIMEOUT = "WIKI_PIPELINE_READ_TIMEOUT"


# ---- download knobs (environment) ------------------------------------------------------------------------
@dataclass(frozen=True)
class DownloadKnobs:
    """How hard the download tries (environment variables, not part of any version; see the module docstring),
    and ``redirects``: the check each redirect is asked of, a value the caller hands in (a stage: its machine's
    source allow-list, :meth:`tasks.sources.allowed.SourcePolicy.check_redirect`); by default same origin only."""

    attempts: int = 6
    base_delay: float = 2.0
    read_timeout: float = 60.0
    redirects: RedirectCheck = same_origin_only

    @classmethod
    def from_env(cls, redirects: RedirectCheck = same_origin_only) -> DownloadKnobs:
        """The knobs from the environment (unset or empty = default), with ``redirects``; ``UserError`` naming a
        bad one."""
        d = cls()
        return cls(
            redirects=redirects,
            attempts=_env_number(
                ENV_ATTEMPTS,
                d.attempts,
                "a whole number >= 1",
                lambda v: v >= 1 and v == int(v),
                "failed tries in a row before the download gives up",
                most=(1000, ""),
            ),
            base_delay=_env_number(
                ENV_BASE_DELAY,
                d.base_delay,
                "a number of seconds >= 0",
                lambda v: v >= 0,
                "wait before the first retry, doubled each time, at most 60 s",
                most=(3600, " seconds (an hour)"),
            ),
            read_timeout=_env_number(
                ENV_READ_TIMEOUT,
                d.read_timeout,
                "a number of seconds > 0",
                lambda v: v > 0,
                "seconds without data before a try fails",
                most=(86400, " seconds (a day)"),
            ),
        )


def _env_number(name: str, default, what: str, ok, meaning: str, most: tuple[float, str]):
    """The number in environment variable ``name`` (``default`` when unset); ``UserError`` unless it is
    ``what`` (``ok``) and at most ``most[0]`` (``most[1]``: its unit, for the message)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not ok(value):
        raise UserError(f"{name} must be {what}, got {raw!r} ({meaning}; default {default:g}); fix or unset it")
    if value > most[0]:
        raise UserError(
            f"{name} must be at most {most[0]:g}{most[1]}, got {raw!r} ({meaning}; default {default:g}); "
            "fix or unset it"
        )
    return type(default)(value)


# ---- failures ----------------------------------------------------------------------------------------
class _Transient(Exception):
    """A failure worth retrying (5xx, truncated body, ...)."""


def _retryable() -> tuple[type[BaseException], ...]:
    """What a try may fail with and be tried again (back-off, Range resume): the network's errors and ours."""
    import requests
    import urllib3

    return (_Transient, requests.RequestException, urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)


def _failed(tries: int) -> str:
    """How many tries in a row failed, in words ("failed once", "failed 4 times in a row")."""
    return "failed once" if tries == 1 else f"failed {tries} times in a row"


class SourceUnreachable(UserError):
    """The source would not say what it holds: network down or server failing (retried, then given up), or
    refusing (a 4xx other than 404/410: e.g. 401, or 403 for an expired signed URL)."""


class SourceMissing(UserError):
    """The server answered that there is no file at the address (HTTP 404 or 410): not unreachable -- an answer,
    so nothing published from that address earlier stands in for it."""


# ---- redirects ------------------------------------------------------------------------------------------
MAX_REDIRECTS = 10


def _split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``(url without its user info, (user, password) or None)``, as ``requests`` would read them."""
    u = urllib.parse.urlsplit(url)
    userinfo, at, host = u.netloc.rpartition("@")
    if not at:
        return url, None
    user, _, password = userinfo.partition(":")
    auth = (urllib.parse.unquote(user), urllib.parse.unquote(password))
    return urllib.parse.urlunsplit(u._replace(netloc=host)), auth if any(auth) else None


def _get(session, url: str, headers: dict, knobs: DownloadKnobs, field: str):
    """The response (streamed) to a GET of ``url``, its redirects followed here one by one (at most
    :data:`MAX_REDIRECTS`), never by ``requests``: each hop's target, same origin too, is first asked of the
    check ``knobs.redirects`` (:class:`RedirectRefused`; why every hop: an allow-list may name a path prefix, which a
    same-origin redirect would otherwise leave), and the URL's credentials go only to its own origin (scheme,
    host, port): a redirect to another one gets none. Messages name the hop that redirected, without credentials."""
    plain, auth = _split_credentials(url)
    current = plain
    for _ in range(MAX_REDIRECTS + 1):
        r = session.get(
            current,
            headers=headers,
            stream=True,
            timeout=(CONNECT_TIMEOUT, knobs.read_timeout),
            allow_redirects=False,
            auth=auth if origin(current) == origin(url) else None,
        )
        if not r.is_redirect:
            return r
        target = urllib.parse.urljoin(current, r.headers["Location"])
        r.close()
        if urllib.parse.urlsplit(target).scheme.lower() not in ("http", "https"):
            raise RedirectRefused(
                f"{field} {redact_url(current)} redirects to {redact_url(target)}, which is not an http(s) URL; "
                "give a source that serves the file over http(s)"
            )
        knobs.redirects(field, current, target)
        current = target
    raise RedirectRefused(
        f"{field} {redact_url(url)} redirected more than {MAX_REDIRECTS} times (last to {redact_url(current)}); "
        "give the address the file is at"
    )


# ---- what is at an address -----------------------------------------------------------------------------
def probe(url: str, knobs: DownloadKnobs, log=None, field: str = "corpus.source_url") -> dict:
    """What is at ``url`` (``{"bytes", "etag", "last_modified"}`` where the server says), by a one-byte ``Range`` GET
    (HEAD is refused by signed URLs), at most ``knobs.attempts`` tries; :class:`SourceUnreachable` when every try
    failed or was refused (401, 403), :class:`SourceMissing` at once for 404 and 410, :class:`RedirectRefused`
    for a redirect that ``field`` may not follow (:func:`_get`)."""
    import requests
    import urllib3

    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", "Range": "bytes=0-0"}
    failures = 0
    with requests.Session() as session:
        while True:
            try:
                with _get(session, url, headers, knobs, field) as r:
                    _raise_for_status(url, r)
                    identity = _identity_of(r)
                    if r.status_code == 206:  # read the one byte, so the connection ends cleanly (no reset)
                        with contextlib.suppress(requests.RequestException, urllib3.exceptions.HTTPError, OSError):
                            r.raw.read(1024)
                    return identity
            except SourceMissing as e:  # 404/410: the server said there is nothing there
                raise SourceMissing(
                    f"{e} (the server answered, so no version fetched from this address before is reused)"
                ) from None
            except RedirectRefused:
                raise
            except UserError as e:  # another 4xx: the server will not say
                raise SourceUnreachable(str(e)) from None
            except _retryable() as exc:
                failures += 1
                if failures >= knobs.attempts:
                    raise SourceUnreachable(
                        f"downloading {redact_url(url)} {_failed(failures)} (last: "
                        f"{_describe(exc, url)}); check the network or the mirror, or pass another "
                        "source_url"
                    ) from None
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
    """``_Transient`` for a status worth retrying, :class:`SourceMissing` for 404/410, ``UserError`` for any other
    that is not 200/206."""
    status = r.status_code
    if status >= 500 or status in _TRANSIENT_STATUS:
        raise _Transient(f"HTTP {status} {r.reason}")
    if status in (404, 410):
        raise SourceMissing(
            f"downloading {redact_url(url)} failed: HTTP {status} {r.reason}; the file is not there: check source_url"
        )
    if status not in (200, 206):
        raise UserError(
            f"downloading {redact_url(url)} failed: HTTP {status} {r.reason}; the server refused the request: "
            "check source_url or try another mirror"
        )


def _back_off(
    knobs: DownloadKnobs, failures: int, what: str, exc: BaseException, url: str, log, have: int | None = None
) -> None:
    delay = min(60.0, knobs.base_delay * 2 ** (failures - 1))
    if log:
        kept = f" with {human_bytes(have)} downloaded" if have is not None else ""
        log.warning("download: %s failed (%s)%s; retrying in %.1fs", what, _describe(exc, url), kept, delay)
    time.sleep(delay)


# ---- downloading -------------------------------------------------------------------------------------
def fetch(
    url: str,
    dest: Path,
    *,
    knobs: DownloadKnobs = DownloadKnobs(),
    identity: dict | None = None,
    max_bytes: int = MAX_ZIP_BYTES,
    log=None,
    progress=None,
    field: str = "corpus.source_url",
) -> dict:
    """Download ``url`` to ``dest`` (via ``dest.part``, resumed with ``Range``); return download facts for the metrics.

    ``dest`` appears only when the whole body arrived. ``identity`` (from :func:`probe`) gives the size to expect
    and the ETag that must not change. ``UserError`` past ``max_bytes``, on 4xx, after ``knobs.attempts``
    failed tries in a row, and for a redirect that ``field`` (the setting that names ``url``) may not follow."""
    import requests

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
    address = address_sha256(url)
    if meta.get("address") != address:  # the .part came from another address (named by a hash: no secrets stored)
        part.unlink(missing_ok=True)
        meta = {"address": address}
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
            validator = (
                meta.get("etag")
                if meta.get("etag") and not meta["etag"].startswith("W/")
                else meta.get("last_modified")
            )
            if validator:
                headers["If-Range"] = validator
            range_requests += 1
        try:
            with _get(session, url, headers, knobs, field) as r:
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
                        raise _Transient(
                            f"the server answered a Range request for byte {have:,} with "
                            f"Content-Range {r.headers.get('Content-Range')!r}; starting over"
                        )
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
        except _retryable() as exc:
            now_have = part.stat().st_size if part.exists() else 0
            failures = 1 if now_have > start_have else failures + 1
            if failures >= knobs.attempts:
                raise UserError(
                    f"downloading {shown} {_failed(failures)} (last: {_describe(exc, url)}); check the "
                    f"network or the mirror, or pass another source_url; a rerun resumes from the "
                    f"{now_have:,} bytes already downloaded"
                ) from None
            _back_off(knobs, failures, f"try {tries}", exc, url, log, have=now_have)
    os.replace(part, dest)
    meta_path.unlink(missing_ok=True)
    return {
        "tries": tries,
        "range_requests": range_requests,
        "resumed_bytes": resumed_bytes,
        "seconds": round(time.monotonic() - t0, 3),
        # what the server called the file on the last answer (compared with the probe's: a server that changes
        # them between requests cannot be trusted to name a content by them)
        **{k: meta[k] for k in ("etag", "last_modified") if meta.get(k)},
    }


def _next_read(have: int, total: int | None) -> int:
    return 1 << 20 if total is None else max(0, min(1 << 20, total - have))


def _check_unchanged(shown: str, identity: dict, r) -> None:
    """``UserError`` when the server now names the file differently from when the version was computed."""
    for key, header in (("etag", "ETag"), ("last_modified", "Last-Modified")):
        now = r.headers.get(header)
        if identity.get(key) and now and now != identity[key]:
            raise UserError(
                f"{shown} changed while this run was fetching it ({header} {identity[key]} became "
                f"{now}); rerun to fetch the new file"
            )


def _too_big(shown: str, limit: int, what: str) -> UserError:
    if limit == MAX_ZIP_BYTES:
        bound = (
            f"{human_bytes(limit)}, the most this stage downloads without expected_bytes (the "
            "wikitext-103 zip is 183 MB)"
        )
    else:
        bound = f"expected_bytes ({limit:,})"
    return UserError(
        f"{shown} is larger than {bound}: {what}, so nothing was kept; check source_url, or pass the "
        "right expected_bytes"
    )


def _describe(exc: BaseException, url: str = "") -> str:
    text = str(exc) or type(exc).__name__
    text = redact_text(text, url) if url else text
    return text if len(text) < 300 else text[:300] + "..."
