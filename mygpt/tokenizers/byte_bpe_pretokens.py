"""The pre-tokens of a text counted fast: ``Counter(regex.findall(GPT2_PATTERN, text))``, exactly, in numpy.

The GPT-2 pattern only looks at four classes of code point (``\\s``, ``\\p{L}``, ``\\p{N}``, the rest), so its
matches follow from the class runs of the text: a run of one class is a pre-token, except that

* a whitespace run followed by a non-whitespace character gives up its last character: a space joins the next
  pre-token (``" the"``), any other whitespace (``"\\n"``) is a pre-token of its own;
* an apostrophe that starts a pre-token and is followed by ``s d m t`` or ``ll ve re`` is a contraction (``"'s"``),
  and the letters after it start a new pre-token.

Counting finds the pre-tokens of a piece (:func:`pretoken_spans`) and tells them apart by their UTF-8 bytes in
Arrow's hash table (:func:`mygpt.tokenizers.bpe_bytes.count_distinct`, which compares the bytes: no collision can
mislead it). The text is counted in pieces cut before a space that follows a non-whitespace character, where every
pattern here ends a pre-token; each thread takes a run of consecutive pieces. Other patterns (GPT-4's) are counted
with the regex.
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import numpy as np
import regex

from mygpt.tokenizers.bpe_bytes import add_counts, count_distinct, utf8_offsets
from mygpt.tokenizers.byte_bpe_reference import GPT2_PATTERN

__all__ = [
    "MAX_PRETOKEN_BYTES",
    "THREADS",
    "classes",
    "count_pretokens",
    "map_in_order",
    "overlong_pretoken",
    "piece_bounds",
    "pieces",
    "pretoken_spans",
    "pretoken_starts",
]

#: Threads that find pre-tokens piece by piece (numpy's sorts and gathers run without the GIL).
THREADS = 2
_T = TypeVar("_T")
_R = TypeVar("_R")

WS, LETTER, NUMBER, OTHER = 0, 1, 2, 3
PIECE_CHARS = 1 << 20
#: The longest pre-token (UTF-8 bytes) a text may hold to be trained on or encoded. BPE works on one pre-token at a
#: time, and its memory grows with the longest one many times over (training on one pre-token of 1 MiB of spaces
#: takes about 0.9 GB, of 10 MB more than 6 GB): a text past this bound is refused, not cut, so what is trained or
#: encoded is always exactly the text.
MAX_PRETOKEN_BYTES = 1 << 20
_CUT = regex.compile(r"\S ")  # a space after a non-whitespace character (``\s`` is the class table's whitespace)
_CONTRACTIONS = {ord(c) for c in "sdmt"}
_CONTRACTIONS_2 = [(ord(a), ord(b)) for a, b in ("ll", "ve", "re")]


_UNKNOWN = 255
_CLASS = np.full(0x110000, _UNKNOWN, dtype=np.uint8)  # code point -> class, learnt as code points are met


def classes(cps: np.ndarray) -> np.ndarray:
    """The class of each code point of ``cps`` as the ``regex`` module sees it (its Unicode version, not Python's).

    Learnt for the code points a text holds, the first time they are met: asking ``regex`` about all of Unicode
    up front takes longer than counting many a text."""
    cls = _CLASS[cps]
    if len(cls) and cls.max() == _UNKNOWN:  # the greatest uint8: one pass, no mask, in the usual case
        _learn(np.unique(cps[cls == _UNKNOWN]))
        cls = _CLASS[cps]
    return cls


def _learn(new: np.ndarray) -> None:
    chars = new.astype(np.uint32).tobytes().decode("utf-32-le", "surrogatepass")
    learnt = np.full(len(new), OTHER, dtype=np.uint8)
    for cls, rest in ((WS, r"\S+"), (LETTER, r"\P{L}+"), (NUMBER, r"\P{N}+")):
        kept = _code_points(regex.sub(rest, "", chars))
        learnt[np.searchsorted(new, kept)] = cls
    _CLASS[new] = learnt  # one write of final values: a thread reading meanwhile sees a class or "unknown"


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def pieces(text: str, size: int = PIECE_CHARS) -> Iterator[str]:
    """``text`` in pieces of about ``size`` characters, each cut before a space that follows a non-whitespace
    character (a pre-token ends there under both patterns, so counting piece by piece changes nothing)."""
    for start, end in piece_bounds(text, size):
        yield text[start:end]


def piece_bounds(text: str, size: int = PIECE_CHARS) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each of :func:`pieces`' pieces."""
    start = 0
    while len(text) - start > size:
        found = _CUT.search(text, start + size - 1)  # one search, not a step per space of a long run
        if found is None:
            break
        cut = found.start() + 1
        yield start, cut
        start = cut
    yield start, len(text)


def pretoken_starts(cps: np.ndarray, bounds: np.ndarray | None = None) -> np.ndarray:
    """Where the GPT-2 pattern's matches start in the code points ``cps`` (a boolean mask). ``bounds`` (sorted
    positions): where a document starts; each document's matches are then those of the document alone, as if it
    were split off first. Why one pass for many documents: the rules look only at a character's neighbours, so a
    boundary changes the neighbours it separates and nothing else."""
    n = len(cps)
    cls = classes(cps)
    start = np.ones(n, dtype=bool)
    start[1:] = cls[1:] != cls[:-1]
    joined = None  # joined[i]: characters i and i + 1 are in one document
    if bounds is not None and len(bounds):
        inner = bounds[(bounds > 0) & (bounds < n)]
        start[inner] = True
        joined = np.ones(max(n - 1, 0), dtype=bool)
        joined[inner - 1] = False
    ws_end = (cls[:-1] == WS) & (cls[1:] != WS)  # last whitespace before a non-whitespace
    if joined is not None:
        ws_end &= joined
    ws_end = np.flatnonzero(ws_end)
    start[ws_end] = True
    start[ws_end[cps[ws_end] == 32] + 1] = False  # a space joins the pre-token after it
    apos = np.flatnonzero(start[:-1] & (cps[:-1] == 39))
    if len(apos):
        nxt = cps[apos + 1]
        one = np.isin(nxt, list(_CONTRACTIONS))
        two = np.zeros(len(apos), dtype=bool)
        has3 = apos + 2 < n
        third = np.where(has3, cps[np.minimum(apos + 2, n - 1)], 0)
        for a, b in _CONTRACTIONS_2:
            two |= has3 & (nxt == a) & (third == b)
        if joined is not None:  # a contraction never reaches into the next document
            one &= joined[apos]
            two &= joined[apos] & joined[np.minimum(apos + 1, n - 2)]
        for hits, length in ((one, 2), (two, 3)):
            at = apos[hits]
            start[at + 1] = False
            if length == 3:
                start[at + 2] = False
            after = at + length
            start[after[after < n]] = True
    return start


def map_in_order(fn: Callable[[_T], _R], items: Iterable[_T], threads: int | None = None) -> Iterator[_R]:
    """``map(fn, items)`` on ``threads`` threads (default :data:`THREADS`), results in order, at most
    ``2 * threads`` pieces in flight (so memory stays at a few pieces' work whatever the text's size)."""
    threads = THREADS if threads is None else threads
    if threads <= 1:
        yield from map(fn, items)
        return
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        pending: collections.deque = collections.deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def pretoken_spans(cps: np.ndarray, bounds: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, lengths)`` of the GPT-2 pattern's matches in the code points ``cps``; ``bounds``: where documents
    start (:func:`pretoken_starts`)."""
    starts = np.flatnonzero(pretoken_starts(cps, bounds)) if len(cps) else np.zeros(0, dtype=np.int64)
    return starts, np.diff(starts, append=len(cps))


def _count_gpt2(text: str, bounds: list[tuple[int, int]]) -> dict[str, int]:
    """The GPT-2 pre-tokens of ``text[s:e]`` for each ``(s, e)`` of ``bounds``, counted by their UTF-8 bytes in
    Arrow's hash table (one string made per distinct pre-token)."""
    total: dict[bytes, int] = {}
    for start, end in bounds:
        piece = text[start:end]
        cps = _code_points(piece)
        count_distinct(piece.encode("utf-8"), utf8_offsets(cps, pretoken_spans(cps)[0]), total)
    return {t.decode("utf-8"): n for t, n in total.items()}


def _count_pieces(texts: list[str], pattern: str, piece_chars: int = PIECE_CHARS) -> dict[str, int]:
    tables: Iterable[dict[str, int]]
    if pattern == GPT2_PATTERN:
        jobs = [(text, part) for text in texts for part in _shares(list(piece_bounds(text, piece_chars)), THREADS)]
        tables = list(map_in_order(lambda job: _count_gpt2(*job), jobs, min(THREADS, len(jobs))))
    else:
        every_piece = (piece for text in texts for piece in pieces(text, piece_chars))
        tables = map_in_order(lambda piece: collections.Counter(regex.findall(pattern, piece)), every_piece)
    total: dict[str, int] = {}
    for counts in tables:  # a few pieces at a time: memory stays near the text's
        add_counts(total, counts)
    return total


def _shares(bounds: list[_T], parts: int) -> list[list[_T]]:
    """``bounds`` in at most ``parts`` runs of consecutive items, of about equal length."""
    size = -(-len(bounds) // max(1, parts))
    return [bounds[i : i + size] for i in range(0, len(bounds), size)]


def count_pretokens(
    texts: list[str], pattern: str = GPT2_PATTERN, workers: int = 1, piece_chars: int = PIECE_CHARS
) -> dict[str, int]:
    """``{pre-token: count}`` over ``texts`` under ``pattern``: equal to ``Counter(regex.findall(pattern, t))``
    summed over the texts, counted in pieces of about ``piece_chars``. ``workers > 1`` counts the text in that
    many parts in fresh processes (spawned, never forked: the caller may be threaded) and adds their tables up."""
    total_chars = sum(map(len, texts))
    if workers <= 1 or total_chars < 2 * piece_chars:
        return _count_pieces(texts, pattern, piece_chars)
    import concurrent.futures
    import multiprocessing

    part = max(piece_chars, total_chars // workers + 1)
    shares: list[list[str]] = [[] for _ in range(workers)]
    filled = 0
    for text in texts:
        for piece in pieces(text, part):
            shares[min(filled * workers // total_chars, workers - 1)].append(piece)
            filled += len(piece)
    shares = [share for share in shares if share]
    args = ([pattern] * len(shares), [piece_chars] * len(shares))
    with concurrent.futures.ProcessPoolExecutor(len(shares), mp_context=multiprocessing.get_context("spawn")) as pool:
        tables = list(pool.map(_count_pieces, shares, *args))
    total = tables[0]
    for table in tables[1:]:
        add_counts(total, table)
    return total


def overlong_pretoken(
    text: str, specials: Iterable[str] = (), pattern: str = GPT2_PATTERN, bound: int | None = None
) -> tuple[int, int] | None:
    """``(byte offset, byte length)`` of the first pre-token of ``text`` (cut at the ``specials`` first) under
    ``pattern`` longer than ``bound`` UTF-8 bytes (default :data:`MAX_PRETOKEN_BYTES`), or ``None``. Exact and
    cheap: the text is cut where every pattern here ends a pre-token (:func:`pieces`), and only a piece of more
    than ``bound / 4`` characters (a character is at most 4 bytes) is split with the regex."""
    from mygpt.tokenizers.byte_bpe_reference import split_specials

    bound = MAX_PRETOKEN_BYTES if bound is None else bound
    chars = 0
    specials = tuple(specials)
    for part in split_specials(text, specials):
        if part not in specials and len(part) * 4 > bound:
            at = chars
            for piece in pieces(part, max(1, bound >> 4)):
                if len(piece) * 4 > bound:
                    for m in regex.finditer(pattern, piece):
                        if (m.end() - m.start()) * 4 > bound and len(m.group().encode("utf-8")) > bound:
                            start = at + m.start()
                            return len(text[:start].encode("utf-8")), len(m.group().encode("utf-8"))
                at += len(piece)
        chars += len(part)
    return None
