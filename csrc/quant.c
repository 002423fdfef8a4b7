/* Quantize / dequantize kernels for GGML and aprender block types, with a
 * portable C path, AVX2 and AVX-512 paths chosen at run time, and a pthreads
 * driver that splits the work by whole blocks.
 *
 * The oracles are llama.cpp's gguf-py (gguf.quants, NumPy) for the GGML types
 * and apr-format / aprender-core (Rust) for the APR types.  Matching them bit
 * for bit dictates a few things that look odd in C:
 *
 *  - Every float operation is done in float32 in the oracle's order, one
 *    rounding per operation: no FMA contraction (the build uses -std=c99,
 *    where GCC does not contract; no target string here enables FMA; clang
 *    is told below), and x / 127.0f is a division, never x * (1/127).
 *  - NumPy casts float -> int8/uint8 as "truncate to int32 like cvttss2si,
 *    keep the low byte": NaN, +-inf and |x| >= 2^31 give 0, 300.0 gives 44,
 *    -1.0 gives 255.  gguf-py stores its Q4_0/Q4_1 nibbles that way before
 *    clipping, so trunc_or_zero() reproduces it (only reachable with
 *    subnormal or non-finite scales).
 *  - NumPy's max/min of a row holding a NaN returns the default quiet NaN
 *    0x7fc00000 if the NaN went through its vector loop, and the NaN's own
 *    bits if it fell in the scalar tail (elements 17..31 of a block on an
 *    AVX-512 machine with NumPy 2.4; the tail follows NumPy's vector width).
 *    So gguf-py's Q8_0 d and Q4_1 d/m of a NaN block depend on the machine
 *    (for a NaN with a payload or a sign).  Choice: we always store the default NaN 0x7e00
 *    there; every quant of such a block is 0 in both.  argmax, used by
 *    Q4_0, points at the first NaN itself on every machine, and float16
 *    conversion keeps NaN payloads (numpy_f32_to_f16), so Q4_0 matches
 *    bit for bit.
 *  - Rust's f32::max skips NaN, f32::round rounds half away from zero, and
 *    `as i8` saturates with NaN -> 0.
 *
 * SIMD kernels do exactly the portable arithmetic on 8 or 16 lanes.  Blocks
 * whose result depends on something lanes cannot reproduce cheaply (a NaN
 * inside a GGML block, a zero minimum or maximum for Q4_1 where the sign of
 * zero depends on which element is picked) are handed to the scalar code. */
#include "quant.h"
#include "quant_ggml.h"
#include "cpu.h"
#include "parallel.h"

#include <math.h>
#include <string.h>

#include "kernel_targets.h"
#ifdef HAVE_X86_KERNELS
#include <immintrin.h>
#endif

#define QK 32     /* elements in a GGML / APR block */
#define QK_K 256  /* elements in a K-quant super-block */

/* ------------------------------------------------------------------------ */
/* float16.                                                                 */

/* numpy.float16 of the quiet NaN 0x7fc00000 that NumPy's max/min return. */
#define F16_DEFAULT_NAN 0x7e00u

/* float32 -> float16 bits as NumPy's astype(float16) (and half::f16::from_f32,
 * and F16C) rounds: to nearest even, subnormals kept, overflow to inf.  A NaN
 * keeps its sign and top 10 payload bits unchanged; an all-zero result becomes
 * payload 1 so it stays a NaN (NumPy; F16C would set the quiet bit). */
static inline uint16_t numpy_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;

    if (ax >= 0x7f800000u) {
        if (ax == 0x7f800000u)
            return sign | 0x7c00u;
        uint32_t nan = 0x7c00u + ((ax & 0x007fffffu) >> 13);
        return (uint16_t)(sign | (nan == 0x7c00u ? 0x7c01u : nan));
    }
    if (ax >= 0x477ff000u) /* 65520 and up round to inf */
        return sign | 0x7c00u;
    if (ax >= 0x38800000u) {
        /* Normal half: rebias the exponent (127 -> 15) and round the 13
         * dropped bits to nearest even; a carry runs into the exponent. */
        uint32_t odd = (ax >> 13) & 1u;
        return (uint16_t)(sign | ((ax - 0x38000000u + 0x0fffu + odd) >> 13));
    }
    if (ax < 0x33000000u) /* below half the smallest subnormal (ties go to 0) */
        return sign;
    /* Subnormal half: value = mant * 2^(e-150), in units of 2^-24. */
    uint32_t e = ax >> 23;
    uint32_t mant = (ax & 0x007fffffu) | 0x00800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t h = mant >> shift;
    uint32_t rest = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (h & 1u)))
        h++; /* may carry into the smallest normal, which is the right encoding */
    return (uint16_t)(sign | h);
}

/* float16 bits -> float32, exact; a NaN's payload moves up 13 bits (NumPy). */
static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1fu)
        return bits_f32(sign | 0x7f800000u | mant << 13);
    if (exp != 0)
        return bits_f32(sign | (exp + 112u) << 23 | mant << 13);
    /* Zero or subnormal: mant * 2^-24 is exact in float. */
    float v = (float)mant * 5.9604644775390625e-8f;
    return sign ? -v : v;
}

/* ------------------------------------------------------------------------ */
/* Scalar rounding and casts shared by every path.                          */
/* Written without branches so that compilers vectorize the portable loops  */
/* (SSE2 on x86-64, NEON on AArch64).                                       */

#define INF_BITS 0x7f800000u

/* An int32 key that orders like the float for every non-NaN x (-0 < +0). */
static inline int32_t order_key(float x)
{
    uint32_t b = f32_bits(x);
    return (int32_t)(b ^ ((0u - (b >> 31)) >> 1)); /* negative: flip all but the sign */
}

static inline float from_order_key(int32_t k)
{
    uint32_t b = (uint32_t)k;
    return bits_f32(b ^ ((0u - (b >> 31)) >> 1));
}

/* Comparisons and selects below work on bit patterns: under the default
 * -ftrapping-math, GCC keeps a float compare (which may raise FE_INVALID) or
 * a float ?: as a branch, and a loop with a branch is not vectorized. */
#define TWO_POW_31_BITS 0x4f000000u
#define HALF_BITS 0x3f000000u

/* c ? a : b for floats, as a bit mask. */
static inline float select_f32(int c, float a, float b)
{
    uint32_t m = 0u - (uint32_t)(c != 0);
    return bits_f32((f32_bits(a) & m) | (f32_bits(b) & ~m));
}

/* trunc(t) as int32, or 0 for NaN, +-inf and |t| >= 2^31: its low byte is
 * NumPy's float32 -> uint8/int8 cast (see the top of the file). */
static inline int32_t trunc_or_zero(float t)
{
    float safe = select_f32(abs_bits(t) < TWO_POW_31_BITS, t, 0.0f);
    return (int32_t)safe;
}

/* round_half_away(v) as int32 (Rust f32::round, C roundf), or 0 for NaN,
 * +-inf and |v| >= 2^31.  The dropped fraction v - trunc(v) is exact. */
static inline int32_t round_half_away_or_zero(float v)
{
    float safe = select_f32(abs_bits(v) < TWO_POW_31_BITS, v, 0.0f);
    int32_t i = (int32_t)safe;
    float frac = safe - (float)i;
    int32_t up = abs_bits(frac) >= HALF_BITS;
    int32_t neg = -(int32_t)(f32_bits(safe) >> 31); /* 0 or -1 */
    return i + ((up ^ neg) - neg);               /* +1 or -1 away from zero */
}

/* Rust's `v.round().clamp(lo, hi) as i8` (NaN -> 0), lo and hi integers in
 * i8 range.  Clamping first gives the same result, as round is monotonic and
 * keeps integers. */
static inline int32_t rust_round_clamp(float v, float lo, float hi)
{
    v = select_f32(abs_bits(v) > INF_BITS, 0.0f, v);
    int32_t k = order_key(v);
    v = select_f32(k < order_key(lo), lo, v);
    v = select_f32(k > order_key(hi), hi, v);
    return round_half_away_or_zero(v);
}

