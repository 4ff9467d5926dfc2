"""Reliability harness: crash the tiny pipeline anywhere, break the network, damage artifacts, feed bad input.

Everything runs on this machine: a real Prefect server and the wikitext mirror (``flows.mirror``) on
127.0.0.1, and ``python -m flows.cli run --tiny`` as real subprocesses.

* **Kills.** A run with ``WIKI_PIPELINE_FAULT=<point>@<n>`` SIGKILLs itself at the n-th call of a named point
  (``tasks.core.stage.fault_point``: ``<stage>.start``, ``<stage>.progress``, ``<stage>.publish``, ``<stage>.published``).
  The points are drawn (seeded) from the trace of an uninterrupted reference run, so every kill lands inside
  the stage it names. Kills are chained: the run that carries the kill for stage k+1 is the rerun that must
  recover stage k; a last run without faults finishes. After every rerun: each published version verifies
  (sha256), its data files equal the reference run's (see :func:`stage_digests`), training resumed from the
  checkpoint the kill left, and no staging dir is left for a published version. A watcher thread polls the
  artifact root while a run is live and records any visible version directory that does not verify.
* **Two runs at once** on one root: each version is built exactly once (one ``building`` log line over both
  runs), the other run waits for it and reuses it; both complete with identical refs.
* **Network faults** (in-process, ``tasks.corpus``): 503s, dropped connection, Range ignored, wrong
  Content-Length both ways, wrong size, a larger file, wrong sha256, 404, stall, endless 5xx. Each must end in
  the correct corpus or a clear ``UserError``, with no cached zip that is not a prefix of the real one. Then
  what is at the URL (:func:`source_cases`): new content at the same URL must give a new version with the new
  text; credentials in the URL must download the corpus and appear in no log line and no stored file.
* **Damaged artifacts** (in-process stage calls): a truncated shard, a flipped byte in tokenizer.json (same
  size: only ``full_check`` sees it), a deleted / truncated model.ckpt, a truncated / deleted resume
  checkpoint in train staging, a manifest that no longer matches, a stray file.
* **Bad input**: ``wiki-pipeline run`` with bad parameters, bad download knobs in the environment or a zip that
  must not be unpacked (encrypted, unreadable compression, a zip bomb): exit code 2, the exact ``error:`` line,
  nothing published.

    .venv/bin/python -m tests.reliability.harness --seed 1 --kills-per-stage 5 --write docs/RELIABILITY.md

The fast subset runs in CI as ``tests/reliability/test_reliability.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import io
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from flows.mirror import ZIP_NAME, Mirror, build_wikitext_zip, make_zip
from tasks.core.faults import FAULT_ENV, FAULT_TRACE_ENV
from tasks.core.report import human_bytes
from tasks.registry import NAMES, open_store
from tasks.store.artifacts import MANIFEST, sha256_file
from tests.support import REPO, zips
from tests.support.mirror_faults import Faults, FaultyMirror

# Fields that measure time, not content: dropped before comparing (they differ between any two runs).
TIMING_KEYS = re.compile(r"(^|_)seconds$|^tokens_per_sec$|^mb_per_s$")
RUN_TIMEOUT = 240.0  # one pipeline subprocess (tiny preset: ~10 s)


# ---- comparing artifacts -------------------------------------------------------------------------------
def _strip_timings(obj):
    if isinstance(obj, dict):
        return {k: _strip_timings(v) for k, v in obj.items() if not TIMING_KEYS.search(k)}
    if isinstance(obj, list):
        return [_strip_timings(v) for v in obj]
    return obj


def file_digest(path: Path) -> str:
    """sha256 of a published data file, with timing fields removed where a file holds some.

    Byte sha256 for everything except: JSON files (timing keys dropped, canonical form), loss_history.csv
    (tokens_per_sec column dropped) and model.ckpt (the weights' bytes plus every other payload field except
    ``meta.version``: a checkpoint records its own version id, which depends on upstream build ids).
    """
    name = path.name
    if name.endswith(".json"):
        data = _strip_timings(json.loads(path.read_text(encoding="utf-8")))
        return "json:" + hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    if name == "loss_history.csv":
        rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))
        data = [{k: v for k, v in r.items() if not TIMING_KEYS.search(k)} for r in rows]
        return "csv:" + hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    if name.endswith(".ckpt"):
        import torch

        payload = torch.load(path, map_location="cpu", weights_only=False)
        h = hashlib.sha256()
        for k, t in sorted(payload.pop("model_state_dict").items()):
            h.update(k.encode())
            h.update(t.contiguous().numpy().tobytes())
        meta = dict(payload.get("meta") or {})
        meta.pop("version", None)
        payload["meta"] = meta
        h.update(json.dumps(payload, sort_keys=True, default=str).encode())
        return "ckpt:" + h.hexdigest()
    return sha256_file(path)


def stage_digests(root: Path, stage: str, version: str | None = None) -> dict[str, str]:
    """{file: digest} of a published version's data files (not the manifest); the newest version by default."""
    store = open_store(root)
    if version is None:
        versions = store.versions(stage)
        if not versions:
            return {}
        version = versions[-1].version
    path = store.version_path(stage, version)
    return {
        str(p.relative_to(path)): file_digest(p) for p in sorted(path.rglob("*")) if p.is_file() and p.name != MANIFEST
    }


def all_digests(root: Path) -> dict[str, dict[str, str]]:
    return {stage: stage_digests(root, stage) for stage in NAMES}


# ---- watching a live artifact root -----------------------------------------------------------------------
class Watcher(threading.Thread):
    """Polls ``<root>/<stage>/*`` (non-dot dirs) and verifies each; a dir that fails while it stays the same
    inode (not renamed away or replaced meanwhile) is a violation: a half-built or broken visible version."""

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


# ---- the environment: a Prefect server and the mirror ----------------------------------------------------
@dataclass
class Env:
    """Where pipeline subprocesses run: the Prefect server's environment and the mirror's URL."""

    proc_env: dict
    mirror: Mirror
    workdir: Path
    zip_bytes: bytes

    @property
    def url(self) -> str:
        return self.mirror.url()


