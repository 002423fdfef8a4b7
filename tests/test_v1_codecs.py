"""v1 payload compression (aprfast.codecs): ids 0-3 as aprender writes them, and
decompression that never allocates more than the header or the limit allows."""

from __future__ import annotations

import os
import struct
import time
import tracemalloc

import lz4.block
import pytest
import zstandard

from aprfast.codecs import payload as codecs
from aprfast.codecs.payload import Compression
from aprfast.errors import CorruptError, LimitError, VersionError

# ASan (tests/sanitize.sh) slows every instruction; a hang still shows at ten times the bound.
SECONDS = 10.0 if os.environ.get("APRFAST_SANITIZED") else 1.0
SAMPLE = b"".join(struct.pack("<If", i, i * 0.25) for i in range(5000)) + b"tail" * 100


# --- ids and names ---------------------------------------------------------------------
def test_ids_and_aprender_names_match_the_rust_enum():
    assert [(int(c), c.aprender_name) for c in Compression] == [
        (0, "None"), (1, "ZstdDefault"), (2, "ZstdMax"), (3, "Lz4")]
    assert codecs.ZSTD_LEVELS == {Compression.ZSTD_DEFAULT: 3, Compression.ZSTD_MAX: 19}
    assert codecs.MAX_UNCOMPRESSED_SIZE == 1 << 30


@pytest.mark.parametrize("value, member", [
    ("none", Compression.NONE), ("zstd", Compression.ZSTD_DEFAULT), ("zstd-max", Compression.ZSTD_MAX),
    ("ZstdMax", Compression.ZSTD_MAX), ("lz4", Compression.LZ4), ("Lz4", Compression.LZ4), (0, Compression.NONE),
    (3, Compression.LZ4), (Compression.ZSTD_DEFAULT, Compression.ZSTD_DEFAULT)])
def test_compression_is_named_by_id_alias_or_aprender_name(value, member):
    assert Compression.from_value(value) is member


def test_unknown_compressions_are_refused():
    with pytest.raises(VersionError):
        Compression.from_value(4)
    with pytest.raises(ValueError):
        Compression.from_value("brotli")
    with pytest.raises(TypeError):
        Compression.from_value(1.0)


# --- round trips and frame shape -------------------------------------------------------
@pytest.mark.parametrize("compression", list(Compression))
@pytest.mark.parametrize("data", [b"", b"x", SAMPLE, os.urandom(70000)], ids=["empty", "1", "sample", "random"])
def test_every_codec_round_trips(compression, data):
    packed = codecs.compress(data, compression)
    assert bytes(codecs.decompress(packed, compression, expected_size=len(data))) == data


@pytest.mark.parametrize("compression", [Compression.ZSTD_DEFAULT, Compression.ZSTD_MAX])
def test_zstd_frames_are_shaped_like_rust_encode_all(compression):
    """Streamed: no content size and no checksum in the frame header."""
    frame = codecs.compress(SAMPLE, compression)
    params = zstandard.get_frame_parameters(frame)
    assert params.content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert not params.has_checksum
    assert frame[:4] == b"\x28\xb5\x2f\xfd"


@pytest.mark.parametrize("compression, level", [("zstd", 3), ("zstd-max", 19)])
def test_each_zstd_id_uses_aprenders_level(compression, level):
    stream = zstandard.ZstdCompressor(level=level, write_content_size=False, write_checksum=False).compressobj()
    assert codecs.compress(SAMPLE, compression) == stream.compress(SAMPLE) + stream.flush()


def test_lz4_is_a_size_prefixed_block_like_lz4_flex():
    packed = codecs.compress(SAMPLE, "lz4")
    assert int.from_bytes(packed[:4], "little") == len(SAMPLE)
    assert lz4.block.decompress(packed[4:], uncompressed_size=len(SAMPLE)) == SAMPLE


def test_several_zstd_frames_are_read_in_turn_like_rust_decode_all():
    two = codecs.compress(b"abc" * 100, "zstd") + codecs.compress(b"xyz" * 100, "zstd-max")
    assert codecs.decompress(two, "zstd", expected_size=600) == b"abc" * 100 + b"xyz" * 100


def test_none_returns_the_payload_itself_and_checks_its_length():
    view = memoryview(SAMPLE)
    assert codecs.decompress(view, "none", expected_size=len(SAMPLE)) is view
    with pytest.raises(CorruptError, match="header says"):
        codecs.decompress(view, "none", expected_size=len(SAMPLE) - 1)


# --- declared sizes are never trusted ---------------------------------------------------
def test_a_megabyte_of_zeros_claiming_100_bytes_is_refused_for_every_codec():
    zeros = bytes(1 << 20)
    zstd_frame = codecs.compress(zeros, "zstd")
    with pytest.raises(CorruptError, match="beyond the 100 bytes"):
        codecs.decompress(zstd_frame, "zstd", expected_size=100)
    # An LZ4 block whose prefix lies: it claims 100 bytes and holds a megabyte.
    lying = (100).to_bytes(4, "little") + lz4.block.compress(zeros, store_size=False)
    with pytest.raises(CorruptError, match="does not decompress"):
        codecs.decompress(lying, "lz4", expected_size=100)
    # An honest prefix that disagrees with the header is refused before decompressing.
    honest = codecs.compress(zeros, "lz4")
    with pytest.raises(CorruptError, match="header says 100"):
        codecs.decompress(honest, "lz4", expected_size=100)


