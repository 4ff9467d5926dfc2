"""Time to the model stage's first step on an ``s3://`` root against the number of shards: the shared test text
(13 train shards of ``--shard-tokens``) and its train split eleven times over (134 shards of the same size), both in a
moto S3 server on 127.0.0.1, the model stage run with the same settings on an empty cache each time (as another
machine would). Streaming makes the two equal: the first step waits for its first block only.

    flock /tmp/wiki-bench.lock .venv/bin/python -m bench.stream_first_step [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

MODEL = {
    "embed_dim": 32,
    "num_layers": 1,
    "num_heads": 2,
    "num_kv_heads": 1,
    "max_seq_len": 32,
    "steps": 5,
    "batch_size": 8,
    "seq_len": 32,
    "print_every": 1,
    "eval_every": 0,
    "checkpoint_every": 0,
}


def _moto(port: int) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen(
        [str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    for _ in range(150):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=2).close()
            return proc
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("moto_server did not start")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--shard-tokens", type=int, default=50_000)
    args = ap.parse_args(argv)

    from flows.mirror import MEMBER, make_zip, wikitext_splits
    from flows.server import free_port
    from tasks.core.settings import RunOptions
    from tasks.core.stage import BuildContext
    from tasks.registry import BY_NAME, open_store

    port = free_port()
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    moto = _moto(port)
    tmp = Path(tempfile.mkdtemp(prefix="stream-bench-"))
    first: dict[str, float] = {}
    report = BuildContext.progress

    def progress(self, done, total, message="", force=False):
        if self.stage == "model" and done == 1 and "step" not in first:
            first["step"] = time.perf_counter()
        return report(self, done, total, message, force)

    BuildContext.progress = progress  # type: ignore[method-assign]
    try:
        import boto3

        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        boto3.client("s3").create_bucket(Bucket=bucket)
        root = f"s3://{bucket}/art"
        splits = wikitext_splits()

        def call(name, *inputs, **settings):
            stage = BY_NAME[name]
            run = RunOptions(artifacts_dir=root, workers=1, threads=1)
            return stage.task.fn(*inputs, stage.settings(**settings), run)

        built = {}
        for times in (1, 11):
            os.environ["WIKI_PIPELINE_CACHE"] = str(tmp / f"builder-{times}")
            members = {MEMBER.format(split=s): splits[s] * (times if s == "train" else 1) for s in splits}
            (tmp / f"c{times}.zip").write_bytes(make_zip(members))
            corpus = call("corpus", source_url=(tmp / f"c{times}.zip").as_uri())
            tokenizer = call("tokenizer", corpus, num_merges=48, bpe_train_bytes=200_000)
            shards = call("shards", corpus, tokenizer, shard_tokens=args.shard_tokens)
            m = open_store(root).get("shards", shards["version"]).manifest
            built[len([f for f in m["files"] if f.startswith("train-")])] = (shards, tokenizer)
        results: dict[int, list[float]] = {n: [] for n in built}
        for r in range(-1, args.repeats):  # run -1 warms up (imports, first model): not counted
            for n, (shards, tokenizer) in built.items():  # interleaved: a change in load hits both alike
                os.environ["WIKI_PIPELINE_CACHE"] = str(tmp / f"trainer-{n}-{r}")  # an empty cache
                first.clear()
                t0 = time.perf_counter()
                call("model", shards, tokenizer, **MODEL, seed=100 + r)
                if r >= 0:
                    results[n].append(first["step"] - t0)
        for n, seconds in results.items():
            print(f"{n} train shards: stage start -> step 1 " + ", ".join(f"{s:.2f}" for s in seconds) + " s")
        (a, sa), (b, sb) = results.items()
        ma, mb = statistics.median(sa), statistics.median(sb)
        print(f"median: {a} shards {ma:.3f} s, {b} shards {mb:.3f} s; ratio {mb / ma:.3f}")
    finally:
        BuildContext.progress = report  # type: ignore[method-assign]
        moto.terminate()
        moto.wait(10)
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
