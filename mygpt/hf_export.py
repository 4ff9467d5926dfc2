"""Export a mygpt model and its tokenizer as a Hugging Face directory that loads with no custom code.

The directory holds ``tokenizer.json`` + ``tokenizer_config.json`` (the ``tokenizers`` library's own format,
read by ``AutoTokenizer``), ``config.json`` + ``generation_config.json`` + ``model.safetensors`` (read by
``AutoModelForCausalLM``; ``trust_remote_code`` stays off)::

    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained("DIR")
    model = AutoModelForCausalLM.from_pretrained("DIR")

Every export is checked before it is published: the files are written to a staging directory beside the
target, loaded back with ``AutoTokenizer`` / ``AutoModelForCausalLM``, and their token ids and fp32 logits are
compared with mygpt's on a probe text; only then are they moved into place (``config.json`` last, so a
directory without it is an unfinished export). What cannot be mapped exactly is refused by
:func:`check_exportable` before anything is written. There is no ``special_tokens_map.json``: mygpt's
tokenizers have no special tokens (no BOS, EOS or padding token), so ``generate`` runs to its length limit
and padding a batch needs a pad token the caller chooses.

The model: why ``ArceeForCausalLM``
-----------------------------------
mygpt's GPT (the chapter-28 model, ``norm_type="rms"``, ``position_type="rope"``) is, per block,
``x + o(attn(RoPE(q(n1(x))), RoPE(k(n1(x))), v(n1(x))))`` then ``x + proj(gelu(fc(n2(x))))``, with RMSNorm
(eps 1e-5, computed in fp32, weight only), RoPE in the half-split layout (dims i and i + D/2 rotate together,
base 10000), grouped-query attention (kv head j serves query heads ``j*g .. j*g+g-1``), bias-free q/k/v/o
projections, an MLP ``Linear(E, 4E) -> GELU (exact erf) -> Linear(4E, E)`` with biases, a final RMSNorm and an
LM head tied to the token embedding.

transformers 5.23's ``ArceeForCausalLM`` (``models/arcee/modeling_arcee.py``) is that network term for term
with ``hidden_act="gelu"`` (``GELUActivation`` = ``torch.nn.functional.gelu``, the exact erf form),
``mlp_bias=True``, ``attention_bias=False``, ``intermediate_size=4E``, ``rms_norm_eps=1e-5``,
``rope_parameters={"rope_type": "default", "rope_theta": 10000}`` and ``tie_word_embeddings=True``:
``ArceeMLP`` is the non-gated ``down_proj(act(up_proj(x)))``; ``ArceeRMSNorm`` normalises in fp32;
``rotate_half`` + ``cat((freqs, freqs))`` is the half-split rotation; ``repeat_kv`` repeats each kv head over
its consecutive group of query heads; the decoder layer is pre-norm with the same two residual adds. The
weights map one to one (table in :data:`WEIGHT_NAMES`), with no extra parameters.

The alternatives considered:

* ``LlamaForCausalLM``: Llama's MLP is gated (``down(act(gate(x)) * up(x))``). It reproduces ours only with a
  trick -- gate = our fc, up weight 0 and up bias 1 -- that adds ``4E x E`` zero weights per layer (+27% parameters
  at the chapter's config) to every copy of the model. Its one advantage is reach: vLLM's own Arcee
  implementation accepts only ``hidden_act="relu2"`` (vllm ``model_executor/models/arcee.py``), so an
  Arcee export with GELU loads in transformers but not in vLLM. If vLLM serving becomes a goal, a Llama
  target with that trick is the way; this module does not write one.
* GPT-2 / GPT-NeoX / Phi / StableLM: LayerNorm or learned positions or parallel blocks -- not our math.

mygpt computes its RoPE tables the way transformers does (``position * inv_freq`` in fp32), and everything
else is the same fp32 operations in the same order, so the two models' fp32 logits are bit-identical on CPU.
The export checks that on held-out text (``max_abs_logit_diff`` must be <= :data:`LOGIT_TOLERANCE`; more is a
mapping bug). (Before mygpt's tables followed transformers', mygpt rounded fp64 angles and trained models
differed by up to ~1e-5.)

Context: mygpt's ``generate`` slides a ``max_seq_len`` window once a sequence outgrows it; transformers
keeps counting positions past ``max_position_embeddings``. Within ``max_seq_len`` tokens the two agree.

The tokenizer
-------------
A :class:`~mygpt.tokenizers.bpe.BPETokenizer` becomes HF's ``BPE`` model with ``vocab`` = mygpt's ids and ``merges`` in
mygpt's order (rank = position), no normaliser, a ``Sequence`` of ``Split`` pre-tokenisers and a decoder
that joins the tokens (``Fuse``; ``ByteFallback`` first for byte-fallback tokenizers). Ids are mygpt's ids.

* Words: ``Split(\\s*\\S+|\\s+, "isolated")`` -- the project's regex, with ``\\s`` spelled out as the exact
  set of code points Python's ``re`` calls whitespace (HF's Oniguruma engine has its own idea of ``\\s``).
* Unknown characters (no byte fallback): mygpt drops a character that is not in the alphabet but keeps it as a
  barrier (``aZb`` -> ``a``, ``b``, never ``ab``); HF's BPE drops it and then merges across the gap. A second
  ``Split`` whose pattern is the complement of the alphabet, with behaviour ``"removed"``, cuts the word at
  each such character and drops it: the barrier, exactly.
* Byte fallback: mygpt's 256 byte tokens come after the merges, named ``<0x00>``..``<0xFF>``; HF's BPE
  ``byte_fallback`` uses exactly those names. A character or merge whose string *is* such a name cannot
  share HF's string-keyed vocab with the byte token, so that tokenizer is refused.
* Two merges with the same string (two ids, one string): mygpt's encoders always emit the later id
  (``stoi``), and so does HF's BPE, whose vocab holds that string once, at the later id. The earlier id
  gets a placeholder name (a character outside the alphabet around its id: the encoder can never produce
  it) and a ``Replace`` decoder that turns it back into its string, so decoding stays exact. HF applies
  merges from a priority queue where mygpt runs one merge round at a time; the two agree whenever a merge
  never creates a pair of lower rank than itself, which holds by construction unless a repeated string is
  used by a merge ranked before its repeat. That case (never seen from the trainers here) is refused.

The ``CharTokenizer`` is mapped as a BPE with no merges. ``tokenizers`` drops a character outside the
alphabet where mygpt's ``CharTokenizer.encode`` raises; on every text mygpt accepts the ids are the same.
Decoding an id sequence that holds an *invalid* UTF-8 byte run (which the encoder never produces) differs
in the U+FFFD it prints: HF's ``ByteFallback`` writes one per byte, Python's ``"replace"`` one per bad run.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
import time

from mygpt.atomic import atomic_write_bytes, fsync_dir, sha256_file
from mygpt.errors import UserError, describe_chars

__all__ = [
    "ARCHITECTURE",
    "EXPORT_FILES",
    "MODEL_TYPE",
    "WEIGHT_NAMES",
    "check_exportable",
    "export_checkpoint",
    "export_hf",
    "hf_config",
    "hf_state_dict",
    "hf_tokenizer_json",
    "load_lines",
]

ARCHITECTURE = "ArceeForCausalLM"
MODEL_TYPE = "arcee"
#: Files an export writes, in publishing order (``config.json`` last: it marks a finished export).
EXPORT_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "model.safetensors", "config.json")
#: mygpt parameter name -> transformers parameter name (``{i}`` = layer index).
WEIGHT_NAMES = {
    "token_embedding.weight": "model.embed_tokens.weight",
    "blocks.{i}.norm1.weight": "model.layers.{i}.input_layernorm.weight",
    "blocks.{i}.attn.q_proj.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blocks.{i}.attn.k_proj.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blocks.{i}.attn.v_proj.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blocks.{i}.attn.o_proj.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blocks.{i}.norm2.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blocks.{i}.mlp.fc.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blocks.{i}.mlp.fc.bias": "model.layers.{i}.mlp.up_proj.bias",
    "blocks.{i}.mlp.proj.weight": "model.layers.{i}.mlp.down_proj.weight",
    "blocks.{i}.mlp.proj.bias": "model.layers.{i}.mlp.down_proj.bias",
    "norm_f.weight": "model.norm.weight",
}
RMS_NORM_EPS = 1e-5  # mygpt.model.RMSNorm's default, the only value make_norm uses
ROPE_THETA = 10000.0  # mygpt.model.rope_tables' default base, the only value GPT uses
#: The export's logit check: the two models compute the same fp32 operations in the same order (bit-identical
#: logits on CPU); more than this (other hardware, other kernels) is a mapping bug.
LOGIT_TOLERANCE = 1e-6


# ---------------------------------------------------------------------------------------------------
# What can be exported
# ---------------------------------------------------------------------------------------------------


def check_exportable(config, tokenizer=None) -> None:
    """Raise ``UserError`` unless the model of ``config`` (a :class:`mygpt.model.GPTConfig`) and ``tokenizer``
    map exactly onto the HF export: the one home of that rule.

    Checks, in order: the model is the chapter-28 kind (``norm_type="rms"``, ``position_type="rope"``), the
    tokenizer is a char or BPE tokenizer whose vocab size is the model's, and the tokenizer has nothing HF's BPE
    cannot reproduce (see the module docstring). Without ``tokenizer`` only the model is checked (settings,
    before any tokenizer exists). Writes nothing.
    """
    norm, position = config.norm_type, config.position_type
    if norm != "rms" or position != "rope":
        raise UserError(
            f"the model uses norm_type={norm!r} and position_type={position!r}; only the chapter-28 model "
            f"(norm_type='rms', position_type='rope') maps exactly onto a transformers architecture "
            f"({ARCHITECTURE}). Train with --norm rms --position rope (the pipeline's default) to export"
        )
    if tokenizer is None:
        return
    kind = getattr(tokenizer, "kind", None)
    if kind not in ("bpe", "char"):
        raise UserError(
            f"the tokenizer is a {type(tokenizer).__name__}; only mygpt's 'bpe' and 'char' tokenizers can be exported"
        )
    vocab_size = config.vocab_size
    if tokenizer.vocab_size != vocab_size:
        raise UserError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but the model's vocab_size is {vocab_size}; "
            f"export the tokenizer the model was trained with"
        )
    _tokenizer_plan(tokenizer)  # raises UserError for what HF's BPE cannot reproduce


def _parts(tokenizer) -> tuple[list[str], list[tuple[str, str]], bool]:
    """``(chars, merges, byte_fallback)``; a char tokenizer is a BPE with no merges."""
    if tokenizer.kind == "char":
        return list(tokenizer.chars), [], False
    return list(tokenizer.chars), list(tokenizer.merges), bool(tokenizer.byte_fallback)


def _tokenizer_plan(tokenizer) -> dict:
    """The checked facts the HF tokenizer is built from: ``chars``, ``merges``, ``byte_fallback``,
    ``names`` (HF token string per mygpt id) and ``placeholders`` (earlier id of a repeated string -> string).

    Raises ``UserError`` naming the tokens HF's BPE cannot hold or reproduce.
    """
    chars, merges, byte_fallback = _parts(tokenizer)
    surrogates = [c for c in chars if 0xD800 <= ord(c) <= 0xDFFF]
    if surrogates:
        raise UserError(
            f"the tokenizer's alphabet holds lone surrogate code points {describe_chars(surrogates)}, which "
            f"Hugging Face tokenizers (Rust strings) cannot hold; retrain the tokenizer on valid UTF-8 text"
        )
    strings = chars + [a + b for a, b in merges]
    if byte_fallback:
        byte_names = {f"<0x{b:02X}>" for b in range(256)}
        clash = sorted({s for s in strings if s in byte_names})
        if clash:
            raise UserError(
                f"the tokenizer has ordinary tokens named like byte tokens ({', '.join(map(repr, clash))}); with "
                f"byte_fallback Hugging Face's vocab would need the same name twice; retrain the tokenizer "
                f"without byte_fallback or on text where these strings are rare"
            )
    later = {s: i for i, s in enumerate(strings)}  # mygpt's stoi: the later id wins
    repeated = {i: s for i, s in enumerate(strings) if later[s] != i}
    if repeated:
        _check_repeats_in_order(merges)
    names = list(strings)
    if repeated:
        mark = _outside_char(chars)
        for i in repeated:
            names[i] = f"{mark}{i}{mark}"
    if byte_fallback:
        names += [f"<0x{b:02X}>" for b in range(256)]
    return {"chars": chars, "merges": merges, "byte_fallback": byte_fallback, "names": names, "placeholders": repeated}


def _check_repeats_in_order(merges: list[tuple[str, str]]) -> None:
    """Refuse a repeated string that a merge uses before the repeat's own rank (see the module docstring).

    HF's BPE merges from a priority queue, mygpt one rank per round; they agree as long as merging rank ``r``
    only ever creates pairs of rank > ``r``. A new pair always holds the merged string ``m``; a merge that uses
    ``m`` is ranked after ``m`` first appears, so only a *repeat* of ``m`` ranked after such a use breaks this.
    """
    made: dict[str, int] = {}
    first_use: dict[str, int] = {}
    for rank, (a, b) in enumerate(merges):
        m = a + b
        if m in made and first_use.get(m, rank) < rank:
            use = first_use[m]
            raise UserError(
                f"the tokenizer's merge #{rank} {[a, b]!r} makes {m!r} again (merge #{made[m]} made it first), and "
                f"merge #{use} {list(merges[use])!r} uses {m!r} in between; Hugging Face's BPE would apply the "
                f"merges in a different order there, so the export could not reproduce the ids. Retrain the "
                f"tokenizer (BPETokenizer.from_corpus) and export that one"
            )
        made.setdefault(m, rank)
        first_use.setdefault(a, rank)
        first_use.setdefault(b, rank)


def _outside_char(chars: list[str]) -> str:
    """A private-use character that is not in ``chars`` (for placeholder token names)."""
    taken = set(chars)
    for cp in range(0xE000, 0xF900):
        if chr(cp) not in taken:
            return chr(cp)
    raise UserError("the tokenizer's alphabet holds the whole private-use area; it cannot be exported")


# ---------------------------------------------------------------------------------------------------
# The tokenizer
# ---------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _python_whitespace() -> tuple[int, ...]:
    """Every code point that Python's ``re`` (the project's pre-tokeniser) matches with ``\\s``."""
    everything = "".join(map(chr, range(0x110000)))
    return tuple(ord(c) for c in re.findall(r"\s", everything))


def _char_class(codepoints) -> str:
    """The body of a regex character class (Oniguruma syntax) holding exactly ``codepoints``."""
    cps = sorted(set(codepoints))
    parts: list[str] = []
    i = 0
    while i < len(cps):
        j = i
        while j + 1 < len(cps) and cps[j + 1] == cps[j] + 1:
            j += 1
        parts.append(f"\\x{{{cps[i]:X}}}" if i == j else f"\\x{{{cps[i]:X}}}-\\x{{{cps[j]:X}}}")
        i = j + 1
    return "".join(parts)


def word_pattern() -> str:
    """The project's pre-tokeniser ``\\s*\\S+|\\s+`` with ``\\s`` spelled out for Oniguruma."""
    ws = _char_class(_python_whitespace())
    return f"[{ws}]*[^{ws}]+|[{ws}]+"


