# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, freethreading_compatible=True
"""Binary tensor-index parsing and validation for both v2 layouts.

Both layouts store entries as ``u16 name_len | name | u8 dtype | u8 ndim |
ndim x u64 dims | u64 offset | u64 size`` and the spec layout appends ``u64 raw_size |
u32 flags``.  :func:`parse_index` makes one pass over the index bytes and checks each
entry completely (bounds, limits, UTF-8, name order, extent, size) before it looks at
the next, so the first bad or duplicate entry fails at once.  Nothing is copied out of
the index: :class:`Entries` keeps the bytes plus where every 16th entry starts (half a
byte per entry) and decodes names, shapes and extents only when asked.  Names are
strictly sorted in both layouts, so a name is found by binary search, without a dict.
"""

import numpy as np
from collections.abc import Mapping, Sequence

from cpython.buffer cimport PyBUF_ANY_CONTIGUOUS, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_SetItem
from cpython.list cimport PyList_GET_ITEM
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.memoryview cimport PyMemoryView_Check
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF
from cpython.unicode cimport PyUnicode_DecodeUTF8
cimport cython
from libc.stdint cimport int8_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

from .errors import CorruptError, LimitError, UnknownDTypeError, VersionError

cdef extern from *:
    """
    /* a dict with room for n entries from the start: no rehash while an eager load
       fills it (CPython's _PyDict_NewPresized, as Cython's own dict literals use) */
    #if CYTHON_COMPILING_IN_CPYTHON && !CYTHON_COMPILING_IN_LIMITED_API
    #define apr_dict_presized(n) ((n) <= 8 ? PyDict_New() : _PyDict_NewPresized(n))
    #else
    #define apr_dict_presized(n) PyDict_New()
    #endif
    """
    dict apr_dict_presized(Py_ssize_t n)
    PyObject *PyMemoryView_GET_BASE(object view)


# NumPy's C API, for tensors_in: an array per tensor without a Python call.  Built against
# NumPy 2's headers with NPY_TARGET_VERSION = 1.23 (setup.py), the module runs on NumPy
# 1.23 and later, as pyproject's dependency allows.  PyArray_NewFromDescr and
# PyArray_SetBaseObject are in the API table of every NumPy since 1.7.
cdef extern from "numpy/arrayobject.h":
    ctypedef Py_ssize_t npy_intp
    ctypedef struct PyArray_Descr:
        pass
    ctypedef struct PyArrayObject:
        pass
    int NPY_ARRAY_WRITEABLE
    # (the steals are handled by the caller: Py_INCREF before each call)
    object PyArray_NewFromDescr(PyTypeObject *subtype, PyArray_Descr *descr, int nd, const npy_intp *dims,
                                const npy_intp *strides, void *data, int flags, PyObject *obj)
    int PyArray_SetBaseObject(PyArrayObject *arr, PyObject *base) except -1
    PyTypeObject *ndarray_type "(&PyArray_Type)"
    int _import_array() except -1


try:
    _import_array()
except Exception as exc:  # an older NumPy than the headers target: the pure twins run (aprfast._backend)
    raise ImportError(f"aprfast._index: NumPy's C API did not load ({exc})") from exc


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

# Entries keep the start of every 2**MARK_SHIFT-th entry; the rest are found by skipping.
cdef enum:
    MARK_SHIFT = 4
    MARK_MASK = (1 << MARK_SHIFT) - 1

# No real file is this large; products beyond it are reported instead of wrapping.
# It also keeps every shape NumPy-representable: an array's bytes (counting only its
# non-zero dims, as NumPy does even for an empty array) must fit in an intp.
cdef uint64_t HUGE = (<uint64_t>1) << 62  # aprfast.dtypes.MAX_SHAPE_BYTES
# NPY_MAXDIMS of NumPy 2 (NumPy 1 has 32; arrays beyond it fail there with ValueError).
cdef int NUMPY_MAX_DIMS = 64
# Packed tensors dequantize to float32.
cdef uint64_t DEQUANTIZED_ITEMSIZE = 4
# APR2 per-tensor flags: the low nibble names a codec (aprfast.tensor_codecs: 1 LZ4,
# 2 zstd), every other bit is reserved; a compressed tensor stores at least its
# 8-byte block-table header.
cdef uint32_t CODEC_MASK = 0x0F
cdef uint32_t MAX_CODEC = 2
cdef uint64_t MIN_COMPRESSED = 8


