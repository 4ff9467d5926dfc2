"""The model stage alone, as the flow runs it at full scale (``steps=1``, ``eval_batches=1``), on an artifact root
kept by ``bench.full_scale --keep``: stage seconds, the peak resident memory above the process's memory before the
stage, where the memory grew (what this process's main thread was running when it did), and the sha256 of the
published ``model.ckpt`` (compare it across code versions: training is bit-exact on the CPU).

    flock /tmp/wiki-bench.lock .venv/bin/python -m bench.model_stage bench/out/full-scale-art-XXXX [--repeats 3]

``--no-preimport`` leaves torch to the stage (by default torch and what AdamW imports are imported first, so
the stage is timed without torch's import). Each repeat rebuilds the version (``force``); a fresh process per
measurement is the fair comparison (later repeats reuse the memory the first one left).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import sys
import threading
import time
from pathlib import Path


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Sampler(threading.Thread):
    """Every 5 ms: (time, RSS in KiB, the innermost frame of this repository's code on the main thread)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.main = threading.get_ident()
        self.samples: list[tuple[float, int, str]] = []
        self.stop = threading.Event()

    def where(self) -> str:
        frame = sys._current_frames().get(self.main)
        while frame is not None:
            name = frame.f_code.co_filename
            if "site-packages" not in name and ("/mygpt/" in name or "/tasks/" in name):
                return f"{Path(name).name}:{frame.f_code.co_name}"
            frame = frame.f_back
        return "(other)"

    def run(self) -> None:
        while not self.stop.wait(0.005):
            self.samples.append((time.perf_counter(), rss_kib(), self.where()))


def ref(root: Path, stage: str) -> dict:
    versions = [p for p in (root / stage).iterdir() if (p / "manifest.json").is_file()]
    if len(versions) != 1:
        raise SystemExit(
            f"error: {root / stage} holds {len(versions)} versions; give a root kept by one full_scale run"
        )
    manifest = json.loads((versions[0] / "manifest.json").read_text())
    return {"stage": stage, "version": versions[0].name, "build_id": manifest["build_id"], "path": str(versions[0])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="an artifact root kept by bench.full_scale --keep")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--no-preimport", action="store_true", help="let the stage import torch itself")
    args = ap.parse_args(argv)
    if not (args.root / "shards").is_dir():
        raise SystemExit(f"error: {args.root} has no shards stage; keep a root with bench.full_scale --keep")

    from tasks.core.settings import RunOptions
    from tasks.registry import BY_NAME

    if not args.no_preimport:
        import torch._dynamo
        import torch.optim  # noqa: F401

    sampler = Sampler()
    sampler.start()
    stage = BY_NAME["model"]
    shards, tokenizer = ref(args.root, "shards"), ref(args.root, "tokenizer")
    run = RunOptions(artifacts_dir=str(args.root), force=["model"])
    for r in range(args.repeats):
        before, first = rss_kib(), len(sampler.samples)
        t0 = time.perf_counter()
        out = stage.task.fn(shards, tokenizer, stage.settings(steps=1, eval_batches=1), run)
        t1 = time.perf_counter()
        window = [s for s in sampler.samples[first:] if s[0] <= t1] or [(t1, rss_kib(), "(other)")]
        peak = max(window, key=lambda s: s[1])
        grew: collections.Counter[str] = collections.Counter()
        last = before
        for _, kib, where in window:
            grew[where] += kib - last
            last = kib
        sha = hashlib.sha256((Path(out["path"]) / "model.ckpt").read_bytes()).hexdigest()
        print(
            f"run {r}: stage {t1 - t0:.2f} s; RSS before {before // 1024} MB, peak +{(peak[1] - before) // 1024} MB "
            f"at {peak[0] - t0:.2f} s; model.ckpt sha256 {sha[:16]}"
        )
        print("  RSS growth by where the main thread was (MB): " + ", ".join(
            f"{k} {v // 1024:+d}" for k, v in grew.most_common(8) if abs(v) >= 1024
        ))  # fmt: skip
    sampler.stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
