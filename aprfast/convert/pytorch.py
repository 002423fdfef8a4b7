"""PyTorch checkpoints (``torch.save``'s zip files: ``.pt``, ``.pth``, ``.bin``) as a
tensor stream, without running pickle and without importing torch.

``torch.save`` (torch >= 1.6) writes a zip archive of one top directory (its name
varies): ``data.pkl`` (the pickled object, protocol 2 unless the caller asked for
another), ``data/<key>`` (each storage's raw little-endian bytes, stored uncompressed
and 64-byte aligned), ``byteorder``, ``version`` and a few more records.  ``data.pkl``
is interpreted by :mod:`._pickle_vm` with an allowlist of exactly what a state dict
needs: the tensor rebuild functions, the storage classes and dtypes (markers here,
never torch's objects), ``collections.OrderedDict``, ``torch.Size``, protocol 2's
``_codecs.encode`` (bytes) and ``builtins.set``, and numeric numpy scalars
(``numpy.dtype`` + ``numpy.core.multiarray.scalar``, rebuilt as Python numbers).
Anything else (a ``__reduce__`` that would run a command, a pickled ``nn.Module``, numpy
arrays, ...) is refused with :class:`PickleRefusedError` naming it, and nothing runs.

Storages are read from a read-only memory map of the archive at the offset their
local zip header gives (checked against the file and the record's CRC-32): a
contiguous tensor is a view of the map (no copy); a strided one is gathered into the
conversion's scratch buffer.  transformers' sharded checkpoints
(``pytorch_model.bin.index.json``) read as one source.  docs/FORMAT.md §14 has the
whole mapping.
"""

from __future__ import annotations

import errno
import math
import mmap
import os
import stat
import struct
import zipfile

import numpy as np

from .. import dtypes as _dtypes
from .._crc import crc32
from ..errors import (
    AprError,
    ChecksumError,
    CorruptError,
    FormatError,
    LimitError,
    UnknownDTypeError,
    VersionError,
    os_error,
)
from ..io import platform as _platform
from ._common import Spec, check_shape_bytes, value_of
from ._pickle_vm import MAX_PICKLE_BYTES, Allowed, Buildable, PickledDict, PickleRefusedError, build_budget, unpickle

__all__ = ["PyTorchSource", "ShardedPyTorchSource", "PickleRefusedError", "is_pytorch_zip", "is_legacy",
           "is_bin_index", "open_source", "TORCH_DTYPES", "STORAGE_TYPES", "STATE_DICT_KEYS", "WEIGHTS_NAME",
           "INDEX_NAME"]

ZIP_MAGIC = b"PK\x03\x04"
#: torch < 1.6 files start with a pickled long: this magic number (protocol 2, LONG1 of 10 bytes).
LEGACY_MAGIC = b"\x80\x02\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")

#: torch dtype attribute name -> aprfast dtype name (None: no aprfast dtype, refused).
TORCH_DTYPES = {
    "float32": "F32", "float": "F32", "float64": "F64", "double": "F64", "float16": "F16", "half": "F16",
    "bfloat16": "BF16", "int8": "I8", "int16": "I16", "short": "I16", "int32": "I32", "int": "I32",
    "int64": "I64", "long": "I64", "uint8": "U8", "uint16": "U16", "uint32": "U32", "uint64": "U64",
    "bool": "BOOL", "complex64": "C64", "cfloat": "C64", "complex128": "C128", "cdouble": "C128",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ", "float8_e8m0fnu": "F8_E8M0", "float4_e2m1fn_x2": "F4_E2M1",
    "complex32": None, "chalf": None,
}
#: Legacy typed storage classes (what torch pickles as a storage's type) -> aprfast dtype.
STORAGE_TYPES = {
    "FloatStorage": "F32", "DoubleStorage": "F64", "HalfStorage": "F16", "BFloat16Storage": "BF16",
    "CharStorage": "I8", "ShortStorage": "I16", "IntStorage": "I32", "LongStorage": "I64",
    "ByteStorage": "U8", "BoolStorage": "BOOL", "ComplexFloatStorage": "C64", "ComplexDoubleStorage": "C128",
}
#: Keys of a full checkpoint that hold the model's state dict, tried in this order.
STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "params")
#: Tensors (tied ones counted once) may declare at most this many times the file's size
#: plus 64 MiB: a stride-0 (expanded) tensor can otherwise make petabytes from 4 bytes.
MAX_EXPANSION = 4
MAX_NESTING = 16
#: transformers' names for a PyTorch checkpoint directory: one file, or shards plus an index.
WEIGHTS_NAME = "pytorch_model.bin"
INDEX_NAME = "pytorch_model.bin.index.json"
_SHARD_SUFFIXES = (".bin", ".pt", ".pth")