def unknown_char_pattern(chars: list[str]) -> str:
    """A regex matching one character that is not in ``chars``."""
    if not chars:
        return "[\\x{0}-\\x{10FFFF}]"
    return f"[^{_char_class(ord(c) for c in chars)}]"


def hf_tokenizer_json(tokenizer) -> dict:
    """The ``tokenizers`` JSON (``tokenizer.json`` content) that reproduces ``tokenizer``'s ids exactly.

    Guarantees: for every text, ``Tokenizer.from_str(json.dumps(result)).encode(text).ids`` equals
    ``tokenizer.encode_corpus(text)`` (skip policy; byte tokens with byte fallback), and decoding any ids the
    encoder produces gives mygpt's ``decode``. Raises ``UserError`` where that cannot hold
    (see :func:`check_exportable`). Built with the ``tokenizers`` library, so the format is its own.
    """
    return json.loads(_build_hf_tokenizer(tokenizer).to_str())


def _build_hf_tokenizer(tokenizer):
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    plan = _tokenizer_plan(tokenizer)
    vocab = {name: i for i, name in enumerate(plan["names"])}
    hf = Tokenizer(BPE(vocab=vocab, merges=plan["merges"], byte_fallback=plan["byte_fallback"], fuse_unk=False))
    splits = [pre_tokenizers.Split(Regex(word_pattern()), behavior="isolated")]
    if not plan["byte_fallback"]:
        splits.append(pre_tokenizers.Split(Regex(unknown_char_pattern(plan["chars"])), behavior="removed"))
    hf.pre_tokenizer = pre_tokenizers.Sequence(splits)
    steps = [decoders.Replace(plan["names"][i], s) for i, s in sorted(plan["placeholders"].items())]
    if plan["byte_fallback"]:
        steps.append(decoders.ByteFallback())
    steps.append(decoders.Fuse())
    hf.decoder = steps[0] if len(steps) == 1 else decoders.Sequence(steps)
    return hf


