"""Hostile files: whatever bytes a reader is handed, it answers with a typed AprError.

The contract checked here, for both v2 layouts (aprender's ``APR\\0`` and the spec's
``APR2``):

* every truncation, every single-bit flip, and every structural lie of a valid file
  is refused with an :class:`aprfast.AprError` subclass whose ``code`` says what kind
  of problem it is and whose message names the numbers read from the file;
* refusing takes well under a second and allocates less than 8 MiB, even when the
  file declares terabytes or billions of tensors;
* nothing else escapes: no crash, hang, MemoryError, IndexError, struct.error,
  UnicodeDecodeError, RecursionError or bare ValueError.

Lies are crafted by :mod:`hostile_builders` with valid checksums (aprender's header
CRC and both footers are recomputed after patching), so the structural checks are what
the reader trips over, not the CRC.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import time
import tracemalloc
from dataclasses import dataclass, field
from unittest import mock

import hostile_builders as hb
import numpy as np
import pytest
from hostile_builders import APR2, APRENDER, LAYOUTS, Entry, Parts, build
from hypothesis import given
from hypothesis import strategies as st

import aprfast
import aprfast._memory
from aprfast import (
    AprError,
    ChecksumError,
    CorruptError,
    FormatError,
    LimitError,
    Limits,
    RawTensor,
    UnknownDTypeError,
    VersionError,
)

MiB = 1 << 20
MAX_PEAK_BYTES = 8 * MiB
# Under tests/sanitize.sh every instruction is instrumented and ASan's quarantine makes the
# collector walk more; a hang is still minutes there, so ten times the bound still tells it.
MAX_SECONDS = 10.0 if os.environ.get("APRFAST_SANITIZED") else 1.0
TIB = 1 << 40


# --- the valid file every hostile file starts from ------------------------------------
def base_tensors() -> dict:
    """A few dtypes, a 0-d tensor and an empty one."""
    return {
        "a.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b.bias": np.array([1, -2, 3], dtype=np.int64),
        "c.scalar": np.array(3.5, dtype=np.float64),
        "d.empty": np.zeros((0, 4), dtype=np.float16),
        "e.bytes": np.arange(5, dtype=np.uint8),
    }


BASE_METADATA = {"name": "hostile", "description": "a small valid file", "custom_key": [1, 2, {"x": None}]}


@functools.lru_cache(maxsize=None)
def valid_file(layout: str) -> bytes:
    return aprfast.save(base_tensors(), metadata=BASE_METADATA, layout=layout)


def dtype_id(layout: str, name: str) -> int:
    return hb.DTYPE_IDS[layout][name]


def small_parts(layout: str) -> Parts:
    """The base tensors as raw index entries and data, ready to be lied about."""
    return hb.honest(layout, base_tensors())


def entry(parts: Parts, name: str) -> Entry:
    return next(e for e in parts.entries if e.name == name)


@pytest.fixture(params=LAYOUTS)
def layout(request) -> str:
    return request.param


# --- measuring a refusal ----------------------------------------------------------------
@contextlib.contextmanager
def bounded_cost():
    """Fail if the block takes a second or more, or allocates 8 MiB or more: traced by
    tracemalloc, or asked of aprfast's aligned allocator, which tracemalloc cannot see."""
    untraced = []
    real = aprfast._memory.AlignedBuffer

    def spy(size, alignment=64, **options):
        untraced.append(size)
        return real(size, alignment, **options)

    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    baseline, _ = tracemalloc.get_traced_memory()
    start = time.perf_counter()
    try:
        with mock.patch.object(aprfast._memory, "AlignedBuffer", spy):
            yield
    finally:
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
        if not was_tracing:
            tracemalloc.stop()
    assert elapsed < MAX_SECONDS, f"took {elapsed:.2f} s"
    assert peak - baseline < MAX_PEAK_BYTES, f"peak traced memory {peak - baseline} bytes"
    assert max(untraced, default=0) < MAX_PEAK_BYTES, f"aligned buffers of {untraced} bytes"


@contextlib.contextmanager
def bounded_cost_over_a_loop():
    """Like bounded_cost for the peak memory of a whole loop (time is checked per call)."""
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    baseline, _ = tracemalloc.get_traced_memory()
    try:
        yield
    finally:
        _, peak = tracemalloc.get_traced_memory()
        if not was_tracing:
            tracemalloc.stop()
    assert peak - baseline < MAX_PEAK_BYTES, f"peak traced memory {peak - baseline} bytes"


def refused(call, error=AprError, *, mentions=()) -> AprError:
    """Run ``call``; it must raise exactly ``error`` (with its code), cheaply, with every
    item of ``mentions`` in the message.  Any other exception fails the test."""
    caught = None
    with bounded_cost():
        try:
            call()
        except AprError as exc:
            caught = exc
        except BaseException as exc:  # noqa: BLE001 - anything untyped is the failure
            pytest.fail(f"{type(exc).__name__} escaped instead of an AprError: {exc!r}")
    assert caught is not None, f"expected {error.__name__}, but the call succeeded"
    if error is not AprError:
        assert type(caught) is error, f"expected {error.__name__}, got {type(caught).__name__}: {caught}"
        assert caught.code == error.code
    message = str(caught)
    assert message.startswith(f"[{caught.code}]")
    for item in mentions:
        assert str(item) in message, f"{item!r} is not named in: {message}"
    return caught