# --- what the pickle builds --------------------------------------------------------------
class _TorchDType:
    __slots__ = ("name", "apr")

    def __init__(self, name, apr):
        self.name, self.apr = name, apr


class _StorageType:
    __slots__ = ("name", "apr")  # apr None: UntypedStorage (bytes)

    def __init__(self, name, apr):
        self.name, self.apr = name, apr


class StorageRecord:
    """One ``data/<key>`` entry: byte range in the archive, its zip CRC-32, element
    dtype (None: untyped)."""

    __slots__ = ("key", "dtype", "nbytes", "offset", "crc")

    def __init__(self, key, dtype, nbytes, offset, crc):
        self.key, self.dtype, self.nbytes, self.offset, self.crc = key, dtype, nbytes, offset, crc


class TorchTensor:
    """A tensor as the pickle describes it; its bytes stay in the archive until read.
    ``shape`` is aprfast's (float4 x2 has twice torch's last dim), ``view_shape`` and
    ``stride`` are torch's, in elements of ``itemsize`` bytes."""

    __slots__ = ("storage", "offset", "view_shape", "stride", "dtype", "shape", "itemsize", "contiguous")

    def __init__(self, storage, offset, view_shape, stride, dtype):
        self.storage, self.offset, self.view_shape, self.stride, self.dtype = storage, offset, view_shape, stride, dtype
        self.itemsize = dtype.itemsize or 1  # F4_E2M1: torch's element is one byte (two values)
        self.shape = _apr_shape(dtype, view_shape)
        self.contiguous = _is_contiguous(view_shape, stride)

    @property
    def key(self):
        """What makes two tensors one: the same bytes read the same way."""
        return (self.storage.key, self.offset, self.view_shape, self.stride, self.dtype.name)


def _apr_shape(dtype, view_shape):
    if dtype.name == "F4_E2M1":  # float4_e2m1fn_x2: one torch element = two values
        return view_shape[:-1] + (view_shape[-1] * 2,) if view_shape else (2,)
    return view_shape


def _is_contiguous(shape, stride) -> bool:
    expected = 1
    for dim, step in zip(reversed(shape), reversed(stride)):
        if dim != 1 and step != expected:
            return False
        expected *= dim
    return True


# --- the allowlist ---------------------------------------------------------------------------
def _is_int(value) -> bool:
    return type(value) is int and 0 <= value < 1 << 62


def _ints(value, what: str) -> tuple:
    if type(value) not in (tuple, list) or not all(_is_int(v) for v in value):
        raise CorruptError(f"tensor {what} {_short(value)} is not a tuple of non-negative ints")
    return tuple(value)


def _short(value) -> str:
    """A bounded description of a pickled value for an error message."""
    if isinstance(value, int) and value.bit_length() > 64:  # repr() of a huge int is slow, or refused
        return f"an int of {value.bit_length()} bits"
    if isinstance(value, (int, float, bool, type(None))):
        return repr(value)[:40]
    if isinstance(value, (str, bytes)):
        return repr(value[:40])
    return f"a {type(value).__name__}"


def _tensor_dtype(dtype):
    if not isinstance(dtype, _TorchDType):
        raise CorruptError(f"tensor dtype is {_short(dtype)}, not a torch dtype")
    if dtype.apr is None:
        raise UnknownDTypeError(f"torch dtype {dtype.name} has no aprfast dtype")
    return _dtypes.by_name(dtype.apr)


def _make_tensor(storage, offset, size, stride, dtype, metadata=None):
    if not isinstance(storage, StorageRecord):
        raise CorruptError(f"tensor rebuilt from {_short(storage)}, not a storage")
    if not _is_int(offset):
        raise CorruptError(f"tensor storage offset {_short(offset)} is not a non-negative int")
    size, stride = _ints(size, "size"), _ints(stride, "stride")
    if len(size) != len(stride):
        raise CorruptError(f"tensor size {list(size)} and stride {list(stride)} differ in length")
    if metadata is not None and not isinstance(metadata, dict):
        raise CorruptError(f"tensor metadata is {_short(metadata)}, not a dict")
    if metadata:
        raise FormatError(f"tensor carries metadata {[_short(k) for k in list(metadata)[:4]]} (conjugate or "
                          "negative views and similar) that aprfast does not apply; save a resolved copy")
    tensor = TorchTensor(storage, offset, size, stride, dtype)
    check_shape_bytes("(pickled)", dtype, tensor.shape, None)
    _check_extent(tensor)
    return tensor


