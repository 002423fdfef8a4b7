"""Reading an .apr file front to back from a stream that cannot seek: :func:`stream`.

Every variant whose bytes come in a usable order streams with bounded memory:

* v2, both layouts: header, metadata and index come before the data, so the prefix
  (everything before the first tensor byte, whose size the header gives and ``Limits``
  bound) is read into memory and parsed by the same layout code ``aprfast.open`` uses;
  then each tensor is read into its own aligned buffer (made as its bytes arrive:
  :func:`_read_extent`) and yielded; APR2 tensors stored
  compressed are decoded from their stored bytes by ``tensor_codecs.decode_stored`` (the
  checks and C decoder ``get_tensor`` uses).  The footer CRC is checked at the end.
  Memory: the prefix, the largest tensor (stored plus raw size when compressed), 64 KiB.
* v1 STREAMING (chunk index): header, metadata and index are read first; the index
  signature is verified (signed, trusted keys given) and the file key opened (encrypted)
  before anything is yielded; then each chunk is checked as ``V1File`` checks it (CRC32,
  signed SHA-256, AES-GCM tag, bounded decompression, by ``v1.chunks.ChunkReader`` itself) as it
  arrives, and a tensor is yielded once all its chunks have.  Memory: the prefix, one
  tensor, one chunk stored and decoded.
* Other v1 tensor files (plain, whole-payload compressed or encrypted, trueno-native):
  one whole-payload AEAD tag, one compressed frame or one whole-file signature vouches
  for everything, and it can be checked only with every byte, so the file is read into
  memory, opened by ``V1File`` with every check, and only then yielded from
  (``TensorStream.buffered`` is True): memory is the file, plus its decoded payload.
"""

from __future__ import annotations

import contextlib
import os
import stat

import numpy as np

from . import _memory, layouts
from . import remote as _remote
from ._crc import crc32, crc32_combine
from .codecs import blocks as tensor_codecs
from .errors import AprError, AprIOError, ChecksumError, CorruptError, LimitError, SignatureError
from .files.handle import Handle
from .files.reader import array_maker
from .io.sources import BufferSource
from .layouts import v1 as v1_layout
from .limits import MAX_ALIGNMENT, Limits
from .security import refuse_keys

__all__ = ["stream", "TensorStream", "PENDING"]

#: ``TensorStream.signature`` of a signed v1 STREAMING stream read without
#: ``trusted_keys`` until its end, where the signer's key is.
PENDING = "pending (the signer's key comes at the end of the stream)"

try:
    import fcntl
    _F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", None)
except ImportError:  # Windows
    fcntl = _F_SETPIPE_SZ = None

_MAGIC_SIZE = 4
#: Skipped bytes (padding, gaps) go through this much scratch memory at a time.
_SCRATCH = 1 << 16
#: The prefix grows by at most this much per read, so a header that claims a large
#: prefix costs memory only as its bytes really arrive.
_PREFIX_STEP = 1 << 20
#: The running CRC is brought up to date every this many bytes of a tensor, while the
#: bytes just read are still in cache.
_CRC_STEP = 1 << 20
#: Where the footer is not fixed by the index (APR2 of unknown length), at most this
#: much padding may separate the last tensor from the footer.
_MAX_TAIL_PAD = MAX_ALIGNMENT - 1
#: A tensor (or v1 chunk) up to this size gets its buffer at once; a bigger one from a
#: stream whose length is unknown (a pipe, a socket, a file object) is read into pieces
#: that double, and gets its buffer only once a third of it has arrived (the pieces are
#: copied in, the rest read straight into it), so a size merely declared costs memory
#: only as its bytes arrive: at most 4x the bytes received.
_ALLOC_AT_ONCE = 1 << 20


def _next_aliases(order, k, offsets, sizes) -> bool:
    """True when the tensor after ``order[k]`` in data order has the same extent."""
    if k + 1 >= len(order):
        return False
    a, b = order[k], order[k + 1]
    return offsets[a] == offsets[b] and sizes[a] == sizes[b] and sizes[a] > 0


