"""aprfast.quantize / dequantize / quantize_tensors / register_quantizer.

Oracles: gguf-py's NumPy quantizers (gguf.quants) for the GGML types, bit for bit; for
aprender's APR_Q8/APR_Q4 the NumPy transcription of apr-format's add_q8/add_q4_tensor
below (APRENDER-COMPAT §3.1); for Q8_TENSOR the transcription of docs/FORMAT.md's rule.
"""

import logging
import math
import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants as gq
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from ml_dtypes import bfloat16

import aprfast
from aprfast.dtypes import DTYPES
from aprfast.errors import CorruptError, LayoutError, UnknownDTypeError
from aprfast.numerics import quantization as Q

GGML = {"Q8_0": GT.Q8_0, "Q4_0": GT.Q4_0, "Q4_1": GT.Q4_1, "Q5_0": GT.Q5_0, "Q5_1": GT.Q5_1,
        "Q4_K": GT.Q4_K, "Q6_K": GT.Q6_K}
GGML_QUANTIZABLE = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
DEQUANT_ONLY = ["IQ3_XXS", "IQ2_XS", "NVFP4", "Q8_1"]
APR_TYPES = ["APR_Q8", "APR_Q4", "Q8_TENSOR"]


# --- oracles ----------------------------------------------------------------------------
def rust_round(x):
    """f32::round: half away from zero (gguf's np_roundf is exact in float32)."""
    x = np.asarray(x, np.float32)
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(x), x, gq.np_roundf(x)).astype(np.float32)


def rust_as_i8(x, lo, hi):
    """``x.round().clamp(lo, hi) as i8`` with NaN -> 0."""
    with np.errstate(invalid="ignore"):
        q = np.clip(rust_round(x), lo, hi)
    return np.where(np.isnan(q), 0, q).astype(np.int8)


def max_abs_skip_nan(x):
    a = np.abs(x)
    a = a[~np.isnan(a)]
    return np.float32(a.max()) if a.size else np.float32(0)


def ref_apr_q8(x):
    x = x.reshape(-1).astype(np.float32)
    if x.size == 0:
        return b""
    amax = max_abs_skip_nan(x)
    scale = np.float32(1) if amax == 0 else np.float32(amax / np.float32(127))
    with np.errstate(all="ignore"):
        q = rust_as_i8(x / scale, -127, 127)
    return struct.pack("<f", scale) + q.tobytes()


def ref_apr_q4(x):
    x = x.reshape(-1).astype(np.float32)
    out = bytearray()
    for start in range(0, x.size, 32):
        block = x[start:start + 32]
        amax = max_abs_skip_nan(block)
        scale = np.float32(1) if amax == 0 else np.float32(amax / np.float32(7))
        with np.errstate(all="ignore"):
            nib = np.zeros(32, np.uint8)
            nib[:block.size] = (rust_as_i8(block / scale, -8, 7).astype(np.int16) + 8).astype(np.uint8)
            half = np.float16(scale)  # may overflow to inf, as half::f16::from_f32 does
        out += half.tobytes() + (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8).tobytes()
    return bytes(out)


def ref_q8_tensor(x):
    x = x.reshape(-1).astype(np.float32)
    finite = x[np.isfinite(x)]
    lo = np.float32(min(0.0, finite.min())) if finite.size else np.float32(0)
    hi = np.float32(max(0.0, finite.max())) if finite.size else np.float32(0)
    with np.errstate(all="ignore"):  # f32 arithmetic as in Rust: hi - lo may overflow to inf
        scale = np.float32(1) if hi == lo else np.float32((hi - lo) / np.float32(255))
        if np.isinf(scale):  # the layout's rule when the f32 range overflows
            scale = np.float32(hi / np.float32(255)) - np.float32(lo / np.float32(255))
        elif scale == 0:  # ... and when the division underflows
            scale = np.frombuffer(np.uint32(1).tobytes(), np.float32)[0]
        zp = np.clip(rust_round(np.float32(-128) - lo / scale), -128, 127)
        q = np.clip(rust_round(x / scale) + zp, -128, 127)
        q = np.where(np.isnan(q), zp, q)
    return struct.pack("<fi", scale, int(zp)) + q.astype(np.int8).tobytes()