def hf_tokenizer_config(max_seq_len: int) -> dict:
    """``tokenizer_config.json``: the generic fast tokenizer class, no special tokens, no text clean-up."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": max_seq_len,
    }


# ---------------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------------


def hf_config(config) -> dict:
    """``config.json`` for a :class:`mygpt.model.GPTConfig`, as transformers' ``ArceeConfig`` writes it.

    Assumes :func:`check_exportable` passed.
    """
    from transformers import ArceeConfig

    E = config.embed_dim
    hf = ArceeConfig(
        architectures=[ARCHITECTURE],
        vocab_size=config.vocab_size,
        hidden_size=E,
        intermediate_size=4 * E,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        hidden_act="gelu",
        max_position_embeddings=config.max_seq_len,
        rms_norm_eps=RMS_NORM_EPS,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        attention_bias=False,
        mlp_bias=True,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        dtype="float32",
    )
    return json.loads(hf.to_json_string(use_diff=True))


def hf_generation_config() -> dict:
    """``generation_config.json``: ``mygpt generate``'s defaults (sampling, temperature 1, top-k 40)."""
    from transformers import GenerationConfig

    gen = GenerationConfig(do_sample=True, temperature=1.0, top_k=40)
    return json.loads(gen.to_json_string(use_diff=True))


