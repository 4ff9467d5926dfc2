"""A UTF-8 file encoded in chunks of about ``chunk_bytes`` cut at tokenisation-safe points, in order or anywhere.

A safe cut is a whitespace character that follows a non-whitespace one: with ``\\s*\\S+|\\s+`` every word ends
there, so the words on either side do not depend on the other side. A byte-level BPE (``tokenizer.kind ==
"byte"``) is cut only before a space that follows a non-whitespace character (:data:`BYTE_SAFE_CUT_RE`).
Boundaries depend only on the file's bytes and ``chunk_bytes`` (never on the worker count), and the chunks' ids,
concatenated, equal ``encode_corpus`` of the whole text.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

import numpy as np
import regex

from mygpt.errors import UserError
from mygpt.tokenizers.bpe_word_encoder import EncodeStats
from mygpt.tokenizers.bpe_words import SAFE_CUT_RE


def _not_utf8(path, offset: int) -> UserError:
    return UserError(
        f"{os.fspath(path)!r} is not valid UTF-8: invalid byte at offset {offset}; "
        "re-encode the file as UTF-8 (e.g. iconv -t UTF-8)"
    )


#: A safe cut for the byte-level BPE: a space (U+0020) after a non-whitespace character, whitespace as the ``regex``
#: module's ``\\S`` (the split patterns' own; Python's ``re`` differs, e.g. at U+001C). Both split patterns (GPT-2's
#: and GPT-4's) end a pre-token there (no pre-token holds a space past its first character) and start the next one
#: with the space, so the ids on either side do not depend on the other side. Any script: CJK or Cyrillic text
#: cuts at its spaces as English does.
BYTE_SAFE_CUT_RE = regex.compile(r"(?<=\S) ")


def _cut_rule(cut_re: Any) -> str:
    """What a safe cut is under ``cut_re``, for the error when none comes."""
    if cut_re is BYTE_SAFE_CUT_RE:
        return "a space after a non-space character"
    return "whitespace after a non-space character"


def safe_cut_re(tokenizer) -> Any:
    """The safe cuts of ``tokenizer``'s kind (see the module docstring)."""
    return BYTE_SAFE_CUT_RE if getattr(tokenizer, "kind", "bpe") == "byte" else SAFE_CUT_RE


#: How far past a chunk's target size a word may run before the file is refused: memory per chunk stays at
#: ``chunk_bytes`` plus this, whatever the text (one 40 MB "word" would otherwise be one 40 MB chunk).
MAX_WORD_BYTES = 1 << 20


def find_safe_cut(f, path, target: int, size: int, floor: int = 0, cut_re: Any = SAFE_CUT_RE) -> int:
    """The first safe cut (a match of ``cut_re``) ``p >= target`` in the open binary file ``f`` (``size`` if none),
    reading nothing before ``floor``; ``UserError`` when none lies within :data:`MAX_WORD_BYTES` after ``target``."""
    if target >= size:
        return size
    q = max(floor, target - 4)
    f.seek(q)
    head = f.read(4)
    # Move q to the start of a UTF-8 character (skip continuation bytes 10xxxxxx).
    k = 0
    while k < len(head) and (head[k] & 0xC0) == 0x80:
        k += 1
    q += k
    window = 1 << 16
    limit = min(size, target + MAX_WORD_BYTES)  # past this, no cut: refused
    while True:
        f.seek(q)
        data = f.read(min(window, limit - q))
        at_eof = q + len(data) >= size
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            truncated = not at_eof and e.reason == "unexpected end of data"
            text = data[: e.start].decode("utf-8")
            if not truncated:
                # Invalid byte: a cut before it is fine (its chunk will report it), else report it now.
                for m in cut_re.finditer(text):
                    p = q + len(text[: m.start()].encode("utf-8"))
                    if p >= target:
                        return p
                raise _not_utf8(path, q + e.start) from None
        for m in cut_re.finditer(text):
            p = q + len(text[: m.start()].encode("utf-8"))
            if p >= target:
                return p
        if at_eof:
            return size
        if q + len(data) >= limit:
            raise UserError(
                f"{path}: no word ends in the {MAX_WORD_BYTES:,} bytes after byte {target:,} (a safe cut for this "
                f"tokenizer is {_cut_rule(cut_re)}); a 'word' that long is not text this "
                "tokenizer can count or encode in bounded memory: check the corpus (wikitext's longest words are a "
                "few hundred characters)"
            )
        window *= 2


