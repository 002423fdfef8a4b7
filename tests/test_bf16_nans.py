"""BF16 NaNs (issue 27): a GGUF gets them as ggml and gguf-py round float32 to bfloat16
(``(bits >> 16) | 0x40``: sign and upper payload kept, quiet bit set), other
destinations as ml_dtypes does (the quiet NaN of the sign); docs/FORMAT.md "BF16 NaNs"."""

from __future__ import annotations

import numpy as np
import pytest

import aprfast

gguf = pytest.importorskip("gguf")
ml_dtypes = pytest.importorskip("ml_dtypes")

from safetensors.numpy import load_file, save_file  # noqa: E402

#: float32 NaNs of every kind: signalling and quiet, both signs, payload only in the
#: low half (ggml keeps none of it), in the high half, all ones
NAN_BITS = [0x7F800001, 0xFF800001, 0x7FC00000, 0xFFC00000, 0x7FA12345, 0xFFA1FFFF, 0x7FFFFFFF, 0xFFFFFFFF,
            0x7F80FFFF, 0x7F810000, 0x7FBF0000, 0xFFE00001]


def _samples():
    rng = np.random.default_rng(27)
    bits = rng.integers(0, 1 << 32, 4096, dtype=np.uint64).astype(np.uint32)
    nans = rng.integers(0, 1 << 23, 1024, dtype=np.uint32) | 1 | 0x7F800000
    nans[::2] |= 0x80000000
    special = np.array(NAN_BITS + [0x7F800000, 0xFF800000, 0, 0x80000000, 0x3F808000, 0x3F818000], np.uint32)
    return np.concatenate([bits, nans, special]).view(np.float32)


def _gguf_bf16(values):
    with np.errstate(invalid="ignore"):  # gguf-py's casts of signalling NaNs raise the invalid flag
        return gguf.quants.quantize(np.asarray(values), gguf.GGMLQuantizationType.BF16).reshape(-1).view(np.uint16)


def _ml_dtypes_bf16(values):
    with np.errstate(invalid="ignore"):
        return values.astype(ml_dtypes.bfloat16).view(np.uint16)


def test_ggml_rounding_is_gguf_pys_bit_for_bit():
    x = _samples()
    got = aprfast.to_bfloat16(x, ggml=True).view(np.uint16)
    assert np.array_equal(got, _gguf_bf16(x))
    assert np.isnan(x).sum() > 1000  # the samples hold NaNs of many payloads
    # float64 and float16 NaNs: converted to float32 first, as gguf-py converts them
    with np.errstate(invalid="ignore"):
        wide = x.astype(np.float64)
        narrow = wide.astype(np.float32)
        half = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
        widened = half.astype(np.float32)
    assert np.array_equal(aprfast.to_bfloat16(wide, ggml=True).view(np.uint16), _gguf_bf16(narrow))
    assert np.array_equal(aprfast.to_bfloat16(half, ggml=True).view(np.uint16), _gguf_bf16(widened))


def test_the_default_rounding_stays_ml_dtypes():
    x = _samples()
    assert np.array_equal(aprfast.to_bfloat16(x).view(np.uint16), _ml_dtypes_bf16(x))
    differ = aprfast.to_bfloat16(x).view(np.uint16) != aprfast.to_bfloat16(x, ggml=True).view(np.uint16)
    assert np.array_equal(differ & ~np.isnan(x), np.zeros_like(differ))  # only NaNs differ
    assert differ.any()


def test_convert_to_gguf_rounds_nans_as_ggml_and_to_safetensors_as_before(tmp_path):
    x = _samples().reshape(-1, 2)
    save_file({"w": x}, str(tmp_path / "x.safetensors"))
    aprfast.convert(tmp_path / "x.safetensors", tmp_path / "x.gguf", precision="bf16", validate="off",
                    max_drift=None)
    (tensor,) = gguf.GGUFReader(str(tmp_path / "x.gguf")).tensors
    assert tensor.tensor_type == gguf.GGMLQuantizationType.BF16
    assert np.array_equal(np.asarray(tensor.data).reshape(-1).view(np.uint16), _gguf_bf16(x.reshape(-1)))
    aprfast.convert(tmp_path / "x.safetensors", tmp_path / "y.safetensors", precision="bf16", validate="off",
                    max_drift=None)
    got = load_file(str(tmp_path / "y.safetensors"))["w"]
    assert np.array_equal(got.view(np.uint16), _ml_dtypes_bf16(x))
