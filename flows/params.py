"""The wiki-pipeline flow's parameters: which stage takes which, up-front validation, and the tiny preset.

``validate(values)`` checks every flow parameter before any stage runs (each stage module's own ``validate``
does the checking, so the rules live in one place) and raises ``UserError`` naming the parameter. One check
needs the tokenizer and so runs later: a prompt made only of characters the tokenizer cannot encode is
refused right after the bpe stage, before encode and train (``tasks.sample.check_prompts``).

``TINY`` is the documented tiny preset: a model and corpus so small that the whole pipeline finishes in about
a minute on 2 CPU cores against the loopback mirror (``wiki-pipeline run --tiny --mirror``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from mygpt.errors import UserError
from tasks import bpe, download, encode, sample, train

STAGES = ("download", "bpe", "encode", "train", "sample")  # Prefect task names, in pipeline order
STORE_NAMES = {"download": "corpus", "bpe": "tokenizer", "encode": "shards", "train": "model", "sample": "samples"}
MODULES = {"download": download, "bpe": bpe, "encode": encode, "train": train, "sample": sample}

# The flow parameters each stage takes (the flow passes them on as keyword arguments).
STAGE_PARAMS = {
    "download": ("source_url", "expected_bytes", "expected_sha256"),
    "bpe": ("num_merges", "bpe_train_bytes"),
    "encode": ("shard_tokens", "unk_policy", "workers"),
    "train": (*train.DEFAULTS, "threads"),
    "sample": (*sample.DEFAULTS, "threads"),
}
RUN_PARAMS = ("artifacts_dir", "force", "full_check", "only")  # how to run, not what to build

TINY = dict(
    num_merges=48, bpe_train_bytes=200_000, shard_tokens=50_000, workers=1,
    embed_dim=32, num_layers=1, num_heads=2, num_kv_heads=1, max_seq_len=32,
    steps=40, batch_size=8, seq_len=32, lr=3e-3, warmup=5, print_every=10, eval_every=20, eval_batches=2,
    checkpoint_every=10, max_new_tokens=40, threads=1,
)


def stage_name(name: object, param: str) -> str:
    """A stage's task name from its task name (``bpe``) or store name (``tokenizer``)."""
    by_store = {v: k for k, v in STORE_NAMES.items()}
    if isinstance(name, str) and name.strip().lower() in STAGES:
        return name.strip().lower()
    if isinstance(name, str) and name.strip().lower() in by_store:
        return by_store[name.strip().lower()]
    raise UserError(f"{param} names no stage: {name!r}; stages are {', '.join(STAGES)} "
                    f"(or their outputs {', '.join(STORE_NAMES.values())})")


@dataclass(frozen=True)
class PipelineParams:
    values: dict  # every flow parameter, as given
    artifacts_dir: str
    force: frozenset  # task names
    full_check: bool
    only: str | None

    def stage(self, name: str) -> dict:
        """Keyword arguments for stage ``name``'s wrapper (its parameters + force/full_check)."""
        return {**{k: self.values[k] for k in STAGE_PARAMS[name]},
                "force": name in self.force, "full_check": self.full_check}


def validate(values: dict) -> PipelineParams:
    """Check every flow parameter up front; ``UserError`` naming the first bad one."""
    known = {k for names in STAGE_PARAMS.values() for k in names} | set(RUN_PARAMS)
    unknown = sorted(set(values) - known)
    if unknown:
        raise UserError(f"unknown parameter(s) {', '.join(unknown)}; the flow's parameters are "
                        f"{', '.join(sorted(known))}")
    for name, module in MODULES.items():
        module.validate(**{k: values[k] for k in STAGE_PARAMS[name] if k in values})

    force = values.get("force") or []
    if isinstance(force, str):
        force = [force]
    if not isinstance(force, (list, tuple, set, frozenset)):
        raise UserError(f"force must be a list of stage names, got {force!r}")
    force = frozenset(stage_name(s, "force") for s in force)
    only = values.get("only") or None
    if only is not None:
        only = stage_name(only, "only")
    full_check = values.get("full_check", False)
    if not isinstance(full_check, bool):
        raise UserError(f"full_check must be true or false, got {full_check!r}")
    root = values.get("artifacts_dir") or None
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise UserError(f"artifacts_dir must be a directory path, got {root!r}")
    from tasks.store import default_root

    root = os.path.abspath(os.path.expanduser(root)) if root else str(default_root())
    if os.path.exists(root) and not os.path.isdir(root):
        raise UserError(f"artifacts_dir {root} is a file, not a directory; give a directory for the artifacts")
    return PipelineParams(dict(values), root, force, full_check, only)


def flow_defaults() -> dict:
    """The flow's parameters with their defaults (the chapter's), from the flow's signature."""
    import inspect

    from flows.wiki_pipeline import wiki_pipeline

    return {name: p.default for name, p in inspect.signature(wiki_pipeline.fn).parameters.items()}
