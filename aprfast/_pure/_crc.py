"""CRC-32 (IEEE, reflected polynomial 0xEDB88320), the pure twin of ``aprfast._crc``.

``zlib.crc32`` is this CRC exactly (same polynomial, initial value and final xor), so
it is the kernel; ``crc32_combine`` is zlib's algorithm written out, since Python's
zlib does not expose it.
"""

from __future__ import annotations

import zlib

from ._views import check_uint

#: One kernel: zlib's.  "auto" picks it, as on the compiled side.
PATHS = {"portable": 0, "auto": -1}

_POLY = 0xEDB88320  # x^32 + x^26 + ... + 1, bit-reversed


def _check_path(path) -> None:
    if path is not None and path not in PATHS:
        raise ValueError(f"unknown CRC32 path {path!r}; known: {', '.join(PATHS)}")


def crc32(data, value=0, *, path=None, threads=0) -> int:
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
    check_uint(value, 32, "unsigned int")
    _check_path(path)
    return zlib.crc32(_byte_view(data), value)


def _byte_view(data):
    view = memoryview(data)
    if view.nbytes == 0:
        return b""
    if view.format in ("B", "b", "c") and view.ndim == 1 and view.c_contiguous:
        return view if view.format == "B" else view.cast("B")
    if not view.c_contiguous:
        raise ValueError("crc32 needs a C-contiguous buffer")
    return view.cast("B")


def _multmodp(a: int, b: int) -> int:
    """a * b modulo the CRC polynomial, both as reflected 32-bit polynomials."""
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> list:
    """x^(2^k) modulo the polynomial for k = 0..31 (x^1 is 1 << 30 reflected)."""
    table = [1 << 30]
    for _ in range(31):
        table.append(_multmodp(table[-1], table[-1]))
    return table


_X2N = _x2n_table()


def _x2nmodp(n: int, k: int) -> int:
    """x^(n * 2^k) modulo the polynomial."""
    p = 1 << 31  # x^0
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


def crc32_combine(crc1, crc2, len2) -> int:
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
    check_uint(crc1, 32, "unsigned int")
    check_uint(crc2, 32, "unsigned int")
    check_uint(len2, 64, "unsigned PY_LONG_LONG")
    return _multmodp(_x2nmodp(len2, 3), crc1) ^ crc2


def available_paths() -> list:
    """Names of the kernels that can run: zlib's, always."""
    return ["portable"]


def best_path() -> str:
    return "portable"
