"""A Prefect server that is not there or not Prefect: one `error:` line, exit 2, no traceback (the adversarial
review found tracebacks for each)."""

from __future__ import annotations

import http.server
import threading

import pytest

from flows.cli import main
from flows.server import free_port


def _run_against(api_url: str, argv: list[str], capsys) -> tuple[int, str]:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        code = main(argv)
    err = capsys.readouterr().err
    return code, err


@pytest.fixture
def not_prefect():
    """An HTTP server on 127.0.0.1 that answers every request with a page that is not Prefect's."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"\xa7\xff<html>some other program</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/api"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("command", [["serve", "--tiny"], ["run", "--tiny", "--mirror"]])
def test_a_closed_port_or_another_program_is_one_error_line(command, not_prefect, capsys, tmp_path):
    argv = [*command, "--artifacts-dir", str(tmp_path / "art")]
    for api_url in (f"http://127.0.0.1:{free_port()}/api", not_prefect):
        code, err = _run_against(api_url, argv, capsys)
        assert code == 2, err
        assert f"error: PREFECT_API_URL={api_url} does not answer as a Prefect server" in err, err
        assert "Traceback" not in err
    assert not (tmp_path / "art").exists()


def test_the_server_address_in_an_error_shows_no_credentials(not_prefect, capsys, tmp_path):
    secret = not_prefect.replace("http://", "http://team:S3cretPW@") + "?token=T0kenXYZ"
    code, err = _run_against(secret, ["serve", "--tiny", "--artifacts-dir", str(tmp_path / "art")], capsys)
    assert code == 2 and "does not answer as a Prefect server" in err, err
    assert "S3cretPW" not in err and "T0kenXYZ" not in err and "***@127.0.0.1" in err, err
