"""``s3://`` objects through s3fs, as ranged ``GetObject`` requests and nothing else.

fsspec's file objects ask for the object's info (a ``HeadObject``) before their first
read, and the generic reader (:mod:`.fsspec`) then fetches the first bytes: two
requests to open.  Here the first request is the read itself: ``GetObject`` with
``Range: bytes=0-65535`` answers with the first :data:`HEAD_BYTES`, the object's length
(``Content-Range: bytes 0-65535/<length>``) and its ETag, so

- opening (and ``inspect`` of a model whose prefix fits 64 KiB) costs 1 request;
- a tensor costs 1 ranged GET (several in parallel above ``PART_BYTES``), so a fresh
  handle plus one tensor costs 2;
- the footer (4 or 16 bytes) is fetched only when its CRC is needed (``verify``,
  ``load_file``): one more request then.

Every later GET carries ``If-Match: <ETag of the first answer>``: S3 refuses it (412)
once the object was replaced, which is a :class:`RemoteChangedError`, never a mix of
two versions; the ETag and the length in each ``Content-Range`` are checked as well.
Each answer's ``Content-Range`` and ``Content-Length`` must be exactly the bytes asked
for, checked before its body is read.

Two ways to send a GET:

- the first one (open) goes through s3fs's own client (``S3FileSystem._call_s3``: its
  credentials, endpoint, region redirects, ``requester_pays``, and its retries, on top
  of botocore's, of 5xx answers, throttling and connection errors); a failure both
  gave up on is an :class:`AprIOError`;
- the later ones (tensors, ``load_file``'s parts, the footer) go, when they can, to a
  *presigned* URL of the object (:class:`_Direct`): botocore signs it locally (no
  request), signing only the ``Host`` header, so ``Range`` and ``If-Match`` are added
  unsigned, and :mod:`.http`'s connections send it, from parallel threads, reading each
  body straight into the final buffer.  Through s3fs, each body arrived as aiohttp
  chunks joined into one bytes object, then was copied into the buffer, all on s3fs's
  one event-loop thread: ``load_file`` of 512 MiB from gofakes3 (a Go S3 server) on
  loopback took 0.70 s that way, 0.19 s this way (issue 15).  The URL is
  signed again every :data:`PRESIGN_REUSE` seconds (credentials that refresh, URLs
  that expire).  What a presigned URL cannot express goes through s3fs as before:
  ``s3_additional_kwargs`` (SSE-C keys, ...), ``requester_pays``, a proxy, a client
  certificate, TLS checks turned off; so does the rest of a handle whose presigned GET
  was refused (3xx, 400, 401, 403), s3fs's client then giving the answer.

A body cut short, on either way, is retried here with backoff from the byte where it
stopped.  Neither error messages nor exceptions ever carry the presigned URL's query
(its signature, key id and session token): they name the ``s3://`` URL.
"""

from __future__ import annotations

import contextvars
import re
import threading
import time
import urllib.parse

from ..errors import AprError, AprFileNotFoundError, AprIOError, AprPermissionError
from ._ranged import HEAD_BYTES, RangedSource, RemoteChangedError, RemoteTimeoutError, TransientError
from ._url import redact_url, redact_urls

__all__ = ["S3Source", "is_s3fs", "PRESIGN_EXPIRES", "PRESIGN_REUSE"]

_CONTENT_RANGE = re.compile(r"bytes (\d{1,20})-(\d{1,20})/(\d{1,20})")
#: A presigned URL is valid this long (seconds)...
PRESIGN_EXPIRES = 3600
#: ...and used for at most this long, then signed again (with the credentials of that
#: moment: temporary ones expire, and a URL signed with them dies with them).
PRESIGN_REUSE = 300
#: Set while _Direct presigns (in its own asyncio task only): botocore's default of
#: Signature Version 2 for presigned S3 URLs (in the older regions, where it is still
#: accepted) is then Version 4, which every region accepts; AWS deprecated Version 2.
_PRESIGNING_V4 = contextvars.ContextVar("aprfast_presigning_v4", default=False)
#: The query parameters of a presigned URL that are secrets or name the key.
_SECRET_PARAMS = re.compile(r"(?i)(X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|Signature|Credential|"
                            r"AWSAccessKeyId|x-amz-security-token)=[^&\s'\",]*")


