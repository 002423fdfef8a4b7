"""Aligned buffers, aligned tensor views, and the bulk-copy/pread helpers behind them."""

import os
import sys
import time
import zlib

import numpy as np
import pytest

import aprfast
from aprfast import _memory

ALIGNMENTS = [1 << k for k in range(13)]  # 1 .. 4096
SIZES = [0, 1, 63, 4097, 3 << 20, 40 << 20]
HUGE_THRESHOLD = 32 << 20  # csrc/buffers.h APR_MAP_THRESHOLD
HUGE_PAGE = 2 << 20


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_aligned_buffer_start_is_aligned(size, alignment):
    buf = _memory.AlignedBuffer(size, alignment)
    assert buf.address % alignment == 0
    assert len(buf) == size and buf.size == size and buf.alignment == alignment
    view = memoryview(buf)
    assert view.nbytes == size and not view.readonly and view.format == "B"
    if size:
        arr = np.frombuffer(buf, np.uint8)
        assert arr.ctypes.data == buf.address
        arr[:] = 0xA5
        arr[-1] = 7
        assert arr[-1] == 7 and (size == 1 or arr[0] == 0xA5)


@pytest.mark.parametrize("size", SIZES)
def test_default_alignment_is_64(size):
    buf = _memory.AlignedBuffer(size)
    assert buf.alignment == 64 and buf.address % 64 == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="huge-page mapping is a Linux path")
@pytest.mark.parametrize("size", SIZES + [HUGE_THRESHOLD - 1, HUGE_THRESHOLD])
def test_buffers_of_32_mib_and_more_are_huge_page_backed(size):
    buf = _memory.AlignedBuffer(size, 64)
    assert buf.huge_page_backed == (size >= HUGE_THRESHOLD)
    if buf.huge_page_backed:
        assert buf.address % HUGE_PAGE == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="huge-page mapping is a Linux path")
def test_a_fresh_mapped_block_is_populated_and_decides_its_page_size():
    # buffers.c times the population of each fresh mapped block (huge pages, 32 MiB at a
    # time) and falls back to 4 KiB pages where fresh huge pages prove slow
    import subprocess

    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__)))
    script = ("from aprfast import _memory; import numpy as np\n"
              "print(_memory.huge_pages_state())\n"
              "b = _memory.AlignedBuffer(72 << 20, 64)\n"
              "a = np.frombuffer(b, np.uint8); a[::4096] = 3\n"
              "print(_memory.huge_pages_state(), int(a[::4096].sum()) == 3 * len(a[::4096]))")
    for fallbacks, expected in (("", {"huge", "small"}), ("madvise", {"untried"})):
        env = dict(os.environ, PYTHONPATH=package_parent, APRFAST_FALLBACKS=fallbacks)
        # cwd: "python -c" puts the working directory first on sys.path, and a checkout's
        # aprfast/ there would shadow the package under test
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60,
                             cwd=package_parent)
        assert out.returncode == 0, out.stderr
        first, then = out.stdout.split("\n")[:2]
        assert first == "untried"
        state, filled = then.split()
        assert state in expected and filled == "True", out.stdout


_FAST, _SMALL, _SLOW, _HOST = 150_000, 700_000, 1_500_000, 4_500_000  # ns per 2 MiB step (measured, buffers.c)
_linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the huge-page choice is a Linux path")


@_linux_only
def test_one_slow_huge_step_keeps_huge_pages():
    # a step preempted by the read it races is no sign that the memory is slow
    assert _memory.huge_page_choices([_FAST, _SLOW, _FAST, _SLOW, _FAST, _FAST]) == [True] * 6


@_linux_only
def test_two_slow_huge_steps_in_a_row_move_to_small_pages_until_they_prove_dearer():
    # 4 KiB pages are kept while they cost less than the last huge step did
    assert _memory.huge_page_choices([_FAST, _SLOW, _SLOW, _SMALL, _SMALL]) == [True, True, True, False, False]
    # and left once they cost more on two steps in a row (one may be preempted)
    assert _memory.huge_page_choices([_SLOW, _SLOW, 2 * _SLOW, _SMALL, _SMALL]) == [True, True, False, False, False]
    assert _memory.huge_page_choices([_SLOW, _SLOW, 2 * _SLOW, 2 * _SLOW, _FAST]) == [True, True, False, False, True]


