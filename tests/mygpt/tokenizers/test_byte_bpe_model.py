"""A byte-level BPE as a model's tokenizer: its state in tokenizer files and checkpoints, a tiny GPT trained on its
ids (validation in bits per byte), and samples from a prompt of characters the training text never had."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mygpt.checkpoint import load_checkpoint
from mygpt.errors import UserError
from mygpt.generate import generate
from mygpt.gpt_config import GPTConfig
from mygpt.model import GPT
from mygpt.tokenizers.byte_bpe import ByteBPETokenizer
from mygpt.tokenizers.files import load_tokenizer_file, save_tokenizer_file, tokenizer_from_state
from mygpt.training.config import TrainConfig
from mygpt.training.train import train
from tests.support.tiny_model import TINY_MODEL, TINY_TRAIN

PROMPT = "😀 中文 Ωmega"  # none of these characters is in Tiny Shakespeare


@pytest.fixture(scope="module")
def tok(shakespeare_text) -> ByteBPETokenizer:
    return ByteBPETokenizer.train(shakespeare_text[:100_000], 256 + 100 + 1)


def test_state_round_trips_through_a_tokenizer_file_and_bad_states_are_refused(tok, tmp_path):
    save_tokenizer_file(tok, tmp_path / "tok.json")
    assert load_tokenizer_file(tmp_path / "tok.json") == tok
    for bad in ({"merges": [["zz", "61"]], "specials": [], "pattern": "gpt2"}, {"merges": []}, [1, 2]):
        with pytest.raises(UserError, match="byte-level BPE state must be"):
            tokenizer_from_state("byte", bad)
    with pytest.raises(UserError, match="pattern must be one of gpt2, gpt4"):
        tokenizer_from_state("byte", {"merges": [], "specials": [], "pattern": "gpt5"})


def test_token_bytes_count_every_byte_of_the_text(tok, shakespeare_text):
    text = shakespeare_text[100_000:110_000] + PROMPT + "<|endoftext|>"
    ids = tok.encode_array(text, allowed_special=True)
    assert int(tok.token_bytes()[ids].sum()) == len(text.encode("utf-8"))


def test_a_model_trains_on_byte_ids_checkpoints_and_samples_from_any_prompt(tok, shakespeare_text, tmp_path):
    torch.manual_seed(0)
    ids = tok.encode_array(shakespeare_text[:40_000]).astype(np.int64)
    cut = len(ids) * 9 // 10
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, **TINY_MODEL))
    result = train(
        model,
        tok,
        torch.from_numpy(ids[:cut]),
        config=TrainConfig(**TINY_TRAIN),
        val_tokens=torch.from_numpy(ids[cut:]),
        device="cpu",
        checkpoint_path=str(tmp_path / "m.ckpt"),
        log=None,
    )
    assert result.final_val_bpb is not None and 0 < result.final_val_bpb < 8  # bits per byte: token_bytes used
    loaded, loaded_tok = load_checkpoint(str(tmp_path / "m.ckpt"))
    assert loaded_tok == tok and loaded_tok.kind == "byte"
    text = generate(loaded, loaded_tok, PROMPT, max_new_tokens=12, temperature=1.0, top_k=0, device="cpu")
    assert text.startswith(PROMPT) and len(text) > len(PROMPT)
