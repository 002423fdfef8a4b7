"""Writing v2 files: one pass from a layout's plan, to a path (atomically) or to any
writable file object, pipes included.

``save_file``/``save`` know every tensor up front, so the layout is planned first and
the bytes stream out once: prefix (header, metadata, index), each tensor with its
padding, then the footer, whose CRC is combined from per-piece CRCs rather than
re-read.  :class:`Writer` takes tensors one at a time: each is checksummed and
spooled to a temporary file as it arrives (peak memory about one tensor), and on
close the plan is made and the spool copied out in index order with the kernel's
``copy_file_range``/``sendfile`` where possible.  Given the tensors' names, dtypes and
shapes up front (``plan=``), it spools nothing: the prefix goes out at once and each
tensor straight after it as it is added.
"""

from __future__ import annotations

import os

import numpy as np

from .. import dtypes, layouts
from .._crc import crc32, crc32_combine
from .._memory import append_padded
from ..dtypes import DType, check_shape
from ..errors import AprError, AprIOError, LayoutError, UnknownDTypeError
from ..io import platform as _platform
from ..io.atomic import AtomicFile, kernel_copy, open_anonymous, reserve_blocks
from ..io.direct import DirectWriter
from ..tensors import TensorInput, as_input

__all__ = ["Writer", "write_plan"]

# Small pieces are gathered into one buffer so 10,000 tiny tensors cost a few syscalls.
_GATHER_LIMIT = 1 << 20
_ZEROS = bytes(4096)



class _Sink:
    """Writes byte pieces to a descriptor or file object, keeping the running CRC32 of
    everything written.  Small pieces are gathered so many tiny tensors cost a few
    syscalls and one CRC call per megabyte."""

    def __init__(self, fd=None, fileobj=None, direct=None):
        self._fd = fd
        self._file = fileobj
        self.pending = bytearray()
        self.crc = 0
        #: an aprfast.io.direct.DirectWriter every byte goes through (backend="direct")
        self.direct = direct

    def write(self, piece, nbytes: int) -> None:
        """Write ``nbytes`` bytes from ``piece`` (any C-contiguous buffer)."""
        if nbytes == 0:
            return
        if nbytes < _GATHER_LIMIT // 4:
            self.pending += _as_bytes(piece)
            if len(self.pending) >= _GATHER_LIMIT:
                self.flush()
            return
        self.flush()
        view = _as_bytes(piece)
        if self.direct is not None:
            # a buffer's worth at a time, CRC then copy: the CRC of a whole large tensor
            # first left the writes in flight to finish and the disk idle until it was
            # done (docs/performance.md, stop 36)
            self.crc = self.direct.write(view, self.crc)
            return
        self.crc = crc32(view, self.crc)
        self._write_all(view)

    def zeros(self, n: int) -> None:
        self.pending += _ZEROS[:n] if n <= len(_ZEROS) else bytes(n)
        if len(self.pending) >= _GATHER_LIMIT:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.crc = crc32(self.pending, self.crc)
            self._write_all(memoryview(self.pending))
            self.pending = bytearray()

    def copy_from(self, spool_fd: int, offset: int, n: int, crc: int) -> None:
        """Copy ``n`` bytes whose CRC is ``crc`` from ``spool_fd`` without passing them
        through Python when the kernel can."""
        self.flush()
        if not (self._fd is not None and self.direct is None and kernel_copy(spool_fd, self._fd, offset, n)):
            self._copy_through_memory(spool_fd, offset, n)
        self.crc = crc32_combine(self.crc, crc, n)

    def _copy_through_memory(self, spool_fd, offset, n):
        while n:
            chunk = _platform.pread(spool_fd, min(n, 8 << 20), offset)
            if not chunk:
                raise AprIOError("spool file ended early")
            self._write_all(memoryview(chunk))
            offset += len(chunk)
            n -= len(chunk)

    def _write_all(self, view: memoryview) -> None:
        if self.direct is not None:
            self.direct.write(view)
            return
        while len(view):
            if self._fd is not None:
                written = os.write(self._fd, view)
            else:
                written = self._file.write(view)
                written = len(view) if written is None else written
            view = view[written:]


