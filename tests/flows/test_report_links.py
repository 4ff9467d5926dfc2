"""The run summary and the comparisons link every version to the artifact that describes it,
however many artifacts the Prefect server holds: it answers at most a page (200 by default) a request, so the links are
read a page at a time (``flows.reports.artifact_links``), through a real Prefect server on 127.0.0.1."""

from __future__ import annotations

import re

from flows.reports import artifact_links
from tasks.registry import BY_NAME, STAGES

SERVER_PAGE = 200  # what a Prefect server answers at most a request (PREFECT_SERVER_API_DEFAULT_LIMIT)


def test_every_version_is_linked_past_the_server_s_page_size(prefect_server):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import ArtifactCreate

    versions = [f"linktest{i:04d}" for i in range(SERVER_PAGE + 30)]
    made = {}
    with get_client(sync_client=True) as client:
        for version in versions:
            art = client.create_artifact(
                ArtifactCreate(
                    key="wiki-tokenizer", type="markdown", data="x", description=f"built tokenizer/{version}"
                )
            )
            made[("tokenizer", version)] = f"/artifacts/artifact/{art.id}"
        rebuilt = client.create_artifact(  # a forced rebuild describes the same version again: the newest wins
            ArtifactCreate(
                key="wiki-tokenizer", type="markdown", data="y", description=f"built tokenizer/{versions[0]}"
            )
        )
    made[("tokenizer", versions[0])] = f"/artifacts/artifact/{rebuilt.id}"

    found = artifact_links([("tokenizer", v) for v in versions] + [("tokenizer", "nosuchversion")])
    assert found == made


def test_the_summary_shows_a_failure_as_one_line_without_secrets_or_markup():
    """Whatever raised it: an error quoting a URL with credentials, a redirect's signed query, markup and a second
    line becomes one line of literal text in the summary."""
    from flows.reports import run_summary

    error = RuntimeError(
        "fetching https://alice:PW1@h/x.zip?token=TK2 failed; url: /y.zip?X-Amz-Signature=SG3 (x) <img src=a> | b\n"
        "second line"
    )
    summary = run_summary(None, [], {}, error)
    assert "**Failed before any stage: its settings were refused**: RuntimeError: fetching" in summary, summary
    assert not [s for s in ("PW1", "TK2", "SG3", "second line") if s in summary], summary
    assert re.search(r"(?<!\\)<img", summary) is None, "markup only escaped"
    assert "\\<img src=a\\> \\| b" in summary, summary


def test_every_stage_with_columns_has_a_comparison_and_every_headline_reads_old_manifests():
    """The stages own their headline and columns: a stage declaring columns gets a comparison, and a manifest
    without the metrics (an older version's) shows dashes, not an error."""
    from types import SimpleNamespace

    from flows.reports import compared_stages, comparison, headline
    from tasks.registry import NAMES

    assert [s.name for s in compared_stages()] == [s.name for s in STAGES if s.columns and s.columns_for is None]
    assert {"model", "tokenizer"} <= {s.name for s in compared_stages()}
    assert all(isinstance(headline(name, {}), str) for name in NAMES)
    model = BY_NAME["model"]
    versions = [
        SimpleNamespace(stage="model", version=v, manifest={"metrics": {"final_val_bpb": bpb, "loss_curve": []}})
        for v, bpb in (("v1", 2.5), ("v2", None))
    ]
    md = comparison(model, versions, {}, [(("test bits/byte", lambda m: str(m["x"])), {"v1": {"x": 1.25}})])
    assert md.startswith("# Model versions compared (2)") and "| val bits/byte |" in md and "test bits/byte" in md
    assert "| `v2` |" in md and "| `v1` |" in md and " 2.5000 " in md and " 1.25 " in md and " – " in md


