"""The pipeline's settings as one object (:data:`Pipeline`, derived from ``tasks.registry``), the flat
``KEY=VALUE`` names of the CLI (:data:`SHARED_FLAT`) and the tiny preset (:data:`TINY`)."""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from pydantic import BaseModel, ConfigDict, PrivateAttr, create_model

from flows.allowed import check_allowed
from mygpt.errors import UserError
from tasks.core.settings import RunOptions, Settings
from tasks.registry import STAGES, check_run

F = TypeVar("F", bound=Callable[..., Any])


def source_urls(groups: Mapping[str, Any]) -> dict[str, str]:
    """What the stages read from outside the store, ``{"group.field": url}``: the corpus's ``source_url`` and a
    pretrained tokenizer's ``source`` (a path as its ``file://`` URL)."""
    from tasks.sources.pretrained_tokenizer import source_url

    found = {f"{name}.source_url": g.source_url for name, g in groups.items() if hasattr(g, "source_url")}
    tokenizer_source = getattr(groups.get("tokenizer"), "source", None)
    if tokenizer_source:
        found["tokenizer.source"] = source_url(tokenizer_source)
    return found


def check_environment(groups: Mapping[str, Any], run: RunOptions) -> None:
    """``Stage.check_environment`` of each stage this run will run (``run.only``'s, else every one not skipped):
    a bad ``WIKI_PIPELINE_*`` value stops the run before its first stage, with the message the stage would give."""
    for stage in STAGES:
        runs = stage.name == run.only if run.only else not groups[stage.name].skipped()
        if runs and stage.check_environment is not None:
            stage.check_environment()


#: The flat names that set a field of several stages at once (``--param seed=7``): name -> the stages that
#: declare it (``Stage.shared_flat``). Any other name several stages have must be written stage.field, so a new
#: stage's field never changes what a flat name does.
SHARED_FLAT: dict[str, tuple[str, ...]] = {
    key: tuple(s.name for s in STAGES if key in s.shared_flat) for stage in STAGES for key in stage.shared_flat
}


#: The groups :func:`linked` ties together.
LINKED = ("corpus", "tokenizer")


#: The tokenizer kinds whose shards end each article with ``<|endoftext|>`` (so need the corpus's article index).
DOCUMENT_KINDS = ("byte", "pretrained")


def linked(resolved: dict[str, Any]) -> dict[str, Any]:
    """``resolved`` with what one stage's settings imply for another's: a byte-level tokenizer's shards end each
    article with ``<|endoftext|>``, so its corpus writes the article index (``corpus.article_index``, when not
    given). ``UserError`` for ``corpus.article_index=false`` given with such a tokenizer: its shards could not be
    built, and turning it on anyway would overrule what was asked for."""
    corpus, tokenizer = resolved.get("corpus"), resolved.get("tokenizer")
    kind = getattr(tokenizer, "kind", None)
    if kind in DOCUMENT_KINDS and corpus is not None and not corpus.article_index:
        if corpus.article_index is False:
            raise UserError(
                f"corpus.article_index=false cannot go with tokenizer.kind={kind}: its shards end each article with "
                "<|endoftext|>, which needs the corpus's article index; leave corpus.article_index out (the "
                "pipeline turns it on) or use tokenizer.kind=chapter"
            )
        resolved = {**resolved, "corpus": corpus.model_copy(update={"article_index": True})}
    elif corpus is not None and corpus.article_index is None:  # settled: no tokenizer here needs it
        resolved = {**resolved, "corpus": corpus.model_copy(update={"article_index": False})}
    return resolved


