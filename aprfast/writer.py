"""Writing v2 files: one pass from a layout's plan, to a path (atomically) or to any
writable file object, pipes included.

``save_file``/``save`` know every tensor up front, so the layout is planned first and
the bytes stream out once: prefix (header, metadata, index), each tensor with its
padding, then the footer, whose CRC is combined from per-piece CRCs rather than
re-read.  :class:`Writer` takes tensors one at a time: each is checksummed and
spooled to a temporary file as it arrives (peak memory about one tensor), and on
close the plan is made and the spool copied out in index order with the kernel's
``copy_file_range``/``sendfile`` where possible.
"""

from __future__ import annotations

import errno
import os
import tempfile
import threading

from . import layouts
from ._crc import crc32, crc32_combine
from ._memory import append_padded, preallocate
from .errors import AprError, AprIOError, LayoutError
from .tensors import TensorInput, as_input

__all__ = ["Writer", "write_plan", "AtomicFile"]

# Small pieces are gathered into one buffer so 10,000 tiny tensors cost a few syscalls.
_GATHER_LIMIT = 1 << 20
_ZEROS = bytes(4096)


class AtomicFile:
    """A temporary file beside ``path`` that replaces it only on :meth:`commit`."""

    def __init__(self, path, *, durable: bool = True):
        self.path = os.fspath(path)
        self.durable = durable
        directory = os.path.dirname(os.path.abspath(self.path))
        base = os.path.basename(self.path)
        try:
            self.fd, self.temp_path = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=directory)
        except OSError as exc:
            raise AprIOError(f"cannot create a temporary file in {directory}: {exc.strerror}",
                             path=self.path) from exc
        os.fchmod(self.fd, _default_mode()) if hasattr(os, "fchmod") else None

    def commit(self) -> None:
        try:
            if self.durable:
                os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1
            os.replace(self.temp_path, self.path)
            if self.durable:
                _fsync_directory(os.path.dirname(os.path.abspath(self.path)))
        except OSError as exc:
            self.abort()
            raise AprIOError(f"cannot commit the written file: {exc.strerror}", path=self.path) from exc

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            os.unlink(self.temp_path)
        except FileNotFoundError:
            pass


_umask_lock = threading.Lock()


def _default_mode() -> int:
    """0666 & ~umask, the mode ``open()`` would give; mkstemp makes 0600 files."""
    return 0o666 & ~_current_umask()


def _current_umask() -> int:
    try:  # Linux reports it without changing it
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _umask_lock:  # elsewhere: set and restore (racy only against other umask users)
        umask = os.umask(0o022)
        os.umask(umask)
    return umask


