"""Stage ``tokenizer`` (task ``train_tokenizer``): a BPE trained on a slice of the corpus, of one of two kinds.

The slice is the first ``bpe_train_bytes`` of ``wiki.train.txt`` cut back to a character boundary.
``kind=chapter`` (the default): the chapter's word-level BPE; the slice's words are counted on Dask (the shards
stage's chunks), then the merges learnt from the table -- exactly ``BPETokenizer.from_corpus(slice, num_merges)``'s
(docs/STAGES.md). ``kind=byte``: the byte-level BPE of GPT-2 (``pattern`` gpt2 or gpt4), exactly
``ByteBPETokenizer.train(slice, 256 + num_merges + 1)`` with ``<|endoftext|>`` as its one special token.
``kind=pretrained``: no training, an existing byte-level BPE ``tokenizer.json`` from ``source``, versioned by its
sha256 (:mod:`tasks.sources.pretrained_tokenizer`); the later stages treat it as the byte kind.
Publishes ``tokenizer.json`` (:func:`load_tokenizer` reads any kind) and ``stats.json``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from mygpt.errors import UserError
from mygpt.tokenizers.bpe import BPETokenizer
from mygpt.tokenizers.bpe_chunks import chunk_bounds
from mygpt.tokenizers.bpe_train import add_counts, gc_paused, train_and_count_tokens
from mygpt.tokenizers.byte_bpe import DEFAULT_SPECIALS, ByteBPETokenizer
from mygpt.tokenizers.char_tokenizer import CharTokenizer
from mygpt.tokenizers.files import load_tokenizer_file
from tasks.core.report import Markdown, md_code, md_text, number, summary_table
from tasks.core.settings import Settings
from tasks.core.stage import BuildContext, Stage, stage_task
from tasks.corpora.splits import TRAIN, corpus_splits
from tasks.dask import work as dask_work
from tasks.sources.pretrained_tokenizer import (
    FIRST_MERGES,
    build_pretrained,
    check_source,
    pretrained_source,
    write_byte_level,
    write_stats,
)


class TokenizerSettings(Settings):
    """Which BPE (the chapter's word-level one, the byte-level one, or a byte-level one made elsewhere), how many
    merges, from how much text."""

    URL_FIELDS = frozenset({"source"})
    kind: Literal["chapter", "byte", "pretrained"] = Field(
        "chapter",
        description="chapter: the chapter's word-level BPE; byte: GPT-2's byte-level BPE (any text encodes, "
        "<|endoftext|> after each article in the shards); pretrained: an existing byte-level BPE tokenizer.json "
        "from source, not trained",
    )
    source: str | None = Field(
        None,
        description="kind=pretrained only: the byte-level BPE tokenizer.json to use, an absolute path or an "
        "http(s):// or file:// URL (allowed as corpus.source_url is)",
    )
    pattern: Literal["gpt2", "gpt4"] = Field(
        "gpt2", description="kind=byte only: the pre-tokenizer's split pattern (GPT-2's or GPT-4's cl100k)"
    )
    num_merges: int = Field(1024, ge=0, description="BPE merges to learn; the chapter uses 1024")
    bpe_train_bytes: int = Field(
        50_000_000,
        ge=0,
        description="train on the first N bytes of wiki.train.txt; the chapter uses 50000000; 0 = the whole split",
    )

    @field_validator("source")
    @classmethod
    def _check_source(cls, value: str | None) -> str | None:
        return None if value is None else check_source(value)

    @model_validator(mode="after")
    def _fields_of_the_kind(self) -> TokenizerSettings:
        if self.kind != "byte" and self.pattern != "gpt2":
            raise ValueError(
                f"pattern={self.pattern} applies only to the byte-level BPE trained here: set kind=byte too, or "
                "leave pattern out"
                + (" (a pretrained tokenizer.json has its own)" if self.kind == "pretrained" else "")
            )
        if self.kind == "pretrained" and self.source is None:
            raise ValueError(
                "kind=pretrained needs source: the path or URL of a byte-level BPE tokenizer.json "
                "(e.g. tokenizer.source=/data/tok/tokenizer.json)"
            )
        if self.kind != "pretrained" and self.source is not None:
            raise ValueError(
                f"source applies only to kind=pretrained (a tokenizer.json to use instead of training); set "
                f"kind=pretrained, or leave source out to train the {self.kind} kind"
            )
        return self

    def warnings(self) -> list[str]:
        """For ``kind=pretrained``, each field that only the trained kinds use (``num_merges``, ``pattern``) given
        anyway: it runs (the file has its own), but the value is not used. A warning, not an error (as a
        ``pattern`` other than gpt2 is): the tiny preset and a deployment's parameters give ``num_merges``, and a
        run cannot take a field out of those."""
        if self.kind != "pretrained":
            return []
        return [
            f"tokenizer.{name}={getattr(self, name)!r} is not used with kind=pretrained: the tokenizer.json at "
            f"tokenizer.source has its own {what}, and the version does not depend on it; leave {name} out, or "
            "use kind=byte to train one"
            for name, what in (("num_merges", "merges"), ("pattern", "split pattern"))
            if name in self.model_fields_set
        ]

    def version_params(self) -> dict:
        """All fields, but ``kind`` and ``pattern`` only for ``kind=byte``: the chapter's tokenizer keeps the
        version ids it had before there was a second kind. ``source`` never (the file's sha256 stands for it, as
        ``Stage.source``), nor, for ``kind=pretrained``, what it does not train by (``num_merges``, ``pattern``)."""
        params = super().version_params()
        del params["source"]
        if params["kind"] == "chapter":
            del params["kind"], params["pattern"]
        elif params["kind"] == "pretrained":
            del params["num_merges"], params["pattern"]
        return params


def source_identity(settings: TokenizerSettings, store, log) -> dict | None:
    """``Stage.source``: the identity of a pretrained kind's file
    (:func:`tasks.sources.pretrained_tokenizer.pretrained_source`), None for the trained kinds."""
    return pretrained_source(settings, store, log, STAGE)


def load_tokenizer(tokenizer_dir: str | os.PathLike[str]) -> BPETokenizer | ByteBPETokenizer:
    """The tokenizer a version of this stage holds (either kind)."""
    tok = load_tokenizer_file(Path(tokenizer_dir) / "tokenizer.json")
    assert not isinstance(tok, CharTokenizer)  # this stage never writes one
    return tok


def slice_end(path: Path, max_bytes: int) -> int:
    """How many bytes the slice has: ``max_bytes`` (0 = the whole file) cut back to a UTF-8 character boundary."""
    size = path.stat().st_size
    if not max_bytes or max_bytes >= size:
        return size
    with open(path, "rb") as f:
        f.seek(max(0, max_bytes - 4))
        tail = f.read(min(4, max_bytes))
    for back in range(1, len(tail) + 1):  # the last byte that starts a character
        lead = tail[-back]
        if lead & 0xC0 != 0x80:
            need = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
            return max_bytes if need <= back else max_bytes - back
    return max_bytes  # no character start in 4 bytes: not UTF-8, which counting the slice reports


def count_slice(ctx: BuildContext, path: Path, end: int, chunk_bytes: int, where: str | None = None) -> dict[str, int]:
    """The word counts of bytes ``0..end`` of ``path``, chunk by chunk on Dask (read from ``where``), added up
    here in file order."""
    counts: dict[str, int] = {}
    where = where or str(path)
    with dask_work.dask_client(ctx.run, ctx.log, needs=[where]) as client:
        workers = len(client.scheduler_info()["workers"])
        chunks = dask_work.ordered_results(
            client,
            dask_work.count_chunk,
            chunk_bounds(path, chunk_bytes, end=end),
            lambda b: (where, b[1], b[2]),
            window=2 * workers + 2,
            name="count-words",
        )
        with gc_paused():
            for (_, _, bend), table in chunks:
                add_counts(counts, dask_work.word_counts(table))
                ctx.progress(bend, 2 * end, f"counting words: {bend / end:.0%} of the slice")
    return counts


def need_article_index(ctx: BuildContext, corpus: Path, kind: str) -> None:
    """``UserError`` naming the command to run when the corpus version lacks the article index a byte-level
    tokenizer's shards end articles by. Why here, not in the shards stage alone: ``--only tokenizer`` over such a
    corpus would publish a tokenizer no shards can be built from."""
    splits = corpus_splits(ctx.store, ctx.inputs["corpus"]).values()
    missing = [
        f.articles or f"wiki.{f.split}.articles.npy"
        for f in splits
        if not (f.articles and (corpus / f.articles).is_file())
    ]
    if missing:
        raise UserError(
            f"tokenizer.kind={kind} needs a corpus version with the article index (its shards end each article "
            f"with <|endoftext|>), and corpus/{ctx.inputs['corpus']['version']} has none ({missing[0]}); build one "
            f"first: wiki-pipeline run --only corpus --param corpus.article_index=true (or run the whole pipeline "
            f"with tokenizer.kind={kind}), then rerun this"
        )


def build_tokenizer(ctx: BuildContext, settings: TokenizerSettings, corpus: Path) -> dict:
    """Count the slice's words (on Dask), train the BPE, write tokenizer.json + stats.json."""
    train_path = corpus / corpus_splits(ctx.store, ctx.inputs["corpus"])[TRAIN].text
    used = slice_end(train_path, settings.bpe_train_bytes)
    if not used:
        raise UserError(
            f"{train_path} is empty, so there is nothing to train BPE on; check the corpus stage's source_url"
        )
    if settings.kind != "chapter":
        need_article_index(ctx, corpus, settings.kind)
    if settings.kind == "byte":
        return build_byte_tokenizer(ctx, settings, train_path, used)
    if settings.kind == "pretrained":
        return build_pretrained(ctx, settings, train_path, used)
    ctx.log.info("tokenizer: counting the words of %s bytes of %s", f"{used:,}", train_path.name)
    t0 = time.monotonic()
    try:
        where = ctx.worker_path("corpus", train_path.name)
        counts = count_slice(ctx, train_path, used, dask_work.chunk_bytes(ctx.run), where)
    except dask_work.ClusterError:
        raise  # the cluster's, not the corpus's: its message says what to do
    except UserError as e:
        raise UserError(f"{e}; rebuild the corpus stage") from None
    count_seconds = time.monotonic() - t0
    chars = sum(len(w) * n for w, n in counts.items())
    ctx.log.info(
        "tokenizer: %s distinct words, %s chars; training %d merges",
        f"{len(counts):,}",
        f"{chars:,}",
        settings.num_merges,
    )
    ctx.progress(1, 2, "training", force=True)
    t1 = time.monotonic()
    with gc_paused():
        alphabet, merges, tokens = train_and_count_tokens(counts, settings.num_merges)
        tok = BPETokenizer(alphabet, merges)
        if tokens is None:  # two merges make one string: encode each distinct word once instead
            tokens = tok.count_tokens(counts)
    train_seconds = time.monotonic() - t1
    del counts
    tok.save(ctx.out / "tokenizer.json")
    stats = {
        "vocab_size": tok.vocab_size,
        "alphabet_size": len(tok.chars),
        "num_merges": len(tok.merges),
        "num_merges_requested": settings.num_merges,
        "first_merges": [[a, b] for a, b in tok.merges[:FIRST_MERGES]],
        "train_bytes": used,
        "train_chars": chars,
        "train_tokens": tokens,
        "chars_per_token": round(chars / tokens, 4) if tokens else None,
        "count_seconds": round(count_seconds, 3),
        "train_seconds": round(train_seconds, 3),
    }
    write_stats(ctx.out, stats)
    ctx.progress(2, 2, "done", force=True)
    return stats


def build_byte_tokenizer(ctx: BuildContext, settings: TokenizerSettings, train_path: Path, used: int) -> dict:
    """Train the byte-level BPE on bytes ``0..used`` of ``train_path``; write tokenizer.json + stats.json."""
    with open(train_path, "rb") as f:
        raw = f.read(used)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(
            f"{train_path} is not valid UTF-8 (invalid byte at offset {e.start:,}); rebuild the corpus stage"
        ) from None
    del raw
    ctx.log.info("tokenizer: training %d byte-level merges on %s bytes", settings.num_merges, f"{used:,}")
    t0 = time.monotonic()
    vocab_size = 256 + settings.num_merges + len(DEFAULT_SPECIALS)
    workers = ctx.run.workers or 1
    tok = ByteBPETokenizer.train(text, vocab_size, DEFAULT_SPECIALS, settings.pattern, workers=workers)
    train_seconds = time.monotonic() - t0
    ctx.progress(1, 2, "counting the slice's tokens", force=True)
    head = {"kind": "byte", "num_merges_requested": settings.num_merges}
    return write_byte_level(ctx, tok, text, used, head, train_seconds)


def kind_line(p: dict, m: dict) -> Markdown:
    """The report's kind row: chapter, byte-level with its split, or pretrained with where from and its sha256."""
    if p.get("kind") == "pretrained":
        renumbered = " (ids renumbered to mygpt's layout, same tokens)" if m.get("renumbered") else ""
        return Markdown(
            f"pretrained byte-level BPE, {md_text(str(m.get('pattern')))} split, from {md_code(m.get('source'))} "
            f"(sha256 {md_code(m.get('source_sha256'))}){md_text(renumbered)}"
        )
    return md_text(f"byte-level BPE, {p.get('pattern')} split" if p.get("kind") == "byte" else "chapter")


def report(manifest: dict) -> str:
    m = manifest.get("metrics", {})
    p = manifest.get("settings", {})
    lines = [
        f"# tokenizer {md_code(manifest['version'])}",
        "",
        summary_table(
            [
                ("kind", kind_line(p, m)),
                ("merges", f"{m.get('num_merges')}" + (f" (asked {p['num_merges']})" if "num_merges" in p else "")),
                ("vocab size", f"{m.get('vocab_size'):,} (alphabet {m.get('alphabet_size'):,})"),
                (
                    "training slice",
                    f"{m.get('train_bytes', 0):,} bytes / {m.get('train_chars', 0):,} chars of wiki.train.txt",
                ),
                ("chars per token (slice)", m.get("chars_per_token")),
                ("corpus chars missing from the slice", "counted while encoding: see the wiki-shards report"),
                (
                    "time",
                    f"not trained (pretrained), encode the slice {m.get('encode_seconds', 0):.1f} s"
                    if m.get("kind") == "pretrained"
                    else f"train {m.get('train_seconds', 0):.1f} s, encode the slice {m.get('encode_seconds', 0):.1f} s"
                    if "encode_seconds" in m
                    else f"count words {m.get('count_seconds', 0):.1f} s, train {m.get('train_seconds', 0):.1f} s",
                ),
            ]
        ),
        "",
        "First merges: " + " ".join(md_code(a) + "+" + md_code(b) for a, b in m.get("first_merges", [])[:FIRST_MERGES]),
    ]
    return "\n".join(lines) + "\n"


STAGE = Stage(
    name="tokenizer",
    settings=TokenizerSettings,
    code_version="2",
    build=build_tokenizer,
    report=report,
    source=source_identity,
    alias="bpe",
    headline=lambda m: f"vocab {m.get('vocab_size', 0):,}, {number(m.get('chars_per_token'), '.2f')} chars/token",
    columns=(
        ("merges", lambda m: f"{m.get('num_merges', 0):,}"),
        ("vocab", lambda m: f"{m.get('vocab_size', 0):,}"),
        ("slice", lambda m: f"{m.get('train_bytes', 0):,} bytes"),
        ("chars/token", lambda m: number(m.get("chars_per_token"), ".3f")),
    ),
    tiny={"num_merges": 48, "bpe_train_bytes": 200_000},
)
train_tokenizer = stage_task(
    STAGE, "train_tokenizer", "Train the BPE (chapter or byte kind) on a corpus version (or reuse it)."
)
