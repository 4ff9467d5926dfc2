"""Checkpoints in the chapter's format (payload: docs/TRAINING.md), written atomically, loaded with
``weights_only=True`` so a checkpoint cannot run code; old checkpoints load with their old meaning."""

from __future__ import annotations

import os

import torch

from mygpt.atomic import atomic_open
from mygpt.errors import UserError
from mygpt.gpt_config import REQUIRED_CHECKPOINT_KEYS, GPTConfig
from mygpt.model import GPT
from mygpt.tokenizers.files import tokenizer_from_state

__all__ = [
    "gpt_config_from_payload",
    "load_checkpoint",
    "load_checkpoint_payload",
    "model_from_config",
    "model_from_payload",
    "save_checkpoint",
    "tokenizer_from_payload",
]

REQUIRED_KEYS = ("model_state_dict", "config")


def save_checkpoint(model: GPT, tokenizer, path, *, resume: dict | None = None, meta: dict | None = None) -> None:
    """Write ``model`` + ``tokenizer`` (+ optional ``resume`` / ``meta``) to ``path`` atomically."""
    path = os.fspath(path)
    if tokenizer.vocab_size != model.vocab_size:
        raise UserError(
            f"tokenizer vocab_size ({tokenizer.vocab_size}) does not match the model's ({model.vocab_size})"
        )
    kind = tokenizer.kind
    config = dict(model.config())
    config["tokenizer_kind"] = kind
    payload = {
        "model_state_dict": {k: v.detach().to("cpu") for k, v in model.state_dict().items()},
        "tokenizer_chars": list(tokenizer.chars),
        "tokenizer_kind": kind,
        "tokenizer_state": tokenizer.state(),
        "config": config,
    }
    if resume is not None:
        payload["resume"] = resume
    if meta is not None:
        payload["meta"] = dict(meta)
    try:
        with atomic_open(path, "wb") as f:
            torch.save(payload, f)
    except OSError as e:
        raise UserError(f"cannot write checkpoint {path}: {e.strerror or e}") from e


def load_checkpoint_payload(path) -> dict:
    """Read and sanity-check the raw payload dict (CPU tensors). ``UserError`` naming ``path`` on any problem."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise UserError(f"checkpoint {path} does not exist; train one with `mygpt train` or fix the path")
    if os.path.isdir(path):
        raise UserError(f"checkpoint {path} is a directory, not a checkpoint file")
    if os.path.getsize(path) == 0:
        raise UserError(f"checkpoint {path} is empty (0 bytes); it is not a mygpt checkpoint")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises RuntimeError / UnpicklingError / EOFError / ... for bad files
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"checkpoint {path} is corrupt or not a PyTorch checkpoint ({first[:200]})") from e
    if not isinstance(payload, dict) or any(k not in payload for k in REQUIRED_KEYS):
        raise UserError(
            f"checkpoint {path} is not a mygpt checkpoint (expected a dict with keys {', '.join(REQUIRED_KEYS)})"
        )
    config = payload["config"]
    missing = [k for k in REQUIRED_CHECKPOINT_KEYS if not isinstance(config, dict) or k not in config]
    if missing:
        raise UserError(f"checkpoint {path} is not a mygpt checkpoint: config lacks {', '.join(missing)}")
    if "tokenizer_state" not in payload and "tokenizer_chars" not in payload:
        raise UserError(f"checkpoint {path} is not a mygpt checkpoint: it holds no tokenizer")
    return payload


def model_from_config(config: dict) -> GPT:
    """An (untrained) GPT from a checkpoint ``config`` (old checkpoints included: ``GPTConfig.from_checkpoint``)."""
    return GPT(GPTConfig.from_checkpoint(config))


def gpt_config_from_payload(payload: dict, path: str = "<checkpoint>") -> GPTConfig:
    """The model config of a loaded payload; ``UserError`` naming ``path`` when it is not a valid one."""
    try:
        return GPTConfig.from_checkpoint(payload["config"])
    except UserError as e:
        raise UserError(f"checkpoint {path} has an invalid config: {e}") from e


def tokenizer_from_payload(payload: dict, path: str = "<checkpoint>"):
    config = payload["config"]
    kind = config.get("tokenizer_kind", payload.get("tokenizer_kind", "char"))
    state = payload.get("tokenizer_state")
    if state is None:
        state = {"chars": payload["tokenizer_chars"]}
    try:
        return tokenizer_from_state(kind, state)
    except UserError as e:
        raise UserError(f"checkpoint {path}: {e}") from e


def load_checkpoint(path) -> tuple[GPT, object]:
    """``(model, tokenizer)`` from ``path``, on CPU, in eval mode. Accepts legacy (pre-chapter-28) checkpoints."""
    path = os.fspath(path)
    payload = load_checkpoint_payload(path)
    tokenizer = tokenizer_from_payload(payload, path)
    model = model_from_payload(payload, path)
    if tokenizer.vocab_size != model.vocab_size:
        raise UserError(
            f"checkpoint {path}: tokenizer vocab_size {tokenizer.vocab_size} != model vocab_size {model.vocab_size}"
        )
    return model, tokenizer


def model_from_payload(payload: dict, path: str = "<checkpoint>") -> GPT:
    """The trained model a loaded payload holds, on CPU, in eval mode (``UserError`` naming ``path``)."""
    model = GPT(gpt_config_from_payload(payload, path))
    try:
        model.load_state_dict(payload["model_state_dict"])
    except (RuntimeError, TypeError, AttributeError) as e:
        first = str(e).strip().splitlines()[0]
        raise UserError(f"checkpoint {path}: weights do not match its config ({first[:200]})") from e
    model.eval()
    return model
