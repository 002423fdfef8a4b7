/* Dequantizers of the GGML block types beyond quant.c's own (see quant_ggml.h).
 *
 * Oracle: gguf-py's NumPy dequantize_blocks, whose float32 operations each
 * kernel repeats in the same order, one rounding each (the build has no FMA
 * contraction: -std=c99, see quant.c).  That fixes the bits for every input,
 * NaN and infinite scales included:
 *
 *  - a product such as d * q or (db * grid) * sign has one NaN operand at
 *    most, and the hardware returns it quieted, as NumPy's does;
 *  - d * q - m keeps the operand order, so of two NaNs the first wins;
 *  - gguf-py multiplies by a float sign of +-1.0.  C compilers may turn x *
 *    -1.0f into -x, which flips a NaN's sign where the multiply would not, so
 *    the sign is applied as signed8() below: negation, except for NaN.
 *
 * Q8_1, Q8_K and Q1_0, which gguf-py cannot dequantize, follow ggml's
 * dequantize_row_* (Q8_1 has none there: d * q, its sum s unused).
 *
 * The bodies are written for the compiler to vectorize (the IQ groups of 8 with
 * SSE2 intrinsics where there are, below) and are stamped out once per path
 * (portable, AVX2, AVX-512): the same arithmetic on wider registers.  Q3_K and
 * the 16-value codebook types have hand-written AVX2/AVX-512 kernels instead on
 * those two paths (pshufb lookups; see "Hand-written" below), the same floats. */

#include "quant_ggml.h"
#include "quant.h"
#include "iq_grids.h"

#include <string.h>

#include "kernel_targets.h"

#define QK 32
#define QK_K 256

/* float16 bits -> float32, exact; a NaN's payload moves up 13 bits (NumPy; the
 * same function as quant.c's). */
static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1fu)
        return bits_f32(sign | 0x7f800000u | mant << 13);
    if (exp != 0)
        return bits_f32(sign | (exp + 112u) << 23 | mant << 13);
    float v = (float)mant * 5.9604644775390625e-8f;
    return sign ? -v : v;
}

/* ---- Groups of 8 values of the IQ types ----------------------------------
 * The IQ2/IQ3 types give y = (db * grid) * sign, sign +-1.0: their grids hold no 0,
 * so db * grid is a NaN exactly when db is one, and a multiply by -1.0 returns a NaN
 * as it is (quiet already, being a product) and flips the sign of anything else.
 * The sign is therefore a XOR of the sign bit, with `flip` = 0x80000000 for a
 * number db and 0 for a NaN db, decided once per scale instead of once per value
 * (C compilers may turn x * -1.0f into -x, which flips a NaN's sign where the
 * multiply does not, so the multiply is never written out).
 *
 * On x86-64 the 8 values are two SSE2 registers (SSE2 is in every x86-64 CPU, so
 * the portable kernels use them too; in the AVX2/AVX-512 kernels the compiler
 * encodes them with VEX).  The compilers leave these 8-wide loops scalar (about 3x
 * slower), and the GNU vector extensions zero-extend bytes one at a time; other
 * CPUs take the loops. */

/* APR_NO_SSE2_GROUPS builds the loops instead, to test them on x86-64. */
#if (defined(__x86_64__) || defined(_M_X64)) && !defined(APR_NO_SSE2_GROUPS)
#include <emmintrin.h>
#define HAVE_SSE2_GROUPS 1
#endif

static inline uint32_t sign_flip(float db)
{
    return db == db ? 0x80000000u : 0u;
}

/* y[j] = db * g[j] (g[0..3] from lo, g[4..7] from hi), sign bit XOR flip where bit
 * j of signs is set. */
static ALWAYS_INLINE void signed8(float *restrict y, const uint8_t *lo, const uint8_t *hi, float db, uint32_t signs,
                                  uint32_t flip)
{
#ifdef HAVE_SSE2_GROUPS
    uint32_t w0, w1;
    memcpy(&w0, lo, 4);
    memcpy(&w1, hi, 4);
    const __m128i zero = _mm_setzero_si128();
    const __m128i b16 = _mm_unpacklo_epi8(_mm_unpacklo_epi32(_mm_cvtsi32_si128((int)w0), _mm_cvtsi32_si128((int)w1)),
                                          zero);
    const __m128 scale = _mm_set1_ps(db);
    const __m128 v0 = _mm_mul_ps(scale, _mm_cvtepi32_ps(_mm_unpacklo_epi16(b16, zero)));
    const __m128 v1 = _mm_mul_ps(scale, _mm_cvtepi32_ps(_mm_unpackhi_epi16(b16, zero)));
    const __m128i all = _mm_set1_epi32((int)signs), f = _mm_set1_epi32((int)flip);
    const __m128i bit0 = _mm_setr_epi32(1, 2, 4, 8), bit1 = _mm_setr_epi32(16, 32, 64, 128);
    const __m128i m0 = _mm_and_si128(_mm_cmpeq_epi32(_mm_and_si128(all, bit0), bit0), f);
    const __m128i m1 = _mm_and_si128(_mm_cmpeq_epi32(_mm_and_si128(all, bit1), bit1), f);
    _mm_storeu_si128((__m128i *)y, _mm_xor_si128(_mm_castps_si128(v0), m0));
    _mm_storeu_si128((__m128i *)(y + 4), _mm_xor_si128(_mm_castps_si128(v1), m1));
#else
    /* 0 - bit: all ones or none, a mask rather than a (mispredicted) branch */
    for (int j = 0; j < 4; j++) {
        y[j] = bits_f32(f32_bits(db * (float)lo[j]) ^ ((0u - ((signs >> j) & 1u)) & flip));
        y[j + 4] = bits_f32(f32_bits(db * (float)hi[j]) ^ ((0u - ((signs >> (j + 4)) & 1u)) & flip));
    }
#endif
}

