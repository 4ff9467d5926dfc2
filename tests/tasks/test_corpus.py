"""The corpus stage (download) against a real HTTP server on 127.0.0.1 (flows.mirror) and real wikitext text."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.mirror import MEMBER, Mirror, MirrorHandler, make_zip
from mygpt.errors import UserError
from tasks import corpus as D
from tasks.core.urls import address_sha256, redact_text, redact_url
from tasks.registry import open_store
from tasks.wikitext import unzip
from tasks.wikitext.download import ENV_ATTEMPTS, ENV_BASE_DELAY, ENV_READ_TIMEOUT, DownloadKnobs, fetch
from tasks.wikitext.header_strip import HEADER_RE, strip_headers
from tests.support import zips
from tests.support.mirror_faults import Faults, FaultyMirror
from tests.support.stages import corpus as download


# ---- the chapter's logic, copied faithfully (experiments/50_download_wikipedia.py, §28.3) ----------------
def chapter_wikipedia_txt(zip_bytes: bytes, workdir: Path) -> bytes:
    def _strip_wikitext_markup(text: str) -> str:
        return re.sub(r"^\s*=+ [^=]+ =+\s*$\n?", "", text, flags=re.MULTILINE)

    with zipfile.ZipFile(io.BytesIO(zip_bytes)) as z:
        z.extractall(workdir)
    out_path = workdir / "wikipedia.txt"
    with open(out_path, "w", encoding="utf-8") as out:
        for name in ("wiki.train.raw", "wiki.valid.raw", "wiki.test.raw"):
            with open(workdir / "wikitext-103-raw" / name, encoding="utf-8") as f:
                cleaned = _strip_wikitext_markup(f.read())
            out.write(cleaned)
    return out_path.read_bytes()


@pytest.fixture()
def fast_retries(monkeypatch):
    monkeypatch.setenv(ENV_BASE_DELAY, "0.01")
    monkeypatch.setenv(ENV_ATTEMPTS, "4")


def published(root: Path, stage: str = "corpus") -> list[str]:
    sdir = Path(root) / stage
    return sorted(p.name for p in sdir.iterdir() if not p.name.startswith(".")) if sdir.is_dir() else []


def metrics(ref) -> dict:
    return json.loads((Path(ref["path"]) / "manifest.json").read_text())["metrics"]


# ---- header stripping ---------------------------------------------------------------------------------
_LINES = st.one_of(
    st.sampled_from(
        [
            " \n",
            " = Title = \n",
            " = = Section = = \n",
            " = open\n",
            "close = \n",
            " a = b\n",
            " plain words .\n",
            "=\n",
            "  \n",
            "= x =",
            "\xa0= y =\xa0\n",
            " =\n",
            "\t\n",
        ]
    ),
    st.text(st.sampled_from(list("= x\n\xa0\u3000")), max_size=8),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_LINES, max_size=40), st.integers(1, 60), st.integers(1, 50))
def test_streamed_strip_equals_one_re_sub(lines, block_chars, piece):
    whole = "".join(lines)
    pieces = [whole[i : i + piece] for i in range(0, len(whole), piece)]
    got = list(strip_headers(pieces, block_chars))
    assert "".join(t for t, _ in got) == HEADER_RE.sub("", whole)
    assert sum(n for _, n in got) == len(HEADER_RE.findall(whole))


def test_streamed_strip_on_real_wikitext_small_blocks(wikitext2_text):
    pieces = [wikitext2_text[i : i + 7919] for i in range(0, len(wikitext2_text), 7919)]
    got = "".join(t for t, _ in strip_headers(pieces, block_chars=2000))
    assert got == re.sub(r"^\s*=+ [^=]+ =+\s*$\n?", "", wikitext2_text, flags=re.MULTILINE)


# ---- byte-identical to the chapter ----------------------------------------------------------------------
def test_http_download_is_byte_identical_to_the_chapter(tmp_path, mirror, wiki_zip):
    ref = download(tmp_path / "art", source_url=mirror.url(), expected_bytes=len(wiki_zip))
    out = Path(ref["path"])
    assert (out / "wikipedia.txt").read_bytes() == chapter_wikipedia_txt(wiki_zip, tmp_path / "chapter")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.json", "wikipedia.txt", "wiki.train.txt", "wiki.valid.txt", "wiki.test.txt"]
    )
    assert (out / "wikipedia.txt").read_bytes() == b"".join(
        (out / f"wiki.{s}.txt").read_bytes() for s in ("train", "valid", "test")
    )
    m = metrics(ref)
    assert m["zip_bytes"] == len(wiki_zip) and m["zip_published"] is False
    assert (
        m["splits"]["train"]["headers_stripped"] > 10
        and m["wikipedia"]["bytes"] == (out / "wikipedia.txt").stat().st_size
    )
    assert not (tmp_path / "art" / "corpus" / ".staging" / ref["version"]).exists()  # zip + work dir gone
    report = D.STAGE.report(json.loads((out / "manifest.json").read_text()))
    assert "| wiki.train.txt |" in report and m["zip_sha256"] in report


def test_newlines_and_odd_headers_match_the_chapter(tmp_path):
    """CRLF, lone CR, Unicode whitespace, headers at the very start/end, no final newline."""
    members = {
        MEMBER.format(split="train"): " = Head = \r\n \r\n Text with crlf .\r\nlone\rcr\r\n = = Sub = = \r\n"
        "\xa0= Nbsp header =\xa0\n Body ü 戦場 .\n = open\nnot closed\n end = \n",
        MEMBER.format(split="valid"): "= Top =\n\n\n = Two =\n = Three = \r",
        MEMBER.format(split="test"): " no newline at end = x",
    }
    data = make_zip(members)
    zpath = tmp_path / "odd.zip"
    zpath.write_bytes(data)
    ref = download(tmp_path / "art", source_url=zpath.as_uri())
    assert (Path(ref["path"]) / "wikipedia.txt").read_bytes() == chapter_wikipedia_txt(data, tmp_path / "ch")
    assert b"\r" not in (Path(ref["path"]) / "wikipedia.txt").read_bytes()


# ---- interruptions and retries ---------------------------------------------------------------------------
#: Every http(s) run first asks the server what the file is (its size and ETag enter the version): a one-byte
#: Range request. A mirror fault meant for the download itself is therefore set for 2 responses (the mirror
#: counts the probe's too).
PROBE = ("bytes=0-0", 206)


def test_dropped_connection_resumes_with_range(tmp_path, mirror, wiki_zip, fast_retries):
    mirror.set_faults(drop_after=100_000, drop_times=2)
    ref = download(tmp_path / "art", source_url=mirror.url())
    assert [(r["range"], r["status"]) for r in mirror.requests] == [PROBE, (None, 200), ("bytes=100000-", 206)]
    m = metrics(ref)
    assert m["download"]["tries"] == 2 and m["download"]["range_requests"] == 1
    assert (Path(ref["path"]) / "wikipedia.txt").read_bytes() == chapter_wikipedia_txt(wiki_zip, tmp_path / "ch")


def test_server_that_ignores_range_gets_a_clean_restart(tmp_path, mirror, wiki_zip, fast_retries):
    import hashlib

    mirror.set_faults(drop_after=100_000, drop_times=2, ignore_range=True)
    ref = download(tmp_path / "art", source_url=mirror.url())
    assert [(r["range"], r["status"]) for r in mirror.requests] == [
        ("bytes=0-0", 200),
        (None, 200),
        ("bytes=100000-", 200),
    ]
    assert metrics(ref)["zip_sha256"] == hashlib.sha256(wiki_zip).hexdigest()  # no bytes appended twice


@pytest.mark.parametrize("delta", [5000, -5000])
def test_wrong_content_length_is_overruled_by_the_probed_size(tmp_path, mirror, wiki_zip, fast_retries, delta):
    mirror.set_faults(length_delta=delta, length_times=2)
    ref = download(tmp_path / "art", source_url=mirror.url())
    # The size the probe read from Content-Range is the size to get: a Content-Length 5000 too large ends
    # nothing early; one 5000 too small cuts the body short, and the rest comes with a Range request.
    want = [PROBE, (None, 200)] + ([(f"bytes={len(wiki_zip) + delta}-", 206)] if delta < 0 else [])
    assert [(r["range"], r["status"]) for r in mirror.requests] == want
    assert metrics(ref)["zip_bytes"] == len(wiki_zip)


def test_stalled_body_hits_the_read_timeout_and_resumes(tmp_path, mirror, wiki_zip, fast_retries, monkeypatch):
    monkeypatch.setenv(ENV_READ_TIMEOUT, "1.0")
    mirror.set_faults(stall=4.0, stall_after=65536, stall_times=2)
    ref = download(tmp_path / "art", source_url=mirror.url())
    ranges = [r["range"] for r in mirror.requests]
    assert ranges[:2] == [PROBE[0], None] and ranges[-1] == "bytes=65536-"  # nothing received before the stall is lost
    assert metrics(ref)["zip_bytes"] == len(wiki_zip)


def test_interrupted_run_resumes_on_the_next_run(tmp_path, mirror, wiki_zip, monkeypatch):
    monkeypatch.setenv(ENV_ATTEMPTS, "1")
    mirror.set_faults(drop_after=150_000, drop_times=2)
    root = tmp_path / "art"
    with pytest.raises(UserError, match="failed 1 times in a row"):
        download(root, source_url=mirror.url())
    assert published(root) == []
    mirror.set_faults()
    mirror.clear_log()
    ref = download(root, source_url=mirror.url())
    assert [r["range"] for r in mirror.requests] == [PROBE[0], "bytes=150000-"]
    assert metrics(ref)["download"]["resumed_bytes"] == 150_000
    assert (Path(ref["path"]) / "wikipedia.txt").read_bytes() == chapter_wikipedia_txt(wiki_zip, tmp_path / "ch")


def test_503s_are_retried(tmp_path, mirror, fast_retries):
    mirror.set_faults(fail_first=2)
    download(tmp_path / "art", source_url=mirror.url())
    assert [r["status"] for r in mirror.requests] == [503, 503, 206, 200]  # the probe is retried like the download


def test_repeated_5xx_is_a_user_error_and_publishes_nothing(tmp_path, mirror, fast_retries, monkeypatch):
    monkeypatch.setenv(ENV_ATTEMPTS, "3")
    mirror.set_faults(fail_first=1000, fail_status=502)
    with pytest.raises(UserError, match=re.escape(mirror.url()) + ".*failed 3 times.*HTTP 502"):
        download(tmp_path / "art", source_url=mirror.url())
    assert len(mirror.requests) == 3
    assert published(tmp_path / "art") == [] and open_store(tmp_path / "art").versions() == []


def test_404_is_not_retried(tmp_path, mirror, fast_retries):
    url = mirror.url("/nope.zip")
    with pytest.raises(UserError, match=re.escape(url) + ".*HTTP 404.*check source_url"):
        download(tmp_path / "art", source_url=url)
    assert len(mirror.requests) == 1 and published(tmp_path / "art") == []


# ---- bad archives and checks -----------------------------------------------------------------------------
def _bad_archives() -> dict[str, tuple[bytes, str]]:
    good = {MEMBER.format(split=s): f" = T{s} = \n text {s} .\n" for s in ("train", "valid", "test")}
    missing = dict(good)
    del missing[MEMBER.format(split="valid")]
    bad_utf8 = dict(good)
    bad_utf8[MEMBER.format(split="test")] = b" caf\xc3\xa9 ok\n bad \xff here\n"
    return {
        "not-a-zip": (b"<html>Not the file you wanted</html>", "is not a zip archive"),
        "missing-member": (make_zip(missing), "has no member 'wikitext-103-raw/wiki.valid.raw'"),
        "not-utf8": (
            make_zip(bad_utf8),
            r"wikitext-103-raw/wiki.test.raw in .* is not valid UTF-8: byte 0xff at offset 15",
        ),
    }


@pytest.mark.parametrize("case", ["not-a-zip", "missing-member", "not-utf8"])
def test_bad_archive_is_a_user_error_and_publishes_nothing(tmp_path, case):
    data, message = _bad_archives()[case]
    with Mirror({"/w.zip": data}) as m, pytest.raises(UserError, match=message):
        download(tmp_path / "art", source_url=m.url("/w.zip"))
    assert published(tmp_path / "art") == []
    staged = list((tmp_path / "art" / "corpus" / ".staging").glob("*/work/source.zip"))
    assert staged == []  # a rerun downloads again instead of reusing the bad archive


def test_expected_size_and_sha256(tmp_path, mirror, wiki_zip):
    import hashlib

    with pytest.raises(UserError, match=f"is {len(wiki_zip):,} bytes but expected_bytes is 123"):
        download(tmp_path / "a", source_url=mirror.url(), expected_bytes=123)
    with pytest.raises(UserError, match="expected_sha256 is " + "0" * 64):
        download(tmp_path / "b", source_url=mirror.url(), expected_sha256="0" * 64)
    assert published(tmp_path / "a") == [] and published(tmp_path / "b") == []
    sha = hashlib.sha256(wiki_zip).hexdigest()
    ref = download(tmp_path / "c", source_url=mirror.url(), expected_sha256=sha.upper())
    assert metrics(ref)["zip_sha256"] == sha


def test_missing_local_file(tmp_path):
    with pytest.raises(UserError, match="there is no file"):
        download(tmp_path / "art", source_url=(tmp_path / "absent.zip").as_uri())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"source_url": "ftp://example.org/w.zip"}, "scheme 'ftp'"),
        ({"source_url": "wikitext.zip"}, "scheme '\\(none\\)'"),
        ({"source_url": "https:///w.zip"}, "has no host"),
        ({"source_url": "file://host/w.zip"}, "cannot name a host"),
        ({"source_url": ""}, "source_url must be"),
        ({"expected_bytes": -1}, "expected_bytes must be a whole number"),
        ({"expected_bytes": 1.5}, "expected_bytes must be a whole number"),
        ({"expected_sha256": "abc"}, "expected_sha256 must be 64 hexadecimal digits"),
    ],
)
def test_settings_reject(kwargs, message):
    with pytest.raises(UserError, match=message):
        D.CorpusSettings.parse(kwargs)


def test_settings_defaults_pin_the_chapter_size():
    def resolved(**kw):
        return D.CorpusSettings(**kw).resolved().model_dump(mode="json")

    assert resolved() == {"source_url": D.DEFAULT_URL, "expected_bytes": 191_984_949, "expected_sha256": None}
    assert D.CorpusSettings().resolved().version_params() == {"expected_bytes": 191_984_949, "expected_sha256": None}
    assert resolved(source_url="http://127.0.0.1:1/x.zip")["expected_bytes"] == 0
    assert resolved(expected_bytes=0)["expected_bytes"] == 0


def test_mirror_serves_loopback_only(mirror):
    assert mirror.base_url.startswith("http://127.0.0.1:")
    assert mirror._server.server_address[0] == "127.0.0.1"


# ---- the version follows what is at source_url (issue 10, item 3) ------------------------------------------
def _tiny_zip(word: str) -> bytes:
    return make_zip(
        {
            MEMBER.format(split=s): f" = {word} {s} = \n {word} text of the {s} split .\n"
            for s in ("train", "valid", "test")
        }
    )


def _train_text(ref) -> str:
    return (Path(ref["path"]) / "wiki.train.txt").read_text(encoding="utf-8")


def test_new_content_in_the_same_file_is_a_new_version(tmp_path):
    zpath = tmp_path / "w.zip"
    zpath.write_bytes(_tiny_zip("Old"))
    first = download(tmp_path / "art", source_url=zpath.as_uri())
    zpath.write_bytes(_tiny_zip("New"))  # same URL, different text
    second = download(tmp_path / "art", source_url=zpath.as_uri())
    assert second["version"] != first["version"] and "New text" in _train_text(second)
    assert "Old text" in _train_text(first), "the old version stays, for whoever switches back"
    again = download(tmp_path / "art", source_url=zpath.as_uri())
    assert again == second, "unchanged file: the same version, reused"
    manifest = json.loads((Path(second["path"]) / "manifest.json").read_text())
    assert manifest["source"] == {
        "bytes": zpath.stat().st_size,
        "sha256": hashlib.sha256(zpath.read_bytes()).hexdigest(),
    }


def test_new_content_at_the_same_http_url_is_a_new_version(tmp_path):
    with Mirror({"/w.zip": _tiny_zip("Old")}) as m:
        first = download(tmp_path / "art", source_url=m.url("/w.zip"))
        m.add("/w.zip", _tiny_zip("Newer"))  # the mirror now serves other bytes (another ETag and size)
        second = download(tmp_path / "art", source_url=m.url("/w.zip"))
        assert second["version"] != first["version"] and "Newer text" in _train_text(second)
        m.clear_log()
        assert download(tmp_path / "art", source_url=m.url("/w.zip")) == second
        assert [r["range"] for r in m.requests] == ["bytes=0-0"], "a reuse costs one probe, no download"
        source = json.loads((Path(second["path"]) / "manifest.json").read_text())["source"]
        assert source == {"bytes": len(_tiny_zip("Newer")), "sha256": hashlib.sha256(_tiny_zip("Newer")).hexdigest()}


def test_the_same_bytes_from_another_mirror_are_the_same_version(tmp_path, caplog, fast_retries):
    """Issue 20 item 6: ``--mirror`` on another port gave new versions of every stage from the same zip; and once
    the other mirror is known to serve those bytes, a run of it reuses that version offline too."""
    data = _tiny_zip("Same")
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


def test_offline_the_bytes_the_address_served_last_are_reused(tmp_path, fast_retries, caplog):
    """Reviewer: the fallback took the version *published* last from the address. Here /x.zip served A (published
    from it), then B (published earlier from /y.zip, reused): offline, /x.zip's run reuses B, what it served last."""
    a, b = _tiny_zip("Aaaa"), _tiny_zip("Bbbb")
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
    """Reviewer: a server without a strong ETag leaves no index entry, and the fallback took the version published
    last. Here it served A, B, then A again: offline, A is reused."""
    a, b = _tiny_zip("Aaaa"), _tiny_zip("Bbbb")
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


