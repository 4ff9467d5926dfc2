"""Training throughput (tokens/second, TFLOP/s, MFU) of mygpt's real training loop, per configuration.

Two models from the chapter:

* ``part1`` -- the Part I model: vocab 65, embed 64, 4 layers, 4 heads, max_seq_len 64, LayerNorm, learned
  positions; seq_len 64, batch 16 (207,296 params).
* ``ch28``  -- the chapter-28 Wikipedia model: vocab 3046, embed 192, 4 layers, 6 heads, 2 kv heads,
  max_seq_len 256, RMSNorm, RoPE; seq_len 256, batch 16 (2,163,264 params).

Each row runs ``mygpt.training.launcher.run_training`` over random tokens in a flat token file (grad clipping at
1.0, AdamW) for every combination of ``--precisions`` x ``--nproc`` x ``--compile``; ``batch_size`` is the global
batch, so every row does the same work per step. The first ``--warmup-steps`` steps are not timed; a row shows the
median step time. MFU is against the detected GPU's bf16 peak (``n/a`` on CPU). ``off*`` in the compile column:
compile was asked for but is unavailable here (the row trained eagerly; the warning is printed under it).

    .venv/bin/python -m bench.train_throughput                       # the default above
    .venv/bin/python -m bench.train_throughput --device cuda --configs ch28 --precisions fp32,bf16 \\
        --nproc 1,auto --compile off,on --steps 50

``--vs-nanogpt PATH`` (a checkout of karpathy/nanoGPT) instead races one step of the ``ch28`` model against
nanoGPT's for the same shapes on the CPU, interleaved in one process (``bench.step_vs_nanogpt``): best of
``--rounds`` rounds of ``--steps`` steps each, tokens/s and the ratio, the CPU's measured fp32 matmul peak and each
step's MFU against it, and (``--profile-steps``) where a step's time goes:

    .venv/bin/python -m bench.train_throughput --vs-nanogpt /tmp/nanogpt --threads 2 --rounds 5 --steps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from mygpt import CharTokenizer, GPTConfig, TrainConfig, UserError
from mygpt.device import resolve_device, resolve_precision
from mygpt.tokenizers.files import save_tokenizer_file
from mygpt.training.job import TrainJob
from mygpt.training.launcher import resolve_nproc, run_training

#: The Part I model is the library's defaults; seq_len and batch_size are TrainConfig's or the chapter's.
CONFIGS = {
    "part1": dict(model=GPTConfig(vocab_size=65), seq_len=64, batch_size=16),
    "ch28": dict(
        model=GPTConfig(
            vocab_size=3046,
            embed_dim=192,
            num_layers=4,
            num_heads=6,
            num_kv_heads=2,
            max_seq_len=256,
            norm_type="rms",
            position_type="rope",
        ),
        seq_len=256,
        batch_size=16,
    ),
}


def measure(
    name: str,
    precision: str,
    device: str,
    nproc: int,
    compile_: bool,
    steps: int,
    warmup: int,
    threads: int,
    workdir: Path,
    seed: int = 0,
) -> dict:
    cfg = CONFIGS[name]
    vocab = cfg["model"].vocab_size
    tokenizer = workdir / f"tokenizer-{vocab}.json"
    tokens = workdir / f"tokens-{vocab}.bin"
    if not tokens.exists():
        save_tokenizer_file(CharTokenizer([chr(0x4E00 + i) for i in range(vocab)]), tokenizer)
        np.random.default_rng(seed).integers(0, vocab, size=2_000_000, dtype=np.uint16).tofile(tokens)
    bs, sl = cfg["batch_size"], cfg["seq_len"]
    config = TrainConfig(
        steps=warmup + steps,
        batch_size=bs,
        seq_len=sl,
        lr=3e-4,
        max_grad_norm=1.0,
        precision=precision,
        print_every=1,
        seed=seed,
        compile=compile_,
    )
    ckpt = workdir / "bench.ckpt"
    ckpt.unlink(missing_ok=True)
    job = TrainJob(
        tokenizer=str(tokenizer),
        train_tokens=[str(tokens)],
        model=cfg["model"],
        train=config,
        device=device,
        checkpoint=str(ckpt),
        resume=False,
        threads=threads,
    )
    points: list[dict] = []
    warnings: list[str] = []
    result = run_training(
        job,
        nproc,
        log=lambda m: warnings.append(m) if m.startswith("warning:") else None,
        on_progress=points.append,
        env={"OMP_NUM_THREADS": str(threads)},
    )
    step_seconds = [bs * sl / p["tokens_per_sec"] for p in points if p["step"] > warmup]
    median = statistics.median(step_seconds)
    tps = bs * sl / median
    return {
        "config": name,
        "params": result.params,
        "precision": result.precision,
        "device": result.device,
        "nproc": nproc,
        "compile": result.compiled,
        "threads_per_process": threads,
        "batch_size": bs,
        "seq_len": sl,
        "steps": len(step_seconds),
        "sec_per_step": median,
        "tokens_per_sec": tps,
        "flops_per_token": result.flops_per_token,
        "tflops": tps * result.flops_per_token / 1e12,
        "mfu": tps * result.flops_per_token / (result.peak_tflops * 1e12 * nproc) if result.peak_tflops else None,
        "warnings": warnings,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--steps", type=int, default=10, help="timed steps per row (default 10)")
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--configs", default="part1,ch28")
    p.add_argument(
        "--precisions",
        default="auto",
        help="comma-separated: auto, fp32, bf16 (default auto); bf16 rows are skipped where unsupported",
    )
    p.add_argument(
        "--nproc",
        default=None,
        help="comma-separated process counts, e.g. 1,2 or 1,auto (default: 1,2 on CPU, 1,auto on a GPU)",
    )
    p.add_argument("--compile", default="off,on", help="comma-separated: off, on (default off,on)")
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads per process (0 = the CPU's cores divided by nproc)"
    )
    p.add_argument("--json", action="store_true", help="also print the rows as JSON")
    p.add_argument("--vs-nanogpt", metavar="PATH", help="race the ch28 step against nanoGPT's model.py at PATH")
    p.add_argument("--rounds", type=int, default=5, help="--vs-nanogpt: interleaved rounds, best kept (default 5)")
    p.add_argument(
        "--profile-steps", type=int, default=2, help="--vs-nanogpt: steps profiled per model, 0 = none (default 2)"
    )
    args = p.parse_args(argv)
    try:
        if args.vs_nanogpt:
            from bench import step_vs_nanogpt

            for name in ("rounds", "steps"):
                if getattr(args, name) < 1:
                    raise UserError(f"--{name} must be at least 1, got {getattr(args, name)}")

            ch28: dict = CONFIGS["ch28"]
            return step_vs_nanogpt.main(
                args.vs_nanogpt,
                ch28["model"],
                ch28["batch_size"],
                ch28["seq_len"],
                rounds=args.rounds,
                steps=args.steps,
                threads=args.threads or (os.cpu_count() or 1),
                compile_=args.compile != "off",
                profile_steps=args.profile_steps,
            )
        device = resolve_device(args.device)
        nproc_list = args.nproc or ("1,2" if device.type == "cpu" else "1,auto")
        nprocs = list(dict.fromkeys(resolve_nproc(n, args.device) for n in nproc_list.split(",")))
        compiles = []
        for c in args.compile.split(","):
            if c not in ("off", "on"):
                raise UserError(f"--compile takes off and/or on, got {c!r}")
            compiles.append(c == "on")
        cores = os.cpu_count() or 1
        import torch

        print(f"device: {device}   torch {torch.__version__}   cores: {cores}")
        print(
            f"{'config':<7} {'params':>10} {'precision':<9} {'nproc':>5} {'compile':<7} {'thr':>3} "
            f"{'tokens/step':>11} {'s/step':>9} {'tokens/s':>11} {'TFLOP/s':>8} {'MFU':>6}   (median step)"
        )
        rows = []
        with tempfile.TemporaryDirectory(prefix="mygpt-bench-") as tmp:
            for name in args.configs.split(","):
                if name not in CONFIGS:
                    raise UserError(f"unknown config {name!r}; expected one of {', '.join(CONFIGS)}")
                for prec in args.precisions.split(","):
                    try:
                        prec = resolve_precision(device, prec)
                    except UserError as e:
                        print(f"{name:<7} {'':>10} {prec:<9} skipped: {e}")
                        continue
                    for n in nprocs:
                        for c in compiles:
                            threads = args.threads or max(1, cores // n)
                            r = measure(
                                name, prec, args.device, n, c, args.steps, args.warmup_steps, threads, Path(tmp)
                            )
                            rows.append(r)
                            mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
                            comp = ("on" if r["compile"] else "off*") if c else "off"
                            print(
                                f"{name:<7} {r['params']:>10,} {prec:<9} {n:>5} {comp:<7} {threads:>3} "
                                f"{r['batch_size'] * r['seq_len']:>11,} {r['sec_per_step']:>9.4f} "
                                f"{r['tokens_per_sec']:>11,.0f} {r['tflops']:>8.4f} {mfu:>6}",
                                flush=True,
                            )
                            for w in r["warnings"]:
                                print(f"        {w}")
        if args.json:
            print(json.dumps(rows, indent=2))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
