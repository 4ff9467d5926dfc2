"""The settings a dump source reads, as one mixin (:class:`DumpFields`), so ``CorpusSettings`` takes them by
inheritance; :class:`DumpSettings` is the adapter's own whole set for running it alone (tests, the benchmark).
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from tasks.core.settings import Settings


class DumpFields(Settings):
    """``corpus.*`` for ``kind=dump``: the dump's checksum, or the short form of its URL."""

    expected_sha1: str | None = Field(
        None,
        description="the dump's sha1 (40 hex digits, as in <wiki>-<date>-sha1sums.txt); null = read from that "
        "file beside the dump",
    )
    wiki: str | None = Field(
        None, description="with dump_date, instead of source_url: the wiki's database name (enwiki, dewiki, ...)"
    )
    dump_date: str | None = Field(None, description="with wiki: the dump's date, YYYYMMDD (or latest)")

    @field_validator("expected_sha1")
    @classmethod
    def _check_sha1(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9a-fA-F]{40}", value.strip()):
            raise ValueError(f"expected_sha1 must be 40 hex digits (a sha1), got {value!r}")
        return value.strip().lower() if value is not None else None

    @field_validator("wiki")
    @classmethod
    def _check_wiki(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[a-z][a-z0-9_]*", value):
            raise ValueError(f"wiki must be a wiki's database name such as enwiki or zh_yuewiki, got {value!r}")
        return value

    @field_validator("dump_date", mode="before")
    @classmethod
    def _date_as_text(cls, value):
        """``--param corpus.dump_date=20261101`` reads as a number: it is the folder's name all the same."""
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("dump_date")
    @classmethod
    def _check_date(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"\d{8}|latest", value):
            raise ValueError(f"dump_date must be YYYYMMDD (a dump's folder name) or latest, got {value!r}")
        return value


class DumpSettings(DumpFields):
    """The dump source's settings on its own: in the pipeline, ``CorpusSettings`` holds ``source_url`` and the
    split fractions (shared with the other kinds) and inherits :class:`DumpFields`."""

    source_url: str = Field("", description="the URL of <wiki>-<date>-pages-articles-multistream.xml.bz2")
    valid_fraction: float = Field(0.002, ge=0, le=1, description="the share of pages in the valid split")
    test_fraction: float = Field(0.002, ge=0, le=1, description="the share of pages in the test split")
