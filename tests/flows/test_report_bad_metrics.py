"""A metric of another type than its report reads costs its own cell, never a report: the manifest's schema checks
only that ``metrics`` is an object, so a manifest whose metric is a string where a number belongs, a dict for a
list, a loss curve of pairs or of strings, or null, is published and read. Built from the real manifest of every
stage in a root of their own, each metric replaced in turn: the run summary and every comparison are still made,
the other stages' cells unchanged, the bad cell a dash, the version left out of a chart, and the log names it."""

from __future__ import annotations

import copy
import json
import logging
import re

import pytest

from flows.reports import Outcome, compared_stages, comparison, joined_columns, run_summary
from tasks.registry import BY_NAME, STAGES, open_store
from tasks.store.files import MANIFEST

#: What a manifest may hold where a report reads something else (JSON can hold every one); a nested metric gets
#: the first three (a string, a dict, null: the other types fail the same way).
WRONG = ("abc", {"a": 1}, None, [1, "x"], True, 10**400)
OLDER_MODEL = "fedcba987654"  # a second model version, so the chart and the comparison have a sound one too


@pytest.fixture
def reports(manifests, tmp_path, caplog):
    """``make(stage, metrics)``: writes ``stage``'s real manifest with ``metrics`` (None: its own) under a root
    holding every stage's, and returns (summary, {stage: comparison}, warnings logged)."""
    clean = {name: {k: v for k, v in m.items() if k != "path"} for name, m in manifests.items()}
    model = clean["model"]
    clean["export"] = {
        **model,
        "stage": "export",
        "version": manifests["export"]["version"],
        "settings": manifests["export"]["settings"],
        "inputs": {"model": {"stage": "model", "version": model["version"], "build_id": model["build_id"]}},
        "metrics": manifests["export"]["metrics"],
    }
    older = {**copy.deepcopy(model), "version": OLDER_MODEL, "created_at": "2026-01-01T00:00:00Z"}

    def write(manifest: dict) -> None:
        where = tmp_path / manifest["stage"] / manifest["version"]
        where.mkdir(parents=True, exist_ok=True)
        (where / MANIFEST).write_text(json.dumps(manifest))

    for manifest in [*clean.values(), older]:
        write(manifest)
    store = open_store(tmp_path)
    outcomes = [Outcome(s.name, clean[s.name]["version"], "Cached", 0.1) for s in STAGES]

    def make(stage: str | None = None, metrics: dict | None = None) -> tuple[str, dict[str, str], list[str]]:
        if stage is not None:
            write({**clean[stage], "metrics": metrics})
        caplog.clear()
        try:
            with caplog.at_level(logging.WARNING, logger="wiki_pipeline.reports"):
                summary = run_summary(str(tmp_path), outcomes, {}, None)
                compared = {
                    s.name: comparison(s, store.versions(s.name), {}, joined_columns(store, s.name), tmp_path)
                    for s in compared_stages()
                }
        finally:
            if stage is not None:
                write(clean[stage])
        return summary, compared, [r.getMessage() for r in caplog.records]

    make.clean = clean  # type: ignore[attr-defined]
    return make


def replaced(metrics: dict, path: tuple, value: object) -> dict:
    out = copy.deepcopy(metrics)
    where = out
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = value
    return out


def paths(value: object, depth: int = 3, prefix: tuple = ()) -> list[tuple]:
    """Every key of ``value``, and of the first item of each list in it (every item of a short one: a record such
    as a loss curve's ``[step, train, val]``), ``depth`` levels down."""
    if depth == 0 or not isinstance(value, dict | list):
        return []
    items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))[: 1 if len(value) > 3 else 3]
    return [p for key, item in items for p in [(*prefix, key), *paths(item, depth - 1, (*prefix, key))]]


def rows(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("| ")]


def cell(table: str, version: str, column: str) -> str:
    """The cell of ``version``'s row in ``column`` of a comparison (or of the summary, by stage)."""
    head = next(line for line in rows(table) if line.startswith("| version") or line.startswith("| stage"))
    row = next(line for line in rows(table) if version in line)
    split = re.compile(r"(?<!\\)\|")
    return [c.strip() for c in split.split(row)][[c.strip() for c in split.split(head)].index(column)]


@pytest.mark.parametrize("stage", [s.name for s in STAGES])
def test_every_metric_of_a_wrong_type_leaves_the_other_cells_and_reports_as_they_were(reports, stage):
    summary, compared, warnings = reports()
    assert not warnings, warnings
    assert len(rows(summary)) == 1 + len(STAGES) and "| model | Cached |" in summary
    assert set(compared) == {"model", "tokenizer"} and "data:image/svg+xml;base64," in compared["model"]
    version = reports.clean[stage]["version"]
    # the comparison rows a bad value may touch: its version's, and for evaluate that of the model it joins
    joins = BY_NAME[stage].columns_for
    touched = {stage: version, **({joins: reports.clean[stage]["inputs"][joins]["version"]} if joins else {})}
    metrics = reports.clean[stage]["metrics"]
    tried = 0
    for path in paths(metrics):
        for wrong in WRONG if len(path) == 1 else WRONG[:3]:
            tried += 1
            got, got_compared, logged = reports(stage, replaced(metrics, path, wrong))
            what = f"{stage} metrics{list(path)} = {wrong!r}"
            others = [r for r in rows(summary) if not r.startswith(f"| {stage} |")]
            assert [r for r in rows(got) if not r.startswith(f"| {stage} |")] == others, what
            assert len(rows(got)) == len(rows(summary)), what
            for name, table in compared.items():
                if name in touched:  # the other versions' rows as they were; the chart may change
                    unchanged = [r for r in rows(table) if touched[name] not in r]
                    assert [r for r in rows(got_compared[name]) if touched[name] not in r] == unchanged, what
                    assert len(rows(got_compared[name])) == len(rows(table)), what
                else:
                    assert got_compared[name] == table, what
            named = [f"{s}/{v}" for s, v in touched.items()]
            assert all(any(n in line for n in named) for line in logged), (what, logged)
    assert tried >= len(WRONG) * len(metrics), "every metric tried"


