#!/usr/bin/env python3
"""atheris target: the ONNX initializer reader (aprfast.convert.onnx.OnnxSource): what
aprfast does with what the onnx package parses (names, dims, dtypes, raw and typed data,
external data locations, offsets and lengths, metadata).  Skipped (every input passes)
where the onnx package is not installed.

    python tests/fuzz/fuzz_onnx.py --seeds OUT_DIR          # write the seed corpus
    python tests/fuzz/fuzz_onnx.py [libFuzzer flags] [CORPUS_DIR ...]

Inputs follow tests/fuzz/harness.py: a control byte, a param byte, then the model
(protobuf).  Control bits: 0x01 through ``aprfast.convert.open_source``; 0x02 also
``aprfast.convert`` to .apr (same bytes); 0x04 an external data file ``ext.bin``
(bytes 0..255, four times) lies beside the model; 0x08 the model is named ``m.<suffix>``
(``param`` picks one of SUFFIXES: .json, .textproto, .onnxtxt...), else ``m.onnx``.
Oracle: harness.run_one.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

DETECT, CONVERT, EXTERNAL, NAMED = 0x01, 0x02, 0x04, 0x08
#: NAMED: the model's file name ends with one of these (``param`` picks): a name must not
#: change how the bytes are parsed.
SUFFIXES = ("pb", "json", "textproto", "onnxtxt", "onnx", "bin", "txt", "model")
EXT_BYTES = bytes(range(256)) * 4


def _have_onnx() -> bool:
    try:
        import onnx  # noqa: F401
    except ImportError:
        return False
    return True


def target_onnx(data: bytes) -> None:
    if not _have_onnx():
        return
    import harness

    from aprfast.convert import onnx as conx
    from aprfast.convert import open_source

    control, param, body = harness.split(data)
    name = f"m.{SUFFIXES[param % len(SUFFIXES)]}" if control & NAMED else "m.onnx"
    files = {name: body}
    if control & EXTERNAL:
        files["ext.bin"] = EXT_BYTES
    path = os.path.join(harness.write_scratch(files), name)
    src = open_source(path) if control & DETECT else conx.OnnxSource(path)
    try:
        got = harness.drain_source(src)
    finally:
        src.close()
    if control & CONVERT:
        harness.convert_agrees(path, got, os.path.join(os.path.dirname(path), "out.apr"))


# --- seeds: models the onnx package writes ------------------------------------------------
def seeds() -> dict:
    """name -> (control, model bytes); {} without onnx."""
    if not _have_onnx():
        return {}
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    def model(initializers, sparse=(), **kwargs):
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                                  initializer=initializers, sparse_initializer=list(sparse))
        m = helper.make_model(graph, producer_name="aprfast-fuzz", doc_string="seed", **kwargs)
        helper.set_model_props(m, {"author": "fuzz", "k": "v"})
        return m.SerializeToString()

    raw = [numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "layer.0/weight"),
           numpy_helper.from_array(np.float16([1, -2]), "bias:0"),
           numpy_helper.from_array(np.int64([3, 4, 5]), "ids"),
           numpy_helper.from_array(np.array([True, False]), "mask"),
           numpy_helper.from_array(np.zeros((0, 2), np.float32), "empty"),
           numpy_helper.from_array(np.array(1.5, np.float64), "scalar")]
    typed = [helper.make_tensor("t.f32", TensorProto.FLOAT, [2, 2], [1.0, 2.0, 3.0, 4.0]),
             helper.make_tensor("t.i32", TensorProto.INT32, [3], [-1, 0, 1]),
             helper.make_tensor("t.u16", TensorProto.UINT16, [2], [7, 9]),
             helper.make_tensor("t.bf16", TensorProto.BFLOAT16, [2], [1.5, -2.0]),
             helper.make_tensor("t.f8", TensorProto.FLOAT8E4M3FN, [2], [1.0, -2.0]),
             helper.make_tensor("t.f4", TensorProto.FLOAT4E2M1, [3], [1.0, -2.0, 0.5])]
    external = TensorProto(name="ext.w", data_type=TensorProto.FLOAT, dims=[4])
    external.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "ext.bin"), ("offset", "16"), ("length", "16")):
        entry = external.external_data.add()
        entry.key, entry.value = key, value
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.float32([5.0]), "sp"),
                                       numpy_helper.from_array(np.int64([1]), "sp.idx"), [4])
    return {
        "raw": (0, model(raw)),
        "raw-convert": (DETECT | CONVERT, model(raw[:3])),
        "typed": (0, model(typed)),
        "external": (EXTERNAL, model([external, raw[1]])),
        "external-convert": (EXTERNAL | CONVERT, model([external])),
        "sparse": (DETECT, model(raw[:1], sparse=[sparse])),
        "named-pb": (NAMED | DETECT, model(raw[:2])),
        "empty": (0, model([])),
    }


def write_seeds(out_dir: str) -> int:
    import harness

    os.makedirs(out_dir, exist_ok=True)
    written = seeds()
    for name, (control, blob) in written.items():
        target_onnx(bytes([control, 0]) + blob)  # every seed reads as written (no refusal)
        target_onnx(bytes([control | CONVERT, 0]) + blob)
        harness.run_one(target_onnx, bytes([control, 0]) + blob)
        with open(os.path.join(out_dir, f"{name}-{control:02x}"), "wb") as f:
            f.write(bytes([control, 0]) + blob)
    return len(written)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--seeds":
        print(write_seeds(sys.argv[2]), "seeds")
        sys.exit(0)
    import fuzz

    fuzz.main("onnx", sys.argv)
