"""The corpus stage (download) against a real HTTP server on 127.0.0.1 (flows.mirror) and real wikitext text."""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from flows.mirror import MEMBER, Mirror, build_wikitext_zip, make_zip
from mygpt.errors import UserError
from tasks import corpus as D
from tasks.store import ArtifactStore
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


@pytest.fixture(scope="module")
def wiki_zip(wikitext2_path) -> bytes:
    return build_wikitext_zip(data_dir=wikitext2_path.parent)


@pytest.fixture()
def fast_retries(monkeypatch):
    monkeypatch.setenv(D.ENV_BASE_DELAY, "0.01")
    monkeypatch.setenv(D.ENV_ATTEMPTS, "4")


@pytest.fixture()
def mirror(wiki_zip):
    with Mirror({"/wikitext-103-raw-v1.zip": wiki_zip}) as m:
        yield m


def published(root: Path, stage: str = "corpus") -> list[str]:
    sdir = Path(root) / stage
    return sorted(p.name for p in sdir.iterdir() if not p.name.startswith(".")) if sdir.is_dir() else []


def metrics(ref) -> dict:
    return json.loads((Path(ref["path"]) / "manifest.json").read_text())["metrics"]


# ---- header stripping ---------------------------------------------------------------------------------
_LINES = st.one_of(
    st.sampled_from([" \n", " = Title = \n", " = = Section = = \n", " = open\n", "close = \n", " a = b\n",
                     " plain words .\n", "=\n", "  \n", "= x =", "\xa0= y =\xa0\n", " =\n", "\t\n"]),
    st.text(st.sampled_from(list("= x\n\xa0\u3000")), max_size=8))


@settings(max_examples=400, deadline=None)
@given(st.lists(_LINES, max_size=40), st.integers(1, 60), st.integers(1, 50))
def test_streamed_strip_equals_one_re_sub(lines, block_chars, piece):
    whole = "".join(lines)
    pieces = [whole[i:i + piece] for i in range(0, len(whole), piece)]
    got = list(D.strip_headers(pieces, block_chars))
    assert "".join(t for t, _ in got) == D.HEADER_RE.sub("", whole)
    assert sum(n for _, n in got) == len(D.HEADER_RE.findall(whole))


def test_streamed_strip_on_real_wikitext_small_blocks(wikitext2_text):
    pieces = [wikitext2_text[i:i + 7919] for i in range(0, len(wikitext2_text), 7919)]
    got = "".join(t for t, _ in D.strip_headers(pieces, block_chars=2000))
    assert got == re.sub(r"^\s*=+ [^=]+ =+\s*$\n?", "", wikitext2_text, flags=re.MULTILINE)


# ---- byte-identical to the chapter ----------------------------------------------------------------------
def test_http_download_is_byte_identical_to_the_chapter(tmp_path, mirror, wiki_zip):
    ref = download(tmp_path / "art", source_url=mirror.url(), expected_bytes=len(wiki_zip))
    out = Path(ref["path"])
    assert (out / "wikipedia.txt").read_bytes() == chapter_wikipedia_txt(wiki_zip, tmp_path / "chapter")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.json", "wikipedia.txt", "wiki.train.txt", "wiki.valid.txt", "wiki.test.txt"])
    assert (out / "wikipedia.txt").read_bytes() == b"".join(
        (out / f"wiki.{s}.txt").read_bytes() for s in ("train", "valid", "test"))
    m = metrics(ref)
    assert m["zip_bytes"] == len(wiki_zip) and m["zip_published"] is False
    assert m["splits"]["train"]["headers_stripped"] > 10 and m["wikipedia"]["bytes"] == (out / "wikipedia.txt").stat().st_size
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
def test_dropped_connection_resumes_with_range(tmp_path, mirror, wiki_zip, fast_retries):
    mirror.set_faults(drop_after=100_000)
    ref = download(tmp_path / "art", source_url=mirror.url())
    assert [(r["range"], r["status"]) for r in mirror.requests] == [(None, 200), ("bytes=100000-", 206)]
    m = metrics(ref)
    assert m["download"]["tries"] == 2 and m["download"]["range_requests"] == 1
    assert (Path(ref["path"]) / "wikipedia.txt").read_bytes() == chapter_wikipedia_txt(wiki_zip, tmp_path / "ch")


def test_server_that_ignores_range_gets_a_clean_restart(tmp_path, mirror, wiki_zip, fast_retries):
    import hashlib

    mirror.set_faults(drop_after=100_000, ignore_range=True)
    ref = download(tmp_path / "art", source_url=mirror.url())
    assert [(r["range"], r["status"]) for r in mirror.requests] == [(None, 200), ("bytes=100000-", 200)]
    assert metrics(ref)["zip_sha256"] == hashlib.sha256(wiki_zip).hexdigest()  # no bytes appended twice


