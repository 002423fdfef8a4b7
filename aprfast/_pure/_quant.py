"""Quantize and dequantize tensors block by block, the pure twin of ``aprfast._quant``:
the portable kernels of csrc/quant.c as NumPy operations on whole arrays of blocks.

GGML types (Q8_0, Q4_0, Q4_1 both ways; Q5_0, Q5_1, Q4_K, Q6_K dequantize only) give
the same bytes and floats as llama.cpp's gguf-py; the APR types (APR_Q8, APR_Q4,
APR_FQ8_0, APR_FQ4_0) the same as aprender's Rust code; Q8_TENSOR is aprfast's
per-tensor int8 with a zero point.  The byte layouts are in csrc/quant.h, the rounding
rules (and why they look odd) at the top of csrc/quant.c.  Every float operation is
float32, one rounding each, in the oracle's order; comparisons and selections work on
bit patterns so NaN and the sign of zero come out as the C gives them.
"""

from __future__ import annotations

import numpy as np

from ._half import f16_bits_to_f32_bits, f32_bits_to_f16_bits
from ._views import check_uint, typed_view
from ._views import default_threads as _default_threads

QK = 32     # elements in a GGML / APR block
QK_K = 256  # elements in a K-quant super-block
SIZE_MAX = (1 << 64) - 1

# name: (block elements, block bytes, header bytes, last block may be partial, quantizable)
_TABLE = {
    "Q8_0": (QK, 34, 0, False, True),
    "Q4_0": (QK, 18, 0, False, True),
    "Q4_1": (QK, 20, 0, False, True),
    "Q5_0": (QK, 22, 0, False, False),
    "Q5_1": (QK, 24, 0, False, False),
    "Q4_K": (QK_K, 144, 0, False, False),
    "Q6_K": (QK_K, 210, 0, False, False),
    "APR_Q8": (1, 1, 4, False, True),
    "APR_Q4": (QK, 18, 0, True, True),
    "Q8_TENSOR": (1, 1, 8, False, True),
    "APR_FQ8_0": (QK, 34, 0, True, True),
    "APR_FQ4_0": (QK, 18, 0, True, True),
}
TYPES = {name: i for i, name in enumerate(_TABLE)}
PATHS = {"portable": 0, "auto": -1}

# Values converted per step: bounds the temporaries (a dozen times the step's floats).
_STEP = 1 << 16

INF_BITS = 0x7F800000
F16_DEFAULT_NAN = 0x7E00   # numpy.float16 of the quiet NaN NumPy's max/min return
TWO_POW_31_BITS = 0x4F000000
HALF_BITS = 0x3F000000
F32 = np.float32


# --- bit-level helpers (csrc/quant.c "Scalar rounding and casts") -----------------------
def _bits(x):
    return np.asarray(x, F32).view(np.uint32)


def _abs_bits(x):
    """|x|'s bits: for non-NaN x they order like |x|; a NaN's are above inf's."""
    return _bits(x) & np.uint32(0x7FFFFFFF)


def _order_key(x):
    """An int32 key that orders like the float for every non-NaN x (-0 < +0)."""
    return _flip_negatives(_bits(x)).view(np.int32)


def _from_order_key(k):
    return _flip_negatives(np.asarray(k, np.int32).view(np.uint32)).view(F32)


def _flip_negatives(b):
    """b ^ 0x7FFFFFFF where the sign bit is set, as uint32 (array or 0-d).  Every operand
    is a uint32: under NumPy 1.x's value-based casting a Python int would make a 0-d
    result int64, whose view as a 4-byte type fails."""
    b = np.asarray(b, np.uint32)
    return np.asarray(b ^ ((b >> np.uint32(31)) * np.uint32(0x7FFFFFFF)), np.uint32)


def _trunc_or_zero(t):
    """trunc(t) as int32, or 0 for NaN, +-inf and |t| >= 2^31 (NumPy's float -> int8 cast keeps its low byte)."""
    safe = np.where(_abs_bits(t) < TWO_POW_31_BITS, t, F32(0))
    return safe.astype(np.int32)


