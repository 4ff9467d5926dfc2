"""Running a stage: reuse its version from the artifact store, or build it in staging and publish it.

A stage module holds the stage's settings (a :class:`~tasks.core.settings.Settings` subclass), a ``build``
function, a ``report`` function for its Prefect UI artifact, ``STAGE = Stage(...)`` and one Prefect task with
an explicit signature -- its inputs, its settings, the run options -- whose body is one call of the one verb,
:meth:`Stage.run`::

    @stage_task(STAGE)
    def train_tokenizer(corpus: StageRef, settings: TokenizerSettings = TokenizerSettings(),
                        run: RunOptions = RunOptions()) -> StageRef:
        return STAGE.run(build_tokenizer, settings, run, corpus=corpus)

:meth:`Stage.run`

0. holds a shared lock on each input version (``ArtifactStore.pin``) until it returns, so ``gc`` keeps what a
   running build reads and no rebuild replaces it meanwhile;
1. computes the version id from the settings, the inputs (each upstream version plus its build id, so a
   rebuilt upstream gives new downstream versions), the stage's code version and, for a stage that reads from
   outside the store (:attr:`Stage.source`: the corpus), the identity of what it reads now;
2. reuses that version if the store verifies it (and ``run.force`` does not name the stage); inside a Prefect
   task run it then returns a ``Completed`` state named ``Cached`` (Prefect's documented way for a task to set
   its own final state), so the UI shows the reuse; the artifact store is the only cache -- Prefect keeps no
   cache records and no results for these tasks;
3. otherwise takes the version's lock, builds into the staging area (which survives a crash, so a stage may
   resume), publishes atomically with the manifest written last, and posts the stage's UI artifact under
   ``wiki-<stage>``.

A flow calls a stage task with ``return_state=True`` and takes ``.result()`` (the :class:`StageRef`, built or
reused); outside Prefect, ``task.fn(...)`` runs the same code and returns the ref.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypedDict, TypeVar, cast
from uuid import UUID

from mygpt.errors import UserError
from tasks.core.faults import fault_point
from tasks.core.progress import Pace
from tasks.core.report import human_bytes, settings_table
from tasks.core.settings import RunOptions, Settings
from tasks.store import ArtifactStore, Build, version_id

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
    """A local directory holding the version ``ref`` names: its own, or (published on object storage) a verified
    copy in this machine's cache (``ArtifactStore.local_copy``)."""
    where, suffix = ref["path"], f"/{ref['stage']}/{ref['version']}"
    if not where.endswith(suffix) or "://" not in where:
        return Path(where)
    return ArtifactStore(where.removesuffix(suffix)).local_copy(ref["stage"], ref["version"])


def lineage(name: str, ref: StageRef) -> dict:
    """What a manifest records of an input: stage, version and build id, never a path (an artifact root can be
    moved or copied; the input lives under whichever root the version is read from)."""
    return {"stage": ref.get("stage", name), "version": ref["version"], "build_id": ref["build_id"]}


def input_ids(inputs: dict[str, StageRef]) -> dict[str, str]:
    """How inputs enter a version id: upstream version plus its build id."""
    return {name: f"{ref['version']}.{ref['build_id']}" for name, ref in sorted(inputs.items())}


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
        """Mark ``paths`` (under :attr:`out` or :attr:`work`) as resume state: on an object-store root they are
        uploaded now, so a rerun on another machine resumes from them (see ``Build.save``)."""
        self.build.save(*paths)

    def worker_path(self, name: str, rel: str) -> str:
        """Where a Dask worker reads the file ``rel`` of the input ``name`` from: on an external cluster
        (``run.dask_address``), where it is published (a path, or an ``s3://`` URL read by range, so the cluster
        needs no shared disk); on the local cluster this stage starts, its workers share this machine's disk, so
        the local copy the build reads (the same bytes, checked against the manifest)."""
        version = self.inputs[name]["version"]
        if self.run.dask_address:
            return self.store.file_location(name, version, rel)
        return str(self.store.local_copy(name, version) / rel)

    def progress(self, done: float, total: float, message: str = "", force: bool = False) -> None:
        """Report progress: a log line (every ~10 s or 10 %) and a Prefect progress artifact."""
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


