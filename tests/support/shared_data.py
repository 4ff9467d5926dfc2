"""The real test text (``../shared/data``, or ``WIKI_PIPELINE_SHARED_DATA``) being absent: under CI a failure, on a
developer's clone a skip that says where to put it. Why fail under CI: a clone without the folder would otherwise
pass with most of the tokenizer and pipeline tests skipped, and nobody reads skip counts."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from flows.mirror import SHARED_DATA

#: The files the tests read from :data:`~flows.mirror.SHARED_DATA`.
FILES = ("tinyshakespeare.txt", "wikitext2-valid.txt")


def under_ci() -> bool:
    """Whether this is a CI run: ``CI`` set to anything but empty, ``0`` or ``false`` (what CI services export)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def absent(missing: str) -> NoReturn:
    """Stop the test for want of the real test text ``missing`` (a path or an error naming it)."""
    where = (
        f"put {' and '.join(FILES)} in {SHARED_DATA} (the folder ../shared/data beside the clone), or set "
        "WIKI_PIPELINE_SHARED_DATA to the folder holding them"
    )
    if under_ci():
        pytest.fail(f"real test text is absent under CI (CI=true): {missing}; {where}", pytrace=False)
    pytest.skip(f"real test text is absent: {missing}; {where}")