/* IQ1_S/IQ1_M's delta: 0.125 with the sign bit `sign` (0 or 0x80000000), shifted
 * there from the block's bit, not chosen (the bits are random data, a mispredicted
 * branch costs more than the 8 values, and compilers turn a ?: of two constants
 * into one). */
static inline float iq1_delta(uint32_t sign)
{
    return bits_f32(0x3e000000u | sign);
}

/* IQ1_S/IQ1_M: y[j] = dl * (g[j] + delta), g in {-1, 0, 1}. */
static ALWAYS_INLINE void iq1_8(float *restrict y, const int8_t *g, float dl, float delta)
{
#ifdef HAVE_SSE2_GROUPS
    /* sign-extend: each byte into the top of its lane, then an arithmetic shift */
    const __m128i b = _mm_loadl_epi64((const __m128i *)g);
    const __m128i w = _mm_unpacklo_epi8(b, b);
    const __m128 shift = _mm_set1_ps(delta), scale = _mm_set1_ps(dl);
    const __m128 g0 = _mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpacklo_epi16(w, w), 24));
    const __m128 g1 = _mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpackhi_epi16(w, w), 24));
    _mm_storeu_ps(y, _mm_mul_ps(scale, _mm_add_ps(g0, shift)));
    _mm_storeu_ps(y + 4, _mm_mul_ps(scale, _mm_add_ps(g1, shift)));
#else
    for (int j = 0; j < 8; j++)
        y[j] = dl * ((float)g[j] + delta);
#endif
}

/* IQ4_NL's non-linear values, and e2m1 doubled (ggml's kvalues_iq4nl, kvalues_mxfp4). */
static const float IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static const float FP4_VALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* ---- Q8_1, Q8_K ---------------------------------------------------------- */

static ALWAYS_INLINE void q8_1_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 36, y += QK) {
        const float d = f16_to_f32(load_u16le(x));
        for (int j = 0; j < QK; j++)
            y[j] = (float)(int8_t)x[4 + j] * d;
    }
}

static ALWAYS_INLINE void q8_k_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 292, y += QK_K) {
        const float d = bits_f32(load_u32le(x));
        for (int j = 0; j < QK_K; j++)
            y[j] = d * (float)(int8_t)x[4 + j];
    }
}

/* ---- K-quants ------------------------------------------------------------ */

/* Element 128j + 32l + m is bits 2l.. of qs[32j + m]; sub-block (16 values) e / 16
 * has dl = d * (sc & 15) and ml = dmin * (sc >> 4); y = dl * q - ml. */
static ALWAYS_INLINE void q2_k_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 84, y += QK_K) {
        const float d = f16_to_f32(load_u16le(x + 80)), dmin = f16_to_f32(load_u16le(x + 82));
        const uint8_t *qs = x + 16;
        for (int j = 0; j < 2; j++) {
            for (int l = 0; l < 4; l++) {
                for (int half = 0; half < 2; half++) {
                    const uint8_t sc = x[8 * j + 2 * l + half];
                    const float dl = d * (float)(sc & 0x0F), ml = dmin * (float)(sc >> 4);
                    float *yy = y + 128 * j + 32 * l + 16 * half;
                    const uint8_t *q = qs + 32 * j + 16 * half;
                    for (int m = 0; m < 16; m++) {
                        float v = dl * (float)((q[m] >> (2 * l)) & 3);
                        yy[m] = v - ml;
                    }
                }
            }
        }
    }
}

/* 16 signed 6-bit scales: low 4 bits from s[0..7] (nibble k of byte i is scale
 * 8k + i), high 2 bits from s[8..11] (bits 2k.. of byte 8 + i are scale 4k + i). */
static inline void q3_k_scales(const uint8_t *s, int scale[16])
{
    for (int j = 0; j < 16; j++) {
        int low = (s[j % 8] >> (4 * (j / 8))) & 0x0F;
        int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        scale[j] = (low | high << 4) - 32;
    }
}

