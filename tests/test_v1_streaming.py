"""The v1 STREAMING chunk index: round trips, random access that reads only its chunks,
tampering caught at the chunk tampered with, hostile indexes, golden bytes.

docs/FORMAT.md ("v1 streaming chunk index") is the layout these tests pin.
"""

from __future__ import annotations

import hashlib
import io
import struct
import tracemalloc
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ml_dtypes import bfloat16

from aprfast import v1
from aprfast.crypto import core as crypto
from aprfast.errors import (
    AprError,
    ChecksumError,
    CorruptError,
    DecryptError,
    LayoutError,
    LimitError,
    SignatureError,
    TensorNotFoundError,
    UnknownDTypeError,
    VersionError,
)
from aprfast.layouts import chunk_index
from aprfast.layouts.v1 import Flag
from aprfast.v1.reader import V1File

PINNED = {"created_at": "0", "aprender_version": "golden"}
DTYPES = [np.dtype(d) for d in (np.float32, np.float16, np.float64, np.int8, np.int16, np.int32, np.int64,
                                np.uint8, np.uint16, np.uint32, np.uint64, np.bool_, bfloat16)]
IDX = 32  # the chunk index header's size


# --- helpers -------------------------------------------------------------------------
class CountingFile(io.RawIOBase):
    """A seekable file object without a descriptor that records every byte range read."""

    def __init__(self, data: bytes):
        self._data = bytes(data)
        self._pos = 0
        self.ranges = []

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=0):
        self._pos = {0: offset, 1: self._pos + offset, 2: len(self._data) + offset}[whence]
        return self._pos

    def tell(self):
        return self._pos

    def read(self, n=-1):
        end = len(self._data) if n is None or n < 0 else min(len(self._data), self._pos + n)
        out = self._data[self._pos:end]
        self.ranges.append((self._pos, end))
        self._pos = end
        return out

    @property
    def bytes_read(self) -> int:
        return sum(b - a for a, b in self.ranges)


def parts(data):
    """(metadata_size, index start, index size, payload start) of a streaming file."""
    m = int.from_bytes(data[8:12], "little")
    start = 32 + m
    size = int.from_bytes(data[start + 8:start + 12], "little")
    return m, start, size, start + size


def index_fields(data):
    _, start, size, _ = parts(data)
    (magic, version, flags, reserved, isize, t, c, limit, k, s) = struct.unpack_from("<4sBBHIIIIII", data, start)
    return dict(start=start, size=size, tensors=t, chunks=c, limit=limit, key=k, table=s, flags=flags,
                chunk_table=start + IDX + s, record=56 if flags & chunk_index.DIGESTS else 24)


def fix_crcs(data, *, chunks=True, digests=False) -> bytes:
    """What an attacker without a key can do: recompute every CRC (chunk CRCs in the
    index, the index CRC, the file CRC), and the chunk digests of a signed index,
    after changing bytes."""
    data = bytearray(data)
    f = index_fields(data)
    payload = f["start"] + f["size"]
    if chunks:
        for i in range(f["chunks"]):
            at = f["chunk_table"] + f["record"] * i
            offset, stored = struct.unpack_from("<QI", data, at)
            stored_bytes = data[payload + offset:payload + offset + stored]
            struct.pack_into("<I", data, at + 16, zlib.crc32(stored_bytes))
            if digests:
                data[at + 24:at + 56] = hashlib.sha256(stored_bytes).digest()
    end = f["start"] + f["size"] - 4
    struct.pack_into("<I", data, end, zlib.crc32(data[:end]))
    return recrc(data)


def recrc(data) -> bytes:
    data = bytes(data)
    return data[:-4] + zlib.crc32(data[:-4]).to_bytes(4, "little")


