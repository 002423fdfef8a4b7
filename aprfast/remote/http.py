"""``http://`` and ``https://`` objects read with ranged GETs over kept-alive
connections (the standard library's ``http.client``; no extra dependency).

Opening costs one request: ``Range: bytes=0-65535,-64`` asks for the first
:data:`HEAD_BYTES` and the last :data:`TAIL_BYTES` together, so header, metadata,
index and footer of a model of a few hundred tensors arrive at once.  A server that
answers only the first range (or refuses multi-range with a whole-body 200) is asked
again for the first range alone, and the footer costs one more request when needed.

Every response is checked before its body is read: the status, the Content-Range
(exactly the bytes asked for, of an object of the length learnt at open), the
Content-Length, and the ETag / Last-Modified of the first response (a change is a
:class:`RemoteChangedError`, never a mix of two versions).  Buffers are sized from
the request, never from what a server claims.  A server that ignores ``Range`` (200
with the whole body) is accepted only for an object that fits :data:`HEAD_BYTES`,
otherwise refused (AprIOError) before its body is read.
"""

from __future__ import annotations

import atexit
import http.client
import os
import queue
import re
import ssl
import threading
import time
import urllib.parse

from ..errors import AprFileNotFoundError, AprIOError, AprPermissionError
from ._ranged import HEAD_BYTES, TAIL_BYTES, RangedSource, RemoteChangedError, TransientError

__all__ = ["HttpSource", "Endpoint", "check_range", "read_into"]

_CONTENT_RANGE = re.compile(r"bytes (\d{1,20})-(\d{1,20})/(\d{1,20}|\*)")
_UNSATISFIED = re.compile(r"bytes \*/(\d{1,20})")
#: Multipart headers and boundaries around the two ranges of the first response.
_MULTIPART_SLACK = 4096
#: The most bytes a redirect chain may follow.
_MAX_REDIRECTS = 5


class _Response:
    """Status and the headers this reader looks at, with the open response."""

    def __init__(self, resp: http.client.HTTPResponse):
        self.resp = resp
        self.status = resp.status
        self.content_range = resp.getheader("Content-Range")
        length = resp.getheader("Content-Length")
        self.length = int(length) if length is not None and length.strip().isdigit() else None
        self.version = (resp.getheader("ETag"), resp.getheader("Last-Modified"))
        self.content_type = resp.getheader("Content-Type") or ""
        self.location = resp.getheader("Location")


