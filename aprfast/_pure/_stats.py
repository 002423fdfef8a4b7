"""Tensor statistics, the pure twin of ``aprfast._stats`` (contract in csrc/stats.h).

The same structure as the C: values are summarised in chunks of 4096 (count, NaN /
+Inf / -Inf / zero counts, finite min and max, and the chunk's own mean and M2 over its
finite values), chunks are merged in order into parts of 1 Mi values with Chan et al.'s
update, and parts into the result.  Counts, minima, maxima, integer extremes and the
histogram are exact and equal the C's; ``mean`` and ``m2`` agree to rounding only: here
a chunk's values are added in element order, the C adds them in the order its
vectorizing compiler picks (which differs between its own AVX2 and AVX-512 builds too).

Histogram: value v (as a double) is counted when lo <= v <= hi, in bin
trunc((v - lo) * scale), the last bin for t >= bins; with ``divide`` (a range so
wide or narrow that hi - lo or the scale overflows) t = (v/2 - lo/2) / (hi/2 - lo/2) * bins.
"""

from __future__ import annotations

import math

import numpy as np

from . import _quant
from ._half import bf16_bits_to_f32_bits, f16_bits_to_f32_bits
from ._views import check_uint, typed_view
from ._views import default_threads as _default_threads

KINDS = {"F32": 0, "F64": 1, "F16": 2, "BF16": 3, "I8": 4, "I16": 5, "I32": 6, "I64": 7,
         "U8": 8, "U16": 9, "U32": 10, "U64": 11}
ITEMSIZE = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2, "I8": 1, "I16": 2, "I32": 4, "I64": 8,
            "U8": 1, "U16": 2, "U32": 4, "U64": 8}
MOMENTS = 1
HIST = 2
#: Most bins the kernels take.
MAX_BINS = 1 << 24

BLOCK = 4096        # values summarised at once
PART = 1 << 20      # values per part: the unit of the ordered merge
_PART_CHUNKS = PART // BLOCK
_GROUP = 16 * BLOCK  # values converted to float64 at once: bounds the temporaries
SIZE_MAX = (1 << 64) - 1
INT64_MAX, INT64_MIN, UINT64_MAX = (1 << 63) - 1, -(1 << 63), SIZE_MAX

_NUMPY = {"F32": "<f4", "F64": "<f8", "I8": "i1", "I16": "<i2", "I32": "<i4", "I64": "<i8",
          "U8": "u1", "U16": "<u2", "U32": "<u4", "U64": "<u8"}
_SIGNED = {"I8", "I16", "I32", "I64"}
_UNSIGNED = {"U8", "U16", "U32", "U64"}
_EXACT_SUMS = {"I8", "I16", "I32", "U8", "U16", "U32"}  # int64 sums; the 64-bit kinds sum doubles


class _Accumulator:
    """apr_stats: what a pass has seen so far."""

    def __init__(self):
        self.count = self.nan = self.pos_inf = self.neg_inf = self.zero = self.finite = 0
        self.min, self.max = math.inf, -math.inf
        self.imin, self.imax = INT64_MAX, INT64_MIN
        self.umin, self.umax = UINT64_MAX, 0
        self.mean = self.m2 = 0.0

    def merge_moments(self, nb: int, mb: float, m2b: float) -> None:
        """Chan, Golub, LeVeque: (n, mean, M2) of two disjoint sets combined."""
        if not nb:
            return
        if not self.finite:
            self.finite, self.mean, self.m2 = nb, mb, m2b
            return
        na, nbd = float(self.finite), float(nb)
        n = na + nbd
        delta = mb - self.mean
        self.mean += delta * (nbd / n)
        self.m2 += m2b + delta * delta * (na * nbd / n)
        self.finite += nb

    def merge(self, p: "_Accumulator") -> None:
        """apr_stats_merge: fold a part into this one."""
        self.count += p.count
        self.nan += p.nan
        self.pos_inf += p.pos_inf
        self.neg_inf += p.neg_inf
        self.zero += p.zero
        self.min = p.min if p.min < self.min else self.min
        self.max = p.max if p.max > self.max else self.max
        self.imin, self.imax = min(self.imin, p.imin), max(self.imax, p.imax)
        self.umin, self.umax = min(self.umin, p.umin), max(self.umax, p.umax)
        self.merge_moments(p.finite, p.mean, p.m2)

    def as_dict(self) -> dict:
        return {"count": self.count, "nan": self.nan, "pos_inf": self.pos_inf, "neg_inf": self.neg_inf,
                "zero": self.zero, "finite": self.finite, "min": self.min, "max": self.max, "imin": self.imin,
                "imax": self.imax, "umin": self.umin, "umax": self.umax, "mean": self.mean, "m2": self.m2}


