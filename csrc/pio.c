#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "pio.h"
#include "crc32.h"
#include "parallel.h"

#include <errno.h>
#include <string.h>

#ifndef _WIN32
#include <fcntl.h>
#include <unistd.h>
#endif

/* Below this size a second thread costs more than it saves. */
#define PARALLEL_MIN ((size_t)8 << 20)
/* Checksum in cache-sized steps right after each read, while the bytes are hot. */
#define CHUNK ((size_t)1 << 20)
#define MAX_THREADS APR_PARALLEL_MAX_THREADS

int apr_preallocate(int fd, uint64_t size)
{
#if defined(__linux__)
    /* Writing into blocks allocated in one go is several times faster than letting
     * the filesystem allocate page by page (ext4 delayed allocation). */
    return fallocate(fd, 0, 0, (off_t)size) == 0 ? 0 : errno;
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
    if (len < PARALLEL_MIN)
        return 1;
    if (nthreads <= 0)
        nthreads = apr_default_threads();
    if (nthreads > MAX_THREADS)
        nthreads = MAX_THREADS;
    if (len < PARALLEL_MIN)
        return 1;
    return nthreads;
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
} piece;

static int pread_piece(piece *p)
{
#ifdef _WIN32
    (void)p;
    return ENOSYS;
#else
    size_t done = 0;
    while (done < p->len) {
        size_t step = p->len - done < CHUNK ? p->len - done : CHUNK;
        ssize_t got = pread(p->fd, p->dst + done, step, (off_t)(p->offset + done));
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (got == 0)
            return -1;
        if (p->want_crc)
            p->crc = apr_crc32(p->crc, p->dst + done, (size_t)got);
        done += (size_t)got;
    }
    return 0;
#endif
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
    for (int i = 0; i < n; i++) {
        piece p = {fd, dst, NULL, offset, 0, crc != NULL, 0, 0};
        pieces[i] = p;
    }
    run_pieces(pieces, n, len, pread_worker);
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

void apr_copy(uint8_t *dst, const uint8_t *src, size_t len, int nthreads)
{
    int n = clamp_threads(nthreads, len);
    if (n == 1) {
        memcpy(dst, src, len);
        return;
    }
    piece pieces[MAX_THREADS];
    for (int i = 0; i < n; i++) {
        piece p = {-1, dst, src, 0, 0, 0, 0, 0};
        pieces[i] = p;
    }
    run_pieces(pieces, n, len, copy_worker);
}
