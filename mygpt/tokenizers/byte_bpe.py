"""``ByteBPETokenizer``: the byte-level BPE of GPT-2 and CS336 (:mod:`mygpt.tokenizers.byte_bpe_reference` states it).

Ids: ``0..255`` the bytes, ``256 + i`` merge ``i``, then the special tokens (``<|endoftext|>`` by default), which
get their ids after training and are never learnt. Any text encodes (256 byte symbols: nothing is out of
vocabulary) and ``decode(encode(text)) == text``.

Encoding runs on Hugging Face ``tokenizers`` loading this tokenizer's own ``tokenizer.json``
(:func:`mygpt.tokenizers.byte_bpe_files.hf_tokenizer`): for a merge list its BPE is the reference's rule, merge the
lowest-ranked pair first, and the tests prove the ids equal on real text. With the GPT-2 pattern the pre-tokens
are found in numpy and HF encodes each distinct one once (HF's own regex split is the slow part of its encoder),
kept between texts (:class:`PretokenIds`); a text of many documents (a chunk of the shards stage) is encoded in one
pass, each document's ids still those it has alone.
Specials are cut out here, never by HF (its added-token matching is switched off), so ``<|endoftext|>`` in a
user's text is ordinary bytes unless the caller allows specials.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from mygpt.errors import UserError, check_int
from mygpt.tokenizers.byte_bpe_reference import PATTERNS, split_specials

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = [
    "DEFAULT_SPECIALS",
    "ByteBPETokenizer",
    "PretokenIds",
    "check_pretokens",
    "check_text",
    "encode_with",
    "id_dtype",
]

DEFAULT_SPECIALS = ("<|endoftext|>",)
#: How many pieces one ``encode_batch_fast`` call gets (bounds the memory of HF's encodings).
_BATCH = 8
#: How many pre-tokens' ids a tokenizer keeps between texts (a few tens of MB).
CACHE_PRETOKENS = 200_000


def id_dtype(vocab_size: int) -> type:
    """The smallest unsigned integer type that holds every id below ``vocab_size`` (for a file whose ids have
    gaps: its largest id + 1)."""
    return np.uint16 if vocab_size <= 1 << 16 else np.uint32


def encode_with(
    hf: Tokenizer,
    text: str,
    specials: dict[str, int],
    allowed_special: bool,
    pattern: str | None,
    dtype: type,
    piece_chars: int = 0,
    cache: PretokenIds | None = None,
) -> np.ndarray:
    """``text``'s ids under the HF tokenizer ``hf`` that splits by ``pattern`` (``gpt2``, ``gpt4`` or ``None``:
    unknown): the ``specials`` (``{content: id}``) become their ids only when allowed, everything else is ordinary
    text. With a known pattern the text is encoded in pieces cut where that pattern always ends a pre-token; with
    GPT-2's each distinct pre-token is encoded once (``cache``, a :class:`PretokenIds` for ``hf`` and ``dtype``
    that a caller encoding many texts passes each time: a new one when None); ``piece_chars``: the pieces' size
    (0: the default)."""
    from mygpt.tokenizers.byte_bpe_pretokens import PIECE_CHARS, pieces

    size = piece_chars or PIECE_CHARS
    hf.encode_special_tokens = True  # the specials are cut out here, by the caller's choice
    out: list[np.ndarray] = []
    batch: list[str] = []
    if cache is None and pattern == "gpt2":
        cache = PretokenIds(hf, dtype)

    def flush() -> None:
        if batch:
            out.extend(np.asarray(e.ids, dtype=dtype) for e in hf.encode_batch_fast(batch, add_special_tokens=False))
            batch.clear()

    for part in split_specials(text, specials if allowed_special else ()):
        if allowed_special and part in specials:
            flush()
            out.append(np.asarray([specials[part]], dtype=dtype))
        elif cache is not None:  # GPT-2's pattern
            flush()
            ids = cache.documents(part, _NO_ENDS, 0, size)
            out.append(ids if ids is not None else np.asarray(hf.encode(part, add_special_tokens=False).ids, dtype))
        else:
            for piece in pieces(part, size >> 4) if pattern else [part]:
                batch.append(piece)
                if len(batch) >= _BATCH:
                    flush()
    flush()
    return np.concatenate(out) if out else np.zeros(0, dtype=dtype)


_NO_ENDS = np.zeros(0, dtype=np.int64)


@functools.lru_cache(maxsize=1)
def _byte_chars() -> dict[int, str]:
    """``str.translate`` table: a Latin-1 character (one byte) -> GPT-2's printable character for that byte."""
    from mygpt.tokenizers.byte_bpe_files import bytes_to_unicode

    return {b: c for b, c in bytes_to_unicode().items()}


