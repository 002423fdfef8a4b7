"""ONNX initializers -> .apr (issue 12 part 6), proven with files the onnx package writes.

The oracle for every value is ``onnx.numpy_helper.to_array`` of the same initializer."""

import os
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx package (aprfast[onnx]) is not installed")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import aprfast  # noqa: E402
from aprfast.convert import detect, open_source  # noqa: E402
from aprfast.convert import onnx as conx  # noqa: E402
from aprfast.errors import AprError, CorruptError, UnknownDTypeError  # noqa: E402

ml_dtypes = pytest.importorskip("ml_dtypes")

# ONNX type -> a few values to write through the typed fields (helper.make_tensor).
TYPED = {TensorProto.FLOAT: [1.5, -2.25, 3e10, 0.0], TensorProto.DOUBLE: [1.5, -2.25, 1e300, 0.0],
         TensorProto.FLOAT16: [1.5, -2.25, 65504.0, 0.0], TensorProto.BFLOAT16: [1.5, -2.25, 3e38, 0.0],
         TensorProto.INT8: [-128, 127, 0, 5], TensorProto.UINT8: [0, 255, 7, 9],
         TensorProto.INT16: [-32768, 32767, 0, 1], TensorProto.UINT16: [0, 65535, 1, 2],
         TensorProto.INT32: [-(2 ** 31), 2 ** 31 - 1, 0, 3], TensorProto.UINT32: [0, 2 ** 32 - 1, 4, 5],
         TensorProto.INT64: [-(2 ** 63), 2 ** 63 - 1, 0, 6], TensorProto.UINT64: [0, 2 ** 64 - 1, 8, 9],
         TensorProto.BOOL: [True, False, True, True], TensorProto.COMPLEX64: [1 + 2j, -3j, 0, 4],
         TensorProto.COMPLEX128: [1 + 2j, -3j, 0, 4], TensorProto.FLOAT8E4M3FN: [1.0, -2.0, 448.0, 0.0],
         TensorProto.FLOAT8E4M3FNUZ: [1.0, -2.0, 240.0, 0.0], TensorProto.FLOAT8E5M2: [1.0, -2.0, 57344.0, 0.0],
         TensorProto.FLOAT8E5M2FNUZ: [1.0, -2.0, 57344.0, 0.0], TensorProto.FLOAT8E8M0: [1.0, 2.0, 0.5, 4.0],
         TensorProto.FLOAT4E2M1: [1.0, -2.0, 0.5, 6.0]}


def make_model(initializers, **kwargs):
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], initializer=initializers)
    return helper.make_model(graph, producer_name="aprfast-test", **kwargs)


def expected_bytes(tensor, base_dir="") -> bytes:
    """What .apr must hold for an initializer: onnx's own decoding, as stored bytes
    (FLOAT4E2M1 packed two per byte, low nibble first, as ONNX's raw_data packs it)."""
    array = np.ascontiguousarray(numpy_helper.to_array(tensor, base_dir)).reshape(-1)
    if tensor.data_type == TensorProto.FLOAT4E2M1:
        codes = array.view(np.uint8) & 0x0F
        codes = np.concatenate([codes, np.zeros(codes.size % 2, np.uint8)])
        return (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8).tobytes()
    return array.tobytes()


def stored_bytes(f, name) -> bytes:
    value = f.get_tensor(name)
    if isinstance(value, (aprfast.RawTensor, aprfast.QuantizedTensor)):
        value = value.data
    return np.asarray(value).tobytes()


def convert_and_check(tmp_path, model_path, initializers, base_dir=""):
    aprfast.convert(model_path, tmp_path / "m.apr")
    with aprfast.open(tmp_path / "m.apr") as f:
        assert sorted(f.keys()) == sorted(conx.normalise_name(t.name) for t in initializers)
        for t in initializers:
            name = conx.normalise_name(t.name)
            assert tuple(f.info(name).shape) == tuple(t.dims), name
            assert stored_bytes(f, name) == expected_bytes(t, base_dir), name


@pytest.mark.parametrize("data_type", sorted(TYPED), ids=lambda t: TensorProto.DataType.Name(t))
@pytest.mark.parametrize("raw", [False, True], ids=["typed-fields", "raw_data"])
def test_every_dtype_round_trips_bit_for_bit(tmp_path, data_type, raw):
    values = TYPED[data_type]
    tensors = [helper.make_tensor("t", data_type, [2, 2], values), helper.make_tensor("empty", data_type, [0, 3], []),
               helper.make_tensor("scalar", data_type, [], values[:1])]
    if raw:  # the same values re-encoded as raw_data by onnx itself
        tensors = [numpy_helper.from_array(numpy_helper.to_array(t), t.name) for t in tensors]
        assert all(t.HasField("raw_data") for t in tensors)
    onnx.save(make_model(tensors), tmp_path / "m.onnx")
    assert detect(tmp_path / "m.onnx") == "onnx"
    convert_and_check(tmp_path, tmp_path / "m.onnx", tensors)


