/* Quantizers of the GGML block types beyond quant.c's Q8_0, Q4_0 and Q4_1 (see
 * quant_ggml.h): Q5_0, Q5_1, TQ1_0, TQ2_0 and MXFP4 bit-identical with gguf-py's
 * NumPy quantize_blocks, and the K-quants, bit-identical with ggml's reference
 * quantizers (quantize_row_q*_K_ref, no importance matrix), which gguf-py lacks,
 * ggml's Q8_K (quantize_row_q8_K_ref), the K-quants' int8 dot-product operand, and
 * IQ4_NL and IQ4_XS as ggml's quantize_iq4_nl / quantize_iq4_xs without an importance
 * matrix (what ggml_quantize_chunk runs; not quantize_row_iq4_nl_ref, which skips
 * the scale search), IQ3_S as ggml's quantize_iq3_s without an importance matrix,
 * and Q1_0 as ggml's quantize_row_q1_0_ref.
 *
 * The rules quant.c states at its top hold here too: every float operation is
 * float32 in the oracle's order, one rounding each (no FMA contraction, see
 * kernel_targets.h; x / d stays a division where the oracle divides), and NumPy's
 * float -> uint8/int8 casts are "truncate like cvttss2si, keep the low byte".
 *
 * NaN: where gguf-py takes a scale from NumPy's max or min of a block that holds
 * a NaN (Q5_1's d and m, TQ1_0's and TQ2_0's d), the NaN NumPy returns depends on
 * its SIMD width (quant.c's notes); as for Q8_0 and Q4_1 we store the default NaN
 * 0x7e00 there, and every quant of such a block is what gguf-py stores.  Q5_0, like
 * Q4_0, takes d from numpy.argmax, which points at the first NaN on every machine.
 *
 * Portable C only: these types are written far less often than they are read. */

#include "quant_ggml.h"
#include "quant.h"

#include <math.h>
#include <string.h>

#include "kernel_targets.h"

#define QK 32
#define QK_K 256

/* ------------------------------------------------------------------------ */
/* Bits, float16 and the NumPy casts (the same functions as quant.c's).      */

#define INF_BITS 0x7f800000u
#define TWO_POW_31_BITS 0x4f000000u
#define HALF_BITS 0x3f000000u
#define F16_DEFAULT_NAN 0x7e00u

/* float32 -> float16 bits as NumPy's astype(float16): nearest even, subnormals
 * kept, overflow to inf, a NaN keeps its sign and top payload bits. */
static uint16_t numpy_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= INF_BITS) {
        if (ax == INF_BITS)
            return sign | 0x7c00u;
        uint32_t nan = 0x7c00u + ((ax & 0x007fffffu) >> 13);
        return (uint16_t)(sign | (nan == 0x7c00u ? 0x7c01u : nan));
    }
    if (ax >= 0x477ff000u)
        return sign | 0x7c00u;
    if (ax >= 0x38800000u) {
        uint32_t odd = (ax >> 13) & 1u;
        return (uint16_t)(sign | ((ax - 0x38000000u + 0x0fffu + odd) >> 13));
    }
    if (ax < 0x33000000u)
        return sign;
    uint32_t e = ax >> 23;
    uint32_t mant = (ax & 0x007fffffu) | 0x00800000u;
    uint32_t shift = 126u - e;
    uint32_t h = mant >> shift;
    uint32_t rest = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

/* trunc(t) as int32, or 0 for NaN, +-inf and |t| >= 2^31: its low byte is NumPy's
 * float32 -> uint8/int8 cast. */
static inline int32_t trunc_or_zero(float t)
{
    return abs_bits(t) < TWO_POW_31_BITS ? (int32_t)t : 0;
}

/* Round half away from zero as int32 (gguf-py's np_roundf then its int8 cast;
 * C's lroundf), or 0 for NaN, +-inf and |v| >= 2^31. */
static inline int32_t round_half_away_or_zero(float v)
{
    if (abs_bits(v) >= TWO_POW_31_BITS)
        return 0;
    int32_t i = (int32_t)v;
    float frac = v - (float)i;
    if (abs_bits(frac) >= HALF_BITS)
        i += f32_bits(v) >> 31 ? -1 : 1;
    return i;
}

/* Largest abs_bits of x[0..n): above INF_BITS iff there is a NaN. */
static inline uint32_t max_abs_bits(const float *x, int n)
{
    uint32_t m = 0;
    for (int j = 0; j < n; j++) {
        uint32_t a = abs_bits(x[j]);
        m = a > m ? a : m;
    }
    return m;
}

/* ------------------------------------------------------------------------ */
/* Q5_0 and Q5_1 (gguf-py).                                                 */

/* Nibbles (element j low, j+16 high) and the fifth bits (bit j: element j)
 * of 32 five-bit quants: qh then qs, as the block stores them. */
static void pack_q5(const uint8_t q[QK], uint8_t *qh_qs)
{
    uint32_t qh = 0;
    for (int j = 0; j < QK; j++)
        qh |= (uint32_t)((q[j] >> 4) & 1u) << j;
    store_u32le(qh_qs, qh);
    for (int j = 0; j < QK / 2; j++)
        qh_qs[4 + j] = (uint8_t)((q[j] & 0x0fu) | (q[j + QK / 2] & 0x0fu) << 4);
}

/* min(31, NumPy's uint8 cast of t). */
static inline uint8_t numpy_q5(float t)
{
    uint32_t u = (uint32_t)trunc_or_zero(t) & 0xffu;
    return (uint8_t)(u < 31u ? u : 31u);
}

/* numpy.argmax(abs(x)): the first NaN, else the first element of largest magnitude. */
static int argmax_abs(const float *x, int n)
{
    uint32_t amax = max_abs_bits(x, n);
    for (int j = 0; j < n; j++)
        if (amax > INF_BITS ? x[j] != x[j] : abs_bits(x[j]) == amax)
            return j;
    return 0;
}

/* gguf-py Q5_0: d = (the element of largest magnitude) / -16,
 * q = min(31, uint8(trunc(x * (1/d) + 16.5))). */
static void q5_0_quantize_block(const float *x, uint8_t *y)
{
    float d = x[argmax_abs(x, QK)] / -16.0f;
    float id = d == 0.0f ? 0.0f : 1.0f / d;
    uint8_t q[QK];
    for (int j = 0; j < QK; j++) {
        float t = x[j] * id;
        q[j] = numpy_q5(t + 16.5f);
    }
    store_u16le(y, numpy_f32_to_f16(d));
    pack_q5(q, y + 2);
}

