#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "pio.h"
#include "buffers.h"
#include "crc32.h"
#include "parallel.h"
#include "uring.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#ifdef _WIN32
#define WIN32_LEAN_AND_MEAN
#include <windows.h>
#include <io.h>
#else
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

/* Below this size a second thread costs more than it saves when the caller lets the
 * library choose (threads <= 0); a caller who names a thread count gets it down to
 * PARALLEL_FLOOR, each thread taking at least that much. */
#define PARALLEL_MIN ((size_t)8 << 20)
#define PARALLEL_FLOOR ((size_t)256 << 10)
/* Checksum in cache-sized steps right after each read, while the bytes are hot. */
#define CHUNK ((size_t)1 << 20)
/* A fresh block (apr_block_alloc_deferred) is populated this much ahead of the read:
 * one huge page, cleared while the previous one is still in cache. */
#define FRESH_STEP ((size_t)2 << 20)
#define MAX_THREADS APR_PARALLEL_MAX_THREADS

#ifdef _WIN32
/* The errno value closest to a Win32 error code, for the messages Python builds. */
static int errno_of(DWORD error)
{
    switch (error) {
    case ERROR_HANDLE_EOF: return -1;
    case ERROR_DISK_FULL:
    case ERROR_HANDLE_DISK_FULL: return ENOSPC;
    case ERROR_ACCESS_DENIED: return EACCES;
    case ERROR_INVALID_HANDLE: return EBADF;
    case ERROR_NOT_ENOUGH_MEMORY:
    case ERROR_OUTOFMEMORY: return ENOMEM;
    case ERROR_INVALID_FUNCTION:
    case ERROR_CALL_NOT_IMPLEMENTED: /* Wine's FileAllocationInfo */
    case ERROR_NOT_SUPPORTED: return ENOSYS;
    case ERROR_INVALID_PARAMETER: return EINVAL;
    default: return EIO;
    }
}
#endif

int apr_preallocate(int fd, uint64_t size)
{
    if (apr_fallbacks() & APR_FALLBACK_FALLOCATE)
        return ENOSYS;
#if defined(__linux__)
    /* Writing into blocks allocated in one go is several times faster than letting
     * the filesystem allocate page by page (ext4 delayed allocation). */
    return fallocate(fd, 0, 0, (off_t)size) == 0 ? 0 : errno;
#elif defined(_WIN32)
    /* NTFS reserves the clusters without changing the file's size (as fallocate does). */
    HANDLE h = (HANDLE)_get_osfhandle(fd);
    FILE_ALLOCATION_INFO info;
    if (h == INVALID_HANDLE_VALUE)
        return EBADF;
    info.AllocationSize.QuadPart = (LONGLONG)size;
    return SetFileInformationByHandle(h, FileAllocationInfo, &info, sizeof info) ? 0 : errno_of(GetLastError());
#else
    (void)fd;
    (void)size;
    return ENOSYS;
#endif
}

int apr_default_threads(void)
{
    return apr_parallel_cpu_count(MAX_THREADS);
}

static int clamp_threads(int nthreads, size_t len)
{
    if (nthreads <= 0) {
        if (len < PARALLEL_MIN)
            return 1;
        nthreads = apr_parallel_idle_cpus(MAX_THREADS); /* only cores that can run now (parallel.h) */
    }
    if (nthreads > MAX_THREADS)
        nthreads = MAX_THREADS;
    if ((size_t)nthreads > len / PARALLEL_FLOOR)
        nthreads = (int)(len / PARALLEL_FLOOR);
    return nthreads < 1 ? 1 : nthreads;
}

typedef struct {
    int fd;
    uint8_t *dst;
    const uint8_t *src;
    uint64_t offset;
    size_t len;
    int want_crc;
    uint32_t crc;
    int status;
    int fresh;               /* dst is an unpopulated fresh block: populate ahead of the read */
    apr_fresh_state pages;   /* this piece's page-size choice */
    uint8_t *populated;      /* populated from dst up to here */
} piece;

#ifdef _WIN32
/* One positional read: ReadFile with the offset in an OVERLAPPED works on a handle
 * opened for synchronous I/O (what os.open and open() give) and is safe from several
 * threads; it also moves the handle's file position, which aprfast never relies on.
 * Returns the bytes read (0 at the end of the file), or -1 with *err set. */
