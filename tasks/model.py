"""Stage ``model`` (task ``train_model``): the shards + the tokenizer -> ``model/<version>/model.ckpt``.

The token shards are fetched (:mod:`tasks.core.shard_fetch`) into flat token files in the build's work directory,
each checked against the manifest, and memory-mapped; every step draws its windows uniformly from the whole
training split, as the chapter's ``get_batch`` does. Training (:func:`mygpt.training.launcher.run_training`,
``nproc`` processes) checkpoints to ``work/train.ckpt``, which survives a crash, so a rerun of the same version
resumes from it. Published: ``model.ckpt`` (the chapter's format, no optimizer state), ``loss_history.json`` and
``loss_history.csv``. The resolved device, precision, ``nproc`` and ``compile`` enter the version: each changes
the weights' last bits.

The settings are ``GPTConfig``'s and ``TrainConfig``'s fields (names, bounds, descriptions), with the chapter's
run (:data:`CHAPTER_RUN`) as defaults.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import os
import time
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, create_model, field_validator, model_validator

from mygpt.errors import UserError
from mygpt.gpt_config import GPTConfig
from mygpt.options import Option, options
from mygpt.training.config import TrainConfig
from tasks.core.report import Markdown, line_chart, md_code, md_row, md_text, number, summary_table
from tasks.core.settings import DeviceSettings, Seed
from tasks.core.shard_fetch import FetchedShards, cache_budget, fetch_shards
from tasks.core.stage import BuildContext, Stage, stage_task
from tasks.corpora.source import SPLIT_NAMES
from tasks.corpora.splits import TRAIN
from tasks.tokenizer import load_tokenizer

CHECKPOINT = "train.ckpt"  # in ctx.work: the resume checkpoint


def trained_splits(choice: str, shards_manifest: dict) -> tuple[str, ...]:
    """The splits ``train_splits=choice`` trains on: ``train``, or ``all`` the splits the shards version holds
    (its corpus's, in the corpus's order: ``split_names``; a version from before it recorded them has
    wikitext's three)."""
    if choice == "train":
        return (TRAIN,)
    return tuple(shards_manifest.get("metrics", {}).get("split_names") or SPLIT_NAMES)


# Test hook: after the first checkpoint, stall (so a test can SIGKILL the process at a known point).
PIPELINE_STALL_ENV = "WIKI_PIPELINE_TEST_STALL_AFTER_CHECKPOINT"

#: The ``GPTConfig``/``TrainConfig`` fields the stage exposes, by their user names, in the form's order; the rest
#: keep the library's defaults (``precision`` is DeviceSettings').
MODEL_SETTINGS = ("embed_dim", "num_layers", "num_heads", "num_kv_heads", "max_seq_len", "norm", "position")
RECIPE_SETTINGS = (
    "steps",
    "batch_size",
    "micro_batch_size",
    "seq_len",
    "lr",
    "schedule",
    "warmup",
    "max_grad_norm",
    "print_every",
    "eval_every",
    "eval_batches",
    "checkpoint_every",
    "seed",
)
#: Where the pipeline's defaults are not the library's: the chapter's run (§28.6; its printed lr, 1e-3, is the
#: library's default already).
CHAPTER_RUN = {
    "embed_dim": 192,
    "num_heads": 6,
    "num_kv_heads": 2,
    "max_seq_len": 256,
    "norm": "rms",
    "position": "rope",
    "steps": 10_000,
    "seq_len": 256,
    "schedule": "cosine",
    "warmup": 500,
    "max_grad_norm": 1.0,
    "print_every": 200,
    "eval_every": 500,
    "checkpoint_every": 1000,
}
#: the fewest steps for which ``compile="auto"`` compiles: about where the chapter's model on a CPU has repaid the
#: first step's compilation with its faster steps (docs/TRAINING.md, "compile")
COMPILE_FROM_STEPS = 3000
_MODEL = {o.name: o for o in options(GPTConfig).values()}
_RECIPE = {o.name: o for o in options(TrainConfig).values()}


def _setting(o: Option, annotation: Any = None) -> tuple[Any, Any]:
    """A pydantic field for ``o``: its type (a Literal of its choices), bounds, description, pipeline default."""
    kind = annotation or (Literal[o.choices] if o.choices else o.kind)
    return kind, Field(CHAPTER_RUN.get(o.name, o.default), ge=o.ge, gt=o.gt, le=o.le, description=o.help)


class ModelSettingsBase(DeviceSettings):
    """The chapter's model (§28.6) and its training recipe. ``device``/``precision`` come from DeviceSettings;
    ``nproc``/``compile`` say how it runs on them (and, resolved, enter the version like them)."""

    #: accumulating gradients (micro_batch_size) changes the weights' last bits: in the version only where set
    LATER_FIELDS = frozenset({"micro_batch_size"})

    nproc: int | Literal["auto"] = Field(
        1,
        description="training processes on this node, data parallel under torchrun (NCCL on cuda, gloo on cpu); "
        "batch_size stays the global batch; auto = one per visible GPU on cuda, else 1",
    )

    if TYPE_CHECKING:  # the fields derived from GPTConfig and TrainConfig: s.steps, s.norm, ...

        def __getattr__(self, name: str) -> Any: ...

    def progress_unit(self) -> tuple[str, float]:
        return ("tokens", self.batch_size * self.seq_len)  # per step: the rate shown while training

    compile: bool | Literal["auto"] = Field(
        "auto",
        description="torch.compile the training step (a warning and eager training where it is unavailable); "
        f"auto = on where it is available and the run has at least {COMPILE_FROM_STEPS:,} steps, where its "
        "one-time compilation is repaid (docs/TRAINING.md)",
    )

    @field_validator("compile", mode="before")
    @classmethod
    def _compile(cls, value):
        if value is True or value is False or value == "auto":
            return value
        raise ValueError(
            f"compile must be true, false or 'auto', got {value!r} ({cls.model_fields['compile'].description})"
        )

    @field_validator("nproc", mode="before")
    @classmethod
    def _nproc(cls, value):
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError(
            f"nproc must be an integer >= 1 or 'auto', got {value!r} ({cls.model_fields['nproc'].description})"
        )

    def resolved(self) -> typing.Self:
        """Device and precision (DeviceSettings), then ``nproc`` as a number this machine can run: the one place
        the pipeline resolves it; the stage passes the number on. A ``micro_batch_size`` no smaller than the rows
        a process runs is unset (0): it computes the same, so it gives the same version."""
        from mygpt.limits import check_nproc, compile_may_run, rows_at_once
        from mygpt.training.launcher import resolve_nproc

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
        micro = self.micro_batch_size if self.micro_batch_size < rows_at_once(self.batch_size, nproc) else 0
        compile_ = self.compile
        if compile_ == "auto":
            compile_ = self.steps >= COMPILE_FROM_STEPS and compile_may_run(s.device)
        return s.model_copy(update={"nproc": nproc, "micro_batch_size": micro, "compile": compile_})

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
                micro_batch_size=self.micro_batch_size,
            )
        except UserError as e:
            raise UserError(f"model.{e}" if not str(e).startswith("the ") else f"model: {e}") from None

    def warnings(self) -> list[str]:
        from mygpt.limits import cpu_lacks_bf16, resolves_to_cpu

        notes = []
        if self.warmup and self.warmup >= self.steps:
            notes.append(
                f"model.warmup ({self.warmup}) is not shorter than steps ({self.steps}): the learning rate rises for "
                f"the whole run, peaks at {100 * self.steps / self.warmup:.0f}% of lr ({self.lr:g}) and never "
                f"reaches the {self.schedule} schedule; set warmup below steps (the chapter warms up for 5% of them)"
            )
        if self.precision == "bf16" and resolves_to_cpu(self.device) and cpu_lacks_bf16():
            notes.append(
                "model.precision=bf16 on a CPU without native bf16 (no AVX512-BF16/AMX in /proc/cpuinfo): autocast "
                "emulates it, about 10x slower than fp32 (the chapter's model: ~11 s a step, not ~1 s); set "
                "model.precision to fp32 (or auto, which picks fp32 on a CPU)"
            )
        return notes

    def gpt_config(self, vocab_size: int) -> GPTConfig:
        """The model these settings describe; ``vocab_size`` comes from the tokenizer."""
        return GPTConfig(vocab_size, **{_MODEL[name].field: getattr(self, name) for name in MODEL_SETTINGS})

    def train_config(self) -> TrainConfig:
        """The recipe these (resolved) settings describe."""
        values = {_RECIPE[name].field: getattr(self, name) for name in RECIPE_SETTINGS}
        return TrainConfig(precision=self.precision, compile=self.compile is True, **values)

    @model_validator(mode="after")
    def _consistent(self) -> ModelSettingsBase:
        from mygpt.limits import check_seq_len  # the library's own rules, stated once (torch-free)

        self.gpt_config(vocab_size=2)  # the shape rules; vocab_size is not known before the tokenizer exists
        check_seq_len(self.seq_len, self.max_seq_len, hint="the chapter uses 256 for both")
        return self


