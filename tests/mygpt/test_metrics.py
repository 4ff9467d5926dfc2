"""The numbers people read: bits per byte against a hand computation, FLOPs per token, MFU, the GPU table."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mygpt import GPT, BPETokenizer, CharTokenizer
from mygpt.metrics import flops_per_token, format_throughput, peak_for_name, throughput
from mygpt.training.parallel import World, evaluate
from tests.support.tiny_model import CH28_MODEL


class Uniform(torch.nn.Module):
    """Logits of zeros: every target costs exactly ln(vocab) nats."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(self, idx, targets=None):
        return torch.zeros(*idx.shape, self.vocab), None


class Peaked(torch.nn.Module):
    """Logit 2 on token 0, 0 elsewhere: a target costs -log_softmax, which differs for token 0 and the rest."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(self, idx, targets=None):
        logits = torch.zeros(*idx.shape, self.vocab)
        logits[..., 0] = 2.0
        return logits, None


def test_token_bytes_of_both_tokenizers():
    bpe = BPETokenizer(["a", "b", "é"], [("a", "b"), ("ab", "é")], byte_fallback=True)
    tb = bpe.token_bytes()
    assert tb.dtype == np.int64 and len(tb) == bpe.vocab_size == 3 + 2 + 256
    assert tb[:5].tolist() == [1, 1, 2, 2, 4]  # a, b, é (2 bytes), "ab", "abé"
    assert set(tb[5:].tolist()) == {1}  # every byte-fallback token is one byte
    char = CharTokenizer(["\n", "a", "é", "€"])
    assert char.token_bytes().tolist() == [1, 1, 2, 3]


def test_bits_per_byte_matches_a_hand_computation():
    # "aé€b": 'a' 1 byte, 'é' 2 bytes (in the alphabet), '€' 3 bytes (unknown: three byte-fallback tokens), 'b' 1.
    bpe = BPETokenizer(["a", "b", "é"], [], byte_fallback=True)
    ids = bpe.encode("aé€b").numpy()
    euro = [bpe.byte_offset + b for b in "€".encode()]
    assert ids.tolist() == [0, 2, *euro, 1]
    # one window of seq_len + 1 = 6 tokens: the targets are ids[1:] = é, three byte tokens, b
    target_bytes = 2 + 1 + 1 + 1 + 1
    V = bpe.vocab_size
    tb = torch.as_tensor(bpe.token_bytes())
    loss, bpb = evaluate(
        Uniform(V),
        ids,
        batch_size=1,
        seq_len=5,
        batches=1,
        seed=0,
        device=torch.device("cpu"),
        precision="fp32",
        world=World(),
        token_bytes=tb,
    )
    assert loss == pytest.approx(math.log(V), rel=1e-6)
    assert bpb == pytest.approx(5 * math.log(V) / (math.log(2) * target_bytes), rel=1e-6)

    # non-uniform costs: token 0 ('a') is cheap, the others dear; targets "a é a" from the text "aaéa"
    ids = np.array([0, 0, 2, 0])
    cheap = -math.log(math.exp(2) / (math.exp(2) + V - 1))
    dear = -math.log(1 / (math.exp(2) + V - 1))
    nats = cheap + dear + cheap
    loss, bpb = evaluate(
        Peaked(V),
        ids,
        batch_size=3,
        seq_len=3,
        batches=2,
        seed=1,
        device=torch.device("cpu"),
        precision="fp32",
        world=World(),
        token_bytes=tb,
    )
    assert loss == pytest.approx(nats / 3, rel=1e-6)  # each batch repeats the only window
    assert bpb == pytest.approx(nats / (math.log(2) * (1 + 2 + 1)), rel=1e-6)
    _, none = evaluate(
        Peaked(V),
        ids,
        batch_size=1,
        seq_len=3,
        batches=1,
        seed=1,
        device=torch.device("cpu"),
        precision="fp32",
        world=World(),
    )
    assert none is None


def test_flops_per_token_and_mfu():
    chapter = GPT(**CH28_MODEL)
    assert chapter.num_params() == 2_163_264
    assert flops_per_token(chapter, 256) == 6 * 2_163_264 + 12 * 4 * 6 * 32 * 256 == 15_338_880
    part1 = GPT(65)  # learned positions: the 64 x 64 position table is a lookup, not a matmul
    assert flops_per_token(part1, 64) == 6 * (207_296 - 64 * 64) + 12 * 4 * 4 * 16 * 64
    t = throughput(10_000, 15_338_880, 989.0, world_size=2)
    assert t["tflops"] == pytest.approx(0.1533888)
    assert t["mfu"] == pytest.approx(0.1533888 / (2 * 989))
    assert throughput(10_000, 15_338_880, None)["mfu"] is None
    line = format_throughput(10_000, 15_338_880, t["tflops"], t["mfu"], 989.0, "NVIDIA H100 80GB HBM3", 2)
    assert "10,000 tokens/s (2 processes)" in line and "15,338,880 FLOPs/token (6N + 12*L*H*Q*T)" in line
    assert "MFU 0.0% of 2 x 989 TFLOP/s bf16 peak" in line
    assert "MFU n/a (no peak known for cpu)" in format_throughput(1, 1, 0.0, None, None, "no peak known for cpu")


def test_gpu_peak_table_prefers_the_specific_name():
    assert peak_for_name("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_for_name("NVIDIA H100 PCIe") == 756.0
    assert peak_for_name("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_for_name("NVIDIA L40S") == 362.0 and peak_for_name("NVIDIA L4") == 121.0
    assert peak_for_name("NVIDIA H200") == 989.0
    assert peak_for_name("Tesla T4") is None  # no bf16 tensor cores: not in the table


def test_training_memory_is_a_lower_bound_of_what_training_holds():
    """The estimate's parts against the tensors a real training step keeps (one CPU step, fp32)."""
    import torch

    from mygpt.gpt_config import GPTConfig
    from mygpt.metrics import training_memory
    from mygpt.model import GPT

    config = GPTConfig(vocab_size=50, embed_dim=32, num_heads=4, num_kv_heads=2, max_seq_len=64, position_type="rope")
    need = training_memory(config, rows=4, seq_len=64)
    model = GPT(config)
    assert need.state == 16 * model.num_params()  # weights, gradients, AdamW's two moments
    assert need.positions == (model.rope_cos.numel() + model.rope_sin.numel()) * 4
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.numel() * t.element_size()) or t, lambda t: t
    ):
        model(torch.zeros(4, 64, dtype=torch.long), torch.zeros(4, 64, dtype=torch.long))
    assert 0 < need.activations <= sum(saved), "what backward keeps is at least the estimate"
    learned = training_memory(GPTConfig(vocab_size=50, max_seq_len=10**12), rows=1, seq_len=1)
    assert learned.positions == 16 * 10**12 * 64 and learned.state < 16 * 10**6, "a learned table is a parameter"
