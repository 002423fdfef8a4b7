"""Every GGML block type dequantizes bit for bit (issue 27 item 2).

* The C kernels (every path, one and two threads) and the pure-Python twin give
  gguf-py's ``gguf.quants.dequantize`` floats exactly, NaN payloads included, on
  random bytes (so NaN, infinite and subnormal scales too) and on every special
  float16 in every scale field.
* Q8_1, Q8_K and Q1_0, which gguf-py cannot dequantize, match NumPy transcriptions
  of ggml's ``dequantize_row_*`` below.
* The IQ grids compiled into the kernels (csrc/iq_grids.h) and the pure twin's
  (aprfast/_pure/_iq_grids.py) are gguf-py's, and csrc/gen_iq_grids.py regenerates
  both files unchanged.
* ``aprfast.dequantize``, ``get_tensor(..., dequantize=True)`` and
  ``convert(..., precision="f32")`` give the same floats.
"""

from __future__ import annotations

import importlib.util
import re
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")

import aprfast  # noqa: E402
from aprfast import _quant as q  # noqa: E402
from aprfast import dtypes  # noqa: E402
from aprfast._pure import _iq_grids  # noqa: E402
from aprfast._pure import _quant as pure  # noqa: E402
from aprfast.numerics.quantization import quant_type  # noqa: E402
from aprfast.tensors import QuantizedTensor  # noqa: E402

F32 = np.float32
ROOT = Path(__file__).resolve().parent.parent
GGMLType = gguf.GGMLQuantizationType
#: The types added for issue 27 (quant.c's older GGML types are tested in test_quant_kernels.py).
NEW_TYPES = ("Q8_1", "Q2_K", "Q3_K", "Q5_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S",
             "IQ2_S", "IQ4_XS", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "Q1_0")
#: Those of them aprfast can also quantize (tested in test_quant_kernels.py, test_kquant_quantize.py,
#: test_iq4_quantize.py and test_iq3s_q1_0_quantize.py).
WITH_QUANTIZER = ("Q2_K", "Q3_K", "Q5_K", "Q8_K", "IQ4_NL", "IQ4_XS", "IQ3_S", "TQ1_0", "TQ2_0", "MXFP4", "Q1_0")
#: gguf-py 0.19 has no dequantizer for these: ggml's C is the reference.
GGML_ONLY = ("Q8_1", "Q8_K", "Q1_0")
GGUF_PY = tuple(t for t in NEW_TYPES if t not in GGML_ONLY)
#: Byte offsets of each type's float16 scale fields (IQ1_M's d is spread over its scales).
F16_FIELDS = {"Q8_1": (0, 2), "Q2_K": (80, 82), "Q3_K": (108,), "Q5_K": (0, 2), "IQ2_XXS": (0,), "IQ2_XS": (0,),
              "IQ3_XXS": (0,), "IQ1_S": (0,), "IQ4_NL": (0,), "IQ3_S": (0,), "IQ2_S": (0,), "IQ4_XS": (0,),
              "TQ1_0": (52,), "TQ2_0": (64,), "Q1_0": (0,)}
SPECIAL_F16 = (0x7E00, 0xFE00, 0x7C01, 0x7D55, 0x7C00, 0xFC00, 0x0001, 0x83FF, 0x0000, 0x8000, 0x7BFF, 0x0400)
PATHS = q.available_paths()


def reference(raw: np.ndarray, type_name: str) -> np.ndarray:
    """gguf-py's floats, or ggml's (transcribed) for the types gguf-py lacks."""
    elems, nbytes = q.block_info(type_name)
    blocks = np.asarray(raw, np.uint8).reshape(-1, nbytes)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        if type_name in GGML_ONLY:
            return GGML_REFERENCE[type_name](blocks).astype(F32).ravel()
        return gguf.quants.dequantize(blocks, getattr(GGMLType, type_name)).ravel()


def f16(blocks, at):
    return blocks[:, at:at + 2].copy().view("<f2").astype(F32)


