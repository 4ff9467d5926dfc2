"""Reading a flow run back through the Prefect API (the server itself: ``flows.server.PrefectServer``)."""

from __future__ import annotations

from tasks.registry import NAMES


def task_run_states(flow_run_id) -> dict[str, str]:
    """{task run name: state name} for one flow run, read back through the Prefect API."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            return {run.name: run.state.name for run in runs}

    return asyncio.run(read())


def rebuilt_from(stage: str) -> dict[str, str]:
    """The task-run states of a rerun that rebuilds ``stage`` and every stage after it."""
    first = NAMES.index(stage)
    return {name: "Cached" if i < first else "Completed" for i, name in enumerate(NAMES)}
