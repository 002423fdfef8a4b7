"""One hostile HTTP/1.1 server on 127.0.0.1 (raw sockets, one thread per connection)
with named behaviours: everything a server can do to a client that reads models from
it (issue 25, item 2; the review 2026-11's server, kept as a regression tool).

Every request's path names the behaviour that answers it and a case token that keeps
the per-case request counters apart::

    /<behaviour>/<case>/m.apr[?query]

(``HostileServer.url(behaviour, case)``; S3 clients reach the same handlers as bucket
``<behaviour>``, key ``<case>/m.apr``).  The server owns a second listening socket,
``other``: another origin (another port), which answers every request honestly; the
``redirect_other_origin`` behaviour sends the client there, and the test checks that
no credential followed (``other_requests``).

Bounded: every answer stops after ``response_seconds`` or ``max_body`` bytes, when the
client goes, or when the server closes; the server closes itself ``lifetime`` seconds
after it started.  Nothing here allocates more than a few MiB (endless bodies are sent
from one reused block).

``APRFAST_HOSTILE_LONG=1`` (see docs/robustness.md) selects the long mode: a 1 byte/s
drip, a 1 GiB gzip bomb, 1 GiB endless bodies and bigger payloads.

Run it on its own to point another client at it::

    python tests/hostile_http.py            # lists the behaviours and serves until ^C
"""

from __future__ import annotations

import os
import re
import socket
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field

__all__ = ["HostileServer", "BEHAVIOURS", "Behaviour", "LONG", "DRIP_SECONDS", "SECRETS", "ENTRY_POINTS"]

#: The long mode (docs/robustness.md): slower drips, bigger bombs and bodies.
LONG = os.environ.get("APRFAST_HOSTILE_LONG", "").strip() not in ("", "0")
#: Seconds between two bytes of a dripping answer (the review's 1 byte/s in the long mode).
DRIP_SECONDS = 1.0 if LONG else 0.05
#: The secrets every test URL carries (userinfo password, query values, a header's value).
SECRETS = ("SECRETPASSWORD", "SECRETSIGNATURE", "SECRETTOKEN", "SECRETHEADER", "SECRETCOOKIE")
#: The client entry points the tests drive (test_hostile_http.py).
ENTRY_POINTS = ("open", "load_file", "stream", "convert", "download")
#: The ones that read with ranged GETs (open_url) and the ones that read forward (open_stream).
RANGED = ("open", "load_file", "convert")
FORWARD = ("stream", "download")

_BLOCK = b"\0" * (64 << 10)


@dataclass
class Behaviour:
    """One way of answering.  ``fails``: the entry points that must end in a typed
    error (the others may also succeed, with the right data); ``big``: a body-size case,
    whose memory is measured in a child; ``entity``: what a download that succeeds may
    store, from the payload (default: the payload itself)."""

    name: str
    answer: object
    doc: str
    fails: tuple = ENTRY_POINTS
    big: bool = False
    entity: object = None
    tags: tuple = field(default_factory=tuple)


BEHAVIOURS: dict[str, Behaviour] = {}


def behaviour(doc: str, *, fails=ENTRY_POINTS, big=False, entity=None):
    def register(fn):
        name = fn.__name__.lstrip("_")
        BEHAVIOURS[name] = Behaviour(name, fn, doc, tuple(fails), big, entity)
        return fn
    return register


