"""Prompt -> text with a trained GPT: seeded temperature/top-k sampling (``temperature=0``: greedy), KV-cached by
default; the cached and uncached paths compute the same function past ``max_seq_len`` too."""

from __future__ import annotations

import torch

from mygpt.device import autocast, resolve_device, resolve_precision
from mygpt.errors import UserError, check_int, describe_chars

__all__ = ["generate", "generate_ids"]


def _sample(logits: torch.Tensor, temperature: float, top_k: int, gen: torch.Generator) -> torch.Tensor:
    """(1, vocab) logits -> (1, 1) next token id."""
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=gen)


@torch.no_grad()
def generate_ids(
    model,
    ids: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 40,
    seed: int = 1337,
    precision: str = "fp32",
    use_cache: bool = True,
) -> torch.Tensor:
    """Extend the (1, T) id tensor ``ids`` (on the model's device) by ``max_new_tokens`` sampled ids."""
    device = ids.device
    gen = torch.Generator(device=device).manual_seed(seed)
    L = model.max_seq_len
    tokens = ids
    cache = model.new_kv_cache() if use_cache else None
    was_training = model.training
    model.eval()
    try:
        for _ in range(max_new_tokens):
            T = tokens.size(1)
            with autocast(device, precision):
                if cache is not None and T <= L:
                    # feed only what the cache has not seen yet (the whole prompt on the first step)
                    logits, _ = model(tokens[:, cache.length :], kv_cache=cache)
                else:
                    logits, _ = model(tokens[:, -L:])
            nxt = _sample(logits[:, -1, :], temperature, top_k, gen)
            tokens = torch.cat((tokens, nxt.to(tokens.dtype)), dim=1)
    finally:
        model.train(was_training)
    return tokens


def generate(
    model,
    tokenizer,
    prompt: str,
    *,
    max_new_tokens: int = 200,
    temperature: float = 1.0,
    top_k: int = 40,
    seed: int = 1337,
    device="auto",
    precision: str = "fp32",
    use_cache: bool = True,
) -> str:
    """Return ``prompt`` + ``max_new_tokens`` sampled tokens, decoded. Moves ``model`` to ``device``."""
    check_int("max_new_tokens", max_new_tokens, 0)
    if not isinstance(temperature, (int, float)) or not temperature >= 0:
        raise UserError(f"temperature must be >= 0 (0 = greedy), got {temperature!r}")
    check_int("top_k", top_k, 0, "0 = no top-k filtering")
    if not prompt:
        raise UserError("the prompt is empty; give at least one character with --prompt")
    unknown = tokenizer.unknown_chars(prompt)
    if unknown:
        raise UserError(
            f"the prompt has characters not in the checkpoint's vocabulary: {describe_chars(unknown)}; "
            f"remove or replace them"
        )
    dev = resolve_device(device)
    precision = resolve_precision(dev, precision)
    ids = tokenizer.encode(prompt)
    if ids.numel() == 0:
        raise UserError("the prompt encodes to no tokens; give a longer --prompt")
    model.to(dev)
    out = generate_ids(
        model,
        ids.to(dev).view(1, -1),
        max_new_tokens=max_new_tokens,
        temperature=float(temperature),
        top_k=top_k,
        seed=seed,
        precision=precision,
        use_cache=use_cache,
    )
    return tokenizer.decode(out[0].cpu())
