"""A real GPT whose greedy continuation ends with ``<|endoftext|>`` at a known place (generation that stops there)."""

from __future__ import annotations

import torch

from mygpt import GPT
from mygpt.generate import generate_ids


def ending_model(byte_tok, prompt: str) -> tuple[GPT, list[int], int]:
    """``(model, continuation, n)``: a model whose greedy continuation of ``prompt`` samples ``<|endoftext|>`` as its
    ``n``-th new token (n > 1), and that continuation without stopping. How: a random GPT's greedy continuation,
    then the embedding rows (the tied LM head too) of a token it samples for the first time and of
    ``<|endoftext|>`` swapped: the same function with those two ids trading places."""
    torch.manual_seed(3)
    model = GPT(vocab_size=byte_tok.vocab_size, embed_dim=32, num_heads=2, num_layers=1, max_seq_len=64).eval()
    ids = byte_tok.encode(prompt).view(1, -1)
    new = generate_ids(model, ids, max_new_tokens=24, temperature=0)[0, ids.size(1) :].tolist()
    eos = byte_tok.special_ids["<|endoftext|>"]
    seen = set(ids[0].tolist()) | {eos}
    at = next(i for i in range(1, len(new)) if new[i] not in seen | set(new[:i]))  # so the swap moves only it
    target = new[at]
    with torch.no_grad():
        w = model.token_embedding.weight
        w[[target, eos]] = w[[eos, target]]
    return model, [eos if t == target else target if t == eos else t for t in new], at + 1
