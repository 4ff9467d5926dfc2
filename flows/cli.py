"""``wiki-pipeline``: run the flow, serve its deployment, list the artifacts.

    wiki-pipeline run [--tiny] [--mirror] [--param K=V ...] [--force STAGE ...] [--only STAGE]
    wiki-pipeline serve [--tiny] [--param K=V ...]     the deployment runner for wiki-pipeline/wiki-pipeline
    wiki-pipeline artifacts [--stage S] [--json]       versions, sizes and lineage in the artifact store (stale marked)
    wiki-pipeline gc [--stale] [--yes]                 what no run needs (unfinished builds, ...): listed; --yes deletes
    wiki-pipeline params [--tiny] [--param K=V ...]    the flow parameters as JSON (for prefect deployment run --params)
    wiki-pipeline wait FLOW_RUN_ID [--log PATH]        follow a flow run (e.g. one started by the deployment), live;
                                                       at its end one line per stage, and why it failed if it did

``--param KEY=VALUE`` takes a flat key (``steps=100``: the field of whichever stage has it; ``seed``, ``device``
and ``precision`` set the model's and the samples'), a dotted one (``samples.seed=7``) or a whole stage
(``model={"steps": 100}``); see ``flows.settings``. VALUE is read as JSON when it parses (``steps=100``,
``force=["tokenizer"]``), else as a string (``prompt=The history of``). Bad input a user can fix ends with
``error: ...`` on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import TYPE_CHECKING, cast

from mygpt.errors import UserError

if TYPE_CHECKING:
    from datetime import datetime

    from prefect.states import State

    from tasks.core.stage import StageRef
    from tasks.store import ArtifactStore, VersionInfo

DEPLOYMENT = "wiki-pipeline"
POLL_SECONDS = 0.5  # how often `serve`'s runner asks the server for flow runs to start


def format_listing(
    store: ArtifactStore, versions: list[VersionInfo] | None = None, stale: dict[tuple[str, str], str] | None = None
) -> str:
    """Published versions (all, or ``versions``): stage, version, creation time, size, and lineage; those in
    ``stale`` (see :meth:`ArtifactStore.stale_versions`) are marked, with why."""
    from tasks.core.report import human_bytes

    versions = store.versions() if versions is None else versions
    stale = stale or {}
    if not versions:
        return f"no published versions under {store.root}"
    lines = [
        f"artifacts under {store.root}",
        f"{'stage':10s} {'version':12s} {'created (UTC)':20s} {'size':>9s}  inputs",
    ]
    for v in versions:
        inputs = ", ".join(f"{k}/{i['version']}" for k, i in sorted((v.manifest.get("inputs") or {}).items()))
        why = stale.get((v.stage, v.version))
        lines.append(
            f"{v.stage:10s} {v.version:12s} {v.manifest.get('created_at', ''):20s} "
            f"{human_bytes(v.size_bytes):>9s}  {inputs or '-'}" + (f"  [stale: {why}]" if why else "")
        )
    return "\n".join(lines)


def parse_param(text: str) -> tuple[str, object]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"--param {text!r} is not KEY=VALUE (e.g. --param steps=100)")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key.strip(), value


def chosen_groups(args) -> dict[str, dict]:
    """The settings the user chose, per stage (the stages' defaults fill in the rest): --tiny, --params,
    --param and the flags, later ones winning."""
    from flows.settings import TINY, Pipeline

    groups: dict[str, dict] = {}

    def add(flat: dict) -> None:
        for group, values in Pipeline.group_flat(flat).items():
            groups.setdefault(group, {}).update(values)

    if args.tiny:
        add(TINY)
    if getattr(args, "params", None):
        try:
            extra = json.loads(args.params)
        except ValueError as e:
            raise UserError(f"--params is not a JSON object: {e}") from None
        if not isinstance(extra, dict):
            raise UserError(f"--params must be a JSON object, got {args.params!r}")
        add(extra)
    add(dict(parse_param(p) for p in args.param))
    flags = {flag: getattr(args, flag, None) for flag in ("artifacts_dir", "source_url", "only", "force")}
    add({k: v for k, v in flags.items() if v})
    if getattr(args, "full_check", False):
        add({"full_check": True})
    return groups


def checked(args):
    """The chosen settings, checked (fast, before Prefect starts): a ``flows.settings.Pipeline``."""
    from flows.settings import Pipeline

    return Pipeline.parse(**chosen_groups(args))


@contextlib.contextmanager
def loopback_mirror():
    """Serve a wikitext-103-style zip built from ../shared/data on 127.0.0.1 (flows/mirror.py)."""
    from flows.mirror import DEMO_PORT, ZIP_NAME, Mirror, build_wikitext_zip

    try:
        data = build_wikitext_zip()
    except OSError as e:
        raise UserError(
            f"--mirror needs ../shared/data/wikitext2-valid.txt (or WIKI_PIPELINE_SHARED_DATA): {e}"
        ) from None
    try:  # a fixed port keeps source_url, and so every version, the same from one run to the next
        mirror = Mirror({"/" + ZIP_NAME: data}, port=DEMO_PORT).start()
    except OSError:
        mirror = Mirror({"/" + ZIP_NAME: data}).start()
        print(
            f"note: port {DEMO_PORT} is busy; the mirror serves on another port (the versions follow the zip's bytes, "
            "so they are the same)",
            file=sys.stderr,
        )
    try:
        print(f"loopback mirror: {mirror.url()} ({len(data):,} bytes)", file=sys.stderr)
        yield mirror.url()
    finally:
        mirror.stop()


def cmd_run(args) -> int:
    from tasks.wikitext.download import DownloadKnobs

    with contextlib.ExitStack() as stack:
        settings = checked(args)
        DownloadKnobs.from_env()  # a bad WIKI_PIPELINE_* knob stops the run here, not inside the corpus stage
        check_prefect_server()
        if not prefect_api_url():
            from prefect.settings import PREFECT_HOME

            from flows.server import server_for_this_run

            stack.enter_context(server_for_this_run(PREFECT_HOME.value(), say=lambda m: print(m, file=sys.stderr)))
        from flows.server import watched_runs

        stack.enter_context(watched_runs())  # a killed run shows Crashed, not Running forever
        if args.mirror:
            if "source_url" in chosen_groups(args).get("corpus", {}):
                raise UserError("--mirror and source_url both choose the source; give one of them")
            url = stack.enter_context(loopback_mirror())
            settings = settings.model_copy(update={"corpus": settings.corpus.model_copy(update={"source_url": url})})
        from flows.wiki_pipeline import wiki_pipeline

        # Prefect's Flow.__call__ overloads take return_state=True as one of the flow's **parameters: the state.
        state = cast("State[dict[str, StageRef]]", wiki_pipeline(**dict(settings), return_state=True))
        if not state.is_completed():
            try:
                state.result()  # re-raises the flow's exception (a UserError becomes exit code 2)
            except UserError:
                raise
            except Exception as e:
                print(f"error: the flow run ended {state.name}: {type(e).__name__}: {e}", file=sys.stderr)
                return 1
            return 1
        refs = state.result()
    for stage, ref in refs.items():
        print(f"{stage:10s} {ref['path']}")
    samples = refs.get("samples")
    if samples:
        print()
        from tasks.core.stage import ref_dir

        print((ref_dir(samples) / "samples.md").read_text(encoding="utf-8"))
    return 0


def prefect_api_url() -> str | None:
    """The Prefect server this process reports to (``PREFECT_API_URL`` or the profile's); None = none set."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def flow_parameters(settings) -> dict:
    """``settings`` (a checked ``Pipeline``) as the flow's JSON parameters, credentials in ``source_url``
    included: this is what a deployment runs with (everywhere else the JSON form of the settings is redacted)."""
    from tasks.core.urls import credentials_revealed

    with credentials_revealed():
        return settings.flow_parameters()


def cmd_serve(args) -> int:
    import asyncio

    from prefect.exceptions import TerminationSignal
    from prefect.runner import Runner
    from prefect.settings import PREFECT_UI_URL
    from prefect.types.entrypoint import EntrypointType

    from flows.allowed import allow_served
    from flows.server import HEARTBEAT_TAG, watched_runs
    from flows.settings import source_urls
    from flows.warm_start import install as start_runs_warm
    from flows.wiki_pipeline import wiki_pipeline
    from tasks.wikitext.download import DownloadKnobs

    settings = checked(args)
    check_prefect_server()
    allow_served(settings.run.root(), source_urls(dict(settings).values()))  # the operator's own choices
    parameters = flow_parameters(settings)
    DownloadKnobs.from_env()  # the runner's environment is what its flow runs download with
    print(start_runs_warm(), file=sys.stderr, flush=True)  # each run's process forks from a preloaded one
    # Prefect's runner (what `flow.serve` starts), asking the server for runs to start every POLL_SECONDS
    # (Prefect's default, 10 s, would be most of a cached rerun's time); the deployment's parameters are the
    # chosen settings, so a bare `prefect deployment run wiki-pipeline/wiki-pipeline` and the UI's Run button
    # run what `serve` was given; its flow runs beat, and carry the tag the crash automation watches
    with watched_runs():
        runner = Runner(name=DEPLOYMENT, query_seconds=POLL_SECONDS, limit=args.limit)
        deployment_id = runner.add_flow(
            wiki_pipeline,
            name=DEPLOYMENT,
            parameters=parameters or None,
            entrypoint_type=EntrypointType.MODULE_PATH,
            description="Wikipedia -> BPE -> token shards -> mygpt -> samples (chapter 28)",
            tags=[HEARTBEAT_TAG],
        )
        ui = PREFECT_UI_URL.value()
        print(
            f"wiki-pipeline/{DEPLOYMENT} is being served (asking for runs every {POLL_SECONDS} s): run it with "
            f"`prefect deployment run wiki-pipeline/{DEPLOYMENT}`"
            + (f" or the Run button at {ui}/deployments/deployment/{deployment_id}" if ui else ""),
            flush=True,
        )
        try:
            asyncio.run(runner.start())
        except (KeyboardInterrupt, TerminationSignal) as e:
            print(f"{type(e).__name__}: the runner stopped", file=sys.stderr, flush=True)
    return 0


def cmd_params(args) -> int:
    print(json.dumps(flow_parameters(checked(args))))
    return 0


class StatusLine:
    """Where the follower writes: on a terminal the running stage's progress is one line rewritten in place;
    elsewhere (a log file, a pipe) each new progress report is a line of its own."""

    def __init__(self, out=None) -> None:
        self.out = out or sys.stdout
        self.tty, self.live = self.out.isatty(), False

    def progress(self, text: str) -> None:
        if self.tty:
            self.out.write("\r\033[K" + text)
            self.live = True
        else:
            self.out.write(text + "\n")
        self.out.flush()

    def line(self, text: str) -> None:
        self.out.write(("\r\033[K" if self.live else "") + text + "\n")
        self.live = False
        self.out.flush()

    def end(self) -> None:
        """Leave the rewritten line as it is (before writing elsewhere)."""
        if self.live:
            self.out.write("\n")
            self.live = False
            self.out.flush()


def running_progress(client, task_run) -> str | None:
    """``model      42.0% step 4200/10000 loss 3.6102 · 5.1k tokens/s · ETA 12m05s``: the running stage's
    latest progress artifact (see ``tasks.core.stage.BuildContext.progress``), or None before it posted one."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterTaskRunId, ArtifactFilterType
    from prefect.client.schemas.sorting import ArtifactSort

    found = client.read_artifacts(
        artifact_filter=ArtifactFilter(
            task_run_id=ArtifactFilterTaskRunId(any_=[task_run.id]), type=ArtifactFilterType(any_=["progress"])
        ),
        sort=ArtifactSort.UPDATED_DESC,
        limit=1,
    )
    if not found:
        return None
    what = (found[0].description or "").partition(": ")[2]
    return f"  {task_run.name:10s} {float(found[0].data or 0):5.1f}% {what}".rstrip()


def _first_line(text: str | None) -> str:
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "")


def stage_line(task_run) -> str:
    """``model      built   model/3f2a9c1d7e4b · 1.2 MB · 41.3 s``: one finished stage, from its task run's final
    state (named ``Cached`` when reused; its message names the version and size, see ``tasks.core.stage``)."""
    state = task_run.state
    seconds = task_run.total_run_time.total_seconds() if task_run.total_run_time else 0.0
    if task_run.start_time and task_run.end_time:
        seconds = max(seconds, (task_run.end_time - task_run.start_time).total_seconds())
    verdict = {"Completed": "built", "Cached": "Cached"}.get(state.name, state.name)
    what = (state.message or "").removeprefix("built ").removeprefix("reused ")
    return f"  {task_run.name:10s} {verdict:7s} {what or '-'} · {seconds:.1f} s"


def run_report(run, task_runs, log_path: str | None) -> list[str]:
    """What ``wait`` prints when a flow run ends: one line per stage (built or Cached, version, size, duration);
    when it failed, the failing stage's error on one line and where the full log is."""
    ordered = task_runs  # in start order (cmd_wait sorts them)
    lines = [stage_line(t) for t in ordered if t.state and t.state.is_completed()]
    if run.state.is_completed():
        return lines
    failed = [t for t in ordered if t.state and t.state.is_final() and not t.state.is_completed()]
    if run.state.is_cancelled():  # its running stage's process was killed on purpose: no error of the stage's
        during = f" during stage {failed[0].name}" if failed else ""
        lines.append(f"cancelled: the flow run was cancelled{during}; rerun it to go on (finished stages are Cached)")
    elif failed:
        message = _first_line(failed[0].state.message).removeprefix("Task run encountered an exception ")
        lines.append(f"error: stage {failed[0].name} {failed[0].state.name}: {message}")
    else:
        message = _first_line(run.state.message).removeprefix("Flow run encountered an exception: ")
        lines.append(f"error: the flow run ended {run.state.name}: {message or 'no reason given'}")
    where = log_path or f"prefect flow-run logs {run.id}"
    lines.append(f"full log: {where}")
    return lines


def cmd_wait(args) -> int:
    """Follow a flow run (by id) until it ends: the running stage's progress live (step, loss, tokens/s and
    ETA while training; bytes while downloading, ...), and each stage's state once it is final."""
    import time
    import uuid

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    try:
        run_id = uuid.UUID(args.flow_run_id)
    except ValueError:
        raise UserError(f"{args.flow_run_id!r} is not a flow run id (a UUID)") from None
    from prefect.exceptions import ObjectNotFound

    check_prefect_server()
    shown: set = set()
    last_progress: dict = {}
    status = StatusLine()
    deadline = time.monotonic() + args.timeout if args.timeout else None
    with get_client(sync_client=True) as client:
        while True:
            try:
                run = client.read_flow_run(run_id)
            except ObjectNotFound:
                raise UserError(
                    f"the Prefect server at {prefect_api_url()} has no flow run {run_id}; check the id "
                    "(`prefect flow-run ls` lists them)"
                ) from None
            tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
            # created is set on every task run the server returns (optional only in the client-side schema)
            tasks = sorted(tasks, key=lambda t: cast("datetime", t.expected_start_time or t.created))
            for t in tasks:
                if t.state and t.state.is_final() and t.id not in shown:
                    shown.add(t.id)
                    status.line(f"  {t.name:10s} {t.state.name}")
                elif t.state and t.state.is_running():
                    text = running_progress(client, t)
                    if text and text != last_progress.get(t.id):
                        last_progress[t.id] = text
                        status.progress(text)
            if run.state and run.state.is_final():
                for line in run_report(run, tasks, args.log):
                    status.line(line)
                status.line(f"flow run {run.name} ({run_id}): {run.state.name}")
                return 0 if run.state.is_completed() else 1
            if deadline and time.monotonic() > deadline:
                status.end()
                print(
                    f"flow run {run.name} is still {run.state.name if run.state else '?'} after "
                    f"{args.timeout}s; it keeps running",
                    file=sys.stderr,
                )
                return 1
            time.sleep(args.interval)


def cmd_artifacts(args) -> int:
    from tasks.core.report import human_bytes
    from tasks.registry import code_versions, open_store, stage_name

    store = open_store(args.artifacts_dir)
    stage = stage_name(args.stage, "--stage") if args.stage else None
    everything = store.versions()  # read once: the listing and the stale verdicts (which need every version)
    stale = store.stale_versions(code_versions(), everything)
    rows = [v for v in everything if stage in (None, v.stage)]
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "stage": v.stage,
                        "version": v.version,
                        "path": str(v.path),
                        "bytes": v.size_bytes,
                        "build_id": v.manifest.get("build_id"),
                        "created_at": v.manifest.get("created_at"),
                        "inputs": {k: i["version"] for k, i in v.manifest.get("inputs", {}).items()},
                        "settings": v.manifest.get("settings"),
                        "stale": stale.get((v.stage, v.version)),
                    }
                    for v in rows
                ],
                indent=1,
            )
        )
        return 0
    print(format_listing(store, rows, stale))
    leftovers = [g for g in store.garbage() if not g.local]  # this machine's cached copies are no leftovers
    if leftovers or stale:
        size = sum(g.bytes for g in leftovers)
        print(
            f"\n{len(stale)} stale version(s) (no run reuses them); {len(leftovers)} unfinished build or leftover "
            f"dir(s) holding {human_bytes(size)}: `wiki-pipeline gc` lists them (--stale for the stale versions)"
        )
    return 0