def test_a_stray_download_at_the_address_s_path_is_not_taken_for_the_version_s_bytes(tmp_path):
    """Reviewer: the build took whatever file lay at the address's download path (a killed run's download of other
    bytes) and failed with a false "now holds other bytes"; it takes one only when its recorded sha256 is the
    version's."""
    root = tmp_path / "art"
    with Mirror({"/x.zip": _tiny_zip("Aaaa")}) as m:
        first = download(root, source_url=m.url("/x.zip"))
        stray = D._index(open_store(root)).download_path(address_sha256(m.url("/x.zip")))
        stray.parent.mkdir(parents=True, exist_ok=True)
        stray.write_bytes(_tiny_zip("Bbbb"))
        D.SourceIndex.facts_path(stray).write_text(json.dumps({"sha256": hashlib.sha256(b"other").hexdigest()}))
        again = download(root, source_url=m.url("/x.zip"), run={"force": ["corpus"]})
    assert again["version"] == first["version"] and "Aaaa text" in _train_text(again)


def test_a_renewed_signed_url_is_the_same_address(tmp_path, fast_retries, caplog):
    """Reviewer: with the query part of the address, every renewed signature downloaded the zip again and had no
    offline fallback. The signing parameters (``X-Amz-*``, ``sig``, ``token``, ...) are not part of it."""
    root = tmp_path / "art"
    with Mirror({"/s.zip": _tiny_zip("Signed")}) as m:
        signed = m.url("/s.zip") + "?X-Amz-Credential=AK%2F1&X-Amz-Signature={}&X-Amz-Expires=60"
        first = download(root, source_url=signed.format("aaaa1111"))
        m.clear_log()
        assert download(root, source_url=signed.format("bbbb2222")) == first
        assert [r["range"] for r in m.requests] == ["bytes=0-0"], "a renewed signature: one probe, no download"
    with caplog.at_level("WARNING", logger="wiki_pipeline"):  # the server gone: the fallback holds too
        assert download(root, source_url=signed.format("cccc3333")) == first
    assert f"reusing corpus/{first['version']}" in caplog.text
    assert not [s for s in ("aaaa1111", "bbbb2222", "cccc3333", "AK") if s in _all_text_under(root)]