def ref_dequant_apr(type_name, raw, n):
    raw = np.frombuffer(raw, np.uint8)
    if type_name == "APR_Q8":
        scale = np.frombuffer(raw[:4].tobytes(), "<f4")[0]
        return raw[4:].view(np.int8).astype(np.float32) * scale
    if type_name == "Q8_TENSOR":
        scale = np.frombuffer(raw[:4].tobytes(), "<f4")[0]
        zp = np.frombuffer(raw[4:8].tobytes(), "<i4")[0]
        return (raw[8:].view(np.int8).astype(np.int64) - zp).astype(np.float32) * scale
    blocks = raw.reshape(-1, 18)
    bits = blocks[:, :2].copy().view("<u2")[:, 0]
    exponent = (bits >> 10) & 0x1F
    scale = np.where((exponent == 0) | (exponent == 0x1F), 0, bits.view(np.float16).astype(np.float32))
    nib = np.stack([blocks[:, 2:] & 0x0F, blocks[:, 2:] >> 4], axis=-1).reshape(-1, 32)
    return ((nib.astype(np.float32) - 8) * scale[:, None].astype(np.float32)).reshape(-1)[:n]


def oracle_bytes(type_name, x):
    if type_name in GGML:
        with np.errstate(all="ignore"):  # gguf-py casts inf/NaN scales to f16 as they are
            return gq.quantize(x.astype(np.float32), GGML[type_name]).tobytes()
    return {"APR_Q8": ref_apr_q8, "APR_Q4": ref_apr_q4, "Q8_TENSOR": ref_q8_tensor}[type_name](x)


def oracle_values(qt):
    name = qt.dtype.name
    with np.errstate(all="ignore"):
        if name in GGML:
            d = DTYPES[name]
            return gq.dequantize(qt.data.reshape(-1, d.block_bytes), GGML[name]).reshape(-1)
        return ref_dequant_apr(name, qt.data, int(np.prod(qt.shape)))


def random_values(shape, seed=0, scale=3.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def random_blocks(type_name, shape, seed=0):
    """Random packed bytes whose f16 scales are finite and modest (so values are too)."""
    d = DTYPES[type_name]
    raw = np.random.default_rng(seed).integers(0, 256, d.nbytes(shape), np.uint8)
    if type_name in GGML:
        blocks = raw.reshape(-1, d.block_bytes)
        scale = np.float16(0.01)
        offsets = {"Q6_K": [208]}.get(type_name, [0, 2] if type_name in ("Q4_1", "Q5_1", "Q4_K") else [0])
        for off in offsets:
            blocks[:, off:off + 2] = np.frombuffer(scale.tobytes(), np.uint8)
    return aprfast.QuantizedTensor(type_name, shape, raw)


def same_floats(a, b):
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=True)


row_shapes = st.tuples(st.integers(1, 4), st.integers(1, 4)).map(lambda s: (s[0], 32 * s[1]))


# --- quantize matches the oracles --------------------------------------------------------
@pytest.mark.parametrize("type_name", GGML_QUANTIZABLE + APR_TYPES)
@settings(max_examples=30)
@given(shape=row_shapes, seed=st.integers(0, 2**32 - 1), scale=st.sampled_from([1e-3, 1.0, 300.0]))
def test_quantize_matches_oracle_bytes(type_name, shape, seed, scale):
    x = random_values(shape, seed, scale)
    qt = aprfast.quantize(x, type_name.lower())
    assert type(qt) is aprfast.QuantizedTensor
    assert qt.dtype is DTYPES[type_name] and qt.shape == shape
    assert bytes(qt.data) == oracle_bytes(type_name, x)


@pytest.mark.parametrize("type_name", GGML_QUANTIZABLE + APR_TYPES)
@settings(max_examples=30)
@given(data=st.data())
def test_quantize_any_float32_values_matches_oracle(type_name, data):
    """Any non-NaN float32: subnormals, +-0, +-inf, huge values whose scales overflow f16.
    (NaN is below: which NaN bits gguf-py stores depends on NumPy's SIMD reductions.)"""
    rows = data.draw(st.integers(1, 3))
    x = data.draw(arrays(np.float32, (rows, 32), elements=st.floats(width=32, allow_nan=False)))
    if type_name in ("Q4_1", "Q5_1"):
        # When a block's min or max is zero and both +0.0 and -0.0 occur, gguf-py stores
        # whichever zero NumPy's reduction picks; aprfast keeps the first (llama.cpp's
        # choice).  Make the zeros agree so the comparison is about everything else.
        x = np.where(x == 0, np.float32(0.0), x)
    assert bytes(aprfast.quantize(x, type_name).data) == oracle_bytes(type_name, x)


@pytest.mark.parametrize("position", [0, 5, 17, 31])
def test_nan_inputs(position):
    """A GGML block holding a NaN decodes to NaN throughout (its scale is NaN); the APR
    types skip NaN when scaling and store it as a value that reads back as 0.0."""
    x = random_values((2, 32), 8)
    x[1, position] = np.nan
    for type_name in GGML_QUANTIZABLE:
        back = aprfast.dequantize(aprfast.quantize(x, type_name))
        assert np.isnan(back[1]).all() and not np.isnan(back[0]).any()
    for type_name in APR_TYPES:
        qt = aprfast.quantize(x, type_name)
        assert bytes(qt.data) == oracle_bytes(type_name, x)
        back = aprfast.dequantize(qt)
        assert back[1, position] == 0 and not np.isnan(back).any()