def _round_half_away_or_zero(v):
    """round half away from zero (Rust f32::round) as int32, or 0 for NaN, +-inf and |v| >= 2^31."""
    safe = np.where(_abs_bits(v) < TWO_POW_31_BITS, v, F32(0)).astype(F32)
    i = safe.astype(np.int32)
    up = (_abs_bits(safe - i.astype(F32)) >= HALF_BITS).astype(np.int32)
    return i + np.where(_bits(safe) >> 31 != 0, -up, up)


def _rust_round_clamp(v, lo, hi):
    """Rust's ``v.round().clamp(lo, hi) as i8`` (NaN -> 0); lo and hi integers."""
    v = np.where(_abs_bits(v) > INF_BITS, F32(0), v).astype(F32)
    k = _order_key(v)
    v = np.where(k < _order_key(F32(lo)), F32(lo), v)
    v = np.where(k > _order_key(F32(hi)), F32(hi), v)
    return _round_half_away_or_zero(v)


def _numpy_nibble(t):
    """min(15, NumPy's uint8 cast of t): gguf-py's Q4_0 / Q4_1 nibble."""
    return np.minimum(_trunc_or_zero(t) & 0xFF, 15).astype(np.uint8)


def _max_abs_skip_nan(x):
    """Rust's fold(0.0, f32::max) over |x| per row: NaN is skipped."""
    a = _abs_bits(x)
    return np.where(a <= INF_BITS, a, 0).max(axis=-1, initial=0).astype(np.uint32).view(F32)


def _f16(x):
    return f32_bits_to_f16_bits(_bits(x))


def _f32(h):
    return f16_bits_to_f32_bits(np.asarray(h, np.uint16)).view(F32)


def _inv(d):
    """1/d, or 0 where d is 0."""
    return np.where(d == 0, F32(0), F32(1) / np.where(d == 0, F32(1), d)).astype(F32)


def _u16_bytes(values):
    return np.asarray(values, np.uint16).astype("<u2").view(np.uint8).reshape(-1, 2)


def _pack_split(q):
    """GGML 4-bit nibbles: element j low, element j+16 high."""
    return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)


