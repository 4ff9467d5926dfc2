"""Up-front parameter validation: every bad input is refused, naming the parameter, before any stage runs."""

from __future__ import annotations

import inspect

import pytest

from flows import params as P
from flows.cli import main, parse_param
from mygpt.errors import UserError
from tasks import sample as sample_stage
from tasks import train as train_stage
from tests.prefect_server import task_run_states
from tests.tiny import tiny_zip_url

BAD = [
    ({"num_heads": 5}, r"num_heads \(5\) must divide embed_dim \(192\)"),
    ({"embed_dim": 64, "num_heads": 4, "num_kv_heads": 3}, r"num_kv_heads \(3\) must divide num_heads \(4\)"),
    ({"seq_len": 512}, r"seq_len \(512\) must be <= max_seq_len \(256\)"),
    ({"steps": 0}, r"steps must be an integer >= 1"),
    ({"steps": "many"}, r"steps must be an integer"),
    ({"device": "tpu"}, r"device: unknown device 'tpu'"),
    ({"precision": "fp16"}, r"precision must be one of auto, fp32, bf16"),
    ({"force": ["tokenize"]}, r"force names no stage: 'tokenize'; stages are download, bpe, encode, train, sample"),
    ({"force": "nope"}, r"force names no stage: 'nope'"),
    ({"only": "evaluate"}, r"only names no stage: 'evaluate'"),
    ({"train_splits": "most"}, r"train_splits must be one of train, all"),
    ({"lr": 0}, r"lr must be a positive number"),
    ({"norm": "batch"}, r"norm must be one of layer, rms"),
    ({"embed_dim": 27, "num_heads": 3, "num_kv_heads": 1}, r"position 'rope' needs an even head size"),
    ({"num_merges": -1}, r"num_merges must be an integer >= 0"),
    ({"source_url": "ftp://example.org/x.zip"}, r"source_url .* has scheme 'ftp'"),
    ({"expected_sha256": "abc"}, r"expected_sha256 must be 64 hexadecimal digits"),
    ({"shard_tokens": 0}, r"shard_tokens must be an integer >= 1"),
    ({"prompt": "  "}, r"prompt '  ' is empty"),
    ({"max_new_tokens": 0}, r"max_new_tokens must be an integer >= 1"),
    ({"top_k": -1}, r"top_k must be an integer >= 0"),
    ({"temperature": -0.5}, r"temperature must be a number >= 0"),
    ({"full_check": "yes"}, r"full_check must be true or false"),
    ({"threads": -2}, r"threads must be an integer >= 0"),
    ({"num_layer": 2}, r"unknown parameter\(s\) num_layer"),
]


@pytest.mark.parametrize("bad, message", BAD, ids=[next(iter(b)) for b, _ in BAD])
def test_bad_parameter_is_refused_naming_it(bad, message):
    with pytest.raises(UserError, match=message):
        P.validate({**P.flow_defaults(), **bad})


def test_flow_defaults_are_the_chapters_and_match_the_stages():
    d = P.flow_defaults()
    assert {k: d[k] for k in train_stage.DEFAULTS} == train_stage.DEFAULTS
    assert {k: d[k] for k in sample_stage.DEFAULTS if k != "prompt"} == {
        k: v for k, v in sample_stage.DEFAULTS.items() if k != "prompt"}
    assert d["prompt"] == "The history of" and d["num_merges"] == 1024 and d["bpe_train_bytes"] == 50_000_000
    assert (d["temperature"], d["top_k"], d["max_new_tokens"], d["force"], d["full_check"]) == (1.0, 40, 200, [], False)
    assert d["source_url"].endswith("wikitext-103-raw-v1.zip")
    every = {k for names in P.STAGE_PARAMS.values() for k in names} | set(P.RUN_PARAMS)
    assert every == set(d), "every flow parameter goes to a stage (or says how to run)"


def test_force_and_only_accept_task_or_store_names():
    p = P.validate({**P.flow_defaults(), "force": ["tokenizer", "train", "SAMPLES"], "only": "model"})
    assert p.force == {"bpe", "train", "sample"} and p.only == "train"
    assert p.stage("bpe")["force"] and not p.stage("encode")["force"]


def test_tiny_preset_is_valid_and_small():
    p = P.validate({**P.flow_defaults(), **P.TINY})
    assert p.values["steps"] <= 60 and p.values["embed_dim"] <= 64 and p.values["num_merges"] <= 64


def test_parse_param():
    assert parse_param("steps=100") == ("steps", 100)
    assert parse_param("lr=3e-4") == ("lr", 3e-4)
    assert parse_param("prompt=The history of") == ("prompt", "The history of")
    assert parse_param('force=["bpe"]') == ("force", ["bpe"])
    with pytest.raises(UserError, match="KEY=VALUE"):
        parse_param("steps")


@pytest.mark.parametrize("argv, message", [
    (["--param", "num_heads=5"], "num_heads (5) must divide embed_dim (192)"),
    (["--force", "tokenise"], "force names no stage: 'tokenise'"),
    (["--only", "eval"], "only names no stage"),
    (["--param", "device=quantum"], "device: unknown device 'quantum'"),
    (["--params", "[1]"], "--params must be a JSON object"),
])
def test_cli_refuses_before_anything_runs(tmp_path, capsys, argv, message):
    root = tmp_path / "art"
    assert main(["run", "--artifacts-dir", str(root), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert not root.exists(), "nothing ran, nothing was published"


def test_the_flow_itself_validates_before_any_task(prefect_server, tmp_path):
    """A deployment run skips the CLI: the flow's first line refuses the parameters, no task runs."""
    from flows.wiki_pipeline import wiki_pipeline

    state = wiki_pipeline(num_kv_heads=4, artifacts_dir=str(tmp_path / "art"), return_state=True)
    assert state.is_failed()
    with pytest.raises(UserError, match=r"num_kv_heads \(4\) must divide num_heads \(6\)"):
        state.result()
    assert task_run_states(state.state_details.flow_run_id) == {}
    assert not (tmp_path / "art").exists()


def test_prompt_the_tokenizer_cannot_encode_stops_the_flow_after_bpe(prefect_server, tmp_path):
    """The tokenizer check runs right after bpe: encode, train and sample never start."""
    from flows.wiki_pipeline import wiki_pipeline

    url = tiny_zip_url(tmp_path)
    state = wiki_pipeline(**P.TINY, source_url=url, prompt=["The history of", "🦜🦜🦜"],
                          artifacts_dir=str(tmp_path / "art"), return_state=True)
    with pytest.raises(UserError, match=r"prompt '🦜🦜🦜' is made only of characters the tokenizer cannot encode"):
        state.result()
    assert task_run_states(state.state_details.flow_run_id) == {"download": "Completed", "bpe": "Completed"}
    assert not (tmp_path / "art" / "shards").exists() and not (tmp_path / "art" / "model").exists()


def test_flow_signature_types_every_parameter():
    from flows.wiki_pipeline import wiki_pipeline

    sig = inspect.signature(wiki_pipeline.fn)
    assert all(p.annotation is not inspect.Parameter.empty for p in sig.parameters.values())
