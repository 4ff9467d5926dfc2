"""URLs as they may be shown or stored: credentials out (:func:`redact_url`, :func:`redact_text`,
:func:`stored_url`), an address told apart without its query shown (:func:`address_sha256`), and the local path
behind a ``file://`` URL."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import re
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def redact_url(url: str) -> str:
    """``url`` with its user info, every query value and the fragment replaced by ``***``
    (``https://alice:pw@host/f.zip?token=abc&x#t=1`` -> ``https://***@host/f.zip?token=***&***#***``); the user info
    ends at the *last* ``@``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # e.g. an unbalanced "[" in the host: show the scheme only
        return url.partition(":")[0] + ":***"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    fragment = "***" if parts.fragment else ""
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=_redact_query(parts.query), fragment=fragment))


#: Query parameters that sign a request rather than select a file, by the scheme that signs (each family is left
#: out of an address only when that scheme's own signature parameter is there, so a server of its own that picks
#: files by, say, ``?sp=`` keeps them): S3 v4, Google Cloud Storage v4 and Alibaba OSS v4 (``X-Amz-*``,
#: ``X-Goog-*``, ``x-oss-*``, with their ``...-Signature``); S3 v2, GCS v2, OSS v1 and CloudFront (``Signature``
#: with ``AWSAccessKeyId``, ``GoogleAccessId``, ``OSSAccessKeyId`` or ``Key-Pair-Id``: those, ``Expires``,
#: ``Policy``); Azure SAS (``sig`` with ``sv``: ``sv``, ``ss``, ``srt``, ``sp``, ``se``, ``st``, ``spr``, ``sr``,
#: ``si``, ``sdd``, ``ses``, ``skoid``, ``sktid``, ``skt``, ``ske``, ``sks``, ``skv``, ``sig``).
_SIGNING_FAMILIES: tuple[tuple[str, tuple[str, ...], re.Pattern[str]], ...] = (
    # (the signature's own parameter, the key parameters one of which must be there too, the family's parameters)
    ("x-amz-signature", (), re.compile(r"x-amz-.*", re.IGNORECASE)),
    ("x-goog-signature", (), re.compile(r"x-goog-.*", re.IGNORECASE)),
    ("x-oss-signature", (), re.compile(r"x-oss-.*", re.IGNORECASE)),
    (
        "signature",
        ("awsaccesskeyid", "googleaccessid", "ossaccesskeyid", "key-pair-id"),
        re.compile(r"signature|expires|policy|awsaccesskeyid|googleaccessid|ossaccesskeyid|key-pair-id", re.I),
    ),
    ("sig", ("sv",), re.compile(r"sv|ss|srt|sp|se|st|spr|sr|si|sdd|ses|skoid|sktid|skt|ske|sks|skv|sig", re.I)),
)


def _signing_params(names: list[str]) -> list[re.Pattern[str]]:
    """The families of :data:`_SIGNING_FAMILIES` whose signature is among ``names`` (a query's keys, lower case)."""
    return [
        pattern
        for marker, keys, pattern in _SIGNING_FAMILIES
        if marker in names and (not keys or any(k in names for k in keys))
    ]


