"""The wiki-pipeline flow: download Wikipedia, train a BPE tokenizer on it, encode it into token shards, train
mygpt on the shards, sample from the model, export it for the Hugging Face stack and evaluate it on held-out text.

One parameter per stage (its settings) plus the run options, checked and resolved by the first line
(``Pipeline.parse``); each stage reuses its version when the store has it (its task run ends ``Cached``);
``run.force`` rebuilds a stage and everything after it, ``run.only`` runs one stage on the latest upstream.
"""

from __future__ import annotations

import time

from prefect import flow, get_run_logger
from prefect.context import TagsContext

from flows import reports
from flows.only import asked_of_upstream, latest_upstream
from flows.reports import Outcome
from flows.settings import Pipeline, PipelineBase, run_settings
from tasks.core.stage import Stage, StageRef
from tasks.registry import BY_NAME, NAMES, STAGES, open_store


@flow(name="wiki-pipeline", description=__doc__.split("\n\n")[0], log_prints=True, validate_parameters=False)
@Pipeline.as_parameters
def wiki_pipeline(**parameters) -> dict[str, StageRef]:
    """The flow: one parameter per stage plus ``run`` (``Pipeline.as_parameters``), JSON objects that
    ``Pipeline.parse`` checks. Every run, a failed one too, ends with its summary and the comparisons."""
    outcomes: list[Outcome] = []
    root = None
    notes: list[str] = []
    try:
        s = run_settings(over_the_deployments_groups(parameters))
        root = s.run.root()
        notes = log_settings(s)
        watch_for_crashes()
        with untagged_task_runs():
            refs = run_only(s, outcomes) if s.run.only else run_stages(s, outcomes)
    except Exception as e:
        publish_reports(root, outcomes, failure=e, warnings=notes)
        raise
    publish_reports(root, outcomes, warnings=notes)
    return refs


def over_the_deployments_groups(parameters: dict) -> dict:
    """In a deployment's run, each group given as an object on top of the deployment's own group, field by field.
    Why: Prefect merges a run's parameters over the deployment's one level deep, so ``--param model='{"steps": 60}'``
    arrives as the whole ``model`` group and would drop every other field the deployment set (its tiny model
    became the chapter's). A group the run did not give arrives as the deployment's: unchanged."""
    from prefect.runtime import deployment

    if not deployment.id:
        return parameters
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            own = client.read_deployment(deployment.id).parameters or {}
        except ObjectNotFound:  # deleted since it made this run: the run's own parameters are all there is
            get_run_logger().warning(
                "the deployment %s that made this run is gone; its parameters are used as given", deployment.id
            )
            return parameters
    return {
        name: {**own[name], **given} if isinstance(given, dict) and isinstance(own.get(name), dict) else given
        for name, given in parameters.items()
    }


def log_settings(s: PipelineBase) -> list[str]:
    """Log every field of every group as this run uses it (resolved; source_url without credentials), then each
    group's warnings (``Settings.warnings``); returns the warnings, for the run summary."""
    logger = get_run_logger()
    logger.info("settings as this run uses them (every field of every group; defaults included):")
    notes: list[str] = []
    for name in type(s).model_fields:
        group = s.resolved(name)
        logger.info("  %s: %s", name, ", ".join(f"{k}={v!r}" for k, v in group.model_dump(mode="json").items()))
        notes += group.warnings()
    for note in notes:
        logger.warning(note)
    return notes


def run_stages(s: PipelineBase, outcomes: list[Outcome]) -> dict[str, StageRef]:
    """Every stage in the registry's order, each on its inputs; a stage in ``run.force`` is rebuilt with every
    stage built from it. Why name those too: a version names its inputs by their bytes, so a forced stage that
    writes the same bytes would otherwise leave the later stages reused."""
    forced = set(s.run.force)
    for stage in STAGES:  # in order: a stage's inputs come before it
        if forced & set(stage.inputs):
            forced.add(stage.name)
    if forced != set(s.run.force):
        s = s.model_copy(update={"run": s.run.model_copy(update={"force": tuple(n for n in NAMES if n in forced)})})
    refs: dict[str, StageRef] = {}
    for stage in STAGES:
        if getattr(s, stage.name).skipped():
            continue
        refs[stage.name] = run_stage(s, stage, {name: refs[name] for name in stage.inputs}, outcomes)
        early_checks(s, stage, refs[stage.name])
    return refs


def run_stage(s: PipelineBase, stage: Stage, inputs: dict[str, StageRef], outcomes: list[Outcome]) -> StageRef:
    """One stage's task on ``inputs``; its outcome (built, Cached or how it failed; how long) goes to ``outcomes``."""
    t0 = time.monotonic()
    state = stage.task(**inputs, settings=s.resolved(stage.name), run=s.run, return_state=True)
    try:
        ref = state.result()
    except BaseException:
        outcomes.append(Outcome(stage.name, "", state.name, time.monotonic() - t0))
        raise
    outcomes.append(Outcome(stage.name, ref["version"], state.name, time.monotonic() - t0))
    return ref


def watch_for_crashes() -> None:
    """A run tagged ``HEARTBEAT_TAG`` makes sure the server has the crash automation (so runs through workers
    get it too)."""
    from prefect.runtime import flow_run

    from flows.server import HEARTBEAT_TAG, ensure_crash_automation

    if HEARTBEAT_TAG in (flow_run.tags or []):
        ensure_crash_automation()


def untagged_task_runs() -> TagsContext:
    """The stages' task runs without the heartbeat tag (a user's own tags stay): Prefect asks the server for a
    tag-concurrency slot for every tag of every task run, a wait per stage for a limit nobody set."""
    from flows.server import HEARTBEAT_TAG

    return TagsContext(current_tags=TagsContext.get().current_tags - {HEARTBEAT_TAG})


def publish_reports(
    root, outcomes: list[Outcome], failure: BaseException | None = None, warnings: list[str] | None = None
) -> None:
    """The run summary and the comparisons (``flows.reports``); one that cannot be made is a warning, never a
    failed run."""
    try:
        reports.publish(root, outcomes, failure, warnings or [])
    except Exception as e:  # the versions are published; a report is an extra
        get_run_logger().warning("could not publish the run summary and comparisons: %s: %s", type(e).__name__, e)


def early_checks(s: PipelineBase, built: Stage, ref: StageRef) -> None:
    """Run the later stages' early checks on ``built`` (the samples' prompt against the tokenizer), so a setting
    that cannot work stops the run before the expensive stages in between."""
    for stage in STAGES:
        if stage.early_check and stage.early_check[0] == built.name and not getattr(s, stage.name).skipped():
            for warning in stage.early_check[1](s.resolved(stage.name), ref):
                get_run_logger().warning(warning)


def run_only(s: PipelineBase, outcomes: list[Outcome]) -> dict[str, StageRef]:
    """Run one stage against the latest upstream versions (``run.only``)."""
    only = s.run.only
    assert only is not None  # the flow calls it only with run.only set
    stage = BY_NAME[only]
    store = open_store(s.run.root())
    inputs = latest_upstream(store, stage.name, asked_of_upstream(s, store))
    get_run_logger().info(
        "only %s: inputs %s", stage.name, ", ".join(f"{k}/{v['version']}" for k, v in inputs.items()) or "(none)"
    )
    return {**inputs, stage.name: run_stage(s, stage, inputs, outcomes)}


if __name__ == "__main__":
    wiki_pipeline()
