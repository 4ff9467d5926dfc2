"""The model stage on real (tiny) upstream versions: memory-mapped shards, published checkpoint, history, report."""

from __future__ import annotations

import base64
import csv
import json
import os
import re
import xml.dom.minidom
from pathlib import Path

import numpy as np
import pytest

from mygpt.errors import UserError
from tasks import model as train_stage
from tasks.registry import NAMES, open_store
from tests.support.tiny import SETTINGS, TINY, run_in

TINY_MODEL = SETTINGS.model


def test_train_publishes_checkpoint_history_and_metrics(upstream, trained):
    root, _, tokenizer, _ = upstream
    store = open_store(root)
    assert store.verify("model", trained["version"], full=True) == (True, "ok")
    info = store.get("model", trained["version"])
    assert sorted(info.manifest["files"]) == ["loss_history.csv", "loss_history.json", "model.ckpt"]
    p, m = info.manifest["settings"], info.manifest["metrics"]
    assert p["device"] == "cpu" and p["precision"] == "fp32", "auto resolves before the version is computed"
    assert "threads" not in p, "threads is a run option, not a parameter"
    assert m["steps"] == TINY_MODEL.steps and m["resumed_from"] == 0
    assert m["device"] == "cpu" and m["precision"] == "fp32" and m["params"] > 0 and m["tokens_per_sec"] > 0
    assert m["final_val_loss"] is not None and m["final_loss"] < m["loss_curve"][0][1], "the loss went down"
    assert 0 < m["final_val_bpb"] < 8 and m["flops_per_token"] > 0 and m["tflops"] > 0 and m["mfu"] is None
    assert (m["nproc"], m["compiled"], p["nproc"], p["compile"]) == (1, False, 1, False)
    assert info.manifest["inputs"]["tokenizer"]["version"] == tokenizer["version"]

    history = json.loads((Path(info.path) / "loss_history.json").read_text())
    assert [h["step"] for h in history] == [1, 10, 20, 30, 40]
    assert [h["step"] for h in history if "val_loss" in h] == [20, 40]
    rows = list(csv.DictReader((Path(info.path) / "loss_history.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, 10, 20, 30, 40] and rows[-1]["val_loss"] and rows[-1]["val_bpb"]

    from mygpt.checkpoint import load_checkpoint, load_checkpoint_payload

    payload = load_checkpoint_payload(Path(info.path) / "model.ckpt")
    assert "resume" not in payload, "the published checkpoint is the chapter's format, without optimizer state"
    assert payload["config"]["norm_type"] == "rms" and payload["config"]["position_type"] == "rope"
    model, tok = load_checkpoint(Path(info.path) / "model.ckpt")
    assert model.embed_dim == TINY_MODEL.embed_dim and tok.state() == json.loads(
        (Path(tokenizer["path"]) / "tokenizer.json").read_text()
    )
    assert not (store.staging_path("model", trained["version"])).exists(), "work dir deleted on publish"


def test_published_checkpoint_works_with_mygpt_generate(trained, capsys):
    from mygpt.cli import main

    rc = main(
        [
            "generate",
            "--checkpoint",
            str(Path(trained["path"]) / "model.ckpt"),
            "--prompt",
            "The history of",
            "--max-new-tokens",
            "8",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0 and "The history of" in capsys.readouterr().out


def test_report_has_a_readable_loss_curve_and_summary(upstream, trained):
    manifest = open_store(upstream[0]).get("model", trained["version"]).manifest
    md = train_stage.report(manifest)
    m = re.search(r"!\[loss curve\]\(data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", md)
    assert m, "the curve is an inline SVG image"
    svg = xml.dom.minidom.parseString(base64.b64decode(m.group(1)))
    lines = svg.getElementsByTagName("polyline")
    assert len(lines) == 2, "train and validation loss"
    assert len(lines[0].getAttribute("points").split()) == 5
    for needle in (
        "final train loss",
        "final val loss",
        "final val bits per byte",
        "tokens/s",
        "FLOPs per token",
        "achieved TFLOP/s",
        "| MFU | n/a |",
        "| processes / compile | 1 / off |",
        "cpu / fp32",
        "| 40 | ",
    ):
        assert needle in md


def test_train_reads_memory_mapped_shards_of_all_splits(upstream, tmp_path):
    from tasks.core.shard_fetch import fetch_shards
    from tasks.core.shard_format import read_shard, shard_paths

    root, _, _, shards = upstream
    store, folder = open_store(root), Path(shards["path"])
    data = fetch_shards(store, shards["version"], tmp_path / "t", ("train", "valid", "test"))
    names = [Path(p).name for p in data.train]
    assert names == [
        p.name.replace(".parquet", ".bin") for s in ("train", "valid", "test") for p in shard_paths(folder, s)
    ]
    assert data.dtype == "uint16" and data.valid_tokens == len(read_shard(folder / "valid-00000.parquet"))
    every = np.concatenate([read_shard(p) for s in ("train", "valid", "test") for p in shard_paths(folder, s)])
    assert data.train_tokens == len(every)
    from mygpt.training.data import open_token_files

    train = open_token_files(data.train, data.dtype)
    assert np.array_equal(train[0 : len(train)], every), "the splits as one sequence, in index order"
    assert all(isinstance(p, np.memmap) for p in train.parts), "no copies of the corpus"


def test_what_a_step_reads_does_not_depend_on_how_the_split_is_cut_into_shards(upstream, tmp_path):
    """Each step's windows are drawn uniformly from the whole training split: the same settings on the same
    tokens cut into one shard or into many give the same loss history, bit for bit on the CPU."""
    import shutil

    from tests.support import stages

    root, corpus, tokenizer, _ = upstream
    art = tmp_path / "art"
    shutil.copytree(root, art, ignore=shutil.ignore_patterns("shards", "model", "samples", "export", "evaluate"))
    settings = {**SETTINGS.model.model_dump(), "steps": 30, "print_every": 1, "eval_every": 15, "checkpoint_every": 0}
    histories, cuts = [], []
    for shard_tokens in (10_000_000, 20_000):
        shards = stages.shards(art, corpus, tokenizer, run=TINY["run"], shard_tokens=shard_tokens)
        cuts.append(len(list(Path(shards["path"]).glob("train-*.parquet"))))
        model = stages.model(art, shards, tokenizer, run=TINY["run"], **settings)
        history = json.loads((Path(model["path"]) / "loss_history.json").read_text())
        histories.append([(h["step"], h["loss"], h.get("val_loss"), h.get("val_bpb")) for h in history])
    assert cuts[0] == 1 and cuts[1] > 20, cuts
    assert len(histories[0]) == 30 and histories[0] == histories[1]


def test_train_splits_all_is_another_version(upstream, trained):
    root, _, tokenizer, shards = upstream
    settings = TINY_MODEL.model_copy(update={"steps": 3, "print_every": 1, "eval_every": 3, "checkpoint_every": 0})
    a = train_stage.train_model.fn(shards, tokenizer, settings, run_in(root))
    b = train_stage.train_model.fn(shards, tokenizer, settings.model_copy(update={"train_splits": "all"}), run_in(root))
    store = open_store(root)
    ma, mb = (store.get("model", r["version"]).manifest["metrics"] for r in (a, b))
    assert a["version"] != b["version"] and mb["train_tokens"] > ma["train_tokens"]
    assert train_stage.train_model.fn(shards, tokenizer, settings, run_in(root))["build_id"] == a["build_id"], "reused"


def test_chapter_defaults_and_resolved_device():
    v = train_stage.ModelSettings().resolved().version_params()
    assert v["device"] in ("cpu", "cuda", "mps") and v["precision"] in ("fp32", "bf16")
    assert (v["embed_dim"], v["num_layers"], v["num_heads"], v["num_kv_heads"], v["max_seq_len"]) == (192, 4, 6, 2, 256)
    assert (v["seq_len"], v["batch_size"], v["lr"], v["warmup"], v["steps"], v["checkpoint_every"]) == (
        256,
        16,
        1e-3,
        500,
        10000,
        1000,
    )


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"num_heads": 5}, r"num_heads \(5\) must divide embed_dim \(192\)"),
        ({"seq_len": 512}, r"seq_len \(512\) must be <= max_seq_len \(256\)"),
        ({"steps": 0}, r"steps must be an integer >= 1"),
        ({"device": "tpu"}, r"device: unknown device 'tpu'"),
        ({"threads": 2}, r"unknown model setting\(s\) threads"),
        ({"nproc": 0}, r"^model.nproc must be an integer >= 1 or 'auto', got 0 \(training processes on this node"),
        ({"nproc": "x"}, r"^model.nproc must be an integer >= 1 or 'auto', got 'x'"),
        ({"nproc": 1.5}, r"^model.nproc must be an integer >= 1 or 'auto', got 1.5"),
        ({"nproc": True}, r"^model.nproc must be an integer >= 1 or 'auto', got True"),
        ({"compile": "yes"}, r"^model.compile must be true, false or 'auto', got 'yes'"),
        ({"compile": 1}, r"^model.compile must be true, false or 'auto', got 1"),
    ],
)
def test_settings_reject(settings, message):
    with pytest.raises(UserError, match=message):
        train_stage.ModelSettings.parse(settings, "model")


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"device": "cpu", "nproc": 10_000}, r"^model.nproc \(10000\) is more than batch_size \(16\)"),
        (
            {"device": "cpu", "nproc": (os.cpu_count() or 1) + 1, "batch_size": 10_000},
            rf"^model.nproc \({(os.cpu_count() or 1) + 1}\) is more than the {os.cpu_count() or 1} CPU cores here",
        ),
    ],
)
def test_nproc_beyond_the_machine_is_refused_when_resolved(settings, message):
    s = train_stage.ModelSettings.parse(settings, "model")  # valid as settings; this machine cannot run it
    with pytest.raises(UserError, match=message):
        s.resolved()


