"""Binary tensor-index parsing and validation for both v2 layouts, the pure twin of
``aprfast._index`` (same checks in the same order, same errors and messages).

Both layouts store entries as ``u16 name_len | name | u8 dtype | u8 ndim |
ndim x u64 dims | u64 offset | u64 size`` and the spec layout appends ``u64 raw_size |
u32 flags``.  :func:`parse_index` checks each entry completely before the next, so the
first bad or duplicate entry fails at once.  :class:`Entries` keeps a copy of the
index bytes and where every entry starts, and decodes names, shapes and extents only
when asked.  Names are strictly sorted, so a name is found by binary search.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Mapping, Sequence

import numpy as np

from ..errors import CorruptError, LimitError, UnknownDTypeError, VersionError
from ._views import check_int, check_uint, typed_view

# Size rules per dtype id (see aprfast.dtypes.DType.nbytes).
RULE_UNKNOWN = 0
RULE_FIXED = 1          # count * a
RULE_ROW_BLOCKS = 2     # rows * ceil(last_dim / a) * b
RULE_FLAT_BLOCKS = 3    # ceil(count / a) * b
RULE_SCALE_PLUS_ONE = 4  # a + count (a = header bytes), or 0 when empty

# No real file is this large; products beyond it are reported instead of wrapping
# (aprfast.dtypes.MAX_SHAPE_BYTES), and it keeps every shape NumPy-representable.
HUGE = 1 << 62
# NPY_MAXDIMS of NumPy 2.
NUMPY_MAX_DIMS = 64
# Packed tensors dequantize to float32.
DEQUANTIZED_ITEMSIZE = 4
# APR2 per-tensor flags: the low nibble names a codec (1 LZ4, 2 zstd), every other bit
# is reserved; a compressed tensor stores at least its 8-byte block-table header.
CODEC_MASK = 0x0F
MAX_CODEC = 2
MIN_COMPRESSED = 8

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_TAIL_STORED = struct.Struct("<QQ")
_TAIL_SPEC = struct.Struct("<QQQI")


def _tail_bytes(spec_layout: bool) -> int:
    return 16 + (12 if spec_layout else 0)


def expected_size(rule: int, a: int, b: int, dims: tuple):
    """Stored bytes of a tensor under ``rule``, or None when the product of the non-zero
    dims (times the item size of the float32 values a packed type dequantizes to) passes
    2**62: no file holds that, and NumPy can't shape it even when another dim is 0."""
    count, empty = 1, False
    for dim in dims:
        if dim == 0:
            empty = True
        elif dim > HUGE or count > HUGE // dim:
            return None
        else:
            count *= dim
    if rule == RULE_UNKNOWN:
        return 0
    item = a if rule == RULE_FIXED else DEQUANTIZED_ITEMSIZE
    if item and count > HUGE // item:
        return None
    if empty:
        return 0
    if rule == RULE_FIXED:
        return count * a
    if rule == RULE_SCALE_PLUS_ONE:
        return a + count
    if rule == RULE_FLAT_BLOCKS:
        blocks = (count + a - 1) // a
    else:  # RULE_ROW_BLOCKS: GGML blocks never straddle rows
        row = dims[-1] if dims else 1
        blocks = (count // row) * ((row + a - 1) // a)
    if b and blocks > HUGE // b:
        return None
    return blocks * b


# --- parsing ------------------------------------------------------------------------
def parse_index(blob, count, spec_layout, max_dims, max_name_bytes, rule, rule_a, rule_b, data_len,
                strict_dtypes, pad_to=1):
    """Parse and check ``count`` entries filling ``blob``, each completely before the
    next; return the :class:`Entries` and where the data ends when every tensor is padded
    to ``pad_to`` bytes (see the compiled module for the list of checks)."""
    p = typed_view(blob, np.uint8).tobytes()
    count = check_int(count, 64, "Py_ssize_t")
    spec_layout = bool(spec_layout)
    data_len = check_uint(data_len, 64, "uint64_t")
    pad_to = check_uint(pad_to, 64, "uint64_t")
    rules = typed_view(rule, np.int8).tolist()
    rules_a = typed_view(rule_a, np.int64).tolist()
    rules_b = typed_view(rule_b, np.int64).tolist()
    end = len(p)
    tail = _tail_bytes(spec_layout)
    min_entry = 2 + 2 + tail
    if count < 0 or count > end // min_entry:
        raise CorruptError(f"tensor index holds {end} bytes, too few for the {count} "
                           f"entries the header declares (each takes at least {min_entry})")
    starts = array("q", [0]) * count  # where each entry starts: 8 bytes an entry
    pos, prev_name, compressed = 0, b"", 0
    data_end, prev_end, last_nonempty, monotonic = 0, 0, -1, True
    for i in range(count):
        s = pos
        starts[i] = s
        # -- the bytes are there, within the limits
        if end - pos < 2:
            raise CorruptError(f"tensor index entry {i} at byte {pos} is cut off (need 2 bytes for "
                               f"its name length, {end - pos} left)")
        nl = _U16.unpack_from(p, pos)[0]
        if nl > max_name_bytes:
            raise LimitError(f"tensor index entry {i}: name of {nl} bytes exceeds the limit of "
                             f"{max_name_bytes} (aprfast.limits.MAX_NAME_BYTES)")
        if end - pos < 2 + nl + 2:
            raise CorruptError(f"tensor index entry {i} at byte {pos} is cut off (name of {nl} bytes, "
                               f"{end - pos - 2} left)")
        t, nd = p[pos + 2 + nl], p[pos + 3 + nl]
        pos += 4 + nl
        if nd > max_dims:
            raise LimitError(f"tensor index entry {i}: {nd} dimensions exceed the limit of {max_dims} "
                             f"(aprfast.limits.MAX_DIMS)")
        if end - pos < nd * 8 + tail:
            raise CorruptError(f"tensor index entry {i} is cut off: {nd} dims need {nd * 8 + tail} "
                               f"more bytes, {end - pos} left")
        q = pos + 8 * nd
        pos = q + tail
        # -- the name: UTF-8, and strictly after the previous one
        raw = p[s + 2:s + 2 + nl]
        _check_name_bytes(i, raw)
        if i and prev_name >= raw:
            _refuse_order(i, prev_name, raw)
        prev_name = raw
        name = raw.decode("utf-8")
        dims = struct.unpack_from(f"<{nd}Q", p, s + 4 + nl)
        # -- stored as is, inside the data section, the size its shape needs
        off, size = _TAIL_STORED.unpack_from(p, q)
        raw_size = codec = 0
        if spec_layout:
            raw_size, codec = _TAIL_SPEC.unpack_from(p, q)[2:]
            if codec & ~CODEC_MASK or codec > MAX_CODEC:
                raise VersionError(f"tensor {name!r}: per-tensor flags {codec:#x} name a codec or "
                                   "feature this build does not read (it knows 1 LZ4 and 2 zstd blocks)")
            if (codec == 0) != (raw_size == 0):
                raise CorruptError(f"tensor {name!r}: raw_size {raw_size} with per-tensor flags "
                                   f"{codec:#x}; a compressed tensor needs both, a stored one neither")
            if codec and size < MIN_COMPRESSED:
                raise CorruptError(f"tensor {name!r}: {size} stored bytes cannot hold a block table")
            compressed += codec != 0
        if off > data_len or size > data_len - off:
            raise CorruptError(f"tensor {name!r}: {size} bytes at offset {off} of the data "
                               f"section lie outside its {data_len} bytes")
        r = rules[t]
        if r == RULE_UNKNOWN and strict_dtypes:
            raise UnknownDTypeError(f"tensor {name!r}: unknown dtype id {t}")
        if r != RULE_UNKNOWN and nd > NUMPY_MAX_DIMS:
            raise LimitError(f"tensor {name!r} has {nd} dims; NumPy arrays hold at most "
                             f"{NUMPY_MAX_DIMS}")
        want = expected_size(r, rules_a[t], rules_b[t], dims)
        if want is None:
            raise CorruptError(f"tensor {name!r}: shape {list(dims)} declares more "
                               f"than 2**62 elements or bytes"
                               + (" (as the float32 values it dequantizes to)" if r > RULE_FIXED else ""))
        if r != RULE_UNKNOWN and want != (raw_size if codec else size):
            raise CorruptError(f"tensor {name!r}: shape {list(dims)} needs {want} "
                               f"bytes but the index says {raw_size if codec else size}"
                               + (" (its raw_size)" if codec else ""))
        # -- where the data ends; do extents follow each other?
        stop = off + (size + pad_to - 1) // pad_to * pad_to
        data_end = max(data_end, stop)
        if size:  # an empty tensor occupies nothing, wherever it points
            if last_nonempty >= 0 and off < prev_end:
                monotonic = False
            last_nonempty = i
            prev_end = off + size
    entries = Entries(blob, count, spec_layout, starts, _bytes=p)
    entries.compressed = compressed
    if not monotonic:
        _check_no_overlap(entries)
    return entries, data_end


def _check_name_bytes(i: int, raw: bytes) -> None:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptError(f"tensor index entry {i}: name is not UTF-8 ({exc.reason})") from None


def _refuse_order(i: int, prev: bytes, cur: bytes):
    """Both layouts keep the index sorted by name (by UTF-8 bytes), strictly, so names
    are unique; aprender's reader refuses anything else too."""
    prev_name, cur_name = prev.decode("utf-8"), cur.decode("utf-8")
    what = "appears twice" if prev == cur else f"comes after {prev_name!r}"
    raise CorruptError(f"tensor index entry {i}: name {cur_name!r} {what}; names must be unique and sorted")


def _check_no_overlap(entries):
    offsets, sizes = entries.extents()
    order = np.argsort(offsets, kind="stable").tolist()
    off, size = offsets.tolist(), sizes.tolist()
    prev = -1
    for cur in order:
        if size[cur] == 0:
            continue
        if prev >= 0 and off[cur] == off[prev] and size[cur] == size[prev]:
            continue  # one storage under two names (tied weights): shared, not overlapping
        if prev >= 0 and off[cur] < off[prev] + size[prev]:
            raise CorruptError(f"tensors {entries.name(prev)!r} ({size[prev]} bytes at offset {off[prev]}) "
                               f"and {entries.name(cur)!r} ({size[cur]} bytes at offset {off[cur]}) overlap")
        prev = cur


# --- reading a parsed index ------------------------------------------------------------
class Entries:
    """A checked index: a copy of its bytes, and where every entry starts.

    ``name(i)``, ``shape(i)``, ``row(i, data_start)``, ... decode one entry on demand;
    ``find(name)`` is a binary search over the (strictly sorted) names."""

    def __init__(self, blob, count, spec_layout, starts: array, *, _bytes=None):
        self._blob = blob
        self._p = typed_view(blob, np.uint8).tobytes() if _bytes is None else _bytes
        self._count = count
        self._spec_layout = bool(spec_layout)
        self._starts = starts
        self._tail = _tail_bytes(self._spec_layout)
        #: how many entries name a codec (APR2 per-tensor compression)
        self.compressed = 0

    blob = property(lambda self: self._blob)
    count = property(lambda self: self._count)
    spec_layout = property(lambda self: self._spec_layout)

    def __len__(self):
        return self._count

    def _start(self, i):
        i = i.__index__()
        if i < 0 or i >= self._count:
            raise IndexError(f"tensor index entry {i} of {self._count}")
        return self._starts[i]

    # the fields of the entry at byte s
    def _name_len(self, s):
        return _U16.unpack_from(self._p, s)[0]

    def _name_at(self, s):
        return self._p[s + 2:s + 2 + self._name_len(s)].decode("utf-8")

    def _shape_at(self, s):
        nl = self._name_len(s)
        return struct.unpack_from(f"<{self._p[s + 3 + nl]}Q", self._p, s + 4 + nl)

    def _dtype_at(self, s):
        return self._p[s + 2 + self._name_len(s)]

    def _tail_at(self, s):
        """Where the entry's u64 offset starts."""
        nl = self._name_len(s)
        return s + 4 + nl + 8 * self._p[s + 3 + nl]

    def _flags_at(self, q):
        return _U32.unpack_from(self._p, q + 24)[0] if self._spec_layout else 0

    def name(self, i):
        return self._name_at(self._start(i))

    def names(self):
        """Every name, in index order (a new list of new str objects)."""
        return [self._name_at(s) for s in self._starts]

    def shape(self, i):
        return self._shape_at(self._start(i))

    def dtype_id(self, i):
        return self._dtype_at(self._start(i))

    def offset(self, i):
        """Offset of the tensor in the data section."""
        return _U64.unpack_from(self._p, self._tail_at(self._start(i)))[0]

    def size(self, i):
        return _U64.unpack_from(self._p, self._tail_at(self._start(i)) + 8)[0]

    def raw_size(self, i):
        return _U64.unpack_from(self._p, self._tail_at(self._start(i)) + 16)[0] if self._spec_layout else 0

    def flags(self, i):
        return self._flags_at(self._tail_at(self._start(i)))

    def compressed_positions(self):
        """Positions of the entries that name a codec, in index order."""
        if not self.compressed:
            return []
        return [i for i, s in enumerate(self._starts) if self._flags_at(self._tail_at(s))]

    def row(self, i, data_start):
        """``(dtype_id, absolute offset, size, shape)`` of entry ``i``."""
        return self._row(self._start(i), check_int(data_start, 64, "int64_t"))

    def _row(self, s, data_start):
        off, size = _TAIL_STORED.unpack_from(self._p, self._tail_at(s))
        return (self._dtype_at(s), data_start + _as_int64(off), size, self._shape_at(s))

    def rows(self, data_start):
        """Every entry's :meth:`row`, in index order."""
        data_start = check_int(data_start, 64, "int64_t")
        return [self._row(s, data_start) for s in self._starts]

    def tensors_in(self, data_start, buffer, base, dtypes, make_one):
        """``{name: tensor}`` for every entry, viewing ``buffer`` (file byte ``base`` at its
        byte 0): tensors of a dtype id in ``dtypes`` as ``np.ndarray`` views, the others
        (and 0-d ones alike) through ``make_one(type_id, shape, buffer, start, size)``."""
        data_start = check_int(data_start, 64, "int64_t")
        base = check_int(base, 64, "int64_t")
        if not isinstance(dtypes, dict):
            raise TypeError(f"Argument 'dtypes' has incorrect type (expected dict, got {type(dtypes).__name__})")
        out = {}
        for s in self._starts:
            type_id, offset, size, shape = self._row(s, data_start)
            start = offset - base
            dtype = dtypes.get(type_id) if shape else None
            name = self._name_at(s)
            out[name] = np.ndarray(shape, dtype, buffer, start) if dtype is not None else \
                make_one(type_id, shape, buffer, start, size)
        return out

    def locate(self, names):
        """Where the tensors called ``names`` (a list) are: three int64 arrays, each
        name's position in the index (-1 for a name the index lacks), its offset in the
        data section and its stored size (0 and 0 when missing)."""
        if not isinstance(names, list):
            raise TypeError(f"Argument 'names' has incorrect type (expected list, got {type(names).__name__})")
        positions = np.array([self.find(name) for name in names], np.int64)
        offsets = np.zeros(len(names), np.int64)
        sizes = np.zeros(len(names), np.int64)
        for k, i in enumerate(positions.tolist()):
            if i >= 0:
                offsets[k], sizes[k] = _TAIL_STORED.unpack_from(self._p, self._tail_at(self._starts[i]))
        return positions, offsets, sizes

    def views_at(self, positions, starts, region, buffers, dtypes, make_one):
        """A list of tensors, the k-th entry ``positions[k]`` viewing ``buffers[region[k]]``
        from its byte ``starts[k]``, made as :meth:`tensors_in` makes them."""
        if not isinstance(buffers, list):
            raise TypeError(f"Argument 'buffers' has incorrect type (expected list, got {type(buffers).__name__})")
        if not isinstance(dtypes, dict):
            raise TypeError(f"Argument 'dtypes' has incorrect type (expected dict, got {type(dtypes).__name__})")
        positions, starts, region = (np.asarray(a, np.int64).tolist() for a in (positions, starts, region))
        if len(starts) != len(positions) or len(region) != len(positions):
            raise ValueError("positions, starts and region differ in length")
        out = []
        for i, start, b in zip(positions, starts, region):
            if b < 0 or b >= len(buffers):
                raise IndexError(f"region {b} of {len(buffers)} buffers")
            type_id, _offset, size, shape = self._row(self._start(i), 0)
            dtype = dtypes.get(type_id) if shape else None
            buffer = buffers[b]
            out.append(np.ndarray(shape, dtype, buffer, start) if dtype is not None else
                       make_one(type_id, shape, buffer, start, size))
        return out

    def describe(self, data_start, dtype_names):
        """``{name: {"dtype", "shape", "offset", "nbytes"}}`` for every entry in index
        order (what ``aprfast.inspect`` reports); ``dtype_names`` maps each id to its name."""
        data_start = check_int(data_start, 64, "int64_t")
        if not isinstance(dtype_names, list):
            raise TypeError(f"Argument 'dtype_names' has incorrect type (expected list, got "
                            f"{type(dtype_names).__name__})")
        out = {}
        for s in self._starts:
            q = self._tail_at(s)
            off, size = _TAIL_STORED.unpack_from(self._p, q)
            entry = {"dtype": dtype_names[self._dtype_at(s)], "shape": list(self._shape_at(s)),
                     "offset": data_start + _as_int64(off), "nbytes": size}
            flags = self._flags_at(q)
            if flags:  # compressed: what it inflates to, and how
                entry.update(raw_size=_U64.unpack_from(self._p, q + 16)[0], flags=flags)
            out[self._name_at(s)] = entry
        return out

    def extents(self):
        """Two uint64 arrays: every tensor's offset in the data section, and its size."""
        pairs = [_TAIL_STORED.unpack_from(self._p, self._tail_at(s)) for s in self._starts]
        both = np.array(pairs, np.uint64).reshape(self._count, 2)
        return np.ascontiguousarray(both[:, 0]), np.ascontiguousarray(both[:, 1])

    def _name_bytes(self, i):
        s = self._starts[i]
        return self._p[s + 2:s + 2 + self._name_len(s)]

    def find(self, name):
        """The position of the tensor called ``name`` (a str), or -1."""
        if not isinstance(name, str) or not self._count:
            return -1
        try:
            key = name.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: no UTF-8 name can equal it
            return -1
        lo, hi = 0, self._count  # names sort by their UTF-8 bytes
        while lo < hi:
            mid = (lo + hi) >> 1
            if self._name_bytes(mid) < key:
                lo = mid + 1
            else:
                hi = mid
        return lo if lo < self._count and self._name_bytes(lo) == key else -1


def _as_int64(value: int) -> int:
    """A u64 read as the C's ``<int64_t>`` cast does (two's complement)."""
    return value - (1 << 64) if value >> 63 else value


class Names:
    """The names of an index as a read-only sequence, in index order."""

    def __init__(self, entries):
        if not isinstance(entries, Entries):
            raise TypeError(f"Argument 'entries' has incorrect type (expected Entries, got "
                            f"{type(entries).__name__})")
        self._entries = entries

    entries = property(lambda self: self._entries)

    def __len__(self):
        return self._entries.count

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._entries.name(i) for i in range(*index.indices(self._entries.count))]
        i = index.__index__()
        if i < 0:
            i += self._entries.count
        if i < 0 or i >= self._entries.count:
            raise IndexError("tensor name index out of range")
        return self._entries.name(i)

    def __iter__(self):
        return iter(self._entries.names())

    def __contains__(self, name):
        return self._entries.find(name) >= 0

    def index(self, name, *args):
        i = self._entries.find(name)
        if i < 0:
            raise ValueError(f"{name!r} is not in the tensor index")
        return i

    def count(self, name):
        return 1 if self._entries.find(name) >= 0 else 0

    def __reversed__(self):
        return reversed(self._entries.names())

    def __eq__(self, other):
        if isinstance(other, Names):
            return self._entries.names() == other.entries.names()
        if isinstance(other, (list, tuple)):
            return self._entries.names() == list(other)
        return NotImplemented

    __hash__ = None

    def __repr__(self):
        return f"<aprfast tensor names: {self._entries.count}>"


