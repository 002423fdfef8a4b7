"""Quantize and dequantize tensors block by block, the pure twin of ``aprfast._quant``:
the portable kernels of csrc/quant.c as NumPy operations on whole arrays of blocks.

GGML types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, TQ1_0, TQ2_0, MXFP4 and the K-quants Q2_K,
Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, IQ4_XS, IQ3_S and Q1_0 both ways; the others dequantize only)
give the same bytes and floats as llama.cpp's gguf-py (ggml's reference C where gguf-py has none: the
K-quant, Q8_K, IQ4, IQ3_S and Q1_0 quantizers,
Q8_1, Q8_K and Q1_0's dequantizers); the APR types (APR_Q8, APR_Q4,
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
    "Q5_0": (QK, 22, 0, False, True),
    "Q5_1": (QK, 24, 0, False, True),
    "Q4_K": (QK_K, 144, 0, False, True),
    "Q6_K": (QK_K, 210, 0, False, True),
    "APR_Q8": (1, 1, 4, False, True),
    "APR_Q4": (QK, 18, 0, True, True),
    "Q8_TENSOR": (1, 1, 8, False, True),
    "APR_FQ8_0": (QK, 34, 0, True, True),
    "APR_FQ4_0": (QK, 18, 0, True, True),
    # The other GGML types (dequantize only), in GGML id order.
    "Q8_1": (QK, 36, 0, False, False),
    "Q2_K": (QK_K, 84, 0, False, True),
    "Q3_K": (QK_K, 110, 0, False, True),
    "Q5_K": (QK_K, 176, 0, False, True),
    "Q8_K": (QK_K, 292, 0, False, True),
    "IQ2_XXS": (QK_K, 66, 0, False, False),
    "IQ2_XS": (QK_K, 74, 0, False, False),
    "IQ3_XXS": (QK_K, 98, 0, False, False),
    "IQ1_S": (QK_K, 50, 0, False, False),
    "IQ4_NL": (QK, 18, 0, False, True),
    "IQ3_S": (QK_K, 110, 0, False, True),
    "IQ2_S": (QK_K, 82, 0, False, False),
    "IQ4_XS": (QK_K, 136, 0, False, True),
    "IQ1_M": (QK_K, 56, 0, False, False),
    "TQ1_0": (QK_K, 54, 0, False, True),
    "TQ2_0": (QK_K, 66, 0, False, True),
    "MXFP4": (QK, 17, 0, False, True),
    "NVFP4": (64, 36, 0, False, False),
    "Q1_0": (128, 18, 0, False, True),
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


def _blocks_with_min(x, levels, quant, pack):
    """Q4_1 / Q5_1: d = (max - min) / levels and m = min per block (the default NaN for
    both in a block holding a NaN, whose quants are 0), quants ``quant((x - m) / d + 0.5)``."""
    nan = _abs_bits(x).max(axis=1) > INF_BITS
    clean = np.where(nan[:, None], F32(0), x)
    rows = np.arange(x.shape[0])
    # The first element equal to the extreme (llama.cpp's strict compares): only a zero's sign depends on it.
    lo = clean[rows, (clean == clean.min(axis=1)[:, None]).argmax(axis=1)]
    hi = clean[rows, (clean == clean.max(axis=1)[:, None]).argmax(axis=1)]
    d = (hi - lo) / F32(levels)
    q = quant((clean - lo[:, None]) * _inv(d)[:, None] + F32(0.5))
    q[nan] = 0
    dh = np.where(nan, F16_DEFAULT_NAN, _f16(d))
    mh = np.where(nan, F16_DEFAULT_NAN, _f16(lo))
    return np.concatenate([_u16_bytes(dh), _u16_bytes(mh), pack(q)], axis=1)


def _q4_1_blocks(x):
    return _blocks_with_min(x, 15, _numpy_nibble, _pack_split)


def _numpy_q5(t):
    """min(31, NumPy's uint8 cast of t): gguf-py's Q5_0 / Q5_1 quant."""
    return np.minimum(_trunc_or_zero(t) & 0xFF, 31).astype(np.uint8)


def _pack_q5(q):
    """Five-bit quants as a Q5 block stores them: u32 of fifth bits (bit j: element j), then nibbles."""
    qh = (((q >> 4) & 1).astype(np.uint32) << np.arange(32, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
    return np.concatenate([qh.astype("<u4").view(np.uint8).reshape(-1, 4), _pack_split(q & 0x0F)], axis=1)


def _q5_0_blocks(x):
    rows = np.arange(x.shape[0])
    d = x[rows, _argmax_abs(x)] / F32(-16)
    q = _numpy_q5(x * _inv(d)[:, None] + F32(16.5))
    return np.concatenate([_u16_bytes(_f16(d)), _pack_q5(q)], axis=1)


def _q5_1_blocks(x):
    return _blocks_with_min(x, 31, _numpy_q5, _pack_q5)


def _ternary(x):
    """TQ1_0 / TQ2_0: f16 d = max|x| (the default NaN for a NaN block) and trits round(x/d) + 1."""
    amax = _abs_bits(x).max(axis=1)
    nan = amax > INF_BITS
    d = amax.view(F32)
    t = ((_round_half_away_or_zero(x * _inv(d)[:, None]) + 1) & 0xFF).astype(np.uint8)
    t[nan] = 1
    return np.where(nan, F16_DEFAULT_NAN, _f16(d)), t


def _trit_bytes(t, weights):
    """Ceiling of (sum of trits times weights, in uint8 products) * 256 / 243 per byte (axis 1)."""
    v = (t * np.asarray(weights, np.uint8)[None, :, None]).astype(np.uint8).sum(axis=1, dtype=np.uint32)
    return ((v * 256 + 242) // 243).astype(np.uint8)


def _tq1_0_blocks(x):
    dh, t = _ternary(x)
    parts = [_trit_bytes(t[:, 0:160].reshape(-1, 5, 32), [81, 27, 9, 3, 1]),
             _trit_bytes(t[:, 160:240].reshape(-1, 5, 16), [81, 27, 9, 3, 1]),
             _trit_bytes(t[:, 240:256].reshape(-1, 4, 4), [81, 27, 9, 3])]
    return np.concatenate([*parts, _u16_bytes(dh)], axis=1)


def _tq2_0_blocks(x):
    dh, t = _ternary(x)
    q = t.reshape(-1, 2, 4, 32) << np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]
    q = np.bitwise_or.reduce(q, axis=2).astype(np.uint8).reshape(-1, 64)
    return np.concatenate([q, _u16_bytes(dh)], axis=1)


def _mxfp4_blocks(x):
    """e = uint8(floor(log2(max|x|)) - 2 + 127) (0 unless max|x| > 0), d = 2**(e - 128), and
    each nibble the first k of least |d * FP4_VALUES[k] - x| (a NaN difference wins, as argmin)."""
    amax = _abs_bits(x).max(axis=1)
    ok = (amax != 0) & (amax <= INF_BITS)
    # log2 in double rounded to float32 is NumPy's float32 log2 as far as its floor goes (csrc).
    lg = np.floor(np.log2(np.where(ok, amax, np.uint32(0x3F800000)).view(F32).astype(np.float64)).astype(F32))
    e = np.where(ok, _trunc_or_zero((lg - F32(2)) + F32(127)) & 0xFF, 0).astype(np.uint8)
    dk = _e8m0_half(e)[:, None] * FP4_VALUES[None, :]
    q = np.argmin(np.abs(dk[:, None, :] - x[:, :, None]), axis=2).astype(np.uint8)
    return np.concatenate([e[:, None], _pack_split(q)], axis=1)


# --- K-quants (ggml's quantize_row_q4_K_ref / _q5_K_ref / _q6_K_ref, csrc/quantize_ggml.c) --
# The C works on one sub-block at a time; here each step runs on every sub-block at once,
# with sums taken element by element in the C's order (NumPy's own sums pair terms up).
def _nearest(v):
    """ggml's nearest_int: v + 1.5 * 2**23 in float32, its low 23 bits less 2**22."""
    t = (np.asarray(v, F32) + F32(12582912)).astype(F32)
    return (t.view(np.uint32) & np.uint32(0x7FFFFF)).astype(np.int64) - 0x400000


def _ggml_f16(x):
    """GGML_FP32_TO_FP16 without F16C: NumPy's rounding, 0x7e00 with the sign for NaN."""
    b = _bits(x)
    nan = (b & np.uint32(0x7FFFFFFF)) > INF_BITS
    return np.where(nan, ((b >> 16) & 0x8000) | F16_DEFAULT_NAN, _f16(x)).astype(np.uint16)


def _wsum(w, v):
    """sum of w[:, i] * v[:, i] in order i = 0, 1, ... (float32)."""
    acc = np.zeros(w.shape[0], F32)
    for i in range(w.shape[1]):
        acc = acc + w[:, i] * v[:, i]
    return acc


def _fit_with_min(x, w, nmax, rmin, rdelta, nstep, abs_error=False):
    """make_qkx2_quants on each row of x (squared error, or absolute with ``abs_error``:
    its use_mad): (scale, -min, levels 0..nmax)."""
    err_of = np.abs if abs_error else np.square
    lo, hi = x[:, 0].copy(), x[:, 0].copy()
    sum_w, sum_x = w[:, 0].copy(), w[:, 0] * x[:, 0]
    for i in range(1, x.shape[1]):
        lo = np.where(x[:, i] < lo, x[:, i], lo)
        hi = np.where(x[:, i] > hi, x[:, i], hi)
        sum_w = sum_w + w[:, i]
        sum_x = sum_x + w[:, i] * x[:, i]
    lo = np.where(lo > 0, F32(0), lo).astype(F32)
    flat, lo0 = hi == lo, lo
    iscale = F32(nmax) / (hi - lo)
    scale = F32(1) / iscale
    L = np.clip(_nearest(iscale[:, None] * (x - lo[:, None])), 0, nmax)
    best = _wsum(w, err_of(scale[:, None] * L.astype(F32) + lo[:, None] - x))
    for step in range(nstep + 1):
        iscale = (F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)) / (hi - lo)
        trial = np.clip(_nearest(iscale[:, None] * (x - lo[:, None])), 0, nmax)
        fl = trial.astype(F32)
        sum_l, sum_l2, sum_xl = _wsum(w, fl), _wsum(w * fl, fl), _wsum(w * fl, x)
        det = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
        up = this_min > 0
        this_min = np.where(up, F32(0), this_min).astype(F32)
        this_scale = np.where(up, sum_xl / sum_l2, this_scale).astype(F32)
        err = _wsum(w, err_of(this_scale[:, None] * fl + this_min[:, None] - x))
        take = (det > 0) & (err < best)
        L = np.where(take[:, None], trial, L)
        best = np.where(take, err, best)
        scale = np.where(take, this_scale, scale)
        lo = np.where(take, this_min, lo)
    L[flat] = 0
    return np.where(flat, F32(0), scale).astype(F32), -np.where(flat, lo0, lo).astype(F32), L


