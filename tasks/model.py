"""Stage ``model`` (task ``train_model``): the shards + the tokenizer -> ``model/<version>/model.ckpt``.

The token shards are materialised once into flat token files in the build's work directory and opened as
read-only ``np.memmap``; ``mygpt.training.train`` draws random windows from them (the chapter's ``get_batch``), so the
corpus is never copied into Python objects. Checkpoints go to ``work/train.ckpt`` atomically every
``checkpoint_every`` steps; the work directory survives a crash (SIGKILL, OOM, Ctrl-C), so rerunning the flow
builds the same version again and ``mygpt.training.train`` resumes from the last checkpoint (bit-identical on CPU/fp32).

Published files: ``model.ckpt`` (the chapter's checkpoint format, no optimizer state; loads with
``mygpt generate --checkpoint``), ``loss_history.json`` and ``loss_history.csv``.

Device and precision are part of the version once resolved (``device="auto"`` becomes ``cpu``/``cuda``/``mps``,
``precision="auto"`` becomes ``fp32``/``bf16``; :class:`tasks.core.settings.DeviceSettings`), because they change the
weights: the same settings on a machine that resolves them differently give a different version instead of
silently reusing weights trained elsewhere. ``nproc`` (resolved: ``"auto"`` becomes the number) and ``compile``
are part of it too: the global batch is the same for every world size, but gradients summed across processes
(and compiled kernels) round differently, so the weights are equal only up to float rounding, not bit-identical.

Training goes through :func:`mygpt.training.distributed.run_training`: ``nproc=1`` trains in this process (exactly
``mygpt.training.train.train``); ``nproc > 1`` runs ``torch.distributed.run`` (torchrun) with one process per rank (NCCL
on CUDA, gloo on CPU), whose per-rank logs are in ``work/ranks/`` of the build's staging directory (kept when
the stage fails, removed with the staging directory when it publishes). Either way the resume checkpoint is
``work/train.ckpt``, written by rank 0, and a rerun resumes from it; a rank that dies alone fails the stage with
:class:`mygpt.training.distributed.TrainingProcessError` (which rank, how, the tail of its log), never a hang.

Metrics: tokens/s, FLOPs per token, achieved TFLOP/s, MFU (``None``, shown ``n/a``, on CPU) and validation bits
per byte next to the validation loss (:mod:`mygpt.metrics`).
"""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import os
import time
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from mygpt.errors import UserError
from tasks.core.report import line_chart, number, summary_table
from tasks.core.settings import DeviceSettings, Seed
from tasks.core.stage import BuildContext, Stage, stage_task
from tasks.tokenizer import load_tokenizer

CHECKPOINT = "train.ckpt"  # in ctx.work: the resume checkpoint
SPLITS = {"train": ("train",), "all": ("train", "valid", "test")}
# Test hook: after the first checkpoint, stall (so a test can SIGKILL the process at a known point).
STALL_ENV = "WIKI_PIPELINE_TEST_STALL_AFTER_CHECKPOINT"