class Request:
    """One parsed request and the means to answer it."""

    def __init__(self, server, conn, text: str, count: int, behaviour: str, case: str):
        self.server, self.conn, self.text, self.count = server, conn, text, count
        self.behaviour, self.case = behaviour, case
        self.payload = server.payload
        self.started = time.monotonic()
        self.sent = 0
        line = text.split("\r\n", 1)[0].split(" ")
        self.method, self.target = line[0], line[1] if len(line) > 1 else "/"
        self.ranges = _parse_ranges(self.header("Range"), len(self.payload))
        self._head, self._head_sent = bytearray(), False

    def header(self, name: str):
        m = re.search(rf"(?im)^{re.escape(name)}:[ \t]*(.*?)\r?$", self.text)
        return None if m is None else m.group(1)

    def alive(self) -> bool:
        """False once the answer has run long enough, sent enough, or the server closes."""
        s = self.server
        return (not s.stop.is_set() and time.monotonic() - self.started < s.response_seconds
                and self.sent < s.max_body)

    def send(self, data: bytes) -> bool:
        """Send ``data`` (False when the client went or the answer must stop).  The
        answer to a HEAD request stops after its headers (S3 clients ask HEAD first)."""
        if self.method == "HEAD":
            if self._head_sent:
                return True
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return True
            self._head_sent = True
            data = bytes(self._head[:end + 4])
        view = memoryview(data)
        while view.nbytes:
            if not self.alive():
                return False
            try:
                n = self.conn.send(view[:1 << 16])
            except socket.timeout:  # the client does not read: wait, while alive
                continue
            except OSError:
                return False
            view = view[n:]
            self.sent += n
        return True

    def drip(self, data: bytes, every: float = None) -> bool:
        every = DRIP_SECONDS if every is None else every
        for i in range(len(data)):
            if self.server.stop.wait(every) or not self.send(data[i:i + 1]):
                return False
        return True

    def zeros(self, n: int, first: bytes = b"") -> bool:
        """``first`` then zeros, ``n`` bytes in all (or until the answer must stop)."""
        if not self.send(first[:n]):
            return False
        left = n - min(n, len(first))
        while left > 0:
            if not self.send(_BLOCK[:left]):
                return False
            left -= min(left, len(_BLOCK))
        return True

    def endless(self, first: bytes = b"") -> None:
        """``first`` then zeros until the answer must stop."""
        if not self.send(first):
            return
        while self.send(_BLOCK):
            pass

    # --- honest answers -------------------------------------------------------------
    def honest(self, *, data=None, headers=(), status=None):
        """What a correct static-file server answers: 200 without Range, 206 with one
        range, multipart/byteranges with several, 416 outside the object."""
        data = self.payload if data is None else data
        extra = b"".join(h + b"\r\n" for h in headers)
        etag = b'ETag: "v1"\r\nLast-Modified: Mon, 02 Nov 2026 10:00:00 GMT\r\n'
        if self.ranges is None:
            return self.send(b"HTTP/1.1 %d OK\r\nContent-Length: %d\r\n%s%s\r\n"
                             % (status or 200, len(data), etag, extra) + data)
        if self.ranges == "unsatisfiable":
            return self.send(b"HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */%d\r\n"
                             b"Content-Length: 0\r\n\r\n" % len(data))
        if len(self.ranges) == 1:
            a, b = self.ranges[0]
            return self.send(b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %d-%d/%d\r\n"
                             b"Content-Length: %d\r\n%s%s\r\n" % (a, b, len(data), b - a + 1, etag, extra)
                             + data[a:b + 1])
        body = multipart(self.ranges, data)
        return self.send(b"HTTP/1.1 206 Partial Content\r\nContent-Type: multipart/byteranges; boundary=XYZ\r\n"
                         b"Content-Length: %d\r\n%s%s\r\n" % (len(body), etag, extra) + body)

    def range_answer(self, a, b, total, body, *, length=None, extra=b""):
        length = len(body) if length is None else length
        return self.send(b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %s-%s/%s\r\n"
                         b"Content-Length: %d\r\n%s\r\n" % (str(a).encode(), str(b).encode(), str(total).encode(),
                                                            length, extra) + body)


def multipart(ranges, data, boundary=b"XYZ", total=None) -> bytes:
    total = len(data) if total is None else total
    out = b""
    for a, b in ranges:
        out += (b"--%s\r\nContent-Type: application/octet-stream\r\nContent-Range: bytes %d-%d/%d\r\n\r\n"
                % (boundary, a, b, total) + data[a:b + 1] + b"\r\n")
    return out + b"--%s--\r\n" % boundary


def _parse_ranges(value, size):
    """[(first, last)] of a ``Range`` header, "unsatisfiable", or None (no header)."""
    if value is None:
        return None
    m = re.fullmatch(r"\s*bytes=(.*)", value)
    if not m:
        return None
    out = []
    for spec in m.group(1).split(","):
        a, _, b = spec.strip().partition("-")
        if a == "":
            n = int(b)
            first, last = max(0, size - n), size - 1
        else:
            first, last = int(a), min(int(b) if b else size - 1, size - 1)
        if first > last or first >= size:
            continue
        out.append((first, last))
    return out or "unsatisfiable"


