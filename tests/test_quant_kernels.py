"""Quantization kernels give the oracles' bits on every path and thread count.

* GGML Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / TQ1_0 / TQ2_0 / MXFP4 quantize (every type
  gguf-py can quantize) and every GGML dequantize: bit-identical to llama.cpp's gguf-py
  (``gguf.quants``), on random data and adversarial blocks.
* APR_Q8 / APR_Q4 (apr-format's ``add_q8_tensor`` / ``add_q4_tensor`` and
  aprender-core's dequantizers), APR_FQ8_0 / APR_FQ4_0 (aprender's
  ``format::quantize``) and Q8_TENSOR: bit-identical to the NumPy references
  below, which emulate the Rust f32 arithmetic; and, when the Rust harness is
  built, APR_Q8 / APR_Q4 byte-identical to the real crate.
* Sizes are checked before any memory is touched.
"""

from __future__ import annotations

import functools
import warnings
import zlib

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GGMLType  # noqa: E402

from aprfast import _quant as q  # noqa: E402

F32 = np.float32
PATHS = q.available_paths()
THREADS = (1, 2)
QUANTIZERS = {
    "Q8_0": q.quantize_q8_0,
    "Q4_0": q.quantize_q4_0,
    "Q4_1": q.quantize_q4_1,
    "Q5_0": q.quantize_q5_0,
    "Q5_1": q.quantize_q5_1,
    "TQ1_0": q.quantize_tq1_0,
    "TQ2_0": q.quantize_tq2_0,
    "MXFP4": q.quantize_mxfp4,
    "APR_Q8": q.quantize_apr_q8,
    "APR_Q4": q.quantize_apr_q4,
    "Q8_TENSOR": q.quantize_q8_tensor,
    "APR_FQ8_0": q.quantize_apr_fq8_0,
    "APR_FQ4_0": q.quantize_apr_fq4_0,
}
GGML_QUANTIZE = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "TQ1_0", "TQ2_0", "MXFP4")
GGML_DEQUANTIZE = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K")
APR_TYPES = ("APR_Q8", "APR_Q4", "Q8_TENSOR", "APR_FQ8_0", "APR_FQ4_0")
# Threads only split inputs of at least 2 x 256K elements; this one splits unevenly.
LARGE = (1 << 19) + 7 * 256

path_param = pytest.mark.parametrize("path", PATHS)
threads_param = pytest.mark.parametrize("threads", THREADS)


def f32_from_bits(*words) -> np.ndarray:
    return np.array(words, np.uint32).view(F32)


