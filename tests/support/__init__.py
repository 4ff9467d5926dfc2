"""Helpers shared by the tests (one place): the repository root, a real Prefect server, the tiny pipeline."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
