"""The Prefect UI as a user sees it: headless Chromium renders a real server's pages after two tiny runs and the test
reads the DOM: the stage artifacts, run summary, loss chart, model comparison and the custom-run form's groups.
The runs' artifact root holds markup (an ``<img onerror>``, a ``javascript:`` link, a ``<script>``, backticks), and
a comparison is posted from a manifest whose values hold more: the pages show it as text, and no element of it.
Skipped without Debian's ``chromium``; slow (``scripts/test -m slow tests/flows/test_ui_browser.py``)."""

from __future__ import annotations

import base64
import html
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from flows.settings import TINY
from tasks.registry import NAMES
from tests.support.tiny import tiny_flow_parameters, tiny_zip_url

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (apt-get install -y chromium)"),
]

GROUPS = (*NAMES, "run")
#: The runs' artifact root's last part: what a root may hold (a path has no "/" in a name, nor a newline).
HOSTILE_ROOT = "art`<img src=x onerror=alert(1)>`[clickme](javascript:alert(1))<script>alert(2)"
#: What a manifest's value may hold on top: a closing tag, a newline and a row of a table, and a backslash before
#: a pipe (marked counts the backslashes before one: an even count splits the cell).
HOSTILE_VALUE = (
    "x`<img src=y onerror=alert(3)>`</script><script>alert(4)</script> | a |\n| injected | row | rms\\| 9.99"
)
#: What a model may generate after a prompt: ``\r`` (marked reads it as a line break) before a list, a heading,
#: a rule, and ``---`` / ``===`` lines that would make the line above a heading.
HOSTILE_CONTINUATION = " ok\r- INJECTEDLIST\r\r# HEADINGX\r---\r\nHello\n===\n    indented\n1. ordered"


def render(url: str, shot: Path | None = None, expect: str = "", budget_ms: int = 30_000) -> str:
    """The DOM Chromium renders at ``url`` (screenshot to ``shot``), retried while ``expect`` is not in it yet."""
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"]
    base += ["--window-size=1400,1800", f"--virtual-time-budget={budget_ms}", "--run-all-compositor-stages-before-draw"]
    if shot is not None:
        subprocess.run([*base, f"--screenshot={shot}", url], capture_output=True, timeout=180, check=True)
    dom = ""
    for _ in range(3):
        dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=180).stdout
        if expect in text_of(dom):
            break
    return dom


def text_of(dom: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))


@pytest.fixture(scope="module")
def ui_runs(tmp_path_factory):
    """A Prefect server with its UI, two tiny flow runs (40 and 20 steps) and the deployment registered."""
    from flows.server import PrefectServer, running_server

    tmp = tmp_path_factory.mktemp("ui")
    url = tiny_zip_url(tmp)
    with running_server(PrefectServer(tmp / "prefect-home", ui=True)) as server:
        from flows.wiki_pipeline import wiki_pipeline

        runs = []
        for steps in (TINY["model"]["steps"], 20):
            params = tiny_flow_parameters(url, tmp / HOSTILE_ROOT, model={"steps": steps})
            state = wiki_pipeline(**params, return_state=True)
            assert state.is_completed(), state
            runs.append(str(state.state_details.flow_run_id))
        deployment_id = wiki_pipeline.to_deployment(
            name="wiki-pipeline", parameters=tiny_flow_parameters(url, tmp / HOSTILE_ROOT)
        ).apply()
        yield server.api_url.removesuffix("/api"), runs, str(deployment_id), tmp


def hostile_comparison(root: Path) -> str:
    """Post the model comparison of ``root``'s two versions, the newest with :data:`HOSTILE_VALUE` as its
    ``created_at`` and a setting (a manifest may say anything); its artifact id."""
    import dataclasses

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import ArtifactCreate

    from flows.reports import comparison
    from tasks.registry import BY_NAME, open_store

    old, new = open_store(root).versions("model")[-2:]
    manifest = {**new.manifest, "created_at": HOSTILE_VALUE}
    manifest["settings"] = {**manifest["settings"], "norm": HOSTILE_VALUE}
    versions = [old, dataclasses.replace(new, manifest=manifest)]
    md = comparison(BY_NAME["model"], versions, {}, [], root)
    with get_client(sync_client=True) as client:
        made = client.create_artifact(ArtifactCreate(key="wiki-hostile-comparison", type="markdown", data=md))
    return str(made.id)


