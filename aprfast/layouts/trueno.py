"""The v1 trueno-native tensor index (header flag TRUENO_NATIVE, seed 000 §9.2-9.7).

With the flag set the v1 payload (stored uncompressed and unencrypted, starting on a
64-byte boundary of the file) is::

    tensor_count u32
    entries[tensor_count], packed, in the order of their data:
        name_hash u64 (FNV-1a 64 of the UTF-8 name)   dtype u8 (0 f32, 1 f16, 2 bf16, 3 i8, 4 u8)
        ndims u8   shape[ndims] u32   stride[ndims] u32 (elements)
        alignment u8   backend_hint u8 (§9.3)   offset u64 (absolute in the file, 64-aligned)
        size_bytes u64
    names[tensor_count] (aprfast): u16 length + UTF-8 bytes, in entry order
    zero padding to a 64-byte boundary of the file
    tensor data, each tensor at its offset, zero-padded to the next 64-byte boundary

The seed stores only hashes; the name table (in what the seed calls padding, which
offset-based readers skip) gives the names back, and each name must hash to its entry.
docs/FORMAT.md ("v1 trueno-native tensors") records every decision.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..dtypes import DTYPES, DType, check_shape
from ..errors import CorruptError, LayoutError, LimitError, UnknownDTypeError
from ..limits import Limits

__all__ = ["ALIGNMENT", "DTYPE_IDS", "BACKENDS", "fnv1a64", "backend_id", "backend_name", "Entry", "plan",
           "parse", "extent"]

#: Every tensor starts on this boundary of the file (seed §9.5: "64-byte alignment universally").
ALIGNMENT = 64
#: §9.2's dtype byte.
DTYPE_IDS = {0: "F32", 1: "F16", 2: "BF16", 3: "I8", 4: "U8"}
_ID_OF = {name: i for i, name in DTYPE_IDS.items()}
#: §9.3's backend hints.
BACKENDS = {0: "auto", 1: "scalar", 2: "sse2", 3: "avx", 4: "avx2", 5: "avx512", 6: "neon", 7: "wasm-simd",
            8: "gpu"}
_BACKEND_ALIASES = {"avx-512": "avx512", "wasm": "wasm-simd", "wasm_simd": "wasm-simd", "cpu": "scalar"}
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_U32_MAX = 0xFFFFFFFF
_COUNT = struct.Struct("<I")
_FIXED_ENTRY = 8 + 1 + 1 + 1 + 1 + 8 + 8  # an entry with 0 dims


def fnv1a64(data: bytes) -> int:
    """FNV-1a, 64-bit (offset basis 0xcbf29ce484222325, prime 0x100000001b3)."""
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def backend_id(value) -> int:
    """A §9.3 backend id from its name ("auto", "avx2", ...) or id 0-8."""
    if isinstance(value, str):
        key = value.strip().lower()
        key = _BACKEND_ALIASES.get(key, key)
        for i, name in BACKENDS.items():
            if name == key:
                return i
        raise ValueError(f"unknown backend hint {value!r}; use one of {', '.join(BACKENDS.values())}")
    if isinstance(value, bool) or not isinstance(value, int) or value not in BACKENDS:
        raise ValueError(f"backend hint must be a name or an id 0-8, not {value!r}")
    return value


def backend_name(value: int) -> str:
    """The hint's name; ids a later writer may add are reported, not refused (a hint is advice)."""
    return BACKENDS.get(value, f"unknown({value})")


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: DType
    shape: tuple
    strides: tuple  # in elements
    alignment: int
    backend_hint: int
    offset: int     # absolute in the file
    nbytes: int


def extent(shape, strides, itemsize: int) -> int:
    """Bytes from the first element to the end of the last one the strides reach."""
    if any(d == 0 for d in shape):
        return 0
    return (sum((d - 1) * s for d, s in zip(shape, strides)) + 1) * itemsize


