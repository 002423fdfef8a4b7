"""Property tests: whatever save() writes, every reader gives back bit for bit.

Covers both layouts and "auto": random dicts of tensors over every dtype a layout
holds (0-d, empty dims, up to 8 dims, NaN payloads, -0.0, big-endian and
Fortran-ordered inputs), random unicode names, random metadata; eager, lazy, mapped
and pread reads; byte-identical output whatever the dict order; the "auto" choice;
packed (quantized) tensors.
"""

import math
import os
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ml_dtypes import bfloat16

import aprfast
from aprfast.dtypes import DTYPES
from aprfast.errors import LayoutError

APRENDER_DTYPES = [np.dtype(d) for d in (np.float32, np.float16, np.float64, np.int32, np.int64, np.int8,
                                         np.uint8, bfloat16)]
APR2_DTYPES = APRENDER_DTYPES + [np.dtype(d) for d in (np.int16, np.uint16, np.uint32, np.uint64, np.bool_)]
FLOAT_DTYPES = {np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), np.dtype(bfloat16)}

APRENDER_PACKED = ["Q4_K", "Q6_K", "APR_Q4", "APR_Q8"]
APR2_PACKED = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K", "APR_Q4", "APR_Q8"]

MAX_ELEMS = 48  # keeps every tensor (and so every example) small
APRENDER_NAME_BYTES = 256
AUTO_LAYOUT_DTYPES = set(APRENDER_DTYPES)

# aprender's typed metadata fields (AprV2Metadata), from APRENDER-COMPAT.md §2.4.
ALWAYS_NULL = ("license", "data_source", "data_license")
STR_FIELDS = ("name", "description", "author", "version", "source", "original_format", "created_at",
              "chat_template", "chat_format", "architecture", "hf_architecture", "hf_model_type")
U64_FIELDS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "vocab_size", "intermediate_size",
              "max_position_embeddings", "head_dim", "num_experts", "num_experts_per_tok",
              "moe_intermediate_size")
F32_FIELDS = ("rope_theta", "rms_norm_eps")
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "im_start_token", "im_end_token")
# Declaration order of AprV2Metadata (serde writes struct fields in this order).
FIELD_ORDER = ("model_type", "name", "description", "author", "license", "data_source", "data_license", "version",
               "source", "original_format", "created_at", "total_size", "param_count", "quantization", "sharding",
               "chat_template", "chat_format", "special_tokens", "architecture", "hf_architecture",
               "hf_model_type", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "vocab_size",
               "intermediate_size", "max_position_embeddings", "rope_theta", "rope_type", "rms_norm_eps",
               "head_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size")
QUANTIZATION_ORDER = ("quant_type", "bits", "block_size", "symmetric")
TYPED_FIELDS = (set(ALWAYS_NULL) | set(STR_FIELDS) | set(U64_FIELDS) | set(F32_FIELDS)
                | {"model_type", "total_size", "param_count", "rope_type", "quantization", "sharding",
                   "special_tokens"})


# --- strategies -------------------------------------------------------------------
@st.composite
def shapes(draw, max_dims=8, min_dims=0, max_elems=MAX_ELEMS):
    ndim = draw(st.integers(min_dims, max_dims))
    dims, count = [], 1
    for _ in range(ndim):
        budget = max_elems // count if count else 6
        dim = draw(st.integers(0, max(1, min(6, budget))))
        dims.append(dim)
        count *= dim
    return tuple(dims)


