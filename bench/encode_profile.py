"""Where the shards stage's CPU goes, one process at a time: a Dask worker's share of the chapter tokenizer's encode,
and the flow process's Parquet write, each under cProfile (the profile that guides the encode work).

    flock /tmp/wiki-bench.lock .venv/bin/python -m bench.encode_profile ROOT [--workers 2] [--shards 3] [--top 20]

ROOT: an artifact root that holds a corpus version and a chapter (word-level) tokenizer version, e.g. the one
``bench.full_scale --keep`` leaves. Part 1 encodes, in this process, the chunks of the train split (cut as the stage
cuts them, ``DEFAULT_CHUNK_BYTES``) that one of ``--workers`` workers gets: every ``workers``-th one (Dask hands them
out in turn, about evenly), with one tokenizer kept from chunk to chunk, as a worker keeps it. Part 2 writes the
first ``--shards`` shards of those ids as the flow process writes them (``shard_format.write_shard``, into a
temporary folder). For each part: CPU seconds, MB of text per CPU second, and the functions that took the most time
of their own (numpy and Arrow calls are counted in the Python function that makes them). The load average before
and after is printed: run it under the flock, on a quiet machine.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

import numpy as np


def fail(message: str) -> NoReturn:
    """One ``error:`` line and exit code 2, as the project's CLIs."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def version_dir(root: Path, stage: str) -> Path:
    """The newest published version of ``stage`` under ``root``, as the store lists them (a manifest it accepts:
    a build still under way or left half-written is not one)."""
    from tasks.registry import open_store

    found = open_store(root).versions(stage)
    if not found:
        fail(f"no published {stage} version in {root}; run bench.full_scale --keep and pass its root")
    return Path(found[-1].path)


def top(profile: cProfile.Profile, n: int) -> str:
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(n)
    return "\n".join(line for line in out.getvalue().splitlines() if line.strip())


def main(argv=None) -> int:
    from mygpt.tokenizers.bpe_chunks import chunk_bounds, encode_chunk
    from tasks.core import shard_format
    from tasks.dask.work import DEFAULT_CHUNK_BYTES
    from tasks.tokenizer import load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--workers", type=positive, default=2)
    ap.add_argument("--shards", type=positive, default=3)
    ap.add_argument("--shard-tokens", type=positive, default=10_000_000)
    ap.add_argument("--top", type=positive, default=20)
    args = ap.parse_args(argv)
    corpus = version_dir(args.root, "corpus") / "wiki.train.txt"
    tok = load_tokenizer(version_dir(args.root, "tokenizer"))
    if tok.kind == "byte":
        fail("the tokenizer version is byte-level; this profiles the chapter's word-level tokenizer")
    print(f"load average before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs")

    share = list(chunk_bounds(corpus, DEFAULT_CHUNK_BYTES))[:: args.workers]
    ids: list[np.ndarray] = []
    nbytes = 0
    prof = cProfile.Profile()
    cpu = time.process_time()
    prof.enable()
    for _, start, end in share:
        chunk_ids, _ = encode_chunk(tok, corpus, start, end, "skip")
        ids.append(chunk_ids)
        nbytes += end - start
    prof.disable()
    cpu = time.process_time() - cpu
    print(
        f"\n1. a worker's share: {len(share)} chunks, {nbytes / 1e6:.0f} MB -> {cpu:.2f} CPU s "
        f"({nbytes / 1e6 / cpu:.0f} MB per CPU s)\n{top(prof, args.top)}"
    )

    flat = np.concatenate(ids)
    del ids
    prof = cProfile.Profile()
    cpu = time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        prof.enable()
        shards = 0
        for shards, at in enumerate(range(0, flat.size, args.shard_tokens)[: args.shards], 1):
            shard_format.write_shard(Path(tmp) / f"s{shards}.parquet", flat[at : at + args.shard_tokens])
        prof.disable()
    cpu = time.process_time() - cpu
    print(
        f"\n2. the flow process's write: {shards} shard(s) of up to {args.shard_tokens:,} tokens -> {cpu:.2f} "
        f"CPU s ({cpu / max(shards, 1):.3f} per shard)\n{top(prof, min(args.top, 8))}"
    )
    print(f"\nload average after: {os.getloadavg()[0]:.2f} (1 min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
