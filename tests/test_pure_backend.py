"""The pure-Python backend (aprfast._pure) is a twin of every compiled module: the same
public names and signatures, and the same results bit for bit on random inputs, hostile
ones included (same errors, same messages).  aprfast._backend picks one set per process
(APRFAST_BACKEND), and ``aprfast.backend`` says which.

Each property compares ``aprfast._pure.<module>`` with the compiled module; under
``APRFAST_BACKEND=python`` the compiled one is loaded from its extension file beside the
package (skipped where none was built).
"""

import importlib.machinery
import importlib.util
import inspect
import json
import os
import struct
import sys
import zlib

import lz4.block
import msgpack
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import aprfast
from aprfast import _backend
from aprfast._pure import _blocks as pure_blocks
from aprfast._pure import _crc as pure_crc
from aprfast._pure import _half as pure_half
from aprfast._pure import _index as pure_index
from aprfast._pure import _inputs as pure_inputs
from aprfast._pure import _memory as pure_memory
from aprfast._pure import _metascan as pure_metascan
from aprfast._pure import _quant as pure_quant
from aprfast._pure import _stats as pure_stats
from aprfast.errors import AprError

_LOADED = {}


def compiled(name):
    """The compiled module ``aprfast.<name>``, even when the twins run (loaded from its
    extension file); skip the test where it was never built."""
    current = sys.modules[f"aprfast.{name}"]
    if not current.__name__.startswith("aprfast._pure"):
        return current
    if name not in _LOADED:
        spec = importlib.machinery.PathFinder.find_spec(f"aprfast.{name}", aprfast.__path__)
        if spec is None or not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            _LOADED[name] = None
        else:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            _LOADED[name] = module
    if _LOADED[name] is None:
        pytest.skip(f"aprfast.{name} is not built here")
    return _LOADED[name]


def outcome(call, *args, **kwargs):
    """What a call gives: ("ok", result) or ("raised", exception type, message)."""
    try:
        return ("ok", call(*args, **kwargs))
    except (ValueError, TypeError, OverflowError, KeyError, IndexError, EOFError, AprError) as exc:
        return ("raised", type(exc), str(exc))


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# --- the same interface ------------------------------------------------------------------
def _defined_in(module, attr):
    """A name the module defines (constants included), not one it imported."""
    value = getattr(module, attr)
    return not inspect.ismodule(value) and getattr(value, "__module__", module.__name__) == module.__name__


@pytest.mark.parametrize("name", _backend.MODULES)
def test_every_public_name_of_a_compiled_module_has_a_twin_of_the_same_signature(name):
    native = compiled(name)
    twin = importlib.import_module(f"aprfast._pure.{name}")
    own = [n for n in dir(native) if not n.startswith("_") and _defined_in(native, n)]
    missing = sorted(n for n in own if not hasattr(twin, n))
    assert not missing, f"aprfast._pure.{name} lacks {missing}"
    for attr in own:
        ours, theirs = getattr(native, attr), getattr(twin, attr)
        if not callable(ours) or isinstance(ours, type):
            continue
        want = [(p.name, p.kind, p.default) for p in inspect.signature(ours).parameters.values()]
        got = [(p.name, p.kind, p.default) for p in inspect.signature(theirs).parameters.values()]
        assert got == want, f"{name}.{attr}"


@pytest.mark.parametrize("name, constants", [
    ("_quant", ["TYPES"]), ("_stats", ["KINDS", "ITEMSIZE", "MOMENTS", "HIST", "MAX_BINS"]),
    ("_index", ["RULE_UNKNOWN", "RULE_FIXED", "RULE_ROW_BLOCKS", "RULE_FLAT_BLOCKS", "RULE_SCALE_PLUS_ONE"]),
    ("_memory", ["LZ4_MAX_RATIO", "LZ4_SLACK", "BUFFER_CACHE_MIN"]), ("_blocks", ["COPY", "LZ4", "ZSTD"]),
    ("_metascan", ["MiB", "MAX_DEPTH"]),
])
def test_the_constants_are_the_same(name, constants):
    native, twin = compiled(name), importlib.import_module(f"aprfast._pure.{name}")
    for constant in constants:
        if hasattr(native, constant):
            assert getattr(twin, constant) == getattr(native, constant), constant


def test_the_twins_run_the_portable_path_and_refuse_the_compiled_ones_by_name():
    for twin in (pure_crc, pure_half, pure_quant):
        assert twin.available_paths() == ["portable"] and twin.best_path() == "portable"
    with pytest.raises(ValueError, match="unknown CRC32 path 'pclmul'"):
        pure_crc.crc32(b"x", path="pclmul")
    with pytest.raises(ValueError, match="unknown quantization path 'avx2'"):
        pure_quant.quantize_q8_0(np.zeros(32, np.float32), np.zeros(34, np.uint8), path="avx2")