/* Element e = 128j + 32l + m: q = bits 2l.. of qs[32j + m], minus 4 unless bit
 * (4j + l) of hmask[m] is set; y = (d * scale[e / 16]) * q.  q is written as the
 * 3-bit (low | high << 2) - 4, no choice per value, so the loops vectorize. */
static ALWAYS_INLINE void q3_k_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 110, y += QK_K) {
        const float d = f16_to_f32(load_u16le(x + 108));
        int scale[16];
        q3_k_scales(x + 96, scale);
        const uint8_t *hmask = x, *qs = x + 32;
        for (int j = 0; j < 2; j++) {
            for (int l = 0; l < 4; l++) {
                const int bit = 4 * j + l;
                for (int half = 0; half < 2; half++) {
                    const float dl = d * (float)scale[8 * j + 2 * l + half];
                    float *yy = y + 128 * j + 32 * l + 16 * half;
                    const uint8_t *q = qs + 32 * j + 16 * half, *h = hmask + 16 * half;
                    for (int m = 0; m < 16; m++) {
                        int v = (int)(((q[m] >> (2 * l)) & 3) | ((h[m] >> bit) & 1) << 2) - 4;
                        yy[m] = dl * (float)v;
                    }
                }
            }
        }
    }
}

/* llama.cpp get_scale_min_k4 (as quant.c's q4_k_scales_mins). */
static inline void k_scales_mins(const uint8_t *s, uint8_t sc[8], uint8_t mn[8])
{
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (uint8_t)((s[j + 8] & 0x0F) | (s[j] >> 6) << 4);
        mn[j + 4] = (uint8_t)((s[j + 8] >> 4) | (s[j + 4] >> 6) << 4);
    }
}

/* As Q4_K, plus a fifth bit: bit g of qh[m] for element 32g + m.  Sub-blocks 2p
 * and 2p + 1 share their bytes of qs (low and high nibbles) and go in one loop, as
 * quant.c's Q4_K does: one pass over the bytes, two stores. */
static ALWAYS_INLINE void q5_k_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 176, y += QK_K) {
        const float d = f16_to_f32(load_u16le(x)), dmin = f16_to_f32(load_u16le(x + 2));
        uint8_t sc[8], mn[8];
        k_scales_mins(x + 4, sc, mn);
        const uint8_t *qh = x + 16, *qs = x + 48;
        for (int p = 0; p < 4; p++) {
            const float d1 = d * (float)sc[2 * p], m1 = dmin * (float)mn[2 * p];
            const float d2 = d * (float)sc[2 * p + 1], m2 = dmin * (float)mn[2 * p + 1];
            const uint8_t *q = qs + 32 * p;
            float *yy = y + 64 * p;
            for (int m = 0; m < 32; m++) {
                float lo = d1 * (float)((q[m] & 0x0F) | ((qh[m] >> (2 * p)) & 1) << 4);
                float hi = d2 * (float)((q[m] >> 4) | ((qh[m] >> (2 * p + 1)) & 1) << 4);
                yy[m] = lo - m1;
                yy[m + 32] = hi - m2;
            }
        }
    }
}

/* ---- IQ types ------------------------------------------------------------ */

/* IQ2_XXS: per 32 values, 4 grid bytes then a u32 of four 7-bit sign indices and a
 * 4-bit scale; db = (d * (0.5 + s)) * 0.25, y = (db * grid) * sign. */
static ALWAYS_INLINE void iq2_xxs_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 66, y += QK_K) {
        const float d = f16_to_f32(load_u16le(x));
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = x + 2 + 8 * ib;
            const uint32_t aux = load_u32le(q + 4);
            const float db = d * (0.5f + (float)(aux >> 28)) * 0.25f;
            const uint32_t flip = sign_flip(db);
            for (int l = 0; l < 4; l++) {
                const uint8_t *grid = apr_iq2_xxs_grid[q[l]];
                signed8(y + 32 * ib + 8 * l, grid, grid + 4, db, apr_iq_ksigns[(aux >> (7 * l)) & 127], flip);
            }
        }
    }
}

/* IQ2_XS: 32 u16 of a 9-bit grid index and a 7-bit sign index; a 4-bit scale per 16. */
static ALWAYS_INLINE void iq2_xs_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 74, y += QK_K) {
        const float d = f16_to_f32(load_u16le(x));
        const uint8_t *scales = x + 66;
        for (int ib = 0; ib < 8; ib++) {
            const float db0 = d * (0.5f + (float)(scales[ib] & 0x0F)) * 0.25f;
            const float db1 = d * (0.5f + (float)(scales[ib] >> 4)) * 0.25f;
            const uint32_t flip0 = sign_flip(db0), flip1 = sign_flip(db1);
            for (int l = 0; l < 4; l++) {
                const uint16_t v = load_u16le(x + 2 + 2 * (4 * ib + l));
                const uint8_t *grid = apr_iq2_xs_grid[v & 511];
                signed8(y + 32 * ib + 8 * l, grid, grid + 4, l < 2 ? db0 : db1, apr_iq_ksigns[v >> 9],
                        l < 2 ? flip0 : flip1);
            }
        }
    }
}