@pytest.mark.parametrize("type_name", APR_TYPES)
@given(n=st.integers(0, 200), seed=st.integers(0, 1000))
def test_per_tensor_and_apr_q4_types_take_any_shape(type_name, n, seed):
    x = random_values((n,), seed)
    qt = aprfast.quantize(x, type_name)
    assert qt.nbytes == DTYPES[type_name].nbytes((n,))
    assert bytes(qt.data) == (oracle_bytes(type_name, x) if n else b"")


@pytest.mark.parametrize("type_name", GGML_QUANTIZABLE)
def test_quantize_converts_half_bf16_and_f64_inputs_to_f32_first(type_name):
    x = random_values((3, 64), 5)
    for dtype in (np.float16, bfloat16, np.float64, np.dtype(">f4")):
        values = x.astype(dtype)
        assert bytes(aprfast.quantize(values, type_name).data) == oracle_bytes(type_name, values.astype(np.float32))


def test_quantize_reads_non_contiguous_inputs():
    x = random_values((64, 6), 1)
    assert aprfast.quantize(x.T, "q8_0") == aprfast.quantize(np.ascontiguousarray(x.T), "q8_0")
    assert aprfast.quantize(x[::2].T, "q4_1") == aprfast.quantize(x[::2].T.copy(), "q4_1")


def test_type_names_are_case_insensitive():
    x = random_values((2, 32))
    want = aprfast.quantize(x, "Q4_0")
    assert aprfast.quantize(x, "q4_0") == want
    assert aprfast.quantize(x, Q.quant_type("q4_0")) == want
    assert aprfast.quantize(x, "aprq8") == aprfast.quantize(x, "APR_Q8")


def test_threads_do_not_change_the_result():
    x = random_values((256, 512), 9)
    for type_name in GGML_QUANTIZABLE + APR_TYPES:
        one = aprfast.quantize(x, type_name, threads=1)
        assert one == aprfast.quantize(x, type_name, threads=4) == aprfast.quantize(x, type_name)
        assert np.array_equal(aprfast.dequantize(one, threads=1), aprfast.dequantize(one, threads=3))


# --- dequantize matches the oracles ------------------------------------------------------
@pytest.mark.parametrize("type_name", list(GGML) + APR_TYPES)
@settings(max_examples=20)
@given(rows=st.integers(1, 3), blocks=st.integers(1, 3), seed=st.integers(0, 2**32 - 1))
def test_dequantize_matches_oracle(type_name, rows, blocks, seed):
    d = DTYPES[type_name]
    shape = (rows, blocks * (d.block_elems if d.blocks_per_row else 32))
    raw = np.random.default_rng(seed).integers(0, 256, d.nbytes(shape), np.uint8)  # NaN/inf scales too
    qt = aprfast.QuantizedTensor(type_name, shape, raw)
    got = aprfast.dequantize(qt)
    assert got.dtype == np.float32 and got.shape == shape
    assert same_floats(got.reshape(-1), oracle_values(qt))


@pytest.mark.parametrize("type_name", GGML_QUANTIZABLE + APR_TYPES)
def test_round_trip_error_is_bounded_by_the_step(type_name):
    x = random_values((8, 64), 3)
    back = aprfast.dequantize(aprfast.quantize(x, type_name))
    step = {"Q8_0": 2 / 127, "Q4_0": 2 / 8, "Q4_1": 2 / 15, "Q5_0": 2 / 16, "Q5_1": 2 / 31, "APR_Q8": 1 / 127,
            "APR_Q4": 1 / 7, "Q8_TENSOR": 4 / 255}[type_name]
    assert np.max(np.abs(back - x)) <= step * np.max(np.abs(x)) * 1.01


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "Q8_0"])
def test_dequantize_rows_padded_to_whole_blocks(type_name):
    """aprender pads K-quant rows to 256 (GH-202): each row decodes to its first n values."""
    d = DTYPES[type_name]
    row = d.block_elems + d.block_elems // 2 + 3
    qt = random_blocks(type_name, (3, row), seed=4)
    padded = aprfast.QuantizedTensor(type_name, (3, 2 * d.block_elems), qt.data)
    assert same_floats(aprfast.dequantize(qt), aprfast.dequantize(padded)[:, :row])