def is_s3fs(fs) -> bool:
    """True for an s3fs ``S3FileSystem`` (checked without importing s3fs)."""
    return any(cls.__module__.split(".")[0] == "s3fs" and cls.__name__ == "S3FileSystem"
               for cls in type(fs).__mro__)


async def _get(fs, kwargs: dict, check):
    """One GetObject; ``check(response)`` looks at its status and headers before the
    body is read (and raises to refuse it), then the body is read whole."""
    resp = await fs._call_s3("get_object", **kwargs)
    body = resp["Body"]
    try:
        check(resp)
        try:
            return await body.read()
        except Exception as exc:  # noqa: BLE001 - aiohttp / botocore errors of a body cut short
            raise _BodyError(f"{type(exc).__name__}: {redact_urls(exc)}") from None
    finally:
        body.close()


def _error_code(exc: BaseException):
    """The S3 error code behind an s3fs exception (s3fs raises its translation of the
    botocore ClientError ``from`` it), or None."""
    seen = 0
    while exc is not None and seen < 4:
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            return (response.get("Error") or {}).get("Code"), response.get("Error") or {}
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None, {}


class S3Source(RangedSource):
    """One S3 object of an s3fs filesystem (``fs``, ``path`` as fsspec splits the URL)."""

    def __init__(self, url: str, *, fs, path: str, connections: int = 8, deadline=None):
        from fsspec.asyn import sync

        from .http import Budget

        self.url, self.fs, self._sync = url, fs, sync
        #: seconds each GET may take, retries included (None: botocore's read_timeout per
        #: read only, so a server dripping bytes holds a GET as long as it drips)
        self.deadline = Budget(deadline=deadline).deadline  # checked as the HTTP reader checks it
        self.shown = redact_url(url)  # what messages show: no userinfo, no query
        bucket, key, version_id = fs.split_path(path)
        if not key:
            raise AprIOError("an s3:// URL names bucket/key; this one names a bucket", path=self.shown)
        self._kwargs = {"Bucket": bucket, "Key": key}
        if version_id:
            self._kwargs["VersionId"] = version_id
        self.path = self.shown  # for the errors raised before RangedSource.__init__ sets it
        self.version = None  # (ETag, LastModified) of the first answer
        size, head = self._open()
        super().__init__(size, head, path=self.shown, connections=connections)
        #: the presigned-URL way of the later GETs, or None (then ``direct_off`` says why)
        self.direct, self.direct_off = None, _direct_refusal(fs, self.version)
        if self.direct_off is None:
            self.direct = _Direct(self)

    # --- opening: one GET for the first bytes, the length and the ETag ------------------
    def _scrubbed(self, call, *args):
        """``call(*args)``, any error it raises with the signing secrets a server may
        quote back (an ``Authorization`` header's credential and signature, a presigned
        query's, in a Content-Range or an ETag) removed from its message."""
        try:
            return call(*args)
        except (AprError, TransientError) as exc:
            text = exc.message if isinstance(exc, AprError) else str(exc)
            clean = _redact(text)
            if clean == text:
                raise
            error = type(exc)(clean, path=exc.path) if isinstance(exc, AprError) else TransientError(clean)
        raise error  # out here: chained to nothing that shows a secret

    def _open(self):
        return self._scrubbed(self._open_unscrubbed)

    def _open_unscrubbed(self):
        import time

        attempt = 0
        while True:
            try:
                return self._first()
            except TransientError as exc:
                attempt += 1
                if attempt > self.retries:
                    raise AprIOError(f"cannot open after {attempt} attempts: {exc}", path=self.shown) from None
                time.sleep(self.backoff * (2 ** (attempt - 1)))

    def _first(self):
        found = {}

        def check(resp):
            found["version"] = (resp.get("ETag"), str(resp.get("LastModified")))
            length = resp.get("ContentLength")
            status = (resp.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            content_range = resp.get("ContentRange")
            if content_range is None or status == 200:
                # Range ignored: usable only when the whole object is small
                if not isinstance(length, int) or length > HEAD_BYTES:
                    raise AprIOError(f"the server ignores Range requests (it answered {status} with {length} "
                                     "bytes); random access to a large object needs ranged GETs: download it "
                                     "first", path=self.shown)
                found["size"], found["n"] = length, length
                return
            m = _CONTENT_RANGE.fullmatch(str(content_range).strip())
            if not m:
                raise AprIOError(f"an answer with Content-Range {content_range!r}", path=self.shown)
            first, last, total = (int(g) for g in m.groups())
            if first != 0 or last != min(total, HEAD_BYTES) - 1 or length != last + 1:
                raise AprIOError(f"asked for bytes 0-{HEAD_BYTES - 1}, the server sent {first}-{last}/{total} "
                                 f"in {length} bytes", path=self.shown)
            found["size"], found["n"] = total, length

        try:
            data = self._call(dict(self._kwargs, Range=f"bytes=0-{HEAD_BYTES - 1}"), check)
        except _Unsatisfiable as exc:
            if exc.size == 0:  # an empty object has no byte 0; the layouts refuse it by name
                self.version = None
                return 0, b""
            raise AprIOError(f"the server refused the range of the first {HEAD_BYTES} bytes (416)",
                             path=self.shown) from None
        if len(data) != found["n"]:
            raise TransientError(f"the body ended after {len(data)} of {found['n']} bytes")
        self.version = found["version"]
        return found["size"], data

    # --- later reads --------------------------------------------------------------------
    def _fetch_into(self, offset: int, out: memoryview) -> int:
        return self._scrubbed(self._fetch_one, offset, out)

    def _fetch_one(self, offset: int, out: memoryview) -> int:
        direct = self.direct
        if direct is not None:
            try:
                return direct.fetch_into(offset, out)
            except _Refused as exc:  # from here on s3fs's client, which gives the real answer
                self.direct, self.direct_off = None, str(exc)
        return self._fetch_through_s3fs(offset, out)

    def _fetch_through_s3fs(self, offset: int, out: memoryview) -> int:
        n = out.nbytes
        kwargs = dict(self._kwargs, Range=f"bytes={offset}-{offset + n - 1}")
        etag, modified = self.version or (None, None)
        if etag:
            kwargs["IfMatch"] = etag  # S3 answers 412 once the object was replaced

        def check(resp):
            new_etag, new_modified = resp.get("ETag"), str(resp.get("LastModified"))
            if (etag and new_etag != etag) or (not etag and modified and new_modified != modified):
                raise RemoteChangedError(f"the object changed since it was opened (ETag {etag!r} -> {new_etag!r}); "
                                         "open it again", path=self.shown)
            m = _CONTENT_RANGE.fullmatch(str(resp.get("ContentRange") or "").strip())
            if not m:
                raise AprIOError(f"asked for {n} bytes at offset {offset}, the server answered without a "
                                 f"Content-Range ({resp.get('ContentRange')!r})", path=self.shown)
            first, last, total = (int(g) for g in m.groups())
            if total != self.size:
                raise RemoteChangedError(f"the object is now {total} bytes long; it was {self.size} when opened",
                                         path=self.shown)
            if first != offset or last != offset + n - 1 or resp.get("ContentLength") != n:
                raise AprIOError(f"asked for bytes {offset}-{offset + n - 1}, the server sent {first}-{last} in "
                                 f"{resp.get('ContentLength')} bytes", path=self.shown)

        try:
            data = self._call(kwargs, check)
        except _Unsatisfiable:
            raise RemoteChangedError(f"the server refused bytes {offset}-{offset + n - 1} of an object of "
                                     f"{self.size} bytes: it changed since it was opened", path=self.shown) from None
        got = min(len(data), n)
        out[:got] = memoryview(data)[:got]
        return got

    def _call(self, kwargs: dict, check) -> bytes:
        """One GetObject through s3fs's client and event loop, its failures typed:
        missing / refused / changed objects are errors, the rest TransientError."""
        try:
            return self._sync(self.fs.loop, _get, self.fs, kwargs, check, timeout=self.deadline)
        except AprError:
            raise
        except _BodyError as exc:  # s3fs does not retry a body read: the retry is here
            raise TransientError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - botocore, aiohttp and s3fs each have their own
            if self.deadline is not None and type(exc).__name__ == "FSTimeoutError":  # fsspec's sync(timeout=)
                raise RemoteTimeoutError(f"no complete answer within the deadline of {self.deadline:g} s "
                                         "(storage_options 'deadline')", path=self.shown) from None
            code, error = _error_code(exc)
            if code == "PreconditionFailed":
                raise RemoteChangedError(f"the object changed since it was opened (If-Match {kwargs.get('IfMatch')!r}"
                                         " no longer holds); open it again", path=self.shown) from None
            if code == "InvalidRange":
                size = str(error.get("ActualObjectSize", ""))
                raise _Unsatisfiable(int(size) if size.isdigit() else None) from None
            if isinstance(exc, FileNotFoundError) or code in ("NoSuchKey", "NoSuchBucket", "404"):
                raise AprFileNotFoundError("no such object", path=self.shown) from None
            if isinstance(exc, PermissionError) or code in ("AccessDenied", "403", "InvalidAccessKeyId",
                                                            "SignatureDoesNotMatch"):
                raise AprPermissionError(f"access refused ({redact_urls(exc)})", path=self.shown) from None
            # botocore (5xx, throttling, connection errors) and then s3fs (its ``retries``)
            # have retried the request already: retrying here too would multiply them
            raise AprIOError(f"GetObject failed after s3fs's retries: {type(exc).__name__}: {redact_urls(exc)}",
                             path=self.shown) from None


def _direct_refusal(fs, version):
    """None when the later GETs can go to a presigned URL, else why not (a sentence).
    What is checked here is known before any URL is signed; the endpoint's proxy and
    TLS settings are checked by :meth:`_Direct._endpoint_for` once the URL names it."""
    if getattr(fs, "s3_additional_kwargs", None):
        return "s3_additional_kwargs (SSE-C keys, ...) are sent as headers a presigned URL does not sign"
    if getattr(fs, "req_kw", None):
        return "requester_pays is a header a presigned URL does not sign"
    if not (version and version[0]):
        return "the object's first answer had no ETag to send as If-Match"
    return None


def _keep_sigv4(signature_version, **kwargs):
    """botocore's choose-signer hook: while _Direct presigns, a Version 4 query
    signature stays Version 4 (registered first, it answers before botocore's hook that
    turns it into Version 2); anything else (an explicit version, v4a, unsigned) is left
    to botocore."""
    if _PRESIGNING_V4.get() and signature_version in ("v4-query", "s3v4-query"):
        return signature_version
    return None


def _redact(text: str, query: str = "") -> str:
    """``text`` without a presigned URL's query or any of its secret parameters."""
    if query:
        text = text.replace(query, "<query redacted>")
    return _SECRET_PARAMS.sub(lambda m: m.group(1) + "=<redacted>", text)


def _session_settings(client):
    """(proxy for an URL -> str or None, verify, client certificate) of an aiobotocore
    client's HTTP session, or None when they cannot be read (another session class)."""
    session = getattr(getattr(client, "_endpoint", None), "http_session", None)
    proxies = getattr(session, "_proxy_config", None)
    if session is None or proxies is None or not hasattr(session, "_verify"):
        return None
    return proxies.proxy_url_for, session._verify, getattr(session, "_cert_file", None)


class _Direct:
    """The later GETs of an :class:`S3Source` sent to a presigned URL over :mod:`.http`'s
    kept-alive connections, each body read straight into its buffer."""

    def __init__(self, source: S3Source):
        self.source = source
        self._lock = threading.Lock()
        self._signed = None  # (endpoint, target, signed at), signed when first needed

    # --- the URL ------------------------------------------------------------------------
    def _target(self):
        """(Endpoint, path?query) of a presigned URL signed less than PRESIGN_REUSE ago."""
        with self._lock:
            signed = self._signed
            if signed is None or time.monotonic() - signed[2] > PRESIGN_REUSE:
                url, client = self._presign()
                parts = urllib.parse.urlsplit(url)
                if parts.scheme not in ("http", "https") or not parts.hostname:
                    raise _Refused(f"a presigned URL of scheme {parts.scheme!r}")
                query = urllib.parse.parse_qs(parts.query)
                signed_headers = query.get("X-Amz-SignedHeaders", ["host"])[0].lower()
                if signed_headers != "host":  # headers we would have to send exactly as signed
                    raise _Refused(f"the presigned URL signs the headers {signed_headers!r}")
                endpoint = self._endpoint_for(parts, client, url)
                target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                signed = self._signed = (endpoint, target, time.monotonic())
            return signed[0], signed[1]

    def _presign(self):
        """A presigned GetObject URL of the object, from s3fs's client for its bucket
        (computed locally: no request), and that client."""
        from fsspec.asyn import sync

        fs, params = self.source.fs, dict(self.source._kwargs)

        async def presign():
            await fs.set_session()
            client = await fs.get_s3(params["Bucket"])
            client.meta.events.register_first("choose-signer.s3.GetObject", _keep_sigv4,
                                              unique_id="aprfast-presign-sigv4")
            _PRESIGNING_V4.set(True)  # this task's context only: other presigns keep botocore's choice
            url = await client.generate_presigned_url("get_object", Params=params, ExpiresIn=PRESIGN_EXPIRES)
            return url, client

        try:
            return sync(fs.loop, presign)
        except Exception as exc:  # noqa: BLE001 - botocore's signing errors (no credentials, ...)
            raise _Refused(f"cannot presign: {type(exc).__name__}") from None

    def _endpoint_for(self, parts, client, url):
        """http.py's Endpoint for the presigned URL's server, when the client's session
        would reach it directly (no proxy) with the checks http.client can repeat."""
        from .http import Endpoint

        settings = _session_settings(client)
        if settings is None:
            raise _Refused("the S3 client's HTTP session settings are unknown")
        proxy_for, verify, cert = settings
        if proxy_for(url):
            raise _Refused("the S3 client goes through a proxy")
        cafile = None
        if parts.scheme == "https":
            if not verify or cert:
                raise _Refused("TLS checks off or a client certificate")
            from botocore.httpsession import get_cert_path

            cafile = get_cert_path(verify)  # the certificates botocore checks against
        config = getattr(getattr(client, "meta", None), "config", None)
        timeout = getattr(config, "read_timeout", None)
        timeout = timeout if isinstance(timeout, (int, float)) and timeout > 0 else 60
        return Endpoint(parts.scheme, parts.hostname, parts.port, timeout, cafile)

    # --- one GET --------------------------------------------------------------------------
    def fetch_into(self, offset: int, out: memoryview) -> int:
        source = self.source
        n = out.nbytes
        endpoint, target = self._target()
        query = target.partition("?")[2]
        headers = {"Range": f"bytes={offset}-{offset + n - 1}", "If-Match": source.version[0]}
        from .http import Budget

        clock = Budget(endpoint.timeout, deadline=source.deadline, path=source.shown).request()
        try:
            conn, resp = endpoint.send(target, headers, clock)
            failure = None
        except TransientError as exc:  # http.client may quote the request line: redacted
            conn, resp, failure = None, None, _redact(str(exc), query)
        if failure is not None:  # raised out here, so that no exception chained to it holds the URL
            raise TransientError(failure)
        try:
            self._check_status(resp, offset, n)
            if resp.version[0] != source.version[0]:
                raise RemoteChangedError(f"the object changed since it was opened (ETag {source.version[0]!r} -> "
                                         f"{resp.version[0]!r}); open it again", path=source.shown)
            from .http import check_range, read_into

            check_range(resp, offset, n, source.size, source.shown)
            return read_into(resp, out)
        finally:
            endpoint.release(conn, resp)

    def _check_status(self, resp, offset: int, n: int) -> None:
        """Refuse every answer but 206, typed as the s3fs way types them."""
        from .http import _drain_small

        status, url = resp.status, self.source.shown
        if status == 206:
            return
        _drain_small(resp)  # an S3 error document: small; the connection is reused
        if status >= 500 or status in (408, 429):  # S3's SlowDown is a 503; others throttle with 429
            raise TransientError(f"S3 answered {status}")
        if status == 412:
            raise RemoteChangedError(f"the object changed since it was opened (If-Match {self.source.version[0]!r}"
                                     " no longer holds); open it again", path=url)
        if status == 416:
            raise RemoteChangedError(f"the server refused bytes {offset}-{offset + n - 1} of an object of "
                                     f"{self.source.size} bytes: it changed since it was opened", path=url)
        if status == 404:
            raise AprFileNotFoundError("no such object", path=url)
        if 300 <= status < 500:
            raise _Refused(f"a presigned GET was answered {status}")
        raise AprIOError(f"S3 answered {status} to a ranged GET", path=url)


class _Refused(Exception):
    """A presigned GET cannot be used (or was refused): the GET goes through s3fs."""


class _BodyError(Exception):
    """The body of an accepted answer broke off; retried by RangedSource."""


class _Unsatisfiable(Exception):
    """S3's InvalidRange (416), with the object's actual size when it said it."""

    def __init__(self, size):
        super().__init__(size)
        self.size = size
