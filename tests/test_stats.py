"""The statistics engine (aprfast.stats, csrc/stats.c) against its NumPy twin: counts
and histograms exactly, moments within float tolerance; thread counts give identical
results; f16/bf16 and every packed quantized type; hostile arguments raise typed errors."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import aprfast
from aprfast import _stats
from aprfast.dtypes import bfloat16
from aprfast.numerics.expectations import EXPECTATIONS, check_expected, expectation_for
from aprfast.numerics.stats import TensorStats, histogram_spec, tensor_stats, tensor_stats_numpy
from aprfast.tensors import QuantizedTensor, RawTensor

FLOATS = [np.float32, np.float64, np.float16]
INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def assert_same(a: TensorStats, b: TensorStats, rel=1e-9):
    """Counts, min, max and histogram exactly; mean and std to ``rel`` of the data's scale."""
    for field in ("count", "nan_count", "pos_inf_count", "neg_inf_count", "zero_count", "finite_count",
                  "min", "max", "histogram", "bin_edges"):
        assert getattr(a, field) == getattr(b, field), field
    if b.mean is None:
        assert a.mean is None and a.std is None
        return
    scale = max(abs(float(b.min)), abs(float(b.max)), 1e-300)
    assert math.isclose(a.mean, b.mean, rel_tol=rel, abs_tol=rel * scale), (a.mean, b.mean)
    assert math.isclose(a.std, b.std, rel_tol=1e-6, abs_tol=rel * scale), (a.std, b.std)


def float_arrays(dtype):
    info = np.finfo(dtype)
    big = float(np.asarray(min(float(info.max) / 4, 1e30), dtype))  # sums of a few thousand stay finite
    elements = st.one_of(st.floats(-big, big, width=8 * np.dtype(dtype).itemsize),
                         st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0]))
    return hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40), elements=elements)


@settings(max_examples=60)
@given(data=st.data(), dtype=st.sampled_from(FLOATS), bins=st.sampled_from([0, 1, 7]),
       ranged=st.booleans())
def test_floats_match_the_numpy_twin(data, dtype, bins, ranged):
    array = data.draw(float_arrays(dtype))
    range_ = (-10.0, 25.0) if ranged else None
    assert_same(tensor_stats(array, bins=bins, range=range_), tensor_stats_numpy(array, bins=bins, range=range_))


@settings(max_examples=60)
@given(data=st.data(), dtype=st.sampled_from(INTS), bins=st.sampled_from([0, 3]))
def test_integers_match_the_numpy_twin_with_exact_min_max(data, dtype, bins):
    array = data.draw(hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=2, max_side=50)))
    ours, twin = tensor_stats(array, bins=bins), tensor_stats_numpy(array, bins=bins)
    assert_same(ours, twin)
    if array.size:
        assert type(ours.min) is int and ours.min == int(array.min()) and ours.max == int(array.max())


def test_extreme_int64_and_uint64_keep_exact_min_max():
    i = np.array([np.iinfo(np.int64).min, 0, np.iinfo(np.int64).max], np.int64)
    u = np.array([np.iinfo(np.uint64).max, 1], np.uint64)
    assert (tensor_stats(i).min, tensor_stats(i).max) == (int(i[0]), int(i[2]))
    assert (tensor_stats(u).min, tensor_stats(u).max) == (1, int(u[0]))


@settings(max_examples=30)
@given(hnp.arrays(np.uint16, st.integers(0, 300)))
def test_bfloat16_bits_match_the_twin_as_array_and_as_raw_tensor(bits):
    raw = RawTensor("BF16", bits.shape, bits)
    twin = tensor_stats_numpy(raw, bins=5)
    assert_same(tensor_stats(raw, bins=5), twin)
    if bfloat16 is not None:
        assert_same(tensor_stats(bits.view(bfloat16), bins=5), twin)


@settings(max_examples=30)
@given(hnp.arrays(np.uint16, st.integers(0, 300)))
def test_float16_every_bit_pattern_matches_the_twin(bits):
    array = bits.view(np.float16)
    assert_same(tensor_stats(array, bins=4), tensor_stats_numpy(array, bins=4))


def test_empty_and_all_nan_tensors_have_no_moments():
    empty = tensor_stats(np.zeros((0, 3), np.float32), bins=4)
    assert (empty.count, empty.min, empty.mean, empty.sparsity) == (0, None, None, 0.0)
    assert empty.histogram == (0, 0, 0, 0)
    nan = tensor_stats(np.full(10, np.nan, np.float32), bins=2)
    assert (nan.nan_count, nan.finite_count, nan.mean, nan.std) == (10, 0, None, None)
    assert sum(nan.histogram) == 0


