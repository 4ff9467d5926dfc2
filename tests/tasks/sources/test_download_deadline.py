"""Every download has an overall deadline besides its read timeout: a real server on 127.0.0.1 that sends a byte
now and then (never silent long enough for the read timeout) is given up on at the deadline, with what came kept
for a rerun to resume."""

from __future__ import annotations

import pytest

from mygpt.errors import UserError
from tasks.sources.download import ENV_DEADLINE, DeadlinePassed, DownloadKnobs, fetch
from tests.support.http_servers import dripping_server


def test_a_dripping_body_stops_at_the_deadline_and_a_rerun_resumes(tmp_path, fast_retries):
    dest = tmp_path / "z.zip"
    with dripping_server(size=10_000, every=0.05) as server:
        with pytest.raises(DeadlinePassed, match=rf"did not finish within 1 seconds, .* raise {ENV_DEADLINE}; a rerun"):
            fetch(server.url("z.zip"), dest, knobs=DownloadKnobs.from_env(), deadline=1.0)
        kept = dest.with_name("z.zip.part").stat().st_size
        assert kept > 0 and not dest.exists(), "what came is kept, nothing is published as whole"
        with pytest.raises(DeadlinePassed):
            fetch(server.url("z.zip"), dest, knobs=DownloadKnobs.from_env(), deadline=1.0)
        assert dest.with_name("z.zip.part").stat().st_size > kept, "the rerun resumed from the bytes kept"


def test_the_deadline_comes_from_the_environment(monkeypatch, tmp_path, fast_retries):
    monkeypatch.setenv(ENV_DEADLINE, "")
    assert DownloadKnobs.from_env().deadline == DownloadKnobs().deadline == 6 * 3600
    monkeypatch.setenv(ENV_DEADLINE, "0.5")
    assert DownloadKnobs.from_env().deadline == 0.5
    with dripping_server(size=10_000, every=0.05) as server, pytest.raises(DeadlinePassed, match=r"within 0\.5 s"):
        fetch(server.url("z.zip"), tmp_path / "z.zip", knobs=DownloadKnobs.from_env())
    for bad in ("0", "-1", "nan", "1e9"):
        monkeypatch.setenv(ENV_DEADLINE, bad)
        with pytest.raises(UserError, match=rf"^{ENV_DEADLINE} must be"):
            DownloadKnobs.from_env()