@pytest.mark.parametrize("type_name", ["Q4_0", "Q8_0", "Q4_K", "APR_Q4"])
def test_dequantize_into_reused_cached_memory_matches_oracle(monkeypatch, type_name):
    """Large results come from the buffer cache, whose blocks hold old bytes: every float
    must still be written (the padded-row path's temporary comes from there too)."""
    from aprfast.numerics import precision
    monkeypatch.setattr(precision, "CACHED_OUTPUT_MIN", 1 << 18)
    d = DTYPES[type_name]
    shape = (64, 2048) if d.blocks_per_row else (64, 2048 + 5)  # 512 KiB of floats: cached
    qt = aprfast.QuantizedTensor(type_name, shape, np.random.default_rng(6).integers(
        0, 256, d.nbytes(shape), np.uint8))  # NaN/inf scales too
    want = oracle_values(qt).reshape(shape)
    for threads in (1, 0, 1):
        precision.empty_output(shape, np.float32)[...] = np.float32(1234.5)  # garbage left in the cache
        got = aprfast.dequantize(qt, threads=threads)
        assert got.dtype == np.float32 and got.flags.c_contiguous and got.flags.writeable
        assert same_floats(got, want)
    if d.blocks_per_row and d.packed:
        row = shape[1] - d.block_elems // 2 - 3  # rows padded to whole blocks
        padded = aprfast.QuantizedTensor(type_name, (64, row), qt.data)
        precision.empty_output(shape, np.float32)[...] = np.float32(-1.0)
        assert same_floats(aprfast.dequantize(padded), want[:, :row])

def test_dequantize_apr_q4_partial_last_block_and_unsafe_scales():
    x = random_values((3, 11), 2)  # 33 values: one full block, one of a single value
    qt = aprfast.quantize(x, "apr_q4")
    assert qt.nbytes == 36 and same_floats(aprfast.dequantize(qt).reshape(-1), oracle_values(qt))
    raw = bytearray(qt.data)
    raw[0:2] = np.float16(np.inf).tobytes()  # GH-186: a non-finite (or subnormal) scale reads as 0
    raw[18:20] = np.float16(1e-7).tobytes()
    assert not aprfast.dequantize(aprfast.QuantizedTensor("APR_Q4", (3, 11), bytes(raw))).any()


# --- shapes, empties and errors ----------------------------------------------------------
@pytest.mark.parametrize("type_name", GGML_QUANTIZABLE)
def test_ggml_rows_must_be_whole_blocks(type_name):
    with pytest.raises(LayoutError, match=r"\[3, 33\].*multiple of 32"):
        aprfast.quantize(random_values((3, 33)), type_name)
    with pytest.raises(LayoutError, match=r"tensor 'w'.*\[\]"):
        aprfast.quantize(np.float32(1.0), type_name, name="w")
    assert aprfast.quantize(random_values((33, 32)), type_name).shape == (33, 32)  # rows count freely


@pytest.mark.parametrize("type_name", GGML_QUANTIZABLE + APR_TYPES)
@pytest.mark.parametrize("shape", [(0,), (0, 32), (4, 0), (2, 0, 64)])
def test_empty_tensors_quantize_to_no_bytes(type_name, shape):
    qt = aprfast.quantize(np.zeros(shape, np.float32), type_name)
    assert qt.shape == shape and qt.nbytes == 0
    back = aprfast.dequantize(qt)
    assert back.shape == shape and back.dtype == np.float32


@pytest.mark.parametrize("type_name", APR_TYPES)
def test_zero_d_tensors_quantize_with_per_tensor_types(type_name):
    qt = aprfast.quantize(np.float32(-2.5), type_name)
    assert qt.shape == () and aprfast.dequantize(qt).shape == ()
    assert abs(float(aprfast.dequantize(qt)) + 2.5) < 0.05


@pytest.mark.parametrize("name", ["q3_x", "f16", "BF16", "", "i8"])
def test_unknown_type_names_list_the_known_ones(name):
    with pytest.raises(UnknownDTypeError, match="Q8_0.*Q4_0.*Q4_1.*Q8_TENSOR") as info:
        aprfast.quantize(random_values((1, 32)), name)
    assert info.value.code == "E001"


@pytest.mark.parametrize("type_name", DEQUANT_ONLY)
def test_dequantize_only_types_refuse_to_quantize(type_name):
    with pytest.raises(LayoutError, match=f"no {type_name} quantizer.*Q8_0"):
        aprfast.quantize(random_values((1, 256)), type_name)
    assert type_name not in Q.quant_types(quantizable=True) and type_name in Q.quant_types()