/* gguf-py Q5_1: d = (max - min) / 31, m = min,
 * q = min(31, uint8(trunc((x - min) * (1/d) + 0.5))).  A zero extreme with both
 * signs present keeps the first zero (llama.cpp's choice; quant.c's Q4_1 notes). */
static void q5_1_quantize_block(const float *x, uint8_t *y)
{
    if (max_abs_bits(x, QK) > INF_BITS) {
        store_u16le(y, F16_DEFAULT_NAN);
        store_u16le(y + 2, F16_DEFAULT_NAN);
        memset(y + 4, 0, 20);
        return;
    }
    float min = x[0], max = x[0];
    for (int j = 1; j < QK; j++) {
        if (x[j] < min)
            min = x[j];
        if (x[j] > max)
            max = x[j];
    }
    float d = (max - min) / 31.0f;
    float id = d == 0.0f ? 0.0f : 1.0f / d;
    uint8_t q[QK];
    for (int j = 0; j < QK; j++) {
        float t = x[j] - min;
        t = t * id;
        q[j] = numpy_q5(t + 0.5f);
    }
    store_u16le(y, numpy_f32_to_f16(d));
    store_u16le(y + 2, numpy_f32_to_f16(min));
    pack_q5(q, y + 4);
}

/* ------------------------------------------------------------------------ */
/* TQ1_0 and TQ2_0 (gguf-py; ggml's reference gives the same bytes).         */

/* d = max|x| (the default NaN's f16 if a NaN is there), and each element's
 * trit round(x * (1/d)) + 1 in 0..2 (a NaN or infinite product gives 1). */
static uint16_t ternary_trits(const float *x, uint8_t t[QK_K])
{
    uint32_t amax = max_abs_bits(x, QK_K);
    if (amax > INF_BITS) {
        memset(t, 1, QK_K); /* x * NaN is NaN everywhere */
        return F16_DEFAULT_NAN;
    }
    float d = bits_f32(amax);
    float id = d == 0.0f ? 0.0f : 1.0f / d;
    for (int j = 0; j < QK_K; j++)
        t[j] = (uint8_t)(round_half_away_or_zero(x[j] * id) + 1);
    return numpy_f32_to_f16(d);
}

/* Trits t[0], t[stride], ... (count of them, most significant first, weighted
 * 81, 27, 9, 3 (, 1): four trits come out times 3) as a byte: the ceiling of
 * v * 256 / 243, in gguf-py's uint8 products and uint16 sums. */
static uint8_t pack_trits(const uint8_t *t, int stride, int count)
{
    static const uint8_t pow3[5] = {81, 27, 9, 3, 1};
    unsigned v = 0;
    for (int k = 0; k < count; k++)
        v += (uint8_t)(t[k * stride] * pow3[k]);
    return (uint8_t)((uint16_t)(v * 256u + 242u) / 243u);
}

static void tq1_0_quantize_block(const float *x, uint8_t *y)
{
    uint8_t t[QK_K];
    uint16_t d = ternary_trits(x, t);
    for (int m = 0; m < 32; m++) /* elements 0..159: five trits 32 apart a byte */
        y[m] = pack_trits(t + m, 32, 5);
    for (int m = 0; m < 16; m++) /* 160..239: five 16 apart */
        y[32 + m] = pack_trits(t + 160 + m, 16, 5);
    for (int m = 0; m < 4; m++) /* 240..255: four 4 apart, times 3 */
        y[48 + m] = pack_trits(t + 240 + m, 4, 4);
    store_u16le(y + 52, d);
}

static void tq2_0_quantize_block(const float *x, uint8_t *y)
{
    uint8_t t[QK_K];
    uint16_t d = ternary_trits(x, t);
    for (int g = 0; g < 2; g++)
        for (int m = 0; m < 32; m++) {
            const uint8_t *p = t + 128 * g + m;
            y[32 * g + m] = (uint8_t)(p[0] | p[32] << 2 | p[64] << 4 | p[96] << 6);
        }
    store_u16le(y + 64, d);
}

/* ------------------------------------------------------------------------ */
/* MXFP4 (gguf-py; ggml's reference gives the same bytes for finite input).  */

/* The e2m1 values, doubled (ggml's kvalues_mxfp4). */
static const int8_t MXFP4_VALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(e - 128) as a float (ggml_e8m0_to_fp32_half). */
static inline float e8m0_half(uint8_t e)
{
    return bits_f32(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

/* gguf-py MXFP4: e = uint8(floor(log2(max|x|)) - 2 + 127) (0 when max|x| is not
 * above 0, NaN included), d = 2^(e - 128), and each nibble the index k of the
 * first smallest |d * value[k] - x| (numpy.argmin: a NaN difference wins). */
static void mxfp4_quantize_block(const float *x, uint8_t *y)
{
    uint32_t amax = max_abs_bits(x, QK);
    uint8_t e = 0;
    if (amax != 0 && amax <= INF_BITS) {
        /* NumPy's float32 log2 rounds to nearest: log2 in double, rounded to float,
         * is that value (a float below 2^k never lies within double error of a
         * float midpoint of its log2), so its floor is NumPy's. */
        float l = floorf((float)log2((double)bits_f32(amax)));
        e = (uint8_t)trunc_or_zero((l - 2.0f) + 127.0f);
    }
    float d = e8m0_half(e);
    float dk[16];
    for (int k = 0; k < 16; k++)
        dk[k] = d * (float)MXFP4_VALUES[k];
    uint8_t q[QK];
    for (int j = 0; j < QK; j++) {
        int best = 0;
        float best_err = 0.0f;
        for (int k = 0; k < 16; k++) {
            float err = fabsf(dk[k] - x[j]);
            if (err != err) {
                best = k;
                break;
            }
            if (k == 0 || err < best_err) {
                best = k;
                best_err = err;
            }
        }
        q[j] = (uint8_t)best;
    }
    y[0] = e;
    for (int j = 0; j < QK / 2; j++)
        y[1 + j] = (uint8_t)(q[j] | q[j + QK / 2] << 4);
}


/* ------------------------------------------------------------------------ */
/* K-quants (ggml's quantize_row_q4_K_ref, _q5_K_ref, _q6_K_ref, _q8_K_ref).  */
/* ggml's reference is float C compiled without FMA; the code below is our  */
/* own, doing the same float32 operations in the same order.                */

/* float32 -> float16 as ggml's GGML_FP32_TO_FP16 without F16C: NumPy's rounding
 * for numbers, 0x7e00 with the sign for every NaN. */
static inline uint16_t ggml_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > INF_BITS)
        return (uint16_t)((x >> 16 & 0x8000u) | F16_DEFAULT_NAN);
    return numpy_f32_to_f16(f);
}

