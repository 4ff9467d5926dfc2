"""The flow's settings: typed per stage, checked up front (every bad input is refused, naming the field, before
any stage runs), flat keys mapped onto them in one place, and the flow's parameters are the registry's stages."""

from __future__ import annotations

import inspect
import os

import pytest
from pydantic import create_model

from flows.choices import parse_param
from flows.cli import main
from flows.settings import SHARED_FLAT, TINY, Pipeline
from mygpt.errors import UserError
from tasks.core.settings import DeviceSettings, RunOptions, Settings
from tasks.model import ModelSettings
from tasks.registry import NAMES, STAGES
from tasks.samples import SamplesSettings
from tests.support.prefect_server import task_run_states
from tests.support.tiny import tiny_flow_parameters, tiny_zip_url

CORES = os.cpu_count() or 1

BAD = [
    ({"num_heads": 5}, r"num_heads \(5\) must divide embed_dim \(192\)"),
    ({"embed_dim": 64, "num_heads": 4, "num_kv_heads": 3}, r"num_kv_heads \(3\) must divide num_heads \(4\)"),
    ({"seq_len": 512}, r"seq_len \(512\) must be <= max_seq_len \(256\)"),
    ({"steps": 0}, r"steps must be an integer >= 1"),
    ({"steps": "many"}, r"steps must be an integer"),
    ({"device": "tpu"}, r"device: unknown device 'tpu'"),
    ({"precision": "fp16"}, r"precision must be one of auto, fp32, bf16"),
    (
        {"force": ["tokenize"]},
        rf"run.force names no stage: 'tokenize'; the stages are {', '.join(NAMES)}$",
    ),
    ({"force": "nope"}, r"force names no stage: 'nope'"),
    ({"only": "evaluation"}, r"only names no stage: 'evaluation'"),
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
    ({"temperature": -0.5}, r"temperature must be 0 \(greedy\) or from 0.001 to 100, got -0.5"),
    ({"temperature": 1e-300}, r"temperature must be 0 \(greedy\) or from 0.001 to 100, got 1e-300"),
    ({"seed": 2**64}, r"model.seed must be an integer >= 0 and <= 9223372036854775807, got 18446744073709551616"),
    ({"samples.seed": -1}, r"samples.seed must be an integer >= 0 and <= 9223372036854775807, got -1"),
    ({"full_check": "yes"}, r"full_check must be true or false"),
    ({"threads": -2}, r"threads must be an integer >= 0 and <= 1024 \(or null\), got -2"),
    ({"threads": 10**6}, r"threads must be an integer >= 0 and <= 1024 \(or null\), got 1000000"),
    ({"workers": 10**6}, r"workers must be an integer >= 1 and <= 256 \(or null\), got 1000000"),
    (
        {"workers": CORES + 1},
        rf"^run.workers \({CORES + 1}\) is more than the {CORES} CPU cores here; each Dask worker is a process",
    ),
    ({"chunk_bytes": 1}, r"^run.chunk_bytes must be an integer >= 1000 and <= 1073741824 \(or null\), got 1 "),
    ({"lr": float("inf")}, r"^model.lr must be a positive finite number <= 1, got inf \(AdamW peak learning rate"),
    # finite and far out of range (each overflowed inside training)
    ({"lr": 1e300}, r"^model.lr must be a positive number <= 1, got 1e\+300 \(AdamW peak learning rate"),
    ({"lr": 1.5}, r"^model.lr must be a positive number <= 1, got 1.5 "),
    ({"max_grad_norm": 1e300}, r"^model.max_grad_norm must be a number >= 0 and <= 1e\+06, got 1e\+300 "),
    # what the Prefect server cannot store (PostgreSQL refuses a NUL), and control characters in a path or name
    (
        {"prompt": "The history of\x00"},
        r"^samples.prompt holds a NUL character \(\\x00, at character 15 of item 1\), which the Prefect server "
        "cannot store; remove it$",
    ),
    ({"prompt": ["ok", "x\ud800"]}, r"^samples.prompt holds a lone surrogate \(\\ud800, at character 2 of item 2\)"),
    ({"artifacts_dir": "/tmp/a\x00b"}, r"^run.artifacts_dir holds a NUL character \(\\x00, at character 7\)"),
    ({"artifacts_dir": "/tmp/a\x1b[0mb"}, r"^run.artifacts_dir holds a control character \(\\x1b, at character 7\)"),
    ({"source_url": "https://u:SECRET@h/\nw.zip"}, r"^corpus.source_url holds a control character \(\\n, at char"),
    ({"device": "cpu\x00"}, r"^model.device holds a NUL character"),
    ({"expected_sha256": "a\tb"}, r"^corpus.expected_sha256 holds a control character \(\\t, at character 2\)"),
    ({"only": "model\x7f"}, r"^run.only holds a control character \(\\x7f, at character 6\)"),
    ({"force": ["model\x00"]}, r"^run.force holds a NUL character \(\\x00, at character 6 of item 1\)"),
    ({"temperature": float("inf")}, r"^samples.temperature must be a finite number, got inf \(sampling temperature"),
    ({"temperature": float("nan")}, r"^samples.temperature must be a finite number, got nan"),
    ({"temperature": 100.5}, r"^samples.temperature must be 0 \(greedy\) or from 0.001 to 100, got 100.5"),
    ({"batch_size": 2**20}, r"^model.batch_size \(1,048,576\) makes training need at least"),
    # integers with no run behind them: each passed and ran until killed, or met arithmetic
    ({"steps": 10**30}, r"^model.steps must be an integer >= 1 and <= 1000000000, got 10{30} \(optimizer steps"),
    ({"warmup": 10**10}, r"^model.warmup must be an integer >= 0 and <= 1000000000, got 10000000000 "),
    ({"max_seq_len": 10**12}, r"^model.max_seq_len must be an integer >= 1 and <= 1048576, got 1000000000000 "),
    ({"batch_size": 10**12}, r"^model.batch_size must be an integer >= 1 and <= 1048576, got 1000000000000 "),
    ({"num_layers": 10**6}, r"^model.num_layers must be an integer >= 1 and <= 1024, got 1000000 "),
    ({"max_new_tokens": 10**12}, r"^samples.max_new_tokens must be an integer >= 1 and <= 65536, got 10{12} "),
    ({"top_k": 10**12}, r"^samples.top_k must be an integer >= 0 and <= 16777216, got 1000000000000 "),
    # what a path or name never holds: what is not seen, or reorders what is shown
    (
        {"artifacts_dir": "/tmp/r2/\u202eevil"},
        r"^run.artifacts_dir holds an invisible, bidi-control or line-separator character \(\\u202e, at character "
        r"9\), which no path, URL or name has; remove it$",
    ),
    ({"artifacts_dir": "/tmp/a\u200bb"}, r"^run.artifacts_dir holds an invisible.* \(\\u200b, at character 7\)"),
    ({"artifacts_dir": "/tmp/a\u2028b"}, r"^run.artifacts_dir holds an invisible.* \(\\u2028, at character 7\)"),
    ({"force": ["model\ufeff"]}, r"^run.force holds an invisible.* \(\\ufeff, at character 6 of item 1\)"),
    ({"num_layer": 2}, r"unknown parameter\(s\) num_layer"),
]


