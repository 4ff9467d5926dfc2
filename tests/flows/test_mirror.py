"""The loopback wikitext mirror (flows.mirror)."""

from __future__ import annotations

from flows.mirror import Mirror, build_wikitext_zip


def test_mirror_serves_loopback_only(wikitext2_path):
    with Mirror({"/wikitext-103-raw-v1.zip": build_wikitext_zip(data_dir=wikitext2_path.parent)}) as mirror:
        assert mirror.base_url.startswith("http://127.0.0.1:")
        assert mirror._server.server_address[0] == "127.0.0.1"
