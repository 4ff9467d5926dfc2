"""Small servers on 127.0.0.1 for download tests, beside ``flows.mirror.Mirror``: each one a context manager."""

from __future__ import annotations

import functools
import socketserver
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from flows.mirror import Mirror, MirrorHandler


class Loopback:
    """A ``socketserver`` server on 127.0.0.1, served from a daemon thread until the ``with`` block ends."""

    def __init__(self, server: socketserver.BaseServer, poll_interval: float = 0.05) -> None:
        self.server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": poll_interval}, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def dir_server(directory: Path) -> Loopback:
    """Python's own ``http.server`` serving a folder: it names a file by ``Last-Modified`` (its mtime, to the
    second) and its size only -- no ETag, no Range."""

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    server.daemon_threads = True
    return Loopback(server)


def no_length_server(size: int) -> Loopback:
    """An HTTP/1.0 server that sends a body of ``size`` bytes without Content-Length (until it closes)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(size // 65536):
                    self.wfile.write(b"x" * 65536)
            except (BrokenPipeError, ConnectionResetError):
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return Loopback(server)


def dripping_server(size: int, every: float) -> Loopback:
    """A server that announces ``size`` bytes and sends them one at a time, a byte every ``every`` seconds: never
    silent long enough for a read timeout, never done. Each GET's ``Range`` start is honoured (206), so a resumed
    download gets the rest."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            start = 0
            asked = self.headers.get("Range", "")
            if asked.startswith("bytes=") and asked[6:].split("-")[0].isdigit():
                start = int(asked[6:].split("-")[0])
            self.send_response(206 if start else 200)
            self.send_header("Content-Length", str(size - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            self.end_headers()
            try:
                for _ in range(size - start):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(every)
            except (BrokenPipeError, ConnectionResetError):
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return Loopback(server)


class AcceptAndClose(Loopback):
    """A socket on 127.0.0.1:``port`` that accepts each connection and closes it at once (a server that is down
    behind a live port), counting the connections."""

    def __init__(self, port: int) -> None:
        owner = self
        self.connections = 0

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                owner.connections += 1

        class Server(socketserver.TCPServer):
            allow_reuse_address = True

        super().__init__(Server(("127.0.0.1", port), Handler))


class _QueryHandler(MirrorHandler):
    def refusal(self) -> tuple[int, str] | None:
        wanted = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("f")
        return None if wanted == ["A.zip"] else (self.server.mirror.status, "no such file")


class QueryMirror(Mirror):
    """Serves ``/get?f=A.zip`` and answers any other ``f`` with its ``status``."""

    handler = _QueryHandler
    status = 404


class _FixedETagHandler(MirrorHandler):
    def response_headers(self, headers: dict[str, str]) -> dict[str, str]:
        headers["ETag"] = '"always-the-same"'
        return headers


class FixedETagMirror(Mirror):
    """A lying server: whatever it serves, it calls it by one strong ETag."""

    handler = _FixedETagHandler
