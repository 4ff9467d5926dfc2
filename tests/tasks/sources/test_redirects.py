"""A download follows a redirect only where this machine's source allow-list allows the target
(``WIKI_PIPELINE_ALLOWED_SOURCES``: the policy a stage hands the download, asked for every hop, same host too), for
the corpus's zip and a pretrained tokenizer alike (one ``fetch``); the URL's credentials never go to another origin.
Real servers: one on 127.0.0.1 that redirects, one on 127.0.0.2 that logs what reaches it."""

from __future__ import annotations

import shutil
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mygpt.errors import UserError
from tasks.sources.allowed import ENV_SOURCES, RedirectRefused, SourcePolicy
from tasks.sources.download import DownloadKnobs, probe
from tests.support import corpora, stages
from tests.support.http_servers import Loopback


class Site(Loopback):
    """Serves the files of ``folder`` on ``host``; ``/go/NAME`` answers 302 to ``{target}NAME``, a path in
    ``routes`` 302 to its value; every request is kept as ``(path, Authorization header)``."""

    def __init__(self, host: str, folder: Path) -> None:
        site = self
        self.requests: list[tuple[str, str | None]] = []
        self.target = ""
        self.routes: dict[str, str] = {}

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                site.requests.append((self.path, self.headers.get("Authorization")))
                if self.path.startswith("/go/") or self.path in site.routes:
                    self.send_response(302)
                    location = site.routes.get(self.path) or site.target + self.path[len("/go/") :]
                    self.send_header("Location", location)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                path = folder / self.path.lstrip("/")
                if not path.is_file():
                    self.send_error(404)
                    return
                body = path.read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        server = ThreadingHTTPServer((host, 0), Handler)
        server.daemon_threads = True
        self.host = host
        super().__init__(server)

    def url(self, name: str) -> str:
        return f"http://{self.host}:{self.port}/{name}"


def _knobs() -> DownloadKnobs:
    """One try, with this environment's source allow-list as the redirect check: the value a stage hands in."""
    return DownloadKnobs(attempts=1, redirects=SourcePolicy.from_env().check_redirect)


def test_with_no_allow_list_handed_in_a_download_follows_only_same_origin_redirects(sites):
    """A library call (no policy given): another host is refused, nothing asked of it."""
    good, evil = sites
    with pytest.raises(RedirectRefused, match="another host, and no allow-list"):
        probe(good.url("go/tokenizer.json"), DownloadKnobs(attempts=1), field="tokenizer.source")
    assert evil.requests == []


@pytest.fixture
def sites(tmp_path, shakespeare_text):
    """``(good, evil)``: 127.0.0.1 redirecting ``/go/NAME`` to 127.0.0.2's ``NAME``; both serve a tokenizer.json
    and the tiny wikitext zip."""
    from tests.tasks.test_pretrained_tokenizer import mygpt_train

    folder = tmp_path / "site"
    folder.mkdir()
    (tmp_path / "train.txt").write_text(shakespeare_text[:20_000], encoding="utf-8")
    mygpt_train(tmp_path / "train.txt", tmp_path / "tok")
    shutil.copy(tmp_path / "tok" / "tokenizer.json", folder / "tokenizer.json")
    name, data = corpora.source_file(corpora.shared_splits())
    (folder / name).write_bytes(data)
    try:
        evil = Site("127.0.0.2", folder)
    except OSError as e:  # pragma: no cover - a loopback without 127.0.0.2
        pytest.skip(f"cannot serve on 127.0.0.2: {e}")
    with Site("127.0.0.1", folder) as good, evil:
        good.target = evil.url("")
        yield good, evil


def test_a_redirect_outside_the_allowed_sources_is_refused_for_both_sources(sites, tmp_path, monkeypatch):
    """Corpus zip and tokenizer.json alike: one error naming the field and both addresses (no credentials), and
    nothing asked of the host the redirect points at."""
    good, evil = sites
    monkeypatch.setenv(ENV_SOURCES, f"default {good.url('')}")
    root = tmp_path / "art"
    with pytest.raises(UserError) as e:
        stages.corpus(root, source_url=good.url("go/wikitext-103-raw-v1.zip"))
    assert str(e.value).startswith(
        f"corpus.source_url {good.url('go/wikitext-103-raw-v1.zip')} redirects to "
        f"{evil.url('wikitext-103-raw-v1.zip')}, which is outside the sources this machine allows"
    ), e.value
    assert ENV_SOURCES in str(e.value)
    corpus = stages.corpus(root, source_url=good.url("wikitext-103-raw-v1.zip"), article_index=True)
    secret = "http://alice:s3cret@" + good.url("go/tokenizer.json").removeprefix("http://")
    with pytest.raises(UserError) as e:
        stages.tokenizer(root, corpus, kind="pretrained", source=secret, bpe_train_bytes=20_000)
    assert str(e.value).startswith(
        f"tokenizer.source {good.url('go/tokenizer.json')} redirects to {evil.url('tokenizer.json')}, which is outside"
    ), e.value
    assert "s3cret" not in str(e.value) and "alice" not in str(e.value)
    assert evil.requests == []
    assert not list((root / "tokenizer").glob("[0-9a-f]*"))  # no version published


