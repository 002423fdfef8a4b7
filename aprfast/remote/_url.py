"""URLs of remote objects: the one parser of every HTTP path (:func:`parse_http_url`:
``aprfast.open``, ``load_file``, ``convert``, ``stream`` and ``apr download`` all reach a
server through it) and the one redaction of every URL shown to a person
(:func:`redact_url`: error messages, the download cache's records, ``apr cache info``).

A URL may carry secrets in two places: its userinfo (``https://user:password@host/``)
and its query (a presigned S3 URL's ``X-Amz-Signature``, a ``?token=``); a fragment is
never sent but may hold one too.  Shown, a URL keeps its scheme, host, port and path;
the userinfo is removed and the query and fragment become ``?…`` and ``#…``.
"""

from __future__ import annotations

import base64
import re
import urllib.parse
from typing import NamedTuple

from ..errors import AprIOError

__all__ = ["redact_url", "redact_urls", "scrub", "Secrets", "parse_http_url", "HttpUrl", "RemoteURLError"]

_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*://)([^/?#]*)([^?#]*)(\?[^#]*)?(#.*)?$", re.DOTALL)
#: Default ports, for comparing origins (http://h and http://h:80 are one origin).
_DEFAULT_PORTS = {"http": 80, "https": 443}


class RemoteURLError(AprIOError, ValueError):
    """E007: a URL that cannot be requested (not http(s), no host, a bad port), given
    or named by a redirect.  Also a ``ValueError``, as a malformed argument is."""


def redact_url(url) -> str:
    """``url`` as it may be shown: userinfo removed, query and fragment replaced by
    ``?…`` / ``#…`` (anything that is not a ``scheme://`` URL is returned unchanged).

    >>> redact_url("https://bob:pw@example.org:8443/m.apr?X-Amz-Signature=abc#x")
    'https://example.org:8443/m.apr?…#…'
    """
    if url is None:
        return None
    text = str(url)
    m = _URL.match(text)
    if m is None:
        return text
    scheme, authority, path, query, fragment = m.groups()
    host = authority.rpartition("@")[2]
    return f"{scheme}{host}{path}{'?…' if query else ''}{'#…' if fragment else ''}"


_ANY_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s'\"<>()\[\]]*(?:\[[^\s\]]*\][^\s'\"<>()]*)?")


def redact_urls(text) -> str:
    """``text`` with every ``scheme://`` URL in it shown by :func:`redact_url` (a
    backend's message may quote a URL a server named: a redirect's ``Location`` with
    its userinfo and query).

    >>> redact_urls("redirected to 'ftp://bob:pw@h/x?token=t' and http://h/y")
    "redirected to 'ftp://h/x?…' and http://h/y"
    """
    return _ANY_URL.sub(lambda m: redact_url(m.group(0)), str(text))


def _secrets(url: str) -> list:
    """The secret parts of ``url`` (userinfo, password, query, fragment), longest first."""
    m = _URL.match(url)
    if m is None:
        return []
    _, authority, _, query, fragment = m.groups()
    userinfo = authority.rpartition("@")[0]
    found = {url}
    if userinfo:
        found.add(userinfo + "@")
        password = userinfo.partition(":")[2]
        for text in (userinfo, password, urllib.parse.unquote(password), urllib.parse.unquote(userinfo)):
            if len(text) >= 4:  # shorter ones go with the forms above only: replacing "a" everywhere garbles
                found.add(text)
    for part in (query, fragment):
        if part and len(part) > 1:
            found.add(part)
            found.add(part[1:])
    return sorted(found, key=len, reverse=True)


def scrub(text: str, *urls) -> str:
    """``text`` (an exception's message, say) with every secret part of each of
    ``urls`` replaced: the whole URL by its :func:`redact_url` form, a query by ``?…``,
    userinfo and passwords by ``…``."""
    text = str(text)
    for url in urls:
        if not url:
            continue
        url = str(url)
        for secret in _secrets(url):
            if secret in text:
                if secret == url:
                    replacement = redact_url(url)
                elif secret[0] in "?#":
                    replacement = secret[0] + "…"
                elif secret.endswith("@"):
                    replacement = ""
                else:
                    replacement = "…"
                text = text.replace(secret, replacement)
    return text


class Secrets:
    """What a message about ``url`` must not show, whoever wrote its text: the URL's
    secret parts (as :func:`scrub`) and the values of the ``headers`` sent with it
    (an ``Authorization``, a ``Cookie``, an API key; each value whole and each word of
    it).  A server can quote any of them back (in a status line, a ``Content-Range``,
    an ``ETag``), so every message built from its answer goes through this.

    >>> Secrets("http://u:pw12@h/m?sig=abc", {"Cookie": "c=SECRETCOOKIE"})("ETag 'sig=abc SECRETCOOKIE pw12'")
    "ETag '… … …'"
    """

    def __init__(self, url: str, headers=None):
        self.url = url
        words = set()
        for value in (headers or {}).values():
            value = str(value)
            for word in (value, *re.split(r"[\s;,=:]+", value)):
                if len(word) >= 6:  # shorter words ("c", "Basic") are no secrets, and common
                    words.add(word)
        self.words = sorted(words, key=len, reverse=True)

    def __call__(self, text) -> str:
        text = scrub(text, self.url)
        for word in self.words:
            text = text.replace(word, "…")
        return text

    def clean(self, exc):
        """``exc`` (an :class:`~aprfast.errors.AprError` or any exception whose
        ``str`` is its message) when it shows no secret, else a new one of its type with
        the message scrubbed (raise it outside the ``except`` block: chained to nothing)."""
        from ..errors import AprError

        if isinstance(exc, AprError):
            message = self(exc.message)
            if message == exc.message and self(exc.path or "") == (exc.path or ""):
                return exc
            return type(exc)(message, path=self(exc.path) if exc.path else exc.path)
        text = str(exc)
        message = self(text)
        return exc if message == text else type(exc)(message)


class HttpUrl(NamedTuple):
    """One http(s) URL, parsed once for every HTTP path."""

    url: str
    scheme: str
    host: str
    port: int | None
    #: path and query as sent in the request line
    target: str
    #: (scheme, host, port) with the default port filled in: what "the same origin" compares
    origin: tuple
    #: ``Authorization: Basic ...`` from the userinfo (None without userinfo)
    authorization: str | None

    @property
    def shown(self) -> str:
        return redact_url(self.url)


def parse_http_url(url: str, *, redirect_from: str | None = None) -> HttpUrl:
    """``url`` parsed for a request: scheme http or https, a host, a valid port; its
    userinfo becomes a Basic ``Authorization`` (percent-decoded, UTF-8).  Anything else
    is a :class:`RemoteURLError` whose message shows the URL redacted (``redirect_from``:
    the URL whose redirect named it, for the message)."""
    what = "a redirect to" if redirect_from is not None else "not an http(s) URL:"
    where = redact_url(redirect_from if redirect_from is not None else url)
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
        host = parts.hostname
    except ValueError:
        raise RemoteURLError(f"{what} {redact_url(url)}: not a valid URL", path=where) from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        message = (f"a redirect to {redact_url(url)}: only http(s) redirects are followed" if redirect_from
                   is not None else f"not an http(s) URL: {redact_url(url)}")
        raise RemoteURLError(message, path=where)
    if not host:
        raise RemoteURLError(f"{what} {redact_url(url)}: the URL names no host", path=where)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    authorization = None
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode("utf-8")).decode("ascii")
        authorization = f"Basic {token}"
    return HttpUrl(url, scheme, host, port, target, (scheme, host.lower(), port or _DEFAULT_PORTS[scheme]),
                   authorization)