class ModelSettings(DeviceSettings):
    """The chapter's model (§28.6) and its training recipe. ``device``/``precision`` come from DeviceSettings;
    ``nproc``/``compile`` say how it runs on them (and, resolved, enter the version like them)."""

    # how it runs, besides device and precision
    nproc: int | Literal["auto"] = Field(
        1,
        description="training processes on this node, data parallel under torchrun (NCCL on cuda, gloo on cpu); "
        "batch_size stays the global batch; auto = one per visible GPU on cuda, else 1",
    )
    compile: bool = Field(
        False, description="torch.compile the model (a warning and eager training where it is unavailable)"
    )
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
    lr: float = Field(
        1e-3,
        gt=0,
        description="AdamW peak learning rate; 1e-3 is what the chapter's printed run used (its table says 3e-4)",
    )
    schedule: Literal["constant", "cosine"] = Field("cosine", description="learning-rate schedule after warmup")
    warmup: int = Field(500, ge=0, description="linear warmup steps; the chapter uses 500")
    max_grad_norm: float = Field(1.0, ge=0, description="gradient clipping norm; 0 = no clipping")
    print_every: int = Field(200, ge=0, description="record the training loss every N steps")
    eval_every: int = Field(
        500, ge=0, description="validation loss (valid split) every N steps; 0 = at every print point"
    )
    eval_batches: int = Field(20, ge=1, description="batches per validation estimate")
    checkpoint_every: int = Field(
        1000, ge=0, description="resume checkpoint every N steps (a crash costs at most that many); 0 = at the end only"
    )
    seed: Seed = Field(1337, description="initial weights and batch order")
    train_splits: Literal["train", "all"] = Field(
        "train", description="train on the train split, or on all three (the chapter's wikipedia.txt run)"
    )

    def progress_unit(self) -> tuple[str, float]:
        return ("tokens", self.batch_size * self.seq_len)  # per step: the rate shown while training

    @field_validator("nproc", mode="before")
    @classmethod
    def _nproc(cls, value):
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError(
            f"nproc must be an integer >= 1 or 'auto', got {value!r} ({cls.model_fields['nproc'].description})"
        )

    def resolved(self) -> ModelSettings:
        """Device and precision (DeviceSettings), then ``nproc`` as a number this machine can run: the one place
        the pipeline resolves it (``mygpt.training.distributed.resolve_nproc``); the stage passes the number on."""
        from mygpt.limits import check_nproc
        from mygpt.training.distributed import resolve_nproc

        s = super().resolved()
        try:
            nproc = resolve_nproc(self.nproc, s.device)
            check_nproc(self.batch_size, nproc)
        except UserError as e:
            raise UserError(f"model.{e}" if str(e).startswith("nproc ") else f"model.nproc: {e}") from None
        cores = os.cpu_count() or 1
        if s.device == "cpu" and nproc > cores:
            raise UserError(
                f"model.nproc ({nproc}) is more than the {cores} CPU cores here; each training process "
                f"needs a core of its own: lower nproc"
            )
        self.check_memory(s.device, s.precision, nproc)
        return s.model_copy(update={"nproc": nproc})

    def check_memory(self, device: str, precision: str, nproc: int, vocab_size: int = 1) -> None:
        """``UserError`` when training this model cannot fit this machine (``mygpt.limits.check_memory``). Before
        the tokenizer exists the vocabulary is unknown: 1 keeps the estimate a lower bound (the training run
        checks again with the real one)."""
        from mygpt.limits import check_memory

        try:
            check_memory(
                self.gpt_config(vocab_size),
                self.batch_size,
                self.seq_len,
                device=device,
                precision=precision,
                nproc=nproc,
            )
        except UserError as e:
            raise UserError(f"model.{e}" if not str(e).startswith("the ") else f"model: {e}") from None

    def gpt_config(self, vocab_size: int):
        """The model these settings describe, as the library's ``GPTConfig`` (``norm``/``position`` are its
        ``norm_type``/``position_type``); ``vocab_size`` comes from the tokenizer."""
        from mygpt.gpt_config import GPTConfig

        return GPTConfig(
            vocab_size=vocab_size,
            embed_dim=self.embed_dim,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            num_layers=self.num_layers,
            max_seq_len=self.max_seq_len,
            norm_type=self.norm,
            position_type=self.position,
        )

    @model_validator(mode="after")
    def _consistent(self) -> ModelSettings:
        from mygpt.limits import check_seq_len  # the library's own rules, stated once (torch-free)

        self.gpt_config(vocab_size=2)  # the shape rules; vocab_size is not known before the tokenizer exists
        check_seq_len(self.seq_len, self.max_seq_len, hint="the chapter uses 256 for both")
        return self


