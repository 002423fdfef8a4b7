"""aprfast._half converts float32 <-> float16 / bfloat16 exactly as NumPy's ``astype`` and
ml_dtypes do, bit for bit, on every kernel this CPU runs, for every length, alignment and
thread count.

The references are NumPy (float16) and ml_dtypes (bfloat16) at test time.  Every float16
and bfloat16 pattern is checked; for float32 sources the f16-normal range and all NaNs are
checked exhaustively, the rest through every combination of the top 16 bits with the low
bit patterns that decide rounding.  ``APRFAST_EXHAUSTIVE=1`` also runs all 2**32 float32
patterns through every kernel (a few minutes).
"""

import os
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aprfast import _half

ml_dtypes = pytest.importorskip("ml_dtypes")

PATHS = _half.available_paths()
PATHS_AND_AUTO = PATHS + [None, "auto"]
EXHAUSTIVE = os.environ.get("APRFAST_EXHAUSTIVE") == "1"
CHUNK = 1 << 24
CSRC = Path(__file__).resolve().parent.parent / "csrc"


# ---------------------------------------------------------------------------
# References and a uniform way to call the kernels on bit patterns.

def ref_f32_to_f16(bits):
    with np.errstate(all="ignore"):
        return bits.view(np.float32).astype(np.float16).view(np.uint16)


def ref_f16_to_f32(bits):
    with np.errstate(all="ignore"):
        return bits.view(np.float16).astype(np.float32).view(np.uint32)


