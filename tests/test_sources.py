"""Sources: one open per call, small header reads served from one pread, and no
descriptor leaked when a path cannot become a source."""

import os

import numpy as np
import pytest

import aprfast
from aprfast.errors import AprIOError
from aprfast.io import sources


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def small_file(tmp_path):
    path = tmp_path / "m.apr"
    aprfast.save_file({f"t{i}": np.full((4, 8), i, np.float32) for i in range(20)}, path)
    return path


def test_inspect_opens_the_file_once(small_file, monkeypatch):
    calls = []
    real_open = os.open
    monkeypatch.setattr(sources.os, "open", lambda *a, **k: calls.append(a[0]) or real_open(*a, **k))
    info = aprfast.inspect(small_file)
    assert len(info["tensors"]) == 20
    assert calls == [str(small_file)]


def test_header_reads_come_from_one_pread(small_file, monkeypatch):
    reads = []
    real = sources._memory.pread_into

    def counting(fd, offset, out, *args):
        reads.append((offset, len(out)))
        return real(fd, offset, out, *args)

    monkeypatch.setattr(sources._memory, "pread_into", counting)
    with aprfast.open(small_file, mode="pread") as f:
        assert f.keys() == sorted(f"t{i}" for i in range(20))
        assert f.metadata is not None
    # the head (header, metadata, index), then the footer unless the head held it too
    size = os.path.getsize(small_file)
    assert reads[0] == (0, min(size, sources.FileSource.HEAD))
    assert len(reads) == (1 if size <= sources.FileSource.HEAD else 2)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to count descriptors")
def test_a_fifo_path_is_refused_without_leaking_its_descriptor(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # so opening it for reading cannot block
    try:
        before = _open_fds()
        for _ in range(5):
            with pytest.raises(AprIOError, match="pipe"):
                aprfast.open(fifo)
        assert _open_fds() == before
    finally:
        os.close(writer)


def test_reads_past_the_head_still_read_the_file(tmp_path):
    path = tmp_path / "big_index.apr"
    tensors = {f"tensor.with.a.long.name.{i:05d}": np.full(3, i, np.int32) for i in range(2000)}
    aprfast.save_file(tensors, path)
    with aprfast.open(path, mode="pread") as f:
        assert len(f) == 2000
        np.testing.assert_array_equal(f.get_tensor("tensor.with.a.long.name.01999"), np.full(3, 1999, np.int32))


def test_repeated_views_are_new_arrays_over_the_same_bytes(small_file):
    with aprfast.open(small_file) as f:
        first = f.get_tensor("t3")
        first.shape = (first.size,)  # reshaping one handed-out array in place...
        again = f.get_tensor("t3")
        assert again.shape == (4, 8)  # ...does not reshape the next one
        assert again is not first and np.shares_memory(again, first) and not again.flags.writeable
        np.testing.assert_array_equal(again, np.full((4, 8), 3, np.float32))
        copy = f.get_tensor("t3", copy=True)
        assert copy.flags.owndata or not np.shares_memory(copy, again)
    with pytest.raises(AprIOError, match="closed"):
        f.get_tensor("t3")
