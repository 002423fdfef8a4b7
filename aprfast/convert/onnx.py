"""ONNX initializers (the model's weights) as a tensor stream; the graph is not read.

The model is parsed with the ``onnx`` package (an optional extra: ``pip install
'aprfast[onnx]'``), imported only when an ONNX file is opened, with
``load_external_data=False``: weights kept in external data files are read here, from
the files beside the model, after checking each ``location`` (a relative path that
stays inside the model's directory, symlinks resolved) and ``offset``/``length``
against the file.  Inline weights come from ``raw_data`` (little-endian bytes, as the
ONNX spec says) or, when a writer used the typed fields (``float_data``,
``int32_data`` holding f16/bf16/float8 bit patterns, ...), through
``onnx.numpy_helper.to_array``.

Names: a leading "/" is dropped and every other "/" becomes "." (``/encoder/conv1/weight``
-> ``encoder.conv1.weight``); anything else is kept as it is.
"""

from __future__ import annotations

import os

import numpy as np

from .. import dtypes as _dtypes
from ..errors import CorruptError, FormatError, UnknownDTypeError, os_error
from ._common import Spec, check_shape_bytes, read_array, value_of

__all__ = ["OnnxSource", "is_onnx", "ONNX_DTYPES", "normalise_name", "EXTRA"]

EXTRA = "onnx"
#: TensorProto.DataType -> aprfast dtype name; the others (STRING, INT4/UINT4, INT2/UINT2,
#: FLOAT6) have no aprfast dtype and are refused by name.
ONNX_DTYPES = {1: "F32", 2: "U8", 3: "I8", 4: "U16", 5: "I16", 6: "I32", 7: "I64", 9: "BOOL", 10: "F16",
               11: "F64", 12: "U32", 13: "U64", 14: "C64", 15: "C128", 16: "BF16", 17: "F8_E4M3",
               18: "F8_E4M3FNUZ", 19: "F8_E5M2", 20: "F8_E5M2FNUZ", 23: "F4_E2M1", 24: "F8_E8M0"}
_OTHER = {0: "UNDEFINED", 8: "STRING", 21: "UINT4", 22: "INT4", 25: "UINT2", 26: "INT2", 27: "FLOAT6E2M3",
          28: "FLOAT6E3M2"}
#: ModelProto field tags an ONNX file starts with after ir_version (field 1, varint).
_MODEL_TAGS = {0x12, 0x1A, 0x22, 0x28, 0x32, 0x3A, 0x42, 0x72, 0x7A}
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL


def is_onnx(head: bytes) -> bool:
    """True when ``head`` starts as a serialized ModelProto does: ``ir_version`` (field
    1, a small varint) and then another ModelProto field."""
    return len(head) >= 3 and head[0] == 0x08 and 1 <= head[1] < 0x80 and head[2] in _MODEL_TAGS


def normalise_name(name: str) -> str:
    """``/encoder/conv1/weight`` -> ``encoder.conv1.weight`` (see the module docstring).
    ``name`` must be a str: FormatError for anything else (protobuf hands a name that is
    not valid UTF-8 over as bytes)."""
    if not isinstance(name, str):
        raise FormatError(f"initializer name {name!r:.200} is not valid UTF-8 text")
    return name.lstrip("/").replace("/", ".") if "/" in name else name


def _text(value, what: str, path=None) -> str:
    """A protobuf string field as a str: protobuf (upb) hands a field that is not valid
    UTF-8 over as bytes, which is refused here, named (repr of its bytes)."""
    if isinstance(value, str):
        return value
    raise FormatError(f"{what} {value!r:.200} is not valid UTF-8 text", path=path)


def _onnx():
    try:
        import onnx
    except ImportError:
        raise ImportError(f"reading ONNX models needs the onnx package: pip install 'aprfast[{EXTRA}]'") from None
    return onnx


