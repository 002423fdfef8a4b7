/* IEEE CRC-32 (the one zlib.crc32 computes) with run-time choice of kernel.
 *
 * Every crc argument and result is a finished CRC value, exactly as in
 * zlib.crc32(data, value): start from 0, and apr_crc32(apr_crc32(0, a), b)
 * equals the CRC of a followed by b.  All functions are thread-safe. */
#ifndef APRFAST_CRC32_H
#define APRFAST_CRC32_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum apr_crc32_path {
    APR_CRC32_AUTO = -1,     /* best path this CPU can run */
    APR_CRC32_PORTABLE = 0,  /* slicing-by-16 tables, any CPU */
    APR_CRC32_PCLMUL = 1,    /* x86-64 PCLMULQDQ + SSE4.1 */
    APR_CRC32_VPCLMUL = 2,   /* x86-64 VPCLMULQDQ + AVX-512 F/BW/VL */
    APR_CRC32_ARMV8 = 3      /* AArch64 CRC32 instructions */
};

/* CRC of buf[0..len) continuing from crc, on the best available path. */
uint32_t apr_crc32(uint32_t crc, const uint8_t *buf, size_t len);

/* Same on a given path.  A path this CPU cannot run (or an unknown number) is
 * computed on the portable path instead, so the result is always right. */
uint32_t apr_crc32_path(int path, uint32_t crc, const uint8_t *buf, size_t len);

/* 1 if this CPU (and OS) can run path, else 0.  AUTO and PORTABLE are always 1. */
int apr_crc32_path_available(int path);

/* The path AUTO resolves to. */
int apr_crc32_best_path(void);

/* "portable", "pclmul", "vpclmul-avx512", "armv8-crc"; "auto" for AUTO and
 * "unknown" for anything else. */
const char *apr_crc32_path_name(int path);

/* CRC of A followed by B, from crc1 = CRC(A), crc2 = CRC(B) and len2 = len(B).
 * O(log len2). */
uint32_t apr_crc32_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);

/* apr_crc32_path, split over up to nthreads threads when the buffer is large
 * enough to gain from it (nthreads <= 1: single-threaded, in the caller). */
uint32_t apr_crc32_parallel(int path, uint32_t crc, const uint8_t *buf, size_t len, int nthreads);

#ifdef __cplusplus
}
#endif
#endif
