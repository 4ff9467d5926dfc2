"""The corpus stage against a real HTTP server on 127.0.0.1 (flows.mirror) and real wikitext text."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from flows.mirror import Mirror
from mygpt.errors import UserError
from tasks import corpus as D
from tasks.sources.download import ENV_ATTEMPTS, ENV_BASE_DELAY
from tests.support.corpora import corpus_from_text, shared_splits
from tests.support.corpus_runs import (
    all_text_under,
    chapter_wikipedia_txt,
    joined_splits,
    metrics,
    published,
    train_text,
    written_forms,
)
from tests.support.stages import corpus as download
from tests.support.zips import tiny_zip, wikitext_zip


def test_http_download_is_byte_identical_to_the_chapter(tmp_path, mirror, wiki_zip):
    ref = download(tmp_path / "art", source_url=mirror.url(), expected_bytes=len(wiki_zip))
    out = Path(ref["path"])
    assert joined_splits(out) == chapter_wikipedia_txt(wiki_zip, tmp_path / "chapter")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.json", "wiki.train.txt", "wiki.valid.txt", "wiki.test.txt"]
    )
    # the manifest lists the splits and their files, in the order cat joins them into the chapter's wikipedia.txt
    assert [(f["split"], f["text"], f["articles"]) for f in metrics(ref)["split_files"]] == [
        (s, f"wiki.{s}.txt", None) for s in ("train", "valid", "test")
    ]
    m = metrics(ref)
    assert m["zip_bytes"] == len(wiki_zip) and m["zip_published"] is False
    assert m["splits"]["train"]["headers_stripped"] > 10 and sum(st["bytes"] for st in m["splits"].values()) == len(
        joined_splits(out)
    )
    assert not (tmp_path / "art" / "corpus" / ".staging" / ref["version"]).exists()  # zip + work dir gone
    manifest = json.loads((out / "manifest.json").read_text())
    report = D.STAGE.report(manifest)
    assert "| wiki.train.txt |" in report and m["zip_sha256"] in report
    # the report shows the manifest's sha256 (that of the bytes on disk) and the metrics hold no second one
    for name in ("wiki.train.txt", "wiki.valid.txt", "wiki.test.txt"):
        sha = hashlib.sha256((out / name).read_bytes()).hexdigest()
        assert manifest["files"][name]["sha256"] == sha and f"`{sha[:16]}`…" in report, name
    assert not [k for st in m["splits"].values() for k in st if "sha256" in k], m


def test_the_text_files_are_hashed_as_written_and_not_read_back_to_publish(tmp_path, monkeypatch):
    from tasks.store import build as build_module

    read_back: list[str] = []
    real = build_module.sha256_file

    def recorded(path):
        read_back.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(build_module, "sha256_file", recorded)
    ref = corpus_from_text(tmp_path / "art", tmp_path / "src", shared_splits(), article_index=True)
    out = Path(ref["path"])
    files = json.loads((out / "manifest.json").read_text())["files"]
    assert files == {
        p.name: {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in out.iterdir()
        if p.name != "manifest.json"
    }
    assert sorted(read_back) == sorted(f"wiki.{s}.articles.npy" for s in ("train", "valid", "test")), (
        "only the article starts are read back"
    )


def test_newlines_and_odd_headers_match_the_chapter(tmp_path):
    """CRLF, lone CR, Unicode whitespace, headers at the very start/end, no final newline."""
    splits = {
        "train": " = Head = \r\n \r\n Text with crlf .\r\nlone\rcr\r\n = = Sub = = \r\n"
        "\xa0= Nbsp header =\xa0\n Body ü 戦場 .\n = open\nnot closed\n end = \n",
        "valid": "= Top =\n\n\n = Two =\n = Three = \r",
        "test": " no newline at end = x",
    }
    data = wikitext_zip(splits)
    zpath = tmp_path / "odd.zip"
    zpath.write_bytes(data)
    ref = download(tmp_path / "art", source_url=zpath.as_uri())
    assert joined_splits(Path(ref["path"])) == chapter_wikipedia_txt(data, tmp_path / "ch")
    assert b"\r" not in joined_splits(Path(ref["path"]))


def test_expected_size_and_sha256(tmp_path, mirror, wiki_zip):

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

    assert resolved() == {
        "kind": "wikitext",
        "source_url": D.DEFAULT_URL,
        "expected_bytes": 191_984_949,
        "expected_sha256": None,
        "article_index": None,  # settled by the pipeline from the tokenizer kind (flows.settings.linked)
        "valid_fraction": 0.05,  # read by kind=text and kind=dump only
        "test_fraction": 0.05,
        "expected_sha1": None,  # read by kind=dump only
        "wiki": None,
        "dump_date": None,
    }
    assert D.CorpusSettings().resolved().version_params() == {"expected_bytes": 191_984_949, "expected_sha256": None}
    assert resolved(source_url="http://127.0.0.1:1/x.zip")["expected_bytes"] == 0
    assert resolved(expected_bytes=0)["expected_bytes"] == 0


SECRETS = ("S3CRET", "T0KEN-abc")


def test_credentials_in_the_url_are_used_but_never_shown_or_stored(tmp_path, caplog, fast_retries):
    from tasks.core.report import settings_table

    with Mirror({"/w.zip": tiny_zip("Secret")}) as m:
        url = f"http://alice:S3CRET@127.0.0.1:{m.port}/w.zip?token=T0KEN-abc&x=1"
        with caplog.at_level("INFO", logger="wiki_pipeline"):
            ref = download(tmp_path / "art", source_url=url)
            other = download(tmp_path / "art", source_url=url.replace("S3CRET", "0ther").replace("T0KEN", "TOK2"))
        manifest = json.loads((Path(ref["path"]) / "manifest.json").read_text())
        shown = [
            caplog.text,
            all_text_under(tmp_path / "art"),
            D.STAGE.report(manifest) + settings_table(manifest["settings"]),
        ]
        assert "Secret text" in train_text(ref), "the credentials were used to download"
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
    shown += errors + [caplog.text, all_text_under(tmp_path / "bad")]
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


@pytest.mark.parametrize(
    "secret",
    ["1|SECRET", "TKsëcret", "50%secret", "p@ss:w/rd", "a b+c&d"],
)
def test_query_secrets_never_shown_in_any_encoding(tmp_path, caplog, monkeypatch, secret):
    """Requests' errors quote the query percent-encoded (``token=1%7CSECRET``)."""
    from urllib.parse import quote

    monkeypatch.setenv(ENV_ATTEMPTS, "2")
    monkeypatch.setenv(ENV_BASE_DELAY, "0")
    url = f"http://127.0.0.1:{_closed_port()}/w.zip?token={quote(secret, safe='|@:/')}"
    with caplog.at_level("INFO", logger="wiki_pipeline"), pytest.raises(UserError) as e:
        download(tmp_path / "art", source_url=url)
    shown = str(e.value) + "\n" + caplog.text + "\n" + all_text_under(tmp_path / "art")
    assert "failed 2 times in a row" in str(e.value) and "token=***" in str(e.value)
    assert "retrying" in caplog.text, "the warnings were checked too"
    leaks = [form for form in written_forms(secret) if form in shown]
    assert not leaks, (leaks, shown)