static long long read_at(int fd, uint8_t *dst, size_t step, uint64_t offset, int *err)
{
    HANDLE h = (HANDLE)_get_osfhandle(fd);
    OVERLAPPED at;
    DWORD got = 0;
    if (h == INVALID_HANDLE_VALUE) {
        *err = EBADF;
        return -1;
    }
    memset(&at, 0, sizeof at);
    at.Offset = (DWORD)(offset & 0xffffffffu);
    at.OffsetHigh = (DWORD)(offset >> 32);
    if (!ReadFile(h, dst, (DWORD)step, &got, &at)) {
        DWORD error = GetLastError();
        if (error == ERROR_HANDLE_EOF)
            return 0;
        *err = errno_of(error);
        return -1;
    }
    return (long long)got;
}
#else
/* The forced fallback (APR_FALLBACK_PREAD): what a platform with neither pread nor
 * positional ReadFile does.  One process-wide lock, since a descriptor shares its
 * position with every dup of it; the position is put back after each read, so a
 * caller's file object does not move. */
static pthread_mutex_t seek_lock = PTHREAD_MUTEX_INITIALIZER;

static long long seek_read_at(int fd, uint8_t *dst, size_t step, uint64_t offset, int *err)
{
    ssize_t got = -1;
    pthread_mutex_lock(&seek_lock);
    off_t position = lseek(fd, 0, SEEK_CUR);
    if (position >= 0 && lseek(fd, (off_t)offset, SEEK_SET) >= 0) {
        do
            got = read(fd, dst, step);
        while (got < 0 && errno == EINTR);
        *err = got < 0 ? errno : 0;
        lseek(fd, position, SEEK_SET);
    } else {
        *err = errno;
    }
    pthread_mutex_unlock(&seek_lock);
    return got;
}

static long long read_at(int fd, uint8_t *dst, size_t step, uint64_t offset, int *err)
{
    if (apr_fallbacks() & APR_FALLBACK_PREAD)
        return seek_read_at(fd, dst, step, offset, err);
    for (;;) {
        ssize_t got = pread(fd, dst, step, (off_t)offset);
        if (got >= 0)
            return got;
        if (errno != EINTR) {
            *err = errno;
            return -1;
        }
    }
}
#endif

int apr_pread_some(int fd, uint8_t *dst, uint64_t offset, size_t len, size_t *got)
{
    int err = 0;
    long long n = read_at(fd, dst, len < CHUNK ? len : CHUNK, offset, &err);
    *got = n > 0 ? (size_t)n : 0;
    return n < 0 ? err : 0;
}

/* Populate a fresh destination up to ``need``, a huge page at a time. */
static void populate_ahead(piece *p, uint8_t *need)
{
    while (p->populated < need) {
        uint8_t *next = (uint8_t *)(((uintptr_t)p->populated + FRESH_STEP) & ~(uintptr_t)(FRESH_STEP - 1));
        apr_fresh_populate(&p->pages, p->populated, (size_t)(next - p->populated));
        p->populated = next;
    }
}

/* Each of n pieces (stride bytes apart, ``first`` the first one's state) populated its
 * share with a page-size state of its own: the last one's choice goes on to later
 * blocks, the union of their 4 KiB-page spans is recorded. */
static void finish_pieces(apr_fresh_state *first, size_t stride, int n)
{
    apr_fresh_state *last = (apr_fresh_state *)((char *)first + stride * (size_t)(n - 1));
    for (int i = 0; i < n - 1; i++)
        apr_fresh_merge(last, (apr_fresh_state *)((char *)first + stride * (size_t)i));
    apr_fresh_finish(last);
}

static int pread_piece(piece *p)
{
    size_t done = 0;
    p->populated = p->dst;
    if (p->fresh) /* this thread's page-size choice advises its own share only */
        apr_fresh_narrow(&p->pages, p->dst, p->dst + p->len);
    while (done < p->len) {
        size_t step = p->len - done < CHUNK ? p->len - done : CHUNK;
        int err = 0;
        if (p->fresh)
            populate_ahead(p, p->dst + done + step);
        long long got = read_at(p->fd, p->dst + done, step, p->offset + done, &err);
        if (got < 0)
            return err;
        if (got == 0)
            return -1;
        if (p->want_crc)
            p->crc = apr_crc32(p->crc, p->dst + done, (size_t)got);
        done += (size_t)got;
    }
    return 0;
}

