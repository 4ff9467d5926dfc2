"""Stage ``model`` (task ``train_model``): the shards + the tokenizer -> ``model/<version>/model.ckpt``.

The token shards are materialised once into flat token files in the build's work directory and opened as
read-only ``np.memmap``; ``mygpt.train`` draws random windows from them (the chapter's ``get_batch``), so the
corpus is never copied into Python objects. Checkpoints go to ``work/train.ckpt`` atomically every
``checkpoint_every`` steps; the work directory survives a crash (SIGKILL, OOM, Ctrl-C), so rerunning the flow
builds the same version again and ``mygpt.train`` resumes from the last checkpoint (bit-identical on CPU/fp32).

Published files: ``model.ckpt`` (the chapter's checkpoint format, no optimizer state; loads with
``mygpt generate --checkpoint``), ``loss_history.json`` and ``loss_history.csv``.

Device and precision are part of the version once resolved (``device="auto"`` becomes ``cpu``/``cuda``/``mps``,
``precision="auto"`` becomes ``fp32``/``bf16``; :class:`tasks.settings.DeviceSettings`), because they change the
weights: the same settings on a machine that resolves them differently give a different version instead of
silently reusing weights trained elsewhere.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import io
import json
import math
import os
import time
from pathlib import Path

from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from mygpt.errors import UserError
from tasks.settings import DeviceSettings, RunOptions, Seed
from tasks.stage import BuildContext, Stage, StageRef, stage_task, summary_table

CHECKPOINT = "train.ckpt"  # in ctx.work: the resume checkpoint
SPLITS = {"train": ("train",), "all": ("train", "valid", "test")}
# Test hook: after the first checkpoint, stall (so a test can SIGKILL the process at a known point).
STALL_ENV = "WIKI_PIPELINE_TEST_STALL_AFTER_CHECKPOINT"


class ModelSettings(DeviceSettings):
    """The chapter's model (§28.6) and its training recipe. ``device``/``precision`` come from DeviceSettings."""

    # the model
    embed_dim: int = Field(192, ge=1, description="width of the residual stream; the chapter uses 192")
    num_layers: int = Field(4, ge=1, description="transformer blocks; the chapter uses 4")
    num_heads: int = Field(6, ge=1, description="query heads; must divide embed_dim; the chapter uses 6")
    num_kv_heads: int = Field(2, ge=1, description="key/value heads (GQA); must divide num_heads; the chapter uses 2")
    max_seq_len: int = Field(256, ge=1, description="longest context the model sees; the chapter uses 256")
    norm: Literal["layer", "rms"] = Field("rms", description="RMSNorm (the chapter) or LayerNorm")
    position: Literal["learned", "rope"] = Field("rope", description="RoPE (the chapter) or learned positions")
    # the recipe
    steps: int = Field(10_000, ge=1, description="optimizer steps; the chapter trains 10000")
    batch_size: int = Field(16, ge=1, description="sequences per step; the chapter uses 16")
    seq_len: int = Field(256, ge=1, description="tokens per training sequence; <= max_seq_len; the chapter uses 256")
    lr: float = Field(1e-3, gt=0, description="AdamW peak learning rate; 1e-3 is what the chapter's printed run "
                                              "used (its table says 3e-4)")
    schedule: Literal["constant", "cosine"] = Field("cosine", description="learning-rate schedule after warmup")
    warmup: int = Field(500, ge=0, description="linear warmup steps; the chapter uses 500")
    max_grad_norm: float = Field(1.0, ge=0, description="gradient clipping norm; 0 = no clipping")
    print_every: int = Field(200, ge=0, description="record the training loss every N steps")
    eval_every: int = Field(500, ge=0, description="validation loss (valid split) every N steps; 0 = at every "
                                                   "print point")
    eval_batches: int = Field(20, ge=1, description="batches per validation estimate")
    checkpoint_every: int = Field(1000, ge=0, description="resume checkpoint every N steps (a crash costs at most "
                                                          "that many); 0 = at the end only")
    seed: Seed = Field(1337, description="initial weights and batch order")
    train_splits: Literal["train", "all"] = Field(
        "train", description="train on the train split, or on all three (the chapter's wikipedia.txt run)")

    def progress_unit(self) -> tuple[str, float]:
        return ("tokens", self.batch_size * self.seq_len)  # per step: the rate shown while training

    @model_validator(mode="after")
    def _consistent(self) -> "ModelSettings":
        from mygpt.model import validate_config  # the library's own shape rules, stated once

        validate_config(vocab_size=2,  # not known before the tokenizer exists; any valid value checks the rest
                        embed_dim=self.embed_dim, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                        num_layers=self.num_layers, max_seq_len=self.max_seq_len, norm_type=self.norm,
                        position_type=self.position)
        if self.seq_len > self.max_seq_len:
            raise UserError(f"seq_len ({self.seq_len}) must be <= max_seq_len ({self.max_seq_len}); the chapter "
                            "uses 256 for both")
        return self