def test_a_file_url_with_user_info_is_refused_without_showing_it():
    with pytest.raises(UserError) as e:
        D.CorpusSettings.parse({"source_url": "file://user:PW@host/x.zip"})
    assert "cannot name a host ('host')" in str(e.value) and "PW" not in str(e.value)


def test_article_index_marks_where_each_article_starts(tmp_path):
    """article_index=true: per split, the byte offsets where each `` = Title = `` line was stripped; the text files
    are the same bytes as without it, and a corpus without it keeps the version id it had before the setting."""
    import re

    import numpy as np

    from tasks.corpora.header_strip import HEADER_RE

    splits = shared_splits()
    plain = corpus_from_text(tmp_path / "a", tmp_path / "src", splits)
    ref = corpus_from_text(tmp_path / "b", tmp_path / "src", splits, article_index=True)
    assert ref["version"] != plain["version"]
    inputs, source = {}, {"sha256": "0" * 64}
    assert D.STAGE.version(D.CorpusSettings().resolved(), inputs, source) == "2e7bf32754ac"  # from the code before
    a, b = Path(plain["path"]), Path(ref["path"])
    assert not list(a.glob("*.npy"))
    for split, raw in splits.items():
        assert (b / f"wiki.{split}.txt").read_bytes() == (a / f"wiki.{split}.txt").read_bytes()
        starts = np.load(b / f"wiki.{split}.articles.npy")
        titles = re.findall(r"^ = [^=]+ = $", raw, flags=re.MULTILINE)
        assert starts.dtype == np.uint64 and len(starts) == len(titles) > 0
        data = (b / f"wiki.{split}.txt").read_bytes()
        # each article is the text between its start and the next: it opens with the first paragraph, never
        # with the previous article's last one
        assert starts[0] == 0 and all(0 < x < len(data) for x in starts[1:].tolist())
        assert all(data[x - 1 : x] == b"\n" for x in starts[1:].tolist())
        after = [raw[m.end() : m.end() + 40] for m in HEADER_RE.finditer(raw) if m.group().lstrip().startswith("= ")]
        assert [data[x : x + 40].decode("utf-8", "ignore") for x in starts.tolist()] == [
            t.encode("utf-8")[:40].decode("utf-8", "ignore") for t in after
        ]
        assert metrics(ref)["splits"][split]["articles"] == len(titles)
    assert joined_splits(b) == joined_splits(a)
