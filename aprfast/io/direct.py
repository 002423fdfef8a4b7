"""Reads and writes that leave the page cache as they found it (``backend="direct"``),
and the choice ``backend="auto"`` makes between them and buffered reads.

Why: a cold start reads the model from disk (or a network filesystem), and a buffered
read then holds the model twice, once in the page cache and once in the arrays (peak
memory about 2x the model).  Direct I/O (``O_DIRECT``) moves the bytes from the device
straight into the arrays, bypassing the cache; on the development VM it also read a
cold 512 MiB file 3-5x faster than buffered ``pread`` (the buffered path copies every
page out of the cache and reads ahead only 128 KiB at a time).

Per platform:

- Linux and the BSDs: a second descriptor opened with ``O_DIRECT`` (through
  ``/proc/self/fd`` when there is one, so it is the same file even if the path was
  replaced since), read by :func:`aprfast._memory.pread_direct` in aligned blocks by
  one of two engines, or buffered by a third (``APRFAST_DIRECT_ENGINE``, :data:`ENGINES`):

  - ``io_uring`` (Linux with io_uring; the default for reads of 8 MiB or more: level
    with the threads in a loop, 1.15-1.35x faster in a fresh process, cold 504 MiB,
    docs/performance.md): the calling thread keeps 16 reads of 4 MiB in flight on a
    ring of its own, straight into the arrays, and takes the CRC of the completed ones
    in file order while the rest are read;
  - ``threads``: eight threads, one blocking ``pread`` in flight each, each taking the
    CRC of its own pieces (combined after).  Where no ring can be set up (no io_uring,
    ``EPERM`` under seccomp or ``kernel.io_uring_disabled``, the ``io_uring`` fallback
    forced) and for small reads, without a word;
  - ``buffered``: reads through the cache in windows of 64 MiB, each dropped after it
    is read, as where direct I/O is refused (below): for storage where buffered reads
    measure faster (a VM whose host caches the disk image can be one).
- macOS: ``F_NOCACHE`` on the second descriptor (no alignment rules), read by the
  normal parallel ``pread``.
- Windows: a second handle opened by ``CreateFileW`` with ``FILE_FLAG_NO_BUFFERING``
  (``os.open`` cannot ask for it), made a descriptor by ``msvcrt.open_osfhandle``; its
  alignment rules (sector-aligned offsets, lengths and addresses) are the ``O_DIRECT``
  ones, so the same ``pread_direct`` reads it, with ``ReadFile`` at an offset (the
  threads engine).  Checked under Wine by ``tests/windows/run.sh``, not on Windows
  itself: a refusal at open or at the first read takes the fallback below.
- Where the filesystem refuses direct I/O (``EINVAL`` at open or at the first read:
  FUSE mounts, older tmpfs) and with the ``o_direct`` fallback
  forced (``APRFAST_FALLBACKS=o_direct``): buffered reads of at most 64 MiB at a time,
  each followed by ``posix_fadvise(POSIX_FADV_DONTNEED)`` over what it read (where the
  call exists), so the cache never holds more than one window of the file.

Saves (:class:`DirectWriter`): the file's bytes are copied into aligned buffers of
2 MiB and written with ``O_DIRECT`` (``F_NOCACHE`` on macOS) while the next one fills.
The first buffer is written synchronously (a refusal falls back there); after it, on
Linux with io_uring, one call per piece copies, takes the CRC and keeps two
writes of 4 MiB in flight on a ring of the calling thread, without the GIL
(:class:`aprfast._memory.UringWriter`); elsewhere, or with ``APRFAST_DIRECT_ENGINE``
set to "threads" (or "buffered", which only reads take), two buffers are written by a
thread each.  The last partial block is written buffered and dropped after the final
``fsync``.  Where direct writes are refused (Windows, tmpfs,
FUSE, the ``o_direct`` fallback forced): buffered writes with the written range handed
to ``POSIX_FADV_DONTNEED`` one window behind the writer (:class:`DropBehind`, which
starts its writeback) and the whole file after the final ``fsync`` (which drops it,
clean by then).
"""

from __future__ import annotations

import errno
import os

from .. import _memory
from .._crc import crc32
from . import platform as _platform

__all__ = ["ALIGN", "WINDOW", "ENGINES", "ENGINE_ENV", "engine_from_env",
           "DirectReader", "open_direct", "drop_cached", "DropBehind", "DirectWriter", "WRITE_CHUNK",
           "WRITE_DEPTH", "RING_CHUNK", "RING_DEPTH", "PROBE_BYTES", "choose_backend",
           "filesystem_type", "is_network_filesystem", "available_memory", "cached_fraction", "BACKENDS"]

