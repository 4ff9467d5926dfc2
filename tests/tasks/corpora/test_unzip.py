"""The zip checks: bad archives, lying sizes, zip bombs and unreadable members refused before or while unzipping."""

from __future__ import annotations

import zipfile
from collections.abc import Callable

import pytest

from flows.mirror import Mirror
from mygpt.errors import UserError
from tasks.corpora import unzip
from tests.support import zips
from tests.support.corpus_runs import published
from tests.support.stages import corpus as download


def _bad_archives() -> dict[str, tuple[bytes, str]]:
    good: dict[str, str | bytes] = dict(zips.small_splits(1))
    missing = dict(good)
    del missing["valid"]
    bad_utf8 = dict(good, test=b" caf\xc3\xa9 ok\n bad \xff here\n")
    return {
        "not-a-zip": (b"<html>Not the file you wanted</html>", "is not a zip archive"),
        "missing-member": (zips.wikitext_zip(missing), "has no member 'wikitext-103-raw/wiki.valid.raw'"),
        "not-utf8": (
            zips.wikitext_zip(bad_utf8),
            r"wikitext-103-raw/wiki.test.raw in .* is not valid UTF-8: byte 0xff at offset 15",
        ),
    }


@pytest.mark.parametrize("case", ["not-a-zip", "missing-member", "not-utf8"])
def test_bad_archive_is_a_user_error_and_publishes_nothing(tmp_path, case):
    data, message = _bad_archives()[case]
    with Mirror({"/w.zip": data}) as m, pytest.raises(UserError, match=message):
        download(tmp_path / "art", source_url=m.url("/w.zip"))
    assert published(tmp_path / "art") == []
    staged = list((tmp_path / "art" / "corpus" / ".staging").glob("*/work/source.zip"))
    assert staged == []  # a rerun downloads again instead of reusing the bad archive


def _bad_zips() -> dict[str, tuple[Callable[[], bytes], str]]:
    return {
        "encrypted": (
            lambda: zips.encrypted_zip(),
            r"wiki.train.raw in .* is encrypted; the wikitext-103-raw-v1 zip is not",
        ),
        "deflate64": (
            lambda: zips.deflate64_zip(),
            r"wiki.train.raw in .* is compressed with method 9 \(deflate64\), which Python's zipfile cannot "
            r"read \(it reads stored, deflate, bzip2, lzma\)",
        ),
        "bomb": (
            lambda: zips.bomb_zip(30),
            r"would unzip [\d.]+ KB into 30.0 MB \([\d,]+x; text compresses 3-4x, this "
            r"stage accepts at most 20x\): it looks like a zip bomb",
        ),
        "lies about its size": (
            lambda: zips.lying_size_zip(),
            r"wiki.train.raw in .* unzips to more than the 10 bytes its header declares \(stopped after [\d,]+\): "
            r"the zip lies about its sizes",
        ),
        "bzip2 raised compressed size": (
            lambda: zips.raised_compressed_size_zip(zipfile.ZIP_BZIP2),
            r"wiki.train.raw in .* declares 441,505 compressed bytes, but only [\d,]+ bytes \(header included\) "
            r"are there before the next entry: the zip lies about its sizes",
        ),
        "deflate raised compressed size": (
            lambda: zips.raised_compressed_size_zip(zipfile.ZIP_DEFLATED),
            r"wiki.train.raw in .* declares 441,505 compressed bytes, but only [\d,]+ bytes",
        ),
        "bzip2 understated size": (
            lambda: zips.understated_size_zip(zipfile.ZIP_BZIP2),
            r"wiki.train.raw in .* unzips to more than the 600,000 bytes its header declares \(stopped after",
        ),
        "deflate understated size": (
            lambda: zips.understated_size_zip(zipfile.ZIP_DEFLATED),
            r"wiki.train.raw in .* unzips to more than the 600,000 bytes its header declares",
        ),
        "lzma understated size": (
            lambda: zips.understated_size_zip(zipfile.ZIP_LZMA),
            r"wiki.train.raw in .* unzips to more than the 600,000 bytes its header declares",
        ),
    }


_READ_TIME_CHECKS = (
    "lies about its size",
    "bzip2 understated size",
    "deflate understated size",
    "lzma understated size",
)


@pytest.mark.parametrize(
    "case",
    [
        "encrypted",
        "deflate64",
        "bomb",
        "lies about its size",
        "bzip2 raised compressed size",
        "deflate raised compressed size",
        "bzip2 understated size",
        "deflate understated size",
        "lzma understated size",
    ],
)
def test_zip_members_are_checked_before_anything_is_unzipped(tmp_path, case):
    make, message = _bad_zips()[case]
    zpath = tmp_path / "w.zip"
    zpath.write_bytes(make())
    with pytest.raises(UserError, match=message):
        download(tmp_path / "art", source_url=zpath.as_uri())
    assert published(tmp_path / "art") == []
    written = [p for p in (tmp_path / "art" / "corpus" / ".staging").rglob("*.txt")]
    assert case in _READ_TIME_CHECKS or written == [], "nothing extracted before the checks"
    assert not [p for p in written if p.name == "wiki.train.txt"], "the lying member's text was not kept"
    assert sum(p.stat().st_size for p in written) <= 600_000, "a member never yields more than its declared size"


def test_unzipped_total_is_bounded(tmp_path, monkeypatch):
    zpath = tmp_path / "w.zip"
    zpath.write_bytes(zips.tiny_zip("Total"))
    monkeypatch.setattr(unzip, "MAX_UNZIPPED_BYTES", 64)
    with pytest.raises(UserError, match=r"would unzip to \d+ B, more than the 64 B this stage accepts"):
        download(tmp_path / "art", source_url=zpath.as_uri())