def hf_state_dict(state_dict: dict, num_layers: int) -> dict:
    """mygpt's parameters under transformers' names (:data:`WEIGHT_NAMES`), as contiguous fp32 CPU tensors.

    Every parameter is mapped exactly once; the tied LM head is not stored (``tie_word_embeddings``).
    Raises ``RuntimeError`` if a parameter has no name (a model this module does not know).
    """
    import torch

    table = {
        src.format(i=i): dst.format(i=i) for src, dst in WEIGHT_NAMES.items() if "{i}" in src for i in range(num_layers)
    }
    table.update({src: dst for src, dst in WEIGHT_NAMES.items() if "{i}" not in src})
    unknown = sorted(set(state_dict) - set(table))
    missing = sorted(set(table) - set(state_dict))
    if unknown or missing:
        raise RuntimeError(f"cannot map the model's weights: unmapped {unknown[:5]}, absent {missing[:5]}")
    return {table[k]: v.detach().to("cpu", torch.float32).contiguous().clone() for k, v in state_dict.items()}


# ---------------------------------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------------------------------


def load_lines(out_dir) -> list[str]:
    """The three lines that load an export."""
    path = os.fspath(out_dir)
    return [
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        f"tokenizer = AutoTokenizer.from_pretrained({path!r})",
        f"model = AutoModelForCausalLM.from_pretrained({path!r})",
    ]


