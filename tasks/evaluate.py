"""Stage ``evaluate`` (task ``evaluate_model``): the model's loss and bits per byte on the corpus's test split.

The test split (``wiki.test.txt``, which nothing else reads) as the shards stage encoded it (``test-*.parquet``),
in fixed non-overlapping windows of the model's ``max_seq_len`` (:mod:`mygpt.heldout`); bits per byte is what
compares models with different tokenizers, over the same text when bounded by ``max_bytes`` (``max_tokens`` is so
many tokens, so more text for a tokenizer with longer tokens). Also the tokenizer's tokens per byte of the test
text.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from pydantic import Field, model_validator

from mygpt.atomic import atomic_write_text
from mygpt.errors import UserError
from tasks.core import shard_format
from tasks.core.report import md_code, md_text, number, summary_table
from tasks.core.settings import DeviceSettings
from tasks.core.stage import BuildContext, Stage, StageRef, stage_task
from tasks.corpora.splits import TEST, corpus_splits
from tasks.store import MANIFEST


class EvaluateSettings(DeviceSettings):
    """How much of the test split to evaluate; ``device``/``precision``: DeviceSettings."""

    LATER_FIELDS = frozenset({"max_bytes"})

    max_tokens: int | None = Field(
        None,
        ge=2,
        description="evaluate the first N tokens of the test split (as many bytes of text as the tokenizer makes "
        "of them: use max_bytes to compare tokenizers); null = the whole split",
    )
    max_bytes: int | None = Field(
        None,
        ge=2,  # two tokens (one prediction) of at least a byte each; the shards tell the exact least (check_bytes)
        description="evaluate the tokens wholly within the first N bytes of wiki.test.txt: the same text "
        "whatever the tokenizer, up to a token at either end; null = the whole split",
    )

    @model_validator(mode="after")
    def _one_bound(self) -> EvaluateSettings:
        if self.max_tokens is not None and self.max_bytes is not None:
            raise ValueError(
                f"max_tokens={self.max_tokens} and max_bytes={self.max_bytes} both bound the text evaluated; give "
                "one (max_bytes compares models with different tokenizers over the same text)"
            )
        return self


def build_evaluate(ctx: BuildContext, settings: EvaluateSettings, corpus: Path, shards: Path, model: Path) -> dict:
    """Evaluate the model version on the test split; write evaluate.json."""
    from mygpt.checkpoint import load_checkpoint
    from mygpt.device import torch_threads
    from mygpt.heldout import heldout_loss

    ids = np.concatenate([shard_format.read_shard(p) for p in shard_format.shard_paths(shards, TEST)])
    test_file = corpus_splits(ctx.store, ctx.inputs["corpus"])[TEST].text
    text_bytes = (corpus / test_file).stat().st_size
    gpt, tokenizer = load_checkpoint(model / "model.ckpt")
    sizes = text_bytes_per_token(tokenizer)
    used = first_tokens(ids, sizes, settings)
    if len(used) < 2:
        raise UserError(
            f"the test split has {len(ids)} token(s) ({text_bytes:,} bytes of {test_file}): evaluating needs "
            "at least 2; the corpus's last articles are its test split, so check the corpus stage's source_url"
        )
    trained = json.loads((model / MANIFEST).read_text())["settings"]
    # a model trained on all three splits has seen the test text: its "held-out" numbers are not held out
    trained_on_test = trained.get("train_splits") == "all"
    if trained_on_test:
        ctx.log.warning("evaluate: the model was trained with train_splits=all, the test split included")
    ctx.progress(0, 1, f"{len(used):,} of {len(ids):,} test tokens", force=True)
    t0 = time.perf_counter()
    import torch

    rows = windows_per_pass(trained, gpt.max_seq_len)
    try:
        with torch_threads(ctx.run.threads):
            result = heldout_loss(
                gpt.to(settings.device), used, sizes, gpt.max_seq_len, settings.device, settings.precision, rows=rows
            )
    except torch.OutOfMemoryError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(
            f"evaluate: {settings.device} ran out of memory ({first}) with {rows} window(s) of {gpt.max_seq_len} "
            "tokens per forward pass (no more tokens than one of the model's training passes): free the device's "
            "memory (other processes) or set evaluate.device to cpu"
        ) from None
    metrics = {
        "test_loss": round(result.loss, 6),
        "test_bpb": round(result.bpb, 6) if result.bpb is not None else None,
        "tokens_evaluated": result.targets,
        "bytes_evaluated": result.target_bytes,
        "windows": result.windows,
        "seq_len": gpt.max_seq_len,
        "test_tokens": len(ids),
        "trained_on_test": trained_on_test,
        "test_text_bytes": text_bytes,
        "tokens_per_byte": round(len(ids) / text_bytes, 6) if text_bytes else None,
        "device": settings.device,
        "precision": settings.precision,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    atomic_write_text(ctx.out / "evaluate.json", json.dumps(metrics, indent=1) + "\n")
    ctx.progress(1, 1, "done", force=True)
    return metrics


def check_bytes(settings: EvaluateSettings, shards: StageRef) -> list[str]:
    """The evaluate stage's early check (:attr:`Stage.early_check`), once the shards are built and before the model
    trains: ``max_bytes`` must keep the two test tokens evaluating needs; ``UserError`` naming ``evaluate.max_bytes``
    and the least value that keeps them (the bytes of the test split's first two tokens). Why here: the
    tokenizer's tokens are known from here on, and the model is the stage that costs."""
    if not settings.max_bytes:
        return []
    from tasks.core.stage import ref_dir
    from tasks.tokenizer import load_tokenizer

    shards_dir = ref_dir(shards)
    made_by = json.loads((shards_dir / MANIFEST).read_text(encoding="utf-8"))["inputs"]["tokenizer"]
    root = shards["path"].removesuffix(f"/{shards['stage']}/{shards['version']}")
    version = made_by["version"]
    tokenizer: StageRef = {
        "stage": "tokenizer",
        "version": version,
        "build_id": made_by["build_id"],
        "path": f"{root}/tokenizer/{version}",
    }
    sizes = text_bytes_per_token(load_tokenizer(ref_dir(tokenizer)))
    if sizes.size and settings.max_bytes >= 2 * int(sizes.max()):
        return []  # any two tokens fit: no shard need be read (a cached rerun loads no Parquet reader)
    ids = np.zeros(0, dtype=np.int64)
    for path in shard_format.shard_paths(shards_dir, TEST):
        ids = np.concatenate([ids, shard_format.read_shard(path)[:2]])[:2]
        if len(ids) == 2:
            break
    if len(ids) < 2:
        return []  # fewer than two test tokens whatever the bound: the stage's own error says what to check
    least = int(sizes[ids].sum())
    if settings.max_bytes < least:
        kept = len(first_tokens(ids, sizes, settings))
        raise UserError(
            f"evaluate.max_bytes={settings.max_bytes:,} keeps {kept} token(s) of the test split (those wholly "
            f"within its first {settings.max_bytes:,} bytes of text); evaluating needs 2, and this "
            f"tokenizer's first two test tokens take {least:,} bytes: set evaluate.max_bytes to {least:,} or more "
            "(or null for the whole split)"
        )
    return []


def first_tokens(ids: np.ndarray, sizes: np.ndarray, settings: EvaluateSettings) -> np.ndarray:
    """The test ids to evaluate: the first ``max_tokens``, or those wholly within the first ``max_bytes`` bytes of
    text (``sizes``: each id's text bytes), or all."""
    if settings.max_bytes:
        return ids[: int(np.searchsorted(np.cumsum(sizes[ids]), settings.max_bytes, side="right"))]
    return ids[: settings.max_tokens] if settings.max_tokens else ids


def text_bytes_per_token(tokenizer) -> np.ndarray:
    """The UTF-8 bytes of text each token id stands for, a special token (``<|endoftext|>``) 0: it is no text of
    the test split, so bits per byte divides by the text's own bytes, as for a model whose tokenizer has none."""
    sizes = np.array(tokenizer.token_bytes(), dtype=np.int64)  # a pipeline model carries its tokenizer
    sizes[list(getattr(tokenizer, "special_ids", {}).values())] = 0
    return sizes


def windows_per_pass(trained: dict, max_seq_len: int) -> int:
    """How many windows of ``max_seq_len`` tokens one forward pass evaluates, for a model trained with the
    settings ``trained`` (its manifest's): no more tokens than one of its training forward passes held (a
    micro-batch, else a process's share of the batch), at most ``WINDOWS_PER_BATCH``, at least one. Why: the
    pass's fp32 logits are what evaluation needs memory for, so a model that trained on a GPU evaluates there."""
    from mygpt.heldout import WINDOWS_PER_BATCH
    from mygpt.limits import rows_at_once

    nproc = trained.get("nproc")
    rows = rows_at_once(
        int(trained.get("batch_size") or 1),
        nproc if isinstance(nproc, int) else 1,
        int(trained.get("micro_batch_size") or 0),
    )
    tokens = rows * int(trained.get("seq_len") or max_seq_len)
    return max(1, min(WINDOWS_PER_BATCH, tokens // max_seq_len))


def report(manifest: dict) -> str:
    m = manifest.get("metrics", {})
    where = manifest.get("path", f"evaluate/{manifest['version']}")
    table = summary_table(
        [
            ("test loss", number(m.get("test_loss"))),
            ("test bits per byte", number(m.get("test_bpb"))),
            ("tokenizer: tokens per byte", number(m.get("tokens_per_byte"))),
            (
                "evaluated",
                f"{m.get('tokens_evaluated', 0):,} predicted tokens ({m.get('bytes_evaluated', 0):,} bytes) of "
                f"{m.get('test_tokens', 0):,}, in {m.get('windows', 0):,} windows of {m.get('seq_len')} tokens",
            ),
            ("test text", f"{m.get('test_text_bytes', 0):,} bytes of wiki.test.txt"),
            *([("warning", "the model was trained on all splits, the test split included")] if _seen(m) else []),
            ("device / precision", f"{m.get('device')} / {m.get('precision')}"),
        ]
    )
    title = f"# Evaluation: evaluate/{md_text(manifest['version'])}"
    return f"{title}\n\n{table}\n\nFile: {md_code(where + '/evaluate.json')}\n"


def _seen(m: dict) -> str:
    return " (trained on it)" if m.get("trained_on_test") else ""


def _evaluated(m: dict) -> str:
    return f"{m.get('tokens_evaluated', 0):,}{_seen(m)}"


STAGE = Stage(
    name="evaluate",
    settings=EvaluateSettings,
    code_version="2",
    build=build_evaluate,
    report=report,
    early_check=("shards", check_bytes),
    headline=lambda m: (
        f"test {number(m.get('test_bpb'))} bits/byte{_seen(m)}, {number(m.get('tokens_per_byte'), '.3f')} tok/B"
    ),
    columns=(("test bits/byte", lambda m: number(m.get("test_bpb"))), ("test tokens", _evaluated)),
    columns_for="model",
    shared_flat=("device", "precision"),
    tiny={"max_bytes": 50_000},
)
evaluate_model = stage_task(STAGE, "evaluate_model", "Evaluate a model version on the test split (or reuse it).")
