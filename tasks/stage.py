"""The one wrapper every stage runs through.

A stage module declares a :class:`StageSpec` (its store name, Prefect UI artifact key, code version, a
``build(ctx) -> metrics`` function and a ``report(manifest) -> markdown`` function) and gets a Prefect
task from :func:`stage_task`. Running it:

1. computes the version id from the parameters, the inputs (upstream version + build id) and the code
   version;
2. reuses that version if it verifies (Prefect shows the task as Cached: the cache key is
   ``<stage>-<version>``, and the key function drops the cache record whenever the version is missing,
   damaged, forced or was rebuilt since the record was written);
3. otherwise takes the version's lock, builds into the staging area (which survives a crash so a stage
   may resume), publishes atomically with the manifest last, and posts the stage's UI artifact.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypedDict

from tasks.store import ArtifactStore, Build, version_id

log = logging.getLogger("wiki_pipeline")


# ---- fault injection (test hook, off by default) -------------------------------------------------------
FAULT_ENV = "WIKI_PIPELINE_FAULT"
FAULT_TRACE_ENV = "WIKI_PIPELINE_FAULT_TRACE"
_fault_calls: dict[str, int] = {}


class FaultInjected(BaseException):
    """Raised by :func:`fault_point` in ``raise`` mode: an in-process stand-in for a crash (BaseException, so
    no ``except Exception`` swallows it)."""


def reset_faults() -> None:
    """Forget the per-point call counts (for in-process use)."""
    _fault_calls.clear()


def fault_point(name: str) -> None:
    """A named point where bench/reliability.py can crash the pipeline. Does nothing unless the environment says so.

    Points (``<task>`` is download, bpe, encode, train or sample): ``<task>.start`` (staging opened, build not
    started), ``<task>.progress`` (every :meth:`BuildContext.progress` call, before its throttling),
    ``<task>.publish`` (manifest written in staging, not yet renamed into place) and ``<task>.published``
    (renamed into place, staging not yet deleted).

    ``WIKI_PIPELINE_FAULT=<point>@<n>`` SIGKILLs this process at the n-th call of ``<point>`` (counted per
    process); ``<point>@<n>:raise`` raises :class:`FaultInjected` instead. ``WIKI_PIPELINE_FAULT_TRACE=<file>``
    appends ``<point> <n>`` for every call (so a harness can pick random points that a run really reaches).
    """
    spec = os.environ.get(FAULT_ENV)
    trace = os.environ.get(FAULT_TRACE_ENV)
    if not spec and not trace:
        return
    n = _fault_calls[name] = _fault_calls.get(name, 0) + 1
    if trace:
        with open(trace, "a", encoding="utf-8") as f:
            f.write(f"{name} {n}\n")
    if spec:
        target, _, mode = spec.partition(":")
        point, _, count = target.rpartition("@")
        if point == name and count.isdigit() and n == int(count):
            if mode == "raise":
                raise FaultInjected(f"fault injected at {name}@{n}")
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)


class StageRef(TypedDict):
    """What a stage task returns and downstream stages take as input (JSON-serialisable)."""

    stage: str
    version: str
    build_id: str
    path: str


@dataclass(frozen=True)
class StageSpec:
    name: str  # store name: corpus, tokenizer, shards, model, samples
    task_name: str  # Prefect task name: download, bpe, encode, train, sample
    artifact_key: str  # Prefect UI artifact key: wiki-corpus, ...
    code_version: str  # bump when the stage's output for the same inputs changes
    build: Callable[["BuildContext"], dict]
    report: Callable[[dict], str]
    inputs: tuple[str, ...] = ()  # upstream store names this stage takes
    task_options: dict = field(default_factory=dict)  # retries etc. for the Prefect task


def _in_prefect_run() -> bool:
    try:
        from prefect.context import TaskRunContext

        return TaskRunContext.get() is not None
    except Exception:  # pragma: no cover - prefect import problems
        return False


def stage_logger(stage: str):
    if _in_prefect_run():
        from prefect.logging import get_run_logger

        return get_run_logger()
    return logging.getLogger(f"wiki_pipeline.{stage}")


def _flow_run_id() -> str | None:
    if not _in_prefect_run():
        return None
    from prefect.runtime import flow_run

    return flow_run.id


def input_ids(inputs: dict[str, StageRef]) -> dict[str, str]:
    """How inputs enter a version id: upstream version plus its build id."""
    return {name: f"{ref['version']}.{ref['build_id']}" for name, ref in sorted(inputs.items())}


class BuildContext:
    """What a stage's build function gets: parameters, inputs, staging dirs, logger, progress."""

    def __init__(self, spec: StageSpec, store: ArtifactStore, version: str, params: dict,
                 inputs: dict[str, StageRef], build: Build, logger, options: dict | None = None) -> None:
        self.spec, self.store, self.version = spec, store, version
        self.params, self.inputs, self.build, self.log = params, inputs, build, logger
        # Run options that do not change the output (worker counts, chunk sizes): not in the version.
        self.options = dict(options or {})
        self._progress_id = None
        self._progress_last = (0.0, -1.0)  # (time, percent) of the last report

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

    def input_path(self, stage: str) -> Path:
        return Path(self.inputs[stage]["path"])

    def input_manifest(self, stage: str) -> dict:
        return self.store.get(stage, self.inputs[stage]["version"]).manifest

    def progress(self, done: float, total: float, message: str = "", force: bool = False) -> None:
        """Report progress: a log line (every ~10 s or 10 %) and a Prefect progress artifact."""
        fault_point(f"{self.spec.task_name}.progress")
        pct = 100.0 * done / total if total else 100.0
        now = time.monotonic()
        last_t, last_pct = self._progress_last
        if not force and now - last_t < 10 and pct - last_pct < 10 and pct < 100:
            return
        self._progress_last = (now, pct)
        self.log.info("%s: %5.1f%% %s", self.spec.task_name, pct, message)
        if _in_prefect_run():
            from prefect.artifacts import create_progress_artifact, update_progress_artifact

            if self._progress_id is None:
                self._progress_id = create_progress_artifact(
                    progress=pct, description=f"{self.spec.task_name} {self.version}: {message}")
            else:
                update_progress_artifact(self._progress_id, progress=pct,
                                         description=f"{self.spec.task_name} {self.version}: {message}")


