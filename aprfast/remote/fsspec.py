"""Any fsspec URL (``gs://``, ``az://``, ``memory://``, ``file://``, ...) as a
:class:`RangedSource`: the object's length and version come from one ``info`` call,
ranges are read through fsspec file objects opened without a read cache (one per
thread, so parallel reads run on parallel requests).  Opening costs that ``info`` and
one read of the first 64 KiB; the footer is read when its CRC is first needed.
``s3://`` (s3fs) has a reader of its own that needs no ``info`` (:mod:`.s3`).

The version (ETag, else the modification time) is compared for every file object
opened; s3fs also sends it as ``If-Match`` with every ranged GET, so a changed object
fails as :class:`RemoteChangedError` instead of mixing two versions.
"""

from __future__ import annotations

import threading

from .._optional import require
from ..errors import AprFileNotFoundError, AprIOError, AprPermissionError
from ._ranged import HEAD_BYTES, RangedSource, RemoteChangedError, TransientError
from ._url import redact_url, redact_urls, scrub

__all__ = ["FsspecSource", "TypedStream", "filesystem", "open_fsspec"]


def filesystem(url: str, storage_options=None):
    """(filesystem, path) for ``url`` through fsspec (MissingDependencyError without it)."""
    fsspec = require("fsspec")
    try:
        return fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    except ImportError:
        raise
    except (ValueError, TypeError) as exc:
        raise ValueError(f"fsspec cannot open {redact_url(url)!r}: {scrub(exc, url)}") from None


def _version(info: dict):
    for key in ("ETag", "etag", "e_tag", "md5", "generation", "version_id", "VersionId"):
        if info.get(key):
            return (key, str(info[key]))
    for key in ("LastModified", "last_modified", "mtime", "modified", "updated", "created"):
        if info.get(key) is not None:
            return (key, str(info[key]))
    return None


def _io_error(exc: BaseException, url: str, what: str) -> AprIOError:
    """The typed error for a backend's ``exc``; the URL redacted, and so is any part of
    it the backend's message quotes (raise it chained to nothing: ``exc`` may quote it)."""
    shown = redact_url(url)
    if isinstance(exc, FileNotFoundError):
        return AprFileNotFoundError(f"{what}: no such object", path=shown)
    if isinstance(exc, PermissionError):
        return AprPermissionError(f"{what}: access refused ({redact_urls(scrub(exc, url))})", path=shown)
    return AprIOError(f"{what}: {type(exc).__name__}: {redact_urls(scrub(exc, url))}", path=shown)


class TypedStream:
    """An fsspec file object read forward (:func:`aprfast.remote.open_stream`), its
    backend's errors typed: a body cut short or a protocol error from aiohttp or
    botocore (``ClientPayloadError``, ``HTTPClientError``, ...) becomes an
    :class:`AprIOError` naming the URL redacted, as every other read of a URL does."""

    def __init__(self, f, url: str):
        self._f, self.url = f, url
        size = getattr(f, "size", None)
        self.size = size if isinstance(size, int) else None

    def _call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - every backend has its own errors
            if isinstance(exc, AprIOError):
                raise
            error = _io_error(exc, self.url, what)
        raise error  # out here: chained to nothing that quotes the URL

    def readinto(self, view) -> int:
        return self._call("reading failed", self._f.readinto, view)

    def read(self, n=-1) -> bytes:
        return self._call("reading failed", self._f.read, n)

    def close(self) -> None:
        try:
            self._f.close()
        except Exception:  # noqa: BLE001 - closing a read handle: nothing to lose
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def open_fsspec(url: str, storage_options=None, *, connections: int = 8, deadline=None):
    """The Source for an fsspec URL: :class:`~aprfast.remote.s3.S3Source` for s3fs
    (ranged GETs only: 1 request to open; ``deadline`` seconds per GET at most), else
    :class:`FsspecSource`."""
    fs, path = filesystem(url, storage_options)
    from .s3 import S3Source, is_s3fs

    if is_s3fs(fs):
        return S3Source(url, fs=fs, path=path, connections=connections, deadline=deadline)
    return FsspecSource(url, fs=fs, path=path, connections=connections)