/* min(15, NumPy's uint8 cast of t): gguf-py's Q4_0 / Q4_1 nibble. */
static inline uint8_t numpy_nibble(float t)
{
    uint32_t u = (uint32_t)trunc_or_zero(t) & 0xFFu;
    return (uint8_t)(u < 15u ? u : 15u);
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
/* Type table.                                                              */

typedef struct {
    const char *name;
    uint16_t block_elems;
    uint16_t block_bytes;
    uint8_t header_bytes;
    uint8_t partial_last_block;
    uint8_t quantizable;
} type_info;

static const type_info TYPES[APR_QT_COUNT] = {
    [APR_QT_Q8_0] = {"Q8_0", QK, 34, 0, 0, 1},
    [APR_QT_Q4_0] = {"Q4_0", QK, 18, 0, 0, 1},
    [APR_QT_Q4_1] = {"Q4_1", QK, 20, 0, 0, 1},
    [APR_QT_Q5_0] = {"Q5_0", QK, 22, 0, 0, 1},
    [APR_QT_Q5_1] = {"Q5_1", QK, 24, 0, 0, 1},
    [APR_QT_Q4_K] = {"Q4_K", QK_K, 144, 0, 0, 1},
    [APR_QT_Q6_K] = {"Q6_K", QK_K, 210, 0, 0, 1},
    [APR_QT_APR_Q8] = {"APR_Q8", 1, 1, 4, 0, 1},
    [APR_QT_APR_Q4] = {"APR_Q4", QK, 18, 0, 1, 1},
    [APR_QT_Q8_TENSOR] = {"Q8_TENSOR", 1, 1, 8, 0, 1},
    [APR_QT_APR_FQ8_0] = {"APR_FQ8_0", QK, 34, 0, 1, 1},
    [APR_QT_APR_FQ4_0] = {"APR_FQ4_0", QK, 18, 0, 1, 1},
    [APR_QT_Q8_1] = {"Q8_1", QK, 36, 0, 0, 0},
    [APR_QT_Q2_K] = {"Q2_K", QK_K, 84, 0, 0, 1},
    [APR_QT_Q3_K] = {"Q3_K", QK_K, 110, 0, 0, 1},
    [APR_QT_Q5_K] = {"Q5_K", QK_K, 176, 0, 0, 1},
    [APR_QT_Q8_K] = {"Q8_K", QK_K, 292, 0, 0, 1},
    [APR_QT_IQ2_XXS] = {"IQ2_XXS", QK_K, 66, 0, 0, 0},
    [APR_QT_IQ2_XS] = {"IQ2_XS", QK_K, 74, 0, 0, 0},
    [APR_QT_IQ3_XXS] = {"IQ3_XXS", QK_K, 98, 0, 0, 0},
    [APR_QT_IQ1_S] = {"IQ1_S", QK_K, 50, 0, 0, 0},
    [APR_QT_IQ4_NL] = {"IQ4_NL", QK, 18, 0, 0, 1},
    [APR_QT_IQ3_S] = {"IQ3_S", QK_K, 110, 0, 0, 1},
    [APR_QT_IQ2_S] = {"IQ2_S", QK_K, 82, 0, 0, 0},
    [APR_QT_IQ4_XS] = {"IQ4_XS", QK_K, 136, 0, 0, 1},
    [APR_QT_IQ1_M] = {"IQ1_M", QK_K, 56, 0, 0, 0},
    [APR_QT_TQ1_0] = {"TQ1_0", QK_K, 54, 0, 0, 1},
    [APR_QT_TQ2_0] = {"TQ2_0", QK_K, 66, 0, 0, 1},
    [APR_QT_MXFP4] = {"MXFP4", QK, 17, 0, 0, 1},
    [APR_QT_NVFP4] = {"NVFP4", 64, 36, 0, 0, 0},
    [APR_QT_Q1_0] = {"Q1_0", 128, 18, 0, 0, 1},
};

static int is_known_type(int type)
{
    return type >= 0 && type < APR_QT_COUNT;
}

const char *apr_quant_type_name(int type)
{
    return is_known_type(type) ? TYPES[type].name : NULL;
}

int apr_quant_block_info(int type, size_t *block_elems, size_t *block_bytes)
{
    if (!is_known_type(type))
        return APR_QUANT_EUNKNOWN;
    *block_elems = TYPES[type].block_elems;
    *block_bytes = TYPES[type].block_bytes;
    return APR_QUANT_OK;
}

size_t apr_quant_header_bytes(int type, size_t n)
{
    if (!is_known_type(type))
        return 0;
    /* apr-format writes an empty APR_Q8 tensor as no bytes at all; Q8_TENSOR
     * follows it, so an empty tensor of any type has no bytes. */
    if (n == 0)
        return 0;
    return TYPES[type].header_bytes;
}

int apr_quant_allows_partial_block(int type)
{
    return is_known_type(type) && TYPES[type].partial_last_block;
}

int apr_quant_can_quantize(int type)
{
    return is_known_type(type) && TYPES[type].quantizable;
}

/* Blocks holding n elements, or SIZE_MAX if n is not a whole number of them. */
static size_t blocks_for(int type, size_t n)
{
    size_t be = TYPES[type].block_elems;
    if (TYPES[type].partial_last_block)
        return n / be + (n % be != 0);
    return n % be ? SIZE_MAX : n / be;
}

size_t apr_quant_nbytes(int type, size_t n)
{
    if (!is_known_type(type))
        return SIZE_MAX;
    size_t nb = blocks_for(type, n);
    size_t bb = TYPES[type].block_bytes;
    size_t header = apr_quant_header_bytes(type, n);
    if (nb == SIZE_MAX || nb > (SIZE_MAX - header) / bb)
        return SIZE_MAX;
    return header + nb * bb;
}

/* ------------------------------------------------------------------------ */
/* Jobs: what a kernel needs to do its share of blocks.                     */

typedef struct quant_job quant_job;

/* Process blocks [first, first + count) of a job. */
typedef void (*block_kernel)(const quant_job *job, size_t first, size_t count);

/* Fold elements [first, first + count) into acc (a running max, or min/max). */
typedef void (*fold_kernel)(const float *x, size_t count, float acc[2]);

struct quant_job {
    const float *src; /* quantize: input floats */
    uint8_t *dst;     /* quantize: output bytes (after any header) */
    const uint8_t *qsrc; /* dequantize: input bytes (after any header) */
    float *out;       /* dequantize: output floats */
    size_t n;         /* elements in the whole tensor */
    size_t unit;      /* elements per block (1 for per-tensor types) */
    float scale;      /* per-tensor types */
    int32_t zero_point;
    block_kernel kernel;
    apr_ggml_blocks_fn ggml_blocks; /* dequantize: the quant_ggml.c types */
    apr_ggml_quantize_fn ggml_quantize; /* quantize: the quantize_ggml.c types */
    size_t block_bytes;
};

/* ======================================================================== */
/* Portable path.                                                           */
/* ======================================================================== */

/* ---- GGML quantize (gguf-py semantics) --------------------------------- */

/* gguf-py Q8_0: d = max|x| / 127, q = round_half_away(x * (1/d)). */
static void q8_0_quantize_block(const float *x, uint8_t *y)
{
    uint32_t amax = max_abs_bits(x, QK);
    if (amax > INF_BITS) {
        /* d = NaN (the default one, see the top of the file); q = NaN -> 0. */
        store_u16le(y, F16_DEFAULT_NAN);
        memset(y + 2, 0, QK);
        return;
    }
    float d = bits_f32(amax) / 127.0f;
    float id = d == 0.0f ? 0.0f : 1.0f / d;
    store_u16le(y, numpy_f32_to_f16(d));
    for (int j = 0; j < QK; j++)
        y[2 + j] = (uint8_t)round_half_away_or_zero(x[j] * id);
}

/* numpy.argmax(abs(x)): the first NaN if there is one, else the first element
 * of largest magnitude (ties keep the earlier element). */
static inline int argmax_abs(const float *x, int n)
{
    uint32_t amax = max_abs_bits(x, n);
    if (amax > INF_BITS) {
        int j = 0;
        while (x[j] == x[j])
            j++;
        return j;
    }
    int first = n;
    for (int j = 0; j < n; j++) {
        int hit = abs_bits(x[j]) == amax ? j : n;
        first = hit < first ? hit : first;
    }
    return first;
}

/* Nibbles of a GGML 4-bit block: element j low, element j+16 high. */
static inline void pack_nibbles_split(const uint8_t q[QK], uint8_t *qs)
{
    for (int j = 0; j < QK / 2; j++)
        qs[j] = (uint8_t)(q[j] | q[j + QK / 2] << 4);
}

/* gguf-py Q4_0: d = (the signed element of largest magnitude) / -8,
 * q = min(15, uint8(trunc(x * (1/d) + 8.5))).  No special case for NaN: the
 * first NaN becomes d (its payload kept), and every q is NaN -> 0. */
static void q4_0_quantize_block(const float *x, uint8_t *y)
{
    float max = x[argmax_abs(x, QK)];
    float d = max / -8.0f;
    float id = d == 0.0f ? 0.0f : 1.0f / d;
    uint8_t q[QK];
    for (int j = 0; j < QK; j++) {
        float t = x[j] * id;
        q[j] = numpy_nibble(t + 8.5f);
    }
    store_u16le(y, numpy_f32_to_f16(d));
    pack_nibbles_split(q, y + 2);
}

/* First-occurrence min and max (strict comparisons), as llama.cpp's
 * quantize_row_q4_1_ref picks them: only the sign of a zero depends on it. */
static void min_max_first(const float *x, int n, float *min, float *max)
{
    float lo = x[0], hi = x[0];
    for (int j = 1; j < n; j++) {
        if (x[j] < lo)
            lo = x[j];
        if (x[j] > hi)
            hi = x[j];
    }
    *min = lo;
    *max = hi;
}

/* gguf-py Q4_1: d = (max - min) / 15, m = min,
 * q = min(15, uint8(trunc((x - min) * (1/d) + 0.5))).
 * Choice: when the minimum (or maximum) is a zero and the block holds both
 * +0.0 and -0.0, NumPy's reduction order decides which one gguf-py stores; we
 * keep the first one, as llama.cpp's quantize_row_q4_1_ref does. */
static void q4_1_quantize_block(const float *x, uint8_t *y)
{
    if (max_abs_bits(x, QK) > INF_BITS) {
        /* d = m = NaN (the default one, see the top of the file); q = NaN -> 0. */
        store_u16le(y, F16_DEFAULT_NAN);
        store_u16le(y + 2, F16_DEFAULT_NAN);
        memset(y + 4, 0, QK / 2);
        return;
    }
    /* Order keys give min and max without float-compare reductions, which
     * compilers will not vectorize; a zero extreme needs the first zero. */
    int32_t klo = INT32_MAX, khi = INT32_MIN;
    for (int j = 0; j < QK; j++) {
        int32_t k = order_key(x[j]);
        klo = k < klo ? k : klo;
        khi = k > khi ? k : khi;
    }
    float min = from_order_key(klo), max = from_order_key(khi);
    if (min == 0.0f || max == 0.0f)
        min_max_first(x, QK, &min, &max);
    float d = (max - min) / 15.0f;
    float id = d == 0.0f ? 0.0f : 1.0f / d;
    uint8_t q[QK];
    for (int j = 0; j < QK; j++) {
        float t = x[j] - min;
        t = t * id;
        q[j] = numpy_nibble(t + 0.5f);
    }
    store_u16le(y, numpy_f32_to_f16(d));
    store_u16le(y + 2, numpy_f32_to_f16(min));
    pack_nibbles_split(q, y + 4);
}

static void q8_0_quantize_portable(const quant_job *job, size_t first, size_t count)
{
    for (size_t b = first; b < first + count; b++)
        q8_0_quantize_block(job->src + b * QK, job->dst + b * 34);
}

static void q4_0_quantize_portable(const quant_job *job, size_t first, size_t count)
{
    for (size_t b = first; b < first + count; b++)
        q4_0_quantize_block(job->src + b * QK, job->dst + b * 18);
}

static void q4_1_quantize_portable(const quant_job *job, size_t first, size_t count)
{
    for (size_t b = first; b < first + count; b++)
        q4_1_quantize_block(job->src + b * QK, job->dst + b * 20);
}

/* ---- APR quantize (apr-format / aprender semantics) --------------------- */

/* fold(0.0, f32::max) over |x|: NaN is skipped. */
static inline float max_abs_skip_nan(const float *x, size_t n)
{
    uint32_t m = 0;
    for (size_t j = 0; j < n; j++) {
        uint32_t a = abs_bits(x[j]);
        a = a <= INF_BITS ? a : 0;
        m = a > m ? a : m;
    }
    return bits_f32(m);
}

static void max_abs_fold_portable(const float *x, size_t n, float acc[2])
{
    float m = max_abs_skip_nan(x, n);
    if (m > acc[0])
        acc[0] = m;
}

/* APR_Q8 (add_q8_tensor): q = (x / scale).round().clamp(-127, 127) as i8. */
static void apr_q8_quantize_portable(const quant_job *job, size_t first, size_t count)
{
    const float scale = job->scale;
    const float *restrict x = job->src;
    uint8_t *restrict y = job->dst;
    for (size_t i = first; i < first + count; i++)
        y[i] = (uint8_t)rust_round_clamp(x[i] / scale, -127.0f, 127.0f);
}

/* APR_Q4 (add_q4_tensor) for one block of cnt <= 32 elements: the scale is
 * computed in f32 and stored as f16, but q uses the unrounded f32 scale; the
 * nibbles of missing elements stay 0. */
static void apr_q4_quantize_block(const float *x, size_t cnt, uint8_t *y)
{
    float amax = max_abs_skip_nan(x, cnt);
    float scale = amax == 0.0f ? 1.0f : amax / 7.0f;
    uint8_t nib[QK] = {0};
    for (size_t j = 0; j < cnt; j++)
        nib[j] = (uint8_t)(rust_round_clamp(x[j] / scale, -8.0f, 7.0f) + 8);
    store_u16le(y, numpy_f32_to_f16(scale));
    for (int k = 0; k < QK / 2; k++)
        y[2 + k] = (uint8_t)(nib[2 * k] | nib[2 * k + 1] << 4);
}

static void apr_q4_quantize_portable(const quant_job *job, size_t first, size_t count)
{
    for (size_t b = first; b < first + count; b++)
        apr_q4_quantize_block(job->src + b * QK, QK, job->dst + b * 18);
}

/* aprender format::quantize Q8_0Quantizer for one block of cnt <= 32:
 * scale = max|x| / 127 (1.0 if 0), q = (x * (1/scale)).round().clamp(-127,
 * 127) as i8, missing elements are zero bytes. */
static void apr_fq8_0_quantize_block(const float *x, size_t cnt, uint8_t *y)
{
    float amax = max_abs_skip_nan(x, cnt);
    float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
    float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    store_u16le(y, numpy_f32_to_f16(scale));
    memset(y + 2, 0, QK);
    for (size_t j = 0; j < cnt; j++)
        y[2 + j] = (uint8_t)rust_round_clamp(x[j] * inv, -127.0f, 127.0f);
}

/* aprender format::quantize Q4_0Quantizer: scale = max|x| / 7 (1.0 if 0),
 * q = (x * (1/scale)).round().clamp(-8, 7) + 8, interleaved like APR_Q4; the
 * block is padded with 0.0, whose nibble is 8. */
static void apr_fq4_0_quantize_block(const float *x, size_t cnt, uint8_t *y)
{
    float amax = max_abs_skip_nan(x, cnt);
    float scale = amax > 0.0f ? amax / 7.0f : 1.0f;
    float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    uint8_t nib[QK];
    for (size_t j = 0; j < QK; j++) {
        float v = j < cnt ? x[j] : 0.0f;
        nib[j] = (uint8_t)(rust_round_clamp(v * inv, -8.0f, 7.0f) + 8);
    }
    store_u16le(y, numpy_f32_to_f16(scale));
    for (int k = 0; k < QK / 2; k++)
        y[2 + k] = (uint8_t)(nib[2 * k] | nib[2 * k + 1] << 4);
}

static void apr_fq8_0_quantize_portable(const quant_job *job, size_t first, size_t count)
{
    for (size_t b = first; b < first + count; b++)
        apr_fq8_0_quantize_block(job->src + b * QK, QK, job->dst + b * 34);
}

static void apr_fq4_0_quantize_portable(const quant_job *job, size_t first, size_t count)
{
    for (size_t b = first; b < first + count; b++)
        apr_fq4_0_quantize_block(job->src + b * QK, QK, job->dst + b * 18);
}

/* ---- Q8_TENSOR ----------------------------------------------------------
 * Layout (decided by aprfast, spec 6.2.2 "Q8Tensor"): f32 scale LE | i32
 * zero_point LE | n x i8, with x ~= (q - zero_point) * scale; an empty
 * tensor has no bytes (like APR_Q8).
 *   lo = min(0, finite minimum), hi = max(0, finite maximum)  (NaN and +-inf
 *        are left out; the range always holds 0, so 0.0 is exact and the
 *        zero point never needs clamping for finite data)
 *   scale = (hi - lo) / 255, or 1.0 if hi == lo; if the f32 division
 *        overflows, hi/255 - lo/255; if it underflows to 0, the smallest
 *        subnormal
 *   zero_point = clamp(round_half_away(-128 - lo / scale), -128, 127)
 *   q = clamp(round_half_away(x / scale) + zero_point, -128, 127);
 *        NaN -> zero_point (so it reads back as 0.0), +-inf -> 127 / -128. */

/* Min and max of the finite elements, folded into acc[0] and acc[1]. */
static void finite_min_max_fold_portable(const float *x, size_t n, float acc[2])
{
    int32_t lo = order_key(acc[0]), hi = order_key(acc[1]);
    for (size_t j = 0; j < n; j++) {
        int finite = abs_bits(x[j]) < INF_BITS;
        int32_t k = order_key(x[j]);
        int32_t klo = finite ? k : INT32_MAX, khi = finite ? k : INT32_MIN;
        lo = klo < lo ? klo : lo;
        hi = khi > hi ? khi : hi;
    }
    acc[0] = from_order_key(lo);
    acc[1] = from_order_key(hi);
}

/* round_half_away(x / scale) + zero_point clamped to i8, NaN -> zero_point.
 * |x / scale| is clamped to 384 first: beyond 256 the sum saturates anyway
 * (|zero_point| <= 128), and the integer arithmetic is then exact. */
static inline int8_t q8_tensor_value(float x, float scale, int32_t zero_point)
{
    float v = x / scale;
    int nan = abs_bits(v) > INF_BITS;
    v = select_f32(nan, 0.0f, v);
    int32_t k = order_key(v);
    v = select_f32(k < order_key(-384.0f), -384.0f, v);
    v = select_f32(k > order_key(384.0f), 384.0f, v);
    int32_t s = round_half_away_or_zero(v) + zero_point;
    s = s < -128 ? -128 : s;
    s = s > 127 ? 127 : s;
    int32_t m = -nan;
    return (int8_t)((s & ~m) | (zero_point & m));
}

static void q8_tensor_quantize_portable(const quant_job *job, size_t first, size_t count)
{
    const float scale = job->scale;
    const int32_t zp = job->zero_point;
    const float *restrict x = job->src;
    uint8_t *restrict y = job->dst;
    for (size_t i = first; i < first + count; i++)
        y[i] = (uint8_t)q8_tensor_value(x[i], scale, zp);
}

/* Scale and zero point from the folded finite range (lo <= 0 <= hi). */
static void q8_tensor_params(float lo, float hi, float *scale, int32_t *zero_point)
{
    float s;
    if (hi == lo) {
        s = 1.0f;
    } else {
        s = (hi - lo) / 255.0f;
        if (s == INFINITY)
            s = hi / 255.0f - lo / 255.0f;
        else if (s == 0.0f)
            s = bits_f32(1);
    }
    /* Clamping before rounding gives the same integer (both ends are integers). */
    float z = -128.0f - lo / s;
    z = z < -128.0f ? -128.0f : z;
    z = z > 127.0f ? 127.0f : z;
    *scale = s;
    *zero_point = round_half_away_or_zero(z);
}

/* ---- Dequantize bodies --------------------------------------------------
 * Written so compilers vectorize them: each body is inlined into a portable
 * kernel, and those of Q8_0, Q4_K, APR_Q8 and Q8_TENSOR into the AVX2 and
 * AVX-512 kernels too.  Operand order follows gguf-py's expressions. */

/* a + b where a NaN in a wins over a NaN in b, as in NumPy's (d * q) + m on
 * x86 and Arm.  Compilers may swap the operands of a commutative add, and
 * addps returns its first operand's NaN; adding a to itself pins the payload. */
static inline float add_first_nan_wins(float a, float b)
{
    return a + (a != a ? a : b);
}

/* d * q + m can only meet two NaNs (whose order then matters) when m is a
 * NaN and d is inf or NaN; such blocks take the careful scalar loop. */
static inline int two_nans_possible(uint16_t d, uint16_t m)
{
    return (d & 0x7c00u) == 0x7c00u && (m & 0x7c00u) == 0x7c00u && (m & 0x03ffu);
}

static ALWAYS_INLINE void q8_0_dequantize_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 34, y += QK) {
        const float d = f16_to_f32(load_u16le(x));
        for (int j = 0; j < QK; j++)
            y[j] = (float)(int8_t)x[2 + j] * d;
    }
}

