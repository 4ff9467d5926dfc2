"""flows/server.py's server log: two servers started on one PREFECT_HOME do not truncate each other's
``server.log``; each appends its part under a header, and reports only its own part when it fails."""

from __future__ import annotations

import pytest

from flows.server import PrefectServer


def test_a_second_server_on_the_same_home_appends_to_the_log(tmp_path):
    first = PrefectServer(tmp_path)
    first.log_path.write_text("the first server's line\n")  # what a server running on this home wrote so far
    second = PrefectServer(tmp_path)
    with pytest.raises(RuntimeError, match="did not answer within 0s") as err:
        second.start(timeout=0)  # a real `prefect server start`, stopped at once
    text = first.log_path.read_text()
    assert text.startswith("the first server's line\n")
    assert f"---- prefect server on 127.0.0.1:{second.port}, started " in text
    assert "the first server's line" not in str(err.value)  # its error shows its own part only
