"""Reading a flow run back through the Prefect API (the server itself: ``flows.server.PrefectServer``)."""

from __future__ import annotations

from tasks.registry import NAMES


def task_run_states(flow_run_id, settle_s: float = 60.0) -> dict[str, str]:
    """{task run name: state name} for one flow run, read back through the Prefect API once every task run's
    state there is final. Why wait: a task run's states reach the server through Prefect's event stream, after
    the flow call has returned, so a loaded machine can still show ``Running`` for a moment."""
    import asyncio
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            return {run.name: (run.state.name, run.state.is_final()) for run in runs}

    deadline = time.monotonic() + settle_s
    while True:
        states = asyncio.run(read())
        if all(final for _, final in states.values()) or time.monotonic() > deadline:
            return {name: state for name, (state, _) in states.items()}
        time.sleep(0.2)


def rebuilt_from(stage: str) -> dict[str, str]:
    """The task-run states of a rerun that rebuilds ``stage`` and every stage after it."""
    first = NAMES.index(stage)
    return {name: "Cached" if i < first else "Completed" for i, name in enumerate(NAMES)}