/* Low nibbles are elements 0..15, high nibbles 16..31: two simple loops
 * vectorize better than one loop storing both halves. */
static ALWAYS_INLINE void q4_0_dequantize_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 18, y += QK) {
        const float d = f16_to_f32(load_u16le(x));
        const uint8_t *qs = x + 2;
        for (int j = 0; j < QK / 2; j++)
            y[j] = d * (float)((qs[j] & 0x0F) - 8);
        for (int j = 0; j < QK / 2; j++)
            y[j + QK / 2] = d * (float)((qs[j] >> 4) - 8);
    }
}

static void q4_1_dequantize_two_nans(const uint8_t *x, float *y)
{
    const float d = f16_to_f32(load_u16le(x));
    const float m = f16_to_f32(load_u16le(x + 2));
    for (int j = 0; j < QK / 2; j++) {
        y[j] = add_first_nan_wins(d * (float)(x[4 + j] & 0x0F), m);
        y[j + QK / 2] = add_first_nan_wins(d * (float)(x[4 + j] >> 4), m);
    }
}

static ALWAYS_INLINE void q4_1_dequantize_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 20, y += QK) {
        if (two_nans_possible(load_u16le(x), load_u16le(x + 2))) {
            q4_1_dequantize_two_nans(x, y);
            continue;
        }
        const float d = f16_to_f32(load_u16le(x));
        const float m = f16_to_f32(load_u16le(x + 2));
        const uint8_t *qs = x + 4;
        for (int j = 0; j < QK / 2; j++) {
            float lo = d * (float)(qs[j] & 0x0F);
            y[j] = lo + m;
        }
        for (int j = 0; j < QK / 2; j++) {
            float hi = d * (float)(qs[j] >> 4);
            y[j + QK / 2] = hi + m;
        }
    }
}

static ALWAYS_INLINE void q5_0_dequantize_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 22, y += QK) {
        const float d = f16_to_f32(load_u16le(x));
        const uint32_t qh = load_u32le(x + 2);
        const uint8_t *qs = x + 6;
        for (int j = 0; j < QK / 2; j++) {
            int lo = (int)((qs[j] & 0x0Fu) | ((qh >> j) << 4 & 0x10u)) - 16;
            y[j] = d * (float)lo;
        }
        for (int j = 0; j < QK / 2; j++) {
            int hi = (int)((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10u)) - 16;
            y[j + QK / 2] = d * (float)hi;
        }
    }
}

static void q5_1_dequantize_two_nans(const uint8_t *x, float *y)
{
    const float d = f16_to_f32(load_u16le(x));
    const float m = f16_to_f32(load_u16le(x + 2));
    const uint32_t qh = load_u32le(x + 4);
    for (int j = 0; j < QK / 2; j++) {
        unsigned lo = (x[8 + j] & 0x0Fu) | ((qh >> j) << 4 & 0x10u);
        unsigned hi = (x[8 + j] >> 4) | ((qh >> (j + 12)) & 0x10u);
        y[j] = add_first_nan_wins(d * (float)lo, m);
        y[j + QK / 2] = add_first_nan_wins(d * (float)hi, m);
    }
}

static ALWAYS_INLINE void q5_1_dequantize_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 24, y += QK) {
        if (two_nans_possible(load_u16le(x), load_u16le(x + 2))) {
            q5_1_dequantize_two_nans(x, y);
            continue;
        }
        const float d = f16_to_f32(load_u16le(x));
        const float m = f16_to_f32(load_u16le(x + 2));
        const uint32_t qh = load_u32le(x + 4);
        const uint8_t *qs = x + 8;
        for (int j = 0; j < QK / 2; j++) {
            float lo = d * (float)((qs[j] & 0x0Fu) | ((qh >> j) << 4 & 0x10u));
            y[j] = lo + m;
        }
        for (int j = 0; j < QK / 2; j++) {
            float hi = d * (float)((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10u));
            y[j + QK / 2] = hi + m;
        }
    }
}

/* The 6-bit scales and mins of a Q4_K super-block (llama.cpp get_scale_min_k4). */
static inline void q4_k_scales_mins(const uint8_t *s, uint8_t sc[8], uint8_t mn[8])
{
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (uint8_t)((s[j + 8] & 0x0F) | (s[j] >> 6) << 4);
        mn[j + 4] = (uint8_t)((s[j + 8] >> 4) | (s[j + 4] >> 6) << 4);
    }
}

/* y = (d * sc) * q - dmin * m per 32-element sub-block; sub-block 2g takes
 * the low nibbles of qs[32g..32g+31], sub-block 2g+1 the high ones. */
static ALWAYS_INLINE void q4_k_dequantize_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 144, y += QK_K) {
        const float d = f16_to_f32(load_u16le(x));
        const float dmin = f16_to_f32(load_u16le(x + 2));
        uint8_t sc[8], mn[8];
        q4_k_scales_mins(x + 4, sc, mn);
        const uint8_t *qs = x + 16;
        for (int g = 0; g < 4; g++) {
            const float d1 = d * (float)sc[2 * g], m1 = dmin * (float)mn[2 * g];
            const float d2 = d * (float)sc[2 * g + 1], m2 = dmin * (float)mn[2 * g + 1];
            float *yg = y + 64 * g;
            const uint8_t *q = qs + 32 * g;
            for (int l = 0; l < 32; l++) {
                float lo = d1 * (float)(q[l] & 0x0F);
                float hi = d2 * (float)(q[l] >> 4);
                yg[l] = lo - m1;
                yg[l + 32] = hi - m2;
            }
        }
    }
}

