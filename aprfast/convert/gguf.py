"""GGUF (llama.cpp) in and out, one tensor at a time.

Reading parses GGUF v2/v3 here (gguf-py is only the test oracle).  GGUF's hostile-file
history (dimension products that overflow, array lengths of 2**64, offsets past the end)
is why every count, length, dimension and offset is checked against the bytes left in
the file before anything is allocated, and why what the metadata becomes is bounded
before it is built: the number of values, of arrays inside arrays, and the estimated
memory of the Python objects, relative to the file's size (a numeric array is read as
one NumPy array and becomes a list only once its estimate fits).

Dimension order: GGUF lists ``ne[0]`` first, the innermost (row) length; aprfast
shapes are NumPy's, outermost first, so ``shape = reversed(ne)`` both ways.  GGML
blocks never span rows, exactly aprfast's per-row packed types, so quantized tensors
are kept as their blocks, byte for byte.
"""

from __future__ import annotations

import json
import math
import os
import struct

import numpy as np

from .. import dtypes as _dtypes
from ..errors import CorruptError, FormatError, LayoutError, LimitError, UnknownDTypeError, VersionError, os_error
from ..io import platform as _platform
from ..io.atomic import AtomicFile
from ..limits import MAX_METADATA_SIZE, MAX_TENSOR_COUNT
from ._common import DeclaredWriter, Spec, TensorFileSource, check_shape_bytes, copy_range, reserve
from .safetensors import _write_all, tensor_bytes

__all__ = ["GGUFSource", "GGUFWriter", "GGML_TYPES", "MAX_METADATA_VALUES", "MAX_METADATA_ARRAYS",
           "MAX_METADATA_MEMORY", "metadata_budget", "apr_metadata", "gguf_metadata", "q8_tensor_header"]

MAGIC = b"GGUF"
#: GGML type id -> aprfast dtype name: every type gguf-py's GGMLQuantizationType (0.19)
#: names.  Ids 4, 5 (the removed Q4_2/Q4_3) and 31-33, 36-38 (removed Q4_0_4_4 and
#: friends, IQ4_NL_x_x) are not types any more; a file using them, or a newer type, is
#: refused naming the id and the tensor (GGUF records no byte size a reader could skip by).
GGML_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
              10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
              17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
              24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0",
              35: "TQ2_0", 39: "MXFP4", 40: "NVFP4", 41: "Q1_0"}
_GGML_IDS = {name: i for i, name in GGML_TYPES.items()}

# Metadata value types (gguf.h's gguf_type).
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
           U64: "<Q", I64: "<q", F64: "<d"}
_TYPE_NAMES = {U8: "U8", I8: "I8", U16: "U16", I16: "I16", U32: "U32", I32: "I32", F32: "F32", BOOL: "BOOL",
               STRING: "STRING", ARRAY: "ARRAY", U64: "U64", I64: "I64", F64: "F64"}
_BY_TYPE_NAME = {v: k for k, v in _TYPE_NAMES.items()}

DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 20
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_KEY_BYTES = 65535
MAX_NESTING = 8
#: Every metadata value (array elements included) becomes a Python object in .apr
#: metadata; this bounds the memory a small hostile file can demand.  Real vocabularies
#: (tokens, scores, types, merges) are a few million values at most.
MAX_METADATA_VALUES = 16_000_000
#: Arrays inside arrays, in all: each is a list of its own (56 bytes for 12 bytes of
#: file when empty), and llama.cpp's own reader accepts none.
MAX_METADATA_ARRAYS = 1 << 18
#: The Python objects the metadata becomes (estimated from CPython's sizes before they
#: are built) may take at most max(METADATA_MEMORY_FACTOR x the file's size,
#: METADATA_MEMORY_FLOOR) bytes (:mod:`aprfast.limits`, as for .apr metadata), and
#: never more than this.
MAX_METADATA_MEMORY = 1 << 30
#: .apr metadata keys this module adds: the GGUF value type of each key, so a round
#: trip back to GGUF keeps u32 as u32 and f32 as f32.
TYPES_KEY = "gguf.kv_types"
VERSION_KEY = "gguf.version"
#: The GGUF's keys in file order (.apr metadata is written sorted), so a GGUF -> .apr ->
#: GGUF round trip gives the same bytes.
ORDER_KEY = "gguf.kv_order"
#: One metadata string may not exceed what .apr metadata may hold in all.
MAX_STRING_BYTES = MAX_METADATA_SIZE
_MIN_TENSOR_INFO = 8 + 4 + 4 + 8
_MIN_KV = 8 + 4 + 1