def _fit_symmetric(x, nmax):
    """make_qx_quants with rmse_type 1 on each row of x: (scale, levels + nmax)."""
    big, amax = np.zeros(x.shape[0], F32), np.zeros(x.shape[0], F32)
    for i in range(x.shape[1]):
        ax = np.abs(x[:, i])
        up = ax > amax
        amax, big = np.where(up, ax, amax), np.where(up, x[:, i], big)
    tiny = amax < F32(1e-15)
    w = x * x

    def levels(iscale):
        fl = np.clip(_nearest(iscale[:, None] * x), -nmax, nmax - 1)
        return fl, _wsum(w * x, fl.astype(F32)), _wsum(w * fl.astype(F32), fl.astype(F32))

    fl, sumlx, suml2 = levels(F32(-nmax) / big)
    L = fl + nmax
    scale = np.where(suml2 != 0, sumlx / suml2, F32(0)).astype(F32)
    best = scale * sumlx
    for step in (*range(-9, 0), *range(1, 10)):
        fl, sumlx, suml2 = levels(-(F32(nmax) + F32(0.1) * F32(step)) / big)
        take = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        L = np.where(take[:, None], fl + nmax, L)
        scale = np.where(take, sumlx / suml2, scale).astype(F32)
        best = np.where(take, scale * sumlx, best).astype(F32)
    L[tiny] = 0
    return np.where(tiny, F32(0), scale).astype(F32), L


def _fit_refined(x, nmax):
    """make_q3_quants with do_rmse on each row of x: (scale, levels + nmax; 0 for an
    all-zero row).  The C refines one value at a time; here each value index steps every
    row at once, rows that changed nothing in a pass stopping as the C's do."""
    big, amax = np.zeros(x.shape[0], F32), np.zeros(x.shape[0], F32)
    for i in range(x.shape[1]):
        ax = np.abs(x[:, i])
        up = ax > amax
        amax, big = np.where(up, ax, amax), np.where(up, x[:, i], big)
    tiny = amax < F32(1e-15)
    w = x * x
    L = np.clip(_nearest((F32(-nmax) / big)[:, None] * x), -nmax, nmax - 1)
    fl = L.astype(F32)
    sumlx, suml2 = _wsum(w * x, fl), _wsum(w * fl, fl)
    active = ~tiny
    for _ in range(5):
        changed = np.zeros(x.shape[0], bool)
        for i in range(x.shape[1]):
            wi, xi, li = w[:, i], x[:, i], L[:, i].astype(F32)
            slx = sumlx - wi * xi * li
            sl2 = suml2 - wi * li * li
            new = np.clip(_nearest(xi * sl2 / slx), -nmax, nmax - 1)
            nl = new.astype(F32)
            slx2, sl22 = slx + wi * xi * nl, sl2 + wi * nl * nl
            take = active & (slx > 0) & (new != L[:, i]) & (sl22 > 0) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
            L[:, i] = np.where(take, new, L[:, i])
            sumlx, suml2 = np.where(take, slx2, sumlx).astype(F32), np.where(take, sl22, suml2).astype(F32)
            changed |= take
        active &= changed
        if not active.any():
            break
    L = np.where(tiny[:, None], 0, L + nmax)
    return np.where(tiny | ~(suml2 > 0), F32(0), sumlx / np.where(suml2 > 0, suml2, F32(1))).astype(F32), L


def _pack_2bit(L):
    """Four 2-bit levels a byte: values j, j+32, j+64, j+96 of each 128 (blocks, 256) -> (blocks, 64)."""
    L = L.astype(np.uint8).reshape(-1, 2, 4, 32)
    return (L[:, :, 0] | L[:, :, 1] << 2 | L[:, :, 2] << 4 | L[:, :, 3] << 6).reshape(-1, 64)