# --- writing -----------------------------------------------------------------------
def plan(inputs: list, hints, payload_start: int):
    """(index bytes incl. names and padding, [(input, offset, pad after)], payload size).

    ``inputs`` are TensorInputs in name order; ``hints`` maps a name to a backend id;
    ``payload_start`` (64-aligned) is where the payload begins in the file."""
    if payload_start % ALIGNMENT:
        raise LayoutError(f"the trueno payload must start on a {ALIGNMENT}-byte boundary, not at {payload_start}")
    entries_size = _COUNT.size + sum(_FIXED_ENTRY + 8 * len(t.shape) for t in inputs)
    names = [t.name.encode("utf-8") for t in inputs]
    names_size = sum(2 + len(n) for n in names)
    at = payload_start + _align(entries_size + names_size)
    placed, entries, seen = [], [], {}
    for t, raw in zip(inputs, names):
        dtype_id = _dtype_id(t)
        h = fnv1a64(raw)
        if h in seen:
            raise LayoutError(f"tensor names {seen[h]!r} and {t.name!r} have the same FNV-1a hash; the trueno "
                              "index finds tensors by hash, so rename one")
        seen[h] = t.name
        entries.append(_entry(t, h, dtype_id, hints.get(t.name, 0), at))
        pad = _align(t.nbytes) - t.nbytes
        placed.append((t, at, pad))
        at += t.nbytes + pad
    if len(names) > _U32_MAX:
        raise LayoutError("too many tensors for the trueno index's u32 count")
    head = _COUNT.pack(len(inputs)) + b"".join(entries)
    head += b"".join(struct.pack("<H", len(n)) + n for n in names)
    head += bytes(_align(len(head)) - len(head))
    return head, placed, at - payload_start


def _dtype_id(t) -> int:
    dtype_id = _ID_OF.get(t.dtype.name)
    if dtype_id is None:
        raise LayoutError(f"tensor {t.name!r} is {t.dtype.name}; trueno-native files hold only "
                          f"{', '.join(DTYPE_IDS.values())} (seed 000 §9.2): save it without trueno_native=True")
    return dtype_id


def _entry(t, name_hash: int, dtype_id: int, hint: int, offset: int) -> bytes:
    if len(t.name.encode("utf-8")) > 0xFFFF:
        raise LayoutError(f"tensor name {t.name[:40]!r}... is longer than the u16 name table allows")
    if len(t.shape) > 255 or any(d > _U32_MAX for d in t.shape):
        raise LayoutError(f"tensor {t.name!r} of shape {list(t.shape)}: trueno dims are u32, at most 255 of them")
    strides, step = [], 1
    for d in reversed(t.shape):  # C order, in elements
        strides.append(step)
        step *= d
    strides.reverse()
    if any(s > _U32_MAX for s in strides):
        raise LayoutError(f"tensor {t.name!r} of shape {list(t.shape)}: a stride does not fit trueno's u32")
    n = len(t.shape)
    return (struct.pack("<QBB", name_hash, dtype_id, n) + struct.pack(f"<{n}I", *t.shape)
            + struct.pack(f"<{n}I", *strides) + struct.pack("<BBQQ", ALIGNMENT, hint, offset, t.nbytes))


# --- reading -----------------------------------------------------------------------
def parse(payload, payload_start: int, *, path=None, limits: Limits | None = None) -> dict:
    """name -> Entry, in index order, from the payload bytes (``payload_start`` is
    where they lie in the file).  Every count, size, offset and stride is checked
    against the payload before anything is sized by it."""
    limits = limits or Limits()
    view = memoryview(payload).cast("B")
    end = len(view)
    if end < _COUNT.size:
        raise CorruptError(f"trueno payload is {end} bytes, too short for its tensor count", path=path)
    (count,) = _COUNT.unpack_from(view)
    if count > limits.max_tensor_count:
        raise LimitError(f"trueno index declares {count} tensors, above the limit of {limits.max_tensor_count}",
                         path=path)
    if _COUNT.size + count * (_FIXED_ENTRY + 2) > end:
        raise CorruptError(f"trueno index declares {count} tensors; {end} payload bytes cannot hold that many "
                           "entries and names", path=path)
    pos, raw = _COUNT.size, []
    for i in range(count):
        fields, pos = _read_entry(view, pos, i, limits, path)
        raw.append(fields)
    entries, hashes = {}, set()
    for i, fields in enumerate(raw):
        name, pos = _read_name(view, pos, i, limits, path)
        entry = _check_entry(name, fields, hashes, entries, limits, path)
        entries[name] = entry
    _check_placement(entries, payload_start, payload_start + pos, payload_start + end, path)
    return entries


def _read_entry(view, pos, i, limits, path):
    head = _need(view, pos, 10, f"trueno entry {i}", path)
    name_hash, dtype_id, ndim = struct.unpack("<QBB", head)
    if ndim > limits.max_dims:
        raise LimitError(f"trueno entry {i} has {ndim} dims, above the limit of {limits.max_dims}", path=path)
    pos += 10
    body = _need(view, pos, 8 * ndim + 18, f"trueno entry {i} shape, strides and placement", path)
    shape = struct.unpack_from(f"<{ndim}I", body)
    strides = struct.unpack_from(f"<{ndim}I", body, 4 * ndim)
    alignment, hint, offset, size = struct.unpack_from("<BBQQ", body, 8 * ndim)
    return (name_hash, dtype_id, shape, strides, alignment, hint, offset, size), pos + len(body)


