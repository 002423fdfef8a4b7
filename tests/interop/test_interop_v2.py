"""aprfast against apr-format 0.72.3 (aprender's own `.apr` code), v2 ``APR\\0`` layout.

Four kinds of check, each over the same tensor and metadata matrices:

a. aprender writes (``AprV2Writer``/``AprV2StreamingWriter``, via the harness) and aprfast
   reads: names, dtypes, shapes, offsets, sizes, sha256 of the bytes, F32 values, header
   and parsed metadata all equal what apr-format's reader reports.
b. aprfast writes (``layout="aprender"``) and apr-format reads: the same comparison.
c. Byte identity: for the same tensors (as raw bytes) and metadata, ``aprfast.save``
   equals ``AprV2Writer::write`` byte for byte.  Only when the output is deterministic:
   aprender's custom metadata keys live in a HashMap, so with two or more of them the
   order (and so the bytes) changes from run to run; those are compared as parsed JSON.
d. aprfast's spec layout (``layout="apr2"``, magic ``APR2``) is refused by apr-format,
   never misread.

The last section pins what apr-format can write that aprfast cannot represent, or
refuses on purpose; see the report in each test's docstring.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import aprfast
from aprfast.dtypes import APRENDER_IDS, DTYPES, bfloat16

META = {"model_type": "interop"}
GOLDEN_V2_SPEC = Path(__file__).parent / "harness" / "specs" / "golden_v2.json"

# ---------------------------------------------------------------------------------------
# Tensor cases: every dtype apr-format supports x shapes from 0-d to 8-d, including empty
# ---------------------------------------------------------------------------------------
ELEMENTWISE = ("F32", "F16", "BF16", "F64", "I32", "I64", "I8", "U8")
ELEMENTWISE_SHAPES = {
    "0d": [], "empty": [0], "empty-2d": [3, 0], "empty-mid": [2, 0, 5], "1d": [7], "2d": [2, 3],
    "3d": [2, 3, 4], "4d": [1, 2, 3, 2], "6d": [2, 1, 2, 1, 2, 1], "8d": [1, 2, 1, 2, 1, 2, 1, 3],
}
# GGML K-quants: blocks of 256 never span rows, so rows are whole super-blocks.
KQUANT_SHAPES = {
    "0d": [], "empty": [0], "empty-2d": [3, 0], "1row": [256], "2rows": [2, 256],
    "3d": [2, 1, 512], "8d": [1, 1, 1, 1, 1, 1, 2, 256],
}
# aprender's APR_Q4 blocks run across rows; APR_Q8 is one f32 scale + i8 per element.
APRQ_SHAPES = {
    "0d": [], "empty": [0], "empty-2d": [3, 0], "1d": [7], "one-block": [32], "rows-share-blocks": [3, 33],
    "3d": [2, 3, 4], "8d": [1, 2, 1, 2, 1, 2, 1, 3],
}


@dataclass(frozen=True)
class TensorCase:
    dtype: str  # aprfast's (= apr-format's Display) dtype name
    shape: tuple

    @property
    def id(self) -> str:
        return f"{self.dtype}-{'x'.join(map(str, self.shape)) or 'scalar'}"

    @property
    def raw(self) -> bytes:
        """Deterministic random bytes of the right size (NaN payloads and all)."""
        n = DTYPES[self.dtype].nbytes(self.shape)
        return np.random.default_rng(zlib.crc32(self.id.encode())).integers(0, 256, n, np.uint8).tobytes()

    def spec(self, name: str) -> dict:
        """The harness' raw form: ``AprV2Writer::add_tensor(name, dtype, shape, bytes)``."""
        return {"name": name, "shape": list(self.shape), "dtype": self.dtype, "data_hex": self.raw.hex()}

    def value(self):
        """The same tensor as aprfast takes it: an ndarray, or a QuantizedTensor if packed."""
        return tensor_value(self.dtype, self.shape, self.raw)


def tensor_value(dtype: str, shape, raw: bytes):
    d = DTYPES[dtype]
    if d.packed:
        return aprfast.QuantizedTensor(dtype, tuple(shape), np.frombuffer(raw, np.uint8))
    if dtype == "BF16":
        if bfloat16 is None:
            pytest.skip("bf16 arrays need ml_dtypes")
        np_dtype = np.dtype(bfloat16)
    else:
        np_dtype = np.dtype(d.numpy)
    return np.frombuffer(raw, np_dtype).reshape(shape)


TENSOR_CASES = (
    [TensorCase(d, tuple(s)) for d in ELEMENTWISE for s in ELEMENTWISE_SHAPES.values()]
    + [TensorCase(d, tuple(s)) for d in ("Q4_K", "Q6_K") for s in KQUANT_SHAPES.values()]
    + [TensorCase(d, tuple(s)) for d in ("APR_Q4", "APR_Q8") for s in APRQ_SHAPES.values()]
)
tensor_cases = pytest.mark.parametrize("case", TENSOR_CASES, ids=[c.id for c in TENSOR_CASES])

# ---------------------------------------------------------------------------------------
# Metadata cases (0 or 1 custom key: aprender's output is deterministic)
# ---------------------------------------------------------------------------------------
GOLDEN_META = {"model_type": "linear_regression", "name": "golden-v2", "version": "0.0.0-golden",
               "created_at": "1700000000", "param_count": 8}
