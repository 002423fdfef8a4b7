"""Aligned buffers and bulk I/O, the pure twin of ``aprfast._memory``.

Python 3.11 cannot give a class of its own the buffer protocol, so
:class:`AlignedBuffer` is a one-dimensional uint8 ndarray over exactly the aligned bytes
of a larger block: a bytearray below 128 KiB, an anonymous mapping above (page aligned,
and from 32 MiB on 2 MiB aligned and advised for huge pages, as csrc/buffers.c does).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys
import threading

import numpy as np

from ._crc import crc32
from ._views import check_int, check_uint, typed_view
from ._views import default_threads as _default_threads

#: Buffers of this many bytes and more are mapped, 2 MiB aligned (csrc/buffers.h).
MAP_THRESHOLD = 32 << 20
HUGE_PAGE = 2 << 20
#: From here on a buffer is an anonymous mapping of its own, as glibc's malloc makes it
#: (and, as the compiled allocator's memory, outside what tracemalloc counts).
_OWN_MAPPING = 128 << 10
_PAGE = mmap.PAGESIZE
_MAX_ALIGNMENT = 4096

LZ4_MAX_RATIO = 255
LZ4_SLACK = 24


class AlignedBuffer(np.ndarray):
    """A writable byte buffer whose first byte is aligned to ``alignment``."""

    def __new__(cls, size, alignment=64, *, filled_by_read=False):
        # filled_by_read: the compiled module populates a fresh block during the read that
        # fills it; here pages fault in as the read writes them either way
        size = check_uint(size, 64, "size_t")
        alignment = check_uint(alignment, 64, "size_t")
        if alignment == 0 or (alignment & (alignment - 1)) or alignment > _MAX_ALIGNMENT:
            raise ValueError(f"alignment must be a power of two up to 4096, not {alignment}")
        if size > sys.maxsize:
            raise MemoryError(f"cannot allocate {size} bytes: more than a buffer can address")
        mapped = size >= MAP_THRESHOLD
        step = HUGE_PAGE if mapped else alignment if size < _OWN_MAPPING else _PAGE
        try:
            block = _mapped_block(size + step, mapped) if size >= _OWN_MAPPING else bytearray(size + step)
            address = ctypes.addressof(ctypes.c_ubyte.from_buffer(block)) if size + step else 0
        except (MemoryError, OverflowError, OSError) as exc:
            raise MemoryError(f"cannot allocate {size} bytes aligned to {alignment} ({exc})") from None
        # The aligned bytes as an object of their own, so that NumPy, which collapses a
        # chain of views to the object at its bottom, finds exactly these bytes there.
        region = (ctypes.c_ubyte * size).from_buffer(block, -address % step)
        self = np.frombuffer(region, np.uint8).view(cls)
        self.alignment = alignment
        self._mapped = mapped
        return self

    def __array_finalize__(self, obj):
        # Slices and views of a buffer are plain byte views: no alignment promise.
        self.alignment = 1
        self._mapped = False

    def __reduce__(self):
        raise TypeError("an AlignedBuffer is not picklable")

    @property
    def address(self) -> int:
        """The start address (for alignment checks)."""
        return self.ctypes.data

    @property
    def huge_page_backed(self) -> bool:
        """True when the buffer was mapped on a 2 MiB boundary (huge pages advised)."""
        return self._mapped


#: Freed buffers of at least this many bytes are kept for reuse by the compiled
#: allocator (csrc/buffers.h); here Python's allocator and the OS do the reusing.
BUFFER_CACHE_MIN = 256 << 10
BUFFER_CACHE_RESIDENT = 256 << 20


def buffer_cache_stats() -> dict:
    """The cache of freed buffers: this backend keeps none."""
    return {"blocks": 0, "bytes": 0, "resident": 0, "limit": 0, "heap_bytes": 0, "heap_limit": 0, "hits": 0,
            "misses": 0, "deferred": 0, "decay_ms": 0}


def set_buffer_decay(ms) -> None:
    """Nothing is cached here; ``ms`` is checked as the compiled module checks it."""
    if ms < 0:
        raise ValueError("the buffer decay is a number of milliseconds >= 0")


def huge_pages_state() -> str:
    """This backend always advises huge pages for large buffers (and times nothing)."""
    return "untried"


#: The staging modes of the compiled module's io_uring direct reads.
STAGING_MODES = ("auto", "always", "never", "ring")
_staging = ["auto"]


def set_direct_staging(mode):
    """Checked and remembered as the compiled module does; this backend's direct reads
    (plain reads through an aligned bounce buffer) have no staging to change.

    Raises:
        ValueError: ``mode`` is not one of :data:`STAGING_MODES`.
    """
    if mode not in STAGING_MODES:
        raise ValueError(f"set_direct_staging: no mode {mode!r}; known: {', '.join(STAGING_MODES)}")
    old, _staging[0] = _staging[0], mode
    return old


def direct_stages_every_piece(fd: int) -> bool:
    """Always False: this backend stages nothing."""
    return False


def direct_staged_last() -> int:
    """Always 0: this backend stages nothing."""
    return 0


#: The compiled module's slow mark of a huge page in a direct read's destination (ns).
HUGE_SLOW_DIRECT_NS = 2_500_000


def huge_page_choices(step_ns, step=2 << 20, slow_ns=0):
    """This backend times nothing and makes no page-size choice.

    Raises:
        ValueError: ``step`` is 0.
        OSError: always (as the compiled module does on a platform without the choice).
    """
    check_uint(step, 64, "size_t")
    if step == 0:
        raise ValueError("huge_page_choices: step must be at least one byte")
    raise OSError("huge_page_choices: no page-size choice is made by the pure backend")


def fresh_population(reset=False):
    """This backend populates nothing ahead: every count is zero.

    Examples:
        >>> fresh_population()["huge_bytes"]
        0
    """
    return {"huge_bytes": 0, "huge_seconds": 0.0, "small_bytes": 0, "small_seconds": 0.0}


def release_buffer_cache(limit=None, heap_limit=None) -> None:
    """Nothing is cached here; ``limit`` and ``heap_limit`` are checked as the compiled
    module checks them."""
    if (limit is not None and limit < 0) or (heap_limit is not None and heap_limit < 0):
        raise ValueError("the buffer cache limit is a number of bytes >= 0")


def _mapped_block(size: int, huge: bool) -> mmap.mmap:
    """``size`` bytes of anonymous memory (page aligned), advised for huge pages if ``huge``."""
    # Private, as the compiled allocator maps: Python's default for an anonymous map is
    # MAP_SHARED, which is backed by shmem (slower to fault in, and THP works differently)
    private = getattr(mmap, "MAP_PRIVATE", None)
    area = mmap.mmap(-1, size) if private is None else mmap.mmap(-1, size, flags=private)
    if huge and hasattr(mmap, "MADV_HUGEPAGE") and "madvise" not in _forced:
        try:
            area.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # advice only: kernels without transparent huge pages refuse it
            pass
    return area


def pread_into(fd, offset, dst, threads=0, crc=None):
    """Fill ``dst`` from ``fd`` at ``offset``; return the running CRC if ``crc`` is given.

    Raises EOFError if the file ends first and OSError for read errors."""
    fd = check_int(fd, 32, "int")
    offset = check_uint(offset, 64, "unsigned PY_LONG_LONG")
    out = typed_view(dst, np.uint8, writable=True)
    value = None if crc is None else check_uint(crc, 32, "uint32_t")
    n = out.shape[0]
    if n == 0:
        return value
    view = memoryview(out)
    done = 0
    while done < n:
        got = _pread_some(fd, view[done:], offset + done)
        if got == 0:
            raise EOFError(f"file ended before {n} bytes at offset {offset} were read")
        done += got
    return None if value is None else crc32(view, value)


class BackgroundRead:
    """``pread_into`` started now, its result taken by :meth:`wait`.  The compiled module
    reads on a thread of its own meanwhile; here the read is done in the constructor,
    on the calling thread, by ``pread_into`` itself, so :meth:`wait` only reports it.

    Args:
        fd: The descriptor to read.
        offset: The file offset of ``dst``'s first byte.
        dst: A writable, contiguous byte buffer, filled entirely.
        threads: Threads for the read (one here, whatever is asked).
        crc: The running CRC to continue over the bytes read, or None for none.

    Raises:
        OverflowError: ``crc`` is not a 32-bit unsigned value.

    Examples:
        >>> import tempfile, zlib
        >>> fh = tempfile.TemporaryFile(buffering=0)
        >>> _ = fh.write(b"0123456789")
        >>> out = bytearray(4)
        >>> read = BackgroundRead(fh.fileno(), 3, out, crc=0)
        >>> read.wait() == zlib.crc32(b"3456"), bytes(out)
        (True, b'3456')
        >>> fh.close()
    """

    def __init__(self, fd, offset, dst, threads=0, crc=None):
        self._result = self._error = None
        try:
            self._result = pread_into(fd, offset, dst, threads, crc)
        except (EOFError, OSError) as exc:  # raised by wait(), where the compiled module raises it
            self._error = exc

    def wait(self):
        """The running CRC if ``crc`` was given, else None; the same on every call.

        Raises:
            EOFError: The file ended before ``dst`` was filled.
            OSError: The read failed.
        """
        error = self._error
        if error is not None:
            raise type(error)(*error.args)  # a fresh one each call: no traceback piling up
        return self._result


def pread_to_bytes(fd, offset, n, threads=0, crc=None):
    """(a new ``bytes`` of the ``n`` bytes of ``fd`` at ``offset``, the running CRC over
    them if ``crc`` is given, else None).  Raises EOFError if the file ends first."""
    fd = check_int(fd, 32, "int")
    offset = check_uint(offset, 64, "unsigned PY_LONG_LONG")
    n = check_int(n, 64, "Py_ssize_t")
    if n < 0:
        raise ValueError(f"pread_to_bytes: cannot read {n} bytes")
    value = None if crc is None else check_uint(crc, 32, "uint32_t")
    out = bytearray(n)
    value = pread_into(fd, offset, out, threads, value)
    return bytes(out), value


def _pread_some(fd: int, into: memoryview, at: int) -> int:
    if "pread" in _forced or not hasattr(os, "pread"):
        return _seek_read(fd, into[:_CHUNK], at)
    while True:
        try:
            if hasattr(os, "preadv"):
                return os.preadv(fd, [into], at)
            data = os.pread(fd, len(into), at)
            into[:len(data)] = data
            return len(data)
        except InterruptedError:  # pragma: no cover - PEP 475 retries already
            continue


# Without pread (Windows, or the fallback forced): one lock for every descriptor, since
# a descriptor shares its position with each dup of it; the position is put back.
_seek_lock = threading.Lock()
_CHUNK = 1 << 20


def _seek_read(fd: int, into: memoryview, at: int) -> int:
    with _seek_lock:
        position = os.lseek(fd, 0, os.SEEK_CUR)
        try:
            os.lseek(fd, at, os.SEEK_SET)
            data = os.read(fd, len(into))
        finally:
            os.lseek(fd, position, os.SEEK_SET)
    into[:len(data)] = data
    return len(data)


#: The engines ``pread_direct`` takes by name; this backend reads with one thread whatever
#: is named (it has no io_uring).
DIRECT_ENGINES = ("auto", "io_uring", "threads")


def pread_direct(fd, offset, dst, threads=0, crc=None, align=4096, engine="auto", depth=0, chunk=0):
    """``pread_into`` for a descriptor opened with ``O_DIRECT``: every read is of whole
    ``align``-aligned blocks into an aligned bounce buffer, then copied into ``dst``.
    ``engine``, ``depth`` and ``chunk`` are checked and otherwise ignored: the one
    engine here is a thread's plain reads ("threads").
    Raises EOFError if the file ends first and OSError for read errors."""
    if not isinstance(engine, str):
        raise TypeError(f"Argument 'engine' has incorrect type (expected str, got {type(engine).__name__})")
    if engine not in DIRECT_ENGINES:
        raise ValueError(f"pread_direct: no engine {engine!r}; known: {', '.join(DIRECT_ENGINES)}")
    check_uint(depth, 32, "unsigned int")
    check_uint(chunk, 64, "size_t")
    fd = check_int(fd, 32, "int")
    offset = check_uint(offset, 64, "unsigned PY_LONG_LONG")
    align = check_uint(align, 64, "size_t")
    out = typed_view(dst, np.uint8, writable=True)
    value = None if crc is None else check_uint(crc, 32, "uint32_t")
    n = out.shape[0]
    if n == 0:
        return value
    if align == 0 or align & (align - 1) or align > _DIRECT_CHUNK:
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
    bounce = mmap.mmap(-1, _DIRECT_CHUNK + 2 * align)  # page aligned
    try:
        with memoryview(bounce) as view:
            _direct_chunks(fd, offset, out, view, align)
    finally:
        bounce.close()
    return None if value is None else crc32(out, value)


def direct_engine_last():
    """The engine the last ``pread_direct`` used: always "threads" here."""
    return "threads"


def uring_available():
    """False: the pure backend has no io_uring."""
    return False


class UringWriter:
    """The compiled backend's direct writes on an io_uring ring: the pure backend has
    no ring, so constructing one raises ``NotImplementedError`` (DirectWriter then keeps
    its writing threads)."""

    def __init__(self, fd, offset=0, chunk=0, depth=0, helper=None):
        raise NotImplementedError("no io_uring ring can be set up here (the pure backend)")

    def write(self, data, crc=None):
        """Never reached: see the class."""
        raise NotImplementedError

    def flush(self, align=4096):
        """Never reached: see the class."""
        raise NotImplementedError

    def close(self):
        """Nothing to release."""


def page_cache_sample(fd, size, samples=16):
    """How many sampled pages are in the page cache: None here (the pure backend has no
    mincore), so ``backend="auto"`` keeps buffered reads."""
    check_int(fd, 32, "int")
    check_uint(size, 64, "unsigned PY_LONG_LONG")
    check_int(samples, 32, "int")
    return None


_DIRECT_CHUNK = 4 << 20


def _direct_chunks(fd, offset, out, view, align) -> None:
    """Fill ``out`` from ``offset`` through the aligned bounce buffer ``view``."""
    n = out.shape[0]
    done = 0
    while done < n:
        at = offset + done
        start = at - at % align
        want = min(n - done, _DIRECT_CHUNK - (at - start))
        span = -(-(at - start + want) // align) * align
        got = 0
        while got < span:
            step = os.preadv(fd, [view[got:span]], start + got)
            got += step
            # the end of the file, or where it ended then (a file being appended to can
            # end mid-block): reading on from off the alignment would be refused
            if step == 0 or got % align:
                break
        if got < at - start + want:
            raise EOFError(f"file ended before {n} bytes at offset {offset} were read")
        out[done:done + want] = view[at - start:at - start + want]
        done += want


def pread_some(fd, offset, dst) -> int:
    """One positional read into the start of ``dst`` (at most 1 MiB): the bytes read,
    0 at the end of the file."""
    fd = check_int(fd, 32, "int")
    offset = check_uint(offset, 64, "unsigned PY_LONG_LONG")
    out = typed_view(dst, np.uint8, writable=True)
    if out.shape[0] == 0:
        return 0
    return _pread_some(fd, memoryview(out)[:_CHUNK], offset)


def copy_into(dst, src, threads=0) -> None:
    """Copy ``src`` into ``dst`` (same length)."""
    out = typed_view(dst, np.uint8, writable=True)
    source = typed_view(src, np.uint8)
    if out.shape[0] != source.shape[0]:
        raise ValueError(f"copy_into: destination holds {out.shape[0]} bytes, source has {source.shape[0]}")
    out[:] = source


def copy_range(src, offset, size, alignment=64, threads=0):
    """A new AlignedBuffer holding bytes ``[offset, offset + size)`` of ``src``."""
    source = typed_view(src, np.uint8)
    if offset < 0 or size < 0 or offset > source.shape[0] or size > source.shape[0] - offset:
        raise ValueError(f"copy_range: bytes {offset}..{offset + size} lie outside a buffer of {source.shape[0]}")
    out = AlignedBuffer(size, alignment)
    typed_view(out, np.uint8, writable=True)[:] = source[offset:offset + size]
    return out


def copy_to_bytes(src, threads=0) -> bytes:
    """``bytes(src)``."""
    return typed_view(src, np.uint8).tobytes()


def preallocate(fd, size) -> int:
    """Reserve ``size`` bytes for ``fd``; 0 or an errno value (ENOSYS where the OS has no call)."""
    fd = check_int(fd, 32, "int")
    size = check_uint(size, 64, "unsigned PY_LONG_LONG")
    if not hasattr(os, "posix_fallocate") or "fallocate" in _forced:
        return errno.ENOSYS
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        return exc.errno or errno.EIO
    return 0


#: The paths a fallback can be forced on (aprfast.io.platform; docs/PORTABILITY.md).
FALLBACKS = {"pread": 1, "fallocate": 2, "madvise": 4, "io_uring": 8}
_forced: frozenset = frozenset()


def set_fallbacks(names) -> None:
    """Take the fallback path of each named call ("pread": lseek + read under a lock,
    "fallocate": no preallocation, "madvise": no memory advice, "io_uring": no ring,
    which this backend never has), as on a platform without it; an empty set restores
    the normal paths."""
    global _forced
    names = list(names)
    for name in names:
        if name not in FALLBACKS:
            raise ValueError(f"no C fallback named {name!r}; known: {', '.join(sorted(FALLBACKS))}")
    _forced = frozenset(names)


def fallbacks() -> frozenset:
    """The names of the fallbacks in force."""
    return _forced


def default_threads() -> int:
    """Threads used when ``threads=0``: the online cores."""
    return _default_threads()


def append_padded(out, data, pad) -> int:
    """Append the bytes of buffer ``data`` and ``pad`` zero bytes to ``out``; return len(data)'s bytes."""
    if not isinstance(out, bytearray):
        raise TypeError(f"Argument 'out' has incorrect type (expected bytearray, got {type(out).__name__})")
    view = memoryview(data)
    if not view.c_contiguous:
        raise ValueError("append_padded needs a C-contiguous buffer")
    if pad < 0:
        raise SystemError("negative size passed to PyByteArray_Resize")
    out += view.cast("B") if view.nbytes and view.format != "B" else view
    out += bytes(pad)
    return view.nbytes


