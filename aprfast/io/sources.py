"""Where a file's bytes come from: a file descriptor (read with ``pread``, mapped into
memory on demand), an in-memory buffer, or a Python file object.

Every access goes through :meth:`Source.read` (bytes, possibly copied: headers,
metadata, the index) or :meth:`Source.view` (zero-copy: tensor data), and both check
the range against the bytes really present before slicing or allocating, so a lying
offset or size in a file becomes a :class:`~aprfast.errors.CorruptError` naming the
numbers, never a short read, a crash or a huge allocation.  All sources are safe to
read from several threads at once.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import threading

import numpy as np

from .. import _memory
from .._crc import crc32
from ..errors import AprIOError, CorruptError, os_error
from . import platform
from .direct import ALIGN, DirectReader

__all__ = ["Source", "FileSource", "BufferSource", "StreamSource", "open_source"]


class Source:
    """Bytes of one file, read by absolute offset.

    Every access runs between :meth:`_enter` and :meth:`_leave`, which count the
    accesses in flight.  :meth:`close` marks the source closed at once (new accesses
    raise :class:`AprIOError`) but frees the descriptor, map or buffer only when the
    last access in flight has left.  Without that, a read that had passed the "is it
    open" check could ``pread`` a descriptor number that ``close()`` had released and
    another ``open()`` had reused, and return an unrelated file's bytes.
    """

    #: True when :meth:`view` is available (memory that stays valid while open).
    zero_copy = False
    #: True when :meth:`readinto` is one parallel ``pread`` (``_memory.pread_into``),
    #: which populates a buffer allocated with ``filled_by_read`` as it reads.
    reads_by_pread = False
    #: With ``mode="direct"``, the alignment of the reads that bypass the page cache:
    #: a buffer whose address is congruent with the file offset modulo it is filled
    #: without a bounce copy (0: no alignment to keep).
    direct_align = 0
    path = None

    def __init__(self, size: int):
        self.size = size
        self.closed = False
        self._users = 0
        self._state = threading.Lock()

    def check_range(self, offset: int, n: int, what: str = "range") -> None:
        if offset < 0 or n < 0 or offset + n > self.size:
            raise CorruptError(f"{what} of {n} bytes at offset {offset} lies outside the "
                               f"{self.size} bytes present", path=self.path)

    def read(self, offset: int, n: int, what: str = "range"):
        """``n`` bytes at ``offset`` as a bytes-like object (may be a copy)."""
        self.check_range(offset, n, what)
        self._enter()
        try:
            return self._read(offset, n)
        finally:
            self._leave()

    def view(self, offset: int, n: int, what: str = "range") -> memoryview:
        """A zero-copy view of ``n`` bytes at ``offset`` (only when ``zero_copy``)."""
        self.check_range(offset, n, what)
        return self.buffer()[offset:offset + n]

    def buffer(self) -> memoryview:
        """The whole file as one read-only buffer (zero-copy sources only).  The view
        holds its own export, so it stays valid after :meth:`close`."""
        self._enter()
        try:
            return self._buffer()
        finally:
            self._leave()

    def _buffer(self) -> memoryview:
        raise NotImplementedError(f"{type(self).__name__} has no zero-copy buffer")

    def _checked_bytes(self, offset: int, out) -> memoryview:
        """``out`` as a flat byte view, its range ``[offset, offset + len)`` checked."""
        out = memoryview(out)
        if out.format != "B" or out.ndim != 1:
            out = out.cast("B")
        self.check_range(offset, out.nbytes)
        return out

    def readinto(self, offset: int, out, *, threads: int = 0, crc=None):
        """Fill the writable byte buffer ``out`` from ``offset``; return the running CRC
        over those bytes if ``crc`` is given (zlib.crc32 semantics)."""
        out = self._checked_bytes(offset, out)
        self._enter()
        try:
            return self._readinto(offset, out, threads, crc)
        finally:
            self._leave()

    def readinto_start(self, offset: int, out, *, threads: int = 0, crc=None):
        """:meth:`readinto`, begun now and finished by the ``wait()`` of the object
        returned, which gives what :meth:`readinto` returns (or raises what it raises).
        ``out`` must not be read, and the source not closed, until then.  Here the read
        is done before returning; a local file reads on a thread of its own meanwhile
        (:meth:`FileSource.readinto_start`)."""
        return _DoneRead(self.readinto(offset, out, threads=threads, crc=crc))

    def readinto_many(self, pieces) -> None:
        """Fill the writable byte buffer of each ``(offset, out)`` of ``pieces`` from its
        offset, as :meth:`readinto` does (no CRC): the batched reads of
        ``get_tensors``.  Every range is checked before anything is read."""
        pieces = list(pieces)
        for offset, out in pieces:
            self.check_range(offset, memoryview(out).nbytes)
        for offset, out in pieces:
            self.readinto(offset, out)

    def _readinto(self, offset, out, threads, crc):
        _memory.copy_into(out, self._read(offset, out.nbytes), threads)
        return None if crc is None else crc32(out, crc, threads=threads)

    def _enter(self) -> None:
        with self._state:
            if self.closed:
                raise AprIOError("the file is closed", path=self.path)
            self._users += 1

    def _leave(self) -> None:
        with self._state:
            self._users -= 1
            last = self.closed and self._users == 0
        if last:
            self._free()

    def close(self) -> None:
        """Refuse new accesses now; free the resources when the last one in flight leaves."""
        with self._state:
            if self.closed:
                return
            self.closed = True
            idle = self._users == 0
        if idle:
            self._free()

    def _free(self) -> None:
        """Release what the source holds (called once, with no access in flight)."""

    def _read(self, offset, n):  # pragma: no cover - abstract
        raise NotImplementedError


class BufferSource(Source):
    """An in-memory file: bytes, bytearray, memoryview or any contiguous buffer."""

    zero_copy = True
    #: The bytes belong to the caller, who may change them after they were checked:
    #: parsers keep private copies of what they decode later (the tensor index).
    caller_buffer = True

    def __init__(self, data, path=None):
        view = memoryview(data)
        if not view.c_contiguous:
            raise ValueError("aprfast needs a contiguous buffer")
        self._view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        self.path = path
        super().__init__(self._view.nbytes)

    def _buffer(self):
        return self._view

    def _read(self, offset, n):
        return self._view[offset:offset + n]

    def _free(self):
        self._view = None


class _DoneRead:
    """A read already over (Source.readinto_start): ``wait()`` gives its result."""

    __slots__ = ("_result",)

    def __init__(self, result):
        self._result = result

    def wait(self):
        return self._result


class _PendingRead:
    """A FileSource read running on a thread of its own (_memory.BackgroundRead).  The
    source counts it as an access in flight until ``wait()``, so a ``close()`` meanwhile
    cannot free the descriptor under the read; an object dropped unwaited waits (and
    leaves) when it is freed."""

    __slots__ = ("_read", "_holders", "_path", "_offset", "_n")

    def __init__(self, source, read, offset: int, n: int):
        self._read = read
        # list.pop is atomic: wait() from two threads still leaves the source once
        self._holders = [source]
        self._path, self._offset, self._n = source.path, offset, n

    def wait(self):
        try:
            with _read_errors(self._path, self._n, self._offset):
                return self._read.wait()
        finally:
            try:
                source = self._holders.pop()
            except IndexError:  # left already, by an earlier wait() or another thread's
                source = None
            if source is not None:
                source._leave()

    def __del__(self):
        if self._holders:
            with contextlib.suppress(Exception):
                self.wait()


@contextlib.contextmanager
def _read_errors(path, n: int, offset: int):
    """A read's errors as aprfast's: a file that shrank under the read is corrupt, any
    other OS error an I/O error naming the range."""
    try:
        yield
    except EOFError as exc:
        raise CorruptError(f"file shrank while reading: {exc}", path=path) from None
    except OSError as exc:
        raise AprIOError(f"read of {n} bytes at {offset} failed: {exc}", path=path) from exc


class FileSource(Source):
    """A file descriptor (a private duplicate, so no shared file position).

    Headers and the index are read with ``pread``; the file is memory-mapped only
    when a zero-copy view is first asked for, so opening and listing stay cheap.
    ``mappable=False`` (mode "pread") never maps: tensors are then always copied.
    ``private=True`` (mode "private") maps copy-on-write: views are writable, writes
    stay in this process and never reach the file, and untouched pages cost nothing.
    ``direct=True`` (mode "direct", never mapped) reads around the page cache
    (:class:`aprfast.io.direct.DirectReader`: ``O_DIRECT``, or buffered reads whose
    pages are dropped after them where the filesystem refuses it).
    """

    reads_by_pread = True

    #: The first read of a header fetches this many bytes in one ``pread``; the reads
    #: of metadata and index that follow are then served from memory (7 system calls
    #: became 1 when opening a small model).
    HEAD = 16 << 10

    def __init__(self, fd: int, path=None, *, mappable: bool = True, size: int | None = None,
                 owned: bool = False, private: bool = False, direct: bool = False):
        # ``owned``: the caller hands its descriptor over instead of us duplicating it.
        self._fd = fd if owned else os.dup(fd)
        self.path = path
        self.zero_copy = mappable and not direct
        self._direct = None
        if direct:
            try:
                self._direct = DirectReader(self._fd, path)
            except BaseException:
                if not owned:
                    os.close(self._fd)
                raise
            self.direct_align = ALIGN if self._direct.how == "o_direct" else 0
        self._access = mmap.ACCESS_COPY if private else mmap.ACCESS_READ
        self._map = None
        self._map_view = None
        self._head = None
        self._lock = threading.Lock()
        super().__init__(os.fstat(self._fd).st_size if size is None else size)

    def read(self, offset: int, n: int, what: str = "range"):
        # Header, metadata and a small index come from the first HEAD bytes, already in
        # memory: no descriptor is used, so no access needs counting (opening a small
        # model makes about eight such reads).  A closed source still refuses.
        head = self._head
        if head is not None and offset >= 0 and n >= 0 and offset + n <= len(head) and self._map_view is None:
            if self.closed:
                raise AprIOError("the file is closed", path=self.path)
            return head[offset:offset + n]
        return Source.read(self, offset, n, what)

    def _buffer(self):
        view = self._map_view
        if view is None:
            view = self._map_file()
        # A slice shares the map's export but not this view's lifetime, so close()
        # may release ``_map_view`` while the caller still holds the slice.
        return view[:]

    def _map_file(self):
        if not self.zero_copy:
            raise AprIOError("this file was opened with mode='pread' and is not mapped", path=self.path)
        with self._lock:
            if self._map_view is None:
                try:
                    self._map = mmap.mmap(self._fd, 0, access=self._access) if self.size else None
                except (OSError, ValueError) as exc:
                    raise AprIOError(f"cannot memory-map: {getattr(exc, 'strerror', None) or exc}",
                                     path=self.path) from exc
                self._map_view = memoryview(self._map) if self._map is not None else memoryview(b"")
            return self._map_view

    def _read(self, offset, n):
        view = self._map_view
        if view is not None:
            return view[offset:offset + n]
        if offset + n <= self.HEAD:
            head = self._head
            if head is None:
                head = self._head = self._read_head()
            if offset + n <= len(head):
                return head[offset:offset + n]
        out = _memory.uninitialised_bytearray(n)  # pread fills it all (or raises): no zeroing first
        self._readinto(offset, memoryview(out), 1, None)
        return out

    def _read_head(self) -> memoryview:
        head = bytearray(min(self.size, self.HEAD))
        self._readinto(0, memoryview(head), 1, None)
        return memoryview(head).toreadonly()

    def _readinto(self, offset, out, threads, crc):
        with _read_errors(self.path, out.nbytes, offset):
            if self._direct is not None:
                return self._direct.readinto(offset, out, threads, crc)
            return _memory.pread_into(self._fd, offset, out, threads, crc)

    def readinto_start(self, offset: int, out, *, threads: int = 0, crc=None):
        """:meth:`Source.readinto_start` with the parallel ``pread`` begun on a thread of
        its own (``_memory.BackgroundRead``), which the caller's ``wait()`` joins.
        Direct I/O and the forced "pread" fallback read before returning."""
        if self._direct is not None or not platform.uses("pread"):
            return Source.readinto_start(self, offset, out, threads=threads, crc=crc)
        out = self._checked_bytes(offset, out)
        self._enter()
        try:
            read = _memory.BackgroundRead(self._fd, offset, out, threads, crc)
        except BaseException:
            self._leave()
            raise
        return _PendingRead(self, read, offset, out.nbytes)

    def readinto_many(self, pieces) -> None:
        """:meth:`Source.readinto_many` with one entry into the source and a ``pread``
        each, without readinto's per-call Python work (direct I/O reads piece by piece)."""
        if self._direct is not None:
            return super().readinto_many(pieces)
        views = []
        for offset, out in pieces:  # every range checked before anything is read
            views.append((offset, self._checked_bytes(offset, out)))
        self._enter()
        try:
            offset = n = 0
            try:
                for offset, view in views:
                    n = view.nbytes
                    _memory.pread_into(self._fd, offset, view, 1, None)
            except (EOFError, OSError):
                with _read_errors(self.path, n, offset):
                    raise
        finally:
            self._leave()
        return None

    @property
    def direct_how(self) -> str | None:
        """With mode "direct": "o_direct", "nocache", or why the reads are buffered
        (then dropped from the cache); None in the other modes."""
        return None if self._direct is None else self._direct.how

    def pread_bytes(self, offset: int, n: int, *, threads: int = 0, crc=None):
        """(``n`` bytes at ``offset`` as a new ``bytes``, read straight into it, the
        running CRC over them if ``crc`` is given): an owned copy made by one read, for
        callers that return the bytes themselves (no map, no second copy)."""
        self.check_range(offset, n)
        self._enter()
        try:
            with _read_errors(self.path, n, offset):
                if self._direct is not None:
                    out = _memory.uninitialised_bytearray(n)
                    crc = self._direct.readinto(offset, memoryview(out), threads, crc)
                    return bytes(out), crc
                return _memory.pread_to_bytes(self._fd, offset, n, threads, crc)
        finally:
            self._leave()

    def fileno(self) -> int:
        return self._fd

    def _free(self):
        with self._lock:
            view, mapping = self._map_view, self._map
            self._map_view = self._map = None
        if view is not None:
            view.release()
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:
                # Arrays handed out still view the map; it unmaps when the last one dies,
                # so those arrays never point at unmapped memory.
                pass
        if self._direct is not None:
            self._direct.close()
        os.close(self._fd)


