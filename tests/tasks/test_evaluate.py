"""The evaluate stage: the model's loss and bits per byte on the test split, published with its report, in the
run summary's headline and the model comparison."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from flows.reports import comparison, headline, joined_columns
from mygpt.checkpoint import load_checkpoint
from mygpt.heldout import heldout_loss
from tasks import evaluate as evaluate_stage
from tasks.core import shard_format
from tasks.registry import BY_NAME, open_store
from tests.support.tiny import SETTINGS, run_in


def evaluate(upstream, trained, **settings):
    if "max_tokens" in settings:  # the tiny preset bounds max_bytes instead: one bound at a time
        settings.setdefault("max_bytes", None)
    root, corpus, _, shards = upstream
    return evaluate_stage.evaluate_model.fn(
        corpus, shards, trained, SETTINGS.evaluate.model_copy(update=settings), run_in(root)
    )


def test_evaluate_measures_the_test_split_and_is_reused(upstream, trained):
    root, corpus, _, shards = upstream
    ref = evaluate(upstream, trained, max_tokens=None)
    info = open_store(root).get("evaluate", ref["version"])
    m = json.loads((Path(info.path) / "evaluate.json").read_text())
    assert m == {k: info.manifest["metrics"][k] for k in m}
    test_ids = np.concatenate([shard_format.read_shard(p) for p in shard_format.shard_paths(shards["path"], "test")])
    text_bytes = (Path(corpus["path"]) / "wiki.test.txt").stat().st_size
    assert m["test_tokens"] == len(test_ids) and m["tokens_evaluated"] == len(test_ids) - 1
    assert m["tokens_per_byte"] == round(len(test_ids) / text_bytes, 6) and 0 < m["tokens_per_byte"] < 1
    gpt, tok = load_checkpoint(Path(trained["path"]) / "model.ckpt")
    want = heldout_loss(gpt, test_ids, tok.token_bytes(), gpt.max_seq_len)
    assert math.isclose(m["test_bpb"], want.bpb, rel_tol=1e-5) and math.isclose(m["test_loss"], want.loss, rel_tol=1e-5)
    assert m["seq_len"] == gpt.max_seq_len and m["windows"] == math.ceil((len(test_ids) - 1) / gpt.max_seq_len)
    assert info.manifest["inputs"].keys() == {"corpus", "shards", "model"}
    again = evaluate(upstream, trained, max_tokens=None)
    assert again["build_id"] == ref["build_id"], "reused"

    capped = evaluate(upstream, trained, max_tokens=100)
    mc = open_store(root).get("evaluate", capped["version"]).manifest["metrics"]
    assert capped["version"] != ref["version"] and mc["tokens_evaluated"] == 99 and mc["test_tokens"] == len(test_ids)


def test_the_report_headline_and_model_comparison_show_test_bits_per_byte(upstream, trained):
    root = upstream[0]
    ref = evaluate(upstream, trained)
    store = open_store(root)
    info = store.get("evaluate", ref["version"])
    bpb = f"{info.manifest['metrics']['test_bpb']:.4f}"
    md = evaluate_stage.report({**info.manifest, "path": str(info.path)})
    assert "| test bits per byte | " + bpb in md and "evaluate.json" in md
    assert headline("evaluate", info.manifest["metrics"]).startswith(f"test {bpb} bits/byte")
    models = store.versions("model")
    table = comparison(BY_NAME["model"], models, {}, joined_columns(store, "model"))
    header = next(line for line in table.splitlines() if line.startswith("| version"))
    assert "| test bits/byte |" in header
    latest = [v for v in store.versions("evaluate") if v.manifest["inputs"]["model"]["version"] == trained["version"]]
    row = next(line for line in table.splitlines() if trained["version"] in line)
    cell = [c.strip() for c in row.split("|")][[c.strip() for c in header.split("|")].index("test bits/byte")]
    assert cell == f"{latest[-1].manifest['metrics']['test_bpb']:.4f}", "the latest evaluation of that model"
    tokens = [c.strip() for c in row.split("|")][[c.strip() for c in header.split("|")].index("test tokens")]
    assert tokens == f"{latest[-1].manifest['metrics']['tokens_evaluated']:,}", "how much that number measured"


def test_a_model_trained_on_the_test_split_is_marked_so(upstream, trained, tmp_path):
    import shutil

    root, corpus, _, shards = upstream
    seen = tmp_path / "model"  # the tiny model, its manifest saying it trained on all three splits
    shutil.copytree(trained["path"], seen)
    manifest = json.loads((seen / "manifest.json").read_text())
    manifest["settings"]["train_splits"] = "all"
    (seen / "manifest.json").write_text(json.dumps(manifest))

    class Ctx:
        out, run, log = tmp_path / "out", run_in(root), __import__("logging").getLogger("test")
        store, inputs = open_store(root), {"corpus": corpus}  # the corpus's splits: its manifest's

        def progress(self, *args, **kwargs):
            pass

    Ctx.out.mkdir()
    m = evaluate_stage.build_evaluate(
        Ctx(), SETTINGS.evaluate.resolved(), Path(corpus["path"]), Path(shards["path"]), seen
    )
    assert m["trained_on_test"] is True
    assert "(trained on it)" in headline("evaluate", m)
    assert "the test split included" in evaluate_stage.report({"version": "v", "metrics": m})


def test_a_test_split_of_fewer_than_two_tokens_is_refused_not_a_nan(upstream, trained, tmp_path):
    import shutil

    import pytest

    from mygpt.errors import UserError

    root, corpus, _, shards = upstream
    empty = tmp_path / "shards"
    shutil.copytree(shards["path"], empty)
    paths = shard_format.shard_paths(empty, "test")
    dtype = shard_format.read_shard(paths[0]).dtype
    for path in paths:
        path.unlink()
    shard_format.write_shard(paths[0], np.array([7], dtype=dtype))  # a test split of one token

    class Ctx:
        out, run, log = tmp_path / "out", run_in(root), __import__("logging").getLogger("test")
        store, inputs = open_store(root), {"corpus": corpus}  # the corpus's splits: its manifest's

        def progress(self, *args, **kwargs):
            pass

    Ctx.out.mkdir()
    with pytest.raises(UserError, match="evaluating needs at least 2"):
        evaluate_stage.build_evaluate(
            Ctx(), SETTINGS.evaluate.resolved(), Path(corpus["path"]), empty, Path(trained["path"])
        )
    assert not list(Ctx.out.iterdir()), "nothing written"
    with pytest.raises(UserError, match="at least 2"):
        gpt, tok = load_checkpoint(Path(trained["path"]) / "model.ckpt")
        heldout_loss(gpt, np.array([5]), tok.token_bytes(), 8)


def test_a_forward_pass_evaluates_no_more_tokens_than_one_of_the_models_training_passes():
    windows_per_pass = evaluate_stage.windows_per_pass
    assert windows_per_pass({"batch_size": 64, "seq_len": 1024, "nproc": 1}, 1024) == 8  # the most at once
    assert windows_per_pass({"batch_size": 64, "seq_len": 1024, "micro_batch_size": 2}, 1024) == 2
    assert windows_per_pass({"batch_size": 8, "seq_len": 256, "nproc": 2}, 256) == 4  # a process's share
    assert windows_per_pass({"batch_size": 5, "seq_len": 64, "nproc": 2}, 256) == 1  # 3 rows of 64: one window
    assert windows_per_pass({"batch_size": 64, "seq_len": 128, "micro_batch_size": 8}, 256) == 4


def test_running_out_of_memory_is_one_error_naming_the_forward_pass(upstream, trained, monkeypatch):
    import pytest
    import torch

    import mygpt.heldout
    from mygpt.errors import UserError

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")

    monkeypatch.setattr(mygpt.heldout, "heldout_loss", out_of_memory)
    with pytest.raises(UserError) as e:
        evaluate(upstream, trained, max_tokens=321)
    assert str(e.value) == (
        "evaluate: cpu ran out of memory (CUDA out of memory. Tried to allocate 3.00 GiB) with 8 window(s) of 32 "
        "tokens per forward pass (no more tokens than one of the model's training passes): free the device's memory "
        "(other processes) or set evaluate.device to cpu"
    )


def test_one_bound_of_the_text_at_a_time():
    import pytest

    from mygpt.errors import UserError

    with pytest.raises(UserError, match=r"^evaluate: max_tokens=10 and max_bytes=20 both bound the text evaluated"):
        evaluate_stage.EvaluateSettings.parse({"max_tokens": 10, "max_bytes": 20}, "evaluate")
    assert "max_bytes" not in evaluate_stage.EvaluateSettings().version_params()


def test_a_max_bytes_too_small_for_two_tokens_is_refused_once_the_shards_are_built(upstream, trained, tmp_path):
    """The early check (run by the flow after the shards stage, before the model trains) names the least
    ``evaluate.max_bytes`` that works: that value evaluates, one byte less is what evaluate itself refuses. The
    test split here starts with the tokenizer's two longest tokens (a copy of the shards, the tokenizer beside)."""
    import logging
    import shutil

    import pytest

    from mygpt.errors import UserError
    from tasks.tokenizer import load_tokenizer

    root, corpus, tokenizer, shards = upstream
    sizes = np.array(load_tokenizer(tokenizer["path"]).token_bytes())
    longest = np.argsort(sizes, kind="stable")[-2:]
    least = int(sizes[longest].sum())
    copy = tmp_path / "shards" / shards["version"]
    shutil.copytree(shards["path"], copy)
    (tmp_path / "tokenizer").symlink_to(Path(tokenizer["path"]).parent)
    paths = shard_format.shard_paths(copy, "test")
    ids = shard_format.read_shard(paths[0])
    for path in paths:
        path.unlink()
    shard_format.write_shard(paths[0], np.concatenate([longest, ids]).astype(ids.dtype))
    ref = {**shards, "path": str(copy)}

    def bounded(n: int):
        return SETTINGS.evaluate.model_copy(update={"max_bytes": n}).resolved()

    with pytest.raises(UserError) as refused:
        evaluate_stage.check_bytes(bounded(least - 1), ref)
    assert str(refused.value).startswith(f"evaluate.max_bytes={least - 1:,} keeps 1 token(s) of the test split")
    assert f"set evaluate.max_bytes to {least:,} or more" in str(refused.value)
    assert evaluate_stage.check_bytes(bounded(least), ref) == []

    class Ctx:
        out, run, log = tmp_path / "out", run_in(root), logging.getLogger("test")
        store, inputs = open_store(root), {"corpus": corpus}  # the corpus's splits: its manifest's

        def progress(self, *args, **kwargs):
            pass

    Ctx.out.mkdir()
    metrics = evaluate_stage.build_evaluate(Ctx(), bounded(least), Path(corpus["path"]), copy, Path(trained["path"]))
    assert metrics["tokens_evaluated"] == 1
    with pytest.raises(UserError, match="evaluating needs at least 2"):
        evaluate_stage.build_evaluate(Ctx(), bounded(least - 1), Path(corpus["path"]), copy, Path(trained["path"]))
    assert BY_NAME["evaluate"].early_check == ("shards", evaluate_stage.check_bytes)


def test_a_max_bytes_below_two_is_refused_before_any_stage():
    import pytest

    from flows.settings import TINY, Pipeline
    from mygpt.errors import UserError

    with pytest.raises(UserError, match=r"^evaluate\.max_bytes must be an integer >= 2 \(or null\), got 1"):
        Pipeline.parse(**{**TINY, "evaluate": {"max_bytes": 1}})
