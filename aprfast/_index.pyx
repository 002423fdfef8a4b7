# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Binary tensor-index parsing and validation for both v2 layouts.

Both layouts store entries as ``u16 name_len | name | u8 dtype | u8 ndim |
ndim x u64 dims | u64 offset | u64 size`` and the spec layout appends ``u64 raw_size |
u32 flags``.  Parsing 10,000 entries in Python would dominate ``open``; here one pass
checks every entry against the bytes present and fills flat arrays, and Python
objects are made only for the tensors a caller asks about.
"""

import numpy as np

from libc.stdint cimport int8_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

from .errors import CorruptError, LimitError, UnknownDTypeError

# Size rules per dtype id (see aprfast.dtypes.DType.nbytes).
cdef enum:
    C_UNKNOWN = 0
    C_FIXED = 1         # count * a
    C_ROW_BLOCKS = 2    # rows * ceil(last_dim / a) * b
    C_FLAT_BLOCKS = 3   # ceil(count / a) * b
    C_SCALE_PLUS_ONE = 4  # a + count (a = header bytes: APR_Q8 4, Q8_TENSOR 8), or 0 when empty

RULE_UNKNOWN = C_UNKNOWN
RULE_FIXED = C_FIXED
RULE_ROW_BLOCKS = C_ROW_BLOCKS
RULE_FLAT_BLOCKS = C_FLAT_BLOCKS
RULE_SCALE_PLUS_ONE = C_SCALE_PLUS_ONE

# No real file is this large; products beyond it are reported instead of wrapping.
cdef uint64_t HUGE = (<uint64_t>1) << 62
# NPY_MAXDIMS of NumPy 2 (NumPy 1 has 32; arrays beyond it fail there with ValueError).
cdef int NUMPY_MAX_DIMS = 64


cdef inline uint64_t le64(const uint8_t *p) nogil:
    return (<uint64_t>p[0] | (<uint64_t>p[1] << 8) | (<uint64_t>p[2] << 16) | (<uint64_t>p[3] << 24)
            | (<uint64_t>p[4] << 32) | (<uint64_t>p[5] << 40) | (<uint64_t>p[6] << 48) | (<uint64_t>p[7] << 56))


cdef inline uint32_t le32(const uint8_t *p) nogil:
    return <uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline uint16_t le16(const uint8_t *p) nogil:
    return <uint16_t>(p[0] | (p[1] << 8))


class Entries:
    """Flat arrays describing every index entry; names are decoded by the caller.

    ``fields`` is (count, 5) int64: name start, name length, dtype id, ndim, first dim;
    ``extents`` is (count, 4) uint64: offset, size, raw size, flags; ``dims`` holds
    every entry's dims back to back.  Three allocations however many tensors.
    """

    def __init__(self, blob, count, fields, extents, dims):
        self.blob = blob
        self.count = count
        self.fields = fields
        self.extents = extents
        self.dims = dims

    name_start = property(lambda self: self.fields[:, 0])
    name_len = property(lambda self: self.fields[:, 1])
    dtype_id = property(lambda self: self.fields[:, 2])
    ndim = property(lambda self: self.fields[:, 3])
    dim_start = property(lambda self: self.fields[:, 4])
    offset = property(lambda self: self.extents[:, 0])
    size = property(lambda self: self.extents[:, 1])
    raw_size = property(lambda self: self.extents[:, 2])
    flags = property(lambda self: self.extents[:, 3])

    def shape(self, Py_ssize_t i):
        start, nd = self.fields[i, 4], self.fields[i, 3]
        return tuple(self.dims[start:start + nd].tolist())

    def names(self):
        return decode_names(self.blob, self.fields)


def decode_names(const uint8_t[::1] blob, const int64_t[:, ::1] fields):
    """Tensor names as str; invalid UTF-8 raises CorruptError naming the entry."""
    cdef Py_ssize_t i, n = fields.shape[0]
    cdef const char *base = <const char *>&blob[0] if blob.shape[0] else NULL
    names = [None] * n
    for i in range(n):
        try:
            names[i] = (base + fields[i, 0])[:fields[i, 1]].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptError(f"tensor index entry {i}: name is not UTF-8 ({exc.reason})") from None
    return names


def parse_entries(const uint8_t[::1] blob, Py_ssize_t start, Py_ssize_t end, Py_ssize_t count,
                  bint spec_layout, int max_dims, int max_name_bytes):
    """Parse ``count`` entries from ``blob[start:end]``; every read is bounds-checked."""
    cdef Py_ssize_t fixed_tail = 16 + (12 if spec_layout else 0)
    cdef Py_ssize_t min_entry = 2 + 2 + fixed_tail
    if count < 0 or end - start < 0 or count > (end - start) // min_entry:
        raise CorruptError(f"tensor index holds {end - start} bytes, too few for the {count} "
                           f"entries the header declares (each takes at least {min_entry})")
    fields = np.empty((count, 5), np.int64)
    extents = np.zeros((count, 4), np.uint64)
    dims = np.empty(count * max_dims if max_dims > 0 else 0, np.uint64)
    cdef int64_t[:, ::1] f = fields
    cdef uint64_t[:, ::1] x = extents
    cdef uint64_t[::1] v_dims = dims
    cdef const uint8_t *p = &blob[0] if blob.shape[0] else NULL
    cdef Py_ssize_t pos = start, i, d, nd, nl, ndims_total = 0
    for i in range(count):
        if end - pos < 2:
            raise CorruptError(f"tensor index entry {i} at byte {pos} is cut off (need 2 bytes for "
                               f"its name length, {end - pos} left)")
        nl = le16(p + pos)
        if nl > max_name_bytes:
            raise LimitError(f"tensor index entry {i}: name of {nl} bytes exceeds the limit of "
                             f"{max_name_bytes} (aprfast.limits.MAX_NAME_BYTES)")
        if end - pos < 2 + nl + 2:
            raise CorruptError(f"tensor index entry {i} at byte {pos} is cut off (name of {nl} bytes, "
                               f"{end - pos - 2} left)")
        f[i, 0] = pos + 2
        f[i, 1] = nl
        pos += 2 + nl
        f[i, 2] = p[pos]
        nd = p[pos + 1]
        pos += 2
        if nd > max_dims:
            raise LimitError(f"tensor index entry {i}: {nd} dimensions exceed the limit of {max_dims} "
                             f"(aprfast.limits.MAX_DIMS)")
        if end - pos < nd * 8 + fixed_tail:
            raise CorruptError(f"tensor index entry {i} is cut off: {nd} dims need {nd * 8 + fixed_tail} "
                               f"more bytes, {end - pos} left")
        f[i, 3] = nd
        f[i, 4] = ndims_total
        for d in range(nd):
            v_dims[ndims_total + d] = le64(p + pos + 8 * d)
        ndims_total += nd
        pos += 8 * nd
        x[i, 0] = le64(p + pos)
        x[i, 1] = le64(p + pos + 8)
        pos += 16
        if spec_layout:
            x[i, 2] = le64(p + pos)
            x[i, 3] = le32(p + pos + 8)
            pos += 12
    return Entries(blob, count, fields, extents, dims[:ndims_total]), pos


cdef uint64_t expected_size(int rule, int64_t a, int64_t b, const uint64_t *dims, int nd, bint *too_big) nogil:
    """Stored bytes of a tensor under ``rule``.  ``too_big`` is set when the product of the
    non-zero dims (times the item size) passes 2**62, which no file holds and NumPy can't
    shape even when another dim is 0."""
    cdef uint64_t count = 1, row, blocks
    cdef int d
    cdef bint empty = False
    for d in range(nd):
        if dims[d] == 0:
            empty = True
        elif dims[d] > HUGE or count > HUGE / dims[d]:
            too_big[0] = True
            return 0
        else:
            count *= dims[d]
    if rule == C_FIXED and count > HUGE / <uint64_t>a:
        too_big[0] = True
        return 0
    if empty:
        return 0
    if rule == C_FIXED:
        return count * <uint64_t>a
    if rule == C_SCALE_PLUS_ONE:
        return <uint64_t>a + count
    if rule == C_FLAT_BLOCKS:
        return (count + <uint64_t>a - 1) / <uint64_t>a * <uint64_t>b
    # C_ROW_BLOCKS: GGML blocks never straddle rows
    row = dims[nd - 1] if nd > 0 else 1
    blocks = (count / row) * ((row + <uint64_t>a - 1) / <uint64_t>a)
    if blocks > HUGE / <uint64_t>b:
        too_big[0] = True
        return 0
    return blocks * <uint64_t>b


def check_entries(entries, const int8_t[::1] rule, const int64_t[::1] rule_a, const int64_t[::1] rule_b,
                  uint64_t data_len, bint strict_dtypes, list names, uint64_t pad_to=1):
    """Reject unknown dtypes (when strict), sizes that differ from shape x dtype, extents
    outside the ``data_len`` bytes of the data section, and overlapping extents.

    Returns where the data ends if every tensor is padded to ``pad_to`` bytes."""
    cdef Py_ssize_t i, n = entries.count, prev = -1
    cdef uint64_t end, data_end = 0
    cdef const int64_t[:, ::1] f = entries.fields
    cdef const uint64_t[:, ::1] x = entries.extents
    cdef const uint64_t[::1] dims = entries.dims
    cdef const uint64_t *dp
    cdef uint64_t want, off, size
    cdef bint too_big, monotonic = True
    cdef int r, t
    for i in range(n):
        off, size = x[i, 0], x[i, 1]
        if off > data_len or size > data_len - off:
            raise CorruptError(f"tensor {names[i]!r}: {size} bytes at offset {off} of the data "
                               f"section lie outside its {data_len} bytes")
        t = <int>f[i, 2]
        r = rule[t]
        if r == C_UNKNOWN:
            if strict_dtypes:
                raise UnknownDTypeError(f"tensor {names[i]!r}: unknown dtype id {t}")
        else:
            if r == C_FIXED and f[i, 3] > NUMPY_MAX_DIMS:
                raise LimitError(f"tensor {names[i]!r} has {f[i, 3]} dims; NumPy arrays hold at most "
                                 f"{NUMPY_MAX_DIMS}")
            too_big = False
            dp = &dims[f[i, 4]] if f[i, 3] else NULL
            want = expected_size(r, rule_a[t], rule_b[t], dp, <int>f[i, 3], &too_big)
            if too_big:
                raise CorruptError(f"tensor {names[i]!r}: shape {list(entries.shape(i))} declares more "
                                   f"than 2**62 elements or bytes")
            if want != size:
                raise CorruptError(f"tensor {names[i]!r}: shape {list(entries.shape(i))} needs {want} "
                                   f"bytes but the index says {size}")
        end = off + (size + pad_to - 1) // pad_to * pad_to  # no wrap: both are below data_len
        if end > data_end:
            data_end = end
        if size:  # an empty tensor occupies nothing, wherever it points
            if prev >= 0 and off < x[prev, 0] + x[prev, 1]:
                monotonic = False
            prev = i
    if not monotonic:
        _check_no_overlap(entries, names)
    return data_end


def _check_no_overlap(entries, list names):
    cdef const uint64_t[:, ::1] x = entries.extents
    order = np.argsort(entries.offset, kind="stable")
    cdef const int64_t[::1] o = order
    cdef Py_ssize_t k, prev = -1, cur
    for k in range(o.shape[0]):
        cur = o[k]
        if x[cur, 1] == 0:
            continue
        if prev >= 0 and x[cur, 0] < x[prev, 0] + x[prev, 1]:
            raise CorruptError(f"tensors {names[prev]!r} ({x[prev, 1]} bytes at offset {x[prev, 0]}) and "
                               f"{names[cur]!r} ({x[cur, 1]} bytes at offset {x[cur, 0]}) overlap")
        prev = cur


def names_strictly_sorted(const uint8_t[::1] blob, const int64_t[:, ::1] fields):
    """True when names are in strictly increasing byte order (so they are unique)."""
    cdef Py_ssize_t i, n = fields.shape[0]
    cdef int c
    cdef int64_t la, lb
    cdef const uint8_t *p = &blob[0] if blob.shape[0] else NULL
    for i in range(1, n):
        la = fields[i - 1, 1]
        lb = fields[i, 1]
        c = memcmp(p + fields[i - 1, 0], p + fields[i, 0], la if la < lb else lb)
        if c > 0 or (c == 0 and la >= lb):
            return False
    return True


def encode_entries(list tensors, list offsets, dict id_of, bint spec_layout):
    """Index entries for writer inputs (name, dtype, shape, nbytes) at ``offsets`` in
    the data section; ``id_of`` maps each DType to this layout's id."""
    cdef Py_ssize_t i, d, n = len(tensors), total = 0, pos = 0, nd
    cdef Py_ssize_t tail = 16 + (12 if spec_layout else 0)
    cdef bytes name
    names = [None] * n
    for i in range(n):
        item = tensors[i]
        name = item.name.encode("utf-8")
        names[i] = name
        total += 2 + len(name) + 2 + 8 * len(item.shape) + tail
    out = bytearray(total)
    cdef unsigned char[::1] o = out
    for i in range(n):
        item = tensors[i]
        name = names[i]
        shape = item.shape
        nd = len(shape)
        put_le(&o[pos], len(name), 2)
        pos += 2
        if len(name):
            memcpy(&o[pos], <const char *>name, len(name))
        pos += len(name)
        o[pos] = <unsigned char>id_of[item.dtype]
        o[pos + 1] = <unsigned char>nd
        pos += 2
        for d in range(nd):
            put_le(&o[pos], shape[d], 8)
            pos += 8
        put_le(&o[pos], offsets[i], 8)
        put_le(&o[pos + 8], item.nbytes, 8)
        pos += tail  # the spec layout's raw_size 0 and flags 0 are already zero
    return bytes(out)


