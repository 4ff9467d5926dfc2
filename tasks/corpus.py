"""Stage ``corpus`` (task ``download_corpus``): a corpus source (``corpus.kind``) -> plain-text splits.

A version holds ``wiki.{split}.txt`` for each split the manifest lists (``split_files``: read through
:mod:`tasks.corpora.splits`, never by name), each with ``= Header =`` lines stripped; with ``article_index`` also
``wiki.{split}.articles.npy``, the byte offsets where each article starts. Kinds: ``wikitext`` (the chapter's
wikitext-103-raw-v1 zip; ``cat wiki.train.txt wiki.valid.txt wiki.test.txt`` is the chapter's ``wikipedia.txt``
byte for byte), ``text`` (your own UTF-8 text), ``dump`` (a MediaWiki dump) and ``parquet`` (a Wikipedia Parquet
export). It names the source's content (sha256 and size), not its URL;
credentials in the URL are used to download and shown nowhere. The design: docs/CORPUS.md.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from tasks.core.report import Markdown, md_code, md_row, md_text, summary_table
from tasks.core.settings import Settings
from tasks.core.stage import BuildContext, Stage, stage_task
from tasks.core.urls import address_sha256, check_url, redact_url
from tasks.corpora import parquet, text, wikitext
from tasks.corpora.dump import adapter as dump
from tasks.corpora.dump.settings import DumpFields
from tasks.corpora.source import SourceContext
from tasks.corpora.splits import split_file_names, split_files
from tasks.corpora.writer import write_corpus
from tasks.sources.download import MAX_ZIP_BYTES
from tasks.sources.fetched import source_line
from tasks.sources.s3_download import check_s3_url, is_s3
from tasks.store import ArtifactStore
from tasks.store.manifest_schema import SHA256_RE

#: the corpus kinds, by ``corpus.kind``: one adapter module each
KINDS = {source.kind: source for source in (wikitext.SOURCE, text.SOURCE, dump.SOURCE, parquet.SOURCE)}
DEFAULT_URL = wikitext.DEFAULT_URL
PINNED_BYTES = wikitext.PINNED_BYTES
#: a source without its own splits: the share of documents in valid and in test (by a hash of each id)
VALID_FRACTION = 0.05
TEST_FRACTION = 0.05


# ---- settings ----------------------------------------------------------------------------------------
class CorpusSettings(DumpFields, Settings):
    """Which corpus source (``kind``), where it comes from and how it is checked. Each kind reads some of these
    (its adapter's ``fields``); one it does not read, given another value than its default, is refused."""

    URL_FIELDS = frozenset({"source_url"})
    LATER_FIELDS = frozenset({"article_index"})
    kind: str = Field(
        "wikitext",
        description="the kind of corpus: wikitext (the wikitext-103-raw-v1 zip), or another adapter's: text (your "
        "own UTF-8 text: a file, a folder of .txt files or an http(s) URL), dump (a Wikimedia "
        "<wiki>-<date>-pages-articles-multistream.xml.bz2: any language's Wikipedia), parquet (a Wikipedia "
        "Parquet export with columns id, title, text: a file, a folder of .parquet files or an http(s) URL); "
        "docs/CORPUS.md",
    )
    source_url: str = Field(
        DEFAULT_URL,
        description="the source: an http(s):// URL, or file:///absolute/path for a local copy (kind=text: a file "
        "or a folder of .txt files; kind=parquet: a file or a folder of .parquet files)",
    )
    expected_bytes: int | None = Field(
        None,
        ge=0,
        description="the zip's exact size in bytes; null = the pinned "
        "191984949 for the default URL and no check for "
        "others; 0 = no size check",
    )
    expected_sha256: str | None = Field(
        None,
        description="the sha256 of the zip, or of kind=text's or parquet's file (64 hex digits, the output of "
        "sha256sum); checked when given",
    )
    article_index: bool | None = Field(
        None,
        description="also write wiki.{split}.articles.npy, where each article starts; null = as the tokenizer "
        "needs (on for tokenizer.kind=byte or pretrained, whose shards end each article with <|endoftext|>)",
    )
    valid_fraction: float = Field(
        VALID_FRACTION,
        ge=0,
        le=1,
        description="kind=text, dump, parquet: the share of documents in the valid split (each document's by a "
        "hash of its id)",
    )
    test_fraction: float = Field(
        TEST_FRACTION, ge=0, le=1, description="kind=text, dump, parquet: the share of documents in the test split"
    )

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        return kind

    @field_validator("source_url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        if is_s3(url.strip()):  # a dump's (kind=dump): checked against the kind below
            return check_s3_url(url.strip(), "source_url")
        return check_url(url, "source_url", " (for a local zip: file:///absolute/path/to/wikitext-103-raw-v1.zip)")

    @field_validator("expected_bytes", mode="before")
    @classmethod
    def _check_size(cls, value):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(
                f"expected_bytes must be a whole number of bytes >= 0 (0 = don't check the size), got {value!r}"
            )
        return value

    @field_validator("expected_sha256")
    @classmethod
    def _check_sha256(cls, value: str | None) -> str | None:
        if value is not None and not SHA256_RE.fullmatch(value.strip().lower()):
            raise ValueError(f"expected_sha256 must be 64 hexadecimal digits (the output of sha256sum), got {value!r}")
        return value.strip().lower() if value is not None else None

    @model_validator(mode="after")
    def _kind_reads_them(self) -> CorpusSettings:
        """A setting the kind does not read is refused, never dropped (with its default value it is not given)."""
        reads = KINDS[self.kind].fields
        for name, field in type(self).model_fields.items():
            if name != "kind" and name not in reads and getattr(self, name) != field.default:
                raise ValueError(
                    f"corpus.kind={self.kind} does not read corpus.{name} (it reads {', '.join(sorted(reads))}); "
                    f"remove corpus.{name}, or choose the kind that reads it"
                )
        if self.valid_fraction + self.test_fraction >= 1:
            raise ValueError(
                f"valid_fraction + test_fraction must be below 1 (the rest is train), got "
                f"{self.valid_fraction} + {self.test_fraction}"
            )
        if is_s3(self.source_url) and self.kind != "dump":
            raise ValueError(
                f"corpus.kind={self.kind} reads an http(s):// or file:// source_url; an s3:// URL names a dump "
                "(corpus.kind=dump)"
            )
        if self.kind == "dump":
            short, url = self.wiki or self.dump_date, self.source_url != DEFAULT_URL
            if short and not (self.wiki and self.dump_date):
                raise ValueError("corpus.wiki and corpus.dump_date go together (e.g. dewiki and 20261101); give both")
            if short and url:
                raise ValueError("corpus.source_url and corpus.wiki + dump_date both name the dump; give one of them")
            if not short and not url:
                raise ValueError(
                    "corpus.kind=dump needs the dump: corpus.source_url (the URL of "
                    "<wiki>-<date>-pages-articles-multistream.xml.bz2), or corpus.wiki and corpus.dump_date"
                )
        elif self.kind != "wikitext" and self.source_url == DEFAULT_URL:
            raise ValueError(f"corpus.kind={self.kind} needs corpus.source_url: the file, folder or URL of its text")
        return self

    def version_params(self) -> dict:
        """Without ``source_url``: it says where the source comes from; :func:`source_identity` says what it is.
        Of the others, only those the kind reads, and the kind only when not ``wikitext``: the default run keeps the
        version id it had before there were kinds."""
        reads = KINDS[self.kind].fields
        params = {k: v for k, v in super().version_params().items() if k in reads or (k == "kind" and v != "wikitext")}
        params.pop("source_url", None)
        return params

    def resolved(self) -> CorpusSettings:
        """``expected_bytes`` settled: the pinned size for the default URL, 0 (no check) for others."""
        if self.expected_bytes is not None:
            return self
        return self.model_copy(update={"expected_bytes": PINNED_BYTES if self.source_url == DEFAULT_URL else 0})

    def progress_unit(self) -> tuple[str, float]:
        return ("B", 1)  # download and unzip progress count bytes

    @property
    def shown_url(self) -> str:
        """``source_url`` without credentials: the only form logs and messages use."""
        return redact_url(self.source_url)

    @property
    def address(self) -> str:
        """The sha256 of ``source_url`` without user info: the redacted form would confuse ``?f=A`` and ``?f=B``."""
        return address_sha256(self.source_url)

    @property
    def is_file(self) -> bool:
        return self.source_url.lower().startswith("file:")

    @property
    def max_fetch_bytes(self) -> int:
        """The most the download may bring: ``expected_bytes``, else ``MAX_ZIP_BYTES``."""
        return self.expected_bytes or MAX_ZIP_BYTES


# ---- what is at source_url ------------------------------------------------------------------------
def source_identity(settings: CorpusSettings, store: ArtifactStore, log) -> dict:
    """The content identity of the kind's source (``Stage.source``): what the version names."""
    return KINDS[settings.kind].identity(settings, SourceContext(store, log, STAGE))


# ---- the stage ---------------------------------------------------------------------------------------
def build_corpus(ctx: BuildContext, settings: CorpusSettings) -> dict:
    """The kind's source, fetched and checked, through the one writer (:func:`tasks.corpora.writer.write_corpus`)."""
    return {
        "kind": settings.kind,
        "source_url": settings.shown_url,
        "source_url_sha256": settings.address,  # the address, told apart where the redacted URL cannot
        **write_corpus(KINDS[settings.kind], settings, ctx),
    }


def _file_sha256(manifest: dict, name: str, metrics: dict) -> str:
    """A text file's sha256 as the manifest lists it (published, verified); a version built before its metrics
    stopped repeating it has it there too."""
    return ((manifest.get("files") or {}).get(name) or {}).get("sha256") or metrics.get("sha256") or ""


def report(manifest: dict) -> str:
    m = manifest.get("metrics", {})
    d = m.get("download", {})
    rows = [
        ("kind", m.get("kind", "wikitext")),
        ("source", md_code(redact_url(m.get("source_url") or ""))),
        ("source identity (part of the version)", source_line(manifest.get("source"), markdown=True)),
    ]
    if "zip_bytes" in m:
        rows += [
            (
                "zip",
                Markdown(
                    f"{md_text(format(m.get('zip_bytes', 0), ','))} bytes, "
                    f"sha256 {md_code(m.get('zip_sha256'))} (not kept)"
                ),
            ),
            (
                "download",
                f"{m.get('download_seconds', 0):.1f} s; {d.get('tries', 0)} request(s), "
                f"{d.get('range_requests', 0)} of them resuming (Range); {d.get('resumed_bytes', 0):,} bytes kept "
                "from an interrupted run",
            ),
        ]
    if "dump_bytes" in m:  # kind=dump: what the dump was and what its extraction kept
        seconds = float(m.get("extract_seconds") or 0)
        rows += [
            ("wiki, dump date", f"{m.get('wiki')}, {m.get('dump_date')}"),
            ("dump", Markdown(f"{md_text(format(m['dump_bytes'], ','))} bytes, sha1 {md_code(m.get('sha1'))}")),
            (
                "pages",
                f"{m.get('pages', 0):,} in {m.get('streams', 0):,} streams: {m.get('articles', 0):,} articles kept; "
                f"dropped {m.get('dropped_redirect', 0):,} redirects, {m.get('dropped_namespace', 0):,} of other "
                f"namespaces, {m.get('dropped_empty', 0):,} empty",
            ),
            ("throughput", f"{m['dump_bytes'] / 1e6 / seconds:.2f} MB/s of bz2" if seconds else "-"),
        ]
    if "parquet_rows" in m:  # kind=parquet: what its rows gave
        rows.append(
            (
                "rows",
                f"{m['parquet_rows']:,} in {m.get('parquet_files', 0):,} file(s): {m.get('parquet_kept', 0):,} kept; "
                f"dropped {m.get('parquet_dropped_empty', 0):,} empty",
            )
        )
    rows.append(("split + strip + write", f"{m.get('extract_seconds', 0):.1f} s"))
    lines = [
        f"# corpus {md_code(manifest['version'])}",
        "",
        summary_table(rows),
        "",
        "| file | bytes | chars | lines | header matches stripped | lines removed | sha256 |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    stats = m.get("splits", {})
    named = {f.split: f.text for f in split_files(manifest)}
    for split in [*(s for s in named if s in stats), *(s for s in stats if s not in named)]:
        st = stats[split]
        text = named.get(split) or split_file_names(split, False).text
        counts = (f"{st[k]:,}" for k in ("bytes", "chars", "lines", "headers_stripped", "lines_removed"))
        sha = _file_sha256(manifest, text, st)
        lines.append(md_row(text, *counts, Markdown(md_code(sha[:16]) + "…")))
    return "\n".join(lines) + "\n"


def _chars(m: dict) -> int:
    return sum(int(st.get("chars", 0)) for st in (m.get("splits") or {}).values())


#: code version 3: the version also depends on what is at source_url and on the URL without its credentials;
#: 4: on the zip's content (sha256), not on the URL. Kinds (and the split files in the manifest, wikipedia.txt
#: dropped) left it at 4: the default run's version id is the one it had, and its published versions are reused.
STAGE = Stage(
    name="corpus",
    settings=CorpusSettings,
    code_version="4",
    build=build_corpus,
    report=report,
    source=source_identity,
    alias="download",
    headline=lambda m: f"{_chars(m):,} chars",
)
download_corpus = stage_task(
    STAGE,
    "download_corpus",
    "Build the corpus from its source: wikitext-103-raw-v1, your text, a dump or a Parquet export (or reuse that "
    "version).",
)