class ConcatTokens:
    """Several 1-D token memmaps seen as one (for train_splits="all"); slicing copies only the window."""

    def __init__(self, parts: list[np.ndarray]) -> None:
        self.parts = [p for p in parts if len(p)]
        self.starts = np.cumsum([0] + [len(p) for p in self.parts])
        self.shape = (int(self.starts[-1]),)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: slice) -> np.ndarray:
        start, stop, _ = key.indices(len(self))
        pieces = []
        for part, offset in zip(self.parts, self.starts):
            lo, hi = max(start - offset, 0), min(stop - offset, len(part))
            if lo < hi:
                pieces.append(part[lo:hi])
        return np.concatenate(pieces) if len(pieces) > 1 else np.asarray(pieces[0])


def load_tokens(shards_dir: Path, work: Path, splits: tuple[str, ...]):
    """Memory-map the token files of ``splits`` (materialised into ``work`` from the Parquet shards)."""
    from tasks.shard_format import materialize_tokens

    parts = [materialize_tokens(shards_dir, split, work / f"tokens-{split}.bin") for split in splits]
    return parts[0] if len(parts) == 1 else ConcatTokens(parts)


def load_tokenizer(tokenizer_dir: Path):
    from mygpt.bpe import BPETokenizer

    return BPETokenizer.load(Path(tokenizer_dir) / "tokenizer.json")


def _checkpoint_step(path: Path, log) -> int:
    """The step a resume checkpoint holds (0 when there is none; an unreadable one is deleted)."""
    if not path.exists():
        return 0
    from mygpt.checkpoint import load_checkpoint_payload

    try:
        return int((load_checkpoint_payload(path).get("resume") or {}).get("step", 0))
    except UserError as e:
        log.warning("model: cannot resume (%s); starting from step 0", e)
        path.unlink()
        return 0


