"""Device and precision: ``resolve_device("auto")`` (CUDA, then MPS, then CPU) and ``resolve_precision``
(``auto`` = bf16 where the device has it natively: CUDA compute capability 8.0+, MPS on macOS 14+; else fp32);
``UserError`` for what this machine lacks. Also the warnings a run prints about them (:func:`device_warnings`),
``compile_unavailable``, TF32 and the opt-in deterministic mode. Design: docs/TRAINING.md."""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import re

import torch

from mygpt import limits
from mygpt.errors import UserError
from mygpt.limits import PRECISIONS, accelerator_evidence, precision_name

__all__ = [
    "DETERMINISTIC_ENV",
    "PRECISIONS",
    "as_device",
    "autocast",
    "bf16_cpu_warning",
    "bf16_native",
    "compile_options",
    "compile_unavailable",
    "deterministic_mode",
    "device_warnings",
    "mps_available",
    "no_cuda_reason",
    "resolve_device",
    "resolve_precision",
    "synchronize",
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


def _macos_version() -> tuple[int, ...]:
    release = platform.mac_ver()[0]
    return tuple(int(p) for p in release.split(".") if p.isdigit()) if release else ()


def bf16_native(device: str | torch.device) -> tuple[bool, str]:
    """``(whether device has native bf16, why)``: CUDA from compute capability 8.0 (Ampere) on, of ``device``
    itself (``torch.cuda.is_bf16_supported`` also counts emulation, which V100 and T4 offer, without flash
    attention, and asks about the current device); MPS from macOS 14 (PyTorch refuses bf16 there before)."""
    device = as_device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        name = torch.cuda.get_device_name(index)
        native = (major, minor) >= (8, 0)
        has = "8.0+: native" if native else "below 8.0: no native"
        return native, f"{name} has compute capability {major}.{minor} ({has} bf16)"
    if device.type == "mps":
        version = _macos_version()
        shown = ".".join(map(str, version)) or "unknown"
        native = version >= (14,)
        return native, f"MPS on macOS {shown} ({'14+: bf16' if native else 'PyTorch offers bf16 on MPS from macOS 14'})"
    return False, "auto never picks bf16 on the CPU"


def _bf16_allowed(device: torch.device) -> bool:
    """Where an explicit ``precision="bf16"`` can run (emulated on CUDA below 8.0, with a warning)."""
    if device.type == "cuda":
        try:
            return bool(torch.cuda.is_bf16_supported(including_emulation=True))
        except Exception:  # pragma: no cover - defensive: odd driver states
            return False
    if device.type == "mps":
        return bf16_native(device)[0]
    return device.type == "cpu"


def resolve_precision(device: str | torch.device, precision: str = "auto") -> str:
    """``"auto"|"fp32"|"bf16"`` -> ``"fp32"`` or ``"bf16"`` for ``device``; ``UserError`` when unsupported."""
    device = as_device(device)
    precision = precision_name(precision)
    if precision == "fp32":
        return "fp32"
    if precision == "bf16":
        if not _bf16_allowed(device):
            why = f" ({bf16_native(device)[1]})" if device.type == "mps" else ""
            raise UserError(f"precision 'bf16' is not supported on device {device}{why}; use --precision fp32")
        return "bf16"
    # auto
    if device.type in ("cuda", "mps") and bf16_native(device)[0]:
        return "bf16"
    return "fp32"


def no_cuda_reason(evidence: str | None) -> str:
    """Why torch sees no CUDA GPU, for a message: a CPU build of torch (``torch.version.cuda`` None, as the venv's
    pinned wheel) where ``evidence`` (:func:`mygpt.limits.accelerator_evidence`) says a GPU driver is here is not a
    machine without a GPU, so it says so and how to install a CUDA build of the same version."""
    if evidence is not None and torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return (
            f"torch {torch.__version__} here is a CPU build (torch.version.cuda is None), but {evidence} says a GPU "
            f"driver is here: install a CUDA build of the same version for the driver's CUDA (nvidia-smi), e.g. "
            f".venv/bin/pip install --index-url https://download.pytorch.org/whl/cu128 "
            f"torch=={torch.__version__.split('+')[0]}"
        )
    return "no CUDA GPU here (torch.cuda.is_available() is False)"


def device_warnings(requested_device: str, device: torch.device, requested_precision: str, precision: str) -> list[str]:
    """What a run on ``device`` at ``precision`` should say about how they were chosen, one line each: ``auto``
    settling on the CPU where a GPU driver is loaded, ``auto`` keeping fp32 on an accelerator without native bf16
    (and why), an explicit bf16 that is emulated, bf16 on a CPU without it."""
    out = []
    if (requested_device or "auto").strip().lower() == "auto" and device.type == "cpu":
        evidence = accelerator_evidence()
        if evidence is not None:
            build = f"torch {torch.__version__} " + ("has CUDA" if torch.version.cuda else "is built without CUDA")
            out.append(
                f"device auto settled on the CPU, but {evidence} says a GPU driver is here ({build}, and "
                f"torch.cuda.is_available() is False): install a torch build for this GPU or check the driver "
                f"(nvidia-smi); pass device cpu to train on the CPU without this warning"
            )
    requested = (requested_precision or "auto").strip().lower()
    if device.type in ("cuda", "mps"):
        native, why = bf16_native(device)
        if requested == "auto" and not native:
            out.append(f"precision auto is fp32 here: {why}")
        elif requested == "bf16" and precision == "bf16" and not native:
            out.append(f"precision bf16 is emulated here: {why}; fp32 (or auto) is faster")
    slow = bf16_cpu_warning(device, requested)
    if slow:
        out.append(slow)
    return out


def autocast(device: str | torch.device, precision: str):
    """Context manager: bf16 autocast when ``precision == "bf16"``, otherwise a no-op."""
    device = as_device(device)
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _cpu_name() -> str:
    try:
        name = torch.cpu.get_capabilities().get("cpu_name")
    except Exception:  # pragma: no cover - defensive
        name = None
    return str(name or platform.processor() or platform.machine() or "this CPU")


def bf16_cpu_warning(device: str | torch.device, requested: str) -> str | None:
    """The warning for an explicit ``precision="bf16"`` on a CPU without native bf16, else ``None``."""
    device = as_device(device)
    if device.type != "cpu" or (requested or "").strip().lower() != "bf16" or not limits.cpu_lacks_bf16():
        return None
    return (
        f"precision bf16 on {_cpu_name()}, a CPU without native bf16 (no AVX512-BF16/AMX): autocast emulates "
        f"it, and fp32 measured about 10x faster on such a CPU (chapter model: ~1 s vs ~11 s per step); "
        f"use precision fp32 (or auto, which picks fp32 on CPUs)"
    )


def compile_options(device: str | torch.device) -> dict:
    """TorchInductor's options for a training step on ``device``: on the CPU its C++ wrapper, which calls the
    generated kernels from C++ instead of from Python. Why: the chapter's small model makes hundreds of short
    kernel calls a step, and the Python between them is a measurable share of the step on a CPU
    (bench/step_vs_nanogpt.py); the kernels are the same, so the numbers are too."""
    return {"cpp_wrapper": True} if as_device(device).type == "cpu" else {}


def compile_unavailable(device: str | torch.device, probe: bool = False) -> str | None:
    """Why ``torch.compile`` (TorchInductor) cannot run on ``device`` here, or ``None`` when it can. ``probe``: also
    compile and run a two-op function with :func:`compile_options` (once per process and device), so a compiler
    that is found but cannot build (no Python headers, a broken toolchain) is a reason too, not a crash at a
    training run's first step."""
    device = as_device(device)
    reason = _compile_missing(device)
    if reason is None and probe:
        reason = _compile_probe(str(device))
    return reason


@functools.cache
def _compile_probe(device: str) -> str | None:
    try:
        x = torch.arange(8, dtype=torch.float32, device=device)
        fn = torch.compile(lambda t: torch.sin(t) * 2 + 1, options=compile_options(device), fullgraph=True)
        if not torch.allclose(fn(x).cpu(), (torch.sin(x) * 2 + 1).cpu()):
            return "torch.compile built a kernel that computed a wrong result here"
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:300]
        return f"torch.compile cannot build a kernel here ({type(e).__name__}: {first})"
    return None