# --- CRC32 -------------------------------------------------------------------------------
@given(st.binary(max_size=3000), st.integers(0, 2**32 - 1))
def test_crc32_is_zlibs(data, start):
    assert pure_crc.crc32(data, start) == zlib.crc32(data, start) == compiled("_crc").crc32(data, start)


@given(st.binary(max_size=500), st.binary(max_size=500), st.integers(0, 2**32 - 1))
def test_crc32_combine_gives_the_crc_of_the_concatenation(a, b, start):
    crc_a, crc_b = zlib.crc32(a, start), zlib.crc32(b)
    assert pure_crc.crc32_combine(crc_a, crc_b, len(b)) == zlib.crc32(a + b, start)
    for len2 in (0, 1, 2**32 + 5, 2**64 - 1):
        assert pure_crc.crc32_combine(crc_a, crc_b, len2) == compiled("_crc").crc32_combine(crc_a, crc_b, len2)


def test_crc32_refuses_what_the_compiled_one_refuses():
    native = compiled("_crc")
    strided = np.arange(100, dtype=np.float32)[::2]
    for args in [(strided,), (b"x", -1), (b"x", 2**32), ("text",)]:
        assert outcome(pure_crc.crc32, *args)[:2] == outcome(native.crc32, *args)[:2], args


# --- float16 / bfloat16 ------------------------------------------------------------------
U32 = st.integers(0, 2**32 - 1)
SPECIAL_F32 = st.sampled_from([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7F800001, 0x7FC00000, 0xFFFFFFFF,
                               0x7F802000, 0x477FEFFF, 0x477FF000, 0x38800000, 0x387FFFFF, 0x33000000,
                               0x33000001, 0x00000001, 0x7F7FFFFF, 0x3F808000, 0x3F818000])


@given(st.lists(U32 | SPECIAL_F32, max_size=300))
def test_f32_to_f16_and_bf16_round_bit_for_bit(bits):
    src = np.array(bits, np.uint32).view(np.float32)
    native = compiled("_half")
    for name in ("f32_to_f16", "f32_to_bf16"):
        ours, theirs = np.empty(len(bits), np.uint16), np.empty(len(bits), np.uint16)
        getattr(pure_half, name)(src, ours)
        getattr(native, name)(src, theirs)
        assert bits_equal(ours, theirs), name


def test_f32_to_f16_matches_numpy_on_a_sweep_of_every_exponent():
    bits = np.arange(0, 2**32, 65521, dtype=np.uint64).astype(np.uint32)
    finite = bits[(bits & 0x7F800000) != 0x7F800000]
    ours = np.empty(finite.size, np.uint16)
    pure_half.f32_to_f16(finite.view(np.float32), ours)
    with np.errstate(over="ignore"):
        assert bits_equal(ours, finite.view(np.float32).astype(np.float16).view(np.uint16))


def test_every_half_widens_exactly():
    halves = np.arange(65536, dtype=np.uint16)
    native = compiled("_half")
    for name in ("f16_to_f32", "bf16_to_f32"):
        ours, theirs = np.empty(65536, np.float32), np.empty(65536, np.float32)
        getattr(pure_half, name)(halves, ours)
        getattr(native, name)(halves, theirs)
        assert bits_equal(ours.view(np.uint32), theirs.view(np.uint32)), name


def test_half_conversions_refuse_what_the_compiled_ones_refuse():
    native = compiled("_half")
    buf = np.zeros(8, np.float32)
    cases = [(np.zeros(4, np.float32), np.zeros(3, np.uint16)), (np.zeros(4, np.float64), np.zeros(4, np.uint16)),
             (buf, buf.view(np.uint16)[:8]), (np.zeros(4, np.float32), np.zeros(4, np.uint16)[::-1])]
    for src, out in cases:
        assert outcome(pure_half.f32_to_f16, src, out)[:2] == outcome(native.f32_to_f16, src, out)[:2]


# --- quantization ------------------------------------------------------------------------
QUANTIZABLE = [name for name in pure_quant.TYPES if pure_quant.can_quantize(name)]