@pytest.mark.parametrize("bad, message", BAD, ids=[next(iter(b)) for b, _ in BAD])
def test_bad_parameter_is_refused_naming_it(bad, message):
    with pytest.raises(UserError, match=message):
        Pipeline.from_flat(bad)


def test_text_keeps_tabs_and_newlines_and_a_refused_value_is_not_quoted():
    """A prompt may mean a tab or a newline (only NUL and lone surrogates are refused there); the message about
    a control character names its position, never the value (a URL's password would be in it)."""
    assert Pipeline.from_flat({"prompt": ["a\tb", "line\nnext\r\n"]}).samples.prompt == ("a\tb", "line\nnext\r\n")
    bidi = ("\u05e9\u05dc\u05d5\u05dd \u202bquoted\u202c", "zero\u200dwidth", "para\u2029graph")  # text may mean them
    assert Pipeline.from_flat({"prompt": list(bidi)}).samples.prompt == bidi
    with pytest.raises(UserError) as refused:
        Pipeline.from_flat({"source_url": "https://alice:SECRET@h/w\x00.zip"})
    assert "SECRET" not in str(refused.value) and "alice" not in str(refused.value), refused.value


def test_defaults_are_the_chapters_and_live_in_the_stage_settings():
    d = Pipeline()
    assert (d.model.embed_dim, d.model.num_layers, d.model.num_heads, d.model.num_kv_heads, d.model.max_seq_len) == (
        192,
        4,
        6,
        2,
        256,
    )
    assert (d.model.steps, d.model.batch_size, d.model.seq_len, d.model.lr, d.model.warmup) == (
        10_000,
        16,
        256,
        1e-3,
        500,
    )
    assert d.samples.prompt == ("The history of",) and d.tokenizer.num_merges == 1024
    assert d.tokenizer.bpe_train_bytes == 50_000_000
    assert (d.samples.temperature, d.samples.top_k, d.samples.max_new_tokens, d.run.force, d.run.full_check) == (
        1.0,
        40,
        200,
        (),
        False,
    )
    assert d.corpus.source_url.endswith("wikitext-103-raw-v1.zip")
    assert ModelSettings.model_fields["seed"].default == SamplesSettings.model_fields["seed"].default == 1337


