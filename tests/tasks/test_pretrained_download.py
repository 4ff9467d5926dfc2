"""The download of an http(s) ``tokenizer.source``: bounded by a deadline (a real server on 127.0.0.1 that sends a
byte now and then never trips the read timeout), staged in the artifact store (resumed by a rerun, listed by gc),
never in $TMPDIR, and its errors name the tokenizer's settings, not the corpus's."""

from __future__ import annotations

import logging
import os
import tempfile
import time

import pytest

from flows.settings import Pipeline
from mygpt.errors import UserError
from tasks.registry import BY_NAME, open_store
from tasks.sources import pretrained_tokenizer as PT
from tasks.sources.download import ENV_DEADLINE
from tests.support.http_servers import dripping_server, no_length_server


def tokenizer_settings(url: str):
    return Pipeline.parse(tokenizer={"kind": "pretrained", "source": url}).resolved("tokenizer")


def test_a_dripping_source_stops_at_the_deadline_staged_in_the_store(tmp_path, monkeypatch, fast_retries):
    monkeypatch.setenv(ENV_DEADLINE, "1")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    root = tmp_path / "art"
    store = open_store(root)
    with dripping_server(size=50_000, every=0.05) as server:
        url = server.url("tokenizer.json")
        with pytest.raises(UserError, match=rf"^tokenizer\.source {url} did not arrive within 1 seconds, the most"):
            BY_NAME["tokenizer"].source(tokenizer_settings(url), store, logging.getLogger("wiki_pipeline"))
    staged = root / "tokenizer" / ".sources" / "downloads" / (PT.download_name(url) + ".part")
    assert staged.stat().st_size > 0, "the bytes that came wait in the store's staging for a rerun"
    assert not os.listdir(tmp_path / "tmp"), "nothing outside the artifact root"
    assert not [g for g in store.garbage() if g.where.endswith(".part")], "a fresh download is no garbage"
    old = time.time() - PT.UNTOUCHED_SECONDS - 60
    os.utime(staged, (old, old))
    listed = [g for g in store.garbage() if g.where.endswith(staged.name)]
    assert listed and listed[0].reason.startswith("a tokenizer.source download a stopped run left"), listed


def test_a_source_that_arrives_whole_is_read_and_its_staged_copy_deleted(tmp_path):
    with dripping_server(size=10, every=0.01) as server:
        url = server.url("tokenizer.json")
        assert PT.read_source(url, tmp_path / "staging") == b"x" * 10
    assert os.listdir(tmp_path / "staging") == [PT.download_name(url) + ".lock"], "the copy is gone once read"


def test_a_body_past_the_cap_names_the_tokenizer_not_the_corpus_settings(tmp_path, monkeypatch, fast_retries):
    monkeypatch.setattr(PT, "MAX_TOKENIZER_BYTES", 100_000)
    with no_length_server(4 << 20) as server:  # never announces its size
        url = server.url("tokenizer.json")
        with pytest.raises(UserError) as e:
            PT.read_source(url, tmp_path / "staging")
    message = str(e.value)
    assert message.startswith(f"tokenizer.source {url} holds more than 100,000 bytes"), message
    assert "expected_bytes" not in message and "source_url" not in message, message
    assert not [p for p in os.listdir(tmp_path / "staging") if not p.endswith(".lock")], "nothing of it kept"
