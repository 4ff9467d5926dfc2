"""Training loop: schedule, batches, a real run on Tiny Shakespeare, exact resume, input validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mygpt import GPT, CharTokenizer, TrainConfig, UserError
from mygpt.checkpoint import load_checkpoint_payload
from mygpt.training.data import get_batch
from mygpt.training.train import train
from tests.support.tiny_model import TINY_MODEL, TINY_TRAIN


class WindowOnly:
    """An array-like that only allows length and slicing: proves get_batch never reads the corpus whole."""

    def __init__(self, arr):
        self.arr = arr
        self.shape = arr.shape
        self.slices = 0

    def __len__(self):
        return len(self.arr)

    def __getitem__(self, key):
        assert isinstance(key, slice) and key.stop - key.start <= 65
        self.slices += 1
        return self.arr[key]

    def __iter__(self):
        raise AssertionError("get_batch iterated over the whole corpus")

    def __array__(self, *args, **kwargs):
        raise AssertionError("get_batch converted the whole corpus")


def test_get_batch_from_memmap(tmp_path):
    data = np.arange(1000, dtype=np.uint16)
    path = tmp_path / "tokens.bin"
    data.tofile(path)
    mm = np.memmap(path, dtype=np.uint16, mode="r")
    x, y = get_batch(mm, 8, 64, torch.Generator().manual_seed(0), "cpu")
    assert x.shape == y.shape == (8, 64) and x.dtype == y.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row in range(8):  # each row is a real window of the corpus (values are their own offsets)
        start = x[row, 0].item()
        assert 0 <= start <= 1000 - 65
        assert x[row].tolist() == list(range(start, start + 64)) and y[row, -1].item() == start + 64
    x2, _ = get_batch(mm, 8, 64, torch.Generator().manual_seed(0), "cpu")
    assert torch.equal(x, x2)
    spy = WindowOnly(data)
    x3, _ = get_batch(spy, 8, 64, torch.Generator().manual_seed(0), "cpu")
    assert torch.equal(x, x3) and spy.slices == 8
    xt, _ = get_batch(torch.from_numpy(data.astype(np.int64)), 8, 64, torch.Generator().manual_seed(0), "cpu")
    assert torch.equal(x, xt)
    with pytest.raises(UserError, match="fewer than one window"):
        get_batch(data[:64], 1, 64, torch.Generator(), "cpu")


@pytest.fixture(scope="module")
def shakespeare_tokens(shakespeare_text, tmp_path_factory):
    tok = CharTokenizer.from_text(shakespeare_text)
    ids = tok.encode_array(shakespeare_text)
    path = tmp_path_factory.mktemp("tokens") / "shakespeare.u16"
    ids.tofile(path)
    mm = np.memmap(path, dtype=np.uint16, mode="r")
    n_val = len(mm) // 10
    return tok, mm[:-n_val], mm[-n_val:]


def test_short_run_drives_validation_loss_down(shakespeare_tokens, tmp_path):
    tok, train_mm, val_mm = shakespeare_tokens
    torch.manual_seed(0)
    model = GPT(vocab_size=tok.vocab_size)
    progress, lines = [], []
    cfg = TrainConfig(
        steps=120,
        batch_size=16,
        seq_len=64,
        lr=3e-3,
        schedule="cosine",
        warmup=10,
        max_grad_norm=1.0,
        print_every=40,
        eval_batches=4,
    )
    result = train(
        model,
        tok,
        train_mm,
        config=cfg,
        val_tokens=val_mm,
        device="cpu",
        checkpoint_path=tmp_path / "m.ckpt",
        log=lines.append,
        on_progress=progress.append,
    )
    assert [p["step"] for p in progress] == [1, 40, 80, 120]
    first_val = progress[0]["val_loss"]
    assert abs(first_val - math.log(65)) < 0.3  # starts near ln(vocab)
    assert result.final_val_loss < 2.8, result.history
    assert result.final_val_loss == progress[-1]["val_loss"]
    assert result.steps == 120 and result.start_step == 0 and result.device == "cpu"
    assert result.precision == "fp32" and result.params == 207_296
    assert result.tokens_per_sec > 0 and all(p["tokens_per_sec"] > 0 for p in progress)
    assert lines[0].startswith("step 1: loss = ") and " lr = " in lines[0] and " val_loss = " in lines[0]
    assert lines[-1] == f"saved checkpoint to {tmp_path / 'm.ckpt'}"
    payload = load_checkpoint_payload(tmp_path / "m.ckpt")
    assert payload["resume"]["step"] == 120
    assert len(payload["resume"]["history"]) == 4


def _tiny_setup(text, seed):
    tok = CharTokenizer.from_text(text)
    torch.manual_seed(seed)
    model = GPT(vocab_size=tok.vocab_size, **{**TINY_MODEL, "num_layers": 2, "dropout": 0.1})
    return tok, model


RESUME_CFG = dict(
    TINY_TRAIN, lr=2e-3, schedule="cosine", warmup=5, max_grad_norm=0.5, eval_every=5, checkpoint_every=10, seed=7
)


class Stop(Exception):
    pass


def test_resume_is_bit_identical(shakespeare_text, tmp_path):
    text = shakespeare_text[:50_000]
    tok, _ = _tiny_setup(text, 0)
    ids = tok.encode_array(text)
    train_ids, val_ids = ids[:45_000], ids[45_000:]
    cfg = TrainConfig(**RESUME_CFG)

    # uninterrupted run
    _, straight = _tiny_setup(text, 0)
    res_a = train(
        straight,
        tok,
        train_ids,
        config=cfg,
        val_tokens=val_ids,
        device="cpu",
        checkpoint_path=tmp_path / "a.ckpt",
        log=None,
    )

    # run killed right after its step-10 checkpoint
    def stop_at_10(step, path):
        if step == 10:
            raise Stop

    _, first = _tiny_setup(text, 0)
    with pytest.raises(Stop):
        train(
            first,
            tok,
            train_ids,
            config=cfg,
            val_tokens=val_ids,
            device="cpu",
            checkpoint_path=tmp_path / "b.ckpt",
            log=None,
            on_checkpoint=stop_at_10,
        )
    payload = load_checkpoint_payload(tmp_path / "b.ckpt")
    assert payload["resume"]["step"] == 10
    assert torch.equal(payload["model_state_dict"]["token_embedding.weight"], first.token_embedding.weight)

    # resume in a fresh model with different init, after disturbing every global RNG
    _, resumed = _tiny_setup(text, 123)
    torch.manual_seed(999)
    np.random.seed(999)
    logs = []
    res_b = train(
        resumed,
        tok,
        train_ids,
        config=cfg,
        val_tokens=val_ids,
        device="cpu",
        checkpoint_path=tmp_path / "b.ckpt",
        log=logs.append,
    )
    assert logs[0] == f"resuming from {tmp_path / 'b.ckpt'} at step 10"
    assert res_b.start_step == 10 and res_a.start_step == 0

    sa, sb = straight.state_dict(), resumed.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    assert res_a.final_loss == res_b.final_loss
    strip = lambda hs: [{k: v for k, v in h.items() if k != "tokens_per_sec"} for h in hs]  # noqa: E731
    assert strip(res_a.history) == strip(res_b.history)
    # optimizer state identical too
    oa = load_checkpoint_payload(tmp_path / "a.ckpt")["resume"]["optimizer"]["state"]
    ob = load_checkpoint_payload(tmp_path / "b.ckpt")["resume"]["optimizer"]["state"]
    for i in oa:
        assert torch.equal(oa[i]["exp_avg"], ob[i]["exp_avg"])

    # sensitivity check: the same resume with the batch generator's state lost ends elsewhere
    payload["resume"]["rng"]["generator"] = torch.Generator().manual_seed(0).get_state()
    torch.save(payload, tmp_path / "c.ckpt")
    _, broken = _tiny_setup(text, 0)
    train(
        broken,
        tok,
        train_ids,
        config=cfg,
        val_tokens=val_ids,
        device="cpu",
        checkpoint_path=tmp_path / "c.ckpt",
        log=None,
    )
    assert not torch.equal(sa["token_embedding.weight"], broken.state_dict()["token_embedding.weight"])


def test_resume_refuses_different_settings(shakespeare_text, tmp_path):
    text = shakespeare_text[:20_000]
    tok, model = _tiny_setup(text, 0)
    ids = tok.encode_array(text)
    cfg = TrainConfig(**{**RESUME_CFG, "steps": 5, "checkpoint_every": 0})
    train(model, tok, ids, config=cfg, device="cpu", checkpoint_path=tmp_path / "c.ckpt", log=None)
    _, model2 = _tiny_setup(text, 0)
    with pytest.raises(UserError, match="lr"):
        train(
            model2,
            tok,
            ids,
            config=TrainConfig(**{**RESUME_CFG, "steps": 8, "lr": 1e-2}),
            device="cpu",
            checkpoint_path=tmp_path / "c.ckpt",
            log=None,
        )
    other = GPT(vocab_size=tok.vocab_size, embed_dim=32, num_heads=4, num_layers=2, max_seq_len=32)
    with pytest.raises(UserError, match="num_kv_heads"):
        train(other, tok, ids, config=cfg, device="cpu", checkpoint_path=tmp_path / "c.ckpt", log=None)
    # same settings and more steps: continues; resume=False: starts over
    res = train(
        model2,
        tok,
        ids,
        config=TrainConfig(**{**RESUME_CFG, "steps": 7}),
        device="cpu",
        checkpoint_path=tmp_path / "c.ckpt",
        log=None,
    )
    assert res.start_step == 5 and res.steps == 7
    res = train(model2, tok, ids, config=cfg, device="cpu", checkpoint_path=tmp_path / "c.ckpt", resume=False, log=None)
    assert res.start_step == 0


def test_input_validation(shakespeare_text):
    text = shakespeare_text[:5000]
    tok = CharTokenizer.from_text(text)
    ids = tok.encode_array(text)
    model = GPT(vocab_size=tok.vocab_size, embed_dim=16, num_heads=2, num_layers=1, max_seq_len=32)
    with pytest.raises(UserError, match=r"seq_len \(64\).*max_seq_len \(32\)"):
        train(model, tok, ids, config=TrainConfig(seq_len=64, steps=1), device="cpu", log=None)
    with pytest.raises(UserError, match=r"20 tokens.*seq_len \+ 1 = 33"):
        train(model, tok, ids[:20], config=TrainConfig(seq_len=32, steps=1), device="cpu", log=None)
    with pytest.raises(UserError, match="validation split has 10 tokens"):
        train(model, tok, ids, config=TrainConfig(seq_len=32, steps=1), val_tokens=ids[:10], device="cpu", log=None)
    with pytest.raises(UserError, match="schedule"):
        train(model, tok, ids, config=TrainConfig(seq_len=32, schedule="linear"), device="cpu", log=None)
    with pytest.raises(UserError, match="steps"):
        train(model, tok, ids, config=TrainConfig(seq_len=32, steps=0), device="cpu", log=None)
    with pytest.raises(UserError, match="device"):
        train(model, tok, ids, config=TrainConfig(seq_len=32, steps=1), device="tpu", log=None)
    with pytest.raises(UserError, match="vocab_size"):
        train(
            GPT(vocab_size=99, embed_dim=16, num_heads=2, num_layers=1, max_seq_len=32),
            tok,
            ids,
            config=TrainConfig(seq_len=32, steps=1),
            device="cpu",
            log=None,
        )


def test_concat_tokens_slices_across_parts():
    from mygpt.training.data import ConcatTokens

    c = ConcatTokens([np.arange(0, 5), np.arange(5, 5), np.arange(5, 12)])
    assert len(c) == 12 and c.shape == (12,)
    for lo in range(12):
        for hi in range(lo + 1, 13):
            assert np.array_equal(c[lo:hi], np.arange(lo, hi))


def test_a_diverging_run_stops_at_the_first_non_finite_loss_and_saves_nothing_after(shakespeare_text, tmp_path):
    """lr=1e30 stops at the first NaN loss and saves no NaN model."""
    text = shakespeare_text[:5000]
    tok = CharTokenizer.from_text(text)
    ids = tok.encode_array(text)
    model = GPT(vocab_size=tok.vocab_size, embed_dim=16, num_heads=2, num_layers=1, max_seq_len=32)
    ckpt = tmp_path / "train.ckpt"
    config = TrainConfig(seq_len=32, steps=50, lr=1e30, checkpoint_every=1, print_every=0, max_grad_norm=0.0)
    lines = []
    with pytest.raises(UserError) as e:
        train(model, tok, ids, config=config, device="cpu", checkpoint_path=ckpt, log=lines.append)
    step = int(str(e.value).split("at step ")[1].split(":")[0])
    assert 1 < step < 50 and str(e.value).startswith(f"training diverged at step {step}: the loss is ")
    assert "the likely cause is lr (1e+30), too high for this model: lower lr" in str(e.value)
    assert "set max_grad_norm (gradient clipping" in str(e.value)
    saved = load_checkpoint_payload(ckpt)
    assert saved["resume"]["step"] < step, "no checkpoint at or after the bad step"
    assert all(torch.isfinite(w).all() for w in saved["model_state_dict"].values())


def test_a_model_too_big_for_this_machine_is_refused_before_anything_is_allocated(shakespeare_text):
    from mygpt.gpt_config import GPTConfig
    from mygpt.training.train import check_memory

    tok = CharTokenizer.from_text(shakespeare_text[:5000])
    ids = tok.encode_array(shakespeare_text[:5000])
    huge = GPTConfig(vocab_size=tok.vocab_size, embed_dim=16, num_heads=2, num_layers=1, max_seq_len=10**12)
    with pytest.raises(UserError, match=r"^max_seq_len \(1,000,000,000,000\) makes training need at least"):
        check_memory(huge, 16, 32, device="cpu")
    model = GPT(vocab_size=tok.vocab_size, embed_dim=16, num_heads=2, num_layers=1, max_seq_len=32)
    with pytest.raises(UserError, match=r"^batch_size \(1,000,000,000,000\) makes training need at least"):
        train(model, tok, ids, config=TrainConfig(seq_len=32, batch_size=10**12), device="cpu", log=None)
    check_memory(GPTConfig(vocab_size=3046, embed_dim=192, num_heads=6, num_kv_heads=2), 16, 64, device="cpu")


def test_on_an_accelerator_the_first_bad_step_is_kept_on_the_device_and_named():
    from mygpt.training.guards import FiniteLoss

    watch = FiniteLoss(TrainConfig(lr=1.0), torch.device("cpu"))
    watch.first = torch.zeros((), dtype=torch.long)  # the accelerator's path (no read per step), on the CPU
    watch.see(1, torch.tensor(2.0))
    watch.check()
    watch.see(2, torch.tensor(float("nan"), dtype=torch.bfloat16))
    watch.see(3, torch.tensor(float("inf")))
    with pytest.raises(UserError, match=r"^training diverged at step 2: the loss is not finite"):
        watch.check()


def test_resume_restores_each_ranks_own_rng_state():
    """A resumed rank gets its own torch RNG state back (dropout draws from it), not rank 0's."""
    from mygpt.training.parallel import World
    from mygpt.training.rng import capture_rng, rank_rng, restore_rng

    cpu = torch.device("cpu")
    ranks = []
    for rank in range(2):
        torch.manual_seed(100 + rank)
        ranks.append(rank_rng(cpu))
    torch.manual_seed(7)  # rank 0's global state when it writes the checkpoint differs from both
    saved = capture_rng(torch.Generator().manual_seed(1), cpu, ranks)
    for rank in range(2):
        torch.manual_seed(999)
        restore_rng(saved, torch.Generator(), cpu, World(rank=rank, size=2))
        assert torch.equal(torch.get_rng_state(), ranks[rank]["torch"]), f"rank {rank} did not get its own state"
    restore_rng(saved, torch.Generator(), cpu, World(rank=0, size=3), seed=5)  # another world size:
    assert torch.equal(torch.get_rng_state(), saved["torch"]), "rank 0 continues the saved main stream"
    restore_rng(saved, torch.Generator(), cpu, World(rank=1, size=3), seed=5)
    assert torch.equal(torch.get_rng_state(), torch.Generator().manual_seed(6).get_state()), "seed + rank"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_training_step_holds_no_logits_and_gives_the_plain_losss_gradients(precision):
    """The logits (rows x seq_len x vocab floats, the step's largest activation) never outlive the forward pass:
    it returns none (fp32 on the CPU: the blockwise head and loss never form them whole; bf16: forward's own, let
    go), and the step's gradients are those of the plain loss (fp32 within rounding, bf16 its bits)."""
    from mygpt.device import autocast
    from mygpt.training.parallel import World, forward_backward

    torch.manual_seed(0)
    model = GPT(**{**TINY_MODEL, "vocab_size": 50})
    x, y = torch.randint(50, (4, 16)), torch.randint(50, (4, 16))
    returned: list = []
    model.register_forward_hook(lambda _m, _args, out: returned.append(out[0]))
    forward_backward(model, x, y, batch_size=4, world=World(), micro_batch_size=0, device=torch.device("cpu"),
                     precision=precision)  # fmt: skip
    assert returned == [None]
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with autocast("cpu", precision):
        loss = model(x, y)[1]
    loss.backward()
    for a, p in zip(grads, model.parameters()):
        if precision == "bf16":
            assert torch.equal(a, p.grad)
        else:
            torch.testing.assert_close(a, p.grad, rtol=0, atol=1e-5 * p.grad.abs().max().item())
