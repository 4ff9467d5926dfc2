"""The deployment, end to end, as a user runs it: a real Prefect server on loopback, the deployment runner
(`wiki-pipeline serve`) as its own process, the real `prefect deployment run wiki-pipeline/wiki-pipeline`
command, the tiny preset against a loopback HTTP mirror; then the five UI artifacts read back through the
Prefect API, and the versions they name verified on disk; the deployment's parameter schema shows every stage's
settings with their fields and defaults, and a task run's artifact names its settings."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flows.settings import TINY
from tasks.registry import NAMES, open_store
from tests.support.runner import serving

KEYS = {f"wiki-{name}": name for name in NAMES}


@pytest.fixture
def mirror():
    from flows.mirror import ZIP_NAME, Mirror, build_wikitext_zip

    try:
        data = build_wikitext_zip()
    except FileNotFoundError as e:
        pytest.skip(f"real test text is absent: {e}")
    with Mirror({"/" + ZIP_NAME: data}) as m:
        yield m


@pytest.fixture
def runner(prefect_server, tmp_path, mirror):
    """`wiki-pipeline serve` in its own process group, artifacts under tmp_path/art; its runs may download only
    from the test's mirror and the defaults (its allow-list: unset, a deployment run gets only the defaults, which
    name the demo mirror's port 8765, not this one's)."""
    env = {
        **prefect_server.env,
        "WIKI_PIPELINE_ARTIFACTS": str(tmp_path / "art"),
        "WIKI_PIPELINE_ALLOWED_SOURCES": f"default {mirror.url()}",
    }
    with serving(env, tmp_path / "runner.log") as log_path:
        yield env, tmp_path / "art", log_path


def _artifacts(flow_run_id: str) -> dict:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async def read():
        async with get_client() as client:
            arts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
            )
            return {a.key: a for a in arts if a.key}

    return asyncio.run(read())


def test_prefect_deployment_run_runs_the_pipeline(runner, mirror):
    env, root, runner_log = runner
    prefect = str(Path(sys.executable).with_name("prefect"))
    params = json.dumps({**TINY, "corpus": {"source_url": mirror.url()}})
    done = subprocess.run(
        [
            prefect,
            "deployment",
            "run",
            "wiki-pipeline/wiki-pipeline",
            "--params",
            params,
            "--watch",
            "--watch-timeout",
            "300",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert done.returncode == 0, (
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\nrunner:\n{runner_log.read_text()[-3000:]}"
    )
    assert "Flow run finished successfully in 'Completed'" in done.stdout
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", done.stdout).group(1)

    artifacts = _artifacts(flow_run_id)
    assert set(KEYS) <= set(artifacts), f"missing UI artifacts: {set(KEYS) - set(artifacts)}"
    store = open_store(root)
    versions = {}
    for key, stage in KEYS.items():
        art = artifacts[key]
        assert art.type == "markdown" and art.data
        m = re.fullmatch(rf"\w+ {stage}/([0-9a-f]{{12}})", art.description or "")
        assert m, f"{key}: description {art.description!r} names no version"
        versions[stage] = m.group(1)
        assert store.verify(stage, m.group(1), full=True) == (True, "ok"), f"{key}: files do not verify"
    assert "![loss curve](data:image/svg+xml;base64," in artifacts["wiki-model"].data
    assert "**The history of**" in artifacts["wiki-samples"].data

    model = store.get("model", versions["model"])
    assert model.manifest["inputs"]["shards"]["version"] == versions["shards"], "lineage"
    assert model.manifest["flow_run_id"] == flow_run_id
    samples = (store.version_path("samples", versions["samples"]) / "samples.md").read_text()
    assert "**The history of**" in samples
    from mygpt.checkpoint import load_checkpoint

    load_checkpoint(Path(model.path) / "model.ckpt")
    check_the_ui_shows_every_stages_settings_by_name(flow_run_id)


def _deployment_and_tokenizer_run(flow_run_id: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterTaskRunId, FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            deployment = await client.read_deployment_by_name("wiki-pipeline/wiki-pipeline")
            runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            tokenizer_run = next(r for r in runs if r.name == "tokenizer")
            arts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(task_run_id=ArtifactFilterTaskRunId(any_=[tokenizer_run.id]))
            )
            return deployment, tokenizer_run, arts

    return asyncio.run(read())


def check_the_ui_shows_every_stages_settings_by_name(flow_run_id: str) -> None:
    """The deployment's parameter schema (what the UI's Run form is built from) has one object per stage
    with its fields, types and the chapter's defaults; the tokenizer task run names num_merges and its value."""
    deployment, tokenizer_run, arts = _deployment_and_tokenizer_run(flow_run_id)
    schema = deployment.parameter_openapi_schema
    assert list(schema["properties"]) == [*NAMES, "run"]
    definitions = schema["definitions"]
    tokenizer = definitions[schema["properties"]["tokenizer"]["$ref"].rsplit("/", 1)[1]]["properties"]
    assert tokenizer["num_merges"]["type"] == "integer" and tokenizer["num_merges"]["default"] == 1024
    assert tokenizer["bpe_train_bytes"]["default"] == 50_000_000 and "chapter" in tokenizer["num_merges"]["description"]
    model = definitions[schema["properties"]["model"]["$ref"].rsplit("/", 1)[1]]["properties"]
    assert (model["steps"]["default"], model["embed_dim"]["default"], model["lr"]["default"]) == (10_000, 192, 1e-3)
    assert model["norm"]["enum"] == ["layer", "rms"]

    assert tokenizer_run.state_name == "Completed"
    md = next(a.data for a in arts if a.key == "wiki-tokenizer")
    num_merges, train_bytes = TINY["tokenizer"]["num_merges"], TINY["tokenizer"]["bpe_train_bytes"]
    assert f"| `num_merges` | `{num_merges}` |" in md and f"| `bpe_train_bytes` | `{train_bytes}` |" in md
