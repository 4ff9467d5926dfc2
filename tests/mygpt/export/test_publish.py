"""The export (``export_hf``, ``mygpt export``): the exported model, loaded with ``AutoModelForCausalLM`` (no custom
code), gives mygpt's fp32 logits on held-out text and the same greedy continuation; what cannot be exported
exactly is refused before anything is written, and a failed check leaves the previous export intact."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from mygpt.checkpoint import load_checkpoint, save_checkpoint
from mygpt.cli import main
from mygpt.errors import UserError
from mygpt.export import publish, verify
from mygpt.export.publish import EXPORT_FILES, export_checkpoint, export_hf
from mygpt.generate import generate_ids
from mygpt.model import GPT
from mygpt.tokenizers.char_tokenizer import CharTokenizer
from mygpt.training.config import TrainConfig
from mygpt.training.train import train
from tests.support import REPO

TINY = dict(
    embed_dim=64, num_heads=4, num_kv_heads=2, num_layers=2, max_seq_len=128, norm_type="rms", position_type="rope"
)


@pytest.fixture(scope="module")
def model(skip_tok, wikitext2_text):
    torch.manual_seed(0)
    gpt = GPT(vocab_size=skip_tok.vocab_size, **TINY)
    ids = skip_tok.encode_corpus(wikitext2_text[:200_000])
    train(
        gpt,
        skip_tok,
        ids,
        config=TrainConfig(steps=40, batch_size=8, seq_len=64, lr=3e-3, print_every=0),
        device="cpu",
        log=None,
    )
    return gpt.eval()


@pytest.fixture(scope="module")
def held_out_ids(skip_tok, wikitext2_text):
    """The end of WikiText-2 (the model trained on its first 200k characters), as (4, 128) ids."""
    ids = skip_tok.encode_corpus(wikitext2_text[-60_000:]).astype(np.int64)
    return torch.from_numpy(ids[: 4 * 128].reshape(4, 128))


@pytest.fixture(scope="module")
def exported(model, skip_tok, wikitext2_text, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "hf"
    facts = export_hf(model, skip_tok, out, meta={"run": "test"}, sample_text=wikitext2_text[-20_000:])
    return out, facts


@pytest.fixture(scope="module")
def hf_model(exported):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(exported[0]).eval()


def test_export_writes_the_hf_files_and_reports_its_check(exported, model):
    out, facts = exported
    assert sorted(os.listdir(out)) == sorted(EXPORT_FILES)
    assert not [p for p in os.listdir(out.parent) if p.startswith(".")]  # no staging left behind
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["ArceeForCausalLM"] and config["hidden_act"] == "gelu"
    assert config["num_key_value_heads"] == 2 < config["num_attention_heads"] == 4
    assert facts["num_params"] == model.num_params() and set(facts["files"]) == set(EXPORT_FILES)
    assert facts["check"]["tokenizer_tokens"] > 1000 and facts["check"]["logit_tokens"] == 128
    assert facts["check"]["max_abs_logit_diff"] < 1e-5
    assert facts["meta"] == {"run": "test"}
    assert facts["load"][1] == f"tokenizer = AutoTokenizer.from_pretrained({str(out)!r})"


def test_fp32_logits_match_on_held_out_text(hf_model, model, held_out_ids):
    assert type(hf_model).__name__ == "ArceeForCausalLM"
    assert sum(p.numel() for p in hf_model.parameters()) == model.num_params()
    with torch.no_grad():
        theirs = hf_model(held_out_ids).logits
        ours = model(held_out_ids)[0]
        assert (ours - theirs).abs().max().item() < 1e-5
        assert torch.equal(ours, theirs), "the same fp32 operations in the same order: bit-identical on CPU"


def test_greedy_continuation_is_identical(hf_model, model, held_out_ids):
    prompt = held_out_ids[:1, :32]
    ours = generate_ids(model, prompt, max_new_tokens=64, temperature=0)
    out = hf_model.generate(
        prompt, max_new_tokens=64, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    assert out.sequences.shape == (1, 96)
    assert out.sequences.tolist() == ours.tolist()
    # transformers' KV-cached steps give mygpt's logits for the whole continuation, not just the same argmax
    with torch.no_grad():
        full = model(ours)[0][0, 31:95]
    assert (torch.cat(out.logits) - full).abs().max().item() < 1e-5


def test_autotokenizer_and_sampling_from_the_directory(exported, skip_tok, wikitext2_text):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = str(exported[0])
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    ids = tokenizer(wikitext2_text, add_special_tokens=False)["input_ids"]
    assert ids == skip_tok.encode_corpus(wikitext2_text).tolist()
    prompt = tokenizer(" The history of", return_tensors="pt")["input_ids"]
    torch.manual_seed(0)
    sample = model.generate(prompt, max_new_tokens=24)  # generation_config.json: sampling, top-k 40
    assert sample.shape == (1, prompt.size(1) + 24)
    text = tokenizer.decode(sample[0])
    assert text.startswith(" The history of") and text == skip_tok.decode(sample[0])


# ---- refusals and the CLI ------------------------------------------------------------------------------------
def _part_one_checkpoint(path, text):
    tok = CharTokenizer.from_text(text)
    save_checkpoint(GPT(vocab_size=tok.vocab_size, embed_dim=32, num_heads=4, num_layers=1, max_seq_len=32), tok, path)


def test_part_one_checkpoint_is_refused_and_nothing_is_written(tmp_path, shakespeare_text):
    _part_one_checkpoint(tmp_path / "p1.ckpt", shakespeare_text[:5000])
    with pytest.raises(UserError, match=r"p1\.ckpt cannot be exported exactly: .*norm_type='layer'.*--norm rms"):
        export_checkpoint(tmp_path / "p1.ckpt", tmp_path / "out")
    assert os.listdir(tmp_path) == ["p1.ckpt"]


def test_vocab_mismatch_and_foreign_directory_are_refused(tmp_path, model, skip_tok, fallback_tok):
    message = f"tokenizer has {fallback_tok.vocab_size} tokens but the model's vocab_size is {skip_tok.vocab_size}"
    with pytest.raises(UserError, match=message):
        export_hf(model, fallback_tok, tmp_path / "out")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(UserError, match=r"already holds files that are not part of an export \(pytorch_model.bin\)"):
        export_hf(model, skip_tok, tmp_path / "mine")
    assert sorted(os.listdir(tmp_path)) == ["mine"] and os.listdir(tmp_path / "mine") == ["pytorch_model.bin"]


def test_failed_check_leaves_the_previous_export_intact(tmp_path, exported, model, skip_tok, monkeypatch):
    out = tmp_path / "hf"
    out.mkdir()
    for name in EXPORT_FILES:
        (out / name).write_bytes((exported[0] / name).read_bytes())
    before = {name: (out / name).read_bytes() for name in EXPORT_FILES}

    def broken(*args):
        raise RuntimeError("export check failed: simulated")

    monkeypatch.setattr(verify, "_compare", broken)
    torch.manual_seed(1)
    other = GPT(vocab_size=skip_tok.vocab_size, **TINY)
    with pytest.raises(RuntimeError, match="simulated"):
        export_hf(other, skip_tok, out)
    assert {name: (out / name).read_bytes() for name in EXPORT_FILES} == before
    assert os.listdir(tmp_path) == ["hf"]


def test_cli_export_round_trip(capsys, tmp_path, model, skip_tok, held_out_ids, shakespeare_text):
    from transformers import AutoModelForCausalLM

    save_checkpoint(model, skip_tok, tmp_path / "m.ckpt", meta={"note": "cli"})
    out = tmp_path / "hf"
    shas = []
    for _ in range(2):  # a second export over the first one writes the same bytes
        code = main(["export", "--checkpoint", str(tmp_path / "m.ckpt"), "--out", str(out)])
        stdout, stderr = capsys.readouterr()
        assert code == 0, stderr
        assert stdout.splitlines()[-3:] == ["  " + line for line in publish.load_lines(str(out))]
        shas.append({n: hashlib.sha256((out / n).read_bytes()).hexdigest() for n in EXPORT_FILES})
    assert shas[0] == shas[1]
    reloaded, _ = load_checkpoint(tmp_path / "m.ckpt")
    hf = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        assert (hf(held_out_ids).logits - reloaded(held_out_ids)[0]).abs().max().item() < 1e-5

    _part_one_checkpoint(tmp_path / "p1.ckpt", shakespeare_text[:5000])
    capsys.readouterr()  # transformers' loading bar above
    code = main(["export", "--checkpoint", str(tmp_path / "p1.ckpt"), "--out", str(tmp_path / "p1")])
    stdout, stderr = capsys.readouterr()
    assert code == 2 and stderr.startswith("error: checkpoint ") and "Traceback" not in stderr
    assert "norm_type='layer'" in stderr and not (tmp_path / "p1").exists()


def test_importing_the_module_loads_neither_torch_nor_transformers():
    code = (
        "import sys, mygpt, mygpt.export.publish; "
        "print(sorted(m for m in ('torch', 'transformers', 'tokenizers', 'safetensors') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
