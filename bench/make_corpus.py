"""Write a deterministic, Wikipedia-shaped text corpus of any size, grown from WikiText-2.

    python -m bench.make_corpus --bytes 500000000 --seed 0 --out bench/out/wiki500m.txt

How the text is made (everything is driven by one ``numpy.random.Generator(PCG64(seed))``):

* **Article shapes** come from the real articles of ``../shared/data/wikitext2-valid.txt``: each generated
  article copies the line layout of a random real one -- `` = Title = `` header, blank `` `` lines,
  `` = = Section = = `` headings and paragraph lines with their word counts -- in the wikitext format.
* **Words** come from a word-bigram Markov chain fitted on the source text. Many chains are advanced at
  once with numpy (one vectorised step per word position), which is what makes 500 MB take minutes,
  not hours. Titles and headings are short chains started from capitalised words.
* **New words keep appearing**, as in real Wikipedia: each word is replaced, with probability
  ``--novel-rate`` (default 1%), by a word sampled letter by letter from a character 4-gram model of
  the source vocabulary, so the number of distinct words grows with the corpus size.
* **Rare characters**: about 3% of titles get a parenthesised run of 1-3 random CJK ideographs
  (U+4E00..U+9FFF), so a tokenizer trained on a prefix meets characters it has never seen further on
  (the chapter's "chars missing from the 50 MB slice" situation).

The output is generated in fixed blocks that do not depend on ``--bytes``, so the same seed always gives
the same stream and a smaller corpus is a byte prefix of a larger one; the stream is cut at the last
complete UTF-8 character at or before ``--bytes``. The file is written atomically.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import os
import time
from pathlib import Path

import numpy as np

from flows.mirror import SHARED_DATA
from mygpt.atomic import atomic_open

DEFAULT_SOURCE = SHARED_DATA / "wikitext2-valid.txt"
ARTICLES_PER_BLOCK = 64


class Source:
    """Everything fitted on the source text: layouts, word bigrams, a char 4-gram model for new words."""

    def __init__(self, text: str) -> None:
        lines = text.split("\n")
        # --- article layouts: ("title", n) / ("section", depth, n) / ("para", n) / ("blank",)
        self.layouts: list[list[tuple]] = []
        cur: list[tuple] | None = None
        para_tokens: list[list[str]] = []
        head_tokens: list[list[str]] = []
        for line in lines:
            s = line.strip()
            if not s:
                if cur is not None:
                    cur.append(("blank",))
                continue
            if s.startswith("= ") and s.endswith(" =") and not s.startswith("= ="):
                cur = [("title", len(s[2:-2].split()))]
                self.layouts.append(cur)
                head_tokens.append(s[2:-2].split())
            elif s.startswith("= =") and s.endswith("= ="):
                depth = 0
                while s.startswith("= "):
                    s = s[2:]
                    depth += 1
                words = s.replace(" =", " ").split()
                if cur is not None:
                    cur.append(("section", depth, max(1, len(words))))
                head_tokens.append(words)
            else:
                toks = s.split(" ")
                para_tokens.append(toks)
                if cur is not None:
                    cur.append(("para", len(toks)))
        if not self.layouts:
            raise SystemExit("source text has no ' = Title = ' lines")

        # --- word vocabulary and bigram successors (a stream over all paragraphs)
        stream = [t for toks in para_tokens for t in toks]
        vocab: dict[str, int] = {}
        ids = np.fromiter((vocab.setdefault(t, len(vocab)) for t in stream), dtype=np.int64, count=len(stream))
        self.words = np.array(list(vocab), dtype=object)
        nxt = np.roll(ids, -1)
        order = np.argsort(ids, kind="stable")
        self.succ = nxt[order]
        counts = np.bincount(ids, minlength=len(vocab))
        self.succ_start = np.concatenate([[0], np.cumsum(counts)[:-1]])
        self.succ_len = counts
        self.starts = ids[np.concatenate([[0], np.cumsum([len(t) for t in para_tokens])[:-1]])]
        caps = [i for w, i in vocab.items() if w[:1].isupper() and w.isalpha()]
        self.caps = np.array(sorted(caps), dtype=np.int64)

        # --- character 4-gram model over distinct alphabetic-ish words (for novel words)
        self.order = 3
        model: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for w in vocab:
            if len(w) < 3 or not any(c.isalpha() for c in w) or w.startswith("<"):
                continue
            padded = "^" * self.order + w + "$"
            for i in range(self.order, len(padded)):
                model[padded[i - self.order : i]][padded[i]] += 1
        self.char_model: dict[str, tuple[list[str], list[int]]] = {}
        for ctx, cnt in sorted(model.items()):
            chars = sorted(cnt)
            cum = list(np.cumsum([cnt[c] for c in chars]))
            self.char_model[ctx] = (chars, cum)

    def novel_word(self, u: np.ndarray) -> str:
        """A word sampled letter by letter (``u``: uniforms, one per letter; at most 24 letters)."""
        ctx = "^" * self.order
        out = []
        for x in u:
            chars, cum = self.char_model[ctx]
            c = chars[bisect.bisect_right(cum, x * cum[-1])]
            if c == "$":
                break
            out.append(c)
            ctx = ctx[1:] + c
        return "".join(out) or "x"

    def chains(self, rng: np.random.Generator, n_chains: int, steps: int, starts: np.ndarray) -> np.ndarray:
        """``steps`` words of ``n_chains`` bigram chains (shape ``(n_chains, steps)``)."""
        out = np.empty((steps, n_chains), dtype=np.int64)
        state = starts
        for t in range(steps):
            out[t] = state
            r = rng.random(n_chains)
            state = self.succ[self.succ_start[state] + (r * self.succ_len[state]).astype(np.int64)]
        return out.T


def generate_block(src: Source, rng: np.random.Generator, novel_rate: float) -> str:
    """One block of ``ARTICLES_PER_BLOCK`` articles."""
    layouts = [src.layouts[i] for i in rng.integers(0, len(src.layouts), ARTICLES_PER_BLOCK)]
    para_lens = [e[1] for lay in layouts for e in lay if e[0] == "para"]
    head_lens = [e[1] if e[0] == "title" else e[2] for lay in layouts for e in lay if e[0] in ("title", "section")]
    total = sum(para_lens)
    n_chains = 256
    steps = -(-total // n_chains)
    body = src.chains(rng, n_chains, steps, src.starts[rng.integers(0, len(src.starts), n_chains)]).reshape(-1)
    words = src.words[body[:total]].tolist()
    # novel words
    novel = np.nonzero(rng.random(total) < novel_rate)[0]
    letters = rng.random((len(novel), 24))
    for j, pos in enumerate(novel.tolist()):
        words[pos] = src.novel_word(letters[j])
    # headings: short chains from capitalised words
    hsteps = max(head_lens) if head_lens else 1
    heads = src.chains(rng, len(head_lens) or 1, hsteps, src.caps[rng.integers(0, len(src.caps), len(head_lens) or 1)])
    cjk = rng.random(len(layouts)) < 0.03
    cjk_chars = rng.integers(0x4E00, 0xA000, (len(layouts), 3))
    cjk_len = rng.integers(1, 4, len(layouts))

    out: list[str] = []
    wpos = 0
    hpos = 0
    for a, lay in enumerate(layouts):
        out.append(" \n")
        for e in lay:
            kind = e[0]
            if kind == "title":
                title = " ".join(src.words[heads[hpos, : e[1]]].tolist())
                hpos += 1
                if cjk[a]:
                    title += " ( " + "".join(chr(c) for c in cjk_chars[a, : cjk_len[a]]) + " )"
                out.append(f" = {title} = \n")
            elif kind == "section":
                eq = " ".join(["="] * e[1])
                out.append(f" {eq} {' '.join(src.words[heads[hpos, : e[2]]].tolist())} {eq} \n")
                hpos += 1
            elif kind == "para":
                n = e[1]
                out.append(" " + " ".join(words[wpos : wpos + n]) + " \n")
                wpos += n
            else:
                out.append(" \n")
    return "".join(out)


def make_corpus(
    out_path: str | os.PathLike,
    n_bytes: int,
    seed: int = 0,
    source: str | os.PathLike = DEFAULT_SOURCE,
    novel_rate: float = 0.01,
    log=print,
) -> int:
    """Write ``n_bytes`` (or a few less, at a UTF-8 character boundary) of corpus to ``out_path``."""
    src = Source(Path(source).read_text(encoding="utf-8"))
    rng = np.random.Generator(np.random.PCG64(seed))
    written = 0
    t0 = time.time()
    next_report = 50_000_000
    with atomic_open(out_path, "wb") as f:
        while written < n_bytes:
            data = generate_block(src, rng, novel_rate).encode("utf-8")
            room = n_bytes - written
            if len(data) > room:
                cut = room
                while cut > 0 and (data[cut] & 0xC0) == 0x80:  # do not split a character
                    cut -= 1
                data = data[:cut]
            f.write(data)
            written += len(data)
            if len(data) < room and written >= next_report:
                log(f"  {written / 1e6:.0f} MB ({time.time() - t0:.0f}s)")
                next_report += 50_000_000
            if len(data) == 0:
                break
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, required=True, help="size of the corpus in bytes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--source", default=str(DEFAULT_SOURCE))
    ap.add_argument("--novel-rate", type=float, default=0.01)
    args = ap.parse_args(argv)
    if args.bytes < 0:
        ap.error("--bytes must be >= 0")
    t0 = time.time()
    n = make_corpus(args.out, args.bytes, args.seed, args.source, args.novel_rate)
    print(f"wrote {n:,} bytes to {args.out} in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
