"""The pipeline's settings as one object, the flat ``KEY=VALUE`` convenience of the CLI, and the tiny preset.

The flow takes one settings object per stage plus the run options (``flows.wiki_pipeline``); :data:`Pipeline`
holds the same groups as one frozen model (derived from ``tasks.registry``), so the CLI, the tests and the
flow's first line check them the same way. The defaults are the stages' own (each stage's settings class is
their only home).

Flat keys (``wiki-pipeline run --param steps=2000``) are mapped onto the settings here and nowhere else
(:meth:`Pipeline.from_flat`): a key names a field of one stage's settings (``num_merges`` -> tokenizer) or of
several (``seed``, ``device``, ``precision`` -> model and samples), or is dotted (``samples.seed=7``), or names a
whole stage with a JSON object (``model={"steps": 100}``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pydantic import BaseModel, ConfigDict, create_model

from flows.allowed import check_allowed
from mygpt.errors import UserError
from tasks.core.settings import RunOptions, Settings
from tasks.registry import STAGES, check_run

F = TypeVar("F", bound=Callable[..., Any])


def source_urls(groups) -> list[str]:
    """What the stages download from (each settings group with a ``source_url``: the corpus's)."""
    return [g.source_url for g in groups if hasattr(g, "source_url")]


class PipelineBase(BaseModel):
    """Every stage's settings and the run options: the flow's parameters, as one object.

    Its fields are derived from ``tasks.registry.STAGES`` (one per stage, named after it, typed by the stage's
    settings class, defaulting to its defaults) plus ``run``: see :data:`Pipeline`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    if TYPE_CHECKING:  # the fields are the registry's stages: s.model, s.tokenizer, ... and s.run
        run: RunOptions

        def __getattr__(self, name: str) -> Any: ...

    @classmethod
    def parse(cls, **groups: Any) -> PipelineBase:
        """Each group (a settings instance, a dict or None) checked with its class; ``UserError`` naming the field.

        Refuses a run outside this machine's allow-lists (artifact roots, source URLs: :mod:`flows.allowed`). Also
        settles what depends on this machine (``device="auto"``, a device that is not here) and checks each
        stage's settings against the others' (:meth:`Settings.check_against`), so a bad setting stops the run
        before any stage starts."""
        unknown = sorted(set(groups) - set(cls.model_fields))
        if unknown:
            raise UserError(
                f"unknown parameter(s) {', '.join(unknown)}; the flow's parameters are {', '.join(cls.model_fields)}"
            )
        parsed = {name: cls.settings_class(name).parse(groups.get(name), name) for name in cls.model_fields}
        parsed["run"] = run = check_run(cast(RunOptions, parsed["run"]))  # settings_class("run") is RunOptions
        # what this machine lets a run touch (WIKI_PIPELINE_ALLOWED_ROOTS / _SOURCES, when set): flows.allowed
        check_allowed(run.root(), source_urls(parsed.values()))
        for group in parsed.values():
            group.resolved()  # raises where the device or precision is not available here
            group.check_against(parsed)
        return cls(**parsed)

    @classmethod
    def settings_class(cls, group: str) -> type[Settings]:
        # Every field of the create_model'd Pipeline is annotated with a Settings class (see below).
        return cast("type[Settings]", cls.model_fields[group].annotation)

    @classmethod
    def as_parameters(cls, fn: F) -> F:
        """Give ``fn(**groups)`` the signature of one keyword parameter per group, typed by its settings class and
        defaulting to its defaults, so Prefect's parameter schema (and the deployment's form in the UI) shows
        every stage's fields: the flow's parameters, derived from the registry."""
        fn.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [
                inspect.Parameter(
                    name, inspect.Parameter.KEYWORD_ONLY, default=field.default, annotation=field.annotation
                )
                for name, field in cls.model_fields.items()
            ],
            return_annotation=inspect.signature(fn).return_annotation,
        )
        return fn

    @classmethod
    def from_flat(cls, values: dict[str, Any]) -> PipelineBase:
        """Flat or dotted ``{key: value}`` pairs (see the module docstring) on top of the defaults."""
        return cls.parse(**cls.group_flat(values))

    @classmethod
    def group_flat(cls, values: dict[str, Any]) -> dict[str, dict]:
        """``{"steps": 5, "samples.seed": 7, "tokenizer": {...}}`` -> ``{"model": {"steps": 5}, ...}`` (unchecked)."""
        groups: dict[str, dict] = {}
        unknown = []
        for key, value in values.items():
            group, dot, field = key.partition(".")
            if dot and group in cls.model_fields:
                targets = [group] if field in cls.settings_class(group).model_fields else []
            elif key in cls.model_fields:
                if not isinstance(value, dict):
                    raise UserError(
                        f"{key} must be an object of settings, e.g. {key}='{{\"...\": ...}}'; got {value!r}"
                    )
                groups.setdefault(key, {}).update(value)
                continue
            else:
                field = key
                targets = [g for g in cls.model_fields if field in cls.settings_class(g).model_fields]
            if not targets:
                unknown.append(key)
            for g in targets:
                groups.setdefault(g, {})[field] = value
        if unknown:
            known = sorted({f for g in cls.model_fields for f in cls.settings_class(g).model_fields})
            raise UserError(
                f"unknown parameter(s) {', '.join(unknown)}; the parameters are {', '.join(known)} "
                f"(or stage.field, e.g. samples.seed)"
            )
        return groups

    def flow_parameters(self) -> dict[str, dict]:
        """The flow's parameters as JSON-shaped dicts, only the fields that differ from the defaults
        (for ``prefect deployment run --params``)."""
        return {
            name: group.model_dump(mode="json", exclude_defaults=True)
            for name, group in self
            if group.model_dump(exclude_defaults=True)
        }


#: The pipeline's settings: one field per stage of ``tasks.registry.STAGES`` (in order), then ``run``.
Pipeline: type[PipelineBase] = create_model(  # type: ignore[call-overload]
    "Pipeline",
    __base__=PipelineBase,
    __module__=__name__,
    **{stage.name: (stage.settings, stage.settings()) for stage in STAGES},
    run=(RunOptions, RunOptions()),
)


#: The tiny preset (``--tiny``, ``scripts/pipeline --demo``): every stage in about a minute on 2 CPU cores
#: against the loopback mirror. It sets no source_url: pair it with --mirror / --demo or a URL of your own.
TINY = {
    "tokenizer": {"num_merges": 48, "bpe_train_bytes": 200_000},
    "shards": {"shard_tokens": 50_000},
    "model": {
        "embed_dim": 32,
        "num_layers": 1,
        "num_heads": 2,
        "num_kv_heads": 1,
        "max_seq_len": 32,
        "steps": 40,
        "batch_size": 8,
        "seq_len": 32,
        "lr": 3e-3,
        "warmup": 5,
        "print_every": 10,
        "eval_every": 20,
        "eval_batches": 2,
        "checkpoint_every": 10,
    },
    "samples": {"max_new_tokens": 40},
    "run": {"workers": 1, "threads": 1},
}
