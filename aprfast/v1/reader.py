"""Lazy reading of v1 (``APRN``) tensor files: :class:`V1File`, with AprFile's surface.

What opening costs and what is checked when, per kind of file (``V1File.kind``):

* ``"plain"`` (tensor payload stored uncompressed, unencrypted): header, metadata and
  the inner v2 index are read at open; tensors are zero-copy views of the map, served
  by an :class:`aprfast.files.reader.AprFile` over the payload range.
* ``"whole"`` (compressed and/or encrypted whole payload): the file is checked and
  decoded once at open exactly as :func:`aprfast.v1.load_model` does (CRC, signature,
  decryption, bounded decompression) and tensors view the decoded buffer.
* ``"streaming"`` (STREAMING chunk index): open reads the header, the metadata and the
  chunk index (its CRC covers all three) and opens the file key; ``get_tensor`` reads,
  checks (CRC32, AES-GCM tag), decrypts and decompresses only that tensor's chunks.
* ``"trueno"`` (TRUENO_NATIVE index): open parses the §9.2 index; tensors are
  zero-copy, read-only, 64-byte-aligned views with their strides.

A signed file is verified at open, before its metadata is decoded: a STREAMING file
by its index signature (over header, metadata and chunk index; each chunk is then
checked against its signed SHA-256 when read), any other kind by the whole-file
signature, which hashes the file once.  The whole-file CRC32 is checked at open only
for ``"whole"`` files (which are read whole anyway); :meth:`V1File.verify` checks it
for every kind, with the whole-file signature and every chunk.  docs/FORMAT.md has
the bytes ("v1 streaming chunk index", "v1 trueno-native tensors").
"""

from __future__ import annotations

import mmap

import numpy as np

from .. import v1
from .._crc import crc32
from ..codecs.payload import MAX_UNCOMPRESSED_SIZE, Compression
from ..errors import AprError, AprIOError, ChecksumError, CorruptError, FormatError, LayoutError, TensorNotFoundError
from ..files.handle import TensorMapping
from ..files.reader import AprFile, aligned_empty, bounding_box
from ..io import platform as _platform
from ..io.sources import open_source
from ..layouts import trueno
from ..layouts import v1 as layout
from ..layouts.v1 import Flag, Header
from ..limits import Limits
from ..tensors import TensorInfo

__all__ = ["V1File", "ChunkSlice"]