def address_sha256(url: str) -> str:
    """The sha256 (hex) of ``url`` as an address, for what is stored where ``?f=A`` and ``?f=B`` must differ:
    without user info, fragment and a present signature scheme's parameters (a renewed signed URL is the same
    address); scheme and host in lower case."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # refused by the settings before any use; nothing of it stored
        return hashlib.sha256(redact_url(url).encode("utf-8")).hexdigest()
    host = parts.netloc.rpartition("@")[2].lower()  # the user info ends at the last "@" (see redact_url)
    items = [item for item in parts.query.split("&") if item]
    keys = [urllib.parse.unquote_plus(item.partition("=")[0]) for item in items]
    signing = _signing_params([k.lower() for k in keys])
    query = "&".join(item for item, k in zip(items, keys, strict=True) if not any(p.fullmatch(k) for p in signing))
    whole = urllib.parse.urlunsplit(parts._replace(scheme=parts.scheme.lower(), netloc=host, query=query, fragment=""))
    return hashlib.sha256(whole.encode("utf-8")).hexdigest()


def _redact_query(query: str) -> str:
    return "&".join(
        f"{key}=***" if sep else "***" for key, sep, _ in (item.partition("=") for item in query.split("&") if item)
    )


#: A query in a message: up to whitespace, ``"`` or ``<>``, and up to a ``'`` that closes a quote (one followed by
#: ``,;:})]``, another quote, whitespace or the end). ``requests`` leaves ``'``, ``(``, ``)``, ``[`` and ``]``
#: unencoded in a path and a query, and a secret may hold them; a query cut short would leave the rest of a
#: secret readable, so a closing ``)`` or ``,`` is taken in with it.
_QUERY = r"(?:[^\s\"<>']|'(?![\s,;:})\]'\"]|$))*"
#: A URL quoted in a message (``scheme://...``, its path up to whitespace, ``"``, ``<>`` or ``?``; its query).
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"<>?]+(?:\?" + _QUERY + ")?")
#: A path with a query quoted in a message (``url: /dl/wiki(1).zip?X-Amz-Signature=...``, as ``requests`` names
#: the URL a redirect led to): its query, whose secrets :func:`redact_text` was not told, is redacted too.
_PATH_QUERY_IN_TEXT = re.compile(r"(/[^\s\"<>?]*)\?(" + _QUERY + ")")
#: Secrets shorter than this are taken out only where they stand next to their key (``token=1``) or ``@``:
#: replacing every ``1`` of a message would make it unreadable, and would not hide anything.
_MIN_BARE_SECRET = 4


def _any_encoding(secret: str) -> str:
    """A regex for ``secret`` in any mix of raw characters and percent-escapes (either case, once or twice escaped),
    ``+`` for a space."""
    out = []
    for ch in secret:
        forms = ["".join(f"%(?:25)?{b:02X}" for b in ch.encode("utf-8"))]
        if ch == " ":
            forms.append(r"\+")
        out.append("(?:" + "|".join([re.escape(ch), *forms]) + ")")
    return "".join(out)


def _secret_patterns(url: str) -> list[tuple[re.Pattern, str]]:
    """``(pattern, replacement)`` for each secret of ``url``, in any encoding: each query or fragment value (next
    to its key, and on its own when long enough), the user info (before an ``@``) and the password on its own."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return []
    found: list[tuple[str, str]] = []  # (regex, replacement)
    for item in [*parts.query.split("&"), *parts.fragment.split("&")]:  # a fragment may carry a token too
        key, sep, value = item.partition("=")
        if not sep:
            key, value = "", key
        for decoded in {urllib.parse.unquote(value), urllib.parse.unquote_plus(value)} - {""}:
            if key:
                found.append(
                    (
                        f"(?<![^?&;\\s'\"])({_any_encoding(urllib.parse.unquote(key))}(?:=|%3D))"
                        f"{_any_encoding(decoded)}",
                        r"\1***",
                    )
                )
            if len(decoded) >= _MIN_BARE_SECRET:
                found.append((_any_encoding(decoded), "***"))
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at:
        user, colon, password = userinfo.partition(":")
        info = _any_encoding(urllib.parse.unquote(user))
        if colon:
            info += "(?::|%3A)" + _any_encoding(urllib.parse.unquote(password))
        found.append((info + "(?=@|%40)", "***"))
        if len(urllib.parse.unquote(password)) >= _MIN_BARE_SECRET:
            found.append((_any_encoding(urllib.parse.unquote(password)), "***"))
    found.sort(key=lambda f: -len(f[0]))  # the longer (more specific) forms first
    return [(re.compile(pattern, re.IGNORECASE), repl) for pattern, repl in found]


def redact_text(text: str, url: str) -> str:
    """``text`` (e.g. an exception message) without ``url``'s secrets in any encoding, and with every URL and every
    query after a path in it redacted (a redirect's target, which ``url`` does not name)."""
    text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
    text = _PATH_QUERY_IN_TEXT.sub(lambda m: f"{m.group(1)}?{_redact_query(m.group(2))}" if m.group(2) else m[0], text)
    for pattern, repl in _secret_patterns(url):
        text = pattern.sub(repl, text)
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


def check_url(url: str, field: str, scheme_hint: str = "") -> str:
    """``url`` (stripped) when it is an ``http(s)://`` URL with a host or a ``file:///absolute/path``, else
    ``ValueError`` naming ``field`` and what to give (``scheme_hint``: what a wrong scheme's message adds). The one
    check of a source's address, shown redacted."""
    url, shown = url.strip(), redact_url(url.strip())
    if not url:
        raise ValueError(f"{field} must be an http(s):// or file:// URL of the source, got ''")
    odd = sorted({c for c in url if c == "\\" or c.isspace() or not c.isprintable()})
    if odd:  # parsers disagree on these (requests ends the host at a backslash, urllib.parse does not)
        raise ValueError(
            f"{field} {shown!r} holds {', '.join(map(repr, odd))}, which a URL cannot hold as it is; "
            "percent-encode it (e.g. %5C for a backslash, %20 for a space)"
        )
    try:
        parsed = urllib.parse.urlsplit(url)
    except ValueError:  # a bracketed host that is not an IPv6 address, or an unbalanced "[" or "]"
        raise ValueError(
            f"{field} {shown!r} has a host that is not valid (a '[' or ']' around what is not an IPv6 address); fix it"
        ) from None
    try:
        port_zero = parsed.port == 0  # no server listens on port 0
    except ValueError:  # a port that is not a number in 0..65535
        port_zero = True
    if port_zero:
        raise ValueError(f"{field} {shown!r} has a port that is not a number from 1 to 65535")
    scheme = parsed.scheme.lower()
    if scheme not in ("http", "https", "file"):
        raise ValueError(
            f"{field} {shown!r} has scheme {parsed.scheme or '(none)'!r}; use an http://, https:// or file:// URL"
            + scheme_hint
        )
    if scheme != "file" and not parsed.hostname:
        raise ValueError(f"{field} {shown!r} has no host; write it as {scheme}://host/path")
    if scheme == "file" and parsed.netloc not in ("", "localhost"):
        raise ValueError(
            f"{field} {shown!r}: a file:// URL cannot name a host ({parsed.hostname or shown!r}); "
            "use file:///absolute/path"
        )
    if scheme == "file" and not parsed.path.startswith("/"):
        raise ValueError(f"{field} {shown!r}: a file:// URL needs an absolute path (file:///...)")
    return url


def file_path(url: str) -> Path:
    """The local path a ``file://`` URL names."""
    return Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
