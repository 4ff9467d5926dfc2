"""Which source URLs this machine lets a run read and a download be redirected to
(``WIKI_PIPELINE_ALLOWED_SOURCES``): a value (:class:`SourcePolicy`) read from the environment and handed to each
download, never installed into the download module. Unset, a deployment run gets :data:`DEFAULT_SOURCES` and a
person's own run any source (docs/SERVING.md); with no policy at all (a library call) a download follows a
redirect within the origin of the hop that sent it only."""

from __future__ import annotations

import os
import posixpath
import re
import sys
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from mygpt.errors import UserError
from tasks.core.urls import redact_url

ENV_SOURCES = "WIKI_PIPELINE_ALLOWED_SOURCES"
DEFAULT = "default"  # in the list: the defaults
WIKITEXT_103_URL = "https://wikitext.smerity.com/wikitext-103-raw-v1.zip"  # the chapter's zip: corpus.kind=wikitext
DEMO_PORT = 8765  # the loopback mirror of --mirror and scripts/pipeline --demo
WIKIMEDIA_DUMPS = "https://dumps.wikimedia.org"  # Wikimedia's own dump server: corpus.kind=dump's short form
DEFAULT_SOURCES = (WIKITEXT_103_URL, f"{WIKIMEDIA_DUMPS}/", f"http://127.0.0.1:{DEMO_PORT}/")

#: ``(field, from_url, to_url) -> None``: asked before a download follows each redirect, ``from_url`` the hop that
#: redirected (same origin too: an allow-list may name a path); raises :class:`RedirectRefused` to refuse it.
RedirectCheck = Callable[[str, str, str], None]


class RedirectRefused(UserError):
    """A redirect the allow-list (or, with none, the rule: same origin only) does not let a download follow: an
    answer about this run's settings, not a server that is down, so never a reason to fall back."""


def origin(url: str) -> tuple[str, str, int | None]:
    u = urllib.parse.urlsplit(url)
    scheme = u.scheme.lower()
    return scheme, (u.hostname or "").lower(), u.port or {"http": 80, "https": 443}.get(scheme)


def same_origin_only(field: str, from_url: str, to_url: str) -> None:
    """The rule with no allow-list given: a redirect within the origin of ``from_url`` only."""
    if origin(to_url) == origin(from_url):
        return
    raise RedirectRefused(
        f"{field} {redact_url(from_url)} redirects to {redact_url(to_url)}, another host, and no allow-list "
        "decides which hosts a download may follow; give the address it redirects to as the source"
    )


def in_deployment_run() -> bool:
    """Whether this process runs a flow run of a deployment (triggered by a client of this machine's runner or
    worker), not a person's own ``wiki-pipeline run``. Prefect is not imported to ask a process that has not
    (importing it costs seconds, e.g. ``python -m tasks.corpora.dump``) and has none of the variables Prefect
    answers from outside a flow: such a process runs no flow run."""
    if "prefect" not in sys.modules and not any(
        k == "PREFECT__FLOW_RUN_ID" or k.startswith("PREFECT__RUNTIME__DEPLOYMENT__") for k in os.environ
    ):
        return False
    from prefect.runtime import deployment

    return deployment.id is not None