def ref_f32_to_bf16(bits):
    with np.errstate(all="ignore"):
        return bits.view(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def ref_bf16_to_f32(bits):
    with np.errstate(all="ignore"):
        return bits.view(ml_dtypes.bfloat16).astype(np.float32).view(np.uint32)


# name -> (kernel, source bit dtype, source value dtype, result bit dtype, result value dtype, reference)
CONVERSIONS = {
    "f32_to_f16": (_half.f32_to_f16, np.uint32, np.float32, np.uint16, np.uint16, ref_f32_to_f16),
    "f16_to_f32": (_half.f16_to_f32, np.uint16, np.uint16, np.uint32, np.float32, ref_f16_to_f32),
    "f32_to_bf16": (_half.f32_to_bf16, np.uint32, np.float32, np.uint16, np.uint16, ref_f32_to_bf16),
    "bf16_to_f32": (_half.bf16_to_f32, np.uint16, np.uint16, np.uint32, np.float32, ref_bf16_to_f32),
}
NARROWING = ["f32_to_f16", "f32_to_bf16"]


def run(name, src_bits, path=None, threads=1):
    """Kernel ``name`` on an array of source bit patterns; returns the result bit patterns."""
    kernel, _, src_dtype, out_bits, out_dtype, _ = CONVERSIONS[name]
    out = np.empty(len(src_bits), out_bits)
    kernel(src_bits.view(src_dtype), out.view(out_dtype), threads=threads, path=path)
    return out


def assert_same_bits(name, src_bits, got, want):
    if not np.array_equal(got, want):
        bad = np.flatnonzero(got != want)[:8]
        pairs = [(hex(src_bits[i]), hex(want[i]), hex(got[i])) for i in bad]
        raise AssertionError(f"{name}: {np.count_nonzero(got != want)} differ; (src, want, got): {pairs}")


def check(name, src_bits, path=None, threads=1):
    want = CONVERSIONS[name][5](src_bits)
    assert_same_bits(name, src_bits, run(name, src_bits, path, threads), want)


# ---------------------------------------------------------------------------
# Source sets.

ALL_16 = np.arange(1 << 16, dtype=np.uint16)


def rounding_low_halves():
    """Low 16 bits of a float32 that exercise every rounding decision.  f32 -> f16 (normal)
    drops bits 0-12 (round bit 12, sticky 0-11, kept lsb 13); f16 subnormals drop 14-24
    bits, so any bit can be the round bit; f32 -> bf16 drops bits 0-15 (round bit 15)."""
    low = set()
    for kept in range(8):  # bits 13-15
        for round_bit in (0, 0x1000):
            for sticky in (0, 1, 0x800, 0xFFF):
                low.add(kept << 13 | round_bit | sticky)
    for k in range(17):
        low.update({(1 << k) & 0xFFFF, (1 << k) - 1 & 0xFFFF, ((1 << k) + 1) & 0xFFFF})
    low.update({0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4000, 0xC000, 0xBFFF})
    low.update(np.random.default_rng(7).integers(0, 1 << 16, 64).tolist())
    return np.array(sorted(low), dtype=np.uint32)


def f32_rounding_structures():
    """Every top-16-bit pattern (sign, exponent, top mantissa bits) with each rounding low half."""
    high = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    return (high[:, None] | rounding_low_halves()[None, :]).ravel()


def f32_range_chunks(first, stop):
    """All float32 patterns in [first, stop) in chunks."""
    steps = np.arange(CHUNK, dtype=np.uint32)
    for start in range(first, stop, CHUNK):
        chunk = steps[: min(CHUNK, stop - start)] + np.uint32(start)
        yield chunk


def bits32(*values):
    return np.array(values, dtype=np.uint32)


# ---------------------------------------------------------------------------
# Paths.

def test_portable_path_is_always_available_and_listed_first():
    assert PATHS[0] == "portable"
    assert _half.best_path() in PATHS
    assert set(PATHS) <= set(_half.PATHS)
    assert _half.default_threads() >= 1


@pytest.mark.parametrize("path", ["nonexistent", "PORTABLE", "", "sse2", 3])
def test_unknown_path_name_raises_value_error(path):
    src, out = np.ones(4, np.float32), np.empty(4, np.uint16)
    with pytest.raises(ValueError):
        _half.f32_to_f16(src, out, path=path)


def test_a_path_this_cpu_cannot_run_raises_value_error():
    missing = [name for name, pid in _half.PATHS.items() if pid >= 0 and name not in PATHS]
    if not missing:
        pytest.skip("this CPU runs every kernel")
    for name in missing:
        with pytest.raises(ValueError, match="not available"):
            _half.bf16_to_f32(np.zeros(4, np.uint16), np.empty(4, np.float32), path=name)


# ---------------------------------------------------------------------------
# Exhaustive and structured equality with the references.

@pytest.mark.parametrize("path", PATHS_AND_AUTO)
@pytest.mark.parametrize("name", ["f16_to_f32", "bf16_to_f32"])
def test_widening_is_exact_for_all_65536_patterns(name, path):
    check(name, ALL_16, path)


def test_widening_keeps_nan_payloads_and_signalling_bits():
    # The hardware instructions would quiet these; NumPy and ml_dtypes do not.
    f16 = np.array([0x7C01, 0xFC01, 0x7D00, 0x7E00, 0x7FFF], np.uint16)
    assert run("f16_to_f32", f16, "portable").tolist() == [
        0x7F802000, 0xFF802000, 0x7FA00000, 0x7FC00000, 0x7FFFE000]
    bf16 = np.array([0x7F81, 0xFF81, 0x7FC0, 0x7FFF], np.uint16)
    assert run("bf16_to_f32", bf16, "portable").tolist() == [0x7F810000, 0xFF810000, 0x7FC00000, 0x7FFF0000]
    for path in PATHS:
        check("f16_to_f32", f16, path)
        check("bf16_to_f32", bf16, path)


@pytest.fixture(scope="module")
def rounding_structures():
    src = f32_rounding_structures()
    return src, {name: CONVERSIONS[name][5](src) for name in NARROWING}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", NARROWING)
def test_narrowing_matches_reference_for_every_rounding_structure(name, path, rounding_structures):
    src, want = rounding_structures
    assert len(src) > 100 * (1 << 16)
    assert_same_bits(name, src, run(name, src, path, threads=0), want[name])


def test_f32_to_f16_is_exhaustively_right_on_normal_overflow_and_nan_ranges():
    """Every float32 whose f16 result is normal, infinite (rounded up from 65504 + half an
    ulp) or NaN, both signs: about 530 million patterns, each kernel against one reference."""
    ranges = [(0x38800000, 0x47800000), (0x7F800000, 0x80000000)]
    total = 0
    for sign in (0, 0x80000000):
        for first, stop in ranges:
            for chunk in f32_range_chunks(first + sign, stop + sign):
                want = ref_f32_to_f16(chunk)
                for path in PATHS:
                    assert_same_bits(f"f32_to_f16 on {path}", chunk, run("f32_to_f16", chunk, path, threads=0), want)
                total += len(chunk)
    assert total == 2 * ((0x47800000 - 0x38800000) + (0x80000000 - 0x7F800000))


# name, float32 bits, float16 bits (NumPy), bfloat16 bits (ml_dtypes)
SPECIALS = [
    ("+0", 0x00000000, 0x0000, 0x0000),
    ("-0", 0x80000000, 0x8000, 0x8000),
    ("+inf", 0x7F800000, 0x7C00, 0x7F80),
    ("-inf", 0xFF800000, 0xFC00, 0xFF80),
    ("quiet NaN", 0x7FC00000, 0x7E00, 0x7FC0),
    ("negative quiet NaN", 0xFFC00000, 0xFE00, 0xFFC0),
    ("quiet NaN, payload", 0x7FC02000, 0x7E01, 0x7FC0),
    ("quiet NaN, low payload dropped", 0x7FC00001, 0x7E00, 0x7FC0),
    ("signalling NaN, payload 1", 0x7F800001, 0x7C01, 0x7FC0),
    ("signalling NaN, payload dropped to 0 becomes 1", 0x7F801FFF, 0x7C01, 0x7FC0),
    ("negative signalling NaN", 0xFF800001, 0xFC01, 0xFFC0),
    ("signalling NaN, top payload kept", 0x7FA00000, 0x7D00, 0x7FC0),
    ("all-ones NaN", 0xFFFFFFFF, 0xFFFF, 0xFFC0),
    ("1.0", 0x3F800000, 0x3C00, 0x3F80),
    ("f16 max finite 65504", 0x477FE000, 0x7BFF, 0x4780),
    ("just below 65520 stays finite", 0x477FEFFF, 0x7BFF, 0x4780),
    ("65520 ties to even: inf", 0x477FF000, 0x7C00, 0x4780),
    ("f32 max finite", 0x7F7FFFFF, 0x7C00, 0x7F80),
    ("bf16 max finite stays", 0x7F7F7FFF, 0x7C00, 0x7F7F),
    ("bf16 tie below max rounds to even (up, to inf)", 0x7F7F8000, 0x7C00, 0x7F80),
    ("f16 min normal 2^-14", 0x38800000, 0x0400, 0x3880),
    ("just below 2^-14 rounds up to min normal", 0x387FFFFF, 0x0400, 0x3880),
    ("f16 max subnormal", 0x387FC000, 0x03FF, 0x3880),
    ("f16 min subnormal 2^-24", 0x33800000, 0x0001, 0x3380),
    ("2^-25 ties to even: 0", 0x33000000, 0x0000, 0x3300),
    ("just above 2^-25 rounds to 2^-24", 0x33000001, 0x0001, 0x3300),
    ("1.5 * 2^-24 ties to even: 2^-23", 0x33C00000, 0x0002, 0x33C0),
    ("2.5 * 2^-24 ties to even: 2^-23", 0x34200000, 0x0002, 0x3420),
    ("-2^-24", 0xB3800000, 0x8001, 0xB380),
    ("1 + 2^-11 ties to even: 1", 0x3F801000, 0x3C00, 0x3F80),
    ("1 + 3 * 2^-11 ties to even: up", 0x3F803000, 0x3C02, 0x3F80),
    ("bf16 tie to even down", 0x3F808000, 0x3C04, 0x3F80),
    ("bf16 tie to even up", 0x3F818000, 0x3C0C, 0x3F82),
    ("f32 min subnormal", 0x00000001, 0x0000, 0x0000),
    ("f32 subnormal keeps in bf16", 0x00018000, 0x0000, 0x0002),
    ("f32 max subnormal", 0x007FFFFF, 0x0000, 0x0080),
    ("negative f32 subnormal", 0x80008000, 0x8000, 0x8000),
]


@pytest.mark.parametrize("path", PATHS_AND_AUTO)
def test_special_values_give_documented_bits(path):
    src = bits32(*(row[1] for row in SPECIALS))
    f16 = np.array([row[2] for row in SPECIALS], np.uint16)
    bf16 = np.array([row[3] for row in SPECIALS], np.uint16)
    # The table is what the references do ...
    assert_same_bits("numpy f16", src, ref_f32_to_f16(src), f16)
    assert_same_bits("ml_dtypes bf16", src, ref_f32_to_bf16(src), bf16)
    # ... and what every kernel does, in vector bodies and scalar tails alike.
    for reps in (1, 17):
        many = np.repeat(src, reps)
        assert_same_bits("f32_to_f16", many, run("f32_to_f16", many, path), np.repeat(f16, reps))
        assert_same_bits("f32_to_bf16", many, run("f32_to_bf16", many, path), np.repeat(bf16, reps))


@pytest.mark.parametrize("path", PATHS)
def test_every_f16_survives_a_round_trip_through_f32(path):
    there = run("f16_to_f32", ALL_16, path)
    back = run("f32_to_f16", there, path)
    assert np.array_equal(back, ALL_16)  # NaN payloads included: none has a zero top payload


@pytest.mark.parametrize("path", PATHS)
def test_every_bf16_but_signalling_nans_survives_a_round_trip(path):
    there = run("bf16_to_f32", ALL_16, path)
    back = run("f32_to_bf16", there, path)
    is_nan = (ALL_16 & 0x7FFF) > 0x7F80
    assert np.array_equal(back[~is_nan], ALL_16[~is_nan])
    assert np.array_equal(back[is_nan], (ALL_16[is_nan] & 0x8000) | 0x7FC0)


# ---------------------------------------------------------------------------
# Lengths, alignment, threads.

def mixed_source_bits(name, n, seed=0):
    """Random bit patterns salted with NaNs, infinities and subnormals."""
    rng = np.random.default_rng(seed)
    wide = CONVERSIONS[name][1] == np.uint32
    if wide:
        bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
        specials = bits32(0x7F800001, 0x7FC00000, 0xFF800000, 0x00000001, 0x33000000, 0x477FF000)
    else:
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
        specials = np.array([0x7C01, 0x7E00, 0xFC00, 0x0001, 0x7F81, 0x8001], np.uint16)
    salted = rng.random(n) < 0.2
    bits[salted] = rng.choice(specials, size=int(salted.sum()))
    return bits


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", list(CONVERSIONS))
def test_all_lengths_up_to_200_at_unaligned_starts_touch_only_their_slice(name, path):
    kernel, src_bits, src_dtype, out_bits, out_dtype, ref = CONVERSIONS[name]
    base = mixed_source_bits(name, 256 + 8, seed=1)
    sentinel = out_bits(0xA5A5A5A5 & np.iinfo(out_bits).max)
    checked = 0
    for offset in range(4):
        for n in range(201):
            src = base[offset: offset + n]
            out_buffer = np.full(256 + 8, sentinel, out_bits)
            out = out_buffer[offset + 1: offset + 1 + n]  # a different misalignment than src
            kernel(src.view(src_dtype), out.view(out_dtype), path=path, threads=1)
            assert_same_bits(name, src, out, ref(src))
            assert (out_buffer[: offset + 1] == sentinel).all()
            assert (out_buffer[offset + 1 + n:] == sentinel).all()
            checked += 1
    assert checked == 4 * 201


@pytest.fixture(scope="module")
def large_sources():
    """Per conversion: a source large enough to be split over threads and for the output
    to be written with non-temporal stores (8 MiB of halves), with an odd length so the
    last piece is ragged, and its reference result."""
    sources = {}
    for name in CONVERSIONS:
        src = mixed_source_bits(name, (4 << 20) + 13, seed=2)
        sources[name] = (src, CONVERSIONS[name][5](src))
    return sources


@pytest.mark.parametrize("threads", [1, 2, 3, 0])
@pytest.mark.parametrize("path", PATHS_AND_AUTO)
@pytest.mark.parametrize("name", list(CONVERSIONS))
def test_large_arrays_give_the_same_bits_on_any_thread_count(name, path, threads, large_sources):
    src, want = large_sources[name]
    assert_same_bits(name, src, run(name, src, path, threads), want)


@pytest.mark.parametrize("byte_offset", [0, 2, 4, 62, 1])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", list(CONVERSIONS))
def test_large_outputs_at_any_address_are_right_and_stay_in_bounds(name, path, byte_offset, large_sources):
    # Outputs this large are streamed from the first 64-byte boundary on; an output not
    # even aligned to its element (byte_offset 1, which NumPy allows) is never streamed.
    kernel, _, src_dtype, out_bits, out_dtype, _ = CONVERSIONS[name]
    src, want = large_sources[name]
    itemsize = np.dtype(out_bits).itemsize
    raw = np.full(len(src) * itemsize + 128, 0x5A, np.uint8)
    start = (-raw.ctypes.data) % 64 + byte_offset  # a known distance from a cache line
    out = raw[start: start + len(src) * itemsize].view(out_bits)
    kernel(src.view(src_dtype), out.view(out_dtype), path=path, threads=2)
    assert_same_bits(name, src, out, want)
    assert (raw[:start] == 0x5A).all() and (raw[start + len(src) * itemsize:] == 0x5A).all()


def test_concurrent_calls_from_python_threads_are_independent():
    sources = [mixed_source_bits("f32_to_f16", 1 << 20, seed=s) for s in range(4)]
    results = [None] * 4

    def work(i):
        results[i] = run("f32_to_f16", sources[i], threads=2)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for src, got in zip(sources, results):
        assert_same_bits("f32_to_f16", src, got, ref_f32_to_f16(src))


# ---------------------------------------------------------------------------
# Argument checks.

@pytest.mark.parametrize("name", list(CONVERSIONS))
@pytest.mark.parametrize("n_src,n_out", [(10, 9), (9, 10), (0, 1), (1, 0), (1 << 20, (1 << 20) - 1)])
def test_length_mismatch_raises_before_writing(name, n_src, n_out):
    kernel, src_bits, src_dtype, out_bits, out_dtype, _ = CONVERSIONS[name]
    src = np.ones(n_src, src_bits)
    out = np.full(n_out, 7, out_bits)
    with pytest.raises(ValueError, match="elements"):
        kernel(src.view(src_dtype), out.view(out_dtype))
    assert (out == 7).all()


@pytest.mark.parametrize("name", list(CONVERSIONS))
def test_empty_arrays_are_fine(name):
    kernel, _, src_dtype, _, out_dtype, _ = CONVERSIONS[name]
    assert kernel(np.empty(0, src_dtype), np.empty(0, out_dtype)) is None


def test_overlapping_source_and_destination_raise_value_error():
    buf = np.zeros(64, np.float32)
    with pytest.raises(ValueError, match="overlap"):
        _half.f32_to_f16(buf[:16], buf[8:16].view(np.uint16))
    with pytest.raises(ValueError, match="overlap"):
        _half.bf16_to_f32(buf[:4].view(np.uint16), buf[2:10])
    # Adjacent is not overlapping.
    _half.f32_to_f16(buf[:16], buf[16:24].view(np.uint16))
    assert (buf[16:24] == 0).all()


def test_wrong_dtypes_and_strides_are_rejected():
    with pytest.raises(ValueError):
        _half.f32_to_f16(np.ones(4, np.float64), np.empty(4, np.uint16))
    with pytest.raises(ValueError):  # float16 arrays go in as .view(np.uint16)
        _half.f32_to_f16(np.ones(4, np.float32), np.empty(4, np.float16))
    with pytest.raises(ValueError):
        _half.f16_to_f32(np.ones(8, np.uint16)[::2], np.empty(4, np.float32))


def test_read_only_sources_are_accepted_and_results_are_returned_in_place():
    src = np.array([1.0, -2.5, 65504.0], np.float32)
    src.flags.writeable = False
    out = np.empty(3, np.float16)
    assert _half.f32_to_f16(src, out.view(np.uint16)) is None
    assert out.tolist() == [1.0, -2.5, 65504.0]


# ---------------------------------------------------------------------------
# Properties.

@given(st.lists(st.integers(0, (1 << 32) - 1), max_size=100), st.sampled_from(PATHS))
def test_narrowing_any_float32_patterns_matches_references(values, path):
    src = np.array(values, dtype=np.uint32)
    check("f32_to_f16", src, path)
    check("f32_to_bf16", src, path)


@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True), max_size=100),
       st.sampled_from(PATHS))