def crc_preserving_change(data, start, length) -> bytearray:
    """Flip bits inside [start, start+length) so that the range's CRC32 is unchanged
    (CRC32 is linear: 33 single-bit changes always have a subset that cancels out)."""
    data = bytearray(data)
    chunk = bytearray(data[start:start + length])
    base = zlib.crc32(chunk)
    rows = []  # (crc difference, set of bits), reduced by Gaussian elimination
    for bit in range(min(8 * length, 64)):
        chunk[bit // 8] ^= 1 << (bit % 8)
        diff, bits = zlib.crc32(chunk) ^ base, {bit}
        chunk[bit // 8] ^= 1 << (bit % 8)
        for pivot_diff, pivot_bits in rows:
            if diff ^ pivot_diff < diff:
                diff, bits = diff ^ pivot_diff, bits ^ pivot_bits
        if diff == 0:
            for b in bits:
                chunk[b // 8] ^= 1 << (b % 8)
            assert zlib.crc32(chunk) == base and chunk != data[start:start + length]
            data[start:start + length] = chunk
            return data
        rows.append((diff, bits))
        rows.sort(reverse=True)
    raise AssertionError("no CRC-preserving change found")


def chunk_at(data, i):
    """(absolute offset, stored size) of chunk i."""
    f = index_fields(data)
    offset, stored = struct.unpack_from("<QI", data, f["chunk_table"] + f["record"] * i)
    return f["start"] + f["size"] + offset, stored


def sample():
    rng = np.random.default_rng(7)
    return {"a": rng.standard_normal((64, 32)).astype(np.float32),
            "b": np.arange(1000, dtype=np.int64),
            "c": rng.integers(0, 255, 300, dtype=np.uint8)}


@pytest.fixture(scope="module")
def x25519():
    return crypto.generate_x25519_key()


def assert_same(tensors, expected):
    assert sorted(tensors) == sorted(expected)
    for name, value in expected.items():
        got = tensors[name]
        assert got.dtype == value.dtype and got.shape == value.shape, name
        assert got.tobytes() == np.ascontiguousarray(value).tobytes(), name


# --- round trips -----------------------------------------------------------------------
@st.composite
def tensor_dicts(draw):
    names = draw(st.lists(st.text(min_size=0, max_size=12), min_size=0, max_size=5, unique=True))
    out = {}
    for name in names:
        dtype = draw(st.sampled_from(DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 6), min_size=0, max_size=4)))
        n = int(np.prod(shape, dtype=np.int64))
        raw = draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize))
        out[name] = np.frombuffer(raw, dtype).reshape(shape) if n else np.zeros(shape, dtype)
    return out


@pytest.mark.slow("long property run")
@settings(max_examples=60, deadline=None)
@given(tensors=tensor_dicts(), compression=st.sampled_from(["none", "zstd", "lz4", "zstd-max"]),
       chunk_size=st.integers(1, 80), encrypted=st.booleans(), signed=st.booleans())
