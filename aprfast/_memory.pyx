# cython: language_level=3, boundscheck=False, wraparound=False, freethreading_compatible=True
"""Aligned buffers and bulk I/O for tensor data, GIL released.

``AlignedBuffer`` owns memory whose start is aligned to a power of two (64 bytes by
default; large buffers are huge-page backed).  ``pread_into`` fills a buffer from a
file descriptor with several threads, checksumming as it reads; ``copy_into`` is a
parallel memcpy.
"""

from cpython.buffer cimport (PyBUF_ANY_CONTIGUOUS, PyBUF_SIMPLE, PyBuffer_IsContiguous, PyBuffer_Release,
                             PyObject_GetBuffer)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.bytearray cimport (PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_GET_SIZE,
                               PyByteArray_Resize)
from cpython.pythread cimport (WAIT_LOCK, PyThread_acquire_lock, PyThread_allocate_lock, PyThread_free_lock,
                               PyThread_release_lock, PyThread_type_lock)
from libc.errno cimport EINVAL
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

cimport cython

import array
import os

cdef extern from "buffers.h" nogil:
    ctypedef struct apr_block:
        uint8_t *ptr
        void *base
        size_t mapped
        size_t capacity
    ctypedef struct apr_cache_stats:
        size_t blocks
        size_t bytes
        size_t resident
        size_t limit
        size_t heap_bytes
        size_t heap_limit
        uint64_t hits
        uint64_t misses
        size_t deferred
        long long decay_ms
    int apr_block_alloc(apr_block *block, size_t size, size_t alignment)
    int apr_block_alloc_deferred(apr_block *block, size_t size, size_t alignment)
    void apr_block_free(apr_block *block)
    void apr_cache_stats_get(apr_cache_stats *out)
    void apr_cache_release(long long limit, long long heap)
    void apr_cache_set_decay(long long ms)
    int apr_huge_pages_state()
    int apr_fresh_replay(const long long *ns, size_t n, size_t step, long long slow_ns, unsigned char *huge_out)
    void apr_fresh_stats(unsigned long long *out, int reset)
    long long APR_HUGE_SLOW_DIRECT_NS
    void apr_advise_huge(void *ptr, size_t len)
    size_t APR_CACHE_MIN
    size_t APR_CACHE_RESIDENT

cdef extern from "pio.h" nogil:
    int apr_pread_exact(int fd, uint8_t *dst, uint64_t offset, size_t len, int nthreads, uint32_t *crc)
    int apr_pread_some(int fd, uint8_t *dst, uint64_t offset, size_t len, size_t *got)
    ctypedef struct apr_pread_job:
        pass
    apr_pread_job *apr_pread_start(int fd, uint8_t *dst, uint64_t offset, size_t len, int nthreads,
                                   const uint32_t *crc)
    int apr_pread_finish(apr_pread_job *job, uint32_t *crc)
    void apr_copy(uint8_t *dst, const uint8_t *src, size_t len, int nthreads)
    int apr_default_threads()
    int apr_preallocate(int fd, uint64_t size)
    int apr_pread_direct(int fd, uint8_t *dst, uint64_t offset, size_t len, int nthreads, uint32_t *crc,
                         size_t align)
    int apr_pread_direct_engine(int fd, uint8_t *dst, uint64_t offset, size_t len, int nthreads, uint32_t *crc,
                                size_t align, int engine, unsigned depth, size_t chunk)
    int apr_direct_engine_last()
    int apr_page_cache_sample(int fd, uint64_t size, int samples)
    int APR_ENGINE_AUTO, APR_ENGINE_URING, APR_ENGINE_THREADS

cdef extern from "uring.h" nogil:
    ctypedef struct apr_uring_writer:
        pass
    apr_uring_writer *apr_uring_writer_open(int fd, uint64_t offset, size_t chunk, unsigned depth, int helper,
                                            int *err)
    int apr_uring_writer_write(apr_uring_writer *w, const uint8_t *src, size_t len, uint32_t *crc)
    int apr_uring_writer_flush(apr_uring_writer *w, size_t align, const uint8_t **tail, size_t *tail_len,
                               uint64_t *tail_offset)
    void apr_uring_writer_close(apr_uring_writer *w)
    uint64_t apr_uring_writer_written(const apr_uring_writer *w)
    int APR_URING_UNAVAILABLE
    int apr_uring_available()
    int apr_uring_set_staging(int mode)
    int apr_uring_stages_every_piece(int fd)
    size_t apr_uring_staged_last()
    int APR_STAGE_AUTO, APR_STAGE_ALWAYS, APR_STAGE_NEVER, APR_STAGE_RING

