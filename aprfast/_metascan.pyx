# cython: language_level=3, boundscheck=False, wraparound=False, freethreading_compatible=True
"""Guards in front of the metadata decoders: look before building anything.

Decoding a metadata block with ``json.loads`` or ``msgpack.unpackb`` can build far
more than the block's size: every one-byte empty MessagePack array becomes a
56-byte list, every three-byte ``[],`` of JSON a list too.  So before a decoder
sees a block, csrc/metascan.c walks it once without building objects (GIL
released, an explicit stack, nothing recursive) and

* refuses a top level that is not a map / JSON object at once (E002), from its
  first byte, whatever follows;
* refuses malformed blocks and nesting deeper than :data:`MAX_DEPTH` (E002);
* refuses a block whose decode would need more than ``max(METADATA_MEMORY_FACTOR * size,
  METADATA_MEMORY_FLOOR)`` (:mod:`aprfast.limits`) bytes of memory counting the block itself (E008).  The estimate
  is an upper bound of the decode's peak (the objects kept, the decoder's key
  cache, the largest transient buffer and, for JSON, the text it parses), modelled
  on CPython 3.9-3.13 (csrc/metascan.c lists the constants).

``METADATA_MEMORY_FLOOR`` (64 MiB) is what any block may use whatever its size: a
tokenizer vocabulary of a few hundred thousand short strings costs 60-80 bytes of
Python objects per token, 10-20 times its size in the block, and must still load.
Above 16 MiB the factor rules: a decode never holds more than 4 times its block.
Both are :mod:`aprfast.limits` constants a caller may raise for one process.

:func:`json_text` also builds the text ``json.loads`` parses, at most as wide as
it must be: characters wider than the cheapest width are written as ``\\uXXXX``
escapes (only strings can hold them; ``json.loads`` decodes them back to the same
characters), so one emoji in a large block does not make the whole text four
bytes per character.
"""

from libc.stdint cimport uint8_t, uint32_t, uint64_t

from . import limits
from .errors import CorruptError, LimitError

cdef extern from "Python.h":
    object PyUnicode_New(Py_ssize_t size, uint32_t maxchar)
    void *PyUnicode_DATA(object o)

cdef extern from "metascan.h" nogil:
    ctypedef struct apr_meta_scan:
        int status
        int top
        uint64_t estimate
        uint64_t error_at
        const char *error
        uint64_t values
        uint64_t max_depth_seen
        uint64_t text_length
        uint32_t text_maxchar
        int text_kind
    void apr_meta_scan_msgpack(const uint8_t *buf, size_t len, size_t max_depth, apr_meta_scan *out)
    void apr_meta_scan_json(const uint8_t *buf, size_t len, size_t max_depth, apr_meta_scan *out)
    int apr_meta_json_text(const uint8_t *buf, size_t len, const apr_meta_scan *scan, void *out,
                           uint64_t capacity)
    enum:
        APR_META_OK
        APR_META_NOT_MAP
        APR_META_INVALID
        APR_META_TOO_DEEP
        APR_META_NO_MEMORY

MiB = 1 << 20
#: Containers open at once (msgpack's own limit is 1024; json.loads recurses and
#: stops near the interpreter's recursion limit, 1000 by default).
MAX_DEPTH = 1024

# enum apr_meta_kind, as each format names it
_MSGPACK_KINDS = ("nothing", "map", "array", "str", "bin", "int", "float", "bool", "nil", "ext", "unknown byte")
_JSON_KINDS = ("nothing", "object", "array", "string", "bin", "number", "number", "boolean", "null", "ext",
               "unknown token")

# Releasing the GIL costs more than scanning a few KiB.
cdef size_t NOGIL_MIN = 65536


def budget(size: int) -> int:
    """Bytes a decode of a ``size``-byte block may need, the block itself excluded."""
    return max(limits.METADATA_MEMORY_FACTOR * size, limits.METADATA_MEMORY_FLOOR) - size


def _byte_view(data):
    view = memoryview(data)
    if view.nbytes == 0:
        return b""
    if view.format in ("B", "b", "c") and view.ndim == 1 and view.c_contiguous:
        return view if view.format == "B" else view.cast("B")
    return view.cast("B")  # ValueError for a buffer that is not C-contiguous


