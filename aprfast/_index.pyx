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
from libc.string cimport memcmp

from .errors import CorruptError, LimitError, UnknownDTypeError

# Size rules per dtype id (see aprfast.dtypes.DType.nbytes).
cdef enum:
    C_UNKNOWN = 0
    C_FIXED = 1         # count * a
    C_ROW_BLOCKS = 2    # rows * ceil(last_dim / a) * b
    C_FLAT_BLOCKS = 3   # ceil(count / a) * b
    C_SCALE_PLUS_ONE = 4  # 4 + count, or 0 when empty

RULE_UNKNOWN = C_UNKNOWN
RULE_FIXED = C_FIXED
RULE_ROW_BLOCKS = C_ROW_BLOCKS
RULE_FLAT_BLOCKS = C_FLAT_BLOCKS
RULE_SCALE_PLUS_ONE = C_SCALE_PLUS_ONE

# No real file is this large; products beyond it are reported instead of wrapping.
cdef uint64_t HUGE = (<uint64_t>1) << 62


cdef inline uint64_t le64(const uint8_t *p) nogil:
    return (<uint64_t>p[0] | (<uint64_t>p[1] << 8) | (<uint64_t>p[2] << 16) | (<uint64_t>p[3] << 24)
            | (<uint64_t>p[4] << 32) | (<uint64_t>p[5] << 40) | (<uint64_t>p[6] << 48) | (<uint64_t>p[7] << 56))


cdef inline uint32_t le32(const uint8_t *p) nogil:
    return <uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline uint16_t le16(const uint8_t *p) nogil:
    return <uint16_t>(p[0] | (p[1] << 8))


class Entries:
    """Flat arrays describing every index entry; ``names`` are decoded on demand."""

    def __init__(self, blob, count, name_start, name_len, dtype_id, ndim, dim_start, dims,
                 offset, size, raw_size, flags):
        self.blob = blob
        self.count = count
        self.name_start = name_start
        self.name_len = name_len
        self.dtype_id = dtype_id
        self.ndim = ndim
        self.dim_start = dim_start
        self.dims = dims
        self.offset = offset
        self.size = size
        self.raw_size = raw_size
        self.flags = flags

    def shape(self, Py_ssize_t i):
        start = self.dim_start[i]
        return tuple(self.dims[start:start + self.ndim[i]].tolist())

    def names(self):
        return decode_names(self.blob, self.name_start, self.name_len)


def decode_names(const uint8_t[::1] blob, int64_t[::1] starts, uint16_t[::1] lens):
    """Tensor names as str; invalid UTF-8 raises CorruptError naming the entry."""
    cdef Py_ssize_t i, n = starts.shape[0]
    names = [None] * n
    for i in range(n):
        try:
            names[i] = (<const char *>&blob[0] + starts[i])[:lens[i]].decode("utf-8")
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
    name_start = np.empty(count, np.int64)
    name_len = np.empty(count, np.uint16)
    dtype_id = np.empty(count, np.uint8)
    ndim = np.empty(count, np.uint8)
    dim_start = np.empty(count, np.int64)
    dims = np.empty(count * max_dims if max_dims > 0 else 0, np.uint64)
    offset = np.empty(count, np.uint64)
    size = np.empty(count, np.uint64)
    raw_size = np.zeros(count, np.uint64)
    flags = np.zeros(count, np.uint32)
    cdef int64_t[::1] v_name_start = name_start
    cdef uint16_t[::1] v_name_len = name_len
    cdef uint8_t[::1] v_dtype = dtype_id
    cdef uint8_t[::1] v_ndim = ndim
    cdef int64_t[::1] v_dim_start = dim_start
    cdef uint64_t[::1] v_dims = dims
    cdef uint64_t[::1] v_offset = offset
    cdef uint64_t[::1] v_size = size
    cdef uint64_t[::1] v_raw = raw_size
    cdef uint32_t[::1] v_flags = flags
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
        v_name_start[i] = pos + 2
        v_name_len[i] = <uint16_t>nl
        pos += 2 + nl
        v_dtype[i] = p[pos]
        nd = p[pos + 1]
        pos += 2
        if nd > max_dims:
            raise LimitError(f"tensor index entry {i}: {nd} dimensions exceed the limit of {max_dims} "
                             f"(aprfast.limits.MAX_DIMS)")
        if end - pos < nd * 8 + fixed_tail:
            raise CorruptError(f"tensor index entry {i} is cut off: {nd} dims need {nd * 8 + fixed_tail} "
                               f"more bytes, {end - pos} left")
        v_ndim[i] = <uint8_t>nd
        v_dim_start[i] = ndims_total
        for d in range(nd):
            v_dims[ndims_total + d] = le64(p + pos + 8 * d)
        ndims_total += nd
        pos += 8 * nd
        v_offset[i] = le64(p + pos)
        v_size[i] = le64(p + pos + 8)
        pos += 16
        if spec_layout:
            v_raw[i] = le64(p + pos)
            v_flags[i] = le32(p + pos + 8)
            pos += 12
    return Entries(blob, count, name_start, name_len, dtype_id, ndim, dim_start, dims[:ndims_total],
                   offset, size, raw_size, flags), pos


