"""aprfast.crc32 is zlib.crc32, on every kernel this CPU runs, for every length and alignment."""

import array
import threading
import zlib

import numpy as np
import pytest

import aprfast
from aprfast import _crc

PATHS = _crc.available_paths()
PATHS_AND_AUTO = PATHS + ["auto", None]

KNOWN = [
    (b"", 0x00000000),
    (b"\x00", 0xD202EF8D),
    (b"\xff", 0xFF000000),
    (b"a", 0xE8B7BE43),
    (b"abc", 0x352441C2),
    (b"123456789", 0xCBF43926),
    (b"The quick brown fox jumps over the lazy dog", 0x414FA339),
    (bytes(32), 0x190A55AD),
]


def test_check_value_of_crc32_ieee():
    assert aprfast.crc32(b"123456789") == 0xCBF43926


@pytest.mark.parametrize("path", PATHS_AND_AUTO)
@pytest.mark.parametrize("data,want", KNOWN)
def test_known_vectors(path, data, want):
    assert zlib.crc32(data) == want  # the table itself is right
    assert aprfast.crc32(data, path=path) == want


def test_portable_path_is_always_available_and_can_be_forced():
    assert "portable" in PATHS
    assert aprfast.crc32(b"123456789", path="portable") == 0xCBF43926
    assert _crc.best_path() in {"portable", "pclmul", "vpclmul-avx512", "armv8-crc"}


@pytest.mark.parametrize("path", ["nonexistent", "PORTABLE", "", "sse42"])
def test_unknown_path_name_raises_value_error(path):
    with pytest.raises(ValueError):
        aprfast.crc32(b"abc", path=path)


def test_a_path_this_cpu_cannot_run_raises_value_error():
    runnable = {_crc.PATHS[name] for name in PATHS}
    missing = [name for name, pid in _crc.PATHS.items() if pid >= 0 and pid not in runnable]
    if not missing:
        pytest.skip("this CPU runs every kernel")
    for path in missing:
        with pytest.raises(ValueError):
            aprfast.crc32(b"abc", path=path)


@pytest.fixture(scope="module")
def aligned_random():
    """8 KiB of random bytes starting on a 4096-byte boundary, so view[o:] starts at o mod 64."""
    buf = aprfast.aligned_empty(8192, 4096)
    buf[:] = np.random.default_rng(2024).integers(0, 256, 8192, dtype=np.uint8)
    return buf


@pytest.fixture(scope="module")
def zlib_table(aligned_random):
    """zlib.crc32 of buf[o:o+n] for every start o in 0..63 and length n in 0..4096."""
    data = aligned_random.tobytes()
    table = []
    for o in range(64):
        row = [0] * 4097
        crc = 0
        for n in range(1, 4097):
            crc = zlib.crc32(data[o + n - 1:o + n], crc)
            row[n] = crc
        table.append(row)
    assert table[5][4096] == zlib.crc32(data[5:5 + 4096])
    return table


@pytest.mark.parametrize("path", PATHS_AND_AUTO)
def test_every_length_at_every_start_offset_matches_zlib(path, aligned_random, zlib_table):
    view = memoryview(aligned_random)
    crc = aprfast.crc32
    for o in range(64):
        got = [crc(view[o:o + n], path=path) for n in range(4097)]
        if got != zlib_table[o]:
            n = next(n for n in range(4097) if got[n] != zlib_table[o][n])
            pytest.fail(f"path {path}: crc32 of {n} bytes at offset {o} is {got[n]:#010x}, "
                        f"zlib says {zlib_table[o][n]:#010x}")


@pytest.mark.parametrize("path", PATHS_AND_AUTO)
def test_every_length_continuing_from_a_nonzero_crc_matches_zlib(path, aligned_random):
    data = aligned_random.tobytes()
    view = memoryview(aligned_random)
    seeds = np.random.default_rng(1).integers(0, 2**32, 4097, dtype=np.uint64).tolist()
    o = 13
    got = [aprfast.crc32(view[o:o + n], seeds[n], path=path) for n in range(4097)]
    want = [zlib.crc32(data[o:o + n], seeds[n]) for n in range(4097)]
    assert got == want


@pytest.fixture(scope="module")
def big_buffer():
    return np.random.default_rng(77).bytes(50_000_003)


@pytest.fixture(scope="module")
def big_crcs(big_buffer):
    return {"whole": zlib.crc32(big_buffer), "from3": zlib.crc32(memoryview(big_buffer)[3:])}


