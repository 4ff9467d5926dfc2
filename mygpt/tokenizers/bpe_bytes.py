"""The chapter BPE's encoder on UTF-8 bytes: a chunk's words found in numpy, mapped to the known words by Arrow.

:meth:`mygpt.tokenizers.bpe_word_encoder.WordEncoder.encode_bytes` runs this on a chunk as read from the file: no
``str`` is built. The words of ``\\s*\\S+|\\s+`` start where a whitespace character follows a non-whitespace one,
so they are found from a whitespace mask over the bytes (:func:`word_starts`, which marks every byte of Python's
non-ASCII whitespace too); Arrow's ``dictionary_encode`` (a C++ hash table that compares the bytes) gives each
word its distinct word, and each distinct word is looked up once in a ``dict`` of the words seen so far. Why: the
lookup per word, not the BPE, is what an encoder of a few hundred thousand distinct words spends its time on.
Only words never seen before reach the BPE (the encoder's own batched rule), so the ids are the plain encoder's.
"""

from __future__ import annotations

import numpy as np

from mygpt.tokenizers.bpe_words import WS_LIMIT

__all__ = [
    "ASCII_WS",
    "GROUP_WORDS",
    "HOT_WORDS",
    "SLICE_BYTES",
    "WIDE_LEADS",
    "add_counts",
    "char_count",
    "count_distinct",
    "count_words",
    "distinct_words",
    "is_utf8",
    "utf8_offsets",
    "whitespace_mask",
    "word_starts",
]

#: Words handled at a time (bounds the temporaries of one chunk: about 40 bytes a word).
GROUP_WORDS = 1 << 19
#: Known words :meth:`~mygpt.tokenizers.bpe_word_encoder.WordEncoder.encode_bytes` puts ahead of each group's words
#: (:func:`distinct_words`): the first ones seen, which are the frequent ones.
HOT_WORDS = 1 << 15
#: Bytes :func:`word_starts` looks at a time.
SLICE_BYTES = 1 << 20

#: The UTF-8 spellings of the characters above U+007F that ``str.isspace`` calls whitespace (each 2 or 3 bytes,
#: led by 0xC2, 0xE1, 0xE2 or 0xE3), as ints (``(b0 << 16) | (b1 << 8) | b2``; 2-byte ones with ``b2 = 0``).
_WIDE = [chr(c).encode("utf-8") for c in range(0x80, WS_LIMIT) if chr(c).isspace()]
_WIDE2 = np.array(sorted((w[0] << 16) | (w[1] << 8) for w in _WIDE if len(w) == 2), dtype=np.int64)
_WIDE3 = np.array(sorted((w[0] << 16) | (w[1] << 8) | w[2] for w in _WIDE if len(w) == 3), dtype=np.int64)
#: What :func:`whitespace_mask` tests byte by byte (a test checks both against ``str.isspace``).
ASCII_WS = b"\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f "
WIDE_LEADS = (0xC2, 0xE1, 0xE2, 0xE3)


def whitespace_mask(u: np.ndarray) -> np.ndarray:
    """A bool per byte of the UTF-8 text ``u`` (uint8): the byte belongs to a whitespace character."""
    ws = u == 32
    ws |= np.subtract(u, 9, dtype=np.uint8) <= 4  # \t \n \v \f \r
    ws |= np.subtract(u, 28, dtype=np.uint8) <= 3  # \x1c .. \x1f
    lead = np.flatnonzero((u == 0xC2) | (np.subtract(u, 0xE1, dtype=np.uint8) <= 2))
    if lead.size:
        n = u.size
        b1 = u[np.minimum(lead + 1, n - 1)].astype(np.int64)
        b2 = u[np.minimum(lead + 2, n - 1)].astype(np.int64)
        head = (u[lead].astype(np.int64) << 16) | (b1 << 8)
        two = lead[np.isin(head, _WIDE2) & (lead + 1 < n)]
        three = lead[np.isin(head | b2, _WIDE3) & (lead + 2 < n)]
        for k in (0, 1):
            ws[two + k] = True
        for k in (0, 1, 2):
            ws[three + k] = True
    return ws