def _q2_k_blocks(x):
    """Q2_K: 16 scale|min bytes | 64 B levels | f16 d | f16 dmin."""
    blocks = x.shape[0]
    xs = x.reshape(-1, 16)
    sc, mn, L = _fit_with_min(xs, np.abs(xs), 3, -0.5, 0.1, 15, abs_error=True)
    sc, mn = sc.reshape(blocks, 16), mn.reshape(blocks, 16)
    max_scale, max_min = _running_max(sc), _running_max(mn)
    has_s, has_m = max_scale > 0, max_min > 0
    ls = np.where(has_s[:, None], _nearest((F32(15) / np.where(has_s, max_scale, F32(1)))[:, None] * sc), 0)
    lm = np.where(has_m[:, None], _nearest((F32(15) / np.where(has_m, max_min, F32(1)))[:, None] * mn), 0)
    scales = ((ls & 0xFF) | (lm << 4)) & 0xFF
    d16 = np.where(has_s, _ggml_f16(max_scale / F32(15)), 0).astype(np.uint16)
    m16 = np.where(has_m, _ggml_f16(max_min / F32(15)), 0).astype(np.uint16)
    d = (_f32(d16)[:, None] * (scales & 0xF).astype(F32)).reshape(-1)
    dm = (_f32(m16)[:, None] * (scales >> 4).astype(F32)).reshape(-1)
    again = np.clip(_nearest((xs + dm[:, None]) / d[:, None]), 0, 3)
    L = np.where((d != 0)[:, None], again, L).reshape(blocks, 256)
    return np.concatenate([scales.astype(np.uint8), _pack_2bit(L), _u16_bytes(d16), _u16_bytes(m16)], axis=1)


def _q3_k_blocks(x):
    """Q3_K: 32 B high-bit mask | 64 B low levels | 12 B 6-bit scales | f16 d."""
    blocks = x.shape[0]
    sc, L = _fit_refined(x.reshape(-1, 16), 4)
    sc, L = sc.reshape(blocks, 16), L.reshape(blocks, 256)
    max_scale = _running_max(sc, np.abs)
    nonzero = max_scale != 0  # ggml's `if (max_scale)`: NaN too
    iscale = F32(-32) / np.where(nonzero, max_scale, F32(1))
    low_byte = ((_nearest(iscale[:, None] * sc) + 128) & 0xFF) - 128  # ggml's int8_t
    six = np.where(nonzero[:, None], np.clip(low_byte, -32, 31) + 32, 0)
    shifts = 2 * (np.arange(16) // 4)
    high = (six >> 4) << shifts
    scales = np.concatenate([(six[:, :8] & 0xF) | (six[:, 8:] & 0xF) << 4,
                             high[:, 0:4] | high[:, 4:8] | high[:, 8:12] | high[:, 12:16]], axis=1).astype(np.uint8)
    d16 = np.where(nonzero, _ggml_f16(F32(1) / iscale), 0).astype(np.uint16)
    d = (_f32(d16)[:, None] * (six - 32).astype(F32)).reshape(-1)
    again = np.clip(_nearest(x.reshape(-1, 16) / d[:, None]), -4, 3) + 4
    L = np.where((d != 0)[:, None], again, L.reshape(-1, 16)).reshape(blocks, 8, 32)
    top = L > 3
    hmask = np.bitwise_or.reduce(top.astype(np.uint8) << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)
    low = np.where(top, L - 4, L).reshape(blocks, 256)
    return np.concatenate([hmask.astype(np.uint8), _pack_2bit(low), scales, _u16_bytes(d16)], axis=1)


def _running_max(v, key=None):
    """The C's `if (k(v[j]) > best) best = v[j]` from 0 over each row's values in order."""
    best, kbest = np.zeros(v.shape[0], F32), np.zeros(v.shape[0], F32)
    for j in range(v.shape[1]):
        k = v[:, j] if key is None else key(v[:, j])
        up = k > kbest
        best, kbest = np.where(up, v[:, j], best), np.where(up, k, kbest)
    return best


def _k_scales_mins(x, nmax, rmin, nstep):
    """Q4_K / Q5_K: d | dmin | 12 scale bytes, and the levels (blocks, 256)."""
    blocks = x.shape[0]
    xs = x.reshape(-1, 32)
    av_x = np.sqrt(_wsum(xs, xs) / F32(32))
    sc, mn, L = _fit_with_min(xs, av_x[:, None] + np.abs(xs), nmax, rmin, 0.1, nstep)
    sc, mn = sc.reshape(blocks, 8), mn.reshape(blocks, 8)
    max_scale, max_min = _running_max(sc), _running_max(mn)
    inv_scale = np.where(max_scale > 0, F32(63) / np.where(max_scale > 0, max_scale, F32(1)), F32(0)).astype(F32)
    inv_min = np.where(max_min > 0, F32(63) / np.where(max_min > 0, max_min, F32(1)), F32(0)).astype(F32)
    ls = np.minimum(_nearest(inv_scale[:, None] * sc) & 0xFF, 63)
    lm = np.minimum(_nearest(inv_min[:, None] * mn) & 0xFF, 63)
    scales = np.concatenate([ls[:, :4] | (ls[:, 4:] >> 4) << 6, lm[:, :4] | (lm[:, 4:] >> 4) << 6,
                             (ls[:, 4:] & 0xF) | (lm[:, 4:] & 0xF) << 4], axis=1).astype(np.uint8)
    d16, m16 = _ggml_f16(max_scale / F32(63)), _ggml_f16(max_min / F32(63))
    d = (_f32(d16)[:, None] * ls.astype(F32)).reshape(-1)
    dm = (_f32(m16)[:, None] * lm.astype(F32)).reshape(-1)
    again = np.clip(_nearest((xs + dm[:, None]) / d[:, None]), 0, nmax)
    L = np.where((d != 0)[:, None], again, L).astype(np.uint8).reshape(blocks, 256)
    return np.concatenate([_u16_bytes(d16), _u16_bytes(m16), scales], axis=1), L


def _q4_k_blocks(x):
    head, L = _k_scales_mins(x, 15, -1.0, 20)
    L = L.reshape(-1, 4, 2, 32)
    return np.concatenate([head, (L[:, :, 0] | L[:, :, 1] << 4).reshape(-1, 128)], axis=1)


def _q5_k_blocks(x):
    head, L = _k_scales_mins(x, 31, -0.5, 15)
    L = L.reshape(-1, 4, 2, 32)
    high = (L >> 4).astype(np.uint8) << (2 * np.arange(4, dtype=np.uint8)[None, :, None, None]
                                         + np.arange(2, dtype=np.uint8)[None, None, :, None])
    qh = np.bitwise_or.reduce(high.reshape(-1, 8, 32), axis=1).astype(np.uint8)
    qs = ((L[:, :, 0] & 0xF) | (L[:, :, 1] & 0xF) << 4).reshape(-1, 128)
    return np.concatenate([head, qh, qs], axis=1)


def _q6_k_blocks(x):
    blocks = x.shape[0]
    sc, L = _fit_symmetric(x.reshape(-1, 16), 32)
    sc, L = sc.reshape(blocks, 16), L.reshape(blocks, 256)
    max_scale = _running_max(sc, np.abs)
    tiny = np.abs(max_scale) < F32(1e-15)  # |max_scale| is the largest |scale|
    iscale = F32(-128) / np.where(tiny, F32(1), max_scale)
    d16 = _ggml_f16(F32(1) / iscale)
    scales = np.minimum(_nearest(iscale[:, None] * sc), 127).astype(np.int8)
    d = (_f32(d16)[:, None] * scales.astype(F32)).reshape(-1)
    again = np.clip(_nearest(x.reshape(-1, 16) / d[:, None]), -32, 31) + 32
    L = np.where((d != 0)[:, None], again, L.reshape(-1, 16)).astype(np.uint8).reshape(blocks, 2, 4, 32)
    ql = np.concatenate([(L[:, :, 0] & 0xF) | (L[:, :, 2] & 0xF) << 4,
                         (L[:, :, 1] & 0xF) | (L[:, :, 3] & 0xF) << 4], axis=2).reshape(-1, 128)
    qh = (L[:, :, 0] >> 4 | (L[:, :, 1] >> 4) << 2 | (L[:, :, 2] >> 4) << 4 | (L[:, :, 3] >> 4) << 6).reshape(-1, 64)
    out = np.concatenate([ql, qh, scales.view(np.uint8), _u16_bytes(d16)], axis=1).astype(np.uint8)
    out[tiny] = 0
    return out


def _q8_k_blocks(x):
    """Q8_K (csrc/quantize_ggml.c's notes): d = 1 / (-127 / max), max the first value of
    the largest |x| (NaN skipped); q = min(127, nearest_int(iscale * x)), its low byte;
    16 int16 sums of 16 q each; an all-zero block is all zero bytes."""
    absx = np.where(np.isnan(x), F32(0), np.abs(x))  # NaN never wins the C's `>`
    amax = absx.max(axis=1)
    first = np.argmax(absx == amax[:, None], axis=1)  # ties: the first one, as `>` keeps it
    mx = x[np.arange(x.shape[0]), first]
    zero = amax == 0
    iscale = (F32(-127) / np.where(zero, F32(1), mx)).astype(F32)
    q = (np.minimum(_nearest(iscale[:, None] * x), 127) & 0xFF).astype(np.uint8)
    sums = q.view(np.int8).astype(np.int64).reshape(-1, 16, 16).sum(axis=2)
    d = (F32(1) / iscale).astype("<f4")
    out = np.concatenate([d[:, None].view(np.uint8), q, sums.astype("<i2").view(np.uint8)], axis=1)
    out[zero] = 0
    return out


# --- IQ4_NL / IQ4_XS (ggml's quantize_iq4_nl / quantize_iq4_xs, no importance matrix) -----
#: ggml's kvalues_iq4nl, ascending.
_IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], F32)