# --- the behaviours ------------------------------------------------------------------------
# Each answers one request; returning "close" closes the connection afterwards.  The
# ranged entry points send "Range: bytes=0-65535,-64" first, then "bytes=a-b"; the
# forward ones (stream, download) a plain GET.

@behaviour("206 whose Content-Range starts one byte after the start asked for (body to match)",
           fails=RANGED)
def _range_start_shifted(r):
    if not isinstance(r.ranges, list):
        return r.honest()
    a, b = r.ranges[0]
    a, b = a + 1, min(b + 1, len(r.payload) - 1)
    return r.range_answer(a, b, len(r.payload), r.payload[a:b + 1])


@behaviour("206 whose Content-Range ends one byte before the end asked for (body to match)", fails=RANGED)
def _range_end_short(r):
    if not isinstance(r.ranges, list):
        return r.honest()
    a, b = r.ranges[0]
    b = max(a, b - 1)
    return r.range_answer(a, b, len(r.payload), r.payload[a:b + 1])


@behaviour("206 whose Content-Range total changes after the first answer", fails=RANGED)
def _range_total_changes(r):
    if not isinstance(r.ranges, list):
        return r.honest()
    a, b = r.ranges[0]
    total = len(r.payload) + (0 if r.count == 0 else 1000)
    return r.range_answer(a, b, total, r.payload[a:b + 1])


@behaviour("206 answers that claim a 1 TiB object (zeros past the payload)", fails=RANGED)
def _range_total_huge(r):
    total = 1 << 40
    spec = re.match(r"\s*bytes=(\d*)-(\d*)", r.header("Range") or "")
    if spec is None:
        return r.honest()
    if spec.group(1) == "":  # a suffix: the end of the huge object
        a, b = total - int(spec.group(2)), total - 1
    else:
        a = int(spec.group(1))
        b = int(spec.group(2)) if spec.group(2) else total - 1
    n = b - a + 1
    head = r.payload[a:b + 1][:n]
    r.send(b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %d-%d/%d\r\nContent-Length: %d\r\n\r\n"
           % (a, b, total, n))
    r.zeros(n, head)
    return "close" if n > len(head) + len(_BLOCK) else None


@behaviour("206 without a Content-Range", fails=RANGED)
def _no_content_range(r):
    if not isinstance(r.ranges, list):
        return r.honest()
    a, b = r.ranges[0]
    return r.send(b"HTTP/1.1 206 Partial Content\r\nContent-Length: %d\r\n\r\n" % (b - a + 1) + r.payload[a:b + 1])


@behaviour("206 with a Content-Range of 40 digits and a negative total", fails=RANGED)
def _content_range_garbage(r):
    if not isinstance(r.ranges, list):
        return r.honest()
    a, b = r.ranges[0]
    return r.range_answer(a, "9" * 40, -1, r.payload[a:b + 1])


@behaviour("Content-Length 10 bytes shorter than the body sent (the rest poisons a kept-alive connection)",
           fails=RANGED + ("stream",), entity=lambda p: p[:-10])
def _length_shorter(r):
    if isinstance(r.ranges, list) and len(r.ranges) == 1:
        a, b = r.ranges[0]
        body = r.payload[a:b + 1]
        return r.range_answer(a, b, len(r.payload), body, length=max(0, len(body) - 10))
    body = r.payload
    return r.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (len(body) - 10) + body)


@behaviour("Content-Length 10 bytes longer than the body, then the connection closes")
def _length_longer(r):
    if isinstance(r.ranges, list) and len(r.ranges) == 1:
        a, b = r.ranges[0]
        body = r.payload[a:b + 1]
        r.range_answer(a, b, len(r.payload), body, length=len(body) + 10)
        return "close"
    r.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (len(r.payload) + 10) + r.payload)
    return "close"


@behaviour("Content-Length of 2^62 on a 200 with an endless body", big=True)
def _length_huge(r):
    r.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (1 << 62))
    r.endless(r.payload)
    return "close"


