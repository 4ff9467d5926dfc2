"""Stage 4, train: the encode stage's shards + the tokenizer -> ``model/<version>/model.ckpt``.

The token shards are materialised once into flat token files in the build's work directory and opened as
read-only ``np.memmap``; ``mygpt.train`` draws random windows from them (the chapter's ``get_batch``), so the
corpus is never copied into Python objects. Checkpoints go to ``work/train.ckpt`` atomically every
``checkpoint_every`` steps; the work directory survives a crash (SIGKILL, OOM, Ctrl-C), so rerunning the flow
builds the same version again and ``mygpt.train`` resumes from the last checkpoint (bit-identical on CPU/fp32).

Published files: ``model.ckpt`` (the chapter's checkpoint format, no optimizer state; loads with
``mygpt generate --checkpoint``), ``loss_history.json`` and ``loss_history.csv``.

Device and precision are part of the version: the flow passes the *resolved* values (``device="auto"`` becomes
``cpu``/``cuda``/``mps``, ``precision="auto"`` becomes ``fp32``/``bf16``), because they change the weights; the
same parameters on a machine that resolves them differently give a different version instead of silently
reusing weights trained elsewhere.
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

import numpy as np

from mygpt.errors import UserError
from tasks.stage import StageRef, StageSpec, call_stage, stage_task, summary_table

CODE_VERSION = "1"
CHECKPOINT = "train.ckpt"  # in ctx.work: the resume checkpoint
SPLITS = {"train": ("train",), "all": ("train", "valid", "test")}
# Test hook: after the first checkpoint, stall (so a test can SIGKILL the process at a known point).
STALL_ENV = "WIKI_PIPELINE_TEST_STALL_AFTER_CHECKPOINT"

# Parameters of this stage with the chapter's defaults (§28.6); flows/params.py validates them.
DEFAULTS = dict(
    embed_dim=192, num_layers=4, num_heads=6, num_kv_heads=2, max_seq_len=256, norm="rms", position="rope",
    steps=10_000, batch_size=16, seq_len=256, lr=1e-3, schedule="cosine", warmup=500, max_grad_norm=1.0,
    precision="auto", print_every=200, eval_every=500, eval_batches=20, checkpoint_every=1000, seed=1337,
    device="auto", train_splits="train",
)


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
        log.warning("train: cannot resume (%s); starting from step 0", e)
        path.unlink()
        return 0


def build(ctx) -> dict:
    import torch

    from mygpt.checkpoint import save_checkpoint
    from mygpt.model import GPT
    from mygpt.train import TrainConfig, train as train_model

    p = ctx.params
    tokenizer = load_tokenizer(ctx.input_path("tokenizer"))
    shards = ctx.input_path("shards")
    train_tokens = load_tokens(shards, ctx.work, SPLITS[p["train_splits"]])
    val_tokens = load_tokens(shards, ctx.work, ("valid",))
    ctx.log.info("train: %s training tokens (%s), %s validation tokens, memory-mapped from %s",
                 f"{len(train_tokens):,}", "+".join(SPLITS[p["train_splits"]]), f"{len(val_tokens):,}", shards)

    torch.manual_seed(p["seed"])  # initial weights from the seed, not from what this process drew before
    model = GPT(tokenizer.vocab_size, embed_dim=p["embed_dim"], num_heads=p["num_heads"],
                num_kv_heads=p["num_kv_heads"], num_layers=p["num_layers"], max_seq_len=p["max_seq_len"],
                norm_type=p["norm"], position_type=p["position"])
    config = TrainConfig(**{k: p[k] for k in ("steps", "batch_size", "seq_len", "lr", "schedule", "warmup",
                                              "max_grad_norm", "precision", "print_every", "eval_every",
                                              "eval_batches", "checkpoint_every", "seed")})
    ckpt = ctx.work / CHECKPOINT
    resumed_from = _checkpoint_step(ckpt, ctx.log)
    if resumed_from:
        ctx.log.info("train: resuming from step %d (checkpoint %s)", resumed_from, ckpt)
    ctx.progress(resumed_from, p["steps"], f"step {resumed_from}/{p['steps']}", force=True)

    def on_progress(point: dict) -> None:
        val = f" val_loss {point['val_loss']:.4f}" if "val_loss" in point else ""
        ctx.progress(point["step"], p["steps"], f"step {point['step']}/{p['steps']} loss {point['loss']:.4f}{val}")

    def on_checkpoint(step: int, path: str) -> None:
        if os.environ.get(STALL_ENV) and step < p["steps"]:
            ctx.log.warning("train: %s is set: stalling after the checkpoint at step %d", STALL_ENV, step)
            while True:
                time.sleep(1)

    with torch_threads(ctx.options.get("threads")):
        result = train_model(model, tokenizer, train_tokens, config=config, val_tokens=val_tokens,
                             device=p["device"], checkpoint_path=ckpt, resume=True, log=ctx.log.info,
                             on_progress=on_progress, on_checkpoint=on_checkpoint)
    save_checkpoint(model, tokenizer, ctx.out / "model.ckpt",
                    meta={"stage": "model", "version": ctx.version, "params": p})
    write_history(ctx.out, result.history)
    return {
        "device": result.device, "precision": result.precision, "params": result.params,
        "steps": result.steps, "resumed_from": result.start_step,
        "final_loss": result.final_loss, "final_val_loss": result.final_val_loss,
        "tokens_per_sec": round(result.tokens_per_sec, 1), "train_seconds": round(result.seconds, 3),
        "train_tokens": len(train_tokens), "val_tokens": len(val_tokens), "vocab_size": tokenizer.vocab_size,
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
    m, p = manifest["metrics"], manifest["params"]
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


SPEC = StageSpec(name="model", task_name="train", artifact_key="wiki-training", code_version=CODE_VERSION,
                 build=build, report=report, inputs=("shards", "tokenizer"))
TASK = stage_task(SPEC)


def _check_int(name: str, value, lo: int, fix: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise UserError(f"{name} must be an integer >= {lo}, got {value!r}" + (f"; {fix}" if fix else ""))


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise UserError(f"{name} must be one of {', '.join(map(str, choices))}; got {value!r}")


def resolve_device_params(params: dict) -> dict:
    """``device``/``precision`` as the version sees them: what ``auto`` resolves to on this machine."""
    from mygpt.device import resolve_device, resolve_precision

    try:
        device = resolve_device(params["device"])
    except UserError as e:
        raise UserError(f"device: {e}") from None
    try:
        precision = resolve_precision(device, params["precision"])
    except UserError as e:
        raise UserError(f"precision: {e}") from None
    return {**params, "device": str(device), "precision": precision}


def check_threads(threads) -> None:
    if threads is not None:
        _check_int("threads", threads, 0, "0 or None = torch's default (one per core)")


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


def validate(threads: int | None = None, **params) -> dict:
    """Check the train parameters (``UserError`` naming the parameter); return the version parameters:
    ``DEFAULTS`` filled in, ``device``/``precision`` resolved. ``threads`` is a run option, not a parameter."""
    from mygpt.model import NORM_TYPES, POSITION_TYPES
    from mygpt.train import TrainConfig

    check_threads(threads)
    unknown = sorted(set(params) - set(DEFAULTS))
    if unknown:
        raise UserError(f"unknown train parameter(s) {unknown}; known: {', '.join(DEFAULTS)}")
    p = {**DEFAULTS, **params}
    for name in ("embed_dim", "num_layers", "num_heads", "num_kv_heads", "max_seq_len"):
        _check_int(name, p[name], 1)
    if p["embed_dim"] % p["num_heads"]:
        raise UserError(f"num_heads ({p['num_heads']}) must divide embed_dim ({p['embed_dim']}); the chapter "
                        "uses embed_dim=192, num_heads=6 (head size 32)")
    if p["num_heads"] % p["num_kv_heads"]:
        raise UserError(f"num_kv_heads ({p['num_kv_heads']}) must divide num_heads ({p['num_heads']}); the "
                        "chapter uses num_heads=6, num_kv_heads=2")
    _check_choice("norm", p["norm"], NORM_TYPES)
    _check_choice("position", p["position"], POSITION_TYPES)
    if p["position"] == "rope" and (p["embed_dim"] // p["num_heads"]) % 2:
        raise UserError(f"position 'rope' needs an even head size, but embed_dim/num_heads = "
                        f"{p['embed_dim']}/{p['num_heads']} is odd; change num_heads or use position='learned'")
    _check_int("steps", p["steps"], 1, "the chapter trains 10000 steps")
    _check_int("seq_len", p["seq_len"], 1)
    if p["seq_len"] > p["max_seq_len"]:
        raise UserError(f"seq_len ({p['seq_len']}) must be <= max_seq_len ({p['max_seq_len']}); the chapter "
                        "uses 256 for both")
    _check_choice("train_splits", p["train_splits"], tuple(SPLITS))
    _check_choice("precision", p["precision"], ("auto", "fp32", "bf16"))
    if not isinstance(p["device"], str):
        raise UserError(f"device must be a string (auto, cpu, cuda, cuda:N or mps), got {p['device']!r}")
    try:  # the rest of the recipe, with the library's own checks
        TrainConfig.from_dict(p).validate()
    except UserError as e:
        raise UserError(f"train parameter {e}") from None
    if isinstance(p["lr"], int):
        p["lr"] = float(p["lr"])
    if isinstance(p["max_grad_norm"], int):
        p["max_grad_norm"] = float(p["max_grad_norm"])
    return resolve_device_params(p)


def train(artifacts_dir: str | os.PathLike, shards: StageRef, tokenizer: StageRef, *, threads: int | None = None,
          force: bool = False, full_check: bool = False, **params) -> StageRef:
    """Run (or reuse) the train stage: the ``train`` task inside a flow, a plain call outside one.

    ``params``: any of ``DEFAULTS`` (the chapter's recipe). ``threads`` (torch CPU threads) is a run option:
    not in the version (it changes the speed; on CPU the weights agree to float rounding at most)."""

    return call_stage(SPEC, TASK, artifacts_dir, validate(threads, **params),
                      {"shards": shards, "tokenizer": tokenizer}, force=force, full_check=full_check,
                      options={"threads": threads} if threads else None)
