"""safetensors <-> .apr through aprfast.convert, proven with the safetensors package."""

import json
import os
import struct

import numpy as np
import pytest
import safetensors
from hypothesis import given, settings
from hypothesis import strategies as st

import aprfast
from aprfast.convert import DestinationExistsError
from aprfast.convert import safetensors as cst

# safetensors format code -> the name TensorSpec's constructor takes.
CTOR = {"BOOL": "bool", "I8": "int8", "U8": "uint8", "I16": "int16", "U16": "uint16", "I32": "int32",
        "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16", "F32": "float32", "F64": "float64",
        "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2": "float8_e5m2",
        "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu", "F4": "float4_e2m1fn_x2",
        "C64": "complex64"}
SIZE = {"BOOL": 1, "I8": 1, "U8": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8, "F16": 2,
        "F32": 4, "F64": 8, "BF16": 2, "F8_E4M3": 1, "F8_E4M3FNUZ": 1, "F8_E5M2": 1, "F8_E5M2FNUZ": 1,
        "F8_E8M0": 1, "C64": 8}


def st_write(path, tensors, metadata=None):
    """Write ``{name: (st_dtype, shape, bytes)}`` with the safetensors package itself."""
    keep, specs = [], {}
    for name, (dtype, shape, data) in tensors.items():
        buf = np.frombuffer(bytes(data), np.uint8).copy() if data else np.zeros(1, np.uint8)
        keep.append(buf)
        ctor_shape = list(shape)
        if dtype == "F4":  # the constructor takes the storage shape (two values per byte)
            ctor_shape[-1] //= 2
        specs[name] = safetensors.TensorSpec(dtype=CTOR[dtype], shape=ctor_shape, data_ptr=buf.ctypes.data,
                                             data_len=len(data))
    safetensors.serialize_file(specs, str(path), metadata=metadata)


def st_read(path):
    with open(path, "rb") as f:
        return {name: (v["dtype"], list(v["shape"]), bytes(v["data"])) for name, v in safetensors.deserialize(f.read())}


def apr_bytes(path):
    with aprfast.open(path) as f:
        out = {}
        for name in f.keys():
            t = f.get_tensor(name, copy=True)
            data = t.data.tobytes() if isinstance(t, aprfast.RawTensor) else np.ascontiguousarray(t).tobytes()
            out[name] = (f.info(name).dtype.name, list(f.info(name).shape), data)
        return out


def every_dtype(rng):
    out = {}
    for i, dtype in enumerate(CTOR):
        shape = [3, 4] if dtype != "F4" else [2, 6]
        n = 12 // 2 if dtype == "F4" else 12 * SIZE[dtype]
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        if dtype == "BOOL":
            data = bytes(b & 1 for b in data)
        out[f"t{i}.{dtype.lower()}"] = (dtype, shape, data)
    return out


def test_every_safetensors_dtype_converts_bit_identically_both_ways(tmp_path, rng):
    tensors = every_dtype(rng)
    st_write(tmp_path / "in.safetensors", tensors, metadata={"format": "pt", "note": "x"})
    aprfast.convert(tmp_path / "in.safetensors", tmp_path / "m.apr")
    got = apr_bytes(tmp_path / "m.apr")
    for name, (dtype, shape, data) in tensors.items():
        assert got[name][1:] == (shape, data), name
        assert got[name][0] == cst.ST_DTYPES[dtype]
    with aprfast.open(tmp_path / "m.apr") as f:
        assert f.metadata["format"] == "pt" and f.metadata["note"] == "x"
    aprfast.convert(tmp_path / "m.apr", tmp_path / "out.safetensors")
    assert st_read(tmp_path / "out.safetensors") == tensors
    with safetensors.safe_open(str(tmp_path / "out.safetensors"), "np") as f:
        assert f.metadata() == {"format": "pt", "note": "x"}


