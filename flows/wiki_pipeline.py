"""The wiki-pipeline flow: download Wikipedia, train a BPE tokenizer on it, encode it into token shards, train
mygpt on the shards, sample from the model, export it for the Hugging Face stack and evaluate it on held-out text.

One parameter per stage (its settings) plus the run options, checked and resolved by the first line
(``Pipeline.parse``); each stage reuses its version when the store has it (its task run ends ``Cached``);
``run.force`` rebuilds a stage and everything after it, ``run.only`` runs one stage on the latest upstream.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass

from prefect import flow, get_run_logger
from prefect.context import TagsContext

from flows import reports
from flows.reports import Outcome
from flows.settings import LINKED, SHARED_FLAT, Pipeline, PipelineBase
from mygpt.errors import UserError
from tasks.core import ahead, dask_work
from tasks.core.stage import Stage, StageRef, stage_logger
from tasks.registry import BY_NAME, NAMES, STAGES, code_versions, open_store
from tasks.store import ArtifactStore, VersionInfo


@flow(name="wiki-pipeline", description=__doc__.split("\n\n")[0], log_prints=True, validate_parameters=False)
@Pipeline.as_parameters
def wiki_pipeline(**parameters) -> dict[str, StageRef]:
    """The flow: one parameter per stage plus ``run`` (``Pipeline.as_parameters``), JSON objects that
    ``Pipeline.parse`` checks. Every run, a failed one too, ends with its summary and the comparisons."""
    outcomes: list[Outcome] = []
    root = None
    notes: list[str] = []
    try:
        s = Pipeline.parse(**over_the_deployments_groups(parameters))
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


#: The stages whose chunk work runs on Dask: they share one local cluster, closed once the last of them is done.
DASK_STAGES = ("tokenizer", "shards")


def run_stages(s: PipelineBase, outcomes: list[Outcome]) -> dict[str, StageRef]:
    """Every stage in the registry's order, each on its inputs."""
    refs: dict[str, StageRef] = {}
    last_dask = max((i for i, stage in enumerate(STAGES) if stage.name in DASK_STAGES), default=-1)
    plan = ahead.plan((stage, s.resolved(stage.name)) for stage in STAGES if not getattr(s, stage.name).skipped())
    with dask_work.shared_local_clusters() as release, ahead.planned(plan, s.run):
        for i, stage in enumerate(STAGES):
            if i > last_dask:
                release()  # the later stages need the memory its worker processes hold
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


@dataclass(frozen=True)
class Asked:
    """A setting this run asks of an upstream version that it was not built with (``str``: ``field=want (it has
    have)``); ``param``: a ``--param`` can ask for it (a pretrained source's sha256 cannot)."""

    field: str
    want: object
    have: object
    param: bool = True

    def __str__(self) -> str:
        if not self.param:
            return f"{self.field} of {self.want} (it has {self.have})"
        return f"{self.field}={self.want!r} (it has {self.have!r})"

    def as_param(self) -> str:
        value = self.want if isinstance(self.want, str) else json.dumps(self.want)
        return "--param " + shlex.quote(f"{self.field}={value}")


#: ``(stage, a version's manifest) -> what this run asks of that stage that the version was not built with``
#: (``[Asked("tokenizer.kind", "byte", "chapter")]``); empty: it will do.
Differs = Callable[[str, dict], list[Asked]]


def asked_of_upstream(s: PipelineBase, store: ArtifactStore | None = None) -> Differs:
    """What ``only=`` compares an upstream version with: the fields this run gives by name for that stage (any
    upstream stage: ``--only model -p shards.shard_tokens=1000`` asks for shards of 1000 tokens), and those the
    linked groups imply (``corpus.article_index`` for a byte-level tokenizer). Why: ``only=`` runs on the latest
    versions whatever the other groups' defaults say, but a field given by name is asked for, and a run that
    silently took a version built otherwise would log settings it did not use. A shared flat name (``seed``,
    ``device``, ``precision``: :data:`SHARED_FLAT`) given to the stage that runs with the same value is for it
    (``--only samples -p seed=7``), not asked of its inputs. A pretrained tokenizer's ``source`` given by name asks
    for a version of that file's content (its sha256, read once: ``Stage.source``, which with ``store`` falls
    back offline as the stage does)."""
    identities: dict[str, dict | None] = {}
    running = getattr(s, s.run.only) if s.run.only else None

    def for_the_running_stage(key: str, value: object) -> bool:
        return (
            running is not None
            and key in SHARED_FLAT
            and key in running.model_fields_set
            and getattr(running, key) == value
        )

    def differs(name: str, manifest: dict) -> list[Asked]:
        built = manifest.get("settings", {})
        given, resolved = getattr(s, name), s.resolved(name)
        out: list[Asked] = []
        if getattr(resolved, "kind", None) == "pretrained" and "source" in given.model_fields_set:
            source = BY_NAME[name].source
            if name not in identities:
                identities[name] = source(resolved, store, stage_logger(name)) if source else None
            want, have = identities[name] or {}, manifest.get("source") or {}
            if want.get("sha256") != have.get("sha256"):
                out.append(Asked(f"{name}.source", f"sha256 {want.get('sha256')}", have.get("sha256"), param=False))
        wanted = resolved.version_params()
        keys = {k for k in given.model_fields_set if not for_the_running_stage(k, getattr(given, k))}
        if name in LINKED:  # what another group's settings imply for this one counts as asked for
            alone = given.resolved_once()
            keys |= {k for k in wanted if getattr(alone, k) != getattr(resolved, k)}
        fields = type(resolved).model_fields
        for key in sorted(keys & set(wanted)):
            have = built.get(key, fields[key].default)
            if have != wanted[key]:
                out.append(Asked(f"{name}.{key}", wanted[key], have))
        return out

    return differs