def test_wrong_content_length_then_complete(tmp_path, mirror, wiki_zip, fast_retries):
    mirror.set_faults(length_delta=5000)
    ref = download(tmp_path / "art", source_url=mirror.url(), expected_bytes=len(wiki_zip))
    # the body ended short of the announced length: one Range retry, answered 416 = already complete
    assert [r["status"] for r in mirror.requests] == [200, 416]
    assert metrics(ref)["zip_bytes"] == len(wiki_zip)


def test_stalled_body_hits_the_read_timeout_and_resumes(tmp_path, mirror, wiki_zip, fast_retries, monkeypatch):
    monkeypatch.setenv(D.ENV_READ_TIMEOUT, "1.0")
    mirror.set_faults(stall=4.0, stall_after=65536)
    ref = download(tmp_path / "art", source_url=mirror.url())
    ranges = [r["range"] for r in mirror.requests]
    assert ranges[0] is None and ranges[-1] == "bytes=65536-"  # nothing received before the stall is lost
    assert metrics(ref)["zip_bytes"] == len(wiki_zip)


def test_interrupted_run_resumes_on_the_next_run(tmp_path, mirror, wiki_zip, monkeypatch):
    monkeypatch.setenv(D.ENV_ATTEMPTS, "1")
    mirror.set_faults(drop_after=150_000)
    root = tmp_path / "art"
    with pytest.raises(UserError, match="failed 1 times in a row"):
        download(root, source_url=mirror.url())
    assert published(root) == []
    mirror.set_faults()
    mirror.clear_log()
    ref = download(root, source_url=mirror.url())
    assert [r["range"] for r in mirror.requests] == ["bytes=150000-"]
    assert metrics(ref)["download"]["resumed_bytes"] == 150_000
    assert (Path(ref["path"]) / "wikipedia.txt").read_bytes() == chapter_wikipedia_txt(wiki_zip, tmp_path / "ch")


def test_503s_are_retried(tmp_path, mirror, fast_retries):
    mirror.set_faults(fail_first=2)
    download(tmp_path / "art", source_url=mirror.url())
    assert [r["status"] for r in mirror.requests] == [503, 503, 200]


def test_repeated_5xx_is_a_user_error_and_publishes_nothing(tmp_path, mirror, fast_retries, monkeypatch):
    monkeypatch.setenv(D.ENV_ATTEMPTS, "3")
    mirror.set_faults(fail_first=1000, fail_status=502)
    with pytest.raises(UserError, match=re.escape(mirror.url()) + ".*failed 3 times.*HTTP 502"):
        download(tmp_path / "art", source_url=mirror.url())
    assert len(mirror.requests) == 3
    assert published(tmp_path / "art") == [] and ArtifactStore(tmp_path / "art").versions() == []


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
        "not-utf8": (make_zip(bad_utf8), r"wikitext-103-raw/wiki.test.raw in .* is not valid UTF-8: byte 0xff at offset 15"),
    }


@pytest.mark.parametrize("case", ["not-a-zip", "missing-member", "not-utf8"])
def test_bad_archive_is_a_user_error_and_publishes_nothing(tmp_path, case):
    data, message = _bad_archives()[case]
    with Mirror({"/w.zip": data}) as m:
        with pytest.raises(UserError, match=message):
            download(tmp_path / "art", source_url=m.url("/w.zip"))
    assert published(tmp_path / "art") == []
    staged = list((tmp_path / "art" / "corpus" / ".staging").glob("*/work/source.zip"))
    assert staged == []  # a rerun downloads again instead of reusing the bad archive


def test_expected_size_and_sha256(tmp_path, mirror, wiki_zip):
    import hashlib

    with pytest.raises(UserError, match=f"gave {len(wiki_zip):,} bytes but expected_bytes is 123"):
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


@pytest.mark.parametrize("kwargs, message", [
    ({"source_url": "ftp://example.org/w.zip"}, "scheme 'ftp'"),
    ({"source_url": "wikitext.zip"}, "scheme '\\(none\\)'"),
    ({"source_url": "https:///w.zip"}, "has no host"),
    ({"source_url": "file://host/w.zip"}, "cannot name a host"),
    ({"source_url": ""}, "source_url must be"),
    ({"expected_bytes": -1}, "expected_bytes must be a whole number"),
    ({"expected_bytes": 1.5}, "expected_bytes must be a whole number"),
    ({"expected_sha256": "abc"}, "expected_sha256 must be 64 hexadecimal digits"),
])
def test_settings_reject(kwargs, message):
    with pytest.raises(UserError, match=message):
        D.CorpusSettings.parse(kwargs)


def test_settings_defaults_pin_the_chapter_size():
    def resolved(**kw):
        return D.CorpusSettings(**kw).resolved().version_params()

    assert resolved() == {"source_url": D.DEFAULT_URL, "expected_bytes": 191_984_949, "expected_sha256": None}
    assert resolved(source_url="http://127.0.0.1:1/x.zip")["expected_bytes"] == 0
    assert resolved(expected_bytes=0)["expected_bytes"] == 0


def test_mirror_serves_loopback_only(mirror):
    assert mirror.base_url.startswith("http://127.0.0.1:")
    assert mirror._server.server_address[0] == "127.0.0.1"
