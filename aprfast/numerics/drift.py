"""How far one tensor's values are from another's, shared by ``apr diff`` (aprfast.tools.diff),
the merge methods (aprfast.tools.merge) and convert's quality gate (aprfast.convert.gate):
:func:`numeric_values` decodes any tensor value to numbers NumPy widens to float64, and
:func:`compare_values` walks two of them chunk by chunk in float64.  docs/guide/statistics.md
("Diff and merge") shows the tools built on it."""

from __future__ import annotations

import math

import numpy as np

from ..tensors import RawTensor
from .stats import tensor_stats

__all__ = ["numeric_values", "compare_values", "cosine", "CHUNK"]

#: Elements compared per chunk (float64 temporaries of this size, not of the tensor's).
CHUNK = 1 << 20


def numeric_values(value) -> np.ndarray:
    """A 1-D array of the tensor's numeric values in a dtype NumPy can widen to float64
    (packed blocks dequantized to float32; bf16 bits widened).  TypeError when the
    tensor holds no numbers (unknown dtype).

    Args:
        value: A NumPy array, a :class:`aprfast.RawTensor` or a
            :class:`aprfast.QuantizedTensor`.

    Returns:
        A 1-D NumPy array (a view where no decoding is needed).

    Raises:
        TypeError: An unknown dtype id, or complex or structured values.

    Examples:
        >>> import numpy as np
        >>> from aprfast.numerics.drift import numeric_values
        >>> numeric_values(np.float32([[1, 2], [3, 4]])).tolist()
        [1.0, 2.0, 3.0, 4.0]
        >>> numeric_values(np.zeros(2, np.complex64))
        Traceback (most recent call last):
        ...
        TypeError: values of dtype complex64 are not compared
    """
    if isinstance(value, RawTensor):
        dtype = value.dtype
        if dtype is None:
            raise TypeError(f"unknown dtype id {value.dtype_id}")
        if dtype.packed:
            from .quantization import dequantize

            return dequantize(value).reshape(-1)
        if dtype.name == "BF16":
            from .precision import to_float32

            return to_float32(value).reshape(-1)
        from ..dtypes import numpy_dtype

        value = value.data.view(numpy_dtype(dtype))
    array = np.asarray(value)
    if array.dtype.kind == "c" or (array.dtype.kind == "V" and array.dtype.itemsize != 2):
        raise TypeError(f"values of dtype {array.dtype} are not compared")
    return array.reshape(-1)


def compare_values(fa: np.ndarray, fb: np.ndarray, threads: int, chunk: int = CHUNK) -> dict:
    """Chunk by chunk in float64: identical elements, largest finite |a-b|, non-finite
    mismatches (from the statistics engine run over the difference), and the dot
    products for the cosine, the L2 distance and ``a``'s L2 norm (convert's quality gate);
    ``threads`` for the statistics engine.

    Args:
        fa: The first tensor's values, 1-D (:func:`numeric_values`).
        fb: The second tensor's values, 1-D, as many as ``fa``.
        threads: Threads for the statistics engine (0: every core).
        chunk: Elements per chunk.

    Returns:
        A dict: ``identical`` (count), ``nonfinite`` (mismatching NaN/Inf count),
        ``max_abs`` (largest finite ``|a - b|``), ``cosine``, ``l2`` (distance over the
        elements finite in both) and ``norm_a``.

    Examples:
        >>> import numpy as np
        >>> from aprfast.numerics.drift import compare_values
        >>> r = compare_values(np.float32([1, 2, 3]), np.float32([1, 2, 4]), threads=1)
        >>> r["identical"], r["max_abs"], r["l2"], round(r["cosine"], 4)
        (2, 1.0, 1.0, 0.9915)
    """
    identical = nonfinite = 0
    max_abs = 0.0
    dot_ab = dot_aa = dot_bb = dot_dd = 0.0
    for start in range(0, fa.size, chunk):
        with np.errstate(invalid="ignore"):  # a signalling NaN widened raises the invalid flag
            a = fa[start:start + chunk].astype(np.float64)
            b = fb[start:start + chunk].astype(np.float64)
        same = (a == b) | (np.isnan(a) & np.isnan(b))  # the same infinity or both NaN count as equal
        with np.errstate(invalid="ignore", over="ignore"):
            delta = np.where(same, 0.0, a - b)
        s = tensor_stats(delta, threads=threads)
        identical += s.zero_count
        nonfinite += s.nan_count + s.inf_count
        if s.finite_count:
            max_abs = max(max_abs, abs(s.min), abs(s.max))
        finite = np.isfinite(a) & np.isfinite(b)
        if not finite.all():
            a, b, delta = a[finite], b[finite], delta[finite]
        dot_ab += float(np.dot(a, b))
        dot_aa += float(np.dot(a, a))
        dot_bb += float(np.dot(b, b))
        dot_dd += float(np.dot(delta, delta))
    return {"identical": identical, "nonfinite": nonfinite, "max_abs": max_abs,
            "cosine": cosine(dot_ab, dot_aa, dot_bb), "l2": math.sqrt(dot_dd), "norm_a": math.sqrt(dot_aa)}


def cosine(ab: float, aa: float, bb: float) -> float:
    """The cosine of two vectors from their dot products, clamped to [-1, 1]: 1.0 for two
    zero vectors, 0.0 when only one is zero.

    Args:
        ab: ``a . b``.
        aa: ``a . a``.
        bb: ``b . b``.

    Returns:
        A float in [-1, 1].

    Examples:
        >>> from aprfast.numerics.drift import cosine
        >>> cosine(1.0, 1.0, 4.0), cosine(0.0, 0.0, 0.0), cosine(0.0, 1.0, 0.0)
        (0.5, 1.0, 0.0)
    """
    if aa == 0.0 and bb == 0.0:
        return 1.0  # two zero tensors point the same (no) way
    if aa == 0.0 or bb == 0.0:
        return 0.0
    return max(-1.0, min(1.0, ab / (math.sqrt(aa) * math.sqrt(bb))))
