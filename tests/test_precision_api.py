"""aprfast.to_float16 / to_bfloat16 / to_float32 give NumPy's and ml_dtypes' bits."""

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays
from ml_dtypes import bfloat16

import aprfast
from aprfast.errors import LayoutError
from aprfast.numerics import precision

# Every float32 bit pattern: NaN payloads, subnormals, +-0, +-inf, ties.
f32_bits = arrays(np.uint32, array_shapes(min_dims=0, max_dims=3, max_side=9)).map(lambda a: a.view(np.float32))
u16_bits = arrays(np.uint16, array_shapes(min_dims=0, max_dims=3, max_side=9))


def bits16(a):
    return np.asarray(a).view(np.uint16)


@given(x=f32_bits)
def test_to_float16_is_numpy_astype(x):
    with np.errstate(all="ignore"):
        want = x.astype(np.float16)
    got = aprfast.to_float16(x)
    assert got.dtype == np.float16 and got.shape == x.shape
    assert np.array_equal(bits16(got), bits16(want))


@given(x=f32_bits)
def test_to_bfloat16_is_ml_dtypes_astype(x):
    got = aprfast.to_bfloat16(x)
    with np.errstate(all="ignore"):  # ml_dtypes warns on some NaN casts
        want = x.astype(bfloat16)
    assert got.dtype == np.dtype(bfloat16) and got.shape == x.shape
    assert np.array_equal(bits16(got), bits16(want))


@given(bits=u16_bits)
def test_to_float32_widens_exactly(bits):
    halves = bits.view(np.float16)
    got = aprfast.to_float32(halves)
    with np.errstate(all="ignore"):  # the oracles may warn on NaN casts
        want_f16, want_bf16 = halves.astype(np.float32), bits.view(bfloat16).astype(np.float32)
    assert got.dtype == np.float32 and got.shape == bits.shape
    assert np.array_equal(got.view(np.uint32), want_f16.view(np.uint32))
    assert np.array_equal(aprfast.to_float32(bits.view(bfloat16)).view(np.uint32), want_bf16.view(np.uint32))
    assert np.array_equal(aprfast.to_float32(bits, dtype="bf16").view(np.uint32), want_bf16.view(np.uint32))
    assert np.array_equal(aprfast.to_float32(bits, dtype="F16").view(np.uint32), want_f16.view(np.uint32))


def test_float64_inputs_convert_as_numpy_and_ml_dtypes_do():
    # 1 + 2**-11 + 2**-40 rounds up to f16 directly, but to 1.0 through float32.
    x = np.array([1 + 2**-11 + 2**-40, 1 + 2**-8 + 2**-30, -3.25, 1e300], np.float64)
    with np.errstate(over="ignore"):  # the oracles warn on overflow; aprfast doesn't
        assert np.array_equal(bits16(aprfast.to_float16(x)), bits16(x.astype(np.float16)))
        assert np.array_equal(bits16(aprfast.to_bfloat16(x)), bits16(x.astype(bfloat16)))
        assert np.array_equal(aprfast.to_float32(x), x.astype(np.float32))
    assert np.isinf(aprfast.to_float32(x)[3]) and np.isinf(aprfast.to_float16(x)[3])


def _double_bits(n):
    return arrays(np.uint64, n, elements=st.integers(0, 2**52 - 1))


@given(mant=_double_bits(40), exp=arrays(np.uint64, 40, elements=st.integers(1023 - 126, 1023 + 126)),
       sign=arrays(np.uint64, 40, elements=st.integers(0, 1)))
@example(mant=np.full(40, (1 << 45) + (1 << 44) + 1, np.uint64), exp=np.full(40, 1023, np.uint64),
         sign=np.zeros(40, np.uint64))  # just above a bfloat16 tie: a tie in float32
@example(mant=np.full(40, 1 << 44, np.uint64), exp=np.full(40, 1023, np.uint64),
         sign=np.ones(40, np.uint64))  # an exact tie: to even
