"""The data side at full scale: a 545 MB wikitext-103-shaped zip on loopback -> the first training step, per stage.

    .venv/bin/python -m bench.full_scale                       # build corpus + zip once, run, print the table
    flock /tmp/wiki-bench.lock .venv/bin/python -m bench.full_scale --compare bench/out/full_scale-before.json

What it does (repeatable):

1. the corpus: ``bench/make_corpus.py --bytes 545000000`` (``bench/out/wiki545m.txt``, generated once, seed 0);
2. a zip shaped like ``wikitext-103-raw-v1.zip``: the last ~2.4 MB of the text, cut at article boundaries (the
   blank line before a `` = Title = `` line), become ``wiki.test.raw`` (~1.3 MB) and ``wiki.valid.raw``
   (~1.1 MB), the rest ``wiki.train.raw``; deflate at zlib's default level, as the original
   (``bench/out/wikitext-103-545m.zip``, built once);
3. serves it with ``python -m flows.mirror --serve --zip`` (a child process on 127.0.0.1) and starts a Prefect
   server (``flows.server``; or uses ``PREFECT_API_URL``);
4. runs the ``wiki-pipeline`` flow in this process with the flow's defaults, except ``model.steps=1`` and
   ``model.eval_batches=1`` (the run stops right after the first optimizer step; the step's evaluation is one
   batch) and ``samples.max_new_tokens=20``, into a fresh artifact root; then runs it again (all Cached);
5. prints one row per stage -- wall time from the Prefect task run, the stage's own timings from its manifest,
   and the peak resident memory (RSS) while it ran: this process, each Dask worker (largest), and the whole
   tree (this process + workers; the Prefect server and the mirror are not counted) -- and the headline:
   **flow start -> model stage done** (the first training step; ``steps=1``).

Output digests (sha256 of every published shard, the tokenizer and ``wikipedia.txt``) go into
``bench/out/full_scale.json``; ``--compare OLD.json`` checks them against an earlier run (e.g. before a change).
Run it under ``flock /tmp/wiki-bench.lock`` so two benchmarks do not share the 2 cores; the load average before
and after is printed and recorded.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

from flows.mirror import REPO

OUT = REPO / "bench" / "out"
DEFAULT_BYTES = 545_000_000
VALID_BYTES = 1_144_000  # about wikitext-103's wiki.valid.raw
TEST_BYTES = 1_290_000  # about wikitext-103's wiki.test.raw
_ARTICLE = re.compile(rb"\n \n = [^=\n][^\n]* = \n")  # the blank line before a title line


def corpus_file(nbytes: int) -> Path:
    path = OUT / f"wiki{nbytes // 1_000_000}m.txt"
    if not path.exists() or path.stat().st_size != nbytes:
        print(f"generating {path} with bench/make_corpus.py ...", flush=True)
        subprocess.run(
            [sys.executable, "-m", "bench.make_corpus", "--bytes", str(nbytes), "--out", str(path)],
            check=True,
            cwd=REPO,
        )
    return path


def _article_cut(f, size: int, target: int) -> int:
    """The offset of the first article boundary at or after ``target`` (just after a ``\\n``)."""
    f.seek(target)
    window = f.read(1 << 20)
    m = _ARTICLE.search(window)
    if m is None:
        raise SystemExit(f"no article boundary within 1 MB after offset {target}")
    return target + m.start() + 1


def zip_file(text: Path) -> Path:
    """The wikitext-103-shaped zip of ``text`` (built once; members streamed, nothing held in memory)."""
    dest = OUT / f"wikitext-103-{text.stem.removeprefix('wiki')}.zip"
    if dest.exists():
        return dest
    size = text.stat().st_size
    with open(text, "rb") as f:
        test_start = _article_cut(f, size, size - TEST_BYTES)
        valid_start = _article_cut(f, size, size - TEST_BYTES - VALID_BYTES)
    ranges = {"train": (0, valid_start), "valid": (valid_start, test_start), "test": (test_start, size)}
    print(
        f"zipping {text.name} -> {dest.name}: " + ", ".join(f"{k} {b - a:,} B" for k, (a, b) in ranges.items()),
        flush=True,
    )
    tmp = dest.with_suffix(".zip.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z, open(text, "rb") as f:
        for split in ("train", "valid", "test"):
            a, b = ranges[split]
            info = zipfile.ZipInfo(f"wikitext-103-raw/wiki.{split}.raw", date_time=(2016, 9, 26, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            f.seek(a)
            with z.open(info, "w", force_zip64=True) as w:
                left = b - a
                while left:
                    piece = f.read(min(left, 16 << 20))
                    w.write(piece)
                    left -= len(piece)
    os.replace(tmp, dest)
    return dest


class Mirror:
    """``python -m flows.mirror --serve --zip PATH`` as a child process (its own interpreter, like a real server)."""

    def __init__(self, zip_path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flows.mirror", "--serve", "--zip", str(zip_path)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://127.0.0.1:"):
            self.stop()
            raise SystemExit(f"the mirror did not start (printed {self.url!r})")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class TreeSampler(threading.Thread):
    """Every 0.1 s: (time, RSS of this process, RSS of each descendant) -- descendants except ``exclude``'s trees."""

    def __init__(self, exclude: list[int]) -> None:
        super().__init__(daemon=True)
        import psutil

        self.me = psutil.Process()
        self.exclude = set(exclude)
        self.samples: list[tuple[float, int, list[int]]] = []
        self.stop_event = threading.Event()

    def _excluded(self) -> set[int]:
        import psutil

        out = set()
        for pid in self.exclude:
            try:
                p = psutil.Process(pid)
                out |= {pid} | {c.pid for c in p.children(recursive=True)}
            except psutil.Error:
                pass
        return out

    def run(self) -> None:
        import psutil

        excluded = self._excluded()
        n = 0
        while not self.stop_event.wait(0.1):
            n += 1
            if n % 50 == 0:
                excluded = self._excluded()
            try:
                own = self.me.memory_info().rss
                kids = []
                for c in self.me.children(recursive=True):
                    if c.pid in excluded:
                        continue
                    with contextlib.suppress(psutil.Error):
                        kids.append(c.memory_info().rss)
            except psutil.Error:
                continue
            self.samples.append((time.time(), own, kids))

    def peaks(self, t0: float, t1: float) -> dict:
        window = [s for s in self.samples if t0 <= s[0] <= t1] or [min(self.samples, key=lambda s: abs(s[0] - t0))]
        mib = 2**20
        return {
            "self_mb": round(max(s[1] for s in window) / mib),
            "worker_mb": round(max((max(s[2]) for s in window if s[2]), default=0) / mib),
            "tree_mb": round(max(s[1] + sum(s[2]) for s in window) / mib),
        }