def test_numpy_api_files_load_identically(tmp_path, rng):
    import safetensors.numpy as sn
    tensors = {"w": rng.standard_normal((64, 32)).astype(np.float32), "b": rng.standard_normal(7),
               "i": rng.integers(-5, 5, (2, 3, 4)).astype(np.int16), "e": np.zeros((0, 3), np.float16)}
    sn.save_file(tensors, tmp_path / "a.safetensors")
    aprfast.convert(tmp_path / "a.safetensors", tmp_path / "a.apr")
    loaded = aprfast.load_file(tmp_path / "a.apr")
    for k, v in tensors.items():
        assert loaded[k].dtype == v.dtype and loaded[k].shape == v.shape and loaded[k].tobytes() == v.tobytes()
    aprfast.convert(tmp_path / "a.apr", tmp_path / "b.safetensors")
    back = sn.load_file(tmp_path / "b.safetensors")
    assert {k: v.tobytes() for k, v in back.items()} == {k: v.tobytes() for k, v in tensors.items()}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(SIZE)), st.lists(st.integers(0, 5), max_size=3)),
                min_size=0, max_size=5), st.integers(0, 2**32 - 1))
def test_roundtrip_property(tmp_path_factory, entries, seed):
    rng = np.random.default_rng(seed)
    d = tmp_path_factory.mktemp("rt")
    tensors = {}
    for i, (dtype, shape) in enumerate(entries):
        n = int(np.prod(shape, dtype=np.int64)) * SIZE[dtype]
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        tensors[f"n{i}"] = (dtype, shape, bytes(b & 1 for b in data) if dtype == "BOOL" else data)
    st_write(d / "a.safetensors", tensors)
    # random bit patterns hold NaN and Inf: what is tested is the bytes, not the values
    aprfast.convert(d / "a.safetensors", d / "a.apr", validate="off")
    aprfast.convert(d / "a.apr", d / "b.safetensors", validate="off")
    assert st_read(d / "b.safetensors") == tensors


def test_apr_metadata_values_are_json_encoded_for_safetensors_and_decoded_back(tmp_path):
    meta = {"name": "demo", "layers": 12, "ratio": 0.5, "flags": [1, 2], "nested": {"a": None}, "ok": True}
    aprfast.save_file({"x": np.ones(3, np.float32)}, tmp_path / "a.apr", metadata=meta, layout="apr2")
    aprfast.convert(tmp_path / "a.apr", tmp_path / "a.safetensors")
    with safetensors.safe_open(str(tmp_path / "a.safetensors"), "np") as f:
        raw = f.metadata()
    assert raw["name"] == "demo" and raw["layers"] == "12" and json.loads(raw["nested"]) == {"a": None}
    assert json.loads(raw[cst.JSON_KEYS]) == sorted(["layers", "ratio", "flags", "nested", "ok"])
    aprfast.convert(tmp_path / "a.safetensors", tmp_path / "b.apr")
    with aprfast.open(tmp_path / "b.apr") as f:
        for k, v in meta.items():
            assert f.metadata[k] == v


# --- sharded checkpoints ---------------------------------------------------------------
def make_sharded(d, rng, n_shards=3):
    d.mkdir(exist_ok=True)
    weight_map, expected = {}, {}
    for s in range(n_shards):
        name = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        tensors = {}
        for j in range(2):
            data = rng.standard_normal((4, 8)).astype(np.float32).tobytes()
            tensors[f"layer{s}.w{j}"] = ("F32", [4, 8], data)
            weight_map[f"layer{s}.w{j}"] = name
        st_write(d / name, tensors, metadata={"format": "pt"})
        expected.update(tensors)
    (d / cst.INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": 768}, "weight_map": weight_map}))
    return expected


@pytest.mark.parametrize("via", ["dir", "index"])
def test_sharded_checkpoint_reads_as_one_model(tmp_path, rng, via):
    expected = make_sharded(tmp_path / "ckpt", rng)
    src = tmp_path / "ckpt" if via == "dir" else tmp_path / "ckpt" / cst.INDEX_NAME
    aprfast.convert(src, tmp_path / "m.apr")
    got = apr_bytes(tmp_path / "m.apr")
    assert {k: (cst.ST_DTYPES[v[0]], v[1], v[2]) for k, v in expected.items()} == got


def test_sharded_refuses_missing_shard(tmp_path, rng):
    make_sharded(tmp_path / "c", rng)
    os.remove(tmp_path / "c" / "model-00002-of-00003.safetensors")
    with pytest.raises(aprfast.CorruptError, match="missing"):
        aprfast.convert(tmp_path / "c", tmp_path / "m.apr")
    assert not (tmp_path / "m.apr").exists()


def test_sharded_refuses_tensor_in_two_shards(tmp_path, rng):
    make_sharded(tmp_path / "c", rng)
    st_write(tmp_path / "c" / "model-00002-of-00003.safetensors",
             {"layer1.w0": ("F32", [1], b"\0" * 4), "layer1.w1": ("F32", [1], b"\0" * 4),
              "layer0.w0": ("F32", [1], b"\0" * 4)})
    with pytest.raises(aprfast.CorruptError, match="two shards|maps it"):
        aprfast.convert(tmp_path / "c", tmp_path / "m.apr")


@pytest.mark.parametrize("bad", ["../x.safetensors", "/etc/passwd", "sub/x.safetensors"])
def test_sharded_refuses_shard_names_outside_the_directory(tmp_path, bad):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / cst.INDEX_NAME).write_text(json.dumps({"weight_map": {"a": bad}}))
    with pytest.raises(aprfast.CorruptError, match="plain file name"):
        aprfast.convert(tmp_path / "c", tmp_path / "m.apr")