def _floats(draw_bits, count, scale):
    """float32s from raw bits (NaN, Inf, subnormals) or normal values of the given scale."""
    return st.one_of(
        st.lists(U32 | SPECIAL_F32, min_size=count, max_size=count).map(
            lambda b: np.array(b, np.uint32).view(np.float32)),
        st.lists(st.floats(-float(np.float32(scale)), float(np.float32(scale)), width=32), min_size=count,
                 max_size=count).map(
            lambda v: np.array(v, np.float32)),
        st.lists(st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 7.0, -8.0]), min_size=count, max_size=count).map(
            lambda v: np.array(v, np.float32)),
    )


@st.composite
def quant_inputs(draw):
    name = draw(st.sampled_from(QUANTIZABLE))
    elems = pure_quant.block_info(name)[0]
    partial = name in ("APR_Q4", "APR_FQ8_0", "APR_FQ4_0") or elems == 1
    count = draw(st.integers(0, 130)) if partial else elems * draw(st.integers(0, 4))
    scale = draw(st.sampled_from([1.0, 1e-30, 1e30, 3e38]))
    return name, draw(_floats(None, count, scale))


@given(quant_inputs())
@settings(deadline=None)
def test_quantize_gives_the_compiled_bytes(case):
    name, x = case
    if (name.endswith("_K") and name != "Q8_K") or name.startswith(("IQ4", "IQ3")):
        # Which of two NaNs a K-quant's (or IQ4's, IQ3_S's) float operation keeps follows the compiler's
        # operand order (docs/FORMAT.md); the twin gives the compiled bytes for every other input
        # (Q8_K's operations never see two NaNs: NaN blocks are compared too).
        x = np.where(np.isnan(x), np.float32(0), x)
    n = pure_quant.quantized_nbytes(name, x.size)
    ours, theirs = np.full(n, 0xAA, np.uint8), np.full(n, 0x55, np.uint8)
    pure_quant.quantize(name, x, ours)
    compiled("_quant").quantize(name, x, theirs)
    assert bits_equal(ours, theirs), name


@given(st.sampled_from(list(pure_quant.TYPES)), st.integers(0, 3), st.data())
@settings(deadline=None)
def test_dequantize_gives_the_compiled_floats_for_any_bytes(name, blocks, data):
    elems = pure_quant.block_info(name)[0]
    count = blocks * max(elems, 1) + (data.draw(st.integers(0, elems - 1)) if name in (
        "APR_Q4", "APR_FQ8_0", "APR_FQ4_0") else 0)
    if elems == 1:
        count = data.draw(st.integers(0, 70))
    raw = np.frombuffer(data.draw(st.binary(min_size=pure_quant.quantized_nbytes(name, count),
                                            max_size=pure_quant.quantized_nbytes(name, count))), np.uint8)
    ours, theirs = np.empty(count, np.float32), np.empty(count, np.float32)
    pure_quant.dequantize(name, raw, ours)
    compiled("_quant").dequantize(name, raw, theirs)
    assert bits_equal(ours.view(np.uint32), theirs.view(np.uint32)), name


def test_quantized_sizes_and_refusals_are_the_compiled_ones():
    native = compiled("_quant")
    for name in pure_quant.TYPES:
        assert pure_quant.block_info(name) == native.block_info(name)
        assert pure_quant.can_quantize(name) == native.can_quantize(name)
        for n in (0, 1, 31, 32, 33, 256, 2**63, 2**64 - 1):
            assert outcome(pure_quant.quantized_nbytes, name, n) == outcome(native.quantized_nbytes, name, n)
            assert pure_quant.header_bytes(name, n) == native.header_bytes(name, n)
    calls = [("IQ3_XXS", np.zeros(256, np.float32), np.zeros(98, np.uint8)),
             ("Q8_0", np.zeros(33, np.float32), np.zeros(68, np.uint8)),
             ("Q8_0", np.zeros(32, np.float32), np.zeros(35, np.uint8)),
             ("Q9_9", np.zeros(32, np.float32), np.zeros(34, np.uint8)),
             ("Q8_0", np.zeros(32, np.float64), np.zeros(34, np.uint8))]
    for args in calls:  # (Cython words a buffer of the wrong item type its own way: the type is compared)
        assert outcome(pure_quant.quantize, *args)[:2] == outcome(native.quantize, *args)[:2], args[0]
        if args[1].dtype == np.float32:
            assert outcome(pure_quant.quantize, *args) == outcome(native.quantize, *args), args[0]
    assert outcome(pure_quant.dequantize, "Q4_0", np.zeros(17, np.uint8), np.zeros(32, np.float32)) == \
        outcome(native.dequantize, "Q4_0", np.zeros(17, np.uint8), np.zeros(32, np.float32))


