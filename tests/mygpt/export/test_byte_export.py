"""The export of a model on a byte-level BPE: HF's own byte-level ``tokenizer.json`` (AutoTokenizer gives mygpt's
ids for any text, ``<|endoftext|>`` its EOS), the model's ``generate`` stopping at that token, and tiktoken's
ranks file beside it."""

from __future__ import annotations

import base64
import json
import os

import numpy as np
import pytest
import torch

from mygpt.export.publish import EXPORT_FILES, TIKTOKEN_FILE, export_hf
from mygpt.model import GPT
from mygpt.tokenizers.byte_bpe import ByteBPETokenizer
from mygpt.tokenizers.char_tokenizer import CharTokenizer
from mygpt.training.config import TrainConfig
from mygpt.training.train import train

TINY = dict(
    embed_dim=32, num_heads=4, num_kv_heads=2, num_layers=1, max_seq_len=64, norm_type="rms", position_type="rope"
)
EOT = "<|endoftext|>"
UNSEEN = "😀 中文 Ωμέγα"  # none of these is in Tiny Shakespeare


@pytest.fixture(scope="module")
def exported(shakespeare_text, tmp_path_factory):
    tok = ByteBPETokenizer.train(shakespeare_text[:100_000], 256 + 200 + 1)
    torch.manual_seed(0)
    model = GPT(vocab_size=tok.vocab_size, **TINY)
    ids = tok.encode_array(EOT.join(shakespeare_text[:30_000].split("\n\n")), allowed_special=True)
    config = TrainConfig(steps=10, batch_size=4, seq_len=32, lr=3e-3, print_every=0)
    train(model, tok, ids.astype(np.int64), config=config, device="cpu", log=None)
    out = tmp_path_factory.mktemp("export") / "hf"
    facts = export_hf(model.eval(), tok, out)
    return tok, model, out, facts


def test_auto_tokenizer_gives_our_ids_for_any_text_and_names_the_eos(exported, shakespeare_text):
    from transformers import AutoTokenizer

    tok, _, out, facts = exported
    assert sorted(os.listdir(out)) == sorted((*EXPORT_FILES, TIKTOKEN_FILE))
    assert facts["tokenizer"]["kind"] == "byte" and facts["check"]["tokenizer_tokens"] > tok.vocab_size
    hf = AutoTokenizer.from_pretrained(str(out))
    text = shakespeare_text[200_000:210_000] + UNSEEN + f" {EOT}\n"
    ids = tok.encode_array(text, allowed_special=True).tolist()
    assert hf(text)["input_ids"] == ids and hf.decode(ids) == text
    assert hf.eos_token == EOT and hf.eos_token_id == tok.special_ids[EOT] == 456
    hf_json = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    assert hf_json["model"]["type"] == "BPE" and hf_json["decoder"]["type"] == "ByteLevel"
    assert [s["type"] for s in hf_json["pre_tokenizer"]["pretokenizers"]] == ["Split", "ByteLevel"]


def test_generate_stops_at_the_end_of_a_document(exported):
    from transformers import AutoModelForCausalLM

    tok, _, out, _ = exported
    hf = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert hf.config.eos_token_id == hf.generation_config.eos_token_id == 456
    prompt = torch.from_numpy(tok.encode_array(UNSEEN).astype(np.int64))[None]
    from transformers import LogitsProcessor, LogitsProcessorList

    class FavourEot(LogitsProcessor):  # EOT the most likely token: greedy decoding must produce it and stop
        def __call__(self, input_ids, scores):
            scores[:, 456] += 1e4
            return scores

    got = hf.generate(prompt, max_new_tokens=20, do_sample=False, logits_processor=LogitsProcessorList([FavourEot()]))
    assert got[0, -1].item() == 456 and got.shape[1] == prompt.shape[1] + 1  # stopped right after EOT


def test_tiktoken_file_holds_every_ordinary_token_by_rank(exported):
    tok, _, out, _ = exported
    ranks = {}
    for line in (out / TIKTOKEN_FILE).read_text(encoding="ascii").splitlines():  # load_tiktoken_bpe's format
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    assert ranks == {tok.vocab[i]: i for i in range(tok.special_base)}
    import tiktoken  # a test dependency: the file must load in tiktoken itself, not only parse
    from tiktoken.load import load_tiktoken_bpe

    from mygpt.tokenizers.byte_bpe_reference import GPT2_PATTERN

    enc = tiktoken.Encoding(
        "mygpt", pat_str=GPT2_PATTERN, mergeable_ranks=load_tiktoken_bpe(str(out / TIKTOKEN_FILE)),
        special_tokens=tok.special_ids,
    )  # fmt: skip
    text = UNSEEN + " hello there"
    assert enc.encode(text) == tok.encode_array(text).tolist()


def test_a_chapter_export_over_a_byte_one_leaves_no_tiktoken_file(exported, tmp_path):
    import shutil

    out = exported[2]

    again = tmp_path / "again"
    shutil.copytree(out, again)
    chars = CharTokenizer.from_text("abc ")
    torch.manual_seed(0)
    export_hf(GPT(vocab_size=chars.vocab_size, **TINY).eval(), chars, again)
    assert sorted(os.listdir(again)) == sorted(EXPORT_FILES)
