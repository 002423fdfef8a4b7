"""A hostile raw-socket HTTP/1.1 server on 127.0.0.1 for the review-2 remote tests
(issue 25: redirects to other origins and schemes, bytes dripped slowly, malformed
headers, endless bodies).  No tests here; the test modules import :class:`RawServer`
and the fixture ``raw_server`` (``raw_server(handler) -> RawServer``, closed after the
test).  tests/servers.py's ``http_server`` is used where a well-behaved server does.

A handler is ``handler(path, request_text, send, stop) -> "close" | None``: ``send``
writes bytes, ``stop`` is a threading.Event set when the test ends (a slow handler
checks it between bytes).
"""

from __future__ import annotations

import re
import socket
import threading

import pytest

__all__ = ["RawServer", "raw_server", "ranged", "header"]


class RawServer:
    """Accepts connections on 127.0.0.1 and answers each request with ``handler``; every
    request's text is kept in ``requests``."""

    def __init__(self, handler):
        self.handler = handler
        self.requests: list[str] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.1)
        self.port = self._sock.getsockname()[1]
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def url(self, path: str = "/m.apr", userinfo: str = "") -> str:
        return f"http://{userinfo + '@' if userinfo else ''}127.0.0.1:{self.port}{path}"

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:  # socket.timeout included
                continue
            with self._lock:
                self._conns.append(conn)
                thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
                self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        try:
            while not self.stop.is_set():
                request = b""
                while b"\r\n\r\n" not in request:
                    try:
                        chunk = conn.recv(65536)
                    except socket.timeout:  # TimeoutError from Python 3.10
                        if self.stop.is_set():
                            return
                        continue
                    if not chunk:
                        return
                    request += chunk
                text = request.decode("latin-1")
                with self._lock:
                    self.requests.append(text)
                if self.handler(text.split(" ")[1], text, conn.sendall, self.stop) == "close":
                    return
        except OSError:
            pass
        finally:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self._accepting.join(5)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(5)
        self._sock.close()


@pytest.fixture
def raw_server():
    servers = []

    def start(handler) -> RawServer:
        server = RawServer(handler)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def ranged(data: bytes, text: str, send, extra: bytes = b"") -> None:
    """A correct 200 / 206 answer to a request with no Range or a single range (the first
    of a list), as a plain static-file server gives."""
    m = re.search(r"(?im)^range:\s*bytes=(\d*)-(\d*)", text)
    if not m:
        send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (len(data), extra) + data)
        return
    a, b = m.group(1), m.group(2)
    if a == "":
        a, b = len(data) - int(b), len(data) - 1
    else:
        a, b = int(a), min(int(b) if b else len(data) - 1, len(data) - 1)
    body = data[a:b + 1]
    send(b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %d-%d/%d\r\nContent-Length: %d\r\n%s\r\n"
         % (a, b, len(data), len(body), extra) + body)


def header(text: str, name: str):
    """The value of header ``name`` in a request's text (None when absent)."""
    m = re.search(rf"(?im)^{re.escape(name)}:\s*(.*?)\r?$", text)
    return None if m is None else m.group(1)
