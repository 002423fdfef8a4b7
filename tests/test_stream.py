"""aprfast.stream(): a v2 file read front to back from pipes, sockets, memory and paths.

Whatever ``aprfast.open`` gives, ``stream`` gives (names, dtypes, shapes, bytes), for
both layouts, packed, 0-d and empty tensors; from a real OS pipe, a child process's
stdout, a socket pair and io.BytesIO; in bounded memory; and every cut or flipped byte
ends the iteration with a typed AprError, never a crash or a hang.
"""

import io
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aprfast
from aprfast import (
    AprError,
    ChecksumError,
    CorruptError,
    LayoutError,
    LimitError,
    QuantizedTensor,
    RawTensor,
    UnknownDTypeError,
)

MiB = 1 << 20
LAYOUTS = ["aprender", "apr2"]
PACKED = {"aprender": "APR_Q4", "apr2": "Q8_0"}


def sample(layout: str) -> dict:
    rng = np.random.default_rng(7)
    return {
        "blocks.0.weight": rng.standard_normal((4, 16)).astype(np.float32),
        "blocks.1.bias": rng.standard_normal(16).astype(np.float16),
        "counts": np.arange(-3, 9, dtype=np.int64).reshape(3, 4),
        "empty": np.zeros((0, 5), np.float32),
        "packed": aprfast.quantize(rng.standard_normal((2, 256)).astype(np.float32), PACKED[layout]),
        "scalar": np.array(2.5, np.float64),
        "tokens": rng.integers(0, 255, 37, dtype=np.uint8),
    }


def saved(layout: str, tensors=None, metadata=None) -> bytes:
    return aprfast.save(sample(layout) if tensors is None else tensors, metadata or {"name": "s"}, layout=layout)


def raw_bytes(tensor) -> bytes:
    if isinstance(tensor, RawTensor):
        return tensor.data.tobytes()
    return np.ascontiguousarray(tensor).view(np.uint8).tobytes() if tensor.size else b""


def assert_same_as_open(data: bytes, pairs: list, in_index_order: bool = True) -> None:
    """``pairs`` (what stream yielded) hold exactly what open() gives, each tensor an
    owned, writable, 64-byte-aligned copy like get_tensor(copy=True)."""
    with aprfast.open(data) as f:
        names = [name for name, _ in pairs]
        assert sorted(names) == sorted(f.keys())
        if in_index_order:
            assert names == f.keys()
        for name, got in pairs:
            want = f.get_tensor(name, copy=True)
            assert type(got) is type(want), name
            if isinstance(want, RawTensor):
                assert (got.dtype, got.shape) == (want.dtype, want.shape), name
                assert got.data.flags.writeable and got.data.ctypes.data % 64 == 0
            else:
                assert (got.dtype, got.shape) == (want.dtype, want.shape), name
                assert got.flags.writeable and got.ctypes.data % 64 == 0, name
            assert raw_bytes(got) == raw_bytes(want), name