def test_lz4_prefix_is_checked_against_the_limit_before_allocating():
    claims_two_gib = (2 << 30).to_bytes(4, "little") + b"\x00"
    tracemalloc.start()
    try:
        with pytest.raises(LimitError, match="above the limit"):
            codecs.decompress(claims_two_gib, "lz4", expected_size=100)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_declared_size_above_the_limit_is_refused_first():
    for compression in Compression:
        with pytest.raises(LimitError):
            codecs.decompress(b"", compression, expected_size=2000, limit=1000)


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_payloads_shorter_than_declared_are_corrupt(compression):
    packed = codecs.compress(b"q" * 1000, compression)
    if compression == "lz4":  # keep the prefix honest to the header, lie in the block
        packed = (2000).to_bytes(4, "little") + packed[4:]
    with pytest.raises(CorruptError):
        codecs.decompress(packed, compression, expected_size=2000)


@pytest.mark.parametrize("data, compression", [
    (b"\x28\xb5\x2f\xfd garbage", "zstd"), (b"not zstd at all", "zstd-max"), (b"\x01\x02", "lz4"),
    (b"\x10\x00\x00\x00\xff\xff\xff", "lz4")])
def test_garbage_is_corrupt_not_a_crash(data, compression):
    with pytest.raises(CorruptError):
        codecs.decompress(data, compression, expected_size=16)


def test_trailing_garbage_after_a_zstd_frame_is_corrupt():
    frame = codecs.compress(b"abc" * 100, "zstd")
    with pytest.raises(CorruptError):
        codecs.decompress(frame + b"junk!", "zstd", expected_size=300)


# --- bombs: a frame that inflates without bound must stop at once, in little memory ------
def rle_bomb(total: int, *, content_size: bool = False) -> bytes:
    """A hand-made zstd frame of RLE blocks (4 bytes per 128 KiB, the best ratio zstd
    allows: a block never regenerates more than 128 KiB) inflating to ``total`` bytes."""
    block = 128 << 10
    if content_size:  # FCS field of 8 bytes declaring the (true) size
        head = b"\x28\xb5\x2f\xfd" + bytes([0xC0]) + bytes([0x38]) + total.to_bytes(8, "little")
    else:  # no content size; window descriptor: 2^17 bytes
        head = b"\x28\xb5\x2f\xfd" + bytes([0x00]) + bytes([0x38])
    count = total // block
    body = bytearray()
    for i in range(count):
        last = 1 if i == count - 1 else 0
        body += ((block << 3) | (1 << 1) | last).to_bytes(3, "little") + b"\x00"
    return head + bytes(body)


def test_the_rle_bomb_is_a_real_bomb():
    bomb = rle_bomb(4 << 20)
    assert len(bomb) < 200
    assert len(zstandard.ZstdDecompressor().stream_reader(bomb).read()) == 4 << 20


@pytest.mark.parametrize("content_size", [False, True], ids=["no-fcs", "fcs-10GiB"])
def test_a_ten_gib_zstd_bomb_claiming_100_bytes_fails_fast_in_little_memory(content_size):
    bomb = rle_bomb(10 << 30, content_size=content_size)
    assert len(bomb) < 400_000  # 81,920 RLE blocks: the smallest 10 GiB zstd can express
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(CorruptError, match="beyond the 100 bytes"):
            codecs.decompress(bomb, "zstd", expected_size=100)
        elapsed = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < SECONDS
    assert peak < 1 << 20


def test_a_4_kib_zstd_bomb_stops_at_the_header_size(run_child):
    """A 4 KiB frame (1022 RLE blocks) inflating to ~128 MiB, declared as 64 KiB: the child process's peak
    RSS grows by far less than the bomb's size."""
    script = r"""
import sys
sys.path.insert(0, sys.argv[1])
from test_v1_codecs import rle_bomb
from aprfast import codecs
from aprfast.errors import CorruptError

def peak_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

bomb = rle_bomb(1022 * (128 << 10))
assert len(bomb) <= 4096, len(bomb)
before = peak_kib()
try:
    codecs.decompress(bomb, "zstd", expected_size=64 << 10)
except CorruptError:
    pass
else:
    raise SystemExit("bomb not refused")
print(peak_kib() - before)
"""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("needs /proc to read the peak RSS")
    result = run_child(script, os.path.dirname(os.path.abspath(__file__)))
    assert result.returncode == 0, result.stderr
    grown_kib = int(result.stdout.strip())
    assert grown_kib < 16 << 10, f"peak RSS grew by {grown_kib} KiB decompressing a 128 MiB bomb"