def test_a_server_without_validators_is_checked_by_its_bytes(tmp_path, caplog):
    """Issue 21 item 4: a size but no ETag/Last-Modified, new bytes of the same size: reused silently before. (A
    Last-Modified alone is no better: test_last_modified_alone_does_not_name_a_content.)"""
    old, new = _tiny_zip("Aaaa"), _tiny_zip("Bbbb")
    assert len(old) == len(new)
    with (
        FaultyMirror({"/w.zip": old}, faults=Faults(no_validators=True)) as m,
        caplog.at_level("INFO", logger="wiki_pipeline"),
    ):
        first = download(tmp_path / "art", source_url=m.url("/w.zip"))
        m.add("/w.zip", new)
        second = download(tmp_path / "art", source_url=m.url("/w.zip"))
    assert second["version"] != first["version"] and "Bbbb text" in _train_text(second)
    assert "Aaaa text" in _train_text(first)
    assert caplog.text.count(f"sends no strong ETag (size `{len(old)}`), so this run cannot tell") == 2


def test_a_server_whose_etag_changes_on_every_request_completes(tmp_path, caplog):
    """Issue 21 item 4: a load balancer's ETag changes per request: before, every run failed with 'changed while
    this run was fetching it'."""
    data = _tiny_zip("Balanced")
    with (
        FaultyMirror({"/w.zip": data}, faults=Faults(etag_per_request=True)) as m,
        caplog.at_level("INFO", logger="wiki_pipeline"),
    ):
        first = download(tmp_path / "art", source_url=m.url("/w.zip"))
        again = download(tmp_path / "art", source_url=m.url("/w.zip"))
    assert again == first and "Balanced text" in _train_text(first)
    assert "it changes them between requests (a load balancer?), so this run cannot tell" in caplog.text
    assert not list((tmp_path / "art" / "corpus" / ".sources").glob("*.json")), "such answers are not recorded"