cdef extern from "fallbacks.h" nogil:
    void apr_set_fallbacks(unsigned int flags)
    unsigned int apr_fallbacks()
    unsigned int APR_FALLBACK_PREAD, APR_FALLBACK_FALLOCATE, APR_FALLBACK_MADVISE, APR_FALLBACK_URING

cdef extern from "lz4block.h" nogil:
    int apr_lz4_block_decode(const uint8_t *src, size_t srclen, uint8_t *dst, size_t dstlen, size_t *where)
    unsigned APR_LZ4_MAX_RATIO
    unsigned APR_LZ4_SLACK

cdef size_t NOGIL_MIN = 65536

cdef extern from "Python.h":
    const Py_ssize_t PY_SSIZE_T_MAX


cdef class AlignedBuffer:
    """A writable byte buffer whose first byte is aligned to ``alignment``.

    ``filled_by_read=True``: the caller fills the whole buffer with one ``pread_into``
    next, so a freshly mapped buffer is populated by that read, a huge page ahead of
    it, rather than all at once here (csrc/buffers.h apr_block_alloc_deferred)."""

    cdef apr_block block
    cdef readonly size_t size
    cdef readonly size_t alignment
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __cinit__(self, size_t size, size_t alignment=64, *, bint filled_by_read=False):
        if alignment == 0 or (alignment & (alignment - 1)) or alignment > 4096:
            raise ValueError(f"alignment must be a power of two up to 4096, not {alignment}")
        if size > <size_t>PY_SSIZE_T_MAX:
            raise MemoryError(f"cannot allocate {size} bytes: more than a buffer can address")
        cdef int rc
        with nogil:
            if filled_by_read:
                rc = apr_block_alloc_deferred(&self.block, size, alignment)
            else:
                rc = apr_block_alloc(&self.block, size, alignment)
        if rc:
            raise MemoryError(f"cannot allocate {size} bytes aligned to {alignment} ({os.strerror(rc)})")
        self.size = size
        self.alignment = alignment
        self.shape[0] = size
        self.strides[0] = 1

    def __dealloc__(self):
        apr_block_free(&self.block)

    def __getbuffer__(self, Py_buffer *buf, int flags):
        buf.buf = self.block.ptr
        buf.obj = self
        buf.len = self.size
        buf.readonly = 0
        buf.itemsize = 1
        buf.format = "B"
        buf.ndim = 1
        buf.shape = self.shape
        buf.strides = self.strides
        buf.suboffsets = NULL
        buf.internal = NULL

    def __releasebuffer__(self, Py_buffer *buf):
        pass

    def __len__(self):
        return self.size

    @property
    def address(self):
        """The start address (for alignment checks)."""
        return <size_t>self.block.ptr

    @property
    def huge_page_backed(self):
        """True when the buffer was mapped on a 2 MiB boundary (huge pages advised unless
        fresh huge pages proved slow in this process: see huge_pages_state)."""
        return self.block.mapped != 0


#: Freed AlignedBuffers of at least this many bytes are kept for reuse (buffers.h).
BUFFER_CACHE_MIN = APR_CACHE_MIN
BUFFER_CACHE_RESIDENT = APR_CACHE_RESIDENT


def buffer_cache_stats():
    """The cache of freed buffers: blocks and bytes held, the bytes of those kept resident
    (not given MADV_FREE), the cap, the bytes in heap blocks (below 32 MiB) and their own
    cap, hits and misses, the resident bytes whose advice is deferred and for how long
    (``decay_ms``, csrc/buffers.h)."""
    cdef apr_cache_stats st
    apr_cache_stats_get(&st)
    return {"blocks": st.blocks, "bytes": st.bytes, "resident": st.resident, "limit": st.limit,
            "heap_bytes": st.heap_bytes, "heap_limit": st.heap_limit,
            "hits": st.hits, "misses": st.misses, "deferred": st.deferred, "decay_ms": st.decay_ms}


def set_buffer_decay(ms):
    """How long (milliseconds) a freed block the cache keeps stays resident before its
    pages are given back with MADV_FREE; 0 gives them back as it is freed.  The default
    is APRFAST_BUFFER_DECAY_MS or 10,000 (csrc/buffers.h says why)."""
    if ms < 0:
        raise ValueError("the buffer decay is a number of milliseconds >= 0")
    apr_cache_set_decay(ms)