@_linux_only
def test_cold_memory_keeps_huge_pages_once_small_ones_prove_dearer():
    # both cold (the host took the free memory back): 4.5 ms a huge step, 5.5 ms in 4 KiB
    # pages; huge pages are then held for 64 MiB however slow, then 128 MiB, not
    # abandoned again after two slow steps (huge, huge, 4 KiB, 4 KiB, huge, huge, ...)
    cold_small = 5_500_000
    steps, choices = [], []
    for _ in range(4 + 32 + 4 + 64 + 2):
        huge = _memory.huge_page_choices(steps + [0])[-1]  # the next step's choice, from the steps before
        steps.append(_HOST if huge else cold_small)
        choices.append(huge)
    assert choices[:4] == [True, True, False, False]
    assert all(choices[4:4 + 32]) and choices[36:40] == [True, True, False, False]  # held 64 MiB, then tried
    assert all(choices[40:40 + 64])  # held twice as long
    # cheap 4 KiB pages still win over slow huge ones, hold or no hold
    assert _memory.huge_page_choices([_HOST, _HOST, _SMALL, _SMALL, _SMALL]) == [True, True, False, False, False]


@_linux_only
def test_a_direct_reads_destination_keeps_huge_pages_up_to_its_own_mark():
    # direct reads into 4 KiB pages are split into small requests: huge pages are worth
    # populating more slowly there, but not memory the host has to fault back in
    steps = [_SLOW] * 8
    assert _memory.huge_page_choices(steps) == [True, True] + [False] * 6
    assert _memory.huge_page_choices(steps, slow_ns=_memory.HUGE_SLOW_DIRECT_NS) == [True] * 8
    host = _memory.huge_page_choices([_HOST] * 4, slow_ns=_memory.HUGE_SLOW_DIRECT_NS)
    assert host == [True, True, False, False]


@_linux_only
def test_small_pages_try_huge_ones_again_after_256_mib_then_after_twice_as_long():
    per_mib = 1 << 20
    steps = 2 + 256 // 2 + 2 + 512 // 2 + 1  # 2 slow, 256 MiB small, 2 slow again, 512 MiB small, a retry
    choices = _memory.huge_page_choices([_HOST if i in (0, 1, 130, 131, 388) else _SMALL for i in range(steps)],
                                        step=2 * per_mib)
    assert choices[:2] == [True, True] and not any(choices[2:130])
    assert choices[130:132] == [True, True] and not any(choices[132:388]) and choices[388]


def test_huge_page_choices_refuses_an_empty_step():
    with pytest.raises(ValueError):
        _memory.huge_page_choices([1], step=0)


@pytest.mark.parametrize("alignment", [0, 3, 6, 100, 8192, 1 << 20])
def test_invalid_alignments_raise_value_error(alignment):
    with pytest.raises(ValueError):
        _memory.AlignedBuffer(16, alignment)


def test_many_buffers_are_independent():
    bufs = [_memory.AlignedBuffer(100 + i, 256) for i in range(50)]
    arrays = [np.frombuffer(b, np.uint8) for b in bufs]
    for i, a in enumerate(arrays):
        a[:] = i
    for i, a in enumerate(arrays):
        assert (a == i).all()
        assert bufs[i].address % 256 == 0


@pytest.mark.parametrize("nbytes", [0, 1, 100, 3 << 20])
@pytest.mark.parametrize("alignment", [1, 64, 4096])
def test_aligned_empty_is_a_writable_aligned_uint8_array(nbytes, alignment):
    arr = aprfast.aligned_empty(nbytes, alignment)
    assert arr.dtype == np.uint8 and arr.shape == (nbytes,)
    assert arr.flags.writeable and arr.flags.c_contiguous
    if nbytes:
        assert arr.ctypes.data % alignment == 0
        arr[:] = 3
        assert int(arr.sum()) == 3 * nbytes


