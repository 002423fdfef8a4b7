"""Reading a v2 file front to back from a stream that cannot seek: :func:`stream`.

Both v2 layouts put the header, metadata and index before the data, so a pipe,
socket or HTTP body can be read in one pass: the prefix (everything before the first
tensor byte, whose size the header gives and ``Limits`` bound) is read into memory and
parsed by the same layout code ``aprfast.open`` uses; then each tensor is read straight
into its own aligned buffer and yielded, and the footer is checked at the end.  Memory
is the prefix plus the largest tensor plus a 64 KiB scratch buffer.
"""

from __future__ import annotations

import os
import stat

import numpy as np

from . import _memory, layouts
from ._crc import crc32
from .errors import AprError, AprIOError, ChecksumError, CorruptError, LimitError, VersionError
from .limits import MAX_ALIGNMENT, Limits
from .reader import _maker
from .sources import BufferSource

__all__ = ["stream", "TensorStream"]

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


def stream(fileobj, *, limits: Limits | None = None, unknown_dtypes: str = "error",
           verify: bool = True) -> "TensorStream":
    """Read a v2 file (either layout) front to back, yielding ``(name, tensor)`` in file order.

    ``fileobj`` is anything with ``readinto`` or ``read`` (``sys.stdin.buffer``, a pipe,
    ``socket.makefile("rb")``, an HTTP response), a socket (``recv_into``), or for
    convenience a path or a bytes-like object.  It is read forward only, never
    seeked, and is not closed (a path is opened and closed here).

    Tensors are what ``AprFile.get_tensor(name, copy=True)`` returns: owned, writable,
    64-byte-aligned arrays, or QuantizedTensor / RawTensor (``unknown_dtypes="raw"``).
    They come in data order, which is index order for every file aprfast or aprender
    writes in one pass (and declaration order for a planned ``Writer``).  Memory is
    the prefix (header, metadata, index) plus the largest tensor plus a small constant.

    **Results are provisional until the iterator is exhausted.**  The CRC32 that covers
    the file is in its footer, at the very end, so a tensor yielded before the end
    cannot be vouched for yet.  With ``verify=True`` (the default) the running CRC of
    every byte is compared with the footer when the stream ends, and a mismatch raises
    ChecksumError from the last ``next()``; a stream that ends early, carries bytes
    after the footer, or breaks any rule ``aprfast.open`` checks raises a typed AprError
    too.  Treat what was yielded as valid only once iteration finished without error.
    ``verify=False`` skips the CRC but still checks the footer's place and form.

    The header, metadata and index are parsed here, before the first tensor, so
    ``layout``, ``header``, ``metadata``, ``names()`` and ``describe()`` are available
    at once; :meth:`TensorStream.finish` reads the rest without building tensors.
    """
    return TensorStream(fileobj, limits=limits, unknown_dtypes=unknown_dtypes, verify=verify)


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

    def __init__(self, target):
        self.pos = 0
        self.size = None  # the whole input's size, when it is known up front
        self.path = None
        self.owned = None
        if isinstance(target, (str, os.PathLike)):
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

    def fill(self, view, what: str, crc) -> int | None:
        """Fill ``view`` completely, or raise naming ``what`` was being read; return the
        running CRC over the bytes (``crc`` None: no CRC)."""
        total, got, done = len(view), 0, 0
        while got < total:
            n = self.readinto(view[got:])
            if n == 0:
                raise CorruptError(f"stream ended after {self.pos} bytes while reading {what}, which runs "
                                   f"to byte {self.pos + total - got}", path=self.path)
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


