"""The export stage on the tiny pipeline's trained model: a transformers directory that loads with the Auto
classes and computes mygpt's logits; model settings that cannot be exported are refused up front."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.settings import Pipeline
from mygpt.errors import UserError
from tasks import export as export_stage
from tasks.registry import open_store
from tests.support.tiny import run_in


@pytest.fixture(scope="module")
def exported(upstream, trained):
    root, corpus, _, shards = upstream
    return root, export_stage.export_model.fn(corpus, shards, trained, export_stage.ExportSettings(), run_in(root))


def test_export_publishes_a_directory_transformers_loads(exported, trained, wikitext2_text):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mygpt.checkpoint import load_checkpoint

    root, ref = exported
    store = open_store(root)
    assert store.verify("export", ref["version"], full=True) == (True, "ok")
    info = store.get("export", ref["version"])
    assert sorted(info.manifest["files"]) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert info.manifest["inputs"]["model"]["version"] == trained["version"]
    assert info.manifest["metrics"]["check"]["max_abs_logit_diff"] <= 1e-6

    model, tokenizer = load_checkpoint(Path(trained["path"]) / "model.ckpt")
    hf_tok = AutoTokenizer.from_pretrained(info.path)
    hf_model = AutoModelForCausalLM.from_pretrained(info.path, dtype=torch.float32).eval()
    text = wikitext2_text[200_000:203_000]  # held-out text, with characters outside the tiny alphabet
    ids = hf_tok(text, add_special_tokens=False)["input_ids"]
    assert ids == tokenizer.encode_corpus(text).tolist()
    window = torch.tensor(ids[: model.max_seq_len])[None]
    with torch.no_grad():
        assert torch.equal(hf_model(window).logits, model(window)[0])

    assert str(info.path) not in (Path(info.path) / "manifest.json").read_text()  # a root can move
    md = export_stage.report({**info.manifest, "path": str(info.path)})  # what Stage.run hands the report
    assert f"AutoModelForCausalLM.from_pretrained({str(info.path)!r})" in md and "ArceeForCausalLM" in md


def test_export_is_reused(exported, upstream, trained):
    root, ref = exported
    _, corpus, _, shards = upstream
    again = export_stage.export_model.fn(corpus, shards, trained, export_stage.ExportSettings(), run_in(root))
    assert again["build_id"] == ref["build_id"]


def test_unexportable_model_settings_are_refused_before_anything_runs():
    with pytest.raises(UserError, match=r"export: a model with norm='layer' .* or set export.enabled=false"):
        Pipeline.from_flat({"norm": "layer"})
    assert Pipeline.from_flat({"position": "learned", "export.enabled": False}).model.position == "learned"