def _pack_interleaved(q):
    """APR 4-bit nibbles: element 2k low, 2k+1 high."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)


# --- quantize: rows of whole blocks (float32 x of shape (blocks, 32)) -> bytes ----------
def _q8_0_blocks(x):
    amax = _abs_bits(x).max(axis=1)
    nan = amax > INF_BITS
    d = amax.view(F32) / F32(127)
    q = (_round_half_away_or_zero(x * _inv(d)[:, None]) & 0xFF).astype(np.uint8)
    q[nan] = 0
    dh = np.where(nan, F16_DEFAULT_NAN, _f16(d))
    return np.concatenate([_u16_bytes(dh), q], axis=1)


def _argmax_abs(x):
    """numpy.argmax(abs(x)) per row: the first NaN, else the first element of largest magnitude."""
    a = _abs_bits(x)
    nan = a > INF_BITS
    return np.where(nan.any(axis=1), nan.argmax(axis=1), (a == a.max(axis=1)[:, None]).argmax(axis=1))


def _q4_0_blocks(x):
    rows = np.arange(x.shape[0])
    d = x[rows, _argmax_abs(x)] / F32(-8)
    q = _numpy_nibble(x * _inv(d)[:, None] + F32(8.5))
    return np.concatenate([_u16_bytes(_f16(d)), _pack_split(q)], axis=1)


def _q4_1_blocks(x):
    nan = _abs_bits(x).max(axis=1) > INF_BITS
    clean = np.where(nan[:, None], F32(0), x)
    rows = np.arange(x.shape[0])
    # The first element equal to the extreme (llama.cpp's strict compares): only a zero's sign depends on it.
    lo = clean[rows, (clean == clean.min(axis=1)[:, None]).argmax(axis=1)]
    hi = clean[rows, (clean == clean.max(axis=1)[:, None]).argmax(axis=1)]
    d = (hi - lo) / F32(15)
    q = _numpy_nibble((clean - lo[:, None]) * _inv(d)[:, None] + F32(0.5))
    q[nan] = 0
    dh = np.where(nan, F16_DEFAULT_NAN, _f16(d))
    mh = np.where(nan, F16_DEFAULT_NAN, _f16(lo))
    return np.concatenate([_u16_bytes(dh), _u16_bytes(mh), _pack_split(q)], axis=1)


def _apr_q4_blocks(x, count):
    """APR_Q4: scale = max|x| / 7 (1.0 if 0) in f32, stored as f16; q from the f32 scale;
    nibbles past ``count`` stay 0."""
    amax = _max_abs_skip_nan(x)
    scale = np.where(amax == 0, F32(1), amax / F32(7)).astype(F32)
    nib = (_rust_round_clamp(x / scale[:, None], -8, 7) + 8).astype(np.uint8)
    nib[_missing(x.shape, count)] = 0
    return np.concatenate([_u16_bytes(_f16(scale)), _pack_interleaved(nib)], axis=1)


def _apr_fq8_0_blocks(x, count):
    amax = _max_abs_skip_nan(x)
    scale = np.where(amax > 0, amax / F32(127), F32(1)).astype(F32)
    inv = np.where(scale > 0, F32(1) / scale, F32(0)).astype(F32)
    q = (_rust_round_clamp(x * inv[:, None], -127, 127) & 0xFF).astype(np.uint8)
    q[_missing(x.shape, count)] = 0
    return np.concatenate([_u16_bytes(_f16(scale)), q], axis=1)


def _apr_fq4_0_blocks(x, count):
    """As APR_Q4 but q = round(x * (1/scale)) and missing elements are 0.0 (nibble 8)."""
    amax = _max_abs_skip_nan(x)
    scale = np.where(amax > 0, amax / F32(7), F32(1)).astype(F32)
    inv = np.where(scale > 0, F32(1) / scale, F32(0)).astype(F32)
    nib = (_rust_round_clamp(x * inv[:, None], -8, 7) + 8).astype(np.uint8)
    return np.concatenate([_u16_bytes(_f16(scale)), _pack_interleaved(nib)], axis=1)


def _missing(shape, count):
    """Mask of the padding elements after the first ``count`` of a (blocks, 32) array."""
    return (np.arange(shape[0] * shape[1]) >= count).reshape(shape)


# --- quantize: per-tensor types ---------------------------------------------------------
def _steps(x):
    return (x[at:at + _STEP] for at in range(0, x.shape[0], _STEP))


def _apr_q8(x):
    """APR_Q8: scale = max|x| / 127 (NaN skipped; 1.0 if 0), q = (x / scale).round().clamp(-127, 127)."""
    amax = max((_max_abs_skip_nan(part) for part in _steps(x)), default=F32(0))
    scale = F32(1) if amax == 0 else F32(amax / F32(127))
    q = [(_rust_round_clamp(part / scale, -127, 127) & 0xFF).astype(np.uint8) for part in _steps(x)]
    return np.concatenate([np.array([scale], "<f4").view(np.uint8), *q])


def _q8_tensor_params(lo, hi):
    """Scale and zero point from the finite range lo <= 0 <= hi (see csrc/quant.c)."""
    if hi == lo:
        s = F32(1)
    else:
        s = F32((hi - lo) / F32(255))
        if s == np.inf:
            s = F32(hi / F32(255) - lo / F32(255))
        elif s == 0:
            s = np.uint32(1).view(F32)  # the smallest subnormal
    z = F32(F32(-128) - lo / s)
    z = min(max(z, F32(-128)), F32(127))
    return s, int(_round_half_away_or_zero(np.array([z], F32))[0])


def _finite_range_keys(x):
    """Order keys of the least and greatest finite values of x, 0.0 included (-0.0 < +0.0)."""
    lo = hi = int(_order_key(np.zeros(1, F32))[0])
    for part in _steps(x):
        keys = _order_key(part[_abs_bits(part) < INF_BITS])
        if keys.shape[0]:
            lo, hi = min(lo, int(keys.min())), max(hi, int(keys.max()))
    return lo, hi


def _q8_tensor_values(x, scale, zero_point):
    """clamp(round_half_away(x / scale) + zero_point, -128, 127); NaN -> zero_point."""
    v = x / scale
    nan = _abs_bits(v) > INF_BITS
    v = np.where(nan, F32(0), v).astype(F32)
    k = _order_key(v)  # |v| clamped to 384 first: beyond it the sum saturates anyway
    v = np.where(k < _order_key(F32(-384)), F32(-384), v)
    v = np.where(k > _order_key(F32(384)), F32(384), v).astype(F32)
    s = np.clip(_round_half_away_or_zero(v) + zero_point, -128, 127)
    return np.where(nan, zero_point, s).astype(np.int8).view(np.uint8)


def _q8_tensor(x):
    """Q8_TENSOR: f32 scale | i32 zero point | one int8 per element."""
    lo, hi = (_from_order_key(np.array([k], np.int32))[0] for k in _finite_range_keys(x))
    scale, zero_point = _q8_tensor_params(F32(lo), F32(hi))
    header = np.array([scale], "<f4").view(np.uint8), np.array([zero_point], "<i4").view(np.uint8)
    return np.concatenate([*header, *(_q8_tensor_values(part, scale, zero_point) for part in _steps(x))])


_BLOCK_QUANTIZERS = {"Q8_0": _q8_0_blocks, "Q4_0": _q4_0_blocks, "Q4_1": _q4_1_blocks}
_PARTIAL_QUANTIZERS = {"APR_Q4": _apr_q4_blocks, "APR_FQ8_0": _apr_fq8_0_blocks, "APR_FQ4_0": _apr_fq4_0_blocks}


def _quantize_into(name, x, out):
    if name == "APR_Q8":
        out[:] = _apr_q8(x)
        return
    if name == "Q8_TENSOR":
        out[:] = _q8_tensor(x)
        return
    elems, nbytes = _TABLE[name][:2]
    blocks = -(-x.shape[0] // elems)
    rows = out.reshape(blocks, nbytes)
    step = max(1, _STEP // elems)
    for first in range(0, blocks, step):
        stop = min(first + step, blocks)
        part = x[first * elems:stop * elems]
        count = part.shape[0]
        if count % elems:  # a partial last block: padded with 0.0
            part = np.concatenate([part, np.zeros(elems - count % elems, F32)])
        part = part.reshape(-1, elems)
        if name in _BLOCK_QUANTIZERS:
            rows[first:stop] = _BLOCK_QUANTIZERS[name](part)
        else:
            rows[first:stop] = _PARTIAL_QUANTIZERS[name](part, count)


# --- dequantize: rows of whole blocks (uint8 of shape (blocks, block bytes)) -> floats ---
def _le16(b, at):
    return b[:, at].astype(np.uint16) | (b[:, at + 1].astype(np.uint16) << 8)


def _le32(b, at):
    return (b[:, at].astype(np.uint32) | (b[:, at + 1].astype(np.uint32) << 8)
            | (b[:, at + 2].astype(np.uint32) << 16) | (b[:, at + 3].astype(np.uint32) << 24))


def _add_first_nan_wins(a, b):
    """a + b where a NaN in a wins over a NaN in b, as NumPy's (d * q) + m on x86 and Arm."""
    return np.where(np.isnan(a), a + a, a + b).astype(F32)