#: The alignment direct reads keep (file offset, length and address): every common
#: device's logical block divides it.
ALIGN = 4096
#: The buffered fallback reads and drops this much at a time; saves drop this far behind.
WINDOW = 64 << 20
#: After its last window the buffered fallback drops this much more than it read: the
#: kernel's read-ahead cached pages past the range asked for (128 KiB by default; twice
#: ``read_ahead_kb`` under sequential reads: 16 MiB on the development VM's disk, where
#: 2 MiB left 6-14 MiB of a 504 MiB file cached).
READ_AHEAD = 32 << 20
#: What ``backend=`` takes on the loaders.
BACKENDS = ("auto", "mmap", "pread", "direct")

#: The engines of reads around the page cache: "io_uring" and "threads" read with
#: ``O_DIRECT`` (csrc/pio.h apr_pread_direct_engine); "buffered" reads through the cache
#: in windows of :data:`WINDOW`, each dropped after it is read (as where direct I/O is
#: refused); "auto" (the default) is io_uring for reads of 8 MiB or more where a ring
#: can be set up, the threads otherwise.  Why "buffered" is not picked by measuring:
#: on the development VM buffered reads of a cold file were 1.7x faster than direct
#: ones in one hour and 2x slower in another.  The cause was the destination's pages:
#: a direct read into 4 KiB pages reaches the disk as requests of under 1 MiB (at most
#: ``max_segments`` pages each), into huge pages as 4 MiB ones, and which pages a load
#: got depended on how fast fresh huge pages were at that moment.  io_uring reads now
#: stage pieces bound for 4 KiB pages through huge-page buffers (csrc/uring.c), and
#: direct reads measure faster than buffered ones there (docs/performance.md, "Huge
#: pages and direct reads").  A probe of one 64 MiB window each way, tried before
#: that, was taken out: the direct rest after its buffered window ran 2-6x slower,
#: most likely because each buffered thread's page-size choice advised the whole rest
#: of the block (fixed since: apr_fresh_narrow).
ENGINES = ("auto", "io_uring", "threads", "buffered")
#: The environment variable that forces one engine (tests, benchmarks, a kernel whose
#: io_uring misbehaves): read when a file is opened or saved with ``backend="direct"``
#: (saves: "io_uring" and "auto" write on a ring, "threads" and "buffered" by threads).
ENGINE_ENV = "APRFAST_DIRECT_ENGINE"

# Filesystem types whose reads cross a network: page-faulting a map there crawls, and
# the page cache is a second copy of what the server holds.
_NETWORK_TYPES = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "lustre", "beegfs",
                  "gpfs", "afs", "ocfs2", "gfs2", "orangefs", "virtiofs"}


def open_direct(fd: int, path=None, write: bool = False):
    """A second descriptor of the file ``fd`` is open on, reading (or, with ``write``,
    writing) around the page cache, and how: ``(descriptor, "o_direct" | "nocache")``,
    or ``(None, reason)`` where the platform or the filesystem refuses (the caller
    goes through the cache and drops the pages).

    Args:
        fd: An open descriptor of a regular file.
        path: Its path, used where ``/proc/self/fd`` does not exist.
        write: Open the second descriptor write-only (:class:`DirectWriter`); on
            Windows this is refused (unbuffered writes are not used there).

    Returns:
        ``(int, str)`` or ``(None, str)``.

    Examples:
        >>> import os, tempfile
        >>> from aprfast.io.direct import open_direct
        >>> with tempfile.NamedTemporaryFile() as f:
        ...     direct, how = open_direct(f.fileno(), f.name)
        ...     if direct is not None:
        ...         os.close(direct)
        >>> how in ("o_direct", "nocache") or how.startswith("refused")
        True
    """
    if not _platform.uses("o_direct"):
        return None, "refused: the o_direct fallback is forced"
    flag = getattr(os, "O_DIRECT", 0)
    if flag:
        target = f"/proc/self/fd/{fd}"
        if not os.path.exists(target):
            target = path
        if target is None:
            return None, "refused: no path to reopen the file with O_DIRECT"
        mode = os.O_WRONLY if write else os.O_RDONLY
        try:
            return os.open(target, mode | flag | getattr(os, "O_CLOEXEC", 0)), "o_direct"
        except OSError as exc:
            return None, f"refused: O_DIRECT open failed ({exc.strerror or exc})"
    if os.name == "nt":
        if write:
            return None, "refused: unbuffered writes are not used on Windows"
        return _open_no_buffering(path)
    try:
        import fcntl
    except ImportError:
        return None, "refused: no direct I/O through os.open on this platform"
    nocache = getattr(fcntl, "F_NOCACHE", None)
    if nocache is None:
        return None, "refused: neither O_DIRECT nor F_NOCACHE on this platform"
    # F_NOCACHE belongs to the open file, which a dup shares with the caller: reopen
    if path is None:
        return None, "refused: no path to reopen the file with F_NOCACHE"
    reopened = None
    try:
        reopened = os.open(path, os.O_WRONLY if write else os.O_RDONLY)
        fcntl.fcntl(reopened, nocache, 1)
    except OSError as exc:
        if reopened is not None:
            os.close(reopened)
        return None, f"refused: F_NOCACHE failed ({exc.strerror or exc})"
    return reopened, "nocache"