static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1fu)
        return bits_f32(sign | INF_BITS | mant << 13);
    if (exp != 0)
        return bits_f32(sign | (exp + 112u) << 23 | mant << 13);
    float v = (float)mant * 5.9604644775390625e-8f;
    return sign ? -v : v;
}

/* Round to nearest even by adding 1.5 * 2^23 and reading the low mantissa bits
 * (ggml's nearest_int; for |v| >= 2^22 or NaN it gives what those bits give). */
static inline int nearest_int(float v)
{
    float t = v + 12582912.0f;
    return (int)(f32_bits(t) & 0x007fffffu) - 0x00400000;
}

static inline int clamp_int(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* Asymmetric levels 0..nmax for n values with weights w: scale and offset by a
 * weighted least-squares search over nstep + 1 trial inverse scales (ggml's
 * make_qkx2_quants; ERROR is the per-value error: squared without use_mad, Q4_K/Q5_K's,
 * absolute with it, Q2_K's).  Returns the scale; *neg_min is minus the offset (>= 0
 * unless the search made it so).  Two functions from one body rather than a flag:
 * which NaN a float operation keeps depends on the code the compiler makes
 * (docs/FORMAT.md), and a runtime flag changed Q5_K's bytes for NaN inputs. */
#define SQUARED_ERROR(d) ((d) * (d))
#define ABSOLUTE_ERROR(d) fabsf(d)
#define DEFINE_FIT_LEVELS_WITH_MIN(NAME, ERROR)                                                                                     \
static float NAME(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_min, float rmin, float rdelta, int nstep) \
{                                                                                                                                   \
    uint8_t trial[32];                                                                                                              \
    float lo = x[0], hi = x[0];                                                                                                     \
    float sum_w = w[0];                                                                                                             \
    float sum_x = sum_w * x[0];                                                                                                     \
    for (int i = 1; i < n; i++) {                                                                                                   \
        if (x[i] < lo)                                                                                                              \
            lo = x[i];                                                                                                              \
        if (x[i] > hi)                                                                                                              \
            hi = x[i];                                                                                                              \
        sum_w += w[i];                                                                                                              \
        sum_x += w[i] * x[i];                                                                                                       \
    }                                                                                                                               \
    if (lo > 0)                                                                                                                     \
        lo = 0;                                                                                                                     \
    if (hi == lo) {                                                                                                                 \
        memset(L, 0, (size_t)n);                                                                                                    \
        *neg_min = -lo;                                                                                                             \
        return 0.0f;                                                                                                                \
    }                                                                                                                               \
    float iscale = (float)nmax / (hi - lo);                                                                                         \
    float scale = 1 / iscale;                                                                                                       \
    float best = 0;                                                                                                                 \
    for (int i = 0; i < n; i++) {                                                                                                   \
        int l = clamp_int(nearest_int(iscale * (x[i] - lo)), 0, nmax);                                                              \
        L[i] = (uint8_t)l;                                                                                                          \
        float diff = scale * (float)L[i] + lo - x[i];                                                                               \
        diff = ERROR(diff);                                                                                                         \
        best += w[i] * diff;                                                                                                        \
    }                                                                                                                               \
    for (int step = 0; step <= nstep; step++) {                                                                                     \
        iscale = (rmin + rdelta * (float)step + (float)nmax) / (hi - lo);                                                           \
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;                                                                                    \
        for (int i = 0; i < n; i++) {                                                                                               \
            int l = clamp_int(nearest_int(iscale * (x[i] - lo)), 0, nmax);                                                          \
            trial[i] = (uint8_t)l;                                                                                                  \
            float fl = (float)l;                                                                                                    \
            sum_l += w[i] * fl;                                                                                                     \
            sum_l2 += w[i] * fl * fl;                                                                                               \
            sum_xl += w[i] * fl * x[i];                                                                                             \
        }                                                                                                                           \
        float det = sum_w * sum_l2 - sum_l * sum_l;                                                                                 \
        if (det > 0) {                                                                                                              \
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;                                                              \
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;                                                               \
            if (this_min > 0) {                                                                                                     \
                this_min = 0;                                                                                                       \
                this_scale = sum_xl / sum_l2;                                                                                       \
            }                                                                                                                       \
            float err = 0;                                                                                                          \
            for (int i = 0; i < n; i++) {                                                                                           \
                float diff = this_scale * (float)trial[i] + this_min - x[i];                                                        \
                diff = ERROR(diff);                                                                                                 \
                err += w[i] * diff;                                                                                                 \
            }                                                                                                                       \
            if (err < best) {                                                                                                       \
                memcpy(L, trial, (size_t)n);                                                                                        \
                best = err;                                                                                                         \
                scale = this_scale;                                                                                                 \
                lo = this_min;                                                                                                      \
            }                                                                                                                       \
        }                                                                                                                           \
    }                                                                                                                               \
    *neg_min = -lo;                                                                                                                 \
    return scale;                                                                                                                   \
}

DEFINE_FIT_LEVELS_WITH_MIN(fit_levels_with_min, SQUARED_ERROR)
DEFINE_FIT_LEVELS_WITH_MIN(fit_levels_with_min_abs, ABSOLUTE_ERROR)


/* Symmetric levels -nmax..nmax-1 (stored + nmax) for n values, weighted by x^2:
 * the scale of the best of 19 trial inverse scales around -nmax / max (ggml's
 * make_qx_quants with rmse_type 1 and no importance weights). */
static float fit_levels_symmetric(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)-nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        float fl = (float)l;
        sumlx += w * x[i] * fl;
        suml2 += w * fl * fl;
    }
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int step = -9; step <= 9; step++) {
        if (step == 0)
            continue;
        iscale = -((float)nmax + 0.1f * (float)step) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            float fl = (float)clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sumlx += w * x[i] * fl;
            suml2 += w * fl * fl;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Symmetric levels -nmax..nmax-1 (stored + nmax) for n values, weighted by x^2,
 * refined one value at a time for up to five passes while the weighted fit improves
 * (ggml's make_q3_quants with do_rmse).  An all-zero group keeps levels 0. */
static float fit_levels_refined(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)-nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int pass = 0; pass < 5; pass++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (!(slx > 0))
                continue;
            float sl2 = suml2 - w * (float)L[i] * (float)L[i];
            int nl = clamp_int(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
            if (nl == L[i])
                continue;
            slx += w * x[i] * (float)nl;
            sl2 += w * (float)nl * (float)nl;
            if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (int8_t)nl;
                sumlx = slx;
                suml2 = sl2;
                changed++;
            }
        }
        if (!changed)
            break;
    }
    for (int i = 0; i < n; i++)
        L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Four 2-bit levels per byte: values j, j+32, j+64, j+96 of each 128 (Q2_K, Q3_K). */