CONTROL = "".join(chr(c) for c in range(0x20)) + "\x7f"
UNICODE_TEXT = f'naïve 中文 😀 \u2028\u2029 "quoted" back\\slash /slash {CONTROL} end'
ALL_TYPED = {
    "model_type": "qwen2", "name": "all-typed", "description": "every typed field", "author": "aprfast",
    "license": "Apache-2.0", "data_source": "teacher-only", "data_license": "CC-BY-4.0", "version": "1.2.3",
    "source": "hf://Qwen/Qwen2-0.5B", "original_format": "safetensors", "created_at": "2024-01-02T03:04:05Z",
    "total_size": 987654321, "param_count": 494032768,
    "quantization": {"quant_type": "q4_k", "bits": 4, "block_size": 256, "symmetric": False},
    "sharding": {"shard_count": 3, "shard_index": 1, "total_size": 12345, "pattern": "model-{:05d}.apr"},
    "chat_template": "{% for m in messages %}{{ m.content }}\n{% endfor %}", "chat_format": "chatml",
    "special_tokens": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
                       "im_start_token": "<|im_start|>", "im_end_token": "<|im_end|>"},
    "architecture": "qwen2", "hf_architecture": "Qwen2ForCausalLM", "hf_model_type": "qwen2",
    "hidden_size": 896, "num_layers": 24, "num_heads": 14, "num_kv_heads": 2, "vocab_size": 151936,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rope_type": 2,
    "rms_norm_eps": 1e-6, "head_dim": 64, "num_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 1408,
    "custom_note": "one custom key",
}
TYPED_FIELDS = set(ALL_TYPED) - {"custom_note"}
ALL_TYPED_UNSHARDED = {k: v for k, v in ALL_TYPED.items() if k != "sharding"}
METADATA_CASES = {
    "none": {},
    "model-type-only": {"model_type": "linear_regression"},
    "golden": GOLDEN_META,
    "all-typed-fields": ALL_TYPED,
    "provenance": {"model_type": "m", "license": "MIT", "data_source": "wikitext", "data_license": "CC0-1.0"},
    "name-description-author": {"model_type": "m", "name": "n", "description": "d", "author": "a"},
    "version-source-format-created": {"version": "0.1", "source": "local://x", "original_format": "gguf",
                                      "created_at": "1700000000"},
    "counts-u64-max": {"total_size": 2**64 - 1, "param_count": 2**64 - 1, "hidden_size": 2**64 - 1,
                       "rope_type": 2**32 - 1},
    "quantization-block-size": {"quantization": {"quant_type": "int8", "bits": 8, "block_size": 32,
                                                 "symmetric": True}},
    "quantization-no-block-size": {"quantization": {"quant_type": "int4", "bits": 4, "symmetric": False}},
    "chat-all-special-tokens": {"chat_template": "{{ bos_token }}", "chat_format": "llama2",
                                "special_tokens": ALL_TYPED["special_tokens"]},
    "chat-some-special-tokens": {"chat_template": "t", "special_tokens": {"eos_token": "</s>"}},
    "chat-no-special-tokens": {"special_tokens": {}},
    "transformer-config": {k: ALL_TYPED[k] for k in (
        "architecture", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "vocab_size",
        "intermediate_size", "max_position_embeddings", "rope_theta", "rope_type", "rms_norm_eps",
        "head_dim")},
    "moe": {"num_experts": 64, "num_experts_per_tok": 6, "moe_intermediate_size": 1024},
    "unicode-control-chars": {"model_type": UNICODE_TEXT, "name": UNICODE_TEXT, "chat_template": UNICODE_TEXT},
    "custom-string": {"model_type": "m", "tokenizer": UNICODE_TEXT},
    "custom-unicode-key": {"ключ 😀\n": "value"},
    "custom-empty-key": {"": ""},
    "custom-int-2**53+1": {"big": 2**53 + 1},
    "custom-int-2**63-1": {"big": 2**63 - 1},
    "custom-int-2**63": {"big": 2**63},
    "custom-int-2**64-1": {"big": 2**64 - 1},
    "custom-int--2**63": {"big": -(2**63)},
    "custom-float": {"lr": 0.1},
    "custom-float-tiny": {"x": 5e-324},
    "custom-float-huge": {"x": 1e300},
    "custom-float-1e16": {"x": 1e16},
    "custom-float-neg-zero": {"x": -0.0},
    "custom-float-integral": {"x": 3.0},
    "custom-bool": {"flag": True},
    "custom-null": {"nothing": None},
    "custom-list": {"tokens": ["<s>", "\x00", 1, -2, 2.5, None, False, [], {}]},
    # serde_json::Value objects are BTreeMaps: keys sorted by UTF-8 bytes at every level.
    "custom-nested-object": {"config": {"zeta": 1, "alpha": {"y": [{"b": 2, "a": 1}], "x": None},
                                        "É": 2, "E": 3, "é": {"ü": "u"}, "😀": 4, "\uffff": 5, "\ue000": 6,
                                        "": 7, "a\x00": 8, "a": 9}},
    "custom-empty-object": {"config": {}},
    "custom-hf-alias-key": {"num_hidden_layers": 12},
    # A typed field given as None is the same as leaving it out (the provenance trio: null).
    "typed-fields-none": {"model_type": "m", "name": None, "license": None, "hidden_size": None,
                          "rope_theta": None, "quantization": None, "special_tokens": None},
    "special-tokens-explicit-none": {"special_tokens": {"bos_token": None, "eos_token": "</s>"}},
}
metadata_cases = pytest.mark.parametrize("metadata", list(METADATA_CASES.values()), ids=list(METADATA_CASES))

# (input value, what serde_json writes for the f32).  "1e-06" is Python's own spelling.
F32_FIELD_CASES = [
    ("rope_theta", 10000.0, "10000.0"), ("rope_theta", 1e6, "1000000.0"), ("rope_theta", 500000.0, "500000.0"),
    ("rope_theta", 10000, "10000.0"), ("rope_theta", 1e13, "1e+13"), ("rope_theta", 123456789.0, "123456790.0"),
    ("rms_norm_eps", 1e-5, "0.00001"), ("rms_norm_eps", 1e-6, "0.000001"), ("rms_norm_eps", float("1e-06"), "0.000001"),
    ("rms_norm_eps", 1e-7, "1e-7"), ("rms_norm_eps", 0.1, "0.1"), ("rms_norm_eps", 1.401298464324817e-45, "1e-45"),
    ("rms_norm_eps", 3.4028234663852886e38, "3.4028235e+38"), ("rope_theta", -1.5, "-1.5"),
    # serde turns a JSON integer into f32 with one rounding (u64 as f32); through f64 first
    # it rounds twice, and this one lands on the other side of an f32 tie.
    ("rope_theta", 2**60 + 2**36 + 1, "1.1529216e+18"), ("rope_theta", 2**64 - 1, "1.8446744e+19"),
]

F32_FIELD_IDS = [f"{k}={v!r}" if not isinstance(v, int) or abs(v) < 2**53 else f"{k}=int-{t}"
                 for k, v, t in F32_FIELD_CASES]