def engine_from_env() -> str:
    """The direct I/O engine :data:`ENGINE_ENV` names, "auto" when it is unset or empty.

    Raises:
        ValueError: The variable names no engine of :data:`ENGINES`.

    Examples:
        >>> from aprfast.io.direct import ENGINES, engine_from_env
        >>> engine_from_env() in ENGINES
        True
    """
    value = os.environ.get(ENGINE_ENV, "").strip().lower() or "auto"
    if value not in ENGINES:
        raise ValueError(f"{ENGINE_ENV}={value!r}: no such direct-read engine; known: {', '.join(ENGINES)}")
    return value


def _open_no_buffering(path):
    """Windows: ``(descriptor, "o_direct")`` of ``path`` opened with
    ``FILE_FLAG_NO_BUFFERING``, or ``(None, reason)``."""
    if path is None:
        return None, "refused: no path to reopen the file with FILE_FLAG_NO_BUFFERING"
    import ctypes
    import msvcrt
    from ctypes import wintypes

    generic_read, share_all, open_existing = 0x80000000, 0x7, 3
    no_buffering, sequential_scan = 0x20000000, 0x08000000
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    create = kernel32.CreateFileW
    create.restype = wintypes.HANDLE
    create.argtypes = [wintypes.LPCWSTR, wintypes.DWORD, wintypes.DWORD, ctypes.c_void_p,
                       wintypes.DWORD, wintypes.DWORD, wintypes.HANDLE]
    handle = create(os.fspath(path), generic_read, share_all, None, open_existing,
                    no_buffering | sequential_scan, None)
    if handle is None or handle == ctypes.c_void_p(-1).value:
        return None, f"refused: FILE_FLAG_NO_BUFFERING open failed (Win32 error {ctypes.get_last_error()})"
    try:
        return msvcrt.open_osfhandle(handle, os.O_RDONLY | getattr(os, "O_BINARY", 0)), "o_direct"
    except OSError as exc:
        kernel32.CloseHandle(ctypes.c_void_p(handle))
        return None, f"refused: no descriptor for the unbuffered handle ({exc.strerror or exc})"


def drop_cached(fd: int, offset: int = 0, n: int = 0) -> bool:
    """Ask the kernel to drop the clean cached pages of ``[offset, offset + n)`` of
    ``fd`` (``n=0``: to the end) and start the writeback of dirty ones: True when the
    advice was given (``posix_fadvise`` exists), False elsewhere.

    Examples:
        >>> import tempfile
        >>> from aprfast.io.direct import drop_cached
        >>> with tempfile.TemporaryFile() as f:
        ...     drop_cached(f.fileno()) in (True, False)
        True
    """
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return False
    try:
        advise(fd, offset, n, os.POSIX_FADV_DONTNEED)
    except OSError:
        return False
    return True


