"""A byte-level tokenizer's shards end every article with ``<|endoftext|>``, an empty one too (a title followed at
once by the next title, first, in the middle and last): the shards split at it give back each article's text."""

from __future__ import annotations

import re

import numpy as np

from tasks.core import shard_format as SF
from tasks.tokenizer import load_tokenizer
from tests.support import stages
from tests.support.corpora import corpus_from_text

TITLE = re.compile(r"^ = [^=]+ = \n", re.MULTILINE)


def with_empty_articles(text: str) -> str:
    """``text`` (real wikitext) with empty articles: before the first, between two, and at the end."""
    titles = [m.start() for m in TITLE.finditer(text)]
    middle = titles[len(titles) // 2]
    return (
        text[: titles[0]]
        + " = Empty first = \n"
        + text[titles[0] : middle]
        + " = Empty middle = \n"
        + text[middle:]
        + " = Empty last = \n"
    )


def test_every_article_an_empty_one_too_ends_with_endoftext(tmp_path, wikitext2_text):
    raw = with_empty_articles(wikitext2_text[: wikitext2_text.index("\n", 300_000) + 1])
    root = tmp_path / "art"
    corpus = corpus_from_text(
        root, tmp_path / "src", dict.fromkeys(("train", "valid", "test"), raw), article_index=True
    )
    tok_ref = stages.tokenizer(root, corpus, kind="byte", num_merges=20, bpe_train_bytes=50_000, run={"workers": 1})
    shards = stages.shards(root, corpus, tok_ref, shard_tokens=20_000, run={"workers": 1, "chunk_bytes": 40_000})
    tok = load_tokenizer(tok_ref["path"])
    eot = tok.special_ids["<|endoftext|>"]
    data = (root / "corpus" / corpus["version"] / "wiki.valid.txt").read_bytes()
    starts = np.load(root / "corpus" / corpus["version"] / "wiki.valid.articles.npy").tolist()
    assert len(starts) == len(TITLE.findall(raw)) and starts[:2] == [0, 0]  # the empty first article, kept
    articles = [data[a:b].decode("utf-8") for a, b in zip(starts, [*starts[1:], len(data)], strict=True)]
    assert articles.count("") == 3
    ids = np.concatenate([SF.read_shard(p) for p in SF.shard_paths(shards["path"], "valid")])
    assert int((ids == eot).sum()) == len(articles) and ids[-1] == eot
    cuts = np.flatnonzero(ids == eot)
    docs = [tok.decode(ids[a + 1 : b]) for a, b in zip([-1, *cuts[:-1].tolist()], cuts.tolist(), strict=True)]
    assert docs == articles
