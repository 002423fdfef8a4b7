"""The two engines of direct reads (csrc/pio.c apr_pread_direct_engine): io_uring
(csrc/uring.c) and the threaded preads, each forced, and the fallback from the first to
the second where no ring can be set up (the "io_uring" fallback forced, as under a
seccomp filter or with kernel.io_uring_disabled).

Each engine gives the same bytes and the same running CRC for unaligned offsets,
lengths and buffers, small chunks (many reads in flight, short reads at the end of the
file), files being appended to, files shorter than asked (EOFError, CorruptError
through the loaders) and tmpfs; ``APRFAST_DIRECT_ENGINE`` picks the engine of
``backend="direct"``.
"""

from __future__ import annotations

import os
import threading
import zlib

import numpy as np
import pytest
from test_direct_io import _cached, _evict

import aprfast
from aprfast import _memory
from aprfast._pure import _memory as pure_memory
from aprfast.errors import CorruptError
from aprfast.io import direct, platform

ALIGN = direct.ALIGN
URING = _memory.uring_available()
ENGINES = ("io_uring", "threads")


@pytest.fixture
def blob(tmp_path):
    data = np.random.default_rng(7).integers(0, 256, (3 << 20) + 1234, dtype=np.uint8)  # ends inside a block
    path = tmp_path / "blob"
    data.tofile(path)
    fd = _open_direct(path)
    try:
        yield fd, data, path
    finally:
        os.close(fd)


def _open_direct(path):
    """A direct descriptor of ``path`` (the test skips where the filesystem refuses)."""
    plain = os.open(path, os.O_RDONLY)
    try:
        fd, how = direct.open_direct(plain, str(path))
    finally:
        os.close(plain)  # the direct descriptor is a second open of the file
    if fd is None:
        pytest.skip(f"direct I/O {how}")
    return fd


def _dst(n, shift, whole=None):
    if whole is None:
        whole = np.frombuffer(_memory.AlignedBuffer(n + 2 * ALIGN, ALIGN), np.uint8)
    return whole[shift:shift + n]