def huge_pages_state():
    """Whether large buffers get huge pages in this process: "untried", "huge", or
    "small" when a fresh huge page proved slow (buffers.c says why)."""
    return {-1: "untried", 0: "huge", 1: "small"}[apr_huge_pages_state()]


#: The slow mark of a huge page in a direct read's destination, in ns (csrc/buffers.h).
HUGE_SLOW_DIRECT_NS = APR_HUGE_SLOW_DIRECT_NS


def huge_page_choices(step_ns, size_t step=2 << 20, long long slow_ns=0):
    """The page sizes csrc/buffers.c would choose for the steps of a fresh block, given
    how long each step took to populate: a list of booleans (True: huge pages), one per
    step, from the block's start.  For tests of the choice (apr_fresh_record), which is
    otherwise driven by real timings.

    Args:
        step_ns: Nanoseconds each step took (an iterable of ints).
        step: Bytes per step (2 MiB, as the reads populate).
        slow_ns: The slow mark per huge page (0: the default; HUGE_SLOW_DIRECT_NS for
            direct reads).

    Raises:
        ValueError: ``step`` is 0.
        OSError: this platform makes no page-size choice.

    Examples:
        >>> from aprfast import _memory
        >>> _memory.huge_page_choices([100_000] * 3)  # doctest: +SKIP
        [True, True, True]
    """
    cdef list values = [int(v) for v in step_ns]
    cdef Py_ssize_t n = len(values), i
    if step == 0:
        raise ValueError("huge_page_choices: step must be at least one byte")
    cdef long long[::1] ns = array.array("q", values) if n else array.array("q", [0])
    cdef unsigned char[::1] out = bytearray(max(n, 1))
    if apr_fresh_replay(&ns[0], <size_t>n, step, slow_ns, &out[0]) != 0:
        raise OSError("huge_page_choices: no page-size choice is made on this platform")
    return [bool(out[i]) for i in range(n)]


def fresh_population(bint reset=False):
    """What populating fresh destinations (the arrays of eager and direct loads) has
    cost this process so far, by page size: a dict with ``huge_bytes``,
    ``huge_seconds``, ``small_bytes`` and ``small_seconds`` (4 KiB pages), the seconds
    summed over the populating threads.  All zero where nothing is populated ahead
    (pages then fault in as they are written).

    Args:
        reset: Start counting again from zero after reading.

    Examples:
        >>> from aprfast import _memory
        >>> sorted(_memory.fresh_population())
        ['huge_bytes', 'huge_seconds', 'small_bytes', 'small_seconds']
    """
    cdef unsigned long long out[4]
    apr_fresh_stats(out, reset)
    return {"huge_bytes": out[0], "huge_seconds": out[1] / 1e9, "small_bytes": out[2], "small_seconds": out[3] / 1e9}


def release_buffer_cache(limit=None, heap_limit=None):
    """Give every cached block back to the system; ``limit`` (bytes) sets a new cap
    (0 turns the cache off), ``heap_limit`` a new cap on the heap blocks among them
    (those below 32 MiB; the smaller of the two caps holds for them).

    Raises:
        ValueError: a cap is negative.

    Examples:
        >>> from aprfast import _memory
        >>> before = _memory.buffer_cache_stats()
        >>> _memory.release_buffer_cache(64 << 20, heap_limit=8 << 20)
        >>> _memory.buffer_cache_stats()["heap_limit"] == 8 << 20
        True
        >>> _memory.release_buffer_cache(before["limit"], heap_limit=before["heap_limit"])
    """
    cdef long long cap = -1 if limit is None else limit
    cdef long long heap = -1 if heap_limit is None else heap_limit
    if (limit is not None and limit < 0) or (heap_limit is not None and heap_limit < 0):
        raise ValueError("the buffer cache limit is a number of bytes >= 0")
    with nogil:
        apr_cache_release(cap, heap)


def pread_into(int fd, unsigned long long offset, uint8_t[::1] dst, int threads=0, crc=None):
    """Fill ``dst`` from ``fd`` at ``offset``; return the running CRC if ``crc`` is given.

    Raises EOFError if the file ends first and OSError for read errors.
    """
    cdef size_t n = dst.shape[0]
    cdef uint32_t value = 0 if crc is None else crc
    cdef uint32_t *crc_ptr = NULL if crc is None else &value
    cdef int rc = 0
    if n == 0:
        return None if crc is None else value
    with nogil:
        rc = apr_pread_exact(fd, &dst[0], offset, n, threads, crc_ptr)
    if rc == -1:
        raise EOFError(f"file ended before {n} bytes at offset {offset} were read")
    if rc:
        raise OSError(rc, os.strerror(rc))
    return None if crc is None else value