class DirectReader:
    """Reads of one file around the page cache (see the module's docstring).

    ``fd`` is the file's ordinary descriptor (kept by the caller); a second descriptor
    is opened for the direct reads and closed by :meth:`close`.  ``engine`` (one of
    :data:`ENGINES`; None: :func:`engine_from_env`) picks how ``O_DIRECT`` reads are
    made.  Safe from several threads at once.
    """

    def __init__(self, fd: int, path=None, engine: str | None = None):
        self.engine = engine_from_env() if engine is None else engine
        if self.engine not in ENGINES:
            raise ValueError(f"no direct-read engine {self.engine!r}; known: {', '.join(ENGINES)}")
        self._fd = fd
        self.path = path
        self._direct, self.how = open_direct(fd, path)

    @property
    def direct(self) -> bool:
        """True while reads bypass the page cache (not the buffered fallback)."""
        return self._direct is not None

    def readinto(self, offset: int, out: memoryview, threads: int, crc):
        """Fill ``out`` (a flat byte view) from ``offset``; the running CRC if ``crc``."""
        if self._direct is not None and self.how == "o_direct" and self.engine == "buffered":
            return self._buffered(offset, out, threads, crc)
        return self._read(offset, out, threads, crc)

    def _read(self, offset, out, threads, crc):
        direct = self._direct
        if direct is not None:  # small reads (header, index) too: a buffered one reads ahead
            try:
                if self.how == "o_direct":
                    engine = self.engine if self.engine in _memory.DIRECT_ENGINES else "auto"
                    return _memory.pread_direct(direct, offset, out, threads, crc, ALIGN, engine)
                return _memory.pread_into(direct, offset, out, threads, crc)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                # accepted at open, refused at read (some FUSE and overlay mounts): read
                # buffered from now on, from the start of this request
                self._refused(f"refused: direct read failed ({exc.strerror})")
        return self._buffered(offset, out, threads, crc)

    def _buffered(self, offset, out, threads, crc):
        done, n = 0, out.nbytes
        while True:
            step = min(WINDOW, n - done)
            crc = _memory.pread_into(self._fd, offset + done, out[done:done + step], threads, crc)
            last = done + step >= n
            # what was read; after the last window also what the kernel read ahead past it
            # (the next window's read-ahead is that window's first bytes: kept until read)
            drop_cached(self._fd, offset + done, step + (READ_AHEAD if last else 0))
            done += step
            if last:
                return crc

    def _refused(self, why: str) -> None:
        direct, self._direct, self.how = self._direct, None, why
        _close_quietly(direct)

    def close(self) -> None:
        """Close the second descriptor (idempotent)."""
        direct, self._direct = self._direct, None
        if direct is not None:
            os.close(direct)


class DropBehind:
    """Keeps a file being written out of the page cache: :meth:`wrote` after each write
    (the bytes written so far), :meth:`finish` after the final ``fsync``.

    Each window of :data:`WINDOW` bytes is advised ``POSIX_FADV_DONTNEED`` once the
    writer is a window past its end (the advice starts its writeback) and again two
    windows past it (by then written back and clean, so the advice drops it): the cache
    holds about four windows of the file while it is written, and nothing of it after
    :meth:`finish`.

    Examples:
        >>> import os, tempfile
        >>> from aprfast.io.direct import DropBehind
        >>> with tempfile.TemporaryFile() as f:
        ...     behind = DropBehind(f.fileno())
        ...     behind.wrote(os.write(f.fileno(), b"x" * 100))
        ...     os.fsync(f.fileno())
        ...     behind.finish()
    """

    def __init__(self, fd: int, window: int = WINDOW):
        self._fd = fd
        self._window = window
        self._written = 0
        self._kicked = 0    # advised once (writeback started) up to here
        self._dropped = 0   # advised twice up to here

    def wrote(self, n: int) -> None:
        """Count ``n`` more bytes written; advise the windows now behind the writer."""
        self._written += n
        w = self._window
        while self._written - self._kicked >= 2 * w:
            drop_cached(self._fd, self._kicked, w)
            self._kicked += w
            if self._kicked - self._dropped >= 2 * w:
                drop_cached(self._fd, self._dropped, w)
                self._dropped += w

    def finish(self) -> None:
        """After ``fsync``: drop the whole file's pages (all clean now)."""
        drop_cached(self._fd, 0, 0)


#: A direct write moves this much at a time, from one of :data:`WRITE_DEPTH` reused
#: aligned buffers (measured on the development VM, docs/performance.md "Durable save").
WRITE_CHUNK = 2 << 20
#: Direct writes in flight (each on a thread of its own, blocked in ``pwrite``).
WRITE_DEPTH = 2
#: The ring that takes the writes over where io_uring is there keeps this many writes
#: of :data:`RING_CHUNK` bytes in flight, from the staging buffers direct reads keep
#: (16 MiB for the process, all of it; the ring populates them as it fills them, once).
#: Why 2 x 8 MiB: a write that makes the file longer is one request at a time on ext4
#: (the inode's lock, and the write waited for), and the disk's ``max_sectors_kb`` of
#: 4 MiB splits an 8 MiB write into two requests in flight together.  In the loop of
#: docs/performance.md "durable saves with 8 MiB writes and a fill helper" (stop 39), per-round
#: ratios to fio, 4 GiB: 2 x 8 MiB 0.95-0.98, 2 x 4 MiB 0.86-0.87, 4 x 4 MiB 0.87;
#: 504 MiB: 0.90 against 0.78.
RING_DEPTH = 2
RING_CHUNK = 8 << 20
#: Where the ring is to take over, the first direct write (the one that proves direct
#: writes work, made synchronously so that a refusal can still fall back) is this large,
#: from buffers in 4 KiB pages.
PROBE_BYTES = 64 << 10


