"""Burnpack against Burn's own crate (crates.io ``burn-pack``, through
``tests/interop/harness-burnpack``): files Burn writes convert to ``.apr`` with identical
values, param ids, metadata and scalars; files aprfast writes are read by Burn with
identical bytes, and are byte-identical to what Burn writes for the same tensors."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("cbor2")

import aprfast  # noqa: E402
from aprfast.convert import burnpack as bp  # noqa: E402

BURN_NAMES = {np.float64: "F64", np.float32: "F32", np.float16: "F16", np.int64: "I64", np.int32: "I32",
              np.int16: "I16", np.int8: "I8", np.uint64: "U64", np.uint32: "U32", np.uint16: "U16",
              np.uint8: "U8", np.bool_: "Bool"}


def model(rng):
    """Every plain Burn dtype, a 0-d, an empty and an odd-sized tensor, in a non-sorted order."""
    arrays = {}
    for dt, burn in BURN_NAMES.items():
        shape = (3, 5) if dt is not np.bool_ else (7,)
        values = rng.standard_normal(shape) * 100
        arrays[f"t.{burn.lower()}"] = (values > 0) if dt is np.bool_ else values.astype(dt)
    arrays["z.scalar"] = np.array(1.5, np.float32)
    arrays["a.empty"] = np.zeros((0, 4), np.float32)
    arrays["m.odd"] = rng.integers(0, 255, 13).astype(np.uint8)
    return arrays


def spec_of(arrays, param_ids=None, metadata=None, scalars=None):
    tensors = []
    for name, a in arrays.items():
        entry = {"name": name, "dtype": BURN_NAMES[a.dtype.type], "shape": list(a.shape),
                 "data_hex": np.ascontiguousarray(a).tobytes().hex()}
        if param_ids and name in param_ids:
            entry["param_id"] = param_ids[name]
        tensors.append(entry)
    return {"tensors": tensors, "metadata": metadata or {}, "scalars": scalars or {}}


def test_burn_files_convert_with_identical_values(burnpack, tmp_path, rng):
    arrays = model(rng)
    ids = {"t.f32": 42, "t.i8": 2**64 - 1, "m.odd": 0}
    scalars = {"lr": {"Float": 0.1}, "step": {"UInt": 2**63}, "neg": {"Int": -5}, "flag": {"Bool": True},
               "nan": {"Float": "NaN"}}
    result = burnpack.run("write", burnpack.write_spec(spec_of(arrays, ids, {"producer": "burn", "é": "ü"}, scalars)),
                          tmp_path / "burn.bpk")
    assert result["ok"], result
    aprfast.convert(tmp_path / "burn.bpk", tmp_path / "m.apr")
    with aprfast.open(tmp_path / "m.apr") as f:
        assert set(f.keys()) == set(arrays)
        for name, want in arrays.items():
            got = f.get_tensor(name)
            assert got.dtype == want.dtype and got.shape == want.shape
            assert got.tobytes() == want.tobytes()
        meta = f.metadata
    assert meta["producer"] == "burn" and meta["é"] == "ü"
    assert meta[bp.PARAM_IDS_KEY] == ids
    assert meta[bp.SCALARS_KEY]["lr"] == {"Float": 0.1} and meta[bp.SCALARS_KEY]["nan"] == {"Float": "nan"}
    assert meta[bp.SCALARS_KEY]["step"] == {"UInt": 2**63}
    # and back: Burn's bytes exactly (same layout order, same CBOR)
    aprfast.convert(tmp_path / "m.apr", tmp_path / "back.bpk")
    assert (tmp_path / "back.bpk").read_bytes() == (tmp_path / "burn.bpk").read_bytes()


def test_aprfast_files_are_read_by_burn(burnpack, tmp_path, rng):
    arrays = model(rng)
    aprfast.save_file(arrays, tmp_path / "m.apr", metadata={"n_layers": 2, "name": "tiny",
                                                           bp.PARAM_IDS_KEY: {"t.f64": 7}})
    aprfast.convert(tmp_path / "m.apr", tmp_path / "m.bpk")
    got = burnpack.run("read", tmp_path / "m.bpk")
    assert got["ok"], got
    by_name = {t["name"]: t for t in got["tensors"]}
    assert set(by_name) == set(arrays)
    for name, want in arrays.items():
        t = by_name[name]
        assert t["data_hex"] == np.ascontiguousarray(want).tobytes().hex()
        assert t["shape"] == list(want.shape)
        assert t["dtype"] == ("Bool(Native)" if want.dtype == np.bool_ else BURN_NAMES[want.dtype.type])
    assert by_name["t.f64"]["param_id"] == 7 and by_name["t.f32"]["param_id"] is None
    assert got["metadata"]["name"] == "tiny" and got["metadata"]["n_layers"] == "2"


def test_writer_matches_burn_byte_for_byte(burnpack, tmp_path, rng):
    """The same tensors in the same order, param ids, metadata and scalars: aprfast's
    BurnpackWriter and Burn's Writer give the same file."""
    arrays = model(rng)
    ids = {"t.u16": 99, "a.empty": 1}
    scalars = {"f16ok": {"Float": 0.5}, "f32ok": {"Float": 0.1000000014901161193847656}, "f64": {"Float": 0.1},
               "big": {"UInt": 300}, "i": {"Int": -70000}, "t": {"Bool": False}}
    result = burnpack.run("write", burnpack.write_spec(spec_of(arrays, ids, {"k": "v", "a": "b"}, scalars)),
                          tmp_path / "burn.bpk")
    assert result["ok"], result
    specs = [bp.Spec(n, aprfast.dtypes.from_numpy(a.dtype), a.shape) for n, a in arrays.items()]
    meta = {"k": "v", "a": "b", bp.PARAM_IDS_KEY: ids, bp.SCALARS_KEY: scalars}
    w = bp.BurnpackWriter(tmp_path / "py.bpk", specs, meta)
    for name, a in arrays.items():
        w.add(name, a)
    w.close()
    assert (tmp_path / "py.bpk").read_bytes() == (tmp_path / "burn.bpk").read_bytes()