def _read_name(view, pos, i, limits, path):
    n = int.from_bytes(_need(view, pos, 2, f"trueno name {i} length", path), "little")
    if n > limits.max_name_bytes:
        raise LimitError(f"trueno name {i} is {n} bytes, above the limit of {limits.max_name_bytes}", path=path)
    raw = _need(view, pos + 2, n, f"trueno name {i}", path)
    try:
        return raw.decode("utf-8"), pos + 2 + n
    except UnicodeDecodeError as exc:
        raise CorruptError(f"trueno name {i} is not UTF-8: {exc.reason}", path=path) from None


def _check_entry(name, fields, hashes, entries, limits, path) -> Entry:
    name_hash, dtype_id, shape, strides, alignment, hint, offset, size = fields
    if fnv1a64(name.encode("utf-8")) != name_hash:
        raise CorruptError(f"trueno tensor {name!r}: name hash {name_hash:#018x} is not the FNV-1a of its name",
                           path=path)
    if name_hash in hashes or name in entries:
        raise CorruptError(f"trueno tensor {name!r} is listed twice (same name hash)", path=path)
    hashes.add(name_hash)
    if dtype_id not in DTYPE_IDS:
        raise UnknownDTypeError(f"trueno tensor {name!r}: dtype byte {dtype_id} is not one §9.2 defines "
                                f"({', '.join(f'{k}={v}' for k, v in DTYPE_IDS.items())})", path=path)
    dtype = DTYPES[DTYPE_IDS[dtype_id]]
    if alignment == 0 or alignment & (alignment - 1) or alignment > ALIGNMENT:
        raise CorruptError(f"trueno tensor {name!r}: alignment {alignment} is not a power of two up to "
                           f"{ALIGNMENT}", path=path)
    if offset % ALIGNMENT:
        raise CorruptError(f"trueno tensor {name!r}: offset {offset} is not {ALIGNMENT}-byte aligned", path=path)
    try:
        check_shape(shape, dtype.itemsize, f"trueno tensor {name!r}")
    except LimitError as exc:
        raise LimitError(exc.message, path=path) from None
    # The strides may reach no further than the tensor's own bytes: a hostile stride
    # must not make a view read another tensor or past the file.
    reach = extent(shape, strides, dtype.itemsize)
    if reach > size:
        raise CorruptError(f"trueno tensor {name!r}: shape {list(shape)} with strides {list(strides)} reaches "
                           f"{reach} bytes but the tensor has {size}", path=path)
    # Nor may they repeat elements (a zero stride broadcasts one value over any shape):
    # an owned copy holds every element, so its size must be bounded by the bytes stored.
    count = 1
    for dim in shape:
        count *= dim
    if count * dtype.itemsize > size:
        raise CorruptError(f"trueno tensor {name!r}: shape {list(shape)} holds {count} elements "
                           f"({count * dtype.itemsize} bytes) but the tensor stores {size}: strides that "
                           f"repeat elements are refused", path=path)
    return Entry(name, dtype, tuple(shape), tuple(strides), alignment, hint, offset, size)


def _check_placement(entries: dict, payload_start: int, index_end: int, payload_end: int, path) -> None:
    """Every tensor lies after the index and names, inside the payload, and no two overlap."""
    previous = None
    for e in sorted(entries.values(), key=lambda e: (e.offset, e.nbytes)):
        if e.offset < index_end or e.offset + e.nbytes > payload_end:
            raise CorruptError(f"trueno tensor {e.name!r} ({e.nbytes} bytes at {e.offset}) lies outside the tensor "
                               f"data [{index_end}, {payload_end})", path=path)
        if previous is not None and e.nbytes and previous.offset + previous.nbytes > e.offset:
            raise CorruptError(f"trueno tensors {previous.name!r} and {e.name!r} overlap", path=path)
        if e.nbytes:
            previous = e


def _need(view, pos, n, what, path) -> bytes:
    if pos + n > len(view):
        raise CorruptError(f"{what} ({n} bytes at payload offset {pos}) runs past the {len(view)}-byte payload",
                           path=path)
    return bytes(view[pos:pos + n])
