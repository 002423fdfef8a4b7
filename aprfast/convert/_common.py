"""What every converter shares: tensor specs, the streaming source interface, bounded reads.

A *source* has ``metadata`` (a dict), ``specs`` (a list of :class:`Spec`, in file
order), ``read(spec, scratch=None)`` (one tensor's value: a NumPy array, or a
:class:`~aprfast.tensors.QuantizedTensor`/``RawTensor``), ``tensors()`` (a generator of
``(name, value)`` holding one tensor at a time) and ``close()``.  Because every spec is
known before any byte is read, writers can put headers and indexes first and then
stream the data.
"""

from __future__ import annotations

import mmap as _mmap
import os
from dataclasses import dataclass

import numpy as np

from .. import dtypes as _dtypes
from ..dtypes import DType
from ..errors import AprIOError, CorruptError, LayoutError, LimitError, os_error
from ..io import platform as _platform
from ..tensors import QuantizedTensor, RawTensor

__all__ = ["Spec", "DestinationExistsError", "read_exact", "read_array", "check_shape_bytes", "copy_range",
           "map_range", "write_all", "reserve"]


@dataclass(frozen=True)
class Spec:
    """One tensor as a source declares it: name, aprfast dtype, logical shape (NumPy
    order, outermost first) and stored byte count."""

    name: str
    dtype: DType
    shape: tuple
    #: the stored byte count where the dtype gives none (an opaque dtype: the file's own)
    size: int | None = None

    @property
    def nbytes(self) -> int:
        return self.size if self.size is not None else self.dtype.nbytes(self.shape)


class DestinationExistsError(AprIOError, FileExistsError):
    """E007: the destination exists and ``force=True`` was not given.

    An :class:`aprfast.AprIOError` and a :class:`FileExistsError`; raised by
    :func:`aprfast.convert.convert`, :func:`aprfast.tools.merge.merge_models` and the
    whole-file tools of :mod:`aprfast.tools.protection`.  docs/guide/converting.md.

    Attributes:
        path: The destination.

    Examples:
        >>> import numpy as np, aprfast
        >>> from aprfast.convert import DestinationExistsError, convert
        >>> aprfast.save_file({"w": np.float32([1, 2])}, "m.apr")
        >>> convert("m.apr", "m.safetensors")["tensors"]
        1
        >>> try:
        ...     convert("m.apr", "m.safetensors")
        ... except DestinationExistsError as exc:
        ...     print(exc.code, exc.path, isinstance(exc, FileExistsError))
        E007 m.safetensors True
        >>> convert("m.apr", "m.safetensors", force=True)["format"]  # replaces it
        'safetensors'
    """


def read_exact(fd: int, offset: int, size: int, what: str, path) -> bytes:
    """``size`` bytes at ``offset`` or CorruptError naming ``what`` (a short read is a
    truncated file, never silently fewer bytes)."""
    try:
        data = _platform.pread(fd, size, offset)
    except OSError as exc:
        raise os_error(exc, f"cannot read {what}", path=path) from exc
    if len(data) != size:
        raise CorruptError(f"file ends inside {what}: needed {size} bytes at offset {offset}, "
                           f"found {len(data)}", path=path)
    return data


def read_array(fd: int, offset: int, size: int, what: str, path, scratch=None) -> np.ndarray:
    """A uint8 array of ``size`` bytes read straight into place (no bytes copy): the front
    of ``scratch`` when it is given and big enough (the caller promises the previous
    tensor read into it is no longer used), else a new array."""
    if scratch is not None and scratch.nbytes >= size:
        out = scratch[:size]
    else:
        out = np.empty(size, np.uint8)
    view = memoryview(out)
    done = 0
    while done < size:
        try:
            n = _platform.preadv(fd, view[done:], offset + done)
        except OSError as exc:
            raise os_error(exc, f"cannot read {what}", path=path) from exc
        if n == 0:
            raise CorruptError(f"file ends inside {what}: needed {size} bytes at offset {offset}, "
                               f"found {done}", path=path)
        done += n
    return out


def check_shape_bytes(name: str, dtype: DType, shape, path) -> int:
    """The stored size of a declared tensor, refusing shapes whose product overflows
    what any file could hold (checked before the size is trusted)."""
    try:
        _dtypes.check_shape(shape, dtype.itemsize or 1, f"tensor {name!r}")
    except LimitError as exc:
        raise LimitError(exc.message, path=path) from None
    return dtype.nbytes(shape)


_COPY_CHUNK = 8 << 20
#: Tensors at least this big are read as a mapping of the source (see :func:`map_range`)
#: rather than preadv into the scratch buffer: below it the mapping's own syscalls and
#: page-table work cost more than the one copy they save.
MAP_MIN = 1 << 20
#: A file-to-file copy maps at most this much of the source at once (its pages count in
#: the process's resident set until the window is unmapped).
COPY_WINDOW = 16 << 20
_PAGE = _mmap.ALLOCATIONGRANULARITY
# Linux: a read-only shared mapping whose page tables are filled by mmap itself.
_POPULATE = (_mmap.MAP_SHARED | _mmap.MAP_POPULATE) if hasattr(_mmap, "MAP_POPULATE") else None


