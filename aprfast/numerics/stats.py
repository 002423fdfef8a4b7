"""Tensor statistics: one pass in C over any tensor aprfast reads.  The checks of seed
001 §10.9 (expected ranges per tensor role) are :mod:`aprfast.numerics.expectations`.

:func:`tensor_stats` computes count, min, max, mean, std (population, over the finite
values), NaN / +Inf / -Inf / zero counts, sparsity and, with ``bins``, a histogram, for
float32/64, float16, bfloat16, every integer dtype, bool, and the packed quantized
types (decoded a few thousand values at a time by the C dequantizers, never the whole
tensor).  The GIL is released and large tensors are split over the cores; the split
does not change the result (csrc/stats.h).

Histogram range: ``range=(lo, hi)``, or by default the finite min..max, which the
engine only knows after a first pass, so ``bins > 0`` without ``range`` reads the
tensor twice (moments first, then the histogram).  Give ``range`` to get everything in
one pass.  Values outside the range, NaN and Inf are not counted in any bin.

:func:`tensor_stats_numpy` computes the same numbers with NumPy (the tests' oracle).
``aprfast.stats`` is the documented path of this module; docs/guide/statistics.md shows it
in use and docs/performance.md measures it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import _stats
from ..dtypes import SUBBYTE_FLOATS, DType, bfloat16, element_count, subbyte_values
from ..tensors import RawTensor

__all__ = ["TensorStats", "tensor_stats", "tensor_stats_numpy", "histogram_spec", "known_finite"]

#: Most bins a histogram may ask for (a counter array per thread is allocated).
MAX_BINS = 1 << 20
#: Elements per chunk when a tensor must be converted in Python first (non-contiguous
#: arrays, float8/float4, custom quantizers' whole-tensor decoders are the exception).
_CHUNK = 1 << 20

_NUMPY_KINDS = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.float16): "F16",
                np.dtype(np.int8): "I8", np.dtype(np.int16): "I16", np.dtype(np.int32): "I32",
                np.dtype(np.int64): "I64", np.dtype(np.uint8): "U8", np.dtype(np.uint16): "U16",
                np.dtype(np.uint32): "U32", np.dtype(np.uint64): "U64", np.dtype(np.bool_): "U8"}
if bfloat16 is not None:
    _NUMPY_KINDS[np.dtype(bfloat16)] = "BF16"
_INT_KINDS = {"I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64"}


@dataclass(frozen=True)
class TensorStats:
    """Statistics of one tensor.  ``min``/``max``/``mean``/``std`` are over the finite
    values (None when there are none); integer tensors give exact int ``min``/``max``.
    ``histogram`` holds ``bins`` counts over ``bin_edges`` (None without ``bins``).
    Made by :func:`tensor_stats`.

    Examples:
        >>> import numpy as np
        >>> from aprfast.stats import tensor_stats
        >>> s = tensor_stats(np.float32([0, 1, 2, 3, np.nan, np.inf]))
        >>> s.count, s.finite_count, s.nan_count, s.inf_count, s.min, s.max, s.mean
        (6, 4, 1, 1, 0.0, 3.0, 1.5)
    """

    count: int
    nan_count: int
    pos_inf_count: int
    neg_inf_count: int
    zero_count: int
    finite_count: int
    min: float | int | None
    max: float | int | None
    mean: float | None
    std: float | None
    histogram: tuple | None = None
    bin_edges: tuple | None = None

    @property
    def inf_count(self) -> int:
        """+Inf and -Inf values together."""
        return self.pos_inf_count + self.neg_inf_count

    @property
    def sparsity(self) -> float:
        """Fraction of elements that are exactly zero (0.0 for an empty tensor).

        Examples:
            >>> import numpy as np
            >>> from aprfast.stats import tensor_stats
            >>> tensor_stats(np.float32([0, 0, 1, 2])).sparsity
            0.5
        """
        return self.zero_count / self.count if self.count else 0.0

    def as_dict(self) -> dict:
        """JSON-ready: every field plus ``inf_count`` and ``sparsity``.

        Returns:
            A dict of plain ints, floats, None and lists (the histogram's when present).

        Examples:
            >>> import numpy as np
            >>> from aprfast.stats import tensor_stats
            >>> d = tensor_stats(np.int8([-3, 0, 7]), bins=2, range=(-4, 8)).as_dict()
            >>> d["min"], d["max"], d["zero_count"], d["histogram"], d["bin_edges"]
            (-3, 7, 1, [2, 1], [-4.0, 2.0, 8.0])
        """
        out = {"count": self.count, "min": self.min, "max": self.max, "mean": self.mean, "std": self.std,
               "nan_count": self.nan_count, "inf_count": self.inf_count, "pos_inf_count": self.pos_inf_count,
               "neg_inf_count": self.neg_inf_count, "zero_count": self.zero_count,
               "finite_count": self.finite_count, "sparsity": self.sparsity}
        if self.histogram is not None:
            out["histogram"] = list(self.histogram)
            out["bin_edges"] = list(self.bin_edges)
        return out


# --- the histogram's arithmetic (shared with the twin) ----------------------------------
def histogram_spec(bins: int, lo: float, hi: float):
    """(lo, hi, scale, divide) as the C engine takes them.  lo == hi widens to lo-0.5 ..
    hi+0.5 as NumPy does (where that rounds back to lo, to the neighbouring doubles, and
    never past the largest finite one); a range whose width or scale overflows a double
    switches to the halved division form (csrc/stats.h).

    Args:
        bins: The number of bins.
        lo: The histogram's lower edge.
        hi: The histogram's upper edge.

    Returns:
        ``(lo, hi, scale, divide)``: the edges used, ``bins / (hi - lo)`` (0.0 in the
        division form) and whether the division form is used.

    Raises:
        ValueError: A range that is not finite or has ``lo > hi``.

    Examples:
        >>> from aprfast.stats import histogram_spec
        >>> histogram_spec(4, 0.0, 2.0)
        (0.0, 2.0, 2.0, False)
        >>> histogram_spec(4, 1.0, 1.0)  # an empty range widens, as NumPy's does
        (0.5, 1.5, 4.0, False)
    """
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise ValueError(f"histogram range must be finite with lo <= hi, not ({lo}, {hi})")
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
        if lo == hi:  # beyond 2**53 half a unit rounds away: take the neighbouring doubles
            down, up = math.nextafter(lo, -math.inf), math.nextafter(hi, math.inf)
            # at the largest double the neighbour outward is infinite: keep that edge
            lo, hi = (down if math.isfinite(down) else lo), (up if math.isfinite(up) else hi)
    width = hi - lo
    scale = bins / width if width > 0 and math.isfinite(width) else math.inf
    divide = not (math.isfinite(width) and math.isfinite(scale) and scale > 0)
    return lo, hi, (0.0 if divide else scale), divide


def _bin_edges(bins, lo, hi) -> tuple:
    if math.isfinite(hi - lo):
        return tuple(float(e) for e in np.linspace(lo, hi, bins + 1))
    # A range wider than the largest double: interpolate without forming hi - lo.
    return tuple(lo * (1 - i / bins) + hi * (i / bins) for i in range(bins)) + (hi,)


def _check_bins(bins) -> int:
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)):
        raise TypeError(f"bins must be an int, not {type(bins).__name__}")
    if not 0 <= bins <= MAX_BINS:
        raise ValueError(f"bins must be in 0..{MAX_BINS}, not {bins}")
    return int(bins)


def _check_range(range_):
    if range_ is None:
        return None
    try:
        lo, hi = range_
        return float(lo), float(hi)
    except (TypeError, ValueError):
        raise ValueError(f"range must be (lo, hi), not {range_!r}") from None


# --- the engine --------------------------------------------------------------------------
class _Source:
    """How to feed a tensor to the C engine: ``run(want, counts, spec)`` returns the
    accumulator dict for the whole tensor."""

    def __init__(self, run, kind):
        self.run, self.kind = run, kind


def tensor_stats(value, *, bins: int = 0, range=None, threads: int = 0) -> TensorStats:  # noqa: A002
    """Statistics of an array, a RawTensor/QuantizedTensor, or anything ``np.asarray``
    takes.  ``bins`` > 0 adds a histogram over ``range`` (default: the finite min..max;
    see the module docstring for the extra pass that costs).  ``threads``: 0 = every
    online core, 1 = the calling thread only.  Complex and unknown dtypes raise
    TypeError; bad ``bins``/``range``/``threads`` raise ValueError.
    docs/guide/statistics.md ("Tensor statistics").

    Args:
        value: A NumPy array (any float, integer or bool dtype), a
            :class:`aprfast.RawTensor` or :class:`aprfast.QuantizedTensor`, or anything
            ``np.asarray`` takes.
        bins: Histogram bins (0: no histogram; at most 2**20).
        range: ``(lo, hi)`` of the histogram (default: the finite min..max).
        threads: Threads to use (0: every online core).

    Returns:
        A :class:`TensorStats`.

    Raises:
        TypeError: A complex, unknown or non-numeric dtype, or ``bins`` not an int.
        ValueError: ``bins`` out of range, a ``range`` that is not a finite
            ``(lo, hi)`` with ``lo <= hi``, or negative ``threads``.

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast.stats import tensor_stats
        >>> s = tensor_stats(np.float32([0, 1, 2, 3, np.nan]), bins=3, range=(0, 3))
        >>> s.mean, round(s.std, 6), s.nan_count, s.histogram
        (1.5, 1.118034, 1, (1, 1, 2))
        >>> q = aprfast.quantize(np.linspace(-1, 1, 64, dtype=np.float32), "Q8_0")
        >>> tensor_stats(q).count  # decoded block by block, never whole
        64
        >>> tensor_stats(np.zeros(2, np.complex64))
        Traceback (most recent call last):
        ...
        TypeError: no statistics for arrays of dtype complex64
    """
    bins = _check_bins(bins)
    range_ = _check_range(range)
    if not isinstance(threads, (int, np.integer)) or threads < 0:
        raise ValueError(f"threads must be 0 (all cores) or positive, not {threads!r}")
    source = _source_of(value, int(threads))
    if bins and range_ is not None:
        spec = histogram_spec(bins, *range_)
        counts = np.zeros(bins, np.uint64)
        acc = source.run(_stats.MOMENTS | _stats.HIST, counts, spec)
        return _result(acc, source.kind, counts, spec)
    acc = source.run(_stats.MOMENTS, None, None)
    if not bins:
        return _result(acc, source.kind, None, None)
    lo, hi = (acc["min"], acc["max"]) if acc["finite"] else (0.0, 1.0)
    spec = histogram_spec(bins, lo, hi)
    counts = np.zeros(bins, np.uint64)
    source.run(_stats.HIST, counts, spec)
    return _result(acc, source.kind, counts, spec)


def _result(acc, kind, counts, spec) -> TensorStats:
    finite = acc["finite"]
    if not finite:
        lo = hi = mean = std = None
    else:
        mean, std = acc["mean"], math.sqrt(max(acc["m2"], 0.0) / finite)
        if kind in _INT_KINDS and kind.startswith("I"):
            lo, hi = acc["imin"], acc["imax"]
        elif kind in _INT_KINDS:
            lo, hi = acc["umin"], acc["umax"]
        else:
            lo, hi = acc["min"], acc["max"]
    hist = edges = None
    if counts is not None:
        hist = tuple(int(c) for c in counts)
        edges = _bin_edges(len(counts), spec[0], spec[1])
    return TensorStats(acc["count"], acc["nan"], acc["pos_inf"], acc["neg_inf"], acc["zero"], finite,
                       lo, hi, mean, std, hist, edges)


def _source_of(value, threads) -> _Source:
    if isinstance(value, RawTensor):
        return _raw_source(value, threads)
    if not isinstance(value, np.ndarray):
        try:
            value = np.asarray(value)
        except Exception as exc:
            raise TypeError(f"cannot compute statistics of {type(value).__name__}: {exc}") from exc
    return _array_source(value, threads)


def _lohi(spec) -> tuple:
    return (spec[0], spec[1]) if spec else (0.0, 0.0)


def _plain(kind, data, threads) -> _Source:
    def run(want, counts, spec):
        return _stats.compute(kind, data, want, counts, *_lohi(spec), threads=threads)
    return _Source(run, kind)


def _array_source(array: np.ndarray, threads) -> _Source:
    kind = _NUMPY_KINDS.get(array.dtype.newbyteorder("=") if array.dtype.byteorder != "|" else array.dtype)
    if kind is not None and not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))  # big-endian input: one swap copy
    if kind is None:
        if array.dtype.kind == "f" or array.dtype.name.startswith("float"):  # ml_dtypes' float8/float4
            return _chunked(array, threads)
        raise TypeError(f"no statistics for arrays of dtype {array.dtype}")
    if array.size and not array.flags.c_contiguous:
        if array.flags.f_contiguous:
            array = array.T  # same elements, C order: the statistics do not depend on order
        else:
            return _chunked(array, threads, kind)
    return _plain(kind, _bytes(array), threads)


def _bytes(array: np.ndarray) -> np.ndarray:
    if array.size == 0:
        return np.zeros(0, np.uint8)
    return array.reshape(-1).view(np.uint8)


def _chunked(array: np.ndarray, threads, kind=None) -> _Source:
    """Arrays the engine cannot read in place: converted (to their own kind, or to
    float32) a chunk at a time, each chunk summarised in C, partials merged here."""
    flat_kind = kind or "F32"

    def pieces():
        if array.ndim == 0:  # converted like every other chunk (a 0-d float8 is 1 byte, not 4)
            part = np.ascontiguousarray(array.reshape(1))
            yield part if kind else part.astype(np.float32)
            return
        rows = max(1, _CHUNK // max(1, element_count(array.shape[1:])))
        for i in range(0, array.shape[0], rows):
            part = np.ascontiguousarray(array[i:i + rows])
            yield part if kind else part.astype(np.float32)

    def run(want, counts, spec):
        total = None
        for part in pieces():
            acc = _stats.compute(flat_kind, _bytes(part), want, counts, *_lohi(spec), threads=threads)
            total = acc if total is None else _merge(total, acc)
        return total or _stats.compute(flat_kind, np.zeros(0, np.uint8), want)
    return _Source(run, flat_kind)


def _merge(a: dict, b: dict) -> dict:
    """Two accumulators combined: the same rule as csrc/stats.c's apr_stats_merge."""
    out = {k: a[k] + b[k] for k in ("count", "nan", "pos_inf", "neg_inf", "zero")}
    out.update(min=min(a["min"], b["min"]), max=max(a["max"], b["max"]), imin=min(a["imin"], b["imin"]),
               imax=max(a["imax"], b["imax"]), umin=min(a["umin"], b["umin"]), umax=max(a["umax"], b["umax"]))
    na, nb = a["finite"], b["finite"]
    if not nb:
        out.update(finite=na, mean=a["mean"], m2=a["m2"])
    elif not na:
        out.update(finite=nb, mean=b["mean"], m2=b["m2"])
    else:
        n = na + nb
        delta = b["mean"] - a["mean"]
        out.update(finite=n, mean=a["mean"] + delta * (nb / n), m2=a["m2"] + b["m2"] + delta * delta * (na * nb / n))
    return out


def _raw_source(tensor: RawTensor, threads) -> _Source:
    from .. import _quant

    dtype = tensor.dtype
    if dtype is None:
        raise TypeError(f"no statistics for a tensor of unknown dtype id {tensor.dtype_id}")
    if dtype.opaque:
        raise TypeError(f"no statistics for a tensor of dtype {dtype.name}, which aprfast does not know")
    if not dtype.packed:
        if dtype.name in _stats.KINDS:  # e.g. BF16 without ml_dtypes
            return _plain(dtype.name, tensor.data, threads)
        from ..dtypes import numpy_dtype
        view = numpy_dtype(dtype)
        if dtype.name in _FLOAT8 and view.kind == "u":  # float8 without ml_dtypes: decoded, not read as ints
            return _float8_source(dtype.name, tensor.data.reshape(-1).view(np.uint8), threads)
        return _array_source(tensor.data.view(view), threads)
    qtype = _quant.TYPES.get(dtype.name)
    if qtype is None:
        return _decoded_source(tensor, threads)
    rows, row = _quant_rows(dtype, tensor.shape)

    def run(want, counts, spec):
        return _stats.compute_quant(qtype, tensor.data, rows, row, want, counts, *_lohi(spec), threads=threads)
    return _Source(run, "F32")


def known_finite(value) -> bool:
    """Whether every value of ``value`` is finite, known without decoding it: True for a
    packed GGML tensor (K, IQ, TQ and the 32-value block types) whose blocks' float16
    scales are all finite, since its values are those scales times small factors of its
    codes; False when this cannot tell (any other value, a non-finite scale, bytes that
    do not fit the shape), which says nothing about the values: :func:`tensor_stats`
    does.  Reads one or two halves a block; whenever it says True, ``tensor_stats``
    would count no NaN and no Inf.  The inline validation of :func:`aprfast.convert`
    uses it to skip the statistics of tensors whose verdict only NaN or Inf could change.

    Args:
        value: Anything :func:`tensor_stats` takes.

    Returns:
        True when the values are known to be finite, False when not known.

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast.stats import known_finite
        >>> q = aprfast.quantize(np.linspace(-1, 1, 256, dtype=np.float32), "Q4_K")
        >>> known_finite(q), known_finite(np.float32([1.0]))
        (True, False)
    """
    from .. import _quant

    if not isinstance(value, RawTensor):
        return False
    dtype = value.dtype
    if dtype is None or dtype.opaque or not dtype.packed:
        return False
    qtype = _quant.TYPES.get(dtype.name)
    if qtype is None:
        return False
    rows, row = _quant_rows(dtype, value.shape)
    return _stats.quant_finite(qtype, value.data, rows, row)


def _quant_rows(dtype: DType, shape) -> tuple:
    """(rows, row) as csrc/stats.h wants: padded rows only where blocks never span rows
    and a row is not a whole number of blocks."""
    count = element_count(shape)
    row = shape[-1] if len(shape) else 1
    if dtype.blocks_per_row and not dtype.tensor_header and count and row % dtype.block_elems:
        return count // row, row
    return 1, count


def _decoded_source(tensor: RawTensor, threads) -> _Source:
    """Types without a C decoder: a registered custom quantizer (its decoder is a
    whole-tensor Python function, so the tensor is decoded once) or float4/float6."""
    if tensor.dtype.name in SUBBYTE_FLOATS:
        values = subbyte_values(tensor.dtype, tensor.data, tensor.shape)
    else:
        from .quantization import dequantize
        values = dequantize(tensor, threads=threads)
    return _array_source(np.ascontiguousarray(values, np.float32), threads)


# float8 without ml_dtypes: each format's 256 values, decoded from their bits once.
#: name -> (exponent bits, mantissa bits, bias, NaN/Inf rule): "ieee" (all-ones exponent:
#: Inf with mantissa 0, else NaN), "fn" (only S.1111.111 is NaN, no Inf), "fnuz" (only
#: 0x80 is NaN, no Inf, no -0), "e8m0" (unsigned 2**(e-127), 0xFF NaN).
_FLOAT8 = {"F8_E4M3": (4, 3, 7, "fn"), "F8_E5M2": (5, 2, 15, "ieee"), "F8_E4M3FNUZ": (4, 3, 8, "fnuz"),
           "F8_E5M2FNUZ": (5, 2, 16, "fnuz"), "F8_E8M0": (8, 0, 127, "e8m0")}
_FLOAT8_TABLES: dict = {}


def _float8_table(name: str) -> np.ndarray:
    table = _FLOAT8_TABLES.get(name)
    if table is None:
        table = _FLOAT8_TABLES[name] = np.array([_float8_value(name, b) for b in range(256)], np.float32)
    return table


def _float8_value(name: str, byte: int) -> float:
    ebits, mbits, bias, rule = _FLOAT8[name]
    if rule == "e8m0":
        return math.nan if byte == 0xFF else 2.0 ** (byte - bias)
    if rule == "fnuz" and byte == 0x80:
        return math.nan
    sign = -1.0 if byte & 0x80 else 1.0
    exp, man = (byte >> mbits) & ((1 << ebits) - 1), byte & ((1 << mbits) - 1)
    if exp == (1 << ebits) - 1:
        if rule == "ieee":
            return sign * math.inf if man == 0 else math.nan
        if rule == "fn" and man == (1 << mbits) - 1:
            return math.nan
    if exp == 0:
        return sign * man * 2.0 ** (1 - bias - mbits)
    return sign * (1 + man / (1 << mbits)) * 2.0 ** (exp - bias)


def _float8_source(name: str, data: np.ndarray, threads) -> _Source:
    """A float8 tensor's bytes decoded through its table a chunk at a time, each chunk
    summarised in C, the partials merged (as _chunked does)."""
    table = _float8_table(name)

    def run(want, counts, spec):
        total = None
        for i in range(0, data.size, _CHUNK):
            part = table[data[i:i + _CHUNK]]
            acc = _stats.compute("F32", _bytes(part), want, counts, *_lohi(spec), threads=threads)
            total = acc if total is None else _merge(total, acc)
        return total or _stats.compute("F32", np.zeros(0, np.uint8), want)
    return _Source(run, "F32")


# --- the NumPy twin ----------------------------------------------------------------------
def tensor_stats_numpy(value, *, bins: int = 0, range=None) -> TensorStats:  # noqa: A002
    """The same numbers as :func:`tensor_stats`, computed with NumPy (float64
    throughout; materialises the tensor).  The tests' oracle.

    Args:
        value: As for :func:`tensor_stats`.
        bins: Histogram bins (0: no histogram).
        range: ``(lo, hi)`` of the histogram (default: the finite min..max).

    Returns:
        A :class:`TensorStats`.

    Raises:
        TypeError: A complex, unknown or non-numeric dtype, or ``bins`` not an int.
        ValueError: ``bins`` or ``range`` out of range.

    Examples:
        >>> import numpy as np
        >>> from aprfast.stats import tensor_stats, tensor_stats_numpy
        >>> x = np.float32([0, 1, 2, 3, np.nan, np.inf])
        >>> tensor_stats_numpy(x, bins=3, range=(0, 3)) == tensor_stats(x, bins=3, range=(0, 3))
        True
    """
    with np.errstate(all="ignore"):  # NaN casts and overflowing squares are the data's business
        return _numpy_stats(value, bins, range)


def _numpy_stats(value, bins, range):  # noqa: A002
    bins = _check_bins(bins)
    range_ = _check_range(range)
    values, kind = _numpy_values(value)
    flat = values.reshape(-1)
    count = flat.size
    as_f64 = flat.astype(np.float64)
    nan = int(np.isnan(as_f64).sum())
    pos_inf = int(np.isposinf(as_f64).sum())
    neg_inf = int(np.isneginf(as_f64).sum())
    finite_mask = np.isfinite(as_f64)
    finite_vals = as_f64[finite_mask]
    finite = int(finite_vals.size)
    zero = int((finite_vals == 0).sum())
    if finite:
        mean = float(finite_vals.mean())
        std = float(np.sqrt(np.mean((finite_vals - mean) ** 2)))
        if kind in _INT_KINDS:
            ints = flat.astype(np.int64 if kind.startswith("I") else np.uint64)
            lo, hi = int(ints.min()), int(ints.max())
        else:
            lo, hi = float(finite_vals.min()), float(finite_vals.max())
    else:
        lo = hi = mean = std = None
    hist = edges = None
    if bins:
        hr = range_ if range_ is not None else ((float(lo), float(hi)) if finite else (0.0, 1.0))
        spec = histogram_spec(bins, *hr)
        hist = tuple(int(c) for c in _numpy_histogram(finite_vals, bins, spec))
        edges = _bin_edges(bins, spec[0], spec[1])
    return TensorStats(count, nan, pos_inf, neg_inf, zero, finite, lo, hi, mean, std, hist, edges)


def _numpy_histogram(v: np.ndarray, bins: int, spec) -> np.ndarray:
    lo, hi, scale, divide = spec
    v = v[(v >= lo) & (v <= hi)]
    if divide:
        t = (v * 0.5 - lo * 0.5) / (hi * 0.5 - lo * 0.5) * float(bins)
    else:
        t = (v - lo) * scale
    # The C engine's rule, NaN included (it can only come from a degenerate range).
    whole = np.floor(np.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0)).astype(np.int64)
    idx = np.where(t < bins, np.where(t >= 0, whole, 0), bins - 1)
    return np.bincount(idx, minlength=bins)[:bins]


