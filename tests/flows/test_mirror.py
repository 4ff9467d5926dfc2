"""The loopback wikitext mirror (flows.mirror)."""

from __future__ import annotations

from flows.mirror import Mirror, build_wikitext_zip


def test_the_demo_zip_is_the_zip_the_tests_build_from_the_same_text(wiki_zip):
    """What ``--demo`` serves is what the tests download (tests/support/zips.wikitext_zip of the same splits)."""
    assert build_wikitext_zip() == wiki_zip


def test_mirror_serves_loopback_only(wiki_zip):
    with Mirror({"/wikitext-103-raw-v1.zip": wiki_zip}) as mirror:
        assert mirror.base_url.startswith("http://127.0.0.1:")
        assert mirror._server.server_address[0] == "127.0.0.1"