cdef inline uint64_t le64(const uint8_t *p) noexcept nogil:
    return (<uint64_t>p[0] | (<uint64_t>p[1] << 8) | (<uint64_t>p[2] << 16) | (<uint64_t>p[3] << 24)
            | (<uint64_t>p[4] << 32) | (<uint64_t>p[5] << 40) | (<uint64_t>p[6] << 48) | (<uint64_t>p[7] << 56))


cdef inline uint32_t le32(const uint8_t *p) noexcept nogil:
    return <uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline uint16_t le16(const uint8_t *p) noexcept nogil:
    return <uint16_t>(p[0] | (p[1] << 8))


# --- one entry, at byte s of a validated index --------------------------------------
cdef inline Py_ssize_t name_len_at(const uint8_t *p, Py_ssize_t s) noexcept nogil:
    return le16(p + s)


cdef inline Py_ssize_t tail_at(const uint8_t *p, Py_ssize_t s) noexcept nogil:
    """Where the entry's u64 offset starts."""
    cdef Py_ssize_t nl = le16(p + s)
    return s + 4 + nl + 8 * <Py_ssize_t>p[s + 3 + nl]


cdef inline Py_ssize_t next_entry(const uint8_t *p, Py_ssize_t s, Py_ssize_t tail) noexcept nogil:
    return tail_at(p, s) + tail


cdef inline object name_at(const uint8_t *p, Py_ssize_t s):
    return PyUnicode_DecodeUTF8(<const char *>(p + s + 2), le16(p + s), NULL)


cdef inline tuple shape_at(const uint8_t *p, Py_ssize_t s):
    cdef Py_ssize_t nl = le16(p + s), d
    cdef Py_ssize_t nd = p[s + 3 + nl]
    cdef const uint8_t *dims = p + s + 4 + nl
    return tuple([le64(dims + 8 * d) for d in range(nd)])


cdef inline int compare_names(const uint8_t *a, Py_ssize_t la, const uint8_t *b, Py_ssize_t lb) noexcept nogil:
    """memcmp order, a shorter prefix first: the order of the names' UTF-8 bytes."""
    cdef int c = memcmp(a, b, la if la < lb else lb) if (la and lb) else 0
    if c:
        return c
    return (la > lb) - (la < lb)


cdef extern from "utf8.h" nogil:
    # -1 if valid UTF-8 (Python's strict decoder's rule), else the first bad offset;
    # the same rule csrc/metascan.c applies to metadata.
    Py_ssize_t apr_utf8_error(const uint8_t *p, size_t n)


cdef uint64_t expected_size(int rule, int64_t a, int64_t b, const uint8_t *dims, int nd,
                            bint *too_big) noexcept nogil:
    """Stored bytes of a tensor under ``rule`` (dims read little-endian from the index).

    ``too_big`` is set when the product of the non-zero dims, times the item size (of
    the float32 values a packed type dequantizes to), passes 2**62: no file holds that,
    and NumPy can't shape it even when another dim is 0."""
    cdef uint64_t count = 1, row, blocks, dim, item
    cdef int d
    cdef bint empty = False
    for d in range(nd):
        dim = le64(dims + 8 * d)
        if dim == 0:
            empty = True
        elif dim > HUGE or count > HUGE / dim:
            too_big[0] = True
            return 0
        else:
            count *= dim
    if rule == C_UNKNOWN:
        return 0
    item = <uint64_t>a if rule == C_FIXED else DEQUANTIZED_ITEMSIZE
    if item and count > HUGE / item:
        too_big[0] = True
        return 0
    if empty:
        return 0
    if rule == C_FIXED:
        return count * <uint64_t>a
    if rule == C_SCALE_PLUS_ONE:
        return <uint64_t>a + count
    if rule == C_FLAT_BLOCKS:
        blocks = (count + <uint64_t>a - 1) / <uint64_t>a
    else:  # C_ROW_BLOCKS: GGML blocks never straddle rows
        row = le64(dims + 8 * (nd - 1)) if nd > 0 else 1
        blocks = (count / row) * ((row + <uint64_t>a - 1) / <uint64_t>a)
    if b and blocks > HUGE / <uint64_t>b:
        too_big[0] = True
        return 0
    return blocks * <uint64_t>b


