"""float32 <-> float16 / bfloat16 conversion at C speed, threads and SIMD included.

Each function gives exactly the bits NumPy and ml_dtypes give (the kernels in
``csrc/half.c`` are tested against them), shapes kept:

* :func:`to_float16` - as ``astype(np.float16)``: round to nearest even, subnormals
  kept, overflow to infinity, NaN payloads kept.
* :func:`to_bfloat16` - as ``astype(ml_dtypes.bfloat16)``: round to nearest even,
  every NaN becomes the quiet NaN of its sign.  Returns ``ml_dtypes.bfloat16`` arrays
  when ml_dtypes is installed, else the ``uint16`` bit patterns.
* :func:`to_float32` - widens float16 or bfloat16 exactly.

float64 inputs convert as NumPy/ml_dtypes convert them: straight to float16 (one
rounding); to bfloat16 with one rounding as ml_dtypes 0.7 does, or through float32
where the installed ml_dtypes rounds twice (0.6 and earlier), so the bits match the
ml_dtypes at hand (``ggml=True`` always through float32, as gguf-py); overflow gives infinity
without a warning, as in the kernels.  ``out`` is reused when
given: C-contiguous, writable, the right element count and dtype (float16/bfloat16
or their ``uint16`` bits; float32 for :func:`to_float32`).  ``threads`` caps the
threads used for large arrays: 0 = the cores idle at the time of the call (every
online core on an idle machine, one when other processes keep them busy: a thread
that must wait for a core costs more than it saves); arrays under 2 Mi elements are
converted on the calling thread whatever it says, as a second thread does not pay there.

Without ``out``, results of 32 MiB and more live in aprfast's aligned buffers (see
:func:`empty_output`), so a loop of same-size conversions reuses already-touched memory.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _half, _memory
from .._backend import BACKEND
from ..dtypes import bfloat16, by_name
from ..errors import LayoutError
from ..tensors import RawTensor

__all__ = ["to_float16", "to_bfloat16", "to_float32"]

_F16 = np.dtype("<f2")
_U16 = np.dtype("<u2")
_F32 = np.dtype(np.float32)
_BITS = np.dtype(np.uint16)  # the native-order object: .view() takes it several times faster than "<u2"
_BF16 = np.dtype(bfloat16) if bfloat16 is not None else None


def _ml_dtypes_rounds_f64_once() -> bool:
    """Whether ``float64.astype(bfloat16)`` rounds once (ml_dtypes 0.7) rather than
    through float32 (earlier versions): 1 + 2**-8 + 2**-30 is a tie in float32 (rounds
    down to even, 1.0) but above the tie in float64 (rounds up, 0x3F81).  True without
    ml_dtypes: one rounding is the correct result."""
    if _BF16 is None:
        return True
    probe = np.array([1 + 2**-8 + 2**-30], np.float64).astype(_BF16).view(np.uint16)
    return int(probe[0]) == 0x3F81


#: How float64 becomes bfloat16 here: as the installed ml_dtypes does it.
_BF16_F64_ONCE = _ml_dtypes_rounds_f64_once()

#: Outputs of at least this many bytes come from aprfast's buffer cache (csrc/buffers.c),
#: smaller ones from np.empty.  Why: glibc's malloc reuses freed blocks below its mmap
#: threshold, which stops rising at 32 MiB, so a loop of same-size NumPy allocations
#: under it gets already-touched memory back, while from 32 MiB on every np.empty maps,
#: faults in and zeroes fresh pages (about 15 ms of a 17 ms f16 -> f32 conversion to 64
#: MiB here).  The cache keeps freed huge-page blocks from that size on.  Below it the
#: cache was measured slower than glibc (1 MiB: 112 against 45 us; 16 MiB: 1.6 against
#: 0.87 ms), because it gives each freed block of 4 KiB pages back with MADV_FREE.
CACHED_OUTPUT_MIN = 32 << 20


def to_float16(array, out=None, *, threads: int = 0) -> np.ndarray:
    """``array`` (float32, float64, float16 or bfloat16) rounded to float16.

    Bit for bit what ``array.astype(np.float16)`` gives (see the module docstring for
    rounding, ``out`` and ``threads``; docs/guide/quantization.md).

    Args:
        array: A floating-point array (or anything ``numpy.asarray`` takes).
        out: An array to write the result into (float16, or ``uint16`` bits).
        threads: Most threads to use (0: the cores idle at the call).

    Returns:
        A float16 array of ``array``'s shape (``out`` when given).

    Raises:
        LayoutError: ``array`` is not floating point, or ``out`` is not a C-contiguous,
            writable NumPy array of the right dtype and element count.

    Examples:
        >>> import numpy as np, aprfast
        >>> aprfast.to_float16(np.float32([1.0, 65520.0, 1 / 3])).tolist()
        [1.0, inf, 0.333251953125]
    """
    values = _float_array(array, "to_float16")
    result = _output(out, values.shape, (_F16, _U16), _F16, "to_float16")
    bits = _flat(result).view(_BITS)
    if values.dtype == np.float64:  # NumPy rounds f64 -> f16 once; through f32 would round twice
        with np.errstate(over="ignore"):  # overflow gives inf, as in the kernels
            # NumPy's own cast (astype's), straight into the result: no temporary.
            np.copyto(bits.view(_F16), values.reshape(-1), casting="unsafe")
    elif values.dtype == _F16:
        bits[...] = values.reshape(-1).view(_BITS)
    else:
        _half.f32_to_f16(_flat(_widened(values, threads)), bits, threads=threads)
    return result


def to_bfloat16(array, out=None, *, threads: int = 0, ggml: bool = False) -> np.ndarray:
    """``array`` (float32, float64, float16 or bfloat16) rounded to bfloat16: an
    ``ml_dtypes.bfloat16`` array, or its ``uint16`` bits without ml_dtypes.

    Bit for bit what ``array.astype(ml_dtypes.bfloat16)`` gives; with ``ggml``, what
    gguf-py's ``quants.quantize(array, BF16)`` and ggml's ``ggml_compute_fp32_to_bf16``
    give: the same but for NaNs, which keep their sign and the upper 16 bits of their
    float32 payload with the quiet bit set (``(bits >> 16) | 0x40``) instead of becoming
    the quiet NaN of their sign (docs/FORMAT.md "BF16 NaNs").

    Args:
        array: A floating-point array (or anything ``numpy.asarray`` takes).
        out: An array to write the result into (bfloat16, or ``uint16`` bits).
        threads: Most threads to use (0: the cores idle at the call).
        ggml: NaNs as ggml and gguf-py round them (for GGUF files).

    Returns:
        A bfloat16 (or ``uint16``) array of ``array``'s shape (``out`` when given).

    Raises:
        LayoutError: ``array`` is not floating point, or ``out`` is not a C-contiguous,
            writable NumPy array of the right dtype and element count.

    Examples:
        >>> import numpy as np, aprfast
        >>> b = aprfast.to_bfloat16(np.float32([1.0, 3.14159]))
        >>> [hex(bits) for bits in b.view(np.uint16).tolist()]
        ['0x3f80', '0x4049']
    """
    values = _float_array(array, "to_bfloat16")
    wanted = _BF16 if _BF16 is not None else _U16
    result = _output(out, values.shape, tuple(d for d in (_BF16, _U16) if d is not None), wanted, "to_bfloat16")
    bits = _flat(result).view(_BITS)
    if _BF16 is not None and values.dtype == _BF16:
        bits[...] = values.reshape(-1).view(_BITS)
    elif values.dtype == np.float64 and _BF16_F64_ONCE and not ggml:
        _half.f32_to_bf16(_f32_round_to_odd(_flat(values)), bits, threads=threads)
    else:  # float64 through float32, as earlier ml_dtypes and gguf-py convert it
        _half.f32_to_bf16(_flat(_widened(values, threads)), bits, threads=threads)
    if ggml:
        _ggml_nans(values, bits)
    return result


def _ggml_nans(values: np.ndarray, bits: np.ndarray) -> None:
    """Rewrite the NaNs of ``bits`` (the bfloat16 of ``values``) as ggml makes them:
    ``(f32_bits >> 16) | 0x40``, the float32 bits of each NaN as NumPy widens or narrows
    it to float32 (as gguf-py does before it rounds)."""
    if bits.size == 0 or (int(bits.max()) <= 0xFF80 and int(bits.view(np.int16).max()) <= 0x7F80):
        return  # no NaN: two SIMD reductions, no temporaries (negative NaNs are the largest
        # uint16 patterns, 0xFF81-0xFFFF; positive ones the largest int16, 0x7F81-0x7FFF)
    nan = (bits & 0x7FFF) > 0x7F80
    if nan.any():
        with np.errstate(invalid="ignore"):  # a signalling NaN narrowed raises the invalid flag
            wide = np.ascontiguousarray(values.reshape(-1)[nan]).astype(np.float32).view(np.uint32)
        bits[nan] = ((wide >> 16) | 0x40).astype(np.uint16)


def to_float32(array, out=None, *, threads: int = 0, dtype=None) -> np.ndarray:
    """float16 or bfloat16 values widened to float32 (exact).

    ``dtype`` ("f16" or "bf16") says what 16-bit patterns mean when ``array`` holds
    raw bits (``uint16``, as bf16 tensors come back without ml_dtypes); a RawTensor
    of dtype F16/BF16 carries its own.  float32 and float64 inputs are copied/rounded.

    Args:
        array: A float16 / bfloat16 / float32 / float64 array, ``uint16`` bits (with
            ``dtype``), or a :class:`aprfast.RawTensor` of dtype F16 or BF16.
        out: A float32 array to write the result into.
        threads: Most threads to use (0: the cores idle at the call).
        dtype: "f16" or "bf16": what ``uint16`` bits mean.

    Returns:
        A float32 array of ``array``'s shape (``out`` when given).

    Raises:
        LayoutError: Raw 16-bit values without ``dtype``, a ``dtype`` other than F16 or
            BF16 (or for values that are not 16-bit), a RawTensor of another dtype, or
            an unusable ``out``.

    Examples:
        >>> import numpy as np, aprfast
        >>> aprfast.to_float32(np.float16([0.5, -2.0]))
        array([ 0.5, -2. ], dtype=float32)
        >>> aprfast.to_float32(np.uint16([0x3F80, 0x4049]), dtype="bf16")
        array([1.      , 3.140625], dtype=float32)
    """
    if isinstance(array, RawTensor):
        if array.dtype is None or array.dtype.name not in ("F16", "BF16"):
            raise LayoutError(f"to_float32 widens F16 or BF16 tensors, not {array!r}")
        dtype = array.dtype.name if dtype is None else dtype
        array = array.data.view(_U16).reshape(array.shape)
    values = _little_endian(_c_order(np.asarray(array)))
    kind = _half_kind(values.dtype, dtype)
    result = _output(out, values.shape, (_F32,), _F32, "to_float32")
    flat = _flat(result)
    if kind == "F16":
        _half.f16_to_f32(_flat(values).view(_BITS), flat, threads=threads)
    elif kind == "BF16":
        _half.bf16_to_f32(_flat(values).view(_BITS), flat, threads=threads)
    else:
        with np.errstate(over="ignore"):  # float32 copied, float64 rounded once (inf on overflow)
            flat[...] = values.reshape(-1)
    return result


def empty_output(shape, dtype) -> np.ndarray:
    """An uninitialised C-ordered array for a result the caller fills completely: from
    the buffer cache from :data:`CACHED_OUTPUT_MIN` bytes on, else ``np.empty``."""
    dtype = np.dtype(dtype)
    if not isinstance(shape, tuple):  # np.empty also takes one int, or any sequence
        shape = tuple(shape) if np.iterable(shape) else (shape,)
    count = int(math.prod(shape))  # np.prod costs 6 us: most of a small call
    # The pure backend keeps no cache: its AlignedBuffer maps memory afresh each time.
    if count * dtype.itemsize < CACHED_OUTPUT_MIN or BACKEND == "python":
        return np.empty(shape, dtype)
    return np.frombuffer(_memory.AlignedBuffer(count * dtype.itemsize, 64), dtype, count).reshape(shape)


def _float_array(array, what: str) -> np.ndarray:
    values = _c_order(np.asarray(array))
    if values.dtype.kind == "f" or (_BF16 is not None and values.dtype == _BF16):
        return _little_endian(values)
    raise LayoutError(f"{what} converts floating-point arrays (float16, bfloat16, float32, float64), "
                      f"not {values.dtype}")


def _little_endian(values: np.ndarray) -> np.ndarray:
    """The kernels read little-endian bits (every platform aprfast builds for)."""
    order = values.dtype.byteorder
    if order == ">" or (order == "=" and not np.little_endian):
        return values.astype(values.dtype.newbyteorder("<"))
    return values


def _f32_round_to_odd(flat: np.ndarray) -> np.ndarray:
    """float64 values narrowed to float32 rounding to odd (toward zero, the last bit
    set where inexact).  Why: float32 keeps 16 more bits than bfloat16, so rounding
    that result to nearest even bfloat16 gives what one rounding of the float64 gives;
    rounding to nearest twice would not (a float64 just above a bfloat16 tie becomes
    the tie in float32)."""
    with np.errstate(over="ignore", invalid="ignore"):
        narrow = flat.astype(_F32)
        inexact = (narrow != flat) & (flat == flat)  # NaNs stay as NumPy narrows them
    if inexact.any():
        bits = narrow.view(np.uint32)
        got = bits[inexact]
        # rounded away from zero (up to infinity, too): one step back toward zero
        away = np.abs(narrow[inexact].astype(np.float64)) > np.abs(flat[inexact])
        bits[inexact] = (got - away.astype(np.uint32)) | 1
    return narrow


def _widened(values: np.ndarray, threads: int) -> np.ndarray:
    """float32 values (exactly widened from 16 bits, or as they are)."""
    if values.dtype == _F32:
        return values
    if values.dtype.itemsize == 2:
        return to_float32(values, threads=threads)
    with np.errstate(over="ignore"):  # overflow gives inf, as in the kernels
        return values.astype(_F32)


def _half_kind(dtype: np.dtype, declared) -> str | None:
    if declared is not None:
        name = by_name(declared).name
        if name not in ("F16", "BF16"):
            raise LayoutError(f"to_float32 widens F16 or BF16 bits, not {name}")
        if dtype.itemsize != 2:
            raise LayoutError(f"dtype={declared!r} describes 16-bit values, but the array holds {dtype}")
        return name
    if dtype == _F16 or (dtype.kind == "f" and dtype.itemsize == 2):
        return "F16"
    if _BF16 is not None and dtype == _BF16:
        return "BF16"
    if dtype.kind == "f":
        return None
    raise LayoutError(f"to_float32 cannot tell what {dtype} values are; pass dtype='f16' or dtype='bf16' "
                      "for raw 16-bit patterns")


def _output(out, shape, accepted, default, what: str) -> np.ndarray:
    if out is None:
        return empty_output(shape, default)
    if not isinstance(out, np.ndarray):
        raise LayoutError(f"{what}: out must be a NumPy array, not {type(out).__name__}")
    if out.dtype not in accepted:
        raise LayoutError(f"{what}: out has dtype {out.dtype}; expected {' or '.join(str(d) for d in accepted)}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise LayoutError(f"{what}: out must be C-contiguous and writable")
    size = int(math.prod(shape))
    if out.size != size:
        raise LayoutError(f"{what}: out holds {out.size} elements, the input {size}")
    return out if out.shape == tuple(shape) else out.reshape(shape)


def _flat(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1)


def _c_order(array: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns 0-d arrays into 1-d ones.
    return array if array.flags.c_contiguous else array.copy(order="C")