# ---------------------------------------------------------------------------------------
# The comparison: one view of a file, built from either side
# ---------------------------------------------------------------------------------------
def sha256(data) -> str:
    return hashlib.sha256(bytes(data)).hexdigest()


def tensor_bytes(value) -> bytes:
    if isinstance(value, aprfast.RawTensor):
        return value.data.tobytes()
    return np.ascontiguousarray(value).tobytes()


def f32_json(x: np.float32):
    """The harness' spelling of an f32: exact f64 widening, or "NaN"/"inf"/"-inf"."""
    if np.isnan(x):
        return "NaN"
    if np.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(x)


def view_from_rust(report: dict) -> dict:
    """What apr-format's reader saw (``apr-interop read``), in a comparable form."""
    assert report["ok"], f"apr-format refused the file: {report}"
    h = report["header"]
    return {
        "header": {"magic": bytes.fromhex(h["magic_hex"]), "version": tuple(h["version"]),
                   "flags": h["flags"], "tensor_count": h["tensor_count"],
                   "metadata_offset": h["metadata_offset"], "metadata_size": h["metadata_size"],
                   "tensor_index_offset": h["tensor_index_offset"], "data_offset": h["data_offset"],
                   "header_crc32": h["checksum"], "file_size": report["file_size"]},
        "metadata": report["metadata"],
        "tensors": [{"name": t["name"], "dtype": t["dtype"], "dtype_id": t["dtype_id"],
                     "shape": t["shape"], "offset": t["offset"], "size": t["size"],
                     "sha256": t["sha256"], "f32": t["f32"]} for t in report["tensors"]],
    }


def view_from_aprfast(f: aprfast.AprFile) -> dict:
    """The same view, as aprfast reads the file."""
    h = f.header
    major, minor = h["version"].split(".")
    tensors = []
    for name in f.keys():
        info = f.info(name)
        value = f.get_tensor(name)
        tensors.append({
            "name": name, "dtype": info.dtype_name,
            # apr-format reports canonical ids (legacy 8/9 read as 128/129).
            "dtype_id": APRENDER_IDS.id_of(info.dtype) if info.dtype else info.dtype_id,
            "shape": list(info.shape), "offset": info.offset - h["data_offset"], "size": info.nbytes,
            "sha256": sha256(tensor_bytes(value)),
            "f32": [f32_json(x) for x in value.reshape(-1)] if info.dtype_name == "F32" else None,
        })
    return {
        "header": {"magic": {"APR\\0": b"APR\0"}.get(h["magic"], h["magic"]), "version": (int(major), int(minor)),
                   "flags": h["flags"], "tensor_count": h["tensor_count"],
                   "metadata_offset": h["metadata_offset"], "metadata_size": h["metadata_size"],
                   "tensor_index_offset": h["tensor_index_offset"], "data_offset": h["data_offset"],
                   "header_crc32": h["header_crc32"], "file_size": h["file_size"]},
        "metadata": f.stored_metadata,  # every stored key, as aprender reads them
        "tensors": tensors,
    }


def f32_fields_to_f32(metadata: dict) -> dict:
    """``metadata`` with rope_theta/rms_norm_eps rounded to f32, the type aprender holds them in."""
    return {k: float(np.float32(v)) if k in ("rope_theta", "rms_norm_eps") and v is not None else v
            for k, v in metadata.items()}


def assert_same_view(harness, data: bytes) -> dict:
    """apr-format and aprfast agree on everything in ``data``; return apr-format's report."""
    report = harness.read(data)
    rust = view_from_rust(report)
    assert report["header"]["checksum_ok"] and report["footer_crc_ok"], report
    assert report["required_file_len"] + 4 == report["file_size"], "apr-format sees a truncated file"
    with aprfast.open(data) as f:
        assert f.layout == "aprender"
        f.verify()
        ours = view_from_aprfast(f)
    assert ours["header"] == rust["header"]
    # f32 fields compared as f32: the harness re-parses its JSON with serde_json, whose
    # f64 parsing is not always correctly rounded ("1e-45" -> 1.0000000000000001e-45).
    assert f32_fields_to_f32(ours["metadata"]) == f32_fields_to_f32(rust["metadata"])
    assert ours["tensors"] == rust["tensors"]
    return report


def rust_file(harness, tensors, metadata=None, **options) -> bytes:
    return harness.write_v2_bytes({"metadata": META if metadata is None else metadata,
                                   "tensors": tensors, **options})


def sharded_flag_for(metadata) -> dict:
    """AprV2Writer sets SHARDED and QUANTIZED only when asked (with_sharding /
    set_header_flags); aprfast sets them whenever the metadata has a `sharding` or a
    `quantization` object.  The writer options that make the two match."""
    metadata = metadata or {}
    flags = (0x0010 if metadata.get("sharding") is not None else 0) | \
        (0x0020 if metadata.get("quantization") is not None else 0)
    return {"header_flags": flags} if flags else {}


def metadata_text(data: bytes) -> bytes:
    offset, size = struct.unpack_from("<QI", data, 12)
    return data[offset:offset + size]


# ---------------------------------------------------------------------------------------
# a. aprender writes, aprfast reads
# ---------------------------------------------------------------------------------------
@tensor_cases
def test_aprfast_reads_aprender_tensor(harness, case):
    data = rust_file(harness, [case.spec("tensor")])
    report = assert_same_view(harness, data)
    assert report["tensors"][0]["sha256"] == sha256(case.raw)


@tensor_cases
def test_aprfast_reads_aprender_streaming_writer_tensor(harness, case):
    data = rust_file(harness, [case.spec("tensor")], writer="streaming")
    assert_same_view(harness, data)


QUANTIZER_SHAPES = {"0d": [], "empty": [0], "empty-2d": [3, 0], "1d": [70], "2d": [2, 35], "rows-of-10": [7, 10],
                    "8d": [1, 2, 1, 2, 1, 2, 1, 3]}
QUANTIZER_KINDS = {"f32": "F32", "f16": "F16", "q8": "APR_Q8", "q4": "APR_Q4"}


