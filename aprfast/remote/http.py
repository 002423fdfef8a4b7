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

The URL is parsed once (:func:`~aprfast.remote._url.parse_http_url`, shared by every
HTTP path: ``open``, ``load_file``, ``convert``, ``stream``, ``apr download``): its
userinfo (``https://user:password@host/``) is sent as a Basic ``Authorization``.
Redirects (at most :data:`_MAX_REDIRECTS`) are followed to http(s) URLs only (another
scheme is a :class:`~aprfast.remote._url.RemoteURLError`); a redirect to another origin
(scheme, host or port) carries none of the caller's headers (``Authorization``,
``Cookie``, any other) nor the userinfo's credentials, as ``requests`` does.

Time: ``timeout`` bounds each socket operation; every request must also bring its bytes
at ``min_rate`` (:class:`Budget`), and a whole call may be given a ``deadline``, so a
server dripping its headers or body a byte at a time fails with
:class:`~aprfast.remote._ranged.RemoteTimeoutError` instead of holding a call for hours.

Every message names the URL redacted (:func:`~aprfast.remote._url.redact_url`): no
userinfo, no query.
"""

from __future__ import annotations

import atexit
import functools
import http.client
import math
import os
import queue
import re
import socket
import ssl
import threading
import time
import urllib.parse

from ..errors import AprError, AprFileNotFoundError, AprIOError, AprPermissionError
from ._ranged import HEAD_BYTES, TAIL_BYTES, RangedSource, RemoteChangedError, RemoteTimeoutError, TransientError
from ._url import Secrets, parse_http_url, redact_url

__all__ = ["HttpSource", "HttpBody", "Endpoint", "Target", "Budget", "open_body", "check_range", "read_into",
           "DEFAULT_MIN_RATE"]

_CONTENT_RANGE = re.compile(r"bytes (\d{1,20})-(\d{1,20})/(\d{1,20}|\*)")
_UNSATISFIED = re.compile(r"bytes \*/(\d{1,20})")
#: Multipart headers and boundaries around the two ranges of the first response.
_MULTIPART_SLACK = 4096
#: The most redirects a request follows.
_MAX_REDIRECTS = 5
_REDIRECT_STATUSES = (301, 302, 303, 307, 308)
#: Bytes per second a request must bring on average after its first ``timeout`` seconds
#: (16 KiB/s: a 64 KiB first request may take ``timeout`` + 4 s of waiting), see Budget.
DEFAULT_MIN_RATE = 16 << 10
#: Less time left than this (seconds) is none: a socket timeout set to what was left
#: fires at about that moment.
_SLACK = 1e-3
#: The most interim answers ("100 Continue") read before the final one: http.client
#: skips them in a loop of its own, so a server sending them without end at full speed
#: would hold a request for ever (the time bounds count waiting, and it never waits).
MAX_INTERIM = 16


class _Response:
    """Status and the headers this reader looks at, with the open response."""

    def __init__(self, resp: http.client.HTTPResponse):
        self.resp = resp
        self.status = resp.status
        self.content_range = resp.getheader("Content-Range")
        lengths = {value.strip() for value in resp.msg.get_all("Content-Length") or ()}
        if len(lengths) > 1:
            # RFC 9110 8.6: an error.  http.client would read as many bytes as the first says.
            raise http.client.HTTPException(f"Content-Length headers that disagree: {sorted(lengths)}")
        length = resp.getheader("Content-Length")
        self.length = int(length) if length is not None and length.strip().isdigit() else None
        self.version = (resp.getheader("ETag"), resp.getheader("Last-Modified"))
        self.content_type = resp.getheader("Content-Type") or ""
        self.location = resp.getheader("Location")


class HttpSource(RangedSource):
    """One HTTP(S) object.  ``headers`` are sent with every request to the URL's origin
    (e.g. an ``Authorization``; never to another origin a redirect names); userinfo in
    the URL is sent as Basic auth; ``timeout`` in seconds per socket operation;
    ``min_rate`` (bytes per second) and ``deadline`` (seconds) as for :class:`Budget`:
    each request at most ``timeout + received / min_rate`` seconds of waiting, opening
    (redirects and retries included) and each later request at most ``deadline``;
    ``connections`` bounds parallel requests (and kept-alive connections).

    Errors: :class:`~aprfast.remote._url.RemoteURLError` for a URL (or a redirect's)
    that is not http(s); :class:`~aprfast.remote._ranged.RemoteTimeoutError` past a time
    bound; AprFileNotFoundError (404, 410), AprPermissionError (401, 403), AprIOError
    otherwise; each message shows the URL redacted (:attr:`shown`)."""

    def __init__(self, url: str, *, headers=None, timeout: float = 30.0, connections: int = 8,
                 min_rate=DEFAULT_MIN_RATE, deadline=None):
        self.url = url
        self.shown = redact_url(url)
        self.path = self.shown  # for the errors raised before RangedSource.__init__ sets it
        budget = Budget(timeout, min_rate=min_rate, deadline=deadline, path=self.shown)  # checks the options
        self._limits = {"timeout": timeout, "min_rate": min_rate, "deadline": deadline}
        self._where = Target(url, headers, timeout)
        #: what no message may show: a server may quote the query or the credentials back
        self._secrets = Secrets(url, self._where.headers)
        self.version = None
        try:
            size, head, tail_start, tail = self._open(budget)
            error = None
        except AprError as exc:
            error = self._secrets.clean(exc)
            if error is exc:
                raise
        if error is not None:  # raised out here: chained to nothing that shows a secret
            raise error
        super().__init__(size, head, path=self.shown, connections=connections)
        if tail is not None:
            self._set_tail(tail_start, tail)

    @property
    def _headers(self) -> dict:
        """The headers the requests send now (none of the caller's after a redirect to
        another origin)."""
        return self._where.headers

    @property
    def _idle(self):
        return self._where.endpoint.idle

    def _release(self, conn, resp) -> None:
        self._where.endpoint.release(conn, resp)

    def _request(self, range_header: str | None, clock=None):
        """Send a GET; return (connection, _Response) with the body unread.  Connection
        failures and 5xx are TransientError; 4xx are typed errors."""
        where = self._where
        headers = dict(where.headers)
        if range_header:
            headers["Range"] = range_header
        if clock is None:
            clock = Budget(path=self.shown, **self._limits).request()
        conn, resp = where.endpoint.send(where.target, headers, clock)
        refuse_status(conn, resp, self.shown)
        return conn, resp

    # --- opening: length, version, first and last bytes ---------------------------------
    def _open(self, budget):
        first = f"bytes=0-{HEAD_BYTES - 1}"
        range_header = f"{first},-{TAIL_BYTES}"
        redirects = 0
        for attempt in range(self.retries + 1):
            try:
                conn, resp = self._request(range_header, budget.request())
            except TransientError as exc:
                if attempt == self.retries:
                    raise AprIOError(f"cannot open after {attempt + 1} attempts: {exc}", path=self.shown) from None
                time.sleep(self.backoff * (2 ** attempt))
                continue
            if resp.status in _REDIRECT_STATUSES and resp.location and redirects < _MAX_REDIRECTS:
                conn.close()
                redirects += 1
                self._where = self._where.redirect(resp.location)
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
                    raise AprIOError(f"cannot open after {attempt + 1} attempts: {exc}", path=self.shown) from None
                time.sleep(self.backoff * (2 ** attempt))
                continue
            except BaseException:
                conn.close()
                raise
            self._release(conn, resp)
            return result
        raise AprIOError("cannot open: too many redirects or retries", path=self.shown)

    def _first_response(self, resp: _Response):
        self.version = resp.version
        if resp.status == 416:
            m = _UNSATISFIED.fullmatch((resp.content_range or "").strip())
            _drain_small(resp)
            if m and int(m.group(1)) == 0:
                return 0, b"", None, None  # an empty object; the layouts refuse it by name
            raise AprIOError(f"the server refused the range of the first {HEAD_BYTES} bytes (416)", path=self.shown)
        if resp.status == 200:
            # The server ignores Range: usable only when the whole object is small.
            if resp.length is None or resp.length > HEAD_BYTES:
                raise AprIOError(f"the server ignores Range requests (it answered 200 with "
                                 f"{resp.length if resp.length is not None else 'an unknown number of'} bytes); "
                                 "random access to a large object needs ranged GETs: download it first",
                                 path=self.shown)
            body = _read_exact(resp, resp.length)
            return len(body), body, None, None
        if resp.status != 206:
            raise AprIOError(f"the server answered {resp.status} to a ranged GET", path=self.shown)
        if resp.content_type.startswith("multipart/byteranges"):
            return self._multipart(resp)
        first, last, total = self._check_range(resp, 0, None)
        if last + 1 - first > HEAD_BYTES:
            raise AprIOError(f"asked for at most {HEAD_BYTES} bytes, the server sent {last + 1 - first}",
                             path=self.shown)
        body = _read_exact(resp, last + 1)
        return total, body, None, None

    def _multipart(self, resp: _Response):
        m = re.search(r'boundary="?([^";]+)"?', resp.content_type)
        if not m:
            raise AprIOError("a multipart response without a boundary", path=self.shown)
        limit = HEAD_BYTES + TAIL_BYTES + _MULTIPART_SLACK
        if resp.length is not None and resp.length > limit:
            raise AprIOError(f"a multipart response of {resp.length} bytes to a request for at most "
                             f"{HEAD_BYTES + TAIL_BYTES}", path=self.shown)
        body = resp.resp.read(limit + 1) if resp.length is None else _read_exact(resp, resp.length)
        if len(body) > limit:
            raise AprIOError(f"a multipart response of more than {limit} bytes", path=self.shown)
        parts = _split_multipart(bytes(body), m.group(1).encode("latin-1"), self.shown)
        if len(parts) != 2:
            raise AprIOError(f"asked for 2 ranges, the server sent {len(parts)}", path=self.shown)
        (a0, b0, t0, head), (a1, b1, t1, tail) = parts
        if t0 != t1 or a0 != 0 or b0 >= HEAD_BYTES or b1 != t1 - 1 or b1 - a1 + 1 > TAIL_BYTES or b0 >= t0:
            raise AprIOError(f"the server's ranges {a0}-{b0}/{t0} and {a1}-{b1}/{t1} are not the ones asked for",
                             path=self.shown)
        return t0, head, a1, tail

    def _check_range(self, resp: _Response, offset: int, n: int | None):
        return check_range(resp, offset, n, self.size if n is not None else None, self.shown)

    # --- later reads --------------------------------------------------------------------
    def _fetch_into(self, offset: int, out: memoryview) -> int:
        try:
            return self._fetch_once(offset, out)
        except (AprError, TransientError) as exc:
            error = self._secrets.clean(exc)
            if error is exc:
                raise
        raise error  # out here: chained to nothing that shows a secret

    def _fetch_once(self, offset: int, out: memoryview) -> int:
        n = out.nbytes
        conn, resp = self._request(f"bytes={offset}-{offset + n - 1}")
        try:
            self._check_version(resp)
            if resp.status == 200:
                if not (offset == 0 and n == self.size and resp.length == self.size):
                    raise AprIOError(f"the server ignored the Range header (200 with the whole object) for "
                                     f"{n} bytes at offset {offset}", path=self.shown)
            elif resp.status == 206:
                self._check_range(resp, offset, n)
            else:
                raise AprIOError(f"the server answered {resp.status} to a ranged GET", path=self.shown)
            return read_into(resp, out)
        finally:
            self._release(conn, resp)

    def _check_version(self, resp: _Response) -> None:
        etag, modified = self.version or (None, None)
        new_etag, new_modified = resp.version
        if (etag is not None and new_etag != etag) or (modified is not None and new_modified != modified):
            raise RemoteChangedError(f"the object changed since it was opened (ETag {etag!r} -> {new_etag!r}, "
                                     f"Last-Modified {modified!r} -> {new_modified!r}); open it again",
                                     path=self.shown)


def open_body(url: str, *, headers=None, timeout=30.0, min_rate=DEFAULT_MIN_RATE, deadline=None,
              retries: int = RangedSource.retries, backoff: float = RangedSource.backoff) -> "HttpBody":
    """The whole body of ``url`` as an :class:`HttpBody` (one plain GET), with the
    redirect policy, time bounds, URL parsing and typed errors of :class:`HttpSource`:
    5xx and connection failures are retried ``retries`` times, then AprIOError."""
    where = Target(url, headers, timeout)
    secrets = Secrets(url, where.headers)
    try:
        return _open_body(where, secrets, timeout, min_rate, deadline, retries, backoff)
    except AprError as exc:
        error = secrets.clean(exc)
        if error is exc:
            raise
    raise error  # out here: chained to nothing that shows a secret


def _open_body(where, secrets, timeout, min_rate, deadline, retries, backoff) -> "HttpBody":
    shown = where.shown
    budget = Budget(timeout, min_rate=min_rate, deadline=deadline, path=shown)
    redirects = attempt = 0
    while True:
        clock = budget.request()
        try:
            conn, resp = where.endpoint.send(where.target, dict(where.headers), clock)
            if resp.status in _REDIRECT_STATUSES and resp.location:
                conn.close()
                if redirects == _MAX_REDIRECTS:
                    raise AprIOError(f"more than {_MAX_REDIRECTS} redirects", path=shown)
                redirects += 1
                where = where.redirect(resp.location)
                continue
            refuse_status(conn, resp, shown)
        except TransientError as exc:
            attempt += 1
            if attempt > retries:
                raise AprIOError(f"cannot open after {attempt} attempts: {exc}", path=shown) from None
            time.sleep(backoff * (2 ** (attempt - 1)))
            continue
        if resp.status != 200:
            conn.close()
            raise AprIOError(f"the server answered {resp.status} to a GET", path=shown)
        return HttpBody(conn, resp, shown, secrets)


class HttpBody:
    """A response body read forward (:func:`aprfast.stream`, ``apr download``).
    ``readinto`` fills a buffer; each read is bounded by the request's :class:`Budget`
    (RemoteTimeoutError); a body that ends before its Content-Length (``size``) or
    breaks off is an AprIOError (http.client never reads past a Content-Length).  Errors
    name the URL redacted (``url``)."""

    def __init__(self, conn, resp: _Response, shown: str, secrets=None):
        self._conn, self._resp, self.url = conn, resp, shown
        self._secrets = secrets if secrets is not None else Secrets(shown)
        self.got = 0
        #: the Content-Length (None: not declared, or a chunked body)
        self.size = None if resp.resp.chunked else resp.length
        self.length = self.size

    def readinto(self, view) -> int:
        if self._resp is None:
            raise ValueError("I/O operation on a closed HTTP body")
        failure = None
        try:
            n = self._resp.resp.readinto(view)
        except RemoteTimeoutError:
            raise
        except (OSError, http.client.HTTPException) as exc:
            n, failure = 0, f"the body broke off after {self.got} bytes: {type(exc).__name__}: {exc}"
        if failure is not None:  # raised here, chained to nothing
            raise AprIOError(self._secrets(failure), path=self.url)
        self.got += n
        if n == 0 and view and self.size is not None and self.got != self.size:
            raise AprIOError(f"the body ended after {self.got} of {self.size} bytes", path=self.url)
        return n

    def close(self) -> None:
        resp, conn, self._resp, self._conn = self._resp, self._conn, None, None
        if resp is not None:
            resp.resp.close()
        if conn is not None:
            conn.close()  # never given back: what a server sends past a body is not read


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
    except RemoteTimeoutError:
        raise  # past the request's time bound: not resumed
    except (OSError, http.client.HTTPException):
        pass
    return got


def refuse_status(conn, resp: _Response, shown) -> None:
    """Raise for an answer no request of this module reads on: 5xx (TransientError,
    retried), 404 and 410 (AprFileNotFoundError), 401 and 403 (AprPermissionError);
    ``conn`` is closed then."""
    if resp.status >= 500:
        _drain_small(resp)
        conn.close()
        raise TransientError(f"the server answered {resp.status}")
    if resp.status in (404, 410):
        conn.close()
        raise AprFileNotFoundError(f"the server answered {resp.status}: no such object", path=shown)
    if resp.status in (401, 403):
        conn.close()
        raise AprPermissionError(f"the server answered {resp.status}: access refused", path=shown)


class Target:
    """Where the requests for one URL go: the URL parsed once
    (:func:`~aprfast.remote._url.parse_http_url`), the headers sent there (the caller's,
    plus Basic auth from the URL's userinfo unless they name an ``Authorization``), and
    kept-alive connections to its server."""

    def __init__(self, url: str, headers=None, timeout=30.0, *, parsed=None):
        parsed = parsed if parsed is not None else parse_http_url(url)
        self.url, self.parsed, self.target = parsed.url, parsed, parsed.target
        self.shown = redact_url(parsed.url)
        self.headers = dict(headers or {})
        if parsed.authorization and not any(str(k).lower() == "authorization" for k in self.headers):
            self.headers["Authorization"] = parsed.authorization
        self.endpoint = Endpoint(parsed.scheme, parsed.host, parsed.port, timeout)

    def redirect(self, location: str) -> "Target":
        """The Target a redirect's ``Location`` names: an http(s) URL (else
        RemoteURLError), with this one's headers on the same origin (scheme, host and
        port) and none of them on another (only the new URL's own userinfo then)."""
        try:
            url = urllib.parse.urljoin(self.url, location)
        except ValueError:  # "Invalid IPv6 URL"
            url = location
        parsed = parse_http_url(url, redirect_from=self.url)
        same_origin = parsed.origin == self.parsed.origin
        return Target(url, self.headers if same_origin else None, self.endpoint.timeout, parsed=parsed)


class Budget:
    """How long one call may wait for servers: connecting, sending, and reading headers
    and body (never the caller's own time between two reads of a stream).

    - ``timeout``: seconds per socket operation (connect, one read; None: unbounded);
    - ``min_rate``: bytes per second: each request may wait at most
      ``timeout + received / min_rate`` seconds in all (the first ``timeout`` seconds
      free, then on average at least ``min_rate``); None or 0: no such bound.  The
      default, :data:`DEFAULT_MIN_RATE` (16 KiB/s), lets a request for 64 KiB wait
      ``timeout`` + 4 s and one for 1 GiB about 18 hours at worst, while a server sending
      a byte a second fails after about ``timeout`` seconds;
    - ``deadline``: seconds all the requests of the call (redirects and retries included)
      may wait together (None: no bound but the requests' own).

    Past a bound the request fails with RemoteTimeoutError (``path`` names the URL in it,
    redacted by the caller), and is not retried."""

    def __init__(self, timeout=30.0, *, min_rate=DEFAULT_MIN_RATE, deadline=None, path=None):
        self.timeout = None if timeout is None else _positive(timeout, "timeout")
        #: the seconds a request may wait before min_rate counts
        self.grace = 30.0 if self.timeout is None else self.timeout
        self.min_rate = None if min_rate is None or min_rate == 0 else _positive(min_rate, "min_rate")
        self.deadline = None if deadline is None else _positive(deadline, "deadline")
        self.path = path
        self.spent = 0.0
        self._lock = threading.Lock()

    def request(self) -> "_Clock":
        """The clock of one more request of this call."""
        return _Clock(self)


def _positive(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
        raise ValueError(f"storage_options {name!r} must be a positive number, not {value!r}")
    return float(value)


class _Clock:
    """The time one request waited and the bytes it received, against its Budget."""

    __slots__ = ("budget", "waited", "got")

    def __init__(self, budget: Budget):
        self.budget, self.waited, self.got = budget, 0.0, 0

    def left(self) -> float:
        b = self.budget
        left = math.inf
        if b.min_rate is not None:
            left = b.grace + self.got / b.min_rate - self.waited
        if b.deadline is not None:
            left = min(left, b.deadline - b.spent)
        return left

    def spent_all(self) -> bool:
        return self.left() <= _SLACK

    def op_timeout(self):
        """The timeout of the next socket operation (RemoteTimeoutError when none is left)."""
        left = self.left()
        if left <= _SLACK:
            raise self.expired()
        timeout = self.budget.timeout
        if left == math.inf:
            return timeout
        return left if timeout is None else min(timeout, left)

    def spend(self, seconds: float, received: int = 0) -> None:
        self.waited += seconds
        self.got += received
        b = self.budget
        if b.deadline is not None:
            with b._lock:
                b.spent += seconds

    def expired(self) -> RemoteTimeoutError:
        b = self.budget
        if b.deadline is not None and b.deadline - b.spent <= _SLACK:
            message = f"no complete answer within the deadline of {b.deadline:g} s (storage_options 'deadline')"
        else:
            message = (f"the server sent {self.got} bytes in {self.waited:.1f} s, slower than {b.min_rate:g} "
                       f"bytes/s after the first {b.grace:g} s (storage_options 'min_rate', 'timeout')")
        return RemoteTimeoutError(message, path=b.path)


class _TimedReader:
    """The buffered reader of one response (headers and body), every socket read of it
    bounded by the request's :class:`_Clock`: each read waits at most ``timeout`` and
    at most what the clock has left.  http.client's own reader loops until a buffer is
    full (a server sending a byte a second would hold it for hours); this one reads one
    socket read at a time."""

    def __init__(self, fp, sock, clock: _Clock):
        self._fp, self._sock, self._clock = fp, sock, clock
        self._armed = -1.0  # the socket's timeout as last set here

    def _timed(self, call, arg, count: bool = True):
        clock = self._clock
        timeout = clock.op_timeout()
        if timeout != self._armed:  # on a fast link it stays ``timeout``: set once
            self._sock.settimeout(timeout)
            self._armed = timeout
        start = time.monotonic()
        try:
            result = call(arg)
        except socket.timeout:  # TimeoutError from Python 3.10
            clock.spend(time.monotonic() - start)
            if clock.spent_all():
                raise clock.expired() from None
            raise
        except BaseException:
            clock.spend(time.monotonic() - start)
            raise
        received = (result if isinstance(result, int) else len(result)) if count else 0
        clock.spend(time.monotonic() - start, received)
        return result

    def readinto(self, b) -> int:
        view = memoryview(b).cast("B")
        got = 0
        while got < view.nbytes:
            n = self._timed(self._fp.readinto1, view[got:])
            if not n:
                break
            got += n
        return got

    def readinto1(self, b) -> int:
        return self._timed(self._fp.readinto1, b)

    def read(self, n=-1) -> bytes:
        if n is None or n < 0:
            chunks = []
            while True:
                chunk = self._timed(self._fp.read1, 1 << 16)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
        out = bytearray(n)
        return bytes(out[:self.readinto(out)])

    def read1(self, n=-1) -> bytes:
        return self._timed(self._fp.read1, n)

    def peek(self, n=0) -> bytes:
        return self._timed(self._fp.peek, n, count=False)

    def readline(self, limit=-1) -> bytes:
        line = bytearray()
        while limit is None or limit < 0 or len(line) < limit:
            ahead = self._timed(self._fp.peek, 1, count=False)  # at most one socket read
            if not ahead:
                break
            want = len(ahead) if limit is None or limit < 0 else min(len(ahead), limit - len(line))
            end = ahead.find(b"\n", 0, want)
            if end >= 0:
                want = end + 1
            line += self._fp.read(want)  # already buffered: no socket read
            if end >= 0:
                break
        self._clock.spend(0.0, len(line))
        return bytes(line)

    def close(self) -> None:
        self._fp.close()

    def flush(self) -> None:
        self._fp.flush()

    def fileno(self) -> int:
        return self._fp.fileno()

    def readable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return self._fp.closed


class _TimedResponse(http.client.HTTPResponse):
    """An HTTPResponse reading its status line, headers and body through a _TimedReader."""

    def __init__(self, sock, *args, clock: _Clock, owner=None, **kwargs):
        super().__init__(sock, *args, **kwargs)
        self.fp = _TimedReader(self.fp, sock, clock)
        self._interim = 0
        if owner is not None:
            owner._last_response = self

    def _read_status(self):
        version, status, reason = super()._read_status()
        if status == http.client.CONTINUE:  # begin() reads the next status line, and the next...
            self._interim += 1
            if self._interim > MAX_INTERIM:
                raise http.client.HTTPException(f"more than {MAX_INTERIM} interim answers ({status})")
        return version, status, reason


class _ClosesItsResponse:
    """http.client's connection forgets its response once that response will close the
    connection (no Content-Length, ``Connection: close``), or when reading its head
    failed, while the response's file still holds the socket: closing the connection
    then left the descriptor open until garbage collection (a ResourceWarning).  This
    ``close()`` closes the last response too (except when http.client itself closes the
    connection while handing that response out: its body is still to be read)."""

    _last_response = None
    _handing_out = False

    def getresponse(self):
        self._handing_out = True
        try:
            return super().getresponse()
        finally:
            self._handing_out = False

    def close(self):
        response = None
        if not self._handing_out:
            response, self._last_response = self._last_response, None
        super().close()
        if response is not None:
            response.close()


class _HTTPConnection(_ClosesItsResponse, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_ClosesItsResponse, http.client.HTTPSConnection):
    pass


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
            return _HTTPSConnection(self.host, self.port, timeout=self.timeout,
                                    context=ssl.create_default_context(cafile=self.cafile))
        return _HTTPConnection(self.host, self.port, timeout=self.timeout)

    def send(self, target: str, headers: dict, clock: "_Clock | None" = None):
        """GET ``target``; (connection, _Response) with the body unread, whatever the
        status.  A connection failure is a TransientError; running out of ``clock``'s
        time (a :class:`Budget`'s request; None: this endpoint's timeout and the default
        min_rate) a RemoteTimeoutError, raised then or while the body is read."""
        if clock is None:
            clock = Budget(self.timeout).request()
        reused = not self.idle.empty()
        conn = self.connect()
        try:
            return conn, self._exchange(conn, target, headers, clock)
        except RemoteTimeoutError:
            conn.close()
            raise
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            if not reused:
                raise TransientError(f"{type(exc).__name__}: {exc}") from None
        # A kept-alive connection the server closed while idle: so are the others that
        # waited as long.  Drop them and try once on a new connection.
        self.drop_idle()
        conn = self.connect(reuse=False)
        try:
            return conn, self._exchange(conn, target, headers, clock)
        except RemoteTimeoutError:
            conn.close()
            raise
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise TransientError(f"{type(exc).__name__}: {exc}") from None

    @staticmethod
    def _exchange(conn, target: str, headers: dict, clock: "_Clock") -> _Response:
        timeout = clock.op_timeout()
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        conn.response_class = functools.partial(_TimedResponse, clock=clock, owner=conn)
        start = time.monotonic()
        try:
            conn.request("GET", target, headers=headers)
        except socket.timeout:  # TimeoutError from Python 3.10
            clock.spend(time.monotonic() - start)
            if clock.spent_all():
                raise clock.expired() from None
            raise
        clock.spend(time.monotonic() - start)
        return _Response(conn.getresponse())

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