def test_float64_to_bfloat16_rounds_once(mant, exp, sign):
    # The oracle: round-to-nearest-even on the float64 bits themselves (45 bits below
    # bfloat16's 7 stored ones), valid where the result is a normal float32 exponent.
    bits = (sign << np.uint64(63)) | (exp << np.uint64(52)) | mant
    x = bits.view(np.float64)
    lsb = (bits >> np.uint64(45)) & np.uint64(1)
    rounded = ((bits + np.uint64((1 << 44) - 1) + lsb) >> np.uint64(45)) << np.uint64(45)
    want = (rounded.view(np.float64).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    assert np.array_equal(bits16(precision._f32_round_to_odd(x).astype(bfloat16)), want)
    got = bits16(aprfast.to_bfloat16(x))
    if precision._BF16_F64_ONCE:  # ml_dtypes 0.7 rounds once: so does aprfast
        assert np.array_equal(got, want)
    else:  # earlier ml_dtypes round through float32: aprfast gives their bits
        assert np.array_equal(got, bits16(x.astype(np.float32).astype(bfloat16)))
    # gguf-py narrows to float32 first, whatever ml_dtypes does
    assert np.array_equal(bits16(aprfast.to_bfloat16(x, ggml=True)), bits16(x.astype(np.float32).astype(bfloat16)))


def test_float64_round_to_odd_keeps_infinities_nans_and_the_tiniest():
    x = np.array([np.inf, -np.inf, np.nan, 1e300, -1e300, 1e-320, -1e-320, 0.0, -0.0], np.float64)
    got = precision._f32_round_to_odd(x)
    assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2])
    # beyond float32: the largest finite float32 with its last bit set, which bfloat16
    # rounding takes to infinity as one rounding of the float64 would
    assert got[3] == np.finfo(np.float32).max and got[4] == -np.finfo(np.float32).max
    assert bits16(got[3:5].astype(bfloat16)).tolist() == [0x7F80, 0xFF80]
    # below float32's subnormals: the smallest subnormal of the sign, then bfloat16 0
    assert got[5:7].view(np.uint32).tolist() == [1, 0x80000001]
    assert bits16(got[5:7].astype(bfloat16)).tolist() == [0x0000, 0x8000]
    assert got[7:].view(np.uint32).tolist() == [0, 0x80000000]


def test_half_inputs_convert_between_each_other():
    x = (np.random.default_rng(1).standard_normal(100) * 100).astype(np.float32)
    h, b = x.astype(np.float16), x.astype(bfloat16)
    assert np.array_equal(bits16(aprfast.to_float16(h)), bits16(h))
    assert np.array_equal(bits16(aprfast.to_bfloat16(b)), bits16(b))
    assert np.array_equal(bits16(aprfast.to_float16(b)), bits16(b.astype(np.float32).astype(np.float16)))
    assert np.array_equal(bits16(aprfast.to_bfloat16(h)), bits16(h.astype(np.float32).astype(bfloat16)))
    assert np.array_equal(aprfast.to_float32(x), x) and not np.shares_memory(aprfast.to_float32(x), x)


def test_non_contiguous_and_big_endian_inputs():
    x = (np.random.default_rng(2).standard_normal((6, 8)) * 10).astype(np.float32)
    assert np.array_equal(aprfast.to_float16(x.T), x.T.astype(np.float16))
    assert np.array_equal(aprfast.to_float16(x[:, ::3]), x[:, ::3].astype(np.float16))
    assert np.array_equal(aprfast.to_float16(x.astype(">f4")), x.astype(np.float16))
    assert np.array_equal(aprfast.to_float32(x.astype(">f2")), x.astype(np.float16).astype(np.float32))
    assert np.array_equal(aprfast.to_float32(x.astype(np.float16).T), x.T.astype(np.float16).astype(np.float32))


