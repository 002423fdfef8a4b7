"""Quantization: float tensors to packed block types and back, only when asked.

Nothing in aprfast quantizes unless one of these is called (docs/guide/quantization.md):

* :func:`quantize` / :func:`dequantize` - one tensor, to and from a
  :class:`~aprfast.tensors.QuantizedTensor` that ``save_file`` writes as it is.
* :func:`quantize_tensors` - a whole model, with per-layer rules and a
  :class:`QuantizationReport` saying what each tensor became and the error it took on.
* :func:`register_quantizer` - a custom type with its own APR2 dtype id.

Each type is one small class, as in gguf-py: its name, block geometry and two kernels.
The built-in kernels are C (``aprfast._quant``), GIL released, split over ``threads``
(0 = the cores idle at the time of the call; tensors under 512 Ki values stay on the
calling thread).  Large results reuse aprfast's cached aligned memory
(:func:`aprfast.numerics.precision.empty_output`).  docs/FORMAT.md has every type's bytes and rounding rules.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import re
from dataclasses import dataclass

import numpy as np

from .. import _quant
from .. import dtypes as _dtypes
from ..dtypes import APR2_IDS, APRENDER_IDS, DType, bfloat16, element_count
from ..errors import CorruptError, LayoutError, UnknownDTypeError
from ..io.progress import progress_to
from ..tensors import QuantizedTensor, RawTensor
from .precision import empty_output, to_float32

__all__ = [
    "QuantType", "QuantizationReport", "TensorReport", "quantize", "dequantize", "quantize_tensors",
    "register_quantizer", "unregister_quantizer", "quant_type", "quant_types", "CUSTOM_APR2_IDS",
    "DEGRADATION_LIMIT",
]

log = logging.getLogger(__name__)

#: APR2 dtype ids left to custom quantizers.  aprender's u8 table has no free range
#: it promises to keep free, so custom types are written in the APR2 layout only.
CUSTOM_APR2_IDS = range(200, 255)

#: Jidoka: a tensor whose cosine similarity to the original drops
#: by more than this is logged and listed in the report; quantization still proceeds.
DEGRADATION_LIMIT = 0.05


# --- the types -------------------------------------------------------------------------
class QuantType:
    """One quantization type: what a tensor of it looks like and how to make and read it.

    ``bits`` is the integer width of one quantized value (aprender's ``bits``);
    ``bits_per_weight`` counts the scales too (Q4_0: 4.5).  Subclasses provide
    ``_quantize(values, threads)`` and ``_dequantize(qt, out, threads)``.
    """

    name: str = ""
    bits: int = 0
    symmetric: bool = True
    can_quantize: bool = True

    @property
    def dtype(self) -> DType:
        return _dtypes.DTYPES[self.name]

    @property
    def block_elems(self) -> int:
        return self.dtype.block_elems

    @property
    def block_bytes(self) -> int:
        return self.dtype.block_bytes

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per element; per-tensor types give the limit for large tensors (8)."""
        return self.block_bytes * 8 / self.block_elems

    @property
    def block_size(self) -> int | None:
        """Elements sharing one scale (aprender's ``block_size``); None for one per tensor."""
        return None if self.dtype.tensor_header else self.block_elems

    def quantize(self, array, *, threads: int = 0, name: str | None = None) -> QuantizedTensor:
        """``array`` (any float dtype, any shape) as a QuantizedTensor of this type."""
        self.require_quantizer()
        values = _float32(array, name, threads)
        self.check_shape(values.shape, name)
        return self._quantize(values, threads)

    def dequantize(self, qt, out=None, *, threads: int = 0) -> np.ndarray:
        """float32 values of ``qt`` (a QuantizedTensor of this type), in ``out`` if given."""
        if not isinstance(qt, RawTensor) or qt.dtype is not self.dtype:
            raise LayoutError(f"{self.name}.dequantize takes a QuantizedTensor of {self.name}, not {qt!r}")
        expected = self.dtype.nbytes(qt.shape)
        if qt.data.nbytes != expected:
            raise CorruptError(f"{self.name} tensor of shape {list(qt.shape)} needs {expected} bytes, "
                               f"found {qt.data.nbytes}")
        _dtypes.check_shape(qt.shape, 4, f"{self.name} tensor")  # LimitError, not NumPy's ValueError
        result = _output(out, qt.shape)
        if result.size:
            self._dequantize(qt, result.reshape(-1), threads)
        return result

    def require_quantizer(self) -> None:
        """Refuse to quantize to a type aprfast can only read."""
        if not self.can_quantize:
            raise LayoutError(f"{self.name} tensors can be read and dequantized, but aprfast has no "
                              f"{self.name} quantizer; it quantizes to {', '.join(quant_types(quantizable=True))}")

    def check_shape(self, shape, name=None) -> None:
        """Refuse a shape this type cannot quantize (GGML blocks never span rows)."""
        self.require_quantizer()
        row = _row_problem(self, shape)
        if row:
            raise LayoutError(f"{_tensor(name)}shape {list(shape)}: {row}")

    def _quantize(self, values: np.ndarray, threads: int) -> QuantizedTensor:
        raise NotImplementedError

    def _dequantize(self, qt, out: np.ndarray, threads: int) -> None:
        raise NotImplementedError

    def __repr__(self):
        return f"<aprfast quantization type {self.name}: {self.bits_per_weight:g} bits/weight>"


class _Kernel(QuantType):
    """A built-in type whose kernels are in ``aprfast._quant``."""

    _quantizer: str | None = None  # name of the _quant function, None: dequantize only

    @property
    def can_quantize(self) -> bool:
        return self._quantizer is not None

    def _quantize(self, values, threads):
        out = empty_output(self.dtype.nbytes(values.shape), np.uint8)
        if values.size:
            getattr(_quant, self._quantizer)(values.reshape(-1), out, threads=threads)
        return QuantizedTensor(self.dtype, values.shape, out)

    def _dequantize(self, qt, out, threads):
        d = self.dtype
        row = qt.shape[-1] if qt.shape else 1
        if d.packed and d.blocks_per_row and row % d.block_elems:
            # Rows padded to whole blocks (aprender pads K-quant rows to 256, GH-202):
            # decode the padded rows, keep the first `row` values of each.
            padded = -(-row // d.block_elems) * d.block_elems
            rows = empty_output((out.size // row, padded), np.float32)
            _quant.dequantize(self.name, qt.data, rows.reshape(-1), threads=threads)
            out.reshape(-1, row)[...] = rows[:, :row]
            return
        _quant.dequantize(self.name, qt.data, out, threads=threads)


class Q8_0(_Kernel):
    """GGML Q8_0: 32 values share an f16 scale d = max|x|/127; q = round(x/d)."""

    name, bits, symmetric, _quantizer = "Q8_0", 8, True, "quantize_q8_0"


class Q4_0(_Kernel):
    """GGML Q4_0: d = (the x of largest magnitude)/-8, q = trunc(x/d + 8.5) in 0..15."""

    name, bits, symmetric, _quantizer = "Q4_0", 4, True, "quantize_q4_0"


class Q4_1(_Kernel):
    """GGML Q4_1: d = (max-min)/15, m = min, q = trunc((x-m)/d + 0.5) in 0..15."""

    name, bits, symmetric, _quantizer = "Q4_1", 4, False, "quantize_q4_1"


class Q5_0(_Kernel):
    """GGML Q5_0: d = (the x of largest magnitude)/-16, q = trunc(x/d + 16.5) in 0..31."""

    name, bits, symmetric, _quantizer = "Q5_0", 5, True, "quantize_q5_0"


class Q5_1(_Kernel):
    """GGML Q5_1: d = (max-min)/31, m = min, q = trunc((x-m)/d + 0.5) in 0..31."""

    name, bits, symmetric, _quantizer = "Q5_1", 5, False, "quantize_q5_1"


class Q4_K(_Kernel):
    """GGML Q4_K super-blocks of 256: 6-bit scales and mins per 32 (ggml's reference quantizer)."""

    name, bits, symmetric, _quantizer = "Q4_K", 4, False, "quantize_q4_k"


class Q6_K(_Kernel):
    """GGML Q6_K super-blocks of 256: an 8-bit scale per 16 (ggml's reference quantizer)."""

    name, bits, symmetric, _quantizer = "Q6_K", 6, True, "quantize_q6_k"


class Q8_1(_Kernel):
    """GGML Q8_1 (dequantize only): Q8_0 plus an f16 sum; x = q * d (ggml, 36-byte blocks)."""

    name, bits, symmetric = "Q8_1", 8, True


class Q2_K(_Kernel):
    """GGML Q2_K super-blocks of 256, 4-bit scales and mins per 16 (ggml's reference quantizer)."""

    name, bits, symmetric, _quantizer = "Q2_K", 2, False, "quantize_q2_k"


class Q3_K(_Kernel):
    """GGML Q3_K super-blocks of 256, 6-bit scales per 16 (ggml's reference quantizer)."""

    name, bits, symmetric, _quantizer = "Q3_K", 3, True, "quantize_q3_k"


class Q5_K(_Kernel):
    """GGML Q5_K super-blocks of 256, 6-bit scales and mins per 32 (ggml's reference quantizer)."""

    name, bits, symmetric, _quantizer = "Q5_K", 5, False, "quantize_q5_k"


class Q8_K(_Kernel):
    """GGML Q8_K super-blocks of 256: an f32 scale d = max/-127, int8 q and 16 sums of 16
    (ggml's reference quantizer; the int8 side of ggml's K-quant dot products, not a weight type)."""

    name, bits, symmetric, _quantizer = "Q8_K", 8, True, "quantize_q8_k"


class IQ2_XXS(_Kernel):
    """GGML IQ2_XXS: 8-value groups from a 256-entry grid, with signs (dequantize only)."""

    name, bits, symmetric = "IQ2_XXS", 2, True


class IQ2_XS(_Kernel):
    """GGML IQ2_XS: 8-value groups from a 512-entry grid, with signs (dequantize only)."""

    name, bits, symmetric = "IQ2_XS", 2, True


class IQ2_S(_Kernel):
    """GGML IQ2_S: 8-value groups from a 1024-entry grid, with signs (dequantize only)."""

    name, bits, symmetric = "IQ2_S", 2, True


class IQ3_XXS(_Kernel):
    """GGML IQ3_XXS: 4-value groups from a 256-entry grid, with signs (dequantize only)."""

    name, bits, symmetric = "IQ3_XXS", 3, True


class IQ3_S(_Kernel):
    """GGML IQ3_S: 4-value groups from a 512-entry grid, with signs, a 4-bit scale per 32 (ggml's
    quantize_iq3_s without an importance matrix)."""

    name, bits, symmetric, _quantizer = "IQ3_S", 3, True, "quantize_iq3_s"


class IQ1_S(_Kernel):
    """GGML IQ1_S: 8-value groups of -1/0/1 from a 2048-entry grid plus a delta (dequantize only)."""

    name, bits, symmetric = "IQ1_S", 1, True


class IQ1_M(_Kernel):
    """GGML IQ1_M: IQ1_S's grid with a scale per 16 values (dequantize only)."""

    name, bits, symmetric = "IQ1_M", 1, True


class IQ4_NL(_Kernel):
    """GGML IQ4_NL: blocks of 32, 4-bit indices into 16 non-linear values, an f16 scale fitted by
    weighted least squares (ggml's quantize_iq4_nl without an importance matrix)."""

    name, bits, symmetric, _quantizer = "IQ4_NL", 4, True, "quantize_iq4_nl"


class IQ4_XS(_Kernel):
    """GGML IQ4_XS: IQ4_NL's values in super-blocks of 256, a 6-bit scale per 32 (ggml's
    quantize_iq4_xs without an importance matrix)."""

    name, bits, symmetric, _quantizer = "IQ4_XS", 4, True, "quantize_iq4_xs"


class TQ1_0(_Kernel):
    """GGML TQ1_0: ternary (d = max|x|, t = round(x/d) in -1..1), five values a byte in base 3."""

    name, bits, symmetric, _quantizer = "TQ1_0", 2, True, "quantize_tq1_0"


class TQ2_0(_Kernel):
    """GGML TQ2_0: ternary (d = max|x|, t = round(x/d) in -1..1), two bits a value."""

    name, bits, symmetric, _quantizer = "TQ2_0", 2, True, "quantize_tq2_0"


class MXFP4(_Kernel):
    """GGML MXFP4 (OCP MX): 32 e2m1 values sharing an e8m0 scale (the nearest e2m1 value each)."""

    name, bits, symmetric, _quantizer = "MXFP4", 4, True, "quantize_mxfp4"


class NVFP4(_Kernel):
    """GGML NVFP4: 64 e2m1 values, a ue4m3 scale per 16 (dequantize only)."""

    name, bits, symmetric = "NVFP4", 4, True


class Q1_0(_Kernel):
    """GGML Q1_0: 128 sign bits sharing an f16 scale d = mean |x|, x = +-d (ggml's
    quantize_row_q1_0_ref)."""

    name, bits, symmetric, _quantizer = "Q1_0", 1, True, "quantize_q1_0"


class APR_Q8(_Kernel):
    """aprender's APR_Q8: one f32 scale max|x|/127 for the whole tensor, then i8 values."""

    name, bits, symmetric, _quantizer = "APR_Q8", 8, True, "quantize_apr_q8"


class APR_Q4(_Kernel):
    """aprender's APR_Q4: blocks of 32 across rows, f16 scale max|x|/7, interleaved nibbles."""

    name, bits, symmetric, _quantizer = "APR_Q4", 4, True, "quantize_apr_q4"


class Q8_TENSOR(_Kernel):
    """The spec's Q8_TENSOR: f32 scale, i32 zero point, i8 values; x = scale * (q - zero_point)."""

    name, bits, symmetric, _quantizer = "Q8_TENSOR", 8, False, "quantize_q8_tensor"


class APR_FQ8_0(_Kernel):
    """aprender's format-quantize Q8_0 (docs/guide/compatibility.md): GGML's block layout, but an
    all-zero block stores d = 1.0 and blocks run across rows (a partial last block is
    padded with zero bytes)."""

    name, bits, symmetric, _quantizer = "APR_FQ8_0", 8, True, "quantize_apr_fq8_0"


class APR_FQ4_0(_Kernel):
    """aprender's format-quantize Q4_0: d = max|x|/7, round half away from zero, clamp to
    [-8, 7], nibbles interleaved (element 2k low, 2k+1 high); not GGML's Q4_0."""

    name, bits, symmetric, _quantizer = "APR_FQ4_0", 4, True, "quantize_apr_fq4_0"


class _Custom(QuantType):
    """A type registered with :func:`register_quantizer`."""

    def __init__(self, name, quantize, dequantize, bits_per_weight, bits, symmetric):
        self.name, self.bits, self.symmetric = name, bits, symmetric
        self._bits_per_weight = float(bits_per_weight)
        self._quantize_fn, self._dequantize_fn = quantize, dequantize

    @property
    def bits_per_weight(self) -> float:
        return self._bits_per_weight

    def _quantize(self, values, threads):
        data = self._quantize_fn(values)
        raw = np.frombuffer(data, np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) \
            else _c_order(np.asarray(data)).reshape(-1).view(np.uint8)
        expected = self.dtype.nbytes(values.shape)
        if raw.nbytes != expected:
            raise CorruptError(f"custom quantizer {self.name} returned {raw.nbytes} bytes for shape "
                               f"{list(values.shape)}; the type's size rule says {expected}")
        return QuantizedTensor(self.dtype, values.shape, raw)

    def _dequantize(self, qt, out, threads):
        values = np.asarray(self._dequantize_fn(qt.data, qt.shape))
        if values.size != out.size:
            raise CorruptError(f"custom dequantizer {self.name} returned {values.size} values for shape "
                               f"{list(qt.shape)} ({out.size} elements)")
        out[...] = values.reshape(-1)


_BUILT_IN = (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K, APR_Q8, APR_Q4, Q8_TENSOR, APR_FQ8_0, APR_FQ4_0,
             Q8_1, Q2_K, Q3_K, Q5_K, Q8_K, IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS, IQ1_M,
             TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0)
_TYPES: dict[str, QuantType] = {cls.name: cls() for cls in _BUILT_IN}


def quant_types(*, quantizable: bool = False) -> list:
    """Names of every registered type (only those with a quantizer if ``quantizable``)."""
    return [name for name, t in _TYPES.items() if t.can_quantize or not quantizable]


def quant_type(name) -> QuantType:
    """The registered type called ``name`` (case-insensitive: "q4_0", "Q4_K", "apr_q8")."""
    if isinstance(name, QuantType):
        return name
    found = None
    if isinstance(name, (str, DType)):
        try:
            found = _TYPES.get(_dtypes.by_name(name).name)
        except UnknownDTypeError:
            pass
    if found is None:
        raise UnknownDTypeError(f"unknown quantization type {name!r}; known: {', '.join(_TYPES)}")
    return found


# --- one tensor ------------------------------------------------------------------------
def quantize(array, qtype, *, threads: int = 0, name: str | None = None) -> QuantizedTensor:
    """``array`` quantized to ``qtype`` ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "tq1_0",
    "tq2_0", "mxfp4", "apr_q8", "apr_q4", "q8_tensor", ... or a registered custom type;
    ``quant_types(quantizable=True)`` lists them).

    float16, bfloat16 and float64 inputs are converted to float32 first.  GGML types
    need the last dimension (the row) to be a multiple of 32: their blocks never span
    rows.  Empty tensors give empty QuantizedTensors.  ``name`` only labels errors.
    See docs/guide/quantization.md.

    Args:
        array: A floating-point array (float16, bfloat16, float32 or float64).
        qtype: A type name (case-insensitive), a DType or a registered QuantType.
        threads: Most threads to use (0: the cores idle at the call).
        name: The tensor's name, for error messages.

    Returns:
        A :class:`aprfast.QuantizedTensor` of ``array``'s shape.

    Raises:
        UnknownDTypeError: ``qtype`` is not a registered quantization type.
        LayoutError: ``array`` is not floating point (or is already packed), its rows
            are not whole blocks of a GGML type, or the type can only be read
            (most IQ types, NVFP4 and Q8_1 have no quantizer).

    Examples:
        >>> import numpy as np, aprfast
        >>> q = aprfast.quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), "q8_0")
        >>> q
        QuantizedTensor(Q8_0, shape=[2, 32], nbytes=68)
        >>> float(abs(aprfast.dequantize(q) - np.linspace(-1, 1, 64).reshape(2, 32)).max()) < 0.01
        True
    """
    return quant_type(qtype).quantize(array, threads=threads, name=name)


def dequantize(qt, out=None, *, threads: int = 0) -> np.ndarray:
    """float32 values of a QuantizedTensor, with its logical shape.

    ``out``, if given, receives them: a float32, C-contiguous, writable array of the
    same element count (returned, viewed with the tensor's shape).

    Args:
        qt: A :class:`aprfast.QuantizedTensor` (as :func:`quantize` or a reader gives).
        out: A float32 array to write the values into.
        threads: Most threads to use (0: the cores idle at the call).

    Returns:
        A float32 array of the tensor's logical shape (``out`` when given).

    Raises:
        LayoutError: ``qt`` is not a packed tensor, or ``out`` is unusable.
        CorruptError: A custom dequantizer returned the wrong number of values.

    Examples:
        >>> import numpy as np, aprfast
        >>> q = aprfast.quantize(np.full((1, 32), 0.5, np.float32), "q4_0")
        >>> aprfast.dequantize(q)[0, :4]
        array([0.5, 0.5, 0.5, 0.5], dtype=float32)
    """
    if isinstance(qt, RawTensor) and (qt.dtype is None or qt.dtype.opaque):
        kind = qt.dtype.name if qt.dtype is not None else f"unknown({qt.dtype_id})"
        raise UnknownDTypeError(f"a tensor of dtype {kind} has no values aprfast can give: aprfast does not know "
                                "the type (its bytes are kept as they are)")
    if not isinstance(qt, RawTensor) or qt.dtype is None or not qt.dtype.packed:
        raise LayoutError(f"dequantize takes a QuantizedTensor, not {type(qt).__name__}"
                          + (f" {qt!r}" if isinstance(qt, RawTensor) else ""))
    if qt.dtype.name in _dtypes.SUBBYTE_FLOATS:  # FP4/FP6: every code is a float32 (a table)
        return _subbyte(qt, out)
    return quant_type(qt.dtype.name).dequantize(qt, out, threads=threads)


def _subbyte(qt, out) -> np.ndarray:
    expected = qt.dtype.nbytes(qt.shape)
    if qt.data.nbytes != expected:
        raise CorruptError(f"{qt.dtype.name} tensor of shape {list(qt.shape)} needs {expected} bytes, "
                           f"found {qt.data.nbytes}")
    _dtypes.check_shape(qt.shape, 4, f"{qt.dtype.name} tensor")
    result = _output(out, qt.shape)
    result.reshape(-1)[:] = _dtypes.subbyte_values(qt.dtype, qt.data, qt.shape).reshape(-1)
    return result


def _float32(array, name, threads: int = 0) -> np.ndarray:
    """C-ordered native float32 values of a float array (any float dtype)."""
    if isinstance(array, RawTensor):
        raise LayoutError(f"{_tensor(name)}{array!r} is already packed; dequantize it first")
    values = np.asarray(array)
    if values.dtype == np.float32 and values.dtype.isnative:
        return _c_order(values)
    if values.dtype.kind == "f" and values.dtype.itemsize == 2 or _is_bf16(values.dtype):
        return to_float32(values, threads=threads)
    if values.dtype.kind == "f":
        with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf
            return _c_order(values.astype(np.float32))
    raise LayoutError(f"{_tensor(name)}quantization takes floating-point arrays, not {values.dtype}")


def _is_bf16(dtype) -> bool:
    return bfloat16 is not None and dtype == np.dtype(bfloat16)


def _row_problem(kind: QuantType, shape) -> str | None:
    """Why ``shape`` cannot be quantized to ``kind`` block by block, or None."""
    d = kind.dtype
    if not d.blocks_per_row or element_count(shape) == 0:
        return None
    row = shape[-1] if shape else 1
    if row % d.block_elems:
        return (f"{kind.name} blocks of {d.block_elems} never span rows, so the row length (last dimension, "
                f"{row}) must be a multiple of {d.block_elems}")
    return None


def _output(out, shape) -> np.ndarray:
    if out is None:  # large results reuse cached, already-touched memory (precision.empty_output)
        return empty_output(shape, np.float32)
    if not isinstance(out, np.ndarray) or out.dtype != np.float32 or not out.dtype.isnative:
        raise LayoutError(f"out must be a float32 NumPy array, not {getattr(out, 'dtype', type(out).__name__)}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise LayoutError("out must be C-contiguous and writable")
    count = element_count(shape)
    if out.size != count:
        raise LayoutError(f"out holds {out.size} elements; the tensor of shape {list(shape)} has {count}")
    return out if out.shape == tuple(shape) else out.reshape(shape)


def _c_order(array: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns 0-d arrays into 1-d ones.
    return array if array.flags.c_contiguous else array.copy(order="C")


def _tensor(name) -> str:
    return f"tensor {name!r}: " if name is not None else ""


# --- custom types ----------------------------------------------------------------------
_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,31}")


def register_quantizer(name: str, quantize, dequantize, bits_per_weight: float, *, block_elems: int,
                       block_bytes: int, apr2_id: int, blocks_per_row: bool = True, bits: int | None = None,
                       symmetric: bool = True) -> QuantType:
    """Add a quantization type of your own and return it (docs/guide/quantization.md).

    ``quantize(values)`` gets a C-ordered float32 array (its shape is the tensor's) and
    returns the packed bytes (bytes-like or an array); ``dequantize(data, shape)`` gets
    those bytes as a uint8 array and returns the ``prod(shape)`` values.  A tensor takes
    ``ceil(elements / block_elems) * block_bytes`` bytes, counted per row when
    ``blocks_per_row`` (then rows must be whole blocks, as in GGML).

    Files need a stable id for the type: ``apr2_id`` must be one of
    :data:`CUSTOM_APR2_IDS` (200-254), so such tensors are saved in the APR2 layout only
    (aprender's layout has no ids to spare).  Reading the file back needs the same
    registration.  Names and ids already in use are refused.

    Args:
        name: The type's name: 1-32 letters, digits or "_", starting with a letter
            (stored upper-case).
        quantize: ``quantize(values) -> bytes``, as above.
        dequantize: ``dequantize(data, shape) -> values``, as above.
        bits_per_weight: Bits a stored element takes on average, in (0, 64].
        block_elems: Elements per block.
        block_bytes: Bytes per block.
        apr2_id: The type's APR2 dtype id, in :data:`CUSTOM_APR2_IDS`.
        blocks_per_row: Blocks never span rows (rows must be whole blocks).
        bits: Width of one quantized value (default: ``int(bits_per_weight)``).
        symmetric: Whether the scheme is symmetric (recorded in metadata).

    Returns:
        The new :class:`QuantType`; :func:`quantize` and readers now know ``name``.

    Raises:
        LayoutError: A bad name, id or size, or a name or id already in use.
        TypeError: ``quantize`` or ``dequantize`` is not callable.

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast.numerics.quantization import unregister_quantizer
        >>> def q(values):  # one int8 per value, no scale: a toy
        ...     return np.clip(np.round(values), -128, 127).astype(np.int8)
        >>> def dq(data, shape):
        ...     return data.view(np.int8).astype(np.float32)
        >>> kind = aprfast.register_quantizer("toy_i8", q, dq, 8, block_elems=1, block_bytes=1, apr2_id=250)
        >>> t = aprfast.quantize(np.float32([1.2, -3.7]), "toy_i8")
        >>> t, aprfast.dequantize(aprfast.load(aprfast.save({"t": t}))["t"])
        (QuantizedTensor(TOY_I8, shape=[2], nbytes=2), array([ 1., -4.], dtype=float32))
        >>> unregister_quantizer("toy_i8")
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name.upper()):
        raise LayoutError(f"quantizer name {name!r} must be 1-32 letters, digits or '_', starting with a letter")
    key = name.upper()
    if not callable(quantize) or not callable(dequantize):
        raise TypeError("quantize and dequantize must be callables")
    if isinstance(apr2_id, bool) or not isinstance(apr2_id, int) or apr2_id not in CUSTOM_APR2_IDS:
        raise LayoutError(f"custom dtype ids are {CUSTOM_APR2_IDS.start}-{CUSTOM_APR2_IDS.stop - 1} "
                          f"(APR2 layout only), not {apr2_id!r}")
    if APR2_IDS.knows(apr2_id):
        raise LayoutError(f"APR2 dtype id {apr2_id} is already taken by {APR2_IDS.dtype(apr2_id).name}")
    for what, value in (("block_elems", block_elems), ("block_bytes", block_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LayoutError(f"{what} must be a positive int, not {value!r}")
    if not (isinstance(bits_per_weight, (int, float)) and 0 < bits_per_weight <= 64):
        raise LayoutError(f"bits_per_weight must be a number in (0, 64], not {bits_per_weight!r}")
    bits = int(bits_per_weight) if bits is None else bits
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 64:
        raise LayoutError(f"bits (the width of one quantized value) must be an int in 1-64, not {bits!r}")
    if key in _TYPES:
        raise LayoutError(f"a quantization type named {key} is already registered")
    dtype = _dtypes.add_dtype(DType(key, None, 0, block_elems, block_bytes, blocks_per_row))
    try:
        APR2_IDS.add(apr2_id, dtype)
    except LayoutError:
        _dtypes.remove_dtype(key)
        raise
    kind = _TYPES[key] = _Custom(key, quantize, dequantize, bits_per_weight, bits, symmetric)
    return kind


def unregister_quantizer(name: str) -> None:
    """Remove a custom type (built-in types stay).

    Args:
        name: The custom type's name.

    Raises:
        UnknownDTypeError: No type of that name is registered.
        LayoutError: ``name`` is a built-in type.
    """
    kind = quant_type(name)
    if not isinstance(kind, _Custom):
        raise LayoutError(f"{kind.name} is built in and cannot be unregistered")
    type_id = APR2_IDS.id_of(kind.dtype)
    APR2_IDS.remove(type_id)
    _dtypes.remove_dtype(kind.name)
    del _TYPES[kind.name]


# --- a whole model ---------------------------------------------------------------------
@dataclass(frozen=True)
class TensorReport:
    """What :func:`quantize_tensors` did to one tensor.

    ``type`` is the quantization type, or None when the tensor was kept as it was
    (``reason`` says why).  ``bits_per_weight`` is what the stored tensor takes per
    element (``nbytes * 8 / elements``).  The error figures compare the dequantized
    values with the float32 input: root mean square error, largest absolute error and
    cosine similarity (1.0 for two all-zero tensors); NaN when the input holds NaN/inf,
    None for kept tensors and with ``measure=False``.

    Examples:
        >>> import numpy as np, aprfast
        >>> _, report = aprfast.quantize_tensors({"w": np.ones((2, 32), np.float32)}, "q8_0")
        >>> entry = report["w"]
        >>> entry.quantized, entry.type, entry.bits_per_weight, entry.elements
        (True, 'Q8_0', 8.5, 64)
    """

    name: str
    shape: tuple
    original_dtype: str
    type: str | None
    bits_per_weight: float | None
    rmse: float | None = None
    max_abs_error: float | None = None
    cosine_similarity: float | None = None
    reason: str | None = None

    @property
    def quantized(self) -> bool:
        """True unless the tensor was kept as it was."""
        return self.type is not None

    @property
    def elements(self) -> int:
        """The tensor's element count."""
        return element_count(self.shape)

    def as_dict(self) -> dict:
        """The entry as a JSON-ready dict (what ``QuantizationReport.as_dict`` lists)."""
        return {"shape": list(self.shape), "original_dtype": self.original_dtype, "type": self.type,
                "bits_per_weight": self.bits_per_weight, "rmse": self.rmse, "max_abs_error": self.max_abs_error,
                "cosine_similarity": self.cosine_similarity, "reason": self.reason}


class QuantizationReport:
    """One :class:`TensorReport` per tensor, in input order; ``report[name]`` for one.

    What :func:`quantize_tensors` returns beside the tensors; ``str(report)`` is a table
    of every tensor's type, bits per weight and error figures.

    Examples:
        >>> import numpy as np, aprfast
        >>> tensors = {"w": np.ones((2, 32), np.float32), "norm": np.ones(4, np.float32)}
        >>> _, report = aprfast.quantize_tensors(tensors, "q8_0", {"*norm*": None})
        >>> report, [e.name for e in report.kept], report.dominant_type()
        (<QuantizationReport 1 quantized, 1 kept>, ['norm'], 'Q8_0')
    """

    def __init__(self, entries):
        self.entries = {e.name: e for e in entries}

    def __getitem__(self, name) -> TensorReport:
        return self.entries[name]

    def __iter__(self):
        return iter(self.entries.values())

    def __len__(self):
        return len(self.entries)

    def __contains__(self, name):
        return name in self.entries

    @property
    def quantized(self) -> list:
        """The entries of the tensors that were quantized."""
        return [e for e in self if e.quantized]

    @property
    def kept(self) -> list:
        """The entries of the tensors kept as they were (each with its ``reason``)."""
        return [e for e in self if not e.quantized]

    @property
    def warnings(self) -> list:
        """Jidoka: tensors whose cosine similarity fell more than DEGRADATION_LIMIT below 1,
        one message each (also logged by :func:`quantize_tensors`)."""
        return [f"{e.name}: {e.type} cosine similarity {e.cosine_similarity:.4f}" for e in self._degraded()]

    def _degraded(self) -> list:
        return [e for e in self.quantized
                if e.cosine_similarity is not None and not e.cosine_similarity >= 1 - DEGRADATION_LIMIT]

    def dominant_type(self) -> str | None:
        """The type holding the most elements (ties: the first registered), or None."""
        totals = {}
        for e in self.quantized:
            totals[e.type] = totals.get(e.type, 0) + e.elements
        order = list(_TYPES)
        ranked = sorted(totals, key=lambda t: (-totals[t], order.index(t) if t in order else len(order), t))
        return ranked[0] if ranked else None

    def metadata(self, layout: str = "auto") -> dict | None:
        """The ``quantization`` metadata value to save with the tensors (None if nothing
        was quantized).

        "aprender": aprender's ``QuantizationMetadata`` for the dominant type,
        ``{"quant_type": "q4_0", "bits": 4, "block_size": 32, "symmetric": true}``.
        "apr2": ``{"method": "Q4_0", "bits_per_weight": 4.5, "per_tensor": {name: type}}``
        plus ``"accuracy_warnings": [names]`` when any tensor degraded (see :data:`DEGRADATION_LIMIT`).
        "auto": aprender's form when every type used has an aprender dtype id, else apr2's.

        Args:
            layout: "auto", "aprender" or "apr2": the layout the file will be saved in.

        Returns:
            A dict to save as ``metadata={"quantization": ...}``, or None.

        Raises:
            LayoutError: An unknown ``layout``.

        Examples:
            >>> import numpy as np, aprfast
            >>> _, report = aprfast.quantize_tensors({"w": np.ones((2, 32), np.float32)}, "q4_0")
            >>> report.metadata("aprender")
            {'quant_type': 'q4_0', 'bits': 4, 'block_size': 32, 'symmetric': True}
        """
        dominant = self.dominant_type()
        if dominant is None:
            return None
        if layout == "auto":
            fits = all(APRENDER_IDS.holds(_dtypes.DTYPES[e.type]) for e in self.quantized)
            layout = "aprender" if fits else "apr2"
        kind = _TYPES.get(dominant) or quant_type(dominant)
        if layout == "aprender":
            return {"quant_type": kind.name.lower(), "bits": kind.bits, "block_size": kind.block_size,
                    "symmetric": kind.symmetric}
        if layout == "apr2":
            meta = {"method": kind.name, "bits_per_weight": kind.bits_per_weight,
                    "per_tensor": {e.name: e.type for e in self.quantized}}
            degraded = [e.name for e in self._degraded()]
            if degraded:
                meta["accuracy_warnings"] = degraded
            return meta
        raise LayoutError(f"unknown layout {layout!r}; choose auto, aprender or apr2")

    def as_dict(self) -> dict:
        """``{name: entry.as_dict()}`` for every tensor, JSON-ready."""
        return {name: e.as_dict() for name, e in self.entries.items()}

    def __str__(self):
        lines = [f"{'tensor':<40} {'type':<10} {'bits/w':>7} {'rmse':>10} {'max err':>10} {'cosine':>8}"]
        for e in self:
            if e.quantized:
                figures = ("" if e.rmse is None else
                           f" {e.rmse:>10.3g} {e.max_abs_error:>10.3g} {e.cosine_similarity:>8.5f}")
                lines.append(f"{e.name[:40]:<40} {e.type:<10} {e.bits_per_weight:>7.3f}{figures}")
            else:
                lines.append(f"{e.name[:40]:<40} {'kept':<10} {e.reason}")
        return "\n".join(lines)

    def __repr__(self):
        return f"<QuantizationReport {len(self.quantized)} quantized, {len(self.kept)} kept>"


def quantize_tensors(tensors, default="q4_0", rules=None, *, threads: int = 0, strict: bool = False,
                     measure: bool = True, progress=None):
    """Quantize a model's float tensors; return ``(tensors, report)``.

    Each tensor's type comes from ``rules``, else ``default``; None keeps it as it is.
    ``rules`` maps glob patterns (``fnmatch``, case-sensitive) to a type name or None,
    tried in order, first match wins, e.g. ``{"*.embed*": "q8_0", "*norm*": None}``; it
    may also be a list of (pattern, type) pairs or a callable ``(name, shape) -> type or
    None`` (the spec's ``select_quantizer``).

    Kept as they are, with the reason in the report: tensors that are not floating
    point (or already packed), 0-d tensors, tensors smaller than one block, and
    tensors whose rows are not whole blocks of a GGML type (with ``strict=True`` the
    last is a LayoutError instead).  Returns a new dict (kept values are the objects
    given) and a :class:`QuantizationReport`; ``measure=False`` skips its error figures
    (they cost a dequantization and a few passes over each tensor).
    See docs/guide/quantization.md.

    Args:
        tensors: A mapping of name to array (any dtype; only float tensors quantize).
        default: The type for tensors no rule names, or None to keep them.
        rules: Glob patterns to type names or None (a mapping or a list of pairs), or a
            callable ``(name, shape) -> type or None``.
        threads: Most threads to use (0: the cores idle at the call).
        strict: Refuse tensors whose rows are not whole blocks instead of keeping them.
        measure: Compute the error figures of the report.
        progress: None (the default: one plain line on stderr when it is a terminal
            and the call has run a second, else nothing), False (nothing), or a
            callable ``progress(done, total)`` called after each tensor (counts of
            tensors); see :mod:`aprfast.io.progress`.

    Returns:
        ``(tensors, report)``: a new dict of name to QuantizedTensor or kept value, and
        a :class:`QuantizationReport`.

    Raises:
        UnknownDTypeError: A type named by ``default`` or ``rules`` is not registered.
        LayoutError: A type without a quantizer, or (``strict``) rows that are not
            whole blocks.
        TypeError: ``tensors`` is not a mapping, ``rules`` is malformed, or
            ``progress`` is not None, a bool or a callable.

    Examples:
        >>> import numpy as np, aprfast
        >>> tensors = {"layer.w": np.ones((4, 64), np.float32), "layer.norm": np.ones(64, np.float32)}
        >>> quantized, report = aprfast.quantize_tensors(tensors, "q4_0", {"*norm*": None})
        >>> quantized["layer.w"], quantized["layer.norm"] is tensors["layer.norm"]
        (QuantizedTensor(Q4_0, shape=[4, 64], nbytes=144), True)
        >>> aprfast.save_file(quantized, "model-q4.apr", metadata={"quantization": report.metadata()})
        >>> seen = []
        >>> _ = aprfast.quantize_tensors(tensors, "q4_0", progress=lambda done, total: seen.append((done, total)))
        >>> seen
        [(1, 2), (2, 2)]
    """
    if not hasattr(tensors, "items"):
        raise TypeError(f"tensors must be a mapping of name to array, not {type(tensors).__name__}")
    select = type_selector(default, rules)
    out, entries = {}, []
    total = len(tensors) if hasattr(tensors, "__len__") else 0
    with progress_to(progress, "aprfast.quantize_tensors") as update:
        for done, (name, value) in enumerate(tensors.items(), 1):
            out[name], entry = _quantize_entry(name, value, select, strict, threads, measure)
            entries.append(entry)
            if update is not None:
                update(done, total)
    report = QuantizationReport(entries)
    for warning in report.warnings:
        log.warning("quantization degraded %s (limit %.0f%%)", warning, DEGRADATION_LIMIT * 100)
    return out, report


def _quantize_entry(name, value, select, strict, threads, measure):
    """(the value to store, its TensorReport): one tensor of :func:`quantize_tensors`."""
    shape, original, values = _describe(value)
    kind, why = select(name, shape)
    reason = why if kind is None else _keep_reason(kind, shape, original, values)
    if reason is None and kind is not None:
        problem = _row_problem(kind, shape)
        if problem:
            if strict:
                raise LayoutError(f"{_tensor(name)}shape {list(shape)}: {problem}")
            reason = problem
    if reason is not None:
        return value, TensorReport(name, shape, original, None, _stored_bits(value, shape), reason=reason)
    values = _float32(values, name, threads)
    qt = kind.quantize(values, threads=threads, name=name)
    return qt, (_measure(name, original, values, qt, kind, threads) if measure else
                TensorReport(name, qt.shape, original, kind.name, qt.nbytes * 8 / element_count(qt.shape)))


def type_selector(default, rules):
    """A function (name, shape) -> (QuantType or None, reason when None); every type
    named is checked before any work is done."""
    default_kind = _quantizer_for(default)
    if callable(rules):
        def from_callable(name, shape):
            picked = rules(name, tuple(shape))
            return (_quantizer_for(picked), None) if picked is not None else (None, "the rules callable kept it")
        return from_callable
    pairs = list(rules.items()) if hasattr(rules, "items") else list(rules or ())
    compiled = []
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise TypeError(f"rules must map glob patterns (str) to type names or None, not {pair!r}")
        pattern, type_name = pair
        compiled.append((pattern, re.compile(fnmatch.translate(pattern)).match,
                         None if type_name is None else _quantizer_for(type_name)))

    def from_rules(name, shape):
        for pattern, matches, kind in compiled:
            if matches(name):
                return kind, (None if kind is not None else f"rule {pattern!r} keeps it")
        return default_kind, (None if default_kind is not None else "no rule matched and default is None")
    return from_rules


def _quantizer_for(type_name):
    if type_name is None:
        return None
    kind = quant_type(type_name)
    kind.require_quantizer()
    return kind


def _describe(value):
    """(shape, original dtype name, array or None) without converting anything."""
    if isinstance(value, RawTensor):
        return value.shape, value.dtype.name if value.dtype else f"unknown({value.dtype_id})", None
    array = np.asarray(value)
    return tuple(array.shape), _dtype_name(array.dtype), array


def _dtype_name(dtype) -> str:
    try:
        return _dtypes.from_numpy(dtype).name
    except LayoutError:
        return str(dtype)


def _keep_reason(kind, shape, original, values) -> str | None:
    if values is None:
        return f"already packed ({original})"
    if not (values.dtype.kind == "f" or _is_bf16(values.dtype)):
        return f"not floating point ({original})"
    if not shape:
        return "0-d tensor"
    count = element_count(shape)
    if count < kind.block_elems or count == 0:
        return f"too small: {count} elements, less than one {kind.block_elems}-element {kind.name} block"
    return None


def _stored_bits(value, shape) -> float | None:
    count = element_count(shape)
    if not count:
        return None
    nbytes = value.nbytes if isinstance(value, RawTensor) else np.asarray(value).nbytes
    return nbytes * 8 / count


_CHUNK = 1 << 16  # float64 temporaries that stay in L2: the sums make seven passes


def _measure(name, original, values, qt, kind, threads) -> TensorReport:
    """Error of ``qt`` against ``values``, accumulated in float64 over bounded chunks."""
    restored = kind.dequantize(qt, threads=threads).reshape(-1)
    flat = values.reshape(-1)
    sq = dot = na = nb = 0.0
    worst = 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        for start in range(0, flat.size, _CHUNK):
            a = flat[start:start + _CHUNK].astype(np.float64)
            b = restored[start:start + _CHUNK].astype(np.float64)
            diff = b - a
            # einsum, not `@`: BLAS dot products start thread pools that cost more than the sums.
            sq += float(np.einsum("i,i->", diff, diff))
            worst = max(worst, float(np.max(np.abs(diff))))
            dot += float(np.einsum("i,i->", a, b))
            na += float(np.einsum("i,i->", a, a))
            nb += float(np.einsum("i,i->", b, b))
        if any(math.isnan(x) for x in (sq, worst, dot, na, nb)):
            worst = math.nan
    count = flat.size
    if na == 0 and nb == 0:
        cosine = 1.0
    elif na == 0 or nb == 0:
        cosine = 0.0
    else:
        cosine = dot / math.sqrt(na * nb) if math.isfinite(na * nb) else math.nan
    return TensorReport(name, qt.shape, original, kind.name, qt.nbytes * 8 / count,
                        rmse=math.sqrt(sq / count), max_abs_error=worst, cosine_similarity=cosine)