def export_hf(model, tokenizer, out_dir, *, meta: dict | None = None, sample_text: str | None = None) -> dict:
    """Write ``model`` + ``tokenizer`` to ``out_dir`` as a transformers directory; return facts for a manifest.

    Guarantees: on return, ``out_dir`` holds :data:`EXPORT_FILES`, and before they were published they were
    loaded back with ``AutoTokenizer`` / ``AutoModelForCausalLM`` and gave mygpt's token ids and decoding on a
    probe text, and mygpt's fp32 logits up to RoPE's table rounding (the facts' ``check`` holds both logit
    differences; see the module docstring). The probe is ``sample_text`` (held-out text; its first
    ``max_seq_len`` tokens for the logits) or, without it, every vocabulary string with a character outside the
    alphabet after every third one.

    A ``UserError`` (the model or tokenizer cannot be exported exactly, ``out_dir`` is a file or holds other
    files) is raised before anything is written; a failed check leaves ``out_dir`` as it was (files are staged
    beside it, then each is moved in with one atomic rename, ``config.json`` last, so a crash while moving
    leaves no ``config.json`` rather than a mixed export). The same model and tokenizer
    give the same bytes (a cache can compare them). ``meta`` (e.g. where the model came from) is returned in
    the facts as JSON values. ``model`` is not modified (the check runs on a CPU fp32 copy).
    """
    t0 = time.perf_counter()
    check_exportable(model.gpt_config, tokenizer)
    out_dir = os.path.abspath(os.fspath(out_dir))
    _check_out_dir(out_dir)
    _check_norms(model)
    if meta is not None:
        meta = json.loads(json.dumps(meta, default=str))
    files = _render(model, tokenizer)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.", suffix=".tmp", dir=parent)
    try:
        for name in EXPORT_FILES:
            atomic_write_bytes(os.path.join(staging, name), files[name])
        t_written = time.perf_counter()
        check = _verify(staging, model, tokenizer, sample_text)
        t_checked = time.perf_counter()
        _publish(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _facts(
        model,
        tokenizer,
        out_dir,
        files,
        check,
        meta,
        {"write": t_written - t0, "check": t_checked - t_written, "total": time.perf_counter() - t0},
    )


def _check_out_dir(out_dir: str) -> None:
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError(f"export directory {out_dir} is a file; give a directory path (it is created if absent)")
    if os.path.isdir(out_dir):
        foreign = sorted(set(os.listdir(out_dir)) - set(EXPORT_FILES))
        if foreign:
            raise UserError(
                f"export directory {out_dir} already holds files that are not part of an export "
                f"({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}); transformers would read them "
                f"too. Give a new or empty directory"
            )


def _check_norms(model) -> None:
    """The model's RMSNorms use the eps written to config.json (GPT always builds them with the default)."""
    eps = {m.eps for m in model.modules() if type(m).__name__ == "RMSNorm"}
    if eps and eps != {RMS_NORM_EPS}:
        raise UserError(f"the model's RMSNorm eps is {sorted(eps)}; the export maps only eps={RMS_NORM_EPS}")


def _render(model, tokenizer) -> dict[str, bytes]:
    """The bytes of every export file (the same bytes for the same model, tokenizer and library versions)."""
    from safetensors.torch import save

    def dump(obj) -> bytes:
        return (json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=True) + "\n").encode("utf-8")

    config = model.gpt_config
    tensors = hf_state_dict(model.state_dict(), config.num_layers)
    return {
        "tokenizer.json": json.dumps(hf_tokenizer_json(tokenizer), ensure_ascii=False).encode("utf-8"),
        "tokenizer_config.json": dump(hf_tokenizer_config(config.max_seq_len)),
        "generation_config.json": dump(hf_generation_config()),
        # Only "format": safetensors writes its metadata map in random order, and the files must be deterministic.
        "model.safetensors": save(tensors, metadata={"format": "pt"}),
        "config.json": dump(hf_config(config)),
    }