@pytest.mark.parametrize("threads", [0, 1, 2, 3])
@pytest.mark.parametrize("path", PATHS)
def test_large_random_buffers_match_zlib_with_any_thread_count(big_buffer, big_crcs, path, threads):
    assert aprfast.crc32(big_buffer, path=path, threads=threads) == big_crcs["whole"]
    assert aprfast.crc32(memoryview(big_buffer)[3:], path=path, threads=threads) == big_crcs["from3"]


@pytest.mark.parametrize("threads", [2, 3, 7])
def test_threaded_crc_continues_from_a_given_value(big_buffer, threads):
    head = zlib.crc32(b"header bytes")
    assert aprfast.crc32(big_buffer, head, threads=threads) == zlib.crc32(big_buffer, head)


def test_crc_is_the_same_when_called_from_many_threads(big_buffer, big_crcs):
    results = []

    def work():
        results.append(aprfast.crc32(big_buffer, threads=2))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [big_crcs["whole"]] * 4


@pytest.mark.parametrize("path", PATHS)
def test_incremental_chaining_equals_one_pass(path):
    data = np.random.default_rng(9).bytes(200_001)
    cuts = [0, 1, 2, 63, 64, 65, 1000, 4096, 65_537, 150_000, 200_001]
    crc = 0
    for a, b in zip(cuts, cuts[1:]):
        crc = aprfast.crc32(data[a:b], crc, path=path)
    assert crc == zlib.crc32(data) == aprfast.crc32(data, path=path)


def test_crc32_combine_joins_two_crcs():
    rng = np.random.default_rng(4)
    for la, lb in [(0, 0), (0, 5), (5, 0), (1, 1), (100, 3), (3, 100), (4096, 12345), (1 << 20, 7)]:
        a, b = rng.bytes(la), rng.bytes(lb)
        assert aprfast.crc32_combine(zlib.crc32(a), zlib.crc32(b), lb) == zlib.crc32(a + b), (la, lb)


def test_crc32_combine_of_long_zero_runs_and_associativity():
    c1 = zlib.crc32(b"start")
    for n in (1, 1000, 1 << 20, 5_000_001):
        zeros = bytes(n)
        assert aprfast.crc32_combine(c1, zlib.crc32(zeros), n) == zlib.crc32(zeros, c1)
    # Lengths far beyond what can be checksummed here: combining must still associate.
    a, b, c = zlib.crc32(b"a"), 0x12345678, 0x9ABCDEF0
    lb, lc = 1 << 40, (1 << 50) + 3
    left = aprfast.crc32_combine(aprfast.crc32_combine(a, b, lb), c, lc)
    right = aprfast.crc32_combine(a, aprfast.crc32_combine(b, c, lc), lb + lc)
    assert left == right


def test_buffers_of_many_types():
    raw = np.random.default_rng(3).bytes(4096 + 12)
    want = zlib.crc32(raw)
    floats = np.frombuffer(raw, np.float32)
    for value in (raw, bytearray(raw), memoryview(raw), floats, floats.reshape(13, -1),
                  np.frombuffer(raw, np.uint8), np.frombuffer(raw, np.int8), np.frombuffer(raw, "S1"),
                  memoryview(raw).cast("I"), memoryview(raw).cast("B", (2, len(raw) // 2)),
                  array.array("B", raw)):
        assert aprfast.crc32(value) == want, type(value)
        assert aprfast.crc32(value, 0xDEADBEEF) == zlib.crc32(raw, 0xDEADBEEF), type(value)
    assert aprfast.crc32(aprfast.aligned_empty(0)) == 0
    assert aprfast.crc32(b"", 0x1234) == 0x1234


def test_zero_dimensional_and_bool_arrays():
    for value in (np.array(1.5, np.float64), np.array([True, False, True]), np.zeros(0, np.float32)):
        assert aprfast.crc32(value) == zlib.crc32(value) == zlib.crc32(value.tobytes())


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (2, 0, 4)])
def test_empty_multidimensional_arrays_have_the_crc_of_no_bytes(shape):
    # C-contiguous buffers with no bytes: zlib says 0 (or the value passed in).
    value = np.zeros(shape, np.float32)
    assert zlib.crc32(value) == 0
    assert aprfast.crc32(value) == 0
    assert aprfast.crc32(value, 0xCAFE) == 0xCAFE


@pytest.mark.parametrize("make", [
    lambda: np.arange(100, dtype=np.float32)[::2],
    lambda: np.arange(100, dtype=np.uint8).reshape(10, 10).T,
    lambda: memoryview(bytes(100))[::3],
])
def test_non_contiguous_buffers_raise_value_error(make):
    with pytest.raises(ValueError):
        aprfast.crc32(make())


def test_objects_without_a_buffer_raise_type_error():
    with pytest.raises(TypeError):
        aprfast.crc32("text")
    with pytest.raises(TypeError):
        aprfast.crc32(12345)
