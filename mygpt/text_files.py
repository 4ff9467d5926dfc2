"""Reading a user's UTF-8 text file (``mygpt train``, ``mygpt tokenizer``), with the one set of errors for a bad one."""

from __future__ import annotations

import os

from mygpt.errors import UserError
from mygpt.regular_files import open_regular

__all__ = ["read_text", "utf8_prefix"]


def read_text(path: str, empty_ok: bool = False) -> tuple[str, bytes]:
    """The text of the UTF-8 file ``path`` and its bytes; ``UserError`` (which file, what is wrong, what to do)
    when it is missing, a directory, not a regular file (a device such as ``/dev/zero`` has no end; a FIFO is
    never waited on), unreadable, not UTF-8, or empty unless ``empty_ok`` (encoding nothing is fine; training on
    nothing is not)."""
    if not os.path.exists(path):
        raise UserError(f"text file {path} does not exist")
    if os.path.isdir(path):
        raise UserError(f"text file {path} is a directory; give a UTF-8 text file")
    try:
        with open_regular(path, "text file", "give a UTF-8 text file") as f:
            raw = f.read()
    except OSError as e:
        raise UserError(f"cannot read text file {path}: {e.strerror or e}") from e
    if not raw and not empty_ok:
        raise UserError(f"text file {path} is empty; give a text file with some content")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(
            f"text file {path} is not valid UTF-8 (bad byte 0x{raw[e.start]:02x} at byte offset {e.start:,}); "
            f"convert it to UTF-8"
        ) from e
    return text, raw


def utf8_prefix(raw: bytes, n: int) -> str:
    """The first ``n`` bytes of ``raw``, cut back to a character boundary, decoded."""
    if n <= 0 or n >= len(raw):
        return raw.decode("utf-8")
    while n > 0 and (raw[n] & 0xC0) == 0x80:  # raw[n] is a continuation byte: the cut splits a character
        n -= 1
    return raw[:n].decode("utf-8")