@contextlib.contextmanager
def environment(workdir: Path, api_env: dict | None = None):
    """A mirror (and, unless ``api_env`` is given, a Prefect server) on 127.0.0.1 for the harness."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    data = build_wikitext_zip()
    with contextlib.ExitStack() as stack:
        if api_env is None:
            from flows.server import PrefectServer, running_server

            # in-process flow runs (the bad-input cases) report to this server too
            server = stack.enter_context(running_server(PrefectServer(workdir / "prefect-home")))
            api_env = server.env
        # a 0.1 s pause after the first 100 kB of every response: the first progress point of the download
        # then lands mid-body, so kills there exercise the Range resume (loopback is otherwise one gulp)
        mirror = stack.enter_context(
            FaultyMirror({"/" + ZIP_NAME: data}, faults=Faults(stall=0.1, stall_after=100_000, stall_times=-1))
        )
        env = {**api_env, "OMP_NUM_THREADS": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        env.pop(FAULT_ENV, None)
        env.pop(FAULT_TRACE_ENV, None)
        yield Env(env, mirror, workdir, data)


@dataclass
class RunResult:
    rc: int
    log: str
    seconds: float
    violations: list = field(default_factory=list)
    checks: int = 0

    @property
    def killed(self) -> bool:
        return self.rc == -signal.SIGKILL


def run_pipeline(
    env: Env,
    root: Path,
    *,
    fault: str | None = None,
    trace: Path | None = None,
    log_path: Path | None = None,
    watch: bool = True,
    extra: list[str] | None = None,
    timeout: float = RUN_TIMEOUT,
) -> RunResult:
    """``python -m flows.cli run --tiny --source-url <mirror>`` as a subprocess (own session, so a kill
    takes its worker processes too); ``fault`` = ``WIKI_PIPELINE_FAULT``."""
    cmd = [
        sys.executable,
        "-m",
        "flows.cli",
        "run",
        "--tiny",
        "--source-url",
        env.url,
        "--artifacts-dir",
        str(root),
        *(extra or []),
    ]
    penv = dict(env.proc_env)
    if fault:
        penv[FAULT_ENV] = fault
    if trace:
        penv[FAULT_TRACE_ENV] = str(trace)
    log_path = log_path or Path(tempfile.mktemp(prefix="run-", suffix=".log", dir=env.workdir))
    watcher = Watcher(root) if watch else None
    if watcher:
        watcher.start()
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=penv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # leftover workers of a self-killed run
        if rc is None:
            proc.wait()
    if watcher:
        watcher.stop()
    text = log_path.read_text(errors="replace")
    if rc is None:
        raise RuntimeError(f"pipeline run did not end within {timeout}s:\n{text[-3000:]}")
    return RunResult(
        rc,
        text,
        round(time.monotonic() - t0, 2),
        watcher.violations if watcher else [],
        watcher.checks if watcher else 0,
    )


def read_trace(path: Path) -> dict[str, list[tuple[str, int]]]:
    """{stage: [(point, n), ...]} from a ``WIKI_PIPELINE_FAULT_TRACE`` file."""
    points: dict[str, list[tuple[str, int]]] = {stage: [] for stage in NAMES}
    for line in path.read_text().splitlines():
        name, n = line.split()
        points[name.split(".")[0]].append((name, int(n)))
    return points


# ---- kills ---------------------------------------------------------------------------------------------
@dataclass
class Kill:
    task: str  # the stage
    fault: str  # <point>@<n>
    killed: bool = False
    left: str = ""  # what the kill left in staging
    resumed: str = ""  # how the rerun continued
    recovered: bool = False
    problems: list = field(default_factory=list)


def staging_state(root: Path, task: str) -> tuple[str, dict]:
    """What a killed build left in ``<stage>/.staging`` (a description and facts to check the rerun against)."""
    stage = task
    dirs = [d for d in (root / stage / ".staging").glob("*") if d.is_dir()]
    published = {v.version for v in open_store(root).versions(stage)}
    if task == "corpus" and not dirs:  # killed while downloading the zip to learn its sha256, before the build
        parts = list((root / "corpus" / ".sources" / "downloads").glob("*.zip.part"))
        if parts:
            facts = {"part": parts[0].stat().st_size}
            return f"{facts['part']:,} B of the zip in corpus/.sources/downloads/ (.part)", facts
    if not dirs:
        return ("published, no staging left" if published else "nothing"), {}
    if dirs[0].name in published:
        return "version published; its staging dir not yet deleted", {"stale_staging": True}
    work, out = dirs[0] / "work", dirs[0] / "out"
    facts: dict = {}
    if task == "corpus":
        part, zipf = work / "source.zip.part", work / "source.zip"
        if zipf.exists():
            facts["zip"] = zipf.stat().st_size
            return f"complete zip ({facts['zip']:,} B) in work/", facts
        if part.exists():
            facts["part"] = part.stat().st_size
            return f"{facts['part']:,} B of the zip in work/source.zip.part", facts
    if task == "shards" and (work / "progress.json").exists():
        rec = json.loads((work / "progress.json").read_text())
        n = sum(len(s.get("shards", [])) for s in rec.get("splits", {}).values())
        facts["shards"] = n
        # the recorded shard files as they are now: a resumed rerun publishes these very files (same mtime)
        facts["mtimes"] = {
            f"{split}-{sh['index']:05d}.parquet": (out / f"{split}-{sh['index']:05d}.parquet").stat().st_mtime_ns
            for split, srec in rec.get("splits", {}).items()
            for sh in srec.get("shards", [])
        }
        return f"{n} shard(s) recorded in work/progress.json", facts
    if task == "model":
        ckpt = work / "train.ckpt"
        if ckpt.exists():
            from mygpt.checkpoint import load_checkpoint_payload

            facts["ckpt_step"] = int(load_checkpoint_payload(ckpt)["resume"]["step"])
            return f"resume checkpoint at step {facts['ckpt_step']}", facts
        facts["ckpt_step"] = 0
        return "no checkpoint yet", facts
    if (out / MANIFEST).exists():
        return "manifest written in staging out/, not renamed", facts
    files = [p for p in out.rglob("*") if p.is_file()]
    return f"staging with {len(files)} file(s) in out/", facts


def check_resume(kill: Kill, facts: dict, rerun: RunResult, root: Path, env: Env, requests_before: int) -> None:
    """How the rerun continued the killed build; appends a problem when it did not resume as it should."""
    task = kill.task
    if facts.get("stale_staging"):
        kill.resumed = "reused the published version; stale staging deleted"
        if f"{task}: building" in rerun.log:
            kill.problems.append("rebuilt a version that was already published")
    elif task == "corpus" and "part" in facts:
        ranges = [r["range"] for r in env.mirror.requests[requests_before:]]
        want = f"bytes={facts['part']}-"
        if want in ranges:
            kill.resumed = f"HTTP Range {want}"
        else:
            kill.problems.append(f"download did not resume with {want} (requests: {ranges})")
    elif task == "corpus" and "zip" in facts:
        kill.resumed = "reused the downloaded zip" if "reusing" in rerun.log else ""
        if not kill.resumed:
            kill.problems.append("download did not reuse the complete zip")
    elif task == "shards" and facts.get("shards"):
        versions = open_store(root).versions("shards")
        path = Path(versions[-1].path) if versions else None
        kept = [
            name
            for name, mtime in facts["mtimes"].items()
            if path is not None and (path / name).exists() and (path / name).stat().st_mtime_ns == mtime
        ]
        m = versions[-1].manifest["metrics"] if versions else {}
        total = sum(s["text_bytes"] for s in m.get("splits", {}).values())
        if len(kept) == len(facts["mtimes"]):
            kill.resumed = (
                f"kept its {len(kept)} recorded shard(s) (files untouched); encoded "
                f"{m.get('encoded_bytes_this_run', 0):,} of {total:,} text bytes again"
            )
        else:
            kill.problems.append(
                f"shards rewrote {len(facts['mtimes']) - len(kept)} of {len(facts['mtimes'])} "
                "recorded shard(s) instead of keeping them"
            )
    elif task == "model":
        versions = open_store(root).versions("model")
        got = versions[-1].manifest["metrics"]["resumed_from"] if versions else None
        if got != facts.get("ckpt_step"):
            kill.problems.append(
                f"model resumed from step {got}, the kill left a checkpoint at step {facts.get('ckpt_step')}"
            )
        else:
            kill.resumed = f"from step {got}" if got else "from step 0 (no checkpoint yet)"
    if not kill.resumed:
        kill.resumed = "rebuilt" if f"{task}: building" in rerun.log else "reused"


def check_root(root: Path, reference: dict, upto: int) -> list[str]:
    """Problems with the first ``upto`` stages of ``root``: not verifying (full), differing from the reference,
    or a staging dir left for a published version."""
    store = open_store(root)
    problems = []
    for stage in NAMES[:upto]:
        versions = store.versions(stage)
        if not versions:
            problems.append(f"{stage}: nothing published")
            continue
        for v in versions:
            ok, reason = store.verify(stage, v.version, full=True)
            if not ok:
                problems.append(f"{stage}/{v.version}: {reason}")
            if store.staging_path(stage, v.version).exists():
                problems.append(f"{stage}/{v.version}: staging dir left after publish")
        got = stage_digests(root, stage)
        diff = sorted(set(got) ^ set(reference[stage]) | {k for k in got if reference[stage].get(k) != got[k]})
        if diff:
            problems.append(f"{stage}: differs from the uninterrupted run in {', '.join(diff[:5])}")
    return problems


def kill_chain(
    env: Env, root: Path, faults: list[tuple[str, str]], reference: dict, tag: str = "", stats: dict | None = None
) -> list[Kill]:
    """Run the pipeline with one kill per entry ``(task, "<point>@<n>")`` in pipeline order, each rerun
    recovering the previous kill, then a last run without faults. Returns the kills with their checks."""
    kills = [Kill(task, fault) for task, fault in faults]
    pending: tuple[Kill, dict] | None = None
    for i, kill in enumerate(kills + [None]):
        before = len(env.mirror.requests)
        res = run_pipeline(env, root, fault=kill.fault if kill else None, log_path=env.workdir / f"chain{tag}-{i}.log")
        if stats is not None:
            stats["checks"] = stats.get("checks", 0) + res.checks
            stats["runs"] = stats.get("runs", 0) + 1
        if pending:
            prev, facts = pending
            check_resume(prev, facts, res, root, env, before)
            upto = NAMES.index(prev.task) + 1
            prev.problems += check_root(root, reference, upto)
            prev.problems += [f"watcher: {v}" for v in res.violations]
            prev.recovered = not prev.problems
            pending = None
        if kill is None:
            if res.rc != 0:
                raise RuntimeError(f"the final run failed (rc {res.rc}):\n{res.log[-3000:]}")
            for k in kills:
                if k.recovered:
                    extra = check_root(root, reference, len(NAMES))
                    if extra:
                        k.problems += extra
                        k.recovered = False
            break
        kill.killed = res.killed
        kill.problems += [f"watcher: {v}" for v in res.violations]
        if not res.killed:
            kill.problems.append(f"the run was not killed (rc {res.rc}); log tail: {res.log[-500:]}")
            continue
        kill.left, facts = staging_state(root, kill.task)
        pending = (kill, facts)
    return kills


def pick_faults(
    trace: dict[str, list[tuple[str, int]]], rng: random.Random, per_stage: int
) -> list[list[tuple[str, str]]]:
    """``per_stage`` rounds, each one random reachable point per stage (without repeats while possible)."""
    rounds: list[list[tuple[str, str]]] = [[] for _ in range(per_stage)]
    for task in NAMES:
        points = list(trace[task])
        rng.shuffle(points)
        while len(points) < per_stage:
            points += rng.sample(trace[task], len(trace[task]))
        for r in range(per_stage):
            name, n = points[r]
            rounds[r].append((task, f"{name}@{n}"))
    return rounds


#: The fast subset's kill points (one per stage, chosen to hit each resume path and both publish edges).
FAST_FAULTS = [
    ("corpus", "corpus.progress@1"),
    ("tokenizer", "tokenizer.publish@1"),
    ("shards", "shards.progress@2"),
    ("model", "model.progress@4"),
    ("samples", "samples.published@1"),
    ("export", "export.publish@1"),
]


# ---- two runs at once ----------------------------------------------------------------------------------
WAITING = "another run is building this version; waiting for it"


def concurrent_runs(env: Env, root: Path) -> dict:
    """Start two pipeline runs on one root at the same moment; return what happened. Whichever builds the corpus
    holds there (``corpus.start@1:hold=``) until the other says it waits for it, so the two meet on a lock however
    far apart the two processes start on a loaded machine (the other then reuses the corpus, and the pair meets
    again on whatever else they build at once)."""
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


# ---- network faults ------------------------------------------------------------------------------------
@contextlib.contextmanager
def env_vars(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass
class NetCase:
    name: str
    faults: dict
    expect: str  # "corpus" or a regex of the UserError
    kwargs: dict = field(default_factory=dict)
    serve: bytes | None = None  # serve these bytes instead of the real zip


def network_cases(zip_bytes: bytes) -> list[NetCase]:
    """The cases. Every http(s) run first asks the server what the file is (a one-byte Range request whose
    size and ETag enter the corpus version), and the mirror counts that response too: a fault meant for the
    download proper is set for 2 responses (``*_times``)."""
    size = len(zip_bytes)
    sha = hashlib.sha256(zip_bytes).hexdigest()
    other = make_zip({"wikitext-103-raw/wiki.train.raw": " = A = \n not the corpus .\n"})
    flipped = bytearray(zip_bytes)
    flipped[size // 2] ^= 0xFF
    return [
        NetCase("503, 503, then 200", {"fail_first": 2}, "corpus"),
        NetCase("connection dropped after 100 kB", {"drop_after": 100_000, "drop_times": 2}, "corpus"),
        NetCase(
            "dropped, and Range ignored (200 + whole file)",
            {"drop_after": 100_000, "drop_times": 2, "ignore_range": True},
            "corpus",
        ),
        NetCase(
            "Content-Length 5000 too large (the probed size is read, not more)",
            {"length_delta": 5000, "length_times": 2},
            "corpus",
        ),
        NetCase(
            "Content-Length 5000 too small (body cut short; the rest comes with Range)",
            {"length_delta": -5000, "length_times": 2},
            "corpus",
        ),
        NetCase(
            "Content-Length 5000 too small, expected_bytes given",
            {"length_delta": -5000, "length_times": 2},
            "corpus",
            {"expected_bytes": size},
        ),
        NetCase(
            "a different file (size differs from expected_bytes: refused before downloading)",
            {},
            r"is [\d,]+ bytes but expected_bytes is",
            {"expected_bytes": size},
            other,
        ),
        NetCase(
            "a larger file than expected_bytes (refused before downloading)",
            {},
            r"is [\d,]+ bytes but expected_bytes is",
            {"expected_bytes": size},
            zip_bytes + b"\0" * 100_000,
        ),
        NetCase(
            "one byte flipped (sha256 differs from expected_sha256)",
            {},
            r"has sha256 [0-9a-f]{64} but "
            r"expected_sha256 is " + sha,
            {"expected_sha256": sha},
            bytes(flipped),
        ),
        NetCase("404", {"not_found": True}, r"HTTP 404 Not Found; the file is not there: check source_url"),
        NetCase(
            "stall 4 s after 64 KiB (read timeout 1 s)",
            {"stall": 4.0, "stall_after": 65536, "stall_times": 2},
            "corpus",
        ),
        NetCase("502 forever", {"fail_first": 10_000, "fail_status": 502}, r"failed 3 times in a row \(last: HTTP 502"),
    ]


def _cached_zip_problem(root: Path, zip_bytes: bytes) -> str | None:
    """A cached (part of a) zip in download staging that is not a prefix of the real zip."""
    for p in (root / "corpus" / ".staging").glob("*/work/source.zip*"):
        if p.suffix == ".json":
            continue
        data = p.read_bytes()
        if not zip_bytes.startswith(data) or (p.name == "source.zip" and data != zip_bytes):
            return f"{p.relative_to(root)} ({len(data):,} B) is not {'the' if p.name == 'source.zip' else 'a prefix of the'} real zip"
    return None


def network_faults(workdir: Path, zip_bytes: bytes, reference_corpus: dict) -> list[dict]:
    """Each network case against a fresh root; then a healthy rerun on the same root must give the corpus."""
    from mygpt.errors import UserError
    from tasks.wikitext.download import ENV_ATTEMPTS, ENV_BASE_DELAY, ENV_READ_TIMEOUT
    from tests.support.stages import corpus as download

    rows = []
    for i, case in enumerate(network_cases(zip_bytes)):
        root = Path(workdir) / f"net-{i}"
        data = case.serve if case.serve is not None else zip_bytes
        row = {"case": case.name, "expect": "corpus" if case.expect == "corpus" else "clear error"}
        with (
            FaultyMirror({"/" + ZIP_NAME: data}) as m,
            env_vars(**{ENV_BASE_DELAY: 0.01, ENV_ATTEMPTS: 3, ENV_READ_TIMEOUT: 1.0}),
        ):
            m.set_faults(**case.faults)
            t0 = time.monotonic()
            try:
                ref = download(root, source_url=m.url(), **case.kwargs)
                m_ = json.loads((Path(ref["path"]) / MANIFEST).read_text())["metrics"]["download"]
                row["outcome"] = "corpus"
                row["detail"] = f"{m_['tries']} request(s), {m_['range_requests']} with Range"
                good = stage_digests(root, "corpus") == reference_corpus
                row["handled"] = case.expect == "corpus" and good
                if not good:
                    row["detail"] += "; CORPUS DIFFERS"
            except UserError as e:
                row["outcome"] = "error"
                row["detail"] = str(e)
                row["handled"] = case.expect != "corpus" and bool(re.search(case.expect, str(e)))
                if open_store(root).versions():
                    row["handled"] = False
                    row["detail"] += "; SOMETHING WAS PUBLISHED"
            row["seconds"] = round(time.monotonic() - t0, 2)
            row["statuses"] = _statuses(m)
            bad = _cached_zip_problem(root, zip_bytes)
            if bad:
                row["handled"] = False
                row["detail"] += f"; CORRUPT CACHE: {bad}"
        if row["outcome"] == "error":  # the same root with a healthy server: must not reuse anything bad
            with Mirror({"/" + ZIP_NAME: zip_bytes}) as healthy, env_vars(**{ENV_BASE_DELAY: 0.01}):
                try:
                    download(
                        root,
                        source_url=healthy.url(),
                        **{k: v for k, v in case.kwargs.items() if k != "expected_sha256" or case.serve is None},
                    )
                    row["rerun"] = "corpus" if stage_digests(root, "corpus") == reference_corpus else "WRONG CORPUS"
                except UserError as e:
                    row["rerun"] = f"error: {e}"
            # a rerun at another URL is another version: what matters is that it is correct
            row["handled"] = row["handled"] and row["rerun"] == "corpus"
        rows.append(row)
    return rows


SECRETS = ("S3CRET", "T0KEN-abc")


def source_cases(workdir: Path, zip_bytes: bytes, reference_corpus: dict) -> list[dict]:
    """What is at source_url (issue 10, items 3 and 5), in the network table's row format: new content at the
    same URL gives a new version holding the new text; credentials in the URL download the corpus and are
    stored nowhere."""
    from tasks.core.urls import redact_url
    from tests.support.stages import corpus as download

    rows = []
    other = make_zip(
        {f"wikitext-103-raw/wiki.{s}.raw": f" = New {s} = \n new text .\n" for s in ("train", "valid", "test")}
    )
    root = Path(workdir) / "changed"
    with Mirror({"/" + ZIP_NAME: zip_bytes}) as m:
        first = download(root, source_url=m.url())
        m.add("/" + ZIP_NAME, other)
        second = download(root, source_url=m.url())
        text = (Path(second["path"]) / "wiki.train.txt").read_text()
        handled = (
            second["version"] != first["version"]
            and "new text" in text
            and stage_digests(root, "corpus", first["version"]) == reference_corpus
        )
        rows.append(
            {
                "case": "same URL, new content (the mirror swaps the zip between two runs)",
                "expect": "new version",
                "outcome": "new version" if second["version"] != first["version"] else "OLD VERSION REUSED",
                "handled": handled,
                "statuses": _statuses(m),
                "detail": f"corpus/{first['version']} then corpus/{second['version']} (the new text); the old "
                "version is kept",
            }
        )
    root = Path(workdir) / "credentials"
    with Mirror({"/" + ZIP_NAME: zip_bytes}) as m, captured_logs() as lines:
        url = f"http://alice:S3CRET@127.0.0.1:{m.port}/{ZIP_NAME}?token=T0KEN-abc"
        download(root, source_url=url)
        stored = "\n".join([*lines, *(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())])
        leaked = [secret for secret in SECRETS if secret in stored]
        good = stage_digests(root, "corpus") == reference_corpus
        rows.append(
            {
                "case": "credentials in source_url (user:password@host, ?token=)",
                "expect": "corpus",
                "outcome": "corpus" if good else "CORPUS DIFFERS",
                "handled": good and not leaked,
                "statuses": _statuses(m),
                "detail": f"shown and stored as {redact_url(url)}" + (f"; LEAKED: {leaked}" if leaked else ""),
            }
        )
    return rows


def _statuses(m: Mirror) -> str:
    return " ".join(str(r["status"]) + (f"({r['range']})" if r["range"] else "") for r in m.requests[:6]) + (
        " ..." if len(m.requests) > 6 else ""
    )


# ---- damaged artifacts ---------------------------------------------------------------------------------
class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def captured_logs():
    handler = _Capture()
    logger = logging.getLogger("wiki_pipeline")
    old = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def tiny_stage_params(url: str):
    """The tiny preset's settings (a ``flows.settings.Pipeline``), downloading from ``url`` (never the default URL)."""
    from flows.settings import TINY, Pipeline

    return Pipeline.parse(**{**TINY, "corpus": {"source_url": url}})


