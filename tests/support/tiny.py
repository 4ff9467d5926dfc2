"""The tiny pipeline for tests: the tiny preset's settings and a wikitext-style zip from ../shared/data."""

from __future__ import annotations

import sys
from pathlib import Path

from flows.settings import TINY, Pipeline
from tasks.core.settings import RunOptions
from tests.support.shared_data import absent

SETTINGS = Pipeline.parse(**TINY)  # the tiny preset, checked: SETTINGS.model, SETTINGS.samples, ...


def run_in(root, **options) -> RunOptions:
    """Run options for artifact root ``root`` (the tiny preset's workers/threads unless given)."""
    return RunOptions(**{**TINY["run"], "artifacts_dir": str(root), **options})


def tiny_zip_url(tmp: Path) -> str:
    """A wikitext-103-style zip built from ../shared/data, as a file:// URL (no HTTP needed)."""
    from flows.mirror import build_wikitext_zip

    try:
        build_wikitext_zip(tmp / "wikitext-103-raw-v1.zip")
    except FileNotFoundError as e:
        absent(str(e))
    return (tmp / "wikitext-103-raw-v1.zip").as_uri()


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
