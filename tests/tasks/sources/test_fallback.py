"""The offline fallback: the version whose bytes an unreachable address served last."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from flows.mirror import Mirror
from mygpt.errors import UserError
from tasks.sources.download import ENV_ATTEMPTS, ENV_BASE_DELAY
from tests.support.corpus_runs import all_text_under
from tests.support.http_servers import AcceptAndClose, QueryMirror
from tests.support.mirror_faults import Faults, FaultyMirror
from tests.support.stages import corpus as download
from tests.support.zips import tiny_zip


def test_offline_the_bytes_the_address_served_last_are_reused(tmp_path, fast_retries, caplog):
    """Not the version *published* last from the address: /x.zip served A (published from it), then B (published
    earlier from /y.zip, reused); offline, /x.zip's run reuses B, what it served last."""
    a, b = tiny_zip("Aaaa"), tiny_zip("Bbbb")
    root = tmp_path / "art"
    with Mirror({"/x.zip": a, "/y.zip": b}) as m:
        version_b = download(root, source_url=m.url("/y.zip"))
        version_a = download(root, source_url=m.url("/x.zip"))
        m.add("/x.zip", b)
        assert download(root, source_url=m.url("/x.zip")) == version_b
    with caplog.at_level("WARNING", logger="wiki_pipeline"):  # the mirror gone
        assert download(root, source_url=m.url("/x.zip")) == version_b != version_a
    assert f"reusing corpus/{version_b['version']}" in caplog.text


def test_offline_the_zip_served_last_is_reused_when_the_server_sends_no_etag(tmp_path, fast_retries, caplog):
    """A server without a strong ETag leaves no index entry; the fallback still takes what it served last: it
    served A, B, then A again; offline, A is reused."""
    a, b = tiny_zip("Aaaa"), tiny_zip("Bbbb")
    root = tmp_path / "art"
    with FaultyMirror({"/w.zip": a}, faults=Faults(no_validators=True)) as m:
        version_a = download(root, source_url=m.url("/w.zip"))
        time.sleep(1.1)  # B published in a later second than A (created_at has whole seconds): B is the newer
        m.add("/w.zip", b)
        version_b = download(root, source_url=m.url("/w.zip"))
        m.add("/w.zip", a)
        assert download(root, source_url=m.url("/w.zip")) == version_a != version_b
    with caplog.at_level("WARNING", logger="wiki_pipeline"):  # the mirror gone
        assert download(root, source_url=m.url("/w.zip")) == version_a
    assert f"reusing corpus/{version_a['version']}" in caplog.text


def test_unreachable_source_reuses_the_newest_version_from_it(tmp_path, fast_retries, caplog):
    with FaultyMirror({"/w.zip": tiny_zip("Kept")}) as m:
        url = m.url("/w.zip")
        ref = download(tmp_path / "art", source_url=url)
        m.set_faults(fail_first=1000, fail_status=403)  # the server now refuses, as for an expired signed URL
        with caplog.at_level("WARNING", logger="wiki_pipeline"):
            assert download(tmp_path / "art", source_url=url) == ref
        assert "(downloading " + url + " failed: HTTP 403 Forbidden" in caplog.text
    caplog.clear()
    # the mirror is gone: nothing answers at url now
    with caplog.at_level("WARNING", logger="wiki_pipeline"):
        assert download(tmp_path / "art", source_url=url) == ref
    assert f"cannot check {url} now" in caplog.text and f"reusing corpus/{ref['version']}" in caplog.text
    with pytest.raises(UserError, match=re.escape(url) + " failed 4 times in a row"):
        download(tmp_path / "other", source_url=url)  # nothing published from it there: a clear error