/* IQ2_S: 10-bit grid indices (8 bits in qs, 2 in qh), one sign byte each; a 4-bit
 * scale per 16. */
static ALWAYS_INLINE void iq2_s_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 82, y += QK_K) {
        const float d = f16_to_f32(load_u16le(x));
        const uint8_t *qs = x + 2, *signs = x + 34, *qh = x + 66, *scales = x + 74;
        for (int ib = 0; ib < 8; ib++) {
            const float db0 = d * (0.5f + (float)(scales[ib] & 0x0F)) * 0.25f;
            const float db1 = d * (0.5f + (float)(scales[ib] >> 4)) * 0.25f;
            const uint32_t flip0 = sign_flip(db0), flip1 = sign_flip(db1);
            for (int l = 0; l < 4; l++) {
                const int i = 4 * ib + l;
                const uint8_t *grid = apr_iq2_s_grid[qs[i] | ((qh[ib] >> (2 * l)) & 3) << 8];
                signed8(y + 8 * i, grid, grid + 4, l < 2 ? db0 : db1, signs[i], l < 2 ? flip0 : flip1);
            }
        }
    }
}

/* IQ3_XXS: 64 grid bytes (4 values each), per 32 values a u32 of four sign indices
 * and a 4-bit scale; db = (d * (0.5 + s)) * 0.5. */
static ALWAYS_INLINE void iq3_xxs_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 98, y += QK_K) {
        const float d = f16_to_f32(load_u16le(x));
        const uint8_t *qs = x + 2;
        for (int ib = 0; ib < 8; ib++) {
            const uint32_t aux = load_u32le(x + 66 + 4 * ib);
            const float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
            const uint32_t flip = sign_flip(db);
            for (int l = 0; l < 4; l++)
                signed8(y + 32 * ib + 8 * l, apr_iq3_xxs_grid[qs[8 * ib + 2 * l]],
                        apr_iq3_xxs_grid[qs[8 * ib + 2 * l + 1]], db, apr_iq_ksigns[(aux >> (7 * l)) & 127], flip);
        }
    }
}

/* IQ3_S: 9-bit grid indices (8 bits in qs, 1 in qh), sign bytes, a 4-bit scale per
 * 32: db = d * (1 + 2s). */
static ALWAYS_INLINE void iq3_s_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 110, y += QK_K) {
        const float d = f16_to_f32(load_u16le(x));
        const uint8_t *qs = x + 2, *qh = x + 66, *signs = x + 74, *scales = x + 106;
        for (int ib = 0; ib < 8; ib++) {
            const float db = d * (float)(1 + 2 * ((scales[ib / 2] >> (4 * (ib % 2))) & 0x0F));
            const uint32_t flip = sign_flip(db);
            for (int l = 0; l < 4; l++) {
                const int n = 8 * ib + 2 * l;
                const uint8_t *g1 = apr_iq3_s_grid[qs[n] | ((qh[ib] >> (2 * l)) & 1) << 8];
                const uint8_t *g2 = apr_iq3_s_grid[qs[n + 1] | ((qh[ib] >> (2 * l + 1)) & 1) << 8];
                signed8(y + 32 * ib + 8 * l, g1, g2, db, signs[4 * ib + l], flip);
            }
        }
    }
}

/* IQ1_S: 11-bit indices into a grid of -1/0/1 (8 bits in qs, 3 in qh); qh's top
 * bits give dl = d * (2s + 1) and delta = +-0.125; y = dl * (grid + delta). */
static ALWAYS_INLINE void iq1_s_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 50, y += QK_K) {
        const float d = f16_to_f32(load_u16le(x));
        const uint8_t *qs = x + 2;
        for (int ib = 0; ib < 8; ib++) {
            const uint16_t h = load_u16le(x + 34 + 2 * ib);
            const float dl = d * (float)(2 * ((h >> 12) & 7) + 1);
            const float delta = iq1_delta((uint32_t)(h & 0x8000) << 16);
            for (int l = 0; l < 4; l++)
                iq1_8(y + 32 * ib + 8 * l, apr_iq1_s_grid[qs[4 * ib + l] | ((h >> (3 * l)) & 7) << 8], dl, delta);
        }
    }
}

/* IQ1_M: IQ1_S's grid with a 3-bit scale per 16 values and a delta per 8; the f16 d
 * is the top nibbles of the four u16 scale words. */
