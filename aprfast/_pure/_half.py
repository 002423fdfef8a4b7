"""float32 <-> float16 / bfloat16 conversion into caller-provided arrays, the pure twin
of ``aprfast._half``: the portable integer kernels of csrc/half.c, written as NumPy
operations on the bit patterns (never through the FPU, so no rounding mode,
flush-to-zero or NaN quieting can change a bit).

* f32 -> f16: round to nearest even, subnormals kept, overflow to +-inf; a NaN keeps
  its sign and the top 10 payload bits (a payload that would vanish becomes 1), as
  NumPy's ``astype(np.float16)``.
* f16 -> f32: exact; a NaN's payload moves up 13 bits.
* f32 -> bf16: round to nearest even; every NaN becomes 0x7fc0 with its sign
  (ml_dtypes).
* bf16 -> f32: the 16 bits become the top half of the float.

Halves travel as their ``uint16`` bit patterns.
"""

from __future__ import annotations

import numpy as np

from ._views import default_threads as _default_threads
from ._views import typed_view

PATHS = {"portable": 0, "auto": -1}

F32_INF = 0x7F800000
F32_ROUNDS_TO_F16_INF = 0x477FF000  # 65520 = max f16 + half an ulp
F32_MIN_F16_NORMAL = 0x38800000     # 2^-14
F32_HALF_MIN_F16_SUB = 0x33000000   # 2^-25: a tie, rounds to even 0
F16_REBIAS = 0x38000000             # (127 - 15) << 23


def f32_bits_to_f16_bits(x: np.ndarray) -> np.ndarray:
    """uint32 float32 patterns -> uint16 float16 patterns (csrc/half.c f32_to_f16_bits)."""
    x = x.astype(np.uint32, copy=False)
    sign = (x >> 16) & 0x8000
    a = x & 0x7FFFFFFF
    # normal range: rebias, then round the 13 dropped bits to nearest even
    rebiased = a - np.uint32(F16_REBIAS)
    normal = (rebiased + 0xFFF + ((rebiased >> 13) & 1)) >> 13
    # subnormal range: the 24-bit significand shifted to units of 2^-24, nearest even
    shift = np.clip(126 - (a >> 23).astype(np.int64), 1, 31).astype(np.uint32)
    m = (a & 0x7FFFFF) | 0x800000
    subnormal = (m + (np.uint32(1) << (shift - 1)) - 1 + ((m >> shift) & 1)) >> shift
    payload = (a >> 13) & 0x3FF
    nan = 0x7C00 | np.where(payload != 0, payload, 1)
    h = np.select([a > F32_INF, a >= F32_ROUNDS_TO_F16_INF, a >= F32_MIN_F16_NORMAL, a > F32_HALF_MIN_F16_SUB],
                  [nan, np.uint32(0x7C00), normal, subnormal], np.uint32(0))
    return (sign | h).astype(np.uint16)


def f16_bits_to_f32_bits(h: np.ndarray) -> np.ndarray:
    """uint16 float16 patterns -> uint32 float32 patterns, exactly."""
    h = h.astype(np.uint32)
    sign = (h & 0x8000) << 16
    a = h & 0x7FFF
    special = F32_INF | ((a & 0x3FF) << 13)  # inf, or NaN with its payload unchanged
    normal = (a << 13) + F16_REBIAS
    # a subnormal a * 2^-24 is a normal float32: scaling by a power of two is exact
    subnormal = (a.astype(np.float32) * np.float32(2.0 ** -24)).view(np.uint32)
    bits = np.select([a >= 0x7C00, a >= 0x0400], [special, normal], subnormal)
    return (sign | bits).astype(np.uint32)


def f32_bits_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """uint32 float32 patterns -> uint16 bfloat16 patterns (nearest even; NaN -> 0x7fc0 | sign)."""
    x = x.astype(np.uint32, copy=False)
    rounded = (x.astype(np.uint64) + 0x7FFF + ((x >> 16) & 1)) >> 16  # max finite rounds into inf
    quiet = ((x >> 16) & 0x8000) | 0x7FC0
    return np.where((x & 0x7FFFFFFF) > F32_INF, quiet, rounded).astype(np.uint16)


def bf16_bits_to_f32_bits(b: np.ndarray) -> np.ndarray:
    return b.astype(np.uint32) << 16


def _check_path(path) -> None:
    if path is None:
        return
    try:
        PATHS[path]
    except (KeyError, TypeError):
        raise ValueError(f"unknown conversion path {path!r}; known: {', '.join(PATHS)}") from None


def _prepare(name, src, out, src_dtype, out_dtype, path):
    """The checked views of one call (same checks, same order as the compiled glue)."""
    s = typed_view(src, src_dtype)
    o = typed_view(out, out_dtype, writable=True)
    _check_path(path)
    if s.shape[0] != o.shape[0]:
        raise ValueError(f"{name}: out holds {o.shape[0]} elements, src has {s.shape[0]}")
    if s.shape[0] and _overlap(s, o):
        # The C kernels write out while still reading src (threads at once), so any
        # overlap would corrupt results there: refused on both backends alike.
        raise ValueError(f"{name}: src and out overlap")
    return s, o


def _overlap(a: np.ndarray, b: np.ndarray) -> bool:
    sa, sb = a.__array_interface__["data"][0], b.__array_interface__["data"][0]
    return sa < sb + b.nbytes and sb < sa + a.nbytes


#: Elements converted at once: the bit twiddling makes a dozen temporaries of its input.
_STEP = 1 << 16


def _convert(kernel, s: np.ndarray, o: np.ndarray) -> None:
    for start in range(0, s.shape[0], _STEP):
        o[start:start + _STEP] = kernel(s[start:start + _STEP])


def f32_to_f16(src, out, *, threads=0, path=None) -> None:
    """Round float32 ``src`` to float16 bits in ``out`` (same length); as ``astype(np.float16)``."""
    s, o = _prepare("f32_to_f16", src, out, np.float32, np.uint16, path)
    _convert(f32_bits_to_f16_bits, s.view(np.uint32), o)


def f16_to_f32(src, out, *, threads=0, path=None) -> None:
    """Widen float16 bits ``src`` to float32 ``out`` (same length), exactly."""
    s, o = _prepare("f16_to_f32", src, out, np.uint16, np.float32, path)
    _convert(f16_bits_to_f32_bits, s, o.view(np.uint32))


def f32_to_bf16(src, out, *, threads=0, path=None) -> None:
    """Round float32 ``src`` to bfloat16 bits in ``out``; as ``astype(ml_dtypes.bfloat16)``."""
    s, o = _prepare("f32_to_bf16", src, out, np.float32, np.uint16, path)
    _convert(f32_bits_to_bf16_bits, s.view(np.uint32), o)


def bf16_to_f32(src, out, *, threads=0, path=None) -> None:
    """Widen bfloat16 bits ``src`` to float32 ``out`` (same length), exactly."""
    s, o = _prepare("bf16_to_f32", src, out, np.uint16, np.float32, path)
    _convert(bf16_bits_to_f32_bits, s, o.view(np.uint32))


def available_paths() -> list:
    """The one kernel here: ``portable`` (this module's)."""
    return ["portable"]


def best_path() -> str:
    return "portable"


def default_threads() -> int:
    """The most threads the compiled module uses for ``threads=0``: the online cores (fewer
    while other processes keep cores busy; one below 2 Mi elements)."""
    return _default_threads()
