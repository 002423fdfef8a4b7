"""MessagePack exactly as ``rmp_serde::to_vec_named`` (rmp-serde 1.3) writes serde data.

aprender writes the v1 metadata with ``rmp_serde::to_vec_named``, so reproducing its
bytes means reproducing serde's data model as rmp-serde encodes it:

* integers in the smallest form (positive values always as fixint/uint8..uint64, even
  when the Rust type is signed; negative values as fixint/int8..int64);
* ``f32`` as float32 (0xCA), ``f64`` as float64 (0xCB);
* strings in the smallest str form (fixstr, str8, str16, str32), bytes as bin8/16/32;
* structs as maps keyed by field name, in declaration order, leaving out fields whose
  ``skip_serializing_if`` holds (the map length counts only what is written);
* unit enum variants as their name string;
* ``serde_json::Value`` as its natural MessagePack: null -> nil, numbers as u64/i64 or
  float64, objects as maps with sorted keys (serde_json's ``Map`` is a BTreeMap);
* a struct with a ``#[serde(flatten)]`` field as a map of the entries actually written
  (rmp-serde buffers unknown-length maps and writes the counted length first).

The schema classes below describe Rust types; :func:`encode` walks a Python value
against one.  A value the Rust type could not hold raises :class:`SchemaError` naming
its path.  Python's ``msgpack`` package is not used for writing because it has no
per-field float32 and no sorted maps; it is the reader (see ``layouts/v1.py``).
"""

from __future__ import annotations

import math
import numbers
import struct
from collections.abc import Mapping

__all__ = [
    "SchemaError", "Str", "Bool", "UInt", "F32", "JsonValue", "JsonMap", "Enum", "Seq", "Struct", "Field",
    "Bin", "encode", "pack_uint", "pack_sint", "pack_str", "pack_bin", "pack_map_header",
    "pack_array_header", "pack_json",
]

_U64 = 1 << 64
_I64_MIN = -(1 << 63)


class SchemaError(ValueError):
    """A value that the Rust type at ``path`` cannot hold."""

    def __init__(self, path: str, message: str):
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


# --- scalars ------------------------------------------------------------------------
def pack_uint(v: int) -> bytes:
    """rmp ``write_uint``: the smallest unsigned form."""
    if v < 0x80:
        return bytes((v,))
    if v < 0x100:
        return b"\xcc" + bytes((v,))
    if v < 0x10000:
        return b"\xcd" + v.to_bytes(2, "big")
    if v < 0x100000000:
        return b"\xce" + v.to_bytes(4, "big")
    return b"\xcf" + v.to_bytes(8, "big")


def pack_sint(v: int) -> bytes:
    """rmp ``write_sint``: non-negative values take the unsigned forms."""
    if v >= 0:
        return pack_uint(v)
    if v >= -32:
        return struct.pack(">b", v)
    if v >= -0x80:
        return b"\xd0" + struct.pack(">b", v)
    if v >= -0x8000:
        return b"\xd1" + struct.pack(">h", v)
    if v >= -0x80000000:
        return b"\xd2" + struct.pack(">i", v)
    return b"\xd3" + struct.pack(">q", v)


def pack_str(s: str) -> bytes:
    data = s.encode("utf-8")
    n = len(data)
    if n < 32:
        head = bytes((0xA0 | n,))
    elif n < 0x100:
        head = b"\xd9" + bytes((n,))
    elif n < 0x10000:
        head = b"\xda" + n.to_bytes(2, "big")
    else:
        head = b"\xdb" + n.to_bytes(4, "big")
    return head + data


def pack_bin(data) -> bytes:
    data = bytes(data)
    n = len(data)
    if n < 0x100:
        head = b"\xc4" + bytes((n,))
    elif n < 0x10000:
        head = b"\xc5" + n.to_bytes(2, "big")
    else:
        head = b"\xc6" + n.to_bytes(4, "big")
    return head + data