def _check_extent(t: TorchTensor) -> None:
    """The last element the view reaches must lie inside its storage."""
    if 0 in t.view_shape:
        return
    last = t.offset + sum((d - 1) * s for d, s in zip(t.view_shape, t.stride))
    if (last + 1) * t.itemsize > t.storage.nbytes:
        raise CorruptError(f"tensor of size {list(t.view_shape)}, stride {list(t.stride)} at offset {t.offset} "
                           f"reaches byte {(last + 1) * t.itemsize} of storage {t.storage.key!r}, which holds "
                           f"{t.storage.nbytes}")


def _storage_dtype(storage):
    if not isinstance(storage, StorageRecord) or storage.dtype is None:
        raise CorruptError(f"tensor rebuilt from {_short(storage)}, not a typed storage")
    return storage.dtype


def _rebuild_tensor(storage, offset, size, stride):
    return _make_tensor(storage, offset, size, stride, _storage_dtype(storage))


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    return _make_tensor(storage, offset, size, stride, _storage_dtype(storage), metadata)


def _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype, metadata=None):
    return _make_tensor(storage, offset, size, stride, _tensor_dtype(dtype), metadata)


def _rebuild_parameter(data, requires_grad=False, hooks=None, state=None):
    if not isinstance(data, TorchTensor):
        raise CorruptError(f"parameter rebuilt from {_short(data)}, not a tensor")
    return data


def _ordered_dict(*args):
    out = PickledDict()
    if args:
        if len(args) != 1 or type(args[0]) not in (list, tuple):
            raise CorruptError("OrderedDict arguments are not one list of pairs")
        for pair in args[0]:
            if type(pair) not in (list, tuple) or len(pair) != 2:
                raise CorruptError("OrderedDict item is not a (key, value) pair")
            out[_key(pair[0])] = pair[1]
    return out


def _key(value):
    if isinstance(value, (str, int, float, bool, type(None), bytes)):
        return value
    raise CorruptError(f"dict key is a {type(value).__name__}")


def _size(*args):
    if len(args) != 1:
        raise CorruptError("torch.Size takes one tuple")
    return _ints(args[0], "torch.Size")


def _codecs_encode(text, encoding="utf-8"):
    # Protocol 2 pickles bytes as _codecs.encode(str, "latin1"): only that is rebuilt.
    if type(text) is not str or encoding not in ("latin1", "latin-1"):
        raise PickleRefusedError("_codecs.encode is accepted only as protocol 2's bytes form (str, 'latin1')")
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:  # pickle writes each byte as one code point below 256
        raise CorruptError("protocol 2 bytes hold a character above U+00FF") from None


def _set(*args):
    items = args[0] if args else ()
    if type(items) not in (list, tuple):
        raise CorruptError("set() argument is not a list")
    return set(_key(v) for v in items)


#: NumPy type codes a pickled numpy scalar (an epoch counter, a best accuracy) may have.
_NUMPY_CODES = {"b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"}


class _NumpyDType(Buildable):
    """``numpy.dtype(code, False, True)`` as pickle rebuilds it; BUILD gives the byte order."""

    def __init__(self, code: str, align=False, copy=True):
        if type(code) is not str or code not in _NUMPY_CODES:
            raise PickleRefusedError(f"numpy.dtype({_short(code)}): only numeric scalar types are rebuilt")
        self.code, self.order = code, "<"

    def build(self, state) -> None:
        if type(state) is not tuple or len(state) < 2 or state[1] not in ("<", ">", "|", "="):
            raise CorruptError(f"numpy dtype state {_short(state)} is not (version, byte order, ...)")
        self.order = "<" if state[1] in ("|", "=") else state[1]


def _numpy_scalar(dtype, data=None):
    """A numpy scalar (``numpy.core.multiarray.scalar(dtype, bytes)``) as a Python number."""
    if not isinstance(dtype, _NumpyDType) or type(data) is not bytes:
        raise CorruptError("numpy scalar is not (numpy dtype, bytes)")
    np_dtype = np.dtype(dtype.order + dtype.code)
    if len(data) != np_dtype.itemsize:
        raise CorruptError(f"numpy {dtype.code} scalar holds {len(data)} bytes, not {np_dtype.itemsize}")
    return np.frombuffer(data, np_dtype)[0].item()