class PretokenIds:
    """The ids of each distinct GPT-2 pre-token met so far, for one text or a text cut into documents
    (:meth:`documents`).

    Each piece's pre-tokens are told apart by their UTF-8 bytes in Arrow's hash table
    (:func:`mygpt.tokenizers.bpe_bytes.distinct_words`, the first ones met put ahead, so they come out as their
    slots) and the others looked up once each; a new one is encoded once by
    ``hf``'s BPE model, and a text's ids gathered in numpy. Why: a corpus's documents share most pre-tokens, so
    after the first chunks the work per text is a few array passes, not a step per document or per pre-token.
    Emptied past :data:`CACHE_PRETOKENS`; one lock, so threads may share it."""

    def __init__(self, hf: Tokenizer, dtype: type) -> None:
        self._hf, self._dtype = hf, dtype
        self._lock = threading.Lock()
        self._reset()

    def __len__(self) -> int:
        return len(self._slot)

    def _reset(self) -> None:
        self._slot: dict[bytes, int] = {}  # a pre-token's UTF-8 -> its slot
        self._hot = None  # the pre-tokens of slots 0, 1, ... (the first met: the frequent ones), an Arrow array
        # slot -> its ids at _flat[_start[slot]:][:_len[slot]]
        self._flat: np.ndarray = np.zeros(1 << 16, dtype=self._dtype)
        self._start = np.zeros(0, dtype=np.int64)
        self._len = np.zeros(0, dtype=np.int64)

    def documents(self, text: str, ends: np.ndarray, eot: int, piece_chars: int = 0) -> np.ndarray | None:
        """The ids of ``text`` with ``eot`` after each document end (``ends``: sorted character offsets, an offset
        twice for an empty document): each document's ids are its ids alone. ``None`` where a pre-token is longer
        than :data:`~mygpt.tokenizers.byte_bpe_pretokens.MAX_PRETOKEN_BYTES` (the caller encodes document by
        document, which refuses it). ``piece_chars``: the size of the pieces it is found in (0: the default)."""
        from mygpt.tokenizers.bpe_bytes import utf8_offsets
        from mygpt.tokenizers.bpe_words import code_points
        from mygpt.tokenizers.byte_bpe_pretokens import MAX_PRETOKEN_BYTES, PIECE_CHARS, piece_bounds, pretoken_spans

        parts: list[np.ndarray] = []
        at_token: list[np.ndarray] = [np.zeros(int(np.searchsorted(ends, 0, "right")), dtype=np.int64)]
        base = 0
        for s, e in piece_bounds(text, piece_chars or PIECE_CHARS) if text else ():
            lo, hi = np.searchsorted(ends, [s, e], "right")
            bounds = ends[lo:hi] - s
            piece = text[s:e]
            cps = code_points(piece)
            starts, _ = pretoken_spans(cps, bounds)
            offsets = utf8_offsets(cps, starts)
            if starts.size and int(np.diff(offsets).max()) > MAX_PRETOKEN_BYTES:
                return None
            ids, out_lens = self._ids(piece.encode("utf-8"), offsets)
            before = np.zeros(len(out_lens) + 1, dtype=np.int64)
            np.cumsum(out_lens, out=before[1:])
            at_token.append(base + before[np.searchsorted(starts, bounds, "left")])
            parts.append(ids)
            base += ids.size
        ids = np.concatenate(parts) if parts else np.zeros(0, dtype=self._dtype)
        return np.insert(ids, np.concatenate(at_token), np.asarray(eot, dtype=self._dtype))

    def _ids(self, data: bytes, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, ids per pre-token)`` of the pre-tokens ``data[offsets[i]:offsets[i + 1]]``."""
        from mygpt.tokenizers.bpe_bytes import HOT_WORDS, distinct_words

        with self._lock:
            if len(self._slot) > CACHE_PRETOKENS:
                self._reset()
            ahead = 0 if self._hot is None else len(self._hot)
            dictionary, index = distinct_words(data, offsets, self._hot)  # the hot ones come out as their slots
            rest = dictionary.slice(ahead).to_pylist()
            get = self._slot.get
            slots = np.arange(ahead + len(rest), dtype=np.int64)
            slots[ahead:] = np.fromiter((get(w, -1) for w in rest), dtype=np.int64, count=len(rest))
            new = np.flatnonzero(slots < 0)
            if new.size:
                first = len(self._slot)
                slots[new] = self._add([rest[i - ahead] for i in new.tolist()])
                if first == ahead < HOT_WORDS:  # every known pre-token is hot: the new ones follow in slot order
                    self._hot = dictionary.slice(0, min(HOT_WORDS, slots.size))
            slots = slots[index]
            out_lens = self._len[slots]
            total = int(out_lens.sum())
            out_starts = np.cumsum(out_lens) - out_lens
            src = np.repeat(self._start[slots] - out_starts, out_lens) + np.arange(total)
            return self._flat[src], out_lens

    def _add(self, words: list[bytes]) -> np.ndarray:
        """Encode the new pre-tokens ``words`` and give them the next slots (returned)."""
        tokenize, to_byte_chars = self._hf.model.tokenize, _byte_chars()
        lists = [[x.id for x in tokenize(w.decode("latin-1").translate(to_byte_chars))] for w in words]
        lens = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        used = int(self._start[-1] + self._len[-1]) if self._len.size else 0
        end = used + int(lens.sum())
        if end > self._flat.size:
            self._flat = np.resize(self._flat, max(end, 2 * self._flat.size))
        self._flat[used:end] = np.fromiter(itertools.chain.from_iterable(lists), dtype=self._dtype, count=end - used)
        self._start = np.append(self._start, used + np.cumsum(lens) - lens)
        self._len = np.append(self._len, lens)
        first = len(self._slot)
        self._slot.update(zip(words, range(first, first + len(words))))
        return np.arange(first, first + len(words), dtype=np.int64)


def check_pretokens(text: str, specials: Iterable[str], pattern: str, what: str) -> None:
    """``UserError`` when ``text`` (cut at ``specials``) holds a pre-token under the pattern named ``pattern``
    longer than :data:`~mygpt.tokenizers.byte_bpe_pretokens.MAX_PRETOKEN_BYTES`; ``what`` names the text. Why
    refuse, not cut: BPE's memory grows many times over with one pre-token, and cutting it would change the ids."""
    from mygpt.tokenizers import byte_bpe_pretokens

    bound = byte_bpe_pretokens.MAX_PRETOKEN_BYTES
    found = byte_bpe_pretokens.overlong_pretoken(text, specials, PATTERNS[pattern], bound)
    if found is not None:
        raise pretoken_error(what, found[1], f"byte offset {found[0]:,}", bound)