def _model():
    return {
        f"t{i}": np.arange(n, dtype=dtype)
        for i, (n, dtype) in enumerate([(1, np.uint8), (3, np.float32), (17, np.int64), (100, np.float16),
                                        (65, np.int8), (1000, np.float64), (64, np.uint8)])
    }


@pytest.mark.parametrize("layout", ["aprender", "apr2"])
def test_zero_copy_views_of_a_mapped_file_are_64_byte_aligned(tmp_path, layout):
    path = tmp_path / "m.apr"
    aprfast.save_file(_model(), path, layout=layout)
    with aprfast.open(path) as f:
        for name in f.keys():
            arr = f.get_tensor(name)
            assert not arr.flags.writeable  # really a view of the map
            assert arr.ctypes.data % 64 == 0, name
    for name, arr in aprfast.load_file(path, mmap=True).items():
        assert arr.ctypes.data % 64 == 0, name


@pytest.mark.parametrize("mode", ["mmap", "pread"])
@pytest.mark.parametrize("alignment", [64, 4096])
def test_copies_use_the_files_alignment(tmp_path, mode, alignment):
    path = tmp_path / "m.apr"
    tensors = _model()
    tensors["large"] = np.ones(3 << 18, np.float32)  # 3 MiB, mapped-buffer path
    aprfast.save_file(tensors, path)
    with aprfast.open(path, mode=mode, alignment=alignment) as f:
        for name, want in tensors.items():
            arr = f.get_tensor(name, copy=True)
            assert arr.flags.writeable
            assert arr.ctypes.data % alignment == 0, name
            assert arr.tobytes() == want.tobytes()


