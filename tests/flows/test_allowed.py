"""What a run may touch (flows/allowed.py): a worker's WIKI_PIPELINE_ALLOWED_ROOTS / _SOURCES refuse, before any
stage, a run whose artifact root or source URL lies outside them, however the path or URL is dressed up; unset,
they allow everything for a person's own `wiki-pipeline run`, and only the defaults for a deployment run."""

from __future__ import annotations

import os

import pytest

from flows.allowed import ENV_ROOTS, ENV_SOURCES
from flows.settings import Pipeline
from mygpt.errors import UserError
from tasks.core.urls import redact_url
from tasks.corpus import DEFAULT_URL
from tests.support.prefect_server import task_run_states

MIRROR = "http://127.0.0.1:8765/wikitext-103-raw-v1.zip"


def parse(root, url: str = MIRROR):
    return Pipeline.parse(corpus={"source_url": url}, run={"artifacts_dir": str(root)})


@pytest.fixture
def allowed(tmp_path, monkeypatch):
    """This machine allows the artifact root tmp/ok and the defaults' sources plus file:///tmp/zips/."""
    (tmp_path / "ok").mkdir()
    (tmp_path / "zips").mkdir()
    monkeypatch.setenv(ENV_ROOTS, str(tmp_path / "ok"))
    monkeypatch.setenv(ENV_SOURCES, f"default, {(tmp_path / 'zips').as_uri()}/")
    return tmp_path


def test_unset_allow_lists_allow_every_root_and_source(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_ROOTS, raising=False)
    monkeypatch.delenv(ENV_SOURCES, raising=False)
    assert parse(tmp_path / "anywhere", "https://example.org/w.zip").run.artifacts_dir == str(tmp_path / "anywhere")


def test_a_deployment_run_gets_the_defaults_where_the_lists_are_unset(tmp_path, monkeypatch):
    """A run some client triggered on this machine's runner or worker (Prefect's runtime says which deployment;
    its documented test variable stands in for one here) may use only the defaults: the configured root, the
    chapter's URL and the demo's mirror."""
    monkeypatch.delenv(ENV_ROOTS, raising=False)
    monkeypatch.delenv(ENV_SOURCES, raising=False)
    monkeypatch.setenv("WIKI_PIPELINE_ARTIFACTS", str(tmp_path / "art"))
    monkeypatch.setenv("PREFECT__RUNTIME__DEPLOYMENT__ID", "2b3c1f8e-0000-4000-8000-000000000000")
    parse(tmp_path / "art", MIRROR)
    parse(tmp_path / "art" / "sub", DEFAULT_URL)
    with pytest.raises(UserError, match=rf"is outside the artifact roots .*{ENV_ROOTS} is unset, so a deployment"):
        parse(tmp_path / "anywhere", MIRROR)
    with pytest.raises(UserError, match=rf"is outside the sources .*{ENV_SOURCES} is unset, so a deployment"):
        parse(tmp_path / "art", "https://example.org/w.zip")
    monkeypatch.delenv("PREFECT__RUNTIME__DEPLOYMENT__ID")
    parse(tmp_path / "anywhere", "https://example.org/w.zip")  # a person's own run: their choice


def test_what_serve_was_given_is_allowed_to_its_runs_and_nothing_else(tmp_path, monkeypatch):
    """`wiki-pipeline serve --artifacts-dir R --source-url U` is the operator's choice: where the lists are unset,
    its deployment runs may use R and U besides the defaults; the entry holds no credentials."""
    from flows.allowed import allow_served

    monkeypatch.setenv(ENV_ROOTS, "")  # unset (empty counts as unset), and restored after: allow_served writes them
    monkeypatch.setenv(ENV_SOURCES, "")
    monkeypatch.setenv("PREFECT__RUNTIME__DEPLOYMENT__ID", "2b3c1f8e-0000-4000-8000-000000000000")
    served = "http://op:s3cret@127.0.0.1:9/mirror/w.zip?token=t0k"
    allow_served(str(tmp_path / "served"), [served])
    assert "s3cret" not in os.environ[ENV_SOURCES] and "t0k" not in os.environ[ENV_SOURCES]
    parse(tmp_path / "served", served)
    parse(tmp_path / "served" / "sub", MIRROR)  # the defaults still
    with pytest.raises(UserError, match="is outside the artifact roots"):
        parse(tmp_path / "other", served)
    with pytest.raises(UserError, match="is outside the sources"):
        parse(tmp_path / "served", "http://127.0.0.1:9/mirror/other.zip")


def test_roots_and_sources_inside_the_allow_lists_are_accepted(allowed):
    for root in (allowed / "ok", allowed / "ok" / "team" / "a", allowed / "ok" / "x" / ".." / "y"):
        parse(root)
    for url in (
        MIRROR,
        DEFAULT_URL,
        "http://user:secret@127.0.0.1:8765/wikitext-103-raw-v1.zip",  # the user's own credentials
        (allowed / "zips" / "w.zip").as_uri(),
    ):
        parse(allowed / "ok", url)