def cmd_gc(args) -> int:
    """List what no run needs -- how big, why -- and with ``--yes`` delete it, never what a running build locks."""
    from tasks.core.report import human_bytes
    from tasks.registry import code_versions, open_store

    store = open_store(args.artifacts_dir)
    items = store.garbage(code_versions() if args.stale else None)
    if not items:
        print(f"nothing to collect under {store.root}")
        return 0
    print(f"{'deleting' if args.yes else 'would delete (dry run; --yes deletes)'} under {store.root}:")
    freed = kept = 0
    for item in items:
        where = f"(cache) {item.key}" if item.local else item.key
        in_use = item.in_use or (args.yes and not store.collect(item))
        if in_use:
            kept += 1
            print(f"  {'in use':>9s}  {where}  kept: a running build is writing or reading it")
            continue
        freed += item.bytes
        print(f"  {human_bytes(item.bytes):>9s}  {where}  {item.reason}")
    verb = "freed" if args.yes else "would free"
    print(f"{verb} {human_bytes(freed)} in {len(items) - kept} item(s)" + (f"; {kept} in use, kept" if kept else ""))
    return 0


def cmd_pull(args) -> int:
    """Copy one published version into a local directory (for ``from_pretrained``, DuckDB, or a look by hand)."""
    from pathlib import Path

    from tasks.core.report import human_bytes
    from tasks.registry import open_store

    stage, _, version = args.version.strip().strip("/").partition("/")
    store = open_store(args.artifacts_dir)
    try:
        info = store.pull(stage, version, Path(args.dest))
    except UserError:
        raise
    except ValueError as exc:
        raise UserError(
            f"pull {args.version}: {exc}; name a version as STAGE/VERSION (`wiki-pipeline artifacts`)"
        ) from None
    except FileNotFoundError as exc:
        raise UserError(f"pull {args.version}: {exc}; `wiki-pipeline artifacts` lists what is published") from None
    print(
        f"copied {stage}/{version} ({human_bytes(info.size_bytes)}, every file checked) from {info.path} to {args.dest}"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="wiki-pipeline", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)

    def add_params(p, serve=False):
        p.add_argument("--tiny", action="store_true", help="the tiny preset (flows/settings.py TINY)")
        p.add_argument(
            "--param",
            "-p",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a flow parameter (repeatable); VALUE is JSON or a plain string",
        )
        p.add_argument("--params", metavar="JSON", help="a JSON object of flow parameters (--param wins)")
        p.add_argument("--artifacts-dir", help="artifact root (default: artifacts/ or $WIKI_PIPELINE_ARTIFACTS)")
        p.add_argument("--source-url", help="where to download the wikitext-103-raw-v1 zip from")

    run = sub.add_parser("run", help="run the flow in this process")
    add_params(run)
    run.add_argument(
        "--mirror",
        action="store_true",
        help="serve ../shared/data as a wikitext-103-style zip on 127.0.0.1 for this run (no internet)",
    )
    run.add_argument("--force", action="append", metavar="STAGE", help="rebuild STAGE (and so everything after it)")
    run.add_argument("--only", metavar="STAGE", help="run only STAGE, against the latest upstream versions")
    run.add_argument("--full-check", action="store_true", help="verify every reused file's sha256")
    run.set_defaults(func=cmd_run)

    serve = sub.add_parser("serve", help=f"serve the deployment wiki-pipeline/{DEPLOYMENT} (runs until Ctrl-C)")
    add_params(serve)
    serve.add_argument("--limit", type=int, default=1, help="flow runs at a time (default 1)")
    serve.set_defaults(func=cmd_serve)

    params = sub.add_parser("params", help="print the chosen parameters as JSON")
    add_params(params)
    params.set_defaults(func=cmd_params)

    wait = sub.add_parser("wait", help="follow a flow run until it ends (exit 0 when Completed)")
    wait.add_argument("flow_run_id")
    wait.add_argument("--timeout", type=float, default=0, help="give up after this many seconds (0 = never)")
    wait.add_argument("--interval", type=float, default=2.0, help=argparse.SUPPRESS)
    wait.add_argument(
        "--log", metavar="PATH", help="where the run's full log is, named when it fails (e.g. the runner's log)"
    )
    wait.set_defaults(func=cmd_wait)

    art = sub.add_parser("artifacts", help="list published versions, sizes and lineage")
    art.add_argument("--artifacts-dir", help="artifact root (default: artifacts/ or $WIKI_PIPELINE_ARTIFACTS)")
    art.add_argument("--stage", help="only this stage (its name: corpus, tokenizer, ...; see tasks/registry.py)")
    art.add_argument("--json", action="store_true")
    art.set_defaults(func=cmd_artifacts)

    gc = sub.add_parser(
        "gc", help="list what no run needs (unfinished builds, leftovers): what, how big, why; --yes deletes it"
    )
    gc.add_argument("--artifacts-dir", help="artifact root (default: artifacts/ or $WIKI_PIPELINE_ARTIFACTS)")
    gc.add_argument(
        "--stale",
        action="store_true",
        help="also the published versions no run can reuse (marked stale by `wiki-pipeline artifacts`)",
    )
    gc.add_argument("--yes", action="store_true", help="delete them (default: only list them)")
    gc.set_defaults(func=cmd_gc)

    pull = sub.add_parser(
        "pull", help="copy a published version (e.g. export/<version>) into a local directory, checked file by file"
    )
    pull.add_argument("version", metavar="STAGE/VERSION", help="as `wiki-pipeline artifacts` lists it")
    pull.add_argument("dest", metavar="DIR", help="a new (or empty) directory to copy it into")
    pull.add_argument("--artifacts-dir", help="artifact root (default: artifacts/ or $WIKI_PIPELINE_ARTIFACTS)")
    pull.set_defaults(func=cmd_pull)
    return ap


