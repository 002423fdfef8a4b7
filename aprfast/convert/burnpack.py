"""Burnpack (Burn's native format, seed 004) in and out, one tensor at a time.

A file is a 10-byte header (the bytes ``NRUB``: the u32 0x4255524E little-endian; a u16
version, 1; a u32 metadata length), that many bytes of CBOR metadata, zero padding to
the next multiple of 256, then the tensors, each starting on a 256-byte boundary of
the data section.  The CBOR is serde's encoding (Burn writes it with ciborium) of

    {"tensors": {name: {"dtype", "shape", "data_offsets": [start, end], "param_id"?}},
     "metadata"?: {str: str}, "scalars"?: {str: {"Int"|"UInt"|"Float"|"Bool": value}}}

with names sorted (a BTreeMap) and offsets relative to the data section.  The CBOR is
decoded by ``cbor2`` (extra ``aprfast[burnpack]``), but only after :func:`check_cbor`
has walked its bytes: every length against the bytes left, the nesting depth, the
number of items and the memory their decode would take (relative to the file's size,
and absolute), no tags and no indefinite lengths, no duplicate map keys.  The
header, tensor count, shapes and offsets are then checked against the file before any
tensor is read.  docs/FORMAT.md §17 records every decision.
"""

from __future__ import annotations

import math
import os
import struct

from .. import dtypes as _dtypes
from .._optional import require
from ..errors import CorruptError, FormatError, LayoutError, LimitError, UnknownDTypeError, VersionError
from ..io.atomic import AtomicFile
from ._common import DeclaredWriter, Spec, TensorFileSource, check_shape_bytes, copy_range, read_exact
from .safetensors import _write_all, metadata_from_strings, metadata_to_strings, tensor_bytes

__all__ = ["BurnpackSource", "BurnpackWriter", "check_cbor", "MAGIC", "EXTENSION", "ALIGNMENT",
           "MAX_METADATA_SIZE", "MAX_TENSOR_COUNT", "MAX_CBOR_DEPTH", "MAX_CBOR_ITEMS", "MAX_CBOR_MEMORY",
           "cbor_budget"]

#: The first four bytes: Burn's MAGIC_NUMBER 0x4255524E ("BURN") written little-endian.
MAGIC = b"NRUB"
VERSION = 1
HEADER_SIZE = 10
ALIGNMENT = 256
EXTENSION = ".bpk"
#: Burn's own reader limits (burn-pack 0.23): refused before anything is allocated.
MAX_METADATA_SIZE = 100 * 1024 * 1024
MAX_TENSOR_COUNT = 100_000
MAX_CBOR_DEPTH = 128
#: CBOR items (every int, string, array, map) the metadata may hold: each becomes a
#: Python object, so this bounds the memory a small hostile file can demand.
MAX_CBOR_ITEMS = 16_000_000
#: What decoding the metadata may build, estimated by :func:`check_cbor` before cbor2
#: runs (CPython object sizes: an empty map becomes a 64-byte dict, an empty array a
#: 56-byte list, ...): at most METADATA_MEMORY_FACTOR times the file's size (or the
#: metadata's, for a bare block) or METADATA_MEMORY_FLOOR, whichever is larger
#: (:mod:`aprfast.limits`, as for .apr metadata), and never more than this.  Burn's real
#: metadata costs about 8 bytes of objects per byte of CBOR (tensor descriptors), so
#: this admits ~100 MiB of it, Burn's own cap.
MAX_CBOR_MEMORY = 1 << 30

#: Burn DType (serde's CBOR form: a unit variant is its name) -> aprfast dtype name.
_PLAIN = {"F64": "F64", "F32": "F32", "Flex32": "F32", "F16": "F16", "BF16": "BF16", "I64": "I64",
          "I32": "I32", "I16": "I16", "I8": "I8", "U64": "U64", "U32": "U32", "U16": "U16", "U8": "U8",
          "Bool": "BOOL"}  # "Bool" alone: Burn before BoolStore (0.20)
_BOOL_STORES = {"Native": "BOOL", "U8": "BOOL", "U32": "U32"}
#: aprfast dtype -> the Burn DType written for it (BOOL as Burn 0.23 writes bool tensors).
_TO_BURN = {"F64": "F64", "F32": "F32", "F16": "F16", "BF16": "BF16", "I64": "I64", "I32": "I32",
            "I16": "I16", "I8": "I8", "U64": "U64", "U32": "U32", "U16": "U16", "U8": "U8",
            "BOOL": {"Bool": "Native"}}