@pytest.mark.parametrize("dtype", ["Flex32", "Bool(U8)", "Bool(U32)"])
def test_other_burn_dtypes_round_trip(burnpack, tmp_path, dtype):
    data = {"Flex32": np.float32([1.5, -2]), "Bool(U8)": np.uint8([1, 0]), "Bool(U32)": np.uint32([1, 0])}[dtype]
    spec = {"tensors": [{"name": "x", "dtype": dtype, "shape": [2], "data_hex": data.tobytes().hex()}]}
    assert burnpack.run("write", burnpack.write_spec(spec), tmp_path / "b.bpk")["ok"]
    aprfast.convert(tmp_path / "b.bpk", tmp_path / "m.apr")
    with aprfast.open(tmp_path / "m.apr") as f:
        assert f.get_tensor("x").tobytes() == data.tobytes()
    aprfast.convert(tmp_path / "m.apr", tmp_path / "back.bpk")
    assert (tmp_path / "back.bpk").read_bytes() == (tmp_path / "b.bpk").read_bytes()
    assert burnpack.run("read", tmp_path / "back.bpk")["tensors"][0]["dtype"] == dtype


def test_truncations_refused_by_both(burnpack, tmp_path, rng):
    """Every file Burn refuses, aprfast refuses with a typed error (and more besides)."""
    arrays = {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": np.arange(3, dtype=np.int64)}
    assert burnpack.run("write", burnpack.write_spec(spec_of(arrays)), tmp_path / "ok.bpk")["ok"]
    data = (tmp_path / "ok.bpk").read_bytes()
    for cut in sorted({0, 3, 9, 10, 11, 40, len(data) // 2, len(data) - 1}):
        path = tmp_path / f"cut{cut}.bpk"
        path.write_bytes(data[:cut])
        burn = burnpack.run("read", path)
        with pytest.raises(aprfast.AprError):
            aprfast.convert(path, tmp_path / f"cut{cut}.apr")
        assert not burn["ok"] or cut >= len(data)
