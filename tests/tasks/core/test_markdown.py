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
