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

/* Cores to use when the caller passes 0. */
int apr_default_threads(void);

#ifdef __cplusplus
}
#endif
#endif