def task_runs(flow_run_id) -> tuple[dict, dict]:
    """(flow run times, {task name: {state, start, end}}) read back through the Prefect API."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        fr = client.read_flow_run(flow_run_id)
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    ts = lambda d: d.timestamp() if d else None  # noqa: E731
    return (
        {"start": ts(fr.start_time), "end": ts(fr.end_time)},
        {r.name: {"state": r.state.name, "start": ts(r.start_time), "end": ts(r.end_time)} for r in runs},
    )


def manifest(ref: dict) -> dict:
    from tasks.store import ArtifactStore

    if "://" in ref["path"]:  # an object-store root
        root = ref["path"].removesuffix(f"/{ref['stage']}/{ref['version']}")
        return ArtifactStore(root).get(ref["stage"], ref["version"]).manifest
    return json.loads((Path(ref["path"]) / "manifest.json").read_text())


S3_SERVER_PIDS: list[int] = []  # not counted in the tree's memory (like the Prefect server and the mirror)


@contextlib.contextmanager
def s3_root() -> Iterator[str]:
    """``s3://<bucket>/art`` on a moto S3 server process on 127.0.0.1 (the tests' server; ``pip install
    'moto[server]'``), with this process's AWS environment pointed there; the server stops on exit."""
    import socket
    import urllib.request

    import boto3

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen(
        [str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(150):
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
                break
            except OSError:
                time.sleep(0.2)
        os.environ.update(
            AWS_ENDPOINT_URL=endpoint,
            AWS_ACCESS_KEY_ID="bench",
            AWS_SECRET_ACCESS_KEY="bench",
            AWS_DEFAULT_REGION="us-east-1",
            WIKI_PIPELINE_CACHE=tempfile.mkdtemp(prefix="full-scale-cache-", dir=OUT),
        )
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="wiki-bench")
        S3_SERVER_PIDS.append(proc.pid)
        yield "s3://wiki-bench/art"
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(os.environ.get("WIKI_PIPELINE_CACHE", ""), ignore_errors=True)


def digests(refs: dict) -> dict:
    """sha256 of the outputs that must not change: every shard, the tokenizer, the corpus text files."""
    out = {}
    for stage, keep in (
        ("corpus", lambda n: n.endswith(".txt")),
        ("tokenizer", lambda n: n == "tokenizer.json"),
        ("shards", lambda n: n.endswith(".parquet") or n == "shards.json"),
    ):
        for name, f in sorted(manifest(refs[stage])["files"].items()):
            if keep(name):
                out[f"{stage}/{name}"] = f["sha256"]
    return out


def stage_details(refs: dict) -> dict:
    """Each stage's own timings, from its manifest metrics."""
    m = {s: manifest(refs[s]) for s in ("corpus", "tokenizer", "shards", "model")}
    c, t, s, mo = (m[k]["metrics"] for k in ("corpus", "tokenizer", "shards", "model"))
    build = {k: m[k]["timings"]["build_seconds"] for k in m}
    tok_parts = [
        f"{k.removesuffix('_seconds')} {t[k]:.1f}"
        for k in ("count_seconds", "train_seconds", "encode_seconds", "analysis_seconds")
        if t.get(k) is not None
    ]
    return {
        "corpus": f"download {c['download_seconds']:.1f}; unzip + strip + write {c['extract_seconds']:.1f}; "
        f"{sum(st['bytes'] for st in c['splits'].values()) / 1e6:.0f} MB of text",
        "tokenizer": "; ".join(tok_parts) + f" (slice {t['train_bytes'] / 1e6:.0f} MB)",
        "shards": f"{s['encoded_bytes_this_run'] / 1e6:.0f} MB at {s['mb_per_s']} MB/s with {s['workers']} worker(s); "
        f"{len(s['shards'])} shards",
        "model": f"before the loop {build['model'] - mo['train_seconds']:.1f} (init; every shard fetched and "
        f"checked); step 1 + 1 eval batch + checkpoint {mo['train_seconds']:.1f}",
        "build_seconds": build,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, default=DEFAULT_BYTES)
    ap.add_argument("--out", default=str(OUT / "full_scale.json"))
    ap.add_argument("--compare", help="an earlier full_scale.json: check the output digests are identical")
    ap.add_argument(
        "--run",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="a run option for the flow, e.g. --run workers=2 (how to run, not what)",
    )
    ap.add_argument("--no-rerun", action="store_true", help="skip the cached rerun")
    ap.add_argument(
        "--store",
        choices=("local", "s3"),
        default="local",
        help="the artifact root: a local directory, or s3:// on a moto S3 server on 127.0.0.1",
    )
    ap.add_argument("--keep", action="store_true", help="keep the artifact root")
    args = ap.parse_args(argv)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

    text = corpus_file(args.bytes)
    zpath = zip_file(text)
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}", flush=True)

    server = None
    if not os.environ.get("PREFECT_API_URL"):
        from flows.server import PrefectServer

        home = Path(tempfile.mkdtemp(prefix="full-scale-prefect-"))
        server = PrefectServer(home).start()
        os.environ["PREFECT_API_URL"] = server.api_url
        os.environ["PREFECT_HOME"] = str(home)
    mirror = Mirror(zpath)
    bucket = contextlib.ExitStack()  # the S3 server outlives the runs: the manifests are read from it below
    atexit.register(bucket.close)
    root: Path | str = Path(tempfile.mkdtemp(prefix="full-scale-art-", dir=OUT))
    if args.store == "s3":
        shutil.rmtree(root)
        root = bucket.enter_context(s3_root())
    sampler = TreeSampler([p.pid for p in ([server.proc] if server else []) + [mirror.proc]] + S3_SERVER_PIDS)
    try:
        from flows.wiki_pipeline import wiki_pipeline

        run_options = {"artifacts_dir": str(root)}
        for kv in args.run:
            k, _, v = kv.partition("=")
            try:
                run_options[k] = json.loads(v)
            except ValueError:
                run_options[k] = v
        params = dict(
            corpus={"source_url": mirror.url},
            model={"steps": 1, "eval_batches": 1},
            samples={"max_new_tokens": 20},
            run=run_options,
        )
        sampler.start()
        t0 = time.time()
        state = wiki_pipeline(**params, return_state=True)
        wall = time.time() - t0
        refs = state.result()
        flow_times, tasks = task_runs(state.state_details.flow_run_id)
        rerun = None
        if not args.no_rerun:
            t1 = time.time()
            state2 = wiki_pipeline(**params, return_state=True)
            rerun = {
                "wall_s": round(time.time() - t1, 2),
                "states": {k: v["state"] for k, v in task_runs(state2.state_details.flow_run_id)[1].items()},
            }
        sampler.stop_event.set()
        sampler.join()
    finally:
        mirror.stop()
        if server is not None:
            from prefect._internal.concurrency.services import QueueService

            QueueService.drain_all(timeout=15)
            server.stop()
    load_after = os.getloadavg()

    details = stage_details(refs)
    start = flow_times["start"] or t0
    rows = []
    for name in ("corpus", "tokenizer", "shards", "model", "samples"):
        tr = tasks[name]
        rows.append(
            {
                "stage": name,
                "seconds": round(tr["end"] - tr["start"], 1),
                "state": tr["state"],
                "detail": details.get(name, ""),
                **sampler.peaks(tr["start"], tr["end"]),
            }
        )
    to_first_step = tasks["model"]["end"] - start
    gaps = to_first_step - sum(r["seconds"] for r in rows[:4])
    print()
    print("| stage | seconds | peak RSS: flow process / largest worker / tree (MB) | where the time goes |")
    print("|---|---:|---|---|")
    for r in rows:
        print(
            f"| {r['stage']} | {r['seconds']:.1f} | {r['self_mb']} / {r['worker_mb']} / {r['tree_mb']} "
            f"| {r['detail']} |"
        )
    print(f"| (Prefect between stages) | {gaps:.1f} | | |")
    print(
        f"\nflow start -> first training step done (model stage, steps=1): {to_first_step:.1f} s "
        f"(flow call wall {wall:.1f} s incl. samples)"
    )
    peak = sampler.peaks(t0, t0 + wall)
    print(
        f"peak RSS over the run: flow process {peak['self_mb']} MB, largest worker {peak['worker_mb']} MB, "
        f"tree {peak['tree_mb']} MB"
    )
    if rerun:
        print(f"cached rerun of every stage: {rerun['wall_s']:.1f} s ({rerun['states']})")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min); {os.cpu_count()} CPUs")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    dirty = bool(
        subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    )
    result = {
        "commit": commit + ("+dirty" if dirty else ""),
        "when": dt.datetime.now().isoformat(timespec="seconds"),
        "text_bytes": args.bytes,
        "zip_bytes": zpath.stat().st_size,
        "run_options": run_options,
        "store": args.store,
        "to_first_step_s": round(to_first_step, 2),
        "flow_wall_s": round(wall, 2),
        "rows": rows,
        "between_stages_s": round(gaps, 2),
        "peak": peak,
        "cached_rerun": rerun,
        "build_seconds": details["build_seconds"],
        "load_before": load_before,
        "load_after": load_after,
        "cpus": os.cpu_count(),
        "digests": digests(refs),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    status = 0
    if args.compare:
        old = json.loads(Path(args.compare).read_text())["digests"]
        new = result["digests"]
        diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        print(
            f"outputs identical to {args.compare}: {not diff}"
            + (f" (differ: {diff[:10]})" if diff else "")
            + f" ({len(new)} files)"
        )
        status = 1 if diff else 0
    if not args.keep and isinstance(root, Path):
        shutil.rmtree(root, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
