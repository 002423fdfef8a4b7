"""IQ4_NL and IQ4_XS quantizers give the bytes of ggml's own, without an importance matrix.

gguf-py cannot quantize the IQ types, so the oracle is ggml's C: ``ggml_quantize_chunk``
(what llama-quantize runs; it calls ``quantize_iq4_nl`` / ``quantize_iq4_xs`` with the
15-step scale search, unlike ``quantize_row_iq4_nl_ref``, which skips it) in the
``libggml-base`` shared library llama-cpp-python builds, through ctypes.  Where
llama-cpp-python is missing these tests skip with the reason, unless
``APRFAST_REQUIRE_ENGINES=1``, which makes that a failure.

Blocks holding a NaN are compared only between the kernels built as the wheel builds
them and ggml, as for the K-quants (test_kquant_quantize.py's notes): the sign of a NaN
scale follows the compiler's operand order.
"""

from __future__ import annotations

import ctypes
import os
import zlib

import numpy as np
import pytest
from test_kquant_quantize import PATHS, SPECIAL, assert_same, ggml_base, ours, random_input

import aprfast
from aprfast import _quant as q
from aprfast import backend

F32 = np.float32
IQ4_TYPES = ("IQ4_NL", "IQ4_XS")
#: GGML type ids (ggml.h's enum ggml_type).
GGML_IDS = {"IQ4_NL": 20, "IQ4_XS": 23}


@pytest.fixture(scope="module")
def chunk():
    """libggml-base's ggml_quantize_chunk, its signature set."""
    fn = ggml_base().ggml_quantize_chunk
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_void_p]
    fn.restype = ctypes.c_size_t
    return fn


def ggml_quantize(fn, type_name, x, row=256, ids=GGML_IDS) -> np.ndarray:
    """ggml_quantize_chunk of ``x`` as rows of ``row`` values, no importance matrix;
    ``ids``: type name -> GGML type id."""
    x = np.ascontiguousarray(x, F32).reshape(-1)
    out = np.zeros(q.quantized_nbytes(type_name, x.size), np.uint8)
    assert fn(ids[type_name], x.ctypes.data, out.ctypes.data, 0, x.size // row, row, None) == out.size
    return out


def pure_quantize(type_name, x) -> np.ndarray:
    """The NumPy twin's bytes for ``x`` (the output prefilled so a byte it skips shows);
    special blocks (NaN, huge values) make NumPy warn on the way, which is not the test's
    subject."""
    from aprfast._pure import _quant as pure

    x = np.ascontiguousarray(x, F32).reshape(-1)
    out = np.full(q.quantized_nbytes(type_name, x.size), 0xA5, np.uint8)
    with np.errstate(all="ignore"):
        pure.quantize(type_name, x, out)
    return out


def assert_matches_ggml(chunk, type_name, x, label, quantize=ggml_quantize):
    """The compiled kernel's and the NumPy twin's bytes for ``x`` are ``quantize``'s
    (ggml_quantize_chunk's)."""
    want = quantize(chunk, type_name, x)
    assert_same(ours(type_name, x), want, label)
    assert_same(pure_quantize(type_name, x), want, f"pure {label}")

@pytest.mark.parametrize("type_name", IQ4_TYPES)
@pytest.mark.parametrize("path", PATHS)
def test_iq4_quantize_matches_ggml_on_random_data(chunk, type_name, path):
    x = random_input(zlib.crc32(type_name.encode()))
    want = ggml_quantize(chunk, type_name, x)
    assert_same(ours(type_name, x, path), want, type_name)
    assert_same(pure_quantize(type_name, x), want, f"pure {type_name}")


@pytest.mark.parametrize("type_name", IQ4_TYPES)
def test_iq4_quantize_matches_ggml_on_weights_like_a_model_s(chunk, type_name):
    x = (np.random.default_rng(11).standard_normal((16, 512)) * 0.02).astype(F32)
    assert_same(ours(type_name, x), ggml_quantize(chunk, type_name, x, 512), type_name)


@pytest.mark.parametrize("type_name", IQ4_TYPES)
@pytest.mark.parametrize("block_name", list(SPECIAL))
def test_iq4_quantize_matches_ggml_on_special_blocks(chunk, type_name, block_name):
    block = SPECIAL[block_name]
    padded = np.concatenate([random_input(1, 1), block, random_input(2, 1)])
    for x in (block, padded):
        assert_matches_ggml(chunk, type_name, x, f"{type_name} {block_name}")


@pytest.mark.parametrize("type_name", IQ4_TYPES)
def test_iq4_quantize_matches_ggml_on_any_bits(chunk, type_name):
    """Random float32 bit patterns: NaN, inf, subnormals, every exponent."""
    bits = np.random.default_rng(zlib.crc32(type_name.encode()) + 1).integers(0, 2**32, 256 * 32, np.uint32)
    x = bits.view(F32).copy()
    if backend == "python" or os.environ.get("APRFAST_SANITIZED"):
        x[np.isnan(x)] = 0  # (see the module notes)
    assert_same(ours(type_name, x), ggml_quantize(chunk, type_name, x), type_name)
    x[np.isnan(x)] = 0
    assert_same(pure_quantize(type_name, x), ggml_quantize(chunk, type_name, x), f"pure {type_name}")


@pytest.mark.parametrize("type_name", IQ4_TYPES)
def test_iq4_quantize_threads_do_not_change_the_bytes(type_name):
    x = random_input(5, blocks=(1 << 18) // 256 + 3)
    assert_same(ours(type_name, x, threads=2), ours(type_name, x, threads=1), type_name)


@pytest.mark.parametrize("type_name", IQ4_TYPES)
def test_iq4_quantize_round_trip_and_refusals(type_name):
    x = random_input(9, blocks=4).reshape(4, 256)
    qt = aprfast.quantize(x, type_name.lower())
    assert qt.dtype.name == type_name and qt.shape == (4, 256)
    back = aprfast.dequantize(qt)
    assert np.max(np.abs(back - x) / np.max(np.abs(x), axis=1, keepdims=True)) < 0.2
    block = q.block_info(type_name)[0]
    with pytest.raises(aprfast.LayoutError, match=f"multiple of {block}"):
        aprfast.quantize(np.zeros((2, block + 16), F32), type_name)
    with pytest.raises(ValueError, match=f"block size {block}"):
        q.quantize(type_name, np.zeros(block + 16, F32), np.zeros(1000, np.uint8))


def test_iq4_xs_layout():
    """d, scales_h, scales_l, then nibbles: each 32-value sub-block reads back as
    d * (six-bit scale - 32) * level."""
    x = random_input(21, blocks=2)
    raw = ours("IQ4_XS", x).reshape(2, 136)
    d = raw[:, :2].copy().view("<f2")[:, 0].astype(F32)
    scales_h = raw[:, 2].astype(np.int64) | raw[:, 3].astype(np.int64) << 8
    scales_l = raw[:, 4:8]
    six = np.stack([((scales_l[:, ib // 2] >> 4 * (ib % 2)) & 0xF) | ((scales_h >> 2 * ib) & 3) << 4
                    for ib in range(8)], axis=1).astype(np.int64)
    qs = raw[:, 8:].reshape(2, 8, 16)
    levels = np.concatenate([qs & 0xF, qs >> 4], axis=2)
    values = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], F32)
    want = (d[:, None] * (six - 32).astype(F32))[:, :, None] * values[levels]
    back = np.empty(512, F32)
    q.dequantize("IQ4_XS", raw.reshape(-1), back)
    assert np.array_equal(back.reshape(2, 8, 32), want.astype(F32))