def token_files(shards_dir: Path, work: Path, splits: tuple[str, ...]) -> tuple[list[str], str, int]:
    """The flat token files of ``splits``, materialised into ``work`` from the Parquet shards (an empty split
    gives an empty file): ``(paths, numpy dtype name, tokens in all)``. Training memory-maps them."""
    from mygpt.atomic import atomic_write_bytes
    from tasks.core.shard_format import materialize_tokens

    paths, dtypes, total = [], set(), 0
    for split in splits:
        dest = work / f"tokens-{split}.bin"
        tokens = materialize_tokens(shards_dir, split, dest)
        if not len(tokens) and not dest.exists():
            atomic_write_bytes(dest, b"")
        paths.append(str(dest))
        dtypes.add(tokens.dtype.name)
        total += len(tokens)
    if len(dtypes) > 1:
        raise UserError(
            f"the splits {', '.join(splits)} in {shards_dir} hold different token types "
            f"({', '.join(sorted(dtypes))}); rebuild the shards"
        )
    return paths, dtypes.pop(), total


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
    """Train mygpt on the memory-mapped shards with ``nproc`` processes (resuming from the work directory's
    checkpoint) and publish it."""
    from dataclasses import asdict

    # torch's TorchInductor cache goes to the user's cache folder, not TMPDIR (where torch would leave a
    # torchinductor_<user> folder behind on every build); this process's training ranks inherit it
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "wiki-pipeline" / "torchinductor"
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache))

    import mygpt.training.distributed as dist
    from mygpt.training.train import TrainConfig

    s = settings
    vocab_size = load_tokenizer(tokenizer).vocab_size
    splits = SPLITS[s.train_splits]
    train_paths, dtype, n_train = token_files(shards, ctx.work, splits)
    val_paths, _, n_val = token_files(shards, ctx.work, ("valid",))
    ctx.log.info(
        "model: %s training tokens (%s), %s validation tokens, memory-mapped from %s",
        f"{n_train:,}",
        "+".join(splits),
        f"{n_val:,}",
        shards,
    )

    config = TrainConfig(
        steps=s.steps,
        batch_size=s.batch_size,
        seq_len=s.seq_len,
        lr=s.lr,
        schedule=s.schedule,
        warmup=s.warmup,
        max_grad_norm=s.max_grad_norm,
        precision=s.precision,
        print_every=s.print_every,
        eval_every=s.eval_every,
        eval_batches=s.eval_batches,
        checkpoint_every=s.checkpoint_every,
        seed=s.seed,
        compile=s.compile,
    )
    ckpt = ctx.work / CHECKPOINT
    job = dist.TrainJob(
        tokenizer=str(Path(tokenizer) / "tokenizer.json"),
        train_tokens=train_paths,
        val_tokens=val_paths[0],
        token_dtype=dtype,
        model=asdict(s.gpt_config(vocab_size)),
        train=asdict(config),
        device=s.device,
        checkpoint=str(ckpt),
        output=str(ctx.out / "model.ckpt"),
        meta={"stage": "model", "version": ctx.version, "settings": s.version_params()},
        threads=ctx.run.threads or 0,
    )
    resumed_from = _checkpoint_step(ckpt, ctx.log)
    if resumed_from:
        ctx.log.info("model: resuming from step %d (checkpoint %s)", resumed_from, ckpt)
    ctx.progress(resumed_from, s.steps, f"step {resumed_from}/{s.steps}", force=True)

    def log(message: str) -> None:  # the library's lines; its warnings (bf16 on a slow CPU, compile) as warnings
        if message.startswith("warning: "):
            ctx.log.warning("model: %s", message.removeprefix("warning: "))
        else:
            ctx.log.info("%s", message)

    def on_progress(point: dict) -> None:
        val = f" val_loss {point['val_loss']:.4f}" if "val_loss" in point else ""
        val += f" val_bpb {point['val_bpb']:.4f}" if "val_bpb" in point else ""
        ctx.progress(point["step"], s.steps, f"step {point['step']}/{s.steps} loss {point['loss']:.4f}{val}")

    stall = bool(os.environ.get(STALL_ENV))

    def on_checkpoint(step: int, path: str) -> None:
        ctx.save(Path(path))  # an object-store root: a rerun on another machine resumes from this step
        if stall and s.nproc == 1 and step < s.steps:  # with several processes rank 0 stalls (env below)
            ctx.log.warning("model: %s is set: stalling after the checkpoint at step %d", STALL_ENV, step)
            while True:
                time.sleep(1)

    nproc = s.nproc
    assert isinstance(nproc, int)  # the stage builds with resolved() settings: "auto" is a number by now
    result = dist.run_training(
        job,
        nproc,
        log=log,
        on_progress=on_progress,
        on_checkpoint=on_checkpoint,
        env={dist.STALL_ENV: "1"} if stall else None,
        run_dir=ctx.work / "ranks",
    )
    write_history(ctx.out, result.history)  # the log already has the throughput line and val_bpb at each eval
    return {
        "device": result.device,
        "precision": result.precision,
        "nproc": s.nproc,
        "compiled": result.compiled,
        "params": result.params,
        "steps": result.steps,
        "resumed_from": result.start_step,
        "final_loss": result.final_loss,
        "final_val_loss": result.final_val_loss,
        "final_val_bpb": result.final_val_bpb,
        "tokens_per_sec": round(result.tokens_per_sec, 1),
        "flops_per_token": result.flops_per_token,
        "tflops": result.tflops,
        "mfu": result.mfu,
        "peak_tflops": result.peak_tflops,
        "train_seconds": round(result.seconds, 3),
        "warnings": result.warnings,
        "train_tokens": n_train,
        "val_tokens": n_val,
        "vocab_size": vocab_size,
        "loss_curve": [
            [h["step"], round(h["loss"], 5), round(h["val_loss"], 5) if "val_loss" in h else None]
            for h in result.history
        ],
    }


