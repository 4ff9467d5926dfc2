"""The content identity of the zip at source_url: the version follows its bytes, not its URL."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from zipfile import ZIP_STORED

import pytest

from flows.mirror import Mirror
from mygpt.errors import UserError
from tests.support.corpora import shared_splits
from tests.support.corpus_runs import (
    all_text_under,
    chapter_wikipedia_txt,
    joined_splits,
    metrics,
    published,
    train_text,
)
from tests.support.http_servers import FixedETagMirror, QueryMirror, dir_server
from tests.support.mirror_faults import Faults, FaultyMirror
from tests.support.stages import corpus as download
from tests.support.zips import tiny_zip, wikitext_zip


def test_new_content_in_the_same_file_is_a_new_version(tmp_path):
    zpath = tmp_path / "w.zip"
    zpath.write_bytes(tiny_zip("Old"))
    first = download(tmp_path / "art", source_url=zpath.as_uri())
    zpath.write_bytes(tiny_zip("New"))  # same URL, different text
    second = download(tmp_path / "art", source_url=zpath.as_uri())
    assert second["version"] != first["version"] and "New text" in train_text(second)
    assert "Old text" in train_text(first), "the old version stays, for whoever switches back"
    again = download(tmp_path / "art", source_url=zpath.as_uri())
    assert again == second, "unchanged file: the same version, reused"
    manifest = json.loads((Path(second["path"]) / "manifest.json").read_text())
    assert manifest["source"] == {
        "bytes": zpath.stat().st_size,
        "sha256": hashlib.sha256(zpath.read_bytes()).hexdigest(),
    }


def test_new_content_at_the_same_http_url_is_a_new_version(tmp_path):
    with Mirror({"/w.zip": tiny_zip("Old")}) as m:
        first = download(tmp_path / "art", source_url=m.url("/w.zip"))
        m.add("/w.zip", tiny_zip("Newer"))  # the mirror now serves other bytes (another ETag and size)
        second = download(tmp_path / "art", source_url=m.url("/w.zip"))
        assert second["version"] != first["version"] and "Newer text" in train_text(second)
        m.clear_log()
        assert download(tmp_path / "art", source_url=m.url("/w.zip")) == second
        assert [r["range"] for r in m.requests] == ["bytes=0-0"], "a reuse costs one probe, no download"
        source = json.loads((Path(second["path"]) / "manifest.json").read_text())["source"]
        assert source == {"bytes": len(tiny_zip("Newer")), "sha256": hashlib.sha256(tiny_zip("Newer")).hexdigest()}


def test_the_same_bytes_from_another_mirror_are_the_same_version(tmp_path, caplog, fast_retries):
    """The same zip from another port is the same version; once that mirror is known to serve those bytes, a run
    of it reuses the version offline too."""
    data = tiny_zip("Same")
    with Mirror({"/w.zip": data}) as one, Mirror({"/copy.zip": data}) as two:
        first = download(tmp_path / "art", source_url=one.url("/w.zip"))
        with caplog.at_level("INFO", logger="wiki_pipeline"):
            second = download(tmp_path / "art", source_url=two.url("/copy.zip"))
        assert second == first, "the version follows the bytes, not the URL"
        assert "reusing corpus/" + first["version"] in caplog.text
        assert not list((tmp_path / "art" / "corpus" / ".sources" / "downloads").glob("*.zip")), (
            "the download made to hash the bytes is not kept once they are known to be published"
        )
        two.clear_log()
        assert download(tmp_path / "art", source_url=two.url("/copy.zip")) == first
        assert [r["range"] for r in two.requests] == ["bytes=0-0"], "now recorded: one probe, no download"
    caplog.clear()
    with caplog.at_level("WARNING", logger="wiki_pipeline"):  # both mirrors gone
        assert download(tmp_path / "art", source_url=two.url("/copy.zip")) == first
    assert f"reusing corpus/{first['version']}" in caplog.text, "published from one, known to be served by two"


def test_a_renewed_signed_url_is_the_same_address(tmp_path, fast_retries, caplog):
    """A renewed signature neither downloads the zip again nor loses the offline fallback: the signing parameters
    (``X-Amz-*``, ``sig``, ``token``, ...) are not part of the address."""
    root = tmp_path / "art"
    with Mirror({"/s.zip": tiny_zip("Signed")}) as m:
        signed = m.url("/s.zip") + "?X-Amz-Credential=AK%2F1&X-Amz-Signature={}&X-Amz-Expires=60"
        first = download(root, source_url=signed.format("aaaa1111"))
        m.clear_log()
        assert download(root, source_url=signed.format("bbbb2222")) == first
        assert [r["range"] for r in m.requests] == ["bytes=0-0"], "a renewed signature: one probe, no download"
    with caplog.at_level("WARNING", logger="wiki_pipeline"):  # the server gone: the fallback holds too
        assert download(root, source_url=signed.format("cccc3333")) == first
    assert f"reusing corpus/{first['version']}" in caplog.text
    assert not [s for s in ("aaaa1111", "bbbb2222", "cccc3333", "AK") if s in all_text_under(root)]


def test_a_server_without_validators_is_checked_by_its_bytes(tmp_path, caplog):
    """A size but no ETag/Last-Modified, new bytes of the same size: a new version."""
    old, new = tiny_zip("Aaaa"), tiny_zip("Bbbb")
    assert len(old) == len(new)
    with (
        FaultyMirror({"/w.zip": old}, faults=Faults(no_validators=True)) as m,
        caplog.at_level("INFO", logger="wiki_pipeline"),
    ):
        first = download(tmp_path / "art", source_url=m.url("/w.zip"))
        m.add("/w.zip", new)
        second = download(tmp_path / "art", source_url=m.url("/w.zip"))
    assert second["version"] != first["version"] and "Bbbb text" in train_text(second)
    assert "Aaaa text" in train_text(first)
    assert caplog.text.count(f"sends no strong ETag (size `{len(old)}`), so this run cannot tell") == 2


def test_a_server_whose_etag_changes_on_every_request_completes(tmp_path, caplog):
    """A load balancer's ETag changes per request: every run still completes."""
    data = tiny_zip("Balanced")
    with (
        FaultyMirror({"/w.zip": data}, faults=Faults(etag_per_request=True)) as m,
        caplog.at_level("INFO", logger="wiki_pipeline"),
    ):
        first = download(tmp_path / "art", source_url=m.url("/w.zip"))
        again = download(tmp_path / "art", source_url=m.url("/w.zip"))
    assert again == first and "Balanced text" in train_text(first)
    assert "it changes them between requests (a load balancer?), so this run cannot tell" in caplog.text
    assert not list((tmp_path / "art" / "corpus" / ".sources").glob("*.json")), "such answers are not recorded"


