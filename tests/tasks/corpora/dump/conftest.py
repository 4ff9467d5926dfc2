"""Multistream dumps the tests build from ../shared/data's text (tests.support.dump_sample), and a context that
runs the adapter without the corpus stage."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from tasks.core.settings import RunOptions
from tests.support.dump_sample import DumpFiles, SamplePage, articles, sample_pages, write_dump

DATA = Path(__file__).resolve().parents[4].parent / "shared" / "data"
ARTICLES = 12  # of wikitext2-valid.txt: with the other pages, ~20 streams of 5 pages


def sample_text(n: int = ARTICLES) -> str:
    text = (DATA / "wikitext2-valid.txt").read_text(encoding="utf-8")
    return "".join(f" = {title} = \n{body}\n" for title, body in articles(text)[:n])


@pytest.fixture(scope="session")
def pages() -> list[SamplePage]:
    return list(sample_pages(sample_text()))


@pytest.fixture(scope="session")
def dump(pages, tmp_path_factory) -> DumpFiles:
    return write_dump(pages, tmp_path_factory.mktemp("dump"), pages_per_stream=5)


def context(work: Path, workers: int = 1) -> SimpleNamespace:
    """What the adapter reads of a stage's BuildContext; a run of ``workers`` local Dask workers (built unchecked:
    more workers than this machine's cores is meant)."""
    progress: list[tuple] = []
    return SimpleNamespace(
        work=work,
        run=RunOptions.model_construct(workers=workers, dask_address=None),
        log=logging.getLogger("dump-test"),
        source=None,
        shared_file=lambda path, rel: str(path),  # a local root: workers read the path itself
        progress=lambda done, total, message="": progress.append((done, total, message)),
        progress_calls=progress,
    )
