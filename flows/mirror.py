"""A loopback stand-in for the wikitext-103 mirror: a zip shaped like ``wikitext-103-raw-v1.zip`` built from
``../shared/data`` (:func:`build_wikitext_zip`), served on 127.0.0.1 with ``Range`` and an ``ETag`` (:class:`Mirror`).

    python -m flows.mirror --serve --port 8765 [--zip PATH]"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import os
import re
import sys
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tasks.sources.allowed import DEMO_PORT  # the loopback mirror of --mirror and --demo: an allowed default

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("WIKI_PIPELINE_SHARED_DATA", REPO.parent / "shared" / "data"))
ZIP_NAME = "wikitext-103-raw-v1.zip"
MEMBER = "wikitext-103-raw/wiki.{split}.raw"
PORT_VARIABLE = "WIKI_PIPELINE_MIRROR_PORT"  # moves the demo's mirror off DEMO_PORT
_TITLE_RE = re.compile(r"^ = [^=].* = $")


def chosen_port() -> int | None:
    """The port ``WIKI_PIPELINE_MIRROR_PORT`` names (1024-65535), or None when it is unset.

    Raises ValueError with the message to show for any other value."""
    raw = os.environ.get(PORT_VARIABLE)
    if raw is None:
        return None
    if not re.fullmatch(r"[1-9][0-9]{3,4}", raw) or not 1024 <= int(raw) <= 65535:
        raise ValueError(
            f"{PORT_VARIABLE}={raw!r} is not a port the mirror can use: give a number from 1024 to 65535, or unset "
            f"it for {DEMO_PORT}"
        )
    return int(raw)


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


def build_wikitext_zip(
    dest: str | os.PathLike | None = None, *, data_dir=None, with_shakespeare: bool = False
) -> bytes:
    """A wikitext-103-style zip from the shared data; written to ``dest`` when given. Returns its bytes."""
    splits = wikitext_splits(data_dir, with_shakespeare)
    data = make_zip({MEMBER.format(split=s): splits[s] for s in ("train", "valid", "test")})
    if dest is not None:
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        Path(dest).write_bytes(data)
    return data


# ---- the server --------------------------------------------------------------------------------------
class _MirrorServer(ThreadingHTTPServer):
    """The HTTP server of a :class:`Mirror`, which it sets as ``mirror`` before serving."""

    mirror: Mirror


class MirrorHandler(BaseHTTPRequestHandler):
    """Answers GET and HEAD with a file of the :class:`Mirror`, whole or the ``Range`` asked for; a subclass may change
    :meth:`refusal`, :meth:`range_header`, :meth:`response_headers` and :meth:`send_body`."""

    server: _MirrorServer
    protocol_version = "HTTP/1.1"
    server_version = "wiki-mirror/1"

    def log_message(self, format, *args):  # quiet
        pass

    def do_HEAD(self):
        self._serve(head=True)

    def do_GET(self):
        self._serve(head=False)

    def refusal(self) -> tuple[int, str] | None:
        """The status and message to answer instead of the file, or None (called for every request, under the
        mirror's lock)."""
        return None

    def range_header(self) -> str | None:
        """The ``Range`` this answer honours."""
        return self.headers.get("Range")

    def response_headers(self, headers: dict[str, str]) -> dict[str, str]:
        """The headers of an answer with the file (not of an error)."""
        return headers

    def send_body(self, body: bytes, entry: dict) -> None:
        """Send ``body``, counting the bytes sent in ``entry["sent"]``."""
        for pos in range(0, len(body), 65536):
            piece = body[pos : pos + 65536]
            self.wfile.write(piece)
            entry["sent"] = pos + len(piece)
        self.wfile.flush()

    def _serve(self, head: bool) -> None:
        mirror: Mirror = self.server.mirror
        with mirror.lock:
            entry = {
                "method": self.command,
                "path": self.path,
                "range": self.headers.get("Range"),
                "status": None,
                "sent": 0,
            }
            mirror.requests.append(entry)
            data = mirror.files.get(self.path.split("?", 1)[0])
            refusal = self.refusal()
        if data is None:
            self._error(entry, 404, "not found")
            return
        if refusal is not None:
            self._error(entry, *refusal)
            return
        if isinstance(data, Path):
            data = data.read_bytes()
        span = self._span(entry, len(data))
        if span is None:
            return
        start, end, status = span
        body = data[start:end]
        entry["status"] = status
        headers = {
            "Content-Type": "application/zip",
            "Accept-Ranges": "bytes",
            "ETag": f'"{mirror.etag(self.path)}"',
            "Content-Length": str(len(body)),
        }
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        self.send_response(status)
        for name, value in self.response_headers(headers).items():
            self.send_header(name, value)
        self.end_headers()
        if head:
            return
        try:
            self.send_body(body, entry)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True

    def _span(self, entry: dict, size: int) -> tuple[int, int, int] | None:
        """``(start, end, status)`` of the answer; None when it was answered with 416."""
        rng = self.range_header()
        if not rng:
            return 0, size, 200
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
        if not m:
            self._error(entry, 416, "bad range", {"Content-Range": f"bytes */{size}"})
            return None
        start = int(m.group(1))
        end = min(size, int(m.group(2)) + 1) if m.group(2) else size
        if start >= size or start >= end:
            self._error(entry, 416, "range not satisfiable", {"Content-Range": f"bytes */{size}"})
            return None
        return start, end, 206

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
    """Serve ``{"/path": bytes | Path}`` on 127.0.0.1 as a context manager; ``mirror.requests`` logs every request."""

    handler: type[MirrorHandler] = MirrorHandler

    def __init__(self, files: dict[str, bytes | os.PathLike] | None = None, port: int = 0) -> None:
        self.files: dict[str, bytes | Path] = {}
        for name, data in (files or {}).items():
            self.add(name, data)
        self.port = port
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self._server: _MirrorServer | None = None
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

    def clear_log(self) -> None:
        with self.lock:
            self.requests.clear()

    def start(self) -> Mirror:
        self._server = _MirrorServer(("127.0.0.1", self.port), self.handler)
        self._server.daemon_threads = True
        self._server.mirror = self
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="wiki-mirror", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Mirror:
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
    ap.add_argument("--serve", action="store_true", required=True, help="serve the zip on 127.0.0.1 until Ctrl-C")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--zip", metavar="PATH", help="serve this zip instead of building one from the shared data")
    args = ap.parse_args(argv)
    try:
        data = Path(args.zip).read_bytes() if args.zip else build_wikitext_zip()
        with Mirror({"/" + ZIP_NAME: data}, port=args.port) as m:
            print(m.url(), flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
    except FileNotFoundError as e:  # the shared data or --zip is not there
        print(
            f"error: {e}; the mirror builds its zip from wikitext2-valid.txt in {SHARED_DATA} "
            "(WIKI_PIPELINE_SHARED_DATA names another folder)",
            file=sys.stderr,
        )
        return 2
    except OSError as e:  # e.g. the port is taken
        if e.errno == errno.EADDRINUSE:
            print(
                f"error: port {args.port} on 127.0.0.1 is in use by another program; give the mirror a free port "
                "(scripts/pipeline --demo: WIKI_PIPELINE_MIRROR_PORT=8766; the corpus version follows the zip's "
                "bytes, so the same zip on another port reuses every stage)",
                file=sys.stderr,
            )
        else:
            print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