/* Element 128h + 32k + l takes bits 4k.. of ql[64h + l (+32 for odd k)] and
 * bits 2k.. of qh[32h + l]; its scale is sc[(128h + 32k + l) / 16]; y =
 * (d * sc) * (q - 32). */
static ALWAYS_INLINE void q6_k_dequantize_body(const uint8_t *restrict x, float *restrict y, size_t nb)
{
    for (size_t b = 0; b < nb; b++, x += 210, y += QK_K) {
        const float d = f16_to_f32(load_u16le(x + 208));
        float ds[16];
        for (int i = 0; i < 16; i++)
            ds[i] = d * (float)(int8_t)x[192 + i];
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x + 64 * h, *qh = x + 128 + 32 * h;
            float *yh = y + 128 * h;
            for (int half = 0; half < 2; half++) {
                const float s0 = ds[8 * h + half], s1 = ds[8 * h + 2 + half];
                const float s2 = ds[8 * h + 4 + half], s3 = ds[8 * h + 6 + half];
                for (int l = 16 * half; l < 16 * half + 16; l++) {
                    int q0 = (int)((ql[l] & 0x0F) | (qh[l] & 3) << 4) - 32;
                    int q1 = (int)((ql[l + 32] & 0x0F) | (qh[l] >> 2 & 3) << 4) - 32;
                    int q2 = (int)((ql[l] >> 4) | (qh[l] >> 4 & 3) << 4) - 32;
                    int q3 = (int)((ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4) - 32;
                    yh[l] = s0 * (float)q0;
                    yh[l + 32] = s1 * (float)q1;
                    yh[l + 64] = s2 * (float)q2;
                    yh[l + 96] = s3 * (float)q3;
                }
            }
        }
    }
}

/* aprender-core dequantize_q4 (GH-186): a NaN, inf or |scale| < 6.1e-5 scale
 * reads as 0.0.  No f16 lies between 6.1e-5 and the smallest normal, so this
 * is "exponent field 0 or 31". */
static inline float apr_q4_safe_scale(uint16_t h)
{
    uint16_t exp = (h >> 10) & 0x1f;
    return exp == 0 || exp == 0x1f ? 0.0f : f16_to_f32(h);
}

/* Interleaved nibbles: element 2k low, 2k+1 high; y = f32(q - 8) * scale. */
static ALWAYS_INLINE void interleaved_q4_dequantize_body(const uint8_t *restrict x, float *restrict y, size_t nb,
                                                         int safe_scale)
{
    for (size_t b = 0; b < nb; b++, x += 18, y += QK) {
        uint16_t h = load_u16le(x);
        const float s = safe_scale ? apr_q4_safe_scale(h) : f16_to_f32(h);
        for (int k = 0; k < QK / 2; k++) {
            y[2 * k] = (float)((x[2 + k] & 0x0F) - 8) * s;
            y[2 * k + 1] = (float)((x[2 + k] >> 4) - 8) * s;
        }
    }
}

static ALWAYS_INLINE void apr_q8_dequantize_body(const uint8_t *restrict q, float *restrict y, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        y[i] = (float)(int8_t)q[i] * scale;
}

/* (q - zero_point) is exact in int32 for a zero point in i8 range (what the
 * quantizer writes); other zero points take the double path, also exact. */
static ALWAYS_INLINE void q8_tensor_dequantize_body(const uint8_t *restrict q, float *restrict y, size_t n,
                                                    float scale, int32_t zero_point)
{
    if (zero_point >= -128 && zero_point <= 127) {
        for (size_t i = 0; i < n; i++)
            y[i] = (float)((int32_t)(int8_t)q[i] - zero_point) * scale;
    } else {
        for (size_t i = 0; i < n; i++)
            y[i] = (float)((double)(int8_t)q[i] - (double)zero_point) * scale;
    }
}

/* The elements of a partial last block, one at a time. */
static void interleaved_q4_dequantize_partial(const uint8_t *x, float *y, size_t cnt, int safe_scale)
{
    uint16_t h = load_u16le(x);
    const float s = safe_scale ? apr_q4_safe_scale(h) : f16_to_f32(h);
    for (size_t j = 0; j < cnt; j++) {
        uint8_t byte = x[2 + j / 2];
        int nib = j % 2 ? byte >> 4 : byte & 0x0F;
        y[j] = (float)(nib - 8) * s;
    }
}

static void q8_0_dequantize_partial(const uint8_t *x, float *y, size_t cnt)
{
    const float d = f16_to_f32(load_u16le(x));
    for (size_t j = 0; j < cnt; j++)
        y[j] = (float)(int8_t)x[2 + j] * d;
}

/* Kernels over a range of whole blocks (a partial last block is finished by
 * the caller).  Those below are stamped out once per path from the bodies;
 * the compilers vectorize these well.  For the other types the AVX2 and
 * AVX-512 kernels are written by hand further down. */
#define DEFINE_CLONED_DEQUANTIZE_KERNELS(SUFFIX, TARGET)                                                 \
    static TARGET void q8_0_dequantize_##SUFFIX(const quant_job *job, size_t first, size_t count)       \
    {                                                                                                   \
        q8_0_dequantize_body(job->qsrc + first * 34, job->out + first * QK, count);                      \
    }                                                                                                   \
    static TARGET void q4_k_dequantize_##SUFFIX(const quant_job *job, size_t first, size_t count)       \
    {                                                                                                   \
        q4_k_dequantize_body(job->qsrc + first * 144, job->out + first * QK_K, count);                   \
    }                                                                                                   \
    static TARGET void apr_q8_dequantize_##SUFFIX(const quant_job *job, size_t first, size_t count)     \
    {                                                                                                   \
        apr_q8_dequantize_body(job->qsrc + first, job->out + first, count, job->scale);                 \
    }                                                                                                   \
    static TARGET void q8_tensor_dequantize_##SUFFIX(const quant_job *job, size_t first, size_t count)  \
    {                                                                                                   \
        q8_tensor_dequantize_body(job->qsrc + first, job->out + first, count, job->scale,               \
                                  job->zero_point);                                                     \
    }

#define NO_TARGET
DEFINE_CLONED_DEQUANTIZE_KERNELS(portable, NO_TARGET)

static void q4_0_dequantize_portable(const quant_job *job, size_t first, size_t count)
{
    q4_0_dequantize_body(job->qsrc + first * 18, job->out + first * QK, count);
}

static void q4_1_dequantize_portable(const quant_job *job, size_t first, size_t count)
{
    q4_1_dequantize_body(job->qsrc + first * 20, job->out + first * QK, count);
}

static void q5_0_dequantize_portable(const quant_job *job, size_t first, size_t count)
{
    q5_0_dequantize_body(job->qsrc + first * 22, job->out + first * QK, count);
}

static void q5_1_dequantize_portable(const quant_job *job, size_t first, size_t count)
{
    q5_1_dequantize_body(job->qsrc + first * 24, job->out + first * QK, count);
}

static void q6_k_dequantize_portable(const quant_job *job, size_t first, size_t count)
{
    q6_k_dequantize_body(job->qsrc + first * 210, job->out + first * QK_K, count);
}

static void apr_q4_dequantize_portable(const quant_job *job, size_t first, size_t count)
{
    interleaved_q4_dequantize_body(job->qsrc + first * 18, job->out + first * QK, count, 1);
}

static void apr_fq4_0_dequantize_portable(const quant_job *job, size_t first, size_t count)
{
    interleaved_q4_dequantize_body(job->qsrc + first * 18, job->out + first * QK, count, 0);
}

/* ======================================================================== */
/* x86-64: AVX2 and AVX-512.                                                */
/* ======================================================================== */

#ifdef HAVE_X86_KERNELS

DEFINE_CLONED_DEQUANTIZE_KERNELS(avx2, TARGET_AVX2)
DEFINE_CLONED_DEQUANTIZE_KERNELS(avx512, TARGET_AVX512)

/* ---- AVX2 helpers ------------------------------------------------------- */

static TARGET_AVX2 inline __m256 abs_avx2(__m256 v)
{
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}

/* round_half_away on 8 lanes: truncate, then step away from zero when the
 * dropped fraction (exact) is at least one half.  inf and NaN stay so. */
static TARGET_AVX2 inline __m256 round_half_away_avx2(__m256 v)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    __m256 step = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    return _mm256_add_ps(t, _mm256_and_ps(up, step));
}

static TARGET_AVX2 inline float hmax_avx2(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

static TARGET_AVX2 inline float hmin_avx2(__m256 v)
{
    __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_min_ps(m, _mm_movehl_ps(m, m));
    m = _mm_min_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

/* The low byte of each of 32 int32 lanes, in lane order (truncation, like
 * NumPy's cast; the packs cannot saturate after the mask). */
static TARGET_AVX2 inline __m256i low_bytes_avx2(__m256i a, __m256i b, __m256i c, __m256i d)
{
    const __m256i ff = _mm256_set1_epi32(0xFF);
    __m256i ab = _mm256_packus_epi32(_mm256_and_si256(a, ff), _mm256_and_si256(b, ff));
    __m256i cd = _mm256_packus_epi32(_mm256_and_si256(c, ff), _mm256_and_si256(d, ff));
    __m256i abcd = _mm256_packus_epi16(ab, cd);
    return _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* GGML nibble bytes from q[0..31] in four vectors (values 0..15):
 * byte j = q[j] | q[j+16] << 4. */
static TARGET_AVX2 inline __m128i split_nibbles_avx2(__m256i q0, __m256i q1, __m256i q2, __m256i q3)
{
    __m256i c0 = _mm256_or_si256(q0, _mm256_slli_epi32(q2, 4));
    __m256i c1 = _mm256_or_si256(q1, _mm256_slli_epi32(q3, 4));
    __m256i w = _mm256_packus_epi32(c0, c1);
    __m256i bytes = _mm256_packus_epi16(w, w);
    bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0));
    return _mm256_castsi256_si128(bytes);
}

/* Interleaved nibble bytes from 32 bytes of values 0..15 in element order:
 * byte k = b[2k] | b[2k+1] << 4. */
static TARGET_AVX2 inline __m128i interleaved_nibbles_avx2(__m256i bytes)
{
    __m256i lo = _mm256_and_si256(bytes, _mm256_set1_epi16(0x000F));
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), _mm256_set1_epi16(0x00F0));
    __m256i w = _mm256_or_si256(lo, hi);
    __m256i packed = _mm256_packus_epi16(w, w);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

static TARGET_AVX2 inline int any_nan_avx2(const __m256 v[4])
{
    __m256 u = _mm256_or_ps(_mm256_cmp_ps(v[0], v[1], _CMP_UNORD_Q), _mm256_cmp_ps(v[2], v[3], _CMP_UNORD_Q));
    return _mm256_movemask_ps(u) != 0;
}

static TARGET_AVX2 inline void load_block_avx2(const float *x, __m256 v[4])
{
    for (int k = 0; k < 4; k++)
        v[k] = _mm256_loadu_ps(x + 8 * k);
}

/* ---- AVX2 GGML quantize ------------------------------------------------- */

