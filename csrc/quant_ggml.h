/* Dequantizers of the GGML block types beyond quant.c's own: Q8_1, the K-quants
 * Q2_K, Q3_K, Q5_K and Q8_K, the IQ codebook types, the ternary TQ1_0/TQ2_0, the
 * FP4 types MXFP4/NVFP4 and Q1_0.  They give gguf-py's floats
 * bit for bit (gguf.quants, NumPy), and for the three gguf-py cannot dequantize
 * (Q8_1, Q8_K, Q1_0) those of ggml's dequantize_row_*.
 *
 * Byte layouts, per block (ggml-common.h):
 *
 *   Q8_1     32:  f16 d | f16 s | 32 x i8                                     36 B
 *   Q2_K     256: 16 B scales (4-bit scale, 4-bit min) | 64 B qs | f16 d | f16 dmin   84 B
 *   Q3_K     256: 32 B hmask | 64 B qs | 12 B scales | f16 d                  110 B
 *   Q5_K     256: f16 d | f16 dmin | 12 B scales | 32 B qh | 128 B qs         176 B
 *   Q8_K     256: f32 d | 256 x i8 | 16 x i16 sums                            292 B
 *   IQ2_XXS  256: f16 d | 8 x (4 grid bytes, u32 signs+scale)                  66 B
 *   IQ2_XS   256: f16 d | 32 x u16 (9-bit grid, 7-bit signs) | 8 B scales      74 B
 *   IQ3_XXS  256: f16 d | 64 grid bytes | 8 x u32 signs+scale                  98 B
 *   IQ1_S    256: f16 d | 32 B qs | 8 x u16 qh                                 50 B
 *   IQ4_NL   32:  f16 d | 16 B nibbles                                         18 B
 *   IQ3_S    256: f16 d | 64 B qs | 8 B qh | 32 B signs | 4 B scales          110 B
 *   IQ2_S    256: f16 d | 32 B qs | 32 B signs | 8 B qh | 8 B scales           82 B
 *   IQ4_XS   256: f16 d | u16 scales_h | 4 B scales_l | 128 B nibbles         136 B
 *   IQ1_M    256: 32 B qs | 16 B qh | 4 x u16 scales (f16 d in the top nibbles)  56 B
 *   TQ1_0    256: 48 B base-3 qs | 4 B qh | f16 d                              54 B
 *   TQ2_0    256: 64 B 2-bit qs | f16 d                                        66 B
 *   MXFP4    32:  e8m0 e | 16 B e2m1 nibbles                                   17 B
 *   NVFP4    64:  4 x ue4m3 d | 32 B e2m1 nibbles                              36 B
 *   Q1_0     128: f16 d | 16 B sign bits                                       18 B
 *
 * docs/FORMAT.md says which element each bit feeds and in which order the float
 * operations run. */
#ifndef APRFAST_QUANT_GGML_H
#define APRFAST_QUANT_GGML_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Dequantize nblocks whole blocks at x into nblocks x block elements at y. */
typedef void (*apr_ggml_blocks_fn)(const uint8_t *x, float *y, size_t nblocks);

/* The kernel for a quant.h type number (APR_QT_Q8_1 .. APR_QT_Q1_0) on a path
 * this CPU can run (APR_QUANT_PORTABLE, _AVX2 or _AVX512; the caller resolves
 * AUTO); NULL for a type this file does not handle. */
apr_ggml_blocks_fn apr_ggml_dequantizer(int type, int path);

/* Quantize nblocks whole blocks of floats at x into nblocks blocks at y. */
typedef void (*apr_ggml_quantize_fn)(const float *x, uint8_t *y, size_t nblocks);

/* The quantizer of csrc/quantize_ggml.c for a quant.h type number (Q5_0, Q5_1,
 * TQ1_0, TQ2_0, MXFP4 as gguf-py; the K-quants, IQ4_NL, IQ4_XS, IQ3_S and Q1_0
 * as ggml's reference); NULL for a
 * type that file does not quantize.  Portable C, one path. */
apr_ggml_quantize_fn apr_ggml_quantizer(int type);

/* IQ3_S's 512-row grid (llama.cpp's iq3s_grid: four values 1, 3, ..., 15 a row, in
 * decoding order), shared by the dequantizer and the quantizer. */
const uint8_t (*apr_ggml_iq3_s_grid(void))[4];

#ifdef __cplusplus
}
#endif
#endif