def _allowlist() -> dict:
    allowed = {("collections", "OrderedDict"): Allowed("collections", "OrderedDict", _ordered_dict),
               ("torch", "Size"): Allowed("torch", "Size", _size),
               ("_codecs", "encode"): Allowed("_codecs", "encode", _codecs_encode),
               ("builtins", "set"): Allowed("builtins", "set", _set),
               ("__builtin__", "set"): Allowed("__builtin__", "set", _set),
               ("torch.storage", "UntypedStorage"): _StorageType("UntypedStorage", None),
               ("torch", "UntypedStorage"): _StorageType("UntypedStorage", None),
               ("numpy", "dtype"): Allowed("numpy", "dtype", _NumpyDType)}
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "scalar")] = Allowed(module, "scalar", _numpy_scalar)
    for name, func in (("_rebuild_tensor", _rebuild_tensor), ("_rebuild_tensor_v2", _rebuild_tensor_v2),
                       ("_rebuild_tensor_v3", _rebuild_tensor_v3), ("_rebuild_parameter", _rebuild_parameter),
                       ("_rebuild_parameter_with_state", _rebuild_parameter)):
        allowed[("torch._utils", name)] = Allowed("torch._utils", name, func)
    for name, apr in STORAGE_TYPES.items():
        allowed[("torch", name)] = _StorageType(name, apr)
    for name, apr in TORCH_DTYPES.items():
        allowed[("torch", name)] = _TorchDType(name, apr)
    return allowed


_ALLOWED = _allowlist()


# --- the archive ---------------------------------------------------------------------------
def is_pytorch_zip(path) -> bool:
    """True when ``path`` is a zip holding a ``<dir>/data.pkl`` record (torch.save's layout)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(_data_pkl_prefix(name) is not None for name in archive.namelist())
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error, NotImplementedError):
        return False


def is_legacy(head: bytes) -> bool:
    """True for torch < 1.6's pre-zip serialization (a sequence of pickles)."""
    return head.startswith(LEGACY_MAGIC)


def _data_pkl_prefix(name: str):
    top, _, rest = name.partition("/")
    return top if rest == "data.pkl" and top else None


class _Archive:
    """The zip's records: one top directory, no duplicate names, each record's data
    range taken from its local header and checked against the file."""

    def __init__(self, fd: int, size: int, path):
        self.fd, self.size, self.path = fd, size, path
        try:
            with open(fd, "rb", closefd=False) as f, zipfile.ZipFile(f) as archive:
                infos = archive.infolist()
                self._check_records(infos)
                self.prefix = self._prefix(infos)
                self.infos = {i.filename: i for i in infos}
                self.pickle = self._read_small(archive, "data.pkl")
                self.byteorder = self._read_small(archive, "byteorder", required=False)
        except AprError:
            raise
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, struct.error, NotImplementedError,
                ValueError) as exc:  # ValueError: undecodable UTF-8 names, impossible sizes
            raise CorruptError(f"not a readable zip archive ({type(exc).__name__}: {str(exc)[:200]})",
                               path=path) from None
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # zipfile seeking to an offset the directory made up
                raise CorruptError(f"zip directory points outside the file ({exc.strerror})", path=path) from None
            raise os_error(exc, "cannot read the PyTorch archive", path=path) from exc

    def _check_records(self, infos) -> None:
        """No name twice (which copy would torch read?) and no encrypted record."""
        seen = set()
        for info in infos:
            if info.filename in seen:
                raise CorruptError(f"zip record {info.filename!r} appears twice", path=self.path)
            if info.flag_bits & 0x1:
                raise FormatError(f"zip record {info.filename!r} is encrypted; torch.save never encrypts",
                                  path=self.path)
            seen.add(info.filename)

    def _prefix(self, infos) -> str:
        prefixes = {p for p in (_data_pkl_prefix(i.filename) for i in infos) if p is not None}
        if "constants.pkl" in {i.filename.partition("/")[2] for i in infos}:
            raise FormatError("a TorchScript archive (torch.jit.save), not a torch.save checkpoint", path=self.path)
        if len(prefixes) != 1:
            raise FormatError(f"zip holds {len(prefixes)} <dir>/data.pkl records; a torch.save file holds one",
                              path=self.path)
        return prefixes.pop()

    def _read_small(self, archive, name: str, required: bool = True):
        info = self.infos.get(f"{self.prefix}/{name}")
        if info is None:
            if required:
                raise CorruptError(f"archive has no {self.prefix}/{name}", path=self.path)
            return None
        if info.file_size > MAX_PICKLE_BYTES:
            raise LimitError(f"{info.filename} is {info.file_size} bytes, more than {MAX_PICKLE_BYTES}",
                             path=self.path)
        with archive.open(info) as f:  # zipfile checks the CRC at the end
            data = f.read(MAX_PICKLE_BYTES + 1)
        return data

    def storage_range(self, key: str):
        """(data offset, size) of ``data/<key>``, stored uncompressed and inside the file."""
        info = self.infos.get(f"{self.prefix}/data/{key}")
        if info is None:
            raise CorruptError(f"storage {key!r} has no record {self.prefix}/data/{key} in the archive",
                               path=self.path)
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise FormatError(f"storage record {info.filename} is compressed (method {info.compress_type}); "
                              "torch.save stores them uncompressed, which is what aprfast maps", path=self.path)
        header = _platform.pread(self.fd, 30, info.header_offset)
        if len(header) != 30 or header[:4] != ZIP_MAGIC:
            raise CorruptError(f"record {info.filename}: no local file header at offset {info.header_offset}",
                               path=self.path)
        name_len, extra_len = struct.unpack_from("<HH", header, 26)
        start = info.header_offset + 30 + name_len + extra_len
        if start + info.file_size > self.size:
            raise CorruptError(f"record {info.filename}: {info.file_size} bytes at offset {start} run past the "
                               f"end of the {self.size}-byte file", path=self.path)
        return start, info.file_size, info.CRC


