"""BPE training side by side: ours (as the tokenizer stage runs it) vs HF ``tokenizers``, time and peak memory.

    flock /tmp/wiki-bench.lock .venv/bin/python -m bench.bpe_vs_hf                  # 50 MB slice, 1024 merges
    flock /tmp/wiki-bench.lock .venv/bin/python -m bench.bpe_vs_hf --bytes 0 --only ours   # the whole train text

The text is the first ``--bytes`` bytes (0 = all) of ``bench/out/wiki545m.txt`` (``bench/make_corpus.py``, seed 0;
generated when missing), cut back to a character boundary. Each trainer runs in a fresh child process, one
after the other, and reads the text from the file itself:

* ``ours``: the tokenizer stage's two phases -- the words counted chunk by chunk (8 MB chunks cut where a word
  ends) on a local Dask cluster of 2 worker processes (``tasks.dask.work``, started and stopped inside the
  timing), the tables added up in file order, then ``train_and_count_tokens`` (merges + the token count);
* ``ours-1``: the same with the chunks counted one after the other in the process (no cluster);
* ``hf``: ``tokenizers.trainers.BpeTrainer`` with the same pre-tokeniser (``Split(\\s*\\S+|\\s+, isolated)``), the
  slice's alphabet as the initial alphabet, ``vocab_size = alphabet + merges``, no special tokens, fed 1 MB
  pieces cut at safe points from a generator (it never holds the text; its Rust threads use both cores);
* ``in-memory``: ``BPETokenizer.from_corpus(whole text)`` -- the reference for the merges (skipped for
  ``--bytes 0``, where it would need ~15 bytes per character).

Peak memory: sampled every 50 ms over the child's process tree (its Dask workers included): the RSS sum, and the
sum of each process's kernel-tracked peak (VmHWM) -- an upper bound sampling cannot miss. The merges of every
trainer are compared with the in-memory trainer's (HF breaks ties its own way, so its merges can differ where
counts tie). Prints a table and writes ``bench/out/bpe_vs_hf.json``; the load average before/after is recorded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.memwatch import run_watched
from flows.mirror import REPO

OUT = REPO / "bench" / "out"
CORPUS = OUT / "wiki545m.txt"
TRAINERS = ("ours", "ours-1", "hf", "in-memory")


def slice_bytes(path: Path, n: int) -> int:
    from tasks.tokenizer import slice_end

    return slice_end(path, n)


def _digest(merges) -> str:
    return hashlib.sha256(json.dumps([list(m) for m in merges]).encode()).hexdigest()[:16]


def child(trainer: str, path: str, end: int, merges: int) -> dict:
    """Runs in a fresh process: train, return timings and the merges' digest."""
    from mygpt.tokenizers.bpe_chunks import chunk_bounds, read_chunk
    from mygpt.tokenizers.bpe_train import add_counts, count_words, gc_paused, train_and_count_tokens

    t0 = time.perf_counter()
    out: dict = {}
    if trainer in ("ours", "ours-1"):
        counts: dict = {}
        if trainer == "ours":
            import logging

            from tasks.core.settings import RunOptions
            from tasks.dask import work as dask_work

            with dask_work.dask_client(RunOptions(workers=2), logging.getLogger("bench")) as client:
                t_up = time.perf_counter()
                work = dask_work.ordered_results(
                    client,
                    dask_work.count_chunk,
                    chunk_bounds(path, 8 << 20, end=end),
                    lambda b: (path, b[1], b[2]),
                    window=6,
                    name="count",
                )
                with gc_paused():
                    for _, table in work:
                        add_counts(counts, dask_work.word_counts(table))
                out["cluster_start_s"] = round(t_up - t0, 2)
        else:
            with gc_paused():
                for _, s, e in chunk_bounds(path, 8 << 20, end=end):
                    add_counts(counts, count_words(read_chunk(path, s, e)))
        out["count_s"] = round(time.perf_counter() - t0, 2)
        t1 = time.perf_counter()
        with gc_paused():
            _chars, got, tokens = train_and_count_tokens(counts, merges)
        out.update(train_s=round(time.perf_counter() - t1, 2), distinct_words=len(counts), tokens=tokens)
    elif trainer == "hf":
        from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

        from mygpt.tokenizers.bpe_words import pieces

        def texts():
            for _, s, e in chunk_bounds(path, 8 << 20, end=end):
                yield from pieces(read_chunk(path, s, e))

        alphabet = sorted({c for t in texts() for c in set(t)})  # not timed: our trainer finds it while counting
        t0 = time.perf_counter()
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s*\S+|\s+"), behavior="isolated")
        trainer_ = trainers.BpeTrainer(
            vocab_size=len(alphabet) + merges,
            initial_alphabet=alphabet,
            min_frequency=0,
            special_tokens=[],
            show_progress=False,
        )
        tok.train_from_iterator(texts(), trainer=trainer_)
        got = [
            tuple(m) if isinstance(m, (list, tuple)) else tuple(m.split(" ", 1))
            for m in json.loads(tok.to_str())["model"]["merges"]
        ]
    else:
        from mygpt.tokenizers.bpe import BPETokenizer

        got = BPETokenizer.from_corpus(read_chunk(path, 0, end), merges).merges
    out.update(
        seconds=round(time.perf_counter() - t0, 2),
        merges=len(got),
        digest=_digest(got),
        first=[list(m) for m in got[:1024]],
    )
    return out