def _as_bytes(piece) -> memoryview:
    """A flat unsigned-byte view of any C-contiguous buffer (0-d arrays included)."""
    view = memoryview(piece)
    if view.format == "B" and view.ndim == 1:
        return view
    return view.cast("B") if view.nbytes else memoryview(b"")


def write_plan(plan, sink: _Sink, *, spool_fd=None) -> None:
    """Stream a plan: prefix, tensors with padding, footer over the sink's running CRC."""
    sink.write(plan.prefix, len(plan.prefix))
    if spool_fd is None and sink._fd is not None and sink.direct is None and hasattr(os, "writev"):
        _write_vectored(plan, sink)
        _write_footer(plan, sink)
        return
    small = _GATHER_LIMIT // 4
    for item, pad in zip(plan.tensors, plan.pads):
        if spool_fd is not None:
            sink.copy_from(spool_fd, item.spool_offset, item.nbytes, item.crc)
            sink.zeros(pad)
        else:
            _write_tensor(sink, item, pad, small)
    _write_footer(plan, sink)


#: Tensors from this size go to the kernel from their own memory (an iovec entry costs
#: more than copying a smaller one into the gathering buffer).
_VECTOR_MIN = 16 << 10
#: One writev per this many bytes or _VECTOR_PIECES pieces (under every IOV_MAX): small
#: enough that the bytes the CRC just read are still in the last-level cache when the
#: kernel copies them.
_VECTOR_BATCH = 4 << 20
_VECTOR_PIECES = 512


def _write_vectored(plan, sink: _Sink) -> None:
    """The tensors of a whole plan written with writev from the caller's arrays: no
    gathering copy, the CRC taken over the same views (a 3.9 MiB model of 80 KiB
    tensors saved in ~0.97 ms this way against 1.10 ms gathered).  save_file's loop
    only: the arrays stay referenced until the call returns, which a streaming
    ``Writer.add`` could not promise once it has returned."""
    queue, queued = [], 0
    for item, pad in zip(plan.tensors, plan.pads):
        if item.nbytes < _VECTOR_MIN:
            append_padded(sink.pending, item.data, pad)
            if len(sink.pending) >= _GATHER_LIMIT:
                queued += _queue_pending(sink, queue)
            continue
        queued += _queue_pending(sink, queue)
        view = _as_bytes(item.data)
        sink.crc = crc32(view, sink.crc)
        queue.append(view)
        queued += item.nbytes
        if pad:
            sink.pending += _ZEROS[:pad]
        if queued >= _VECTOR_BATCH or len(queue) >= _VECTOR_PIECES:
            _writev_all(sink._fd, queue)
            queue, queued = [], 0
    queued += _queue_pending(sink, queue)
    _writev_all(sink._fd, queue)


def _queue_pending(sink: _Sink, queue: list) -> int:
    """Move the gathered bytes (CRC taken) to the end of the queue; their length."""
    pending = sink.pending
    if not pending:
        return 0
    sink.crc = crc32(pending, sink.crc)
    queue.append(pending)
    sink.pending = bytearray()
    return len(pending)


def _writev_all(fd: int, pieces: list) -> None:
    """writev until every byte of ``pieces`` is written (short writes resume mid-piece)."""
    pieces = [p for p in pieces if len(p)]
    while pieces:
        done = os.writev(fd, pieces)  # POSIX only: Windows sinks write piece by piece
        if done <= 0:
            raise AprIOError(f"writev wrote {done} bytes")
        i = 0
        while i < len(pieces) and done >= len(pieces[i]):
            done -= len(pieces[i])
            i += 1
        pieces = pieces[i:]
        if done:
            pieces[0] = memoryview(pieces[0])[done:]


