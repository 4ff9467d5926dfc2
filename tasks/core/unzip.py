"""Reading the wikitext zip: opening and checking it before anything is unzipped, decoding a member, and the
threads that let inflating, stripping and writing run side by side.

**Checks** (:func:`check_members`, item 6 of issue 10): encrypted members, compression methods Python cannot
read, and members whose declared sizes exceed :data:`MAX_UNZIPPED_BYTES` or :data:`MAX_RATIO` times their
compressed size (zip bombs) are refused. Reading a member never yields more than its declared size
(``zipfile`` stops there and checks the CRC), so those checks bound what is written.

**Threads** (issue 14): :func:`member_text` inflates and decodes a member in a reader thread (:func:`read_ahead`;
zlib lets go of the GIL) while the caller strips the text; :class:`BlockWriter` writes and hashes the results
in a writer thread (file writes and sha256 let go of the GIL too).
"""

from __future__ import annotations

import codecs
import collections
import concurrent.futures
import queue
import threading
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from mygpt.errors import UserError
from tasks.core.store import human_bytes

PIECE_BYTES = 4 << 20
#: Bounds (item 6 of issue 10). The real zip unzips to ~520 MiB (2.8x): these are ~10x that.
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
    """Refuse, before anything is unzipped, a zip whose ``members`` cannot or should not be read: encrypted,
    compressed with a method Python cannot read, or declaring more than :data:`MAX_UNZIPPED_BYTES` or
    :data:`MAX_RATIO` times their compressed size. (A member that lies about its size fails its CRC check
    when read: ``zipfile`` never returns more than the declared size.)"""
    with open_zip(zip_path, source) as zf:
        infos = [zf.getinfo(name) for name in members if name in zf.NameToInfo]
        for info in infos:
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
        packed = sum(i.compress_size for i in infos)
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


# ---- decoding a member, in threads ----------------------------------------------------------------------
def decode_member(
    zf: zipfile.ZipFile, name: str, source: str, piece_bytes: int = PIECE_BYTES, counter: dict | None = None
) -> Iterator[str]:
    """Decode a zip member as strict UTF-8 with universal newlines (what ``open(path, encoding="utf-8")``
    gives), in pieces. ``UserError`` naming the member and byte offset on invalid UTF-8."""
    dec = codecs.getincrementaldecoder("utf-8")("strict")
    fed = 0
    carry_cr = False
    with zf.open(name) as f:
        while True:
            raw = f.read(piece_bytes)
            final = not raw
            pending = len(dec.getstate()[0])
            try:
                text = dec.decode(raw, final=final)
            except UnicodeDecodeError as e:
                offset = fed - pending + e.start
                raise UserError(
                    f"{name} in {source} is not valid UTF-8: byte {e.object[e.start]:#04x} at offset {offset:,} "
                    f"({e.reason}); the archive is not the wikitext-103-raw-v1 zip or is damaged: check "
                    "source_url and expected_sha256"
                ) from None
            fed += len(raw)
            if counter is not None:
                counter["raw_bytes"] = fed
            if carry_cr:
                text, carry_cr = "\r" + text, False
            if not final and text.endswith("\r"):
                text, carry_cr = text[:-1], True
            if "\r" in text:
                text = text.replace("\r\n", "\n").replace("\r", "\n")
            if text:
                yield text
            if final:
                return


def member_text(zf: zipfile.ZipFile, member: str, source: str) -> Iterator[tuple[str, int]]:
    """:func:`decode_member`'s pieces of ``member``, each with the raw bytes read so far, inflated and decoded in a
    reader thread up to a few pieces ahead of the consumer (:func:`read_ahead`)."""
    counter: dict = {"raw_bytes": 0}

    def unzipped():  # in the reader thread: inflating (zlib lets go of the GIL) runs beside the consumer
        for piece in decode_member(zf, member, source, counter=counter):
            yield piece, counter["raw_bytes"]

    return read_ahead(unzipped())


def read_ahead(items: Iterator, depth: int = 4) -> Iterator:
    """The items of ``items``, produced by a thread up to ``depth`` ahead of the consumer (errors re-raised here)."""
    q: queue.Queue = queue.Queue(depth)
    stop = threading.Event()
    done = object()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        pass
                if stop.is_set():
                    return
            q.put((done, None))
        except BaseException as e:
            q.put((done, e))

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
    """Writes and hashes blocks in one background thread, in order (file writes and sha256 let go of the GIL), at
    most a few blocks behind; :meth:`drain` waits for it and re-raises its errors."""

    def __init__(self, depth: int = 4) -> None:
        self.depth = depth
        self.pending: collections.deque = collections.deque()

    def __enter__(self) -> BlockWriter:
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="corpus-writer")
        return self

    def __exit__(self, *exc) -> None:
        self.settle()
        self.pool.shutdown(wait=True)

    @staticmethod
    def _write(data: bytes, targets) -> None:
        for f, sha in targets:
            f.write(data)
            sha.update(data)

    def write(self, data: bytes, *targets) -> None:
        """Write ``data`` to each ``(file, sha256)`` target and add it to the hash."""
        self.pending.append(self.pool.submit(self._write, data, targets))
        while len(self.pending) > self.depth:
            self.pending.popleft().result()

    def settle(self) -> None:
        """Wait until every block is written (errors are kept for :meth:`drain`)."""
        concurrent.futures.wait(self.pending)

    def drain(self) -> None:
        """Wait until every block is written; re-raise the first error."""
        while self.pending:
            self.pending.popleft().result()