def quantizer_input(shape) -> np.ndarray:
    n = int(np.prod(shape)) if shape else 1
    values = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 3
    # Values that exercise f16 rounding: overflow, subnormals, ties, signed zero.
    special = np.array([65520.0, -65504.0, 1e-8, 6e-8, 2049.0, 2051.0, -0.0, 0.1], np.float32)
    values[: min(n, len(special))] = special[: min(n, len(special))]
    return values


@pytest.mark.parametrize("writer", ["memory", "streaming"])
@pytest.mark.parametrize("kind", list(QUANTIZER_KINDS))
@pytest.mark.parametrize("shape", list(QUANTIZER_SHAPES.values()), ids=list(QUANTIZER_SHAPES))
def test_aprfast_reads_aprender_converters(harness, kind, writer, shape):
    """add_f32/add_f16/add_q8/add_q4_tensor output reads back as the dtype and bytes written."""
    values = quantizer_input(shape)
    data = rust_file(harness, [{"name": "t", "shape": shape, "f32_hex": values.tobytes().hex(), "as": kind}],
                     writer=writer)
    report = assert_same_view(harness, data)
    assert report["tensors"][0]["dtype"] == QUANTIZER_KINDS[kind]
    got = aprfast.load(data)["t"]
    if kind == "f32":
        assert got.tobytes() == values.tobytes()
    elif kind == "f16":  # apr-format 0.72 rounds with half::f16::from_f32 (IEEE round-to-nearest-even)
        with np.errstate(over="ignore"):
            assert got.tobytes() == values.astype(np.float16).tobytes()
    else:
        assert got.shape == tuple(shape) and got.nbytes == DTYPES[QUANTIZER_KINDS[kind]].nbytes(shape)


@metadata_cases
def test_aprfast_reads_aprender_metadata(harness, metadata):
    data = rust_file(harness, [{"name": "w", "shape": [2], "f32": [1.5, -2.5]}], metadata)
    report = assert_same_view(harness, data)
    # Nothing lost on the way: the stored text parses to what apr-format re-serializes.
    assert json.loads(metadata_text(data)) == report["metadata"]


@pytest.mark.parametrize("field, value, text", F32_FIELD_CASES, ids=F32_FIELD_IDS)
def test_aprfast_reads_aprender_f32_fields(harness, field, value, text):
    data = rust_file(harness, [], {"model_type": "llama", field: value})
    assert_same_view(harness, data)
    assert f'"{field}":{text}'.encode() in metadata_text(data)


def test_aprfast_reads_aprender_many_custom_keys(harness):
    """Several custom keys come out in HashMap order; the parsed metadata still agrees."""
    custom = {f"key_{i}": {"i": i, "name": f"v{i}", "list": [i, -i, i / 4]} for i in range(12)}
    data = rust_file(harness, [], {"model_type": "m", "name": "many", **custom})
    report = assert_same_view(harness, data)
    assert {k: report["metadata"][k] for k in custom} == custom


@pytest.mark.parametrize("count, index", [(1, 0), (4, 2), (100000, 99999)])
def test_aprfast_reads_aprender_sharded(harness, count, index):
    data = rust_file(harness, [{"name": "w", "shape": [3], "f32": [1, 2, 3]}], sharding=[count, index])
    report = assert_same_view(harness, data)
    assert report["header"]["flags"] & 0x10
    assert report["metadata"]["sharding"] == {"shard_count": count, "shard_index": index,
                                              "total_size": 0, "pattern": None}


# Sorted by UTF-8 bytes (= code points): "" < "\x00nul" < "B" < "a" < ... < "\uffff" < "😀".
ODD_NAMES = ["zeta", "", "B", "a", "a.b", "layer.10", "layer.9", "é", "😀", "\x00nul", "x" * 256, "\uffff"]


def zoo_specs() -> list:
    """One tensor of every dtype and some empty ones, under names that sort oddly."""
    cases = [TensorCase("F32", (2, 3)), TensorCase("F16", (5,)), TensorCase("BF16", (3, 1)), TensorCase("F64", ()),
             TensorCase("I32", (0,)), TensorCase("I64", (2, 2)), TensorCase("I8", (3, 0)), TensorCase("U8", (65,)),
             TensorCase("Q4_K", (2, 256)), TensorCase("Q6_K", (256,)), TensorCase("APR_Q4", (3, 33)),
             TensorCase("APR_Q8", (4, 4))]
    return [case.spec(name) for name, case in zip(ODD_NAMES, cases)]


@pytest.mark.parametrize("writer", ["memory", "streaming"])
def test_aprfast_reads_aprender_zoo(harness, writer):
    """All dtypes in one file.  The streaming writer keeps insertion order in the data
    section, so its index offsets are not monotonic; empty tensors share offsets."""
    data = rust_file(harness, zoo_specs(), writer=writer)
    report = assert_same_view(harness, data)
    assert [t["name"] for t in report["tensors"]] == sorted(ODD_NAMES[:12], key=lambda s: s.encode())
    offsets = [t["offset"] for t in report["tensors"]]
    assert (offsets == sorted(offsets)) == (writer == "memory")


@pytest.mark.parametrize("mode", ["mmap", "pread"])
def test_aprfast_loads_aprender_file_from_disk(harness, mode):
    """load_file (mmap views, or parallel pread with the footer CRC checked on the way)."""
    result, path = harness.write_v2({"metadata": ALL_TYPED, "tensors": zoo_specs(), "writer": "streaming"})
    assert result["ok"], result
    loaded = aprfast.load_file(path, mmap=mode == "mmap", verify=True)
    expected = {t["name"]: t["sha256"] for t in harness.read(path)["tensors"]}
    assert {name: sha256(tensor_bytes(value)) for name, value in loaded.items()} == expected


HEADER_FLAG_BITS = {"LZ4_COMPRESSED": 0x0001, "ZSTD_COMPRESSED": 0x0002, "ENCRYPTED": 0x0004, "SIGNED": 0x0008,
                    "SHARDED": 0x0010, "QUANTIZED": 0x0020, "HAS_FILTERBANK": 0x0040, "HAS_MODEL_CARD": 0x0080,
                    "STREAMING": 0x0100, "HAS_VOCAB": 0x0200, "undefined-0x1000": 0x1000, "undefined-0x8000": 0x8000}