def check_prefect_server() -> None:
    """Where ``PREFECT_API_URL`` is set: ``UserError`` unless a Prefect server answers there (its ``/hello``),
    before anything is started against it (else a closed port or another program's port ends in a traceback)."""
    url = prefect_api_url()
    if not url:
        return
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            response = client.hello()
            ok = response.status_code == 200 and response.json() == "👋"
            problem = "" if ok else f"HTTP {response.status_code}, not a Prefect server's answer"
    except Exception as e:  # refused, timed out, not HTTP, not JSON
        if unauthorized(e):
            raise
        problem = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if problem:
        raise UserError(
            f"PREFECT_API_URL={url} does not answer as a Prefect server ({problem}); start one there "
            "(scripts/pipeline starts one on 127.0.0.1:4200), fix PREFECT_API_URL, or unset it to let "
            "`wiki-pipeline run` start a server of its own"
        )


def unauthorized(exc: BaseException) -> str | None:
    """What to tell the user when the Prefect server refused our credentials (HTTP 401), else None."""
    response = getattr(exc, "response", None)
    if getattr(response, "status_code", None) != 401:
        return None
    return (
        f"the Prefect server at {prefect_api_url()} refused this request (401 Unauthorized): it has basic auth on; "
        "set PREFECT_API_AUTH_STRING to its user:password (the server's PREFECT_SERVER_API_AUTH_STRING)"
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        refused = unauthorized(e)
        if refused is None:
            raise
        print(f"error: {refused}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume (finished stages are reused)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
