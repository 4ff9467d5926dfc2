"""Byte-level BPE files: Hugging Face's ``tokenizer.json``, GPT-2's ``vocab.json`` + ``merges.txt`` and tiktoken's
ranks file, written from a ``ByteBPETokenizer`` (:mod:`mygpt.tokenizers.byte_bpe`) and read back; and the check that
a ``tokenizer.json`` from anywhere is a byte-level BPE (``mygpt tokenizer encode``).

Token strings are GPT-2's: every byte is shown as one printable character (``bytes_to_unicode``: a space is
``Ġ``, a newline ``Ċ``), which is what HF's ``ByteLevel`` pre-tokenizer and decoder speak. Our ``tokenizer.json``
splits with a ``Split`` on the tokenizer's own pattern, then ``ByteLevel(use_regex=False)`` maps the bytes (why:
the pattern may be GPT-4's, which ``ByteLevel``'s built-in regex is not); GPT-2's own files use
``ByteLevel(use_regex=True)``, whose built-in regex is GPT-2's pattern.
"""

from __future__ import annotations

import base64
import functools
import json
import os
from typing import TYPE_CHECKING, Any, Protocol

from mygpt.errors import UserError
from mygpt.tokenizers.byte_bpe_reference import PATTERNS

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = [
    "bytes_to_unicode",
    "gpt2_vocab_and_merges",
    "hf_tokenizer",
    "layout_parts",
    "load_byte_level_bpe",
    "tiktoken_ranks",
    "token_string",
    "vocab_strings",
]


class ByteBPE(Protocol):
    """What the writers read of a ``ByteBPETokenizer`` (a protocol: this module sits below that class)."""

    @property
    def merges(self) -> tuple[tuple[bytes, bytes], ...]: ...
    @property
    def specials(self) -> tuple[str, ...]: ...
    @property
    def pattern(self) -> str: ...
    @property
    def vocab(self) -> dict[int, bytes]: ...
    @property
    def special_base(self) -> int: ...
    @property
    def special_ids(self) -> dict[str, int]: ...


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (``encoder.py``): printable Latin-1 bytes stand for themselves,
    the others are shifted to U+0100 onwards."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    table = {b: chr(b) for b in keep}
    shift = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shift)
            shift += 1
    return table


def token_string(token: bytes) -> str:
    """``token`` in GPT-2's byte-to-unicode form."""
    table = bytes_to_unicode()
    return "".join(table[b] for b in token)


def _token_bytes(s: str) -> bytes:
    inverse = {c: b for b, c in bytes_to_unicode().items()}
    return bytes(inverse[c] for c in s)


def vocab_strings(tok: ByteBPE) -> dict[str, int]:
    strings: dict[str, int] = {}
    for i, token in tok.vocab.items():
        if i < tok.special_base:
            strings.setdefault(token_string(token), i)
    if len(strings) != tok.special_base:
        raise UserError(
            "two merges of this tokenizer make the same byte string, which a tokenizer.json vocabulary (a map from "
            "strings to ids) cannot hold; train with fewer merges or on more text"
        )
    return strings


def hf_tokenizer(tok: ByteBPE) -> Tokenizer:
    """Hugging Face's byte-level BPE with ``tok``'s ids: the 256 bytes, the merges in training order, the specials
    as added special tokens; a ``Split`` on the pattern, ``ByteLevel`` bytes, the ``ByteLevel`` decoder."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    merges = [(token_string(a), token_string(b)) for a, b in tok.merges]
    hf = Tokenizer(BPE(vocab=vocab_strings(tok), merges=merges, fuse_unk=False, byte_fallback=False))
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERNS[tok.pattern]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in tok.specials])
    for s, i in tok.special_ids.items():
        if hf.token_to_id(s) != i:  # a special spelled like a byte token would take that token's id
            raise UserError(f"special token {s!r} is also an ordinary token of the vocabulary; choose another name")
    return hf


def gpt2_vocab_and_merges(tok: ByteBPE) -> tuple[dict[str, int], str]:
    """GPT-2's two files for ``tok``: ``vocab.json`` (string -> id, specials included) and ``merges.txt``."""
    vocab = vocab_strings(tok)
    vocab.update(tok.special_ids)
    lines = ["#version: 0.2"] + [f"{token_string(a)} {token_string(b)}" for a, b in tok.merges]
    return vocab, "\n".join(lines) + "\n"


def tiktoken_ranks(tok: ByteBPE) -> str:
    """tiktoken's ranks file (``base64(token) rank`` per line, the specials left out: tiktoken takes them as
    ``special_tokens``); ``tiktoken.load.load_tiktoken_bpe`` reads it."""
    vocab_strings(tok)  # the same refusal of repeated byte strings
    lines = [f"{base64.b64encode(token).decode('ascii')} {i}" for i, token in tok.vocab.items() if i < tok.special_base]
    return "\n".join(lines) + "\n"


