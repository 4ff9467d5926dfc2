"""GPT: a small decoder-only transformer in one readable file (nanoGPT style), built from a ``GPTConfig``.

Pre-norm blocks ``x + Attention(Norm(x)); x + MLP(Norm(x))``, then a final norm and the tied LM head. Norm is
LayerNorm or RMSNorm; attention is bias-free grouped-query attention (``num_kv_heads`` key/value heads); positions
are a learned table or RoPE (no parameters). A ``KVCache`` passed to ``forward`` makes the cached path compute the
same function as the whole sequence at once.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from mygpt.gpt_config import GPTConfig

__all__ = ["GPT", "KVCache", "RMSNorm"]


class RMSNorm(nn.Module):
    """Root-mean-square norm: ``x / rms(x) * weight`` (no mean subtraction, no bias), in fp32.

    The forward pass is the four-op formula's bits (``x * rsqrt(mean(x**2) + eps) * weight``, tested); the
    backward pass is layer norm's fused kernel with a zero mean, plus the one term layer norm has and RMS norm
    has not (:class:`_RMSNormFunction`), the same gradients within float rounding (tested). Why: PyTorch has no
    fused RMS norm backward on the CPU, and layer norm's does in one kernel what autograd does from the formula
    in a dozen."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = cast(torch.Tensor, _RMSNormFunction.apply(x.float(), self.weight.float(), self.eps))
        return y.to(x.dtype)


class _RMSNormFunction(torch.autograd.Function):
    """``x * rstd * weight`` with ``rstd = rsqrt(mean(x**2) + eps)`` per row; it keeps ``x`` and ``rstd``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True).add_(eps))
        ctx.save_for_backward(x, rstd, weight)
        return x.mul(rstd).mul_(weight)

    @staticmethod
    @once_differentiable  # the written-out gradient has no graph of its own: a second derivative would be wrong
    def backward(ctx, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        # With xhat = x * rstd and gw = g * w, RMS norm's d/dx is rstd * (gw - xhat * mean(gw * xhat)); layer
        # norm's, given mean 0 and this rstd, is that minus rstd * mean(gw), which is added back (mean(gw) is the
        # matrix-vector product g @ w / D). d/dw is the same for both: the sum of g * xhat over the rows.
        (grad,) = grads
        x, rstd, weight = ctx.saved_tensors
        need_x, need_w = ctx.needs_input_grad[:2]
        if not (need_x or need_w):
            return None, None, None
        grad = grad.contiguous()
        with torch.autocast(grad.device.type, enabled=False):  # fp32 throughout: autocast would lower the matmul
            grad_x, grad_weight, _ = torch.ops.aten.native_layer_norm_backward(
                grad, x, [x.size(-1)], torch.zeros_like(rstd), rstd, weight, None, [need_x, need_w, False]
            )
            if need_x:
                grad_x.addcmul_(rstd, (grad @ weight).unsqueeze(-1), value=1.0 / x.size(-1))
        return grad_x, grad_weight, None


def make_norm(norm_type: str, dim: int) -> nn.Module:
    return nn.LayerNorm(dim) if norm_type == "layer" else RMSNorm(dim)


def rope_tables(head_dim: int, max_seq_len: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's cos/sin tables, (max_seq_len, head_dim // 2), computed in fp32 as transformers does (so an export
    gives bit-identical angles)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    angles = torch.arange(max_seq_len, dtype=torch.float)[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, D) ``x`` pairwise: dims i and i + D/2 form one 2-D rotation by angle pos * freq_i.

    The plain formula, the reference :func:`rotate` is tested against."""
    half = x.size(-1) // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.to(x.dtype)


