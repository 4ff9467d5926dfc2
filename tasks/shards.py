"""Stage ``shards`` (task ``encode_shards``): every corpus split → Parquet token shards.

Layout and schema: :data:`tasks.shard_format.SCHEMA` (also written into each version as ``README.md``);
``shards.json`` lists every shard with its token count and first/last token offsets.

Settings: ``shard_tokens`` and ``unk_policy`` (they change the files). The worker count and the chunk size
only change how fast the same bytes appear (``iter_encode_file`` gives identical ids for any of them), so
they are run options (``RunOptions.workers``, ``RunOptions.chunk_bytes``): changing them reuses the version.

Parallelism: ``mygpt.bpe_encode.iter_encode_file`` encodes chunks of ``chunk_bytes`` in ``workers``
processes and yields them in file order; ids are copied into one shard buffer of ``shard_tokens`` ids,
which is written out (pyarrow, atomically) whenever it fills. Peak memory: the buffer plus the chunks in
flight; never the whole corpus.

Crash resume: after each shard is written, ``work/progress.json`` records for it: size, sha256, token count,
and where the next shard starts -- the chunk index and how many of that chunk's ids are already in shards --
plus the encode stats of the chunks before that chunk. A rerun of the same version checks every recorded
shard (exists, size, sha256, token count in the Parquet footer), deletes shards it cannot vouch for, and
restarts ``iter_encode_file`` at the recorded chunk (``start_chunk``), dropping the ids already written. So
a crash costs at most one shard plus one chunk of re-encoding, and the result is byte-identical to an
uninterrupted run.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Literal

import numpy as np

from pydantic import Field

from mygpt.atomic import atomic_write_text
from mygpt.bpe import BPETokenizer
from mygpt.bpe_encode import EncodeStats, iter_encode_file
from mygpt.errors import UserError
from tasks import shard_format
from tasks.corpus import SPLIT_FILES, SPLITS
from tasks.settings import RunOptions, Settings
from tasks.stage import BuildContext, Stage, StageRef, stage_task
from tasks.store import sha256_file

DEFAULT_CHUNK_BYTES = 8 << 20
PROGRESS_FILE = "progress.json"
RECORD_FORMAT = 1


class ShardsSettings(Settings):
    """How the corpus becomes token shards."""

    shard_tokens: int = Field(10_000_000, ge=1, description="tokens per Parquet shard (10000000 is ~20 MB of "
                                                            "uint16, ~20 shards for wikitext-103 at 1024 merges)")
    unk_policy: Literal["skip", "error"] = Field(
        "skip", description="characters outside the tokenizer's alphabet: skip them (the chapter) or stop with an "
                            "error naming them")


def default_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


# ---- progress record ---------------------------------------------------------------------------------
def _load_record(path: Path, expect: dict) -> dict:
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        rec = None
    if not isinstance(rec, dict) or any(rec.get(k) != v for k, v in expect.items()):
        rec = {**expect, "splits": {}}
    return rec


def _kept_shards(out: Path, split: str, srec: dict, log) -> list[dict]:
    """The recorded shards of ``split`` that are intact; deletes the others and any unrecorded ones."""
    good: list[dict] = []
    for sh in srec.get("shards", []):
        path = out / shard_format.shard_name(split, sh["index"])
        try:
            ok = (sh["index"] == len(good) and path.stat().st_size == sh["size"]
                  and shard_format.shard_tokens_in(path) == sh["tokens"] and sha256_file(path) == sh["sha256"])
        except Exception:  # missing or unreadable
            ok = False
        if not ok:
            log.warning("shards: %s does not match its progress record; re-encoding from there", path.name)
            break
        good.append(sh)
    for path in out.glob(f"{split}-*.parquet"):
        try:
            idx = int(path.stem.split("-")[1])
        except (IndexError, ValueError):
            continue
        if idx >= len(good):
            path.unlink()
    if len(good) != len(srec.get("shards", [])):
        srec["done"] = False
    srec["shards"] = good
    return good


# ---- build -------------------------------------------------------------------------------------------
def build_shards(ctx: BuildContext, settings: ShardsSettings, corpus: Path, tokenizer: Path) -> dict:
    """Encode every split chunk by chunk into shards of ``shard_tokens`` ids, resumable shard by shard."""
    shard_tokens, unk_policy = settings.shard_tokens, settings.unk_policy
    tok = BPETokenizer.load(tokenizer / "tokenizer.json")
    dtype = np.dtype(tok.id_dtype)
    workers = ctx.run.workers or default_workers()
    chunk_bytes = ctx.run.chunk_bytes or DEFAULT_CHUNK_BYTES
    files = {s: corpus / SPLIT_FILES[s] for s in SPLITS}
    total_bytes = sum(p.stat().st_size for p in files.values()) or 1

    rec_path = ctx.work / PROGRESS_FILE
    rec = _load_record(rec_path, {"format": RECORD_FORMAT, "chunk_bytes": chunk_bytes, "dtype": dtype.name,
                                  "shard_tokens": shard_tokens})
    if ctx.resumed and rec["splits"]:
        ctx.log.info("shards: resuming from %s", rec_path)

    def save_record() -> None:
        atomic_write_text(rec_path, json.dumps(rec, ensure_ascii=False))

    t_start = time.monotonic()
    bytes_encoded = 0
    bytes_before = 0
    split_metrics: dict[str, dict] = {}
    shard_list: list[dict] = []
    for split in SPLITS:
        path = files[split]
        size = path.stat().st_size
        srec = rec["splits"].setdefault(split, {"shards": [], "done": False, "stats": None})
        kept = _kept_shards(ctx.out, split, srec, ctx.log)
        t0 = time.monotonic()
        split_bytes = 0
        if not srec["done"]:
            if kept:
                last = kept[-1]
                start_chunk, skip = last["next_chunk"], last["skip"]
                stats = EncodeStats(**last["stats"])
                index, offset = last["index"] + 1, last["first_token"] + last["tokens"]
                ctx.log.info("shards: %s: keeping %d shard(s), resuming at chunk %d", split, len(kept), start_chunk)
            else:
                start_chunk, skip, stats, index, offset = 0, 0, EncodeStats(), 0, 0
            buf = np.empty(shard_tokens, dtype=dtype)
            fill = 0

            def emit(ids: np.ndarray, next_chunk, next_skip, stats_before: EncodeStats) -> None:
                nonlocal index, offset
                spath = ctx.out / shard_format.shard_name(split, index)
                nbytes = shard_format.write_shard(spath, ids)
                srec["shards"].append({
                    "index": index, "tokens": int(ids.size), "first_token": offset, "size": nbytes,
                    "sha256": sha256_file(spath), "next_chunk": next_chunk, "skip": next_skip,
                    "stats": stats_before.to_dict()})
                save_record()
                index += 1
                offset += int(ids.size)

            use_workers = max(1, min(workers, math.ceil(max(size - (start_chunk * chunk_bytes), 1) / chunk_bytes)))
            try:
                for idx, bstart, bend, ids, st in iter_encode_file(
                        tok, path, chunk_bytes=chunk_bytes, workers=use_workers, unk_policy=unk_policy,
                        start_chunk=start_chunk):
                    pos = 0
                    if idx == start_chunk and skip:
                        if skip > ids.size:
                            raise RuntimeError(f"progress record says {skip} ids of chunk {idx} of {path.name} are "
                                               f"written, but the chunk has {ids.size}; rerun with force")
                        pos = skip
                    n = ids.size
                    while pos < n:
                        take = min(shard_tokens - fill, n - pos)
                        buf[fill:fill + take] = ids[pos:pos + take]
                        fill += take
                        pos += take
                        if fill == shard_tokens:
                            emit(buf, idx, pos, stats)
                            fill = 0
                    stats.merge(st)
                    split_bytes += bend - bstart
                    ctx.progress(bytes_before + bend, total_bytes, f"{split}: {bend / max(size, 1):.0%} of {path.name}")
            except UserError as e:
                raise UserError(f"encoding {path.name}: {e}") from None
            if fill or index == 0:
                emit(buf[:fill], None, None, stats)
            srec["done"] = True
            srec["stats"] = stats.to_dict()
            save_record()
        stats = EncodeStats(**srec["stats"])
        seconds = time.monotonic() - t0
        bytes_encoded += split_bytes
        bytes_before += size
        shards = srec["shards"]
        for sh in shards:
            shard_list.append({
                "file": shard_format.shard_name(split, sh["index"]), "split": split, "index": sh["index"],
                "tokens": sh["tokens"], "first_token": sh["first_token"],
                "last_token": sh["first_token"] + sh["tokens"] - 1 if sh["tokens"] else None})
        top = sorted(stats.skipped_chars.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
        split_metrics[split] = {
            "text_bytes": size, "chars": stats.chars, "tokens": stats.tokens, "shards": len(shards),
            "skipped_positions": stats.skipped_positions, "skipped_distinct": len(stats.skipped_chars),
            "skipped_top": [{"char": c, "codepoint": f"U+{ord(c):04X}", "count": k} for c, k in top],
            "encoded_bytes_this_run": split_bytes, "seconds": round(seconds, 3),
            "mb_per_s": round(split_bytes / 1e6 / seconds, 2) if split_bytes and seconds > 0 else None,
        }
        if sum(sh["tokens"] for sh in shards) != stats.tokens:  # pragma: no cover - internal consistency
            raise RuntimeError(f"{split}: shards hold {sum(sh['tokens'] for sh in shards)} tokens, stats say {stats.tokens}")

    seconds = time.monotonic() - t_start
    index = {
        "format": 1, "column": shard_format.COLUMN, "dtype": dtype.name, "vocab_size": tok.vocab_size,
        "shard_tokens": shard_tokens, "unk_policy": unk_policy,
        "splits": {s: {"tokens": split_metrics[s]["tokens"],
                       "shards": [{k: v for k, v in sh.items() if k != "split"} for sh in shard_list
                                  if sh["split"] == s]} for s in SPLITS},
    }
    atomic_write_text(ctx.out / "shards.json", json.dumps(index, indent=1) + "\n")
    atomic_write_text(ctx.out / "README.md", _readme(index, split_metrics))
    ctx.progress(1, 1, "done", force=True)
    return {
        "dtype": dtype.name, "vocab_size": tok.vocab_size, "shard_tokens": shard_tokens, "unk_policy": unk_policy,
        "workers": workers, "chunk_bytes": chunk_bytes,
        "tokens": sum(m["tokens"] for m in split_metrics.values()),
        "splits": split_metrics,
        "shards": shard_list,
        "encoded_bytes_this_run": bytes_encoded,
        "seconds": round(seconds, 3),
        "mb_per_s": round(bytes_encoded / 1e6 / seconds, 2) if bytes_encoded and seconds > 0 else None,
    }


def _readme(index: dict, split_metrics: dict) -> str:
    lines = [shard_format.SCHEMA, "", "This version", "------------", "",
             f"dtype {index['dtype']}, vocab_size {index['vocab_size']}, shard_tokens {index['shard_tokens']:,}, "
             f"unk_policy {index['unk_policy']}", "",
             "| split | shards | tokens | characters | skipped characters (positions / distinct) |",
             "|---|---:|---:|---:|---:|"]
    for s in SPLITS:
        m = split_metrics[s]
        lines.append(f"| {s} | {m['shards']} | {m['tokens']:,} | {m['chars']:,} | "
                     f"{m['skipped_positions']:,} / {m['skipped_distinct']:,} |")
    return "\n".join(lines) + "\n"


def report(manifest: dict) -> str:
    m = manifest.get("metrics", {})
    lines = [
        f"# shards `{manifest['version']}`",
        "",
        f"{m.get('tokens', 0):,} tokens ({m.get('dtype')}, vocab {m.get('vocab_size')}), "
        f"{len(m.get('shards', []))} Parquet shards of up to {m.get('shard_tokens', 0):,} tokens; "
        f"encoded at {m.get('mb_per_s')} MB/s with {m.get('workers')} worker(s) in {m.get('seconds', 0):.1f} s.",
        "",
        "| split | shards | tokens | chars | chars/token | skipped positions | skipped distinct | MB/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in SPLITS:
        sm = m.get("splits", {}).get(s)
        if not sm:
            continue
        cpt = f"{sm['chars'] / sm['tokens']:.2f}" if sm["tokens"] else "-"
        lines.append(f"| {s} | {sm['shards']} | {sm['tokens']:,} | {sm['chars']:,} | {cpt} | "
                     f"{sm['skipped_positions']:,} | {sm['skipped_distinct']:,} | {sm['mb_per_s'] or '-'} |")
    return "\n".join(lines) + "\n"


STAGE = Stage(name="shards", code_version="2", report=report, inputs=("corpus", "tokenizer"))


@stage_task(STAGE)
def encode_shards(corpus: StageRef, tokenizer: StageRef, settings: ShardsSettings = ShardsSettings(),
                  run: RunOptions = RunOptions()) -> StageRef:
    """Encode every split of a corpus version with a tokenizer version into Parquet shards (or reuse them).

    ``run.workers`` (default: CPU count, at most 8) and ``run.chunk_bytes`` change the speed, not the files."""
    return STAGE.run(build_shards, settings, run, corpus=corpus, tokenizer=tokenizer)
