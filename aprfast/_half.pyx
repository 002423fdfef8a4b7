# cython: language_level=3, freethreading_compatible=True
"""float32 <-> float16 / bfloat16 conversion into caller-provided arrays, GIL released.

The kernels in csrc/half.c pick F16C/AVX2, AVX-512 (with or without AVX512-BF16),
NEON or a portable integer path at run time and split large arrays over threads.
Results equal NumPy's ``astype(np.float16)`` / ``astype(np.float32)`` and
``ml_dtypes.bfloat16`` conversions bit for bit, NaN payloads included (see
csrc/half.h).  Halves travel as their ``uint16`` bit patterns: pass
``arr.view(np.uint16)`` for a float16 or bfloat16 array.
"""

cimport cython
from libc.stdint cimport uint16_t

cdef extern from "half.h" nogil:
    void apr_f32_to_f16(int path, const float *src, uint16_t *dst, size_t n, int nthreads)
    void apr_f16_to_f32(int path, const uint16_t *src, float *dst, size_t n, int nthreads)
    void apr_f32_to_bf16(int path, const float *src, uint16_t *dst, size_t n, int nthreads)
    void apr_bf16_to_f32(int path, const uint16_t *src, float *dst, size_t n, int nthreads)
    int apr_half_path_available(int path)
    int apr_half_best_path()
    const char *apr_half_path_name(int path)
    int apr_half_default_threads()
    int APR_HALF_PATH_COUNT

# Kernel names as the C side reports them, plus "auto".
PATHS = {apr_half_path_name(i).decode(): i for i in range(APR_HALF_PATH_COUNT)}
PATHS["auto"] = -1

# Below this a conversion takes about a microsecond, and releasing the GIL
# would risk waiting for another thread's switch interval to get it back.
cdef size_t NOGIL_MIN = 4096


cdef int _path_id(path) except -2:
    if path is None:
        return -1
    try:
        pid = PATHS[path]
    except (KeyError, TypeError):
        raise ValueError(f"unknown conversion path {path!r}; known: {', '.join(PATHS)}") from None
    if pid >= 0 and not apr_half_path_available(pid):
        raise ValueError(f"conversion path {path!r} is not available on this CPU")
    return pid


cdef int _check_lengths(str name, size_t n_src, size_t n_out) except -1:
    if n_src != n_out:
        raise ValueError(f"{name}: out holds {n_out} elements, src has {n_src}")
    return 0


cdef int _check_disjoint(str name, const void *src, size_t src_bytes, const void *out,
                         size_t out_bytes) except -1:
    # A kernel writes out while still reading src further on (and threads
    # write their pieces at the same time), so any overlap corrupts results.
    cdef size_t s = <size_t>src, o = <size_t>out
    if s < o + out_bytes and o < s + src_bytes:
        raise ValueError(f"{name}: src and out overlap")
    return 0


@cython.boundscheck(False)
@cython.wraparound(False)
def f32_to_f16(const float[::1] src, uint16_t[::1] out, *, int threads=0, path=None):
    """Round float32 ``src`` to float16 bits in ``out`` (same length); as ``astype(np.float16)``.

    ``threads`` caps the threads used for large arrays (0 = all online cores);
    ``path`` forces a kernel (see ``available_paths()``).
    """
    cdef int pid = _path_id(path)
    cdef size_t n = src.shape[0]
    _check_lengths("f32_to_f16", n, out.shape[0])
    if n == 0:
        return
    _check_disjoint("f32_to_f16", &src[0], n * 4, &out[0], n * 2)
    if n < NOGIL_MIN:
        apr_f32_to_f16(pid, &src[0], &out[0], n, 1)
        return
    with nogil:
        apr_f32_to_f16(pid, &src[0], &out[0], n, threads)


@cython.boundscheck(False)
@cython.wraparound(False)
def f16_to_f32(const uint16_t[::1] src, float[::1] out, *, int threads=0, path=None):
    """Widen float16 bits ``src`` to float32 ``out`` (same length), exactly."""
    cdef int pid = _path_id(path)
    cdef size_t n = src.shape[0]
    _check_lengths("f16_to_f32", n, out.shape[0])
    if n == 0:
        return
    _check_disjoint("f16_to_f32", &src[0], n * 2, &out[0], n * 4)
    if n < NOGIL_MIN:
        apr_f16_to_f32(pid, &src[0], &out[0], n, 1)
        return
    with nogil:
        apr_f16_to_f32(pid, &src[0], &out[0], n, threads)


@cython.boundscheck(False)
@cython.wraparound(False)
def f32_to_bf16(const float[::1] src, uint16_t[::1] out, *, int threads=0, path=None):
    """Round float32 ``src`` to bfloat16 bits in ``out``; as ``astype(ml_dtypes.bfloat16)``."""
    cdef int pid = _path_id(path)
    cdef size_t n = src.shape[0]
    _check_lengths("f32_to_bf16", n, out.shape[0])
    if n == 0:
        return
    _check_disjoint("f32_to_bf16", &src[0], n * 4, &out[0], n * 2)
    if n < NOGIL_MIN:
        apr_f32_to_bf16(pid, &src[0], &out[0], n, 1)
        return
    with nogil:
        apr_f32_to_bf16(pid, &src[0], &out[0], n, threads)


@cython.boundscheck(False)
@cython.wraparound(False)
def bf16_to_f32(const uint16_t[::1] src, float[::1] out, *, int threads=0, path=None):
    """Widen bfloat16 bits ``src`` to float32 ``out`` (same length), exactly."""
    cdef int pid = _path_id(path)
    cdef size_t n = src.shape[0]
    _check_lengths("bf16_to_f32", n, out.shape[0])
    if n == 0:
        return
    _check_disjoint("bf16_to_f32", &src[0], n * 2, &out[0], n * 4)
    if n < NOGIL_MIN:
        apr_bf16_to_f32(pid, &src[0], &out[0], n, 1)
        return
    with nogil:
        apr_bf16_to_f32(pid, &src[0], &out[0], n, threads)


def available_paths():
    """Names of the conversion kernels this CPU can run (``portable`` first)."""
    return [apr_half_path_name(pid).decode() for pid in range(APR_HALF_PATH_COUNT)
            if apr_half_path_available(pid)]


def best_path():
    """Name of the kernel used when ``path`` is None."""
    return apr_half_path_name(apr_half_best_path()).decode()


def default_threads():
    """The most threads ``threads=0`` uses: the online cores (fewer while other processes
    keep cores busy; one below 2 Mi elements)."""
    return apr_half_default_threads()
