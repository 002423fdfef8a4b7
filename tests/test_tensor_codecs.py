"""Per-tensor compression in the APR2 layout (docs/FORMAT.md §3.1, aprfast.codecs.blocks).

Round trips over dtypes, shapes, codecs and compressibility through every reader path;
golden bytes of a hand-built LZ4 file and the structure of a zstd one; slices decode
only the blocks they touch (bytes counted through a file wrapper); hostile block
tables, sizes and flags raise typed errors naming the tensor and block; incompressible
tensors stay zero-copy views of the map.
"""

import io
import json
import re
import struct
import zlib

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ml_dtypes import bfloat16

import aprfast
from aprfast.codecs import blocks as tensor_codecs
from aprfast.errors import AprError, ChecksumError, CorruptError, LayoutError, VersionError

LZ4_BLOCK = tensor_codecs.LZ4_BLOCK_SIZE
ZSTD_BLOCK = tensor_codecs.ZSTD_BLOCK_SIZE
DTYPES = [np.float32, np.float16, bfloat16, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8,
          np.uint16, np.bool_]


# --- helpers -------------------------------------------------------------------------
def bf16_weights(n, seed=0, scale=0.02):
    """float32 normals rounded to bf16 precision: the low 16 bits are zero, so both
    codecs shrink them (LZ4 to about 2/3, zstd to about 1/2)."""
    u = (np.random.default_rng(seed).standard_normal(n).astype(np.float32) * scale).view(np.uint32)
    return ((u + 0x8000) & 0xFFFF0000).view(np.float32)


def noise(n, seed=1):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def entry_fields(data, name):
    """(entry offset in the file of the tensor's u64 offset field, dict of the entry)."""
    header = struct.unpack_from("<4sHHIIIIII", data)
    index_off, index_size, data_off = header[6], header[7], header[8]
    pos = index_off + 8
    while pos < index_off + index_size:
        nl = struct.unpack_from("<H", data, pos)[0]
        entry_name = data[pos + 2:pos + 2 + nl].decode()
        nd = data[pos + 3 + nl]
        q = pos + 4 + nl + 8 * nd
        off, size, raw, flags = struct.unpack_from("<QQQI", data, q)
        if entry_name == name:
            return q, {"offset": off, "size": size, "raw_size": raw, "flags": flags, "data_off": data_off,
                       "dims_at": pos + 4 + nl, "n_dims": nd}
        pos = q + 28
    raise KeyError(name)


def stored_table(data, name):
    """(absolute offset of the tensor's stored bytes, block_size, count, ends)."""
    _, e = entry_fields(data, name)
    at = e["data_off"] + e["offset"]
    size, count = struct.unpack_from("<II", data, at)
    ends = list(struct.unpack_from(f"<{count}Q", data, at + 8))
    return at, size, count, ends


def refooter(data: bytearray) -> bytes:
    """Fix the footer CRC so a damaged file fails for its damage, not its checksum."""
    struct.pack_into("<I", data, len(data) - 16, zlib.crc32(bytes(data[:-16])))
    return bytes(data)


def every_reader(data, tmp_path):
    """Each reader path's tensors for the bytes of one file."""
    path = tmp_path / "f.apr"
    path.write_bytes(data)
    out = {"load": aprfast.load(data), "load_file-mmap": aprfast.load_file(path),
           "load_file-pread": aprfast.load_file(path, mmap=False)}
    for mode in ("mmap", "pread"):
        with aprfast.open(path, mode=mode) as f:
            out[f"open-{mode}"] = f.tensors()
            out[f"open-{mode}-copy"] = f.tensors(copy=True)
            out[f"open-{mode}-load_all"] = f.load_all()
    with aprfast.open(io.BytesIO(data)) as f:
        out["open-BytesIO"] = f.tensors()
    return out


def same(a, b):
    if isinstance(a, aprfast.RawTensor):
        return a == b
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


