"""Per-tensor compression in the APR2 layout (seed 001 §3.6; docs/FORMAT.md §3.1).

A compressed tensor's stored bytes are a block table followed by independent blocks::

    u32 block_size | u32 block_count | block_count x u64 end | block 0 | block 1 | ...

``end[k]`` is where block k's stored bytes end, counted from the first byte after the
table, so block k is ``[end[k-1], end[k])`` (``end[-1] = 0``): reading it needs two
table entries, never a scan.  Block k holds the raw bytes ``[k*block_size, ...)`` of
the tensor (the last block the rest).  A block whose stored size equals its raw size
is stored raw; a smaller one is compressed (one LZ4 block, or one zstd frame); a
larger one is corrupt.  The index entry says which codec (``flags`` low nibble: 1 LZ4,
2 zstd) and the raw size (``raw_size`` = shape x dtype).

Writing: :func:`compress_inputs` turns writer inputs into stored items (a tensor that
compression would not shrink is kept raw, so it stays zero-copy).  Reading:
:func:`read_range` decodes only the blocks covering a byte range, checking every
declared size against the bytes present and a bounded inflation ratio before
allocating; :func:`load_all` reads a whole file once, in runs of whole tensors, and
decodes each run's blocks in one multi-threaded C call.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import _blocks, _memory
from .._optional import require
from ..errors import CorruptError, LayoutError, VersionError
from .payload import ZSTD_MAX_RATIO, ZSTD_SLACK

__all__ = ["CODECS", "LZ4", "ZSTD", "LZ4_BLOCK_SIZE", "ZSTD_BLOCK_SIZE", "compress_inputs", "codec_id",
           "read_table", "read_range", "decode_stored", "load_all"]

LZ4 = 1
ZSTD = 2
CODECS = {"lz4": LZ4, "zstd": ZSTD}
_NAMES = {LZ4: "LZ4", ZSTD: "zstd"}
#: Per-tensor flag bits that hold the codec; every other bit is reserved (E003 if set).
CODEC_MASK = 0x0F
#: The spec's 64 KiB LZ4 blocks (seed 001 §3.6).
LZ4_BLOCK_SIZE = 64 << 10
#: zstd blocks of 128 KiB (zstd's own largest internal block).  Measured on 32 MiB of
#: bf16-precision float32 at level 3, one thread (benchmarks/bench_codecs.py
#: --block-sizes): 64 KiB stores 46.7% at 0.98 GB/s, 128 KiB 46.3% at 1.08 GB/s,
#: 256 KiB 47.1% at 0.68 GB/s (zstd picks other parameters up to 256 KiB), 1 MiB 45.5%
#: at 1.08 GB/s.  128 KiB costs 0.8 points of ratio against 1 MiB, and a row slice
#: decodes at most 2 x 128 KiB it does not need instead of 2 x 1 MiB.
ZSTD_BLOCK_SIZE = 128 << 10
#: Block sizes a reader accepts: powers of two in this range.
MIN_BLOCK_SIZE = 4 << 10
MAX_BLOCK_SIZE = 16 << 20
ZSTD_DEFAULT_LEVEL = 3
_ZSTD_MIN_LEVEL = -(1 << 17)  # ZSTD_minCLevel()
TABLE_HEADER = 8
# The most one stored byte can inflate to, and a per-block allowance (csrc/lz4block.h;
# aprfast.codecs for zstd: a 4-byte RLE block describes at most 128 KiB).
_MAX_RATIO = {LZ4: (_memory.LZ4_MAX_RATIO, _memory.LZ4_SLACK), ZSTD: (ZSTD_MAX_RATIO, ZSTD_SLACK)}
_CODE = {LZ4: _blocks.LZ4, ZSTD: _blocks.ZSTD}


def codec_id(compression) -> int:
    """0 for None, else the per-tensor codec id of "lz4" or "zstd"."""
    if compression is None:
        return 0
    try:
        return CODECS[compression.lower()] if isinstance(compression, str) else CODECS[compression]
    except KeyError:
        raise LayoutError(f"unknown compression {compression!r}; use 'lz4', 'zstd' or None") from None


# --- writing ----------------------------------------------------------------------------
class StoredTensor:
    """A writer input as it is stored: compressed bytes (a block table and blocks),
    with the raw size and per-tensor flags its index entry carries."""

    __slots__ = ("name", "dtype", "shape", "data", "nbytes", "raw_size", "flags")

    def __init__(self, item, data, codec: int):
        self.name, self.dtype, self.shape = item.name, item.dtype, item.shape
        self.data, self.nbytes = data, len(data)
        self.raw_size, self.flags = item.nbytes, codec


def compress_inputs(ordered, compression, level=None, *, block_size=None, threads: int = 0) -> list:
    """Writer inputs (in index order) with each compressible tensor replaced by a
    :class:`StoredTensor`; a tensor that compression would not shrink stays as it is."""
    codec = codec_id(compression)
    if not codec or not ordered:
        return list(ordered)
    size = block_size or (LZ4_BLOCK_SIZE if codec == LZ4 else ZSTD_BLOCK_SIZE)
    _check_block_size(size)
    squeeze = _compressor(codec, level)
    views = [_flat(item.data) if item.nbytes else None for item in ordered]
    pieces = [(i, start) for i, v in enumerate(views) if v is not None for start in range(0, len(v), size)]
    work = (views[i][start:start + size] for i, start in pieces)
    packed = list(worker_pool(threads).map(squeeze, work, chunksize=8)) if len(pieces) > 1 else list(map(squeeze, work))
    out, at = [], 0
    for item, view in zip(ordered, views):
        if view is None:
            out.append(item)
            continue
        count = -(-len(view) // size)
        stored = _assemble(view, packed[at:at + count], size)
        packed[at:at + count] = [None] * count  # peak memory: about one compressed copy, not two
        at += count
        out.append(item if stored is None else StoredTensor(item, stored, codec))
    return out


def _flat(data) -> memoryview:
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _assemble(view, blocks, size):
    """Table plus blocks, each block kept compressed only if that made it smaller; None
    when the whole would not be smaller than the raw tensor."""
    raw_len = len(view)
    raws = [min(size, raw_len - k * size) for k in range(len(blocks))]
    # A block is kept compressed only when strictly shorter: equal length means raw.
    keep = [len(b) < r for b, r in zip(blocks, raws)]
    lens = [len(b) if kept else r for b, r, kept in zip(blocks, raws, keep)]
    head = TABLE_HEADER + 8 * len(blocks)
    if head + sum(lens) >= raw_len:
        return None
    out = bytearray(head + sum(lens))
    ends = np.cumsum(np.asarray(lens, np.uint64), dtype=np.uint64)
    out[:TABLE_HEADER] = size.to_bytes(4, "little") + len(blocks).to_bytes(4, "little")
    out[TABLE_HEADER:head] = ends.astype("<u8").tobytes()
    at = head
    for k, (block, n, kept) in enumerate(zip(blocks, lens, keep)):
        out[at:at + n] = block if kept else view[k * size:k * size + n]
        at += n
    return out


def _compressor(codec: int, level):
    """A function block -> compressed bytes, safe to call from several threads."""
    if codec == LZ4:
        lz4_block = require("lz4.block")

        if level is None or level == 0:
            return lambda block: lz4_block.compress(block, mode="default", store_size=False)
        if not _is_int(level) or not 1 <= level <= 12:
            raise LayoutError(f"LZ4 compression_level must be 1-12 (LZ4 HC), or None for the fast mode; "
                              f"got {level!r}")
        return lambda block: lz4_block.compress(block, mode="high_compression", compression=level,
                                                store_size=False)
    zstandard = require("zstandard")

    level = ZSTD_DEFAULT_LEVEL if level is None else level
    if not _is_int(level) or not _ZSTD_MIN_LEVEL <= level <= zstandard.MAX_COMPRESSION_LEVEL:
        raise LayoutError(f"zstd compression_level must be an int from {_ZSTD_MIN_LEVEL} to "
                          f"{zstandard.MAX_COMPRESSION_LEVEL}, not {level!r}")
    local = threading.local()  # a ZstdCompressor must not be used by two threads at once

    def squeeze(block):
        cctx = getattr(local, "cctx", None)
        if cctx is None:
            cctx = local.cctx = zstandard.ZstdCompressor(level=level, write_content_size=True,
                                                         write_checksum=False)
        return cctx.compress(block)
    return squeeze


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_POOL = None
_POOL_LOCK = threading.Lock()


def worker_pool(threads: int = 0) -> ThreadPoolExecutor:
    """One shared pool (the codecs release the GIL while they work)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 1,
                                       thread_name_prefix="aprfast-codec")
        return _POOL