def _fsync_directory(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # some platforms can't open directories; the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _Sink:
    """Writes byte pieces to a descriptor or file object, keeping the running CRC32 of
    everything written.  Small pieces are gathered so many tiny tensors cost a few
    syscalls and one CRC call per megabyte."""

    def __init__(self, fd=None, fileobj=None):
        self._fd = fd
        self._file = fileobj
        self.pending = bytearray()
        self.crc = 0

    def write(self, piece, nbytes: int) -> None:
        """Write ``nbytes`` bytes from ``piece`` (any C-contiguous buffer)."""
        if nbytes == 0:
            return
        if nbytes < _GATHER_LIMIT // 4:
            self.pending += _as_bytes(piece)
            if len(self.pending) >= _GATHER_LIMIT:
                self.flush()
            return
        self.flush()
        view = _as_bytes(piece)
        self.crc = crc32(view, self.crc)
        self._write_all(view)

    def zeros(self, n: int) -> None:
        self.pending += _ZEROS[:n] if n <= len(_ZEROS) else bytes(n)
        if len(self.pending) >= _GATHER_LIMIT:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.crc = crc32(self.pending, self.crc)
            self._write_all(memoryview(self.pending))
            self.pending = bytearray()

    def copy_from(self, spool_fd: int, offset: int, n: int, crc: int) -> None:
        """Copy ``n`` bytes whose CRC is ``crc`` from ``spool_fd`` without passing them
        through Python when the kernel can."""
        self.flush()
        if not (self._fd is not None and _kernel_copy(spool_fd, self._fd, offset, n)):
            self._copy_through_memory(spool_fd, offset, n)
        self.crc = crc32_combine(self.crc, crc, n)

    def _copy_through_memory(self, spool_fd, offset, n):
        while n:
            chunk = os.pread(spool_fd, min(n, 8 << 20), offset)
            if not chunk:
                raise AprIOError("spool file ended early")
            self._write_all(memoryview(chunk))
            offset += len(chunk)
            n -= len(chunk)

    def _write_all(self, view: memoryview) -> None:
        while len(view):
            if self._fd is not None:
                written = os.write(self._fd, view)
            else:
                written = self._file.write(view)
                written = len(view) if written is None else written
            view = view[written:]


def _as_bytes(piece) -> memoryview:
    """A flat unsigned-byte view of any C-contiguous buffer (0-d arrays included)."""
    view = memoryview(piece)
    if view.format == "B" and view.ndim == 1:
        return view
    return view.cast("B") if view.nbytes else memoryview(b"")


def _kernel_copy(src_fd, dst_fd, offset, n) -> bool:
    """True if the kernel copied the range; False if it can't (then nothing was copied)."""
    copy = getattr(os, "copy_file_range", None)
    if copy is None:
        return False
    copied = 0
    try:
        while copied < n:
            done = copy(src_fd, dst_fd, n - copied, offset + copied)
            if done == 0:
                raise AprIOError("spool file ended early")
            copied += done
        return True
    except OSError:
        if copied:  # the destination moved on; falling back would duplicate bytes
            raise
        return False


def write_plan(plan, sink: _Sink, *, spool_fd=None) -> None:
    """Stream a plan: prefix, tensors with padding, footer over the sink's running CRC."""
    sink.write(plan.prefix, len(plan.prefix))
    small = _GATHER_LIMIT // 4
    for item, pad in zip(plan.tensors, plan.pads):
        if spool_fd is not None:
            sink.copy_from(spool_fd, item.spool_offset, item.nbytes, item.crc)
            sink.zeros(pad)
        elif item.nbytes < small:
            if append_padded(sink.pending, item.data, pad) and len(sink.pending) >= _GATHER_LIMIT:
                sink.flush()
        else:
            sink.write(item.data, item.nbytes)
            sink.zeros(pad)
    sink.flush()
    footer = plan.footer(sink.crc)
    sink.write(footer, len(footer))
    sink.flush()


def save_to(target, plan, *, durable: bool = True) -> None:
    """Write a complete plan to a path (atomically) or a writable file object."""
    _emit_to(target, lambda sink: write_plan(plan, sink), durable, plan.total_size)


def _emit_to(target, emit, durable: bool, size: int) -> None:
    """Run ``emit(sink)`` into a path (atomically: temp file, fsync, rename) or a file
    object; an OS refusal (disk full, file too large, broken pipe) is AprIOError."""
    if isinstance(target, (str, os.PathLike)):
        atomic = AtomicFile(target, durable=durable)
        try:
            if not durable:
                _reserve(atomic.fd, size)
            emit(_Sink(fd=atomic.fd))
        except BaseException as exc:
            atomic.abort()
            _raise_io_error(exc, target)
            raise
        atomic.commit()
        return
    _require_writable(target)
    try:
        emit(_Sink(fileobj=target))
    except BaseException as exc:
        _raise_io_error(exc, _name_of(target))
        raise


def _name_of(target):
    return os.fspath(target) if isinstance(target, (str, os.PathLike)) else getattr(target, "name", None)


def _reserve(fd: int, size: int) -> None:
    """Reserve the file's blocks in one go.  Measured on ext4: writing into reserved
    blocks is 2-5x faster than page-by-page allocation, but when the data is fsynced
    right after, converting the reserved extents made the flush slower and erratic, so
    durable writes skip this.  A full disk is reported before anything is written;
    filesystems without fallocate just skip it."""
    if preallocate(fd, size) == errno.ENOSPC:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _raise_io_error(exc, path) -> None:
    if isinstance(exc, OSError) and not isinstance(exc, AprError):
        raise AprIOError(f"write failed: {exc.strerror or exc}", path=path) from exc


def _require_writable(target) -> None:
    if not hasattr(target, "write"):
        raise TypeError(f"cannot write .apr data to {type(target).__name__}; give a path or a writable file")


class _Spooled:
    """A tensor already written to the spool: what a plan needs, without its bytes."""

    __slots__ = ("name", "dtype", "shape", "nbytes", "spool_offset", "crc")

    def __init__(self, item: TensorInput, spool_offset: int, crc: int):
        self.name, self.dtype, self.shape = item.name, item.dtype, item.shape
        self.nbytes, self.spool_offset, self.crc = item.nbytes, spool_offset, crc


class Writer:
    """Write a file one tensor at a time; use as a context manager.

    ``target`` is a path (written atomically: nothing replaces it unless the ``with``
    block completes) or a writable file object, which may be a pipe.  ``add`` writes
    each tensor out as it comes; the file is assembled on close, in the same bytes
    ``save_file`` would produce for the same tensors, whatever order they came in.
    """

    def __init__(self, target, metadata=None, *, layout: str = "auto", alignment: int = 64,
                 durable: bool = True):
        if not isinstance(target, (str, os.PathLike)):
            _require_writable(target)
        self._target = target
        self._metadata = dict(metadata or {})
        self._layout = layout
        self._alignment = alignment
        self._durable = durable
        self._names = set()
        self._items = []
        self._size = 0
        spool_dir = os.path.dirname(os.path.abspath(target)) if isinstance(target, (str, os.PathLike)) else None
        try:
            self._spool = tempfile.TemporaryFile(prefix=".aprfast-spool-", dir=spool_dir)
        except OSError as exc:
            raise AprIOError(f"cannot create a spool file in {spool_dir or 'the temp dir'}: {exc.strerror}",
                             path=_name_of(target)) from exc
        self._state = "open"

    def add(self, name: str, tensor) -> None:
        """Write one tensor (array, buffer, ``__array__`` object or RawTensor)."""
        self._require_state("open", "add")
        if name in self._names:
            raise LayoutError(f"tensor {name!r} was already added")
        item = as_input(name, tensor)
        data = _as_bytes(item.data) if item.nbytes else memoryview(b"")
        try:
            _Sink(fd=self._spool.fileno())._write_all(data)
        except OSError as exc:
            raise AprIOError(f"cannot spool tensor {name!r}: {exc.strerror or exc}",
                             path=_name_of(self._target)) from exc
        self._items.append(_Spooled(item, self._size, crc32(data)))
        self._names.add(name)
        self._size += item.nbytes

    def close(self) -> None:
        """Assemble and commit the file."""
        if self._state == "closed":
            return
        self._require_state("open", "close")
        self._state = "closing"
        try:
            plan = layouts.plan(self._items, self._metadata, layout=self._layout, alignment=self._alignment)
            self._emit(plan)
        finally:
            self._state = "closed"
            self._spool.close()

    def abort(self) -> None:
        """Discard everything added; the target is left as it was."""
        self._state = "closed"
        self._spool.close()

    def _emit(self, plan) -> None:
        spool_fd = self._spool.fileno()
        _emit_to(self._target, lambda sink: write_plan(plan, sink, spool_fd=spool_fd), self._durable,
                 plan.total_size)

    def _require_state(self, state, action):
        if self._state != state:
            raise AprError(f"Writer.{action}() called on a {self._state} writer")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False
