"""A user's text in a UI artifact is shown, never read as markup (the adversarial review injected a <script>,
a link and table columns through a prompt and a source_url)."""

from __future__ import annotations

import pytest

from tasks.core.report import md_code, md_text, settings_table
from tasks.corpus import report as corpus_report
from tasks.samples import samples_markdown

EVIL = "x|y<script>alert(1)</script>[clickme](http://evil.example/)`z ``w\n| a | b |\n|---|---|"


def _cells(row: str) -> list[str]:
    """A markdown table row's cells, as GitHub splits them (on | not escaped by a backslash)."""
    out, cur, i = [], "", 0
    while i < len(row):
        if row[i] == "\\" and i + 1 < len(row):
            cur += row[i : i + 2]
            i += 2
            continue
        if row[i] == "|":
            out.append(cur)
            cur = ""
        else:
            cur += row[i]
        i += 1
    return [c.strip() for c in out[1:]]


@pytest.mark.parametrize("make", [md_code, md_text])
def test_escaped_text_stays_one_cell_on_one_line_without_live_markup(make):
    shown = make(EVIL)
    assert "\n" not in shown
    assert len(_cells(f"| {shown} | next |")) == 2
    if make is md_text:
        assert "<script>" not in shown and "\\<script\\>" in shown and "\\[clickme\\]" in shown
    else:  # one code span: its fence is longer than every backtick run inside
        fence = shown[: len(shown) - len(shown.lstrip("`"))]
        assert len(fence) == 3 and shown.endswith(fence) and shown.count(fence) == 2


def test_reports_show_a_hostile_prompt_and_url_as_text():
    table = settings_table({"prompt": [EVIL], "temperature": 1.0})
    rows = [r for r in table.splitlines() if r.startswith("| ") and "prompt" in r]
    assert len(rows) == 1 and len(_cells(rows[0])) == 2
    manifest = {"version": "v1", "metrics": {"source_url": "http://127.0.0.1:9/" + EVIL.replace("\n", "")}}
    source_rows = [r for r in corpus_report(manifest).splitlines() if r.startswith("| source |")]
    assert len(source_rows) == 1 and len(_cells(source_rows[0])) == 2
    md = samples_markdown(
        [{"prompt": EVIL, "used_prompt": EVIL.replace("<", ""), "continuation": " more <b>text</b>"}],
        {"max_new_tokens": 5, "temperature": 1.0, "top_k": 0, "seed": 1, "device": "cpu", "precision": "fp32"},
    )
    assert "<script>" not in md and "\\<script\\>" in md
    assert "<b>" not in md and "\\<b\\>" in md
    assert "\n| a | b |" not in md  # the prompt's newline did not start a table


SAMPLE_PARAMS = {"max_new_tokens": 5, "temperature": 1.0, "top_k": 0, "seed": 1, "device": "cpu", "precision": "fp32"}
#: Generated text (a byte-level model can emit any of it) whose lines would begin blocks in a blockquote: ``\r``
#: and U+2028 as line breaks, a list, a heading, setext underlines, a rule, indented code, a fence, a quote, HTML.
BLOCKS = (
    " ok\r- INJECTEDLIST\r\r# HEADINGX\r---\r\nHello\n===\n    indented code\n\t1) ordered\n12. ordered\n"
    "+ plus\u2028* star\u2029> quote\n```\nfenced\n~~~\n<div>html</div>\n- - -\n  ==="
)


def _tags(markdown: str) -> list[str]:
    from html.parser import HTMLParser

    from markdown_it import MarkdownIt

    tags: list[str] = []
    parser = HTMLParser()
    parser.handle_starttag = lambda tag, attrs: tags.append(tag)  # type: ignore[method-assign]
    parser.feed(MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown))
    return tags


@pytest.mark.parametrize("prompt", ["The history of", "    Four spaces", "- a list?\r# a heading?"])
def test_a_samples_quote_begins_no_block_whatever_the_text_holds(prompt):
    md = samples_markdown(
        [{"prompt": prompt, "used_prompt": prompt, "continuation": BLOCKS, "seconds": 0}], SAMPLE_PARAMS
    )
    quote = md.split("\n\n", 2)[2]
    assert not any(c in quote for c in "\r\u2028\u2029"), "every line break a renderer knows is a \\n"
    assert all(line.startswith("> ") for line in quote.strip("\n").split("\n")), quote
    tags = _tags(md)
    assert tags.count("blockquote") == 1 and tags.count("h2") == 1 and tags.count("strong") == 1, (tags, md)
    blocks = {"ul", "ol", "li", "h1", "h3", "h4", "hr", "pre", "code", "div", "table"}
    assert not blocks & set(tags), (tags, md)
    assert _tags(f"> {BLOCKS}".replace("\r", "\n> ")) != ["blockquote", "p"], "the check can fail"


@pytest.mark.parametrize("value", ["rms\\| 9.99 FAKE", "a\\\\|b", "\\|", "x|y", "a\\\\\\|", "\\|\\|", "`\\|`"])
def test_no_backslash_before_a_pipe_splits_a_code_cell(value):
    from markdown_it import MarkdownIt

    row = f"| v1 | {md_code(value)} | {md_text(value)} | 2.345 |"
    assert len(_cells(row)) == 4, row  # as marked (the Prefect UI) and GitHub split: backslashes counted in pairs
    tokens = MarkdownIt("commonmark").enable("table").parse(f"| a | b | c | d |\n|---|---|---|---|\n{row}\n")
    cells = ["".join(c.content for c in t.children or []) for t in tokens if t.type == "inline"][4:]
    assert cells == ["v1", value, value, "2.345"], row


def test_a_line_separator_never_reaches_a_table_row():
    # marked's table rule reads a row with ``.``, which stops at U+2028: the row and those after would leave the table
    for make in (md_code, md_text):
        assert not any(c in make("a\u2028b\u2029c") for c in "\u2028\u2029")


def _isolated_whole(shown: str) -> bool:
    """Whether the isolate opened by ``shown``'s first character closes at its last (what the bidi algorithm
    matches: each U+2069 closes the innermost open isolate), so nothing inside reorders what follows."""
    depth = 0
    for i, ch in enumerate(shown):
        depth += ch in "\u2066\u2067\u2068"
        if ch == "\u2069":
            depth -= 1
            if depth == 0:
                return i == len(shown) - 1
    return False


@pytest.mark.parametrize("text", ["a\u202eb", "\u2069\u2069\u202eevil", "\u2067open", "x\u2066y\u2069\u202dz"])
def test_a_bidi_override_in_a_sample_stays_inside_its_isolate(text):
    from tasks.core.report import bidi_isolated

    assert bidi_isolated("plain text") == "plain text"
    shown = bidi_isolated(text)
    assert _isolated_whole(shown) and text in shown, ascii(shown)
    md = samples_markdown([{"prompt": text, "used_prompt": text, "continuation": text + "\nmore"}], SAMPLE_PARAMS)
    heading, quote = md.split("\n\n")[1:3]
    assert _isolated_whole(heading.removeprefix("## 1. ")), ascii(heading)
    lines = [line.removeprefix("> ").removesuffix("  ") for line in quote.split("\n")]
    assert _isolated_whole(lines[0]) and lines[1] == "more", ascii(quote)
