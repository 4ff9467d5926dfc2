"""Stage ``tokenizer`` (task ``train_tokenizer``): the chapter's word-level BPE, trained on a slice of the corpus.

The slice is the first ``bpe_train_bytes`` bytes of ``wiki.train.txt`` (0 = the whole split), cut back to a
UTF-8 character boundary (the chapter slices 50,000,000 *characters* of ``wikipedia.txt``, which starts
with the train split; bytes make the setting independent of the text's script). Training is
``BPETokenizer.from_corpus(slice, num_merges)`` (the algorithm is stated plainly in :mod:`mygpt.bpe_reference`).

Published files::

    tokenizer.json   BPETokenizer.save format: {"chars": [...], "merges": [[a, b], ...]}
    stats.json       vocab/alphabet size, first 30 merges, chars per token on the slice, and the chapter's
                     "characters missing from the slice" analysis over the FULL wikipedia.txt (distinct
                     characters, positions, fraction), plus timings

The missing-character analysis streams ``wikipedia.txt`` in pieces (a regex for "not in the alphabet"), so
memory stays at one piece whatever the corpus size.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import time
from pathlib import Path

from pydantic import Field

from mygpt.atomic import atomic_write_text
from mygpt.bpe import BPETokenizer
from mygpt.errors import UserError
from tasks.corpus import CORPUS_FILE, SPLIT_FILES
from tasks.settings import RunOptions, Settings
from tasks.stage import BuildContext, Stage, StageRef, stage_task, summary_table

PIECE_BYTES = 8 << 20
FIRST_MERGES = 30


class TokenizerSettings(Settings):
    """The chapter's BPE: how many merges, learnt from how much text."""

    num_merges: int = Field(1024, ge=0, description="BPE merges to learn; the chapter uses 1024")
    bpe_train_bytes: int = Field(50_000_000, ge=0, description="train on the first N bytes of wiki.train.txt; the "
                                                               "chapter uses 50000000; 0 = the whole split")


def read_slice(path: Path, max_bytes: int) -> tuple[str, int]:
    """The first ``max_bytes`` bytes of a UTF-8 file (0 = all), cut back to a character boundary.

    Returns ``(text, bytes_used)``.
    """
    with open(path, "rb") as f:
        data = f.read(max_bytes) if max_bytes else f.read()
        at_eof = not max_bytes or not f.read(1)
    dec = codecs.getincrementaldecoder("utf-8")("strict")
    try:
        text = dec.decode(data, final=at_eof)
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not valid UTF-8 at byte {e.start:,}; rebuild the corpus stage") from None
    used = len(data) - len(dec.getstate()[0])
    return text, used


def missing_char_stats(path: Path, alphabet, progress=None, piece_bytes: int = PIECE_BYTES) -> dict:
    """Characters of the file at ``path`` outside ``alphabet``: distinct count, positions, total chars.

    Streams the file; a character class regex finds the outsiders at C speed.
    """
    known = "".join(f"\\U{ord(c):08x}" for c in sorted(alphabet))
    outside = re.compile(f"[^{known}]" if known else r"[\s\S]")
    counts: dict[str, int] = {}
    total_chars = 0
    size = os.path.getsize(path) or 1
    done = 0
    dec = codecs.getincrementaldecoder("utf-8")("strict")
    with open(path, "rb") as f:
        while True:
            raw = f.read(piece_bytes)
            text = dec.decode(raw, final=not raw)
            total_chars += len(text)
            for c in outside.findall(text):
                counts[c] = counts.get(c, 0) + 1
            done += len(raw)
            if progress:
                progress(done, size, "missing-character analysis")
            if not raw:
                break
    positions = sum(counts.values())
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:20]
    return {
        "corpus_chars": total_chars,
        "missing_distinct": len(counts),
        "missing_positions": positions,
        "missing_fraction": positions / total_chars if total_chars else 0.0,
        "missing_top": [{"char": c, "codepoint": f"U+{ord(c):04X}", "count": n} for c, n in top],
    }


