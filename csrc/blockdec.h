/* Decoding the independent blocks of compressed APR2 tensors (docs/FORMAT.md §3.1),
 * many at once, over threads, without the Python API.
 *
 * Each job decodes one stored block into exactly the bytes the caller reserved for
 * it: a copy (block stored raw), an LZ4 block (csrc/lz4block.c, bounded), or one zstd
 * frame.  zstd comes from the system's libzstd, loaded with dlopen on first use, so
 * the build needs no zstd headers and a machine without libzstd still runs (callers
 * then see apr_zstd_available() == 0 and decode zstd blocks another way). */
#ifndef APRFAST_BLOCKDEC_H
#define APRFAST_BLOCKDEC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    APR_BLOCK_COPY = 0,
    APR_BLOCK_LZ4 = 1,
    APR_BLOCK_ZSTD = 2,
};

/* Result codes beyond lz4block.h's (which are -1..-4). */
enum {
    APR_BLOCK_ZSTD_ERROR = -10,     /* libzstd refused the frame; where = its error code */
    APR_BLOCK_ZSTD_SIZE = -11,      /* the frame decoded to another size; where = that size */
    APR_BLOCK_ZSTD_MISSING = -12,   /* no libzstd could be loaded */
    APR_BLOCK_ZSTD_NOMEM = -13,     /* no decoder context could be allocated */
    APR_BLOCK_ZSTD_FRAMES = -14,    /* the block is not exactly one frame; where = first frame's size */
    APR_BLOCK_BAD_CODEC = -15,
    APR_BLOCK_COPY_SIZE = -16,      /* a raw block whose sizes differ */
};

typedef struct {
    const uint8_t *src;
    size_t srclen;
    uint8_t *dst;
    size_t dstlen;
    int codec;    /* APR_BLOCK_* */
    int rc;       /* out: 0, or a negative code */
    size_t where; /* out: where it stopped, or a codec's error detail */
} apr_block_job;

/* 1 if libzstd was found and every symbol needed resolved (loads it once). */
int apr_zstd_available(void);

/* libzstd's text for an error code from APR_BLOCK_ZSTD_ERROR (never NULL). */
const char *apr_zstd_error_name(size_t code);

/* Run every job on up to nthreads threads (0: the online cores; fewer for small work),
 * each taking the next few jobs as it finishes.  Returns the index of the first
 * failed job, or -1. */
ptrdiff_t apr_decode_blocks(apr_block_job *jobs, size_t n, int nthreads);

#ifdef __cplusplus
}
#endif

#endif
