"""What a training step can run into, on real CPU training: a non-finite loss (NaN and inf alike), an
out-of-memory error, a slow first step (the warm-up, kept out of the throughput), and dropout drawn per rank."""

from __future__ import annotations

import pytest
import torch

from mygpt import GPT, CharTokenizer, TrainConfig, UserError
from mygpt.checkpoint import load_checkpoint_payload
from mygpt.training import clock as clock_mod
from mygpt.training import parallel as parallel_mod
from mygpt.training import train as train_mod
from mygpt.training.guards import FiniteLoss
from mygpt.training.parallel import World
from mygpt.training.train import train
from tests.support.tiny_model import TINY_MODEL, TINY_TRAIN


@pytest.fixture(scope="module")
def data(shakespeare_text):
    text = shakespeare_text[:20_000]
    tok = CharTokenizer.from_text(text)
    ids = tok.encode_array(text)
    return tok, ids[:18_000], ids[18_000:]


def _run(data, world=None, model_cfg=None, **cfg):
    tok, train_ids, val_ids = data
    torch.manual_seed(0)
    model = GPT(tok.vocab_size, **{**TINY_MODEL, **(model_cfg or {})})
    config = TrainConfig(**{**TINY_TRAIN, "seed": 5, **cfg})
    lines: list[str] = []
    result = train(
        model,
        tok,
        train_ids,
        config=config,
        val_tokens=val_ids,
        device="cpu",
        log=lines.append,
        world=world,
    )
    return model, result, lines


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_the_cpu_check_stops_at_an_infinite_loss_as_at_nan(bad):
    watch = FiniteLoss(TrainConfig(lr=1.0), torch.device("cpu"))
    watch.see(1, torch.tensor(2.5))
    with pytest.raises(UserError, match=rf"^training diverged at step 2: the loss is {bad}"):
        watch.see(2, torch.tensor(bad))


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_weights_gone_infinite_are_caught_before_a_save(bad):
    model = torch.nn.Linear(2, 2)
    watch = FiniteLoss(TrainConfig(lr=1.0), torch.device("cpu"))
    watch.check_weights(model, 3)
    with torch.no_grad():
        model.weight[0, 0] = bad
    with pytest.raises(UserError, match=r"^training diverged at step 3: the weights are not finite after it"):
        watch.check_weights(model, 3)