cdef uint64_t expected_size(int rule, int64_t a, int64_t b, const uint64_t *dims, int nd, bint *too_big) nogil:
    cdef uint64_t count = 1, row = 1, blocks
    cdef int d
    cdef bint empty = False
    for d in range(nd):
        if dims[d] == 0:
            empty = True
    if empty:
        return 0
    for d in range(nd):
        if dims[d] > HUGE or count > HUGE / dims[d]:
            too_big[0] = True
            return 0
        count *= dims[d]
    if rule == C_FIXED:
        if count > HUGE / <uint64_t>a:
            too_big[0] = True
            return 0
        return count * <uint64_t>a
    if rule == C_SCALE_PLUS_ONE:
        return 4 + count
    if rule == C_FLAT_BLOCKS:
        return (count + <uint64_t>a - 1) / <uint64_t>a * <uint64_t>b
    # RULE_ROW_BLOCKS: GGML blocks never straddle rows
    row = dims[nd - 1] if nd > 0 else 1
    blocks = (count / row) * ((row + <uint64_t>a - 1) / <uint64_t>a)
    if blocks > HUGE / <uint64_t>b:
        too_big[0] = True
        return 0
    return blocks * <uint64_t>b


def check_entries(entries, const int8_t[::1] rule, const int64_t[::1] rule_a, const int64_t[::1] rule_b,
                  uint64_t data_len, bint strict_dtypes, list names):
    """Reject unknown dtypes (when strict), sizes that differ from shape x dtype, extents
    outside the ``data_len`` bytes of the data section, and overlapping extents."""
    cdef Py_ssize_t i, n = entries.count
    cdef const uint8_t[::1] dt = entries.dtype_id
    cdef const uint8_t[::1] nd = entries.ndim
    cdef const int64_t[::1] ds = entries.dim_start
    cdef const uint64_t[::1] dims = entries.dims
    cdef const uint64_t[::1] off = entries.offset
    cdef const uint64_t[::1] size = entries.size
    cdef const uint64_t *dp
    cdef uint64_t want
    cdef bint too_big
    cdef int r
    for i in range(n):
        if off[i] > data_len or size[i] > data_len - off[i]:
            raise CorruptError(f"tensor {names[i]!r}: bytes [{off[i]}, {off[i] + size[i]}) of the data "
                               f"section lie outside its {data_len} bytes")
        r = rule[dt[i]]
        if r == C_UNKNOWN:
            if strict_dtypes:
                raise UnknownDTypeError(f"tensor {names[i]!r}: unknown dtype id {dt[i]}")
            continue
        too_big = False
        dp = &dims[ds[i]] if nd[i] else NULL
        want = expected_size(r, rule_a[dt[i]], rule_b[dt[i]], dp, nd[i], &too_big)
        if too_big:
            raise CorruptError(f"tensor {names[i]!r}: shape {list(entries.shape(i))} declares more "
                               f"than 2**62 bytes")
        if want != size[i]:
            raise CorruptError(f"tensor {names[i]!r}: shape {list(entries.shape(i))} needs {want} bytes "
                               f"but the index says {size[i]}")
    _check_no_overlap(entries, names)


def _check_no_overlap(entries, list names):
    cdef const uint64_t[::1] off = entries.offset
    cdef const uint64_t[::1] size = entries.size
    order = np.argsort(entries.offset, kind="stable")
    cdef const int64_t[::1] o = order
    cdef Py_ssize_t k, prev = -1, cur
    for k in range(o.shape[0]):
        cur = o[k]
        if size[cur] == 0:
            continue  # an empty tensor occupies nothing, wherever it points
        if prev >= 0 and off[cur] < off[prev] + size[prev]:
            raise CorruptError(f"tensors {names[prev]!r} [{off[prev]}, {off[prev] + size[prev]}) and "
                               f"{names[cur]!r} [{off[cur]}, {off[cur] + size[cur]}) overlap")
        prev = cur


def names_strictly_sorted(const uint8_t[::1] blob, const int64_t[::1] starts, const uint16_t[::1] lens):
    """True when names are in strictly increasing byte order (so they are unique)."""
    cdef Py_ssize_t i, n = starts.shape[0]
    cdef int c
    cdef uint16_t la, lb
    cdef const uint8_t *p = &blob[0] if blob.shape[0] else NULL
    for i in range(1, n):
        la = lens[i - 1]
        lb = lens[i]
        c = memcmp(p + starts[i - 1], p + starts[i], la if la < lb else lb)
        if c > 0 or (c == 0 and la >= lb):
            return False
    return True
