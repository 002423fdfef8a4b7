"""The v1 streaming chunk index (header flag STREAMING, seed 000 §6): bytes, built and parsed.

aprender defines no layout for it; this is aprfast's (docs/FORMAT.md, "v1 streaming
chunk index").  It sits between the v1 metadata and the payload; the payload is the
chunks, back to back in index order.  All integers little-endian::

    [0, 32)        index header
    [32, 32+S)     tensor table: T records, names strictly increasing (UTF-8 bytes)
    [.., +24*C)    chunk table: C records in payload order (offsets strictly increasing)
    [.., +K)       key block (SEALED only): the file key sealed as a v1 encryption blob
    [.., +64)      index signature (DIGESTS only): Ed25519 over CONTEXT || v1 header ||
                   metadata || index bytes [0, I-68), by the file's signing key
    [I-4, I)       CRC32 of the v1 header, the metadata and index bytes [0, I-4)

    index header                    tensor record                 chunk record (24 bytes)
    0  4  magic "APRC"              0  2  name_len (u16)          0   8  offset in the payload (u64)
    4  1  version 1                 2  n  name (UTF-8)            8   4  stored_size (u32)
    5  1  flags (0x01 SEALED,       .  1  dtype (APR2 id)         12  4  raw_size (u32)
             0x02 DIGESTS)
    6  2  reserved 0                .  1  ndim                    16  4  crc32 of the stored bytes
    8  4  index_size I              .  8n dims (u64 each)         20  4  reserved 0
    12 4  tensor_count T            .  4  chunk_count             24 32  DIGESTS only: SHA-256 of
                                                                         the stored bytes
    16 4  chunk_count C
    20 4  chunk_limit (max raw_size)
    24 4  key_block_size K
    28 4  tensor_table_size S

Tensor i owns the chunk_count[i] chunks that follow those of tensor i-1, so the chunks
of one tensor are consecutive and the payload holds the tensors in name order.  The
parser checks everything against the bytes present and :class:`aprfast.limits.Limits`
before it allocates anything in proportion to a count; it never decodes a chunk.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .._crc import crc32
from ..dtypes import APR2_IDS, DType, check_shape
from ..errors import ChecksumError, CorruptError, LayoutError, LimitError, UnknownDTypeError, VersionError
from ..limits import Limits

__all__ = ["MAGIC", "VERSION", "HEADER_SIZE", "CHUNK_RECORD_SIZE", "CRC_SIZE", "SEALED", "MAX_CHUNK_LIMIT",
           "DEFAULT_CHUNK_LIMIT", "TensorRecord", "Chunk", "ChunkIndex", "encode", "parse", "peek_size",
           "chunk_aad", "chunk_nonce", "DIGESTS", "DIGEST_SIZE", "INDEX_SIGNATURE_SIZE", "SIGNATURE_CONTEXT",
           "tensor_record", "finish", "signed_message", "split_signature"]

MAGIC = b"APRC"
VERSION = 1
HEADER_SIZE = 32
CHUNK_RECORD_SIZE = 24
CRC_SIZE = 4
#: Index flag: every chunk is AES-256-GCM sealed under the file key in the key block.
SEALED = 0x01
#: Index flag (signed files): each chunk record carries the SHA-256 of the stored chunk,
#: and the index ends with its own Ed25519 signature, so a signed file can be opened
#: by checking one signature over header, metadata and index, and each chunk checked
#: against its digest when read, instead of hashing the whole file at open.
DIGESTS = 0x02
DIGEST_SIZE = 32
INDEX_SIGNATURE_SIZE = 64
#: Prefix of the message the index signature signs; a v1 file signature's message
#: starts with "APRN", so neither signature can stand for the other.
SIGNATURE_CONTEXT = b"aprfast v1 chunk index\x00"
#: Largest raw chunk a reader decodes at once (aprender's 1 GiB payload cap), so one
#: chunk's decode is bounded whatever the file says.
MAX_CHUNK_LIMIT = 1 << 30
#: What aprfast's writer uses: a 16 MiB slice of a tensor decodes in a few ms.
DEFAULT_CHUNK_LIMIT = 16 << 20
# A tensor record without name or dims: name_len, dtype, ndim, chunk_count.
_MIN_RECORD = 2 + 1 + 1 + 4
_HEADER = struct.Struct("<4sBBHIIIIII")
_CHUNK = struct.Struct("<QIIII")
_U32_MAX = 0xFFFFFFFF


@dataclass(frozen=True)
class TensorRecord:
    """One tensor: ``first``/``count`` select its chunks in the chunk table;
    ``record`` is the record's bytes as stored (part of each chunk's AAD)."""

    name: str
    dtype_id: int
    dtype: DType | None
    shape: tuple
    first: int
    count: int
    nbytes: int
    record: bytes


@dataclass(frozen=True)
class Chunk:
    """One chunk: ``offset`` is relative to the payload start."""

    offset: int
    stored_size: int
    raw_size: int
    crc: int
    digest: bytes = b""  # DIGESTS only

    @property
    def end(self) -> int:
        return self.offset + self.stored_size


@dataclass(frozen=True)
class ChunkIndex:
    sealed: bool
    index_size: int
    chunk_limit: int
    header_bytes: bytes
    tensors: dict  # name -> TensorRecord, in index order
    chunks: list
    key_block: bytes
    payload_size: int
    raw_total: int
    signature: bytes = b""  # DIGESTS only: the index signature

    def chunks_of(self, name: str) -> list:
        t = self.tensors[name]
        return self.chunks[t.first:t.first + t.count]


# --- writing ---------------------------------------------------------------------
def tensor_record(name: str, dtype_id: int, shape, chunk_count: int) -> bytes:
    raw = name.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise LayoutError(f"tensor name of {len(raw)} bytes does not fit the chunk index's u16 length")
    if len(shape) > 255:
        raise LayoutError(f"tensor {name!r} has {len(shape)} dims; the chunk index holds at most 255")
    return (struct.pack("<H", len(raw)) + raw + struct.pack("<BB", dtype_id, len(shape))
            + b"".join(struct.pack("<Q", d) for d in shape) + struct.pack("<I", chunk_count))


def encode(records: list, chunks: list, *, chunk_limit: int, key_block: bytes = b"", sealed: bool = False,
           digests: list | None = None) -> bytes:
    """The index up to its signature and CRC (see :func:`finish`).

    ``records`` are tensor records (bytes from :func:`tensor_record`) in name order;
    ``chunks`` are (offset, stored_size, raw_size, crc32); ``digests`` (signed files)
    the SHA-256 of each stored chunk, which sets DIGESTS and reserves the signature."""
    if sealed != bool(key_block):
        raise LayoutError("a sealed chunk index needs a key block, and only a sealed one has one")
    flags = (SEALED if sealed else 0) | (DIGESTS if digests is not None else 0)
    table = b"".join(records)
    size = (HEADER_SIZE + len(table) + _record_size(flags) * len(chunks) + len(key_block)
            + _signature_size(flags) + CRC_SIZE)
    if size > _U32_MAX:
        raise LayoutError(f"the chunk index would be {size} bytes; its u32 size cannot say that")
    head = _HEADER.pack(MAGIC, VERSION, flags, 0, size, len(records), len(chunks), chunk_limit, len(key_block),
                        len(table))
    digests = digests if digests is not None else [b""] * len(chunks)
    body = b"".join(_CHUNK.pack(o, s, r, c, 0) + d for (o, s, r, c), d in zip(chunks, digests))
    return head + table + body + key_block


def signed_message(v1_header: bytes, metadata, index_body) -> list:
    """The parts the index signature signs: CONTEXT || v1 header || metadata || index body."""
    return [SIGNATURE_CONTEXT, v1_header, metadata, index_body]


def finish(v1_header: bytes, metadata: bytes, index_body: bytes, signature: bytes = b"") -> bytes:
    """The index with its signature (DIGESTS only) and its CRC32 (over the v1 header,
    the metadata and the index)."""
    if bool(signature) != bool(index_body[5] & DIGESTS) or len(signature) not in (0, INDEX_SIGNATURE_SIZE):
        raise LayoutError("an index with digests needs its 64-byte signature, and only such an index has one")
    index_body = index_body + signature
    crc = crc32(index_body, crc32(metadata, crc32(v1_header)))
    return index_body + crc.to_bytes(CRC_SIZE, "little")


def _record_size(flags: int) -> int:
    return CHUNK_RECORD_SIZE + (DIGEST_SIZE if flags & DIGESTS else 0)


def _signature_size(flags: int) -> int:
    return INDEX_SIGNATURE_SIZE if flags & DIGESTS else 0


def split_signature(index) -> tuple:
    """(the signed index body, the index signature) of a DIGESTS index's bytes, checking
    only the flag and the size: the signature is verified before the index is parsed."""
    view = memoryview(index).cast("B")
    if len(view) < HEADER_SIZE + INDEX_SIGNATURE_SIZE + CRC_SIZE or not view[5] & DIGESTS:
        return None, None
    end = len(view) - CRC_SIZE
    return view[:end - INDEX_SIGNATURE_SIZE], bytes(view[end - INDEX_SIGNATURE_SIZE:end])


def chunk_aad(v1_header: bytes, metadata_digest: bytes, index_header: bytes, record: bytes, offset: int,
              stored_size: int, raw_size: int, ordinal: int) -> bytes:
    """What chunk ``ordinal`` is sealed with as associated data: the v1 header, the
    SHA-256 of the metadata, the index header (counts and sizes: truncation), the owning
    tensor's record (name, dtype, shape) and the chunk's place (ordinal, offset, sizes)."""
    return (v1_header + metadata_digest + index_header + record
            + struct.pack("<QIII", offset, stored_size, raw_size, ordinal))


def chunk_nonce(ordinal: int) -> bytes:
    """The chunk's 12-byte GCM nonce: its ordinal, little-endian.  Unique per chunk and
    never reused, since every file has its own random key."""
    return ordinal.to_bytes(12, "little")


# --- reading ---------------------------------------------------------------------
def peek_size(head, *, path=None, limits: Limits | None = None) -> int:
    """The index's total size from its 32-byte header, checked against the limits."""
    limits = limits or Limits()
    # A STREAMING file without aprfast's index may hold another implementation's: a
    # feature this build does not read (E003), as the flag was before this index existed.
    if len(head) < HEADER_SIZE:
        raise VersionError(f"the STREAMING flag is set but the {len(head)} bytes after the metadata cannot hold "
                           f"the {HEADER_SIZE}-byte header of aprfast's chunk index", path=path)
    magic, version, flags, reserved, size = _HEADER.unpack_from(head)[:5]
    if magic != MAGIC:
        raise VersionError(f"the STREAMING flag is set but the chunk index magic is {bytes(magic)!r}, not "
                           f"{MAGIC!r}: a chunk index this build does not read", path=path)
    if version != VERSION:
        raise VersionError(f"chunk index version {version} is not {VERSION}, the one this build reads", path=path)
    if size > limits.max_index_size:
        raise LimitError(f"chunk index declares {size} bytes, above the limit of {limits.max_index_size}",
                         path=path)
    if size < HEADER_SIZE + CRC_SIZE:
        raise CorruptError(f"chunk index declares {size} bytes, less than its fixed {HEADER_SIZE + CRC_SIZE}",
                           path=path)
    return size