def _huge_page_buffer(nbytes: int):
    """Anonymous memory for direct writes: ``(map, view of nbytes)``, the view page-aligned
    (as ``O_DIRECT`` asks) and, where the platform has ``MADV_HUGEPAGE``, private, huge
    pages advised and on a 2 MiB boundary.

    Why: a direct request holds at most ``max_segments`` of the source's pages, so from
    4 KiB pages (a shared anonymous map is shmem, which gets none) the development VM's
    disk took requests under 1 MiB, and fio's direct write from huge pages was 1.4x
    faster than from its own 4 KiB ones (docs/performance.md, "Huge pages and direct
    reads").
    """
    import mmap

    private, anonymous = getattr(mmap, "MAP_PRIVATE", None), getattr(mmap, "MAP_ANONYMOUS", None)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if private is None or anonymous is None or advice is None:
        memory = mmap.mmap(-1, nbytes)
        return memory, memoryview(memory)
    huge = 2 << 20
    memory = mmap.mmap(-1, nbytes + huge, flags=private | anonymous)
    try:
        memory.madvise(advice)
    except OSError:
        pass  # advisory: 4 KiB pages still work
    import numpy as np

    skip = -np.frombuffer(memory, np.uint8, count=1).ctypes.data % huge
    return memory, memoryview(memory)[skip:skip + nbytes]


