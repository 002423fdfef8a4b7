from typing import Optional

from typing_extensions import Buffer

PATHS: dict[str, int]

def crc32(data: Buffer, value: int = 0, *, path: Optional[str] = None, threads: int = 0) -> int:
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

def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
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

def available_paths() -> list[str]: ...
def best_path() -> str: ...