def lay_out(list tensors, Py_ssize_t alignment):
    """Aligned offsets in the data section for ``tensors`` in order, the padding after
    each, and the section size."""
    cdef Py_ssize_t i, n = len(tensors), offset = 0, size, pad, mask = alignment - 1
    offsets = [0] * n
    pads = [0] * n
    for i in range(n):
        size = tensors[i].nbytes
        pad = -size & mask
        offsets[i] = offset
        pads[i] = pad
        offset += size + pad
    return offsets, pads, offset


cdef inline void put_le(unsigned char *p, uint64_t value, int width):
    cdef int k
    for k in range(width):
        p[k] = <unsigned char>(value >> (8 * k))


def all_rows(entries, int64_t data_start):
    """Per entry ``(dtype_id, absolute offset, size, shape)``, in index order: what a
    reader needs to hand out a tensor without touching the arrays again."""
    cdef const int64_t[:, ::1] f = entries.fields
    cdef const uint64_t[:, ::1] x = entries.extents
    cdef const uint64_t[::1] dims = entries.dims
    cdef Py_ssize_t i, d, n = f.shape[0]
    out = [None] * n
    for i in range(n):
        shape = tuple([dims[f[i, 4] + d] for d in range(f[i, 3])])
        out[i] = (f[i, 2], data_start + <int64_t>x[i, 0], x[i, 1], shape)
    return out