class V1File(TensorMapping):
    """An open v1 tensor file (plain, compressed, encrypted, STREAMING or TRUENO_NATIVE).

    ``password`` / ``private_key`` open encrypted files (a plaintext file is then
    refused unless ``allow_unencrypted=True``, as in :func:`aprfast.v1.load_model`);
    ``trusted_keys`` are Ed25519 public keys the signer must be among, and make a
    signature required unless ``require_signature=False`` is given; ``limits`` bound
    what the parsers believe; ``max_uncompressed`` bounds a whole-payload decode;
    ``unknown_dtypes="raw"`` serves tensors of unknown dtype ids as RawTensor; ``mode``
    is "mmap" or "pread" as for :func:`aprfast.open`.  Thread-safe; a context manager.
    :func:`aprfast.open` returns one for a v1 tensor file.  docs/guide/older-files.md
    ("v1 random access") and docs/FORMAT.md §12-§13.

    Args:
        target: A path, a readable file object or a bytes-like object.
        password: Open a password-encrypted file.
        private_key: Open a file encrypted for this X25519 private key.
        trusted_keys: Ed25519 public keys one of which must have signed the file.
        require_signature: Refuse an unsigned file (default: when ``trusted_keys`` given).
        limits: An :class:`aprfast.Limits` bounding what the parsers believe.
        unknown_dtypes: "error" or "raw" (unknown dtype ids served as RawTensor).
        mode: "mmap" or "pread" (``None``: mmap where possible).
        allow_unencrypted: With a key, accept a plaintext file too.
        max_uncompressed: Most bytes a whole compressed payload may decode to.

    Raises:
        FormatError: Not a v1 file, or a payload that is not tensors (bytes payloads
            are read with :func:`aprfast.v1.load_model`).
        CorruptError: Regions, metadata or indexes that contradict the file.
        ChecksumError: A "whole" file whose CRC32 does not match.
        SignatureError: A bad signature, an untrusted signer or a missing required one.
        DecryptError: A wrong or missing key, or a plaintext file where a key was given.
        LimitError: An index or payload beyond ``limits`` or ``max_uncompressed``.
        AprIOError: The file cannot be opened or read.
        ValueError: An unknown ``unknown_dtypes``, or both ``password`` and ``private_key``.

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast import v1
        >>> v1.save_model({"w": np.arange(12, dtype=np.float32).reshape(4, 3)}, "s.apr",
        ...               streaming=True, chunk_size=24)
        >>> with aprfast.open("s.apr") as f:
        ...     type(f).__name__, f.kind, f.keys(), f.get_tensor("w")[3].tolist()
        ('V1File', 'streaming', ['w'], [9.0, 10.0, 11.0])
    """

    def __init__(self, target, *, password=None, private_key=None, trusted_keys=None, require_signature=None,
                 limits: Limits | None = None, unknown_dtypes: str = "error", mode: str | None = None,
                 allow_unencrypted: bool = False, max_uncompressed: int = MAX_UNCOMPRESSED_SIZE):
        if unknown_dtypes not in ("error", "raw"):
            raise ValueError(f"unknown_dtypes must be 'error' or 'raw', not {unknown_dtypes!r}")
        if password is not None and private_key is not None:
            raise ValueError("give password= or private_key=, not both")
        if require_signature is None:
            require_signature = trusted_keys is not None
        self._limits = limits or Limits()
        self._strict = unknown_dtypes == "error"
        self._inner = self._chunks = self._entries = self._base = None
        self.signature, self.signer, self.encryption, self.license = v1.UNSIGNED, None, "none", None
        self._source = open_source(target, mode=mode)
        try:
            self._open(password, private_key, trusted_keys, require_signature, allow_unencrypted, max_uncompressed)
        except BaseException:
            self.close()
            raise

    def _verified(self, verify: bool) -> "V1File":
        """This file, after :meth:`verify` when asked (``aprfast.open(..., verify=True)``)."""
        if verify:
            try:
                self.verify()
            except BaseException:
                self.close()
                raise
        return self

    # --- opening ----------------------------------------------------------------
    def _open(self, password, private_key, trusted_keys, require_signature, allow_unencrypted, max_uncompressed):
        src, path = self._source, self._source.path
        head = bytes(src.read(0, min(layout.HEADER_SIZE, src.size), "v1 header"))
        v1.checks.check_magic(head, path)
        header = self._header = Header.from_bytes(head, path=path)
        regions = self._regions = v1.checks.locate(header, src.read, src.size, path, self._limits)
        streaming = bool(header.flag_set & Flag.STREAMING)
        if header.flags & Flag.SIGNED or require_signature:
            # Before the metadata is decoded or anything else is believed, as load_model
            # does.  A STREAMING file's index signature covers header, metadata and index,
            # and its chunks are checked against their signed digests when read; any
            # other signed file is hashed whole here.
            if streaming:
                self.signature, self.signer = v1.checks.verify_index_signature(src.read, header, regions, trusted_keys,
                                                                         require_signature, path)
            else:
                self.signature, self.signer = v1.checks.verify_signature(self._signed_view(), regions, trusted_keys,
                                                                   require_signature, path)
        metadata_bytes = src.read(regions.metadata[0], regions.metadata[1] - regions.metadata[0], "v1 metadata")
        metadata = layout.decode_metadata(metadata_bytes, path=path)
        self.kind = _kind(v1.checks.payload_kind(header, metadata, path), header)
        if self.kind == "whole":
            # Read whole anyway: every check load_model makes, in its order, then the
            # decoded buffer served by an AprFile (arrays view it; nothing is copied).
            model = v1.load.load_payload(src, None, password, private_key, trusted_keys, require_signature,
                                         max_uncompressed, allow_unencrypted, tensor_buffer=True,
                                         verified=(self.signature, self.signer))
            self._adopt(model)
            try:
                self._inner = AprFile(np.frombuffer(model.payload, np.uint8), limits=self._limits,
                                      unknown_dtypes="error" if self._strict else "raw")
            except AprError as exc:
                raise type(exc)(f"tensor payload: {exc.message}", path=path) from None
            return
        self.license = v1.checks.decode_license(metadata, path)
        for key in layout.INTERNAL_KEYS:
            metadata.pop(key, None)
        self._metadata = metadata
        if self.kind == "streaming":
            self._chunks = v1.chunks.open_chunks(src.read, header, regions, path, self._limits, self._strict, password,
                                           private_key, allow_unencrypted,
                                           check_digests=bool(header.flags & Flag.SIGNED))
            self.encryption = self._chunks.encryption
            return
        v1.checks.refuse_downgrade(header, password, private_key, allow_unencrypted, path)
        if self.kind == "trueno":
            start, end = regions.payload
            self._base = self._payload_array(start, end)
            self._entries = trueno.parse(self._base[start:end] if self._mapped else self._base, start, path=path,
                                         limits=self._limits)
            return
        if header.uncompressed_size != header.payload_size:
            raise CorruptError(f"uncompressed payload is {header.payload_size} bytes but the header says "
                               f"{header.uncompressed_size}", path=path)
        start, end = regions.payload
        self._base = self._payload_array(start, end)
        holder = self._base[start:end] if self._mapped else self._base
        try:
            self._inner = AprFile(holder, limits=self._limits, unknown_dtypes="error" if self._strict else "raw")
        except AprError as exc:
            raise type(exc)(f"tensor payload: {exc.message}", path=path) from None

    def _adopt(self, model) -> None:
        self.signature, self.signer, self.encryption, self.license = (model.signature, model.signer,
                                                                      model.encryption, model.license)
        self._metadata = model.metadata

    def _payload_array(self, start: int, end: int) -> np.ndarray:
        """The mapped file as one uint8 array (views keep the map alive), or, for a
        source that is not mapped, the payload read once into aligned memory."""
        self._mapped = self._source.zero_copy
        if self._mapped:
            return np.frombuffer(self._source.buffer(), np.uint8)
        out = aligned_empty(end - start)
        self._source.readinto(start, out)
        self._payload_offset = start
        return out

    def _signed_view(self):
        """header || metadata || [index ||] payload as one buffer, to verify the signature."""
        src = self._source
        if src.zero_copy:
            return src.buffer()
        return memoryview(src.read(0, src.size, "file"))

    # --- what the file holds ------------------------------------------------------
    @property
    def layout(self) -> str:
        """"v1" (the kind of payload, "plain", "whole", "streaming" or "trueno", is
        :attr:`kind`)."""
        return layout.NAME

    @property
    def header(self) -> dict:
        """The 32-byte header's fields as a dict (:meth:`aprfast.v1.Header.as_dict`)."""
        return self._header.as_dict()

    @property
    def metadata(self) -> dict:
        """aprender's metadata as stored (aprfast's internal keys removed)."""
        return self._metadata

    @property
    def path(self):
        """The file's path (``None`` for a buffer or a file object)."""
        return self._source.path

    @property
    def flags(self) -> Flag:
        """The header's flags as aprender sees them (:class:`aprfast.v1.Flag`)."""
        return self._header.flag_set

    def keys(self) -> list:
        """The tensor names, in the file's index order."""
        if self._inner is not None:
            return self._inner.keys()
        return list(self._chunks.index.tensors if self._chunks is not None else self._entries)

    def __len__(self) -> int:
        if self._inner is not None:
            return len(self._inner)
        return len(self._chunks.index.tensors if self._chunks is not None else self._entries)

    def __contains__(self, name) -> bool:
        if self._inner is not None:
            return name in self._inner
        return name in (self._chunks.index.tensors if self._chunks is not None else self._entries)

    def info(self, name: str) -> TensorInfo:
        """dtype, shape, offset and byte size of one tensor.  ``offset`` is absolute in the
        file, except for "whole" files (compressed or encrypted), where it is in the
        decoded payload.  For a STREAMING file ``offset`` is where its first chunk lies
        and ``nbytes`` its raw size; for a trueno file ``dtype_id`` is the §9.2 byte and
        ``nbytes`` its ``size_bytes``.

        Args:
            name: The tensor's name.

        Returns:
            A :class:`aprfast.TensorInfo`.

        Raises:
            TensorNotFoundError: No tensor ``name``.

        Examples:
            >>> import numpy as np, aprfast
            >>> from aprfast import v1
            >>> blob = v1.save_model({"w": np.zeros((2, 3), np.float32)}, trueno_native=True)
            >>> with aprfast.open(blob) as f:
            ...     info = f.info("w")
            >>> info.dtype_name, info.shape, info.nbytes, info.offset % 64
            ('F32', (2, 3), 24, 0)
        """
        if self._inner is not None:
            info = self._inner.info(name)
            return info if self.kind == "whole" else shifted(info, self._regions.payload[0])
        if self._chunks is not None:
            t = self._record(name)
            first = self._chunks.index.chunks[t.first].offset if t.count else 0
            return TensorInfo(name, t.dtype, t.dtype_id, t.shape, self._regions.payload[0] + first, t.nbytes)
        e = self._entry(name)
        return TensorInfo(name, e.dtype, _trueno_id(e), e.shape, e.offset, e.nbytes)

    def backend_hint(self, name: str) -> str:
        """The tensor's §9.3 backend hint ("auto", "avx2", ...); "auto" for files that are
        not trueno-native.

        Args:
            name: The tensor's name.

        Returns:
            The hint's name.

        Raises:
            TensorNotFoundError: No tensor ``name``.

        Examples:
            >>> import numpy as np, aprfast
            >>> from aprfast import v1
            >>> blob = v1.save_model({"w": np.zeros(4, np.float32)}, trueno_native=True,
            ...                      backend_hint="avx2")
            >>> with aprfast.open(blob) as f:
            ...     f.backend_hint("w"), f.backend_hints
            ('avx2', {'w': 'avx2'})
        """
        if self._entries is None:
            self._check_name(name)
            return "auto"
        return trueno.backend_name(self._entry(name).backend_hint)

    @property
    def backend_hints(self) -> dict:
        """name -> backend hint, for every tensor."""
        return {name: self.backend_hint(name) for name in self.keys()}

    def strides(self, name: str) -> tuple:
        """Strides in elements (trueno files store them; others are C order).

        Args:
            name: The tensor's name.

        Returns:
            A tuple of ints, one per dimension.

        Raises:
            TensorNotFoundError: No tensor ``name``.

        Examples:
            >>> import numpy as np, aprfast
            >>> from aprfast import v1
            >>> with aprfast.open(v1.save_model({"w": np.zeros((2, 3), np.float32)})) as f:
            ...     f.strides("w")
            (3, 1)
        """
        if self._entries is not None:
            return self._entry(name).strides
        shape, out, step = self.info(name).shape, [], 1
        for d in reversed(shape):
            out.append(step)
            step *= d
        return tuple(reversed(out))

    def chunks(self, name: str) -> list:
        """A STREAMING file's chunks of one tensor: (absolute offset, stored, raw) each.

        Args:
            name: The tensor's name.

        Returns:
            A list of ``(offset, stored_size, raw_size)`` tuples, in order.

        Raises:
            LayoutError: The file is not STREAMING.
            TensorNotFoundError: No tensor ``name``.

        Examples:
            >>> import numpy as np, aprfast
            >>> from aprfast import v1
            >>> blob = v1.save_model({"w": np.zeros(10, np.float32)}, streaming=True, chunk_size=16)
            >>> with aprfast.open(blob) as f:
            ...     [raw for _offset, _stored, raw in f.chunks("w")]
            [16, 16, 8]
        """
        if self._chunks is None:
            raise LayoutError("only STREAMING files have chunks")
        t = self._record(name)
        base = self._regions.payload[0]
        own = self._chunks.index.chunks[t.first:t.first + t.count]
        return [(base + c.offset, c.stored_size, c.raw_size) for c in own]

    # --- tensors ------------------------------------------------------------------
    def get_tensor(self, name: str, copy: bool = False, dequantize: bool = False):
        """The tensor ``name``.  Plain and trueno files give read-only views of the map
        (``copy=True``: an owned aligned copy); a STREAMING file's tensor is always an
        owned array, decoded from its own chunks only (no other byte of the payload is
        read); a "whole" file's tensors view the buffer decoded at open.  ``dequantize``
        as for ``AprFile.get_tensor``.

        Args:
            name: The tensor's name.
            copy: Return an owned array instead of a view of the map.
            dequantize: Return a packed (quantized) tensor as float32 values.

        Returns:
            A NumPy array (or a :class:`aprfast.QuantizedTensor` / :class:`aprfast.RawTensor`).

        Raises:
            TensorNotFoundError: No tensor ``name``.
            ChecksumError: A STREAMING chunk fails its CRC32.
            SignatureError: A signed file's chunk does not match its digest.
            DecryptError: A chunk fails its AES-GCM tag.
            AprIOError: The file is closed, or a read failed.

        Examples:
            >>> import numpy as np, aprfast
            >>> from aprfast import v1
            >>> blob = v1.save_model({"w": np.float32([1.5, 2.5])}, password="secret")
            >>> with aprfast.open(blob, password="secret") as f:
            ...     f.kind, f.get_tensor("w").tolist()
            ('whole', [1.5, 2.5])
        """
        if self._inner is not None:
            return self._inner.get_tensor(name, copy, dequantize)
        tensor = self._get_tensor(name, copy)
        if dequantize:
            from ..numerics import quantization
            from ..tensors import QuantizedTensor

            if isinstance(tensor, QuantizedTensor):
                return quantization.dequantize(tensor)
        return tensor

    def _get_tensor(self, name: str, copy: bool):
        if self._chunks is not None:
            self._record(name)
            return self._chunks.array(self._source.read, name)
        entry = self._entry(name)
        base = self._base  # read once: close() may clear it meanwhile, and None would make NumPy allocate
        if base is None:
            self._check_open()
            raise AprIOError("the file is closed", path=self.path)
        view = v1.trueno_view(base, _rebased(entry, self._base_shift()))
        if not copy:
            return view
        out = aligned_empty(view.nbytes).view(view.dtype).reshape(view.shape) if view.size else view.copy()
        out[...] = view
        return out

    def get_tensors(self, names, copy: bool = False) -> dict:
        """Several tensors at once, as :meth:`get_tensor` gives them one by one.  Every
        name is checked before anything is read.  A plain or "whole" file is served by
        :meth:`aprfast.AprFile.get_tensors` (a file read with ``pread``, or ``copy``:
        tensors within 64 KiB of each other read with one read); a TRUENO file's tensors
        are views of the map (or aligned copies); a STREAMING file's are each decoded from
        their own chunks, which are checked as they are read.  Python work per tensor is a
        lookup and an array view.

        Args:
            names: The tensors' names (an iterable of str; repeats are read once).
            copy: Owned arrays instead of views of the map.

        Returns:
            A dict of name to tensor, in the order of ``names``.

        Raises:
            TensorNotFoundError: A name the file does not hold (nothing is read).
            ChecksumError: A STREAMING chunk fails its CRC32.
            SignatureError: A signed file's chunk does not match its digest.
            DecryptError: A chunk fails its AES-GCM tag.
            AprIOError: The file is closed, or a read failed.

        Examples:
            >>> import numpy as np, aprfast
            >>> from aprfast import v1
            >>> v1.save_model({f"e{i}": np.full(3, i, np.float32) for i in range(4)}, "v1.apr",
            ...               streaming=True, chunk_size=12)
            >>> with aprfast.open("v1.apr") as f:
            ...     got = f.get_tensors(["e3", "e1"])
            >>> list(got), got["e3"].tolist()
            (['e3', 'e1'], [3.0, 3.0, 3.0])
        """
        if self._inner is not None:
            return self._inner.get_tensors(names, copy)
        names = list(dict.fromkeys(names))
        check = self._record if self._chunks is not None else self._entry
        for name in names:  # every name checked before anything is read
            check(name)
        return {name: self._get_tensor(name, copy) for name in names}

    def get_slice(self, name: str):
        """``[...]`` on the result reads only what the key needs: for a STREAMING file the
        chunks covering the rows (axis 0) the key selects; for mapped files the pages.

        Args:
            name: The tensor's name.

        Returns:
            A slice handle with ``get_shape()``, ``get_dtype()`` and ``[...]``.

        Raises:
            TensorNotFoundError: No tensor ``name``.
            LayoutError: A packed (quantized) tensor of a STREAMING file.

        Examples:
            >>> import numpy as np, aprfast
            >>> from aprfast import v1
            >>> blob = v1.save_model({"w": np.arange(12, dtype=np.float32).reshape(4, 3)},
            ...                      streaming=True, chunk_size=12)
            >>> with aprfast.open(blob) as f:
            ...     f.get_slice("w")[2:, 1].tolist()
            [7.0, 10.0]
        """
        if self._inner is not None:
            return self._inner.get_slice(name)
        if self._chunks is not None:
            return ChunkSlice(self, self._record(name))
        return _ViewSlice(self.get_tensor(name), self.info(name).dtype_name)

    def tensors(self, copy: bool = False) -> dict:
        """Every tensor, by name.

        Args:
            copy: Owned arrays instead of views of the map.

        Returns:
            A dict of name to tensor, in index order.

        Raises:
            AprIOError: The file is closed, or a read failed (and the errors of
                :meth:`get_tensor`).

        Examples:
            >>> import numpy as np, aprfast
            >>> from aprfast import v1
            >>> with aprfast.open(v1.save_model({"w": np.zeros(2, np.float32)})) as f:
            ...     f.tensors(copy=True)
            {'w': array([0., 0.], dtype=float32)}
        """
        return {name: self.get_tensor(name, copy) for name in self.keys()}

    def prefetch(self, names) -> None:
        """Ask the kernel to read these tensors' pages ahead (``madvise(MADV_WILLNEED)``).
        Only mapped plain and trueno files have pages to advise: for other files, or where
        the platform lacks madvise, this does nothing (a hint, never an error).

        Args:
            names: A tensor name or an iterable of them.

        Raises:
            TensorNotFoundError: A name the file does not hold.

        Examples:
            >>> import numpy as np, aprfast
            >>> from aprfast import v1
            >>> v1.save_model({"w": np.zeros(1024, np.float32)}, "m.apr")
            >>> with aprfast.open("m.apr") as f:
            ...     f.prefetch(["w"])
        """
        if isinstance(names, str):
            names = [names]
        mapping = getattr(self._source, "_map", None)
        ranges = [self._range(name) for name in names]
        advice = getattr(mmap, "MADV_WILLNEED", None)
        if mapping is None or advice is None or not hasattr(mapping, "madvise") or not _platform.uses("madvise"):
            return  # Windows: no madvise in Python's mmap (docs/PORTABILITY.md)
        for start, size in ranges:
            if size:
                page = start - start % mmap.PAGESIZE
                try:
                    mapping.madvise(advice, page, start + size - page)
                except (OSError, ValueError):  # closed under us, or a kernel that refuses: a hint only
                    return

    def _range(self, name):
        """(absolute offset, byte size) of a tensor's bytes in the file."""
        if self._entries is not None:
            e = self._entry(name)
            return e.offset, e.nbytes
        info = self.info(name)
        return (info.offset, info.nbytes) if self.kind == "plain" else (0, 0)

    # --- integrity and lifetime ---------------------------------------------------
    def verify(self) -> None:
        """Check everything: the whole-file CRC32, the whole-file signature (signed files),
        and every chunk (STREAMING: CRC32, signed digest, AES-GCM tag, decompression) or
        the inner v2 footer CRC (plain and whole-payload files).  Raises the first
        problem as a typed AprError.  Reads the whole file.

        Raises:
            ChecksumError: The whole-file CRC32, a chunk's CRC32 or the inner footer
                CRC32 does not match.
            SignatureError: The whole-file signature or a chunk digest does not verify.
            DecryptError: A chunk fails its AES-GCM tag.
            CorruptError: A chunk does not decompress to its recorded size.

        Examples:
            >>> import numpy as np, aprfast
            >>> from aprfast import v1
            >>> blob = bytearray(v1.save_model({"w": np.zeros(8, np.float32)}, streaming=True))
            >>> blob[-8] ^= 1  # flip a bit of the last chunk
            >>> with aprfast.open(bytes(blob)) as f:
            ...     f.verify()
            Traceback (most recent call last):
            ...
            aprfast.errors.ChecksumError: [E004] ...
        """
        src, path = self._source, self._source.path
        crc_offset = self._regions.crc_offset
        if src.zero_copy:
            actual = crc32(src.view(0, crc_offset))
        else:
            from ..files.reader import crc_by_chunks

            actual = crc_by_chunks(src, crc_offset)
        stored = int.from_bytes(src.read(crc_offset, layout.CRC_SIZE, "CRC32"), "little")
        if stored != actual:
            raise ChecksumError(f"CRC32 stored in the last 4 bytes is {stored:#010x} but bytes 0..{crc_offset} give "
                                f"{actual:#010x}", path=path)
        if self._header.flags & Flag.SIGNED:
            v1.checks.verify_signature(self._signed_view(), self._regions, [self.signer] if self.signer else None,
                                 False, path)
        if self._chunks is not None:
            self._chunks.verify(src.read)
        elif self._inner is not None:
            self._inner.verify()

    def close(self) -> None:
        """Release the file; arrays already handed out stay valid (they keep the map).

        Examples:
            >>> import numpy as np, aprfast
            >>> from aprfast import v1
            >>> f = aprfast.open(v1.save_model({"w": np.zeros(2, np.float32)}))
            >>> w = f.get_tensor("w")
            >>> f.close()
            >>> f.closed, w.tolist()
            (True, [0.0, 0.0])
        """
        if self._inner is not None:
            self._inner.close()
        if self._chunks is not None:
            self._chunks.close()
        self._base = None
        self._source.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._source.closed

    def _describe(self) -> str:
        return f"{self.path or '<buffer>'} kind={self.kind}"

    # --- helpers --------------------------------------------------------------------
    def _check_name(self, name):
        if name not in self:
            raise TensorNotFoundError(f"no tensor named {name!r}", path=self.path)

    def _record(self, name):
        self._check_open()
        record = self._chunks.index.tensors.get(name)
        if record is None:
            raise TensorNotFoundError(f"no tensor named {name!r}", path=self.path)
        return record

    def _entry(self, name):
        self._check_open()
        entry = self._entries.get(name)
        if entry is None:
            raise TensorNotFoundError(f"no tensor named {name!r}", path=self.path)
        return entry

    def _base_shift(self) -> int:
        """Subtract from absolute offsets to index ``_base`` (0 when it is the whole map)."""
        return 0 if self._mapped else self._payload_offset


