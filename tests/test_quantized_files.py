"""Quantized tensors in files: both v2 layouts, lazy dequantization, row slices, flags,
metadata, and the Jidoka gates (seed 002 §6.2.9) on what a file claims."""

import io
import os
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aprfast
from aprfast.dtypes import DTYPES
from aprfast.errors import CorruptError, LayoutError, UnknownDTypeError
from aprfast.numerics import quantization as Q

QUANTIZABLE = ["Q8_0", "Q4_0", "Q4_1", "APR_Q8", "APR_Q4", "Q8_TENSOR"]
LAYOUT_TYPES = {
    "aprender": ["APR_Q4", "APR_Q8", "Q4_K", "Q6_K"],
    "apr2": ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K", "APR_Q4", "APR_Q8", "Q8_TENSOR"],
}
ROW_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K"]
APRENDER_QUANTIZED = 0x0020
APR2_QUANTIZED = 0x40


def random_values(shape, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 2).astype(np.float32)


def packed(type_name, shape, seed=0, random_bytes=False):
    """A tensor of ``type_name``: quantized from random floats when aprfast can, else
    random blocks (finite f16 scales are not needed: dequantizing compares NaN-aware)."""
    if type_name in QUANTIZABLE and not random_bytes:
        return aprfast.quantize(random_values(shape, seed), type_name)
    raw = np.random.default_rng(seed).integers(0, 256, DTYPES[type_name].nbytes(shape), np.uint8)
    return aprfast.QuantizedTensor(type_name, shape, raw)


def shape_for(type_name, rows=3, blocks=2):
    d = DTYPES[type_name]
    return (rows, blocks * d.block_elems) if d.blocks_per_row else (rows, 45)


