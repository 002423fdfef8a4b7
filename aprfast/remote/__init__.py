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

from ._ranged import HEAD_BYTES, MERGE_GAP, PART_BYTES, TAIL_BYTES, RangedSource, RemoteChangedError, RemoteTimeoutError
from ._url import RemoteURLError, redact_url

__all__ = ["is_url", "open_url", "open_stream", "RemoteTarget", "RangedSource", "RemoteChangedError",
           "RemoteTimeoutError", "RemoteURLError", "redact_url", "HEAD_BYTES", "TAIL_BYTES", "MERGE_GAP",
           "PART_BYTES"]

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*)://")


def is_url(target) -> bool:
    """True for a ``scheme://...`` string (a Windows drive letter is not a scheme)."""
    if not isinstance(target, str):
        return False
    m = _SCHEME.match(target)
    return m is not None and len(m.group(1)) > 1


def url_scheme(url: str) -> str:
    return _SCHEME.match(url).group(1).lower()


#: The storage_options keys aprfast's own HTTP reader takes (any other key sends an
#: ``http(s)://`` URL through fsspec's HTTP filesystem).
HTTP_OPTIONS = frozenset({"headers", "timeout", "min_rate", "deadline"})


def open_url(url: str, storage_options=None, *, mode=None):
    """A Source over the object at ``url``.  ``storage_options`` go to fsspec; for
    ``http(s)://`` they may hold (:class:`~aprfast.remote.http.HttpSource`):

    - ``headers``: sent with every request to the URL's origin, never to another origin
      a redirect names (userinfo in the URL is sent as Basic auth the same way);
    - ``timeout``: seconds per socket operation (default 30);
    - ``min_rate``: bytes per second each request must bring after its first ``timeout``
      seconds (default 16 KiB/s; 0 or None: no bound), so a server dripping bytes fails
      in bounded time;
    - ``deadline``: seconds of waiting the opening (redirects, retries) and each later
      request may take at most (default None: only the bounds above);
    - ``connections``: parallel requests (default 8);

    any other key, or ``{"fsspec": True}``, sends the URL through fsspec's HTTP
    filesystem.  For ``s3://``, ``deadline`` (seconds) bounds each GetObject of the
    handle, s3fs's and botocore's retries included (the rest goes to s3fs).  Past a
    time bound: :class:`~aprfast.remote._ranged.RemoteTimeoutError`
    (E007); a redirect to a non-http(s) URL:
    :class:`~aprfast.remote._url.RemoteURLError` (E007).  Error messages show URLs
    redacted (:func:`redact_url`).  Example::

        aprfast.open("https://example.org/m.apr",
                     storage_options={"headers": {"Authorization": "Bearer ..."},
                                      "timeout": 10, "deadline": 60})

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
    if url_scheme(url) in ("http", "https") and not options.pop("fsspec", False) and set(options) <= HTTP_OPTIONS:
        from .http import HttpSource

        source = HttpSource(url, connections=connections, **options)
    else:
        from .fsspec import open_fsspec

        deadline = options.pop("deadline", None) if url_scheme(url) in ("s3", "s3a") else None
        source = open_fsspec(url, options, connections=connections, deadline=deadline)
    source.storage_options = dict(storage_options or {})  # what reopening it elsewhere needs (pickling)
    return source


def open_stream(url: str, storage_options=None):
    """A forward-only binary file object reading the whole object (for
    :func:`aprfast.stream` and ``apr download``).

    ``http(s)://`` goes through :func:`aprfast.remote.http.open_body`: one GET with the
    same URL parsing (userinfo as Basic auth), redirect policy (the caller's headers
    never sent to another origin; only http(s) redirects), time bounds (``timeout``,
    ``min_rate``, ``deadline`` of ``storage_options``, as for :func:`open_url`; the
    deadline covers the whole body here, counting only time spent waiting for the
    server) and typed errors (AprIOError and its subclasses, URLs redacted) as
    :func:`open_url`.  Its ``size`` is the declared Content-Length (None when there is
    none); a body ending short of it is an AprIOError.  Other URLs go through fsspec."""
    options = dict(storage_options or {})
    options.pop("connections", None)
    if url_scheme(url) == "hf":
        from .hf import open_hf_stream

        return open_hf_stream(url, options)
    if url_scheme(url) in ("http", "https") and set(options) <= HTTP_OPTIONS:
        from .http import open_body

        return open_body(url, **options)
    from .fsspec import TypedStream, _io_error, filesystem

    if url_scheme(url) in ("s3", "s3a"):
        # not s3fs's option (it would keep it); a stream's reads are bounded by botocore's
        # read_timeout each (config_kwargs), not by a deadline
        options.pop("deadline", None)
    fs, path = filesystem(url, options)
    try:
        return TypedStream(fs.open(path, "rb", block_size=8 << 20), url)
    except Exception as exc:  # noqa: BLE001
        error = _io_error(exc, url, "cannot open")
    raise error  # out here: chained to nothing that quotes the URL


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
        error = None
        try:
            self.file = fs.open(path, "wb", autocommit=False)
        except Exception as exc:  # noqa: BLE001
            error = _io_error(exc, url, "cannot start the upload")
        if error is not None:  # out here: chained to nothing that quotes the URL
            raise error

    def commit(self) -> None:
        from .fsspec import _io_error

        f, self.file = self.file, None
        error = None
        try:
            f.close()
            f.commit()
        except Exception as exc:  # noqa: BLE001
            _discard(f)
            error = _io_error(exc, self.url, "cannot complete the upload")
        if error is not None:  # out here: chained to nothing that quotes the URL
            raise error

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