@dataclass(frozen=True)
class Stage:
    """One stage: its name (the noun it makes), its settings, code version, UI report and the stages it reads.

    A stage module declares ``STAGE = Stage(...)`` and decorates its task with :func:`stage_task`, which binds
    the task here (:attr:`task`); ``tasks.registry`` lists the stages in order, and everything that lists
    stages (the flow, its parameters, ``only=``, the CLI, the store's listings) is derived from that list."""

    name: str  # corpus, tokenizer, ...: the store folder, the Prefect task, the flow parameter, the UI key
    settings: type[Settings]  # the stage's settings class: the flow parameter's type, the home of its defaults
    code_version: str  # bump when the stage's output for the same settings and inputs changes
    # manifest -> markdown for the Prefect UI; the manifest handed to it also has "path", where the version is
    # published (a manifest itself never names its root)
    report: Callable[[dict], str]
    inputs: tuple[str, ...] = ()  # upstream stages, passed to the build function as directories
    #: For a stage that reads from outside the store (the corpus: the zip at source_url): ``(settings, store,
    #: logger) -> {...}``, the identity of what it would read now (e.g. size and ETag). It enters the version id
    #: and the manifest, so new content at the same address gives a new version.
    source: Callable[..., dict] | None = None
    #: ``(upstream stage, check)``: ``check(settings, upstream_ref) -> warnings`` runs as soon as that upstream
    #: version exists, before the stages in between (the samples' prompt against the tokenizer: refused before
    #: the shards and the model are built); it raises ``UserError`` for settings that cannot work.
    early_check: tuple[str, Callable[[Any, StageRef], list[str]]] | None = None
    #: The older verb for this stage (``train`` for model), still accepted where a user names a stage.
    alias: str | None = None
    #: The stage's Prefect task, bound by :func:`stage_task`: ``task(*inputs, settings, run) -> StageRef``.
    task: Any = field(default=None, init=False, compare=False, repr=False)

    @property
    def artifact_key(self) -> str:
        return f"wiki-{self.name}"

    def version(self, settings: Settings, inputs: dict[str, StageRef], source: dict | None = None) -> str:
        """The version id of this stage for ``settings`` (resolved, see :meth:`Settings.resolved`), ``inputs``
        and (for a stage with a :attr:`source`) the identity of what it reads."""
        return version_id(self.name, settings.version_params(), input_ids(inputs), self.code_version, source)

    def run(self, build: Callable[..., dict], settings: S, run: RunOptions, **inputs: StageRef) -> Any:
        """Reuse or build this stage's version: the one verb every stage task calls (see the module docstring).

        ``build(ctx, settings, **input_dirs)`` writes the version's files into ``ctx.out`` and returns its
        metrics; ``input_dirs`` maps each input stage to its published directory under ``run``'s artifact root.
        Returns the :class:`StageRef`, or inside a Prefect task run a ``Cached`` state holding it when reused.
        """
        if set(inputs) != set(self.inputs):
            raise ValueError(f"stage {self.name} takes inputs {list(self.inputs)}, got {sorted(inputs)}")
        settings = settings.resolved()
        store = ArtifactStore(run.root())
        logger = stage_logger(self.name)
        with contextlib.ExitStack() as pins:
            for name, ref in sorted(inputs.items()):  # read-pinned while this stage runs: gc keeps them
                pins.enter_context(store.pin(name, ref["version"], on_wait=self._pin_wait(logger, name, ref)))
            return self._run_pinned(build, settings, run, store, logger, inputs)

    def _pin_wait(self, logger: Any, name: str, ref: StageRef) -> Callable[[], None]:
        def waiting() -> None:
            logger.info(
                "%s: %s/%s is being built, rebuilt or collected; waiting for it", self.name, name, ref["version"]
            )

        return waiting

    def _run_pinned(
        self,
        build: Callable[..., dict],
        settings: S,
        run: RunOptions,
        store: ArtifactStore,
        logger: Any,
        inputs: dict[str, StageRef],
    ) -> Any:
        input_dirs = {}
        for name, up in inputs.items():
            if store.read_manifest(name, up["version"]) is None:
                raise UserError(
                    f"{self.name} needs {name}/{up['version']}, which is not published under "
                    f"{store.root}; run the stages before it first"
                )
        source = self.source(settings, store, logger) if self.source else None
        version = self.version(settings, inputs, source)
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
                input_dirs[name] = store.local_copy(name, up["version"], full=run.full_check)
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
            metrics = build(ctx, settings, **input_dirs) or {}
            seconds = round(time.time() - t0, 3)
            manifest = staging.publish(
                settings=settings.version_params(),
                inputs={k: lineage(k, v) for k, v in inputs.items()},
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
        """The ref, or inside a Prefect task run a final state holding it: ``Cached`` when reused, else
        ``Completed``; its message says which version and how big (``reused corpus/<version> · 1.2 MB``), what
        ``wiki-pipeline wait`` prints for the stage."""
        if not in_task_run():
            return ref
        from prefect.states import Completed

        size = human_bytes(sum(f["size"] for f in manifest.get("files", {}).values()))
        message = f"{'reused' if reused else 'built'} {ref['stage']}/{ref['version']} · {size}"
        return Completed(name="Cached" if reused else "Completed", message=message, data=ref)


def stage_task(stage: Stage):
    """The Prefect task decorator for a stage's task function: named after the stage, no Prefect caching (the
    artifact store decides reuse, see :meth:`Stage.run`), no persisted results."""
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    decorate = task(name=stage.name, task_run_name=stage.name, cache_policy=NO_CACHE, persist_result=False)

    def bind(fn):
        stage_task_ = decorate(fn)
        object.__setattr__(stage, "task", stage_task_)
        return stage_task_

    return bind
