"""``aprfast.edit``: change a v2 file's metadata, rename tensors or drop them from the
index without rewriting the tensor data.

Two ways, chosen per call (docs/FORMAT.md §5.2 has the bytes and the crash argument):

* **In place**, when the file was saved with room (``save_file(..., reserve=BYTES)``):
  the new metadata and index (and, for a signed APR2 file, its security block, signed
  again) go into room the current header does not reference, then the header is
  written over in one sector.  Each of the two writes leaves the whole-file CRC32 what
  the footer says (four compensation bytes in unreferenced padding), so the footer is
  never written, and a crash at any point between the writes leaves the old file or
  the new one.  A few KiB written, whatever the file's size.
* **Otherwise an atomic rewrite** (:class:`aprfast.io.atomic.AtomicFile`): a new prefix,
  the data section copied by the kernel (``copy_file_range``, a reflink where the
  filesystem shares extents), and a footer whose CRC is derived from the old one with
  ``crc32_combine`` arithmetic, so the data is never read into this process.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from .. import _index
from .._crc import crc32, crc32_combine
from ..dtypes import APR2_IDS, OPAQUE_NAMES_KEY
from ..errors import (
    AprFileNotFoundError,
    AprIOError,
    AprPermissionError,
    DecryptError,
    FormatError,
    LayoutError,
    SignatureError,
    TensorNotFoundError,
)
from ..io import platform as _platform
from ..io.atomic import AtomicFile, kernel_copy
from ..io.sources import FileSource
from ..layouts import align, apr2, aprender, caller_metadata, check_reserve, detect, is_v1
from ..limits import Limits
from ..security import block as blk

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; concurrent edits are the caller's to avoid
    fcntl = None

__all__ = ["edit", "forge_crc32"]

#: Alignment of the spans an in-place edit writes (metadata start, aprender's index).
_SPAN_ALIGN = 64
#: Bytes after the new index (and security block) in an in-place span: four zeros, so no
#: reader takes them for a security block's magic, then the CRC compensation.
_SPAN_TAIL = 8
#: A span that fits one page is placed inside one (see place_in_place).
_PAGE = 4096
_MASK32 = 0xFFFFFFFF


def edit(path, metadata=None, rename=None, drop=None, *, signing_key=None, durable: bool = True,
         reserve=None) -> dict:
    """Change metadata keys, rename tensors or drop tensors of a v2 ``.apr`` file.

    In place when the file has room (saved with ``reserve=``, or edited before with
    room left): a few KiB are written and the tensor data is not touched.  Otherwise the
    file is rewritten atomically, the data copied by the kernel (``copy_file_range``,
    a reflink on filesystems that share extents) and never read into Python.  Either
    way a crash leaves the old file or the new one (docs/FORMAT.md §5.2), and the
    footer CRC32 stays right without reading the data.

    Dropped tensors leave the index; their bytes stay in the data section, unreferenced,
    until the file is saved again (aprender's layout cannot end on a gap, so dropping
    the tensor whose bytes come last rewrites that layout, and the rewrite leaves them
    out).  Renames keep each tensor's bytes where they are; the index is sorted again.

    Signed APR2 files (a security block with a signature) are signed again with
    ``signing_key`` (the chunk digests cover only tensor bytes, which do not change);
    without it they are refused, in place or not.  An unsigned digest manifest is kept
    (its CRC recomputed); ``signing_key`` signs it.  Encrypted APR2 files are refused:
    every chunk's authentication binds the index, so an edit re-encrypts every byte
    (decrypt, edit, encrypt).  v1 (``APRN``) and APR1 files are refused.

    A shard of a sharded set (its metadata has ``sharding``) takes in-place metadata
    edits only: the set's manifest records each shard's CRC32, which an in-place edit
    keeps, and which shard holds each tensor, which a rename or drop would break.

    Concurrent ``edit`` calls on one file are serialised with ``flock``; a reader that
    opened the file before an in-place edit keeps the index it parsed, but a second
    edit may overwrite the old metadata bytes it has not read yet (metadata is read
    lazily): reopen after editing.  A rewrite replaces the file (hard links to it keep
    the old one); an in-place edit changes the file itself.

    Args:
        path: The ``.apr`` file.
        metadata: Keys to set (``{key: value}``); a value of ``None`` removes the key
            (aprender's always-written fields then read back as their defaults).
        rename: ``{old_name: new_name}``, applied together (swaps work).
        drop: Names of tensors to remove from the index.
        signing_key: Ed25519 seed (32 bytes) to sign a signed file again (required for one).
        durable: fsync before returning (in place: once between the two writes, once
            after: docs/FORMAT.md §5.2 says why one cannot keep both old-or-new and
            on-disk-on-return); ``False`` still leaves old-or-new after a process
            crash, not after a power loss.
        reserve: Room to leave when the file has to be rewritten, in bytes: ``None``
            keeps the file's kind (a file with room gets at least as much again, at
            least the new metadata and index; a file without keeps aprender's bytes),
            0 none.

    Returns:
        A dict: ``file``, ``layout``, ``in_place`` (bool), ``bytes_written``,
        ``tensors`` (count after), ``renamed``, ``dropped``, ``metadata_keys`` (keys
        set or removed), ``room`` (bytes an in-place edit can still use).

    Raises:
        TensorNotFoundError: A name in ``rename`` or ``drop`` is not in the file.
        LayoutError: Two tensors would get one name, a name is too long for the layout,
            metadata the layout cannot hold, a tensor both renamed and dropped,
            ``signing_key`` for a file without a digest manifest.
        SignatureError: A signed file without ``signing_key``, or one whose signature
            does not verify.
        DecryptError: An encrypted file.
        FormatError: Not a v2 file (v1 ``APRN`` and APR1 are refused).
        AprIOError: The file cannot be opened for writing, or the write failed (the
            file is then the old one).

    Examples:
        >>> import numpy as np, aprfast
        >>> aprfast.save_file({"w": np.zeros(4, np.float32)}, "m.apr", {"name": "a"}, reserve=4096)
        >>> r = aprfast.edit("m.apr", metadata={"name": "b"}, rename={"w": "weight"})
        >>> r["in_place"], r["bytes_written"] < 4096
        (True, True)
        >>> f = aprfast.open("m.apr", verify=True)
        >>> f.metadata["name"], list(f.keys())
        ('b', ['weight'])
        >>> f.close()
    """
    changes = _Changes.checked(metadata, rename, drop)
    if reserve is not None:
        check_reserve(reserve)
    path = os.fspath(path)
    fd = _open_locked(path)
    try:
        source = FileSource(fd, path, mappable=False)
        try:
            layout = _layout_of(source, path)
            parsed = _parse(layout, source, path)
            new = _Edit(layout, parsed, changes, signing_key, path)
            result = {"file": path, "layout": layout.NAME, "in_place": True, "bytes_written": 0,
                      "tensors": len(new.rows), "renamed": len(changes.rename), "dropped": len(changes.drop),
                      "metadata_keys": sorted(changes.metadata), "room": 0}
            if not new.changed:
                result["room"] = new.room()
                return result
            span = new.place_in_place()
            if new.shard and (changes.rename or changes.drop or span is None):
                raise LayoutError("this file is a shard of a sharded set, whose manifest records each shard's CRC32 "
                                  "and which shard holds each tensor: only an in-place metadata edit keeps it "
                                  "valid (it keeps the CRC32); rename or drop tensors in the model and save it "
                                  "again", path=path)
            if span is not None:
                result["bytes_written"] = _write_in_place(fd, new, span, durable, path)
                result["room"] = new.room_after(span)
            else:
                result["in_place"] = False
                result["bytes_written"], result["room"] = _rewrite(fd, path, new, reserve, durable)
        finally:
            source.close()
    finally:
        os.close(fd)  # releases the lock
    return result


# --- what to change ------------------------------------------------------------------
@dataclass
class _Changes:
    metadata: dict
    rename: dict
    drop: frozenset

    @classmethod
    def checked(cls, metadata, rename, drop) -> _Changes:
        metadata = dict(metadata or {})
        for key in metadata:
            if not isinstance(key, str):
                raise LayoutError(f"metadata keys must be str, not {key!r}")
        rename = dict(rename or {})
        for old, new in rename.items():
            if not isinstance(old, str) or not isinstance(new, str):
                raise LayoutError(f"rename maps tensor names (str) to names, not {old!r} -> {new!r}")
        if isinstance(drop, str):
            drop = [drop]
        drop = frozenset(drop or ())
        for name in drop:
            if not isinstance(name, str):
                raise LayoutError(f"drop takes tensor names (str), not {name!r}")
        both = sorted(drop & set(rename))
        if both:
            raise LayoutError(f"tensor {both[0]!r} is both renamed and dropped")
        return cls(metadata, rename, drop)


class _Row:
    """One index entry of the edited file (names as str; ids, shape and extent as read)."""

    __slots__ = ("name", "dtype", "shape", "offset", "nbytes", "raw_size", "flags", "old")

    def __init__(self, name, dtype, shape, offset, nbytes, raw_size, flags, old):
        self.name, self.dtype, self.shape, self.offset = name, dtype, shape, offset
        self.nbytes, self.raw_size, self.flags, self.old = nbytes, raw_size, flags, old


class _Edit:
    """The edited file's sections, computed from the parsed file before anything is written."""

    def __init__(self, layout, parsed, changes: _Changes, signing_key, path):
        self.layout, self.parsed, self.changes, self.path = layout, parsed, changes, path
        self.spec = layout is apr2
        entries = parsed.entries
        names = entries.names()
        for name in sorted(changes.drop) + sorted(changes.rename):
            if entries.find(name) < 0:
                shown = ", ".join(repr(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
                raise TensorNotFoundError(f"no tensor named {name!r}; the file has {len(names)}: {shown}", path=path)
        tail = 16 + (12 if self.spec else 0)
        rows, old_index_len = [], 0
        for i, name in enumerate(names):
            shape = entries.shape(i)
            old_index_len += 4 + len(name.encode("utf-8")) + 8 * len(shape) + tail
            if name in changes.drop:
                continue
            rows.append(_Row(changes.rename.get(name, name), entries.dtype_id(i), shape, entries.offset(i),
                             entries.size(i), entries.raw_size(i), entries.flags(i), i))
        self.old_index_len = old_index_len + (apr2.INDEX_HEADER_SIZE if self.spec else 0)
        rows.sort(key=lambda r: r.name)  # code-point order is UTF-8 byte order
        self.rows = rows
        self._check_names()
        self.meta_range = (parsed.header["metadata_offset"], parsed.header["metadata_size"])
        self.stored_meta = bytes(parsed.source.read(*self.meta_range, "metadata"))
        self.shard = isinstance(parsed.metadata.get("sharding"), dict)
        self.meta = self._metadata()
        self.flags = self._flags()
        self.index = self._index()
        self.security = getattr(parsed, "security", None)
        self.block_flags = 0
        if self.security is not None:
            self._check_signing(signing_key)
        elif signing_key is not None:
            raise LayoutError("signing_key was given but the file has no digest manifest to sign; sign it with "
                              "aprfast.tools.protection.sign_file (apr sign), which hashes every tensor", path=path)
        self.signing_key = signing_key
        self.changed = bool(changes.rename or changes.drop or self.meta != self.stored_meta
                            or self.flags != parsed.flags or signing_key is not None)

    # -- sections -----------------------------------------------------------------------
    def _check_names(self) -> None:
        most = apr2.MAX_NAME_BYTES if self.spec else aprender.MAX_NAME_BYTES
        for prev, row in zip([None, *self.rows], self.rows):
            if prev is not None and prev.name == row.name:
                raise LayoutError(f"two tensors would be named {row.name!r}", path=self.path)
            if row.name in self.changes.rename.values():
                try:
                    size = len(row.name.encode("utf-8"))
                except UnicodeEncodeError as exc:
                    raise LayoutError(f"tensor name {row.name!r} is not encodable as UTF-8: {exc.reason}",
                                      path=self.path) from None
                if size > most:
                    raise LayoutError(f"tensor name {row.name[:40]!r}... is {size} bytes; the {self.layout.NAME} "
                                      f"layout holds at most {most}", path=self.path)

    def _metadata(self) -> bytes:
        changes = self.changes
        renames_opaque = self.spec and (changes.rename or changes.drop) \
            and OPAQUE_NAMES_KEY.encode() in self.stored_meta
        if not changes.metadata and not renames_opaque:
            return self.stored_meta  # kept byte for byte (aprender's custom keys in its own order)
        values = caller_metadata(self.parsed)
        for key, value in changes.metadata.items():
            if value is None:
                values.pop(key, None)
            else:
                values[key] = value
        opaque = values.get(OPAQUE_NAMES_KEY)
        if self.spec and isinstance(opaque, dict):
            kept = {changes.rename.get(t, t): d for t, d in opaque.items() if t not in changes.drop}
            if kept:
                values[OPAQUE_NAMES_KEY] = kept
            else:
                values.pop(OPAQUE_NAMES_KEY)
        try:
            return self.layout.encode_metadata(values)
        except LayoutError as exc:
            raise LayoutError(f"the {self.layout.NAME} layout cannot hold the edited metadata: {exc.message}",
                              path=self.path) from None

    def _flags(self) -> int:
        flags, meta = self.parsed.flags, self.changes.metadata
        if not self.spec:
            for key, bit in (("sharding", "SHARDED"), ("quantization", "QUANTIZED")):
                if key in meta:  # as the writer sets them; bits another writer set stay otherwise
                    flags = flags | aprender.FLAGS[bit] if meta[key] is not None else flags & ~aprender.FLAGS[bit]
            return flags
        if self.changes.drop:
            if any(r.flags for r in self.rows):
                flags |= apr2.FLAGS["COMPRESSED"]
            else:
                flags &= ~apr2.FLAGS["COMPRESSED"]
            known = [APR2_IDS.dtype(r.dtype) for r in self.rows if APR2_IDS.knows(r.dtype)]
            if len(known) == len(self.rows):
                if any(d.packed for d in known):
                    flags |= apr2.FLAGS["QUANTIZED"]
                else:
                    flags &= ~apr2.FLAGS["QUANTIZED"]
        return flags

    def _index(self) -> bytes:
        rows = self.rows
        ids = {r.dtype: r.dtype for r in rows}
        body = _index.encode_entries(rows, [r.offset for r in rows], ids, self.spec, self.spec)
        if self.spec:
            return struct.pack("<II", len(rows), 0) + body
        return body

    def _check_signing(self, signing_key) -> None:
        block = self.security.block
        if block.flags & blk.SEALED:
            raise DecryptError("an encrypted file cannot be edited: every chunk's authentication binds the index "
                               "and metadata, so the edit would re-encrypt every byte (decrypt, edit, encrypt: "
                               "apr decrypt / apr edit / apr encrypt)", path=self.path)
        if block.flags & blk.SIGNED and signing_key is None:
            raise SignatureError("the file is signed: an edit changes what the signature covers, so it needs "
                                 "signing_key= (apr edit --signing-key) to sign it again", path=self.path)
        self.block_flags = block.flags | (blk.SIGNED if signing_key is not None else 0)
        if signing_key is not None:
            from ..crypto import core as crypto

            self.signer = bytes(crypto.public_key_of(signing_key))
        # every kept tensor's chunk records, in the new index order
        sizes = [self.parsed.entries.size(i) for i in range(len(self.parsed.entries))]
        shift = block.chunk_shift
        first, at = [], 0
        for size in sizes:
            first.append(at)
            at += -(-size >> shift)
        r = blk.record_size(block.flags)
        records = block.records
        pieces = [bytes(records[first[row.old] * r:(first[row.old] + (-(-row.nbytes >> shift))) * r])
                  for row in self.rows]
        self.records = b"".join(pieces)
        self.chunk_count = len(self.records) // r
        self.block_size = blk.block_size(self.block_flags, 0, self.chunk_count)

    def block(self, header: bytes) -> bytes:
        """The security block for ``header`` (b"" for a file without one)."""
        if self.security is None:
            return b""
        old = self.security.block
        body = blk.encode_fixed(self.block_flags, old.digest_id, old.chunk_shift, 0, self.block_size,
                                self.chunk_count) + self.records
        if self.block_flags & blk.SIGNED:
            from ..crypto import core as crypto
            from ..security.sealing import SIGNATURE_CONTEXT

            signature = crypto.sign([SIGNATURE_CONTEXT, header, self.meta, self.index, body], self.signing_key)
            body += bytes(signature) + self.signer
        body += struct.pack("<I", crc32(body, crc32(self.index, crc32(self.meta, crc32(header)))))
        assert len(body) == self.block_size
        return body

    def header(self, meta_off: int, index_off: int, data_off: int) -> bytes:
        p = self.parsed
        flags = self.flags
        if self.spec:
            if self.block_flags & blk.SIGNED:
                flags |= apr2.FLAGS["SIGNED"]
            return apr2.pack_header(flags, meta_off, len(self.meta), index_off, len(self.index), data_off,
                                    version=p.version)
        return aprender.pack_header(flags, len(self.rows), meta_off, len(self.meta), index_off, data_off,
                                    version=p.version)

    # -- where -------------------------------------------------------------------------
    def data_end(self) -> int:
        """Where the edited index says the data ends (aprender: every tensor padded to 64)."""
        ends = [r.offset + align(r.nbytes, aprender.ALIGNMENT) for r in self.rows]
        return max(ends, default=0)

    def span_length(self) -> int:
        """Bytes an in-place edit writes besides the header: metadata, index, block, tail."""
        if self.spec:
            return len(self.meta) + len(self.index) + (self.block_size if self.security else 0) + _SPAN_TAIL
        return align(len(self.meta), _SPAN_ALIGN) + len(self.index) + _SPAN_TAIL

    def _referenced(self) -> list:
        """[start, end) of every byte before the data the current header points at."""
        p = self.parsed
        start, size = self.meta_range
        ranges = [(start, start + size)]
        if self.spec:
            index_off, index_size = p.header["index_offset"], p.header["index_size"]
            block = len(self.security.block.raw) if self.security is not None else 0
            ranges.append((index_off, index_off + index_size + block))
        else:
            index_off = p.header["tensor_index_offset"]
            ranges.append((index_off, index_off + self.old_index_len))
        return sorted(r for r in ranges if r[1] > r[0])

    def _gaps(self):
        """Unreferenced [start, end) runs between the commit slot and the data; None
        when the file has no slot (something lies in it: saved without ``reserve``)."""
        slot_end = self.layout.SLOT_END
        ranges = self._referenced()
        if any(start < slot_end for start, _ in ranges):
            return None
        gaps, at = [], slot_end
        for start, end in ranges:
            if start > at:
                gaps.append((at, start))
            at = max(at, end)
        if self.parsed.data_start > at:
            gaps.append((at, self.parsed.data_start))
        return gaps

    def place_in_place(self):
        """The offset of the in-place span, or None when it must be rewritten."""
        if not self.spec and self.data_end() != self.parsed.data_len:
            return None  # aprender's footer sits where the index says the data ends
        need = self.span_length()
        gaps = self._gaps() or ()
        if need <= _PAGE:
            # within one page: the kernel copies it into the page cache whole, so even a
            # kill -9 during the write cannot leave half of it (docs/FORMAT.md §5.2)
            for start, end in gaps:
                at = align(start, _SPAN_ALIGN)
                if at % _PAGE + need > _PAGE:
                    at = align(at, _PAGE)
                if at + need <= end:
                    return at
        for start, end in gaps:
            at = align(start, _SPAN_ALIGN)
            if at + need <= end:
                return at
        return None

    def room(self) -> int:
        """The largest span an in-place edit could use now (0: none, the file has no slot)."""
        best = 0
        for start, end in self._gaps() or ():
            best = max(best, end - align(start, _SPAN_ALIGN))
        return best

    def room_after(self, span: int) -> int:
        """The largest gap left once the span at ``span`` is the file's (the old sections free)."""
        slot_end, data_off = self.layout.SLOT_END, self.parsed.data_start
        end = span + self.span_length() - _SPAN_TAIL
        before = span - align(slot_end, _SPAN_ALIGN)
        return max(before, data_off - align(end + _SPAN_TAIL, _SPAN_ALIGN), 0)

    def sections(self, span: int):
        """(header, span bytes without compensation) for the span at offset ``span``."""
        meta_off = span
        if self.spec:
            index_off = span + len(self.meta)
        else:
            index_off = span + align(len(self.meta), _SPAN_ALIGN)
        header = self.header(meta_off, index_off, self.parsed.data_start)
        block = self.block(header)
        body = self.meta + bytes(index_off - span - len(self.meta)) + self.index + block
        return header, body + bytes(_SPAN_TAIL)


# --- reading the file ------------------------------------------------------------------
def _open_for_edit(path: str) -> int:
    flags = os.O_RDWR | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags)
    except FileNotFoundError:
        raise AprFileNotFoundError(f"no such file: {path}", path=path) from None
    except PermissionError as exc:
        raise AprPermissionError(f"cannot open for writing: {exc.strerror}", path=path) from None
    except IsADirectoryError:
        raise AprIOError("is a directory, not an .apr file", path=path) from None
    except OSError as exc:
        raise AprIOError(f"cannot open for writing: {exc.strerror or exc}", path=path) from None


def _open_locked(path: str) -> int:
    """The file open for writing, under an exclusive ``flock``.  A rewrite replaces the
    file's inode, so an editor that waited for the lock checks it still holds the file
    the path names, and opens it again if not (else its edit would go to a dead inode)."""
    for _ in range(100):
        fd = _open_for_edit(path)
        try:
            if not _lock(fd, path):
                return fd
            now, held = os.stat(path), os.fstat(fd)
            if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                return fd
        except FileNotFoundError:
            pass  # replaced and gone between the two calls: try again
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise AprIOError("the file kept being replaced while waiting to edit it", path=path)


def _lock(fd: int, path) -> bool:
    """True once the exclusive lock is held; False where there are no locks."""
    if fcntl is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:  # a filesystem without locks: edits are then the caller's to serialise
        if exc.errno not in (getattr(os, "ENOLCK", 37), getattr(os, "EOPNOTSUPP", 95)):
            raise AprIOError(f"cannot lock the file: {exc.strerror or exc}", path=path) from None
        return False
    return True


def _layout_of(source, path):
    if is_v1(source):
        raise FormatError("aprfast.edit changes v2 files (APR\\0, APR2); a v1 APRN file keeps its metadata in its "
                          "payload container: load it with aprfast.v1.load_model and save it again", path=path)
    layout = detect(source)
    if layout not in (aprender, apr2):
        raise FormatError(f"the {layout.NAME} layout is read only; convert the file (aprfast.convert) to edit it",
                          path=path)
    return layout


def _parse(layout, source, path):
    limits = Limits()
    if layout is apr2:
        flags = struct.unpack("<I", bytes(source.read(8, 4, "header")))[0] if source.size >= 12 else 0
        if flags & apr2.FLAGS["ENCRYPTED"]:
            raise DecryptError("an encrypted file cannot be edited: every chunk's authentication binds the index "
                               "and metadata, so the edit would re-encrypt every byte (decrypt, edit, encrypt: "
                               "apr decrypt / apr edit / apr encrypt)", path=path)
        return layout.parse(source, limits, strict_dtypes=False)
    return layout.parse(source, limits, strict_dtypes=False)


# --- in place ----------------------------------------------------------------------------
def forge_crc32(region: bytes, target: int) -> bytes:
    """``region`` with its last four bytes replaced so that ``crc32(result) == target``.

    CRC32 over a fixed-length run is an affine map of its bits, and the map from the
    last four bytes to the CRC is invertible, so the four bytes are found by solving a
    32x32 linear system over GF(2): writing the result over bytes whose CRC32 is
    ``target`` leaves the CRC32 of the whole file unchanged (crc32_combine: a file's CRC
    depends on a run of its bytes only through the run's CRC and length).

    Args:
        region: At least four bytes; the last four are overwritten.
        target: The CRC32 the result must have.

    Returns:
        The new bytes.

    Raises:
        ValueError: ``region`` is shorter than four bytes.

    Examples:
        >>> import aprfast
        >>> from aprfast.tools.edit import forge_crc32
        >>> out = forge_crc32(b"new header" + bytes(4), aprfast.crc32(b"old header!!!!"))
        >>> aprfast.crc32(out) == aprfast.crc32(b"old header!!!!")
        True
    """
    if len(region) < 4:
        raise ValueError("forge_crc32 needs at least 4 bytes to change")
    head = crc32(region[:-4])
    base = crc32(bytes(4), head)
    # column j: how flipping bit j of the four bytes changes the CRC (linear over GF(2))
    rows = [(crc32((1 << j).to_bytes(4, "little"), head) ^ base, 1 << j) for j in range(32)]
    want, pivots = target ^ base, []
    for vec, combo in rows:  # Gaussian elimination: reduce each column by the pivots found so far
        for pvec, pcombo, bit in pivots:
            if vec & bit:
                vec, combo = vec ^ pvec, combo ^ pcombo
        if vec:
            pivots.append((vec, combo, vec & -vec))
    value = 0
    for pvec, pcombo, bit in pivots:
        if want & bit:
            want, value = want ^ pvec, value ^ pcombo
    if want:  # cannot happen: four trailing bytes reach every CRC32
        raise AssertionError("no four bytes give this CRC32")
    out = region[:-4] + value.to_bytes(4, "little")
    assert crc32(out) == target
    return out


def _pwrite(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while len(view):
        if hasattr(os, "pwrite"):
            n = os.pwrite(fd, view, offset)
        else:  # Windows: one writer holds the file (no concurrent positional users here)
            os.lseek(fd, offset, os.SEEK_SET)
            n = os.write(fd, view)
        view, offset = view[n:], offset + n


def _sync(fd: int) -> None:
    (getattr(os, "fdatasync", None) or os.fsync)(fd)


def _write_in_place(fd: int, new: _Edit, span: int, durable: bool, path) -> int:
    """Two CRC-neutral writes: the span (unreferenced bytes), then header and slot (one
    sector).  The footer is never written: after each write the file's CRC32 is the one
    it stores.  A crash before the second write leaves the old file (its header, and
    every byte it points at, unchanged); after it, the new one."""
    header, body = new.sections(span)
    slot_end = new.layout.SLOT_END
    try:
        old = _platform.pread(fd, len(body), span)
        body = forge_crc32(body, crc32(old))
        _pwrite(fd, body, span)
        if durable:
            _sync(fd)  # the new sections are on disk before a header points at them
        old_head = _platform.pread(fd, slot_end, 0)
        head = forge_crc32(header + bytes(slot_end - len(header)), crc32(old_head))
        _pwrite(fd, head, 0)
        if durable:
            _sync(fd)
    except OSError as exc:
        raise AprIOError(f"the in-place edit failed ({exc.strerror or exc}); the file reads as before it "
                         "unless the header write was the one that failed", path=path) from exc
    return len(body) + len(head)


# --- rewrite ----------------------------------------------------------------------------
def _rewrite(fd: int, path: str, new: _Edit, reserve, durable: bool):
    """A new file: prefix, the data section copied by the kernel, a footer whose CRC is
    derived from the old footer's.  Returns (bytes written, room left for edits)."""
    p, layout = new.parsed, new.layout
    if reserve is None:  # a file saved with room keeps room: at least two more edits of this size
        reserve = max(new.room(), 2 * new.span_length()) if new._gaps() is not None else 0
    slot_end = layout.SLOT_END if reserve else layout.HEADER_SIZE
    meta_off = slot_end
    if new.spec:
        index_off = meta_off + len(new.meta)
        index_end = index_off + len(new.index) + (new.block_size if new.security else 0)
    else:
        index_off = meta_off + align(len(new.meta), aprender.ALIGNMENT)
        index_end = index_off + align(len(new.index), aprender.ALIGNMENT)
    old_data = p.data_start
    need = index_end + reserve
    # keep the data's place modulo 64 (32- or 64-byte aligned tensors stay aligned)
    data_off = need + ((old_data - need) % 64)
    if not new.spec:
        data_off = align(need, aprender.ALIGNMENT)
    old_len = p.data_len
    copy_len = new.data_end() if not new.spec else old_len
    header = new.header(meta_off, index_off, data_off)
    block = new.block(header)
    if new.spec:
        body = new.meta + new.index + block
    else:
        body = new.meta + bytes(index_off - meta_off - len(new.meta)) + new.index
    prefix = header + bytes(meta_off - len(header)) + body
    prefix += bytes(data_off - len(prefix))
    data_crc = _data_crc(fd, p, old_data, old_len, copy_len)
    crc = crc32_combine(crc32(prefix), data_crc, copy_len)
    total = data_off + copy_len + layout.FOOTER_SIZE
    footer = apr2.pack_footer(crc, total) if new.spec else struct.pack("<I", crc)
    target = os.path.realpath(path)
    mode = os.fstat(fd).st_mode & 0o7777
    atomic = AtomicFile(target, durable=durable)
    try:
        _write_all(atomic.fd, prefix)
        if copy_len and not kernel_copy(fd, atomic.fd, old_data, copy_len):
            _copy_through_memory(fd, atomic.fd, old_data, copy_len)
        _write_all(atomic.fd, footer)
        if hasattr(os, "fchmod"):
            os.fchmod(atomic.fd, mode)
    except OSError as exc:
        atomic.abort()
        raise AprIOError(f"cannot rewrite the file: {exc.strerror or exc}; it is left as it was", path=path) from exc
    except BaseException:
        atomic.abort()
        raise
    atomic.commit()
    room = data_off - align(index_end, _SPAN_ALIGN) if reserve else 0
    return total, max(room, 0)


def _data_crc(fd: int, parsed, start: int, old_len: int, keep: int) -> int:
    """CRC32 of the first ``keep`` of the ``old_len`` data bytes at ``start``, from the
    stored CRC: crc(prefix || data) = crc32_combine(crc(prefix), crc(data), len(data)),
    so crc(data) follows from the footer and the prefix alone.  When the tail is cut
    (aprender, the last tensors dropped) only the tail is read, and the combine undone:
    shifting a CRC by n zero bytes is multiplication by x^(8n) modulo the polynomial,
    and x^(8(2^32-1)) is 1 modulo CRC-32's, so the inverse shift is by 2^32-1-n."""
    prefix_crc = _crc_of(fd, 0, start)
    data = parsed.stored_crc ^ crc32_combine(prefix_crc, 0, old_len)
    if keep == old_len:
        return data
    tail = old_len - keep
    shifted = data ^ _crc_of(fd, start + keep, tail)
    return crc32_combine(shifted, 0, _MASK32 - (tail % _MASK32))


def _crc_of(fd: int, offset: int, n: int, piece: int = 8 << 20) -> int:
    value = 0
    while n:
        chunk = _platform.pread(fd, min(n, piece), offset)
        if not chunk:
            raise AprIOError("the file ended early while it was being edited")
        value = crc32(chunk, value)
        offset += len(chunk)
        n -= len(chunk)
    return value


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while len(view):
        view = view[os.write(fd, view):]


def _copy_through_memory(src: int, dst: int, offset: int, n: int) -> None:
    while n:
        chunk = _platform.pread(src, min(n, 8 << 20), offset)
        if not chunk:
            raise AprIOError("the file ended early while it was being edited")
        _write_all(dst, chunk)
        offset += len(chunk)
        n -= len(chunk)