# --- parsing ------------------------------------------------------------------------
def parse_index(blob, Py_ssize_t count, bint spec_layout, int max_dims, int max_name_bytes,
                const int8_t[::1] rule, const int64_t[::1] rule_a, const int64_t[::1] rule_b,
                uint64_t data_len, bint strict_dtypes, uint64_t pad_to=1):
    """Parse and check ``count`` entries filling ``blob`` (a bytes-like object), each
    completely before the next; return the :class:`Entries` and where the data ends
    when every tensor is padded to ``pad_to`` bytes.

    Per entry, in order: the bytes it needs are present, its name and dims are within
    ``max_name_bytes`` / ``max_dims`` (LimitError), the name is UTF-8 and sorts strictly
    after the one before (so names are unique), per-tensor flags name a known codec or
    none (spec layout; VersionError) and ``raw_size`` is set exactly when one is named,
    the extent lies inside the ``data_len`` bytes of the data section, the dtype is
    known (UnknownDTypeError when ``strict_dtypes``) and its stored size (its
    ``raw_size`` when compressed) is what the shape needs.  Overlapping extents are
    checked last.  ``Entries.compressed`` counts the entries naming a codec.
    """
    cdef const uint8_t[::1] view = blob
    cdef Py_ssize_t end = view.shape[0]
    cdef Py_ssize_t tail = 16 + (12 if spec_layout else 0)
    cdef Py_ssize_t min_entry = 2 + 2 + tail
    if count < 0 or count > end // min_entry:
        raise CorruptError(f"tensor index holds {end} bytes, too few for the {count} "
                           f"entries the header declares (each takes at least {min_entry})")
    marks = np.empty((count + MARK_MASK) >> MARK_SHIFT, np.int64)
    cdef int64_t[::1] m = marks
    cdef const uint8_t *p = &view[0] if end else NULL
    cdef Py_ssize_t i, pos = 0, s, nl, nd, q, bad, prev_s = 0, prev_nl = 0, last_nonempty = -1, compressed = 0
    cdef uint64_t off, size, want, data_end = 0, stop, prev_end = 0, raw_size = 0
    cdef uint32_t codec = 0
    cdef bint too_big, monotonic = True
    cdef int r, t
    for i in range(count):
        s = pos
        if (i & MARK_MASK) == 0:
            m[i >> MARK_SHIFT] = s
        # -- the bytes are there, within the limits
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
        t = p[pos + 2 + nl]
        nd = p[pos + 3 + nl]
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
        bad = apr_utf8_error(p + s + 2, nl)
        if bad >= 0:
            _refuse_name_bytes(i, p, s)
        if i and compare_names(p + prev_s + 2, prev_nl, p + s + 2, nl) >= 0:
            _refuse_order(i, p, prev_s, s)
        prev_s, prev_nl = s, nl
        # -- stored as is, inside the data section, the size its shape needs
        off = le64(p + q)
        size = le64(p + q + 8)
        if spec_layout:
            raw_size, codec = le64(p + q + 16), le32(p + q + 24)
            if codec & ~CODEC_MASK or codec > MAX_CODEC:
                raise VersionError(f"tensor {name_at(p, s)!r}: per-tensor flags {codec:#x} name a codec or "
                                   "feature this build does not read (it knows 1 LZ4 and 2 zstd blocks)")
            if (codec == 0) != (raw_size == 0):
                raise CorruptError(f"tensor {name_at(p, s)!r}: raw_size {raw_size} with per-tensor flags "
                                   f"{codec:#x}; a compressed tensor needs both, a stored one neither")
            if codec and size < MIN_COMPRESSED:
                raise CorruptError(f"tensor {name_at(p, s)!r}: {size} stored bytes cannot hold a block table")
            compressed += codec != 0
        if off > data_len or size > data_len - off:
            raise CorruptError(f"tensor {name_at(p, s)!r}: {size} bytes at offset {off} of the data "
                               f"section lie outside its {data_len} bytes")
        r = rule[t]
        if r == C_UNKNOWN and strict_dtypes:
            raise UnknownDTypeError(f"tensor {name_at(p, s)!r}: unknown dtype id {t}")
        if r != C_UNKNOWN and nd > NUMPY_MAX_DIMS:
            raise LimitError(f"tensor {name_at(p, s)!r} has {nd} dims; NumPy arrays hold at most "
                             f"{NUMPY_MAX_DIMS}")
        too_big = False
        want = expected_size(r, rule_a[t], rule_b[t], p + s + 4 + nl, <int>nd, &too_big)
        if too_big:
            raise CorruptError(f"tensor {name_at(p, s)!r}: shape {list(shape_at(p, s))} declares more "
                               f"than 2**62 elements or bytes"
                               + (" (as the float32 values it dequantizes to)" if r > C_FIXED else ""))
        if r != C_UNKNOWN and want != (raw_size if codec else size):
            raise CorruptError(f"tensor {name_at(p, s)!r}: shape {list(shape_at(p, s))} needs {want} "
                               f"bytes but the index says {raw_size if codec else size}"
                               + (" (its raw_size)" if codec else ""))
        # -- where the data ends; do extents follow each other?
        stop = off + (size + pad_to - 1) // pad_to * pad_to  # no wrap: both are below data_len
        if stop > data_end:
            data_end = stop
        if size:  # an empty tensor occupies nothing, wherever it points
            if last_nonempty >= 0 and off < prev_end:
                monotonic = False
            last_nonempty = i
            prev_end = off + size
    entries = Entries(blob, count, spec_layout, marks)
    entries.compressed = compressed
    if not monotonic:
        _check_no_overlap(entries)
    return entries, data_end