def test_known_values():
    s = tensor_stats(np.array([1, 2, 3, 4, 0, np.nan, np.inf, -np.inf], np.float32), bins=4)
    assert (s.count, s.nan_count, s.pos_inf_count, s.neg_inf_count, s.zero_count) == (8, 1, 1, 1, 1)
    assert (s.min, s.max, s.mean) == (0.0, 4.0, 2.0)
    assert s.std == pytest.approx(math.sqrt(2.0))
    assert s.sparsity == 1 / 8 and s.inf_count == 2
    assert s.histogram == (1, 1, 1, 2)  # the last bin holds its right edge
    assert s.bin_edges == (0.0, 1.0, 2.0, 3.0, 4.0)


def test_histogram_agrees_with_numpy_histogram_on_ordinary_data(rng):
    x = rng.standard_normal(100_000)
    ours = tensor_stats(x, bins=50)
    counts, edges = np.histogram(x, bins=50)
    assert sum(ours.histogram) == counts.sum() == x.size
    assert max(abs(a - b) for a, b in zip(ours.histogram, counts)) <= 2  # only values on an edge may move
    np.testing.assert_allclose(ours.bin_edges, edges, rtol=1e-12)


def test_out_of_range_values_are_not_binned():
    s = tensor_stats(np.array([-5, 0.5, 1.5, 9], np.float64), bins=2, range=(0, 2))
    assert s.histogram == (1, 1)


def test_extreme_ranges_use_the_division_form_and_still_match():
    x = np.array([-1.7e308, 0.0, 1.7e308, 5e307], np.float64)
    assert histogram_spec(4, -1.7e308, 1.7e308)[3] is True
    assert_same(tensor_stats(x, bins=4), tensor_stats_numpy(x, bins=4))
    tiny = np.array([0.0, 5e-324, 1e-323], np.float64)
    assert_same(tensor_stats(tiny, bins=3), tensor_stats_numpy(tiny, bins=3))
    const = tensor_stats(np.full(5, 2.0), bins=2)
    assert const.bin_edges == (1.5, 2.0, 2.5) and const.histogram == (0, 5)  # NumPy's +-0.5 widening


@pytest.mark.parametrize("edge", [-np.finfo(np.float64).max, np.finfo(np.float64).max])
def test_a_range_of_one_value_at_the_largest_double_widens_inward(edge):
    # lo == hi widens to the neighbouring doubles; the one outward of the largest double
    # is infinite, so that edge stays (the fuzz regression burnpack-stats-histogram-...)
    lo, hi, scale, divide = histogram_spec(5, edge, edge)
    assert math.isfinite(lo) and math.isfinite(hi) and lo < hi and edge in (lo, hi)
    assert scale > 0 and not divide
    x = np.array([edge, -np.inf, edge, np.nan, np.inf], np.float64)
    s = tensor_stats(x, bins=5)
    assert s.finite_count == 2 and sum(s.histogram) == 2
    assert s.histogram == ((2, 0, 0, 0, 0) if edge < 0 else (0, 0, 0, 0, 2))
    assert_same(s, tensor_stats_numpy(x, bins=5))


def test_thread_counts_give_identical_results(rng):
    x = rng.standard_normal(3 * (1 << 20) + 123).astype(np.float32)
    x[17] = np.nan
    x[2_000_000] = -np.inf
    one = tensor_stats(x, bins=16, threads=1)
    assert one == tensor_stats(x, bins=16, threads=2) == tensor_stats(x, bins=16, threads=3)
    assert_same(one, tensor_stats_numpy(x, bins=16), rel=1e-7)
    h = x.astype(np.float16)
    assert tensor_stats(h, threads=1) == tensor_stats(h, threads=2)


def test_non_contiguous_and_fortran_and_big_endian_arrays(rng):
    x = rng.standard_normal((64, 48))
    for view in (x[:, ::3], x.T, np.asfortranarray(x), x.astype(">f8"), x[::-1]):
        assert_same(tensor_stats(view, bins=5), tensor_stats_numpy(view, bins=5))


QUANT_SHAPES = {"Q8_0": (40, 64), "Q4_0": (40, 64), "Q4_1": (40, 64), "APR_Q8": (41, 33), "APR_Q4": (41, 33),
                "Q8_TENSOR": (41, 33), "APR_FQ8_0": (41, 33), "APR_FQ4_0": (41, 33)}


