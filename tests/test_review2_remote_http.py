"""Issue 25 (review 2026-11) on the HTTP paths: open, load_file, convert and stream.

- N2: the caller's headers (and the URL's userinfo credentials) never reach another
  origin (scheme, host or port) a redirect names; they do reach the same origin.
- N8: a server dripping its headers or body fails with a typed RemoteTimeoutError in
  bounded time (min_rate, deadline); a slow consumer of a stream is not penalised.
- N13: a redirect to file:// or ftp:// is a typed RemoteURLError.
- N14: malformed response headers are typed errors from stream() as from open().
- N17: no error message, chained exception or handle path carries a URL's userinfo or
  query.
- N18: a URL with user:password@ works in every path (Basic auth), not only open().
"""

import base64
import time

import numpy as np
import pytest
from servers import http_server  # noqa: F401 - the fixture
from test_review2_remote_support import header, ranged, raw_server  # noqa: F401 - the fixture

import aprfast
from aprfast.errors import AprError, AprIOError
from aprfast.remote import RemoteTimeoutError, RemoteURLError, redact_url
from aprfast.remote._url import parse_http_url, scrub
from aprfast.remote.http import Target

TENSORS = {"w": np.arange(64, dtype=np.float32), "b": np.ones(3, np.float16)}
DATA = aprfast.save(TENSORS)
SECRETS = ("SECRET-TOKEN", "SECRET-COOKIE", "SECRET-CUSTOM", "SECRETPW", "SECRETQ")


def _open(url, so):
    with aprfast.open(url, storage_options=so) as f:
        return {name: f.get_tensor(name, copy=True) for name in f.keys()}


def _load_file(url, so):
    return aprfast.load_file(url, storage_options=so)


def _stream(url, so):
    return dict(aprfast.stream(url, storage_options=so))


def _convert(url, so, tmp_path):
    out = tmp_path / "out.apr"
    aprfast.convert(url, str(out), storage_options=so)
    return aprfast.load_file(str(out))


CALLS = {"open": _open, "load_file": _load_file, "stream": _stream, "convert": _convert}


def _call(name, url, so, tmp_path):
    if name == "convert":
        return _convert(url, so, tmp_path)
    return CALLS[name](url, so)


