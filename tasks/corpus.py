"""Stage ``corpus`` (task ``download_corpus``): the wikitext-103-raw-v1 zip -> plain-text splits + wikipedia.txt.

A version holds ``wiki.{train,valid,test}.txt`` (each split, ``= Header =`` lines stripped) and ``wikipedia.txt``
(the three in that order), byte-identical to the chapter's ``experiments/50_download_wikipedia.py``; with
``article_index`` also ``wiki.{split}.articles.npy``: the byte offsets in each split file where an article starts
(where its `` = Title = `` line was stripped), which the shards stage of a byte-level tokenizer ends articles at.
It names the zip's content (sha256 and size), not its URL; credentials in the URL are used to download and shown
nowhere. The design (identity, offline fallback, credentials, bounds): docs/CORPUS.md.
"""

from __future__ import annotations

import re
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from pydantic import Field, field_validator, model_serializer

from mygpt.errors import UserError
from tasks.core.report import Markdown, human_bytes, md_code, md_row, md_text, summary_table
from tasks.core.settings import Settings
from tasks.core.stage import BuildContext, Stage, stage_task
from tasks.core.urls import address_sha256, file_path, redact_url, stored_url
from tasks.store import ArtifactStore
from tasks.wikitext.download import MAX_ZIP_BYTES
from tasks.wikitext.extract import extract_text
from tasks.wikitext.header_strip import BLOCK_CHARS
from tasks.wikitext.identity import zip_identity
from tasks.wikitext.source_zip import NO_DOWNLOAD, check_zip, downloaded_zip, source_line, stage_sources
from tasks.wikitext.unzip import check_members

DEFAULT_URL = "https://wikitext.smerity.com/wikitext-103-raw-v1.zip"
PINNED_BYTES = 191_984_949  # the chapter's EXPECTED_BYTES for DEFAULT_URL
SPLITS = ("train", "valid", "test")
MEMBERS = {s: f"wikitext-103-raw/wiki.{s}.raw" for s in SPLITS}
SPLIT_FILES = {s: f"wiki.{s}.txt" for s in SPLITS}
ARTICLE_FILES = {s: f"wiki.{s}.articles.npy" for s in SPLITS}
CORPUS_FILE = "wikipedia.txt"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