static ALWAYS_INLINE void iq1_m_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 56, y += QK_K) {
        const uint8_t *qs = x, *qh = x + 32;
        uint16_t sc[4];
        for (int i = 0; i < 4; i++)
            sc[i] = load_u16le(x + 48 + 2 * i);
        const uint16_t dh = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) |
                                       (sc[3] & 0xF000));
        const float d = f16_to_f32(dh);
        for (int k = 0; k < 16; k++) {
            const float dl = d * (float)(2 * ((sc[k / 4] >> (3 * (k % 4))) & 7) + 1);
            const uint8_t h = qh[k]; /* low nibble: group 2k, high nibble: group 2k + 1 */
            iq1_8(y + 16 * k, apr_iq1_s_grid[qs[2 * k] | (h & 7) << 8], dl,
                  iq1_delta((uint32_t)(h & 0x08) << 28));
            iq1_8(y + 16 * k + 8, apr_iq1_s_grid[qs[2 * k + 1] | ((h >> 4) & 7) << 8], dl,
                  iq1_delta((uint32_t)(h & 0x80) << 24));
        }
    }
}

static ALWAYS_INLINE void iq4_nl_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 18, y += QK) {
        const float d = f16_to_f32(load_u16le(x));
        for (int j = 0; j < 16; j++)
            y[j] = d * IQ4_VALUES[x[2 + j] & 0x0F];
        for (int j = 0; j < 16; j++)
            y[j + 16] = d * IQ4_VALUES[x[2 + j] >> 4];
    }
}

/* IQ4_XS: IQ4_NL's values with a 6-bit scale (minus 32) per 32 values. */
static ALWAYS_INLINE void iq4_xs_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 136, y += QK_K) {
        const float d = f16_to_f32(load_u16le(x));
        const uint16_t scales_h = load_u16le(x + 2);
        const uint8_t *scales_l = x + 4, *qs = x + 8;
        for (int ib = 0; ib < 8; ib++) {
            const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F) | ((scales_h >> (2 * ib)) & 3) << 4;
            const float dl = d * (float)(ls - 32);
            const uint8_t *q = qs + 16 * ib;
            float *yy = y + 32 * ib;
            for (int j = 0; j < 16; j++)
                yy[j] = dl * IQ4_VALUES[q[j] & 0x0F];
            for (int j = 0; j < 16; j++)
                yy[j + 16] = dl * IQ4_VALUES[q[j] >> 4];
        }
    }
}

/* ---- Ternary ------------------------------------------------------------- */

/* TQ1_0: five base-3 digits a byte: digit n of byte q is ((q * 3^n mod 256) * 3) >> 8.
 * qs[0..31] fill elements 32n + m, qs[32..47] 160 + 16n + m, qh[0..3] 240 + 4n + m. */
static ALWAYS_INLINE void tq1_0_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    for (size_t b = 0; b < nb; b++, x += 54, y += QK_K) {
        const float d = f16_to_f32(load_u16le(x + 52));
        for (int n = 0; n < 5; n++) {
            for (int m = 0; m < 32; m++) {
                uint8_t q = (uint8_t)(x[m] * pow3[n]);
                y[32 * n + m] = d * (float)((int)((uint16_t)q * 3 >> 8) - 1);
            }
            for (int m = 0; m < 16; m++) {
                uint8_t q = (uint8_t)(x[32 + m] * pow3[n]);
                y[160 + 16 * n + m] = d * (float)((int)((uint16_t)q * 3 >> 8) - 1);
            }
        }
        for (int n = 0; n < 4; n++) {
            for (int m = 0; m < 4; m++) {
                uint8_t q = (uint8_t)(x[48 + m] * pow3[n]);
                y[240 + 4 * n + m] = d * (float)((int)((uint16_t)q * 3 >> 8) - 1);
            }
        }
    }
}

/* TQ2_0: element 128j + 32l + m is bits 2l.. of qs[32j + m], minus 1. */
static ALWAYS_INLINE void tq2_0_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 66, y += QK_K) {
        const float d = f16_to_f32(load_u16le(x + 64));
        for (int j = 0; j < 2; j++)
            for (int l = 0; l < 4; l++)
                for (int m = 0; m < 32; m++)
                    y[128 * j + 32 * l + m] = d * (float)(((x[32 * j + m] >> (2 * l)) & 3) - 1);
    }
}

/* ---- FP4 and Q1_0 -------------------------------------------------------- */

/* ggml_e8m0_to_fp32_half: 2^(e - 128), a subnormal below e = 2. */
static inline float e8m0_half(uint8_t e)
{
    return bits_f32(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

/* ggml_ue4m3_to_fp32: half an unsigned e4m3 (bias 7); 0x7F reads as 0 (0xFF, as
 * ggml, does not), the top bit is otherwise ignored.  (8 + m) * 2^(e - 11), or
 * m * 2^-10 for e = 0 (so 0 and 0x80 are 0): exact. */
static inline float ue4m3_half(uint8_t x)
{
    /* Without a branch (the scale bytes are data, a mispredicted branch costs more
     * than the 16 values): e = 0 reads as (0 + m) * 2^(1 - 11), the same number. */
    const uint32_t e = (x >> 3) & 0x0Fu, m = x & 7u, sub = e == 0;
    const float v = (float)(m | (sub ^ 1u) << 3) * bits_f32((e + sub - 11u + 127u) << 23);
    return x == 0x7F ? 0.0f : v;
}

static ALWAYS_INLINE void mxfp4_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 17, y += QK) {
        const float d = e8m0_half(x[0]);
        for (int j = 0; j < 16; j++)
            y[j] = d * FP4_VALUES[x[1 + j] & 0x0F];
        for (int j = 0; j < 16; j++)
            y[j + 16] = d * FP4_VALUES[x[1 + j] >> 4];
    }
}

