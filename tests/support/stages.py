"""Plain (no Prefect) stage calls from ``tasks.registry``: ``stages.shards(root, corpus_ref, tokenizer_ref,
shard_tokens=..., run={...})``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tasks.core.settings import RunOptions
from tasks.core.stage import StageRef
from tasks.registry import BY_NAME


def plain_call(name: str) -> Callable[..., StageRef]:
    stage = BY_NAME[name]

    def call(root, *inputs: StageRef, run: dict | None = None, **settings: Any) -> StageRef:
        if len(inputs) != len(stage.inputs):
            raise TypeError(f"{name} takes its inputs {list(stage.inputs)}, got {len(inputs)}")
        return stage.task.fn(*inputs, stage.settings(**settings), RunOptions(artifacts_dir=str(root), **(run or {})))

    call.__name__ = name
    return call


def __getattr__(name: str) -> Callable[..., StageRef]:
    if name in BY_NAME:
        return plain_call(name)
    raise AttributeError(name)


def every_stage(settings, run: RunOptions) -> dict[str, StageRef]:
    """Every stage of the registry, in order and plainly, each on its inputs' refs, with ``settings`` (a flow
    ``Pipeline``) resolved for it: ``{stage name: its ref}``."""
    from tasks.registry import STAGES

    refs: dict[str, StageRef] = {}
    for stage in STAGES:
        refs[stage.name] = stage.task.fn(*(refs[name] for name in stage.inputs), settings.resolved(stage.name), run)
    return refs