def test_unreachable_source_reuses_the_newest_version_from_it(tmp_path, fast_retries, caplog):
    with FaultyMirror({"/w.zip": _tiny_zip("Kept")}) as m:
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


def _stored_zip(splits: dict[str, str]) -> bytes:
    """A wikitext-103-shaped zip, members stored (not deflated): the same text with one letter's case changed is
    a zip of the same size."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        for s in ("train", "valid", "test"):
            z.writestr(zipfile.ZipInfo(MEMBER.format(split=s), date_time=(2016, 9, 26, 0, 0, 0)), splits[s])
    return buf.getvalue()


class _DirServer:
    """Python's own ``http.server`` (``SimpleHTTPRequestHandler``) serving a folder on 127.0.0.1: it names a file
    by ``Last-Modified`` (the file's mtime, to the second) and its size only -- no ETag, no Range."""

    def __init__(self, directory: Path) -> None:
        import functools
        import threading
        from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

        class Quiet(SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{name}"

    def __enter__(self) -> _DirServer:
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_last_modified_alone_does_not_name_a_content(tmp_path, wikitext2_path, caplog):
    """Reviewer item 1: a server that sends only Last-Modified (1-second resolution, a weak validator: RFC 9110
    8.8.2.2) serving other bytes of the same size with the same mtime (``cp -p``, ``rsync -t``, ``tar x``) made the
    next run reuse the old version silently."""
    from flows.mirror import wikitext_splits

    splits = wikitext_splits(wikitext2_path.parent)
    changed = dict(splits, train=splits["train"].replace(" the ", " THE ", 1))
    zip_a, zip_b = _stored_zip(splits), _stored_zip(changed)
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
    with _DirServer(served) as server, caplog.at_level("INFO", logger="wiki_pipeline"):
        url = server.url("w.zip")
        first = download(root, source_url=url)
        zpath.write_bytes(zip_b)  # replaced in place, its mtime kept (as cp -p leaves it)
        os.utime(zpath, (mtime, mtime))
        second = download(root, source_url=url)
        sha_b = hashlib.sha256(zip_b).hexdigest()
        pinned = download(root, source_url=url, expected_sha256=sha_b)
    assert (Path(first["path"]) / "wikipedia.txt").read_bytes() == want_a
    assert second["version"] != first["version"], "other bytes: another version"
    assert (Path(second["path"]) / "wikipedia.txt").read_bytes() == want_b
    assert metrics(pinned)["zip_sha256"] == sha_b and (Path(pinned["path"]) / "wikipedia.txt").read_bytes() == want_b
    assert "sends no strong ETag (size" in caplog.text and "so this run cannot tell" in caplog.text
    assert not list((root / "corpus" / ".sources").glob("*.json")), "a Last-Modified alone is not recorded"


class _QueryHandler(MirrorHandler):
    """Serves ``/get?f=A.zip`` (the mirror's ``/get``) and answers any other ``f`` with the mirror's ``status``."""

    def refusal(self) -> tuple[int, str] | None:
        import urllib.parse

        wanted = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("f")
        return None if wanted == ["A.zip"] else (self.server.mirror.status, "no such file")


class _QueryMirror(Mirror):
    handler = _QueryHandler
    status = 404


@pytest.mark.parametrize("status, reason", [(404, "Not Found"), (410, "Gone")])
def test_a_404_is_an_answer_not_an_unreachable_source(tmp_path, fast_retries, status, reason):
    """Reviewer item 2: a 404/410 fell back to the last version published from the same *redacted* URL, and
    ``?f=A.zip`` and ``?f=NOPE.zip`` redact alike: the run completed with A's corpus."""
    with _QueryMirror({"/get": _tiny_zip("Alpha")}) as m:
        m.status = status
        root = tmp_path / "art"
        ref = download(root, source_url=m.url("/get?f=A.zip"))
        assert "Alpha text" in _train_text(ref)
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
    assert "A.zip" not in _all_text_under(root), "no query value stored"


def test_the_offline_fallback_matches_the_whole_address_not_its_redacted_form(tmp_path, fast_retries, caplog):
    """Reviewer item 2: with the server down, ``?f=B.zip`` reused the version published from ``?f=A.zip``."""
    root = tmp_path / "art"
    with _QueryMirror({"/get": _tiny_zip("Alpha")}) as m:
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
    assert "S3CRET" not in _all_text_under(root) + caplog.text


def test_a_legacy_version_without_a_query_falls_back_by_its_redacted_url(tmp_path, fast_retries):
    with Mirror({"/w.zip": _tiny_zip("Legacy")}) as m:
        url = m.url("/w.zip")
        ref = download(tmp_path / "art", source_url=url)
    manifest_path = Path(ref["path"]) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["metrics"]["source_url_sha256"]
    manifest_path.write_text(json.dumps(manifest))
    assert download(tmp_path / "art", source_url=url) == ref


class _FixedETagHandler(MirrorHandler):
    """A lying server: whatever it serves, it calls it by one strong ETag."""

    def response_headers(self, headers: dict[str, str]) -> dict[str, str]:
        headers["ETag"] = '"always-the-same"'
        return headers


class _FixedETagMirror(Mirror):
    handler = _FixedETagHandler


def test_new_bytes_under_an_unchanged_etag_are_found_by_a_forced_rebuild(tmp_path):
    """What the docs say of an ETag made of mtime and size (nginx, Apache) when a file is replaced keeping both: the
    rerun reuses the old version (the server's word is taken); ``force`` rebuilds it, the build hashes what it reads
    and stops naming the change, and the next run has the new bytes."""
    old, new = _tiny_zip("Aaaa"), _tiny_zip("Bbbb")
    assert len(old) == len(new)
    root = tmp_path / "art"
    with _FixedETagMirror({"/w.zip": old}) as m:
        first = download(root, source_url=m.url("/w.zip"))
        m.add("/w.zip", new)
        assert download(root, source_url=m.url("/w.zip")) == first, "the server says nothing changed"
        with pytest.raises(UserError, match=r"now holds other bytes \(sha256 " + hashlib.sha256(new).hexdigest()):
            download(root, source_url=m.url("/w.zip"), run={"force": ["corpus"]})
        second = download(root, source_url=m.url("/w.zip"))
    assert second["version"] != first["version"] and "Bbbb text" in _train_text(second)
    assert "Aaaa text" in _train_text(first), "the old version stays"


def test_a_damaged_download_is_not_remembered(tmp_path):
    """Reviewer item 3: the damaged zip's sha256 stayed in the source index under the server's ETag, so the rerun
    (the server now sends the good bytes under the same ETag) failed with "now holds other bytes"."""
    good = _stored_zip({s: f" = Head {s} = \n Damage text of the {s} split .\n" for s in ("train", "valid", "test")})
    at = good.index(b"Damage text of the train")
    bad = good[:at] + b"d" + good[at + 1 :]  # the same size, one letter off: the member's CRC-32 fails
    root = tmp_path / "art"
    with _FixedETagMirror({"/w.zip": bad}) as m:
        with pytest.raises(UserError, match=r"wiki.train.raw in .* is damaged \(Bad CRC-32"):
            download(root, source_url=m.url("/w.zip"))
        assert published(root) == []
        m.add("/w.zip", good)
        ref = download(root, source_url=m.url("/w.zip"))
    assert "Damage text of the train split" in _train_text(ref)
    assert metrics(ref)["zip_sha256"] == hashlib.sha256(good).hexdigest()


class _AcceptAndClose:
    """A listening socket on 127.0.0.1:``port`` that accepts each connection and closes it at once (a server
    that is down behind a live port), counting the connections."""

    def __init__(self, port: int) -> None:
        import socketserver
        import threading

        owner = self
        self.connections = 0

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                owner.connections += 1

        class Server(socketserver.TCPServer):
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def __enter__(self) -> _AcceptAndClose:
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_an_offline_rerun_asks_twice_before_falling_back(tmp_path, monkeypatch, caplog):
    """Reviewer item 4: with the mirror down, an all-cached rerun retried the probe like a download (6 tries,
    62 s of back-off by default) before reusing the last version."""
    monkeypatch.setenv(ENV_ATTEMPTS, "6")
    monkeypatch.setenv(ENV_BASE_DELAY, "0.01")
    with Mirror({"/w.zip": _tiny_zip("Cached")}) as m:
        url, port = m.url("/w.zip"), m.port
        ref = download(tmp_path / "art", source_url=url)
    with _AcceptAndClose(port) as down:
        with caplog.at_level("WARNING", logger="wiki_pipeline"):
            assert download(tmp_path / "art", source_url=url) == ref
        assert down.connections == 2, "one try and one retry, then the fallback"
        assert f"cannot check {url} now" in caplog.text and f"reusing corpus/{ref['version']}" in caplog.text
        down.connections = 0
        with pytest.raises(UserError, match=re.escape(url) + " failed 6 times in a row"):
            download(tmp_path / "fresh", source_url=url)  # nothing to fall back to: every try
        assert down.connections == 6


# ---- credentials in the URL (item 5) -----------------------------------------------------------------------
SECRETS = ("S3CRET", "T0KEN-abc")


def _all_text_under(root: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in Path(root).rglob("*") if p.is_file())


def test_credentials_in_the_url_are_used_but_never_shown_or_stored(tmp_path, caplog, fast_retries):
    from tasks.core.report import settings_table

    with Mirror({"/w.zip": _tiny_zip("Secret")}) as m:
        url = f"http://alice:S3CRET@127.0.0.1:{m.port}/w.zip?token=T0KEN-abc&x=1"
        with caplog.at_level("INFO", logger="wiki_pipeline"):
            ref = download(tmp_path / "art", source_url=url)
            other = download(tmp_path / "art", source_url=url.replace("S3CRET", "0ther").replace("T0KEN", "TOK2"))
        manifest = json.loads((Path(ref["path"]) / "manifest.json").read_text())
        shown = [
            caplog.text,
            _all_text_under(tmp_path / "art"),
            D.STAGE.report(manifest) + settings_table(manifest["settings"]),
        ]
        assert "Secret text" in _train_text(ref), "the credentials were used to download"
        assert manifest["metrics"]["source_url"] == f"http://***@127.0.0.1:{m.port}/w.zip?token=***&x=***"
        assert "source_url" not in manifest["settings"], "the URL is where, not what: not part of the version"
        assert other == ref, "the version id does not depend on the credentials (only on the file)"
        errors = []
        for bad in (url.replace("/w.zip", "/gone.zip"), url.replace(str(m.port), str(_closed_port()))):
            with pytest.raises(UserError) as e:
                download(tmp_path / "bad", source_url=bad)
            errors.append(str(e.value))
    assert "HTTP 404" in errors[0] and "failed 4 times in a row" in errors[1]
    assert "***@127.0.0.1" in errors[0] and "token=***" in errors[1]
    shown += errors + [caplog.text, _all_text_under(tmp_path / "bad")]
    leaks = [
        (secret, text[max(0, text.find(secret) - 80) : text.find(secret) + 20])
        for text in shown
        for secret in SECRETS
        if secret in text
    ]
    assert not leaks, leaks


def _closed_port() -> int:
    from flows.server import free_port

    return free_port()  # bound and released: nothing listens there


def test_redact_url():
    assert (
        redact_url("https://u:p@h:8/a/b.zip?sig=x%2F&e=1#f") == "https://***@h:8/a/b.zip?sig=***&e=***#***"
    )  # a fragment may hold a token
    assert redact_url("https://h/b.zip?tokenonly") == "https://h/b.zip?***"
    assert redact_url(D.DEFAULT_URL) == D.DEFAULT_URL
    # what stored things name an address by: the URL but its user info, fragment and signing parameters, hashed
    plain = hashlib.sha256(b"https://h:8/a/b.zip?e=1").hexdigest()
    assert address_sha256("https://u:p@H:8/a/b.zip?sv=2020&sig=x%2F&e=1#f") == plain
    assert address_sha256("https://h:8/a/b.zip?sv=2021&sig=y&se=2030&e=1") == plain, "a renewed Azure signature"
    assert address_sha256("https://h:8/a/b.zip?X-Amz-Signature=s&X-Amz-Expires=9&e=1") == plain, "S3 v4"
    assert address_sha256("https://h:8/a/b.zip?e=1&Signature=s&AWSAccessKeyId=k&Expires=9") == plain, "S3 v2"
    assert address_sha256("https://h:8/a/b.zip?e=2") != plain, "another file-selecting value: another address"
    for own in ("sig=y&e=1", "e=1&token=1", "e=1&Expires=9", "sp=r&e=1"):  # no signature scheme's marker there
        assert address_sha256(f"https://h:8/a/b.zip?{own}") != plain, f"?{own}: a server's own parameters count"
    assert (
        redact_text("GET /b.zip?sig=x%2F&e=1 failed", "https://h/b.zip?sig=x%2F&e=1")
        == "GET /b.zip?sig=***&e=*** failed"
    )
    # a redirect's target, whose secrets the source URL does not name, as requests quotes it (the path only; it
    # leaves ' ( ) unencoded in a query)
    assert (
        redact_text("url: /x.zip?token=ab'S3CR3T (Caused by x)", "http://h/r") == "url: /x.zip?token=*** (Caused by x)"
    )
    assert redact_text("for 'ftp://h/x?token=ab(S3CR3T)'", "http://h/r") == "for 'ftp://h/x?token=***'"
    assert redact_text("url: /dl/wiki(1).zip?sig=S3CR3T (x)", "http://h/r") == "url: /dl/wiki(1).zip?sig=*** (x)"
    assert redact_text("url: /dl/a[1].zip?sig=S3CR3T", "http://h/r") == "url: /dl/a[1].zip?sig=***"
    assert (
        redact_text("{'url':'http://h/f.zip?a=1','status':500,'detail':'disk full'}", "http://h/r")
        == "{'url':'http://h/f.zip?a=***','status':500,'detail':'disk full'}"
    )
    assert (
        redact_text("Max retries exceeded with url: /t.zip?X-Amz-Signature=S3CR3T&X-Amz-Credential=K (x)", "http://h/r")
        == "Max retries exceeded with url: /t.zip?X-Amz-Signature=***&X-Amz-Credential=*** (x)"
    )


def _written_forms(secret: str) -> set[str]:
    """``secret`` as a message may quote it: raw, percent-encoded (either case of hex, ``+`` for a space)."""
    from urllib.parse import quote, quote_plus

    forms = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret)}
    return forms | {re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), f) for f in forms}


