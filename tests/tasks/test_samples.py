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


def test_a_byte_level_sample_stops_at_endoftext_and_the_report_shows_where(tmp_path, shakespeare_text):
    from mygpt.checkpoint import save_checkpoint
    from mygpt.tokenizers.byte_bpe import ByteBPETokenizer
    from tasks.core.stage import StageRef
    from tasks.registry import code_versions
    from tests.support.ending_model import ending_model

    tok = ByteBPETokenizer.train(shakespeare_text[:20_000], 256 + 30 + 1)
    prompt = "ROMEO: What light"
    model, unstopped, n = ending_model(tok, prompt)
    store = open_store(tmp_path)
    build = store.open_build("model", "ending")
    save_checkpoint(model, tok, build.out / "model.ckpt")
    manifest = build.publish(settings={}, inputs={}, code_version=code_versions()["model"])
    ref = StageRef(
        stage="model", version="ending", build_id=manifest["build_id"], path=store.location("model", "ending")
    )
    out = sample(tmp_path, ref, prompt=(prompt,), temperature=0.0, max_new_tokens=24, device="cpu")
    (s,) = json.loads((Path(out["path"]) / "samples.json").read_text(encoding="utf-8"))
    assert s["stopped_at"] == "<|endoftext|>" and s["new_tokens"] == n
    assert s["continuation"] == tok.decode(unstopped[: n - 1])
    md = (Path(out["path"]) / "samples.md").read_text(encoding="utf-8")
    ended = f" [<|endoftext|>] (the model ended the text here, after {n - 1} token{'s' * (n != 2)})"
    assert sample_stage.md_text(ended) in md and md.rstrip().endswith(sample_stage.md_text(ended))


def test_control_characters_in_a_sample_are_written_out():
    """A raw ESC, NUL or BEL a model samples never reaches samples.md (ESC starts a terminal sequence)."""
    import re

    sample_dict = {"prompt": "a\x07b", "used_prompt": "a\x07b", "continuation": " x\x1b[31my\x00z\x7f\nnext\x0cline"}
    md = sample_stage.samples_markdown([{**sample_dict, "new_tokens": 5, "stopped_at": None}], SAMPLE.version_params())
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f]", md)
    assert "x\\\\x1b\\[31my\\\\x00z\\\\x7f" in md and "next\\\\x0cline" in md and "**a\\\\x07b**" in md