# --- histogram --------------------------------------------------------------------------
class _Hist:
    def __init__(self, counts: np.ndarray, lo: float, hi: float):
        # The scale is derived here, never taken from the caller, so every bin stays in bounds.
        if counts.shape[0] > MAX_BINS:
            raise ValueError(f"at most {MAX_BINS} bins, not {counts.shape[0]}")
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"histogram range must be finite with lo < hi, not ({lo}, {hi})")
        self.counts, self.bins, self.lo, self.hi = counts, counts.shape[0], lo, hi
        width = hi - lo
        scale = self.bins / width if math.isfinite(width) else math.inf
        self.divide = not (math.isfinite(width) and math.isfinite(scale) and scale > 0)
        self.scale = 0.0 if self.divide else scale

    def add(self, v: np.ndarray) -> None:
        """Count the float64 values ``v`` into their bins."""
        inside = v[(v >= self.lo) & (v <= self.hi)]  # NaN fails both
        if self.divide:
            t = (inside * 0.5 - self.lo * 0.5) / (self.hi * 0.5 - self.lo * 0.5) * float(self.bins)
            t = np.where(np.isnan(t), float(self.bins), t)  # NaN from a degenerate range: the last bin
            k = np.where(t < self.bins, np.where(t >= 0, t, 0), self.bins - 1).astype(np.int64)
        else:
            k = np.minimum(((inside - self.lo) * self.scale).astype(np.int64), self.bins - 1)
        self.counts += np.bincount(k, minlength=self.bins)[:self.bins].astype(np.uint64)


# --- chunks -----------------------------------------------------------------------------
def _summarise(values: np.ndarray, kind: str, acc: _Accumulator, hist, want: int, chunk: int = BLOCK) -> None:
    """Fold one part's values into ``acc`` chunk by chunk (values: the kind's own ints, or floats)."""
    n = values.shape[0]
    if not n:
        return
    v = values.astype(np.float64)
    if want & HIST:
        hist.add(v)
    if not want & MOMENTS:
        return
    acc.count += n
    starts = np.arange(0, n, chunk)
    if kind in _SIGNED or kind in _UNSIGNED:
        _integer_chunks(values, v, kind, starts, acc)
    else:
        _float_chunks(v, starts, acc)


def _ordered_sums(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Each chunk's sum, its values added in order, as the C source adds them (NumPy's own
    sum adds pairs, which can overflow to inf where the plain order does not)."""
    ends = np.append(starts[1:], values.shape[0])
    return np.array([np.cumsum(values[a:b])[-1] for a, b in zip(starts.tolist(), ends.tolist())], np.float64)


def _float_chunks(v, starts, acc):
    finite = np.isfinite(v)
    acc.nan += int(np.isnan(v).sum())
    acc.pos_inf += int((v == np.inf).sum())
    acc.neg_inf += int((v == -np.inf).sum())
    acc.zero += int((v == 0).sum())
    if finite.any():
        acc.min = min(acc.min, float(v[finite].min()))
        acc.max = max(acc.max, float(v[finite].max()))
    fin = np.add.reduceat(finite.astype(np.int64), starts)
    sums = _ordered_sums(np.where(finite, v, 0.0), starts)
    means = sums / np.maximum(fin, 1)
    lengths = np.diff(np.append(starts, v.shape[0]))
    dev = np.where(finite, v - np.repeat(means, lengths), 0.0)
    m2s = _ordered_sums(dev * dev, starts)
    for k in range(starts.shape[0]):
        acc.merge_moments(int(fin[k]), float(means[k]), float(m2s[k]))


def _integer_chunks(values, v, kind, starts, acc):
    acc.zero += int((values == 0).sum())
    lo, hi = int(values.min()), int(values.max())
    if kind in _SIGNED:
        acc.imin, acc.imax = min(acc.imin, lo), max(acc.imax, hi)
    else:
        acc.umin, acc.umax = min(acc.umin, lo), max(acc.umax, hi)
    acc.min, acc.max = min(acc.min, float(lo)), max(acc.max, float(hi))
    if kind in _EXACT_SUMS:
        sums = np.add.reduceat(values.astype(np.int64), starts).astype(np.float64)  # exact
    else:
        sums = _ordered_sums(v, starts)
    lengths = np.diff(np.append(starts, v.shape[0]))
    means = sums / lengths
    dev = v - np.repeat(means, lengths)
    m2s = _ordered_sums(dev * dev, starts)
    for k in range(starts.shape[0]):
        acc.merge_moments(int(lengths[k]), float(means[k]), float(m2s[k]))


def _values_of(kind: str, raw: np.ndarray) -> np.ndarray:
    """The elements of a plain kind's bytes: halves widened to float32 exactly."""
    if kind == "F16":
        return f16_bits_to_f32_bits(raw.view("<u2")).view(np.float32)
    if kind == "BF16":
        return bf16_bits_to_f32_bits(raw.view("<u2")).view(np.float32)
    return raw.view(_NUMPY[kind])


