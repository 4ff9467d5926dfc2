"""Both tokenizers behind one import, plus ``tokenizer_from_state(kind, state)``."""

from __future__ import annotations

from .bpe import BPETokenizer
from .char_tokenizer import CharTokenizer
from .errors import UserError

__all__ = ["BPETokenizer", "CharTokenizer", "TOKENIZER_KINDS", "tokenizer_from_state"]

TOKENIZER_KINDS = {"char": CharTokenizer, "bpe": BPETokenizer}


def tokenizer_from_state(kind: str, state: dict) -> "CharTokenizer | BPETokenizer":
    """Rebuild a tokenizer from its ``kind`` (``"char"``/``"bpe"``) and its ``state()`` dict."""
    cls = TOKENIZER_KINDS.get(kind)
    if cls is None:
        raise UserError(f"unknown tokenizer kind {kind!r}; expected one of {sorted(TOKENIZER_KINDS)}")
    return cls.from_state(state)
