"""Device and precision selection.

``resolve_device("auto")`` picks CUDA, then Apple MPS, then CPU. Explicit names are validated: an unknown name,
or a backend that is not available here, raises ``UserError``.

``resolve_precision(device, precision)``:

* ``"fp32"`` -- always allowed.
* ``"bf16"`` -- mixed precision via ``torch.autocast(dtype=torch.bfloat16)``; weights and optimizer state stay
  fp32. Allowed on CUDA devices that support bf16 (Ampere and newer), on MPS, and on CPU (CPU autocast supports
  bf16; it is numerically fine but usually *slower* than fp32 on CPUs without AMX/AVX512-BF16, so it is never
  chosen automatically there).
* ``"auto"`` -- bf16 on CUDA-with-bf16 and MPS, fp32 everywhere else (CPU included).
"""

from __future__ import annotations

import contextlib
import re

import torch

from .errors import UserError

__all__ = ["resolve_device", "resolve_precision", "autocast", "PRECISIONS", "mps_available"]

PRECISIONS = ("auto", "fp32", "bf16")


def mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def resolve_device(name: "str | torch.device" = "auto") -> torch.device:
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


def resolve_precision(device: "str | torch.device", precision: str = "auto") -> str:
    """``"auto"|"fp32"|"bf16"`` -> ``"fp32"`` or ``"bf16"`` for ``device``; ``UserError`` when unsupported."""
    device = device if isinstance(device, torch.device) else torch.device(str(device))
    precision = (precision or "auto").strip().lower()
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
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


def autocast(device: "str | torch.device", precision: str):
    """Context manager: bf16 autocast when ``precision == "bf16"``, otherwise a no-op."""
    device = device if isinstance(device, torch.device) else torch.device(str(device))
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
