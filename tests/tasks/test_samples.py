"""The samples stage (sample): prompts (one or a list) -> samples.md + samples.json, seeded, with a readable report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mygpt.errors import UserError
from tasks import samples as sample_stage
from tasks.core.settings import RunOptions
from tasks.registry import open_store
from tasks.tokenizer import load_tokenizer
from tests.support.tiny import SETTINGS, run_in

SAMPLE = SETTINGS.samples


def sample(root, model, force: bool = False, **settings):
    run = run_in(root, force=["samples"] if force else [])
    return sample_stage.sample_model.fn(model, SAMPLE.model_copy(update=settings), run)


def test_sample_publishes_markdown_and_json(upstream, trained):
    root = upstream[0]
    prompts = ["The history of", "In 1999 , the"]
    ref = sample(root, trained, prompt=tuple(prompts))
    info = open_store(root).get("samples", ref["version"])
    assert sorted(info.manifest["files"]) == ["samples.json", "samples.md"]
    samples = json.loads((Path(info.path) / "samples.json").read_text())
    assert [s["prompt"] for s in samples] == prompts
    model_tok = load_tokenizer(upstream[2]["path"])
    for s in samples:
        assert s["continuation"], "something was generated"
        assert len(model_tok.encode(s["continuation"])) <= SAMPLE.max_new_tokens + 1
    md = (Path(info.path) / "samples.md").read_text()
    assert "**The history of**" in md and "**In 1999 , the**" in md
    assert "temperature 1.0, top-k 40, seed 1337" in md

    report = sample_stage.report(info.manifest)
    assert "**The history of**" in report and f"samples/{ref['version']}" in report

    # Seeded: a forced rebuild gives the same text; each prompt's text does not depend on the others.
    again = sample(root, trained, prompt=tuple(prompts), force=True)
    assert again["build_id"] != ref["build_id"]

    def texts(ref):
        return [s["continuation"] for s in json.loads((Path(ref["path"]) / "samples.json").read_text())]

    assert texts(again) == [s["continuation"] for s in samples]
    alone = sample(root, trained, prompt=("In 1999 , the",))
    assert texts(alone) == [samples[1]["continuation"]]


def test_prompt_characters_the_tokenizer_cannot_encode(upstream, trained):
    root = upstream[0]
    tok = load_tokenizer(upstream[2]["path"])
    with pytest.raises(UserError, match=r"prompt '🦜🦜' is made only of characters the tokenizer cannot encode"):
        sample_stage.check_prompts(tok, ["The history of", "🦜🦜"])
    warnings = sample_stage.check_prompts(tok, "The 🦜 history")
    assert len(warnings) == 1 and "U+1F99C" in warnings[0]
    ref = sample(root, trained, prompt=("The 🦜 history",))
    s = json.loads((Path(ref["path"]) / "samples.json").read_text())[0]
    assert s["prompt"] == "The 🦜 history" and s["used_prompt"] == "The  history"


@pytest.mark.parametrize(
    "bad, name",
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ["ok", 3]}, "prompt"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"device": "tpu"}, "device"),
        ({"seed": "x"}, "seed"),
        ({"nucleus": 0.9}, "nucleus"),
    ],
)
def test_sample_setting_errors_name_the_setting(bad, name):
    with pytest.raises(UserError, match=name):
        sample_stage.SamplesSettings.parse(bad, "samples")


def test_threads_is_a_run_option():
    with pytest.raises(UserError, match="threads"):
        RunOptions.parse({"threads": -1})


@pytest.mark.parametrize("temperature", [100.5, 1e6, float("inf"), float("nan"), -float("inf")])
def test_temperature_above_100_or_not_finite_is_refused(temperature):
    """The upper bound (MAX_TEMPERATURE) and finiteness: far above 100 sampling is uniform noise."""
    with pytest.raises(UserError, match=r"^samples.temperature must be (0 \(greedy\) or from 0.001 to 100|a finite)"):
        sample_stage.SamplesSettings.parse({"temperature": temperature}, "samples")
    assert sample_stage.SamplesSettings.parse({"temperature": 100.0}, "samples").temperature == 100.0
