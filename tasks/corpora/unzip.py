"""Reading the wikitext zip: checks before anything is unzipped (:func:`check_members`), members inflated in bounded
pieces (:func:`member_bytes`), and the reader and writer threads that let inflating, stripping and writing overlap."""

from __future__ import annotations

import bz2
import codecs
import collections
import concurrent.futures
import hashlib
import lzma
import os
import queue
import struct
import threading
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType

from mygpt.errors import UserError
from tasks.core.report import human_bytes

try:
    from isal import isal_zlib
except ImportError:  # pragma: no cover (a dependency; plain zlib inflates the same bytes, slower)
    isal_zlib = None  # type: ignore[assignment]

#: What raw-deflate members are inflated and every member's CRC-32 is computed with: ISA-L's zlib-compatible
#: ``isal_zlib`` when it imports (the same bytes, in about half zlib's time), else :mod:`zlib`, the specification
#: (``tests/tasks/corpora/test_inflate.py`` holds the two equal on real text and on damaged members).
DEFLATE: ModuleType = isal_zlib or zlib
#: What either module raises on invalid deflate data.
_DEFLATE_ERRORS: tuple[type[Exception], ...] = (zlib.error, DEFLATE.error)

PIECE_BYTES = 4 << 20
#: How much of a file :class:`BlockWriter` writes before it starts that file's writeback to disk.
SYNC_EVERY_BYTES = 64 << 20
#: The real zip unzips to ~520 MiB (2.8x): these bounds are ~10x that.
MAX_UNZIPPED_BYTES = 4 << 30  # the most the members may declare, together
MAX_RATIO = 20  # declared / compressed size of the members (text deflates 3-4x; bombs 100-1000x)
#: The compression methods Python's zipfile reads (stored, deflate, bzip2, lzma).
READABLE_METHODS = {
    zipfile.ZIP_STORED: "stored",
    zipfile.ZIP_DEFLATED: "deflate",
    zipfile.ZIP_BZIP2: "bzip2",
    zipfile.ZIP_LZMA: "lzma",
}
_METHOD_NAMES = {9: "deflate64", 12: "bzip2", 14: "lzma", 93: "zstandard", 95: "xz", 98: "ppmd", 99: "AES"}


# ---- what a zip may unpack to -------------------------------------------------------------------------
def open_zip(zip_path: Path, source: str) -> zipfile.ZipFile:
    """The zip at ``zip_path`` (fetched from ``source``, already redacted); ``UserError`` when it is not one."""
    try:
        return zipfile.ZipFile(zip_path)
    except zipfile.BadZipFile:
        raise UserError(
            f"{source} is not a zip archive; source_url must point at wikitext-103-raw-v1.zip (or a copy of it)"
        ) from None


def check_members(zip_path: Path, source: str, members: Iterable[str]) -> None:
    """Refuse, before anything is unzipped, members that are encrypted, compressed with a method Python cannot read,
    or declare more than :data:`MAX_UNZIPPED_BYTES` or :data:`MAX_RATIO` times their compressed size."""
    with open_zip(zip_path, source) as zf:
        infos = [zf.getinfo(name) for name in members if name in zf.NameToInfo]
        ends = _region_ends(zf)
        for info in infos:
            room = ends[info.header_offset] - info.header_offset
            if info.compress_size > room:
                raise UserError(
                    f"{info.filename} in {source} declares {info.compress_size:,} compressed bytes, but only "
                    f"{room:,} bytes (header included) are there before the next entry: the zip lies about its "
                    "sizes, as a zip bomb does; nothing was extracted: check source_url"
                )
            if info.flag_bits & 0x1:
                raise UserError(
                    f"{info.filename} in {source} is encrypted; the wikitext-103-raw-v1 zip is not: "
                    "check source_url, or give an unencrypted copy"
                )
            if info.compress_type not in READABLE_METHODS:
                raise UserError(
                    f"{info.filename} in {source} is compressed with method {info.compress_type} "
                    f"({_METHOD_NAMES.get(info.compress_type, 'unknown')}), which Python's zipfile "
                    f"cannot read (it reads {', '.join(READABLE_METHODS.values())}); recompress it, "
                    "e.g. with `zip -Z deflate`, or check source_url"
                )
        declared = sum(i.file_size for i in infos)
        packed = min(sum(i.compress_size for i in infos), zip_path.stat().st_size)  # what is really there
        if declared > MAX_UNZIPPED_BYTES:
            raise UserError(
                f"{source} would unzip to {human_bytes(declared)}, more than the "
                f"{human_bytes(MAX_UNZIPPED_BYTES)} this stage accepts (wikitext-103 is ~520 MB); "
                "nothing was extracted: check source_url"
            )
        if declared > MAX_RATIO * max(packed, 1) and declared > 1 << 20:
            raise UserError(
                f"{source} would unzip {human_bytes(packed)} into {human_bytes(declared)} "
                f"({declared / max(packed, 1):,.0f}x; text compresses 3-4x, this stage accepts at most "
                f"{MAX_RATIO}x): it looks like a zip bomb, not wikitext; nothing was extracted: check "
                "source_url"
            )