class PipelineBase(BaseModel):
    """Every stage's settings (one field per stage of ``tasks.registry.STAGES``) and ``run``: the flow's
    parameters as one object. The fields hold the settings as given; :meth:`resolved` as this machine runs them."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    _resolved: dict[str, Settings] = PrivateAttr(default_factory=dict)

    if TYPE_CHECKING:  # the fields are the registry's stages: s.model, s.tokenizer, ... and s.run
        run: RunOptions

        def __getattr__(self, name: str) -> Any: ...

    @classmethod
    def parse(cls, **groups: Any) -> PipelineBase:
        """Each group (a settings instance, a dict or None) checked with its class, against this machine's
        allow-lists (:mod:`flows.allowed`), resolved (:meth:`Settings.resolved_once`) and checked against the
        others (:meth:`Settings.check_against`); ``UserError`` naming the field, before any stage runs."""
        unknown = sorted(set(groups) - set(cls.model_fields))
        if unknown:
            raise UserError(
                f"unknown parameter(s) {', '.join(unknown)}; the flow's parameters are {', '.join(cls.model_fields)}"
            )
        parsed = {name: cls.settings_class(name).parse(groups.get(name), name) for name in cls.model_fields}
        parsed["run"] = run = check_run(cast(RunOptions, parsed["run"]))  # settings_class("run") is RunOptions
        check_allowed(run.root(), source_urls(parsed), run.dask_address)
        check_environment(parsed, run)
        resolved = linked({name: group.resolved_once() for name, group in parsed.items()})
        for group in resolved.values():
            group.check_against(resolved)
        pipeline = cls(**parsed)
        pipeline._resolved = resolved
        return pipeline

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        copy = super().model_copy(update=update, deep=deep)
        # a group given anew is resolved anew; the others keep what parse settled (a dict of the copy's own)
        anew = set(update or {})
        if anew & set(LINKED):  # what the linked groups imply for each other is settled anew too
            anew |= set(LINKED)
        copy._resolved = {k: v for k, v in self._resolved.items() if k not in anew}
        return copy

    def resolved(self, group: str) -> Settings:
        """The settings of ``group`` as this machine runs them (resolved once, by :meth:`parse`)."""
        if group not in self._resolved:  # built without parse (a model_copy): resolve it now, once
            self._resolved[group] = getattr(self, group).resolved_once()
            if group in LINKED:  # and what it implies for the other, or the other for it
                for other in LINKED:
                    if other not in self._resolved:
                        self._resolved[other] = getattr(self, other).resolved_once()
                self._resolved.update(linked({k: self._resolved[k] for k in LINKED}))
        return self._resolved[group]

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
        """``{"steps": 5, "samples.seed": 7, "tokenizer": {...}}`` -> ``{"model": {"steps": 5}, ...}`` (unchecked):
        a flat name goes to the one group with that field, or to its :data:`SHARED_FLAT` stages."""
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
                if len(targets) > 1:
                    if key not in SHARED_FLAT:
                        raise UserError(
                            f"{key} is a setting of {', '.join(targets)}; say which with stage.field "
                            f"(e.g. {targets[0]}.{key}={value!r})"
                        )
                    targets = [g for g in targets if g in SHARED_FLAT[key]]
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


#: The run's settings as ``wiki-pipeline run`` parsed them, for the flow it calls in this process (:func:`carrying`).
_CARRIED: contextvars.ContextVar[PipelineBase | None] = contextvars.ContextVar("carried_settings", default=None)


@contextlib.contextmanager
def carrying(settings: PipelineBase) -> Iterator[None]:
    """Within: a flow called with ``settings``' groups takes ``settings`` as they are (:func:`run_settings`)."""
    token = _CARRIED.set(settings)
    try:
        yield
    finally:
        _CARRIED.reset(token)


def run_settings(parameters: Mapping[str, Any]) -> PipelineBase:
    """The flow's settings for its ``parameters``: the ones :func:`carrying` holds when ``parameters`` are exactly
    their groups, else :meth:`PipelineBase.parse` of them. Why: ``wiki-pipeline run`` has parsed, checked and
    resolved them already (before Prefect starts, so a bad value costs no server); parsed once per run, they are
    carried to the stages instead of checked and resolved again (a deployment's run has nothing carried)."""
    held = _CARRIED.get()
    if held is not None and dict(parameters) == dict(held):
        return held
    return Pipeline.parse(**parameters)


#: The tiny preset (``--tiny``, ``scripts/pipeline --demo``): every stage small enough for a quick run against
#: the loopback mirror; each stage's part is its ``Stage.tiny``. It sets no source_url.
TINY: dict[str, dict] = {**{s.name: dict(s.tiny) for s in STAGES if s.tiny}, "run": dict(RunOptions.TINY)}