def test_last_modified_alone_does_not_name_a_content(tmp_path, caplog):
    """Only a Last-Modified (one-second resolution, a weak validator: RFC 9110 8.8.2.2): other bytes of the same
    size with the same mtime (``cp -p``, ``rsync -t``, ``tar x``) are a new version."""
    splits = shared_splits()
    changed = dict(splits, train=splits["train"].replace(" the ", " THE ", 1))
    zip_a, zip_b = wikitext_zip(splits, method=ZIP_STORED), wikitext_zip(changed, method=ZIP_STORED)
    assert len(zip_a) == len(zip_b) and zip_a != zip_b
    want_a = chapter_wikipedia_txt(zip_a, tmp_path / "ch-a")
    want_b = chapter_wikipedia_txt(zip_b, tmp_path / "ch-b")
    assert want_a != want_b, "the changed word is in the text the corpus keeps"
    served = tmp_path / "www"
    served.mkdir()
    zpath = served / "w.zip"
    mtime = 1_600_000_000
    zpath.write_bytes(zip_a)
    os.utime(zpath, (mtime, mtime))
    root = tmp_path / "art"
    with dir_server(served) as server, caplog.at_level("INFO", logger="wiki_pipeline"):
        url = server.url("w.zip")
        first = download(root, source_url=url)
        zpath.write_bytes(zip_b)  # replaced in place, its mtime kept (as cp -p leaves it)
        os.utime(zpath, (mtime, mtime))
        second = download(root, source_url=url)
        sha_b = hashlib.sha256(zip_b).hexdigest()
        pinned = download(root, source_url=url, expected_sha256=sha_b)
    assert joined_splits(Path(first["path"])) == want_a
    assert second["version"] != first["version"], "other bytes: another version"
    assert joined_splits(Path(second["path"])) == want_b
    assert metrics(pinned)["zip_sha256"] == sha_b and joined_splits(Path(pinned["path"])) == want_b
    assert "sends no strong ETag (size" in caplog.text and "so this run cannot tell" in caplog.text
    assert not list((root / "corpus" / ".sources").glob("*.json")), "a Last-Modified alone is not recorded"