def _chain_text(exc) -> str:
    """str() of an exception and of everything chained to it."""
    texts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        texts.append(f"{type(exc).__name__}: {exc} {getattr(exc, 'path', '')}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(texts)


def _redirect_to(location: bytes):
    def handler(path, text, send, stop):
        send(b"HTTP/1.1 302 Found\r\nLocation: " + location + b"\r\nContent-Length: 0\r\n\r\n")
    return handler


# --- N2: headers to another origin ----------------------------------------------------------
@pytest.mark.parametrize("call", ["open", "load_file", "stream", "convert"])
def test_headers_are_not_sent_to_another_origin(raw_server, call, tmp_path):
    other = raw_server(lambda path, text, send, stop: ranged(DATA, text, send))
    origin = raw_server(_redirect_to(other.url().encode()))
    so = {"headers": {"Authorization": "Bearer SECRET-TOKEN", "Cookie": "c=SECRET-COOKIE",
                      "X-Custom": "SECRET-CUSTOM"}}
    got = _call(call, origin.url(), so, tmp_path)
    np.testing.assert_array_equal(got["w"], TENSORS["w"])
    assert origin.requests and all("SECRET-TOKEN" in r for r in origin.requests)
    assert other.requests
    for request in other.requests:
        assert not any(secret in request for secret in SECRETS), request


@pytest.mark.parametrize("call", ["open", "stream"])
def test_userinfo_credentials_are_not_sent_to_another_origin(raw_server, call, tmp_path):
    other = raw_server(lambda path, text, send, stop: ranged(DATA, text, send))
    origin = raw_server(_redirect_to(other.url().encode()))
    _call(call, origin.url(userinfo="alice:SECRETPW"), None, tmp_path)
    assert header(origin.requests[0], "Authorization") == "Basic " + base64.b64encode(b"alice:SECRETPW").decode()
    assert all(header(r, "Authorization") is None for r in other.requests)


@pytest.mark.parametrize("call", ["open", "load_file", "stream"])
def test_headers_follow_a_redirect_on_the_same_origin(raw_server, call, tmp_path):
    def handler(path, text, send, stop):
        if path == "/moved.apr":
            send(b"HTTP/1.1 301 Moved\r\nLocation: /m.apr\r\nContent-Length: 0\r\n\r\n")
        else:
            ranged(DATA, text, send)
    server = raw_server(handler)
    _call(call, server.url("/moved.apr"), {"headers": {"Authorization": "Bearer SECRET-TOKEN"}}, tmp_path)
    assert len(server.requests) >= 2
    assert all(header(r, "Authorization") == "Bearer SECRET-TOKEN" for r in server.requests)


def test_a_redirect_to_another_scheme_or_port_is_another_origin():
    base = Target("http://example.org/a.apr", {"Authorization": "x", "Cookie": "y"})
    assert base.redirect("/b.apr").headers == {"Authorization": "x", "Cookie": "y"}
    assert base.redirect("http://example.org:80/b.apr").headers == {"Authorization": "x", "Cookie": "y"}
    assert base.redirect("HTTP://EXAMPLE.org/b.apr").headers == {"Authorization": "x", "Cookie": "y"}
    for other in ("https://example.org/b.apr", "http://example.org:8080/b.apr", "http://example.com/b.apr",
                  "//evil.example/b.apr"):
        assert base.redirect(other).headers == {}, other
    # once dropped, they stay dropped, even back on the first origin
    assert base.redirect("https://example.org/b").redirect("http://example.org/a.apr").headers == {}
    # the new URL's own userinfo only
    moved = base.redirect("http://bob:pw@example.com/b.apr")
    assert moved.headers == {"Authorization": "Basic " + base64.b64encode(b"bob:pw").decode()}


# --- N8: time bounds ---------------------------------------------------------------------------
def _drip(data: bytes, every: float, *, headers_too: bool = False):
    """Send ``data`` as a 200 answer, one byte every ``every`` seconds (the headers too,
    when asked), stopping after 8 s or when the test ends."""
    def handler(path, text, send, stop):
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(data)
        if not headers_too:
            send(head)
            head = b""
        start = time.monotonic()
        for i in range(len(head + data)):
            if stop.wait(every) or time.monotonic() - start > 8:
                return "close"
            send((head + data)[i:i + 1])
        return "close"
    return handler


@pytest.mark.parametrize("call", ["open", "load_file", "stream"])
def test_a_dripping_body_fails_in_bounded_time(raw_server, call, tmp_path):
    server = raw_server(_drip(DATA, 0.02))  # each byte well within timeout; the body takes minutes
    start = time.monotonic()
    with pytest.raises(RemoteTimeoutError, match="min_rate") as info:
        _call(call, server.url(), {"timeout": 0.5}, tmp_path)
    assert time.monotonic() - start < 4
    assert isinstance(info.value, AprIOError) and isinstance(info.value, TimeoutError)
    assert info.value.code == "E007"
    assert len(server.requests) == 1  # not retried


def test_a_read_after_opening_that_drips_fails_in_bounded_time(raw_server):
    big = {"pad": np.zeros(1 << 16, np.float32), "w": np.arange(1 << 14, dtype=np.float32)}
    data = aprfast.save(big)

    def handler(path, text, send, stop):
        if "bytes=0-" in text:  # opening: answered at once
            ranged(data, text, send)
            return None
        answer = []
        ranged(data, text, answer.append)
        answer, start = b"".join(answer), time.monotonic()
        for i in range(len(answer)):
            if stop.wait(0.01) or time.monotonic() - start > 8:  # bounded for a client without bounds
                break
            send(answer[i:i + 1])
        return "close"

    server = raw_server(handler)
    with aprfast.open(server.url(), storage_options={"timeout": 0.5}) as f:
        start = time.monotonic()
        with pytest.raises(RemoteTimeoutError):
            f.get_tensor("w")
        assert time.monotonic() - start < 3
    start = time.monotonic()
    with pytest.raises(RemoteTimeoutError):
        aprfast.load_file(server.url(), storage_options={"timeout": 0.5})
    assert time.monotonic() - start < 3


@pytest.mark.parametrize("call", ["open", "stream"])
def test_dripping_headers_fail_in_bounded_time(raw_server, call, tmp_path):
    server = raw_server(_drip(DATA, 0.02, headers_too=True))
    start = time.monotonic()
    with pytest.raises(RemoteTimeoutError):
        _call(call, server.url(), {"timeout": 0.5}, tmp_path)
    assert time.monotonic() - start < 4


@pytest.mark.parametrize("call", ["open", "stream"])
def test_the_deadline_bounds_a_call(raw_server, call, tmp_path):
    # a rate the min_rate rule lets through (64 KiB/s where 1 KiB/s is asked for), but
    # the answer (64 KiB to open, 1 MiB to stream) takes seconds: the call's deadline ends it
    big = aprfast.save({"w": np.zeros(1 << 18, np.float32)})

    def handler(path, text, send, stop):
        answer = []
        ranged(big, text, answer.append)
        answer = b"".join(answer)
        for i in range(0, len(answer), 1024):
            if stop.wait(1 / 64):
                return "close"
            send(answer[i:i + 1024])
        return "close"

    server = raw_server(handler)
    start = time.monotonic()
    with pytest.raises(RemoteTimeoutError, match="deadline"):
        _call(call, server.url(), {"timeout": 1, "min_rate": 1024, "deadline": 0.8}, tmp_path)
    assert time.monotonic() - start < 3


def test_a_stream_counts_only_the_time_spent_waiting_for_the_server(http_server):
    tensors = {f"t{i}": np.full(1000, i, np.float32) for i in range(5)}
    url = http_server.put("s.apr", aprfast.save(tensors))
    start, seen = time.monotonic(), {}
    for name, value in aprfast.stream(url, storage_options={"timeout": 0.3, "min_rate": 1, "deadline": 0.5}):
        seen[name] = value
        time.sleep(0.2)  # the caller's own work: 1 s in all, twice the deadline
    assert time.monotonic() - start > 0.9
    assert sorted(seen) == sorted(tensors)


def test_time_options_are_checked(http_server):
    url = http_server.put("m.apr", DATA)
    for bad in ({"deadline": -1}, {"deadline": "5"}, {"min_rate": -2}, {"timeout": 0}, {"timeout": True}):
        with pytest.raises(ValueError):
            aprfast.open(url, storage_options=bad)
        with pytest.raises(ValueError):
            aprfast.stream(url, storage_options=bad)
    with aprfast.open(url, storage_options={"min_rate": 0, "deadline": 30}) as f:  # 0: no rate bound
        np.testing.assert_array_equal(f.get_tensor("w"), TENSORS["w"])


# --- N13: redirects to other schemes ----------------------------------------------------------
@pytest.mark.parametrize("location", [b"file:///etc/passwd", b"ftp://u:SECRETPW@127.0.0.1:1/x?k=SECRETQ",
                                      b"gopher://127.0.0.1/", b"http://[::1/x"])
@pytest.mark.parametrize("call", ["open", "load_file", "stream", "convert"])
def test_a_redirect_to_another_scheme_is_typed(raw_server, call, location, tmp_path):
    server = raw_server(_redirect_to(location))
    with pytest.raises(RemoteURLError) as info:
        _call(call, server.url(), None, tmp_path)
    assert isinstance(info.value, AprError) and info.value.code == "E007"
    assert isinstance(info.value, ValueError)  # what HttpSource raised before
    assert not any(secret in _chain_text(info.value) for secret in SECRETS)


# --- N14: malformed headers -------------------------------------------------------------------
def _many_headers(path, text, send, stop):
    send(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: a\r\n" % i for i in range(200)) + b"\r\n")
    return "close"


def _long_header(path, text, send, stop):
    send(b"HTTP/1.1 200 OK\r\nX: " + b"a" * (1 << 20) + b"\r\n\r\n")
    return "close"


@pytest.mark.parametrize("handler", [_many_headers, _long_header], ids=["101-headers", "1MiB-line"])
@pytest.mark.parametrize("call", ["open", "stream"])
def test_malformed_headers_are_typed(raw_server, handler, call, tmp_path):
    server = raw_server(handler)
    with pytest.raises(AprIOError, match="HTTPException|LineTooLong|got more than"):
        _call(call, server.url(), None, tmp_path)


# --- N17: secrets in messages -----------------------------------------------------------------
def _status(code: int):
    def handler(path, text, send, stop):
        send(b"HTTP/1.1 %d Nope\r\nContent-Length: 0\r\n\r\n" % code)
    return handler


@pytest.mark.parametrize("code", [500, 404, 403, 416])
@pytest.mark.parametrize("call", ["open", "load_file", "stream", "convert"])
def test_error_messages_show_urls_redacted(raw_server, call, code, tmp_path):
    server = raw_server(_status(code))
    url = server.url("/m.apr?X-Amz-Signature=SECRETQ&token=SECRET-TOKEN", userinfo="alice:SECRETPW")
    with pytest.raises(AprIOError) as info:
        _call(call, url, None, tmp_path)
    text = _chain_text(info.value)
    assert not any(secret in text for secret in SECRETS), text
    assert "alice" not in text
    assert f"127.0.0.1:{server.port}/m.apr?…" in str(info.value)


def test_a_handle_and_its_errors_show_the_url_redacted(raw_server):
    server = raw_server(lambda path, text, send, stop: ranged(DATA, text, send))
    url = server.url("/m.apr?token=SECRET-TOKEN", userinfo="alice:SECRETPW")
    with aprfast.open(url) as f:
        assert f.path == f"http://127.0.0.1:{server.port}/m.apr?…"
        assert "SECRET" not in repr(f)
        with pytest.raises(KeyError) as info:
            f.get_tensor("missing")
        assert "SECRET" not in str(info.value)
    s = aprfast.stream(url)
    try:
        assert s._input.path == f"http://127.0.0.1:{server.port}/m.apr?…"
    finally:
        s.close()


def test_a_dripping_server_error_shows_the_url_redacted(raw_server):
    server = raw_server(_drip(DATA, 0.02))
    with pytest.raises(RemoteTimeoutError) as info:
        aprfast.open(server.url("/m.apr?token=SECRET-TOKEN", userinfo="a:SECRETPW"), storage_options={"timeout": 0.3})
    assert not any(secret in _chain_text(info.value) for secret in SECRETS)


@pytest.mark.parametrize("url, shown", [
    ("https://bob:pw@example.org:8443/m.apr?X-Amz-Signature=abc#frag", "https://example.org:8443/m.apr?…#…"),
    ("http://example.org/m.apr", "http://example.org/m.apr"),
    ("http://user@example.org/a?", "http://example.org/a?…"),
    ("http://a:b@c@example.org/x", "http://example.org/x"),
    ("s3://bucket/key.apr?versionId=v1", "s3://bucket/key.apr?…"),
    ("hf://org/repo@main/m.apr", "hf://org/repo@main/m.apr"),
    ("/local/path?.apr", "/local/path?.apr"),
    ("http://[::1]:8080/p?q=1", "http://[::1]:8080/p?…"),
])
def test_redact_url(url, shown):
    assert redact_url(url) == shown


def test_scrub_removes_every_secret_part():
    url = "http://alice:s3cr%40t@127.0.0.1:9/m.apr?X-Amz-Signature=SIG123&token=TOK456"
    text = (f"GET {url} failed; query X-Amz-Signature=SIG123&token=TOK456; password s3cr@t; "
            "userinfo alice:s3cr%40t@")
    cleaned = scrub(text, url)
    for secret in ("SIG123", "TOK456", "s3cr@t", "s3cr%40t"):
        assert secret not in cleaned
    assert "http://127.0.0.1:9/m.apr?…" in cleaned


# --- N18: one URL parser ----------------------------------------------------------------------
def _basic_only(user: bytes, password: bytes):
    wanted = "Basic " + base64.b64encode(user + b":" + password).decode()

    def handler(path, text, send, stop):
        if header(text, "Authorization") != wanted:
            send(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
        else:
            ranged(DATA, text, send)
    return handler


@pytest.mark.parametrize("call", ["open", "load_file", "stream", "convert"])
def test_userinfo_is_basic_auth_in_every_path(raw_server, call, tmp_path):
    server = raw_server(_basic_only(b"alice", b"p@ss w:rd"))
    got = _call(call, server.url(userinfo="alice:p%40ss%20w:rd"), None, tmp_path)
    np.testing.assert_array_equal(got["w"], TENSORS["w"])
    assert all(f"Host: 127.0.0.1:{server.port}" in r for r in server.requests)


def test_an_explicit_authorization_header_wins_over_userinfo(raw_server, tmp_path):
    server = raw_server(lambda path, text, send, stop: ranged(DATA, text, send))
    _stream(server.url(userinfo="alice:pw"), {"headers": {"authorization": "Bearer mine"}})
    assert header(server.requests[0], "Authorization") == "Bearer mine"


def test_parse_http_url():
    parsed = parse_http_url("HTTPS://u%3A1:p%2Fw@Example.ORG/a/b.apr?x=1")
    assert (parsed.scheme, parsed.host, parsed.port, parsed.target) == ("https", "example.org", None, "/a/b.apr?x=1")
    assert parsed.origin == ("https", "example.org", 443)
    assert parsed.authorization == "Basic " + base64.b64encode(b"u:1:p/w").decode()
    for bad in ("ftp://example.org/x", "http:///x", "http://example.org:99999/x", "http://[::1/x"):
        with pytest.raises(RemoteURLError):
            parse_http_url(bad)