class StreamSource(Source):
    """A seekable Python file object without a descriptor (e.g. ``io.BytesIO``)."""

    def __init__(self, fileobj, path=None):
        self._file = fileobj
        self._lock = threading.Lock()
        self.path = path
        seekable = getattr(fileobj, "seekable", None)
        if seekable is not None and not seekable():
            raise _not_seekable(f"a {type(fileobj).__name__} that cannot seek", path)
        with self._lock:
            self._start = fileobj.tell()
            size = fileobj.seek(0, os.SEEK_END) - self._start
            fileobj.seek(self._start)
        super().__init__(size)

    def _read(self, offset, n):
        with self._lock:
            position = self._file.tell()
            self._file.seek(self._start + offset)
            data = self._file.read(n)
            self._file.seek(position)
        if len(data) != n:
            raise CorruptError(f"stream returned {len(data)} of {n} bytes at {offset}", path=self.path)
        return data


#: (is_url, open_url) of aprfast.remote, which registers itself when imported (aprfast
#: imports it): remote sources are built on Source, so this module cannot import them.
_url_opener = None


def register_url_opener(is_url, open_url) -> None:
    """Route ``scheme://`` strings that ``is_url`` accepts to ``open_url(url,
    storage_options, mode=)`` (aprfast.remote does, at import)."""
    global _url_opener
    _url_opener = (is_url, open_url)


