"""corpus.kind: the default run's version id is the one it had before kinds (pinned from the code before them),
a setting the kind does not read is refused."""

from __future__ import annotations

import pytest

from tasks.corpus import STAGE, CorpusSettings

IDENTITY = {"sha256": "ab" * 32, "bytes": 191984949}


@pytest.mark.parametrize(
    ("given", "version"),
    [
        ({}, "c4288323376a"),
        ({"article_index": True}, "5e3e9717108d"),
        ({"source_url": "http://127.0.0.1:8765/wikitext-103-raw-v1.zip"}, "55c310793a91"),  # the demo's
    ],
)
def test_the_default_and_demo_corpus_version_ids_are_the_ones_from_before_kinds(given, version):
    settings = CorpusSettings(**given).resolved()
    assert STAGE.version(settings, {}, IDENTITY) == version


def test_a_setting_the_kind_does_not_read_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"corpus.kind=wikitext does not read corpus.valid_fraction"):
        CorpusSettings(valid_fraction=0.3)