def _expected_engine(engine, at, n, shift):
    """The engine that must run: io_uring only where a ring exists and whole blocks of
    the range land aligned in the buffer."""
    whole_block = -(-at // ALIGN) * ALIGN < (at + n) // ALIGN * ALIGN
    congruent = shift % ALIGN == at % ALIGN
    return "io_uring" if engine == "io_uring" and URING and whole_block and congruent else "threads"


@pytest.fixture
def no_uring():
    previous = platform.force(["io_uring"])
    yield
    platform.force(previous)


# --- the primitive ----------------------------------------------------------------------
@pytest.mark.parametrize("engine", ENGINES)
def test_each_engine_reads_any_range_with_the_crc_of_zlib(blob, engine):
    fd, data, _ = blob
    rng = np.random.default_rng(3)
    cases = [(0, data.size, 0), (data.size - 5000, 5000, (data.size - 5000) % ALIGN), (4095, 4097, 4095),
             (ALIGN, 2 << 20, 0), (1, ALIGN, 1), (10, 3 * ALIGN, 10), (0, data.size, 5)]
    for _ in range(30):
        n = int(rng.integers(1, 3 << 20)) if rng.random() < 0.6 else int(rng.integers(1, 20000))
        at = int(rng.integers(0, data.size - n + 1))
        cases.append((at, n, at % ALIGN))  # congruent: io_uring runs
        cases.append((at, n, int(rng.integers(0, ALIGN))))
    for at, n, shift in cases:
        whole = np.frombuffer(_memory.AlignedBuffer(n + 2 * ALIGN, ALIGN), np.uint8)
        whole[:] = 0x5A  # the bytes around the range must stay so: no read lands outside it
        dst = _dst(n, shift, whole)
        depth = int(rng.choice([0, 1, 2, 3, 32]))
        chunk = int(rng.choice([0, ALIGN, 64 << 10, 1 << 20]))  # small chunks: many reads in flight
        crc = _memory.pread_direct(fd, at, dst, int(rng.integers(0, 4)), 11, ALIGN, engine, depth, chunk)
        assert _memory.direct_engine_last() == _expected_engine(engine, at, n, shift), (at, n, shift)
        np.testing.assert_array_equal(dst, data[at:at + n])
        assert not np.any(whole[:shift] != 0x5A) and not np.any(whole[shift + n:] != 0x5A), (at, n, shift)
        assert crc == zlib.crc32(data[at:at + n], 11)
        assert _memory.pread_direct(fd, at, dst, 0, None, ALIGN, engine, depth, chunk) is None


def test_the_engines_and_the_pure_twin_agree_on_bytes_and_crc(blob):
    fd, data, _ = blob
    at, n = 4096 * 3 + 17, data.size - 4096 * 3 - 17 - 99
    got = {}
    for name, call in (("io_uring", lambda d: _memory.pread_direct(fd, at, d, 0, 0, ALIGN, "io_uring", 4, 64 << 10)),
                       ("threads", lambda d: _memory.pread_direct(fd, at, d, 3, 0, ALIGN, "threads")),
                       ("auto", lambda d: _memory.pread_direct(fd, at, d, 0, 0)),
                       ("pure", lambda d: pure_memory.pread_direct(fd, at, d, 0, 0))):
        dst = _dst(n, at % ALIGN)
        got[name] = (call(dst), dst.tobytes())
    assert len(set(got.values())) == 1
    assert got["threads"][0] == zlib.crc32(data[at:at + n])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("chunk", [0, ALIGN])
def test_a_file_shorter_than_asked_is_eof_for_each_engine(blob, engine, chunk):
    fd, data, _ = blob
    size = data.size
    tail_block = size // ALIGN * ALIGN
    for at, n in ((tail_block - 2 * ALIGN, 2 * ALIGN + size % ALIGN + 1),  # one byte past the end
                  (ALIGN, size),  # many blocks past it
                  (0, size + 3 * ALIGN)):
        dst = _dst(n, at % ALIGN)
        with pytest.raises(EOFError):
            _memory.pread_direct(fd, at, dst, 0, 0, ALIGN, engine, 0, chunk)
        assert _memory.direct_engine_last() == _expected_engine(engine, at, n, at % ALIGN)
    with pytest.raises(EOFError):  # at the very end: nothing at all to read
        _memory.pread_direct(fd, tail_block + ALIGN, _dst(ALIGN, 0), 0, None, ALIGN, engine)


def test_no_ring_falls_back_to_the_threads_without_a_word(blob, no_uring):
    fd, data, _ = blob
    assert not _memory.uring_available()
    assert not platform.uses("io_uring")
    for engine in ("io_uring", "auto"):
        dst = _dst(data.size, 0)
        crc = _memory.pread_direct(fd, 0, dst, 0, 0, ALIGN, engine, 0, 64 << 10)
        assert _memory.direct_engine_last() == "threads"
        np.testing.assert_array_equal(dst, data)
        assert crc == zlib.crc32(data)


@pytest.mark.skipif(not URING, reason="no io_uring ring can be set up here")
def test_auto_takes_io_uring_for_large_reads_and_the_threads_for_small_ones(tmp_path):
    data = np.random.default_rng(5).integers(0, 256, 9 << 20, dtype=np.uint8)
    path = tmp_path / "big"
    data.tofile(path)
    fd = _open_direct(path)
    try:
        dst = _dst(data.size, 0)
        _memory.pread_direct(fd, 0, dst)
        assert _memory.direct_engine_last() == "io_uring"
        np.testing.assert_array_equal(dst, data)
        _memory.pread_direct(fd, 0, dst[:1 << 20])
        assert _memory.direct_engine_last() == "threads"
    finally:
        os.close(fd)


def test_engine_names_are_checked(blob):
    fd, _, _ = blob
    for impl in (_memory, pure_memory):
        with pytest.raises(ValueError, match="no engine 'spdk'"):
            impl.pread_direct(fd, 0, np.zeros(10, np.uint8), engine="spdk")
    assert _memory.DIRECT_ENGINES == pure_memory.DIRECT_ENGINES
    assert direct.ENGINES == (*_memory.DIRECT_ENGINES, "buffered")
    assert pure_memory.uring_available() is False and pure_memory.direct_engine_last() == "threads"


@pytest.mark.parametrize("engine", ENGINES)
def test_a_file_being_appended_to_reads_what_was_there(tmp_path, engine):
    data = np.random.default_rng(9).integers(0, 256, (2 << 20) + 333, dtype=np.uint8)
    path = tmp_path / "growing"
    data.tofile(path)
    fd = _open_direct(path)
    stop = threading.Event()

    def append():
        with open(path, "ab", buffering=0) as f:
            while not stop.is_set():
                f.write(b"\xa5" * 12345)

    writer = threading.Thread(target=append)
    writer.start()
    try:
        for i in range(20):
            at = (i * 4099) % (1 << 20)
            n = data.size - at
            dst = _dst(n, at % ALIGN)
            crc = _memory.pread_direct(fd, at, dst, 2, 0, ALIGN, engine, 4, 64 << 10)
            np.testing.assert_array_equal(dst, data[at:])
            assert crc == zlib.crc32(data[at:])
    finally:
        stop.set()
        writer.join()
        os.close(fd)


# --- through the loaders ----------------------------------------------------------------
def _model():
    rng = np.random.default_rng(0)
    out = {f"t.{i:02d}": rng.standard_normal((int(rng.integers(1, 300)), 37), dtype=np.float32) for i in range(6)}
    out["big"] = rng.standard_normal((2500, 1100), dtype=np.float32)  # ~10.5 MiB: io_uring under "auto"
    out["bytes"] = rng.integers(0, 256, 4099, dtype=np.uint8)  # ends the file off a block boundary
    return out


def _same(got, want):
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)