@pytest.mark.parametrize(
    "where",
    [
        "outside",  # another directory
        "ok/../outside",  # .. out of the allowed root
        "ok/link/art",  # a symlink inside the allowed root that leads out of it
        "okay",  # a sibling whose name starts like the allowed root's
    ],
)
def test_a_root_outside_the_allow_list_is_refused_naming_the_setting(allowed, where):
    (allowed / "outside").mkdir()
    (allowed / "ok" / "link").symlink_to(allowed / "outside")
    root = os.path.join(allowed, where)
    with pytest.raises(UserError) as e:
        parse(root)
    shown = os.path.abspath(root)  # the root as the run would use it
    assert str(e.value).startswith(f"run.artifacts_dir {shown} (resolved: {os.path.realpath(root)}) is outside")
    assert f"{ENV_ROOTS}={allowed / 'ok'}" in str(e.value)
    assert not (allowed / "outside" / "art").exists()


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8765@evil.example/wikitext-103-raw-v1.zip",  # user 127.0.0.1, host evil.example
        "http://127.0.0.1:8766/wikitext-103-raw-v1.zip",  # another port
        "https://127.0.0.1:8765/wikitext-103-raw-v1.zip",  # another scheme
        "https://wikitext.smerity.com/wikitext-103-raw-v1.zip/../other.zip",  # .. out of the chapter's URL
        "https://wikitext.smerity.com/wikitext-103-raw-v1.zip.evil",  # not at or under its path
        "https://wikitext.smerity.com.evil.example/wikitext-103-raw-v1.zip",
        "file:///etc/passwd",
        "ZIPS/%2e%2e/outside.zip",  # an escaped .. out of the allowed folder
        "ZIPS-elsewhere/w.zip",
    ],
)
def test_a_source_outside_the_allow_list_is_refused_naming_the_setting(allowed, url):
    url = url.replace("ZIPS", (allowed / "zips").as_uri())
    with pytest.raises(UserError) as e:
        parse(allowed / "ok", url)
    assert str(e.value).startswith(
        f"corpus.source_url {redact_url(url)} is outside the sources this machine allows ({ENV_SOURCES}="
    )
    assert DEFAULT_URL in str(e.value) and "http://127.0.0.1:8765/" in str(e.value)  # "default" spelled out


def test_the_refusal_shows_no_credentials(allowed):
    with pytest.raises(UserError) as e:
        parse(allowed / "ok", "https://alice:hunter2@evil.example/w.zip")
    assert "hunter2" not in str(e.value) and str(e.value).startswith("corpus.source_url https://")


def test_a_relative_allowed_root_is_a_user_error(allowed, monkeypatch):
    monkeypatch.setenv(ENV_ROOTS, "artifacts")
    with pytest.raises(UserError, match=rf"^{ENV_ROOTS}: 'artifacts' is not an absolute path"):
        parse(allowed / "ok")


def test_a_deployment_run_outside_the_allow_list_is_refused_before_any_stage(prefect_server, allowed):
    """The flow itself (what a deployment run calls, skipping the CLI) refuses it on its first line: no task run,
    nothing written."""
    from flows.wiki_pipeline import wiki_pipeline

    root = allowed / "elsewhere"
    state = wiki_pipeline(corpus={"source_url": MIRROR}, run={"artifacts_dir": str(root)}, return_state=True)
    assert state.is_failed()
    with pytest.raises(UserError, match=rf"^run.artifacts_dir {root} .* is outside the artifact roots"):
        state.result()
    assert task_run_states(state.state_details.flow_run_id) == {}
    assert not root.exists()


@pytest.mark.parametrize(
    "url, why",
    [
        ("http://127.0.0.1:9999\\@127.0.0.1:8765/w.zip", "holds '\\\\\\\\'"),  # requests: host :9999; urlsplit: :8765
        ("http://evil.example\\@127.0.0.1:8765/w.zip", "holds '\\\\\\\\'"),
        ("http://127.0.0.1:8765/w .zip", "holds ' '"),
        ("http://127.0.0.1:99999/w.zip", "has a port that is not a number from 1 to 65535"),
    ],
)
def test_urls_the_parsers_read_differently_are_refused(allowed, url, why):
    """The review's bypass: urllib.parse reads the host after a backslash, requests before it. Such a URL is
    refused as a setting, and no allow-list entry ever covers it."""
    from tasks.sources.allowed import url_under as _url_under

    with pytest.raises(UserError, match=rf"^corpus\.source_url .* {why}"):
        parse(allowed / "ok", url)
    assert not _url_under(url, "http://127.0.0.1:8765/")