def _check_block_size(size: int) -> None:
    if size & (size - 1) or not MIN_BLOCK_SIZE <= size <= MAX_BLOCK_SIZE:
        raise LayoutError(f"block size {size} must be a power of two from {MIN_BLOCK_SIZE} to {MAX_BLOCK_SIZE}")


# --- reading -----------------------------------------------------------------------------
class Table:
    """A compressed tensor's checked block-table header: where its blocks start and how
    many raw bytes each holds.  ``offset`` is absolute in the file."""

    __slots__ = ("name", "codec", "offset", "stored", "raw_size", "block_size", "count", "head", "path")

    def __init__(self, name, codec, offset, stored, raw_size, block_size, count, path):
        self.name, self.codec, self.offset, self.stored = name, codec, offset, stored
        self.raw_size, self.block_size, self.count, self.path = raw_size, block_size, count, path
        self.head = TABLE_HEADER + 8 * count

    def fail(self, what, block=None) -> CorruptError:
        where = f", block {block} of {self.count}" if block is not None else ""
        return CorruptError(f"{_NAMES.get(self.codec, 'compressed')} tensor {self.name!r}{where}: {what}",
                            path=self.path)

    def raw_len(self, k0: int, k1: int) -> np.ndarray:
        """Raw bytes held by blocks k0..k1-1."""
        lens = np.full(k1 - k0, self.block_size, np.uint64)
        if k1 == self.count and k1 > k0:
            lens[-1] = self.raw_size - (self.count - 1) * self.block_size
        return lens


