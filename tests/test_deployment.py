"""The deployment, end to end, as a user runs it: a real Prefect server on loopback, the deployment runner
(`wiki-pipeline serve`) as its own process, the real `prefect deployment run wiki-pipeline/wiki-pipeline`
command, the tiny preset against a loopback HTTP mirror; then the five UI artifacts read back through the
Prefect API, and the versions they name verified on disk."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.params import TINY
from tasks.store import ArtifactStore

KEYS = {"wiki-corpus": "corpus", "wiki-tokenizer": "tokenizer", "wiki-shards": "shards",
        "wiki-training": "model", "wiki-samples": "samples"}


@pytest.fixture
def mirror():
    from bench.mirror import ZIP_NAME, Mirror, build_wikitext_zip

    try:
        data = build_wikitext_zip()
    except FileNotFoundError as e:
        pytest.skip(f"real test text is absent: {e}")
    with Mirror({"/" + ZIP_NAME: data}) as m:
        yield m


@pytest.fixture
def runner(prefect_server, tmp_path):
    """`wiki-pipeline serve` in its own process group, artifacts under tmp_path/art."""
    env = {**prefect_server.env, "WIKI_PIPELINE_ARTIFACTS": str(tmp_path / "art")}
    log_path = tmp_path / "runner.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "is being served" not in log_path.read_text():
            assert proc.poll() is None, f"the runner exited:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the runner did not start:\n{log_path.read_text()[-3000:]}"
            time.sleep(0.5)
        yield env, tmp_path / "art", log_path
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _artifacts(flow_run_id: str) -> dict:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async def read():
        async with get_client() as client:
            arts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
            return {a.key: a for a in arts if a.key}

    return asyncio.run(read())


def test_prefect_deployment_run_runs_the_pipeline(runner, mirror):
    env, root, runner_log = runner
    prefect = str(Path(sys.executable).with_name("prefect"))
    params = json.dumps({**TINY, "source_url": mirror.url()})
    done = subprocess.run([prefect, "deployment", "run", "wiki-pipeline/wiki-pipeline", "--params", params,
                           "--watch", "--watch-timeout", "300"], env=env, capture_output=True, text=True, timeout=360)
    assert done.returncode == 0, \
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\nrunner:\n{runner_log.read_text()[-3000:]}"
    assert "Flow run finished successfully in 'Completed'" in done.stdout
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", done.stdout).group(1)

    artifacts = _artifacts(flow_run_id)
    assert set(KEYS) <= set(artifacts), f"missing UI artifacts: {set(KEYS) - set(artifacts)}"
    store = ArtifactStore(root)
    versions = {}
    for key, stage in KEYS.items():
        art = artifacts[key]
        assert art.type == "markdown" and art.data
        m = re.fullmatch(rf"\w+ {stage}/([0-9a-f]{{12}})", art.description or "")
        assert m, f"{key}: description {art.description!r} names no version"
        versions[stage] = m.group(1)
        assert store.verify(stage, m.group(1), full=True) == (True, "ok"), f"{key}: files do not verify"
    assert "![loss curve](data:image/svg+xml;base64," in artifacts["wiki-training"].data
    assert "**The history of**" in artifacts["wiki-samples"].data

    model = store.get("model", versions["model"])
    assert model.manifest["inputs"]["shards"]["version"] == versions["shards"], "lineage"
    assert model.manifest["flow_run_id"] == flow_run_id
    samples = (store.version_path("samples", versions["samples"]) / "samples.md").read_text()
    assert "**The history of**" in samples
    from mygpt.checkpoint import load_checkpoint

    load_checkpoint(model.path / "model.ckpt")