def parse(data, *, prefix_crc: int, payload_size: int, path=None, limits: Limits | None = None,
          strict_dtypes: bool = True) -> ChunkIndex:
    """Parse and check a whole index (``data``, exactly ``index_size`` bytes).

    ``prefix_crc`` is the CRC32 of the v1 header and metadata; ``payload_size`` the
    header's.  Checks: the CRC, the header's counts and sizes against the bytes present
    and the limits, every record, then that the chunks tile the payload exactly
    (contiguous from 0, no gap, no overlap, ending at ``payload_size``) and that each
    tensor's raw sizes add up to its shape x dtype."""
    limits = limits or Limits()
    view = memoryview(data).cast("B")
    size = peek_size(view[:HEADER_SIZE], path=path, limits=limits)
    if len(view) != size:
        raise CorruptError(f"chunk index declares {size} bytes but {len(view)} were given", path=path)
    stored = int.from_bytes(view[size - CRC_SIZE:], "little")
    actual = crc32(view[:size - CRC_SIZE], prefix_crc)
    if stored != actual:
        raise ChecksumError(f"chunk index CRC32 is {stored:#010x} but the header, metadata and index give "
                            f"{actual:#010x}", path=path)
    (_, _, flags, reserved, _, tensor_count, chunk_count, chunk_limit, key_size,
     table_size) = _HEADER.unpack_from(view)
    _check_header(flags, reserved, tensor_count, chunk_count, chunk_limit, key_size, table_size, size, limits,
                  path)
    table_end = HEADER_SIZE + table_size
    tensors = _parse_tensors(view[HEADER_SIZE:table_end], tensor_count, limits, strict_dtypes, path)
    chunks_end = table_end + _record_size(flags) * chunk_count
    chunks = _parse_chunks(view[table_end:chunks_end], chunk_count, chunk_limit, payload_size, flags, path)
    raw_total = _assign(tensors, chunks, path)
    key_block = bytes(view[chunks_end:chunks_end + key_size])
    signature = bytes(view[chunks_end + key_size:size - CRC_SIZE])
    return ChunkIndex(bool(flags & SEALED), size, chunk_limit, bytes(view[:HEADER_SIZE]), tensors, chunks,
                      key_block, payload_size, raw_total, signature)


