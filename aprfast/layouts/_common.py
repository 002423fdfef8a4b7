"""What the two v2 tensor layouts share: the parsed-file object, the write plan, the
binary index codec and the checks every index passes before a tensor is touched."""

from __future__ import annotations

import json
import operator
from collections.abc import KeysView, Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .. import _index, _inputs
from ..dtypes import APR2_IDS, APRENDER_IDS, OPAQUE_APR2_ID, OPAQUE_NAMES_KEY, IdTable
from ..errors import AprError, CorruptError, LayoutError, LimitError, TensorNotFoundError
from ..limits import Limits
from ..tensors import TensorInfo

__all__ = ["STREAM_END", "align", "DeferredFooter", "footer", "ParsedFile", "TensorIndex",
           "Plan", "parse_index", "encode_index", "decode_json"]


#: Where a stream of unknown length is assumed to end when its index is checked: extents
#: must lie below 2**62 bytes (NumPy's limit for one array anyway); bytes actually
#: present are checked as they are read.
STREAM_END = 1 << 62


def align(n: int, to: int) -> int:
    return -(-n // to) * to


#: The most room ``reserve=`` may leave: readers bound what lies before the data by
#: the index limit (aprfast.limits.MAX_INDEX_SIZE, 256 MiB by default).
MAX_RESERVE = 64 * 1024 * 1024


def check_reserve(reserve) -> int:
    """``reserve=`` of a write (bytes of room left for in-place edits), checked."""
    if isinstance(reserve, bool) or not isinstance(reserve, int):
        raise LayoutError(f"reserve must be an int number of bytes, not {reserve!r}")
    if not 0 <= reserve <= MAX_RESERVE:
        raise LayoutError(f"reserve={reserve} must lie in [0, {MAX_RESERVE}] bytes")
    return reserve


@dataclass
class Plan:
    """Everything a writer needs before streaming tensor bytes: the bytes in front of
    the data (header, metadata, index, padding), the tensors in file order with the
    zero padding after each, and the footer, which only needs the CRC of everything
    written before it."""

    layout: str
    prefix: bytes
    tensors: list
    pads: list
    total_size: int
    footer: object  # callable(crc_of_everything_before_the_footer) -> bytes


class DeferredFooter:
    """A footer value read (and checked) only when first needed: ``read()`` calls
    ``decode(source.read(offset, n, "footer"))``.  Used by :func:`footer` for sources
    where that read costs a request (remote objects), so that opening a remote file
    and reading one tensor never waits for the footer."""

    __slots__ = ("source", "offset", "n", "decode")

    def __init__(self, source, offset: int, n: int, decode):
        self.source, self.offset, self.n, self.decode = source, offset, n, decode

    def read(self):
        return self.decode(self.source.read(self.offset, self.n, "footer"))


def footer(source, offset: int, n: int, decode):
    """``decode`` of the footer's ``n`` bytes at ``offset``: now when the source holds
    them cheaply (a local file, a mapped buffer, a remote object whose last bytes came
    with its first request), else a :class:`DeferredFooter` that
    :attr:`ParsedFile.stored_crc` reads when first asked.  The range is checked now
    either way, so a file too short for its footer is refused at open."""
    source.check_range(offset, n, "footer")
    cheap = getattr(source, "cheap", None)
    if cheap is None or cheap(offset, n):
        return decode(source.read(offset, n, "footer"))
    return DeferredFooter(source, offset, n, decode)


class ParsedFile:
    """A v2 file's header, lazily decoded metadata and validated tensor index.

    The index stays in its own bytes (:class:`aprfast._index.Entries`): ``names`` is a
    sequence view decoding each name when asked, ``position`` a mapping view answering
    by binary search, and ``row``/``info`` decode one entry.  Nothing per tensor is
    built at open, so open costs about the index size whatever the tensor count."""

    def __init__(self, *, layout, ids, source, version, flags, header, metadata_range, entries,
                 data_start, data_len, footer_crc_offset, stored_crc, limits: Limits):
        self.layout = layout
        self.ids = ids
        self.source = source
        self.version = version
        self.flags = flags
        self.header = header
        self._metadata_range = metadata_range
        self.entries = entries
        self._rows = {}
        self.names = _index.Names(entries)
        self.position = _index.Positions(entries)
        self.data_start = data_start
        self.data_len = data_len
        self.footer_crc_offset = footer_crc_offset
        self.stored_crc = stored_crc  # an int, None (a stream: not read yet), or a deferred read
        self.limits = limits
        self._infos = {}
        self._codecs = {}
        #: APR2 encrypted or signed files: their aprfast.security.Security, and (names
        #: encrypted) a source holding the decrypted metadata and index.
        self.security = None
        self.names_source = None

    @property
    def stored_crc(self):
        """The CRC32 the footer stores.  A remote source defers the footer read until
        this is first asked for (verify, loads): opening costs no request for it."""
        value = self._stored_crc
        if isinstance(value, DeferredFooter):
            value = self._stored_crc = value.read()
        return value

    @stored_crc.setter
    def stored_crc(self, value) -> None:
        self._stored_crc = value

    @cached_property
    def metadata(self) -> dict:
        start, size = self._metadata_range
        source = self.names_source or self.source
        return decode_json(source.read(start, size, "metadata"), self.source.path)

    @property
    def rows(self) -> list:
        """Per tensor ``(dtype_id, absolute offset, size, shape)``, in index order (a new
        list each time: for loading every tensor, not for looking one up)."""
        return self.entries.rows(self.data_start)

    def _find(self, name) -> int:
        i = self.entries.find(name)
        if i < 0:
            raise TensorNotFoundError(_missing(name, self.names), path=self.source.path)
        return i

    def row(self, name: str):
        """``(dtype_id, absolute offset, size, shape)`` of one tensor.  Rows already
        asked for are kept (memory grows with the tensors read, not with the index), so
        reading a tensor again costs one dict lookup."""
        found = self._rows.get(name)
        if found is None:
            found = self._rows[name] = self.entries.row(self._find(name), self.data_start)
        return found

    def codec(self, name: str):
        """``(flags, raw_size)`` of a compressed tensor (APR2 per-tensor codec), else None."""
        if not getattr(self.entries, "compressed", 0):
            return None
        found = self._codecs.get(name)
        if found is None:
            i = self._find(name)
            flags = self.entries.flags(i)
            found = self._codecs[name] = (flags, self.entries.raw_size(i)) if flags else ()
        return found or None

    def describe(self) -> dict:
        """Every tensor's dtype name, shape, absolute offset and stored size, by name in
        index order (``aprfast.inspect``'s ``tensors``), built in C in one pass."""
        return self.entries.describe(self.data_start, _dtype_names(self.ids))

    def tensor_index(self) -> TensorIndex:
        """:meth:`describe` as a :class:`TensorIndex`, whose entries are built when asked
        for (what ``aprfast.inspect`` returns).  An index read from a caller's buffer is
        already a private copy (:func:`parse_index`)."""
        return TensorIndex(self.entries, self.data_start, _dtype_names(self.ids))

    def info(self, name: str) -> TensorInfo:
        found = self._infos.get(name)
        if found is None:
            found = self._infos[name] = self._make_info(name)
        return found

    def _make_info(self, name) -> TensorInfo:
        i = self._find(name)
        type_id, offset, size, shape = self.entries.row(i, self.data_start)
        dtype = self.ids.dtype(type_id) if self.ids.knows(type_id) else None
        return TensorInfo(name, dtype, type_id, shape, offset, size, self.entries.flags(i))


#: The one key a lazy :class:`TensorIndex` keeps in its own dict storage, so code that
#: reads a dict's size from its C struct (the C JSON encoder's ``{}`` fast path) does
#: not take a non-empty index for an empty one; every Python-level method hides it.
_HELD = object()


class _IndexKeys(KeysView):
    """``TensorIndex.keys()`` before the table is built: names decoded as iterated,
    membership by binary search; otherwise a ``dict_keys`` (set operations, len, ==)."""

    __slots__ = ()

    def __reversed__(self):
        return reversed(list(self))

    def __repr__(self):
        return f"dict_keys({list(self)!r})"


class TensorIndex(dict):
    """``aprfast.inspect``'s ``tensors``: ``{name: {"dtype", "shape", "offset",
    "nbytes"[, "raw_size", "flags"]}}`` in index order, over the parsed index.

    A dict whose entries are decoded when asked for: ``len``, ``in``, ``[name]``,
    ``get`` and iterating the names cost a binary search or a name each; the first
    ``items()``, ``values()``, ``==``, ``repr``, copy, pickle or JSON encoding builds
    every entry in one pass in C (what ``inspect`` used to do up front) and keeps the
    result.  An entry asked for twice is the same dict, so changes to it are kept.
    Any change to the table itself (``t[k] = v``, ``del``, ``pop``, ``update``, ...)
    first copies everything into the dict's own storage; from then on it is an
    ordinary dict.  Copies (``dict(t)``, ``t.copy()``, ``copy.copy``), pickles and
    ``t | other`` are plain dicts.

    Every check of the index ran when the file was parsed (inside ``inspect``), so
    nothing here can fail on the file's bytes: the table reads a validated, private
    copy of the index."""

    __slots__ = ("_entries", "_data_start", "_dtype_names", "_built", "_asked")

    def __init__(self, entries, data_start: int, dtype_names: list):
        dict.__init__(self)
        self._entries = entries
        self._data_start = data_start
        self._dtype_names = dtype_names
        self._built = None  # every entry, once something needed them all
        self._asked = {}  # entries built one at a time, handed out again as the same dicts
        if len(entries):
            dict.__setitem__(self, _HELD, None)

    # --- building ------------------------------------------------------------------
    def _entry(self, i: int) -> dict:
        """Entry ``i`` as ``_index.Entries.describe`` builds it (same keys, same order)."""
        entries = self._entries
        type_id, offset, size, shape = entries.row(i, self._data_start)
        out = {"dtype": self._dtype_names[type_id], "shape": list(shape), "offset": offset, "nbytes": size}
        flags = entries.flags(i)
        if flags:  # compressed: what it inflates to, and how
            out["raw_size"] = entries.raw_size(i)
            out["flags"] = flags
        return out

    def _all(self) -> dict:
        """Every entry in index order (built once, in C); None once the table is a plain dict."""
        built = self._built
        if built is None:
            entries = self._entries
            if entries is None:
                return None
            built = entries.describe(self._data_start, self._dtype_names)
            for name, entry in list(self._asked.items()):  # hand out what was handed out before
                built[name] = entry
            self._built = built
            self._asked = {}
        return built

    def _plain(self) -> dict:
        """The contents as a dict: the built table, or (after a change) the storage."""
        built = self._all()
        return dict.copy(self) if built is None else built

    def _own(self) -> None:
        """Before a change: move every entry into the dict's own storage, for good."""
        built = self._all()
        if built is not None:
            dict.clear(self)
            dict.update(self, built)
            self._entries = self._built = None
            self._asked = {}

    # --- reading -----------------------------------------------------------------------
    def __len__(self):
        entries = self._entries
        return dict.__len__(self) if entries is None else len(entries)

    def __contains__(self, name):
        entries = self._entries
        return dict.__contains__(self, name) if entries is None else entries.find(name) >= 0

    def __getitem__(self, name):
        built = self._built
        if built is not None:
            return built[name]
        entries = self._entries
        if entries is None:
            return dict.__getitem__(self, name)
        found = self._asked.get(name) if isinstance(name, str) else None
        if found is None:
            i = entries.find(name)
            if i < 0:
                raise KeyError(name)
            found = self._asked.setdefault(name, self._entry(i))
        return found

    def get(self, name, default=None):
        try:
            return self[name]
        except KeyError:
            return default

    def __iter__(self):
        entries = self._entries
        if entries is None:
            return dict.__iter__(self)
        built = self._built
        return iter(built) if built is not None else iter(_index.Names(entries))

    def __reversed__(self):
        entries = self._entries
        if entries is None:
            return dict.__reversed__(self)
        return reversed(self._all())

    def keys(self):
        if self._entries is None:
            return dict.keys(self)
        built = self._built
        return built.keys() if built is not None else _IndexKeys(self)

    def values(self):
        return dict.values(self) if self._entries is None else self._all().values()

    def items(self):
        return dict.items(self) if self._entries is None else self._all().items()

    def __eq__(self, other):
        if not isinstance(other, Mapping):
            return NotImplemented
        if len(other) != len(self):
            return False
        if isinstance(other, TensorIndex):
            other = other._plain()
        elif type(other) is not dict:
            other = dict(other.items())
        return self._plain() == other

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None

    def __repr__(self):
        return repr(self._plain())

    def __or__(self, other):
        if not isinstance(other, Mapping):
            return NotImplemented
        return {**self._plain(), **other}

    def __ror__(self, other):
        if not isinstance(other, Mapping):
            return NotImplemented
        return {**other, **self._plain()}

    def copy(self) -> dict:
        return dict(self._plain())

    __copy__ = copy

    def __deepcopy__(self, memo):
        import copy

        return copy.deepcopy(self._plain(), memo)

    def __reduce__(self):
        # pickles as the plain dict it stands for (unpickling needs nothing of aprfast)
        return (dict, (dict(self._plain()),))

    # --- changing: an ordinary dict from then on -------------------------------------------
    def __setitem__(self, name, value):
        self._own()
        dict.__setitem__(self, name, value)

    def __delitem__(self, name):
        self._own()
        dict.__delitem__(self, name)

    def __ior__(self, other):
        self._own()
        dict.update(self, other)
        return self

    def pop(self, *args):
        self._own()
        return dict.pop(self, *args)

    def popitem(self):
        self._own()
        return dict.popitem(self)

    def setdefault(self, name, default=None):
        self._own()
        return dict.setdefault(self, name, default)

    def update(self, *args, **kwargs):
        self._own()
        dict.update(self, *args, **kwargs)

    def clear(self):
        self._own()
        dict.clear(self)


_DTYPE_NAMES = {}
#: The names of undefined ids, built once at import: a first inspect in a fresh process
#: otherwise spent about 100 µs formatting 256 strings it almost never shows.
_UNKNOWN_NAMES = tuple(f"unknown({i})" for i in range(256))


def _dtype_names(ids: IdTable) -> list:
    """Each id 0-255's name in ``ids`` (``unknown(N)`` for ids it does not define), as
    :attr:`TensorInfo.dtype_name` gives it."""
    names = _DTYPE_NAMES.get(ids)
    if names is None:
        names = list(_UNKNOWN_NAMES)
        for type_id, dtype in ids.items():
            if 0 <= type_id < 256:
                names[type_id] = dtype.name
        _DTYPE_NAMES[ids] = names
    return names


def _missing(name, names) -> str:
    shown = ", ".join(repr(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
    return f"no tensor named {name!r}; the file has {len(names)}: {shown}"


def decode_json(raw, path=None) -> dict:
    """Parse a metadata block; anything but a UTF-8 JSON object is CorruptError.

    :mod:`aprfast._metascan` looks at the block first, building nothing: a top level
    that is not an object, malformed JSON or nesting deeper than 1024 is refused
    (E002), and so is a block whose decode would take more memory than its budget
    (E008), before ``json.loads`` sees it."""
    from .. import _metascan

    text = _metascan.json_text(raw, path)
    try:
        value = _DECODER.decode(text)
    except (ValueError, RecursionError) as exc:
        raise CorruptError(f"metadata ({len(raw)} bytes) is not valid UTF-8 JSON: {exc}", path=path) from None
    if not isinstance(value, dict):  # the scan already refused it
        raise CorruptError(f"metadata must be a JSON object, found {type(value).__name__}", path=path)
    return value


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


# One decoder for every block: json.loads(text, parse_constant=...) builds a new
# JSONDecoder and scanner per call, most of the cost of a small block.  Decoders
# keep no state between calls (json.loads itself shares one across threads).
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


_RULE_TABLES = {}


def rule_tables(ids: IdTable):
    """Per-id size rules for :func:`aprfast._index.parse_index`, built once per table
    (the same arrays every time, so :func:`update_rule` reaches every layout using them)."""
    tables = _RULE_TABLES.get(ids)
    if tables is None:
        tables = _RULE_TABLES[ids] = (np.zeros(256, np.int8), np.zeros(256, np.int64), np.zeros(256, np.int64))
        for type_id in range(256):
            update_rule(ids, type_id)
    return tables


def update_rule(ids: IdTable, type_id: int) -> None:
    """Set one id's size rule from the table (after a custom quantizer added or removed it)."""
    _DTYPE_NAMES.pop(ids, None)
    rule, a, b = rule_tables(ids)
    rule[type_id] = a[type_id] = b[type_id] = 0
    if not ids.knows(type_id):
        return
    d = ids.dtype(type_id)
    if not d.packed:
        rule[type_id], a[type_id] = _index.RULE_FIXED, d.itemsize
    elif d.tensor_header:
        rule[type_id], a[type_id] = _index.RULE_SCALE_PLUS_ONE, d.tensor_header
    else:
        rule[type_id] = _index.RULE_ROW_BLOCKS if d.blocks_per_row else _index.RULE_FLAT_BLOCKS
        a[type_id], b[type_id] = d.block_elems, d.block_bytes


IdTable.watchers.append(update_rule)  # a quantizer registered later changes a table's rules


def parse_index(source, *, start, end, count, spec_layout, ids, rules, data_len, limits: Limits,
                strict_dtypes: bool, pad_to: int = 1):
    """Read and validate ``count`` index entries in ``[start, end)``, failing at the first
    bad one (:func:`aprfast._index.parse_index` lists the checks); return the entries and
    where the data ends when each tensor is padded to ``pad_to``."""
    if count > limits.max_tensor_count:
        raise LimitError(f"header declares {count} tensors, above the limit of {limits.max_tensor_count} "
                         "(aprfast.limits.MAX_TENSOR_COUNT)", path=source.path)
    if end - start > limits.max_index_size:
        raise LimitError(f"tensor index of {end - start} bytes exceeds the limit of "
                         f"{limits.max_index_size} (aprfast.limits.MAX_INDEX_SIZE)", path=source.path)
    blob = source.read(start, end - start, "tensor index")
    if getattr(source, "caller_buffer", False) and not isinstance(getattr(blob, "obj", blob), bytes):
        # the entries decode names and shapes from these bytes long after the checks:
        # a caller changing their bytearray then must not steer those reads
        blob = bytes(blob)
    try:
        return _index.parse_index(blob, count, spec_layout, limits.max_dims, limits.max_name_bytes,
                                  *rules, data_len, strict_dtypes, pad_to)
    except AprError as exc:
        raise type(exc)(exc.message, path=source.path) from None


def encode_index(tensors, offsets, ids: IdTable, *, spec_layout: bool, codecs: bool = False) -> bytes:
    """Index entries for ``tensors`` in index order, at ``offsets`` in the data section
    (with ``codecs``, each input's ``raw_size``/``flags`` where it has them)."""
    id_of = {d: layout_id(ids, d) for d in {t.dtype for t in tensors}}
    return _index.encode_entries(tensors, offsets, id_of, spec_layout, codecs)


def layout_id(ids: IdTable, dtype) -> int:
    """The id ``dtype`` is written with: the table's, or for an opaque dtype (APR2 only)
    the unknown id it was read with, or OPAQUE_APR2_ID for one known by name.  (APR1's
    index check passes the name of a type it does not know: its table gives the id.)"""
    if getattr(dtype, "opaque", False):
        return OPAQUE_APR2_ID if dtype.raw_id is None else dtype.raw_id
    return ids.id_of(dtype)


def with_opaque_names(ordered, metadata):
    """``metadata`` plus OPAQUE_NAMES_KEY ``{tensor: dtype name}`` for each tensor of a
    dtype known only by name (stored under OPAQUE_APR2_ID), so a reader can give the name
    back; the key is replaced, never merged, so it always describes this file."""
    names = {t.name: t.dtype.name for t in ordered if t.dtype.opaque and t.dtype.raw_id is None}
    if not names and (not metadata or OPAQUE_NAMES_KEY not in metadata):
        return metadata
    metadata = {k: v for k, v in metadata.items() if k != OPAQUE_NAMES_KEY} if metadata else {}
    if names:
        metadata[OPAQUE_NAMES_KEY] = names
    return metadata


_by_name = operator.attrgetter("name")


def check_names(inputs, max_name_bytes: int):
    """Names must be unique, encodable and within the limit; return them in index order."""
    ordered = sorted(inputs, key=_by_name)
    for prev, cur in zip(ordered, ordered[1:]):
        if prev.name == cur.name:
            raise LayoutError(f"tensor name {cur.name!r} is given twice")
    for t in ordered:
        if len(t.name) * 4 <= max_name_bytes:
            continue  # no UTF-8 encoding of this name can be too long
        try:
            size = len(t.name.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise LayoutError(f"tensor name {t.name!r} is not encodable as UTF-8: {exc.reason}") from None
        if size > max_name_bytes:
            raise LayoutError(f"tensor name {t.name[:40]!r}... is {size} bytes; this layout holds "
                              f"at most {max_name_bytes}")
    return ordered


def checked_inputs(inputs, ids: IdTable, *, max_name_bytes: int, max_dims: int) -> list:
    """Writer inputs sorted by name, each checked against what the layout can hold."""
    ordered = check_names(inputs, max_name_bytes)
    for t in ordered:
        if t.dtype.opaque:
            if ids is not APR2_IDS:
                raise LayoutError(f"tensor {t.name!r}: the {ids.layout} layout cannot keep a tensor of the dtype "
                                  f"{t.dtype.name}, which aprfast does not know (the apr2 layout keeps its bytes: "
                                  "save with layout='apr2' or 'auto')")
            continue
        if not ids.holds(t.dtype):
            raise LayoutError(f"tensor {t.name!r}: the {ids.layout} layout has no dtype id for {t.dtype.name}"
                              + _other_layouts(ids, t.dtype))
        if len(t.shape) > max_dims:
            raise LayoutError(f"tensor {t.name!r} has {len(t.shape)} dims; the {ids.layout} layout holds "
                              f"at most {max_dims}")
    return ordered


def _other_layouts(ids: IdTable, dtype) -> str:
    """Where a dtype the layout ``ids`` lacks can go instead (a clause for the refusal)."""
    others = [table.layout for table in (APR2_IDS, APRENDER_IDS) if table is not ids and table.holds(dtype)]
    if not others:
        return ""
    return f" (the {' and '.join(others)} layout can hold it: save with layout='{others[0]}' or 'auto')"


def sorted_json(value):
    """A JSON value with every object's keys sorted (serde_json's ``Value`` maps are
    BTreeMaps, and sorted is the one order independent of how a dict was built)."""
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise LayoutError(f"metadata keys must be str, not {key!r}")
        return {k: sorted_json(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [sorted_json(v) for v in value]
    return value


def lay_out_data(ordered, alignment: int):
    """Offsets of each tensor in the data section (aligned, in index order), the zero
    padding after each, and the section's size."""
    return _index.lay_out(ordered, alignment)


def find_aliases(ordered) -> dict:
    """alias name -> the name stored, for inputs that are one storage under several
    names (tied weights): the first name in index order is stored, the others point
    at its bytes."""
    first, aliases = {}, {}
    for t, key in zip(ordered, _inputs.storage_keys(list(ordered))):
        if key is None:
            continue
        if key in first:
            aliases[t.name] = first[key]
        else:
            first[key] = t.name
    return aliases


def lay_out_shared(ordered, aliases: dict, alignment: int):
    """Like :func:`lay_out_data`, with every alias at the offset of the tensor it names
    and no bytes of its own: (tensors to write, offsets in index order, pads, size)."""
    data = [t for t in ordered if t.name not in aliases]
    offsets, pads, data_len = _index.lay_out(data, alignment)
    at = {t.name: offset for t, offset in zip(data, offsets)}
    return data, [at[aliases.get(t.name, t.name)] for t in ordered], pads, data_len


def lay_out_in_order(ordered, inputs, alignment: int):
    """Like :func:`lay_out_data`, but the data follows ``inputs``' own order (a planned
    writer streams tensors in the order they are declared and added), while the index
    stays sorted: offsets are returned in index (``ordered``) order, pads in data order."""
    data = list(inputs)
    offsets, pads, data_len = _index.lay_out(data, alignment)
    at = {t.name: offset for t, offset in zip(data, offsets)}
    return data, [at[t.name] for t in ordered], pads, data_len