def test_export_sharded_like_transformers(tmp_path, rng):
    tensors = {f"l{i}.w": rng.standard_normal((16, 16)).astype(np.float32) for i in range(5)}  # 1 KiB each
    aprfast.save_file(tensors, tmp_path / "m.apr")
    aprfast.convert(tmp_path / "m.apr", tmp_path / "out", max_shard_size=2500)
    names = sorted(os.listdir(tmp_path / "out"))
    assert names == sorted([cst.INDEX_NAME] + [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)])
    index = json.loads((tmp_path / "out" / cst.INDEX_NAME).read_text())
    assert index["metadata"]["total_size"] == 5 * 1024  # transformers' key; aprfast adds the shard checks
    assert set(index["metadata"][cst.SHARD_CHECKS]) == set(names) - {cst.INDEX_NAME}
    assert list(index["weight_map"]) == sorted(tensors)
    import safetensors.numpy as sn
    loaded = {}
    for shard in set(index["weight_map"].values()):
        part = sn.load_file(tmp_path / "out" / shard)
        assert all(index["weight_map"][k] == shard for k in part)
        loaded.update(part)
    assert {k: v.tobytes() for k, v in loaded.items()} == {k: v.tobytes() for k, v in tensors.items()}
    aprfast.convert(tmp_path / "out", tmp_path / "back.apr")  # and it reads back as one model
    assert set(aprfast.load_file(tmp_path / "back.apr")) == set(tensors)
    with pytest.raises(DestinationExistsError):
        aprfast.convert(tmp_path / "m.apr", tmp_path / "out", max_shard_size=2500)
    aprfast.convert(tmp_path / "m.apr", tmp_path / "out", max_shard_size="2.5KB", force=True)


def test_one_shard_is_model_safetensors(tmp_path):
    aprfast.save_file({"a": np.ones(4, np.float32)}, tmp_path / "m.apr")
    aprfast.convert(tmp_path / "m.apr", tmp_path / "out", max_shard_size="5GB")
    assert os.listdir(tmp_path / "out") == ["model.safetensors"]


def test_parse_size():
    assert cst.parse_size("5GB") == 5 * 10**9 and cst.parse_size("2GiB") == 2 << 30 and cst.parse_size(7) == 7
    with pytest.raises(ValueError):
        cst.parse_size("lots")


