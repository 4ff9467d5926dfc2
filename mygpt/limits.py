"""What a training run needs of this machine, checked before anything is built, torch-free.

The one home of each rule (:func:`check_seq_len`, :func:`check_nproc`, :func:`check_memory`), and
:func:`resolves_to_cpu` / :func:`cpu_precision`: the device and precision answers, without torch, where they are
the CPU (tested equal to :mod:`mygpt.device`'s).
"""

from __future__ import annotations

import glob
import os
import sys

from mygpt.errors import UserError
from mygpt.metrics import machine_memory, training_memory

__all__ = [
    "ACCELERATOR_NODES",
    "GPU_DRIVERS",
    "PRECISIONS",
    "accelerator_evidence",
    "check_memory",
    "check_nproc",
    "check_seq_len",
    "compile_may_run",
    "cpu_precision",
    "micro_batch_hint",
    "precision_name",
    "resolves_to_cpu",
    "rows_at_once",
]

PRECISIONS = ("auto", "fp32", "bf16")

#: The device nodes (globs under ``/dev``) that mean an accelerator torch could use may be here: NVIDIA's driver
#: (``nvidia0``, ``nvidiactl``, ...), NVIDIA Jetson boards' (``nvhost-*``, ``nvmap``), AMD ROCm's (``kfd``; torch's
#: ROCm build answers as CUDA), and WSL 2's GPU paravirtualisation (``dxg``, through which CUDA runs there).
ACCELERATOR_NODES = ("nvidia*", "nvhost-*", "nvmap", "kfd", "dxg")
#: A loaded GPU kernel driver, under ``/proc`` and ``/sys``: NVIDIA's ``/dev/nvidia0`` may appear only after the
#: first CUDA call (headless hosts without the persistence daemon), so a driver without a node is a GPU too.
GPU_DRIVERS = (
    ("proc", "driver/nvidia"),
    ("sys", "module/nvidia"),
    ("sys", "module/nvgpu"),
    ("sys", "module/amdgpu"),
)


def accelerator_evidence(dev: str = "/dev", proc: str = "/proc", sys_root: str = "/sys") -> str | None:
    """The first path that says this Linux machine may have a GPU (an :data:`ACCELERATOR_NODES` node or a loaded
    :data:`GPU_DRIVERS` driver), or ``None``; the roots are parameters so tests can give fake trees."""
    for pattern in ACCELERATOR_NODES:
        found = sorted(glob.glob(os.path.join(dev, pattern)))
        if found:
            return found[0]
    roots = {"proc": proc, "sys": sys_root}
    for root, rel in GPU_DRIVERS:
        path = os.path.join(roots[root], rel)
        if os.path.exists(path):
            return path
    return None


def resolves_to_cpu(device: str, dev: str = "/dev", proc: str = "/proc", sys_root: str = "/sys") -> bool:
    """Whether ``device`` runs on the CPU, known without torch (see the module docstring): ``"cpu"``, or
    ``"auto"`` on Linux with no :func:`accelerator_evidence`. ``False`` means: ask torch
    (``mygpt.device.resolve_device``), not "not the CPU"."""
    name = (device or "auto").strip().lower()
    if name == "cpu":
        return True
    if name != "auto" or not sys.platform.startswith("linux"):
        return False
    return accelerator_evidence(dev, proc, sys_root) is None


def compile_may_run(device: str) -> bool:
    """Whether ``torch.compile`` may run on ``device`` (resolved: ``cpu``, ``cuda``, ``cuda:1``, ``mps``), told
    without importing torch: on the CPU a C++ compiler (``$CXX``, else ``g++``, ``clang++`` or ``c++``) on the
    PATH, on CUDA Triton installed, never on MPS. Why torch-free: a cached rerun's flow process resolves the
    settings and must not pay for torch; the training process checks for real
    (``mygpt.device.compile_unavailable(probe=True)``) and trains eagerly, with a warning, where it cannot."""
    import importlib.util
    import shutil

    kind = device.split(":")[0]
    if kind == "cpu":
        cxx = os.environ.get("CXX")
        return any(shutil.which(c) for c in ([cxx] if cxx else ["g++", "clang++", "c++"]))
    if kind == "cuda":
        return importlib.util.find_spec("triton") is not None
    return False


def precision_name(precision: str) -> str:
    """``precision`` checked and normalised (``"auto"``, ``"fp32"`` or ``"bf16"``); ``UserError`` when unknown."""
    name = (precision or "auto").strip().lower()
    if name not in PRECISIONS:
        raise UserError(f"unknown precision {name!r}; expected one of {', '.join(PRECISIONS)}")
    return name


def cpu_precision(precision: str) -> str:
    """What ``mygpt.device.resolve_precision("cpu", precision)`` gives: ``auto`` is fp32 on a CPU (bf16 is allowed
    there when asked for, never chosen)."""
    name = precision_name(precision)
    return "fp32" if name == "auto" else name


