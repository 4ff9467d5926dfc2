"""corpus.kind=dump in the pipeline: the settings it reads, the corpus stage through the one writer (the report's
fields as metrics), and a test-built dump end to end, corpus to evaluate, on the tiny preset."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.corpus import CorpusSettings, report


def test_the_dump_kind_reads_its_own_settings_and_refuses_the_zips():
    url = "https://dumps.wikimedia.org/dewiki/20261101/dewiki-20261101-pages-articles-multistream.xml.bz2"
    assert CorpusSettings(kind="dump", source_url=url, expected_sha1="A" * 40).expected_sha1 == "a" * 40
    assert CorpusSettings(kind="dump", wiki="dewiki", dump_date="20261101").wiki == "dewiki"
    assert CorpusSettings(kind="dump", wiki="dewiki", dump_date=20261101).dump_date == "20261101"  # as --param reads it
    with pytest.raises(ValueError, match=r"corpus.kind=dump does not read corpus.expected_sha256"):
        CorpusSettings(kind="dump", source_url=url, expected_sha256="0" * 64)
    with pytest.raises(ValueError, match=r"corpus.kind=wikitext does not read corpus.expected_sha1"):
        CorpusSettings(expected_sha1="0" * 40)
    with pytest.raises(ValueError, match=r"corpus.kind=dump needs the dump: corpus.source_url \(the URL of <wiki>-"):
        CorpusSettings(kind="dump")
    with pytest.raises(ValueError, match=r"corpus.wiki and corpus.dump_date go together"):
        CorpusSettings(kind="dump", wiki="dewiki")
    with pytest.raises(ValueError, match=r"both name the dump; give one of them"):
        CorpusSettings(kind="dump", source_url=url, wiki="dewiki", dump_date="20261101")
    with pytest.raises(ValueError, match="expected_sha1 must be 40 hex digits"):
        CorpusSettings(kind="dump", source_url=url, expected_sha1="xyz")


def test_a_dump_end_to_end_corpus_to_evaluate_on_the_tiny_preset(dump, pages, tmp_path):
    from flows.settings import TINY, Pipeline
    from tests.support.corpus_runs import metrics
    from tests.support.stages import every_stage
    from tests.support.tiny import run_in

    corpus = {"kind": "dump", "source_url": dump.dump.as_uri(), "valid_fraction": 0.25, "test_fraction": 0.25}
    settings = Pipeline.parse(**{**TINY, "corpus": corpus})
    refs = every_stage(settings, run_in(tmp_path / "art"))
    m = metrics(refs["corpus"])
    articles = [p for p in pages if p.ns == 0 and p.redirect is None]
    assert m["kind"] == "dump" and m["wiki"] == "testwiki" and m["sha1"] == dump.sha1
    assert m["articles"] == len(articles) == sum(st["documents"] for st in m["splits"].values())
    text = "".join((Path(refs["corpus"]["path"]) / f["text"]).read_text() for f in m["split_files"])
    assert "{{" not in text and "<ref" not in text and "[[" not in text and "Москва — столица России." in text
    shown = report({"version": refs["corpus"]["version"], "metrics": m, "source": None})
    assert "testwiki, 20261101" in shown and dump.sha1 in shown and "articles kept" in shown
    assert metrics(refs["evaluate"])  # the model was trained on it and evaluated on its test split