def _iq4_index(v):
    """ggml's best_index_int8 over the IQ4 levels: the interval holding v, then the lower
    end only when strictly nearer; NaN gives 15 as ggml's binary search does."""
    v = np.asarray(v, F32)
    hi = np.clip(np.searchsorted(_IQ4_VALUES, v, side="right"), 1, 15)
    idx = np.where(v - _IQ4_VALUES[hi - 1] < _IQ4_VALUES[hi] - v, hi - 1, hi)
    idx = np.where(v <= _IQ4_VALUES[0], 0, idx)
    return np.where((v >= _IQ4_VALUES[15]) | np.isnan(v), 15, idx)


def _iq4_fit(x):
    """The scale of each 32-value row (csrc/quantize_ggml.c's iq4_fit): weights x^2, the
    least-squares scale of the levels from -max/-127, then 15 trial inverse scales."""
    w = x * x
    big = _running_max(x, np.abs)
    tiny = np.abs(big) < F32(1e-15)
    big = np.where(tiny, F32(1), big).astype(F32)

    def sums(inv):
        q = _IQ4_VALUES[_iq4_index(inv[:, None] * x)]
        wq = w * q
        return _wsum(wq, x), _wsum(wq, q)

    sumqx, sumq2 = sums(F32(1) / (-big / F32(-127)))
    pos = sumq2 > 0
    d = np.where(pos, sumqx / np.where(pos, sumq2, F32(1)), F32(0)).astype(F32)
    best = (d * sumqx).astype(F32)
    for itry in range(-7, 8):
        sqx, sq2 = sums((F32(itry - 127) / big).astype(F32))
        take = (sq2 > 0) & (sqx * sqx > best * sq2)
        d = np.where(take, sqx / np.where(take, sq2, F32(1)), d).astype(F32)
        best = np.where(take, d * sqx, best).astype(F32)
    return np.where(tiny, F32(0), d).astype(F32)


def _inv_or_zero(d):
    """ggml's ``d ? 1/d : 0`` (a NaN d is true there)."""
    return np.where(d != 0, F32(1) / np.where(d != 0, d, F32(1)), F32(0)).astype(F32)


def _iq4_nl_blocks(x):
    """IQ4_NL: f16 d | 16 nibble bytes (levels nearest x / d, the float32 d)."""
    d = _iq4_fit(x)
    L = _iq4_index(_inv_or_zero(d)[:, None] * x)
    return np.concatenate([_u16_bytes(_ggml_f16(d)), _pack_split(L)], axis=1)


def _iq4_xs_blocks(x):
    """IQ4_XS: f16 d | u16 scales_h | 4 B scales_l | 128 nibble bytes."""
    blocks = x.shape[0]
    xs = x.reshape(-1, 32)
    sc = _iq4_fit(xs).reshape(blocks, 8)
    d = (-_running_max(sc, np.abs) / F32(32)).astype(F32)
    ls = np.clip(_nearest(_inv_or_zero(d)[:, None] * sc), -32, 31)
    dl = (d[:, None] * ls.astype(F32)).reshape(-1)
    L = _iq4_index(_inv_or_zero(dl)[:, None] * xs)
    six = ls + 32
    scales_l = ((six[:, 0::2] & 0xF) | (six[:, 1::2] & 0xF) << 4).astype(np.uint8)
    scales_h = ((six >> 4) << (2 * np.arange(8))).sum(axis=1)
    return np.concatenate([_u16_bytes(_ggml_f16(d)), _u16_bytes(scales_h), scales_l,
                           _pack_split(L).reshape(blocks, 128)], axis=1)


# --- IQ3_S (ggml's quantize_iq3_s, no importance matrix; csrc/quantize_ggml.c) -------------
_IQ3S: dict = {}


def _iq3s_tables():
    """ggml's iq3xs_init_impl(512) from the grid: each point u = l0 | l1 << 3 | l2 << 6 | l3 << 9
    -> its grid index (-1 off the grid), and for the points off it their neighbours (every grid
    point at one of the three smallest squared distances, nearest first, lower index first),
    padded with -1; plus the grid's levels (coordinate - 1) / 2."""
    if not _IQ3S:
        grid = _grid("IQ3_S").astype(np.int64)
        levels = (grid - 1) // 2
        points = levels[:, 0] | levels[:, 1] << 3 | levels[:, 2] << 6 | levels[:, 3] << 9
        index = np.full(4096, -1, np.int64)
        index[points] = np.arange(512)
        u = np.arange(4096)
        coords = 2 * ((u[:, None] >> (3 * np.arange(4))) & 7) + 1
        d2 = ((coords[:, None, :] - grid[None, :, :]) ** 2).sum(axis=2)
        order = np.lexsort((np.broadcast_to(np.arange(512), d2.shape), d2), axis=1)
        ranked = np.take_along_axis(d2, order, axis=1)
        distinct = np.cumsum(np.concatenate([np.ones((4096, 1), bool), ranked[:, 1:] != ranked[:, :-1]], axis=1),
                             axis=1)
        keep = distinct <= 3
        width = int(keep.sum(axis=1).max())
        neighbours = np.where(keep[:, :width], order[:, :width], -1)
        _IQ3S.update(index=index, neighbours=neighbours, levels=levels, coords=grid.astype(F32))
    return _IQ3S


