"""The wikitext-103-raw-v1 zip as the tests about the zip build it (:func:`wikitext_zip`, the one builder), and zips
a user could be handed by mistake: encrypted, deflate64, a member that lies about its size, a zip bomb. A test that
only needs a corpus states its text through :mod:`tests.support.corpora` instead and never names a member."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from collections.abc import Mapping

from tasks.corpora.wikitext import MEMBERS

SPLITS = tuple(MEMBERS)  # the zip's splits, in the order the adapter lists them
TRAIN = MEMBERS["train"]


def wikitext_zip(splits: Mapping[str, str | bytes], *, method: int = zipfile.ZIP_DEFLATED) -> bytes:
    """A zip shaped like wikitext-103-raw-v1.zip: each split of ``splits`` (``{split: raw text}``, a str as UTF-8)
    as the adapter's member for it (``wikitext-103-raw/wiki.{split}.raw``), in the order given, compressed with
    ``method``. Timestamps are fixed, so the same splits give the same bytes (deflated: the demo mirror's zip)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for split, text in splits.items():
            info = zipfile.ZipInfo(MEMBERS[split], date_time=(2016, 9, 26, 0, 0, 0))
            info.compress_type = method
            info.external_attr = 0o644 << 16
            z.writestr(info, text.encode("utf-8") if isinstance(text, str) else text)
    return buf.getvalue()


def tiny_zip(word: str) -> bytes:
    """A zip of three one-line articles naming ``word`` (``" {word} text of the train split ."``): as many bytes
    for any word of the same length."""
    return wikitext_zip({s: f" = {word} {s} = \n {word} text of the {s} split .\n" for s in SPLITS})


def small_splits(repeat: int = 50) -> dict[str, str]:
    return {s: f" = T{s} = \n text {s} .\n" * repeat for s in SPLITS}


def patch_member(
    data: bytes,
    member: str,
    *,
    flag_bits: int | None = None,
    method: int | None = None,
    file_size: int | None = None,
    compress_size: int | None = None,
    crc: int | None = None,
) -> bytes:
    """``data`` (a zip) with one member's header fields rewritten in both its local and central headers."""
    buf = bytearray(data)
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        local = z.getinfo(member).header_offset
    central = next(i for i in _central_entries(data) if data[i + 46 : i + 46 + len(member)] == member.encode())
    for start, flags_at, method_at, size_at in ((local, 6, 8, 22), (central, 8, 10, 24)):
        if compress_size is not None:
            struct.pack_into("<I", buf, start + size_at - 4, compress_size)
        if crc is not None:
            struct.pack_into("<I", buf, start + size_at - 8, crc)
        if flag_bits is not None:
            struct.pack_into("<H", buf, start + flags_at, flag_bits)
        if method is not None:
            struct.pack_into("<H", buf, start + method_at, method)
        if file_size is not None:
            struct.pack_into("<I", buf, start + size_at, file_size)
    return bytes(buf)


def _central_entries(data: bytes):
    end = data.rindex(b"PK\x05\x06")
    count, _, offset = struct.unpack_from("<HII", data, end + 10)
    pos = offset
    for _ in range(count):
        yield pos
        n, m, k = struct.unpack_from("<HHH", data, pos + 28)
        pos += 46 + n + m + k


def encrypted_zip() -> bytes:
    """The train member marked encrypted (general purpose flag bit 0), as ``zip -e`` marks it."""
    return patch_member(wikitext_zip(small_splits()), TRAIN, flag_bits=0x1)


def deflate64_zip() -> bytes:
    """The train member marked Deflate64 (method 9), what Windows Explorer writes for large files."""
    return patch_member(wikitext_zip(small_splits()), TRAIN, method=9)


def bomb_zip(mib: int = 30) -> bytes:
    """A train member of ``mib`` MiB of one letter: ~1000x smaller deflated."""
    return wikitext_zip(dict(small_splits(), train="a" * (mib << 20)))


def lying_size_zip() -> bytes:
    """A stored train member whose headers declare 10 bytes (it holds more)."""
    return patch_member(wikitext_zip(small_splits(), method=zipfile.ZIP_STORED), TRAIN, file_size=10)


def raised_compressed_size_zip(method: int = zipfile.ZIP_BZIP2, mib: int = 8) -> bytes:
    """A train member of ``mib`` MiB whose compressed size is raised to size/19: its declared ratio passes the
    zip-bomb check."""
    size = mib << 20
    return patch_member(
        wikitext_zip(dict(small_splits(), train=b"a" * size), method=method), TRAIN, compress_size=size // 19
    )


def understated_size_zip(method: int = zipfile.ZIP_BZIP2, declared: int = 600_000, mib: int = 16) -> bytes:
    """A train member that declares ``declared`` bytes (and their CRC-32) but inflates to ``mib`` MiB."""
    body = b"a" * (mib << 20)
    return patch_member(
        wikitext_zip(dict(small_splits(), train=body), method=method),
        TRAIN,
        file_size=declared,
        crc=zlib.crc32(body[:declared]),
    )
