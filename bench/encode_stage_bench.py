"""Benchmark the encode stage on a generated Wikipedia-shaped corpus: MB/s and peak memory.

    flock /tmp/wiki-bench.lock .venv/bin/python -m bench.encode_stage_bench [--bytes 545000000] [--workers 1 2]

The corpus comes from ``bench/make_corpus.py`` (``bench/out/wiki{N}.txt``, generated when missing) and
is the ``train`` split (hard-linked, not copied); valid/test are small slices of it. The tokenizer is
trained with ``BPETokenizer.from_corpus`` on the first 5 MB (``--merges`` merges). The corpus and
tokenizer are published into a fresh artifact root as ready-made versions (no corpus/tokenizer stage), then
the shards stage runs once per worker count (forced, so each count builds), through ``encode_shards.fn``
(what the Prefect task runs): the chunks on a local Dask cluster of that many workers (one: threads in this
process; more: worker processes). Peak memory: sampled every 0.1 s, the resident memory of the process plus
its Dask worker processes during the stage, the stage process alone, and the largest worker alone
(``peak_rss_per_worker_mb``; ``rss_before_stage_mb`` is the process before it: Python, numpy, the tokenizer),
and the process's ``ru_maxrss`` high-water mark. Results: ``bench/out/encode_stage_bench.json``. Run it under
``flock /tmp/wiki-bench.lock``; the load average at the start and end of each run is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from flows.mirror import REPO

OUT = REPO / "bench" / "out"


def corpus_file(nbytes: int) -> Path:
    path = OUT / (f"wiki{nbytes // 1_000_000}m.txt" if nbytes % 1_000_000 == 0 else f"wiki{nbytes}.txt")
    if not path.exists() or path.stat().st_size != nbytes:
        print(f"generating {path} with bench/make_corpus.py ...", flush=True)
        subprocess.run(
            [sys.executable, "-m", "bench.make_corpus", "--bytes", str(nbytes), "--out", str(path)],
            check=True,
            cwd=REPO,
        )
    return path


class RssSampler(threading.Thread):
    """Max over time of (RSS of this process + RSS of all its descendants), and of each descendant alone."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        import psutil

        self.proc = psutil.Process()
        self.peak = 0
        self.peak_self = 0
        self.peak_worker = 0  # the largest descendant: a Dask worker process
        self.stop_event = threading.Event()

    def run(self) -> None:
        import psutil

        while not self.stop_event.wait(0.1):
            total = 0
            for p in [self.proc] + self.proc.children(recursive=True):
                try:
                    rss = p.memory_info().rss
                except psutil.Error:
                    continue
                total += rss
                if p.pid == self.proc.pid:
                    self.peak_self = max(self.peak_self, rss)
                else:
                    self.peak_worker = max(self.peak_worker, rss)
            self.peak = max(self.peak, total)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, default=545_000_000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--merges", type=int, default=1024)
    ap.add_argument("--shard-tokens", type=int, default=10_000_000)
    ap.add_argument("--keep", action="store_true", help="keep the artifact roots under bench/out/")
    args = ap.parse_args(argv)

    from mygpt.tokenizers.bpe import BPETokenizer
    from tasks.core.settings import RunOptions
    from tasks.core.stage import StageRef
    from tasks.registry import open_store
    from tasks.shards import ShardsSettings, encode_shards

    src = corpus_file(args.bytes)
    work = OUT / "encode-bench"
    shutil.rmtree(work, ignore_errors=True)
    root = work / "art"
    store = open_store(root)
    corpus_build = store.open_build("corpus", "bench")
    cdir = corpus_build.out
    os.link(src, cdir / "wiki.train.txt")
    with open(src, "rb") as f:
        head = f.read(2_000_000).decode("utf-8", errors="ignore")
    (cdir / "wiki.valid.txt").write_text(head[:1_000_000], encoding="utf-8")
    (cdir / "wiki.test.txt").write_text(head[1_000_000:], encoding="utf-8")
    tokenizer_build = store.open_build("tokenizer", "bench")
    tdir = tokenizer_build.out
    with open(src, "rb") as f:
        slice_text = f.read(5_000_000).decode("utf-8", errors="ignore")
    t0 = time.time()
    tok = BPETokenizer.from_corpus(slice_text, args.merges)
    print(f"tokenizer: {args.merges} merges on 5 MB in {time.time() - t0:.1f}s, vocab {tok.vocab_size}", flush=True)
    tok.save(tdir / "tokenizer.json")
    text_bytes = sum((cdir / f"wiki.{s}.txt").stat().st_size for s in ("train", "valid", "test"))
    refs = {}
    for name, build in (("corpus", corpus_build), ("tokenizer", tokenizer_build)):
        manifest = build.publish(settings={}, inputs={}, code_version="bench")
        refs[name] = StageRef(
            stage=name, version="bench", build_id=manifest["build_id"], path=str(store.version_path(name, "bench"))
        )

    results = {
        "corpus": str(src),
        "text_bytes": text_bytes,
        "vocab_size": tok.vocab_size,
        "shard_tokens": args.shard_tokens,
        "cpu_count": os.cpu_count(),
        "load_avg_start": os.getloadavg(),
        "runs": [],
    }
    shas = {}
    for workers in args.workers:
        import psutil

        rss_before = psutil.Process().memory_info().rss
        load_start = os.getloadavg()
        sampler = RssSampler()
        sampler.start()
        t0 = time.time()
        ref = encode_shards.fn(
            refs["corpus"],
            refs["tokenizer"],
            ShardsSettings(shard_tokens=args.shard_tokens),
            RunOptions(artifacts_dir=str(root), workers=workers, force=["shards"]),
        )
        wall = time.time() - t0
        sampler.stop_event.set()
        sampler.join()
        manifest = json.loads((Path(ref["path"]) / "manifest.json").read_text())
        m = manifest["metrics"]
        shas[workers] = manifest["files"]
        run = {
            "workers": workers,
            "wall_s": round(wall, 2),
            "mb_per_s": round(text_bytes / 1e6 / wall, 2),
            "stage_mb_per_s": m["mb_per_s"],
            "tokens": m["tokens"],
            "shards": len(m["shards"]),
            "shard_bytes": sum(f["size"] for f in manifest["files"].values()),
            "rss_before_stage_mb": round(rss_before / 2**20, 1),
            "peak_rss_total_sampled_mb": round(sampler.peak / 2**20, 1),
            "peak_rss_stage_process_mb": round(sampler.peak_self / 2**20, 1),
            "peak_rss_per_worker_mb": round(sampler.peak_worker / 2**20, 1),
            "peak_rss_self_maxrss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "load_avg_start": load_start,
            "load_avg_end": os.getloadavg(),
        }
        results["runs"].append(run)
        print(json.dumps(run), flush=True)
    results["identical_across_workers"] = len({json.dumps(v, sort_keys=True) for v in shas.values()}) == 1
    (OUT / "encode_stage_bench.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"identical bytes across worker counts: {results['identical_across_workers']}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