_SCALAR_KINDS = ("Int", "UInt", "Float", "Bool")

#: .apr metadata keys this module adds (and reads back on export).
PARAM_IDS_KEY = "burnpack.param_ids"
SCALARS_KEY = "burnpack.scalars"
DTYPES_KEY = "burnpack.dtypes"
VERSION_KEY = "burnpack.version"
_PREFIX = "burnpack."
_U64 = 1 << 64


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def data_section_start(metadata_size: int) -> int:
    """Where the data section starts: header + metadata rounded up to 256 (Burn's
    ``aligned_data_section_start``)."""
    return _align(HEADER_SIZE + metadata_size)


# --- the CBOR guard ----------------------------------------------------------------------
# Estimated bytes of what cbor2 builds for each item (CPython, 64-bit), the slot in its
# container included: a map's dict grows by about 48 bytes a pair; an array's list by 8
# an item (9 with over-allocation); text takes up to ~80 bytes of header (non-ASCII);
# ints outside CPython's small-int cache are new objects.
_SLOT = 8
_INT, _SMALL_INT = 32, 0
_BYTES, _TEXT = 33, 80
_ARRAY, _ARRAY_ITEM = 56, 9
_MAP, _MAP_PAIR, _MAP_MIN = 64, 48, 184
_FLOAT = 24
_KEY_SET = 40  # check_cbor's own set of a map's raw keys: an entry, plus the bytes object


def cbor_budget(size: int) -> int:
    """Bytes a decode may build for metadata in a ``size``-byte file (or block):
    ``min(MAX_CBOR_MEMORY, max(METADATA_MEMORY_FACTOR * size, METADATA_MEMORY_FLOOR))``."""
    from .. import limits

    return min(MAX_CBOR_MEMORY, max(limits.METADATA_MEMORY_FACTOR * size, limits.METADATA_MEMORY_FLOOR))


def check_cbor(data: bytes, path=None, *, max_memory=None) -> None:
    """Walk ``data`` as one CBOR item without decoding it: every length must fit the
    bytes left, nesting at most MAX_CBOR_DEPTH, at most MAX_CBOR_ITEMS items, no tags,
    no indefinite lengths (Burn never writes them), no reserved codes, no two equal keys
    in a map, nothing after the item, and the objects cbor2 would build for it (an
    estimate of CPython's sizes, this walk's own set of map keys counted too) at most
    ``max_memory`` bytes (default :func:`cbor_budget` of ``len(data)``).  CorruptError
    (LimitError for the limits) names the offset, so a hostile length, or millions of
    empty maps, are refused before cbor2 allocates for them."""
    size, pos, items = len(data), 0, 0
    allowed = cbor_budget(size) if max_memory is None else max_memory
    cost = 0
    # one frame per open array/map: [items left, set of raw keys (maps) or None, is_map, expecting_key]
    stack = []

    def fail(message, cls=CorruptError):
        raise cls(f"CBOR metadata: {message}", path=path)

    while True:
        if pos >= size:
            fail(f"ends at byte {pos} inside an item" if stack or pos == 0 else f"ends at byte {pos}")
        start = pos
        initial = data[pos]
        major, info = initial >> 5, initial & 31
        pos += 1
        if info < 24:
            arg = info
        elif info <= 27:
            width = 1 << (info - 24)
            if pos + width > size:
                fail(f"the item at byte {start} needs {width} more bytes, the metadata has {size - pos}")
            arg = int.from_bytes(data[pos:pos + width], "big")
            pos += width
        elif info == 31:
            fail(f"indefinite-length item at byte {start} (Burn writes definite lengths only)")
        else:
            fail(f"reserved additional information {info} at byte {start}")
        items += 1
        if items > MAX_CBOR_ITEMS:
            fail(f"more than {MAX_CBOR_ITEMS} items (aprfast.convert.burnpack.MAX_CBOR_ITEMS)", LimitError)
        opened = None
        if major in (2, 3):
            if arg > size - pos:
                fail(f"string at byte {start} declares {arg} bytes, the metadata has {size - pos} left")
            pos += arg
            cost += _SLOT + (_BYTES if major == 2 else _TEXT) + arg
        elif major == 4:
            if arg > size - pos:
                fail(f"array at byte {start} declares {arg} items, the metadata has {size - pos} bytes left")
            opened = [arg, None, False, False]
            cost += _SLOT + _ARRAY + _ARRAY_ITEM * arg
        elif major == 5:
            if arg > (size - pos) // 2:
                fail(f"map at byte {start} declares {arg} pairs, the metadata has {size - pos} bytes left")
            opened = [2 * arg, set(), True, True]
            cost += _SLOT + (max(_MAP_MIN, _MAP + _MAP_PAIR * arg) if arg else _MAP)
        elif major == 6:
            fail(f"tag {arg} at byte {start} (Burn's metadata has no tags)")
        elif major == 7 and info == 24 and arg < 32:
            fail(f"invalid simple value {arg} at byte {start}")
        elif major == 7:
            cost += _SLOT + (_FLOAT if info >= 24 else 0)
        else:  # ints: CPython keeps -5..256 cached
            cost += _SLOT + (_SMALL_INT if (arg <= 256 if major == 0 else arg < 5) else _INT)
        if stack:  # this item fills a slot of the enclosing container
            frame = stack[-1]
            if frame[2] and frame[3]:
                key = data[start:pos] if opened is None else None
                if key is None:
                    fail(f"map key at byte {start} is an array or a map")
                if key in frame[1]:
                    fail(f"map key at byte {start} appears twice in its map")
                frame[1].add(key)
                cost += _KEY_SET + _BYTES + len(key)
            if frame[2]:
                frame[3] = not frame[3]
            frame[0] -= 1
        if cost > allowed:
            fail(f"decoding it would build about {cost} bytes of objects by byte {start} ({items} items), more than "
                 f"the {allowed} allowed (max({_limits_text()}), at most "
                 "aprfast.convert.burnpack.MAX_CBOR_MEMORY)", LimitError)
        if opened is not None and opened[0]:
            if len(stack) >= MAX_CBOR_DEPTH:
                fail(f"nests deeper than {MAX_CBOR_DEPTH} levels", LimitError)
            stack.append(opened)
            continue
        while stack and stack[-1][0] == 0:
            stack.pop()
        if not stack:
            break
    if pos != size:
        fail(f"{size - pos} bytes follow the metadata item at byte {pos}")


