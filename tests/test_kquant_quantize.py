"""K-quant quantizers (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, and Q8_K, the int8 operand of ggml's K-quant
dot products) give the bytes of ggml's reference quantizers.

gguf-py cannot quantize K-quants, so the oracle is ggml's own C: ``quantize_row_q4_K_ref``
and its siblings (what ``ggml_quantize_chunk`` runs without an importance matrix) in the
``libggml-base`` shared library that llama-cpp-python builds, called through ctypes.
Where llama-cpp-python is missing these tests skip with the reason, unless
``APRFAST_REQUIRE_ENGINES=1`` (CI's main pass sets it), which makes that a failure.

Blocks holding a NaN are compared only between the compiled kernels, built as the
wheel builds them, and ggml: which of two NaNs a float operation returns there follows
the compiler's operand order (docs/FORMAT.md), which the pure twin does not reproduce,
nor does the -O1 build of tests/sanitize.sh (APRFAST_SANITIZED).  Q8_K is the exception:
no operation of its sees two NaNs, so every build gives ggml's bytes for NaN blocks too.

ggml's Q8_K leaves the 16 sums of an all-zero block as they were in the destination;
the oracle's destination is zeroed, so it writes 0 there, as aprfast does.
"""

from __future__ import annotations

import ctypes
import os
import warnings
import zlib

import numpy as np
import pytest

import aprfast
from aprfast import _quant as q
from aprfast import backend

F32 = np.float32
K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K")
PATHS = q.available_paths()


def _required() -> bool:
    return os.environ.get("APRFAST_REQUIRE_ENGINES", "").strip() not in ("", "0")


def ggml_base() -> ctypes.CDLL:
    """libggml-base of llama-cpp-python (the oracle); skips without llama-cpp-python unless
    APRFAST_REQUIRE_ENGINES is set, when it fails."""
    try:
        import llama_cpp
    except ImportError as exc:
        reason = f"llama-cpp-python is not installed ({exc})"
        if _required():
            pytest.fail(f"APRFAST_REQUIRE_ENGINES is set but {reason}", pytrace=False)
        pytest.skip(f"{reason} (set APRFAST_REQUIRE_ENGINES=1 to make this fail)")
    lib_dir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    names = [n for n in sorted(os.listdir(lib_dir)) if n.startswith("libggml-base")] if os.path.isdir(lib_dir) else []
    if not names:
        pytest.fail(f"llama-cpp-python has no libggml-base in {lib_dir}", pytrace=False)
    return ctypes.CDLL(os.path.join(lib_dir, names[0]))


@pytest.fixture(scope="module")
def ggml():
    """libggml-base with the reference quantizers' signatures set."""
    lib = ggml_base()
    for name in K_TYPES:
        fn = getattr(lib, f"quantize_row_{name[:2].lower()}_K_ref")
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    return lib


def ggml_quantize(lib, type_name, x) -> np.ndarray:
    x = np.ascontiguousarray(x, F32)
    out = np.zeros(q.quantized_nbytes(type_name, x.size), np.uint8)
    getattr(lib, f"quantize_row_{type_name[:2].lower()}_K_ref")(x.ctypes.data, out.ctypes.data, x.size)
    return out


def ours(type_name, x, path=None, threads=1) -> np.ndarray:
    x = np.ascontiguousarray(x, F32).reshape(-1)
    out = np.full(q.quantized_nbytes(type_name, x.size), 0xA5, np.uint8)  # poison: every byte written
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        q.quantize(type_name, x, out, path=path, threads=threads)
    return out


def assert_same(got, want, what):
    diff = np.flatnonzero(got != want)
    assert diff.size == 0, f"{what}: {diff.size} of {got.size} bytes differ, first at {diff[0]}"


