"""Device and precision: ``resolve_device("auto")`` (CUDA, then MPS, then CPU) and ``resolve_precision``
(``auto`` = bf16 on CUDA with bf16 and on MPS, else fp32); ``UserError`` for what this machine lacks. Also the
bf16-on-CPU warning, ``compile_unavailable`` and TF32. Design: docs/TRAINING.md."""

from __future__ import annotations

import contextlib
import platform
import re

import torch

from mygpt.errors import UserError
from mygpt.limits import PRECISIONS, precision_name

__all__ = [
    "PRECISIONS",
    "as_device",
    "autocast",
    "bf16_cpu_warning",
    "compile_unavailable",
    "cpu_has_native_bf16",
    "mps_available",
    "resolve_device",
    "resolve_precision",
    "tf32_matmuls",
    "torch_threads",
]


def as_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device`` (a string is parsed as it is; nothing is resolved or checked)."""
    return device if isinstance(device, torch.device) else torch.device(str(device))


def mps_available() -> bool:
    return bool(torch.backends.mps.is_available())


def resolve_device(name: str | torch.device = "auto") -> torch.device:
    """``"auto"|"cpu"|"cuda"|"cuda:N"|"mps"`` -> ``torch.device``; ``UserError`` when unknown or unavailable."""
    if isinstance(name, torch.device):
        name = str(name)
    name = (name or "auto").strip().lower()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "mps":
        if not mps_available():
            raise UserError("device 'mps' was requested but Apple MPS is not available here; use --device auto or cpu")
        return torch.device("mps")
    m = re.fullmatch(r"cuda(?::(\d+))?", name)
    if m:
        if not torch.cuda.is_available():
            raise UserError(f"device {name!r} was requested but CUDA is not available here; use --device auto or cpu")
        if m.group(1) is not None and int(m.group(1)) >= torch.cuda.device_count():
            raise UserError(
                f"device {name!r} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
        return torch.device(name)
    raise UserError(f"unknown device {name!r}; expected auto, cpu, cuda, cuda:N or mps")


def _bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        try:
            return bool(torch.cuda.is_bf16_supported())
        except Exception:  # pragma: no cover - defensive: odd driver states
            return False
    return device.type in ("mps", "cpu")


def resolve_precision(device: str | torch.device, precision: str = "auto") -> str:
    """``"auto"|"fp32"|"bf16"`` -> ``"fp32"`` or ``"bf16"`` for ``device``; ``UserError`` when unsupported."""
    device = as_device(device)
    precision = precision_name(precision)
    if precision == "fp32":
        return "fp32"
    if precision == "bf16":
        if not _bf16_supported(device):
            raise UserError(f"precision 'bf16' is not supported on device {device}; use --precision fp32")
        return "bf16"
    # auto
    if device.type in ("cuda", "mps") and _bf16_supported(device):
        return "bf16"
    return "fp32"


def autocast(device: str | torch.device, precision: str):
    """Context manager: bf16 autocast when ``precision == "bf16"``, otherwise a no-op."""
    device = as_device(device)
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def cpu_has_native_bf16() -> bool | None:
    """True/False where the CPU's bf16 support is known (x86: AVX512-BF16 or AMX-BF16; Linux arm64: the
    ``bf16`` feature), ``None`` where it cannot be told."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i386", "i686"):
        try:
            c = torch.cpu.get_capabilities()
        except Exception:  # pragma: no cover - defensive
            return None
        return bool(c.get("avx512_bf16") or c.get("amx_bf16"))
    if machine in ("aarch64", "arm64"):
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                return any(line.startswith("Features") and " bf16" in line for line in f)
        except OSError:
            return None
    return None


def _cpu_name() -> str:
    try:
        name = torch.cpu.get_capabilities().get("cpu_name")
    except Exception:  # pragma: no cover - defensive
        name = None
    return str(name or platform.processor() or platform.machine() or "this CPU")


def bf16_cpu_warning(device: str | torch.device, requested: str) -> str | None:
    """The warning for an explicit ``precision="bf16"`` on a CPU without native bf16, else ``None``."""
    device = as_device(device)
    if device.type != "cpu" or (requested or "").strip().lower() != "bf16" or cpu_has_native_bf16() is not False:
        return None
    return (
        f"precision bf16 on {_cpu_name()}, a CPU without native bf16 (no AVX512-BF16/AMX): autocast emulates "
        f"it, and fp32 measured about 10x faster on such a CPU (chapter model: ~1 s vs ~11 s per step); "
        f"use precision fp32 (or auto, which picks fp32 on CPUs)"
    )


def compile_unavailable(device: str | torch.device) -> str | None:
    """Why ``torch.compile`` (TorchInductor) cannot run on ``device`` here, or ``None`` when it can."""
    device = as_device(device)
    try:
        from torch import _dynamo

        if not _dynamo.is_dynamo_supported():
            return "TorchDynamo does not support this Python or platform"
    except Exception as e:  # pragma: no cover - depends on the install
        return f"TorchDynamo cannot load ({type(e).__name__}: {e})"
    if device.type == "cpu":
        try:
            from torch._inductor.cpp_builder import get_cpp_compiler

            get_cpp_compiler()
        except Exception:
            return "no C++ compiler found for TorchInductor's CPU backend (install g++ or clang++, or set CXX)"
    elif device.type == "cuda":
        try:
            from torch.utils._triton import has_triton
        except Exception:  # pragma: no cover - depends on the install
            return "cannot check for Triton, which TorchInductor needs on CUDA"
        if not has_triton():
            return "Triton is not installed (TorchInductor needs it on CUDA)"
    return None


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """Run with ``threads`` torch CPU threads (None/0: leave torch's default), restoring the old count after."""
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if threads:
            torch.set_num_threads(old)


@contextlib.contextmanager
def tf32_matmuls(device: str | torch.device, enabled: bool = True):
    """TF32 for fp32 matmuls and convolutions on CUDA while inside (restored after); a no-op elsewhere."""
    device = as_device(device)
    if not enabled or device.type != "cuda":
        yield
        return
    # torch.backends.cudnn is replaced by a CudnnModule at import; its annotations omit ``conv``.
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv  # type: ignore[attr-defined]
    old = matmul.fp32_precision, conv.fp32_precision
    matmul.fp32_precision, conv.fp32_precision = "tf32", "tf32"
    try:
        yield
    finally:
        matmul.fp32_precision, conv.fp32_precision = old
