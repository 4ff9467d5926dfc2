"""Fixtures of the report tests: a real manifest of every stage."""

from __future__ import annotations

import pytest

from tasks.registry import open_store


@pytest.fixture(scope="module")
def manifests(upstream, trained):
    """A real manifest of every stage (export's: its fields by hand, as building it needs transformers)."""
    from tests.support import stages
    from tests.support.tiny import TINY

    root, corpus, _, shards = upstream
    store = open_store(root)
    for name, inputs in (("samples", (trained,)), ("evaluate", (corpus, shards, trained))):
        if not store.versions(name):
            getattr(stages, name)(root, *inputs, run=TINY["run"], **TINY[name])
    found = {v.stage: {**v.manifest, "path": v.path} for v in store.versions()}
    found["export"] = {
        "version": "0123456789ab",
        "created_at": "2026-01-01T00:00:00Z",
        "settings": {"enabled": True},
        "inputs": {"model": {"version": found["model"]["version"]}},
        "metrics": {
            "architecture": "LlamaForCausalLM",
            "num_params": 1000,
            "vocab_size": 300,
            "check": {"tokenizer_tokens": 10, "max_abs_logit_diff": 1e-6, "logit_tokens": 5},
            "versions": {"transformers": "4.0"},
            "files": {"config.json": {"bytes": 10}},
        },
        "path": "/tmp/export/0123456789ab",
    }
    return found