class OnnxSource:
    """The initializers of one ONNX model as a tensor stream, in graph order."""

    kind = "ONNX"

    def __init__(self, path):
        self.path = os.fspath(path)
        self._directory = os.path.realpath(os.path.dirname(os.path.abspath(self.path)))
        self._files = {}
        try:
            self._parse(self._load())
        except BaseException:
            self.close()
            raise

    def _load(self):
        onnx = _onnx()
        from google.protobuf.message import DecodeError

        try:
            # The bytes are parsed as binary protobuf whatever the file is called: onnx.load
            # picks a JSON or text parser from a .json/.textproto/.onnxtxt name, whose errors
            # (and warnings) escape the DecodeError the binary parser raises (fuzz finding).
            # External data is aprfast's to read (confined to the model's directory).
            with open(self.path, "rb") as f:
                data = f.read()
            return onnx.load_model_from_string(data)
        except OSError as exc:
            raise os_error(exc, "cannot read the ONNX model", path=self.path) from exc
        except (DecodeError, ValueError, RuntimeError) as exc:
            raise CorruptError(f"not a readable ONNX model ({type(exc).__name__}: {str(exc)[:200]})",
                               path=self.path) from None

    def _parse(self, model) -> None:
        self.metadata = _metadata(model, self.path)
        self.specs, self._entries, seen = [], {}, {}
        for tensor in model.graph.initializer:
            spec = self._spec(tensor)
            if spec.name in seen:
                raise CorruptError(f"initializers {seen[spec.name]!r} and {tensor.name!r} both normalise to "
                                   f"{spec.name!r}", path=self.path)
            seen[spec.name] = tensor.name
            self._entries[spec.name] = self._where(tensor, spec)
            self.specs.append(spec)
        if model.graph.sparse_initializer:
            self.metadata["onnx.dropped_sparse_initializers"] = [
                _text(t.values.name, "sparse initializer name", self.path) for t in model.graph.sparse_initializer]

    def _spec(self, tensor) -> Spec:
        name = _text(tensor.name, "initializer name", self.path)
        where = f"initializer {name!r}"
        if tensor.data_type not in ONNX_DTYPES:
            kind = _OTHER.get(tensor.data_type, f"type {tensor.data_type}")
            raise UnknownDTypeError(f"{where}: ONNX {kind} has no aprfast dtype", path=self.path)
        if tensor.HasField("segment"):
            raise FormatError(f"{where}: segmented tensors are not read", path=self.path)
        dims = tuple(tensor.dims)
        if any(d < 0 for d in dims):
            raise CorruptError(f"{where}: dims {list(dims)} has a negative dimension", path=self.path)
        dtype = _dtypes.by_name(ONNX_DTYPES[tensor.data_type])
        check_shape_bytes(name, dtype, dims, self.path)
        return Spec(normalise_name(name), dtype, dims)

    def _where(self, tensor, spec: Spec):
        """("external", fd, offset) | ("raw", tensor) | ("typed", tensor), checked."""
        if tensor.data_location == _EXTERNAL:
            return ("external",) + self._external(tensor, spec)
        if tensor.HasField("raw_data"):
            if len(tensor.raw_data) != spec.nbytes:
                raise CorruptError(f"initializer {tensor.name!r}: raw_data holds {len(tensor.raw_data)} bytes, "
                                   f"{spec.dtype.name} {list(spec.shape)} needs {spec.nbytes}", path=self.path)
            return ("raw", tensor)
        return ("typed", tensor)

    def _external(self, tensor, spec: Spec):
        where = f"initializer {tensor.name!r}"
        info = {_text(entry.key, f"{where}: external data key", self.path):
                _text(entry.value, f"{where}: external data value", self.path) for entry in tensor.external_data}
        location = info.get("location")
        if not location:
            raise CorruptError(f"{where}: external data without a location", path=self.path)
        path = self._inside(location, where)
        offset, length = _uint(info.get("offset", "0"), where, "offset"), info.get("length")
        length = spec.nbytes if length is None else _uint(length, where, "length")
        if length != spec.nbytes:
            raise CorruptError(f"{where}: external length {length}, but {spec.dtype.name} {list(spec.shape)} needs "
                               f"{spec.nbytes} bytes", path=self.path)
        fd = self._open(path, where)
        size = os.fstat(fd).st_size
        if offset + length > size:
            raise CorruptError(f"{where}: {length} bytes at offset {offset} run past the end of {location!r} "
                               f"({size} bytes)", path=self.path)
        return fd, offset

    def _inside(self, location: str, where: str) -> str:
        """The external file's real path, refused unless it is inside the model's directory."""
        if "\0" in location or os.path.isabs(location) or location.startswith(("\\", "~")):
            raise CorruptError(f"{where}: external data location {location!r} is not a relative path",
                               path=self.path)
        real = os.path.realpath(os.path.join(self._directory, location))
        if os.path.commonpath([real, self._directory]) != self._directory or real == self._directory:
            raise CorruptError(f"{where}: external data location {location!r} leaves the model's directory",
                               path=self.path)
        return real

    def _open(self, path: str, where: str) -> int:
        fd = self._files.get(path)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError as exc:
                raise os_error(exc, f"{where}: cannot open its external data file", path=path) from exc
            self._files[path] = fd
        return fd

    def read(self, spec: Spec, scratch=None):
        entry = self._entries[spec.name]
        if entry[0] == "external":
            raw = read_array(entry[1], entry[2], spec.nbytes, f"tensor {spec.name!r}", self.path,
                             None if scratch is None else scratch.get(spec.nbytes))
        elif entry[0] == "raw":
            raw = np.frombuffer(entry[1].raw_data, np.uint8)
        else:
            raw = self._typed(entry[1], spec)
        return value_of(spec.dtype, spec.shape, raw)

    def _typed(self, tensor, spec: Spec) -> np.ndarray:
        """Bytes of a tensor stored in the typed fields, decoded by onnx itself."""
        from onnx import numpy_helper

        try:
            array = numpy_helper.to_array(tensor)
        except (ValueError, TypeError) as exc:
            raise CorruptError(f"initializer {tensor.name!r}: typed data does not decode ({str(exc)[:200]})",
                               path=self.path) from None
        if array.size != _dtypes.element_count(spec.shape):
            raise CorruptError(f"initializer {tensor.name!r}: typed data holds {array.size} values, dims "
                               f"{list(spec.shape)} need {_dtypes.element_count(spec.shape)}", path=self.path)
        flat = np.ascontiguousarray(array).reshape(-1)
        if spec.dtype.name == "F4_E2M1":  # one code per byte from onnx -> two per byte, low nibble first
            codes = flat.view(np.uint8) & 0x0F
            codes = np.concatenate([codes, np.zeros(codes.size % 2, np.uint8)])
            return (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)
        if flat.dtype.byteorder == ">":
            flat = flat.astype(flat.dtype.newbyteorder("<"))
        return flat.view(np.uint8)

    def raw_range(self, spec: Spec):
        """(fd, offset) of an initializer kept in an external data file, else None."""
        entry = self._entries[spec.name]
        return (entry[1], entry[2]) if entry[0] == "external" else None

    def tensors(self, wanted=None):
        for spec in self.specs:
            if wanted is None or spec.name in wanted:
                yield spec.name, self.read(spec)

    def close(self) -> None:
        files, self._files = self._files, {}
        for fd in files.values():
            os.close(fd)


def _uint(text: str, where: str, what: str) -> int:
    if not text.isdigit() or len(text) > 20:
        raise CorruptError(f"{where}: external data {what} {text[:40]!r} is not a non-negative integer")
    return int(text)


def _metadata(model, path=None) -> dict:
    """The model's own description (not its graph) as .apr metadata; a text field that
    is not valid UTF-8 is a FormatError naming it."""
    meta = {"onnx.ir_version": model.ir_version,
            "onnx.opset_import": {_text(entry.domain, "opset_import domain", path) or "ai.onnx": entry.version
                                  for entry in model.opset_import}}
    for field in ("producer_name", "producer_version", "domain", "doc_string"):
        value = getattr(model, field)
        if value:
            meta[f"onnx.{field}"] = _text(value, f"model {field}", path)
    if model.model_version:
        meta["onnx.model_version"] = model.model_version
    if model.graph.name:
        meta["onnx.graph_name"] = _text(model.graph.name, "graph name", path)
    for prop in model.metadata_props:
        meta[_text(prop.key, "metadata_props key", path)] = _text(prop.value, f"metadata_props {prop.key!r:.80}", path)
    return meta
