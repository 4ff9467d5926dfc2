"""mygpt: a small modern GPT in plain PyTorch (tokenizers, model, training, checkpoints, generation).

This package never imports Prefect; the pipeline layers (``tasks/``, ``flows/``) build on it. Importing it
is cheap: the names below load their module (and torch, where that module needs it) on first use, so
``import mygpt`` or ``from mygpt.tokenizers.bpe import BPETokenizer`` never pays for torch.

The training loop and text generation are the functions ``mygpt.training.train.train`` and
``mygpt.generate.generate`` (their modules share their names, so they are not re-exported here).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__all__ = [
    "GPT",
    "BPETokenizer",
    "CharTokenizer",
    "GPTConfig",
    "TrainConfig",
    "TrainResult",
    "UserError",
    "load_checkpoint",
    "save_checkpoint",
]

_HOME = {
    "BPETokenizer": "tokenizers.bpe",
    "CharTokenizer": "tokenizers.char_tokenizer",
    "GPT": "model",
    "GPTConfig": "gpt_config",
    "TrainConfig": "training.train",
    "TrainResult": "training.train",
    "UserError": "errors",
    "load_checkpoint": "checkpoint",
    "save_checkpoint": "checkpoint",
}

if TYPE_CHECKING:  # editors and type checkers see the real names
    from mygpt.checkpoint import load_checkpoint, save_checkpoint
    from mygpt.errors import UserError
    from mygpt.gpt_config import GPTConfig
    from mygpt.model import GPT
    from mygpt.tokenizers.bpe import BPETokenizer
    from mygpt.tokenizers.char_tokenizer import CharTokenizer
    from mygpt.training.train import TrainConfig, TrainResult


def __getattr__(name: str):
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'mygpt' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
