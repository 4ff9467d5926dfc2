"""``mygpt tokenizer train`` and ``mygpt tokenizer encode``: a byte-level BPE as a tool of its own.

``train`` writes ``DIR/tokenizer.json`` in Hugging Face's byte-level form (``tokenizers.Tokenizer.from_file`` and
``PreTrainedTokenizerFast`` load it), merges in training order. ``encode`` takes any byte-level BPE
``tokenizer.json`` (ours, or one made from GPT-2's ``vocab.json`` + ``merges.txt``) and writes the ids of a UTF-8
file as a 1-D integer ``.npy``. Bad input is a ``UserError``: one ``error:`` line, exit 2 (``mygpt.cli.main``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from mygpt.errors import UserError, check_int
from mygpt.regular_files import write_target
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
        description="The ids of the text exactly as Hugging Face's encode(text, add_special_tokens=False) gives "
        "them: the file's post-processor (a template that adds a BOS or EOS token) is not applied, so the ids are "
        "the text's alone. An empty text gives an empty array. The array is uint16 when the largest id fits, "
        "else uint32.",
    )
    en.add_argument("text", help="UTF-8 text file to encode (may be empty)")
    en.add_argument("--tokenizer", required=True, help="byte-level BPE tokenizer.json (ours, or GPT-2 style)")
    en.add_argument("--out", required=True, help="the .npy file to write")
    en.add_argument(
        "--allow-special",
        action="store_true",
        help="turn special tokens spelled in the text (<|endoftext|>) into their ids; by default they are "
        "ordinary text, so a file cannot inject a document boundary",
    )
    en.set_defaults(func=_encode_command)


def _same_file(a: str, b: str) -> bool:
    """Whether paths ``a`` and ``b`` name one file: the same resolved path, or (both existing) the same inode, as
    a hard link or a bind mount makes."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): no inode to share
        return False


def _refuse_overwrite(out: str, flag: str, inputs: dict[str, str]) -> None:
    """``UserError`` when the output ``out`` (given as ``flag``) is one of ``inputs`` (``{what: path}``): writing
    it would destroy that input."""
    for what, path in inputs.items():
        if _same_file(out, path):
            raise UserError(
                f"{flag} {out} is the {what} {path}; writing it would destroy that input, give another path"
            )


def _check_writable_dir(directory: str, flag: str, out: str) -> None:
    """``UserError`` unless a file can be created in ``directory`` (tried for real: as root, ``os.access`` says
    yes to ``/proc``). Checked before any reading or training, so a bad path costs nothing."""
    if not os.path.isdir(directory):
        what = "is not a directory" if os.path.exists(directory) else "does not exist"
        raise UserError(f"{flag} {out}: {directory} {what}; create that directory first or give another path")
    try:
        fd, probe = tempfile.mkstemp(prefix=".mygpt-write-check.", dir=directory)
    except OSError as e:
        raise UserError(f"{flag} {out}: cannot write in {directory} ({e.strerror or e}); give a writable path") from e
    os.close(fd)
    os.unlink(probe)


def _check_train_out(out: str, text: str) -> tuple[str, str]:
    """``(out/tokenizer.json, the nearest directory of out that exists)``, after checking that ``out`` is (or can
    be made) a writable directory and that file is not the training text."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"--out {out} exists and is not a directory; give a directory for tokenizer.json")
    path = os.path.join(out, "tokenizer.json")
    if os.path.isdir(path):
        raise UserError(f"--out {out}: {path} is a directory; move it away or give another --out")
    _refuse_overwrite(path, "--out", {"text file": text})
    write_target(path, "--out")
    existing = os.path.abspath(out)
    while not os.path.exists(existing):  # the directories to be made: the nearest that exists must take them
        existing = os.path.dirname(existing)
    _check_writable_dir(existing, "--out", out)
    return path, existing


def _write_error(flag: str, path: str, e: OSError) -> UserError:
    return UserError(f"{flag}: cannot write {path} ({e.strerror or e}); nothing was written, give a writable path")


def _train_command(args: argparse.Namespace) -> int:
    from mygpt.atomic import atomic_write_text
    from mygpt.tokenizers.byte_bpe import DEFAULT_SPECIALS, ByteBPETokenizer

    specials = tuple(args.special_tokens) if args.special_tokens else DEFAULT_SPECIALS
    check_int("--vocab-size", args.vocab_size, 256 + len(set(specials)), hint="256 bytes + special tokens + merges")
    check_int("--workers", args.workers, 1)
    ByteBPETokenizer(merges=(), specials=specials, pattern=args.pattern)  # bad specials: refused before reading
    path, existing = _check_train_out(args.out, args.text)
    text, raw = read_text(args.text)
    size = len(raw)
    del raw  # the text alone stays in memory while training
    t0 = time.perf_counter()
    tok = ByteBPETokenizer.train(
        text, args.vocab_size, specials, args.pattern, workers=args.workers, what=f"text file {args.text}"
    )
    seconds = time.perf_counter() - t0
    del text
    content = tok.to_json()  # a merge spelled like a special is refused here, before anything is made
    try:
        os.makedirs(args.out, exist_ok=True)
        atomic_write_text(path, content)
    except OSError as e:
        made = os.path.abspath(args.out)
        while made != existing and os.path.isdir(made) and not os.listdir(made):  # take back what this run made
            os.rmdir(made)
            made = os.path.dirname(made)
        raise _write_error("--out", path, e) from e
    wanted = args.vocab_size - 256 - len(specials)
    short = f" (the text has no more pairs: {wanted:,} asked for)" if len(tok.merges) < wanted else ""
    print(
        f"trained a byte-level BPE on {size:,} bytes in {seconds:.1f}s: 256 bytes + {len(tok.merges):,} merges"
        f"{short} + {len(specials)} special tokens = vocab {tok.vocab_size:,} ({args.pattern} pattern)"
    )
    print(f"wrote {path}")
    return 0


def _largest_id(hf) -> int:
    """The largest id of ``hf``'s vocabulary and added tokens: ids may have gaps, so the count is no bound."""
    return max(hf.get_vocab(with_added_tokens=True).values(), default=0)


