"""Burnpack (Burn, seed 004) <-> .apr through aprfast.convert: golden bytes written by Burn's
own crate, round trips, and hostile files refused with typed errors before anything is
allocated.  The live cross-checks against the crate are tests/interop/test_interop_burnpack.py."""

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

cbor2 = pytest.importorskip("cbor2")

from refusals import assert_source_refuses

import aprfast  # noqa: E402
from aprfast.convert import burnpack as bp  # noqa: E402
from aprfast.convert import detect
from aprfast.convert._common import Spec  # noqa: E402
from aprfast.dtypes import by_name  # noqa: E402
from aprfast.errors import AprError, CorruptError, FormatError, LayoutError, LimitError, UnknownDTypeError, VersionError  # noqa: E402

# Written by burn-pack 0.23.0-pre.1 (tests/interop/harness-burnpack, `write`) for
#   w: F32 [2, 2] = 1 2 3 4, param_id 42;  b: Bool [3] = 1 0 1 (in that order);
#   metadata {"producer": "t"};  scalars {"lr": Float 0.5, "n": Int -3}.
# Header (NRUB, version 1, 160 bytes of CBOR), the CBOR; zero padding to 256; w; padding
# to 512; b (no padding after the last tensor).
BURN_HEAD = bytes.fromhex(
    "4e5255420100a0000000a36774656e736f7273a26162a3656474797065a164426f6f6c664e617469766565736861706581036c646174"
    "615f6f666673657473821901001901036177a4656474797065634633326573686170658202026c646174615f6f666673657473820010"
    "68706172616d5f6964182a686d65746164617461a16870726f64756365726174677363616c617273a2626c72a165466c6f6174f93800"
    "616ea163496e7422")
W = np.float32([[1, 2], [3, 4]])
B = np.array([True, False, True])
GOLDEN = BURN_HEAD + bytes(256 - len(BURN_HEAD)) + W.tobytes() + bytes(256 - 16) + B.tobytes()
GOLDEN_META = {"producer": "t", bp.PARAM_IDS_KEY: {"w": 42}, bp.SCALARS_KEY: {"lr": {"Float": 0.5}, "n": {"Int": -3}}}


def golden_specs():
    return [Spec("w", by_name("F32"), (2, 2)), Spec("b", by_name("BOOL"), (3,))]


def test_writer_gives_burns_golden_bytes(tmp_path):
    w = bp.BurnpackWriter(tmp_path / "g.bpk", golden_specs(), GOLDEN_META)
    w.add("w", W)
    w.add("b", B)
    w.close()
    assert (tmp_path / "g.bpk").read_bytes() == GOLDEN


def test_golden_layout_is_the_seeds(tmp_path):
    """10-byte header, CBOR, 256-aligned tensors: seed 004's drawing, with Burn's magic bytes."""
    magic, version, size = struct.unpack_from("<4sHI", GOLDEN)
    assert (magic, version, size) == (b"NRUB", 1, 160) and struct.unpack_from("<I", GOLDEN)[0] == 0x4255524E
    meta = cbor2.loads(GOLDEN[10:10 + size])
    assert list(meta) == ["tensors", "metadata", "scalars"] and list(meta["tensors"]) == ["b", "w"]
    assert meta["tensors"]["w"] == {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16], "param_id": 42}
    assert meta["tensors"]["b"]["data_offsets"] == [256, 259] and meta["tensors"]["b"]["dtype"] == {"Bool": "Native"}


def test_golden_reads_and_converts(tmp_path):
    path = tmp_path / "g.bpk"
    path.write_bytes(GOLDEN)
    assert detect(path) == "burnpack"
    info = aprfast.convert(path, tmp_path / "g.apr")
    assert info["source_format"] == "burnpack" and info["tensors"] == 2
    with aprfast.open(tmp_path / "g.apr") as f:
        assert f.get_tensor("w").tobytes() == W.tobytes() and f.get_tensor("w").shape == (2, 2)
        assert f.get_tensor("b").tolist() == [True, False, True]
        meta = f.metadata
    for key, value in GOLDEN_META.items():
        assert meta[key] == value
    assert meta[bp.VERSION_KEY] == 1
    # back by extension and by to=: Burn's bytes again
    aprfast.convert(tmp_path / "g.apr", tmp_path / "back.bpk")
    aprfast.convert(tmp_path / "g.apr", tmp_path / "back.weights", to="burnpack")
    assert (tmp_path / "back.bpk").read_bytes() == GOLDEN == (tmp_path / "back.weights").read_bytes()


DTYPES = [np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8, np.uint64, np.uint32,
          np.uint16, np.uint8, np.bool_]


