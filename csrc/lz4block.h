/* LZ4 block decoding straight into a caller's buffer.
 *
 * aprender stores LZ4 payloads as lz4_flex's "size-prepended" blocks: a u32 LE
 * uncompressed size, then one raw LZ4 block.  python-lz4 can only return a new bytes
 * object, which it fills from a scratch buffer of the declared size and then copies,
 * so a 1 GiB payload peaked at 2 GiB; decoding here writes each byte once, into the
 * buffer the caller keeps.  Every length and offset is checked against the bytes
 * present on both sides before it is used: hostile input gives an error code, never
 * a read or write outside the two buffers. */
#ifndef APRFAST_LZ4BLOCK_H
#define APRFAST_LZ4BLOCK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The most output a raw block of n bytes can describe: every byte of a match-length
 * run adds 255 output bytes, and the token, offset and end-of-block rules add a few
 * more.  A declared size above this cannot be true. */
#define APR_LZ4_MAX_RATIO 255u
#define APR_LZ4_SLACK 24u

enum {
    APR_LZ4_OK = 0,
    APR_LZ4_TRUNCATED = -1,      /* the block ends inside a sequence */
    APR_LZ4_OUTPUT_OVERFLOW = -2, /* the block describes more bytes than dst holds */
    APR_LZ4_BAD_OFFSET = -3,     /* a match refers to before the start of the output */
    APR_LZ4_SHORT_OUTPUT = -4,   /* the block ends before dst is full */
};

/* Decode the raw block src[0..srclen) into exactly dst[0..dstlen).  Returns
 * APR_LZ4_OK or a negative code; *where is the input offset at which it stopped. */
int apr_lz4_block_decode(const uint8_t *src, size_t srclen, uint8_t *dst, size_t dstlen, size_t *where);

#ifdef __cplusplus
}
#endif

#endif
