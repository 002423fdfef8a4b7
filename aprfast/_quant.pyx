# cython: language_level=3, boundscheck=False, wraparound=False, freethreading_compatible=True
"""Quantize and dequantize tensors block by block, GIL released.

GGML types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, TQ1_0, TQ2_0, MXFP4 and the K-quants
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, IQ4_XS, IQ3_S and Q1_0 both ways; the other types gguf-py
knows, dequantize only) give the same bytes and floats as llama.cpp's gguf-py (ggml's reference C where
gguf-py has none: the K-quant, Q8_K, IQ4, IQ3_S and Q1_0 quantizers, and Q8_1, Q8_K and Q1_0's
dequantizers);
the APR types (APR_Q8, APR_Q4, APR_FQ8_0,
APR_FQ4_0) the same as aprender's Rust code; Q8_TENSOR is aprfast's per-tensor
int8 with a zero point.  The layouts are described in csrc/quant.h and
csrc/quant_ggml.h.

The kernels in csrc/quant.c pick AVX-512, AVX2 or portable C at run time (or
the ``path`` given) and split large inputs by whole blocks over ``threads``
threads (0 = all online cores).  Every function fills the ``out`` buffer it is
given and returns None; sizes are checked first and a mismatch raises
ValueError naming both numbers.
"""

from libc.stddef cimport size_t
from libc.stdint cimport uint8_t

cdef extern from "quant.h" nogil:
    int APR_QT_COUNT
    int APR_QUANT_PATH_COUNT
    int APR_QUANT_AUTO
    int APR_QUANT_OK
    int APR_QUANT_EUNKNOWN
    int APR_QUANT_ENOQUANTIZE
    int APR_QUANT_EBADCOUNT
    const char *apr_quant_type_name(int type)
    int apr_quant_block_info(int type, size_t *block_elems, size_t *block_bytes)
    size_t apr_quant_header_bytes(int type, size_t n)
    int apr_quant_allows_partial_block(int type)
    int apr_quant_can_quantize(int type)
    size_t apr_quant_nbytes(int type, size_t n)
    int apr_quantize(int type, const float *src, size_t n, uint8_t *dst, int nthreads, int path)
    int apr_dequantize(int type, const uint8_t *src, size_t n, float *dst, int nthreads, int path)
    int apr_quant_path_available(int path)
    int apr_quant_best_path()
    const char *apr_quant_path_name(int path)
    int apr_quant_default_threads()

cdef extern from "stdint.h":
    const size_t SIZE_MAX

# Type and path names as the C side reports them.
TYPES = {apr_quant_type_name(i).decode(): i for i in range(APR_QT_COUNT)}
PATHS = {apr_quant_path_name(i).decode(): i for i in range(APR_QUANT_PATH_COUNT)}
PATHS["auto"] = APR_QUANT_AUTO

# Releasing the GIL costs more than quantizing a few thousand floats.
cdef size_t NOGIL_MIN = 16384


cdef int _type_id(str type_name) except -1:
    try:
        return TYPES[type_name]
    except KeyError:
        raise ValueError(f"unknown quantization type {type_name!r}; known: {', '.join(TYPES)}") from None


cdef int _path_id(path) except -2:
    if path is None:
        return APR_QUANT_AUTO
    try:
        pid = PATHS[path]
    except KeyError:
        raise ValueError(f"unknown quantization path {path!r}; known: {', '.join(PATHS)}") from None
    if not apr_quant_path_available(pid):
        raise ValueError(f"quantization path {path!r} is not available on this CPU")
    return pid


cdef int _threads(int threads) except -1:
    if threads < 0:
        raise ValueError(f"threads must be 0 (all cores) or positive, not {threads}")
    return threads


cdef str _count_problem(int tid, size_t n):
    """Why n elements cannot be stored as this type, or None."""
    cdef size_t elems = 0, nbytes = 0
    apr_quant_block_info(tid, &elems, &nbytes)
    name = apr_quant_type_name(tid).decode()
    if not apr_quant_allows_partial_block(tid) and n % elems:
        return f"{name}: {n} elements is not a multiple of the block size {elems}"
    if apr_quant_nbytes(tid, n) == SIZE_MAX:
        return f"{name}: {n} elements take more bytes than a buffer can hold"
    return None