def test_nproc_and_compile_enter_the_version_resolved():
    base = train_stage.ModelSettings(device="cpu", compile=False)
    v = base.resolved().version_params()
    assert (v["nproc"], v["compile"]) == (1, False)
    assert train_stage.ModelSettings(device="cpu", nproc="auto", compile=False).resolved().version_params() == v
    assert base.model_copy(update={"compile": True}).resolved().version_params()["compile"] is True


def test_compile_auto_compiles_a_long_run_where_torch_compile_may_run(monkeypatch):
    from mygpt import limits

    fewest = train_stage.COMPILE_FROM_STEPS
    resolved = lambda **s: train_stage.ModelSettings(device="cpu", **s).resolved().version_params()["compile"]  # noqa: E731
    monkeypatch.setattr(limits, "compile_may_run", lambda dev: True)
    assert train_stage.ModelSettings().compile == "auto" and train_stage.ModelSettings().steps >= fewest
    assert resolved() is True, "the chapter's run compiles"
    assert (resolved(steps=fewest), resolved(steps=fewest - 1)) == (True, False)
    assert resolved(steps=fewest - 1, compile=True) is True and resolved(compile=False) is False, "asked for"
    monkeypatch.setattr(limits, "compile_may_run", lambda dev: False)
    assert resolved() is False, "where it cannot run (no C++ compiler on the CPU), auto trains eagerly"
    assert resolved(compile=True) is True, "asked for: the run warns and trains eagerly, as before"
    assert list(train_stage.ModelSettings.model_fields)[:4] == ["device", "precision", "nproc", "compile"]


