"""Stage ``shards`` (task ``encode_shards``): every corpus split -> Parquet token shards (``shard_format``).

Chunks are encoded on Dask and written in file order into shards of ``shard_tokens`` ids; the same pass counts
the characters outside the tokenizer's alphabet. ``work/progress.json`` records each shard, so a crash costs at
most a shard plus a chunk and the result is byte-identical (docs/STAGES.md). A byte-level tokenizer's shards end
each article (from the corpus's article index) with ``<|endoftext|>`` (docs/STAGES.md, "The byte-level kind").
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, field_validator

from mygpt.atomic import atomic_write_text, sha256_file
from mygpt.errors import UserError
from mygpt.tokenizers.bpe_chunks import chunk_bounds, safe_cut_re
from mygpt.tokenizers.bpe_word_encoder import EncodeStats
from mygpt.tokenizers.byte_bpe import ByteBPETokenizer
from tasks.core import shard_format
from tasks.core.report import md_code, md_row, md_text
from tasks.core.settings import Settings
from tasks.core.stage import BuildContext, Stage, stage_task
from tasks.corpora.splits import SplitFiles, corpus_splits
from tasks.dask import work as dask_work
from tasks.sources.pretrained_tokenizer import check_specials_absent
from tasks.tokenizer import load_tokenizer

PROGRESS_FILE = "progress.json"
RECORD_FORMAT = 1
MAX_SHARD_TOKENS = 1_000_000_000  # a shard is built in memory: 2 GB of uint16 ids at this size
MISSING_TOP = 20


class ShardsSettings(Settings):
    """How the corpus becomes token shards."""

    shard_tokens: int = Field(
        10_000_000,
        ge=1,
        description="tokens per Parquet shard (10000000 is ~20 MB of "
        "uint16, ~20 shards for wikitext-103 at 1024 merges)",
    )
    unk_policy: Literal["skip", "error"] = Field(
        "skip",
        description="characters outside the tokenizer's alphabet: skip them (the chapter) or stop with an "
        "error naming them",
    )

    @field_validator("shard_tokens")
    @classmethod
    def _fits_in_memory(cls, value: int) -> int:
        if value > MAX_SHARD_TOKENS:
            raise ValueError(
                f"shard_tokens must be at most {MAX_SHARD_TOKENS:,} (a shard is built in memory, "
                f"{value * 2 / 2**40:.1f} TiB of uint16 ids at this size), got {value}; the default "
                "10000000 makes ~20 MB shards"
            )
        return value


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
            ok = (
                sh["index"] == len(good)
                and path.stat().st_size == sh["size"]
                and shard_format.shard_tokens_in(path) == sh["tokens"]
                and sha256_file(path) == sh["sha256"]
            )
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
def encoded_chunks(
    client,
    tokenizer_key: str,
    tokenizer_json: str,
    path: Path,
    where: str,
    chunk_bytes: int,
    unk_policy: str,
    start_chunk: int,
    window: int,
    name: str,
    cut_re=None,
    ends: np.ndarray | None = None,
):
    """``(chunk_index, byte_start, byte_end, ids, stats)`` for the chunks of ``path`` from ``start_chunk`` on, in
    order, each encoded by a worker that reads its range from ``where`` (a path or an ``s3://`` URL); ``ends``
    (sorted file offsets): where ``<|endoftext|>`` follows a document, each chunk told the ones in its range."""
    bounds = (b for b in chunk_bounds(path, chunk_bytes, cut_re=cut_re or safe_cut_re(None)) if b[0] >= start_chunk)

    def within(a: int, b: int) -> tuple[int, ...]:
        if ends is None:
            return ()
        first = np.searchsorted(ends, a, "left" if a == 0 else "right")  # an end at 0: an empty first article
        return tuple(ends[first : np.searchsorted(ends, b, "right")].tolist())

    work = dask_work.ordered_results(
        client,
        dask_work.encode_range,
        bounds,
        lambda b: (tokenizer_key, tokenizer_json, where, b[1], b[2], unk_policy, within(b[1], b[2])),
        window=window,
        name=name,
    )
    for (idx, bstart, bend), (ids, stats) in work:
        yield idx, bstart, bend, ids, EncodeStats(**stats)


def missing_summary(stats: list[EncodeStats]) -> dict:
    """The characters outside the tokenizer's alphabet over all splits (the chapter's ``wikipedia.txt``): the chapter's
    "missing from the slice" analysis."""
    counts: dict[str, int] = {}
    for st in stats:
        for c, n in st.skipped_chars.items():
            counts[c] = counts.get(c, 0) + n
    chars = sum(st.chars for st in stats)
    positions = sum(counts.values())
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:MISSING_TOP]
    return {
        "corpus_chars": chars,
        "missing_distinct": len(counts),
        "missing_positions": positions,
        "missing_fraction": positions / chars if chars else 0.0,
        "missing_top": [{"char": c, "codepoint": f"U+{ord(c):04X}", "count": n} for c, n in top],
    }


def document_ends(corpus: Path, split: SplitFiles, size: int, inputs: dict) -> np.ndarray:
    """Where ``<|endoftext|>`` follows in ``split`` for a byte-level tokenizer (from the corpus's article index):
    at the end of every article, an empty one too (an offset twice: two in a row), and of any text before the
    first; ``UserError`` when the corpus version has none."""
    path = corpus / (split.articles or f"wiki.{split.split}.articles.npy")
    if not split.articles or not path.is_file():
        raise UserError(
            f"the tokenizer version {inputs['tokenizer']['version']} is byte-level, whose shards end each article "
            f"with <|endoftext|>, but corpus version {inputs['corpus']['version']} has no article index ({path.name}); "
            "build the corpus with corpus.article_index=true (the pipeline turns it on itself for tokenizer.kind=byte "
            "and tokenizer.kind=pretrained)"
        )
    starts = np.load(path).astype(np.int64)
    if not size:
        return np.zeros(0, np.int64)
    return np.append(starts[1:] if starts.size and starts[0] == 0 else starts, size)


def build_shards(ctx: BuildContext, settings: ShardsSettings, corpus: Path, tokenizer: Path) -> dict:
    """Encode every split chunk by chunk (on Dask) into shards of ``shard_tokens`` ids, resumable shard by shard."""
    shard_tokens, unk_policy = settings.shard_tokens, settings.unk_policy
    tok = load_tokenizer(tokenizer)
    tok_ref = ctx.inputs["tokenizer"]
    tokenizer_key = f"{tok_ref['version']}.{tok_ref['build_id']}"
    dtype = shard_format.dtype_for_vocab(tok.vocab_size)
    chunk_bytes = dask_work.chunk_bytes(ctx.run)
    splits = corpus_splits(ctx.store, ctx.inputs["corpus"])  # the corpus manifest's splits, in its order
    files = {s: corpus / f.text for s, f in splits.items()}  # this process cuts the chunks from these
    urls = {s: ctx.worker_path("corpus", f.text) for s, f in splits.items()}  # the workers read their ranges here
    total_bytes = sum(p.stat().st_size for p in files.values()) or 1
    if isinstance(tok, ByteBPETokenizer):  # a special in the text: the export would cut it, the shards would not
        check_specials_absent(tok.specials, files, tokenizer, tok_ref["version"])

    rec_path = ctx.work / PROGRESS_FILE
    rec = _load_record(
        rec_path,
        {"format": RECORD_FORMAT, "chunk_bytes": chunk_bytes, "dtype": dtype.name, "shard_tokens": shard_tokens},
    )
    if ctx.resumed and rec["splits"]:
        ctx.log.info("shards: resuming from %s", rec_path)

    def save_record() -> None:
        atomic_write_text(rec_path, json.dumps(rec, ensure_ascii=False))

    t_start = time.monotonic()
    bytes_encoded = 0
    bytes_before = 0
    split_metrics: dict[str, dict] = {}
    split_stats: list[EncodeStats] = []
    shard_list: list[dict] = []
    workers = None
    with contextlib.ExitStack() as cluster:
        client = None
        for split in splits:
            path = files[split]
            size = path.stat().st_size
            srec = rec["splits"].setdefault(split, {"shards": [], "done": False, "stats": None})
            kept = _kept_shards(ctx.out, split, srec, ctx.log)
            if kept and not srec["done"] and kept[-1]["next_chunk"] is None:
                # the split's last shard is recorded (its stats are the split's); only the done mark was lost
                srec["done"], srec["stats"] = True, kept[-1]["stats"]
                save_record()
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
                    spath = ctx.out / shard_format.shard_name(split, index)  # noqa: B023 (called in this split's loop)
                    written = shard_format.write_shard(spath, ids)
                    ctx.build.hashed(spath, written.size, written.sha256)  # publish need not read it back
                    srec["shards"].append(  # noqa: B023
                        {
                            "index": index,
                            "tokens": int(ids.size),
                            "first_token": offset,
                            "size": written.size,
                            "sha256": written.sha256,
                            "next_chunk": next_chunk,
                            "skip": next_skip,
                            "stats": stats_before.to_dict(),
                        }
                    )
                    save_record()
                    ctx.save(spath, rec_path)  # an object-store root: a rerun on another machine resumes here
                    index += 1
                    offset += int(ids.size)

                if client is None:
                    client = cluster.enter_context(dask_work.dask_client(ctx.run, ctx.log, needs=list(urls.values())))
                    workers = len(client.scheduler_info()["workers"])
                    # the tokenizer travels with each task as one opaque string (~20 KB): a worker that dies takes
                    # nothing with it that cannot be sent again (scattered data would be lost with it)
                    state = json.dumps({"kind": tok.kind, "state": tok.state()}, ensure_ascii=False)
                assert workers is not None  # counted when the client started
                try:
                    for idx, bstart, bend, ids, st in encoded_chunks(
                        client,
                        tokenizer_key,
                        state,
                        path,
                        urls[split],
                        chunk_bytes,
                        unk_policy,
                        start_chunk,
                        window=2 * workers + 2,
                        name=f"encode-{split}",
                        cut_re=safe_cut_re(tok),
                        ends=document_ends(corpus, splits[split], size, ctx.inputs) if tok.kind == "byte" else None,
                    ):
                        pos = 0
                        if idx == start_chunk and skip:
                            if skip > ids.size:
                                raise RuntimeError(
                                    f"progress record says {skip} ids of chunk {idx} of {path.name} "
                                    f"are written, but the chunk has {ids.size}; rerun with force"
                                )
                            pos = skip
                        n = ids.size
                        while pos < n:
                            take = min(shard_tokens - fill, n - pos)
                            buf[fill : fill + take] = ids[pos : pos + take]
                            fill += take
                            pos += take
                            if fill == shard_tokens:
                                emit(buf, idx, pos, stats)
                                fill = 0
                        stats.merge(st)
                        split_bytes += bend - bstart
                        ctx.progress(
                            bytes_before + bend, total_bytes, f"{split}: {bend / max(size, 1):.0%} of {path.name}"
                        )
                except UserError as e:
                    raise UserError(f"encoding {path.name}: {e}") from None
                if fill or index == 0:
                    emit(buf[:fill], None, None, stats)
                srec["done"] = True
                srec["stats"] = stats.to_dict()
                save_record()
                ctx.save(rec_path)
            stats = EncodeStats(**srec["stats"])
            split_stats.append(stats)
            seconds = time.monotonic() - t0
            bytes_encoded += split_bytes
            bytes_before += size
            shards = srec["shards"]
            for sh in shards:
                shard_list.append(
                    {
                        "file": shard_format.shard_name(split, sh["index"]),
                        "split": split,
                        "index": sh["index"],
                        "tokens": sh["tokens"],
                        "first_token": sh["first_token"],
                        "last_token": sh["first_token"] + sh["tokens"] - 1 if sh["tokens"] else None,
                    }
                )
            top = sorted(stats.skipped_chars.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
            split_metrics[split] = {
                "text_bytes": size,
                "chars": stats.chars,
                "tokens": stats.tokens,
                "shards": len(shards),
                "skipped_positions": stats.skipped_positions,
                "skipped_distinct": len(stats.skipped_chars),
                "skipped_top": [{"char": c, "codepoint": f"U+{ord(c):04X}", "count": k} for c, k in top],
                "encoded_bytes_this_run": split_bytes,
                "seconds": round(seconds, 3),
                "mb_per_s": round(split_bytes / 1e6 / seconds, 2) if split_bytes and seconds > 0 else None,
            }
            if sum(sh["tokens"] for sh in shards) != stats.tokens:  # pragma: no cover - internal consistency
                raise RuntimeError(
                    f"{split}: shards hold {sum(sh['tokens'] for sh in shards)} tokens, stats say {stats.tokens}"
                )

    seconds = time.monotonic() - t_start
    index = {
        "format": 1,
        "column": shard_format.COLUMN,
        "dtype": dtype.name,
        "vocab_size": tok.vocab_size,
        "shard_tokens": shard_tokens,
        "unk_policy": unk_policy,
        "splits": {
            s: {
                "tokens": split_metrics[s]["tokens"],
                "shards": [{k: v for k, v in sh.items() if k != "split"} for sh in shard_list if sh["split"] == s],
            }
            for s in splits
        },
    }
    atomic_write_text(ctx.out / "shards.json", json.dumps(index, indent=1) + "\n")
    atomic_write_text(ctx.out / "README.md", _readme(index, split_metrics))
    ctx.progress(1, 1, "done", force=True)
    return {
        "dtype": dtype.name,
        "vocab_size": tok.vocab_size,
        "shard_tokens": shard_tokens,
        "unk_policy": unk_policy,
        "workers": workers,
        "dask": ctx.run.dask_address or "local",
        "chunk_bytes": chunk_bytes,
        "tokens": sum(m["tokens"] for m in split_metrics.values()),
        "splits": split_metrics,
        "split_names": list(splits),  # the corpus's splits, in its order (a model trained on all of them reads it)
        "missing": missing_summary(split_stats),
        "shards": shard_list,
        "encoded_bytes_this_run": bytes_encoded,
        "seconds": round(seconds, 3),
        "mb_per_s": round(bytes_encoded / 1e6 / seconds, 2) if bytes_encoded and seconds > 0 else None,
    }


def _readme(index: dict, split_metrics: dict) -> str:
    lines = [
        shard_format.SCHEMA,
        "",
        "This version",
        "------------",
        "",
        f"dtype {index['dtype']}, vocab_size {index['vocab_size']}, shard_tokens {index['shard_tokens']:,}, "
        f"unk_policy {index['unk_policy']}",
        "",
        "| split | shards | tokens | characters | skipped characters (positions / distinct) |",
        "|---|---:|---:|---:|---:|",
    ]
    for s in split_metrics:
        m = split_metrics[s]
        lines.append(
            f"| {s} | {m['shards']} | {m['tokens']:,} | {m['chars']:,} | "
            f"{m['skipped_positions']:,} / {m['skipped_distinct']:,} |"
        )
    return "\n".join(lines) + "\n"


def report(manifest: dict) -> str:
    m = manifest.get("metrics", {})
    lines = [
        f"# shards {md_code(manifest['version'])}",
        "",
        md_text(
            f"{m.get('tokens', 0):,} tokens ({m.get('dtype')}, vocab {m.get('vocab_size')}), "
            f"{len(m.get('shards', []))} Parquet shards of up to {m.get('shard_tokens', 0):,} tokens; "
            f"encoded at {m.get('mb_per_s')} MB/s with {m.get('workers')} Dask worker(s) in "
            f"{m.get('seconds', 0):.1f} s."
        ),
        "",
        "| split | shards | tokens | chars | chars/token | skipped positions | skipped distinct | MB/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in m.get("splits", {}):
        sm = m.get("splits", {}).get(s)
        if not sm:
            continue
        cpt = f"{sm['chars'] / sm['tokens']:.2f}" if sm["tokens"] else "-"
        lines.append(
            md_row(
                s,
                sm["shards"],
                f"{sm['tokens']:,}",
                f"{sm['chars']:,}",
                cpt,
                f"{sm['skipped_positions']:,}",
                f"{sm['skipped_distinct']:,}",
                sm["mb_per_s"] or "-",
            )
        )
    miss = m.get("missing")
    if miss:
        lines += [
            "",
            f"Corpus characters missing from the tokenizer's alphabet (the chapter's \"missing from the "
            f'slice" analysis, over all splits): {miss["missing_distinct"]:,} distinct, '
            f"{miss['missing_positions']:,} positions of {miss['corpus_chars']:,} "
            f"({100 * miss['missing_fraction']:.4f} %)",
        ]
        if miss["missing_top"]:
            lines.append(
                "Most frequent: "
                + ", ".join(
                    f"{md_code(t['char'])} {md_text(t['codepoint'])} ×{md_text(t['count'])}"
                    for t in miss["missing_top"][:10]
                )
            )
    return "\n".join(lines) + "\n"


STAGE = Stage(
    name="shards",
    settings=ShardsSettings,
    code_version="2",
    build=build_shards,
    report=report,
    alias="encode",
    headline=lambda m: f"{m.get('tokens', 0):,} tokens",
    tiny={"shard_tokens": 50_000},
)
encode_shards = stage_task(
    STAGE, "encode_shards", "Encode every split of a corpus version into Parquet token shards (or reuse them)."
)
