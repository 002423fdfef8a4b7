/* Block quantization kernels: GGML types (bit-identical to llama.cpp's gguf-py)
 * and aprender's own APR types, with run-time choice of SIMD path.
 *
 * Every function works on little-endian block bytes and float32 values, and
 * gives the same bits on every path and for every thread count.  Results
 * assume the default floating-point environment (round to nearest, no
 * flush-to-zero), as NumPy and Rust do.  All functions are thread-safe;
 * source and destination must not overlap.
 *
 * Byte layouts (n = element count):
 *
 *   Q8_0      blocks of 32: f16 d | 32 x i8                          34 B
 *   Q4_0      blocks of 32: f16 d | 16 B nibbles (j low, j+16 high)   18 B
 *   Q4_1      blocks of 32: f16 d | f16 m | 16 B nibbles              20 B
 *   Q5_0      blocks of 32: f16 d | u32 qh | 16 B nibbles             22 B
 *   Q5_1      blocks of 32: f16 d | f16 m | u32 qh | 16 B nibbles     24 B
 *   Q4_K      blocks of 256: f16 d | f16 dmin | 12 B scales | 128 B  144 B
 *   Q6_K      blocks of 256: 128 B ql | 64 B qh | 16 x i8 | f16 d   210 B
 *   APR_Q8    f32 scale | n x i8; n == 0 gives 0 bytes          4 + n B
 *   APR_Q4    blocks of 32, last one may be partial: f16 scale |
 *             16 B nibbles (element 2k low, 2k+1 high)     ceil(n/32)*18 B
 *   Q8_TENSOR f32 scale | i32 zero_point | n x i8; n == 0 gives 0 bytes
 *             (x ~= (q - zero_point) * scale; rules in quant.c)   8 + n B
 *   APR_FQ8_0 aprender format::quantize Q8_0: as Q8_0, last block may be
 *             partial (zero bytes after the data)          ceil(n/32)*34 B
 *   APR_FQ4_0 aprender format::quantize Q4_0: as APR_Q4 but the nibbles of
 *             a partial block's missing elements are 8     ceil(n/32)*18 B
 *   Q8_1, Q2_K, Q3_K, Q5_K, Q8_K, IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL,
 *   IQ3_S, IQ2_S, IQ4_XS, IQ1_M, TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0:
 *             GGML blocks (layouts in quant_ggml.h)
 *
 * Quantize: Q8_0, Q4_0, Q4_1 here; Q5_0, Q5_1, TQ1_0, TQ2_0, MXFP4 (gguf-py's) and
 * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, IQ4_XS, IQ3_S, Q1_0 (ggml's reference) in
 * quantize_ggml.c; the APR types here.
 *
 * The GGML types need n to be a multiple of their block size. */
#ifndef APRFAST_QUANT_H
#define APRFAST_QUANT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum apr_quant_type {
    APR_QT_Q8_0 = 0,
    APR_QT_Q4_0 = 1,
    APR_QT_Q4_1 = 2,
    APR_QT_Q5_0 = 3,
    APR_QT_Q5_1 = 4,
    APR_QT_Q4_K = 5,
    APR_QT_Q6_K = 6,
    APR_QT_APR_Q8 = 7,
    APR_QT_APR_Q4 = 8,
    APR_QT_Q8_TENSOR = 9,
    APR_QT_APR_FQ8_0 = 10,
    APR_QT_APR_FQ4_0 = 11,
    /* The other GGML types (csrc/quant_ggml.h has their layouts), in GGML id order. */
    APR_QT_Q8_1 = 12,
    APR_QT_Q2_K = 13,
    APR_QT_Q3_K = 14,
    APR_QT_Q5_K = 15,
    APR_QT_Q8_K = 16,
    APR_QT_IQ2_XXS = 17,
    APR_QT_IQ2_XS = 18,
    APR_QT_IQ3_XXS = 19,
    APR_QT_IQ1_S = 20,
    APR_QT_IQ4_NL = 21,
    APR_QT_IQ3_S = 22,
    APR_QT_IQ2_S = 23,
    APR_QT_IQ4_XS = 24,
    APR_QT_IQ1_M = 25,
    APR_QT_TQ1_0 = 26,
    APR_QT_TQ2_0 = 27,
    APR_QT_MXFP4 = 28,
    APR_QT_NVFP4 = 29,
    APR_QT_Q1_0 = 30
};
#define APR_QT_COUNT 31

enum apr_quant_path {
    APR_QUANT_AUTO = -1,     /* best path this CPU can run */
    APR_QUANT_PORTABLE = 0,  /* plain C, any CPU */
    APR_QUANT_AVX2 = 1,      /* x86-64 AVX2 */
    APR_QUANT_AVX512 = 2     /* x86-64 AVX-512 F/BW/VL */
};
#define APR_QUANT_PATH_COUNT 3

/* Return codes. */
#define APR_QUANT_OK 0
#define APR_QUANT_EUNKNOWN (-1)     /* not a type number */
#define APR_QUANT_ENOQUANTIZE (-2)  /* the type can only be dequantized */
#define APR_QUANT_EBADCOUNT (-3)    /* n is not a whole number of blocks */

/* "Q8_0", "Q4_0", ... as in the table above; NULL for an unknown number. */
const char *apr_quant_type_name(int type);

/* Elements and bytes of one block.  Per-tensor types (APR_Q8, Q8_TENSOR)
 * report 1 element in 1 byte; their header is apr_quant_header_bytes. */
int apr_quant_block_info(int type, size_t *block_elems, size_t *block_bytes);

/* Bytes before the first block: 4 for APR_Q8, 8 for Q8_TENSOR, 0 otherwise
 * and whenever n == 0. */
size_t apr_quant_header_bytes(int type, size_t n);

/* 1 if the type's last block may be partial (APR_Q4, APR_FQ8_0, APR_FQ4_0). */
int apr_quant_allows_partial_block(int type);

/* 1 if apr_quantize supports the type. */
int apr_quant_can_quantize(int type);

/* Bytes that n elements take; SIZE_MAX if n is not allowed for the type (or
 * the size does not fit a size_t). */
size_t apr_quant_nbytes(int type, size_t n);

/* Quantize n floats from src into apr_quant_nbytes(type, n) bytes at dst.
 * Work is split by whole blocks over up to nthreads threads when n is large
 * (nthreads <= 0: all online cores; 1: the calling thread only).  A path this
 * CPU cannot run (or an unknown number) runs the portable path.  Returns
 * APR_QUANT_OK or a negative code, in which case nothing was written. */
int apr_quantize(int type, const float *src, size_t n, uint8_t *dst, int nthreads, int path);

/* Dequantize the apr_quant_nbytes(type, n) bytes at src into n floats at dst.
 * Same threads, path and return codes. */
int apr_dequantize(int type, const uint8_t *src, size_t n, float *dst, int nthreads, int path);

/* 1 if this CPU (and OS) can run path, else 0.  AUTO and PORTABLE are always 1. */
int apr_quant_path_available(int path);

/* The path AUTO resolves to. */
int apr_quant_best_path(void);

/* "portable", "avx2", "avx512"; "auto" for AUTO and "unknown" otherwise. */
const char *apr_quant_path_name(int path);

/* Threads used for nthreads <= 0: the online cores (at most 64). */
int apr_quant_default_threads(void);

#ifdef __cplusplus
}
#endif
#endif
