"""A real Prefect server on 127.0.0.1 as a child process: its own PREFECT_HOME, a free port, SQLite, analytics off.

Used by the tests, the benchmarks and the CLI wherever a run needs a server and none is configured.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrefectServer:
    def __init__(self, home: Path) -> None:
        self.home = Path(home)
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.env = {
            **os.environ,
            "PREFECT_HOME": str(self.home),
            "PREFECT_API_URL": self.api_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": "false",
            "PREFECT_LOGGING_LEVEL": "INFO",
        }
        self.proc: subprocess.Popen | None = None
        self.log_path = self.home / "server.log"

    def start(self, timeout: float = 90) -> "PrefectServer":
        self.home.mkdir(parents=True, exist_ok=True)
        prefect = Path(sys.executable).with_name("prefect")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [str(prefect), "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
            env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prefect server exited early:\n{self.log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.api_url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"prefect server did not answer within {timeout}s:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()