def test_narrowing_any_float32_values_matches_references(values, path):
    src = np.array(values, dtype=np.float32).view(np.uint32)
    check("f32_to_f16", src, path)
    check("f32_to_bf16", src, path)


# ---------------------------------------------------------------------------
# All 2**32 float32 patterns (opt-in: APRFAST_EXHAUSTIVE=1).

def _exhaustive_chunk(task):
    """Worker: mismatches of every kernel against the references on one chunk."""
    name, start = task
    chunk = np.arange(CHUNK, dtype=np.uint32) + np.uint32(start)
    want = CONVERSIONS[name][5](chunk)
    bad = {}
    for path in _half.available_paths():
        got = run(name, chunk, path, threads=1)
        if not np.array_equal(got, want):
            i = np.flatnonzero(got != want)
            bad[path] = (len(i), [(hex(chunk[j]), hex(want[j]), hex(got[j])) for j in i[:4]])
    return bad


@pytest.mark.skipif(not EXHAUSTIVE, reason="set APRFAST_EXHAUSTIVE=1 (takes minutes)")
@pytest.mark.parametrize("name", NARROWING)
def test_narrowing_all_2_to_the_32_float32_patterns(name):
    tasks = [(name, start) for start in range(0, 1 << 32, CHUNK)]
    with ProcessPoolExecutor(max_workers=_half.default_threads()) as pool:
        failures = [bad for bad in pool.map(_exhaustive_chunk, tasks) if bad]
    assert len(tasks) == 256
    assert failures == []