TARGETED = [
    # (stage, metric path, wrong value, where its cell is: a comparison's column or the summary's headline)
    ("model", ("steps",), "abc", ("model", "steps")),
    ("model", ("tokens_per_sec",), True, ("model", "tokens/s")),
    ("tokenizer", ("vocab_size",), {"a": 1}, ("tokenizer", "vocab")),
    ("tokenizer", ("vocab_size",), {"a": 1}, ("summary", "headline")),
    ("tokenizer", ("num_merges",), [1, 2], ("tokenizer", "merges")),
    ("corpus", ("splits",), "x", ("summary", "headline")),
    ("corpus", ("splits", "train", "chars"), None, ("summary", "headline")),
    ("shards", ("tokens",), None, ("summary", "headline")),
    ("samples", ("samples",), 5, ("summary", "headline")),
    ("export", ("check",), ["x"], ("summary", "headline")),
    ("evaluate", ("tokens_evaluated",), "abc", ("model", "test tokens")),
]


@pytest.mark.parametrize(
    ("stage", "path", "wrong", "where"), TARGETED, ids=[f"{s}.{'.'.join(p)}-in-{w[0]}" for s, p, _, w in TARGETED]
)
def test_a_bad_value_is_a_dash_in_its_cell_and_the_log_names_it(reports, stage, path, wrong, where):
    summary, compared, _ = reports()
    m = reports.clean[stage]
    got, got_compared, logged = reports(stage, replaced(m["metrics"], path, wrong))
    table, column = where
    if table == "summary":
        assert cell(summary, f"| {stage} |", column) not in ("", "–")
        assert cell(got, f"| {stage} |", column) == "–", got
        assert rows(got_compared["model"]) == rows(compared["model"])
        assert f"{stage}/{m['version']} headline" in logged[0]
    else:
        row_version = m["version"] if stage == table else m["inputs"][table]["version"]
        assert cell(compared[table], row_version, column) != "–"
        assert cell(got_compared[table], row_version, column) == "–", got_compared[table]
        if table == "model":  # the other version's cell as it was
            assert cell(got_compared[table], OLDER_MODEL, column) == cell(compared[table], OLDER_MODEL, column)
        assert f"{table}/{row_version} column {column!r}" in logged[-1]
    assert len(logged) == 1 + (stage == "tokenizer" and path == ("vocab_size",)), logged  # once a cell


@pytest.mark.parametrize(
    "curve",
    [[[1, 2.0]], [["a", "b", "c"]], [[1, 2.0, "x"]], {"a": 1}, None, 5, [[float("inf"), 1.0, 1.0]]],
    ids=["pairs", "strings", "string-loss", "dict", "null", "number", "infinite-step"],
)
def test_a_malformed_loss_curve_leaves_its_version_out_of_the_chart(reports, curve):
    _, compared, _ = reports()
    model = reports.clean["model"]
    assert f">{model['version']}</text>" in _svg(compared["model"]) and f">{OLDER_MODEL}</text>" in _svg(
        compared["model"]
    )
    _, got_compared, logged = reports("model", {**model["metrics"], "loss_curve": curve})
    svg = _svg(got_compared["model"])
    assert f">{OLDER_MODEL}</text>" in svg and f">{model['version']}</text>" not in svg, "the sound version only"
    assert rows(got_compared["model"]) == rows(compared["model"]), "the table as it was"
    assert len(logged) == 1 and f"model/{model['version']} chart" in logged[0], logged
    assert "left out of the chart" in logged[0]


def _svg(markdown: str) -> str:
    import base64

    found = re.search(r"data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)", markdown)
    assert found, markdown
    return base64.b64decode(found.group(1)).decode()


def test_number_shows_a_number_a_dash_for_none_and_names_anything_else():
    """``number`` is what every stage's numeric cell goes through: a bool is no number (it was shown as 1.0000),
    nor is a string; an int no float holds cannot be shown as ``.4f`` (was OverflowError, which no report
    catches)."""
    from tasks.core.report import number

    assert number(2.5) == "2.5000" and number(12345, ",.0f") == "12,345" and number(None) == "–"
    for wrong in (True, "2.5", [2.5], {"a": 1}):
        with pytest.raises(TypeError, match="is not a number"):
            number(wrong)
    for value, spec in ((10**400, ".4f"), (2.5, ",d")):
        with pytest.raises(ValueError, match="cannot be shown as"):
            number(value, spec)


def test_a_chart_draws_finite_losses_and_names_a_malformed_point():
    """A point without a loss (None), an infinite or a non-positive one is not drawn, as before; a step that is
    not a finite number or a loss that is not a number is an error naming the series (was: OverflowError from an
    infinite step, or a chart drawn from bools)."""
    from tasks.core.report import line_chart

    assert line_chart([("a", "#000", [(1, None), (2, float("inf")), (3, 0.0)])], "x", "y") == ""
    assert "<polyline" in line_chart([("a", "#000", [(1, 2.0), (2, None), (3, 1.0)])], "x", "y")
    for points, error in (
        ([(float("inf"), 1.0)], ValueError),
        ([(10**400, 1.0)], ValueError),
        ([("1", 1.0)], ValueError),
        ([(True, 1.0)], ValueError),
        ([(1, "2.0")], TypeError),
        ([(1, False)], TypeError),
    ):
        with pytest.raises(error, match="series 'a'"):
            line_chart([("a", "#000", points)], "x", "y")