class FsspecSource(RangedSource):
    """One object of an fsspec filesystem."""

    def __init__(self, url: str, *, storage_options=None, connections: int = 8, fs=None, path=None):
        if fs is None:
            fs, path = filesystem(url, storage_options)
        self.url, self.fs, self._path = url, fs, path
        self.shown = redact_url(url)
        self._local = threading.local()
        self._files = []
        self._files_lock = threading.Lock()
        error = None
        try:
            # The first file object's own details are the object's info (one request, not
            # two); a backend whose file objects carry none is asked with info().
            first = self._open_file()
            details = getattr(first, "details", None)
            info = details if isinstance(details, dict) and "size" in details else fs.info(path)
        except Exception as exc:  # noqa: BLE001 - every backend has its own errors
            error = _io_error(exc, url, "cannot open")
        if error is not None:  # raised out here: the backend's exception may quote the URL
            raise error
        size = info.get("size")
        if info.get("type", "file") != "file" or not isinstance(size, int) or size < 0:
            first.close()
            if info.get("type", "file") != "file":
                raise AprIOError(f"not a file but a {info.get('type')}", path=self.shown)
            raise AprIOError(f"the filesystem reports a size of {size!r}", path=self.shown)
        self.version = _version(info)
        self._size = size
        self._local.file = first
        self._files.append(first)
        head = bytearray(min(size, HEAD_BYTES))
        super().__init__(size, b"", path=self.shown, connections=connections)
        try:
            if head:
                self._fetch_retrying(0, memoryview(head))
        except BaseException:
            self.close()
            raise
        # the footer is fetched when its CRC is first needed (RangedSource.cheap)
        self._head = memoryview(bytes(head)).toreadonly()

    def _file(self):
        f = getattr(self._local, "file", None)
        if f is None:
            f = self._open_file()
            details = getattr(f, "details", None)
            if isinstance(details, dict) and self.version is not None:
                now = _version(details)
                if now is not None and now[0] == self.version[0] and now != self.version:
                    f.close()
                    raise RemoteChangedError(f"the object changed since it was opened ({self.version[0]} "
                                             f"{self.version[1]!r} -> {now[1]!r}); open it again", path=self.shown)
            size = getattr(f, "size", None)
            if isinstance(size, int) and size != self._size:
                f.close()
                raise RemoteChangedError(f"the object is now {size} bytes long; it was {self._size} when opened",
                                         path=self.shown)
            self._local.file = f
            with self._files_lock:
                self._files.append(f)
        return f

    def _open_file(self):
        try:
            return self.fs.open(self._path, "rb", cache_type="none")
        except TypeError:  # a backend without that option
            return self.fs.open(self._path, "rb")

    def _fetch_into(self, offset: int, out: memoryview) -> int:
        n = out.nbytes
        try:
            f = self._file()
            f.seek(offset)
            data = f.read(n)
        except (RemoteChangedError, AprIOError):
            raise
        except Exception as exc:  # noqa: BLE001
            name = type(exc).__name__
            if name == "FileExpired":  # fsspec.exceptions.FileExpired: If-Match failed
                error = RemoteChangedError(f"the object changed since it was opened: {scrub(exc, self.url)}; "
                                           "open it again", path=self.shown)
            elif isinstance(exc, (FileNotFoundError, PermissionError)):
                error = _io_error(exc, self.url, f"reading {n} bytes at offset {offset}")
            else:
                self._local.file = None  # a fresh file object for the retry
                error = TransientError(f"{name}: {scrub(exc, self.url)}")
        else:
            error = None
        if error is not None:  # raised out here: the backend's exception may quote the URL
            raise error
        got = min(len(data), n)
        if len(data) > n:
            raise AprIOError(f"asked for {n} bytes at offset {offset}, got {len(data)}", path=self.shown)
        out[:got] = memoryview(data)[:got]
        return got

    def _free(self) -> None:
        super()._free()
        with self._files_lock:
            files, self._files = self._files, []
        for f in files:
            try:
                f.close()
            except Exception:  # noqa: BLE001 - closing a read handle: nothing to lose
                pass