def test_a_micro_batch_as_large_as_a_process_s_rows_is_unset_in_the_version(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)  # two training processes on the CPU

    def version(**settings) -> dict:
        resolved = train_stage.ModelSettings(device="cpu", batch_size=8, **settings).resolved()
        assert resolved.train_config().micro_batch_size == resolved.micro_batch_size
        return resolved.version_params()

    unset = version()
    assert version(micro_batch_size=8) == unset and version(micro_batch_size=100) == unset, "computes the same"
    assert version(micro_batch_size=7)["micro_batch_size"] == 7
    assert version(nproc=2, micro_batch_size=4) == version(nproc=2), "4 rows per process"
    assert version(nproc=2, micro_batch_size=3)["micro_batch_size"] == 3


def test_bf16_on_a_cpu_without_native_bf16_warns_once(upstream, monkeypatch, caplog):
    import logging

    import mygpt.limits

    monkeypatch.setattr(mygpt.limits, "cpu_lacks_bf16", lambda: True)
    root, _, tokenizer, shards = upstream
    settings = TINY_MODEL.model_copy(
        update={
            "device": "cpu",
            "precision": "bf16",
            "steps": 2,
            "print_every": 1,
            "eval_every": 2,
            "checkpoint_every": 0,
        }
    )
    caplog.set_level(logging.INFO)
    ref = train_stage.train_model.fn(shards, tokenizer, settings, run_in(root))
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "without native bf16" in r.getMessage()]
    assert len(warned) == 1 and "use precision fp32" in warned[0].getMessage()
    manifest = open_store(root).get("model", ref["version"]).manifest
    assert len(manifest["metrics"]["warnings"]) == 1 and "without native bf16" in train_stage.report(manifest)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"lr": float("inf")}, r"^model.lr must be a positive finite number <= 1, got inf \(AdamW peak learning rate"),
        ({"lr": float("nan")}, r"^model.lr must be a positive finite number <= 1, got nan"),
        ({"max_grad_norm": float("inf")}, r"^model.max_grad_norm must be a finite number >= 0 and <= 1e\+06, got inf"),
    ],
)
def test_float_settings_refuse_inf_and_nan(settings, message):
    with pytest.raises(UserError, match=message):
        train_stage.ModelSettings.parse(settings, "model")


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            {"batch_size": 2**20},
            r"^model.batch_size \(1,048,576\) makes training need at least .* activations of "
            r"1,048,576 rows x 256 tokens .*; lower batch_size or seq_len, or set micro_batch_size to fewer "
            r"than the 1,048,576 rows each process runs at once \(e\.g\. 524,288; .*\)$",
        ),
        (
            {"embed_dim": 60_000, "num_heads": 6, "num_layers": 64},
            r"^model: the model's size \([\d,]+ parameters\) makes training need at least .*; lower embed_dim or "
            r"num_layers$",
        ),
    ],
)
def test_a_model_that_cannot_fit_this_machine_is_refused_when_resolved(settings, message):
    s = train_stage.ModelSettings.parse({"device": "cpu", **settings}, "model")  # nothing is allocated
    with pytest.raises(UserError, match=message):
        s.resolved()


