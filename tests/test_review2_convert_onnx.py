"""Review 2026-11 N16: ONNX text fields that are not valid UTF-8 (protobuf hands them over
as bytes) are a typed FormatError naming the field, never a TypeError."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx package (aprfast[onnx]) is not installed")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import aprfast  # noqa: E402
from aprfast.convert import onnx as conx  # noqa: E402
from aprfast.errors import FormatError  # noqa: E402

MARK = "QQQQ"


def model_bytes(initializer_name=MARK, producer="aprfast-test", prop=None) -> bytes:
    tensor = numpy_helper.from_array(np.arange(4, dtype=np.float32), initializer_name)
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], initializer=[tensor])
    model = helper.make_model(graph, producer_name=producer)
    if prop is not None:
        entry = model.metadata_props.add()
        entry.key, entry.value = prop
    return model.SerializeToString()


def with_invalid_utf8(data: bytes) -> bytes:
    """The marker (4 ASCII bytes) replaced, same length, by bytes that are not UTF-8."""
    assert data.count(MARK.encode()) == 1
    return data.replace(MARK.encode(), b"\x99\x98\xff\xfe")


@pytest.mark.parametrize("where, kwargs, match", [
    ("initializer name", {}, r"initializer name b'\\x99\\x98\\xff\\xfe' is not valid UTF-8"),
    ("producer name", {"initializer_name": "w", "producer": MARK}, r"producer_name b'\\x99"),
    ("metadata_props value", {"initializer_name": "w", "prop": ("k", MARK)}, r"metadata_props 'k'"),
])
def test_non_utf8_text_is_a_typed_format_error(tmp_path, where, kwargs, match):
    path = tmp_path / "m.onnx"
    path.write_bytes(with_invalid_utf8(model_bytes(**kwargs)))
    with pytest.raises(FormatError, match=match):
        aprfast.convert(path, tmp_path / "o.apr")
    assert not (tmp_path / "o.apr").exists()


def test_the_reviewers_input_is_a_typed_error(tmp_path):
    import os
    src = "/work/shared/reviews/2026-11/onnx-nonutf8-name-typeerror.onnx"
    if not os.path.exists(src):
        pytest.skip("the review's input file is not on this machine")
    with pytest.raises(FormatError, match=r"b'\\x99'"):
        aprfast.convert(src, tmp_path / "o.apr")


def test_normalise_name_refuses_bytes():
    with pytest.raises(FormatError, match=r"b'/a/b'"):
        conx.normalise_name(b"/a/b")
    assert conx.normalise_name("/a/b") == "a.b"


def test_valid_names_still_convert(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(model_bytes(initializer_name="/enc/w"))
    aprfast.convert(path, tmp_path / "o.apr")
    np.testing.assert_array_equal(aprfast.load_file(tmp_path / "o.apr")["enc.w"], np.arange(4, dtype=np.float32))