def build_plain(root: Path, url: str, params, *, full_check: bool = False, force: tuple = ()) -> dict:
    """The tiny pipeline as plain stage calls (no Prefect): {stage: ref}."""
    if params.corpus.source_url != url:
        raise ValueError("build_plain: params were made for another source_url")
    from tasks.corpus import download_corpus
    from tasks.export import export_model
    from tasks.model import train_model
    from tasks.samples import sample_model
    from tasks.shards import encode_shards
    from tasks.tokenizer import train_tokenizer

    run = params.run.model_copy(update={"artifacts_dir": str(root), "full_check": full_check, "force": force})
    corpus = download_corpus.fn(params.corpus, run)
    tokenizer = train_tokenizer.fn(corpus, params.tokenizer, run)
    shards = encode_shards.fn(corpus, tokenizer, params.shards, run)
    model = train_model.fn(shards, tokenizer, params.model, run)
    samples = sample_model.fn(model, params.samples, run)
    export = export_model.fn(model, params.export, run)
    return {
        "corpus": corpus,
        "tokenizer": tokenizer,
        "shards": shards,
        "model": model,
        "samples": samples,
        "export": export,
    }


def train_again(root: Path, refs: dict, params) -> dict:
    """The model stage on ``refs``' shards and tokenizer (builds, or resumes, when its version is not published)."""
    from tasks.model import train_model

    run = params.run.model_copy(update={"artifacts_dir": str(root)})
    return train_model.fn(refs["shards"], refs["tokenizer"], params.model, run)


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    i = data.index(b'"merges"') + 2  # a letter inside the JSON key: same size, still valid UTF-8
    data[i] ^= 0x20
    path.write_bytes(bytes(data))


