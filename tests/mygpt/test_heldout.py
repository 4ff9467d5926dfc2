"""Held-out loss and bits per byte on real text (this project's README), against a plain per-token count."""

from __future__ import annotations

import math

import numpy as np
import torch

from mygpt.heldout import heldout_loss, windows
from mygpt.model import GPT
from mygpt.tokenizers.bpe import BPETokenizer
from tests.support import REPO


def test_windows_are_fixed_and_cover_every_target_once():
    assert windows(10, 4) == [(0, 4), (4, 4), (8, 1)]
    assert windows(9, 4) == [(0, 4), (4, 4)] and windows(1, 4) == [] and windows(0, 4) == []
    assert sum(n for _, n in windows(1001, 32)) == 1000


def test_bits_per_byte_counts_the_bytes_of_the_text_the_predicted_tokens_cover():
    text = (REPO / "README.md").read_text(encoding="utf-8")[:6000]
    tok = BPETokenizer.from_corpus(text, 40)
    ids = tok.encode(text).numpy()
    assert tok.decode(ids) == text, "the tokenizer learnt on this text covers all of it"
    torch.manual_seed(0)
    model = GPT(vocab_size=tok.vocab_size, embed_dim=32, num_heads=2, num_kv_heads=1, num_layers=1, max_seq_len=64)
    got = heldout_loss(model, ids, tok.token_bytes(), seq_len=64)

    nats = 0.0  # the plain way: every window's log-probabilities, one target at a time
    for start, n in windows(len(ids), 64):
        with torch.no_grad():
            logits, _ = model(torch.as_tensor(ids[start : start + n], dtype=torch.long).view(1, -1))
        logp = torch.log_softmax(logits[0].double(), dim=-1)
        nats -= sum(logp[j, int(ids[start + 1 + j])].item() for j in range(n))
    first = len(tok.decode(ids[:1]).encode("utf-8"))  # the one token nothing predicts
    assert got.targets == len(ids) - 1 and got.target_bytes == len(text.encode("utf-8")) - first
    assert math.isclose(got.loss, nats / got.targets, rel_tol=1e-5)
    assert math.isclose(got.bpb, nats / math.log(2) / got.target_bytes, rel_tol=1e-5)
    assert got.windows == math.ceil((len(ids) - 1) / 64)
    again = heldout_loss(model, ids, np.asarray(tok.token_bytes()), seq_len=64)
    assert again == got, "deterministic"


def test_fewer_windows_per_forward_pass_give_the_same_numbers_to_float_rounding():
    """``rows`` bounds the windows of a forward pass (its fp32 logits are evaluation's memory)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")[:6000]
    tok = BPETokenizer.from_corpus(text, 40)
    ids = tok.encode(text).numpy()
    torch.manual_seed(0)
    model = GPT(vocab_size=tok.vocab_size, embed_dim=32, num_heads=2, num_kv_heads=1, num_layers=1, max_seq_len=16)
    passes: list[int] = []
    model.register_forward_hook(lambda _m, args, _out: passes.append(args[0].size(0)))
    whole = heldout_loss(model, ids, tok.token_bytes(), seq_len=16)
    assert max(passes) == 8, "the default: eight windows at once"
    for rows in (1, 3):
        passes.clear()
        got = heldout_loss(model, ids, tok.token_bytes(), seq_len=16, rows=rows)
        assert max(passes) == rows and sum(passes) == whole.windows
        assert (got.targets, got.target_bytes, got.windows) == (whole.targets, whole.target_bytes, whole.windows)
        assert math.isclose(got.loss, whole.loss, rel_tol=1e-6) and math.isclose(got.bpb, whole.bpb, rel_tol=1e-6)
