"""Fixtures of the corpus stage's tests (the zip and its mirror are tests/conftest.py's)."""

from __future__ import annotations

import pytest

from tasks.sources.download import ENV_ATTEMPTS, ENV_BASE_DELAY


@pytest.fixture()
def fast_retries(monkeypatch):
    monkeypatch.setenv(ENV_BASE_DELAY, "0.01")
    monkeypatch.setenv(ENV_ATTEMPTS, "4")
