"""Reliability harness: crash the tiny pipeline anywhere, break the network, damage artifacts, feed bad input.

    .venv/bin/python -m tests.reliability.harness --seed 1 --kills-per-stage 5 --write docs/RELIABILITY.md

What each part checks: docs/RELIABILITY_HARNESS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from flows.mirror import ZIP_NAME
from tests.reliability.bad_inputs import bad_inputs
from tests.reliability.damage import damage_cases
from tests.reliability.digests import all_digests
from tests.reliability.environment import environment, run_pipeline
from tests.reliability.full_disk import full_disk
from tests.reliability.kills import Kill, kill_chain, pick_faults, read_trace
from tests.reliability.network import network_faults, source_cases
from tests.reliability.scorecard import scorecard
from tests.reliability.two_runs import concurrent_runs


def run_all(
    workdir: Path,
    *,
    seed: int,
    kills_per_stage: int,
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
        rounds = pick_faults(read_trace(trace), random.Random(seed), kills_per_stage)
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
        results["full_disk"] = full_disk(env, workdir / "full-disk", reference)
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
        + (results["full_disk"]["ok"] is False)
        + len(results["watcher"]["violations"])
    )
    print(f"{len(results['kills'])} kills, {bad} failure(s); {results['seconds']:.0f} s", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
