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
for, checked before its body is read.  The requests go through s3fs's own client
(``S3FileSystem._call_s3``: its credentials, endpoint, ``requester_pays``, and its
retries, on top of botocore's, of 5xx answers, throttling and connection errors); a
failure both gave up on is an :class:`AprIOError`.  A body cut short, which neither
retries, is retried here with backoff from the byte where it stopped.
"""

from __future__ import annotations

import re

from ..errors import AprError, AprFileNotFoundError, AprIOError, AprPermissionError
from ._ranged import HEAD_BYTES, RangedSource, RemoteChangedError, TransientError

__all__ = ["S3Source", "is_s3fs"]

_CONTENT_RANGE = re.compile(r"bytes (\d{1,20})-(\d{1,20})/(\d{1,20})")


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
            raise _BodyError(f"{type(exc).__name__}: {exc}") from None
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

    def __init__(self, url: str, *, fs, path: str, connections: int = 8):
        from fsspec.asyn import sync

        self.url, self.fs, self._sync = url, fs, sync
        bucket, key, version_id = fs.split_path(path)
        if not key:
            raise AprIOError("an s3:// URL names bucket/key; this one names a bucket", path=url)
        self._kwargs = {"Bucket": bucket, "Key": key}
        if version_id:
            self._kwargs["VersionId"] = version_id
        self.path = url  # for the errors raised before RangedSource.__init__ sets it
        self.version = None  # (ETag, LastModified) of the first answer
        size, head = self._open()
        super().__init__(size, head, path=url, connections=connections)

    # --- opening: one GET for the first bytes, the length and the ETag ------------------
    def _open(self):
        import time

        attempt = 0
        while True:
            try:
                return self._first()
            except TransientError as exc:
                attempt += 1
                if attempt > self.retries:
                    raise AprIOError(f"cannot open after {attempt} attempts: {exc}", path=self.url) from None
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
                                     "first", path=self.url)
                found["size"], found["n"] = length, length
                return
            m = _CONTENT_RANGE.fullmatch(str(content_range).strip())
            if not m:
                raise AprIOError(f"an answer with Content-Range {content_range!r}", path=self.url)
            first, last, total = (int(g) for g in m.groups())
            if first != 0 or last != min(total, HEAD_BYTES) - 1 or length != last + 1:
                raise AprIOError(f"asked for bytes 0-{HEAD_BYTES - 1}, the server sent {first}-{last}/{total} "
                                 f"in {length} bytes", path=self.url)
            found["size"], found["n"] = total, length

        try:
            data = self._call(dict(self._kwargs, Range=f"bytes=0-{HEAD_BYTES - 1}"), check)
        except _Unsatisfiable as exc:
            if exc.size == 0:  # an empty object has no byte 0; the layouts refuse it by name
                self.version = None
                return 0, b""
            raise AprIOError(f"the server refused the range of the first {HEAD_BYTES} bytes (416)",
                             path=self.url) from None
        if len(data) != found["n"]:
            raise TransientError(f"the body ended after {len(data)} of {found['n']} bytes")
        self.version = found["version"]
        return found["size"], data

    # --- later reads --------------------------------------------------------------------
    def _fetch_into(self, offset: int, out: memoryview) -> int:
        n = out.nbytes
        kwargs = dict(self._kwargs, Range=f"bytes={offset}-{offset + n - 1}")
        etag, modified = self.version or (None, None)
        if etag:
            kwargs["IfMatch"] = etag  # S3 answers 412 once the object was replaced

        def check(resp):
            new_etag, new_modified = resp.get("ETag"), str(resp.get("LastModified"))
            if (etag and new_etag != etag) or (not etag and modified and new_modified != modified):
                raise RemoteChangedError(f"the object changed since it was opened (ETag {etag!r} -> {new_etag!r}); "
                                         "open it again", path=self.url)
            m = _CONTENT_RANGE.fullmatch(str(resp.get("ContentRange") or "").strip())
            if not m:
                raise AprIOError(f"asked for {n} bytes at offset {offset}, the server answered without a "
                                 f"Content-Range ({resp.get('ContentRange')!r})", path=self.url)
            first, last, total = (int(g) for g in m.groups())
            if total != self.size:
                raise RemoteChangedError(f"the object is now {total} bytes long; it was {self.size} when opened",
                                         path=self.url)
            if first != offset or last != offset + n - 1 or resp.get("ContentLength") != n:
                raise AprIOError(f"asked for bytes {offset}-{offset + n - 1}, the server sent {first}-{last} in "
                                 f"{resp.get('ContentLength')} bytes", path=self.url)

        try:
            data = self._call(kwargs, check)
        except _Unsatisfiable:
            raise RemoteChangedError(f"the server refused bytes {offset}-{offset + n - 1} of an object of "
                                     f"{self.size} bytes: it changed since it was opened", path=self.url) from None
        got = min(len(data), n)
        out[:got] = memoryview(data)[:got]
        return got

    def _call(self, kwargs: dict, check) -> bytes:
        """One GetObject through s3fs's client and event loop, its failures typed:
        missing / refused / changed objects are errors, the rest TransientError."""
        try:
            return self._sync(self.fs.loop, _get, self.fs, kwargs, check)
        except AprError:
            raise
        except _BodyError as exc:  # s3fs does not retry a body read: the retry is here
            raise TransientError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - botocore, aiohttp and s3fs each have their own
            code, error = _error_code(exc)
            if code == "PreconditionFailed":
                raise RemoteChangedError(f"the object changed since it was opened (If-Match {kwargs.get('IfMatch')!r}"
                                         " no longer holds); open it again", path=self.url) from None
            if code == "InvalidRange":
                size = str(error.get("ActualObjectSize", ""))
                raise _Unsatisfiable(int(size) if size.isdigit() else None) from None
            if isinstance(exc, FileNotFoundError) or code in ("NoSuchKey", "NoSuchBucket", "404"):
                raise AprFileNotFoundError("no such object", path=self.url) from None
            if isinstance(exc, PermissionError) or code in ("AccessDenied", "403", "InvalidAccessKeyId",
                                                            "SignatureDoesNotMatch"):
                raise AprPermissionError(f"access refused ({exc})", path=self.url) from None
            # botocore (5xx, throttling, connection errors) and then s3fs (its ``retries``)
            # have retried the request already: retrying here too would multiply them
            raise AprIOError(f"GetObject failed after s3fs's retries: {type(exc).__name__}: {exc}",
                             path=self.url) from None


class _BodyError(Exception):
    """The body of an accepted answer broke off; retried by RangedSource."""


class _Unsatisfiable(Exception):
    """S3's InvalidRange (416), with the object's actual size when it said it."""

    def __init__(self, size):
        super().__init__(size)
        self.size = size