def _pattern_name(hf_json: dict) -> str | None:
    """``gpt2``/``gpt4`` when the file does nothing before its BPE model but split by one of our patterns and map
    bytes (GPT-2's ``ByteLevel(use_regex=True)``, or our ``Split`` + ``ByteLevel(use_regex=False)``); ``None``
    for anything else (a normalizer, a prefix space, another pattern)."""
    if hf_json.get("normalizer") is not None:
        return None
    steps = _pre_tokenizers(hf_json.get("pre_tokenizer"))
    if any(s.get("type") == "ByteLevel" and s.get("add_prefix_space") for s in steps):
        return None
    kinds = [(s.get("type"), s.get("use_regex")) for s in steps]
    if kinds == [("ByteLevel", True)]:
        return "gpt2"
    split = steps[0] if steps else {}
    if kinds == [("Split", None), ("ByteLevel", False)] and (split.get("behavior"), split.get("invert")) == (
        "Isolated",
        False,
    ):
        pattern = (split.get("pattern") or {}).get("Regex")
        return next((name for name, p in PATTERNS.items() if p == pattern), None)
    return None


def _pre_tokenizers(step: Any) -> list[dict]:
    if not isinstance(step, dict):
        return []
    if step.get("type") == "Sequence":
        return [s for inner in step.get("pretokenizers", []) for s in _pre_tokenizers(inner)]
    return [step]


def load_byte_level_bpe(path: str | os.PathLike) -> tuple[Tokenizer, dict[str, int], str | None]:
    """``(tokenizer, specials, pattern)`` of a byte-level BPE ``tokenizer.json``: its special added tokens as
    ``{content: id}`` and ``gpt2``/``gpt4`` when its split is one of ours and it adds no ordinary tokens (``None``:
    anything else, encoded by HF's whole path);
    ``UserError`` naming the file when it is missing or not a regular file, not JSON (or nested too deeply for
    a parser's recursion), or not a byte-level BPE."""
    from tokenizers import Tokenizer

    where = os.fspath(path)
    if not os.path.isfile(where):
        if os.path.isdir(where):
            inside = os.path.join(where, "tokenizer.json")
            what = f"is a directory (give {inside})" if os.path.isfile(inside) else "is a directory"
        else:
            what = "is not a regular file (a device, a pipe or a socket)" if os.path.exists(where) else "does not exist"
        raise UserError(f"tokenizer file {where} {what}; give a tokenizer.json (mygpt tokenizer train)")
    try:
        with open(where, "rb") as f:
            hf_json = json.loads(f.read().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"tokenizer file {where} is not a JSON tokenizer.json ({e}); give a tokenizer.json") from e
    except RecursionError:  # Python's parser recurses per level; no tokenizer.json nests more than a few
        raise UserError(
            f"tokenizer file {where} nests its JSON objects or arrays too deeply to be a tokenizer.json (a "
            "tokenizer.json nests a few levels); give a tokenizer.json"
        ) from None
    model = hf_json.get("model") if isinstance(hf_json, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE":
        kind = model.get("type") if isinstance(model, dict) else None
        raise UserError(
            f"tokenizer file {where} is not a BPE tokenizer.json (model type {kind!r}); give a byte-level BPE"
        )
    if not any(step.get("type") == "ByteLevel" for step in _pre_tokenizers(hf_json.get("pre_tokenizer"))):
        raise UserError(
            f"tokenizer file {where} is a BPE without a ByteLevel pre-tokenizer, not a byte-level BPE; give a "
            f"byte-level BPE tokenizer.json (GPT-2 style, or one from mygpt tokenizer train)"
        )
    try:
        hf = Tokenizer.from_file(where)
    except Exception as e:  # the library's own error: a file that looks right but does not load
        raise UserError(f"tokenizer file {where} does not load in Hugging Face tokenizers: {e}") from e
    added = hf_json.get("added_tokens", [])
    specials = {t["content"]: int(t["id"]) for t in added if t.get("special", True)}
    # an ordinary added token is matched in any text by HF itself: only its whole path reproduces that
    pattern = _pattern_name(hf_json) if len(specials) == len(added) else None
    return hf, specials, pattern


def layout_parts(path: str | os.PathLike) -> tuple[list[tuple[bytes, bytes]], dict[str, int], str | None, dict]:
    """``(merges, specials, pattern, vocab)`` of a byte-level BPE ``tokenizer.json``: the merges as byte strings
    in rank order, the added tokens ``{content: id}``, ``gpt2``/``gpt4`` or ``None``, the vocabulary
    ``{token string: id}`` without the specials; ``UserError`` as :func:`load_byte_level_bpe`, or for a merge that
    is not byte-level."""
    hf, specials, pattern = load_byte_level_bpe(path)
    model = json.loads(hf.to_str())["model"]
    pairs = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    try:
        merges = [(_token_bytes(a), _token_bytes(b)) for a, b in pairs]
    except KeyError as e:
        raise UserError(
            f"tokenizer file {os.fspath(path)} has a merge with the non-byte character {e.args[0]!r}"
        ) from e
    vocab = {s: i for s, i in model["vocab"].items() if s not in specials}
    return merges, specials, pattern, vocab