def _check_header(flags, reserved, tensor_count, chunk_count, chunk_limit, key_size, table_size, size, limits,
                  path):
    if flags & ~(SEALED | DIGESTS) or reserved:
        raise VersionError(f"chunk index flags {flags:#04x} / reserved {reserved:#06x} hold bits this build "
                           "does not know", path=path)
    if bool(flags & SEALED) != bool(key_size):
        raise CorruptError(f"chunk index is {'sealed' if flags & SEALED else 'not sealed'} but has a "
                           f"{key_size}-byte key block", path=path)
    if tensor_count > limits.max_tensor_count:
        raise LimitError(f"chunk index declares {tensor_count} tensors, above the limit of "
                         f"{limits.max_tensor_count}", path=path)
    if not 1 <= chunk_limit <= MAX_CHUNK_LIMIT:
        raise LimitError(f"chunk index declares chunks of up to {chunk_limit} bytes; readers decode chunks "
                         f"of 1 to {MAX_CHUNK_LIMIT} bytes", path=path)
    # Each count must be one the bytes present could hold, before anything is sized by it.
    record = _record_size(flags)
    expected = HEADER_SIZE + table_size + record * chunk_count + key_size + _signature_size(flags) + CRC_SIZE
    if expected != size:
        raise CorruptError(f"chunk index declares {size} bytes but its parts ({table_size}-byte tensor table, "
                           f"{chunk_count} chunks of {record}, {key_size}-byte key block"
                           f"{', 64-byte signature' if flags & DIGESTS else ''}) add up to {expected}", path=path)
    if tensor_count * _MIN_RECORD > table_size:
        raise CorruptError(f"a {table_size}-byte tensor table cannot hold {tensor_count} records of at least "
                           f"{_MIN_RECORD} bytes", path=path)


