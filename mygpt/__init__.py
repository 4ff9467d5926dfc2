"""mygpt: a small modern GPT in plain PyTorch (tokenizers, model, training, checkpoints, generation).

This package never imports Prefect; the pipeline layers (``tasks/``, ``flows/``) build on it.
(BPE encode worker processes load ``mygpt.bpe_encode`` without running this file, so they never import
torch: see ``bpe_encode._WORKER_BOOT``.)
"""

from .bpe import BPETokenizer
from .char_tokenizer import CharTokenizer
from .checkpoint import load_checkpoint, save_checkpoint
from .errors import UserError
from .generate import generate
from .model import GPT
from .train import TrainConfig, TrainResult, train

__all__ = [
    "BPETokenizer",
    "CharTokenizer",
    "GPT",
    "TrainConfig",
    "TrainResult",
    "UserError",
    "generate",
    "load_checkpoint",
    "save_checkpoint",
    "train",
]