class _Cursor:
    """Sequential reads over a file through a window, every length checked against the
    bytes left before it is read or allocated."""

    WINDOW = 1 << 20

    def __init__(self, fd: int, size: int, path):
        self.fd, self.size, self.path = fd, size, path
        self.pos, self._buf, self._buf_at = 0, b"", 0

    @property
    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.left:
            raise CorruptError(f"{what} needs {n} bytes at offset {self.pos}, but the file has {self.left} left",
                               path=self.path)

    def take(self, n: int, what: str) -> bytes:
        self.need(n, what)
        start = self.pos - self._buf_at
        if start < 0 or start + n > len(self._buf):
            try:
                self._buf = _platform.pread(self.fd, max(n, self.WINDOW), self.pos)
            except OSError as exc:
                raise os_error(exc, f"cannot read {what}", path=self.path) from exc
            self._buf_at, start = self.pos, 0
            if len(self._buf) < n:
                raise CorruptError(f"file shrank while reading {what}", path=self.path)
        self.pos += n
        return self._buf[start:start + n]

    def scalar(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str, limit=None) -> str:
        n = self.scalar("<Q", f"length of {what}")
        if limit is not None and n > limit:
            raise LimitError(f"{what} is {n} bytes long, more than {limit}", path=self.path)
        data = self.take(n, what)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptError(f"{what} is not UTF-8 ({exc.reason} at byte {exc.start})", path=self.path) from None


# Estimated CPython bytes of what a metadata value becomes: a list slot, an int outside
# the small-int cache, a float (float arrays are copied once more by _json_safe: one
# slot more), a non-empty str's header (up to ~80 for non-ASCII text), a list.
_SLOT, _INT, _FLOAT, _STR, _LIST = 8, 32, 24, 80, 56
#: A key's entries (gguf_metadata, gguf_types and the .apr metadata dicts).
_KEY_ENTRIES = 3 * 48
#: Per element of a numeric array, its slot included (u8 and bool values are cached).
_ELEMENT = {U8: _SLOT, BOOL: _SLOT, I8: _SLOT + _INT, U16: _SLOT + _INT, I16: _SLOT + _INT, U32: _SLOT + _INT,
            I32: _SLOT + _INT, U64: _SLOT + _INT, I64: _SLOT + _INT, F32: 2 * _SLOT + _FLOAT,
            F64: 2 * _SLOT + _FLOAT}


def metadata_budget(file_size: int) -> int:
    """Bytes the metadata of a ``file_size``-byte GGUF may become as Python objects:
    ``min(MAX_METADATA_MEMORY, max(METADATA_MEMORY_FACTOR * file_size, METADATA_MEMORY_FLOOR))``."""
    from .. import limits

    return min(MAX_METADATA_MEMORY, max(limits.METADATA_MEMORY_FACTOR * file_size, limits.METADATA_MEMORY_FLOOR))


class _Budget:
    """What the metadata may still build: values (MAX_METADATA_VALUES), nested arrays
    (MAX_METADATA_ARRAYS) and estimated bytes (:func:`metadata_budget`), each charged
    before the objects are made."""

    def __init__(self, path, file_size: int = 0):
        self.left, self.path = MAX_METADATA_VALUES, path
        self.memory, self.spent, self.arrays = metadata_budget(file_size), 0, 0

    def spend(self, n: int, key: str, nbytes: int = 0) -> None:
        self.left -= n
        if self.left < 0:
            raise LimitError(f"metadata key {key!r} takes the file past {MAX_METADATA_VALUES} metadata values "
                             "(aprfast.convert.gguf.MAX_METADATA_VALUES)", path=self.path)
        self.spent += nbytes
        if self.spent > self.memory:
            raise LimitError(f"metadata key {key!r} takes the file's metadata past about {self.memory} bytes of "
                             "Python objects (max(aprfast.limits.METADATA_MEMORY_FACTOR x the file's size, "
                             "METADATA_MEMORY_FLOOR), at most aprfast.convert.gguf.MAX_METADATA_MEMORY)",
                             path=self.path)

    def nested(self, key: str) -> None:
        self.arrays += 1
        if self.arrays > MAX_METADATA_ARRAYS:
            raise LimitError(f"metadata key {key!r} takes the file past {MAX_METADATA_ARRAYS} arrays inside arrays "
                             "(aprfast.convert.gguf.MAX_METADATA_ARRAYS)", path=self.path)


