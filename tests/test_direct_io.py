"""backend="direct": reads and saves that leave the page cache as they found it
(aprfast.io.direct, csrc/pio.c apr_pread_direct), and the choice backend="auto" makes.

Covers unaligned files and buffers, the fallback where direct I/O is refused (forced,
as on a filesystem that refuses O_DIRECT, and refused at the first read), files being
written, CRC mismatches, page-cache residency after a direct load and a direct save,
and the validation of ``backend=``.
"""

from __future__ import annotations

import errno
import os
import signal
import zlib

import numpy as np
import pytest

try:
    import resource
except ImportError:  # Windows
    resource = None

import aprfast
import aprfast.numpy as apr_numpy
from aprfast import _memory
from aprfast._pure import _memory as pure_memory
from aprfast.errors import ChecksumError, CorruptError
from aprfast.files.frameworks import UsageError
from aprfast.io import direct, platform
from aprfast.io.sources import open_source

ALIGN = direct.ALIGN


def _model(seed=0, count=7, odd=True):
    rng = np.random.default_rng(seed)
    out = {f"t.{i:02d}": rng.standard_normal((int(rng.integers(1, 300)), 37), dtype=np.float32)
           for i in range(count)}
    if odd:
        out["bytes"] = rng.integers(0, 256, 4099, dtype=np.uint8)  # ends the file off a block boundary
        out["scalar"] = np.float64(3.5)
        out["empty"] = np.zeros((0, 3), np.float32)
    return out


def _same(got, want):
    assert list(got) == list(want) or sorted(got) == sorted(want)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)


@pytest.fixture
def forced_buffered():
    previous = platform.force(["o_direct"])
    yield
    platform.force(previous)


# --- the C primitive and its pure twin ----------------------------------------------
@pytest.mark.parametrize("impl", [_memory, pure_memory], ids=["compiled", "pure"])
def test_pread_direct_any_offset_length_and_buffer_address(tmp_path, impl):
    data = np.random.default_rng(1).integers(0, 256, (9 << 20) + 1234, dtype=np.uint8)
    path = tmp_path / "blob"
    data.tofile(path)
    fd, how = direct.open_direct(os.open(path, os.O_RDONLY), str(path))
    if fd is None:
        pytest.skip(f"direct I/O {how}")
    rng = np.random.default_rng(2)
    try:
        cases = [(0, data.size, 0), (data.size - 5000, 5000, 17), (4095, 4097, 4095 % ALIGN), (ALIGN, 8 << 20, 0)]
        for _ in range(25 if impl is _memory else 6):
            n = int(rng.integers(0, 6 << 20)) if rng.random() < 0.5 else int(rng.integers(0, 9000))
            at = int(rng.integers(0, data.size - n + 1))
            cases.append((at, n, int(rng.integers(0, ALIGN))))
            cases.append((at, n, at % ALIGN))  # congruent: the aligned blocks go straight in
        for at, n, shift in cases:
            whole = np.frombuffer(_memory.AlignedBuffer(n + 2 * ALIGN, ALIGN), np.uint8)
            dst = whole[shift:shift + n]
            threads = int(rng.integers(0, 5))
            crc = impl.pread_direct(fd, at, dst, threads, 5)
            np.testing.assert_array_equal(dst, data[at:at + n])
            assert crc == zlib.crc32(data[at:at + n], 5)
        with pytest.raises(EOFError):
            impl.pread_direct(fd, data.size - 10, np.zeros(11, np.uint8))
    finally:
        os.close(fd)


# --- loads ----------------------------------------------------------------------------
@pytest.mark.parametrize("layout, alignment", [("aprender", 64), ("apr2", 64), ("apr2", 32)])
def test_direct_load_of_unaligned_files_gives_the_same_tensors(tmp_path, alignment, layout):
    want = _model()
    path = tmp_path / "m.apr"
    aprfast.save_file(want, path, layout=layout, alignment=alignment)
    assert os.path.getsize(path) % ALIGN  # the file ends inside a block
    got = aprfast.load_file(path, backend="direct")
    _same(got, want)
    for value in got.values():
        assert value.flags.writeable and value.flags.owndata is False
        assert value.ctypes.data % alignment == 0
    with aprfast.open(path, backend="direct") as f:
        assert f._source.direct_how in ("o_direct", "nocache") or f._source.direct_how.startswith("refused")
        for name, value in want.items():
            np.testing.assert_array_equal(f.get_tensor(name), value)
            np.testing.assert_array_equal(f.get_tensor(name, copy=True), value)
        np.testing.assert_array_equal(f.get_slice("t.03")[1:, ::3], want["t.03"][1:, ::3])
        f.verify()
        assert f.get_tensor("t.01").ctypes.data % 64 == 0