def _truncate(path: Path, by: int = 100) -> None:
    with open(path, "r+b") as f:
        f.truncate(max(0, path.stat().st_size - by))


def _edit_manifest(path: Path) -> None:
    m = json.loads((path / MANIFEST).read_text())
    rel = sorted(m["files"])[0]
    m["files"][rel]["size"] += 1
    (path / MANIFEST).write_text(json.dumps(m, indent=2))


def damage_cases(root: Path, url: str, reference: dict) -> list[dict]:
    """Damage a published (or in-progress) artifact, rerun, check detection, the logged reason and the rebuild."""
    from tasks.core.faults import FaultInjected, reset_faults

    params = tiny_stage_params(url)
    store = open_store(root)
    build_plain(root, url, params)
    rows = []

    def case(name, stage, damage, *, reason, full_check=False, also_quick=False):
        refs = build_plain(root, url, params)
        version = refs[stage]["version"]
        target = damage(store.version_path(stage, version), refs)
        row = {"case": name, "target": target, "expect": reason}
        if also_quick:  # what the quick check says: the same-size flip passes it
            row["quick_check"] = "missed (same size)" if store.verify(stage, version)[0] else "detected"
        with captured_logs() as lines:
            refs2 = build_plain(root, url, params, full_check=full_check)
        warned = [line for line in lines if re.search(reason, line)]
        row["logged"] = warned[0] if warned else "(nothing logged)"
        ok, _why = store.verify(stage, refs2[stage]["version"], full=True)
        same = stage_digests(root, stage, refs2[stage]["version"]) == reference[stage]
        rebuilt = refs2[stage]["build_id"] != refs[stage]["build_id"]
        row["rebuilt"] = "yes" if rebuilt else "NO"
        row["detected"] = bool(warned) and ok and same and rebuilt
        rows.append(row)

    def shard(path, refs):
        p = path / "train-00001.parquet"
        _truncate(p)
        return "shards/<v>/train-00001.parquet truncated by 100 B"

    def tok_flip(path, refs):
        _flip_byte(path / "tokenizer.json")
        return "tokenizer/<v>/tokenizer.json: one byte flipped (same size)"

    def ckpt_gone(path, refs):
        (path / "model.ckpt").unlink()
        return "model/<v>/model.ckpt deleted"

    def ckpt_cut(path, refs):
        _truncate(path / "model.ckpt", 4096)
        return "model/<v>/model.ckpt truncated by 4 KiB"

    def corpus_cut(path, refs):
        _truncate(path / "wiki.train.txt", 1)
        return "corpus/<v>/wiki.train.txt truncated by 1 B"

    def manifest_edit(path, refs):
        _edit_manifest(path)
        return "shards/<v>/manifest.json: a file's size edited"

    def stray(path, refs):
        (path / "notes.txt").write_text("stray\n")
        return "samples/<v>/notes.txt added (not in the manifest)"

    case("truncated shard", "shards", shard, reason=r"damaged \(train-00001.parquet is \d+ bytes, manifest says \d+\)")
    case(
        "byte flipped in tokenizer.json",
        "tokenizer",
        tok_flip,
        full_check=True,
        also_quick=True,
        reason=r"damaged \(tokenizer.json does not match its sha256",
    )
    case("model.ckpt deleted", "model", ckpt_gone, reason=r"damaged \(model.ckpt is missing\)")
    case("model.ckpt truncated", "model", ckpt_cut, reason=r"damaged \(model.ckpt is \d+ bytes")
    case("corpus split truncated", "corpus", corpus_cut, reason=r"damaged \(wiki.train.txt is \d+ bytes")
    case(
        "manifest no longer matches its files",
        "shards",
        manifest_edit,
        reason=r"damaged \(.* is \d+ bytes, "
        r"manifest says \d+\)",
    )
    case(
        "stray file in a version",
        "samples",
        stray,
        reason=r"damaged \(unexpected file\(s\) not in the manifest: notes.txt",
    )

    # The in-progress checkpoint in train staging: unpublish the model, crash its rebuild (in-process stand-in:
    # FaultInjected) after the step-10 checkpoint, damage that checkpoint, rerun.
    def staged_ckpt(damage_fn):
        def damage(path, refs):
            store.discard("model", refs["model"]["version"], "the harness unpublished it to rebuild it")
            reset_faults()
            with env_vars(**{FAULT_ENV: "model.progress@4:raise"}), contextlib.suppress(FaultInjected):
                train_again(root, refs, params)
            reset_faults()
            ckpt = next(root.glob("model/.staging/*/work/train.ckpt"))
            return damage_fn(ckpt)

        return damage

    def cut_staged(ckpt):
        _truncate(ckpt, 2048)
        return "model/.staging/<v>/work/train.ckpt (step 10) truncated by 2 KiB"

    def del_staged(ckpt):
        ckpt.unlink()
        return "model/.staging/<v>/work/train.ckpt (step 10) deleted"

    def keep_staged(ckpt):
        return "model/.staging/<v>/work/train.ckpt (step 10) intact (control)"

    for name, fn, reason, resume in (
        (
            "resume checkpoint in train staging truncated",
            cut_staged,
            r"model: cannot resume \(.*\); starting from step 0",
            0,
        ),
        ("resume checkpoint in train staging deleted", del_staged, r"model: building model/", 0),
        ("resume checkpoint in train staging intact (control)", keep_staged, r"model: resuming from step 10", 10),
    ):
        _staged_case(rows, root, url, params, store, reference, name, staged_ckpt(fn), reason, resume)
    return rows