@behaviour("two Content-Length headers that disagree (the first one says 7)")
def _length_conflict(r):
    answer = []
    send, r.send = r.send, lambda data: answer.append(data) or True
    r.honest()
    r.send = send
    return r.send(b"".join(answer).replace(b"\r\n", b"\r\nContent-Length: 7\r\n", 1))


@behaviour("correct headers, the body cut in the middle and the connection closed, every time")
def _body_cut(r):
    answer = []
    send, r.send = r.send, lambda data: answer.append(data) or True
    r.honest()
    r.send = send
    answer = b"".join(answer)
    head_end = answer.index(b"\r\n\r\n") + 4
    r.send(answer[:head_end + max(1, (len(answer) - head_end) // 2)])
    return "close"


@behaviour("a new ETag in every answer", fails=RANGED)
def _etag_changes(r):
    answer = []
    send, r.send = r.send, lambda data: answer.append(data) or True
    r.honest()
    r.send = send
    return r.send(b"".join(answer).replace(b'ETag: "v1"', b'ETag: "v%d"' % (r.count + 1), 1))


@behaviour("a new Last-Modified in every answer (no ETag)", fails=RANGED)
def _last_modified_changes(r):
    answer = []
    send, r.send = r.send, lambda data: answer.append(data) or True
    r.honest()
    r.send = send
    answer = b"".join(answer).replace(b'ETag: "v1"\r\n', b"", 1)
    return r.send(answer.replace(b"10:00:00", b"10:00:%02d" % (r.count % 60), 1))


@behaviour("multipart/byteranges whose parts use another boundary than the one declared", fails=RANGED)
def _multipart_wrong_boundary(r):
    if not isinstance(r.ranges, list) or len(r.ranges) < 2:
        return r.honest()
    body = multipart(r.ranges, r.payload, boundary=b"OTHER")
    return r.send(b"HTTP/1.1 206 Partial Content\r\nContent-Type: multipart/byteranges; boundary=XYZ\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)


@behaviour("multipart/byteranges with three parts, the second not asked for, the tail at the wrong place",
           fails=RANGED)
def _multipart_wrong_parts(r):
    if not isinstance(r.ranges, list) or len(r.ranges) < 2:
        return r.honest()
    (a, b), (c, d) = r.ranges[0], r.ranges[1]
    body = multipart([(a, b), (5, 9), (c - 100, d - 100)], r.payload)
    return r.send(b"HTTP/1.1 206 Partial Content\r\nContent-Type: multipart/byteranges; boundary=XYZ\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)


@behaviour("multipart/byteranges of undeclared length whose one part claims 1 TiB", fails=RANGED, big=True)
def _multipart_huge_part(r):
    if not isinstance(r.ranges, list) or len(r.ranges) < 2:
        return r.honest()
    r.send(b"HTTP/1.1 206 Partial Content\r\nContent-Type: multipart/byteranges; boundary=XYZ\r\n"
           b"Connection: close\r\n\r\n--XYZ\r\nContent-Range: bytes 0-%d/%d\r\n\r\n" % ((1 << 40) - 1, 1 << 40))
    r.endless(r.payload)
    return "close"


@behaviour("200 with the whole body (declared 1 TiB, endless) to every request, ranged or not", big=True)
def _ignore_range_huge(r):
    r.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (1 << 40))
    r.endless(r.payload)
    return "close"


@behaviour("200 without Content-Length: the payload, then zeros without end", big=True)
def _endless_no_length(r):
    r.send(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
    r.endless(r.payload)
    return "close"


@behaviour("chunked transfer coding with a chunk size of 2^72", big=True)
def _chunked_huge_size(r):
    r.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n")
    r.endless(r.payload)
    return "close"


@behaviour("chunked transfer coding with a negative chunk size")
def _chunked_negative_size(r):
    r.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n" + r.payload[:16]
           + b"\r\n-10\r\n" + r.payload[16:4096] + b"\r\n0\r\n\r\n")
    return "close"


def _gzip_bomb() -> bytes:
    size = (1 << 30) if LONG else (64 << 20)
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b"\0" * (1 << 20)
    return b"".join([c.compress(block) for _ in range(size >> 20)] + [c.flush()])


_BOMB: list = []
_BOMB_LOCK = threading.Lock()


def _bomb() -> bytes:
    with _BOMB_LOCK:
        if not _BOMB:
            _BOMB.append(_gzip_bomb())
        return _BOMB[0]


@behaviour("Content-Encoding: gzip, a small body that inflates to 64 MiB of zeros (1 GiB long)",
           fails=("open", "load_file", "stream", "convert"), big=True, entity=lambda p: _bomb())
def _gzip_bomb_answer(r):
    bomb = _bomb()
    return r.send(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Type: application/octet-stream\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(bomb) + bomb)


@behaviour("a redirect to itself, forever")
def _redirect_loop(r):
    return r.send(b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % r.target.encode())


@behaviour("a redirect to another origin (another port), which answers honestly: no credential may follow",
           fails=())
def _redirect_other_origin(r):
    location = b"http://127.0.0.1:%d/other/%s/m.apr" % (r.server.other_port, r.case.encode())
    return r.send(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % location)


@behaviour("a redirect to file:///etc/passwd")
def _redirect_file(r):
    return r.send(b"HTTP/1.1 302 Found\r\nLocation: file:///etc/passwd\r\nContent-Length: 0\r\n\r\n")


@behaviour("a redirect to ftp:// with credentials and a token in the Location")
def _redirect_ftp(r):
    return r.send(b"HTTP/1.1 301 Moved\r\nLocation: ftp://alice:SECRETPASSWORD@127.0.0.1:1/m.apr?token=SECRETTOKEN"
                  b"\r\nContent-Length: 0\r\n\r\n")


@behaviour("a redirect to a URL that does not parse (an unclosed IPv6 bracket quoting the query)")
def _redirect_bad_url(r):
    return r.send(b"HTTP/1.1 308 Permanent Redirect\r\nLocation: http://[" + r.target.partition("?")[2].encode()
                  + b"/x\r\nContent-Length: 0\r\n\r\n")


@behaviour("204 No Content to every request")
def _status_204(r):
    return r.send(b"HTTP/1.1 204 No Content\r\n\r\n")


@behaviour("a 302 without a Location")
def _redirect_no_location(r):
    return r.send(b"HTTP/1.1 302 Found\r\nContent-Length: 0\r\n\r\n")


@behaviour("10,000 response headers (http.client accepts 100)")
def _many_headers(r):
    r.send(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: a\r\n" % i for i in range(10000)) + b"\r\n")
    return "close"


@behaviour("one 1 MiB header line", big=True)
def _long_header_line(r):
    r.send(b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * (1 << 20) + b"\r\n\r\n")
    return "close"


@behaviour("status line and headers dripped a byte at a time")
def _drip_headers(r):
    r.drip(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Padding: %s\r\n\r\n" % (len(r.payload), b"p" * 4096))
    return "close"


@behaviour("correct headers, then the body dripped a byte at a time")
def _drip_body(r):
    answer = []
    send, r.send = r.send, lambda data: answer.append(data) or True
    r.honest()
    r.send = send
    answer = b"".join(answer)
    head_end = answer.index(b"\r\n\r\n") + 4
    r.send(answer[:head_end])
    r.drip(answer[head_end:])
    return "close"


@behaviour("'100 Continue' interim answers without end, never a final one")
def _status_100_forever(r):
    while r.send(b"HTTP/1.1 100 Continue\r\n\r\n" * 64):
        pass
    return "close"


@behaviour("a status the client does not know (299) with the payload")
def _status_odd(r):
    return r.send(b"HTTP/1.1 299 Odd\r\nContent-Length: %d\r\n\r\n" % len(r.payload) + r.payload)


@behaviour("416 to every request, its Content-Range claiming a 1 MB object")
def _status_416(r):
    return r.send(b"HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */1000000\r\nContent-Length: 0\r\n\r\n")


@behaviour("503 to every request")
def _status_5xx_forever(r):
    return r.send(b"HTTP/1.1 503 Slow Down\r\nRetry-After: 3600\r\nContent-Length: 5\r\n\r\nbusy!")


@behaviour("a status line that is not one ('HTTP/1.1 abc OK')")
def _status_line_garbage(r):
    r.send(b"HTTP/1.1 abc OK\r\nContent-Length: 0\r\n\r\n")
    return "close"


@behaviour("the connection reset (RST) as soon as the request arrived")
def _connection_reset(r):
    r.conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return "close"


@behaviour("bytes that are no HTTP (a TLS ServerHello, then noise), then close")
def _garbage(r):
    r.send(b"\x16\x03\x03\x00\x31\x02\x00\x00\x2d\x03\x03" + bytes(range(256)) * 16)
    return "close"


@behaviour("the payload without any status line or headers (HTTP/0.9)")
def _http09(r):
    r.send(r.payload)
    return "close"


@behaviour("403 whose reason phrase, headers and body quote the request line and its credentials")
def _reflect_secrets(r):
    auth = (r.header("Authorization") or "").encode("latin-1")
    line = r.text.split("\r\n", 1)[0].encode("latin-1")
    body = r.text.encode("latin-1")
    return r.send(b"HTTP/1.1 403 %s %s\r\nX-Echo: %s\r\nContent-Length: %d\r\n\r\n" % (line, auth, line, len(body))
                  + body)


def _echo(r) -> bytes:
    """What a server can tell of the client's secrets: the query, the decoded Basic
    credentials, the other headers' values."""
    import base64

    auth = r.header("Authorization") or ""
    try:
        auth = base64.b64decode(auth.split(" ", 1)[1]).decode("latin-1") if auth.startswith("Basic ") else auth
    except (ValueError, IndexError):
        pass
    query = r.target.partition("?")[2]
    return " ".join([query, auth, r.header("X-Api-Key") or "", r.header("Cookie") or ""]).encode("latin-1")


@behaviour("a status line that is no status line, quoting the client's secrets")
def _reflect_in_status_line(r):
    r.send(b"HTTP/1.1 abc " + _echo(r) + b"\r\nContent-Length: 0\r\n\r\n")
    return "close"


@behaviour("206 whose Content-Range quotes the client's secrets", fails=RANGED)
def _reflect_in_content_range(r):
    if not isinstance(r.ranges, list):
        return r.honest()
    a, b = r.ranges[0]
    return r.send(b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes " + _echo(r)
                  + b"\r\nContent-Length: %d\r\n\r\n" % (b - a + 1) + r.payload[a:b + 1])


@behaviour("honest answers whose ETag and Last-Modified become the client's secrets after the first",
           fails=RANGED)
def _reflect_in_etag(r):
    answer = []
    send, r.send = r.send, lambda data: answer.append(data) or True
    r.honest()
    r.send = send
    answer = b"".join(answer)
    if r.count:
        answer = answer.replace(b'"v1"', b'"' + _echo(r) + b'"', 1).replace(b"Mon, 02", _echo(r), 1)
    return r.send(answer)


@behaviour("honest answers, each followed by junk that the next request on the kept-alive connection reads",
           fails=())
def _keepalive_poison(r):
    r.honest()
    r.send(b"HTTP/1.1 500 junk\r\nContent-Length: 3\r\n\r\nxyz" + b"\x00garbage\r\n" * 4)


@behaviour("an honest server (the control: every entry point must succeed)", fails=())
def _honest(r):
    r.honest()


class HostileServer:
    """The server: ``url(behaviour, case)`` names a behaviour's object; every request's
    text is kept in ``requests`` (port, text), the other origin's in ``other_requests``."""

    def __init__(self, payload: bytes, *, response_seconds: float = None, max_body: int = None,
                 lifetime: float = 1800.0):
        self.payload = payload
        self.response_seconds = response_seconds if response_seconds is not None else (60.0 if LONG else 6.0)
        self.max_body = max_body if max_body is not None else ((2 << 30) if LONG else (256 << 20))
        self.stop = threading.Event()
        self.requests: list[str] = []
        self.other_requests: list[str] = []
        self._counts: dict = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._born = time.monotonic()
        self.lifetime = lifetime
        if not _BOMB:  # made once per process, in the background (about 0.3 s; 5 s long)
            threading.Thread(target=_bomb, daemon=True, name="hostile-bomb").start()
        self._listen, self.port = self._socket()
        self._other, self.other_port = self._socket()
        for sock, other in ((self._listen, False), (self._other, True)):
            thread = threading.Thread(target=self._accept, args=(sock, other), daemon=True,
                                      name=f"hostile-accept-{'other' if other else 'main'}")
            thread.start()
            self._threads.append(thread)

    @staticmethod
    def _socket():
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        sock.settimeout(0.1)
        return sock, sock.getsockname()[1]

    def url(self, behaviour: str, case: str = "c", *, secrets: bool = True, name: str = "m.apr") -> str:
        """The URL of ``behaviour``'s object; with ``secrets``, a userinfo password and a
        query holding a signature and a token, which no message may show."""
        userinfo = "alice:SECRETPASSWORD@" if secrets else ""
        query = "?X-Amz-Signature=SECRETSIGNATURE&token=SECRETTOKEN" if secrets else ""
        return f"http://{userinfo}127.0.0.1:{self.port}/{behaviour}/{case}/{name}{query}"

    def requests_for(self, behaviour: str, case: str) -> list:
        prefix = f"/{behaviour}/{case}/"
        with self._lock:
            return [t for t in self.requests if t.split(" ", 2)[1].startswith(prefix)]

    def other_requests_for(self, case: str) -> list:
        prefix = f"/other/{case}/"
        with self._lock:
            return [t for t in self.other_requests if t.split(" ", 2)[1].startswith(prefix)]

    # --- serving --------------------------------------------------------------------------
    def _expired(self) -> bool:
        return self.stop.is_set() or time.monotonic() - self._born > self.lifetime

    def _accept(self, sock, other: bool) -> None:
        try:
            while not self._expired():
                try:
                    conn, _ = sock.accept()
                except OSError:  # socket.timeout included
                    continue
                thread = threading.Thread(target=self._serve, args=(conn, other), daemon=True, name="hostile-conn")
                thread.start()
                with self._lock:
                    self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        finally:
            sock.close()
            self.stop.set()

    def _serve(self, conn: socket.socket, other: bool) -> None:
        conn.settimeout(0.1)
        idle_since = time.monotonic()
        try:
            while not self._expired():
                request = b""
                while b"\r\n\r\n" not in request:
                    if self._expired() or time.monotonic() - idle_since > 30 or len(request) > (64 << 10):
                        return
                    try:
                        chunk = conn.recv(65536)
                    except socket.timeout:  # TimeoutError from Python 3.10
                        continue
                    if not chunk:
                        return
                    request += chunk
                text = request.decode("latin-1")
                target = text.split(" ", 2)[1] if text.count(" ") >= 2 else "/"
                parts = target.split("?", 1)[0].lstrip("/").split("/")
                name, case = (parts + ["", ""])[:2]
                with self._lock:
                    (self.other_requests if other else self.requests).append(text)
                    key = ("other" if other else name, case)
                    count = self._counts.get(key, 0)
                    self._counts[key] = count + 1
                r = Request(self, conn, text, count, name, case)
                found = BEHAVIOURS.get(name)
                if other or found is None:
                    result = r.honest() if (other or name == "ok") else r.send(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                else:
                    result = found.answer(r)
                if result == "close" or result is False:
                    return
                idle_since = time.monotonic()
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def payload() -> bytes:
    """The object every behaviour serves: an APR2 file whose tensor ``w`` lies past the
    first 64 KiB, so reading it takes a second ranged request."""
    import numpy as np

    import aprfast

    n = (1 << 22) if LONG else (1 << 16)
    return aprfast.save({"pad": np.zeros(n, np.float32), "w": np.arange(1 << 14, dtype=np.float32),
                         "b": np.ones(3, np.float16)})


if __name__ == "__main__":  # pragma: no cover - a tool
    with HostileServer(payload(), lifetime=24 * 3600) as server:
        for name, b in BEHAVIOURS.items():
            print(f"{server.url(name, secrets=False):70s} {b.doc}")
        try:
            while not server.stop.wait(1):
                pass
        except KeyboardInterrupt:
            pass