def special_blocks() -> dict:
    """256-value blocks that stress the scale searches: zeros, flat, signed zeros, ties,
    subnormals, huge values whose f16 scale overflows, infinities, one outlier."""
    base = np.linspace(-1, 1, 256, dtype=F32)
    tiny = np.array([1], np.uint32).view(F32)[0]
    blocks = {
        "zeros": np.zeros(256, F32),
        "negative zeros": np.full(256, -0.0, F32),
        "constant": np.full(256, 0.3, F32),
        "constant negative": np.full(256, -2.5, F32),
        "positive only": np.linspace(100, 101, 256, dtype=F32),
        "negative only": -np.linspace(1, 3, 256, dtype=F32),
        "small integers": (np.arange(256) % 7 - 3).astype(F32),
        "one outlier": np.where(np.arange(256) == 77, F32(1e4), base).astype(F32),
        "one value": np.eye(1, 256, 200, dtype=F32)[0] * F32(-3),
        "subnormals": np.arange(1, 257, dtype=np.uint32).view(F32),
        "tiny and zeros": np.where(np.arange(256) == 3, tiny, F32(0)).astype(F32),
        "below eps": np.full(256, 1e-16, F32),
        "huge": np.full(256, 1e30, F32) * np.where(np.arange(256) % 3, 1, -1).astype(F32),
        "f16 overflow": base * F32(1e6),
        "max float": np.full(256, np.finfo(F32).max, F32),
        "+inf": np.where(np.arange(256) == 5, F32(np.inf), base).astype(F32),
        "both infs": np.where(np.arange(256) % 2, F32(np.inf), F32(-np.inf)).astype(F32),
        "every sub-block different": (base * np.repeat(10.0 ** np.arange(-4, 4), 32)).astype(F32),
    }
    return blocks


SPECIAL = special_blocks()


def random_input(seed, blocks=64) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scale = rng.choice(np.array([1e-6, 2e-2, 1.0, 300.0], F32), size=blocks * 8).repeat(32)
    return (rng.standard_normal(blocks * 256).astype(F32) * scale).astype(F32)


@pytest.mark.parametrize("type_name", K_TYPES)
@pytest.mark.parametrize("path", PATHS)
def test_k_quantize_matches_ggml_on_random_data(ggml, type_name, path):
    x = random_input(zlib.crc32(type_name.encode()))
    assert_same(ours(type_name, x, path), ggml_quantize(ggml, type_name, x), type_name)


@pytest.mark.parametrize("type_name", K_TYPES)
def test_k_quantize_matches_ggml_on_weights_like_a_model_s(ggml, type_name):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((16, 512)) * 0.02).astype(F32)
    assert_same(ours(type_name, x), ggml_quantize(ggml, type_name, x), type_name)


@pytest.mark.parametrize("type_name", K_TYPES)
@pytest.mark.parametrize("block_name", list(SPECIAL))
def test_k_quantize_matches_ggml_on_special_blocks(ggml, type_name, block_name):
    block = SPECIAL[block_name]
    padded = np.concatenate([random_input(1, 1), block, random_input(2, 1)])
    for x in (block, padded):
        assert_same(ours(type_name, x), ggml_quantize(ggml, type_name, x), f"{type_name} {block_name}")


@pytest.mark.parametrize("type_name", K_TYPES)
def test_k_quantize_matches_ggml_on_any_bits(ggml, type_name):
    """Random float32 bit patterns: NaN, inf, subnormals, every exponent."""
    bits = np.random.default_rng(zlib.crc32(type_name.encode()) + 1).integers(0, 2**32, 256 * 32, np.uint32)
    x = bits.view(F32).copy()
    if (backend == "python" or os.environ.get("APRFAST_SANITIZED")) and type_name != "Q8_K":
        x[np.isnan(x)] = 0  # (see the module notes)
    assert_same(ours(type_name, x), ggml_quantize(ggml, type_name, x), type_name)


