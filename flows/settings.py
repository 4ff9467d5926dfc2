"""The pipeline's settings as one object, the flat ``KEY=VALUE`` convenience of the CLI, and the tiny preset.

The flow takes one settings object per stage plus the run options (``flows.wiki_pipeline``); :class:`Pipeline`
holds the same six as one frozen model, so the CLI, the tests and the flow's first line check them the same
way. The defaults are the stages' own (each stage's settings class is their only home).

Flat keys (``wiki-pipeline run --param steps=2000``) are mapped onto the settings here and nowhere else
(:meth:`Pipeline.from_flat`): a key names a field of one stage's settings (``num_merges`` -> tokenizer) or of
several (``seed``, ``device``, ``precision`` -> model and samples), or is dotted (``samples.seed=7``), or names a
whole stage with a JSON object (``model={"steps": 100}``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from mygpt.errors import UserError
from tasks.corpus import CorpusSettings
from tasks.export import ExportSettings
from tasks.model import ModelSettings
from tasks.samples import SamplesSettings
from tasks.core.settings import RunOptions, Settings
from tasks.shards import ShardsSettings
from tasks.tokenizer import TokenizerSettings


class Pipeline(BaseModel):
    """Every stage's settings and the run options: the flow's parameters, as one object."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    corpus: CorpusSettings = CorpusSettings()
    tokenizer: TokenizerSettings = TokenizerSettings()
    shards: ShardsSettings = ShardsSettings()
    model: ModelSettings = ModelSettings()
    samples: SamplesSettings = SamplesSettings()
    export: ExportSettings = ExportSettings()
    run: RunOptions = RunOptions()

    @classmethod
    def parse(cls, **groups: Any) -> "Pipeline":
        """Each group (a settings instance, a dict or None) checked with its class; ``UserError`` naming the field.

        Also settles what depends on this machine (``device="auto"``, a device that is not here), so a bad
        setting stops the run before any stage starts."""
        unknown = sorted(set(groups) - set(cls.model_fields))
        if unknown:
            raise UserError(f"unknown parameter(s) {', '.join(unknown)}; the flow's parameters are "
                            f"{', '.join(cls.model_fields)}")
        parsed = {name: cls.settings_class(name).parse(groups.get(name), name) for name in cls.model_fields}
        for name in ("model", "samples"):
            parsed[name].resolved()  # raises where the device or precision is not available here
        parsed["export"].check_model(parsed["model"].norm, parsed["model"].position)
        return cls(**parsed)

    @classmethod
    def settings_class(cls, group: str) -> type[Settings]:
        return cls.model_fields[group].annotation

    @classmethod
    def from_flat(cls, values: dict[str, Any]) -> "Pipeline":
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
                    raise UserError(f"{key} must be an object of settings, e.g. {key}='{{\"...\": ...}}'; got {value!r}")
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
            raise UserError(f"unknown parameter(s) {', '.join(unknown)}; the parameters are {', '.join(known)} "
                            f"(or stage.field, e.g. samples.seed)")
        return groups

    def flow_parameters(self) -> dict[str, dict]:
        """The flow's parameters as JSON-shaped dicts, only the fields that differ from the defaults
        (for ``prefect deployment run --params``)."""
        return {name: group.model_dump(mode="json", exclude_defaults=True)
                for name, group in self if group.model_dump(exclude_defaults=True)}


#: The tiny preset (``--tiny``, ``scripts/pipeline --demo``): every stage in about a minute on 2 CPU cores
#: against the loopback mirror. It sets no source_url: pair it with --mirror / --demo or a URL of your own.
TINY = {
    "tokenizer": {"num_merges": 48, "bpe_train_bytes": 200_000},
    "shards": {"shard_tokens": 50_000},
    "model": {"embed_dim": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "max_seq_len": 32, "steps": 40,
              "batch_size": 8, "seq_len": 32, "lr": 3e-3, "warmup": 5, "print_every": 10, "eval_every": 20,
              "eval_batches": 2, "checkpoint_every": 10},
    "samples": {"max_new_tokens": 40},
    "run": {"workers": 1, "threads": 1},
}