def quietly(fn):
    """NumPy warns on NaN/inf casts and overflow; the oracles are still defined there."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            return fn(*args, **kwargs)
    return wrapper


@quietly
def gguf_quantize(x, type_name) -> np.ndarray:
    return gguf.quants.quantize(np.asarray(x, F32), getattr(GGMLType, type_name)).view(np.uint8).ravel()


@quietly
def gguf_dequantize(raw, type_name) -> np.ndarray:
    return gguf.quants.dequantize(np.asarray(raw, np.uint8), getattr(GGMLType, type_name)).ravel()


# Byte offsets of the float16 fields that hold a NaN when a block holds one, where gguf-py
# takes them from NumPy's max / min.
NAN_SCALE_FIELDS = {"Q8_0": (34, (0,)), "Q4_1": (20, (0, 2)), "Q5_1": (24, (0, 2)), "TQ1_0": (54, (52,)),
                    "TQ2_0": (66, (64,))}


def gguf_quantize_default_nan(x, type_name) -> np.ndarray:
    """gguf-py's bytes, except that a NaN scale of a Q8_0 / Q4_1 / Q5_1 / TQ block is the default NaN 0x7e00.

    gguf-py takes those scales from NumPy's max/min, which return the default NaN when
    the NaN passed through NumPy's vector loop and the NaN's own bits when it fell in the
    scalar tail, whose length depends on the machine's SIMD width.  aprfast always stores
    0x7e00 (documented in csrc/quant.c); the quants of such blocks are 0 in both."""
    raw = gguf_quantize(x, type_name)
    if type_name in NAN_SCALE_FIELDS:
        block_bytes, offsets = NAN_SCALE_FIELDS[type_name]
        blocks = raw.reshape(-1, block_bytes)
        nan_blocks = np.isnan(np.asarray(x, F32).reshape(-1, q.block_info(type_name)[0])).any(axis=1)
        for off in offsets:
            h = blocks[:, off:off + 2].copy().view("<u2")[:, 0]
            assert (((h & 0x7C00) == 0x7C00) & ((h & 0x03FF) != 0))[nan_blocks].all()
            h[nan_blocks] = 0x7E00
            blocks[:, off:off + 2] = h.view(np.uint8).reshape(-1, 2)
    return raw


def ours_quantize(type_name, x, *, threads=1, path=None) -> np.ndarray:
    x = np.ascontiguousarray(x, F32)
    out = np.full(q.quantized_nbytes(type_name, x.size), 0xA5, np.uint8)  # poison: every byte must be written
    QUANTIZERS[type_name](x, out, threads=threads, path=path)
    return out


def ours_dequantize(type_name, raw, n, *, threads=1, path=None) -> np.ndarray:
    out = np.full(n, np.nan, F32)
    q.dequantize(type_name, np.ascontiguousarray(raw, np.uint8), out, threads=threads, path=path)
    return out


def assert_same_bits(got, want, what=""):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if got.dtype == F32:
        got, want = got.view(np.uint32), np.asarray(want, F32).view(np.uint32)
    diff = np.flatnonzero(got != want)
    assert diff.size == 0, (f"{what}: {diff.size} of {got.size} differ, first at {diff[0]}: "
                            f"{got[diff[0]]:#x} != {want[diff[0]]:#x}")


def whole_blocks(x, type_name) -> np.ndarray:
    """x (a multiple of 32 floats) repeated to whole blocks of a 256-element type."""
    x = np.asarray(x, F32)
    return np.tile(x, q.block_info(type_name)[0] // 32) if q.block_info(type_name)[0] > 32 else x


def random_floats(rng, n) -> np.ndarray:
    """Blocks of very different magnitudes, so scales vary from block to block."""
    scale = rng.choice(np.array([1e-6, 1e-2, 1.0, 3.0, 1e3], F32), size=(n + 31) // 32).repeat(32)[:n]
    return (rng.standard_normal(n).astype(F32) * scale).astype(F32)


# --------------------------------------------------------------------------
# Adversarial blocks (32 floats each).

NAN = F32(np.nan)
BIG = F32(65504.0 * 127 * 2)  # Q8_0's d overflows float16
TINY = f32_from_bits(1)[0]  # smallest subnormal


def adversarial_blocks() -> dict[str, np.ndarray]:
    base = np.linspace(-1, 1, 32, dtype=F32)
    blocks = {
        "zeros": np.zeros(32, F32),
        "negative zeros": np.full(32, -0.0, F32),
        "one at 0": np.eye(1, 32, 0, dtype=F32)[0] * F32(3.5),
        "one at 17": np.eye(1, 32, 17, dtype=F32)[0] * F32(-0.25),
        "one at 31": np.eye(1, 32, 31, dtype=F32)[0] * F32(7e-3),
        "q8 ties": np.array([127] + [k + 0.5 for k in range(-15, 16)], F32),  # d = 1, x.5 everywhere
        "q4_0 ties": np.array([-8] + [k / 2 for k in range(-15, 16)], F32),   # d = 1
        "q4_1 ties": np.array([0, 15] + [k / 2 for k in range(0, 30)], F32),   # d = 1, m = 0
        "apr ties": np.array([7] + [k + 0.5 for k in range(-8, 7)] * 2 + [6.5], F32),
        "equal magnitudes": np.array([2, -5, 5, -5] + [1] * 28, F32),
        "first is the negative max": np.concatenate([[F32(-9)], base]).astype(F32)[:32],
        "f16 overflow": base * BIG,
        "f16 overflow max": np.full(32, np.finfo(F32).max, F32) * np.where(np.arange(32) % 2, 1, -1).astype(F32),
        "near f16 max": np.array([65504.0 * 127, 65519.0 * 127, 65520.0 * 127] + [1] * 29, F32),
        "huge": np.full(32, 1e30, F32),
        "subnormals": f32_from_bits(*range(1, 33)),
        "subnormal max": np.concatenate([f32_from_bits(0x007FFFFF), np.full(31, TINY, F32)]),
        "subnormal and normal": np.concatenate([f32_from_bits(0x00400000), np.full(31, F32(1e-39))]),
        "tiny and zeros": np.concatenate([[TINY], np.zeros(31, F32)]),
        "smallest normals": np.full(32, np.finfo(F32).tiny, F32),
        "+inf": np.where(np.arange(32) == 5, F32(np.inf), base).astype(F32),
        "-inf": np.where(np.arange(32) == 30, F32(-np.inf), base).astype(F32),
        "both infs": np.where(np.arange(32) % 3 == 0, F32(np.inf), F32(-np.inf)).astype(F32),
        "all inf": np.full(32, np.inf, F32),
        "nan": np.where(np.arange(32) == 3, NAN, base).astype(F32),
        "negative nan": np.where(np.arange(32) == 0, -NAN, base).astype(F32),
        "nan payload": np.where(np.arange(32) == 9, f32_from_bits(0xFFC01234)[0], base).astype(F32),
        "signalling nan": np.where(np.arange(32) == 31, f32_from_bits(0x7F800001)[0], base).astype(F32),
        "nan and inf": np.where(np.arange(32) == 4, NAN, np.where(np.arange(32) == 2, F32(np.inf), base)).astype(F32),
        "all nan": np.full(32, np.nan, F32),
        "constant": np.full(32, 0.3, F32),
        "constant negative": np.full(32, -1e-5, F32),
        "positive only": np.linspace(100, 101, 32, dtype=F32),
    }
    for name, block in blocks.items():
        assert block.shape == (32,) and block.dtype == F32, name
    return blocks


ADVERSARIAL = adversarial_blocks()


def q4_1_zero_sign_ambiguous(block) -> bool:
    """gguf-py's Q4_1 stores whichever zero NumPy's min/max reduction picks when the
    block's minimum or maximum is zero and both +0.0 and -0.0 occur; aprfast keeps the
    first (llama.cpp's choice), so such blocks are compared separately."""
    block = np.asarray(block, F32).reshape(-1, 32)
    block = block[~np.isnan(block).any(axis=1)]  # NaN blocks store NaN for d and m
    zeros = block == 0
    mixed = (zeros & np.signbit(block)).any(axis=1) & (zeros & ~np.signbit(block)).any(axis=1)
    extreme_zero = (block.min(axis=1) == 0) | (block.max(axis=1) == 0)
    return bool((mixed & extreme_zero).any())


# --------------------------------------------------------------------------
# GGML quantize vs gguf-py.

@pytest.fixture(scope="module")
def random_input():
    return random_floats(np.random.default_rng(2024), 32 * 2048)


@pytest.fixture(scope="module")
def large_input():
    return random_floats(np.random.default_rng(7), LARGE)


@pytest.mark.parametrize("type_name", GGML_QUANTIZE)
@path_param
@threads_param
def test_ggml_quantize_matches_gguf_on_random_data(type_name, path, threads, random_input):
    want = gguf_quantize_default_nan(random_input, type_name)
    assert_same_bits(ours_quantize(type_name, random_input, threads=threads, path=path), want, type_name)


@pytest.mark.parametrize("type_name", GGML_QUANTIZE)
@path_param
def test_ggml_quantize_two_threads_match_gguf_on_large_input(type_name, path, large_input):
    want = gguf_quantize_default_nan(large_input, type_name)
    assert_same_bits(ours_quantize(type_name, large_input, threads=2, path=path), want, type_name)


@pytest.mark.parametrize("type_name", GGML_QUANTIZE)
@pytest.mark.parametrize("block_name", list(ADVERSARIAL))
@path_param
def test_ggml_quantize_matches_gguf_on_adversarial_block(type_name, block_name, path):
    block = ADVERSARIAL[block_name]
    if type_name in ("Q4_1", "Q5_1"):
        assert not q4_1_zero_sign_ambiguous(block)
    # Alone, and in the middle of ordinary blocks (SIMD kernels see it among others).
    padded = np.concatenate([ADVERSARIAL["q8 ties"], block, np.linspace(-3, 2, 32, dtype=F32)])
    for x in (whole_blocks(block, type_name), whole_blocks(padded, type_name)):
        assert_same_bits(ours_quantize(type_name, x, path=path), gguf_quantize_default_nan(x, type_name),
                         f"{type_name} {block_name}")


@pytest.mark.parametrize("block_name", list(ADVERSARIAL))
@pytest.mark.parametrize("type_name", GGML_QUANTIZE)
def test_ggml_quantize_adversarial_block_round_trips_like_gguf(type_name, block_name):
    """Our bytes dequantize (with our kernel) to gguf-py's dequantization of gguf-py's bytes."""
    block = whole_blocks(ADVERSARIAL[block_name], type_name)
    raw = ours_quantize(type_name, block)
    want = gguf_dequantize(gguf_quantize_default_nan(block, type_name), type_name)
    assert_same_bits(ours_dequantize(type_name, raw, block.size), want)


@pytest.mark.parametrize("type_name", ("Q8_0", "Q4_1", "Q5_1"))
@pytest.mark.parametrize("position", (0, 5, 16, 17, 24, 25, 31))
@path_param
def test_default_nan_gives_gguf_bytes_exactly_wherever_it_is(type_name, position, path):
    """With the default NaN (0x7fc00000) gguf-py's bytes do not depend on NumPy's SIMD width."""
    block = np.linspace(-1, 1, 32, dtype=F32)
    block[position] = f32_from_bits(0x7FC00000)[0]
    raw = ours_quantize(type_name, block, path=path)
    assert_same_bits(raw, gguf_quantize(block, type_name), type_name)
    quants_start = 2 * len(NAN_SCALE_FIELDS[type_name][1])
    assert raw[:2].tobytes() == b"\x00\x7e" and not raw[quants_start:].any()


@pytest.mark.parametrize("word", (0xFFC00000, 0x7F800001, 0x7FD00000, 0xFFA01234))
@path_param
def test_other_nans_give_the_default_nan_scale(word, path):
    """Q8_0 / Q4_1 blocks holding any NaN: d (and m) are 0x7e00, all quants 0 (csrc/quant.c)."""
    block = np.linspace(-1, 1, 32, dtype=F32)
    block[[3, 29]] = f32_from_bits(word)[0]
    q8, q41 = ours_quantize("Q8_0", block, path=path), ours_quantize("Q4_1", block, path=path)
    assert q8[:2].tobytes() == b"\x00\x7e" and not q8[2:].any()
    assert q41[:4].tobytes() == b"\x00\x7e\x00\x7e" and not q41[4:].any()
    # Q4_0 takes d from the first NaN itself (numpy.argmax): payload and sign kept.
    q40 = ours_quantize("Q4_0", block, path=path)
    assert_same_bits(q40, gguf_quantize(block, "Q4_0"), "Q4_0")


@path_param
def test_q4_1_keeps_the_first_zero_when_the_minimum_is_a_signed_zero(path):
    # min is a zero and both signs are present: the first one (-0.0 here) is stored.
    block = np.linspace(0, 3, 32, dtype=F32)
    block[0], block[4] = -0.0, 0.0
    raw = ours_quantize("Q4_1", block, path=path)
    assert raw[2:4].tobytes() == b"\x00\x80"  # m = -0.0
    ref = gguf_quantize(block, "Q4_1")
    assert_same_bits(raw[4:], ref[4:], "nibbles")  # only the sign of m may differ from gguf-py
    assert raw[:2].tobytes() == ref[:2].tobytes()
    # Maximum a signed zero (all other values negative): first zero, +0.0, gives d's sign.
    block = -np.linspace(1, 3, 32, dtype=F32)
    block[7], block[20] = 0.0, -0.0
    raw = ours_quantize("Q4_1", block, path=path)
    assert_same_bits(raw[2:], gguf_quantize(block, "Q4_1")[2:], "m and nibbles")
    d = np.frombuffer(raw[:2].tobytes(), np.float16)[0]
    assert d == np.float16((F32(0.0) - F32(-3.0)) / F32(15)) and not np.signbit(d)


@given(hnp.arrays(F32, st.integers(1, 4).map(lambda b: 32 * b), elements=st.floats(width=32)))
def test_ggml_quantize_matches_gguf_on_any_floats(x):
    assume(not q4_1_zero_sign_ambiguous(x))
    for type_name in GGML_QUANTIZE:
        xt = whole_blocks(x, type_name)
        want = gguf_quantize_default_nan(xt, type_name)
        for path in PATHS:
            assert_same_bits(ours_quantize(type_name, xt, path=path), want, f"{type_name} {path}")


@path_param
def test_mxfp4_scale_of_maxima_at_and_near_powers_of_two_matches_gguf(path):
    """MXFP4's shared exponent is floor(log2(max|x|)) in float32: a maximum just below 2^k
    whose log2 rounds up to k must give k, as NumPy's float32 log2 does (csrc/quantize_ggml.c)."""
    k = np.arange(1, 255, dtype=np.uint32) << 23
    words = np.concatenate([k - 1, k, k + 1, k - 3, k + 0x400000 - 1, np.arange(1, 40, dtype=np.uint32)])
    top = words.view(F32)
    x = (top[:, None] * np.linspace(-0.9, 0.9, 32, dtype=F32)[None, :]).astype(F32)
    x[:, 7] = top
    x[:, 20] = -top * F32(0.75)
    x = x.ravel()
    assert_same_bits(ours_quantize("MXFP4", x, path=path), gguf_quantize(x, "MXFP4"), "MXFP4")


@pytest.mark.parametrize("type_name", ("TQ1_0", "TQ2_0"))
@path_param
def test_ternary_nan_blocks_store_the_default_nan_and_trit_one(type_name, path):
    block = np.linspace(-1, 1, 256, dtype=F32)
    block[100] = f32_from_bits(0xFFC01234)[0]
    raw = ours_quantize(type_name, block, path=path)
    d_at = NAN_SCALE_FIELDS[type_name][1][0]
    assert raw[d_at:d_at + 2].tobytes() == b"\x00\x7e"
    assert_same_bits(raw, gguf_quantize_default_nan(block, type_name), type_name)
    assert np.isnan(ours_dequantize(type_name, raw, 256)).all()


@pytest.mark.parametrize("type_name", GGML_QUANTIZE)
def test_ggml_quantizers_refuse_a_ragged_tail(type_name):
    elems, nbytes = q.block_info(type_name)
    out = np.zeros(2 * nbytes, np.uint8)
    for n in (elems + 1, 2 * elems - 1, 31):
        with pytest.raises(ValueError, match=rf"{type_name}.*{n} elements.*block size {elems}"):
            QUANTIZERS[type_name](np.zeros(n, F32), out)
    assert not out.any()


# --------------------------------------------------------------------------
# GGML dequantize vs gguf-py.

BLOCK_F16_FIELDS = {  # byte offsets of float16 fields that scale a block
    "Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
    "Q4_K": (0, 2), "Q6_K": (208,),
}


def random_blocks(rng, type_name, nblocks) -> np.ndarray:
    """Random block bytes whose float16 scale fields are finite (special ones are tested apart)."""
    _, block_bytes = q.block_info(type_name)
    raw = rng.integers(0, 256, size=(nblocks, block_bytes), dtype=np.uint8)
    for off in BLOCK_F16_FIELDS[type_name]:
        h = raw[:, off:off + 2].copy().view(np.uint16)
        h[(h & 0x7C00) == 0x7C00] &= np.uint16(0xBFFF)  # exponent 31 (inf, NaN) -> 15
        raw[:, off:off + 2] = h.view(np.uint8)
    return raw.ravel()


@pytest.mark.parametrize("type_name", GGML_DEQUANTIZE)
@path_param
@threads_param
def test_ggml_dequantize_matches_gguf_on_random_blocks(type_name, path, threads):
    rng = np.random.default_rng(zlib.crc32(type_name.encode()))
    block_elems, _ = q.block_info(type_name)
    raw = random_blocks(rng, type_name, 4096 // block_elems * 8)
    n = raw.size // q.block_info(type_name)[1] * block_elems
    assert_same_bits(ours_dequantize(type_name, raw, n, threads=threads, path=path), gguf_dequantize(raw, type_name),
                     type_name)


@pytest.mark.parametrize("type_name", GGML_DEQUANTIZE)
@path_param
def test_ggml_dequantize_two_threads_match_gguf_on_large_input(type_name, path):
    rng = np.random.default_rng(99)
    block_elems, block_bytes = q.block_info(type_name)
    nblocks = LARGE // block_elems + 3
    raw = random_blocks(rng, type_name, nblocks)
    want = gguf_dequantize(raw, type_name)
    got = ours_dequantize(type_name, raw, nblocks * block_elems, threads=2, path=path)
    assert_same_bits(got, want, type_name)


# Scales that are not ordinary numbers: NaN (two payloads), +-inf, subnormals, signed zeros.
SPECIAL_F16 = (0x7E00, 0xFE00, 0x7C01, 0x7D55, 0x7C00, 0xFC00, 0x0001, 0x83FF, 0x0000, 0x8000, 0x7BFF, 0x0400)


@pytest.mark.parametrize("type_name", GGML_DEQUANTIZE)
@path_param
def test_ggml_dequantize_matches_gguf_with_special_scales(type_name, path):
    """Every special float16 in every scale field (both fields at once for Q4_1/Q5_1/Q4_K)."""
    rng = np.random.default_rng(5)
    _, block_bytes = q.block_info(type_name)
    fields = BLOCK_F16_FIELDS[type_name]
    blocks = random_blocks(rng, type_name, len(SPECIAL_F16) ** len(fields)).reshape(-1, block_bytes)
    for i, combo in enumerate(np.array(np.meshgrid(*[SPECIAL_F16] * len(fields))).reshape(len(fields), -1).T):
        for off, h in zip(fields, combo):
            blocks[i, off:off + 2] = np.array([h], np.uint16).view(np.uint8)
    raw = blocks.ravel()
    want = gguf_dequantize(raw, type_name)
    got = ours_dequantize(type_name, raw, want.size, path=path)
    # Where a block's scale and minimum are both Inf/NaN, d*q + m may add two NaNs, and
    # IEEE 754 (6.2.3) leaves which one comes out to the implementation: x86's scalar
    # add keeps the first (csrc/quant_ggml.c, the pure twins and NumPy 2 on CI's machines),
    # while NumPy 1.23's vector loops return the second on some CPUs (CI's lower-bounds pass
    # on an AVX-512 machine).  There only NaN-ness is compared; every other bit is exact.
    special = np.zeros(blocks.shape[0], np.int64)
    for off in fields:
        h = blocks[:, off:off + 2].copy().view("<u2")[:, 0]
        special += (h & 0x7C00) == 0x7C00
    free = np.repeat(special >= 2, want.size // blocks.shape[0]) & np.isnan(got) & np.isnan(want)
    assert (np.isnan(got) == np.isnan(want)).all(), type_name
    assert_same_bits(np.where(free, F32(0), got), np.where(free, F32(0), want), type_name)


# --------------------------------------------------------------------------
# NumPy references for the APR types (Rust f32 semantics).

@quietly
def rust_round(v) -> np.ndarray:
    """f32::round: half away from zero.  Done in float64, where x +- 0.5 is exact."""
    v64 = np.asarray(v, F32).astype(np.float64)
    return (np.sign(v64) * np.floor(np.abs(v64) + 0.5)).astype(F32)


def rust_round_clamp_i8(v, lo, hi) -> np.ndarray:
    """round().clamp(lo, hi) as i8: NaN -> 0."""
    r = rust_round(v)
    return np.where(np.isnan(r), 0, np.clip(r, lo, hi)).astype(np.int8)


def max_abs_skip_nan(x) -> np.float32:
    """fold(0.0, f32::max) over |x|."""
    a = np.abs(np.asarray(x, F32))
    a = a[~np.isnan(a)]
    return F32(max(F32(0), a.max())) if a.size else F32(0)


@quietly
def ref_apr_q8(x) -> bytes:
    x = np.asarray(x, F32)
    if x.size == 0:
        return b""
    amax = max_abs_skip_nan(x)
    scale = F32(1) if amax == 0 else F32(amax / F32(127))
    quants = rust_round_clamp_i8(x / scale, -127, 127)
    return np.array([scale], "<f4").tobytes() + quants.tobytes()


@quietly
def ref_apr_q4(x) -> bytes:
    x = np.asarray(x, F32)
    out = bytearray()
    for start in range(0, x.size, 32):
        block = x[start:start + 32]
        amax = max_abs_skip_nan(block)
        scale = F32(1) if amax == 0 else F32(amax / F32(7))
        nib = rust_round_clamp_i8(block / scale, -8, 7).astype(np.uint8) + 8
        nib = np.concatenate([nib, np.zeros(32 - nib.size, np.uint8)])  # missing elements: nibble 0
        out += np.array([scale], F32).astype("<f2").tobytes()
        out += (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8).tobytes()
    return bytes(out)


@quietly
def ref_apr_fq8_0(x) -> bytes:
    """aprender format::quantize Q8_0Quantizer::quantize."""
    x = np.asarray(x, F32)
    out = bytearray()
    for start in range(0, x.size, 32):
        block = x[start:start + 32]
        amax = max_abs_skip_nan(block)
        scale = F32(amax / F32(127)) if amax > 0 else F32(1)
        inv = F32(F32(1) / scale) if scale > 0 else F32(0)
        quants = rust_round_clamp_i8(block * inv, -127, 127)
        out += np.array([scale], F32).astype("<f2").tobytes() + quants.tobytes() + bytes(32 - block.size)
    return bytes(out)


@quietly
def ref_apr_fq4_0(x) -> bytes:
    """aprender format::quantize Q4_0Quantizer::quantize (padded with 0.0)."""
    x = np.asarray(x, F32)
    out = bytearray()
    for start in range(0, x.size, 32):
        block = x[start:start + 32]
        amax = max_abs_skip_nan(block)
        scale = F32(amax / F32(7)) if amax > 0 else F32(1)
        inv = F32(F32(1) / scale) if scale > 0 else F32(0)
        padded = np.concatenate([block, np.zeros(32 - block.size, F32)])
        nib = rust_round_clamp_i8(padded * inv, -8, 7).astype(np.uint8) + 8
        out += np.array([scale], F32).astype("<f2").tobytes() + (nib[0::2] | (nib[1::2] << 4)).tobytes()
    return bytes(out)


@quietly
def ref_q8_tensor(x) -> bytes:
    """The Q8_TENSOR rules documented in csrc/quant.c."""
    x = np.asarray(x, F32)
    if x.size == 0:
        return b""
    finite = x[np.isfinite(x)]
    lo = F32(min(F32(0), finite.min())) if finite.size else F32(0)
    hi = F32(max(F32(0), finite.max())) if finite.size else F32(0)
    if hi == lo:
        scale = F32(1)
    else:
        scale = F32(F32(hi - lo) / F32(255))
        if np.isinf(scale):
            scale = F32(F32(hi / F32(255)) - F32(lo / F32(255)))
        elif scale == 0:
            scale = f32_from_bits(1)[0]
    zp = int(np.clip(rust_round(F32(F32(-128) - F32(lo / scale))), -128, 127))
    v = x / scale
    s = rust_round(v) + F32(zp)  # in float32, then clamped, as documented
    quants = np.where(np.isnan(v), zp, np.clip(s, -128, 127)).astype(np.int8)
    return np.array([scale], "<f4").tobytes() + np.array([zp], "<i4").tobytes() + quants.tobytes()


REFERENCE_QUANTIZE = {
    "APR_Q8": ref_apr_q8,
    "APR_Q4": ref_apr_q4,
    "Q8_TENSOR": ref_q8_tensor,
    "APR_FQ8_0": ref_apr_fq8_0,
    "APR_FQ4_0": ref_apr_fq4_0,
}


@quietly
def ref_dequantize(type_name, raw, n) -> np.ndarray:
    raw = np.asarray(raw, np.uint8)
    if n == 0:
        return np.zeros(0, F32)
    if type_name == "APR_Q8":
        scale = raw[:4].view("<f4")[0]
        return (raw[4:].view(np.int8).astype(F32) * scale).astype(F32)
    if type_name == "Q8_TENSOR":
        scale, zp = raw[:4].view("<f4")[0], int(raw[4:8].view("<i4")[0])
        return ((raw[8:].view(np.int8).astype(np.int64) - zp).astype(F32) * scale).astype(F32)
    blocks = raw.reshape(-1, 34 if type_name == "APR_FQ8_0" else 18)
    scales = blocks[:, :2].copy().view("<f2").astype(F32)
    if type_name == "APR_Q4":  # GH-186: NaN, inf and |scale| < 6.1e-5 read as 0.0
        bad = ~np.isfinite(scales) | (np.abs(scales) < F32(6.1e-5))
        scales = np.where(bad, F32(0), scales).astype(F32)
    if type_name == "APR_FQ8_0":
        quants = blocks[:, 2:].view(np.int8).astype(F32)
    else:
        nib = np.empty((blocks.shape[0], 32), np.uint8)
        nib[:, 0::2], nib[:, 1::2] = blocks[:, 2:] & 0x0F, blocks[:, 2:] >> 4
        quants = (nib.astype(np.int8) - np.int8(8)).astype(F32)
    return (quants * scales).astype(F32).ravel()[:n]


# --------------------------------------------------------------------------
# APR types vs the references.

APR_SIZES = (0, 1, 5, 31, 32, 33, 64, 100, 1000)


@pytest.mark.parametrize("type_name", APR_TYPES)
@pytest.mark.parametrize("n", APR_SIZES)
@path_param
def test_apr_quantize_matches_reference(type_name, n, path):
    x = random_floats(np.random.default_rng(n), n)
    want = np.frombuffer(REFERENCE_QUANTIZE[type_name](x), np.uint8)
    got = ours_quantize(type_name, x, path=path)
    assert_same_bits(got, want, f"{type_name} n={n}")


@pytest.mark.parametrize("type_name", APR_TYPES)
@path_param
@threads_param
def test_apr_quantize_matches_reference_on_large_input(type_name, path, threads, large_input):
    x = large_input[: LARGE - 5]  # a partial last block
    want = np.frombuffer(REFERENCE_QUANTIZE[type_name](x), np.uint8)
    assert_same_bits(ours_quantize(type_name, x, threads=threads, path=path), want, type_name)


@pytest.mark.parametrize("type_name", APR_TYPES)
@pytest.mark.parametrize("block_name", list(ADVERSARIAL))
@path_param
def test_apr_quantize_matches_reference_on_adversarial_block(type_name, block_name, path):
    block = ADVERSARIAL[block_name]
    for x in (block, block[:13], np.concatenate([np.linspace(-1, 1, 64, dtype=F32), block, block[:7]])):
        want = np.frombuffer(REFERENCE_QUANTIZE[type_name](x), np.uint8)
        assert_same_bits(ours_quantize(type_name, x, path=path), want, f"{type_name} {block_name}")


@given(hnp.arrays(F32, st.integers(0, 200), elements=st.floats(width=32)))
def test_apr_quantize_matches_reference_on_any_floats(x):
    for type_name in APR_TYPES:
        want = np.frombuffer(REFERENCE_QUANTIZE[type_name](x), np.uint8)
        for path in PATHS:
            assert_same_bits(ours_quantize(type_name, x, path=path), want, f"{type_name} {path}")


@pytest.mark.parametrize("type_name", APR_TYPES)
@pytest.mark.parametrize("n", APR_SIZES + (LARGE - 3,))
@path_param
def test_apr_dequantize_matches_reference_on_random_bytes(type_name, n, path):
    rng = np.random.default_rng(n + 17)
    raw = rng.integers(0, 256, q.quantized_nbytes(type_name, n), dtype=np.uint8)
    if type_name == "Q8_TENSOR" and n:
        raw[4:8] = np.array([rng.integers(-128, 128)], "<i4").view(np.uint8)
    want = ref_dequantize(type_name, raw, n)
    for threads in THREADS:
        assert_same_bits(ours_dequantize(type_name, raw, n, threads=threads, path=path), want, type_name)


@pytest.mark.parametrize("type_name", ("APR_Q4", "APR_FQ4_0", "APR_FQ8_0"))
@path_param
def test_apr_block_dequantize_with_special_scales(type_name, path):
    _, block_bytes = q.block_info(type_name)
    raw = np.random.default_rng(3).integers(0, 256, (len(SPECIAL_F16) + 1, block_bytes), dtype=np.uint8)
    raw[:-1, :2] = np.array(SPECIAL_F16, "<u2").view(np.uint8).reshape(-1, 2)
    raw[-1, :2] = np.array([0x03FF], "<u2").view(np.uint8)  # largest subnormal: below 6.1e-5
    n = raw.shape[0] * 32 - 9
    got = ours_dequantize(type_name, raw.ravel(), n, path=path)
    assert_same_bits(got, ref_dequantize(type_name, raw.ravel(), n), type_name)
    if type_name == "APR_Q4":
        assert np.isfinite(got).all()


@pytest.mark.parametrize("zero_point", (-128, 0, 127, 1000, -(2**31), 2**31 - 1))
@path_param
def test_q8_tensor_dequantize_any_zero_point(zero_point, path):
    raw = np.concatenate([np.array([0.5], "<f4").view(np.uint8), np.array([zero_point], "<i4").view(np.uint8),
                          np.arange(-128, 128, dtype=np.int8).view(np.uint8)])
    assert_same_bits(ours_dequantize("Q8_TENSOR", raw, 256, path=path), ref_dequantize("Q8_TENSOR", raw, 256))


@pytest.mark.parametrize("type_name", APR_TYPES)
def test_apr_round_trip_error_is_within_half_a_step(type_name):
    # Magnitudes whose float16 block scales are normal numbers.
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(4096) * rng.choice([0.01, 1.0, 100.0], 128).repeat(32)).astype(F32)
    back = ours_dequantize(type_name, ours_quantize(type_name, x), x.size).astype(np.float64)
    if type_name == "APR_Q8":
        tolerance = np.abs(x).max() / 127 * 0.5 * (1 + 1e-6)
    elif type_name == "Q8_TENSOR":
        tolerance = (max(x.max(), 0) - min(x.min(), 0)) / 255 * 0.5 * (1 + 1e-6)
    else:
        # Per-block scale stored as float16: half a step, plus the largest |q| times the
        # scale's relative rounding error (2^-11).
        levels, largest_q = (127, 127) if type_name == "APR_FQ8_0" else (7, 8)
        step = np.repeat(np.abs(x.reshape(-1, 32)).max(axis=1).astype(np.float64) / levels, 32)
        tolerance = step * (0.5 + largest_q * 2.0**-11)
    assert np.all(np.abs(back - x) <= tolerance)


def test_q8_tensor_layout_and_zero():
    x = np.array([-1.0, 0.0, 0.5, 3.0, np.nan, np.inf, -np.inf], F32)
    raw = ours_quantize("Q8_TENSOR", x)
    scale, zp = raw[:4].view("<f4")[0], int(raw[4:8].view("<i4")[0])
    assert raw.size == 8 + x.size
    assert scale == F32(F32(4) / F32(255)) and zp == -64  # round(-128 + 63.75)
    back = ours_dequantize("Q8_TENSOR", raw, x.size)
    assert back[1] == 0 and back[4] == 0  # 0.0 and NaN read back as exactly 0.0
    assert back[5] == back[3] and back[6] == back[0]  # inf saturates to the range ends
    assert_same_bits(raw, np.frombuffer(ref_q8_tensor(x), np.uint8))


def test_empty_tensors_have_no_bytes():
    """apr-format writes an empty APR_Q8 tensor as 0 bytes; every other type follows."""
    empty = np.zeros(0, F32)
    for type_name in QUANTIZERS:
        assert q.quantized_nbytes(type_name, 0) == 0
        assert ours_quantize(type_name, empty).size == 0
        assert ours_dequantize(type_name, np.zeros(0, np.uint8), 0).size == 0
    with pytest.raises(ValueError, match="src holds 4 bytes, 0 elements need 0"):
        q.dequantize("APR_Q8", np.zeros(4, np.uint8), np.zeros(0, F32))


# --------------------------------------------------------------------------
# Sizes, names and errors.

def test_block_info_and_sizes():
    assert q.block_info("Q8_0") == (32, 34)
    assert q.block_info("Q4_0") == (32, 18)
    assert q.block_info("Q4_1") == (32, 20)
    assert q.block_info("Q5_0") == (32, 22)
    assert q.block_info("Q5_1") == (32, 24)
    assert q.block_info("Q4_K") == (256, 144)
    assert q.block_info("Q6_K") == (256, 210)
    assert q.block_info("APR_Q4") == (32, 18)
    assert q.block_info("APR_Q8") == (1, 1) and q.header_bytes("APR_Q8") == 4
    assert q.block_info("Q8_TENSOR") == (1, 1) and q.header_bytes("Q8_TENSOR") == 8
    assert q.quantized_nbytes("APR_Q8", 10) == 14
    assert q.quantized_nbytes("APR_Q4", 33) == 36
    assert q.quantized_nbytes("Q8_TENSOR", 3) == 11
    assert q.quantized_nbytes("Q6_K", 512) == 420
    for type_name in GGML_DEQUANTIZE:
        elems, nbytes = q.block_info(type_name)
        assert gguf.GGML_QUANT_SIZES[getattr(GGMLType, type_name)] == (elems, nbytes)


def test_available_paths():
    paths = q.available_paths()
    assert paths[0] == "portable"
    assert q.best_path() == paths[-1]
    assert set(paths) <= {"portable", "avx2", "avx512"}
    assert q.default_threads() >= 1


def test_quantize_rejects_a_partial_ggml_block():
    out = np.zeros(34 * 2, np.uint8)
    with pytest.raises(ValueError, match=r"Q8_0.*33 elements.*block size 32"):
        q.quantize_q8_0(np.zeros(33, F32), out)
    assert not out.any()


@pytest.mark.parametrize("type_name", list(QUANTIZERS))
def test_quantize_rejects_a_wrong_output_size(type_name):
    n = 2 * max(q.block_info(type_name)[0], 32)
    x = np.ones(n, F32)
    want = q.quantized_nbytes(type_name, n)
    for size in (want - 1, want + 1, 0):
        out = np.zeros(size, np.uint8)
        with pytest.raises(ValueError, match=rf"{type_name}: out holds {size} bytes, {n} elements need {want}"):
            QUANTIZERS[type_name](x, out)
        assert not out.any()


@pytest.mark.parametrize("type_name", GGML_DEQUANTIZE + APR_TYPES)
def test_dequantize_rejects_a_wrong_source_size(type_name):
    elems, _ = q.block_info(type_name)
    n = 2 * max(elems, 32)
    want = q.quantized_nbytes(type_name, n)
    out = np.zeros(n, F32)
    with pytest.raises(ValueError, match=rf"{type_name}: src holds {want + 1} bytes, {n} elements need {want}"):
        q.dequantize(type_name, np.zeros(want + 1, np.uint8), out)
    assert not out.any()


@pytest.mark.parametrize("type_name", GGML_DEQUANTIZE)
def test_dequantize_rejects_a_partial_ggml_block(type_name):
    elems, _ = q.block_info(type_name)
    with pytest.raises(ValueError, match=rf"{type_name}: {elems + 1} elements is not a multiple of the block size"):
        q.dequantize(type_name, np.zeros(1000, np.uint8), np.zeros(elems + 1, F32))
    with pytest.raises(ValueError, match="not a multiple"):
        q.quantized_nbytes(type_name, elems + 1)


def test_dequantize_only_types_cannot_be_quantized():
    for type_name in ("IQ3_XXS", "IQ2_XS", "NVFP4", "Q8_1"):
        assert not q.can_quantize(type_name)
        with pytest.raises(ValueError, match=f"{type_name} can be dequantized but not quantized"):
            q.quantize(type_name, np.zeros(256, F32), np.zeros(1024, np.uint8))
    assert all(q.can_quantize(t) for t in QUANTIZERS)


def test_unknown_names_and_bad_arguments():
    x, out = np.zeros(32, F32), np.zeros(34, np.uint8)
    with pytest.raises(ValueError, match="unknown quantization type 'Q2_0'"):
        q.dequantize("Q2_0", out, x)
    with pytest.raises(ValueError, match="unknown quantization path 'sse9'"):
        q.quantize_q8_0(x, out, path="sse9")
    with pytest.raises(ValueError, match="threads must be"):
        q.quantize_q8_0(x, out, threads=-1)
    with pytest.raises(ValueError, match="dtype mismatch"):
        q.quantize_q8_0(np.zeros(32, np.float64), out)  # float32 only
    with pytest.raises((TypeError, ValueError, BufferError)):
        q.quantize_q8_0(x, bytes(34))  # read-only output


def test_generic_quantize_equals_the_named_functions():
    x = random_floats(np.random.default_rng(1), 768)
    for type_name, fn in QUANTIZERS.items():
        a = np.zeros(q.quantized_nbytes(type_name, 768), np.uint8)
        b = a.copy()
        fn(x, a)
        q.quantize(type_name, x, b)
        assert_same_bits(a, b, type_name)