@pytest.mark.parametrize(
    "secret",
    ["1|SECRET", "TKsëcret", "50%secret", "p@ss:w/rd", "a b+c&d"],
)
def test_query_secrets_never_shown_in_any_encoding(tmp_path, caplog, monkeypatch, secret):
    """Issue 21 item 1: requests' errors quote the query percent-encoded (``token=1%7CSECRET``)."""
    from urllib.parse import quote

    monkeypatch.setenv(ENV_ATTEMPTS, "2")
    monkeypatch.setenv(ENV_BASE_DELAY, "0")
    url = f"http://127.0.0.1:{_closed_port()}/w.zip?token={quote(secret, safe='|@:/')}"
    with caplog.at_level("INFO", logger="wiki_pipeline"), pytest.raises(UserError) as e:
        download(tmp_path / "art", source_url=url)
    shown = str(e.value) + "\n" + caplog.text + "\n" + _all_text_under(tmp_path / "art")
    assert "failed 2 times in a row" in str(e.value) and "token=***" in str(e.value)
    assert "retrying" in caplog.text, "the warnings were checked too"
    leaks = [form for form in _written_forms(secret) if form in shown]
    assert not leaks, (leaks, shown)


@pytest.mark.parametrize("password", ["p@ss", "p:ss", "50%pw", "p/ss", "ü@:/%x"])
def test_passwords_with_separators_are_redacted(password):
    """Issue 21: no test used a secret holding ``@``, ``:``, ``%`` or ``/`` (``partition("@")`` would show
    ``https://***@ss@host/w.zip`` for ``p@ss``)."""
    from urllib.parse import quote

    for written in {password.replace("/", "%2F"), quote(password, safe="")}:  # a raw "/" would end the host
        url = f"https://alice:{written}@mirror.example.org/w.zip?sig={quote(password, safe='')}"
        assert redact_url(url) == "https://***@mirror.example.org/w.zip?sig=***"
        message = f"GET {url} failed; auth alice:{written}@; sig={quote(password, safe='')} / {password}"
        shown = redact_text(message, url)
        assert "alice:" not in shown and "mirror.example.org/w.zip?sig=***" in shown
        assert not [form for form in _written_forms(password) if form in shown], shown