def _hist_and_want(counts, lo, hi, want):
    if counts is not None:
        counts = typed_view(counts, np.uint64, writable=True)
    if counts is not None and counts.shape[0]:
        return _Hist(counts, float(lo), float(hi))
    if want & HIST:
        raise ValueError("a histogram needs counts")
    return None


def _check_threads(threads):
    if threads < 0:
        raise ValueError(f"threads must be 0 (all cores) or positive, not {threads}")


def compute(kind, data, want, counts=None, lo=0.0, hi=0.0, threads=0) -> dict:
    """Statistics of ``data`` (the bytes of a ``kind`` array); ``counts`` receives the
    histogram over [lo, hi] (its length is the bin count)."""
    raw = typed_view(data, np.uint8)
    if not isinstance(kind, str):
        raise TypeError(f"Argument 'kind' has incorrect type (expected str, got {type(kind).__name__})")
    if kind not in KINDS:
        raise ValueError(f"unknown statistics kind {kind!r}; known: {', '.join(KINDS)}")
    _check_threads(threads)
    item = ITEMSIZE[kind]
    if raw.shape[0] % item:
        raise ValueError(f"{kind}: {raw.shape[0]} bytes is not a whole number of {item}-byte elements")
    hist = _hist_and_want(counts, lo, hi, want)
    out = _Accumulator()
    values = _values_of(kind, raw)
    with np.errstate(all="ignore"):  # overflowing squares and inf - inf are the data's business
        for start in range(0, values.shape[0], PART):
            part = _Accumulator()
            for group in range(start, min(start + PART, values.shape[0]), _GROUP):
                _summarise(values[group:min(group + _GROUP, start + PART)], kind, part, hist, want)
            out.merge(part)
    return out.as_dict()


def compute_quant(qtype, data, rows, row, want, counts=None, lo=0.0, hi=0.0, threads=0) -> dict:
    """Statistics of a packed tensor of quant type id ``qtype`` (aprfast._quant.TYPES):
    ``rows`` rows of ``row`` values, each row padded to whole blocks where the type's
    blocks never span rows (see csrc/stats.h)."""
    raw = typed_view(data, np.uint8)
    rows, row = check_uint(rows, 64, "size_t"), check_uint(row, 64, "size_t")
    _check_threads(threads)
    hist = _hist_and_want(counts, lo, hi, want)
    what = f"quant type {qtype}"
    layout = _quant_layout(qtype, raw.shape[0], rows, row)
    if isinstance(layout, str):
        raise ValueError(f"{what}: {layout}")
    out = _Accumulator()
    if layout is None:
        return out.as_dict()
    name, padded_row = layout
    with np.errstate(all="ignore"):
        part, chunks_in_part = _Accumulator(), 0
        for values in _segments(name, raw, rows, row, padded_row):
            for start in range(0, values.shape[0], BLOCK):  # a row's chunks: 4096 values, the last shorter
                _summarise(values[start:start + BLOCK], "F32", part, hist, want)
                chunks_in_part += 1
                if chunks_in_part == _PART_CHUNKS:
                    out.merge(part)
                    part, chunks_in_part = _Accumulator(), 0
        if chunks_in_part:
            out.merge(part)
    return out.as_dict()


#: Type name -> offsets of the float16 fields of each block that bound its values
#: (csrc/stats.c FINITE_F16: the types whose values are finite when these are).
_FINITE_F16 = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q4_K": (0, 2),
               "Q6_K": (208,), "Q8_1": (0,), "Q2_K": (80, 82), "Q3_K": (108,), "Q5_K": (0, 2),
               "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ3_XXS": (0,), "IQ1_S": (0,), "IQ4_NL": (0,), "IQ3_S": (0,),
               "IQ2_S": (0,), "IQ4_XS": (0,), "TQ1_0": (52,), "TQ2_0": (64,)}