@pytest.mark.parametrize("bits", list(HEADER_FLAG_BITS.values()), ids=list(HEADER_FLAG_BITS))
def test_aprfast_reads_aprender_header_flags(harness, bits):
    """Header flags set through AprV2Writer::set_header_flags (as stamp_provenance_bytes
    carries them over).  No v2 code applies any of them to the bytes, and apr-format's
    reader ignores all but LAYOUT_COLUMN_MAJOR, so aprfast must read these files too."""
    data = rust_file(harness, [{"name": "w", "shape": [2], "f32": [1, 2]}], header_flags=bits)
    report = assert_same_view(harness, data)
    assert report["header"]["flags"] == bits | 0x0400


def test_aprfast_reads_aprender_lz4_flag(harness):
    """with_lz4_compression() only sets flag 0x0001; nothing is compressed."""
    data = rust_file(harness, [{"name": "w", "shape": [3], "f32": [1, 2, 3]}], lz4_flag=True)
    assert_same_view(harness, data)
    assert aprfast.load(data)["w"].tolist() == [1, 2, 3]


def test_column_major_refused_by_both(harness):
    data = rust_file(harness, [{"name": "w", "shape": [1], "f32": [1]}], header_flags=0x0800)
    report = harness.read(data)
    assert not report["ok"] and "LAYOUT_COLUMN_MAJOR" in report["error"]
    with pytest.raises(aprfast.AprError):
        aprfast.open(data)


def _with_index_patched(data: bytes, patch) -> bytes:
    """Rewrite the tensor index with ``patch(index_bytes)``; fix the footer CRC."""
    index_offset, data_offset = struct.unpack_from("<QQ", data, 24)
    body = data[:index_offset] + patch(data[index_offset:data_offset]) + data[data_offset:-4]
    return body + struct.pack("<I", zlib.crc32(body))


def _with_header(data: bytes, fmt: str, offset: int, *values) -> bytes:
    """Patch header fields at ``offset``; fix the header checksum and the footer CRC."""
    header = bytearray(data[:64])
    struct.pack_into(fmt, header, offset, *values)
    struct.pack_into("<I", header, 40, zlib.crc32(bytes(header[44:64]), zlib.crc32(bytes(header[:40]))))
    body = bytes(header) + data[64:-4]
    return body + struct.pack("<I", zlib.crc32(body))


def test_aprfast_reads_pre_gh438_quant_ids(harness):
    """Files from before GH-438 store APR_Q4/APR_Q8 as 8/9; apr-format still reads them."""
    data = rust_file(harness, [TensorCase("APR_Q4", (40,)).spec("q4"), TensorCase("APR_Q8", (9,)).spec("q8")])

    def legacy_ids(index: bytes) -> bytes:
        # An entry is u16 name_len, name, u8 dtype, u8 ndim, ndim x u64, u64 offset, u64 size:
        # 30 bytes for a 2-byte name and one dim.
        assert index[4] == 128 and index[30 + 4] == 129
        patched = bytearray(index)
        patched[4], patched[30 + 4] = 8, 9
        return bytes(patched)

    legacy = _with_index_patched(data, legacy_ids)
    assert_same_view(harness, legacy)
    with aprfast.open(legacy) as f:
        assert [f.info(n).dtype_id for n in f.keys()] == [8, 9]


def test_aprfast_reads_pre_layout002_flags(harness):
    """Files from before LAYOUT-002 lack the LAYOUT_ROW_MAJOR flag; both sides accept them."""
    data = rust_file(harness, [{"name": "w", "shape": [2], "f32": [1, 2]}])
    assert_same_view(harness, _with_header(data, "<H", 6, 0))


def test_aprfast_reads_other_minor_version(harness):
    """apr-format does not look at the version bytes; aprfast accepts any 2.x."""
    data = rust_file(harness, [{"name": "w", "shape": [2], "f32": [1, 2]}])
    assert_same_view(harness, _with_header(data, "<BB", 4, 2, 7))


# ---------------------------------------------------------------------------------------
# b. aprfast writes, aprender reads
# ---------------------------------------------------------------------------------------
@tensor_cases
def test_aprender_reads_aprfast_tensor(harness, case):
    data = aprfast.save({"tensor": case.value()}, META, layout="aprender")
    report = assert_same_view(harness, data)
    assert report["tensors"][0]["sha256"] == sha256(case.raw)
    assert report["tensors"][0]["dtype_id"] == APRENDER_IDS.id_of(DTYPES[case.dtype])


def expected_metadata(metadata: dict) -> dict:
    """What apr-format should read back from aprfast's metadata, written by hand:
    typed defaults filled in, f32 fields rounded to f32, nested structs' missing keys null."""
    out = {"model_type": "", "license": None, "data_source": None, "data_license": None,
           "total_size": 0, "param_count": 0}
    nested_keys = {"quantization": ("quant_type", "bits", "block_size", "symmetric"),
                   "sharding": ("shard_count", "shard_index", "total_size", "pattern"),
                   "special_tokens": ("bos_token", "eos_token", "unk_token", "pad_token", "im_start_token",
                                      "im_end_token")}
    for key, value in metadata.items():
        if value is None and key in TYPED_FIELDS:  # a typed None is skipped (provenance: null)
            continue
        if key in ("rope_theta", "rms_norm_eps"):
            value = float(np.float32(value))
        elif key in nested_keys:
            value = {k: value.get(k) for k in nested_keys[key]}
        out[key] = value
    return out


@metadata_cases
def test_aprender_reads_aprfast_metadata(harness, metadata):
    data = aprfast.save({"w": np.array([1.5, -2.5], np.float32)}, metadata, layout="aprender")
    report = assert_same_view(harness, data)
    assert f32_fields_to_f32(report["metadata"]) == expected_metadata(metadata)


@pytest.mark.parametrize("field, value, text", F32_FIELD_CASES, ids=F32_FIELD_IDS)
def test_aprender_reads_aprfast_f32_fields(harness, field, value, text):
    data = aprfast.save({}, {"model_type": "llama", field: value}, layout="aprender")
    report = assert_same_view(harness, data)
    assert np.float32(report["metadata"][field]) == np.float32(float(text))