@pytest.mark.parametrize("engine", ["auto", *ENGINES])
def test_the_environment_variable_picks_the_engine_of_backend_direct(tmp_path, monkeypatch, engine):
    want = _model()
    path = tmp_path / "m.apr"
    aprfast.save_file(want, path)
    monkeypatch.setenv(direct.ENGINE_ENV, engine)
    _same(aprfast.load_file(path, backend="direct"), want)
    with aprfast.open(path, backend="direct") as f:
        assert f._source._direct.engine == engine
        _same(f.load_all(), want)
        f.verify()
        np.testing.assert_array_equal(f.get_slice("big")[7:900:3, 5:], want["big"][7:900:3, 5:])


def test_an_unknown_engine_in_the_environment_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "m.apr"
    aprfast.save_file({"a": np.arange(10)}, path)
    monkeypatch.setenv(direct.ENGINE_ENV, "spdk")
    with pytest.raises(ValueError, match="APRFAST_DIRECT_ENGINE"):
        aprfast.load_file(path, backend="direct")


@pytest.mark.parametrize("engine", ENGINES)
def test_loads_without_a_ring_and_with_o_direct_refused_give_the_tensors(tmp_path, monkeypatch, engine):
    want = _model()
    path = tmp_path / "m.apr"
    aprfast.save_file(want, path)
    monkeypatch.setenv(direct.ENGINE_ENV, engine)
    for forced in (["io_uring"], ["o_direct"], ["io_uring", "o_direct"]):
        previous = platform.force(forced)
        try:
            _same(aprfast.load_file(path, backend="direct"), want)
        finally:
            platform.force(previous)


# --- the "buffered" engine and fresh destinations ------------------------------------------
def _saved(tmp_path, monkeypatch, want, engine):
    """``want`` saved to a fresh file, its direct reads forced onto ``engine``: the path."""
    path = tmp_path / "m.apr"
    aprfast.save_file(want, path)
    monkeypatch.setenv(direct.ENGINE_ENV, engine)
    return path