@cython.no_gc_clear  # __dealloc__ joins a read still writing into dst: dst must outlive it
cdef class BackgroundRead:
    """``pread_into`` on a thread of its own: the read starts here and :meth:`wait`
    returns what ``pread_into`` would have.  For work that does not touch ``dst``
    meanwhile (an eager load makes its arrays over the buffer while the bytes arrive).

    ``dst`` is held until the read is over.  Where no thread can be started (or ``dst``
    is empty) the read is done here, synchronously, and :meth:`wait` reports it.  An
    object dropped without :meth:`wait` waits for its read when it is freed.

    Args:
        fd: The descriptor to read (kept open by the caller until :meth:`wait`).
        offset: The file offset of ``dst``'s first byte.
        dst: A writable, contiguous byte buffer, filled entirely.
        threads: Threads for the read, as ``pread_into`` takes them (0: the library's choice).
        crc: The running CRC to continue over the bytes read, or None for none.

    Raises:
        OverflowError: ``crc`` is not a 32-bit unsigned value.

    Examples:
        >>> import tempfile, zlib
        >>> from aprfast import _memory
        >>> fh = tempfile.TemporaryFile(buffering=0)
        >>> _ = fh.write(b"0123456789")
        >>> out = bytearray(4)
        >>> read = _memory.BackgroundRead(fh.fileno(), 3, out, crc=0)
        >>> read.wait() == zlib.crc32(b"3456"), bytes(out)
        (True, b'3456')
        >>> fh.close()
    """

    cdef apr_pread_job *job
    cdef uint8_t[::1] dst
    cdef PyThread_type_lock lock
    cdef int rc
    cdef uint32_t value
    cdef bint want_crc
    cdef size_t n
    cdef unsigned long long offset

    def __cinit__(self, int fd, unsigned long long offset, uint8_t[::1] dst, int threads=0, crc=None):
        cdef size_t n = dst.shape[0]
        cdef uint32_t value = 0 if crc is None else crc
        cdef uint32_t *crc_ptr = NULL if crc is None else &value
        cdef apr_pread_job *job = NULL
        cdef int rc = 0
        self.lock = PyThread_allocate_lock()
        if self.lock == NULL:
            raise MemoryError("BackgroundRead: cannot allocate a lock")
        self.n = n
        self.offset = offset
        self.want_crc = crc is not None
        self.value = value
        if n == 0:
            return
        self.dst = dst  # the buffer stays exported (alive, not resized) until the read is over
        job = apr_pread_start(fd, &dst[0], offset, n, threads, crc_ptr)
        if job == NULL:
            with nogil:
                rc = apr_pread_exact(fd, &dst[0], offset, n, threads, crc_ptr)
            self.rc = rc
            self.value = value
            self.dst = None
        self.job = job

    def __dealloc__(self):
        if self.job != NULL:
            with nogil:
                apr_pread_finish(self.job, NULL)
            self.job = NULL
        if self.lock != NULL:
            PyThread_free_lock(self.lock)
            self.lock = NULL

    def wait(self):
        """Wait for the read: the running CRC if ``crc`` was given, else None.  A second
        call gives the same (or raises the same error) without waiting.

        Raises:
            EOFError: The file ended before ``dst`` was filled.
            OSError: The read failed.
        """
        cdef apr_pread_job *job
        cdef uint32_t value
        cdef int rc
        with nogil:  # another thread may hold it while joining, without the GIL
            PyThread_acquire_lock(self.lock, WAIT_LOCK)
        try:
            job = self.job
            if job != NULL:
                value = self.value
                with nogil:
                    rc = apr_pread_finish(job, &value)
                self.job = NULL
                self.rc = rc
                self.value = value
                self.dst = None
        finally:
            PyThread_release_lock(self.lock)
        if self.rc == -1:
            raise EOFError(f"file ended before {self.n} bytes at offset {self.offset} were read")
        if self.rc:
            raise OSError(self.rc, os.strerror(self.rc))
        return self.value if self.want_crc else None


