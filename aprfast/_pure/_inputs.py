"""Writer inputs, the pure twin of ``aprfast._inputs``: values reduced to what a layout
stores (name, dtype, shape, bytes)."""

from __future__ import annotations

import numpy as np

_ndarray = np.ndarray


class TensorInput:
    """A writer input: dtype, shape and C-order little-endian bytes (``data``: any
    contiguous buffer of ``nbytes`` bytes)."""

    __slots__ = ("name", "dtype", "shape", "data", "nbytes")

    def __init__(self, name, dtype, shape, data, nbytes):
        if not isinstance(shape, tuple):
            raise TypeError(f"Argument 'shape' has incorrect type (expected tuple, got {type(shape).__name__})")
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.data = data
        self.nbytes = nbytes.__index__()

    def __repr__(self):
        return f"TensorInput({self.name!r}, {self.dtype.name}, shape={list(self.shape)}, nbytes={self.nbytes})"


def inputs_of(tensors, native, fallback):
    """TensorInputs for a name -> value mapping; ``native`` maps NumPy dtypes whose
    bytes are stored as they are, ``fallback(name, value)`` handles everything else."""
    out = []
    for name, value in tensors.items():
        if type(value) is _ndarray and type(name) is str:
            dtype = native.get(value.dtype)
            if dtype is not None and value.flags.c_contiguous:
                out.append(TensorInput(name, dtype, value.shape, value, value.nbytes))
                continue
        out.append(fallback(name, value))
    return out


def storage_keys(inputs):
    """For each input, ``(address, nbytes, dtype, shape)`` of its bytes, or None when it
    has none in memory (empty, spooled, not a contiguous buffer)."""
    out = []
    for t in inputs:
        data = getattr(t, "data", None)  # a spooled Writer's tensors are on disk, never shared
        if data is None or not t.nbytes:
            out.append(None)
            continue
        address = _address(data)
        out.append(None if address is None else (address, t.nbytes, t.dtype, t.shape))
    return out


def _address(data):
    """Where a contiguous buffer's bytes start, or None for anything else."""
    try:
        view = memoryview(data)
    except (TypeError, BufferError, ValueError):
        return None
    if not (view.c_contiguous or view.f_contiguous):
        return None
    try:
        return np.asarray(view).__array_interface__["data"][0]  # NumPy wraps it without copying
    except (TypeError, ValueError, NotImplementedError):
        if not view.c_contiguous:
            return None
        return np.frombuffer(view.cast("B"), np.uint8).__array_interface__["data"][0] if view.nbytes else None
