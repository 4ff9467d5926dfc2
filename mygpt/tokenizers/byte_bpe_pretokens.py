"""The pre-tokens of a text counted fast: ``Counter(regex.findall(GPT2_PATTERN, text))``, exactly, in numpy.

The GPT-2 pattern only looks at four classes of code point (``\\s``, ``\\p{L}``, ``\\p{N}``, the rest), so its
matches follow from the class runs of the text: a run of one class is a pre-token, except that

* a whitespace run followed by a non-whitespace character gives up its last character: a space joins the next
  pre-token (``" the"``), any other whitespace (``"\\n"``) is a pre-token of its own;
* an apostrophe that starts a pre-token and is followed by ``s d m t`` or ``ll ve re`` is a contraction (``"'s"``),
  and the letters after it start a new pre-token.

Pre-tokens are told apart by a 64-bit polynomial hash of their code points and every hash group is then checked
character by character against one of its members, so a collision can cost time (the piece is counted with the
regex) but never a wrong count. The text is counted in pieces cut before a space that follows a non-whitespace
character, where every pattern here ends a pre-token. Other patterns (GPT-4's) are counted with the regex.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import numpy as np
import regex

from mygpt.tokenizers.byte_bpe_reference import GPT2_PATTERN

__all__ = [
    "MAX_PRETOKEN_BYTES",
    "THREADS",
    "count_pretokens",
    "distinct_pretokens",
    "map_in_order",
    "overlong_pretoken",
    "pieces",
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
_P = np.uint64(0x9E3779B97F4A7C15)  # odd: invertible modulo 2**64
_P_INV = np.uint64(pow(int(_P), -1, 1 << 64))
_LEN_MIX = np.uint64(0xBF58476D1CE4E5B9)
_CUT = regex.compile(r"\S ")  # a space after a non-whitespace character (``\s`` is the class table's whitespace)
_CONTRACTIONS = {ord(c) for c in "sdmt"}
_CONTRACTIONS_2 = [(ord(a), ord(b)) for a, b in ("ll", "ve", "re")]


@functools.lru_cache(maxsize=1)
def _classes() -> np.ndarray:
    """Class of every code point as the ``regex`` module sees it (its Unicode version, not Python's)."""
    everything = "".join(map(chr, range(0x110000)))
    table = np.full(0x110000, OTHER, dtype=np.uint8)
    for cls, rest in ((WS, r"\S+"), (LETTER, r"\P{L}+"), (NUMBER, r"\P{N}+")):
        kept = regex.sub(rest, "", everything)
        table[np.frombuffer(kept.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)] = cls
    return table


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def pieces(text: str, size: int = PIECE_CHARS) -> Iterator[str]:
    """``text`` in pieces of about ``size`` characters, each cut before a space that follows a non-whitespace
    character (a pre-token ends there under both patterns, so counting piece by piece changes nothing)."""
    start = 0
    while len(text) - start > size:
        found = _CUT.search(text, start + size - 1)  # one search, not a step per space of a long run
        if found is None:
            break
        cut = found.start() + 1
        yield text[start:cut]
        start = cut
    yield text[start:]


def pretoken_starts(cps: np.ndarray) -> np.ndarray:
    """Where the GPT-2 pattern's matches start in the code points ``cps`` (a boolean mask)."""
    n = len(cps)
    cls = _classes()[cps]
    start = np.ones(n, dtype=bool)
    start[1:] = cls[1:] != cls[:-1]
    ws_end = np.flatnonzero((cls[:-1] == WS) & (cls[1:] != WS))  # last whitespace before a non-whitespace
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
        for hits, length in ((one, 2), (two, 3)):
            at = apos[hits]
            start[at + 1] = False
            if length == 3:
                start[at + 2] = False
            after = at + length
            start[after[after < n]] = True
    return start


_POWERS: list[np.ndarray] = []
_POWERS_LOCK = threading.Lock()


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``P**j`` and ``P**-j`` modulo 2**64 for ``j < n`` (kept for the next piece; threads share them)."""
    with _POWERS_LOCK:
        return _grown_powers(n)


def _grown_powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    if not _POWERS or len(_POWERS[0]) < n:
        size = max(n, PIECE_CHARS + (PIECE_CHARS >> 3))
        _POWERS.clear()
        for base in (_P, _P_INV):
            table = np.ones(size, dtype=np.uint64)
            with np.errstate(over="ignore"):
                np.cumprod(np.full(size - 1, base, dtype=np.uint64), out=table[1:])
            _POWERS.append(table)
    return _POWERS[0][:n], _POWERS[1][:n]


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


def distinct_pretokens(piece: str) -> tuple[list[str], np.ndarray] | None:
    """``(distinct, sequence)``: the distinct GPT-2 pre-tokens of ``piece`` and, for each pre-token in order, its
    index in ``distinct``; ``None`` on a hash collision (the caller then falls back to the regex)."""
    cps = _code_points(piece)
    n = len(cps)
    if n == 0:
        return [], np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(pretoken_starts(cps))
    ends = np.append(starts[1:], n)
    with np.errstate(over="ignore"):
        powers, inverse = _powers(n)
        prefix = np.zeros(n + 1, dtype=np.uint64)
        np.cumsum(cps.astype(np.uint64) * powers, out=prefix[1:])
        lengths = ends - starts
        h = (prefix[ends] - prefix[starts]) * inverse[starts]  # sum of c[j] * P**(j - start)
        h ^= lengths.astype(np.uint64) * _LEN_MIX
    order = np.argsort(h)  # any member may stand for its group: the check below compares every one to it
    sorted_h = h[order]
    new_group = np.ones(len(h), dtype=bool)
    new_group[1:] = sorted_h[1:] != sorted_h[:-1]
    first = order[new_group]
    group = np.empty(len(h), dtype=np.int64)
    group[order] = np.cumsum(new_group) - 1
    rep = first[group]  # the pre-token that stands for this one's hash
    if not (lengths == lengths[rep]).all():
        return None
    src = np.arange(n) + np.repeat(starts[rep] - starts, lengths)  # each character's twin in the first pre-token
    if not (cps == cps[src]).all():
        return None
    return [piece[s:e] for s, e in zip(starts[first].tolist(), ends[first].tolist())], group


def _count_piece(piece: str) -> dict[str, int]:
    found = distinct_pretokens(piece)
    if found is None:  # a hash collision: count this piece plainly
        return dict(collections.Counter(regex.findall(GPT2_PATTERN, piece)))
    distinct, group = found
    return dict(zip(distinct, np.bincount(group, minlength=len(distinct)).tolist()))


def _count_pieces(texts: list[str], pattern: str, piece_chars: int = PIECE_CHARS) -> dict[str, int]:
    def count(piece: str) -> dict[str, int]:
        if pattern == GPT2_PATTERN:
            return _count_piece(piece)
        return collections.Counter(regex.findall(pattern, piece))

    total: dict[str, int] = {}
    get = total.get
    every_piece = (piece for text in texts for piece in pieces(text, piece_chars))
    for counts in map_in_order(count, every_piece):  # a few pieces at a time: memory stays near the text's
        for tok, c in counts.items():
            total[tok] = get(tok, 0) + c
    return total


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
    get = total.get
    for table in tables[1:]:
        for tok, c in table.items():
            total[tok] = get(tok, 0) + c
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