cdef int _scan(const uint8_t[::1] view, bint json, apr_meta_scan *res) except -1:
    cdef size_t n = view.shape[0]
    cdef const uint8_t *ptr = &view[0] if n else <const uint8_t *>b""
    cdef size_t depth = MAX_DEPTH
    if n < NOGIL_MIN:
        if json:
            apr_meta_scan_json(ptr, n, depth, res)
        else:
            apr_meta_scan_msgpack(ptr, n, depth, res)
    else:
        with nogil:
            if json:
                apr_meta_scan_json(ptr, n, depth, res)
            else:
                apr_meta_scan_msgpack(ptr, n, depth, res)
    if res.status == APR_META_NO_MEMORY:
        raise MemoryError("metadata scan: no memory for its stack")
    return 0


cdef _check(apr_meta_scan *res, size_t size, bint json, path):
    """Raise the typed error a scan calls for (nothing if the block may be decoded)."""
    names = _JSON_KINDS if json else _MSGPACK_KINDS
    fmt = "JSON" if json else "MessagePack"
    if res.status == APR_META_NOT_MAP:
        if json:
            raise CorruptError(f"metadata ({size} bytes) must be a JSON object, not a JSON {names[res.top]}",
                               path=path)
        raise CorruptError(f"metadata ({size} bytes) is a MessagePack {names[res.top]}, not a map", path=path)
    what = "UTF-8 JSON" if json else "MessagePack"
    if res.status == APR_META_INVALID:
        raise CorruptError(f"metadata ({size} bytes) is not valid {what}: {res.error.decode()} at byte "
                           f"{res.error_at}", path=path)
    if res.status == APR_META_TOO_DEEP:
        raise CorruptError(f"metadata ({size} bytes) nests more than {MAX_DEPTH} containers (at byte "
                           f"{res.error_at})", path=path)
    allowed = budget(size)
    if res.estimate > allowed:
        raise LimitError(f"metadata ({size} bytes of {fmt}, {res.values} values) would take about "
                         f"{res.estimate} bytes of memory to decode, above the {allowed} allowed "
                         f"(max({limits.METADATA_MEMORY_FACTOR} x its size, {limits.METADATA_MEMORY_FLOOR}) less "
                         "the block; aprfast.limits.METADATA_MEMORY_FACTOR / METADATA_MEMORY_FLOOR)", path=path)


def check_msgpack(data, path=None) -> None:
    """Refuse, typed, a MessagePack metadata block that ``msgpack.unpackb`` should not
    be given: not a map (E002), malformed (E002), nested too deep (E002), or costing
    more memory to decode than :func:`budget` allows (E008)."""
    cdef apr_meta_scan res
    view = _byte_view(data)
    _scan(view, False, &res)
    _check(&res, len(view), False, path)


def json_text(data, path=None) -> str:
    """The text ``json.loads`` should parse for a JSON metadata block, after refusing
    the block as :func:`check_msgpack` does (and invalid UTF-8, E002)."""
    cdef apr_meta_scan res
    cdef const uint8_t[::1] view = _byte_view(data)
    cdef size_t n = view.shape[0]
    cdef const uint8_t *ptr = &view[0] if n else <const uint8_t *>b""
    cdef void *out
    cdef int status
    _scan(view, True, &res)
    _check(&res, n, True, path)
    text = PyUnicode_New(<Py_ssize_t>res.text_length, res.text_maxchar)
    out = PyUnicode_DATA(text)
    if n < NOGIL_MIN:
        status = apr_meta_json_text(ptr, n, &res, out, res.text_length)
    else:
        with nogil:  # nobody else holds the new str yet
            status = apr_meta_json_text(ptr, n, &res, out, res.text_length)
    if status != 0:
        raise CorruptError(f"metadata ({n} bytes) changed while it was being read", path=path)
    return text


def scan(data, *, json: bool) -> dict:
    """What the scanner finds in a block, for tests and diagnostics: ``status``
    ("ok", "not a map", "invalid", "too deep"), ``top`` (the top-level kind),
    ``estimate`` (bytes; only for "ok"), ``values``, ``depth``, ``error``, ``error_at``
    and, for JSON, the text's ``text_kind`` and ``text_length``."""
    cdef apr_meta_scan res
    view = _byte_view(data)
    _scan(view, json, &res)
    names = _JSON_KINDS if json else _MSGPACK_KINDS
    status = ("ok", "not a map", "invalid", "too deep")[res.status]
    found = {"status": status, "top": names[res.top], "estimate": res.estimate, "values": res.values,
             "depth": res.max_depth_seen, "error": res.error.decode() if res.error != NULL else None,
             "error_at": res.error_at if status in ("invalid", "too deep") else None}
    if json:
        found["text_kind"] = res.text_kind
        found["text_length"] = res.text_length
    return found