static void pread_worker(void *arg)
{
    piece *p = arg;
    p->status = pread_piece(p);
}

static void copy_worker(void *arg)
{
    piece *p = arg;
    memcpy(p->dst, p->src, p->len);
}

/* Split [0, len) into n contiguous pieces and run work on each, the last on the
 * calling thread.  Falls back to running everything here if a thread can't start. */
static void run_pieces(piece *pieces, int n, size_t len, apr_piece_fn work)
{
    size_t each = len / (size_t)n;
    for (int i = 0; i < n; i++) {
        size_t start = each * (size_t)i;
        pieces[i].len = i == n - 1 ? len - start : each;
        pieces[i].dst += start;
        if (pieces[i].src)
            pieces[i].src += start;
        pieces[i].offset += start;
    }
    apr_parallel_run(pieces, sizeof pieces[0], n, work);
}

int apr_pread_exact(int fd, uint8_t *dst, uint64_t offset, size_t len, int nthreads, uint32_t *crc)
{
    int n = clamp_threads(nthreads, len);
    piece pieces[MAX_THREADS];
    apr_fresh_state pages;
    memset(&pages, 0, sizeof pages);
    int fresh = apr_fresh_claim(dst, len, &pages);
    for (int i = 0; i < n; i++) {
        memset(&pieces[i], 0, sizeof pieces[i]);
        pieces[i].fd = fd;
        pieces[i].dst = dst;
        pieces[i].offset = offset;
        pieces[i].want_crc = crc != NULL;
        pieces[i].fresh = fresh;
        pieces[i].pages = pages;
    }
    run_pieces(pieces, n, len, pread_worker);
    if (fresh)
        finish_pieces(&pieces[0].pages, sizeof pieces[0], n);
    uint32_t total = crc ? *crc : 0;
    for (int i = 0; i < n; i++) {
        if (pieces[i].status)
            return pieces[i].status;
        if (crc)
            total = apr_crc32_combine(total, pieces[i].crc, pieces[i].len);
    }
    if (crc)
        *crc = total;
    return 0;
}

struct apr_pread_job {
    apr_thread thread;
    apr_parallel_task task; /* read by the thread after apr_thread_start returns: lives here */
    int fd;
    uint8_t *dst;
    uint64_t offset;
    size_t len;
    int nthreads;
    int want_crc;
    uint32_t crc;
    int status;
};

static void pread_job_run(void *arg)
{
    apr_pread_job *job = arg;
    job->status = apr_pread_exact(job->fd, job->dst, job->offset, job->len, job->nthreads,
                                  job->want_crc ? &job->crc : NULL);
}

apr_pread_job *apr_pread_start(int fd, uint8_t *dst, uint64_t offset, size_t len, int nthreads,
                               const uint32_t *crc)
{
    apr_pread_job *job = malloc(sizeof *job);
    if (job == NULL)
        return NULL;
    memset(job, 0, sizeof *job);
    job->fd = fd;
    job->dst = dst;
    job->offset = offset;
    job->len = len;
    /* The library's choice is made here, not on the job's thread: there the caller,
     * busy making arrays, counts as a core taken and a read of 300 x 1 MiB got one
     * thread instead of two (33 ms against 27 ms for the same read done in turn). */
    job->nthreads = clamp_threads(nthreads, len);
    job->want_crc = crc != NULL;
    job->crc = crc ? *crc : 0;
    job->task.work = pread_job_run;
    job->task.piece = job;
    if (!apr_thread_start(&job->thread, &job->task)) {
        free(job); /* no thread, no read begun: the caller reads itself */
        return NULL;
    }
    return job;
}

int apr_pread_finish(apr_pread_job *job, uint32_t *crc)
{
    apr_thread_join(job->thread);
    int status = job->status;
    if (crc && job->want_crc)
        *crc = job->crc;
    free(job);
    return status;
}