/* NVFP4: four 16-value sub-blocks, each the low nibbles of its 8 bytes, then the high ones. */
static ALWAYS_INLINE void nvfp4_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 36, y += 64) {
        for (int s = 0; s < 4; s++) {
            const float d = ue4m3_half(x[s]);
            const uint8_t *q = x + 4 + 8 * s;
            for (int j = 0; j < 8; j++)
                y[16 * s + j] = d * FP4_VALUES[q[j] & 0x0F];
            for (int j = 0; j < 8; j++)
                y[16 * s + 8 + j] = d * FP4_VALUES[q[j] >> 4];
        }
    }
}

/* Q1_0 (ggml dequantize_row_q1_0): bit j, lowest first, selects d (1) or -d (0). */
static ALWAYS_INLINE void q1_0_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 18, y += 128) {
        /* -d is d with its sign bit flipped, NaN included: set bits keep it. */
        const uint32_t neg_d = f32_bits(f16_to_f32(load_u16le(x))) ^ 0x80000000u;
        for (int j = 0; j < 128; j++)
            y[j] = bits_f32(neg_d ^ (uint32_t)((x[2 + j / 8] >> (j % 8)) & 1) << 31);
    }
}

/* ---- Hand-written AVX2 / AVX-512 kernels --------------------------------
 * Q3_K and the 16-entry codebook types (IQ4_NL, IQ4_XS, MXFP4, NVFP4) on the two
 * x86 vector paths; the portable path keeps the loops above.  From those loops the
 * compilers make partly scalar code (Q3_K's 2 + 1 bits and scales) and a scalar
 * load of a float table per value (the codebooks), 11-18 GB/s; written out, Q3_K's
 * bytes are assembled 32 at a time and its 16 scales decoded in one vector, and a
 * codebook lookup is a byte shuffle (pshufb) of the codebook's int8 values, each then
 * widened to a float and multiplied by the scale: the same float32 product, scale *
 * value with one rounding (the values are integers, exact as floats; the one NaN a
 * product can meet is the scale's, returned quieted in either operand order), so the
 * floats are the loops' bit for bit.  Only the widening and the stores differ between
 * AVX2 and AVX-512, so each kernel is stamped out twice (as quant.c's). */
#ifdef HAVE_X86_KERNELS
#include <immintrin.h>

/* 16 signed bytes -> 16 floats, s * q. */
static TARGET_AVX2 inline void mul16_avx2(float *y, __m128i q, __m256 s)
{
    _mm256_storeu_ps(y, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)))));
}

static TARGET_AVX512 inline void mul16_avx512(float *y, __m128i q, __m512 s)
{
    _mm512_storeu_ps(y, _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q))));
}

/* Q3_K's d * scale[k], k = 0..15 (q3_k_scales' bits, the products as q3_k_body's). */
static TARGET_AVX2 inline void q3_k_dl(const uint8_t *s, float d, float dl[16])
{
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m128i s8 = _mm_loadl_epi64((const __m128i *)s);
    const __m128i low = _mm_unpacklo_epi64(_mm_and_si128(s8, m4), _mm_and_si128(_mm_srli_epi16(s8, 4), m4));
    /* lane k of the u32 s[8..11] shifted right by 2k: byte i's bits 2k.. are scale 4k + i's */
    const __m128i high = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)load_u32le(s + 8)), _mm_setr_epi32(0, 2, 4, 6)),
                                       _mm_set1_epi8(3));
    const __m128i sc = _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(high, 4)), _mm_set1_epi8(32));
    const __m256 vd = _mm256_set1_ps(d);
    _mm256_storeu_ps(dl, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
    _mm256_storeu_ps(dl + 8, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
}

/* IQ4_XS's d * (ls - 32) for its 8 groups of 32 (iq4_xs_body's). */
static TARGET_AVX2 inline void iq4_xs_dl(const uint8_t *x, float d, float dl[8])
{
    const __m128i s4 = _mm_cvtsi32_si128((int)load_u32le(x + 4));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    /* group ib's low 4 bits: nibble ib % 2 of scales_l[ib / 2] */
    const __m128i low = _mm_unpacklo_epi8(_mm_and_si128(s4, m4), _mm_and_si128(_mm_srli_epi16(s4, 4), m4));
    const __m256i high = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(load_u16le(x + 2)),
                                                            _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                          _mm256_set1_epi32(3));
    const __m256i ls = _mm256_or_si256(_mm256_cvtepu8_epi32(low), _mm256_slli_epi32(high, 4));
    _mm256_storeu_ps(dl, _mm256_mul_ps(_mm256_set1_ps(d),
                                       _mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32)))));
}