class TensorStream:
    """The iterator :func:`stream` returns; also a context manager (closing a path it opened).

    ``layout``, ``header``, ``metadata``, ``names()``, ``info(name)`` and ``describe()``
    describe the file from its prefix.  ``verified`` becomes True when the footer has
    been read and the CRC of every byte before it matched (never with ``verify=False``).
    """

    def __init__(self, fileobj, *, limits=None, unknown_dtypes="error", verify=True):
        if unknown_dtypes not in ("error", "raw"):
            raise ValueError(f"unknown_dtypes must be 'error' or 'raw', not {unknown_dtypes!r}")
        self.verified = False
        self._verify = verify
        self._skip = False
        self._error = None
        self._input = _Input(fileobj)
        try:
            self._file, self._layout, self._crc = self._read_prefix(limits or Limits(), unknown_dtypes == "error")
        except BaseException:
            self._input.close()
            raise
        self._makers = {}
        self._run = self._tensors()

    # --- the prefix -------------------------------------------------------------------
    def _read_prefix(self, limits: Limits, strict_dtypes: bool):
        """Header, metadata and index, read in bounded steps and parsed by the layout."""
        inp, path = self._input, self._input.path
        magic = inp.read_upto(_MAGIC_SIZE)
        layout = layouts.detect(BufferSource(magic, path))
        head = magic + inp.read_upto(layout.HEADER_SIZE - _MAGIC_SIZE)
        size = layout.prefix_size(head, limits, path)
        prefix = bytearray(head)
        while len(prefix) < size:  # grow as bytes arrive, never to a size merely claimed
            start = len(prefix)
            _memory.resize_bytearray(prefix, start + min(size - start, _PREFIX_STEP))
            with memoryview(prefix) as view:
                inp.fill(view[start:], "the header, metadata and tensor index", None)
        parsed = layout.parse_prefix(BufferSource(prefix, path), limits, strict_dtypes=strict_dtypes,
                                     file_size=inp.size)
        compressed = getattr(parsed.entries, "compressed", 0)
        if compressed:  # refuse before yielding anything, rather than yield stored blocks as values
            raise VersionError(f"{compressed} tensors are stored compressed (APR2 per-tensor codecs), which "
                               "stream() does not decode yet; save the stream to a file and use aprfast.open",
                               path=path)
        return parsed, layout, crc32(prefix) if self._verify else None

    # --- what the file holds ----------------------------------------------------------
    @property
    def layout(self) -> str:
        return self._file.layout

    @property
    def header(self) -> dict:
        """The header as ``AprFile.header`` gives it; an APR2 stream's ``file_size`` is
        None until the footer has been read (its length is known only then)."""
        return dict(self._file.header)

    @property
    def metadata(self) -> dict:
        return self._file.metadata

    def names(self) -> list:
        """Every tensor name, in index order.  (Not ``keys()``: ``dict(stream(f))`` must
        take the yielded pairs, not treat the stream as a mapping.)"""
        return list(self._file.names)

    def __len__(self) -> int:
        return len(self._file.names)

    def info(self, name: str):
        return self._file.info(name)

    def describe(self) -> dict:
        """Each tensor's dtype, shape, absolute offset and size (``aprfast.inspect``'s ``tensors``)."""
        return self._file.describe()

    # --- iteration --------------------------------------------------------------------
    def __iter__(self):
        return self

    def __next__(self):
        if self._error is not None:
            raise self._error  # a failed stream stays failed: never a quiet StopIteration
        try:
            return next(self._run)
        except StopIteration:
            raise
        except BaseException as exc:
            self._error = exc
            self._input.close()
            raise

    def finish(self) -> None:
        """Read everything left without building tensors, then check the footer (and
        the CRC, unless ``verify=False``).  Raises what iteration would raise."""
        self._skip = True
        for _ in self:
            pass

    def close(self) -> None:
        """Stop reading; close the file if ``stream`` was given a path."""
        self._run.close()
        self._input.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        # A stream of a path abandoned mid-way still closes the file it opened.
        inp = getattr(self, "_input", None)
        if inp is not None:
            inp.close()

    def _tensors(self):
        """Yield every tensor in data order, then check the footer."""
        f, inp = self._file, self._input
        scratch = memoryview(bytearray(_SCRATCH))
        for i in self._data_order():
            type_id, offset, size, shape = f.entries.row(i, f.data_start)
            name = f.names[i]
            if not size:  # occupies nothing, wherever it points
                if not self._skip:
                    yield name, self._make(type_id)(shape, _memory.AlignedBuffer(0), 0, 0)
                continue
            if offset < inp.pos:  # the parser refuses overlaps; a stream never reads backwards
                raise CorruptError(f"tensor {name!r} at byte {offset} overlaps the bytes before {inp.pos}",
                                   path=inp.path)
            self._skip_to(offset, scratch, f"the padding before tensor {name!r}")
            if self._skip:
                self._skip_to(offset + size, scratch, f"tensor {name!r}")
                continue
            buffer = self._allocate(name, size)
            self._crc = inp.fill(memoryview(buffer), f"tensor {name!r}", self._crc)
            yield name, self._make(type_id)(shape, buffer, 0, size)
        self._check_footer(scratch)
        inp.close()

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
            make = self._makers[type_id] = _maker(self._file.ids, type_id)
        return make

    def _allocate(self, name, size: int):
        try:
            return _memory.AlignedBuffer(size, 64)
        except MemoryError as exc:
            raise LimitError(f"tensor {name!r} declares {size} bytes, which cannot be allocated: {exc}",
                             path=self._input.path) from None

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
            if inp.read_upto(1):
                raise CorruptError(f"bytes follow the footer that ends at byte {inp.pos - 1}: the stream is "
                                   "longer than the file its index describes", path=path)
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