def test_names_are_normalised(tmp_path):
    tensors = [numpy_helper.from_array(np.ones((2, 2), np.float32), "/encoder/conv1/weight"),
               numpy_helper.from_array(np.zeros(3, np.float32), "decoder/fc/bias"),
               numpy_helper.from_array(np.zeros(1, np.int64), "onnx::MatMul_42")]
    onnx.save(make_model(tensors), tmp_path / "m.onnx")
    aprfast.convert(tmp_path / "m.onnx", tmp_path / "m.apr")
    with aprfast.open(tmp_path / "m.apr") as f:
        assert sorted(f.keys()) == ["decoder.fc.bias", "encoder.conv1.weight", "onnx::MatMul_42"]


def test_names_that_normalise_to_one_are_refused(tmp_path):
    tensors = [numpy_helper.from_array(np.ones(2, np.float32), "/a/b"),
               numpy_helper.from_array(np.ones(2, np.float32), "a.b")]
    onnx.save(make_model(tensors), tmp_path / "m.onnx")
    with pytest.raises(CorruptError, match="both normalise to 'a.b'"):
        open_source(tmp_path / "m.onnx")


def test_model_metadata_is_kept_and_the_graph_is_not(tmp_path):
    model = make_model([numpy_helper.from_array(np.ones(2, np.float32), "w")], model_version=7,
                       doc_string="a test model")
    helper.set_model_props(model, {"author": "me", "license": "MIT"})
    onnx.save(model, tmp_path / "m.onnx")
    aprfast.convert(tmp_path / "m.onnx", tmp_path / "m.apr")
    with aprfast.open(tmp_path / "m.apr") as f:
        meta = f.metadata
    assert meta["onnx.producer_name"] == "aprfast-test" and meta["onnx.model_version"] == 7
    assert meta["onnx.doc_string"] == "a test model" and meta["onnx.graph_name"] == "g"
    assert meta["onnx.ir_version"] == model.ir_version
    assert meta["onnx.opset_import"] == {"ai.onnx": model.opset_import[0].version}
    assert meta["author"] == "me" and meta["license"] == "MIT"


@pytest.mark.parametrize("one_file", [True, False])
def test_external_data(tmp_path, one_file):
    rng = np.random.default_rng(3)
    tensors = [numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "/enc/w"),
               numpy_helper.from_array(rng.integers(-9, 9, 100).astype(np.int64), "/enc/idx"),
               numpy_helper.from_array(rng.standard_normal(7).astype(np.float16), "small")]
    model = make_model(tensors)
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=one_file,
              location="weights.bin", size_threshold=0)
    reloaded = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    assert all(t.data_location == TensorProto.EXTERNAL for t in reloaded.graph.initializer)
    convert_and_check(tmp_path, tmp_path / "m.onnx", list(reloaded.graph.initializer), str(tmp_path))
    # safetensors takes the external bytes by copy_file_range (raw_range)
    aprfast.convert(tmp_path / "m.onnx", tmp_path / "m.safetensors")
    with aprfast.open(tmp_path / "m.apr") as a:
        aprfast.convert(tmp_path / "m.safetensors", tmp_path / "back.apr")
        with aprfast.open(tmp_path / "back.apr") as b:
            for name in a.keys():
                assert stored_bytes(a, name) == stored_bytes(b, name)


def external_model(tmp_path, location, offset="0", length="8", data=b"\0" * 64):
    """A model whose one initializer (2 x f32) points at ``location``; the bytes are
    written by hand so that any location, offset and length can be tried."""
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "weights.bin").write_bytes(data)
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
    path = tmp_path / "model" / "m.onnx"
    path.write_bytes(make_model([tensor]).SerializeToString())
    return path


def test_external_data_offsets_are_honoured(tmp_path):
    data = np.arange(16, dtype=np.float32).tobytes()
    path = external_model(tmp_path, "weights.bin", offset="20", length="8", data=data)
    aprfast.convert(path, tmp_path / "m.apr")
    assert aprfast.load_file(tmp_path / "m.apr")["w"].tolist() == [5.0, 6.0]