cdef int _quantize(int tid, const float[::1] src, uint8_t[::1] out, int threads, path) except -1:
    cdef int pid = _path_id(path)
    cdef int nthreads = _threads(threads)
    cdef size_t n = src.shape[0]
    name = apr_quant_type_name(tid).decode()
    if not apr_quant_can_quantize(tid):
        raise ValueError(f"{name} can be dequantized but not quantized")
    problem = _count_problem(tid, n)
    if problem is not None:
        raise ValueError(f"quantize {problem}")
    cdef size_t want = apr_quant_nbytes(tid, n)
    if <size_t>out.shape[0] != want:
        raise ValueError(f"quantize {name}: out holds {out.shape[0]} bytes, {n} elements need {want}")
    cdef const float *sp = &src[0] if n else NULL
    cdef uint8_t *dp = &out[0] if want else NULL
    cdef int rc
    if n < NOGIL_MIN:
        rc = apr_quantize(tid, sp, n, dp, 1, pid)
    else:
        with nogil:
            rc = apr_quantize(tid, sp, n, dp, nthreads, pid)
    if rc != APR_QUANT_OK:  # the checks above make this unreachable
        raise ValueError(f"quantize {name}: kernel refused {n} elements (code {rc})")
    return 0


def quantize(str type_name, const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """Quantize float32 ``src`` into ``out`` (``quantized_nbytes(type_name, len(src))`` bytes)."""
    _quantize(_type_id(type_name), src, out, threads, path)


def quantize_q8_0(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """GGML Q8_0, bit-identical to gguf-py (len(src) a multiple of 32; 34 bytes a block)."""
    _quantize(TYPES["Q8_0"], src, out, threads, path)


def quantize_q4_0(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """GGML Q4_0, bit-identical to gguf-py (len(src) a multiple of 32; 18 bytes a block)."""
    _quantize(TYPES["Q4_0"], src, out, threads, path)


def quantize_q4_1(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """GGML Q4_1, bit-identical to gguf-py (len(src) a multiple of 32; 20 bytes a block)."""
    _quantize(TYPES["Q4_1"], src, out, threads, path)


def quantize_q5_0(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """GGML Q5_0, bit-identical to gguf-py (len(src) a multiple of 32; 22 bytes a block)."""
    _quantize(TYPES["Q5_0"], src, out, threads, path)


def quantize_q5_1(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """GGML Q5_1, bit-identical to gguf-py (len(src) a multiple of 32; 24 bytes a block)."""
    _quantize(TYPES["Q5_1"], src, out, threads, path)


def quantize_tq1_0(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """GGML TQ1_0 (ternary), bit-identical to gguf-py (len(src) a multiple of 256; 54 bytes a block)."""
    _quantize(TYPES["TQ1_0"], src, out, threads, path)


def quantize_tq2_0(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """GGML TQ2_0 (ternary), bit-identical to gguf-py (len(src) a multiple of 256; 66 bytes a block)."""
    _quantize(TYPES["TQ2_0"], src, out, threads, path)


def quantize_mxfp4(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """GGML MXFP4, bit-identical to gguf-py (len(src) a multiple of 32; 17 bytes a block)."""
    _quantize(TYPES["MXFP4"], src, out, threads, path)


def quantize_q2_k(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """GGML Q2_K (ggml's quantize_row_q2_K_ref, bit for bit; len(src) a multiple of 256; 84 bytes a block)."""
    _quantize(TYPES["Q2_K"], src, out, threads, path)


def quantize_q3_k(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """GGML Q3_K (ggml's quantize_row_q3_K_ref, bit for bit; len(src) a multiple of 256; 110 bytes a block)."""
    _quantize(TYPES["Q3_K"], src, out, threads, path)


def quantize_q4_k(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """GGML Q4_K (ggml's quantize_row_q4_K_ref, bit for bit; len(src) a multiple of 256; 144 bytes a block)."""
    _quantize(TYPES["Q4_K"], src, out, threads, path)


def quantize_q5_k(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """GGML Q5_K (ggml's quantize_row_q5_K_ref, bit for bit; len(src) a multiple of 256; 176 bytes a block)."""
    _quantize(TYPES["Q5_K"], src, out, threads, path)


def quantize_q6_k(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """GGML Q6_K (ggml's quantize_row_q6_K_ref, bit for bit; len(src) a multiple of 256; 210 bytes a block)."""
    _quantize(TYPES["Q6_K"], src, out, threads, path)


def quantize_q8_k(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """GGML Q8_K (ggml's quantize_row_q8_K_ref, bit for bit; len(src) a multiple of 256; 292 bytes a block)."""
    _quantize(TYPES["Q8_K"], src, out, threads, path)


def quantize_iq4_nl(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """GGML IQ4_NL (ggml's quantize_iq4_nl without an importance matrix, bit for bit; 18 bytes a block of 32)."""
    _quantize(TYPES["IQ4_NL"], src, out, threads, path)


def quantize_iq4_xs(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """GGML IQ4_XS (ggml's quantize_iq4_xs without an importance matrix, bit for bit; 136 bytes a block of 256)."""
    _quantize(TYPES["IQ4_XS"], src, out, threads, path)


def quantize_iq3_s(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """GGML IQ3_S (ggml's quantize_iq3_s without an importance matrix, bit for bit; 110 bytes a block of 256)."""
    _quantize(TYPES["IQ3_S"], src, out, threads, path)


def quantize_q1_0(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """GGML Q1_0 (ggml's quantize_row_q1_0_ref, bit for bit; 18 bytes a block of 128)."""
    _quantize(TYPES["Q1_0"], src, out, threads, path)


def quantize_apr_q8(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """apr-format's AprQ8: f32 scale then one int8 per element (no bytes if empty)."""
    _quantize(TYPES["APR_Q8"], src, out, threads, path)


def quantize_apr_q4(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """apr-format's AprQ4: blocks of 32 (the last may be partial), f16 scale, interleaved nibbles."""
    _quantize(TYPES["APR_Q4"], src, out, threads, path)


def quantize_q8_tensor(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """Per-tensor int8: f32 scale, i32 zero point, one int8 per element (no bytes if empty)."""
    _quantize(TYPES["Q8_TENSOR"], src, out, threads, path)


def quantize_apr_fq8_0(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """aprender format::quantize Q8_0 (partial last block allowed)."""
    _quantize(TYPES["APR_FQ8_0"], src, out, threads, path)


def quantize_apr_fq4_0(const float[::1] src, uint8_t[::1] out, *, int threads=0, path=None):
    """aprender format::quantize Q4_0 (interleaved nibbles, partial last block allowed)."""
    _quantize(TYPES["APR_FQ4_0"], src, out, threads, path)


def dequantize(str type_name, const uint8_t[::1] src, float[::1] out, *, int threads=0, path=None):
    """Dequantize ``src`` bytes of ``type_name`` into float32 ``out``.

    ``len(out)`` is the element count; ``src`` must be exactly
    ``quantized_nbytes(type_name, len(out))`` bytes.
    """
    cdef int tid = _type_id(type_name)
    cdef int pid = _path_id(path)
    cdef int nthreads = _threads(threads)
    cdef size_t n = out.shape[0]
    problem = _count_problem(tid, n)
    if problem is not None:
        raise ValueError(f"dequantize {problem}")
    cdef size_t want = apr_quant_nbytes(tid, n)
    if <size_t>src.shape[0] != want:
        raise ValueError(f"dequantize {type_name}: src holds {src.shape[0]} bytes, {n} elements need {want}")
    cdef const uint8_t *sp = &src[0] if want else NULL
    cdef float *dp = &out[0] if n else NULL
    cdef int rc
    if n < NOGIL_MIN:
        rc = apr_dequantize(tid, sp, n, dp, 1, pid)
    else:
        with nogil:
            rc = apr_dequantize(tid, sp, n, dp, nthreads, pid)
    if rc != APR_QUANT_OK:  # the checks above make this unreachable
        raise ValueError(f"dequantize {type_name}: kernel refused {n} elements (code {rc})")


def block_info(str type_name):
    """``(block_elems, block_bytes)`` of a type.

    Per-tensor types (APR_Q8, Q8_TENSOR) report ``(1, 1)``: one byte per element
    after a header of ``header_bytes(type_name)`` bytes.
    """
    cdef size_t elems = 0, nbytes = 0
    apr_quant_block_info(_type_id(type_name), &elems, &nbytes)
    return (elems, nbytes)


def header_bytes(str type_name, size_t n=1):
    """Bytes before the first block for a tensor of ``n`` elements (0 when ``n`` is 0)."""
    return apr_quant_header_bytes(_type_id(type_name), n)


def quantized_nbytes(str type_name, size_t n):
    """Bytes that ``n`` elements take as ``type_name``; ValueError if ``n`` is not allowed."""
    cdef int tid = _type_id(type_name)
    problem = _count_problem(tid, n)
    if problem is not None:
        raise ValueError(problem)
    return apr_quant_nbytes(tid, n)


def can_quantize(str type_name):
    """True if ``quantize`` supports the type (the APR types and the GGML types with a
    quantizer: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, TQ1_0, TQ2_0, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
    IQ4_NL, IQ4_XS, IQ3_S, Q1_0)."""
    return bool(apr_quant_can_quantize(_type_id(type_name)))


def available_paths():
    """Names of the kernels this CPU can run, best last (``path=`` accepts them)."""
    return [apr_quant_path_name(pid).decode() for pid in range(APR_QUANT_PATH_COUNT)
            if apr_quant_path_available(pid)]


def best_path():
    """Name of the kernel used when ``path`` is None."""
    return apr_quant_path_name(apr_quant_best_path()).decode()


def default_threads():
    """The most threads ``threads=0`` uses: the online cores (fewer while other processes
    keep cores busy; one below 512 Ki values)."""
    return apr_quant_default_threads()