static TARGET_AVX2 void q8_0_quantize_avx2(const quant_job *job, size_t first, size_t count)
{
    for (size_t b = first; b < first + count; b++) {
        const float *x = job->src + b * QK;
        uint8_t *y = job->dst + b * 34;
        __m256 v[4];
        load_block_avx2(x, v);
        if (any_nan_avx2(v)) {
            q8_0_quantize_block(x, y);
            continue;
        }
        __m256 m = _mm256_max_ps(_mm256_max_ps(abs_avx2(v[0]), abs_avx2(v[1])),
                                 _mm256_max_ps(abs_avx2(v[2]), abs_avx2(v[3])));
        float d = hmax_avx2(m) / 127.0f;
        float id = d == 0.0f ? 0.0f : 1.0f / d;
        store_u16le(y, numpy_f32_to_f16(d));
        __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_cvttps_epi32(round_half_away_avx2(_mm256_mul_ps(v[k], vid)));
        _mm256_storeu_si256((__m256i *)(y + 2), low_bytes_avx2(q[0], q[1], q[2], q[3]));
    }
}

/* min(15, low byte of trunc(t)) on 8 lanes. */
static TARGET_AVX2 inline __m256i nibble_of_trunc_avx2(__m256 t)
{
    __m256i u = _mm256_and_si256(_mm256_cvttps_epi32(t), _mm256_set1_epi32(0xFF));
    return _mm256_min_epi32(u, _mm256_set1_epi32(15));
}

static TARGET_AVX2 void q4_0_quantize_avx2(const quant_job *job, size_t first, size_t count)
{
    for (size_t b = first; b < first + count; b++) {
        const float *x = job->src + b * QK;
        uint8_t *y = job->dst + b * 18;
        __m256 v[4], a[4];
        load_block_avx2(x, v);
        if (any_nan_avx2(v)) {
            q4_0_quantize_block(x, y);
            continue;
        }
        for (int k = 0; k < 4; k++)
            a[k] = abs_avx2(v[k]);
        float amax = hmax_avx2(_mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3])));
        /* argmax: the first lane equal to the maximum magnitude. */
        __m256 vmax = _mm256_set1_ps(amax);
        uint32_t hits = 0;
        for (int k = 0; k < 4; k++)
            hits |= (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(a[k], vmax, _CMP_EQ_OQ)) << (8 * k);
        float d = x[__builtin_ctz(hits)] / -8.0f;
        float id = d == 0.0f ? 0.0f : 1.0f / d;
        store_u16le(y, numpy_f32_to_f16(d));
        __m256 vid = _mm256_set1_ps(id), half = _mm256_set1_ps(8.5f);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = nibble_of_trunc_avx2(_mm256_add_ps(_mm256_mul_ps(v[k], vid), half));
        _mm_storeu_si128((__m128i *)(y + 2), split_nibbles_avx2(q[0], q[1], q[2], q[3]));
    }
}

static TARGET_AVX2 void q4_1_quantize_avx2(const quant_job *job, size_t first, size_t count)
{
    for (size_t b = first; b < first + count; b++) {
        const float *x = job->src + b * QK;
        uint8_t *y = job->dst + b * 20;
        __m256 v[4];
        load_block_avx2(x, v);
        if (any_nan_avx2(v)) {
            q4_1_quantize_block(x, y);
            continue;
        }
        float min = hmin_avx2(_mm256_min_ps(_mm256_min_ps(v[0], v[1]), _mm256_min_ps(v[2], v[3])));
        float max = hmax_avx2(_mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3])));
        if (min == 0.0f || max == 0.0f) {
            /* Which zero (+0 or -0) is stored depends on element order. */
            q4_1_quantize_block(x, y);
            continue;
        }
        float d = (max - min) / 15.0f;
        float id = d == 0.0f ? 0.0f : 1.0f / d;
        store_u16le(y, numpy_f32_to_f16(d));
        store_u16le(y + 2, numpy_f32_to_f16(min));
        __m256 vmin = _mm256_set1_ps(min), vid = _mm256_set1_ps(id), half = _mm256_set1_ps(0.5f);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = nibble_of_trunc_avx2(_mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(v[k], vmin), vid), half));
        _mm_storeu_si128((__m128i *)(y + 4), split_nibbles_avx2(q[0], q[1], q[2], q[3]));
    }
}

/* ---- AVX2 APR quantize -------------------------------------------------- */

static TARGET_AVX2 void max_abs_fold_avx2(const float *x, size_t n, float acc[2])
{
    /* max_ps returns its second operand when the first is NaN: NaN skipped. */
    __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        m0 = _mm256_max_ps(abs_avx2(_mm256_loadu_ps(x + i)), m0);
        m1 = _mm256_max_ps(abs_avx2(_mm256_loadu_ps(x + i + 8)), m1);
    }
    float m = hmax_avx2(_mm256_max_ps(m0, m1));
    float rest = max_abs_skip_nan(x + i, n - i);
    m = rest > m ? rest : m;
    if (m > acc[0])
        acc[0] = m;
}

/* Rust's round().clamp(lo, hi) as i8 (NaN -> 0) on 8 lanes, as int32. */
static TARGET_AVX2 inline __m256i rust_round_clamp_avx2(__m256 v, __m256 lo, __m256 hi)
{
    v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
    v = _mm256_min_ps(_mm256_max_ps(round_half_away_avx2(v), lo), hi);
    return _mm256_cvtps_epi32(v);
}

static TARGET_AVX2 void apr_q8_quantize_avx2(const quant_job *job, size_t first, size_t count)
{
    const __m256 scale = _mm256_set1_ps(job->scale);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const float *x = job->src;
    uint8_t *y = job->dst;
    size_t i = first, end = first + count;
    for (; i + 32 <= end; i += 32) {
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = rust_round_clamp_avx2(_mm256_div_ps(_mm256_loadu_ps(x + i + 8 * k), scale), lo, hi);
        _mm256_storeu_si256((__m256i *)(y + i), low_bytes_avx2(q[0], q[1], q[2], q[3]));
    }
    for (; i < end; i++)
        y[i] = (uint8_t)rust_round_clamp(x[i] / job->scale, -127.0f, 127.0f);
}

static TARGET_AVX2 void apr_q4_quantize_avx2(const quant_job *job, size_t first, size_t count)
{
    const __m256 lo = _mm256_set1_ps(-8.0f), hi = _mm256_set1_ps(7.0f);
    const __m256i eight = _mm256_set1_epi32(8);
    for (size_t b = first; b < first + count; b++) {
        const float *x = job->src + b * QK;
        uint8_t *y = job->dst + b * 18;
        __m256 v[4];
        load_block_avx2(x, v);
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++)
            m = _mm256_max_ps(abs_avx2(v[k]), m);
        float amax = hmax_avx2(m);
        float scale = amax == 0.0f ? 1.0f : amax / 7.0f;
        store_u16le(y, numpy_f32_to_f16(scale));
        __m256 vs = _mm256_set1_ps(scale);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_add_epi32(rust_round_clamp_avx2(_mm256_div_ps(v[k], vs), lo, hi), eight);
        _mm_storeu_si128((__m128i *)(y + 2), interleaved_nibbles_avx2(low_bytes_avx2(q[0], q[1], q[2], q[3])));
    }
}

/* ---- AVX2 Q8_TENSOR ----------------------------------------------------- */

static TARGET_AVX2 void finite_min_max_fold_avx2(const float *x, size_t n, float acc[2])
{
    const __m256 inf = _mm256_set1_ps(INFINITY), ninf = _mm256_set1_ps(-INFINITY);
    __m256 lo = inf, hi = ninf;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 finite = _mm256_cmp_ps(abs_avx2(v), inf, _CMP_LT_OQ);
        lo = _mm256_min_ps(lo, _mm256_blendv_ps(inf, v, finite));
        hi = _mm256_max_ps(hi, _mm256_blendv_ps(ninf, v, finite));
    }
    float l = hmin_avx2(lo), h = hmax_avx2(hi);
    acc[0] = l < acc[0] ? l : acc[0];
    acc[1] = h > acc[1] ? h : acc[1];
    finite_min_max_fold_portable(x + i, n - i, acc);
}

static TARGET_AVX2 void q8_tensor_quantize_avx2(const quant_job *job, size_t first, size_t count)
{
    const __m256 scale = _mm256_set1_ps(job->scale), zp = _mm256_set1_ps((float)job->zero_point);
    const __m256 lo = _mm256_set1_ps(-128.0f), hi = _mm256_set1_ps(127.0f);
    const float *x = job->src;
    uint8_t *y = job->dst;
    size_t i = first, end = first + count;
    for (; i + 32 <= end; i += 32) {
        __m256i q[4];
        for (int k = 0; k < 4; k++) {
            __m256 v = _mm256_div_ps(_mm256_loadu_ps(x + i + 8 * k), scale);
            __m256 s = _mm256_add_ps(round_half_away_avx2(v), zp);
            s = _mm256_blendv_ps(s, zp, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            q[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(s, lo), hi));
        }
        _mm256_storeu_si256((__m256i *)(y + i), low_bytes_avx2(q[0], q[1], q[2], q[3]));
    }
    for (; i < end; i++)
        y[i] = (uint8_t)q8_tensor_value(x[i], job->scale, job->zero_point);
}

/* ---- AVX-512 helpers ---------------------------------------------------- */

static TARGET_AVX512 inline __m512 round_half_away_avx512(__m512 v)
{
    const __m512 sign = _mm512_set1_ps(-0.0f);
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
    __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    __m512 step = _mm512_or_ps(_mm512_and_ps(v, sign), _mm512_set1_ps(1.0f));
    return _mm512_mask_add_ps(t, up, t, step);
}

static TARGET_AVX512 inline __mmask16 nan_mask_avx512(__m512 a, __m512 b)
{
    return _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
}

/* min(15, low byte of trunc(t)) on 16 lanes. */
static TARGET_AVX512 inline __m512i nibble_of_trunc_avx512(__m512 t)
{
    __m512i u = _mm512_and_si512(_mm512_cvttps_epi32(t), _mm512_set1_epi32(0xFF));
    return _mm512_min_epi32(u, _mm512_set1_epi32(15));
}

/* Interleaved nibble bytes from 32 values 0..15 in two vectors. */
static TARGET_AVX512 inline __m128i interleaved_nibbles_avx512(__m512i q0, __m512i q1)
{
    __m256i bytes = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8(q0)),
                                            _mm512_cvtepi32_epi8(q1), 1);
    __m256i lo = _mm256_and_si256(bytes, _mm256_set1_epi16(0x000F));
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), _mm256_set1_epi16(0x00F0));
    return _mm256_cvtepi16_epi8(_mm256_or_si256(lo, hi));
}

/* Rust's round().clamp(lo, hi) as i8 (NaN -> 0) on 16 lanes, as int32. */
static TARGET_AVX512 inline __m512i rust_round_clamp_avx512(__m512 v, __m512 lo, __m512 hi)
{
    v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);
    v = _mm512_min_ps(_mm512_max_ps(round_half_away_avx512(v), lo), hi);
    return _mm512_cvtps_epi32(v);
}

/* ---- AVX-512 GGML quantize ---------------------------------------------- */

static TARGET_AVX512 void q8_0_quantize_avx512(const quant_job *job, size_t first, size_t count)
{
    for (size_t b = first; b < first + count; b++) {
        const float *x = job->src + b * QK;
        uint8_t *y = job->dst + b * 34;
        __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        if (nan_mask_avx512(v0, v1)) {
            q8_0_quantize_block(x, y);
            continue;
        }
        float d = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1))) / 127.0f;
        float id = d == 0.0f ? 0.0f : 1.0f / d;
        store_u16le(y, numpy_f32_to_f16(d));
        __m512 vid = _mm512_set1_ps(id);
        __m512i q0 = _mm512_cvttps_epi32(round_half_away_avx512(_mm512_mul_ps(v0, vid)));
        __m512i q1 = _mm512_cvttps_epi32(round_half_away_avx512(_mm512_mul_ps(v1, vid)));
        _mm_storeu_si128((__m128i *)(y + 2), _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(y + 18), _mm512_cvtepi32_epi8(q1));
    }
}