@dataclass(frozen=True)
class SourcePolicy:
    """The URL prefixes a run may read and be redirected to; ``prefixes`` None: any."""

    prefixes: tuple[str, ...] | None

    @classmethod
    def from_env(cls, deployment: bool | None = None) -> SourcePolicy:
        """This process's list (``deployment`` None: asked of Prefect); unset, the defaults for a deployment run."""
        if deployment is None:
            deployment = in_deployment_run()
        value = os.environ.get(ENV_SOURCES, "").strip() or (DEFAULT if deployment else "")
        if not value:
            return cls(None)
        sources: list[str] = []
        for item in re.split(r"[\s,]+", value):
            if item == DEFAULT:
                sources += DEFAULT_SOURCES
            elif item:
                if not url_parts(item):
                    raise UserError(
                        f"{ENV_SOURCES}: {item!r} is not a URL prefix like https://host/path/ or file:///dir/; fix it"
                    )
                sources.append(item)
        return cls(tuple(sources))

    def admits(self, url: str) -> bool:
        return self.prefixes is None or any(url_under(url, allowed) for allowed in self.prefixes)

    def shown(self) -> str:
        """``NAME=value``, or what the defaults are where the variable is unset (a deployment run)."""
        value = " ".join(self.prefixes or ())
        if os.environ.get(ENV_SOURCES, "").strip():
            return f"{ENV_SOURCES}={value}"
        return f"{ENV_SOURCES} is unset, so a deployment run gets the defaults: {value}"

    def check(self, field: str, url: str) -> None:
        """``UserError`` when the setting ``field``'s ``url`` is outside the list."""
        if not self.admits(url):
            listed = os.environ.get(ENV_SOURCES, "").strip() or DEFAULT
            raise UserError(
                f"{field} {redact_url(url)} is outside the sources this machine allows ({self.shown()}); use one "
                f"of them, or have whoever runs this worker add yours to {ENV_SOURCES} where the worker starts -- "
                f"with scripts/pipeline on your own machine that is you: {ENV_SOURCES}='{listed} {folder_of(url)}' "
                "scripts/pipeline ... (it restarts its runner with the new list, refusing while the runner serves "
                "a run)"
            )

    def check_redirect(self, field: str, from_url: str, to_url: str) -> None:
        """:class:`RedirectRefused` when a download of ``field`` is redirected (by the hop ``from_url``) to
        ``to_url`` outside the list. Why each redirect: the list names what a run may download, and a server it
        allows could otherwise send it anywhere."""
        if not self.admits(to_url):
            raise RedirectRefused(
                f"{field} {redact_url(from_url)} redirects to {redact_url(to_url)}, which is outside the sources "
                f"this machine allows ({self.shown()}); give a source that serves the file itself, or ask whoever "
                f"runs this worker to add the address it redirects to to {ENV_SOURCES}"
            )


def folder_of(url: str) -> str:
    """The allow-list entry that admits ``url``'s folder: ``url`` without credentials, query or file name."""
    u = urllib.parse.urlsplit(url)
    plain = u._replace(netloc=u.netloc.rpartition("@")[2], query="", fragment="").geturl()
    return plain.rsplit("/", 1)[0] + "/" if plain.count("/") > 2 else plain


def url_parts(url: str) -> tuple[str, str, int | None, str] | None:
    """``(scheme, host, port, path)`` of ``url`` with the path's ``%``-escapes and dot segments resolved (and, for
    ``file://``, its symlinks), or None when it is not a URL with a scheme (and a host, but for ``file``)."""
    if any(c == "\\" or c.isspace() or not c.isprintable() for c in url.strip()):
        return None  # parsers disagree on these (requests ends the host at a backslash): never allowed
    try:
        u = urllib.parse.urlsplit(url.strip())
        scheme, host, port = u.scheme.lower(), (u.hostname or "").lower(), u.port
    except ValueError:  # a port that is not a number, a bad IPv6 literal
        return None
    if not scheme or (scheme != "file" and not host):
        return None
    path = urllib.parse.unquote(u.path) or "/"
    if scheme == "file":
        if host not in ("", "localhost"):
            return None
        host, path = "", os.path.realpath(path)
    else:
        path = posixpath.normpath(path if path.startswith("/") else "/" + path)
        port = port or {"http": 80, "https": 443, "ftp": 21}.get(scheme)
    return scheme, host, port, path


def url_under(url: str, prefix: str) -> bool:
    got, allowed = url_parts(url), url_parts(prefix)
    if got is None or allowed is None or got[:3] != allowed[:3]:
        return False
    path, base = got[3], allowed[3]
    return path == base or path.startswith(base.rstrip("/") + "/")