def _staged_case(rows, root, url, params, store, reference, name, damage, reason, resume) -> None:
    """A damaged resume checkpoint: the crashed rebuild left staging; the next run must cope."""
    refs = build_plain(root, url, params)
    target = damage(None, refs)
    with captured_logs() as lines:
        ref = train_again(root, refs, params)
    warned = [line for line in lines if re.search(reason, line)]
    resumed = store.get("model", ref["version"]).manifest["metrics"]["resumed_from"]
    ok, _ = store.verify("model", ref["version"], full=True)
    same = stage_digests(root, "model", ref["version"]) == reference["model"]
    rows.append(
        {
            "case": name,
            "target": target,
            "expect": reason,
            "logged": warned[0] if warned else "(nothing logged)",
            "rebuilt": f"trained from step {resumed}",
            "detected": bool(warned) and ok and same and resumed == resume and not list(root.glob("model/.staging/*")),
        }
    )


# ---- bad input -----------------------------------------------------------------------------------------
def bad_input_cases(tmp: Path, url: str) -> list[tuple]:
    """(wiki-pipeline run arguments, the exact error line[, environment variables]). All before Prefect starts."""
    afile = tmp / "a-file"
    afile.write_text("x")
    cores = os.cpu_count() or 1
    return [
        (
            ["--param", "num_heads=5"],
            "error: model.num_heads (5) must divide embed_dim (32); pick an embed_dim that is a multiple of num_heads (the chapter uses embed_dim 192, num_heads 6: head size 32)",
        ),
        (
            ["--param", "embed_dim=64", "--param", "num_heads=4", "--param", "num_kv_heads=3"],
            "error: model.num_kv_heads (3) must divide num_heads (4); pick a divisor of num_heads (the chapter uses num_heads 6, num_kv_heads 2)",
        ),
        (
            ["--param", "seq_len=512"],
            "error: model.seq_len (512) must be <= max_seq_len (32); the chapter uses 256 for both",
        ),
        (
            ["--param", "steps=0"],
            "error: model.steps must be an integer >= 1, got 0 (optimizer steps; the chapter trains 10000)",
        ),
        (
            ["--param", "steps=many"],
            "error: model.steps must be an integer >= 1, got 'many' (optimizer steps; the chapter trains 10000)",
        ),
        (
            ["--param", "steps=1.5"],
            "error: model.steps must be an integer >= 1, got 1.5 (optimizer steps; the chapter trains 10000)",
        ),
        (
            ["--param", "lr=0"],
            "error: model.lr must be a positive number, got 0 (AdamW peak learning rate; 1e-3 is what the chapter's printed run used (its table says 3e-4))",
        ),
        (
            ["--param", "device=tpu"],
            "error: model.device: unknown device 'tpu'; expected auto, cpu, cuda, cuda:N or mps",
        ),
        (
            ["--param", "precision=fp16"],
            "error: model.precision must be one of auto, fp32, bf16, got 'fp16' (auto = bf16 on cuda (with bf16) and mps, fp32 elsewhere; fp32; bf16 (autocast))",
        ),
        (
            ["--param", "norm=batch"],
            "error: model.norm must be one of layer, rms, got 'batch' (RMSNorm (the chapter) or LayerNorm)",
        ),
        (
            ["--param", "train_splits=most"],
            "error: model.train_splits must be one of train, all, got 'most' (train on the train split, or on all three (the chapter's wikipedia.txt run))",
        ),
        (
            ["--param", "nproc=0"],
            "error: model.nproc must be an integer >= 1 or 'auto', got 0 (training processes on this node, data parallel under torchrun (NCCL on cuda, gloo on cpu); batch_size stays the global batch; auto = one per visible GPU on cuda, else 1)",
        ),
        (
            ["--param", "nproc=x"],
            "error: model.nproc must be an integer >= 1 or 'auto', got 'x' (training processes on this node, data parallel under torchrun (NCCL on cuda, gloo on cpu); batch_size stays the global batch; auto = one per visible GPU on cuda, else 1)",
        ),
        (
            ["--param", "device=cpu", "--param", f"nproc={cores + 1}"],
            f"error: model.nproc ({cores + 1}) is more than the {cores} CPU cores here; each training process needs a core of its own: lower nproc",
        ),
        (
            ["--param", "device=cpu", "--param", "nproc=2", "--param", "batch_size=1"],
            "error: model.nproc (2) is more than batch_size (1); every process takes at least one row of the global batch: lower nproc or raise batch_size",
        ),
        (
            ["--param", "compile=yes"],
            "error: model.compile must be true or false, got 'yes' (torch.compile the model (a warning and eager training where it is unavailable))",
        ),
        (
            ["--param", "num_merges=-1"],
            "error: tokenizer.num_merges must be an integer >= 0, got -1 (BPE merges to learn; the chapter uses 1024)",
        ),
        (
            ["--param", "shard_tokens=0"],
            "error: shards.shard_tokens must be an integer >= 1, got 0 (tokens per Parquet shard (10000000 is ~20 MB of uint16, ~20 shards for wikitext-103 at 1024 merges))",
        ),
        (
            ["--param", "unk_policy=ignore"],
            "error: shards.unk_policy must be one of skip, error, got 'ignore' (characters outside the tokenizer's alphabet: skip them (the chapter) or stop with an error naming them)",
        ),
        (
            ["--param", "workers=0"],
            "error: run.workers must be an integer >= 1 and <= 256 (or null), got 0 (worker processes of the local Dask cluster the tokenizer and shards stages start; null = CPU count (at most 8); not used with dask_address)",
        ),
        (
            ["--param", "max_new_tokens=0"],
            "error: samples.max_new_tokens must be an integer >= 1, got 0 (tokens to generate after each prompt; the chapter uses 200)",
        ),
        (
            ["--param", "temperature=-0.5"],
            "error: samples.temperature must be 0 (greedy) or from 0.001 to 100, got -0.5 (the chapter uses 1.0)",
        ),
        (
            ["--param", "temperature=1e-300"],
            "error: samples.temperature must be 0 (greedy) or from 0.001 to 100, got 1e-300 (the chapter uses 1.0)",
        ),
        (
            ["--param", f"seed={2**64}"],
            "error: model.seed must be an integer >= 0 and <= 9223372036854775807, got 18446744073709551616 (initial weights and batch order)",
        ),
        (
            ["--param", "top_k=-1"],
            "error: samples.top_k must be an integer >= 0, got -1 (sample from the k most likely tokens; 0 = all; the chapter uses 40)",
        ),
        (
            ["--param", "prompt=  "],
            "error: samples.prompt '  ' is empty; give some text to continue (the chapter uses 'The history of')",
        ),
        (["--param", "prompt=[]"], "error: samples.prompt must be a string or a non-empty list of strings, got []"),
        (
            ["--param", "threads=-2"],
            "error: run.threads must be an integer >= 0 and <= 1024 (or null), got -2 (torch CPU threads for training and sampling; null or 0 = torch's default)",
        ),
        (
            ["--param", f"threads={10**6}"],
            "error: run.threads must be an integer >= 0 and <= 1024 (or null), got 1000000 (torch CPU threads for training and sampling; null or 0 = torch's default)",
        ),
        (
            ["--param", "full_check=yes"],
            "error: run.full_check must be true or false, got 'yes' (verify every reused file's sha256, not only its size)",
        ),
        (
            ["--force", "tokenise"],
            f"error: run.force names no stage: 'tokenise'; the stages are {', '.join(NAMES)}",
        ),
        (
            ["--only", "evaluation"],
            f"error: run.only names no stage: 'evaluation'; the stages are {', '.join(NAMES)}",
        ),
        (["--param", "num_layer=2"], None),
        (["--param", "steps"], "error: --param 'steps' is not KEY=VALUE (e.g. --param steps=100)"),
        (["--params", "[1]"], "error: --params must be a JSON object, got '[1]'"),
        (["--params", "{steps: 1}"], None),
        (
            ["--source-url", "ftp://example.org/w.zip"],
            "error: corpus.source_url 'ftp://example.org/w.zip' has scheme 'ftp'; use an http://, https:// or file:// URL (for a local zip: file:///absolute/path/to/wikitext-103-raw-v1.zip)",
        ),
        (
            ["--source-url", "https:///w.zip"],
            "error: corpus.source_url 'https:///w.zip' has no host; write it as https://host/path",
        ),
        (
            ["--source-url", "file://server/w.zip"],
            "error: corpus.source_url 'file://server/w.zip': a file:// URL cannot name a host ('server'); use file:///absolute/path",
        ),
        (
            ["--param", "expected_sha256=abc"],
            "error: corpus.expected_sha256 must be 64 hexadecimal digits (the output of sha256sum), got 'abc'",
        ),
        (
            ["--param", "expected_bytes=-1"],
            "error: corpus.expected_bytes must be a whole number of bytes >= 0 (0 = don't check the size), got -1",
        ),
        (
            ["--artifacts-dir", str(afile)],
            f"error: run.artifacts_dir {afile} is a file, not a directory; give a directory for the artifacts",
        ),
        (["--mirror", "--source-url", url], "error: --mirror and source_url both choose the source; give one of them"),
        # round 3 (issue 21): numbers that used to pass the check
        (
            ["--param", "lr=Infinity"],
            "error: model.lr must be a positive finite number, got inf (AdamW peak learning rate; 1e-3 is what the chapter's printed run used (its table says 3e-4))",
        ),
        (
            ["--param", "temperature=NaN"],
            "error: samples.temperature must be a finite number, got nan (sampling temperature; 0 = greedy; the chapter uses 1.0)",
        ),
        (
            ["--param", "max_grad_norm=-Infinity"],
            "error: model.max_grad_norm must be a finite number >= 0, got -inf (gradient clipping norm; 0 = no clipping)",
        ),
        (["--param", "max_seq_len=1000000000000"], None),  # "... needs at least N GiB, more than the M GiB here"
        (["--param", "batch_size=1000000000000"], None),  # (N and M depend on this machine's memory)
        (
            ["--param", f"workers={cores + 1}"],
            f"error: run.workers ({cores + 1}) is more than the {cores} CPU cores here; each Dask worker is a process doing CPU-bound chunk work, so more workers than cores only costs memory: lower workers (or null = the CPU count, at most 8)",
        ),
        (
            ["--param", "chunk_bytes=1"],
            "error: run.chunk_bytes must be an integer >= 1000 and <= 1073741824 (or null), got 1 (bytes of text per tokenizer/encode chunk; null = 8 MiB (speed and memory only: the outputs are the same))",
        ),
        (
            ["--artifacts-dir", str(afile / "sub")],
            f"error: run.artifacts_dir {afile / 'sub'} is inside {afile}, a file, not a directory; give a directory for the artifacts",
        ),
        (
            ["--param", "dask_address=http://127.0.0.1:8786"],
            "error: run.dask_address must be a Dask scheduler address, tcp://host:port or tls://host:port (port 1..65535; the scheduler's port, 8786 by default, not its dashboard's), got 'http://127.0.0.1:8786'",
        ),
        (
            [],
            "error: WIKI_PIPELINE_READ_TIMEOUT must be at most 86400 seconds (a day), got '1e300' (seconds without data before a try fails; default 60); fix or unset it",
            {"WIKI_PIPELINE_READ_TIMEOUT": "1e300"},
        ),
        (
            [],
            "error: WIKI_PIPELINE_DOWNLOAD_ATTEMPTS must be a whole number >= 1, got 'nan' (failed tries in a row before the download gives up; default 6); fix or unset it",
            {"WIKI_PIPELINE_DOWNLOAD_ATTEMPTS": "nan"},
        ),
        (
            [],
            "error: WIKI_PIPELINE_RETRY_BASE_DELAY must be a number of seconds >= 0, got '-1' (wait before the first retry, doubled each time, at most 60 s; default 2); fix or unset it",
            {"WIKI_PIPELINE_RETRY_BASE_DELAY": "-1"},
        ),
        (
            [],
            "error: WIKI_PIPELINE_READ_TIMEOUT must be a number of seconds > 0, got '0' (seconds without data before a try fails; default 60); fix or unset it",
            {"WIKI_PIPELINE_READ_TIMEOUT": "0"},
        ),
    ]