# --- same as open(), from every kind of source ------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_from_bytesio_gives_what_open_gives(layout):
    data = saved(layout)
    s = aprfast.stream(io.BytesIO(data))
    assert s.layout == layout and len(s) == 7 and s.metadata["name"] == "s"
    pairs = list(s)
    assert_same_as_open(data, pairs)
    assert s.verified
    assert s.header == aprfast.inspect(data)["header"]
    assert s.describe() == aprfast.inspect(data)["tensors"]
    assert isinstance(dict(pairs)["packed"], QuantizedTensor)
    assert dict(pairs)["scalar"].shape == () and dict(pairs)["empty"].shape == (0, 5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_from_bytes_and_from_a_path(layout, tmp_path):
    data = saved(layout)
    assert_same_as_open(data, list(aprfast.stream(data)))
    path = tmp_path / "m.apr"
    path.write_bytes(data)
    with aprfast.stream(path) as s:
        assert_same_as_open(data, list(s))
        assert s.verified
    with aprfast.stream(str(path)) as s:  # abandoned after one tensor: the file is closed anyway
        next(s)


def pipe_with_writer(data: bytes, chunk: int = 1000):
    """The read end of a real OS pipe that a thread fills with ``data`` in small writes."""
    r, w = os.pipe()

    def feed():
        with os.fdopen(w, "wb", buffering=0) as out:
            for i in range(0, len(data), chunk):
                out.write(data[i:i + chunk])

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    return os.fdopen(r, "rb"), thread


@pytest.mark.parametrize("layout", LAYOUTS)
def test_from_a_real_os_pipe(layout):
    data = saved(layout)
    reader, thread = pipe_with_writer(data)
    with reader:
        pairs = list(aprfast.stream(reader))
    thread.join(10)
    assert_same_as_open(data, pairs)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_from_a_raw_unbuffered_pipe_descriptor(layout):
    data = saved(layout)
    r, w = os.pipe()
    thread = threading.Thread(target=lambda: (os.write(w, data), os.close(w)), daemon=True)
    thread.start()
    with os.fdopen(r, "rb", buffering=0) as reader:  # FileIO: short reads of what the pipe holds
        pairs = list(aprfast.stream(reader))
    thread.join(10)
    assert_same_as_open(data, pairs)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_from_a_child_process_stdout(layout, tmp_path):
    data = saved(layout)
    path = tmp_path / "m.apr"
    path.write_bytes(data)
    script = ("import sys\nwith open(sys.argv[1], 'rb') as f:\n    while chunk := f.read(777):\n"
              "        sys.stdout.buffer.write(chunk)\n        sys.stdout.buffer.flush()\n")
    child = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE,
                             cwd=tempfile.gettempdir())
    try:
        pairs = list(aprfast.stream(child.stdout))
    finally:
        child.stdout.close()
        assert child.wait(30) == 0
    assert_same_as_open(data, pairs)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["makefile", "socket"])
def test_from_a_socket_pair(layout, kind):
    data = saved(layout)
    a, b = socket.socketpair()

    def send():
        with a:
            a.sendall(data)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    with b:
        if kind == "makefile":
            with b.makefile("rb") as f:
                pairs = list(aprfast.stream(f))
        else:
            pairs = list(aprfast.stream(b))  # recv_into
    thread.join(10)
    assert_same_as_open(data, pairs)


class ReadOnly:
    """A stream with nothing but read(n), like some HTTP bodies."""

    def __init__(self, data: bytes, most: int = 5000):
        self._f = io.BytesIO(data)
        self._most = most

    def read(self, n=-1):
        return self._f.read(min(n, self._most))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_from_an_object_with_only_read(layout):
    data = saved(layout)
    assert_same_as_open(data, list(aprfast.stream(ReadOnly(data))))


def test_unknown_inputs_and_options_are_refused():
    with pytest.raises(TypeError, match="no readinto"):
        aprfast.stream(object())
    with pytest.raises(ValueError, match="unknown_dtypes"):
        aprfast.stream(saved("apr2"), unknown_dtypes="maybe")
    with pytest.raises(aprfast.AprIOError, match="cannot open"):
        aprfast.stream("/nonexistent/dir/m.apr")


def test_a_text_stream_is_refused_typed():
    with pytest.raises(TypeError, match="binary mode"):
        aprfast.stream(io.StringIO("APR2"))


def test_unknown_dtype_ids_fail_up_front_or_come_back_raw():
    data = bytearray(aprfast.save({"w": np.arange(4, dtype=np.uint8)}, layout="apr2"))
    at = aprfast.inspect(bytes(data))["header"]["index_offset"] + 8 + 2 + 1
    data[at] = 99
    # Fix the footer CRC so only the dtype id is unusual.
    data[-16:-12] = struct.pack("<I", aprfast.crc32(bytes(data[:-16])))
    with pytest.raises(UnknownDTypeError, match="99"):
        aprfast.stream(bytes(data))
    (name, got), = list(aprfast.stream(bytes(data), unknown_dtypes="raw"))
    assert name == "w" and isinstance(got, RawTensor) and got.dtype_id == 99
    assert got.data.tobytes() == bytes(range(4))


