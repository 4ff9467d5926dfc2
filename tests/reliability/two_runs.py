"""Two pipeline runs at once on one artifact root: each version is built once, the other run waits and reuses it."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

from tasks.registry import NAMES, open_store
from tests.reliability.environment import Env, run_pipeline
from tests.reliability.watcher import Watcher

WAITING = "another run is building this version; waiting for it"


def concurrent_runs(env: Env, root: Path) -> dict:
    """Two runs on one root at once; the corpus builder is held until the other waits, so they meet on a lock."""
    watcher = Watcher(root)
    watcher.start()
    results: list = [None, None]
    logs_at = [env.workdir / f"concurrent-{i}.log" for i in (0, 1)]
    go = env.workdir / "concurrent-go"
    go.unlink(missing_ok=True)

    def run(i):
        results[i] = run_pipeline(env, root, fault=f"corpus.start@1:hold={go}", watch=False, log_path=logs_at[i])

    def release():  # once a run waits on the other (or both have ended), let the held build go on
        while not any(WAITING in p.read_text(errors="replace") for p in logs_at if p.exists()):
            if all(r is not None for r in results):
                break
            time.sleep(0.1)
        go.touch()

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)] + [threading.Thread(target=release)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    watcher.stop()
    logs = [r.log for r in results]
    built = {}
    for stage in NAMES:
        built[stage] = sum(len(re.findall(rf"{stage}: building {stage}/", log)) for log in logs)
    refs = [sorted(line for line in log.splitlines() if re.match(rf"^({'|'.join(NAMES)})\s+/", line)) for log in logs]
    waited = sum(log.count(WAITING) for log in logs)
    store = open_store(root)
    versions = {stage: [v.version for v in store.versions(stage)] for stage in NAMES}
    full_ok = all(store.verify(st, v, full=True)[0] for st, vs in versions.items() for v in vs)
    return {
        "rcs": [r.rc for r in results],
        "built": built,
        "waited": waited,
        "refs_equal": refs[0] == refs[1] and len(refs[0]) == len(NAMES),
        "versions": versions,
        "verify_full": full_ok,
        "violations": watcher.violations,
        "checks": watcher.checks,
        "seconds": max(r.seconds for r in results),
    }
