"""The fast BPE encoder behind ``BPETokenizer.encode_corpus``: each distinct word encoded once, ids gathered with numpy.

Text (as UTF-8) is cut into the words of the chapter's pre-tokeniser ``\\s*\\S+|\\s+`` and each distinct word looked
up among the words seen so far (:mod:`mygpt.tokenizers.bpe_bytes`); a new word is encoded once with the chapter's
``_encode_word`` rule, in numpy batches, and the ids are gathered from one flat store. At most ``cache_limit``
words are kept (then the cache is emptied).
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import asdict, dataclass, field

import numpy as np

from mygpt.errors import UserError, describe_chars
from mygpt.tokenizers.bpe_words import pieces

_SHIFT = 32


@dataclass
class EncodeStats:
    """Counts for one encoded text or chunk (characters, tokens, skipped and byte-fallback characters, by character);
    ``merge`` adds another one in."""

    chars: int = 0
    tokens: int = 0
    skipped_positions: int = 0
    skipped_chars: dict[str, int] = field(default_factory=dict)
    fallback_positions: int = 0
    fallback_chars: dict[str, int] = field(default_factory=dict)

    def merge(self, other: EncodeStats) -> EncodeStats:
        """Add ``other`` into this one (in place) and return ``self``."""
        self.chars += other.chars
        self.tokens += other.tokens
        self.skipped_positions += other.skipped_positions
        for c, n in other.skipped_chars.items():
            self.skipped_chars[c] = self.skipped_chars.get(c, 0) + n
        self.fallback_positions += other.fallback_positions
        for c, n in other.fallback_chars.items():
            self.fallback_chars[c] = self.fallback_chars.get(c, 0) + n
        return self

    def to_dict(self) -> dict:
        return asdict(self)


def unknown_chars_error(unknown) -> UserError:
    """The ``UserError`` for characters a tokenizer cannot encode (``unk_policy="error"``)."""
    return UserError(
        f"characters not in the tokenizer's vocabulary: {describe_chars(sorted(unknown))} "
        "(retrain the tokenizer on text that contains them, use unk_policy='skip', or use byte_fallback=True)"
    )


class WordEncoder:
    """Memoised per-word BPE encoder for one tokenizer (see the module docstring)."""

    def __init__(self, tokenizer, cache_limit: int = 250_000) -> None:
        stoi = tokenizer.stoi
        self.byte_fallback = tokenizer.byte_fallback
        self.byte_offset = tokenizer.byte_offset
        self.dtype = tokenizer.id_dtype
        # Symbols are canonical ids (stoi of the symbol string), so equal strings are equal symbols.
        ranks: dict[int, int] = {}
        merged: dict[int, int] = {}
        for r, (a, b) in enumerate(tokenizer.merges):
            k = (stoi[a] << _SHIFT) | stoi[b]
            ranks[k] = r  # a repeated merge keeps its last rank, like the chapter's dict comprehension
            merged[k] = stoi[a + b]
        # The same tables as sorted numpy arrays, for the batched (vectorised) word encoder.
        keys = np.array(sorted(ranks), dtype=np.int64)
        self._pair_keys = keys
        self._pair_rank = np.array([ranks[k] for k in keys.tolist()], dtype=np.int64)
        self._pair_merged = np.array([merged[k] for k in keys.tolist()], dtype=np.int64)
        # Small vocabularies (<= 2048 ids: <= 16 MB) also get a dense pair -> rank table (faster than
        # searchsorted); merged id by rank in _rank_merged.
        self._base = tokenizer.byte_offset
        self._dense = None
        self._rank_merged = np.zeros(len(tokenizer.merges), dtype=np.int64)
        self._rank_merged[self._pair_rank] = self._pair_merged
        if 0 < self._base <= 2048 and keys.size:
            dense = np.full(self._base * self._base, np.iinfo(np.int32).max, dtype=np.int32)
            dense[(keys >> 32) * self._base + (keys & 0xFFFFFFFF)] = self._pair_rank
            self._dense = dense
        order = sorted(range(len(tokenizer.chars)), key=lambda i: ord(tokenizer.chars[i]))
        self._char_cps = np.array([ord(tokenizer.chars[i]) for i in order], dtype=np.int64)
        self._char_ids = np.array([stoi[tokenizer.chars[i]] for i in order], dtype=np.int64)
        self.cache_limit = cache_limit
        self._reset_cache()

    def _reset_cache(self) -> None:
        # For each distinct word seen so far (its slot) its ids at store[start[slot] : start[slot] + length[slot]].
        self._start = np.zeros(1024, dtype=np.int64)
        self._length = np.zeros(1024, dtype=np.int64)
        self._has_unknown = np.zeros(1024, dtype=bool)
        self._store = np.zeros(4096, dtype=self.dtype)
        self._used = 0  # ids in the store
        # slot -> the unknown characters of that word (with repeats); only words that have any.
        self.unknown: dict[int, tuple[str, ...]] = {}
        # the words seen so far (UTF-8) -> slot
        self._slot_of_bytes: dict[bytes, int] = {}
        # the words of slots 0 .. len - 1 (an Arrow binary array, at most HOT_WORDS): found by Arrow's hash table
        self._hot = None

    # -- words ------------------------------------------------------------------------------------
    def _known_ids(self, symbols: list[int]) -> list[int]:
        """A word's final ids from its symbols (unknown characters, negative, dropped or spelled as byte tokens)."""
        if not self.byte_fallback:
            return [i for i in symbols if i >= 0]
        off = self.byte_offset
        out: list[int] = []
        for i in symbols:
            if i >= 0:
                out.append(i)
            else:
                out.extend(off + b for b in chr(-1 - i).encode("utf-8", "surrogatepass"))
        return out

    def batch_symbol_ids(self, words: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The chapter's ``_encode_word`` for many words at once with numpy, one merge round for all of them at a time:
        ``(flat symbol ids, lengths)``; an unknown character is ``-1 - code point`` (never merged)."""
        nw = len(words)
        lens = np.fromiter(map(len, words), dtype=np.int64, count=nw)
        cps = np.frombuffer("".join(words).encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.int64)
        if self._char_cps.size:
            at = np.minimum(np.searchsorted(self._char_cps, cps), self._char_cps.size - 1)
            sym = np.where(self._char_cps[at] == cps, self._char_ids[at], -1 - cps)
        else:
            sym = -1 - cps
        wid = np.arange(nw, dtype=np.int64)
        keys, rank_of = self._pair_keys, self._pair_rank
        rank_merged = self._rank_merged
        dense, base = self._dense, self._base
        inf32 = np.iinfo(np.int32).max
        nk = keys.size
        inf = np.iinfo(np.int64).max
        out_sym: list[np.ndarray] = []
        out_wid: list[np.ndarray] = []
        while sym.size:
            starts = np.cumsum(lens) - lens
            r = np.full(sym.size, inf, dtype=np.int64)
            if nk:
                left, right = sym[:-1], sym[1:]
                valid = (left >= 0) & (right >= 0)
                valid[starts[1:] - 1] = False  # no pairs across words
                if dense is not None:
                    rr = dense[np.where(valid, left * base + right, 0)].astype(np.int64)
                    rr[~valid | (rr == inf32)] = inf
                    r[:-1] = rr
                else:
                    key = (left << 32) | right
                    at = np.minimum(np.searchsorted(keys, key), nk - 1)
                    valid &= keys[at] == key
                    r[:-1] = np.where(valid, rank_of[at], inf)
            best = np.minimum.reduceat(r, starts)
            done = best == inf
            if done.any():
                done_pos = np.repeat(done, lens)
                out_sym.append(sym[done_pos])
                out_wid.append(np.repeat(wid[done], lens[done]))
                live = ~done
                live_pos = ~done_pos
                sym, r, wid, lens, best = sym[live_pos], r[live_pos], wid[live], lens[live], best[live]
                if not sym.size:
                    break
                starts = np.cumsum(lens) - lens
            hit = r == np.repeat(best, lens)
            # keep every other position of each run of consecutive hits, starting with the run's first
            idx = np.arange(sym.size, dtype=np.int64)
            run_start = hit.copy()
            run_start[1:] &= ~hit[:-1]
            first = np.maximum.accumulate(np.where(run_start, idx, 0))
            keep = hit & (((idx - first) & 1) == 0)
            kp = np.flatnonzero(keep)
            sym[kp] = rank_merged[r[kp]]
            alive = np.ones(sym.size, dtype=bool)
            alive[kp + 1] = False
            lens = lens - np.add.reduceat(keep.astype(np.int64), starts)
            sym = sym[alive]
        flat_wid = np.concatenate(out_wid) if out_wid else np.zeros(0, np.int64)
        flat = np.concatenate(out_sym) if out_sym else np.zeros(0, np.int64)
        order = np.argsort(flat_wid, kind="stable")
        return flat[order], np.bincount(flat_wid, minlength=nw)

    def _add_words(self, words: list[str], slot: int) -> None:
        """Encode the table's new words (slots ``slot`` on) and append their ids to the store."""
        n_new = len(words)
        need = slot + n_new
        if need > len(self._start):
            cap = max(need, 2 * len(self._start))
            self._start = np.resize(self._start, cap)
            self._length = np.resize(self._length, cap)
            self._has_unknown = np.resize(self._has_unknown, cap)
            self._has_unknown[slot:] = False
        flat, lens_a = self.batch_symbol_ids(words)
        if flat.size and flat.min() < 0:  # words with unknown characters (rare): fix them up one by one
            ends = np.cumsum(lens_a)
            bad_words = np.unique(np.searchsorted(ends, np.flatnonzero(flat < 0), side="right"))
            pieces = []
            prev = 0
            new_lens = lens_a.copy()
            for k in bad_words.tolist():
                s = flat[ends[k] - lens_a[k] : ends[k]].tolist()
                self.unknown[slot + k] = tuple(chr(-1 - i) for i in s if i < 0)
                self._has_unknown[slot + k] = True
                fixed = self._known_ids(s)
                pieces.append(flat[prev : ends[k] - lens_a[k]])
                pieces.append(np.array(fixed, dtype=np.int64))
                new_lens[k] = len(fixed)
                prev = ends[k]
            pieces.append(flat[prev:])
            flat = np.concatenate(pieces)
            lens_a = new_lens
        self._length[slot:need] = lens_a
        self._start[slot:need] = self._used + np.cumsum(lens_a) - lens_a
        end = self._used + flat.size
        if end > len(self._store):
            self._store = np.resize(self._store, max(end, 2 * len(self._store)))
        self._store[self._used : end] = flat
        self._used = end

    # -- text -------------------------------------------------------------------------------------
    def encode_text(self, text: str, unk_policy: str = "skip") -> tuple[np.ndarray, EncodeStats]:
        """The ids and stats of ``text``: :meth:`encode_bytes` of its UTF-8, piece by piece (about ``PIECE_CHARS``
        characters each, cut at safe points: bounded memory); a lone surrogate passes as the three bytes the byte
        fallback spells it with."""
        stats = EncodeStats()
        parts = [self._encode_utf8(p.encode("utf-8", "surrogatepass"), unk_policy, stats) for p in pieces(text)]
        ids = np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else np.zeros(0, dtype=self.dtype)
        stats.tokens = int(ids.size)
        return ids, stats

    def encode_bytes(self, data: bytes, unk_policy: str = "skip") -> tuple[np.ndarray, EncodeStats]:
        """:meth:`encode_text` of ``data.decode("utf-8")``, from the bytes (no ``str`` of the text is made); bytes
        that are not UTF-8 raise the decoder's own ``UnicodeDecodeError``."""
        from mygpt.tokenizers import bpe_bytes

        if not bpe_bytes.is_utf8(data):
            data.decode("utf-8")  # raises, with the offset of the first bad byte
        stats = EncodeStats()
        ids = self._encode_utf8(data, unk_policy, stats)
        stats.tokens = int(ids.size)
        return ids, stats

    def _encode_utf8(self, data: bytes, unk_policy: str, stats: EncodeStats) -> np.ndarray:
        """The ids of the UTF-8 ``data``: the words found and mapped once per group of
        :data:`~mygpt.tokenizers.bpe_bytes.GROUP_WORDS` by :mod:`mygpt.tokenizers.bpe_bytes`."""
        from mygpt.tokenizers import bpe_bytes
        from mygpt.tokenizers.bpe_train import gc_paused

        u = np.frombuffer(data, dtype=np.uint8)
        stats.chars += bpe_bytes.char_count(u)
        offsets = bpe_bytes.word_starts(u)
        step = bpe_bytes.GROUP_WORDS
        with gc_paused():
            parts = [
                self._encode_group(data, offsets[g : g + step + 1], unk_policy, stats)
                for g in range(0, offsets.size - 1, step)
            ]
        return np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else np.zeros(0, dtype=self.dtype)

    def _encode_group(self, data: bytes, offsets: np.ndarray, unk_policy: str, stats: EncodeStats) -> np.ndarray:
        """The ids of the words ``data[offsets[i]:offsets[i + 1]]``: each distinct word looked up once, the new
        ones encoded (:meth:`_add_words`) and remembered."""
        from mygpt.tokenizers.bpe_bytes import HOT_WORDS, distinct_words

        if len(self._slot_of_bytes) > self.cache_limit:
            self._reset_cache()
        known = self._slot_of_bytes
        hot = self._hot
        ahead = 0 if hot is None else len(hot)
        dictionary, index = distinct_words(data, offsets, hot)
        rest = dictionary.slice(ahead).to_pylist()  # the group's words that are not hot, first seen first
        n = len(rest)
        dslots = np.empty(ahead + n, dtype=np.int64)
        dslots[:ahead] = np.arange(ahead)
        dslots[ahead:] = np.fromiter(map(known.get, rest, itertools.repeat(-1, n)), dtype=np.int64, count=n)
        new = (np.flatnonzero(dslots[ahead:] < 0) + ahead).tolist()
        if new:  # slots numbered in order of arrival: the next is len(known)
            first = len(known)
            words = [rest[i - ahead] for i in new]
            self._add_words([w.decode("utf-8", "surrogatepass") for w in words], first)
            dslots[new] = np.arange(first, first + len(new))
            known.update(zip(words, range(first, first + len(new))))
            if first == ahead < HOT_WORDS:  # every known word is hot, so the new ones are the rest, in slot order
                self._hot = dictionary.slice(0, min(HOT_WORDS, ahead + n))
        # a word has at most as many ids as bytes (a byte token per byte at most): int32 counts suffice below 2 GiB
        small = int(offsets[-1]) - int(offsets[0]) < 1 << 31
        return self._gather_distinct(dslots, index.astype(np.int32 if small else np.int64), unk_policy, stats)

    def _gather_distinct(
        self, dslots: np.ndarray, index: np.ndarray, unk_policy: str, stats: EncodeStats
    ) -> np.ndarray:
        """The ids of the words ``dslots[index]`` put end to end, gathered from a copy of just the distinct words' ids
        (small enough to stay in the CPU's cache, unlike the whole store); unknown characters counted."""
        if not index.size:
            return np.zeros(0, dtype=self.dtype)
        if self.unknown:
            unk = np.flatnonzero(self._has_unknown[dslots])
            if unk.size:
                freq = np.bincount(index, minlength=dslots.size)[unk]
                met = freq > 0  # a hot word need not occur in the group: one that does not is not counted
                if met.any():
                    self._account_unknown(dslots[unk[met]], freq[met], unk_policy, stats)
        lens = self._length[dslots].astype(index.dtype)
        ends = np.cumsum(lens)
        firsts = ends - lens
        local = self._store[np.repeat(self._start[dslots] - firsts, lens) + np.arange(int(ends[-1]))]
        word_lens = lens[index]
        out_end = np.cumsum(word_lens)
        shift = np.repeat(firsts[index] - (out_end - word_lens), word_lens)
        shift += np.arange(shift.size, dtype=shift.dtype)
        return local[shift]

    def _account_unknown(self, slots: np.ndarray, freq: np.ndarray, unk_policy: str, stats: EncodeStats) -> None:
        """Count the unknown characters of the distinct words ``slots``, met ``freq`` times each (or raise)."""
        if unk_policy == "error" and not self.byte_fallback:
            chars: set[str] = set()
            for sl in slots.tolist():
                chars.update(self.unknown[sl])
            raise unknown_chars_error(chars)
        per_char: collections.Counter = collections.Counter()
        for sl, f in zip(slots.tolist(), freq.tolist()):
            for c in self.unknown[sl]:
                per_char[c] += f
        total = sum(per_char.values())
        target = stats.fallback_chars if self.byte_fallback else stats.skipped_chars
        for c, k in per_char.items():
            target[c] = target.get(c, 0) + k
        if self.byte_fallback:
            stats.fallback_positions += total
        else:
            stats.skipped_positions += total
