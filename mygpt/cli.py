"""``mygpt train TEXT_FILE``, ``mygpt generate`` (the chapter's flags, defaults and header block) and
``mygpt export`` (a checkpoint as a Hugging Face transformers directory, see :mod:`mygpt.export`); ``mygpt tokenizer``
is :mod:`mygpt.tokenizers.cli`.

Bad input a user can fix is reported as ``error: <message>`` on stderr with exit code 2 and no traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING

from mygpt.errors import UserError
from mygpt.gpt_config import GPTConfig
from mygpt.options import options
from mygpt.regular_files import write_target
from mygpt.text_files import read_text as _read_text
from mygpt.text_files import utf8_prefix as _utf8_prefix
from mygpt.tokenizers.cli import add_tokenizer_parser
from mygpt.training.config import TrainConfig

if TYPE_CHECKING:
    from mygpt.tokenizers.bpe import BPETokenizer
    from mygpt.tokenizers.char_tokenizer import CharTokenizer

__all__ = ["FLAG_OVERRIDES", "build_parser", "main", "model_config"]

#: Where ``mygpt train``'s flags depart from ``GPTConfig``/``TrainConfig`` (whose fields they are): the chapter's
#: help text, and ``--print-every``'s default (every 10 % of --steps, at most every 500: a short run is never
#: silent). ``tf32`` has no flag (always on).
FLAG_OVERRIDES: dict[str, dict] = {
    "num_kv_heads": {
        "help": "key/value heads for grouped-query attention; default: same as --num-heads (full MHA). "
        "Must divide --num-heads."
    },
    "print_every": {
        "default": None,
        "help": "print the loss every N steps (default: every 10%% of --steps, at most every 500)",
    },
    "checkpoint_every": {
        "help": "Save the checkpoint every N steps (0 = save only at end, default). Atomic write: a "
        "Ctrl-C mid-save does not corrupt the file."
    },
}
NO_FLAG = ("tf32",)


def _config_flags(p: argparse.ArgumentParser, config: type) -> None:
    """A flag per field of ``config`` (``--norm`` sets ``norm_type``): its default, choices and help."""
    for o in options(config).values():
        if o.field in NO_FLAG:
            continue
        flag = {"default": o.default, "help": o.help.replace("%", "%%") + " (default: %(default)s)"}
        flag.update(FLAG_OVERRIDES.get(o.field, {}))
        if o.kind is bool:  # on by default: --no-NAME turns it off
            action = argparse.BooleanOptionalAction if o.default else "store_true"
            p.add_argument("--" + o.name.replace("_", "-"), dest=o.field, action=action, **flag)
        elif o.choices:
            p.add_argument("--" + o.name.replace("_", "-"), dest=o.field, choices=list(o.choices), **flag)
        else:
            p.add_argument("--" + o.name.replace("_", "-"), dest=o.field, type=o.kind, **flag)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mygpt", description="Train, sample and export a small GPT.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model on a UTF-8 text file")
    p.add_argument("text_file", help="UTF-8 text file to train on")
    p.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps")
    _config_flags(p, GPTConfig)
    _config_flags(p, TrainConfig)
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.0,
        help="hold out this fraction of the tokens (the end of the corpus) for validation loss "
        "(default 0 = no validation, as in the chapter)",
    )
    p.add_argument(
        "--tokenizer",
        choices=["char", "bpe"],
        default="char",
        help="Tokenizer to use. 'char' (default; CharTokenizer) or 'bpe' (BPETokenizer). "
        "BPE training runs on the corpus before model training.",
    )
    p.add_argument(
        "--num-merges",
        type=int,
        default=1024,
        help="Number of BPE merges (only meaningful when --tokenizer=bpe). Default 1024.",
    )
    p.add_argument(
        "--bpe-train-bytes",
        type=int,
        default=0,
        help="Train BPE on the first N bytes of the corpus (0 = full corpus, default). The encoder "
        "still runs on the full corpus and skips characters that did not appear in the slice.",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the resume state in --output if it exists (same settings required)",
    )
    p.add_argument("--output", default="model.ckpt", help="checkpoint path (default model.ckpt)")
    p.add_argument(
        "--nproc",
        default="1",
        help="training processes on this node, data parallel with torch.distributed.run (gloo on CPU, "
        "NCCL on CUDA, one GPU each); 'auto' = the number of visible GPUs (1 on CPU). --batch-size "
        "stays the global batch, so the result does not depend on it (default 1)",
    )
    p.set_defaults(func=_train_command)

    g = sub.add_parser("generate", help="sample text from a checkpoint")
    g.add_argument("--checkpoint", default="model.ckpt")
    g.add_argument("--prompt", default="\n")
    g.add_argument("--max-new-tokens", type=int, default=200)
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0 = greedy)")
    g.add_argument("--top-k", type=int, default=40, help="sample from the k most likely tokens (0 = all)")
    g.add_argument("--device", default="auto")
    g.add_argument("--precision", default="fp32", choices=["auto", "fp32", "bf16"])
    g.add_argument("--seed", type=int, default=1337)
    g.add_argument("--no-cache", action="store_true", help="recompute the whole context each step (no KV cache)")
    g.set_defaults(func=_generate_command)

    e = sub.add_parser(
        "export",
        help="export a checkpoint as a Hugging Face transformers directory",
        description="Write tokenizer.json, config.json, model.safetensors, ... to --out, checked "
        "against the checkpoint; load it with AutoTokenizer / AutoModelForCausalLM.",
    )
    e.add_argument("--checkpoint", default="model.ckpt", help="checkpoint to export (default model.ckpt)")
    e.add_argument(
        "--out", required=True, help="directory to write (created if absent; must be new, empty or an earlier export)"
    )
    e.set_defaults(func=_export_command)
    add_tokenizer_parser(sub)
    return parser


def model_config(args, vocab_size: int) -> GPTConfig:
    """The ``GPTConfig`` that ``mygpt train``'s flags ask for."""
    return GPTConfig(vocab_size, **{name: getattr(args, name) for name in options(GPTConfig)})