def latest_upstream(store: ArtifactStore, stage: str, differs: Differs | None = None) -> dict[str, StageRef]:
    """The inputs of ``stage``: the nearest upstream stage's latest current (not stale) version whose whole
    ancestry has what this run asks of it (``differs``, :func:`asked_of_upstream`: that version's own settings and
    those of every version it was built from, transitively, as the manifests record them), and the versions it was
    built from for the others (so tokenizer and shards always match). Why the whole ancestry: samples built from a
    model whose tokenizer had other merges than asked would be reused while the header logs what was asked.
    ``UserError`` when every version of an input is stale (what ``only=`` built on it would be stale at once), or
    none has the settings asked for: it names the furthest upstream stage to rebuild and a command that works."""
    needed = BY_NAME[stage].inputs
    refs: dict[str, StageRef] = {}
    stale = store.stale_versions(code_versions()) if needed else {}
    differs = differs or (lambda name, manifest: [])
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
        for info in reversed(current):  # the latest whose lineage has what the run asks for
            chosen = _lineage(store, info, needed, refs, strict=info is current[-1])
            if chosen is not None and not [a for n, v in chosen.items() for a in differs(n, v.manifest)]:
                break
        else:
            chosen = _lineage(store, current[-1], needed, refs, strict=True) or {}
            asked = [a for n, v in chosen.items() for a in differs(n, v.manifest)]
            raise UserError(_refusal(store, stage, name, current, asked, differs))
        assert chosen is not None  # the loop ends with a break only on a lineage that fits
        for info in chosen.values():
            refs.setdefault(
                info.stage,
                StageRef(
                    stage=info.stage, version=info.version, build_id=info.manifest["build_id"], path=str(info.path)
                ),
            )
    return {name: refs[name] for name in needed}


def _refusal(
    store: ArtifactStore, stage: str, name: str, current: list[VersionInfo], asked: list[Asked], differs: Differs
) -> str:
    """Why ``only=stage`` has no ``name`` version to take, and what to run: the furthest upstream stage of which no
    current version fits (its ancestry included) must be rebuilt, and everything after it; a whole run with the
    asked settings does that (it rebuilds what differs and reuses the rest). ``--only`` of that stage is offered as
    well only where it would itself be accepted, so the suggested command never leads to another refusal."""
    stale = store.stale_versions(code_versions())
    ancestry, todo = set(), [name]
    while todo:  # name and every stage it is built from
        ancestry.add(up := todo.pop())
        todo += BY_NAME[up].inputs
    nearest_asked = min(NAMES.index(a.field.split(".")[0]) for a in asked)
    stages = {up for up in ancestry if NAMES.index(up) >= nearest_asked}  # the asked stages and those in between

    def fits(up: str) -> bool:
        for info in store.versions(up):
            if (up, info.version) not in stale:
                found = _lineage(store, info, (), {}, strict=False)
                if found is not None and not [a for n, v in found.items() for a in differs(n, v.manifest)]:
                    return True
        return False

    furthest = next(up for up in sorted(stages, key=NAMES.index) if up == name or not fits(up))
    upstream_first = sorted((a for a in asked if a.param), key=lambda a: NAMES.index(a.field.split(".")[0]))
    params = [a.as_param() for a in upstream_first]
    command = " ".join(["wiki-pipeline run", *params, "..."])
    try:
        latest_upstream(store, furthest, differs)
        upto = [a.as_param() for a in upstream_first if NAMES.index(a.field.split(".")[0]) <= NAMES.index(furthest)]
        first = f", or rebuild {furthest} first: {' '.join(['wiki-pipeline run --only', furthest, *upto, '...'])}"
    except UserError:
        first = ""
    ordered = sorted(asked, key=lambda a: -NAMES.index(a.field.split(".")[0]))
    return (
        f"only={stage!r} needs a {name} version built with {', '.join(map(str, ordered))}, and none of the "
        f"{len(current)} current one(s) under {store.root} is (the latest: {name}/{current[-1].version}); the "
        f"furthest upstream stage to rebuild is {furthest}: run the pipeline with this run's settings: {command} "
        f"(a whole run rebuilds what differs and reuses the rest){first}, or leave those settings out to take "
        "the latest"
    )


def _lineage(
    store: ArtifactStore, info: VersionInfo, needed: tuple[str, ...], known: dict, strict: bool
) -> dict[str, VersionInfo] | None:
    """``{stage: VersionInfo}``: ``info`` and every version it was built from, transitively (not already
    ``known``), following manifests; a version no longer published: ``UserError`` when ``strict`` and it is one of
    ``needed``, else None (not ``strict``) or its branch ends there (``strict``, further up than ``needed``: the
    latest stays usable after its far ancestors are collected)."""
    found: dict[str, VersionInfo] = {}
    todo = [info]
    while todo:
        cur = todo.pop()
        found.setdefault(cur.stage, cur)
        for up_name, up in cur.manifest.get("inputs", {}).items():
            if up_name not in known and up_name not in found:
                try:
                    todo.append(store.get(up_name, up["version"]))
                except FileNotFoundError:
                    if not strict:
                        return None
                    if up_name not in needed:
                        continue
                    raise UserError(
                        f"{cur.stage}/{cur.version} was built from {up_name}/{up['version']}, "
                        "which is no longer published; rerun the whole pipeline"
                    ) from None
    return found


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