void apr_copy(uint8_t *dst, const uint8_t *src, size_t len, int nthreads)
{
    int n = clamp_threads(nthreads, len);
    if (n == 1) {
        memcpy(dst, src, len);
        return;
    }
    piece pieces[MAX_THREADS];
    for (int i = 0; i < n; i++) {
        memset(&pieces[i], 0, sizeof pieces[i]);
        pieces[i].fd = -1;
        pieces[i].dst = dst;
        pieces[i].src = src;
    }
    run_pieces(pieces, n, len, copy_worker);
}

/* --- direct I/O ------------------------------------------------------------------ */
/* The same code reads a Linux/BSD O_DIRECT descriptor and a Windows handle opened with
 * FILE_FLAG_NO_BUFFERING (aprfast.io.direct): both want sector-aligned offsets,
 * lengths and addresses, and read_at is pread or ReadFile at an offset. */
#ifdef _MSC_VER
#define APR_THREAD_LOCAL __declspec(thread)
#else
#define APR_THREAD_LOCAL __thread
#endif
#ifdef _WIN32
static void *aligned_block(size_t align, size_t size)
{
    return _aligned_malloc(size, align);
}
static void aligned_release(void *p)
{
    _aligned_free(p);
}
#else
static void *aligned_block(size_t align, size_t size)
{
    void *mem = NULL;
    return posix_memalign(&mem, align, size) ? NULL : mem;
}
static void aligned_release(void *p)
{
    free(p);
}
#endif

typedef struct {
    int fd;
    uint8_t *dst;            /* where file byte ``offset`` goes */
    uint64_t offset;
    size_t len;
    size_t align;
    int want_crc;
    uint32_t crc;
    int status;
    int fresh;
    apr_fresh_state pages;
    uint8_t *populated;
    uint8_t *bounce;         /* APR_DIRECT_CHUNK + 2 * align bytes, allocated on first use */
} dpiece;

/* Aligned reads of n bytes at pos into buf (both aligned) until n bytes are in or the
 * file ends; the bytes read, or -1 with *err set.  A short read at the end of the file
 * is how direct I/O returns a last block the file only partly fills; one that stops
 * off the alignment is the end of the file as it was then (a file being appended to
 * can end mid-block), and reading on from there would be refused (EINVAL), so it ends
 * the read too: the caller decides whether enough came. */
static long long direct_read(int fd, uint8_t *buf, uint64_t pos, size_t n, size_t align, int *err)
{
    size_t done = 0;
    while (done < n) {
        long long got = read_at(fd, buf + done, n - done, pos + done, err);
        if (got < 0)
            return -1;
        if (got == 0)
            break;
        done += (size_t)got;
        if (done & (align - 1))
            break;
    }
    return (long long)done;
}

/* File bytes [u0, u1) through the piece's bounce buffer into dst.  0, an errno value,
 * or -1 when the file ends before u1. */
static int bounce_range(dpiece *p, uint64_t u0, uint64_t u1)
{
    size_t a = p->align;
    uint64_t b0 = u0 & ~(uint64_t)(a - 1);
    uint64_t b1 = (u1 + a - 1) & ~(uint64_t)(a - 1);
    int err = 0;
    if (p->bounce == NULL) {
        p->bounce = aligned_block(a, APR_DIRECT_CHUNK + 2 * a);
        if (p->bounce == NULL)
            return ENOMEM;
    }
    long long got = direct_read(p->fd, p->bounce, b0, (size_t)(b1 - b0), a, &err);
    if (got < 0)
        return err;
    if ((uint64_t)got < u1 - b0)
        return -1;
    memcpy(p->dst + (u0 - p->offset), p->bounce + (u0 - b0), (size_t)(u1 - u0));
    return 0;
}

static void populate_direct(dpiece *p, uint8_t *need)
{
    while (p->populated < need) {
        uint8_t *next = (uint8_t *)(((uintptr_t)p->populated + FRESH_STEP) & ~(uintptr_t)(FRESH_STEP - 1));
        apr_fresh_populate(&p->pages, p->populated, (size_t)(next - p->populated));
        p->populated = next;
    }
}