# ---------------------------------------------------------------------------
# The C file on its own: warning-free, and bit-exact on other architectures
# (AArch64 NEON, big-endian s390x) where a cross compiler and qemu-user exist.

def test_kernels_compile_warning_free_with_the_host_compilers():
    if not (CSRC / "half.c").exists():
        pytest.skip("needs the source tree")
    compilers = [cc for cc in ("gcc", "clang") if shutil.which(cc)]
    if not compilers or sys.platform == "win32":
        pytest.skip("no gcc or clang")
    for cc in compilers:
        result = subprocess.run([cc, "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-fsyntax-only",
                                 f"-I{CSRC}", str(CSRC / "half.c")], capture_output=True, text=True)
        assert result.returncode == 0, f"{cc}: {result.stderr}"



THREAD_COUNT_DRIVER = r"""
#include "half.h"
#include "quant.h"
#include "parallel.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* Every thread the kernels start goes through here (-Wl,--wrap=pthread_create). */
static int created;
int __real_pthread_create(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*f)(void *), void *arg)
{
    created++;
    return __real_pthread_create(t, a, f, arg);
}

int main(void)
{
    size_t big = (size_t)1 << 22;
    uint16_t *h = calloc(big, 2);
    float *f = calloc(big, 4);
    uint8_t *q = calloc(apr_quant_nbytes(APR_QT_Q4_0, big), 1);
    int idle = apr_parallel_idle_cpus(64), online = apr_parallel_cpu_count(64);
    if (!h || !f || !q || idle < 1 || idle > online)
        return 1;
    /* Under the size thresholds, threads=0 and even threads=8 stay on the caller. */
    apr_f16_to_f32(-1, h, f, ((size_t)2 << 20) - 1, 0);
    apr_f16_to_f32(-1, h, f, 4096, 8);
    apr_dequantize(APR_QT_Q4_0, q, ((size_t)512 << 10) - 32, f, 0, -1);
    int small = created;
    /* Explicit thread counts above them are honoured (the shared counter hands out the work). */
    apr_f16_to_f32(-1, h, f, big, 2);
    int half_big = created - small;
    apr_dequantize(APR_QT_Q4_0, q, big, f, 2, -1);
    int quant_big = created - small - half_big;
    printf("%d %d %d %d %d\n", small, half_big, quant_big, idle, online);
    return 0;
}
"""


