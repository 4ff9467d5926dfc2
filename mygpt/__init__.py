"""mygpt: a small modern GPT in plain PyTorch (tokenizers, model, training, checkpoints, generation).

The names below load their module (and torch, where it needs it) on first use, so ``import mygpt`` is cheap.
The training loop and generation are ``mygpt.training.train.train`` and ``mygpt.generate.generate``.
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
    "TrainConfig": "training.config",
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
    from mygpt.training.config import TrainConfig
    from mygpt.training.train import TrainResult


def __getattr__(name: str):
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'mygpt' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