#: Cases that get past validation and fail inside the flow (need a Prefect server): (args, exact line).
def flow_bad_input_cases(tmp: Path, url: str) -> list[tuple[list[str], str]]:
    missing = tmp / "absent.zip"
    notzip = tmp / "not-a.zip"
    notzip.write_bytes(b"<html>not a zip</html>")
    bad_utf8 = tmp / "latin1.zip"
    bad_utf8.write_bytes(
        make_zip(
            {
                f"wikitext-103-raw/wiki.{s}.raw": (" caf\xe9 \n".encode("latin-1") if s == "train" else b" ok .\n")
                for s in ("train", "valid", "test")
            }
        )
    )
    encrypted, deflate64, bomb = tmp / "encrypted.zip", tmp / "deflate64.zip", tmp / "bomb.zip"
    encrypted.write_bytes(zips.encrypted_zip())
    deflate64.write_bytes(zips.deflate64_zip())
    bomb.write_bytes(zips.bomb_zip(30))
    with zipfile.ZipFile(bomb) as z:
        packed, declared = (sum(getattr(i, f) for i in z.infolist()) for f in ("compress_size", "file_size"))
    return [
        (
            ["--source-url", missing.as_uri()],
            f"error: source_url {missing.as_uri()!r}: there is no file {missing}; check the path",
        ),
        (
            ["--source-url", notzip.as_uri()],
            f"error: {notzip.as_uri()} is not a zip archive; source_url must point at wikitext-103-raw-v1.zip (or a copy of it)",
        ),
        (
            ["--source-url", bad_utf8.as_uri()],
            f"error: wikitext-103-raw/wiki.train.raw in {bad_utf8.as_uri()} is not valid UTF-8: byte 0xe9 at offset 4 (invalid continuation byte); the archive is not the wikitext-103-raw-v1 zip or is damaged: check source_url and expected_sha256",
        ),
        (
            ["--source-url", url, "--param", "prompt=🦜🦜🦜"],
            "error: prompt '🦜🦜🦜' is made only of characters the tokenizer cannot encode ('🦜' (U+1F99C)), so there is nothing to continue; use text in the corpus's alphabet",
        ),
        (
            ["--source-url", encrypted.as_uri()],
            f"error: wikitext-103-raw/wiki.train.raw in {encrypted.as_uri()} is encrypted; the wikitext-103-raw-v1 zip is not: check source_url, or give an unencrypted copy",
        ),
        (
            ["--source-url", deflate64.as_uri()],
            f"error: wikitext-103-raw/wiki.train.raw in {deflate64.as_uri()} is compressed with method 9 (deflate64), which Python's zipfile cannot read (it reads stored, deflate, bzip2, lzma); recompress it, e.g. with `zip -Z deflate`, or check source_url",
        ),
        (
            ["--source-url", bomb.as_uri()],
            f"error: {bomb.as_uri()} would unzip {human_bytes(packed)} into {human_bytes(declared)} ({declared / packed:,.0f}x; text compresses 3-4x, this stage accepts at most 20x): it looks like a zip bomb, not wikitext; nothing was extracted: check source_url",
        ),
    ]


