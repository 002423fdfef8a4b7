/* LZ4 block decoder: see lz4block.h.  The block format is a sequence of
 *   token (hi nibble literal length, lo nibble match length - 4)
 *   [literal length extension bytes] literals
 *   offset u16 LE [match length extension bytes]
 * where a nibble of 15 continues in following bytes, each added, until one is < 255;
 * the last sequence has literals only and ends the block. */
#include "lz4block.h"

#include <string.h>

/* Read a length extension: add bytes while they are 255.  Fails if the input ends. */
static int read_extension(const uint8_t **ip, const uint8_t *iend, size_t *len) {
    const uint8_t *p = *ip;
    uint8_t b;
    do {
        if (p >= iend) return APR_LZ4_TRUNCATED;
        b = *p++;
        *len += b;  /* at most 255 per input byte: cannot wrap a size_t */
    } while (b == 255);
    *ip = p;
    return APR_LZ4_OK;
}

/* Copy a match that may overlap its own output (offset < len repeats a pattern). */
static void copy_match(uint8_t *op, size_t offset, size_t len) {
    const uint8_t *from = op - offset;
    if (offset >= len) {
        memcpy(op, from, len);
        return;
    }
    /* Overlapping: copy the pattern, doubling the stretch copied each time. */
    size_t done = 0;
    while (done < len) {
        size_t span = offset + done;  /* bytes of pattern now available before op+done */
        size_t n = len - done < span ? len - done : span;
        memcpy(op + done, from, n);
        done += n;
    }
}

int apr_lz4_block_decode(const uint8_t *src, size_t srclen, uint8_t *dst, size_t dstlen, size_t *where) {
    const uint8_t *ip = src, *iend = src + srclen;
    uint8_t *op = dst, *oend = dst + dstlen;
    int rc = APR_LZ4_OK;
    for (;;) {
        if (ip >= iend) { rc = APR_LZ4_TRUNCATED; break; }
        unsigned token = *ip++;
        size_t lit = token >> 4;
        if (lit == 15 && (rc = read_extension(&ip, iend, &lit)) != APR_LZ4_OK) break;
        if (lit > (size_t)(iend - ip)) { rc = APR_LZ4_TRUNCATED; break; }
        if (lit > (size_t)(oend - op)) { rc = APR_LZ4_OUTPUT_OVERFLOW; break; }
        if (lit <= 16 && iend - ip >= 16 && oend - op >= 16)
            memcpy(op, ip, 16);  /* fixed size: one vector move; the excess is rewritten later */
        else if (lit)
            memcpy(op, ip, lit);  /* never memcpy(NULL, ..., 0): an empty output may be NULL */
        ip += lit;
        op += lit;
        if (ip == iend) {  /* the last sequence: literals only */
            if (op != oend) rc = APR_LZ4_SHORT_OUTPUT;
            break;
        }
        if (iend - ip < 2) { rc = APR_LZ4_TRUNCATED; break; }
        size_t offset = (size_t)ip[0] | ((size_t)ip[1] << 8);
        ip += 2;
        if (offset == 0 || offset > (size_t)(op - dst)) { rc = APR_LZ4_BAD_OFFSET; break; }
        size_t mlen = token & 15;
        if (mlen == 15 && (rc = read_extension(&ip, iend, &mlen)) != APR_LZ4_OK) break;
        mlen += 4;
        if (mlen > (size_t)(oend - op)) { rc = APR_LZ4_OUTPUT_OVERFLOW; break; }
        if (offset >= 8 && (size_t)(oend - op) >= mlen + 8) {
            /* Each 8-byte chunk reads bytes at least 8 back, all written already; the
             * up to 7 bytes past the match stay inside dst and are rewritten later. */
            uint8_t *d = op, *e = op + mlen;
            const uint8_t *s = op - offset;
            do { memcpy(d, s, 8); d += 8; s += 8; } while (d < e);
        } else {
            copy_match(op, offset, mlen);
        }
        op += mlen;
    }
    if (where) *where = (size_t)(ip - src);
    return rc;
}