# ---- settings ----------------------------------------------------------------------------------------
class CorpusSettings(Settings):
    """Where the wikitext-103-raw-v1 zip comes from and how it is checked."""

    source_url: str = Field(
        DEFAULT_URL,
        description="the wikitext-103-raw-v1 zip: an http(s):// URL, or file:///absolute/path for a local copy",
    )
    expected_bytes: int | None = Field(
        None,
        ge=0,
        description="the zip's exact size in bytes; null = the pinned "
        "191984949 for the default URL and no check for "
        "others; 0 = no size check",
    )
    expected_sha256: str | None = Field(
        None, description="the sha256 of the zip (64 hex digits, the output of sha256sum); checked when given"
    )
    article_index: bool | None = Field(
        None,
        description="also write wiki.{split}.articles.npy, where each article starts; null = as the tokenizer "
        "needs (on for tokenizer.kind=byte or pretrained, whose shards end each article with <|endoftext|>)",
    )

    @field_validator("source_url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        url = url.strip()
        if not url:
            raise ValueError("source_url must be an http(s):// or file:// URL of the wikitext-103-raw-v1 zip, got ''")
        shown = redact_url(url)
        odd = sorted({c for c in url if c == "\\" or c.isspace() or not c.isprintable()})
        if odd:  # parsers disagree on these (requests ends the host at a backslash, urllib.parse does not)
            raise ValueError(
                f"source_url {shown!r} holds {', '.join(map(repr, odd))}, which a URL cannot hold as it is; "
                "percent-encode it (e.g. %5C for a backslash, %20 for a space)"
            )
        parsed = urllib.parse.urlparse(url)
        scheme = parsed.scheme.lower()
        try:
            parsed.port  # noqa: B018 (raises for a port that is not a number in 0..65535)
        except ValueError:
            raise ValueError(f"source_url {shown!r} has a port that is not a number from 1 to 65535") from None
        if scheme not in ("http", "https", "file"):
            raise ValueError(
                f"source_url {shown!r} has scheme {parsed.scheme or '(none)'!r}; use an http://, "
                "https:// or file:// URL (for a local zip: "
                "file:///absolute/path/to/wikitext-103-raw-v1.zip)"
            )
        if scheme in ("http", "https") and not parsed.hostname:
            raise ValueError(f"source_url {shown!r} has no host; write it as {scheme}://host/path")
        if scheme == "file":
            if parsed.netloc not in ("", "localhost"):
                raise ValueError(
                    f"source_url {shown!r}: a file:// URL cannot name a host ({parsed.hostname or redact_url(url)!r}); "
                    "use file:///absolute/path"
                )
            if not parsed.path.startswith("/"):
                raise ValueError(f"source_url {shown!r}: a file:// URL needs an absolute path (file:///...)")
        return url

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
        if value is not None and not _SHA256_RE.match(value.strip().lower()):
            raise ValueError(f"expected_sha256 must be 64 hexadecimal digits (the output of sha256sum), got {value!r}")
        return value.strip().lower() if value is not None else None

    @model_serializer(mode="wrap")
    def _without_credentials(self, handler, info):
        """The JSON form (version id, manifest, UI, Prefect's parameters) never carries credentials."""
        data = handler(self)
        if info.mode_is_json() and "source_url" in data:
            data["source_url"] = stored_url(data["source_url"])
        return data

    def version_params(self) -> dict:
        """Without ``source_url``: it says where the zip comes from; :func:`source_identity` says what it is. And
        ``article_index`` only when set: a corpus without it keeps the version id it had before the setting."""
        params = super().version_params()
        params.pop("source_url", None)
        if not params.get("article_index"):
            params.pop("article_index", None)
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
    def max_zip_bytes(self) -> int:
        """The most the download may bring: ``expected_bytes``, else ``MAX_ZIP_BYTES``."""
        return self.expected_bytes or MAX_ZIP_BYTES


# ---- what is at source_url ------------------------------------------------------------------------
def source_identity(settings: CorpusSettings, store: ArtifactStore, log) -> dict:
    """The content identity ``{"sha256", "bytes"}`` of the zip at ``source_url`` (``Stage.source``)."""
    return zip_identity(settings, store, log, STAGE)


# ---- unzip + strip ----------------------------------------------------------------------------------------
def extract_corpus(
    zip_path: Path,
    out_dir: Path,
    *,
    source: str,
    progress=None,
    block_chars: int = BLOCK_CHARS,
    article_index: bool = False,
    hashed: Callable[[Path, int, str], None] | None = None,
) -> dict:
    """Unzip the three splits, strip headers, write the split files and wikipedia.txt (and with ``article_index``
    the article starts). Returns per-split metrics. ``hashed``: see :func:`extract_text`."""
    members = {split: (MEMBERS[split], SPLIT_FILES[split]) for split in SPLITS}
    m = extract_text(
        zip_path,
        out_dir,
        members,
        CORPUS_FILE,
        source=source,
        progress=progress,
        block_chars=block_chars,
        layout_hint="source_url must point at the wikitext-103-raw-v1 zip",
        article_files=ARTICLE_FILES if article_index else None,
        hashed=hashed,
    )
    return {"splits": m["members"], "wikipedia": m["joined"]}


# ---- the stage ---------------------------------------------------------------------------------------
def build_corpus(ctx: BuildContext, settings: CorpusSettings) -> dict:
    """Fetch the zip (or open the file:// one), check it, and write the stripped splits + wikipedia.txt."""
    shown = settings.shown_url
    index = stage_sources(ctx.store, STAGE.name)
    t0 = time.monotonic()
    facts: dict = dict(NO_DOWNLOAD)
    ours = not settings.is_file
    if ours:
        zip_path, facts = downloaded_zip(ctx, settings, index)
    else:
        zip_path = file_path(settings.source_url)
    size, sha = check_zip(zip_path, settings, ours=ours)
    if ctx.source and sha != ctx.source.get("sha256"):
        if ours:
            zip_path.unlink(missing_ok=True)
            index.forget(settings.address, ctx.source.get("sha256", ""))
        raise UserError(
            f"{shown} now holds other bytes (sha256 {sha}) than the ones this run's version names "
            f"({ctx.source.get('sha256')}): the file changed while this run was using it; rerun to use the new file"
        )
    download_seconds = round(time.monotonic() - t0, 3)
    ctx.log.info("download: %s is %s, sha256 %s", shown, human_bytes(size), sha)
    t1 = time.monotonic()
    try:
        check_members(zip_path, shown, MEMBERS.values())
        corpus = extract_corpus(
            zip_path,
            ctx.out,
            source=shown,
            progress=lambda d, t, m: ctx.progress(d, t, m),
            article_index=bool(settings.article_index),
            hashed=ctx.build.hashed,  # publish need not read the text back to hash it
        )
    except UserError:
        if ours:
            zip_path.unlink(missing_ok=True)  # a rerun fetches again instead of reusing a bad archive ...
            index.forget(settings.address, sha)  # ... and does not take its sha256 for the address's
        raise
    ctx.build.joined(CORPUS_FILE, [SPLIT_FILES[s] for s in SPLITS])  # an object store sends its bytes once
    ctx.progress(1, 1, "done", force=True)
    return {
        "source_url": shown,
        "source_url_sha256": settings.address,  # the address, told apart where the redacted URL cannot
        "zip_bytes": size,
        "zip_sha256": sha,
        "zip_published": False,
        "download_seconds": download_seconds,
        "download": facts,
        "extract_seconds": round(time.monotonic() - t1, 3),
        **corpus,
    }


def _file_sha256(manifest: dict, name: str, metrics: dict) -> str:
    """A text file's sha256 as the manifest lists it (published, verified); a version built before its metrics
    stopped repeating it has it there too."""
    return ((manifest.get("files") or {}).get(name) or {}).get("sha256") or metrics.get("sha256") or ""


def report(manifest: dict) -> str:
    m = manifest.get("metrics", {})
    d = m.get("download", {})
    lines = [
        f"# corpus {md_code(manifest['version'])}",
        "",
        summary_table(
            [
                ("source", md_code(redact_url(m.get("source_url") or ""))),
                ("source identity (part of the version)", source_line(manifest.get("source"), markdown=True)),
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
                ("unzip + strip", f"{m.get('extract_seconds', 0):.1f} s"),
            ]
        ),
        "",
        "| file | bytes | chars | lines | header matches stripped | lines removed | sha256 |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for split in SPLITS:
        st = m.get("splits", {}).get(split)
        if not st:
            continue
        counts = (f"{st[k]:,}" for k in ("bytes", "chars", "lines", "headers_stripped", "lines_removed"))
        sha = _file_sha256(manifest, SPLIT_FILES[split], st)
        lines.append(md_row(SPLIT_FILES[split], *counts, Markdown(md_code(sha[:16]) + "…")))
    w = m.get("wikipedia")
    if w:
        counts = (f"{w[k]:,}" for k in ("bytes", "chars", "lines"))
        sha = _file_sha256(manifest, CORPUS_FILE, w)
        lines.append(md_row(Markdown(f"**{CORPUS_FILE}**"), *counts, "", "", Markdown(md_code(sha[:16]) + "…")))
    return "\n".join(lines) + "\n"


#: code version 3: the version also depends on what is at source_url and on the URL without its credentials;
#: 4: on the zip's content (sha256), not on the URL.
STAGE = Stage(
    name="corpus",
    settings=CorpusSettings,
    code_version="4",
    build=build_corpus,
    report=report,
    source=source_identity,
    alias="download",
    headline=lambda m: f"{(m.get('wikipedia') or {}).get('chars', 0):,} chars",
)
download_corpus = stage_task(STAGE, "download_corpus", "Download wikitext-103-raw-v1 (or reuse that version).")