def test_non_float_and_packed_inputs_are_refused():
    with pytest.raises(LayoutError, match="floating-point"):
        aprfast.quantize(np.arange(32, dtype=np.int32), "q8_0")
    with pytest.raises(LayoutError, match="already packed"):
        aprfast.quantize(aprfast.quantize(random_values((1, 32)), "q8_0"), "q4_0")
    with pytest.raises(LayoutError, match="QuantizedTensor"):
        aprfast.dequantize(random_values((1, 32)))
    with pytest.raises(LayoutError, match="QuantizedTensor"):
        aprfast.dequantize(aprfast.RawTensor("F32", (2,), bytes(8)))


def test_dequantize_refuses_a_packed_size_that_contradicts_the_shape():
    qt = aprfast.quantize(random_values((2, 32)), "q4_0")
    object.__setattr__(qt, "data", qt.data[:-1])  # what a lying producer could hand over
    with pytest.raises(CorruptError, match=r"Q4_0 tensor of shape \[2, 32\] needs 36 bytes, found 35") as info:
        aprfast.dequantize(qt)
    assert info.value.code == "E002"


def test_dequantize_into_out():
    qt = aprfast.quantize(random_values((4, 64), 7), "q8_0")
    want = aprfast.dequantize(qt)
    out = np.full((4, 64), np.nan, np.float32)
    assert aprfast.dequantize(qt, out) is out and np.array_equal(out, want)
    flat = np.empty(256, np.float32)
    got = aprfast.dequantize(qt, out=flat)
    assert got.shape == (4, 64) and np.shares_memory(got, flat) and np.array_equal(flat, want.reshape(-1))


@pytest.mark.parametrize("bad", [np.empty(256, np.float64), np.empty(255, np.float32),
                                 np.empty((64, 8), np.float32)[:, ::2], np.empty(256, ">f4"), [0.0] * 256])
def test_dequantize_refuses_unusable_out(bad):
    qt = aprfast.quantize(random_values((4, 64)), "q4_0")
    with pytest.raises(LayoutError, match="out"):
        aprfast.dequantize(qt, bad)


def test_read_only_out_is_refused():
    out = np.empty(64, np.float32)
    out.flags.writeable = False
    with pytest.raises(LayoutError, match="writable"):
        aprfast.dequantize(aprfast.quantize(random_values((2, 32)), "q8_0"), out)


def test_registry_describes_every_type():
    bpw = {"Q8_0": 8.5, "Q4_0": 4.5, "Q4_1": 5.0, "Q5_0": 5.5, "Q5_1": 6.0, "Q4_K": 4.5, "Q6_K": 6.5625,
           "APR_Q4": 4.5, "APR_Q8": 8.0, "Q8_TENSOR": 8.0, "Q8_K": 9.125}
    assert set(bpw) <= set(Q.quant_types())
    for name, bits in bpw.items():
        kind = Q.quant_type(name)
        assert kind.name == name and kind.bits_per_weight == bits and kind.dtype is DTYPES[name]
        assert (kind.block_elems, kind.block_bytes) == (DTYPES[name].block_elems, DTYPES[name].block_bytes)
    assert Q.quant_type("q8_tensor").block_size is None and Q.quant_type("q4_k").block_size == 256


# --- quantize_tensors and its report -----------------------------------------------------
def model():
    return {
        "tok_embeddings.weight": random_values((16, 64), 1),
        "layers.0.attention.wq.weight": random_values((64, 64), 2),
        "layers.0.attention_norm.weight": random_values((64,), 3),
        "layers.0.ffn.w1.weight": random_values((96, 64), 4).astype(np.float16),
        "layers.0.ffn.bias": random_values((96,), 5).astype(bfloat16),
        "output.weight": random_values((16, 64), 6).astype(np.float64),
        "odd.weight": random_values((4, 40), 7),
        "tiny": random_values((8,), 8),
        "scalar": np.float32(2.0),
        "token_ids": np.arange(64, dtype=np.int64),
        "packed": random_blocks("Q4_K", (1, 256)),
    }


def test_quantize_tensors_applies_the_default_and_keeps_what_it_cannot_quantize():
    tensors = model()
    out, report = aprfast.quantize_tensors(tensors)
    assert list(out) == list(tensors) and [e.name for e in report] == list(tensors)
    quantized = {e.name for e in report.quantized}
    assert quantized == {"tok_embeddings.weight", "layers.0.attention.wq.weight", "layers.0.attention_norm.weight",
                         "layers.0.ffn.w1.weight", "layers.0.ffn.bias", "output.weight"}
    for name in quantized:
        assert out[name] == aprfast.quantize(tensors[name], "q4_0")
        assert report[name].type == "Q4_0" and report[name].bits_per_weight == 4.5
    reasons = {e.name: e.reason for e in report.kept}
    assert "multiple of 32" in reasons["odd.weight"] and "too small" in reasons["tiny"]
    assert reasons["scalar"] == "0-d tensor" and "not floating point (I64)" == reasons["token_ids"]
    assert reasons["packed"] == "already packed (Q4_K)"
    for name in reasons:
        assert out[name] is tensors[name] and report[name].type is None
    assert report["layers.0.ffn.w1.weight"].original_dtype == "F16"
    assert report["layers.0.ffn.bias"].original_dtype == "BF16"
    assert report["output.weight"].original_dtype == "F64"
    assert report["token_ids"].bits_per_weight == 64


