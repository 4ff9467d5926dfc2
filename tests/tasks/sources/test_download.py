"""The resumable download against a real HTTP server on 127.0.0.1: resume, retries, bounds, its knobs."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from mygpt.errors import UserError
from tasks.registry import open_store
from tasks.sources.download import ENV_ATTEMPTS, ENV_BASE_DELAY, ENV_READ_TIMEOUT, DownloadKnobs, fetch
from tests.support.corpus_runs import chapter_wikipedia_txt, joined_splits, metrics, published
from tests.support.http_servers import no_length_server
from tests.support.stages import corpus as download

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
    assert joined_splits(Path(ref["path"])) == chapter_wikipedia_txt(wiki_zip, tmp_path / "ch")


def test_server_that_ignores_range_gets_a_clean_restart(tmp_path, mirror, wiki_zip, fast_retries):

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
    with pytest.raises(UserError, match=r"failed once \(last: "):
        download(root, source_url=mirror.url())
    assert published(root) == []
    mirror.set_faults()
    mirror.clear_log()
    ref = download(root, source_url=mirror.url())
    assert [r["range"] for r in mirror.requests] == [PROBE[0], "bytes=150000-"]
    assert metrics(ref)["download"]["resumed_bytes"] == 150_000
    assert joined_splits(Path(ref["path"])) == chapter_wikipedia_txt(wiki_zip, tmp_path / "ch")


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


def test_download_stops_as_soon_as_it_exceeds_expected_bytes(tmp_path, fast_retries):
    with no_length_server(8 << 20) as server:  # 8 MiB, size never announced
        url = server.url("big.zip")
        with pytest.raises(
            UserError,
            match=r"is larger than expected_bytes \(1,000,000\): it sent more; "
            r"stopped at [\d,]+ bytes, so nothing was kept",
        ):
            download(tmp_path / "art", source_url=url, expected_bytes=1_000_000)
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