if TYPE_CHECKING:
    ModelSettings = ModelSettingsBase
else:
    ModelSettings = create_model(
        "ModelSettings",
        __base__=ModelSettingsBase,
        __doc__=ModelSettingsBase.__doc__,
        **{name: _setting(_MODEL[name]) for name in MODEL_SETTINGS},
        **{name: _setting(_RECIPE[name], Seed if name == "seed" else None) for name in RECIPE_SETTINGS},
        train_splits=(
            Literal["train", "all"],
            Field("train", description="train on the train split, or on all three (the chapter's wikipedia.txt run)"),
        ),
    )


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
    """Train mygpt on the shards (fetched file by file, :mod:`tasks.core.shard_fetch`; ``shards`` is never copied
    whole) with ``nproc`` processes (resuming from the work directory's checkpoint) and publish it."""
    # torch's TorchInductor cache goes to the user's cache folder, not TMPDIR (where torch would leave a
    # torchinductor_<user> folder behind on every build); this process's training ranks inherit it
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "wiki-pipeline" / "torchinductor"
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache))

    s = settings
    splits = trained_splits(s.train_splits, ctx.store.get("shards", ctx.inputs["shards"]["version"]).manifest)
    ckpt = ctx.work / CHECKPOINT
    resumed_from = _checkpoint_step(ckpt, ctx.log)
    version = ctx.inputs["shards"]["version"]
    data = fetch_shards(ctx.store, version, ctx.work / "tokens", splits)
    n_train, n_val = data.train_tokens, data.valid_tokens
    ctx.log.info(
        "model: %s training tokens (%s), %s validation tokens, %d shards fetched from %s in %.1f s",
        f"{n_train:,}",
        "+".join(splits),
        f"{n_val:,}",
        len(data.train) + len(data.valid),
        ctx.store.location("shards", version),
        data.seconds,
    )
    result, vocab_size = _train(ctx, s, tokenizer, data, resumed_from)
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