def bad_inputs(tmp: Path, url: str, *, with_flow: bool = True) -> list[dict]:
    """Run ``wiki-pipeline run --tiny`` (in this process, ``flows.cli.main``) with each bad input."""
    from flows.cli import main

    tmp = Path(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    cases = bad_input_cases(tmp, url) + (flow_bad_input_cases(tmp, url) if with_flow else [])
    rows = []
    for i, (args, want, *environment) in enumerate(cases):
        environment = environment[0] if environment else {}
        root = tmp / f"bad-{i}"
        argv = ["run", "--tiny", *args]
        if "--artifacts-dir" not in args:
            argv += ["--artifacts-dir", str(root)]
        if not any(a in ("--source-url", "--mirror") for a in args):
            argv += ["--source-url", url]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), env_vars(**environment):
            code = main(argv)
        lines = [line for line in err.getvalue().splitlines() if line.startswith("error: ")]
        got = lines[-1] if lines else err.getvalue().strip()[-300:]
        store = open_store(root)
        later = [v.stage for v in store.versions() if v.stage not in ("corpus", "tokenizer")]
        # the prompt check runs after download and bpe by design: nothing after them may be published
        nothing = not later if "prompt=🦜🦜🦜" in args else not store.versions()
        shown = [f"{k}={v}" for k, v in environment.items()] + args
        rows.append(
            {
                "input": " ".join(shown),
                "code": code,
                "message": got,
                "exact": want is None or got == want,
                "nothing_published": nothing,
                "traceback": "Traceback" in err.getvalue(),
                "ok": code == 2 and (want is None or got == want) and nothing and "Traceback" not in err.getvalue(),
            }
        )
    return rows