def test_load_all_with_a_4096_alignment_aligns_the_arena(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file(_model(), path)
    with aprfast.open(path, mode="pread", alignment=4096) as f:
        loaded = f.load_all()
    first = min(loaded.values(), key=lambda a: a.ctypes.data)
    assert first.ctypes.data % 4096 == 0
    assert all(a.ctypes.data % 64 == 0 for a in loaded.values())


# --- pread_into and copy_into ---------------------------------------------------------
@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    data = np.random.default_rng(5).integers(0, 256, (9 << 20) + 123, dtype=np.uint8).tobytes()
    path = tmp_path_factory.mktemp("pio") / "data.bin"
    path.write_bytes(data)
    return path, data


@pytest.mark.parametrize("offset,length", [(0, 0), (0, 1), (5, 4096), (777, 1 << 20), (0, (9 << 20) + 123),
                                           (100, 9 << 20)])
@pytest.mark.parametrize("threads", [0, 1, 3])
def test_pread_into_reads_exact_bytes_and_their_crc(data_file, offset, length, threads):
    path, data = data_file
    fd = os.open(path, os.O_RDONLY)
    try:
        out = aprfast.aligned_empty(length)
        assert _memory.pread_into(fd, offset, out, threads) is None
        assert out.tobytes() == data[offset:offset + length]
        out[:] = 0
        crc = _memory.pread_into(fd, offset, out, threads, 0)
        assert out.tobytes() == data[offset:offset + length]
        assert crc == zlib.crc32(data[offset:offset + length])
        seed = zlib.crc32(b"prefix")
        assert _memory.pread_into(fd, offset, out, threads, seed) == zlib.crc32(data[offset:offset + length], seed)
    finally:
        os.close(fd)


def test_pread_into_past_the_end_raises_eof_error(data_file):
    path, data = data_file
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(EOFError):
            _memory.pread_into(fd, len(data) - 10, bytearray(11))
    finally:
        os.close(fd)


def test_pread_into_a_directory_descriptor_raises_os_error(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as info:
            _memory.pread_into(fd, 0, bytearray(10))
        assert not isinstance(info.value, EOFError)
    finally:
        os.close(fd)


def test_pread_into_needs_a_writable_buffer(data_file):
    path, _ = data_file
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises((TypeError, ValueError, BufferError)):
            _memory.pread_into(fd, 0, b"immutable")
    finally:
        os.close(fd)


@pytest.mark.parametrize("n", [0, 1, 65535, 65536, (8 << 20) + 3, 17 << 20])
@pytest.mark.parametrize("threads", [0, 1, 2, 5])
def test_copy_into_copies_every_byte(n, threads):
    src = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    dst = aprfast.aligned_empty(n)
    _memory.copy_into(dst, src, threads)
    assert np.array_equal(dst, src)
    assert zlib.crc32(dst) == zlib.crc32(src)


def test_copy_into_unaligned_slices():
    src = np.arange(300, dtype=np.uint8)
    dst = np.zeros(400, np.uint8)
    _memory.copy_into(dst[3:203], src[7:207])
    assert np.array_equal(dst[3:203], src[7:207])
    assert not dst[:3].any() and not dst[203:].any()


def test_copy_into_refuses_mismatched_lengths():
    with pytest.raises(ValueError):
        _memory.copy_into(bytearray(10), b"x" * 11)


def test_default_threads_is_at_least_one():
    assert _memory.default_threads() >= 1


HUGE_SIZES_SCRIPT = """
from aprfast import _memory
for size in (2**63, 2**64 - 2**20, 2**64 - 1):
    try:
        buf = _memory.AlignedBuffer(size, 64)
    except (MemoryError, ValueError, OverflowError) as exc:
        print(type(exc).__name__)
    else:
        print("created", buf.size)
"""


def test_impossible_sizes_raise_instead_of_crashing(run_child):
    # Sizes near 2**64 must not wrap around in the size arithmetic (run in a child:
    # a wrapped size maps a small region and later frees it with the wrong call).
    out = run_child(HUGE_SIZES_SCRIPT)
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr[-2000:])
    lines = out.stdout.split("\n")[:3]
    assert all(line in ("MemoryError", "ValueError", "OverflowError") for line in lines), out.stdout


# --- the cache of freed buffers (csrc/buffers.h) ---------------------------------------


@pytest.fixture
def fresh_cache():
    _memory.release_buffer_cache()
    before = _memory.buffer_cache_stats()
    yield before
    _memory.set_buffer_decay(before["decay_ms"])
    _memory.release_buffer_cache(before["limit"], heap_limit=before["heap_limit"])


@pytest.mark.parametrize("size", [_memory.BUFFER_CACHE_MIN, 3 << 20, 40 << 20])
def test_a_freed_buffer_is_handed_back_for_the_same_size(fresh_cache, size):
    first = _memory.AlignedBuffer(size, 64)
    address = first.address
    np.frombuffer(first, np.uint8)[:] = 7  # touched, as a copy would
    del first
    stats = _memory.buffer_cache_stats()
    assert stats["blocks"] == 1 and stats["bytes"] >= size
    again = _memory.AlignedBuffer(size, 64)
    assert again.address == address and len(again) == size
    assert _memory.buffer_cache_stats()["hits"] == fresh_cache["hits"] + 1
    np.frombuffer(again, np.uint8)[:] = 1  # fully writable
    del again


def test_the_cache_keeps_neither_small_blocks_nor_a_poor_fit(fresh_cache):
    small = _memory.AlignedBuffer(_memory.BUFFER_CACHE_MIN - 1, 64)
    del small
    assert _memory.buffer_cache_stats()["blocks"] == 0
    big = _memory.AlignedBuffer(8 << 20, 64)
    del big
    before = _memory.buffer_cache_stats()
    assert before["blocks"] == 1
    # a quarter of the size: reusing the 8 MiB block would waste most of it, and the
    # miss gives the 8 MiB block back to the system.  (Not told by the address: the
    # allocator may hand the freed block's memory straight back for the new one.)
    other = _memory.AlignedBuffer(2 << 20, 64)
    after = _memory.buffer_cache_stats()
    assert after["hits"] == before["hits"] and after["misses"] == before["misses"] + 1
    assert after["blocks"] == 0
    del other
    # a stricter alignment than the cached block has is never served from it
    assert all(_memory.AlignedBuffer(8 << 20, 4096).address % 4096 == 0 for _ in range(3))


def test_the_cap_bounds_what_is_kept_and_zero_turns_the_cache_off(fresh_cache):
    _memory.release_buffer_cache(5 << 20)
    buffers = [_memory.AlignedBuffer(2 << 20, 64) for _ in range(4)]
    del buffers
    stats = _memory.buffer_cache_stats()
    assert stats["bytes"] <= 5 << 20 and stats["blocks"] == 2


def test_heap_blocks_have_their_own_cap_and_give_way_to_each_other_not_to_arenas(fresh_cache):
    """Mapped blocks (arenas, 32 MiB and more) may fill the whole cap; heap blocks only
    their own (csrc/buffers.c heap_limit): Windows cannot advise heap blocks away."""
    _memory.release_buffer_cache(64 << 20, heap_limit=5 << 20)
    assert _memory.buffer_cache_stats()["heap_limit"] == 5 << 20
    # all made before any is freed (a miss gives back the oldest cached block)
    heap = [_memory.AlignedBuffer(2 << 20, 64) for _ in range(3)]
    arena = _memory.AlignedBuffer(40 << 20, 64)
    arena_address = arena.address
    del arena  # the oldest cached block
    while heap:
        del heap[0]  # the first two fit the heap cap; the third gives back the first, not the arena
    stats = _memory.buffer_cache_stats()
    assert stats["blocks"] == 3, stats
    assert 4 << 20 <= stats["heap_bytes"] <= 5 << 20, stats
    assert stats["bytes"] - stats["heap_bytes"] >= 40 << 20, stats
    again = _memory.AlignedBuffer(40 << 20, 64)
    assert again.address == arena_address
    del again
    # a heap cap above the whole cap changes nothing: the smaller holds
    _memory.release_buffer_cache(3 << 20, heap_limit=1 << 30)
    assert _memory.buffer_cache_stats()["heap_limit"] == 3 << 20


def test_sizes_that_never_repeat_hold_about_one_block(fresh_cache):
    for i in range(40):  # 1, 1.5, 2.25 ... MiB: never within a cached block's slack
        made = _memory.AlignedBuffer(int((1 << 20) * 1.5 ** (i % 12)) + i * 4096, 64)
        del made
        assert _memory.buffer_cache_stats()["blocks"] <= 1
    _memory.release_buffer_cache(0)
    assert _memory.buffer_cache_stats()["blocks"] == 0
    made = _memory.AlignedBuffer(2 << 20, 64)
    del made
    assert _memory.buffer_cache_stats()["blocks"] == 0


@pytest.mark.skipif(not hasattr(os, "sysconf") or "SC_PHYS_PAGES" not in getattr(os, "sysconf_names", {}),
                    reason="no sysconf(_SC_PHYS_PAGES) to compare with")
def test_the_default_cap_is_a_quarter_of_physical_memory():
    """A quarter, not min(RAM/8, 2 GiB): a 4 GiB model loaded again in a long-lived process
    gets its freed arena back instead of populating fresh memory (csrc/buffers.c)."""
    import subprocess

    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__)))
    env = {k: v for k, v in os.environ.items() if k != "APRFAST_BUFFER_CACHE"}
    env["PYTHONPATH"] = package_parent
    out = subprocess.run([sys.executable, "-c", "from aprfast import _memory; s = _memory.buffer_cache_stats(); "
                          "print(s['limit'], s['heap_limit'])"],
                         env=env, capture_output=True, text=True, timeout=60, check=True,
                         cwd=package_parent).stdout
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    limit, heap_limit = map(int, out.split())
    assert limit == physical // 4
    assert heap_limit == min(physical // 8, 2 << 30)  # heap blocks keep the old cap


def test_the_environment_sets_the_cap():
    import subprocess

    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__)))
    env = dict(os.environ, PYTHONPATH=package_parent, APRFAST_BUFFER_CACHE="12345")
    out = subprocess.run([sys.executable, "-c", "from aprfast import _memory; "
                          "print(_memory.buffer_cache_stats()['limit'])"],
                         env=env, capture_output=True, text=True, timeout=60, check=True,
                         # not the checkout's root: its aprfast/ (no compiled modules when the
                         # tests run against an installed wheel) would shadow PYTHONPATH
                         cwd=package_parent).stdout
    assert out.strip() == "12345"


