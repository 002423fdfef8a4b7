/* float32 <-> float16 / bfloat16 conversion with run-time choice of kernel.
 *
 * Every kernel gives the same bits (tested against NumPy and ml_dtypes):
 *
 *   f32 -> f16   NumPy's astype(float16): round to nearest even, subnormals
 *                kept, overflow to +-inf.  A NaN keeps its sign and the top 10
 *                payload bits as they are (a signalling NaN stays signalling);
 *                if those bits are all zero the result is payload 1, so it
 *                stays a NaN (0x7f800001 -> 0x7c01).
 *   f16 -> f32   exact; a NaN's payload moves up 13 bits unchanged (NumPy).
 *   f32 -> bf16  ml_dtypes.bfloat16: round to nearest even, subnormals kept;
 *                every NaN becomes the quiet NaN 0x7fc0 with its sign kept
 *                (0xffc0 for a negative NaN), payload dropped.
 *   bf16 -> f32  exact (the 16 bits become the top half of the float).
 *
 * Halves are passed as their uint16_t bit patterns.  Source and destination
 * must not overlap.  Results do not depend on the floating-point environment
 * (MXCSR / FPCR rounding mode, flush-to-zero, default-NaN).  All functions
 * are thread-safe. */
#ifndef APRFAST_HALF_H
#define APRFAST_HALF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum apr_half_path {
    APR_HALF_AUTO = -1,        /* best path this CPU can run */
    APR_HALF_PORTABLE = 0,     /* integer C, any CPU */
    APR_HALF_F16C_AVX2 = 1,    /* x86-64 F16C + AVX2 (bf16 in integer AVX2) */
    APR_HALF_AVX512 = 2,       /* x86-64 AVX-512 F/BW/VL (bf16 in integer AVX-512) */
    APR_HALF_AVX512_BF16 = 3,  /* AVX-512 plus VCVTNEPS2BF16 for f32 -> bf16 */
    APR_HALF_NEON = 4          /* AArch64 Advanced SIMD */
};
#define APR_HALF_PATH_COUNT 5

/* Convert n elements on the given path, split over up to nthreads threads
 * when n is large enough to gain from it (nthreads <= 0: all online cores,
 * 1: only the calling thread).  A path this CPU cannot run (or an unknown
 * number) falls back to the portable path, so the result is always right. */
void apr_f32_to_f16(int path, const float *src, uint16_t *dst, size_t n, int nthreads);
void apr_f16_to_f32(int path, const uint16_t *src, float *dst, size_t n, int nthreads);
void apr_f32_to_bf16(int path, const float *src, uint16_t *dst, size_t n, int nthreads);
void apr_bf16_to_f32(int path, const uint16_t *src, float *dst, size_t n, int nthreads);

/* 1 if this CPU (and OS) can run path, else 0.  AUTO and PORTABLE are always 1. */
int apr_half_path_available(int path);

/* The path AUTO resolves to. */
int apr_half_best_path(void);

/* "portable", "f16c-avx2", "avx512", "avx512-bf16", "neon"; "auto" for AUTO
 * and "unknown" for anything else. */
const char *apr_half_path_name(int path);

/* Threads used for nthreads <= 0: the online cores (at most 64). */
int apr_half_default_threads(void);

#ifdef __cplusplus
}
#endif
#endif