def pack_map_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x80 | n,))
    if n < 0x10000:
        return b"\xde" + n.to_bytes(2, "big")
    return b"\xdf" + n.to_bytes(4, "big")


def pack_array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def pack_json(value, path: str = "") -> bytes:
    """A ``serde_json::Value`` as rmp-serde writes it."""
    out = bytearray()
    _json_into(out, value, path, 0)
    return bytes(out)


# serde_json refuses to parse deeper than this, so aprender could never hold it.
_MAX_JSON_DEPTH = 128


def _json_into(out: bytearray, value, path: str, depth: int) -> None:
    if depth > _MAX_JSON_DEPTH:
        raise SchemaError(path, f"JSON value nested deeper than {_MAX_JSON_DEPTH} levels")
    if value is None:
        out += b"\xc0"
    elif value is True:
        out += b"\xc3"
    elif value is False:
        out += b"\xc2"
    elif isinstance(value, numbers.Integral):
        value = int(value)
        if not _I64_MIN <= value < _U64:
            raise SchemaError(path, f"integer {value} is outside i64/u64 (serde_json::Value cannot hold it)")
        out += pack_sint(value)
    elif isinstance(value, numbers.Real):
        value = float(value)
        if not math.isfinite(value):
            raise SchemaError(path, f"{value} is not finite (serde_json::Value cannot hold it)")
        out += b"\xcb" + struct.pack(">d", value)
    elif isinstance(value, str):
        out += pack_str(value)
    elif isinstance(value, (list, tuple)):
        out += pack_array_header(len(value))
        for i, item in enumerate(value):
            _json_into(out, item, f"{path}[{i}]", depth + 1)
    elif isinstance(value, Mapping):
        _check_str_keys(value, path)
        out += pack_map_header(len(value))
        for key in sorted(value):
            out += pack_str(key)
            _json_into(out, value[key], f"{path}.{key}", depth + 1)
    else:
        raise SchemaError(path, f"{type(value).__name__} is not a JSON value")


def _check_str_keys(mapping, path):
    for key in mapping:
        if not isinstance(key, str):
            raise SchemaError(path, f"map keys must be str, not {key!r}")


# --- schema ---------------------------------------------------------------------------
class Str:
    rust = "String"

    def encode(self, out, value, path):
        if not isinstance(value, str):
            raise SchemaError(path, f"expected a string, not {type(value).__name__}")
        out += pack_str(value)


class Bool:
    rust = "bool"

    def encode(self, out, value, path):
        if not isinstance(value, bool):
            raise SchemaError(path, f"expected a bool, not {type(value).__name__}")
        out += b"\xc3" if value else b"\xc2"


class UInt:
    """u8..u64 and usize (written as u64, as on every 64-bit target)."""

    def __init__(self, bits: int):
        self.bits = bits
        self.rust = f"u{bits}"

    def encode(self, out, value, path):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise SchemaError(path, f"expected an unsigned integer ({self.rust}), not {type(value).__name__}")
        value = int(value)
        if not 0 <= value < (1 << self.bits):
            raise SchemaError(path, f"{value} does not fit {self.rust}")
        out += pack_uint(value)


class F32:
    rust = "f32"

    def encode(self, out, value, path):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise SchemaError(path, f"expected a number (f32), not {type(value).__name__}")
        try:
            out += b"\xca" + struct.pack(">f", float(value))
        except OverflowError:
            raise SchemaError(path, f"{value} is outside the f32 range") from None


class Bin:
    """Bytes written as MessagePack bin (``serde_bytes``): only for aprfast's own keys."""

    rust = "bytes"

    def encode(self, out, value, path):
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise SchemaError(path, f"expected bytes, not {type(value).__name__}")
        out += pack_bin(value)


class JsonValue:
    rust = "serde_json::Value"

    def encode(self, out, value, path):
        _json_into(out, value, path, 0)