static TARGET_AVX512 void q4_0_quantize_avx512(const quant_job *job, size_t first, size_t count)
{
    for (size_t b = first; b < first + count; b++) {
        const float *x = job->src + b * QK;
        uint8_t *y = job->dst + b * 18;
        __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        if (nan_mask_avx512(v0, v1)) {
            q4_0_quantize_block(x, y);
            continue;
        }
        __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
        __m512 vmax = _mm512_set1_ps(_mm512_reduce_max_ps(_mm512_max_ps(a0, a1)));
        uint32_t hits = (uint32_t)_mm512_cmp_ps_mask(a0, vmax, _CMP_EQ_OQ) |
                        (uint32_t)_mm512_cmp_ps_mask(a1, vmax, _CMP_EQ_OQ) << 16;
        float d = x[__builtin_ctz(hits)] / -8.0f;
        float id = d == 0.0f ? 0.0f : 1.0f / d;
        store_u16le(y, numpy_f32_to_f16(d));
        __m512 vid = _mm512_set1_ps(id), half = _mm512_set1_ps(8.5f);
        __m512i q0 = nibble_of_trunc_avx512(_mm512_add_ps(_mm512_mul_ps(v0, vid), half));
        __m512i q1 = nibble_of_trunc_avx512(_mm512_add_ps(_mm512_mul_ps(v1, vid), half));
        _mm_storeu_si128((__m128i *)(y + 2), _mm512_cvtepi32_epi8(_mm512_or_si512(q0, _mm512_slli_epi32(q1, 4))));
    }
}

static TARGET_AVX512 void q4_1_quantize_avx512(const quant_job *job, size_t first, size_t count)
{
    for (size_t b = first; b < first + count; b++) {
        const float *x = job->src + b * QK;
        uint8_t *y = job->dst + b * 20;
        __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        if (nan_mask_avx512(v0, v1)) {
            q4_1_quantize_block(x, y);
            continue;
        }
        float min = _mm512_reduce_min_ps(_mm512_min_ps(v0, v1));
        float max = _mm512_reduce_max_ps(_mm512_max_ps(v0, v1));
        if (min == 0.0f || max == 0.0f) {
            q4_1_quantize_block(x, y); /* the sign of the zero depends on element order */
            continue;
        }
        float d = (max - min) / 15.0f;
        float id = d == 0.0f ? 0.0f : 1.0f / d;
        store_u16le(y, numpy_f32_to_f16(d));
        store_u16le(y + 2, numpy_f32_to_f16(min));
        __m512 vmin = _mm512_set1_ps(min), vid = _mm512_set1_ps(id), half = _mm512_set1_ps(0.5f);
        __m512i q0 = nibble_of_trunc_avx512(_mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(v0, vmin), vid), half));
        __m512i q1 = nibble_of_trunc_avx512(_mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(v1, vmin), vid), half));
        _mm_storeu_si128((__m128i *)(y + 4), _mm512_cvtepi32_epi8(_mm512_or_si512(q0, _mm512_slli_epi32(q1, 4))));
    }
}

/* ---- AVX-512 APR quantize ----------------------------------------------- */

static TARGET_AVX512 void max_abs_fold_avx512(const float *x, size_t n, float acc[2])
{
    __m512 m0 = _mm512_setzero_ps(), m1 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        m0 = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i)), m0);
        m1 = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i + 16)), m1);
    }
    float m = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
    float rest = max_abs_skip_nan(x + i, n - i);
    m = rest > m ? rest : m;
    if (m > acc[0])
        acc[0] = m;
}

static TARGET_AVX512 void apr_q8_quantize_avx512(const quant_job *job, size_t first, size_t count)
{
    const __m512 scale = _mm512_set1_ps(job->scale);
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    const float *x = job->src;
    uint8_t *y = job->dst;
    size_t i = first, end = first + count;
    for (; i + 32 <= end; i += 32) {
        __m512i q0 = rust_round_clamp_avx512(_mm512_div_ps(_mm512_loadu_ps(x + i), scale), lo, hi);
        __m512i q1 = rust_round_clamp_avx512(_mm512_div_ps(_mm512_loadu_ps(x + i + 16), scale), lo, hi);
        _mm_storeu_si128((__m128i *)(y + i), _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(y + i + 16), _mm512_cvtepi32_epi8(q1));
    }
    for (; i < end; i++)
        y[i] = (uint8_t)rust_round_clamp(x[i] / job->scale, -127.0f, 127.0f);
}

static TARGET_AVX512 void apr_q4_quantize_avx512(const quant_job *job, size_t first, size_t count)
{
    const __m512 lo = _mm512_set1_ps(-8.0f), hi = _mm512_set1_ps(7.0f);
    const __m512i eight = _mm512_set1_epi32(8);
    for (size_t b = first; b < first + count; b++) {
        const float *x = job->src + b * QK;
        uint8_t *y = job->dst + b * 18;
        __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        __m512 m = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_max_ps(_mm512_abs_ps(v1), _mm512_setzero_ps()));
        float amax = _mm512_reduce_max_ps(m);
        float scale = amax == 0.0f ? 1.0f : amax / 7.0f;
        store_u16le(y, numpy_f32_to_f16(scale));
        __m512 vs = _mm512_set1_ps(scale);
        __m512i q0 = _mm512_add_epi32(rust_round_clamp_avx512(_mm512_div_ps(v0, vs), lo, hi), eight);
        __m512i q1 = _mm512_add_epi32(rust_round_clamp_avx512(_mm512_div_ps(v1, vs), lo, hi), eight);
        _mm_storeu_si128((__m128i *)(y + 2), interleaved_nibbles_avx512(q0, q1));
    }
}

static TARGET_AVX512 void finite_min_max_fold_avx512(const float *x, size_t n, float acc[2])
{
    const __m512 inf = _mm512_set1_ps(INFINITY);
    __m512 lo = inf, hi = _mm512_set1_ps(-INFINITY);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __mmask16 finite = _mm512_cmp_ps_mask(_mm512_abs_ps(v), inf, _CMP_LT_OQ);
        lo = _mm512_mask_min_ps(lo, finite, lo, v);
        hi = _mm512_mask_max_ps(hi, finite, hi, v);
    }
    float l = _mm512_reduce_min_ps(lo), h = _mm512_reduce_max_ps(hi);
    acc[0] = l < acc[0] ? l : acc[0];
    acc[1] = h > acc[1] ? h : acc[1];
    finite_min_max_fold_portable(x + i, n - i, acc);
}

static TARGET_AVX512 void q8_tensor_quantize_avx512(const quant_job *job, size_t first, size_t count)
{
    const __m512 scale = _mm512_set1_ps(job->scale), zp = _mm512_set1_ps((float)job->zero_point);
    const __m512 lo = _mm512_set1_ps(-128.0f), hi = _mm512_set1_ps(127.0f);
    const float *x = job->src;
    uint8_t *y = job->dst;
    size_t i = first, end = first + count;
    for (; i + 16 <= end; i += 16) {
        __m512 v = _mm512_div_ps(_mm512_loadu_ps(x + i), scale);
        __m512 s = _mm512_add_ps(round_half_away_avx512(v), zp);
        s = _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), zp);
        __m512i q = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(s, lo), hi));
        _mm_storeu_si128((__m128i *)(y + i), _mm512_cvtepi32_epi8(q));
    }
    for (; i < end; i++)
        y[i] = (uint8_t)q8_tensor_value(x[i], job->scale, job->zero_point);
}

/* ---- Hand-written dequantize --------------------------------------------
 * The byte work (nibbles, high bits) is done on 16 or 32 bytes with AVX2
 * instructions, which the AVX-512 kernels inline too; only the widening to
 * floats and the stores differ, so each kernel is stamped out twice. */

/* Q4_0 / Q4_1 / Q5_x nibbles: q[j] = qs[j] & 15 (j < 16), q[16+j] = qs[j] >> 4. */
static TARGET_AVX2 inline void split_nibble_bytes(const uint8_t *qs, __m128i *lo, __m128i *hi)
{
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m128i v = _mm_loadu_si128((const __m128i *)qs);
    *lo = _mm_and_si128(v, m4);
    *hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
}

/* APR_Q4 nibbles: q[2k] = qs[k] & 15, q[2k+1] = qs[k] >> 4. */
static TARGET_AVX2 inline void interleaved_nibble_bytes(const uint8_t *qs, __m128i *lo, __m128i *hi)
{
    __m128i a, b;
    split_nibble_bytes(qs, &a, &b);
    *lo = _mm_unpacklo_epi8(a, b);
    *hi = _mm_unpackhi_epi8(a, b);
}

/* Q5_x fifth bits: byte j of the result is 0x10 if bit j of qh is set. */
static TARGET_AVX2 inline __m256i fifth_bits(uint32_t qh)
{
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* Q5_x quants 0..31 of a block as bytes, in element order. */
static TARGET_AVX2 inline __m256i q5_bytes(const uint8_t *qs, uint32_t qh)
{
    __m128i lo, hi;
    split_nibble_bytes(qs, &lo, &hi);
    return _mm256_or_si256(_mm256_set_m128i(hi, lo), fifth_bits(qh));
}

/* Q6_K: the 4 x 32 quants (still biased by 32) of one 128-element half. */
static TARGET_AVX2 inline void q6_k_half_bytes(const uint8_t *ql, const uint8_t *qh, __m256i q[4])
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
    __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    /* Two masked bits shifted left by 4 stay inside their byte. */
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m3), 4));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m3), 4));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m3), 4));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m3), 4));
}

/* 16 signed bytes -> 16 floats, times s (NumPy's d * q), plus m when given. */
static TARGET_AVX2 inline void store16_avx2(float *y, __m128i q, __m256 s)
{
    _mm256_storeu_ps(y, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)))));
}

static TARGET_AVX2 inline void store16_add_avx2(float *y, __m128i q, __m256 s, __m256 m)
{
    __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
    __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
    _mm256_storeu_ps(y, _mm256_add_ps(_mm256_mul_ps(s, q0), m));
    _mm256_storeu_ps(y + 8, _mm256_add_ps(_mm256_mul_ps(s, q1), m));
}

static TARGET_AVX512 inline void store16_avx512(float *y, __m128i q, __m512 s)
{
    _mm512_storeu_ps(y, _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q))));
}

static TARGET_AVX512 inline void store16_add_avx512(float *y, __m128i q, __m512 s, __m512 m)
{
    _mm512_storeu_ps(y, _mm512_add_ps(_mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q))), m));
}

/* VEC, SET1, STORE16 and STORE16_ADD name one ISA's float vector, broadcast
 * and the two stores above.  Blocks where d * q + m may meet two NaNs go to
 * the scalar code, as the add's operand order is not kept by compilers. */
