"""Zips a user could be handed by mistake: encrypted, deflate64, a member that lies about its size, a zip bomb."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

from flows.mirror import MEMBER, make_zip

TRAIN = MEMBER.format(split="train")


def small_members(repeat: int = 50) -> dict[str, str]:
    return {MEMBER.format(split=s): f" = T{s} = \n text {s} .\n" * repeat for s in ("train", "valid", "test")}


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
    return patch_member(make_zip(small_members()), TRAIN, flag_bits=0x1)


def deflate64_zip() -> bytes:
    """The train member marked Deflate64 (method 9), what Windows Explorer writes for large files."""
    return patch_member(make_zip(small_members()), TRAIN, method=9)


def bomb_zip(mib: int = 30) -> bytes:
    """A train member of ``mib`` MiB of one letter: ~1000x smaller deflated."""
    return make_zip(dict(small_members(), **{TRAIN: "a" * (mib << 20)}))


def lying_size_zip() -> bytes:
    """A stored train member whose headers declare 10 bytes (it holds more)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        for name, text in small_members().items():
            z.writestr(name, text)
    return patch_member(buf.getvalue(), TRAIN, file_size=10)


def _zip_with(train: bytes, method: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=method) as z:
        for name, text in small_members().items():
            z.writestr(name, train if name == TRAIN else text.encode())
    return buf.getvalue()


def raised_compressed_size_zip(method: int = zipfile.ZIP_BZIP2, mib: int = 8) -> bytes:
    """A train member of ``mib`` MiB whose compressed size is raised to size/19: its declared ratio passes the
    zip-bomb check."""
    size = mib << 20
    return patch_member(_zip_with(b"a" * size, method), TRAIN, compress_size=size // 19)


def understated_size_zip(method: int = zipfile.ZIP_BZIP2, declared: int = 600_000, mib: int = 16) -> bytes:
    """A train member that declares ``declared`` bytes (and their CRC-32) but inflates to ``mib`` MiB."""
    body = b"a" * (mib << 20)
    return patch_member(_zip_with(body, method), TRAIN, file_size=declared, crc=zlib.crc32(body[:declared]))