static int direct_piece(dpiece *p)
{
    size_t a = p->align;
    uint64_t end = p->offset + p->len;
    int congruent = (((uintptr_t)p->dst - (uintptr_t)p->offset) & (a - 1)) == 0;
    uint64_t u0 = p->offset;
    p->populated = p->dst;
    if (p->fresh) /* this thread's page-size choice advises its own share only */
        apr_fresh_narrow(&p->pages, p->dst, p->dst + p->len);
    while (u0 < end) {
        /* chunks end on absolute multiples of APR_DIRECT_CHUNK (aligned) */
        uint64_t u1 = (u0 / APR_DIRECT_CHUNK + 1) * APR_DIRECT_CHUNK;
        if (u1 > end)
            u1 = end;
        uint8_t *d = p->dst + (u0 - p->offset);
        int rc = 0;
        if (p->fresh)
            populate_direct(p, d + (u1 - u0));
        uint64_t a0 = (u0 + a - 1) & ~(uint64_t)(a - 1);
        uint64_t a1 = u1 & ~(uint64_t)(a - 1);
        if (!congruent || a1 <= a0) {
            rc = bounce_range(p, u0, u1);
        } else {
            if (a0 > u0)
                rc = bounce_range(p, u0, a0);
            if (!rc) {
                int err = 0;
                long long got = direct_read(p->fd, p->dst + (a0 - p->offset), a0, (size_t)(a1 - a0), a, &err);
                rc = got < 0 ? err : ((uint64_t)got < a1 - a0 ? -1 : 0);
            }
            if (!rc && u1 > a1)
                rc = bounce_range(p, a1, u1);
        }
        if (rc)
            return rc;
        if (p->want_crc)
            p->crc = apr_crc32(p->crc, d, (size_t)(u1 - u0));
        u0 = u1;
    }
    return 0;
}

static void direct_worker(void *arg)
{
    dpiece *p = arg;
    p->status = direct_piece(p);
}

/* The threads engine: nthreads threads, each reading its share of whole chunks with
 * blocking preads, one in flight each. */
static int direct_threads(int fd, uint8_t *dst, uint64_t offset, size_t len, int nthreads, uint32_t *crc,
                          size_t align, int fresh, apr_fresh_state pages)
{
    uint64_t end = offset + len;
    /* whole chunks per piece, so each piece's direct reads start aligned */
    uint64_t first = offset / APR_DIRECT_CHUNK, last = (end + APR_DIRECT_CHUNK - 1) / APR_DIRECT_CHUNK;
    uint64_t chunks = last > first ? last - first : 1;
    int n = nthreads > 0 ? nthreads : APR_DIRECT_THREADS;
    if (n > MAX_THREADS)
        n = MAX_THREADS;
    if ((uint64_t)n > chunks)
        n = (int)chunks;
    dpiece pieces[MAX_THREADS];
    uint64_t at = offset;
    for (int i = 0; i < n; i++) {
        uint64_t stop = i == n - 1 ? end : (first + chunks * (uint64_t)(i + 1) / (uint64_t)n) * APR_DIRECT_CHUNK;
        if (stop > end)
            stop = end;
        if (stop < at)
            stop = at;
        memset(&pieces[i], 0, sizeof pieces[i]);
        pieces[i].fd = fd;
        pieces[i].dst = dst + (at - offset);
        pieces[i].offset = at;
        pieces[i].len = (size_t)(stop - at);
        pieces[i].align = align;
        pieces[i].want_crc = crc != NULL;
        pieces[i].fresh = fresh;
        pieces[i].pages = pages;
        at = stop;
    }
    /* dst of each piece is where its first file byte goes; direct_piece indexes from it */
    apr_parallel_run(pieces, sizeof pieces[0], n, direct_worker);
    if (fresh)
        finish_pieces(&pieces[0].pages, sizeof pieces[0], n);
    uint32_t total = crc ? *crc : 0;
    int status = 0;
    for (int i = 0; i < n; i++) {
        aligned_release(pieces[i].bounce);
        if (pieces[i].status && !status)
            status = pieces[i].status;
        if (crc)
            total = apr_crc32_combine(total, pieces[i].crc, pieces[i].len);
    }
    if (status)
        return status;
    if (crc)
        *crc = total;
    return 0;
}