def _iq3s_levels_at(xval, id_):
    """clamp(nearest((id * x - 1) / 2), 0, 7) of each value, and the point u of each four."""
    L = np.clip(_nearest(F32(0.5) * (id_[:, None] * xval - F32(1))), 0, 7)
    g = L.reshape(L.shape[0], 8, 4)
    return L, g[:, :, 0] | g[:, :, 1] << 3 | g[:, :, 2] << 6 | g[:, :, 3] << 9


def _iq3s_neighbours(t, u, xval, waux, scale, L):
    """For each four off the grid (u's index < 0): the neighbour of least sum w * (scale * g - x)^2,
    first of equals (the first neighbour when none is below FLT_MAX: ggml aborts there); its
    levels go into L, its index is returned (the grid index of u elsewhere)."""
    idx = t["index"][u]
    rows, groups = np.nonzero(idx < 0)
    if rows.size:
        nbs = t["neighbours"][u[rows, groups]]
        x4 = xval.reshape(-1, 8, 4)[rows, groups]
        w4 = waux.reshape(-1, 8, 4)[rows, groups]
        g = t["coords"][np.maximum(nbs, 0)]
        d2 = np.zeros(nbs.shape, F32)
        for i in range(4):
            diff = scale[rows, None] * g[:, :, i] - x4[:, None, i]
            d2 = d2 + w4[:, None, i] * diff * diff
        best = np.full(rows.size, np.finfo(F32).max, F32)
        pick = nbs[:, 0].copy()
        for j in range(nbs.shape[1]):
            up = (nbs[:, j] >= 0) & (d2[:, j] < best)
            best = np.where(up, d2[:, j], best)
            pick = np.where(up, nbs[:, j], pick)
        idx[rows, groups] = pick
        L.reshape(-1, 8, 4)[rows, groups] = t["levels"][pick]
    return idx


def _iq3s_sums(weight, xval, L):
    q = (2 * L + 1).astype(F32)
    return _wsum(weight * xval, q), _wsum(weight * q, q)


def _iq3_s_blocks(x):
    """IQ3_S: f16 d | 64 B qs | 8 B qh | 32 B signs | 4 B scales (csrc/quantize_ggml.c's
    iq3_s_quantize_block, every sub-block of 32 at once)."""
    t = _iq3s_tables()
    blocks = x.shape[0]
    xb = x.reshape(-1, 32)
    weight = (xb * xb).astype(F32)
    waux = np.sqrt(weight)
    neg = ~(xb >= 0)
    xval = np.where(neg, -xb, xb).astype(F32)
    signs = (neg.reshape(-1, 4, 8).astype(np.uint8) << np.arange(8, dtype=np.uint8)).sum(axis=2, dtype=np.uint8)
    mx = xval[:, 0]
    for i in range(1, 32):
        mx = np.where(mx > xval[:, i], mx, xval[:, i])
    live = mx != 0
    scale = (mx / F32(15)).astype(F32)
    best = np.zeros_like(scale)
    L = np.zeros(xb.shape, np.int64)
    on_grid = np.zeros((xb.shape[0], 8), bool)
    for k in range(-9, 10):
        id_ = ((F32(15) + F32(k) * F32(0.2)) / mx).astype(F32)
        Laux, u = _iq3s_levels_at(xval, id_)
        on = t["index"][u] >= 0
        _iq3s_neighbours(t, u, xval, waux, (F32(1) / id_).astype(F32), Laux)
        sumqx, sumq2 = _iq3s_sums(weight, xval, Laux)
        take = live & (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
        scale = np.where(take, sumqx / np.where(take, sumq2, F32(1)), scale).astype(F32)
        best = np.where(take, scale * sumqx, best).astype(F32)
        L = np.where(take[:, None], Laux, L)
        on_grid = np.where(take[:, None], on, on_grid)
    refit = live & ~on_grid.all(axis=1) & (scale > 0)
    if refit.any():
        r = np.flatnonzero(refit)
        _, u = _iq3s_levels_at(xval[r], (F32(1) / scale[r]).astype(F32))
        Lr = L[r]
        idx = _iq3s_neighbours(t, u, xval[r], waux[r], scale[r], Lr)
        Lr = t["levels"][idx].reshape(-1, 32)
        L[r] = Lr
        sumqx, sumq2 = _iq3s_sums(weight[r], xval[r], Lr)
        scale[r] = np.where(sumq2 > 0, sumqx / np.where(sumq2 > 0, sumq2, F32(1)), scale[r])
    flip = scale < 0
    scale = np.where(flip, -scale, scale).astype(F32)
    signs = np.where(flip[:, None], ~signs, signs).astype(np.uint8)
    g = L.reshape(-1, 8, 4)
    index = t["index"][g[:, :, 0] | g[:, :, 1] << 3 | g[:, :, 2] << 6 | g[:, :, 3] << 9]
    # A sub-block of zeros writes no qs or signs: the next ones move up (ggml's pointers).
    live = live.reshape(blocks, 8)
    slot = np.cumsum(live, axis=1) - 1
    rows, ibs = np.nonzero(live)
    qs = np.zeros((blocks, 8, 8), np.uint8)
    sg = np.zeros((blocks, 8, 4), np.uint8)
    qs[rows, slot[rows, ibs]] = (index.reshape(blocks, 8, 8)[rows, ibs] & 255).astype(np.uint8)
    sg[rows, slot[rows, ibs]] = signs.reshape(blocks, 8, 4)[rows, ibs]
    qh = ((index >> 8) << np.arange(8)).sum(axis=1).reshape(blocks, 8)
    qh = np.where(live, qh, 0).astype(np.uint8)
    scales = np.where(live, scale.reshape(blocks, 8), F32(0)).astype(F32)
    max_scale = np.zeros(blocks, F32)
    for ib in range(8):
        max_scale = np.where(live[:, ib], np.where(max_scale > scales[:, ib], max_scale, scales[:, ib]), max_scale)
    has = max_scale != 0
    d = (max_scale / F32(31)).astype(F32)
    d16 = np.where(has, _ggml_f16((d * F32(1.033)).astype(F32)), 0).astype(np.uint16)
    inv = (F32(1) / np.where(has, d, F32(1))).astype(F32)
    ls = np.clip(_nearest(F32(0.5) * (inv[:, None] * scales - F32(1))), 0, 15)
    ls = np.where(has[:, None], ls, 0)
    scale_bytes = (ls[:, 0::2] | ls[:, 1::2] << 4).astype(np.uint8)
    return np.concatenate([_u16_bytes(d16), qs.reshape(blocks, 64), qh, sg.reshape(blocks, 32), scale_bytes],
                          axis=1)


# --- Q1_0 (ggml's quantize_row_q1_0_ref) ------------------------------------------------
def _q1_0_blocks(x):
    """Q1_0: f16 d = (sum of |x| in order, float32) / 128 | 16 bytes of bits x >= 0 (lowest first)."""
    acc = np.zeros(x.shape[0], F32)
    for j in range(x.shape[1]):
        acc = (acc + np.abs(x[:, j])).astype(F32)
    d = (acc / F32(128)).astype(F32)
    bits = (x >= 0).reshape(-1, 16, 8).astype(np.uint8) << np.arange(8, dtype=np.uint8)
    return np.concatenate([_u16_bytes(_ggml_f16(d)), bits.sum(axis=2, dtype=np.uint8)], axis=1)


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


_BLOCK_QUANTIZERS = {"Q8_0": _q8_0_blocks, "Q4_0": _q4_0_blocks, "Q4_1": _q4_1_blocks, "Q5_0": _q5_0_blocks,
                     "Q5_1": _q5_1_blocks, "TQ1_0": _tq1_0_blocks, "TQ2_0": _tq2_0_blocks, "MXFP4": _mxfp4_blocks,
                     "Q2_K": _q2_k_blocks, "Q3_K": _q3_k_blocks, "Q4_K": _q4_k_blocks, "Q5_K": _q5_k_blocks,
                     "Q6_K": _q6_k_blocks, "Q8_K": _q8_k_blocks, "IQ4_NL": _iq4_nl_blocks,
                     "IQ4_XS": _iq4_xs_blocks, "IQ3_S": _iq3_s_blocks, "Q1_0": _q1_0_blocks}
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


# --- the other GGML types: gguf-py's dequantize_blocks, operation for operation ---------
# Each float32 operation is gguf-py's, in its order (d * q, then - m; (d * (0.5 + s)) *
# 0.25; (db * grid) * sign with sign a float +-1, never a negation), so NaN and infinite
# scales give its bits.  Q8_1, Q8_K and Q1_0, which gguf-py cannot dequantize, follow
# ggml's dequantize_row_* (docs/FORMAT.md).

def _bits_of(b, count, width=1):
    """The low ``width`` bits of b >> (width * k), k < count, as a new last axis."""
    shifts = (np.arange(count, dtype=np.uint8) * np.uint8(width)).astype(b.dtype)
    return (b[..., None] >> shifts) & b.dtype.type((1 << width) - 1)


def _signs(bits):
    """+1.0 where a sign bit is 0, -1.0 where it is 1 (float32)."""
    return np.where(bits == 0, F32(1), F32(-1)).astype(F32)


def _dq_q8_1(b):
    """ggml: y = q * d (its f16 s, d * sum(q), is not needed)."""
    return b[:, 4:36].view(np.int8).astype(F32) * _f32(_le16(b, 0))[:, None]


def _dq_q2_k(b):
    """16 sub-blocks of 16: y = (d * (sc & 15)) * q - dmin * (sc >> 4); element 128j + 32l + m
    is bits 2l.. of qs[32j + m]."""
    d, dmin = _f32(_le16(b, 80))[:, None], _f32(_le16(b, 82))[:, None]
    sc = b[:, 0:16]
    dl = (d * (sc & 0x0F).astype(F32))[:, :, None]
    ml = (dmin * (sc >> 4).astype(F32))[:, :, None]
    q = _bits_of(b[:, 16:80].reshape(-1, 2, 32), 4, 2).transpose(0, 1, 3, 2).reshape(-1, 16, 16).astype(F32)
    return (dl * q - ml).reshape(-1, QK_K)


def _dq_q3_k(b):
    """y = (d * (scale - 32)) * (low 2 bits - 4 * (1 - high bit)); 6-bit scales packed in 12 bytes."""
    d = _f32(_le16(b, 108))[:, None]
    s = b[:, 96:108]
    low = _bits_of(s[:, 0:8], 2, 4).transpose(0, 2, 1).reshape(-1, 16)   # k * 8 + i: (s[i] >> 4k) & 15
    high = _bits_of(s[:, 8:12], 4, 2).transpose(0, 2, 1).reshape(-1, 16)  # k * 4 + i: (s[8 + i] >> 2k) & 3
    scale = ((low | (high << 4)).astype(np.int8) - np.int8(32)).astype(F32)
    dl = (d * scale)[:, :, None]
    ql = _bits_of(b[:, 32:96].reshape(-1, 2, 32), 4, 2).transpose(0, 1, 3, 2).reshape(-1, 16, 16)
    qh = _bits_of(b[:, 0:32], 8).transpose(0, 2, 1).reshape(-1, 16, 16) ^ np.uint8(1)
    q = (ql.astype(np.int8) - (qh << 2).astype(np.int8)).astype(F32)
    return (dl * q).reshape(-1, QK_K)


def _k_scale_min(s):
    """Q4_K / Q5_K's eight 6-bit scales and mins from 12 bytes (llama.cpp get_scale_min_k4)."""
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc, mn


def _dq_q5_k(b):
    """As Q4_K plus a fifth bit: bit g of qh[m] for element 32g + m."""
    d, dmin = _f32(_le16(b, 0))[:, None], _f32(_le16(b, 2))[:, None]
    sc, mn = _k_scale_min(b[:, 4:16])
    scale, offset = (d * sc.astype(F32))[:, :, None], (dmin * mn.astype(F32))[:, :, None]
    qs = b[:, 48:176].reshape(-1, 4, 32)
    ql = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)
    qh = _bits_of(b[:, 16:48], 8).transpose(0, 2, 1)  # (blocks, 8, 32)
    q = (ql | (qh << 4)).astype(F32)
    return (scale * q - offset).reshape(-1, QK_K)