def _split_nibbles(qs):
    """Elements 0..15 from the low nibbles, 16..31 from the high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _dq_q8_0(b):
    return b[:, 2:34].view(np.int8).astype(F32) * _f32(_le16(b, 0))[:, None]


def _dq_q4_0(b):
    return _f32(_le16(b, 0))[:, None] * (_split_nibbles(b[:, 2:18]).astype(np.int32) - 8).astype(F32)


def _dq_q4_1(b):
    d, m = _f32(_le16(b, 0))[:, None], _f32(_le16(b, 2))[:, None]
    return _add_first_nan_wins(d * _split_nibbles(b[:, 4:20]).astype(F32), m)


def _q5_values(qs, qh):
    j = np.arange(16, dtype=np.uint32)
    lo = (qs & 0x0F).astype(np.uint32) | (((qh[:, None] >> j) << 4) & 0x10)
    hi = (qs >> 4).astype(np.uint32) | ((qh[:, None] >> (j + 12)) & 0x10)
    return np.concatenate([lo, hi], axis=1).astype(np.int32)


def _dq_q5_0(b):
    return _f32(_le16(b, 0))[:, None] * (_q5_values(b[:, 6:22], _le32(b, 2)) - 16).astype(F32)


def _dq_q5_1(b):
    d, m = _f32(_le16(b, 0))[:, None], _f32(_le16(b, 2))[:, None]
    return _add_first_nan_wins(d * _q5_values(b[:, 8:24], _le32(b, 4)).astype(F32), m)


def _dq_q4_k(b):
    """y = (d * sc) * q - dmin * m per 32-element sub-block (llama.cpp get_scale_min_k4)."""
    d, dmin = _f32(_le16(b, 0))[:, None], _f32(_le16(b, 2))[:, None]
    s = b[:, 4:16]
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    scale, offset = d * sc.astype(F32), dmin * mn.astype(F32)  # (blocks, 8): one per sub-block
    qs = b[:, 16:144].reshape(-1, 4, 32)
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32).astype(F32)  # sub-block 2g low, 2g+1 high
    return (scale[:, :, None] * q - offset[:, :, None]).reshape(-1, QK_K)


def _dq_q6_k(b):
    """Element 128h + 32k + l: bits 4(k//2).. of ql[64h + l + 32(k%2)], bits 2k.. of qh[32h + l]; scale (l + 32k)/16."""
    d = _f32(_le16(b, 208))
    ds = d[:, None] * b[:, 192:208].view(np.int8).astype(F32)  # (blocks, 16)
    ql = b[:, 0:128].reshape(-1, 2, 2, 32).astype(np.int32)  # [h][k % 2][l]
    qh = b[:, 128:192].reshape(-1, 2, 1, 32).astype(np.int32)  # [h][l]
    k = np.arange(4).reshape(1, 1, 4, 1)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # k = 0, 1 low nibbles, k = 2, 3 high ones
    q = (low | (((qh >> (2 * k)) & 3) << 4)) - 32  # (blocks, 2, 4, 32)
    scale = ds.reshape(-1, 2, 4, 2)  # [h][k][half]
    per_elem = np.repeat(scale, 16, axis=3)  # (blocks, 2, 4, 32)
    return (per_elem * q.astype(F32)).reshape(-1, QK_K)


def _dq_interleaved(b, safe_scale):
    h = _le16(b, 0)
    s = _f32(h)
    if safe_scale:  # aprender: a NaN, inf or subnormal scale (exponent field 0 or 31) reads as 0.0
        exp = (h >> 10) & 0x1F
        s = np.where((exp == 0) | (exp == 0x1F), F32(0), s).astype(F32)
    qs = b[:, 2:18]
    nib = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, QK).astype(np.int32) - 8
    return nib.astype(F32) * s[:, None]