@st.composite
def models(draw):
    n = draw(st.integers(0, 5))
    names = draw(st.lists(st.text("abc.xyz_0123", min_size=1, max_size=8), min_size=n, max_size=n, unique=True))
    out = {}
    for name in names:
        dt = draw(st.sampled_from(DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
        raw = draw(st.binary(min_size=int(np.prod(shape)) * np.dtype(dt).itemsize,
                             max_size=int(np.prod(shape)) * np.dtype(dt).itemsize))
        a = np.frombuffer(raw, np.uint8).view(dt).reshape(shape) if dt is not np.bool_ else \
            (np.frombuffer(raw, np.uint8) & 1).astype(bool).reshape(shape)
        out[name] = a
    ids = {name: draw(st.integers(0, 2**64 - 1)) for name in names if draw(st.booleans())}
    return out, ids


@settings(max_examples=30, deadline=None)
@given(models())
def test_round_trip_is_bit_identical(tmp_path_factory, model):
    arrays, ids = model
    d = tmp_path_factory.mktemp("rt")
    aprfast.save_file(arrays, d / "a.apr", metadata={"note": "x", bp.PARAM_IDS_KEY: ids})
    aprfast.convert(d / "a.apr", d / "a.bpk", validate="off")
    data = (d / "a.bpk").read_bytes()
    meta = cbor2.loads(data[10:10 + struct.unpack_from("<I", data, 6)[0]])
    for desc in meta["tensors"].values():
        assert desc["data_offsets"][0] % 256 == 0
    aprfast.convert(d / "a.bpk", d / "b.apr", validate="off")
    with aprfast.open(d / "b.apr") as f:
        assert set(f.keys()) == set(arrays)
        for name, want in arrays.items():
            got = f.get_tensor(name)
            assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()
        assert f.metadata.get(bp.PARAM_IDS_KEY, {}) == ids and f.metadata["note"] == "x"
    aprfast.convert(d / "b.apr", d / "b.bpk", validate="off")
    assert (d / "b.bpk").read_bytes() == data


def test_export_refuses_what_burn_cannot_hold(tmp_path, rng):
    aprfast.save_file({"w": rng.standard_normal((4, 32)).astype(np.float32)}, tmp_path / "a.apr")
    with pytest.raises(LayoutError, match="Burnpack cannot hold Q8_0"):
        aprfast.convert(tmp_path / "a.apr", tmp_path / "q.bpk", quantize="Q8_0")
    assert not (tmp_path / "q.bpk").exists()
    aprfast.convert(tmp_path / "a.apr", tmp_path / "h.bpk", precision="f16")
    with aprfast.open(tmp_path / "a.apr") as f:
        want = f.get_tensor("w").astype(np.float16)
    src = bp.BurnpackSource(tmp_path / "h.bpk")
    try:
        assert src.read(src.specs[0]).tobytes() == want.tobytes()
    finally:
        src.close()


# --- hostile files ---------------------------------------------------------------------------
def pack(meta, data=b"", *, version=1, size=None, raw=None):
    """A Burnpack file from a metadata object (or ``raw`` CBOR bytes) and data-section bytes."""
    body = raw if raw is not None else cbor2.dumps(meta)
    head = struct.pack("<4sHI", b"NRUB", version, len(body) if size is None else size) + body
    return head + bytes(bp.data_section_start(len(body)) - len(head)) + data


def one(dtype="F32", shape=(2,), offsets=(0, 8), **extra):
    return {"tensors": {"x": {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets), **extra}}}


def refused(tmp_path, data, error=AprError, match=None):
    assert_source_refuses(bp.BurnpackSource, tmp_path / "h.bpk", data, error, match)


def test_every_truncation_is_refused(tmp_path):
    for cut in range(len(GOLDEN)):
        refused(tmp_path, GOLDEN[:cut])


def test_every_header_byte_flip_is_refused(tmp_path):
    for i in range(10):
        for flip in (0x01, 0x80, 0xFF):
            data = bytearray(GOLDEN)
            data[i] ^= flip
            refused(tmp_path, bytes(data))


def test_metadata_byte_flips_never_crash_or_misread(tmp_path):
    """A flipped CBOR byte is refused (typed), or still describes tensors inside the file
    whose values are the file's bytes at their offsets."""
    for i in range(10, 170):
        data = bytearray(GOLDEN)
        data[i] ^= 0x20
        path = tmp_path / "f.bpk"
        path.write_bytes(bytes(data))
        try:
            src = bp.BurnpackSource(path)
        except AprError:
            continue
        try:
            for spec in src.specs:
                start = src._data_start + src._offsets[spec.name]
                assert src.read(spec).tobytes() == bytes(data[start:start + spec.nbytes])
        finally:
            src.close()


@pytest.mark.parametrize("data, error, match", [
    (pack(one(), bytes(8), version=2), VersionError, "version 2"),
    (pack(one(), bytes(8), size=0xFFFFFFFF), LimitError, "exceeds"),
    (pack(one(), bytes(8), size=5000), CorruptError, "past the end"),
    (b"NRUC" + GOLDEN[4:], FormatError, "not a Burnpack"),
    (pack(one(offsets=(0, 12)), bytes(12)), CorruptError, "needs 8 bytes"),
    (pack(one(offsets=(8, 0)), bytes(8)), CorruptError, "before start"),
    (pack(one(offsets=(256, 264)), bytes(8)), CorruptError, "past the end"),
    (pack(one(offsets=(2**64 - 16, 2**64 - 8)), bytes(8)), CorruptError, "past the end"),
    (pack(one(), bytes(8), version=0), VersionError, "version 0"),
    (pack(one(shape=(2**40, 2**40), offsets=(0, 8)), bytes(8)), LimitError, "tensor"),
    (pack(one(shape=(-2,)), bytes(8)), CorruptError, "shape"),
    (pack(one(dtype="F8"), bytes(8)), UnknownDTypeError, "F8"),
    (pack(one(dtype={"QFloat": {"value": "Q8S"}}), bytes(8)), UnknownDTypeError, "QFloat"),
    (pack(one(param_id=-1), bytes(8)), CorruptError, "param_id"),
    (pack({"tensors": {"x": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
                       "y": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}}, bytes(8)),
     CorruptError, "overlaps"),
    (pack({"metadata": {}}), CorruptError, "tensors"),
    (pack({"tensors": {}, "metadata": {"k": 1}}), CorruptError, "text to text"),
    (pack({"tensors": {}, "scalars": {"s": {"Float": 1}}}), CorruptError, "scalar"),
    (pack(None, raw=bytes([0xA1, 0x67]) + b"tensors" + bytes([0x7B]) + (2**62).to_bytes(8, "big")), CorruptError,
     "declares"),
    (pack(None, raw=bytes([0xA1, 0x67]) + b"tensors" + bytes([0x9B]) + (2**40).to_bytes(8, "big")), CorruptError,
     "declares"),
    (pack(None, raw=bytes([0xBB]) + (2**60).to_bytes(8, "big")), CorruptError, "declares"),
    (pack(None, raw=bytes([0x81] * 200 + [0x00])), LimitError, "deeper"),
    (pack(None, raw=bytes([0xC1, 0x00])), CorruptError, "tag"),
    (pack(None, raw=bytes([0xBF, 0xFF])), CorruptError, "indefinite"),
    (pack(None, raw=cbor2.dumps({"tensors": {}}) + b"\x00"), CorruptError, "follow"),
    (pack(None, raw=bytes([0xA2, 0x61, 0x61, 0x00, 0x61, 0x61, 0x01])), CorruptError, "twice"),
    (pack(None, raw=bytes([0xA1, 0x63]) + b"\xff\xfe\xfd" + b"\x00"), CorruptError, "decode"),
])
def test_hostile_files_are_refused(tmp_path, data, error, match):
    refused(tmp_path, data, error, match)


def test_tensor_count_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(bp, "MAX_TENSOR_COUNT", 1)
    meta = {"tensors": {n: {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]} for n in "ab"}}
    refused(tmp_path, pack(meta), LimitError, "more than 1")