def _write_tensor(sink: _Sink, item, pad: int, small: int = _GATHER_LIMIT // 4) -> None:
    """A tensor's bytes and the zero padding after it (small ones gathered)."""
    if item.nbytes < small:
        if append_padded(sink.pending, item.data, pad) and len(sink.pending) >= _GATHER_LIMIT:
            sink.flush()
    else:
        sink.write(item.data, item.nbytes)
        sink.zeros(pad)


def _write_footer(plan, sink: _Sink) -> None:
    sink.flush()
    footer = plan.footer(sink.crc)
    sink.write(footer, len(footer))
    sink.flush()


def save_to(target, plan, *, durable: bool = True, storage_options=None, backend: str = "auto") -> None:
    """Write a complete plan to a path (atomically), a URL (an upload published only
    when complete), a writable file object, or an uncommitted
    :class:`~aprfast.io.atomic.AtomicFile` (one file of a set; its owner commits it).
    ``backend="direct"``: a path's file is written around the page cache
    (:class:`aprfast.io.direct.DirectWriter`), and what little went through it is
    written back before the save returns, even when not ``durable``, so that nothing
    of the file stays cached."""
    if backend not in SAVE_BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, SAVE_BACKENDS))}, not {backend!r}")
    _emit_to(target, lambda sink: write_plan(plan, sink), durable, plan.total_size, storage_options,
             direct=backend == "direct")


#: What ``save_file(backend=...)`` takes: "auto" (buffered writes, as always) or "direct".
SAVE_BACKENDS = ("auto", "direct")


def _is_url(target) -> bool:
    if not (isinstance(target, str) and "://" in target):
        return False
    from .. import remote

    return remote.is_url(target)


def _open_upload(target, storage_options):
    """A :class:`aprfast.remote.RemoteTarget` for a URL: bytes stream into an upload that
    only ``commit()`` publishes and ``abort()`` discards."""
    from .. import remote

    return remote.RemoteTarget(target, storage_options)


def _emit_to(target, emit, durable: bool, size: int, storage_options=None, direct: bool = False) -> None:
    """Run ``emit(sink)`` into a path (atomically: temp file, fsync, rename), a URL
    (an upload committed at the end, discarded on failure) or a file object; an OS
    refusal (disk full, file too large, broken pipe) is AprIOError."""
    if _is_url(target):
        upload = _open_upload(target, storage_options)
        try:
            emit(_Sink(fileobj=upload.file))
        except BaseException as exc:
            upload.abort()
            _raise_io_error(exc, target)
            raise
        upload.commit()
        return
    if isinstance(target, AtomicFile):  # one file of a set: its writer stages and publishes it
        try:
            if not durable:
                reserve_blocks(target.fd, size)
            emit(_Sink(fd=target.fd))
        except BaseException as exc:
            target.abort()
            _raise_io_error(exc, target.path)
            raise
        return
    if isinstance(target, (str, os.PathLike)):
        atomic = AtomicFile(target, durable=durable)
        writer = None
        try:
            if not durable:
                reserve_blocks(atomic.fd, size)
            writer = DirectWriter(atomic.fd, atomic.temp_path) if direct else None
            emit(_Sink(fd=atomic.fd, direct=writer))
            if writer is not None:
                writer.flush()
                # written back (the fsync the commit would make anyway when durable), so the
                # advice drops every page the tail (or a buffered fallback) cached
                (os.fsync if durable else getattr(os, "fdatasync", os.fsync))(atomic.fd)
                writer.finish()
        except BaseException as exc:
            if writer is not None:
                writer.close()
            atomic.abort()
            _raise_io_error(exc, target)
            raise
        atomic.commit()
        return
    _require_writable(target)
    try:
        emit(_Sink(fileobj=target))
    except BaseException as exc:
        _raise_io_error(exc, _name_of(target))
        raise


def _name_of(target):
    return os.fspath(target) if isinstance(target, (str, os.PathLike)) else getattr(target, "name", None)


def _raise_io_error(exc, path) -> None:
    if isinstance(exc, OSError) and not isinstance(exc, AprError):
        raise AprIOError(f"write failed: {exc.strerror or exc}", path=path) from exc


