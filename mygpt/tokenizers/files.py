"""The tokenizers behind one import, plus ``tokenizer_from_state(kind, state)`` and tokenizer files.

A tokenizer file is JSON: either ``{"kind": "char"|"bpe"|"byte", "state": <tokenizer.state()>}`` (what
``save_tokenizer_file`` writes) or a bare BPE state (what ``BPETokenizer.save`` writes, the pipeline's
``tokenizer.json``); ``load_tokenizer_file`` reads both.
"""

from __future__ import annotations

import json
import os

from mygpt.atomic import atomic_write_text
from mygpt.errors import UserError
from mygpt.tokenizers.bpe import BPETokenizer
from mygpt.tokenizers.byte_bpe import ByteBPETokenizer
from mygpt.tokenizers.char_tokenizer import CharTokenizer

__all__ = [
    "TOKENIZER_KINDS",
    "BPETokenizer",
    "ByteBPETokenizer",
    "CharTokenizer",
    "load_tokenizer_file",
    "save_tokenizer_file",
    "tokenizer_from_state",
]

Tokenizer = CharTokenizer | BPETokenizer | ByteBPETokenizer
TOKENIZER_KINDS: dict[str, type[Tokenizer]] = {"char": CharTokenizer, "bpe": BPETokenizer, "byte": ByteBPETokenizer}


def tokenizer_from_state(kind: str, state: dict) -> Tokenizer:
    """Rebuild a tokenizer from its ``kind`` (``"char"``/``"bpe"``/``"byte"``) and its ``state()`` dict."""
    cls = TOKENIZER_KINDS.get(kind)
    if cls is None:
        raise UserError(f"unknown tokenizer kind {kind!r}; expected one of {sorted(TOKENIZER_KINDS)}")
    return cls.from_state(state)


def save_tokenizer_file(tokenizer, path) -> None:
    """Write ``{"kind": ..., "state": ...}`` to ``path`` atomically."""
    atomic_write_text(path, json.dumps({"kind": tokenizer.kind, "state": tokenizer.state()}, ensure_ascii=False))


def load_tokenizer_file(path) -> Tokenizer:
    """Read a tokenizer file (see the module docstring); ``UserError`` naming ``path`` when it is unusable."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise UserError(f"tokenizer file {path!r} does not exist") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"tokenizer file {path!r} is not JSON text ({e})") from None
    except OSError as e:
        raise UserError(f"cannot read tokenizer file {path!r}: {e.strerror or e}") from None
    if isinstance(data, dict) and set(data) == {"kind", "state"}:
        kind, state = data["kind"], data["state"]
    else:
        kind, state = "bpe", data
    try:
        return tokenizer_from_state(kind, state)
    except UserError as e:
        raise UserError(f"tokenizer file {path!r}: {e}") from None
