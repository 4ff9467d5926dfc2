"""Prompt -> text with a trained GPT: seeded temperature/top-k sampling (``temperature=0``: greedy), KV-cached by
default; the cached and uncached paths compute the same function past ``max_seq_len`` too. With a byte-level
tokenizer generation ends at ``<|endoftext|>``, as Hugging Face's ``generate`` ends at the EOS token: the model
has learnt that a document ends there, and what it samples after is the start of an unrelated one."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import torch

from mygpt.device import autocast, resolve_device, resolve_precision
from mygpt.errors import UserError, check_int, describe_chars

__all__ = ["EOS", "Generated", "generate", "generate_ids", "generate_sample"]

EOS = "<|endoftext|>"


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
    stop_ids: Collection[int] = (),
) -> torch.Tensor:
    """Extend the (1, T) id tensor ``ids`` (on the model's device) by ``max_new_tokens`` sampled ids, or fewer:
    it stops after the first sampled id in ``stop_ids`` (kept, as the last)."""
    device = ids.device
    gen = torch.Generator(device=device).manual_seed(seed)
    L = model.max_seq_len
    tokens = ids
    stops = frozenset(int(i) for i in stop_ids)
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
            if stops and int(nxt) in stops:
                break
    finally:
        model.train(was_training)
    return tokens


@dataclasses.dataclass(frozen=True)
class Generated:
    """What :func:`generate_sample` made: ``text`` (the prompt and the continuation, decoded, without the token it
    stopped at), ``new_tokens`` (sampled, that token included) and ``stopped_at`` (``<|endoftext|>``, or None when
    ``max_new_tokens`` ran out first)."""

    text: str
    new_tokens: int
    stopped_at: str | None


def generate(model, tokenizer, prompt: str, **options) -> str:
    """:func:`generate_sample`'s text: ``prompt`` + up to ``max_new_tokens`` sampled tokens, decoded."""
    return generate_sample(model, tokenizer, prompt, **options).text


def generate_sample(
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
) -> Generated:
    """``prompt`` continued by up to ``max_new_tokens`` sampled tokens; it stops at the tokenizer's
    ``<|endoftext|>`` when it has one (a byte-level BPE). Moves ``model`` to ``device``."""
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
    eos = getattr(tokenizer, "special_ids", {}).get(EOS)
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
        stop_ids=() if eos is None else (eos,),
    )[0].cpu()
    new = out[ids.numel() :]
    stopped = eos is not None and new.numel() > 0 and int(new[-1]) == eos
    return Generated(
        text=tokenizer.decode(out[:-1] if stopped else out),
        new_tokens=int(new.numel()),
        stopped_at=EOS if stopped else None,
    )
