"""SIGKILL a pipeline run at a named fault point inside a stage, rerun, and check how the rerun recovered."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from tasks.registry import NAMES, open_store
from tasks.store import MANIFEST
from tests.reliability.digests import stage_digests
from tests.reliability.environment import Env, RunResult, run_pipeline


def read_trace(path: Path) -> dict[str, list[tuple[str, int]]]:
    """{stage: [(point, n), ...]} from a ``WIKI_PIPELINE_FAULT_TRACE`` file."""
    points: dict[str, list[tuple[str, int]]] = {stage: [] for stage in NAMES}
    for line in path.read_text().splitlines():
        name, n = line.split()
        points[name.split(".")[0]].append((name, int(n)))
    return points


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
    """Problems with the first ``upto`` stages: not verifying, differing from the reference, staging left."""
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
    """One run per ``(task, "<point>@<n>")``, each also the rerun that recovers the previous kill, then a clean run."""
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
