"""Random training windows from a 1-D token array (the chapter's ``get_batch``; only the sampled windows are
read, so a memmap far bigger than RAM works), and flat token files memory-mapped as one sequence."""

from __future__ import annotations

import os

import numpy as np
import torch

from mygpt.errors import UserError

__all__ = ["ConcatTokens", "get_batch", "num_tokens", "open_token_files"]


def num_tokens(tokens) -> int:
    if isinstance(tokens, torch.Tensor):
        if tokens.dim() != 1:
            raise UserError(f"token data must be 1-D, got shape {tuple(tokens.shape)}")
        return tokens.numel()
    shape = getattr(tokens, "shape", None)
    if shape is not None and len(shape) != 1:
        raise UserError(f"token data must be 1-D, got shape {tuple(shape)}")
    return len(tokens)


def get_batch(
    tokens, batch_size: int, seq_len: int, generator: torch.Generator, device="cpu", rows: slice | None = None
):
    """``(x, y)``, ``(batch_size, seq_len)`` int64 on ``device`` (``y`` shifted by one), from windows at offsets
    drawn from ``generator``; with ``rows`` only those windows are read, the generator advancing as for all."""
    n = num_tokens(tokens)
    if n < seq_len + 1:
        raise UserError(
            f"token data has {n:,} tokens, fewer than one window of seq_len + 1 = {seq_len + 1:,}; "
            f"use more text or a smaller --seq-len"
        )
    ix = torch.randint(n - seq_len, (batch_size,), generator=generator).tolist()
    if rows is not None:
        ix = ix[rows]
    if isinstance(tokens, torch.Tensor):
        windows = torch.stack([tokens[i : i + seq_len + 1] for i in ix]).to(torch.long)
    else:
        windows = torch.from_numpy(np.stack([np.asarray(tokens[i : i + seq_len + 1]) for i in ix]).astype(np.int64))
    x = windows[:, :-1].contiguous()
    y = windows[:, 1:].contiguous()
    device = device if isinstance(device, torch.device) else torch.device(device)
    if device.type == "cuda" and x.device.type == "cpu":
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y


class ConcatTokens:
    """Several 1-D token arrays seen as one; slicing copies only the requested window."""

    def __init__(self, parts: list) -> None:
        self.parts = [p for p in parts if len(p)]
        self.starts = np.cumsum([0] + [len(p) for p in self.parts])
        self.shape = (int(self.starts[-1]),)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice):
            raise TypeError("ConcatTokens supports slices only")
        start, stop, _ = key.indices(len(self))
        pieces = []
        for part, offset in zip(self.parts, self.starts):
            lo, hi = max(start - int(offset), 0), min(stop - int(offset), len(part))
            if lo < hi:
                pieces.append(np.asarray(part[lo:hi]))
        if not pieces:
            return np.zeros(0, dtype=self.parts[0].dtype if self.parts else np.uint16)
        return np.concatenate(pieces) if len(pieces) > 1 else pieces[0]


def open_token_files(paths, dtype="uint16"):
    """Memory-map flat binary token files, read as one sequence; ``UserError`` naming a missing file or one whose
    size is not a multiple of the dtype's."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise UserError(f"token dtype {dtype!r} is not a numpy dtype (use uint16, uint32 or int32)") from e
    if dt.kind not in "ui":
        raise UserError(f"token dtype {dtype!r} is not an integer type (use uint16, uint32 or int32)")
    parts = []
    for p in paths:
        p = os.fspath(p)
        if not os.path.isfile(p):
            raise UserError(f"token file {p} does not exist (or is not a file)")
        size = os.path.getsize(p)
        if size % dt.itemsize:
            raise UserError(
                f"token file {p} has {size:,} bytes, not a multiple of {dt.itemsize} ({dt.name}); "
                f"it is truncated or holds another dtype"
            )
        parts.append(np.memmap(p, dtype=dt, mode="r") if size else np.zeros(0, dt))
    if not parts:
        raise UserError("no token files given")
    return parts[0] if len(parts) == 1 else ConcatTokens(parts)