def test_flow_parameters_are_the_registry_stages():
    """Prefect sees one flow parameter per registered stage (its settings' schema, its defaults), then run."""
    from prefect.utilities.callables import parameter_schema

    from flows.wiki_pipeline import wiki_pipeline
    from tasks.registry import STAGES

    schema = parameter_schema(wiki_pipeline.fn)
    assert list(schema.properties) == [s.name for s in STAGES] + ["run"]
    assert schema.properties["model"]["default"]["steps"] == ModelSettings().steps == 10_000
    for stage in STAGES:
        assert schema.definitions[stage.settings.__name__]["properties"].keys() == stage.settings.model_fields.keys()
    sig = inspect.signature(wiki_pipeline.fn)
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in sig.parameters.values())


def test_flat_keys_map_onto_the_stages():
    p = Pipeline.from_flat(
        {
            "steps": 5,
            "seed": 3,
            "samples.seed": 9,
            "prompt": "Hi",
            "num_merges": 12,
            "tokenizer": {"bpe_train_bytes": 7},
            "threads": 1,
        }
    )
    assert (p.model.steps, p.model.seed, p.samples.seed, p.samples.prompt) == (5, 3, 9, ("Hi",))
    assert (p.tokenizer.num_merges, p.tokenizer.bpe_train_bytes, p.run.threads) == (12, 7, 1)
    assert p.flow_parameters() == {
        "tokenizer": {"num_merges": 12, "bpe_train_bytes": 7},
        "model": {"steps": 5, "seed": 3},
        "samples": {"prompt": ["Hi"], "seed": 9},
        "run": {"threads": 1},
    }
    with pytest.raises(UserError, match=r"unknown parameter\(s\) tokenizer.nope"):
        Pipeline.from_flat({"tokenizer.nope": 1})


def test_force_and_only_accept_task_or_store_names():
    p = Pipeline.from_flat({"force": ["tokenizer", "train", "SAMPLES"], "only": "model"})
    assert p.run.force == ("tokenizer", "model", "samples") and p.run.only == "model"
    assert Pipeline.from_flat({"force": ["bpe"], "only": "sample"}).run == p.run.model_copy(
        update={"force": ("tokenizer",), "only": "samples"}
    )


def test_tiny_preset_is_valid_and_small():
    p = Pipeline.parse(**TINY)
    assert p.model.steps <= 60 and p.model.embed_dim <= 64 and p.tokenizer.num_merges <= 64
    assert {**{s.name: s.tiny for s in STAGES if s.tiny}, "run": RunOptions.TINY} == TINY, "each stage owns its part"


def test_shared_flat_names_are_an_explicit_table():
    """The flat names that reach several stages are these; any other name several stages share is refused."""
    device_stages = tuple(s.name for s in STAGES if issubclass(s.settings, DeviceSettings))
    assert {"seed": ("model", "samples"), "device": device_stages, "precision": device_stages} == SHARED_FLAT
    p = Pipeline.from_flat({"seed": 3, "device": "cpu"})
    assert all(p.resolved(name).device == "cpu" for name in device_stages) and (p.model.seed, p.samples.seed) == (3, 3)

    class Extra(Settings):  # a new stage with a field named like the model's
        steps: int = 1

    wider = create_model("Wider", __base__=Pipeline, __module__=__name__, extra=(Extra, Extra()))
    with pytest.raises(UserError, match=r"steps is a setting of model, extra; say which with stage.field"):
        wider.group_flat({"steps": 5})
    assert wider.group_flat({"model.steps": 5, "extra.steps": 2}) == {"model": {"steps": 5}, "extra": {"steps": 2}}