def _probe_text(tokenizer) -> str:
    """Every vocabulary string once, with an out-of-alphabet character after every third one."""
    chars, merges, _ = _parts(tokenizer)
    outside = _outside_char(chars)
    strings = chars + [a + b for a, b in merges]
    return "".join(s + (outside if i % 3 == 2 else "") for i, s in enumerate(strings))


def _mygpt_ids(tokenizer, text: str) -> list[int]:
    if tokenizer.kind == "char":
        return tokenizer.encode_array("".join(c for c in text if c in tokenizer.stoi)).tolist()
    return tokenizer.encode_corpus(text, unk_policy="skip").tolist()


def _verify(directory: str, model, tokenizer, sample_text: str | None) -> dict:
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


def _publish(staging: str, out_dir: str) -> None:
    """Move the staged files into ``out_dir`` one atomic rename each, ``config.json`` last.

    An earlier export's ``config.json`` goes first, so a crash half-way leaves a directory without one (which
    no loader takes for a model), never old config beside new weights.
    """
    os.makedirs(out_dir, exist_ok=True)
    old_config = os.path.join(out_dir, "config.json")
    if os.path.exists(old_config):
        os.unlink(old_config)
        fsync_dir(out_dir)
    for name in EXPORT_FILES:
        os.replace(os.path.join(staging, name), os.path.join(out_dir, name))
    fsync_dir(out_dir)