def write_all(fd: int, data) -> None:
    """Write every byte of ``data`` (any buffer) to ``fd`` at its position."""
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


def map_range(fd: int, offset: int, size: int):
    """``(mapping, array)``: a read-only uint8 array of the ``size`` bytes of ``fd`` at
    ``offset``, backed by a shared mapping of the file whose page tables ``mmap`` fills
    at once (MAP_POPULATE), or None where that is not possible (no MAP_POPULATE outside
    Linux, a file that is shorter than the range, a descriptor that cannot be mapped):
    the caller then reads with pread.

    Why a populated mapping: the bytes are consumed in place (statistics, CRC,
    ``write()`` to the destination) with no copy into a buffer of ours, and filling the
    page tables in one call is several times cheaper than taking the faults one page at a
    time inside ``write()`` (measured on ext4, 160 MiB read and written: 28 ms of CPU
    this way, 55 ms through a pread buffer, 85 ms from an unpopulated map; CRC and
    write from it, the GGUF -> .apr path, 35 ms against 55 ms through the buffer).
    The file's length is checked first; a file truncated while it is mapped would
    fault (SIGBUS), as any mapped reader's would."""
    if _POPULATE is None or size <= 0:
        return None
    base = offset - offset % _PAGE
    try:
        if os.fstat(fd).st_size < offset + size:
            return None  # the pread path reports the truncated file
        mapping = _mmap.mmap(fd, size + offset - base, flags=_POPULATE, prot=_mmap.PROT_READ, offset=base)
    except (OSError, ValueError, OverflowError):
        return None
    return mapping, np.frombuffer(mapping, np.uint8, size, offset - base)


def release_mapping(mapping) -> None:
    """Unmap ``mapping`` now, or, while an array still refers to it, drop its pages from
    the process (``MADV_DONTNEED`` on a shared file mapping: the page cache keeps them,
    and an access maps them again), so the resident set does not keep every tensor read."""
    try:
        mapping.close()
        return
    except BufferError:
        pass
    if _platform.uses("madvise") and hasattr(_mmap, "MADV_DONTNEED"):
        try:
            mapping.madvise(_mmap.MADV_DONTNEED)
        except (OSError, ValueError):
            pass


def copy_range(src_fd: int, offset: int, nbytes: int, dst_fd: int, what: str, path=None) -> None:
    """Append ``nbytes`` of ``src_fd`` at ``offset`` to ``dst_fd`` without passing them
    through a buffer of ours: ``copy_file_range`` (the kernel copies, or reflinks); where
    it is missing or refused, ``write()`` from windows of a populated mapping of the
    source (:func:`map_range`), else bounded pread/write chunks.  A source that ends
    early is a CorruptError, not a short file.

    Measured (ext4, 160 MiB): the mapped write took 28 ms of CPU against 53 ms for
    ``copy_file_range``, but from a file written moments before (the second half of a
    GGUF -> .apr -> GGUF round trip) it took 0.5-1 s one time in three, where
    ``copy_file_range`` stayed at 110-130 ms; so the kernel's copy comes first."""
    done = 0
    use_kernel = _platform.uses("copy_file_range")
    while done < nbytes and use_kernel:
        try:
            n = os.copy_file_range(src_fd, dst_fd, min(nbytes - done, 1 << 30), offset + done)
        except OSError:  # another filesystem, an old kernel, a pipe: the rest through memory
            break
        if n == 0:
            raise CorruptError(f"source ended inside {what} ({done} of {nbytes} bytes copied)", path=path)
        done += n
    while done < nbytes:
        n = min(nbytes - done, COPY_WINDOW)
        mapped = map_range(src_fd, offset + done, n)
        if mapped is None:
            break
        mapping, view = mapped
        del mapped
        try:
            write_all(dst_fd, view)
        finally:
            del view
            release_mapping(mapping)
        done += n
    while done < nbytes:
        data = _platform.pread(src_fd, min(nbytes - done, _COPY_CHUNK), offset + done)
        if not data:
            raise CorruptError(f"source ended inside {what} ({done} of {nbytes} bytes copied)", path=path)
        write_all(dst_fd, data)
        done += len(data)


def reserve(fd: int, size: int, durable: bool, path) -> None:
    """Reserve a new file's blocks at once when it is not fsynced (aprfast.files.writer's rule:
    on ext4 writing into reserved blocks is much cheaper than allocating page by page,
    but a durable write's fsync then got slower); a full disk is an error before any
    byte is written."""
    if durable:
        return
    from ..io.atomic import reserve_blocks

    try:
        reserve_blocks(fd, size)
    except OSError as exc:
        raise os_error(exc, "cannot reserve space for the output", path=path) from exc


