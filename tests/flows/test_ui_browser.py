"""The Prefect UI as a user sees it: headless Chromium renders a real server's pages after two tiny runs and the test
reads the DOM: the stage artifacts, run summary, loss chart, model comparison and the custom-run form's groups.
Skipped without Debian's ``chromium``; slow (``scripts/test -m slow tests/flows/test_ui_browser.py``)."""

from __future__ import annotations

import base64
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
            params = tiny_flow_parameters(url, tmp / "art", model={"steps": steps})
            state = wiki_pipeline(**params, return_state=True)
            assert state.is_completed(), state
            runs.append(str(state.state_details.flow_run_id))
        deployment_id = wiki_pipeline.to_deployment(
            name="wiki-pipeline", parameters=tiny_flow_parameters(url, tmp / "art")
        ).apply()
        yield server.api_url.removesuffix("/api"), runs, str(deployment_id), tmp


def artifacts_of(flow_run_id: str) -> dict:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    keys = {a.key: str(a.id) for a in found if a.key}
    # a comparison's key names its artifact root (wiki-model-comparison-<root slug>-<hash>): found by its stem
    return keys | {k.rsplit("-", 2)[0]: v for k, v in keys.items() if "-comparison-" in k}


def test_the_ui_shows_the_artifacts_summary_chart_comparison_and_run_form(ui_runs):
    ui, (first, second), deployment_id, tmp = ui_runs
    shots = tmp / "screenshots"
    shots.mkdir()

    run_page = text_of(render(f"{ui}/runs/flow-run/{first}", shots / "flow-run.png", "6 Task runs"))
    assert "Completed" in run_page and "6 Task runs" in run_page, run_page[:3000]
    page = text_of(render(f"{ui}/artifacts", shots / "artifacts.png", "wiki-tokenizer-comparison"))
    for key in (f"wiki-{name}" for name in NAMES):
        assert key in page, f"{key} is not on the Artifacts page: {page[:3000]}"
    assert "wiki-run-summary" in page and "wiki-model-comparison" in page

    arts = artifacts_of(first)
    summary_url = f"{ui}/artifacts/artifact/{arts['wiki-run-summary']}"
    built = f"{len(NAMES)} built, 0 Cached"
    summary = text_of(render(summary_url, shots / "run-summary.png", built))
    assert built in summary, summary[:3000]
    for stage in NAMES:
        assert re.search(rf"{stage} built [0-9a-f]{{12}}", summary), (stage, summary[:3000])

    model_dom = render(f"{ui}/artifacts/artifact/{arts['wiki-model']}", shots / "model.png", "final val loss")
    chart = re.search(r'<img[^>]+src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', model_dom)
    assert chart, "no loss chart on the model's artifact page"
    svg = base64.b64decode(chart.group(1)).decode()
    assert svg.count("<polyline") == 2 and "train loss" in svg and "val loss" in svg
    assert '<circle cx="' in svg and 'fill="#ff7f0e"/>' in svg  # the val series' points drawn (one is a dot)

    arts2 = artifacts_of(second)
    comparison_url = f"{ui}/artifacts/artifact/{arts2['wiki-model-comparison']}"
    comparison = render(comparison_url, shots / "comparison.png", "Model versions compared")
    words = text_of(comparison)
    assert "Model versions compared (2)" in words, words[:3000]
    assert re.search(r"[0-9a-f]{12} [\d-]+ [\d:]+ 20 ", words) and re.search(r"[0-9a-f]{12} [\d-]+ [\d:]+ 40 ", words)
    curves = re.search(r'<img[^>]+src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', comparison)
    assert curves and base64.b64decode(curves.group(1)).decode().count("<polyline") == 2, "two val-loss curves"
    summary2 = text_of(render(f"{ui}/artifacts/artifact/{arts2['wiki-run-summary']}", expect="3 built, 3 Cached"))
    assert "3 built, 3 Cached" in summary2 and re.search(r"corpus Cached [0-9a-f]{12}", summary2), summary2[:3000]

    form_url = f"{ui}/deployments/deployment/{deployment_id}/run"
    form = text_of(render(form_url, shots / "custom-run.png", "run (Optional)"))
    missing = [g for g in GROUPS if f" {g} (Optional) " not in form]
    assert not missing, f"groups missing from the custom-run form: {missing}: {form[:3000]}"
    print(f"screenshots: {shots}")
