"""Data parallelism inside the loop: which rows of the global batch a rank takes, and how losses and gradients
add up so any world size computes a single process's step (up to float rounding; on GPUs per step, see
docs/TRAINING.md's Exactness); design: docs/TRAINING.md."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mygpt.device import autocast
from mygpt.heldout import summed_nats
from mygpt.metrics import bits_per_byte
from mygpt.training.data import get_batch

__all__ = ["World", "evaluate", "forward_backward", "wrap_ddp"]


@dataclass(frozen=True)
class World:
    """This process's place among the training processes (``rank`` of ``size``); ``size == 1`` = alone."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    #: called after every optimizer step with the step number (the launcher's test hooks use it)
    step_hook: Callable[[int], None] | None = None

    @classmethod
    def current(cls, step_hook: Callable[[int], None] | None = None) -> World:
        """The initialised default process group's rank/size, or a single-process world."""
        import os

        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return cls(
                rank=dist.get_rank(),
                size=dist.get_world_size(),
                local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                step_hook=step_hook,
            )
        return cls(step_hook=step_hook)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def rows(self, batch_size: int) -> slice | None:
        """This rank's rows of a global batch (``None`` = all of them, for a single process)."""
        if self.size == 1:
            return None
        base, extra = divmod(batch_size, self.size)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (1 if self.rank < extra else 0))

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks, in place (a no-op alone)."""
        if self.size > 1:
            import torch.distributed as dist

            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def all_gather(self, obj) -> list:
        """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` alone."""
        if self.size == 1:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def after_step(self, step: int) -> None:
        if self.step_hook is not None:
            self.step_hook(step)


def wrap_ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` in ``DistributedDataParallel`` for the initialised process group: on CUDA pinned to ``device``
    (``device_ids``, which NCCL needs), on the CPU (gloo) without. The only buffers are constant rope tables, so
    they are not broadcast at every forward."""
    from torch.nn.parallel import DistributedDataParallel

    ids = None
    if device.type == "cuda":
        ids = [device.index if device.index is not None else torch.cuda.current_device()]
    return DistributedDataParallel(model, device_ids=ids, forward_sync_buffers=False)


def forward_backward(
    model,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int,
    world: World,
    micro_batch_size: int,
    device: torch.device,
    precision: str,
) -> torch.Tensor:
    """Forward and backward over this rank's rows (``model`` DDP-wrapped when ``world.size > 1``); returns this
    rank's detached contribution to the global mean loss. The logits (batch x seq_len x vocab floats) are let go
    before the backward pass: the loss's graph keeps only what its gradient needs."""
    rows = x.size(0)
    micro = micro_batch_size if 0 < micro_batch_size < rows else rows
    starts = list(range(0, rows, micro))
    contribution = None
    for i, start in enumerate(starts):
        xb, yb = x[start : start + micro], y[start : start + micro]
        share = xb.size(0) / batch_size  # this micro-batch's share of the global mean
        sync = i == len(starts) - 1
        no_sync = model.no_sync() if (not sync and hasattr(model, "no_sync")) else contextlib.nullcontext()
        with no_sync:
            with autocast(device, precision):
                loss = model(xb, yb, keep_logits=False)[1]  # the backward pass never needs the logits
            scale = share * world.size
            (loss * scale if scale != 1.0 else loss).backward()
        part = loss.detach() * share if share != 1.0 else loss.detach()
        contribution = part if contribution is None else contribution + part
    assert contribution is not None  # starts is never empty (range(0, 0, 0) raises)
    return contribution


@torch.no_grad()
def evaluate(
    model,
    tokens,
    *,
    batch_size: int,
    seq_len: int,
    batches: int,
    seed: int,
    device: torch.device,
    precision: str,
    world: World,
    token_bytes: torch.Tensor | None = None,
    micro_batch_size: int = 0,
) -> tuple[float, float | None]:
    """``(mean loss per token, bits per byte or None)`` of the unwrapped ``model`` over ``batches`` global batches
    drawn with ``seed`` (the same on every rank); ``token_bytes`` (UTF-8 bytes per vocabulary id) gives the bpb.
    Forward passes of at most ``micro_batch_size`` rows (0 = all of this rank's), as training's: its fp32 logits
    would otherwise need several times a training micro-batch's memory; the loss is the same up to float rounding
    (exactly the same when every rank's rows fit in one pass)."""
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    rows = world.rows(batch_size)
    nats_total, bytes_total = 0.0, 0
    for _ in range(batches):
        x, y = get_batch(tokens, batch_size, seq_len, gen, device, rows=rows)
        nats_total += summed_nats(model, x, y, device, precision, rows=micro_batch_size)
        if token_bytes is not None:
            bytes_total += int(token_bytes[y].sum().item())
    model.train(was_training)
    if world.size > 1:  # float64 on the process's device (CPU for gloo, CUDA for NCCL)
        sums = world.all_reduce_sum(torch.tensor([nats_total, bytes_total], dtype=torch.float64, device=device))
        nats_total, bytes_total = sums.tolist()
    loss = nats_total / (batches * batch_size * seq_len)
    return loss, bits_per_byte(nats_total, bytes_total) if token_bytes is not None else None