def test_a_position_table_too_big_for_the_machine_names_max_seq_len():
    """The pipeline bounds max_seq_len (far below this); the library takes any length and its memory check names
    it, before anything is allocated."""
    from mygpt.gpt_config import GPTConfig
    from mygpt.limits import check_memory

    model = GPTConfig(vocab_size=256, max_seq_len=10**12)
    with pytest.raises(UserError, match=r"^max_seq_len \(1,000,000,000,000\) makes training .*; lower max_seq_len$"):
        check_memory(model, 16, 256, device="cpu")


def test_a_diverging_run_publishes_nothing(upstream, tmp_path):
    """lr=1e30 publishes nothing (no NaN model for later runs to reuse)."""
    import shutil

    root, _, tokenizer, shards = upstream
    art = tmp_path / "art"
    shutil.copytree(root, art, ignore=shutil.ignore_patterns(*NAMES[NAMES.index("model") :]))
    settings = TINY_MODEL.model_copy(update={"lr": 1e30, "steps": 6, "warmup": 0, "checkpoint_every": 2})
    with pytest.raises(UserError, match=r"^training diverged at step \d: the loss is nan .* the likely cause is lr "):
        train_stage.train_model.fn(shards, tokenizer, settings, run_in(art))
    assert not list(art.glob("model/*/model.ckpt")), "nothing published"


_BUILD_IN_A_FRESH_TMPDIR = """
import json, sys
from tasks.model import train_model
from tests.support.tiny import SETTINGS, run_in
shards, tokenizer = json.loads(sys.argv[2]), json.loads(sys.argv[3])
settings = SETTINGS.model.model_copy(update={"steps": 3, "eval_every": 3, "checkpoint_every": 3})
train_model.fn(shards, tokenizer, settings, run_in(sys.argv[1]))
"""


def test_a_model_build_leaves_nothing_in_tmpdir(upstream, tmp_path):
    """The stage keeps torch's TorchInductor cache in the user's cache folder, not TMPDIR (in a fresh process, so
    torch's cache path is not yet set)."""
    import json
    import subprocess
    import sys

    from tests.support import REPO

    root, _, tokenizer, shards = upstream
    tmpdir, home = tmp_path / "tmp", tmp_path / "home"
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir), "XDG_CACHE_HOME": str(home / ".cache")}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    code = [sys.executable, "-c", _BUILD_IN_A_FRESH_TMPDIR, str(root), json.dumps(shards), json.dumps(tokenizer)]
    subprocess.run(code, env=env, cwd=REPO, check=True, capture_output=True, timeout=300)
    assert list(tmpdir.iterdir()) == []
    assert (home / ".cache" / "wiki-pipeline" / "torchinductor").is_dir()