def build_tokenizer(ctx: BuildContext, settings: TokenizerSettings, corpus: Path) -> dict:
    """Train the BPE on the slice and write tokenizer.json + stats.json (the chapter's analyses included)."""
    train_path = corpus / SPLIT_FILES["train"]
    text, used = read_slice(train_path, settings.bpe_train_bytes)
    if not text:
        raise UserError(f"{train_path} is empty, so there is nothing to train BPE on; check the corpus stage's "
                        "source_url")
    ctx.log.info("tokenizer: training %d merges on %s bytes (%s chars) of %s", settings.num_merges, f"{used:,}",
                 f"{len(text):,}", train_path.name)
    ctx.progress(0, 3, "training", force=True)
    t0 = time.monotonic()
    tok = BPETokenizer.from_corpus(text, settings.num_merges)
    train_seconds = time.monotonic() - t0
    ctx.progress(1, 3, "encoding the slice", force=True)
    t1 = time.monotonic()
    ids, enc = tok.encode_corpus(text, return_stats=True)
    encode_seconds = time.monotonic() - t1
    del text
    tok.save(ctx.out / "tokenizer.json")
    ctx.progress(2, 3, "missing-character analysis", force=True)
    t2 = time.monotonic()
    missing = missing_char_stats(corpus / CORPUS_FILE, tok.chars,
                                 progress=lambda d, t, m: ctx.progress(2 + d / t, 3, m))
    stats = {
        "vocab_size": tok.vocab_size,
        "alphabet_size": len(tok.chars),
        "num_merges": len(tok.merges),
        "num_merges_requested": settings.num_merges,
        "first_merges": [[a, b] for a, b in tok.merges[:FIRST_MERGES]],
        "train_bytes": used,
        "train_chars": enc.chars,
        "train_tokens": int(ids.size),
        "chars_per_token": round(enc.chars / ids.size, 4) if ids.size else None,
        "train_seconds": round(train_seconds, 3),
        "encode_seconds": round(encode_seconds, 3),
        "analysis_seconds": round(time.monotonic() - t2, 3),
        **missing,
    }
    atomic_write_text(ctx.out / "stats.json", json.dumps(stats, indent=1, ensure_ascii=False) + "\n")
    ctx.progress(3, 3, "done", force=True)
    return stats


def _show(s: str) -> str:
    return "`" + s.replace("\n", "\\n").replace("\t", "\\t").replace("`", "'").replace("|", "\\|") + "`"


def report(manifest: dict) -> str:
    m = manifest.get("metrics", {})
    p = manifest.get("settings", {})
    lines = [
        f"# tokenizer `{manifest['version']}`",
        "",
        summary_table([
            ("merges", f"{m.get('num_merges')} (asked {p.get('num_merges')})"),
            ("vocab size", f"{m.get('vocab_size'):,} (alphabet {m.get('alphabet_size'):,})"),
            ("training slice", f"{m.get('train_bytes', 0):,} bytes / {m.get('train_chars', 0):,} chars of wiki.train.txt"),
            ("chars per token (slice)", m.get("chars_per_token")),
            ("corpus chars missing from the slice", f"{m.get('missing_distinct', 0):,} distinct, "
             f"{m.get('missing_positions', 0):,} positions of {m.get('corpus_chars', 0):,} "
             f"({100 * m.get('missing_fraction', 0):.4f} %)"),
            ("time", f"train {m.get('train_seconds', 0):.1f} s, encode slice {m.get('encode_seconds', 0):.1f} s, "
             f"analysis {m.get('analysis_seconds', 0):.1f} s"),
        ]),
        "",
        "First merges: " + " ".join(_show(a) + "+" + _show(b) for a, b in m.get("first_merges", [])[:FIRST_MERGES]),
    ]
    top = m.get("missing_top") or []
    if top:
        lines += ["", "Most frequent missing characters: " +
                  ", ".join(f"{_show(t['char'])} {t['codepoint']} ×{t['count']}" for t in top[:10])]
    return "\n".join(lines) + "\n"


STAGE = Stage(name="tokenizer", code_version="2", report=report, inputs=("corpus",))


@stage_task(STAGE)
def train_tokenizer(corpus: StageRef, settings: TokenizerSettings = TokenizerSettings(),
                    run: RunOptions = RunOptions()) -> StageRef:
    """Train the chapter's word-level BPE on a corpus version (or reuse that version)."""
    return STAGE.run(build_tokenizer, settings, run, corpus=corpus)
