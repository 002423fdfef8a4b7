"""Sharded ``.apr`` models (seed 001 §3.8): several complete ``.apr`` files plus a JSON
manifest, written as a set and read as one model.

Files, for ``save_file(tensors, "out/model.apr", max_shard_size=...)``::

    out/model-00001-of-00003.apr   every shard a complete .apr file (any layout)
    out/model-00002-of-00003.apr
    out/model-00003-of-00003.apr
    out/model.apr.index.json       the manifest, switched last

Over a live set that already uses those names the shards are named
``model-00001-of-00003.{8 hex}.apr`` instead (see :func:`save_sharded`): a set is
published whole, never shard by shard over the shards a reader may be opening.

The manifest (docs/FORMAT.md has the field table)::

    {"apr_version": "2.0.0", "sharded": true, "shard_count": 3,
     "shards": [{"file": "model-00001-of-00003.apr", "size": 1234, "crc32": "89abcdef"}, ...],
     "tensor_shard_map": {"encoder.conv1.weight": 0, ...},
     "metadata": {...}}

``size`` is the shard file's byte count, ``crc32`` the CRC32 (IEEE, as zlib) of all its
bytes but the last four (for an aprender-layout shard: its footer CRC; see
:func:`_size_and_crc`) as 8 lowercase hex digits, ``tensor_shard_map`` each tensor's 0-based position in
``shards``, ``metadata`` the caller's metadata (each shard also carries it, plus
aprender's ``sharding`` object).  ``file`` is a bare file name in the manifest's
directory: a path, an absolute name or ``..`` is refused.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import stat
import threading

from .. import _metascan
from .._crc import crc32, crc32_combine
from ..errors import (
    AprError,
    AprIOError,
    ChecksumError,
    CorruptError,
    FormatError,
    LayoutError,
    LimitError,
    TensorNotFoundError,
    os_error,
)
from ..io.atomic import AtomicFile, is_set_member, publish_set, set_member_names
from ..limits import Limits
from .handle import TensorMapping

__all__ = ["MANIFEST_SUFFIX", "ShardedFile", "save_sharded", "find_manifest", "find_remote_manifest",
           "fetch_manifest", "RemoteManifest", "parse_size"]

MANIFEST_SUFFIX = ".apr.index.json"
APR_VERSION = "2.0.0"
#: A manifest is a name per tensor plus a line per shard; beyond this it is refused unread.
MAX_MANIFEST_SIZE = 256 * 1024 * 1024
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*")
_HEX8 = re.compile(r"[0-9a-f]{8}")
#: The manifest's crc32 covers every shard byte but these last ones (see _size_and_crc).
_CRC_TAIL = 4
_KEYS = ("apr_version", "sharded", "shard_count", "shards", "tensor_shard_map")


# --- names ---------------------------------------------------------------------------
def parse_size(value) -> int:
    """``max_shard_size`` as bytes: an int, or a string such as "500MB" / "2GiB"."""
    if isinstance(value, bool):
        raise TypeError("max_shard_size must be an int or a size string, not a bool")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str):
        match = _SIZE.fullmatch(value)
        unit = match and _UNITS.get(match.group(2).upper())
        if not unit:
            raise ValueError(f"max_shard_size {value!r} is not a size (e.g. 500000000, '500MB', '2GiB')")
        size = int(match.group(1)) * unit
    else:
        raise TypeError(f"max_shard_size must be an int or a size string, not {type(value).__name__}")
    if size <= 0:
        raise ValueError(f"max_shard_size must be positive, not {value!r}")
    return size


def _stem(path: str) -> str:
    base = os.path.basename(path)
    return base[:-4] if base.endswith(".apr") else base


def shard_name(stem: str, index: int, count: int) -> str:
    """``{stem}-0000N-of-0000M.apr``, N 1-based (seed 001 §3.8's file names)."""
    return f"{stem}-{index + 1:05d}-of-{count:05d}.apr"


def manifest_path_for(path) -> str:
    """Where ``save_file(..., path, max_shard_size=...)`` puts the manifest."""
    path = os.fspath(path)
    return os.path.join(os.path.dirname(path), _stem(path) + MANIFEST_SUFFIX)


def find_manifest(target):
    """The manifest ``target`` names, or None when it names a single file: a directory
    holding one ``*.apr.index.json`` (several: FormatError), a path ending in ``.json``, or a missing
    ``x.apr`` whose ``x.apr.index.json`` exists (what a sharded save_file to ``x.apr``
    left).  Decided by name and a stat, so opening a single file reads nothing more."""
    if not isinstance(target, (str, os.PathLike)):
        return None
    path = os.fspath(target)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if path.endswith(".json"):
        return path
    try:  # one stat answers both "a directory?" and "does it exist?"
        kind = os.stat(path).st_mode
    except (OSError, ValueError):
        kind = None
    if kind is not None and stat.S_ISDIR(kind):
        return _manifest_in(path)
    if not path.endswith(".apr") or kind is not None:
        return None
    candidate = manifest_path_for(path)
    return candidate if os.path.isfile(candidate) else None


# --- sharded models at a URL -------------------------------------------------------------
#: ``{stem}-00001-of-0000N.apr``: the first shard of a set (N of at least 2).
_FIRST_SHARD = re.compile(r"(.+)-00001-of-(\d{5})\.apr")


class RemoteManifest:
    """A manifest fetched from a URL: its URL, bytes and version (ETag / Last-Modified
    as the remote source learnt it; what a pickled handle is checked against)."""

    def __init__(self, url: str, raw: bytes, version):
        self.url, self.raw, self.version = url, raw, version


def _url_base(url: str) -> str:
    """The "directory" of an object URL (query and fragment dropped), ending in "/"."""
    return url.split("#", 1)[0].split("?", 1)[0].rsplit("/", 1)[0] + "/"


def _url_name(url: str) -> str:
    return url.split("#", 1)[0].split("?", 1)[0].rsplit("/", 1)[-1]


def fetch_manifest(url: str, storage_options=None) -> RemoteManifest:
    """The manifest object at ``url`` (one request when it fits the first 64 KiB a remote
    source reads), refused unread above MAX_MANIFEST_SIZE."""
    from ..io.sources import open_source

    source = open_source(url, mode="pread", storage_options=storage_options)
    try:
        if source.size > MAX_MANIFEST_SIZE:
            raise LimitError(f"shard manifest of {source.size} bytes exceeds {MAX_MANIFEST_SIZE}",
                             path=_redact(url))
        raw = bytes(source.read(0, source.size, "shard manifest"))
        return RemoteManifest(url, raw, getattr(source, "version", None))
    finally:
        source.close()


def find_remote_manifest(url: str, storage_options=None):
    """The manifest a URL names, or None when it names a single file, decided by name:
    a URL ending in ``.json`` is a manifest (returned as is, fetched when opened); the
    first shard of a set, ``{stem}-00001-of-0000N.apr``, stands for the whole model when
    ``{stem}.apr.index.json`` is next to it (fetched here: one request; when it is
    missing the shard opens as a single file).  A URL ``x.apr`` with no object behind
    it is tried as ``x.apr.index.json`` by the caller (:func:`manifest_url_for_missing`),
    so a single file costs no extra request."""
    name = _url_name(url)
    if name.endswith(".json"):
        return url
    m = _FIRST_SHARD.fullmatch(name)
    if m is None or int(m.group(2)) < 2:
        return None
    from ..errors import AprFileNotFoundError

    try:
        return fetch_manifest(_url_base(url) + m.group(1) + MANIFEST_SUFFIX, storage_options)
    except AprFileNotFoundError:
        return None


def manifest_url_for_missing(url: str):
    """Where a sharded save of ``x.apr`` put its manifest, for a URL ``x.apr`` (else None)."""
    name = _url_name(url)
    return _url_base(url) + name[:-4] + MANIFEST_SUFFIX if name.endswith(".apr") and len(name) > 4 else None


def _manifest_in(directory: str):
    try:
        found = sorted(n for n in os.listdir(directory) if n.endswith(MANIFEST_SUFFIX))
    except OSError as exc:
        raise os_error(exc, "cannot list the directory", path=directory) from exc
    if not found:
        return None  # not a sharded model: opened as a file, which the OS refuses (E007)
    if len(found) > 1:
        raise FormatError(f"directory holds {len(found)} *{MANIFEST_SUFFIX} manifests ({', '.join(found)}); "
                          "give the manifest's path", path=directory)
    return os.path.join(directory, found[0])


# --- writing ---------------------------------------------------------------------------
def split(inputs, max_bytes: int) -> list:
    """Inputs grouped into shards in the given order: a shard is closed when the next
    tensor would take it past ``max_bytes`` of tensor data; a tensor larger than
    ``max_bytes`` gets a shard of its own."""
    groups, current, used = [], [], 0
    for t in inputs:
        if current and used + t.nbytes > max_bytes:
            groups.append(current)
            current, used = [], 0
        current.append(t)
        used += t.nbytes
    if current or not groups:
        groups.append(current)
    return groups


def save_sharded(inputs, path, metadata, max_shard_size, *, plan_shard, write_plan, durable: bool = True):
    """Write ``inputs`` as shards of at most ``max_shard_size`` tensor bytes plus the
    manifest; return the manifest's path, or None when everything fit one shard (then
    ``path`` is written as a plain file).  ``plan_shard(inputs, metadata)`` lays out one
    file, ``write_plan(atomic, plan)`` writes it into an :class:`~aprfast.io.atomic.AtomicFile`
    (without committing it).

    The set is published atomically (:func:`aprfast.io.atomic.publish_set`): every
    shard is written and staged under a locked temporary name, then renamed to a name
    the live manifest does not use (``{stem}-0000N-of-0000M.apr``, or the same with a
    tag, ``...-of-0000M.{8 hex}.apr``, when the live set has those names), then the
    manifest is renamed over the old one, and only then are the old shards (and any
    shard file of this stem no manifest names: a killed save's) removed.  A reader,
    or a process killed at any moment, sees the old model whole or the new one."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError("max_shard_size needs a path to write the shards next to, not a file object")
    metadata = dict(metadata or {})
    if "sharding" in metadata:
        raise LayoutError("metadata key 'sharding' is written by the sharded writer; remove it")
    groups = split(inputs, parse_size(max_shard_size))
    path = os.fspath(path)
    if len(groups) == 1:
        atomic = AtomicFile(path, durable=durable)
        try:
            write_plan(atomic, plan_shard(groups[0], metadata))
        except BaseException:
            atomic.abort()
            raise
        atomic.commit()
        return None
    directory, stem, count = os.path.dirname(path) or ".", _stem(path), len(groups)
    final_manifest = manifest_path_for(path)
    names = set_member_names(stem, ".apr", count, _live_shard_names(final_manifest))
    tag = names[0][len(stem) + len("-00001-of-00000"):-len(".apr")]  # "" or ".{8 hex}"
    total = sum(t.nbytes for t in inputs)
    staged = []
    try:
        shards = []
        for i, group in enumerate(groups):
            shard_meta = dict(metadata, sharding={"shard_count": count, "shard_index": i, "total_size": total,
                                                  "pattern": f"{stem}-{{index:05}}-of-{{count:05}}{tag}.apr"})
            atomic = AtomicFile(os.path.join(directory, names[i]), durable=durable)
            staged.append(atomic)
            write_plan(atomic, plan_shard(group, shard_meta))
            atomic.stage()
            size, crc = _size_and_crc_fd(atomic.fd)
            shards.append({"file": names[i], "size": size, "crc32": f"{crc:08x}"})
        manifest = {"apr_version": APR_VERSION, "sharded": True, "shard_count": count, "shards": shards,
                    "tensor_shard_map": {t.name: i for i, g in enumerate(groups) for t in g},
                    "metadata": metadata}
        blob = json.dumps(manifest, indent=2, sort_keys=False, ensure_ascii=False).encode("utf-8")
        index = AtomicFile(final_manifest, durable=durable)
        staged.append(index)
        _write_all(index.fd, blob)
        index.stage()
        keep = set(names)
        publish_set(staged[:-1], index, durable=durable,
                    obsolete=lambda d: [n for n in _listdir(d) if n not in keep and is_set_member(n, stem, ".apr")])
    except BaseException as exc:
        for atomic in staged:
            atomic.abort()
        if isinstance(exc, OSError) and not isinstance(exc, AprError):
            raise os_error(exc, "cannot write the shards", path=path) from exc
        raise
    return final_manifest


def _live_shard_names(manifest_path: str) -> set:
    """The shard files the manifest at ``manifest_path`` names (none when there is no
    readable manifest: then no reader can open any of them as part of a set)."""
    try:
        return {shard["file"] for shard in read_manifest(manifest_path, Limits())["shards"]}
    except AprError:
        return set()


def _listdir(directory: str) -> list:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while len(view):
        view = view[os.write(fd, view):]


def _size_and_crc_fd(fd: int):
    """:func:`_size_and_crc` of an open file."""
    size = os.fstat(fd).st_size
    if size <= _CRC_TAIL:
        return size, crc32(b"")
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as m:
        with memoryview(m) as view:
            body = view[:size - _CRC_TAIL]
            try:
                return size, crc32(body)
            finally:
                body.release()


def _size_and_crc(path: str):
    """The shard's size and the CRC32 of all its bytes but the last four.

    Not the whole file: a file that ends with the CRC32 of everything before it (the
    aprender layout's footer) has the same whole-file CRC as any other such file
    (CRC-32's residue, 0x2144df1c), which would name no shard.  Without its last four
    bytes an aprender shard's CRC is its footer's, and the last four are checked by the
    shard's own footer CRC (aprender) or file-size field (APR2)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= _CRC_TAIL:
            return size, crc32(f.read(0))
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            with memoryview(m) as view:
                body = view[:size - _CRC_TAIL]
                try:
                    return size, crc32(body)
                finally:
                    body.release()


# --- the manifest ----------------------------------------------------------------------
def read_manifest(path: str, limits: Limits) -> dict:
    """The manifest at ``path``, every field checked (CorruptError naming the field)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_MANIFEST_SIZE:
                raise LimitError(f"shard manifest of {size} bytes exceeds {MAX_MANIFEST_SIZE}", path=path)
            raw = f.read()
    except OSError as exc:
        raise os_error(exc, "cannot read the shard manifest", path=path) from exc
    return parse_manifest(raw, limits, path)


def parse_manifest(raw, limits: Limits, path) -> dict:
    """The manifest in ``raw`` (its bytes), every field checked."""
    raw = bytes(raw)
    text = _metascan.json_text(raw, path)  # depth, memory budget and UTF-8 checked before parsing
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant)
    except ValueError as exc:
        raise CorruptError(f"shard manifest is not valid JSON: {exc}", path=path) from None
    return _checked_manifest(value, limits, path, len(raw))


def _no_duplicate_keys(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice")
        out[key] = value
    return out


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def _checked_manifest(value: dict, limits: Limits, path, size: int) -> dict:
    missing = [k for k in _KEYS if k not in value]
    if missing:
        raise CorruptError(f"shard manifest lacks {', '.join(missing)}", path=path)
    if value["sharded"] is not True:
        raise CorruptError(f"shard manifest says sharded={value['sharded']!r}", path=path)
    count, shards, where = value["shard_count"], value["shards"], value["tensor_shard_map"]
    if not _is_count(count) or count < 1:
        raise CorruptError(f"shard manifest: shard_count must be a positive integer, not {count!r}", path=path)
    if not isinstance(shards, list) or len(shards) != count:
        raise CorruptError(f"shard manifest: shard_count {count} but shards lists "
                           f"{len(shards) if isinstance(shards, list) else type(shards).__name__}", path=path)
    if not isinstance(where, dict):
        raise CorruptError("shard manifest: tensor_shard_map must be an object", path=path)
    if len(where) > limits.max_tensor_count:
        raise LimitError(f"shard manifest maps {len(where)} tensors, above the limit of {limits.max_tensor_count} "
                         "(aprfast.limits.MAX_TENSOR_COUNT)", path=path)
    if count > max(len(where), 1):  # the writer never writes an empty shard; each shard costs a stat at open
        raise CorruptError(f"shard manifest lists {count} shards for {len(where)} tensors", path=path)
    checked = [_checked_shard(i, s, path) for i, s in enumerate(shards)]
    files = [s["file"] for s in checked]
    if len(set(files)) != len(files):
        raise CorruptError(f"shard manifest lists a shard file twice: {files}", path=path)
    for name, index in where.items():
        if not _is_count(index) or index >= count:
            raise CorruptError(f"shard manifest: tensor {name!r} maps to shard {index!r}, not one of 0..{count - 1}",
                               path=path)
    metadata = value.get("metadata", {})
    if not isinstance(metadata, dict):
        raise CorruptError("shard manifest: metadata must be an object", path=path)
    return {"shards": checked, "tensor_shard_map": where, "metadata": metadata, "apr_version": value["apr_version"],
            "size": size}


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _checked_shard(i: int, shard, path) -> dict:
    if not isinstance(shard, dict) or not all(k in shard for k in ("file", "size", "crc32")):
        raise CorruptError(f"shard manifest: shards[{i}] must be an object with file, size and crc32", path=path)
    name, size, crc = shard["file"], shard["size"], shard["crc32"]
    if not isinstance(name, str) or not _plain_file_name(name):
        raise CorruptError(f"shard manifest: shards[{i}].file {name!r} is not a plain file name in the manifest's "
                           "directory", path=path)
    if not _is_count(size):
        raise CorruptError(f"shard manifest: shards[{i}].size must be a byte count, not {size!r}", path=path)
    if not isinstance(crc, str) or not _HEX8.fullmatch(crc):
        raise CorruptError(f"shard manifest: shards[{i}].crc32 must be 8 lowercase hex digits, not {crc!r}",
                           path=path)
    return {"file": name, "size": size, "crc32": int(crc, 16)}


def _plain_file_name(name: str) -> bool:
    """A name that stays in the manifest's directory on every platform: no separator,
    no drive, not "." or "..", no NUL."""
    return (bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name
            and "\x00" not in name and ":" not in name and not os.path.isabs(name))


# --- reading -----------------------------------------------------------------------------
class ShardedFile(TensorMapping):
    """A sharded model read as one: the manifest at open (each shard's presence and size
    checked with a stat), each shard opened only when a tensor in it is asked for.
    Same methods as :class:`aprfast.files.reader.AprFile`.

    ``open_one(target, **open_options)`` opens one shard as a single file, whatever its
    name (so a shard named like a first shard is never taken for the whole set): the
    API layer above passes its opener in, since the readers stand above this module.
    :func:`aprfast.open` returns one for a manifest, or for the path given to
    ``save_file(..., max_shard_size=)``.  docs/guide/sharding.md shows it in use.

    Args:
        manifest_path: The manifest's path or URL (or a fetched :class:`RemoteManifest`).
        open_one: ``open_one(target, **options)``: opens one shard as a single file.
        open_options: Keyword arguments for ``open_one`` (keys, mode, ...).
        limits: An :class:`aprfast.Limits` bounding what the parsers believe.
        storage_options: fsspec options for a URL.

    Raises:
        FormatError: A manifest that is not JSON or not a manifest.
        CorruptError: A manifest whose fields contradict each other or name unsafe files.
        LimitError: A manifest beyond ``limits``.
        ChecksumError: A shard whose size is not the manifest's.
        AprIOError: A missing or unreadable shard (AprFileNotFoundError when missing).

    Examples:
        >>> import numpy as np, aprfast
        >>> aprfast.save_file({"a": np.zeros(4, np.float32), "b": np.ones(4, np.float32)},
        ...                   "model.apr", max_shard_size=16)
        >>> with aprfast.open("model.apr") as f:
        ...     type(f).__name__, f.keys(), f.get_tensor("b").tolist(), f.opened_shards()
        ('ShardedFile', ['a', 'b'], [1.0, 1.0, 1.0, 1.0], ['model-00002-of-00002.apr'])
    """

    layout = "sharded"
    security = None

    def __init__(self, manifest_path, *, open_one, open_options: dict, limits: Limits | None = None,
                 storage_options=None):
        self._open_one = open_one
        #: a manifest at a URL (http(s), fsspec, hf): shards are objects next to it, opened
        #: lazily as remote handles (one per shard, kept); sizes are checked when a shard
        #: is opened (its first request says its length), not with a request per shard at open
        self._remote = isinstance(manifest_path, RemoteManifest) or _is_url(manifest_path)
        self.manifest_version = None
        if self._remote:
            fetched = manifest_path if isinstance(manifest_path, RemoteManifest) else \
                fetch_manifest(manifest_path, storage_options)
            self._path = _redact(fetched.url)  # what path= and messages show: no userinfo, no query
            self._dir = _url_base(fetched.url)  # what shards are requested under
            self.manifest_version = fetched.version
            self._options = dict(open_options, limits=limits, storage_options=storage_options)
            manifest = parse_manifest(fetched.raw, limits or Limits(), self._path)
        else:
            self._path = os.fspath(manifest_path)
            self._dir = os.path.dirname(os.path.abspath(self._path))
            self._options = dict(open_options, limits=limits)
            manifest = read_manifest(self._path, limits or Limits())
        self._manifest_size = manifest["size"]
        self._shards = manifest["shards"]
        self._where = manifest["tensor_shard_map"]
        self._metadata = manifest["metadata"]
        self._version = manifest["apr_version"]
        self._names = sorted(self._where, key=lambda n: n.encode("utf-8", "surrogatepass"))
        self._open = {}
        self._opening = threading.Lock()  # two threads asking for one shard must not open it twice
        self._closed = False
        if self._remote:
            for shard in self._shards:
                _check_url_name(shard["file"], self._path)
        else:
            for shard in self._shards:
                self._check_size(shard)

    def _shard_path(self, shard) -> str:
        if self._remote:
            return self._dir + _url_part(shard["file"], self._dir)
        return os.path.join(self._dir, shard["file"])

    def _shown(self, shard) -> str:
        """The shard's path as errors show it (a URL redacted)."""
        return _redact(self._shard_path(shard)) if self._remote else self._shard_path(shard)

    def _check_size(self, shard) -> None:
        if self._remote:
            return  # checked against the opened shard's length (_check_remote_size)
        path = self._shard_path(shard)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError as exc:
            raise os_error(exc, f"shard {shard['file']!r} named by the manifest is missing",
                           path=path) from exc
        except OSError as exc:
            raise os_error(exc, f"cannot stat shard {shard['file']!r}", path=path) from exc
        if size != shard["size"]:
            raise ChecksumError(f"shard {shard['file']!r} is {size} bytes but the manifest says {shard['size']}",
                                path=path)

    # --- what the model holds -------------------------------------------------------
    @property
    def path(self):
        """The manifest's path or URL."""
        return self._path

    @property
    def metadata(self) -> dict:
        """The manifest's ``metadata`` (the caller's, as saved), a copy."""
        return dict(self._metadata)

    stored_metadata = metadata

    @property
    def header(self) -> dict:
        """The manifest's summary, with the keys a single file's header has (``magic``,
        ``version``, ``flags``, ``file_size``: all shards' bytes, ``metadata_size``: the
        manifest's bytes) so reports built for files show a sharded model too.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"a": np.zeros(4, np.float32), "b": np.ones(4, np.float32)},
            ...                   "model.apr", max_shard_size=16)
            >>> with aprfast.open("model.apr") as f:
            ...     f.header["magic"], f.header["shard_count"], f.header["shards"][0]["file"]
            ('manifest', 2, 'model-00001-of-00002.apr')
        """
        return {"magic": "manifest", "version": self._version, "flags": 0, "flag_names": [],
                "file_size": sum(s["size"] for s in self._shards), "metadata_size": self._manifest_size,
                "apr_version": self._version, "shard_count": len(self._shards),
                "shards": [{"file": s["file"], "size": s["size"], "crc32": f"{s['crc32']:08x}"}
                           for s in self._shards]}

    def keys(self) -> list:
        """Every tensor name of every shard, sorted (UTF-8 byte order); opens no shard."""
        return list(self._names)

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name) -> bool:
        return name in self._where

    def shard_of(self, name: str) -> str:
        """The file name of the shard holding ``name`` (from the manifest: opens nothing).

        Args:
            name: The tensor's name.

        Returns:
            The shard's file name, relative to the manifest's directory.

        Raises:
            TensorNotFoundError: No tensor ``name``.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"a": np.zeros(4, np.float32), "b": np.ones(4, np.float32)},
            ...                   "model.apr", max_shard_size=16)
            >>> with aprfast.open("model.apr") as f:
            ...     f.shard_of("b")
            'model-00002-of-00002.apr'
        """
        return self._shards[self._index_of(name)]["file"]

    def _index_of(self, name) -> int:
        try:
            return self._where[name]
        except (KeyError, TypeError):
            shown = ", ".join(repr(n) for n in self._names[:8]) + (", ..." if len(self._names) > 8 else "")
            raise TensorNotFoundError(f"no tensor named {name!r}; the model has {len(self._names)}: {shown}",
                                      path=self._path) from None

    def _file_for(self, name):
        return self._shard(self._index_of(name))

    def _shard(self, index: int):
        """Shard ``index``, opened (and its tensor list checked against the manifest) on first use."""
        f = self._open.get(index)
        if f is not None and not self._closed:
            return f
        with self._opening:
            return self._open_shard(index)

    def _open_shard(self, index: int):
        if self._closed:
            raise AprIOError("the sharded model is closed", path=self._path)
        f = self._open.get(index)
        if f is None:
            shard = self._shards[index]
            self._check_size(shard)  # may have changed since the manifest was read
            target = self._shard_path(shard)
            if self._remote:
                # the object's length (learnt by its first request) against the manifest
                # before its header is parsed, so a wrong shard is named as such
                from ..io.sources import open_source

                options = dict(self._options)
                target = open_source(target, mode=options.pop("mode", None),
                                     storage_options=options.pop("storage_options", None))
                try:
                    self._check_remote_size(shard, target)
                    f = self._open_one(target, **options)
                except BaseException:
                    target.close()
                    raise
            else:
                f = self._open_one(target, **self._options)
            try:
                if not self._remote:
                    self._check_stored_crc(index, f)
                self._check_contents(index, f)
            except BaseException:
                f.close()
                raise
            self._open[index] = f
        return f

    def _check_remote_size(self, shard, source) -> None:
        size = source.size
        if size != shard["size"]:
            raise ChecksumError(f"shard {shard['file']!r} is {size} bytes but the manifest says {shard['size']}",
                                path=self._shown(shard))

    def _check_remote_crc(self, index: int, f) -> None:
        """The manifest's CRC of a remote shard whose own CRC ``f`` has just checked
        (verify / load_all): for a v2 shard from its footer's CRC of the bytes before the
        footer, combined with the footer's bytes up to the last four (no second read of
        the data); other files are read once more."""
        shard = self._shards[index]
        source, parsed = _source_of(f), getattr(f, "_file", None)
        end, body_end = getattr(parsed, "footer_crc_offset", None), shard["size"] - _CRC_TAIL
        if end is not None and 0 <= end <= body_end and isinstance(parsed.stored_crc, int):
            tail = bytes(source.read(end, body_end - end, "footer")) if body_end > end else b""
            actual = crc32_combine(parsed.stored_crc, crc32(tail), len(tail))
        else:
            from .reader import crc_by_chunks

            actual = crc_by_chunks(source, max(body_end, 0))
        if actual != shard["crc32"]:
            raise ChecksumError(f"shard {shard['file']!r} has CRC32 {actual:08x} but the manifest says "
                                f"{shard['crc32']:08x}", path=self._shown(shard))

    def _check_stored_crc(self, index: int, f) -> None:
        """A local shard just opened against the manifest's CRC32, from the CRC its
        footer stores (plus the footer's few bytes before the last four): no data is
        read, so a shard of another save under this name (same size, other bytes: a
        mixed set) is refused at open, naming it (ChecksumError, E004).  Whether the
        data still matches its footer is :meth:`verify`'s check.  A shard whose layout
        stores no CRC is checked at verify / load_all only."""
        shard = self._shards[index]
        source, parsed = _source_of(f), getattr(f, "_file", None)
        end, body_end = getattr(parsed, "footer_crc_offset", None), shard["size"] - _CRC_TAIL
        stored = getattr(parsed, "stored_crc", None) if end is not None else None
        if source is None or not isinstance(stored, int) or not 0 <= end <= body_end:
            return
        tail = bytes(source.read(end, body_end - end, "footer")) if body_end > end else b""
        actual = crc32_combine(stored, crc32(tail), len(tail))
        if actual != shard["crc32"]:
            raise ChecksumError(f"shard {shard['file']!r} has CRC32 {actual:08x} but the manifest says "
                                f"{shard['crc32']:08x}: it is not the shard this manifest was written with",
                                path=self._shown(shard))

    def _check_contents(self, index: int, f) -> None:
        expected = {n for n, i in self._where.items() if i == index}
        actual = set(f.keys())
        if expected != actual:
            extra, missing = sorted(actual - expected)[:5], sorted(expected - actual)[:5]
            raise CorruptError(f"shard {self._shards[index]['file']!r} does not hold what the manifest maps to it "
                               f"(missing {missing}, unexpected {extra})", path=f.path)

    def info(self, name: str):
        """dtype, shape, offset (in its shard) and byte size of one tensor; opens its shard.

        Args:
            name: The tensor's name.

        Returns:
            A :class:`aprfast.TensorInfo`.

        Raises:
            TensorNotFoundError: No tensor ``name``.
            AprIOError: Its shard cannot be opened, or the model is closed.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"a": np.zeros(4, np.float32), "b": np.ones(4, np.float32)},
            ...                   "model.apr", max_shard_size=16)
            >>> with aprfast.open("model.apr") as f:
            ...     f.info("b").shape, f.info("b").nbytes
            ((4,), 16)
        """
        return self._file_for(name).info(name)

    # --- tensors ---------------------------------------------------------------------
    def get_tensor(self, name: str, copy: bool = False, dequantize: bool = False):
        """One tensor, read from its shard (opened on first use) as
        :meth:`aprfast.AprFile.get_tensor` reads it.

        Args:
            name: The tensor's name.
            copy: Return an owned array instead of a view of the shard's map.
            dequantize: Return a packed (quantized) tensor as float32 values.

        Returns:
            A NumPy array (or a :class:`aprfast.QuantizedTensor` / :class:`aprfast.RawTensor`).

        Raises:
            TensorNotFoundError: No tensor ``name``.
            CorruptError: The shard does not hold the tensors the manifest maps to it.
            AprIOError: Its shard cannot be opened, or the model is closed.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"a": np.zeros(4, np.float32), "b": np.ones(4, np.float32)},
            ...                   "model.apr", max_shard_size=16)
            >>> f = aprfast.open("model.apr")
            >>> f.get_tensor("a").tolist()
            [0.0, 0.0, 0.0, 0.0]
            >>> f.close()
            >>> f.get_tensor("a")
            Traceback (most recent call last):
            ...
            aprfast.errors.AprIOError: [E007] model.apr.index.json: the sharded model is closed
        """
        return self._file_for(name).get_tensor(name, copy=copy, dequantize=dequantize)

    def get_slice(self, name: str, dequantize: bool = False):
        """A lazy slice handle of one tensor, from its shard (:meth:`aprfast.AprFile.get_slice`).

        Args:
            name: The tensor's name.
            dequantize: For a packed tensor, return float32 values from ``[a:b]``.

        Returns:
            A :class:`aprfast.TensorSlice` or :class:`aprfast.QuantizedSlice`.

        Raises:
            TensorNotFoundError: No tensor ``name``.
            AprIOError: Its shard cannot be opened, or the model is closed.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"a": np.zeros(4, np.float32), "b": np.ones(4, np.float32)},
            ...                   "model.apr", max_shard_size=16)
            >>> with aprfast.open("model.apr") as f:
            ...     f.get_slice("b")[1:3].tolist()
            [1.0, 1.0]
        """
        return self._file_for(name).get_slice(name, dequantize=dequantize)

    def get_tensors(self, names, copy: bool = False) -> dict:
        """Several tensors at once, as :meth:`get_tensor` gives them one by one, with the
        reads batched per shard: every name is checked against the manifest first (no
        shard is opened for a missing name), then each shard holding some of them is opened
        once and asked for its share with :meth:`aprfast.AprFile.get_tensors`, which reads
        tensors lying within 64 KiB of each other with one read.  Python work per tensor is
        a lookup and an array view.

        Args:
            names: The tensors' names (an iterable of str; repeats are read once).
            copy: Owned arrays instead of views of the shards' maps.

        Returns:
            A dict of name to tensor, in the order of ``names``.

        Raises:
            TensorNotFoundError: A name the model does not hold (nothing is read).
            CorruptError: A shard does not hold the tensors the manifest maps to it.
            AprIOError: A shard cannot be opened or read, or the model is closed.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({f"e{i}": np.full(3, i, np.float32) for i in range(4)}, "model.apr",
            ...                   max_shard_size=24)
            >>> with aprfast.open("model.apr", mode="pread") as f:
            ...     got = f.get_tensors(["e3", "e1"])
            >>> list(got), got["e3"].tolist()
            (['e3', 'e1'], [3.0, 3.0, 3.0])
        """
        names = list(dict.fromkeys(names))
        by_shard = {}
        for name in names:  # every name checked before a shard is opened or a byte read
            by_shard.setdefault(self._index_of(name), []).append(name)
        got = {}
        for index in sorted(by_shard):
            got.update(self._shard(index).get_tensors(by_shard[index], copy))
        return {name: got[name] for name in names}

    def tensors(self, copy: bool = False) -> dict:
        """Every tensor, by name (opens every shard).

        Args:
            copy: Owned arrays instead of views of the shards' maps.

        Returns:
            A dict of name to tensor, in :meth:`keys` order.

        Raises:
            AprIOError: A shard cannot be opened, or the model is closed.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"a": np.zeros(4, np.float32), "b": np.ones(4, np.float32)},
            ...                   "model.apr", max_shard_size=16)
            >>> with aprfast.open("model.apr") as f:
            ...     list(f.tensors(copy=True))
            ['a', 'b']
        """
        return {name: self.get_tensor(name, copy) for name in self._names}

    def describe(self) -> dict:
        """Every tensor's dtype, shape, offset and size in its shard, plus the shard's
        file name (opens every shard's index).

        Returns:
            A dict name -> ``{"dtype", "shape", "offset", "nbytes", "shard"}``.

        Raises:
            AprIOError: A shard cannot be opened, or the model is closed.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"a": np.zeros(4, np.float32), "b": np.ones(4, np.float32)},
            ...                   "model.apr", max_shard_size=16)
            >>> with aprfast.open("model.apr") as f:
            ...     f.describe()["a"]["shard"], f.describe()["a"]["shape"]
            ('model-00001-of-00002.apr', [4])
        """
        out = {}
        for index in range(len(self._shards)):
            f = self._shard(index)
            for name in f.keys():
                entry = f.info(name).as_dict()
                entry["shard"] = self._shards[index]["file"]
                out[name] = entry
        return {name: out[name] for name in self._names}

    # --- integrity and lifetime ------------------------------------------------------
    def verify(self) -> None:
        """Each shard's whole-file CRC32 against the manifest (ChecksumError naming the
        shard), then each shard's own checks.

        Raises:
            ChecksumError: A shard's size or CRC32 is not the manifest's, or fails its own.
            AprIOError: A shard cannot be read.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"a": np.zeros(4, np.float32), "b": np.ones(4, np.float32)},
            ...                   "model.apr", max_shard_size=16)
            >>> from pathlib import Path
            >>> shard = Path("model-00002-of-00002.apr")
            >>> blob = bytearray(shard.read_bytes())
            >>> blob[-10] ^= 1  # flip a bit of the second shard
            >>> _ = shard.write_bytes(blob)
            >>> with aprfast.open("model.apr") as f:
            ...     f.verify()
            Traceback (most recent call last):
            ...
            aprfast.errors.ChecksumError: [E004] ...shard 'model-00002-of-00002.apr' has CRC32 ...
        """
        for index, shard in enumerate(self._shards):
            if self._remote:  # the shard's own CRC first: it reads every byte once, the manifest's follows
                f = self._shard(index)
                f.verify()
                self._check_remote_crc(index, f)
                continue
            self._check_crc(shard)
            self._shard(index).verify()

    def _check_crc(self, shard) -> None:
        path = self._shard_path(shard)
        self._check_size(shard)
        try:
            size, actual = _size_and_crc(path)
        except OSError as exc:
            raise os_error(exc, f"cannot read shard {shard['file']!r}", path=path) from exc
        if actual != shard["crc32"]:
            raise ChecksumError(f"shard {shard['file']!r} has CRC32 {actual:08x} but the manifest says "
                                f"{shard['crc32']:08x}", path=path)

    def load_all(self, *, verify: bool = True, threads: int = 0) -> dict:
        """Every tensor as an owned array, shard by shard (each CRC-checked against the
        manifest and its own footer when ``verify``).

        Args:
            verify: Check each shard's CRC32 before its tensors are returned.
            threads: Threads for the reads (0: the C default).

        Returns:
            A dict of name to owned array, in :meth:`keys` order.

        Raises:
            ChecksumError: A shard's CRC32 is not the manifest's, or fails its own.
            AprIOError: A shard cannot be read, or the model is closed.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"a": np.zeros(4, np.float32), "b": np.ones(4, np.float32)},
            ...                   "model.apr", max_shard_size=16)
            >>> with aprfast.open("model.apr") as f:
            ...     {name: a.tolist() for name, a in f.load_all().items()}
            {'a': [0.0, 0.0, 0.0, 0.0], 'b': [1.0, 1.0, 1.0, 1.0]}
        """
        out = {}
        for index, shard in enumerate(self._shards):
            if verify and not self._remote:
                self._check_crc(shard)
            f = self._shard(index)
            if hasattr(f, "load_all"):
                out.update(f.load_all(verify=verify, threads=threads))
            else:
                if verify:
                    f.verify()
                out.update(f.tensors(copy=True))
            if verify and self._remote:
                self._check_remote_crc(index, f)
        return {name: out[name] for name in self._names}

    def close(self) -> None:
        """Close every opened shard; arrays already handed out stay valid.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"a": np.zeros(4, np.float32), "b": np.ones(4, np.float32)},
            ...                   "model.apr", max_shard_size=16)
            >>> f = aprfast.open("model.apr")
            >>> f.close()
            >>> f.closed
            True
        """
        with self._opening:
            self._closed = True
            opened, self._open = self._open, {}
        for f in opened.values():
            f.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._closed

    def opened_shards(self) -> list:
        """File names of the shards opened so far (lazy opening is observable).

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"a": np.zeros(4, np.float32), "b": np.ones(4, np.float32)},
            ...                   "model.apr", max_shard_size=16)
            >>> with aprfast.open("model.apr") as f:
            ...     before = f.opened_shards()
            ...     _ = f.get_tensor("a")
            ...     before, f.opened_shards()
            ([], ['model-00001-of-00002.apr'])
        """
        return [self._shards[i]["file"] for i in sorted(self._open)]

    def _describe(self) -> str:
        return str(self._path)

    def _state(self) -> str:
        return f"{len(self)} tensors in {len(self._shards)} shards"


def _redact(url) -> str:
    from ..remote import redact_url

    return redact_url(url)


def _is_url(target) -> bool:
    from ..remote import is_url

    return isinstance(target, str) and "://" in target and is_url(target)


def _check_url_name(name: str, path) -> None:
    """A shard name in a remote manifest becomes the last part of a URL: besides what
    every manifest refuses ("/", "..", ":"), characters that would change what the URL
    addresses (a query, a fragment, percent-escapes a server could decode to "../",
    spaces and controls) are refused."""
    if any(c in name for c in "?#%\\") or any(ord(c) < 0x21 or ord(c) == 0x7F for c in name):
        raise CorruptError(f"shard manifest: shard file {name!r} cannot name an object next to a remote "
                           "manifest (?, #, %, spaces and control characters are refused)", path=path)


def _url_part(name: str, base: str) -> str:
    """``name`` as the last part of a URL under ``base``: percent-encoded for http(s)
    (non-ASCII names), as is for fsspec paths, which are not percent-decoded."""
    if base.lower().startswith(("http://", "https://")):
        from urllib.parse import quote

        return quote(name, safe="")
    return name


def _source_of(f):
    return getattr(f, "_raw_source", None) or getattr(f, "_source", None)


def inspect(manifest_path, *, open_one, limits: Limits | None = None, storage_options=None) -> dict:
    """``aprfast.inspect`` of a sharded model: the manifest, and every tensor's entry
    with its shard (each shard's header and index are read, no tensor data; at a URL,
    one request per shard when its prefix fits 64 KiB).  ``open_one`` as for
    :class:`ShardedFile`."""
    with ShardedFile(manifest_path, open_one=open_one, open_options={"unknown_dtypes": "raw"}, limits=limits,
                     storage_options=storage_options) as f:
        return {"layout": f.layout, "header": f.header, "metadata": f.metadata, "tensors": f.describe()}
