"""The first thing to run where a CUDA GPU is lent: the chapter's model trained for a few hundred steps in bf16 and
fp32, eager and compiled, on one GPU and (with several) on all of them under torchrun; one table of tokens/s, MFU,
the warm-up step, peak memory and losses, then the loss gap bf16 vs fp32.

Each row is ``mygpt.training.launcher.run_training`` (the pipeline's own path) on a character-level tokenisation of
``--text`` (Tiny Shakespeare from the shared data by default), with the chapter's model (embed 192, 4 layers, 6
heads, 2 kv heads, RMSNorm, RoPE, max_seq_len 256) and recipe (batch 16 x 256 tokens, lr 1e-3, warmup then cosine,
clipping 1.0). Throughput leaves the warm-up step out (it is its own column); MFU is against the GPU's bf16 peak
(``mygpt.metrics``). The loss gap compares the validation loss of each bf16 row with the fp32 row of the same
compile setting and process count: on a GPU they agree per step at first and statistically after (docs/TRAINING.md).

    .venv/bin/python -m bench.gpu_check --dry-run          # the plan, on any machine (no training)
    .venv/bin/python -m bench.gpu_check                    # on a CUDA machine: the table (a few minutes)
    .venv/bin/python -m bench.gpu_check --steps 500 --nproc 1
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flows.mirror import SHARED_DATA
from mygpt import CharTokenizer, GPTConfig, TrainConfig, UserError
from mygpt.metrics import training_memory

#: The chapter's model (its vocabulary comes from the text's tokenizer).
CHAPTER_MODEL = dict(
    embed_dim=192, num_layers=4, num_heads=6, num_kv_heads=2, max_seq_len=256, norm_type="rms", position_type="rope"
)  # fmt: skip
#: The chapter's recipe, scaled to ``--steps`` (warmup: a tenth of them).
CHAPTER_RECIPE = dict(batch_size=16, seq_len=256, lr=1e-3, schedule="cosine", max_grad_norm=1.0, eval_batches=20)


@dataclass(frozen=True)
class Row:
    nproc: int
    precision: str
    compile: bool

    @property
    def label(self) -> str:
        gpus = f"{self.nproc} GPU{'s' if self.nproc > 1 else ''}"
        return f"{gpus} {self.precision} {'compiled' if self.compile else 'eager'}"


def plan(gpus: int, nproc: str) -> list[Row]:
    """One GPU: fp32 and bf16, eager and compiled; all ``gpus`` (when more than one and ``nproc`` allows): bf16
    and fp32 again, so each process count has its own loss gap."""
    counts = [1] if nproc == "1" or gpus < 2 else ([gpus] if nproc == "all" else [1, gpus])
    return [Row(n, p, c) for n in counts for c in (False, True) for p in ("fp32", "bf16")]


def recipe(steps: int, precision: str, compile_: bool) -> TrainConfig:
    every = max(1, steps // 5)
    return TrainConfig(
        **CHAPTER_RECIPE,
        steps=steps,
        warmup=max(1, steps // 10),
        precision=precision,
        compile=compile_,
        print_every=every,
        eval_every=every,
    )


def _data(text_path: Path, work: Path) -> tuple[Path, Path, Path, int]:
    """A char tokenizer file and train/validation token files (90/10) of ``text_path``; ``(..., vocab_size)``."""
    from mygpt.tokenizers.files import save_tokenizer_file

    if not text_path.is_file():
        raise UserError(f"--text {text_path} is not a file; pass a UTF-8 text (Tiny Shakespeare is the default)")
    text = text_path.read_text(encoding="utf-8")
    tok = CharTokenizer.from_text(text)
    ids = tok.encode_array(text).astype(train_dtype(tok.vocab_size))
    cut = len(ids) * 9 // 10
    paths = work / "tokenizer.json", work / "train.bin", work / "valid.bin"
    save_tokenizer_file(tok, paths[0])
    ids[:cut].tofile(paths[1])
    ids[cut:].tofile(paths[2])
    return *paths, tok.vocab_size


def run_row(row: Row, steps: int, data: tuple[Path, Path, Path, int], work: Path, device: str = "cuda") -> dict:
    from mygpt.training.job import TrainJob
    from mygpt.training.launcher import run_training

    tokenizer, train, valid, vocab = data
    out = work / f"row-{row.nproc}-{row.precision}-{int(row.compile)}"
    out.mkdir()
    job = TrainJob(
        tokenizer=str(tokenizer),
        train_tokens=[str(train)],
        val_tokens=str(valid),
        token_dtype=train_dtype(vocab),
        model=GPTConfig(vocab_size=vocab, **CHAPTER_MODEL),
        train=recipe(steps, row.precision, row.compile),
        device=device,
        checkpoint=str(out / "train.ckpt"),
        resume=False,
    )
    warnings: list[str] = []
    r = run_training(job, row.nproc, log=lambda m: warnings.append(m) if m.startswith("warning: ") else None)
    return {
        "row": row.label,
        "nproc": row.nproc,
        "precision": r.precision,
        "compiled": r.compiled,
        "steps": r.steps,
        "tokens_per_sec": r.tokens_per_sec,
        "mfu": r.mfu,
        "warmup_seconds": r.warmup_seconds,
        "peak_memory_gib": r.peak_memory / 2**30 if r.peak_memory else None,
        "final_loss": r.final_loss,
        "final_val_loss": r.final_val_loss,
        "warnings": warnings,
    }


def train_dtype(vocab: int) -> str:
    return "uint16" if vocab <= 2**16 else "uint32"


def loss_gaps(rows: list[dict]) -> list[str]:
    """``bf16 - fp32`` validation loss for each (process count, compile) pair that has both."""
    out = []
    for r in rows:
        if r["precision"] != "bf16":
            continue
        fp32 = next(
            (
                o
                for o in rows
                if o["precision"] == "fp32" and (o["nproc"], o["compiled"]) == (r["nproc"], r["compiled"])
            ),
            None,
        )
        if fp32 and fp32["final_val_loss"] is not None and r["final_val_loss"] is not None:
            gap = r["final_val_loss"] - fp32["final_val_loss"]
            out.append(f"loss gap bf16 - fp32, {r['row'].replace(' bf16', '')}: {gap:+.4f} (val loss)")
    return out


def print_table(rows: list[dict]) -> None:
    print(f"{'row':<24} {'tokens/s':>11} {'MFU':>6} {'warm-up s':>9} {'peak GiB':>8} {'loss':>7} {'val loss':>8}")
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        peak = f"{r['peak_memory_gib']:.2f}" if r["peak_memory_gib"] is not None else "n/a"
        warm = f"{r['warmup_seconds']:.2f}" if r["warmup_seconds"] is not None else "n/a"
        val = f"{r['final_val_loss']:.4f}" if r["final_val_loss"] is not None else "n/a"
        print(
            f"{r['row']:<24} {r['tokens_per_sec']:>11,.0f} {mfu:>6} {warm:>9} {peak:>8} "
            f"{r['final_loss']:>7.4f} {val:>8}"
        )
        for w in r["warnings"]:
            print(f"    {w}")
    for line in loss_gaps(rows):
        print(line)


def dry_run(steps: int, text: Path, gpus: int, nproc: str) -> None:
    """What a real run would do, checked on this machine: the text tokenised as a run would, every row's config
    built, and each row's memory lower bound per GPU. Without a GPU the rows are planned for two."""
    planned = gpus or 2
    print(f"dry run: {gpus} CUDA GPU(s) visible here; rows planned for {planned}; a real run needs a CUDA GPU")
    with tempfile.TemporaryDirectory(prefix="mygpt-gpu-check-") as tmp:
        _tokenizer, train, valid, vocab = _data(text, Path(tmp))
        size = np.dtype(train_dtype(vocab)).itemsize
        n_train, n_val = (p.stat().st_size // size for p in (train, valid))
    model = GPTConfig(vocab_size=vocab, **CHAPTER_MODEL)
    print(f"text: {text}: {n_train:,} training and {n_val:,} validation tokens, {vocab} characters")
    print(f"model: the chapter's, {model.num_params():,} parameters")
    rows = plan(planned, nproc)
    for row in rows:
        config = recipe(steps, row.precision, row.compile)
        need = training_memory(model, -(-config.batch_size // row.nproc), config.seq_len, row.precision)
        print(
            f"  {row.label:<24} steps {config.steps} (warmup {config.warmup}), batch {config.batch_size} x "
            f"{config.seq_len}, validation every {config.eval_every}; at least {need.total / 2**30:.2f} GiB per GPU"
        )
    print(f"then: {len(rows)} rows of tokens/s, MFU, warm-up, peak memory and losses, and the bf16 - fp32 loss gaps")
    print("for real, on a CUDA machine: .venv/bin/python -m bench.gpu_check")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="print the plan and check it here; no training")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per row (default 300)")
    p.add_argument("--nproc", choices=("1", "all", "both"), default="both", help="one GPU, all GPUs, or both rows")
    p.add_argument("--text", type=Path, default=SHARED_DATA / "tinyshakespeare.txt", help="the training text")
    p.add_argument("--json", action="store_true", help="also print the rows as JSON")
    args = p.parse_args(argv)
    try:
        import torch

        from mygpt.device import no_cuda_reason
        from mygpt.limits import accelerator_evidence

        if args.steps < 2:
            raise UserError(f"--steps must be >= 2 (the first is the warm-up), got {args.steps}")
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if args.dry_run:
            if not gpus:
                print(f"note: {no_cuda_reason(accelerator_evidence())}")
            dry_run(args.steps, args.text, gpus, args.nproc)
            return 0
        rows = plan(gpus, args.nproc)
        if not torch.cuda.is_available():
            raise UserError(f"{no_cuda_reason(accelerator_evidence())}; --dry-run shows the plan")
        print(f"{torch.cuda.get_device_name(0)} x {gpus}, torch {torch.__version__}, CUDA {torch.version.cuda}")
        with tempfile.TemporaryDirectory(prefix="mygpt-gpu-check-") as tmp:
            work = Path(tmp)
            data = _data(args.text, work)
            results = [run_row(row, args.steps, data, work) for row in rows]
        print_table(results)
        if args.json:
            print(json.dumps(results, indent=2))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
