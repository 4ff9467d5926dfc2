"""Training throughput (tokens/second) of mygpt's training step on the detected device.

Two configurations from the chapter:

* ``part1`` -- the Part I model: vocab 65, embed 64, 4 layers, 4 heads, max_seq_len 64, LayerNorm, learned
  positions; seq_len 64, batch 16 (207,296 params).
* ``ch28``  -- the chapter-28 Wikipedia model: vocab 3046, embed 192, 4 layers, 6 heads, 2 kv heads,
  max_seq_len 256, RMSNorm, RoPE; seq_len 256, batch 16 (2,163,264 params).

Each is timed in fp32 and, where the device supports it, bf16 autocast. A timed step is exactly the training
loop's step (``get_batch`` from a token array, forward, backward, grad clipping at 1.0, AdamW), after a few
untimed warm-up steps; the device is synchronised before the clock is read.

    .venv/bin/python -m bench.train_throughput                       # auto device, 20 timed steps
    .venv/bin/python -m bench.train_throughput --device cpu --steps 10 --configs ch28 --precisions fp32
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from mygpt import GPT, UserError
from mygpt.data import get_batch
from mygpt.device import autocast, resolve_device, resolve_precision

CONFIGS = {
    "part1": dict(model=dict(vocab_size=65, embed_dim=64, num_layers=4, num_heads=4, max_seq_len=64),
                  seq_len=64, batch_size=16),
    "ch28": dict(model=dict(vocab_size=3046, embed_dim=192, num_layers=4, num_heads=6, num_kv_heads=2,
                            max_seq_len=256, norm_type="rms", position_type="rope"),
                 seq_len=256, batch_size=16),
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def measure(name: str, precision: str, device: torch.device, steps: int, warmup: int, seed: int = 0) -> dict:
    cfg = CONFIGS[name]
    torch.manual_seed(seed)
    model = GPT(**cfg["model"]).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda" or None)
    tokens = np.random.default_rng(seed).integers(0, cfg["model"]["vocab_size"], size=2_000_000, dtype=np.uint16)
    gen = torch.Generator().manual_seed(seed)
    bs, sl = cfg["batch_size"], cfg["seq_len"]

    def step():
        x, y = get_batch(tokens, bs, sl, gen, device)
        with autocast(device, precision):
            _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss

    for _ in range(warmup):
        step()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    loss.item()
    _sync(device)
    seconds = time.perf_counter() - t0
    return {
        "config": name, "params": model.num_params(), "precision": precision, "device": str(device),
        "batch_size": bs, "seq_len": sl, "steps": steps, "sec_per_step": seconds / steps,
        "tokens_per_sec": steps * bs * sl / seconds,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--steps", type=int, default=20, help="timed steps per row (default 20)")
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--configs", default="part1,ch28")
    p.add_argument("--precisions", default="fp32,bf16", help="bf16 rows are skipped where unsupported")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch default)")
    p.add_argument("--json", action="store_true", help="also print the rows as JSON")
    args = p.parse_args(argv)
    try:
        device = resolve_device(args.device)
        if args.threads:
            torch.set_num_threads(args.threads)
        rows = []
        print(f"device: {device}   torch {torch.__version__}   threads: {torch.get_num_threads()}")
        print(f"{'config':<7} {'params':>10} {'precision':<9} {'tokens/step':>11} {'s/step':>9} {'tokens/s':>11}")
        for name in args.configs.split(","):
            if name not in CONFIGS:
                raise UserError(f"unknown config {name!r}; expected one of {', '.join(CONFIGS)}")
            for prec in args.precisions.split(","):
                try:
                    prec = resolve_precision(device, prec)
                except UserError as e:
                    print(f"{name:<7} {'':>10} {prec:<9} skipped: {e}")
                    continue
                r = measure(name, prec, device, args.steps, args.warmup_steps)
                rows.append(r)
                print(f"{name:<7} {r['params']:>10,} {prec:<9} {r['batch_size'] * r['seq_len']:>11,} "
                      f"{r['sec_per_step']:>9.4f} {r['tokens_per_sec']:>11,.0f}", flush=True)
        if args.json:
            print(json.dumps(rows, indent=2))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