def _dq_q8_k(b):
    """ggml: y = d * q with an f32 d (the 16 i16 sums are not needed)."""
    d = b[:, 0:4].copy().view("<f4").astype(F32)
    return d * b[:, 4:260].view(np.int8).astype(F32)


_GRIDS: dict = {}


def _grid(name):
    """An IQ grid as float32 rows (decoded once from aprfast._pure._iq_grids)."""
    if name not in _GRIDS:
        from ._iq_grids import GRIDS

        rows, cols, value_map, packed = GRIDS[name]
        bits = (len(value_map) - 1).bit_length()
        per_byte = 8 // bits
        data = np.frombuffer(bytes.fromhex(packed.decode("ascii")), np.uint8)
        index = _bits_of(data, per_byte, 8 // per_byte) & np.uint8((1 << bits) - 1)
        _GRIDS[name] = np.asarray(value_map, F32)[index.reshape(rows, cols)]
    return _GRIDS[name]


def _ksigns():
    from ._iq_grids import KSIGNS

    return np.frombuffer(KSIGNS, np.uint8)


def _grid_times_signs(db, grid, sign_bytes):
    """(db * grid) * sign, one row of grid values per sign byte."""
    return db * grid * _signs(_bits_of(sign_bytes, 8))


def _dq_iq2_xxs(b):
    """Per 32 values: 4 grid indices (bytes), then a u32 of four 7-bit sign indices and a 4-bit scale."""
    d = _f32(_le16(b, 0))[:, None]
    aux = b[:, 2:66].copy().view("<u4").reshape(-1, 8, 2)
    db = (d * (F32(0.5) + (aux[:, :, 1] >> 28).astype(F32)) * F32(0.25))[:, :, None, None]
    sign_index = (aux[:, :, 1, None] >> np.array([0, 7, 14, 21], np.uint32)) & np.uint32(0x7F)
    grid = _grid("IQ2_XXS")[b[:, 2:66].reshape(-1, 8, 2, 4)[:, :, 0, :]]  # (blocks, 8, 4, 8)
    return _grid_times_signs(db, grid, _ksigns()[sign_index]).reshape(-1, QK_K)


def _dq_iq2_xs(b):
    """32 u16: 9-bit grid index, 7-bit sign index; a 4-bit scale per 16 values."""
    d = _f32(_le16(b, 0))[:, None]
    qs = b[:, 2:66].copy().view("<u2")  # (blocks, 32)
    sc = _bits_of(b[:, 66:74], 2, 4).reshape(-1, 16)
    db = (d * (F32(0.5) + sc.astype(F32)) * F32(0.25)).reshape(-1, 16, 1, 1)
    grid = _grid("IQ2_XS")[qs & np.uint16(511)].reshape(-1, 16, 2, 8)
    signs = _ksigns()[qs >> 9].reshape(-1, 16, 2)
    return _grid_times_signs(db, grid, signs).reshape(-1, QK_K)


def _dq_iq2_s(b):
    """32 grid indices of 10 bits (8 in qs, 2 in qh), 32 sign bytes, a 4-bit scale per 16 values."""
    d = _f32(_le16(b, 0))[:, None]
    sc = _bits_of(b[:, 74:82], 2, 4).reshape(-1, 16)
    db = (d * (F32(0.5) + sc.astype(F32)) * F32(0.25)).reshape(-1, 16, 1, 1)
    high = _bits_of(b[:, 66:74], 4, 2).reshape(-1, 32).astype(np.uint16)
    index = b[:, 2:34].astype(np.uint16) | (high << 8)
    grid = _grid("IQ2_S")[index].reshape(-1, 16, 2, 8)
    return _grid_times_signs(db, grid, b[:, 34:66].reshape(-1, 16, 2)).reshape(-1, QK_K)


def _dq_iq3_xxs(b):
    """Per 32 values: 8 grid indices (4 values each), and a u32 of four sign indices and a scale."""
    d = _f32(_le16(b, 0))[:, None]
    aux = b[:, 66:98].copy().view("<u4")  # (blocks, 8)
    db = (d * (F32(0.5) + (aux >> 28).astype(F32)) * F32(0.5))[:, :, None, None]
    sign_index = (aux[:, :, None] >> np.array([0, 7, 14, 21], np.uint32)) & np.uint32(0x7F)
    grid = _grid("IQ3_XXS")[b[:, 2:66]].reshape(-1, 8, 4, 8)
    return _grid_times_signs(db, grid, _ksigns()[sign_index]).reshape(-1, QK_K)


def _dq_iq3_s(b):
    """64 grid indices of 9 bits (8 in qs, 1 in qh), 32 sign bytes, a 4-bit scale per 32: db = d * (1 + 2s)."""
    d = _f32(_le16(b, 0))[:, None]
    sc = _bits_of(b[:, 106:110], 2, 4).reshape(-1, 8)
    db = (d * (np.uint8(1) + np.uint8(2) * sc)).reshape(-1, 8, 1, 1)
    high = _bits_of(b[:, 66:74], 8).reshape(-1, 64).astype(np.uint16)
    index = b[:, 2:66].astype(np.uint16) | (high << 8)
    grid = _grid("IQ3_S")[index].reshape(-1, 8, 4, 8)
    return _grid_times_signs(db, grid, b[:, 74:106].reshape(-1, 8, 4)).reshape(-1, QK_K)


def _dq_iq1_s(b):
    """Per 32 values: 4 grid indices of 11 bits (8 in qs, 3 in qh); qh's top bits give
    dl = d * (2s + 1) and delta = -+0.125; y = dl * (grid + delta)."""
    d = _f32(_le16(b, 0))[:, None]
    qh = b[:, 34:50].copy().view("<u2")  # (blocks, 8)
    dl = (d * (np.uint16(2) * ((qh >> 12) & np.uint16(7)) + np.uint16(1))).reshape(-1, 8, 1, 1)
    delta = np.where((qh & np.uint16(0x8000)) == 0, F32(0.125), F32(-0.125)).astype(F32).reshape(-1, 8, 1, 1)
    high = _bits_of(qh, 4, 3)  # (blocks, 8, 4)
    index = b[:, 2:34].astype(np.uint16) | (high.reshape(-1, 32) << 8)
    grid = _grid("IQ1_S")[index].reshape(-1, 8, 4, 8)
    return (dl * (grid + delta)).reshape(-1, QK_K)


def _dq_iq1_m(b):
    """As IQ1_S with a 3-bit scale per 16 values and the f16 d spread over the scales' top nibbles."""
    sc = b[:, 48:56].copy().view("<u2")  # (blocks, 4)
    dh = ((sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & np.uint16(0xF0)) | ((sc[:, 2] >> 4) & np.uint16(0xF00))
          | (sc[:, 3] & np.uint16(0xF000)))
    d = _f32(dh)[:, None]
    s = _bits_of(sc, 4, 3).reshape(-1, 16)
    dl = (d * (np.uint16(2) * s + np.uint16(1))).reshape(-1, 8, 2, 1, 1)
    qh = _bits_of(b[:, 32:48], 2, 4).reshape(-1, 32)  # (blocks, 32): a nibble per grid index
    delta = np.where((qh & 0x08) == 0, F32(0.125), F32(-0.125)).astype(F32).reshape(-1, 8, 2, 2, 1)
    index = b[:, 0:32].astype(np.uint16) | ((qh & 0x07).astype(np.uint16) << 8)
    grid = _grid("IQ1_S")[index].reshape(-1, 8, 2, 2, 8)
    return (dl * (grid + delta)).reshape(-1, QK_K)


IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], F32)