def _facts(model, tokenizer, out_dir: str, files: dict[str, bytes], check: dict, meta, seconds: dict) -> dict:
    import safetensors
    import tokenizers
    import torch
    import transformers

    chars, merges, byte_fallback = _parts(tokenizer)
    plan = _tokenizer_plan(tokenizer)
    return {
        "format": "transformers",
        "architecture": ARCHITECTURE,
        "model_type": MODEL_TYPE,
        "out_dir": out_dir,
        "files": {
            name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()
        },
        "num_params": model.num_params(),
        "vocab_size": model.vocab_size,
        "dtype": "float32",
        "tokenizer": {
            "kind": tokenizer.kind,
            "alphabet": len(chars),
            "merges": len(merges),
            "byte_fallback": byte_fallback,
            "unknown_chars": "byte tokens" if byte_fallback else "dropped, as a barrier (Split 'removed')",
            "repeated_strings": len(plan["placeholders"]),
        },
        "check": check,
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "versions": {
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "safetensors": safetensors.__version__,
            "torch": torch.__version__.split("+")[0],
        },
        "load": load_lines(out_dir),
        "meta": meta,
    }


def export_checkpoint(checkpoint_path, out_dir, *, sample_text: str | None = None) -> dict:
    """Export a mygpt checkpoint file (one made by ``mygpt train`` or the pipeline) to ``out_dir``.

    Same guarantees and facts as :func:`export_hf`; the facts' ``meta`` names the source checkpoint (path,
    sha256, training step, its own ``meta``). A checkpoint that cannot be exported exactly raises ``UserError``
    naming it, before anything is written.
    """
    from mygpt.checkpoint import (
        gpt_config_from_payload,
        load_checkpoint_payload,
        model_from_payload,
        tokenizer_from_payload,
    )

    path = os.path.abspath(os.fspath(checkpoint_path))
    payload = load_checkpoint_payload(path)  # read once: the config, the tokenizer and the weights come from it
    tokenizer = tokenizer_from_payload(payload, path)
    config = gpt_config_from_payload(payload, path)
    try:
        check_exportable(config, tokenizer)
    except UserError as e:
        raise UserError(f"checkpoint {path} cannot be exported exactly: {e}") from None
    model = model_from_payload(payload, path)
    resume = payload.get("resume")
    meta = {
        "source": "mygpt checkpoint",
        "checkpoint": path,
        "checkpoint_sha256": sha256_file(path),
        "step": resume.get("step") if isinstance(resume, dict) else None,
        "checkpoint_meta": payload.get("meta"),
    }
    del payload
    return export_hf(model, tokenizer, out_dir, meta=meta, sample_text=sample_text)