def test_threads_allocating_and_freeing_keep_every_buffer_distinct(fresh_cache):

    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(200):
            held = [_memory.AlignedBuffer(int(rng.integers(256 << 10, 1 << 20)), 64) for _ in range(4)]
            for i, b in enumerate(held):
                np.frombuffer(b, np.uint8)[:] = seed * 4 + i
            for i, b in enumerate(held):
                if not (np.frombuffer(b, np.uint8) == (seed * 4 + i) % 256).all():
                    errors.append(seed)

    _run_threads(work, 4)
    assert errors == []


def test_small_blocks_stay_resident_up_to_a_cap_and_mapped_ones_are_advised(fresh_cache):
    # MADV_FREE on every cached 2.5 MiB block cost more than the copy it served; heap
    # blocks are kept resident (as glibc keeps its freed chunks) up to a cap.  Decay 0:
    # the advice is given as a block is freed (the deferred advice is tested below)
    _memory.set_buffer_decay(0)
    small = [_memory.AlignedBuffer(3 << 20, 64) for _ in range(2)]
    del small
    stats = _memory.buffer_cache_stats()
    assert stats["blocks"] == 2 and stats["resident"] == stats["bytes"] >= 6 << 20
    big = _memory.AlignedBuffer(40 << 20, 64)  # a mapped (huge-page) block: advised when cached
    del big
    stats = _memory.buffer_cache_stats()
    # (its allocation missed the cache, which gave back the oldest small block)
    assert stats["blocks"] == 2 and 3 << 20 <= stats["resident"] < 4 << 20 and stats["bytes"] >= 43 << 20
    again = _memory.AlignedBuffer(3 << 20, 64)
    assert _memory.buffer_cache_stats()["resident"] < stats["resident"]
    del again
    count = _memory.BUFFER_CACHE_RESIDENT // (3 << 20) + 4
    many = [_memory.AlignedBuffer(3 << 20, 64) for _ in range(count)]
    del many
    assert _memory.buffer_cache_stats()["resident"] <= _memory.BUFFER_CACHE_RESIDENT


