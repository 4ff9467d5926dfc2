"""Training options: torch.compile (equal to eager; a warning where unavailable), the bf16-on-CPU warning,
micro-batches, and the numbers in the result, progress dicts and log."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mygpt import GPT, CharTokenizer, TrainConfig
from mygpt.device import compile_unavailable
from mygpt.training.data import get_batch
from mygpt.training.parallel import World, evaluate
from mygpt.training.train import train
from tests.support.tiny_model import TINY_MODEL, TINY_TRAIN


@pytest.fixture(scope="module")
def data(shakespeare_text):
    text = shakespeare_text[:40_000]
    tok = CharTokenizer.from_text(text)
    ids = tok.encode_array(text)
    return tok, ids[:36_000], ids[36_000:]


def _run(data, log=None, on_progress=None, **cfg):
    tok, train_ids, val_ids = data
    torch.manual_seed(0)
    model = GPT(tok.vocab_size, **TINY_MODEL)
    config = TrainConfig(**{**TINY_TRAIN, "seed": 5, **cfg})
    result = train(
        model, tok, train_ids, config=config, val_tokens=val_ids, device="cpu", log=log, on_progress=on_progress
    )
    return model, result


def test_compile_matches_eager_after_20_steps(data):
    reason = compile_unavailable("cpu")
    if reason:
        pytest.skip(f"torch.compile cannot run on this machine: {reason}")
    eager_model, eager = _run(data)
    compiled_model, compiled = _run(data, compile=True)
    assert compiled.compiled and not eager.compiled and not compiled.warnings
    assert abs(compiled.final_loss - eager.final_loss) < 1e-4, (compiled.final_loss, eager.final_loss)
    for a, b in zip(eager.history, compiled.history):
        assert abs(a["loss"] - b["loss"]) < 1e-4 and abs(a["val_loss"] - b["val_loss"]) < 1e-4
    # the checkpointable module is the plain one (no "_orig_mod." prefixes) and it was trained
    assert compiled_model.state_dict().keys() == eager_model.state_dict().keys()


def test_compile_unavailable_warns_and_trains_eagerly(data, monkeypatch):
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config.cpp, "cxx", (None, "/nonexistent/c++"))
    assert "no C++ compiler" in compile_unavailable("cpu")
    lines = []
    _, result = _run(data, log=lines.append, steps=3, compile=True)
    assert not result.compiled and result.steps == 3 and math.isfinite(result.final_loss)
    warned = [line for line in lines if line.startswith("warning: compile=True, but torch.compile is unavailable")]
    assert len(warned) == 1 and result.warnings == [warned[0][len("warning: ") :]]


@pytest.mark.parametrize("native", [False, True])
def test_explicit_bf16_on_a_cpu_without_native_bf16_warns_once(data, monkeypatch, native):
    monkeypatch.setattr("mygpt.limits.cpu_lacks_bf16", lambda: not native)
    lines = []
    _, result = _run(data, log=lines.append, steps=6, print_every=2, precision="bf16")
    assert result.precision == "bf16" and math.isfinite(result.final_loss)
    warned = [line for line in lines if "bf16" in line and line.startswith("warning:")]
    if native:
        assert warned == [] and result.warnings == []
    else:
        assert len(warned) == 1 and len(result.warnings) == 1, lines
        assert "fp32" in warned[0] and "10x faster" in warned[0] and "precision fp32" in warned[0]
    _, auto = _run(data, log=lines.append, steps=1, precision="auto")  # auto picks fp32 on CPU: nothing to say
    assert auto.precision == "fp32" and auto.warnings == []


def test_micro_batches_give_the_same_training(data):
    whole_model, whole = _run(data, max_grad_norm=1.0)
    micro_model, micro = _run(data, max_grad_norm=1.0, micro_batch_size=3)  # rows 3 + 1
    for a, b in zip(whole.history, micro.history):
        assert abs(a["loss"] - b["loss"]) < 1e-5 and abs(a["val_loss"] - b["val_loss"]) < 1e-5
    for k, v in whole_model.state_dict().items():
        assert (v - micro_model.state_dict()[k]).abs().max() < 1e-5, k


def _rows_per_forward(model, grad: bool) -> list[int]:
    """The batch rows of every forward pass of ``model`` with gradients on (``grad``) or off, as they happen."""
    seen: list[int] = []
    model.register_forward_hook(
        lambda _m, args, _out: seen.append(args[0].size(0)) if torch.is_grad_enabled() == grad else None
    )
    return seen


def test_validation_runs_in_the_training_micro_batches(data):
    tok, train_ids, val_ids = data
    torch.manual_seed(0)
    model = GPT(tok.vocab_size, **TINY_MODEL)
    evaluated = _rows_per_forward(model, grad=False)
    config = TrainConfig(**{**TINY_TRAIN, "steps": 4, "print_every": 0, "eval_every": 2, "micro_batch_size": 3})
    result = train(model, tok, train_ids, config=config, val_tokens=val_ids, device="cpu", log=None)
    assert len(result.history) == 2 and all("val_loss" in h for h in result.history)
    assert evaluated == [3, 1] * TINY_TRAIN["eval_batches"] * 2  # 4 rows as 3 + 1, like the training steps


def test_validation_in_micro_batches_equals_one_forward_per_batch(data):
    """Unset (or as large as the batch), validation is the single forward per batch it always was, to the bit;
    in micro-batches only the order of the sums changes."""
    tok, _, val_ids = data
    torch.manual_seed(0)
    model = GPT(tok.vocab_size, **TINY_MODEL)
    args = dict(batch_size=8, seq_len=32, batches=3, seed=7, device=torch.device("cpu"), precision="fp32")
    gen, nats = torch.Generator().manual_seed(7), 0.0
    with torch.no_grad():
        for _ in range(3):
            x, y = get_batch(val_ids, 8, 32, gen, torch.device("cpu"))
            logits, _ = model.eval()(x)
            nats += F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1), reduction="sum").item()
    one_forward = nats / (3 * 8 * 32)

    def loss(micro: int) -> float:
        return evaluate(model, val_ids, world=World(), micro_batch_size=micro, **args)[0]

    assert loss(0) == one_forward and loss(8) == one_forward and loss(100) == one_forward
    rows = _rows_per_forward(model, grad=False)
    for micro in (1, 3):
        rows.clear()
        assert math.isclose(loss(micro), one_forward, rel_tol=1e-6), micro
        assert max(rows) == micro and sum(rows) == 3 * 8


def test_result_progress_and_log_carry_the_numbers(data):
    lines, progress = [], []
    _model, result = _run(data, log=lines.append, on_progress=progress.append)
    assert result.tokens_per_sec > 0 and result.flops_per_token > 0 and result.world_size == 1
    assert result.tflops == pytest.approx(result.tokens_per_sec * result.flops_per_token / 1e12)
    assert result.mfu is None and result.peak_tflops is None  # CPU: no peak
    assert result.final_val_bpb == result.history[-1]["val_bpb"] > 0
    assert all(p["steps"] == 20 and p["tflops"] > 0 and p["mfu"] is None and p["val_bpb"] > 0 for p in progress)
    throughput_lines = [line for line in lines if line.startswith("throughput: ")]
    assert len(throughput_lines) == 1 and "MFU n/a" in throughput_lines[0]
    assert f"{result.flops_per_token:,} FLOPs/token (6N + 12*L*H*Q*T)" in throughput_lines[0]
    assert all(" val_bpb = " in line for line in lines if line.startswith("step "))
    assert "val_bpb" in result.to_dict()["history"][0]


def test_torch_threads_sets_and_restores_the_thread_count():
    import torch

    from mygpt.device import torch_threads

    before = torch.get_num_threads()
    other = 2 if before == 1 else 1
    with torch_threads(other):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before
    with torch_threads(None):  # None: torch's own count, untouched
        assert torch.get_num_threads() == before
    assert torch.get_num_threads() == before