# --- the state dict ----------------------------------------------------------------------------
def _simple(value):
    """``value`` as a JSON-able metadata value, or None when it is not simple."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value, True
    if isinstance(value, int):
        return (value, True) if -(1 << 63) <= value < 1 << 64 else (None, False)
    if isinstance(value, float):
        return (value if math.isfinite(value) else str(value), True)  # JSON has no NaN: "nan", "inf", "-inf"
    if type(value) in (list, tuple) and len(value) <= 4096:
        items = [_simple(v) for v in value if not isinstance(v, (list, tuple, dict))]
        if len(items) == len(value) and all(ok for _, ok in items):
            return [v for v, _ in items], True
    return None, False


def _has_tensor(value) -> bool:
    return isinstance(value, dict) and any(isinstance(v, TorchTensor) for v in value.values())


def _find_state_dict(obj, path):
    """(state dict, the rest of the checkpoint's top level) of what the pickle built."""
    if isinstance(obj, TorchTensor):
        return {"tensor": obj}, {}
    if not isinstance(obj, dict):
        raise FormatError(f"the checkpoint is a {type(obj).__name__}, not a dict of tensors", path=path)
    for key in STATE_DICT_KEYS:
        if _has_tensor(obj.get(key)) or (isinstance(obj.get(key), dict) and _nested_tensor(obj[key])):
            return obj[key], {k: v for k, v in obj.items() if k != key}
    if _has_tensor(obj) or _nested_tensor(obj):
        return obj, {}
    keys = ", ".join(repr(k)[:40] for k in list(obj)[:10])
    raise FormatError(f"no state dict found: no tensors at the top level or under {', '.join(STATE_DICT_KEYS)} "
                      f"(top-level keys: {keys})", path=path)


def _nested_tensor(obj, depth: int = 0, known=None) -> bool:
    """True when the dict ``obj`` holds a tensor, at most MAX_NESTING dicts down.  Each
    dict is looked at once (``known``: id -> answer): through the memo one dict can sit
    under many keys, and a shared structure walked as a tree takes exponential time."""
    if depth > MAX_NESTING or not isinstance(obj, dict):
        return False
    known = {} if known is None else known
    if id(obj) not in known:
        known[id(obj)] = False  # a dict that (through the memo) holds itself ends here
        known[id(obj)] = any(isinstance(v, TorchTensor) or _nested_tensor(v, depth + 1, known)
                             for v in obj.values())
    return known[id(obj)]


def _flatten(node: dict, path, prefix: str = "", depth: int = 0, seen=None, budget: int = 1 << 26):
    """(name, TorchTensor) pairs of a state dict in its own order, nested dicts joined
    with "." (keys must be str or int), and the names of the non-tensor entries dropped.
    A dict met twice (the memo can place one under many keys) is refused: its names
    would multiply with every level.  The names built may hold ``budget`` characters in
    all (LimitError): one long key placed at every level through the memo would
    otherwise make every name that long."""
    if depth > MAX_NESTING:
        raise LimitError(f"state dict nests deeper than {MAX_NESTING} levels at {prefix[:200]!r}", path=path)
    seen = ({}, set(), [budget]) if seen is None else seen
    known, visited, left = seen
    if id(node) in visited:
        raise CorruptError(f"the state dict holds one dict twice (at {prefix[:-1][:200]!r})", path=path)
    visited.add(id(node))
    tensors, dropped = [], []
    for key, value in node.items():
        named = isinstance(key, str) or (type(key) is int and key.bit_length() <= 64)
        name = f"{prefix}{key}" if named else f"{prefix}{_short(key)}"
        left[0] -= len(name)
        if left[0] < 0:
            raise LimitError(f"the state dict's names take more characters than the pickle may build (at "
                             f"{name[:200]!r}): keys repeated through the pickle's memo", path=path)
        if not named:
            dropped.append(name)
            continue
        if isinstance(value, TorchTensor):
            tensors.append((name, value))
        elif isinstance(value, dict) and _nested_tensor(value, depth + 1, known):
            sub_tensors, sub_dropped = _flatten(value, path, name + ".", depth + 1, seen)
            tensors.extend(sub_tensors)
            dropped.extend(sub_dropped)
        else:
            dropped.append(name)
    return tensors, dropped


def _metadata(rest: dict, dropped: list, budget: int = 1 << 26, path=None) -> dict:
    """Simple top-level values of a full checkpoint (epoch, step, names, ...) as .apr
    metadata under their own keys; what cannot be kept is listed under
    ``pytorch.dropped`` (optimizer state, nested objects, non-tensor state entries).
    The values looked at may hold ``budget`` items in all (LimitError): one list placed
    under many keys through the pickle's memo would otherwise be copied for each."""
    out, lost, left = {}, list(dropped), budget
    for key, value in rest.items():
        if type(value) in (list, tuple):
            left -= len(value)
            if left < 0:
                raise LimitError(f"the checkpoint's top-level values hold more than {budget} items (at key "
                                 f"{_short(key)}): one list repeated through the pickle's memo", path=path)
        kept, ok = _simple(value)
        if isinstance(key, str) and ok:
            out[key] = kept
        else:
            lost.append(key if isinstance(key, str) else _short(key))
    if lost:
        out["pytorch.dropped"] = lost[:1000]
    return out


# --- the source ------------------------------------------------------------------------------
class PyTorchSource:
    """A ``torch.save`` zip as a tensor stream (see the module docstring).  ``aliases``
    maps each tensor that reads exactly the bytes of an earlier one (tied weights:
    the same storage, offset, shape, stride and dtype) to that earlier name."""

    kind = "PyTorch"

    def __init__(self, path):
        self.path = os.fspath(path)
        self._map = None
        self._verified = set()
        try:
            self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise os_error(exc, "cannot open the PyTorch file", path=self.path) from exc
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    def _parse(self) -> None:
        size = os.fstat(self._fd).st_size
        head = _platform.pread(self._fd, len(LEGACY_MAGIC), 0)
        if is_legacy(head):
            raise VersionError("a torch < 1.6 (pre-zip, legacy) checkpoint: aprfast reads the zip format "
                               "torch.save has written since 1.6; load and re-save it with a current torch",
                               path=self.path)
        archive = _Archive(self._fd, size, self.path)
        if archive.byteorder not in (None, b"little"):
            raise VersionError(f"byteorder {archive.byteorder[:16]!r}: only little-endian checkpoints are read",
                               path=self.path)
        storages = {}
        try:
            obj = unpickle(archive.pickle, _ALLOWED, what=f"{archive.prefix}/data.pkl",
                           persistent_load=lambda pid: self._storage(pid, archive, storages))
        except AprError as exc:
            if exc.path is not None:
                raise
            raise type(exc)(exc.message, path=self.path) from None
        state, rest = _find_state_dict(obj, self.path)
        budget = build_budget(len(archive.pickle))  # what the pickle itself was allowed to build
        pairs, dropped = _flatten(state, self.path, budget=budget)
        self.metadata = _metadata(rest, dropped, len(archive.pickle) + 4096, self.path)
        self._tensors = dict(pairs)
        self.specs = [Spec(name, t.dtype, t.shape) for name, t in pairs]
        self.aliases = self._find_aliases(pairs)
        self._check_expansion(size)
        if size:
            self._map = mmap.mmap(self._fd, size, access=mmap.ACCESS_READ)
            self._bytes = np.frombuffer(self._map, np.uint8)
        else:
            self._bytes = np.empty(0, np.uint8)

    def _storage(self, pid, archive: _Archive, storages: dict) -> StorageRecord:
        """persistent_load: ``('storage', storage_type, key, location, numel)``."""
        if type(pid) is not tuple or len(pid) != 5 or pid[0] != "storage":
            raise CorruptError(f"persistent id {_short(pid)} is not ('storage', type, key, location, numel)",
                               path=self.path)
        _, kind, key, _location, numel = pid
        if not isinstance(kind, _StorageType):
            raise PickleRefusedError(f"persistent id names storage type {_short(kind)}, not a storage class "
                                     "on the allowlist", path=self.path)
        if type(key) is not str or not _is_int(numel):
            raise CorruptError(f"storage persistent id has key {_short(key)} and numel {_short(numel)}",
                               path=self.path)
        dtype = None if kind.apr is None else _dtypes.by_name(kind.apr)
        nbytes = numel * (dtype.itemsize if dtype is not None else 1)
        found = storages.get(key)
        if found is not None:
            if found.nbytes != nbytes:
                raise CorruptError(f"storage {key!r} is declared as {found.nbytes} and {nbytes} bytes",
                                   path=self.path)
            return found if found.dtype is dtype else StorageRecord(key, dtype, nbytes, found.offset, found.crc)
        offset, stored, crc = archive.storage_range(key)
        if stored != nbytes:
            raise CorruptError(f"storage {key!r} declares {numel} elements ({nbytes} bytes) but its record holds "
                               f"{stored} bytes", path=self.path)
        storages[key] = record = StorageRecord(key, dtype, nbytes, offset, crc)
        return record

    @staticmethod
    def _find_aliases(pairs) -> dict:
        first, aliases = {}, {}
        for name, tensor in pairs:
            if tensor.key in first:
                aliases[name] = first[tensor.key]
            else:
                first[tensor.key] = name
        return aliases

    def _check_expansion(self, size: int) -> None:
        total = sum(spec.nbytes for spec in self.specs if spec.name not in self.aliases)
        limit = MAX_EXPANSION * size + (64 << 20)
        if total > limit:
            raise LimitError(f"tensors declare {total} bytes from a {size}-byte file (more than {MAX_EXPANSION} x "
                             "its size + 64 MiB): stride-0 or overlapping views would multiply the data",
                             path=self.path)

    def read(self, spec: Spec, scratch=None):
        """The tensor's value: a view of the map when it is contiguous, else gathered
        into ``scratch`` (a Scratch, valid until its next use) or a new array."""
        t = self._tensors[spec.name]
        self._verify(t.storage)
        nbytes = spec.nbytes
        start = t.storage.offset + t.offset * t.itemsize
        if t.contiguous or nbytes == 0:
            raw = self._bytes[start:start + nbytes]
        else:
            raw = self._gather(t, start, nbytes, scratch)
        return value_of(spec.dtype, spec.shape, raw)

    def _verify(self, storage: StorageRecord) -> None:
        """The storage's bytes against its zip CRC-32, once per storage, before any of
        it is used (torch's reader does not check; a flipped bit would be kept)."""
        if storage.key in self._verified:
            return
        data = self._bytes[storage.offset:storage.offset + storage.nbytes]
        if crc32(data) != storage.crc:
            raise ChecksumError(f"storage record data/{storage.key} does not match its zip CRC-32", path=self.path)
        self._verified.add(storage.key)

    def _gather(self, t: TorchTensor, start: int, nbytes: int, scratch) -> np.ndarray:
        item = np.dtype(f"V{t.itemsize}")
        whole = t.storage.nbytes - t.storage.nbytes % t.itemsize  # an untyped storage may end mid-element
        base = self._bytes[t.storage.offset:t.storage.offset + whole].view(item)
        # every element of this view lies inside the storage (checked when it was rebuilt)
        view = np.lib.stride_tricks.as_strided(base[t.offset:], t.view_shape,
                                               [s * t.itemsize for s in t.stride], writeable=False)
        out = scratch.get(nbytes)[:nbytes] if scratch is not None else np.empty(nbytes, np.uint8)
        np.copyto(out.view(item).reshape(t.view_shape), view)
        return out

    def raw_range(self, spec: Spec):
        """(fd, offset) of a contiguous tensor's bytes in the archive, else None."""
        t = self._tensors[spec.name]
        if not t.contiguous:
            return None
        self._verify(t.storage)
        return self._fd, t.storage.offset + t.offset * t.itemsize

    def tensors(self, wanted=None):
        for spec in self.specs:
            if wanted is None or spec.name in wanted:
                yield spec.name, self.read(spec)

    def close(self) -> None:
        self._bytes = None
        mapped, self._map = self._map, None
        if mapped is not None:
            try:
                mapped.close()
            except BufferError:  # a caller still holds a view: the map goes with the last one
                pass
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            os.close(fd)


def save_shared(src, destination, pairs, transform, progress, durable: bool) -> int:
    """Write an ``.apr`` from a source with tied tensors so that each storage is stored
    once: ``aprfast.save_file`` stores inputs that are one buffer (same address, size,
    dtype and shape) once, and contiguous tensors here are views of the archive's map,
    tied ones at the same address.  A transformed tensor (precision=, quantize=) is
    computed once per storage and given to every name.  Untransformed tensors are views
    of the map (page cache, not heap); transformed ones are all held until the write."""
    from ..api import save_file

    values, done, cache = {}, 0, {}
    total = sum(spec.nbytes for spec, _ in pairs)
    for spec, out in pairs:
        hit = cache.get(src.aliases.get(spec.name, spec.name))
        if hit is not None and hit[0] is out.dtype and hit[1] == out.shape:
            value = hit[2]
        else:
            value = transform(src.read(spec), spec, out)
            cache[spec.name] = (out.dtype, out.shape, value)
        values[out.name] = value
        done += spec.nbytes
        if progress is not None:
            progress(done, total)
    save_file(values, destination, src.metadata, durable=durable)
    return total


# --- sharded checkpoints (transformers' pytorch_model.bin.index.json) --------------------------
def _weight_map(index_path) -> dict:
    """The ``weight_map`` of an index file (tensor -> shard file name beside it), every
    shard name checked to be a plain file name (``safetensors.read_index``)."""
    from .safetensors import read_index

    return read_index(index_path, "a checkpoint index")


def is_bin_index(path) -> bool:
    """True for an index whose shards are PyTorch files (``.bin``/``.pt``/``.pth``
    names, the first one a zip), not safetensors.  Every shard name is checked (a plain
    file name beside the index) before any shard is looked at, and the first is opened
    only when it is a regular file (never a FIFO or a device, which could block)."""
    from .safetensors import shard_file

    try:
        shards = set(_weight_map(path).values())
    except AprError:
        return False
    if not shards or not all(name.endswith(_SHARD_SUFFIXES) for name in shards):
        return False
    try:
        first = shard_file(os.path.dirname(os.path.abspath(path)), min(shards), path)
    except AprError:
        return True  # the source names the missing (or not regular) shard
    try:
        fd = os.open(first, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return True
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced since it was looked at
            return True
        return _platform.pread(fd, 4, 0) == ZIP_MAGIC
    except OSError:
        return True
    finally:
        os.close(fd)


class ShardedPyTorchSource:
    """A transformers sharded PyTorch checkpoint (``pytorch_model.bin.index.json`` and
    ``pytorch_model-0000N-of-0000M.bin``) as one tensor stream, checked as a sharded
    safetensors checkpoint is: plain shard names beside the index, every shard present,
    each tensor in the shard the index names and in one shard only."""

    kind = "PyTorch"

    def __init__(self, index_path):
        self.path = os.fspath(index_path)
        directory = os.path.dirname(os.path.abspath(self.path))
        weight_map = _weight_map(self.path)
        self._shards, self._owner, self.specs, self.metadata, self.aliases = [], {}, [], {}, {}
        try:
            for shard in sorted(set(weight_map.values())):
                self._add_shard(directory, shard, weight_map)
            missing = [name for name in weight_map if name not in self._owner]
            if missing:
                raise CorruptError(f"{len(missing)} tensors listed in the index are in no shard (first: "
                                   f"{missing[0]!r})", path=self.path)
        except BaseException:
            self.close()
            raise

    def _add_shard(self, directory: str, shard: str, weight_map: dict) -> None:
        from .safetensors import shard_file

        src = PyTorchSource(shard_file(directory, shard, self.path))
        self._shards.append(src)
        for key, value in src.metadata.items():
            self.metadata.setdefault(key, value)
        self.aliases.update(src.aliases)
        for spec in src.specs:
            if spec.name in self._owner:
                raise CorruptError(f"tensor {spec.name!r} is in two shards", path=self.path)
            if weight_map.get(spec.name) != shard:
                raise CorruptError(f"tensor {spec.name!r} is in shard {shard!r}, but the index maps it to "
                                   f"{weight_map.get(spec.name)!r}", path=self.path)
            self._owner[spec.name] = src
            self.specs.append(spec)

    def read(self, spec: Spec, scratch=None):
        return self._owner[spec.name].read(spec, scratch)

    def raw_range(self, spec: Spec):
        return self._owner[spec.name].raw_range(spec)

    def tensors(self, wanted=None):
        for src in self._shards:
            yield from src.tensors(wanted)

    def close(self) -> None:
        for src in self._shards:
            src.close()


def open_source(path):
    """A source for a PyTorch file, an index file, or a directory holding either."""
    path = os.fspath(path)
    if os.path.isdir(path):
        index = os.path.join(path, INDEX_NAME)
        return ShardedPyTorchSource(index) if os.path.isfile(index) else PyTorchSource(os.path.join(path,
                                                                                                    WEIGHTS_NAME))
    with open(path, "rb") as f:
        head = f.read(1)
    return ShardedPyTorchSource(path) if head.lstrip()[:1] == b"{" or head.isspace() else PyTorchSource(path)