def _run_threads(work, n) -> None:
    """``work(k)`` on ``n`` threads at once, k = 0..n-1, and wait for them all."""
    import threading

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _cache_once(done, timeout=30.0) -> dict:
    """The buffer cache's stats once ``done(stats)`` holds (the helper thread's advice
    comes in its own time), or as they are after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    stats = _memory.buffer_cache_stats()
    while not done(stats) and time.monotonic() < deadline:
        time.sleep(0.02)
        stats = _memory.buffer_cache_stats()
    return stats


needs_decay = pytest.mark.skipif(sys.platform == "win32", reason="Windows gives MEM_RESET as a block is freed")


@needs_decay
def test_a_mapped_block_stays_resident_until_its_advice_is_due(fresh_cache):
    # a loop that frees and takes the same large block again must not pay MADV_FREE and
    # the dirty-bit faults after it on every call; the advice comes when the block has
    # waited decay_ms unused, from a helper thread, and the block is still cached then
    assert fresh_cache["decay_ms"] > 0
    _memory.set_buffer_decay(60_000)
    big = _memory.AlignedBuffer(40 << 20, 64)
    address = big.address
    del big
    stats = _memory.buffer_cache_stats()
    assert stats["blocks"] == 1 and stats["resident"] == stats["deferred"] == stats["bytes"] >= 40 << 20
    again = _memory.AlignedBuffer(40 << 20, 64)  # taken again before it was due: resident, not advised
    assert again.address == address
    assert _memory.buffer_cache_stats()["deferred"] == 0
    np.frombuffer(again, np.uint8)[:] = 7
    _memory.set_buffer_decay(50)
    del again
    # the helper takes the block out of the cache while it advises it, then puts it back:
    # wait for the end state, not the moment it is out
    stats = _cache_once(lambda st: not st["deferred"] and st["blocks"] == 1)
    assert stats["deferred"] == 0 and stats["resident"] == 0 and stats["blocks"] == 1, stats
    again = _memory.AlignedBuffer(40 << 20, 64)  # advised, still cached, and usable
    assert again.address == address
    view = np.frombuffer(again, np.uint8)
    view[:] = 9
    assert (view == 9).all()


@needs_decay
def test_advice_given_while_other_threads_take_and_free_blocks_never_loses_their_writes(fresh_cache):
    # the helper thread takes a due block out of the cache before advising it: advice
    # given to a block another thread holds would discard what that thread wrote

    _memory.set_buffer_decay(1)
    errors = []

    def work(seed):
        for i in range(40):
            buf = _memory.AlignedBuffer((33 << 20) + (i % 2) * (1 << 20), 64)
            view = np.frombuffer(buf, np.uint8)
            view[::4096] = (seed * 31 + i) % 251
            time.sleep(0.002)
            if not (view[::4096] == (seed * 31 + i) % 251).all():
                errors.append((seed, i))
            del view, buf

    _run_threads(work, 3)
    assert errors == []


@needs_decay
def test_releasing_the_cache_drops_blocks_waiting_for_advice(fresh_cache):
    _memory.set_buffer_decay(60_000)
    big = _memory.AlignedBuffer(40 << 20, 64)
    del big
    assert _memory.buffer_cache_stats()["deferred"] >= 40 << 20
    _memory.release_buffer_cache(fresh_cache["limit"])
    stats = _memory.buffer_cache_stats()
    assert stats["blocks"] == stats["deferred"] == stats["resident"] == 0


@needs_decay
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_advises_its_own_blocks(fresh_cache):
    # the helper thread does not survive fork(); the child starts its own
    import multiprocessing

    _memory.set_buffer_decay(60_000)
    big = _memory.AlignedBuffer(40 << 20, 64)
    del big  # the parent's helper thread now sleeps for a minute

    def child(q):
        _memory.set_buffer_decay(20)
        b = _memory.AlignedBuffer(48 << 20, 64)
        del b
        q.put(_cache_once(lambda st: not st["deferred"])["deferred"])

    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    try:
        assert q.get(timeout=60) == 0
    finally:
        p.join(60)
    assert p.exitcode == 0


@pytest.mark.parametrize("bad", [-1, -1000])
def test_a_negative_decay_is_refused(bad):
    with pytest.raises(ValueError, match="milliseconds"):
        _memory.set_buffer_decay(bad)


def test_cached_blocks_keep_what_each_thread_writes(fresh_cache):
    # frees and allocations race on the cache from many threads; each block's contents
    # must be exactly what its owner wrote until its owner frees it

    errors = []

    def work(seed):
        for i in range(60):
            size = (1 << 20) + (i % 3) * (1 << 20)
            buf = _memory.AlignedBuffer(size, 64)
            view = np.frombuffer(buf, np.uint8)
            view[:] = (seed * 31 + i) % 251
            if not (view == (seed * 31 + i) % 251).all():
                errors.append((seed, i))
            del view, buf

    _run_threads(work, 6)
    assert errors == []
    assert _memory.buffer_cache_stats()["hits"] > fresh_cache["hits"]


def test_the_newest_of_equal_fits_is_handed_back_first(fresh_cache):
    # LIFO among equal fits, as glibc reuses its last freed chunk: the block just freed
    # is resident and in the CPU's caches; the oldest may have had its pages advised away
    first, second, third = (_memory.AlignedBuffer(3 << 20, 64) for _ in range(3))
    newest = third.address
    del first, second, third
    again = _memory.AlignedBuffer(3 << 20, 64)
    assert again.address == newest