_LZ4_ERRORS = {-1: "the block ends inside a sequence", -2: "the block describes more bytes than declared",
               -3: "a match refers to before the start of the output",
               -4: "the block ends before the declared size is reached"}


def lz4_block_decode_into(src, dst):
    """Decode one raw LZ4 block into exactly all of ``dst``; None on success, else a
    message saying what was wrong and at which input byte."""
    from ._lz4block import decode

    source = typed_view(src, np.uint8)
    out = typed_view(dst, np.uint8, writable=True)
    n, m = source.shape[0], out.shape[0]
    if n == 0:
        return None if m == 0 else "the block is empty"
    rc, where = decode(memoryview(source), memoryview(out))
    if rc == 0:
        return None
    return f"{_LZ4_ERRORS.get(rc, rc)} (at input byte {where} of {n})"


def uninitialised_bytearray(n) -> bytearray:
    """A bytearray of ``n`` bytes for a decoder to fill (zeroed here: Python cannot skip it)."""
    n = check_int(n, 64, "Py_ssize_t")
    if n < 0:
        raise SystemError("Negative size passed to PyByteArray_FromStringAndSize")
    return bytearray(n)


def resize_bytearray(out, n) -> None:
    """Grow or shrink ``out`` in place to ``n`` bytes."""
    if not isinstance(out, bytearray):
        raise TypeError(f"Argument 'out' has incorrect type (expected bytearray, got {type(out).__name__})")
    n = check_int(n, 64, "Py_ssize_t")
    if n < 0:
        raise ValueError("Can only resize to positive sizes")
    if n < len(out):
        del out[n:]
    else:
        out.extend(bytes(n - len(out)))