def pread_to_bytes(int fd, unsigned long long offset, Py_ssize_t n, int threads=0, crc=None):
    """(a new ``bytes`` of the ``n`` bytes of ``fd`` at ``offset``, the running CRC over
    them if ``crc`` is given, else None).

    The bytes object is filled by ``pread_into``'s parallel reads before anyone else can
    see it (as CPython's own ``read()`` fills its result), checksummed while each chunk
    is in cache, and a large one is advised huge pages first: one read of the file
    straight into the object returned, with no CRC pass or copy after it.  Raises
    EOFError if the file ends first and OSError for read errors."""
    if n < 0:
        raise ValueError(f"pread_to_bytes: cannot read {n} bytes")
    cdef uint32_t value = 0 if crc is None else crc
    cdef uint32_t *crc_ptr = NULL if crc is None else &value
    cdef int rc = 0
    out = PyBytes_FromStringAndSize(NULL, n)
    cdef uint8_t *dst = <uint8_t *>PyBytes_AS_STRING(out)
    if n:
        with nogil:
            apr_advise_huge(dst, <size_t>n)
            rc = apr_pread_exact(fd, dst, offset, <size_t>n, threads, crc_ptr)
    if rc == -1:
        raise EOFError(f"file ended before {n} bytes at offset {offset} were read")
    if rc:
        raise OSError(rc, os.strerror(rc))
    return out, (None if crc is None else value)


#: The engines ``pread_direct`` takes by name (csrc/pio.h apr_pread_direct_engine).
DIRECT_ENGINES = ("auto", "io_uring", "threads")


def pread_direct(int fd, unsigned long long offset, uint8_t[::1] dst, int threads=0, crc=None,
                 size_t align=4096, str engine="auto", unsigned int depth=0, size_t chunk=0):
    """``pread_into`` for a descriptor opened with ``O_DIRECT``: any ``dst`` and
    ``offset``; the aligned blocks go straight into ``dst`` when ``dst``'s address and
    ``offset`` are congruent modulo ``align``, partial blocks (and every block
    otherwise) through an aligned bounce buffer.  Returns the running CRC if ``crc``
    is given.

    ``engine``: "io_uring" (``depth`` reads of ``chunk`` bytes in flight from this
    thread, 0: the defaults; where no ring can be set up, or ``dst`` is not congruent,
    the threads without a word), "threads" (``threads`` <= 0: 8, one blocking read
    each) or "auto" (the faster for large ranges, csrc/pio.h).  The engine that ran:
    :func:`direct_engine_last`.

    Raises EOFError if the file ends first and OSError for read errors (EINVAL: the
    filesystem refused direct I/O)."""
    cdef size_t n = dst.shape[0]
    cdef uint32_t value = 0 if crc is None else crc
    cdef uint32_t *crc_ptr = NULL if crc is None else &value
    cdef int rc = 0, which
    if engine == "auto":
        which = APR_ENGINE_AUTO
    elif engine == "io_uring":
        which = APR_ENGINE_URING
    elif engine == "threads":
        which = APR_ENGINE_THREADS
    else:
        raise ValueError(f"pread_direct: no engine {engine!r}; known: {', '.join(DIRECT_ENGINES)}")
    if n == 0:
        return None if crc is None else value
    with nogil:
        rc = apr_pread_direct_engine(fd, &dst[0], offset, n, threads, crc_ptr, align, which, depth, chunk)
    if rc == -1:
        raise EOFError(f"file ended before {n} bytes at offset {offset} were read")
    if rc:
        raise OSError(rc, os.strerror(rc))
    return None if crc is None else value


def direct_engine_last():
    """The engine the calling thread's last ``pread_direct`` used: "io_uring" or
    "threads"."""
    return "io_uring" if apr_direct_engine_last() == APR_ENGINE_URING else "threads"


def uring_available():
    """True when an io_uring ring can be set up here now (Linux with io_uring, not
    refused by seccomp or ``kernel.io_uring_disabled``, the "io_uring" fallback not
    forced)."""
    cdef int ok
    with nogil:
        ok = apr_uring_available()
    return ok != 0


