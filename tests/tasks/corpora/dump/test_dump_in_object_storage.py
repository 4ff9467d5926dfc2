"""The dump and object storage, on a real S3 API server (moto on 127.0.0.1): an ``s3://`` source URL gives the
documents its file gives, its copy resumed from the bytes already copied; on an ``s3://`` artifact root an external
Dask cluster's workers read the dump from the store, not from the stage's disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mygpt.errors import UserError
from tasks.corpora.dump.adapter import DumpSource
from tasks.corpora.dump.settings import DumpSettings
from tasks.sources.s3_download import fetch_s3, s3_info

from .conftest import context


@pytest.fixture
def s3_dump(dump, s3_root) -> str:
    """The test-built dump's three files under ``s3://<bucket>/dumps/testwiki/20261101/``: the dump's URL."""
    from tasks.store import filesystem

    bucket = s3_root.removeprefix("s3://").split("/", 1)[0]
    folder = f"s3://{bucket}/dumps/testwiki/20261101"
    for path in (dump.dump, dump.index, dump.sha1sums):
        filesystem().put_file(str(path), f"{folder}/{path.name}")
    return f"{folder}/{dump.dump.name}"


def documents(url: str, work: Path) -> list:
    work.mkdir(parents=True, exist_ok=True)
    return list(DumpSource(2).documents(DumpSettings(source_url=url), context(work)))


def test_an_s3_dump_is_the_same_source_as_its_file(dump, s3_dump, tmp_path):
    source = DumpSource()
    assert source.identity(DumpSettings(source_url=s3_dump), None) == source.identity(
        DumpSettings(source_url=dump.dump.as_uri()), None
    )
    from_s3 = documents(s3_dump, tmp_path / "s3")
    assert from_s3 and from_s3 == documents(dump.dump.as_uri(), tmp_path / "file")
    assert (tmp_path / "s3" / "download" / dump.dump.name).read_bytes() == dump.dump.read_bytes()


def test_an_interrupted_copy_resumes_from_its_bytes_and_a_changed_object_starts_over(dump, s3_dump, tmp_path):
    dest = tmp_path / dump.dump.name
    part, meta = dest.with_name(dest.name + ".part"), dest.with_name(dest.name + ".json")
    whole = dump.dump.read_bytes()
    part.write_bytes(whole[:1000])  # what a copy killed after its first kilobyte left
    meta.write_text(json.dumps(s3_info(s3_dump)))
    facts = fetch_s3(s3_dump, dest, max_bytes=1 << 30)
    assert facts["resumed_bytes"] == 1000 and dest.read_bytes() == whole
    assert not part.exists() and not meta.exists()

    dest.unlink()
    part.write_bytes(b"x" * 1000)  # begun on an object since replaced: its ETag differs
    meta.write_text(json.dumps({**s3_info(s3_dump), "etag": '"another"'}))
    assert fetch_s3(s3_dump, dest, max_bytes=1 << 30)["resumed_bytes"] == 0 and dest.read_bytes() == whole


def test_a_resumed_copy_that_went_wrong_is_refused_by_the_sha1_and_fetched_again(dump, s3_dump, tmp_path):
    work = tmp_path / "w"
    part = work / "download" / f"{dump.dump.name}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\0" * 1000)  # bytes a disk fault changed in an interrupted copy
    part.with_name(f"{dump.dump.name}.json").write_text(json.dumps(s3_info(s3_dump)))
    with pytest.raises(UserError, match=r"its sha1 is .* the download is damaged"):
        documents(s3_dump, work)
    assert documents(s3_dump, work) == documents(dump.dump.as_uri(), tmp_path / "file")


def test_a_missing_object_and_oversized_one_are_named(s3_dump, tmp_path):
    missing = s3_dump.replace("testwiki-20261101", "nowiki-20261101")
    with pytest.raises(UserError, match=r"s3://.*nowiki-20261101-sha1sums.txt: no such object"):
        DumpSource().identity(DumpSettings(source_url=missing), None)
    with pytest.raises(UserError, match=r"is [0-9.]+ KB, over the 1000 B a source may be"):
        fetch_s3(s3_dump, tmp_path / "x", max_bytes=1000)
    assert list(tmp_path.iterdir()) == []


def test_an_external_clusters_workers_read_the_dump_from_the_store(dump, s3_root, tmp_path, monkeypatch):
    from distributed import LocalCluster

    import tasks.dask.work
    from tasks.registry import open_store
    from tasks.store import filesystem
    from tests.support import stages
    from tests.support.corpus_runs import metrics

    opened: list[str] = []
    real_opener = tasks.dask.work.opener

    def recording_opener(where: str):
        opened.append(where)
        return real_opener(where)

    monkeypatch.setattr(tasks.dask.work, "opener", recording_opener)  # the workers run in this process
    settings = {"kind": "dump", "source_url": dump.dump.as_uri(), "valid_fraction": 0.25, "test_fraction": 0.25}
    with LocalCluster(n_workers=2, processes=False, protocol="tcp", host="127.0.0.1", dashboard_address=None) as c:
        on_s3 = stages.corpus(s3_root, run={"dask_address": c.scheduler_address}, **settings)
    copy = f"/work/download/{dump.dump.name}"
    assert opened and all(w.startswith(f"{s3_root}/") and w.endswith(copy) for w in opened)
    local = stages.corpus(tmp_path / "local", **settings)
    assert on_s3["version"] == local["version"]
    published = open_store(s3_root).read_manifest("corpus", on_s3["version"])
    assert (
        published is not None
        and published["files"] == json.loads((Path(local["path"]) / "manifest.json").read_text())["files"]
    )  # every file's size and sha256
    assert metrics(local)["articles"] > 0
    assert not [p for p in filesystem().find(s3_root) if p.endswith(".xml.bz2")]  # the copy went with the staging


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("s3://AKIA:wJalr/K7MDENG@bucket/d/{N}", "names a bucket and a key only"),  # a secret with a "/" in it
        ("s3://AKIA:secret@bucket/d/{N}", "names a bucket and a key only"),
        ("s3://bucket/", "names no object"),
        ("s3://bucket/d/{N}?versionId=1", "names a bucket and a key only"),
        ("s3://bucket/other/../d/{N}", "a '.' or '..' segment"),  # the allow-list would read it as d/
        ("s3://bucket/other%2F..%2Fd/{N}", "a %-escape"),  # so would it this
    ],
)
def test_an_s3_url_that_is_not_a_plain_bucket_and_key_is_refused_without_echoing_a_secret(url, why):
    from tasks.corpus import CorpusSettings

    url = url.format(N="enwiki-20261101-pages-articles-multistream.xml.bz2")
    with pytest.raises(UserError, match=why) as refused:
        CorpusSettings.parse({"kind": "dump", "source_url": url}, "corpus")
    assert "secret" not in str(refused.value) and "K7MDENG" not in str(refused.value)
    shouted = CorpusSettings(kind="dump", source_url="S3://bucket/d/enwiki-20261101-pages-articles-multistream.xml.bz2")
    assert shouted.source_url.startswith("s3://bucket/")