def same_floats(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


def assert_same_packed(got, want):
    assert type(got) is aprfast.QuantizedTensor
    assert got.dtype is want.dtype and got.shape == want.shape and bytes(got.data) == bytes(want.data)


def flags(data: bytes) -> int:
    return struct.unpack_from("<H" if data[:4] == b"APR\0" else "<I", data, 6 if data[:4] == b"APR\0" else 8)[0]


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory() as d:
        yield d


_counter = iter(range(10**9))


def saved(workdir, tensors, metadata=None, layout="auto"):
    path = os.path.join(workdir, f"q{next(_counter)}.apr")
    aprfast.save_file(tensors, path, metadata, layout=layout, durable=False)
    return path


# --- both layouts hold the packed types they have ids for ------------------------------------
@pytest.mark.parametrize("layout", list(LAYOUT_TYPES))
def test_quantized_model_round_trips_in_each_layout(workdir, layout):
    tensors = {f"{t.lower()}.weight": packed(t, shape_for(t), seed=i) for i, t in enumerate(LAYOUT_TYPES[layout])}
    tensors["norm"] = random_values((64,), 99)
    meta = {"quantization": Q.quantize_tensors({"w": random_values((4, 64))}, LAYOUT_TYPES[layout][0])[1]
            .metadata(layout)}
    path = saved(workdir, tensors, meta, layout)
    data = Path(path).read_bytes()
    assert aprfast.save(tensors, meta, layout=layout) == data
    for mode in ("mmap", "pread"):
        with aprfast.open(path, mode=mode) as f:
            assert f.layout == layout and f.metadata["quantization"] == meta["quantization"]
            f.verify()
            for name, want in tensors.items():
                if not isinstance(want, aprfast.QuantizedTensor):
                    assert np.array_equal(f.get_tensor(name, dequantize=True), want)
                    continue
                assert_same_packed(f.get_tensor(name), want)
                assert f.info(name).dtype is want.dtype
                values = aprfast.dequantize(want)
                assert same_floats(f.get_tensor(name, dequantize=True), values)
                assert same_floats(f.get_tensor(name, copy=True, dequantize=True), values)
    for loaded in (aprfast.load(data), aprfast.load_file(path, mmap=False), aprfast.load_file(path)):
        for name, want in tensors.items():
            if isinstance(want, aprfast.QuantizedTensor):
                assert_same_packed(loaded[name], want)
        assert aprfast.save(loaded, meta, layout=layout) == data  # load -> save: identical bytes


def test_quantize_tensors_then_save_and_load(workdir):
    model = {"embed.weight": random_values((32, 64), 1), "layers.0.w.weight": random_values((64, 64), 2),
             "layers.0.norm.weight": random_values((64,), 3), "ids": np.arange(10)}
    quantized, report = aprfast.quantize_tensors(model, "q4_0", rules={"embed.*": "q8_0", "*norm*": None})
    meta = {"model_type": "llama", "quantization": report.metadata()}
    path = saved(workdir, quantized, meta)
    with aprfast.open(path) as f:
        assert f.layout == "apr2" and f.metadata["quantization"] == report.metadata("apr2")
        assert f.metadata["quantization"]["per_tensor"] == {"embed.weight": "Q8_0", "layers.0.w.weight": "Q4_0"}
        for name, value in model.items():
            got = f.get_tensor(name, dequantize=True)
            if report[name].quantized:
                assert same_floats(got, aprfast.dequantize(quantized[name]))
                err = got.astype(np.float64) - value
                assert np.sqrt(np.mean(err ** 2)) == pytest.approx(report[name].rmse, rel=1e-9)
            else:
                assert np.array_equal(got, value)


def test_streaming_writer_gives_the_same_bytes(workdir):
    tensors = {"a": packed("Q4_0", (4, 64), 1), "b": packed("Q8_TENSOR", (5, 7), 2), "c": random_values((3,))}
    path = os.path.join(workdir, "streamed.apr")
    with aprfast.Writer(path, {"note": "x"}) as w:
        for name in reversed(list(tensors)):
            w.add(name, tensors[name])
    assert Path(path).read_bytes() == aprfast.save(tensors, {"note": "x"})


# --- which layout "auto" picks, and what each refuses ----------------------------------------
@pytest.mark.parametrize("type_name, layout", [("Q8_0", "apr2"), ("Q4_0", "apr2"), ("Q4_1", "apr2"),
                                               ("Q5_0", "apr2"), ("Q8_TENSOR", "apr2"), ("APR_Q4", "aprender"),
                                               ("APR_Q8", "aprender"), ("Q4_K", "aprender"), ("Q6_K", "aprender")])
def test_auto_layout_follows_the_dtype_ids(type_name, layout):
    data = aprfast.save({"t": packed(type_name, shape_for(type_name))})
    assert aprfast.open(data).layout == layout


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_TENSOR"])
def test_aprender_layout_refuses_types_it_has_no_id_for(type_name):
    with pytest.raises(LayoutError, match=f"aprender layout has no dtype id for {type_name}"):
        aprfast.save({"t": packed(type_name, shape_for(type_name))}, layout="aprender")


def test_q8_tensor_has_apr2_id_39():
    qt = aprfast.quantize(random_values((2, 3)), "q8_tensor")
    data = aprfast.save({"t": qt}, layout="apr2")
    with aprfast.open(data) as f:
        assert f.info("t").dtype_id == 39 and f.info("t").nbytes == 8 + 6
    assert aprfast.dtypes.APR2_IDS.dtype(39) is DTYPES["Q8_TENSOR"]
    assert not aprfast.dtypes.APRENDER_IDS.holds(DTYPES["Q8_TENSOR"])


# --- the QUANTIZED flag ----------------------------------------------------------------------
QUANT_META = {"quant_type": "apr_q4", "bits": 4, "block_size": 32, "symmetric": True}


@pytest.mark.parametrize("tensors, metadata, expected", [
    ({"q": packed("APR_Q4", (2, 32))}, {"quantization": QUANT_META}, 0x0400 | APRENDER_QUANTIZED),
    ({"w": np.ones(3, np.float32)}, {"quantization": QUANT_META}, 0x0400 | APRENDER_QUANTIZED),
    ({"q": packed("APR_Q4", (2, 32))}, {}, 0x0400),
    ({"q": packed("APR_Q4", (2, 32))}, {"quantization": None}, 0x0400),
    ({"w": np.ones(3, np.float32)}, {"quantization": QUANT_META, "sharding": {
        "shard_count": 2, "shard_index": 1, "total_size": 0}}, 0x0400 | 0x0010 | APRENDER_QUANTIZED),
])
def test_aprender_quantized_flag_follows_the_quantization_metadata(tensors, metadata, expected):
    """As SHARDED follows `sharding`: the same content always gives the same bytes."""
    data = aprfast.save(tensors, metadata, layout="aprender")
    assert flags(data) == expected
    with aprfast.open(data) as f:
        assert ("QUANTIZED" in f.header["flag_names"]) == bool(expected & APRENDER_QUANTIZED)
        assert f.metadata.get("quantization") == metadata.get("quantization")


@pytest.mark.parametrize("tensors, quantized", [({"q": packed("Q4_0", (1, 32))}, True),
                                                ({"w": np.ones(3, np.float32)}, False)])
def test_apr2_quantized_flag_follows_the_tensors(tensors, quantized):
    data = aprfast.save(tensors, {"quantization": {"method": "Q4_0"}}, layout="apr2")
    assert bool(flags(data) & APR2_QUANTIZED) == quantized


# --- lazy row slices -------------------------------------------------------------------------
@st.composite
def row_slice_cases(draw):
    type_name = draw(st.sampled_from(ROW_TYPES))
    block = DTYPES[type_name].block_elems
    lead = draw(st.lists(st.integers(0, 5), min_size=1, max_size=3))
    row = draw(st.integers(1, 2)) * block - draw(st.sampled_from([0, 0, 5]))  # rows padded to blocks too
    shape = tuple(lead) + (row,)
    index = st.one_of(st.none(), st.integers(-8, 8))
    key = slice(draw(index), draw(index))
    extra = draw(st.sampled_from([(), (slice(None),), (Ellipsis,)]))
    return type_name, shape, (key,) + extra if extra else key, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=60)