cdef _refuse_name_bytes(Py_ssize_t i, const uint8_t *p, Py_ssize_t s):
    raw = (<const char *>(p + s + 2))[:le16(p + s)]
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        reason = exc.reason
    else:  # pragma: no cover - the validator is stricter than Python's decoder
        reason = "refused by the validator"
    raise CorruptError(f"tensor index entry {i}: name is not UTF-8 ({reason})")


cdef _refuse_order(Py_ssize_t i, const uint8_t *p, Py_ssize_t prev_s, Py_ssize_t s):
    """Both layouts keep the index sorted by name, strictly (so names are unique);
    aprender's reader refuses anything else too."""
    prev, cur = name_at(p, prev_s), name_at(p, s)
    what = "appears twice" if prev == cur else f"comes after {prev!r}"
    raise CorruptError(f"tensor index entry {i}: name {cur!r} {what}; names must be unique and sorted")


def _check_no_overlap(Entries entries):
    offsets, sizes = entries.extents()
    order = np.argsort(offsets, kind="stable")
    cdef const int64_t[::1] o = order
    cdef const uint64_t[::1] off = offsets
    cdef const uint64_t[::1] size = sizes
    cdef Py_ssize_t k, prev = -1, cur
    for k in range(o.shape[0]):
        cur = o[k]
        if size[cur] == 0:
            continue
        if prev >= 0 and off[cur] == off[prev] and size[cur] == size[prev]:
            continue  # one storage under two names (tied weights): shared, not overlapping
        if prev >= 0 and off[cur] < off[prev] + size[prev]:
            raise CorruptError(f"tensors {entries.name(prev)!r} ({size[prev]} bytes at offset {off[prev]}) "
                               f"and {entries.name(cur)!r} ({size[cur]} bytes at offset {off[cur]}) overlap")
        prev = cur


# --- arrays over a buffer, with NumPy's C API (tensors_in, views_at) -----------------------
cdef struct DTypes:
    PyArray_Descr *descr[256]  # borrowed from the caller's dict, which outlives the call
    Py_ssize_t itemsize[256]


cdef int dtype_table(dict dtypes, DTypes *t) except -1:
    cdef int k
    memset(t.descr, 0, sizeof(t.descr))
    for key, value in dtypes.items():
        k = key
        if 0 <= k < 256 and isinstance(value, np.dtype):
            t.descr[k] = <PyArray_Descr *>value
            t.itemsize[k] = (<object>value).itemsize
    return 0


cdef struct Region:
    char *data
    Py_ssize_t length
    int flags            # NPY_ARRAY_WRITEABLE or 0
    PyObject *owner      # the arrays' base (borrowed: the buffer, or what its memoryview views)


