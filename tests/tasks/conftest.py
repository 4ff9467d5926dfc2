"""Fixtures of the corpus stage's tests: the wikitext-shaped zip and a mirror serving it."""

from __future__ import annotations

import pytest

from flows.mirror import build_wikitext_zip
from tasks.wikitext.download import ENV_ATTEMPTS, ENV_BASE_DELAY
from tests.support.mirror_faults import FaultyMirror


@pytest.fixture(scope="module")
def wiki_zip(wikitext2_path) -> bytes:
    return build_wikitext_zip(data_dir=wikitext2_path.parent)


@pytest.fixture()
def fast_retries(monkeypatch):
    monkeypatch.setenv(ENV_BASE_DELAY, "0.01")
    monkeypatch.setenv(ENV_ATTEMPTS, "4")


@pytest.fixture()
def mirror(wiki_zip):
    with FaultyMirror({"/wikitext-103-raw-v1.zip": wiki_zip}) as m:
        yield m