def _train(ctx: BuildContext, s: ModelSettings, tokenizer: Path, data: FetchedShards, resumed_from: int):
    """Run the training job on the fetched token files: its ``TrainResult`` and the vocabulary size."""
    from mygpt.training.job import TrainJob
    from mygpt.training.launcher import run_training
    from mygpt.training.worker import WORKER_STALL_ENV

    vocab_size = load_tokenizer(tokenizer).vocab_size
    ckpt = ctx.work / CHECKPOINT
    job = TrainJob(
        tokenizer=str(Path(tokenizer) / "tokenizer.json"),
        train_tokens=data.train,
        val_tokens=data.valid,
        token_dtype=data.dtype,
        model=s.gpt_config(vocab_size),
        train=s.train_config(),
        device=s.device,
        checkpoint=str(ckpt),
        output=str(ctx.out / "model.ckpt"),
        meta={"stage": "model", "version": ctx.version, "settings": s.version_params()},
        threads=ctx.run.threads or 0,
    )
    if resumed_from:
        ctx.log.info("model: resuming from step %d (checkpoint %s)", resumed_from, ckpt)
    ctx.progress(resumed_from, s.steps, f"step {resumed_from}/{s.steps}", force=True)

    estimate: list[str] = []  # the library's estimate of the run's wall time, once it has logged one

    def log(message: str) -> None:  # the library's lines; its warnings (bf16 on a slow CPU, compile) as warnings
        if message.startswith("estimate: "):  # "estimate: the run's N steps take about T (...)": T goes on the
            estimate[:] = [message.removeprefix("estimate: ").split(" (", 1)[0]]  # progress (the rest goes stale)
        if message.startswith("warning: "):
            ctx.log.warning("model: %s", message.removeprefix("warning: "))
        else:
            ctx.log.info("%s", message)

    def on_progress(point: dict) -> None:
        val = f" val_loss {point['val_loss']:.4f}" if "val_loss" in point else ""
        val += f" val_bpb {point['val_bpb']:.4f}" if "val_bpb" in point else ""
        val += f" · {estimate[0]}" if estimate else ""
        ctx.progress(point["step"], s.steps, f"step {point['step']}/{s.steps} loss {point['loss']:.4f}{val}")

    stall = bool(os.environ.get(PIPELINE_STALL_ENV))

    def on_checkpoint(step: int, path: str) -> None:
        ctx.save(Path(path))  # an object-store root: a rerun on another machine resumes from this step
        if stall and s.nproc == 1 and step < s.steps:  # with several processes rank 0 stalls (env below)
            ctx.log.warning("model: %s is set: stalling after the checkpoint at step %d", PIPELINE_STALL_ENV, step)
            while True:
                time.sleep(1)

    result = run_training(
        job,
        int(s.nproc),  # resolved: a number
        log=log,
        on_progress=on_progress,
        on_checkpoint=on_checkpoint,
        env={WORKER_STALL_ENV: "1"} if stall else None,
        run_dir=ctx.work / "ranks",
    )
    return result, vocab_size