@given(case=row_slice_cases(), mode=st.sampled_from(["mmap", "pread", "bytes"]))
def test_row_slices_equal_the_rows_of_the_whole_tensor(workdir, case, mode):
    type_name, shape, key, seed = case
    whole = packed(type_name, shape, seed, random_bytes=True)
    layout = "aprender" if type_name in LAYOUT_TYPES["aprender"] else "apr2"
    target = aprfast.save({"t": whole}, layout=layout) if mode == "bytes" else saved(workdir, {"t": whole})
    first = key[0] if isinstance(key, tuple) else key
    start, stop, _ = first.indices(shape[0])
    rows = range(shape[0])[start:stop]
    with aprfast.open(target, mode=None if mode == "bytes" else mode) as f:
        got = f.get_slice("t")[key]
        assert type(got) is aprfast.QuantizedTensor and got.shape == (len(rows),) + shape[1:]
        row_bytes = whole.nbytes // shape[0] if shape[0] else 0
        assert bytes(got.data) == bytes(whole.data[start * row_bytes:(start + len(rows)) * row_bytes])
        values = f.get_slice("t", dequantize=True)[key]
        assert same_floats(values, aprfast.dequantize(whole)[first])
        assert f.get_slice("t").get_shape() == list(shape) and f.get_slice("t").get_dtype() == type_name
        assert len(f.get_slice("t")) == shape[0]


class CountingStream(io.BytesIO):
    """A file object that records how many bytes each read asks for."""

    def __init__(self, data):
        super().__init__(data)
        self.reads = []

    def read(self, n=-1):
        self.reads.append((self.tell(), n))
        return super().read(n)


def test_a_row_slice_reads_only_those_rows():
    whole = packed("Q4_K", (64, 512), 3)  # 288 bytes per row
    data = aprfast.save({"t": whole})
    stream = CountingStream(data)
    with aprfast.open(stream) as f:
        start = f.info("t").offset
        stream.reads.clear()
        got = f.get_slice("t")[10:13]
        assert stream.reads == [(start + 10 * 288, 3 * 288)]
        assert bytes(got.data) == bytes(whole.data[10 * 288:13 * 288])


def test_one_dimensional_tensors_slice_on_block_boundaries():
    whole = packed("Q8_0", (96,), 4)
    with aprfast.open(aprfast.save({"t": whole})) as f:
        sl = f.get_slice("t")
        assert bytes(sl[32:96].data) == bytes(whole.data[34:])
        assert sl[:].shape == (96,) and sl[5:5].nbytes == 0 and sl[-32:].shape == (32,)
        assert same_floats(f.get_slice("t", dequantize=True)[32:64], aprfast.dequantize(whole)[32:64])
        with pytest.raises(LayoutError, match="block boundaries"):
            sl[0:40]
        with pytest.raises(LayoutError, match="block boundaries"):
            sl[1:32]
    padded = packed("Q4_K", (300,), 5)  # one row padded to two super-blocks
    with aprfast.open(aprfast.save({"t": padded})) as f:
        assert same_floats(f.get_slice("t", dequantize=True)[256:], aprfast.dequantize(padded)[256:])


@pytest.mark.parametrize("type_name, why", [("APR_Q4", "run across rows"), ("APR_Q8", "whole tensor"),
                                            ("Q8_TENSOR", "whole tensor")])
def test_types_without_row_blocks_are_read_whole(type_name, why):
    whole = packed(type_name, (4, 64))
    with aprfast.open(aprfast.save({"t": whole})) as f:
        with pytest.raises(LayoutError, match=why):
            f.get_slice("t")
        assert_same_packed(f.get_tensor("t"), whole)


@pytest.mark.parametrize("key", [slice(0, 4, 2), slice(None, None, -1), (slice(0, 2), slice(0, 32)), 1,
                                 (Ellipsis, slice(0, 32)), (slice(None), 0), None])
def test_row_slices_refuse_other_keys(key):
    with aprfast.open(aprfast.save({"t": packed("Q8_0", (4, 64))})) as f:
        with pytest.raises(LayoutError, match="whole rows along axis 0"):
            f.get_slice("t")[key]


