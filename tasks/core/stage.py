"""Running a stage: reuse its version from the artifact store, or build it in staging and publish it.

A stage module holds its settings, a ``build`` function, a ``report``, ``STAGE = Stage(...)`` and
``task = stage_task(STAGE, ...)``; the steps of :meth:`Stage.reuse_or_build` are in docs/STAGES.md.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypedDict, TypeVar, cast
from uuid import UUID

from mygpt.errors import UserError
from tasks.core.disk_full import disk_full_named
from tasks.core.faults import fault_point
from tasks.core.progress import Pace
from tasks.core.report import human_bytes, settings_table
from tasks.core.settings import RunOptions, Settings
from tasks.store import ArtifactStore, Build, content_digest, version_id

log = logging.getLogger("wiki_pipeline")

S = TypeVar("S", bound=Settings)


class StageRef(TypedDict):
    """A published version, as stage tasks return it and downstream stages take it (JSON-serialisable)."""

    stage: str
    version: str
    build_id: str
    path: str


# ---- Prefect context, when there is one ------------------------------------------------------------------
def in_task_run() -> bool:
    from prefect.context import TaskRunContext

    return TaskRunContext.get() is not None


def stage_logger(stage: str):
    if in_task_run():
        from prefect.logging import get_run_logger

        return get_run_logger()
    return logging.getLogger(f"wiki_pipeline.{stage}")


def _flow_run_id() -> str | None:
    if not in_task_run():
        return None
    from prefect.runtime import flow_run

    return flow_run.id


def ref_dir(ref: StageRef) -> Path:
    """A local directory holding the version ``ref`` names (for an object-store root: a verified local copy)."""
    where, suffix = ref["path"], f"/{ref['stage']}/{ref['version']}"
    if not where.endswith(suffix) or "://" not in where:
        return Path(where)
    return ArtifactStore(where.removesuffix(suffix)).local_copy(ref["stage"], ref["version"])


def lineage(name: str, ref: StageRef, digest: str) -> dict:
    """What a manifest records of an input: stage, version, build id and content digest, never a path (a root can
    be moved)."""
    return {"stage": ref.get("stage", name), "version": ref["version"], "build_id": ref["build_id"], "digest": digest}


class BuildContext(Generic[S]):
    """What a stage's build function gets besides its settings and input directories."""

    def __init__(
        self,
        stage: str,
        store: ArtifactStore,
        version: str,
        run: RunOptions,
        build: Build,
        inputs: dict[str, StageRef],
        logger,
        rate_unit: tuple[str, float] | None = None,
        source: dict | None = None,
    ) -> None:
        self.stage, self.store, self.version, self.run = stage, store, version, run
        self.build, self.inputs, self.log = build, inputs, logger
        self.source = source  # the identity of what a stage with Stage.source reads (what the version names)
        self._progress_id: UUID | None = None
        self._progress_last = (0.0, -1.0)  # (time, percent) of the last report
        self._pace = Pace(rate_unit)

    @property
    def out(self) -> Path:
        """Directory whose files become the published version."""
        return self.build.out

    @property
    def work(self) -> Path:
        """Scratch and resume state; survives a crash, deleted on publish."""
        return self.build.work

    @property
    def resumed(self) -> bool:
        return self.build.resumed

    def save(self, *paths: Path) -> None:
        """Mark ``paths`` as resume state (on an object-store root: uploaded now, see ``Build.save``)."""
        self.build.save(*paths)

    def worker_path(self, name: str, rel: str) -> str:
        """Where a Dask worker reads the file ``rel`` of the input ``name``: where it is published for an external
        cluster (a path or an ``s3://`` URL), else the local copy the build reads (the workers share this disk)."""
        version = self.inputs[name]["version"]
        if self.run.dask_address:
            return self.store.file_location(name, version, rel)
        return str(self.store.local_copy(name, version) / rel)

    def shared_file(self, path: Path, rel: str) -> str:
        """Where a Dask worker of an external cluster reads ``path``, a file this build reads: its copy in the
        store on an object-store root (:meth:`tasks.store.build.Build.shared`), else ``path``."""
        return self.build.shared(path, rel)

    def progress(self, done: float, total: float, message: str = "", force: bool = False) -> None:
        """Report progress: a log line (at most every 10 s or 10 %) and a Prefect progress artifact."""
        fault_point(f"{self.stage}.progress")
        self.build.check_lease()  # a build whose lock was taken over stops here (another run builds the version)
        pct = 100.0 * done / total if total else 100.0
        now = time.monotonic()
        pace = self._pace.update(done, total, now)
        last_t, last_pct = self._progress_last
        if not force and now - last_t < 10 and pct - last_pct < 10 and pct < 100:
            return
        self._progress_last = (now, pct)
        message = " · ".join(part for part in (message, pace) if part)
        self.log.info("%s: %5.1f%% %s", self.stage, pct, message)
        if in_task_run():
            from prefect.artifacts import create_progress_artifact, update_progress_artifact

            description = f"{self.stage} {self.version}: {message}"
            if self._progress_id is None:
                # Called from sync code, Prefect's async_dispatch runs it and returns the id, not a coroutine.
                self._progress_id = cast(UUID, create_progress_artifact(progress=pct, description=description))
            else:
                update_progress_artifact(self._progress_id, progress=pct, description=description)


