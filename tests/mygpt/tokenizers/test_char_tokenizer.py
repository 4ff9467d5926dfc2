"""CharTokenizer: the chapter's Part I tokenizer plus the shared tokenizer contract."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mygpt import CharTokenizer, UserError
from mygpt.tokenizers.files import tokenizer_from_state


def test_round_trip_on_tiny_shakespeare(shakespeare_text):
    tok = CharTokenizer.from_text(shakespeare_text)
    assert tok.kind == "char"
    assert tok.vocab_size == 65 == len(tok.chars)
    assert tok.chars == sorted(set(shakespeare_text))
    assert tok.chars[:3] == ["\n", " ", "!"]
    ids = tok.encode(shakespeare_text)
    assert ids.dtype == torch.long and ids.dim() == 1 and ids.numel() == 1_115_394
    assert ids.min().item() >= 0 and ids.max().item() == 64
    assert tok.decode(ids) == shakespeare_text
    # ids are positions in the sorted alphabet
    assert ids[:5].tolist() == [tok.chars.index(c) for c in shakespeare_text[:5]]
    arr = tok.encode_array(shakespeare_text)
    assert arr.dtype == np.uint16 and np.array_equal(arr, ids.numpy())


def test_decode_accepts_list_ndarray_tensor():
    tok = CharTokenizer.from_text("hello world")
    ids = tok.encode("low hello")
    assert tok.decode(ids.tolist()) == tok.decode(ids.numpy().astype(np.uint16)) == tok.decode(ids) == "low hello"
    with pytest.raises(UserError, match="out of range"):
        tok.decode([tok.vocab_size])


def test_unknown_characters_are_named():
    tok = CharTokenizer.from_text("abc ")
    assert tok.unknown_chars("a€Zb€") == ["Z", "€"]
    assert tok.unknown_chars("abc") == []
    with pytest.raises(UserError) as err:
        tok.encode("a€Zb€")
    msg = str(err.value)
    assert "'Z' (U+005A)" in msg and "'€' (U+20AC)" in msg and "vocabulary" in msg


def test_non_bmp_characters_round_trip():
    text = "a😀b\U0001f600c日本"
    tok = CharTokenizer.from_text(text)
    assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == 6


def test_state_round_trip_is_json_and_dispatches():
    tok = CharTokenizer.from_text("the quick brown fox")
    state = json.loads(json.dumps(tok.state()))
    assert state == {"chars": tok.chars}
    again = CharTokenizer.from_state(state)
    assert again == tok
    via = tokenizer_from_state("char", state)
    assert isinstance(via, CharTokenizer) and via.chars == tok.chars
    with pytest.raises(UserError, match="unknown tokenizer kind"):
        tokenizer_from_state("wordpiece", state)


def test_bad_construction():
    with pytest.raises(UserError, match="empty"):
        CharTokenizer.from_text("")
    with pytest.raises(UserError, match="duplicate"):
        CharTokenizer(["a", "a"])
    with pytest.raises(UserError, match="single characters"):
        CharTokenizer(["ab"])
