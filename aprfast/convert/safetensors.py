"""SafeTensors in and out, one tensor at a time, and Hugging Face sharded checkpoints.

Reading parses the header here (not with the ``safetensors`` package): the 8-byte
little-endian header length, then a JSON object of ``name -> {dtype, shape,
data_offsets}`` plus an optional ``__metadata__`` of string -> string.  Every number is
checked against the file before it is trusted: the header length against the file
size and a 100 MB cap (safetensors' own), each shape's product against 2**62, each
``data_offsets`` pair against the shape x dtype size, and the data ranges must tile
the data section exactly (no gap, no overlap), as safetensors requires.

Writing computes the whole header from the declared specs first, then streams the
tensors, so nothing is held but the tensor being written.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import stat
import struct

import numpy as np

from .. import dtypes as _dtypes
from .._crc import crc32
from ..errors import (
    AprError,
    ChecksumError,
    CorruptError,
    FormatError,
    LayoutError,
    LimitError,
    UnknownDTypeError,
    os_error,
)
from ..io.atomic import AtomicFile, is_set_member, publish_set, set_member_names
from ..tensors import RawTensor
from ._common import (
    DeclaredWriter,
    DestinationExistsError,
    Spec,
    TensorFileSource,
    check_shape_bytes,
    copy_range,
    read_exact,
    reserve,
)
from ._common import write_all as _write_all

__all__ = ["SafetensorsSource", "ShardedSource", "SafetensorsWriter", "ShardedWriter", "open_source",
           "is_safetensors", "ST_DTYPES", "INDEX_NAME", "parse_size", "metadata_to_strings",
           "metadata_from_strings", "parse_index", "read_index", "read_index_with_checks", "check_shard_name",
           "shard_file", "SHARD_CHECKS", "crc32_of_fd"]

#: safetensors dtype name -> aprfast dtype name: every type the installed safetensors
#: (0.8) knows.  Any other name is carried as opaque bytes under its name
#: (dtypes.opaque_dtype).
ST_DTYPES = {"F64": "F64", "F32": "F32", "F16": "F16", "BF16": "BF16", "I64": "I64", "I32": "I32",
             "I16": "I16", "I8": "I8", "U64": "U64", "U32": "U32", "U16": "U16", "U8": "U8", "BOOL": "BOOL",
             "F8_E4M3": "F8_E4M3", "F8_E5M2": "F8_E5M2", "F8_E4M3FNUZ": "F8_E4M3FNUZ",
             "F8_E5M2FNUZ": "F8_E5M2FNUZ", "F8_E8M0": "F8_E8M0", "C64": "C64", "F4": "F4_E2M1",
             "F6_E2M3": "F6_E2M3", "F6_E3M2": "F6_E3M2"}
_TO_ST = {apr: st for st, apr in ST_DTYPES.items()}
#: safetensors refuses headers above 100 MB; so do we, before reading one.
MAX_HEADER = 100_000_000
INDEX_NAME = "model.safetensors.index.json"
#: An index file is a small JSON document; a bigger one is hostile.
MAX_INDEX_BYTES = 64 << 20
#: Key in .apr metadata listing the keys whose values were JSON-encoded on the way to
#: safetensors (whose metadata holds strings only), so the way back decodes exactly those.
JSON_KEYS = "aprfast.json_keys"
#: Key in an index's ``metadata``: each shard's ``{"size", "crc32"}`` (docs/FORMAT.md).
SHARD_CHECKS = "aprfast.shards"


def is_safetensors(head: bytes, size: int) -> bool:
    """True when ``head`` (the first bytes of a file of ``size`` bytes) looks like a
    safetensors file: a header length that fits the file and a JSON object after it."""
    if len(head) < 9:
        return False
    (n,) = struct.unpack_from("<Q", head)
    return 2 <= n <= size - 8 and head[8:9] == b"{"


# --- reading ---------------------------------------------------------------------------
def _no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise CorruptError(f"JSON key {key!r} appears twice")
        out[key] = value
    return out


def _load_json(data: bytes, what: str, path):
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except CorruptError as exc:
        raise CorruptError(f"{what}: {exc.message}", path=path) from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CorruptError(f"{what} is not valid UTF-8 JSON ({type(exc).__name__}: {str(exc)[:200]})",
                           path=path) from None


def _is_uint(value) -> bool:
    return type(value) is int and value >= 0


class SafetensorsSource(TensorFileSource):
    """One ``.safetensors`` file as a tensor stream."""

    kind = "safetensors"

    def _parse(self) -> None:
        size = os.fstat(self._fd).st_size
        (n,) = struct.unpack("<Q", read_exact(self._fd, 0, 8, "the safetensors header length", self.path))
        if n > MAX_HEADER:
            raise LimitError(f"safetensors header length {n} exceeds the {MAX_HEADER}-byte limit", path=self.path)
        if n > size - 8:
            raise CorruptError(f"safetensors header length {n} runs past the end of the {size}-byte file",
                               path=self.path)
        header = _load_json(read_exact(self._fd, 8, n, "the safetensors header", self.path),
                            "safetensors header", self.path)
        if not isinstance(header, dict):
            raise CorruptError(f"safetensors header is a JSON {type(header).__name__}, not an object", path=self.path)
        self.metadata = self._metadata(header.pop("__metadata__", None))
        self._data_start = 8 + n
        entries = [self._entry(name, value) for name, value in header.items()]
        self._check_tiling(entries, size - self._data_start)
        entries.sort(key=lambda e: e[1])  # file order: reads go front to back
        self.specs = [spec for spec, _ in entries]
        self._offsets = {spec.name: begin for spec, begin in entries}

    def _metadata(self, meta) -> dict:
        if meta is None:
            return {}
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise CorruptError("safetensors __metadata__ must be an object of string values", path=self.path)
        return dict(meta)

    def _entry(self, name, value):
        where = f"tensor {name!r}"
        if not isinstance(value, dict):
            raise CorruptError(f"{where}: header entry is not an object", path=self.path)
        st_dtype, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
        if not isinstance(st_dtype, str):
            raise CorruptError(f"{where}: dtype {st_dtype!r} is not a string", path=self.path)
        if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
            raise CorruptError(f"{where}: shape {shape!r} is not a list of non-negative ints", path=self.path)
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_uint(o) for o in offsets)
                or offsets[0] > offsets[1]):
            raise CorruptError(f"{where}: data_offsets {offsets!r} are not [begin, end] with begin <= end",
                               path=self.path)
        if st_dtype not in ST_DTYPES:
            # A dtype aprfast does not know: data_offsets say how big the tensor is, so its
            # bytes travel as they are, under its name (issue 27 item 4); only its values
            # are out of reach (UnknownDTypeError when asked for).
            try:
                dtype = _dtypes.opaque_dtype(st_dtype)
            except UnknownDTypeError as exc:
                raise CorruptError(f"{where}: {exc.message}", path=self.path) from None
            try:
                _dtypes.check_shape(shape, 1, where)
            except LimitError as exc:
                raise LimitError(exc.message, path=self.path) from None
            return Spec(name, dtype, tuple(shape), offsets[1] - offsets[0]), offsets[0]
        dtype = _dtypes.by_name(ST_DTYPES[st_dtype])
        if dtype.name in ("F6_E2M3", "F6_E3M2") and _dtypes.element_count(shape) % 4:
            # safetensors' rule (numel x 6 bits must be whole bytes): its parser refuses these
            raise CorruptError(f"{where}: {st_dtype} of shape {shape} holds {_dtypes.element_count(shape)} "
                               "values, not a multiple of 4, so they do not end on a byte boundary", path=self.path)
        nbytes = check_shape_bytes(name, dtype, shape, self.path)
        if offsets[1] - offsets[0] != nbytes:
            raise CorruptError(f"{where}: {st_dtype} of shape {shape} needs {nbytes} bytes, but data_offsets "
                               f"{offsets} span {offsets[1] - offsets[0]}", path=self.path)
        return Spec(name, dtype, tuple(shape)), offsets[0]

    def _check_tiling(self, entries, data_size: int) -> None:
        """The data ranges must cover the data section exactly once (safetensors' rule)."""
        end = 0
        for spec, begin in sorted(entries, key=lambda e: (e[1], e[0].nbytes)):
            if begin != end:
                kind = "overlaps the previous tensor" if begin < end else f"leaves a gap after offset {end}"
                raise CorruptError(f"tensor {spec.name!r} at data offset {begin} {kind}", path=self.path)
            end = begin + spec.nbytes
        if end != data_size:
            raise CorruptError(f"tensors cover {end} bytes of data but the file holds {data_size} after the header",
                               path=self.path)



# --- shard indexes (any format's weight_map) ----------------------------------------------
def check_shard_name(shard, index_path) -> str:
    """``shard`` if it is a plain file name beside the index (no directory part, not "."
    or "..", no NUL), else CorruptError: a hostile index cannot point elsewhere."""
    if (not isinstance(shard, str) or shard in ("", ".", "..") or "/" in shard or "\\" in shard or "\0" in shard
            or os.path.isabs(shard)):
        raise CorruptError(f"shard name {shard!r:.200} is not a plain file name beside the index", path=index_path)
    return shard


def shard_file(directory: str, shard: str, index_path) -> str:
    """The path of a shard an index names: a plain name (:func:`check_shard_name`) of a
    regular file in ``directory`` (a symlink to one is followed, as Hugging Face's cache
    links its snapshots), else CorruptError; nothing is opened (a FIFO or a device
    would block or never end)."""
    path = os.path.join(directory, check_shard_name(shard, index_path))
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise CorruptError(f"shard {shard!r} listed in the index is missing", path=index_path) from None
    except (OSError, ValueError) as exc:
        raise CorruptError(f"shard {shard!r} listed in the index cannot be looked at ({exc})",
                           path=index_path) from None
    if not stat.S_ISREG(mode):
        raise CorruptError(f"shard {shard!r} listed in the index is not a regular file", path=index_path)
    return path


def parse_index(raw, index_path, kind: str = "a safetensors index") -> dict:
    """The ``weight_map`` (tensor name -> shard file name) of a sharded checkpoint
    index's bytes (``model.safetensors.index.json``, ``pytorch_model.bin.index.json``),
    every field checked before it is used, for local and fetched indexes alike: at most
    MAX_INDEX_BYTES (LimitError); UTF-8 JSON whose nesting and decoded size are bounded
    before it is parsed (``aprfast._metascan``: CorruptError, LimitError); no key twice;
    a ``weight_map`` object of string values (FormatError naming ``kind``), each a plain
    file name (:func:`check_shard_name`, CorruptError)."""
    return _checked_index(_parse_document(raw, index_path), index_path, kind)[0]


def _parse_document(raw, index_path):
    """The JSON document of an index's bytes, size, depth and UTF-8 checked first."""
    if len(raw) > MAX_INDEX_BYTES:
        raise LimitError(f"index file is {len(raw)} bytes, more than {MAX_INDEX_BYTES}", path=index_path)
    from .. import _metascan

    text = _metascan.json_text(bytes(raw), index_path)  # depth, memory budget, UTF-8 checked first
    try:
        index = json.loads(text, object_pairs_hook=_no_duplicates)
    except CorruptError as exc:
        raise CorruptError(f"sharded checkpoint index: {exc.message}", path=index_path) from None
    except (ValueError, RecursionError) as exc:
        raise CorruptError(f"sharded checkpoint index is not valid JSON ({type(exc).__name__}: {str(exc)[:200]})",
                           path=index_path) from None
    return index


def _checked_index(index, index_path, kind: str):
    """(weight_map, shard checks or None) of a parsed index document."""
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise FormatError(f"not {kind}: no \"weight_map\" object of tensor -> shard file name", path=index_path)
    for shard in set(weight_map.values()):
        check_shard_name(shard, index_path)
    return weight_map, _shard_checks(index.get("metadata"), set(weight_map.values()), index_path)


def _shard_checks(metadata, shards: set, index_path):
    """``metadata["aprfast.shards"]`` checked: None when absent (an index another tool
    wrote), else ``{shard: (size, crc32)}`` covering every shard the weight_map names."""
    checks = metadata.get(SHARD_CHECKS) if isinstance(metadata, dict) else None
    if checks is None:
        return None
    where = f"index metadata {SHARD_CHECKS!r}"
    if not isinstance(checks, dict):
        raise CorruptError(f"{where} must be an object of shard -> {{size, crc32}}", path=index_path)
    out = {}
    for shard in sorted(shards):
        entry = checks.get(shard)
        if not isinstance(entry, dict):
            raise CorruptError(f"{where} has no entry for shard {shard!r}", path=index_path)
        size, crc = entry.get("size"), entry.get("crc32")
        if not _is_uint(size) or not isinstance(crc, str) or not _HEX8.fullmatch(crc):
            raise CorruptError(f"{where}[{shard!r}] must be {{\"size\": bytes, \"crc32\": 8 lowercase hex digits}}, "
                               f"not {entry!r:.200}", path=index_path)
        out[shard] = (size, int(crc, 16))
    return out


def read_index(index_path, kind: str = "a safetensors index") -> dict:
    """:func:`parse_index` of the index file at ``index_path`` (its size checked before
    it is read)."""
    return parse_index(_read_index_bytes(index_path), index_path, kind)


def read_index_with_checks(index_path, kind: str = "a safetensors index"):
    """``(weight_map, checks)`` of the index file at ``index_path``: ``checks`` is
    ``{shard: (size, crc32)}`` from ``metadata["aprfast.shards"]`` (every field
    checked), or None when the index has none (written by another tool)."""
    return _checked_index(_parse_document(_read_index_bytes(index_path), index_path), index_path, kind)


def _read_index_bytes(index_path) -> bytes:
    try:
        with open(index_path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_INDEX_BYTES:
                raise LimitError(f"index file is {size} bytes, more than {MAX_INDEX_BYTES}", path=index_path)
            return f.read(MAX_INDEX_BYTES + 1)
    except OSError as exc:
        raise os_error(exc, "cannot read the sharded checkpoint index", path=index_path) from exc


class ShardedSource:
    """A Hugging Face sharded checkpoint (``model.safetensors.index.json`` + shards) as
    one tensor stream.  Shard names must be plain file names beside the index (no
    directories, so a hostile index cannot point elsewhere); every listed shard must
    exist; a tensor may live in one shard only, and the index and the shards' headers
    must agree on which tensors exist.  When the index records each shard's size and
    CRC32 (``metadata["aprfast.shards"]``, as aprfast writes it), each shard's size is
    checked at open and its CRC32 before its first tensor is read: a shard that is not
    the one the index was written with (a mixed set) is refused, named, with
    :class:`~aprfast.errors.ChecksumError` (E004)."""

    def __init__(self, index_path):
        self.path = os.fspath(index_path)
        directory = os.path.dirname(os.path.abspath(self.path))
        self._checks = None
        weight_map = self._weight_map()
        self._shards, self.specs, self.metadata, self._owner = [], [], {}, {}
        self._unchecked = {}  # shard source -> (name, size, crc32) until its CRC is checked
        try:
            self._open_shards(directory, weight_map)
        except BaseException:
            self.close()
            raise

    def _weight_map(self) -> dict:
        weight_map, self._checks = read_index_with_checks(self.path, "a safetensors index")
        return weight_map

    def _open_shards(self, directory: str, weight_map: dict) -> None:
        owner = {}
        for shard in sorted(set(weight_map.values())):
            path = shard_file(directory, shard, self.path)
            if self._checks is not None:  # before its header is parsed: a wrong shard is named as such
                self._check_size(shard, os.stat(path).st_size, path)
            src = SafetensorsSource(path)
            self._shards.append(src)
            if self._checks is not None:
                self._check_size(shard, os.fstat(src._fd).st_size, path)  # the file opened: the same one
                self._unchecked[src] = (shard, self._checks[shard][1])
            for key, value in src.metadata.items():
                self.metadata.setdefault(key, value)
            for spec in src.specs:
                if spec.name in owner:
                    raise CorruptError(f"tensor {spec.name!r} is in two shards: {owner[spec.name]!r} and {shard!r}",
                                       path=self.path)
                if weight_map.get(spec.name) != shard:
                    raise CorruptError(f"tensor {spec.name!r} is in shard {shard!r}, but the index maps it to "
                                       f"{weight_map.get(spec.name)!r}", path=self.path)
                owner[spec.name] = shard
                self._owner[spec.name] = src
                self.specs.append(spec)
        missing = [n for n in weight_map if n not in owner]
        if missing:
            raise CorruptError(f"{len(missing)} tensors listed in the index are in no shard (first: {missing[0]!r})",
                               path=self.path)

    def _check_size(self, shard: str, actual: int, path) -> None:
        size = self._checks[shard][0]
        if actual != size:
            raise ChecksumError(f"shard {shard!r} is {actual} bytes but the index says {size}: it is not the "
                                "shard this index was written with", path=path)

    def _checked(self, src):
        """``src``, its CRC32 checked against the index the first time it is used."""
        if src in self._unchecked:
            shard, crc = self._unchecked[src]
            try:
                actual = crc32_of_fd(src._fd)
            except (OSError, ValueError) as exc:
                raise os_error(exc, f"cannot read shard {shard!r}", path=src.path) from exc
            if actual != crc:
                raise ChecksumError(f"shard {shard!r} has CRC32 {actual:08x} but the index says {crc:08x}: it is "
                                    "not the shard this index was written with", path=src.path)
            del self._unchecked[src]
        return src

    def read(self, spec: Spec, scratch=None):
        return self._checked(self._owner[spec.name]).read(spec, scratch)

    def raw_range(self, spec: Spec):
        return self._checked(self._owner[spec.name]).raw_range(spec)

    def tensors(self, wanted=None):
        for src in self._shards:
            yield from self._checked(src).tensors(wanted)

    def close(self) -> None:
        for src in self._shards:
            src.close()


def open_source(path):
    """A source for a ``.safetensors`` file, an index file or a directory holding one."""
    path = os.fspath(path)
    if os.path.isdir(path):
        index = os.path.join(path, INDEX_NAME)
        if os.path.isfile(index):
            return ShardedSource(index)
        single = os.path.join(path, "model.safetensors")
        if os.path.isfile(single):
            return SafetensorsSource(single)
        raise FormatError(f"directory holds neither {INDEX_NAME} nor model.safetensors", path=path)
    with open(path, "rb") as f:
        head = f.read(16)
    if head.lstrip()[:1] == b"{":
        return ShardedSource(path)
    return SafetensorsSource(path)


# --- metadata --------------------------------------------------------------------------
def metadata_to_strings(metadata: dict) -> dict:
    """safetensors metadata holds strings only: a non-string .apr value is JSON-encoded,
    and the keys encoded are listed (JSON) under ``aprfast.json_keys`` so reading back
    decodes exactly those.  Keys must be strings already (JSON object keys)."""
    out, encoded = {}, []
    for key, value in metadata.items():
        if key == JSON_KEYS:
            continue
        if isinstance(value, str):
            out[key] = value
        else:
            out[key] = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            encoded.append(key)
    if encoded:
        out[JSON_KEYS] = json.dumps(sorted(encoded), separators=(",", ":"))
    return out


def metadata_from_strings(metadata: dict, path=None) -> dict:
    """The inverse of :func:`metadata_to_strings`; other files' strings stay strings."""
    out = dict(metadata)
    listed = out.pop(JSON_KEYS, None)
    if listed is None:
        return out
    keys = _load_json(listed.encode("utf-8"), f"metadata {JSON_KEYS!r}", path)
    if not isinstance(keys, list):
        raise CorruptError(f"metadata {JSON_KEYS!r} must be a JSON list of keys", path=path)
    for key in keys:
        if isinstance(key, str) and key in out:
            out[key] = _load_json(out[key].encode("utf-8"), f"metadata {key!r}", path)
    return out


# --- writing ---------------------------------------------------------------------------
def st_dtype(spec: Spec) -> str:
    """The safetensors name for a spec's dtype, or LayoutError saying what cannot go."""
    if spec.dtype.opaque and spec.dtype.raw_id is None:
        return spec.dtype.name  # a safetensors dtype aprfast does not know, given back by name
    name = _TO_ST.get(spec.dtype.name)
    if name is None:
        raise LayoutError(f"tensor {spec.name!r}: safetensors cannot hold {spec.dtype.name} "
                          "(quantized blocks, complex128 and aprender's types have no safetensors dtype; "
                          "convert with precision='f32' to dequantize)")
    if name == "F4" and spec.nbytes * 2 != _dtypes.element_count(spec.shape):
        raise LayoutError(f"tensor {spec.name!r}: safetensors F4 needs an even element count, "
                          f"shape {list(spec.shape)} has an odd one")
    if name in ("F6_E2M3", "F6_E3M2") and _dtypes.element_count(spec.shape) % 4:
        raise LayoutError(f"tensor {spec.name!r}: safetensors {name} needs an element count that is a multiple "
                          f"of 4 (whole bytes), shape {list(spec.shape)} holds {_dtypes.element_count(spec.shape)}")
    return name


def header_bytes(specs, metadata: dict) -> bytes:
    """The whole header (length prefix included) for ``specs`` in that data order,
    padded with spaces to a multiple of 8 as safetensors pads it."""
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for spec in specs:
        header[spec.name] = {"dtype": st_dtype(spec), "shape": list(spec.shape),
                             "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def tensor_bytes(spec: Spec, value) -> memoryview:
    """The little-endian bytes of ``value``, checked against the declared spec."""
    if isinstance(value, RawTensor):
        dtype, shape, data = value.dtype, value.shape, value.data
    else:
        array = np.asarray(value)
        dtype, shape = _dtypes.from_numpy(array.dtype), array.shape
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    if dtype is not spec.dtype or tuple(shape) != tuple(spec.shape) or data.nbytes != spec.nbytes:
        raise LayoutError(f"tensor {spec.name!r} is {getattr(dtype, 'name', dtype)} {list(shape)}, but "
                          f"{spec.dtype.name} {list(spec.shape)} was declared")
    return memoryview(data)


class SafetensorsWriter(DeclaredWriter):
    """Writes one ``.safetensors`` file: the header from the declared specs at once,
    then each tensor as it is added, in the declared order.  Atomic like aprfast's own
    writes: nothing replaces ``path`` unless ``close()`` is reached."""

    def __init__(self, path, specs, metadata=None, *, durable: bool = True):
        self.specs = list(specs)
        self._next = 0
        self._atomic = AtomicFile(path, durable=durable)
        try:
            header = header_bytes(self.specs, metadata_to_strings(metadata or {}))
            reserve(self._atomic.fd, len(header) + sum(spec.nbytes for spec in self.specs), durable, path)
            _write_all(self._atomic.fd, header)
        except BaseException:
            self.abort()
            raise

    def add(self, name: str, value) -> None:
        spec = self._expect(name)
        _write_all(self._atomic.fd, tensor_bytes(spec, value))
        self._next += 1

    def add_range(self, name: str, fd: int, offset: int) -> None:
        """The next declared tensor, copied unchanged from ``fd`` at ``offset``."""
        spec = self._expect(name)
        copy_range(fd, offset, spec.nbytes, self._atomic.fd, f"tensor {name!r}")
        self._next += 1




_HEX8 = re.compile(r"[0-9a-f]{8}")
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", re.IGNORECASE)


def parse_size(value) -> int:
    """Bytes from an int or a transformers-style size: "5GB" (10**9), "500MiB" (2**20)."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        match = _SIZE.fullmatch(str(value))
        if not match:
            raise ValueError(f"max_shard_size {value!r} is not a size such as 5000000000, '5GB' or '2GiB'")
        unit = match.group(2).upper().rstrip("B")
        base = 1024 if unit.endswith("I") else 1000
        size = int(float(match.group(1)) * base ** " KMGT".index(unit.rstrip("I") or " "))
    if size < 1:
        raise ValueError(f"max_shard_size must be positive, not {value!r}")
    return size


def shard_groups(specs, max_size: int) -> list:
    """Specs split in order the way huggingface_hub splits a state dict: a new shard
    when the next tensor would overflow the current one; a tensor bigger than the limit
    gets a shard of its own."""
    groups, size = [[]], 0
    for spec in specs:
        if groups[-1] and size + spec.nbytes > max_size:
            groups.append([])
            size = 0
        groups[-1].append(spec)
        size += spec.nbytes
    return groups


def shard_name(i: int, n: int) -> str:
    """transformers' names: model-00001-of-00003.safetensors."""
    return f"model-{i:05d}-of-{n:05d}.safetensors"


class ShardedWriter:
    """A sharded checkpoint in ``directory``: shards named as transformers names them
    and ``model.safetensors.index.json`` (``{"metadata": {"total_size", "aprfast.shards"},
    "weight_map"}``, keys sorted, indent 2).  One shard is written as
    ``model.safetensors`` without an index, as transformers does.

    The set is published atomically (:func:`aprfast.io.atomic.publish_set`; layout in
    docs/FORMAT.md): each shard is written and staged under a locked temporary name;
    at :meth:`close` they are renamed to names the live index does not use (the
    canonical ``model-0000N-of-0000M.safetensors``, or the same with a tag,
    ``model-0000N-of-0000M.{8 hex}.safetensors``, when the live checkpoint has those),
    the index is renamed over the old one, and only then are the old shards removed.
    A reader, or a conversion killed at any moment, sees the old checkpoint whole or
    the new one.  The index records each shard's size and CRC32 under
    ``metadata["aprfast.shards"]``, which :class:`ShardedSource` checks."""

    def __init__(self, directory, specs, metadata=None, *, max_shard_size, force=False, durable=True):
        self.directory = os.fspath(directory)
        self._groups = shard_groups(list(specs), parse_size(max_shard_size))
        n = len(self._groups)
        self._force = force
        self._check_free(force, n)
        index_path = os.path.join(self.directory, INDEX_NAME)
        self._names = ["model.safetensors"] if n == 1 else \
            set_member_names("model", ".safetensors", n, _live_shards(index_path))
        self._metadata, self._durable = metadata or {}, durable
        self._created = not os.path.isdir(self.directory)  # removed again by abort() when left empty
        os.makedirs(self.directory, exist_ok=True)
        self._staged, self._checks, self._current, self._shard = [], [], None, -1
        self._total = sum(s.nbytes for g in self._groups for s in g)

    def _check_free(self, force: bool, n: int) -> None:
        if force:
            return
        # one shard with an index there would leave the old checkpoint the one readers take
        names = ["model.safetensors", INDEX_NAME] if n == 1 else [shard_name(i + 1, n) for i in range(n)] + [INDEX_NAME]
        for name in names:
            target = os.path.join(self.directory, name)
            if os.path.lexists(target):
                raise DestinationExistsError(f"{name} exists in the destination directory; pass force=True "
                                             "to replace it", path=target)

    def add(self, name: str, value) -> None:
        if self._current is None or self._current._next == len(self._current.specs):
            self._open_next()
        self._current.add(name, value)

    def add_range(self, name: str, fd: int, offset: int) -> None:
        if self._current is None or self._current._next == len(self._current.specs):
            self._open_next()
        self._current.add_range(name, fd, offset)

    def _open_next(self) -> None:
        if self._current is not None:
            self._stage_current()
        self._shard += 1
        if self._shard >= len(self._groups):
            raise LayoutError("more tensors added than were declared")
        path = os.path.join(self.directory, self._names[self._shard])
        self._current = SafetensorsWriter(path, self._groups[self._shard], self._metadata, durable=self._durable)

    def _stage_current(self) -> None:
        """The finished shard, staged (locked temporary name), with its size and CRC32."""
        writer, self._current = self._current, None
        atomic = writer.finish()
        self._staged.append(atomic)
        atomic.stage()
        self._checks.append({"size": os.fstat(atomic.fd).st_size, "crc32": f"{crc32_of_fd(atomic.fd):08x}"})

    def close(self) -> None:
        try:
            while self._shard < len(self._groups) - 1 or self._current is None:
                self._open_next()  # a declared shard with nothing added fails in its finish()
            if len(self._names) == 1:
                writer, self._current = self._current, None
                writer.close()
                self._retire_index()
            else:
                self._stage_current()
                self._publish()
        except BaseException:
            self.abort()
            raise
        self._staged = []

    def _publish(self) -> None:
        weight_map = {s.name: self._names[i] for i, g in enumerate(self._groups) for s in g}
        checks = dict(zip(self._names, self._checks))
        index = {"metadata": {"total_size": self._total, SHARD_CHECKS: checks}, "weight_map": weight_map}
        atomic = AtomicFile(os.path.join(self.directory, INDEX_NAME), durable=self._durable)
        try:
            _write_all(atomic.fd, (json.dumps(index, indent=2, sort_keys=True) + "\n").encode("utf-8"))
            atomic.stage()
        except BaseException:
            atomic.abort()
            raise
        keep, force = set(self._names), self._force
        staged, self._staged = self._staged, []

        def obsolete(directory):
            # the superseded shards; without force=True only tagged ones (a killed
            # conversion's): an untagged name no index names may be someone else's file
            return [n for n in _listdir(directory)
                    if n not in keep and is_set_member(n, "model", ".safetensors", tagged_only=not force)]
        publish_set(staged, atomic, obsolete=obsolete, durable=self._durable)

    def _retire_index(self) -> None:
        """A one-shard write (``model.safetensors``) over a sharded checkpoint: the index
        is removed once the new file is in place (readers of the directory then take the
        new file; before, the old checkpoint, whole), then its shards."""
        index = os.path.join(self.directory, INDEX_NAME)
        if not os.path.lexists(index):
            return
        try:
            os.unlink(index)
        except FileNotFoundError:
            pass
        for name in _listdir(self.directory):
            if is_set_member(name, "model", ".safetensors"):
                try:
                    os.unlink(os.path.join(self.directory, name))
                except OSError:
                    pass

    def abort(self) -> None:
        """Discard the shards written so far: a failed export leaves no partial
        checkpoint, and the live one (if any) untouched."""
        if self._current is not None:
            self._current.abort()
            self._current = None
        for atomic in self._staged:
            atomic.abort()
        self._staged = []
        if self._created:
            try:
                os.rmdir(self.directory)
            except OSError:  # something else was put there meanwhile: not ours to remove
                pass


def _listdir(directory: str) -> list:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _live_shards(index_path: str) -> set:
    """The shard names the index at ``index_path`` names (none when there is no
    readable index: then no reader opens any of them as part of a set)."""
    if not os.path.lexists(index_path):
        return set()
    try:
        return set(read_index(index_path).values())
    except AprError:
        return set()


def crc32_of_fd(fd: int) -> int:
    """The CRC32 (IEEE, as zlib) of the whole file open at ``fd``."""
    size = os.fstat(fd).st_size
    if not size:
        return 0
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as m:
        with memoryview(m) as view:
            return crc32(view)