def stream(fileobj, *, limits: Limits | None = None, unknown_dtypes: str = "error", verify: bool = True,
           password=None, private_key=None, trusted_keys=None, require_signature: bool | None = None,
           allow_unencrypted: bool = False, storage_options=None) -> "TensorStream":
    """Read an .apr file front to back, yielding ``(name, tensor)`` in file order.

    A URL (``http(s)://`` or any fsspec URL; ``storage_options`` go to fsspec) is read
    with one plain GET from its start (:func:`aprfast.remote.open_stream`).  For
    ``http(s)://`` they may hold ``headers`` (never sent to another origin a redirect
    names), ``timeout`` (per socket operation), ``min_rate`` and ``deadline`` (time
    spent waiting for the server, past which RemoteTimeoutError, E007), as for
    :func:`aprfast.open`; a ``user:password@`` URL is sent as Basic auth, and messages
    show the URL without userinfo or query (docs/guide/remote.md):

    ```python
    for name, tensor in aprfast.stream("https://example.org/m.apr",
                                       storage_options={"timeout": 10, "deadline": 600}):
        ...
    ```

    ``fileobj`` is anything with ``readinto`` or ``read`` (``sys.stdin.buffer``, a pipe,
    ``socket.makefile("rb")``, an HTTP response), a socket (``recv_into``), or for
    convenience a path or a bytes-like object.  It is read forward only, never
    seeked, and is not closed (a path is opened and closed here).  ``password``,
    ``private_key``, ``trusted_keys``, ``require_signature`` and ``allow_unencrypted``
    mean what they mean for :func:`aprfast.open` (a key for a v2 file that is not
    encrypted, or a required signature on one that is not signed, is refused as ``open``
    refuses it).

    Tensors are what ``get_tensor(name, copy=True)`` returns: owned, writable,
    64-byte-aligned arrays, or QuantizedTensor / RawTensor (``unknown_dtypes="raw"``).
    They come in data order: index order for every file aprfast or aprender writes in
    one pass (declaration order for a planned ``Writer``), name order for a v1 STREAMING
    file.  Memory: the prefix (header, metadata, index) plus the largest tensor plus a
    small constant (a compressed APR2 tensor: its stored plus its raw size; a v1
    STREAMING tensor: plus one chunk).  A tensor's buffer is made only for bytes that
    are there: from a stream of unknown length, a tensor above 1 MiB is first read into
    pieces and gets its buffer once a third of it has arrived (that third is copied
    once), so a size the index merely declares costs memory only as its bytes arrive.
    v1 files without a chunk index are read whole first (``buffered``; see the module
    docstring).

    **What is vouched for when.**  Everything before the first tensor (header, metadata,
    index; a v1 STREAMING file's index CRC, its index signature when ``trusted_keys`` are
    given, its file key) is checked before ``stream()`` returns.  A v1 STREAMING chunk is
    checked (CRC32, signed digest, AES-GCM tag) before its tensor is yielded, so a
    tampered chunk of a signed (with ``trusted_keys``) or encrypted stream raises at or
    before its tensor.  An encrypted or signed APR2 stream is vouched for the same way:
    its signature (over header, metadata, index and every chunk digest) and content key
    are checked before ``stream()`` returns, and each tensor's chunks (digest, AES-GCM
    tag) before that tensor is yielded.  The rest is known only at the end: the whole-file CRC32 (both
    v2 layouts: the only check of their data; v1: the footer), and, for a signed v1
    stream opened without ``trusted_keys``, the index signature by the key embedded at
    the file's end.  Such a check fails from the last ``next()``; **treat what was
    yielded as provisional until iteration finished without error** unless the variant
    vouches for it earlier as above.  ``verify=False`` skips the whole-file CRC only.

    The header, metadata and index are parsed here, before the first tensor, so
    ``layout``, ``header``, ``metadata``, ``names()`` and ``describe()`` are available
    at once; :meth:`TensorStream.finish` reads the rest without keeping tensors.
    See docs/guide/streaming.md.

    Args:
        fileobj: A readable stream, a socket, a URL, a path or bytes-like data.
        limits: Bounds on what the parser believes (:class:`aprfast.Limits`).
        unknown_dtypes: "error" or "raw", as for :func:`aprfast.open`.
        verify: Check the whole-file CRC32 at the end.
        password: Password of an encrypted file.
        private_key: X25519 private key of a recipient of an encrypted file.
        trusted_keys: Ed25519 public keys; a signature by one of them becomes required.
        require_signature: Require (True) or waive (False) a trusted signature.
        allow_unencrypted: Accept a file that is not encrypted although a key was given.
        storage_options: Options for a URL, as for :func:`aprfast.open`.

    Returns:
        A :class:`TensorStream`: iterate it for ``(name, tensor)`` pairs.

    Raises:
        FormatError: Not an ``.apr`` file.
        CorruptError: The prefix contradicts itself, or the stream ends early (raised
            from ``next()``).
        ChecksumError: The CRC does not match (from the last ``next()``).
        LimitError: The prefix asks for more than ``limits`` allow.
        DecryptError: A wrong key or password.
        SignatureError: A required signature is missing or wrong.
        AprIOError: Reading the input failed.
        ValueError: ``password`` and ``private_key`` both given, or a bad
            ``unknown_dtypes``.

    Examples:
        >>> import numpy as np, aprfast
        >>> aprfast.save_file({"a": np.zeros(2, np.float32), "b": np.ones(3, np.float32)}, "m.apr")
        >>> with open("m.apr", "rb") as fh, aprfast.stream(fh) as s:
        ...     print(s.names())
        ...     for name, tensor in s:
        ...         print(name, tensor)
        ...     print(s.verified)
        ['a', 'b']
        a [0. 0.]
        b [1. 1. 1.]
        True
    """
    return TensorStream(fileobj, limits=limits, unknown_dtypes=unknown_dtypes, verify=verify, password=password,
                        private_key=private_key, trusted_keys=trusted_keys, require_signature=require_signature,
                        allow_unencrypted=allow_unencrypted, storage_options=storage_options)


def _widen_pipe(target) -> None:
    """Ask for a 1 MiB pipe buffer (Linux's default cap for unprivileged processes) when
    reading a pipe: 16x fewer wake-ups of writer and reader than the default 64 KiB.
    Measured on 512 MiB: about 2,300 context switches became under 300.  Best effort."""
    if _F_SETPIPE_SZ is None:
        return
    try:
        fd = target.fileno()
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, _F_SETPIPE_SZ, _PREFIX_STEP)
    except (AttributeError, OSError, ValueError):  # no descriptor, or the kernel said no
        pass


