"""The run summary and the comparisons link every version to the artifact that describes it (issue 20, items 3-4),
however many artifacts the Prefect server holds: it answers at most a page (200 by default) a request, so the links are
read a page at a time (``flows.reports.artifact_links``), through a real Prefect server on 127.0.0.1."""

from __future__ import annotations

import re

from flows.reports import artifact_links

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