def _require_writable(target) -> None:
    if not hasattr(target, "write"):
        raise TypeError(f"cannot write .apr data to {type(target).__name__}; give a path or a writable file")


class _Spooled:
    """A tensor already written to the spool: what a plan needs, without its bytes."""

    __slots__ = ("name", "dtype", "shape", "nbytes", "spool_offset", "crc")

    def __init__(self, item: TensorInput, spool_offset: int, crc: int):
        self.name, self.dtype, self.shape = item.name, item.dtype, item.shape
        self.nbytes, self.spool_offset, self.crc = item.nbytes, spool_offset, crc


class _Declared:
    """A tensor declared before its bytes exist: what a plan needs, without its bytes."""

    __slots__ = ("name", "dtype", "shape", "nbytes")

    def __init__(self, name, dtype, shape, nbytes):
        self.name, self.dtype, self.shape, self.nbytes = name, dtype, shape, nbytes


def _declare(plan) -> list:
    """``[(name, dtype, shape), ...]`` as _Declared tensors, each checked as an input would be."""
    if isinstance(plan, (str, bytes)) or not hasattr(plan, "__iter__"):
        raise TypeError(f"plan must be a list of (name, dtype, shape), not {type(plan).__name__}")
    declared, seen = [], set()
    for entry in plan:
        try:
            name, dtype, shape = entry
        except (TypeError, ValueError):
            raise LayoutError(f"each plan entry is (name, dtype, shape), not {entry!r}") from None
        if type(name) is not str:
            raise LayoutError(f"tensor names must be str, not {type(name).__name__}: {name!r}")
        if name in seen:
            raise LayoutError(f"tensor {name!r} is declared twice")
        seen.add(name)
        d = _plan_dtype(name, dtype)
        shape = _plan_shape(name, shape)
        check_shape(shape, d.itemsize or 4, f"tensor {name!r}")
        declared.append(_Declared(name, d, shape, d.nbytes(shape)))
    return declared


def _plan_dtype(name, dtype) -> DType:
    """An aprfast DType from a DType, an aprfast name ("F32", "q4_k") or anything
    ``numpy.dtype`` takes (np.float32, "float32", "<f4", bfloat16)."""
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str):
        try:
            return dtypes.by_name(dtype)
        except UnknownDTypeError:
            pass  # maybe a NumPy spelling ("<f4")
    try:
        as_numpy = np.dtype(dtype)
    except TypeError:
        raise LayoutError(f"tensor {name!r}: {dtype!r} is neither an aprfast dtype name nor a NumPy dtype") from None
    return dtypes.from_numpy(as_numpy)


def _plan_shape(name, shape) -> tuple:
    try:
        dims = tuple(shape)
    except TypeError:
        raise LayoutError(f"tensor {name!r}: shape must be a sequence of ints, not {shape!r}") from None
    for dim in dims:
        if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)) or dim < 0:
            raise LayoutError(f"tensor {name!r}: shape {shape!r} must hold non-negative ints")
    return tuple(int(d) for d in dims)