class Scratch:
    """One reusable read buffer for a conversion: tensors are consumed one at a time, so
    reading each into the same pages avoids a fresh allocation (page faults and zeroing
    of every page, every tensor) and keeps the peak at the largest tensor.  Big tensors
    are mapped instead (:meth:`map`); each read through the scratch releases the
    previous mapping, so the resident set holds one tensor at a time either way."""

    def __init__(self):
        self.buffer = None
        self._mapping = None

    def get(self, size: int) -> np.ndarray:
        self.release()
        if self.buffer is None or self.buffer.nbytes < size:
            self.buffer = None  # the old buffer goes before the bigger one is made
            self.buffer = np.empty(size, np.uint8)
        return self.buffer

    def map(self, fd: int, offset: int, size: int):
        """A read-only array of the bytes in place (:func:`map_range`), valid until the
        next use of this scratch, or None (read them with :meth:`get`)."""
        self.release()
        mapped = map_range(fd, offset, size)
        if mapped is None:
            return None
        self._mapping = mapped[0]
        return mapped[1]

    def release(self) -> None:
        mapping, self._mapping = self._mapping, None
        if mapping is not None:
            release_mapping(mapping)


class TensorFileSource:
    """A foreign file of tensors laid out at offsets from a data start (safetensors,
    GGUF): open, parse (the subclass's ``_parse`` fills ``specs``, ``_data_start``,
    ``_offsets``), then read tensors one at a time.  ``kind`` names the format in errors."""

    kind = "tensor"

    def __init__(self, path):
        self.path = os.fspath(path)
        try:
            self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise os_error(exc, f"cannot open {self.kind} file", path=self.path) from exc
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    def _parse(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def read(self, spec: Spec, scratch=None):
        """The tensor's value; with ``scratch`` (a Scratch) it may live in reused memory
        (a big tensor: read-only, a mapping of the file), valid until the next read with
        the same scratch."""
        offset = self._data_start + self._offsets[spec.name]
        if scratch is not None and spec.nbytes >= MAP_MIN:
            raw = scratch.map(self._fd, offset, spec.nbytes)
            if raw is not None:
                return value_of(spec.dtype, spec.shape, raw)
        raw = read_array(self._fd, offset, spec.nbytes, f"tensor {spec.name!r}", self.path,
                         None if scratch is None else scratch.get(spec.nbytes))
        return value_of(spec.dtype, spec.shape, raw)

    def raw_range(self, spec: Spec):
        """(fd, offset) of the tensor's stored bytes, for writers that copy them unchanged."""
        return self._fd, self._data_start + self._offsets[spec.name]

    def tensors(self, wanted=None):
        for spec in self.specs:
            if wanted is None or spec.name in wanted:
                yield spec.name, self.read(spec)

    def close(self) -> None:
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            os.close(fd)


def value_of(dtype: DType, shape, raw: np.ndarray):
    """The writer-ready value of stored bytes: an array when NumPy (or ml_dtypes) has the
    type, a QuantizedTensor for packed types, else a RawTensor (the bits, typed; an opaque
    dtype's bytes as they are)."""
    if dtype.opaque:
        return RawTensor(dtype, shape, raw)
    if dtype.packed:
        return QuantizedTensor(dtype, shape, raw)
    np_dtype = _dtypes.numpy_dtype(dtype)
    try:
        native = _dtypes.from_numpy(np_dtype) is dtype
    except LayoutError:
        native = False
    if not native:  # e.g. bf16 without ml_dtypes: uint16 would be stored as U16
        return RawTensor(dtype, shape, raw)
    return raw.view(np_dtype).reshape(shape)


class DeclaredWriter:
    """A foreign-format writer whose header lists every tensor first (``specs``), so
    tensors must come in that order; the file (an AtomicFile, ``_atomic``) appears only
    when all of them were added."""

    def _expect(self, name: str) -> Spec:
        spec = self.specs[self._next] if self._next < len(self.specs) else None
        if spec is None or spec.name != name:
            raise LayoutError(f"tensor {name!r} added out of the declared order "
                              f"(expected {spec.name if spec else 'no more tensors'!r})")
        return spec

    def close(self) -> None:
        self.finish().commit()

    def finish(self):
        """Check every declared tensor was added and hand over the written, uncommitted
        AtomicFile (a member of a set: its owner stages and publishes it)."""
        if self._next != len(self.specs):
            self.abort()
            raise LayoutError(f"{len(self.specs) - self._next} declared tensors were never added; no file written")
        atomic, self._atomic = self._atomic, None
        return atomic

    def abort(self) -> None:
        if self._atomic is not None:
            self._atomic.abort()
            self._atomic = None