class Positions:
    """``{name: position in the index}`` as a read-only mapping, answered by binary search."""

    def __init__(self, entries):
        if not isinstance(entries, Entries):
            raise TypeError(f"Argument 'entries' has incorrect type (expected Entries, got "
                            f"{type(entries).__name__})")
        self._entries = entries

    entries = property(lambda self: self._entries)

    def __len__(self):
        return self._entries.count

    def __contains__(self, name):
        return self._entries.find(name) >= 0

    def __getitem__(self, name):
        i = self._entries.find(name)
        if i < 0:
            raise KeyError(name)
        return i

    def get(self, name, default=None):
        i = self._entries.find(name)
        return default if i < 0 else i

    def __iter__(self):
        return iter(self._entries.names())

    def keys(self):
        return Names(self._entries)

    def values(self):
        return range(self._entries.count)

    def items(self):
        return zip(self._entries.names(), range(self._entries.count))

    def __eq__(self, other):
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    __hash__ = None

    def __repr__(self):
        return f"<aprfast tensor positions: {self._entries.count}>"


Sequence.register(Names)
Mapping.register(Positions)


# --- writing ----------------------------------------------------------------------
def encode_entries(tensors, offsets, id_of, spec_layout, codecs=False):
    """Index entries for writer inputs (name, dtype, shape, nbytes) at ``offsets`` in
    the data section; ``id_of`` maps each DType to this layout's id.  With ``codecs``
    (spec layout) an input's ``raw_size`` and ``flags`` attributes fill the entry's last
    two fields."""
    out = bytearray()
    for i, item in enumerate(tensors):
        name = item.name.encode("utf-8")
        shape = item.shape
        # Widths as the C stores them: the name length and ndim keep their low bits
        # (the writer checks both first); every u64 must fit one (OverflowError).
        out += _U16.pack(len(name) & 0xFFFF) + name
        out += bytes((check_uint(id_of[item.dtype], 8, "unsigned char"), len(shape) & 0xFF))
        out += b"".join(_U64.pack(check_uint(d, 64, "uint64_t")) for d in shape)
        out += _U64.pack(check_uint(offsets[i], 64, "uint64_t")) + _U64.pack(check_uint(item.nbytes, 64, "uint64_t"))
        if spec_layout:
            raw_size, flags = (getattr(item, "raw_size", 0), getattr(item, "flags", 0)) if codecs else (0, 0)
            out += _U64.pack(check_uint(raw_size, 64, "uint64_t"))
            out += _U32.pack(check_uint(flags, 64, "uint64_t") & 0xFFFFFFFF)
    return bytes(out)


def lay_out(tensors, alignment):
    """Aligned offsets in the data section for ``tensors`` in order, the padding after
    each, and the section size."""
    mask = alignment - 1
    offsets, pads, offset = [], [], 0
    for t in tensors:
        size = t.nbytes
        pad = -size & mask
        offsets.append(offset)
        pads.append(pad)
        offset += size + pad
    return offsets, pads, offset