def _region_ends(zf: zipfile.ZipFile) -> dict[int, int]:
    """For each entry's local header offset, where its region ends: the next entry's header, or the central
    directory."""
    starts = sorted({i.header_offset for i in zf.infolist()})
    end_of_data = getattr(zf, "start_dir", None)
    if end_of_data is None:
        end_of_data = Path(str(zf.filename)).stat().st_size
    return {a: b for a, b in zip(starts, [*starts[1:], end_of_data])}


# ---- reading a member, bounded -------------------------------------------------------------------------
def _damaged(info: zipfile.ZipInfo, source: str, what: str) -> UserError:
    return UserError(
        f"{info.filename} in {source} is damaged ({what}); rerun to download it again, or check source_url"
    )


def _lies(info: zipfile.ZipInfo, source: str, produced: int, limit: int) -> UserError:
    bound = f"the {limit:,} bytes its header declares" if limit == info.file_size else f"{human_bytes(limit)}"
    return UserError(
        f"{info.filename} in {source} unzips to more than {bound} (stopped after {produced:,}): the zip lies "
        "about its sizes, as a zip bomb does; nothing was published: check source_url"
    )


def _compressed(f, info: zipfile.ZipInfo, source: str) -> Iterator[bytes]:
    """The member's compressed bytes, as its central directory entry sizes them, in pieces of up to 1 MiB."""
    f.seek(info.header_offset)
    head = f.read(30)
    if len(head) < 30 or head[:4] != b"PK\x03\x04":
        raise _damaged(info, source, "no local file header where the central directory points")
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    f.seek(info.header_offset + 30 + name_len + extra_len)
    left = info.compress_size
    while left:
        chunk = f.read(min(left, 1 << 20))
        if not chunk:
            raise _damaged(info, source, f"the file ends {left:,} bytes before the member's compressed data does")
        left -= len(chunk)
        yield chunk


def _lzma_decompressor(data: Iterator[bytes], info: zipfile.ZipInfo, source: str):
    """A raw LZMA1 decompressor for a zip's lzma member, whose data starts with a 4-byte header and the
    properties (what ``zipfile.LZMADecompressor`` reads, without its unbounded ``decompress``)."""
    head = b""
    for chunk in data:
        head += chunk
        if len(head) >= 4 and len(head) >= 4 + struct.unpack("<H", head[2:4])[0]:
            break
    if len(head) < 4:
        raise _damaged(info, source, "its lzma header is cut short")
    (psize,) = struct.unpack("<H", head[2:4])
    if len(head) < 4 + psize:
        raise _damaged(info, source, "its lzma properties are cut short")
    filters = [lzma._decode_filter_properties(lzma.FILTER_LZMA1, head[4 : 4 + psize])]  # type: ignore[attr-defined]
    return lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=filters), head[4 + psize :]


