"""The copy of the zip a build reads: the download made to learn its sha256, only when it is that zip."""

from __future__ import annotations

import hashlib
import json

from flows.mirror import Mirror
from tasks.core.urls import address_sha256
from tasks.registry import open_store
from tasks.sources.fetched import stage_sources
from tasks.sources.source_index import SourceIndex
from tests.support.corpus_runs import train_text
from tests.support.stages import corpus as download
from tests.support.zips import tiny_zip


def test_a_stray_download_at_the_address_s_path_is_not_taken_for_the_version_s_bytes(tmp_path):
    """A file at the address's download path (a killed run's download of other bytes) is taken only when its
    recorded sha256 is the version's, not for a false "now holds other bytes"."""
    root = tmp_path / "art"
    with Mirror({"/x.zip": tiny_zip("Aaaa")}) as m:
        first = download(root, source_url=m.url("/x.zip"))
        stray = stage_sources(open_store(root), "corpus").download_path(address_sha256(m.url("/x.zip")))
        stray.parent.mkdir(parents=True, exist_ok=True)
        stray.write_bytes(tiny_zip("Bbbb"))
        SourceIndex.facts_path(stray).write_text(json.dumps({"sha256": hashlib.sha256(b"other").hexdigest()}))
        again = download(root, source_url=m.url("/x.zip"), run={"force": ["corpus"]})
    assert again["version"] == first["version"] and "Aaaa text" in train_text(again)