def test_the_buffered_engine_reads_through_the_cache_and_leaves_nothing_there(tmp_path, monkeypatch):
    want = _model()
    path = _saved(tmp_path, monkeypatch, want, "buffered")
    _evict(path)
    _same(aprfast.load_file(path, backend="direct"), want)
    with aprfast.open(path, backend="direct") as f:
        f.verify()
    left = _cached(path)
    if left is None:
        pytest.skip("no mincore here")
    assert left <= 0.05


def _large_model():
    """About 72 MiB in tensors of uneven sizes: a fresh destination (above the freed-buffer
    cache's 32 MiB mapping threshold) of 36 populate steps, which the io_uring engine
    populates with a helper thread (csrc/uring.c, sharer)."""
    rng = np.random.default_rng(3)
    out = {f"w.{i}": rng.standard_normal(int(rng.integers(1, 3 << 20)), dtype=np.float32) for i in range(12)}
    out["tail"] = rng.integers(0, 256, 4097, dtype=np.uint8)
    return out


@pytest.mark.parametrize("engine", ENGINES)
def test_a_large_fresh_destination_populated_by_two_threads_gives_the_tensors(tmp_path, monkeypatch, engine):
    want = _large_model()
    path = _saved(tmp_path, monkeypatch, want, engine)
    for _ in range(3):
        _memory.release_buffer_cache()  # a fresh block each time, not a cached one
        _evict(path)
        _same(aprfast.load_file(path, backend="direct"), want)


@pytest.mark.parametrize("engine", ["buffered", "io_uring"])
def test_a_fresh_destination_read_in_windows_gives_the_tensors(tmp_path, monkeypatch, engine):
    """The buffered engine reads a fresh block window by window: each read claims only
    part of it (csrc/buffers.c apr_fresh_claim leaves the rest registered for the next).
    Forced buffered reads (o_direct refused) go the same way."""
    want = _large_model()
    path = _saved(tmp_path, monkeypatch, want, engine)
    monkeypatch.setattr(direct, "WINDOW", 8 << 20)
    for forced in ([], ["o_direct"]):
        previous = platform.force(forced)
        try:
            for _ in range(2):
                _memory.release_buffer_cache()
                _same(aprfast.load_file(path, backend="direct"), want)
            with aprfast.open(path, backend="direct") as f:
                os.truncate(path, 40 << 20)
                _memory.release_buffer_cache()
                with pytest.raises(CorruptError):
                    f.load_all()
            aprfast.save_file(want, path)
        finally:
            platform.force(previous)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_large_file_cut_short_while_open_stops_the_populating_helper(tmp_path, monkeypatch, engine):
    want = _large_model()
    path = _saved(tmp_path, monkeypatch, want, engine)
    for cut in (8 << 20, 40 << 20):
        with aprfast.open(path, backend="direct") as f:
            os.truncate(path, cut)
            _memory.release_buffer_cache()
            with pytest.raises(CorruptError):
                f.load_all()
        aprfast.save_file(want, path)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_file_that_shrinks_while_open_is_corrupt_for_each_engine(tmp_path, monkeypatch, engine):
    want = {"w": np.arange(3 << 20, dtype=np.float32)}  # 12 MiB: io_uring reads it
    path = tmp_path / "m.apr"
    aprfast.save_file(want, path)
    monkeypatch.setenv(direct.ENGINE_ENV, engine)
    with aprfast.open(path, backend="direct") as f:
        os.truncate(path, 5 << 20)
        with pytest.raises(CorruptError):
            f.load_all()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no tmpfs at /dev/shm")
def test_each_engine_on_tmpfs(monkeypatch, engine):
    """tmpfs refused O_DIRECT before Linux 6.6 (the buffered fallback reads) and accepts
    it since (the engine reads): the tensors either way."""
    want = _model()
    path = os.path.join("/dev/shm", f"aprfast-engine-{os.getpid()}.apr")
    monkeypatch.setenv(direct.ENGINE_ENV, engine)
    try:
        aprfast.save_file(want, path)
        _same(aprfast.load_file(path, backend="direct"), want)
    finally:
        if os.path.exists(path):
            os.unlink(path)


