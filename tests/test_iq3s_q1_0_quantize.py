"""Q1_0 and IQ3_S quantizers give the bytes of ggml's own, without an importance matrix.

gguf-py cannot quantize either type, so the oracle is ggml's C: ``ggml_quantize_chunk``
(what llama-quantize runs: ``quantize_row_q1_0_ref`` for Q1_0, ``quantize_iq3_s`` with the
grid map and neighbour lists of ``iq3xs_init_impl(512)`` for IQ3_S) in the ``libggml-base``
shared library llama-cpp-python builds, through ctypes.  Where llama-cpp-python is missing
these tests skip with the reason, unless ``APRFAST_REQUIRE_ENGINES=1``, which makes that a
failure.

IQ3_S inputs hold no NaN and no |x| above 1e12: with those, ggml's neighbour search can find
no candidate whose weighted distance (|x| times a squared difference) is below FLT_MAX, and
it aborts the process (GGML_ASSERT), so there are no bytes to compare; what aprfast writes
there is in docs/FORMAT.md and tested against the pure twin only.
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
from test_iq4_quantize import assert_matches_ggml, chunk, pure_quantize  # noqa: F401 (chunk: the oracle fixture)
from test_iq4_quantize import ggml_quantize as chunk_quantize
from test_kquant_quantize import PATHS, SPECIAL, assert_same, ours, random_input

import aprfast
from aprfast import _quant as q

F32 = np.float32
TYPES = ("Q1_0", "IQ3_S")
#: GGML type ids (ggml.h's enum ggml_type).
GGML_IDS = {"IQ3_S": 21, "Q1_0": 41}
#: The largest |x| for which ggml's IQ3_S distances stay finite (|x|^3 far below FLT_MAX).
ORACLE_SAFE = F32(1e12)


def ggml_quantize(fn, type_name, x, row=256) -> np.ndarray:
    """ggml_quantize_chunk of ``x`` as rows of ``row`` values, no importance matrix; never
    called with what ggml aborts on (see the module notes)."""
    if type_name == "IQ3_S":
        x = np.asarray(x, F32)
        assert not np.isnan(x).any() and not (np.abs(x) > ORACLE_SAFE).any()
    return chunk_quantize(fn, type_name, x, row, ids=GGML_IDS)


def comparable(type_name, x) -> bool:
    """Whether ggml gives bytes for ``x`` (see the module notes)."""
    return type_name != "IQ3_S" or not (np.isnan(x).any() or (np.abs(x) > ORACLE_SAFE).any())


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("path", PATHS)
def test_quantize_matches_ggml_on_random_data(chunk, type_name, path):
    x = random_input(zlib.crc32(type_name.encode()), blocks=16 if type_name == "IQ3_S" else 64)
    want = ggml_quantize(chunk, type_name, x)
    assert_same(ours(type_name, x, path), want, type_name)
    assert_same(pure_quantize(type_name, x[:4 * 256]), want[:q.quantized_nbytes(type_name, 4 * 256)],
                f"pure {type_name}")


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("row", [256, 512, 4096])
def test_quantize_matches_ggml_on_weights_like_a_model_s(chunk, type_name, row):
    rng = np.random.default_rng(11 + row)
    normal = (rng.standard_normal((8, row)) * 0.02).astype(F32)
    heavy = (rng.standard_t(2, (8, row)) * 0.01).astype(F32)  # heavy tails: a few large weights
    for x in (normal, heavy):
        want = ggml_quantize(chunk, type_name, x, row)
        assert_same(ours(type_name, x), want, type_name)
        assert_same(pure_quantize(type_name, x[:2]), want[:q.quantized_nbytes(type_name, 2 * row)],
                    f"pure {type_name}")


def special_blocks() -> dict:
    """test_kquant_quantize's special blocks and a few more for the sign bits and grid search."""
    idx = np.arange(256)
    blocks = dict(SPECIAL)
    blocks.update({
        "single nonzero": np.where(idx == 130, F32(0.7), F32(0)).astype(F32),
        "one sub-block zero": np.where(idx // 32 == 2, F32(0), np.linspace(-1, 1, 256, dtype=F32)).astype(F32),
        "alternating sub-blocks zero": np.where(idx // 32 % 2, F32(0), np.cos(idx).astype(F32)).astype(F32),
        "signed zeros mixed": np.where(idx % 2, F32(-0.0), F32(0.0)).astype(F32),
        "grid points": (2 * (idx % 8) + 1).astype(F32) * np.where(idx % 3, 1, -1).astype(F32),
        "between grid points": (2 * (idx % 8)).astype(F32) + F32(0.5),
        "large but finite distances": np.linspace(-1e12, 1e12, 256, dtype=F32),
    })
    return blocks


SPECIALS = special_blocks()


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("block_name", list(SPECIALS))
def test_quantize_matches_ggml_on_special_blocks(chunk, type_name, block_name):
    block = SPECIALS[block_name]
    padded = np.concatenate([random_input(1, 1), block, random_input(2, 1)])
    for x in (block, padded):
        if not comparable(type_name, x):
            pytest.skip("ggml aborts on this block (see the module notes)")
        assert_matches_ggml(chunk, type_name, x, f"{type_name} {block_name}", ggml_quantize)


@pytest.mark.parametrize("type_name", TYPES)
def test_quantize_matches_ggml_on_any_bits(chunk, type_name):
    """Random float32 bit patterns: NaN (Q1_0 only), inf, subnormals, every exponent."""
    bits = np.random.default_rng(zlib.crc32(type_name.encode()) + 1).integers(0, 2**32, 256 * 8, np.uint32)
    x = bits.view(F32).copy()
    if type_name == "IQ3_S":
        x[np.isnan(x) | (np.abs(x) > ORACLE_SAFE)] = 0
    assert_matches_ggml(chunk, type_name, x, type_name, ggml_quantize)


@pytest.mark.skipif(bool(os.environ.get("APRFAST_SANITIZED")), reason="which of two NaNs a float operation keeps "
                    "follows the compiler's operand order (docs/FORMAT.md); the -O1 build orders differently")
def test_iq3_s_without_an_oracle_is_the_same_on_both_backends():
    """NaN and overflowing squares, where ggml aborts: the compiled kernel (as the wheel builds it)
    and the pure twin agree and every byte is written."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(256 * 4).astype(F32)
    x[5], x[300], x[301], x[700], x[900] = np.nan, F32(3e38), F32(-1e20), np.inf, F32(1e15)
    assert_same(ours("IQ3_S", x), pure_quantize("IQ3_S", x), "IQ3_S without oracle")


@pytest.mark.parametrize("type_name", TYPES)
def test_quantize_threads_do_not_change_the_bytes(type_name):
    x = random_input(5, blocks=(1 << 17) // 256 + 3)
    assert_same(ours(type_name, x, threads=2), ours(type_name, x, threads=1), type_name)


@pytest.mark.parametrize("type_name", TYPES)
def test_quantize_round_trip_and_refusals(type_name):
    # One magnitude per row: IQ3_S's 4-bit sub-block scales span a factor of 31 only.
    x = (np.random.default_rng(9).standard_normal((4, 256)) * np.array([[1e-3], [1], [30], [0.02]])).astype(F32)
    qt = aprfast.quantize(x, type_name.lower())
    assert qt.dtype.name == type_name and qt.shape == (4, 256)
    back = aprfast.dequantize(qt)
    if type_name == "IQ3_S":
        # 3 bits on a grid: a few values land far (ggml's bytes, tested above), most near.
        assert np.max(np.abs(back - x) / np.max(np.abs(x), axis=1, keepdims=True)) < 0.4
        assert np.all(np.sqrt(np.mean((back - x) ** 2, axis=1) / np.mean(x * x, axis=1)) < 0.25)
    else:  # Q1_0 keeps each sign and the block's mean magnitude
        assert np.array_equal(np.sign(back), np.where(x >= 0, 1, -1) * np.sign(np.abs(back)))
        means = np.abs(x).reshape(-1, 128).mean(axis=1)
        assert np.allclose(np.abs(back).reshape(-1, 128), means[:, None], rtol=2e-3)
    block = q.block_info(type_name)[0]
    with pytest.raises(aprfast.LayoutError, match=f"multiple of {block}"):
        aprfast.quantize(np.zeros((2, block + 16), F32), type_name)
    with pytest.raises(ValueError, match=f"block size {block}"):
        q.quantize(type_name, np.zeros(block + 16, F32), np.zeros(1000, np.uint8))


def test_q1_0_layout():
    """d = mean |x| as f16, then one bit a value (lowest first), set for x >= 0 (-0.0 too, not NaN)."""
    x = np.linspace(-1, 1, 128, dtype=F32)
    x[0], x[1], x[2] = F32(-0.0), np.nan, F32(0.0)
    raw = ours("Q1_0", x)
    bits = np.unpackbits(raw[2:], bitorder="little")
    assert np.array_equal(bits[3:], (x[3:] >= 0).astype(np.uint8)) and list(bits[:3]) == [1, 0, 1]
    assert raw[:2].view("<f2")[0] != raw[:2].view("<f2")[0]  # a NaN in the block: a NaN d
    y = np.abs(np.linspace(-1, 1, 128, dtype=F32))
    assert raw.size == 18 and ours("Q1_0", y)[:2].view("<f2")[0] == np.float16(y.sum(dtype=F32) / 128)


def test_iq3_s_search_tables_are_ggml_s():
    """iq3xs_init_impl(512)'s counts: 512 points on the grid, 3584 off it with 24733 neighbours,
    the first of each at the least squared distance."""
    from aprfast._pure import _quant as pure

    t = pure._iq3s_tables()
    off = t["index"] < 0
    assert (~off).sum() == 512 and off.sum() == 3584
    assert (t["neighbours"][off] >= 0).sum() == 24733
    u = np.flatnonzero(off)
    coords = 2 * ((u[:, None] >> (3 * np.arange(4))) & 7) + 1
    d2 = ((coords[:, None, :] - t["coords"][None].astype(np.int64)) ** 2).sum(axis=2)
    first = t["neighbours"][u, 0]
    assert np.array_equal(d2[np.arange(u.size), first], d2.min(axis=1))