def quant_finite(qtype, data, rows, row) -> bool:
    """True when every value of a packed tensor of quant type id ``qtype`` is finite,
    known from its blocks' float16 scales without decoding it; False when not known
    (another type, a non-finite scale, or bytes that do not fit: ``compute_quant``
    says what is wrong).  csrc/stats.h."""
    raw = typed_view(data, np.uint8)
    rows, row = check_uint(rows, 64, "size_t"), check_uint(row, 64, "size_t")
    layout = _quant_layout(qtype, raw.shape[0], rows, row)
    if layout is None:
        return True
    if isinstance(layout, str):
        return False
    name = layout[0]
    offsets = _FINITE_F16.get(name)
    _, block_bytes = _quant.block_info(name)
    if offsets is None or _quant.header_bytes(name, rows * row) or (_quant._TABLE[name][3] and rows == 1) \
            or raw.shape[0] % block_bytes:
        return False
    blocks = raw.reshape(-1, block_bytes)
    # Exponent bits all ones (the high byte's 0x7C): Inf or NaN.
    return not any(((blocks[:, off + 1] & 0x7C) == 0x7C).any() for off in offsets)


def _quant_layout(qtype, nbytes, rows, row):
    """(type name, values a stored row decodes to), None for an empty tensor, or why the bytes do not fit."""
    names = list(_quant.TYPES)
    if not isinstance(qtype, int) or not 0 <= qtype < len(names):
        return "unknown kind (code -1)"
    name = names[qtype]
    elems, block_bytes = _quant.block_info(name)
    if BLOCK % elems:
        return "unknown kind (code -1)"
    size_problem = "the byte count does not match the element count"
    if rows and row > SIZE_MAX // rows:
        return size_problem
    n = rows * row
    if not n:
        return size_problem if nbytes else None
    header = _quant.header_bytes(name, n)
    partial_ok = _quant._TABLE[name][3] and rows == 1
    blocks_per_row = -(-row // elems)
    if blocks_per_row > SIZE_MAX // block_bytes or (
            rows > 1 and blocks_per_row * block_bytes > (SIZE_MAX - header) // rows):
        return size_problem
    if partial_ok:
        total = _quant._nbytes(name, n)
        if total == SIZE_MAX or total != nbytes:
            return size_problem
        return name, row
    if header + rows * blocks_per_row * block_bytes != nbytes:
        return size_problem
    return name, blocks_per_row * elems


def _segments(name, raw, rows, row, padded_row):
    """The tensor's float32 values, a piece of one row at a time: each piece starts at a
    multiple of PART within its row (so the 4096-value chunks fall where the C's do) and
    nothing much larger than a part is ever decoded at once."""
    header = _quant.header_bytes(name, rows * row)
    elems, block_bytes = _quant.block_info(name)
    partial = _quant._TABLE[name][3]
    row_bytes = padded_row // elems * block_bytes
    body = raw[header:]
    if rows > 1 and padded_row <= PART:  # many short rows: a group of them per decode
        group = PART // padded_row
        for first in range(0, rows, group):
            count = min(group, rows - first)
            values = _decode(name, raw[:header], body[first * row_bytes:(first + count) * row_bytes],
                             count * padded_row)
            for r in range(count):
                yield values[r * padded_row:r * padded_row + row]
        return
    for r in range(rows):
        for start in range(0, row, PART):  # PART is a whole number of blocks of every type
            keep = min(PART, row - start)
            decode = keep if partial and rows == 1 else -(-keep // elems) * elems
            at = r * row_bytes + start // elems * block_bytes
            nbytes = _quant._nbytes(name, decode) - (header if decode else 0)
            yield _decode(name, raw[:header], body[at:at + nbytes], decode)[:keep]


def _decode(name, header, blocks, count):
    """``count`` values from a type's blocks; a per-tensor type's scale header goes first."""
    src = np.concatenate([header, blocks]) if header.shape[0] else blocks
    values = np.empty(count, np.float32)
    _quant.dequantize(name, src, values)
    return values


def default_threads() -> int:
    """Threads the compiled module would use for ``threads=0``: the online cores."""
    return _default_threads()
