"""The loss charts of the model report and the comparison: round y ticks, axis titles, a width
that follows the page (a viewBox, no fixed size), and the checkpoint's long path kept out of the summary table.
The curve is a real tiny run's (the 40-step tiny preset: train loss at each print, val loss at each eval)."""

from __future__ import annotations

import math
import re

from tasks.model import loss_curve_svg, report

CURVE = [[1, 4.9888, None], [10, 4.6205, None], [20, 4.3259, 4.4318], [30, 4.2936, None], [40, 4.19, 4.349]]


def tick_values(svg: str) -> list[float]:
    """The y tick labels (right-aligned text left of the plot)."""
    return [float(v.replace(",", "")) for v in re.findall(r'text-anchor="end">([\d.,]+)</text>', svg)]


def test_the_loss_chart_has_round_ticks_axis_titles_and_follows_the_page():
    svg = loss_curve_svg(CURVE)
    ticks = tick_values(svg)
    assert len(ticks) >= 3, svg
    gap = ticks[1] - ticks[0]
    mantissa = gap / 10 ** math.floor(math.log10(gap))
    assert any(math.isclose(mantissa, m) for m in (1, 2, 2.5, 5)), ticks
    assert all(math.isclose(t / gap, round(t / gap), abs_tol=1e-6) for t in ticks), ticks  # multiples of the gap
    assert ">step</text>" in svg and re.search(r"rotate\(-90\)[^>]*>loss", svg), "axis titles"
    head = svg[: svg.index(">")]
    assert 'viewBox="0 0 ' in head and " width=" not in head and " height=" not in head, head
    assert svg.count("<polyline") == 2 and svg.count('fill="#ff7f0e"/>') == 2  # both val points drawn


def test_the_checkpoint_row_stays_inside_the_table():
    where = "/a/very/long/artifact/root/that/would/widen/the/table/model/0123456789ab"
    metrics = {"loss_curve": CURVE, "steps": 40, "final_loss": 4.19, "final_val_loss": 4.349, "final_val_bpb": 4.1}
    settings = {
        k: 1 for k in ("embed_dim", "num_layers", "num_heads", "num_kv_heads", "max_seq_len", "batch_size", "seq_len")
    }
    settings |= {"norm": "rms", "position": "rope", "lr": 3e-3, "schedule": "cosine", "warmup": 5}
    settings |= {"max_grad_norm": 1.0, "seed": 1, "train_splits": "train"}
    md = report({"version": "0123456789ab", "metrics": metrics, "settings": settings, "path": where})
    rows = [line for line in md.splitlines() if line.startswith("| checkpoint |")]
    assert len(rows) == 1 and where not in rows[0], rows
    assert f"`{where}/model.ckpt`" in md


def test_tick_labels_of_a_flat_curve_are_all_different():
    """A near-constant curve (a tiny lr) has ticks 1e-6 apart: each label shows its tick, none repeats."""
    for curve in ([[0, 3.4841, 3.4841], [10, 3.48411, 3.48411]], [[0, 2e-7, 2e-7], [10, 1e-7, 1e-7]]):
        svg = loss_curve_svg(curve)
        labels = re.findall(r'text-anchor="end">([\d.,]+)</text>', svg)
        assert len(labels) >= 3 and len(set(labels)) == len(labels), labels
