"""The wiki-pipeline flow: download Wikipedia, train a BPE tokenizer on it, encode it into token shards, train
mygpt on the shards, sample from the model and export it for the Hugging Face stack.

One parameter per stage -- its settings, with the chapter's defaults (§28.6-28.7) -- plus the run options. The
first line checks them all (``Pipeline.parse``: a ``UserError`` naming the field, before any stage runs); the
prompt is checked against the tokenizer as soon as the tokenizer exists. Each stage reuses its version when the
artifact store has it (the task run then ends ``Cached``); ``run.force=["tokenizer"]`` rebuilds that stage and,
because downstream versions depend on its build, everything after it; ``run.only="model"`` runs just that
stage against the latest published upstream versions (following their lineage).

Stage tasks are called with ``return_state=True`` and ``.result()``: a reused version comes back as a state
named Cached (see ``tasks.core.stage``), and ``.result()`` is its ``StageRef`` whether it was built or reused.
"""

from __future__ import annotations

import time

from prefect import flow, get_run_logger
from prefect.context import TagsContext

from flows import reports
from flows.reports import Outcome
from flows.settings import Pipeline, PipelineBase
from mygpt.errors import UserError
from tasks.core.stage import Stage, StageRef
from tasks.registry import BY_NAME, NAMES, STAGES, code_versions, open_store
from tasks.store import ArtifactStore


@flow(name="wiki-pipeline", description=__doc__.split("\n\n")[0], log_prints=True, validate_parameters=False)
@Pipeline.as_parameters
def wiki_pipeline(**parameters) -> dict[str, StageRef]:
    """The flow. Its parameters (``Pipeline.as_parameters``) are one per stage of ``tasks.registry.STAGES``, that
    stage's settings, plus ``run``; Prefect passes JSON objects for them (``validate_parameters=False``) and
    ``Pipeline.parse`` checks them with the stages' own classes. Every run ends with its summary (and the
    comparisons), a failed one too: the stages it got through, and why it stopped."""
    outcomes: list[Outcome] = []
    root = None
    try:
        s = Pipeline.parse(**parameters)
        root = s.run.root()
        watch_for_crashes()
        with untagged_task_runs():
            refs = run_only(s, outcomes) if s.run.only else run_stages(s, outcomes)
    except Exception as e:
        publish_reports(root, outcomes, failure=e)
        raise
    publish_reports(root, outcomes)
    return refs


def run_stages(s: PipelineBase, outcomes: list[Outcome]) -> dict[str, StageRef]:
    """Every stage in order (corpus -> tokenizer -> shards -> model -> samples -> export), each on its inputs."""
    refs: dict[str, StageRef] = {}
    for stage in STAGES:
        if getattr(s, stage.name).skipped():
            continue
        refs[stage.name] = run_stage(s, stage, {name: refs[name] for name in stage.inputs}, outcomes)
        early_checks(s, stage, refs[stage.name])
    return refs


def run_stage(s: PipelineBase, stage: Stage, inputs: dict[str, StageRef], outcomes: list[Outcome]) -> StageRef:
    """One stage's task on ``inputs``; its outcome (built, Cached or how it failed, and how long it took) goes to
    ``outcomes``."""
    t0 = time.monotonic()
    state = stage.task(**inputs, settings=getattr(s, stage.name), run=s.run, return_state=True)
    try:
        ref = state.result()
    except BaseException:
        outcomes.append(Outcome(stage.name, "", state.name, time.monotonic() - t0))
        raise
    outcomes.append(Outcome(stage.name, ref["version"], state.name, time.monotonic() - t0))
    return ref


def watch_for_crashes() -> None:
    """A run that beats Prefect's heartbeat for the crash automation (tagged ``HEARTBEAT_TAG``: ``wiki-pipeline
    run``, ``serve``, and ``prefect.yaml``'s worker deployment) makes sure the server has that automation, so a
    team whose runs all go through workers gets it too."""
    from prefect.runtime import flow_run

    from flows.server import HEARTBEAT_TAG, ensure_crash_automation

    if HEARTBEAT_TAG in (flow_run.tags or []):
        ensure_crash_automation()


