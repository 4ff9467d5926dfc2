"""The same zip from another mirror (``--mirror`` on another port) reuses every stage -- the
corpus version follows the bytes, not the URL -- run here through the real stages, without Prefect."""

from __future__ import annotations

from flows.mirror import Mirror
from tests.support.stages import corpus, shards, tokenizer


def test_the_same_zip_on_another_port_reuses_every_stage(tmp_path, wiki_zip):
    root = tmp_path / "art"

    def chain(url: str) -> dict:
        c = corpus(root, source_url=url)
        t = tokenizer(root, c, num_merges=32, bpe_train_bytes=40_000)
        s = shards(root, c, t, shard_tokens=100_000)
        return {"corpus": c, "tokenizer": t, "shards": s}

    with Mirror({"/wikitext-103-raw-v1.zip": wiki_zip}) as one, Mirror({"/wikitext-103-raw-v1.zip": wiki_zip}) as two:
        assert two.url() != one.url(), "another port: another URL"
        first = chain(one.url())
        second = chain(two.url())
    assert second == first, "same bytes: the same versions and builds, every stage reused"
