/* Parallel bulk I/O and copies for eager loads.
 *
 * A load of a large model is bound by copying bytes out of the page cache; two
 * threads, each reading its own contiguous half with pread and checksumming each
 * chunk while it is still in cache, use both cores and make the CRC nearly free. */
#ifndef APRFAST_PIO_H
#define APRFAST_PIO_H

#include <stddef.h>
#include <stdint.h>

#include "fallbacks.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Read exactly len bytes at offset of fd into dst.  Returns 0, an errno value, or -1
 * if the file ended first.  If crc is not NULL it is updated (zlib.crc32 semantics)
 * over the bytes read.  POSIX: pread.  Windows: ReadFile with the offset in an
 * OVERLAPPED on the descriptor's handle (which also moves that handle's file position).
 * With APR_FALLBACK_PREAD set: lseek + read under one lock, the position put back. */
int apr_pread_exact(int fd, uint8_t *dst, uint64_t offset, size_t len, int nthreads, uint32_t *crc);

/* apr_pread_exact on a thread of its own, for a caller with work to do meanwhile that
 * does not touch dst (an eager load makes every tensor's array over the buffer while
 * the bytes arrive: on a file of many small tensors the two took about as long each,
 * one after the other).  The running CRC to start from is read from *crc now (crc NULL:
 * none).  nthreads <= 0 is resolved now, on the calling thread, as apr_pread_exact
 * would resolve it here.  dst must stay valid and unread until apr_pread_finish.  NULL
 * where the job cannot be allocated or its thread cannot start: the caller reads
 * synchronously. */
typedef struct apr_pread_job apr_pread_job;
apr_pread_job *apr_pread_start(int fd, uint8_t *dst, uint64_t offset, size_t len, int nthreads,
                               const uint32_t *crc);

/* Wait for the job and free it (exactly once for every job started).  Returns what
 * apr_pread_exact returned (0, an errno value, or -1 if the file ended first); with crc
 * not NULL and a job started with a crc, *crc is the running CRC apr_pread_exact left
 * (the starting value where the read failed). */
int apr_pread_finish(apr_pread_job *job, uint32_t *crc);

/* One positional read of at most len bytes (the same call as apr_pread_exact's, on
 * the calling thread): 0 or an errno value; *got is the bytes read, 0 at the end. */
int apr_pread_some(int fd, uint8_t *dst, uint64_t offset, size_t len, size_t *got);

/* memcpy split over nthreads for large copies (e.g. from a mapped file). */
void apr_copy(uint8_t *dst, const uint8_t *src, size_t len, int nthreads);

/* Reserve size bytes for fd up front (Linux fallocate, Windows FileAllocationInfo;
 * never an emulation that writes zeros).  Returns 0 on success, else an errno value
 * (ENOSYS where there is no such call, or with APR_FALLBACK_FALLOCATE set); callers may
 * ignore it. */
int apr_preallocate(int fd, uint64_t size);

/* Read exactly len bytes at offset of fd into dst, where fd was opened for direct
 * I/O (O_DIRECT: the kernel moves the bytes between the device and dst, bypassing the
 * page cache, and refuses (EINVAL) a read whose file offset, length or buffer address
 * is not a multiple of align, a power of two: 4096 covers every common device).  Any
 * dst and offset are accepted: the blocks of [offset, offset + len) that land on
 * align-aligned addresses of dst (all of them when dst - offset is a multiple of
 * align) are read straight into dst; a partial block at either end, or every block
 * when dst is not congruent with the file, goes through an aligned bounce buffer per
 * thread.  nthreads <= 0 picks APR_DIRECT_THREADS (the reads wait on the device, not
 * on a core).  crc as for apr_pread_exact, computed by each thread over its pieces.
 * Returns 0, an errno value (EINVAL: the filesystem refused direct I/O; the caller
 * reads again without it), or -1 if the file ended first.  Not on Windows (ENOSYS).
 * The engine is APR_ENGINE_AUTO's choice (below): for a large range, io_uring where a
 * ring can be set up, one reading thread, nthreads unused. */
#define APR_DIRECT_THREADS 8
#define APR_DIRECT_CHUNK ((size_t)4 << 20)
int apr_pread_direct(int fd, uint8_t *dst, uint64_t offset, size_t len, int nthreads, uint32_t *crc,
                     size_t align);

/* apr_pread_direct with the engine named:
 * - APR_ENGINE_URING: io_uring (uring.h), depth reads of chunk bytes in flight from the
 *   calling thread (0: the defaults), nthreads unused; where no ring can be set up
 *   (ENOSYS, EPERM under seccomp or kernel.io_uring_disabled, the "io_uring" fallback
 *   forced), where the ring refuses the reads (EINVAL, EOPNOTSUPP) and for a range with
 *   no whole block landing aligned in dst, the threads, without a word;
 * - APR_ENGINE_THREADS: nthreads threads, each one blocking pread in flight;
 * - APR_ENGINE_AUTO: APR_ENGINE_DEFAULT for ranges of at least 8 MiB of whole blocks,
 *   the threads below (a ring's set-up costs more than it saves there).
 * apr_direct_engine_last() tells the engine the calling thread's last call used. */
#define APR_ENGINE_AUTO 0
#define APR_ENGINE_URING 1
#define APR_ENGINE_THREADS 2
/* Which engine reads a large range by default: cold 504 MiB on the development VM,
 * io_uring was level with the threads in a loop and 1.15-1.35x faster in a fresh
 * process (docs/performance.md, "Direct reads: io_uring or threads"). */
#define APR_ENGINE_DEFAULT APR_ENGINE_URING
int apr_pread_direct_engine(int fd, uint8_t *dst, uint64_t offset, size_t len, int nthreads, uint32_t *crc,
                            size_t align, int engine, unsigned depth, size_t chunk);
int apr_direct_engine_last(void);

/* Sample whether the pages of fd's first size bytes are in the page cache: samples
 * pages spread evenly over the file (mincore on a shared read-only map).  Returns the
 * number of sampled pages resident (0..samples), or -1 where mincore is unavailable
 * (Windows) or fails. */
int apr_page_cache_sample(int fd, uint64_t size, int samples);

/* Cores to use when the caller passes 0. */
int apr_default_threads(void);

#ifdef __cplusplus
}
#endif
#endif