def test_large_arrays_over_threads_give_the_same_bits():
    x = (np.random.default_rng(3).standard_normal(300_000) * 1e3).astype(np.float32)
    for threads in (1, 2, 0):
        assert np.array_equal(aprfast.to_float16(x, threads=threads), x.astype(np.float16))
        assert np.array_equal(bits16(aprfast.to_bfloat16(x, threads=threads)), bits16(x.astype(bfloat16)))
        assert np.array_equal(aprfast.to_float32(x.astype(np.float16), threads=threads),
                              x.astype(np.float16).astype(np.float32))


def test_out_is_filled_and_returned():
    x = np.linspace(-5, 5, 24, dtype=np.float32).reshape(4, 6)
    out = np.empty((4, 6), np.float16)
    assert aprfast.to_float16(x, out) is out and np.array_equal(out, x.astype(np.float16))
    bits = np.empty(24, np.uint16)  # raw bits, any shape with the right count
    got = aprfast.to_bfloat16(x, out=bits)
    assert got.shape == (4, 6) and np.shares_memory(got, bits)
    assert np.array_equal(bits, bits16(x.astype(bfloat16)).reshape(-1))
    wide = np.empty(24, np.float32)
    got = aprfast.to_float32(out, out=wide)
    assert got.shape == (4, 6) and np.shares_memory(got, wide) and np.array_equal(got, x.astype(np.float16))


@pytest.mark.parametrize("func, bad", [
    (aprfast.to_float16, np.empty(24, np.float32)),
    (aprfast.to_float16, np.empty(23, np.float16)),
    (aprfast.to_float16, np.empty((6, 8), np.float16)[:, ::2]),
    (aprfast.to_bfloat16, np.empty(24, np.float16)),
    (aprfast.to_float32, np.empty(24, np.float64)),
    (aprfast.to_float32, [0.0] * 24),
])
def test_unusable_out_is_refused(func, bad):
    x = np.ones((4, 6), np.float16 if func is aprfast.to_float32 else np.float32)
    with pytest.raises(LayoutError, match="out"):
        func(x, bad)


def test_read_only_out_is_refused():
    out = np.empty(3, np.float16)
    out.flags.writeable = False
    with pytest.raises(LayoutError, match="writable"):
        aprfast.to_float16(np.ones(3, np.float32), out)


def test_inputs_that_are_not_floats_are_refused():
    for func in (aprfast.to_float16, aprfast.to_bfloat16):
        with pytest.raises(LayoutError, match="floating-point"):
            func(np.arange(4))
    with pytest.raises(LayoutError, match="dtype='bf16'"):
        aprfast.to_float32(np.zeros(4, np.uint16))  # raw bits: f16 or bf16?
    with pytest.raises(LayoutError, match="16-bit"):
        aprfast.to_float32(np.zeros(4, np.float32), dtype="bf16")
    with pytest.raises(LayoutError, match="F16 or BF16"):
        aprfast.to_float32(np.zeros(4, np.uint16), dtype="i16")


def test_raw_bf16_tensors_widen_with_their_own_dtype():
    """BF16 tensors read without ml_dtypes are uint16 bits; a RawTensor says what they are."""
    values = np.array([[1.5, -2.0], [np.inf, 0.1]], np.float32)
    raw = aprfast.RawTensor("BF16", (2, 2), bits16(values.astype(bfloat16)))
    assert np.array_equal(aprfast.to_float32(raw), values.astype(bfloat16).astype(np.float32))
    with pytest.raises(LayoutError):
        aprfast.to_float32(aprfast.RawTensor("F32", (1,), bytes(4)))