@pytest.mark.parametrize(
    "where, value",
    [(None, 0.0), ("weight", 3.0e38), ("weight", -3.4e38), ("bias", float("nan")), ("weight", float("-inf")),
     ("bias", float("inf"))],
)  # fmt: skip
def test_the_one_pass_weight_check_agrees_with_checking_each_weight(where, value):
    """Largest magnitudes of all parameters at once (NaN and infinities caught, the largest finite floats not)
    give the answer of ``torch.isfinite`` on every parameter."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    if where is not None:
        with torch.no_grad():
            getattr(model[1], where).view(-1)[1] = value
    plain = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    watch = FiniteLoss(TrainConfig(lr=1.0), torch.device("cpu"))
    if plain:
        watch.check_weights(model, 4)
    else:
        with pytest.raises(UserError, match="the weights are not finite after it"):
            watch.check_weights(model, 4)
    assert plain == (where is None or abs(value) < float("inf"))


def test_a_run_whose_loss_turns_infinite_saves_nothing_from_that_step_on(data, monkeypatch, tmp_path):
    real = train_mod.forward_backward
    calls = []

    def infinite_at_step_4(*args, **kwargs):
        calls.append(1)
        loss = real(*args, **kwargs)
        return loss + float("inf") if len(calls) == 4 else loss

    monkeypatch.setattr(train_mod, "forward_backward", infinite_at_step_4)
    tok, train_ids, _ = data
    model = GPT(tok.vocab_size, **TINY_MODEL)
    ckpt = tmp_path / "train.ckpt"
    config = TrainConfig(**{**TINY_TRAIN, "steps": 8, "checkpoint_every": 1, "print_every": 0})
    with pytest.raises(UserError, match=r"^training diverged at step 4: the loss is inf "):
        train(model, tok, train_ids, config=config, device="cpu", checkpoint_path=ckpt, log=None)
    assert load_checkpoint_payload(ckpt)["resume"]["step"] == 3


def test_running_out_of_memory_names_the_batch_settings_and_the_micro_batch_knob(data, monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)")

    monkeypatch.setattr(train_mod, "forward_backward", out_of_memory)
    with pytest.raises(UserError) as e:
        _run(data, steps=3)
    assert str(e.value) == (
        "cpu ran out of memory at step 1 (CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)) "
        "with batch_size 4, seq_len 32, micro_batch_size 0 (4 rows per forward pass in this process): set "
        "micro_batch_size to fewer than the 4 rows each process runs at once (e.g. 2; gradients are accumulated, "
        "the step is the same up to float rounding), or lower batch_size or seq_len"
    )


def test_running_out_of_memory_in_validation_is_the_same_error(data, monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.50 GiB")

    monkeypatch.setattr(parallel_mod, "summed_nats", out_of_memory)  # validation's forward passes, not training's
    with pytest.raises(UserError) as e:
        _run(data, steps=4, print_every=0, eval_every=2, micro_batch_size=2)
    assert str(e.value) == (
        "cpu ran out of memory in the validation after step 2 (CUDA out of memory. Tried to allocate 12.50 GiB) "
        "with batch_size 4, seq_len 32, micro_batch_size 2 (2 rows per forward pass in this process): set "
        "micro_batch_size to fewer than the 2 rows each process runs at once (e.g. 1; gradients are accumulated, "
        "the step is the same up to float rounding), or lower batch_size or seq_len"
    )


def test_throughput_leaves_the_slow_first_step_out_and_reports_it_on_its_own_line(data, monkeypatch):
    """A fake clock: the first step takes 100 s, every other 1 s, nothing else any time."""
    now = [0.0]
    monkeypatch.setattr(clock_mod, "perf_counter", lambda: now[0])
    real = train_mod.forward_backward

    def timed(*args, **kwargs):
        now[0] += 100.0 if now[0] == 0.0 else 1.0
        return real(*args, **kwargs)

    monkeypatch.setattr(train_mod, "forward_backward", timed)
    _model, result, lines = _run(data, steps=10, print_every=3)
    tokens_per_step = TINY_TRAIN["batch_size"] * TINY_TRAIN["seq_len"]
    assert result.warmup_seconds == 100.0
    assert result.tokens_per_sec == tokens_per_step  # 9 steps in 9 s
    assert [h["tokens_per_sec"] for h in result.history] == [tokens_per_step / 100.0] + [tokens_per_step] * 4
    warm = [line for line in lines if line.startswith("warm-up: ")]
    assert warm == [
        "warm-up: step 1 took 100.00 s (device setup and first allocations), left out of the throughput below"
    ]
    (line,) = [line for line in lines if line.startswith("throughput: ")]
    assert line.startswith(
        f"throughput: {tokens_per_step:,} tokens/s over steps 2-10 (warm-up, validation and checkpoints left out), "
    )


def test_one_and_two_step_runs_say_what_their_throughput_covers(data):
    _model, result, lines = _run(data, steps=1)
    assert result.warmup_seconds is None and result.tokens_per_sec > 0
    (line,) = [line for line in lines if line.startswith("throughput: ")]
    assert " tokens/s over step 1 (its only step: warm-up included), " in line
    _model, result, lines = _run(data, steps=2)
    assert result.warmup_seconds is not None
    (line,) = [line for line in lines if line.startswith("throughput: ")]
    assert " tokens/s over step 2 (warm-up, validation and checkpoints left out), " in line, "not 'steps 2-2'"


def test_each_rank_draws_its_own_dropout_masks(data):
    """Rank 1 of a world trains with other dropout masks than rank 0 on the same rows; without dropout the two
    are the same run (a one-process world stands for each rank, so no process group is needed)."""
    weights = {}
    for dropout in (0.0, 0.2):
        for rank in (0, 1):
            model, _result, _lines = _run(data, world=World(rank=rank, size=1), model_cfg={"dropout": dropout}, steps=3)
            weights[dropout, rank] = model.state_dict()
    same = weights[0.0, 0], weights[0.0, 1]
    assert all(torch.equal(same[0][k], same[1][k]) for k in same[0])
    other = weights[0.2, 0], weights[0.2, 1]
    assert not all(torch.equal(other[0][k], other[1][k]) for k in other[0])


def test_a_resume_with_another_process_count_gives_each_rank_its_own_dropout_stream():
    """A checkpoint of one process (no per-rank states) or of three, resumed by two: rank 0 continues the saved
    stream, rank 1 starts from seed + 1 as a fresh run's rank 1 would, never rank 0's saved state."""
    from mygpt.training.rng import capture_rng, rank_rng, restore_rng

    cpu, gen = torch.device("cpu"), torch.Generator().manual_seed(5)
    torch.manual_seed(123)
    torch.rand(7)
    main_next = torch.get_rng_state()
    for three in (False, True):
        torch.set_rng_state(main_next)
        saved = capture_rng(gen, cpu, [rank_rng(cpu)] * 3 if three else None)
        torch.manual_seed(999)
        restore_rng(saved, gen, cpu, World(rank=0, size=2), seed=5)
        assert torch.equal(torch.get_rng_state(), main_next), "rank 0: the saved stream"
        rank0 = torch.rand(4)
        restore_rng(saved, gen, cpu, World(rank=1, size=2), seed=5)
        rank1 = torch.rand(4)
        assert torch.equal(rank1, torch.rand(4, generator=torch.Generator().manual_seed(6))), "seed + rank"
        assert not torch.equal(rank0, rank1)