_BLOCK_DEQUANTIZERS = {"Q8_0": _dq_q8_0, "Q4_0": _dq_q4_0, "Q4_1": _dq_q4_1, "Q5_0": _dq_q5_0, "Q5_1": _dq_q5_1,
                       "Q4_K": _dq_q4_k, "Q6_K": _dq_q6_k, "APR_FQ8_0": _dq_q8_0,
                       "APR_Q4": lambda b: _dq_interleaved(b, True),
                       "APR_FQ4_0": lambda b: _dq_interleaved(b, False)}


def _dequantize_into(name, src, out):
    n = out.shape[0]
    if name == "APR_Q8":
        scale = src[:4].view("<f4")[0]
        for at in range(0, n, _STEP):
            out[at:at + _STEP] = src[4 + at:4 + at + _STEP].view(np.int8).astype(F32) * scale
        return
    if name == "Q8_TENSOR":
        scale, zero_point = src[:4].view("<f4")[0], int(src[4:8].view("<i4")[0])
        # (q - zero_point) is exact in double, and then in float32 for an i8 zero point.
        for at in range(0, n, _STEP):
            q = src[8 + at:8 + at + _STEP].view(np.int8).astype(np.float64)
            out[at:at + _STEP] = (q - zero_point).astype(F32) * scale
        return
    elems, nbytes = _TABLE[name][:2]
    rows = src.reshape(-1, nbytes)
    step = max(1, _STEP // elems)
    for first in range(0, rows.shape[0], step):
        values = _BLOCK_DEQUANTIZERS[name](rows[first:first + step]).reshape(-1)
        start = first * elems
        out[start:start + values.shape[0]] = values[:n - start]  # a partial last block's tail is dropped


# --- the compiled module's interface ---------------------------------------------------
def _type_id(type_name):
    if not isinstance(type_name, str):
        raise TypeError(f"Argument 'type_name' has incorrect type (expected str, got {type(type_name).__name__})")
    try:
        return TYPES[type_name]
    except KeyError:
        raise ValueError(f"unknown quantization type {type_name!r}; known: {', '.join(TYPES)}") from None


def _check_path(path):
    if path is None:
        return
    if path not in PATHS:
        raise ValueError(f"unknown quantization path {path!r}; known: {', '.join(PATHS)}")


def _check_threads(threads):
    if threads < 0:
        raise ValueError(f"threads must be 0 (all cores) or positive, not {threads}")


def _nbytes(name, n):
    """Bytes n elements take (SIZE_MAX when they do not fit, as the C)."""
    elems, block_bytes, header, partial = _TABLE[name][:4]
    if not partial and n % elems:
        return SIZE_MAX
    blocks = -(-n // elems)
    header = header if n else 0
    if blocks > (SIZE_MAX - header) // block_bytes:
        return SIZE_MAX
    return header + blocks * block_bytes


def _count_problem(name, n):
    """Why n elements cannot be stored as this type, or None."""
    elems, _, _, partial = _TABLE[name][:4]
    if not partial and n % elems:
        return f"{name}: {n} elements is not a multiple of the block size {elems}"
    if _nbytes(name, n) == SIZE_MAX:
        return f"{name}: {n} elements take more bytes than a buffer can hold"
    return None


def _quantize(name, src, out, threads, path):
    x = typed_view(src, np.float32)
    o = typed_view(out, np.uint8, writable=True)
    _check_path(path)
    _check_threads(threads)
    n = x.shape[0]
    if not _TABLE[name][4]:
        raise ValueError(f"{name} can be dequantized but not quantized")
    problem = _count_problem(name, n)
    if problem is not None:
        raise ValueError(f"quantize {problem}")
    want = _nbytes(name, n)
    if o.shape[0] != want:
        raise ValueError(f"quantize {name}: out holds {o.shape[0]} bytes, {n} elements need {want}")
    if n:
        with np.errstate(all="ignore"):  # NaN, inf and overflow are data here, handled bit by bit
            _quantize_into(name, x, o)


def quantize(type_name, src, out, *, threads=0, path=None):
    """Quantize float32 ``src`` into ``out`` (``quantized_nbytes(type_name, len(src))`` bytes)."""
    _quantize(list(TYPES)[_type_id(type_name)], src, out, threads, path)


def quantize_q8_0(src, out, *, threads=0, path=None):
    """GGML Q8_0, bit-identical to gguf-py (len(src) a multiple of 32; 34 bytes a block)."""
    _quantize("Q8_0", src, out, threads, path)


def quantize_q4_0(src, out, *, threads=0, path=None):
    """GGML Q4_0, bit-identical to gguf-py (len(src) a multiple of 32; 18 bytes a block)."""
    _quantize("Q4_0", src, out, threads, path)


def quantize_q4_1(src, out, *, threads=0, path=None):
    """GGML Q4_1, bit-identical to gguf-py (len(src) a multiple of 32; 20 bytes a block)."""
    _quantize("Q4_1", src, out, threads, path)


def quantize_apr_q8(src, out, *, threads=0, path=None):
    """apr-format's AprQ8: f32 scale then one int8 per element (no bytes if empty)."""
    _quantize("APR_Q8", src, out, threads, path)


def quantize_apr_q4(src, out, *, threads=0, path=None):
    """apr-format's AprQ4: blocks of 32 (the last may be partial), f16 scale, interleaved nibbles."""
    _quantize("APR_Q4", src, out, threads, path)


def quantize_q8_tensor(src, out, *, threads=0, path=None):
    """Per-tensor int8: f32 scale, i32 zero point, one int8 per element (no bytes if empty)."""
    _quantize("Q8_TENSOR", src, out, threads, path)


def quantize_apr_fq8_0(src, out, *, threads=0, path=None):
    """aprender format::quantize Q8_0 (partial last block allowed)."""
    _quantize("APR_FQ8_0", src, out, threads, path)


def quantize_apr_fq4_0(src, out, *, threads=0, path=None):
    """aprender format::quantize Q4_0 (interleaved nibbles, partial last block allowed)."""
    _quantize("APR_FQ4_0", src, out, threads, path)


def dequantize(type_name, src, out, *, threads=0, path=None):
    """Dequantize ``src`` bytes of ``type_name`` into float32 ``out`` (``len(out)`` elements)."""
    name = list(TYPES)[_type_id(type_name)]
    s = typed_view(src, np.uint8)
    o = typed_view(out, np.float32, writable=True)
    _check_path(path)
    _check_threads(threads)
    n = o.shape[0]
    problem = _count_problem(name, n)
    if problem is not None:
        raise ValueError(f"dequantize {problem}")
    want = _nbytes(name, n)
    if s.shape[0] != want:
        raise ValueError(f"dequantize {type_name}: src holds {s.shape[0]} bytes, {n} elements need {want}")
    if n:
        with np.errstate(all="ignore"):
            _dequantize_into(name, s, o)


def block_info(type_name):
    """``(block_elems, block_bytes)`` of a type (per-tensor types: ``(1, 1)``)."""
    return _TABLE[list(TYPES)[_type_id(type_name)]][:2]


def header_bytes(type_name, n=1):
    """Bytes before the first block for a tensor of ``n`` elements (0 when ``n`` is 0)."""
    name = list(TYPES)[_type_id(type_name)]
    n = check_uint(n, 64, "size_t")
    return _TABLE[name][2] if n else 0


def quantized_nbytes(type_name, n):
    """Bytes that ``n`` elements take as ``type_name``; ValueError if ``n`` is not allowed."""
    name = list(TYPES)[_type_id(type_name)]
    n = check_uint(n, 64, "size_t")
    problem = _count_problem(name, n)
    if problem is not None:
        raise ValueError(problem)
    return _nbytes(name, n)


def can_quantize(type_name):
    """True if ``quantize`` supports the type (all but Q5_0, Q5_1, Q4_K, Q6_K)."""
    return _TABLE[list(TYPES)[_type_id(type_name)]][4]


def available_paths():
    return ["portable"]


def best_path():
    return "portable"


def default_threads():
    return _default_threads()