class JsonMap:
    """``HashMap<String, serde_json::Value>``, written with its keys sorted.

    aprender's HashMap iterates in a random order per process, so with two or more keys
    aprender itself never writes the same bytes twice; sorted is the one order that
    does not depend on how the dict was built.
    """

    rust = "HashMap<String, Value>"

    def encode(self, out, value, path):
        if not isinstance(value, Mapping):
            raise SchemaError(path, f"expected a map, not {type(value).__name__}")
        _check_str_keys(value, path)
        out += pack_map_header(len(value))
        for key in sorted(value):
            out += pack_str(key)
            _json_into(out, value[key], f"{path}.{key}", 1)


class Enum:
    """A unit-only serde enum: rmp-serde writes the variant's name."""

    def __init__(self, rust: str, variants):
        self.rust = rust
        self.variants = tuple(variants)

    def encode(self, out, value, path):
        name = getattr(value, "name", value)  # an IntEnum member stands for its name
        if name not in self.variants:
            raise SchemaError(path, f"{value!r} is not a {self.rust} variant ({', '.join(self.variants)})")
        out += pack_str(name)


class Seq:
    def __init__(self, item):
        self.item = item
        self.rust = f"Vec<{item.rust}>"

    def encode(self, out, value, path):
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
            raise SchemaError(path, f"expected a list, not {type(value).__name__}")
        items = list(value)
        out += pack_array_header(len(items))
        for i, item in enumerate(items):
            self.item.encode(out, item, f"{path}[{i}]")


class Field:
    """One struct field.  ``skip`` is serde's ``skip_serializing_if``: None (always
    written), "none" (``Option::is_none``: absent or None) or "empty"
    (``HashMap::is_empty`` / ``Vec::is_empty``: absent, None or empty)."""

    __slots__ = ("name", "kind", "skip")

    def __init__(self, name: str, kind, skip: str | None = None):
        self.name, self.kind, self.skip = name, kind, skip

    def skipped(self, value) -> bool:
        if value is None:
            return self.skip is not None
        return self.skip == "empty" and hasattr(value, "__len__") and len(value) == 0


class Struct:
    """A serde struct written as a map of its fields in declaration order.

    ``flatten`` names a ``#[serde(flatten)] HashMap<String, Value>`` field: every key of
    the Python dict that is not a field goes there, written after the fields (sorted).
    Without it, unknown keys are refused: aprender would silently drop them.
    ``extra`` is a tuple of Fields aprfast adds after aprender's (ignored by serde on
    read, since aprender's structs do not deny unknown fields).
    """

    def __init__(self, rust: str, fields, *, flatten: bool = False, extra=()):
        self.rust = rust
        self.fields = tuple(fields)
        self.extra = tuple(extra)
        self.flatten = flatten
        self.names = frozenset(f.name for f in self.fields + self.extra)

    def encode(self, out, value, path):
        if not isinstance(value, Mapping):
            raise SchemaError(path, f"expected a map for {self.rust}, not {type(value).__name__}")
        _check_str_keys(value, path)
        unknown = sorted(k for k in value if k not in self.names)
        if unknown and not self.flatten:
            raise SchemaError(path, f"unknown field(s) {', '.join(map(repr, unknown))} for {self.rust} "
                                    f"(known: {', '.join(f.name for f in self.fields)})")
        body = bytearray()
        count = 0
        for field in self.fields + self.extra:
            item = value.get(field.name)
            if field.skipped(item):
                continue
            if item is None:
                raise SchemaError(f"{path}.{field.name}", f"required field of {self.rust} is missing")
            body += pack_str(field.name)
            field.kind.encode(body, item, f"{path}.{field.name}")
            count += 1
        for key in unknown:  # the flattened map's entries
            body += pack_str(key)
            _json_into(body, value[key], f"{path}.{key}", 1)
            count += 1
        out += pack_map_header(count)
        out += body


def encode(schema, value, path: str = "") -> bytes:
    """``value`` encoded as rmp-serde encodes the Rust type ``schema`` describes."""
    out = bytearray()
    schema.encode(out, value, path)
    return bytes(out)
