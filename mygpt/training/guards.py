"""What stops a training run with a clear error instead of a damaged model or a raw traceback: the first
non-finite loss (:class:`FiniteLoss`) and an accelerator running out of memory (:func:`out_of_memory_error`)."""

from __future__ import annotations

import math

import torch

from mygpt.errors import UserError
from mygpt.limits import micro_batch_hint, rows_at_once
from mygpt.training.config import TrainConfig, lr_at

__all__ = ["FiniteLoss", "out_of_memory_error"]


class FiniteLoss:
    """Stops training at the first non-finite loss, before anything after it is saved; on an accelerator the
    first bad step stays on the device until training synchronises anyway, so no step waits for it."""

    def __init__(self, config: TrainConfig, device: torch.device) -> None:
        self.config = config
        self.first: torch.Tensor | None = None  # on an accelerator: the first bad step, 0 = none yet
        if device.type != "cpu":
            self.first = torch.zeros((), dtype=torch.long, device=device)

    def see(self, step: int, loss: torch.Tensor) -> None:
        if self.first is None:
            value = loss.item()
            if not math.isfinite(value):
                raise self._error(step, f"the loss is {value}")
        else:
            self.first = torch.where((self.first == 0) & ~torch.isfinite(loss.detach()), step, self.first)

    def check(self) -> None:
        if self.first is not None:
            step = int(self.first.item())
            if step:
                raise self._error(step, "the loss is not finite")

    def check_weights(self, model, step: int) -> None:
        """``UserError`` when a weight is NaN or infinite after ``step``: one pass over all of them (their largest
        magnitudes, which a NaN or an infinity makes non-finite and no finite weight can), not a reduction per
        parameter (each of which, on a busy CPU, waits for its threads)."""
        self.check()
        params = [p.detach() for p in model.parameters()]
        if params and not bool(torch.isfinite(torch.stack(torch._foreach_norm(params, math.inf))).all()):
            raise self._error(step, "the weights are not finite after it")

    def _error(self, step: int, what: str) -> UserError:
        c = self.config
        also = ", raise warmup" if c.warmup < step else ""
        if c.max_grad_norm == 0:
            also += " or set max_grad_norm (gradient clipping, e.g. 1.0)"
        return UserError(
            f"training diverged at step {step}: {what} (learning rate there {lr_at(c, step):.3g}); the likely "
            f"cause is lr ({c.lr:g}), too high for this model: lower lr{also}. Nothing from this step on was saved"
        )


def out_of_memory_error(
    error: BaseException, config: TrainConfig, device: torch.device, rows: int, step: int, validation: bool = False
) -> UserError:
    """The ``UserError`` for ``error``, an out-of-memory on ``device`` at ``step`` (in the validation after it when
    ``validation``: it runs the same micro-batches), naming the batch settings and the micro-batch knob; ``rows``:
    how many rows this process runs (of the global ``batch_size``)."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    at_once = rows_at_once(rows, 1, config.micro_batch_size)
    fix = f"set {micro_batch_hint(at_once)}" if at_once > 1 else "lower seq_len or the model's size"
    when = f"in the validation after step {step}" if validation else f"at step {step}"
    return UserError(
        f"{device} ran out of memory {when} ({first}) with batch_size {config.batch_size}, seq_len "
        f"{config.seq_len}, micro_batch_size {config.micro_batch_size} ({at_once} rows per forward pass in this "
        f"process): {fix}, or lower batch_size or seq_len"
    )
