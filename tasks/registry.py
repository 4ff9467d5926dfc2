"""The pipeline's stages, in the order they run: the one list of stages. Adding a stage is one module and one
line here (docs/STAGES.md). It imports the stage modules, so ``tasks.core`` never imports it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mygpt.errors import UserError
from tasks import corpus, evaluate, export, model, samples, shards, tokenizer
from tasks.core.settings import RunOptions
from tasks.core.stage import Stage
from tasks.sources.downloads_gc import untaken_downloads
from tasks.store import ArtifactStore

STAGES: tuple[Stage, ...] = (
    corpus.STAGE,
    tokenizer.STAGE,
    shards.STAGE,
    model.STAGE,
    samples.STAGE,
    export.STAGE,
    evaluate.STAGE,
)

NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}
_ALIASES: dict[str, str] = {s.alias: s.name for s in STAGES if s.alias}


def stage_name(name: object, what: str) -> str:
    """The stage called ``name`` (its name, or its older verb); ``UserError`` naming ``what`` otherwise."""
    key = name.strip().lower() if isinstance(name, str) else None
    if key in BY_NAME:
        return key
    if key in _ALIASES:
        return _ALIASES[key]
    raise UserError(f"{what} names no stage: {name!r}; the stages are {', '.join(NAMES)}")


def in_stage_order(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` (stage names) without repeats, in the order the stages run."""
    return tuple(sorted(set(names), key=NAMES.index))


def check_run(run: RunOptions) -> RunOptions:
    """``run`` with the stages it names (``force``, ``only``) checked and written by their names."""
    force = in_stage_order(stage_name(v, "run.force") for v in run.force)
    only = stage_name(run.only, "run.only") if run.only is not None else None
    return run.model_copy(update={"force": force, "only": only})


def code_versions() -> dict[str, str]:
    """Each stage's current code version (what marks a published version stale)."""
    return {s.name: s.code_version for s in STAGES}


def open_store(root: Any = None) -> ArtifactStore:
    """The artifact store at ``root`` (default: the configured one), knowing the stages it holds, in order."""
    return ArtifactStore(root, stages=NAMES, leftovers={corpus.STAGE.name: untaken_downloads})