def _parse_tensors(view, count, limits, strict_dtypes, path) -> dict:
    tensors = {}
    pos, previous, end = 0, None, len(view)
    for i in range(count):
        start = pos
        name_len, pos = _u(view, pos, 2, end, f"tensor record {i} name length", path)
        if name_len > limits.max_name_bytes:
            raise LimitError(f"tensor record {i} name is {name_len} bytes, above the limit of "
                             f"{limits.max_name_bytes}", path=path)
        raw_name = _take(view, pos, name_len, end, f"tensor record {i} name", path)
        pos += name_len
        name = _utf8(raw_name, i, path)
        if previous is not None and raw_name <= previous:
            raise CorruptError(f"tensor record {i} ({name!r}) is not after the one before it: names must be "
                               "unique and in increasing byte order", path=path)
        previous = raw_name
        dtype_id, pos = _u(view, pos, 1, end, f"tensor {name!r} dtype", path)
        ndim, pos = _u(view, pos, 1, end, f"tensor {name!r} ndim", path)
        if ndim > limits.max_dims:
            raise LimitError(f"tensor {name!r} has {ndim} dims, above the limit of {limits.max_dims}", path=path)
        dims = _take(view, pos, 8 * ndim, end, f"tensor {name!r} dims", path)
        pos += 8 * ndim
        shape = struct.unpack(f"<{ndim}Q", dims)
        n_chunks, pos = _u(view, pos, 4, end, f"tensor {name!r} chunk count", path)
        dtype, nbytes = _dtype_and_size(dtype_id, shape, name, strict_dtypes, path)
        tensors[name] = TensorRecord(name, dtype_id, dtype, shape, 0, n_chunks, nbytes, bytes(view[start:pos]))
    if pos != end:
        raise CorruptError(f"tensor table is {end} bytes but its {count} records end at {pos}", path=path)
    return tensors