class _Input:
    """Forward-only reads from a file object, a socket or memory, counting bytes."""

    def __init__(self, target, storage_options=None):
        self.pos = 0
        self.size = None  # the whole input's size, when it is known up front
        self.path = None
        self.owned = None
        if isinstance(target, str) and "://" in target and _remote.is_url(target):
            self.owned = _remote.open_stream(target, storage_options)  # closed by close()
            self.path = _remote.redact_url(target)  # what messages show: no userinfo, no query
            self._readinto = self.owned.readinto
        elif isinstance(target, (str, os.PathLike)):
            self._open_path(os.fspath(target))
        elif isinstance(target, (bytes, bytearray, memoryview, np.ndarray)):
            view = memoryview(target)
            if not view.c_contiguous:
                raise ValueError("aprfast needs a contiguous buffer")
            self._memory = view.cast("B") if view.format != "B" or view.ndim != 1 else view
            self.size = self._memory.nbytes
            self._readinto = self._from_memory
        else:
            self.path = getattr(target, "name", None)
            _widen_pipe(target)
            if hasattr(target, "readinto"):
                self._readinto = target.readinto
            elif hasattr(target, "recv_into"):
                self._readinto = target.recv_into
            elif hasattr(target, "read"):
                self._read = target.read
                self._readinto = self._via_read
            else:
                raise TypeError(f"cannot stream .apr data from {type(target).__name__}: it has no "
                                "readinto(), recv_into() or read()")

    def _open_path(self, path):
        try:
            self.owned = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by close()
        except OSError as exc:
            raise AprIOError(f"cannot open: {exc.strerror}", path=path) from exc
        self.path = path
        self._readinto = self.owned.readinto
        try:
            size = os.fstat(self.owned.fileno()).st_size
        except OSError:
            size = 0
        self.size = size or None  # 0: a FIFO or a character device, length unknown

    def _from_memory(self, view) -> int:
        n = min(len(view), self.size - self.pos)
        view[:n] = self._memory[self.pos:self.pos + n]
        return n

    def _via_read(self, view) -> int:
        data = self._read(min(len(view), _PREFIX_STEP))
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"the stream's read() returned {type(data).__name__}, not bytes: open it in "
                            "binary mode")
        view[:len(data)] = data
        return len(data)

    def readinto(self, view) -> int:
        """One read of at most ``len(view)`` bytes; 0 at the end of the stream."""
        try:
            n = self._readinto(view)
        except AprError:
            raise
        except OSError as exc:
            raise AprIOError(f"read failed after {self.pos} bytes: {exc.strerror or exc}", path=self.path) from exc
        if n is None:  # a non-blocking descriptor with nothing to read yet
            raise AprIOError("the stream is non-blocking and had no data; stream() needs a blocking stream",
                             path=self.path)
        self.pos += n
        return n

    def known_left(self):
        """Bytes known to be there still (the input's length was known up front), or None."""
        return None if self.size is None else self.size - self.pos

    def fill(self, view, what: str, crc, end=None) -> int | None:
        """Fill ``view`` completely, or raise naming ``what`` was being read (which runs
        to byte ``end``, by default the end of ``view``); return the running CRC over
        the bytes (``crc`` None: no CRC)."""
        total, got, done = len(view), 0, 0
        while got < total:
            n = self.readinto(view[got:])
            if n == 0:
                raise CorruptError(f"stream ended after {self.pos} bytes while reading {what}, which runs "
                                   f"to byte {self.pos + total - got if end is None else end}", path=self.path)
            got += n
            if crc is not None and (got - done >= _CRC_STEP or got == total):
                crc = crc32(view[done:got], crc)
                done = got
        return crc

    def read_upto(self, n: int) -> bytes:
        """Up to ``n`` bytes: fewer only if the stream ended."""
        out = bytearray(n)
        view, got = memoryview(out), 0
        while got < n:
            k = self.readinto(view[got:])
            if k == 0:
                break
            got += k
        view.release()
        del out[got:]
        return bytes(out)

    def close(self) -> None:
        if self.owned is not None:
            self.owned.close()


def _grow(inp: _Input, buffer: bytearray, size: int, what: str) -> None:
    """Extend ``buffer`` with stream bytes until it holds ``size``, at most _PREFIX_STEP
    at a time, so a size merely claimed costs memory only as its bytes really arrive."""
    while len(buffer) < size:
        start = len(buffer)
        _memory.resize_bytearray(buffer, start + min(size - start, _PREFIX_STEP))
        with memoryview(buffer) as view:
            inp.fill(view[start:], what, None)


def _allocate(name, size: int, path):
    """An aligned buffer of ``size`` bytes, or LimitError.  (Its pages may be populated
    at once: call it for bytes known to be there, see :func:`_read_extent`.)"""
    try:
        return _memory.AlignedBuffer(size, 64)
    except MemoryError as exc:
        raise LimitError(f"{name} declares {size} bytes, which cannot be allocated: {exc}", path=path) from None


