"""A loopback stand-in for the wikitext-103 mirror: a small zip built from real text, served over HTTP.

* :func:`build_wikitext_zip` makes a zip shaped like ``wikitext-103-raw-v1.zip`` (members
  ``wikitext-103-raw/wiki.{train,valid,test}.raw``) from ``../shared/data/wikitext2-valid.txt``, split at
  article boundaries (the `` = Title = `` lines) into train / valid / test, optionally with Tiny
  Shakespeare appended to train.
* :class:`Mirror` serves byte strings or files on ``127.0.0.1`` only (``ThreadingHTTPServer`` on port 0
  in a daemon thread; a context manager), with ``Range`` support and fault modes (:class:`Faults`) for
  tests: fail the first N requests with 503, drop the connection after K body bytes, ignore ``Range``,
  send a wrong ``Content-Length``, stall, answer 404. Every request is logged in ``mirror.requests``.

CLI::

    python -m flows.mirror --write-zip /tmp/wikitext-mini.zip
    python -m flows.mirror --serve --port 8765 [--fail-first 2] [--drop-after 100000] ...
"""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
import threading
import time
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("WIKI_PIPELINE_SHARED_DATA", REPO.parent / "shared" / "data"))
ZIP_NAME = "wikitext-103-raw-v1.zip"
MEMBER = "wikitext-103-raw/wiki.{split}.raw"
_TITLE_RE = re.compile(r"^ = [^=].* = $")