def test_a_stage_that_failed_is_shown_failed_never_built():
    """The summary's row, title and counts say how each stage ended: a Failed or Crashed stage is not "built"."""
    from flows.reports import Outcome, run_summary

    outcomes = [Outcome("corpus", "", "Failed", 0.5)]
    summary = run_summary(None, outcomes, {}, RuntimeError("boom"))
    assert "| corpus | **Failed** | – |" in summary, summary
    assert "0 built, 0 Cached" in summary and "| corpus | **built**" not in summary, summary
    assert [Outcome("m", "", state, 0).verdict for state in ("Failed", "Crashed", "Cancelled")] == [
        "Failed",
        "Crashed",
        "Cancelled",
    ]
    assert (Outcome("m", "v", "Completed", 0).verdict, Outcome("m", "v", "Cached", 0).verdict) == ("built", "Cached")


def test_a_flow_run_whose_stage_fails_publishes_a_summary_naming_it_failed(prefect_server, tmp_path):
    """Through a real flow run: the corpus stage fails (its zip is missing), and the run summary the server holds
    shows it Failed, with the reason, and counts nothing built."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from flows.wiki_pipeline import wiki_pipeline
    from tests.support.tiny import tiny_flow_parameters

    params = tiny_flow_parameters((tmp_path / "missing.zip").as_uri(), tmp_path / "art")
    state = wiki_pipeline(**params, return_state=True)
    assert state.is_failed(), state
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id]))
        )
    summary = next(a for a in found if a.key == "wiki-run-summary")
    assert summary.description.startswith("Failed: 0 built, 0 Cached: corpus Failed"), summary.description
    assert "| corpus | **Failed** | – |" in summary.data and "**Failed in stage corpus**" in summary.data, summary.data


def test_each_artifact_root_has_its_own_comparison_naming_the_root(prefect_server, tmp_path, monkeypatch):
    """Runs on two roots, through a real server: each root's comparison is a key of its own (its latest never
    flips to the other root's versions) and names its root, escaped, an s3 URL without credentials."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.reports import comparison, comparison_key, publish
    from tasks.core.report import md_code
    from tasks.registry import open_store
    from tests.tasks.store.builds import publish_locked

    one, two = tmp_path / "root-one", tmp_path / "root`<b>two</b>"
    for root, versions in ((one, ("aaaaaaaaaaa1",)), (two, ("bbbbbbbbbbb1", "bbbbbbbbbbb2", "bbbbbbbbbbb3"))):
        for version in versions:
            publish_locked(open_store(root), "tokenizer", version, {"tokenizer.json": b"{}"})

    @flow(name="comparisons-per-root")
    def runs_on_two_roots() -> None:
        publish(str(one), [])
        publish(str(two), [])
        publish(str(one), [])

    runs_on_two_roots()
    keys = {comparison_key("tokenizer", root) for root in (one, two)}
    assert len(keys) == 2 and all(re.fullmatch(r"wiki-tokenizer-comparison-[a-z0-9-]+", k) for k in keys), keys
    assert comparison_key("tokenizer", one).startswith("wiki-tokenizer-comparison-root-one-")
    with get_client(sync_client=True) as client:
        latest = {
            a.key: a.data
            for a in client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=sorted(keys))))
        }
    first, second = latest[comparison_key("tokenizer", one)], latest[comparison_key("tokenizer", two)]
    assert first.startswith("# Tokenizer versions compared (1)") and f"root {md_code(one)}." in first, first
    assert second.startswith("# Tokenizer versions compared (3)") and f"root {md_code(two)}." in second, second
    assert md_code(two).startswith("``/") and "<b>" not in second.replace(md_code(two), ""), second

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    shown = comparison(BY_NAME["tokenizer"], [], {}, [], "s3://AKIAKEY:S3CRET@bkt/wiki")
    assert "S3CRET" not in shown and "AKIAKEY" not in shown and "`s3://***@bkt/wiki`" in shown, shown


def test_the_summary_lists_the_settings_warnings_as_text():
    from flows.reports import run_summary

    summary = run_summary(None, [], {}, None, ["model.warmup (500) is not shorter than steps (60) <b>"])
    assert "**Warning**: model.warmup (500) is not shorter than steps (60) \\<b\\>" in summary, summary