def pretoken_error(what: str, length: int, at: str, bound: int) -> UserError:
    """The one message for a pre-token of ``length`` bytes past ``bound``, found ``at`` (``byte offset N``)."""
    return UserError(
        f"{what} holds one pre-token of {length:,} bytes at {at} (a run of letters, digits, "
        f"whitespace or punctuation), more than the {bound:,} bytes byte-level BPE takes in one pre-token; break "
        f"that run with a character of another kind (a space in a run of letters, a letter in a run of "
        f"whitespace) or leave it out of the text"
    )


def check_text(text: object, what: str) -> str:
    """``text`` if it is a ``str`` that UTF-8 can spell; else ``UserError`` (a lone surrogate has no bytes)."""
    if not isinstance(text, str):
        raise UserError(f"{what} must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UserError(
            f"{what} holds a lone surrogate U+{ord(text[e.start]):04X} at character {e.start:,}, which has no UTF-8 "
            f"bytes; decode the source as UTF-8 (errors='replace' turns bad bytes into U+FFFD)"
        ) from None
    return text


@dataclasses.dataclass(frozen=True)
class ByteBPETokenizer:
    """A trained byte-level BPE: ``merges`` (pairs of byte strings, training order), ``specials``, ``pattern``
    (``gpt2`` or ``gpt4``)."""

    merges: tuple[tuple[bytes, bytes], ...]
    specials: tuple[str, ...] = DEFAULT_SPECIALS
    pattern: str = "gpt2"
    kind = "byte"

    def __post_init__(self) -> None:
        if self.pattern not in PATTERNS:
            raise UserError(f"pattern must be one of {', '.join(PATTERNS)}, got {self.pattern!r}")
        if len(set(self.specials)) != len(self.specials) or not all(self.specials):
            raise UserError(f"special tokens must be distinct, non-empty strings, got {list(self.specials)!r}")
        from mygpt.tokenizers.byte_bpe_files import bytes_to_unicode

        byte_of = {c: b for b, c in bytes_to_unicode().items()}
        for s in self.specials:
            if s in byte_of:  # a tokenizer.json keys tokens by string: the special would take the byte's id
                raise UserError(
                    f"special token {s!r} is spelled like the token of byte 0x{byte_of[s]:02x}; choose a special "
                    f"token that is not one character of GPT-2's byte alphabet (like <|pad|>)"
                )

    @classmethod
    def train(
        cls,
        text: str,
        vocab_size: int,
        specials: Sequence[str] = DEFAULT_SPECIALS,
        pattern: str = "gpt2",
        workers: int = 1,
        what: str = "training text",
    ) -> ByteBPETokenizer:
        """Train on ``text``: ``vocab_size - 256 - len(specials)`` merges (fewer when the text runs out of pairs);
        ``UserError`` naming ``what`` before any training for a bad argument or an over-long pre-token
        (:func:`check_pretokens`)."""
        from mygpt.tokenizers.byte_bpe_train import train_byte_bpe

        check_text(text, "training text")
        specials = tuple(specials)
        check_int(
            "vocab_size", vocab_size, 256 + len(specials), hint="256 bytes + the special tokens + the merges to learn"
        )
        cls(merges=(), specials=specials, pattern=pattern)  # refuse a bad pattern or specials before training
        check_pretokens(text, specials, pattern, what)
        merges = train_byte_bpe(text, vocab_size - 256 - len(specials), specials, PATTERNS[pattern], workers)
        return cls(merges=tuple(merges), specials=specials, pattern=pattern)

    @property
    def special_base(self) -> int:
        """The first special's id (``256 + len(merges)``)."""
        return 256 + len(self.merges)

    @property
    def vocab_size(self) -> int:
        return self.special_base + len(self.specials)

    @functools.cached_property
    def vocab(self) -> dict[int, bytes]:
        """Id -> bytes (a special's UTF-8)."""
        from mygpt.tokenizers.byte_bpe_reference import vocab

        return vocab(self.merges, self.specials)

    @property
    def special_ids(self) -> dict[str, int]:
        return {s: self.special_base + j for j, s in enumerate(self.specials)}

    @functools.cached_property
    def _hf(self) -> Tokenizer:
        from mygpt.tokenizers.byte_bpe_files import hf_tokenizer

        return hf_tokenizer(self)

    def encode_array(self, text: str, allowed_special: bool = False) -> np.ndarray:
        """The ids of ``text`` (``uint16`` while the vocabulary fits, else ``uint32``); ``allowed_special`` turns
        the specials in it into their ids (else they are ordinary bytes)."""
        check_text(text, "text to encode")
        check_pretokens(text, self.specials if allowed_special else (), self.pattern, "text to encode")
        return encode_with(
            self._hf,
            text,
            self.special_ids,
            allowed_special,
            self.pattern,
            id_dtype(self.vocab_size),
            cache=self._document_ids if self.pattern == "gpt2" else None,
        )

    @functools.cached_property
    def _document_ids(self) -> PretokenIds:
        return PretokenIds(self._hf, id_dtype(self.vocab_size))

    def encode_documents(self, text: str, ends: Sequence[int]) -> np.ndarray:
        """The ids of ``text`` with ``<|endoftext|>`` after each document end (``ends``: sorted character offsets in
        ``0..len(text)``; an offset twice: an empty document), equal to encoding each document alone
        (:meth:`encode_array`, specials as ordinary bytes) and joining them with the special's id; the text after
        the last end is a document without one. With the GPT-2 pattern the text is encoded in one pass
        (:class:`PretokenIds`), not document by document."""
        check_text(text, "text to encode")
        at = np.asarray(ends, dtype=np.int64)
        if at.size and (at[0] < 0 or at[-1] > len(text) or (np.diff(at) < 0).any()):
            raise UserError(f"document ends must be sorted offsets in 0..{len(text):,}, got {at[:10].tolist()}...")
        eot = self.special_ids["<|endoftext|>"]
        ids = self._document_ids.documents(text, at, eot) if self.pattern == "gpt2" else None
        if ids is not None:
            return ids
        dtype = id_dtype(self.vocab_size)
        parts: list[np.ndarray] = []
        for a, b in zip([0, *at.tolist()], at.tolist()):
            parts += [self.encode_array(text[a:b]), np.asarray([eot], dtype=dtype)]
        tail = int(at[-1]) if at.size else 0
        if tail < len(text):
            parts.append(self.encode_array(text[tail:]))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    def encode(self, text: str):
        """The ids of ``text`` as a ``torch.long`` tensor, specials as ordinary bytes (the model-facing form every
        mygpt tokenizer has: a prompt)."""
        import torch

        return torch.from_numpy(self.encode_array(text).astype(np.int64))

    def unknown_chars(self, text: str) -> list[str]:
        """Always empty: every character is UTF-8 bytes, and every byte is a token."""
        return []

    @property
    def chars(self) -> tuple[str, ...]:
        """No character alphabet (the base symbols are bytes); kept for code that lists one."""
        return ()

    def token_bytes(self) -> np.ndarray:
        """Bytes of each token by id (int64; a special counts its UTF-8 length): for bits per byte."""
        return np.array([len(self.vocab[i]) for i in range(self.vocab_size)], dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids`` (a list, an array or a tensor); byte runs that are not valid UTF-8 (a sample cut
        mid-character) become U+FFFD."""
        vocab = self.vocab
        values = ids.tolist() if hasattr(ids, "tolist") else ids
        try:
            return b"".join(vocab[int(i)] for i in values).decode("utf-8", errors="replace")
        except KeyError as e:
            raise UserError(f"token id {e.args[0]} is outside the vocabulary (size {self.vocab_size})") from None

    def state(self) -> dict:
        """JSON-able state (checkpoints, tokenizer files): the merges as hex byte strings, specials, pattern."""
        return {
            "merges": [[a.hex(), b.hex()] for a, b in self.merges],
            "specials": list(self.specials),
            "pattern": self.pattern,
        }

    @classmethod
    def from_state(cls, state: object) -> ByteBPETokenizer:
        """The tokenizer :meth:`state` describes; ``UserError`` for a malformed one."""
        bad = UserError(
            "byte-level BPE state must be {'merges': [[hex, hex], ...], 'specials': [str, ...], "
            f"'pattern': 'gpt2'|'gpt4'}}, got {str(state)[:200]}"
        )
        if not isinstance(state, dict) or set(state) != {"merges", "specials", "pattern"}:
            raise bad
        try:
            merges = tuple((bytes.fromhex(a), bytes.fromhex(b)) for a, b in state["merges"])
            specials = tuple(state["specials"])
        except (TypeError, ValueError):
            raise bad from None
        if not all(a and b for a, b in merges) or not all(isinstance(s, str) for s in specials):
            raise bad
        return cls(merges=merges, specials=specials, pattern=state["pattern"])

    @classmethod
    def load(cls, path: str | os.PathLike) -> ByteBPETokenizer:
        """The tokenizer a :meth:`to_json` file holds (bytes 0..255 in order, then the merges, then the specials);
        ``UserError`` naming the file for anything else (any byte-level BPE still encodes with
        ``mygpt tokenizer encode``)."""
        from mygpt.tokenizers.byte_bpe_files import layout_parts, vocab_strings

        merges, specials, pattern, vocab = layout_parts(path)
        tok = None
        if pattern is not None:
            tok = cls(merges=tuple(merges), specials=tuple(sorted(specials, key=specials.__getitem__)), pattern=pattern)
            try:
                if vocab_strings(tok) != vocab or tok.special_ids != specials:
                    tok = None
            except UserError:
                tok = None
        if tok is None:
            raise UserError(
                f"tokenizer file {os.fspath(path)} is a byte-level BPE but not in mygpt's layout (bytes 0..255 in "
                f"order, then the merges, then the specials, split by the gpt2 or gpt4 pattern); encode with it "
                f"through mygpt tokenizer encode, or train one with mygpt tokenizer train"
            )
        return tok

    def to_json(self) -> str:
        """Hugging Face ``tokenizer.json`` text."""
        return self._hf.to_str(pretty=True)