def build_model(ctx: BuildContext, settings: ModelSettings, shards: Path, tokenizer: Path) -> dict:
    """Train mygpt on the memory-mapped shards (resuming from the work directory's checkpoint) and publish it."""
    import torch

    from mygpt.checkpoint import save_checkpoint
    from mygpt.model import GPT
    from mygpt.train import TrainConfig, train

    s = settings
    bpe = load_tokenizer(tokenizer)
    splits = SPLITS[s.train_splits]
    train_tokens = load_tokens(shards, ctx.work, splits)
    val_tokens = load_tokens(shards, ctx.work, ("valid",))
    ctx.log.info("model: %s training tokens (%s), %s validation tokens, memory-mapped from %s",
                 f"{len(train_tokens):,}", "+".join(splits), f"{len(val_tokens):,}", shards)

    torch.manual_seed(s.seed)  # initial weights from the seed, not from what this process drew before
    model = GPT(bpe.vocab_size, embed_dim=s.embed_dim, num_heads=s.num_heads, num_kv_heads=s.num_kv_heads,
                num_layers=s.num_layers, max_seq_len=s.max_seq_len, norm_type=s.norm, position_type=s.position)
    config = TrainConfig(steps=s.steps, batch_size=s.batch_size, seq_len=s.seq_len, lr=s.lr, schedule=s.schedule,
                         warmup=s.warmup, max_grad_norm=s.max_grad_norm, precision=s.precision,
                         print_every=s.print_every, eval_every=s.eval_every, eval_batches=s.eval_batches,
                         checkpoint_every=s.checkpoint_every, seed=s.seed)
    ckpt = ctx.work / CHECKPOINT
    resumed_from = _checkpoint_step(ckpt, ctx.log)
    if resumed_from:
        ctx.log.info("model: resuming from step %d (checkpoint %s)", resumed_from, ckpt)
    ctx.progress(resumed_from, s.steps, f"step {resumed_from}/{s.steps}", force=True)

    def on_progress(point: dict) -> None:
        val = f" val_loss {point['val_loss']:.4f}" if "val_loss" in point else ""
        ctx.progress(point["step"], s.steps, f"step {point['step']}/{s.steps} loss {point['loss']:.4f}{val}")

    def on_checkpoint(step: int, path: str) -> None:
        if os.environ.get(STALL_ENV) and step < s.steps:
            ctx.log.warning("model: %s is set: stalling after the checkpoint at step %d", STALL_ENV, step)
            while True:
                time.sleep(1)

    with torch_threads(ctx.run.threads):
        result = train(model, bpe, train_tokens, config=config, val_tokens=val_tokens, device=s.device,
                       checkpoint_path=ckpt, resume=True, log=ctx.log.info, on_progress=on_progress,
                       on_checkpoint=on_checkpoint)
    save_checkpoint(model, bpe, ctx.out / "model.ckpt",
                    meta={"stage": "model", "version": ctx.version, "settings": s.version_params()})
    write_history(ctx.out, result.history)
    return {
        "device": result.device, "precision": result.precision, "params": result.params,
        "steps": result.steps, "resumed_from": result.start_step,
        "final_loss": result.final_loss, "final_val_loss": result.final_val_loss,
        "tokens_per_sec": round(result.tokens_per_sec, 1), "train_seconds": round(result.seconds, 3),
        "train_tokens": len(train_tokens), "val_tokens": len(val_tokens), "vocab_size": bpe.vocab_size,
        "loss_curve": [[h["step"], round(h["loss"], 5), round(h["val_loss"], 5) if "val_loss" in h else None]
                       for h in result.history],
    }


def write_history(out: Path, history: list[dict]) -> None:
    (out / "loss_history.json").write_text(json.dumps(history, indent=1) + "\n", encoding="utf-8")
    cols = ["step", "loss", "val_loss", "lr", "tokens_per_sec"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(history)
    (out / "loss_history.csv").write_text(buf.getvalue(), encoding="utf-8")


# ---- the UI artifact: summary + loss curve -------------------------------------------------------------
def loss_curve_svg(curve: list, width: int = 640, height: int = 300) -> str:
    """A small SVG line chart of train (blue) and validation (orange) loss against the step."""
    train_pts = [(s, l) for s, l, _ in curve if l is not None and math.isfinite(l) and l > 0]
    val_pts = [(s, v) for s, _, v in curve if v is not None and math.isfinite(v) and v > 0]
    ys = [y for _, y in train_pts + val_pts]
    if not ys:
        return ""
    lo, hi = min(ys), max(ys)
    log_y = hi / lo > 4  # a steep start would flatten everything else on a linear axis
    f = math.log if log_y else (lambda v: v)
    y0, y1 = f(lo), f(hi) if hi > lo else f(lo) + 1
    x_max = max(max(s for s, _ in train_pts + val_pts), 1)
    left, right, top, bottom = 56, 16, 24, 36
    pw, ph = width - left - right, height - top - bottom

    def px(step, y):
        return left + pw * step / x_max, top + ph * (1 - (f(y) - y0) / (y1 - y0))

    def polyline(pts, color):
        if not pts:
            return ""
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in (px(s, v) for s, v in pts))
        return f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{coords}"/>'

    ticks = []
    for i in range(5):
        v = y0 + (y1 - y0) * i / 4
        value = math.exp(v) if log_y else v
        _, y = px(0, value)
        ticks.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
                     f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{value:.2f}</text>')
    for i in range(5):
        step = x_max * i / 4
        x, _ = px(step, lo)
        ticks.append(f'<text x="{x:.1f}" y="{height - bottom + 16}" font-size="11" text-anchor="middle">'
                     f'{step:,.0f}</text>')
    legend = (f'<text x="{left}" y="16" font-size="12" fill="#1f77b4">train loss</text>'
              + (f'<text x="{left + 80}" y="16" font-size="12" fill="#ff7f0e">val loss</text>' if val_pts else "")
              + f'<text x="{width - right}" y="16" font-size="11" text-anchor="end">'
              f'step ({"log" if log_y else "linear"} loss axis)</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif">'
            f'<rect width="{width}" height="{height}" fill="white"/>{"".join(ticks)}'
            f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>'
            f'{polyline(train_pts, "#1f77b4")}{polyline(val_pts, "#ff7f0e")}{legend}</svg>')


