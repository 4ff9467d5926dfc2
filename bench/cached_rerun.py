"""Wall time of a fully cached rerun of corpus → tokenizer → shards (a Prefect flow against a loopback mirror).

    .venv/bin/python -m bench.cached_rerun [--with-shakespeare] [--num-merges 256]
    .venv/bin/python -m bench.cached_rerun --deployment 3    # the served deployment: trigger -> Completed

Serves a wikitext-103-style zip (``flows.mirror``) on 127.0.0.1, runs a flow that chains the three stage
tasks three times into a fresh artifact root: the first run builds, the second must be all ``Cached``
(that is the figure of interest), the third is a cached run with ``full_check=True`` (every published
file's sha256 recomputed). Uses the Prefect server at ``PREFECT_API_URL`` when set, else starts a
temporary one on 127.0.0.1 (``flows.server``). Results: ``bench/out/cached_rerun.json``.

``--deployment N`` times what a user of the served deployment sees instead (``deployment_reruns``): each
``prefect deployment run --watch``, from its start (the trigger) to the run Completed on the server (the
target: within :data:`TARGET_S`) and to the command's exit, split into :data:`PARTS` from the run's state
history and the command's output lines, with the median and slowest of the cached reruns; results in
``bench/out/cached_rerun_deployment.json`` (each run's output lines, timed, included), the runner's log in
``bench/out/cached_rerun_runner.log``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from flows.mirror import REPO

OUT = REPO / "bench" / "out"


def _drain_prefect_workers() -> None:
    try:
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker

        APILogWorker.drain_all(timeout=10)
        EventsWorker.drain_all(timeout=10)
    except Exception as exc:  # pragma: no cover - best effort
        print(f"(could not drain Prefect workers: {exc})")


#: The parts of a triggered run's wall time, in order (``breakdown``). Ours: what the runner and the flow's process
#: spend (``created_to_completed_s``); the rest is the ``prefect`` command's own.
PARTS = (
    "cli_start_to_created",  # the prefect command starts (imports) and asks the server to create the run
    "created_to_pending",  # the runner's next poll (every second) picks it up
    "pending_to_running",  # the flow's process starts: spawn, imports (prefect, the flow), the engine
    "running_to_completed",  # the flow: settings, every stage Cached (evaluate included), the reports
    "completed_to_seen",  # the Completed event reaches the command's --watch
    "seen_to_verdict",  # --watch waits for straggler logs (3 s in Prefect 3.8) and reads the run back
    "verdict_to_exit",  # the command prints its verdict and exits
)


#: The target: an all-Cached run Completed within this many seconds of its trigger (the moment the user's
#: `prefect deployment run` command starts) on 2 cores.
TARGET_S = 5.0

#: The figures of each run: the trigger (the command's start) -> the run Completed on the server; the run's
#: creation on the server -> Completed (what the UI's Run button waits); the command's wall time, start -> exit
#: (``--watch`` included: it waits 3 s for straggler logs after Completed, and exits).
FIGURES = ("trigger_to_completed_s", "created_to_completed_s", "command_wall_s")


def breakdown(t0: float, created, history, lines: list[tuple[float, str]], t_end: float) -> dict[str, float]:
    """Where one triggered run's wall time went (:data:`PARTS`, seconds; the server and this process share a
    clock): the run's state history on the server, and each line the command printed, timed as it came."""
    when = {}
    for state in history:  # the first time the run entered each state
        if state.timestamp and state.type.value not in when:
            when[state.type.value] = state.timestamp.timestamp()
    seen = next((t for t, line in lines if "prefect.flow-run.Completed" in line), None)
    verdict = next((t for t, line in lines if "Flow run finished" in line), None)
    marks = [created.timestamp(), when.get("PENDING"), when.get("RUNNING"), when.get("COMPLETED"), seen, verdict, t_end]
    out, last = {}, t0
    for name, t in zip(PARTS, marks, strict=True):
        if t is None:
            continue
        out[name] = round(t - last, 2)
        last = t
    return out