def test_round_trip_through_load_model_and_v1file(x25519, tensors, compression, chunk_size, encrypted, signed):
    secret, public = x25519
    # Each chunk is compressed on its own (zstd-max sets up a large context per call):
    # keep every example to a few hundred chunks.
    chunk_size = max(chunk_size, sum(a.nbytes for a in tensors.values()) // 256 + 1)
    kw = {"recipient": public} if encrypted else {}
    if signed:
        kw["signing_key"] = bytes(range(32))
    data = v1.save_model(tensors, metadata=PINNED, compression=compression, streaming=True,
                         chunk_size=chunk_size, **kw)
    key = {"private_key": secret} if encrypted else {}
    model = v1.load_model(data, **key)
    assert model.flags & Flag.STREAMING and bool(model.flags & Flag.ENCRYPTED) == encrypted
    assert_same(model.payload, tensors)
    with V1File(data, **key) as f:
        assert f.kind == "streaming" and len(f) == len(tensors) and sorted(f.keys()) == sorted(tensors)
        assert_same(f.tensors(), tensors)
        assert f.signature == (v1.SELF_SIGNED if signed else v1.UNSIGNED)
        for name, value in tensors.items():
            assert name in f and f.info(name).shape == value.shape
            if value.ndim and value.dtype != bfloat16:
                assert np.array_equal(f.get_slice(name)[1:3], value[1:3], equal_nan=value.dtype.kind == "f")
        f.verify()


def test_password_round_trip_and_wrong_password():
    tensors = sample()
    data = v1.save_model(tensors, metadata=PINNED, compression="zstd", streaming=True, chunk_size=1000,
                         password="secret")
    assert_same(v1.load_model(data, password="secret").payload, tensors)
    with V1File(data, password="secret") as f:
        assert f.encryption == "password"
        assert_same(f.tensors(), tensors)
    for kw in ({"password": "wrong"}, {}):
        with pytest.raises(DecryptError):
            V1File(data, **kw)
        with pytest.raises(DecryptError):
            v1.load_model(data, **kw)


def test_multi_recipient_round_trip(x25519):
    other = crypto.generate_x25519_key()
    tensors = sample()
    data = v1.save_model(tensors, streaming=True, compression="lz4", recipients=[x25519[1], other[1]])
    for secret, _ in (x25519, other):
        with V1File(data, private_key=secret) as f:
            assert f.encryption == "multi-recipient"
            assert_same(f.tensors(), tensors)


def test_header_fields_and_index_placement():
    tensors = sample()
    data = v1.save_model(tensors, metadata=PINNED, compression="zstd", streaming=True, chunk_size=4096)
    m, start, size, payload = parts(data)
    payload_size = int.from_bytes(data[12:16], "little")
    assert payload + payload_size + 4 == len(data)  # payload_size = the stored bytes after the index
    assert int.from_bytes(data[16:20], "little") == sum(v.nbytes for v in tensors.values())
    assert data[20] == 1 and data[21] == Flag.STREAMING
    assert data[start:start + 4] == b"APRC"
    f = index_fields(data)
    assert f["tensors"] == 3 and f["limit"] == 4096 and f["key"] == 0
    # a: 8192 bytes -> 2 chunks; b: 8000 -> 2; c: 300 -> 1; sorted by offset, contiguous
    assert f["chunks"] == 5
    offsets = [struct.unpack_from("<Q", data, f["chunk_table"] + 24 * i)[0] for i in range(5)]
    assert offsets == sorted(offsets) and offsets[0] == 0
    with V1File(data) as v:
        assert [raw for _, _, raw in v.chunks("a")] == [4096, 4096]
        assert v.chunks("c")[0][0] == payload + offsets[4]


def test_large_tensor_is_split_at_the_chunk_size_and_slices_decode_only_their_chunks():
    value = np.arange(256 * 64, dtype=np.float32).reshape(256, 64)  # 64 KiB, rows of 256 bytes
    data = v1.save_model({"w": value}, streaming=True, compression="lz4", chunk_size=4096)
    counting = CountingFile(data)
    with V1File(counting) as f:
        chunks = f.chunks("w")
        assert len(chunks) == 16 and all(raw == 4096 for _, _, raw in chunks)
        counting.ranges.clear()
        # rows 20..30 are bytes 5120..7680: chunk 1 only
        assert np.array_equal(f.get_slice("w")[20:30, 5:9], value[20:30, 5:9])
        start, stored, _ = chunks[1]
        assert counting.ranges == [(start, start + stored)]
        assert np.array_equal(f.get_slice("w")[-1], value[-1])
        assert np.array_equal(f.get_slice("w")[::50, 3], value[::50, 3])
        assert np.array_equal(f.get_slice("w")[5:2], value[5:2])


# --- random access reads only its chunks ---------------------------------------------------
@pytest.mark.parametrize("kw", [{}, {"compression": "zstd"}, {"compression": "lz4", "password": "pw"}])
def test_get_tensor_reads_only_the_bytes_of_its_chunks(kw):
    tensors = {f"layer{i}.weight": np.full((128, 64), i, np.float32) for i in range(8)}
    data = v1.save_model(tensors, streaming=True, chunk_size=8192, **kw)
    counting = CountingFile(data)
    opened = {k: v for k, v in kw.items() if k == "password"}
    with V1File(counting, **opened) as f:
        _, index_start, index_size, payload = parts(data)
        # open read the header, metadata and index only: nothing of the payload
        assert max(end for _, end in counting.ranges) <= payload
        counting.ranges.clear()
        got = f.get_tensor("layer5.weight")
        assert np.array_equal(got, tensors["layer5.weight"]) and got.flags.writeable
        wanted = [(start, start + stored) for start, stored, _ in f.chunks("layer5.weight")]
        assert counting.ranges == wanted
        assert counting.bytes_read == sum(b - a for a, b in wanted) < len(data) // 6


# --- tampering: caught at the chunk tampered with, typed, never wrong data ------------------
def test_a_flipped_chunk_byte_fails_that_tensor_only():
    tensors = sample()
    data = bytearray(v1.save_model(tensors, streaming=True, compression="zstd", chunk_size=4096))
    offset, stored = chunk_at(data, 4)  # tensor c's only chunk
    data[offset + stored // 2] ^= 0x01
    with V1File(bytes(data)) as f:
        assert np.array_equal(f.get_tensor("a"), tensors["a"])
        with pytest.raises(ChecksumError, match="tensor 'c' chunk 0"):
            f.get_tensor("c")
        with pytest.raises(ChecksumError):
            f.verify()
    with pytest.raises(ChecksumError):
        v1.load_model(bytes(data))


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_sealed_chunks_altered_with_every_crc_fixed_fail_authentication(compression):
    tensors = sample()
    data = bytearray(v1.save_model(tensors, streaming=True, compression=compression, chunk_size=4096,
                                   password="pw"))
    offset, stored = chunk_at(data, 2)  # tensor b's first chunk
    data[offset + 3] ^= 0x80
    tampered = fix_crcs(data)
    with V1File(tampered, password="pw") as f:
        assert np.array_equal(f.get_tensor("c"), tensors["c"])
        with pytest.raises(DecryptError, match="tensor 'b' chunk 0"):
            f.get_tensor("b")
    with pytest.raises(DecryptError):
        v1.load_model(tampered, password="pw")


def test_swapped_chunks_are_detected():
    value = np.arange(4096, dtype=np.uint8)
    tensors = {"a": value, "b": value[::-1].copy()}
    for kw in ({}, {"password": "pw"}):
        data = bytearray(v1.save_model(tensors, streaming=True, chunk_size=1024, **kw))
        (o1, s1), (o2, s2) = chunk_at(data, 1), chunk_at(data, 5)
        assert s1 == s2
        data[o1:o1 + s1], data[o2:o2 + s2] = data[o2:o2 + s2], data[o1:o1 + s1]
        with V1File(recrc(data), **kw) as f:
            with pytest.raises(ChecksumError, match="tensor 'a' chunk 1"):  # the chunk CRC, before the tag
                f.get_tensor("a")
    # sealed chunks swapped with their CRCs fixed: the AAD binds each to its place
    with V1File(fix_crcs(data), password="pw") as f:
        with pytest.raises(DecryptError, match="tensor 'a' chunk 1"):
            f.get_tensor("a")
        with pytest.raises(DecryptError, match="tensor 'b' chunk 1"):
            f.get_tensor("b")


def test_dropping_the_last_tensor_of_a_sealed_file_is_detected():
    """Truncation with every size and CRC fixed: the counts are in every chunk's AAD."""
    tensors = {"a": np.arange(100, dtype=np.int32), "b": np.arange(50, dtype=np.int16)}
    data = v1.save_model(tensors, metadata=PINNED, streaming=True, password="pw")
    m, start, size, payload = parts(data)
    prefix_crc = zlib.crc32(data[:start])
    index = chunk_index.parse(data[start:start + size], prefix_crc=prefix_crc,
                              payload_size=int.from_bytes(data[12:16], "little"))
    a = index.tensors["a"]
    kept = index.chunks[:a.count]
    body = chunk_index.encode([a.record], [(c.offset, c.stored_size, c.raw_size, c.crc) for c in kept],
                              chunk_limit=index.chunk_limit, key_block=index.key_block, sealed=True)
    payload_size = sum(c.stored_size for c in kept)
    header = bytearray(data[:32])
    struct.pack_into("<II", header, 12, payload_size, 400)
    meta = data[32:start]
    forged = bytes(header) + meta + chunk_index.finish(bytes(header), meta, body) + \
        data[payload:payload + payload_size] + bytes(4)
    forged = recrc(forged)
    with V1File(forged, password="pw") as f:
        assert f.keys() == ["a"]
        with pytest.raises(DecryptError, match="tensor 'a'"):
            f.get_tensor("a")


def test_truncated_files_are_refused():
    data = v1.save_model(sample(), streaming=True, compression="lz4")
    for cut in (len(data) - 1, len(data) - 100, parts(data)[3] + 5, parts(data)[1] + 10, 40):
        with pytest.raises((CorruptError, VersionError)):
            V1File(data[:cut])
        with pytest.raises(AprError):
            v1.load_model(data[:cut])


def test_reordered_index_records_are_refused():
    tensors = {"a": np.zeros(4, np.uint8), "b": np.ones(4, np.uint8)}
    data = bytearray(v1.save_model(tensors, streaming=True))
    f = index_fields(data)
    rec = 2 + 1 + 1 + 1 + 8 + 4  # name_len, name, dtype, ndim, one dim, chunk_count
    table = f["start"] + IDX
    first, second = bytes(data[table:table + rec]), bytes(data[table + rec:table + 2 * rec])
    data[table:table + 2 * rec] = second + first
    with pytest.raises(ChecksumError, match="chunk index CRC32"):
        V1File(recrc(data))
    with pytest.raises(CorruptError, match="increasing byte order"):
        V1File(fix_crcs(data, chunks=False))
    # chunk records swapped: offsets no longer increase
    data = bytearray(v1.save_model(tensors, streaming=True))
    ct = index_fields(data)["chunk_table"]
    data[ct:ct + 48] = data[ct + 24:ct + 48] + data[ct:ct + 24]
    with pytest.raises(CorruptError, match="chunk 0 starts at payload offset 4"):
        V1File(fix_crcs(data, chunks=False))


def test_cleared_encrypted_flag_is_detected():
    data = bytearray(v1.save_model(sample(), streaming=True, password="pw"))
    data[21] &= ~Flag.ENCRYPTED
    with pytest.raises(ChecksumError):  # the index CRC covers the header
        V1File(recrc(data))
    fixed = fix_crcs(data, chunks=False)
    for kw in ({}, {"password": "pw"}):
        with pytest.raises(CorruptError, match="sealed"):
            V1File(fixed, **kw)
        with pytest.raises(CorruptError, match="sealed"):
            v1.load_model(fixed, **kw)


def test_cleared_streaming_flag_is_detected():
    data = bytearray(v1.save_model(sample(), streaming=True))
    data[21] &= ~Flag.STREAMING
    with pytest.raises(CorruptError, match="not explained"):
        v1.load_model(recrc(data))
    with pytest.raises(CorruptError):
        V1File(recrc(data))


def test_a_key_for_a_plaintext_streaming_file_is_refused():
    data = v1.save_model(sample(), streaming=True)
    with pytest.raises(DecryptError, match="not encrypted"):
        V1File(data, password="pw")
    with pytest.raises(DecryptError, match="not encrypted"):
        v1.load_model(data, password="pw")
    with V1File(data, password="pw", allow_unencrypted=True) as f:
        assert f.encryption == "none" and len(f) == 3


def test_signed_streaming_files_open_with_one_index_signature_and_check_chunks_when_read():
    seed, public = crypto.generate_signing_key()
    tensors = sample()
    data = bytearray(v1.save_model(tensors, streaming=True, compression="zstd", signing_key=seed, chunk_size=4096))
    assert index_fields(data)["flags"] == chunk_index.DIGESTS and index_fields(data)["record"] == 56
    counting = CountingFile(data)
    with V1File(counting, trusted_keys=[public]) as f:
        assert f.signature == v1.TRUSTED and f.signer == public
        payload, key_at = parts(data)[3], len(data) - 4 - 32
        # open read the header, metadata, index and the signer's key: no payload byte
        assert all(end <= payload or (start, end) == (key_at, key_at + 32) for start, end in counting.ranges)
        counting.ranges.clear()
        assert np.array_equal(f.get_tensor("c"), tensors["c"])
        assert counting.ranges == [(s, s + n) for s, n, _ in f.chunks("c")]
        f.verify()
    with pytest.raises(SignatureError, match="not among"):
        V1File(bytes(data), trusted_keys=[bytes(32)])
    with pytest.raises(SignatureError, match="not signed"):
        V1File(v1.save_model(tensors, streaming=True), trusted_keys=[public])


def test_signed_streaming_tampering_is_caught_at_the_chunk_or_at_open():
    seed, public = crypto.generate_signing_key()
    tensors = sample()
    data = bytearray(v1.save_model(tensors, streaming=True, compression="zstd", signing_key=seed, chunk_size=4096))
    offset, stored = chunk_at(data, 4)  # tensor c's only chunk
    data = crc_preserving_change(data, offset, stored)
    tampered = recrc(data)  # the chunk's CRC32 still matches; its signed SHA-256 does not
    with V1File(tampered, trusted_keys=[public]) as f:
        assert np.array_equal(f.get_tensor("a"), tensors["a"])
        with pytest.raises(SignatureError, match="tensor 'c' chunk 0"):
            f.get_tensor("c")
        with pytest.raises(SignatureError):
            f.verify()
    with pytest.raises(SignatureError):
        v1.load_model(tampered)
    # the digest rewritten too: the index signature fails at open
    with pytest.raises(SignatureError, match="chunk index signature"):
        V1File(fix_crcs(data, digests=True))
    # only the whole-file signature altered: open needs only the index signature;
    # verify() and load_model check the whole file
    whole = bytearray(v1.save_model(tensors, streaming=True, signing_key=seed))
    whole[-4 - 96] ^= 1
    with V1File(recrc(whole), trusted_keys=[public]) as f:
        assert_same(f.tensors(), tensors)
        with pytest.raises(SignatureError):
            f.verify()
    with pytest.raises(SignatureError):
        v1.load_model(recrc(whole))


def test_unknown_tensor_and_closed_file():
    data = v1.save_model(sample(), streaming=True)
    f = V1File(data)
    with pytest.raises(TensorNotFoundError):
        f.get_tensor("nope")
    f.close()
    with pytest.raises(AprError):
        f.get_tensor("a")


def test_bad_write_requests_are_refused():
    with pytest.raises(TypeError):
        v1.save_model(b"bytes", model_type=1, streaming=True)
    with pytest.raises(ValueError):
        v1.save_model(sample(), streaming=True, chunk_size=0)
    with pytest.raises(LayoutError):
        v1.save_model(sample(), chunk_size=10)
    with pytest.raises(LayoutError):
        v1.save_model(sample(), streaming=True, trueno_native=True)


# --- hostile indexes ------------------------------------------------------------------------
def forge(index_body: bytes, payload: bytes = b"", flags=Flag.STREAMING, index_size=None) -> bytes:
    """A streaming file around ``index_body`` (the index without its CRC), every CRC valid."""
    meta = v1.layout.encode_metadata(PINNED)
    raw_total = 0
    header = v1.Header(v1.ModelType.NeuralCustom, len(meta), len(payload), raw_total, 0, flags).to_bytes()
    body = bytearray(index_body)
    struct.pack_into("<I", body, 8, index_size if index_size is not None else len(body) + 4)
    index = bytes(body) + struct.pack("<I", zlib.crc32(header + meta + body))
    return recrc(header + meta + index + payload + bytes(4))


def index_header(tensors=0, chunks=0, limit=4096, key=0, table=0, flags=0, version=1, magic=b"APRC"):
    return struct.pack("<4sBBHIIIIII", magic, version, flags, 0, 0, tensors, chunks, limit, key, table)


def record(name=b"t", dtype=7, dims=(4,), chunks=1, name_len=None):
    n = len(name) if name_len is None else name_len
    return (struct.pack("<H", n) + name + struct.pack("<BB", dtype, len(dims))
            + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<I", chunks))


def chunk(offset=0, stored=4, raw=4, crc=0, reserved=0):
    return struct.pack("<QIIII", offset, stored, raw, crc, reserved)


HOSTILE = {
    "huge tensor count": (index_header(tensors=0xFFFFFFFF), LimitError),
    "tensor count the table cannot hold": (index_header(tensors=1000, table=16) + bytes(16), CorruptError),
    "huge chunk count": (index_header(chunks=0xFFFFFFFF), CorruptError),
    "chunk limit above 1 GiB": (index_header(limit=(1 << 30) + 1), LimitError),
    "chunk limit 0": (index_header(limit=0), LimitError),
    "huge key block": (index_header(key=0xFFFFFFF0, flags=1), CorruptError),
    "key block without SEALED": (index_header(key=4) + bytes(4), CorruptError),
    "unknown index flag": (index_header(flags=4), VersionError),
    "digests in an unsigned file": (index_header(flags=2) + bytes(64), CorruptError),
    "newer index version": (index_header(version=2), VersionError),
    "another chunk index": (index_header(magic=b"XXXX"), VersionError),
    "name length past the table": (index_header(tensors=1, chunks=1, table=20) + record(name_len=65535)
                                   [:20] + chunk(), CorruptError),
    "name not UTF-8": (index_header(tensors=1, chunks=1, table=len(record(b"\xff"))) + record(b"\xff") + chunk(),
                       CorruptError),
    "255 dims": (index_header(tensors=1, table=8 + 255 * 8 + 1) + record(dims=(1,) * 255, chunks=0)[:8 + 255 * 8]
                 + bytes(1), LimitError),
    "shape too large for numpy": (index_header(tensors=1, table=len(record(dims=(1 << 40, 1 << 40))))
                                  + record(dims=(1 << 40, 1 << 40), chunks=0), LimitError),
    "unknown dtype id": (index_header(tensors=1, chunks=1, table=len(record(dtype=250))) + record(dtype=250)
                         + chunk(), UnknownDTypeError),
    "tensor claims more chunks than exist": (index_header(tensors=1, chunks=1, table=len(record(chunks=7)))
                                             + record(chunks=7) + chunk(), CorruptError),
    "raw size above the chunk limit": (index_header(tensors=1, chunks=1, limit=16, table=len(record()))
                                       + record() + chunk(raw=0xFFFFFFFF), CorruptError),
    "raw sizes disagree with the shape": (index_header(tensors=1, chunks=1, table=len(record()))
                                          + record() + chunk(raw=3), CorruptError),
    "chunk past the payload": (index_header(tensors=1, chunks=1, table=len(record())) + record()
                               + chunk(stored=0xFFFFFFFF), CorruptError),
    "chunk with a gap": (index_header(tensors=1, chunks=1, table=len(record())) + record() + chunk(offset=8),
                         CorruptError),
    "chunk reserved field": (index_header(tensors=1, chunks=1, table=len(record())) + record()
                             + chunk(reserved=1), VersionError),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_indexes_are_refused_without_big_allocations(case):
    body, error = HOSTILE[case]
    data = forge(body, payload=bytes(4))
    tracemalloc.start()
    try:
        with pytest.raises(error):
            V1File(data)
        with pytest.raises(error):
            v1.load_model(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


@pytest.mark.parametrize("size", [0, 35, 1 << 31, 0xFFFFFFFF])
def test_lying_index_sizes_are_refused(size):
    data = forge(index_header(), index_size=size)
    with pytest.raises((CorruptError, LimitError)):
        V1File(data)
    with pytest.raises((CorruptError, LimitError)):
        v1.load_model(data)


def test_huge_uncompressed_size_is_refused_before_decoding():
    data = bytearray(v1.save_model({"a": np.zeros(10, np.uint8)}, streaming=True, compression="zstd"))
    struct.pack_into("<I", data, 16, 0xFFFFFFFF)
    with pytest.raises(LimitError):
        v1.load_model(recrc(data))
    with pytest.raises(ChecksumError):  # the index CRC covers the header
        V1File(recrc(data))


# --- golden bytes ---------------------------------------------------------------------------
def test_golden_streaming_file():
    """One u8 tensor "w" = [1, 2], no compression, unsigned: every byte from FORMAT.md."""
    metadata = (b"\x83"                                   # fixmap, 3 entries
                b"\xaacreated_at" b"\xa10"
                b"\xb0aprender_version" b"\xa6golden"
                b"\xa6custom" b"\x81" b"\xaepayload_format" b"\xadapr-v1-chunks")
    header = (b"APRN" b"\x01\x00" b"\x21\x00"              # magic, version 1.0, NeuralCustom
              + struct.pack("<III", len(metadata), 2, 2)  # metadata, payload (stored), uncompressed
              + b"\x00" b"\x04" b"\x00" + bytes(9))         # compression none, STREAMING, quality, reserved
    index = (b"APRC" b"\x01" b"\x00" b"\x00\x00"           # magic, version, flags, reserved
             + struct.pack("<IIIIII", 32 + 17 + 24 + 4, 1, 1, 16 << 20, 0, 17)
             + b"\x01\x00" b"w" b"\x07" b"\x01" + struct.pack("<Q", 2) + struct.pack("<I", 1)  # tensor record
             + struct.pack("<QIIII", 0, 2, 2, zlib.crc32(b"\x01\x02"), 0))                     # chunk record
    index += struct.pack("<I", zlib.crc32(header + metadata + index))
    body = header + metadata + index + b"\x01\x02"
    expected = body + struct.pack("<I", zlib.crc32(body))
    data = v1.save_model({"w": np.array([1, 2], np.uint8)}, metadata=PINNED, streaming=True)
    assert data == expected
    with V1File(expected) as f:
        assert np.array_equal(f.get_tensor("w"), [1, 2]) and f.header["flags"] == 4


def test_threads_reading_different_tensors_get_the_right_bytes():
    from concurrent.futures import ThreadPoolExecutor

    tensors = {f"t{i}": np.full(5000, i, np.int32) for i in range(16)}
    data = v1.save_model(tensors, streaming=True, compression="lz4", chunk_size=4096, password="pw")
    with V1File(data, password="pw") as f:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda name: (name, f.get_tensor(name)), list(tensors) * 4))
    for name, value in results:
        assert np.array_equal(value, tensors[name]), name


def test_load_model_and_v1file_agree_on_every_variant(tmp_path):
    tensors = sample()
    for kw in ({}, {"compression": "zstd"}, {"password": "pw"}, {"streaming": True},
               {"streaming": True, "compression": "lz4", "password": "pw"}):
        path = tmp_path / "m.apr"
        v1.save_model(tensors, path, **kw)
        opened = {"password": "pw"} if "password" in kw else {}
        model = v1.load_model(path, **opened)
        with V1File(path, **opened) as f:
            assert f.metadata == model.metadata and f.encryption == model.encryption
            assert_same(f.tensors(), model.payload)
            assert f.kind == ("streaming" if kw.get("streaming") else "whole" if kw else "plain")


@pytest.mark.parametrize("compression,stored,raw", [(0, 4, 8), (1, 4, 1 << 30), (3, 8, 1 << 20)])
def test_raw_sizes_the_stored_bytes_cannot_produce_are_refused_at_open(compression, stored, raw):
    """A whole tensor's buffer is allocated before its chunks decode: each declared raw
    size must be producible from the chunk's stored bytes first."""
    body = (index_header(tensors=1, chunks=1, limit=1 << 30, table=len(record(dims=(raw,))))
            + record(dims=(raw,)) + chunk(stored=stored, raw=raw))
    data = bytearray(forge(body, payload=bytes(stored)))
    data[20] = compression
    struct.pack_into("<I", data, 16, raw)
    data = fix_crcs(data, chunks=False)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptError, match="cannot hold"):
            V1File(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


@pytest.mark.parametrize("kw", [{}, {"compression": "lz4"}, {"password": "pw"}, {"streaming": True},
                                {"streaming": True, "password": "pw"}])
def test_every_kind_of_signed_file_is_verified_before_use(kw):
    seed, public = crypto.generate_signing_key()
    opened = {"password": "pw"} if "password" in kw else {}
    data = bytearray(v1.save_model(sample(), signing_key=seed, **kw))
    with V1File(bytes(data), trusted_keys=[public], **opened) as f:
        assert f.signature == v1.TRUSTED
        assert_same(f.tensors(), sample())
    with pytest.raises(SignatureError, match="not among"):
        V1File(bytes(data), trusted_keys=[bytes(32)], **opened)
    data[-120] ^= 1  # a byte of the last tensor, just before the signature block
    if not kw.get("streaming"):
        with pytest.raises(SignatureError):  # hashed whole at open
            V1File(recrc(data), trusted_keys=[public], **opened)
        return
    with V1File(recrc(data), trusted_keys=[public], **opened) as f:  # the index signature holds
        assert np.array_equal(f.get_tensor("a"), sample()["a"])
        with pytest.raises(ChecksumError, match="tensor 'c'"):  # its CRC, checked before its digest
            f.get_tensor("c")
    with pytest.raises(AprError):
        v1.load_model(recrc(data), **opened)


def test_a_signed_flag_without_a_signed_index_is_refused():
    data = v1.save_model(sample(), streaming=True)
    forged = bytearray(data[:-4] + bytes(96) + data[-4:])
    forged[21] |= Flag.SIGNED
    forged = fix_crcs(forged, chunks=False)
    with pytest.raises(SignatureError, match="no digests"):
        V1File(forged)
    with pytest.raises(SignatureError):  # the whole-file signature of zeros
        v1.load_model(forged)


def test_packed_tensors_round_trip_and_refuse_elementwise_slices():
    from aprfast.numerics import quantization

    weights = np.linspace(-1, 1, 64 * 32, dtype=np.float32).reshape(64, 32)
    packed = quantization.quantize(weights, "Q8_0")
    data = v1.save_model({"q": packed, "f": weights}, streaming=True, compression="zstd", chunk_size=100)
    with V1File(data) as f:
        got = f.get_tensor("q")
        assert got.dtype.name == "Q8_0" and got.shape == (64, 32) and got.data.tobytes() == packed.data.tobytes()
        with pytest.raises(LayoutError):
            f.get_slice("q")
    assert v1.load_model(data).payload["q"].data.tobytes() == packed.data.tobytes()


def test_unknown_dtype_ids_can_be_served_raw():
    data = bytearray(v1.save_model({"t": np.arange(4, dtype=np.uint8)}, metadata=PINNED, streaming=True))
    table = index_fields(data)["start"] + IDX
    assert data[table + 3] == 7  # name_len 1, "t", then the dtype byte (u8 = 7)
    data[table + 3] = 200
    data = fix_crcs(data, chunks=False)
    with pytest.raises(UnknownDTypeError):
        V1File(data)
    with V1File(data, unknown_dtypes="raw") as f:
        raw = f.get_tensor("t")
        assert raw.dtype is None and raw.dtype_id == 200 and raw.data.tobytes() == bytes(range(4))


@pytest.mark.parametrize("key", [np.s_[::-1], np.s_[2], np.s_[-1, ::2], np.s_[1:6:2, None, ..., 1], np.s_[..., 0],
                                 np.s_[3:1], np.s_[:, 4:1:-1], np.s_[None], np.s_[-3:]])
def test_slices_match_numpy_across_odd_chunk_boundaries(key):
    value = np.arange(7 * 5 * 3, dtype=np.int16).reshape(7, 5, 3)
    data = v1.save_model({"a": value, "z": np.float32(2.5)}, streaming=True, compression="lz4", chunk_size=7)
    with V1File(data) as f:
        assert np.array_equal(f.get_slice("a")[key], value[key])
        assert f.get_slice("z")[()] == np.float32(2.5)