def _numpy_values(value):
    """(array, kind) with the values the engine sees: packed types dequantized, halves
    widened to float32."""
    if isinstance(value, RawTensor):
        dtype = value.dtype
        if dtype is None:
            raise TypeError(f"no statistics for a tensor of unknown dtype id {value.dtype_id}")
        if dtype.packed:
            if dtype.name in SUBBYTE_FLOATS:
                return subbyte_values(dtype, value.data, value.shape).reshape(-1), "F32"
            from .quantization import dequantize
            return dequantize(value), "F32"
        if dtype.name == "BF16":
            bits = value.data.view(np.uint16).astype(np.uint32) << 16
            return bits.view(np.float32), "F32"
        from ..dtypes import numpy_dtype
        if dtype.name in _FLOAT8 and numpy_dtype(dtype).kind == "u":  # float8 without ml_dtypes
            return _float8_table(dtype.name)[value.data.reshape(-1).view(np.uint8)], "F32"
        value = value.data.view(numpy_dtype(dtype))
    array = np.asarray(value)
    kind = _NUMPY_KINDS.get(array.dtype.newbyteorder("=") if array.dtype.byteorder != "|" else array.dtype)
    if kind in ("F16", "BF16") or (kind is None and array.dtype.kind == "V") or \
            (kind is None and array.dtype.name.startswith("float")):
        return array.astype(np.float32), "F32"
    if kind is None:
        raise TypeError(f"no statistics for arrays of dtype {array.dtype}")
    if array.dtype == np.bool_:
        return array.astype(np.uint8), "U8"
    return array, kind