def summary(runs: list[dict]) -> dict:
    """Over the cached reruns: the median and the slowest of each figure (``FIGURES``), and the median of each
    part of the wall time; ``target_met``: every cached rerun Completed within :data:`TARGET_S` of its trigger."""
    import statistics

    from tasks.registry import NAMES

    cached = [r for r in runs if "cached" in r["run"]]
    if not cached:
        return {}
    figures = {
        k: {"median": round(statistics.median(r[k] for r in cached), 2), "max": round(max(r[k] for r in cached), 2)}
        for k in FIGURES
    }
    parts = {p: round(statistics.median(r["breakdown_s"].get(p, 0.0) for r in cached), 2) for p in PARTS}
    met = all(r["trigger_to_completed_s"] <= TARGET_S for r in cached)
    every = all(r["task_states"] == dict.fromkeys(NAMES, "Cached") for r in cached)  # every stage ran, all Cached
    return {
        "cached_reruns": len(cached),
        **figures,
        "target_s": TARGET_S,
        "target_met": met and every,
        "every_stage_cached": every,
        "breakdown_s": parts,
    }


def deployment_reruns(reruns: int, watch_interval: int | None = None) -> dict:
    """The user's view of a cached rerun: `wiki-pipeline serve --tiny` against a loopback mirror,
    one `prefect deployment run wiki-pipeline/wiki-pipeline --watch` that builds, then ``reruns`` more that must be
    all Cached, each timed (:data:`FIGURES`) from the trigger to the run Completed on the server (target: within
    :data:`TARGET_S` on 2 cores) and to `--watch` returning, with where the time went (:data:`PARTS`)."""
    import re
    import subprocess
    import uuid

    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.mirror import Mirror, build_wikitext_zip

    prefect = str(Path(sys.executable).with_name("prefect"))
    root = Path(tempfile.mkdtemp(prefix="cached-rerun-deploy-"))
    env = {**os.environ, "DO_NOT_TRACK": "1"}
    runs = []
    mirror_ = Mirror({"/wikitext-103-raw-v1.zip": build_wikitext_zip()})
    with mirror_ as mirror, open(root / "runner.log", "w") as log:
        serve = ["serve", "--tiny", "--source-url", mirror.url(), "--artifacts-dir", str(root / "art")]
        runner = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", *serve], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            while "is being served" not in (root / "runner.log").read_text():
                if runner.poll() is not None:
                    raise RuntimeError((root / "runner.log").read_text()[-3000:])
                time.sleep(0.2)
            for i in range(reruns + 1):
                t0 = time.time()
                with tempfile.TemporaryFile("w+") as err:
                    cli = subprocess.Popen(
                        [prefect, "deployment", "run", "wiki-pipeline/wiki-pipeline", "--watch"]
                        + (["--watch-interval", str(watch_interval)] if watch_interval else []),
                        env={**env, "PYTHONUNBUFFERED": "1", "COLUMNS": "400"},
                        stdout=subprocess.PIPE,
                        stderr=err,
                        text=True,
                    )
                    assert cli.stdout is not None
                    lines = [(time.time(), line) for line in cli.stdout]  # each line when the CLI printed it
                    cli.wait()
                    err.seek(0)
                    stderr = err.read()
                t_end = time.time()
                wall = t_end - t0
                stdout = "".join(line for _, line in lines)
                found = re.search(r"UUID: ([0-9a-f-]{36})", stdout)
                if not found or cli.returncode:
                    raise RuntimeError(f"prefect deployment run failed:\n{stdout}\n{stderr}")
                with get_client(sync_client=True) as client:
                    fr = client.read_flow_run(uuid.UUID(found.group(1)))
                    tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[fr.id])))
                    history = client.read_flow_run_states(fr.id)
                states = {t.name: str(t.state.name) for t in sorted(tasks, key=lambda t: t.name) if t.state}
                assert fr.start_time and fr.end_time, fr
                run = {
                    "run": "first (builds)" if i == 0 else f"rerun {i} (cached)",
                    "trigger_to_completed_s": round(fr.end_time.timestamp() - t0, 2),
                    "command_wall_s": round(wall, 2),
                    "trigger_to_flow_start_s": round((fr.start_time - fr.created).total_seconds(), 2),
                    "flow_start_to_end_s": round((fr.end_time - fr.start_time).total_seconds(), 2),
                    "created_to_completed_s": round((fr.end_time - fr.created).total_seconds(), 2),
                    "breakdown_s": breakdown(t0, fr.created, history, lines, t_end),
                    "state": fr.state.name if fr.state else None,
                    "task_states": states,
                }
                runs.append({**run, "cli_output": [[round(t - t0, 2), line.rstrip()] for t, line in lines]})
                print(json.dumps(run), flush=True)
        finally:
            runner.terminate()
            runner.wait(30)
    OUT.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(root / "runner.log", OUT / "cached_rerun_runner.log")  # the runner's own timeline
    shutil.rmtree(root, ignore_errors=True)
    result = {"summary": summary(runs), "deployment_runs": runs, "watch_interval": watch_interval}
    print("the cached reruns (median, slowest):", json.dumps(result["summary"]), flush=True)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--deployment",
        type=int,
        metavar="N",
        default=0,
        help="instead: time N all-Cached `prefect deployment run --watch` reruns of the served tiny deployment",
    )
    ap.add_argument("--watch-interval", type=int, help="with --deployment: `--watch-interval` of the runs")
    ap.add_argument("--with-shakespeare", action="store_true")
    ap.add_argument("--num-merges", type=int, default=256)
    ap.add_argument("--bpe-train-bytes", type=int, default=1_000_000)
    ap.add_argument("--shard-tokens", type=int, default=100_000)
    args = ap.parse_args(argv)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

    server = None
    if not os.environ.get("PREFECT_API_URL"):
        from flows.server import PrefectServer

        home = Path(tempfile.mkdtemp(prefix="cached-rerun-prefect-"))
        t0 = time.time()
        server = PrefectServer(home).start()
        print(f"started a Prefect server at {server.api_url} in {time.time() - t0:.1f}s", flush=True)
        os.environ["PREFECT_API_URL"] = server.api_url
        os.environ["PREFECT_HOME"] = str(home)
    try:
        if args.deployment:
            results = deployment_reruns(args.deployment, args.watch_interval)
            OUT.mkdir(parents=True, exist_ok=True)
            (OUT / "cached_rerun_deployment.json").write_text(json.dumps(results, indent=2) + "\n")
            return 0
        from prefect import flow

        from flows.mirror import Mirror, build_wikitext_zip
        from tasks.core.settings import RunOptions
        from tasks.corpus import CorpusSettings, download_corpus
        from tasks.shards import ShardsSettings, encode_shards
        from tasks.tokenizer import TokenizerSettings, train_tokenizer

        @flow(name="data-stages-bench")
        def data_stages(root: str, url: str, full_check: bool = False):
            run = RunOptions(artifacts_dir=root, full_check=full_check)
            corpus = download_corpus(CorpusSettings(source_url=url), run, return_state=True).result()
            tok = train_tokenizer(
                corpus,
                TokenizerSettings(num_merges=args.num_merges, bpe_train_bytes=args.bpe_train_bytes),
                run,
                return_state=True,
            ).result()
            shards = encode_shards(
                corpus, tok, ShardsSettings(shard_tokens=args.shard_tokens), run, return_state=True
            ).result()
            return {"corpus": corpus, "tokenizer": tok, "shards": shards}

        def task_run_states(flow_run_id) -> dict[str, str]:
            from prefect import get_client
            from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

            with get_client(sync_client=True) as client:
                runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            return {r.name: r.state.name for r in runs}

        data = build_wikitext_zip(with_shakespeare=args.with_shakespeare)
        root = Path(tempfile.mkdtemp(prefix="cached-rerun-art-"))
        results = {"zip_bytes": len(data), "params": vars(args), "runs": []}
        with Mirror({"/wikitext-103-raw-v1.zip": data}) as mirror:
            for label, full in (
                ("first (builds)", False),
                ("second (cached)", False),
                ("third (cached, full_check)", True),
            ):
                t0 = time.time()
                state = data_stages(str(root), mirror.url(), full_check=full, return_state=True)
                wall = time.time() - t0
                state.result()
                states = task_run_states(state.state_details.flow_run_id)
                run = {"run": label, "wall_s": round(wall, 3), "states": states, "http_requests": len(mirror.requests)}
                results["runs"].append(run)
                print(json.dumps(run), flush=True)
        text_bytes = sum(p.stat().st_size for p in root.glob("corpus/*/wiki.*.txt"))
        results["wikipedia_txt_bytes"] = text_bytes
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "cached_rerun.json").write_text(json.dumps(results, indent=2) + "\n")
        shutil.rmtree(root, ignore_errors=True)
    finally:
        if server is not None:
            _drain_prefect_workers()  # send queued logs/events while the server still answers
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
