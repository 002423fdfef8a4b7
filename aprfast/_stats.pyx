# cython: language_level=3, boundscheck=False, wraparound=False, freethreading_compatible=True
"""Tensor statistics kernels' glue (csrc/stats.c), GIL released.

``compute`` and ``compute_quant`` take raw little-endian bytes and return a dict of
the C accumulator's fields (see csrc/stats.h); ``aprfast.stats`` turns that into a
:class:`~aprfast.stats.TensorStats`.  Histogram counts are added into the caller's
``uint64`` array.
"""

from libc.stddef cimport size_t
from libc.math cimport INFINITY, isfinite
from libc.stdint cimport int64_t, uint8_t, uint64_t

cdef extern from "stats.h" nogil:
    ctypedef struct apr_stats:
        uint64_t count, nan, pos_inf, neg_inf, zero, finite
        double min, max
        int64_t imin, imax
        uint64_t umin, umax
        double mean, m2
    ctypedef struct apr_hist:
        uint64_t *counts
        size_t bins
        double lo, hi, scale
        int divide
    int APR_STATS_MOMENTS
    int APR_STATS_HIST
    int APR_STATS_OK
    int APR_STATS_EKIND
    int APR_STATS_ESIZE
    int APR_STATS_ENOMEM
    int APR_STATS_EQUANT
    int apr_stats_compute(int kind, const void *data, size_t n, int want, const apr_hist *hist, int nthreads,
                          apr_stats *out)
    int apr_stats_quant(int qtype, const uint8_t *data, size_t nbytes, size_t rows, size_t row, int want,
                        const apr_hist *hist, int nthreads, apr_stats *out)
    int apr_stats_quant_finite(int qtype, const uint8_t *data, size_t nbytes, size_t rows, size_t row)
    int apr_stats_default_threads()

#: Kind names -> the C enum (csrc/stats.h), with their item sizes.
KINDS = {"F32": 0, "F64": 1, "F16": 2, "BF16": 3, "I8": 4, "I16": 5, "I32": 6, "I64": 7,
         "U8": 8, "U16": 9, "U32": 10, "U64": 11}
ITEMSIZE = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2, "I8": 1, "I16": 2, "I32": 4, "I64": 8,
            "U8": 1, "U16": 2, "U32": 4, "U64": 8}
MOMENTS = APR_STATS_MOMENTS
HIST = APR_STATS_HIST

# Below this, releasing the GIL costs more than the work.
cdef size_t NOGIL_MIN = 16384


cdef dict _as_dict(apr_stats *s):
    return {"count": s.count, "nan": s.nan, "pos_inf": s.pos_inf, "neg_inf": s.neg_inf, "zero": s.zero,
            "finite": s.finite, "min": s.min, "max": s.max, "imin": s.imin, "imax": s.imax,
            "umin": s.umin, "umax": s.umax, "mean": s.mean, "m2": s.m2}


cdef int _check(int rc, str what) except -1:
    if rc == APR_STATS_OK:
        return 0
    if rc == APR_STATS_ENOMEM:
        raise MemoryError(f"{what}: out of memory for the per-thread partial results")
    if rc == APR_STATS_ESIZE:
        raise ValueError(f"{what}: the byte count does not match the element count")
    if rc == APR_STATS_EQUANT:
        raise ValueError(f"{what}: the dequantizer refused a chunk")
    raise ValueError(f"{what}: unknown kind (code {rc})")


#: Most bins the kernels take (their bin numbers are int32).
MAX_BINS = 1 << 24