/* The codebooks as int8 for pshufb (IQ4_VALUES, FP4_VALUES). */
#define IQ4_BYTES -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113
#define FP4_BYTES 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12

/* The 32 values of 16 nibble bytes: low nibbles first, then high (IQ4_NL, MXFP4, IQ4_XS). */
#define NIBBLES32(MUL16, y, tab, v, s)                                                                  \
    do {                                                                                                \
        const __m128i m4_ = _mm_set1_epi8(0x0F);                                                        \
        MUL16((y), _mm_shuffle_epi8((tab), _mm_and_si128((v), m4_)), (s));                              \
        MUL16((y) + 16, _mm_shuffle_epi8((tab), _mm_and_si128(_mm_srli_epi16((v), 4), m4_)), (s));      \
    } while (0)

#define DEFINE_HAND_KERNELS(SUFFIX, TARGET, SET1, MUL16)                                                 \
    static TARGET void q3_k_##SUFFIX(const uint8_t *x, float *y, size_t nb)                             \
    {                                                                                                   \
        const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);                             \
        for (size_t b = 0; b < nb; b++, x += 110, y += QK_K) {                                          \
            float dl[16];                                                                               \
            q3_k_dl(x + 96, f16_to_f32(load_u16le(x + 108)), dl);                                       \
            const __m256i hm = _mm256_loadu_si256((const __m256i *)x);                                  \
            for (int j = 0; j < 2; j++) {                                                               \
                __m256i qs = _mm256_loadu_si256((const __m256i *)(x + 32 + 32 * j));                    \
                for (int l = 0; l < 4; l++, qs = _mm256_srli_epi16(qs, 2)) {                            \
                    /* bits 2l.. of each byte (shifted down l times), 4 where the hmask bit is set */   \
                    const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * j + l)));                     \
                    const __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), four); \
                    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(qs, m3), high), four); \
                    MUL16(y + 128 * j + 32 * l, _mm256_castsi256_si128(q), SET1(dl[8 * j + 2 * l]));     \
                    MUL16(y + 128 * j + 32 * l + 16, _mm256_extracti128_si256(q, 1), SET1(dl[8 * j + 2 * l + 1])); \
                }                                                                                       \
            }                                                                                           \
        }                                                                                               \
    }                                                                                                   \
    static TARGET void iq4_nl_##SUFFIX(const uint8_t *x, float *y, size_t nb)                           \
    {                                                                                                   \
        const __m128i tab = _mm_setr_epi8(IQ4_BYTES);                                                   \
        for (size_t b = 0; b < nb; b++, x += 18, y += QK)                                               \
            NIBBLES32(MUL16, y, tab, _mm_loadu_si128((const __m128i *)(x + 2)), SET1(f16_to_f32(load_u16le(x)))); \
    }                                                                                                   \
    static TARGET void mxfp4_##SUFFIX(const uint8_t *x, float *y, size_t nb)                            \
    {                                                                                                   \
        const __m128i tab = _mm_setr_epi8(FP4_BYTES);                                                   \
        for (size_t b = 0; b < nb; b++, x += 17, y += QK)                                               \
            NIBBLES32(MUL16, y, tab, _mm_loadu_si128((const __m128i *)(x + 1)), SET1(e8m0_half(x[0]))); \
    }                                                                                                   \
    static TARGET void iq4_xs_##SUFFIX(const uint8_t *x, float *y, size_t nb)                           \
    {                                                                                                   \
        const __m128i tab = _mm_setr_epi8(IQ4_BYTES);                                                   \
        for (size_t b = 0; b < nb; b++, x += 136, y += QK_K) {                                          \
            float dl[8];                                                                                \
            iq4_xs_dl(x, f16_to_f32(load_u16le(x)), dl);                                                \
            for (int ib = 0; ib < 8; ib++)                                                              \
                NIBBLES32(MUL16, y + 32 * ib, tab, _mm_loadu_si128((const __m128i *)(x + 8 + 16 * ib)), SET1(dl[ib])); \
        }                                                                                               \
    }                                                                                                   \
    static TARGET void nvfp4_##SUFFIX(const uint8_t *x, float *y, size_t nb)                            \
    {                                                                                                   \
        /* sub-block s: the low nibbles of its 8 bytes, then the high ones */                           \
        const __m128i tab = _mm_setr_epi8(FP4_BYTES), m4 = _mm_set1_epi8(0x0F);                         \
        for (size_t b = 0; b < nb; b++, x += 36, y += 64) {                                             \
            for (int h = 0; h < 2; h++) {                                                               \
                const __m128i v = _mm_loadu_si128((const __m128i *)(x + 4 + 16 * h));                   \
                const __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);  \
                MUL16(y + 32 * h, _mm_shuffle_epi8(tab, _mm_unpacklo_epi64(lo, hi)), SET1(ue4m3_half(x[2 * h]))); \
                MUL16(y + 32 * h + 16, _mm_shuffle_epi8(tab, _mm_unpackhi_epi64(lo, hi)),              \
                      SET1(ue4m3_half(x[2 * h + 1])));                                                  \
            }                                                                                           \
        }                                                                                               \
    }

