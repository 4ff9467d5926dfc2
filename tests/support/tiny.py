"""The tiny pipeline for tests: the tiny preset's settings and its corpus source, made from ../shared/data."""

from __future__ import annotations

import sys
from pathlib import Path

from flows.settings import TINY, Pipeline
from tasks.core.settings import RunOptions
from tests.support import corpora

SETTINGS = Pipeline.parse(**TINY)  # the tiny preset, checked: SETTINGS.model, SETTINGS.samples, ...


def run_in(root, **options) -> RunOptions:
    """Run options for artifact root ``root`` (the tiny preset's workers/threads unless given)."""
    return RunOptions(**{**TINY["run"], "artifacts_dir": str(root), **options})


def tiny_zip_url(tmp: Path) -> str:
    """The tiny corpus's source: the real test text's three splits (:func:`~tests.support.corpora.shared_splits`)
    as a wikitext-103-style zip in ``tmp``, a file:// URL (no HTTP needed)."""
    return corpora.source_url(tmp, corpora.shared_splits())


def tiny_flow_parameters(source_url: str, root, **groups) -> dict:
    """The flow's parameters for the tiny preset against ``source_url`` with artifacts under ``root``."""
    params = {**TINY, "corpus": {"source_url": source_url}, "run": {**TINY["run"], "artifacts_dir": str(root)}}
    for group, values in groups.items():
        params[group] = {**params.get(group, {}), **values}
    return params


def tiny_run_command(source_url: str, root, *extra: str) -> list[str]:
    """``python -m flows.cli run --tiny`` against ``source_url`` with artifacts under ``root``."""
    cli = [sys.executable, "-m", "flows.cli", "run", "--tiny"]
    return [*cli, "--source-url", source_url, "--artifacts-dir", str(root), *extra]
