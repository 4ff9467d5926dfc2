"""The corpus stage's fast extraction path (issue 14): header stripping by candidate runs equals ``re.subn`` on
every text, and the threaded unzip/write pipeline writes exactly what one thread would, or nothing."""

from __future__ import annotations

import re
import threading
import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.mirror import MEMBER, make_zip
from mygpt.errors import UserError
from tasks.corpus import extract_corpus
from tasks.wikitext.header_strip import strip_block

CHAPTER_RE = re.compile(r"^\s*=+ [^=]+ =+\s*$\n?", flags=re.MULTILINE)  # the chapter's regex, verbatim

_BITS = st.sampled_from(
    [
        " ",
        "\n",
        "=",
        "==",
        " = ",
        " = = ",
        "x",
        "a b",
        " \n",
        "\xa0",
        "\u3000",
        "\t",
        "\r",
        " = Title = \n",
        " = = Sec = = \n",
        "= x =",
        "\n=",
        " =\n",
    ]
)


@settings(max_examples=1500, deadline=None)
@given(st.lists(_BITS, max_size=30))
def test_strip_block_equals_the_chapters_subn(bits):
    text = "".join(bits)
    assert strip_block(text) == CHAPTER_RE.subn("", text)


def test_strip_block_on_real_wikitext(wikitext2_text):
    got, n = strip_block(wikitext2_text)
    want, m = CHAPTER_RE.subn("", wikitext2_text)
    assert got == want and n == m > 10


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


# ---- bounded whatever the line length (issue 21 item 3) ---------------------------------------------------------
def _one_line(total_mib: int, head: str = ""):
    """A text of ``total_mib`` MiB with no newline at all, in 1 MiB pieces, made as it is read."""
    yield head
    for _ in range(total_mib):
        yield "word " * (1 << 18) + "a b c "[: (1 << 20) - 5 * (1 << 18)]


@pytest.mark.parametrize("head", ["", "= Title = ", " = = Sec = = tail "])
def test_a_line_with_no_newline_is_stripped_in_bounded_memory(head):
    import tracemalloc

    from tasks.wikitext.header_strip import strip_headers

    total = 48  # MiB: without the bound the whole line is buffered (and copied) at once
    tracemalloc.start()
    try:
        chars = 0
        stripped = 0
        for text, n in strip_headers(_one_line(total, head), block_chars=1 << 20):
            chars += len(text)
            stripped += n
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    whole = head + ("word " * (1 << 18) + "a b c "[: (1 << 20) - 5 * (1 << 18)]) * total
    want, m = CHAPTER_RE.subn("", whole)
    assert (chars, stripped) == (len(want), m)
    assert peak < 12 << 20, f"peak {peak:,} bytes: the line was buffered whole"


def test_a_header_candidate_that_never_ends_is_refused():
    from tasks.wikitext.header_strip import strip_headers

    pieces = ["= Title that never closes "] + ["word " * 1000] * 50
    with pytest.raises(UserError, match=r"wiki.train.raw has a line that starts like a `= Header =` line and runs on"):
        list(strip_headers(pieces, block_chars=1000, name="wiki.train.raw", max_pending=100_000))
    assert "".join(t for t, _ in strip_headers(pieces, block_chars=1000)) == CHAPTER_RE.sub("", "".join(pieces))
