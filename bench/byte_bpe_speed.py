"""Byte-level BPE side by side: our trainer vs HF ``tokenizers``' ByteLevel ``BpeTrainer`` (time, peak RSS), and our
encoder vs HF's (and tiktoken's, where it is installed) throughput.

    flock /tmp/wiki-bench.lock .venv/bin/python -m bench.byte_bpe_speed            # 50 MB, 1024 merges + 1 special

The text is ``--corpus`` (default ``/tmp/wiki50m-seed7.txt``, made by ``bench/make_corpus.py --bytes 50000000
--seed 7`` when missing; never committed). Each run is a fresh child process, one after the other, watched for the
peak RSS of its process tree (``bench/memwatch.py``); times exclude reading the file:

* ``ours``: ``ByteBPETokenizer.train`` (GPT-2 pattern, 256 + merges + ``<|endoftext|>``), ``--workers 1``;
* ``ours-2``: the same with the pre-tokens counted in 2 processes;
* ``hf``: ``BpeTrainer`` on a ``ByteLevel`` pre-tokenizer (GPT-2's regex), the 256 byte characters as the initial
  alphabet, the same vocabulary size and special, fed 1 MB pieces (its Rust threads use every core);
* ``encode`` (each encoder warmed on 100 kB first): the whole file through our encoder
  (``ByteBPETokenizer.encode_array``: pre-tokens found on 2 threads), then through HF's
  ``encode_batch_fast`` with 2 Rayon threads on the same ``tokenizer.json``, then tiktoken with 2 threads on the
  same merges if it is installed; the three id arrays are compared.

Prints a table with the load average before and after, and writes ``bench/out/byte_bpe_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.memwatch import run_watched
from flows.mirror import REPO

OUT = REPO / "bench" / "out"
DEFAULT_CORPUS = Path("/tmp/wiki50m-seed7.txt")
RUNS = ("ours", "ours-2", "hf", "encode")
EOT = "<|endoftext|>"


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _merges_of(tokenizer_json: str) -> list:
    return [m if isinstance(m, list) else m.split(" ", 1) for m in json.loads(tokenizer_json)["model"]["merges"]]


def child(run: str, path: str, merges: int, tok_path: str) -> dict:
    """Runs in a fresh process: one trainer or the encoders; returns its numbers."""
    text = _read(path)
    out: dict = {}
    if run in ("ours", "ours-2"):
        from mygpt.tokenizers.byte_bpe import ByteBPETokenizer

        t0 = time.perf_counter()
        tok = ByteBPETokenizer.train(text, 256 + merges + 1, [EOT], workers=2 if run == "ours-2" else 1)
        out["seconds"] = time.perf_counter() - t0
        hf_json = tok.to_json()
        if run == "ours":
            Path(tok_path).write_text(hf_json, encoding="utf-8")
        out["merges"] = _merges_of(hf_json)
    elif run == "hf":
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

        from mygpt.tokenizers.byte_bpe_pretokens import pieces

        t0 = time.perf_counter()
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=256 + merges + 1,
            special_tokens=[AddedToken(EOT, special=True)],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            min_frequency=0,
            show_progress=False,
        )
        tok.train_from_iterator(pieces(text, 1 << 20), trainer=trainer)
        out["seconds"] = time.perf_counter() - t0
        out["merges"] = _merges_of(tok.to_str())
    else:
        out.update(_encoders(text, tok_path))
    return out


def _encoders(text: str, tok_path: str) -> dict:
    import numpy as np
    from tokenizers import Tokenizer

    from mygpt.tokenizers.byte_bpe import ByteBPETokenizer
    from mygpt.tokenizers.byte_bpe_pretokens import pieces

    mb = len(text.encode("utf-8")) / 1e6
    tok = ByteBPETokenizer.load(tok_path)
    out: dict = {}
    tok.encode_array(text[:100_000])  # warm: HF's tokenizer built, the class table made (once per process)
    t0 = time.perf_counter()
    ours = tok.encode_array(text)
    out["ours_mb_s"] = mb / (time.perf_counter() - t0)
    hf = Tokenizer.from_file(tok_path)
    hf.encode_special_tokens = True
    hf.encode_batch_fast([text[:100_000]])
    t0 = time.perf_counter()
    hf_ids = np.concatenate(
        [np.asarray(e.ids, dtype=ours.dtype) for e in hf.encode_batch_fast(list(pieces(text, 1 << 18)))]
    )
    out["hf_mb_s"] = mb / (time.perf_counter() - t0)
    out["hf_equal"] = bool(np.array_equal(ours, hf_ids))
    try:
        import tiktoken
    except ImportError:
        out["tiktoken"] = "not installed"
        return out
    from mygpt.tokenizers.byte_bpe_reference import GPT2_PATTERN

    enc = tiktoken.Encoding(
        "ours",
        pat_str=GPT2_PATTERN,
        mergeable_ranks={b: i for i, b in tok.vocab.items() if i < tok.special_base},
        special_tokens=tok.special_ids,
    )
    t0 = time.perf_counter()
    tk = enc.encode_ordinary_batch(list(pieces(text, 1 << 20)), num_threads=2)
    out["tiktoken_mb_s"] = mb / (time.perf_counter() - t0)
    out["tiktoken_equal"] = bool(np.array_equal(ours, np.concatenate([np.asarray(t, dtype=ours.dtype) for t in tk])))
    return out


def run_child(run: str, corpus: Path, merges: int, tok_path: Path) -> dict:
    cmd = [sys.executable, "-m", "bench.byte_bpe_speed", "--child", run, str(corpus), str(merges), str(tok_path)]
    env_threads = {"RAYON_NUM_THREADS": "2", "OMP_NUM_THREADS": "1"}
    os.environ.update(env_threads)
    w = run_watched(cmd)
    if w.returncode:
        raise SystemExit(f"{run} failed ({w.returncode})")
    res = json.loads(w.stdout.strip().splitlines()[-1])
    res.update(peak_rss_mb=round(w.peak_rss_mb), largest_process_mb=round(w.largest_process_mb))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--merges", type=int, default=1024)
    ap.add_argument("--only", nargs="+", choices=RUNS, default=None)
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        run, path, merges, tok_path = args.child
        print(json.dumps(child(run, path, int(merges), tok_path)))
        return 0
    if not args.corpus.exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.make_corpus",
                "--bytes",
                "50000000",
                "--seed",
                "7",
                "--out",
                str(args.corpus),
            ],
            check=True,
            cwd=REPO,
        )
    OUT.mkdir(parents=True, exist_ok=True)
    tok_path = OUT / "byte_bpe_speed_tokenizer.json"
    load_before = os.getloadavg()
    size = args.corpus.stat().st_size
    print(f"{size:,} bytes of {args.corpus}, {args.merges} merges + 1 special; load average {load_before[0]:.2f}")
    results = {}
    for run in args.only or RUNS:
        results[run] = r = run_child(run, args.corpus, args.merges, tok_path)
        if run == "encode":
            print(
                f"  encode     ours {r['ours_mb_s']:.1f} MB/s, HF encode_batch_fast (2 threads) "
                f"{r['hf_mb_s']:.1f} MB/s "
                f"(ids equal: {r['hf_equal']}), tiktoken (2 threads) "
                + (
                    f"{r['tiktoken_mb_s']:.1f} MB/s (equal: {r['tiktoken_equal']})"
                    if "tiktoken_mb_s" in r
                    else r["tiktoken"]
                )
                + f"; peak RSS {r['peak_rss_mb']} MB",
                flush=True,
            )
        else:
            print(f"  {run:10s} {r['seconds']:6.2f} s   peak RSS {r['peak_rss_mb']:5d} MB", flush=True)
    trained = {k: r.pop("merges") for k, r in results.items() if "merges" in r}
    if "ours" in trained:
        for k, m in trained.items():
            first = next((i for i, (a, b) in enumerate(zip(m, trained["ours"])) if a != b), None)
            print(f"  {k:10s} merges equal to ours: {m == trained['ours']} (first difference at merge {first})")
    load_after = os.getloadavg()
    print(f"  load average before {load_before[0]:.2f}, after {load_after[0]:.2f} ({os.cpu_count()} CPUs)")
    (OUT / "byte_bpe_speed.json").write_text(
        json.dumps(
            {"bytes": size, "merges": args.merges, "load": [load_before, load_after], "results": results}, indent=2
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