def _limits_text() -> str:
    return "aprfast.limits.METADATA_MEMORY_FACTOR x the file's size, METADATA_MEMORY_FLOOR"


def _loads(data: bytes, path, file_size=None):
    cbor2 = require("cbor2")
    check_cbor(data, path, max_memory=cbor_budget(max(len(data), file_size or 0)))
    try:
        return cbor2.loads(data)
    except (ValueError, TypeError, RecursionError, OverflowError, cbor2.CBORDecodeError) as exc:
        raise CorruptError(f"CBOR metadata does not decode ({type(exc).__name__}: {str(exc)[:200]})",
                           path=path) from None


# --- reading -----------------------------------------------------------------------------
def _is_uint(value, limit=_U64) -> bool:
    return type(value) is int and 0 <= value < limit


def _scalar_ok(kind, item) -> bool:
    """Whether ``{kind: item}`` is a Burn Scalar as serde decodes it."""
    if kind == "Bool":
        return type(item) is bool
    if kind == "Float":
        return isinstance(item, float)
    if kind == "Int":
        return type(item) is int and -(1 << 63) <= item < 1 << 63
    return kind == "UInt" and _is_uint(item)


def _json_safe(value):
    """Scalar values as JSON can hold them: non-finite floats become "nan"/"inf"/"-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


class BurnpackSource(TensorFileSource):
    """One Burnpack file as a tensor stream (specs in data order)."""

    kind = "Burnpack"

    def _parse(self) -> None:
        size = os.fstat(self._fd).st_size
        if size < HEADER_SIZE:
            raise CorruptError(f"file is {size} bytes, shorter than the {HEADER_SIZE}-byte Burnpack header",
                               path=self.path)
        head = read_exact(self._fd, 0, HEADER_SIZE, "the Burnpack header", self.path)
        magic, version, meta_size = struct.unpack("<4sHI", head)
        if magic != MAGIC:
            raise FormatError(f"not a Burnpack file (magic {magic!r}, expected {MAGIC!r})", path=self.path)
        if version != VERSION:  # Burn accepts 0 too, but has only ever written 1
            raise VersionError(f"Burnpack version {version} is not read (version {VERSION} is)", path=self.path)
        if meta_size > MAX_METADATA_SIZE:
            raise LimitError(f"Burnpack metadata size {meta_size} exceeds the {MAX_METADATA_SIZE}-byte limit",
                             path=self.path)
        if meta_size > size - HEADER_SIZE:
            raise CorruptError(f"Burnpack metadata of {meta_size} bytes runs past the end of the {size}-byte file",
                               path=self.path)
        self.version = version
        top = _loads(read_exact(self._fd, HEADER_SIZE, meta_size, "the Burnpack metadata", self.path), self.path,
                     size)
        self._data_start = data_section_start(meta_size)
        tensors, user, scalars = self._sections(top)
        entries, param_ids, burn_dtypes = [], {}, {}
        for name, desc in tensors.items():
            spec, start, param_id, burn_dtype = self._entry(name, desc)
            entries.append((spec, start))
            if param_id is not None:
                param_ids[name] = param_id
            if burn_dtype is not None:
                burn_dtypes[name] = burn_dtype
        self._check_ranges(entries, size)
        entries.sort(key=lambda e: (e[1], e[0].name))  # file order: reads go front to back
        self.specs = [spec for spec, _ in entries]
        self._offsets = {spec.name: start for spec, start in entries}
        self.metadata = self._apr_metadata(user, scalars, param_ids, burn_dtypes)

    def _sections(self, top):
        if not isinstance(top, dict) or not all(isinstance(k, str) for k in top):
            raise CorruptError("Burnpack metadata is not a CBOR map of text keys", path=self.path)
        tensors = top.get("tensors")
        if not isinstance(tensors, dict) or not all(isinstance(k, str) for k in tensors):
            raise CorruptError("Burnpack metadata has no \"tensors\" map of name -> descriptor", path=self.path)
        if len(tensors) > MAX_TENSOR_COUNT:
            raise LimitError(f"Burnpack file declares {len(tensors)} tensors, more than {MAX_TENSOR_COUNT}",
                             path=self.path)
        user = top.get("metadata", {})
        if not isinstance(user, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in user.items()):
            raise CorruptError("Burnpack \"metadata\" must be a map of text to text", path=self.path)
        scalars = top.get("scalars", {})
        if not isinstance(scalars, dict):
            raise CorruptError("Burnpack \"scalars\" must be a map", path=self.path)
        checked = {}
        for key, value in scalars.items():
            kind, item = next(iter(value.items())) if isinstance(value, dict) and len(value) == 1 else (None, None)
            if not (isinstance(key, str) and _scalar_ok(kind, item)):
                raise CorruptError(f"Burnpack scalar {key!r} is not one of {{Int|UInt|Float|Bool: value}}: "
                                   f"{value!r:.100}", path=self.path)
            checked[key] = {kind: _json_safe(item)}
        return tensors, user, checked

    def _dtype(self, name: str, value):
        """(aprfast dtype, the Burn dtype to record when export would not write it back)."""
        where = f"tensor {name!r}"
        if isinstance(value, str) and value in _PLAIN:
            apr = _PLAIN[value]
        elif isinstance(value, dict) and len(value) == 1:
            ((variant, inner),) = value.items()
            if variant == "Bool" and isinstance(inner, str) and inner in _BOOL_STORES:
                apr = _BOOL_STORES[inner]
            elif variant == "QFloat":
                raise UnknownDTypeError(f"{where}: Burn quantized tensors (QFloat {inner!r:.80}) are not read: "
                                        "their packed values and inline scales have no aprfast dtype",
                                        path=self.path)
            else:
                raise UnknownDTypeError(f"{where}: Burn dtype {value!r:.80} is not one aprfast knows", path=self.path)
        else:
            raise UnknownDTypeError(f"{where}: Burn dtype {value!r:.80} is not one aprfast knows", path=self.path)
        return _dtypes.by_name(apr), (None if _TO_BURN.get(apr) == value else value)

    def _entry(self, name: str, desc):
        where = f"tensor {name!r}"
        if not isinstance(desc, dict) or not all(isinstance(k, str) for k in desc):
            raise CorruptError(f"{where}: descriptor is not a map", path=self.path)
        for field in ("dtype", "shape", "data_offsets"):
            if field not in desc:
                raise CorruptError(f"{where}: descriptor has no {field!r}", path=self.path)
        dtype, burn_dtype = self._dtype(name, desc["dtype"])
        shape, offsets, param_id = desc["shape"], desc["data_offsets"], desc.get("param_id")
        if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
            raise CorruptError(f"{where}: shape {shape!r:.100} is not a list of u64", path=self.path)
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_uint(o) for o in offsets):
            raise CorruptError(f"{where}: data_offsets {offsets!r:.100} are not [start, end] of u64", path=self.path)
        if offsets[1] < offsets[0]:
            raise CorruptError(f"{where}: data_offsets end {offsets[1]} is before start {offsets[0]}", path=self.path)
        if param_id is not None and not _is_uint(param_id):
            raise CorruptError(f"{where}: param_id {param_id!r:.40} is not a u64", path=self.path)
        nbytes = check_shape_bytes(name, dtype, shape, self.path)
        if offsets[1] - offsets[0] != nbytes:
            raise CorruptError(f"{where}: {desc['dtype']} of shape {shape} needs {nbytes} bytes, but data_offsets "
                               f"{offsets} span {offsets[1] - offsets[0]}", path=self.path)
        return Spec(name, dtype, tuple(shape)), offsets[0], param_id, burn_dtype

    def _check_ranges(self, entries, size: int) -> None:
        """Every tensor inside the file, no two sharing a byte (Burn's writer never
        overlaps them; refusing overlap keeps a small file from naming huge tensors)."""
        end, last = 0, None
        for spec, start in sorted(entries, key=lambda e: (e[1], e[0].nbytes)):
            if self._data_start + start + spec.nbytes > size:
                raise CorruptError(f"tensor {spec.name!r} ends at byte {self._data_start + start + spec.nbytes}, "
                                   f"past the end of the {size}-byte file (truncated?)", path=self.path)
            if spec.nbytes and start < end:
                raise CorruptError(f"tensor {spec.name!r} at data offset {start} overlaps tensor {last!r}",
                                   path=self.path)
            if spec.nbytes:
                end, last = start + spec.nbytes, spec.name

    def _apr_metadata(self, user, scalars, param_ids, burn_dtypes) -> dict:
        metadata = metadata_from_strings(user, self.path)
        metadata[VERSION_KEY] = self.version
        if param_ids:
            metadata[PARAM_IDS_KEY] = param_ids
        if scalars:
            metadata[SCALARS_KEY] = scalars
        if burn_dtypes:
            metadata[DTYPES_KEY] = burn_dtypes
        return metadata


# --- writing -----------------------------------------------------------------------------
class _Float:
    """A float CBOR-encoded in its shortest exact width, as ciborium writes floats."""

    def __init__(self, value: float):
        self.value = value

    def encode(self) -> bytes:
        v = self.value
        for head, fmt in ((0xF9, ">e"), (0xFA, ">f")):
            try:
                packed = struct.pack(fmt, v)
            except (OverflowError, struct.error):
                continue
            if struct.pack(">d", struct.unpack(fmt, packed)[0]) == struct.pack(">d", v):
                return bytes([head]) + packed
        return b"\xfb" + struct.pack(">d", v)


def _cbor_default(encoder, value):
    if isinstance(value, _Float):
        encoder.write(value.encode())
        return
    raise TypeError(f"cannot encode {type(value).__name__}")


def burn_dtype(spec: Spec, recorded=None):
    """The Burn DType for ``spec`` (the one recorded on import when it still fits), or
    LayoutError naming what Burnpack cannot hold."""
    default = _TO_BURN.get(spec.dtype.name)
    if default is None:
        raise LayoutError(f"tensor {spec.name!r}: Burnpack cannot hold {spec.dtype.name} (quantized blocks, "
                          "float8, FP4, complex and aprender's types have no Burn dtype; convert with "
                          "precision='f32' to dequantize)")
    if recorded is not None:
        if isinstance(recorded, str) and _PLAIN.get(recorded) == spec.dtype.name:
            return recorded
        if (isinstance(recorded, dict) and len(recorded) == 1 and recorded.get("Bool") in _BOOL_STORES
                and _BOOL_STORES[recorded["Bool"]] == spec.dtype.name):
            return dict(recorded)
    return default


def _scalar_value(key, value):
    if not isinstance(value, dict) or len(value) != 1:
        raise LayoutError(f"{SCALARS_KEY}[{key!r}] must be {{Int|UInt|Float|Bool: value}}, not {value!r:.80}")
    ((kind, item),) = value.items()
    if kind == "Float":
        if isinstance(item, str) and item in ("nan", "inf", "-inf"):
            item = float(item)
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            return {kind: _Float(float(item))}
    elif kind == "Bool" and type(item) is bool:
        return {kind: item}
    elif kind == "Int" and type(item) is int and -(1 << 63) <= item < 1 << 63:
        return {kind: item}
    elif kind == "UInt" and _is_uint(item):
        return {kind: item}
    raise LayoutError(f"{SCALARS_KEY}[{key!r}] = {value!r:.80} is not a Burn scalar")


def _table(metadata: dict, key: str) -> dict:
    value = metadata.get(key) or {}
    if not isinstance(value, dict):
        raise LayoutError(f"metadata {key!r} must be an object, not {type(value).__name__}")
    return value


def metadata_bytes(specs, metadata: dict):
    """(CBOR metadata, data offset of each spec): offsets assigned in ``specs`` order,
    each rounded up to 256; the CBOR laid out as Burn's serde/ciborium writes it
    (struct fields in declaration order, empty maps and absent param_ids left out,
    names sorted, integers and floats in their shortest form)."""
    metadata = metadata or {}
    param_ids, dtypes_ = _table(metadata, PARAM_IDS_KEY), _table(metadata, DTYPES_KEY)
    tensors, offsets, offset = {}, [], 0
    for spec in specs:
        if spec.name in tensors:
            raise LayoutError(f"tensor {spec.name!r} is declared twice")
        start = _align(offset)
        desc = {"dtype": burn_dtype(spec, dtypes_.get(spec.name)), "shape": list(spec.shape),
                "data_offsets": [start, start + spec.nbytes]}
        param_id = param_ids.get(spec.name)
        if param_id is not None:
            if not _is_uint(param_id):
                raise LayoutError(f"{PARAM_IDS_KEY}[{spec.name!r}] = {param_id!r:.40} is not a u64")
            desc["param_id"] = param_id
        tensors[spec.name] = desc
        offsets.append(start)
        offset = start + spec.nbytes
    user = metadata_to_strings({k: v for k, v in metadata.items() if not k.startswith(_PREFIX)})
    scalars = {k: _scalar_value(k, v) for k, v in _table(metadata, SCALARS_KEY).items()}
    top = {"tensors": {name: tensors[name] for name in sorted(tensors)}}
    if user:
        top["metadata"] = {k: user[k] for k in sorted(user)}
    if scalars:
        top["scalars"] = {k: scalars[k] for k in sorted(scalars)}
    data = require("cbor2").dumps(top, default=_cbor_default)
    if len(data) > MAX_METADATA_SIZE:
        raise LayoutError(f"Burnpack metadata would be {len(data)} bytes; Burn reads at most {MAX_METADATA_SIZE}")
    return data, offsets


class BurnpackWriter(DeclaredWriter):
    """Writes one Burnpack file: header and CBOR from the declared specs at once, then
    each tensor at its 256-byte-aligned offset as it is added, in the declared order.
    Atomic: nothing replaces ``path`` unless ``close()`` is reached."""

    def __init__(self, path, specs, metadata=None, *, durable: bool = True):
        self.specs = list(specs)
        meta, self._offsets = metadata_bytes(self.specs, metadata or {})
        self._next, self._written = 0, 0
        self._atomic = AtomicFile(path, durable=durable)
        try:
            head = struct.pack("<4sHI", MAGIC, VERSION, len(meta)) + meta
            _write_all(self._atomic.fd, head + bytes(data_section_start(len(meta)) - len(head)))
        except BaseException:
            self.abort()
            raise

    def _pad_to(self, i: int) -> None:
        gap = self._offsets[i] - self._written
        if gap:
            _write_all(self._atomic.fd, bytes(gap))
        self._written = self._offsets[i] + self.specs[i].nbytes

    def add(self, name: str, value) -> None:
        spec = self._expect(name)
        data = tensor_bytes(spec, value)
        self._pad_to(self._next)
        _write_all(self._atomic.fd, data)
        self._next += 1

    def add_range(self, name: str, fd: int, offset: int) -> None:
        """The next declared tensor, copied unchanged from ``fd`` at ``offset``."""
        spec = self._expect(name)
        self._pad_to(self._next)
        copy_range(fd, offset, spec.nbytes, self._atomic.fd, f"tensor {name!r}")
        self._next += 1