def open_source(target, *, mode: str | None = None, storage_options=None) -> Source:
    """A Source for a path, a URL, a file object, or an in-memory buffer.

    ``mode`` is "mmap" (the default for files: zero-copy read-only views), "private"
    (zero-copy views that are writable, copy-on-write: writes stay in this process),
    "pread" (tensors are always read into owned memory), "direct" (owned memory, read
    around the page cache: :mod:`aprfast.io.direct`), or None for the default.
    A ``scheme://`` string is a remote object (:mod:`aprfast.remote`, ranged reads,
    never mapped: "mmap" and "direct" read like "pread"); ``storage_options`` go to it.
    """
    if mode not in (None, "mmap", "private", "pread", "direct"):
        raise ValueError(f"mode must be 'mmap', 'private', 'pread' or 'direct', not {mode!r}")
    if isinstance(target, Source) and mode is None:
        return target  # already open (e.g. inspect looked at the magic first)
    if isinstance(target, str) and "://" in target and _url_opener is not None and _url_opener[0](target):
        return _url_opener[1](target, storage_options, mode="pread" if mode == "direct" else mode)
    if isinstance(target, (bytes, bytearray, memoryview, np.ndarray)):
        return BufferSource(target)
    if isinstance(target, (str, os.PathLike)):
        return _open_path(os.fspath(target), mode)
    fd = _fileno(target)
    if fd is not None:
        return _from_fd(fd, getattr(target, "name", None), mode)
    if hasattr(target, "seek") and hasattr(target, "read"):
        return StreamSource(target, getattr(target, "name", None))
    try:
        return BufferSource(target)
    except TypeError:
        raise TypeError(f"cannot read .apr data from {type(target).__name__}") from None


