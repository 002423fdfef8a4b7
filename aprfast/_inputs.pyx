# cython: language_level=3, freethreading_compatible=True
"""Writer inputs: values reduced to what a layout stores (name, dtype, shape, bytes).

Saving 10,000 small tensors is dominated by per-tensor Python work, so the common
case, a C-contiguous native-endian ndarray of a known dtype, is handled here in one
compiled loop; anything else goes to the Python fallback in aprfast.tensors.
"""

import numpy as np

_ndarray = np.ndarray


cdef class TensorInput:
    """A writer input: dtype, shape and C-order little-endian bytes (``data``: any
    contiguous buffer of ``nbytes`` bytes)."""

    cdef readonly object name
    cdef readonly object dtype
    cdef readonly tuple shape
    cdef readonly object data
    cdef readonly Py_ssize_t nbytes

    def __init__(self, name, dtype, tuple shape, data, Py_ssize_t nbytes):
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.data = data
        self.nbytes = nbytes

    def __repr__(self):
        return f"TensorInput({self.name!r}, {self.dtype.name}, shape={list(self.shape)}, nbytes={self.nbytes})"


def inputs_of(tensors, dict native, fallback):
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


from cpython.buffer cimport PyBUF_ANY_CONTIGUOUS, PyBuffer_Release, PyObject_GetBuffer


def storage_keys(list inputs):
    """For each input, ``(address, nbytes, dtype, shape)`` of its bytes, or None when it
    has none in memory (empty, spooled, not a contiguous buffer): what makes two inputs
    one storage.  One buffer request per input in C; through NumPy it cost ~2 us each,
    25 ms for a 10,000-tensor save."""
    cdef Py_buffer view
    out = []
    for t in inputs:
        data = getattr(t, "data", None)  # a spooled Writer's tensors are on disk, never shared
        if data is None or not t.nbytes:
            out.append(None)
            continue
        try:
            PyObject_GetBuffer(data, &view, PyBUF_ANY_CONTIGUOUS)
        except (TypeError, BufferError, ValueError):
            out.append(None)
            continue
        address = <size_t>view.buf
        PyBuffer_Release(&view)
        out.append((address, t.nbytes, t.dtype, t.shape))
    return out
