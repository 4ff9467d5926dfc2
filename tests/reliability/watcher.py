"""A thread that verifies every visible version directory of a live artifact root."""

from __future__ import annotations

import threading
from pathlib import Path

from tasks.registry import NAMES, open_store


class Watcher(threading.Thread):
    """Verifies every ``<root>/<stage>/<version>``; one that fails and is still the same inode is a violation."""

    def __init__(self, root: Path, interval: float = 0.02) -> None:
        super().__init__(daemon=True, name="artifact-watcher")
        self.root, self.interval = Path(root), interval
        self.stop_event = threading.Event()
        self.violations: list[str] = []
        self.checks = 0
        self.seen: set[str] = set()

    def run(self) -> None:
        store = open_store(self.root)
        while not self.stop_event.is_set():
            for stage in NAMES:
                sdir = self.root / stage
                try:
                    children = [c for c in sdir.iterdir() if not c.name.startswith(".")]
                except OSError:
                    continue
                for child in children:
                    try:
                        ino = child.stat().st_ino
                        ok, reason = store.verify(stage, child.name, full=False)
                        same = child.exists() and child.stat().st_ino == ino
                    except OSError:
                        continue
                    self.checks += 1
                    self.seen.add(f"{stage}/{child.name}")
                    if not ok and same:
                        self.violations.append(f"{stage}/{child.name}: {reason}")
            self.stop_event.wait(self.interval)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(10)
