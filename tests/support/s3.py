"""A real S3 API for the tests: moto's standalone server on 127.0.0.1 (:func:`moto_server`), fresh buckets, and the
environment that points AWS clients at it (:func:`aws_env`, with a short build-lock lease)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from flows.server import free_port
from tests.support.processes import stop_processes

LEASE_SECONDS = "3"


@contextmanager
def moto_server() -> Iterator[str]:
    """``http://127.0.0.1:<port>``: a moto S3 server process, stopped on exit."""
    exe = Path(sys.executable).with_name("moto_server")
    if not exe.exists():
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    port = free_port()
    proc = subprocess.Popen(
        [str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on {url}") from None
                time.sleep(0.2)
        yield url
    finally:
        stop_processes(proc, timeout=10)


def aws_env(endpoint: str) -> dict[str, str]:
    """What a process needs to reach the test server (moto accepts any credentials)."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "wikitestkey",
        "AWS_SECRET_ACCESS_KEY": "wikitestsecret-do-not-log",
        "AWS_DEFAULT_REGION": "us-east-1",
        "WIKI_PIPELINE_LEASE_SECONDS": LEASE_SECONDS,
        "AWS_MAX_ATTEMPTS": "2",  # an outage test fails in seconds, not a minute of retries
    }


def make_bucket(endpoint: str, name: str | None = None) -> str:
    import boto3

    bucket = name or f"wiki-{uuid.uuid4().hex[:12]}"
    env = aws_env(endpoint)
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )
    client.create_bucket(Bucket=bucket)
    return bucket


def use_cache(monkeypatch, path: Path) -> None:
    """Point this process's local cache of object-store roots at ``path`` (another machine would have its own)."""
    monkeypatch.setenv("WIKI_PIPELINE_CACHE", str(path))


def fresh_cache(tmp: Path, name: str = "cache") -> Path:
    path = tmp / name
    shutil.rmtree(path, ignore_errors=True)
    return path


def environ_with(endpoint: str, **extra: str) -> dict[str, str]:
    return {**os.environ, **aws_env(endpoint), **extra}


class Outage:
    """A TCP relay in front of the S3 server that can be cut and restored on the same port: an outage mid-run."""

    def __init__(self, upstream: str) -> None:
        import threading

        host, _, port = upstream.removeprefix("http://").partition(":")
        self.upstream = (host, int(port))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        import threading

        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        for s in [listener, *conns]:
            if s is not None:
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def _accept(self, listener: socket.socket) -> None:
        import threading

        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