def write_history(out: Path, history: list[dict]) -> None:
    from mygpt.atomic import atomic_write_text

    atomic_write_text(out / "loss_history.json", json.dumps(history, indent=1) + "\n")
    cols = ["step", "loss", "val_loss", "val_bpb", "lr", "tokens_per_sec"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(history)
    atomic_write_text(out / "loss_history.csv", buf.getvalue())


def loss_curve_svg(curve: list) -> str:
    """The training report's chart: train (blue) and validation (orange) loss against the step."""
    return line_chart(
        [
            ("train loss", "#1f77b4", [(s, t) for s, t, _ in curve]),
            ("val loss", "#ff7f0e", [(s, v) for s, _, v in curve]),
        ],
        x_title="step",
        y_title="loss",
    )


def _fmt(v, spec=".4f") -> str:
    return "–" if v is None else format(v, spec)


def report(manifest: dict) -> str:
    m, p = manifest["metrics"], manifest["settings"]
    curve = m.get("loss_curve", [])
    svg = loss_curve_svg(curve)
    picture = f"![loss curve](data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode()})\n\n" if svg else ""
    step = max(1, math.ceil(len(curve) / 12))
    rows = curve[::step] + ([curve[-1]] if curve and (len(curve) - 1) % step else [])
    table = "\n".join(f"| {s:,} | {_fmt(t)} | {_fmt(v)} |" for s, t, v in rows)
    where = manifest.get("path", f"model/{manifest['version']}")
    resumed = f" (resumed from step {m['resumed_from']:,} after a crash)" if m.get("resumed_from") else ""
    mfu = m.get("mfu")
    summary = summary_table(
        [
            ("final train loss", _fmt(m.get("final_loss"))),
            ("final val loss", _fmt(m.get("final_val_loss"))),
            ("final val bits per byte", _fmt(m.get("final_val_bpb"))),
            ("steps", f"{m.get('steps', 0):,}{resumed}"),
            ("tokens/s", f"{m.get('tokens_per_sec', 0):,.0f}"),
            ("FLOPs per token", f"{m.get('flops_per_token', 0):,} (6N + 12·L·H·Q·T)"),
            ("achieved TFLOP/s", f"{m.get('tflops', 0):.4g}"),
            (
                "MFU",
                "n/a"
                if mfu is None
                else f"{100 * mfu:.1f}% of {m.get('nproc', 1)} x {m.get('peak_tflops'):g} TFLOP/s bf16 peak",
            ),
            ("device / precision", f"{m.get('device')} / {m.get('precision')}"),
            (
                "processes / compile",
                f"{m.get('nproc', 1)} / {'on' if m.get('compiled') else 'off'}"
                + (" (asked for, unavailable)" if p.get("compile") and not m.get("compiled") else ""),
            ),
            ("params", f"{m.get('params', 0):,}"),
            (
                "model",
                f"embed {p['embed_dim']}, {p['num_layers']} layers, {p['num_heads']} heads ({p['num_kv_heads']} kv), "
                f"{p['norm']} norm, {p['position']} positions, max_seq_len {p['max_seq_len']}, "
                f"vocab {m.get('vocab_size')}",
            ),
            (
                "recipe",
                f"batch {p['batch_size']} x seq {p['seq_len']}, lr {p['lr']:g} {p['schedule']} "
                f"(warmup {p['warmup']}), clip {p['max_grad_norm']}, seed {p['seed']}, splits {p['train_splits']}",
            ),
            ("tokens", f"{m.get('train_tokens', 0):,} train, {m.get('val_tokens', 0):,} validation"),
            ("checkpoint", "`model.ckpt` in this version's folder (below)"),
            *(("warning", w) for w in m.get("warnings", [])),
        ]
    )
    return f"""# Training: model/{manifest["version"]}

{picture}{summary}

Checkpoint (a long path: kept out of the table): `{where}/model.ckpt`; sample from it with
`mygpt generate --checkpoint {where}/model.ckpt`

| step | train loss | val loss |
|---:|---:|---:|
{table}
"""


CURVES = 5  # the validation-loss curves of this many latest versions share the comparison's chart
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def curves_chart(versions: list) -> str:
    """The validation-loss curves of the latest :data:`CURVES` versions overlaid, as a markdown image."""
    latest = versions[-CURVES:]
    series = [
        (v.version, PALETTE[i % len(PALETTE)], [(s, val) for s, _, val in v.manifest["metrics"].get("loss_curve", [])])
        for i, v in enumerate(latest)
    ]
    svg = line_chart(series, x_title="step", y_title="validation loss")
    if not svg:
        return ""
    image = base64.b64encode(svg.encode()).decode()
    return f"![validation loss of the latest {len(latest)} model versions](data:image/svg+xml;base64,{image})\n\n"


STAGE = Stage(
    name="model",
    settings=ModelSettings,
    code_version="2",
    build=build_model,
    report=report,
    alias="train",
    headline=lambda m: f"val loss {number(m.get('final_val_loss'))}, {number(m.get('final_val_bpb'))} bits/byte",
    columns=(
        ("steps", lambda m: f"{m.get('steps', 0):,}"),
        ("train loss", lambda m: number(m.get("final_loss"))),
        ("val loss", lambda m: number(m.get("final_val_loss"))),
        ("val bits/byte", lambda m: number(m.get("final_val_bpb"))),
        ("tokens/s", lambda m: number(m.get("tokens_per_sec"), ",.0f")),
    ),
    chart=curves_chart,
    shared_flat=("seed", "device", "precision"),
    tiny={
        "embed_dim": 32,
        "num_layers": 1,
        "num_heads": 2,
        "num_kv_heads": 1,
        "max_seq_len": 32,
        "steps": 40,
        "batch_size": 8,
        "seq_len": 32,
        "lr": 3e-3,
        "warmup": 5,
        "print_every": 10,
        "eval_every": 20,
        "eval_batches": 2,
        "checkpoint_every": 10,
    },
)
#: ``run.threads`` (torch CPU threads) changes the speed, not the version; a killed run resumes.
train_model = stage_task(STAGE, "train_model", "Train mygpt on a shards version with its tokenizer (or reuse it).")