cdef class UringWriter:
    """Direct writes of one file from its start to its end on an io_uring ring of the
    calling thread (csrc/uring.h ``apr_uring_writer``): :meth:`write` copies the bytes
    into aligned buffers, taking their CRC on the way, and keeps the full buffers'
    writes in flight while it fills the next, all without the GIL.

    Not thread-safe: one thread feeds it.  Raises ``NotImplementedError`` where no ring
    can be set up (the caller writes another way), ``ValueError`` for a ``chunk`` that is
    not a power of two of at least 4096 or a ``depth`` over 64.

    Args:
        fd: A descriptor opened with ``O_DIRECT`` for writing (kept by the caller).
        offset: The file offset of the first byte (block-aligned).
        chunk: Bytes per write (0: csrc/uring.h's default, 8 MiB).
        depth: Writes in flight at most (0: the default, 2).
        helper: True: a second thread fills half of each buffer (its CRC and its copy)
            while the calling thread fills the other half; False: the calling thread
            fills alone; None (the default): a helper where a second processor is idle
            when the writer opens.

    Examples:
        >>> from aprfast._memory import UringWriter, uring_available
        >>> uring_available() in (True, False)
        True
    """
    cdef apr_uring_writer *w

    def __cinit__(self, int fd, unsigned long long offset=0, size_t chunk=0, unsigned int depth=0, helper=None):
        cdef int err = 0
        cdef int want = -1 if helper is None else (1 if helper else 0)
        with nogil:
            self.w = apr_uring_writer_open(fd, offset, chunk, depth, want, &err)
        if self.w == NULL:
            if err == APR_URING_UNAVAILABLE:
                raise NotImplementedError("no io_uring ring can be set up here")
            if err == EINVAL:
                raise ValueError("UringWriter: chunk must be a power of two of at least 4096, depth at most 64")
            raise OSError(err, os.strerror(err))

    def __dealloc__(self):
        if self.w != NULL:
            with nogil:
                apr_uring_writer_close(self.w)
            self.w = NULL

    def write(self, const uint8_t[::1] data, crc=None):
        """Append the bytes of ``data``; the running CRC over them if ``crc`` is given.

        Raises:
            OSError: A write failed (one in flight since an earlier call, or this one).
            ValueError: After :meth:`close`.
        """
        if self.w == NULL:
            raise ValueError("UringWriter: write after close")
        cdef size_t n = data.shape[0]
        cdef uint32_t value = 0 if crc is None else crc
        cdef uint32_t *crc_ptr = NULL if crc is None else &value
        cdef int rc = 0
        if n:
            with nogil:
                rc = apr_uring_writer_write(self.w, &data[0], n, crc_ptr)
        if rc:
            raise OSError(rc, os.strerror(rc))
        return None if crc is None else value

    def flush(self, size_t align=4096):
        """Write the whole ``align``-byte blocks held and wait for every write: returns
        ``(tail, offset)``, the bytes after them (fewer than ``align``) and the file
        offset they belong at, for the caller to write another way.  Nothing may be
        written after it.

        Raises:
            OSError: A write failed.
        """
        if self.w == NULL:
            raise ValueError("UringWriter: flush after close")
        cdef const uint8_t *tail = NULL
        cdef size_t tail_len = 0
        cdef uint64_t tail_offset = 0
        cdef int rc
        with nogil:
            rc = apr_uring_writer_flush(self.w, align, &tail, &tail_len, &tail_offset)
        if rc:
            raise OSError(rc, os.strerror(rc))
        return PyBytes_FromStringAndSize(<const char *>tail, tail_len), tail_offset

    @property
    def written(self):
        """Bytes the kernel has reported written so far."""
        return 0 if self.w == NULL else apr_uring_writer_written(self.w)

    def close(self):
        """Wait for every write in flight and free the ring and buffers (idempotent;
        errors of the writes in flight are dropped: for the path of an error)."""
        if self.w != NULL:
            with nogil:
                apr_uring_writer_close(self.w)
            self.w = NULL


#: The staging modes of io_uring direct reads (csrc/uring.h APR_STAGE_*).
STAGING_MODES = ("auto", "always", "never", "ring")


def set_direct_staging(mode):
    """Set how io_uring direct reads use their huge-page staging buffers and return
    the mode before: "auto" (the default: on a virtio-blk disk every whole-block piece
    through a small ring of them, elsewhere the pieces whose destination is known to
    have 4 KiB pages; csrc/uring.c says why), "always" (every whole-block piece through
    the large set: tests and benchmarks), "ring" (every whole-block piece through the
    small ring, on any disk) or "never".

    Raises:
        ValueError: ``mode`` is not one of :data:`STAGING_MODES`.

    Examples:
        >>> from aprfast import _memory
        >>> before = _memory.set_direct_staging("never")
        >>> _memory.set_direct_staging(before)
        'never'
    """
    if mode not in STAGING_MODES:
        raise ValueError(f"set_direct_staging: no mode {mode!r}; known: {', '.join(STAGING_MODES)}")
    codes = (APR_STAGE_AUTO, APR_STAGE_ALWAYS, APR_STAGE_NEVER, APR_STAGE_RING)
    cdef int old = apr_uring_set_staging(codes[STAGING_MODES.index(mode)])
    return STAGING_MODES[codes.index(old)]