def test_the_offline_fallback_matches_the_whole_address_not_its_redacted_form(tmp_path, fast_retries, caplog):
    """With the server down, ``?f=B.zip`` does not reuse the version published from ``?f=A.zip``."""
    root = tmp_path / "art"
    with QueryMirror({"/get": tiny_zip("Alpha")}) as m:
        url_a, url_b = m.url("/get?f=A.zip"), m.url("/get?f=B.zip")
        ref = download(root, source_url=url_a)
        legacy = download(tmp_path / "legacy", source_url=url_a)
    # the server is gone: nothing answers there now
    with pytest.raises(UserError, match=re.escape(m.url("/get?f=***")) + " failed 4 times in a row"):
        download(root, source_url=url_b)
    with caplog.at_level("WARNING", logger="wiki_pipeline"):
        assert download(root, source_url=url_a) == ref, "the same address: the last version is reused"
        with_user = url_a.replace("http://", "http://alice:S3CRET@")
        assert download(root, source_url=with_user) == ref, "the same address with credentials: the same"
    assert f"reusing corpus/{ref['version']}" in caplog.text
    # a version published before the address was recorded (no source_url_sha256) and a URL with a query: its
    # redacted form cannot tell ?f=A.zip from ?f=B.zip, so it is not reused
    manifest_path = Path(legacy["path"]) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["metrics"]["source_url_sha256"]
    manifest_path.write_text(json.dumps(manifest))
    for entry in (tmp_path / "legacy" / "corpus" / ".sources").glob("**/*.json"):
        entry.unlink()  # nor does its index name the address (an older index named the redacted URL)
    with pytest.raises(UserError, match=" failed 4 times in a row"):
        download(tmp_path / "legacy", source_url=url_a)
    assert "S3CRET" not in all_text_under(root) + caplog.text


def test_a_legacy_version_without_a_query_falls_back_by_its_redacted_url(tmp_path, fast_retries):
    with Mirror({"/w.zip": tiny_zip("Legacy")}) as m:
        url = m.url("/w.zip")
        ref = download(tmp_path / "art", source_url=url)
    manifest_path = Path(ref["path"]) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["metrics"]["source_url_sha256"]
    manifest_path.write_text(json.dumps(manifest))
    assert download(tmp_path / "art", source_url=url) == ref


def test_an_offline_rerun_asks_twice_before_falling_back(tmp_path, monkeypatch, caplog):
    """With the mirror down, an all-cached rerun tries the probe twice, not like a download, before reusing the
    last version."""
    monkeypatch.setenv(ENV_ATTEMPTS, "6")
    monkeypatch.setenv(ENV_BASE_DELAY, "0.01")
    with Mirror({"/w.zip": tiny_zip("Cached")}) as m:
        url, port = m.url("/w.zip"), m.port
        ref = download(tmp_path / "art", source_url=url)
    with AcceptAndClose(port) as down:
        with caplog.at_level("WARNING", logger="wiki_pipeline"):
            assert download(tmp_path / "art", source_url=url) == ref
        assert down.connections == 2, "one try and one retry, then the fallback"
        assert f"cannot check {url} now" in caplog.text and f"reusing corpus/{ref['version']}" in caplog.text
        down.connections = 0
        with pytest.raises(UserError, match=re.escape(url) + " failed 6 times in a row"):
            download(tmp_path / "fresh", source_url=url)  # nothing to fall back to: every try
        assert down.connections == 6


def test_a_manifest_whose_source_sha256_is_no_string_does_not_break_the_fallback(tmp_path, fast_retries):
    """A hand-edited ``source.sha256`` (a list: unhashable) is matched against nothing the address served: the
    offline run says the source cannot be reached (a clear error) instead of a TypeError."""
    root = tmp_path / "art"
    with Mirror({"/w.zip": tiny_zip("Kept")}) as m:
        url = m.url("/w.zip")
        ref = download(root, source_url=url)
    manifest = root / "corpus" / ref["version"] / "manifest.json"
    data = json.loads(manifest.read_text())
    data["source"]["sha256"] = [data["source"]["sha256"]]
    manifest.write_text(json.dumps(data))
    with pytest.raises(UserError, match=re.escape(url) + " failed 4 times in a row"):  # the mirror gone
        download(root, source_url=url)