def test_a_file_url_with_user_info_is_refused_without_showing_it():
    with pytest.raises(UserError) as e:
        D.CorpusSettings.parse({"source_url": "file://user:PW@host/x.zip"})
    assert "cannot name a host ('host')" in str(e.value) and "PW" not in str(e.value)


# ---- bounds (item 6) ---------------------------------------------------------------------------------------
class _NoLengthHandler:
    """An HTTP/1.0 server that sends a body of ``size`` bytes without Content-Length (until it closes)."""

    @staticmethod
    def serve(size: int):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(200)
                self.end_headers()
                try:
                    for _ in range(size // 65536):
                        self.wfile.write(b"x" * 65536)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


def test_download_stops_as_soon_as_it_exceeds_expected_bytes(tmp_path, fast_retries):
    server = _NoLengthHandler.serve(8 << 20)  # 8 MiB, size never announced
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/big.zip"
        with pytest.raises(
            UserError,
            match=r"is larger than expected_bytes \(1,000,000\): it sent more; "
            r"stopped at [\d,]+ bytes, so nothing was kept",
        ):
            download(tmp_path / "art", source_url=url, expected_bytes=1_000_000)
    finally:
        server.shutdown()
        server.server_close()
    assert (
        published(tmp_path / "art") == []
        and not list((tmp_path / "art").rglob("source.zip"))
        and not list((tmp_path / "art").rglob("source.zip.part"))
    ), "nothing of the oversized body was kept"


def test_announced_size_beyond_the_bound_is_refused_before_the_body(tmp_path, mirror, wiki_zip):
    with pytest.raises(UserError, match=f"is {len(wiki_zip):,} bytes but expected_bytes is 1,000"):
        download(tmp_path / "art", source_url=mirror.url(), expected_bytes=1000)
    assert [r["range"] for r in mirror.requests] == ["bytes=0-0"], "refused from the probe: nothing downloaded"
    with pytest.raises(UserError, match=r"larger than expected_bytes \(1,000\): it announces"):
        fetch(mirror.url(), tmp_path / "z.zip", max_bytes=1000)
    assert not list(tmp_path.glob("z.zip*"))


def _bad_zips() -> dict[str, tuple[Callable[[], bytes], str]]:
    return {
        "encrypted": (
            lambda: zips.encrypted_zip(),
            r"wiki.train.raw in .* is encrypted; the wikitext-103-raw-v1 zip is not",
        ),
        "deflate64": (
            lambda: zips.deflate64_zip(),
            r"wiki.train.raw in .* is compressed with method 9 \(deflate64\), which Python's zipfile cannot "
            r"read \(it reads stored, deflate, bzip2, lzma\)",
        ),
        "bomb": (
            lambda: zips.bomb_zip(30),
            r"would unzip [\d.]+ KB into 30.0 MB \([\d,]+x; text compresses 3-4x, this "
            r"stage accepts at most 20x\): it looks like a zip bomb",
        ),
        "lies about its size": (
            lambda: zips.lying_size_zip(),
            r"wiki.train.raw in .* unzips to more than the 10 bytes its header declares \(stopped after [\d,]+\): "
            r"the zip lies about its sizes",
        ),
        "bzip2 raised compressed size": (
            lambda: zips.raised_compressed_size_zip(zipfile.ZIP_BZIP2),
            r"wiki.train.raw in .* declares 441,505 compressed bytes, but only [\d,]+ bytes \(header included\) "
            r"are there before the next entry: the zip lies about its sizes",
        ),
        "deflate raised compressed size": (
            lambda: zips.raised_compressed_size_zip(zipfile.ZIP_DEFLATED),
            r"wiki.train.raw in .* declares 441,505 compressed bytes, but only [\d,]+ bytes",
        ),
        "bzip2 understated size": (
            lambda: zips.understated_size_zip(zipfile.ZIP_BZIP2),
            r"wiki.train.raw in .* unzips to more than the 600,000 bytes its header declares \(stopped after",
        ),
        "deflate understated size": (
            lambda: zips.understated_size_zip(zipfile.ZIP_DEFLATED),
            r"wiki.train.raw in .* unzips to more than the 600,000 bytes its header declares",
        ),
        "lzma understated size": (
            lambda: zips.understated_size_zip(zipfile.ZIP_LZMA),
            r"wiki.train.raw in .* unzips to more than the 600,000 bytes its header declares",
        ),
    }


_READ_TIME_CHECKS = (
    "lies about its size",
    "bzip2 understated size",
    "deflate understated size",
    "lzma understated size",
)


@pytest.mark.parametrize(
    "case",
    [
        "encrypted",
        "deflate64",
        "bomb",
        "lies about its size",
        "bzip2 raised compressed size",
        "deflate raised compressed size",
        "bzip2 understated size",
        "deflate understated size",
        "lzma understated size",
    ],
)
def test_zip_members_are_checked_before_anything_is_unzipped(tmp_path, case):
    make, message = _bad_zips()[case]
    zpath = tmp_path / "w.zip"
    zpath.write_bytes(make())
    with pytest.raises(UserError, match=message):
        download(tmp_path / "art", source_url=zpath.as_uri())
    assert published(tmp_path / "art") == []
    written = [p for p in (tmp_path / "art" / "corpus" / ".staging").rglob("*.txt")]
    assert case in _READ_TIME_CHECKS or written == [], "nothing extracted before the checks"
    assert not [p for p in written if p.name == "wiki.train.txt"], "the lying member's text was not kept"
    assert sum(p.stat().st_size for p in written) <= 600_000, "a member never yields more than its declared size"


def test_unzipped_total_is_bounded(tmp_path, monkeypatch):
    zpath = tmp_path / "w.zip"
    zpath.write_bytes(_tiny_zip("Total"))
    monkeypatch.setattr(unzip, "MAX_UNZIPPED_BYTES", 64)
    with pytest.raises(UserError, match=r"would unzip to \d+ B, more than the 64 B this stage accepts"):
        download(tmp_path / "art", source_url=zpath.as_uri())


# ---- the download knobs (item 7) ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "env, value, message",
    [
        (ENV_ATTEMPTS, "nan", r"WIKI_PIPELINE_DOWNLOAD_ATTEMPTS must be a whole number >= 1, got 'nan'"),
        (ENV_ATTEMPTS, "2.5", r"must be a whole number >= 1, got '2.5'"),
        (ENV_ATTEMPTS, "0", r"must be a whole number >= 1, got '0'"),
        (ENV_BASE_DELAY, "-1", r"WIKI_PIPELINE_RETRY_BASE_DELAY must be a number of seconds >= 0, got '-1'"),
        (ENV_BASE_DELAY, "inf", r"must be a number of seconds >= 0, got 'inf'"),
        (ENV_ATTEMPTS, "1e12", r"WIKI_PIPELINE_DOWNLOAD_ATTEMPTS must be at most 1000, got '1e12' \(failed tries"),
        (ENV_BASE_DELAY, "1e300", r"WIKI_PIPELINE_RETRY_BASE_DELAY must be at most 3600 seconds \(an hour\), got"),
        (
            ENV_READ_TIMEOUT,
            "1e300",
            r"WIKI_PIPELINE_READ_TIMEOUT must be at most 86400 seconds \(a day\), got '1e300' \(seconds without "
            r"data before a try fails; default 60\); fix or unset it",
        ),
        (ENV_READ_TIMEOUT, "0", r"WIKI_PIPELINE_READ_TIMEOUT must be a number of seconds > 0, got '0'"),
        (
            ENV_READ_TIMEOUT,
            "-5",
            r"must be a number of seconds > 0, got '-5' \(seconds without data before a try "
            r"fails; default 60\); fix or unset it",
        ),
    ],
)
def test_bad_download_knobs_are_user_errors(monkeypatch, env, value, message):
    monkeypatch.setenv(env, value)
    with pytest.raises(UserError, match=message):
        DownloadKnobs.from_env()


def test_download_knobs_from_env(monkeypatch):
    for env in (ENV_ATTEMPTS, ENV_BASE_DELAY, ENV_READ_TIMEOUT):
        monkeypatch.setenv(env, "")
    assert DownloadKnobs.from_env() == DownloadKnobs(6, 2.0, 60.0)
    monkeypatch.setenv(ENV_ATTEMPTS, "3")
    monkeypatch.setenv(ENV_BASE_DELAY, "0")
    monkeypatch.setenv(ENV_READ_TIMEOUT, "0.5")
    assert DownloadKnobs.from_env() == DownloadKnobs(3, 0.0, 0.5)