def _read_extent(inp: _Input, size: int, what: str, crc):
    """``(buffer, crc)``: an aligned buffer holding the next ``size`` bytes of ``inp``
    (``crc`` extended over them, None: no CRC), allocated only as the bytes arrive.

    Up to _ALLOC_AT_ONCE, or when the input's length is known and holds them (a file, a
    buffer): one buffer, filled in place.  Otherwise the size is only what the file
    declares, and a short stream must not cost it: the bytes go into pieces that double
    from _ALLOC_AT_ONCE until a third of the extent has arrived, then the buffer is made,
    the pieces copied in and freed, and the rest read straight into it.  Memory stays
    within 4x the bytes received; an honest tensor pays one copy of at most a third."""
    known = inp.known_left()
    if size <= _ALLOC_AT_ONCE or (known is not None and known >= size):
        buffer = _allocate(what, size, inp.path)
        return buffer, inp.fill(memoryview(buffer), what, crc)
    end, third = inp.pos + size, -(-size // 3)
    pieces, got, step = [], 0, _ALLOC_AT_ONCE
    while got < third:
        piece = _allocate(what, min(step, third - got), inp.path)
        crc = inp.fill(memoryview(piece), what, crc, end)
        pieces.append(piece)
        got += len(piece)
        step *= 2
    buffer = _allocate(what, size, inp.path)
    view = memoryview(buffer)
    at = 0
    for i, piece in enumerate(pieces):
        view[at:at + len(piece)] = memoryview(piece)
        at += len(piece)
        pieces[i] = None  # freed as soon as it is copied
    del piece
    crc = inp.fill(view[at:], what, crc, end)
    view.release()
    return buffer, crc


class TensorStream(Handle):
    """The iterator :func:`stream` returns; also a context manager (closing a path it opened).

    ``layout``, ``header``, ``metadata``, ``names()``, ``info(name)`` and ``describe()``
    describe the file from its prefix.  ``verified`` becomes True when the whole-file
    CRC (and, for a signed v1 stream, the signature) has been checked, at the end
    (never with ``verify=False``).  v1 streams also have ``kind`` ("streaming",
    "plain", "whole", "trueno"), ``signature``, ``signer``, ``encryption``, ``license``;
    ``buffered`` is True when the file had to be read whole before its first tensor.

    Examples:
        >>> import numpy as np, aprfast
        >>> s = aprfast.stream(aprfast.save({"w": np.zeros(4, np.float16)}))
        >>> s.layout, s.describe()["w"]["shape"], dict(s)["w"].dtype.name
        ('aprender', [4], 'float16')
    """

    def __init__(self, fileobj, *, limits=None, unknown_dtypes="error", verify=True, password=None,
                 private_key=None, trusted_keys=None, require_signature=None, allow_unencrypted=False,
                 storage_options=None):
        if unknown_dtypes not in ("error", "raw"):
            raise ValueError(f"unknown_dtypes must be 'error' or 'raw', not {unknown_dtypes!r}")
        if password is not None and private_key is not None:
            raise ValueError("give password= or private_key=, not both")
        self._skip = False
        self._error = None
        self._input = _Input(fileobj, storage_options)
        keys = dict(password=password, private_key=private_key, trusted_keys=trusted_keys,
                    require_signature=require_signature, allow_unencrypted=allow_unencrypted)
        try:
            self._body = self._open(limits or Limits(), unknown_dtypes == "error", verify, keys)
        except BaseException:
            self._input.close()
            raise
        self._run = self._body.tensors(lambda: self._skip)

    def _open(self, limits, strict, verify, keys):
        """The reader for this stream's variant, chosen by its magic."""
        inp = self._input
        magic = inp.read_upto(_MAGIC_SIZE)
        if magic == v1_layout.MAGIC:
            return _open_v1(inp, magic, limits, strict, verify, keys)
        return _V2Stream(inp, magic, limits, strict, verify, keys)

    # --- what the file holds ----------------------------------------------------------
    @property
    def layout(self) -> str:
        """"aprender", "apr2", or for a v1 file "v1"."""
        return self._body.layout

    @property
    def header(self) -> dict:
        """The header as ``open(...).header`` gives it; an APR2 stream's ``file_size`` is
        None until the footer has been read (its length is known only then)."""
        return self._body.header

    @property
    def metadata(self) -> dict:
        """The metadata as the writer was given it (as ``AprFile.metadata``)."""
        return self._body.metadata

    @property
    def stored_metadata(self) -> dict:
        """Every stored metadata key (``metadata`` leaves out what the layout adds)."""
        return getattr(self._body, "stored_metadata", self._body.metadata)

    @property
    def verified(self) -> bool:
        """True once the end-of-stream checks (CRC, late signature) passed."""
        return self._body.verified

    @property
    def buffered(self) -> bool:
        """True when the file had to be read whole before its first tensor (v1 files
        without a chunk index)."""
        return self._body.buffered

    @property
    def kind(self):
        """A v1 file's kind ("streaming", "plain", "whole", "trueno"), as ``V1File.kind``; None for v2."""
        return self._body.kind

    @property
    def signature(self) -> str:
        """As ``V1File.signature`` ("unsigned" for v2); PENDING while a signed v1 stream read
        without ``trusted_keys`` has not reached the signer's key at its end."""
        return self._body.signature

    @property
    def signer(self):
        """Who signed the file (as ``V1File.signer``, or an APR2 file's
        ``security["signer"]``); None when unsigned."""
        return self._body.signer

    @property
    def encryption(self) -> str:
        """How the file is encrypted (as ``V1File.encryption``, or an APR2 file's
        ``security["encryption"]``); "none" when it is not."""
        return self._body.encryption

    @property
    def license(self):
        """A v1 file's license block (as ``V1File.license``); None for v2."""
        return self._body.license

    def names(self) -> list:
        """Every tensor name, in index order.  (Not ``keys()``: ``dict(stream(f))`` must
        take the yielded pairs, not treat the stream as a mapping.)"""
        return self._body.names()

    def __len__(self) -> int:
        return len(self._body.names())

    def info(self, name: str):
        """The :class:`aprfast.TensorInfo` of ``name``, from the index."""
        return self._body.info(name)

    def describe(self) -> dict:
        """Each tensor's dtype, shape, absolute offset and size (``aprfast.inspect``'s ``tensors``)."""
        return self._body.describe()

    # --- iteration --------------------------------------------------------------------
    def __iter__(self):
        return self

    def __next__(self):
        if self._error is not None:
            raise self._error  # a failed stream stays failed: never a quiet StopIteration
        try:
            return next(self._run)
        except StopIteration:
            self._body.close()
            self._input.close()
            raise
        except BaseException as exc:
            self._error = exc
            self._body.close()
            self._input.close()
            raise

    def finish(self) -> None:
        """Read everything left without keeping tensors, then check the footer (and
        the CRC, unless ``verify=False``).  A v1 STREAMING file's chunks are still
        opened and checked one by one; an APR2 compressed tensor's blocks are not
        decoded (the CRC covers its stored bytes, as ``AprFile.verify`` does)."""
        self._skip = True
        for _ in self:
            pass

    def close(self) -> None:
        """Stop reading; close the file if ``stream`` was given a path."""
        self._closed = True
        self._run.close()
        self._body.close()
        self._input.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (the stream's input is released)."""
        return self.__dict__.get("_closed", False)

    def _describe(self) -> str:
        return f"layout={self.layout}"

    def __del__(self):
        # A stream of a path abandoned mid-way still closes the file it opened.
        inp = self.__dict__.get("_input")
        if inp is not None:
            inp.close()


# --- v2 (both layouts) ------------------------------------------------------------------
class _V2Stream:
    """A v2 file: the prefix parsed at once, then tensors in data order, then the footer.

    An encrypted or signed APR2 file (aprfast.security) has its security block in the
    prefix: block CRC, signature, content key and context tag are checked before the
    first tensor, and each tensor's chunks (digest, AES-GCM tag) before it is yielded."""

    buffered = False
    # v2 files are not licensed (the v1 attributes, for callers of any variant)
    kind, license = None, None

    def __init__(self, inp: _Input, magic: bytes, limits: Limits, strict: bool, verify: bool, keys=None):
        self._input = inp
        self.verified = False
        self._verify = verify
        self._makers = {}
        self._file, self._layout, self._crc = self._read_prefix(magic, limits, strict, keys or {})
        sec = self._file.security
        self.signature, self.signer = (sec.signature, sec.signer) if sec is not None else ("unsigned", None)
        self.encryption = sec.encryption if sec is not None else "none"

    def _read_prefix(self, magic, limits: Limits, strict_dtypes: bool, keys: dict):
        """Header, metadata and index, read in bounded steps and parsed by the layout."""
        inp, path = self._input, self._input.path
        layout = layouts.detect(BufferSource(magic, path))
        head = magic + inp.read_upto(layout.HEADER_SIZE - _MAGIC_SIZE)
        size = layout.prefix_size(head, limits, path)
        prefix = bytearray(head)
        _grow(inp, prefix, size, "the header, metadata and tensor index")
        if layout is layouts.apr2:
            parsed = layout.parse_prefix(BufferSource(prefix, path), limits, strict_dtypes=strict_dtypes,
                                         file_size=inp.size, keys=keys)
        else:
            refuse_keys(keys, path)
            parsed = layout.parse_prefix(BufferSource(prefix, path), limits, strict_dtypes=strict_dtypes,
                                         file_size=inp.size)
        return parsed, layout, crc32(prefix) if self._verify else None

    @property
    def layout(self) -> str:
        return self._file.layout

    @property
    def header(self) -> dict:
        return dict(self._file.header)

    @property
    def metadata(self) -> dict:
        return layouts.caller_metadata(self._file)  # as AprFile.metadata: what the writer was given

    @property
    def stored_metadata(self) -> dict:
        return self._file.metadata

    def names(self) -> list:
        return list(self._file.names)

    def info(self, name: str):
        return self._file.info(name)

    def describe(self) -> dict:
        return self._file.describe()

    def close(self) -> None:
        pass

    def tensors(self, skip):
        """Yield every tensor in data order (nothing while ``skip()``), then check the footer."""
        f, inp = self._file, self._input
        scratch = memoryview(bytearray(_SCRATCH))
        compressed = getattr(f.entries, "compressed", 0)
        order = list(self._data_order())
        offsets, sizes = f.entries.extents()
        shared = None  # (offset, size, buffer, raw size) kept only while the next name aliases it
        for k, i in enumerate(order):
            type_id, offset, size, shape = f.entries.row(i, f.data_start)
            name = f.names[i]
            if not size:  # occupies nothing, wherever it points
                if not skip():
                    yield name, self._make(type_id)(shape, _memory.AlignedBuffer(0), 0, 0)
                continue
            if shared is not None and shared[:2] == (offset, size):
                # one storage under several names (tied weights): the same bytes again
                if not skip():
                    yield name, self._make(type_id)(shape, shared[2], 0, shared[3])
                if not _next_aliases(order, k, offsets, sizes):
                    shared = None
                continue
            shared = None
            if offset < inp.pos:  # the parser refuses overlaps; a stream never reads backwards
                raise CorruptError(f"tensor {name!r} at byte {offset} overlaps the bytes before {inp.pos}",
                                   path=inp.path)
            self._skip_to(offset, scratch, f"the padding before tensor {name!r}")
            if skip():
                self._skip_to(offset + size, scratch, f"tensor {name!r}")
                continue
            buffer, self._crc = _read_extent(inp, size, f"tensor {name!r}", self._crc)
            if f.security is not None:  # digests and tags checked, decrypted in place, before use
                f.security.unseal_extent(i, memoryview(buffer).cast("B"))
            flags = f.entries.flags(i) if compressed else 0
            if flags:  # the stored bytes are dropped as soon as they are decoded
                buffer, size = self._decoded(name, buffer, flags, f.entries.raw_size(i)), f.entries.raw_size(i)
            yield name, self._make(type_id)(shape, buffer, 0, size)
            if _next_aliases(order, k, offsets, sizes):
                shared = (offset, f.entries.row(i, f.data_start)[2], buffer, size)
            del buffer  # else this frame keeps the caller's tensor alive while the next is read
        self._check_footer(scratch)

    def _decoded(self, name, stored, flags: int, raw_size: int):
        """An APR2 compressed tensor's raw bytes from its stored bytes, checked and decoded
        as ``get_tensor`` decodes them.  A block that fails is E002 at this tensor, before
        the footer CRC is known: it would fail to decode whatever the CRC said."""
        try:
            return tensor_codecs.decode_stored(stored, name, raw_size, flags, path=self._input.path)
        except MemoryError as exc:
            raise LimitError(f"tensor {name!r} declares {raw_size} raw bytes, which cannot be allocated: {exc}",
                             path=self._input.path) from None

    def _data_order(self):
        """Index order when the non-empty extents ascend in it (every one-pass writer's
        files); else the order of their offsets, since a stream cannot go back."""
        offsets, sizes = self._file.entries.extents()
        filled = offsets[sizes > 0]
        if len(filled) < 2 or bool(np.all(filled[1:] > filled[:-1])):
            return range(len(offsets))
        return np.argsort(offsets, kind="stable").tolist()

    def _make(self, type_id):
        make = self._makers.get(type_id)
        if make is None:
            make = self._makers[type_id] = array_maker(self._file.ids, type_id)
        return make

    def _skip_to(self, end: int, scratch, what: str) -> None:
        """Read (and checksum) the bytes up to absolute position ``end``."""
        inp = self._input
        while inp.pos < end:
            view = scratch[:min(len(scratch), end - inp.pos)]
            self._crc = inp.fill(view, what, self._crc)

    def _check_footer(self, scratch) -> None:
        f, inp, path = self._file, self._input, self._input.path
        layout = self._layout
        if f.footer_crc_offset is not None:  # the index (or a known length) fixes it
            self._skip_to(f.footer_crc_offset, scratch, "the padding after the last tensor")
            footer = bytearray(layout.FOOTER_SIZE)
            inp.fill(memoryview(footer), "the footer", None)
            _check_ended(inp, "the file its index describes")
        else:
            footer = self._read_tail(scratch)
        total = inp.pos
        stored = layout.read_footer(footer, total, path)
        if self._crc is not None and stored != self._crc:
            raise ChecksumError(f"footer CRC32 is {stored:#010x} but the {total - len(footer)} bytes streamed "
                                f"before it give {self._crc:#010x}", path=path)
        f.stored_crc = stored
        f.header["file_size"] = total
        self.verified = self._crc is not None

    def _read_tail(self, scratch) -> bytes:
        """The bytes after the last tensor, up to the end of the stream: padding (at most
        _MAX_TAIL_PAD bytes, checksummed) and the footer, which is the last FOOTER_SIZE."""
        f, inp, path = self._file, self._input, self._input.path
        offsets, sizes = f.entries.extents()
        data_end = f.data_start + (int((offsets + sizes).max()) if len(offsets) else 0)
        self._skip_to(data_end, scratch, "the data section")
        most = _MAX_TAIL_PAD + self._layout.FOOTER_SIZE
        tail = inp.read_upto(most + 1)
        if len(tail) > most:
            raise CorruptError(f"more than {most} bytes follow the last tensor (which ends at byte {data_end}): "
                               "the stream is longer than the file its index describes", path=path)
        if len(tail) < self._layout.FOOTER_SIZE:
            raise CorruptError(f"stream ended after {inp.pos} bytes while reading the footer "
                               f"({self._layout.FOOTER_SIZE - len(tail)} of its {self._layout.FOOTER_SIZE} "
                               "bytes missing)", path=path)
        pad = len(tail) - self._layout.FOOTER_SIZE
        if self._crc is not None:
            self._crc = crc32(tail[:pad], self._crc)
        return tail[pad:]


def _check_ended(inp: _Input, what: str) -> None:
    if inp.read_upto(1):
        raise CorruptError(f"bytes follow the end at byte {inp.pos - 1}: the stream is longer than {what}",
                           path=inp.path)


# --- v1 ---------------------------------------------------------------------------------
def _open_v1(inp: _Input, magic: bytes, limits: Limits, strict: bool, verify: bool, keys: dict):
    """The reader for a v1 stream: chunk by chunk (STREAMING), tensor by tensor (a plain
    tensor payload, unsigned), else read whole."""
    from .layouts.v1 import Flag, Header

    head = magic + inp.read_upto(v1_layout.HEADER_SIZE - _MAGIC_SIZE)
    header = Header.from_bytes(head, path=inp.path)
    if header.metadata_size > limits.max_metadata_size:  # before a byte of it is read
        raise LimitError(f"v1 metadata declares {header.metadata_size} bytes, above the limit of "
                         f"{limits.max_metadata_size}", path=inp.path)
    if keys["require_signature"] is None:
        keys = dict(keys, require_signature=keys["trusted_keys"] is not None)
    if header.flag_set & Flag.STREAMING:
        return _V1ChunkStream(inp, head, header, limits, strict, verify, keys)
    prefix = bytearray(head)
    _grow(inp, prefix, v1_layout.HEADER_SIZE + header.metadata_size, "the v1 metadata")
    if _plain_tensors(header, prefix, keys, inp.path):
        return _V1PlainStream(inp, bytes(prefix), header, limits, strict, verify, keys)
    return _V1WholeStream(inp, prefix, header, limits, strict, verify, keys)


def _plain_tensors(header, prefix, keys, path) -> bool:
    """Whether the payload is a v2 container stored as is and nothing at the file's end
    must vouch for it first: no compression, no encryption, no signature (a signed
    file's metadata is not even decoded before its whole-file signature verified)."""
    from . import v1
    from .layouts.v1 import Flag

    if header.flags & (Flag.SIGNED | Flag.ENCRYPTED) or keys["require_signature"] or header.compression:
        return False
    metadata = v1_layout.decode_metadata(prefix[v1_layout.HEADER_SIZE:], path=path)
    return v1.checks.payload_kind(header, metadata, path) == "tensors"


def _v1_size(header, index_size: int = 0) -> int:
    """The length a v1 file with this header (and chunk index) has: a stream of unknown
    length is then held to it (one byte more or less is E002)."""
    from .layouts.v1 import Flag

    signed = v1_layout.SIGNATURE_BLOCK_SIZE if header.flags & Flag.SIGNED else 0
    return (v1_layout.HEADER_SIZE + header.metadata_size + index_size + header.payload_size + signed
            + v1_layout.CRC_SIZE)


class _V1ChunkStream:
    """A v1 STREAMING file: header, metadata and chunk index first (signature and file
    key checked there), then each chunk checked as it arrives by ``v1.chunks.ChunkReader``, each
    tensor yielded when its chunks are in, then the signature block and the file CRC."""

    layout = v1_layout.NAME
    kind = "streaming"
    buffered = False

    def __init__(self, inp, head, header, limits, strict, verify, keys):
        from . import v1
        from .layouts import chunk_index

        self._input, self._header, self.verified = inp, header, False
        path = inp.path
        prefix = bytearray(head)
        meta_end = v1_layout.HEADER_SIZE + header.metadata_size
        _grow(inp, prefix, meta_end + chunk_index.HEADER_SIZE, "the v1 metadata and chunk index header")
        index_size = chunk_index.peek_size(bytes(prefix[meta_end:]), path=path, limits=limits)
        _grow(inp, prefix, meta_end + index_size, "the chunk index")
        self._prefix = bytes(prefix)
        read = v1.checks.reader_of(memoryview(self._prefix))
        regions = self._regions = v1.checks.locate(header, read, inp.size or _v1_size(header, index_size), path, limits)
        self.signature, self.signer = self._check_signature(read, keys)
        metadata = v1_layout.decode_metadata(self._prefix[meta_end - header.metadata_size:meta_end], path=path)
        v1.checks.payload_kind(header, metadata, path)  # the flag and the payload marker must agree
        self.license = v1.checks.decode_license(metadata, path)
        for key in v1_layout.INTERNAL_KEYS:
            metadata.pop(key, None)
        self.metadata = metadata
        self._chunks = v1.chunks.open_chunks(read, header, regions, path, limits, strict, keys["password"],
                                       keys["private_key"], keys["allow_unencrypted"],
                                       check_digests=regions.signature is not None)
        self.encryption = self._chunks.encryption
        self._crc = crc32(self._prefix) if verify else None

    def _check_signature(self, read, keys):
        """(state, signer) once the index signature verified, before the metadata is
        decoded (V1File's order).  The signer's key is in the signature block at the very
        end of the file: with ``trusted_keys`` the signature is checked against each of
        them now (TRUSTED; the block's key must then be that one); without, it can be
        checked only when the embedded key arrives (SELF_SIGNED, at the end: an
        untrusted key vouches for nothing before that anyway)."""
        from . import v1

        header, regions, path = self._header, self._regions, self._input.path
        if regions.signature is None:
            if keys["require_signature"]:
                raise SignatureError("the file is not signed but a signature is required", path=path)
            return v1.UNSIGNED, None
        trusted = keys["trusted_keys"]
        if trusted is None:
            return PENDING, None  # _check_tail verifies it with the embedded key
        key_at, failures = regions.signature[1], []
        for key in (bytes(k) for k in trusted):
            try:
                return v1.checks.verify_index_signature(_serving_key(read, key_at, key), header, regions, [key], True,
                                                  path)
            except SignatureError as exc:
                failures.append(exc.message)
        raise SignatureError(f"the chunk index signature verifies under none of the {len(failures)} trusted key(s)"
                             f"{': ' + failures[0] if failures else ''}", path=path)

    @property
    def header(self) -> dict:
        return self._header.as_dict()

    def names(self) -> list:
        return list(self._chunks.index.tensors)

    def info(self, name: str):
        from .tensors import TensorInfo

        t = self._record(name)
        first = self._chunks.index.chunks[t.first].offset if t.count else 0
        return TensorInfo(name, t.dtype, t.dtype_id, t.shape, self._regions.payload[0] + first, t.nbytes)

    def describe(self) -> dict:
        return {name: {"dtype": t.dtype.name if t.dtype is not None else f"unknown({t.dtype_id})",
                       "shape": list(t.shape), "offset": self.info(name).offset, "nbytes": t.nbytes}
                for name, t in self._chunks.index.tensors.items()}

    def _record(self, name):
        from .errors import TensorNotFoundError

        record = self._chunks.index.tensors.get(name)
        if record is None:
            raise TensorNotFoundError(f"no tensor named {name!r}", path=self._input.path)
        return record

    def close(self) -> None:
        self._chunks.close()  # wipes the file key

    def tensors(self, skip):
        """Each tensor once its chunks arrived and passed every check, in payload order
        (= index order: a tensor owns consecutive chunks, which tile the payload)."""
        chunks = self._chunks
        for name, t in chunks.index.tensors.items():
            if skip():
                for i in range(t.first, t.first + t.count):
                    chunks.decode(self._read_chunk, name, i)  # checked, not kept
                self._extend_crc(t)
                continue
            tensor = self._array(name, t)
            self._extend_crc(t)
            yield name, tensor
            del tensor  # else this frame keeps the caller's tensor alive while the next is read
        self._check_tail()

    def _array(self, name, t):
        try:
            return self._chunks.array(self._read_chunk, name)
        except MemoryError as exc:
            raise LimitError(f"tensor {name!r} declares {t.nbytes} bytes, which cannot be allocated: {exc}",
                             path=self._input.path) from None

    def _read_chunk(self, offset: int, n: int, what: str):
        """``v1.chunks.ChunkReader``'s read(offset, n, what), served from the stream: the chunks are
        asked for in file order, so ``offset`` is always where the stream stands."""
        inp = self._input
        if offset != inp.pos:  # chunks tile the payload in index order (the parser checks)
            raise CorruptError(f"{what} lies at byte {offset} but the stream stands at {inp.pos}", path=inp.path)
        buffer, _ = _read_extent(inp, n, what, None)
        return memoryview(buffer)

    def _extend_crc(self, t) -> None:
        """The whole-file CRC over a tensor's chunks, without a second pass: each chunk's
        CRC32 has just been compared with the index's, so the index's value is the CRC of
        its bytes and crc32_combine appends it."""
        if self._crc is None:
            return
        for c in self._chunks.index.chunks[t.first:t.first + t.count]:
            self._crc = crc32_combine(self._crc, c.crc, c.stored_size)

    def _check_tail(self) -> None:
        """The signature block (its key must be the one that verified the index), the
        file CRC, and the end of the stream."""
        from . import v1

        inp, path, regions = self._input, self._input.path, self._regions
        block = b""
        if regions.signature is not None:
            block = bytearray(v1_layout.SIGNATURE_BLOCK_SIZE)
            inp.fill(memoryview(block), "the signature block", None)
            block = bytes(block)
        stored = bytearray(v1_layout.CRC_SIZE)
        inp.fill(memoryview(stored), "the CRC32", None)
        _check_ended(inp, "its header and chunk index describe")
        if self._crc is not None:
            actual, stored = crc32(block, self._crc), int.from_bytes(stored, "little")
            if actual != stored:
                raise ChecksumError(f"CRC32 stored in the last 4 bytes is {stored:#010x} but the "
                                    f"{inp.pos - v1_layout.CRC_SIZE} bytes streamed before it give {actual:#010x}",
                                    path=path)
        if block:
            self._check_signer(v1, block[v1_layout.SIGNATURE_SIZE:])
        self.verified = self._crc is not None

    def _check_signer(self, v1, embedded: bytes) -> None:
        path = self._input.path
        if self.signer is not None:
            if embedded != self.signer:
                raise SignatureError(f"the signature block names key {embedded.hex()}, not the trusted key "
                                     f"{self.signer.hex()} that verified the chunk index", path=path)
            return
        read = _serving_key(v1.checks.reader_of(memoryview(self._prefix)), self._regions.signature[1], embedded)
        self.signature, self.signer = v1.checks.verify_index_signature(read, self._header, self._regions, None, False,
                                                                 path)


def _serving_key(read, key_at: int, key: bytes):
    """``read`` over the prefix, answering the signer key's place (at the file's end, not
    yet streamed) with ``key``: so v1.checks.verify_index_signature itself checks a candidate."""
    def serve(offset, n, what="range"):
        return key if offset == key_at and n == len(key) else read(offset, n, what)
    return serve


class _Window(_Input):
    """Bytes [0, size) of a region of another input, counted from its start: the region's
    end is this input's end.  Every byte passing through extends ``crc`` (the outer
    file's running CRC; None: not kept)."""

    def __init__(self, outer: _Input, size: int, crc):
        self.pos, self.size, self.path, self.owned = 0, size, outer.path, None
        self._outer, self.crc = outer, crc

    def known_left(self):
        outer = self._outer.known_left()
        return None if outer is None else min(outer, self.size - self.pos)

    def readinto(self, view) -> int:
        n = min(len(view), self.size - self.pos)
        if n <= 0:
            return 0
        got = self._outer.readinto(view[:n])
        if self.crc is not None and got:
            self.crc = crc32(view[:got], self.crc)
        self.pos += got
        return got

    def close(self) -> None:
        pass


@contextlib.contextmanager
def _in_payload(path):
    """Errors from the inner v2 container say so, as V1File's do."""
    try:
        yield
    except AprError as exc:
        raise type(exc)(f"tensor payload: {exc.message}", path=path) from None


class _V1PlainStream:
    """A v1 file whose payload is a v2 container stored as is: V1File's checks on the
    header and metadata, then the v2 streamer over the payload's bytes, then the file CRC."""

    layout = v1_layout.NAME
    kind = "plain"
    buffered = False

    def __init__(self, inp, prefix: bytes, header, limits, strict, verify, keys):
        from . import v1

        path = inp.path
        self._input, self._header, self.verified = inp, header, False
        read = v1.checks.reader_of(memoryview(prefix))
        self._regions = v1.checks.locate(header, read, inp.size or _v1_size(header), path, limits)
        metadata = v1_layout.decode_metadata(prefix[v1_layout.HEADER_SIZE:], path=path)
        self.license = v1.checks.decode_license(metadata, path)
        for key in v1_layout.INTERNAL_KEYS:
            metadata.pop(key, None)
        self.metadata = metadata
        self.signature, self.signer, self.encryption = v1.UNSIGNED, None, "none"
        v1.checks.refuse_downgrade(header, keys["password"], keys["private_key"], keys["allow_unencrypted"], path)
        if header.uncompressed_size != header.payload_size:
            raise CorruptError(f"uncompressed payload is {header.payload_size} bytes but the header says "
                               f"{header.uncompressed_size}", path=path)
        self._window = _Window(inp, header.payload_size, crc32(prefix) if verify else None)
        with _in_payload(path):
            self._inner = _V2Stream(self._window, self._window.read_upto(_MAGIC_SIZE), limits, strict, verify)

    @property
    def header(self) -> dict:
        return self._header.as_dict()

    def names(self) -> list:
        return self._inner.names()

    def info(self, name: str):
        from .v1.reader import shifted

        return shifted(self._inner.info(name), self._regions.payload[0])

    def describe(self) -> dict:
        start = self._regions.payload[0]
        return {name: dict(d, offset=d["offset"] + start) for name, d in self._inner.describe().items()}

    def close(self) -> None:
        pass

    def tensors(self, skip):
        with _in_payload(self._input.path):
            yield from self._inner.tensors(skip)
        inp = self._input
        stored = bytearray(v1_layout.CRC_SIZE)
        inp.fill(memoryview(stored), "the CRC32", None)
        _check_ended(inp, "its header describes")
        actual, stored = self._window.crc, int.from_bytes(stored, "little")
        if actual is not None and actual != stored:
            raise ChecksumError(f"CRC32 stored in the last 4 bytes is {stored:#010x} but the "
                                f"{inp.pos - v1_layout.CRC_SIZE} bytes streamed before it give {actual:#010x}",
                                path=inp.path)
        self.verified = actual is not None and self._inner.verified


class _V1WholeStream:
    """A v1 file without a chunk index: read whole (bounded by its header's sizes, as the
    bytes arrive), opened by ``V1File`` with every check it makes, then yielded from."""

    layout = v1_layout.NAME
    buffered = True

    def __init__(self, inp, data, header, limits, strict, verify, keys):
        from .v1.reader import V1File

        self._input, self.verified = inp, False
        size = inp.size or _v1_size(header)
        _grow(inp, data, size, "the v1 file (read whole: it has no chunk index)")
        _check_ended(inp, "its header describes")
        self._file = V1File(data, password=keys["password"], private_key=keys["private_key"],
                            trusted_keys=keys["trusted_keys"], require_signature=keys["require_signature"],
                            limits=limits, unknown_dtypes="error" if strict else "raw",
                            allow_unencrypted=keys["allow_unencrypted"])
        try:
            if verify:
                self._file.verify()  # the file CRC, the signature, the inner footer: all in memory now
        except BaseException:
            self._file.close()
            raise
        self.verified = verify
        for name in ("kind", "signature", "signer", "encryption", "license", "metadata", "header"):
            setattr(self, name, getattr(self._file, name))
        # Kept, so that they still answer once the file is closed at the stream's end.
        self._infos = {name: self._file.info(name) for name in self._file.keys()}

    def names(self) -> list:
        return list(self._infos)

    def info(self, name: str):
        found = self._infos.get(name)
        if found is None:
            from .errors import TensorNotFoundError

            raise TensorNotFoundError(f"no tensor named {name!r}", path=self._input.path)
        return found

    def describe(self) -> dict:
        return {name: {"dtype": i.dtype.name if i.dtype is not None else f"unknown({i.dtype_id})",
                       "shape": list(i.shape), "offset": i.offset, "nbytes": i.nbytes}
                for name, i in self._infos.items()}

    def close(self) -> None:
        self._file.close()

    def tensors(self, skip):
        for name in self._file.keys():
            if skip():
                break
            yield name, self._file.get_tensor(name, copy=True)
        self._file.close()