def test_aprender_reads_aprfast_many_custom_keys(harness):
    custom = {f"key_{i}": {"i": i, "name": f"v{i}", "list": [i, -i, i / 4]} for i in range(12)}
    data = aprfast.save({}, {"model_type": "m", **custom}, layout="aprender")
    report = assert_same_view(harness, data)
    assert {k: report["metadata"][k] for k in custom} == custom


def test_aprfast_numpy_inputs_match_add_f32_tensor(harness):
    """Big-endian, Fortran-ordered, strided and 0-d arrays are written as C-order
    little-endian bytes, as AprV2Writer::add_f32_tensor writes the same values."""
    base = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 8
    inputs = {"big-endian": base.astype(">f4"), "fortran": np.asfortranarray(base), "strided": base[:, ::2, 1::2],
              "transposed": base.T, "scalar": np.float32(2.5).reshape(())}
    ours = aprfast.save(inputs, META, layout="aprender")
    specs = [{"name": n, "shape": list(a.shape), "f32_hex": np.ascontiguousarray(a, "<f4").tobytes().hex()}
             for n, a in inputs.items()]
    assert_same_bytes(ours, rust_file(harness, specs))


def zoo_values() -> dict:
    return {spec["name"]: tensor_value(spec["dtype"], spec["shape"], bytes.fromhex(spec["data_hex"]))
            for spec in zoo_specs()}


def test_aprender_reads_aprfast_zoo(harness):
    data = aprfast.save(zoo_values(), ALL_TYPED, layout="aprender")
    report = assert_same_view(harness, data)
    assert len(report["tensors"]) == 12


def test_aprender_reads_aprfast_streaming_writer(harness, tmp_path):
    """aprfast.Writer takes tensors in any order; the file is the one save() makes."""
    values = zoo_values()
    path = tmp_path / "streamed.apr"
    with aprfast.Writer(path, ALL_TYPED, layout="aprender") as w:
        for name in reversed(list(values)):
            w.add(name, values[name])
    data = path.read_bytes()
    assert_same_view(harness, data)
    assert data == aprfast.save(values, ALL_TYPED, layout="aprender")


@pytest.mark.parametrize("count, index", [(1, 0), (4, 2)])
def test_aprender_reads_aprfast_sharded(harness, count, index):
    sharding = {"shard_count": count, "shard_index": index, "total_size": 0}
    data = aprfast.save({"w": np.ones(3, np.float32)}, {"model_type": "m", "sharding": sharding},
                        layout="aprender")
    report = assert_same_view(harness, data)
    assert report["header"]["flags"] == 0x0410
    assert report["metadata"]["sharding"] == {**sharding, "pattern": None}


# ---------------------------------------------------------------------------------------
# c. byte identity with AprV2Writer
# ---------------------------------------------------------------------------------------
def assert_same_bytes(ours: bytes, theirs: bytes):
    if ours == theirs:
        return
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    raise AssertionError(
        f"aprfast wrote {len(ours)} bytes, AprV2Writer {len(theirs)}; first difference at byte {first}\n"
        f"aprfast metadata: {metadata_text(ours)!r}\napr-format metadata: {metadata_text(theirs)!r}\n"
        f"aprfast    [{first}:+32] {ours[first:first + 32].hex()}\n"
        f"apr-format [{first}:+32] {theirs[first:first + 32].hex()}")


def test_byte_identical_golden_model(harness):
    """aprender's golden v2 fixture (golden_v2_skip_none.apr): 516 bytes."""
    tensors = {"weights": np.array([1.0, 2.0, 0.5, -0.5, 4.0, -2.0, 0.25, 8.0], np.float32),
               "bias": np.array([0.125], np.float32)}
    ours = aprfast.save(tensors, GOLDEN_META, layout="aprender")
    theirs = rust_file(harness, [{"name": n, "shape": list(v.shape), "f32": v.tolist()} for n, v in tensors.items()],
                       GOLDEN_META)
    spec_file = harness.run("write-v2", GOLDEN_V2_SPEC, harness.path("golden", ".apr"))
    assert len(theirs) == 516
    assert spec_file["sha256"] == sha256(theirs)
    assert_same_bytes(ours, theirs)
    assert aprfast.save(tensors, GOLDEN_META) == ours  # layout="auto" picks aprender's


@tensor_cases
def test_byte_identical_tensor(harness, case):
    assert_same_bytes(aprfast.save({"tensor": case.value()}, META, layout="aprender"),
                      rust_file(harness, [case.spec("tensor")]))


@metadata_cases
def test_byte_identical_metadata(harness, metadata):
    tensors = [{"name": "w", "shape": [2], "f32": [1.5, -2.5]}]
    assert_same_bytes(aprfast.save({"w": np.array([1.5, -2.5], np.float32)}, metadata, layout="aprender"),
                      rust_file(harness, tensors, metadata, **sharded_flag_for(metadata)))


@pytest.mark.parametrize("field, value, text", F32_FIELD_CASES, ids=F32_FIELD_IDS)
def test_byte_identical_f32_fields(harness, field, value, text):
    metadata = {"model_type": "llama", field: value}
    ours = aprfast.save({}, metadata, layout="aprender")
    assert_same_bytes(ours, rust_file(harness, [], metadata))
    assert f'"{field}":{text}'.encode() in metadata_text(ours)


@pytest.mark.parametrize("writer", ["memory", "streaming"])
def test_byte_identical_converter_output(harness, writer):
    """The bytes of add_f16/add_q8/add_q4_tensor, handed to aprfast as raw tensors."""
    specs = [{"name": f"{kind}-{sid}", "shape": shape, "f32_hex": quantizer_input(shape).tobytes().hex(), "as": kind}
             for kind in QUANTIZER_KINDS for sid, shape in QUANTIZER_SHAPES.items()]
    specs.sort(key=lambda s: s["name"])  # the streaming writer keeps insertion order for the data
    theirs = rust_file(harness, specs, writer=writer)
    with aprfast.open(theirs) as f:
        assert_same_bytes(aprfast.save(f.tensors(copy=True), META, layout="aprender"), theirs)


