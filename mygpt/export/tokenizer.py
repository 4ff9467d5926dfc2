"""A mygpt tokenizer as a ``tokenizers`` BPE that gives the same ids (docs/HF_EXPORT.md, "The tokenizer")."""

from __future__ import annotations

import functools
import json
import re

from mygpt.errors import UserError, describe_chars


def parts(tokenizer) -> tuple[list[str], list[tuple[str, str]], bool]:
    """``(chars, merges, byte_fallback)``; a char tokenizer is a BPE with no merges; a byte-level BPE's are its
    256 bytes and merges in GPT-2's byte-to-unicode spelling (HF's token strings)."""
    if tokenizer.kind == "byte":
        from mygpt.tokenizers.byte_bpe_files import token_string

        chars = [token_string(bytes([b])) for b in range(256)]
        return chars, [(token_string(a), token_string(b)) for a, b in tokenizer.merges], False
    if tokenizer.kind == "char":
        return list(tokenizer.chars), [], False
    return list(tokenizer.chars), list(tokenizer.merges), bool(tokenizer.byte_fallback)


def tokenizer_plan(tokenizer) -> dict:
    """``chars``, ``merges``, ``byte_fallback``, ``names`` (HF token string per id) and ``placeholders``
    (earlier id of a repeated string -> string); ``UserError`` naming what HF's BPE cannot hold or reproduce."""
    if tokenizer.kind == "byte":
        from mygpt.tokenizers.byte_bpe_files import vocab_strings

        names = list(vocab_strings(tokenizer)) + list(tokenizer.specials)  # refuses a repeated byte string
        chars, merges, _ = parts(tokenizer)
        return {"chars": chars, "merges": merges, "byte_fallback": False, "names": names, "placeholders": {}}
    chars, merges, byte_fallback = parts(tokenizer)
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
        mark = outside_char(chars)
        for i in repeated:
            names[i] = f"{mark}{i}{mark}"
    if byte_fallback:
        names += [f"<0x{b:02X}>" for b in range(256)]
    return {"chars": chars, "merges": merges, "byte_fallback": byte_fallback, "names": names, "placeholders": repeated}


def _check_repeats_in_order(merges: list[tuple[str, str]]) -> None:
    """Refuse a repeated string that a merge uses before the repeat's own rank.

    HF's BPE merges from a priority queue, mygpt one rank per round: they agree while merging rank ``r`` only
    creates pairs of rank > ``r``, which only a repeat ranked after a use of its string breaks."""
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


def outside_char(chars: list[str]) -> str:
    """A private-use character that is not in ``chars`` (for placeholder token names)."""
    taken = set(chars)
    for cp in range(0xE000, 0xF900):
        if chr(cp) not in taken:
            return chr(cp)
    raise UserError("the tokenizer's alphabet holds the whole private-use area; it cannot be exported")


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
    """``tokenizer.json``: for every text its ids equal ``tokenizer.encode_corpus(text)`` (skip policy) and it
    decodes them as mygpt does; ``UserError`` where that cannot hold. A byte-level BPE's is HF's own byte-level
    form (:func:`mygpt.tokenizers.byte_bpe_files.hf_tokenizer`), its specials matched as HF always does."""
    if tokenizer.kind == "byte":
        return json.loads(tokenizer.to_json())
    return json.loads(_build_hf_tokenizer(tokenizer).to_str())


def _build_hf_tokenizer(tokenizer):
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    plan = tokenizer_plan(tokenizer)
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


def eos_token(tokenizer) -> str | None:
    """The end-of-document token an export names (a byte-level BPE's first special, ``<|endoftext|>``), or None."""
    specials = getattr(tokenizer, "specials", ())
    return specials[0] if tokenizer.kind == "byte" and specials else None


def hf_tokenizer_config(max_seq_len: int, eos: str | None = None) -> dict:
    """``tokenizer_config.json``: the generic fast tokenizer class, no text clean-up, and no special tokens but
    ``eos`` where given (so ``generate`` stops at a document's end)."""
    extra = {"eos_token": eos} if eos else {}
    return {
        **extra,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": max_seq_len,
    }
