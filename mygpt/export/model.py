"""mygpt's GPT as transformers' ``ArceeForCausalLM``: config and weights (docs/HF_EXPORT.md, "The model")."""

from __future__ import annotations

import json

from mygpt.errors import UserError
from mygpt.export.tokenizer import tokenizer_plan

ARCHITECTURE = "ArceeForCausalLM"
MODEL_TYPE = "arcee"
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


def check_exportable(config, tokenizer=None) -> None:
    """Raise ``UserError`` unless ``config`` (a ``GPTConfig``) and ``tokenizer`` map exactly onto the export.

    The one home of that rule: an RMSNorm + RoPE model, a char or BPE tokenizer of the model's vocab size that
    HF's BPE can reproduce. Without ``tokenizer`` only the model is checked (settings, before a tokenizer exists).
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
    if kind not in ("bpe", "char", "byte"):
        raise UserError(
            f"the tokenizer is a {type(tokenizer).__name__}; only mygpt's 'bpe', 'char' and 'byte' tokenizers can "
            f"be exported"
        )
    vocab_size = config.vocab_size
    if tokenizer.vocab_size != vocab_size:
        raise UserError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but the model's vocab_size is {vocab_size}; "
            f"export the tokenizer the model was trained with"
        )
    tokenizer_plan(tokenizer)  # raises UserError for what HF's BPE cannot reproduce


def hf_config(config, eos_token_id: int | None = None) -> dict:
    """``config.json`` for a ``GPTConfig`` (one :func:`check_exportable` passed), as ``ArceeConfig`` writes it."""
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
        eos_token_id=eos_token_id,
        pad_token_id=None,
        dtype="float32",
    )
    return json.loads(hf.to_json_string(use_diff=True))


def hf_generation_config(eos_token_id: int | None = None) -> dict:
    """``generation_config.json``: ``mygpt generate``'s defaults (sampling, temperature 1, top-k 40); with
    ``eos_token_id`` sampling stops at that token (a document's end)."""
    from transformers import GenerationConfig

    extra = {"eos_token_id": eos_token_id} if eos_token_id is not None else {}
    gen = GenerationConfig(do_sample=True, temperature=1.0, top_k=40, **extra)
    return json.loads(gen.to_json_string(use_diff=True))


def hf_state_dict(state_dict: dict, num_layers: int) -> dict:
    """mygpt's parameters under transformers' names, as contiguous fp32 CPU tensors (the tied head not stored).

    Raises ``RuntimeError`` if a parameter has no name (a model this module does not know)."""
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