# --- statistics --------------------------------------------------------------------------
EXACT_STATS = ("count", "nan", "pos_inf", "neg_inf", "zero", "finite", "min", "max", "imin", "imax", "umin",
               "umax")


def _same_stats(ours: dict, theirs: dict):
    """Counts and extremes equal; mean and M2 equal to rounding (the C sums in the
    order its vectorizer picks)."""
    for key in EXACT_STATS:
        assert ours[key] == theirs[key], key
    assert ours["mean"] == pytest.approx(theirs["mean"], rel=1e-9, abs=1e-300)
    assert ours["m2"] == pytest.approx(theirs["m2"], rel=1e-9, abs=1e-300)


@given(st.sampled_from(list(pure_stats.KINDS)), st.binary(max_size=20000), st.integers(0, 40),
       st.sampled_from([(-1.0, 1.0), (0.0, 255.0), (-1e308, 1e308), (1.0, 1.0 + 2**-40), (-3e38, 5.0)]))
@settings(deadline=None)
def test_statistics_match_the_compiled_engine(kind, raw, bins, lohi):
    item = pure_stats.ITEMSIZE[kind]
    data = np.frombuffer(raw[:len(raw) // item * item], np.uint8)
    ours, theirs = np.zeros(bins, np.uint64), np.zeros(bins, np.uint64)
    want = pure_stats.MOMENTS | (pure_stats.HIST if bins else 0)
    a = pure_stats.compute(kind, data, want, ours, *lohi)
    b = compiled("_stats").compute(kind, data, want, theirs, *lohi)
    _same_stats(a, b)
    assert bits_equal(ours, theirs)


@given(st.sampled_from(["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K", "APR_Q8", "APR_Q4", "Q8_TENSOR", "APR_FQ4_0"]),
       st.integers(1, 3), st.integers(1, 300), st.integers(-1, 1), st.data())
@settings(deadline=None)
def test_statistics_of_packed_tensors_match_the_compiled_engine(name, rows, row, wrong_size, data):
    """``rows`` rows of ``row`` values, each row padded to whole blocks (the last block of a
    one-row tensor of an APR type may be partial); now and then a byte more or less."""
    elems, block_bytes = pure_quant.block_info(name)
    n = rows * row
    header = pure_quant.header_bytes(name, n)
    if rows == 1 and name in ("APR_Q4", "APR_FQ4_0"):
        nbytes = pure_quant.quantized_nbytes(name, n)
    else:
        nbytes = header + rows * -(-row // elems) * block_bytes
    nbytes = max(0, nbytes + wrong_size)
    raw = np.frombuffer(data.draw(st.binary(min_size=nbytes, max_size=nbytes)), np.uint8)
    ours, theirs = np.zeros(7, np.uint64), np.zeros(7, np.uint64)
    qtype = pure_quant.TYPES[name]
    a = outcome(pure_stats.compute_quant, qtype, raw, rows, row, 3, ours, -2.0, 2.0)
    b = outcome(compiled("_stats").compute_quant, qtype, raw, rows, row, 3, theirs, -2.0, 2.0)
    if a[0] == "ok" and b[0] == "ok":
        _same_stats(a[1], b[1])
        assert bits_equal(ours, theirs)
    else:
        assert a == b


@given(st.sampled_from(list(pure_quant.TYPES)), st.integers(0, 3), st.integers(0, 300), st.integers(-1, 1),
       st.sampled_from([None, 0x7E00, 0x7C00, 0xFC00, 0x0001, 0x0000, 0x7BFF]), st.data())
@settings(deadline=None)
def test_known_finite_packed_tensors_match_the_compiled_engine(name, rows, row, wrong_size, half, data):
    """quant_finite: random blocks, some with one float16 of every block set to a special value."""
    elems, block_bytes = pure_quant.block_info(name)
    n = rows * row
    header = pure_quant.header_bytes(name, n)
    nbytes = max(0, header + rows * -(-row // elems) * block_bytes + wrong_size)
    raw = np.frombuffer(data.draw(st.binary(min_size=nbytes, max_size=nbytes)), np.uint8).copy()
    if half is not None and block_bytes >= 2 and nbytes >= block_bytes:
        offset = data.draw(st.sampled_from(pure_stats._FINITE_F16.get(name, (0,))))
        blocks = raw[:nbytes // block_bytes * block_bytes].reshape(-1, block_bytes)
        blocks[:, offset:offset + 2] = np.array([half], "<u2").view(np.uint8)
    qtype = pure_quant.TYPES[name]
    assert outcome(pure_stats.quant_finite, qtype, raw, rows, row) == \
        outcome(compiled("_stats").quant_finite, qtype, raw, rows, row)


def test_statistics_refuse_what_the_compiled_engine_refuses():
    native = compiled("_stats")
    cases = [("F32", np.zeros(3, np.uint8), 1), ("F99", np.zeros(4, np.uint8), 1), ("F32", np.zeros(4, np.uint8), 2)]
    for args in cases:
        assert outcome(pure_stats.compute, *args) == outcome(native.compute, *args)
    for lohi in [(1.0, 1.0), (0.0, float("inf")), (float("nan"), 1.0)]:
        args = ("F32", np.zeros(4, np.uint8), 2, np.zeros(3, np.uint64), *lohi)
        assert outcome(pure_stats.compute, *args) == outcome(native.compute, *args)
    for args in [(99, np.zeros(4, np.uint8), 1, 4, 1), (0, np.zeros(33, np.uint8), 1, 32, 1),
                 (0, np.zeros(34, np.uint8), 2**40, 2**40, 1)]:
        assert outcome(pure_stats.compute_quant, *args) == outcome(native.compute_quant, *args)


# --- the tensor index --------------------------------------------------------------------
class Item:
    def __init__(self, name, dtype, shape, nbytes, raw_size=0, flags=0):
        self.name, self.dtype, self.shape, self.nbytes = name, dtype, shape, nbytes
        self.raw_size, self.flags = raw_size, flags


RULES = np.zeros(256, np.int8)
RULE_A = np.zeros(256, np.int64)
RULE_B = np.zeros(256, np.int64)
RULES[0], RULE_A[0] = 1, 4     # F32
RULES[1], RULE_A[1] = 1, 2     # F16
RULES[2], RULE_A[2], RULE_B[2] = 2, 32, 34   # Q8_0 rows
RULES[3], RULE_A[3], RULE_B[3] = 3, 32, 18   # flat blocks
RULES[4], RULE_A[4] = 4, 4     # scale plus one


def _nbytes(dtype, shape):
    count = int(np.prod(shape, dtype=object)) if shape else 1
    row = shape[-1] if shape else 1
    return {0: 4 * count, 1: 2 * count, 2: (count // row * -(-row // 32) * 34) if count else 0,
            3: -(-count // 32) * 18, 4: 4 + count if count else 0, 9: 3}[dtype]


@st.composite
def indexes(draw):
    names = sorted(set(draw(st.lists(st.text(min_size=0, max_size=6), max_size=12))), key=lambda s: s.encode())
    items, offsets, at = [], [], 0
    for name in names:
        dtype = draw(st.sampled_from([0, 1, 2, 3, 4, 9]))
        shape = tuple(draw(st.lists(st.integers(0, 40), max_size=3)))
        nbytes = _nbytes(dtype, shape)
        items.append(Item(name, dtype, shape, nbytes))
        offsets.append(at)
        at += nbytes + draw(st.integers(0, 3))
    return items, offsets, at, draw(st.booleans())


def _parse(module, blob, count, spec, data_len, strict=False):
    def run():
        entries, end = module.parse_index(blob, count, spec, 8, 64, RULES, RULE_A, RULE_B, data_len, strict, 8)
        offsets, sizes = entries.extents()
        found = [entries.find(n) for n in entries.names() + ["", "zz", "\udc80"]]
        return (end, entries.names(), entries.rows(100), entries.describe(7, [f"d{i}" for i in range(256)]),
                offsets.tolist(), sizes.tolist(), found, [entries.flags(i) for i in range(len(entries))],
                list(module.Names(entries)), dict(module.Positions(entries).items()), entries.compressed)
    return outcome(run)


@given(indexes(), st.data())
@settings(deadline=None)
def test_index_parsing_matches_the_compiled_parser_on_valid_and_damaged_indexes(case, data):
    items, offsets, data_len, spec = case
    native = compiled("_index")
    ids = {i: i for i in range(256)}
    blob = pure_index.encode_entries(items, offsets, ids, spec)
    assert blob == native.encode_entries(items, offsets, ids, spec)
    assert pure_index.lay_out(items, 64) == native.lay_out(items, 64)
    assert _parse(pure_index, blob, len(items), spec, data_len) == _parse(native, blob, len(items), spec, data_len)
    damaged = bytearray(blob)
    for _ in range(data.draw(st.integers(1, 4))):
        if damaged:
            damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    count = len(items) + data.draw(st.integers(-1, 1))
    strict = data.draw(st.booleans())
    assert _parse(pure_index, bytes(damaged), count, spec, data_len, strict) == \
        _parse(native, bytes(damaged), count, spec, data_len, strict)


def test_index_refusals_name_the_same_entry_in_the_same_words():
    native = compiled("_index")
    ids = {i: i for i in range(256)}
    cases = [
        ([Item("a", 0, (2,), 8), Item("a", 0, (2,), 8)], [0, 8]),            # a name twice
        ([Item("b", 0, (2,), 8), Item("a", 0, (2,), 8)], [0, 8]),            # out of order
        ([Item("a", 0, (2,), 9)], [0]),                                      # a size the shape does not need
        ([Item("a", 0, (2**40, 2**40), 8)], [0]),                            # more than 2**62 bytes
        ([Item("a", 7, (2,), 8)], [0]),                                      # an unknown dtype (strict)
        ([Item("a", 0, (2,), 8), Item("b", 0, (3,), 12)], [4, 0]),           # overlapping extents
        ([Item("a", 0, (2,), 8, raw_size=8, flags=3)], [0]),                 # an unknown codec
        ([Item("a", 0, (2,), 8)], [60]),                                     # past the data section
    ]
    for items, offsets in cases:
        blob = pure_index.encode_entries(items, offsets, ids, True, True)
        for count in (len(items), len(items) + 5):
            got = _parse(pure_index, blob, count, True, 64, True)
            assert got[0] == "raised" and got == _parse(native, blob, count, True, 64, True), got


# --- LZ4 blocks, block tables, buffers ---------------------------------------------------
@given(st.binary(max_size=2000).map(lambda b: b * 3), st.data())
@settings(deadline=None)
def test_lz4_blocks_decode_as_the_compiled_decoder_decodes_them(raw, data):
    block = bytearray(lz4.block.compress(raw, store_size=False))
    if data.draw(st.booleans()) and block:
        block[data.draw(st.integers(0, len(block) - 1))] = data.draw(st.integers(0, 255))
    size = len(raw) + data.draw(st.sampled_from([0, 0, -1, 1, 7]))
    assume(size >= 0)
    ours, theirs = np.zeros(size, np.uint8), np.zeros(size, np.uint8)
    native = compiled("_memory")
    problem = pure_memory.lz4_block_decode_into(bytes(block), ours)
    assert problem == native.lz4_block_decode_into(bytes(block), theirs)
    if problem is None:
        assert bits_equal(ours, theirs)


def test_block_tables_decode_as_the_compiled_decoder_decodes_them():
    native = compiled("_blocks")
    raw = [bytes(range(200)) * 5, b"", b"abc" * 100, b"\x00" * 4096]
    packed = [lz4.block.compress(r, store_size=False) for r in raw] + [b"copied"]
    src = np.frombuffer(b"".join(packed), np.uint8)
    lens = np.array([len(p) for p in packed], np.uint64)
    src_off = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.uint64)
    out_len = np.array([len(r) for r in raw] + [6], np.uint64)
    dst_off = np.concatenate([[0], np.cumsum(out_len)[:-1]]).astype(np.uint64)
    codes = np.array([1, 1, 1, 1, 0], np.uint8)
    for codec_of_last in (0, 1, 2, 9):
        codes[-1] = codec_of_last
        ours, theirs = np.zeros(int(out_len.sum()), np.uint8), np.zeros(int(out_len.sum()), np.uint8)
        a = pure_blocks.decode_blocks(src, src_off, lens, ours, dst_off, out_len, codes)
        b = native.decode_blocks(src, src_off, lens, theirs, dst_off, out_len, codes)
        if native.zstd_native() and codec_of_last == 2:
            continue  # the compiled module decodes zstd itself; the twin leaves it to zstandard
        assert a == b
        if a is None:
            assert bits_equal(ours, theirs) and bytes(ours) == b"".join(raw) + b"copied"


@pytest.mark.parametrize("size, alignment", [(0, 64), (1, 1), (100, 4096), (5000, 256), (33 << 20, 64)])
def test_aligned_buffers_are_aligned_writable_bytes(size, alignment):
    buf = pure_memory.AlignedBuffer(size, alignment)
    view = memoryview(buf)
    assert len(buf) == size and buf.size == size and buf.alignment == alignment
    assert view.nbytes == size and view.format == "B" and not view.readonly
    assert buf.address % (2 << 20 if size >= 32 << 20 else alignment) == 0
    assert buf.huge_page_backed == (size >= 32 << 20)
    np.frombuffer(buf, np.uint8)[:] = 7
    assert bytes(view[:3]) == b"\x07" * min(3, size)
    for bad in (0, 3, 8192):
        with pytest.raises(ValueError, match="power of two"):
            pure_memory.AlignedBuffer(16, bad)
    with pytest.raises((MemoryError, OverflowError)):
        pure_memory.AlignedBuffer(2**64 - 1)


def test_bulk_copies_reads_and_appends(tmp_path):
    payload = bytes(range(256)) * 300
    path = tmp_path / "f"
    path.write_bytes(payload)
    with open(path, "rb") as f:
        out = np.zeros(1000, np.uint8)
        assert pure_memory.pread_into(f.fileno(), 5, out, crc=0) == zlib.crc32(payload[5:1005])
        assert bytes(out) == payload[5:1005]
        with pytest.raises(EOFError):
            pure_memory.pread_into(f.fileno(), len(payload) - 10, np.zeros(20, np.uint8))
    dst = np.zeros(10, np.uint8)
    pure_memory.copy_into(dst, b"0123456789")
    assert bytes(dst) == b"0123456789" and pure_memory.copy_to_bytes(dst) == b"0123456789"
    with pytest.raises(ValueError, match="destination holds 10 bytes, source has 11"):
        pure_memory.copy_into(dst, b"x" * 11)
    gathered = bytearray(b"ab")
    assert pure_memory.append_padded(gathered, np.array([1, 2], np.uint16), 3) == 4
    assert gathered == b"ab\x01\x00\x02\x00\x00\x00\x00"
    grown = pure_memory.uninitialised_bytearray(4)
    pure_memory.resize_bytearray(grown, 9)
    assert len(grown) == 9


def test_writer_inputs_and_their_storage_are_the_compiled_ones():
    native = compiled("_inputs")
    a = np.arange(6, dtype=np.float32)
    tensors = {"a": a, "b": a, "c": np.zeros(0, np.float32), "d": a[::2], "e": [1, 2]}
    native_types = {np.dtype(np.float32): "F32"}

    def fallback(name, value):
        return pure_inputs.TensorInput(name, "OTHER", (), b"", 0)

    ours = pure_inputs.inputs_of(tensors, native_types, fallback)
    theirs = native.inputs_of(tensors, native_types, fallback)
    def described(inputs):
        return [(t.name, t.dtype, t.shape, t.nbytes) for t in inputs]
    assert described(ours) == described(theirs)
    assert pure_inputs.storage_keys(ours) == native.storage_keys(theirs)


# --- metadata scanning -------------------------------------------------------------------
_KEYS = st.text(max_size=6) | st.sampled_from(["é", "日本", "\U0001F600", "k" * 300, "\\"])
_LEAVES = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
           | st.text(max_size=8) | st.sampled_from(["é" * 40, "\u0100\U0001F600", "x\ny"]))
_VALUES = st.recursive(_LEAVES, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_KEYS, inner, max_size=5),
                       max_leaves=30)


def _damage(data, raw: bytes) -> bytes:
    damaged = bytearray(raw)
    for _ in range(data.draw(st.integers(0, 3))):
        if not damaged:
            break
        at = data.draw(st.integers(0, len(damaged) - 1))
        action = data.draw(st.sampled_from(["set", "cut", "insert"]))
        if action == "set":
            damaged[at] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del damaged[at:]
        else:
            damaged[at:at] = data.draw(st.sampled_from([b"\x90", b"\xc1", b"[", b"{", b'"', b"\\", b",[]", b"\xe9"]))
    return bytes(damaged)


@given(st.dictionaries(_KEYS, _VALUES, max_size=6), st.data())
@settings(deadline=None)
def test_msgpack_scans_match_the_compiled_scanner(value, data):
    native = compiled("_metascan")
    block = _damage(data, msgpack.packb(value, use_bin_type=True))
    assert pure_metascan.scan(block, json=False) == native.scan(block, json=False)
    assert outcome(pure_metascan.check_msgpack, block) == outcome(native.check_msgpack, block)


@given(st.dictionaries(_KEYS, _VALUES, max_size=6), st.sampled_from([None, 1]), st.booleans(), st.data())
@settings(deadline=None)
def test_json_scans_and_texts_match_the_compiled_scanner(value, indent, ascii_only, data):
    native = compiled("_metascan")
    block = _damage(data, json.dumps(value, indent=indent, ensure_ascii=ascii_only).encode())
    assert pure_metascan.scan(block, json=True) == native.scan(block, json=True)
    assert outcome(pure_metascan.json_text, block) == outcome(native.json_text, block)


@pytest.mark.parametrize("block, is_json", [
    (b"\x81\xa1a\xdd" + struct.pack(">I", 300000) + b"\x90" * 300000, False),
    (b"\x81\xa1a\xdd" + struct.pack(">I", 300000) + b"\x90\x80\xc0\xe0\xff\x05" * 50000, False),
    (b'{"a":[' + b",".join([b"[]"] * 200000) + b"]}", True),
    (b'{"a":[' + b",".join([b"{}", b"[ ]", b"null", b"true"] * 50000) + b"]}", True),
    (b'{"a":' + b"[" * 1024 + b"]" * 1024 + b"}", True),
    (b'{"a":' + b"[" * 1025 + b"]" * 1025 + b"}", True),
    (b"\x81\xa1a" + b"\x91" * 1023 + b"\x90", False),
    (b"\x81\xa1a" + b"\x91" * 1024 + b"\x90", False),
    (json.dumps({"v": "\u0100" * 70000 + "\U0001F600", "é": "é" * 70000}, ensure_ascii=False).encode(), True),
])
def test_large_and_deep_blocks_scan_as_the_compiled_scanner_scans_them(block, is_json):
    native = compiled("_metascan")
    assert pure_metascan.scan(block, json=is_json) == native.scan(block, json=is_json)
    if is_json:
        assert outcome(pure_metascan.json_text, block) == outcome(native.json_text, block)


# --- choosing the backend ----------------------------------------------------------------
_REPORT = ("import aprfast, json; print(json.dumps([aprfast.backend] + "
           "[getattr(aprfast, m).__name__ for m in aprfast._backend.MODULES]))")


def _child(run_child, env_value, prelude=""):
    """Import aprfast in a fresh process with APRFAST_BACKEND set to ``env_value`` (unset
    for None); its stdout is the backend and the module each compiled name resolves to."""
    setting = (f"os.environ[{_backend.ENV!r}] = {env_value!r}" if env_value is not None
               else f"os.environ.pop({_backend.ENV!r}, None)")
    return run_child(f"import os\n{setting}\n{prelude}\n{_REPORT}")


def test_the_environment_variable_forces_the_pure_backend(run_child):
    out = _child(run_child, "python")
    assert out.returncode == 0, out.stderr
    backend, *modules = json.loads(out.stdout)
    assert backend == "python"
    assert modules == [f"aprfast._pure.{m}" for m in _backend.MODULES]


def test_by_default_and_when_forced_the_compiled_modules_run_where_they_are_built(run_child):
    compiled("_crc")  # skips where nothing was built
    for value in (None, "c", "auto", " C "):
        out = _child(run_child, value)
        assert out.returncode == 0, out.stderr
        backend, *modules = json.loads(out.stdout)
        assert backend == "c" and modules == [f"aprfast.{m}" for m in _backend.MODULES], value


_BREAK_QUANT = """
import importlib.abc, sys
class Broken(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "aprfast._quant":
            raise ImportError("simulated: no compiled _quant")
sys.meta_path.insert(0, Broken())
"""


def _compiled_modules_installed() -> bool:
    import glob
    import importlib.machinery

    here = os.path.dirname(os.path.abspath(aprfast.__file__))
    return all(any(glob.glob(os.path.join(here, m + suffix)) for suffix in importlib.machinery.EXTENSION_SUFFIXES)
               for m in _backend.MODULES)


def test_a_missing_compiled_module_falls_back_to_the_twins_unless_c_is_forced(run_child):
    out = _child(run_child, None, _BREAK_QUANT)
    assert out.returncode == 0, out.stderr
    backend, *modules = json.loads(out.stdout)
    assert backend == "python" and modules == [f"aprfast._pure.{m}" for m in _backend.MODULES]
    forced = _child(run_child, "c", _BREAK_QUANT)
    assert forced.returncode != 0
    assert "APRFAST_BACKEND=c but a compiled aprfast module is missing" in forced.stderr
    if _compiled_modules_installed():  # (the pure wheel has none: _crc is missing first)
        assert "simulated: no compiled _quant" in forced.stderr


def test_an_unknown_backend_name_is_refused(run_child):
    out = _child(run_child, "rust")
    assert out.returncode != 0 and "APRFAST_BACKEND='rust'" in out.stderr


def test_the_backend_attribute_says_which_modules_this_process_runs():
    assert aprfast.backend in ("c", "python")
    pure = all(getattr(aprfast, m).__name__.startswith("aprfast._pure.") for m in _backend.MODULES)
    assert pure == (aprfast.backend == "python")
    assert (sys.modules["aprfast._crc"] is pure_crc) == (aprfast.backend == "python")