def _compile_missing(device: torch.device) -> str | None:
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
    elif device.type == "mps":
        return "TorchInductor's MPS backend is experimental"
    return None


def synchronize(device: torch.device) -> None:
    """Wait until ``device`` has finished the work queued on it (CUDA and MPS run asynchronously; the CPU not)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


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
    """TF32 for fp32 matmuls and convolutions on CUDA while inside (restored after); a no-op elsewhere. Set through
    the legacy flags only: setting the newer ``fp32_precision`` ones makes every later read of the legacy ones (or of
    ``torch.get_float32_matmul_precision()``, which TorchInductor's autotuning does) raise "mix of the legacy and
    new APIs"."""
    device = as_device(device)
    if not enabled or device.type != "cuda":
        yield
        return
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    old = matmul.allow_tf32, cudnn.allow_tf32
    matmul.allow_tf32, cudnn.allow_tf32 = True, True
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = old


#: Set (to anything but empty or ``0``) for the opt-in deterministic mode of :func:`deterministic_mode`.
DETERMINISTIC_ENV = "MYGPT_DETERMINISTIC"


@contextlib.contextmanager
def deterministic_mode(enabled: bool | None = None):
    """While inside, with ``enabled`` (default: :data:`DETERMINISTIC_ENV` set): ``torch.use_deterministic_algorithms``
    and cuBLAS's fixed workspace (``CUBLAS_WORKSPACE_CONFIG``, when not set already), so a GPU run repeats bit for
    bit on the same machine and software, at some speed; restored after. A no-op otherwise (the CPU is exact
    without it)."""
    if enabled is None:
        enabled = os.environ.get(DETERMINISTIC_ENV, "").strip() not in ("", "0")
    if not enabled:
        yield
        return
    old = torch.are_deterministic_algorithms_enabled()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(old)