# --- staging through huge-page buffers (csrc/uring.c) ------------------------------------
def _staging_set(mode):
    before = _memory.set_direct_staging(mode)
    yield mode
    _memory.set_direct_staging(before)


@pytest.fixture(params=["always", "never", "ring"])
def staging(request):
    yield from _staging_set(request.param)


@pytest.mark.skipif(not URING, reason="no io_uring ring can be set up here")
def test_staged_reads_give_the_bytes_and_crc_of_direct_ones(blob, staging):
    fd, data, _ = blob
    rng = np.random.default_rng(11)
    cases = [(0, data.size, 0, 0), (4095, 3 * ALIGN + 1, 4095, ALIGN), (ALIGN, 2 << 20, 0, 64 << 10)]
    for _ in range(25):
        n = int(rng.integers(ALIGN, data.size - ALIGN))
        at = int(rng.integers(0, data.size - n + 1))
        cases.append((at, n, at % ALIGN, int(rng.choice([0, ALIGN, 64 << 10, 1 << 20]))))
    for at, n, shift, chunk in cases:
        whole = np.frombuffer(_memory.AlignedBuffer(n + 2 * ALIGN, ALIGN), np.uint8)
        whole[:] = 0x5A
        dst = _dst(n, shift, whole)
        depth = int(rng.choice([0, 1, 3, 40]))
        crc = _memory.pread_direct(fd, at, dst, 0, 5, ALIGN, "io_uring", depth, chunk)
        assert _memory.direct_engine_last() == "io_uring"
        np.testing.assert_array_equal(dst, data[at:at + n])
        assert not np.any(whole[:shift] != 0x5A) and not np.any(whole[shift + n:] != 0x5A), (at, n, shift)
        assert crc == zlib.crc32(data[at:at + n], 5)
        whole_pieces = -(-at // ALIGN) * ALIGN < (at + n) // ALIGN * ALIGN
        assert (_memory.direct_staged_last() > 0) == (staging in ("always", "ring") and whole_pieces), (at, n, chunk)


@pytest.mark.skipif(not URING, reason="no io_uring ring can be set up here")
def test_a_chunk_larger_than_the_staging_buffers_is_read_straight_into_place(blob, staging):
    fd, data, _ = blob
    dst = _dst(data.size, 0)
    assert _memory.pread_direct(fd, 0, dst, 0, 0, ALIGN, "io_uring", 2, 128 << 20) == zlib.crc32(data)
    assert _memory.direct_staged_last() == 0
    np.testing.assert_array_equal(dst, data)


@pytest.mark.skipif(not URING, reason="no io_uring ring can be set up here")
@pytest.mark.parametrize("chunk", [0, ALIGN])
def test_a_file_shorter_than_asked_is_eof_with_staging(blob, staging, chunk):
    fd, data, _ = blob
    for at, n in ((ALIGN, data.size), (0, data.size + 3 * ALIGN)):
        with pytest.raises(EOFError):
            _memory.pread_direct(fd, at, _dst(n, at % ALIGN), 0, 0, ALIGN, "io_uring", 0, chunk)
    # the buffers were given back: the next read stages again
    dst = _dst(data.size, 0)
    _memory.pread_direct(fd, 0, dst, 0, None, ALIGN, "io_uring")
    np.testing.assert_array_equal(dst, data)
    assert (_memory.direct_staged_last() > 0) == (staging in ("always", "ring"))


@pytest.mark.skipif(not URING, reason="no io_uring ring can be set up here")
def test_threads_reading_at_once_share_the_staging_buffers_without_a_mixup(blob):
    # one read holds the buffers at a time; the others read straight into their pages
    fd, data, _ = blob
    before = _memory.set_direct_staging("always")
    errors, staged = [], []

    def reader(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(12):
                n = int(rng.integers(1 << 20, data.size))
                at = int(rng.integers(0, data.size - n + 1)) // ALIGN * ALIGN
                dst = _dst(n, 0)
                crc = _memory.pread_direct(fd, at, dst, 0, 0, ALIGN, "io_uring", 0, 64 << 10)
                staged.append(_memory.direct_staged_last())
                if crc != zlib.crc32(data[at:at + n]) or not np.array_equal(dst, data[at:at + n]):
                    errors.append((seed, at, n))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        _memory.set_direct_staging(before)
    assert not errors
    assert any(staged)


@pytest.fixture(params=["always", "never", "auto", "ring"])
def any_staging(request):
    yield from _staging_set(request.param)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_large_fresh_destination_staged_gives_the_tensors(tmp_path, monkeypatch, engine, any_staging):
    # "auto": each piece staged or not by the page size its steps got, whichever of the
    # two populating threads (csrc/uring.c) got to them
    want = _large_model()
    path = _saved(tmp_path, monkeypatch, want, engine)
    for _ in range(2):
        _memory.release_buffer_cache()
        _evict(path)
        _same(aprfast.load_file(path, backend="direct"), want)
    _same(aprfast.load_file(path, backend="direct"), want)  # a cached block this time
    with aprfast.open(path, backend="direct") as f:
        os.truncate(path, 40 << 20)
        _memory.release_buffer_cache()
        with pytest.raises(CorruptError):
            f.load_all()


@pytest.mark.skipif(not URING, reason="no io_uring ring can be set up here")
def test_the_small_ring_stages_every_piece_through_a_few_buffers(blob):
    # "ring": every whole-block piece through 8 MiB of buffers, 2 MiB reads by default
    # (csrc/uring.c RING_BYTES); the bytes and the CRC are those of the file
    fd, data, _ = blob
    before = _memory.set_direct_staging("ring")
    try:
        assert _memory.direct_stages_every_piece(fd)
        dst = _dst(data.size, 0)
        assert _memory.pread_direct(fd, 0, dst, 0, 7, ALIGN, "io_uring") == zlib.crc32(data, 7)
        np.testing.assert_array_equal(dst, data)
        whole_blocks = data.size // ALIGN * ALIGN  # the partial last block goes through a bounce block
        assert _memory.direct_staged_last() == -(-whole_blocks // (2 << 20))
        # an explicit chunk of more than half the ring is read as the other modes read it
        dst = _dst(data.size, 0)
        assert _memory.pread_direct(fd, 0, dst, 0, 0, ALIGN, "io_uring", 0, 8 << 20) == zlib.crc32(data)
        np.testing.assert_array_equal(dst, data)
        assert _memory.direct_staged_last() == 0
    finally:
        _memory.set_direct_staging(before)


@pytest.mark.skipif(not URING or not os.path.isdir("/dev/shm"), reason="needs io_uring and a tmpfs at /dev/shm")
def test_only_a_virtio_disk_or_the_ring_mode_stages_every_piece():
    # "auto" asks the disk under the file (sysfs): a file on tmpfs has none
    before = _memory.set_direct_staging("auto")
    path = f"/dev/shm/aprfast-ring-probe-{os.getpid()}"
    try:
        with open(path, "wb") as f:
            assert _memory.direct_stages_every_piece(f.fileno()) is False
            for mode, want in (("ring", True), ("always", False), ("never", False)):
                _memory.set_direct_staging(mode)
                assert _memory.direct_stages_every_piece(f.fileno()) is want
        assert pure_memory.direct_stages_every_piece(0) is False
    finally:
        _memory.set_direct_staging(before)
        os.unlink(path)


@pytest.mark.parametrize("module", [_memory, pure_memory], ids=["compiled", "pure"])
def test_staging_modes_are_checked(module):
    before = module.set_direct_staging("never")
    try:
        assert module.set_direct_staging("auto") == "never"
        with pytest.raises(ValueError):
            module.set_direct_staging("sometimes")
        assert module.set_direct_staging(before) == "auto"
    finally:
        module.set_direct_staging(before)
    assert pure_memory.direct_staged_last() == 0