@pytest.mark.parametrize("status, reason", [(404, "Not Found"), (410, "Gone")])
def test_a_404_is_an_answer_not_an_unreachable_source(tmp_path, fast_retries, status, reason):
    """A 404/410 fails the run: no fallback to the version of ``?f=A.zip``, which redacts like ``?f=NOPE.zip``."""
    with QueryMirror({"/get": tiny_zip("Alpha")}) as m:
        m.status = status
        root = tmp_path / "art"
        ref = download(root, source_url=m.url("/get?f=A.zip"))
        assert "Alpha text" in train_text(ref)
        m.clear_log()
        with pytest.raises(
            UserError,
            match=re.escape(
                f"downloading {m.url('/get?f=***')} failed: HTTP {status} {reason}; the file is not "
                "there: check source_url"
            ),
        ) as e:
            download(root, source_url=m.url("/get?f=NOPE.zip"))
        assert "NOPE" not in str(e.value)
        assert [r["status"] for r in m.requests] == [status], "a definitive answer: asked once, not retried"
    m_ = metrics(ref)
    assert m_["source_url"] == m.url("/get?f=***"), "shown redacted"
    assert m_["source_url_sha256"] == hashlib.sha256(m.url("/get?f=A.zip").encode()).hexdigest()
    assert "A.zip" not in all_text_under(root), "no query value stored"


def test_new_bytes_under_an_unchanged_etag_are_found_by_a_forced_rebuild(tmp_path):
    """What the docs say of an ETag made of mtime and size (nginx, Apache) when a file is replaced keeping both: the
    rerun reuses the old version (the server's word is taken); ``force`` rebuilds it, the build hashes what it reads
    and stops naming the change, and the next run has the new bytes."""
    old, new = tiny_zip("Aaaa"), tiny_zip("Bbbb")
    assert len(old) == len(new)
    root = tmp_path / "art"
    with FixedETagMirror({"/w.zip": old}) as m:
        first = download(root, source_url=m.url("/w.zip"))
        m.add("/w.zip", new)
        assert download(root, source_url=m.url("/w.zip")) == first, "the server says nothing changed"
        with pytest.raises(UserError, match=r"now holds other bytes \(sha256 " + hashlib.sha256(new).hexdigest()):
            download(root, source_url=m.url("/w.zip"), run={"force": ["corpus"]})
        second = download(root, source_url=m.url("/w.zip"))
    assert second["version"] != first["version"] and "Bbbb text" in train_text(second)
    assert "Aaaa text" in train_text(first), "the old version stays"


def test_a_damaged_download_is_not_remembered(tmp_path):
    """A damaged zip's sha256 is not kept under the server's ETag: the rerun, sent the good bytes under the same
    ETag, completes."""
    splits = {s: f" = Head {s} = \n Damage text of the {s} split .\n" for s in ("train", "valid", "test")}
    good = wikitext_zip(splits, method=ZIP_STORED)
    at = good.index(b"Damage text of the train")
    bad = good[:at] + b"d" + good[at + 1 :]  # the same size, one letter off: the member's CRC-32 fails
    root = tmp_path / "art"
    with FixedETagMirror({"/w.zip": bad}) as m:
        with pytest.raises(UserError, match=r"wiki.train.raw in .* is damaged \(Bad CRC-32"):
            download(root, source_url=m.url("/w.zip"))
        assert published(root) == []
        m.add("/w.zip", good)
        ref = download(root, source_url=m.url("/w.zip"))
    assert "Damage text of the train split" in train_text(ref)
    assert metrics(ref)["zip_sha256"] == hashlib.sha256(good).hexdigest()