def chunk_bounds(
    path, chunk_bytes: int, end: int | None = None, cut_re: Any = SAFE_CUT_RE
) -> Iterator[tuple[int, int, int]]:
    """Yield ``(chunk_index, byte_start, byte_end)`` for the file (see the module docstring), or for its first
    ``end`` bytes (the last chunk then ends at ``end``, which should be a character boundary); ``cut_re``: what a
    safe cut is (:func:`safe_cut_re`)."""
    size = os.path.getsize(path) if end is None else end
    with open(path, "rb") as f:
        start = 0
        idx = 0
        while start < size:
            end = find_safe_cut(f, path, start + chunk_bytes, size, floor=start, cut_re=cut_re)
            yield idx, start, end
            idx += 1
            start = end


def _read_chunk(f, path, start: int, end: int) -> str:
    f.seek(start)
    data = f.read(end - start)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _not_utf8(path, start + e.start) from None


def read_chunk(path, start: int, end: int, opener: Callable[[Any], IO[bytes]] | None = None) -> str:
    """Bytes ``start..end`` of a UTF-8 file as text (a chunk from :func:`chunk_bounds`); ``UserError`` naming the
    file and the offset of an invalid byte. ``opener(path)``: how to open it for binary reading (default
    ``open(path, "rb")``; e.g. an object store's file, read by range)."""
    with opener(path) if opener else open(path, "rb") as f:
        return _read_chunk(f, path, start, end)


def encode_chunk(
    tokenizer,
    path,
    start: int,
    end: int,
    unk_policy: str = "skip",
    opener: Callable[[Any], IO[bytes]] | None = None,
    ends: Sequence[int] = (),
) -> tuple[np.ndarray, EncodeStats]:
    """Encode bytes ``start..end`` of a UTF-8 file: ``(ids, stats)``. One chunk of :func:`chunk_bounds`, for a
    caller that spreads the chunks over processes or machines (the pipeline does, on Dask); the tokenizer's
    word cache carries over from one call to the next in the same process. ``opener``: see :func:`read_chunk`.
    A byte-level BPE encodes every character (``unk_policy`` has nothing to do); ``ends``: the file offsets in
    ``start < e <= end`` where a document ends (``<|endoftext|>`` follows there): each document gets the ids it
    has alone (the chunk is encoded in one pass, ``ByteBPETokenizer.encode_documents``)."""
    if getattr(tokenizer, "kind", "bpe") == "byte":
        return _encode_documents(tokenizer, read_chunk(path, start, end, opener), start, ends)
    if ends:
        raise UserError("only a byte-level BPE ends documents with <|endoftext|>; this tokenizer has no such token")
    with opener(path) if opener else open(path, "rb") as f:
        return _encode_bytes(tokenizer._fast_encoder(), f, path, start, end, unk_policy)


def _encode_bytes(enc, f, path, start: int, end: int, unk_policy: str) -> tuple[np.ndarray, EncodeStats]:
    """The chapter BPE's ids of bytes ``start..end`` of the open file ``f``, from the bytes as they are (the encoder
    finds the words without making a ``str`` of the chunk); not UTF-8: :func:`_not_utf8`."""
    f.seek(start)
    data = f.read(end - start)
    try:
        return enc.encode_bytes(data, unk_policy)
    except UnicodeDecodeError as e:
        raise _not_utf8(path, start + e.start) from None


def _encode_documents(tokenizer, text: str, start: int, ends: Sequence[int]) -> tuple[np.ndarray, EncodeStats]:
    """A byte-level BPE's ids of a chunk at file offset ``start``, ``<|endoftext|>`` after each document end (file
    offsets, turned into the chunk's character offsets here); the chunk is encoded in one pass
    (``ByteBPETokenizer.encode_documents``), each document's ids as it alone encodes."""
    at = np.asarray(ends, dtype=np.int64) - start
    if at.size and not text.isascii():  # a byte offset is ahead of its character by the continuation bytes before it
        data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        inside = np.flatnonzero((data & 0xC0) == 0x80)
        if np.isin(at, inside).any():
            raise UserError(f"a document end lies inside a UTF-8 character in bytes {start:,}.. of the corpus")
        at = at - np.searchsorted(inside, at)
    ids = tokenizer.encode_documents(text, at)
    return ids, EncodeStats(chars=len(text), tokens=int(ids.size))