def _dtype_and_size(dtype_id, shape, name, strict, path):
    """The DType (None if unknown and allowed) and the bytes shape x dtype take (-1 if unknown)."""
    if not APR2_IDS.knows(dtype_id):
        if strict:
            raise UnknownDTypeError(f"tensor {name!r}: dtype id {dtype_id} is not defined by the apr2 table "
                                    "the chunk index uses", path=path)
        return None, -1
    dtype = APR2_IDS.dtype(dtype_id)
    try:
        check_shape(shape, max(dtype.itemsize, 1), f"tensor {name!r}")
    except LimitError as exc:
        raise LimitError(exc.message, path=path) from None
    return dtype, dtype.nbytes(shape)


def _parse_chunks(view, count, chunk_limit, payload_size, flags, path) -> list:
    chunks = []
    at = 0
    size = _record_size(flags)
    for i in range(count):
        offset, stored, raw, crc, reserved = _CHUNK.unpack_from(view, i * size)
        if offset != at:
            raise CorruptError(f"chunk {i} starts at payload offset {offset}, but chunks are contiguous in index "
                               f"order and the one before it ends at {at} (reordered, overlapping or a gap)",
                               path=path)
        if reserved:
            raise VersionError(f"chunk {i} has reserved field {reserved:#x}, not 0", path=path)
        if not 1 <= raw <= chunk_limit:
            raise CorruptError(f"chunk {i} declares {raw} raw bytes; chunks hold 1 to {chunk_limit} "
                               "(the index's chunk_limit)", path=path)
        if offset + stored > payload_size:
            raise CorruptError(f"chunk {i} ({stored} bytes at payload offset {offset}) ends past the "
                               f"{payload_size}-byte payload (truncated file or lying size)", path=path)
        digest = bytes(view[i * size + CHUNK_RECORD_SIZE:(i + 1) * size])
        chunks.append(Chunk(offset, stored, raw, crc, digest))
        at = offset + stored
    if at != payload_size:
        raise CorruptError(f"chunks end at payload offset {at} but the payload is {payload_size} bytes "
                           "(bytes no chunk explains)", path=path)
    return chunks


def _assign(tensors: dict, chunks: list, path) -> int:
    """Give each tensor its run of chunks and check the run's raw sizes against its
    shape x dtype; the total raw bytes."""
    first = 0
    total = 0
    for name, t in list(tensors.items()):
        if t.count > len(chunks) - first:
            raise CorruptError(f"tensor {name!r} claims {t.count} chunks but only {len(chunks) - first} are left",
                               path=path)
        raw = sum(c.raw_size for c in chunks[first:first + t.count])
        if t.nbytes >= 0 and raw != t.nbytes:
            raise CorruptError(f"tensor {name!r}: {t.dtype.name} of shape {list(t.shape)} takes {t.nbytes} bytes "
                               f"but its {t.count} chunk(s) hold {raw}", path=path)
        tensors[name] = TensorRecord(t.name, t.dtype_id, t.dtype, t.shape, first, t.count,
                                     raw if t.nbytes < 0 else t.nbytes, t.record)
        first += t.count
        total += raw
    if first != len(chunks):
        raise CorruptError(f"the tensors own {first} chunks but the index lists {len(chunks)}", path=path)
    return total


def _u(view, pos, n, end, what, path):
    return int.from_bytes(_take(view, pos, n, end, what, path), "little"), pos + n


def _take(view, pos, n, end, what, path) -> bytes:
    if pos + n > end:
        raise CorruptError(f"{what} ({n} bytes at {pos}) runs past the {end}-byte tensor table", path=path)
    return bytes(view[pos:pos + n])


def _utf8(raw: bytes, i, path) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptError(f"tensor record {i} name is not UTF-8: {exc.reason} at byte {exc.start}",
                           path=path) from None
