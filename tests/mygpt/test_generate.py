"""generate(): KV-cached path == uncached path, context overflow, seeding, prompt validation."""

from __future__ import annotations

import pytest
import torch

from mygpt import GPT, CharTokenizer, TrainConfig, UserError
from mygpt.generate import generate, generate_ids
from mygpt.training.train import train
from tests.support.ending_model import ending_model


@pytest.fixture(scope="module")
def tok(shakespeare_text):
    return CharTokenizer.from_text(shakespeare_text)


@pytest.fixture(scope="module")
def tokens(tok, shakespeare_text):
    return tok.encode_array(shakespeare_text[:200_000])


_TRAINED: dict = {}


def _model(tok, position_type, norm_type="layer", kv=None, max_seq_len=24, tokens=None):
    """A tiny model trained for a few dozen steps, so its next-token distributions look like a real model's."""
    key = (position_type, norm_type, kv, max_seq_len)
    if key not in _TRAINED:
        torch.manual_seed(0)
        model = GPT(
            vocab_size=tok.vocab_size,
            embed_dim=32,
            num_heads=4,
            num_kv_heads=kv,
            num_layers=2,
            max_seq_len=max_seq_len,
            norm_type=norm_type,
            position_type=position_type,
        )
        if tokens is not None:
            cfg = TrainConfig(steps=150, batch_size=16, seq_len=max_seq_len, lr=1e-2, print_every=0)
            train(model, tok, tokens, config=cfg, device="cpu", log=None)
        _TRAINED[key] = model
    return _TRAINED[key]


@pytest.mark.parametrize("position_type, norm_type, kv", [("learned", "layer", None), ("rope", "rms", 2)])
@pytest.mark.parametrize("temperature, top_k", [(0.0, 0), (1.0, 40), (0.8, 5)])
def test_cached_equals_uncached_including_past_max_seq_len(
    tok, tokens, position_type, norm_type, kv, temperature, top_k
):
    model = _model(tok, position_type, norm_type, kv, tokens=tokens)
    # prompt 6 tokens + 50 new: the sequence passes max_seq_len (24) and the window has to slide
    kwargs = dict(max_new_tokens=50, temperature=temperature, top_k=top_k, seed=11, device="cpu")
    cached = generate(model, tok, "ROMEO:", use_cache=True, **kwargs)
    uncached = generate(model, tok, "ROMEO:", use_cache=False, **kwargs)
    assert cached == uncached
    assert cached.startswith("ROMEO:") and len(cached) == 56


def test_cache_is_really_used_then_falls_back_to_the_window(tok):
    model = _model(tok, "rope", "rms", 2, max_seq_len=16)
    seen = []
    model.token_embedding.register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape[1]))
    prompt = tok.encode("KING:").view(1, -1)  # 5 tokens
    out = generate_ids(model, prompt, max_new_tokens=15, temperature=0.0, use_cache=True)
    assert out.shape == (1, 20)
    # prefill 5, then one token per step up to length 16, then full 16-token windows
    assert seen == [5] + [1] * 11 + [16] * 3
    seen.clear()
    ref = generate_ids(model, prompt, max_new_tokens=15, temperature=0.0, use_cache=False)
    assert seen == [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 16, 16, 16]
    assert torch.equal(out, ref)


def test_prompt_longer_than_context(tok, shakespeare_text):
    model = _model(tok, "learned", max_seq_len=24)
    prompt = shakespeare_text[:100]
    a = generate(model, tok, prompt, max_new_tokens=10, device="cpu", use_cache=True)
    b = generate(model, tok, prompt, max_new_tokens=10, device="cpu", use_cache=False)
    assert a == b and a.startswith(prompt) and len(a) == 110


def test_seeding(tok, tokens):
    model = _model(tok, "learned", tokens=tokens)
    a = generate(model, tok, "\n", max_new_tokens=40, seed=1, device="cpu")
    assert a == generate(model, tok, "\n", max_new_tokens=40, seed=1, device="cpu")
    assert a != generate(model, tok, "\n", max_new_tokens=40, seed=2, device="cpu")
    # top_k=1 is greedy whatever the seed
    assert generate(model, tok, "\n", max_new_tokens=20, top_k=1, seed=1, device="cpu") == generate(
        model, tok, "\n", max_new_tokens=20, temperature=0.0, seed=2, device="cpu"
    )
    assert generate(model, tok, "ab", max_new_tokens=0, device="cpu") == "ab"


def test_bf16_generation_runs_on_cpu(tok):
    model = _model(tok, "rope", "rms", 2)
    out = generate(model, tok, "To be", max_new_tokens=10, device="cpu", precision="bf16")
    assert out.startswith("To be") and len(out) == 15
    assert next(model.parameters()).dtype == torch.float32  # autocast, weights untouched


def test_bad_prompts_and_settings(tok):
    model = _model(tok, "learned")
    with pytest.raises(UserError) as err:
        generate(model, tok, "naïve café €", max_new_tokens=5, device="cpu")
    msg = str(err.value)
    assert "'ï' (U+00EF)" in msg and "'é' (U+00E9)" in msg and "'€' (U+20AC)" in msg and "prompt" in msg
    with pytest.raises(UserError, match="empty"):
        generate(model, tok, "", device="cpu")
    with pytest.raises(UserError, match="temperature"):
        generate(model, tok, "a", temperature=-1.0, device="cpu")
    with pytest.raises(UserError, match="top_k"):
        generate(model, tok, "a", top_k=-3, device="cpu")
    with pytest.raises(UserError, match="max_new_tokens"):
        generate(model, tok, "a", max_new_tokens=-1, device="cpu")


@pytest.fixture(scope="module")
def byte_tok(shakespeare_text):
    from mygpt.tokenizers.byte_bpe import ByteBPETokenizer

    return ByteBPETokenizer.train(shakespeare_text[:20_000], 256 + 30 + 1)


def test_generation_stops_at_endoftext_and_says_so(byte_tok):
    from mygpt.generate import EOS, generate_sample

    prompt = "ROMEO: What light"
    model, unstopped, n = ending_model(byte_tok, prompt)
    eos = byte_tok.special_ids[EOS]
    assert unstopped[n - 1] == eos and eos not in unstopped[: n - 1]
    ids = byte_tok.encode(prompt).view(1, -1)
    out = generate_ids(model, ids, max_new_tokens=24, temperature=0, stop_ids=(eos,))[0, ids.size(1) :].tolist()
    assert out == unstopped[:n]  # the stop token kept as the last, nothing after it
    made = generate_sample(model, byte_tok, prompt, max_new_tokens=24, temperature=0, device="cpu")
    assert made.stopped_at == EOS and made.new_tokens == n
    assert made.text == prompt + byte_tok.decode(unstopped[: n - 1]) and EOS not in made.text
    shorter = generate_sample(model, byte_tok, prompt, max_new_tokens=n - 1, temperature=0, device="cpu")
    assert shorter.stopped_at is None and shorter.new_tokens == n - 1 and shorter.text == made.text
    assert generate(model, byte_tok, prompt, max_new_tokens=24, temperature=0, device="cpu") == made.text
