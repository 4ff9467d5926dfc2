"""A source_url with credentials, through the whole flow on a real Prefect server: the run downloads with them,
and neither the flow run's parameters nor its logs nor the UI artifact Prefect keeps show them (the
stage-level checks -- logs, manifest, report, errors, staging files -- are in tests/tasks/test_corpus.py)."""

from __future__ import annotations

import asyncio
import json

from flows.mirror import ZIP_NAME, Mirror
from tests.support.tiny import tiny_flow_parameters


def _what_prefect_keeps(flow_run_id) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, LogFilter, LogFilterFlowRunId

    async def read():
        async with get_client() as client:
            run = await client.read_flow_run(flow_run_id)
            logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
            arts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
            )
            return json.dumps(run.parameters), [log.message for log in logs], [str(a.data) for a in arts]

    parameters, logs, artifacts = asyncio.run(read())
    assert any("download: fetching" in line for line in logs), "the logs were read back"
    assert any("wiki.train.txt" in a for a in artifacts), "the corpus artifact was read back"
    return "\n".join([parameters, *logs, *artifacts])


def test_the_flow_keeps_no_credentials(prefect_server, tmp_path, wiki_zip):
    from flows.server import drain_prefect_queues
    from flows.settings import Pipeline
    from flows.wiki_pipeline import wiki_pipeline

    with Mirror({"/" + ZIP_NAME: wiki_zip}) as m:
        url = f"http://alice:S3CRET@127.0.0.1:{m.port}/{ZIP_NAME}?token=T0KEN-abc"
        # as `wiki-pipeline run` calls the flow: with the settings objects (a deployment run gets JSON from its
        # caller, which Prefect stores as given: docs/PIPELINE.md says to keep credentials out of those)
        settings = Pipeline.parse(**tiny_flow_parameters(url, tmp_path / "art", run={"only": "corpus"}))
        state = wiki_pipeline(**dict(settings), return_state=True)
        assert state.is_completed(), state
    drain_prefect_queues()  # the run's logs reach the server
    kept = _what_prefect_keeps(state.state_details.flow_run_id)
    assert f"http://***@127.0.0.1:{m.port}/{ZIP_NAME}?token=***" in kept
    assert "S3CRET" not in kept and "T0KEN" not in kept


def test_params_for_a_deployment_keep_the_credentials(capsys):
    """`wiki-pipeline params` prints what a deployment run gets: it must download, so the URL stays whole."""
    from flows.cli import main

    url = "https://alice:S3CRET@mirror.example.org/w.zip?token=T0KEN-abc"
    assert main(["params", "--source-url", url]) == 0
    assert json.loads(capsys.readouterr().out)["corpus"]["source_url"] == url
