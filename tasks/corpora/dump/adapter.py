"""``corpus.kind=dump``: a Wikimedia ``<wiki>-<date>-pages-articles-multistream.xml.bz2`` as a corpus source.

Its identity is the dump's sha1 (from ``<wiki>-<date>-sha1sums.txt`` beside it, or ``corpus.expected_sha1``) and
size, never its URL; its documents are the articles of namespace 0 that are not redirects, in dump order, each
``Document(doc_id=str(page_id), title, plain text)`` (docs/CORPUS.md, "A MediaWiki dump"). The download is checked
against that sha1 before a page is read: bytes that do not match are refused.
"""

from __future__ import annotations

import hashlib
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mygpt.errors import UserError
from tasks.core.report import human_bytes
from tasks.core.urls import redact_url
from tasks.corpora.dump.extract import Progress, RangeResult, extract_range, extracted
from tasks.corpora.dump.index import StreamIndex, read_index
from tasks.corpora.dump.names import DumpNames, dump_names, sha1_from_sums, short_form_url
from tasks.corpora.dump.pages import DumpError, SiteInfo, parse_header
from tasks.corpora.dump.streams import StreamRange, decompressed_streams, stream_ranges
from tasks.corpora.dump.wikitext import SiteNames
from tasks.corpora.source import Document, save_counts, saved_counts
from tasks.sources.s3_download import fetch_s3, is_s3, s3_info

#: what the extraction makes of a dump's bytes; a change to what is kept or dropped is a new number (a new version):
#: 2, the article index marks only each page's own title line, not a level-1 heading in its text
EXTRACTION_VERSION = 2
#: the largest dump a download may bring (English is ~25 GB)
MAX_DUMP_BYTES = 64 << 30
MAX_SMALL_FILE_BYTES = 64 << 20  # the sha1sums file; an index is ~1/20 of its dump, bounded by that
CHECKPOINTS = "dump-ranges"
METRICS = "dump-metrics.json"  # in the work folder: the report's fields, for the writer once the documents ended


@dataclass(frozen=True)
class LocalDump:
    """The dump's files on this machine, checked: the dump, its index, and what the dump says it is."""

    dump: Path
    index: StreamIndex
    site: SiteInfo


