"""Reading v2 files: :class:`AprFile` (what ``aprfast.open`` returns) and eager loads.

An AprFile parses the header and index once, then hands out tensors: zero-copy
read-only views of the mapped file by default, or owned arrays in aligned memory
(``copy=True``, or whenever the source is read with ``pread``).  Slices read only the
bytes they need.  All methods are safe to call from several threads at once.
"""

from __future__ import annotations

import contextlib

import numpy as np

from .. import _memory, layouts
from .._crc import crc32, crc32_combine
from ..codecs import blocks as tensor_codecs
from ..dtypes import OPAQUE_APR2_ID, OPAQUE_NAMES_KEY, IdTable, numpy_dtype
from ..errors import AprError, ChecksumError, LayoutError, UnknownDTypeError
from ..io.sources import open_source
from ..limits import Limits
from ..numerics import compressed, quantization
from ..security import refuse_keys
from ..tensors import QuantizedTensor, RawTensor, TensorInfo
from .handle import TensorMapping

__all__ = ["AprFile", "TensorSlice", "QuantizedSlice", "RunningCrc", "aligned_empty"]


def aligned_empty(nbytes: int, alignment: int = 64, *, filled_by_read: bool = False) -> np.ndarray:
    """A writable uint8 array of ``nbytes`` whose data starts on ``alignment``.

    The memory is not initialised (as ``numpy.empty``).  It is what owned tensors are
    made of: reading a file's bytes into it keeps the 64-byte alignment SIMD kernels
    and ``torch.from_numpy`` like.

    Args:
        nbytes: Size in bytes.
        alignment: A power of two up to :data:`aprfast.limits.MAX_ALIGNMENT`.
        filled_by_read: One read fills it next, so it need not be touched first (see
            ``_memory.AlignedBuffer``).

    Returns:
        A 1-D ``uint8`` NumPy array of ``nbytes`` elements.

    Raises:
        ValueError: ``alignment`` is not a power of two within the limit, or ``nbytes``
            is negative.

    Examples:
        >>> import aprfast
        >>> buf = aprfast.aligned_empty(100, 64)
        >>> buf.shape, buf.dtype.name, buf.ctypes.data % 64, buf.flags.writeable
        ((100,), 'uint8', 0, True)
    """
    return np.frombuffer(_memory.AlignedBuffer(nbytes, alignment, filled_by_read=filled_by_read), np.uint8, nbytes)


#: get_tensors reads tensors this close to each other (bytes between them) in one read.
_BATCH_GAP = 64 << 10

#: get_tensors puts the reads of spans smaller than this into one shared buffer.
_PACKED_SPAN = 1 << 20

#: An eager load of a file with at least OVERLAP_MIN_TENSORS tensors in a data section of
#: at least OVERLAP_MIN_BYTES reads the section on a thread of its own while the calling
#: thread makes the arrays over the buffer (which does not touch the bytes).  Why: for
#: 10,000 tensors of 1 KiB the read took 0.93 ms and the arrays 1.16 ms, one after the
#: other.  Why the bounds (repeated loads of one file, 2-core VM, a scratch sweep): the
#: thread's start and join and the read running on another core than the last one cost
#: about 0.05-0.1 ms, so the overlap pays only where both the arrays (about 0.1 us a
#: tensor) and the read (about 0.1 ms a MiB) take longer than that: 2,048 x 1 KiB
#: 0.37 ms against 0.47, 4,096 x 1 KiB 0.65 against 0.88, 10,000 x 1 KiB 1.5 against
#: 2.2 (ms); but 1,024 x 1 KiB and 4,096 x 256 B level, and slower: 2,048 x 64 B 0.39
#: against 0.34, 256 x 16 KiB 0.49 against 0.37, 300 x 1 MiB 21.7 against 21.3.
OVERLAP_MIN_TENSORS = 2048
OVERLAP_MIN_BYTES = 2 << 20

#: get_tensor remembers this many zero-copy views per file (one small object each), so
#: asking again for a tensor costs a view() instead of building an array.
_MAX_REMEMBERED_VIEWS = 4096