static void pack_2bit(const uint8_t L[QK_K], uint8_t *qs)
{
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *q = L + 128 * h + l;
            qs[32 * h + l] = (uint8_t)(q[0] | q[32] << 2 | q[64] << 4 | q[96] << 6);
        }
}

/* Q2_K: sixteen sub-blocks of 16, levels 0..3 fit with a min by weighted absolute
 * error (weights |x|), 4-bit scales and mins of max/15. */
static void q2_k_quantize_block(const float *x, uint8_t *y)
{
    uint8_t L[QK_K];
    float sc[16], mn[16], w[16];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; j++) {
        const float *xs = x + 16 * j;
        for (int l = 0; l < 16; l++)
            w[l] = fabsf(xs[l]);
        sc[j] = fit_levels_with_min_abs(16, 3, xs, w, L + 16 * j, &mn[j], -0.5f, 0.1f, 15);
        if (sc[j] > max_scale)
            max_scale = sc[j];
        if (mn[j] > max_min)
            max_min = mn[j];
    }
    uint8_t *scales = y, *qs = y + 16;
    uint16_t d16 = 0, m16 = 0;
    memset(scales, 0, 16);
    if (max_scale > 0) {
        float inv = 15.0f / max_scale;
        for (int j = 0; j < 16; j++)
            scales[j] = (uint8_t)nearest_int(inv * sc[j]);
        d16 = ggml_f32_to_f16(max_scale / 15.0f);
    }
    if (max_min > 0) {
        float inv = 15.0f / max_min;
        for (int j = 0; j < 16; j++)
            scales[j] = (uint8_t)(scales[j] | nearest_int(inv * mn[j]) << 4);
        m16 = ggml_f32_to_f16(max_min / 15.0f);
    }
    float d_all = f16_to_f32(d16), m_all = f16_to_f32(m16);
    for (int j = 0; j < 16; j++) {
        float d = d_all * (float)(scales[j] & 0xf);
        if (d == 0.0f)
            continue;
        float dm = m_all * (float)(scales[j] >> 4);
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (uint8_t)clamp_int(nearest_int((x[16 * j + i] + dm) / d), 0, 3);
    }
    pack_2bit(L, qs);
    store_u16le(y + 80, d16);
    store_u16le(y + 82, m16);
}

/* Q3_K: sixteen sub-blocks of 16, levels -4..3 (fit_levels_refined), 6-bit scales of
 * max/-32 packed in 12 bytes; the levels' third bit in a 32-byte mask. */
static void q3_k_quantize_block(const float *x, uint8_t *y)
{
    int8_t L[QK_K];
    float sc[16];
    float max_scale = 0, amax = 0;
    for (int j = 0; j < 16; j++) {
        sc[j] = fit_levels_refined(16, 4, x + 16 * j, L + 16 * j);
        float a = fabsf(sc[j]);
        if (a > amax) {
            amax = a;
            max_scale = sc[j];
        }
    }
    uint8_t *hmask = y, *qs = y + 32, *scales = y + 96;
    uint8_t six[16];
    uint16_t d16 = 0;
    memset(scales, 0, 12);
    memset(six, 0, sizeof six);
    if (max_scale != 0.0f || max_scale != max_scale) { /* ggml's `if (max_scale)`: NaN too */
        float iscale = -32.0f / max_scale;
        for (int j = 0; j < 16; j++) {
            int8_t l = (int8_t)nearest_int(iscale * sc[j]); /* ggml keeps the low byte first */
            six[j] = (uint8_t)(clamp_int(l, -32, 31) + 32);
            if (j < 8)
                scales[j] = (uint8_t)(six[j] & 0xf);
            else
                scales[j - 8] = (uint8_t)(scales[j - 8] | (six[j] & 0xf) << 4);
            scales[8 + j % 4] = (uint8_t)(scales[8 + j % 4] | (six[j] >> 4) << (2 * (j / 4)));
        }
        d16 = ggml_f32_to_f16(1 / iscale);
    }
    float d_all = f16_to_f32(d16);
    for (int j = 0; j < 16; j++) {
        float d = d_all * (float)((int)six[j] - 32);
        if (d == 0.0f)
            continue;
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (int8_t)(clamp_int(nearest_int(x[16 * j + i] / d), -4, 3) + 4);
    }
    memset(hmask, 0, 32);
    uint8_t low[QK_K];
    for (int j = 0; j < QK_K; j++) {
        int l = L[j];
        if (l > 3) {
            hmask[j % 32] = (uint8_t)(hmask[j % 32] | 1u << (j / 32));
            l -= 4;
        }
        low[j] = (uint8_t)l;
    }
    pack_2bit(low, qs);
    store_u16le(y + 108, d16);
}

/* Q4_K / Q5_K: eight sub-blocks of 32 with 6-bit scales and mins packed in 12
 * bytes (quant.c's q4_k_scales_mins reads them back), then levels 0..nmax. */