def _fileno(target):
    try:
        return target.fileno() if hasattr(target, "fileno") else None
    except (OSError, ValueError):  # io.BytesIO and friends have no descriptor
        return None


def _open_path(path: str, mode):
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        raise os_error(exc, f"cannot open: {exc.strerror}", path=path) from exc
    return _from_fd(fd, path, mode, owned=True)


def _from_fd(fd: int, path, mode, *, owned: bool = False) -> Source:
    """A FileSource over ``fd``; with ``owned`` the descriptor is consumed: it belongs to
    the source, or is closed here if no source comes of it."""
    try:
        # Only regular files can be mapped; anything else is read with pread by default.
        info = os.fstat(fd)
        kind = info.st_mode
        regular = stat.S_ISREG(kind)
        if stat.S_ISFIFO(kind) or stat.S_ISSOCK(kind):
            raise _not_seekable("a pipe" if stat.S_ISFIFO(kind) else "a socket", path)
        source = FileSource(fd, path, mappable=mode in ("mmap", "private") or (mode is None and regular),
                            size=info.st_size if regular else None, owned=owned, private=mode == "private",
                            direct=mode == "direct" and regular)
    except BaseException:
        if owned:
            os.close(fd)
        raise
    if mode in ("mmap", "private"):
        try:
            source.buffer()  # asked for explicitly: fail now, with the reason
        except AprIOError:
            source.close()
            raise
    return source


def _not_seekable(what: str, path) -> AprIOError:
    return AprIOError(f"the input is {what}: reading a .apr file needs random access (the index "
                      "points anywhere in the file), so it cannot be read from a stream here; "
                      "save it to a file first, or pass its bytes: aprfast.load(stream.read())",
                      path=path)
