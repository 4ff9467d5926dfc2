"""``TrainConfig``, the training recipe, and its learning-rate schedule; torch-free.

Learning rate at 1-based step ``s`` with peak ``lr``, ``warmup`` steps and ``steps`` in all: ``lr * s / warmup``
while ``s <= warmup``; then ``lr`` (constant) or ``lr * 0.5 * (1 + cos(pi * (s - warmup) / (steps - warmup)))``
(cosine, 0 at ``s == steps``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from mygpt.errors import UserError
from mygpt.gpt_config import MAX_SEQ_LEN
from mygpt.limits import PRECISIONS
from mygpt.options import check_options, option

__all__ = ["SCHEDULES", "TrainConfig", "lr_at"]

SCHEDULES = ("constant", "cosine")
# The pipeline's upper bounds of the float fields (Option.le): far above any useful value, far below an overflow.
# AdamW moves each weight by about lr a step (weights start near 0.02) and multiplies it by 1 - lr * weight_decay;
# no gradient norm of a finite model reaches MAX_GRAD_NORM (0 is how to say "no clipping").
MAX_LR = 1.0
MAX_WEIGHT_DECAY = 1.0
MAX_GRAD_NORM = 1e6
# The integer fields' upper bounds, generous but finite: a run past them is none anyone waits for, and without
# them steps=10**30 passed every check and trained until killed.
MAX_STEPS = 10**9  # every count of steps: 100,000 times the chapter's 10,000
MAX_ROWS = 1 << 20  # sequences per step (and batches per estimate): check_memory refuses far fewer on any machine


@dataclass(frozen=True)
class TrainConfig:
    """Training hyper-parameters; defaults are the chapter's Part I ones. Building one checks it (``UserError``).

    ``batch_size`` is the global batch (all processes together).
    """

    steps: int = option(2000, "optimizer steps; the chapter trains 10000", ge=1, le=MAX_STEPS)
    batch_size: int = option(16, "sequences per step; the chapter uses 16", ge=1, le=MAX_ROWS)
    seq_len: int = option(
        64, "tokens per training sequence; <= max_seq_len; the chapter uses 256", ge=1, le=MAX_SEQ_LEN
    )
    lr: float = option(
        1e-3,
        "AdamW peak learning rate; 1e-3 is what the chapter's printed run used (its table says 3e-4)",
        gt=0,
        le=MAX_LR,
    )
    schedule: str = option("constant", "learning-rate schedule after warmup", choices=SCHEDULES)
    warmup: int = option(0, "linear warmup steps; the chapter uses 500", ge=0, le=MAX_STEPS)
    max_grad_norm: float = option(0.0, "gradient clipping norm; 0 = no clipping", ge=0, le=MAX_GRAD_NORM)
    precision: str = option(
        "fp32",
        "fp32 or bf16 autocast; auto = bf16 where native (cuda 8.0+, mps on macOS 14+), else fp32",
        choices=PRECISIONS,
    )
    print_every: int = option(500, "record the training loss every N steps", ge=0, le=MAX_STEPS)
    eval_every: int = option(0, "validation loss every N steps; 0 = at every print point", ge=0, le=MAX_STEPS)
    eval_batches: int = option(20, "batches per validation estimate", ge=1, le=MAX_ROWS)
    checkpoint_every: int = option(
        0,
        "resume checkpoint every N steps (a crash costs at most that many); 0 = at the end only",
        ge=0,
        le=MAX_STEPS,
    )
    seed: int = option(1337, "initial weights and batch order")
    weight_decay: float = option(0.01, "AdamW weight decay", ge=0, le=MAX_WEIGHT_DECAY)
    micro_batch_size: int = option(
        0,
        "rows per forward pass in each process, gradients accumulated; 0 = all of the process's rows at once",
        ge=0,
        le=MAX_ROWS,
    )
    compile: bool = option(False, "torch.compile the model (a warning and eager training where it is unavailable)")
    fused: bool = option(
        True,
        "fused AdamW step and one foreach gradient clip (equal to the per-parameter loop within float rounding); "
        "off = the loop",
    )
    tf32: bool = option(True, "TF32 matmuls on CUDA (ignored elsewhere)")

    def __post_init__(self) -> None:
        check_options(self)
        if not isinstance(self.lr, (int, float)) or not math.isfinite(self.lr) or self.lr <= 0:
            raise UserError(f"lr must be a positive number, got {self.lr!r}")
        if not isinstance(self.max_grad_norm, (int, float)) or not self.max_grad_norm >= 0:
            raise UserError(f"max_grad_norm must be >= 0 (0 = no clipping), got {self.max_grad_norm!r}")
        if not isinstance(self.weight_decay, (int, float)) or not self.weight_decay >= 0:
            raise UserError(f"weight_decay must be >= 0, got {self.weight_decay!r}")

    @classmethod
    def from_dict(cls, values: dict, what: str = "train config") -> TrainConfig:
        """A config from a dict of its fields; ``UserError`` naming unknown keys."""
        if not isinstance(values, dict):
            raise UserError(f"{what} must be an object of TrainConfig fields, got {type(values).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise UserError(f"{what} has unknown TrainConfig field(s) {unknown}; known: {sorted(names)}")
        return cls(**values)


def lr_at(config: TrainConfig, step: int) -> float:
    """Learning rate for 1-based ``step`` (see the module docstring)."""
    if config.warmup > 0 and step <= config.warmup:
        return config.lr * step / config.warmup
    if config.schedule == "constant":
        return config.lr
    span = config.steps - config.warmup
    progress = min(max((step - config.warmup) / span, 0.0), 1.0) if span > 0 else 1.0
    return config.lr * 0.5 * (1.0 + math.cos(math.pi * progress))