@pytest.mark.parametrize("qtype", sorted(QUANT_SHAPES))
def test_quantized_types_match_dequantize_then_numpy(qtype, rng):
    qt = aprfast.quantize(rng.standard_normal(QUANT_SHAPES[qtype]).astype(np.float32) * 0.1, qtype)
    assert_same(tensor_stats(qt, bins=9), tensor_stats_numpy(qt, bins=9), rel=1e-7)


def test_large_quantized_tensor_is_decoded_in_chunks_and_threads_agree(rng):
    qt = aprfast.quantize(rng.standard_normal((2500, 1024)).astype(np.float32), "q4_0")
    one = tensor_stats(qt, bins=8, threads=1)
    assert one == tensor_stats(qt, bins=8, threads=2)
    assert_same(one, tensor_stats_numpy(qt, bins=8), rel=1e-7)


@pytest.mark.parametrize("qtype,block_bytes", [("Q4_K", 144), ("Q6_K", 210)])
def test_k_quants_with_padded_rows(qtype, block_bytes, rng):
    rows, row = 5, 300  # each row padded to 512 values (2 super-blocks); the padding is ignored
    data = rng.integers(0, 256, rows * 2 * block_bytes, dtype=np.uint8)
    scale = np.array([0.01], np.float16).view(np.uint8)
    for b in range(rows * 2):  # keep the f16 scales finite so the values are ordinary
        start = b * block_bytes + (0 if qtype == "Q4_K" else block_bytes - 2)
        data[start:start + 2] = scale
        if qtype == "Q4_K":
            data[start + 2:start + 4] = scale
    qt = QuantizedTensor(qtype, (rows, row), data)
    ours = tensor_stats(qt, bins=6)
    assert ours.count == rows * row
    assert_same(ours, tensor_stats_numpy(qt, bins=6), rel=1e-7)


def test_tensors_read_from_a_file(tmp_path, rng):
    path = tmp_path / "m.apr"
    w = rng.standard_normal((8, 32)).astype(np.float32)
    aprfast.save_file({"w": w, "q": aprfast.quantize(w, "q8_0")}, path, layout="apr2")
    with aprfast.open(path) as f:
        assert_same(tensor_stats(f.get_tensor("w")), tensor_stats_numpy(w))
        assert tensor_stats(f.get_tensor("q")).count == w.size


def test_hostile_arguments_raise_typed_errors():
    x = np.ones(4, np.float32)
    with pytest.raises(TypeError):
        tensor_stats(np.ones(3, np.complex64))
    with pytest.raises(TypeError):
        tensor_stats(RawTensor(None, (4,), np.zeros(4, np.uint8), dtype_id=99))
    with pytest.raises(TypeError):
        tensor_stats(x, bins=2.5)
    for bad in (dict(bins=-1), dict(bins=1 << 30), dict(bins=2, range=(3, 1)), dict(bins=2, range=(0, np.inf)),
                dict(bins=2, range="ab"), dict(threads=-1)):
        with pytest.raises(ValueError):
            tensor_stats(x, **bad)
    with pytest.raises(ValueError):
        _stats.compute("F32", np.zeros(7, np.uint8), _stats.MOMENTS)  # not whole elements
    with pytest.raises(ValueError):
        _stats.compute_quant(_stats_qtype("Q8_0"), np.zeros(33, np.uint8), 1, 32, _stats.MOMENTS)


def _stats_qtype(name):
    from aprfast import _quant
    return _quant.TYPES[name]


def test_as_dict_is_json_ready():
    d = tensor_stats(np.array([1.0, 3.0]), bins=2).as_dict()
    assert d["mean"] == 2.0 and d["histogram"] == [1, 1] and d["sparsity"] == 0.0


# --- seed 001 §10.9 expectations -------------------------------------------------------------
def stats_of(values):
    return tensor_stats(np.asarray(values, np.float32))


def test_layernorm_weight_mean_11_fails_and_mean_1_passes(rng):
    name = "encoder.layer_norm.weight"
    assert expectation_for(name).mean_range == (0.5, 3.0)
    bad = check_expected(name, stats_of(11 + 0.1 * rng.standard_normal(384)))
    assert bad.status == "FAIL" and "mean" in bad.reasons[0]
    assert check_expected(name, stats_of(1 + 0.1 * rng.standard_normal(384))).status == "PASS"


