"""The threaded unzip/strip/write pipeline writes exactly what one pass would, or nothing."""

from __future__ import annotations

import queue
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mygpt.errors import UserError
from tasks.corpora.unzip import check_members, open_zip, read_ahead, utf8_pieces
from tasks.corpora.wikitext import DAMAGED_HINT, MEMBERS, zip_streams
from tasks.corpora.writer import ZIP_DAMAGED, write_splits
from tests.support import zips
from tests.support.corpus_runs import CHAPTER_RE


def extract_corpus(zip_path, out_dir, *, source: str, **options) -> dict:
    """The zip at ``zip_path`` (checked) through the writer into ``out_dir``: what the corpus stage's build does
    once the zip is fetched (its metrics: ``splits`` and ``split_files``)."""
    check_members(zip_path, source, MEMBERS.values())
    with open_zip(zip_path, source) as zf:
        streams = zip_streams(zf, source)
        raw = sum(s.raw_bytes for s in streams)
        return write_splits(streams, out_dir, raw_total=raw, damaged=ZIP_DAMAGED, damaged_hint=DAMAGED_HINT, **options)


def joined_splits_of(out, m) -> bytes:
    """The split files in the order the writer lists them (what ``cat`` of them gives)."""
    return b"".join((out / f["text"]).read_bytes() for f in m["split_files"])


def _zip(tmp_path, train: str) -> Path:
    path = tmp_path / "w.zip"
    path.write_bytes(zips.wikitext_zip({"train": train, "valid": " = V = \n v\n", "test": " t\n"}))
    return path


def test_extract_writes_what_one_pass_would(tmp_path, wikitext2_text):
    zpath = _zip(tmp_path, wikitext2_text)
    out = tmp_path / "out"
    out.mkdir()
    m = extract_corpus(zpath, out, source="test", block_chars=5000)  # many blocks through the threads
    train = CHAPTER_RE.sub("", wikitext2_text)
    assert (out / "wiki.train.txt").read_text(encoding="utf-8") == train
    assert joined_splits_of(out, m) == (train + " v\n" + " t\n").encode()
    assert m["splits"]["train"]["bytes"] == len(train.encode())
    assert sum(st["chars"] for st in m["splits"].values()) == len(train) + 6
    assert not [t for t in threading.enumerate() if t.name.startswith(("corpus-reader", "corpus-writer"))]


def test_a_damaged_member_fails_in_the_reader_thread_and_writes_nothing(tmp_path, wikitext2_text):
    zpath = _zip(tmp_path, wikitext2_text)
    data = bytearray(zpath.read_bytes())
    with zipfile.ZipFile(zpath) as z:
        info = z.getinfo(zips.TRAIN)
    start = info.header_offset + 30 + len(info.filename) + 2000  # inside the deflate stream
    data[start : start + 64] = bytes(64)
    zpath.write_bytes(bytes(data))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UserError, match=r"wiki\.train\.raw in test is"):
        extract_corpus(zpath, out, source="test", block_chars=5000)
    assert list(out.iterdir()) == []  # no split, no temp file
    assert not [t for t in threading.enumerate() if t.name.startswith(("corpus-reader", "corpus-writer"))]


def test_the_writer_starts_each_files_writeback_as_it_goes_and_a_failed_sync_fails_the_extract(
    tmp_path, wikitext2_text, monkeypatch
):
    import os

    from tasks.corpora import unzip

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
    assert names == {".wiki.train.txt"}, synced
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


_RAW = st.sampled_from(
    [
        b"a",
        b"\n",
        b"\r",
        b"\r\n",
        b" = T = \n",
        "é中\u3000\xa0\u2028".encode(),
        b"\xe4",
        b"\xb8",
        b"\xad",
        b"\xff",
        b"\xc3",
    ]
)


@settings(max_examples=800, deadline=None)
@given(st.lists(_RAW, max_size=20), st.lists(st.integers(0, 40), max_size=4))
def test_utf8_pieces_are_the_text_read_in_text_mode_or_its_decode_error(bits, cuts):
    """What ``utf8_pieces`` gives, however the member's bytes come cut: the UTF-8 of ``open(..., encoding="utf-8")``'s
    text, each piece whole characters; or, for bytes that are not UTF-8, the error the stage has always given, with
    the offset and reason of decoding the whole at once."""
    raw = b"".join(bits)
    at = sorted({min(c, len(raw)) for c in cuts} | {0, len(raw)})
    pieces = [raw[a:b] for a, b in zip(at, at[1:]) if b > a]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        want = f"m in test is not valid UTF-8: byte {raw[e.start]:#04x} at offset {e.start:,} ({e.reason});"
        with pytest.raises(UserError) as got:
            list(utf8_pieces(pieces, "m", "test"))
        assert str(got.value).startswith(want)
        return
    got = list(utf8_pieces(pieces, "m", "test"))
    assert b"".join(p for p, _ in got) == text.replace("\r\n", "\n").replace("\r", "\n").encode()
    assert all(p.decode("utf-8") for p, _ in got) and (not got or got[-1][1] == len(raw))


