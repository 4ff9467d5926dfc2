"""``wiki-pipeline wait``: follow a flow run live, and say how each stage ended."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, cast

from flows.prefect_api import check_prefect_server, prefect_api_url, shown_api_url
from mygpt.errors import UserError

if TYPE_CHECKING:
    from datetime import datetime


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
    """``model      42.0% step 4200/10000 loss 3.6102 · 5.1k tokens/s wall-clock · ETA 12m05s``: the running stage's
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

    if not prefect_api_url():  # else Prefect starts a temporary server of its own, which has no runs
        raise UserError(
            "wait follows a flow run on a Prefect server, and PREFECT_API_URL names none; set it to the server that "
            "runs it (scripts/pipeline prints the line to paste, e.g. export PREFECT_API_URL=http://127.0.0.1:4200/api)"
        )
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
                    f"the Prefect server at {shown_api_url()} has no flow run {run_id}; check the id "
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