def direct_stages_every_piece(int fd):
    """True when io_uring direct reads of ``fd`` stage every whole-block piece through
    the small ring: the mode is "ring", or "auto" and the file lies on a virtio-blk
    disk (csrc/uring.c says why).

    Examples:
        >>> import tempfile
        >>> from aprfast import _memory
        >>> with tempfile.TemporaryFile() as f:
        ...     _memory.direct_stages_every_piece(f.fileno()) in (True, False)
        True
    """
    return apr_uring_stages_every_piece(fd) != 0


def direct_staged_last():
    """The pieces the calling thread's last io_uring direct read read through the
    staging buffers (0 where none was, or where io_uring is not compiled in)."""
    return apr_uring_staged_last()


def page_cache_sample(int fd, unsigned long long size, int samples=16):
    """How many of ``samples`` pages spread over ``fd``'s first ``size`` bytes are in
    the page cache (mincore), or None where that cannot be told."""
    cdef int got
    with nogil:
        got = apr_page_cache_sample(fd, size, samples)
    return None if got < 0 else got


def pread_some(int fd, unsigned long long offset, uint8_t[::1] dst):
    """One positional read into the start of ``dst`` (at most 1 MiB): the bytes read,
    0 at the end of the file.  The call ``pread_into`` makes (pread; ReadFile with an
    offset on Windows; lseek + read under a lock with the "pread" fallback forced), for
    callers that take short reads, as ``os.pread`` gives them."""
    cdef size_t n = dst.shape[0], got = 0
    cdef int rc
    if n == 0:
        return 0
    with nogil:
        rc = apr_pread_some(fd, &dst[0], offset, n, &got)
    if rc:
        raise OSError(rc, os.strerror(rc))
    return got


def copy_into(uint8_t[::1] dst, const uint8_t[::1] src, int threads=0):
    """memcpy ``src`` into ``dst`` (same length), split over threads when large."""
    cdef size_t n = src.shape[0]
    if <size_t>dst.shape[0] != n:
        raise ValueError(f"copy_into: destination holds {dst.shape[0]} bytes, source has {n}")
    if n == 0:
        return
    if n < NOGIL_MIN:
        apr_copy(&dst[0], &src[0], n, 1)
        return
    with nogil:
        apr_copy(&dst[0], &src[0], n, threads)


def copy_range(src, Py_ssize_t offset, Py_ssize_t size, size_t alignment=64, int threads=0):
    """A new AlignedBuffer holding bytes ``[offset, offset + size)`` of ``src`` (any
    contiguous buffer).  One call in place of slicing, allocating and ``copy_into``:
    an owned copy of an 80 KiB tensor is mostly this call's overhead otherwise."""
    cdef Py_buffer view
    cdef AlignedBuffer out
    PyObject_GetBuffer(src, &view, PyBUF_SIMPLE)
    try:
        if offset < 0 or size < 0 or offset > view.len or size > view.len - offset:
            raise ValueError(f"copy_range: bytes {offset}..{offset + size} lie outside a buffer of {view.len}")
        out = AlignedBuffer.__new__(AlignedBuffer, <size_t>size, alignment)
        if <size_t>size < NOGIL_MIN:
            if size:
                memcpy(out.block.ptr, <uint8_t *>view.buf + offset, size)
        else:
            with nogil:
                apr_copy(out.block.ptr, <uint8_t *>view.buf + offset, size, threads)
    finally:
        PyBuffer_Release(&view)
    return out


def copy_to_bytes(const uint8_t[::1] src, int threads=0):
    """``bytes(src)``, copied by several threads when large: a fresh bytes object is
    filled before anyone else can see it (as CPython itself does), so a large copy out
    of a mapped file faults in its new pages on every core instead of one."""
    cdef Py_ssize_t n = src.shape[0]
    out = PyBytes_FromStringAndSize(NULL, n)
    cdef uint8_t *dst = <uint8_t *>PyBytes_AS_STRING(out)
    if n == 0:
        return out
    if <size_t>n < NOGIL_MIN:
        memcpy(dst, &src[0], n)
        return out
    with nogil:
        apr_copy(dst, &src[0], n, threads)
    return out


