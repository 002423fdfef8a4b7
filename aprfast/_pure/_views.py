"""Buffer arguments as the compiled modules' typed memoryviews take them.

A Cython parameter declared ``const float[::1] src`` accepts any one-dimensional
C-contiguous buffer whose items are float32 and refuses everything else with
ValueError (BufferError for an object that is no buffer at all); a non-const one also
refuses a read-only buffer.  These helpers apply the same rules and return a NumPy
view on the caller's memory (never a copy), so a twin writes where the C would.
"""

from __future__ import annotations

import os

import numpy as np

_NAMES = {np.dtype(np.uint8): "uint8_t", np.dtype(np.int8): "int8_t", np.dtype(np.uint16): "uint16_t",
          np.dtype(np.int64): "int64_t", np.dtype(np.uint64): "uint64_t", np.dtype(np.float32): "float"}


def typed_view(obj, dtype, *, writable: bool = False) -> np.ndarray:
    """``obj`` as a 1-D ndarray of ``dtype`` sharing its memory, or ValueError/TypeError
    as Cython's ``dtype[::1]`` argument conversion gives."""
    dtype = np.dtype(dtype)
    if obj is None:
        raise TypeError(f"a {_NAMES.get(dtype, dtype.name)} buffer is required, not None")
    view = memoryview(obj)  # TypeError for a non-buffer, as Cython
    if view.ndim != 1:
        raise ValueError(f"Buffer has wrong number of dimensions (expected 1, got {view.ndim})")
    if not view.c_contiguous:
        raise ValueError("ndarray is not C-contiguous")
    if writable and view.readonly:
        raise ValueError("buffer source array is read-only")
    found = _item_dtype(view)
    if found is None or found.kind != dtype.kind or found.itemsize != dtype.itemsize:
        raise ValueError(f"Buffer dtype mismatch, expected '{_NAMES.get(dtype, dtype.name)}' but got "
                         f"'{view.format}'")
    if view.nbytes == 0:
        return np.zeros(0, dtype)  # empty: nothing is read or written through it
    return np.frombuffer(view, dtype=found).view(dtype)


def _item_dtype(view: memoryview):
    fmt = view.format.lstrip("@=<")
    if fmt == "c":
        fmt = "B"  # Cython takes a char buffer for uint8_t
    try:
        found = np.dtype(fmt)
    except TypeError:
        return None
    return found if found.itemsize == view.itemsize else None


def check_uint(value, bits: int, name: str) -> int:
    """``value`` as a C unsigned integer of ``bits`` bits takes it (OverflowError outside)."""
    value = int(value.__index__()) if not isinstance(value, int) else value
    if value < 0:
        raise OverflowError(f"can't convert negative value to unsigned {name}")
    if value >> bits:
        raise OverflowError(f"value too large to convert to {name}")
    return value


def check_int(value, bits: int, name: str) -> int:
    """``value`` as a C signed integer of ``bits`` bits takes it (OverflowError outside)."""
    value = int(value.__index__()) if not isinstance(value, int) else value
    if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
        raise OverflowError(f"value too large to convert to {name}")
    return value


def default_threads() -> int:
    """The online cores (at most 64), as the C kernels count them for ``threads=0``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, 64))
