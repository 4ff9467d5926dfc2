"""Benchmark the encode stage on a generated Wikipedia-shaped corpus: MB/s and peak memory, for either tokenizer kind,
and tiktoken's throughput on the same text with the same merges.

    flock /tmp/wiki-bench.lock .venv/bin/python -m bench.encode_stage_bench [--bytes 545000000] [--workers 1 2]
        [--kinds chapter byte]

The corpus comes from ``bench/make_corpus.py`` (``bench/out/wiki{N}.txt``, generated when missing) and
is the ``train`` split (hard-linked, not copied); valid/test are small slices of it. The tokenizer is
trained on the first 5 MB (``--merges`` merges): ``BPETokenizer.from_corpus`` for ``chapter`` (the chapter's
word-level BPE), ``ByteBPETokenizer.train`` (GPT-2 pattern, ``<|endoftext|>``) for ``byte``, whose shards end each
article (the corpus's article index, written here from the `` = Title = `` lines). The corpus and tokenizer are
published into a fresh artifact root as ready-made versions (no corpus/tokenizer stage), then the shards stage runs
once per worker count (forced, so each count builds), through ``encode_shards.fn`` (what the Prefect task runs):
the chunks on a local Dask cluster of that many workers (one: threads in this process; more: worker processes).
``wall_s`` and ``mb_per_s`` are the whole stage (the Dask cluster's start included, as in the stage's own
``stage_mb_per_s``). For ``byte``, tiktoken then encodes the same three files with the same merges and pattern
(``encode_ordinary_batch`` on 1 MB pieces cut where the pattern always ends a pre-token, as many threads as the
largest worker count), reading included; its ids of the first piece are compared with ours.
Peak memory: sampled every 0.1 s, the resident memory of the process plus
its Dask worker processes during the stage, the stage process alone, and the largest worker alone
(``peak_rss_per_worker_mb``; ``rss_before_stage_mb`` is the process before it: Python, numpy, the tokenizer),
and the process's ``ru_maxrss`` high-water mark. Results: ``bench/out/encode_stage_bench.json``. Run it under
``flock /tmp/wiki-bench.lock``; the load average at the start and end of each run is recorded.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

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


_ARTICLE = re.compile(rb"\n \n = [^=\n][^\n]* = \n")  # the blank line before a title line (bench/full_scale.py)


def article_starts(path: Path) -> np.ndarray:
    """Where each article of ``path`` starts (just after the ``\\n`` before its blank line): the article index."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return np.array([0] + [x.start() + 1 for x in _ARTICLE.finditer(m)], dtype=np.int64)


def train_tokenizer(kind: str, merges: int, slice_text: str):
    from mygpt.tokenizers.bpe import BPETokenizer
    from mygpt.tokenizers.byte_bpe import ByteBPETokenizer

    if kind == "chapter":
        return BPETokenizer.from_corpus(slice_text, merges)
    return ByteBPETokenizer.train(slice_text, 256 + merges + 1, ["<|endoftext|>"])


