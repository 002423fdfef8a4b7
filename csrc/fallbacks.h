/* Fallback paths forced at run time.
 *
 * Each bit makes the C code take the path of a platform without one OS call, so the
 * tests on Linux run the code Windows (or another platform) takes and can compare its
 * bytes with the normal path's (docs/PORTABILITY.md, tests/test_portability.py).  Set
 * from Python by aprfast._memory.set_fallbacks (aprfast._platform, APRFAST_FALLBACKS). */
#ifndef APRFAST_FALLBACKS_H
#define APRFAST_FALLBACKS_H

#ifdef __cplusplus
extern "C" {
#endif

#define APR_FALLBACK_PREAD 1u     /* positional reads by lseek + read under one lock (pio.c) */
#define APR_FALLBACK_FALLOCATE 2u /* no preallocation: ENOSYS (pio.c) */
#define APR_FALLBACK_MADVISE 4u   /* no memory advice: MADV_HUGEPAGE, MADV_FREE (buffers.c) */
#define APR_FALLBACK_URING 8u    /* no io_uring: as where io_uring_setup fails (uring.c) */
#define APR_FALLBACK_ALL 15u

void apr_set_fallbacks(unsigned int flags);
unsigned int apr_fallbacks(void);

#ifdef __cplusplus
}
#endif
#endif