def hostile_samples(root: Path) -> str:
    """Post the samples report of ``root``'s version with :data:`HOSTILE_CONTINUATION` as its continuation; its
    artifact id."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import ArtifactCreate

    from tasks.registry import BY_NAME, open_store

    version = open_store(root).versions("samples")[-1]
    manifest = {**version.manifest, "metrics": {**version.manifest["metrics"]}}
    manifest["metrics"]["samples"] = [{**manifest["metrics"]["samples"][0], "continuation": HOSTILE_CONTINUATION}]
    with get_client(sync_client=True) as client:
        md = BY_NAME["samples"].report(manifest)
        made = client.create_artifact(ArtifactCreate(key="wiki-hostile-samples", type="markdown", data=md))
    return str(made.id)


def artifacts_of(flow_run_id: str) -> dict:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    keys = {a.key: str(a.id) for a in found if a.key}
    # a comparison's key names its artifact root (wiki-model-comparison-<root slug>-<hash>): found by its stem
    return keys | {k.partition("-comparison-")[0] + "-comparison": v for k, v in keys.items() if "-comparison-" in k}


def no_live_markup(dom: str, page: str) -> None:
    """No element, attribute or link of the hostile texts in ``dom``; their words are there, as text."""
    for live in (r"<img[^>]*onerror", r"<img[^>]*src=\"?[xy]\b", r"<a[^>]*href=\"javascript:", r"<script>alert"):
        assert not re.search(live, dom), f"{page}: {live} in the DOM"
    assert "onerror=alert(" in html.unescape(text_of(dom)), f"{page}: the hostile text is not shown as text"


def test_the_ui_shows_the_artifacts_summary_chart_comparison_and_run_form(ui_runs):
    ui, (first, second), deployment_id, tmp = ui_runs
    shots = tmp / "screenshots"
    shots.mkdir()

    task_runs = f"{len(NAMES)} Task runs"
    run_page = text_of(render(f"{ui}/runs/flow-run/{first}", shots / "flow-run.png", task_runs))
    assert "Completed" in run_page and task_runs in run_page, run_page[:3000]
    page = text_of(render(f"{ui}/artifacts", shots / "artifacts.png", "wiki-tokenizer-comparison"))
    for key in (f"wiki-{name}" for name in NAMES):
        assert key in page, f"{key} is not on the Artifacts page: {page[:3000]}"
    assert "wiki-run-summary" in page and "wiki-model-comparison" in page

    arts = artifacts_of(first)
    summary_url = f"{ui}/artifacts/artifact/{arts['wiki-run-summary']}"
    built = f"{len(NAMES)} built, 0 Cached"
    summary_dom = render(summary_url, shots / "run-summary.png", built)
    no_live_markup(summary_dom, "wiki-run-summary")
    summary = text_of(summary_dom)
    assert built in summary, summary[:3000]
    for stage in NAMES:
        assert re.search(rf"{stage} built [0-9a-f]{{12}}", summary), (stage, summary[:3000])
    assert re.search(re.escape(HOSTILE_ROOT) + r" ?, so it was reused", html.unescape(summary)), "the root, as text"

    model_dom = render(f"{ui}/artifacts/artifact/{arts['wiki-model']}", shots / "model.png", "final val loss")
    no_live_markup(model_dom, "wiki-model")
    samples_dom = render(f"{ui}/artifacts/artifact/{arts['wiki-samples']}", expect="samples.json")
    no_live_markup(samples_dom, "wiki-samples")
    assert f"{HOSTILE_ROOT}/samples/" in html.unescape(text_of(samples_dom)), "the files' paths, as text"
    chart = re.search(r'<img[^>]+src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', model_dom)
    assert chart, "no loss chart on the model's artifact page"
    svg = base64.b64decode(chart.group(1)).decode()
    assert svg.count("<polyline") == 2 and "train loss" in svg and "val loss" in svg
    assert '<circle cx="' in svg and 'fill="#ff7f0e"/>' in svg  # the val series' points drawn (one is a dot)

    arts2 = artifacts_of(second)
    comparison_url = f"{ui}/artifacts/artifact/{arts2['wiki-model-comparison']}"
    comparison = render(comparison_url, shots / "comparison.png", "Model versions compared")
    no_live_markup(comparison, "wiki-model-comparison")
    words = text_of(comparison)
    assert "Model versions compared (2)" in words, words[:3000]
    assert re.search(r"[0-9a-f]{12} 20 ", words) and re.search(r"[0-9a-f]{12} 40 ", words), words[:3000]
    assert re.search(r"[0-9a-f]{12} \(built [\d-]+ [\d:]+\): steps 40 → 20", words), words[:3000]
    curves = re.search(r'<img[^>]+src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', comparison)
    assert curves and base64.b64decode(curves.group(1)).decode().count("<polyline") == 2, "two val-loss curves"
    cached = NAMES.index("model")  # the stages before the model are reused; the model and after are built
    counts = f"{len(NAMES) - cached} built, {cached} Cached"
    summary2_dom = render(f"{ui}/artifacts/artifact/{arts2['wiki-run-summary']}", expect=counts)
    no_live_markup(summary2_dom, "wiki-run-summary")
    summary2 = text_of(summary2_dom)
    assert counts in summary2 and re.search(r"corpus Cached [0-9a-f]{12}", summary2), summary2[:3000]

    hostile = render(f"{ui}/artifacts/artifact/{hostile_comparison(tmp / HOSTILE_ROOT)}", expect="injected")
    no_live_markup(hostile, "a comparison from hostile manifest values")
    shown = html.unescape(re.sub(r"<[^>]+>", "", hostile))  # tags dropped, not spaced: a code cell may be spans
    assert shown.count("| a |\\n| injected | row | rms\\| 9.99") == 1, "built, whole (text, below the table)"
    assert f"norm rms → {HOSTILE_VALUE[:39]}…" in shown, "the changed setting, cut short, as text"
    assert len(re.findall(r"<tr", hostile)) == 3, "a header and one row per version: no row from a value"

    quote = render(f"{ui}/artifacts/artifact/{hostile_samples(tmp / HOSTILE_ROOT)}", expect="INJECTEDLIST")
    words = html.unescape(text_of(quote))
    assert "INJECTEDLIST" in words and "HEADINGX" in words and "ordered" in words, words[:3000]
    body = quote[quote.find("The prompt is in bold") : quote.find("samples.json")]  # the quote, and only it
    assert "INJECTEDLIST" in body and "<blockquote" in body, body[:3000]
    for block in ("<ul", "<ol", "<li", "<h1", "<h3", "<hr", "<pre"):
        assert block not in body, f"{block} from the generated text in the samples quote"
    assert not re.search(r"<h2[^>]*>[^<]*(Hello|HEADINGX)", body), "a generated line made a heading"

    form_url = f"{ui}/deployments/deployment/{deployment_id}/run"
    form = text_of(render(form_url, shots / "custom-run.png", "run (Optional)"))
    missing = [g for g in GROUPS if f" {g} (Optional) " not in form]
    assert not missing, f"groups missing from the custom-run form: {missing}: {form[:3000]}"
    print(f"screenshots: {shots}")
