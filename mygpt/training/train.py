"""The training loop, ``train(model, tokenizer, train_tokens, config=TrainConfig(...))``, with exact resume.

AdamW on random windows of ``train_tokens`` (any 1-D integer array-like; a numpy memmap is the main case), with
warmup and cosine decay (:func:`mygpt.training.config.lr_at`), gradient clipping, bf16 autocast, periodic
validation and atomic checkpoints. A checkpoint's ``resume`` key holds the step, the optimizer, the train config,
every RNG state and the history: resuming from it is bit-identical to an uninterrupted run on CPU/fp32.

In every process of an initialised process group it trains data parallel on the global ``batch_size`` (each rank
its slice of the same drawn batch, :mod:`mygpt.training.parallel`); only rank 0 logs and writes checkpoints.
Design notes: docs/TRAINING.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields

import torch

from mygpt.checkpoint import gpt_config_from_payload, load_checkpoint_payload, save_checkpoint
from mygpt.device import (
    compile_options,
    compile_unavailable,
    deterministic_mode,
    device_warnings,
    resolve_device,
    resolve_precision,
    synchronize,
    tf32_matmuls,
)
from mygpt.errors import UserError
from mygpt.limits import check_memory, check_nproc, check_seq_len
from mygpt.metrics import flops_per_token, format_throughput, peak_tflops, throughput
from mygpt.training.clock import StepClock
from mygpt.training.config import TrainConfig, lr_at
from mygpt.training.data import get_batch, num_tokens
from mygpt.training.guards import FiniteLoss, out_of_memory_error
from mygpt.training.parallel import World, evaluate, forward_backward, wrap_ddp
from mygpt.training.rng import capture_rng, rank_rng, restore_rng

__all__ = ["TrainResult", "clip_gradients", "make_optimizer", "train"]

# Train-config fields that change the trajectory: a resumed run must use the same values.
_RESUME_MUST_MATCH = (
    "batch_size",
    "seq_len",
    "lr",
    "schedule",
    "warmup",
    "max_grad_norm",
    "precision",
    "seed",
    "weight_decay",
)


@dataclass
class TrainResult:
    """What a run did; ``tokens_per_sec`` counts the global batch over training steps only, the warm-up step,
    validation and checkpoints left out (``mfu``: ``None`` where no peak is known)."""

    steps: int
    start_step: int
    final_loss: float | None
    final_val_loss: float | None
    history: list = field(default_factory=list)
    tokens_per_sec: float = 0.0
    device: str = "cpu"
    precision: str = "fp32"
    params: int = 0
    seconds: float = 0.0
    final_val_bpb: float | None = None
    flops_per_token: int = 0
    tflops: float = 0.0
    mfu: float | None = None
    peak_tflops: float | None = None
    world_size: int = 1
    compiled: bool = False
    warnings: list = field(default_factory=list)
    #: the first step this process ran (device setup, compile), timed on its own and left out of tokens_per_sec
    warmup_seconds: float | None = None
    #: bytes: the most this process (rank 0) had allocated on its GPU; ``None`` off CUDA
    peak_memory: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainResult:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def make_optimizer(model, config: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW over ``model``'s parameters. ``config.fused`` takes the fused kernel where torch has one (CPU, CUDA):
    one pass over each parameter instead of a chain of elementwise ops, the same update within float rounding
    (tests/mygpt/training/test_fast_step.py); off, the per-parameter loop (on CUDA, torch's foreach default)."""
    fused = config.fused and device.type in ("cpu", "cuda")
    return torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay, fused=fused or None)


def clip_gradients(model, config: TrainConfig) -> torch.Tensor:
    """Scale ``model``'s gradients to a total norm of at most ``config.max_grad_norm``; with ``config.fused`` in
    one foreach call per device and dtype (the same bits as the loop, tested)."""
    return torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm, foreach=config.fused or None)


