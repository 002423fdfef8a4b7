"""FP4 and FP6 (safetensors' F4, F6_E2M3, F6_E3M2; issue 27 item 5): NumPy arrays of
ml_dtypes' float4/float6 save and load, the packed layout is the one safetensors' own
parser accepts, and the values are ml_dtypes' (docs/FORMAT.md, "FP4 and FP6")."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import aprfast
from aprfast import dtypes
from aprfast.numerics.stats import tensor_stats

ml_dtypes = pytest.importorskip("ml_dtypes")
if not hasattr(ml_dtypes, "float6_e2m3fn"):  # ml_dtypes >= 0.5 has the float6 types
    pytest.skip(f"ml_dtypes {ml_dtypes.__version__} has no float6 types", allow_module_level=True)

#: aprfast name -> (safetensors name, bits, ml_dtypes type)
KINDS = {"F4_E2M1": ("F4", 4, ml_dtypes.float4_e2m1fn), "F6_E2M3": ("F6_E2M3", 6, ml_dtypes.float6_e2m3fn),
         "F6_E3M2": ("F6_E3M2", 6, ml_dtypes.float6_e3m2fn)}


def bitstream(codes, bits) -> bytes:
    """The packing written out the slow way: value i in bits [bits*i, bits*(i+1)) of a
    little-endian bit stream (the first value in the lowest bits of the first byte)."""
    acc = 0
    for i, code in enumerate(int(c) for c in codes):
        acc |= code << (bits * i)
    return acc.to_bytes(-(-len(codes) * bits // 8), "little")


def every_code(kind, shape):
    """An array of ``kind`` cycling through every code (both zeros included)."""
    bits = KINDS[kind][1]
    count = int(np.prod(shape))
    return (np.arange(count) % (1 << bits)).astype(np.uint8).view(KINDS[kind][2]).reshape(shape)


def st_with_f6():
    """The installed safetensors, skipping where it predates F6 (0.6)."""
    safetensors = pytest.importorskip("safetensors")
    try:
        safetensors.deserialize(safetensors_file([("x", "F6_E2M3", [4], bytes(3))]))
    except Exception:
        pytest.skip(f"safetensors {safetensors.__version__} has no F6_E2M3")
    return safetensors


def safetensors_file(entries) -> bytes:
    """A safetensors file built by hand from its spec: (name, dtype, shape, data)."""
    header, offset = {}, 0
    for name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(e[3] for e in entries)


@pytest.mark.parametrize("kind", KINDS)
def test_every_code_has_ml_dtypes_value(kind):
    bits, ml = KINDS[kind][1], KINDS[kind][2]
    codes = np.arange(1 << bits, dtype=np.uint8)
    packed = dtypes.pack_subbyte(codes, bits)
    assert packed.tobytes() == bitstream(codes, bits)
    ours = dtypes.subbyte_values(kind, packed, codes.shape)
    theirs = codes.view(ml).astype(np.float32)
    assert ours.view(np.uint32).tolist() == theirs.view(np.uint32).tolist()  # -0.0 included


@pytest.mark.parametrize("bits", [4, 6])
def test_pack_and_unpack_agree_for_every_count(bits):
    rng = np.random.default_rng(bits)
    for count in range(0, 19):
        codes = rng.integers(0, 1 << bits, count).astype(np.uint8)
        packed = dtypes.pack_subbyte(codes, bits)
        assert packed.tobytes() == bitstream(codes, bits).ljust(packed.size, b"\0")
        assert dtypes.unpack_subbyte(packed, bits, count).tolist() == codes.tolist()
    assert dtypes.DTYPES["F6_E2M3"].nbytes((5,)) == 6  # the last group of 4 padded, as F4 pads its nibble
    assert dtypes.DTYPES["F6_E2M3"].nbytes((2, 4)) == 6
    assert dtypes.pack_subbyte(np.array([1, 2], np.uint8), 4).tolist() == [0x21]  # low nibble first


def test_apr2_ids_and_names():
    assert dtypes.APR2_IDS.id_of(dtypes.DTYPES["F6_E2M3"]) == 69
    assert dtypes.APR2_IDS.id_of(dtypes.DTYPES["F6_E3M2"]) == 70
    assert dtypes.by_name("float6_e2m3fn").name == "F6_E2M3" and dtypes.by_name("f6_e3m2").name == "F6_E3M2"
    for kind, (_, _, ml) in KINDS.items():
        assert dtypes.from_numpy(ml).name == kind
    assert not dtypes.APRENDER_IDS.holds(dtypes.DTYPES["F6_E2M3"])


@pytest.mark.parametrize("backend", ["mmap", "pread"])
def test_numpy_arrays_save_and_load(tmp_path, backend):
    from aprfast.numpy import load, load_file, save, save_file

    arrays = {"f4": every_code("F4_E2M1", (4, 8)), "e2m3": every_code("F6_E2M3", (2, 64)),
              "e3m2": every_code("F6_E3M2", (3, 4, 8)), "odd": every_code("F6_E3M2", (5,)),
              "empty": np.zeros((0, 4), ml_dtypes.float6_e2m3fn)}
    save_file(arrays, tmp_path / "s.apr")
    info = aprfast.inspect(tmp_path / "s.apr")["tensors"]
    assert info["e2m3"] == {**info["e2m3"], "dtype": "F6_E2M3", "shape": [2, 64], "nbytes": 96}
    assert info["f4"]["nbytes"] == 16 and info["odd"]["nbytes"] == 6 and info["empty"]["nbytes"] == 0
    for loaded in (load_file(tmp_path / "s.apr", backend=backend), load(save(arrays))):
        for name, array in arrays.items():
            assert loaded[name].dtype == array.dtype and loaded[name].shape == array.shape
            assert loaded[name].view(np.uint8).tolist() == array.view(np.uint8).tolist()
    with aprfast.open(tmp_path / "s.apr") as f:  # the packed bytes, and their values
        raw = f.get_tensor("e2m3")
        assert raw.data.tobytes() == bitstream(arrays["e2m3"].view(np.uint8).reshape(-1), 6)
        want = arrays["e3m2"].astype(np.float32)
        np.testing.assert_array_equal(f.get_tensor("e3m2", dequantize=True), want)
        np.testing.assert_array_equal(aprfast.dequantize(f.get_tensor("e3m2")), want)
    with aprfast.safe_open(tmp_path / "s.apr", framework="np") as f:
        assert f.get_slice("f4").get_dtype() == "F4" and f.get_slice("e2m3").get_dtype() == "F6_E2M3"
        assert f.get_tensor("e2m3").dtype == ml_dtypes.float6_e2m3fn


def test_aprender_layout_refuses_fp6(tmp_path):
    with pytest.raises(aprfast.LayoutError, match="F6_E2M3"):
        aprfast.save_file({"x": every_code("F6_E2M3", (4,))}, tmp_path / "a.apr", layout="aprender")


def test_safetensors_parser_reads_what_aprfast_writes(tmp_path):
    safetensors = st_with_f6()
    arrays = {"f4": every_code("F4_E2M1", (2, 6)), "e2m3": every_code("F6_E2M3", (16, 4)),
              "e3m2": every_code("F6_E3M2", (2, 2, 8))}
    aprfast.save_file(arrays, tmp_path / "s.apr")
    aprfast.convert(tmp_path / "s.apr", tmp_path / "s.safetensors")
    raw = (tmp_path / "s.safetensors").read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    with safetensors.safe_open(str(tmp_path / "s.safetensors"), framework="numpy") as f:
        for name, array in arrays.items():
            st_name, bits, _ = KINDS[dtypes.from_numpy(array.dtype).name]
            part = f.get_slice(name)
            assert part.get_shape() == list(array.shape) and part.get_dtype() == st_name  # the logical shape
            begin, end = header[name]["data_offsets"]
            assert end - begin == array.size * bits // 8  # numel x bits / 8, exactly
    for name, entry in safetensors.deserialize(raw):  # safetensors' own slicing of the data section
        codes = arrays[name].view(np.uint8).reshape(-1)
        assert bytes(entry["data"]) == bitstream(codes, KINDS[dtypes.from_numpy(arrays[name].dtype).name][1])


def test_a_hand_built_safetensors_file_imports_with_ml_dtypes_values(tmp_path):
    safetensors = st_with_f6()
    rng = np.random.default_rng(6)
    codes = {kind: rng.integers(0, 1 << KINDS[kind][1], 24).astype(np.uint8) for kind in KINDS}
    entries = [(kind.lower(), KINDS[kind][0], [2, 12], bitstream(c, KINDS[kind][1])) for kind, c in codes.items()]
    original = safetensors_file(entries)
    (tmp_path / "h.safetensors").write_bytes(original)
    parsed = {name: (e["dtype"], e["shape"]) for name, e in safetensors.deserialize(original)}
    assert parsed == {name: (dtype, shape) for name, dtype, shape, _ in entries}  # its parser takes the file
    aprfast.convert(tmp_path / "h.safetensors", tmp_path / "h.apr")
    with aprfast.open(tmp_path / "h.apr") as f:
        for kind, c in codes.items():
            want = c.view(KINDS[kind][2]).astype(np.float32).reshape(2, 12)
            np.testing.assert_array_equal(f.get_tensor(kind.lower(), dequantize=True), want)
    stats = tensor_stats(aprfast.load_file(tmp_path / "h.apr")["f6_e3m2"])
    assert stats.mean == pytest.approx(float(codes["F6_E3M2"].view(ml_dtypes.float6_e3m2fn).astype(np.float64).mean()))
    aprfast.convert(tmp_path / "h.apr", tmp_path / "back.safetensors")
    back = (tmp_path / "back.safetensors").read_bytes()
    assert sorted(safetensors.deserialize(back)) == sorted(safetensors.deserialize(original))
    assert back.endswith(b"".join(e[3] for e in entries))  # the same data section (the JSON's spacing is ours)


def test_sizes_safetensors_refuses_are_refused(tmp_path):
    safetensors = st_with_f6()
    # 6 values x 6 bits = 36 bits: not whole bytes (safetensors: MisalignedSlice)
    bad = safetensors_file([("x", "F6_E2M3", [6], bytes(5))])
    with pytest.raises(Exception, match="byte boundary"):
        safetensors.deserialize(bad)
    (tmp_path / "bad.safetensors").write_bytes(bad)
    with pytest.raises(aprfast.CorruptError, match="'x'.*not a multiple of 4"):
        aprfast.convert(tmp_path / "bad.safetensors", tmp_path / "bad.apr")
    short = safetensors_file([("x", "F6_E3M2", [8], bytes(5))])  # 8 values need 6 bytes
    (tmp_path / "short.safetensors").write_bytes(short)
    with pytest.raises(aprfast.CorruptError, match="'x'.*needs 6 bytes"):
        aprfast.convert(tmp_path / "short.safetensors", tmp_path / "short.apr")
    aprfast.save_file({"odd": every_code("F6_E2M3", (5,))}, tmp_path / "odd.apr")  # .apr pads the last group
    with pytest.raises(aprfast.LayoutError, match="'odd'.*multiple of 4"):
        aprfast.convert(tmp_path / "odd.apr", tmp_path / "odd.safetensors")