def test_unaligned_offsets_are_read_as_burn_reads_them(tmp_path):
    """Burn's reader does not require aligned offsets; neither does aprfast's."""
    values = np.float32([1, 2])
    path = tmp_path / "u.bpk"
    path.write_bytes(pack(one(offsets=(4, 12)), bytes(4) + values.tobytes()))
    src = bp.BurnpackSource(path)
    try:
        assert src.read(src.specs[0]).tolist() == [1, 2]
    finally:
        src.close()


def test_cbor_guard_accepts_what_cbor2_writes():
    for value in [{"a": [1, 2, {"b": b"x"}]}, [], {}, 1.5, "é", [[[]]], {"k": None, "t": True, "n": -2**63}]:
        bp.check_cbor(cbor2.dumps(value))


def test_cli_converts_to_and_from_burnpack(tmp_path, capsys):
    from aprfast.cli import main as apr

    (tmp_path / "g.bpk").write_bytes(GOLDEN)
    assert apr(["convert", str(tmp_path / "g.bpk"), str(tmp_path / "g.apr")]) == 0
    assert apr(["export", str(tmp_path / "g.apr"), str(tmp_path / "out.weights"), "--format", "burnpack"]) == 0
    assert (tmp_path / "out.weights").read_bytes() == GOLDEN
    assert "burnpack" in capsys.readouterr().out


def test_without_cbor2_the_error_names_the_extra(run_child, tmp_path):
    (tmp_path / "g.bpk").write_bytes(GOLDEN)
    script = ("import sys, importlib.abc\n"
              "class Hide(importlib.abc.MetaPathFinder):\n"
              "    def find_spec(self, name, path=None, target=None):\n"
              "        if name.split('.')[0] == 'cbor2': raise ModuleNotFoundError(name)\n"
              "sys.meta_path.insert(0, Hide())\n"
              "import aprfast\n"
              "try:\n"
              "    aprfast.convert(sys.argv[1], sys.argv[2])\n"
              "except ImportError as exc:\n"
              "    print(type(exc).__name__, exc)\n")
    out = run_child(script, tmp_path / "g.bpk", tmp_path / "g.apr").stdout
    assert "MissingDependencyError" in out and "aprfast[burnpack]" in out