cdef int region_of(object buffer, Region *r) except -1:
    """The memory of ``buffer``, whether it may be written and the arrays' base, as
    np.ndarray(buffer=...) finds them (NumPy's PyArray_BufferConverter): the export is
    released at once, and the object providing it (a memoryview's underlying object) is
    the base that keeps the memory alive."""
    cdef Py_buffer view
    r.flags = NPY_ARRAY_WRITEABLE
    try:
        PyObject_GetBuffer(buffer, &view, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
    except Exception:
        r.flags = 0
        PyObject_GetBuffer(buffer, &view, PyBUF_ANY_CONTIGUOUS)
    r.data = <char *>view.buf
    r.length = view.len
    PyBuffer_Release(&view)
    r.owner = <PyObject *>buffer
    if PyMemoryView_Check(buffer) and PyMemoryView_GET_BASE(buffer) != NULL:
        r.owner = PyMemoryView_GET_BASE(buffer)
    return 0


cdef object tensor_at(const uint8_t *p, Py_ssize_t s, int64_t start, uint64_t size, Region *r, object buffer,
                      DTypes *t, object make_one):
    """The tensor of the entry at byte ``s``, its bytes at byte ``start`` of the region:
    an array made by NumPy's C API for a plain dtype inside the region, else
    ``make_one(type_id, shape, buffer, start, size)`` (which refuses what np.ndarray
    refuses)."""
    cdef Py_ssize_t nl = name_len_at(p, s), d
    cdef int type_id = p[s + 2 + nl], nd = p[s + 3 + nl]
    cdef const uint8_t *dims = p + s + 4 + nl
    cdef npy_intp shape[64]  # NUMPY_MAX_DIMS: parse_index refuses more for known dtypes
    cdef uint64_t need, dim
    # (memory at NULL, an empty buffer's, would make NumPy allocate an array of its own)
    if t.descr[type_id] != NULL and nd <= NUMPY_MAX_DIMS and r.data != NULL and 0 <= start <= r.length:
        need = <uint64_t>t.itemsize[type_id]
        for d in range(nd):
            dim = le64(dims + 8 * d)
            shape[d] = <npy_intp>dim
            if need and dim and need > HUGE / dim:
                need = HUGE  # past any buffer: make_one reports it as np.ndarray does
            else:
                need *= dim
        if need <= <uint64_t>(r.length - start):
            Py_INCREF(<object>t.descr[type_id])  # PyArray_NewFromDescr steals it
            array = PyArray_NewFromDescr(ndarray_type, t.descr[type_id], nd, shape, NULL, r.data + start, r.flags,
                                         NULL)
            Py_INCREF(<object>r.owner)  # PyArray_SetBaseObject steals it
            PyArray_SetBaseObject(<PyArrayObject *>array, r.owner)
            return array
    return make_one(type_id, shape_at(p, s), buffer, start, size)


# --- reading a parsed index ------------------------------------------------------------
cdef class Entries:
    """A checked index: its bytes, and where every 16th entry starts.

    ``name(i)``, ``shape(i)``, ``row(i, data_start)``, ... decode one entry on demand;
    ``find(name)`` is a binary search over the (strictly sorted) names.
    """

    cdef readonly object blob
    cdef readonly Py_ssize_t count
    cdef readonly bint spec_layout
    #: how many entries name a codec (APR2 per-tensor compression)
    cdef public Py_ssize_t compressed
    cdef object _marks_array
    cdef const uint8_t[::1] _view
    cdef const int64_t[::1] _marks
    cdef const uint8_t *_p
    cdef Py_ssize_t _tail

    def __cinit__(self, blob, Py_ssize_t count, bint spec_layout, marks):
        self.blob = blob
        self._view = blob
        self._p = &self._view[0] if self._view.shape[0] else NULL
        self.count = count
        self.spec_layout = spec_layout
        self._marks_array = marks
        self._marks = marks
        self._tail = 16 + (12 if spec_layout else 0)

    def __len__(self):
        return self.count

    cdef inline Py_ssize_t start(self, Py_ssize_t i) except -1:
        cdef Py_ssize_t s, k
        if i < 0 or i >= self.count:
            raise IndexError(f"tensor index entry {i} of {self.count}")
        s = self._marks[i >> MARK_SHIFT]
        for k in range(i & MARK_MASK):
            s = next_entry(self._p, s, self._tail)
        return s

    def name(self, Py_ssize_t i):
        return name_at(self._p, self.start(i))

    def names(self):
        """Every name, in index order (a new list of new str objects)."""
        cdef Py_ssize_t i, s = 0
        out = [None] * self.count
        for i in range(self.count):
            out[i] = name_at(self._p, s)
            s = next_entry(self._p, s, self._tail)
        return out

    def shape(self, Py_ssize_t i):
        return shape_at(self._p, self.start(i))

    def dtype_id(self, Py_ssize_t i):
        cdef Py_ssize_t s = self.start(i)
        return self._p[s + 2 + name_len_at(self._p, s)]

    def offset(self, Py_ssize_t i):
        """Offset of the tensor in the data section."""
        return le64(self._p + tail_at(self._p, self.start(i)))

    def size(self, Py_ssize_t i):
        return le64(self._p + tail_at(self._p, self.start(i)) + 8)

    def raw_size(self, Py_ssize_t i):
        return le64(self._p + tail_at(self._p, self.start(i)) + 16) if self.spec_layout else 0

    def flags(self, Py_ssize_t i):
        return le32(self._p + tail_at(self._p, self.start(i)) + 24) if self.spec_layout else 0

    def compressed_positions(self):
        """Positions of the entries that name a codec, in index order."""
        cdef Py_ssize_t i, s = 0, q
        out = []
        if not self.compressed:
            return out
        for i in range(self.count):
            q = tail_at(self._p, s)
            if le32(self._p + q + 24):
                out.append(i)
            s = q + self._tail
        return out

    def row(self, Py_ssize_t i, int64_t data_start):
        """``(dtype_id, absolute offset, size, shape)`` of entry ``i``."""
        return self._row(self.start(i), data_start)

    cdef tuple _row(self, Py_ssize_t s, int64_t data_start):
        cdef Py_ssize_t q = tail_at(self._p, s)
        return (self._p[s + 2 + name_len_at(self._p, s)], data_start + <int64_t>le64(self._p + q),
                le64(self._p + q + 8), shape_at(self._p, s))

    def rows(self, int64_t data_start):
        """Every entry's :meth:`row`, in index order."""
        cdef Py_ssize_t i, s = 0
        out = [None] * self.count
        for i in range(self.count):
            out[i] = self._row(s, data_start)
            s = next_entry(self._p, s, self._tail)
        return out

    def tensors_in(self, int64_t data_start, object buffer, int64_t base, dict dtypes, object make_one):
        """``{name: tensor}`` for every entry, in index order, viewing ``buffer`` (which
        holds file byte ``base`` at its byte 0): what an eager load returns.

        Tensors of a dtype id in ``dtypes`` (id -> NumPy dtype of plain elements) are
        made here, each with one call of NumPy's C API (``PyArray_NewFromDescr`` on the
        buffer's memory, the entry's dims read straight from the index, C-order strides
        filled by NumPy): no Python object but the array, its name and the dict slot
        per tensor (about 30 ns for the array where ``np.ndarray(...)`` took about
        1 us).  Every array has one base, ``buffer`` (of a memoryview, the object it
        views), keeping the memory alive, and is writable exactly when ``buffer``
        exports a writable buffer: what ``np.ndarray(shape, dtype, buffer, offset)``
        makes.  Other dtype ids, and an extent outside the buffer (which
        ``np.ndarray`` would refuse), go through ``make_one(type_id, shape, buffer,
        start, size)``, one by one.
        """
        cdef Py_ssize_t i, s = 0, q, n = self.count
        cdef const uint8_t *p = self._p
        cdef DTypes table
        cdef Region region
        dtype_table(dtypes, &table)
        region_of(buffer, &region)
        cdef dict out = apr_dict_presized(n)
        for i in range(n):
            q = tail_at(p, s)
            PyDict_SetItem(out, name_at(p, s),
                           tensor_at(p, s, <int64_t>le64(p + q) + data_start - base, le64(p + q + 8), &region, buffer,
                                     &table, make_one))
            s = q + self._tail
        return out

    def locate(self, names):
        """Where the tensors called ``names`` (a list) are: three int64 arrays, each
        name's position in the index (-1 for a name the index lacks), its offset in the
        data section and its stored size (0 and 0 when missing), found by binary search
        in C (get_tensors' first step)."""
        cdef list wanted = names
        cdef Py_ssize_t k, i, q, n = len(wanted)
        positions = np.empty(n, np.int64)
        offsets = np.zeros(n, np.int64)
        sizes = np.zeros(n, np.int64)
        cdef int64_t[::1] pos = positions
        cdef int64_t[::1] off = offsets
        cdef int64_t[::1] size = sizes
        for k in range(n):
            i = self.find(<object>PyList_GET_ITEM(wanted, k))
            pos[k] = i
            if i >= 0:
                q = tail_at(self._p, self.start(i))
                off[k] = <int64_t>le64(self._p + q)
                size[k] = <int64_t>le64(self._p + q + 8)
        return positions, offsets, sizes

    def views_at(self, const int64_t[::1] positions, const int64_t[::1] starts, const int64_t[::1] region,
                 list buffers, dict dtypes, object make_one):
        """A list of tensors, the k-th entry ``positions[k]`` viewing ``buffers[region[k]]``
        from its byte ``starts[k]``: made as :meth:`tensors_in` makes them (NumPy's C
        API, each buffer's export looked at once), for get_tensors' batched reads."""
        cdef Py_ssize_t k, s, q, b, n = positions.shape[0], nb = len(buffers)
        if starts.shape[0] != n or region.shape[0] != n:
            raise ValueError("positions, starts and region differ in length")
        cdef const uint8_t *p = self._p
        cdef DTypes table
        dtype_table(dtypes, &table)
        cdef Region *regions = <Region *>PyMem_Malloc(max(nb, 1) * sizeof(Region))
        if regions == NULL:
            raise MemoryError()
        cdef list out = [None] * n
        try:
            for b in range(nb):
                region_of(<object>PyList_GET_ITEM(buffers, b), &regions[b])
            for k in range(n):
                b = region[k]
                if b < 0 or b >= nb:
                    raise IndexError(f"region {b} of {nb} buffers")
                s = self.start(positions[k])
                q = tail_at(p, s)
                out[k] = tensor_at(p, s, starts[k], le64(p + q + 8), &regions[b],
                                   <object>PyList_GET_ITEM(buffers, b), &table, make_one)
        finally:
            PyMem_Free(regions)
        return out

    def describe(self, int64_t data_start, list dtype_names):
        """``{name: {"dtype", "shape", "offset", "nbytes"}}`` for every entry in index
        order (what ``aprfast.inspect`` reports), built in one pass; ``dtype_names`` maps
        each id 0-255 to its name."""
        cdef Py_ssize_t i, s = 0, q, nl, nd, d
        cdef const uint8_t *dims
        out = {}
        for i in range(self.count):
            q = tail_at(self._p, s)
            nl = name_len_at(self._p, s)
            nd = self._p[s + 3 + nl]
            dims = self._p + s + 4 + nl
            out[name_at(self._p, s)] = {
                "dtype": dtype_names[self._p[s + 2 + nl]],
                "shape": [le64(dims + 8 * d) for d in range(nd)],
                "offset": data_start + <int64_t>le64(self._p + q),
                "nbytes": le64(self._p + q + 8),
            }
            if self.spec_layout and le32(self._p + q + 24):  # compressed: what it inflates to, and how
                out[name_at(self._p, s)].update(raw_size=le64(self._p + q + 16), flags=le32(self._p + q + 24))
            s = q + self._tail
        return out

    def extents(self):
        """Two uint64 arrays: every tensor's offset in the data section, and its size."""
        offsets = np.empty(self.count, np.uint64)
        sizes = np.empty(self.count, np.uint64)
        cdef uint64_t[::1] o = offsets
        cdef uint64_t[::1] z = sizes
        cdef Py_ssize_t i, s = 0, q
        for i in range(self.count):
            q = tail_at(self._p, s)
            o[i] = le64(self._p + q)
            z[i] = le64(self._p + q + 8)
            s = q + self._tail
        return offsets, sizes

    def find(self, name):
        """The position of the tensor called ``name`` (a str), or -1."""
        cdef bytes key
        if not isinstance(name, str) or not self.count:
            return -1
        try:
            key = (<str>name).encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: no UTF-8 name can equal it
            return -1
        cdef const uint8_t *k = <const uint8_t *><const char *>key
        cdef Py_ssize_t kl = len(key), lo = 0, hi = (self.count + MARK_MASK) >> MARK_SHIFT, mid, s, i, stop
        cdef const uint8_t *p = self._p
        cdef int c
        # the last mark whose name is <= key, then at most 15 entries after it
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            s = self._marks[mid]
            if compare_names(p + s + 2, le16(p + s), k, kl) <= 0:
                lo = mid
            else:
                hi = mid
        i = lo << MARK_SHIFT
        stop = min(i + MARK_MASK + 1, self.count)
        s = self._marks[lo]
        while i < stop:
            c = compare_names(p + s + 2, le16(p + s), k, kl)
            if c == 0:
                return i
            if c > 0:
                return -1
            s = next_entry(p, s, self._tail)
            i += 1
        return -1


cdef class Names:
    """The names of an index as a read-only sequence, in index order; each str is
    decoded when asked for (``list(names)`` decodes them all)."""

    cdef readonly Entries entries

    def __cinit__(self, Entries entries):
        self.entries = entries

    def __len__(self):
        return self.entries.count

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self.entries.name(i) for i in range(*index.indices(self.entries.count))]
        cdef Py_ssize_t i = index
        if i < 0:
            i += self.entries.count
        if i < 0 or i >= self.entries.count:
            raise IndexError("tensor name index out of range")
        return self.entries.name(i)

    def __iter__(self):
        return _NameIter(self.entries)

    def __contains__(self, name):
        return self.entries.find(name) >= 0

    def index(self, name, *args):
        cdef Py_ssize_t i = self.entries.find(name)
        if i < 0:
            raise ValueError(f"{name!r} is not in the tensor index")
        return i

    def count(self, name):
        return 1 if self.entries.find(name) >= 0 else 0

    def __reversed__(self):
        return reversed(self.entries.names())

    def __eq__(self, other):
        if isinstance(other, Names):
            return self.entries.names() == (<Names>other).entries.names()
        if isinstance(other, (list, tuple)):
            return self.entries.names() == list(other)
        return NotImplemented

    def __repr__(self):
        return f"<aprfast tensor names: {self.entries.count}>"