def read_table(source, name, offset, stored, raw_size, flags) -> Table:
    """Read and check a tensor's block-table header against its index entry: the codec
    is known, the block size a power of two in range, the count what raw_size needs,
    the table fits the stored bytes, and raw_size is no more than those bytes can
    inflate to.  Nothing the table declares is allocated before these hold."""
    path = source.path
    codec = flags & CODEC_MASK
    if flags & ~CODEC_MASK or codec not in _NAMES:
        raise VersionError(f"tensor {name!r}: per-tensor flags {flags:#x} name a codec this build lacks", path=path)
    table = Table(name, codec, offset, stored, raw_size, 0, 0, path)
    if stored < TABLE_HEADER:
        raise table.fail(f"{stored} stored bytes cannot hold the {TABLE_HEADER}-byte block-table header")
    head = np.frombuffer(bytes(source.read(offset, TABLE_HEADER, f"block table of {name!r}")), "<u4")
    size, count = int(head[0]), int(head[1])
    if size & (size - 1) or not MIN_BLOCK_SIZE <= size <= MAX_BLOCK_SIZE:
        raise table.fail(f"block size {size} is not a power of two from {MIN_BLOCK_SIZE} to {MAX_BLOCK_SIZE}")
    if raw_size <= 0 or count != -(-raw_size // size):
        raise table.fail(f"{count} blocks of {size} bytes cannot hold its {raw_size} raw bytes")
    table = Table(name, codec, offset, stored, raw_size, size, count, path)
    if table.head > stored:
        raise table.fail(f"a table of {count} blocks needs {table.head} bytes; {stored} are stored")
    ratio, slack = _MAX_RATIO[codec]
    if raw_size > (stored - table.head) * ratio + count * slack:
        raise table.fail(f"{stored - table.head} bytes of blocks cannot inflate to {raw_size} "
                         f"(at most {ratio}-fold)")
    return table


def _ends(source, table: Table, k0: int, k1: int) -> np.ndarray:
    """``end[k0-1 .. k1-1]`` (``end[-1]`` = 0) as uint64, each checked: strictly
    increasing, inside the stored bytes, no block larger than its raw bytes or smaller
    than they could come from; and the table's last end must close the stored bytes."""
    first = max(k0 - 1, 0)
    raw = bytes(source.read(table.offset + TABLE_HEADER + 8 * first, 8 * (k1 - first),
                            f"block table of {table.name!r}"))
    ends = np.frombuffer(raw, "<u8").astype(np.uint64)
    if k0 == 0:
        ends = np.concatenate([np.zeros(1, np.uint64), ends])
    last = ends[-1] if k1 == table.count else np.frombuffer(bytes(source.read(
        table.offset + table.head - 8, 8, f"block table of {table.name!r}")), "<u8")[0]
    if int(last) != table.stored - table.head:
        raise table.fail(f"the block table ends at {int(last)}, but {table.stored - table.head} bytes of "
                         "blocks are stored")
    beyond = ends > last
    if beyond.any():  # checked first, so every end fits an int64 below
        k = max(int(np.argmax(beyond)) - (k0 > 0), 0)
        raise table.fail(f"the block table says a block ends at {int(ends[np.argmax(beyond)])}, beyond the "
                         f"{int(last)} bytes of blocks", block=k0 + k)
    lens = np.diff(ends.astype(np.int64))
    raw_lens = table.raw_len(k0, k1).astype(np.int64)
    ratio, slack = _MAX_RATIO[table.codec]
    most = np.minimum(np.maximum(lens, 0), raw_lens) * ratio + slack  # clamped: no int64 overflow
    bad = (lens <= 0) | (lens > raw_lens) | (raw_lens > most)
    if bad.any():
        k = int(np.argmax(bad))
        raise table.fail(f"stores {int(lens[k])} bytes for {int(raw_lens[k])} raw bytes (ends "
                         f"{int(ends[k])}..{int(ends[k + 1])} of {int(last)})", block=k0 + k)
    return ends


def read_range(file, name: str, start: int, stop: int) -> np.ndarray:
    """Raw bytes ``[start, stop)`` of the compressed tensor ``name`` of an open AprFile,
    decoding only the blocks they touch: an owned uint8 array."""
    source = file._source
    table = file._table(name)
    if not 0 <= start <= stop <= table.raw_size:
        raise IndexError(f"bytes [{start}, {stop}) are outside tensor {name!r} of {table.raw_size} bytes")
    if start == stop:
        return np.empty(0, np.uint8)
    k0, k1 = start // table.block_size, -(-stop // table.block_size)
    ends = _ends(source, table, k0, k1)
    raw_lens = table.raw_len(k0, k1)
    out = _memory.AlignedBuffer(int(raw_lens.sum()), max(file.alignment, 64))
    blocks_at = table.offset + table.head
    if source.zero_copy:
        src, src_off = file._mapped(), ends[:-1] + np.uint64(blocks_at)
    else:  # one read covering the blocks, then decode from memory
        src = np.frombuffer(_memory.AlignedBuffer(int(ends[-1] - ends[0]), 64), np.uint8)
        source.readinto(blocks_at + int(ends[0]), src)
        src_off = ends[:-1] - ends[0]
    _decode(table, k0, src, src_off, np.diff(ends), out, _offsets(raw_lens), raw_lens)
    skip = start - k0 * table.block_size
    return np.frombuffer(out, np.uint8, stop - start, skip)


def decode_stored(stored, name: str, raw_size: int, flags: int, *, path=None, alignment: int = 64,
                  threads: int = 0):
    """A compressed tensor decoded from its stored bytes held in memory (its whole extent:
    block table, then blocks), as a stream that has just read them needs: an owned
    AlignedBuffer of ``raw_size`` bytes.  The checks are read_range's, by the same code:
    the table header against the index entry (:func:`read_table`) and every block end
    (:func:`_ends`) before the output is allocated, then every block decoded in one C
    call (CorruptError naming the tensor and the block)."""
    from ..io.sources import BufferSource

    source = BufferSource(stored, path)
    table = read_table(source, name, 0, source.size, raw_size, flags)
    ends = _ends(source, table, 0, table.count)
    raw_lens = table.raw_len(0, table.count)
    out = _memory.AlignedBuffer(raw_size, alignment)
    src = np.frombuffer(source.view(0, source.size, f"tensor {name!r}"), np.uint8)
    _decode(table, 0, src, ends[:-1] + np.uint64(table.head), np.diff(ends), out, _offsets(raw_lens), raw_lens,
            threads)
    return out


def _offsets(lens: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(lens), np.uint64)
    np.cumsum(lens[:-1], out=offsets[1:])
    return offsets


def _decode(table, k0, src, src_off, src_len, dst, dst_off, dst_len, threads: int = 0) -> None:
    codes = np.where(src_len == dst_len, _blocks.COPY, _CODE[table.codec]).astype(np.uint8)
    problem = _run(src, src_off, src_len, dst, dst_off, dst_len, codes, threads)
    if problem is not None:
        k, message = problem
        raise table.fail(message, block=k0 + k)


def _run(src, src_off, src_len, dst, dst_off, dst_len, codes, threads):
    """decode_blocks, with zstd frames decoded by the zstandard package on a thread pool
    when no libzstd could be loaded."""
    arrays = [np.ascontiguousarray(a, np.uint64) for a in (src_off, src_len, dst_off, dst_len)]
    src = np.frombuffer(src, np.uint8) if not isinstance(src, np.ndarray) else src
    if _blocks.zstd_native() and not _FORCE_PYTHON_ZSTD:
        return _blocks.decode_blocks(src, *arrays[:2], dst, *arrays[2:], codes, threads)
    native = codes != _blocks.ZSTD
    problem = _blocks.decode_blocks(src, *(a[native] for a in arrays[:2]), dst, *(a[native] for a in arrays[2:]),
                                    np.ascontiguousarray(codes[native]), threads)
    if problem is not None:
        return int(np.flatnonzero(native)[problem[0]]), problem[1]
    return _zstd_python(src, arrays, dst, np.flatnonzero(~native))


_FORCE_PYTHON_ZSTD = False  # tests set this to exercise the fallback


def _zstd_python(src, arrays, dst, which):
    zstandard = require("zstandard")

    out = np.frombuffer(dst, np.uint8)
    so, sl, do, dl = arrays
    local = threading.local()

    def one(k):
        dctx = getattr(local, "dctx", None)
        if dctx is None:  # a ZstdDecompressor must not be used by two threads at once
            dctx = local.dctx = zstandard.ZstdDecompressor()
        frame = src[int(so[k]):int(so[k] + sl[k])]
        want = int(dl[k])
        try:
            declared = zstandard.frame_content_size(frame)
            if declared not in (-1, want):  # it would allocate what the frame declares
                return f"the zstd frame declares {declared} bytes, not the block's {want}"
            got = dctx.decompress(frame, max_output_size=want, allow_extra_data=False)
        except zstandard.ZstdError as exc:
            return f"zstd refused the frame: {exc}"
        if len(got) != want:
            return f"the zstd frame decodes to {len(got)} bytes, not the block's {want}"
        out[int(do[k]):int(do[k]) + want] = np.frombuffer(got, np.uint8)
        return None

    for k, problem in zip(which, worker_pool().map(one, which)):
        if problem is not None:
            return int(k), problem
    return None


#: Eager loads read the data section in runs of whole tensors of about this size into one
#: reused scratch buffer (below the 32 MiB at which aligned buffers become fresh
#: huge-page maps), decode the compressed ones from there and copy the others out.
#: Reading it all into one arena first faulted in fresh memory for every compressed
#: byte, which dominated the load on a busy machine.
BATCH_BYTES = 16 << 20


def load_all(file, *, verify: bool, threads: int = 0) -> tuple:
    """Every tensor of an open AprFile holding compressed tensors, read once in file
    order (CRC32 on the way when ``verify``): returns ``(arena, decoded, crc)`` where
    ``arena`` holds the data section's stored tensors at their offsets (untouched where
    compressed ones lie), ``decoded`` maps each compressed tensor's name to
    ``(buffer, offset, raw size)``, and ``crc`` is the whole file's CRC32 (None without
    ``verify``).  A block that fails to decode is reported only after the CRC has been
    checked, so a damaged file is a ChecksumError first."""
    f, source = file._file, file._source
    tables = {i: file._table(f.entries.name(i)) for i in f.entries.compressed_positions()}
    ends = {i: _ends(source, t, 0, t.count) for i, t in tables.items()}
    alignment = max(file.alignment, 64)
    places, at = {}, 0
    for i, table in tables.items():
        places[i] = at
        at += -(-table.raw_size // alignment) * alignment
    out = _memory.AlignedBuffer(at, alignment)
    offsets, sizes = f.entries.extents()
    # Untouched pages of a fresh map cost nothing: only the stored tensors fault theirs in.
    arena = np.frombuffer(_memory.AlignedBuffer(f.data_len, alignment), np.uint8)
    crc = _crc_prefix(source, f.data_start) if verify else None
    problem, span_start, held = None, 0, []
    for batch in _batches(offsets, sizes):
        span_end = int(offsets[batch[-1]] + sizes[batch[-1]])
        scratch = _scratch(held, span_end - span_start)
        crc = source.readinto(f.data_start + span_start, scratch, threads=threads, crc=crc)
        jobs = []
        for i in batch:
            lo = int(offsets[i]) - span_start
            if i in tables:
                jobs.append(_jobs(tables[i], ends[i], lo, places[i]))
            else:
                _memory.copy_into(arena[int(offsets[i]):int(offsets[i] + sizes[i])], scratch[lo:lo + int(sizes[i])])
        if jobs and problem is None:
            problem = _run_jobs(scratch, jobs, out, threads)
        span_start = span_end
    if verify:
        rest = f.footer_crc_offset - f.data_start - span_start
        crc = source.readinto(f.data_start + span_start, _scratch(held, rest), threads=threads, crc=crc)
    if verify and crc != f.stored_crc:
        return arena, None, crc
    if problem is not None:
        table, k, message = problem
        raise table.fail(message, block=k)
    return arena, {tables[i].name: (out, places[i], tables[i].raw_size) for i in tables}, crc


def _crc_prefix(source, n: int) -> int:
    from .._crc import crc32

    return crc32(source.read(0, n, "header"))


def _batches(offsets, sizes):
    """Non-empty tensors in file order, grouped into runs of about BATCH_BYTES (a larger
    tensor is a run of its own)."""
    order = [int(i) for i in np.argsort(offsets, kind="stable") if sizes[i]]
    batch, start = [], None
    for i in order:
        if batch and int(offsets[i] + sizes[i]) - start > BATCH_BYTES:
            yield batch
            batch = []
        if not batch:
            start = int(offsets[i])
        batch.append(i)
    if batch:
        yield batch


def _scratch(held: list, n: int) -> np.ndarray:
    """``n`` bytes of the one read buffer of a load (``held``), grown when too small."""
    if not held or len(held[0]) < n:
        held[:] = [np.frombuffer(_memory.AlignedBuffer(max(n, 1), 64), np.uint8)]
    return held[0][:n]


def _jobs(table, ends, lo, place):
    """Decode jobs of every block of ``table`` whose stored bytes start at ``lo`` in the
    scratch buffer, into the output at ``place``."""
    raw_lens = table.raw_len(0, table.count)
    lens = np.diff(ends)
    codes = np.where(lens == raw_lens, _blocks.COPY, _CODE[table.codec]).astype(np.uint8)
    return (table, ends[:-1] + np.uint64(lo + table.head), lens, _offsets(raw_lens) + np.uint64(place), raw_lens,
            codes)


def _run_jobs(scratch, jobs, out, threads):
    """Decode a batch's jobs in one call; ``(table, block, message)`` of the first
    failure, else None."""
    cat = np.concatenate
    problem = _run(scratch, cat([j[1] for j in jobs]), cat([j[2] for j in jobs]), out, cat([j[3] for j in jobs]),
                   cat([j[4] for j in jobs]), cat([j[5] for j in jobs]), threads)
    if problem is None:
        return None
    k = problem[0]
    for table, *_ in jobs:
        if k < table.count:
            return table, k, problem[1]
        k -= table.count
    return None  # pragma: no cover - k always falls in a job