def test_small_work_starts_no_thread_and_idle_cores_are_counted(tmp_path):
    """threads=0 never starts a thread below the size thresholds (and never reads the
    load there); explicit counts above them are honoured; the idle-core count is in
    [1, online cores]."""
    if not (CSRC / "half.c").exists() or sys.platform != "linux" or not shutil.which("gcc"):
        pytest.skip("needs the source tree, Linux and gcc")
    driver = tmp_path / "threads.c"
    driver.write_text(THREAD_COUNT_DRIVER)
    exe = tmp_path / "threads"
    build = subprocess.run(["gcc", "-std=c99", "-D_GNU_SOURCE", "-O1", "-pthread", "-Wl,--wrap=pthread_create",
                            f"-I{CSRC}", str(driver), str(CSRC / "half.c"), str(CSRC / "quant.c"),
                            str(CSRC / "quant_ggml.c"), str(CSRC / "quantize_ggml.c"), "-lm",
                            "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run_it = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run_it.returncode == 0, run_it.stderr
    small, half_big, quant_big, idle, online = map(int, run_it.stdout.split())
    assert small == 0
    assert 1 <= idle <= online
    if online >= 2:
        assert half_big == 1 and quant_big == 1

CROSS_DRIVER = r"""
#include "half.h"
#include <stdio.h>
#include <stdlib.h>

/* Rounding toward zero, flush-to-zero, default NaN, alternative half format: the
 * kernels must not depend on any of it. */
static void hostile_fp_environment(void)
{
#if defined(__aarch64__)
    unsigned long long fpcr = (3ull << 22) | (1ull << 19) | (1ull << 24) | (1ull << 25) | (1ull << 26);
    __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr));
#endif
}

static void *read_all(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(*size + 64);
    if (fread(p, 1, *size, f) != *size)
        exit(2);
    fclose(f);
    return p;
}

typedef void (*narrow_fn)(int, const float *, uint16_t *, size_t, int);
typedef void (*widen_fn)(int, const uint16_t *, float *, size_t, int);

/* Once in chunks of 1..40 elements (every tail), once in one call. */
static void narrow(FILE *out, narrow_fn fn, int path, const float *src, size_t n)
{
    uint16_t *dst = malloc(n * 2);
    for (size_t i = 0, k = 1; i < n; i += k, k = k % 40 + 1)
        fn(path, src + i, dst + i, i + k <= n ? k : n - i, 1);
    fwrite(dst, 2, n, out);
    fn(path, src, dst, n, 3);
    fwrite(dst, 2, n, out);
    free(dst);
}

static void widen(FILE *out, widen_fn fn, int path, const uint16_t *src, size_t n)
{
    float *dst = malloc(n * 4);
    for (size_t i = 0, k = 1; i < n; i += k, k = k % 40 + 1)
        fn(path, src + i, dst + i, i + k <= n ? k : n - i, 1);
    fwrite(dst, 4, n, out);
    fn(path, src, dst, n, 3);
    fwrite(dst, 4, n, out);
    free(dst);
}

int main(int argc, char **argv)
{
    size_t size32, size16;
    if (argc != 4)
        return 2;
    const float *f32 = read_all(argv[1], &size32);
    const uint16_t *h16 = read_all(argv[2], &size16);
    FILE *out = fopen(argv[3], "wb");
    hostile_fp_environment();
    for (int path = 0; path < APR_HALF_PATH_COUNT; path++) {
        if (!apr_half_path_available(path))
            continue;
        printf("%s\n", apr_half_path_name(path));
        narrow(out, apr_f32_to_f16, path, f32, size32 / 4);
        narrow(out, apr_f32_to_bf16, path, f32, size32 / 4);
        widen(out, apr_f16_to_f32, path, h16, size16 / 2);
        widen(out, apr_bf16_to_f32, path, h16, size16 / 2);
    }
    return fclose(out) != 0;
}
"""

CROSS_TARGETS = [
    # (compiler, emulator, byte order, kernels expected besides portable)
    ("aarch64-linux-gnu-gcc", "qemu-aarch64", "<", ["neon"]),
    ("s390x-linux-gnu-gcc", "qemu-s390x", ">", []),
]


@pytest.mark.parametrize("compiler,emulator,order,expected", CROSS_TARGETS)
def test_kernels_on_other_architectures_match_the_references(compiler, emulator, order, expected, tmp_path):
    if not (CSRC / "half.c").exists() or not (shutil.which(compiler) and shutil.which(emulator)):
        pytest.skip(f"needs {compiler} and {emulator}")
    driver = tmp_path / "driver.c"
    driver.write_text(CROSS_DRIVER)
    exe = tmp_path / "driver"
    build = subprocess.run([compiler, "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-static", "-pthread",
                            f"-I{CSRC}", str(driver), str(CSRC / "half.c"), "-o", str(exe)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr

    # Every top-16-bit pattern with a few rounding-relevant low halves, and all halves.
    lows = np.array([0, 1, 0x0FFF, 0x1000, 0x1001, 0x3000, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    f32 = ((np.arange(1 << 16, dtype=np.uint32) << np.uint32(16))[:, None] | lows[None, :]).ravel()
    (tmp_path / "f32.bin").write_bytes(f32.astype(order + "u4").tobytes())
    (tmp_path / "u16.bin").write_bytes(ALL_16.astype(order + "u2").tobytes())
    run_it = subprocess.run([emulator, str(exe), str(tmp_path / "f32.bin"), str(tmp_path / "u16.bin"),
                             str(tmp_path / "out.bin")], capture_output=True, text=True, timeout=300)
    assert run_it.returncode == 0, run_it.stderr
    paths = run_it.stdout.split()
    assert paths == ["portable"] + expected

    results = np.frombuffer((tmp_path / "out.bin").read_bytes(), np.uint8)
    pos = 0
    for path in paths:
        for name, src in (("f32_to_f16", f32), ("f32_to_bf16", f32), ("f16_to_f32", ALL_16),
                          ("bf16_to_f32", ALL_16)):
            out_bits = CONVERSIONS[name][3]
            want = CONVERSIONS[name][5](src)
            for how in ("chunks of 1..40", "one call"):
                size = len(src) * np.dtype(out_bits).itemsize
                got = results[pos: pos + size].view(np.dtype(out_bits).newbyteorder(order)).astype(out_bits)
                pos += size
                assert_same_bits(f"{name} on {path} ({how}, {emulator})", src, got, want)
    assert pos == len(results)
