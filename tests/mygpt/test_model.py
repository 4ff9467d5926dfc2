"""GPT: parameter counts from the chapter, init, config validation, causality, KV cache."""

from __future__ import annotations

import math

import pytest
import torch

from mygpt import GPT, UserError
from mygpt.model import RMSNorm
from tests.support.tiny_model import CH28_MODEL as CH28
from tests.support.tiny_model import PART1_MODEL as PART1


def test_param_count_part1_config():
    model = GPT(**PART1)
    assert model.num_params() == 207_296
    assert model.num_kv_heads == 4 and model.norm_type == "layer" and model.position_type == "learned"
    assert isinstance(model.position_embedding, torch.nn.Embedding)
    assert tuple(model.position_embedding.weight.shape) == (64, 64)


def test_param_count_chapter28_config():
    model = GPT(**CH28)
    assert model.num_params() == 2_163_264
    assert model.position_embedding is None
    attn = model.blocks[0].attn
    assert tuple(attn.k_proj.weight.shape) == (2 * 32, 192)  # GQA: 2 kv heads of width 32
    assert attn.q_proj.bias is None and attn.k_proj.bias is None and attn.o_proj.bias is None
    assert model.blocks[0].mlp.fc.bias is not None
    assert isinstance(model.norm_f, RMSNorm) and not hasattr(model.norm_f, "bias")
    # RoPE tables are derived buffers, not checkpointed weights
    assert not any("rope" in k for k in model.state_dict())


def test_config_roundtrip_and_tied_head():
    model = GPT(**CH28)
    assert model.config() == {
        "vocab_size": 3046,
        "embed_dim": 192,
        "num_heads": 6,
        "num_kv_heads": 2,
        "num_layers": 4,
        "max_seq_len": 256,
        "norm_type": "rms",
        "position_type": "rope",
    }
    assert GPT(**model.config()).num_params() == model.num_params()
    # tied LM head: changing the embedding changes the logits through the head as well
    idx = torch.tensor([[1, 2, 3]])
    before, _ = model(idx)
    with torch.no_grad():
        model.token_embedding.weight[5] += 1.0
    after, _ = model(idx)
    assert not torch.allclose(before[..., 5], after[..., 5])


@pytest.mark.parametrize("cfg", [PART1, CH28], ids=["part1", "ch28"])
def test_initial_loss_is_about_ln_vocab(cfg):
    torch.manual_seed(0)
    model = GPT(**cfg)
    V, T = cfg["vocab_size"], cfg["max_seq_len"]
    x = torch.randint(0, V, (4, T))
    y = torch.randint(0, V, (4, T))
    _, loss = model(x, y)
    assert abs(loss.item() - math.log(V)) < 0.15


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(embed_dim=64, num_heads=5), "embed_dim"),
        (dict(num_heads=4, num_kv_heads=3), "num_kv_heads"),
        (dict(norm_type="batch"), "norm_type"),
        (dict(position_type="alibi"), "position_type"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(embed_dim=-8), "embed_dim"),
        (dict(num_layers=0), "num_layers"),
        (dict(max_seq_len=0), "max_seq_len"),
        (dict(num_heads=0), "num_heads"),
        (dict(num_kv_heads=0), "num_kv_heads"),
        (dict(dropout=1.5), "dropout"),
        (dict(embed_dim=12, num_heads=4, position_type="rope"), "rope"),
    ],
)
def test_bad_config_raises_user_error_naming_parameter(kwargs, name):
    args = dict(vocab_size=10, embed_dim=16, num_heads=4)
    args.update(kwargs)
    with pytest.raises(UserError, match=name):
        GPT(**args)


@pytest.mark.parametrize("position_type", ["learned", "rope"])
def test_causal_future_tokens_do_not_change_past_logits(position_type):
    torch.manual_seed(1)
    model = GPT(
        vocab_size=20,
        embed_dim=32,
        num_heads=4,
        num_kv_heads=2,
        num_layers=2,
        max_seq_len=16,
        position_type=position_type,
    ).eval()
    a = torch.randint(0, 20, (1, 12))
    b = a.clone()
    b[0, 8:] = (b[0, 8:] + 1) % 20
    la, _ = model(a)
    lb, _ = model(b)
    assert torch.allclose(la[0, :8], lb[0, :8], atol=1e-6)
    assert not torch.allclose(la[0, 8:], lb[0, 8:], atol=1e-3)


@pytest.mark.parametrize("norm_type, position_type, kv", [("layer", "learned", 4), ("rms", "rope", 2)])
def test_kv_cache_matches_full_forward(norm_type, position_type, kv):
    torch.manual_seed(2)
    model = GPT(
        vocab_size=30,
        embed_dim=32,
        num_heads=4,
        num_kv_heads=kv,
        num_layers=3,
        max_seq_len=24,
        norm_type=norm_type,
        position_type=position_type,
    ).eval()
    idx = torch.randint(0, 30, (2, 24))
    full, _ = model(idx)
    cache = model.new_kv_cache()
    pieces = []
    # prefill 5, then one at a time, then a chunk of 4 (exercises the offset causal mask), then the rest
    bounds = [0, 5, 6, 7, 8, 12, 24]
    for lo, hi in zip(bounds, bounds[1:]):
        assert cache.length == lo
        out, _ = model(idx[:, lo:hi], kv_cache=cache)
        pieces.append(out)
    cached = torch.cat(pieces, dim=1)
    assert torch.allclose(full, cached, atol=1e-5), (full - cached).abs().max()
    assert cache.length == 24
    assert tuple(cache.keys[0].shape) == (2, kv, 24, 8)
    with pytest.raises(ValueError, match="max_seq_len"):
        model(idx[:, :1], kv_cache=cache)


def test_rope_uses_absolute_position_in_cache():
    """Feeding a token with a cache of length p must equal position p, not position 0."""
    torch.manual_seed(3)
    model = GPT(
        vocab_size=30, embed_dim=32, num_heads=4, num_layers=1, max_seq_len=16, position_type="rope", norm_type="rms"
    ).eval()
    idx = torch.randint(0, 30, (1, 10))
    full, _ = model(idx)
    cache = model.new_kv_cache()
    model(idx[:, :9], kv_cache=cache)
    last, _ = model(idx[:, 9:], kv_cache=cache)
    assert torch.allclose(full[:, 9], last[:, 0], atol=1e-5)
    fresh, _ = model(idx[:, 9:])  # the same token at position 0 gives different logits
    assert not torch.allclose(fresh[:, 0], last[:, 0], atol=1e-3)


def test_forward_longer_than_max_seq_len_raises():
    model = GPT(vocab_size=10, embed_dim=16, num_heads=2, num_layers=1, max_seq_len=8)
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_bf16_autocast_forward_runs_on_cpu():
    from mygpt.device import autocast

    model = GPT(**{**CH28, "vocab_size": 100, "max_seq_len": 32})
    x = torch.randint(0, 100, (2, 32))
    with autocast("cpu", "bf16"):
        logits, loss = model(x, x)
    assert logits.dtype == torch.bfloat16
    assert torch.isfinite(loss)


@pytest.mark.parametrize(
    "fields",
    [
        dict(vocab_size=65),
        CH28,
        dict(vocab_size=10, embed_dim=24, num_heads=4, num_kv_heads=1, num_layers=3, max_seq_len=7, norm_type="layer"),
    ],
)
def test_config_counts_its_parameters_without_building_the_model(fields):
    from mygpt.gpt_config import GPTConfig

    config = GPTConfig(**fields)
    assert config.num_params() == GPT(config).num_params()