def test_direct_load_of_many_tensors_and_a_large_one(tmp_path):
    rng = np.random.default_rng(3)
    want = {f"s.{i:04d}": rng.standard_normal(int(rng.integers(1, 900)), dtype=np.float32) for i in range(500)}
    want["big"] = rng.standard_normal((3000, 1001), dtype=np.float32)  # ~11.5 MiB: several direct chunks
    path = tmp_path / "m.apr"
    aprfast.save_file(want, path)
    for threads in (0, 1, 3):
        _same(aprfast.load_file(path, backend="direct", threads=threads), want)


def test_framework_modules_take_backend_direct(tmp_path):
    want = _model(odd=False)
    path = tmp_path / "m.apr"
    aprfast.save_file(want, path)
    _same(apr_numpy.load_file(path, backend="direct"), want)
    with aprfast.safe_open(path, "np", backend="direct") as f:
        np.testing.assert_array_equal(f.get_tensor("t.02"), want["t.02"])


def test_refused_direct_io_falls_back_to_buffered_reads(tmp_path, forced_buffered):
    want = _model()
    path = tmp_path / "m.apr"
    aprfast.save_file(want, path)
    with aprfast.open(path, backend="direct") as f:
        assert f._source.direct_how.startswith("refused")
        assert f._source.direct_align == 0
        _same(f.load_all(), want)
    _same(aprfast.load_file(path, backend="direct"), want)


def test_direct_read_refused_at_the_first_read_falls_back(tmp_path, monkeypatch):
    want = _model(odd=False)
    want["big"] = np.arange(1 << 18, dtype=np.float32)  # read by the direct path
    path = tmp_path / "m.apr"
    aprfast.save_file(want, path)

    def refuse(*args, **kwargs):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(_memory, "pread_direct", refuse)
    with aprfast.open(path, backend="direct") as f:
        _same(f.load_all(), want)
        assert f._source.direct_how.startswith("refused")


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no tmpfs at /dev/shm")
def test_direct_load_on_tmpfs(tmp_path):
    """tmpfs refused O_DIRECT before Linux 6.6 (EINVAL) and accepts it since: either way
    the load gives the tensors."""
    want = _model()
    path = os.path.join("/dev/shm", f"aprfast-direct-{os.getpid()}.apr")
    try:
        aprfast.save_file(want, path)
        _same(aprfast.load_file(path, backend="direct"), want)
        with aprfast.open(path, backend="direct") as f:
            np.testing.assert_array_equal(f.get_tensor("bytes"), want["bytes"])
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_file_being_written_reads_what_was_written(tmp_path):
    """Dirty pages not yet written back: a direct read sees them (the kernel writes the
    range back first), and a file growing after open reads as it was at open."""
    want = _model()
    path = tmp_path / "m.apr"
    aprfast.save_file(want, path, durable=False)
    with aprfast.open(path, backend="direct") as f:
        with open(path, "ab") as grow:
            grow.write(b"\0" * 10000)  # appended while open: past the footer, not read
        _same(f.load_all(verify=False), want)
    data = bytearray(path.read_bytes()[:-10000])
    path.write_bytes(data)  # rewritten, still dirty in the cache
    _same(aprfast.load_file(path, backend="direct"), want)


def test_file_that_shrinks_while_open_is_corrupt(tmp_path):
    want = {"w": np.arange(100000, dtype=np.float32)}
    path = tmp_path / "m.apr"
    aprfast.save_file(want, path)
    with aprfast.open(path, backend="direct") as f:
        os.truncate(path, 5000)
        with pytest.raises(CorruptError):
            f.load_all()


