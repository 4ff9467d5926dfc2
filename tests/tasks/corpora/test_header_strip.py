"""The chapter's header strip, streamed: the same text as one ``re.sub`` over the whole, in bounded memory."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mygpt.errors import UserError
from tasks.corpora.header_strip import HEADER_RE, strip_block, strip_headers
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

    from tasks.corpora.header_strip import strip_headers

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
    from tasks.corpora.header_strip import strip_headers

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
    from tasks.corpora.header_strip import strip_headers

    longest = 100
    decided = ["x\n", "= " + "a" * (longest + 50) + " =\nrest\n"]  # one piece: past the bound and decided
    assert "".join(t for t, _ in strip_headers(decided, max_pending=longest)) == CHAPTER_RE.sub("", "".join(decided))
    held = ["x\n", "= " + "a" * (longest + 50), " =\nrest\n"]  # the same text, held undecided after a piece
    with pytest.raises(UserError, match=r"more than 100 characters"):
        list(strip_headers(held, max_pending=longest))


# ---- the same strip over UTF-8 bytes ----------------------------------------------------------------------------
def test_utf8_space_is_what_backslash_s_matches_in_a_str_pattern():
    """``UTF8_SPACE`` matches the UTF-8 of exactly the characters ``\\s`` matches in a str pattern, all of Unicode
    (the wide ones: U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000; and U+001C-U+001F,
    which ``\\s`` of a bytes pattern does not match)."""
    from tasks.corpora.header_strip import UTF8_SPACE

    space = re.compile(r"\s")
    one = re.compile(UTF8_SPACE)
    want = [c for c in range(0x110000) if space.match(chr(c))]
    assert [c for c in range(0x110000) if not 0xD800 <= c < 0xE000 and one.fullmatch(chr(c).encode())] == want
    assert {0x1C, 0x85, 0xA0, 0x2028, 0x3000} <= set(want) and re.match(rb"\s", b"\x1c") is None


_WIDE = ["\x85", "\xa0", "\u2028", "\u2029", "\u3000", "\u2009", "\u1680", "\u205f", "\x1c", "\x1f", "\x0b", "\x0c"]
_UTF8_BITS = st.one_of(
    _BITS,
    st.sampled_from(["é", "中", "\u2003=", "= \u3000", "\n\xa0= T =\u2028\n", " = T = \x85\n\u3000\n", *_WIDE]),
)


def _utf8_strip(pieces: list[str], block_chars: int, **kw) -> list[tuple[bytes, int]]:
    return list(strip_headers([p.encode("utf-8") for p in pieces], block_chars, **kw))


@settings(max_examples=1500, deadline=None)
@given(st.lists(_UTF8_BITS, max_size=30), st.integers(1, 60), st.integers(1, 12))
def test_the_strip_over_utf8_bytes_is_the_str_strip_encoded(bits, block_chars, piece):
    """Pieces of UTF-8 bytes (each whole characters) strip to the UTF-8 of the str strip, with the same count of
    matches and the article starts at the same places (in bytes), whatever whitespace surrounds the ``=`` lines:
    the characters ``\\s`` matches in str but not in a bytes pattern are where a plain bytes regex would differ."""
    whole = "".join(bits)
    want, n = HEADER_RE.subn("", whole)
    assert strip_block(whole.encode()) == (want.encode(), n)
    pieces = [whole[i : i + piece] for i in range(0, len(whole), piece)]
    got = _utf8_strip(pieces, block_chars)
    assert (b"".join(t for t, _ in got), sum(k for _, k in got)) == (want.encode(), n)
    found: list[int] = []
    articles: list[int] = []
    at = 0
    for text, _ in strip_headers([p.encode() for p in pieces], block_chars, articles=articles):
        found.extend(at + a for a in articles)
        at += len(text)
    assert found == [len(want[:x].encode()) for x in _title_offsets(whole)]


@pytest.mark.parametrize(
    "text",
    [
        " x\n\xa0= Title =\xa0\n next\n",  # no-break spaces around a header: stripped, with them
        " x\n\u3000\n= Title =\n\u2028\n\u3000\n next\n",  # wide blank lines before and after: the match takes them
        " x\n\x1c= Title =\x1f\n next\n",  # U+001C..U+001F: \s in str, not in a bytes pattern
        " x\n = A = \x85\n = B =\n",  # NEL ends no line for `$`: it is whitespace inside the trailing \s*
        " x\n= open \u2029 =\n\n",  # the [^=]+ runs over a paragraph separator
    ],
)
def test_wide_whitespace_around_headers_strips_as_in_str(text):
    want, n = HEADER_RE.subn("", text)
    assert n and strip_block(text.encode()) == (want.encode(), n)
    for cut in range(1, len(text)):  # each cut is a piece boundary, the text as two pieces
        got = _utf8_strip([text[:cut], text[cut:]], block_chars=1)
        assert b"".join(t for t, _ in got) == want.encode(), cut


def test_the_strip_over_utf8_bytes_on_real_text(wikitext2_text, shakespeare_text):
    for text in (wikitext2_text, shakespeare_text, wikitext2_text.replace("\n", "\r\n")):
        want, n = HEADER_RE.subn("", text)
        raw = text.encode()
        assert strip_block(raw) == (want.encode(), n)
        pieces = [text[i : i + 7919] for i in range(0, len(text), 7919)]
        got = _utf8_strip(pieces, 3000)
        assert b"".join(t for t, _ in got) == want.encode() and sum(k for _, k in got) == n
    assert HEADER_RE.subn("", wikitext2_text)[1] > 10


def test_a_header_candidate_that_never_ends_is_refused_in_bytes():
    pieces = ["= Title that never closes "] + ["wörd " * 1000] * 50
    with pytest.raises(UserError, match=r"wiki.train.raw has a line .* more than 100,000 bytes without deciding"):
        _utf8_strip(pieces, 1000, name="wiki.train.raw", max_pending=100_000)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.tuples(st.text(st.sampled_from(list("ab= \n")), max_size=6), st.lists(_LINES, max_size=8)), max_size=6)
)
def test_a_rendered_documents_titles_are_counted_the_same_alone_and_inside_its_split(docs):
    """What the corpus writer's article index rests on: the strip removes as many ``= Title =`` lines from a
    document rendered by ``title_line`` (a blank line, its title line, its text ending in a newline) on its own as
    it does from it among the others of its split, whatever the text holds."""
    from tasks.corpora.header_strip import count_titles
    from tasks.corpora.source import Document
    from tasks.corpora.writer import title_line

    rendered = []
    for title, lines in docs:
        text = "".join(lines)
        rendered.append(
            title_line(Document("id", title, text)) + (text + ("" if text.endswith("\n") else "\n")).encode()
        )
    assert all(count_titles(r) >= 1 for r in rendered)  # its own title line at least
    assert count_titles(b"".join(rendered)) == sum(count_titles(r) for r in rendered)