@pytest.mark.parametrize("type_name", K_TYPES)
def test_k_quantize_threads_do_not_change_the_bytes(type_name):
    x = random_input(5, blocks=(1 << 19) // 256 + 3)
    assert_same(ours(type_name, x, threads=2), ours(type_name, x, threads=1), type_name)


@pytest.mark.parametrize("type_name", K_TYPES)
def test_k_quantize_round_trip_and_refusals(type_name):
    x = random_input(9, blocks=4).reshape(4, 256)
    qt = aprfast.quantize(x, type_name.lower())
    assert qt.dtype.name == type_name and qt.shape == (4, 256)
    back = aprfast.dequantize(qt)
    bound = {"Q2_K": 0.8, "Q3_K": 0.4, "Q4_K": 0.2, "Q5_K": 0.1, "Q6_K": 0.05, "Q8_K": 0.005}[type_name]
    assert np.max(np.abs(back - x) / np.max(np.abs(x), axis=1, keepdims=True)) < bound
    with pytest.raises(aprfast.LayoutError, match="multiple of 256"):
        aprfast.quantize(np.zeros((2, 128), F32), type_name)
    with pytest.raises(ValueError, match="block size 256"):
        q.quantize(type_name, np.zeros(300, F32), np.zeros(1000, np.uint8))


def q8_k_blocks() -> dict:
    """Blocks on Q8_K's own edges: which value gives the scale, NaNs with every payload
    size, infinities next to NaNs, and the int8 wrap of nearest_int's out-of-range values."""
    base = np.linspace(-1, 1, 256, dtype=F32)
    nan = np.array([0x7FC00000, 0xFFC00001, 0x7F80007E, 0x7FFFFFFF, 0xFFBFFFFF], np.uint32).view(F32)
    idx = np.arange(256)
    return {
        "tie, positive first": np.where(idx == 10, F32(2), np.where(idx == 20, F32(-2), base)).astype(F32),
        "tie, negative first": np.where(idx == 10, F32(-2), np.where(idx == 20, F32(2), base)).astype(F32),
        "NaN payloads": np.where(idx % 50 == 0, np.resize(nan, 256), base).astype(F32),
        "NaN first": np.concatenate([nan[:1], base[1:]]).astype(F32),
        "all NaN": np.resize(nan, 256).astype(F32),
        "NaN and zeros": np.where(idx == 9, nan[3], F32(0)).astype(F32),
        "inf and NaN": np.where(idx == 3, F32(-np.inf), np.where(idx == 4, nan[1], base)).astype(F32),
        "-max float and subnormals": np.where(idx == 0, -np.finfo(F32).max, idx.astype(np.uint32).view(F32)),
        "rounding ties": np.where(idx == 0, F32(-127), (idx % 254).astype(F32) - F32(126.5)).astype(F32),
    }


@pytest.mark.parametrize("block_name", list(q8_k_blocks()))
def test_q8_k_matches_ggml_on_its_edge_blocks_on_both_backends(ggml, block_name):
    from aprfast._pure import _quant as pure

    block = q8_k_blocks()[block_name]
    padded = np.concatenate([random_input(3, 1), block, random_input(4, 1)])
    for x in (block, padded):
        want = ggml_quantize(ggml, "Q8_K", x)
        assert_same(ours("Q8_K", x), want, block_name)
        out = np.full(want.size, 0xA5, np.uint8)
        with np.errstate(all="ignore"):
            pure.quantize("Q8_K", x, out)
        assert_same(out, want, f"pure {block_name}")


def test_q8_k_layout_sums_and_dequantize():
    """d is an f32 at byte 0, then 256 int8 q, then 16 int16 sums of 16 q each; x ~= d * q."""
    x = random_input(13, blocks=3)
    raw = ours("Q8_K", x).reshape(3, 292)
    d = raw[:, :4].copy().view("<f4")[:, 0]
    qs = raw[:, 4:260].view(np.int8)
    sums = raw[:, 260:].copy().view("<i2")
    assert np.array_equal(sums, qs.astype(np.int64).reshape(3, 16, 16).sum(axis=2))
    amax_at = np.argmax(np.abs(x.reshape(3, 256)), axis=1)
    assert np.array_equal(qs[np.arange(3), amax_at], np.full(3, -127))  # the scale's value is -127
    back = np.empty(x.size, F32)
    q.dequantize("Q8_K", raw.reshape(-1), back)
    assert np.array_equal(back.reshape(3, 256), d[:, None] * qs.astype(F32))
    zero = ours("Q8_K", np.zeros(256, F32))
    assert not zero.any()
