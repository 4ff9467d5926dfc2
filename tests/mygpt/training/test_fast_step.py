"""The fast training step against the plain one: the rewritten kernels give the same bits, the fused optimizer
the same weights within float rounding."""

from __future__ import annotations

import numpy as np
import torch

from mygpt import GPT, CharTokenizer, TrainConfig
from mygpt.model import RMSNorm, apply_rope, rope_tables, rotate, rotation_tables
from mygpt.training.train import clip_gradients, train
from tests.support.tiny_model import TINY_MODEL, TINY_TRAIN


def _plain_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def test_rotate_is_apply_rope_bit_for_bit_forward_and_backward():
    torch.manual_seed(0)
    cos, sin = rope_tables(32, 64)
    x = torch.randn(3, 6, 64, 32, requires_grad=True)
    grad = torch.randn(3, 6, 64, 32)
    plain = apply_rope(x, cos, sin)
    (plain_grad,) = torch.autograd.grad(plain, x, grad)
    fast = rotate(x, *rotation_tables(cos, sin))
    (fast_grad,) = torch.autograd.grad(fast, x, grad)
    assert not torch.equal(plain, x)  # it rotates
    assert torch.equal(fast, plain) and torch.equal(fast_grad, plain_grad)
    half = x.detach().to(torch.bfloat16)  # under bf16 autocast q and k arrive in bf16
    assert torch.equal(rotate(half, *rotation_tables(cos, sin)), apply_rope(half, cos, sin))


def test_rms_norm_is_the_four_op_formula_bit_for_bit_forward_and_backward():
    torch.manual_seed(0)
    norm = RMSNorm(192)
    with torch.no_grad():
        norm.weight.mul_(1 + 0.1 * torch.randn(192))
    x = torch.randn(4, 64, 192, requires_grad=True)
    grad = torch.randn(4, 64, 192)
    plain = _plain_rms_norm(x, norm.weight, norm.eps)
    plain_grads = torch.autograd.grad(plain, (x, norm.weight), grad)
    fast = norm(x)
    fast_grads = torch.autograd.grad(fast, (x, norm.weight), grad)
    assert torch.equal(fast, plain)
    assert all(torch.equal(f, p) for f, p in zip(fast_grads, plain_grads))


def test_foreach_clip_gives_the_loops_bits():
    torch.manual_seed(0)
    models = [GPT(vocab_size=50, **TINY_MODEL) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    x = torch.randint(0, 50, (4, 32))
    norms = []
    for model, fused in zip(models, (False, True)):
        model(x, x)[1].backward()
        norms.append(clip_gradients(model, TrainConfig(max_grad_norm=0.01, fused=fused)))
    assert norms[0] > 0.01  # the clip scaled the gradients
    assert torch.equal(norms[0], norms[1])
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a.grad, b.grad)


def _trained(fused: bool, text: str) -> tuple[GPT, list]:
    tokenizer = CharTokenizer.from_text(text)
    tokens = tokenizer.encode_array(text)
    torch.manual_seed(0)
    model = GPT(vocab_size=tokenizer.vocab_size, **TINY_MODEL)
    config = TrainConfig(**{**TINY_TRAIN, "steps": 30, "max_grad_norm": 1.0, "fused": fused})
    result = train(model, tokenizer, tokens, config=config, device="cpu", log=None)
    return model, [h["loss"] for h in result.history]


def test_fused_step_trains_the_plain_steps_weights_within_rounding(shakespeare_text):
    text = shakespeare_text[:20_000]
    plain, plain_losses = _trained(False, text)
    fast, fast_losses = _trained(True, text)
    torch.manual_seed(0)
    start = GPT(vocab_size=plain.vocab_size, **TINY_MODEL)
    moved = max((p - s).abs().max().item() for p, s in zip(plain.parameters(), start.parameters()))
    assert moved > 1e-2  # 30 steps at lr 3e-3 move the weights far more than the tolerance below
    for (name, a), b in zip(plain.named_parameters(), fast.parameters()):
        assert torch.allclose(a, b, rtol=0, atol=1e-5), name
    assert np.allclose(fast_losses, plain_losses, rtol=0, atol=1e-5)