def test_bf16_without_ml_dtypes_returns_uint16_bits(monkeypatch):
    monkeypatch.setattr(precision, "_BF16", None)
    x = np.array([1.0, -0.5, 3.14159], np.float32)
    got = aprfast.to_bfloat16(x)
    assert got.dtype == np.uint16 and np.array_equal(got, bits16(x.astype(bfloat16)))


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1, 1, 1)])
def test_shapes_are_kept(shape):
    x = np.full(shape, 0.3, np.float32)
    assert aprfast.to_float16(x).shape == shape
    assert aprfast.to_bfloat16(x).shape == shape
    assert aprfast.to_float32(aprfast.to_float16(x)).shape == shape


def _every_f32_class(n, seed):
    """n float32 values mixing normals, subnormals, +-0, +-inf and NaNs with payloads."""
    bits = np.random.default_rng(seed).integers(0, 1 << 32, n, dtype=np.uint32)
    bits[::7] &= 0x807fffff  # zero exponent: subnormals and zeros
    bits[1::11] |= 0x7f800000  # all-ones exponent: infinities and NaNs of every payload
    return bits.view(np.float32)


@pytest.mark.parametrize("threads", [1, 0])
def test_results_in_reused_cached_memory_are_exact(monkeypatch, threads):
    # Outputs from CACHED_OUTPUT_MIN on come from the buffer cache, whose blocks hold
    # whatever the last user left: every byte of a result must still be written.
    monkeypatch.setattr(precision, "CACHED_OUTPUT_MIN", 1 << 18)
    x = _every_f32_class(300_001, 4)
    with np.errstate(all="ignore"):
        want16, wantb = x.astype(np.float16), x.astype(bfloat16)
    for _ in range(3):
        for dtype in (np.float32, np.float16, np.uint16):  # leave garbage behind in the cache
            precision.empty_output(x.shape, dtype).view(np.uint8)[...] = 0xA5
        h = aprfast.to_float16(x, threads=threads)
        b = aprfast.to_bfloat16(x, threads=threads)
        assert h.flags.c_contiguous and h.flags.writeable and h.shape == x.shape
        assert np.array_equal(bits16(h), bits16(want16)) and np.array_equal(bits16(b), bits16(wantb))
        wide = aprfast.to_float32(h, threads=threads)
        assert wide.dtype == np.float32 and wide.flags.writeable
        assert np.array_equal(wide.view(np.uint32), want16.astype(np.float32).view(np.uint32))
        assert np.array_equal(aprfast.to_float32(b, threads=threads).view(np.uint32),
                              wantb.astype(np.float32).view(np.uint32))
        del h, b, wide


def test_large_results_come_from_the_buffer_cache():
    # At 32 MiB NumPy (glibc) maps fresh pages per call; aprfast reuses freed ones.
    n = precision.CACHED_OUTPUT_MIN // 4
    src = np.random.default_rng(5).standard_normal(n, dtype=np.float32).astype(np.float16)
    want = src.astype(np.float32)
    first = aprfast.to_float32(src)
    assert np.array_equal(first, want) and first.shape == (n,) and first.flags.writeable
    address = first.ctypes.data
    del first
    before = aprfast._memory.buffer_cache_stats()
    again = aprfast.to_float32(src.reshape(8, -1))
    assert again.shape == (8, n // 8) and np.array_equal(again.reshape(-1), want)
    if aprfast.backend == "c":
        assert aprfast._memory.buffer_cache_stats()["hits"] == before["hits"] + 1
        assert again.ctypes.data == address and again.ctypes.data % 64 == 0
    small = aprfast.to_float32(src[:1000])
    assert small.base is None  # np.empty: glibc already reuses memory below 32 MiB


def test_float64_to_float16_rounds_once_into_out():
    x = np.array([1 + 2**-11 + 2**-40, 7e4, -7e4, np.nan, 2**-25, -(2**-24) * 1.5], np.float64)
    out = np.zeros(6, np.uint16)
    with np.errstate(all="ignore"):
        want = bits16(x.astype(np.float16))
    assert aprfast.to_float16(x, out) is out and np.array_equal(out, want)