# --- tokenizer.json ------------------------------------------------------------------
def test_sibling_tokenizer_is_embedded(tmp_path):
    st_write(tmp_path / "model.safetensors", {"a": ("F32", [1], b"\0" * 4)})
    tok = {"model": {"type": "BPE", "vocab": {"hello": 0, "world": 1, "<s>": 2}, "merges": ["h e"]},
           "added_tokens": [{"id": 3, "content": "</s>", "special": True},
                            {"id": 2, "content": "<s>", "special": True}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": {"content": "</s>"}}))
    aprfast.convert(tmp_path / "model.safetensors", tmp_path / "m.apr")
    with aprfast.open(tmp_path / "m.apr") as f:
        m = f.metadata
    assert m["tokenizer.vocabulary"] == ["hello", "world", "<s>", "</s>"]
    assert m["tokenizer.vocab_size"] == 4 and m["tokenizer.model_type"] == "BPE"
    assert m["tokenizer.bos_token_id"] == 2 and m["tokenizer.eos_token_id"] == 3
    assert m["tokenizer.special_token_ids"] == {"</s>": 3, "<s>": 2}


def test_hostile_tokenizer_ids_are_refused(tmp_path):
    st_write(tmp_path / "model.safetensors", {"a": ("F32", [1], b"\0" * 4)})
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 10**12}}}))
    with pytest.raises(aprfast.CorruptError, match="id below"):
        aprfast.convert(tmp_path / "model.safetensors", tmp_path / "m.apr")
    aprfast.convert(tmp_path / "model.safetensors", tmp_path / "m.apr", tokenizer=False)


# --- export refusals -----------------------------------------------------------------
def test_quantized_tensors_cannot_go_to_safetensors_unless_dequantized(tmp_path, rng):
    q = aprfast.quantize(rng.standard_normal((2, 64)).astype(np.float32), "Q8_0")
    aprfast.save_file({"q": q}, tmp_path / "q.apr")
    with pytest.raises(aprfast.LayoutError, match="safetensors cannot hold Q8_0"):
        aprfast.convert(tmp_path / "q.apr", tmp_path / "q.safetensors")
    assert not (tmp_path / "q.safetensors").exists()
    aprfast.convert(tmp_path / "q.apr", tmp_path / "q.safetensors", precision="f32")
    import safetensors.numpy as sn
    assert np.array_equal(sn.load_file(tmp_path / "q.safetensors")["q"], aprfast.dequantize(q))


# --- hostile headers -----------------------------------------------------------------
def header_file(path, header, data=b"", length=None):
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)
    return path


ENTRY = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize("header,data,length,error,match", [
    ({"a": ENTRY}, b"\0" * 7, None, aprfast.CorruptError, "cover"),                     # truncated data
    ({"a": ENTRY}, b"\0" * 8, 10**6, aprfast.CorruptError, "past the end"),             # lying length
    ({"a": ENTRY}, b"\0" * 8, 2**63, aprfast.LimitError, "limit"),                      # huge length
    ({"a": {**ENTRY, "data_offsets": [0, 12]}}, b"\0" * 12, None, aprfast.CorruptError, "needs 8 bytes"),
    ({"a": {**ENTRY, "shape": [2**40, 2**40]}}, b"", None, aprfast.LimitError, "2\\*\\*62"),
    ({"a": {**ENTRY, "shape": [-2]}}, b"", None, aprfast.CorruptError, "non-negative"),
    ({"a": {**ENTRY, "shape": [True, 2]}}, b"", None, aprfast.CorruptError, "non-negative"),
    # a dtype aprfast lacks travels as bytes (tests/test_unknown_dtypes.py); a bad name does not
    ({"a": {**ENTRY, "dtype": 7}}, b"\0" * 8, None, aprfast.CorruptError, "not a string"),
    ({"a": {**ENTRY, "dtype": "F" * 65}}, b"\0" * 8, None, aprfast.CorruptError, "not a dtype name"),
    ({"a": ENTRY, "b": ENTRY}, b"\0" * 8, None, aprfast.CorruptError, "overlaps"),
    ({"a": {**ENTRY, "data_offsets": [8, 16]}}, b"\0" * 16, None, aprfast.CorruptError, "gap"),
    ({"a": {**ENTRY, "data_offsets": [8, 0]}}, b"", None, aprfast.CorruptError, "begin <= end"),
    ({"__metadata__": {"a": 1}}, b"", None, aprfast.CorruptError, "string values"),
    (b'{"a": 1, "a": 2}', b"", None, aprfast.CorruptError, "twice"),
    (b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}", b"", None, aprfast.CorruptError, "JSON"),
    (b'{"a": "\xff"}', b"", None, aprfast.CorruptError, "UTF-8"),
    (b"[1, 2, 3, 4, 5]", b"", None, aprfast.CorruptError, "not an object"),
])
def test_hostile_headers_raise_typed_errors(tmp_path, header, data, length, error, match):
    path = header_file(tmp_path / "bad.safetensors", header, data, length)
    with pytest.raises(error, match=match):
        _open(path)
    with pytest.raises(aprfast.AprError):
        aprfast.convert(path, tmp_path / "m.apr", to="apr")
    assert not (tmp_path / "m.apr").exists()


