"""Byte-pair-encoding tokenizer: chapter 23's teaching trainer and encoder, chapter 28's word-level fast paths.

``vocab = chars + [a + b for (a, b) in merges]`` (+ 256 byte tokens after them with ``byte_fallback``); a token's
id is its position. Ties in training go to the highest count, then the lexicographically greatest pair
(docs/TOKENIZERS.md)."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from mygpt.atomic import atomic_write_text
from mygpt.errors import UserError, check_int, describe_chars
from mygpt.tokenizers import bpe_reference
from mygpt.tokenizers.bpe_word_encoder import WordEncoder, unknown_chars_error

__all__ = ["NUM_BYTE_TOKENS", "BPETokenizer"]

NUM_BYTE_TOKENS = 256


def _check_training_text(text: Any) -> str:
    if not isinstance(text, str):
        raise UserError(f"BPE training text must be a str, got {type(text).__name__}")
    if not text:
        raise UserError("BPE training text is empty; give the trainer some text")
    return text


def _decode_bytes(buf: bytearray) -> str:
    try:  # surrogatepass: a lone surrogate encoded by the byte fallback comes back unchanged
        return buf.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return buf.decode("utf-8", "replace")


class BPETokenizer:
    """Byte-pair-encoding tokenizer (``kind == "bpe"``): ``BPETokenizer(chars, merges, byte_fallback=False)``."""

    kind = "bpe"

    def __init__(self, chars: Sequence[str], merges: Sequence[Sequence[str]], byte_fallback: bool = False) -> None:
        chars, merges = self._validate(chars, merges, byte_fallback)
        self.chars: list[str] = chars
        self.merges: list[tuple[str, str]] = merges
        self.byte_fallback: bool = bool(byte_fallback)
        base = list(chars)
        base.extend(a + b for a, b in merges)
        #: id of the first byte token (== number of char + merge tokens)
        self.byte_offset: int = len(base)
        self.stoi: dict[str, int] = {s: i for i, s in enumerate(base)}
        vocab = base
        if self.byte_fallback:
            vocab = base + [f"<0x{b:02X}>" for b in range(NUM_BYTE_TOKENS)]
        self.vocab: list[str] = vocab
        self.vocab_size: int = len(vocab)
        self._charset = frozenset(chars)
        self._fast: WordEncoder | None = None  # lazily built WordEncoder

    @staticmethod
    def _validate(chars: Any, merges: Any, byte_fallback: Any) -> tuple[list[str], list[tuple[str, str]]]:
        if not isinstance(byte_fallback, bool):
            raise UserError(f"byte_fallback must be true or false, got {byte_fallback!r}")
        if isinstance(chars, (str, bytes)) or not isinstance(chars, Sequence):
            raise UserError(f"BPE 'chars' must be a list of single characters, got {type(chars).__name__}")
        chars = list(chars)
        for c in chars:
            if not isinstance(c, str) or len(c) != 1:
                raise UserError(f"BPE 'chars' entries must be single characters, got {c!r}")
        if len(set(chars)) != len(chars):
            dups = sorted(c for c, n in Counter(chars).items() if n > 1)
            raise UserError(f"BPE 'chars' has duplicate characters: {describe_chars(dups)}")
        if isinstance(merges, (str, bytes)) or not isinstance(merges, Sequence):
            raise UserError(f"BPE 'merges' must be a list of [a, b] pairs, got {type(merges).__name__}")
        known = set(chars)
        out: list[tuple[str, str]] = []
        seen_merges: set[tuple[str, str]] = set()
        for i, m in enumerate(merges):
            if isinstance(m, (str, bytes)) or not isinstance(m, Sequence) or len(m) != 2:
                raise UserError(f"BPE merge #{i} must be a pair [a, b] of strings, got {m!r}")
            a, b = m
            if not isinstance(a, str) or not isinstance(b, str):
                raise UserError(f"BPE merge #{i} must be a pair [a, b] of strings, got {m!r}")
            for s in (a, b):
                if s not in known:
                    raise UserError(
                        f"BPE merge #{i} {[a, b]!r} refers to {s!r}, which is neither a character nor the "
                        f"result of an earlier merge (the merges list is corrupt or hand-edited)"
                    )
            if (a, b) in seen_merges:
                raise UserError(f"BPE merge #{i} {[a, b]!r} is a duplicate of an earlier merge")
            seen_merges.add((a, b))
            known.add(a + b)
            out.append((a, b))
        return chars, out

    # -- state / files ----------------------------------------------------------------------------
    def state(self) -> dict:
        """JSON-able state: ``{"chars": [...], "merges": [[a, b], ...]}`` (+ ``"byte_fallback": true``)."""
        st: dict[str, Any] = {"chars": list(self.chars), "merges": [[a, b] for a, b in self.merges]}
        if self.byte_fallback:
            st["byte_fallback"] = True
        return st

    @classmethod
    def from_state(cls, state: Any) -> BPETokenizer:
        if not isinstance(state, dict):
            raise UserError(f"BPE tokenizer state must be a JSON object, got {type(state).__name__}")
        missing = [k for k in ("chars", "merges") if k not in state]
        if missing:
            raise UserError(f"BPE tokenizer state is missing key(s) {missing}; expected 'chars' and 'merges'")
        extra = sorted(set(state) - {"chars", "merges", "byte_fallback"})
        if extra:
            raise UserError(f"BPE tokenizer state has unknown key(s) {extra}")
        return cls(state["chars"], state["merges"], byte_fallback=state.get("byte_fallback", False))

    def save(self, path: str | os.PathLike) -> None:
        """Write the state as JSON to ``path`` (atomically)."""
        atomic_write_text(path, json.dumps(self.state(), ensure_ascii=False))

    @classmethod
    def load(cls, path: str | os.PathLike) -> BPETokenizer:
        """Read a tokenizer written by :meth:`save`; a malformed file raises ``UserError`` naming it."""
        try:
            with open(path, encoding="utf-8") as f:
                raw = f.read()
        except FileNotFoundError:
            raise UserError(f"tokenizer file {os.fspath(path)!r} does not exist") from None
        except UnicodeDecodeError as e:
            raise UserError(f"tokenizer file {os.fspath(path)!r} is not UTF-8 text ({e})") from None
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as e:
            raise UserError(f"tokenizer file {os.fspath(path)!r} is not valid JSON: {e}") from None
        try:
            return cls.from_state(data)
        except UserError as e:
            raise UserError(f"tokenizer file {os.fspath(path)!r}: {e}") from None

    # -- training ---------------------------------------------------------------------------------
    @classmethod
    def from_text(cls, text: str, num_merges: int, byte_fallback: bool = False) -> BPETokenizer:
        """Chapter 23's teaching trainer over the whole text as one symbol sequence; ``O(num_merges x len(text))``."""
        text = _check_training_text(text)
        chars, merges = bpe_reference.train_text(text, check_int("num_merges", num_merges, 0))
        return cls(chars, merges, byte_fallback=byte_fallback)

    @classmethod
    def from_corpus(cls, text: str, num_merges: int, byte_fallback: bool = False) -> BPETokenizer:
        """Chapter 28's word-level trainer, incremental (:mod:`mygpt.tokenizers.bpe_train`): the chapter's merges."""
        text = _check_training_text(text)
        from mygpt.tokenizers.bpe_train import train_bpe

        chars, merges = train_bpe(text, check_int("num_merges", num_merges, 0))
        return cls(chars, merges, byte_fallback=byte_fallback)

    # -- encoding ---------------------------------------------------------------------------------
    def unknown_chars(self, text: str) -> list[str]:
        """Distinct characters of ``text`` this tokenizer cannot encode, sorted ([] with byte fallback)."""
        if self.byte_fallback:
            return []
        return sorted(set(text) - self._charset)

    def _byte_ids(self, s: str) -> list[int]:
        off = self.byte_offset
        return [off + b for b in s.encode("utf-8", "surrogatepass")]

    def encode(self, text: str):
        """Chapter 23's teaching encoder: the merges in order over the whole text, as a 1-D ``torch.long`` tensor.

        Unknown characters raise ``UserError`` naming them, unless ``byte_fallback`` (then UTF-8 byte tokens)."""
        import torch

        if not isinstance(text, str):
            raise UserError(f"text to encode must be a str, got {type(text).__name__}")
        unknown = set(text) - self._charset
        if unknown and not self.byte_fallback:
            raise unknown_chars_error(unknown)
        symbols = bpe_reference.encode_in_merge_order(text, self.merges)
        stoi = self.stoi
        if unknown:
            ids: list[int] = []
            for s in symbols:
                i = stoi.get(s)
                if i is None:
                    ids.extend(self._byte_ids(s))
                else:
                    ids.append(i)
        else:
            ids = [stoi[s] for s in symbols]
        return torch.tensor(ids, dtype=torch.long)

    def _fast_encoder(self) -> WordEncoder:
        if self._fast is None:
            self._fast = WordEncoder(self)
        return self._fast

    @property
    def id_dtype(self) -> type:
        """numpy dtype of :meth:`encode_corpus` output: uint16 if ``vocab_size <= 65536`` else uint32."""
        return np.uint16 if self.vocab_size <= 65536 else np.uint32

    def encode_corpus(self, text: str, unk_policy: str = "skip", return_stats: bool = False):
        """Chapter 28's fast encoder: a numpy array of ids (``id_dtype``), with ``return_stats`` ``(ids, EncodeStats)``.

        ``unk_policy``: ``"skip"`` drops (and counts) unknown characters, ``"error"`` raises ``UserError`` naming them;
        with ``byte_fallback`` they become their UTF-8 byte tokens under either policy."""
        if not isinstance(text, str):
            raise UserError(f"text to encode must be a str, got {type(text).__name__}")
        if unk_policy not in ("skip", "error"):
            raise UserError(f"unk_policy must be 'skip' or 'error', got {unk_policy!r}")
        ids, stats = self._fast_encoder().encode_text(text, unk_policy)
        return (ids, stats) if return_stats else ids

    def count_tokens(self, word_counts: dict[str, int], unk_policy: str = "skip") -> int:
        """How many ids :meth:`encode_corpus` gives for a text with these word counts (``{word: count}``)."""
        words = list(word_counts)
        if not words:
            return 0
        enc = self._fast_encoder()
        flat, lens = enc.batch_symbol_ids(words)
        freqs = np.fromiter(word_counts.values(), dtype=np.int64, count=len(words))
        if not flat.size or flat.min() >= 0:
            return int(lens @ freqs)
        ends = np.cumsum(lens)
        total = 0
        for k, (w, n) in enumerate(zip(words, freqs.tolist())):  # words with unknown characters: the slow rule
            s = flat[ends[k] - lens[k] : ends[k]]
            total += n * (len(s) if s.size == 0 or s.min() >= 0 else len(self.encode_corpus(w, unk_policy)))
        return total

    def token_bytes(self) -> np.ndarray:
        """UTF-8 length in bytes of each token's string, by id (int64; a byte token counts 1): for bits per byte."""
        base = [len(s.encode("utf-8", "surrogatepass")) for s in self.vocab[: self.byte_offset]]
        return np.array(base + [1] * (self.vocab_size - self.byte_offset), dtype=np.int64)

    # -- decoding ---------------------------------------------------------------------------------
    def decode(self, ids) -> str:
        """Ids (list / ndarray / tensor, 1-D) -> text. Byte-token runs are decoded as UTF-8."""
        if hasattr(ids, "detach"):  # torch tensor
            ids = ids.detach().cpu().numpy()
        arr = np.asarray(ids)
        if arr.ndim != 1:
            arr = arr.reshape(-1)
        if arr.size == 0:
            return ""
        if not np.issubdtype(arr.dtype, np.integer):
            raise UserError(f"token ids must be integers, got dtype {arr.dtype}")
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= self.vocab_size:
            bad = lo if lo < 0 else hi
            raise UserError(f"token id {bad} is out of range for a vocabulary of {self.vocab_size}")
        vocab = self.vocab
        if hi < self.byte_offset:
            return "".join([vocab[i] for i in arr.tolist()])
        off = self.byte_offset
        parts: list[str] = []
        buf = bytearray()
        for i in arr.tolist():
            if i >= off:
                buf.append(i - off)
            else:
                if buf:
                    parts.append(_decode_bytes(buf))
                    buf.clear()
                parts.append(vocab[i])
        if buf:
            parts.append(_decode_bytes(buf))
        return "".join(parts)

    # -- misc -------------------------------------------------------------------------------------
    def __getstate__(self) -> dict:
        return self.state()

    def __setstate__(self, state: dict) -> None:
        BPETokenizer.__init__(self, state["chars"], state["merges"], byte_fallback=state.get("byte_fallback", False))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, BPETokenizer)
            and other.chars == self.chars
            and other.merges == self.merges
            and other.byte_fallback == self.byte_fallback
        )

    def __hash__(self) -> int:
        return hash((tuple(self.chars), tuple(self.merges), self.byte_fallback))

    def __repr__(self) -> str:
        fb = ", byte_fallback=True" if self.byte_fallback else ""
        return f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}{fb})"