def summary_table(rows: list[tuple[str, object]]) -> str:
    """The two-column "what | value" markdown table at the top of every stage's UI artifact."""
    return "\n".join(["| | value |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)])


def stage_version(spec: StageSpec, params: dict, inputs: dict[str, StageRef]) -> str:
    return version_id(spec.name, params, input_ids(inputs), spec.code_version)


def execute(spec: StageSpec, artifacts_dir: str | os.PathLike, params: dict,
            inputs: dict[str, StageRef] | None = None, force: bool = False,
            full_check: bool = False, options: dict | None = None) -> StageRef:
    """Reuse or build one stage version. Works inside a Prefect task run or as a plain call.

    ``options`` reach the build as ``ctx.options`` but not the version id (settings that cannot change
    the output, e.g. a worker count).
    """
    inputs = dict(inputs or {})
    missing = set(spec.inputs) - set(inputs)
    if missing:
        raise ValueError(f"stage {spec.task_name} needs inputs {sorted(missing)}")
    store = ArtifactStore(artifacts_dir)
    logger = stage_logger(spec.name)
    version = stage_version(spec, params, inputs)

    def ref(manifest: dict) -> StageRef:
        return StageRef(stage=spec.name, version=version, build_id=manifest["build_id"],
                        path=str(store.version_path(spec.name, version)))

    def waiting() -> None:
        logger.info("%s %s: another run is building this version; waiting for it", spec.task_name, version)

    with store.lock(spec.name, version, on_wait=waiting):
        ok, reason = store.verify(spec.name, version, full=full_check)
        if ok and not force:
            logger.info("%s: reusing %s/%s", spec.task_name, spec.name, version)
            store.drop_staging(spec.name, version)  # left by a run killed between publish and clean-up
            return ref(store.read_manifest(spec.name, version))
        if force and ok:
            logger.info("%s: rebuilding %s/%s (forced)", spec.task_name, spec.name, version)
        elif reason != "missing":
            logger.warning("%s: %s/%s is damaged (%s); rebuilding it", spec.task_name, spec.name, version, reason)
            store.discard(spec.name, version, reason)
        build = store.open_build(spec.name, version)
        logger.info("%s: building %s/%s%s", spec.task_name, spec.name, version,
                    " (resuming from an interrupted attempt)" if build.resumed else "")
        ctx = BuildContext(spec, store, version, params, inputs, build, logger, options)
        fault_point(f"{spec.task_name}.start")
        t0 = time.time()
        metrics = spec.build(ctx) or {}
        seconds = round(time.time() - t0, 3)
        manifest = build.publish(
            params=params,
            inputs={k: dict(v) for k, v in inputs.items()},
            code_version=spec.code_version,
            metrics=metrics,
            timings={"build_seconds": seconds},
            extra={"flow_run_id": _flow_run_id()},
            fault=lambda where: fault_point(f"{spec.task_name}.{where}"),
        )
        logger.info("%s: published %s/%s in %.1fs", spec.task_name, spec.name, version, seconds)
    if _in_prefect_run():
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(key=spec.artifact_key, markdown=spec.report(manifest),
                                 description=f"{spec.task_name} {spec.name}/{version}")
    return ref(manifest)


def _recorded_build_id(record: Path) -> str | None:
    """The build id inside a Prefect cache record (JSON serializer), or None if unreadable."""
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
        result = data.get("result")
        if isinstance(result, str):
            result = json.loads(result)
        return result.get("build_id") if isinstance(result, dict) else None
    except (OSError, ValueError, AttributeError):
        return None


def _cache_key_fn(spec: StageSpec):
    def key(context: Any, parameters: dict) -> str:
        store = ArtifactStore(parameters["artifacts_dir"])
        version = stage_version(spec, parameters["params"], parameters.get("inputs") or {})
        key = f"{spec.name}-{version}"
        record = store.results_dir / key
        if record.exists():
            ok, _ = store.verify(spec.name, version, full=bool(parameters.get("full_check")))
            manifest = store.read_manifest(spec.name, version) if ok else None
            if parameters.get("force") or manifest is None or _recorded_build_id(record) != manifest["build_id"]:
                record.unlink(missing_ok=True)
        return key

    return key


def stage_task(spec: StageSpec):
    """The Prefect task for a stage: cached on ``<stage>-<version>`` with JSON-persisted results."""
    from prefect import task

    def run(artifacts_dir: str, params: dict, inputs: dict[str, StageRef] | None = None,
            force: bool = False, full_check: bool = False, options: dict | None = None) -> StageRef:
        return execute(spec, artifacts_dir, params, inputs, force=force, full_check=full_check,
                       options=options)

    run.__name__ = spec.task_name
    run.__qualname__ = spec.task_name
    return task(
        run,
        name=spec.task_name,
        task_run_name=f"{spec.task_name}",
        cache_key_fn=_cache_key_fn(spec),
        persist_result=True,
        result_serializer="json",
        **spec.task_options,
    )


def run_stage(prefect_task, artifacts_dir: str | os.PathLike, params: dict,
              inputs: dict[str, StageRef] | None = None, force: bool = False,
              full_check: bool = False, options: dict | None = None) -> StageRef:
    """Call a stage task inside a flow, keeping its cache records beside the artifacts."""
    store = ArtifactStore(artifacts_dir)
    store.results_dir.mkdir(parents=True, exist_ok=True)
    return prefect_task.with_options(result_storage=store.results_dir)(
        artifacts_dir=str(store.root), params=params, inputs=inputs or {}, force=force, full_check=full_check,
        options=options or {})


def _in_flow() -> bool:
    try:
        from prefect.context import FlowRunContext

        return FlowRunContext.get() is not None
    except Exception:  # pragma: no cover
        return False


def call_stage(spec: StageSpec, prefect_task, artifacts_dir, params: dict, inputs: dict | None = None, *,
               force: bool = False, full_check: bool = False, options: dict | None = None) -> StageRef:
    """Inside a flow run: the stage's Prefect task (via ``run_stage``); outside: a plain ``execute`` call."""
    if _in_flow():
        return run_stage(prefect_task, artifacts_dir, params, inputs, force=force, full_check=full_check,
                         options=options)
    return execute(spec, artifacts_dir, params, inputs, force=force, full_check=full_check, options=options)
