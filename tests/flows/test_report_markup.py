"""Every value that reaches a UI artifact's markdown is text, never markup: each stage's report, the run summary
and the comparisons, built from real manifests whose every string value is replaced by hostile text (backticks,
pipes, newlines, ``<script>``, ``<img onerror>``, a ``javascript:`` link), rendered by a real markdown renderer
with raw HTML on (as the Prefect UI renders it): no element, link or table row or cell comes from a value."""

from __future__ import annotations

import copy
from html.parser import HTMLParser
from types import SimpleNamespace

import pytest
from markdown_it import MarkdownIt

from flows.reports import Outcome, comparison, run_summary
from tasks.core.report import settings_table
from tasks.registry import BY_NAME

HOSTILE = (
    "a`<img src=x onerror=alert(1)>`[clickme](javascript:alert(1)) <script>alert(2)</script> "
    "<a href='javascript:alert(3)'>x</a> ``` | x |\n| injected |\n```\n# head"
)
RENDER = MarkdownIt("commonmark", {"html": True}).enable("table")


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def elements(markdown: str) -> list[tuple[str, dict]]:
    parser = _Elements()
    parser.feed(RENDER.render(markdown))
    return parser.tags


def live_markup(markdown: str) -> list[tuple[str, dict]]:
    """The elements a value could have made: script, iframe, a javascript: link, an image that is not our chart."""
    return [
        (tag, attrs)
        for tag, attrs in elements(markdown)
        if tag in ("script", "iframe", "object", "embed")
        or (tag == "img" and not (attrs.get("src") or "").startswith("data:image/svg+xml;base64,"))
        or any("javascript:" in (v or "").lower() for v in attrs.values())
        or any(k.startswith("on") for k in attrs)
    ]


def shape(markdown: str) -> list[str]:
    """The table structure and headings: what an injected newline or pipe would change."""
    return [tag for tag, _ in elements(markdown) if tag in ("tr", "td", "th", "table", "h1", "h2", "h3", "pre")]


def hostile(value, keep=()):
    """``value`` with every string leaf replaced by :data:`HOSTILE` (dict keys and the names in ``keep`` kept)."""
    if isinstance(value, dict):
        return {k: (v if k in keep else hostile(v, keep)) for k, v in value.items()}
    if isinstance(value, list):
        return [hostile(v, keep) for v in value]
    return HOSTILE if isinstance(value, str) else value


def test_the_renderer_sees_the_attack_unescaped():
    """The check itself: the hostile text, not escaped, makes live markup and extra rows (so the tests below can
    fail)."""
    assert live_markup(HOSTILE)
    assert shape(f"| a | b |\n|---|---|\n| {HOSTILE} | y |") != shape("| a | b |\n|---|---|\n| x | y |")


@pytest.mark.parametrize("stage", ["corpus", "tokenizer", "shards", "model", "samples", "export", "evaluate"])
def test_every_stage_report_shows_hostile_values_as_text(manifests, stage):
    manifest = manifests[stage]
    report = BY_NAME[stage].report
    plain = report(manifest) + settings_table(manifest["settings"])
    bad = hostile(manifest)
    md = report(bad) + settings_table(bad["settings"])
    assert not live_markup(plain), "the real report has no live markup"
    assert not live_markup(md), md
    assert shape(md) == shape(plain), md


def test_the_run_summary_and_comparison_show_hostile_values_as_text(manifests, upstream):
    root = upstream[0]
    # the run summary: a version's headline, a failure's message and the root are the values it shows
    md = run_summary(
        str(root),
        [Outcome("corpus", manifests["corpus"]["version"], "Cached", 0.1), Outcome("tokenizer", "", "Failed", 0.2)],
        {},
        RuntimeError(HOSTILE),
    )
    assert not live_markup(md), md
    assert shape(md).count("tr") == 3 and shape(md).count("td") == 12, ("two rows of six cells", md)

    # a comparison of the real model version and one whose manifest's every string (created_at too) is hostile
    for stage in ("model", "tokenizer"):
        real = manifests[stage]
        versions = [
            SimpleNamespace(stage=stage, version=real["version"], manifest=real),
            SimpleNamespace(stage=stage, version="fedcba987654", manifest=hostile(copy.deepcopy(real))),
        ]
        md = comparison(BY_NAME[stage], versions, {}, [])
        assert not live_markup(md), md
        assert shape(md).count("tr") == 3, ("a header and one row per version", md)
        plain = comparison(BY_NAME[stage], [versions[0], versions[0]], {}, [])
        assert shape(plain).count("tr") == 3


def test_a_charts_labels_and_titles_are_escaped_svg_text():
    from tasks.core.report import line_chart

    svg = line_chart([(HOSTILE, "#000", [(1, 2.0), (2, 1.0)])], x_title=HOSTILE, y_title=HOSTILE)
    assert "<script" not in svg and "<img" not in svg and "<a " not in svg, svg
    assert svg.count("&lt;script&gt;alert(2)&lt;/script&gt;") == 3, "the legend and both axis titles, as text"


#: Terminal and line controls from both control blocks: ESC (C0), DEL, NEL and CSI (C1: CSI 2J clears a terminal
#: that shows the text, as ESC [ 2J does).
CONTROLS = "a\x1b[31m b\x7f c\u0085d \u009b2J e\u0080\u009f"


def _with_controls(value):
    """``value`` with every string leaf replaced by :data:`CONTROLS`."""
    if isinstance(value, dict):
        return {k: _with_controls(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_controls(v) for v in value]
    return CONTROLS if isinstance(value, str) else value


@pytest.mark.parametrize("stage", ["corpus", "tokenizer", "samples"])
def test_every_control_character_in_a_value_is_written_out_not_passed_through(manifests, stage):
    """A value's C0 and C1 controls reach a report as ``\\xNN`` text, none of them raw."""
    md = BY_NAME[stage].report(_with_controls(manifests[stage])) + settings_table(
        _with_controls(manifests[stage]["settings"])
    )
    raw = [c for c in md if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F]
    assert not raw, [hex(ord(c)) for c in raw]
    for shown in ("\\x1b", "\\x7f", "\\x85", "\\x9b", "\\x80", "\\x9f"):
        assert shown in md, shown
