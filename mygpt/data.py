"""Random training windows from a 1-D token array (the chapter's ``get_batch``).

``tokens`` may be a numpy memmap (the main case: a corpus far bigger than RAM), an ndarray or a tensor. Only the
sampled windows are read and converted to int64; the corpus is never materialised as a list or copied whole.
"""

from __future__ import annotations

import numpy as np
import torch

from .errors import UserError

__all__ = ["get_batch", "num_tokens"]


def num_tokens(tokens) -> int:
    if isinstance(tokens, torch.Tensor):
        if tokens.dim() != 1:
            raise UserError(f"token data must be 1-D, got shape {tuple(tokens.shape)}")
        return tokens.numel()
    shape = getattr(tokens, "shape", None)
    if shape is not None and len(shape) != 1:
        raise UserError(f"token data must be 1-D, got shape {tuple(shape)}")
    return len(tokens)


def get_batch(tokens, batch_size: int, seq_len: int, generator: torch.Generator, device="cpu"):
    """Sample ``batch_size`` windows of ``seq_len + 1`` tokens at offsets drawn from ``generator``.

    Returns ``(x, y)``, each ``(batch_size, seq_len)`` int64 on ``device``; ``y`` is ``x`` shifted by one.
    """
    n = num_tokens(tokens)
    if n < seq_len + 1:
        raise UserError(
            f"token data has {n:,} tokens, fewer than one window of seq_len + 1 = {seq_len + 1:,}; "
            f"use more text or a smaller --seq-len"
        )
    ix = torch.randint(n - seq_len, (batch_size,), generator=generator).tolist()
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