def write_history(out: Path, history: list[dict]) -> None:
    """The loss history as published: each point less its wall-clock throughput (the metrics keep the run's). Why:
    downstream versions name the model by its files' digest, and equal training must give equal files."""
    from mygpt.atomic import atomic_write_text

    history = [{k: v for k, v in point.items() if k != "tokens_per_sec"} for point in history]
    atomic_write_text(out / "loss_history.json", json.dumps(history, indent=1) + "\n")
    cols = ["step", "loss", "val_loss", "val_bpb", "lr"]
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
    table = "\n".join(md_row(f"{s:,}", _fmt(t), _fmt(v)) for s, t, v in rows)
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
            ("checkpoint", Markdown("`model.ckpt` in this version's folder (below)")),
            *(("warning", w) for w in m.get("warnings", [])),
        ]
    )
    return f"""# Training: model/{md_text(manifest["version"])}

{picture}{summary}

Checkpoint (a long path: kept out of the table): {md_code(where + "/model.ckpt")}; sample from it with
{md_code("mygpt generate --checkpoint " + where + "/model.ckpt")}

| step | train loss | val loss |
|---:|---:|---:|
{table}
"""


CURVES = 5  # the validation-loss curves of this many latest versions share the comparison's chart
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def curves_chart(versions: list) -> str:
    """The validation curves of the latest :data:`CURVES` versions overlaid in bits per byte, as a markdown image.
    Why bits per byte, not loss: a loss is per token, and versions with other tokenizers have other tokens (GPT-2's
    vocabulary at ~9 beside ~4.3). Each eval's bits per byte is its val loss times the version's one factor,
    ``final_val_bpb / final_val_loss`` (every eval reads the same validation batches: seed + 1); a version without
    bits per byte is left out."""
    latest = versions[-CURVES:]
    series = []
    for i, v in enumerate(latest):
        m = v.manifest["metrics"]
        bpb, loss = m.get("final_val_bpb"), m.get("final_val_loss")
        if bpb is None or not loss:
            continue
        try:
            factor = float(bpb) / float(loss)
        except OverflowError as e:  # a number no float holds: a bad value, as a string would be
            raise ValueError(f"{v.version}: final_val_bpb / final_val_loss: {e}") from None
        points = [(s, None if val is None else val * factor) for s, _, val in m.get("loss_curve", [])]
        series.append((v.version, PALETTE[i % len(PALETTE)], points))
    svg = line_chart(series, x_title="step", y_title="validation bits per byte")
    if not svg:
        return ""
    image = base64.b64encode(svg.encode()).decode()
    shown = f"validation bits per byte of the latest {len(series)} model versions"
    return f"![{shown}](data:image/svg+xml;base64,{image})\n\n"


#: code version 4: each step's windows drawn uniformly from the whole train split (no block sampler), and fused
#: AdamW with a foreach clip (TrainConfig.fused), which moves the weights' last bits. 5: the model's faster step
#: (one q/k/v matmul, SDPA's own GQA on the CPU too, RMSNorm's written-out backward): the same batches, gradients
#: within float rounding of 4's. 6: the training step's blockwise LM head and loss on the CPU (fp32): the same
#: batches, the loss and gradients within float rounding of 5's. 7: RMS norm's backward through layer norm's
#: fused kernel, and the blockwise loss from log_softmax's log-probabilities: the same batches, gradients within
#: float rounding of 6's.
STAGE = Stage(
    name="model",
    settings=ModelSettings,
    code_version="7",
    build=build_model,
    streamed=("shards",),
    check_environment=cache_budget,
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
