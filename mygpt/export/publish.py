"""Write an export to a staging directory, check it, and move it into place (``config.json`` last)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time

from mygpt.atomic import atomic_write_bytes, fsync_dir, sha256_file
from mygpt.errors import UserError
from mygpt.export.model import (
    ARCHITECTURE,
    MODEL_TYPE,
    RMS_NORM_EPS,
    check_exportable,
    hf_config,
    hf_generation_config,
    hf_state_dict,
)
from mygpt.export.tokenizer import eos_token, hf_tokenizer_config, hf_tokenizer_json, parts, tokenizer_plan
from mygpt.export.verify import verify

#: Files an export writes, in publishing order (``config.json`` last: it marks a finished export).
EXPORT_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "model.safetensors", "config.json")
#: Written for a byte-level BPE only: tiktoken's ranks file (``tiktoken.load.load_tiktoken_bpe`` reads it).
TIKTOKEN_FILE = "tokenizer.tiktoken"


def _order(files) -> list[str]:
    """The names of ``files`` in publishing order (``config.json`` last)."""
    return [name for name in (TIKTOKEN_FILE, *EXPORT_FILES) if name in files]


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

    On return ``out_dir`` holds :data:`EXPORT_FILES`, loaded back and checked against mygpt (ids, decoding,
    fp32 logits) on ``sample_text`` or a probe of the vocabulary before they were published. ``UserError``
    before anything is written; a failed check leaves ``out_dir`` as it was. Same inputs, same bytes.
    ``meta`` is returned in the facts as JSON values; ``model`` is not modified.
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
        for name in _order(files):
            atomic_write_bytes(os.path.join(staging, name), files[name])
        t_written = time.perf_counter()
        check = verify(staging, model, tokenizer, sample_text)
        t_checked = time.perf_counter()
        _publish(staging, out_dir, _order(files))
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
        foreign = sorted(set(os.listdir(out_dir)) - {*EXPORT_FILES, TIKTOKEN_FILE})
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
    eos = eos_token(tokenizer)
    eos_id = tokenizer.special_ids[eos] if eos else None
    files = {
        "tokenizer.json": json.dumps(hf_tokenizer_json(tokenizer), ensure_ascii=False).encode("utf-8"),
        "tokenizer_config.json": dump(hf_tokenizer_config(config.max_seq_len, eos)),
        "generation_config.json": dump(hf_generation_config(eos_id)),
        # Only "format": safetensors writes its metadata map in random order, and the files must be deterministic.
        "model.safetensors": save(tensors, metadata={"format": "pt"}),
        "config.json": dump(hf_config(config, eos_id)),
    }
    if tokenizer.kind == "byte":
        from mygpt.tokenizers.byte_bpe_files import tiktoken_ranks

        files[TIKTOKEN_FILE] = tiktoken_ranks(tokenizer).encode("ascii")
    return files


def _publish(staging: str, out_dir: str, names: list[str]) -> None:
    """Move the staged files ``names`` into ``out_dir`` one atomic rename each, ``config.json`` last (an old one
    first, and an earlier export's tiktoken file that this one lacks): a crash half-way leaves no ``config.json``,
    never old config beside new weights."""
    os.makedirs(out_dir, exist_ok=True)
    stale = ["config.json"] + ([TIKTOKEN_FILE] if TIKTOKEN_FILE not in names else [])
    present = [os.path.join(out_dir, n) for n in stale if os.path.exists(os.path.join(out_dir, n))]
    for path in present:
        os.unlink(path)
    if present:
        fsync_dir(out_dir)
    for name in names:
        os.replace(os.path.join(staging, name), os.path.join(out_dir, name))
    fsync_dir(out_dir)


def _facts(model, tokenizer, out_dir: str, files: dict[str, bytes], check: dict, meta, seconds: dict) -> dict:
    import safetensors
    import tokenizers
    import torch
    import transformers

    chars, merges, byte_fallback = parts(tokenizer)
    plan = tokenizer_plan(tokenizer)
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
            "unknown_chars": "none (bytes)"
            if tokenizer.kind == "byte"
            else "byte tokens"
            if byte_fallback
            else "dropped, as a barrier (Split 'removed')",
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
    """:func:`export_hf` of a mygpt checkpoint file; the facts' ``meta`` names it (path, sha256, step, meta)."""
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
