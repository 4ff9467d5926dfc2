"""The numbers people read about a training run: FLOPs per token (``6N + 12*L*H*Q*T``), achieved TFLOP/s, MFU,
bits per byte, and a lower bound of training memory. Formulas: docs/TRAINING.md. Imports no torch at import."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

__all__ = [
    "FLOPS_FORMULA",
    "GPU_BF16_PEAK_TFLOPS",
    "PEAK_ENV",
    "TrainingMemory",
    "bits_per_byte",
    "flops_per_token",
    "format_throughput",
    "is_mig",
    "machine_memory",
    "matmul_params",
    "peak_for_name",
    "peak_tflops",
    "throughput",
    "training_memory",
]

FLOPS_FORMULA = "6N + 12*L*H*Q*T"
PEAK_ENV = "MYGPT_PEAK_TFLOPS"

#: Dense bf16 tensor-core peak in TFLOP/s (no sparsity), matched as a substring of
#: ``torch.cuda.get_device_name()``; the first match wins, so each specific part (``H200 NVL``, ``GB200``,
#: ``RTX 4090 D``) comes before its family's name (``H200``, ``B200``, ``RTX 4090``): no entry is a substring of a
#: later one. Whole GPUs only: a MIG slice (``... MIG 1g.10gb``) has a fraction of the SMs, see :func:`peak_for_name`.
#: GeForce cards: fp16/bf16 with fp32 accumulate, what bf16 autocast training runs at (their fp16-accumulate rate,
#: twice as high, is not); ``RTX 4090 D`` (114 SMs) and ``RTX 3090 Ti`` (84 SMs at 1.86 GHz) are their base card's
#: 512 FLOPs per SM per clock at their own SM counts and boost clocks.
GPU_BF16_PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GH200", 989.0),
    ("H200 NVL", 835.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H800 PCIe", 756.0),
    ("H800", 989.0),
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("RTX 4090 D", 147.1),
    ("RTX 4090", 165.2),
    ("RTX 3090 Ti", 80.0),
    ("RTX 3090", 71.0),
)


def matmul_params(model) -> int:
    """``N`` of the formula: the model's parameters minus a learned position embedding."""
    n = model.num_params()
    pos = getattr(model, "position_embedding", None)
    if pos is not None:
        n -= pos.weight.numel()
    return n


def flops_per_token(model, seq_len: int) -> int:
    """``6N + 12*L*H*Q*T`` training FLOPs per token for ``model`` at sequence length ``seq_len``."""
    head_dim = model.embed_dim // model.num_heads
    return 6 * matmul_params(model) + 12 * model.num_layers * model.num_heads * head_dim * seq_len


def peak_tflops(device) -> tuple[float | None, str]:
    """``(peak bf16 TFLOP/s of one device or None, a description)`` for a ``torch.device``."""
    env = os.environ.get(PEAK_ENV, "").strip()
    if getattr(device, "type", str(device)) != "cuda":
        return None, f"no peak known for {getattr(device, 'type', device)}"
    import torch

    name = torch.cuda.get_device_name(device)
    if env:
        try:
            value = float(env)
        except ValueError:
            value = float("nan")
        if math.isfinite(value) and value > 0:
            return value, f"{name}, {PEAK_ENV}={env}"
    peak = peak_for_name(name)
    if peak is not None:
        return peak, name
    if is_mig(name):
        return None, f"{name} is a MIG slice, whose peak is not its GPU's (set {PEAK_ENV})"
    return None, f"{name} is not in mygpt.metrics.GPU_BF16_PEAK_TFLOPS (set {PEAK_ENV})"


def is_mig(name: str) -> bool:
    """Whether a CUDA device name is a MIG slice's (``NVIDIA H100 80GB HBM3 MIG 1g.10gb``)."""
    return " MIG " in f" {name} "