class HttpSource(RangedSource):
    """One HTTP(S) object.  ``headers`` are sent with every request (e.g. an
    ``Authorization``); ``timeout`` in seconds per socket operation; ``connections``
    bounds parallel requests (and kept-alive connections)."""

    def __init__(self, url: str, *, headers=None, timeout: float = 30.0, connections: int = 8):
        self.url = url
        self._headers = dict(headers or {})
        self._timeout = timeout
        self._set_target(url)
        self.version = None
        size, head, tail_start, tail = self._open()
        super().__init__(size, head, path=url, connections=connections)
        if tail is not None:
            self._set_tail(tail_start, tail)

    def _set_target(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self._endpoint = Endpoint(parts.scheme, parts.hostname, parts.port, self._timeout)
        self._idle = self._endpoint.idle
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    def _release(self, conn, resp) -> None:
        self._endpoint.release(conn, resp)

    def _request(self, range_header: str | None):
        """Send a GET; return (connection, _Response) with the body unread.  Connection
        failures and 5xx are TransientError; 4xx are typed errors."""
        headers = dict(self._headers)
        if range_header:
            headers["Range"] = range_header
        conn, resp = self._endpoint.send(self._target, headers)
        if resp.status >= 500:
            _drain_small(resp)
            conn.close()
            raise TransientError(f"the server answered {resp.status}")
        if resp.status in (404, 410):
            conn.close()
            raise AprFileNotFoundError(f"the server answered {resp.status}: no such object", path=self.url)
        if resp.status in (401, 403):
            conn.close()
            raise AprPermissionError(f"the server answered {resp.status}: access refused", path=self.url)
        return conn, resp

    # --- opening: length, version, first and last bytes ---------------------------------
    def _open(self):
        first = f"bytes=0-{HEAD_BYTES - 1}"
        range_header = f"{first},-{TAIL_BYTES}"
        redirects = 0
        for attempt in range(self.retries + 1):
            try:
                conn, resp = self._request(range_header)
            except TransientError as exc:
                if attempt == self.retries:
                    raise AprIOError(f"cannot open after {attempt + 1} attempts: {exc}", path=self.url) from None
                time.sleep(self.backoff * (2 ** attempt))
                continue
            if resp.status in (301, 302, 303, 307, 308) and resp.location and redirects < _MAX_REDIRECTS:
                conn.close()
                redirects += 1
                self._set_target(urllib.parse.urljoin(self.url, resp.location))
                continue
            if resp.status == 200 and range_header != first and (resp.length is None or resp.length > HEAD_BYTES):
                conn.close()  # maybe only multi-range is refused: ask for the first range alone
                range_header = first
                continue
            try:
                result = self._first_response(resp)
            except TransientError as exc:
                conn.close()
                if attempt == self.retries:
                    raise AprIOError(f"cannot open after {attempt + 1} attempts: {exc}", path=self.url) from None
                time.sleep(self.backoff * (2 ** attempt))
                continue
            except BaseException:
                conn.close()
                raise
            self._release(conn, resp)
            return result
        raise AprIOError("cannot open: too many redirects or retries", path=self.url)

    def _first_response(self, resp: _Response):
        self.version = resp.version
        if resp.status == 416:
            m = _UNSATISFIED.fullmatch((resp.content_range or "").strip())
            _drain_small(resp)
            if m and int(m.group(1)) == 0:
                return 0, b"", None, None  # an empty object; the layouts refuse it by name
            raise AprIOError(f"the server refused the range of the first {HEAD_BYTES} bytes (416)", path=self.url)
        if resp.status == 200:
            # The server ignores Range: usable only when the whole object is small.
            if resp.length is None or resp.length > HEAD_BYTES:
                raise AprIOError(f"the server ignores Range requests (it answered 200 with "
                                 f"{resp.length if resp.length is not None else 'an unknown number of'} bytes); "
                                 "random access to a large object needs ranged GETs: download it first",
                                 path=self.url)
            body = _read_exact(resp, resp.length)
            return len(body), body, None, None
        if resp.status != 206:
            raise AprIOError(f"the server answered {resp.status} to a ranged GET", path=self.url)
        if resp.content_type.startswith("multipart/byteranges"):
            return self._multipart(resp)
        first, last, total = self._check_range(resp, 0, None)
        if last + 1 - first > HEAD_BYTES:
            raise AprIOError(f"asked for at most {HEAD_BYTES} bytes, the server sent {last + 1 - first}",
                             path=self.url)
        body = _read_exact(resp, last + 1)
        return total, body, None, None

    def _multipart(self, resp: _Response):
        m = re.search(r'boundary="?([^";]+)"?', resp.content_type)
        if not m:
            raise AprIOError("a multipart response without a boundary", path=self.url)
        limit = HEAD_BYTES + TAIL_BYTES + _MULTIPART_SLACK
        if resp.length is not None and resp.length > limit:
            raise AprIOError(f"a multipart response of {resp.length} bytes to a request for at most "
                             f"{HEAD_BYTES + TAIL_BYTES}", path=self.url)
        body = resp.resp.read(limit + 1) if resp.length is None else _read_exact(resp, resp.length)
        if len(body) > limit:
            raise AprIOError(f"a multipart response of more than {limit} bytes", path=self.url)
        parts = _split_multipart(bytes(body), m.group(1).encode("latin-1"), self.url)
        if len(parts) != 2:
            raise AprIOError(f"asked for 2 ranges, the server sent {len(parts)}", path=self.url)
        (a0, b0, t0, head), (a1, b1, t1, tail) = parts
        if t0 != t1 or a0 != 0 or b0 >= HEAD_BYTES or b1 != t1 - 1 or b1 - a1 + 1 > TAIL_BYTES or b0 >= t0:
            raise AprIOError(f"the server's ranges {a0}-{b0}/{t0} and {a1}-{b1}/{t1} are not the ones asked for",
                             path=self.url)
        return t0, head, a1, tail

    def _check_range(self, resp: _Response, offset: int, n: int | None):
        return check_range(resp, offset, n, self.size if n is not None else None, self.url)

    # --- later reads --------------------------------------------------------------------
    def _fetch_into(self, offset: int, out: memoryview) -> int:
        n = out.nbytes
        conn, resp = self._request(f"bytes={offset}-{offset + n - 1}")
        try:
            self._check_version(resp)
            if resp.status == 200:
                if not (offset == 0 and n == self.size and resp.length == self.size):
                    raise AprIOError(f"the server ignored the Range header (200 with the whole object) for "
                                     f"{n} bytes at offset {offset}", path=self.url)
            elif resp.status == 206:
                self._check_range(resp, offset, n)
            else:
                raise AprIOError(f"the server answered {resp.status} to a ranged GET", path=self.url)
            return read_into(resp, out)
        finally:
            self._release(conn, resp)

    def _check_version(self, resp: _Response) -> None:
        etag, modified = self.version or (None, None)
        new_etag, new_modified = resp.version
        if (etag is not None and new_etag != etag) or (modified is not None and new_modified != modified):
            raise RemoteChangedError(f"the object changed since it was opened (ETag {etag!r} -> {new_etag!r}, "
                                     f"Last-Modified {modified!r} -> {new_modified!r}); open it again",
                                     path=self.url)


def check_range(resp: _Response, offset: int, n: int | None, size: int | None, url):
    """(first, last, total) of a 206 answer to a request for ``n`` bytes at ``offset``
    of an object of ``size`` bytes (n None: at most HEAD_BYTES from 0, size learnt
    here): exactly the bytes asked for, Content-Length agreeing, else an error."""
    m = _CONTENT_RANGE.fullmatch((resp.content_range or "").strip())
    if not m or m.group(3) == "*":
        raise AprIOError(f"a 206 answer with Content-Range {resp.content_range!r}", path=url)
    first, last, total = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if n is not None and total != size:
        raise RemoteChangedError(f"the object is now {total} bytes long; it was {size} when opened", path=url)
    want_last = offset + n - 1 if n is not None else last
    if first != offset or last != want_last or last < first or last >= total:
        raise AprIOError(f"asked for bytes {offset}-{want_last}, the server sent {first}-{last}/{total}", path=url)
    if resp.length is not None and resp.length != last - first + 1:
        raise AprIOError(f"Content-Length {resp.length} does not match Content-Range {first}-{last}", path=url)
    return first, last, total


def read_into(resp: _Response, out: memoryview) -> int:
    """Read the body into ``out`` (sized by the request, never by the server) until it
    is full or the body ends; returns how many bytes arrived.  A connection dropped
    mid-body is not an error here: the caller resumes at the first missing byte."""
    got, n = 0, out.nbytes
    try:
        while got < n:
            k = resp.resp.readinto(out[got:])
            if not k:
                break
            got += k
    except (OSError, http.client.HTTPException):
        pass
    return got


class Endpoint:
    """Kept-alive connections to one server (``scheme``, ``host``, ``port``), taken from
    and given back to the process-wide idle pool of that server.  ``cafile`` names the
    certificates an https server is checked against (None: the system's)."""

    def __init__(self, scheme: str, host: str, port, timeout: float, cafile: str | None = None):
        self.scheme, self.host, self.port, self.timeout, self.cafile = scheme, host, port, timeout, cafile
        self.idle = _idle_pool(scheme, host, port)

    def connect(self, reuse: bool = True) -> http.client.HTTPConnection:
        if reuse:
            try:
                conn = self.idle.get_nowait()
            except queue.Empty:
                pass
            else:  # shared between handles: this handle's timeout applies
                conn.timeout = self.timeout
                if conn.sock is not None:
                    conn.sock.settimeout(self.timeout)
                return conn
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout,
                                               context=ssl.create_default_context(cafile=self.cafile))
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def send(self, target: str, headers: dict):
        """GET ``target``; (connection, _Response) with the body unread, whatever the
        status.  A connection failure is a TransientError."""
        reused = not self.idle.empty()
        conn = self.connect()
        try:
            conn.request("GET", target, headers=headers)
            return conn, _Response(conn.getresponse())
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            if not reused:
                raise TransientError(f"{type(exc).__name__}: {exc}") from None
        # A kept-alive connection the server closed while idle: so are the others that
        # waited as long.  Drop them and try once on a new connection.
        self.drop_idle()
        conn = self.connect(reuse=False)
        try:
            conn.request("GET", target, headers=headers)
            return conn, _Response(conn.getresponse())
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise TransientError(f"{type(exc).__name__}: {exc}") from None

    def release(self, conn, resp) -> None:
        """Keep ``conn`` for the next request when its response was read to the end."""
        if resp is not None and not resp.resp.isclosed():
            conn.close()  # body not read to the end: the connection cannot carry another request
        elif resp is not None and resp.resp.will_close:
            conn.close()
        else:
            _give_back(self.idle, conn)

    def drop_idle(self) -> None:
        while True:
            try:
                self.idle.get_nowait().close()
            except queue.Empty:
                break


