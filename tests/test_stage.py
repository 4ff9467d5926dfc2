"""The stage wrapper under a real Prefect server: reuse shows as Cached; force, damage and rebuilds invalidate."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.stage import StageSpec, execute, run_stage, stage_task
from tests.prefect_server import task_run_states

BUILDS: list[str] = []


def _build_source(ctx):
    BUILDS.append("source")
    (ctx.out / "a.txt").write_text("hello " + ctx.params["word"])
    ctx.progress(1, 2, "half way", force=True)
    return {"chars": 6 + len(ctx.params["word"])}


def _build_upper(ctx):
    BUILDS.append("upper")
    (ctx.out / "b.txt").write_text((ctx.input_path("corpus") / "a.txt").read_text().upper())
    return {}


SOURCE = StageSpec("corpus", "t-source", "t-source", "1", _build_source, lambda m: f"# source {m['version']}")
UPPER = StageSpec("tokenizer", "t-upper", "t-upper", "1", _build_upper, lambda m: "# upper", inputs=("corpus",))


@pytest.fixture(scope="module")
def two_stage_flow():
    from prefect import flow

    source_task, upper_task = stage_task(SOURCE), stage_task(UPPER)

    @flow(name="two-stage-test")
    def two_stage(root: str, word: str = "x", force: list[str] = []):
        corpus = run_stage(source_task, root, {"word": word}, force="t-source" in force)
        return corpus, run_stage(upper_task, root, {}, {"corpus": corpus}, force="t-upper" in force)

    return two_stage


def _run(flow_fn, *args, **kwargs):
    BUILDS.clear()
    state = flow_fn(*args, return_state=True, **kwargs)
    corpus, upper = state.result()
    return corpus, upper, task_run_states(state.state_details.flow_run_id), list(BUILDS)


def test_reuse_is_cached_and_force_damage_rebuild(prefect_server, tmp_path, two_stage_flow):
    root = str(tmp_path / "art")
    c1, u1, states, builds = _run(two_stage_flow, root)
    assert states == {"t-source": "Completed", "t-upper": "Completed"} and builds == ["source", "upper"]
    assert (Path(u1["path"]) / "b.txt").read_text() == "HELLO X"

    c2, u2, states, builds = _run(two_stage_flow, root)
    assert states == {"t-source": "Cached", "t-upper": "Cached"} and builds == []
    assert (c2, u2) == (c1, u1)

    # Forcing the first stage rebuilds it in place and gives the second stage a new version (lineage).
    c3, u3, states, builds = _run(two_stage_flow, root, force=["t-source"])
    assert states == {"t-source": "Completed", "t-upper": "Completed"} and builds == ["source", "upper"]
    assert c3["version"] == c1["version"] and c3["build_id"] != c1["build_id"]
    assert u3["version"] != u1["version"] and Path(u1["path"]).is_dir(), "old downstream version is kept"

    # A damaged file is detected before Prefect's cache is consulted, logged and rebuilt.
    (Path(u3["path"]) / "b.txt").write_text("X")
    c4, u4, states, builds = _run(two_stage_flow, root)
    assert states == {"t-source": "Cached", "t-upper": "Completed"} and builds == ["upper"]
    assert (Path(u4["path"]) / "b.txt").read_text() == "HELLO X"

    # A parameter change is a new version beside the old one.
    c5, u5, states, builds = _run(two_stage_flow, root, word="y")
    assert c5["version"] != c1["version"] and Path(c1["path"]).is_dir()
    assert (Path(u5["path"]) / "b.txt").read_text() == "HELLO Y"


def test_execute_without_prefect_and_input_check(tmp_path):
    ref = execute(SOURCE, tmp_path, {"word": "plain"})
    assert (Path(ref["path"]) / "a.txt").read_text() == "hello plain"
    assert execute(SOURCE, tmp_path, {"word": "plain"})["build_id"] == ref["build_id"]
    with pytest.raises(ValueError, match=r"needs inputs \['corpus'\]"):
        execute(UPPER, tmp_path, {})


def test_failed_build_publishes_nothing(tmp_path):
    def boom(ctx):
        (ctx.out / "partial.txt").write_text("half")
        raise RuntimeError("disk on fire")

    spec = StageSpec("corpus", "t-boom", "t-boom", "1", boom, lambda m: "")
    with pytest.raises(RuntimeError, match="disk on fire"):
        execute(spec, tmp_path, {})
    assert list((tmp_path / "corpus").iterdir()) != [] and not any(
        p.name != ".staging" and p.name != ".locks" for p in (tmp_path / "corpus").iterdir())