def typed_or(call):
    """Run ``call``; return its result, or None if it raised an AprError.  Anything
    else escaping (ValueError, IndexError, MemoryError, ...) fails the test."""
    try:
        return call()
    except AprError:
        return None
    except BaseException as exc:  # noqa: BLE001
        pytest.fail(f"{type(exc).__name__} escaped instead of an AprError: {exc!r}")


def open_and_close(data, **kwargs):
    aprfast.open(data, **kwargs).close()


def test_cost_meter_catches_big_allocations_both_traced_and_aligned():
    with pytest.raises(AssertionError, match="peak traced memory"):
        with bounded_cost():
            bytearray(MAX_PEAK_BYTES)
    big = aprfast.save({"big": np.zeros(MAX_PEAK_BYTES, np.uint8)}, layout="apr2")
    with pytest.raises(AssertionError, match="aligned buffers"):
        with bounded_cost():
            aprfast.load(big)  # the data section goes into one aligned arena


# --- the builders are faithful ----------------------------------------------------------
def test_builder_writes_the_same_bytes_as_aprfast_for_an_honest_file(layout):
    honest = build(layout, small_parts(layout))
    assert honest == aprfast.save(base_tensors(), metadata={"name": "hostile"}, layout=layout)


def test_valid_base_file_reads_back(layout):
    data = valid_file(layout)
    loaded = aprfast.load(data)
    for name, want in base_tensors().items():
        assert loaded[name].shape == want.shape
        np.testing.assert_array_equal(loaded[name], want)
    with aprfast.open(data) as f:
        assert f.metadata["name"] == "hostile"
        f.verify()


# --- 1. truncation at every offset ------------------------------------------------------
def test_every_truncation_is_refused_by_load(layout):
    data = valid_file(layout)
    for k in range(len(data)):
        with bounded_cost():
            try:
                aprfast.load(data[:k])
            except AprError:
                continue
            except BaseException as exc:  # noqa: BLE001
                pytest.fail(f"load(data[:{k}]) raised {type(exc).__name__}: {exc!r}")
        pytest.fail(f"load(data[:{k}]) of a {len(data)}-byte file succeeded")


def test_every_truncation_is_refused_by_lazy_open(layout):
    data = valid_file(layout)
    opened = []
    for k in range(len(data)):
        with bounded_cost():
            try:
                aprfast.open(data[:k]).close()
            except AprError:
                continue
            except BaseException as exc:  # noqa: BLE001
                pytest.fail(f"open(data[:{k}]) raised {type(exc).__name__}: {exc!r}")
        opened.append(k)
    assert not opened, f"open() accepted {len(opened)} truncations of the {len(data)}-byte file: {opened}"


def test_truncated_file_that_opens_lazily_still_fails_verify(layout):
    data = valid_file(layout)
    for k in range(len(data)):
        f = typed_or(lambda: aprfast.open(data[:k]))
        if f is None:
            continue
        with f:
            refused(f.verify, ChecksumError)


def test_empty_and_tiny_files_are_not_v2_files():
    refused(lambda: aprfast.load(b""), FormatError, mentions=["0 bytes"])
    refused(lambda: aprfast.open(b"APR"), FormatError, mentions=["3 bytes"])
    refused(lambda: aprfast.inspect(b"\x00"), FormatError, mentions=["1 bytes"])


@pytest.mark.parametrize("magic", [b"APR\x00", b"APR2"])
def test_file_with_a_v2_magic_but_no_room_for_a_header_is_refused(magic):
    data = magic + bytes(20)
    refused(lambda: aprfast.open(data), FormatError, mentions=["24 bytes"])


# --- 2. every single-bit flip -------------------------------------------------------------
def expected_flip_codes(layout: str, data: bytes, byte: int) -> set:
    """Which error codes a flip of ``byte`` may give from ``load`` (which checks the CRC)."""
    region = next((name for name, (lo, hi) in hb.sections(data).items() if lo <= byte < hi), "padding")
    if region == "magic":
        return {"E001"}
    if layout == APRENDER:
        # The header CRC covers bytes 4..64; everything outside the index is only CRC'd.
        return {"E001", "E002", "E004", "E008"} if region == "index" else {"E004"}
    if region in ("footer_magic", "footer_size"):
        return {"E002"}
    if region in ("header", "index"):  # APR2 has no header CRC: any structural code
        return {"E001", "E002", "E003", "E004", "E008"}
    return {"E004"}  # metadata, data, padding, footer CRC