class DumpSource:
    """The adapter (``tasks.corpora.source.CorpusSource``). ``streams_per_range`` is how many bz2 streams one
    worker task (and one checkpoint) holds (None: ``streams.range_size``): any value gives the same documents."""

    kind = "dump"
    fields = frozenset(
        {"source_url", "expected_sha1", "wiki", "dump_date", "article_index", "valid_fraction", "test_fraction"}
    )

    def __init__(self, streams_per_range: int | None = None) -> None:
        self.streams_per_range = streams_per_range

    # ---- what the bytes are ------------------------------------------------------------------------------------
    def identity(self, settings, ctx) -> dict:
        names = names_of(settings)
        _check_allowed(names)
        sha1 = settings.expected_sha1 or sha1_from_sums(
            _small_text(names.sha1sums_url, "sha1sums.txt"), names.file_name, redact_url(names.sha1sums_url)
        )
        return {
            "sha1": sha1,
            "bytes": _size_of(names.dump_url),
            "wiki": names.wiki,
            "dump_date": names.dump_date,
            "extraction": EXTRACTION_VERSION,
        }

    # ---- what they hold ----------------------------------------------------------------------------------------
    def documents(self, settings, ctx) -> Iterator[Document]:
        identity = ctx.source or self.identity(settings, ctx)
        local = self.local_dump(settings, ctx, identity)
        ranges = stream_ranges(local.index, self.streams_per_range)
        site = SiteNames.of(local.site.namespaces)
        where = redact_url(names_of(settings).dump_url)
        dump = str(local.dump)
        total = local.index.size
        n = len(local.index.offsets)
        starts = {r.number: local.index.offsets[r.first : r.first + r.count] for r in ranges}

        def args(item: tuple[int, int, int], path: str = dump) -> tuple:
            return path, item[1], item[2], starts[item[0]], item[2] == total, site, where

        def run_ranges(todo: list[StreamRange]) -> Iterator[str]:
            from tasks.dask.work import dask_client, local_workers, ordered_results

            items = [(r.number, r.start, r.end) for r in todo]
            if ctx.run.dask_address is None and min(local_workers(ctx.run), len(items)) == 1:
                # one process would do (one local worker, or one range left): no cluster to start
                yield from (extract_range(*args(item)) for item in items)
                return
            # an external cluster's workers read the dump's copy in the store (an object-store root): no shared disk
            path = ctx.shared_file(local.dump, f"work/download/{local.dump.name}") if ctx.run.dask_address else dump
            with dask_client(ctx.run, ctx.log, needs=[path]) as client:
                for _, text in ordered_results(
                    client,
                    extract_range,
                    items,
                    lambda item: args(item, path),
                    window=2 * local_workers(ctx.run),
                    name="dump-extract",
                ):
                    yield text

        def progress(counts: Progress, seconds: float) -> None:
            rate = counts.in_bytes / seconds if seconds > 0 else 0.0
            ctx.progress(
                local.index.offsets[0] + counts.in_bytes,  # the header stream, read before the first range
                total,
                f"{counts.streams}/{n} streams · {counts.pages} pages ({counts.articles} articles)"
                + (f" · {human_bytes(rate)}/s of bz2" if rate else ""),
            )

        counts = Progress()
        for rng, result in extracted(ranges, local.index, run_ranges, Path(ctx.work) / CHECKPOINTS, progress):
            counts.add(rng, result)
            yield from _documents_of(result)
        if not counts.articles:
            raise DumpError(
                f"{where}: the dump holds no article ({counts.pages} pages: {counts.dropped}); a corpus needs at "
                "least one page of namespace 0 that is not a redirect and has text"
            )
        metrics = {
            "wiki": local.site.dbname or identity["wiki"],
            "dump_date": identity["dump_date"],
            "sha1": identity["sha1"],
            "dump_bytes": identity["bytes"],
            "streams": n,
            "pages": counts.pages,
            "articles": counts.articles,
            **{f"dropped_{reason}": count for reason, count in counts.dropped.items()},
        }
        save_counts(ctx.work, METRICS, metrics)

    def report_metrics(self, settings, ctx) -> dict[str, Any]:
        """What the last :meth:`documents` of this build counted (the report's fields), ``{}`` before it ended."""
        return saved_counts(ctx.work, METRICS)

    def local_dump(self, settings, ctx, identity: dict) -> LocalDump:
        """The dump and its index on this machine (downloaded into the build's work folder, resumed by Range, when
        not a file:// URL), the dump's size and sha1 checked against ``identity``, its header read."""
        names = names_of(settings)
        _check_allowed(names)
        dump = _local_file(names.dump_url, ctx.work, names.file_name, MAX_DUMP_BYTES, identity["bytes"], ctx.log)
        size = dump.stat().st_size
        shown = redact_url(names.dump_url)
        ours = _file_path(names.dump_url) is None  # downloaded: a damaged copy goes, so the rerun fetches again
        if size != identity["bytes"]:
            if ours:
                dump.unlink(missing_ok=True)
            raise DumpError(f"{shown}: {size} bytes on disk, but the source said {identity['bytes']}; rerun")
        found = _sha1_of(dump)
        if found != identity["sha1"]:
            if ours:
                dump.unlink(missing_ok=True)
            raise DumpError(
                f"{shown}: its sha1 is {found}, not the {identity['sha1']} "
                f"{'corpus.expected_sha1 gives' if settings.expected_sha1 else 'its sha1sums.txt gives'}: the "
                "download is damaged or the file was replaced; download it again (or fix corpus.expected_sha1)"
            )
        index_path = _local_file(names.index_url, ctx.work, Path(names.index_url).name, MAX_DUMP_BYTES, None, ctx.log)
        try:
            index = read_index(index_path, size, redact_url(names.index_url))
        except UserError:
            if _file_path(names.index_url) is None:
                index_path.unlink(missing_ok=True)  # downloaded: the rerun fetches it again
            raise
        (_, header), *_ = decompressed_streams(lambda: open(dump, "rb"), 0, index.offsets[0], (0,), shown)  # noqa: SIM115
        return LocalDump(dump, index, parse_header(header, shown))