def test_row_slices_accept_whole_trailing_axes_and_refuse_too_many():
    whole = packed("Q4_0", (4, 3, 64))
    with aprfast.open(aprfast.save({"t": whole})) as f:
        sl = f.get_slice("t")
        want = bytes(sl[1:3].data)
        for key in [(slice(1, 3), slice(None), slice(0, 64)), (slice(1, 3), Ellipsis), (slice(1, 3), Ellipsis,
                    slice(None)), (slice(1, 3), slice(-9, 3))]:
            assert bytes(sl[key].data) == want
        assert bytes(sl[...].data) == bytes(whole.data)
        with pytest.raises(IndexError):
            sl[0:1, :, :, :]
        with pytest.raises(IndexError):
            sl[..., ...]


def test_zero_d_packed_tensors_are_not_sliced():
    with aprfast.open(aprfast.save({"t": aprfast.QuantizedTensor("Q8_0", (), bytes(34))})) as f:
        with pytest.raises(LayoutError, match="0-d"):
            f.get_slice("t")
        assert f.get_tensor("t", dequantize=True).shape == ()


def test_get_tensor_dequantize_leaves_other_tensors_alone():
    values = {"f": np.arange(6, dtype=np.float16), "i": np.arange(3)}
    with aprfast.open(aprfast.save(values)) as f:
        for name, want in values.items():
            got = f.get_tensor(name, dequantize=True)
            assert got.dtype == want.dtype and np.array_equal(got, want)
        assert f.get_slice("f", dequantize=True)[1:3].dtype == np.float16


# --- Jidoka: what a file claims about packed tensors is checked ------------------------------
def entry_field_offset(data: bytes, field: str) -> int:
    """Byte offset of tensor 0's size field, or its last dim, in the index."""
    if data[:4] == b"APR\0":
        index = struct.unpack_from("<Q", data, 24)[0]
    else:
        index = struct.unpack_from("<I", data, 20)[0] + 8
    name_len = struct.unpack_from("<H", data, index)[0]
    ndim = data[index + 2 + name_len + 1]
    dims = index + 2 + name_len + 2
    return dims + 8 * (ndim - 1) if field == "last_dim" else dims + 8 * ndim + 8


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
@pytest.mark.parametrize("field, value, message", [
    ("size", 287, r"Q4_K of shape \[2, 256\] needs 288 bytes|shape \[2, 256\] needs 288 bytes but the index says 287"),
    ("last_dim", 512, r"shape \[2, 512\] needs 576 bytes but the index says 288"),
])
def test_a_block_count_that_contradicts_the_shape_is_corrupt(layout, field, value, message):
    data = bytearray(aprfast.save({"q": packed("Q4_K", (2, 256))}, layout=layout))
    struct.pack_into("<Q", data, entry_field_offset(bytes(data), field), value)
    with pytest.raises(CorruptError, match=message) as info:
        aprfast.open(bytes(data))
    assert info.value.code == "E002"


# --- custom quantizers in files --------------------------------------------------------------
def halves_quantize(values):
    """A test type: values stored as f16, in blocks of 8 (16 bytes)."""
    return values.astype("<f2").view(np.uint8)


def halves_dequantize(data, shape):
    return data.view("<f2").astype(np.float32).reshape(shape)


@pytest.fixture
def halves():
    kind = aprfast.register_quantizer("test_f16x8", halves_quantize, halves_dequantize, 16,
                                      block_elems=8, block_bytes=16, apr2_id=252)
    yield kind
    try:
        Q.unregister_quantizer("test_f16x8")
    except UnknownDTypeError:
        pass


def test_custom_type_is_saved_with_its_apr2_id(halves):
    values = random_values((3, 16), 7)
    qt = aprfast.quantize(values, "test_f16x8")
    data = aprfast.save({"h": qt, "w": values})
    with aprfast.open(data) as f:
        assert f.layout == "apr2" and f.info("h").dtype_id == 252 and f.info("h").dtype_name == "TEST_F16X8"
        assert_same_packed(f.get_tensor("h"), qt)
        assert np.array_equal(f.get_tensor("h", dequantize=True), values.astype(np.float16).astype(np.float32))
        assert np.array_equal(f.get_slice("h", dequantize=True)[1:], values[1:].astype(np.float16).astype(np.float32))
    with pytest.raises(LayoutError, match="aprender layout has no dtype id for TEST_F16X8"):
        aprfast.save({"h": qt}, layout="aprender")
    Q.unregister_quantizer("test_f16x8")
    with pytest.raises(UnknownDTypeError, match="252"):
        aprfast.open(data)
    with aprfast.open(data, unknown_dtypes="raw") as f:
        raw = f.get_tensor("h", dequantize=True)
        assert type(raw) is aprfast.RawTensor and raw.dtype is None and bytes(raw.data) == bytes(qt.data)