def _kind(payload_kind: str, header: Header) -> str:
    if payload_kind == "chunks":
        return "streaming"
    if payload_kind == "trueno":
        return "trueno"
    if payload_kind == "tensors":
        stored_plainly = header.compression == Compression.NONE and not header.flags & Flag.ENCRYPTED
        return "plain" if stored_plainly else "whole"
    raise FormatError("this v1 file's payload is not tensors (no payload_format marker): read it with "
                      "aprfast.v1.load_model()")


def shifted(info: TensorInfo, by: int) -> TensorInfo:
    return TensorInfo(info.name, info.dtype, info.dtype_id, info.shape, info.offset + by, info.nbytes, info.flags)


def _rebased(entry, shift: int):
    if not shift:
        return entry
    return trueno.Entry(entry.name, entry.dtype, entry.shape, entry.strides, entry.alignment, entry.backend_hint,
                        entry.offset - shift, entry.nbytes)


def _trueno_id(entry) -> int:
    return next(i for i, n in trueno.DTYPE_IDS.items() if n == entry.dtype.name)


class _ViewSlice:
    """get_slice over a tensor already in memory (a view of the map): NumPy indexing."""

    def __init__(self, array, dtype_name: str):
        self._array = array
        self.shape = array.shape
        self._dtype_name = dtype_name

    def get_shape(self) -> list:
        return list(self.shape)

    def get_dtype(self) -> str:
        return self._dtype_name

    def __len__(self):
        return len(self._array)

    def __getitem__(self, key):
        return np.array(self._array[key], copy=True)