# --- order ----------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_data_out_of_index_order_is_yielded_in_data_order(layout):
    tensors = sample(layout)
    order = ["tokens", "empty", "blocks.1.bias", "scalar", "packed", "counts", "blocks.0.weight"]
    out = io.BytesIO()
    with aprfast.Writer(out, {"name": "s"}, plan=[(n, _dtype(tensors[n]), tensors[n].shape) for n in order],
                        layout=layout) as w:
        for name in order:
            w.add(name, tensors[name])
    data = out.getvalue()
    pairs = list(aprfast.stream(data))
    assert [n for n, _ in pairs if n != "empty"] == [n for n in order if n != "empty"]
    assert_same_as_open(data, pairs, in_index_order=False)


def _dtype(tensor):
    return tensor.dtype.name if isinstance(tensor, RawTensor) else tensor.dtype


# --- integrity: what is checked, and when ----------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_flipped_data_byte_raises_checksum_error_at_the_end(layout):
    data = bytearray(saved(layout))
    offset = aprfast.inspect(bytes(data))["tensors"]["tokens"]["offset"]
    data[offset + 3] ^= 0x10
    s = aprfast.stream(bytes(data))
    names = []
    with pytest.raises(ChecksumError, match="footer CRC32"):
        for name, _ in s:
            names.append(name)
    assert len(names) == 7  # every tensor was yielded: the CRC is only known at the end
    assert not s.verified
    with pytest.raises(ChecksumError):  # a failed stream stays failed
        next(s)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_verify_false_skips_the_crc_but_not_the_footer(layout):
    data = bytearray(saved(layout))
    offset = aprfast.inspect(bytes(data))["tensors"]["tokens"]["offset"]
    data[offset] ^= 1
    s = aprfast.stream(bytes(data), verify=False)
    assert len(list(s)) == 7 and not s.verified
    with pytest.raises(CorruptError):
        list(aprfast.stream(bytes(data) + b"\0" * 64, verify=False))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_flipped_byte_raises_a_typed_error_by_the_end(layout):
    data = saved(layout, {"a": np.arange(6, dtype=np.float32), "b": np.zeros((2, 0), np.int8),
                          "c": np.array(7, np.int32)})
    for at in range(len(data)):
        for bit in (0x01, 0x80):
            bad = bytearray(data)
            bad[at] ^= bit
            with pytest.raises(AprError):
                s = aprfast.stream(bytes(bad))
                for _ in s:
                    pass


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_truncation_raises_a_typed_error(layout):
    data = saved(layout)
    for cut in range(len(data)):
        with pytest.raises(AprError) as info:
            list(aprfast.stream(io.BytesIO(data[:cut])))
        if cut >= 4:
            assert isinstance(info.value, CorruptError), (cut, info.value)
            assert "stream ended" in str(info.value) or "footer says" in str(info.value), (cut, info.value)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bytes_after_the_footer_raise(layout):
    data = saved(layout)
    for extra in (b"\0", b"x" * 17, b"\0" * 5000):
        with pytest.raises(CorruptError):
            list(aprfast.stream(io.BytesIO(data + extra)))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_pipe_closed_early_ends_with_an_error_not_a_hang(layout):
    data = saved(layout)
    reader, thread = pipe_with_writer(data[:len(data) - 40])
    with reader, pytest.raises(CorruptError, match="stream ended after"):
        list(aprfast.stream(reader))
    thread.join(10)


def test_finish_reads_the_rest_without_building_tensors_and_checks_the_crc():
    data = bytearray(saved("aprender"))
    s = aprfast.stream(bytes(data))
    first = next(s)
    s.finish()
    assert first[0] == "blocks.0.weight" and s.verified
    with pytest.raises(StopIteration):
        next(s)
    data[-1] ^= 1
    with pytest.raises(ChecksumError):
        aprfast.stream(bytes(data)).finish()


# --- limits: checked before anything is read or allocated -------------------------------------
def header_only_pipe(head: bytes):
    """A pipe holding ``head`` whose writer stays open: reading past ``head`` would block.
    A watchdog closes it after 20 s, so a wrong implementation fails instead of hanging."""
    r, w = os.pipe()
    os.write(w, head)
    watchdog = threading.Timer(20, os.close, (w,))
    watchdog.start()
    return os.fdopen(r, "rb", buffering=0), watchdog


