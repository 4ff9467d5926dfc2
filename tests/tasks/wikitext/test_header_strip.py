"""The chapter's header strip, streamed: the same text as one ``re.sub`` over the whole, in bounded memory."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mygpt.errors import UserError
from tasks.wikitext.header_strip import HEADER_RE, strip_block, strip_headers
from tests.support.corpus_runs import CHAPTER_RE

_LINES = st.one_of(
    st.sampled_from(
        [
            " \n",
            " = Title = \n",
            " = = Section = = \n",
            " = open\n",
            "close = \n",
            " a = b\n",
            " plain words .\n",
            "=\n",
            "  \n",
            "= x =",
            "\xa0= y =\xa0\n",
            " =\n",
            "\t\n",
        ]
    ),
    st.text(st.sampled_from(list("= x\n\xa0\u3000")), max_size=8),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_LINES, max_size=40), st.integers(1, 60), st.integers(1, 50))
def test_streamed_strip_equals_one_re_sub(lines, block_chars, piece):
    whole = "".join(lines)
    pieces = [whole[i : i + piece] for i in range(0, len(whole), piece)]
    got = list(strip_headers(pieces, block_chars))
    assert "".join(t for t, _ in got) == HEADER_RE.sub("", whole)
    assert sum(n for _, n in got) == len(HEADER_RE.findall(whole))


def test_streamed_strip_on_real_wikitext_small_blocks(wikitext2_text):
    pieces = [wikitext2_text[i : i + 7919] for i in range(0, len(wikitext2_text), 7919)]
    got = "".join(t for t, _ in strip_headers(pieces, block_chars=2000))
    assert got == re.sub(r"^\s*=+ [^=]+ =+\s*$\n?", "", wikitext2_text, flags=re.MULTILINE)


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


@pytest.mark.parametrize("piece", [None, 1, 7])
def test_the_header_candidate_bound_is_exact(piece):
    """A candidate held undecided for exactly ``max_pending`` characters passes (and strips as one ``re.sub``);
    one character more is refused, however the text is cut into pieces (a bound checked only when the buffer
    doubles let a candidate of twice the bound through)."""
    head, tail = "= Open " + "x" * 1000, "x = y\ntail\n"
    text = head + tail
    if piece is None:  # the candidate arrives whole, then the text that decides it
        pieces, longest = [head, tail], len(head)
    else:  # decided by the piece holding the "y" after "x = ": every piece before it was held undecided
        pieces = [text[i : i + piece] for i in range(0, len(text), piece)]
        longest = (len(head) + len("x = ")) // piece * piece
    got = list(strip_headers(pieces, name="wiki.train.raw", max_pending=longest))
    assert "".join(t for t, _ in got) == CHAPTER_RE.sub("", text)
    with pytest.raises(UserError, match=rf"wiki.train.raw has a line .* more than {longest - 1:,} characters"):
        list(strip_headers(pieces, name="wiki.train.raw", max_pending=longest - 1))


def _title_offsets(whole: str) -> list[int]:
    """Where in ``HEADER_RE.sub("", whole)`` each removed ``= Title =`` match was: from one pass over the whole."""
    found, removed = [], 0
    for m in HEADER_RE.finditer(whole):
        if m.group().lstrip().startswith("= "):
            found.append(m.start() - removed)
        removed += len(m.group())
    return found


def _streamed_offsets(pieces, block_chars: int) -> list[int]:
    articles: list[int] = []
    found, at = [], 0
    for text, _ in strip_headers(pieces, block_chars, articles=articles):
        found.extend(at + a for a in articles)
        at += len(text)
    return found


@settings(max_examples=300, deadline=None)
@given(st.lists(_LINES, max_size=40), st.integers(1, 60), st.integers(1, 50))
def test_streamed_article_starts_equal_one_pass(lines, block_chars, piece):
    whole = "".join(lines)
    pieces = [whole[i : i + piece] for i in range(0, len(whole), piece)]
    assert _streamed_offsets(pieces, block_chars) == _title_offsets(whole)


def test_article_starts_on_real_wikitext(wikitext2_text):
    """Each article of the real text starts where its `` = Title = `` line was, in any block size."""
    pieces = [wikitext2_text[i : i + 7919] for i in range(0, len(wikitext2_text), 7919)]
    want = _title_offsets(wikitext2_text)
    assert len(want) == len(re.findall(r"^ = [^=]+ = $", wikitext2_text, flags=re.MULTILINE)) > 50
    assert _streamed_offsets(pieces, 2000) == _streamed_offsets([wikitext2_text], 1 << 22) == want


def test_a_candidate_decided_in_the_piece_that_takes_it_past_the_bound_passes():
    """The documented bound: what is held after a piece is checked, so a candidate up to ``max_pending`` plus one
    piece gets through when that piece decides it, and is refused when it is still held after the piece."""
    from tasks.wikitext.header_strip import strip_headers

    longest = 100
    decided = ["x\n", "= " + "a" * (longest + 50) + " =\nrest\n"]  # one piece: past the bound and decided
    assert "".join(t for t, _ in strip_headers(decided, max_pending=longest)) == CHAPTER_RE.sub("", "".join(decided))
    held = ["x\n", "= " + "a" * (longest + 50), " =\nrest\n"]  # the same text, held undecided after a piece
    with pytest.raises(UserError, match=r"more than 100 characters"):
        list(strip_headers(held, max_pending=longest))