def _dq_iq4_nl(b):
    return _f32(_le16(b, 0))[:, None] * IQ4_VALUES[_split_nibbles(b[:, 2:18])]


def _dq_iq4_xs(b):
    """IQ4_NL's values with a 6-bit scale (minus 32) per 32: low 4 bits in scales_l, top 2 in scales_h."""
    d = _f32(_le16(b, 0))[:, None]
    low = _bits_of(b[:, 4:8], 2, 4).reshape(-1, 8)
    high = (_bits_of(b[:, 2:4].copy().view("<u2"), 8, 2).reshape(-1, 8)).astype(np.uint8)
    dl = (d * ((low | (high << 4)).astype(np.int8) - np.int8(32)).astype(F32))[:, :, None]
    qs = b[:, 8:136].reshape(-1, 8, 16)
    return (dl * IQ4_VALUES[np.concatenate([qs & 0x0F, qs >> 4], axis=2)]).reshape(-1, QK_K)


POW3 = np.array([1, 3, 9, 27, 81], np.uint8)


def _trits(q):
    """A byte holding up to five base-3 digits as their digits: ((q * 3^k mod 256) * 3) >> 8, minus 1."""
    return (((q.astype(np.uint16) * 3) >> 8).astype(np.int8) - np.int8(1)).astype(F32)


def _dq_tq1_0(b):
    """Ternary, 5 values a byte in qs (32 + 16 bytes), 4 a byte in qh; y = d * t."""
    d = _f32(_le16(b, 52))[:, None]
    q0 = (b[:, 0:32, None] * POW3).transpose(0, 2, 1).reshape(-1, 160)
    q1 = (b[:, 32:48, None] * POW3).transpose(0, 2, 1).reshape(-1, 80)
    qh = (b[:, 48:52, None] * POW3[:4]).transpose(0, 2, 1).reshape(-1, 16)
    return d * _trits(np.concatenate([q0, q1, qh], axis=1))


def _dq_tq2_0(b):
    """Ternary, 2 bits a value: element 128j + 32l + m is bits 2l.. of qs[32j + m], minus 1."""
    d = _f32(_le16(b, 64))[:, None]
    q = _bits_of(b[:, 0:64].reshape(-1, 2, 32), 4, 2).transpose(0, 1, 3, 2).reshape(-1, QK_K)
    return d * (q.astype(np.int8) - np.int8(1)).astype(F32)


FP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], F32)  # e2m1, doubled