def test_parse_resolves_once_and_keeps_what_was_given():
    """The flow passes the resolved settings to the stages; the fields (and the deployment's parameters) keep
    what the user asked for, so another machine resolves them for itself."""
    p = Pipeline.parse(model={"device": "auto"})
    assert p.model.device == "auto" and p.resolved("model").device != "auto"
    assert p.resolved("model").resolved_once() is p.resolved("model"), "resolved: not resolved again"
    assert "device" not in p.flow_parameters().get("model", {})


def test_parse_param():
    assert parse_param("steps=100") == ("steps", 100)
    assert parse_param("lr=3e-4") == ("lr", 3e-4)
    assert parse_param("prompt=The history of") == ("prompt", "The history of")
    assert parse_param('force=["bpe"]') == ("force", ["bpe"])
    assert parse_param('model={"steps": 5}') == ("model", {"steps": 5})
    with pytest.raises(UserError, match="KEY=VALUE"):
        parse_param("steps")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--param", "num_heads=5"], "num_heads (5) must divide embed_dim (192)"),
        (["--force", "tokenise"], "force names no stage: 'tokenise'"),
        (["--only", "eval"], "only names no stage"),
        (["--param", "device=quantum"], "device: unknown device 'quantum'"),
        (["--params", "[1]"], "--params must be a JSON object"),
    ],
)
def test_cli_refuses_before_anything_runs(tmp_path, capsys, argv, message):
    root = tmp_path / "art"
    assert main(["run", "--artifacts-dir", str(root), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert not root.exists(), "nothing ran, nothing was published"


def test_the_flow_itself_validates_before_any_task(prefect_server, tmp_path):
    """A deployment run skips the CLI: the flow's first line refuses the parameters, no task runs."""
    from flows.wiki_pipeline import wiki_pipeline

    state = wiki_pipeline(model={"num_kv_heads": 4}, run={"artifacts_dir": str(tmp_path / "art")}, return_state=True)
    assert state.is_failed()
    with pytest.raises(UserError, match=r"num_kv_heads \(4\) must divide num_heads \(6\)"):
        state.result()
    assert task_run_states(state.state_details.flow_run_id) == {}
    assert not (tmp_path / "art").exists()


def test_a_bad_cache_budget_stops_the_run_before_any_stage(prefect_server, monkeypatch, tmp_path, capsys):
    """``WIKI_PIPELINE_CACHE_MAX``, read by the model stage, is checked where the settings are (the command line
    and the flow's first line) with the stage's own message, not when the model stage starts after the corpus,
    tokenizer and shards; a run that does not run the model stage is not stopped by it."""
    from flows.wiki_pipeline import wiki_pipeline
    from tasks.core.shard_fetch import ENV_CACHE_MAX, cache_budget

    monkeypatch.setenv(ENV_CACHE_MAX, "lots")
    with pytest.raises(UserError) as e:
        cache_budget()
    assert str(e.value).startswith(f"{ENV_CACHE_MAX}='lots' is not a size")
    root = tmp_path / "art"
    assert main(["run", "--tiny", "--artifacts-dir", str(root), "--source-url", tiny_zip_url(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: {e.value}"
    assert not root.exists(), "nothing ran, nothing was published"
    state = wiki_pipeline(**tiny_flow_parameters(tiny_zip_url(tmp_path), root), return_state=True)
    with pytest.raises(UserError) as in_flow:
        state.result()
    assert str(in_flow.value) == str(e.value)
    assert task_run_states(state.state_details.flow_run_id) == {} and not root.exists()
    with pytest.raises(UserError, match=f"^{ENV_CACHE_MAX}="):
        Pipeline.parse(run={"only": "model"})
    assert Pipeline.parse(run={"only": "shards"}).run.only == "shards"


def test_prompt_the_tokenizer_cannot_encode_stops_the_flow_after_bpe(prefect_server, tmp_path):
    """The tokenizer check runs right after bpe: encode, train and sample never start."""
    from flows.wiki_pipeline import wiki_pipeline

    url = tiny_zip_url(tmp_path)
    params = tiny_flow_parameters(url, tmp_path / "art", samples={"prompt": ["The history of", "🦜🦜🦜"]})
    state = wiki_pipeline(**params, return_state=True)
    with pytest.raises(UserError, match=r"prompt '🦜🦜🦜' is made only of characters the tokenizer cannot encode"):
        state.result()
    assert task_run_states(state.state_details.flow_run_id) == {"corpus": "Completed", "tokenizer": "Completed"}
    assert not (tmp_path / "art" / "shards").exists() and not (tmp_path / "art" / "model").exists()


def test_flow_signature_types_every_parameter():
    from flows.wiki_pipeline import wiki_pipeline

    sig = inspect.signature(wiki_pipeline.fn)
    assert all(p.annotation is not inspect.Parameter.empty for p in sig.parameters.values())


def test_artifacts_dir_under_a_file_is_refused_up_front(tmp_path):
    """It used to fail with NotADirectoryError after the flow had started."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(UserError, match=rf"^run.artifacts_dir {afile}/sub/dir is inside {afile}, a file, not a dir"):
        Pipeline.from_flat({"artifacts_dir": str(afile / "sub" / "dir")})
    assert Pipeline.from_flat({"artifacts_dir": str(tmp_path / "new" / "dir")}).run.root() == str(tmp_path / "new/dir")


def test_workers_beyond_the_cores_are_fine_with_a_dask_address():
    run = RunOptions.parse({"workers": CORES + 1, "dask_address": "tcp://127.0.0.1:8786"}, "run")
    assert run.workers == CORES + 1  # not used: the scheduler's workers do the chunk work


def test_the_flow_imports_and_checks_its_parameters_without_torch():
    """A cached rerun's flow process pays for no torch: importing the flow and checking its parameters (the
    defaults with device auto, the tiny preset) never loads it where nothing but the CPU can run them."""
    import subprocess
    import sys

    from mygpt.limits import resolves_to_cpu
    from tests.support import REPO

    if not resolves_to_cpu("auto"):
        pytest.skip("device auto may be an accelerator here: torch answers it")
    code = """
import sys
from flows.wiki_pipeline import wiki_pipeline
from flows.settings import TINY, Pipeline
Pipeline.parse(); Pipeline.parse(**TINY); Pipeline.from_flat({"steps": 5, "device": "cpu", "precision": "bf16"})
print(sorted(m for m in ("torch", "transformers", "safetensors", "tokenizers") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_copy_with_a_group_given_anew_resolves_that_group_anew():
    p = Pipeline.from_flat({"steps": 5})
    assert p.resolved("model").steps == 5
    q = p.model_copy(update={"model": p.model.model_copy(update={"steps": 7})})
    assert q.model.steps == 7 and q.resolved("model").steps == 7
    assert p.resolved("model").steps == 5, "the original keeps its own"
    assert q.resolved("tokenizer") is p.resolved("tokenizer"), "a group not given anew is not resolved again"


def test_a_warmup_not_shorter_than_the_steps_is_a_warning_not_an_error():
    """It runs (the learning rate never leaves warmup): a warning naming both fields, none for a sane recipe."""
    s = Pipeline.from_flat({"steps": 60})  # the chapter's warmup, 500
    (warning,) = s.resolved("model").warnings()
    assert warning.startswith("model.warmup (500) is not shorter than steps (60): the learning rate rises for the")
    assert "peaks at 12% of lr (0.001)" in warning, warning
    assert Pipeline.from_flat({"steps": 600}).resolved("model").warnings() == []
    assert Pipeline.from_flat({"steps": 6, "warmup": 0}).resolved("model").warnings() == []


def test_training_fields_given_with_a_pretrained_tokenizer_are_a_warning_naming_them():
    """``num_merges`` and ``pattern`` given with ``kind=pretrained`` run (the file has its own) but are not used:
    a warning for each one given (the tiny preset gives num_merges), none when left out or for a trained kind."""
    pretrained = {"kind": "pretrained", "source": "/t/tokenizer.json"}
    s = Pipeline.parse(tokenizer={**pretrained, "num_merges": 48, "pattern": "gpt2"})
    assert s.resolved("tokenizer").warnings() == [
        "tokenizer.num_merges=48 is not used with kind=pretrained: the tokenizer.json at tokenizer.source has its "
        "own merges, and the version does not depend on it; leave num_merges out, or use kind=byte to train one",
        "tokenizer.pattern='gpt2' is not used with kind=pretrained: the tokenizer.json at tokenizer.source has its "
        "own split pattern, and the version does not depend on it; leave pattern out, or use kind=byte to train one",
    ]
    tiny = Pipeline.parse(**{**TINY, "tokenizer": {**TINY["tokenizer"], **pretrained}})
    assert [w.split(" is ")[0] for w in tiny.resolved("tokenizer").warnings()] == ["tokenizer.num_merges=48"]
    assert Pipeline.parse(tokenizer=pretrained).resolved("tokenizer").warnings() == []
    assert Pipeline.parse(tokenizer={"kind": "byte", "num_merges": 48}).resolved("tokenizer").warnings() == []


def test_the_older_verbs_a_stage_answers_to_are_documented_in_the_help():
    """``only: "train"`` runs the model stage: every alias the registry accepts is in the help of ``only`` and
    ``force`` (the UI form's text), as ``verb = stage``."""
    from tasks.core.settings import RunOptions
    from tasks.registry import STAGES

    aliases = {s.alias: s.name for s in STAGES if s.alias}
    assert aliases, "the registry has older verbs"
    for field in ("only", "force"):
        help_text = RunOptions.model_fields[field].description or ""
        assert [f"{verb} = {name}" for verb, name in aliases.items() if f"{verb} = {name}" not in help_text] == []
    assert Pipeline.from_flat({"only": "train"}).run.only == "model"


def test_a_byte_level_tokenizer_turns_on_the_corpus_article_index():
    """tokenizer.kind=byte ends each article with <|endoftext|>: the corpus it runs on writes the article index;
    the chapter's kind leaves the corpus as it was (and a copy given a byte tokenizer anew gets the index too)."""
    chapter = Pipeline.from_flat({})
    assert chapter.resolved("corpus").article_index is False
    byte = Pipeline.from_flat({"tokenizer.kind": "byte"})
    assert byte.resolved("tokenizer").kind == "byte" and byte.resolved("corpus").article_index is True
    assert byte.corpus.article_index is None, "the parameters as given are kept"
    copy = chapter.model_copy(update={"tokenizer": chapter.tokenizer.model_copy(update={"kind": "byte"})})
    assert copy.resolved("corpus").article_index is True
    assert chapter.resolved("corpus").article_index is False


@pytest.mark.parametrize("kind", ["byte", "pretrained"])
def test_an_article_index_turned_off_by_hand_is_refused_with_a_byte_level_tokenizer(kind):
    """corpus.article_index=false given with a tokenizer whose shards end articles: refused, not overruled."""
    tokenizer = {"kind": kind, **({"source": "/t/tokenizer.json"} if kind == "pretrained" else {})}
    with pytest.raises(UserError, match=rf"^corpus\.article_index=false cannot go with tokenizer\.kind={kind}: "):
        Pipeline.parse(corpus={"article_index": False}, tokenizer=tokenizer)
    given = Pipeline.parse(corpus={"article_index": True}, tokenizer=tokenizer)
    assert given.resolved("corpus").article_index is True
    chapter = Pipeline.parse(corpus={"article_index": False})
    copy = chapter.model_copy(update={"tokenizer": chapter.tokenizer.model_copy(update=tokenizer)})
    with pytest.raises(UserError, match=r"corpus\.article_index=false cannot go"):
        copy.resolved("corpus")


def test_every_integer_of_the_model_and_samples_has_an_upper_bound():
    """A number no run means is refused by name (``steps=10**30`` passed and trained until killed)."""
    import annotated_types

    unbounded = [
        f"{group}.{name}"
        for group in ("model", "samples")
        for name, field in Pipeline.settings_class(group).model_fields.items()
        if field.annotation in (int, int | None) and not any(isinstance(m, annotated_types.Le) for m in field.metadata)
    ]
    assert not unbounded, unbounded


def test_the_flow_takes_the_settings_the_run_command_parsed_and_parses_anything_else(monkeypatch):
    """Parsed and resolved once per run: within ``carrying``, the flow's parameters equal to the carried settings'
    groups give those very settings (no second parse); other parameters are parsed, as a deployment's run is."""
    from flows.settings import TINY, Pipeline, carrying, run_settings

    settings = Pipeline.parse(**TINY)
    parses = []
    real = Pipeline.parse.__func__

    monkeypatch.setattr(Pipeline, "parse", classmethod(lambda cls, **g: (parses.append(g), real(cls, **g))[1]))
    with carrying(settings):
        assert run_settings(dict(settings)) is settings and parses == []
        other = {**dict(settings), "model": {**TINY["model"], "steps": 3}}
        assert run_settings(other).model.steps == 3 and len(parses) == 1
    assert run_settings(dict(settings)) == settings and len(parses) == 2, "nothing carried: parsed"
    assert run_settings(dict(settings)).resolved("model") == settings.resolved("model")
