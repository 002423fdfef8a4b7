"""Bounds on what the tensor index may cost and declare (issue 8, findings 5, 6 and 9).

* Memory and time: opening a 1,000,000-entry index, listing its names and reading one
  tensor costs about three times the index (the index bytes, plus the list of str that
  ``keys()`` hands back); a bad or duplicate entry fails at that entry, costing at most
  the index bytes, however many entries follow.  Measured in child processes, so the
  peak is the reader's alone.
* Shapes: no tensor may declare non-zero dims whose product, times its item size (the
  float32 a packed type dequantizes to), passes 2**62, even when another dim is 0:
  refused at open with CorruptError, and by ``aprfast.dequantize`` with LimitError.
* Versions: an ``APR\\0`` file of another version is named as such (VersionError), not
  reported as a header CRC mismatch.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import textwrap
import zlib

import hostile_builders as hb
import numpy as np
import pytest
from hostile_builders import APR2, APRENDER, LAYOUTS, Entry, Parts, build
from hypothesis import given, settings
from hypothesis import strategies as st

import aprfast
from aprfast import ChecksumError, CorruptError, FormatError, LimitError, TensorNotFoundError, VersionError
from aprfast.dtypes import by_name
from aprfast.tensors import QuantizedTensor

MiB = 1 << 20
HUGE_DIM = 3689702637583728644  # finding 5: below 2**62, but 4 bytes per element pass it
APR_Q8_ID = 129  # APR_Q8 in both layouts


# --- crafting big indexes fast -----------------------------------------------------------
def index_bytes(layout: str, n: int, *, name_bytes: int = 8, duplicate_at: int | None = None,
                bad_last: bool = False) -> np.ndarray:
    """``n`` sorted entries of empty F32 tensors (shape (0,), 0 bytes at offset 0), named
    ``t0000000``, ``t0000001``, ... (or all ``""`` when ``name_bytes`` is 0), as one NumPy
    record array.  ``duplicate_at`` repeats the previous name there; ``bad_last`` makes the
    last entry claim 8 bytes."""
    fields = [("name_len", "<u2")]
    if name_bytes:
        fields.append(("name", "u1", (name_bytes,)))
    fields += [("dtype", "u1"), ("ndim", "u1"), ("dim0", "<u8"), ("offset", "<u8"), ("size", "<u8")]
    if layout == APR2:
        fields += [("raw_size", "<u8"), ("flags", "<u4")]
    entries = np.zeros(n, np.dtype(fields))
    entries["ndim"] = 1
    if name_bytes:
        entries["name_len"] = name_bytes
        names = np.empty((n, name_bytes), np.uint8)
        names[:, 0] = ord("t")
        rest = np.arange(n, dtype=np.int32)
        for k in range(name_bytes - 1, 0, -1):
            rest, digit = np.divmod(rest, 10)
            names[:, k] = digit
        names[:, 1:] += ord("0")
        if duplicate_at is not None:
            names[duplicate_at] = names[duplicate_at - 1]
        entries["name"] = names
    if bad_last:
        entries["size"][-1] = 8
    return entries


def write_big_file(path, layout: str, n: int, **kwargs) -> int:
    """Write a file of ``layout`` holding only :func:`index_bytes` (no metadata beyond the
    default, no data), with valid checksums; return the index size."""
    index = memoryview(index_bytes(layout, n, **kwargs)).cast("B")
    meta = hb.default_metadata(layout)
    if layout == APRENDER:
        index_offset = 64 + hb.align(len(meta))
        data_offset = index_offset + hb.align(len(index))
        header = bytearray(hb.APRENDER_HEADER.pack(hb.APRENDER_MAGIC, 2, 0, hb.APRENDER_ROW_MAJOR, n, 64,
                                                   len(meta), index_offset, data_offset, 0, bytes(20)))
        header[40:44] = struct.pack("<I", hb.aprender_header_crc(bytes(header)))
        parts = [bytes(header), hb.pad(meta), index, bytes(data_offset - index_offset - len(index))]
    else:
        index_offset = 32 + len(meta)
        index_size = 8 + len(index)
        data_offset = hb.align(index_offset + index_size)
        header = hb.APR2_HEADER.pack(hb.APR2_MAGIC, 2, 0, hb.APR2_ALIGNED_64, 32, len(meta), index_offset,
                                     index_size, data_offset)
        parts = [header, meta, struct.pack("<II", n, 0), index, bytes(data_offset - index_offset - index_size)]
    crc = 0
    with open(path, "wb") as f:
        for part in parts:
            f.write(part)
            crc = zlib.crc32(part, crc)
        size = sum(len(part) for part in parts)
        f.write(struct.pack("<I", crc) if layout == APRENDER
                else hb.APR2_FOOTER.pack(crc, hb.APR2_FOOTER_MAGIC, size + hb.APR2_FOOTER.size))
    return len(index)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kwargs", [{}, {"name_bytes": 0}, {"duplicate_at": 3, "bad_last": True}])
def test_the_big_file_writer_matches_the_hostile_builders(layout, kwargs, tmp_path):
    path = tmp_path / "small.apr"
    size = write_big_file(path, layout, 21, **kwargs)
    index = index_bytes(layout, 21, **kwargs).tobytes()
    assert size == len(index)
    assert path.read_bytes() == build(layout, Parts(), index=index, tensor_count=21)
    if not kwargs:
        with aprfast.open(path) as f:
            assert f.keys() == [f"t{i:07d}" for i in range(21)]


# --- measuring in a child process ----------------------------------------------------------
CHILD = textwrap.dedent(r"""
    import json, sys, time
    import aprfast

    def rss(key):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
        raise KeyError(key)

    def reset_peak():  # so each peak is one call's alone (Linux >= 4.0)
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    results = {}
    for path in sys.argv[1:]:
        if not reset_peak() and results:
            break  # the peak can't be reset: the caller measures the rest in new processes
        base = rss("VmRSS")
        out = results[path] = {}
        start = time.perf_counter()
        try:
            f = aprfast.open(path)
            keys = f.keys()
            out["open_keys_s"] = time.perf_counter() - start
            out["count"] = len(keys)
            out["order_ok"] = keys[0] == "t0000000" and keys[-1] == "t%07d" % (len(keys) - 1)
            start_get = time.perf_counter()
            out["shape"] = list(f.get_tensor(keys[len(keys) // 2]).shape)
            out["get_s"] = time.perf_counter() - start_get
        except aprfast.AprError as exc:
            out["error"] = type(exc).__name__
            out["message"] = exc.message
        out["seconds"] = time.perf_counter() - start
        out["peak"] = rss("VmHWM") - base
        f = keys = None
    print(json.dumps(results))
""")


_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__)))


def measure(paths) -> dict:
    """Peak RSS and times of open + keys() + get_tensor (or of the refusal) per path, in a
    fresh process: ``{path: {"peak": bytes, "seconds": ..., "error": ..., ...}}``."""
    results = {}
    todo = [str(p) for p in paths]
    while todo:
        # From a neutral directory (a child's working directory comes first on its path,
        # and a checkout's aprfast/ has no compiled modules when the package is installed),
        # importing the same aprfast as this process.
        run = subprocess.run([sys.executable, "-c", CHILD, *todo], capture_output=True, text=True, timeout=300,
                             cwd=tempfile.gettempdir(), env={**os.environ, "PYTHONPATH": _PACKAGE_PARENT})
        assert run.returncode == 0, run.stderr
        got = json.loads(run.stdout.strip().splitlines()[-1])
        results.update(got)
        todo = [p for p in todo if p not in got]
    return results


FAIL_FAST = {
    # case: (layout, index_bytes arguments, what the error says)
    "duplicate_near_the_start": (APRENDER, {"duplicate_at": 10},
                                 "tensor index entry 10: name 't0000009' appears twice"),
    "all_names_empty": (APR2, {"name_bytes": 0}, "tensor index entry 1: name '' appears twice"),
    "last_entry_bad": (APRENDER, {"bad_last": True}, "tensor 't3999999'"),
}


@pytest.fixture(scope="module")
def big_files(tmp_path_factory):
    """A valid 1,000,000-entry file and three 4,000,000-entry files with one bad entry:
    ``{case: (path, index size)}``."""
    folder = tmp_path_factory.mktemp("index")
    files = {"million": (folder / "million.apr", write_big_file(folder / "million.apr", APRENDER, 1_000_000))}
    for case, (layout, kwargs, _) in FAIL_FAST.items():
        path = folder / f"{case}.apr"
        files[case] = (path, write_big_file(path, layout, 4_000_000, **kwargs))
    yield files
    for path, _ in files.values():
        path.unlink()


@pytest.fixture(scope="module")
def measured(big_files):
    if not os.path.exists("/proc/self/status"):
        pytest.skip("peak RSS is read from /proc")
    results = measure(path for path, _ in big_files.values())
    return {case: results[str(path)] for case, (path, _) in big_files.items()}


@pytest.mark.peak_memory
def test_a_million_entries_open_list_and_read_one_within_three_times_the_index(big_files, measured):
    index_size = big_files["million"][1]
    assert index_size == 36 * 1_000_000
    got = measured["million"]
    assert "error" not in got, got
    assert got["count"] == 1_000_000 and got["order_ok"] and got["shape"] == [0]
    # Measured: +104 MiB for the 34 MiB index (the index bytes, 0.5 byte per entry of
    # marks, and 72 bytes per name for the list of str keys() returns); before: +413 MiB.
    assert got["peak"] < 3.2 * index_size + 40 * MiB, got
    # Measured: open + keys() 0.1-0.2 s, one get_tensor 0.1 ms (before: 1.3 s, it built
    # every row at the first lookup).
    assert got["open_keys_s"] < 3.0, got
    assert got["get_s"] < 0.25, got


def test_lookups_in_a_million_entries_find_each_name_and_refuse_others(big_files):
    with aprfast.open(big_files["million"][0]) as f:
        assert len(f) == 1_000_000
        for i in (0, 1, 15, 16, 17, 499_999, 999_984, 999_999):
            name = f"t{i:07d}"
            assert name in f and f.info(name).shape == (0,)
        for name in ("t", "t1000000", "t00000000", "s", "u", "", "t000000", "t0000000\x00"):
            assert name not in f
        with pytest.raises(TensorNotFoundError, match="the file has 1000000: 't0000000'"):
            f.get_tensor("t1000000")


@pytest.mark.peak_memory
@pytest.mark.parametrize("case", list(FAIL_FAST))
def test_four_million_entries_fail_at_the_bad_one_costing_at_most_the_index(case, big_files, measured):
    index_size = big_files[case][1]
    message = FAIL_FAST[case][2]
    got = measured[case]
    assert got["error"] == "CorruptError" and message in got["message"], got
    # Measured: the index bytes read once (1.0x) and nothing per entry, 0.15-0.4 s.
    # Before: 4.4-5.5x (every name decoded, every field copied, before any check).
    assert got["peak"] < 1.5 * index_size + 32 * MiB, got
    assert got["seconds"] < 3.0, got


@pytest.mark.parametrize("case", ["duplicate_near_the_start", "all_names_empty"])
def test_four_million_entries_in_memory_fail_at_the_bad_one(case, big_files):
    path = big_files[case][0]
    message = FAIL_FAST[case][2]
    with pytest.raises(CorruptError, match=re.escape(message)):
        aprfast.open(path.read_bytes())
    with pytest.raises(CorruptError, match=re.escape(message)):
        aprfast.open(path, mode="pread")


# --- finding 5: shapes whose non-zero dims NumPy cannot hold --------------------------------
def packed_file(layout: str, type_id: int, dims) -> bytes:
    return build(layout, Parts([Entry("q.weight", type_id, tuple(dims), 0, 0)], b""))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["Q4_K", "APR_Q8"])
@pytest.mark.parametrize("dims", [(HUGE_DIM, 0), (0, HUGE_DIM), (2**61, 0, 2), (0, 2**60 + 1)],
                         ids=["huge-x-0", "0-x-huge", "2^61-x-0-x-2", "0-x-2^60+1"])
def test_empty_packed_tensor_with_a_huge_other_dim_is_refused_at_open(layout, dtype, dims):
    type_id = hb.DTYPE_IDS[layout]["Q4_K"] if dtype == "Q4_K" else APR_Q8_ID
    data = packed_file(layout, type_id, dims)
    for call in (lambda: aprfast.open(data), lambda: aprfast.load(data)):
        with pytest.raises(CorruptError, match="q.weight.*more than 2\\*\\*62") as caught:
            call()
        assert str(max(dims)) in str(caught.value) and "float32" in str(caught.value)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_empty_packed_tensor_at_the_bound_opens_and_dequantizes_to_an_empty_array(layout):
    data = packed_file(layout, hb.DTYPE_IDS[layout]["Q4_K"], (2**60, 0))
    with aprfast.open(data) as f:
        assert f.get_tensor("q.weight").shape == (2**60, 0)
        values = f.get_tensor("q.weight", dequantize=True)
        assert values.shape == (2**60, 0) and values.dtype == np.float32


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype, dims", [("F32", (HUGE_DIM, 0)), ("F64", (0, 2**60)), ("U8", (0, 2**62 + 1))])
def test_empty_unpacked_tensor_beyond_the_bound_is_refused_at_open(layout, dtype, dims):
    data = build(layout, Parts([Entry("t", hb.DTYPE_IDS[layout][dtype], dims, 0, 0)], b""))
    with pytest.raises(CorruptError, match="'t'.*more than 2\\*\\*62"):
        aprfast.open(data)


@pytest.mark.parametrize("dtype", ["Q4_K", "Q8_0", "APR_Q4", "APR_Q8", "Q8_TENSOR"])
@pytest.mark.parametrize("dims", [(HUGE_DIM, 0), (0, HUGE_DIM)])
def test_dequantize_refuses_an_in_memory_tensor_numpy_cannot_shape(dtype, dims):
    qt = QuantizedTensor(by_name(dtype), dims, np.zeros(0, np.uint8))
    with pytest.raises(LimitError, match="2\\*\\*62"):
        aprfast.dequantize(qt)
    with pytest.raises(LimitError):
        aprfast.numerics.quantization.quant_type(dtype).dequantize(qt)


def test_dequantize_still_makes_empty_arrays_below_the_bound():
    qt = QuantizedTensor(by_name("Q8_0"), (0, 2**60), np.zeros(0, np.uint8))
    assert aprfast.dequantize(qt).shape == (0, 2**60)


# --- finding 9: the version is named before the header CRC is judged ----------------------
@pytest.mark.parametrize("major, minor", [(1, 0), (3, 0), (3, 7), (255, 1)])
def test_aprender_magic_with_another_version_and_a_bad_crc_is_a_version_error(major, minor):
    data = build(APRENDER, hb.honest(APRENDER, {"w": np.ones(3, np.float32)}), major=major, minor=minor,
                 header_crc=0xDEADBEEF)
    for call in (lambda: aprfast.open(data), lambda: aprfast.load(data), lambda: aprfast.inspect(data)):
        with pytest.raises(VersionError) as caught:
            call()
        assert f"version {major}.{minor}" in str(caught.value) and "2.x" in str(caught.value)


def tsp_model(payload: bytes) -> bytes:
    """What aprender-tsp writes: APR\\0, u32 version 1, u32 "TSP\\0", CRC32 of the payload."""
    return b"APR\x00" + struct.pack("<III", 1, 0x54535000, zlib.crc32(payload)) + payload


@pytest.mark.parametrize("payload_size", [33, 45, 61], ids=["tabu-49-bytes", "ga-61-bytes", "aco-77-bytes"])
def test_aprender_tsp_model_is_named_by_its_version(payload_size, tmp_path):
    data = tsp_model(bytes(range(payload_size)))
    with pytest.raises(VersionError, match=r"version 1\.0.*2\.x"):
        aprfast.open(data)
    path = tmp_path / "tsp.apr"
    path.write_bytes(data)
    for call in (lambda: aprfast.open(path), lambda: aprfast.load_file(path), lambda: aprfast.inspect(path)):
        with pytest.raises(VersionError, match="version 1.0"):
            call()


def test_a_v2_header_whose_version_byte_alone_is_damaged_is_still_a_checksum_error():
    data = bytearray(build(APRENDER, hb.honest(APRENDER, {"w": np.ones(3, np.float32)})))
    data[4] = 3  # the header CRC still covers version 2
    with pytest.raises(ChecksumError, match="header CRC32.*version byte 3"):
        aprfast.open(bytes(data))


def test_a_file_of_another_version_with_a_valid_crc_is_a_version_error():
    data = build(APRENDER, hb.honest(APRENDER, {"w": np.ones(3, np.float32)}), major=3)
    with pytest.raises(VersionError, match="3.0"):
        aprfast.open(data)


def test_version_zero_in_a_file_too_short_for_a_header_stays_a_format_error():
    with pytest.raises(FormatError, match="24 bytes"):
        aprfast.open(b"APR\x00" + bytes(20))


# --- names: the shared UTF-8 rule (csrc/utf8.h) equals Python's strict decoder ----------
_UTF8_EDGES = [b"\xc2\x80", b"\xdf\xbf", b"\xe0\xa0\x80", b"\xed\x9f\xbf", b"\xed\xa0\x80", b"\xef\xbf\xbf",
               b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xc0\x80", b"\xe0\x80\x80",
               b"\xf5\x80\x80\x80", b"\x80", b"\xc2", b"\xe2\x82"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_UTF8_EDGES) | st.binary(max_size=3), max_size=4).map(b"".join),
       st.sampled_from([APRENDER, APR2]))
def test_a_name_opens_exactly_when_python_decodes_it(raw, layout):
    parts = hb.Parts([hb.Entry(b"a" + raw, hb.DTYPE_IDS[layout]["F32"], (0,), 0, 0)])
    data = hb.build(layout, parts)
    try:
        expected = (b"a" + raw).decode("utf-8")
    except UnicodeDecodeError:
        with pytest.raises(CorruptError, match="UTF-8"):
            aprfast.open(data)
        return
    with aprfast.open(data) as f:
        assert f.keys() == [expected]
