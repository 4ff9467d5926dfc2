"""An export loaded back with transformers' Auto classes and compared with mygpt: ids, decoding, fp32 logits."""

from __future__ import annotations

from mygpt.export.tokenizer import outside_char, parts

#: The same fp32 operations in the same order give bit-identical logits on CPU: more is a mapping bug.
LOGIT_TOLERANCE = 1e-6


def _probe_text(tokenizer) -> str:
    """Every vocabulary string once, with an out-of-alphabet character after every third one (a byte-level BPE:
    every token's bytes as text, characters from every script, its specials)."""
    if tokenizer.kind == "byte":
        ordinary = b"".join(tokenizer.vocab[i] for i in range(tokenizer.special_base)).decode("utf-8", "replace")
        return ordinary + " 😀 中文 Ωμέγα \t\n\n " + " x ".join(tokenizer.specials)
    chars, merges, _ = parts(tokenizer)
    outside = outside_char(chars)
    strings = chars + [a + b for a, b in merges]
    return "".join(s + (outside if i % 3 == 2 else "") for i, s in enumerate(strings))


def _mygpt_ids(tokenizer, text: str) -> list[int]:
    if tokenizer.kind == "byte":  # HF's tokenizers always match the specials in text
        return tokenizer.encode_array(text, allowed_special=True).tolist()
    if tokenizer.kind == "char":
        return tokenizer.encode_array("".join(c for c in text if c in tokenizer.stoi)).tolist()
    return tokenizer.encode_corpus(text, unk_policy="skip").tolist()


def verify(directory: str, model, tokenizer, sample_text: str | None) -> dict:
    """Load ``directory`` with the Auto classes; compare ids, decoding and fp32 logits with mygpt's."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # the check's long probe and loading bars are not news for the user
    hf_logging.disable_progress_bar()
    try:
        return _compare(directory, model, tokenizer, sample_text)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _compare(directory: str, model, tokenizer, sample_text: str | None) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mygpt.model import GPT

    text = sample_text if sample_text else _probe_text(tokenizer)
    want = _mygpt_ids(tokenizer, text)
    hf_tok = AutoTokenizer.from_pretrained(directory)
    got = hf_tok(text, add_special_tokens=False)["input_ids"]
    if got != want:
        at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        raise RuntimeError(f"export check failed: the HF tokenizer's ids differ from mygpt's at token {at}")
    if hf_tok.decode(want) != tokenizer.decode(want):
        raise RuntimeError("export check failed: the HF tokenizer decodes mygpt's ids to a different text")

    reference = GPT(model.gpt_config)
    reference.load_state_dict({k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()})
    reference.eval()
    hf_model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    hf_model.eval()
    ids = torch.tensor(want[: model.max_seq_len] or [0], dtype=torch.long)[None]
    with torch.no_grad():
        diff = float((reference(ids)[0] - hf_model(ids).logits).abs().max())
    if not diff <= LOGIT_TOLERANCE:
        raise RuntimeError(
            f"export check failed: transformers' logits differ from mygpt's by {diff:.3g} "
            "(a weight or config mapping error)"
        )
    return {"tokenizer_tokens": len(want), "logit_tokens": int(ids.size(1)), "max_abs_logit_diff": diff}


def check_documents(directory: str, documents: list[str], want, end: str, whole: bool) -> int:
    """The tokenizer of the export at ``directory`` (as ``AutoTokenizer`` loads it) encodes each of ``documents``
    as plain text, the special ``end`` after each, to exactly the start of ``want`` (the ids the training data
    holds for that text; all of it when ``whole``); ``RuntimeError`` naming the first document and token that
    differ. Returns the tokens compared. Why beside :func:`verify`'s probe: the probe holds each vocabulary string
    once, not the text the model learned from, so a disagreement only real text has (a special inside an article)
    would pass it."""
    import numpy as np
    from transformers import AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(directory)
    end_id = hf_tok.convert_tokens_to_ids(end)
    want = np.asarray(want, dtype=np.int64)
    done = 0
    for n, ids in enumerate(hf_tok(documents, add_special_tokens=False)["input_ids"] if documents else []):
        got = np.asarray([*ids, end_id], dtype=np.int64)
        part = want[done : done + got.size]
        if part.size != got.size or not np.array_equal(part, got):
            at = int(np.argmax(part[: got.size] != got[: part.size])) if min(part.size, got.size) else 0
            raise RuntimeError(
                f"export check failed: the HF tokenizer's ids for document {n} of the corpus text differ from the "
                f"training data's at token {done + at} (it gives {got[at : at + 3].tolist()}, the shards hold "
                f"{part[at : at + 3].tolist()}): the export would not tokenize text as the model learned it"
            )
        done += got.size
    if whole and done != want.size:
        raise RuntimeError(
            f"export check failed: the corpus text gives {done} ids, the training data holds {want.size}"
        )
    return done
