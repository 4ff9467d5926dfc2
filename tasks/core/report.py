"""The report helpers of stages and flows: markdown escaping (the UI renders raw HTML, so user text must never
read as markup), tables, byte sizes, numbers and the SVG line chart."""

from __future__ import annotations

import html
import json
import math
import re

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~&])")
#: What a renderer may take for the end of a line: marked (the Prefect UI's) reads ``\r\n`` and ``\r`` as ``\n``,
#: and its ``.`` stops at U+2028/U+2029 (one in a table row ends the table).
_LINE_BREAK = re.compile("\r\n|[\r\u2028\u2029]")
_SHOWN = {"\r": "\\r", "\n": "\\n", "\t": "\\t", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_SHOWN_RE = re.compile("[\r\n\t\u2028\u2029]")
#: The C0 control characters but tab, line feed and carriage return (which are written out or kept as line
#: breaks), DEL and the C1 controls (U+0080-U+009F: NEL is a line break to some readers, CSI starts a terminal
#: sequence as ESC ``[`` does): invisible, and a raw one has no business in a report; each is written out as
#: ``\xNN``.
_CONTROL_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
#: The start of a line that would begin a block: its leading spaces/tabs (4 make code), and a list marker, a
#: setext underline or a thematic break (``-``, ``+``, ``=``, ``1.``, ``1)``; the other markers are escaped anyway).
_LINE_START = re.compile(r"^([ \t]*)([-+=]|[0-9]+[.)])?", re.MULTILINE)


class Markdown(str):
    """Text that is markdown already: made by :func:`md_text`, :func:`md_code`, :func:`md_fence` or written as
    markup in the code (``Markdown("**built**")``). The builders below pass it through as it is and escape every
    other value (:func:`md`), so a value read from a manifest or given by a user never reads as markup."""


def md(value: object) -> Markdown:
    """``value`` as markdown: itself when it is :class:`Markdown`, else escaped by :func:`md_text`."""
    return value if isinstance(value, Markdown) else md_text(value)


def _controls_shown(s: str) -> str:
    """``s`` with its other control characters (:data:`_CONTROL_RE`) written out as ``\\xNN``."""
    return _CONTROL_RE.sub(lambda m: f"\\x{ord(m.group()):02x}", s)


def _shown(s: str) -> str:
    """``s`` with its line breaks and tabs written out (``\\n``), so it stays on one line, and its other control
    characters as ``\\xNN``."""
    return _SHOWN_RE.sub(lambda m: _SHOWN[m.group()], _controls_shown(s))


def _line_start(m: re.Match) -> str:
    indent, marker = m.group(1), m.group(2) or ""
    if marker:
        marker = marker[:-1] + "\\" + marker[-1] if marker[0].isdigit() else "\\" + marker
    return indent.replace("\t", "\u00a0" * 4).replace(" ", "\u00a0") + marker


def md_text(text: object, one_line: bool = True) -> Markdown:
    """``text`` as literal markdown text: markup characters (and so HTML's ``<`` and entities' ``&``)
    backslash-escaped; other control characters written out (``\\x1b``); on one line (line breaks and tabs
    written out as ``\\n``, ``\\r``, ``\\u2028``...) unless ``one_line`` is false (a caller that quotes each
    line itself). Then every line break a renderer knows becomes ``\\n`` and no line can begin a block: a line's
    leading spaces and tabs become no-break spaces (4 would make code) and a list marker, ``=``/``-`` underline
    or rule at its start is escaped (a generated ``---`` would turn the line above into a heading)."""
    s = str(text)
    if one_line:
        return Markdown(_MD_SPECIAL.sub(r"\\\1", _shown(s)))
    s = _MD_SPECIAL.sub(r"\\\1", _LINE_BREAK.sub("\n", _controls_shown(s)))
    return Markdown(_LINE_START.sub(_line_start, s))


def md_code(text: object) -> Markdown:
    """``text`` as inline code that is safe in a table cell, on one line (line breaks and tabs written out as in
    :func:`md_text`): code spans whose fence is longer than any run of backticks inside, each ``|`` escaped as
    ``\\|`` (tables split cells on it even in code). A ``|`` after a backslash is written between two spans
    (`` `a\\`\\|`b` ``): inside a span the backslash would pair with the escape's and the pipe split the cell
    (marked and GitHub count the backslashes before a pipe)."""
    s = _shown(str(text))
    fence = "`" * (max((len(run) for run in re.findall(r"`+", s)), default=0) + 1)

    def span(piece: str) -> str:
        pad = " " if piece.startswith("`") or piece.endswith("`") or not piece.strip() else ""
        return f"{fence}{pad}{piece.replace('|', chr(92) + '|')}{pad}{fence}"

    *before, last = s.split("\\|")  # each backslash stays in the span before its pipe
    return Markdown(
        "".join(f"{span(piece + chr(92))}\\|" for piece in before) + (span(last) if last or not before else "")
    )


_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_ISOLATE_OPEN, _ISOLATE_CLOSE = frozenset("\u2066\u2067\u2068"), "\u2069"


def bidi_isolated(text: str) -> str:
    """``text`` unchanged unless it holds a bidi control, else wrapped in first-strong isolates (U+2068 ... U+2069)
    that its own controls cannot open or close: an override (U+202E) in a prompt then reverses only the prompt,
    not the text and markup after it. One more isolate opens for each of its unmatched U+2069 (each would close
    the wrapper) and one more U+2069 closes each isolate it leaves open."""
    if not _BIDI_CONTROLS.intersection(text):
        return text
    depth = unmatched = 0
    for ch in text:
        if ch in _ISOLATE_OPEN:
            depth += 1
        elif ch == _ISOLATE_CLOSE:
            if depth:
                depth -= 1
            else:
                unmatched += 1
    return "\u2068" * (1 + unmatched) + text + _ISOLATE_CLOSE * (1 + depth)


def md_fence(text: str, language: str = "") -> Markdown:
    """``text`` as a fenced code block whose fence is longer than any run of backticks inside it (a line of
    three backticks in ``text`` would otherwise close the block and let the rest read as markup)."""
    fence = "`" * max(3, max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    return Markdown(f"{fence}{language}\n{text}\n{fence}")


def md_row(*cells: object) -> Markdown:
    """One markdown table row, each cell through :func:`md` (so a value's ``|`` or newline never adds a cell or
    a row)."""
    return Markdown("| " + " | ".join(md(c) for c in cells) + " |")


def summary_table(rows: list[tuple[str, object]]) -> Markdown:
    """The two-column "what | value" markdown table at the top of every stage's UI artifact; each name and value
    through :func:`md`."""
    return Markdown("\n".join(["| | value |", "|---|---|", *(md_row(name, value) for name, value in rows)]))


def settings_table(settings: dict) -> Markdown:
    """The settings a version was built with, one named row each (the end of every stage's UI artifact)."""

    rows = "\n".join(
        md_row(md_code(name), md_code(json.dumps(value, ensure_ascii=False))) for name, value in settings.items()
    )
    return Markdown(f"\n## Settings\n\n| setting | value |\n|---|---|\n{rows}\n")


def number(value: object, spec: str = ".4f") -> str:
    """``value`` formatted with ``spec``; ``–`` when it is None (a metric an old version lacks). A value of another
    type (a string, a bool, a list: what a manifest may hold) raises ``TypeError``, and one ``spec`` cannot show
    (an int too big for ``.4f``, a float for ``,d``) ``ValueError``, both naming it: a report cell shows ``–`` for
    them and logs which (``flows.reports.cell``), rather than a number that is not what the manifest says."""
    if value is None:
        return "–"
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{value!r} is not a number")
    try:
        return format(value, spec)
    except (ValueError, OverflowError) as e:
        raise ValueError(f"{value!r} cannot be shown as {spec!r}: {e}") from None


def _finite(value: object) -> float | None:
    """``value`` as a finite float, or None when it is not a number (a bool is not) or not finite."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        return None
    return number if math.isfinite(number) else None


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


# ---- the UI artifact: summary + loss curve -------------------------------------------------------------
def nice_ticks(lo: float, hi: float, log: bool = False, count: int = 5) -> list[float]:
    """Round axis ticks covering ``lo``..``hi``: multiples of 1, 2 or 5 x 10^k."""
    if log:
        k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        ticks = [m * 10.0**k for k in range(k0, k1 + 1) for m in (1, 2, 5) if lo <= m * 10.0**k <= hi]
        if len(ticks) >= 3:
            return ticks
    raw = (hi - lo) / max(count - 1, 1) or 1.0
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    ticks = [i * step for i in range(first, last + 1)]
    return [t for t in ticks if t > 0] if log else ticks  # a log axis has no 0


def _tick_label(value: float, ticks: list[float]) -> str:
    """``value`` with as few decimals as show every tick exactly, so no two labels of a flat curve read the same."""
    step = min((b - a for a, b in zip(ticks, ticks[1:], strict=False) if b > a), default=1.0)
    decimals = next((d for d in range(16) if all(abs(round(t, d) - t) < 1e-6 * step for t in ticks)), 15)
    return f"{value:,.{decimals}f}"


def _points(label: str, points: list) -> list[tuple[float, float]]:
    kept = []
    for x, y in points:
        at = _finite(x)
        if at is None:
            raise ValueError(f"series {label!r}: x {x!r} is not a finite number")
        if y is not None and (not isinstance(y, int | float) or isinstance(y, bool)):
            raise TypeError(f"series {label!r}: y {y!r} at x {x!r} is not a number")
        value = _finite(y)
        if value is not None and value > 0:
            kept.append((at, value))
    return kept


def line_chart(series: list[tuple[str, str, list]], x_title: str, y_title: str, height: int = 300) -> str:
    """An SVG line chart of ``series`` (``(label, colour, [(x, y), ...])``) that takes the page's width (a
    viewBox only); the y axis is logarithmic when the values span more than 4x (a steep start flattens the rest).

    A point whose y is None, not finite or not above 0 is not drawn (a step without a validation loss); an x that
    is not a finite number or a y that is not a number raises ``ValueError``/``TypeError`` naming the series (the
    values came from a manifest: the caller decides what a malformed series costs)."""
    width = 640
    clean = [(label, colour, _points(label, pts)) for label, colour, pts in series]
    clean = [c for c in clean if c[2]]
    ys = [y for _, _, pts in clean for _, y in pts]
    if not ys:
        return ""
    lo, hi = min(ys), max(ys)
    log_y = hi / lo > 4
    if hi == lo:
        lo, hi = lo * 0.9, hi * 1.1
    f = math.log if log_y else (lambda v: v)
    y_ticks = nice_ticks(lo, hi, log=log_y)
    lo, hi = min([lo, *y_ticks]), max([hi, *y_ticks])
    y0, y1 = f(lo), f(hi)
    x_max = max(max(x for _, _, pts in clean for x, _ in pts), 1)
    x_ticks = nice_ticks(0, x_max)
    x_max = max(x_max, x_ticks[-1])
    left, right, top, bottom = 64, 16, 28, 44
    pw, ph = width - left - right, height - top - bottom

    def px(x, y):
        return left + pw * x / x_max, top + ph * (1 - (f(y) - y0) / (y1 - y0))

    parts = [f'<rect width="{width}" height="{height}" fill="white"/>']
    for v in y_ticks:
        _, y = px(0, v)
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{_tick_label(v, y_ticks)}</text>'
        )
    for v in x_ticks:
        x, _ = px(v, lo)
        parts.append(
            f'<text x="{x:.1f}" y="{top + ph + 16}" font-size="11" text-anchor="middle">'
            f"{_tick_label(v, x_ticks)}</text>"
        )
    parts.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>')
    for _, colour, pts in clean:  # a line, and a dot at each point (a series of one point is a dot)
        xy = [px(a, b) for a, b in pts]
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{coords}"/>')
        parts += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in xy]
    x = left
    for label, colour, _ in clean:  # the legend, left to right above the plot
        parts.append(f'<text x="{x}" y="18" font-size="12" fill="{colour}">{html.escape(label)}</text>')
        x += 14 + 7 * len(label)
    parts.append(
        f'<text x="{left + pw / 2:.1f}" y="{height - 8}" font-size="12" text-anchor="middle">{html.escape(x_title)}'
        "</text>"
        f'<text transform="translate(16 {top + ph / 2:.1f}) rotate(-90)" font-size="12" text-anchor="middle">'
        f"{html.escape(y_title)}{' (log scale)' if log_y else ''}</text>"
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'preserveAspectRatio="xMidYMid meet" font-family="sans-serif">{"".join(parts)}</svg>'
    )