def preallocate(int fd, unsigned long long size):
    """Reserve ``size`` bytes for ``fd`` (Linux ``fallocate``); 0 or an errno value."""
    cdef int rc
    with nogil:
        rc = apr_preallocate(fd, size)
    return rc


#: The C paths a fallback can be forced on (aprfast._platform; docs/PORTABILITY.md).
FALLBACKS = {"pread": APR_FALLBACK_PREAD, "fallocate": APR_FALLBACK_FALLOCATE, "madvise": APR_FALLBACK_MADVISE,
             "io_uring": APR_FALLBACK_URING}


def set_fallbacks(names):
    """Make the C code take the fallback path of each named call ("pread": lseek + read
    under a lock, "fallocate": no preallocation, "madvise": no memory advice,
    "io_uring": no io_uring ring, as where io_uring_setup fails), as on a platform
    without it; an empty set restores the normal paths."""
    cdef unsigned int flags = 0
    for name in names:
        if name not in FALLBACKS:
            raise ValueError(f"no C fallback named {name!r}; known: {', '.join(sorted(FALLBACKS))}")
        flags |= FALLBACKS[name]
    apr_set_fallbacks(flags)


def fallbacks():
    """The names of the C fallbacks in force."""
    cdef unsigned int flags = apr_fallbacks()
    return frozenset(name for name, bit in FALLBACKS.items() if flags & bit)


def default_threads():
    """Threads used when ``threads=0``: the online cores."""
    return apr_default_threads()


def append_padded(bytearray out, data, Py_ssize_t pad):
    """Append the bytes of buffer ``data`` and ``pad`` zero bytes to ``out``.

    The writer gathers small tensors this way: one call per tensor instead of a
    memoryview, a cast and a slice in Python."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_ANY_CONTIGUOUS)
    cdef Py_ssize_t old = PyByteArray_GET_SIZE(out)
    try:
        if not PyBuffer_IsContiguous(&view, b'C'):
            raise ValueError("append_padded needs a C-contiguous buffer")
        PyByteArray_Resize(out, old + view.len + pad)
        memcpy(PyByteArray_AS_STRING(out) + old, view.buf, view.len)
        memset(PyByteArray_AS_STRING(out) + old + view.len, 0, pad)
    finally:
        PyBuffer_Release(&view)
    return view.len


LZ4_MAX_RATIO = APR_LZ4_MAX_RATIO
LZ4_SLACK = APR_LZ4_SLACK
_LZ4_ERRORS = {-1: "the block ends inside a sequence", -2: "the block describes more bytes than declared",
               -3: "a match refers to before the start of the output",
               -4: "the block ends before the declared size is reached"}


def lz4_block_decode_into(const uint8_t[::1] src, uint8_t[::1] dst):
    """Decode one raw LZ4 block into exactly all of ``dst``; None on success, else a
    message saying what was wrong and at which input byte."""
    cdef size_t n = src.shape[0], m = dst.shape[0], where = 0
    cdef const uint8_t *sp = &src[0] if n else NULL
    cdef uint8_t *dp = &dst[0] if m else NULL
    cdef int rc
    if n == 0:
        return None if m == 0 else "the block is empty"
    with nogil:
        rc = apr_lz4_block_decode(sp, n, dp, m, &where)
    if rc == 0:
        return None
    return f"{_LZ4_ERRORS.get(rc, rc)} (at input byte {where} of {n})"


def uninitialised_bytearray(Py_ssize_t n):
    """A bytearray of ``n`` bytes whose contents are not written (bytearray(n) zeroes
    every page first), for buffers a decoder fills completely.  A large one is advised
    huge pages before its first touch (buffers.h apr_advise_huge), as AlignedBuffer's
    are: the filling then takes one page fault per 2 MiB instead of one per 4 KiB."""
    out = PyByteArray_FromStringAndSize(NULL, n)
    if n:
        apr_advise_huge(PyByteArray_AS_STRING(out), <size_t>n)
    return out


def resize_bytearray(bytearray out, Py_ssize_t n):
    """Grow or shrink ``out`` in place to ``n`` bytes without writing the new bytes
    (large blocks move with mremap, not by copying)."""
    PyByteArray_Resize(out, n)