#define DEFINE_HAND_DEQUANTIZE_KERNELS(SUFFIX, TARGET, VEC, SET1, STORE16, STORE16_ADD)                  \
    static TARGET void q4_0_dequantize_##SUFFIX(const quant_job *job, size_t first, size_t count)       \
    {                                                                                                   \
        const uint8_t *x = job->qsrc + first * 18;                                                      \
        float *y = job->out + first * QK;                                                               \
        const __m128i eight = _mm_set1_epi8(8);                                                         \
        for (size_t b = 0; b < count; b++, x += 18, y += QK) {                                          \
            VEC d = SET1(f16_to_f32(load_u16le(x)));                                                    \
            __m128i lo, hi;                                                                             \
            split_nibble_bytes(x + 2, &lo, &hi);                                                        \
            STORE16(y, _mm_sub_epi8(lo, eight), d);                                                     \
            STORE16(y + 16, _mm_sub_epi8(hi, eight), d);                                                \
        }                                                                                               \
    }                                                                                                   \
    static TARGET void q4_1_dequantize_##SUFFIX(const quant_job *job, size_t first, size_t count)       \
    {                                                                                                   \
        const uint8_t *x = job->qsrc + first * 20;                                                      \
        float *y = job->out + first * QK;                                                               \
        for (size_t b = 0; b < count; b++, x += 20, y += QK) {                                          \
            if (two_nans_possible(load_u16le(x), load_u16le(x + 2))) {                                  \
                q4_1_dequantize_two_nans(x, y);                                                         \
                continue;                                                                               \
            }                                                                                           \
            VEC d = SET1(f16_to_f32(load_u16le(x))), m = SET1(f16_to_f32(load_u16le(x + 2)));           \
            __m128i lo, hi;                                                                             \
            split_nibble_bytes(x + 4, &lo, &hi);                                                        \
            STORE16_ADD(y, lo, d, m);                                                                   \
            STORE16_ADD(y + 16, hi, d, m);                                                              \
        }                                                                                               \
    }                                                                                                   \
    static TARGET void q5_0_dequantize_##SUFFIX(const quant_job *job, size_t first, size_t count)       \
    {                                                                                                   \
        const uint8_t *x = job->qsrc + first * 22;                                                      \
        float *y = job->out + first * QK;                                                               \
        for (size_t b = 0; b < count; b++, x += 22, y += QK) {                                          \
            VEC d = SET1(f16_to_f32(load_u16le(x)));                                                    \
            __m256i q = _mm256_sub_epi8(q5_bytes(x + 6, load_u32le(x + 2)), _mm256_set1_epi8(16));      \
            STORE16(y, _mm256_castsi256_si128(q), d);                                                   \
            STORE16(y + 16, _mm256_extracti128_si256(q, 1), d);                                         \
        }                                                                                               \
    }                                                                                                   \
    static TARGET void q5_1_dequantize_##SUFFIX(const quant_job *job, size_t first, size_t count)       \
    {                                                                                                   \
        const uint8_t *x = job->qsrc + first * 24;                                                      \
        float *y = job->out + first * QK;                                                               \
        for (size_t b = 0; b < count; b++, x += 24, y += QK) {                                          \
            if (two_nans_possible(load_u16le(x), load_u16le(x + 2))) {                                  \
                q5_1_dequantize_two_nans(x, y);                                                         \
                continue;                                                                               \
            }                                                                                           \
            VEC d = SET1(f16_to_f32(load_u16le(x))), m = SET1(f16_to_f32(load_u16le(x + 2)));           \
            __m256i q = q5_bytes(x + 8, load_u32le(x + 4));                                             \
            STORE16_ADD(y, _mm256_castsi256_si128(q), d, m);                                            \
            STORE16_ADD(y + 16, _mm256_extracti128_si256(q, 1), d, m);                                  \
        }                                                                                               \
    }                                                                                                   \
    static TARGET void q6_k_dequantize_##SUFFIX(const quant_job *job, size_t first, size_t count)       \
    {                                                                                                   \
        const uint8_t *x = job->qsrc + first * 210;                                                     \
        float *y = job->out + first * QK_K;                                                             \
        const __m256i bias = _mm256_set1_epi8(32);                                                      \
        for (size_t b = 0; b < count; b++, x += 210, y += QK_K) {                                       \
            const float d = f16_to_f32(load_u16le(x + 208));                                            \
            for (int h = 0; h < 2; h++) {                                                               \
                __m256i q[4];                                                                           \
                q6_k_half_bytes(x + 64 * h, x + 128 + 32 * h, q);                                       \
                for (int k = 0; k < 4; k++) {                                                           \
                    /* Elements 128h + 32k + (0..15 | 16..31); scale (d * sc) first. */                 \
                    const int8_t *sc = (const int8_t *)x + 192 + 8 * h + 2 * k;                         \
                    __m256i qk = _mm256_sub_epi8(q[k], bias);                                           \
                    float *yk = y + 128 * h + 32 * k;                                                   \
                    STORE16(yk, _mm256_castsi256_si128(qk), SET1(d * (float)sc[0]));                     \
                    STORE16(yk + 16, _mm256_extracti128_si256(qk, 1), SET1(d * (float)sc[1]));          \
                }                                                                                       \
            }                                                                                           \
        }                                                                                               \
    }                                                                                                   \
    /* APR_Q4 (scale checked, GH-186) and APR_FQ4_0; Rust multiplies q * scale. */                      \
    static TARGET void interleaved_q4_dequantize_##SUFFIX(const quant_job *job, size_t first, size_t count, \
                                                          int safe_scale)                               \
    {                                                                                                   \
        const uint8_t *x = job->qsrc + first * 18;                                                      \
        float *y = job->out + first * QK;                                                               \
        const __m128i eight = _mm_set1_epi8(8);                                                         \
        for (size_t b = 0; b < count; b++, x += 18, y += QK) {                                          \
            uint16_t h = load_u16le(x);                                                                 \
            VEC s = SET1(safe_scale ? apr_q4_safe_scale(h) : f16_to_f32(h));                            \
            __m128i lo, hi;                                                                             \
            interleaved_nibble_bytes(x + 2, &lo, &hi);                                                  \
            STORE16(y, _mm_sub_epi8(lo, eight), s);                                                     \
            STORE16(y + 16, _mm_sub_epi8(hi, eight), s);                                                \
        }                                                                                               \
    }                                                                                                   \
    static TARGET void apr_q4_dequantize_##SUFFIX(const quant_job *job, size_t first, size_t count)     \
    {                                                                                                   \
        interleaved_q4_dequantize_##SUFFIX(job, first, count, 1);                                       \
    }                                                                                                   \
    static TARGET void apr_fq4_0_dequantize_##SUFFIX(const quant_job *job, size_t first, size_t count)  \
    {                                                                                                   \
        interleaved_q4_dequantize_##SUFFIX(job, first, count, 0);                                       \
    }

DEFINE_HAND_DEQUANTIZE_KERNELS(avx2, TARGET_AVX2, __m256, _mm256_set1_ps, store16_avx2, store16_add_avx2)
DEFINE_HAND_DEQUANTIZE_KERNELS(avx512, TARGET_AVX512, __m512, _mm512_set1_ps, store16_avx512, store16_add_avx512)

/* ---- Detection ---------------------------------------------------------- */

/* Bit mask of the x86 paths this CPU and OS can run (cpu.h leaves out
 * features whose register state the OS does not save). */
static int x86_path_mask(unsigned int f)
{
    int mask = 0;
    const unsigned int avx2 = APR_CPU_AVX | APR_CPU_AVX2;
    const unsigned int avx512 = APR_CPU_AVX512F | APR_CPU_AVX512DQ | APR_CPU_AVX512BW | APR_CPU_AVX512VL;
    if ((f & avx2) != avx2)
        return 0;
    mask |= 1 << APR_QUANT_AVX2;
    if ((f & avx512) == avx512)
        mask |= 1 << APR_QUANT_AVX512;
    return mask;
}

#endif /* HAVE_X86_KERNELS */

/* ======================================================================== */
/* Dispatch.                                                                */
/* ======================================================================== */

/* Bit p set when path p can run; the CPU features behind it are cached. */
static int path_mask(void)
{
    int mask = 1 << APR_QUANT_PORTABLE;
#ifdef HAVE_X86_KERNELS
    mask |= x86_path_mask(apr_cpu_features());
#endif
    return mask;
}

static int is_known_path(int path)
{
    return path >= APR_QUANT_PORTABLE && path < APR_QUANT_PATH_COUNT;
}

static int best_path_in(int mask)
{
    if (mask & 1 << APR_QUANT_AVX512)
        return APR_QUANT_AVX512;
    if (mask & 1 << APR_QUANT_AVX2)
        return APR_QUANT_AVX2;
    return APR_QUANT_PORTABLE;
}

/* The path that will really run for a requested one. */
static int resolve_path(int path)
{
    int mask = path_mask();
    if (path == APR_QUANT_AUTO)
        return best_path_in(mask);
    if (!is_known_path(path) || !(mask & 1 << path))
        return APR_QUANT_PORTABLE;
    return path;
}

int apr_quant_path_available(int path)
{
    if (path == APR_QUANT_AUTO)
        return 1;
    return is_known_path(path) && (path_mask() & 1 << path) != 0;
}

int apr_quant_best_path(void)
{
    return best_path_in(path_mask());
}

const char *apr_quant_path_name(int path)
{
    switch (path) {
    case APR_QUANT_AUTO:
        return "auto";
    case APR_QUANT_PORTABLE:
        return "portable";
    case APR_QUANT_AVX2:
        return "avx2";
    case APR_QUANT_AVX512:
        return "avx512";
    default:
        return "unknown";
    }
}

/* The types of quantize_ggml.c, through their function there. */
static void ggml_blocks_quantize(const quant_job *job, size_t first, size_t count)
{
    job->ggml_quantize(job->src + first * job->unit, job->dst + first * job->block_bytes, count);
}

/* Kernel of (type, path) for quantize; NULL if the type cannot be quantized.
 * Per-tensor types also get the fold that computes their parameters. */
static block_kernel quantize_kernel(int type, int path, fold_kernel *fold)
{
    (void)path; /* only the x86 kernels look at it */
    *fold = NULL;
    switch (type) {
    case APR_QT_Q8_0:
#ifdef HAVE_X86_KERNELS
        if (path == APR_QUANT_AVX512)
            return q8_0_quantize_avx512;
        if (path == APR_QUANT_AVX2)
            return q8_0_quantize_avx2;
#endif
        return q8_0_quantize_portable;
    case APR_QT_Q4_0:
#ifdef HAVE_X86_KERNELS
        if (path == APR_QUANT_AVX512)
            return q4_0_quantize_avx512;
        if (path == APR_QUANT_AVX2)
            return q4_0_quantize_avx2;
#endif
        return q4_0_quantize_portable;
    case APR_QT_Q4_1:
#ifdef HAVE_X86_KERNELS
        if (path == APR_QUANT_AVX512)
            return q4_1_quantize_avx512;
        if (path == APR_QUANT_AVX2)
            return q4_1_quantize_avx2;
#endif
        return q4_1_quantize_portable;
    case APR_QT_APR_Q8:
#ifdef HAVE_X86_KERNELS
        if (path == APR_QUANT_AVX512) {
            *fold = max_abs_fold_avx512;
            return apr_q8_quantize_avx512;
        }
        if (path == APR_QUANT_AVX2) {
            *fold = max_abs_fold_avx2;
            return apr_q8_quantize_avx2;
        }
#endif
        *fold = max_abs_fold_portable;
        return apr_q8_quantize_portable;
    case APR_QT_APR_Q4:
#ifdef HAVE_X86_KERNELS
        if (path == APR_QUANT_AVX512)
            return apr_q4_quantize_avx512;
        if (path == APR_QUANT_AVX2)
            return apr_q4_quantize_avx2;
#endif
        return apr_q4_quantize_portable;
    case APR_QT_Q8_TENSOR:
#ifdef HAVE_X86_KERNELS
        if (path == APR_QUANT_AVX512) {
            *fold = finite_min_max_fold_avx512;
            return q8_tensor_quantize_avx512;
        }
        if (path == APR_QUANT_AVX2) {
            *fold = finite_min_max_fold_avx2;
            return q8_tensor_quantize_avx2;
        }
#endif
        *fold = finite_min_max_fold_portable;
        return q8_tensor_quantize_portable;
    /* aprender's format::quantize types are rare: portable only. */
    case APR_QT_APR_FQ8_0:
        return apr_fq8_0_quantize_portable;
    case APR_QT_APR_FQ4_0:
        return apr_fq4_0_quantize_portable;
    default:
        return apr_ggml_quantizer(type) ? ggml_blocks_quantize : NULL;
    }
}

