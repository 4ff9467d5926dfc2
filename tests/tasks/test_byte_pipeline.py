"""The tiny pipeline with ``tokenizer.kind=byte``, every stage outside Prefect: shards that end each article with
<|endoftext|>, a model, samples from prompts no training text had, an export that transformers and tiktoken load
with the same ids, and evaluate's bits per byte over the test text's own bytes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from flows.settings import TINY, Pipeline
from tasks.core import shard_format as SF
from tasks.evaluate import evaluate_model
from tasks.tokenizer import load_tokenizer
from tests.support.stages import every_stage
from tests.support.tiny import run_in, tiny_zip_url

PROMPTS = ("The history of", "東京 🚀 café")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("byte-pipeline")
    s = Pipeline.parse(
        **{
            **TINY,
            "corpus": {"source_url": tiny_zip_url(tmp)},
            "tokenizer": {**TINY["tokenizer"], "kind": "byte"},
            "samples": {**TINY["samples"], "prompt": list(PROMPTS)},
        }
    )
    run = run_in(tmp / "art")
    refs = every_stage(s, run)
    return refs


def manifest(ref) -> dict:
    return json.loads((Path(ref["path"]) / "manifest.json").read_text(encoding="utf-8"))


def test_shards_and_model_use_the_byte_tokenizer(pipeline):
    tok = load_tokenizer(pipeline["tokenizer"]["path"])
    assert tok.kind == "byte" and tok.vocab_size == 256 + TINY["tokenizer"]["num_merges"] + 1
    assert manifest(pipeline["corpus"])["settings"]["article_index"] is True
    eot = tok.special_ids["<|endoftext|>"]
    corpus = Path(pipeline["corpus"]["path"])
    ids = np.concatenate([SF.read_shard(p) for p in SF.shard_paths(pipeline["shards"]["path"], "valid")])
    assert int((ids == eot).sum()) == len(np.load(corpus / "wiki.valid.articles.npy")) and ids[-1] == eot
    from mygpt.checkpoint import load_checkpoint

    model, mtok = load_checkpoint(Path(pipeline["model"]["path"]) / "model.ckpt")
    assert mtok == tok and model.vocab_size == tok.vocab_size


def test_samples_continue_prompts_with_characters_no_training_text_had(pipeline):
    samples = manifest(pipeline["samples"])["metrics"]["samples"]
    assert [s["prompt"] for s in samples] == [s["used_prompt"] for s in samples] == list(PROMPTS)
    assert all(s["continuation"] for s in samples)


def test_export_loads_with_autotokenizer_and_tiktoken_gives_the_same_ids(pipeline, wikitext2_text):
    import tiktoken
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mygpt.checkpoint import load_checkpoint

    info = manifest(pipeline["export"])
    assert info["metrics"]["check"]["max_abs_logit_diff"] <= 1e-6
    out = Path(pipeline["export"]["path"])
    tok = load_tokenizer(pipeline["tokenizer"]["path"])
    hf_tok = AutoTokenizer.from_pretrained(out)
    text = wikitext2_text[200_000:203_000] + " 東京 🚀 café"  # characters the tiny training slice never had
    want = tok.encode_array(text).tolist()
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == want
    ended = tok.encode_array(text + "<|endoftext|>", allowed_special=True).tolist()
    assert hf_tok(text + "<|endoftext|>", add_special_tokens=False)["input_ids"] == ended == [*want, tok.vocab_size - 1]
    assert hf_tok.eos_token == "<|endoftext|>" and hf_tok.eos_token_id == tok.special_ids["<|endoftext|>"]
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(out / "tokenizer.tiktoken"))
    enc = tiktoken.Encoding(
        name="byte", pat_str=tok_pattern(tok), mergeable_ranks=ranks, special_tokens=tok.special_ids
    )
    assert enc.encode_ordinary(text) == want
    assert enc.encode(text + "<|endoftext|>", allowed_special="all") == ended
    model, _ = load_checkpoint(Path(pipeline["model"]["path"]) / "model.ckpt")
    hf_model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    window = torch.tensor(want[: model.max_seq_len])[None]
    with torch.no_grad():
        assert torch.equal(hf_model(window).logits, model(window)[0])


def tok_pattern(tok) -> str:
    from mygpt.tokenizers.byte_bpe_reference import PATTERNS

    return PATTERNS[tok.pattern]


def test_evaluate_counts_the_test_texts_own_bytes(pipeline):
    m = manifest(pipeline["evaluate"])["metrics"]
    assert m["test_bpb"] is not None and m["test_bpb"] > 0
    tok = load_tokenizer(pipeline["tokenizer"]["path"])
    ids = np.concatenate([SF.read_shard(p) for p in SF.shard_paths(pipeline["shards"]["path"], "test")])
    used = ids[1 : m["tokens_evaluated"] + 1]
    vocab = tok.vocab
    specials = set(tok.special_ids.values())
    assert m["bytes_evaluated"] == sum(len(vocab[int(i)]) for i in used if int(i) not in specials)


def covered_bytes(evaluate_ref, shards_ref, tokenizer) -> tuple[int, int]:
    """``(bytes of text the evaluated ids stand for, the longest token's bytes)``, from the published test shards."""
    from tasks.evaluate import text_bytes_per_token

    m = manifest(evaluate_ref)["metrics"]
    ids = np.concatenate([SF.read_shard(p) for p in SF.shard_paths(shards_ref["path"], "test")])
    sizes = text_bytes_per_token(tokenizer)
    used = ids[: m["tokens_evaluated"] + 1]  # the first is context only
    assert m["bytes_evaluated"] == int(sizes[used[1:]].sum())
    return int(sizes[used].sum()), int(sizes.max())


def test_the_tiny_preset_evaluates_the_same_text_for_both_kinds(pipeline, upstream, trained):
    """Bits per byte of the two kinds compare over the same test text: the tiny preset bounds it in bytes."""
    from mygpt.checkpoint import load_checkpoint

    bound = TINY["evaluate"]["max_bytes"]
    root, corpus, _, shards = upstream
    chapter = evaluate_model.fn(corpus, shards, trained, Pipeline.parse(**TINY).resolved("evaluate"), run_in(root))
    _, chapter_tok = load_checkpoint(Path(trained["path"]) / "model.ckpt")
    for ref, shards_ref, tok in (
        (pipeline["evaluate"], pipeline["shards"], load_tokenizer(pipeline["tokenizer"]["path"])),
        (chapter, shards, chapter_tok),
    ):
        covered, longest = covered_bytes(ref, shards_ref, tok)
        assert bound - longest < covered <= bound  # the first max_bytes of wiki.test.txt, to a token's length


def test_the_export_proves_its_tokenizer_gives_the_shards_ids_on_the_test_split(pipeline):
    """The export compares its Hugging Face tokenizer with the shards on real corpus text, every article of the test
    split, not only on a probe of the vocabulary: the metrics name how many of the shards' ids it matched, and a
    training datum that differs by one id fails the check naming where."""
    from mygpt.export.verify import check_documents
    from tasks.corpora.splits import split_files
    from tasks.shards import document_ends

    want = np.concatenate([SF.read_shard(p) for p in SF.shard_paths(pipeline["shards"]["path"], "test")])
    assert manifest(pipeline["export"])["metrics"]["check"]["corpus_tokens"] == want.size > 0
    corpus = Path(pipeline["corpus"]["path"])
    text = (corpus / "wiki.test.txt").read_bytes()
    ends = document_ends(corpus, {f.split: f for f in split_files(manifest(pipeline["corpus"]))}["test"], len(text), {})
    documents = [text[a:b].decode("utf-8") for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    out = str(pipeline["export"]["path"])
    assert check_documents(out, documents, want, "<|endoftext|>", whole=True) == want.size
    changed = want.copy()
    changed[want.size // 2] = (changed[want.size // 2] + 1) % 256
    with pytest.raises(RuntimeError, match=rf"differ from the training data's at token {want.size // 2} "):
        check_documents(out, documents, changed, "<|endoftext|>", whole=True)