def test_strict_makes_unquantizable_rows_an_error():
    with pytest.raises(LayoutError, match=r"tensor 'odd.weight'.*\[4, 40\]"):
        aprfast.quantize_tensors({"odd.weight": random_values((4, 40))}, "q8_0", strict=True)
    out, report = aprfast.quantize_tensors({"odd.weight": random_values((4, 40))}, "apr_q4", strict=True)
    assert report["odd.weight"].type == "APR_Q4"


def test_rules_first_match_wins_and_none_keeps():
    tensors = model()
    rules = {"*embeddings*": "q8_0", "*norm*": None, "layers.*.weight": "apr_q4", "*": "q4_1"}
    out, report = aprfast.quantize_tensors(tensors, default="q8_tensor", rules=rules)
    assert report["tok_embeddings.weight"].type == "Q8_0"
    assert report["layers.0.attention_norm.weight"].type is None
    assert report["layers.0.attention_norm.weight"].reason == "rule '*norm*' keeps it"
    assert report["layers.0.attention.wq.weight"].type == "APR_Q4"
    assert report["output.weight"].type == "Q4_1"
    assert out["layers.0.attention_norm.weight"] is tensors["layers.0.attention_norm.weight"]
    pairs = [("*.weight", "q8_0"), ("layers.*", "q4_0")]
    _, report = aprfast.quantize_tensors(tensors, None, pairs)
    assert report["layers.0.ffn.w1.weight"].type == "Q8_0" and report["layers.0.ffn.bias"].type == "Q4_0"
    assert report["tiny"].reason == "no rule matched and default is None"


def test_rules_may_be_a_callable_like_select_quantizer():
    seen = []

    def select(name, shape):
        seen.append((name, shape))
        return "q8_0" if len(shape) == 2 and shape[0] >= 64 else None

    _, report = aprfast.quantize_tensors(model(), rules=select)
    assert ("layers.0.attention.wq.weight", (64, 64)) in seen
    assert {e.name for e in report.quantized} == {"layers.0.attention.wq.weight", "layers.0.ffn.w1.weight"}


def test_nothing_is_quantized_with_no_default_and_no_rules():
    tensors = model()
    out, report = aprfast.quantize_tensors(tensors, default=None)
    assert all(out[k] is tensors[k] for k in tensors) and not report.quantized
    assert report.metadata("aprender") is None and report.dominant_type() is None


@pytest.mark.parametrize("rules, error", [({"*": "q9_9"}, UnknownDTypeError), ({"*": "iq3_xxs"}, LayoutError),
                                          ({5: "q8_0"}, TypeError), (["*"], TypeError)])
def test_bad_rules_fail_before_any_work(rules, error):
    with pytest.raises(error):
        aprfast.quantize_tensors(model(), rules=rules)


def test_bad_default_fails():
    with pytest.raises(UnknownDTypeError):
        aprfast.quantize_tensors(model(), default="int3")
    with pytest.raises(TypeError):
        aprfast.quantize_tensors([("a", random_values((1, 32)))])


def test_report_error_figures_are_those_of_the_dequantized_tensor():
    x = random_values((32, 64), 11)
    _, report = aprfast.quantize_tensors({"w": x}, "q4_0")
    back = aprfast.dequantize(aprfast.quantize(x, "q4_0")).astype(np.float64)
    ref = x.astype(np.float64)
    e = report["w"]
    assert math.isclose(e.rmse, float(np.sqrt(np.mean((back - ref) ** 2))), rel_tol=1e-9)
    assert e.max_abs_error == float(np.max(np.abs(back - ref)))
    cosine = float(back.ravel() @ ref.ravel() / np.linalg.norm(back) / np.linalg.norm(ref))
    assert math.isclose(e.cosine_similarity, cosine, rel_tol=1e-9) and 0.99 < cosine < 1
    assert e.as_dict()["type"] == "Q4_0" and e.quantized and e.elements == 2048


