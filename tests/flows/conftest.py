"""Fixtures of the report tests: a real manifest of every stage."""

from __future__ import annotations

import pytest

from tasks.registry import open_store


@pytest.fixture(scope="module")
def manifests(upstream, trained):
    """A real manifest of every stage, one chain: the session's upstream versions, its trained model, and the
    samples and evaluate versions of that model (built here, or reused where built before); export's fields by
    hand, as building it needs transformers. Why pick by version: other tests publish more versions into the same
    root (another model, say), and the newest of a stage need not be the one the others were built from."""
    from tests.support import stages
    from tests.support.tiny import TINY

    root, corpus, tokenizer, shards = upstream
    store = open_store(root)
    chain = {"corpus": corpus, "tokenizer": tokenizer, "shards": shards, "model": trained}
    for name, inputs in (("samples", (trained,)), ("evaluate", (corpus, shards, trained))):
        chain[name] = getattr(stages, name)(root, *inputs, run=TINY["run"], **TINY[name])
    ours = {(name, ref["version"]) for name, ref in chain.items()}
    found = {v.stage: {**v.manifest, "path": v.path} for v in store.versions() if (v.stage, v.version) in ours}
    assert found.keys() == chain.keys(), (sorted(found), sorted(chain))
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