def _string_cost(text: str) -> int:
    return _STR + len(text) if text else 0  # "" is a shared object


def _read_value(cur: _Cursor, vtype: int, key: str, budget: _Budget, depth: int = 0):
    """One value and its type description ("U32", ["ARRAY", "STRING"], ...)."""
    if vtype in _SCALAR:
        budget.spend(1, key, _SLOT + _INT)
        value = cur.scalar(_SCALAR[vtype], f"value of {key!r}")
        return (float(value) if vtype in (F32, F64) else value), _TYPE_NAMES[vtype]
    if vtype == STRING:
        budget.spend(1, key, _SLOT)
        text = cur.string(f"string value of {key!r}", MAX_STRING_BYTES)
        budget.spend(0, key, _string_cost(text))
        return text, "STRING"
    if vtype == ARRAY:
        return _read_array(cur, key, budget, depth)
    raise CorruptError(f"metadata key {key!r} has value type {vtype}, which GGUF does not define", path=cur.path)


def _read_array(cur: _Cursor, key: str, budget: _Budget, depth: int):
    """An array's values as a list, charged to ``budget`` before any is made: a numeric
    array is read as one NumPy array (no Python object per element while it is read and
    checked) and becomes a list only once its estimated cost fits."""
    if depth >= MAX_NESTING:
        raise LimitError(f"metadata key {key!r} nests arrays more than {MAX_NESTING} deep", path=cur.path)
    if depth:
        budget.nested(key)
    etype = cur.scalar("<I", f"array type of {key!r}")
    count = cur.scalar("<Q", f"array length of {key!r}")
    # The smallest element of each type bounds how many can fit in what is left.
    least = struct.calcsize(_SCALAR[etype]) if etype in _SCALAR else 8 if etype == STRING else 12
    if etype not in _SCALAR and etype not in (STRING, ARRAY):
        raise CorruptError(f"metadata key {key!r} is an array of type {etype}, which GGUF does not define",
                           path=cur.path)
    cur.need(count * least, f"array {key!r} of {count} elements")
    if etype in _SCALAR:
        budget.spend(count, key, _LIST + count * _ELEMENT[etype])
        fmt = _SCALAR[etype]
        values = np.frombuffer(cur.take(count * least, f"array {key!r}"), np.dtype(fmt)).tolist()
        return values, ["ARRAY", _TYPE_NAMES[etype]]
    budget.spend(count, key, _LIST + count * _SLOT)
    items, inner = [], _TYPE_NAMES[etype]
    for _ in range(count):
        if etype == STRING:
            text = cur.string(f"string in array {key!r}", MAX_STRING_BYTES)
            budget.spend(0, key, _string_cost(text))
            items.append(text)
        else:
            value, inner = _read_array(cur, key, budget, depth + 1)
            items.append(value)
    return items, ["ARRAY", inner]