def _e8m0_half(e):
    """2**(e - 128) as float32 bits (ggml_e8m0_to_fp32_half): subnormal for e < 2."""
    e = e.astype(np.uint32)
    return np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23)).astype(np.uint32).view(F32)


def _dq_mxfp4(b):
    return _e8m0_half(b[:, 0])[:, None] * FP4_VALUES[_split_nibbles(b[:, 1:17])]


def _ue4m3_half(x):
    """Half of an unsigned e4m3 (ggml_ue4m3_to_fp32); 0 and 0x7F read as 0, the top bit is ignored."""
    x = x.astype(np.int32)
    exp, man = (x >> 3) & 0xF, x & 0x7
    # (8 + man) * 2**(exp - 11) for exp > 0, man * 2**-10 for exp == 0: exact in float32.
    value = np.where(exp == 0, man, 8 + man).astype(F32) * np.exp2(np.maximum(exp, 1) - 11).astype(F32)
    return np.where((x == 0) | (x == 0x7F), F32(0), value).astype(F32)


def _dq_nvfp4(b):
    """Four 16-value sub-blocks, each with a ue4m3 scale: low nibbles of its 8 bytes, then the high ones."""
    d = _ue4m3_half(b[:, 0:4])[:, :, None]
    qs = b[:, 4:36].reshape(-1, 4, 8)
    return (d * FP4_VALUES[np.concatenate([qs & 0x0F, qs >> 4], axis=2)]).reshape(-1, 64)


def _dq_q1_0(b):
    """ggml: bit j of the 16 bytes (lowest first) selects d (1) or -d (0)."""
    d = _f32(_le16(b, 0))[:, None]
    bits = _bits_of(b[:, 2:18], 8).reshape(-1, 128)
    return np.where(bits != 0, d, -d).astype(F32)


_BLOCK_DEQUANTIZERS = {"Q8_0": _dq_q8_0, "Q4_0": _dq_q4_0, "Q4_1": _dq_q4_1, "Q5_0": _dq_q5_0, "Q5_1": _dq_q5_1,
                       "Q4_K": _dq_q4_k, "Q6_K": _dq_q6_k, "APR_FQ8_0": _dq_q8_0,
                       "APR_Q4": lambda b: _dq_interleaved(b, True),
                       "APR_FQ4_0": lambda b: _dq_interleaved(b, False), "Q8_1": _dq_q8_1, "Q2_K": _dq_q2_k,
                       "Q3_K": _dq_q3_k, "Q5_K": _dq_q5_k, "Q8_K": _dq_q8_k, "IQ2_XXS": _dq_iq2_xxs,
                       "IQ2_XS": _dq_iq2_xs, "IQ3_XXS": _dq_iq3_xxs, "IQ1_S": _dq_iq1_s, "IQ4_NL": _dq_iq4_nl,
                       "IQ3_S": _dq_iq3_s, "IQ2_S": _dq_iq2_s, "IQ4_XS": _dq_iq4_xs, "IQ1_M": _dq_iq1_m,
                       "TQ1_0": _dq_tq1_0, "TQ2_0": _dq_tq2_0, "MXFP4": _dq_mxfp4, "NVFP4": _dq_nvfp4,
                       "Q1_0": _dq_q1_0}


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


def quantize_q5_0(src, out, *, threads=0, path=None):
    """GGML Q5_0, bit-identical to gguf-py (len(src) a multiple of 32; 22 bytes a block)."""
    _quantize("Q5_0", src, out, threads, path)


def quantize_q5_1(src, out, *, threads=0, path=None):
    """GGML Q5_1, bit-identical to gguf-py (len(src) a multiple of 32; 24 bytes a block)."""
    _quantize("Q5_1", src, out, threads, path)


def quantize_tq1_0(src, out, *, threads=0, path=None):
    """GGML TQ1_0 (ternary), bit-identical to gguf-py (len(src) a multiple of 256; 54 bytes a block)."""
    _quantize("TQ1_0", src, out, threads, path)


def quantize_tq2_0(src, out, *, threads=0, path=None):
    """GGML TQ2_0 (ternary), bit-identical to gguf-py (len(src) a multiple of 256; 66 bytes a block)."""
    _quantize("TQ2_0", src, out, threads, path)


def quantize_mxfp4(src, out, *, threads=0, path=None):
    """GGML MXFP4, bit-identical to gguf-py (len(src) a multiple of 32; 17 bytes a block)."""
    _quantize("MXFP4", src, out, threads, path)


def quantize_q2_k(src, out, *, threads=0, path=None):
    """GGML Q2_K (ggml's quantize_row_q2_K_ref, bit for bit; len(src) a multiple of 256; 84 bytes a block)."""
    _quantize("Q2_K", src, out, threads, path)


def quantize_q3_k(src, out, *, threads=0, path=None):
    """GGML Q3_K (ggml's quantize_row_q3_K_ref, bit for bit; len(src) a multiple of 256; 110 bytes a block)."""
    _quantize("Q3_K", src, out, threads, path)


def quantize_q4_k(src, out, *, threads=0, path=None):
    """GGML Q4_K (ggml's quantize_row_q4_K_ref, bit for bit; len(src) a multiple of 256; 144 bytes a block)."""
    _quantize("Q4_K", src, out, threads, path)


def quantize_q5_k(src, out, *, threads=0, path=None):
    """GGML Q5_K (ggml's quantize_row_q5_K_ref, bit for bit; len(src) a multiple of 256; 176 bytes a block)."""
    _quantize("Q5_K", src, out, threads, path)


def quantize_q6_k(src, out, *, threads=0, path=None):
    """GGML Q6_K (ggml's quantize_row_q6_K_ref, bit for bit; len(src) a multiple of 256; 210 bytes a block)."""
    _quantize("Q6_K", src, out, threads, path)


def quantize_q8_k(src, out, *, threads=0, path=None):
    """GGML Q8_K (ggml's quantize_row_q8_K_ref, bit for bit; len(src) a multiple of 256; 292 bytes a block)."""
    _quantize("Q8_K", src, out, threads, path)


def quantize_iq4_nl(src, out, *, threads=0, path=None):
    """GGML IQ4_NL (ggml's quantize_iq4_nl without an importance matrix, bit for bit; 18 bytes a block of 32)."""
    _quantize("IQ4_NL", src, out, threads, path)


def quantize_iq4_xs(src, out, *, threads=0, path=None):
    """GGML IQ4_XS (ggml's quantize_iq4_xs without an importance matrix, bit for bit; 136 bytes a block of 256)."""
    _quantize("IQ4_XS", src, out, threads, path)


def quantize_iq3_s(src, out, *, threads=0, path=None):
    """GGML IQ3_S (ggml's quantize_iq3_s without an importance matrix, bit for bit; 110 bytes a block of 256)."""
    _quantize("IQ3_S", src, out, threads, path)


def quantize_q1_0(src, out, *, threads=0, path=None):
    """GGML Q1_0 (ggml's quantize_row_q1_0_ref, bit for bit; 18 bytes a block of 128)."""
    _quantize("Q1_0", src, out, threads, path)


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
    """True if ``quantize`` supports the type (the APR types and the GGML types with a
    quantizer: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, TQ1_0, TQ2_0, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
    IQ4_NL, IQ4_XS, IQ3_S, Q1_0)."""
    return _TABLE[list(TYPES)[_type_id(type_name)]][4]


def available_paths():
    return ["portable"]


def best_path():
    return "portable"


def default_threads():
    return _default_threads()
