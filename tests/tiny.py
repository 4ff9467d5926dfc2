"""The tiny preset's per-stage settings and a wikitext-style zip from ../shared/data, for pipeline tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.params import TINY
from tasks import sample as sample_stage
from tasks import train as train_stage

TRAIN = {k: v for k, v in TINY.items() if k in train_stage.DEFAULTS or k == "threads"}
SAMPLE = {k: v for k, v in TINY.items() if k in sample_stage.DEFAULTS or k == "threads"}


def tiny_zip_url(tmp: Path) -> str:
    """A wikitext-103-style zip built from ../shared/data, as a file:// URL (no HTTP needed)."""
    from bench.mirror import build_wikitext_zip

    try:
        build_wikitext_zip(tmp / "wikitext-103-raw-v1.zip")
    except FileNotFoundError as e:
        pytest.skip(f"real test text is absent: {e}")
    return (tmp / "wikitext-103-raw-v1.zip").as_uri()