def test_a_huge_metadata_claim_is_a_limit_error_before_reading_on():
    head = bytearray(saved("apr2")[:32])
    head[16:20] = struct.pack("<I", 2**32 - 1)  # metadata_size
    reader, watchdog = header_only_pipe(bytes(head))
    with reader, pytest.raises(LimitError, match="MAX_METADATA_SIZE"):
        aprfast.stream(reader)
    assert watchdog.is_alive()  # refused at once, not when the watchdog closed the pipe
    watchdog.cancel()
    watchdog.function(*watchdog.args)


def test_a_huge_prefix_claim_is_a_limit_error_before_reading_on():
    data = saved("apr2")
    head = bytearray(data[:32])
    head[28:32] = struct.pack("<I", 2**32 - 64)  # data_offset: far beyond metadata + index
    reader, watchdog = header_only_pipe(bytes(head))
    with reader, pytest.raises(LimitError, match="holds everything before it"):
        aprfast.stream(reader)
    watchdog.cancel()
    watchdog.function(*watchdog.args)


def test_the_index_limit_applies_to_streams():
    data = saved("aprender")
    with pytest.raises(LimitError, match="MAX_INDEX_SIZE"):
        aprfast.stream(data, limits=aprfast.Limits(max_index_size=64))
    with pytest.raises(LimitError, match="MAX_TENSOR_COUNT"):
        aprfast.stream(data, limits=aprfast.Limits(max_tensor_count=3))