def test_layernorm_bias_mean_5_fails():
    assert check_expected("decoder.layers.0.final_layer_norm.bias", stats_of([5.0] * 8)).status == "FAIL"
    assert check_expected("decoder.layers.0.final_layer_norm.bias", stats_of([0.1] * 8)).status == "PASS"


def test_embedding_and_linear_std_ranges(rng):
    wide = check_expected("decoder.token_embedding.weight", stats_of(rng.standard_normal(1000)))
    assert wide.status == "WARN" and wide.reasons[0].startswith("std 1.0")  # QA #30: std 1.0 "should warn"
    assert wide.reasons[0].endswith("above 0.2")
    assert check_expected("decoder.token_embedding.weight",
                          stats_of(0.03 * rng.standard_normal(1000))).status == "PASS"
    assert check_expected("encoder.layers.0.self_attn.q_proj.weight",
                          stats_of(0.5 * rng.standard_normal(1000))).status == "WARN"
    shifted = stats_of(1 + 0.03 * rng.standard_normal(1000))  # QA #35: linear mean 1.0 warns
    assert check_expected("encoder.layers.0.fc1.weight", shifted).status == "WARN"
    assert check_expected("something.else", stats_of([1.0])).status == "-"
    assert check_expected("something.else", stats_of([np.nan])).status == "FAIL"
    assert all(rule.mean_range or rule.std_range for rule in EXPECTATIONS)


def test_the_kernel_glue_derives_its_own_scale_and_refuses_bad_ranges():
    data = np.array([1.0, 2.0], np.float64).view(np.uint8)
    counts = np.zeros(2, np.uint64)
    for lo, hi in ((2.0, 1.0), (1.0, 1.0), (0.0, np.inf), (np.nan, 1.0)):
        with pytest.raises(ValueError):
            _stats.compute("F64", data, _stats.HIST, counts, lo, hi)
    _stats.compute("F64", data, _stats.HIST, counts, 1.0, 2.0)
    assert counts.tolist() == [1, 1]


def test_float4_is_decoded_from_its_nibbles():
    # low nibble first: 0x21 -> 0.5, 1.0; 0x7F -> -6.0, 6.0; 0x0A -> -1.0 (the odd count drops 0x0)
    qt = QuantizedTensor("F4_E2M1", (5,), np.array([0x21, 0x7F, 0x0A], np.uint8))
    s = tensor_stats(qt, bins=2)
    assert (s.count, s.min, s.max) == (5, -6.0, 6.0)
    assert s.mean == pytest.approx(0.1) and s.histogram == (2, 3)


def test_a_custom_quantizer_is_decoded_by_its_own_function():
    from aprfast.numerics import quantization as Q

    def quantize(values):  # one int8 per value, no scale: just enough to be a packed type
        return np.clip(np.round(values), -127, 127).astype(np.int8).view(np.uint8)

    def dequantize(data, shape):
        return data.view(np.int8).astype(np.float32).reshape(shape)

    kind = aprfast.register_quantizer("test_stats_i8", quantize, dequantize, 8.0, block_elems=1, block_bytes=1,
                                      apr2_id=250, blocks_per_row=False)
    try:
        qt = kind.quantize(np.array([[-3.0, 0.0, 2.0, 5.0]], np.float32))
        s = tensor_stats(qt, bins=2)
        assert (s.count, s.min, s.max, s.mean, s.zero_count) == (4, -3.0, 5.0, 1.0, 1)
        assert_same(s, tensor_stats_numpy(qt, bins=2))
    finally:
        Q.unregister_quantizer("test_stats_i8")


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int16", "int32", "int64", "uint16", "uint32"])
def test_a_view_at_an_odd_address_gives_the_same_statistics(dtype):
    # a tensor of a file at an odd offset (GGUF data need not be aligned): the C kernels load
    # whole elements, so such blocks are copied to aligned scratch (UBSan found the misaligned
    # load under tests/sanitize.sh --fuzz); the figures are those of the aligned array
    rng = np.random.default_rng(7)
    values = (rng.standard_normal(50_001) * 100).astype(dtype)
    raw = bytearray(values.nbytes + 1)
    raw[1:] = values.tobytes()
    odd = np.frombuffer(memoryview(raw)[1:], dtype=dtype)
    assert odd.ctypes.data % odd.itemsize != 0
    want, got = tensor_stats(values), tensor_stats(odd)
    for field in ("count", "zero_count", "finite_count", "min", "max", "mean", "std"):
        assert getattr(got, field) == getattr(want, field), field