def test_report_figures_for_zeros_and_nan():
    _, report = aprfast.quantize_tensors({"z": np.zeros((2, 32), np.float32),
                                          "n": np.full((1, 32), np.nan, np.float32)}, "q8_0")
    assert report["z"].cosine_similarity == 1.0 and report["z"].rmse == 0 and report["z"].max_abs_error == 0
    assert math.isnan(report["n"].rmse) and math.isnan(report["n"].cosine_similarity)
    assert any(w.startswith("n: Q8_0") for w in report.warnings)


def test_measure_false_skips_the_error_figures():
    x = random_values((4, 64))
    out, report = aprfast.quantize_tensors({"w": x, "ids": np.arange(3)}, "q8_0", measure=False)
    e = report["w"]
    assert out["w"] == aprfast.quantize(x, "q8_0") and e.type == "Q8_0" and e.bits_per_weight == 8.5
    assert e.rmse is e.max_abs_error is e.cosine_similarity is None
    assert report.warnings == [] and "w" in str(report) and "accuracy_warnings" not in report.metadata("apr2")


def test_per_tensor_types_report_exact_bits_per_weight():
    _, report = aprfast.quantize_tensors({"w": random_values((10, 10))}, "apr_q8")
    assert report["w"].bits_per_weight == (4 + 100) * 8 / 100


def test_report_metadata_for_each_layout():
    tensors = {"big": random_values((64, 64)), "small": random_values((2, 64)), "ids": np.arange(4)}
    _, report = aprfast.quantize_tensors(tensors, "q4_0", rules={"small": "q8_0"})
    assert report.dominant_type() == "Q4_0"
    assert report.metadata("aprender") == {"quant_type": "q4_0", "bits": 4, "block_size": 32, "symmetric": True}
    assert report.metadata("apr2") == {"method": "Q4_0", "bits_per_weight": 4.5,
                                       "per_tensor": {"big": "Q4_0", "small": "Q8_0"}}
    assert report.metadata() == report.metadata("apr2")  # Q4_0 has no aprender id
    _, report = aprfast.quantize_tensors(tensors, "apr_q4")
    assert report.metadata() == {"quant_type": "apr_q4", "bits": 4, "block_size": 32, "symmetric": True}
    _, report = aprfast.quantize_tensors(tensors, "q8_tensor")
    assert report.metadata("aprender") == {"quant_type": "q8_tensor", "bits": 8, "block_size": None,
                                           "symmetric": False}
    with pytest.raises(LayoutError):
        report.metadata("v1")
    assert "big" in str(report) and "kept" in str(report) and "2 quantized" in repr(report)


def test_degradation_is_logged_and_listed_but_does_not_stop(caplog):
    """Jidoka §6.2.9: accuracy loss past DEGRADATION_LIMIT is logged, then work goes on."""
    block = np.full((1, 32), -0.49, np.float32)
    block[0, 0] = 8.0  # Q4_0 step of 1: every other value rounds to 0 (cosine 0.946)
    with caplog.at_level(logging.WARNING, logger="aprfast.numerics.quantization"):
        out, report = aprfast.quantize_tensors({"w": block, "ok": random_values((4, 64))}, "q4_0")
    assert report["w"].cosine_similarity < 1 - Q.DEGRADATION_LIMIT
    assert report.warnings == [f"w: Q4_0 cosine similarity {report['w'].cosine_similarity:.4f}"]
    assert "quantization degraded w: Q4_0" in caplog.text
    assert report.metadata("apr2")["accuracy_warnings"] == ["w"]
    assert type(out["w"]) is aprfast.QuantizedTensor


def test_quantize_tensors_never_touches_the_inputs():
    tensors = model()

    def snapshot():
        return {k: np.asarray(v.data if isinstance(v, aprfast.RawTensor) else v).tobytes()
                for k, v in tensors.items()}

    before = snapshot()
    aprfast.quantize_tensors(tensors, "q8_0")
    assert snapshot() == before


# --- custom quantizers -------------------------------------------------------------------
def int8_blocks_quantize(values):
    """A test type: blocks of 16, f32 scale max|x|/127 then 16 x i8 (20 bytes)."""
    blocks = values.reshape(-1, 16)
    scale = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    scale[scale == 0] = 1
    q = np.round(blocks / scale).astype(np.int8)
    return np.concatenate([scale.astype("<f4").view(np.uint8), q.view(np.uint8)], axis=1)


def int8_blocks_dequantize(data, shape):
    blocks = data.reshape(-1, 20)
    scale = blocks[:, :4].copy().view("<f4")
    return (blocks[:, 4:].view(np.int8).astype(np.float32) * scale).reshape(shape)


@pytest.fixture
def custom_type():
    kind = aprfast.register_quantizer("test_i8b16", int8_blocks_quantize, int8_blocks_dequantize, 10.0,
                                      block_elems=16, block_bytes=20, apr2_id=250)
    yield kind
    Q.unregister_quantizer("TEST_I8B16")


