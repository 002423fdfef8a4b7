"""Page-cache residency of a file, and its eviction, for the cold-cache benchmarks.

A tiny ctypes binding of ``mincore(2)`` over a read-only shared map of the file (the
benchmarks check the cache independently of aprfast's own sampling in
aprfast.io.direct), and ``evict``: ``fsync`` then ``posix_fadvise(POSIX_FADV_DONTNEED)``
over the whole file, then a ``mincore`` count proving the pages are gone.  Linux only
(macOS has mincore but no POSIX_FADV_DONTNEED; there the cold rows are skipped).

    python benchmarks/pagecache.py FILE...     # resident pages of each file
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
import time

__all__ = ["resident", "evict", "EvictionFailed", "supported"]

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_libc.mincore.restype = ctypes.c_int
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mmap.restype = ctypes.c_void_p
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.munmap.restype = ctypes.c_int
_MAP_FAILED = ctypes.c_void_p(-1).value
PAGE = mmap.PAGESIZE


class EvictionFailed(RuntimeError):
    """The file's pages stayed in the page cache after fsync + POSIX_FADV_DONTNEED."""


def supported() -> str | None:
    """None when this platform can evict and count; else why not."""
    if not hasattr(os, "posix_fadvise"):
        return "no posix_fadvise on this platform (the cold rows need POSIX_FADV_DONTNEED)"
    if not hasattr(_libc, "mincore"):
        return "no mincore in the C library"
    return None


def resident(path) -> tuple:
    """(pages of ``path`` in the page cache, pages of the file)."""
    size = os.path.getsize(path)
    pages = (size + PAGE - 1) // PAGE
    if size == 0:
        return 0, 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec):
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            return sum(b & 1 for b in bytes(vec)), pages
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def resident_bytes(path) -> int:
    return resident(path)[0] * PAGE


def evict(path, tolerance: float = 0.001) -> None:
    """Write ``path`` back and drop it from the page cache; EvictionFailed if more than
    ``tolerance`` of its pages are still cached afterwards (another process holds them
    mapped and locked, or the filesystem ignores the advice)."""
    for attempt in range(5):
        # a read-ahead still in flight (a map's fault-around, an async read-ahead) brings
        # pages back after the advice: wait for it and advise again, a few times
        if attempt:
            time.sleep(0.02 * attempt)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        cached, pages = resident(path)
        if not pages or cached <= tolerance * pages:
            return
    if pages and cached > tolerance * pages:
        raise EvictionFailed(f"{path}: {cached} of {pages} pages still in the page cache after fsync + "
                             "POSIX_FADV_DONTNEED")


def evict_all(paths) -> None:
    for path in paths:
        if os.path.isdir(path):
            for name in sorted(os.listdir(path)):
                evict(os.path.join(path, name))
        else:
            evict(path)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        got, total = resident(arg)
        print(f"{arg}: {got} of {total} pages resident ({got / max(total, 1):.1%})")
