"""Issue 25 (review 2026-11) on ``apr download`` / ``apr cache`` (aprfast.remote.cache).

- N9: a body without Content-Length that never ends is bounded (``max_size``, with a
  default for bodies of undeclared length); a declared length above the bound is
  refused unread; failure is a typed error and a nonzero exit, with nothing recorded
  and no partial file left.
- N17: checksum.json, ``apr cache info`` (text and JSON), ``apr download --json`` and
  every message show URLs redacted (no userinfo, no query), even for records written
  before.
- N18: a URL with user:password@ downloads (Basic auth), its cache path without the
  userinfo.
- N2 / N8 on this path: headers are not sent to another origin; a dripping server ends
  with RemoteTimeoutError.
"""

import base64
import json
import time

import numpy as np
import pytest
from servers import http_server  # noqa: F401 - the fixture
from test_review2_remote_support import header, ranged, raw_server  # noqa: F401 - the fixture

import aprfast
from aprfast.cli import main
from aprfast.errors import AprIOError, LimitError
from aprfast.remote import RemoteTimeoutError, cache
from aprfast.remote.cache import cache_info, download

DATA = aprfast.save({"w": np.arange(8, dtype=np.float32)})


@pytest.fixture
def apr_cache(tmp_path, monkeypatch):
    root = tmp_path / "apr-cache"
    monkeypatch.setenv("APR_CACHE", str(root))
    monkeypatch.delenv("APR_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no user configuration
    return root


def _files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) if root.exists() else []


def _endless(path, text, send, stop):
    """200 with no Content-Length and a body that ends only when the client goes (or
    after 256 MiB / 10 s, so that a client without a bound fails the test quickly)."""
    send(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
    chunk, sent, start = b"\0" * (1 << 16), 0, time.monotonic()
    while not stop.is_set() and sent < (256 << 20) and time.monotonic() - start < 10:
        send(chunk)
        sent += len(chunk)
    return "close"


# --- N9: bounded downloads ------------------------------------------------------------------
def test_an_endless_body_is_bounded_by_max_size(raw_server, apr_cache):
    server = raw_server(_endless)
    start = time.monotonic()
    with pytest.raises(LimitError, match="max_size=1048576"):
        download(server.url("/inf/x.apr"), max_size=1 << 20)
    assert time.monotonic() - start < 5
    assert _files(apr_cache) == []  # no partial file, no checksum.json


def test_a_body_of_undeclared_length_has_a_default_bound(raw_server, apr_cache, monkeypatch):
    monkeypatch.setattr(cache, "DEFAULT_MAX_UNDECLARED", 1 << 20)
    assert cache.DEFAULT_MAX_SIZE >= 50 * 10 ** 9  # a declared length may be far larger
    server = raw_server(_endless)
    with pytest.raises(LimitError, match="declared no length"):
        download(server.url("/inf/x.apr"))
    assert _files(apr_cache) == []


def test_a_small_body_of_undeclared_length_downloads(raw_server, apr_cache):
    def handler(path, text, send, stop):
        send(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + DATA)
        return "close"

    path = download(raw_server(handler).url())
    assert path.read_bytes() == DATA


def test_a_declared_length_above_max_size_is_refused_unread(raw_server, apr_cache):
    sent = []

    def handler(path, text, send, stop):
        send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (10 << 20))
        for _ in range(160):
            if stop.wait(0.01):
                break
            send(bytes(1 << 16))
            sent.append(1)
        return "close"

    with pytest.raises(LimitError, match="10485760 bytes, more than max_size=1048576"):
        download(raw_server(handler).url(), max_size=1 << 20)
    assert _files(apr_cache) == []


def test_max_size_exactly_the_size_downloads(http_server, apr_cache):
    url = http_server.put("m.apr", DATA)
    assert download(url, max_size=len(DATA)).read_bytes() == DATA
    with pytest.raises(LimitError):
        download(url, max_size=len(DATA) - 1, force=True)


@pytest.mark.parametrize("argv, rc", [(["--max-size", "1MiB"], 4), (["--max-size", "1000000"], 4),
                                      (["--max-size", "lots"], 2)])
def test_apr_download_max_size(raw_server, apr_cache, capsys, argv, rc):
    server = raw_server(_endless)
    assert main(["download", *argv, server.url("/inf/x.apr")]) == rc
    assert _files(apr_cache) == []
    err = capsys.readouterr().err
    assert ("max_size" in err) if rc == 4 else ("--max-size" in err)


def test_apr_download_max_size_zero_is_no_bound(http_server, apr_cache, capsys):
    url = http_server.put("m.apr", DATA)
    assert main(["download", "--max-size", "0", url]) == 0