def untagged_task_runs() -> TagsContext:
    """The stages' task runs without the heartbeat tag (a user's own tags stay). The tag marks flow runs for the
    crash automation (``flows.server``); a task run would inherit it from the tags around the flow, and Prefect
    asks the server for a tag-concurrency slot for every tag of every task run before starting it: a request per
    stage for a limit nobody set, and on these 2 cores about one cached rerun in four waited 2-2.5 s on the
    first of them."""
    from flows.server import HEARTBEAT_TAG

    return TagsContext(current_tags=TagsContext.get().current_tags - {HEARTBEAT_TAG})


def publish_reports(root, outcomes: list[Outcome], failure: BaseException | None = None) -> None:
    """The run summary and the version comparisons (``flows.reports``); a report that cannot be made is a
    warning, never a failed run (nor another reason for one)."""
    try:
        reports.publish(root, outcomes, failure)
    except Exception as e:  # the versions are published; a report is an extra
        get_run_logger().warning("could not publish the run summary and comparisons: %s: %s", type(e).__name__, e)


def early_checks(s: PipelineBase, built: Stage, ref: StageRef) -> None:
    """Run the later stages' early checks on ``built`` (e.g. the samples' prompt against the tokenizer), so a
    setting that cannot work stops the run before the expensive stages in between."""
    for stage in STAGES:
        if stage.early_check and stage.early_check[0] == built.name and not getattr(s, stage.name).skipped():
            for warning in stage.early_check[1](getattr(s, stage.name), ref):
                get_run_logger().warning(warning)


def latest_upstream(store: ArtifactStore, stage: str) -> dict[str, StageRef]:
    """The inputs of ``stage`` from the latest published versions that are not stale: the nearest upstream
    stage's latest current version, and the versions it was built from for the others (so tokenizer and shards
    always match; a current version's inputs are current too). When every published version of that stage is
    stale, a ``UserError`` says so: what ``only=`` built from one would be stale at once (no run reuses it and
    ``gc --stale`` deletes it), so it names the stage to run first instead."""
    needed = BY_NAME[stage].inputs
    refs: dict[str, StageRef] = {}
    stale = store.stale_versions(code_versions()) if needed else {}
    for name in sorted(needed, key=NAMES.index, reverse=True):
        if name in refs:
            continue
        versions = store.versions(name)
        if not versions:
            raise UserError(
                f"only={stage!r} needs a published {name} version under {store.root}, and there is "
                "none; run the whole pipeline once first"
            )
        current = [v for v in versions if (name, v.version) not in stale]
        if not current:
            latest = versions[-1]
            raise UserError(
                f"only={stage!r} needs a current {name} version under {store.root}, and every published one is "
                f"stale (the latest, {name}/{latest.version}: {stale[(name, latest.version)]}); run "
                f"only={name!r} first (or the whole pipeline) to build one from the current upstream versions"
            )
        todo = [current[-1]]
        while todo:
            info = todo.pop()
            refs.setdefault(
                info.stage,
                StageRef(
                    stage=info.stage, version=info.version, build_id=info.manifest["build_id"], path=str(info.path)
                ),
            )
            for up_name, up in info.manifest.get("inputs", {}).items():
                if up_name in needed and up_name not in refs:
                    try:
                        todo.append(store.get(up_name, up["version"]))
                    except FileNotFoundError:
                        raise UserError(
                            f"{info.stage}/{info.version} was built from {up_name}/{up['version']}, "
                            "which is no longer published; rerun the whole pipeline"
                        ) from None
    return {name: refs[name] for name in needed}


def run_only(s: PipelineBase, outcomes: list[Outcome]) -> dict[str, StageRef]:
    """Run one stage against the latest upstream versions (``run.only``)."""
    only = s.run.only
    assert only is not None  # the flow calls it only with run.only set
    stage = BY_NAME[only]
    inputs = latest_upstream(open_store(s.run.root()), stage.name)
    get_run_logger().info(
        "only %s: inputs %s", stage.name, ", ".join(f"{k}/{v['version']}" for k, v in inputs.items()) or "(none)"
    )
    return {**inputs, stage.name: run_stage(s, stage, inputs, outcomes)}


if __name__ == "__main__":
    wiki_pipeline()