class DirectWriter:
    """Writes a file from its start to its end around the page cache
    (``save_file(..., backend="direct")``): every byte handed to :meth:`write` is copied
    into one of :data:`WRITE_DEPTH` reused, page-aligned buffers of :data:`WRITE_CHUNK`
    bytes, and each full buffer is written by a thread of its own with ``O_DIRECT``
    (``F_NOCACHE`` on macOS) while the caller fills the next.  Once the first buffer is
    written (so a refusal still falls back), the writes go to an io_uring ring where
    one can be set up and the engine allows (:attr:`engine` says which): the copy, the
    CRC and the submissions then run in C without the GIL, :data:`RING_DEPTH` writes
    of :data:`RING_CHUNK` bytes in flight.

    Why: a buffered save copies the file into the page cache and the kernel writes it
    back after; with the cache dropped behind the writer (:class:`DropBehind`, what
    this replaced) a durable 504 MiB save took 2.7x fio's direct write of the same
    bytes, since the writeback only started a window behind and every page was still
    allocated, copied and freed.  Direct writes leave the cache as it was, and the
    copy into warm buffers overlaps the device's writes.

    The tail that does not fill a whole :data:`ALIGN` block is written through the
    ordinary descriptor (buffered), so the file never grows past its size; the caller
    syncs and then :meth:`finish` drops those pages.  Where the platform or the
    filesystem refuses direct writes (at open, or ``EINVAL`` at the first write: tmpfs,
    FUSE), every write is buffered and dropped behind the writer instead, without a
    word: :attr:`how` says which.

    Not thread-safe: one writer feeds it.  Errors of the writing threads are raised by
    the next :meth:`write` or by :meth:`flush`.

    Args:
        fd: The file's ordinary descriptor, opened for writing (kept by the caller).
        path: Its path, used where ``/proc/self/fd`` does not exist.
        start: The file offset of the first byte written.
        chunk: Bytes per direct write of the thread engine (a multiple of
            :data:`ALIGN`); where the ring is to take over, the first write is
            :data:`PROBE_BYTES` instead.
        depth: Buffers of the thread engine (writes in flight).
        ring_chunk: Bytes per write on the ring (a power of two, at least :data:`ALIGN`).
        ring_depth: Writes in flight on the ring (1 to 64).
        ring_helper: Whether a second thread fills half of each of the ring's buffers
            (its CRC and its copy) beside the calling thread: None (the default) where
            a second processor is idle when the ring starts.
        engine: "auto" or "io_uring" (the ring where there is one), "threads" or
            "buffered" (the threads); None: :func:`engine_from_env`.

    Raises:
        ValueError: A chunk that is not a positive multiple of :data:`ALIGN`, a depth
            under 1, a ring chunk or depth out of range, or an unknown engine.

    Examples:
        >>> import os, tempfile
        >>> from aprfast.io.direct import DirectWriter
        >>> with tempfile.NamedTemporaryFile() as f:
        ...     w = DirectWriter(f.fileno(), f.name)
        ...     w.write(b"x" * 10000)
        ...     w.flush()
        ...     os.fsync(f.fileno())
        ...     w.finish()
        ...     os.path.getsize(f.name)
        10000
    """

    def __init__(self, fd: int, path=None, start: int = 0, chunk: int = WRITE_CHUNK, depth: int = WRITE_DEPTH,
                 engine: str | None = None, ring_chunk: int = RING_CHUNK, ring_depth: int = RING_DEPTH,
                 ring_helper: bool | None = None):
        if chunk <= 0 or chunk % ALIGN or depth < 1:
            raise ValueError(f"chunk must be a positive multiple of {ALIGN} and depth at least 1")
        if ring_chunk < ALIGN or ring_chunk & (ring_chunk - 1) or not 1 <= ring_depth <= 64:
            raise ValueError(f"ring_chunk must be a power of two of at least {ALIGN}, ring_depth 1 to 64")
        self._ring_chunk, self._ring_depth, self._ring_helper = ring_chunk, ring_depth, ring_helper
        engine = engine_from_env() if engine is None else engine
        if engine not in ENGINES:
            raise ValueError(f"no direct engine {engine!r}; known: {', '.join(ENGINES)}")
        #: "threads" until the ring takes the writes over ("io_uring"; see :meth:`write`)
        self.engine = "threads"
        self._ring = None
        # the ring takes over after the first write proved direct writes work (the pure
        # backend's UringWriter refuses: the threads go on)
        self._ring_wanted = engine in ("auto", "io_uring")
        self._fd = fd
        self._offset = start      # the file offset of the buffer being filled
        self._fill = 0            # bytes in it
        self._behind = DropBehind(fd)
        self._direct, self.how = open_direct(fd, path, write=True)
        self._chunk = self._thread_chunk = chunk
        self._buffers = self._pending = self._pool = self._memory = None
        self._current = 0
        self._proven = False      # a direct write succeeded: later refusals are errors
        self._closed = False      # flushed or closed: no more writes
        if self._direct is not None and self.how == "o_direct" and start % ALIGN:
            self._refused("refused: the first byte is not block-aligned")
        self._depth = depth
        if self._direct is not None:
            if self._ring_wanted:
                self._probe_buffers()
            else:
                self._thread_buffers()

    def _probe_buffers(self) -> None:
        """Two :data:`PROBE_BYTES` buffers in 4 KiB pages for the first write, the one
        that proves direct writes work before the ring takes over; the threads' buffers
        are made only if the ring then cannot start (no io_uring, the pure backend).  Why: the first write came from a
        fresh 2 MiB huge page of the threads' buffers, populated on every save, which
        took 0.2-6.7 ms before a byte was written (more where the host took the memory
        back), against about 0.2 ms for the whole 504 MiB save's other set-up."""
        import mmap

        try:
            self._memory = mmap.mmap(-1, 2 * PROBE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except OSError as exc:
            self._refused(f"refused: no aligned buffers ({exc})")
            return
        view = memoryview(self._memory)
        self._buffers = [view[:PROBE_BYTES], view[PROBE_BYTES:]]
        self._pending = [None, None]
        self._chunk = PROBE_BYTES

    def _thread_buffers(self) -> None:
        """The thread engine's buffers (huge pages) and threads."""
        from concurrent.futures import ThreadPoolExecutor

        chunk, depth = self._thread_chunk, self._depth
        try:
            self._memory, view = _huge_page_buffer(chunk * depth)
        except (OSError, ValueError) as exc:
            self._refused(f"refused: no aligned buffers ({exc})")
            return
        self._buffers = [view[i * chunk:(i + 1) * chunk] for i in range(depth)]
        self._pending = [None] * depth
        self._pool = ThreadPoolExecutor(depth, thread_name_prefix="aprfast-direct-write")
        self._chunk, self._current = chunk, 0

    @property
    def chunk(self) -> int:
        """Bytes each direct write of the thread engine moves (the size of each of its
        buffers; the first write, before the ring takes over, is smaller)."""
        return self._thread_chunk

    @property
    def direct(self) -> bool:
        """True while writes bypass the page cache (not the buffered fallback)."""
        return self._direct is not None

    def write(self, data, crc: int | None = None) -> int | None:
        """Append the bytes of ``data`` (any C-contiguous buffer).

        Args:
            data: The bytes.
            crc: A running CRC-32 (``zlib.crc32`` semantics) to continue over them, taken
                one buffer at a time just before each copy (None: none).

        Returns:
            The CRC continued over ``data``, or None when ``crc`` is None.

        Raises:
            ValueError: After :meth:`flush` (its tail left the file unaligned for
                direct writes) or :meth:`close`.
            OSError: A write failed (this one, or one in flight since an earlier call).
        """
        if self._closed:
            raise ValueError("DirectWriter: write after flush or close")
        view = memoryview(data)
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B") if view.nbytes else memoryview(b"")
        if self._ring is not None:
            return self._ring.write(view, crc)
        if self._direct is None:
            if crc is not None:
                crc = crc32(view, crc)
            self._write_buffered(view, self._offset + self._fill)
            self._fill += len(view)
            return crc
        chunk = self._chunk
        while len(view):
            n = min(len(view), chunk - self._fill)
            buffer = self._buffers[self._current]
            if crc is not None:
                crc = crc32(view[:n], crc)
            if n >= 1 << 20:  # the GIL released, for the writing threads' sake
                _memory.copy_into(buffer[self._fill:self._fill + n], view[:n], 1)
            else:
                buffer[self._fill:self._fill + n] = view[:n]
            self._fill += n
            view = view[n:]
            if self._fill == chunk:
                self._submit(chunk)
                if self._direct is None:  # refused at the first write: the rest is buffered
                    return self.write(view, crc)
                if self._ring_wanted:
                    if not self._take_ring() and self._pool is None:
                        self._thread_buffers()  # no ring after all: the threads, with their own buffers
                        if self._direct is None:
                            return self.write(view, crc)
                    return self.write(view, crc)
        return crc

    def flush(self) -> None:
        """Write what the buffers hold and wait for every write in flight; after it the
        file holds every byte given to :meth:`write`, and nothing more may be written."""
        self._closed = True
        if self._ring is not None:
            tail, self._offset = self._ring.flush(ALIGN)
            self._fill = 0
            if tail:
                self._write_buffered(memoryview(tail), self._offset)
                self._offset += len(tail)
            return
        if self._direct is None:
            return
        whole = self._fill - self._fill % ALIGN if self.how == "o_direct" else self._fill
        tail = self._fill - whole
        if whole:
            self._submit(whole, keep=tail)
            if self._direct is None:  # refused at the first write: written buffered already
                return
        self._wait_all()
        if tail:
            buffer = self._buffers[self._current]
            self._write_buffered(buffer[:tail], self._offset)
            self._offset += tail
            self._fill = 0

    def finish(self) -> None:
        """After the caller's ``fsync``: drop the file's cached pages (the buffered tail,
        or all of a buffered fallback) and release the threads and buffers."""
        self._behind.finish()
        self.close()

    def close(self) -> None:
        """Wait for the writes in flight (their errors ignored) and release everything
        (idempotent); for the path of an error."""
        self._closed = True
        self._release()

    # --- internals -----------------------------------------------------------------
    def _release(self) -> None:
        """Wait for the writes in flight, free the threads and buffers, close the
        direct descriptor: later writes are buffered."""
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        # the map is unmapped once the last view of it is gone (a caller's frame may hold one)
        self._pending = self._buffers = self._memory = None
        self._refused(self.how)

    def _submit(self, n: int, keep: int = 0) -> None:
        """Write the first n bytes of the current buffer at self._offset; move the
        ``keep`` bytes after them to the start of the next buffer."""
        index, buffer, offset = self._current, self._buffers[self._current], self._offset
        if not self._proven:  # the first write: synchronously, so a refusal falls back here
            try:
                _pwrite_all(self._direct, buffer[:n], offset)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                self._refused(f"refused: direct write failed ({exc.strerror})")
                self._write_buffered(buffer[:n + keep], offset)
                self._offset += n + keep
                self._fill = 0
                self._release()
                return
            self._proven = True
        else:
            self._pending[index] = self._pool.submit(_pwrite_all, self._direct, buffer[:n], offset)
        self._offset += n
        nxt = (index + 1) % len(self._buffers)
        self._wait(nxt)
        if keep:
            self._buffers[nxt][:keep] = buffer[n:n + keep]
        self._current, self._fill = nxt, keep

    def _take_ring(self) -> bool:
        """Hand the writes from here on to an io_uring ring (its own buffers); False
        where none can be set up (the threads go on)."""
        self._ring_wanted = False
        try:
            self._ring = _memory.UringWriter(self._direct, self._offset, self._ring_chunk, self._ring_depth,
                                             self._ring_helper)
        except (NotImplementedError, ValueError, OSError):
            return False
        self.engine = "io_uring"
        return True

    def _wait(self, index: int) -> None:
        future, self._pending[index] = self._pending[index], None
        if future is not None:
            future.result()

    def _wait_all(self) -> None:
        error = None
        for i in range(len(self._pending)):
            try:
                self._wait(i)
            except OSError as exc:
                error = error or exc
        if error is not None:
            raise error

    def _write_buffered(self, view, offset: int) -> None:
        _pwrite_all(self._fd, view, offset)
        self._behind.wrote(len(view))

    def _refused(self, why: str) -> None:
        direct, self._direct, self.how = self._direct, None, why
        _close_quietly(direct)


def _close_quietly(fd) -> None:
    """Close a second descriptor given up on (None: nothing); its error is of no use."""
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def _pwrite_all(fd: int, view, offset: int) -> None:
    """pwrite until every byte of ``view`` is at ``offset`` (short writes resumed)."""
    while len(view):
        n = _platform.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.EIO, f"pwrite wrote {n} bytes")
        view, offset = view[n:], offset + n