def _check_resume_compatible(payload: dict, model, tokenizer, config: TrainConfig, path: str) -> None:
    fix = f"delete {path} (or pass resume=False / a different output) to start over"
    saved_model = gpt_config_from_payload(payload, path).to_checkpoint()
    current = model.config()
    diff = [k for k in current if saved_model.get(k) != current[k]]
    if diff:
        detail = ", ".join(f"{k}: checkpoint {saved_model.get(k)!r} vs now {current[k]!r}" for k in diff)
        raise UserError(f"cannot resume from {path}: the model differs ({detail}); {fix}")
    kind = payload["config"].get("tokenizer_kind", payload.get("tokenizer_kind", "char"))
    state = payload.get("tokenizer_state") or {"chars": payload.get("tokenizer_chars")}
    if kind != tokenizer.kind or _norm_state(state) != _norm_state(tokenizer.state()):
        raise UserError(f"cannot resume from {path}: it was trained with a different tokenizer; {fix}")
    saved_cfg = payload["resume"].get("train_config", {})
    now = asdict(config)
    diff = [k for k in _RESUME_MUST_MATCH if k in saved_cfg and saved_cfg[k] != now[k]]
    if diff:
        detail = ", ".join(f"{k}: checkpoint {saved_cfg[k]!r} vs now {now[k]!r}" for k in diff)
        raise UserError(f"cannot resume from {path}: the training settings differ ({detail}); {fix}")