def test_extract_over_wide_whitespace_and_crlf_writes_what_the_chapter_writes(tmp_path, wikitext2_text):
    """Text in which ``\\s`` of a str pattern and of a bytes pattern differ around ``= Title =`` lines, with CRLF
    and lone CR line ends and characters cut across the unzip's pieces: the files are the chapter's bytes and the
    metrics count what the str text has."""
    from tests.support.corpus_runs import chapter_wikipedia_txt

    odd = " a\r\n\xa0= Tïtle =\xa0\r\n\u3000\n 中文 ,\r\x1c= B =\x1f\n\u2028\n = = S = = \n x\n"
    train = (odd + wikitext2_text[:200_000]) * 3 + odd
    zbytes = _zip(tmp_path, train).read_bytes()
    out = tmp_path / "out"
    out.mkdir()
    m = extract_corpus(tmp_path / "w.zip", out, source="test", block_chars=5000, article_index=True)
    assert joined_splits_of(out, m) == chapter_wikipedia_txt(zbytes, tmp_path / "chapter")
    text = train.replace("\r\n", "\n").replace("\r", "\n")
    want, n = CHAPTER_RE.subn("", text)
    st_ = m["splits"]["train"]
    assert (out / "wiki.train.txt").read_bytes() == want.encode()
    assert (st_["bytes"], st_["chars"], st_["headers_stripped"]) == (len(want.encode()), len(want), n)
    assert (st_["lines"], st_["raw_lines"]) == (want.count("\n") + (not want.endswith("\n")), text.count("\n"))
    titles, removed = [], 0
    for mt in CHAPTER_RE.finditer(text):
        if mt.group().lstrip().startswith("= "):
            titles.append(len(want[: mt.start() - removed].encode()))
        removed += len(mt.group())
    assert np.load(out / "wiki.train.articles.npy").tolist() == titles and len(titles) > 4


def _queue_filled(reader: threading.Thread) -> None:
    """Wait until ``reader`` (a :func:`read_ahead` thread) has filled its queue: it has nothing left to do but put
    its next entry (a liveness bound, not a timing: it fills it at once)."""
    found = [reader._target]  # type: ignore[attr-defined]
    for f in found:  # the functions it closes over, and theirs
        found.extend(c.cell_contents for c in getattr(f, "__closure__", None) or ())
    q = next(x for x in found if isinstance(x, queue.Queue))
    for _ in range(6000):  # a minute on a loaded machine
        if q.full():
            return
        time.sleep(0.01)
    raise AssertionError("the reader never filled its queue")


def test_a_member_refused_as_not_utf8_lets_its_reader_thread_end(tmp_path):
    """A stored member whose first MiB holds a byte that is not UTF-8, with exactly as many pieces after it as the
    reader queues: the stage's error, and once its caller lets go of the error (as Prefect does after keeping a
    task's exception), the reader thread ends and the caller goes on (it used to wait for it for good)."""
    import gc

    body = bytearray(b"word " * ((5 << 20) // 5))
    body[100] = 0xFF
    zpath = tmp_path / "w.zip"  # five pieces of 1 MiB: the error in the first
    zpath.write_bytes(
        zips.wikitext_zip({"train": bytes(body), "valid": b" v\n", "test": b" t\n"}, method=zipfile.ZIP_STORED)
    )
    out = tmp_path / "out"
    out.mkdir()
    seen: list = []
    kept: list = []

    def run() -> None:
        try:
            extract_corpus(zpath, out, source="test")
        except UserError as e:
            seen.append(str(e))
            kept.append(e)  # held while the reader, which runs on, fills its queue and puts its end

    caller = threading.Thread(target=run, daemon=True)
    caller.start()
    caller.join(30)
    reader = [t for t in threading.enumerate() if t.name == "corpus-reader"]
    for t in reader:
        _queue_filled(t)  # it has queued every piece and waits to put its end
    letting_go = threading.Thread(target=lambda: (kept.clear(), gc.collect(), seen.append("went on")), daemon=True)
    letting_go.start()
    letting_go.join(60)  # a liveness bound, not a timing (a loaded machine): the old code waited for good
    assert seen[:1] and "is not valid UTF-8: byte 0xff at offset 100" in seen[0]
    assert seen[1:] == ["went on"]
    assert not any(t.name == "corpus-reader" for t in threading.enumerate())


@pytest.mark.parametrize("ends_with", ["end", "error"])
def test_a_consumer_that_stops_early_lets_read_ahead_end_whatever_the_reader_puts_last(ends_with):
    """The consumer takes one item and drops the generator while the reader, its queue full, waits to put its end
    (or the error its items raised): dropping returns and the thread ends (a stripping error or a failed write
    drops it so)."""

    def items():
        yield from range(5)  # one taken, four fill the queue
        if ends_with == "error":
            raise OSError("the disk went away")

    ahead = read_ahead(items(), depth=4)
    assert next(ahead) == 0
    reader = next(t for t in threading.enumerate() if t.name == "corpus-reader")
    _queue_filled(reader)
    closing = threading.Thread(target=ahead.close, daemon=True)
    closing.start()
    closing.join(3)  # a liveness bound, not a timing: it returns at once
    assert not closing.is_alive() and not reader.is_alive()