# ---- the scorecard ----------------------------------------------------------------------------------------
def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def scorecard(results: dict) -> str:
    kills: list[Kill] = results["kills"]
    lines = [
        "# Reliability scorecard",
        "",
        f"Generated by `{results['command']}` on {results['when']} ({results['machine']}); "
        f"{results['seconds']:.0f} s in all.",
        "",
        "The harness and what each check means: `tests/reliability/harness.py` (module docstring). The fast "
        "subset (one kill per stage, every network fault, every damage case, every bad input) runs in CI as "
        "`tests/reliability/test_reliability.py`.",
        "",
    ]
    lines += [
        "## Kills (SIGKILL inside each stage, then rerun)",
        "",
        "Each kill is a real `python -m flows.cli run --tiny` process SIGKILLing itself at a seeded random "
        "point that the reference run reached (`WIKI_PIPELINE_FAULT=<point>@<n>`, `tasks/core/stage.py` "
        "`fault_point`). Recovered = the rerun completed, every published version verifies with sha256, "
        "its data files equal the uninterrupted run's (timing fields aside; see `file_digest`), training "
        "resumed from the checkpoint the kill left, no staging dir is left for a published version, and "
        "the watcher never saw a version directory that did not verify.",
        "",
        "| stage | kills | killed | recovered | resumed how (examples) |",
        "|---|---:|---:|---:|---|",
    ]
    for task in NAMES:
        ks = [k for k in kills if k.task == task]
        hows = sorted({k.resumed for k in ks if k.resumed})
        lines.append(
            f"| {task} | {len(ks)} | {sum(k.killed for k in ks)} | {sum(k.recovered for k in ks)} | "
            f"{_md('; '.join(hows[:4]))} |"
        )
    w = results["watcher"]
    lines += [
        "",
        f"Watcher: {w['checks']:,} version-directory checks while {w['runs']} pipeline runs were live, "
        f"{len(w['violations'])} violation(s).",
        "",
        "<details><summary>every kill</summary>",
        "",
        "| # | stage | fault | left in staging | rerun | recovered | problems |",
        "|---:|---|---|---|---|---|---|",
    ]
    for i, k in enumerate(kills, 1):
        lines.append(
            f"| {i} | {k.task} | `{k.fault}` | {_md(k.left)} | {_md(k.resumed)} | "
            f"{'yes' if k.recovered else 'NO'} | {_md('; '.join(k.problems)[:300])} |"
        )
    lines += ["", "</details>", ""]
    c = results["concurrent"]
    lines += [
        "## Two runs at once on one artifact root",
        "",
        "| | |",
        "|---|---|",
        f"| exit codes | {c['rcs'][0]}, {c['rcs'][1]} |",
        f"| builds per stage (both logs) | {', '.join(f'{k} {v}' for k, v in c['built'].items())} |",
        f'| "another run is building this version; waiting" lines | {c["waited"]} |',
        f"| identical refs printed by both | {c['refs_equal']} |",
        f"| one version per stage, all verify (sha256) | {all(len(v) == 1 for v in c['versions'].values()) and c['verify_full']} |",
        f"| data equal to the uninterrupted run | {c.get('same_as_reference')} |",
        f"| watcher violations | {len(c['violations'])} ({c['checks']:,} checks) |",
        "",
    ]
    lines += [
        "## Network faults (loopback mirror misbehaving on purpose)",
        "",
        "Each case starts from an empty root; an error case is then rerun on the same root against a healthy "
        "mirror, which must give the correct corpus (nothing bad was cached). After every case the cached "
        "`work/source.zip[.part]` is checked to be a prefix of the real zip. Every run first asks the server "
        "what the file is (a one-byte Range request: its size and ETag are part of the corpus version), so a "
        "fault meant for the download proper is set for two responses. The last rows change what is at the "
        "URL: new content must give a new version, credentials must download and be stored nowhere.",
        "",
        "| fault | expected | outcome | requests | handled | detail |",
        "|---|---|---|---|---|---|",
    ]
    for r in results["network"]:
        lines.append(
            f"| {_md(r['case'])} | {r['expect']} | {r['outcome']}"
            f"{' → rerun: ' + r['rerun'] if 'rerun' in r else ''} | {_md(r['statuses'])} | "
            f"{'yes' if r['handled'] else 'NO'} | {_md(r['detail'][:220])} |"
        )
    lines += [
        "",
        "## Damaged artifacts",
        "",
        "Damage, then rerun the stages (plain stage calls, the same `tasks/core/stage.py` path as the flow). "
        "Detected = the reason was logged, the version rebuilt, it verifies with sha256 and its data equal "
        "the uninterrupted run's.",
        "",
        "| damage | logged | rebuilt | detected |",
        "|---|---|---|---|",
    ]
    for r in results["damage"]:
        extra = f" (quick check: {r['quick_check']}; found with `full_check`)" if "quick_check" in r else ""
        lines.append(
            f"| {_md(r['target'])}{extra} | `{_md(r['logged'][:200])}` | {r['rebuilt']} | "
            f"{'yes' if r['detected'] else 'NO'} |"
        )
    lines += [
        "",
        "## Bad input",
        "",
        "`wiki-pipeline run --tiny --artifacts-dir <empty root> <input>` (a `NAME=value` input is an "
        "environment variable set for that run): exit code 2, this exact line on "
        "stderr (no traceback), and nothing published (for the prompt case, which is checked right after the "
        "tokenizer stage by design: nothing after the tokenizer).",
        "",
        "| input | exit | message | nothing published |",
        "|---|---:|---|---|",
    ]
    for r in results["bad_inputs"]:
        lines.append(
            f"| `{_md(r['input'])}` | {r['code']} | `{_md(r['message'])}` | "
            f"{'yes' if r['nothing_published'] else 'NO'} |"
        )
    lines += [
        "",
        "## Totals",
        "",
        f"- kills: {sum(k.killed for k in kills)} injected, {sum(k.recovered for k in kills)} recovered",
        f"- network faults: {len(results['network'])} tried, {sum(r['handled'] for r in results['network'])} handled",
        f"- damaged artifacts: {len(results['damage'])} tried, {sum(r['detected'] for r in results['damage'])} detected and rebuilt",
        f"- bad inputs: {len(results['bad_inputs'])} tried, {sum(r['ok'] for r in results['bad_inputs'])} rejected as specified",
        "",
        f"Reproduce: `{results['command']}`",
        "",
    ]
    return "\n".join(lines)


def run_all(
    workdir: Path,
    *,
    seed: int,
    kills_per_stage: int,
    fast: bool = False,
    api_env: dict | None = None,
    command: str = "",
) -> dict:
    t0 = time.monotonic()
    workdir = Path(workdir)
    results: dict = {
        "command": command,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} CPU cores",
    }
    with environment(workdir, api_env) as env:
        trace = workdir / "reference.trace"
        ref_root = workdir / "reference"
        res = run_pipeline(env, ref_root, trace=trace, log_path=workdir / "reference.log")
        if res.rc != 0:
            raise RuntimeError(f"the reference run failed:\n{res.log[-3000:]}")
        reference = all_digests(ref_root)
        violations = list(res.violations)
        stats = {"checks": res.checks, "runs": 1}
        rounds = [FAST_FAULTS] if fast else pick_faults(read_trace(trace), random.Random(seed), kills_per_stage)
        kills: list[Kill] = []
        for r, faults in enumerate(rounds):
            kills += kill_chain(env, workdir / f"kills-{r}", faults, reference, tag=f"-{r}", stats=stats)
        violations += [p for k in kills for p in k.problems if p.startswith("watcher")]
        results["kills"] = kills
        conc = concurrent_runs(env, workdir / "concurrent")
        conc["same_as_reference"] = all_digests(workdir / "concurrent") == reference
        results["concurrent"] = conc
        results["watcher"] = {
            "checks": stats["checks"] + conc["checks"],
            "runs": stats["runs"] + 2,
            "violations": violations + conc["violations"],
        }
        results["network"] = network_faults(workdir / "net", env.zip_bytes, reference["corpus"]) + source_cases(
            workdir / "source", env.zip_bytes, reference["corpus"]
        )
        zpath = workdir / "file-zip" / ZIP_NAME
        zpath.parent.mkdir(parents=True, exist_ok=True)
        zpath.write_bytes(env.zip_bytes)
        results["damage"] = damage_cases(workdir / "damage", zpath.as_uri(), reference)
        results["bad_inputs"] = bad_inputs(workdir / "bad", env.url)
    results["seconds"] = time.monotonic() - t0
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.reliability.harness", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kills-per-stage", type=int, default=5)
    ap.add_argument("--write", metavar="PATH", help="write the scorecard (markdown) here")
    ap.add_argument("--workdir", help="keep roots and logs here (default: a temp dir, deleted)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    command = (
        f".venv/bin/python -m tests.reliability.harness --seed {args.seed} --kills-per-stage {args.kills_per_stage}"
        + (f" --write {args.write}" if args.write else "")
    )
    with contextlib.ExitStack() as stack:
        workdir = (
            Path(args.workdir)
            if args.workdir
            else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="reliability-")))
        )
        results = run_all(workdir, seed=args.seed, kills_per_stage=args.kills_per_stage, command=command)
    text = scorecard(results)
    if args.write:
        Path(args.write).write_text(text, encoding="utf-8")
        print(f"wrote {args.write}")
    else:
        print(text)
    bad = (
        sum(not k.recovered for k in results["kills"])
        + sum(not r["handled"] for r in results["network"])
        + sum(not r["detected"] for r in results["damage"])
        + sum(not r["ok"] for r in results["bad_inputs"])
        + len(results["watcher"]["violations"])
    )
    print(f"{len(results['kills'])} kills, {bad} failure(s); {results['seconds']:.0f} s", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