def _norm_state(state) -> object:
    """Tuples -> lists, recursively, so a state compares equal after a save/load round trip."""
    if isinstance(state, dict):
        return {k: _norm_state(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return [_norm_state(v) for v in state]
    return state


def train(
    model,
    tokenizer,
    train_tokens,
    *,
    config: TrainConfig,
    val_tokens=None,
    device="auto",
    checkpoint_path=None,
    resume: bool = True,
    log: Callable[[str], None] | None = print,
    on_progress: Callable[[dict], None] | None = None,
    on_checkpoint: Callable[[int, str], None] | None = None,
    meta: dict | None = None,
    world: World | None = None,
) -> TrainResult:
    """Train ``model`` in place on ``train_tokens``. ``world`` defaults to the initialised process group (else one
    process); off rank 0 the callbacks are not called."""
    world = world or World.current()
    if not world.is_main:
        log, on_progress, on_checkpoint = None, None, None
    log = log or (lambda _msg: None)
    check_nproc(config.batch_size, world.size)
    dev = resolve_device(device)
    precision = resolve_precision(dev, config.precision)
    check_seq_len(config.seq_len, model.max_seq_len)
    check_memory(
        model.gpt_config,
        config.batch_size,
        config.seq_len,
        device=dev,
        precision=precision,
        nproc=world.size,
        micro_batch_size=config.micro_batch_size,
    )
    if tokenizer.vocab_size != model.vocab_size:
        raise UserError(f"tokenizer vocab_size ({tokenizer.vocab_size}) != model vocab_size ({model.vocab_size})")
    window = config.seq_len + 1
    n_train = num_tokens(train_tokens)
    if n_train < window:
        raise UserError(
            f"the training corpus has {n_train:,} tokens, fewer than one training window of seq_len + 1 = "
            f"{window:,} tokens; use a longer text or a smaller --seq-len"
        )
    if val_tokens is not None:
        n_val = num_tokens(val_tokens)
        if n_val < window:
            raise UserError(
                f"the validation split has {n_val:,} tokens, fewer than one window of seq_len + 1 = {window:,} "
                f"tokens; raise the validation fraction, use a longer text or a smaller --seq-len"
            )
    checkpoint_path = os.fspath(checkpoint_path) if checkpoint_path is not None else None
    warnings: list[str] = []

    def warn(message: str) -> None:
        warnings.append(message)
        log(f"warning: {message}")

    for message in device_warnings(str(device), dev, config.precision, precision):
        warn(message)

    # dropout draws from the global generator: each rank its own masks (rank 0's are a single process's)
    torch.manual_seed(config.seed + world.rank)
    gen = torch.Generator().manual_seed(config.seed)  # batch offsets: a dedicated, checkpointed generator
    model.to(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    model.train()
    optimizer = make_optimizer(model, config, dev)

    start_step = 0
    history: list[dict] = []
    if resume and checkpoint_path and os.path.exists(checkpoint_path):
        payload = load_checkpoint_payload(checkpoint_path)
        state = payload.get("resume")
        if not state:
            log(f"note: {checkpoint_path} holds no resume state; training from step 0 and overwriting it")
        else:
            _check_resume_compatible(payload, model, tokenizer, config, checkpoint_path)
            model.load_state_dict(payload["model_state_dict"])
            optimizer.load_state_dict(state["optimizer"])
            restore_rng(state["rng"], gen, dev, world, seed=config.seed)
            history = list(state.get("history", []))
            start_step = int(state["step"])
            log(f"resuming from {checkpoint_path} at step {start_step}")
            saved_world = int(state.get("world_size", 1))
            if saved_world != world.size:
                log(
                    f"note: the checkpoint was written by {saved_world} process(es), this run has {world.size}; "
                    f"the batch math is the same (results equal up to float rounding)"
                )
    if world.size > 1:
        starts = world.all_gather(start_step)
        if len(set(starts)) != 1:
            raise RuntimeError(
                f"the training processes resumed from different steps {starts}: they do not see the same "
                f"checkpoint {checkpoint_path} (it must be on a filesystem every process shares)"
            )

    step_model = model  # what the training step calls: DDP-wrapped with several processes, maybe compiled
    if world.size > 1:
        step_model = wrap_ddp(model, dev)
    compiled = False
    if config.compile:
        reason = compile_unavailable(dev, probe=True)
        if reason:
            warn(f"compile=True, but torch.compile is unavailable here: {reason}; training without it")
        else:  # around DDP, so its graph breaks at bucket boundaries let the all-reduce overlap the backward pass
            step_model = torch.compile(step_model, options=compile_options(dev))
            compiled = True

    token_bytes = None
    if val_tokens is not None and callable(getattr(tokenizer, "token_bytes", None)):
        tb = torch.as_tensor(tokenizer.token_bytes(), dtype=torch.long)
        if tb.numel() == model.vocab_size:
            token_bytes = tb.to(dev)
    fpt = flops_per_token(model, config.seq_len)
    peak, peak_note = peak_tflops(dev)

    def resume_state(step: int, ranks: list | None) -> dict:
        state = {
            "step": step,
            "optimizer": optimizer.state_dict(),
            "train_config": asdict(config),
            "rng": capture_rng(gen, dev, ranks),
            "history": list(history),
        }
        if world.size > 1:
            state["world_size"] = world.size
        return state

    finite = FiniteLoss(config, dev)

    def save(step: int) -> None:
        finite.check_weights(model, step)  # every rank: the weights are the same everywhere
        ranks = world.all_gather(rank_rng(dev)) if world.size > 1 else None  # every rank takes part
        if not world.is_main:
            return
        save_checkpoint(model, tokenizer, checkpoint_path, resume=resume_state(step, ranks), meta=meta)
        if on_checkpoint is not None:
            on_checkpoint(step, checkpoint_path)

    show_lr = config.schedule != "constant" or config.warmup > 0
    tokens_per_step = config.batch_size * config.seq_len
    rows = world.rows(config.batch_size)
    mine = rows.stop - rows.start if rows else config.batch_size  # this process's rows of the global batch
    final_loss = history[-1]["loss"] if history else None
    final_val_loss = next((h["val_loss"] for h in reversed(history) if "val_loss" in h), None)
    final_val_bpb = next((h.get("val_bpb") for h in reversed(history) if "val_loss" in h), None)
    t_start = time.perf_counter()
    clock = StepClock(start_step + 1, last=config.steps)

    def timed_step(step: int) -> torch.Tensor:
        try:
            x, y = get_batch(train_tokens, config.batch_size, config.seq_len, gen, dev, rows=rows)
            optimizer.zero_grad(set_to_none=True)
            loss = forward_backward(
                step_model,
                x,
                y,
                batch_size=config.batch_size,
                world=world,
                micro_batch_size=config.micro_batch_size,
                device=dev,
                precision=precision,
            )
            finite.see(step, loss)
            if config.max_grad_norm > 0:
                clip_gradients(model, config)
            optimizer.step()
        except torch.OutOfMemoryError as e:
            raise out_of_memory_error(e, config, dev, mine, step) from None
        return loss

    def validate(step: int) -> tuple[float, float | None]:
        try:
            return evaluate(
                model,
                val_tokens,
                batch_size=config.batch_size,
                seq_len=config.seq_len,
                batches=config.eval_batches,
                seed=config.seed + 1,
                device=dev,
                precision=precision,
                world=world,
                token_bytes=token_bytes,
                micro_batch_size=config.micro_batch_size,
            )
        except torch.OutOfMemoryError as e:
            raise out_of_memory_error(e, config, dev, mine, step, validation=True) from None

    if start_step >= config.steps:
        log(f"checkpoint is already at step {start_step} >= steps ({config.steps}); nothing to train")

    with tf32_matmuls(dev, config.tf32), deterministic_mode():
        for step in range(start_step + 1, config.steps + 1):
            lr = lr_at(config, step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss = timed_step(step)
            world.after_step(step)
            if clock.step_done(step):  # the warm-up step: timed on its own once the device has finished it
                synchronize(dev)
                clock.warmed_up()

            last = step == config.steps
            is_print = config.print_every > 0 and (step == 1 or step % config.print_every == 0 or last)
            if val_tokens is None:
                is_eval = False
            elif config.eval_every > 0:
                is_eval = step % config.eval_every == 0 or last
            else:
                is_eval = is_print or last
            is_ckpt = bool(checkpoint_path) and config.checkpoint_every > 0 and step % config.checkpoint_every == 0

            if is_print or is_eval or is_ckpt or last:
                finite.check()
                # .item() synchronises the device, so the interval timing below is honest
                final_loss = world.all_reduce_sum(loss.clone() if world.size > 1 else loss).item()
                tps = clock.interval(tokens_per_step)
                estimate = clock.estimate_line(step)
                if estimate is not None:
                    log(estimate)
                point = {"step": step, "loss": final_loss, "lr": lr, "tokens_per_sec": tps}
                if is_eval:
                    final_val_loss, final_val_bpb = validate(step)
                    point["val_loss"] = final_val_loss
                    if final_val_bpb is not None:
                        point["val_bpb"] = final_val_bpb
                if is_print or is_eval:
                    history.append(point)
                    line = f"step {step}: loss = {final_loss:.4f}"
                    if show_lr:
                        line += f" lr = {lr:.2e}"
                    if "val_loss" in point:
                        line += f" val_loss = {point['val_loss']:.4f}"
                    if "val_bpb" in point:
                        line += f" val_bpb = {point['val_bpb']:.4f}"
                    log(line)
                    if on_progress is not None:
                        on_progress({**point, "steps": config.steps, **throughput(tps, fpt, peak, world.size)})
                if is_ckpt and not last:
                    save(step)
                    log(f"  [checkpoint saved at step {step}]")
                clock.restart()

    ran = config.steps - start_step
    tokens_per_sec = clock.tokens_per_sec(tokens_per_step)
    numbers = throughput(tokens_per_sec, fpt, peak, world.size)
    if ran > 0:
        finite.check_weights(model, config.steps)  # also where only ``output`` is written, after this returns
        if clock.warmup_seconds is not None:
            log(clock.warmup_line(compiled))
        tflops, mfu = numbers["tflops"], numbers["mfu"]
        log(format_throughput(tokens_per_sec, fpt, tflops, mfu, peak, peak_note, world.size, span=clock.span()))
    if checkpoint_path and ran > 0:
        save(config.steps)
        log(f"saved checkpoint to {checkpoint_path}")

    return TrainResult(
        steps=max(config.steps, start_step),
        start_step=start_step,
        final_loss=final_loss,
        final_val_loss=final_val_loss,
        history=history,
        tokens_per_sec=tokens_per_sec,
        device=str(dev),
        precision=precision,
        params=model.num_params(),
        seconds=time.perf_counter() - t_start,
        final_val_bpb=final_val_bpb,
        flops_per_token=fpt,
        tflops=numbers["tflops"],
        mfu=numbers["mfu"],
        peak_tflops=peak,
        world_size=world.size,
        compiled=compiled,
        warnings=warnings,
        warmup_seconds=clock.warmup_seconds,
        peak_memory=int(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else None,
    )