class Writer:
    """Write a file one tensor at a time; use as a context manager.

    ``target`` is a path (written atomically: nothing replaces it unless the ``with``
    block completes) or a writable file object, which may be a pipe.  See
    docs/guide/streaming.md.

    Without ``plan``, ``add`` spools each tensor to a nameless temporary file and the
    file is assembled on close, in the same bytes ``save_file`` would produce for the
    same tensors, whatever order they came in.

    With ``plan=[(name, dtype, shape), ...]`` (dtype a NumPy dtype or an aprfast name
    such as "F32" or "Q4_K") nothing is spooled: header, metadata and index are written
    at once, each tensor goes straight to the target as it is added, and ``close()``
    writes the footer.  Tensors must be added in the declared order, each with its
    declared dtype and shape, and the data lies in that order (the index is sorted by
    name as always); declared in name order, the bytes are exactly ``save_file``'s.
    A file object target gets each tensor as soon as ``add`` returns, so a reader at the
    other end of a pipe (``aprfast.stream``) can consume it while the writer works.
    ``close()`` refuses (and writes no file at a path) if a declared tensor is missing.

    A URL target (``s3://...``, any fsspec URL; ``storage_options`` go to fsspec) is an
    upload published only by a successful ``close()``: with a plan, the bytes stream
    into it as tensors are added (no local copy); without one, they are spooled locally
    first.  An abort or a failure leaves no object at the URL.

    Args:
        target: A path, a writable file object (a pipe too) or a URL.
        metadata: JSON-serialisable dict stored with the tensors.
        plan: ``[(name, dtype, shape), ...]`` declared up front, or ``None`` to spool.
        layout: "auto", "aprender" or "apr2", as for :func:`aprfast.save_file`.
        alignment: Byte alignment of each tensor's data in the file.
        durable: fsync the file and its directory on close.
        compression: "lz4", "zstd" or ``None`` (not with a plan).
        compression_level: The codec's level (``None``: its default).
        storage_options: Options passed to fsspec for a URL ``target``.
        reserve: Bytes of room to leave for in-place edits (:func:`aprfast.edit`), as
            for :func:`aprfast.save_file` (0: none, aprender's own bytes).

    Raises:
        LayoutError: Compression with a plan or with ``layout="aprender"``; a plan entry
            with a bad name, dtype or shape.
        AprIOError: The spool file cannot be created.
        TypeError: ``target`` is neither a path nor a writable file object.

    Examples:
        >>> import numpy as np, aprfast
        >>> with aprfast.Writer("model.apr", metadata={"step": 1}) as w:
        ...     w.add("b", np.zeros(2, np.float32))
        ...     w.add("a", np.ones((2, 2), np.float16))
        >>> aprfast.load_file("model.apr")["a"].shape
        (2, 2)

        Declared up front, each tensor goes straight to the target:

        >>> with aprfast.Writer("planned.apr", plan=[("x", "F32", (3,))]) as w:
        ...     w.add("x", np.float32([1, 2, 3]))
        >>> aprfast.load_file("planned.apr")["x"]
        array([1., 2., 3.], dtype=float32)
    """

    def __init__(self, target, metadata=None, *, plan=None, layout: str = "auto", alignment: int = 64,
                 durable: bool = True, compression: str | None = None, compression_level: int | None = None,
                 storage_options=None, reserve: int = 0):
        if not isinstance(target, (str, os.PathLike)):
            _require_writable(target)
        # Compression (apr2 only) needs every tensor's bytes before the index: spooled, never planned.
        if compression is not None and (plan is not None or layout not in ("auto", "apr2")):
            raise LayoutError(f"compression={compression!r} needs the apr2 layout and a Writer without a plan "
                              "(stored sizes are known only once each tensor is compressed)")
        self._compression, self._compression_level = compression, compression_level
        self._target = target
        self._storage_options = storage_options
        self._metadata = dict(metadata or {})
        self._layout = layout
        self._alignment = alignment
        self._durable = durable
        self._reserve = reserve
        self._names = set()
        self._items = []
        self._size = 0
        self._spool = None
        if plan is not None:
            self._start_planned(plan)
            self._state = "open"
            return
        local = isinstance(target, (str, os.PathLike)) and not _is_url(target)
        spool_dir = os.path.dirname(os.path.abspath(target)) if local else None
        try:
            # Beside the target (same filesystem, so copy_file_range can reflink), and
            # nameless: a killed Writer leaves nothing behind (see AtomicFile).
            self._spool = os.fdopen(open_anonymous(spool_dir), "w+b", buffering=0)
        except OSError as exc:
            raise AprIOError(f"cannot create a spool file in {spool_dir or 'the temp dir'}: {exc.strerror}",
                             path=_name_of(target)) from exc
        self._state = "open"

    def add(self, name: str, tensor) -> None:
        """Write one tensor.

        Args:
            name: The tensor's name, unique in the file.
            tensor: A NumPy array, a buffer, an ``__array__`` object,
                :class:`aprfast.RawTensor` or :class:`aprfast.QuantizedTensor`.

        Raises:
            LayoutError: ``name`` was already added; the dtype cannot be stored; with a
                plan, ``tensor`` is not the next declared tensor (name, dtype, shape).
            AprIOError: The spool or the target refused the write.
            AprError: The writer is already closed or aborted.

        Examples:
            >>> import numpy as np, aprfast
            >>> with aprfast.Writer("m.apr") as w:
            ...     w.add("t", np.arange(4, dtype=np.float32))
            ...     w.add("t", np.zeros(1, np.float32))
            Traceback (most recent call last):
            ...
            aprfast.errors.LayoutError: [E001] tensor 't' was already added
        """
        self._require_state("open", "add")
        if name in self._names:
            raise LayoutError(f"tensor {name!r} was already added")
        item = as_input(name, tensor)
        if self._spool is None:
            self._add_planned(item)
            return
        data = _as_bytes(item.data) if item.nbytes else memoryview(b"")
        try:
            _Sink(fd=self._spool.fileno())._write_all(data)
        except OSError as exc:
            raise AprIOError(f"cannot spool tensor {name!r}: {exc.strerror or exc}",
                             path=_name_of(self._target)) from exc
        self._items.append(_Spooled(item, self._size, crc32(data)))
        self._names.add(name)
        self._size += item.nbytes

    def close(self) -> None:
        """Assemble and commit the file (with a plan: write the footer and commit).

        Leaving the ``with`` block without an exception calls it; calling it again does
        nothing.

        Raises:
            LayoutError: With a plan, a declared tensor was never added (no file is
                written at a path).
            AprIOError: The operating system refused the write; a path is left as it was.

        Examples:
            >>> import numpy as np, aprfast
            >>> w = aprfast.Writer("m.apr")
            >>> w.add("t", np.zeros(3, np.float32))
            >>> w.close()
            >>> list(aprfast.load_file("m.apr"))
            ['t']
        """
        if self._state == "closed":
            return
        self._require_state("open", "close")
        if self._spool is None:
            self._close_planned()
            return
        self._state = "closing"
        try:
            if self._compression is not None:
                self._emit_compressed()
            else:
                plan = layouts.plan(self._items, self._metadata, layout=self._layout, alignment=self._alignment,
                                    reserve=self._reserve)
                self._emit(plan)
        finally:
            self._state = "closed"
            self._spool.close()

    def abort(self) -> None:
        """Discard everything added; a path target is left as it was.

        Bytes a planned writer already sent to a file object cannot be taken back: its
        reader sees a stream that ends early, which ``aprfast.stream`` reports as an
        error.  An exception leaving the ``with`` block calls it.

        Examples:
            >>> import os, numpy as np, aprfast
            >>> w = aprfast.Writer("m.apr")
            >>> w.add("t", np.zeros(3, np.float32))
            >>> w.abort()
            >>> os.path.exists("m.apr")
            False
        """
        self._state = "closed"
        if self._spool is not None:
            self._spool.close()
        atomic = getattr(self, "_atomic", None)
        if atomic is not None:
            atomic.abort()
            self._atomic = None

    def _emit_compressed(self) -> None:
        """Plan from read-only views of the spool (compression reads every tensor), then
        write the compressed file without copying from the spool."""
        import mmap

        whole = memoryview(mmap.mmap(self._spool.fileno(), self._size, access=mmap.ACCESS_READ)) if self._size \
            else memoryview(b"")
        items = [TensorInput(t.name, t.dtype, t.shape, whole[t.spool_offset:t.spool_offset + t.nbytes], t.nbytes)
                 for t in self._items]
        plan = layouts.plan(items, self._metadata, layout=self._layout, alignment=self._alignment,
                            compression=self._compression, compression_level=self._compression_level,
                            reserve=self._reserve)
        _emit_to(self._target, lambda sink: write_plan(plan, sink), self._durable, plan.total_size,
                 self._storage_options)

    def _emit(self, plan) -> None:
        spool_fd = self._spool.fileno()
        _emit_to(self._target, lambda sink: write_plan(plan, sink, spool_fd=spool_fd), self._durable,
                 plan.total_size, self._storage_options)

    # --- planned: header and index first, each tensor straight out ----------------
    def _start_planned(self, plan) -> None:
        declared = _declare(plan)
        self._plan = layouts.plan(declared, self._metadata, layout=self._layout, alignment=self._alignment,
                                  in_given_order=True, reserve=self._reserve)
        self._declared = {t.name: i for i, t in enumerate(self._plan.tensors)}
        self._next = 0
        self._atomic = None
        if _is_url(self._target):  # an upload: published by close(), discarded by abort()
            self._atomic = _open_upload(self._target, self._storage_options)
            self._sink = _Sink(fileobj=self._atomic.file)
        elif isinstance(self._target, (str, os.PathLike)):
            self._atomic = AtomicFile(self._target, durable=self._durable)
            self._sink = _Sink(fd=self._atomic.fd)
        else:
            self._sink = _Sink(fileobj=self._target)
        self._guarded(self._start_output)

    def _start_output(self) -> None:
        if isinstance(self._atomic, AtomicFile) and not self._durable:
            reserve_blocks(self._atomic.fd, self._plan.total_size)
        self._sink.write(self._plan.prefix, len(self._plan.prefix))
        self._push()

    def _add_planned(self, item) -> None:
        self._check_declared(item)
        i = self._next
        self._guarded(lambda: self._write_planned(item, self._plan.pads[i]))
        self._next += 1
        self._names.add(item.name)

    def _write_planned(self, item, pad: int) -> None:
        _write_tensor(self._sink, item, pad)
        self._push()

    def _check_declared(self, item) -> None:
        """The next declared tensor, exactly: name, dtype and shape (nothing is written otherwise)."""
        tensors, name = self._plan.tensors, item.name
        if name not in self._declared:
            raise LayoutError(f"tensor {name!r} is not in the plan given to Writer")
        want = tensors[self._next]
        if name != want.name:
            raise LayoutError(f"tensor {name!r} was added out of order: the plan declares {want.name!r} next "
                              "(tensors are written as they come, in the declared order)")
        if item.dtype is not want.dtype:
            raise LayoutError(f"tensor {name!r} is {item.dtype.name}, but the plan declares {want.dtype.name}")
        if tuple(item.shape) != want.shape:
            raise LayoutError(f"tensor {name!r} has shape {list(item.shape)}, but the plan declares "
                              f"{list(want.shape)}")
        if item.nbytes != want.nbytes:  # same dtype and shape: only a malformed RawTensor gets here
            raise LayoutError(f"tensor {name!r} holds {item.nbytes} bytes; the plan needs {want.nbytes}")

    def _close_planned(self) -> None:
        missing = [t.name for t in self._plan.tensors[self._next:]]
        if missing:
            self.abort()
            shown = ", ".join(repr(n) for n in missing[:8]) + (", ..." if len(missing) > 8 else "")
            where = ("no file was written" if isinstance(self._target, (str, os.PathLike))
                     else "the output is incomplete")
            raise LayoutError(f"close(): {len(missing)} declared tensors were never added ({shown}); {where}")
        self._state = "closing"
        self._guarded(lambda: (_write_footer(self._plan, self._sink), self._push()))
        atomic, self._atomic = self._atomic, None
        self._state = "closed"
        if atomic is not None:
            atomic.commit()

    def _push(self) -> None:
        """Hand what was written to a file object's reader now (a path is read only
        after commit, so its writes stay gathered)."""
        if self._atomic is None:
            self._sink.flush()
            flush = getattr(self._target, "flush", None)
            if flush is not None:
                flush()

    def _guarded(self, write) -> None:
        """Run a write; on any failure discard the output (nothing at a path target) and
        report an OS refusal (disk full, broken pipe) as AprIOError."""
        try:
            write()
        except BaseException as exc:
            self.abort()
            _raise_io_error(exc, _name_of(self._target))
            raise

    def _require_state(self, state, action):
        if self._state != state:
            raise AprError(f"Writer.{action}() called on a {self._state} writer")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False