#: Idle kept-alive connections per (scheme, host, port), shared by every handle of the
#: process, so opening many handles on one server costs no new connection each.
_POOLS: dict = {}
_POOLS_LOCK = threading.Lock()
#: At most this many idle connections are kept per server.
MAX_IDLE = 32


def _idle_pool(scheme, host, port) -> queue.LifoQueue:
    # keyed by process too: a forked child must never write to its parent's sockets
    key = (os.getpid(), scheme, host, port)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = queue.LifoQueue()
        return pool


def close_idle_connections() -> None:
    """Close every idle kept-alive connection of this process (run at exit, so no socket
    is left for the interpreter to warn about; handles opened later simply reconnect)."""
    with _POOLS_LOCK:
        pools = [pool for key, pool in _POOLS.items() if key[0] == os.getpid()]
        _POOLS.clear()
    for pool in pools:
        while True:
            try:
                pool.get_nowait().close()
            except queue.Empty:
                break


atexit.register(close_idle_connections)


def _give_back(pool: queue.LifoQueue, conn) -> None:
    if pool.qsize() >= MAX_IDLE:
        conn.close()
    else:
        pool.put(conn)


def _drain_small(resp: _Response) -> None:
    """Read a small error body so the connection could be reused (large ones are not read)."""
    try:
        if resp.length is not None and resp.length <= 65536:
            resp.resp.read()
    except (OSError, http.client.HTTPException):
        pass