def test_a_prefix_claim_within_limits_grows_only_as_bytes_arrive():
    head = bytearray(saved("apr2")[:32])
    head[16:20] = struct.pack("<I", 60 * MiB)  # metadata_size: allowed, but never sent
    head[20:24] = struct.pack("<I", 32 + 60 * MiB)  # index_offset, and index_size 8:
    head[24:28] = struct.pack("<I", 8)
    head[28:32] = struct.pack("<I", 32 + 60 * MiB + 64)  # a 60 MiB prefix the header may claim
    tracemalloc.start()
    try:
        with pytest.raises(CorruptError, match="stream ended after 32 bytes"):
            aprfast.stream(io.BytesIO(bytes(head)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * MiB, peak


# --- memory --------------------------------------------------------------------------------
def big_model(path, tensors: int = 16, each: int = 4 * MiB) -> None:
    items = {f"layer.{i:02d}": np.full(each // 4, i, np.float32) for i in range(tensors)}
    aprfast.save_file(items, path)


def test_python_objects_stay_small_while_streaming_64_mib_through_read(tmp_path):
    path = tmp_path / "big.apr"
    big_model(path)
    with open(path, "rb") as fh:
        data_source = ReadOnlyFile(fh)
        tracemalloc.start()
        try:
            count = 0
            for name, tensor in aprfast.stream(data_source):
                assert tensor[0] == int(name.split(".")[1])
                count += 1
                del tensor
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert count == 16
    # Tensors live in C-allocated aligned buffers (not traced); what Python holds is
    # the read() chunks and the prefix: nowhere near the 64 MiB file.
    assert peak < 4 * MiB, peak


class ReadOnlyFile:
    def __init__(self, fh):
        self._fh = fh

    def read(self, n):
        return self._fh.read(n)


MEASURE_STREAM = r"""
import json, sys
import aprfast

def high_water_kib():
    # VmHWM belongs to this process's own address space; ru_maxrss carries the parent's
    # peak over through fork and exec (the pytest process's), hiding any growth below it.
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))

before = high_water_kib()
count = 0
for name, tensor in aprfast.stream(sys.stdin.buffer):
    count += 1
    del tensor
print(json.dumps({"count": count, "growth_kib": high_water_kib() - before}))
"""


@pytest.mark.peak_memory
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status VmHWM is Linux's")
def test_peak_rss_through_a_pipe_is_about_one_tensor_not_the_file(tmp_path):
    path = tmp_path / "big.apr"
    big_model(path)  # 64 MiB in 16 tensors of 4 MiB
    import aprfast as package

    # glibc's mmap threshold rises to the largest block freed, after which freed tensors
    # stay in its heap in a pattern that depends on what ran before (33 MiB once in CI);
    # pinning it measures what the stream holds, not the allocator's caching.
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(package.__file__))),
               MALLOC_MMAP_THRESHOLD_=str(MiB))
    child = subprocess.Popen([sys.executable, "-c", MEASURE_STREAM], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=env, cwd=tempfile.gettempdir())
    with open(path, "rb") as fh:
        while chunk := fh.read(MiB):
            child.stdin.write(chunk)
    child.stdin.close()
    out = child.stdout.read()
    child.stdout.close()
    assert child.wait(60) == 0
    report = json.loads(out)
    assert report["count"] == 16
    # One 4 MiB tensor at a time (the stream drops its reference when it yields), plus
    # constant buffers: measured 3.9 MiB.
    assert report["growth_kib"] * 1024 < 12 * MiB, report


# --- properties ----------------------------------------------------------------------------
DTYPES = {"aprender": [np.float32, np.float16, np.float64, np.int8, np.int32, np.int64, np.uint8],
          "apr2": [np.float32, np.float16, np.int16, np.uint16, np.uint64, np.bool_, np.int8]}


@st.composite
def models(draw):
    layout = draw(st.sampled_from(LAYOUTS))
    names = draw(st.lists(st.text(st.characters(codec="utf-8"), min_size=0, max_size=6), unique=True,
                          max_size=6))
    tensors = {}
    for name in names:
        dtype = np.dtype(draw(st.sampled_from(DTYPES[layout])))
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        seed = draw(st.integers(0, 2**32 - 1))
        values = np.random.default_rng(seed).integers(0, 256, int(np.prod(shape)) * dtype.itemsize, np.uint8)
        tensors[name] = values.view(dtype).reshape(shape)
    return layout, tensors


@settings(max_examples=60, deadline=None)
@given(models(), st.integers(1, 97))
def test_stream_round_trips_what_save_wrote(model, chunk):
    layout, tensors = model
    data = aprfast.save(tensors, {"k": 1}, layout=layout)
    pairs = list(aprfast.stream(ReadOnly(data, chunk)))
    assert_same_as_open(data, pairs)
    assert {n: raw_bytes(t) for n, t in pairs} == {n: raw_bytes(np.asarray(t)) for n, t in tensors.items()}


@settings(max_examples=40, deadline=None)
@given(models(), st.randoms(use_true_random=False))
def test_planned_writer_in_any_order_streams_back_in_that_order(model, random):
    layout, tensors = model
    order = list(tensors)
    random.shuffle(order)
    out = io.BytesIO()
    with aprfast.Writer(out, plan=[(n, tensors[n].dtype, tensors[n].shape) for n in order], layout=layout) as w:
        for name in order:
            w.add(name, tensors[name])
    pairs = list(aprfast.stream(out.getvalue()))
    nonempty = [n for n in order if tensors[n].nbytes]
    assert [n for n, _ in pairs if n in nonempty] == nonempty
    assert_same_as_open(out.getvalue(), pairs, in_index_order=False)
    if order == sorted(order):
        assert out.getvalue() == aprfast.save(tensors, layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_huge_tensor_claim_in_a_stream_of_unknown_length_ends_typed(layout):
    """The index may declare a 1 TiB tensor (a stream's length is unknown, so extents
    cannot be checked against it): allocating is refused (LimitError), or the buffer is
    mapped lazily and the stream's end is reported; memory is never filled."""
    out = io.BytesIO()
    w = aprfast.Writer(out, plan=[("huge", np.uint8, (1 << 40,))], layout=layout)
    with pytest.raises(LayoutError):
        w.close()  # never added: the output is the prefix alone
    with pytest.raises((LimitError, CorruptError)):
        list(aprfast.stream(io.BytesIO(out.getvalue())))
    with pytest.raises(CorruptError):  # a known length refuses it at once, from the index
        aprfast.stream(out.getvalue())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_prefix_of_several_mib_is_read_in_steps_through_a_pipe(layout):
    """Metadata of 3 MiB: the prefix is read in 1 MiB steps, then parsed whole."""
    metadata = {"name": "big", "notes": "x" * (3 * MiB)}
    tensors = {f"w{i}": np.full(10, i, np.int32) for i in range(3)}
    data = aprfast.save(tensors, metadata, layout=layout)
    reader, thread = pipe_with_writer(data, chunk=100_000)
    with reader:
        s = aprfast.stream(reader)
        assert s.metadata["notes"] == metadata["notes"]
        pairs = list(s)
    thread.join(10)
    assert_same_as_open(data, pairs)