def tiktoken_run(tok, files: list[Path], threads: int) -> dict:
    """tiktoken on ``files`` with ``tok``'s merges and pattern: MB/s (reading included) and whether its ids of the
    first piece equal ours."""
    import tiktoken

    from mygpt.tokenizers.byte_bpe_pretokens import pieces
    from mygpt.tokenizers.byte_bpe_reference import PATTERNS

    enc = tiktoken.Encoding(
        "ours",
        pat_str=PATTERNS[tok.pattern],
        mergeable_ranks={b: i for i, b in tok.vocab.items() if i < tok.special_base},
        special_tokens=tok.special_ids,
    )
    enc.encode_ordinary("warm up")
    load_start = os.getloadavg()
    nbytes = tokens = 0
    equal = None
    t0 = time.time()
    for path in files:
        with open(path, encoding="utf-8") as f:
            while block := f.read(16 << 20) + f.readline():  # whole lines: a pre-token never crosses the cut
                batch = list(pieces(block, 1 << 20))
                out = enc.encode_ordinary_batch(batch, num_threads=threads)
                if equal is None:
                    equal = bool(np.array_equal(np.asarray(out[0]), tok.encode_array(batch[0])))
                tokens += sum(map(len, out))
                nbytes += len(block.encode("utf-8"))
    wall = time.time() - t0
    return {
        "tiktoken_threads": threads,
        "tiktoken_wall_s": round(wall, 2),
        "tiktoken_mb_per_s": round(nbytes / 1e6 / wall, 2),
        "tiktoken_tokens": tokens,
        "tiktoken_ids_equal_first_piece": equal,
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, default=545_000_000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--kinds", nargs="+", choices=["chapter", "byte"], default=["chapter", "byte"])
    ap.add_argument("--merges", type=int, default=1024)
    ap.add_argument("--shard-tokens", type=int, default=10_000_000)
    ap.add_argument("--keep", action="store_true", help="keep the artifact roots under bench/out/")
    args = ap.parse_args(argv)
    src = corpus_file(args.bytes)
    results = {"corpus": str(src), "cpu_count": os.cpu_count(), "load_avg_start": os.getloadavg(), "kinds": {}}
    for kind in args.kinds:
        results["kinds"][kind] = bench_kind(kind, src, args)
    (OUT / "encode_stage_bench.json").write_text(json.dumps(results, indent=2) + "\n")
    print("\nkind      workers  stage s   MB/s (whole stage)   tiktoken MB/s (same text, same merges)")
    for kind, r in results["kinds"].items():
        tk = r.get("tiktoken", {})
        for run in r["runs"]:
            print(
                f"{kind:9} {run['workers']:7}  {run['wall_s']:7.2f}   {run['mb_per_s']:8.1f}             "
                f"{tk.get('tiktoken_mb_per_s', '-')} ({tk.get('tiktoken_threads', '-')} threads)"
            )
    return 0


def bench_kind(kind: str, src: Path, args) -> dict:
    """Publish a corpus and a tokenizer of ``kind``, run the shards stage once per worker count; the numbers."""
    from mygpt.tokenizers.files import save_tokenizer_file
    from tasks.core.settings import RunOptions
    from tasks.core.stage import StageRef
    from tasks.corpora.splits import split_file_names
    from tasks.registry import open_store
    from tasks.shards import ShardsSettings, encode_shards

    work = OUT / f"encode-bench-{kind}"
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
    files = [cdir / f"wiki.{s}.txt" for s in ("train", "valid", "test")]
    if kind == "byte":
        for split, path in zip(("train", "valid", "test"), files):
            np.save(cdir / split_file_names(split, True).articles, article_starts(path))
    tokenizer_build = store.open_build("tokenizer", "bench")
    tdir = tokenizer_build.out
    with open(src, "rb") as f:
        slice_text = f.read(5_000_000).decode("utf-8", errors="ignore")
    t0 = time.time()
    tok = train_tokenizer(kind, args.merges, slice_text)
    took = time.time() - t0
    print(f"{kind} tokenizer: {args.merges} merges on 5 MB in {took:.1f}s, vocab {tok.vocab_size}", flush=True)
    save_tokenizer_file(tok, tdir / "tokenizer.json")  # as the tokenizer stage writes it
    text_bytes = sum(p.stat().st_size for p in files)
    refs = {}
    for name, build in (("corpus", corpus_build), ("tokenizer", tokenizer_build)):
        manifest = build.publish(settings={}, inputs={}, code_version="bench")
        refs[name] = StageRef(
            stage=name, version="bench", build_id=manifest["build_id"], path=str(store.version_path(name, "bench"))
        )

    files = [Path(refs["corpus"]["path"]) / p.name for p in files]  # published: moved out of the build folder
    results = {
        "text_bytes": text_bytes,
        "vocab_size": tok.vocab_size,
        "shard_tokens": args.shard_tokens,
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
            "kind": kind,
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
    print(f"{kind}: identical bytes across worker counts: {results['identical_across_workers']}")
    if kind == "byte":
        results["tiktoken"] = tiktoken_run(tok, files, max(args.workers))
        print(json.dumps(results["tiktoken"]), flush=True)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return results


if __name__ == "__main__":
    sys.exit(main())