def _read_exact(resp: _Response, n: int) -> bytes:
    """Exactly ``n`` bytes of the body (``n`` bounded by the caller), or TransientError."""
    out = bytearray(n)
    got = read_into(resp, memoryview(out))
    if got != n:
        raise TransientError(f"the body ended after {got} of {n} bytes")
    return bytes(out)


def _split_multipart(body: bytes, boundary: bytes, url):
    """[(first, last, total, bytes)] of a multipart/byteranges body; each part's length
    comes from its Content-Range and is checked against the body."""
    parts, pos, marker = [], 0, b"--" + boundary
    while True:
        at = body.find(marker, pos)
        if at < 0:
            raise AprIOError("a multipart response without its closing boundary", path=url)
        pos = at + len(marker)
        if body[pos:pos + 2] == b"--":
            return parts
        end_headers = body.find(b"\r\n\r\n", pos)
        if end_headers < 0:
            raise AprIOError("a multipart part without the end of its headers", path=url)
        headers = body[pos:end_headers].decode("latin-1")
        m = re.search(r"(?im)^content-range:\s*bytes (\d{1,20})-(\d{1,20})/(\d{1,20})\s*$", headers)
        if not m:
            raise AprIOError("a multipart part without a Content-Range", path=url)
        first, last, total = int(m.group(1)), int(m.group(2)), int(m.group(3))
        start = end_headers + 4
        if last < first or start + last - first + 1 > len(body):
            raise AprIOError(f"a multipart part {first}-{last} longer than the body", path=url)
        parts.append((first, last, total, body[start:start + last - first + 1]))
        pos = start + last - first + 1
        if len(parts) > 8:
            raise AprIOError("a multipart response with more parts than ranges asked for", path=url)