def _open(path):
    src = cst.SafetensorsSource(path)
    src.close()
    raise AssertionError("accepted a hostile header")


def test_truncated_length_prefix(tmp_path):
    (tmp_path / "t.safetensors").write_bytes(b"\x10\0\0")
    with pytest.raises(aprfast.CorruptError, match="header length"):
        cst.SafetensorsSource(tmp_path / "t.safetensors")


def test_every_truncation_and_header_byte_flip_is_a_typed_error_or_a_clean_read(tmp_path):
    st_write(tmp_path / "a.safetensors", {"a": ("F32", [2, 2], bytes(range(16))), "b": ("BF16", [3], b"\1" * 6)},
             metadata={"k": "v"})
    data = (tmp_path / "a.safetensors").read_bytes()
    bad = tmp_path / "bad.safetensors"
    n = struct.unpack("<Q", data[:8])[0]
    cases = [data[:k] for k in range(len(data))]
    cases += [data[:i] + bytes([data[i] ^ 0x41]) + data[i + 1:] for i in range(8 + n)]
    refused = 0
    for case in cases:
        bad.write_bytes(case)
        try:
            src = cst.SafetensorsSource(bad)
        except aprfast.AprError:
            refused += 1
            continue
        try:
            for spec in src.specs:
                src.read(spec)
        finally:
            src.close()
    assert refused >= len(data)  # every truncation is refused; flips may yield another valid header


@pytest.mark.parametrize("index", ['{"weight_map": []}', '{"metadata": {}}', '[1]', '{"weight_map": {"a": 1}}'])
def test_index_without_a_weight_map_is_refused(tmp_path, index):
    (tmp_path / cst.INDEX_NAME).write_text(index)
    with pytest.raises(aprfast.FormatError, match="weight_map|unrecognised"):
        aprfast.convert(tmp_path / cst.INDEX_NAME, tmp_path / "m.apr")


def test_max_shard_size_with_a_model_safetensors_name_writes_beside_it(tmp_path, rng):
    """issue 26 item 5: the shards go beside out/model.safetensors, not in a directory
    called model.safetensors; one shard is that file itself."""
    tensors = {f"l{i}.w": rng.standard_normal((16, 16)).astype(np.float32) for i in range(5)}
    aprfast.save_file(tensors, tmp_path / "m.apr")
    aprfast.convert(tmp_path / "m.apr", tmp_path / "out" / "model.safetensors", max_shard_size=2500)
    assert sorted(os.listdir(tmp_path / "out")) == \
        sorted([cst.INDEX_NAME] + [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)])
    aprfast.convert(tmp_path / "out" / cst.INDEX_NAME, tmp_path / "back.apr")
    assert {k: v.tobytes() for k, v in aprfast.load_file(tmp_path / "back.apr").items()} == \
        {k: v.tobytes() for k, v in tensors.items()}
    with pytest.raises(FileExistsError):  # the set is there: refused unless force
        aprfast.convert(tmp_path / "m.apr", tmp_path / "out" / "model.safetensors", max_shard_size=2500)
    aprfast.convert(tmp_path / "m.apr", tmp_path / "one" / "model.safetensors", max_shard_size="1GB")
    assert os.listdir(tmp_path / "one") == ["model.safetensors"]
    assert os.path.isfile(tmp_path / "one" / "model.safetensors")


def test_max_shard_size_refuses_another_safetensors_name(tmp_path, rng):
    aprfast.save_file({"w": rng.standard_normal((16, 16)).astype(np.float32)}, tmp_path / "m.apr")
    with pytest.raises(ValueError, match="transformers' names"):
        aprfast.convert(tmp_path / "m.apr", tmp_path / "out" / "weights.safetensors", max_shard_size=100)
    assert not os.path.exists(tmp_path / "out")