def member_bytes(
    zf: zipfile.ZipFile, name: str, source: str, piece_bytes: int = PIECE_BYTES, deflate: ModuleType = DEFLATE
) -> Iterator[bytes]:
    """Member ``name`` inflated in pieces of at most ``piece_bytes``, never more than its declared size, whatever the
    method; ``UserError`` naming it when it holds more, ends early, fails its CRC-32 or cannot be inflated.
    ``deflate``: the zlib-compatible module that inflates deflate members and computes the CRC-32 (:data:`DEFLATE`;
    :mod:`zlib` gives the same bytes and the same errors)."""
    info = zf.getinfo(name)
    limit = min(info.file_size, MAX_UNZIPPED_BYTES)
    produced = crc = 0
    with open(str(zf.filename), "rb") as f:
        compressed = _compressed(f, info, source)
        try:
            for out in _inflate(compressed, info, source, piece_bytes, deflate):
                produced += len(out)
                if produced > limit:
                    raise _lies(info, source, produced, limit)
                crc = deflate.crc32(out, crc)
                yield out
        except UserError:
            raise
        except _DEFLATE_ERRORS as e:  # the two modules word it differently: the same message names what is wrong
            raise _damaged(info, source, f"its deflate data is invalid: {e}") from None
        except (lzma.LZMAError, OSError, EOFError, ValueError) as e:
            raise _damaged(info, source, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from None
    if produced < info.file_size:
        raise _damaged(info, source, f"it ends after {produced:,} of the {info.file_size:,} bytes its header declares")
    if crc != info.CRC:
        raise _damaged(info, source, f"Bad CRC-32: {crc:08x}, its header says {info.CRC:08x}")


def _inflate(
    data: Iterator[bytes], info: zipfile.ZipInfo, source: str, piece_bytes: int, deflate: ModuleType = zlib
) -> Iterator[bytes]:
    """``data`` (compressed with ``info``'s method) inflated, each decompressor call bounded to ``piece_bytes``;
    deflate by ``deflate`` (a zlib-compatible module: ``decompressobj``, ``unconsumed_tail``, ``eof``)."""
    method = info.compress_type
    if method == zipfile.ZIP_STORED:
        yield from data
        return
    pending = b""
    if method == zipfile.ZIP_DEFLATED:
        d = deflate.decompressobj(-15)
        for chunk in data:
            pending = chunk
            while pending and not d.eof:
                out = d.decompress(pending, piece_bytes)
                pending = d.unconsumed_tail
                if out:
                    yield out
            if d.eof:
                return
        while not d.eof and (out := d.decompress(b"", piece_bytes)):
            yield out
        return
    if method == zipfile.ZIP_BZIP2:
        dec: bz2.BZ2Decompressor | lzma.LZMADecompressor = bz2.BZ2Decompressor()
    elif method == zipfile.ZIP_LZMA:
        dec, pending = _lzma_decompressor(data, info, source)
    else:
        raise _damaged(info, source, f"compression method {method} cannot be read")
    chunks = iter(data)
    while not dec.eof:
        if dec.needs_input and not pending:
            pending = next(chunks, b"")
            if not pending:
                return  # no more input (an lzma member without an end marker ends by its size)
        out = dec.decompress(pending, piece_bytes)
        pending = b""
        if out:
            yield out


# ---- a member's UTF-8, inflated in a thread ---------------------------------------------------------------
def utf8_pieces(raw_pieces: Iterable[bytes], name: str, source: str) -> Iterator[tuple[bytes, int]]:
    """The bytes of what reading ``raw_pieces`` (a member's bytes) as strict UTF-8 with universal newlines gives
    (what ``open(path, encoding="utf-8")`` reads, encoded again: ``\r\n`` and a lone ``\r`` become ``\n``), in pieces
    that each end at a character boundary, each with the raw bytes read so far. ``UserError`` naming the member
    ``name`` and the byte offset on invalid UTF-8. The decoder checks every byte, but its text is dropped: the
    bytes are what it decoded, and stripping them (:mod:`tasks.corpora.header_strip`) spares decoding all the
    text for good and encoding it back."""
    dec = codecs.getincrementaldecoder("utf-8")("strict")
    fed = 0
    held = b""  # the start of a character that the previous piece cut in two (what the decoder holds)
    carry_cr = False
    pieces = iter(raw_pieces)
    while True:
        raw = next(pieces, b"")
        final = not raw
        try:
            dec.decode(raw, final=final)
        except UnicodeDecodeError as e:
            offset = fed - len(held) + e.start
            raise UserError(
                f"{name} in {source} is not valid UTF-8: byte {e.object[e.start]:#04x} at offset {offset:,} "
                f"({e.reason}); the archive is not the wikitext-103-raw-v1 zip or is damaged: check "
                "source_url and expected_sha256"
            ) from None
        fed += len(raw)
        data = held + raw if held else raw
        cut = len(data) - len(dec.getstate()[0])
        data, held = (data[:cut], data[cut:]) if cut < len(data) else (data, b"")
        if carry_cr:
            data, carry_cr = b"\r" + data, False
        if not final and data.endswith(b"\r"):
            data, carry_cr = data[:-1], True
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if data:
            yield data, fed
        if final:
            return


def member_utf8(zf: zipfile.ZipFile, member: str, source: str) -> Iterator[tuple[bytes, int]]:
    """:func:`utf8_pieces` of ``member``, inflated in a reader thread up to a few pieces ahead
    (:func:`read_ahead`; inflating lets go of the GIL, so it runs beside the checking and stripping here)."""
    return utf8_pieces(read_ahead(member_bytes(zf, member, source)), member, source)


def read_ahead(items: Iterator, depth: int = 4) -> Iterator:
    """The items of ``items``, produced by a thread up to ``depth`` ahead of the consumer (errors re-raised here).
    A consumer that stops early (its own error, or it drops this generator) lets the thread end: every put the
    thread makes, its end and its error included, gives up once the consumer has gone."""
    q: queue.Queue = queue.Queue(depth)
    stop = threading.Event()
    done = object()

    def put(entry: tuple) -> bool:
        """Queue ``entry`` unless the consumer has gone (it then never takes another: a plain ``put`` into the
        full queue would wait for good, and so would whoever joins this thread); whether it was queued."""
        while not stop.is_set():
            try:
                q.put(entry, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
            put((done, None))
        except BaseException as e:
            put((done, e))

    thread = threading.Thread(target=produce, name="corpus-reader", daemon=True)
    thread.start()
    try:
        while True:
            item, error = q.get()
            if item is done:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        thread.join()


class BlockWriter:
    """Writes blocks in one background thread, in order (file writes let go of the GIL), at
    most a few blocks behind; :meth:`drain` waits for it and re-raises its errors. Every ``sync_every`` bytes of a
    file it starts that file's ``fdatasync`` in a third thread, so the disk writes while the text is still being
    made and the ``fsync`` that ends the file has little left to wait for (it waited for all of it). It also
    hashes what it writes to each file, in its thread (sha256 lets go of the GIL on such blocks): :meth:`written`
    gives a file's size and sha256 from the very bytes written, so nobody has to read the file back for them."""

    def __init__(self, depth: int = 4, sync_every: int | None = None) -> None:
        self.depth = depth
        self.sync_every = sync_every or SYNC_EVERY_BYTES
        self.pending: collections.deque = collections.deque()
        self.syncs: collections.deque = collections.deque()
        self.unsynced: dict[int, int] = {}  # a file's descriptor -> bytes written since its last sync started
        self.sums: dict[object, list] = {}  # a file object -> [bytes written to it, its sha256 so far]

    def __enter__(self) -> BlockWriter:
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="corpus-writer")
        self.sync_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="corpus-sync")
        return self

    def __exit__(self, *exc) -> None:
        self.settle()
        self.pool.shutdown(wait=True)
        self.sync_pool.shutdown(wait=True)

    def _write(self, data: bytes, files, after) -> None:
        for f in files:
            f.write(data)
            total = self.sums.setdefault(f, [0, hashlib.sha256()])
            total[0] += len(data)
            total[1].update(data)
            fd = f.fileno()
            written = self.unsynced.get(fd, 0) + len(data)
            if written >= self.sync_every:
                f.flush()
                self.syncs.append(self.sync_pool.submit(os.fdatasync, fd))
                written = 0
            self.unsynced[fd] = written
        if after is not None:
            after(data)

    def write(self, data: bytes, *files, after: Callable[[bytes], None] | None = None) -> None:
        """Write ``data`` to each of ``files``, then call ``after(data)`` (in the writer thread too)."""
        self.pending.append(self.pool.submit(self._write, data, files, after))
        while len(self.pending) > self.depth:
            self.pending.popleft().result()

    def written(self, f) -> tuple[int, str]:
        """``(size, sha256)`` of all that was written to ``f`` (after :meth:`drain`: every block written); ``f``
        is forgotten."""
        size, sha = self.sums.pop(f, (0, hashlib.sha256()))
        return size, sha.hexdigest()

    def settle(self) -> None:
        """Wait until every block is written and every sync started is done (errors are kept for :meth:`drain`):
        a file may then be closed (its descriptor is used by no thread)."""
        concurrent.futures.wait(self.pending)
        concurrent.futures.wait(self.syncs)
        self.unsynced.clear()

    def drain(self) -> None:
        """Wait until every block is written and synced as started; re-raise the first error."""
        while self.pending:
            self.pending.popleft().result()
        while self.syncs:
            self.syncs.popleft().result()
