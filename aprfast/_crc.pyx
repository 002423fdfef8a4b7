# cython: language_level=3, boundscheck=False, wraparound=False, freethreading_compatible=True
"""CRC-32 (IEEE, as zlib.crc32) over any contiguous buffer, GIL released.

The kernel in csrc/crc32.c picks PCLMULQDQ, VPCLMULQDQ/AVX-512, ARMv8 CRC or a
portable table path at run time; large buffers are split over threads and the
partial CRCs combined.
"""

from libc.stdint cimport uint8_t, uint32_t, uint64_t

import os

cdef extern from "crc32.h" nogil:
    uint32_t apr_crc32_parallel(int path, uint32_t crc, const uint8_t *buf, size_t len, int nthreads)
    uint32_t apr_crc32_combine(uint32_t crc1, uint32_t crc2, uint64_t len2)
    int apr_crc32_path_available(int path)
    int apr_crc32_best_path()
    const char *apr_crc32_path_name(int path)

# Kernel names as the C side reports them, plus short aliases.
PATHS = {apr_crc32_path_name(i).decode(): i for i in range(4)}
PATHS.update({"auto": -1, "vpclmul": 2, "armv8": 3})
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

# Releasing the GIL costs more than checksumming a few KiB.
cdef size_t NOGIL_MIN = 16384


cdef int _path_id(path) except -2:
    if path is None:
        return -1
    try:
        pid = PATHS[path]
    except KeyError:
        raise ValueError(f"unknown CRC32 path {path!r}; known: {', '.join(PATHS)}") from None
    if pid >= 0 and not apr_crc32_path_available(pid):
        raise ValueError(f"CRC32 path {path!r} is not available on this CPU")
    return pid


def crc32(data, unsigned int value=0, *, path=None, int threads=0):
    """CRC-32 of ``data`` continuing from ``value``; equals ``zlib.crc32(data, value)``.

    The IEEE CRC every ``.apr`` footer stores.  The compiled backend picks a PCLMULQDQ,
    VPCLMULQDQ/AVX-512, ARMv8 CRC or portable table kernel at run time, releases the
    GIL and splits large buffers over threads (docs/performance.md); the pure backend
    runs zlib's.

    Args:
        data: Any C-contiguous buffer (bytes, bytearray, memoryview, NumPy array).
        value: The CRC of the bytes before ``data`` (0 to start).
        path: A kernel to force ("portable", "pclmul", "vpclmul", "armv8"; the keys of
            ``aprfast._crc.PATHS`` are those this backend knows), or None for the best
            this CPU runs.
        threads: Most threads for large buffers (0: the cores idle at the call).

    Returns:
        The CRC-32, an int in ``[0, 2**32)``.

    Raises:
        ValueError: ``data`` is not C-contiguous, or ``path`` is unknown or not
            available on this CPU.
        OverflowError: ``value`` is not an unsigned 32-bit int.

    Examples:
        >>> import zlib, aprfast
        >>> aprfast.crc32(b"hello world") == zlib.crc32(b"hello world")
        True
        >>> hex(aprfast.crc32(b"world", aprfast.crc32(b"hello ")))
        '0xd4a1185'
    """
    cdef int pid = _path_id(path)
    cdef const uint8_t[::1] view = _byte_view(data)
    cdef size_t n = view.shape[0]
    cdef const uint8_t *ptr = &view[0] if n else <const uint8_t *>b""
    cdef uint32_t crc = value
    if threads < 0:
        threads = 0  # the default: the C driver takes the cores idle now
    if n < NOGIL_MIN:
        return apr_crc32_parallel(pid, crc, ptr, n, 1)
    with nogil:
        crc = apr_crc32_parallel(pid, crc, ptr, n, threads)
    return crc


def crc32_combine(unsigned int crc1, unsigned int crc2, unsigned long long len2):
    """CRC of A||B from crc32(A), crc32(B) and len(B), without reading A or B.

    How a writer that checksums pieces separately (in parallel, or as they are spooled)
    gets the CRC of the whole: crc1 shifted over len2 zero bytes, xor crc2.

    Args:
        crc1: ``crc32(A)``.
        crc2: ``crc32(B)``.
        len2: ``len(B)`` in bytes.

    Returns:
        ``crc32(A + B)``.

    Raises:
        OverflowError: A CRC is not an unsigned 32-bit int, or ``len2`` is negative.

    Examples:
        >>> import aprfast
        >>> a, b = b"hello ", b"world"
        >>> aprfast.crc32_combine(aprfast.crc32(a), aprfast.crc32(b), len(b)) == aprfast.crc32(a + b)
        True
    """
    return apr_crc32_combine(crc1, crc2, len2)


def available_paths():
    """Names of the CRC32 kernels this CPU can run, best last."""
    return [apr_crc32_path_name(pid).decode() for pid in range(4) if apr_crc32_path_available(pid)]


def best_path():
    """Name of the kernel ``crc32`` uses by default."""
    return apr_crc32_path_name(apr_crc32_best_path()).decode()


def _byte_view(data):
    view = memoryview(data)
    if view.nbytes == 0:
        return b""  # memoryview.cast refuses shapes with a zero in them
    if view.format in ("B", "b", "c") and view.ndim == 1 and view.c_contiguous:
        return view if view.format == "B" else view.cast("B")
    if not view.c_contiguous:
        raise ValueError("crc32 needs a C-contiguous buffer")
    return view.cast("B")
