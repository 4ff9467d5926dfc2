"""Checkpoints: chapter format, round trips (char and BPE), legacy files, atomic saves, bad files."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from mygpt import GPT, BPETokenizer, CharTokenizer, UserError, load_checkpoint, save_checkpoint
from mygpt.checkpoint import load_checkpoint_payload
from mygpt.generate import generate
from tests.support import REPO


def _same_weights(a: GPT, b: GPT) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_char_round_trip_in_chapter_format(shakespeare_text, tmp_path):
    tok = CharTokenizer.from_text(shakespeare_text)
    torch.manual_seed(0)
    model = GPT(vocab_size=tok.vocab_size)
    path = tmp_path / "model.ckpt"
    save_checkpoint(model, tok, path, meta={"note": "x"})
    payload = torch.load(path, weights_only=True)  # the safe loader is enough for our payloads
    assert set(payload) == {
        "model_state_dict",
        "tokenizer_chars",
        "tokenizer_kind",
        "tokenizer_state",
        "config",
        "meta",
    }
    assert payload["config"] == {
        "vocab_size": 65,
        "embed_dim": 64,
        "num_heads": 4,
        "num_kv_heads": 4,
        "num_layers": 4,
        "max_seq_len": 64,
        "norm_type": "layer",
        "position_type": "learned",
        "tokenizer_kind": "char",
    }
    assert payload["tokenizer_kind"] == "char"
    assert payload["tokenizer_chars"] == tok.chars == payload["tokenizer_state"]["chars"]
    assert payload["meta"] == {"note": "x"}
    model2, tok2 = load_checkpoint(path)
    assert isinstance(tok2, CharTokenizer) and tok2.chars == tok.chars
    assert _same_weights(model, model2) and model2.config() == model.config()
    assert not model2.training
    assert generate(model2, tok2, "ROMEO:", max_new_tokens=30, device="cpu") == generate(
        model, tok, "ROMEO:", max_new_tokens=30, device="cpu"
    )


def test_bpe_round_trip(shakespeare_text, tmp_path):
    chars = sorted(set(shakespeare_text))
    merges = [("e", " "), ("t", "h"), ("th", "e "), (" ", "the "), ("o", "u")]
    tok = BPETokenizer(chars, merges)
    assert tok.kind == "bpe" and tok.vocab_size == 70
    assert tok.decode(tok.encode("the youth")) == "the youth"
    model = GPT(
        vocab_size=tok.vocab_size,
        embed_dim=48,
        num_heads=6,
        num_kv_heads=2,
        num_layers=2,
        max_seq_len=32,
        norm_type="rms",
        position_type="rope",
    )
    path = tmp_path / "bpe.ckpt"
    save_checkpoint(model, tok, path)
    payload = load_checkpoint_payload(path)
    assert payload["tokenizer_kind"] == payload["config"]["tokenizer_kind"] == "bpe"
    assert [list(m) for m in payload["tokenizer_state"]["merges"]] == [list(m) for m in merges]
    model2, tok2 = load_checkpoint(path)
    assert isinstance(tok2, BPETokenizer)
    assert tok2.state() == tok.state() and tok2.vocab_size == 70
    text = "then the youth said"
    assert torch.equal(tok2.encode(text), tok.encode(text))
    assert _same_weights(model, model2)
    assert model2.config() == model.config()


def test_bpe_round_trip_trained_tokenizer(shakespeare_text, tmp_path):
    tok = BPETokenizer.from_corpus(shakespeare_text[:100_000], 60)
    assert tok.vocab_size == len(tok.chars) + 60
    model = GPT(vocab_size=tok.vocab_size, embed_dim=32, num_heads=4, num_layers=1, max_seq_len=32)
    path = tmp_path / "bpe2.ckpt"
    save_checkpoint(model, tok, path)
    model2, tok2 = load_checkpoint(path)
    sample = shakespeare_text[200_000:201_000]
    assert tok2 == tok
    assert torch.equal(tok2.encode(sample), tok.encode(sample))
    assert tok2.decode(tok2.encode(sample)) == sample
    out = generate(model2, tok2, "ROMEO:", max_new_tokens=10, device="cpu", seed=3)
    assert out == generate(model, tok, "ROMEO:", max_new_tokens=10, device="cpu", seed=3)


def test_legacy_checkpoint_loads_and_generates(shakespeare_text, tmp_path):
    """A pre-chapter-28 file: no norm_type / position_type / num_kv_heads / tokenizer_kind anywhere."""
    tok = CharTokenizer.from_text(shakespeare_text)
    torch.manual_seed(5)
    model = GPT(vocab_size=tok.vocab_size, embed_dim=32, num_heads=4, num_layers=2, max_seq_len=32)
    legacy = {
        "model_state_dict": model.state_dict(),
        "tokenizer_chars": tok.chars,
        "config": {"vocab_size": 65, "embed_dim": 32, "num_heads": 4, "num_layers": 2, "max_seq_len": 32},
    }
    path = tmp_path / "legacy.ckpt"
    torch.save(legacy, path)
    model2, tok2 = load_checkpoint(path)
    assert isinstance(tok2, CharTokenizer) and tok2.chars == tok.chars
    assert (model2.norm_type, model2.position_type, model2.num_kv_heads) == ("layer", "learned", 4)
    assert _same_weights(model, model2)
    out = generate(model2, tok2, "ROMEO:", max_new_tokens=20, device="cpu")
    assert out.startswith("ROMEO:") and len(out) == 26
    assert out == generate(model, tok, "ROMEO:", max_new_tokens=20, device="cpu")


def _two_models(tok):
    torch.manual_seed(1)
    a = GPT(vocab_size=tok.vocab_size, embed_dim=32, num_heads=4, num_layers=2, max_seq_len=32)
    torch.manual_seed(2)
    b = GPT(vocab_size=tok.vocab_size, embed_dim=32, num_heads=4, num_layers=2, max_seq_len=32)
    return a, b


def test_interrupted_save_leaves_old_file_intact(shakespeare_text, tmp_path, monkeypatch):
    tok = CharTokenizer.from_text(shakespeare_text)
    old, new = _two_models(tok)
    path = tmp_path / "model.ckpt"
    save_checkpoint(old, tok, path)
    old_bytes = path.read_bytes()
    real_save = torch.save

    def half_then_interrupt(obj, f, *args, **kwargs):
        buf = io.BytesIO()
        real_save(obj, buf)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        raise KeyboardInterrupt  # a Ctrl-C in the middle of writing

    monkeypatch.setattr(torch, "save", half_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(new, tok, path)
    monkeypatch.undo()
    assert path.read_bytes() == old_bytes
    assert os.listdir(tmp_path) == ["model.ckpt"]  # the temp file was cleaned up
    loaded, _ = load_checkpoint(path)
    assert _same_weights(loaded, old) and not _same_weights(loaded, new)


def test_killed_process_mid_save_leaves_old_file_intact(shakespeare_text, tmp_path):
    """SIGKILL (no cleanup code runs) halfway through writing: the target still holds the old checkpoint."""
    tok = CharTokenizer.from_text(shakespeare_text)
    old, _ = _two_models(tok)
    path = tmp_path / "model.ckpt"
    save_checkpoint(old, tok, path)
    old_bytes = path.read_bytes()
    child = textwrap.dedent(
        f"""
        import io, os, signal, sys, torch
        sys.path.insert(0, {str(REPO)!r})
        from mygpt import GPT, CharTokenizer, save_checkpoint
        tok = CharTokenizer.from_state({{"chars": {tok.chars!r}}})
        torch.manual_seed(2)
        model = GPT(vocab_size=tok.vocab_size, embed_dim=32, num_heads=4, num_layers=2, max_seq_len=32)
        real_save = torch.save
        def half_then_die(obj, f, *a, **k):
            buf = io.BytesIO()
            real_save(obj, buf)
            f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
            f.flush()
            os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        torch.save = half_then_die
        save_checkpoint(model, tok, {str(path)!r})
        """
    )
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    leftovers = [n for n in os.listdir(tmp_path) if n != "model.ckpt"]
    assert leftovers and all(n.startswith(".model.ckpt.") and n.endswith(".tmp") for n in leftovers)
    assert path.read_bytes() == old_bytes
    loaded, _ = load_checkpoint(path)
    assert _same_weights(loaded, old)


def test_bad_checkpoint_files_raise_user_error_naming_path(shakespeare_text, tmp_path):
    missing = tmp_path / "nope.ckpt"
    with pytest.raises(UserError, match=f"{missing}.*does not exist"):
        load_checkpoint(missing)
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    with pytest.raises(UserError, match=f"{empty}.*empty"):
        load_checkpoint(empty)
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(os.urandom(1000))
    with pytest.raises(UserError, match=f"{garbage}.*corrupt"):
        load_checkpoint(garbage)
    # a real checkpoint cut short
    tok = CharTokenizer.from_text(shakespeare_text)
    good = tmp_path / "good.ckpt"
    save_checkpoint(GPT(vocab_size=65, embed_dim=16, num_heads=2, num_layers=1, max_seq_len=16), tok, good)
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[:-200])
    with pytest.raises(UserError, match=f"{truncated}.*corrupt"):
        load_checkpoint(truncated)
    other = tmp_path / "other.ckpt"
    torch.save({"weights": torch.zeros(3)}, other)
    with pytest.raises(UserError, match=f"{other} is not a mygpt checkpoint"):
        load_checkpoint(other)
    with pytest.raises(UserError, match="is a directory"):
        load_checkpoint(tmp_path)
    # weights that do not fit the config
    payload = load_checkpoint_payload(good)
    payload["config"]["embed_dim"] = 32
    bad = tmp_path / "mismatch.ckpt"
    torch.save(payload, bad)
    with pytest.raises(UserError, match=f"{bad}.*do not match"):
        load_checkpoint(bad)
