"""Remote files: ``http(s)://`` through a native ranged-GET reader, and every fsspec URL
(``s3://`` with ranged GETs only: open through s3fs's client, then presigned URLs,
see :mod:`.s3`; ``gs://``, ``az://``,
``memory://``, ``file://``, ...) through fsspec (the ``remote`` extra:
``pip install 'aprfast[remote]'``); ``hf://`` through huggingface_hub (the ``hf`` extra;
its cache and ``HF_HUB_OFFLINE`` honoured, see :mod:`.hf`).

Reading (:func:`open_url`): a :class:`~aprfast.remote._ranged.RangedSource` is an
ordinary :class:`~aprfast.io.sources.Source`, so :func:`aprfast.open`, ``load_file``,
``inspect`` and every reader above them work unchanged; the costs are

- opening (and ``inspect``): one request over HTTP and S3 when header, metadata and
  index lie in the first :data:`HEAD_BYTES` (64 KiB), else two; other fsspec backends
  add their ``info`` call; the footer is fetched only when a CRC is checked, unless it
  came with the first request (HTTP multi-range);
- ``get_tensor`` on an open handle: one ranged request (several in parallel above
  :data:`PART_BYTES`);
- ``get_slice``: only the byte runs the key needs, runs closer than :data:`MERGE_GAP`
  fetched as one;
- ``load_file``: the data section in up to ``connections`` parallel ranged requests
  straight into the final aligned buffer, CRC computed per part and combined.

Writing (:class:`RemoteTarget`): the bytes stream through fsspec (for s3fs a multipart
upload) and are published only by :meth:`RemoteTarget.commit`; a failed write discards
the upload, so no object appears at the target name.
"""

from __future__ import annotations

import re

from ..errors import AprFileNotFoundError, AprIOError
from ._ranged import HEAD_BYTES, MERGE_GAP, PART_BYTES, TAIL_BYTES, RangedSource, RemoteChangedError

__all__ = ["is_url", "open_url", "open_stream", "RemoteTarget", "RangedSource", "RemoteChangedError",
           "HEAD_BYTES", "TAIL_BYTES", "MERGE_GAP", "PART_BYTES"]

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*)://")


def is_url(target) -> bool:
    """True for a ``scheme://...`` string (a Windows drive letter is not a scheme)."""
    if not isinstance(target, str):
        return False
    m = _SCHEME.match(target)
    return m is not None and len(m.group(1)) > 1


def url_scheme(url: str) -> str:
    return _SCHEME.match(url).group(1).lower()


def open_url(url: str, storage_options=None, *, mode=None):
    """A Source over the object at ``url``.  ``storage_options`` go to fsspec; for
    ``http(s)://`` they may hold ``headers``, ``timeout`` and ``connections`` (any other
    key, or ``{"fsspec": True}``, sends the URL through fsspec's HTTP filesystem).
    ``mode`` applies to an ``hf://`` file found in huggingface_hub's cache (a local file);
    remote objects are never mapped, so "private" is refused for them."""
    options = dict(storage_options or {})
    if url_scheme(url) == "hf":
        from .hf import open_hf

        source = open_hf(url, options, mode=mode)
        if isinstance(source, RangedSource):
            source.storage_options = dict(storage_options or {})
        return source
    if mode == "private":
        raise ValueError("mode='private' maps a local file; a remote object is read with ranged requests")
    connections = options.pop("connections", 8)
    if url_scheme(url) in ("http", "https") and not options.pop("fsspec", False) and \
            set(options) <= {"headers", "timeout"}:
        from .http import HttpSource

        source = HttpSource(url, connections=connections, **options)
    else:
        from .fsspec import open_fsspec

        source = open_fsspec(url, options, connections=connections)
    source.storage_options = dict(storage_options or {})  # what reopening it elsewhere needs (pickling)
    return source


def open_stream(url: str, storage_options=None):
    """A forward-only binary file object reading the whole object (for :func:`aprfast.stream`)."""
    options = dict(storage_options or {})
    options.pop("connections", None)
    if url_scheme(url) == "hf":
        from .hf import open_hf_stream

        return open_hf_stream(url, options)
    if url_scheme(url) in ("http", "https") and set(options) <= {"headers", "timeout"}:
        import urllib.request

        request = urllib.request.Request(url, headers=dict(options.get("headers") or {}))
        try:
            response = urllib.request.urlopen(request, timeout=options.get("timeout", 30.0))  # noqa: S310
        except OSError as exc:
            if getattr(exc, "code", None) in (404, 410):
                raise AprFileNotFoundError(f"the server answered {exc.code}: no such object", path=url) from exc
            raise AprIOError(f"cannot open: {exc}", path=url) from exc
        return _CheckedBody(response, url)
    from .fsspec import _io_error, filesystem

    fs, path = filesystem(url, options)
    try:
        return fs.open(path, "rb", block_size=8 << 20)
    except Exception as exc:  # noqa: BLE001
        raise _io_error(exc, url, "cannot open") from exc


class _CheckedBody:
    """An HTTP response body read forward, whose end is checked against its
    Content-Length: http.client reports a connection cut mid-body as a plain end."""

    def __init__(self, response, url):
        self._response, self.url, self.got = response, url, 0
        length = response.headers.get("Content-Length")
        self.length = int(length) if length is not None and length.strip().isdigit() else None

    def readinto(self, view) -> int:
        try:
            n = self._response.readinto(view)
        except OSError as exc:
            raise AprIOError(f"the body broke off after {self.got} bytes: {exc}", path=self.url) from exc
        self.got += n
        if n == 0 and view and self.length is not None and self.got != self.length:
            raise AprIOError(f"the body ended after {self.got} of {self.length} bytes", path=self.url)
        return n

    def close(self) -> None:
        self._response.close()


class RemoteTarget:
    """Where a remote write goes: a binary file object that becomes the object at
    ``url`` only on :meth:`commit`; :meth:`abort` leaves no object behind.

    Opened with fsspec's ``autocommit=False``: s3fs then uploads the bytes as a multipart
    upload that is completed by ``commit()`` and aborted by ``discard()``; the local
    filesystem writes a temporary file that ``commit()`` renames.
    """

    def __init__(self, url: str, storage_options=None):
        from .fsspec import _io_error, filesystem

        self.url = url
        fs, path = filesystem(url, storage_options)
        try:
            self.file = fs.open(path, "wb", autocommit=False)
        except Exception as exc:  # noqa: BLE001
            raise _io_error(exc, url, "cannot start the upload") from exc

    def commit(self) -> None:
        from .fsspec import _io_error

        f, self.file = self.file, None
        try:
            f.close()
            f.commit()
        except Exception as exc:  # noqa: BLE001
            _discard(f)
            raise _io_error(exc, self.url, "cannot complete the upload") from exc

    def abort(self) -> None:
        f, self.file = self.file, None
        if f is not None:
            _discard(f)


def _discard(f) -> None:
    try:
        f.discard()
    except Exception:  # noqa: BLE001 - the upload failed already; nothing more to undo
        pass
    try:
        f.closed = True  # its buffer is gone: a later close() (at garbage collection) must not upload
    except (AttributeError, TypeError):
        pass


# sources.open_source (below this package) sends URLs here.
from ..io.sources import register_url_opener  # noqa: E402

register_url_opener(is_url, open_url)