def word_starts(u: np.ndarray) -> np.ndarray:
    """The byte offsets where the words of ``\\s*\\S+|\\s+`` start in the UTF-8 text ``u``, then ``u.size``
    (Arrow's offsets: int32, int64 past 2 GiB; ``[0]`` for no text): a word starts at 0 and wherever whitespace
    follows non-whitespace. Found :data:`SLICE_BYTES` at a time (a few bytes of context either side), so the
    temporaries stay small whatever the text's size."""
    n = u.size
    dtype = np.int32 if n < 1 << 31 else np.int64  # int64: Arrow's large_binary
    parts = [np.zeros(1, dtype=dtype)]
    for a in range(1, n, SLICE_BYTES):
        b = min(n, a + SLICE_BYTES)
        lo, hi = max(0, a - 3), min(n, b + 2)  # a whitespace character is at most 3 bytes
        ws = whitespace_mask(u[lo:hi])[a - 1 - lo : b - lo]  # bytes a - 1 .. b - 1
        inner = np.flatnonzero(ws[1:] > ws[:-1])
        inner += a
        parts.append(inner.astype(dtype))
    parts.append(np.array([n], dtype=dtype) if n else np.zeros(0, dtype=dtype))
    return np.concatenate(parts)


def _strings(data: bytes, offsets: np.ndarray, kind: str = "binary"):
    import pyarrow as pa

    large = offsets.dtype == np.int64
    if kind == "binary":
        typ = pa.large_binary() if large else pa.binary()
    else:
        typ = pa.large_string() if large else pa.string()
    return pa.Array.from_buffers(typ, offsets.size - 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def is_utf8(data: bytes) -> bool:
    """Whether ``data`` is valid UTF-8 (Arrow's check: the rules Python's strict decoder applies)."""
    import pyarrow as pa

    try:
        _strings(
            data, np.array([0, len(data)], dtype=np.int32 if len(data) < 1 << 31 else np.int64), "string"
        ).validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def char_count(u: np.ndarray) -> int:
    """Characters in the valid UTF-8 text ``u`` (uint8): the bytes that do not continue a character. A continuation
    byte (0x80-0xBF) is one compare as int8 (-128..-65): one pass, and numpy lets go of the GIL."""
    return int(u.size - np.count_nonzero(u.view(np.int8) < -64))


def count_words(text: str) -> dict[str, int]:
    """``Counter(WORD_RE.findall(text))`` as a dict (first-seen order): the words of each piece of the text's UTF-8
    found by :func:`word_starts` and told apart by Arrow's hash table (:func:`distinct_words`), one Python string
    made per distinct word; a lone surrogate passes as its three bytes."""
    from mygpt.tokenizers.bpe_words import pieces

    total: dict[bytes, int] = {}
    for piece in pieces(text):
        data = piece.encode("utf-8", "surrogatepass")
        count_distinct(data, word_starts(np.frombuffer(data, dtype=np.uint8)), total)
    return {w.decode("utf-8", "surrogatepass"): n for w, n in total.items()}


def add_counts(total: dict, more: dict) -> dict:
    """Add the counts ``more`` into ``total`` (in place; the reduce step of counting chunk by chunk)."""
    get = total.get
    for key, n in more.items():
        total[key] = get(key, 0) + n
    return total


def count_distinct(data: bytes, offsets: np.ndarray, total: dict[bytes, int]) -> None:
    """Add how often each distinct word ``data[offsets[i]:offsets[i + 1]]`` occurs into ``total`` (bytes -> count,
    first seen first)."""
    dictionary, index = distinct_words(data, offsets)
    add_counts(total, dict(zip(dictionary.to_pylist(), np.bincount(index, minlength=len(dictionary)).tolist())))


def utf8_offsets(cps: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The UTF-8 byte offsets of the code-point positions ``starts`` of the text ``cps`` (no lone surrogates), then
    its byte length: the offsets :func:`distinct_words` takes for the spans between them."""
    pos = np.append(starts, len(cps)).astype(np.int64)
    at = pos.copy()
    for lowest in (0x80, 0x800, 0x10000):  # a character from each of these on takes one byte more
        wider = np.flatnonzero(cps >= lowest)
        if not wider.size:
            break
        at += np.searchsorted(wider, pos)
    return at.astype(np.int32 if at[-1] < 1 << 31 else np.int64)


def distinct_words(data: bytes, offsets: np.ndarray, known=None) -> tuple:
    """``(dictionary, index)``: the distinct words ``data[offsets[i]:offsets[i + 1]]`` (an Arrow binary array) and
    for each word the position of its distinct word (int32), from Arrow's hash table. ``known`` (an Arrow binary
    array of distinct words, or None): put ahead of the words, so ``dictionary[:len(known)]`` is ``known`` and a
    word equal to ``known[i]`` gets ``i``; the other distinct words follow in first-seen order. Why: the hash table
    that finds the distinct words then also finds the known ones, and only the others reach Python."""
    words = _strings(data, offsets)
    ahead = 0 if known is None else len(known)
    if ahead:
        import pyarrow as pa

        words = pa.concat_arrays([known.cast(words.type) if known.type != words.type else known, words])
    if len(words) == 0:
        return words, np.zeros(0, dtype=np.int32)
    encoded = words.dictionary_encode()
    return encoded.dictionary, encoded.indices.to_numpy()[ahead:]