# --- what backend="auto" picks ------------------------------------------------------
def filesystem_type(path) -> str | None:
    """The type of the filesystem holding ``path`` ("ext4", "nfs4", "fuse.s3fs", ...)
    from ``/proc/self/mountinfo``, or None where that cannot be read (not Linux).

    Examples:
        >>> from aprfast.io.direct import filesystem_type
        >>> filesystem_type("/") is None or isinstance(filesystem_type("/"), str)
        True
    """
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    where = os.path.realpath(os.fspath(path))
    best, kind = -1, None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5:
            continue
        mount = fields[4].replace("\\040", " ")
        if (where == mount or where.startswith(mount.rstrip("/") + "/")) and len(mount) > best:
            best, kind = len(mount), right.split()[0] if right.split() else None
    return kind


def is_network_filesystem(path) -> bool:
    """True when ``path`` is on a network filesystem (NFS, SMB, 9p, Ceph, Lustre, a FUSE
    mount of object storage, ...) by its mount's type."""
    kind = filesystem_type(path)
    if kind is None:
        return False
    return kind in _NETWORK_TYPES or kind.startswith("fuse.") and kind not in ("fuse.portal",)


def available_memory() -> int | None:
    """``MemAvailable`` from ``/proc/meminfo`` in bytes, or None where there is none."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def cached_fraction(fd: int, size: int, samples: int = 32) -> float | None:
    """The fraction of ``samples`` pages spread over the file that are in the page cache
    (mincore on a map of it), or None where that cannot be told (Windows, the pure
    backend)."""
    sample = getattr(_memory, "page_cache_sample", None)
    if sample is None or size <= 0:
        return None
    got = sample(fd, size, samples)
    return None if got is None else got / samples


#: Below this size an owned load stays buffered: at most a few milliseconds either way.
AUTO_MIN = 64 << 20
#: A file larger than this fraction of the available memory is read direct: loaded
#: through the cache it would hold the model twice and push other pages out.
AUTO_MEMORY_FRACTION = 0.5
#: Read direct when fewer than this fraction of the sampled pages are cached.
AUTO_CACHED_BELOW = 0.5


def choose_backend(fd: int, size: int, path=None) -> tuple:
    """``backend="auto"`` for an owned (eager) load: ``("direct", why)`` or
    ``("pread", why)``.

    Direct I/O where it measured faster or saves a copy of the model: a network
    filesystem, or a file of at least 64 MiB mostly not in the page cache (mincore
    sample; 504 MiB cold: direct 0.15 s, buffered pread 0.5-1.3 s on the development
    VM, docs/performance.md), or, where the cache cannot be sampled, larger than half
    the available memory.  A file mostly in the cache reads faster buffered (a copy from
    memory) whatever the free memory: the cache already holds the second copy, and a
    direct read would go to the disk for it (a forced direct load of a cached 4 GiB file
    took 1.7-2.6 s against 0.48-1.02 s buffered, medians of three runs,
    docs/performance.md, stop 40).  A file larger than half the available memory and
    mostly not cached is read direct, so that it does not push the rest of the cache
    out.

    Examples:
        >>> import tempfile
        >>> from aprfast.io.direct import choose_backend
        >>> with tempfile.TemporaryFile() as f:
        ...     choose_backend(f.fileno(), 10)
        ('pread', 'smaller than 64 MiB')
    """
    if size < AUTO_MIN:
        return "pread", "smaller than 64 MiB"
    if path is not None and is_network_filesystem(path):
        return "direct", f"on a network filesystem ({filesystem_type(path)})"
    cached = cached_fraction(fd, size)
    if cached is not None and cached >= AUTO_CACHED_BELOW:
        return "pread", "in the page cache"
    free = available_memory()
    if free is not None and size > AUTO_MEMORY_FRACTION * free:
        return "direct", f"larger than half the available memory ({free >> 20} MiB)"
    if cached is not None:
        return "direct", f"{cached:.0%} of the sampled pages in the page cache"
    return "pread", "page cache state unknown"