def test_every_bit_flip_is_refused_by_load(layout):
    data = valid_file(layout)
    with bounded_cost_over_a_loop():
        for bit in range(len(data) * 8):
            flipped = hb.flip_bit(data, bit)
            start = time.perf_counter()
            try:
                aprfast.load(flipped)
            except AprError as exc:
                codes = expected_flip_codes(layout, data, bit // 8)
                assert exc.code in codes, f"bit {bit} (byte {bit // 8}): {exc} not in {codes}"
            except BaseException as exc:  # noqa: BLE001
                pytest.fail(f"bit {bit}: load raised {type(exc).__name__}: {exc!r}")
            else:
                pytest.fail(f"bit {bit} (byte {bit // 8}) flipped and load() succeeded")
            assert time.perf_counter() - start < MAX_SECONDS


def test_every_bit_flip_is_refused_by_open_or_caught_by_verify(layout):
    data = valid_file(layout)
    with bounded_cost_over_a_loop():
        for bit in range(len(data) * 8):
            flipped = hb.flip_bit(data, bit)
            try:
                f = aprfast.open(flipped)
            except AprError:
                continue
            except BaseException as exc:  # noqa: BLE001
                pytest.fail(f"bit {bit}: open raised {type(exc).__name__}: {exc!r}")
            with f:
                with pytest.raises(ChecksumError):
                    f.verify()


def test_aprender_header_crc_catches_every_header_bit_flip_before_anything_else():
    data = valid_file(APRENDER)
    for bit in range(4 * 8, 64 * 8):
        flipped = hb.flip_bit(data, bit)
        exc = refused(lambda: aprfast.open(flipped), ChecksumError, mentions=["header CRC32"])
        assert exc.code == "E004"


# --- 3. structural lies with valid checksums ----------------------------------------------
@dataclass
class Lie:
    data: bytes
    error: type
    mentions: list = field(default_factory=list)
    limits: Limits | None = None
    sealed: bool = True  # checksums valid, so only structure can give it away


LIES = {}


def lie(*layouts):
    """Register a function ``(layout) -> Lie`` as a crafted case for ``layouts``."""
    def register(fn):
        LIES[fn.__name__] = (fn, layouts or LAYOUTS)
        return fn
    return register


def lie_params():
    return [pytest.param(layout, name, id=f"{layout}-{name}")
            for name, (_, layouts) in LIES.items() for layout in layouts]


# header and section geometry
@lie()
def tensor_count_of_four_billion_with_a_tiny_index(layout):
    data = build(layout, small_parts(layout), tensor_count=2**32 - 1)
    return Lie(data, LimitError, [2**32 - 1, aprfast.limits.MAX_TENSOR_COUNT])


@lie()
def tensor_count_of_four_billion_under_a_raised_count_limit(layout):
    data = build(layout, small_parts(layout), tensor_count=2**32 - 1)
    return Lie(data, CorruptError, [2**32 - 1], limits=Limits(max_tensor_count=2**32))


@lie()
def tensor_count_one_more_than_the_index_holds(layout):
    return Lie(build(layout, small_parts(layout), tensor_count=6), CorruptError)


@lie()
def metadata_size_of_four_gib(layout):
    data = build(layout, small_parts(layout), metadata_size=2**32 - 1)
    return Lie(data, LimitError, [2**32 - 1, aprfast.limits.MAX_METADATA_SIZE])


@lie()
def metadata_size_past_the_end_of_the_file(layout):
    size = 10_000  # under the limit, over the file
    return Lie(build(layout, small_parts(layout), metadata_size=size), CorruptError, [size])


@lie(APRENDER)
def metadata_offset_a_terabyte_past_the_end(layout):
    return Lie(build(layout, small_parts(layout), metadata_offset=TIB), CorruptError, [TIB])


@lie(APR2)
def metadata_offset_at_the_end_of_the_u32_range(layout):
    offset = 2**32 - 1
    return Lie(build(layout, small_parts(layout), metadata_offset=offset), CorruptError, [offset])


@lie()
def index_offset_after_the_data_offset(layout):
    sections = hb.sections(build(layout, small_parts(layout)))
    data_offset = sections["data"][0]
    index_offset = data_offset + 64
    data = build(layout, small_parts(layout), index_offset=index_offset)
    return Lie(data, CorruptError, [index_offset, data_offset])


@lie(APRENDER)
def data_offset_a_terabyte_past_the_end(layout):
    return Lie(build(layout, small_parts(layout), data_offset=TIB), CorruptError, [TIB])


@lie(APR2)
def data_offset_at_the_end_of_the_u32_range(layout):
    offset = 2**32 - 1
    return Lie(build(layout, small_parts(layout), data_offset=offset), CorruptError, [offset])


@lie(APR2)
def index_size_smaller_than_the_index_header(layout):
    return Lie(build(layout, small_parts(layout), index_size=4), CorruptError, [4])


@lie(APR2)
def index_size_of_four_gib(layout):
    size = 2**32 - 1
    return Lie(build(layout, small_parts(layout), index_size=size), CorruptError, [size])


# tensor extents and sizes
@lie()
def tensor_offset_a_terabyte_past_the_data(layout):
    parts = small_parts(layout)
    entry(parts, "a.weight").offset = TIB
    return Lie(build(layout, parts), CorruptError, ["a.weight", TIB])


@lie()
def tensor_declaring_a_terabyte(layout):
    parts = small_parts(layout)
    parts.entries[0] = Entry("a.weight", dtype_id(layout, "F32"), (TIB // 4,), 0, TIB)
    return Lie(build(layout, parts), CorruptError, ["a.weight", TIB])


@lie()
def tensor_extent_that_wraps_around_2_64(layout):
    parts = small_parts(layout)
    size = 2**64 - 32
    parts.entries[0] = Entry("a.weight", dtype_id(layout, "F32"), (size // 4,), 64, size)
    return Lie(build(layout, parts), CorruptError, ["a.weight", 64, size])


@lie()
def size_bigger_than_shape_times_dtype(layout):
    parts = small_parts(layout)
    entry(parts, "a.weight").size = 28  # 2x3 f32 is 24; 28 still lies inside the padding
    return Lie(build(layout, parts), CorruptError, ["a.weight", 24, 28])


@lie()
def size_smaller_than_shape_times_dtype(layout):
    parts = small_parts(layout)
    entry(parts, "b.bias").size = 20  # 3 x i64 is 24
    return Lie(build(layout, parts), CorruptError, ["b.bias", 24, 20])


@lie()
def nonzero_size_for_an_empty_tensor(layout):
    parts = small_parts(layout)
    entry(parts, "d.empty").size = 8
    return Lie(build(layout, parts), CorruptError, ["d.empty", 8])


@lie()
def dims_whose_product_overflows_2_64(layout):
    parts = small_parts(layout)
    entry(parts, "a.weight").dims = (2**32, 2**32, 2**32)
    return Lie(build(layout, parts), CorruptError, ["a.weight", 2**32])


@lie()
def a_dim_of_2_63(layout):
    parts = small_parts(layout)
    entry(parts, "a.weight").dims = (2**63,)
    return Lie(build(layout, parts), CorruptError, ["a.weight", 2**63])


@lie()
def a_dim_of_2_64_minus_1(layout):
    parts = small_parts(layout)
    entry(parts, "a.weight").dims = (2**64 - 1, 1)
    return Lie(build(layout, parts), CorruptError, ["a.weight", 2**64 - 1])


@lie()
def quantized_shape_whose_block_bytes_overflow(layout):
    parts = small_parts(layout)
    parts.entries[0] = Entry("a.weight", dtype_id(layout, "Q4_K"), (2**62, 1), 0, 144)
    return Lie(build(layout, parts), CorruptError, ["a.weight", 2**62])


@lie()
def overlapping_extents_of_two_tensors(layout):
    parts = small_parts(layout)
    entry(parts, "b.bias").offset = entry(parts, "a.weight").offset + 8
    return Lie(build(layout, parts), CorruptError, ["a.weight", "b.bias"])


# names
@lie()
def duplicate_names(layout):
    parts = small_parts(layout)
    parts.entries[1].name = parts.entries[0].name
    return Lie(build(layout, parts), CorruptError, ["a.weight"])


@lie()
def duplicate_names_that_are_not_adjacent(layout):
    parts = small_parts(layout)
    parts.entries[4].name = parts.entries[0].name
    return Lie(build(layout, parts), CorruptError, ["a.weight"])


@lie()
def names_out_of_order(layout):
    parts = small_parts(layout)
    parts.entries[0], parts.entries[1] = parts.entries[1], parts.entries[0]
    return Lie(build(layout, parts), CorruptError, ["a.weight", "b.bias"])


@lie()
def name_that_is_not_utf8(layout):
    parts = small_parts(layout)
    parts.entries[0].name = b"a.\xff\xfe"
    return Lie(build(layout, parts), CorruptError, ["UTF-8"])


@lie()
def name_length_past_the_end_of_the_index(layout):
    parts = small_parts(layout)
    parts.entries[-1].name_len = 60_000
    return Lie(build(layout, parts), CorruptError, [60_000])


@lie()
def ndim_past_the_end_of_the_index(layout):
    parts = small_parts(layout)
    parts.entries[-1].ndim = 8  # within the dim limit, but the dims are not there
    return Lie(build(layout, parts), CorruptError, [8])


@lie()
def ndim_of_255(layout):
    parts = small_parts(layout)
    entry(parts, "a.weight").ndim = 255
    return Lie(build(layout, parts), LimitError, [255, aprfast.limits.MAX_DIMS])


@lie()
def index_of_random_garbage(layout):
    garbage = np.random.default_rng(7).integers(0, 256, 300, dtype=np.uint8).tobytes()
    return Lie(build(layout, small_parts(layout), index=garbage), AprError)


# dtypes
@lie()
def unknown_dtype_id_99(layout):
    parts = small_parts(layout)
    entry(parts, "e.bytes").dtype_id = 99
    return Lie(build(layout, parts), UnknownDTypeError, ["e.bytes", 99])


@lie()
def unknown_dtype_id_200(layout):
    parts = small_parts(layout)
    entry(parts, "e.bytes").dtype_id = 200
    return Lie(build(layout, parts), UnknownDTypeError, ["e.bytes", 200])


# versions, flags, magics and footers
@lie()
def version_major_3(layout):
    return Lie(build(layout, small_parts(layout), major=3), VersionError, ["3.0"])


@lie(APRENDER)
def version_major_1_under_the_v2_magic(layout):
    return Lie(build(layout, small_parts(layout), major=1), VersionError, ["1.0"])


@lie(APRENDER)
def column_major_flag(layout):
    flags = hb.APRENDER_ROW_MAJOR | hb.APRENDER_COLUMN_MAJOR
    return Lie(build(layout, small_parts(layout), flags=flags), VersionError, ["LAYOUT_COLUMN_MAJOR"])


@lie(APRENDER)
def header_crc_that_does_not_match(layout):
    data = build(layout, small_parts(layout), header_crc=0xDEADBEEF)
    return Lie(data, ChecksumError, ["0xdeadbeef"], sealed=False)


@lie(APR2)
def compressed_entry_without_the_header_flag(layout):
    """Per-tensor compression (docs/FORMAT.md §3.1) needs the header's COMPRESSED flag."""
    parts = small_parts(layout)
    e = entry(parts, "a.weight")
    e.raw_size, e.flags = e.size, 1
    return Lie(build(layout, parts), CorruptError, ["COMPRESSED"])


@lie(APR2)
def encrypted_flag(layout):
    flags = hb.APR2_ALIGNED_64 | hb.APR2_ENCRYPTED
    # an ENCRYPTED file must carry its security block (FORMAT §3.2): without one it is corrupt
    return Lie(build(layout, small_parts(layout), flags=flags), CorruptError, ["ENCRYPTED"])


@lie(APR2)
def signed_and_streaming_flags(layout):
    flags = hb.APR2_ALIGNED_64 | hb.APR2_SIGNED | hb.APR2_STREAMING
    return Lie(build(layout, small_parts(layout), flags=flags), VersionError, ["SIGNED", "STREAMING"])


@lie(APR2)
def raw_size_without_a_codec(layout):
    parts = small_parts(layout)
    entry(parts, "a.weight").raw_size = 24
    return Lie(build(layout, parts), CorruptError, ["raw_size 24"])


@lie(APR2)
def codec_without_a_raw_size(layout):
    parts = small_parts(layout)
    entry(parts, "a.weight").flags = 1
    return Lie(build(layout, parts), CorruptError, ["raw_size 0"])


@lie(APR2)
def per_tensor_codec_unknown(layout):
    parts = small_parts(layout)
    e = entry(parts, "a.weight")
    e.raw_size, e.flags = e.size, 3
    return Lie(build(layout, parts, flags=hb.APR2_ALIGNED_64 | hb.APR2_COMPRESSED), VersionError, ["0x3"])


@lie(APR2)
def per_tensor_reserved_flag_bit(layout):
    parts = small_parts(layout)
    entry(parts, "a.weight").flags = 0x100
    return Lie(build(layout, parts), VersionError, ["0x100"])


@lie(APR2)
def footer_magic_wrong(layout):
    return Lie(build(layout, small_parts(layout), footer_magic=b"XXXX"), CorruptError, ["XXXX"])


@lie(APR2)
def footer_file_size_one_too_big(layout):
    size = len(build(layout, small_parts(layout))) + 1
    return Lie(build(layout, small_parts(layout), footer_size=size), CorruptError, [size, size - 1])


@lie(APR2)
def footer_file_size_of_2_63(layout):
    return Lie(build(layout, small_parts(layout), footer_size=2**63), CorruptError, [2**63])


@lie()
def wrong_magic(layout):
    return Lie(build(layout, small_parts(layout), magic=b"XPR\x01"), FormatError, ["XPR"])


@lie()
def v1_aprn_magic(layout):
    # Every reader takes an APRN file for a v1 container (one open for every variant);
    # v2 bytes behind that magic say version 2 there, which no v1 reader accepts.
    return Lie(build(layout, small_parts(layout), magic=b"APRN"), VersionError, ["v1", "2.0"])


@lie()
def historical_apr1_magic(layout):
    # APR1 is read now (layouts/apr1.py): v2 bytes behind its magic are a corrupt APR1
    return Lie(build(layout, small_parts(layout), magic=b"APR1"), CorruptError, ["APR1"])


def make_lie(layout, name) -> Lie:
    fn, _ = LIES[name]
    made = fn(layout)
    if made.sealed:
        resealed = hb.fix_checksums(made.data, apr2_file_size=False)
        assert resealed == made.data, "the crafted file's checksums must be valid"
    return made


@pytest.mark.parametrize("layout, name", lie_params())
def test_crafted_lie_is_refused_at_open(layout, name):
    made = make_lie(layout, name)
    refused(lambda: open_and_close(made.data, limits=made.limits), made.error, mentions=made.mentions)


@pytest.mark.parametrize("layout, name", lie_params())
def test_crafted_lie_is_refused_by_load(layout, name):
    made = make_lie(layout, name)
    refused(lambda: aprfast.load(made.data, limits=made.limits), made.error, mentions=made.mentions)


# --- 5. the same lies from a path (mmap, pread, load_file, inspect) and a file object ---
PATH_READERS = {
    "open-mmap": lambda path, limits: open_and_close(path, mode="mmap", limits=limits),
    "open-pread": lambda path, limits: open_and_close(path, mode="pread", limits=limits),
    "load_file-mmap": lambda path, limits: aprfast.load_file(path, mmap=True, limits=limits),
    "load_file-pread": lambda path, limits: aprfast.load_file(path, mmap=False, limits=limits),
    "inspect": lambda path, limits: aprfast.inspect(path, limits=limits),
    "open-BytesIO": lambda path, limits: open_and_close(io.BytesIO(path.read_bytes()), limits=limits),
}


@pytest.mark.parametrize("reader", list(PATH_READERS))
@pytest.mark.parametrize("layout, name", lie_params())
def test_crafted_lie_is_refused_from_disk(layout, name, reader, tmp_path):
    made = make_lie(layout, name)
    path = tmp_path / f"{name}.apr"
    path.write_bytes(made.data)
    if reader == "inspect" and made.error is UnknownDTypeError:
        # inspect reads unknown dtypes raw by design, and reports them as such
        dtypes = [t["dtype"] for t in aprfast.inspect(path)["tensors"].values()]
        assert [d for d in dtypes if d.startswith("unknown(")] == [f"unknown({made.mentions[1]})"]
        return
    refused(lambda: PATH_READERS[reader](path, made.limits), made.error, mentions=made.mentions)


@pytest.mark.parametrize("reader", list(PATH_READERS))
@pytest.mark.parametrize("size", [0, 3])
def test_empty_and_tiny_files_on_disk_are_refused(reader, size, tmp_path):
    path = tmp_path / "tiny.apr"
    path.write_bytes(b"APR"[:size])
    refused(lambda: PATH_READERS[reader](path, None), FormatError, mentions=[f"{size} bytes"])


@pytest.mark.parametrize("mode", ["mmap", "pread"])
def test_bit_flipped_file_on_disk_is_refused_or_fails_verify(layout, mode, tmp_path):
    data = valid_file(layout)
    lo, hi = hb.sections(data)["index"]
    path = tmp_path / "flipped.apr"
    for bit in range(lo * 8, hi * 8, 7):
        path.write_bytes(hb.flip_bit(data, bit))
        f = typed_or(lambda: aprfast.open(path, mode=mode))
        if f is not None:
            with f:
                refused(f.verify, ChecksumError)
        refused(lambda: aprfast.load_file(path, mmap=False))


# --- dtypes: unknown ids are refused, or handed over raw when asked -----------------------
def file_with_unknown_dtype(layout, type_id, payload=b"\x01\x02\x03\x04\x05\x06"):
    parts = Parts([Entry("u", type_id, (3,), 0, len(payload))], payload)
    return build(layout, parts)


@pytest.mark.parametrize("type_id", [99, 200])
def test_unknown_dtype_id_is_refused_at_open(layout, type_id):
    data = file_with_unknown_dtype(layout, type_id)
    refused(lambda: aprfast.open(data), UnknownDTypeError, mentions=["'u'", type_id])
    refused(lambda: aprfast.load(data), UnknownDTypeError, mentions=[type_id])


@pytest.mark.parametrize("type_id", [99, 200])
def test_unknown_dtype_id_reads_as_raw_bytes_when_asked(layout, type_id):
    payload = b"\x01\x02\x03\x04\x05\x06"
    data = file_with_unknown_dtype(layout, type_id, payload)
    with aprfast.open(data, unknown_dtypes="raw") as f:
        tensor = f.get_tensor("u")
        assert isinstance(tensor, RawTensor)
        assert tensor.dtype is None and tensor.dtype_id == type_id
        assert tensor.shape == (3,)
        assert tensor.data.tobytes() == payload
        assert f.info("u").dtype_name == f"unknown({type_id})"
    loaded = aprfast.load(data, unknown_dtypes="raw")
    assert loaded["u"].data.tobytes() == payload
    assert aprfast.inspect(data)["tensors"]["u"]["dtype"] == f"unknown({type_id})"


def test_unknown_dtype_in_raw_mode_still_has_its_extent_checked(layout):
    parts = Parts([Entry("u", 200, (3,), 0, TIB)], bytes(64))
    data = build(layout, parts)
    refused(lambda: aprfast.open(data, unknown_dtypes="raw"), CorruptError, mentions=["'u'", TIB])


# --- dims: limits and shapes numpy cannot hold ---------------------------------------------
def file_with_dims(layout, dims, size=4, data=bytes(4), dtype="F32"):
    return build(layout, Parts([Entry("t", dtype_id(layout, dtype), tuple(dims), 0, size)], data))


def test_every_ndim_from_9_to_255_is_refused_under_the_default_limit(layout):
    for ndim in range(9, 256):
        data = file_with_dims(layout, (1,) * ndim)
        refused(lambda: aprfast.open(data), LimitError, mentions=[f"{ndim} dimensions", aprfast.limits.MAX_DIMS])


def test_nine_dims_read_when_the_dim_limit_allows_them(layout):
    data = file_with_dims(layout, (1,) * 9, data=np.float32(2.5).tobytes())
    limits = Limits(max_dims=255)
    loaded = aprfast.load(data, limits=limits)
    assert loaded["t"].shape == (1,) * 9
    assert loaded["t"].item() == 2.5
    with aprfast.open(data, limits=limits) as f:
        assert f.get_tensor("t").shape == (1,) * 9
        assert f.get_slice("t")[0].shape == (1,) * 8


@pytest.mark.parametrize("ndim", [65, 255])
def test_more_dims_than_numpy_holds_fail_typed_when_the_dim_limit_allows_them(layout, ndim):
    data = file_with_dims(layout, (1,) * ndim)
    limits = Limits(max_dims=255)
    assert_typed_or_matching_shape(data, limits=limits)


@pytest.mark.parametrize("dtype", ["F32", "U8"])
@pytest.mark.parametrize("dims", [(0, 2**63), (2**63, 0), (0, 2**62), (0, 2**61, 2), (0, 2**62, 2),
                                  (0, 2**64 - 1, 2**64 - 1)],
                         ids=["0x2^63", "2^63x0", "0x2^62", "0x2^61x2", "0x2^62x2", "0x(2^64-1)^2"])
def test_empty_tensor_with_a_giant_dim_fails_typed_or_reads_as_empty(layout, dims, dtype):
    # Zero elements take zero bytes, so the size check passes; numpy still can't hold the shape.
    data = file_with_dims(layout, dims, size=0, data=b"", dtype=dtype)
    assert_typed_or_matching_shape(data)


def assert_typed_or_matching_shape(data, limits=None):
    """Every read path either refuses with an AprError or returns the declared shape."""
    loaded = typed_or(lambda: aprfast.load(data, limits=limits))
    if loaded is not None:
        assert list(loaded["t"].shape) == aprfast.inspect(data, limits=limits)["tensors"]["t"]["shape"]
    for target in (data, io.BytesIO(data)):  # zero-copy views, then owned copies
        f = typed_or(lambda: aprfast.open(target, limits=limits))
        if f is None:
            continue
        with f:
            shape = f.info("t").shape
            tensor = typed_or(lambda: f.get_tensor("t"))
            assert tensor is None or tensor.shape == shape
            tensor = typed_or(lambda: f.get_tensor("t", copy=True))
            assert tensor is None or tensor.shape == shape
            sliced = typed_or(lambda: f.get_slice("t")[...])
            assert sliced is None or sliced.shape == shape


# --- metadata: parsed lazily, refused typed -------------------------------------------------
BAD_METADATA = {
    "not_json": b"{this is not json",
    "not_utf8": b'{"name":"\xff\xfe"}',
    "json_array": b"[1,2,3]",
    "json_string": b'"just a string"',
    "empty": b"",
    "nan_literal": b'{"x":NaN}',
    "5000_digit_integer": b'{"x":' + b"9" * 5000 + b"}",
    "nested_arrays_100k_deep": b"[" * 100_000 + b"]" * 100_000,
    "nested_objects_100k_deep": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    "trailing_garbage": b'{"name":"x"} trailing',
}


@pytest.mark.parametrize("kind", list(BAD_METADATA))
def test_bad_metadata_is_refused_typed_when_read(layout, kind):
    parts = small_parts(layout)
    parts.metadata = BAD_METADATA[kind]
    data = build(layout, parts)
    names = ["JSON object"] if kind in ("json_array", "json_string") else [f"{len(parts.metadata)} bytes"]
    with aprfast.open(data) as f:  # metadata is parsed lazily: tensors stay readable
        assert f.get_tensor("a.weight").shape == (2, 3)
        refused(lambda: f.metadata, CorruptError, mentions=names)
        refused(lambda: f.metadata, CorruptError, mentions=names)  # asking again fails again
    refused(lambda: aprfast.inspect(data), CorruptError, mentions=names)


def test_bad_metadata_on_disk_is_refused_by_inspect(layout, tmp_path):
    parts = small_parts(layout)
    parts.metadata = BAD_METADATA["nested_arrays_100k_deep"]
    path = tmp_path / "deep.apr"
    path.write_bytes(build(layout, parts))
    refused(lambda: aprfast.inspect(path), CorruptError)
    with aprfast.open(path, mode="pread") as f:
        refused(lambda: f.metadata, CorruptError)


# --- footer CRC alone -------------------------------------------------------------------
def test_wrong_footer_crc_alone_is_refused_by_load_and_by_verify(layout, tmp_path):
    data = bytearray(valid_file(layout))
    crc_at = len(data) - (4 if layout == APRENDER else 16)
    data[crc_at] ^= 0xFF
    data = bytes(data)
    refused(lambda: aprfast.load(data), ChecksumError, mentions=["footer CRC32"])
    with aprfast.open(data) as f:  # lazy open does not read every byte
        refused(f.verify, ChecksumError, mentions=["footer CRC32"])
    refused(lambda: aprfast.open(data, verify=True), ChecksumError)
    path = tmp_path / "crc.apr"
    path.write_bytes(data)
    refused(lambda: aprfast.load_file(path, mmap=False), ChecksumError)
    refused(lambda: aprfast.load_file(path, mmap=True, verify=True), ChecksumError)
    with aprfast.open(path, mode="pread") as f:
        refused(f.verify, ChecksumError)


# --- 4. limits ------------------------------------------------------------------------------
def test_more_tensors_than_the_count_limit_is_refused_and_raising_it_reads(layout):
    data = valid_file(layout)
    refused(lambda: aprfast.open(data, limits=Limits(max_tensor_count=3)), LimitError, mentions=[5, 3])
    refused(lambda: aprfast.load(data, limits=Limits(max_tensor_count=4)), LimitError, mentions=[5, 4])
    assert len(aprfast.load(data, limits=Limits(max_tensor_count=5))) == 5


def test_metadata_over_the_size_limit_is_refused_and_raising_it_reads(layout):
    data = valid_file(layout)
    lo, hi = hb.sections(data)["metadata"]
    size = hi - lo
    refused(lambda: aprfast.open(data, limits=Limits(max_metadata_size=size - 1)), LimitError,
            mentions=[size, size - 1])
    refused(lambda: aprfast.inspect(data, limits=Limits(max_metadata_size=16)), LimitError, mentions=[size, 16])
    with aprfast.open(data, limits=Limits(max_metadata_size=size)) as f:
        assert f.metadata["name"] == "hostile"


def test_names_over_the_name_limit_are_refused_and_raising_it_reads(layout):
    data = valid_file(layout)
    refused(lambda: aprfast.open(data, limits=Limits(max_name_bytes=4)), LimitError, mentions=[8, 4])
    assert len(aprfast.load(data, limits=Limits(max_name_bytes=8))) == 5


def test_index_over_the_index_limit_is_refused_and_raising_it_reads(layout):
    data = valid_file(layout)
    refused(lambda: aprfast.open(data, limits=Limits(max_index_size=32)), LimitError, mentions=[32])
    assert len(aprfast.load(data, limits=Limits(max_index_size=4096))) == 5


@pytest.mark.parametrize("reader", ["open-pread", "load_file-pread", "load_file-mmap"])
def test_limits_apply_to_files_on_disk(layout, reader, tmp_path):
    path = tmp_path / "limits.apr"
    path.write_bytes(valid_file(layout))
    refused(lambda: PATH_READERS[reader](path, Limits(max_tensor_count=2)), LimitError, mentions=[5, 2])
    loaded = PATH_READERS[reader](path, Limits(max_tensor_count=5))
    assert loaded is None or len(loaded) == 5


# --- hypothesis: random bytes and random damage -------------------------------------------
def assert_refused_or_consistent(data: bytes):
    """``data`` is refused with an AprError, or reads back with every tensor in its
    declared shape through every path.  Nothing else may escape."""
    try:
        loaded = aprfast.load(data)
    except AprError:
        loaded = None
    except BaseException as exc:  # noqa: BLE001
        raise AssertionError(f"load raised {type(exc).__name__}: {exc!r}") from exc
    try:
        f = aprfast.open(data)
    except AprError:
        assert loaded is None, "load() read a file that open() refuses"
        return
    except BaseException as exc:  # noqa: BLE001
        raise AssertionError(f"open raised {type(exc).__name__}: {exc!r}") from exc
    with f:
        names = f.keys()
        if loaded is not None:
            assert sorted(loaded) == sorted(names)
        for name in names:
            info = f.info(name)
            if loaded is not None:
                assert tuple(loaded[name].shape) == info.shape
                assert loaded[name].nbytes == info.nbytes
            for read in (lambda: f.get_tensor(name), lambda: f.get_tensor(name, copy=True)):
                try:
                    tensor = read()
                except AprError:
                    continue
                assert tuple(tensor.shape) == info.shape
        for lazy in (lambda: f.metadata, f.verify):
            try:
                lazy()
            except AprError:
                pass


MAGICS = st.sampled_from([b"", b"APR\x00\x02\x00", b"APR2\x02\x00", b"APRN", b"XXXX"])


@given(prefix=MAGICS, body=st.binary(max_size=1024), seal=st.booleans())
def test_random_bytes_are_refused_or_read_consistently(prefix, body, seal):
    data = prefix + body
    assert_refused_or_consistent(hb.fix_checksums(data) if seal else data)


INTERESTING_INTS = [0, 1, 7, 8, 9, 63, 64, 255, 256, 2**16 - 1, 2**31, 2**32 - 1, 2**32,
                    2**62, 2**63, 2**64 - 1]


@st.composite
def damaged_valid_file(draw):
    data = bytearray(valid_file(draw(st.sampled_from(LAYOUTS))))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["overwrite", "splice", "duplicate", "delete", "integer"]))
        i = draw(st.integers(0, len(data)))
        j = draw(st.integers(i, min(len(data), i + 64)))
        if kind == "overwrite":
            data[i:j] = draw(st.binary(min_size=j - i, max_size=j - i))
        elif kind == "splice":
            data[i:i] = draw(st.binary(min_size=1, max_size=64))
        elif kind == "duplicate":
            k = draw(st.integers(0, len(data)))
            data[k:k] = data[i:j]
        elif kind == "delete":
            del data[i:j]
        else:  # an interesting number written over a field-sized window
            width = draw(st.sampled_from([1, 2, 4, 8]))
            value = draw(st.sampled_from(INTERESTING_INTS)) % (1 << (8 * width))
            data[i:i + width] = value.to_bytes(width, "little")
    seal = draw(st.booleans())
    return hb.fix_checksums(bytes(data)) if seal else bytes(data)


@given(damaged_valid_file())
def test_damaged_valid_files_are_refused_or_read_consistently(data):
    assert_refused_or_consistent(data)


def test_every_interesting_number_in_every_index_field_is_refused_or_read_consistently(layout):
    """Each dim, offset and size of each entry, set in turn to each boundary value."""
    tried, failures = 0, []
    for i, target in enumerate(small_parts(layout).entries):
        fields = [("dims", d) for d in range(len(target.dims))] + [("offset", None), ("size", None)]
        for field_name, position in fields:
            for value in INTERESTING_INTS:
                parts = small_parts(layout)
                lied = parts.entries[i]
                if field_name == "dims":
                    dims = list(lied.dims)
                    dims[position] = value
                    lied.dims = tuple(dims)
                else:
                    setattr(lied, field_name, value)
                try:
                    assert_refused_or_consistent(build(layout, parts))
                except AssertionError as exc:
                    failures.append(f"{lied.name} {field_name}[{position}]={value}: {exc}")
                tried += 1
    six_dims_and_five_offsets_and_sizes = 6 + 2 * 5
    assert tried == len(INTERESTING_INTS) * six_dims_and_five_offsets_and_sizes
    assert not failures, f"{len(failures)} of {tried} lies escaped untyped:\n" + "\n".join(failures)


@pytest.mark.parametrize("flag", [hb.APRENDER_ENCRYPTED, 0x0008], ids=["ENCRYPTED", "SIGNED"])
def test_aprender_encrypted_or_signed_header_bits_are_ignored_as_aprender_ignores_them(flag):
    # No aprender build encrypts or signs v2 data; set_header_flags carries the bits over
    # on re-stamping and aprender's reader ignores them (docs/FORMAT.md §2.2).
    plain = build(APRENDER, small_parts(APRENDER))
    flagged = build(APRENDER, small_parts(APRENDER), flags=hb.APRENDER_ROW_MAJOR | flag)
    with aprfast.open(flagged) as f:
        assert f.header["flags"] & flag
        got = aprfast.load(flagged)
    want = aprfast.load(plain)
    assert set(got) == set(want)
    for name in want:
        assert np.asarray(got[name]).tobytes() == np.asarray(want[name]).tobytes()