def test_an_allowed_redirect_is_followed_without_the_sources_credentials(sites, tmp_path, monkeypatch):
    """Where the target is allowed too, the download follows it; the user info's credentials reach only the
    origin they were given for."""
    good, evil = sites
    monkeypatch.setenv(ENV_SOURCES, f"{good.url('')} {evil.url('')} file:///")
    root = tmp_path / "art"
    corpus = corpora.corpus_from_text(root, tmp_path / "src", corpora.shared_splits(), article_index=True)
    secret = "http://alice:s3cret@" + good.url("go/tokenizer.json").removeprefix("http://")
    ref = stages.tokenizer(root, corpus, kind="pretrained", source=secret, bpe_train_bytes=20_000)
    assert ref["version"]
    assert ("/go/tokenizer.json", "Basic YWxpY2U6czNjcmV0") in good.requests  # alice:s3cret, to its own host
    assert evil.requests and all(auth is None for _, auth in evil.requests), evil.requests


def test_a_same_origin_redirect_out_of_an_allowed_path_is_refused(sites, monkeypatch):
    """The allow-list names a path on the host: a redirect on that host to a path outside it is refused like one
    to another host, and the path it points at is never asked; one to an allowed path is followed."""
    good, _ = sites
    good.routes["/pub/out"] = "/private/tokenizer.json"
    good.routes["/pub/in"] = "/tokenizer.json"
    monkeypatch.setenv(ENV_SOURCES, good.url("pub/"))
    with pytest.raises(RedirectRefused) as e:
        probe(good.url("pub/out"), _knobs(), field="tokenizer.source")
    assert str(e.value).startswith(
        f"tokenizer.source {good.url('pub/out')} redirects to {good.url('private/tokenizer.json')}, which is "
        "outside the sources this machine allows"
    ), e.value
    assert [path for path, _ in good.requests] == ["/pub/out"]
    monkeypatch.setenv(ENV_SOURCES, f"{good.url('pub/')} {good.url('tokenizer.json')}")
    assert probe(good.url("pub/in"), _knobs())["bytes"]  # to an allowed path: followed


def test_a_refused_hop_is_named_in_the_message_without_credentials(sites, monkeypatch):
    """Two hops, the second to another host: the message names the hop that redirected (not the source),
    without the source's credentials."""
    good, evil = sites
    good.routes["/pub/a"] = "/pub/b"
    good.routes["/pub/b"] = evil.url("tokenizer.json")
    monkeypatch.setenv(ENV_SOURCES, good.url("pub/"))
    secret = "http://alice:s3cret@" + good.url("pub/a").removeprefix("http://")
    with pytest.raises(RedirectRefused) as e:
        probe(secret, _knobs(), field="tokenizer.source")
    assert str(e.value).startswith(
        f"tokenizer.source {good.url('pub/b')} redirects to {evil.url('tokenizer.json')}, which is outside"
    ), e.value
    assert "s3cret" not in str(e.value) and "alice" not in str(e.value)
    assert [path for path, _ in good.requests] == ["/pub/a", "/pub/b"] and evil.requests == []


def test_a_deployment_run_with_no_list_may_read_wikimedias_dumps_and_the_chapters_zip_only(monkeypatch):
    from tasks.corpora.dump.names import short_form_url
    from tasks.sources.allowed import WIKITEXT_103_URL

    monkeypatch.delenv(ENV_SOURCES, raising=False)
    policy = SourcePolicy.from_env(deployment=True)
    short_form = short_form_url("dewiki", "20261101")  # corpus.wiki=dewiki corpus.dump_date=20261101
    assert short_form.startswith("https://dumps.wikimedia.org/dewiki/20261101/")
    assert policy.admits(short_form) and policy.admits(WIKITEXT_103_URL)
    assert not policy.admits("https://dumps.wikimedia.org.evil.example/dewiki/20261101/x.xml.bz2")
    assert not policy.admits(
        "https://mirror.example/dewiki/20261101/dewiki-20261101-pages-articles-multistream.xml.bz2"
    )
