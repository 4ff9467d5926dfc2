"""URLs as they may be shown or stored: credentials out, and the local path behind a ``file://`` URL.

A URL can carry credentials (``https://user:password@host/...``, or a signed URL's query): they are used to
fetch and nowhere else. :func:`redact_url` is the form every log line, message, manifest and report uses;
:func:`redact_text` takes them out of any text (an exception message may quote the URL or its query);
:func:`stored_url` is the form a JSON dump of settings holds -- redacted, except inside
:func:`credentials_revealed`, for the one output that must run with them (a deployment's parameters).
"""

from __future__ import annotations

import contextlib
import contextvars
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def redact_url(url: str) -> str:
    """``url`` as it may be shown or stored: user info and every query value replaced by ``***``
    (``https://alice:pw@host/f.zip?token=abc&x`` -> ``https://***@host/f.zip?token=***&***``)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=_redact_query(parts.query)))


def _redact_query(query: str) -> str:
    return "&".join(
        f"{key}=***" if sep else "***" for key, sep, _ in (item.partition("=") for item in query.split("&") if item)
    )


def redact_text(text: str, url: str) -> str:
    """``text`` (e.g. an exception message, which may quote the URL or its query) without ``url``'s secrets."""
    parts = urllib.parse.urlsplit(url)
    secrets = {url: redact_url(url), parts.query: _redact_query(parts.query)}
    if "@" in parts.netloc:
        secrets[parts.netloc.rpartition("@")[0]] = "***"
    for secret, shown in sorted(secrets.items(), key=lambda kv: -len(kv[0])):
        if secret:
            text = text.replace(secret, shown)
    return text


#: Set while settings are dumped for something that must run them (a deployment's parameters): then
#: ``source_url`` keeps its credentials; everywhere else its JSON form is redacted.
_REVEAL_URL = contextvars.ContextVar("reveal_source_url", default=False)


@contextlib.contextmanager
def credentials_revealed() -> Iterator[None]:
    """Dump ``CorpusSettings.source_url`` with its credentials (for ``wiki-pipeline params`` / ``serve``, whose
    output is what a deployment runs with) instead of redacted."""
    token = _REVEAL_URL.set(True)
    try:
        yield
    finally:
        _REVEAL_URL.reset(token)


def stored_url(url: str) -> str:
    """``url`` as the JSON form of settings holds it: :func:`redact_url`'s form, or whole inside
    :func:`credentials_revealed`."""
    return url if _REVEAL_URL.get() else redact_url(url)


def file_path(url: str) -> Path:
    """The local path a ``file://`` URL names."""
    return Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
