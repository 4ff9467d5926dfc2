"""The threaded unzip/strip/write pipeline writes exactly what one pass would, or nothing."""

from __future__ import annotations

import threading
import zipfile

import pytest

from flows.mirror import MEMBER, make_zip
from mygpt.errors import UserError
from tasks.corpus import extract_corpus
from tests.support.corpus_runs import CHAPTER_RE


def _zip(tmp_path, train: str, **extra) -> str:
    path = tmp_path / "w.zip"
    path.write_bytes(
        make_zip(
            {
                MEMBER.format(split="train"): train,
                MEMBER.format(split="valid"): " = V = \n v\n",
                MEMBER.format(split="test"): " t\n",
                **extra,
            }
        )
    )
    return path


def test_extract_writes_what_one_pass_would(tmp_path, wikitext2_text):
    zpath = _zip(tmp_path, wikitext2_text)
    out = tmp_path / "out"
    out.mkdir()
    m = extract_corpus(zpath, out, source="test", block_chars=5000)  # many blocks through the threads
    train = CHAPTER_RE.sub("", wikitext2_text)
    assert (out / "wiki.train.txt").read_text(encoding="utf-8") == train
    assert (out / "wikipedia.txt").read_text(encoding="utf-8") == train + " v\n" + " t\n"
    assert m["splits"]["train"]["bytes"] == len(train.encode()) and m["wikipedia"]["chars"] == len(train) + 6
    assert not [t for t in threading.enumerate() if t.name.startswith(("corpus-reader", "corpus-writer"))]


def test_a_damaged_member_fails_in_the_reader_thread_and_writes_nothing(tmp_path, wikitext2_text):
    zpath = _zip(tmp_path, wikitext2_text)
    data = bytearray(zpath.read_bytes())
    with zipfile.ZipFile(zpath) as z:
        info = z.getinfo(MEMBER.format(split="train"))
    start = info.header_offset + 30 + len(info.filename) + 2000  # inside the deflate stream
    data[start : start + 64] = bytes(64)
    zpath.write_bytes(bytes(data))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UserError, match=r"wiki\.train\.raw in test is"):
        extract_corpus(zpath, out, source="test", block_chars=5000)
    assert list(out.iterdir()) == []  # no split, no wikipedia.txt, no temp file
    assert not [t for t in threading.enumerate() if t.name.startswith(("corpus-reader", "corpus-writer"))]


def test_the_writer_starts_each_files_writeback_as_it_goes_and_a_failed_sync_fails_the_extract(
    tmp_path, wikitext2_text, monkeypatch
):
    import os

    from tasks.wikitext import unzip

    synced: list[tuple[str, int]] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append((os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), os.fstat(fd).st_size))
        real(fd)

    monkeypatch.setattr(unzip, "SYNC_EVERY_BYTES", 200_000)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    zpath = _zip(tmp_path, wikitext2_text)
    out = tmp_path / "out"
    out.mkdir()
    extract_corpus(zpath, out, source="test", block_chars=5000)
    train = CHAPTER_RE.sub("", wikitext2_text).encode()
    assert (out / "wiki.train.txt").read_bytes() == train  # the same bytes
    # both files being written had their writeback started before they were whole (the temp names)
    names = {name.split(".tmp")[0].rsplit(".", 1)[0] for name, _ in synced}
    assert names == {".wiki.train.txt", ".wikipedia.txt"}, synced
    assert all(0 < size < len(train) + 100 for _, size in synced)
    assert not [t for t in threading.enumerate() if t.name.startswith("corpus-sync")]

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)
    again = tmp_path / "again"
    again.mkdir()
    with pytest.raises(OSError, match="Input/output error"):
        extract_corpus(zpath, again, source="test", block_chars=5000)
    assert list(again.iterdir()) == []  # nothing half-written left