def test_a_download_failing_on_time_records_nothing(raw_server, apr_cache):
    def drip(path, text, send, stop):
        send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(DATA))
        for i in range(len(DATA)):
            if stop.wait(0.02):
                break
            send(DATA[i:i + 1])
        return "close"

    start = time.monotonic()
    with pytest.raises(RemoteTimeoutError):
        download(raw_server(drip).url(), storage_options={"timeout": 0.3})
    assert time.monotonic() - start < 3
    assert _files(apr_cache) == []


# --- N17: no secrets in records or output ---------------------------------------------------
def test_the_query_is_not_recorded_nor_printed(raw_server, apr_cache, capsys):
    server = raw_server(lambda path, text, send, stop: ranged(DATA, text, send))
    url = server.url("/m.apr?token=SECRET-QUERY&X-Amz-Signature=SECRETSIG")
    shown = f"http://127.0.0.1:{server.port}/m.apr?…"
    assert main(["download", "--json", url]) == 0
    assert json.loads(capsys.readouterr().out)["url"] == shown
    assert "token=SECRET-QUERY" in server.requests[0]  # the request itself keeps its query
    records = (apr_cache / "checksum.json").read_text(encoding="utf-8")
    assert "SECRET" not in records
    assert json.loads(records)[f"http/127.0.0.1_{server.port}/m.apr"]["url"] == shown
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert shown in out and "SECRET" not in out
    assert main(["cache", "info", "--json"]) == 0
    assert "SECRET" not in capsys.readouterr().out


def test_records_written_before_are_shown_redacted(apr_cache, capsys):
    apr_cache.mkdir(parents=True)
    (apr_cache / "checksum.json").write_text(json.dumps({"http/h_1/m.apr": {
        "url": "http://bob:SECRETPW@h:1/m.apr?sig=SECRETSIG", "size": 1, "sha256": "0" * 64}}))
    assert cache_info()["files"][0]["url"] == "http://h:1/m.apr?…"
    assert main(["cache", "info"]) == 0
    assert "SECRET" not in capsys.readouterr().out


@pytest.mark.parametrize("code, rc", [(404, 3), (500, 1), (403, 1)])
def test_download_errors_show_the_url_redacted(raw_server, apr_cache, capsys, code, rc):
    def handler(path, text, send, stop):
        send(b"HTTP/1.1 %d Nope\r\nContent-Length: 0\r\n\r\n" % code)

    url = raw_server(handler).url("/m.apr?token=SECRET-QUERY", userinfo="bob:SECRETPW")
    assert main(["download", url]) == rc
    err = capsys.readouterr().err
    assert "SECRET" not in err and "bob" not in err and "/m.apr?…" in err
    with pytest.raises(AprIOError) as info:
        download(url)
    exc, texts = info.value, []
    while exc is not None:
        texts.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    assert not any("SECRET" in text for text in texts)


def test_a_url_that_names_no_file_is_refused_redacted(apr_cache, capsys):
    assert main(["download", "http://bob:SECRETPW@example.org/?token=SECRET-QUERY"]) == 2
    assert "SECRET" not in capsys.readouterr().err


# --- N18: userinfo ----------------------------------------------------------------------------
def test_a_url_with_userinfo_downloads_with_basic_auth(raw_server, apr_cache, capsys):
    wanted = "Basic " + base64.b64encode(b"bob:SECRET PW").decode()

    def handler(path, text, send, stop):
        if header(text, "Authorization") != wanted:
            send(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
        else:
            ranged(DATA, text, send)

    server = raw_server(handler)
    assert main(["download", server.url(userinfo="bob:SECRET%20PW")]) == 0
    path = capsys.readouterr().out.strip()
    assert path == str(apr_cache / "http" / f"127.0.0.1_{server.port}" / "m.apr")
    with open(path, "rb") as f:
        assert f.read() == DATA
    assert "SECRET" not in (apr_cache / "checksum.json").read_text() and "bob" not in path


# --- N2 on this path ----------------------------------------------------------------------------
def test_download_headers_are_not_sent_to_another_origin(raw_server, apr_cache):
    other = raw_server(lambda path, text, send, stop: ranged(DATA, text, send))

    def origin_handler(path, text, send, stop):
        send(b"HTTP/1.1 307 Temporary\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % other.url().encode())

    origin = raw_server(origin_handler)
    path = download(origin.url(), storage_options={"headers": {"Authorization": "Bearer SECRET-TOKEN"}})
    assert path.read_bytes() == DATA
    assert header(origin.requests[0], "Authorization") == "Bearer SECRET-TOKEN"
    assert all("SECRET" not in r for r in other.requests)
