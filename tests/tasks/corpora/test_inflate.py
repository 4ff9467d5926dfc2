"""ISA-L's inflate (``isal_zlib``, what the stage uses) against zlib's (the specification): the same bytes from real
zips, and the same refusals of damaged members, lying sizes and bad CRCs."""

from __future__ import annotations

import io
import os
import re
import struct
import zipfile
import zlib
from pathlib import Path

import pytest
from isal import isal_zlib

from mygpt.errors import UserError
from tasks.corpora import unzip
from tests.support import zips

DATA = Path("/work/shared/data")
MODULES = {"zlib": zlib, "isal": isal_zlib}


def _real_zip(tmp_path: Path) -> Path:
    """Real text (WikiText-2, Tiny Shakespeare) deflated at several levels, random bytes (stored blocks inside the
    deflate stream), an empty member and a stored one, in one zip."""
    wiki = (DATA / "wikitext2-valid.txt").read_bytes()
    members = [
        ("wiki.l6", wiki, zipfile.ZIP_DEFLATED, 6),
        ("wiki.l1", wiki, zipfile.ZIP_DEFLATED, 1),
        ("wiki.l9", wiki * 2, zipfile.ZIP_DEFLATED, 9),
        ("shakespeare", (DATA / "tinyshakespeare.txt").read_bytes(), zipfile.ZIP_DEFLATED, 6),
        ("random", os.urandom(300_000) + wiki[:100_000], zipfile.ZIP_DEFLATED, 6),
        ("empty", b"", zipfile.ZIP_DEFLATED, 6),
        ("stored", wiki[:50_000], zipfile.ZIP_STORED, None),
    ]
    path = tmp_path / "real.zip"
    with zipfile.ZipFile(path, "w") as z:
        for name, data, method, level in members:
            z.writestr(zipfile.ZipInfo(name, date_time=(2016, 9, 26, 0, 0, 0)), data, method, level)
    return path


def _read(path: Path, member: str, deflate, piece_bytes: int = unzip.PIECE_BYTES) -> bytes:
    with zipfile.ZipFile(path) as zf:
        pieces = list(unzip.member_bytes(zf, member, "the zip", piece_bytes, deflate=deflate))
    if member != "stored":  # a stored member comes in the pieces it is read in
        assert all(len(p) <= piece_bytes for p in pieces), "every inflated piece stays within the bound"
    return b"".join(pieces)


def _error(path: Path, member: str, deflate, piece_bytes: int = unzip.PIECE_BYTES) -> str:
    with pytest.raises(UserError) as e:
        _read(path, member, deflate, piece_bytes)
    return str(e.value)


def test_the_stage_inflates_with_isal():
    assert unzip.DEFLATE is isal_zlib


@pytest.mark.parametrize("piece_bytes", [997, 65_536, unzip.PIECE_BYTES])
def test_isal_and_zlib_give_the_same_bytes_as_zipfile(tmp_path, piece_bytes):
    path = _real_zip(tmp_path)
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        expected = {name: zf.read(name) for name in names}
    for name in names:
        for deflate in MODULES.values():
            assert _read(path, name, deflate, piece_bytes) == expected[name], (name, deflate.__name__)


def test_the_crc32_is_the_same():
    data = (DATA / "wikitext2-valid.txt").read_bytes()
    assert isal_zlib.crc32(data) == zlib.crc32(data)
    assert isal_zlib.crc32(data[1000:], isal_zlib.crc32(data[:1000])) == zlib.crc32(data)


def _patched(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _member_data_span(data: bytes, member: str) -> tuple[int, int]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        info = z.getinfo(member)
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len
    return start, start + info.compress_size


def test_a_bad_crc_is_refused_the_same_way(tmp_path):
    good = _real_zip(tmp_path).read_bytes()
    path = _patched(tmp_path, "crc.zip", zips.patch_member(good, "wiki.l6", crc=0x12345678))
    errors = {name: _error(path, "wiki.l6", deflate) for name, deflate in MODULES.items()}
    assert errors["isal"] == errors["zlib"]
    assert re.fullmatch(
        r"wiki.l6 in the zip is damaged \(Bad CRC-32: [0-9a-f]{8}, its header says 12345678\); rerun to download it "
        r"again, or check source_url",
        errors["zlib"],
    ), errors["zlib"]


def test_a_cut_short_member_is_refused_the_same_way(tmp_path):
    good = _real_zip(tmp_path).read_bytes()
    start, end = _member_data_span(good, "wiki.l6")
    cut = zips.patch_member(good, "wiki.l6", compress_size=(end - start) // 2)  # the data stops half way
    path = _patched(tmp_path, "cut.zip", cut)
    errors = {name: _error(path, "wiki.l6", deflate, 65_536) for name, deflate in MODULES.items()}
    assert re.fullmatch(
        r"wiki.l6 in the zip is damaged \(it ends after [\d,]+ of the 1,121,681 bytes its header declares\); rerun "
        r"to download it again, or check source_url",
        errors["zlib"],
    ), errors["zlib"]
    assert errors["isal"] == errors["zlib"]


@pytest.mark.parametrize("where", [0.0, 0.3, 0.7])
def test_damaged_deflate_data_is_refused_the_same_way(tmp_path, where):
    good = _real_zip(tmp_path).read_bytes()
    start, end = _member_data_span(good, "wiki.l6")
    bad = bytearray(good)
    at = start + int((end - start) * where)
    bad[at : at + 64] = bytes(64)  # 64 zero bytes in the deflate stream: a stored block header, or garbage
    path = _patched(tmp_path, "bad.zip", bytes(bad))
    errors = {name: _error(path, "wiki.l6", deflate, 65_536) for name, deflate in MODULES.items()}
    shape = r"wiki.l6 in the zip is damaged \((?P<what>.*)\); rerun to download it again, or check source_url"
    assert all(re.fullmatch(shape, message) for message in errors.values()), errors
    # The same refusal; only the decoder's own words for invalid data differ ("invalid stored block lengths" in
    # zlib's, "Invalid deflate block found" in ISA-L's).
    same = {name: re.sub(r"(its deflate data is invalid: ).+(\); rerun)", r"\1...\2", e) for name, e in errors.items()}
    assert same["isal"] == same["zlib"], errors
    kinds = r"its deflate data is invalid: \.\.\.|it ends after [\d,]+ of the 1,121,681 bytes its header declares"
    assert re.fullmatch(kinds, re.fullmatch(shape, same["zlib"])["what"]), errors  # type: ignore[index]


def test_the_bound_on_what_a_member_unzips_to_holds_with_isal(tmp_path):
    path = _patched(tmp_path, "bomb.zip", zips.understated_size_zip(zipfile.ZIP_DEFLATED, declared=600_000, mib=16))
    for deflate in MODULES.values():
        message = _error(path, zips.TRAIN, deflate, 65_536)
        stopped = int(re.search(r"stopped after ([\d,]+)\)", message)[1].replace(",", ""))  # type: ignore[index]
        assert "unzips to more than the 600,000 bytes its header declares" in message, message
        assert 600_000 < stopped <= 600_000 + 65_536, "it stops at the first piece past the declared size"
