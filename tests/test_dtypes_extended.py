"""float8 (e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, e8m0fnu) and complex64/128: bit-exact round
trips, NaN payloads included, through NumPy (with and without ml_dtypes) and torch
(issue 11 part 1)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aprfast
from aprfast import dtypes
from aprfast.errors import LayoutError

ml_dtypes = pytest.importorskip("ml_dtypes")

FLOAT8 = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E4M3FNUZ": "float8_e4m3fnuz",
          "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu"}
FLOAT8 = {k: v for k, v in FLOAT8.items() if hasattr(ml_dtypes, v)}


def _every_byte(ml_name, shape=(16, 16)):
    """All 256 bit patterns (NaNs, infinities, negative zero included)."""
    return np.arange(256, dtype=np.uint8).reshape(shape).view(getattr(ml_dtypes, ml_name))


@pytest.mark.parametrize("name", sorted(FLOAT8))
def test_float8_every_bit_pattern_round_trips(tmp_path, name):
    values = _every_byte(FLOAT8[name])
    path = tmp_path / "f8.apr"
    aprfast.save_file({"w": values}, path)
    with aprfast.open(path) as f:
        assert f.layout == "apr2"  # aprender's layout has no float8 id
        assert f.info("w").dtype is dtypes.DTYPES[name]
        back = f.get_tensor("w")
    assert back.dtype == values.dtype
    assert back.tobytes() == values.tobytes()


@pytest.mark.parametrize("name", sorted(FLOAT8))
def test_float8_without_ml_dtypes_comes_back_as_its_bits(tmp_path, name, monkeypatch):
    values = _every_byte(FLOAT8[name])
    path = tmp_path / "f8.apr"
    aprfast.save_file({"w": values}, path)
    monkeypatch.setattr(dtypes, "_ML_NUMPY", {})
    with aprfast.open(path) as f:
        back = f.get_tensor("w")
        assert f.info("w").dtype_name == name
    assert back.dtype == np.uint8
    np.testing.assert_array_equal(back, values.view(np.uint8))


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_complex_round_trips_with_nan_payloads(tmp_path, dtype):
    values = np.array([1 + 2j, -0.0 - 0.0j, np.inf - 1j, complex(np.nan, 3)], dtype)
    bits = values.view(np.uint32 if dtype is np.complex64 else np.uint64).copy()
    bits[-1] |= bits.dtype.type(1)  # a NaN payload in a real part must survive too (typed: NumPy 1.x)
    values = bits.view(dtype)
    back = aprfast.load(aprfast.save({"z": values}))["z"]
    assert back.dtype == dtype and back.tobytes() == values.tobytes()


@pytest.mark.parametrize("value", [np.zeros(2, np.complex64), _every_byte("float8_e4m3fn")])
def test_aprender_layout_refuses_types_it_has_no_id_for(value):
    with pytest.raises(LayoutError, match="aprender layout has no dtype id"):
        aprfast.save({"x": value}, layout="aprender")


@pytest.mark.parametrize("alias, name", [("float8_e4m3fn", "F8_E4M3"), ("F8_E8M0FNU", "F8_E8M0"),
                                         ("complex64", "C64"), ("c128", "C128")])
def test_dtype_names_and_aliases(alias, name):
    assert dtypes.by_name(alias) is dtypes.DTYPES[name]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(FLOAT8)), st.lists(st.integers(0, 255), min_size=0, max_size=64))
def test_float8_any_bits_any_length(name, raw):
    values = np.array(raw, np.uint8).view(getattr(ml_dtypes, FLOAT8[name]))
    back = aprfast.load(aprfast.save({"v": values}))["v"]
    assert back.shape == values.shape and back.tobytes() == values.tobytes()


def test_float8_and_complex_through_torch(tmp_path):
    torch = pytest.importorskip("torch")
    import aprfast.torch as apr_torch

    kinds = [k for k in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                         "float8_e8m0fnu") if hasattr(torch, k)]
    tensors = {k: torch.arange(256, dtype=torch.uint8).view(getattr(torch, k)) for k in kinds}
    tensors["c64"] = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    tensors["c128"] = torch.tensor([1j], dtype=torch.complex128)
    path = tmp_path / "t.apr"
    apr_torch.save_file(tensors, path)
    for backend in ("mmap", "pread"):
        back = apr_torch.load_file(path, backend=backend)
        for k, v in tensors.items():
            assert back[k].dtype == v.dtype
            assert back[k].view(torch.uint8).tolist() == v.view(torch.uint8).tolist()
    with aprfast.safe_open(path, "np") as f:  # the same file read as NumPy
        assert f.get_tensor("c64").dtype == np.complex64


# --- FP4 e2m1: two values per byte ----------------------------------------------------
def test_fp4_is_stored_packed_and_read_back_as_its_bytes(tmp_path):
    packed = np.arange(12, dtype=np.uint8)
    path = tmp_path / "f4.apr"
    aprfast.save_file({"f": aprfast.QuantizedTensor(dtypes.DTYPES["F4_E2M1"], (2, 12), packed)}, path)
    with aprfast.open(path) as f:
        assert f.layout == "apr2"
        info = f.info("f")
        assert info.dtype_name == "F4_E2M1" and info.shape == (2, 12) and info.nbytes == 12
        np.testing.assert_array_equal(f.get_tensor("f").data, packed)


def test_fp4_odd_count_rounds_up_to_whole_bytes():
    assert dtypes.DTYPES["F4_E2M1"].nbytes((3, 5)) == 8  # 15 values, packed across rows


def test_fp4_through_torch(tmp_path):
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("this torch has no float4_e2m1fn_x2")
    import aprfast.torch as apr_torch

    fp4 = torch.arange(12, dtype=torch.uint8).reshape(2, 6).view(torch.float4_e2m1fn_x2)
    path = tmp_path / "f4.apr"
    apr_torch.save_file({"f": fp4}, path)
    assert aprfast.inspect(path)["tensors"]["f"]["shape"] == [2, 12]  # logical values
    for backend in ("mmap", "pread"):
        back = apr_torch.load_file(path, backend=backend)["f"]
        assert back.dtype == fp4.dtype and back.shape == fp4.shape
        assert torch.equal(back.view(torch.uint8), fp4.view(torch.uint8))
    meta = apr_torch.load_file(path, device="meta")["f"]
    assert meta.shape == (2, 6) and meta.dtype == fp4.dtype