def _fmt(v, spec=".4f") -> str:
    return "–" if v is None else format(v, spec)


def report(manifest: dict) -> str:
    m, p = manifest["metrics"], manifest["settings"]
    curve = m.get("loss_curve", [])
    svg = loss_curve_svg(curve)
    picture = (f"![loss curve](data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode()})\n\n"
               if svg else "")
    step = max(1, math.ceil(len(curve) / 12))
    rows = curve[::step] + ([curve[-1]] if curve and (len(curve) - 1) % step else [])
    table = "\n".join(f"| {s:,} | {_fmt(l)} | {_fmt(v)} |" for s, l, v in rows)
    where = manifest.get("path", f"model/{manifest['version']}")
    resumed = f" (resumed from step {m['resumed_from']:,} after a crash)" if m.get("resumed_from") else ""
    summary = summary_table([
        ("final train loss", _fmt(m.get("final_loss"))),
        ("final val loss", _fmt(m.get("final_val_loss"))),
        ("steps", f"{m.get('steps', 0):,}{resumed}"),
        ("tokens/s", f"{m.get('tokens_per_sec', 0):,.0f}"),
        ("device / precision", f"{m.get('device')} / {m.get('precision')}"),
        ("params", f"{m.get('params', 0):,}"),
        ("model", f"embed {p['embed_dim']}, {p['num_layers']} layers, {p['num_heads']} heads ({p['num_kv_heads']} kv), "
                  f"{p['norm']} norm, {p['position']} positions, max_seq_len {p['max_seq_len']}, "
                  f"vocab {m.get('vocab_size')}"),
        ("recipe", f"batch {p['batch_size']} x seq {p['seq_len']}, lr {p['lr']:g} {p['schedule']} "
                   f"(warmup {p['warmup']}), clip {p['max_grad_norm']}, seed {p['seed']}, splits {p['train_splits']}"),
        ("tokens", f"{m.get('train_tokens', 0):,} train, {m.get('val_tokens', 0):,} validation"),
        ("checkpoint", f"`{where}/model.ckpt` (`mygpt generate --checkpoint {where}/model.ckpt`)"),
    ])
    return f"""# Training: model/{manifest['version']}

{picture}{summary}

| step | train loss | val loss |
|---:|---:|---:|
{table}
"""


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """Run with ``threads`` torch CPU threads (None/0: leave torch's default), restoring the old count."""
    import torch

    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)


STAGE = Stage(name="model", code_version="2", report=report, inputs=("shards", "tokenizer"))


@stage_task(STAGE)
def train_model(shards: StageRef, tokenizer: StageRef, settings: ModelSettings = ModelSettings(),
                run: RunOptions = RunOptions()) -> StageRef:
    """Train mygpt on a shards version with its tokenizer (or reuse that version); a killed run resumes.

    ``run.threads`` (torch CPU threads) changes the speed, not the version."""
    return STAGE.run(build_model, settings, run, shards=shards, tokenizer=tokenizer)
