"""BPE speed bench: chapter algorithm vs our fast path vs HF ``tokenizers``; big-file encoding.

    .venv/bin/python -m bench.bpe_speed                 # everything (generates bench/out/wiki500m.txt once)
    .venv/bin/python -m bench.bpe_speed --big-bytes 0   # only the 1.1 MB WikiText-2 part

Part 1, real text (../shared/data/wikitext2-valid.txt, 1.1 MB), 1024 merges:
  * train: the chapter's word-level algorithm (mygpt/tokenizers/bpe_reference.py, same tie-break), our
    ``BPETokenizer.from_corpus``, and HF ``tokenizers`` BpeTrainer (pre-tokeniser ``Split(\\s*\\S+|\\s+,
    "isolated")``, the same alphabet, no min_frequency, no special tokens, vocab = alphabet + 1024), fed
    the text as one string and as ~64 KB pieces cut at safe points (which lets HF use its threads);
  * encode: the chapter's ``encode_corpus`` (per-word cache, Python list) vs ``encode_corpus``, cold
    (fresh cache) and warm.
Part 2, generated corpus (bench/make_corpus.py, seed 0, git-ignored bench/out/):
  * train 1024 merges on the first 50 MB;
  * encode a 20 MB slice in memory: chapter ``encode_corpus`` vs ours;
  * encode the whole file in 8 MB chunks with workers=1 (``chunk_bounds`` + ``encode_chunk``, in process) and
    workers=2 (the chunks on a local Dask cluster, ``tasks.dask.work``, as the shards stage runs them), each in a
    fresh child process: MB/s, peak RSS (sum over the process tree, sampled every 50 ms with psutil, and
    the largest single process from ``getrusage``), and a checksum showing both runs give the same ids.
Timings are wall-clock, best of ``--repeat`` where repeated; the machine's other load shows up in them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import sys
import time
from pathlib import Path

import numpy as np

from bench.memwatch import run_watched
from flows.mirror import REPO, SHARED_DATA
from mygpt.tokenizers import bpe_reference
from mygpt.tokenizers.bpe import BPETokenizer
from mygpt.tokenizers.bpe_chunks import chunk_bounds, encode_chunk

OUT = REPO / "bench" / "out"
WIKITEXT = SHARED_DATA / "wikitext2-valid.txt"
SAFE = re.compile(r"(?<=\S)\s")


class ChapterEncoder:
    """The chapter's ``encode_corpus`` as printed (§28.4: per-word cache of symbol lists, a Python list of ids,
    a tensor at the end): the baseline our encoder is timed against."""

    def __init__(self, chars: list[str], merges: list[tuple[str, str]]) -> None:
        vocab = list(chars) + [a + b for a, b in merges]
        self.stoi = {s: i for i, s in enumerate(vocab)}
        self.ranks = {(a, b): i for i, (a, b) in enumerate(merges)}
        self._word_cache: dict[str, list[str]] = {}

    def encode_corpus(self, text: str):
        import torch

        ids: list[int] = []
        for match in bpe_reference.WORD_RE.finditer(text):
            word = match.group()
            syms = self._word_cache.get(word)
            if syms is None:
                syms = self._word_cache[word] = bpe_reference.encode_word(word, self.ranks)
            ids.extend(self.stoi[s] for s in syms if s in self.stoi)
        return torch.tensor(ids, dtype=torch.long)


def best_of(fn, repeat: int):
    best = float("inf")
    result = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def safe_pieces(text: str, n: int = 1 << 16) -> list[str]:
    out, s = [], 0
    while s < len(text):
        m = SAFE.search(text, s + n) if len(text) - s > n else None
        e = m.start() if m else len(text)
        out.append(text[s:e])
        s = e
    return out


def hf_train(text_or_pieces: list[str], alphabet: list[str], num_merges: int):
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s*\S+|\s+"), behavior="isolated")
    trainer = trainers.BpeTrainer(
        vocab_size=len(alphabet) + num_merges,
        initial_alphabet=alphabet,
        min_frequency=0,
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator(text_or_pieces, trainer=trainer)
    return tok


def mb(n_bytes: int, seconds: float) -> float:
    return n_bytes / 1e6 / seconds


def part1(results: dict, repeat: int, chapter_train: bool) -> None:
    text = WIKITEXT.read_text(encoding="utf-8")
    nbytes = len(text.encode("utf-8"))
    print(f"== WikiText-2 valid: {len(text):,} chars, {nbytes:,} bytes, 1024 merges")
    r: dict = {"chars": len(text), "bytes": nbytes}
    t_ours, tok = best_of(lambda: BPETokenizer.from_corpus(text, 1024), repeat)
    r["train_ours_s"] = t_ours
    print(f"  train  ours from_corpus          {t_ours:8.3f} s   vocab={tok.vocab_size}")
    if chapter_train:
        t0 = time.perf_counter()
        chars, merges = bpe_reference.train(text, 1024)
        r["train_chapter_s"] = time.perf_counter() - t0
        r["train_same_merges"] = merges == tok.merges and chars == tok.chars
        print(
            f"  train  chapter algorithm         {r['train_chapter_s']:8.3f} s   "
            f"same merges: {r['train_same_merges']}   speed-up x{r['train_chapter_s'] / t_ours:.0f}"
        )
    alphabet = sorted(set(text))
    t_hf1, _ = best_of(lambda: hf_train([text], alphabet, 1024), repeat)
    pieces = safe_pieces(text)
    t_hf2, _ = best_of(lambda: hf_train(pieces, alphabet, 1024), repeat)
    r["train_hf_one_string_s"] = t_hf1
    r["train_hf_pieces_s"] = t_hf2
    print(f"  train  HF BpeTrainer (1 string)  {t_hf1:8.3f} s   ours/HF = {t_ours / t_hf1:.2f}")
    print(f"  train  HF BpeTrainer (pieces)    {t_hf2:8.3f} s   ours/HF = {t_ours / t_hf2:.2f}")

    def chapter_cold():
        return ChapterEncoder(tok.chars, tok.merges).encode_corpus(text)

    def ours_cold():
        return BPETokenizer.from_state(tok.state()).encode_corpus(text)

    t_ch, ch_ids = best_of(chapter_cold, repeat)
    t_us, us_ids = best_of(ours_cold, repeat)
    ch = ChapterEncoder(tok.chars, tok.merges)
    ch.encode_corpus(text)
    t_ch_w, _ = best_of(lambda: ch.encode_corpus(text), repeat)
    tok.encode_corpus(text)
    t_us_w, _ = best_of(lambda: tok.encode_corpus(text), repeat)
    assert ch_ids.tolist() == us_ids.tolist()
    r.update(
        encode_chapter_cold_s=t_ch,
        encode_ours_cold_s=t_us,
        encode_chapter_warm_s=t_ch_w,
        encode_ours_warm_s=t_us_w,
        tokens=int(us_ids.size),
    )
    print(
        f"  encode chapter encode_corpus     cold {t_ch:6.3f} s ({mb(nbytes, t_ch):5.1f} MB/s)   "
        f"warm {t_ch_w:6.3f} s ({mb(nbytes, t_ch_w):5.1f} MB/s)"
    )
    print(
        f"  encode ours    encode_corpus     cold {t_us:6.3f} s ({mb(nbytes, t_us):5.1f} MB/s)   "
        f"warm {t_us_w:6.3f} s ({mb(nbytes, t_us_w):5.1f} MB/s)   x{t_ch / t_us:.1f} / x{t_ch_w / t_us_w:.1f}"
    )
    results["wikitext2"] = r


def read_prefix(path: Path, n_bytes: int) -> str:
    with open(path, "rb") as f:
        data = f.read(n_bytes)
    return data.decode("utf-8", "ignore")  # 'ignore' only trims a character cut at the end


def encode_child(path: str, tok_path: str, workers: int, chunk_bytes: int) -> None:
    """Runs in a fresh process: encode the file, print one JSON line."""
    tok = BPETokenizer.load(tok_path)
    t0 = time.perf_counter()
    n_tokens = 0
    checksum = 0
    chunks = 0
    from mygpt.tokenizers.bpe_word_encoder import EncodeStats

    stats = EncodeStats()
    with contextlib.ExitStack() as stack:
        if workers == 1:
            parts = (  # in process, chunk by chunk in order
                (i, s, e, *encode_chunk(tok, path, s, e)) for i, s, e in chunk_bounds(path, chunk_bytes)
            )
        else:  # the chunks on a local Dask cluster of `workers` processes, as the shards stage runs them
            import logging

            from tasks.core.settings import RunOptions
            from tasks.dask import work as dask_work

            client = stack.enter_context(dask_work.dask_client(RunOptions(workers=workers), logging.getLogger("bench")))
            tok_json = json.dumps({"kind": tok.kind, "state": tok.state()})
            work = dask_work.ordered_results(
                client,
                dask_work.encode_range,
                chunk_bounds(path, chunk_bytes),
                lambda b: ("bench", tok_json, path, b[1], b[2], "skip"),
                window=2 * workers + 2,
                name="encode",
            )
            parts = ((b[0], b[1], b[2], r[0], EncodeStats(**r[1])) for b, r in work)
        for _idx, _s, _e, ids, st in parts:
            n_tokens += ids.size
            checksum = (checksum * 1_000_003 + int(ids.astype(np.int64).sum()) + ids.size) % (1 << 61)
            stats.merge(st)
            chunks += 1
    dt = time.perf_counter() - t0
    ru_self = resource.getrusage(resource.RUSAGE_SELF)
    ru_kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # the Dask workers (joined by now)
    cpu = ru_self.ru_utime + ru_self.ru_stime + ru_kids.ru_utime + ru_kids.ru_stime
    print(
        json.dumps(
            {
                "seconds": dt,
                "cpu_s": cpu,
                "tokens": n_tokens,
                "checksum": checksum,
                "chunks": chunks,
                "skipped_positions": stats.skipped_positions,
                "skipped_distinct": len(stats.skipped_chars),
                "chars": stats.chars,
            }
        )
    )


def run_encode_child(path: Path, tok_path: Path, workers: int, chunk_bytes: int) -> dict:
    """Run one encode in a fresh child process and watch the memory of its whole process tree
    (``bench.memwatch``: peak RSS and PSS sums, and each process's VmHWM)."""
    cmd = [
        sys.executable,
        "-m",
        "bench.bpe_speed",
        "--encode-child",
        str(path),
        str(tok_path),
        str(workers),
        str(chunk_bytes),
    ]
    w = run_watched(cmd, pss=True)
    out = w.stdout
    if w.returncode:
        raise SystemExit(f"encode child failed ({w.returncode}): {out}")
    res = json.loads(out.strip().splitlines()[-1])
    res["tree_peak_rss_mb"] = w.peak_rss_mb
    res["tree_peak_pss_mb"] = w.peak_pss_mb
    res["sum_vmhwm_mb"] = w.sum_vmhwm_mb
    res["processes"] = len(w.hwm_kb)
    return res


def part2(
    results: dict, big_bytes: int, train_bytes: int, workers_list: list[int], chunk_bytes: int, chapter_slice: int
) -> None:
    from bench.make_corpus import make_corpus

    OUT.mkdir(parents=True, exist_ok=True)
    big = OUT / f"wiki{big_bytes // 1_000_000}m.txt"
    if not big.exists() or big.stat().st_size < big_bytes - 4:
        t0 = time.perf_counter()
        make_corpus(big, big_bytes, seed=0, log=lambda *a: None)
        print(f"== generated {big} ({big_bytes:,} bytes) in {time.perf_counter() - t0:.1f}s")
    r: dict = {"file": str(big), "bytes": big.stat().st_size}
    text = read_prefix(big, train_bytes)
    t0 = time.perf_counter()
    tok = BPETokenizer.from_corpus(text, 1024)
    r["train_slice_bytes"] = train_bytes
    r["train_slice_s"] = time.perf_counter() - t0
    print(f"== generated corpus: train 1024 merges on the first {train_bytes / 1e6:.0f} MB: {r['train_slice_s']:.2f} s")
    tok_path = OUT / f"tok_{train_bytes // 1_000_000}m.json"
    tok.save(tok_path)
    sl = text[:chapter_slice]
    nb = len(sl.encode("utf-8"))
    t0 = time.perf_counter()
    ch_ids = ChapterEncoder(tok.chars, tok.merges).encode_corpus(sl)
    t_ch = time.perf_counter() - t0
    t0 = time.perf_counter()
    us_ids = BPETokenizer.from_state(tok.state()).encode_corpus(sl)
    t_us = time.perf_counter() - t0
    assert ch_ids.tolist() == us_ids.tolist()
    r.update(slice_bytes=nb, slice_chapter_s=t_ch, slice_ours_s=t_us)
    print(
        f"  encode {nb / 1e6:.0f} MB in memory: chapter {t_ch:.2f} s ({mb(nb, t_ch):.1f} MB/s), "
        f"ours {t_us:.2f} s ({mb(nb, t_us):.1f} MB/s)  x{t_ch / t_us:.1f}"
    )
    del text, sl, ch_ids, us_ids
    runs = {}
    for w in workers_list:
        res = run_encode_child(big, tok_path, w, chunk_bytes)
        runs[w] = res
        print(
            f"  encode_chunk {r['bytes'] / 1e6:.0f} MB workers={w}: {res['seconds']:.1f} s "
            f"({mb(r['bytes'], res['seconds']):.1f} MB/s; CPU {res['cpu_s']:.1f} s), tokens={res['tokens']:,}, "
            f"chunks={res['chunks']}, checksum {res['checksum']}\n"
            f"      peak memory of the {res['processes']} processes: PSS sum {res['tree_peak_pss_mb']:.0f} MB, "
            f"RSS sum {res['tree_peak_rss_mb']:.0f} MB, sum of per-process VmHWM {res['sum_vmhwm_mb']:.0f} MB"
        )
    if len(runs) > 1:
        ws = sorted(runs)
        same = len({(runs[w]["checksum"], runs[w]["tokens"]) for w in ws}) == 1
        print(
            f"  identical ids across workers: {same}; wall speed-up workers={ws[-1]} vs {ws[0]}: "
            f"x{runs[ws[0]]['seconds'] / runs[ws[-1]]['seconds']:.2f}; CPU used x"
            f"{runs[ws[-1]]['cpu_s'] / runs[ws[0]]['cpu_s']:.2f} (load average now {os.getloadavg()[0]:.1f} "
            f"on {os.cpu_count()} cores)"
        )
        r["identical_across_workers"] = same
    first = runs[min(runs)]
    print(
        f"  chars skipped by the {train_bytes / 1e6:.0f} MB tokenizer: {first['skipped_distinct']} distinct, "
        f"{first['skipped_positions']:,} / {first['chars']:,} positions"
    )
    r["encode_runs"] = {str(k): v for k, v in runs.items()}
    results["generated"] = r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="BPE speed bench")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-chapter-train", action="store_true", help="skip the slow chapter trainer")
    ap.add_argument("--big-bytes", type=int, default=500_000_000, help="generated corpus size (0 = skip part 2)")
    ap.add_argument("--train-bytes", type=int, default=50_000_000)
    ap.add_argument("--chapter-slice", type=int, default=20_000_000, help="chars for the in-memory encode race")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--chunk-bytes", type=int, default=8 << 20)
    ap.add_argument("--encode-child", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--only-encode", action="store_true", help="part 2's file encodes only (needs the files)")
    args = ap.parse_args(argv)
    if args.encode_child:
        p, t, w, c = args.encode_child
        encode_child(p, t, int(w), int(c))
        return 0
    results: dict = {"cpu_count": os.cpu_count(), "load_avg_start": os.getloadavg()}
    if args.only_encode:
        big = OUT / f"wiki{args.big_bytes // 1_000_000}m.txt"
        tok_path = OUT / f"tok_{args.train_bytes // 1_000_000}m.json"
        for w in [int(w) for w in args.workers.split(",")]:
            res = run_encode_child(big, tok_path, w, args.chunk_bytes)
            print(f"workers={w}: {json.dumps(res)}  load {os.getloadavg()[0]:.1f}", flush=True)
        return 0
    part1(results, args.repeat, not args.skip_chapter_train)
    if args.big_bytes:
        part2(
            results,
            args.big_bytes,
            args.train_bytes,
            [int(w) for w in args.workers.split(",")],
            args.chunk_bytes,
            args.chapter_slice,
        )
    results["load_avg_end"] = os.getloadavg()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bpe_speed.json").write_text(json.dumps(results, indent=2))
    print(f"results: {OUT / 'bpe_speed.json'}   load average {results['load_avg_start']} -> {results['load_avg_end']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