@st.composite
def arrays(draw, dtypes, max_dims=8):
    """(input array as given to save, the little-endian C-order array it stands for)."""
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes(max_dims=max_dims))
    count = math.prod(shape)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if dtype == np.bool_:
        want = rng.integers(0, 2, count).astype(np.bool_).reshape(shape)
    else:
        want = np.frombuffer(rng.bytes(count * dtype.itemsize), dtype).copy().reshape(shape)
        if dtype in FLOAT_DTYPES and count and draw(st.booleans()):
            specials = np.array([np.nan, -0.0, np.inf, -np.inf, -np.nan, 0.0], np.float64).astype(dtype)
            flat = want.reshape(-1)
            for i in range(0, count, 2):
                flat[i] = specials[(i // 2) % len(specials)]
    variant = draw(st.sampled_from(["plain", "fortran", "big-endian", "strided"]))
    given = want
    if variant == "fortran" and want.ndim >= 2:
        given = np.asfortranarray(want)
    elif variant == "big-endian" and dtype.itemsize > 1 and dtype != np.dtype(bfloat16):
        given = want.astype(dtype.newbyteorder(">"))
    elif variant == "strided" and want.ndim >= 1:
        doubled = np.repeat(want, 2, axis=-1)
        given = doubled[..., ::2]
    return given, want


def _truncate_utf8(text, limit):
    return text.encode("utf-8")[:limit].decode("utf-8", "ignore")


aprender_names = st.text(max_size=300).map(lambda s: _truncate_utf8(s, APRENDER_NAME_BYTES))
apr2_names = st.text(max_size=300)


def tensor_dicts(dtypes, names, max_dims=8, max_size=6):
    return st.dictionaries(names, arrays(dtypes, max_dims=max_dims), max_size=max_size)


json_scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)

apr2_metadata = st.dictionaries(st.text(max_size=12).filter(lambda k: k != "apr_version"), json_values,
                                max_size=5)

extra_keys = st.text(max_size=12).filter(lambda k: k not in TYPED_FIELDS and k != "apr_version")
u64 = st.integers(0, 2**64 - 1)
f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


def opt(strategy):
    return st.none() | strategy


aprender_typed = st.fixed_dictionaries({}, optional={
    "model_type": st.text(max_size=10),
    **{k: opt(st.text(max_size=16)) for k in STR_FIELDS + ALWAYS_NULL},
    **{k: opt(u64) for k in U64_FIELDS},
    **{k: opt(f32) for k in F32_FIELDS},
    "total_size": u64,
    "param_count": u64,
    "rope_type": opt(st.integers(0, 2**32 - 1)),
    "quantization": opt(st.fixed_dictionaries(
        {"quant_type": st.text(max_size=8), "bits": st.integers(0, 255), "symmetric": st.booleans()},
        optional={"block_size": opt(u64)})),
    "special_tokens": opt(st.fixed_dictionaries({}, optional={k: opt(st.text(max_size=8))
                                                              for k in SPECIAL_TOKENS})),
})


@st.composite
def aprender_metadata(draw):
    meta = dict(draw(aprender_typed))
    meta.update(draw(st.dictionaries(extra_keys, json_values, max_size=4)))
    return meta


# --- expectations -----------------------------------------------------------------
class F32(float):
    """An expected value that aprender stores as an f32 (compared after rounding to f32)."""


def expected_aprender_metadata(meta):
    out = {"model_type": meta.get("model_type", "")}
    for key in ALWAYS_NULL:
        out[key] = meta.get(key)
    out["total_size"] = meta.get("total_size", 0)
    out["param_count"] = meta.get("param_count", 0)
    for key, value in meta.items():
        if key in out:
            continue
        if key not in TYPED_FIELDS:  # custom keys keep whatever they hold, null included
            out[key] = value
        elif value is None:  # an unset optional field is left out
            continue
        elif key in F32_FIELDS:
            out[key] = F32(np.float32(value))
        elif key == "quantization":
            out[key] = {"quant_type": value["quant_type"], "bits": value["bits"],
                        "block_size": value.get("block_size"), "symmetric": value["symmetric"]}
        elif key == "special_tokens":
            out[key] = {k: value.get(k) for k in SPECIAL_TOKENS}
        else:
            out[key] = value
    return out


def sorted_keys(value):
    """The nested key order a serde_json Value map (a BTreeMap) is written in."""
    if isinstance(value, dict):
        return {k: sorted_keys(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [sorted_keys(v) for v in value]
    return None


def key_order(value):
    """``value``'s dict keys in iteration order, nested the same way as sorted_keys."""
    if isinstance(value, dict):
        return [(k, key_order(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [key_order(v) for v in value]
    return None


def as_ordered(order):
    if isinstance(order, dict):
        return [(k, as_ordered(v)) for k, v in order.items()]
    if isinstance(order, list):
        return [as_ordered(v) for v in order]
    return None


def expected_aprender_key_order(expected):
    typed = [k for k in FIELD_ORDER if k in expected]
    custom = sorted(k for k in expected if k not in TYPED_FIELDS)
    out = {}
    for key in typed:
        if key == "quantization":
            out[key] = {k: None for k in QUANTIZATION_ORDER}
        elif key == "special_tokens":
            out[key] = {k: None for k in SPECIAL_TOKENS}
        else:
            out[key] = None
    for key in custom:
        out[key] = sorted_keys(expected[key])
    return as_ordered(out)


def expected_apr2_metadata(meta):
    return {"apr_version": "2.0.0", **meta}


def same_json(got, want):
    """Equality that also tells 1, 1.0 and True apart and keeps the sign of zero."""
    if isinstance(want, F32):
        return type(got) is float and np.float32(got) == np.float32(want)
    if type(got) is not type(want):
        return False
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(same_json(got[k], want[k]) for k in want)
    if isinstance(want, list):
        return len(got) == len(want) and all(same_json(g, w) for g, w in zip(got, want))
    if isinstance(want, float):
        return got == want and math.copysign(1.0, got) == math.copysign(1.0, want)
    return got == want


def assert_same_array(got, want, name=None):
    assert isinstance(got, np.ndarray), (name, type(got))
    assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert np.array_equal(got.reshape(-1).view(np.uint8), want.reshape(-1).view(np.uint8)), name


def assert_same_tensors(got: dict, want: dict):
    assert set(got) == set(want)
    for name, array in want.items():
        assert_same_array(got[name], array, name)


def save_and_check(tensors, metadata, layout, expect_layout):
    """save() in ``layout``; every way of reading the bytes gives the tensors back.
    Returns the metadata as read."""
    inputs = {name: given for name, (given, _) in tensors.items()}
    want = {name: w for name, (_, w) in tensors.items()}
    data = aprfast.save(inputs, metadata, layout=layout)
    with aprfast.open(data) as f:
        assert f.layout == expect_layout
        f.verify()
        assert sorted(f.keys()) == sorted(want)
        for name, array in want.items():
            assert_same_array(f.get_tensor(name), array, name)
            assert_same_array(f.get_tensor(name, copy=True), array, name)
        got_metadata = f.stored_metadata
    assert_same_tensors(aprfast.load(data), want)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.apr")
        aprfast.save_file(inputs, path, metadata, layout=layout, durable=False)
        with open(path, "rb") as fh:
            assert fh.read() == data
        assert_same_tensors(aprfast.load_file(path, mmap=True), want)
        assert_same_tensors(aprfast.load_file(path, mmap=False), want)
        with aprfast.open(path, mode="pread") as f:
            for name, array in want.items():
                assert_same_array(f.get_tensor(name), array, name)
    return got_metadata


# --- round trips --------------------------------------------------------------------
@given(tensors=tensor_dicts(APRENDER_DTYPES, aprender_names), metadata=aprender_metadata())
def test_aprender_layout_round_trips_tensors_and_metadata_bit_for_bit(tensors, metadata):
    got = save_and_check(tensors, metadata, "aprender", "aprender")
    want = expected_aprender_metadata(metadata)
    assert same_json(got, want), (got, metadata)
    assert key_order(got) == expected_aprender_key_order(want)  # serde's field order, then sorted


@given(tensors=tensor_dicts(APR2_DTYPES, apr2_names), metadata=apr2_metadata)
def test_apr2_layout_round_trips_tensors_and_metadata_bit_for_bit(tensors, metadata):
    got = save_and_check(tensors, metadata, "apr2", "apr2")
    assert same_json(got, expected_apr2_metadata(metadata)), (got, metadata)
    assert key_order(got) == [("apr_version", None)] + as_ordered(sorted_keys(metadata))


@given(tensors=tensor_dicts(APR2_DTYPES, apr2_names),
       metadata=st.dictionaries(extra_keys, json_values, max_size=4))
def test_auto_layout_picks_aprender_whenever_it_can_hold_the_tensors(tensors, metadata):
    fits_aprender = all(w.dtype in AUTO_LAYOUT_DTYPES and len(name.encode("utf-8")) <= APRENDER_NAME_BYTES
                        for name, (_, w) in tensors.items())
    expect = "aprender" if fits_aprender else "apr2"
    got = save_and_check(tensors, metadata, "auto", expect)
    for key, value in metadata.items():
        assert same_json(got[key], value)


def test_aprender_optional_fields_given_as_none_are_dropped_but_provenance_is_null():
    meta = {"name": None, "hidden_size": None, "rope_theta": None, "license": None, "data_source": None,
            "data_license": None, "version": "1"}
    got = aprfast.open(aprfast.save({"x": np.zeros(2, np.float32)}, meta, layout="aprender")).stored_metadata
    assert got == {"model_type": "", "license": None, "data_source": None, "data_license": None,
                   "version": "1", "total_size": 0, "param_count": 0}
    assert list(got)[:4] == ["model_type", "license", "data_source", "data_license"]


def test_aprender_typed_fields_come_back_as_written():
    meta = {"model_type": "llama", "name": "m", "version": "0.1", "hidden_size": 4096, "num_layers": 32,
            "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "license": "MIT", "total_size": 7, "param_count": 9,
            "custom": {"b": [1, 2.5, None], "a": True}}
    got = aprfast.open(aprfast.save({"w": np.ones((2, 2), np.float16)}, meta, layout="aprender")).stored_metadata
    assert same_json(got, expected_aprender_metadata(meta))
    assert got["rope_theta"] == 10000.0 and type(got["hidden_size"]) is int
    assert np.float32(got["rms_norm_eps"]) == np.float32(1e-5)


# --- the writer never writes what the reader rejects -----------------------------------
any_metadata = st.dictionaries(st.text(max_size=12), json_values | st.floats() | st.tuples(st.integers()),
                               max_size=4)


@given(tensors=tensor_dicts(APR2_DTYPES + [np.dtype(np.complex64)], apr2_names, max_dims=12),
       metadata=st.one_of(any_metadata, aprender_metadata()),
       layout=st.sampled_from(["auto", "aprender", "apr2"]), alignment=st.sampled_from([64, 32]))
def test_writer_never_writes_a_file_the_reader_rejects(tensors, metadata, layout, alignment):
    inputs = {name: given for name, (given, _) in tensors.items()}
    try:
        data = aprfast.save(inputs, metadata, layout=layout, alignment=alignment)
    except LayoutError:
        return  # refusing is fine; writing something unreadable is not
    with aprfast.open(data) as f:
        f.verify()
        f.metadata
        for name in f.keys():
            f.get_tensor(name, copy=True)
    assert set(aprfast.load(data)) == set(inputs)


def test_nine_dimensional_tensor_is_refused_or_readable():
    # Minimal case of the property above: the apr2 writer stores up to 255 dims.
    tensors = {"x": np.zeros((1,) * 9, np.float32)}
    try:
        data = aprfast.save(tensors, layout="apr2")
    except LayoutError:
        return
    assert aprfast.load(data)["x"].shape == (1,) * 9


# --- deterministic bytes --------------------------------------------------------------
def _shuffled(value, rnd):
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: _shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rnd) for v in value]
    return value


@pytest.mark.parametrize("layout", ["aprender", "apr2", "auto"])
@settings(max_examples=40)
@given(tensors=tensor_dicts(APRENDER_DTYPES, aprender_names, max_size=8),
       metadata=st.dictionaries(extra_keys, json_values, max_size=6), rnd=st.randoms(use_true_random=False))
def test_same_bytes_whatever_the_dict_order(layout, tensors, metadata, rnd):
    inputs = {name: given for name, (given, _) in tensors.items()}
    first = aprfast.save(inputs, metadata, layout=layout)
    again = aprfast.save(_shuffled(inputs, rnd), _shuffled(metadata, rnd), layout=layout)
    assert again == first


def test_same_bytes_whatever_the_typed_metadata_order():
    meta = {"hidden_size": 8, "name": "n", "license": "x", "zeta": 1, "alpha": {"z": 1, "a": 2}}
    reordered = {"alpha": {"a": 2, "z": 1}, "zeta": 1, "license": "x", "name": "n", "hidden_size": 8}
    tensors = {"b": np.arange(3), "a": np.ones(2, np.float16)}
    for layout in ("aprender", "apr2"):
        assert aprfast.save(tensors, meta, layout=layout) == aprfast.save(
            dict(reversed(tensors.items())), reordered, layout=layout)


# --- packed and raw tensors -------------------------------------------------------------
@st.composite
def packed_tensors(draw, names):
    dtype = DTYPES[draw(st.sampled_from(names))]
    shape = draw(shapes(max_dims=3, max_elems=1024).filter(lambda s: len(s) <= 3))
    if len(shape) and draw(st.booleans()):
        shape = shape[:-1] + (draw(st.sampled_from([32, 256, 512])),)
    nbytes = dtype.nbytes(shape)
    data = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).bytes(nbytes)
    return aprfast.QuantizedTensor(dtype.name, shape, np.frombuffer(data, np.uint8))


def assert_same_quantized(got, want):
    assert type(got) is aprfast.QuantizedTensor
    assert got.dtype == want.dtype and got.shape == want.shape
    assert bytes(got.data) == bytes(want.data)


@pytest.mark.parametrize("layout,packed", [("aprender", APRENDER_PACKED), ("apr2", APR2_PACKED)])
@settings(max_examples=50)
@given(data=st.data())
def test_quantized_tensors_round_trip_with_identical_bytes(layout, packed, data):
    tensors = data.draw(st.dictionaries(st.text(max_size=20), packed_tensors(packed), max_size=4))
    blob = aprfast.save(tensors, layout=layout)
    with aprfast.open(blob) as f:
        assert f.layout == layout
        f.verify()
        for name, want in tensors.items():
            assert_same_quantized(f.get_tensor(name), want)
            assert_same_quantized(f.get_tensor(name, copy=True), want)
            assert f.info(name).dtype == want.dtype
    loaded = aprfast.load(blob)
    for name, want in tensors.items():
        assert_same_quantized(loaded[name], want)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "q.apr")
        aprfast.save_file(tensors, path, layout=layout, durable=False)
        for mmap in (True, False):
            loaded = aprfast.load_file(path, mmap=mmap)
            for name, want in tensors.items():
                assert_same_quantized(loaded[name], want)


def test_q4_k_tensor_round_trips_in_auto_layout():
    raw = bytes(range(256)) + bytes(32)  # 2 rows x 1 super-block x 144 bytes
    q = aprfast.QuantizedTensor("Q4_K", (2, 256), np.frombuffer(raw, np.uint8))
    blob = aprfast.save({"q": q})
    assert aprfast.open(blob).layout == "aprender"
    back = aprfast.load(blob)["q"]
    assert_same_quantized(back, q)
    assert bytes(back.data) == raw


def test_quantized_tensor_of_the_wrong_length_is_refused():
    with pytest.raises(LayoutError):
        aprfast.QuantizedTensor("Q4_K", (2, 256), np.zeros(287, np.uint8))


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_raw_tensor_of_an_elementwise_dtype_reads_back_as_an_array(layout):
    values = np.array([[1.5, -2.0], [np.nan, -0.0]], np.float32)
    raw = aprfast.RawTensor("F32", (2, 2), np.frombuffer(values.tobytes(), np.uint8))
    bf = np.array([1, 2, 3], bfloat16)
    raw_bf16 = aprfast.RawTensor("BF16", (3,), bf.view(np.uint8))
    loaded = aprfast.load(aprfast.save({"f": raw, "b": raw_bf16}, layout=layout))
    assert_same_array(loaded["f"], values)
    assert_same_array(loaded["b"], bf)