class GGUFSource(TensorFileSource):
    """One GGUF v2/v3 file as a tensor stream.  ``gguf_metadata`` holds the raw key ->
    value pairs, ``gguf_types`` each key's value type, ``metadata`` the .apr mapping."""

    kind = "GGUF"

    def _parse(self) -> None:
        size = os.fstat(self._fd).st_size
        cur = _Cursor(self._fd, size, self.path)
        if cur.take(4, "magic") != MAGIC:
            raise FormatError("not a GGUF file (no GGUF magic)", path=self.path)
        version = cur.scalar("<I", "version")
        if version not in (2, 3):
            swapped = struct.unpack("<I", struct.pack(">I", version))[0]
            detail = " (a big-endian GGUF, which aprfast does not read)" if swapped in (2, 3) else ""
            raise VersionError(f"GGUF version {version} is not supported (2 and 3 are){detail}", path=self.path)
        self.version = version
        n_tensors = cur.scalar("<Q", "tensor count")
        n_kv = cur.scalar("<Q", "metadata count")
        if n_tensors > MAX_TENSOR_COUNT:
            raise LimitError(f"GGUF declares {n_tensors} tensors, more than {MAX_TENSOR_COUNT}", path=self.path)
        cur.need(n_kv * _MIN_KV + n_tensors * _MIN_TENSOR_INFO, f"{n_kv} metadata pairs and {n_tensors} tensor infos")
        self._read_kv(cur, n_kv)
        alignment = self._alignment()
        infos = [self._read_info(cur, i) for i in range(n_tensors)]
        self._data_start = -(-cur.pos // alignment) * alignment
        self._check_offsets(infos, alignment, size)
        infos.sort(key=lambda t: t[1])
        self.specs = [spec for spec, _ in infos]
        self._offsets = {spec.name: offset for spec, offset in infos}
        self.metadata = apr_metadata(self.gguf_metadata, self.gguf_types, version)

    def _read_kv(self, cur: _Cursor, n_kv: int) -> None:
        self.gguf_metadata, self.gguf_types, budget = {}, {}, _Budget(self.path, cur.size)
        for _ in range(n_kv):
            key = cur.string("metadata key", MAX_KEY_BYTES)
            if key in self.gguf_metadata:
                raise CorruptError(f"metadata key {key!r} appears twice", path=self.path)
            budget.spend(0, key, _KEY_ENTRIES + _string_cost(key))
            vtype = cur.scalar("<I", f"value type of {key!r}")
            self.gguf_metadata[key], self.gguf_types[key] = _read_value(cur, vtype, key, budget)

    def _alignment(self) -> int:
        if "general.alignment" not in self.gguf_metadata:
            return DEFAULT_ALIGNMENT
        value = self.gguf_metadata["general.alignment"]
        if (self.gguf_types["general.alignment"] != "U32" or value == 0 or value & (value - 1)
                or value > MAX_ALIGNMENT):
            raise CorruptError(f"general.alignment {value!r} must be a u32 power of two up to {MAX_ALIGNMENT}",
                               path=self.path)
        return value

    def _read_info(self, cur: _Cursor, i: int):
        name = cur.string(f"name of tensor {i}", MAX_KEY_BYTES)
        n_dims = cur.scalar("<I", f"dimension count of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise CorruptError(f"tensor {name!r} has {n_dims} dimensions; GGUF allows 1 to {MAX_DIMS}", path=self.path)
        ne = struct.unpack(f"<{n_dims}Q", cur.take(8 * n_dims, f"dimensions of {name!r}"))
        type_id = cur.scalar("<I", f"type of {name!r}")
        offset = cur.scalar("<Q", f"data offset of {name!r}")
        if type_id not in GGML_TYPES:
            # GGUF gives no byte size, only the type: a tensor of a type aprfast does not
            # know cannot even be stepped over, so the file is refused.
            raise UnknownDTypeError(f"tensor {name!r} has GGML type id {type_id}, which aprfast does not know "
                                    f"(it reads ids {', '.join(map(str, sorted(GGML_TYPES)))}); GGUF records no "
                                    "byte size, so the tensor cannot be kept as raw bytes", path=self.path)
        dtype = _dtypes.by_name(GGML_TYPES[type_id])
        shape = tuple(reversed(ne))
        check_shape_bytes(name, dtype, shape, self.path)  # refuses products past 2**62 before any use
        if dtype.packed and ne[0] % dtype.block_elems:
            raise CorruptError(f"tensor {name!r}: {dtype.name} rows (ne[0] = {ne[0]}) must be a multiple of "
                               f"{dtype.block_elems}", path=self.path)
        return Spec(name, dtype, shape), offset

    def _check_offsets(self, infos, alignment: int, size: int) -> None:
        data_size = size - self._data_start
        seen, end = set(), 0
        for spec, offset in sorted(infos, key=lambda t: t[1]):
            if spec.name in seen:
                raise CorruptError(f"tensor {spec.name!r} appears twice", path=self.path)
            seen.add(spec.name)
            if offset % alignment:
                raise CorruptError(f"tensor {spec.name!r} offset {offset} is not a multiple of {alignment}",
                                   path=self.path)
            if offset < end:
                raise CorruptError(f"tensor {spec.name!r} at offset {offset} overlaps the previous tensor",
                                   path=self.path)
            end = offset + spec.nbytes
            if end > data_size:
                raise CorruptError(f"tensor {spec.name!r} ({spec.nbytes} bytes at data offset {offset}) runs past "
                                   f"the end of the file ({max(data_size, 0)} data bytes)", path=self.path)



# --- metadata mapping ------------------------------------------------------------------
#: seed 001 §10.4's names, added beside the GGUF keys (which are all kept).
_ALIASES = {"general.architecture": "model_type", "general.name": "model_name"}
_ARCH_ALIASES = {"context_length": "context_length", "embedding_length": "hidden_size"}
_VOCAB = "tokenizer.ggml.tokens"


def apr_metadata(kv: dict, types: dict, version: int) -> dict:
    """GGUF key/value pairs as .apr metadata (documented in FORMAT-section.md):
    every key kept under its own name with its JSON value, except
    ``tokenizer.ggml.tokens``, which becomes seed 001 §5.2's ``tokenizer.vocabulary``
    (plus ``tokenizer.vocab_size``, and the special ids under §5.2's names); the
    §10.4 aliases (model_type, model_name, context_length, hidden_size) are added;
    ``gguf.kv_types`` records each key's GGUF type, ``gguf.kv_order`` the keys' order
    and ``gguf.version`` the version."""
    out = {}
    for key, value in kv.items():
        value = _json_safe(value)
        if key == _VOCAB:
            out["tokenizer.vocabulary"] = value
            out["tokenizer.vocab_size"] = len(value) if isinstance(value, list) else value
        else:
            out[key] = value
    arch = kv.get("general.architecture")
    for key, alias in _ALIASES.items():
        if key in kv:
            out.setdefault(alias, kv[key])
    if isinstance(arch, str):
        for suffix, alias in _ARCH_ALIASES.items():
            if f"{arch}.{suffix}" in kv:
                out.setdefault(alias, kv[f"{arch}.{suffix}"])
    for which in ("bos", "eos"):
        if f"tokenizer.ggml.{which}_token_id" in kv:
            out.setdefault(f"tokenizer.{which}_token_id", kv[f"tokenizer.ggml.{which}_token_id"])
    if "tokenizer.ggml.model" in kv:
        out.setdefault("tokenizer.model_type", kv["tokenizer.ggml.model"])
    out[TYPES_KEY] = dict(types)
    out[ORDER_KEY] = list(kv)
    out[VERSION_KEY] = version
    return out


_NON_FINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def _json_safe(value):
    """JSON has no NaN or infinity: such float values become the strings "nan", "inf",
    "-inf" (their GGUF type, kept in gguf.kv_types, turns them back into floats)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, list) and value and isinstance(value[0], (float, list)):
        return [_json_safe(v) for v in value]
    return value


#: .apr keys the GGUF -> .apr direction derives; the way back drops them (their source
#: keys are there) so a round trip gives exactly the original keys.
_DERIVED = {"model_type", "model_name", "context_length", "hidden_size", "tokenizer.vocab_size",
            "tokenizer.bos_token_id", "tokenizer.eos_token_id", "tokenizer.model_type", TYPES_KEY, VERSION_KEY,
            ORDER_KEY}


def gguf_metadata(metadata: dict) -> list:
    """.apr metadata as GGUF ``(key, type, value)`` triples: the inverse of
    :func:`apr_metadata` for files that came from GGUF; for others every key is kept
    with an inferred type, ``general.architecture``/``general.name`` are filled from
    ``model_type``/``model_name``, and values GGUF cannot hold (objects, null, mixed
    lists) are JSON-encoded strings."""
    types = metadata.get(TYPES_KEY) if isinstance(metadata.get(TYPES_KEY), dict) else {}
    from_gguf = bool(types)
    out = {}
    for key, value in metadata.items():
        if key == "tokenizer.vocabulary":
            out[_VOCAB] = value
        elif from_gguf and key in _DERIVED and key not in types:
            continue
        elif key in (TYPES_KEY, VERSION_KEY, ORDER_KEY):
            continue
        else:
            out[key] = value
    order = metadata.get(ORDER_KEY)
    if from_gguf and isinstance(order, list):  # the source GGUF's order; keys added since go last
        rank = {key: i for i, key in enumerate(order) if isinstance(key, str)}
        out = dict(sorted(out.items(), key=lambda item: rank.get(item[0], len(rank))))
    for key, alias in _ALIASES.items():
        if key not in out and isinstance(metadata.get(alias), str):
            out[key] = metadata[alias]
    triples = []
    for key, value in out.items():
        declared = types.get(key)
        triples.append((key, *_typed(value, declared)))
    return triples


def _typed(value, declared):
    """(type description, value) for one metadata value: the recorded GGUF type when it
    still fits the value, else one inferred from it."""
    if declared is not None:
        value = _floats_back(value, declared)
        if _fits(value, declared):
            return declared, value
    return _infer(value)


def _floats_back(value, declared):
    """Undo :func:`_json_safe` where the recorded type is a float type."""
    if isinstance(declared, list) and isinstance(value, list):
        return [_floats_back(v, declared[1]) for v in value]
    if declared in ("F32", "F64") and isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    return value


def _fits(value, declared) -> bool:
    if isinstance(declared, list):
        return (isinstance(value, list) and len(declared) == 2
                and all(_fits(v, declared[1]) for v in value))
    if declared == "STRING":
        return isinstance(value, str)
    if declared == "BOOL":
        return isinstance(value, bool)
    if declared in ("F32", "F64"):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    fmt = _SCALAR.get(_BY_TYPE_NAME.get(declared, -1))
    if fmt is None or isinstance(value, bool) or not isinstance(value, int):
        return False
    try:
        struct.pack(fmt, value)
        return True
    except struct.error:
        return False


def _infer(value):
    if isinstance(value, bool):
        return "BOOL", value
    if isinstance(value, int):
        for name in ("I32", "I64", "U64"):
            if _fits(value, name):
                return name, value
        return "STRING", str(value)
    if isinstance(value, float):
        exact = math.isnan(value) or float(np.float32(value)) == value
        return ("F32" if exact else "F64"), value
    if isinstance(value, str):
        return "STRING", value
    if isinstance(value, list) and value:
        kinds = [_infer(v) for v in value]
        first = kinds[0][0]
        if all(k[0] == first for k in kinds):
            return ["ARRAY", first], [k[1] for k in kinds]
    if isinstance(value, list):
        if not value:
            return ["ARRAY", "I32"], []
    return "STRING", json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _encode_string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def _encode_value(vtype, value) -> bytes:
    if isinstance(vtype, list):
        inner = vtype[1]
        itype = ARRAY if isinstance(inner, list) else _BY_TYPE_NAME[inner]
        head = struct.pack("<IQ", itype, len(value))
        if itype in _SCALAR:
            return head + np.asarray(value, np.dtype(_SCALAR[itype])).tobytes()
        # A nested array's element is its own (type, count, elements), no value-type prefix.
        return head + b"".join(_encode_value(inner, v) if itype == ARRAY else _encode_string(v) for v in value)
    code = _BY_TYPE_NAME[vtype]
    if code == STRING:
        return struct.pack("<I", code) + _encode_string(value)
    return struct.pack("<I", code) + struct.pack(_SCALAR[code], value)


def _encode_kv(key, vtype, value) -> bytes:
    encoded = _encode_value(vtype, value)
    if isinstance(vtype, list):  # arrays: type id ARRAY, then the array body
        encoded = struct.pack("<I", ARRAY) + encoded
    return _encode_string(key) + encoded


# --- writing ---------------------------------------------------------------------------
#: GGML's name limit (GGML_MAX_NAME is 64 bytes with the terminating NUL).
MAX_NAME_BYTES = 63


def ggml_type(spec: Spec) -> int:
    """The GGML type id for a spec (seed 002 §6.2.7), or LayoutError saying why not."""
    type_id = _GGML_IDS.get(spec.dtype.name)
    if type_id is None and spec.dtype.name == "Q8_TENSOR":
        return 24  # I8 values; scale and zero point go to metadata
    if type_id is None:
        raise LayoutError(f"tensor {spec.name!r}: GGUF cannot hold {spec.dtype.name} (it has no unsigned, bool, "
                          "float8, FP4, complex or aprender-specific types); convert with precision='f32' or "
                          "quantize='Q8_0' first")
    return type_id


def _gguf_spec(spec: Spec) -> Spec:
    """What GGUF stores for ``spec``: Q8_TENSOR loses its 8-byte header to metadata."""
    if spec.dtype.name == "Q8_TENSOR":
        return Spec(spec.name, _dtypes.by_name("I8"), spec.shape)
    return spec


class GGUFWriter(DeclaredWriter):
    """Writes a GGUF v3 file: header, metadata and tensor infos from the declared specs at
    once, then each tensor as it is added (declared order), aligned.  0-d tensors are
    stored with ``ne = [1]`` (GGUF has no 0-d tensors)."""

    def __init__(self, path, specs, metadata=None, *, durable: bool = True, q8_headers=None):
        self.specs = list(specs)
        self._q8 = dict(q8_headers or {})
        for spec in self.specs:
            ggml_type(spec)
            if len(spec.name.encode("utf-8")) > MAX_NAME_BYTES:
                raise LayoutError(f"tensor {spec.name!r}: GGUF names hold at most {MAX_NAME_BYTES} bytes "
                                  "(use rename= to shorten it)")
            if len(spec.shape) > MAX_DIMS:
                raise LayoutError(f"tensor {spec.name!r}: GGUF tensors have at most {MAX_DIMS} dims, "
                                  f"not {len(spec.shape)}")
        triples = gguf_metadata(metadata or {}) + self._q8_metadata()
        self._alignment = self._alignment_of(triples)
        self._next = 0
        prefix = self._prefix(triples)
        self._atomic = AtomicFile(path, durable=durable)
        try:
            reserve(self._atomic.fd, len(prefix) + self._data_size, durable, path)
            _write_all(self._atomic.fd, prefix)
        except BaseException:
            self.abort()
            raise

    def _q8_metadata(self) -> list:
        """``aprfast.q8_tensor.<name>.scale`` (f32) and ``.zero_point`` (i32) for each
        Q8_TENSOR: the header its GGUF I8 form has no room for.  The caller reads them
        (``q8_headers``) before the metadata is written, since the data comes after it."""
        out = []
        for spec in self.specs:
            if spec.dtype.name != "Q8_TENSOR" or _dtypes.element_count(spec.shape) == 0:
                continue
            if spec.name not in self._q8:
                raise LayoutError(f"tensor {spec.name!r}: Q8_TENSOR -> GGUF I8 needs its scale and zero point "
                                  "before the data (q8_headers)")
            scale, zero = self._q8[spec.name]
            out += [(f"aprfast.q8_tensor.{spec.name}.scale", "F32", scale),
                    (f"aprfast.q8_tensor.{spec.name}.zero_point", "I32", zero)]
        return out

    @staticmethod
    def _alignment_of(triples) -> int:
        for key, vtype, value in triples:
            if key == "general.alignment":
                if vtype != "U32" or not isinstance(value, int) or value < 1 or value & (value - 1):
                    raise LayoutError(f"general.alignment {value!r} must be a u32 power of two")
                return value
        return DEFAULT_ALIGNMENT

    def _prefix(self, triples) -> bytes:
        parts = [MAGIC, struct.pack("<IQQ", 3, len(self.specs), len(triples))]
        parts += [_encode_kv(k, t, v) for k, t, v in triples]
        offset = 0
        self._pads = []
        for spec in self.specs:
            stored = _gguf_spec(spec)
            ne = tuple(reversed(stored.shape)) or (1,)
            parts.append(_encode_string(spec.name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne,
                                                                 ggml_type(spec), offset))
            size = stored.nbytes
            pad = -size % self._alignment
            self._pads.append(pad)
            offset += size + pad
        self._data_size = offset
        head = b"".join(parts)
        return head + b"\0" * (-len(head) % self._alignment)


    def add_range(self, name: str, fd: int, offset: int) -> None:
        """The next declared tensor, copied unchanged from ``fd`` at ``offset``."""
        spec = self._expect(name)
        skip = 8 if spec.dtype.name == "Q8_TENSOR" else 0
        copy_range(fd, offset + skip, spec.nbytes - skip, self._atomic.fd, f"tensor {name!r}")
        self._pad_and_advance()

    def add(self, name: str, value) -> None:
        spec = self._expect(name)
        data = tensor_bytes(spec, value)
        if spec.dtype.name == "Q8_TENSOR":  # seed 002 §6.2.7: the i8 values; scale and zero point are metadata
            data = data[8:]
        _write_all(self._atomic.fd, data)
        self._pad_and_advance()

    def _pad_and_advance(self) -> None:
        if self._pads[self._next]:
            _write_all(self._atomic.fd, b"\0" * self._pads[self._next])
        self._next += 1



def q8_tensor_header(value) -> tuple:
    """(scale, zero point) from a Q8_TENSOR's 8-byte header (f32, i32, little-endian)."""
    scale, zero = struct.unpack("<fi", bytes(value.data[:8]))
    return float(scale), zero