@pytest.mark.parametrize("count, index", [(1, 0), (4, 2), (100000, 99999)])
def test_byte_identical_sharded(harness, count, index):
    """AprV2Writer::with_sharding(count, index) == metadata sharding {count, index, total_size 0}."""
    metadata = {"model_type": "llama", "name": "shard"}
    ours = aprfast.save({"w": np.arange(3, dtype=np.float32)},
                        {**metadata, "sharding": {"shard_count": count, "shard_index": index, "total_size": 0}},
                        layout="aprender")
    theirs = rust_file(harness, [{"name": "w", "shape": [3], "f32": [0, 1, 2]}], metadata, sharding=[count, index])
    assert_same_bytes(ours, theirs)


def test_byte_identical_sharded_with_pattern_and_total_size(harness):
    """A full ShardingMetadata plus the SHARDED flag (what stamp_provenance_bytes re-writes)."""
    metadata = {"model_type": "llama", "sharding": {"shard_count": 8, "shard_index": 7, "total_size": 2**40,
                                                    "pattern": "model-{:05d}-of-{:05d}.apr"}}
    ours = aprfast.save({"w": np.arange(3, dtype=np.float32)}, metadata, layout="aprender")
    theirs = rust_file(harness, [{"name": "w", "shape": [3], "f32": [0, 1, 2]}], metadata, header_flags=0x0010)
    assert_same_bytes(ours, theirs)


@pytest.mark.parametrize("writer", ["memory", "streaming"])
def test_byte_identical_zoo(harness, writer):
    """All dtypes, odd names, empty tensors.  The streaming writer matches too when the
    tensors arrive sorted (it writes data in insertion order).  It has no way to set the
    SHARDED or QUANTIZED flags, so the metadata here has no `sharding` or `quantization`."""
    specs = sorted(zoo_specs(), key=lambda s: s["name"].encode())
    metadata = {k: v for k, v in ALL_TYPED_UNSHARDED.items() if k != "quantization"}
    assert_same_bytes(aprfast.save(zoo_values(), metadata, layout="aprender"),
                      rust_file(harness, specs, metadata, writer=writer))


def test_byte_identical_aprfast_streaming_writer(harness, tmp_path):
    path = tmp_path / "streamed.apr"
    values = zoo_values()
    with aprfast.Writer(path, ALL_TYPED, layout="aprender") as w:
        for name in reversed(list(values)):
            w.add(name, values[name])
    assert_same_bytes(path.read_bytes(), rust_file(harness, zoo_specs(), ALL_TYPED, **sharded_flag_for(ALL_TYPED)))


def test_byte_identical_nothing(harness):
    """No tensors, no metadata: the smallest file either side writes."""
    ours = aprfast.save({}, None, layout="aprender")
    assert_same_bytes(ours, rust_file(harness, [], {}))
    assert len(ours) == 64 + 128 + 4


def test_many_custom_keys_differ_only_in_key_order(harness):
    """With 2+ custom keys aprender's bytes depend on its HashMap order.  aprfast sorts
    them; apart from the order of those keys (and so the two CRCs), the files are equal."""
    metadata = {"model_type": "m", **{f"k{i}": i for i in range(8)}}
    ours = aprfast.save({"w": np.ones(2, np.float32)}, metadata, layout="aprender")
    theirs = rust_file(harness, [{"name": "w", "shape": [2], "f32": [1, 1]}], metadata)
    assert len(ours) == len(theirs)
    assert json.loads(metadata_text(ours)) == json.loads(metadata_text(theirs))
    assert sorted(metadata_text(ours)) == sorted(metadata_text(theirs))  # same characters
    # Everything but the header checksum, the metadata text and the footer CRC is equal.
    unchecked = {*range(40, 44), *range(64, 64 + len(metadata_text(ours))), *range(len(ours) - 4, len(ours))}
    assert all(a == b for i, (a, b) in enumerate(zip(ours, theirs)) if i not in unchecked)


# ---------------------------------------------------------------------------------------
# d. aprfast's spec layout is refused by aprender, never misread
# ---------------------------------------------------------------------------------------
APR2_CONTENTS = {
    "nothing": ({}, None),
    "golden": ({"weights": np.array([1.0, 2.0], np.float32), "bias": np.array([0.125], np.float32)}, GOLDEN_META),
    "all-typed-metadata": ({"w": np.zeros((2, 3), np.float16)}, ALL_TYPED),
    "aprender-only-dtypes": ({"q": TensorCase("APR_Q4", (40,)).value(), "k": TensorCase("Q4_K", (256,)).value()}, META),
    "spec-only-dtypes": ({"b": np.array([True, False]), "u": np.arange(3, dtype=np.uint32)}, META),
}


@pytest.mark.parametrize("tensors, metadata", list(APR2_CONTENTS.values()), ids=list(APR2_CONTENTS))
def test_aprender_rejects_apr2_layout(harness, tensors, metadata):
    data = aprfast.save(tensors, metadata, layout="apr2")
    assert data[:4] == b"APR2"
    report = harness.read(data)
    assert report == {"ok": False, "format": "v2", "stage": "parse", "error": "Invalid magic: 41505232"}


def test_auto_layout_falls_back_to_apr2_only_when_needed(harness):
    """layout="auto" keeps aprender's layout when it can hold the tensors, and the
    fallback (a bool tensor here) is refused by aprender rather than misread."""
    representable = aprfast.save({"w": np.ones(2, np.float32)}, META)
    assert harness.read(representable)["ok"]
    fallback = aprfast.save({"w": np.ones(2, np.float32), "mask": np.ones(2, bool)}, META)
    assert fallback[:4] == b"APR2" and not harness.read(fallback)["ok"]


# ---------------------------------------------------------------------------------------
# e. what apr-format writes that aprfast cannot represent (or refuses on purpose)
# ---------------------------------------------------------------------------------------
def test_sharding_metadata_without_sharded_flag(harness):
    """aprender sets SHARDED only in with_sharding(); metadata that already carries
    `sharding` gets no flag.  aprfast derives the flag from the metadata, so it cannot
    write this file, but it reads it as apr-format does."""
    metadata = {"model_type": "m", "sharding": {"shard_count": 2, "shard_index": 0, "total_size": 0}}
    theirs = rust_file(harness, [{"name": "w", "shape": [1], "f32": [1]}], metadata)
    assert assert_same_view(harness, theirs)["header"]["flags"] == 0x0400
    ours = aprfast.save({"w": np.ones(1, np.float32)}, metadata, layout="aprender")
    assert metadata_text(ours) == metadata_text(theirs)
    assert struct.unpack_from("<H", ours, 6)[0] == 0x0410


