"""The fast training step against the plain one: the rewritten kernels give the same bits where they say so, the
model's step and the fused optimizer the plain eager step's loss, gradients and weights within float rounding.

The plain step is the chapter's model written out here op by op: three q/k/v projections, :func:`apply_rope`,
K/V copied per query-head group, the four-op RMSNorm, autograd's gradients of all of it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mygpt import GPT, CharTokenizer, TrainConfig
from mygpt.model import RMSNorm, apply_rope, rope_tables, rotate, rotation_tables
from mygpt.training.train import clip_gradients, train
from tests.support.tiny_model import TINY_MODEL, TINY_TRAIN


def _plain_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def _plain_norm(norm, x: torch.Tensor) -> torch.Tensor:
    return _plain_rms_norm(x, norm.weight, norm.eps) if isinstance(norm, RMSNorm) else norm(x)


class PlainGPT(GPT):
    """:class:`GPT`'s parameters, the plain step's forward (dropout 0 only)."""

    def forward(self, idx, targets=None, kv_cache=None, keep_logits=True):
        assert kv_cache is None and self.dropout == 0
        B, T = idx.shape
        x = self.token_embedding(idx)
        if self.position_embedding is not None:
            x = x + self.position_embedding(torch.arange(T))
        for block in self.blocks:
            attn = block.attn
            H, KV, D = attn.num_heads, attn.num_kv_heads, attn.head_dim
            h = _plain_norm(block.norm1, x)
            q = attn.q_proj(h).view(B, T, H, D).transpose(1, 2)
            k = attn.k_proj(h).view(B, T, KV, D).transpose(1, 2)
            v = attn.v_proj(h).view(B, T, KV, D).transpose(1, 2)
            if self.position_embedding is None:
                q, k = (apply_rope(t, self.rope_cos[:T], self.rope_sin[:T]) for t in (q, k))
            k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + attn.o_proj(y.transpose(1, 2).reshape(B, T, H * D))
            x = x + block.mlp(_plain_norm(block.norm2, x))
        logits = F.linear(_plain_norm(self.norm_f, x), self.token_embedding.weight)
        loss = None if targets is None else F.cross_entropy(logits.view(-1, self.vocab_size), targets.reshape(-1))
        return logits, loss


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


def test_rms_norm_is_the_four_op_formula_bit_for_bit_forward_and_within_rounding_backward():
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
    x64, weight64 = x.detach().double().requires_grad_(), norm.weight.detach().double().requires_grad_()
    exact = torch.autograd.grad(_plain_rms_norm(x64, weight64, norm.eps), (x64, weight64), grad.double())
    assert torch.equal(fast, plain)
    for f, p, e in zip(fast_grads, plain_grads, exact):
        assert f.abs().max() > 0.1
        # as close to float64's gradient as the formula's own fp32 rounding, within a factor (sums run in
        # another order); the weight's is a sum over all 256 rows
        assert (f.double() - e).abs().max() <= 4 * (p.double() - e).abs().max()
        torch.testing.assert_close(f, p, rtol=1e-5, atol=1e-6 * e.abs().max().item())


def test_the_models_loss_is_cross_entropys_bits_and_its_gradient_within_rounding():
    torch.manual_seed(0)
    model = GPT(vocab_size=3046, **TINY_MODEL)
    idx, targets = torch.randint(0, 3046, (4, 32)), torch.randint(0, 3046, (4, 32))
    logits, loss = model(idx, targets)
    (fast,) = torch.autograd.grad(loss, logits)
    plain_loss = F.cross_entropy(logits.view(-1, 3046), targets.reshape(-1))
    (plain,) = torch.autograd.grad(plain_loss, logits)
    assert torch.equal(loss, plain_loss)
    assert plain.abs().max() > 1e-3  # the targets' entries: (p - 1) / rows
    torch.testing.assert_close(fast, plain, rtol=0, atol=1e-9)


@pytest.mark.parametrize(
    "shape",
    [
        dict(num_heads=6, num_kv_heads=2, norm_type="rms", position_type="rope"),  # the chapter's
        dict(num_heads=6, num_kv_heads=6, norm_type="layer", position_type="learned"),  # Part I's
    ],
    ids=["gqa-rms-rope", "mha-layer-learned"],
)
def test_the_models_step_gives_the_plain_steps_loss_and_gradients_within_rounding(shape):
    """Weights away from their init (norm weights not ones), so every term of every gradient is exercised."""
    torch.manual_seed(0)
    model = GPT(vocab_size=97, embed_dim=192, num_layers=2, max_seq_len=64, **shape)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    plain = PlainGPT(model.gpt_config)
    plain.load_state_dict(model.state_dict())
    idx, targets = torch.randint(0, 97, (3, 64)), torch.randint(0, 97, (3, 64))
    losses, grads = [], []
    for m, keep in ((model, False), (model, True), (plain, True)):  # the training step's call, then forward's
        loss = m(idx, targets, keep_logits=keep)[1] if m is model else m(idx, targets)[1]
        losses.append(loss.detach())
        grads.append(torch.autograd.grad(loss, list(m.parameters())))
    for fast_loss, fast_grads in zip(losses[:2], grads[:2]):
        torch.testing.assert_close(fast_loss, losses[2], rtol=0, atol=1e-6)
        for (name, _), fast, slow in zip(model.named_parameters(), fast_grads, grads[2]):
            assert slow.abs().max() > 0, name
            # each gradient within 1e-5 of its own largest entry (measured: under 1e-6)
            torch.testing.assert_close(fast, slow, rtol=0, atol=1e-5 * slow.abs().max().item(), msg=name)


@pytest.mark.parametrize("rows", [512, 100, 7])  # the default, and blocks that do not divide the 4 x 64 rows
def test_the_blockwise_head_and_loss_give_cross_entropys_loss_and_gradients_within_rounding(rows, monkeypatch):
    from mygpt.model import _LinearCrossEntropy

    monkeypatch.setattr(_LinearCrossEntropy, "ROWS", rows)
    torch.manual_seed(0)
    x = torch.randn(4 * 64, 192, requires_grad=True)
    weight = (0.3 * torch.randn(3046, 192)).requires_grad_()
    targets = torch.randint(0, 3046, (4 * 64,))
    plain = F.cross_entropy(F.linear(x, weight), targets)
    plain_grads = torch.autograd.grad(3 * plain, (x, weight))  # a loss scaled as the step scales it
    assert _LinearCrossEntropy.applies(x, weight)
    fast = _LinearCrossEntropy.apply(x, weight, targets)
    fast_grads = torch.autograd.grad(3 * fast, (x, weight))
    torch.testing.assert_close(fast, plain, rtol=1e-6, atol=0)
    for f, p in zip(fast_grads, plain_grads):
        assert p.abs().max() > 1e-4
        torch.testing.assert_close(f, p, rtol=0, atol=1e-5 * p.abs().max().item())  # measured: under 2e-6


@pytest.mark.parametrize("scale", [0.06, 0.08])  # mean loss about 0.07 and 0.004
def test_the_blockwise_loss_of_confident_predictions_is_as_close_to_float64s_as_cross_entropy(scale):
    """Logits that put most of the mass on the target: a row's loss is small beside its log-sum-exp (about 15 and
    20), so a loss made as the difference of two sums over the rows would lose its digits."""
    from mygpt.model import _LinearCrossEntropy

    torch.manual_seed(0)
    weight = torch.randn(3046, 192)
    targets = torch.randint(0, 3046, (300,))
    x = (scale * weight[targets]).requires_grad_()
    exact = F.cross_entropy(F.linear(x.double(), weight.double()), targets)
    plain = F.cross_entropy(F.linear(x, weight), targets)
    fast = _LinearCrossEntropy.apply(x, weight, targets)
    # within float32's relative rounding, or (where the plain loss itself loses digits) twice its error
    assert (fast.double() - exact).abs() <= max(2 * (plain.double() - exact).abs(), 1e-6 * exact)


@pytest.mark.parametrize("offset", [0.0, 100.0, 1000.0])
def test_the_blockwise_loss_beside_large_logits_is_within_fp32_rounding_of_float64s(offset):
    """Review: every logit shifted by ``offset`` (the loss does not change): log-probabilities made after the
    row's max is taken off keep the loss's digits, where a log-sum-exp of about ``offset`` minus the target's
    logit loses them."""
    from mygpt.model import _LinearCrossEntropy

    torch.manual_seed(0)
    rows, vocab = 1100, 256
    weight = torch.cat((torch.ones(vocab, 1), torch.eye(vocab)), dim=1)  # logit = x[0] + x[1 + id]
    targets = torch.randint(0, vocab, (rows,))
    x = torch.zeros(rows, vocab + 1)
    x[:, 0] = offset
    x[torch.arange(rows), 1 + targets] = 8.0
    exact = F.cross_entropy(F.linear(x.double(), weight.double()), targets)
    fast = _LinearCrossEntropy.apply(x.requires_grad_(), weight, targets)
    torch.testing.assert_close(fast.double(), exact, rtol=4e-6, atol=0)


def test_the_blockwise_loss_is_not_used_where_it_is_not_measured_faster():
    from mygpt.device import autocast
    from mygpt.model import _LinearCrossEntropy

    x, weight = torch.randn(4, 8), torch.randn(5, 8)
    assert _LinearCrossEntropy.applies(x, weight)
    with torch.no_grad():
        assert not _LinearCrossEntropy.applies(x, weight)  # evaluation: the plain loss, no gradients made
    with autocast("cpu", "bf16"):
        assert not _LinearCrossEntropy.applies(x, weight)
    assert not _LinearCrossEntropy.applies(x.double(), weight.double())


@pytest.mark.parametrize("bad", [-1, -100, 3046])
def test_the_blockwise_loss_refuses_a_target_that_is_not_an_id_as_loudly_as_cross_entropy(bad):
    """Review: -1, -100 (cross_entropy's ignore_index) or an id past the vocabulary: an error, never garbage read
    from the neighbouring row or column."""
    from mygpt.model import _LinearCrossEntropy

    x, weight = torch.randn(600, 16, requires_grad=True), torch.randn(3046, 16, requires_grad=True)
    targets = torch.randint(0, 3046, (600,))
    targets[550] = bad  # in the second block
    with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
        _LinearCrossEntropy.apply(x, weight, targets)


@pytest.mark.parametrize("bad", [-1, -100, 3046])
def test_the_models_loss_on_either_path_refuses_a_target_that_is_not_an_id(bad):
    """-100 too, which ``F.cross_entropy`` would skip: the written-out backward counts every row, so the loss must."""
    torch.manual_seed(0)
    model = GPT(vocab_size=3046, **TINY_MODEL)
    idx, targets = torch.randint(0, 3046, (2, 32)), torch.randint(0, 3046, (2, 32))
    targets[1, 5] = bad
    for keep_logits in (True, False):
        with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
            model(idx, targets, keep_logits=keep_logits)


@pytest.mark.parametrize(
    "targets", [torch.zeros(2, 31, dtype=torch.long), torch.zeros(2, 33, dtype=torch.long), torch.zeros(2, 32).int()]
)
def test_the_models_loss_on_either_path_refuses_targets_not_shaped_or_typed_as_the_ids(targets):
    """A window one token off, or ids of another dtype (uint8 would index as a mask): one clear error, on both
    paths, never a loss over misaligned targets."""
    model = GPT(vocab_size=3046, **TINY_MODEL)
    for keep_logits in (True, False):
        with pytest.raises(ValueError, match=r"targets must be token ids shaped as idx.*\(2, 32\)"):
            model(torch.zeros(2, 32, dtype=torch.long), targets, keep_logits=keep_logits)


def test_rms_norms_gradient_is_fp32s_inside_an_autocast_region_and_a_second_derivative_is_refused():
    torch.manual_seed(0)
    norm = RMSNorm(256)
    with torch.no_grad():
        norm.weight.add_(torch.randn(256) + 1)
    x, grad = torch.randn(64, 256) * 3 + 1, torch.randn(64, 256)
    x64, weight64 = x.double().requires_grad_(), norm.weight.detach().double().requires_grad_()
    (exact,) = torch.autograd.grad(_plain_rms_norm(x64, weight64, norm.eps), x64, grad.double())
    x.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a backward run inside the region: bf16 matmuls there
        (fast,) = torch.autograd.grad(norm(x), x, grad)
    torch.testing.assert_close(fast.double(), exact, rtol=0, atol=1e-6 * exact.abs().max().item())
    (first,) = torch.autograd.grad(norm(x), x, grad, create_graph=True)
    with pytest.raises(RuntimeError):
        first.sum().backward()


def test_the_blockwise_loss_used_twice_and_backward_twice_gives_cross_entropys_gradients():
    """Review: a loss used twice in one graph, and ``backward(retain_graph=True)`` then ``backward()`` again (the
    gradients accumulate): those of F.cross_entropy, within rounding."""
    from mygpt.model import _LinearCrossEntropy

    torch.manual_seed(0)
    x, weight = torch.randn(700, 32, requires_grad=True), torch.randn(211, 32, requires_grad=True)
    targets = torch.randint(0, 211, (700,))
    grads = []
    for loss_of in (
        lambda: _LinearCrossEntropy.apply(x, weight, targets),
        lambda: F.cross_entropy(x @ weight.t(), targets),
    ):
        x.grad = weight.grad = None
        loss = loss_of()
        (2 * loss + loss * loss).backward(retain_graph=True)
        loss.backward()
        grads.append((x.grad.clone(), weight.grad.clone()))
    for f, p in zip(*grads):
        torch.testing.assert_close(f, p, rtol=0, atol=1e-5 * p.abs().max().item())


def test_asking_for_neither_logits_nor_a_loss_is_an_error():
    """Review: ``model(idx, keep_logits=False)`` without targets returned ``(None, None)``, silently."""
    model = GPT(vocab_size=97, **TINY_MODEL)
    with pytest.raises(ValueError, match="keep_logits=False without targets"):
        model(torch.zeros(1, 4, dtype=torch.long), keep_logits=False)
    logits, loss = model(torch.zeros(1, 4, dtype=torch.long))  # generation: unchanged
    assert logits.shape[:2] == (1, 4) and loss is None


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


def _trained(fused: bool, text: str, model_class: type[GPT] = GPT) -> tuple[GPT, list]:
    tokenizer = CharTokenizer.from_text(text)
    tokens = tokenizer.encode_array(text)
    torch.manual_seed(0)
    model = model_class(vocab_size=tokenizer.vocab_size, **TINY_MODEL)
    config = TrainConfig(**{**TINY_TRAIN, "steps": 30, "max_grad_norm": 1.0, "fused": fused})
    result = train(model, tokenizer, tokens, config=config, device="cpu", log=None)
    return model, [h["loss"] for h in result.history]


def test_the_default_step_trains_the_plain_steps_weights_within_rounding(shakespeare_text):
    """30 steps of the default (the model's step, fused AdamW) against the plain model with the per-parameter
    AdamW loop: the same initial weights and batches, every weight and loss within 1e-5."""
    text = shakespeare_text[:20_000]
    plain, plain_losses = _trained(False, text, PlainGPT)
    fast, fast_losses = _trained(True, text)
    torch.manual_seed(0)
    start = GPT(vocab_size=plain.vocab_size, **TINY_MODEL)
    moved = max((p - s).abs().max().item() for p, s in zip(plain.parameters(), start.parameters()))
    assert moved > 1e-2  # 30 steps at lr 3e-3 move the weights far more than the tolerance below
    for (name, a), b in zip(plain.named_parameters(), fast.parameters()):
        assert torch.allclose(a, b, rtol=0, atol=1e-5), name
    assert np.allclose(fast_losses, plain_losses, rtol=0, atol=1e-5)