class AprFile(TensorMapping):
    """An open ``.apr`` v2 file (either layout).  Use as a context manager.

    ``mode`` is "mmap" (default for files), "pread" or "direct" (owned arrays read
    around the page cache, :mod:`aprfast.io.direct`); ``limits`` bounds what the
    parser believes; ``unknown_dtypes="raw"`` returns tensors of unknown dtype ids as
    :class:`RawTensor` instead of failing at open; ``verify=True`` checks the whole-file
    CRC32 at open; ``alignment`` is the alignment of owned arrays.  ``keys``: a dict of
    ``password``, ``private_key``, ``trusted_keys``, ``require_signature``,
    ``allow_unencrypted`` as :func:`aprfast.open` takes them (an encrypted or signed
    APR2 file is read through :class:`aprfast.security.SecureSource`).  Open files with
    :func:`aprfast.open`, which also takes URLs, v1 files and sharded models; AprFile
    is what it returns for a v2 file.  See docs/guide/saving-and-loading.md.

    It is a read-only mapping of names (``keys()``, ``name in f``, ``len(f)``,
    iteration), and pickles as the arguments that opened it (docs/guide/distributed.md).

    Args:
        target: A path, a readable seekable file object, or bytes-like data.
        mode: "mmap", "private" (copy-on-write map), "pread" or "direct";
            ``None`` picks.
        limits: Bounds on what the parser believes.
        unknown_dtypes: "error" or "raw".
        verify: Check the whole-file CRC32 at open.
        alignment: Alignment of owned arrays handed out.
        keys: Key options of an encrypted or signed file, as :func:`aprfast.open`
            takes them.

    Raises:
        FormatError: Not a v2 ``.apr`` file (UnknownDTypeError: an unknown dtype id
            with ``unknown_dtypes="error"``).
        CorruptError: The header or index contradicts itself (ChecksumError: a CRC
            mismatch with ``verify=True``).
        LimitError: The file asks for more than ``limits`` allow.
        DecryptError: A wrong key, or a key for a file that is not encrypted.
        SignatureError: A required signature is missing or wrong.
        ValueError: A bad ``unknown_dtypes``.

    Examples:
        >>> import numpy as np, aprfast
        >>> blob = aprfast.save({"w": np.arange(6, dtype=np.float32).reshape(2, 3)})
        >>> with aprfast.open(blob) as f:
        ...     print(type(f).__name__, f.layout, len(f), "w" in f)
        ...     print(f.get_tensor("w")[1])
        AprFile aprender 1 True
        [3. 4. 5.]
    """

    def __init__(self, target, *, mode: str | None = None, limits: Limits | None = None,
                 unknown_dtypes: str = "error", verify: bool = False, alignment: int = 64, keys=None):
        if unknown_dtypes not in ("error", "raw"):
            raise ValueError(f"unknown_dtypes must be 'error' or 'raw', not {unknown_dtypes!r}")
        self.alignment = alignment
        self._makers = {}
        self._views = {}  # name -> a zero-copy view handed out before (get_tensor's fast path)
        self._copies = {}  # name -> (offset, size, shape, maker) of a plain mapped tensor copied before
        self._slices = {}  # name -> the TensorSlice get_slice made before
        self._whole = None
        self._tables = {}
        self._source = open_source(target, mode=mode)
        try:
            layout = layouts.detect(self._source)
            if layout is layouts.apr2:
                try:
                    self._file = layout.parse(self._source, limits or Limits(),
                                              strict_dtypes=unknown_dtypes == "error", keys=keys)
                except UnknownDTypeError as exc:
                    raise _named_unknown(exc, layout, self._source, limits, keys) from None
            else:
                refuse_keys(keys or {}, self._source.path)
                self._file = layout.parse(self._source, limits or Limits(), strict_dtypes=unknown_dtypes == "error")
            self._raw_source = self._source
            if self._file.security is not None:  # tensor bytes checked and decrypted as they are read
                self._source = self._file.source
            if verify:
                self.verify()
        except BaseException:
            self._source.close()
            raise

    # --- what the file holds ------------------------------------------------------
    @property
    def layout(self) -> str:
        """"aprender" (APR\\0) or "apr2" (the spec's APR2).

        Examples:
            >>> import numpy as np, aprfast
            >>> with aprfast.open(aprfast.save({"w": np.zeros(1)}, layout="apr2")) as f:
            ...     f.layout
            'apr2'
        """
        return self._file.layout

    @property
    def header(self) -> dict:
        """The decoded file header: magic, version, flags, sizes and offsets.

        Examples:
            >>> import numpy as np, aprfast
            >>> with aprfast.open(aprfast.save({"w": np.zeros(1)})) as f:
            ...     f.header["version"], f.header["tensor_count"]
            ('2.0', 1)
        """
        return dict(self._file.header)

    @property
    def metadata(self) -> dict:
        """The metadata exactly as the writer was given it (``{}`` for none).  The keys a
        layout adds to every file (aprender's typed defaults, APR2's ``apr_version``)
        are in :attr:`stored_metadata`.

        Examples:
            >>> import numpy as np, aprfast
            >>> with aprfast.open(aprfast.save({"w": np.zeros(1)}, metadata={"arch": "mlp"})) as f:
            ...     f.metadata
            {'arch': 'mlp'}
        """
        return layouts.caller_metadata(self._file)

    @property
    def stored_metadata(self) -> dict:
        """Every key the file's metadata block holds, layout defaults included.

        Examples:
            >>> import numpy as np, aprfast
            >>> with aprfast.open(aprfast.save({"w": np.zeros(1)}, layout="apr2")) as f:
            ...     sorted(f.stored_metadata)
            ['apr_version']
        """
        return self._file.metadata

    @property
    def path(self):
        """The path or URL the file was opened from; None for a buffer.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"w": np.zeros(1)}, "m.apr")
            >>> with aprfast.open("m.apr") as f:
            ...     f.path
            'm.apr'
        """
        return self._source.path

    @property
    def security(self) -> dict | None:
        """For an encrypted or signed APR2 file: encrypted, names_encrypted, signed,
        digest, chunk_size, chunk_count, encryption (key mode), signature ("trusted",
        "self-signed", "unsigned"), signer (hex).  None for other files.
        See docs/guide/encryption.md.

        Examples:
            >>> import numpy as np, aprfast
            >>> blob = aprfast.save({"w": np.zeros(4, np.float32)}, password="pw")
            >>> with aprfast.open(blob, password="pw") as f:
            ...     f.security["encrypted"], f.security["signed"]
            (True, False)
        """
        sec = self._file.security
        return sec.describe() if sec is not None else None

    def keys(self) -> list:
        """The tensor names, in index order.

        Examples:
            >>> import numpy as np, aprfast
            >>> with aprfast.open(aprfast.save({"b": np.zeros(1), "a": np.zeros(1)})) as f:
            ...     f.keys()
            ['a', 'b']
        """
        return list(self._file.names)

    def __iter__(self):
        return iter(self._file.names)

    def __len__(self) -> int:
        return len(self._file.names)

    def __contains__(self, name) -> bool:
        return name in self._file.position

    def info(self, name: str) -> TensorInfo:
        """dtype, shape, absolute offset and stored byte size of one tensor.

        Args:
            name: The tensor's name.

        Returns:
            A :class:`aprfast.TensorInfo`.

        Raises:
            TensorNotFoundError: The file has no tensor ``name``.

        Examples:
            >>> import numpy as np, aprfast
            >>> with aprfast.open(aprfast.save({"w": np.zeros((2, 3), np.float16)})) as f:
            ...     info = f.info("w")
            >>> info.dtype_name, info.shape, info.nbytes
            ('F16', (2, 3), 12)
        """
        return self._file.info(name)

    # --- tensors ------------------------------------------------------------------
    def get_tensor(self, name: str, copy: bool = False, dequantize: bool = False):
        """The tensor ``name``: a NumPy array, or a QuantizedTensor/RawTensor for packed
        or unknown dtypes.  Without ``copy`` it is a read-only view of the mapped file
        when the file is mapped; with ``copy`` an owned, aligned, writable array.
        ``dequantize=True`` turns packed tensors into owned float32 arrays (other
        tensors come back as without it).

        A compressed tensor (APR2 per-tensor LZ4/zstd) is always an owned array, whatever
        ``copy`` says: zero-copy is impossible, since its bytes in the file are not its
        values.  All its blocks are decoded at once, in C, on every core.

        A tensor of an encrypted or signed APR2 file is an owned array too: its chunks
        are read into it, checked against their digests and decrypted in place
        (AES-256-GCM through OpenSSL or libsodium, without the GIL, chunks on every
        core), so the bytes served are the bytes checked.

        Args:
            name: The tensor's name.
            copy: Return an owned, aligned, writable array instead of a view.
            dequantize: Return packed tensors as float32 arrays.

        Returns:
            A NumPy array, or :class:`aprfast.QuantizedTensor` / :class:`aprfast.RawTensor`.

        Raises:
            TensorNotFoundError: The file has no tensor ``name`` (also a KeyError).
            AprIOError: The file is closed, or a read failed.
            CorruptError: A compressed tensor's blocks do not decode.
            DecryptError: A chunk of an encrypted tensor fails its AES-GCM tag.
            SignatureError: A chunk of a signed tensor does not match its digest.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"w": np.float32([1, 2, 3])}, "m.apr")
            >>> with aprfast.open("m.apr") as f:
            ...     view = f.get_tensor("w")
            ...     owned = f.get_tensor("w", copy=True)
            >>> view.flags.writeable, owned.flags.writeable, owned
            (False, True, array([1., 2., 3.], dtype=float32))
        """
        if dequantize and name in self.compressed_weights:
            return self._compressed_values(name)
        if not copy:
            seen = self._views.get(name)
            if seen is not None and not self._source.closed:
                return seen.view()  # a new array object over the same bytes: 4x cheaper than building one
        elif not dequantize:
            plan = self._copies.get(name)
            if plan is not None:  # a plain tensor of a mapped file: one lookup, one C copy
                offset, size, shape, make = plan
                return make(shape, _memory.copy_range(self._mapped(), offset, size, self.alignment), 0, size)
        type_id, offset, size, shape = self._file.row(name)
        make = self._makers.get(type_id) or self.array_maker(type_id)
        codec = self._file.codec(name)
        if codec:
            raw = tensor_codecs.read_range(self, name, 0, codec[1])
            tensor = make(shape, raw.base, 0, codec[1])
        elif copy or not self._source.zero_copy:
            start = 0
            if self._source.zero_copy:  # a memcpy from the map: no system call
                owned = _memory.copy_range(self._mapped(), offset, size, self.alignment)
                if len(self._copies) < _MAX_REMEMBERED_VIEWS:
                    self._copies[name] = (offset, size, shape, make)
            elif self._source.direct_align:  # placed so the device writes straight into it
                arena = self._arena(offset, size)
                self._source.readinto(offset, arena)
                owned, start = _base_and_start(arena)
            else:
                owned = _memory.AlignedBuffer(size, self.alignment)
                self._source.readinto(offset, owned)
            tensor = make(shape, owned, start, size)
        else:
            tensor = make(shape, self._mapped(), offset, size)
            if type(tensor) is np.ndarray and len(self._views) < _MAX_REMEMBERED_VIEWS:
                # the remembered array is never handed out: a caller may reshape theirs in place
                self._views[name] = tensor
                tensor = tensor.view()
        if dequantize and isinstance(tensor, QuantizedTensor):
            return quantization.dequantize(tensor)
        return tensor

    @property
    def compressed_weights(self) -> dict:
        """The weights of a compressed-tensors checkpoint this file was imported from:
        ``{weight name: record}`` (format, scheme, the names of its scale tensors;
        docs/FORMAT.md "compressed-tensors"), {} for other files.  ``get_tensor(name,
        dequantize=True)`` of such a weight gives the values compressed-tensors'
        decompression gives.

        Example:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"w": np.zeros(2, np.float32)}, "m.apr")
            >>> with aprfast.open("m.apr") as f:
            ...     f.compressed_weights
            {}
        """
        found = getattr(self, "_ct_weights", None)
        if found is None:
            block = self.metadata.get(compressed.METADATA_KEY)
            weights = block.get("weights") if isinstance(block, dict) else None
            found = self._ct_weights = weights if isinstance(weights, dict) else {}
        return found

    def _compressed_values(self, name: str):
        def info(tensor):
            if not isinstance(tensor, str) or tensor not in self:
                return None
            i = self.info(tensor)
            return (i.dtype_name, i.shape)

        return compressed.weight_values(name, self.compressed_weights[name], self.get_tensor, info)

    def get_tensors(self, names, copy: bool = False) -> dict:
        """Several tensors at once, as :meth:`get_tensor` gives them one by one, with the
        reads batched: on a file read with ``pread`` or ``direct`` (or with ``copy``),
        the tensors asked for are sorted by offset and those lying within 64 KiB of each
        other are read with one read into one buffer they then view, so 1,000 small
        tensors cost a few system calls, not 1,000.  No Python code runs per tensor: the
        names are found, the reads planned and the arrays made in C and NumPy calls
        whose number grows with the reads, not the names (compressed tensors and those of
        an encrypted or signed file excepted: those are read one by one).

        Args:
            names: The tensors' names (an iterable of str; repeats are read once).
            copy: Owned arrays instead of views of the mapped file.

        Returns:
            A dict of name to tensor, in the order of ``names``.

        Raises:
            TensorNotFoundError: A name the file does not hold (nothing is read).
            AprIOError: The file is closed, or a read failed.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({f"e{i}": np.full(3, i, np.float32) for i in range(4)}, "m.apr")
            >>> with aprfast.open("m.apr", mode="pread") as f:
            ...     got = f.get_tensors(["e3", "e1"])
            >>> list(got), got["e3"].tolist()
            (['e3', 'e1'], [3.0, 3.0, 3.0])
        """
        names = list(dict.fromkeys(names))
        f = self._file
        if not names:
            return {}
        if getattr(f.entries, "compressed", 0) or f.security is not None:  # decoded or checked tensor by tensor
            for name in names:  # every name checked before anything is read
                f.row(name)
            return {name: self.get_tensor(name, copy) for name in names}
        # positions, offsets and sizes found in C; spans, reads and arrays in a few calls
        # whatever the count: no Python bytecode runs per tensor
        positions, offsets, sizes = f.entries.locate(names)
        if (positions < 0).any():
            f.row(names[int(np.argmax(positions < 0))])  # raises TensorNotFoundError
        offsets += f.data_start
        dtypes, make_one = _plain_dtypes(f.ids), _maker_for(f.ids)
        if self._source.zero_copy and not copy:  # views of the map, as tensors() makes them
            return dict(zip(names, f.entries.views_at(positions, offsets, np.zeros(len(names), np.int64),
                                                      [self._mapped()], dtypes, make_one)))
        order = np.argsort(offsets, kind="stable")
        lo_sorted = offsets[order]
        hi_sorted = np.maximum.accumulate(lo_sorted + sizes[order])
        # a new span where a tensor starts more than _BATCH_GAP after everything before it
        # ends (the running maximum over all earlier tensors is the current span's: a span
        # begins only past every earlier end)
        firsts = np.flatnonzero(lo_sorted[1:] - hi_sorted[:-1] > _BATCH_GAP) + 1
        lasts = np.append(firsts - 1, len(names) - 1)
        firsts = np.insert(firsts, 0, 0)
        span = np.empty(len(names), np.int64)  # each name's span
        span[order] = np.repeat(np.arange(len(firsts), dtype=np.int64), lasts - firsts + 1)
        buffers, buffer_of, bases = self._read_spans(lo_sorted[firsts], hi_sorted[lasts])
        return dict(zip(names, f.entries.views_at(positions, offsets - bases[span], buffer_of[span], buffers, dtypes,
                                                  make_one)))

    def _read_spans(self, los, his):
        """The file's bytes ``[los[i], his[i])`` for each span ``i`` (int64 arrays), read:
        (the buffers, each span's buffer, the file offset each span's buffer holds at its
        byte 0, as int64 arrays).

        Spans under ``_PACKED_SPAN`` share one buffer, each placed on its file offset's
        alignment (the tensors keep their 64-byte alignment): a thousand spread small
        tensors are one allocation, not a thousand, which the heap would trim and fault
        in again at every call (16 MiB of faults per call measured here for 1,000 x
        16 KiB).  Larger spans get a buffer each, so that one tensor kept alive does not
        keep a large neighbour's memory."""
        source = self._source
        alignment = max(self.alignment, 64)
        sizes = his - los
        count = len(los)
        if source.direct_align:  # each placed for direct I/O
            buffers, bases = [], np.empty(count, np.int64)
            for i, (lo, hi) in enumerate(zip(los.tolist(), his.tolist())):
                arena = self._arena(lo, hi - lo)
                if hi > lo:
                    source.readinto(lo, arena)
                buffer, start = _base_and_start(arena)
                buffers.append(buffer)
                bases[i] = lo - start
            return buffers, np.arange(count, dtype=np.int64), bases
        small = sizes < _PACKED_SPAN
        pad = np.where(small, los % alignment, 0)
        slots = np.where(small, (pad + sizes + alignment - 1) // alignment * alignment, 0)
        at = np.cumsum(slots) - slots + pad  # where each small span starts in the shared buffer
        big = np.flatnonzero(~small).tolist()
        buffers = [_memory.AlignedBuffer(int(slots.sum()), alignment, filled_by_read=source.reads_by_pread)]
        buffer_of = np.zeros(count, np.int64)
        buffer_of[big] = np.arange(1, len(big) + 1)
        bases = los - at
        bases[big] = los[big]
        shared = memoryview(buffers[0])
        lo_list, size_list, at_list = los.tolist(), sizes.tolist(), at.tolist()
        pieces = [(lo, shared[start:start + n]) for lo, start, n in zip(lo_list, at_list, size_list)]
        for i in big:
            pieces[i] = (lo_list[i], _memory.AlignedBuffer(size_list[i], alignment,
                                                           filled_by_read=source.reads_by_pread))
            buffers.append(pieces[i][1])
        pieces = [piece for piece, n in zip(pieces, size_list) if n]
        if source.zero_copy:  # copies from the map: a memcpy each, no system call
            mapped = self._mapped()
            for lo, out in pieces:
                out = np.frombuffer(out, np.uint8)
                out[:] = mapped[lo:lo + out.size]
        else:  # one call into the source for every span (spread tensors are a read each)
            source.readinto_many(pieces)
        return buffers, buffer_of, bases

    def _table(self, name):
        """The checked block-table header of a compressed tensor (read once)."""
        table = self._tables.get(name)
        if table is None:
            _type, offset, size, _shape = self._file.row(name)
            flags, raw_size = self._file.codec(name)
            table = self._tables[name] = tensor_codecs.read_table(self._source, name, offset, size, raw_size, flags)
        return table

    def _raw_bytes(self, info, start: int, stop: int) -> np.ndarray:
        """Bytes [start, stop) of a tensor's values: decoded blocks when compressed, else
        read from the file (an owned uint8 array either way)."""
        if self._file.codec(info.name):
            return tensor_codecs.read_range(self, info.name, start, stop)
        out = aligned_empty(stop - start, self.alignment)
        if stop > start:
            self._source.readinto(info.offset + start, out)
        return out

    def array_maker(self, type_id):
        """The function that builds tensors of dtype id ``type_id`` from this file's bytes
        (made once per dtype id and remembered; used by the readers built on AprFile)."""
        make = self._makers[type_id] = array_maker(self._file.ids, type_id)
        return make

    def _mapped(self) -> np.ndarray:
        """The whole mapped file as one uint8 array.  Tensor views are made from it
        (cheaply, with np.ndarray) and keep it as their base; it holds a buffer export
        of the map, so the map cannot be unmapped under any live view, even after
        close()."""
        whole = self._whole
        if whole is None or self._source.closed:  # buffer() raises once closed; a cached
            # array set by a read that raced close() must not outlive the handle
            whole = self._whole = np.frombuffer(self._source.buffer(), np.uint8)
        return whole

    def get_slice(self, name: str, dequantize: bool = False):
        """A lazy handle whose ``[...]`` reads only the rows/blocks a NumPy basic index needs.

        Packed tensors of per-row block types (GGML, K-quants) give a QuantizedSlice:
        ``[a:b]`` reads rows a..b along axis 0 and returns a QuantizedTensor (float32
        with ``dequantize=True``).  For a compressed tensor (APR2 per-tensor codec) only
        the blocks holding the axis-0 rows the key touches are read and decoded.  For
        an encrypted or signed APR2 file only the 1 MiB chunks the key touches are read,
        checked and decrypted.

        Args:
            name: The tensor's name.
            dequantize: For a packed tensor, return float32 values from ``[a:b]``.

        Returns:
            A :class:`TensorSlice`, or a :class:`QuantizedSlice` for a packed tensor.

        Raises:
            TensorNotFoundError: The file has no tensor ``name``.
            LayoutError: A packed tensor whose blocks do not follow rows (APR_Q4, APR_Q8,
                Q8_TENSOR) or a 0-d packed tensor: read it with :meth:`get_tensor`.

        Examples:
            >>> import numpy as np, aprfast
            >>> blob = aprfast.save({"w": np.arange(12, dtype=np.float32).reshape(4, 3)})
            >>> with aprfast.open(blob) as f:
            ...     print(f.get_slice("w")[1:3, ::2])
            [[3. 5.]
             [6. 8.]]
        """
        made = self._slices.get(name)
        if made is not None:  # stateless apart from its cached view: shared, built once
            return made
        info = self._file.info(name)
        if info.dtype is not None and info.dtype.packed:
            return QuantizedSlice(self, info, dequantize)
        made = TensorSlice(self, info)
        if len(self._slices) < _MAX_REMEMBERED_VIEWS:
            self._slices[name] = made
        return made

    def tensors(self, copy: bool = False) -> dict:
        """Every tensor, by name (compressed ones owned, see get_tensor).

        Args:
            copy: Owned arrays instead of views of the mapped file.

        Returns:
            A dict of name to tensor, in index order.

        Raises:
            AprIOError: The file is closed, or a read failed.

        Examples:
            >>> import numpy as np, aprfast
            >>> with aprfast.open(aprfast.save({"w": np.zeros(2, np.float32)})) as f:
            ...     f.tensors(copy=True)
            {'w': array([0., 0.], dtype=float32)}
        """
        f = self._file
        if not copy and self._source.zero_copy and f.security is None and not getattr(f.entries, "compressed", 0) \
                and hasattr(f.entries, "tensors_in"):
            # views of the map, O(1) Python work per tensor (what load_file's default
            # returns): as get_tensor gives them, read-only unless the buffer is writable
            return f.entries.tensors_in(f.data_start, self._mapped(), 0, _plain_dtypes(f.ids),
                                        _maker_for(f.ids))
        return {name: self.get_tensor(name, copy) for name in f.names}

    # --- integrity and lifetime ---------------------------------------------------
    def verify(self) -> None:
        """Check the footer CRC32 over every byte before it; raise ChecksumError if not.
        An encrypted or signed APR2 file then has every chunk checked (digest, AES-GCM
        tag), which reads every tensor once (the signature was checked at open).

        Raises:
            ChecksumError: The footer CRC32 does not match the bytes.
            DecryptError: A chunk of an encrypted file fails its AES-GCM tag.
            SignatureError: A chunk of a signed file does not match its digest.
            AprIOError: The file is closed, or a read failed.

        Examples:
            >>> import numpy as np, aprfast
            >>> blob = bytearray(aprfast.save({"w": np.zeros(4, np.float32)}))
            >>> blob[-20] ^= 1  # flip a bit of the tensor data
            >>> with aprfast.open(bytes(blob)) as f:
            ...     f.verify()
            Traceback (most recent call last):
            ...
            aprfast.errors.ChecksumError: [E004] footer CRC32 is ...
        """
        end = self._file.footer_crc_offset
        raw = self._raw_source
        if raw.zero_copy:
            actual = crc32(raw.view(0, end))
        else:
            actual = crc_by_chunks(raw, end)
        if actual != self._file.stored_crc:
            raise ChecksumError(f"footer CRC32 is {self._file.stored_crc:#010x} but bytes 0..{end} give "
                                f"{actual:#010x}", path=self.path)
        if self._file.security is not None:
            self._file.security.verify_all(raw)

    def running_crc(self):
        """A :class:`RunningCrc` that checks the footer CRC32 over the stored bytes a
        reader feeds it as it reads them, in any order (the converter,
        :class:`aprfast.files.integrity.CheckedReader`: no second pass over the file),
        or None where it cannot (an encrypted or signed file, whose chunks are
        checked as they are read and whose whole-file checks :meth:`verify` makes; a
        stream whose footer is not known).

        Returns:
            A :class:`RunningCrc`, or None.

        Examples:
            >>> import numpy as np, aprfast
            >>> with aprfast.open(aprfast.save({"w": np.zeros(4, np.float32)})) as f:
            ...     crc = f.running_crc()
            ...     info = f.info("w")
            ...     crc.feed(info.offset, info.nbytes)
            ...     crc.finish()
        """
        f = self._file
        if f.security is not None or f.footer_crc_offset is None:
            return None
        stored = f.stored_crc
        if stored is None:
            return None
        return RunningCrc(self._raw_source, f.footer_crc_offset, stored, self.path)

    def stored_bytes(self, name: str):
        """A zero-copy, read-only view of tensor ``name``'s bytes as the file stores them
        (compressed blocks, sealed ciphertext: not its values) when the file is mapped,
        else None.  Nothing is read until the view is: a whole-file reader feeds it to
        :meth:`running_crc` beside the tensor it reads from the same pages.

        Args:
            name: The tensor's name.

        Returns:
            A memoryview, or None for a file that is not mapped.

        Raises:
            TensorNotFoundError: The file has no tensor ``name``.

        Examples:
            >>> import numpy as np, aprfast
            >>> with aprfast.open(aprfast.save({"w": np.float32([1, 2])})) as f:
            ...     bytes(f.stored_bytes("w")) == np.float32([1, 2]).tobytes()
            True
        """
        info = self._file.info(name)
        raw = self._raw_source
        if not raw.zero_copy:
            return None
        return raw.view(info.offset, info.nbytes, "tensor")

    def close(self) -> None:
        """Release the file (idempotent); arrays already handed out stay valid.

        Examples:
            >>> import numpy as np, aprfast
            >>> f = aprfast.open(aprfast.save({"w": np.zeros(2)}))
            >>> w = f.get_tensor("w")
            >>> f.close()
            >>> f.closed, w.tolist()
            (True, [0.0, 0.0])
        """
        self._whole = None  # views handed out keep the map alive; this handle need not
        self._views, self._copies, self._slices = {}, {}, {}
        self._source.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._source.closed

    def _describe(self) -> str:
        return f"{self.path or '<buffer>'} layout={self.layout}"

    # --- eager loading ------------------------------------------------------------
    def load_all(self, *, verify: bool = True, threads: int = 0) -> dict:
        """Read the whole data section into one aligned buffer with parallel reads,
        checking the footer CRC on the way, and return every tensor as an owned array
        viewing that buffer (each 64-byte aligned, like the file); for a file of many
        small tensors the read runs on a thread of its own while the arrays are made
        (:data:`OVERLAP_MIN_TENSORS`).  Compressed tensors are
        decoded batch by batch into the same kind of buffer.  What
        :func:`aprfast.load_file` with ``mmap=False`` returns.

        Args:
            verify: Check the footer CRC on the way.
            threads: Threads for the parallel read (0: one per idle core).

        Returns:
            A dict of name to owned, writable array, in index order.

        Raises:
            ChecksumError: ``verify`` and the CRC does not match.
            AprIOError: The file is closed, or a read failed.

        Examples:
            >>> import numpy as np, aprfast
            >>> aprfast.save_file({"a": np.ones(2, np.float32), "b": np.zeros(3, np.float32)}, "m.apr")
            >>> with aprfast.open("m.apr", mode="pread") as f:
            ...     tensors = f.load_all()
            >>> tensors["a"], tensors["b"].ctypes.data % 64
            (array([1., 1.], dtype=float32), 0)
        """
        f = self._file
        if getattr(f.entries, "compressed", 0):  # decoded batch by batch: see tensor_codecs.load_all
            arena, decoded, crc = tensor_codecs.load_all(self, verify=verify, threads=threads)
            if verify and crc != f.stored_crc:
                raise ChecksumError(f"footer CRC32 is {f.stored_crc:#010x} but the file's bytes give "
                                    f"{crc:#010x}", path=self.path)
            return _slice_arena(f, arena, decoded)
        # a local file fills the arena with one parallel pread, which populates it as it goes
        arena = self._arena(f.data_start, f.data_len)
        prefix_crc = crc32(self._source.read(0, f.data_start, "header")) if verify else None
        if len(f.entries) < OVERLAP_MIN_TENSORS or f.data_len < OVERLAP_MIN_BYTES:
            crc = self._source.readinto(f.data_start, arena, threads=threads, crc=prefix_crc)
            out = None
        else:  # the arrays are made while the bytes arrive (OVERLAP_MIN_TENSORS says why)
            pending = self._source.readinto_start(f.data_start, arena, threads=threads, crc=prefix_crc)
            try:
                out = _slice_arena(f, arena)
            except BaseException:
                # the read still writes into the arena and holds the source: let it end,
                # and raise what went wrong here rather than the read's own error
                with contextlib.suppress(Exception):
                    pending.wait()
                raise
            crc = pending.wait()
        if verify and crc != f.stored_crc:
            raise ChecksumError(f"footer CRC32 is {f.stored_crc:#010x} but the file's bytes give {crc:#010x}",
                                path=self.path)
        return _slice_arena(f, arena) if out is None else out

    def _arena(self, offset: int, n: int) -> np.ndarray:
        """An uninitialised uint8 array for the file's bytes ``[offset, offset + n)``,
        filled next by one read.  With direct I/O its address is congruent with
        ``offset`` modulo the direct alignment, so the device writes straight into it (no
        bounce copy); each tensor then sits on its file offset's alignment (64 bytes, or
        what the file gives), as with a buffered read when the data section starts
        aligned."""
        alignment = max(self.alignment, 64)
        direct = self._source.direct_align
        if direct and n >= 2 * direct and offset % alignment == 0:
            shift = offset % direct
            whole = _memory.AlignedBuffer(n + shift, direct, filled_by_read=True)
            return np.frombuffer(whole, np.uint8, n, shift)
        return aligned_empty(n, alignment, filled_by_read=self._source.reads_by_pread)


class RunningCrc:
    """The footer CRC32 of a v2 file computed from the bytes a reader consumes, in any order.

    A whole-file reader (the converter, :class:`aprfast.files.integrity.CheckedReader`)
    calls :meth:`feed` with each tensor's stored range as it reads it, passing the bytes
    it already holds (``data``) so that they are not read twice: their CRC32 is taken
    then and kept with the range.  :meth:`finish` reads whatever was not fed (header,
    index, padding, tensors nobody read) with bounded ``pread`` s, never through the
    map (the resident set stays one chunk), joins the pieces in file order with
    ``crc32_combine`` and compares with the footer.  Ranges may come in any order (a
    diff's second file, a writer that takes names sorted): the check costs one CRC32
    pass over bytes the reader holds (about 25 GB/s) plus the reads of what lies
    between, and no second read of what was fed with ``data``.  A range fed twice, or
    inside one fed before (a tied tensor), costs nothing.

    Args:
        source: The file's raw bytes (an :mod:`aprfast.io.sources` source).
        end: Where the CRC stops (the footer's CRC field).
        stored: The CRC32 the footer stores.
        path: The file's path, for the error.

    Examples:
        >>> import numpy as np, aprfast
        >>> blob = bytearray(aprfast.save({"w": np.zeros(4, np.float32)}))
        >>> blob[-20] ^= 1  # a bit of the tensor flipped
        >>> with aprfast.open(bytes(blob)) as f:
        ...     f.running_crc().finish()
        Traceback (most recent call last):
        ...
        aprfast.errors.ChecksumError: [E004] footer CRC32 is ...
    """

    CHUNK = 8 << 20

    def __init__(self, source, end: int, stored: int, path=None):
        self.source, self.end, self.stored, self.path = source, end, stored, path
        self._pieces = {}  # (offset, stop) -> CRC32 of those bytes alone
        self._buffer = None
        #: bytes this object read itself (what was not fed with its data): tests and
        #: benchmarks count it to see that no second pass happens
        self.bytes_read = 0

    def feed(self, offset: int, nbytes: int, data=None) -> None:
        """Account for the stored bytes ``[offset, offset + nbytes)``: ``data`` holds
        them (a contiguous buffer of exactly ``nbytes``), or None to read them here, now,
        while they are likely in the page cache (the converter's kernel-side copies).

        Args:
            offset: Where the range starts in the file.
            nbytes: Its length.
            data: The range's bytes, when the caller holds them.
        """
        stop = min(offset + nbytes, self.end)
        if offset < 0 or stop <= offset or (offset, stop) in self._pieces:
            return
        if data is not None and stop == offset + nbytes:
            try:
                view = memoryview(data)
            except (TypeError, ValueError, BufferError):  # a dtype the buffer protocol lacks: read it here
                view = None
            if view is not None and view.nbytes == nbytes and view.c_contiguous:
                self._pieces[(offset, stop)] = crc32(view)
                return
        self._pieces[(offset, stop)] = self._read_crc(offset, stop, 0)

    def _read_crc(self, start: int, stop: int, crc: int) -> int:
        """``crc`` continued over the file's bytes ``[start, stop)``, read in bounded chunks."""
        while start < stop:
            n = min(stop - start, self.CHUNK)
            if self._buffer is None or self._buffer.nbytes < n:
                self._buffer = aligned_empty(min(self.end, self.CHUNK))
            crc = self.source.readinto(start, self._buffer[:n], crc=crc)
            self.bytes_read += n
            start += n
        return crc

    def finish(self) -> None:
        """Read what was not fed, join the pieces in file order and compare with the
        footer.

        Raises:
            ChecksumError: The bytes do not give the stored CRC32.
        """
        pos = crc = 0
        for (offset, stop), piece in sorted(self._pieces.items()):
            if offset < pos:  # overlaps what is counted already: the rest is read as a gap
                continue
            crc = self._read_crc(pos, offset, crc)
            crc = crc32_combine(crc, piece, stop - offset)
            pos = stop
        crc = self._read_crc(pos, self.end, crc)
        self._buffer = None
        if crc != self.stored:
            raise ChecksumError(f"footer CRC32 is {self.stored:#010x} but bytes 0..{self.end} give "
                                f"{crc:#010x}", path=self.path)


def crc_by_chunks(source, end: int, chunk: int = 8 << 20) -> int:
    """CRC32 of ``[0, end)`` read in bounded chunks, for sources that are not mapped."""
    buf = aligned_empty(min(end, chunk))
    crc = 0
    for start in range(0, end, chunk):
        n = min(chunk, end - start)
        crc = source.readinto(start, buf[:n], crc=crc)
    return crc


def _slice_arena(parsed, arena: np.ndarray, decoded=None) -> dict:
    """Tensors as views of the arena (which holds the data section), or, for the
    compressed ones in ``decoded`` (name -> (buffer, offset, size)), of their buffer."""
    buffer, shift = _base_and_start(arena)
    base = parsed.data_start - shift
    if not decoded and hasattr(parsed.entries, "tensors_in"):
        # no Python work per tensor: every array is made in C, with NumPy's C API, in one
        # pass over the index (_index.Entries.tensors_in)
        return parsed.entries.tensors_in(parsed.data_start, buffer, base, _plain_dtypes(parsed.ids),
                                         _maker_for(parsed.ids))
    makers = {}
    out = {}
    for name, (type_id, offset, size, shape) in zip(parsed.names, parsed.rows):
        make = makers.get(type_id)
        if make is None:
            make = makers[type_id] = array_maker(parsed.ids, type_id)
        if decoded and name in decoded:
            out[name] = make(shape, *decoded[name])
        else:
            out[name] = make(shape, buffer, offset - base, size)
    return out


def _plain_dtypes(ids) -> dict:
    """dtype id -> NumPy dtype, for the ids of ``ids`` whose dtype has plain elements
    (not packed, not opaque); kept per table until a dtype is registered in it."""
    found = _PLAIN_DTYPES.get(id(ids))
    if found is not None and found[0] is ids:
        return found[1]
    out = {type_id: np.dtype(numpy_dtype(dtype)) for type_id, dtype in ids.items()
           if not dtype.packed and not getattr(dtype, "opaque", False)}
    _PLAIN_DTYPES[id(ids)] = (ids, out)
    return out


_PLAIN_DTYPES = {}
IdTable.watchers.append(lambda table, type_id: _PLAIN_DTYPES.pop(id(table), None))


def _maker_for(ids):
    """make_one(type_id, shape, buffer, start, size) over array_maker's per-id makers."""
    makers = {}

    def make_one(type_id, shape, buffer, start, size):
        make = makers.get(type_id)
        if make is None:
            make = makers[type_id] = array_maker(ids, type_id)
        return make(shape, buffer, start, size)
    return make_one


def array_maker(ids, type_id):
    """A function (shape, buffer, offset, size) -> tensor for one dtype id."""
    if not ids.knows(type_id):
        return lambda shape, buf, start, size: RawTensor(None, shape, _bytes_at(buf, start, size), type_id)
    dtype = ids.dtype(type_id)
    if dtype.packed:
        return lambda shape, buf, start, size: QuantizedTensor(dtype, shape, _bytes_at(buf, start, size))
    np_dtype = numpy_dtype(dtype)
    # ``buf`` is an AlignedBuffer or an ndarray (never a bare memoryview of a map):
    # np.ndarray keeps it as the base, which keeps the memory alive.
    return lambda shape, buf, start, size: np.ndarray(shape, np_dtype, buf, start)


def _base_and_start(arena: np.ndarray):
    """(the object owning ``arena``'s memory, where ``arena`` starts in it): tensors are
    built on the owner, which np.ndarray keeps alive as their base."""
    base = arena.base
    if base is None:
        return arena, 0
    return base, arena.ctypes.data - np.frombuffer(base, np.uint8).ctypes.data


def _bytes_at(buffer, start, size) -> np.ndarray:
    return np.frombuffer(buffer, np.uint8, size, start)


class TensorSlice:
    """``file.get_slice(name)[key]``: owned arrays read with as few bytes as the key needs.

    Supports NumPy basic indexing (ints, slices with steps, ``...``, ``None``) and
    :meth:`intervals` for tensor-parallel shards along one axis.  Made by
    :meth:`AprFile.get_slice`.

    Examples:
        >>> import numpy as np, aprfast
        >>> blob = aprfast.save({"w": np.arange(8, dtype=np.float32).reshape(4, 2)})
        >>> with aprfast.open(blob) as f:
        ...     s = f.get_slice("w")
        ...     print(s.get_shape(), s.get_dtype(), len(s))
        ...     print(s[-1], s[::2, 0], s[..., None].shape)
        [4, 2] F32 4
        [6. 7.] [0. 4.] (4, 2, 1)
    """

    #: Above this many separate runs a single bounding read is cheaper than many preads.
    MAX_RUNS = 4096

    def __init__(self, file: AprFile, info: TensorInfo):
        if info.dtype is None or info.dtype.packed:
            raise LayoutError(f"tensor {info.name!r} is {info.dtype_name}; slicing reads elementwise "
                              "dtypes only (read packed tensors whole with get_tensor)")
        self._file = file
        self.info = info
        self.shape = info.shape
        self.dtype = numpy_dtype(info.dtype)
        self._whole = None
        self._compressed = bool(file._file.codec(info.name))

    def get_shape(self) -> list:
        """The tensor's shape, as a list (safetensors' name)."""
        return list(self.shape)

    def get_dtype(self) -> str:
        """The tensor's aprfast dtype name ("F32", "BF16", ...)."""
        return self.info.dtype.name

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __getitem__(self, key) -> np.ndarray:
        if self._compressed:
            return self._decoded(key)
        if self._file._source.zero_copy and _plain_key(key):
            # Ints and slices on a mapped file: NumPy's own indexing over a view of the
            # map touches only the pages the key needs; the checks below are for pread.
            return np.array(self._mapped_view()[key], copy=True)
        box, local_key = bounding_box(key, self.shape)
        region = self._read_box(box)
        return np.array(region[local_key], copy=True)

    def _decoded(self, key) -> np.ndarray:
        """A compressed tensor: decode only the blocks holding the axis-0 rows ``key``
        touches (the blocks split the C-order bytes, so rows are byte ranges)."""
        box, local_key = bounding_box(key, self.shape)
        item = self.dtype.itemsize
        if not self.shape:
            return np.array(self._file._raw_bytes(self.info, 0, item).view(self.dtype).reshape(())[local_key],
                            copy=True)
        lo, hi = box[0]
        row = item * int(np.prod(self.shape[1:], dtype=np.int64))
        rows = self._file._raw_bytes(self.info, lo * row, hi * row).view(self.dtype)
        rows = rows.reshape((hi - lo,) + tuple(self.shape[1:]))
        region = rows[(slice(None),) + tuple(slice(a, b) for a, b in box[1:])]
        return np.array(region[local_key], copy=True)

    def _mapped_view(self) -> np.ndarray:
        whole = self._whole
        if whole is None or self._file._source.closed:  # _mapped() raises once closed
            whole = self._whole = np.ndarray(self.shape, self.dtype, self._file._mapped(), self.info.offset)
        return whole

    def intervals(self, ranges, axis: int = 0) -> np.ndarray:
        """Rows ``[start, stop)`` for each range along ``axis``, concatenated in order.

        Args:
            ranges: ``[(start, stop), ...]`` along ``axis``.
            axis: The axis the ranges index (negative counts from the end).

        Returns:
            An owned array (empty along ``axis`` when ``ranges`` is empty).

        Raises:
            IndexError: A range outside the axis, an axis out of range, or a 0-d tensor.

        Examples:
            >>> import numpy as np, aprfast
            >>> blob = aprfast.save({"w": np.arange(6, dtype=np.float32).reshape(2, 3)})
            >>> with aprfast.open(blob) as f:
            ...     print(f.get_slice("w").intervals([(0, 1), (2, 3)], axis=1))
            [[0. 2.]
             [3. 5.]]
        """
        if not self.shape:
            raise IndexError("a 0-d tensor has no axis to take intervals along")
        axis = _axis(axis, len(self.shape))
        parts = []
        for start, stop in ranges:
            if not 0 <= start <= stop <= self.shape[axis]:
                raise IndexError(f"interval [{start}, {stop}) is outside axis {axis} of length "
                                 f"{self.shape[axis]}")
            key = (slice(None),) * axis + (slice(start, stop),)
            parts.append(self[key])
        if not parts:
            shape = list(self.shape)
            shape[axis] = 0
            return np.empty(shape, self.dtype)
        return np.concatenate(parts, axis=axis)

    def _read_box(self, box) -> np.ndarray:
        """The sub-array covering ``box`` (per-axis [lo, hi)), read with bounded I/O."""
        source = self._file._source
        item = self.dtype.itemsize
        if source.zero_copy:  # slicing a map touches only the pages the key needs
            whole = np.ndarray(self.shape, self.dtype, self._file._mapped(), self.info.offset)
            return whole[tuple(slice(lo, hi) for lo, hi in box)]
        return _read_box_pread(source, self.info.offset, self.shape, item, box, self.dtype, self.MAX_RUNS)


def _plain_key(key) -> bool:
    """Whether ``key`` is an int, a slice, or a tuple of them (exact types: bools and
    arrays take the checked path)."""
    kind = type(key)
    if kind is int or kind is slice:
        return True
    return kind is tuple and all(type(k) is int or type(k) is slice for k in key)


def _axis(axis, ndim):
    if not -ndim <= axis < ndim:
        raise IndexError(f"axis {axis} is out of range for {ndim} dims")
    return axis % ndim


def bounding_box(key, shape):
    """Per-axis [lo, hi) covering what ``key`` selects, and ``key`` shifted into that box."""
    if not isinstance(key, tuple):
        key = (key,)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if n_real > len(shape):
        raise IndexError(f"too many indices: tensor has {len(shape)} dims, {n_real} were indexed")
    expanded = []
    for k in key:
        if k is Ellipsis:
            expanded.extend([slice(None)] * (len(shape) - n_real))
        else:
            expanded.append(k)
    if Ellipsis not in key:
        expanded.extend([slice(None)] * (len(shape) - n_real))
    box, local, axis = [], [], 0
    for k in expanded:
        if k is None:
            local.append(None)
            continue
        dim = shape[axis]
        axis += 1
        if isinstance(k, slice):
            start, stop, step = k.indices(dim)
            idx = range(start, stop, step)
            if len(idx) == 0:
                box.append((0, 0))
                local.append(slice(0, 0))
                continue
            lo, hi = min(idx[0], idx[-1]), max(idx[0], idx[-1]) + 1
            box.append((lo, hi))
            new_stop = idx[-1] - lo + (1 if step > 0 else -1)
            local.append(slice(idx[0] - lo, None if new_stop < 0 else new_stop, step))
        else:
            try:
                i = int(np.asarray(k).item()) if not isinstance(k, (int, np.integer)) else int(k)
            except (TypeError, ValueError):
                raise IndexError(f"only integers, slices, '...' and None are valid indices, not {k!r}") from None
            if isinstance(k, (bool, np.bool_)):
                raise IndexError("boolean indices are not basic indexing")
            if not -dim <= i < dim:
                raise IndexError(f"index {i} is out of bounds for axis {axis - 1} with size {dim}")
            i %= dim
            box.append((i, i + 1))
            local.append(0)
    return box, tuple(local)


def _read_box_pread(source, offset, shape, item, box, dtype, max_runs) -> np.ndarray:
    box_shape = tuple(hi - lo for lo, hi in box)
    out = np.empty(box_shape, dtype)
    if out.size == 0:
        return out
    # Axes after the last partially-selected one are whole, so each run along that
    # axis is one contiguous byte range in the file.
    last = max((d for d, (lo, hi) in enumerate(box) if hi - lo != shape[d]), default=-1)
    strides = np.cumprod((1,) + tuple(reversed(shape)))[::-1][1:] if shape else ()
    if last < 0:
        source.readinto(offset, out.reshape(-1).view(np.uint8))
        return out
    run_elems = box_shape[last] * int(np.prod(shape[last + 1:], dtype=np.int64))
    outer = box_shape[:last]
    runs = int(np.prod(outer, dtype=np.int64)) if outer else 1
    if runs > max_runs:
        # Too many small runs: read the rows spanning the box once and slice in memory.
        lo0, hi0 = box[0]
        row = int(np.prod(shape[1:], dtype=np.int64))
        rows = np.empty((hi0 - lo0,) + tuple(shape[1:]), dtype)
        source.readinto(offset + lo0 * row * item, rows.reshape(-1).view(np.uint8))
        return rows[(slice(None),) + tuple(slice(lo, hi) for lo, hi in box[1:])]
    flat = out.reshape(runs, run_elems)
    pieces = []
    for r, index in enumerate(np.ndindex(*outer) if outer else [()]):
        start = sum((box[d][0] + index[d]) * int(strides[d]) for d in range(last)) + box[last][0] * int(strides[last])
        pieces.append((offset + start * item, flat[r].view(np.uint8)))
    many = getattr(source, "readinto_many", None)
    if many is not None:  # a remote source: nearby runs merged into one request, requests in parallel
        many(pieces)
        return out
    for position, piece in pieces:
        source.readinto(position, piece)
    return out


class QuantizedSlice:
    """``file.get_slice(name)[a:b]`` for a packed tensor of a per-row block type.

    GGML blocks never span rows, so a range of indices along axis 0 is a run of whole
    blocks: ``[a:b]`` (step 1; trailing full slices or ``...`` allowed) reads only those
    bytes and returns a QuantizedTensor of shape ``(b - a, *shape[1:])``, or its float32
    values when made with ``dequantize=True``.  A 1-D tensor is a single row, so its
    bounds must fall on block boundaries.  APR_Q4 (blocks run across rows), APR_Q8 and
    Q8_TENSOR (one scale for the whole tensor) are read whole, with ``get_tensor``.
    Made by :meth:`AprFile.get_slice`; see docs/guide/quantization.md.

    Raises:
        LayoutError: From ``[key]``: a key that is not whole rows along axis 0, or 1-D
            bounds off the block boundaries.

    Examples:
        >>> import numpy as np, aprfast
        >>> q = aprfast.quantize(np.ones((4, 32), np.float32), "q8_0")
        >>> with aprfast.open(aprfast.save({"q": q})) as f:
        ...     s = f.get_slice("q")
        ...     print(s.get_shape(), s.get_dtype(), s[1:3])
        [4, 32] Q8_0 QuantizedTensor(Q8_0, shape=[2, 32], nbytes=68)
    """

    def __init__(self, file: AprFile, info: TensorInfo, dequantize: bool = False):
        d = info.dtype
        if not d.blocks_per_row:
            why = "one scale covers the whole tensor" if d.tensor_header else "its blocks run across rows"
            raise LayoutError(f"tensor {info.name!r} is {d.name}: {why}, so it has no row slices; "
                              "read it whole with get_tensor")
        if not info.shape:
            raise LayoutError(f"tensor {info.name!r} is a 0-d {d.name} tensor; read it with get_tensor")
        self._file = file
        self.info = info
        self.shape = info.shape
        self.dequantize = dequantize

    def get_shape(self) -> list:
        """The tensor's shape, as a list (safetensors' name)."""
        return list(self.shape)

    def get_dtype(self) -> str:
        """The tensor's aprfast dtype name ("Q8_0", "Q4_K", ...)."""
        return self.info.dtype.name

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, key):
        start, stop = self._row_range(key)
        d, shape = self.info.dtype, (stop - start,) + tuple(self.shape[1:])
        codec = self._file._file.codec(self.info.name)
        total = codec[1] if codec else self.info.nbytes  # a compressed tensor's nbytes is what it stores
        if len(self.shape) == 1:
            skip = start // d.block_elems * d.block_bytes
        else:  # every index along axis 0 holds the same number of whole blocks
            skip = start * (total // self.shape[0]) if self.shape[0] else 0
        nbytes = d.nbytes(shape)
        if codec:  # decode only the blocks holding those rows
            tensor = QuantizedTensor(d, shape, self._file._raw_bytes(self.info, skip, skip + nbytes))
            return quantization.dequantize(tensor) if self.dequantize else tensor
        owned = _memory.AlignedBuffer(nbytes, self._file.alignment)
        if nbytes:
            self._file._source.readinto(self.info.offset + skip, owned)
        tensor = QuantizedTensor(d, shape, np.frombuffer(owned, np.uint8, nbytes))
        return quantization.dequantize(tensor) if self.dequantize else tensor

    def _row_range(self, key):
        """[start, stop) along axis 0 for a key that selects whole blocks, else an error."""
        name, d, shape = self.info.name, self.info.dtype, self.shape
        parts = key if isinstance(key, tuple) else (key,)
        if sum(1 for k in parts if k is Ellipsis) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        if sum(1 for k in parts if k is not Ellipsis) > len(shape):
            raise IndexError(f"too many indices: tensor has {len(shape)} dims")
        at = next((i for i, k in enumerate(parts) if k is Ellipsis), None)
        if at is not None:  # expand it to full slices, so every key has its axis
            parts = parts[:at] + (slice(None),) * (len(shape) - len(parts) + 1) + parts[at + 1:]
        first = parts[0] if parts else slice(None)
        whole_rows = isinstance(first, slice) and first.indices(shape[0])[2] == 1 and all(
            _whole_axis(k, shape[axis]) for axis, k in enumerate(parts[1:], 1))
        if not whole_rows:
            raise LayoutError(f"tensor {name!r} is {d.name}: packed tensors are sliced by whole rows along "
                              f"axis 0 (t[a:b]), not with {key!r}")
        start, stop, _ = first.indices(shape[0])
        stop = max(start, stop)
        if len(shape) == 1 and start != stop and (start % d.block_elems or (stop % d.block_elems and stop != shape[0])):
            raise LayoutError(f"tensor {name!r} is one {d.name} row of {shape[0]} elements; [{start}:{stop}] "
                              f"does not fall on its {d.block_elems}-element block boundaries")
        return start, stop


def _whole_axis(key, dim) -> bool:
    return isinstance(key, slice) and key.indices(dim) == (0, dim, 1)


def _named_unknown(exc: UnknownDTypeError, layout, source, limits, keys) -> UnknownDTypeError:
    """The error a default open gives for a tensor of a dtype aprfast has no values for,
    naming the dtype where the file recorded its name (a safetensors dtype kept as bytes,
    OPAQUE_NAMES_KEY) and saying how to read the bytes.  The strict index parser stops at
    the first such entry knowing only its id, so the file is parsed again leniently here:
    a cold path, taken once, before the open fails."""
    try:
        parsed = layout.parse(source, limits or Limits(), strict_dtypes=False, keys=keys)
        names = parsed.metadata.get(OPAQUE_NAMES_KEY)
        for name, (type_id, *_) in zip(parsed.names, parsed.rows):
            if parsed.ids.knows(type_id):
                continue
            what = f"unknown dtype id {type_id}"
            if type_id == OPAQUE_APR2_ID and isinstance(names, dict) and isinstance(names.get(name), str):
                what = f"dtype {names[name]} (kept as bytes under id {type_id}; aprfast has no values for it)"
            return UnknownDTypeError(f"tensor {name!r}: {what}; aprfast.open(..., unknown_dtypes=\"raw\") "
                                     "reads its bytes, and convert() carries it", path=source.path)
    except AprError:
        pass
    return exc