#ifdef HAVE_X86_KERNELS
#define PICK_DEQUANTIZE(name, path)                                                                     \
    ((path) == APR_QUANT_AVX512 ? name##_avx512 : (path) == APR_QUANT_AVX2 ? name##_avx2 : name##_portable)
#else
#define PICK_DEQUANTIZE(name, path) name##_portable
#endif

/* The types of quant_ggml.c, through their per-path function there. */
static void ggml_blocks_dequantize(const quant_job *job, size_t first, size_t count)
{
    job->ggml_blocks(job->qsrc + first * job->block_bytes, job->out + first * job->unit, count);
}

static block_kernel dequantize_kernel(int type, int path)
{
    (void)path; /* only the x86 kernels look at it */
    switch (type) {
    case APR_QT_Q8_0:
        return PICK_DEQUANTIZE(q8_0_dequantize, path);
    case APR_QT_Q4_0:
        return PICK_DEQUANTIZE(q4_0_dequantize, path);
    case APR_QT_Q4_1:
        return PICK_DEQUANTIZE(q4_1_dequantize, path);
    case APR_QT_Q5_0:
        return PICK_DEQUANTIZE(q5_0_dequantize, path);
    case APR_QT_Q5_1:
        return PICK_DEQUANTIZE(q5_1_dequantize, path);
    case APR_QT_Q4_K:
        return PICK_DEQUANTIZE(q4_k_dequantize, path);
    case APR_QT_Q6_K:
        return PICK_DEQUANTIZE(q6_k_dequantize, path);
    case APR_QT_APR_Q8:
        return PICK_DEQUANTIZE(apr_q8_dequantize, path);
    case APR_QT_APR_Q4:
        return PICK_DEQUANTIZE(apr_q4_dequantize, path);
    case APR_QT_Q8_TENSOR:
        return PICK_DEQUANTIZE(q8_tensor_dequantize, path);
    case APR_QT_APR_FQ8_0: /* whole blocks are Q8_0 blocks */
        return PICK_DEQUANTIZE(q8_0_dequantize, path);
    case APR_QT_APR_FQ4_0:
        return PICK_DEQUANTIZE(apr_fq4_0_dequantize, path);
    default:
        return apr_ggml_dequantizer(type, path) ? ggml_blocks_dequantize : NULL;
    }
}

/* ======================================================================== */
/* Threads.                                                                 */
/* ======================================================================== */

/* Starting and joining a thread costs tens of microseconds, about what one
 * core needs for 64K elements here; below 256K elements a thread, the
 * second one does not pay. */
#define PARALLEL_MIN_ELEMS ((size_t)1 << 18)
/* Threads share the work in chunks of this many values (rounded to blocks): 50-300 us
 * each, the most a caller waits for a late thread's last chunk. */
#define CHUNK_ELEMS ((size_t)1 << 17)
#define MAX_THREADS APR_PARALLEL_MAX_THREADS

int apr_quant_default_threads(void)
{
    return apr_parallel_cpu_count(MAX_THREADS);
}

/* One contiguous share of the blocks; a fold piece also folds its floats.  With next
 * set, the piece instead takes chunks of chunk blocks from that shared counter until
 * the first `count` blocks are done (see run_blocks). */
typedef struct {
    const quant_job *job;
    fold_kernel fold;
    size_t first, count; /* blocks */
    float acc[2];
    size_t *next, chunk;
} piece;

static void run_piece(void *arg)
{
    piece *p = (piece *)arg;
    if (p->fold) {
        p->fold(p->job->src + p->first * p->job->unit, p->count * p->job->unit, p->acc);
        return;
    }
    if (!p->next) {
        p->job->kernel(p->job, p->first, p->count);
        return;
    }
#if defined(__GNUC__) || defined(__clang__)
    for (;;) {
        size_t first = __atomic_fetch_add(p->next, 1, __ATOMIC_RELAXED) * p->chunk;
        if (first >= p->count)
            return;
        p->job->kernel(p->job, first, p->count - first < p->chunk ? p->count - first : p->chunk);
    }
#endif
}

/* threads <= 0 (the default) takes the cores idle right now (parallel.h); work too
 * small for a second thread never looks. */
static int threads_for(int nthreads, size_t elems)
{
    if (nthreads == 1 || elems < 2 * PARALLEL_MIN_ELEMS)
        return 1;
    if (nthreads <= 0)
        nthreads = apr_parallel_idle_cpus(MAX_THREADS);
    if (nthreads > MAX_THREADS)
        nthreads = MAX_THREADS;
    size_t most = elems / PARALLEL_MIN_ELEMS;
    if ((size_t)nthreads > most)
        nthreads = (int)most;
    return nthreads < 1 ? 1 : nthreads;
}

/* Run job->kernel (or fold, when given) over nblocks blocks split into
 * contiguous shares.  A fold's per-share results are combined by combine. */
static void run_blocks(const quant_job *job, size_t nblocks, int nthreads, fold_kernel fold, float acc[2],
                       void (*combine)(float acc[2], const float part[2]))
{
    piece pieces[MAX_THREADS];
    int n = threads_for(nthreads, job->n);
    if ((size_t)n > nblocks)
        n = (int)nblocks;
    size_t step = nblocks / (size_t)n, extra = nblocks % (size_t)n, next = 0;
#if defined(__GNUC__) || defined(__clang__)
    /* Kernels (not folds, whose per-share results are combined) take chunks of about
     * CHUNK_ELEMS values from a shared counter: a thread another process keeps off its
     * core then leaves its chunks to the others instead of holding up the end (fixed
     * halves measured slower on two threads than on one on a busy 2-core VM). */
    size_t counter = 0, chunk = CHUNK_ELEMS / job->unit ? CHUNK_ELEMS / job->unit : 1;
    int shared = n > 1 && !fold;
#endif
    for (int i = 0; i < n; i++) {
        pieces[i].job = job;
        pieces[i].fold = fold;
        pieces[i].first = next;
        pieces[i].count = step + ((size_t)i < extra);
        pieces[i].acc[0] = acc ? acc[0] : 0.0f;
        pieces[i].acc[1] = acc ? acc[1] : 0.0f;
        pieces[i].next = NULL;
        pieces[i].chunk = 0;
#if defined(__GNUC__) || defined(__clang__)
        if (shared) {
            pieces[i].first = 0;
            pieces[i].count = nblocks;
            pieces[i].next = &counter;
            pieces[i].chunk = chunk;
        }
#endif
        next += pieces[i].count;
    }
    apr_parallel_run(pieces, sizeof pieces[0], n, run_piece);
    if (acc)
        for (int i = 0; i < n; i++)
            combine(acc, pieces[i].acc);
}

static void combine_max(float acc[2], const float part[2])
{
    if (part[0] > acc[0])
        acc[0] = part[0];
}

static void combine_min_max(float acc[2], const float part[2])
{
    if (part[0] < acc[0])
        acc[0] = part[0];
    if (part[1] > acc[1])
        acc[1] = part[1];
}

/* ======================================================================== */
/* Public entry points.                                                     */
/* ======================================================================== */

/* Quantize the partial last block of a type that allows one. */
static void quantize_partial_block(int type, const float *x, size_t cnt, uint8_t *y)
{
    if (type == APR_QT_APR_Q4)
        apr_q4_quantize_block(x, cnt, y);
    else if (type == APR_QT_APR_FQ8_0)
        apr_fq8_0_quantize_block(x, cnt, y);
    else
        apr_fq4_0_quantize_block(x, cnt, y);
}

static void dequantize_partial_block(int type, const uint8_t *x, size_t cnt, float *y)
{
    if (type == APR_QT_APR_FQ8_0)
        q8_0_dequantize_partial(x, y, cnt);
    else
        interleaved_q4_dequantize_partial(x, y, cnt, type == APR_QT_APR_Q4);
}

int apr_quantize(int type, const float *src, size_t n, uint8_t *dst, int nthreads, int path)
{
    if (!is_known_type(type))
        return APR_QUANT_EUNKNOWN;
    if (!TYPES[type].quantizable)
        return APR_QUANT_ENOQUANTIZE;
    if (blocks_for(type, n) == SIZE_MAX || apr_quant_nbytes(type, n) == SIZE_MAX)
        return APR_QUANT_EBADCOUNT;
    if (n == 0)
        return APR_QUANT_OK;

    fold_kernel fold;
    quant_job job = {0};
    job.src = src;
    job.dst = dst + apr_quant_header_bytes(type, n);
    job.n = n;
    job.unit = TYPES[type].block_elems;
    job.block_bytes = TYPES[type].block_bytes;
    job.ggml_quantize = apr_ggml_quantizer(type);
    job.kernel = quantize_kernel(type, resolve_path(path), &fold);
    size_t whole = n / job.unit, rest = n % job.unit;

    if (type == APR_QT_APR_Q8) {
        float acc[2] = {0.0f, 0.0f};
        run_blocks(&job, whole, nthreads, fold, acc, combine_max);
        job.scale = acc[0] == 0.0f ? 1.0f : acc[0] / 127.0f;
        store_u32le(dst, f32_bits(job.scale));
    } else if (type == APR_QT_Q8_TENSOR) {
        /* Starting from 0 puts 0 in the range (see the Q8_TENSOR notes). */
        float acc[2] = {0.0f, 0.0f};
        run_blocks(&job, whole, nthreads, fold, acc, combine_min_max);
        q8_tensor_params(acc[0], acc[1], &job.scale, &job.zero_point);
        store_u32le(dst, f32_bits(job.scale));
        store_u32le(dst + 4, (uint32_t)job.zero_point);
    }
    if (whole)
        run_blocks(&job, whole, nthreads, NULL, NULL, NULL);
    if (rest)
        quantize_partial_block(type, src + whole * job.unit, rest,
                               job.dst + whole * TYPES[type].block_bytes);
    return APR_QUANT_OK;
}

int apr_dequantize(int type, const uint8_t *src, size_t n, float *dst, int nthreads, int path)
{
    if (!is_known_type(type))
        return APR_QUANT_EUNKNOWN;
    if (blocks_for(type, n) == SIZE_MAX || apr_quant_nbytes(type, n) == SIZE_MAX)
        return APR_QUANT_EBADCOUNT;
    if (n == 0)
        return APR_QUANT_OK;

    quant_job job = {0};
    job.qsrc = src + apr_quant_header_bytes(type, n);
    job.out = dst;
    job.n = n;
    job.unit = TYPES[type].block_elems;
    job.block_bytes = TYPES[type].block_bytes;
    job.ggml_blocks = apr_ggml_dequantizer(type, resolve_path(path));
    job.kernel = dequantize_kernel(type, resolve_path(path));
    if (type == APR_QT_APR_Q8) {
        job.scale = bits_f32(load_u32le(src));
    } else if (type == APR_QT_Q8_TENSOR) {
        job.scale = bits_f32(load_u32le(src));
        job.zero_point = (int32_t)load_u32le(src + 4);
    }
    size_t whole = n / job.unit, rest = n % job.unit;
    if (whole)
        run_blocks(&job, whole, nthreads, NULL, NULL, NULL);
    if (rest)
        dequantize_partial_block(type, job.qsrc + whole * TYPES[type].block_bytes, rest, dst + whole * job.unit);
    return APR_QUANT_OK;
}