def ggml_q8_1(blocks):
    """dequantize_row_q8_0's rule on Q8_1's layout (ggml has no Q8_1 to_float): y = q * d."""
    return blocks[:, 4:36].view(np.int8).astype(F32) * f16(blocks, 0)


def ggml_q8_k(blocks):
    """dequantize_row_q8_K: y = d * qs[j], d an f32."""
    return blocks[:, 0:4].copy().view("<f4") * blocks[:, 4:260].view(np.int8).astype(F32)


def ggml_q1_0(blocks):
    """dequantize_row_q1_0: bit j of qs (lowest first) ? d : -d."""
    d = f16(blocks, 0)
    bits = np.unpackbits(blocks[:, 2:18], axis=1, bitorder="little").astype(bool)
    return np.where(bits, d, -d)


GGML_REFERENCE = {"Q8_1": ggml_q8_1, "Q8_K": ggml_q8_k, "Q1_0": ggml_q1_0}


def ours(raw, type_name, *, path=None, threads=1, backend=q) -> np.ndarray:
    elems, nbytes = q.block_info(type_name)
    out = np.full(raw.size // nbytes * elems, np.nan, F32)
    backend.dequantize(type_name, np.ascontiguousarray(raw, np.uint8).ravel(), out, path=path, threads=threads)
    return out


def assert_same_bits(got, want, what):
    got, want = np.asarray(got, F32).view(np.uint32), np.asarray(want, F32).view(np.uint32)
    assert got.shape == want.shape, what
    diff = np.flatnonzero(got != want)
    assert diff.size == 0, (f"{what}: {diff.size} of {got.size} differ, first at {diff[0]}: "
                            f"{got[diff[0]]:#010x} != {want[diff[0]]:#010x}")


def random_raw(type_name, nblocks, seed=None):
    rng = np.random.default_rng(zlib.crc32(type_name.encode()) if seed is None else seed)
    return rng.integers(0, 256, nblocks * q.block_info(type_name)[1], dtype=np.uint8)


@pytest.mark.parametrize("type_name", NEW_TYPES)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("threads", (1, 2))
def test_c_kernels_give_the_reference_bits_on_random_blocks(type_name, path, threads):
    """Random bytes: about one scale in 32 is a NaN or an infinity, payloads of every kind."""
    raw = random_raw(type_name, 4096 // q.block_info(type_name)[0] * 16)
    assert_same_bits(ours(raw, type_name, path=path, threads=threads), reference(raw, type_name), type_name)


@pytest.mark.parametrize("type_name", NEW_TYPES)
def test_two_threads_split_a_large_tensor_as_one_does(type_name):
    elems, nbytes = q.block_info(type_name)
    raw = random_raw(type_name, ((1 << 19) + 7 * 256) // elems + 3, seed=99)
    assert_same_bits(ours(raw, type_name, threads=2), reference(raw, type_name), type_name)


@pytest.mark.parametrize("type_name", sorted(F16_FIELDS))
@pytest.mark.parametrize("path", PATHS)
def test_every_special_float16_scale(type_name, path):
    """Each special float16 in each scale field (all pairs where a block has two)."""
    fields = F16_FIELDS[type_name]
    _, nbytes = q.block_info(type_name)
    combos = np.array(np.meshgrid(*[SPECIAL_F16] * len(fields))).reshape(len(fields), -1).T
    blocks = random_raw(type_name, len(combos), seed=5).reshape(-1, nbytes)
    for i, combo in enumerate(combos):
        for at, h in zip(fields, combo):
            blocks[i, at:at + 2] = np.array([h], "<u2").view(np.uint8)
    assert_same_bits(ours(blocks, type_name, path=path), reference(blocks, type_name), type_name)


@pytest.mark.parametrize("path", PATHS)
def test_iq1_m_special_scales(path):
    """IQ1_M's f16 d is the top nibbles of its four u16 scale words."""
    blocks = random_raw("IQ1_M", len(SPECIAL_F16), seed=6).reshape(-1, 56)
    for i, h in enumerate(SPECIAL_F16):
        words = blocks[i, 48:56].copy().view("<u2")
        for k in range(4):
            words[k] = (words[k] & 0x0FFF) | (((h >> (4 * k)) & 0xF) << 12)
        blocks[i, 48:56] = words.view(np.uint8)
    assert_same_bits(ours(blocks, "IQ1_M", path=path), reference(blocks, "IQ1_M"), "IQ1_M")


@pytest.mark.parametrize("path", PATHS)
def test_fp4_scales_every_byte(path):
    """MXFP4's e8m0 and NVFP4's ue4m3 scales, all 256 values (0x7F and the top bit included)."""
    mx = random_raw("MXFP4", 256, seed=7).reshape(-1, 17)
    mx[:, 0] = np.arange(256)
    assert_same_bits(ours(mx, "MXFP4", path=path), reference(mx, "MXFP4"), "MXFP4")
    nv = random_raw("NVFP4", 64, seed=8).reshape(-1, 36)
    nv[:, 0:4] = np.arange(256, dtype=np.uint8).reshape(64, 4)
    assert_same_bits(ours(nv, "NVFP4", path=path), reference(nv, "NVFP4"), "NVFP4")


@settings(deadline=None, max_examples=60)
@given(st.sampled_from(NEW_TYPES), st.data())
def test_any_bytes_c_and_pure_give_the_reference(type_name, data):
    nbytes = q.block_info(type_name)[1]
    count = data.draw(st.integers(1, 3))
    raw = np.frombuffer(data.draw(st.binary(min_size=count * nbytes, max_size=count * nbytes)), np.uint8)
    want = reference(raw, type_name)
    assert_same_bits(ours(raw, type_name), want, f"C {type_name}")
    assert_same_bits(ours(raw, type_name, backend=pure), want, f"pure {type_name}")


@pytest.mark.parametrize("type_name", NEW_TYPES)
def test_pure_twin_matches_on_random_blocks(type_name):
    raw = random_raw(type_name, 64, seed=11)
    assert_same_bits(ours(raw, type_name, backend=pure), reference(raw, type_name), type_name)


def test_sizes_and_refusals():
    for type_name in NEW_TYPES:
        d = dtypes.by_name(type_name)
        assert q.block_info(type_name) == pure.block_info(type_name) == (d.block_elems, d.block_bytes)
        assert q.can_quantize(type_name) == pure.can_quantize(type_name) == (type_name in WITH_QUANTIZER)
        with pytest.raises(ValueError, match="not a multiple of the block size"):
            q.dequantize(type_name, np.zeros(d.block_bytes, np.uint8), np.zeros(d.block_elems + 1, F32))
        with pytest.raises(ValueError, match=f"{d.block_bytes + 1} bytes"):
            q.dequantize(type_name, np.zeros(d.block_bytes + 1, np.uint8), np.zeros(d.block_elems, F32))
        if type_name not in WITH_QUANTIZER:
            with pytest.raises(ValueError, match=f"{type_name} can be dequantized but not quantized"):
                q.quantize(type_name, np.zeros(d.block_elems, F32), np.zeros(d.block_bytes, np.uint8))
    assert list(q.TYPES) == list(pure.TYPES)


# --- the IQ grids -----------------------------------------------------------------------
def generator():
    spec = importlib.util.spec_from_file_location("gen_iq_grids", ROOT / "csrc" / "gen_iq_grids.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gguf_py_grid(name):
    cls = getattr(gguf.quants, name)
    cls.init_grid()
    return cls.grid.reshape(cls.grid_shape)


def c_header_grids():
    text = (ROOT / "csrc" / "iq_grids.h").read_text(encoding="utf-8")
    grids = {}
    for name, rows, cols, body in re.findall(r"apr_(\w+)_grid\[(\d+)\]\[(\d+)\] = \{(.*?)\};", text, re.S):
        values = [int(v) for v in re.findall(r"-?\d+", body)]
        grids[name.upper()] = np.array(values, F32).reshape(int(rows), int(cols))
    ksigns = re.search(r"apr_iq_ksigns\[128\] = \{(.*?)\};", text, re.S).group(1)
    return grids, bytes(int(v) for v in re.findall(r"\d+", ksigns))


def test_the_c_grids_are_gguf_py_s():
    grids, ksigns = c_header_grids()
    assert set(grids) == {"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S"}
    for name, grid in grids.items():
        np.testing.assert_array_equal(grid, gguf_py_grid(name), err_msg=name)
    assert ksigns == gguf.quants.IQ2_XXS.ksigns
    np.testing.assert_array_equal(gguf_py_grid("IQ1_M"), grids["IQ1_S"])


def test_the_pure_grids_are_gguf_py_s():
    for name in _iq_grids.GRIDS:
        np.testing.assert_array_equal(pure._grid(name), gguf_py_grid(name), err_msg=name)
    assert _iq_grids.KSIGNS == gguf.quants.IQ2_XXS.ksigns


def test_the_generator_reproduces_the_committed_files():
    gen = generator()
    grids, ksigns = gen.gguf_tables()
    assert gen.render_c(grids, ksigns) == (ROOT / "csrc" / "iq_grids.h").read_text(encoding="utf-8")
    # the twin of the package that runs (CI tests the installed wheel from a tree without aprfast/)
    twin = Path(aprfast.__file__).resolve().parent / "_pure" / "_iq_grids.py"
    assert gen.render_py(grids, ksigns) == twin.read_text(encoding="utf-8")


# --- the public API ---------------------------------------------------------------------
def quantized(type_name, rows=3, blocks_per_row=2, seed=21):
    d = dtypes.by_name(type_name)
    raw = random_raw(type_name, rows * blocks_per_row, seed=seed)
    return QuantizedTensor(d, (rows, blocks_per_row * d.block_elems), raw), raw


@pytest.mark.parametrize("type_name", NEW_TYPES)
def test_aprfast_dequantize_and_get_tensor(tmp_path, type_name):
    qt, raw = quantized(type_name)
    want = reference(raw, type_name).reshape(qt.shape)
    got = aprfast.dequantize(qt)
    assert got.shape == qt.shape and got.dtype == F32
    assert_same_bits(got, want, type_name)
    aprfast.save_file({"w": qt}, tmp_path / "m.apr")
    with aprfast.open(tmp_path / "m.apr") as f:
        assert_same_bits(f.get_tensor("w", dequantize=True), want, type_name)
    kind = quant_type(type_name)
    assert kind.name == type_name and kind.can_quantize == (type_name in WITH_QUANTIZER)
    if type_name not in WITH_QUANTIZER:
        with pytest.raises(aprfast.LayoutError, match=f"no {type_name} quantizer"):
            aprfast.quantize(np.zeros(qt.shape, F32), type_name)


def test_gguf_to_apr_with_precision_f32_gives_gguf_py_s_floats(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "a.gguf"), "llama")
    expected = {}
    for type_name in GGUF_PY:
        qt, raw = quantized(type_name, seed=zlib.crc32(type_name.encode()))
        w.add_tensor(f"t.{type_name.lower()}", raw.reshape(qt.shape[0], -1), raw_dtype=getattr(GGMLType, type_name))
        expected[f"t.{type_name.lower()}"] = reference(raw, type_name).reshape(qt.shape)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    aprfast.convert(tmp_path / "a.gguf", tmp_path / "a.apr", precision="f32", validate="off")
    loaded = aprfast.load_file(tmp_path / "a.apr")
    for name, want in expected.items():
        assert loaded[name].dtype == F32
        assert_same_bits(loaded[name], want, name)


def test_stats_of_every_type_count_the_dequantized_values(tmp_path):
    """`apr tensors --stats` and the validator read the new types through the C kernels."""
    from aprfast.numerics.stats import tensor_stats

    for type_name in NEW_TYPES:
        qt, raw = quantized(type_name, seed=3)
        values = reference(raw, type_name)
        stats = tensor_stats(qt)
        assert stats.count == values.size
        assert stats.nan_count == int(np.isnan(values).sum()), type_name