class CountingBytesIO(io.BytesIO):
    """Counts every byte handed out by read()."""

    def __init__(self, data):
        super().__init__(data)
        self.count = 0

    def read(self, n=-1):
        got = super().read(n)
        self.count += len(got)
        return got


# --- round trips ----------------------------------------------------------------------
@st.composite
def tensor_values(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    kind = draw(st.sampled_from(["zeros", "low-entropy", "noise"]))
    # up to ~3 LZ4 blocks, so multi-block tensors, last partial blocks and single blocks occur
    n = draw(st.sampled_from([1, 7, 1000, LZ4_BLOCK // dtype.itemsize, 3 * LZ4_BLOCK // dtype.itemsize // 2 + 3]))
    rows = draw(st.sampled_from([d for d in (1, 2, 3, 5) if n % d == 0] or [1]))
    shape = (rows, n // rows) if draw(st.booleans()) else (n,)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    raw = {"zeros": np.zeros(n * dtype.itemsize, np.uint8),
           "low-entropy": rng.integers(0, 3, n * dtype.itemsize).astype(np.uint8),
           "noise": rng.integers(0, 256, n * dtype.itemsize).astype(np.uint8)}[kind]
    if dtype == np.bool_:
        raw = (raw & 1).astype(np.uint8)
    return raw.view(dtype).reshape(shape)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors=st.dictionaries(st.text("abcxyz.", min_size=1, max_size=6), tensor_values(), min_size=1,
                               max_size=4),
       codec=st.sampled_from(["lz4", "zstd"]), level=st.sampled_from([None, 1]),
       extras=st.booleans())
def test_every_reader_gives_back_what_was_saved(tmp_path_factory, tensors, codec, level, extras):
    if extras:  # an empty tensor and a scalar are never compressed
        tensors = {**tensors, "~empty": np.zeros((0, 3), np.float32), "~scalar": np.array(3.5)}
    data = aprfast.save(tensors, compression=codec, compression_level=level)
    described = aprfast.inspect(data)["tensors"]
    for name, value in tensors.items():
        stored = described[name]
        if "raw_size" in stored:  # compressed: strictly smaller than the raw bytes, flagged with its codec
            assert stored["raw_size"] == value.nbytes > stored["nbytes"]
            assert stored["flags"] == tensor_codecs.CODECS[codec]
        else:
            assert stored["nbytes"] == value.nbytes
    tmp = tmp_path_factory.mktemp("rt")
    for path, loaded in every_reader(data, tmp).items():
        assert list(loaded) == sorted(tensors), path
        for name, value in tensors.items():
            assert same(loaded[name], value), (path, name)
    with aprfast.open(data) as f:
        for name, value in tensors.items():
            if value.ndim and value.size:
                lo, hi = value.shape[0] // 3, max(value.shape[0] // 3 + 1, value.shape[0] - 1)
                assert same(f.get_slice(name)[lo:hi], value[lo:hi]), name
                key = (-1, slice(None, None, 2)) if value.ndim == 2 else slice(None, None, -3)
                assert same(f.get_slice(name)[key], value[key]), name


def test_compression_chooses_apr2_and_refuses_aprender():
    tensors = {"w": bf16_weights(20000)}
    for codec in ("lz4", "zstd"):
        data = aprfast.save(tensors, compression=codec)
        assert data[:4] == b"APR2"
        assert "COMPRESSED" in aprfast.inspect(data)["header"]["flag_names"]
    with pytest.raises(LayoutError, match="apr2 layout"):
        aprfast.save(tensors, layout="aprender", compression="lz4")
    with pytest.raises(LayoutError, match="unknown compression"):
        aprfast.save(tensors, compression="brotli")
    with pytest.raises(LayoutError, match="without a compression"):
        aprfast.save(tensors, compression_level=3)
    with pytest.raises(LayoutError, match="1-12"):
        aprfast.save(tensors, compression="lz4", compression_level=40)


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_writer_compresses_like_save_file(tmp_path, codec):
    tensors = {"w": bf16_weights(70000), "n": noise(3000), "e": np.zeros(0, np.int8)}
    path = tmp_path / "w.apr"
    with aprfast.Writer(path, compression=codec) as w:
        for name in ("n", "w", "e"):
            w.add(name, tensors[name])
    assert path.read_bytes() == aprfast.save(tensors, compression=codec)
    out = io.BytesIO()
    with aprfast.Writer(out, compression=codec) as w:
        for name, value in tensors.items():
            w.add(name, value)
    assert out.getvalue() == aprfast.save(tensors, compression=codec)
    with pytest.raises(LayoutError, match="apr2 layout"):
        aprfast.Writer(tmp_path / "x.apr", layout="aprender", compression=codec)
    with pytest.raises(LayoutError, match="without a plan"):
        aprfast.Writer(tmp_path / "y.apr", plan=[("w", "F32", (4,))], compression=codec)


def test_without_compression_the_bytes_are_unchanged():
    tensors = {"w": bf16_weights(2000), "n": noise(100)}
    for layout in ("auto", "apr2", "aprender"):
        assert aprfast.save(tensors, layout=layout, compression=None) == aprfast.save(tensors, layout=layout)


def test_incompressible_file_has_no_compressed_flag():
    data = aprfast.save({"n": noise(100000)}, compression="zstd")
    header = aprfast.inspect(data)["header"]
    assert "COMPRESSED" not in header["flag_names"]
    assert data == aprfast.save({"n": noise(100000)}, layout="apr2")


def test_incompressible_tensors_stay_zero_copy_views(tmp_path):
    tensors = {"n": noise(200000), "w": bf16_weights(50000)}
    path = tmp_path / "mixed.apr"
    aprfast.save_file(tensors, path, compression="lz4")
    with aprfast.open(path) as f:
        n, w = f.get_tensor("n"), f.get_tensor("w")
        assert np.shares_memory(n, f._mapped()) and not n.flags.writeable
        assert not n.flags.owndata
        assert not np.shares_memory(w, f._mapped()) and w.flags.writeable  # decoded: owned
        assert np.array_equal(n, tensors["n"]) and np.array_equal(w, tensors["w"])
        assert f.info("w").flags == tensor_codecs.LZ4 and f.info("n").flags == 0
    loaded = aprfast.load_file(path)
    assert not loaded["n"].flags.writeable and loaded["w"].flags.writeable


def test_quantized_tensors_compress_and_slice_by_rows():
    values = np.repeat(bf16_weights(64 * 32, seed=3).reshape(64, 32), 40, axis=1)  # (64, 1280): repetitive
    q = aprfast.quantize(values, "Q8_0")
    data = aprfast.save({"q": q}, compression="lz4")
    assert aprfast.inspect(data)["tensors"]["q"].get("flags") == tensor_codecs.LZ4
    with aprfast.open(data) as f:
        back = f.get_tensor("q")
        assert back == q
        part = f.get_slice("q")[10:20]
        assert np.array_equal(part.data, q.data.reshape(64, -1)[10:20].reshape(-1))
        assert np.allclose(f.get_slice("q", dequantize=True)[5:7], aprfast.dequantize(q)[5:7])


def test_verify_covers_the_compressed_bytes():
    data = bytearray(aprfast.save({"w": bf16_weights(40000)}, compression="lz4"))
    with aprfast.open(bytes(data)) as f:
        f.verify()
    at, _, count, ends = stored_table(data, "w")
    data[at + 8 + 8 * count + ends[0] // 2] ^= 0x40  # inside block 0, footer CRC left stale
    with aprfast.open(bytes(data)) as f:
        with pytest.raises(ChecksumError):
            f.verify()
        with pytest.raises(ChecksumError):
            f.load_all()


@pytest.mark.parametrize("batch", [1, 96 << 10, 64 << 20])
def test_eager_load_in_batches_of_mixed_tensors(monkeypatch, tmp_path, batch):
    """load_all reads runs of whole tensors (BATCH_BYTES) and decodes each run: tensors
    larger than a run, runs of many tensors, raw and compressed ones interleaved."""
    monkeypatch.setattr(tensor_codecs, "BATCH_BYTES", batch)
    tensors = {f"t{i}": (bf16_weights(5000 * (i + 1), seed=i) if i % 3 else noise(7000 + i).view(np.int8))
               for i in range(9)}
    tensors["empty"] = np.zeros((0, 4), np.float32)
    data = aprfast.save(tensors, compression="lz4")
    path = tmp_path / "b.apr"
    path.write_bytes(data)
    for loaded in (aprfast.load(data), aprfast.load_file(path, mmap=False)):
        assert list(loaded) == sorted(tensors)
        for name, value in tensors.items():
            assert same(loaded[name], value), name
            assert loaded[name].flags.writeable
    damaged = bytearray(data)  # scramble block 1 of t8, a compressed tensor late in the file
    at, _, count, ends = stored_table(damaged, "t8")
    for k in range(ends[0], ends[1]):
        damaged[at + 8 + 8 * count + k] ^= 0x5A
    with pytest.raises(ChecksumError):  # the stale CRC is reported first
        aprfast.load(bytes(damaged))
    with pytest.raises(CorruptError, match="'t8', block 1 of"):
        aprfast.load(refooter(damaged))


def test_threads_read_compressed_tensors_at_once():
    from concurrent.futures import ThreadPoolExecutor

    tensors = {f"t{i}": bf16_weights(40000 + 1000 * i, seed=i).reshape(-1, 8) for i in range(6)}
    data = aprfast.save(tensors, compression="zstd")
    with aprfast.open(data) as f:
        def read(k):
            name = f"t{k % 6}"
            lo = (k * 37) % 4000
            return name, lo, f.get_tensor(name), f.get_slice(name)[lo:lo + 100]
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(read, range(48)))
    for name, lo, whole, part in results:
        assert np.array_equal(whole, tensors[name]) and np.array_equal(part, tensors[name][lo:lo + 100])


def test_python_zstd_fallback_gives_the_same_tensors(monkeypatch):
    tensors = {"a": bf16_weights(300000), "b": np.zeros(1000, np.int32), "n": noise(5000)}
    data = aprfast.save(tensors, compression="zstd")
    monkeypatch.setattr(tensor_codecs, "_FORCE_PYTHON_ZSTD", True)
    loaded = aprfast.load(data)
    with aprfast.open(data) as f:
        sliced = f.get_slice("a")[70000:70010]
    for name, value in tensors.items():
        assert np.array_equal(loaded[name], value)
    assert np.array_equal(sliced, tensors["a"][70000:70010])


# --- golden bytes -----------------------------------------------------------------------
def test_golden_lz4_file_built_by_hand():
    """One F32 tensor "z" of 64 zeros, LZ4: every byte written here from FORMAT §3.1."""
    meta = b'{"apr_version":"2.0.0"}'
    block = bytes.fromhex("1f000100e7" "50" "0000000000")  # 1 literal, match 250 at offset 1, 5 literals
    table = struct.pack("<II", 65536, 1) + struct.pack("<Q", len(block))
    stored = table + block
    entry = struct.pack("<H", 1) + b"z" + bytes([0, 1]) + struct.pack("<Q", 64)
    entry += struct.pack("<QQQI", 0, len(stored), 256, 1)  # offset, stored size, raw_size, flags = LZ4
    index = struct.pack("<II", 1, 0) + entry
    index_off = 32 + len(meta)
    data_off = -(-(index_off + len(index)) // 64) * 64
    total = data_off + 64 + 16
    header = struct.pack("<4sHHIIIIII", b"APR2", 2, 0, 0x02 | 0x01, 32, len(meta), index_off, len(index), data_off)
    body = header + meta + index + bytes(data_off - index_off - len(index)) + stored + bytes(64 - len(stored))
    golden = body + struct.pack("<I4sQ", zlib.crc32(body), b"2RPA", total)
    assert aprfast.save({"z": np.zeros(64, np.float32)}, compression="lz4") == golden
    with aprfast.open(golden, verify=True) as f:
        z = f.get_tensor("z")
        assert z.dtype == np.float32 and z.shape == (64,) and not z.any()


def test_zstd_file_structure_and_frame():
    """zstd frames may differ between library versions: check the table, and that each
    block is exactly one frame with its raw size as content size, at level 3."""
    value = bf16_weights(3 * ZSTD_BLOCK // 4 + 100)  # 3 full blocks and a partial one
    data = aprfast.save({"w": value}, compression="zstd")
    at, size, count, ends = stored_table(data, "w")
    assert (size, count) == (ZSTD_BLOCK, 4)
    head = 8 + 8 * count
    starts = [0] + ends[:-1]
    raw = value.tobytes()
    for k, (lo, hi) in enumerate(zip(starts, ends)):
        frame = data[at + head + lo:at + head + hi]
        want = raw[k * ZSTD_BLOCK:(k + 1) * ZSTD_BLOCK]
        assert zstandard.frame_content_size(frame) == len(want)
        assert zstandard.ZstdDecompressor().decompress(frame, allow_extra_data=False) == want
        assert frame == zstandard.ZstdCompressor(level=3, write_checksum=False).compress(want)
    _, e = entry_fields(data, "w")
    assert (e["raw_size"], e["flags"], e["size"]) == (len(raw), 2, head + ends[-1])


def test_a_block_that_does_not_shrink_is_stored_raw():
    value = np.concatenate([np.zeros(LZ4_BLOCK, np.uint8), noise(LZ4_BLOCK)])
    data = aprfast.save({"m": value}, compression="lz4")
    at, _, count, ends = stored_table(data, "m")
    assert count == 2 and ends[0] < LZ4_BLOCK and ends[1] - ends[0] == LZ4_BLOCK
    assert data[at + 8 + 16 + ends[0]:at + 8 + 16 + ends[1]] == value[LZ4_BLOCK:].tobytes()
    assert np.array_equal(aprfast.load(data)["m"], value)


def test_a_compressed_block_as_long_as_its_raw_bytes_is_stored_raw():
    """The reader tells raw blocks by length alone, so a writer must never keep a
    compressed block of exactly the raw length."""
    raw = np.arange(8192, dtype=np.uint32).astype(np.uint8)
    stored = tensor_codecs._assemble(memoryview(raw), [b"c" * 10, b"y" * 4096], 4096)
    head = 8 + 16
    assert struct.unpack_from("<IIQQ", stored) == (4096, 2, 10, 4106)
    assert bytes(stored[head + 10:]) == raw[4096:].tobytes()
    assert tensor_codecs._assemble(memoryview(raw), [b"c" * 4096, b"y" * 4096], 4096) is None


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
@pytest.mark.parametrize("block", [4096, 8192])
def test_small_blocks_slice_on_every_boundary(monkeypatch, codec, block):
    monkeypatch.setattr(tensor_codecs, "LZ4_BLOCK_SIZE", block)
    monkeypatch.setattr(tensor_codecs, "ZSTD_BLOCK_SIZE", block)
    value = np.concatenate([bf16_weights(6000), noise(4 * block).view(np.float32), np.zeros(3001, np.float32)])
    value = value.reshape(-1, 1) if value.size % 7 else value.reshape(-1, 7)
    data = aprfast.save({"v": value}, compression=codec)
    _, size, count, ends = stored_table(data, "v")
    assert size == block and count == -(-value.nbytes // block)
    lengths = np.diff([0] + ends)
    assert (lengths == block).any() and (lengths < block).any()  # raw and compressed blocks both occur
    rows = value.shape[0]
    row_bytes = value.nbytes // rows
    with aprfast.open(data) as f, aprfast.open(io.BytesIO(data)) as g:
        s, t = f.get_slice("v"), g.get_slice("v")
        for edge in range(0, value.nbytes, block):
            r = edge // row_bytes
            for lo, hi in ((max(r - 1, 0), r + 1), (r, min(r + 2, rows)), (r, r + 1)):
                assert same(s[lo:hi], value[lo:hi]) and same(t[lo:hi], value[lo:hi])  # bytes: noise holds NaNs
        assert same(f.get_tensor("v"), value)


# --- random access -------------------------------------------------------------------------
@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_a_slice_reads_only_the_blocks_it_touches(codec):
    rows, cols = 512, 2048  # 4 MiB of float32: 64 LZ4 blocks, 16 zstd blocks; a row is 8 KiB
    value = bf16_weights(rows * cols).reshape(rows, cols)
    data = aprfast.save({"w": value, "x": np.zeros(10, np.float32)}, compression=codec)
    at, size, count, ends = stored_table(data, "w")
    stream = CountingBytesIO(data)
    with aprfast.open(stream) as f:
        opened = stream.count
        part = f.get_slice("w")[300:302, 5:9]  # 16 KiB of rows: inside one block
        read = stream.count - opened
        assert np.array_equal(part, value[300:302, 5:9])
        largest = max(b - a for a, b in zip([0] + ends[:-1], ends))
        assert read <= 8 + 8 * 3 + 2 * largest, (read, largest)  # table header, 2-3 ends, at most 2 blocks
        assert read < (ends[-1]) / 4
        before = stream.count
        whole = f.get_tensor("w")
        assert stream.count - before >= ends[-1]  # the whole tensor reads every block
        assert np.array_equal(whole, value)


# --- hostile files ----------------------------------------------------------------------------
def good_file(codec="lz4"):
    value = bf16_weights(4 * LZ4_BLOCK // 4 * (4 if codec == "zstd" else 1) + 37)
    return aprfast.save({"a": np.arange(4, dtype=np.int32), "w": value}, compression=codec), value


def read_every_way(data, middle=False):
    """Read "w" through each path; return the AprError each raised (all must raise).
    ``middle``: also a slice 60% into the tensor (it reads only the blocks there)."""
    errors = []
    at = int(0.6 * aprfast.inspect(data)["tensors"]["w"]["shape"][0])
    calls = [lambda: aprfast.load(data, verify=False), lambda: aprfast.open(data).get_tensor("w"),
             lambda: aprfast.open(data).get_slice("w")[:], lambda: aprfast.open(io.BytesIO(data)).get_tensor("w")]
    if middle:
        calls.append(lambda: aprfast.open(data, mode="pread").get_slice("w")[at:at + 8])
    for call in calls:
        try:
            call()
        except AprError as exc:
            errors.append(exc)
        except BaseException as exc:  # noqa: BLE001 - anything untyped is the failure
            pytest.fail(f"{type(exc).__name__} escaped instead of an AprError: {exc!r}")
        else:
            pytest.fail("a damaged file was read without an error")
    return errors


def damage_table(data, change):
    data = bytearray(data)
    at, size, count, ends = stored_table(data, "w")
    change(data, at, size, count, ends)
    return refooter(data)


HOSTILE_TABLES = {
    "block size not a power of two": lambda d, at, s, n, e: struct.pack_into("<I", d, at, 65535),
    "block size above 16 MiB": lambda d, at, s, n, e: struct.pack_into("<I", d, at, 1 << 25),
    "block size zero": lambda d, at, s, n, e: struct.pack_into("<I", d, at, 0),
    "block count too small": lambda d, at, s, n, e: struct.pack_into("<I", d, at + 4, n - 1),
    "block count of 2**32-1": lambda d, at, s, n, e: struct.pack_into("<I", d, at + 4, 2**32 - 1),
    "ends going backwards": lambda d, at, s, n, e: struct.pack_into("<Q", d, at + 8 + 8, e[0] - 1),
    "an empty block": lambda d, at, s, n, e: struct.pack_into("<Q", d, at + 8 + 8, e[0]),
    "last end short of the stored bytes": lambda d, at, s, n, e: struct.pack_into("<Q", d, at + 8 + 8 * (n - 1),
                                                                                   e[-1] - 1),
    "an end of 2**64-1": lambda d, at, s, n, e: struct.pack_into("<Q", d, at + 8, 2**64 - 1),
    "a middle end of 2**64-1": lambda d, at, s, n, e: struct.pack_into("<Q", d, at + 8 + 8 * (n // 2), 2**64 - 1),
    "a block larger than its raw bytes": lambda d, at, s, n, e: (
        struct.pack_into("<I", d, at, 4096), struct.pack_into("<I", d, at + 4, n)),
}


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
@pytest.mark.parametrize("case", sorted(HOSTILE_TABLES))
def test_hostile_block_table_is_a_typed_error_naming_the_tensor(codec, case):
    data, _ = good_file(codec)
    middle = case in ("a middle end of 2**64-1", "last end short of the stored bytes", "block count too small")
    for exc in read_every_way(damage_table(data, HOSTILE_TABLES[case]), middle=middle):
        assert isinstance(exc, CorruptError), case
        assert "'w'" in str(exc), (case, str(exc))


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_damaged_block_names_the_block(codec):
    data, _ = good_file(codec)

    def flip(d, at, s, n, e):
        head = 8 + 8 * n
        for k in range(e[1] - e[0]):  # scramble block 1 (a compressed one)
            d[at + head + e[0] + k] = (d[at + head + e[0] + k] * 7 + 13) & 0xFF
    for exc in read_every_way(damage_table(data, flip)):
        assert isinstance(exc, CorruptError)
        assert "'w'" in str(exc) and "block 1 of" in str(exc), str(exc)


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_truncated_block_is_refused(codec):
    """Block 0 claims one byte less: its codec stream ends early (or the next block
    starts one byte too soon)."""
    data, _ = good_file(codec)
    damaged = damage_table(data, lambda d, at, s, n, e: struct.pack_into("<Q", d, at + 8, e[0] - 1))
    for exc in read_every_way(damaged):
        assert isinstance(exc, CorruptError) and "'w'" in str(exc) and "block" in str(exc)


@pytest.mark.parametrize("python_zstd", [False, True])
def test_zstd_block_must_be_exactly_one_frame(monkeypatch, python_zstd):
    """Two frames (or trailing bytes) in one block are refused, by libzstd and by the
    zstandard fallback alike; so is a frame whose content size is not the block's."""
    monkeypatch.setattr(tensor_codecs, "_FORCE_PYTHON_ZSTD", python_zstd)
    half = zstandard.ZstdCompressor(level=3).compress(bytes(2048))
    whole = zstandard.ZstdCompressor(level=3).compress(bytes(4096))
    lying = zstandard.ZstdCompressor(level=3).compress(bytes(4000))
    arr = lambda *v: np.array(v, np.uint64)  # noqa: E731
    for src, why in ((half + half, "one zstd frame|declares 2048"), (whole + b"\0", "one zstd frame|unused data"),
                     (lying, "4000")):
        src = np.frombuffer(src, np.uint8)
        dst = np.zeros(4096, np.uint8)
        problem = tensor_codecs._run(src, arr(0), arr(len(src)), dst, arr(0), arr(4096),
                                     np.full(1, 2, np.uint8), 0)
        assert problem is not None and problem[0] == 0
        assert re.search(why, problem[1]), problem[1]
    ok = np.frombuffer(whole, np.uint8)
    assert tensor_codecs._run(ok, arr(0), arr(len(ok)), np.ones(4096, np.uint8), arr(0), arr(4096),
                              np.full(1, 2, np.uint8), 0) is None


def set_entry(data, name, **fields):
    data = bytearray(data)
    q, _ = entry_fields(data, name)
    names = ("offset", "size", "raw_size", "flags")
    for key, value in fields.items():
        fmt, at = ("<I", q + 24) if key == "flags" else ("<Q", q + 8 * names.index(key))
        struct.pack_into(fmt, data, at, value)
    return bytes(data)


def test_hostile_entry_fields():
    data, value = good_file("lz4")
    cases = {
        "unknown codec 3": (set_entry(data, "w", flags=3), VersionError),
        "a reserved flag bit": (set_entry(data, "w", flags=0x11), VersionError),
        "codec without raw_size": (set_entry(data, "w", raw_size=0), CorruptError),
        "raw_size without codec": (set_entry(data, "w", flags=0), CorruptError),
        "raw_size not shape x dtype": (set_entry(data, "w", raw_size=value.nbytes + 4), CorruptError),
        "stored bytes too few for a table": (set_entry(data, "w", size=7), CorruptError),
    }
    for case, (damaged, error) in cases.items():
        with pytest.raises(error) as caught:
            aprfast.open(damaged)
        assert "'w'" in str(caught.value), case


def test_header_without_compressed_flag_is_refused():
    data, _ = good_file("lz4")
    damaged = bytearray(data)
    struct.pack_into("<I", damaged, 8, struct.unpack_from("<I", data, 8)[0] & ~0x01)
    with pytest.raises(CorruptError, match="COMPRESSED"):
        aprfast.open(bytes(damaged))


def test_huge_declared_size_is_refused_before_allocating():
    """A 1-D tensor re-declared as 2**28 float32 (1 GiB, raw_size and a table of 64
    16 MiB blocks to match): its ~170 KB of blocks cannot inflate that far, so it fails
    before any allocation; at 2**40 elements the table itself could not fit."""
    data, _ = good_file("lz4")
    _, e = entry_fields(data, "w")
    for elems, words in ((1 << 28, "inflate"), (1 << 40, "table of")):
        damaged = bytearray(set_entry(data, "w", raw_size=4 * elems))
        struct.pack_into("<Q", damaged, e["dims_at"], elems)
        damaged = damage_table(bytes(damaged), lambda d, at, s, n, e2: struct.pack_into(
            "<II", d, at, 16 << 20, 4 * elems // (16 << 20)))
        for exc in read_every_way(damaged):
            assert isinstance(exc, CorruptError) and words in str(exc), str(exc)


def test_describe_reports_codec_fields_only_for_compressed_tensors():
    data = aprfast.save({"w": bf16_weights(30000), "n": noise(1000)}, compression="zstd")
    tensors = aprfast.inspect(data)["tensors"]
    assert set(tensors["n"]) == {"dtype", "shape", "offset", "nbytes"}
    assert tensors["w"]["flags"] == 2 and tensors["w"]["raw_size"] == 120000
    json.dumps(tensors)  # plain ints, printable by the CLI


def test_block_decoder_checks_every_range():
    from aprfast import _blocks

    src, dst = np.zeros(10, np.uint8), np.zeros(10, np.uint8)
    arr = lambda *v: np.array(v, np.uint64)  # noqa: E731
    with pytest.raises(ValueError, match="outside"):
        _blocks.decode_blocks(src, arr(5), arr(6), dst, arr(0), arr(6), np.zeros(1, np.uint8))
    with pytest.raises(ValueError, match="outside"):
        _blocks.decode_blocks(src, arr(0), arr(1), dst, arr(2**64 - 1), arr(1), np.zeros(1, np.uint8))
    assert _blocks.decode_blocks(src, arr(0), arr(3), dst, arr(0), arr(4), np.zeros(1, np.uint8))[0] == 0
    assert "unknown codec" in _blocks.decode_blocks(src, arr(0), arr(3), dst, arr(0), arr(3),
                                                    np.full(1, 9, np.uint8))[1]
