"""``mygpt tokenizer train`` and ``mygpt tokenizer encode``: a byte-level BPE as a tool of its own.

``train`` writes ``DIR/tokenizer.json`` in Hugging Face's byte-level form (``tokenizers.Tokenizer.from_file`` and
``PreTrainedTokenizerFast`` load it), merges in training order. ``encode`` takes any byte-level BPE
``tokenizer.json`` (ours, or one made from GPT-2's ``vocab.json`` + ``merges.txt``) and writes the ids of a UTF-8
file as a 1-D integer ``.npy``. Bad input is a ``UserError``: one ``error:`` line, exit 2 (``mygpt.cli.main``).
"""

from __future__ import annotations

import argparse
import os
import time

from mygpt.errors import UserError, check_int
from mygpt.text_files import read_text

__all__ = ["add_tokenizer_parser"]


def add_tokenizer_parser(sub) -> None:
    """The ``tokenizer`` command and its two subcommands, on ``mygpt``'s subparsers ``sub``."""
    from mygpt.tokenizers.byte_bpe import DEFAULT_SPECIALS
    from mygpt.tokenizers.byte_bpe_reference import PATTERNS

    t = sub.add_parser("tokenizer", help="train a byte-level BPE tokenizer, or encode a text file with one")
    tsub = t.add_subparsers(dest="tokenizer_command", required=True)

    tr = tsub.add_parser(
        "train",
        help="train a byte-level BPE on a UTF-8 text file and write DIR/tokenizer.json",
        description="Byte-level BPE (GPT-2 style): 256 byte symbols, the split pattern, the most frequent pair "
        "merged first (ties: the greatest pair of byte strings), special tokens added after training.",
    )
    tr.add_argument("text", help="UTF-8 text file to train on")
    tr.add_argument("--kind", choices=["byte"], default="byte", help="tokenizer kind (default: byte)")
    tr.add_argument(
        "--vocab-size", type=int, required=True, help="256 bytes + merges + special tokens (as CS336 and HF count it)"
    )
    tr.add_argument(
        "--special-token",
        action="append",
        dest="special_tokens",
        metavar="T",
        help=f"a special token, repeatable (default: {' '.join(DEFAULT_SPECIALS)}); never learnt, ids after the merges",
    )
    tr.add_argument("--pattern", choices=sorted(PATTERNS), default="gpt2", help="pre-tokenizer split (default: gpt2)")
    tr.add_argument(
        "--workers", type=int, default=1, help="processes that count the pre-tokens of a large text (default: 1)"
    )
    tr.add_argument("--out", required=True, help="directory to write tokenizer.json into (created if absent)")
    tr.set_defaults(func=_train_command)

    en = tsub.add_parser(
        "encode",
        help="encode a UTF-8 text file with a byte-level BPE tokenizer.json into a 1-D .npy of ids",
    )
    en.add_argument("text", help="UTF-8 text file to encode")
    en.add_argument("--tokenizer", required=True, help="byte-level BPE tokenizer.json (ours, or GPT-2 style)")
    en.add_argument("--out", required=True, help="the .npy file to write")
    en.add_argument(
        "--allow-special",
        action="store_true",
        help="turn special tokens spelled in the text (<|endoftext|>) into their ids; by default they are "
        "ordinary text, so a file cannot inject a document boundary",
    )
    en.set_defaults(func=_encode_command)


def _check_out_dir(path: str) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"--out {path} exists and is not a directory; give a directory for tokenizer.json")


def _make_out_dir(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create --out directory {path}: {e.strerror or e}") from e


def _train_command(args: argparse.Namespace) -> int:
    from mygpt.atomic import atomic_write_text
    from mygpt.tokenizers.byte_bpe import DEFAULT_SPECIALS, ByteBPETokenizer

    specials = tuple(args.special_tokens) if args.special_tokens else DEFAULT_SPECIALS
    check_int("--vocab-size", args.vocab_size, 256 + len(set(specials)), hint="256 bytes + special tokens + merges")
    check_int("--workers", args.workers, 1)
    _check_out_dir(args.out)
    text, raw = read_text(args.text)
    size = len(raw)
    del raw  # the text alone stays in memory while training
    t0 = time.perf_counter()
    tok = ByteBPETokenizer.train(text, args.vocab_size, specials, args.pattern, workers=args.workers)
    seconds = time.perf_counter() - t0
    _make_out_dir(args.out)  # only now: a failed run leaves nothing behind
    path = os.path.join(args.out, "tokenizer.json")
    atomic_write_text(path, tok.to_json())
    wanted = args.vocab_size - 256 - len(specials)
    short = f" (the text has no more pairs: {wanted:,} asked for)" if len(tok.merges) < wanted else ""
    print(
        f"trained a byte-level BPE on {size:,} bytes in {seconds:.1f}s: 256 bytes + {len(tok.merges):,} merges"
        f"{short} + {len(specials)} special tokens = vocab {tok.vocab_size:,} ({args.pattern} pattern)"
    )
    print(f"wrote {path}")
    return 0


def _encode_command(args: argparse.Namespace) -> int:
    import numpy as np

    from mygpt.atomic import atomic_open
    from mygpt.tokenizers.byte_bpe import encode_with, id_dtype
    from mygpt.tokenizers.byte_bpe_files import load_byte_level_bpe

    hf, specials, pattern = load_byte_level_bpe(args.tokenizer)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise UserError(f"--out {args.out}: directory {out_dir} does not exist; create it first")
    if os.path.isdir(args.out):
        raise UserError(f"--out {args.out} is a directory; give a .npy file name")
    text, raw = read_text(args.text)
    size = len(raw)
    del raw
    t0 = time.perf_counter()
    vocab_size = hf.get_vocab_size(with_added_tokens=True)
    ids = encode_with(hf, text, specials, args.allow_special, pattern, id_dtype(vocab_size))
    seconds = time.perf_counter() - t0
    with atomic_open(args.out, "wb") as f:
        np.save(f, ids, allow_pickle=False)
    rate = size / seconds / 1e6 if seconds > 0 else float("inf")
    print(
        f"encoded {size:,} bytes into {len(ids):,} tokens (vocab {vocab_size:,}, {ids.dtype.name}) in "
        f"{seconds:.1f}s ({rate:.1f} MB/s)"
    )
    print(f"wrote {args.out}")
    return 0