def run_child(trainer: str, end: int, merges: int) -> dict:
    cmd = [sys.executable, "-m", "bench.bpe_vs_hf", "--child", trainer, str(CORPUS), str(end), str(merges)]
    w = run_watched(cmd)
    out = w.stdout
    if w.returncode:
        raise SystemExit(f"{trainer} failed ({w.returncode})")
    res = json.loads(out.strip().splitlines()[-1])
    res.update(
        peak_rss_mb=round(w.peak_rss_mb),
        sum_vmhwm_mb=round(w.sum_vmhwm_mb),
        largest_process_mb=round(w.largest_process_mb),
        processes=len(w.hwm_kb),
    )
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, default=50_000_000, help="slice of the corpus (0 = all of it)")
    ap.add_argument("--merges", type=int, default=1024)
    ap.add_argument("--only", nargs="+", choices=TRAINERS, default=None)
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        trainer, path, end, merges = args.child
        print(json.dumps(child(trainer, path, int(end), int(merges))))
        return 0
    if not CORPUS.exists():
        subprocess.run(
            [sys.executable, "-m", "bench.make_corpus", "--bytes", "545000000", "--out", str(CORPUS)],
            check=True,
            cwd=REPO,
        )
    end = slice_bytes(CORPUS, args.bytes)
    trainers = args.only or [t for t in TRAINERS if not (t == "in-memory" and args.bytes == 0)]
    load_before = os.getloadavg()
    print(f"{end:,} bytes of {CORPUS.name}, {args.merges} merges; load average {load_before[0]:.2f}", flush=True)
    results = {}
    for t in trainers:
        results[t] = r = run_child(t, end, args.merges)
        print(
            f"  {t:10s} {r['seconds']:6.2f} s   peak RSS {r['peak_rss_mb']:5d} MB (tree of {r['processes']}; "
            f"largest process {r['largest_process_mb']} MB, sum of VmHWM {r['sum_vmhwm_mb']} MB)   "
            + " ".join(f"{k}={r[k]}" for k in ("cluster_start_s", "count_s", "train_s", "distinct_words") if k in r),
            flush=True,
        )
    ref = results.get("in-memory") or results.get("ours-1") or results.get("ours")
    for t, r in results.items():
        same = sum(1 for a, b in zip(r["first"], ref["first"]) if a == b)
        print(
            f"  {t:10s} merges identical to {'in-memory' if 'in-memory' in results else 'ours'}: "
            f"{r['digest'] == ref['digest']} ({same}/{len(ref['first'])} in the same place)"
        )
    if "hf" in results and "ours" in results:
        o, h = results["ours"], results["hf"]
        print(
            f"  ours/HF: time x{o['seconds'] / h['seconds']:.2f}, "
            f"peak RSS (tree) x{o['peak_rss_mb'] / h['peak_rss_mb']:.2f}"
            f", largest process x{o['largest_process_mb'] / h['largest_process_mb']:.2f}"
        )
    load_after = os.getloadavg()
    print(f"  load average before {load_before[0]:.2f}, after {load_after[0]:.2f} ({os.cpu_count()} CPUs)")
    for r in results.values():
        r.pop("first", None)
    OUT.mkdir(parents=True, exist_ok=True)
    name = "bpe_vs_hf.json" if args.bytes else "bpe_vs_hf_whole.json"
    (OUT / name).write_text(
        json.dumps(
            {
                "bytes": end,
                "merges": args.merges,
                "load_before": load_before,
                "load_after": load_after,
                "results": results,
            },
            indent=1,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
