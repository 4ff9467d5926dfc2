"""The pretrained tokenizer's source file on its own: a same-size edit made after the version was named is refused
(the check compares sha256, not sizes), and what is read is capped, whatever ``stat`` says (a procfs file has size
0). The tiny corpus is built once, plainly; the tokenizer stage runs on a file in tmp."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest

import tasks.sources.pretrained_tokenizer as pretrained
from flows.settings import TINY, Pipeline
from mygpt.cli import main
from mygpt.errors import UserError
from tasks.core.faults import FAULT_ENV, FAULT_TRACE_ENV, reset_faults
from tasks.registry import BY_NAME
from tests.support.tiny import run_in, tiny_zip_url


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, shakespeare_text):
    """A tokenizer.json made by ``mygpt tokenizer train``, settings naming it, run options and the corpus's ref."""
    tmp = tmp_path_factory.mktemp("pretrained-source")
    (tmp / "train.txt").write_text(shakespeare_text[:20_000], encoding="utf-8")
    assert main(["tokenizer", "train", str(tmp / "train.txt"), "--vocab-size", "300", "--out", str(tmp / "tok")]) == 0
    source = tmp / "tok" / "tokenizer.json"
    s = Pipeline.parse(
        **{
            **TINY,
            "corpus": {"source_url": tiny_zip_url(tmp)},
            "tokenizer": {**TINY["tokenizer"], "kind": "pretrained", "source": str(source)},
        }
    )
    run = run_in(tmp / "art")
    corpus = BY_NAME["corpus"].task.fn(s.resolved("corpus"), run)
    return source, s.resolved("tokenizer"), run, corpus


def _wait_for(path, line: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not (path.exists() and line in path.read_text(encoding="utf-8").splitlines()):
        assert time.monotonic() < deadline, f"{line!r} never reached"
        time.sleep(0.05)


def test_a_same_size_edit_after_the_version_was_named_is_refused(tiny, tmp_path, monkeypatch):
    """The tokenizer stage names its version by the file's sha256, then (held at its start) the file is given other
    bytes of the same size (two keys swapped: the same tokenizer, other bytes): the build refuses it rather than
    publish a version that names content A while holding B."""
    source, settings, run, corpus = tiny
    before = source.read_bytes()
    after = before.replace(b'"truncation": null,\n  "padding": null,', b'"padding": null,\n  "truncation": null,')
    assert after != before and len(after) == len(before)
    release, trace = tmp_path / "release", tmp_path / "trace"
    monkeypatch.setenv(FAULT_ENV, f"tokenizer.start@1:hold={release}")
    monkeypatch.setenv(FAULT_TRACE_ENV, str(trace))
    reset_faults()
    outcome: dict = {}

    def build() -> None:
        try:
            outcome["ref"] = BY_NAME["tokenizer"].task.fn(corpus, settings, run)
        except BaseException as e:  # handed to the test's thread
            outcome["error"] = e

    builder = threading.Thread(target=build)
    builder.start()
    try:
        _wait_for(trace, "tokenizer.start 1")  # the version is named: the source's identity was read
        source.write_bytes(after)
    finally:
        release.touch()
        builder.join(300)
        source.write_bytes(before)
        reset_faults()
    error = outcome.get("error")
    assert isinstance(error, UserError), outcome
    assert f"now holds other bytes (sha256 {hashlib.sha256(after).hexdigest()})" in str(error)
    assert f"than the ones this run's version names ({hashlib.sha256(before).hexdigest()})" in str(error)


def test_what_is_read_of_a_file_source_is_capped_not_what_stat_says(monkeypatch, tmp_path):
    """/proc/self/maps: a regular file whose ``stat`` size is 0 and whose content is thousands of bytes."""
    monkeypatch.setattr(pretrained, "MAX_TOKENIZER_BYTES", 64)
    with open("/proc/self/maps", "rb") as f:
        assert len(f.read()) > 64
    with pytest.raises(UserError, match="holds more than 64 bytes"):
        pretrained.read_source("/proc/self/maps", tmp_path)