def test_custom_quantizer_round_trips(custom_type):
    assert custom_type.name == "TEST_I8B16" and custom_type.bits_per_weight == 10.0 and custom_type.bits == 10
    x = random_values((3, 48), 12)
    qt = aprfast.quantize(x, "test_i8b16")
    assert qt.dtype is DTYPES["TEST_I8B16"] and qt.nbytes == 3 * 3 * 20
    assert bytes(qt.data) == int8_blocks_quantize(x).tobytes()
    assert np.array_equal(aprfast.dequantize(qt), int8_blocks_dequantize(qt.data, (3, 48)))
    with pytest.raises(LayoutError, match="multiple of 16"):
        aprfast.quantize(random_values((3, 40)), "test_i8b16")
    _, report = aprfast.quantize_tensors({"w": x}, "test_i8b16")
    assert report["w"].cosine_similarity > 0.999 and report.metadata() == {
        "method": "TEST_I8B16", "bits_per_weight": 10.0, "per_tensor": {"w": "TEST_I8B16"}}


def test_custom_quantizer_output_of_the_wrong_size_is_corrupt(custom_type):
    Q.unregister_quantizer("test_i8b16")
    aprfast.register_quantizer("test_i8b16", lambda v: b"\x00" * 3, lambda d, s: np.zeros(5), 8,
                               block_elems=16, block_bytes=20, apr2_id=250)
    with pytest.raises(CorruptError, match="returned 3 bytes"):
        aprfast.quantize(random_values((1, 16)), "test_i8b16")
    with pytest.raises(CorruptError, match="returned 5 values"):
        aprfast.dequantize(aprfast.QuantizedTensor("TEST_I8B16", (1, 16), bytes(20)))


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="Q4_0"), "already registered|taken"),
    (dict(name="F32"), "taken"),
    (dict(name="test_i8b16"), "already"),
    (dict(apr2_id=17), "200-254"),
    (dict(apr2_id=199), "200-254"),
    (dict(apr2_id=255), "200-254"),
    (dict(apr2_id=250), "already taken by TEST_I8B16"),
    (dict(name="bad name!"), "letters"),
    (dict(block_elems=0), "block_elems"),
    (dict(bits_per_weight=-1), "bits_per_weight"),
    (dict(bits_per_weight=0.5), "bits"),
    (dict(bits=300), "bits"),
])
def test_register_quantizer_refuses_clashes_and_bad_arguments(custom_type, kwargs, match):
    args = dict(name="test_other", quantize=int8_blocks_quantize, dequantize=int8_blocks_dequantize,
                bits_per_weight=10.0, block_elems=16, block_bytes=20, apr2_id=251)
    args.update(kwargs)
    with pytest.raises(LayoutError, match=match):
        aprfast.register_quantizer(**args)
    assert "TEST_OTHER" not in DTYPES and not aprfast.dtypes.APR2_IDS.knows(251)


def test_built_in_types_cannot_be_unregistered():
    with pytest.raises(LayoutError, match="built in"):
        Q.unregister_quantizer("q4_0")


@pytest.mark.parametrize("type_name, kernel",
                         [("APR_FQ8_0", "quantize_apr_fq8_0"), ("APR_FQ4_0", "quantize_apr_fq4_0")])
def test_aprender_format_quantize_variants_round_trip_through_the_spec_layout(type_name, kernel):
    """aprender's format-quantize Q8_0/Q4_0 (flat blocks, last one padded): the API gives
    the kernel's bytes (checked against aprender's rules in test_quant_kernels), and the
    spec layout stores them under their own ids (40, 41)."""
    from aprfast import _quant

    x = np.random.default_rng(7).standard_normal((3, 50)).astype(np.float32)  # 150: a partial block
    qt = aprfast.quantize(x, type_name.lower())
    direct = np.empty(qt.data.nbytes, np.uint8)
    getattr(_quant, kernel)(x.reshape(-1), direct)
    assert qt.data.nbytes == 5 * (34 if type_name == "APR_FQ8_0" else 18)
    np.testing.assert_array_equal(qt.data, direct)
    data = aprfast.save({"q": qt})
    with aprfast.open(data) as f:
        assert f.layout == "apr2" and f.info("q").dtype_id == {"APR_FQ8_0": 40, "APR_FQ4_0": 41}[type_name]
        np.testing.assert_array_equal(f.get_tensor("q", dequantize=True), aprfast.dequantize(qt))
    step = 1 / 127 if type_name == "APR_FQ8_0" else 1 / 7
    assert np.abs(aprfast.dequantize(qt) - x).max() <= np.abs(x).max() * step