@pytest.mark.parametrize("buffered", [False, True], ids=["o_direct", "fallback"])
def test_crc_mismatch_is_detected(tmp_path, buffered):
    want = {"w": np.arange(300000, dtype=np.float32)}
    path = tmp_path / "m.apr"
    aprfast.save_file(want, path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(data)
    previous = platform.force(["o_direct"] if buffered else [])
    try:
        with pytest.raises(ChecksumError):
            aprfast.load_file(path, backend="direct")
        assert aprfast.load_file(path, backend="direct", verify=False)["w"].size == 300000
    finally:
        platform.force(previous)


@pytest.mark.parametrize("buffered", [False, True], ids=["o_direct", "fallback"])
def test_signed_file_is_checked_against_its_digests_on_a_direct_load(tmp_path, buffered):
    # issue 29 item 2: the digests of a signed file are checked on the direct path too; a
    # tensor changed with every CRC fixed up (as an attacker would) is refused by them
    from test_v2_helpers import SIGNING_PUBLIC, SIGNING_SEED, extent, fix_crcs, flip

    from aprfast.errors import SignatureError

    want = {f"w{i}": np.random.default_rng(i).standard_normal((64, 1024), dtype=np.float32) for i in range(6)}
    path = tmp_path / "signed.apr"
    aprfast.save_file(want, path, signing_key=SIGNING_SEED, layout="apr2")
    previous = platform.force(["o_direct"] if buffered else [])
    try:
        got = aprfast.load_file(path, backend="direct", trusted_keys=[SIGNING_PUBLIC])
        assert all(np.array_equal(got[k], want[k]) for k in want)
        data = bytearray(path.read_bytes())
        offset, size, _ = extent(data, "w3")
        path.write_bytes(fix_crcs(flip(data, offset + size // 2)))
        with pytest.raises(SignatureError, match="w3"):
            aprfast.load_file(path, backend="direct", trusted_keys=[SIGNING_PUBLIC])
    finally:
        platform.force(previous)


# --- the page cache ---------------------------------------------------------------------
def _cached(path) -> float | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        return direct.cached_fraction(fd, os.fstat(fd).st_size, 256)
    finally:
        os.close(fd)


def _evict(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        direct.drop_cached(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("buffered", [False, True], ids=["o_direct", "fallback"])
def test_direct_load_and_save_leave_the_file_out_of_the_page_cache(tmp_path, buffered):
    want = {f"w{i}": np.random.default_rng(i).standard_normal((256, 1024), dtype=np.float32) for i in range(24)}
    path = tmp_path / "m.apr"
    previous = platform.force(["o_direct"] if buffered else [])
    try:
        aprfast.save_file(want, path, backend="direct")
        after_save = _cached(path)
        if after_save is None:
            pytest.skip("no mincore here: page-cache residency cannot be told")
        assert after_save <= 0.05
        aprfast.save_file(want, path, backend="direct", durable=False)
        assert _cached(path) <= 0.05
        _evict(path)
        _same(aprfast.load_file(path, backend="direct"), want)
        assert _cached(path) <= 0.05
        aprfast.load_file(path, backend="pread")  # the buffered load does fill it
        assert _cached(path) > 0.5
    finally:
        platform.force(previous)


def test_auto_picks_direct_for_a_cold_file_and_pread_for_a_cached_one(tmp_path, monkeypatch):
    want = {"w": np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32)}
    path = tmp_path / "m.apr"
    aprfast.save_file(want, path)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        assert direct.choose_backend(fd, size, str(path)) == ("pread", "smaller than 64 MiB")
        monkeypatch.setattr(direct, "AUTO_MIN", 1 << 20)
        os.pread(fd, size, 0)
        if direct.cached_fraction(fd, size) is None:
            pytest.skip("no mincore here")
        assert direct.choose_backend(fd, size, str(path))[0] == "pread"
        os.fsync(fd)
        direct.drop_cached(fd)
        kind, why = direct.choose_backend(fd, size, str(path))
        assert kind == "direct", why
        _same(aprfast.load_file(path, mmap=False), want)  # auto: read direct, so still not cached
        assert direct.cached_fraction(fd, size, 64) <= 0.05
        monkeypatch.setattr(direct, "available_memory", lambda: size)  # larger than half of it
        assert direct.choose_backend(fd, size, str(path))[0] == "direct"
        # cached again: buffered, however short memory is (the cache holds the copy already)
        os.pread(fd, size, 0)
        assert direct.choose_backend(fd, size, str(path)) == ("pread", "in the page cache")
        monkeypatch.setattr(direct, "cached_fraction", lambda fd, size, samples=32: None)  # cannot be told
        assert direct.choose_backend(fd, size, str(path))[0] == "direct"
        monkeypatch.setattr(direct, "available_memory", lambda: None)
        assert direct.choose_backend(fd, size, str(path)) == ("pread", "page cache state unknown")
    finally:
        os.close(fd)


def test_drop_behind_advises_windows_behind_the_writer(monkeypatch):
    calls = []
    monkeypatch.setattr(direct, "drop_cached", lambda fd, offset=0, n=0: calls.append((offset, n)) or True)
    behind = direct.DropBehind(3, window=10)
    for _ in range(7):
        behind.wrote(5)  # 35 bytes
    # a window is advised once the writer is a window past its end (writeback starts),
    # and again two windows past it (clean by then: dropped)
    assert calls == [(0, 10), (10, 10), (0, 10)]
    behind.wrote(20)  # 55 bytes
    assert calls == [(0, 10), (10, 10), (0, 10), (20, 10), (10, 10), (30, 10), (20, 10)]
    behind.finish()
    assert calls[-1] == (0, 0)


# --- DirectWriter: saves around the page cache ----------------------------------------
def _write_through(path, pieces, **kw):
    """Write ``pieces`` with a DirectWriter into a fresh file; its ``how``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        writer = direct.DirectWriter(fd, str(path), **kw)
        try:
            for piece in pieces:
                writer.write(piece)
            writer.flush()
            os.fsync(fd)
            how = writer.how
            writer.finish()
        finally:
            writer.close()
    finally:
        os.close(fd)
    return how


@pytest.mark.parametrize("sizes", [[0], [1], [ALIGN], [ALIGN + 1], [3 * ALIGN - 7, 5, 2 * ALIGN + 11],
                                   [5 * 8192 + 3], [1, 2 * 8192, 8191, 8192 * 3 + 1, 17]],
                         ids=["empty", "one-byte", "one-block", "block+1", "three-odd", "chunks+3", "mixed"])
@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("engine", ["threads", "io_uring"])
def test_direct_writer_writes_every_byte_in_order(tmp_path, sizes, depth, engine):
    rng = np.random.default_rng(sum(sizes) + depth)
    pieces = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    path = tmp_path / "w.bin"
    how = _write_through(path, pieces, chunk=8192, depth=depth, engine=engine, ring_chunk=8192, ring_depth=depth)
    assert path.read_bytes() == b"".join(p.tobytes() for p in pieces)
    assert how == "o_direct" or how.startswith("refused") or how == "nocache"


def _ring_here(tmp_path) -> bool:
    """Whether a DirectWriter here writes direct and can hand its writes to a ring."""
    path = tmp_path / "probe.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        writer = direct.DirectWriter(fd, str(path), chunk=8192, depth=2, engine="io_uring", ring_chunk=8192)
        try:
            writer.write(b"p" * (direct.PROBE_BYTES + 3 * 8192))
            writer.flush()
            return writer.engine == "io_uring"
        finally:
            writer.close()
    finally:
        os.close(fd)
        os.unlink(path)


@pytest.mark.parametrize("engine", ["threads", "io_uring", "auto"])
def test_direct_writer_continues_the_crc_over_every_byte(tmp_path, engine):
    ring = engine != "threads" and _ring_here(tmp_path)
    rng = np.random.default_rng(4)
    pieces = [rng.integers(0, 256, n, dtype=np.uint8) for n in (5, 8192 * 3 + 1, 70000, 4095, 1, 200000)]
    path = tmp_path / "w.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        writer = direct.DirectWriter(fd, str(path), chunk=8192, depth=2, engine=engine, ring_chunk=16384)
        crc = 12345
        for piece in pieces:
            crc = writer.write(piece, crc)
        assert writer.write(b"", crc) == crc
        assert writer.write(b"no crc asked") is None
        writer.flush()
        os.fsync(fd)
        writer.finish()
        assert writer.engine == ("io_uring" if ring else "threads")
    finally:
        os.close(fd)
    body = b"".join(p.tobytes() for p in pieces)
    assert crc == zlib.crc32(body, 12345)
    assert path.read_bytes() == body + b"no crc asked"


def test_direct_writer_engine_from_the_environment(tmp_path, monkeypatch):
    if not _ring_here(tmp_path):
        pytest.skip("no direct writes on a ring here (no io_uring, or O_DIRECT refused)")
    path = tmp_path / "w.bin"
    for value, want in (("threads", "threads"), ("io_uring", "io_uring"), ("", "io_uring")):
        monkeypatch.setenv(direct.ENGINE_ENV, value)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            writer = direct.DirectWriter(fd, str(path), chunk=8192, depth=2, ring_chunk=8192)
            writer.write(b"e" * 150000)  # past the first write (PROBE_BYTES): the ring's
            writer.flush()
            writer.finish()
        finally:
            os.close(fd)
        assert writer.engine == want, value
        assert path.read_bytes() == b"e" * 150000
    monkeypatch.setenv(direct.ENGINE_ENV, "spdk")
    with pytest.raises(ValueError, match="APRFAST_DIRECT_ENGINE"):
        direct.DirectWriter(0)
    with pytest.raises(ValueError, match="no direct engine"):
        direct.DirectWriter(0, engine="spdk")
    for bad in ({"ring_chunk": 12288}, {"ring_chunk": 2048}, {"ring_depth": 0}, {"ring_depth": 65}):
        with pytest.raises(ValueError, match="ring_chunk"):
            direct.DirectWriter(0, engine="threads", **bad)


@pytest.mark.skipif(resource is None or not hasattr(signal, "SIGXFSZ"), reason="no RLIMIT_FSIZE here")
def test_ring_write_error_fails_the_save_and_keeps_the_old_file(tmp_path):
    """A write on the ring that fails (here: past RLIMIT_FSIZE, EFBIG) is raised by the
    save, which leaves the old file; the ring waits for its writes before freeing."""
    if not _ring_here(tmp_path):
        pytest.skip("no direct writes on a ring here (no io_uring, or O_DIRECT refused)")
    path = tmp_path / "m.apr"
    old = {"w": np.arange(10, dtype=np.float32)}
    aprfast.save_file(old, path)
    new = {"big": np.random.default_rng(3).standard_normal(6 << 20, dtype=np.float32)}  # 24 MiB
    previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (9 << 20, hard))
    try:
        with pytest.raises(aprfast.errors.AprIOError) as info:
            aprfast.save_file(new, path, backend="direct")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous_handler)
    assert "write failed: File too large" in str(info.value)
    _same(aprfast.load_file(path), old)
    assert sorted(os.listdir(tmp_path)) == ["m.apr"]


def test_uring_writer_checks_its_arguments(tmp_path):
    if not _ring_here(tmp_path):
        pytest.skip("no direct writes on a ring here (no io_uring, or O_DIRECT refused)")
    from aprfast import _memory

    path = tmp_path / "w.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_DIRECT", 0), 0o644)
    try:
        for chunk, depth in ((12288, 2), (1024, 2), (8192, 65)):
            with pytest.raises(ValueError, match="power of two"):
                _memory.UringWriter(fd, 0, chunk, depth)
        ring = _memory.UringWriter(fd, 0, 8192, 2)
        assert ring.write(b"r" * 10000, 0) == zlib.crc32(b"r" * 10000)
        tail, offset = ring.flush()
        assert (tail, offset, ring.written) == (b"r" * (10000 - 8192), 8192, 8192)
        ring.close()
        ring.close()  # idempotent
        with pytest.raises(ValueError, match="after close"):
            ring.write(b"x")
    finally:
        os.close(fd)


@pytest.mark.parametrize("helper", [False, True, None], ids=["alone", "helper", "auto"])
def test_uring_writer_with_a_helper_writes_every_byte_and_the_crc(tmp_path, helper):
    """A helper thread fills the second half of each buffer (its CRC and its copy): the
    file and the CRC are still those of every byte in order, for pieces smaller than a
    buffer, larger than one, and ending anywhere in one."""
    if not _ring_here(tmp_path):
        pytest.skip("no direct writes on a ring here (no io_uring, or O_DIRECT refused)")
    from aprfast import _memory

    rng = np.random.default_rng(7)
    sizes = [1, 3 << 20, (2 << 20) + 5, 9 << 20, 4095, 1 << 20, (5 << 20) + 4097, 17]
    pieces = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    body = b"".join(p.tobytes() for p in pieces)
    for with_crc in (True, False):
        path = tmp_path / f"h{with_crc}.bin"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
        try:
            ring = _memory.UringWriter(fd, 0, 4 << 20, 2, helper)
            crc = 99 if with_crc else None
            for piece in pieces:
                crc = ring.write(piece, crc)
            tail, offset = ring.flush()
            ring.close()
        finally:
            os.close(fd)
        assert crc == (zlib.crc32(body, 99) if with_crc else None)
        assert offset == len(body) // 4096 * 4096
        assert path.read_bytes() == body[:offset]
        assert bytes(tail) == body[offset:]


def test_direct_writer_takes_any_buffer_and_dtype(tmp_path):
    rng = np.random.default_rng(1)
    pieces = [rng.standard_normal((33, 17), dtype=np.float32), b"abc", bytearray(b"xyz" * 5000),
              memoryview(rng.integers(0, 9, 1234, dtype=np.int64)), np.float64(2.5)]
    path = tmp_path / "w.bin"
    _write_through(path, pieces, chunk=8192, depth=2)
    assert path.read_bytes() == b"".join(bytes(memoryview(p).cast("B")) if not isinstance(p, np.ndarray)
                                         else p.tobytes() for p in pieces)


def test_direct_writer_refused_at_the_first_write_falls_back(tmp_path, monkeypatch):
    """A filesystem that takes O_DIRECT at open and refuses the write (some FUSE
    mounts): the refused bytes and every later one are written buffered."""
    real = direct._pwrite_all
    refused = []

    def pwrite_all(fd, view, offset):
        if fd != plain[0]:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, view, offset)

    monkeypatch.setattr(direct, "_pwrite_all", pwrite_all)
    path = tmp_path / "w.bin"
    data = np.random.default_rng(2).integers(0, 256, 5 * 8192 + 77, dtype=np.uint8)
    plain = [None]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    plain[0] = fd
    try:
        writer = direct.DirectWriter(fd, str(path), chunk=8192, depth=2)
        assert writer.chunk == 8192
        if not writer.direct:
            pytest.skip(f"direct writes refused at open here: {writer.how}")
        writer.write(data[:100])
        writer.write(data[100:])
        writer.flush()
        assert not writer.direct and writer.how.startswith("refused: direct write failed")
        writer.finish()
    finally:
        os.close(fd)
    assert refused == [0]
    assert path.read_bytes() == data.tobytes()


def test_direct_writer_error_of_a_later_write_fails_the_save_and_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "m.apr"
    old = {"w": np.arange(10, dtype=np.float32)}
    aprfast.save_file(old, path)
    real, calls = direct._pwrite_all, []

    def pwrite_all(fd, view, offset):
        calls.append(offset)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, view, offset)

    monkeypatch.setattr(direct, "_pwrite_all", pwrite_all)
    monkeypatch.setattr(direct, "WRITE_CHUNK", 8192)
    # the thread-pool engine: its writes go through _pwrite_all (the ring's are tested below)
    real_init = direct.DirectWriter.__init__
    monkeypatch.setattr(direct.DirectWriter, "__init__",
                        lambda self, fd, path=None, **kw: real_init(self, fd, path, chunk=8192, engine="threads"))
    new = {f"w{i}": np.random.default_rng(i).standard_normal(5000, dtype=np.float32) for i in range(8)}
    with pytest.raises(aprfast.errors.AprIOError, match="No space left"):
        aprfast.save_file(new, path, backend="direct")
    assert len(calls) >= 3
    _same(aprfast.load_file(path), old)
    assert sorted(os.listdir(tmp_path)) == ["m.apr"]


def test_direct_writer_at_an_unaligned_start_writes_buffered(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(b"h" * 10)
    fd = os.open(path, os.O_WRONLY)
    try:
        writer = direct.DirectWriter(fd, str(path), start=10, chunk=8192, depth=2)
        if writer.how != "nocache":
            assert not writer.direct
        writer.write(b"z" * 20000)
        writer.flush()
        writer.finish()
    finally:
        os.close(fd)
    assert path.read_bytes() == b"h" * 10 + b"z" * 20000


def test_direct_writer_argument_checks(tmp_path):
    with pytest.raises(ValueError, match="multiple of 4096"):
        direct.DirectWriter(0, chunk=1000)
    with pytest.raises(ValueError, match="depth"):
        direct.DirectWriter(0, depth=0)
    path = tmp_path / "w.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        writer = direct.DirectWriter(fd, str(path), chunk=8192, depth=2)
        writer.write(b"a" * 5000)
        writer.flush()
        with pytest.raises(ValueError, match="after flush"):
            writer.write(b"b")
        writer.finish()
        writer.close()  # idempotent
    finally:
        os.close(fd)
    assert path.read_bytes() == b"a" * 5000


@pytest.mark.parametrize("buffered", [False, True], ids=["o_direct", "fallback"])
@pytest.mark.parametrize("layout", ["apr2", "aprender"])
def test_direct_save_gives_the_bytes_of_a_buffered_save(tmp_path, buffered, layout):
    want = _model(5, count=30)
    want["big"] = np.random.default_rng(9).standard_normal(3 << 20, dtype=np.float32)  # past several chunks
    # its CRC is taken a writer's chunk at a time, from an offset no chunk boundary meets
    want["odd"] = np.random.default_rng(10).integers(0, 256, (5 << 20) + 13, dtype=np.uint8)
    previous = platform.force(["o_direct"] if buffered else [])
    try:
        aprfast.save_file(want, tmp_path / "d.apr", backend="direct", layout=layout, metadata={"k": "v"})
        aprfast.save_file(want, tmp_path / "n.apr", durable=False, backend="direct", layout=layout,
                          metadata={"k": "v"})
    finally:
        platform.force(previous)
    aprfast.save_file(want, tmp_path / "b.apr", layout=layout, metadata={"k": "v"})
    expected = (tmp_path / "b.apr").read_bytes()
    assert (tmp_path / "d.apr").read_bytes() == expected
    assert (tmp_path / "n.apr").read_bytes() == expected
    _same(aprfast.load_file(tmp_path / "d.apr"), want)


def test_network_filesystem_types(monkeypatch):
    monkeypatch.setattr(direct, "filesystem_type", lambda path: "nfs4")
    assert direct.is_network_filesystem("/x")
    monkeypatch.setattr(direct, "filesystem_type", lambda path: "fuse.s3fs")
    assert direct.is_network_filesystem("/x")
    monkeypatch.setattr(direct, "filesystem_type", lambda path: "ext4")
    assert not direct.is_network_filesystem("/x")


# --- validation ---------------------------------------------------------------------------
def test_backend_validation(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file({"w": np.zeros(3)}, path)
    with pytest.raises(ValueError, match="backend"):
        aprfast.load_file(path, backend="o_direct")
    with pytest.raises(ValueError, match="backend"):
        aprfast.open(path, backend="uring")
    with pytest.raises(ValueError, match="disagree"):
        aprfast.open(path, mode="pread", backend="direct")
    with pytest.raises(ValueError, match="mode"):
        open_source(str(path), mode="nocache")
    with pytest.raises(ValueError, match="backend"):
        aprfast.save_file({"w": np.zeros(3)}, tmp_path / "x.apr", backend="pread")
    assert not (tmp_path / "x.apr").exists()
    with pytest.raises(UsageError):
        apr_numpy.load_file(path, backend="directio")
    with pytest.raises(UsageError):
        aprfast.safe_open(path, "np", backend="nocache")
    with aprfast.open(path, mode="direct", backend="direct") as f:  # the same choice twice is fine
        assert f.get_tensor("w").tolist() == [0.0, 0.0, 0.0]
    # backend="mmap" gives views whatever mmap= says; "pread"/"direct" give owned arrays
    assert not aprfast.load_file(path, mmap=False, backend="mmap")["w"].flags.writeable
    assert aprfast.load_file(path, backend="pread")["w"].flags.writeable


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE on this platform")
@pytest.mark.parametrize("size", [10, direct.PROBE_BYTES - 1, direct.PROBE_BYTES, direct.PROBE_BYTES + 4097,
                                  3 * direct.PROBE_BYTES + 5])
def test_ring_takes_over_after_a_small_first_write(tmp_path, monkeypatch, size):
    """Where the ring is to take over, the first direct write is PROBE_BYTES from small
    buffers (no huge page populated for it), the ring writes the rest, and where no
    ring can start the threads' buffers are made then: every byte in order each way."""
    if not _ring_here(tmp_path):
        pytest.skip("no direct writes on a ring here (no io_uring, or O_DIRECT refused)")
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    for ring in (True, False):
        if not ring:
            from aprfast import _memory

            class Refused:
                def __init__(self, *args):
                    raise NotImplementedError("no ring in this test")

            monkeypatch.setattr(_memory, "UringWriter", Refused)
        path = tmp_path / f"p{ring}.bin"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            writer = direct.DirectWriter(fd, str(path), chunk=8192, depth=2, ring_chunk=16384)
            assert writer._chunk == direct.PROBE_BYTES and writer._pool is None
            crc = writer.write(data[:7], 0)
            crc = writer.write(data[7:], crc)
            writer.flush()
            os.fsync(fd)
            writer.finish()
        finally:
            os.close(fd)
        assert crc == zlib.crc32(data.tobytes())
        assert path.read_bytes() == data.tobytes()
        if size >= direct.PROBE_BYTES:
            assert writer.engine == ("io_uring" if ring else "threads")


def test_direct_writes_come_from_private_huge_page_aligned_buffers(tmp_path):
    # a shared anonymous map is shmem (no huge pages): from 4 KiB pages each direct
    # request holds at most max_segments pages (docs/performance.md)
    # (the thread engine's; where the ring is to take over, the first write comes from
    # two small buffers in 4 KiB pages, populated on every save for little)
    path = tmp_path / "w.bin"
    with open(path, "wb") as f:
        w = direct.DirectWriter(f.fileno(), str(path), engine="threads")
        try:
            if not w.direct:
                pytest.skip(f"direct writes {w.how}")
            starts = [np.frombuffer(b, np.uint8, count=1).ctypes.data for b in w._buffers]
            assert starts[0] % (2 << 20) == 0
            assert starts == [starts[0] + i * direct.WRITE_CHUNK for i in range(len(starts))]
            w.write(b"y" * (5 << 20))
            w.flush()
            os.fsync(f.fileno())
            w.finish()
        finally:
            w.close()
    assert path.read_bytes() == b"y" * (5 << 20)


def test_fresh_population_counts_what_a_load_populates(tmp_path):
    """_memory.fresh_population: the bytes and thread time a load spent populating its
    fresh arrays, by page size (bench_cold.py's memory rows print it); reset zeroes it."""
    from aprfast import _memory

    tensors = {"w": np.random.default_rng(0).standard_normal(12 << 20, dtype=np.float32)}  # 48 MiB
    path = tmp_path / "p.apr"
    aprfast.save_file(tensors, path)
    _memory.release_buffer_cache()  # a cached block would be reused, not populated
    _memory.fresh_population(reset=True)
    loaded = aprfast.load_file(path, backend="direct")
    counts = _memory.fresh_population(reset=True)
    zero = {"huge_bytes": 0, "huge_seconds": 0.0, "small_bytes": 0, "small_seconds": 0.0}
    assert set(counts) == set(zero)
    np.testing.assert_array_equal(loaded["w"], tensors["w"])
    try:
        _memory.huge_page_choices([1])
    except OSError:  # no page-size choice here (not Linux, or the pure backend): nothing counted
        assert counts == zero
        return
    if counts["huge_bytes"] + counts["small_bytes"] == 0:
        pytest.skip("this kernel cannot populate ahead (no MADV_POPULATE_WRITE): pages fault in as written")
    assert counts["huge_bytes"] + counts["small_bytes"] >= 48 << 20
    assert (counts["huge_bytes"] > 0) == (counts["huge_seconds"] > 0)
    assert (counts["small_bytes"] > 0) == (counts["small_seconds"] > 0)
    assert _memory.fresh_population() == zero