def rotation_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos | cos, -sin | sin)``, each (T, D): the tables :func:`rotate` multiplies by, built once a forward."""
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def rotate(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
    """:func:`apply_rope` as ``x * cos2 + swap_halves(x) * sin2`` (tables from :func:`rotation_tables`, shaped to
    broadcast over ``x``'s position and head dims): four kernels instead of seven, and the same bits forward and
    backward (``a - b == a + (-b)`` and a sum of two terms is the same either way round in IEEE arithmetic;
    tested). Swapping the halves is a roll by D/2, whose gradient is the opposite roll (one kernel, not two
    slices' zero-filled copies)."""
    xf = x.float()
    return (xf * cos2 + torch.roll(xf, x.size(-1) // 2, dims=-1) * sin2).to(x.dtype)


@dataclass
class KVCache:
    """Per-layer cached keys/values, each (B, num_kv_heads, length, head_dim); grows as tokens are fed."""

    keys: list = field(default_factory=list)
    values: list = field(default_factory=list)

    @property
    def length(self) -> int:
        return 0 if not self.keys else self.keys[0].size(2)


class CausalSelfAttention(nn.Module):
    """Grouped-query attention, bias free: ``num_kv_heads`` key/value heads, each serving a consecutive group of
    ``num_heads // num_kv_heads`` query heads.

    The step computes q, k and v in one matmul (the three weights concatenated: the parameters, their init and
    the state_dict keys stay three) and rotates q and k together in one :func:`rotate`, and hands the kv groups to
    ``scaled_dot_product_attention(enable_gqa=True)``, which serves them without copying K/V. The plain step
    (three projections, K/V repeated per group) gives the same loss and gradients within float rounding
    (tests/mygpt/training/test_fast_step.py)."""

    def __init__(self, embed_dim: int, num_heads: int, num_kv_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(embed_dim, num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(embed_dim, num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(embed_dim, num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x, rope=None, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        """``rope``: the :func:`rotation_tables`, shaped (T, 1, head_dim)."""
        B, T, E = x.shape
        H, KV = self.num_heads, self.num_kv_heads
        weight = torch.cat((self.q_proj.weight, self.k_proj.weight, self.v_proj.weight))
        qkv = F.linear(x, weight).view(B, T, H + 2 * KV, self.head_dim)
        qk, v = qkv.split((H + KV, KV), dim=2)  # split, not slices: its gradient is one cat
        if rope is not None:
            qk = rotate(qk, *rope)
        q, k = qk.split((H, KV), dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            if len(cache.keys) > layer:
                k = torch.cat((cache.keys[layer], k), dim=2)
                v = torch.cat((cache.values[layer], v), dim=2)
                cache.keys[layer], cache.values[layer] = k, v
            else:
                cache.keys.append(k)
                cache.values.append(v)
        T_k = k.size(2)
        mask, is_causal = None, False
        if T_k == T:
            is_causal = T > 1
        elif T > 1:  # new tokens at absolute positions T_k-T .. T_k-1 see every key up to their own position
            q_pos = torch.arange(T_k - T, T_k, device=x.device)
            mask = torch.arange(T_k, device=x.device)[None, :] <= q_pos[:, None]
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0,
            enable_gqa=KV != H,
        )
        y = y.transpose(1, 2).contiguous().view(B, T, E)
        return self.resid_dropout(self.o_proj(y))


class MLP(nn.Module):
    def __init__(self, embed_dim: int, dropout: float) -> None:
        super().__init__()
        self.fc = nn.Linear(embed_dim, 4 * embed_dim)
        self.proj = nn.Linear(4 * embed_dim, embed_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, embed_dim, num_heads, num_kv_heads, dropout, norm_type) -> None:
        super().__init__()
        self.norm1 = make_norm(norm_type, embed_dim)
        self.attn = CausalSelfAttention(embed_dim, num_heads, num_kv_heads, dropout)
        self.norm2 = make_norm(norm_type, embed_dim)
        self.mlp = MLP(embed_dim, dropout)

    def forward(self, x, rope=None, cache=None, layer=0):
        x = x + self.attn(self.norm1(x), rope=rope, cache=cache, layer=layer)
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """``GPT(config)``, or ``GPT(vocab_size, **fields)``; the config is ``model.gpt_config``, its fields attributes."""

    # The config's fields, set from it in __init__ (declared here for the type checker).
    vocab_size: int
    embed_dim: int
    num_heads: int
    num_kv_heads: int
    num_layers: int
    max_seq_len: int
    dropout: float
    norm_type: str
    position_type: str
    # The RoPE buffers (registered in __init__ only for position_type="rope").
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, config: GPTConfig | int | None = None, /, **values) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            config = GPTConfig(**values) if config is None else GPTConfig(config, **values)
        elif values:
            raise TypeError(f"GPT takes a GPTConfig or its fields, not both (got {sorted(values)})")
        self.gpt_config = config
        for name, value in asdict(config).items():
            setattr(self, name, value)

        embed_dim, num_heads, dropout = config.embed_dim, config.num_heads, config.dropout
        self.token_embedding = nn.Embedding(config.vocab_size, embed_dim)
        self.position_embedding: nn.Embedding | None
        if config.position_type == "learned":
            self.position_embedding = nn.Embedding(config.max_seq_len, embed_dim)
        else:
            self.position_embedding = None
            cos, sin = rope_tables(config.head_dim, config.max_seq_len)
            # Derived tables, not weights: kept out of the state_dict so checkpoints hold parameters only.
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(embed_dim, num_heads, config.num_kv_heads, dropout, config.norm_type)
            for _ in range(config.num_layers)
        )
        self.norm_f = make_norm(config.norm_type, embed_dim)
        self._init_weights()

    # -- init -----------------------------------------------------------------------------------
    def _init_weights(self) -> None:
        """GPT-2 init: N(0, 0.02) weights, zero biases, residual output projections scaled by 1/sqrt(2L)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                bias = getattr(module, "bias", None)  # nn.Embedding has none
                if bias is not None:
                    nn.init.zeros_(bias)
        resid_std = 0.02 / math.sqrt(2 * self.num_layers)
        for module in self.blocks:
            block = cast(Block, module)  # self.blocks holds only Blocks (nn.ModuleList is not generic)
            nn.init.normal_(block.attn.o_proj.weight, mean=0.0, std=resid_std)
            nn.init.normal_(block.mlp.proj.weight, mean=0.0, std=resid_std)

    # -- introspection --------------------------------------------------------------------------
    def config(self) -> dict:
        """The checkpoint ``config`` fields (without ``tokenizer_kind``)."""
        return self.gpt_config.to_checkpoint()

    def num_params(self) -> int:
        """Number of parameters (the tied LM head is the token embedding, counted once)."""
        return sum(p.numel() for p in self.parameters())

    def new_kv_cache(self) -> KVCache:
        return KVCache()

    # -- forward --------------------------------------------------------------------------------
    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        *,
        keep_logits: bool = True,
    ):
        """``idx`` (B, T) -> ``(logits, loss or None)``; with ``kv_cache``, ``idx`` is only the new tokens (at
        positions ``kv_cache.length ..``) and the cache grows in place. ``keep_logits=False`` (with ``targets``):
        ``(None, loss)``, the loss from :class:`_LinearCrossEntropy` where it applies (fp32 on the CPU, gradients
        on), which never holds all the logits; the training step asks for this. ``targets``: int64 ids shaped as
        ``idx``, each one in ``[0, vocab_size)`` (no ignore index: every position counts)."""
        if targets is None and not keep_logits:
            raise ValueError("keep_logits=False without targets: there would be neither logits nor a loss")
        if targets is not None and (targets.shape != idx.shape or targets.dtype != torch.long):
            raise ValueError(
                f"targets must be token ids shaped as idx: a {torch.long} tensor of shape {tuple(idx.shape)}, "
                f"got {targets.dtype} of shape {tuple(targets.shape)}"
            )
        _B, T = idx.shape
        start = kv_cache.length if kv_cache is not None else 0
        if start + T > self.max_seq_len:
            raise ValueError(
                f"sequence of {start + T} tokens is longer than max_seq_len={self.max_seq_len}; crop the context"
            )
        x = self.token_embedding(idx)
        rope = None
        if self.position_embedding is not None:
            pos = torch.arange(start, start + T, device=idx.device)
            x = x + self.position_embedding(pos)
        else:
            cos2, sin2 = rotation_tables(self.rope_cos[start : start + T], self.rope_sin[start : start + T])
            rope = cos2[:, None, :], sin2[:, None, :]  # (T, 1, D): over the (B, T, heads, D) projections
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x, rope=rope, cache=kv_cache, layer=i)
        x = self.norm_f(x)
        weight = self.token_embedding.weight  # the tied LM head
        if targets is not None and not keep_logits and _LinearCrossEntropy.applies(x, weight):
            flat = x.reshape(-1, x.size(-1))
            return None, cast(torch.Tensor, _LinearCrossEntropy.apply(flat, weight, targets.reshape(-1)))
        logits = F.linear(x, weight)
        loss = None
        if targets is not None:
            flat = logits.float().view(-1, logits.size(-1))
            loss = cast(torch.Tensor, _CrossEntropy.apply(flat, targets.reshape(-1)))
        return (logits if keep_logits else None), loss


#: an ``ignore_index`` no target can equal (``nll_loss`` ignores -100 by default)
_NO_TARGET_IGNORED = torch.iinfo(torch.long).min


class _CrossEntropy(torch.autograd.Function):
    """``F.cross_entropy(logits, targets)`` (the mean over rows; every target a real id) with its backward written
    out: ``(softmax - onehot) / rows`` from the saved log-probabilities in two passes over the logits, where
    autograd's zero-filled ``nll_loss`` gradient and ``log_softmax``'s backward take three. The loss's bits, the
    gradient within float rounding (tested)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(logits, dim=-1)
        ctx.save_for_backward(logp, targets)
        # every row counts (no ignore_index): a target of -100 is out of range, as the backward assumes
        return F.nll_loss(logp, targets, ignore_index=_NO_TARGET_IGNORED)

    @staticmethod
    @once_differentiable  # the written-out gradient has no graph of its own: a second derivative would be wrong
    def backward(ctx, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (grad,) = grads
        logp, targets = ctx.saved_tensors
        scale = grad / logp.size(0)
        grad_logits = torch.exp(logp).mul_(scale)
        grad_logits[torch.arange(logp.size(0), device=logp.device), targets] -= scale
        return grad_logits, None


class _LinearCrossEntropy(torch.autograd.Function):
    """``F.cross_entropy(x @ weight.T, targets)`` (mean over rows) and its gradients, :data:`ROWS` rows at a time:
    each block's logits are made, turned into log-probabilities (``log_softmax``), its share of the loss and of both
    gradients (``(softmax - onehot) / rows``, times ``weight`` for ``x``, times ``x`` for ``weight``), and let go,
    all in the forward pass; the backward pass scales the two gradients by the loss's. Why: a block of logits
    stays in the CPU's cache, where the whole (rows x vocab) matrix and its gradient make four trips through
    memory. The loss and gradients of :class:`_CrossEntropy` over ``F.linear`` within float rounding (tested);
    fp32 on the CPU only, where it is measured faster (bench/step_vs_nanogpt.py)."""

    ROWS = 512

    @staticmethod
    def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
        return (
            x.device.type == "cpu"
            and x.dtype == weight.dtype == torch.float32
            and torch.is_grad_enabled()
            and not torch.is_autocast_enabled("cpu")
        )

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        rows, block = x.size(0), _LinearCrossEntropy.ROWS
        grad_x, grad_w = torch.empty_like(x), torch.zeros_like(weight)
        total = x.new_zeros(())
        at = torch.arange(block, device=x.device)
        for start in range(0, rows, block):
            xs, ts = x[start : start + block], targets[start : start + block]
            # log-probabilities as log_softmax makes them (shifted by the row's max first), so a row's small loss
            # keeps its digits beside large logits; then the softmax, in their memory
            logp = torch.log_softmax(xs @ weight.t(), dim=-1)
            total -= logp.gather(1, ts[:, None]).sum()
            grad = logp.exp_()
            grad[at[: grad.size(0)], ts] -= 1
            grad.mul_(1.0 / rows)
            torch.mm(grad, weight, out=grad_x[start : start + block])
            grad_w.addmm_(grad.t(), xs)
        ctx.save_for_backward(grad_x, grad_w)
        return total / rows

    @staticmethod
    @once_differentiable  # the written-out gradient has no graph of its own: a second derivative would be wrong
    def backward(ctx, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (grad,) = grads
        grad_x, grad_w = ctx.saved_tensors
        return grad_x * grad, grad_w * grad, None