def names_of(settings) -> DumpNames:
    """The dump's names from ``corpus.source_url``, or from ``corpus.wiki`` + ``corpus.dump_date``."""
    short = (settings.wiki, settings.dump_date)
    if any(short) and not all(short):
        raise UserError("corpus.wiki and corpus.dump_date go together (e.g. wiki=dewiki dump_date=20261101)")
    if all(short):
        if settings.source_url and settings.source_url != type(settings).model_fields["source_url"].default:
            raise UserError("give either corpus.source_url or corpus.wiki + corpus.dump_date, not both")
        return dump_names(short_form_url(settings.wiki, settings.dump_date), "corpus.wiki/dump_date")
    return dump_names(settings.source_url)


def _check_allowed(names: DumpNames) -> None:
    """The allowed-sources list (``tasks.sources.allowed``) applies to the dump and the two files beside it."""
    from tasks.sources.allowed import SourcePolicy

    policy = SourcePolicy.from_env()
    for url in (names.dump_url, names.index_url, names.sha1sums_url):
        policy.check("corpus.source_url", url)


def _documents_of(result: RangeResult) -> Iterator[Document]:
    for page_id, title, text in result.articles:
        yield Document(str(page_id), title, text)


def _file_path(url: str) -> Path | None:
    """The local path of a file:// URL; None for the schemes that are downloaded (http(s)://, s3://)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        return Path(urllib.request.url2pathname(parts.path))
    if parts.scheme in ("http", "https", "s3"):
        return None
    raise UserError(f"corpus.source_url {redact_url(url)}: only http(s)://, s3:// and file:// URLs name a dump")


def _size_of(url: str) -> int:
    path = _file_path(url)
    if path is not None:
        try:
            return path.stat().st_size
        except OSError as e:
            raise UserError(f"corpus.source_url {url}: {e.strerror}; give the path of the dump") from None
    if is_s3(url):
        return s3_info(url)["bytes"]
    from tasks.sources.download import probe
    from tasks.sources.fetched import stage_knobs

    size = probe(url, stage_knobs()).get("bytes")
    if size is None:
        raise UserError(f"corpus.source_url {redact_url(url)}: the server does not say the file's size; use a mirror")
    return int(size)


def _local_file(url: str, work: Path, name: str, max_bytes: int, size: int | None, log=None) -> Path:
    """The file at ``url``: itself for file://, else downloaded (resumed by Range, or for s3:// from the bytes
    copied) into ``work``/download."""
    path = _file_path(url)
    if path is not None:
        if not path.is_file():
            raise UserError(f"{url}: no such file; a dump's index and sha1sums.txt are expected beside it")
        return path
    from tasks.sources.download import fetch
    from tasks.sources.fetched import stage_knobs

    dest = Path(work) / "download" / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not dest.exists() and is_s3(url):
        fetch_s3(url, dest, max_bytes=max_bytes, log=log)
    elif not dest.exists():
        fetch(
            url,
            dest,
            knobs=stage_knobs(),
            identity={"bytes": size} if size is not None else None,
            max_bytes=max_bytes,
            log=log,
        )
    return dest


def _small_text(url: str, name: str) -> str:
    """A small file's text (the sha1sums), fetched into a temporary folder: an identity is asked before a build."""
    with tempfile.TemporaryDirectory(prefix="dump-sums-") as tmp:
        path = _local_file(url, Path(tmp), name, MAX_SMALL_FILE_BYTES, None)
        return path.read_text(encoding="utf-8", errors="replace")


def _sha1_of(path: Path) -> str:
    digest = hashlib.sha1(usedforsecurity=False)
    with open(path, "rb") as f:
        while block := f.read(4 << 20):
            digest.update(block)
    return digest.hexdigest()


SOURCE = DumpSource()
