"""Review 2026-11 N7: ``aprfast.stream`` of an uncompressed APR2 stream whose index
declares a huge tensor allocated (and touched) the declared size before it found the
stream short: a 49 KB file declaring float32 [2**30] cost 4 GiB.  A tensor's buffer is
now made only for bytes that are there (from a stream of unknown length: pieces first,
the buffer once a third has arrived)."""

import importlib
import io
import struct
import sys
import zlib

import numpy as np
import pytest

import aprfast
from aprfast.errors import CorruptError

apr_stream = importlib.import_module("aprfast.stream")  # the module (aprfast.stream is the function)

N = 12345


def declaring(elements: int) -> bytes:
    """A valid one-tensor APR2 file of float32 [N] whose index now says [elements]
    (shape and sizes patched, footer CRC recomputed): the stream is far too short."""
    data = aprfast.save({"w": np.zeros(N, np.float32)})
    out = bytearray(data)
    for i in range(len(data) - 8):
        value = struct.unpack_from("<Q", data, i)[0]
        if value == N:
            struct.pack_into("<Q", out, i, elements)
        elif value == N * 4:
            struct.pack_into("<Q", out, i, elements * 4)
    struct.pack_into("<I", out, len(out) - 16, zlib.crc32(bytes(out[:-16])))
    return bytes(out)


class ReadOnly:
    """A file object with read() only (no readinto, no length)."""

    def __init__(self, data: bytes):
        self._f = io.BytesIO(data)

    def read(self, n=-1):
        return self._f.read(n)


@pytest.mark.peak_memory
@pytest.mark.parametrize("how", ["BytesIO", "read() only", "a pipe"])
def test_a_declared_size_costs_nothing_until_its_bytes_arrive(tmp_path, run_child, how):
    (tmp_path / "s.bin").write_bytes(declaring(1 << 28))  # 1 GiB declared, ~49 KB there
    script = """
import io, os, resource, sys, threading, time, aprfast
raw = open(sys.argv[1], "rb").read()
how = sys.argv[2]
class ReadOnly:
    def __init__(self, data): self._f = io.BytesIO(data)
    def read(self, n=-1): return self._f.read(n)
if how == "a pipe":
    r, w = os.pipe()
    def feed():
        os.write(w, raw)
        os.close(w)
    threading.Thread(target=feed, daemon=True).start()
    source = os.fdopen(r, "rb")
else:
    source = io.BytesIO(raw) if how == "BytesIO" else ReadOnly(raw)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.process_time()
try:
    with aprfast.stream(source) as s:
        list(s)
    print("read")
except aprfast.CorruptError as e:
    print("CorruptError" if "stream ended" in str(e) else str(e))
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024, time.process_time() - t)
"""
    done = run_child(script, tmp_path / "s.bin", how)
    assert done.returncode == 0, done.stderr
    outcome, numbers = done.stdout.split("\n", 1)
    grown, cpu = numbers.split()
    assert outcome == "CorruptError"
    assert int(grown) < 16, f"peak RSS grew {grown} MiB for a {len(declaring(1 << 28))}-byte stream"
    assert float(cpu) < 1


def test_the_error_names_where_the_tensor_ends():
    import re
    data = declaring(1 << 30)
    with pytest.raises(CorruptError, match=rf"stream ended after {len(data)} bytes while reading tensor 'w'") as error:
        with aprfast.stream(io.BytesIO(data)) as s:
            list(s)
    end = int(re.search(r"which runs to byte (\d+)", str(error.value)).group(1))
    assert (1 << 32) < end < (1 << 32) + len(data)  # the tensor's end, not a piece's


def test_a_stream_that_stops_inside_a_piece_holds_little(monkeypatch):
    """What is held while the stream is short is a bounded multiple of what arrived."""
    made = []
    real = apr_stream._allocate
    monkeypatch.setattr(apr_stream, "_allocate", lambda name, size, path: made.append(size) or real(name, size, path))
    data = aprfast.save({"w": np.arange(4 << 20, dtype=np.float32)})  # 16 MiB tensor
    cut = data[:len(data) // 8]  # ~2 MiB of it arrives
    with pytest.raises(CorruptError, match="stream ended"):
        with aprfast.stream(io.BytesIO(cut)) as s:
            list(s)
    assert sum(made) <= 4 * len(cut), made


@pytest.mark.parametrize("size", [(1 << 20) - 4, (1 << 20) + 4, 3 << 20, (24 << 20) + 8])
@pytest.mark.parametrize("wrap", [io.BytesIO, ReadOnly, bytes], ids=["BytesIO", "read() only", "bytes"])
def test_honest_tensors_stream_unchanged(size, wrap):
    rng = np.random.default_rng(size)
    tensors = {"a": rng.integers(0, 255, size, dtype=np.uint8), "b": np.arange(10, dtype=np.float32),
               "c": rng.integers(0, 255, size + 3, dtype=np.uint8)}
    data = aprfast.save(tensors)
    with aprfast.stream(wrap(data)) as s:
        got = {}
        for name, value in s:
            assert value.ctypes.data % 64 == 0 and value.flags.writeable  # as get_tensor(copy=True) gives
            got[name] = value
        assert s.verified
    assert {k: v.tobytes() for k, v in got.items()} == {k: v.tobytes() for k, v in tensors.items()}


def test_a_known_length_input_fills_one_buffer(tmp_path, monkeypatch):
    """A file or a buffer holds the bytes: one allocation per tensor, no pieces."""
    made = []
    real = apr_stream._allocate
    monkeypatch.setattr(apr_stream, "_allocate", lambda name, size, path: made.append(size) or real(name, size, path))
    data = aprfast.save({"w": np.zeros(8 << 20, np.uint8)})
    (tmp_path / "m.apr").write_bytes(data)
    for source in (tmp_path / "m.apr", data):
        made.clear()
        with aprfast.stream(source) as s:
            list(s)
        assert made == [8 << 20], made


@pytest.mark.skipif(sys.platform == "win32", reason="os.pipe + threads")
def test_a_short_pipe_ends_typed(tmp_path):
    import os
    import threading
    data = aprfast.save({"w": np.ones(2 << 20, np.float32)})[:3 << 20]
    r, w = os.pipe()

    def feed():
        os.write(w, data)
        os.close(w)

    threading.Thread(target=feed, daemon=True).start()
    with os.fdopen(r, "rb") as f, pytest.raises(CorruptError, match="stream ended"):
        with aprfast.stream(f) as s:
            list(s)
