"""Character-level tokenizer (the chapter's Part I tokenizer).

The vocabulary is the sorted set of distinct characters of the training text; a character's id is its
position in that list. Encoding is vectorised with numpy so that a whole corpus (hundreds of MB) can be
turned into an id array without building a Python list per character.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mygpt.errors import UserError, describe_chars

__all__ = ["CharTokenizer"]


def ids_to_numpy(ids) -> np.ndarray:
    """Any 1-D integer sequence / ndarray / tensor -> 1-D int64 ndarray."""
    if hasattr(ids, "detach"):  # a torch tensor
        arr = ids.detach().to("cpu").numpy()
    else:
        arr = np.asarray(ids)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise UserError(f"token ids must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


class CharTokenizer:
    """One token per character. ``kind == "char"``."""

    kind = "char"

    def __init__(self, chars: Sequence[str]) -> None:
        chars = list(chars)
        for c in chars:
            if not isinstance(c, str) or len(c) != 1:
                raise UserError(f"tokenizer alphabet entries must be single characters, got {c!r}")
        if len(set(chars)) != len(chars):
            raise UserError("tokenizer alphabet has duplicate characters")
        if not chars:
            raise UserError("tokenizer alphabet is empty (the training text has no characters)")
        self.chars: list[str] = chars
        self.vocab_size: int = len(chars)
        self.stoi: dict[str, int] = {c: i for i, c in enumerate(chars)}
        self.itos: dict[int, str] = dict(enumerate(chars))
        # Vectorised lookup tables: code points sorted, with the id each one maps to.
        cps = np.array([ord(c) for c in chars], dtype=np.int64)
        order = np.argsort(cps, kind="stable")
        self._sorted_cps = cps[order]
        self._sorted_ids = order.astype(np.int64)

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """Alphabet = sorted distinct characters of ``text``."""
        if not text:
            raise UserError("cannot build a character tokenizer from empty text")
        return cls(sorted(set(text)))

    def state(self) -> dict:
        return {"chars": list(self.chars)}

    def token_bytes(self) -> np.ndarray:
        """UTF-8 length in bytes of each token's character, by id (int64; for bits per byte)."""
        return np.array([len(c.encode("utf-8", "surrogatepass")) for c in self.chars], dtype=np.int64)

    @classmethod
    def from_state(cls, state: dict) -> CharTokenizer:
        if not isinstance(state, dict) or "chars" not in state:
            raise UserError("char tokenizer state must be a dict with a 'chars' list")
        return cls(state["chars"])

    # -- encoding -------------------------------------------------------------------------------
    def _codepoints(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.int64)

    def unknown_chars(self, text: str) -> list[str]:
        """Distinct characters of ``text`` that are not in the alphabet, sorted."""
        return sorted(set(text) - self.stoi.keys())

    def encode_array(self, text: str, dtype=None) -> np.ndarray:
        """Encode to a numpy id array (uint16 when the vocabulary fits, else int32)."""
        cps = self._codepoints(text)
        pos = np.searchsorted(self._sorted_cps, cps)
        pos = np.minimum(pos, len(self._sorted_cps) - 1)
        bad = self._sorted_cps[pos] != cps if cps.size else np.zeros(0, dtype=bool)
        if bad.any():
            unknown = sorted({chr(int(c)) for c in np.unique(cps[bad])})
            raise UserError(f"characters not in the tokenizer's vocabulary: {describe_chars(unknown)}")
        ids = self._sorted_ids[pos]
        if dtype is None:
            dtype = np.uint16 if self.vocab_size <= 65536 else np.int32
        return ids.astype(dtype)

    def encode(self, text: str):
        """Encode ``text`` to a 1-D ``torch.long`` tensor; unknown characters raise ``UserError``."""
        import torch

        return torch.from_numpy(self.encode_array(text, dtype=np.int64))

    def decode(self, ids) -> str:
        arr = ids_to_numpy(ids)
        if arr.size and (arr.min() < 0 or arr.max() >= self.vocab_size):
            raise UserError(f"token id out of range for a vocabulary of {self.vocab_size}")
        itos = self.chars
        return "".join(itos[i] for i in arr.tolist())

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and other.chars == self.chars
