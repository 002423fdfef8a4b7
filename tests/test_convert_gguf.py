"""GGUF <-> .apr through aprfast.convert, proven with gguf-py (GGUFReader / GGUFWriter)."""

import struct

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

import aprfast  # noqa: E402
from aprfast.convert import gguf as cg  # noqa: E402

Q = gguf.GGMLQuantizationType
QUANT = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q6_K]


def k_quant_blocks(qt, rng):
    size = {Q.Q4_K: 144, Q.Q6_K: 210}[qt]
    blocks = rng.integers(0, 256, (2, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
    for at in ((0, 2) if qt == Q.Q4_K else (208,)):  # d (and dmin) of each block
        blocks[:, at:at + 2] = scale
    return blocks


def write_with_gguf_py(path, rng):
    """A file with every plain type, every quantized type aprfast knows and metadata of
    every value type (nested arrays included), written by gguf-py."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.25)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_str", ["a", "bc", ""])
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_tokenizer_model("llama")
    w.add_token_list(["<s>", "</s>", "hi"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    expected = {}
    for name, dt in [("f32", np.float32), ("f16", np.float16), ("f64", np.float64), ("i8", np.int8),
                     ("i16", np.int16), ("i32", np.int32), ("i64", np.int64)]:
        a = (rng.standard_normal((3, 5)) * 100).astype(dt)
        w.add_tensor(f"plain.{name}", a)
        expected[f"plain.{name}"] = a
    for qt in QUANT:
        values = rng.standard_normal((2, 256)).astype(np.float32)
        try:
            blocks = gguf.quants.quantize(values, qt)
        except NotImplementedError:  # gguf-py has no K-quant quantizer: random blocks with finite f16 scales
            blocks = k_quant_blocks(qt, rng)
        w.add_tensor(f"q.{qt.name.lower()}", blocks, raw_dtype=qt)
        expected[f"q.{qt.name.lower()}"] = blocks
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def test_gguf_py_files_convert_with_identical_values(tmp_path, rng):
    expected = write_with_gguf_py(tmp_path / "a.gguf", rng)
    aprfast.convert(tmp_path / "a.gguf", tmp_path / "a.apr")
    with aprfast.open(tmp_path / "a.apr") as f:
        for name, want in expected.items():
            got = f.get_tensor(name)
            if name.startswith("q."):
                assert isinstance(got, aprfast.QuantizedTensor)
                assert got.dtype.name == name[2:].upper() and got.shape == (2, 256)
                assert got.data.tobytes() == want.tobytes()
            else:
                assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()
        m = f.metadata
    assert m["general.architecture"] == "llama" and m["model_type"] == "llama" and m["model_name"] == "tiny"
    assert m["context_length"] == 128 and m["hidden_size"] == 64
    assert m["t.u64"] == 2**63 + 5 and m["t.f64"] == 0.1 and m["t.f32"] == 0.25 and m["t.bool"] is True
    assert m["t.str"] == "héllo" and m["t.arr_str"] == ["a", "bc", ""] and m["t.nested"] == [[1, 2], [3]]
    assert m["tokenizer.vocabulary"] == ["<s>", "</s>", "hi"] and m["tokenizer.vocab_size"] == 3
    assert m["tokenizer.bos_token_id"] == 0 and m["tokenizer.eos_token_id"] == 1
    assert m["tokenizer.ggml.model"] == "llama" and "tokenizer.ggml.tokens" not in m
    assert m["gguf.kv_types"]["t.u8"] == "U8" and m["gguf.kv_types"]["t.nested"] == ["ARRAY", ["ARRAY", "I32"]]


def test_dequantize_on_the_way_matches_gguf_py(tmp_path, rng):
    expected = write_with_gguf_py(tmp_path / "a.gguf", rng)
    aprfast.convert(tmp_path / "a.gguf", tmp_path / "a.apr", precision="f32")
    loaded = aprfast.load_file(tmp_path / "a.apr")
    for qt in QUANT:
        name = f"q.{qt.name.lower()}"
        assert loaded[name].dtype == np.float32
        np.testing.assert_array_equal(loaded[name], gguf.quants.dequantize(expected[name], qt))


def reader_fields(path):
    r = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: (int(t.tensor_type), [int(x) for x in t.shape], t.data.tobytes()) for t in r.tensors}
    return fields, tensors


def test_round_trip_back_to_gguf_is_read_by_gguf_reader_identically(tmp_path, rng):
    write_with_gguf_py(tmp_path / "a.gguf", rng)
    aprfast.convert(tmp_path / "a.gguf", tmp_path / "a.apr")
    aprfast.convert(tmp_path / "a.apr", tmp_path / "b.gguf")
    fields_a, tensors_a = reader_fields(tmp_path / "a.gguf")
    fields_b, tensors_b = reader_fields(tmp_path / "b.gguf")
    assert tensors_a == tensors_b
    fields_a.pop("t.nested")  # gguf-py's reader flattens nested arrays; checked through our reader below
    nested = fields_b.pop("t.nested")
    assert fields_a == fields_b
    assert nested is not None
    r_a, r_b = gguf.GGUFReader(str(tmp_path / "a.gguf")), gguf.GGUFReader(str(tmp_path / "b.gguf"))
    for key in fields_a:
        assert r_a.fields[key].types == r_b.fields[key].types, key  # value types kept too
    assert cg.GGUFSource(tmp_path / "b.gguf").gguf_metadata["t.nested"] == [[1, 2], [3]]


def test_apr_to_gguf_every_exportable_type(tmp_path, rng):
    import ml_dtypes
    tensors = {"f32": rng.standard_normal((4, 32)).astype(np.float32),
               "bf16": rng.standard_normal((2, 3)).astype(ml_dtypes.bfloat16),
               "scalar": np.array(3.5, np.float32), "i16": np.arange(6, dtype=np.int16).reshape(1, 2, 3),
               "q4k": aprfast.quantize(rng.standard_normal((1, 256)).astype(np.float32), "Q8_0")}
    aprfast.save_file(tensors, tmp_path / "m.apr", metadata={"model_type": "mlp", "n": 3, "cfg": {"a": 1}},
                      layout="apr2")
    aprfast.convert(tmp_path / "m.apr", tmp_path / "m.gguf")
    fields, got = reader_fields(tmp_path / "m.gguf")
    assert fields["general.architecture"] == "mlp" and fields["n"] == 3 and fields["cfg"] == '{"a":1}'
    assert got["f32"] == (0, [32, 4], tensors["f32"].tobytes())  # ne[0] is the row length
    assert got["bf16"] == (30, [3, 2], tensors["bf16"].tobytes())
    assert got["scalar"][:2] == (0, [1])
    assert got["i16"] == (25, [3, 2, 1], tensors["i16"].tobytes())
    assert got["q4k"] == (8, [256, 1], tensors["q4k"].data.tobytes())


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "TQ1_0", "TQ2_0", "MXFP4"])
def test_quantize_on_the_way_to_gguf_gives_gguf_py_blocks(tmp_path, rng, type_name):
    """convert(..., quantize=T) to GGUF writes T's blocks as gguf.quants.quantize makes them."""
    weight = rng.standard_normal((3, 512)).astype(np.float32)
    aprfast.save_file({"blk.0.ffn_up.weight": weight, "blk.0.ffn_norm.weight": np.ones(512, np.float32)},
                      tmp_path / "m.safetensors")
    # (ternary and FP4 values of normal noise drift past the default quality gate)
    aprfast.convert(tmp_path / "m.safetensors", tmp_path / "m.gguf", quantize=type_name.lower(), max_drift=10)
    _, got = reader_fields(tmp_path / "m.gguf")
    want = gguf.quants.quantize(weight, getattr(Q, type_name)).tobytes()
    assert got["blk.0.ffn_up.weight"] == (int(getattr(Q, type_name)), [512, 3], want)
    assert got["blk.0.ffn_norm.weight"][0] == 0  # 1-D tensors stay F32


@pytest.mark.parametrize("value", [np.arange(4, dtype=np.uint8), np.zeros(2, bool), np.zeros(2, np.complex64)])
def test_types_gguf_cannot_hold_are_refused(tmp_path, value):
    aprfast.save_file({"x": value}, tmp_path / "m.apr", layout="apr2")
    with pytest.raises(aprfast.LayoutError, match="GGUF cannot hold"):
        aprfast.convert(tmp_path / "m.apr", tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()


def test_long_names_are_refused_for_gguf(tmp_path):
    aprfast.save_file({"x" * 80: np.zeros(2, np.float32)}, tmp_path / "m.apr")
    with pytest.raises(aprfast.LayoutError, match="63 bytes"):
        aprfast.convert(tmp_path / "m.apr", tmp_path / "m.gguf")
    aprfast.convert(tmp_path / "m.apr", tmp_path / "m.gguf", rename=lambda n: n[:60])


# --- hostile files -------------------------------------------------------------------
def s(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def gguf_bytes(kvs=b"", n_kv=0, infos=b"", n_tensors=0, data=b"", version=3, pad=True):
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + kvs + infos
    if pad:
        head += b"\0" * (-len(head) % 32)
    return head + data


def info(name=b"t", dims=(4,), ggml=0, offset=0):
    return s(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, ggml, offset)


HOSTILE = {
    "truncated magic": (b"GGU", aprfast.CorruptError, "magic"),
    "version 1": (gguf_bytes(version=1), aprfast.VersionError, "version 1"),
    "big-endian": (gguf_bytes(version=3 << 24), aprfast.VersionError, "big-endian"),
    "huge tensor count": (b"GGUF" + struct.pack("<IQQ", 3, 2**63, 0), aprfast.LimitError, "tensors"),
    "huge kv count": (b"GGUF" + struct.pack("<IQQ", 3, 0, 2**60), aprfast.CorruptError, "metadata pairs"),
    "huge key length": (gguf_bytes(struct.pack("<Q", 2**62) + b"\0" * 16, 1), aprfast.LimitError, "more than"),
    "huge string value": (gguf_bytes(s(b"k") + struct.pack("<IQ", 8, 2**40) + b"\0" * 64, 1), aprfast.LimitError,
                          "more than"),
    "truncated string": (gguf_bytes(s(b"k") + struct.pack("<IQ", 8, 1000) + b"ab", 1), aprfast.CorruptError, "left"),
    "huge array length": (gguf_bytes(s(b"k") + struct.pack("<IIQ", 9, 4, 2**61), 1), aprfast.CorruptError,
                          "elements"),
    "huge string array": (gguf_bytes(s(b"k") + struct.pack("<IIQ", 9, 8, 2**40), 1), aprfast.CorruptError,
                          "elements"),
    "deep nesting": (gguf_bytes(s(b"k") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 20, 1),
                     aprfast.LimitError, "deep"),
    "bad value type": (gguf_bytes(s(b"k") + struct.pack("<I", 99), 1), aprfast.CorruptError, "type 99"),
    "duplicate key": (gguf_bytes((s(b"k") + struct.pack("<IB", 0, 1)) * 2, 2), aprfast.CorruptError, "twice"),
    "bad alignment": (gguf_bytes(s(b"general.alignment") + struct.pack("<II", 4, 3), 1), aprfast.CorruptError,
                      "power of two"),
    "alignment wrong type": (gguf_bytes(s(b"general.alignment") + struct.pack("<Iq", 11, 32), 1),
                             aprfast.CorruptError, "u32"),
    "non-utf8 key": (gguf_bytes(s(b"\xff") + struct.pack("<IB", 0, 1), 1), aprfast.CorruptError, "UTF-8"),
    "dimension overflow": (gguf_bytes(infos=info(dims=(2**32, 2**32, 2**32)), n_tensors=1), aprfast.LimitError,
                           "2\\*\\*62"),
    "zero dims": (gguf_bytes(infos=info(dims=()), n_tensors=1), aprfast.CorruptError, "dimensions"),
    "five dims": (gguf_bytes(infos=info(dims=(1,) * 5), n_tensors=1), aprfast.CorruptError, "dimensions"),
    "offset past end": (gguf_bytes(infos=info(offset=2**40), n_tensors=1, data=b"\0" * 16), aprfast.CorruptError,
                        "past the end"),
    "offset wraps": (gguf_bytes(infos=info(offset=2**64 - 32), n_tensors=1, data=b"\0" * 16),
                     aprfast.CorruptError, "past the end"),
    "data truncated": (gguf_bytes(infos=info(), n_tensors=1, data=b"\0" * 15), aprfast.CorruptError, "past the end"),
    "unaligned offset": (gguf_bytes(infos=info(offset=4), n_tensors=1, data=b"\0" * 64), aprfast.CorruptError,
                         "multiple of 32"),
    "overlap": (gguf_bytes(infos=info(b"a") + info(b"b"), n_tensors=2, data=b"\0" * 64), aprfast.CorruptError,
                "overlaps"),
    "duplicate tensor": (gguf_bytes(infos=info(b"a") + info(b"a", offset=32), n_tensors=2, data=b"\0" * 64),
                         aprfast.CorruptError, "twice"),
    "unknown ggml type": (gguf_bytes(infos=info(ggml=4), n_tensors=1, data=b"\0" * 64),  # the removed Q4_2
                          aprfast.UnknownDTypeError, "type id 4,"),
    "bad ggml type": (gguf_bytes(infos=info(ggml=1000), n_tensors=1, data=b"\0" * 64),
                      aprfast.UnknownDTypeError, "1000"),
    "quant row not a block multiple": (gguf_bytes(infos=info(dims=(16, 2), ggml=8), n_tensors=1, data=b"\0" * 64),
                                       aprfast.CorruptError, "multiple of 32"),
    "metadata value budget": (None, aprfast.LimitError, "metadata values"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_gguf_raises_typed_errors(tmp_path, case, monkeypatch):
    data, error, match = HOSTILE[case]
    if data is None:
        monkeypatch.setattr(cg, "MAX_METADATA_VALUES", 10)
        data = gguf_bytes(s(b"k") + struct.pack("<IIQ", 9, 0, 11) + b"\0" * 11, 1)
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(error, match=match):
        cg.GGUFSource(path)
    with pytest.raises(aprfast.AprError):
        aprfast.convert(path, tmp_path / "out.apr", to="apr")
    assert not (tmp_path / "out.apr").exists()


def test_valid_handmade_file_is_accepted(tmp_path):
    """The hostile cases above fail for their stated reason, not for a builder bug."""
    path = tmp_path / "ok.gguf"
    path.write_bytes(gguf_bytes(s(b"general.alignment") + struct.pack("<II", 4, 32), 1, info(), 1,
                                struct.pack("<4f", 1, 2, 3, 4)))
    aprfast.convert(path, tmp_path / "ok.apr")
    assert aprfast.load_file(tmp_path / "ok.apr")["t"].tolist() == [1, 2, 3, 4]
    assert gguf.GGUFReader(str(path)).tensors[0].data.tolist() == [1, 2, 3, 4]


def test_q8_tensor_exports_as_i8_with_scale_in_metadata(tmp_path, rng):
    values = rng.standard_normal((4, 8)).astype(np.float32)
    q = aprfast.quantize(values, "Q8_TENSOR")
    aprfast.save_file({"w": q}, tmp_path / "m.apr", layout="apr2")
    aprfast.convert(tmp_path / "m.apr", tmp_path / "m.gguf")
    fields, tensors = reader_fields(tmp_path / "m.gguf")
    scale, zero = struct.unpack("<fi", q.data[:8].tobytes())
    assert tensors["w"] == (24, [8, 4], q.data[8:].tobytes())
    assert fields["aprfast.q8_tensor.w.scale"] == pytest.approx(scale, rel=0, abs=0)
    assert fields["aprfast.q8_tensor.w.zero_point"] == zero
    i8 = np.frombuffer(q.data[8:].tobytes(), np.int8).reshape(4, 8).astype(np.float32)
    np.testing.assert_array_equal((i8 - zero) * np.float32(scale), aprfast.dequantize(q))


def test_non_finite_float_metadata_round_trips(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "n.gguf"), "llama")
    w.add_float32("x.nan", float("nan"))
    w.add_float64("x.inf", float("-inf"))
    w.add_array("x.arr", [1.5, float("inf")])
    w.add_tensor("t", np.ones(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    aprfast.convert(tmp_path / "n.gguf", tmp_path / "n.apr")
    with aprfast.open(tmp_path / "n.apr") as f:
        assert (f.metadata["x.nan"], f.metadata["x.inf"], f.metadata["x.arr"]) == ("nan", "-inf", [1.5, "inf"])
    aprfast.convert(tmp_path / "n.apr", tmp_path / "m.gguf")
    fields, _ = reader_fields(tmp_path / "m.gguf")
    assert np.isnan(fields["x.nan"]) and fields["x.inf"] == float("-inf") and fields["x.arr"] == [1.5, float("inf")]


def test_version_2_files_are_read(tmp_path, rng):
    write_with_gguf_py(tmp_path / "a.gguf", rng)
    data = bytearray((tmp_path / "a.gguf").read_bytes())
    data[4:8] = struct.pack("<I", 2)  # v2 and v3 share the little-endian layout
    (tmp_path / "v2.gguf").write_bytes(bytes(data))
    src = cg.GGUFSource(tmp_path / "v2.gguf")
    try:
        assert src.version == 2 and src.metadata["gguf.version"] == 2 and len(src.specs) == 14
    finally:
        src.close()


def test_every_truncation_and_header_byte_flip_is_a_typed_error_or_a_clean_read(tmp_path, rng):
    """Parser robustness: no cut or flipped header byte may raise anything but AprError."""
    w = gguf.GGUFWriter(str(tmp_path / "a.gguf"), "llama")
    w.add_array("k", ["x", "yz"])
    w.add_uint32("n", 7)
    w.add_tensor("t", np.arange(8, dtype=np.float32))
    w.add_tensor("q", gguf.quants.quantize(rng.standard_normal((1, 32)).astype(np.float32), Q.Q8_0), raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = (tmp_path / "a.gguf").read_bytes()
    bad = tmp_path / "bad.gguf"
    good = cg.GGUFSource(tmp_path / "a.gguf")
    header_end = good._data_start  # every byte before the data: header, metadata, tensor infos
    good.close()
    cases = [data[:n] for n in range(len(data))]
    cases += [data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:] for i in range(header_end)]
    refused = 0
    for case in cases:
        bad.write_bytes(case)
        try:
            src = cg.GGUFSource(bad)
        except aprfast.AprError:
            refused += 1
            continue
        try:
            for spec in src.specs:
                src.read(spec)
        finally:
            src.close()
    assert refused >= len(data) - 1  # every truncation but the whole file (and maybe its padding) is refused


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st

PLAIN = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
         "I32": np.int32, "I64": np.int64}
META = st.one_of(st.booleans(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=8),
                 st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=4),
                 st.lists(st.text(max_size=4), min_size=1, max_size=4))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(PLAIN)), st.lists(st.integers(1, 4), min_size=1, max_size=4)),
                max_size=4),
       st.dictionaries(st.text("abcxyz.", min_size=1, max_size=6), META, max_size=4),
       st.integers(0, 2**32 - 1))
def test_apr_to_gguf_property(tmp_path_factory, entries, meta, seed):
    rng = np.random.default_rng(seed)
    d = tmp_path_factory.mktemp("g")
    tensors = {f"t{i}": rng.integers(-100, 100, shape).astype(PLAIN[dtype]) for i, (dtype, shape) in enumerate(entries)}
    aprfast.save_file(tensors, d / "m.apr", metadata=meta, layout="apr2")
    aprfast.convert(d / "m.apr", d / "m.gguf")
    fields, got = reader_fields(d / "m.gguf")
    assert {k: v[2] for k, v in got.items()} == {k: v.tobytes() for k, v in tensors.items()}
    assert {k: v[1] for k, v in got.items()} == {k: list(reversed(v.shape)) for k, v in tensors.items()}
    for key, value in meta.items():
        assert fields[key] == value
    aprfast.convert(d / "m.gguf", d / "back.apr")
    back = aprfast.load_file(d / "back.apr")
    assert {k: v.tobytes() for k, v in back.items()} == {k: v.tobytes() for k, v in tensors.items()}


def _f32_llama_gguf(path):
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_file_type(0)  # ALL_F32
    writer.add_block_count(1)
    writer.add_head_count(4)  # GGUF -> .apr puts attn_q's rows in Hugging Face's order: it needs the heads
    writer.add_head_count_kv(4)
    writer.add_tensor("blk.0.attn_q.weight", np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _file_type(path):
    field = gguf.GGUFReader(str(path)).fields["general.file_type"]
    return field.contents(), [gguf.GGUFValueType(t).name for t in field.types]


@pytest.mark.parametrize("options,want", [({"quantize": "Q8_0"}, 7), ({"quantize": "Q4_0"}, 2),
                                          ({"quantize": "Q4_1"}, 3), ({"precision": "f16"}, 1),
                                          ({"precision": "bf16"}, 32)])
def test_gguf_to_gguf_file_type_follows_the_tensors(options, want, tmp_path):
    """issue 26 item 5: a GGUF quantized on the way kept the source's ALL_F32.  llama.cpp's
    LlamaFileType numbers (MOSTLY_Q8_0 7, ...), U32 as llama.cpp reads it."""
    _f32_llama_gguf(tmp_path / "x.gguf")
    aprfast.convert(tmp_path / "x.gguf", tmp_path / "y.gguf", **options)
    assert _file_type(tmp_path / "y.gguf") == (want, ["UINT32"])
    # through .apr: the .apr keeps the GGUF's keys, with the file type of what it holds
    aprfast.convert(tmp_path / "x.gguf", tmp_path / "y.apr", **options)
    aprfast.convert(tmp_path / "y.apr", tmp_path / "z.gguf")
    assert _file_type(tmp_path / "z.gguf") == (want, ["UINT32"])


def test_every_single_type_file_type_is_llama_cpps_number():
    """general.file_type of a file mostly of one GGML type is llama.cpp's LLAMA_FTYPE_MOSTLY_
    number of that type: the same number as llama-quantize's one-type mix of that name."""
    from aprfast.convert.hf_arch import FILE_TYPES
    from aprfast.numerics.mixes import MIXES

    same = {name: m.ftype for name, m in MIXES.items() if name == m.base or (name == "MXFP4_MOE")}
    for name, ftype in same.items():
        base = MIXES[name].base
        assert FILE_TYPES[base] == ftype, (name, base)
    assert {"IQ4_NL", "IQ4_XS", "IQ3_S", "Q1_0", "TQ1_0", "MXFP4"} <= set(FILE_TYPES)


def test_gguf_to_gguf_unchanged_keeps_its_file_type_and_bytes(tmp_path):
    _f32_llama_gguf(tmp_path / "x.gguf")
    aprfast.convert(tmp_path / "x.gguf", tmp_path / "y.gguf")
    assert (tmp_path / "y.gguf").read_bytes() == (tmp_path / "x.gguf").read_bytes()