def train_config(args) -> TrainConfig:
    """The ``TrainConfig`` that ``mygpt train``'s flags ask for."""
    values = {name: getattr(args, name) for name in options(TrainConfig) if name not in NO_FLAG}
    return TrainConfig(**{**values, "print_every": print_every(args)})


def print_every(args) -> int:
    """``--print-every``, or by default every 10 % of the steps (at most every 500): a short run is never silent."""
    if args.print_every is not None:
        return args.print_every
    return max(1, min(500, args.steps // 10))


def _train_command(args) -> int:
    import dataclasses

    import torch

    from mygpt.device import bf16_cpu_warning, resolve_device, resolve_precision
    from mygpt.limits import check_memory, check_nproc, check_seq_len
    from mygpt.model import GPT
    from mygpt.training.launcher import resolve_nproc
    from mygpt.training.train import train

    # Validate everything cheap before reading or tokenising the corpus (vocab_size: any valid value till then).
    gpt_config = model_config(args, vocab_size=1)
    config = train_config(args)
    check_seq_len(config.seq_len, gpt_config.max_seq_len, names=("--seq-len", "--max-seq-len"))
    if not 0.0 <= args.val_fraction < 1.0:
        raise UserError(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
    if args.num_merges < 0:
        raise UserError(f"--num-merges must be >= 0, got {args.num_merges}")
    if args.bpe_train_bytes < 0:
        raise UserError(f"--bpe-train-bytes must be >= 0 (0 = whole corpus), got {args.bpe_train_bytes}")
    write_target(args.output, "--output")  # a device or a FIFO is refused before it is read (--resume) or replaced
    device = resolve_device(args.device)
    precision = resolve_precision(device, args.precision)
    slow = bf16_cpu_warning(device, args.precision)
    if slow:  # said before the text is read and a tokenizer trained, not only once training starts
        print(f"warning: {slow}", file=sys.stderr, flush=True)
    nproc = resolve_nproc(args.nproc, args.device)
    check_nproc(config.batch_size, nproc, names=("--batch-size", "--nproc"))
    check_memory(  # the vocabulary is not known yet: 1 keeps this a lower bound; train() checks it again
        gpt_config,
        config.batch_size,
        config.seq_len,
        device=device,
        precision=precision,
        nproc=nproc,
        micro_batch_size=config.micro_batch_size,
        names={
            k: "--" + k.replace("_", "-")
            for k in ("batch_size", "seq_len", "max_seq_len", "embed_dim", "num_layers", "micro_batch_size")
        },
    )

    text, raw = _read_text(args.text_file)
    tokenizer: BPETokenizer | CharTokenizer
    if args.tokenizer == "bpe":
        from mygpt.tokenizers.bpe import BPETokenizer

        train_text = _utf8_prefix(raw, args.bpe_train_bytes)
        del raw
        print(f"training BPE tokenizer ({args.num_merges} merges, {len(train_text):,} chars)…", flush=True)
        t0 = time.perf_counter()
        tokenizer = BPETokenizer.from_corpus(train_text, args.num_merges)
        del train_text
        print(f"BPE trained in {time.perf_counter() - t0:.1f}s", flush=True)
        print(f"encoding corpus ({len(text):,} chars)…", flush=True)
        t0 = time.perf_counter()
        data = tokenizer.encode_corpus(text, unk_policy="skip")
        print(f"corpus encoded in {time.perf_counter() - t0:.1f}s", flush=True)
    else:
        from mygpt.tokenizers.char_tokenizer import CharTokenizer

        del raw
        tokenizer = CharTokenizer.from_text(text)
        data = tokenizer.encode_array(text)

    n = len(data)
    n_val = int(n * args.val_fraction) if args.val_fraction > 0 else 0
    train_data = data[: n - n_val]
    val_data = data[n - n_val :] if n_val > 0 else None

    torch.manual_seed(args.seed)  # initial weights come from --seed, not from what this process drew before
    gpt_config = dataclasses.replace(gpt_config, vocab_size=tokenizer.vocab_size)
    model = GPT(gpt_config)
    print(f"device: {device}")
    print(f"precision: {precision}")
    print(f"tokenizer: {args.tokenizer}")
    print(f"norm: {gpt_config.norm_type}")
    print(f"position: {gpt_config.position_type}")
    print(f"num_heads: {gpt_config.num_heads}")
    print(f"num_kv_heads: {gpt_config.num_kv_heads}")
    print(f"corpus chars: {len(text):,}")
    print(f"train chars: {len(train_data):,}")
    if val_data is not None:
        print(f"val chars: {len(val_data):,}")
    print(f"vocab_size: {tokenizer.vocab_size}")
    print(f"params: {model.num_params():,}")
    print(f"steps: {args.steps}")
    print(f"schedule: {args.schedule} (warmup={args.warmup})")
    print(f"max_grad_norm: {args.max_grad_norm}" + (" (no clipping)" if not args.max_grad_norm else ""))
    if args.checkpoint_every > 0:
        print(f"checkpoint_every: {args.checkpoint_every}")
    if nproc > 1:
        print(f"nproc: {nproc}")
    if args.compile:
        print("compile: on")
    sys.stdout.flush()
    del text

    meta = {"text_file": os.path.abspath(args.text_file), "tokenizer": args.tokenizer}
    say = lambda msg: print(msg, flush=True)  # noqa: E731
    if nproc > 1:
        _train_processes(args, nproc, tokenizer, train_data, val_data, gpt_config, config, meta, say)
        return 0
    result = train(
        model,
        tokenizer,
        train_data,
        config=config,
        val_tokens=val_data,
        device=device,
        checkpoint_path=args.output,
        resume=args.resume,
        log=say,
        meta=meta,
    )
    del result  # the chapter's output ends with "saved checkpoint to ..."; the numbers are in the log too
    return 0


def _train_processes(args, nproc, tokenizer, train_data, val_data, gpt_config, config, meta, say) -> None:
    """``--nproc N``: the token arrays and the tokenizer go to files, ``run_training`` starts the processes."""
    import tempfile

    from mygpt.tokenizers.files import save_tokenizer_file
    from mygpt.training.job import TrainJob
    from mygpt.training.launcher import run_training

    with tempfile.TemporaryDirectory(prefix="mygpt-train-data-") as tmp:
        save_tokenizer_file(tokenizer, os.path.join(tmp, "tokenizer.json"))
        train_data.tofile(os.path.join(tmp, "train.bin"))
        if val_data is not None:
            val_data.tofile(os.path.join(tmp, "val.bin"))
        job = TrainJob(
            tokenizer=os.path.join(tmp, "tokenizer.json"),
            train_tokens=[os.path.join(tmp, "train.bin")],
            val_tokens=os.path.join(tmp, "val.bin") if val_data is not None else None,
            token_dtype=train_data.dtype.name,
            model=gpt_config,
            train=config,
            device=args.device,
            checkpoint=os.path.abspath(args.output),
            resume=args.resume,
            meta=meta,
        )
        run_training(job, nproc, log=say)


def _generate_command(args) -> int:
    from mygpt.checkpoint import load_checkpoint
    from mygpt.device import resolve_device, resolve_precision
    from mygpt.generate import generate

    device = resolve_device(args.device)
    precision = resolve_precision(device, args.precision)
    model, tokenizer = load_checkpoint(args.checkpoint)
    print(f"device: {device}", flush=True)
    text = generate(
        model,
        tokenizer,
        args.prompt,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        seed=args.seed,
        device=device,
        precision=precision,
        use_cache=not args.no_cache,
    )
    print(text)
    return 0


def _export_command(args) -> int:
    from mygpt.export.publish import export_checkpoint

    facts = export_checkpoint(args.checkpoint, args.out)
    check = facts["check"]
    print(
        f"exported {args.checkpoint} to {facts['out_dir']} as {facts['architecture']} "
        f"({facts['num_params']:,} params, vocab {facts['vocab_size']:,}) in {facts['seconds']['total']:.1f}s"
    )
    for name, info in facts["files"].items():
        print(f"  {name:<24} {info['bytes']:>12,} bytes")
    print(
        f"checked: {check['tokenizer_tokens']:,} token ids equal to mygpt's; max |logit diff| "
        f"{check['max_abs_logit_diff']:.2e} over {check['logit_tokens']} positions"
    )
    print("load it with:")
    for line in facts["load"]:
        print(f"  {line}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UserError as e:
        sys.stdout.flush()
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        sys.stdout.flush()
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