def cpu_lacks_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether ``cpuinfo`` says this CPU has no native bf16 (none of the x86 flags ``avx512_bf16``/``amx_bf16``,
    no arm64 ``bf16`` feature), torch-free; ``False`` where it cannot tell. Why: bf16 autocast on such a CPU is
    emulated, about 10x slower than fp32, and a run should say so before it starts, not after the tokenizer."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            lines = [line for line in f if line.startswith(("flags", "Features"))]
    except OSError:
        return False
    if not lines:
        return False
    words = set(lines[0].split(":", 1)[-1].split())
    return not words & {"avx512_bf16", "amx_bf16", "bf16"}


def check_seq_len(
    seq_len: int, max_seq_len: int, *, names: tuple[str, str] = ("seq_len", "max_seq_len"), hint: str = ""
) -> None:
    """The one check that a training window fits the model: ``seq_len <= max_seq_len``. ``names``: how the
    caller's user spells the two (``--seq-len``, ...); ``hint``: what to do (default: lower one, raise the other)."""
    if seq_len > max_seq_len:
        seq, most = names
        raise UserError(
            f"{seq} ({seq_len}) must be <= {most} ({max_seq_len}); {hint or f'lower {seq} or raise {most}'}"
        )


def check_nproc(batch_size: int, nproc: int, *, names: tuple[str, str] = ("batch_size", "nproc")) -> None:
    """The one check that every training process gets a row of the global batch: ``batch_size >= nproc``.
    ``names``: how the caller's user spells the two."""
    if batch_size < nproc:
        rows, procs = names
        raise UserError(
            f"{procs} ({nproc}) is more than {rows} ({batch_size}); every process takes at least one "
            f"row of the global batch: lower {procs} or raise {rows}"
        )


def check_memory(
    model,
    batch_size: int,
    seq_len: int,
    *,
    device,
    precision: str = "fp32",
    nproc: int = 1,
    micro_batch_size: int = 0,
    names: dict[str, str] | None = None,
) -> None:
    """The one check that training fits this machine before anything is allocated: ``UserError`` when even
    :func:`mygpt.metrics.training_memory`'s lower bound for ``model`` (a ``GPTConfig``) exceeds the GPU's
    memory (CUDA: per process) or this machine's (CPU, MPS: all ``nproc`` processes together). ``names``: how the
    caller's user spells the settings (``{"batch_size": "--batch-size", ...}``)."""
    have, what = machine_memory(device)
    if have is None:
        return
    rows = rows_at_once(batch_size, nproc, micro_batch_size)
    need = training_memory(model, rows, seq_len, precision)
    processes = 1 if getattr(device, "type", str(device).split(":")[0]) == "cuda" else nproc
    total = need.total * processes
    if total <= have:
        return
    name = (names or {}).get
    if need.positions >= max(need.state, need.activations):
        culprit = f"{name('max_seq_len', 'max_seq_len')} ({model.max_seq_len:,})"
        fix = f"lower {name('max_seq_len', 'max_seq_len')}"
    elif need.activations >= need.state:
        which = "batch_size" if rows >= seq_len else "seq_len"
        culprit = f"{name(which, which)} ({batch_size if which == 'batch_size' else seq_len:,})"
        fix = f"lower {name('batch_size', 'batch_size')} or {name('seq_len', 'seq_len')}"
        if rows > 1:
            fix += f", or set {micro_batch_hint(rows, name('micro_batch_size', 'micro_batch_size'))}"
    else:
        culprit = f"the model's size ({model.num_params():,} parameters)"
        fix = f"lower {name('embed_dim', 'embed_dim')} or {name('num_layers', 'num_layers')}"
    each = f" x {processes} processes" if processes > 1 else ""
    raise UserError(
        f"{culprit} makes training need at least {_gib(total)}, more than the {_gib(have)} {what} "
        f"(weights, gradients and AdamW state {_gib(need.state)}, position tables {_gib(need.positions)}, "
        f"activations of {rows:,} rows x {seq_len:,} tokens {_gib(need.activations)}{each}); {fix}"
    )


def rows_at_once(batch_size: int, nproc: int = 1, micro_batch_size: int = 0) -> int:
    """The most rows of the global ``batch_size`` one of ``nproc`` processes runs in one forward pass: its share,
    or ``micro_batch_size`` where that is set and smaller (training, and validation alike)."""
    share = -(-batch_size // max(nproc, 1))
    return min(micro_batch_size, share) if micro_batch_size > 0 else share


def micro_batch_hint(rows: int, knob: str = "micro_batch_size") -> str:
    """How the memory messages name the micro-batch knob for a process that runs ``rows`` rows at once: fewer rows
    per forward pass, gradients accumulated, the same step up to float rounding."""
    return (
        f"{knob} to fewer than the {rows:,} rows each process runs at once (e.g. {max(1, rows // 2):,}; gradients "
        f"are accumulated, the step is the same up to float rounding)"
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"