# ---- the zip -----------------------------------------------------------------------------------------
def make_zip(members: dict[str, bytes | str]) -> bytes:
    """A deterministic zip (fixed timestamps, deflate) of ``{name: content}``; str content is UTF-8."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, date_time=(2016, 9, 26, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, data.encode("utf-8") if isinstance(data, str) else data)
    return buf.getvalue()


def split_articles(text: str, fractions=(0.8, 0.1)) -> dict[str, str]:
    """Cut wikitext at article boundaries (the blank line before each `` = Title = ``) into 3 splits."""
    lines = text.splitlines(keepends=True)
    starts = [max(i - 1, 0) for i, line in enumerate(lines) if _TITLE_RE.match(line.rstrip("\n"))]
    if len(starts) < 3:
        raise ValueError("need at least 3 articles ( = Title = lines) to make train/valid/test")
    starts = sorted(set([0] + starts[1:]))
    n = len(starts)
    n_train = max(1, min(n - 2, round(n * fractions[0])))
    n_valid = max(1, min(n - n_train - 1, round(n * fractions[1])))
    cut1, cut2 = starts[n_train], starts[n_train + n_valid]
    return {
        "train": "".join(lines[:cut1]),
        "valid": "".join(lines[cut1:cut2]),
        "test": "".join(lines[cut2:]),
    }


def wikitext_splits(data_dir: str | os.PathLike | None = None, with_shakespeare: bool = False) -> dict[str, str]:
    data_dir = Path(data_dir) if data_dir else SHARED_DATA
    splits = split_articles((data_dir / "wikitext2-valid.txt").read_text(encoding="utf-8"))
    if with_shakespeare:
        splits["train"] += (data_dir / "tinyshakespeare.txt").read_text(encoding="utf-8")
    return splits


def build_wikitext_zip(dest: str | os.PathLike | None = None, *, data_dir=None,
                       with_shakespeare: bool = False) -> bytes:
    """A wikitext-103-style zip from the shared data; written to ``dest`` when given. Returns its bytes."""
    splits = wikitext_splits(data_dir, with_shakespeare)
    data = make_zip({MEMBER.format(split=s): splits[s] for s in ("train", "valid", "test")})
    if dest is not None:
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        Path(dest).write_bytes(data)
    return data


# ---- the server --------------------------------------------------------------------------------------
@dataclass
class Faults:
    """Fault modes; counters count requests (or responses with a body) from when the faults were set."""

    fail_first: int = 0  # answer the first N requests with ``fail_status``
    fail_status: int = 503
    not_found: bool = False  # answer every request with 404
    drop_after: int | None = None  # close the connection after this many body bytes ...
    drop_times: int = 1  # ... in this many responses (-1: every response)
    ignore_range: bool = False  # answer Range requests with 200 and the whole file
    length_delta: int = 0  # add this to the Content-Length header (body unchanged; then close)
    length_times: int = 1  # ... in this many responses (-1: every response)
    stall: float = 0.0  # sleep this long before sending the body ...
    stall_after: int = 0  # ... after this many body bytes ...
    stall_times: int = 1  # ... in this many responses (-1: every response)
    counts: dict = field(default_factory=dict)

    def take(self, name: str, times: int) -> bool:
        """Whether fault ``name`` applies to this response (and count it)."""
        used = self.counts.get(name, 0)
        if times >= 0 and used >= times:
            return False
        self.counts[name] = used + 1
        return True


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "wiki-mirror/1"

    def log_message(self, format, *args):  # quiet
        pass

    def do_HEAD(self):
        self._serve(head=True)

    def do_GET(self):
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        mirror: Mirror = self.server.mirror
        with mirror.lock:
            faults = mirror.faults
            n = mirror._request_count
            mirror._request_count += 1
            entry = {"method": self.command, "path": self.path, "range": self.headers.get("Range"),
                     "status": None, "sent": 0}
            mirror.requests.append(entry)
            data = mirror.files.get(self.path.split("?", 1)[0])
            fail = n < faults.fail_first
            drop = stall = delta = None
        if faults.not_found or data is None:
            return self._error(entry, 404, "not found")
        if fail:
            return self._error(entry, faults.fail_status, "induced failure")
        if isinstance(data, Path):
            data = data.read_bytes()
        size = len(data)
        start, end, status = 0, size, 200
        rng = self.headers.get("Range")
        if rng and not faults.ignore_range:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if not m:
                return self._error(entry, 416, "bad range", {"Content-Range": f"bytes */{size}"})
            start = int(m.group(1))
            end = min(size, int(m.group(2)) + 1) if m.group(2) else size
            if start >= size or start >= end:
                return self._error(entry, 416, "range not satisfiable", {"Content-Range": f"bytes */{size}"})
            status = 206
        body = data[start:end]
        with mirror.lock:
            if faults.drop_after is not None and faults.take("drop", faults.drop_times):
                drop = faults.drop_after
            if faults.stall and faults.take("stall", faults.stall_times):
                stall = (faults.stall_after, faults.stall)
            if faults.length_delta and faults.take("length", faults.length_times):
                delta = faults.length_delta
        entry["status"] = status
        self.send_response(status)
        self.send_header("Content-Type", "application/zip")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{mirror.etag(self.path)}"')
        self.send_header("Content-Length", str(len(body) + (delta or 0)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        if drop is not None or delta:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if head:
            return
        limit = len(body) if drop is None else min(drop, len(body))
        pos = 0
        try:
            while pos < limit:
                if stall and pos >= stall[0]:
                    if mirror._stop.wait(stall[1]):
                        return
                    stall = None
                piece = body[pos:min(limit, pos + 65536, stall[0] if stall and stall[0] > pos else limit)]
                self.wfile.write(piece)
                pos += len(piece)
                entry["sent"] = pos
            if stall and pos >= stall[0]:  # stall at the very end of the body
                mirror._stop.wait(stall[1])
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True
            return
        if drop is not None:
            self.close_connection = True

    def _error(self, entry: dict, status: int, message: str, headers: dict | None = None) -> None:
        entry["status"] = status
        body = f"{status} {message}\n".encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class Mirror:
    """Serve ``{"/path": bytes | Path}`` on 127.0.0.1; use as a context manager.

    ``mirror.url("/wikitext-103-raw-v1.zip")`` is the address; ``mirror.faults`` (a :class:`Faults`) can be
    replaced at any time with :meth:`set_faults`; ``mirror.requests`` logs every request
    (``method, path, range, status, sent``).
    """

    def __init__(self, files: dict[str, bytes | os.PathLike] | None = None, port: int = 0,
                 faults: Faults | None = None) -> None:
        self.files: dict[str, bytes | Path] = {}
        for name, data in (files or {}).items():
            self.add(name, data)
        self.port = port
        self.faults = faults or Faults()
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self._request_count = 0
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def add(self, name: str, data: bytes | os.PathLike) -> None:
        name = name if name.startswith("/") else "/" + name
        self.files[name] = data if isinstance(data, (bytes, bytearray)) else Path(data)

    def etag(self, path: str) -> str:
        import hashlib

        data = self.files.get(path.split("?", 1)[0])
        if isinstance(data, Path):
            st = data.stat()
            return f"{st.st_size:x}-{st.st_mtime_ns:x}"
        return hashlib.sha1(data or b"").hexdigest()[:16]

    def set_faults(self, **kw) -> Faults:
        """Replace the fault modes (counters restart from the next request)."""
        with self.lock:
            self.faults = Faults(**kw)
            self._request_count = 0
        return self.faults

    def clear_log(self) -> None:
        with self.lock:
            self.requests.clear()

    def start(self) -> "Mirror":
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), _Handler)
        self._server.daemon_threads = True
        self._server.mirror = self
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="wiki-mirror", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "Mirror":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, name: str = "/" + ZIP_NAME) -> str:
        return self.base_url + (name if name.startswith("/") else "/" + name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flows.mirror", description=__doc__.split("\n\n")[0])
    ap.add_argument("--write-zip", metavar="PATH", help="write the wikitext-103-style zip to PATH")
    ap.add_argument("--serve", action="store_true", help="serve the zip on 127.0.0.1 until Ctrl-C")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--zip", metavar="PATH", help="serve this zip instead of building one")
    ap.add_argument("--with-shakespeare", action="store_true", help="append tinyshakespeare to train")
    ap.add_argument("--data-dir", default=None, help=f"folder with wikitext2-valid.txt (default {SHARED_DATA})")
    for name in ("fail-first", "drop-after", "length-delta"):
        ap.add_argument(f"--{name}", type=int, default=None)
    ap.add_argument("--stall", type=float, default=0.0)
    ap.add_argument("--ignore-range", action="store_true")
    args = ap.parse_args(argv)
    if not args.write_zip and not args.serve:
        ap.error("give --write-zip PATH and/or --serve")
    data = None
    if args.write_zip:
        data = build_wikitext_zip(args.write_zip, data_dir=args.data_dir, with_shakespeare=args.with_shakespeare)
        print(f"wrote {args.write_zip} ({len(data):,} bytes)")
    if args.serve:
        if args.zip:
            data = Path(args.zip).read_bytes()
        elif data is None:
            data = build_wikitext_zip(data_dir=args.data_dir, with_shakespeare=args.with_shakespeare)
        faults = Faults(fail_first=args.fail_first or 0, drop_after=args.drop_after,
                        length_delta=args.length_delta or 0, stall=args.stall, ignore_range=args.ignore_range)
        with Mirror({"/" + ZIP_NAME: data}, port=args.port, faults=faults) as m:
            print(m.url(), flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