class ChunkSlice:
    """``V1File.get_slice(name)[key]`` for a STREAMING file: decodes only the chunks that
    hold the rows (along axis 0) the key selects, then indexes them in memory."""

    def __init__(self, file: V1File, record):
        if record.dtype is None or record.dtype.packed:
            raise LayoutError(f"tensor {record.name!r} is {record.dtype.name if record.dtype else 'of unknown dtype'}"
                              "; slicing reads elementwise dtypes only (read it whole with get_tensor)")
        from ..dtypes import numpy_dtype

        self._file = file
        self._record = record
        self.shape = record.shape
        self.dtype = numpy_dtype(record.dtype)

    def get_shape(self) -> list:
        """The tensor's shape, as a list."""
        return list(self.shape)

    def get_dtype(self) -> str:
        """The tensor's dtype name ("F32", ...)."""
        return self._record.dtype.name

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __getitem__(self, key) -> np.ndarray:
        if not self.shape:
            return np.array(self._file.get_tensor(self._record.name)[key], copy=True)
        box, local = bounding_box(key, self.shape)
        lo, hi = box[0]
        row = self.dtype.itemsize * int(np.prod(self.shape[1:], dtype=np.int64))
        if hi <= lo or row == 0:
            rows = np.empty((max(hi - lo, 0),) + tuple(self.shape[1:]), self.dtype)
        else:
            buffer, base = self._file._chunks.tensor_bytes(self._file._source.read, self._record.name,
                                                           lo * row, hi * row)
            rows = np.ndarray((hi - lo,) + tuple(self.shape[1:]), self.dtype, buffer, lo * row - base)
        region = rows[(slice(None),) + tuple(slice(a, b) for a, b in box[1:])]
        return np.array(region[local], copy=True)