static void k_scales_mins_quantize(const float *x, int nmax, float rmin, int nstep, uint8_t *dh, uint8_t *scales,
                                   uint8_t L[QK_K])
{
    float sc[8], mn[8], w[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++)
            sum_x2 += xs[l] * xs[l];
        float av_x = sqrtf(sum_x2 / 32.0f);
        for (int l = 0; l < 32; l++)
            w[l] = av_x + fabsf(xs[l]);
        sc[j] = fit_levels_with_min(32, nmax, xs, w, L + 32 * j, &mn[j], rmin, 0.1f, nstep);
        if (sc[j] > max_scale)
            max_scale = sc[j];
        if (mn[j] > max_min)
            max_min = mn[j];
    }
    float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        uint8_t a = (uint8_t)nearest_int(inv_scale * sc[j]);
        uint8_t b = (uint8_t)nearest_int(inv_min * mn[j]);
        ls[j] = a < 63 ? a : 63;
        lm[j] = b < 63 ? b : 63;
    }
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)(ls[j] | (ls[j + 4] >> 4) << 6);
        scales[j + 4] = (uint8_t)(lm[j] | (lm[j + 4] >> 4) << 6);
        scales[j + 8] = (uint8_t)((ls[j + 4] & 0xf) | (lm[j + 4] & 0xf) << 4);
    }
    uint16_t d16 = ggml_f32_to_f16(max_scale / 63.0f);
    uint16_t m16 = ggml_f32_to_f16(max_min / 63.0f);
    store_u16le(dh, d16);
    store_u16le(dh + 2, m16);
    float d_all = f16_to_f32(d16), m_all = f16_to_f32(m16);
    for (int j = 0; j < 8; j++) {
        /* the 6-bit values as stored (ls and lm are already below 64) */
        float d = d_all * (float)ls[j];
        if (d == 0.0f)
            continue;
        float dm = m_all * (float)lm[j];
        for (int i = 0; i < 32; i++)
            L[32 * j + i] = (uint8_t)clamp_int(nearest_int((x[32 * j + i] + dm) / d), 0, nmax);
    }
}

static void q4_k_quantize_block(const float *x, uint8_t *y)
{
    uint8_t L[QK_K];
    k_scales_mins_quantize(x, 15, -1.0f, 20, y, y + 4, L);
    uint8_t *qs = y + 16;
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++)
            qs[32 * g + l] = (uint8_t)(L[64 * g + l] | L[64 * g + l + 32] << 4);
}

static void q5_k_quantize_block(const float *x, uint8_t *y)
{
    uint8_t L[QK_K];
    k_scales_mins_quantize(x, 31, -0.5f, 15, y, y + 4, L);
    uint8_t *qh = y + 16, *qs = y + 48;
    memset(qh, 0, 32);
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) {
            uint8_t a = L[64 * g + l], b = L[64 * g + l + 32];
            qh[l] |= (uint8_t)((a >> 4) << (2 * g) | (b >> 4) << (2 * g + 1));
            qs[32 * g + l] = (uint8_t)((a & 0xf) | (b & 0xf) << 4);
        }
}

static void q6_k_quantize_block(const float *x, uint8_t *y)
{
    int8_t L[QK_K];
    float sc[16];
    float max_scale = 0, max_abs_scale = 0;
    for (int j = 0; j < 16; j++) {
        sc[j] = fit_levels_symmetric(16, 32, x + 16 * j, L + 16 * j);
        float a = fabsf(sc[j]);
        if (a > max_abs_scale) {
            max_abs_scale = a;
            max_scale = sc[j];
        }
    }
    if (max_abs_scale < 1e-15f) {
        memset(y, 0, 210);
        return;
    }
    float iscale = -128.0f / max_scale;
    uint16_t d16 = ggml_f32_to_f16(1 / iscale);
    int8_t *scales = (int8_t *)(y + 192);
    for (int j = 0; j < 16; j++) {
        int s = nearest_int(iscale * sc[j]);
        scales[j] = (int8_t)(s < 127 ? s : 127);
    }
    float d_all = f16_to_f32(d16);
    for (int j = 0; j < 16; j++) {
        float d = d_all * (float)scales[j];
        if (d == 0.0f)
            continue;
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (int8_t)(clamp_int(nearest_int(x[16 * j + i] / d), -32, 31) + 32);
    }
    uint8_t *ql = y, *qh = y + 128;
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const int8_t *q = L + 128 * h + l;
            ql[64 * h + l] = (uint8_t)((q[0] & 0xf) | (q[64] & 0xf) << 4);
            ql[64 * h + l + 32] = (uint8_t)((q[32] & 0xf) | (q[96] & 0xf) << 4);
            qh[32 * h + l] = (uint8_t)((q[0] >> 4) | (q[32] >> 4) << 2 | (q[64] >> 4) << 4 | (q[96] >> 4) << 6);
        }
    store_u16le(y + 208, d16);
}

/* Q8_K (ggml's quantize_row_q8_K_ref): the int8 operand of ggml's K-quant dot
 * products, not a weight type.  d = 1 / (-127 / max), max the first value of the
 * largest |x| (NaN never compares greater, so NaNs are skipped); q = min(127,
 * nearest_int(iscale * x)) kept to its low byte as ggml's int -> int8 store does
 * (NaN: the low 22 payload bits, capped at 127; +-inf and the 0 * inf NaN: 0);
 * bsums[k] = the sum of q[16k .. 16k + 15].  An all-zero block (max|x| == 0) is
 * all zero bytes: ggml zeroes d and qs there and leaves bsums as they were, which
 * for a zeroed destination is 0 too. */
static void q8_k_quantize_block(const float *x, uint8_t *y)
{
    float amax = 0, max = 0;
    for (int j = 0; j < QK_K; j++) {
        float ax = fabsf(x[j]);
        if (ax > amax) {
            amax = ax;
            max = x[j];
        }
    }
    if (amax == 0.0f) {
        memset(y, 0, 292);
        return;
    }
    float iscale = -127.0f / max;
    uint8_t *qs = y + 4;
    for (int j = 0; j < QK_K; j++) {
        int v = nearest_int(iscale * x[j]);
        qs[j] = (uint8_t)((v < 127 ? v : 127) & 0xff);
    }
    for (int k = 0; k < QK_K / 16; k++) {
        int sum = 0; /* of the int8 values: at most 16 * 128 in size, an int16 */
        for (int i = 0; i < 16; i++)
            sum += (int)(qs[16 * k + i] ^ 0x80u) - 0x80;
        store_u16le(y + 260 + 2 * k, (uint16_t)(sum & 0xffff));
    }
    store_u32le(y, f32_bits(1 / iscale));
}

/* ------------------------------------------------------------------------ */
/* IQ4_NL and IQ4_XS (ggml's quantize_iq4_nl / quantize_iq4_xs without an     */
/* importance matrix: what ggml_quantize_chunk and llama-quantize run; ntry 7). */

/* ggml's kvalues_iq4nl: the sixteen non-linear levels, ascending. */
static const int8_t IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* The level nearest x (ggml's best_index_int8 over IQ4_VALUES): a binary search, then
 * the lower neighbour only when strictly nearer.  NaN lands on 15, as ggml's does. */
static inline int iq4_index(float x)
{
    if (x <= (float)IQ4_VALUES[0])
        return 0;
    if (x >= (float)IQ4_VALUES[15])
        return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (x < (float)IQ4_VALUES[mid])
            hi = mid;
        else
            lo = mid;
    }
    return x - (float)IQ4_VALUES[hi - 1] < (float)IQ4_VALUES[hi] - x ? hi - 1 : hi;
}