@pytest.mark.parametrize("location, offset, length, match", [
    ("../secret.bin", "0", "8", "leaves the model's directory"),
    ("sub/../../secret.bin", "0", "8", "leaves the model's directory"),
    ("/etc/passwd", "0", "8", "not a relative path"),
    (".", "0", "8", "leaves the model's directory"),
    ("weights.bin", "60", "8", "run past the end"),
    ("weights.bin", "18446744073709551615", "8", "run past the end"),
    ("weights.bin", "-8", "8", "offset '-8' is not a non-negative integer"),
    ("weights.bin", "0", "12", "external length 12"),
    ("weights.bin", "0x10", "8", "not a non-negative integer"),
    ("", "0", "8", "without a location"),
])
def test_hostile_external_data_is_refused(tmp_path, location, offset, length, match):
    (tmp_path / "secret.bin").write_bytes(b"\x11" * 64)
    path = external_model(tmp_path, location, offset, length)
    with pytest.raises(CorruptError, match=match):
        aprfast.convert(path, tmp_path / "m.apr")
    assert not (tmp_path / "m.apr").exists()


def test_symlinks_out_of_the_model_directory_are_refused(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\x11" * 64)
    path = external_model(tmp_path, "link.bin")
    os.symlink(tmp_path / "secret.bin", tmp_path / "model" / "link.bin")
    with pytest.raises(CorruptError, match="leaves the model's directory"):
        open_source(path)


def test_missing_external_file(tmp_path):
    path = external_model(tmp_path, "nothere.bin")
    with pytest.raises(FileNotFoundError):
        open_source(path)
    with pytest.raises(AprError):
        open_source(path)


@pytest.mark.parametrize("data_type, name", [(TensorProto.STRING, "STRING"), (TensorProto.INT4, "INT4"),
                                             (TensorProto.UINT4, "UINT4")])
def test_types_aprfast_lacks_are_refused_by_name(tmp_path, data_type, name):
    values = [b"a", b"b"] if data_type == TensorProto.STRING else [1, 2]
    onnx.save(make_model([helper.make_tensor("t", data_type, [2], values)]), tmp_path / "m.onnx")
    with pytest.raises(UnknownDTypeError, match=f"ONNX {name} has no aprfast dtype"):
        open_source(tmp_path / "m.onnx")


def test_raw_data_of_the_wrong_size_is_refused(tmp_path):
    tensor = numpy_helper.from_array(np.ones(4, np.float32), "w")
    tensor.dims[0] = 5
    (tmp_path / "m.onnx").write_bytes(make_model([tensor]).SerializeToString())
    with pytest.raises(CorruptError, match="raw_data holds 16 bytes, F32 \\[5\\] needs 20"):
        open_source(tmp_path / "m.onnx")


def test_typed_data_of_the_wrong_count_is_refused(tmp_path):
    tensor = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    tensor.dims[0] = 3
    (tmp_path / "m.onnx").write_bytes(make_model([tensor]).SerializeToString())
    with pytest.raises(CorruptError, match="w"):
        aprfast.convert(tmp_path / "m.onnx", tmp_path / "m.apr")


def test_huge_dims_are_refused_before_any_allocation(tmp_path):
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1 << 40, 1 << 40], raw_data=b"")
    (tmp_path / "m.onnx").write_bytes(make_model([tensor]).SerializeToString())
    with pytest.raises(AprError, match="2\\*\\*62"):
        open_source(tmp_path / "m.onnx")


def test_truncated_models_are_typed_errors(tmp_path):
    tensors = [numpy_helper.from_array(np.arange(20, dtype=np.float32), "/a/w")]
    whole = make_model(tensors).SerializeToString()
    for cut in range(3, len(whole), 7):
        path = tmp_path / f"t{cut}.onnx"
        path.write_bytes(whole[:cut])
        try:
            src = open_source(path)
        except AprError:
            continue
        src.close()  # a cut that leaves a valid shorter message (protobuf has no end marker)


def test_a_missing_onnx_package_names_the_extra(tmp_path, monkeypatch):
    onnx.save(make_model([numpy_helper.from_array(np.ones(2, np.float32), "w")]), tmp_path / "m.onnx")
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx now raises ImportError
    with pytest.raises(ImportError, match=r"aprfast\[onnx\]"):
        open_source(tmp_path / "m.onnx")


def test_sparse_initializers_are_listed_not_converted(tmp_path):
    model = make_model([numpy_helper.from_array(np.ones(2, np.float32), "w")])
    values = numpy_helper.from_array(np.array([5.0], np.float32), "/sparse/v")
    indices = numpy_helper.from_array(np.array([1], np.int64), "/sparse/i")
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4]))
    onnx.save(model, tmp_path / "m.onnx")
    aprfast.convert(tmp_path / "m.onnx", tmp_path / "m.apr")
    with aprfast.open(tmp_path / "m.apr") as f:
        assert list(f.keys()) == ["w"]
        assert f.metadata["onnx.dropped_sparse_initializers"] == ["/sparse/v"]
