"""Real servers on 127.0.0.1 for the remote tests: nothing here reaches another address.

- ``http_server``: a small threaded HTTP/1.1 server (keep-alive) that serves objects
  from memory, honours ``Range`` (single, suffix and multi-range), counts every request
  and can inject faults: drop the connection mid-body, answer 500, ignore ``Range``, or
  change an object after a number of requests.
- ``s3_server``: moto's standalone S3 server (``ThreadedMotoServer``) on a free loopback
  port, used through s3fs with dummy credentials; ``make_bucket()`` creates a fresh bucket.
  Every request that reaches it is logged (``requests``, ``count``, ``gets()``,
  ``reset()``), so tests count real requests, with each one's query string and
  ``If-Match`` header (``details``); ``status_500`` / ``drop_mid_body`` make the next
  GETs fail, ``refuse_presigned`` answers 403 to GETs of presigned URLs.

Test modules import these fixtures explicitly (``from servers import http_server``);
the names ``http_server`` and ``s3_server`` are stable.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import re
import socket
import threading
import uuid

import pytest

__all__ = ["HttpObjectServer", "S3Server", "http_server", "s3_server", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Faults:
    """What the next requests should suffer; each counter is consumed by one request."""

    def __init__(self):
        self.status_500 = 0          # answer 500 to this many GETs
        self.drop_mid_body = 0       # send headers and half the body, then close
        self.ignore_range = False    # answer every GET with 200 and the whole object
        self.no_multi_range = False  # answer a multi-range request with only its first range
        self.change_after = None     # (path, requests, new_bytes): swap the object after N GETs
        self.lie_total = None        # report this total in Content-Range instead of the real one
        self.lie_length = False      # claim a Content-Length a terabyte longer than the body


class HttpObjectServer:
    """Serves ``objects[path] = bytes`` over HTTP/1.1 on 127.0.0.1."""

    def __init__(self):
        self.objects: dict[str, bytes] = {}
        self.etags: dict[str, str] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.connections = 0  # TCP connections accepted
        self.faults = _Faults()
        self._lock = threading.Lock()
        self._gets = 0
        handler = type("Handler", (_Handler,), {"store": self})
        self.httpd = _QuietServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def put(self, name: str, data: bytes) -> str:
        """Store ``data`` at ``/name`` and return its URL."""
        path = "/" + name.lstrip("/")
        with self._lock:
            self.objects[path] = bytes(data)
            self.etags[path] = '"' + hashlib.md5(data).hexdigest() + '"'
        return self.url(name)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name.lstrip('/')}"

    def reset(self) -> None:
        """Forget the request log and every fault (objects stay)."""
        with self._lock:
            self.requests.clear()
            self.faults = _Faults()
            self._gets = 0
            self.connections = 0

    @property
    def count(self) -> int:
        return len(self.requests)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # clients that drop kept-alive connections are expected here


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # headers and body are two writes: without TCP_NODELAY the body of a response on a
    # kept-alive connection waits ~40 ms for the client's delayed ACK of the headers
    disable_nagle_algorithm = True
    store: HttpObjectServer

    def log_message(self, *args):  # quiet
        pass

    def setup(self):
        super().setup()
        with self.store._lock:
            self.store.connections += 1

    def do_HEAD(self):
        self._serve(head=True)

    def do_GET(self):
        self._serve(head=False)

    def _serve(self, head: bool):
        store = self.store
        rng = self.headers.get("Range")
        with store._lock:
            store.requests.append((self.command, self.path, rng))
            faults = store.faults
            if not head:
                store._gets += 1
                change = faults.change_after
                if change is not None and store._gets > change[1]:
                    path, _n, new = change
                    store.objects[path] = new
                    store.etags[path] = '"' + hashlib.md5(new).hexdigest() + '"'
                    faults.change_after = None
            data = store.objects.get(self.path)
            etag = store.etags.get(self.path)
            fail = not head and faults.status_500 > 0
            if fail:
                faults.status_500 -= 1
            drop = not head and not fail and faults.drop_mid_body > 0
            if drop:
                faults.drop_mid_body -= 1
            ignore, single_only, lie = faults.ignore_range, faults.no_multi_range, faults.lie_total
            lie_length = not head and faults.lie_length
        if fail:
            return self._simple(500, b"injected failure")
        if data is None:
            return self._simple(404, b"no such object")
        size = len(data)
        ranges = None if (rng is None or ignore) else _parse_ranges(rng, size)
        if ranges == "unsatisfiable":
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if ranges and single_only:
            ranges = ranges[:1]
        total = size if lie is None else lie
        if lie_length:
            drop = "lie"
        if not ranges:
            self._send(200, data, {"ETag": etag, "Accept-Ranges": "bytes"}, head, drop)
        elif len(ranges) == 1:
            a, b = ranges[0]
            self._send(206, data[a:b + 1], {"ETag": etag, "Content-Range": f"bytes {a}-{b}/{total}"}, head, drop)
        else:
            boundary = uuid.uuid4().hex
            parts = []
            for a, b in ranges:
                parts.append(f"--{boundary}\r\nContent-Type: application/octet-stream\r\n"
                             f"Content-Range: bytes {a}-{b}/{total}\r\n\r\n".encode() + data[a:b + 1] + b"\r\n")
            body = b"".join(parts) + f"--{boundary}--\r\n".encode()
            self._send(206, body, {"ETag": etag, "Content-Type": f"multipart/byteranges; boundary={boundary}"},
                       head, drop)

    def _simple(self, status, body):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send(self, status, body, headers, head, drop):
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body) + (1 << 40 if drop == "lie" else 0)))
        self.end_headers()
        if head:
            return
        if drop == "lie":  # the body, then the connection goes away long before the claimed length
            self.wfile.write(body)
            self.wfile.flush()
            self.close_connection = True
            return
        if drop:  # half the body, then the connection goes away
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        self.wfile.write(body)


def _parse_ranges(header: str, size: int):
    """[(first, last), ...] inclusive, or "unsatisfiable", or None for a header we ignore."""
    m = re.fullmatch(r"\s*bytes=(.+)", header)
    if not m:
        return None
    out = []
    for spec in m.group(1).split(","):
        spec = spec.strip()
        a, _, b = spec.partition("-")
        if a == "":
            if not b.isdigit() or int(b) == 0:
                continue
            first, last = max(0, size - int(b)), size - 1
        else:
            if not a.isdigit() or (b and not b.isdigit()):
                return None
            first = int(a)
            last = min(int(b), size - 1) if b else size - 1
            if first >= size:
                continue
        if first <= last:
            out.append((first, last))
    return out or "unsatisfiable"


_shared_http_server = None


@pytest.fixture
def http_server():
    """One HTTP server for the whole session, with its request log and faults reset for
    each test (so counts start at zero)."""
    global _shared_http_server
    if _shared_http_server is None:
        _shared_http_server = HttpObjectServer()
    _shared_http_server.reset()
    yield _shared_http_server
    _shared_http_server.reset()


class S3Server:
    """moto's S3 server on 127.0.0.1; ``storage_options`` reach it through s3fs."""

    def __init__(self):
        import logging


        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise

        self.port = free_port()
        #: every request moto answered: (method, path, Range header), in arrival order
        self.requests: list[tuple[str, str, str | None]] = []
        #: for each of ``requests``: {"query": its query string, "if_match": its If-Match header}
        self.details: list[dict] = []
        #: faults for the next GETs, each consumed by one: answer 500, or send half the body
        self.status_500 = 0
        self.drop_mid_body = 0
        #: answer 403 AccessDenied to every GET whose query carries a signature (a presigned URL)
        self.refuse_presigned = False
        self._lock = threading.Lock()
        self._server = _CountingMotoServer(self, ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        # No region_name in client_kwargs: s3fs would send it as a LocationConstraint,
        # which us-east-1 refuses; AWS_DEFAULT_REGION (set by the fixture) names it.
        self.storage_options = {"key": "testing", "secret": "testing",
                                "client_kwargs": {"endpoint_url": self.endpoint_url}}

    def reset(self) -> None:
        """Forget the request log and the faults."""
        with self._lock:
            self.requests.clear()
            self.details.clear()
            self.status_500 = self.drop_mid_body = 0
            self.refuse_presigned = False

    @property
    def count(self) -> int:
        return len(self.requests)

    def gets(self) -> list:
        """The GETs logged so far, as (path, Range header)."""
        with self._lock:
            return [(path, rng) for method, path, rng in self.requests if method == "GET"]

    def fs(self):
        """An s3fs filesystem on this server (not the cached instance: fresh listings)."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options)

    def make_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh random name by default) and return its name."""
        name = name or f"b-{uuid.uuid4().hex[:12]}"
        self.fs().mkdir(name)
        return name

    def stop(self) -> None:
        self._server.stop()


def _counting_moto_server_class():
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    class CountingMotoServer(ThreadedMotoServer):
        """moto's threaded server with its WSGI app wrapped to log every request, so
        tests count what really reached the server (not what a client says it sent)."""

        def __init__(self, owner, **kwargs):
            super().__init__(**kwargs)
            self._owner = owner

        def _server_entry(self) -> None:  # as ThreadedMotoServer's, with the app wrapped
            app = DomainDispatcherApplication(create_backend_app)
            owner = self._owner

            def counting(environ, start_response):
                path = environ.get("PATH_INFO", "")
                method = environ.get("REQUEST_METHOD")
                with owner._lock:
                    owner.requests.append((method, path, environ.get("HTTP_RANGE")))
                    query = environ.get("QUERY_STRING", "")
                    owner.details.append({"query": query, "if_match": environ.get("HTTP_IF_MATCH")})
                    refuse = method == "GET" and owner.refuse_presigned and "Signature=" in query
                    fail = method == "GET" and owner.status_500 > 0
                    owner.status_500 -= fail
                    cut = method == "GET" and not fail and owner.drop_mid_body > 0
                    owner.drop_mid_body -= cut
                if refuse:
                    body = b"<Error><Code>AccessDenied</Code><Message>injected</Message></Error>"
                    start_response("403 Forbidden", [("Content-Type", "application/xml"),
                                                      ("Content-Length", str(len(body)))])
                    return [body]
                if fail:
                    body = b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"
                    start_response("500 Internal Server Error", [("Content-Type", "application/xml"),
                                                                 ("Content-Length", str(len(body)))])
                    return [body]
                if cut:  # the headers as moto sent them, then half the body and the connection closes
                    captured = {}

                    def keep(status, headers, exc_info=None):
                        captured["status"], captured["headers"] = status, headers

                    body = b"".join(app(environ, keep))
                    start_response(captured["status"], captured["headers"])
                    return [body[:len(body) // 2]]
                return app(environ, start_response)

            self._server = make_server(self._ip_address, self._port, counting, True,
                                       request_handler=MotoRequestHandler)
            self._server_ready_event.set()
            self._server.serve_forever()

    return CountingMotoServer


def _CountingMotoServer(owner, **kwargs):  # noqa: N802 - a class made on first use (moto is optional)
    return _counting_moto_server_class()(owner, **kwargs)


@pytest.fixture(scope="session")
def s3_server():
    """moto's standalone S3 server on loopback, with dummy credentials in the environment
    (so nothing can find real ones) for the session."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                                            "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                      AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    os.environ.pop("AWS_SESSION_TOKEN", None)
    server = S3Server()
    yield server
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