cdef class _NameIter:
    cdef Entries entries
    cdef Py_ssize_t i, s

    def __cinit__(self, Entries entries):
        self.entries = entries
        self.i = 0
        self.s = 0

    def __iter__(self):
        return self

    def __length_hint__(self):
        return self.entries.count - self.i

    def __next__(self):
        # One iterator shared by threads without the GIL: the count and the offset move
        # together, or a second thread could read the entry after the last one.
        with cython.critical_section(self):
            if self.i >= self.entries.count:
                raise StopIteration
            name = name_at(self.entries._p, self.s)
            self.s = next_entry(self.entries._p, self.s, self.entries._tail)
            self.i += 1
            return name


cdef class Positions:
    """``{name: position in the index}`` as a read-only mapping, answered by binary
    search over the index bytes (no dict, no str per name)."""

    cdef readonly Entries entries

    def __cinit__(self, Entries entries):
        self.entries = entries

    def __len__(self):
        return self.entries.count

    def __contains__(self, name):
        return self.entries.find(name) >= 0

    def __getitem__(self, name):
        cdef Py_ssize_t i = self.entries.find(name)
        if i < 0:
            raise KeyError(name)
        return i

    def get(self, name, default=None):
        cdef Py_ssize_t i = self.entries.find(name)
        return default if i < 0 else i

    def __iter__(self):
        return _NameIter(self.entries)

    def keys(self):
        return Names(self.entries)

    def values(self):
        return range(self.entries.count)

    def items(self):
        return zip(_NameIter(self.entries), range(self.entries.count))

    def __eq__(self, other):
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    def __repr__(self):
        return f"<aprfast tensor positions: {self.entries.count}>"


Sequence.register(Names)
Mapping.register(Positions)


# --- writing ----------------------------------------------------------------------
def encode_entries(list tensors, list offsets, dict id_of, bint spec_layout, bint codecs=False):
    """Index entries for writer inputs (name, dtype, shape, nbytes) at ``offsets`` in
    the data section; ``id_of`` maps each DType to this layout's id.  With ``codecs``
    (spec layout) an input's ``raw_size`` and ``flags`` attributes, where it has them,
    fill the entry's last two fields."""
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
        if codecs and spec_layout:
            put_le(&o[pos + 16], getattr(item, "raw_size", 0), 8)
            put_le(&o[pos + 24], getattr(item, "flags", 0), 4)
        pos += tail  # otherwise the spec layout's raw_size 0 and flags 0 are already zero
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