Column = tuple[str, Callable[[dict], str]]  # (title, metrics -> cell) of a comparison table


@dataclass(frozen=True)
class Stage:
    """One stage: the noun it makes, its settings, build, code version, UI report and run-summary facts.

    Its inputs are the build function's parameters after ``(ctx, settings)``: named once. ``tasks.registry``
    lists the stages; everything that lists stages derives from that list (see docs/PIPELINE.md)."""

    name: str  # the store folder, the Prefect task, the flow parameter, the UI key
    settings: type[Settings]  # the flow parameter's type, the home of its defaults
    code_version: str  # bump when the output for the same settings and inputs changes
    build: Callable[..., dict]  # build(ctx, settings, **input_dirs) -> metrics; writes ctx.out
    report: Callable[[dict], str]  # manifest (plus "path") -> markdown for the UI
    #: For a stage that reads from outside the store (the corpus): ``(settings, store, logger) -> {...}``, the
    #: identity of what it would read now; it enters the version id, so new content gives a new version (None from
    #: it: these settings read nothing outside the store).
    source: Callable[..., dict | None] | None = None
    #: ``(upstream stage, check(settings, upstream_ref) -> warnings)``, run as soon as that upstream exists;
    #: raises ``UserError`` for settings that cannot work.
    early_check: tuple[str, Callable[[Any, StageRef], list[str]]] | None = None
    #: What the build reads from the environment (a ``WIKI_PIPELINE_*`` knob), checked by the flow before any stage
    #: runs, for each stage the run will run: raises ``UserError`` naming the variable. Why before: a bad value
    #: would otherwise fail the run only when this stage starts, after the stages before it.
    check_environment: Callable[[], object] | None = None
    alias: str | None = None  # the older verb (``train`` for model), still accepted where a user names a stage
    headline: Callable[[dict], str] | None = None  # metrics -> the run summary's one number
    columns: tuple[Column, ...] = ()  # metrics -> cells of a version comparison
    #: The stage whose comparison :attr:`columns` join (matched by that input's version); None: this stage's own.
    columns_for: str | None = None
    chart: Callable[[list], str] | None = None  # versions -> a markdown chart atop this stage's comparison
    shared_flat: tuple[str, ...] = ()  # fields a flat name (``--param seed=``) sets here and in other stages
    tiny: dict = field(default_factory=dict, compare=False)  # this stage's part of the tiny preset
    #: Inputs the build reads file by file as it needs them (``ctx.store.fetch_bytes``), never copied whole first.
    streamed: tuple[str, ...] = ()
    #: The stage's Prefect task, bound by :func:`stage_task`: ``task(*inputs, settings, run) -> StageRef``.
    task: Any = field(default=None, init=False, compare=False, repr=False)

    @property
    def inputs(self) -> tuple[str, ...]:
        """The upstream stages, in the build function's order."""
        return tuple(inspect.signature(self.build).parameters)[2:]

    @property
    def artifact_key(self) -> str:
        return f"wiki-{self.name}"

    def version(self, settings: Settings, digests: dict[str, str], source: dict | None = None) -> str:
        """The version id for resolved ``settings``, the inputs' content digests (``content_digest`` of each input's
        manifest, by input name) and (with :attr:`source`) what it reads. Why digests, not build ids: equal bytes
        give equal ids on any root, and an input rebuilt with equal bytes leaves its users current."""
        return version_id(
            self.name, settings.version_params(), dict(sorted(digests.items())), self.code_version, source
        )

    def reuse_or_build(self, settings: S, run: RunOptions, inputs: dict[str, StageRef]) -> Any:
        """This stage's version for ``settings`` and ``inputs``: reused if published and verified, else built.

        Returns the :class:`StageRef`, or inside a Prefect task run a ``Cached``/``Completed`` state holding it."""
        if set(inputs) != set(self.inputs):
            raise ValueError(f"stage {self.name} takes inputs {list(self.inputs)}, got {sorted(inputs)}")
        settings = settings.resolved_once()  # a no-op for settings the flow resolved (Pipeline.parse)
        store = ArtifactStore(run.root())
        logger = stage_logger(self.name)
        with disk_full_named(self.name, store.root), contextlib.ExitStack() as pins:
            for name, ref in sorted(inputs.items()):  # read-pinned while this stage runs: gc keeps them
                pins.enter_context(store.pin(name, ref["version"], on_wait=self._pin_wait(logger, name, ref)))
            return self._reuse_or_build_pinned(settings, run, store, logger, inputs)

    def _pin_wait(self, logger: Any, name: str, ref: StageRef) -> Callable[[], None]:
        def waiting() -> None:
            logger.info(
                "%s: %s/%s is being built, rebuilt or collected; waiting for it", self.name, name, ref["version"]
            )

        return waiting

    def _reuse_or_build_pinned(
        self,
        settings: S,
        run: RunOptions,
        store: ArtifactStore,
        logger: Any,
        inputs: dict[str, StageRef],
    ) -> Any:
        input_dirs = {}
        digests = {}
        for name, up in inputs.items():
            manifest = store.read_manifest(name, up["version"])
            if manifest is None:
                raise UserError(
                    f"{self.name} needs {name}/{up['version']}, which is not published under "
                    f"{store.root}; run the stages before it first"
                )
            digests[name] = content_digest(manifest)
        source = self.source(settings, store, logger) if self.source else None
        version = self.version(settings, digests, source)
        force = self.name in run.force

        def ref(manifest: dict) -> StageRef:
            return StageRef(
                stage=self.name,
                version=version,
                build_id=manifest["build_id"],
                path=store.location(self.name, version),
            )

        def waiting() -> None:
            logger.info("%s %s: another run is building this version; waiting for it", self.name, version)

        with store.lock(self.name, version, on_wait=waiting):
            published, reason = store.intact_manifest(self.name, version, full=run.full_check)
            if published is not None and not force:
                logger.info("%s: reusing %s/%s", self.name, self.name, version)
                store.drop_staging(self.name, version)  # left by a run killed between publish and clean-up
                return self._final(ref(published), published, reused=True)
            if published is not None:
                logger.info("%s: rebuilding %s/%s (forced)", self.name, self.name, version)
            elif reason != "missing":
                logger.warning("%s: %s/%s is damaged (%s); rebuilding it", self.name, self.name, version, reason)
                store.discard(self.name, version, reason)
            staging = store.open_build(self.name, version)
            if force:
                staging.reset()  # a forced build starts from nothing, whatever an earlier attempt left
            for name, up in sorted(inputs.items()):  # local directories (for an object-store root: verified copies)
                streamed = name in self.streamed  # where it would lie: the build reads it file by file
                input_dirs[name] = (
                    store.version_path(name, up["version"])
                    if streamed
                    else store.local_copy(name, up["version"], full=run.full_check)
                )
            logger.info(
                "%s: building %s/%s%s",
                self.name,
                self.name,
                version,
                " (resuming from an interrupted attempt)" if staging.resumed else "",
            )
            ctx: BuildContext[S] = BuildContext(
                self.name,
                store,
                version,
                run,
                staging,
                dict(inputs),
                logger,
                rate_unit=settings.progress_unit(),
                source=source,
            )
            fault_point(f"{self.name}.start")
            t0 = time.time()
            metrics = self.build(ctx, settings, **input_dirs) or {}
            seconds = round(time.time() - t0, 3)
            manifest = staging.publish(
                settings=settings.version_params(),
                inputs={k: lineage(k, v, digests[k]) for k, v in inputs.items()},
                code_version=self.code_version,
                metrics=metrics,
                timings={"build_seconds": seconds},
                extra={"flow_run_id": _flow_run_id(), **({"source": source} if source is not None else {})},
                fault=lambda where: fault_point(f"{self.name}.{where}"),
            )
            logger.info("%s: published %s/%s in %.1fs", self.name, self.name, version, seconds)
        if in_task_run():
            from prefect.artifacts import create_markdown_artifact

            create_markdown_artifact(
                key=self.artifact_key,
                description=f"built {self.name}/{version}",
                markdown=self.report({**manifest, "path": store.location(self.name, version)})
                + settings_table(manifest["settings"]),
            )
        return self._final(ref(manifest), manifest, reused=False)

    def _final(self, ref: StageRef, manifest: dict, reused: bool) -> Any:
        """The ref, or in a task run a ``Cached``/``Completed`` state holding it, its message what ``wiki-pipeline
        wait`` prints (``reused corpus/<version> · 1.2 MB``)."""
        if not in_task_run():
            return ref
        from prefect.states import Completed

        size = human_bytes(sum(f["size"] for f in manifest.get("files", {}).values()))
        message = f"{'reused' if reused else 'built'} {ref['stage']}/{ref['version']} · {size}"
        return Completed(name="Cached" if reused else "Completed", message=message, data=ref)


def stage_task(stage: Stage, name: str, doc: str) -> Any:
    """The stage's Prefect task, the function ``name(*inputs, settings, run) -> StageRef`` with docstring ``doc``:
    task and task runs named after the stage, no Prefect caching and no persisted results (the artifact store
    decides reuse). Bound to ``stage.task``."""
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    signature = inspect.Signature(
        [inspect.Parameter(i, kind, annotation=StageRef) for i in stage.inputs]
        + [
            inspect.Parameter("settings", kind, default=stage.settings(), annotation=stage.settings),
            inspect.Parameter("run", kind, default=RunOptions(), annotation=RunOptions),
        ],
        return_annotation=StageRef,
    )

    def fn(*args: Any, **kwargs: Any) -> Any:
        given = signature.bind(*args, **kwargs)
        given.apply_defaults()
        a = given.arguments
        return stage.reuse_or_build(a["settings"], a["run"], {i: a[i] for i in stage.inputs})

    fn.__signature__ = signature  # type: ignore[attr-defined]
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    fn.__module__ = stage.build.__module__
    decorated = task(name=stage.name, task_run_name=stage.name, cache_policy=NO_CACHE, persist_result=False)(fn)
    object.__setattr__(stage, "task", decorated)
    return decorated
