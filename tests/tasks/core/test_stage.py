"""Stage.reuse_or_build under a real Prefect server: reuse shows as Cached; force, damage and rebuilds
invalidate; nothing is cached by Prefect itself. The task is derived from the Stage."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tasks.core.settings import RunOptions, Settings
from tasks.core.stage import Stage, stage_task
from tests.support.prefect_server import task_run_states

BUILDS: list[str] = []


class WordSettings(Settings):
    word: str = "x"


class NoSettings(Settings):
    pass


def _build_source(ctx, settings: WordSettings) -> dict:
    BUILDS.append("source")
    (ctx.out / "a.txt").write_text("hello " + settings.word)
    ctx.progress(1, 2, "half way", force=True)
    return {"chars": 6 + len(settings.word)}


def _build_upper(ctx, settings: NoSettings, corpus: Path) -> dict:
    BUILDS.append("upper")
    (ctx.out / "b.txt").write_text((corpus / "a.txt").read_text().upper())
    return {}


SOURCE = Stage("corpus", WordSettings, "1", _build_source, lambda m: f"# source {m['version']}")
UPPER = Stage("tokenizer", NoSettings, "1", _build_upper, lambda m: "# upper")
make_source = stage_task(SOURCE, "make_source", "Make the source.")
make_upper = stage_task(UPPER, "make_upper", "Upper-case the source.")


@pytest.fixture(scope="module")
def two_stage_flow():
    from prefect import flow

    @flow(name="two-stage-test")
    def two_stage(root: str, word: str = "x", force: list[str] = []):
        run = RunOptions(artifacts_dir=root, force=force)
        corpus = make_source(WordSettings(word=word), run, return_state=True).result()
        return corpus, make_upper(corpus, NoSettings(), run, return_state=True).result()

    return two_stage


def _run(flow_fn, *args, **kwargs):
    BUILDS.clear()
    state = flow_fn(*args, return_state=True, **kwargs)
    corpus, upper = state.result()
    return corpus, upper, task_run_states(state.state_details.flow_run_id), list(BUILDS)


def test_reuse_is_cached_and_force_damage_rebuild(prefect_server, tmp_path, two_stage_flow):
    root = str(tmp_path / "art")
    c1, u1, states, builds = _run(two_stage_flow, root)
    assert states == {"corpus": "Completed", "tokenizer": "Completed"} and builds == ["source", "upper"]
    assert (Path(u1["path"]) / "b.txt").read_text() == "HELLO X"

    c2, u2, states, builds = _run(two_stage_flow, root)
    assert states == {"corpus": "Cached", "tokenizer": "Cached"} and builds == []
    assert (c2, u2) == (c1, u1)

    # Forcing the first stage rebuilds it in place; its bytes are the same, so the second stage, which names it
    # by its content digest, keeps its version and is reused.
    c3, u3, states, builds = _run(two_stage_flow, root, force=["corpus"])
    assert states == {"corpus": "Completed", "tokenizer": "Cached"} and builds == ["source"]
    assert c3["version"] == c1["version"] and c3["build_id"] != c1["build_id"]
    assert u3 == u1

    # A damaged file is detected before anything is reused, logged and rebuilt.
    (Path(u3["path"]) / "b.txt").write_text("X")
    _c4, u4, states, builds = _run(two_stage_flow, root)
    assert states == {"corpus": "Cached", "tokenizer": "Completed"} and builds == ["upper"]
    assert (Path(u4["path"]) / "b.txt").read_text() == "HELLO X"

    # A settings change is a new version beside the old one.
    c5, u5, states, builds = _run(two_stage_flow, root, word="y")
    assert c5["version"] != c1["version"] and Path(c1["path"]).is_dir()
    assert (Path(u5["path"]) / "b.txt").read_text() == "HELLO Y"

    # One cache: Prefect kept no cache records or results anywhere under the artifact root.
    assert sorted(p.name for p in Path(root).iterdir()) == ["corpus", "tokenizer"]


def test_plain_call_without_prefect_and_input_check(tmp_path):
    run = RunOptions(artifacts_dir=str(tmp_path))
    ref = make_source.fn(WordSettings(word="plain"), run)
    assert (Path(ref["path"]) / "a.txt").read_text() == "hello plain"
    assert make_source.fn(WordSettings(word="plain"), run)["build_id"] == ref["build_id"]
    with pytest.raises(ValueError, match=r"takes inputs \['corpus'\], got \[\]"):
        UPPER.reuse_or_build(NoSettings(), run, {})


def test_failed_build_publishes_nothing(tmp_path):
    def boom(ctx, settings):
        (ctx.out / "partial.txt").write_text("half")
        raise RuntimeError("disk on fire")

    stage = Stage("corpus", NoSettings, "1", boom, lambda m: "")
    with pytest.raises(RuntimeError, match="disk on fire"):
        stage.reuse_or_build(NoSettings(), RunOptions(artifacts_dir=str(tmp_path)), {})
    assert list((tmp_path / "corpus").iterdir()) != [] and not any(
        p.name != ".staging" and p.name != ".locks" for p in (tmp_path / "corpus").iterdir()
    )


def test_a_manifest_records_its_inputs_lineage_but_no_path(tmp_path):
    """An input's path belongs to the root it was read from; the manifest keeps stage, version, build id and
    content digest only, so a moved or copied root holds nothing of where it came from."""
    import json

    from tasks.store import content_digest

    run = RunOptions(artifacts_dir=str(tmp_path))
    corpus = make_source.fn(WordSettings(word="lineage"), run)
    upper = make_upper.fn(corpus, NoSettings(), run)
    manifest = json.loads((Path(upper["path"]) / "manifest.json").read_text())
    digest = content_digest(json.loads((Path(corpus["path"]) / "manifest.json").read_text()))
    assert manifest["inputs"] == {
        "corpus": {"stage": "corpus", "version": corpus["version"], "build_id": corpus["build_id"], "digest": digest}
    }
    assert str(tmp_path) not in json.dumps(manifest)


def test_pace_shows_rate_and_eta_of_the_current_phase():
    from tasks.core.progress import Pace, human_seconds

    tokens = Pace(("tokens", 4096))
    assert tokens.update(100, 1000, now=10.0) == ""  # a resumed build: the pace counts from here
    # 5 steps/s x 4096, 850 steps left; wall-clock: what training's own throughput line does not count is in it
    assert tokens.update(150, 1000, now=20.0) == "20.5k tokens/s wall-clock · ETA 2m50s"
    assert tokens.update(1000, 1000, now=30.0) == "184.3k tokens/s wall-clock"  # 900 steps in 20 s, nothing left
    data = Pace(("B", 1))
    data.update(0, 8 << 20, now=0.0)
    assert data.update(4 << 20, 8 << 20, now=2.0) == "2.0 MB/s · ETA 2s"
    assert data.update(1 << 20, 3 << 20, now=3.0) == "", "a new phase (another total) starts a new measurement"
    assert Pace().update(0, 10, now=0.0) == "" and Pace().update(5, 10, now=5.0) == ""
    eta_only = Pace()
    eta_only.update(0, 10, now=0.0)
    assert eta_only.update(5, 10, now=5.0) == "ETA 5s"
    assert [human_seconds(s) for s in (45, 725, 7380)] == ["45s", "12m05s", "2h03m"]


def test_progress_log_line_carries_the_pace(tmp_path, caplog):
    def slow_build(ctx, settings):
        (ctx.out / "a.txt").write_text("x")
        ctx._pace.start = (0.0, 0.0, 4.0)  # as if the build had started a while ago, with nothing done
        ctx.progress(1, 4, "step 1/4", force=True)
        return {}

    with caplog.at_level("INFO", logger="wiki_pipeline"):
        Stage("corpus", NoSettings, "1", slow_build, lambda m: "").reuse_or_build(
            NoSettings(), RunOptions(artifacts_dir=str(tmp_path)), {}
        )
    line = next(r.getMessage() for r in caplog.records if "step 1/4" in r.getMessage())
    assert re.search(r"corpus:  25\.0% step 1/4 · ETA \d+", line), line


def test_the_task_is_derived_from_the_stage():
    """Inputs named once (the build's parameters); the task takes them positionally or by name, then settings
    and run, and is named after the stage."""
    import inspect

    assert UPPER.inputs == ("corpus",) and SOURCE.inputs == ()
    assert list(inspect.signature(make_upper.fn).parameters) == ["corpus", "settings", "run"]
    assert inspect.signature(make_upper.fn).parameters["settings"].default == NoSettings()
    assert make_upper.name == "tokenizer" and make_upper.fn.__name__ == "make_upper" and UPPER.task is make_upper
    assert make_upper.fn.__doc__ == "Upper-case the source."


def test_settings_are_resolved_once(tmp_path, monkeypatch):
    """The flow hands resolved settings (``Pipeline.parse``); a plain call resolves them in the stage; neither
    resolves twice."""
    calls = []

    class Counted(WordSettings):
        def resolved(self):
            calls.append(self.word)
            return self.model_copy(update={"word": self.word.upper()})

    def build(ctx, settings):
        (ctx.out / "a.txt").write_text(settings.word)
        return {}

    stage = Stage("corpus", Counted, "1", build, lambda m: "")
    run = RunOptions(artifacts_dir=str(tmp_path))
    ref = stage.reuse_or_build(Counted(word="a"), run, {})
    assert calls == ["a"] and (Path(ref["path"]) / "a.txt").read_text() == "A"
    settled = Counted(word="b").resolved_once()
    assert settled.resolved_once() is settled and calls == ["a", "b"]
    stage.reuse_or_build(settled, run, {})
    assert calls == ["a", "b"], "resolved settings are not resolved again"
    assert settled.model_copy(update={"word": "c"}).resolved_once().word == "C" and calls[-1] == "c"


def test_an_input_is_named_by_its_bytes(tmp_path):
    """Equal input bytes on two roots give equal downstream versions; an input rebuilt with other bytes gives a
    new one and leaves the version built from the old bytes stale."""
    from tasks.store import ArtifactStore

    ups = []
    for root in (tmp_path / "a", tmp_path / "b"):
        run = RunOptions(artifacts_dir=str(root))
        corpus = make_source.fn(WordSettings(word="same"), run)
        ups.append((corpus, make_upper.fn(corpus, NoSettings(), run)))
    (ca, ua), (cb, ub) = ups
    assert ca["build_id"] != cb["build_id"] and ua["version"] == ub["version"]

    # the corpus of root b rebuilt in place with other bytes (same version id: its settings did not change)
    def other_bytes(ctx, settings: WordSettings) -> dict:
        (ctx.out / "a.txt").write_text("other bytes")
        return {}

    run_b = RunOptions(artifacts_dir=str(tmp_path / "b"), force=("corpus",))
    rebuilt = Stage("corpus", WordSettings, "1", other_bytes, lambda m: "").reuse_or_build(
        WordSettings(word="same"), run_b, {}
    )
    assert rebuilt["version"] == cb["version"]
    stale = ArtifactStore(tmp_path / "b", ("corpus", "tokenizer")).stale_versions({"corpus": "1", "tokenizer": "1"})
    assert stale == {
        ("tokenizer", ub["version"]): f"its input corpus/{cb['version']} was rebuilt with other "
        "bytes since, so no run reuses it"
    }
    again = make_upper.fn(rebuilt, NoSettings(), RunOptions(artifacts_dir=str(tmp_path / "b")))
    assert again["version"] != ub["version"] and (Path(again["path"]) / "b.txt").read_text() == "OTHER BYTES"
