"""Credentials out of URLs: redacted forms, and the address a URL names without its user info or signature."""

from __future__ import annotations

import hashlib

import pytest

from tasks import corpus as D
from tasks.core.urls import address_sha256, redact_text, redact_url
from tests.support.corpus_runs import written_forms


def test_redact_url():
    assert (
        redact_url("https://u:p@h:8/a/b.zip?sig=x%2F&e=1#f") == "https://***@h:8/a/b.zip?sig=***&e=***#***"
    )  # a fragment may hold a token
    assert redact_url("https://h/b.zip?tokenonly") == "https://h/b.zip?***"
    assert redact_url(D.DEFAULT_URL) == D.DEFAULT_URL
    # what stored things name an address by: the URL but its user info, fragment and signing parameters, hashed
    plain = hashlib.sha256(b"https://h:8/a/b.zip?e=1").hexdigest()
    assert address_sha256("https://u:p@H:8/a/b.zip?sv=2020&sig=x%2F&e=1#f") == plain
    assert address_sha256("https://h:8/a/b.zip?sv=2021&sig=y&se=2030&e=1") == plain, "a renewed Azure signature"
    assert address_sha256("https://h:8/a/b.zip?X-Amz-Signature=s&X-Amz-Expires=9&e=1") == plain, "S3 v4"
    assert address_sha256("https://h:8/a/b.zip?e=1&Signature=s&AWSAccessKeyId=k&Expires=9") == plain, "S3 v2"
    assert address_sha256("https://h:8/a/b.zip?e=2") != plain, "another file-selecting value: another address"
    for own in ("sig=y&e=1", "e=1&token=1", "e=1&Expires=9", "sp=r&e=1"):  # no signature scheme's marker there
        assert address_sha256(f"https://h:8/a/b.zip?{own}") != plain, f"?{own}: a server's own parameters count"
    assert (
        redact_text("GET /b.zip?sig=x%2F&e=1 failed", "https://h/b.zip?sig=x%2F&e=1")
        == "GET /b.zip?sig=***&e=*** failed"
    )
    # a redirect's target, whose secrets the source URL does not name, as requests quotes it (the path only; it
    # leaves ' ( ) unencoded in a query)
    assert (
        redact_text("url: /x.zip?token=ab'S3CR3T (Caused by x)", "http://h/r") == "url: /x.zip?token=*** (Caused by x)"
    )
    assert redact_text("for 'ftp://h/x?token=ab(S3CR3T)'", "http://h/r") == "for 'ftp://h/x?token=***'"
    assert redact_text("url: /dl/wiki(1).zip?sig=S3CR3T (x)", "http://h/r") == "url: /dl/wiki(1).zip?sig=*** (x)"
    assert redact_text("url: /dl/a[1].zip?sig=S3CR3T", "http://h/r") == "url: /dl/a[1].zip?sig=***"
    assert (
        redact_text("{'url':'http://h/f.zip?a=1','status':500,'detail':'disk full'}", "http://h/r")
        == "{'url':'http://h/f.zip?a=***','status':500,'detail':'disk full'}"
    )
    assert (
        redact_text("Max retries exceeded with url: /t.zip?X-Amz-Signature=S3CR3T&X-Amz-Credential=K (x)", "http://h/r")
        == "Max retries exceeded with url: /t.zip?X-Amz-Signature=***&X-Amz-Credential=*** (x)"
    )


@pytest.mark.parametrize("password", ["p@ss", "p:ss", "50%pw", "p/ss", "ü@:/%x", "open sesame 42"])
def test_passwords_with_separators_are_redacted(password):
    """Secrets holding ``@``, ``:``, ``%`` or ``/`` (``partition("@")`` would show
    ``https://***@ss@host/w.zip`` for ``p@ss``)."""
    from urllib.parse import quote, quote_plus

    for written in {password.replace("/", "%2F"), quote(password, safe="")}:  # a raw "/" would end the host
        url = f"https://alice:{written}@mirror.example.org/w.zip?sig={quote(password, safe='')}"
        assert redact_url(url) == "https://***@mirror.example.org/w.zip?sig=***"
        message = (
            f"GET {url} failed; auth alice:{written}@; sig={quote(password, safe='')} / {password}; "
            f"form body sig={quote_plus(password)}&x=1 and on its own: {quote_plus(password)}"
        )
        shown = redact_text(message, url)
        assert "alice:" not in shown and "mirror.example.org/w.zip?sig=***" in shown
        assert not [form for form in written_forms(password) if form in shown], shown


def test_a_secret_with_spaces_written_with_plus_outside_a_url_is_redacted():
    """A form-encoded body or log line writes a space as ``+``: a query secret with spaces must go in that form
    too, next to its key and on its own, though no URL stands around it."""
    url = "https://h/w.zip?token=open%20sesame%20now&x=1"
    message = "POST body token=open+sesame+now&x=1; later the value alone: open+sesame+now (retrying)"
    shown = redact_text(message, url)
    assert shown == "POST body token=***&x=***; later the value alone: *** (retrying)"
    assert "sesame" not in redact_text("userinfo form: open+sesame+42", "https://alice:open%20sesame%2042@h/w.zip")


@pytest.mark.parametrize(
    "url, why",
    [
        ("http://[::1/w.zip", r"has a host that is not valid"),  # was: 'has a port that is not a number'
        ("http://[zz]/w.zip", r"has a host that is not valid"),
        ("http://127.0.0.1:0/w.zip", r"has a port that is not a number from 1 to 65535"),  # was: accepted
        ("http://127.0.0.1:65536/w.zip", r"has a port that is not a number from 1 to 65535"),
    ],
)
def test_the_one_address_check_names_what_is_wrong(url, why):
    """The reviewer's: check_url (corpus.source_url and tokenizer.source) blamed the port for a bad bracketed host,
    and let port 0 (which its own message excludes) through."""
    from tasks.core.urls import check_url
    from tasks.sources.pretrained_tokenizer import check_source

    for check in (lambda u: check_url(u, "source_url"), check_source):
        with pytest.raises(ValueError, match=why):
            check(url)
    assert check_url("http://[::1]:8765/w.zip", "source_url") == "http://[::1]:8765/w.zip"
