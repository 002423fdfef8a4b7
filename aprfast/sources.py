"""Where a file's bytes come from: a memory map, ``pread`` on a descriptor, an
in-memory buffer, or a Python file object.

Every read goes through :meth:`Source.read`, which checks the range against the
bytes really present before slicing or allocating, so a lying offset or size in a
file becomes a :class:`~aprfast.errors.CorruptError` naming the numbers, never a
short read, a crash or a huge allocation.  All sources are safe to read from
several threads at once.
"""

from __future__ import annotations

import mmap
import os
import threading

import numpy as np

from . import _memory
from .errors import AprIOError, CorruptError

__all__ = ["Source", "MappedSource", "PreadSource", "BufferSource", "StreamSource", "open_source"]


class Source:
    """Bytes of one file, read by absolute offset."""

    #: True when :meth:`read` returns views into memory that stays valid while open.
    zero_copy = False
    path = None

    def __init__(self, size: int):
        self.size = size
        self.closed = False

    def check_range(self, offset: int, n: int, what: str = "range") -> None:
        if offset < 0 or n < 0 or offset + n > self.size:
            raise CorruptError(f"{what} of {n} bytes at offset {offset} lies outside the "
                               f"{self.size} bytes present", path=self.path)

    def read(self, offset: int, n: int, what: str = "range") -> memoryview:
        """``n`` bytes at ``offset`` (a view when ``zero_copy``, else a fresh copy)."""
        self._check_open()
        self.check_range(offset, n, what)
        return self._read(offset, n)

    def readinto(self, offset: int, out, *, threads: int = 0, crc=None):
        """Fill the writable byte buffer ``out`` from ``offset``; return the running CRC
        over those bytes if ``crc`` is given (zlib.crc32 semantics)."""
        out = memoryview(out).cast("B") if memoryview(out).format != "B" else memoryview(out)
        self._check_open()
        self.check_range(offset, out.nbytes)
        return self._readinto(offset, out, threads, crc)

    def _readinto(self, offset, out, threads, crc):
        view = self._read(offset, out.nbytes)
        _memory.copy_into(out, view, threads)
        if crc is None:
            return None
        from ._crc import crc32

        return crc32(out, crc, threads=threads)

    def _check_open(self):
        if self.closed:
            raise AprIOError("the file is closed", path=self.path)

    def close(self) -> None:
        self.closed = True

    def _read(self, offset, n):  # pragma: no cover - abstract
        raise NotImplementedError


class BufferSource(Source):
    """An in-memory file: bytes, bytearray, memoryview or any contiguous buffer."""

    zero_copy = True

    def __init__(self, data, path=None):
        view = memoryview(data)
        if not view.c_contiguous:
            raise ValueError("aprfast needs a contiguous buffer")
        self._view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        self.path = path
        super().__init__(self._view.nbytes)

    def _read(self, offset, n):
        return self._view[offset:offset + n]

    def close(self):
        super().close()
        self._view = None


class MappedSource(BufferSource):
    """A read-only memory map of a file descriptor."""

    def __init__(self, fd: int, path=None):
        self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        super().__init__(self._map, path)

    def close(self):
        view, mapping = self._view, self._map
        super().close()
        self._map = None
        if view is not None:
            view.release()
        try:
            mapping.close()
        except BufferError:
            # Arrays handed out still view the map; it unmaps when the last one dies,
            # so those arrays never point at unmapped memory.
            pass


class PreadSource(Source):
    """``pread`` on a private duplicate of a descriptor (no shared file position)."""

    def __init__(self, fd: int, path=None):
        self._fd = os.dup(fd)
        self.path = path
        super().__init__(os.fstat(self._fd).st_size)

    def _read(self, offset, n):
        out = bytearray(n)
        self._readinto(offset, memoryview(out), 1, None)
        return memoryview(out)

    def _readinto(self, offset, out, threads, crc):
        try:
            return _memory.pread_into(self._fd, offset, out, threads, crc)
        except EOFError as exc:
            raise CorruptError(f"file shrank while reading: {exc}", path=self.path) from None
        except OSError as exc:
            raise AprIOError(f"read of {out.nbytes} bytes at {offset} failed: {exc}", path=self.path) from exc

    def fileno(self) -> int:
        return self._fd

    def close(self):
        if not self.closed:
            super().close()
            os.close(self._fd)


class StreamSource(Source):
    """A seekable Python file object without a descriptor (e.g. ``io.BytesIO``)."""

    def __init__(self, fileobj, path=None):
        self._file = fileobj
        self._lock = threading.Lock()
        self.path = path
        size = fileobj.seek(0, os.SEEK_END)
        super().__init__(size)

    def _read(self, offset, n):
        with self._lock:
            self._file.seek(offset)
            data = self._file.read(n)
        if len(data) != n:
            raise CorruptError(f"stream returned {len(data)} of {n} bytes at {offset}", path=self.path)
        return memoryview(data)


def open_source(target, *, mode: str | None = None) -> Source:
    """A Source for a path, a file object, or an in-memory buffer.

    ``mode`` is "mmap" (the default for files), "pread", or None to choose.
    """
    if mode not in (None, "mmap", "pread"):
        raise ValueError(f"mode must be 'mmap' or 'pread', not {mode!r}")
    if isinstance(target, (bytes, bytearray, memoryview, np.ndarray)):
        return BufferSource(target)
    if isinstance(target, (str, os.PathLike)):
        return _open_path(os.fspath(target), mode)
    if hasattr(target, "fileno"):
        try:
            fd = target.fileno()
        except (OSError, ValueError):
            fd = None
        if fd is not None:
            return _from_fd(fd, getattr(target, "name", None), mode)
    if hasattr(target, "seek") and hasattr(target, "read"):
        return StreamSource(target, getattr(target, "name", None))
    try:
        return BufferSource(target)
    except TypeError:
        raise TypeError(f"cannot read .apr data from {type(target).__name__}") from None


def _open_path(path: str, mode):
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        raise AprIOError(f"cannot open: {exc.strerror}", path=path) from exc
    try:
        return _from_fd(fd, path, mode)
    finally:
        os.close(fd)


def _from_fd(fd: int, path, mode) -> Source:
    if mode == "pread":
        return PreadSource(fd, path)
    try:
        if os.fstat(fd).st_size == 0:
            return BufferSource(b"", path)
        return MappedSource(fd, path)
    except (OSError, ValueError) as exc:
        if mode == "mmap":
            raise AprIOError(f"cannot memory-map: {getattr(exc, 'strerror', None) or exc}", path=path) from exc
        return PreadSource(fd, path)