/* The scale of one 32-value sub-block, weights x^2 (ggml's quantize_row_iq4_nl_impl,
 * first loop): from -max/-127 the weighted least-squares scale of the levels chosen,
 * then fifteen trial inverse scales (k - 127) / max, k = -7..7, each kept when its
 * weighted fit sumqx^2 / sumq2 beats the best.  0 for a sub-block whose largest |x|
 * is below 1e-15 (NaN never counts as largest). */
static float iq4_fit(const float *x)
{
    float w[QK];
    float amax = 0, max = 0;
    for (int j = 0; j < QK; j++) {
        w[j] = x[j] * x[j];
        float ax = fabsf(x[j]);
        if (ax > amax) {
            amax = ax;
            max = x[j];
        }
    }
    if (amax < 1e-15f)
        return 0.0f;
    float d = -max / (float)IQ4_VALUES[0];
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < QK; j++) {
        float q = (float)IQ4_VALUES[iq4_index(id * x[j])];
        sumqx += w[j] * q * x[j];
        sumq2 += w[j] * q * q;
    }
    d = sumq2 > 0 ? sumqx / sumq2 : 0.0f;
    float best = d * sumqx;
    for (int itry = -7; itry <= 7; itry++) {
        id = (float)(itry + IQ4_VALUES[0]) / max;
        sumqx = sumq2 = 0;
        for (int j = 0; j < QK; j++) {
            float q = (float)IQ4_VALUES[iq4_index(id * x[j])];
            sumqx += w[j] * q * x[j];
            sumq2 += w[j] * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

/* Nibbles of 32 levels: element j low, j + 16 high. */
static void iq4_pack(const uint8_t L[QK], uint8_t *qs)
{
    for (int j = 0; j < QK / 2; j++)
        qs[j] = (uint8_t)(L[j] | L[j + QK / 2] << 4);
}

/* IQ4_NL: f16 d = the fitted scale, then each level the nearest to x / d (the float32
 * scale, before its f16 rounding). */
static void iq4_nl_quantize_block(const float *x, uint8_t *y)
{
    float d = iq4_fit(x);
    float id = d != 0.0f ? 1 / d : 0.0f; /* NaN is true in ggml's `d ? 1/d : 0` too */
    uint8_t L[QK];
    for (int j = 0; j < QK; j++)
        L[j] = (uint8_t)iq4_index(id * x[j]);
    store_u16le(y, ggml_f32_to_f16(d));
    iq4_pack(L, y + 2);
}

/* IQ4_XS: eight sub-blocks fitted as IQ4_NL's, d = -max_scale / 32 (max_scale the
 * scale of largest magnitude, the first of equals), 6-bit scales
 * clamp(nearest(sc / d), -32, 31) + 32 (low nibbles in scales_l, two per byte, high
 * two bits in scales_h at bit 2 * sub-block), each level the nearest to x / (d * l)
 * with the float32 d. */
static void iq4_xs_quantize_block(const float *x, uint8_t *y)
{
    float sc[8];
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < 8; ib++) {
        sc[ib] = iq4_fit(x + QK * ib);
        float a = fabsf(sc[ib]);
        if (a > amax_scale) {
            amax_scale = a;
            max_scale = sc[ib];
        }
    }
    float d = -max_scale / 32;
    float id = d != 0.0f ? 1 / d : 0.0f;
    uint16_t scales_h = 0;
    uint8_t *scales_l = y + 4, *qs = y + 8;
    memset(scales_l, 0, 4);
    for (int ib = 0; ib < 8; ib++) {
        int l = clamp_int(nearest_int(id * sc[ib]), -32, 31);
        float dl = d * (float)l;
        float idl = dl != 0.0f ? 1 / dl : 0.0f;
        uint8_t L[QK];
        for (int j = 0; j < QK; j++)
            L[j] = (uint8_t)iq4_index(idl * x[QK * ib + j]);
        iq4_pack(L, qs + 16 * ib);
        l += 32;
        scales_l[ib / 2] = (uint8_t)(scales_l[ib / 2] | (l & 0xf) << 4 * (ib % 2));
        scales_h = (uint16_t)(scales_h | (l >> 4) << 2 * ib);
    }
    store_u16le(y, ggml_f32_to_f16(d));
    store_u16le(y + 2, scales_h);
}

/* ------------------------------------------------------------------------ */
/* Q1_0 (ggml's quantize_row_q1_0_ref: what ggml_quantize_chunk runs).       */

/* f16 d = (sum of |x|, added in order in float32) / 128; bit j (lowest first)
 * set where x[j] >= 0, so -0.0 sets it and NaN does not. */
static void q1_0_quantize_block(const float *x, uint8_t *y)
{
    float sum_abs = 0.0f;
    for (int j = 0; j < 128; j++)
        sum_abs += fabsf(x[j]);
    store_u16le(y, ggml_f32_to_f16(sum_abs / 128.0f));
    for (int k = 0; k < 16; k++) {
        uint8_t bits = 0;
        for (int j = 0; j < 8; j++)
            bits = (uint8_t)(bits | (x[8 * k + j] >= 0.0f) << j);
        y[2 + k] = bits;
    }
}

/* ------------------------------------------------------------------------ */
/* IQ3_S (ggml's quantize_iq3_s without an importance matrix: what           */
/* ggml_quantize_chunk and llama-quantize run; sub-blocks of 32).            */
/*                                                                           */
/* Four values at a time are one of 512 grid points (each coordinate odd, 1..15,  */
/* the grid of quant_ggml.c).  The search tables are ggml's iq3xs_init_impl(512),  */
/* derived here from that grid once, on first use: for each of the 8^4 points      */
/* u = l0 | l1 << 3 | l2 << 6 | l3 << 9 (coordinates 2l + 1) its grid index, or,    */
/* for a point off the grid, its neighbours: every grid point at one of the three   */
/* smallest squared distances, nearest first, lower index first among equals (the  */
/* order of ggml's qsort on (distance, index)).                                      */

#define IQ3S_POINTS 4096
/* 3584 points off the grid hold 24733 neighbours and a count each: 28317 slots. */
#define IQ3S_NEIGHBOUR_SLOTS 28317

static struct {
    int32_t map[IQ3S_POINTS];       /* grid index >= 0, or -(1 + slot of the count) */
    uint16_t neighbours[IQ3S_NEIGHBOUR_SLOTS];
    uint16_t point[512];            /* the grid point of each index */
} iq3s;

static void iq3s_build(void)
{
    const uint8_t (*grid)[4] = apr_ggml_iq3_s_grid();
    for (int u = 0; u < IQ3S_POINTS; u++)
        iq3s.map[u] = -1;
    for (int j = 0; j < 512; j++) {
        int u = 0;
        for (int i = 0; i < 4; i++)
            u |= (grid[j][i] - 1) / 2 << 3 * i;
        iq3s.point[j] = (uint16_t)u;
        iq3s.map[u] = j;
    }
    int slot = 0;
    for (int u = 0; u < IQ3S_POINTS; u++) {
        if (iq3s.map[u] >= 0)
            continue;
        int d2[512];
        for (int j = 0; j < 512; j++) {
            int s = 0;
            for (int i = 0; i < 4; i++) {
                int diff = grid[j][i] - (2 * ((u >> 3 * i) & 7) + 1);
                s += diff * diff;
            }
            d2[j] = s;
        }
        /* The three smallest distinct distances, then the points at each in index order. */
        int want[3], have = 0;
        while (have < 3) {
            int next = -1;
            for (int j = 0; j < 512; j++)
                if ((have == 0 || d2[j] > want[have - 1]) && (next < 0 || d2[j] < next))
                    next = d2[j];
            if (next < 0)
                break;
            want[have++] = next;
        }
        int count_slot = slot++, n = 0;
        for (int k = 0; k < have; k++)
            for (int j = 0; j < 512; j++)
                if (d2[j] == want[k] && slot < IQ3S_NEIGHBOUR_SLOTS) {
                    iq3s.neighbours[slot++] = (uint16_t)j;
                    n++;
                }
        iq3s.neighbours[count_slot] = (uint16_t)n;
        iq3s.map[u] = -(1 + count_slot);
    }
}

#if defined(_WIN32)
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>
static INIT_ONCE iq3s_once = INIT_ONCE_STATIC_INIT;
static BOOL CALLBACK iq3s_build_once(PINIT_ONCE once, PVOID param, PVOID *context)
{
    (void)once;
    (void)param;
    (void)context;
    iq3s_build();
    return TRUE;
}
static void iq3s_init(void)
{
    InitOnceExecuteOnce(&iq3s_once, iq3s_build_once, NULL, NULL);
}
#else
#include <pthread.h>
static pthread_once_t iq3s_once = PTHREAD_ONCE_INIT;
static void iq3s_init(void)
{
    pthread_once(&iq3s_once, iq3s_build);
}
#endif

/* The grid point's coordinate i (1, 3, ..., 15). */
static inline float iq3s_coord(int index, int i)
{
    return (float)(2 * ((iq3s.point[index] >> 3 * i) & 7) + 1);
}

/* The neighbour (ggml's iq3_find_best_neighbour) of least sum w * (scale * g - x)^2,
 * the first of equals, its levels (g - 1) / 2 into L.  Where no distance is below
 * FLT_MAX (NaN or overflowing inputs) ggml aborts; aprfast takes the first neighbour. */
static int iq3s_best_neighbour(const uint16_t *nb, const float *x, const float *w, float scale, int8_t *L)
{
    int n = nb[0];
    float best = 3.40282347e+38f;
    int index = nb[1];
    for (int j = 1; j <= n; j++) {
        float d2 = 0;
        for (int i = 0; i < 4; i++) {
            float diff = scale * iq3s_coord(nb[j], i) - x[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best) {
            best = d2;
            index = nb[j];
        }
    }
    for (int i = 0; i < 4; i++)
        L[i] = (int8_t)((iq3s.point[index] >> 3 * i) & 7);
    return index;
}

/* Levels clamp(nearest((id * x - 1) / 2), 0, 7) of four values, as a point u. */
static inline int iq3s_point_of(const float *x, float id, int8_t *L)
{
    int u = 0;
    for (int i = 0; i < 4; i++) {
        int l = clamp_int(nearest_int(0.5f * (id * x[i] - 1)), 0, 7);
        L[i] = (int8_t)l;
        u |= l << 3 * i;
    }
    return u;
}

/* sum w x q and sum w q q over 32 values, q = 2L + 1, in order. */
static inline void iq3s_sums(const float *w, const float *x, const int8_t *L, float *sumqx, float *sumq2)
{
    float a = 0, b = 0;
    for (int i = 0; i < QK; i++) {
        float q = (float)(2 * L[i] + 1);
        a += w[i] * x[i] * q;
        b += w[i] * q * q;
    }
    *sumqx = a;
    *sumq2 = b;
}

/* One block of 256 (quantize_row_iq3_s_impl, block_size 32, no quant_weights):
 * f16 d | 64 B qs | 8 B qh | 32 B signs | 4 B scales.  Per sub-block of 32: weights
 * x^2, |x| and sign bits; a scale search over 19 trial inverse scales
 * (15 + 0.2 k) / max, k = -9..9, points off the grid replaced by their best
 * neighbour; a refit when the winner had points off the grid.  An all-zero sub-block
 * (max |x| == 0) writes no qs and signs: the next sub-block's go where its would have
 * (ggml's pointers only advance past a quantized sub-block), and its scale is 0. */
static void iq3_s_quantize_block(const float *x, uint8_t *y)
{
    memset(y, 0, 110);
    uint8_t *qs = y + 2, *qh = y + 66, *signs = y + 74, *scale_bytes = y + 106;
    float scales[8];
    float max_scale = 0;
    for (int ib = 0; ib < 8; ib++) {
        const float *xb = x + QK * ib;
        float weight[QK], waux[QK], xval[QK];
        uint8_t block_signs[4];
        int8_t L[QK], Laux[QK];
        int on_grid[8], on_grid_aux[8];
        for (int i = 0; i < QK; i++) {
            weight[i] = xb[i] * xb[i];
            waux[i] = sqrtf(weight[i]);
        }
        for (int k = 0; k < 4; k++) {
            uint8_t s = 0;
            for (int i = 0; i < 8; i++) {
                float v = xb[8 * k + i];
                if (v >= 0) {
                    xval[8 * k + i] = v;
                } else {
                    xval[8 * k + i] = -v;
                    s = (uint8_t)(s | 1u << i);
                }
            }
            block_signs[k] = s;
        }
        float max = xval[0];
        for (int i = 1; i < QK; i++)
            max = max > xval[i] ? max : xval[i];
        memset(L, 0, sizeof L);
        if (max == 0.0f) {
            scales[ib] = 0;
            continue;
        }
        float best = 0;
        float scale = max / 15;
        for (int k = 0; k < 8; k++)
            on_grid[k] = 0;
        for (int is = -9; is <= 9; is++) {
            float id = (15 + (float)is * 0.2f) / max;
            float this_scale = 1 / id;
            for (int k = 0; k < 8; k++) {
                int u = iq3s_point_of(xval + 4 * k, id, Laux + 4 * k);
                on_grid_aux[k] = iq3s.map[u] >= 0;
                if (!on_grid_aux[k])
                    iq3s_best_neighbour(iq3s.neighbours - iq3s.map[u] - 1, xval + 4 * k, waux + 4 * k, this_scale,
                                        Laux + 4 * k);
            }
            float sumqx, sumq2;
            iq3s_sums(weight, xval, Laux, &sumqx, &sumq2);
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                scale = sumqx / sumq2;
                best = scale * sumqx;
                memcpy(L, Laux, sizeof L);
                memcpy(on_grid, on_grid_aux, sizeof on_grid);
            }
        }
        int off_grid = 0;
        for (int k = 0; k < 8; k++)
            off_grid += !on_grid[k];
        if (off_grid > 0 && scale > 0) {
            float id = 1 / scale;
            for (int k = 0; k < 8; k++) {
                int8_t trial[4];
                int u = iq3s_point_of(xval + 4 * k, id, trial);
                int index = iq3s.map[u];
                if (index < 0)
                    index = iq3s_best_neighbour(iq3s.neighbours - index - 1, xval + 4 * k, waux + 4 * k, scale,
                                                L + 4 * k);
                for (int i = 0; i < 4; i++)
                    L[4 * k + i] = (int8_t)((iq3s.point[index] >> 3 * i) & 7);
            }
            float sumqx, sumq2;
            iq3s_sums(weight, xval, L, &sumqx, &sumq2);
            if (sumq2 > 0)
                scale = sumqx / sumq2;
        }
        if (scale < 0) {
            scale = -scale;
            for (int k = 0; k < 4; k++)
                block_signs[k] = (uint8_t)~block_signs[k];
        }
        for (int k = 0; k < 8; k++) {
            int u = L[4 * k] | L[4 * k + 1] << 3 | L[4 * k + 2] << 6 | L[4 * k + 3] << 9;
            int index = iq3s.map[u]; /* every L above is a grid point */
            qs[k] = (uint8_t)(index & 255);
            qh[ib] = (uint8_t)(qh[ib] | (index >> 8) << k);
        }
        qs += 8;
        memcpy(signs, block_signs, 4);
        signs += 4;
        scales[ib] = scale;
        max_scale = max_scale > scale ? max_scale : scale;
    }
    if (max_scale == 0.0f)
        return;
    float d = max_scale / 31;
    store_u16le(y, ggml_f32_to_f16(d * 1.033f));
    float id = 1 / d;
    for (int ib = 0; ib < 8; ib += 2) {
        int l1 = clamp_int(nearest_int(0.5f * (id * scales[ib] - 1)), 0, 15);
        int l2 = clamp_int(nearest_int(0.5f * (id * scales[ib + 1] - 1)), 0, 15);
        scale_bytes[ib / 2] = (uint8_t)(l1 | l2 << 4);
    }
}

static void iq3_s_quantize_blocks(const float *x, uint8_t *y, size_t nblocks)
{
    iq3s_init();
    for (size_t b = 0; b < nblocks; b++)
        iq3_s_quantize_block(x + b * QK_K, y + b * 110);
}

/* ------------------------------------------------------------------------ */
/* Dispatch.                                                                */

#define BLOCKS_FN(name, elems, bytes)                                               \
    static void name##_quantize_blocks(const float *x, uint8_t *y, size_t nblocks)  \
    {                                                                               \
        for (size_t b = 0; b < nblocks; b++)                                        \
            name##_quantize_block(x + b * (elems), y + b * (bytes));                \
    }

BLOCKS_FN(q5_0, QK, 22)
BLOCKS_FN(q5_1, QK, 24)
BLOCKS_FN(tq1_0, QK_K, 54)
BLOCKS_FN(tq2_0, QK_K, 66)
BLOCKS_FN(mxfp4, QK, 17)
BLOCKS_FN(q2_k, QK_K, 84)
BLOCKS_FN(q3_k, QK_K, 110)
BLOCKS_FN(q4_k, QK_K, 144)
BLOCKS_FN(q5_k, QK_K, 176)
BLOCKS_FN(q6_k, QK_K, 210)
BLOCKS_FN(q8_k, QK_K, 292)
BLOCKS_FN(iq4_nl, QK, 18)
BLOCKS_FN(iq4_xs, QK_K, 136)
BLOCKS_FN(q1_0, 128, 18)

apr_ggml_quantize_fn apr_ggml_quantizer(int type)
{
    switch (type) {
    case APR_QT_Q5_0:
        return q5_0_quantize_blocks;
    case APR_QT_Q5_1:
        return q5_1_quantize_blocks;
    case APR_QT_TQ1_0:
        return tq1_0_quantize_blocks;
    case APR_QT_TQ2_0:
        return tq2_0_quantize_blocks;
    case APR_QT_MXFP4:
        return mxfp4_quantize_blocks;
    case APR_QT_Q2_K:
        return q2_k_quantize_blocks;
    case APR_QT_Q3_K:
        return q3_k_quantize_blocks;
    case APR_QT_Q4_K:
        return q4_k_quantize_blocks;
    case APR_QT_Q5_K:
        return q5_k_quantize_blocks;
    case APR_QT_Q6_K:
        return q6_k_quantize_blocks;
    case APR_QT_Q8_K:
        return q8_k_quantize_blocks;
    case APR_QT_IQ4_NL:
        return iq4_nl_quantize_blocks;
    case APR_QT_IQ4_XS:
        return iq4_xs_quantize_blocks;
    case APR_QT_Q1_0:
        return q1_0_quantize_blocks;
    case APR_QT_IQ3_S:
        return iq3_s_quantize_blocks;
    default:
        return NULL;
    }
}