def peak_for_name(name: str) -> float | None:
    """The table's peak for a CUDA device name, or ``None``: also for a MIG slice, whose share of the GPU's SMs
    is not its ``g`` count / 7 (a 1g slice of an H100 has 16 of 132 SMs), so an MFU from any table figure would be
    wrong; ``MYGPT_PEAK_TFLOPS`` gives the slice's."""
    if is_mig(name):
        return None
    return next((peak for key, peak in GPU_BF16_PEAK_TFLOPS if key in name), None)


def throughput(tokens_per_sec: float, flops_per_tok: int, peak: float | None, world_size: int = 1) -> dict:
    """``{"tflops": achieved TFLOP/s, "mfu": fraction of world_size x peak or None}``."""
    achieved = tokens_per_sec * flops_per_tok
    mfu = achieved / (peak * 1e12 * world_size) if peak and achieved > 0 else None
    return {"tflops": achieved / 1e12, "mfu": mfu}


def bits_per_byte(nats: float, num_bytes: float) -> float | None:
    """``nats / (ln 2 * num_bytes)``; ``None`` when there are no bytes."""
    return nats / (math.log(2) * num_bytes) if num_bytes > 0 else None


def format_throughput(
    tokens_per_sec: float,
    flops_per_tok: int,
    tflops: float,
    mfu: float | None,
    peak: float | None,
    peak_note: str,
    world_size: int = 1,
    span: str = "",
) -> str:
    """One log line: tokens/s (``span``: over what, e.g. `` over steps 2-100 (...)``), FLOPs/token (with the
    formula), achieved TFLOP/s and MFU."""
    procs = f" ({world_size} processes)" if world_size > 1 else ""
    if mfu is not None and peak:
        devices = f"{world_size} x " if world_size > 1 else ""
        mfu_text = f"MFU {100 * mfu:.1f}% of {devices}{peak:g} TFLOP/s bf16 peak ({peak_note})"
    else:
        mfu_text = f"MFU n/a ({peak_note})"
    return (
        f"throughput: {tokens_per_sec:,.0f} tokens/s{procs}{span}, {flops_per_tok:,} FLOPs/token "
        f"({FLOPS_FORMULA}), {tflops:.3g} TFLOP/s, {mfu_text}"
    )


@dataclass(frozen=True)
class TrainingMemory:
    """:func:`training_memory`'s lower bound for one training process, in bytes, by part."""

    state: int
    positions: int
    activations: int

    @property
    def total(self) -> int:
        return self.state + self.positions + self.activations


def training_memory(config, rows: int, seq_len: int, precision: str = "fp32") -> TrainingMemory:
    """At least what one process training a ``GPTConfig`` on ``rows`` x ``seq_len`` tokens per forward pass holds
    (see the module docstring). Plain integer arithmetic: nothing is allocated, any size is fine."""
    act = 2 if precision == "bf16" else 4
    kv = (config.num_kv_heads or config.num_heads) * config.head_dim
    learned = config.max_seq_len * config.embed_dim if config.position_type == "learned" else 0
    positions = 16 * learned if learned else 4 * config.max_seq_len * config.head_dim
    per_token = config.num_layers * (12 * config.embed_dim + 2 * kv) * act + 8 * config.vocab_size
    return TrainingMemory(
        state=16 * (config.num_params() - learned), positions=positions, activations=rows * seq_len * per_token
    )


def machine_memory(device) -> tuple[int | None, str]:
    """``(bytes, what they are)`` a training process on ``device`` (a ``torch.device`` or its name) can use at
    most: what is free on the GPU on CUDA (other processes and the CUDA context hold the rest), else this machine's
    physical memory (``os.sysconf``; MPS shares it); ``(None, ...)`` where it cannot be read."""
    kind = getattr(device, "type", str(device).split(":")[0])
    if kind == "cuda":
        import torch

        index = getattr(device, "index", None)
        index = index if index is not None else torch.cuda.current_device()
        free, total = torch.cuda.mem_get_info(index)
        name = torch.cuda.get_device_name(index)
        return int(free), f"free on the GPU ({name}, {total / 2**30:,.1f} GiB in all)"
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - no sysconf (Windows)
        return None, "of memory on this machine (unknown)"
    return int(total), "of memory on this machine"