cdef int _hist_spec(apr_hist *h, uint64_t[::1] counts, double lo, double hi) except -1:
    # The scale is derived here, never taken from the caller: the kernels rely on
    # (v - lo) * scale staying within [0, bins] for every v in [lo, hi].
    if counts.shape[0] > MAX_BINS:
        raise ValueError(f"at most {MAX_BINS} bins, not {counts.shape[0]}")
    if not (isfinite(lo) and isfinite(hi) and lo < hi):
        raise ValueError(f"histogram range must be finite with lo < hi, not ({lo}, {hi})")
    h.bins = counts.shape[0]
    h.counts = &counts[0]
    h.lo, h.hi = lo, hi
    cdef double width = hi - lo
    cdef double scale = <double>h.bins / width if isfinite(width) else INFINITY
    h.divide = not (isfinite(width) and isfinite(scale) and scale > 0)
    h.scale = 0.0 if h.divide else scale
    return 0


cdef int _threads(int threads) except -1:
    if threads < 0:
        raise ValueError(f"threads must be 0 (all cores) or positive, not {threads}")
    return threads


def compute(str kind, const uint8_t[::1] data, int want, uint64_t[::1] counts=None, double lo=0.0,
            double hi=0.0, int threads=0):
    """Statistics of ``data`` (the bytes of a ``kind`` array); ``counts`` receives the
    histogram over [lo, hi] (its length is the bin count)."""
    cdef int k
    try:
        k = KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown statistics kind {kind!r}; known: {', '.join(KINDS)}") from None
    cdef int nthreads = _threads(threads)
    cdef size_t nbytes = data.shape[0], item = ITEMSIZE[kind]
    if nbytes % item:
        raise ValueError(f"{kind}: {nbytes} bytes is not a whole number of {item}-byte elements")
    cdef size_t n = nbytes // item
    cdef apr_hist h
    cdef apr_hist *hp = NULL
    if counts is not None and counts.shape[0]:
        _hist_spec(&h, counts, lo, hi)
        hp = &h
    elif want & APR_STATS_HIST:
        raise ValueError("a histogram needs counts")
    cdef apr_stats s
    cdef const void *p = <const void *>&data[0] if nbytes else NULL
    cdef int rc
    if n < NOGIL_MIN:
        rc = apr_stats_compute(k, p, n, want, hp, 1, &s)
    else:
        with nogil:
            rc = apr_stats_compute(k, p, n, want, hp, nthreads, &s)
    _check(rc, kind)
    return _as_dict(&s)


def compute_quant(int qtype, const uint8_t[::1] data, size_t rows, size_t row, int want,
                  uint64_t[::1] counts=None, double lo=0.0, double hi=0.0, int threads=0):
    """Statistics of a packed tensor of quant type id ``qtype`` (aprfast._quant.TYPES)."""
    cdef int nthreads = _threads(threads)
    cdef size_t nbytes = data.shape[0]
    cdef apr_hist h
    cdef apr_hist *hp = NULL
    if counts is not None and counts.shape[0]:
        _hist_spec(&h, counts, lo, hi)
        hp = &h
    elif want & APR_STATS_HIST:
        raise ValueError("a histogram needs counts")
    cdef apr_stats s
    cdef const uint8_t *p = &data[0] if nbytes else NULL
    cdef int rc
    with nogil:
        rc = apr_stats_quant(qtype, p, nbytes, rows, row, want, hp, nthreads, &s)
    _check(rc, f"quant type {qtype}")
    return _as_dict(&s)


def quant_finite(int qtype, const uint8_t[::1] data, size_t rows, size_t row):
    """True when every value of a packed tensor of quant type id ``qtype`` is finite,
    known from its blocks' float16 scales without decoding it; False when not known
    (another type, a non-finite scale, or bytes that do not fit: ``compute_quant``
    says what is wrong).  csrc/stats.h."""
    cdef size_t nbytes = data.shape[0]
    cdef const uint8_t *p = &data[0] if nbytes else NULL
    cdef int rc
    with nogil:
        rc = apr_stats_quant_finite(qtype, p, nbytes, rows, row)
    return rc == 1


def default_threads():
    """Threads used for ``threads=0``: the online cores."""
    return apr_stats_default_threads()