/* Reads the io_uring engine takes when the caller lets the library choose: below
 * this a ring's set-up (a system call and three maps) buys nothing over the threads. */
#define URING_MIN ((size_t)8 << 20)

static APR_THREAD_LOCAL int last_engine = APR_ENGINE_THREADS;

int apr_direct_engine_last(void)
{
    return last_engine;
}

int apr_pread_direct_engine(int fd, uint8_t *dst, uint64_t offset, size_t len, int nthreads, uint32_t *crc,
                            size_t align, int engine, unsigned depth, size_t chunk)
{
    if (align == 0 || (align & (align - 1)) || align > APR_DIRECT_CHUNK)
        return EINVAL;
    apr_fresh_state pages;
    memset(&pages, 0, sizeof pages);
    int fresh = apr_fresh_claim(dst, len, &pages);
    /* 4 KiB pages split direct reads (buffers.h); apr_uring_read drops the mark where
     * it stages every piece */
    pages.slow_ns = APR_HUGE_SLOW_DIRECT_NS;
    int status = APR_URING_UNAVAILABLE;
    uint64_t a0 = (offset + align - 1) & ~(uint64_t)(align - 1), a1 = (offset + len) & ~(uint64_t)(align - 1);
    int congruent = (((uintptr_t)dst - (uintptr_t)offset) & (align - 1)) == 0;
    /* io_uring where the range has whole blocks that land aligned in dst (a read that
     * is all bounce buffer gains nothing from depth); the threads otherwise */
    int uring = engine == APR_ENGINE_URING || (engine == APR_ENGINE_AUTO && APR_ENGINE_DEFAULT == APR_ENGINE_URING
                                               && a1 > a0 && a1 - a0 >= URING_MIN);
    if (uring && congruent && a1 > a0) {
        status = apr_uring_read(fd, dst, offset, len, crc, align, depth, chunk, fresh ? &pages : NULL);
        /* refused by this ring but maybe not by a plain pread (an old kernel's io_uring on
         * this filesystem): the threads try, and say EINVAL themselves if O_DIRECT is
         * what the filesystem refuses */
        if (status == EINVAL || status == EOPNOTSUPP)
            status = APR_URING_UNAVAILABLE;
    }
    if (status == APR_URING_UNAVAILABLE) {
        last_engine = APR_ENGINE_THREADS;
        status = direct_threads(fd, dst, offset, len, nthreads, crc, align, fresh, pages); /* finishes pages */
    } else {
        last_engine = APR_ENGINE_URING;
        if (fresh)
            apr_fresh_finish(&pages);
    }
    return status;
}

int apr_pread_direct(int fd, uint8_t *dst, uint64_t offset, size_t len, int nthreads, uint32_t *crc,
                     size_t align)
{
    return apr_pread_direct_engine(fd, dst, offset, len, nthreads, crc, align, APR_ENGINE_AUTO, 0, 0);
}

#ifndef _WIN32
int apr_page_cache_sample(int fd, uint64_t size, int samples)
{
    long page = sysconf(_SC_PAGESIZE);
    if (size == 0 || samples <= 0 || page <= 0)
        return 0;
    if (size > (uint64_t)SIZE_MAX)
        return -1;
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        return -1;
    uint64_t pages = (size + (uint64_t)page - 1) / (uint64_t)page;
    int resident = 0;
    for (int i = 0; i < samples; i++) {
        /* the middle of each of ``samples`` equal parts of the file */
        uint64_t at = (pages * (uint64_t)(2 * i + 1)) / (uint64_t)(2 * samples);
        unsigned char vec = 0;
#if defined(__APPLE__) || defined(__FreeBSD__)
        if (mincore((char *)map + at * (uint64_t)page, (size_t)page, (char *)&vec)) {
#else
        if (mincore((char *)map + at * (uint64_t)page, (size_t)page, &vec)) {
#endif
            resident = -1;
            break;
        }
        resident += vec & 1;
    }
    munmap(map, (size_t)size);
    return resident;
}
#else
int apr_page_cache_sample(int fd, uint64_t size, int samples)
{
    (void)fd; (void)size; (void)samples;
    return -1;
}
#endif
