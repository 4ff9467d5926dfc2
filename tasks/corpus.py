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

Downloading (``requests``, streamed into ``work/source.zip.part``): a read timeout, retries with
exponential backoff on connection errors, timeouts, truncated bodies, 5xx, 408 and 429 (never on other 4xx,
which are reported at once), and resume with an HTTP ``Range`` request (checked: ``206`` with a matching
``Content-Range``; a server that ignores ``Range`` and answers ``200`` makes us start the file over, never
append). The retry loop lives inside the stage, not in Prefect task retries, so that it can keep the bytes
it already has and reset its failure count whenever a try makes progress. Knobs (environment, not part of
the version): ``WIKI_PIPELINE_DOWNLOAD_ATTEMPTS`` (failed tries in a row before giving
up, default 6), ``WIKI_PIPELINE_RETRY_BASE_DELAY`` (seconds before the first retry, doubled each time,
capped at 60; default 2), ``WIKI_PIPELINE_READ_TIMEOUT`` (seconds without data, default 60).
"""

from __future__ import annotations

import codecs
import collections
import concurrent.futures
import hashlib
import itertools
import json
import os
import queue
import re
import threading
import time
import urllib.parse
import urllib.request
import zipfile
import zlib
from pathlib import Path
from typing import Iterable, Iterator

from pydantic import Field, field_validator

from mygpt.atomic import atomic_open, atomic_write_text
from mygpt.errors import UserError
from tasks.settings import RunOptions, Settings
from tasks.stage import BuildContext, Stage, StageRef, stage_task, summary_table
from tasks.store import human_bytes, sha256_file

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
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_CONTENT_RANGE_RE = re.compile(r"^bytes\s+(\d+)-(\d+)/(\d+|\*)$")

ENV_ATTEMPTS = "WIKI_PIPELINE_DOWNLOAD_ATTEMPTS"
ENV_BASE_DELAY = "WIKI_PIPELINE_RETRY_BASE_DELAY"
ENV_READ_TIMEOUT = "WIKI_PIPELINE_READ_TIMEOUT"


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
        if scheme not in ("http", "https", "file"):
            raise ValueError(f"source_url {url!r} has scheme {parsed.scheme or '(none)'!r}; use an http://, https:// "
                             "or file:// URL (for a local zip: file:///absolute/path/to/wikitext-103-raw-v1.zip)")
        if scheme in ("http", "https") and not parsed.netloc:
            raise ValueError(f"source_url {url!r} has no host; write it as {scheme}://host/path")
        if scheme == "file":
            if parsed.netloc not in ("", "localhost"):
                raise ValueError(f"source_url {url!r}: a file:// URL cannot name a host ({parsed.netloc!r}); "
                                 "use file:///absolute/path")
            if not parsed.path.startswith("/"):
                raise ValueError(f"source_url {url!r}: a file:// URL needs an absolute path (file:///...)")
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

    def resolved(self) -> "CorpusSettings":
        """``expected_bytes`` settled: the pinned size for the default URL, 0 (no check) for others."""
        if self.expected_bytes is not None:
            return self
        return self.model_copy(update={"expected_bytes": PINNED_BYTES if self.source_url == DEFAULT_URL else 0})


def _file_path(url: str) -> Path:
    return Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))


def _knob(env: str, default: float) -> float:
    value = os.environ.get(env) or default
    try:
        return float(value)
    except (TypeError, ValueError):
        raise UserError(f"{env} must be a number, got {value!r}") from None


# ---- downloading -------------------------------------------------------------------------------------
class _Transient(Exception):
    """A failure worth retrying (5xx, truncated body, ...)."""


def fetch(url: str, dest: Path, *, attempts: int = 6, base_delay: float = 2.0, read_timeout: float = 60.0,
          log=None, progress=None) -> dict:
    """Download ``url`` to ``dest`` (via ``dest.part``, resumable). Returns download facts for the metrics.

    ``dest`` appears only when the whole body arrived. A ``dest.part`` left by an earlier (crashed) attempt
    is resumed with ``Range``. ``UserError`` for 4xx answers and when ``attempts`` tries in a row fail.
    """
    import requests
    import urllib3

    part = dest.with_name(dest.name + ".part")
    meta_path = dest.with_name(dest.name + ".json")
    meta = {}
    if part.exists() and meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
        except ValueError:
            meta = {}
    if meta.get("url") != url:
        part.unlink(missing_ok=True)
        meta = {"url": url}
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
            with session.get(url, headers=headers, stream=True, timeout=(CONNECT_TIMEOUT, read_timeout)) as r:
                status = r.status_code
                if status == 416 and have:
                    m = re.match(r"^bytes\s+\*/(\d+)$", r.headers.get("Content-Range", ""))
                    if m and int(m.group(1)) == have:
                        break  # the .part is already complete
                    part.unlink(missing_ok=True)
                    raise _Transient(f"the server rejected resuming at byte {have:,} (HTTP 416); starting over")
                if status >= 500 or status in (408, 429):
                    raise _Transient(f"HTTP {status} {r.reason}")
                if status not in (200, 206):
                    hint = ("the file is not there: check source_url" if status in (404, 410)
                            else "the server refused the request: check source_url or try another mirror")
                    raise UserError(f"downloading {url} failed: HTTP {status} {r.reason}; {hint}")
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
                        log.warning("download: %s ignored the Range request; starting the file over", url)
                    have, mode = 0, "wb"
                    if r.headers.get("Content-Length", "").isdigit():
                        total = int(r.headers["Content-Length"])
                meta.update(etag=r.headers.get("ETag"), last_modified=r.headers.get("Last-Modified"), total=total)
                atomic_write_text(meta_path, json.dumps(meta))
                with open(part, mode) as f:
                    try:
                        # read1: whatever has arrived (up to 1 MiB), so a timeout loses no received bytes
                        while chunk := r.raw.read1(1 << 20, decode_content=False):
                            f.write(chunk)
                            have += len(chunk)
                            if progress:
                                progress(have, total or have, f"{human_bytes(have)} / {human_bytes(total or have)}")
                    finally:
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
            if failures >= attempts:
                raise UserError(
                    f"downloading {url} failed {failures} times in a row (last: {_describe(exc)}); check the "
                    f"network or the mirror, or pass another source_url; a rerun resumes from the "
                    f"{now_have:,} bytes already downloaded") from None
            delay = min(60.0, base_delay * 2 ** (failures - 1))
            if log:
                log.warning("download: try %d failed (%s) with %s downloaded; retrying in %.1fs",
                            tries, _describe(exc), human_bytes(now_have), delay)
            time.sleep(delay)
    os.replace(part, dest)
    meta_path.unlink(missing_ok=True)
    return {"tries": tries, "range_requests": range_requests, "resumed_bytes": resumed_bytes,
            "seconds": round(time.monotonic() - t0, 3)}


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
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
    try:
        zf = zipfile.ZipFile(zip_path)
    except zipfile.BadZipFile:
        raise UserError(f"{source} is not a zip archive; source_url must point at wikitext-103-raw-v1.zip "
                        "(or a copy of it)") from None
    with zf:
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


# ---- the stage ---------------------------------------------------------------------------------------
def _check_zip(path: Path, settings: CorpusSettings, *, ours: bool) -> tuple[int, str]:
    url = settings.source_url
    size = path.stat().st_size
    want = settings.expected_bytes
    if want and size != want:
        if ours:
            path.unlink(missing_ok=True)
        raise UserError(f"{url} gave {size:,} bytes but expected_bytes is {want:,}; the mirror may serve a "
                        f"different file: check source_url, or pass expected_bytes={size} (0 = no size check) "
                        "if you trust it")
    sha = sha256_file(path)
    if settings.expected_sha256 and sha != settings.expected_sha256:
        if ours:
            path.unlink(missing_ok=True)
        raise UserError(f"{url} has sha256 {sha} but expected_sha256 is {settings.expected_sha256}; check "
                        "source_url, or pass the right expected_sha256")
    return size, sha


def build_corpus(ctx: BuildContext, settings: CorpusSettings) -> dict:
    """Fetch the zip (or open the file:// one), check it, and write the stripped splits + wikipedia.txt."""
    url = settings.source_url
    t0 = time.monotonic()
    facts: dict = {"tries": 0, "range_requests": 0, "resumed_bytes": 0, "seconds": 0.0}
    if url.lower().startswith("file:"):
        zip_path = _file_path(url)
        if not zip_path.is_file():
            raise UserError(f"source_url {url!r}: there is no file {zip_path}; check the path")
        ours = False
    else:
        zip_path = ctx.work / "source.zip"
        ours = True
        if zip_path.exists():
            ctx.log.info("download: reusing %s downloaded by an earlier attempt", zip_path)
        else:
            ctx.log.info("download: fetching %s", url)
            facts = fetch(
                url, zip_path,
                attempts=max(1, int(_knob(ENV_ATTEMPTS, 6))),
                base_delay=_knob(ENV_BASE_DELAY, 2.0),
                read_timeout=_knob(ENV_READ_TIMEOUT, 60.0),
                log=ctx.log, progress=lambda d, t, m: ctx.progress(d, t, "downloading " + m))
    size, sha = _check_zip(zip_path, settings, ours=ours)
    download_seconds = round(time.monotonic() - t0, 3)
    ctx.log.info("download: %s is %s, sha256 %s", url, human_bytes(size), sha)
    t1 = time.monotonic()
    try:
        corpus = extract_corpus(zip_path, ctx.out, source=url,
                                progress=lambda d, t, m: ctx.progress(d, t, m))
    except UserError:
        if ours:
            zip_path.unlink(missing_ok=True)  # a rerun fetches again instead of reusing a bad archive
        raise
    ctx.progress(1, 1, "done", force=True)
    return {
        "source_url": url,
        "zip_bytes": size,
        "zip_sha256": sha,
        "zip_published": False,
        "download_seconds": download_seconds,
        "download": facts,
        "extract_seconds": round(time.monotonic() - t1, 3),
        **corpus,
    }


def report(manifest: dict) -> str:
    m = manifest.get("metrics", {})
    d = m.get("download", {})
    lines = [
        f"# corpus `{manifest['version']}`",
        "",
        summary_table([
            ("source", m.get("source_url")),
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


STAGE = Stage(name="corpus", code_version="2", report=report)


@stage_task(STAGE)
def download_corpus(settings: CorpusSettings = CorpusSettings(), run: RunOptions = RunOptions()) -> StageRef:
    """Download wikitext-103-raw-v1 (or reuse that version): the stripped splits and wikipedia.txt.

    Retry/timeout knobs come from the environment (see the module docstring), not from the version."""
    return STAGE.run(build_corpus, settings, run)