def _check_encode_pretokens(hf, text: str, specials: dict[str, int], pattern: str | None, what: str) -> None:
    """:func:`~mygpt.tokenizers.byte_bpe.check_pretokens` for any byte-level file: with an unknown split the
    file's own normalizer and pre-tokenizer say what the pre-tokens are (ByteLevel spells each byte as one
    character, so a pre-token's length is its bytes), on the whole text, as that path encodes it (ordinary added
    tokens, which HF cuts out first, are not cut here: a refusal there errs on the safe side)."""
    from mygpt.tokenizers import byte_bpe_pretokens
    from mygpt.tokenizers.byte_bpe import check_pretokens, pretoken_error

    if pattern is not None:
        check_pretokens(text, specials, pattern, what)
        return
    bound = byte_bpe_pretokens.MAX_PRETOKEN_BYTES
    normalized = hf.normalizer.normalize_str(text) if hf.normalizer is not None else text
    if len(normalized) * 4 <= bound:  # a character is at most 4 bytes: no pre-token can be longer
        return
    for token, (start, _) in hf.pre_tokenizer.pre_tokenize_str(normalized):
        if len(token) > bound:
            if hf.normalizer is None:
                at = f"byte offset {len(text[:start].encode('utf-8')):,}"
            else:
                at = f"character {start:,} of the text as the file's normalizer changes it"
            raise pretoken_error(what, len(token), at, bound)


def _encode_command(args: argparse.Namespace) -> int:
    import numpy as np

    from mygpt.atomic import atomic_open
    from mygpt.tokenizers.byte_bpe import encode_with, id_dtype
    from mygpt.tokenizers.byte_bpe_files import load_byte_level_bpe

    if os.path.isdir(args.out):
        raise UserError(f"--out {args.out} is a directory; give a .npy file name")
    _refuse_overwrite(args.out, "--out", {"text file": args.text, "tokenizer file": args.tokenizer})
    write_target(args.out, "--out")
    _check_writable_dir(os.path.dirname(os.path.abspath(args.out)), "--out", args.out)
    hf, specials, pattern = load_byte_level_bpe(args.tokenizer)
    text, raw = read_text(args.text, empty_ok=True)
    size = len(raw)
    del raw
    allowed = specials if args.allow_special else {}
    _check_encode_pretokens(hf, text, allowed, pattern, f"text file {args.text}")
    t0 = time.perf_counter()
    top = _largest_id(hf)
    ids = encode_with(hf, text, specials, args.allow_special, pattern, id_dtype(top + 1))
    seconds = time.perf_counter() - t0
    try:
        with atomic_open(args.out, "wb") as f:
            np.save(f, ids, allow_pickle=False)
    except OSError as e:
        raise _write_error("--out", args.out, e) from e
    rate = size / seconds / 1e6 if seconds > 0 else float("inf")
    vocab_size = hf.get_vocab_size(with_added_tokens=True)
    print(
        f"encoded {size:,} bytes into {len(ids):,} tokens (vocab {vocab_size:,}, largest id {top:,}, "
        f"{ids.dtype.name}) in {seconds:.1f}s ({rate:.1f} MB/s)"
    )
    print(f"wrote {args.out}")
    return 0