def test_quantization_metadata_without_quantized_flag(harness):
    """Likewise QUANTIZED: aprfast sets it exactly when the metadata has `quantization`
    (aprender sets it only through set_header_flags).  The flagless file still reads."""
    metadata = {"model_type": "m", "quantization": {"quant_type": "q4_k", "bits": 4, "block_size": 256,
                                                   "symmetric": False}}
    theirs = rust_file(harness, [{"name": "w", "shape": [1], "f32": [1]}], metadata)
    assert assert_same_view(harness, theirs)["header"]["flags"] == 0x0400
    ours = aprfast.save({"w": np.ones(1, np.float32)}, metadata, layout="aprender")
    assert metadata_text(ours) == metadata_text(theirs)
    assert struct.unpack_from("<H", ours, 6)[0] == 0x0420
    assert_same_bytes(ours, rust_file(harness, [{"name": "w", "shape": [1], "f32": [1]}], metadata,
                                      header_flags=0x0020))


def test_long_names_truncated_by_aprender_refused_by_aprfast(harness):
    """AprV2Writer cuts names at 256 bytes (even inside a UTF-8 sequence); aprfast refuses."""
    name = "é" * 129  # 258 bytes
    report = harness.read(rust_file(harness, [{"name": name, "shape": [1], "f32": [1]}]))
    assert report["ok"] and report["tensors"][0]["name"] == "é" * 128
    with pytest.raises(aprfast.LayoutError):
        aprfast.save({name: np.ones(1, np.float32)}, META, layout="aprender")


def test_more_than_8_dims_dropped_by_aprender_refused_by_aprfast(harness):
    shape = [1] * 8 + [3]
    report = harness.read(rust_file(harness, [{"name": "w", "shape": shape, "f32": [1, 2, 3]}]))
    assert report["ok"] and report["tensors"][0]["shape"] == [1] * 8  # the 9th dim is gone; size says 12 bytes
    with pytest.raises(aprfast.LayoutError):
        aprfast.save({"w": np.ones(shape, np.float32)}, META, layout="aprender")


def test_size_shape_mismatch_written_by_aprender_refused_by_aprfast(harness):
    """add_f32_tensor does not check len(data) against the shape; apr-format reads the
    inconsistent entry, aprfast refuses the file instead of guessing."""
    data = rust_file(harness, [{"name": "w", "shape": [3], "f32": [1, 2]}])
    assert harness.read(data)["ok"]
    with pytest.raises(aprfast.CorruptError):
        aprfast.open(data)


def test_duplicate_names_written_by_aprender_refused_by_both(harness):
    data = rust_file(harness, [{"name": "w", "shape": [1], "f32": [1]}, {"name": "w", "shape": [1], "f32": [2]}])
    assert not harness.read(data)["ok"]
    with pytest.raises(aprfast.CorruptError):
        aprfast.open(data)


LOSSY_METADATA = {
    # serde_json::Value has no integer beyond i64/u64: it becomes the nearest f64.
    "int-above-u64": ({"big": 2**64}, "1.8446744073709552e+19"),
    "int-below-i64": ({"big": -(2**63) - 1}, "-9.223372036854776e+18"),
    # f64 -> f32 overflows to inf, which serde_json writes as null.
    "f32-field-overflows": ({"rope_theta": 1e39}, "null"),
    # The nested structs have no deny_unknown_fields: extra keys vanish.
    "quantization-unknown-key": ({"quantization": {"quant_type": "q", "bits": 4, "symmetric": True, "group": 32}},
                                 '{"quant_type":"q","bits":4,"block_size":null,"symmetric":true}'),
    "special-tokens-unknown-key": ({"special_tokens": {"bos_token": "<s>", "sep_token": "<sep>"}},
                                   '{"bos_token":"<s>","eos_token":null,"unk_token":null,"pad_token":null,'
                                   '"im_start_token":null,"im_end_token":null}'),
}


@pytest.mark.parametrize("metadata, stored", list(LOSSY_METADATA.values()), ids=list(LOSSY_METADATA))
def test_metadata_aprender_writes_lossily_refused_by_aprfast(harness, metadata, stored):
    """apr-format stores something other than what it was given (an f64, null, a dropped
    key); aprfast raises instead of writing a different value."""
    theirs = rust_file(harness, [], {"model_type": "m", **metadata})
    key = next(iter(metadata))
    assert f'"{key}":{stored}'.encode() in metadata_text(theirs)
    with pytest.raises(aprfast.LayoutError):
        aprfast.save({}, {"model_type": "m", **metadata}, layout="aprender")


@pytest.mark.parametrize("metadata", [
    {"hidden_size": "896"}, {"hidden_size": -1}, {"hidden_size": 8.0}, {"rope_type": 2**32},
    {"rope_theta": "1e4"}, {"name": 5}, {"quantization": {"quant_type": "q", "bits": 256, "symmetric": True}},
    {"quantization": {"bits": 4, "symmetric": True}}, {"total_size": None}, {"param_count": True},
    {"quantization": {"quant_type": "q", "bits": 4, "symmetric": 1}}, {"special_tokens": {"bos_token": 1}},
], ids=["usize-as-string", "usize-negative", "usize-as-float", "u32-overflow", "f32-as-string", "str-as-int",
        "u8-overflow", "missing-required-nested", "u64-null", "u64-as-bool", "bool-as-int", "token-as-int"])
def test_metadata_of_the_wrong_type_refused_by_both(harness, metadata):
    """serde refuses these when deserializing AprV2Metadata (the harness reports misuse)."""
    spec = harness.write_spec({"metadata": {"model_type": "m", **metadata}, "tensors": []})
    assert "does not deserialize into AprV2Metadata" in harness.misuse("write-v2", spec, harness.path("rust", ".apr"))
    with pytest.raises(aprfast.LayoutError):
        aprfast.save({}, {"model_type": "m", **metadata}, layout="aprender")
