"""Loss and bits per byte of a model on held-out token ids, in fixed windows.

The ids are cut into consecutive, non-overlapping windows of ``seq_len`` inputs: window ``k`` reads ids
``k*T .. k*T+T-1`` and predicts ids ``k*T+1 .. k*T+T`` (the last window may be shorter), so every id but the
first is predicted exactly once, each with the context of its own window only. Deterministic: no sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from mygpt.device import autocast
from mygpt.errors import UserError
from mygpt.metrics import bits_per_byte

WINDOWS_PER_BATCH = 8


@dataclass(frozen=True)
class HeldOut:
    """What :func:`heldout_loss` measured: mean loss per predicted token (nats), bits per byte, and over what."""

    loss: float
    bpb: float | None
    targets: int  # predicted tokens
    target_bytes: int  # UTF-8 bytes of the predicted tokens' strings
    windows: int


def windows(num_ids: int, seq_len: int) -> list[tuple[int, int]]:
    """``(start, length)`` of each window over ``num_ids`` ids: ``length`` inputs, predicting the next ``length``."""
    return [(s, min(seq_len, num_ids - 1 - s)) for s in range(0, max(num_ids - 1, 0), seq_len)]


def summed_nats(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device, precision: str, rows: int = 0
) -> float:
    """The summed cross-entropy (nats) of ``model`` predicting ``y`` from ``x``: what held-out evaluation and
    training's validation both add up. At most ``rows`` rows of ``x`` per forward pass (0 = all at once), each
    pass's sum added as a Python float: the fp32 logits of a pass are what eval needs most memory for, so this
    bounds it like training's micro-batches; one pass gives exactly the number of a single forward."""
    per_pass = rows if 0 < rows < x.size(0) else max(x.size(0), 1)
    total = 0.0
    for start in range(0, x.size(0), per_pass):
        with autocast(device, precision):
            logits, _ = model(x[start : start + per_pass])
        target = y[start : start + per_pass].reshape(-1)
        total += F.cross_entropy(logits.float().view(-1, logits.size(-1)), target, reduction="sum").item()
    return total


@torch.no_grad()
def heldout_loss(
    model: torch.nn.Module,
    ids: np.ndarray,
    token_bytes: np.ndarray,
    seq_len: int,
    device: str | torch.device = "cpu",
    precision: str = "fp32",
    rows: int = WINDOWS_PER_BATCH,
) -> HeldOut:
    """Cross-entropy of ``model`` on ``ids`` in the windows of :func:`windows`, at most ``rows`` windows per
    forward pass (memory; the numbers change only by float rounding); bits per byte = the summed nats / ln 2 /
    the UTF-8 bytes of the predicted tokens (``token_bytes[id]``, as validation during training counts)."""
    if len(ids) < 2:  # nothing to predict: a loss of nothing is no number
        raise UserError(f"held-out text of {len(ids)} token id(s): at least 2 are needed (one predicts the next)")
    was_training = model.training
    model.eval()
    device = torch.device(device)
    data = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    sizes = torch.as_tensor(np.asarray(token_bytes, dtype=np.int64))
    spans = windows(len(data), seq_len)
    nats, targets, nbytes = 0.0, 0, 0
    for i in range(0, len(spans), WINDOWS_PER_BATCH):
        batch = spans[i : i + WINDOWS_PER_BATCH]
        for length in sorted({n for _, n in batch}):  # equal lengths share a forward pass (the last may be short)
            starts = [s for s, n in batch if n == length]
            x = torch.stack([data[s : s + length] for s in starts]).to(device)
            y = torch.stack([data[s + 1 : s + 1 + length] for s in starts])
            nats += summed_nats(model, x, y.to(device), device, precision, rows=rows)
            targets += y.numel()
            nbytes += int(sizes[y].sum().item())
    model.train(was_training)
    return HeldOut(
        loss=nats / targets,
        bpb=bits_per_byte(nats, nbytes),
        targets=targets,
        target_bytes=nbytes,
        windows=len(spans),
    )
