"""The extraction, parallel by range of streams: :func:`extract_range` is what a Dask worker runs (it reads its
byte range of the dump itself; one local worker, or one range to do, runs it in the stage's own process),
:func:`extracted` hands the ranges back in dump order, each saved as a checkpoint in the build's work folder first,
so a killed build resumes with the ranges not yet done. The output depends only on the dump: the same documents,
in the same order, for any worker count and any chunking.

Imports only ``mygpt`` and the dump modules at the top, so a worker that unpickles :func:`extract_range` loads no
Prefect.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tasks.core.faults import fault_point
from tasks.corpora.dump.index import StreamIndex
from tasks.corpora.dump.pages import parse_pages
from tasks.corpora.dump.streams import StreamRange, decompressed_streams
from tasks.corpora.dump.wikitext import SiteNames, plain_text

#: the reasons a page is not a document, as the report counts them
DROP_REASONS = ("redirect", "namespace", "empty")
ARTICLE_NAMESPACE = 0


@dataclass
class RangeResult:
    """What one range of streams gave: its articles ``(page_id, title, text)`` in dump order and what it dropped."""

    articles: list[tuple[int, str, str]]
    dropped: dict[str, int]
    pages: int
    in_bytes: int

    def to_json(self) -> str:
        return json.dumps(
            {"articles": self.articles, "dropped": self.dropped, "pages": self.pages, "in_bytes": self.in_bytes},
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str) -> RangeResult:
        d = json.loads(text)
        return cls([tuple(a) for a in d["articles"]], d["dropped"], d["pages"], d["in_bytes"])


def extract_range(
    path: str, start: int, end: int, starts: tuple[int, ...], last: bool, site: SiteNames, where: str
) -> str:
    """The articles of the streams at ``starts`` (bytes ``start .. end`` of the dump at ``path``, a file or an
    ``s3://`` URL; ``last``: the range that ends the dump), as :meth:`RangeResult.to_json` (one string: Dask ships
    it as one buffer)."""
    from tasks.dask.work import opener

    open_url = opener(path)
    open_file = (lambda: open_url(path)) if open_url else (lambda: open(path, "rb"))  # noqa: SIM115
    result = RangeResult([], dict.fromkeys(DROP_REASONS, 0), 0, end - start)
    with gc_paused():
        for offset, data in decompressed_streams(open_file, start, end, starts, where, last):
            for page in parse_pages(data, f"{where}, the bz2 stream at byte {offset}"):
                result.pages += 1
                reason = _dropped(page)
                text = "" if reason else plain_text(page.text, site)
                if not reason and not text:
                    reason = "empty"
                if reason:
                    result.dropped[reason] += 1
                else:
                    result.articles.append((page.page_id, page.title, text))
    return result.to_json()


_gc_lock = threading.Lock()
_gc_pausers = 0  # threads inside gc_paused
_gc_was_enabled = True  # the collector's state when the first of them entered


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while any thread of the process is inside (it is back on, if it was
    on, when the last one leaves). Why: the wikitext tokenizer makes millions of short-lived token objects, each
    allocation counting toward the collector's next pass over every live object, and none of them is in a cycle:
    reference counting frees them all. Off, the conversion takes measurably less time (bench/dump_extract.py)."""
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


def _dropped(page) -> str | None:
    if page.ns != ARTICLE_NAMESPACE:
        return "namespace"
    if page.redirect:
        return "redirect"
    return None


@dataclass
class Progress:
    """Counts so far, for the progress line and the report's metrics."""

    streams: int = 0
    pages: int = 0
    articles: int = 0
    in_bytes: int = 0
    resumed_ranges: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))

    def add(self, rng: StreamRange, result: RangeResult) -> None:
        self.streams += rng.count
        self.pages += result.pages
        self.articles += len(result.articles)
        self.in_bytes += result.in_bytes
        for reason, n in result.dropped.items():
            self.dropped[reason] = self.dropped.get(reason, 0) + n


def extracted(
    ranges: list[StreamRange],
    index: StreamIndex,
    run_ranges: Callable[[list[StreamRange]], Iterator[str]],
    checkpoints: Path,
    progress: Callable[[Progress, float], None] = lambda p, t: None,
) -> Iterator[tuple[StreamRange, RangeResult]]:
    """Each range's result in dump order: from its checkpoint in ``checkpoints`` when a run before this one
    finished it, else from ``run_ranges`` (given the ranges not done, in order; yields their results in that
    order), saved there (atomically) before it is yielded. ``progress(counts, seconds)`` after each range."""
    checkpoints.mkdir(parents=True, exist_ok=True)
    saved = {p.name for p in checkpoints.iterdir()}
    todo = [r for r in ranges if f"{r.name}.json" not in saved]
    fresh = run_ranges(todo) if todo else iter(())
    counts = Progress(resumed_ranges=len(ranges) - len(todo))
    t0 = time.monotonic()
    try:
        for rng in ranges:
            path = checkpoints / f"{rng.name}.json"
            if f"{rng.name}.json" in saved:
                result = RangeResult.from_json(path.read_text(encoding="utf-8"))
            else:
                text = next(fresh)
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, path)
                fault_point("corpus.dump_range")  # a crash here leaves this range's checkpoint, not the next
                result = RangeResult.from_json(text)
            counts.add(rng, result)
            progress(counts, time.monotonic() - t0)
            yield rng, result
    finally:
        close = getattr(fresh, "close", None)
        if close:
            close()