DEFINE_HAND_KERNELS(hand_avx2, TARGET_AVX2, _mm256_set1_ps, mul16_avx2)
DEFINE_HAND_KERNELS(hand_avx512, TARGET_AVX512, _mm512_set1_ps, mul16_avx512)
#endif /* HAVE_X86_KERNELS */

/* ---- One kernel per type and path --------------------------------------- */

#define KERNEL(NAME, SUFFIX, TARGET)                                                                    \
    static TARGET void NAME##_##SUFFIX(const uint8_t *x, float *y, size_t nb)                           \
    {                                                                                                   \
        NAME##_body(x, y, nb);                                                                          \
    }
/* The types every path compiles from the loops above, and those (HAND) the x86
 * vector paths take from the hand-written kernels instead. */
#define COMMON_KERNELS(SUFFIX, TARGET)                                                                  \
    KERNEL(q8_1, SUFFIX, TARGET)                                                                        \
    KERNEL(q2_k, SUFFIX, TARGET)                                                                        \
    KERNEL(q5_k, SUFFIX, TARGET)                                                                        \
    KERNEL(q8_k, SUFFIX, TARGET)                                                                        \
    KERNEL(iq2_xxs, SUFFIX, TARGET)                                                                     \
    KERNEL(iq2_xs, SUFFIX, TARGET)                                                                      \
    KERNEL(iq3_xxs, SUFFIX, TARGET)                                                                     \
    KERNEL(iq1_s, SUFFIX, TARGET)                                                                       \
    KERNEL(iq3_s, SUFFIX, TARGET)                                                                       \
    KERNEL(iq2_s, SUFFIX, TARGET)                                                                       \
    KERNEL(iq1_m, SUFFIX, TARGET)                                                                       \
    KERNEL(tq1_0, SUFFIX, TARGET)                                                                       \
    KERNEL(tq2_0, SUFFIX, TARGET)                                                                       \
    KERNEL(q1_0, SUFFIX, TARGET)
#define KERNEL_TABLE(SUFFIX, HAND)                                                                      \
    static const apr_ggml_blocks_fn KERNELS_##SUFFIX[] = {                                              \
        q8_1_##SUFFIX, q2_k_##SUFFIX, q3_k_##HAND, q5_k_##SUFFIX, q8_k_##SUFFIX,                        \
        iq2_xxs_##SUFFIX, iq2_xs_##SUFFIX, iq3_xxs_##SUFFIX, iq1_s_##SUFFIX, iq4_nl_##HAND,             \
        iq3_s_##SUFFIX, iq2_s_##SUFFIX, iq4_xs_##HAND, iq1_m_##SUFFIX, tq1_0_##SUFFIX,                  \
        tq2_0_##SUFFIX, mxfp4_##HAND, nvfp4_##HAND, q1_0_##SUFFIX,                                      \
    };

#define NO_TARGET
COMMON_KERNELS(portable, NO_TARGET)
KERNEL(q3_k, portable, NO_TARGET)
KERNEL(iq4_nl, portable, NO_TARGET)
KERNEL(iq4_xs, portable, NO_TARGET)
KERNEL(mxfp4, portable, NO_TARGET)
KERNEL(nvfp4, portable, NO_TARGET)
KERNEL_TABLE(portable, portable)
#ifdef HAVE_X86_KERNELS
COMMON_KERNELS(avx2, TARGET_AVX2)
KERNEL_TABLE(avx2, hand_avx2)
COMMON_KERNELS(avx512, TARGET_AVX512)
KERNEL_TABLE(avx512, hand_avx512)
#endif

#define FIRST APR_QT_Q8_1
#define COUNT (APR_QT_Q1_0 - APR_QT_Q8_1 + 1)
typedef char kernel_table_matches_quant_h[sizeof KERNELS_portable / sizeof KERNELS_portable[0] == COUNT ? 1 : -1];

apr_ggml_blocks_fn apr_ggml_dequantizer(int type, int path)
{
    if (type < FIRST || type >= FIRST + COUNT)
        return NULL;
#ifdef HAVE_X86_KERNELS
    if (path == APR_QUANT_AVX512)
        return KERNELS_avx512[type - FIRST];
    if (path == APR_QUANT_AVX2)
        return KERNELS_avx2[type - FIRST];
#else
    (void)path;
#endif
    return KERNELS_portable[type - FIRST];
}

/* IQ3_S's grid for csrc/quantize_ggml.c, which derives its search tables from it. */
const uint8_t (*apr_ggml_iq3_s_grid(void))[4]
{
    return apr_iq3_s_grid;
}
