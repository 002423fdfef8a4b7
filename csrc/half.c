/* float32 <-> float16 / bfloat16 kernels chosen at run time: portable integer
 * C, x86-64 F16C/AVX2, AVX-512 (optionally AVX512-BF16), AArch64 NEON; plus a
 * multi-threaded driver.  The bit-level contract is in half.h.
 *
 * The portable functions are the readable specification; every vector kernel
 * must give their bits for every input.  Hardware conversions (VCVTPS2PH,
 * VCVTPH2PS, FCVTN, FCVTL, VCVTNEPS2BF16) round and handle subnormals the
 * same way, but quiet signalling NaNs (and VCVTNEPS2BF16 flushes subnormal
 * inputs and keeps NaN payloads), so each kernel notices NaN lanes with one
 * compare and recomputes just those from the input bits. */
#include "half.h"
#include "cpu.h"
#include "parallel.h"

#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_X86_KERNELS 1
#include <immintrin.h>
/* Compilers that know the avx512bf16 target (GCC 10, clang 9). */
#if defined(__clang__) ? __clang_major__ >= 9 : __GNUC__ >= 10
#define HAVE_AVX512_BF16_KERNEL 1
#endif
#endif

/* Every AArch64 CPU has Advanced SIMD with half-precision conversions. */
#if defined(__aarch64__) && defined(__ARM_NEON) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_NEON_KERNEL 1
#include <arm_neon.h>
#endif

#if defined(__GNUC__) || defined(__clang__)
#define COLD_NOINLINE __attribute__((cold, noinline))
#else
#define COLD_NOINLINE
#endif

/* A kernel converts n elements from src to dst (types fixed by the kernel).
 * With stream set, dst is 64-byte aligned and the x86 kernels write it with
 * non-temporal stores (the other kernels ignore the flag). */
typedef void (*kernel_fn)(const void *src, void *dst, size_t n, int stream);

enum op { OP_F32_TO_F16, OP_F16_TO_F32, OP_F32_TO_BF16, OP_BF16_TO_F32, OP_COUNT };

/* ------------------------------------------------------------------------ */
/* Portable path: integer arithmetic on the bit patterns.                   */

/* Element access through memcpy: no aliasing questions, and buffers that are
 * not aligned to their element (NumPy allows them) are still valid C; each
 * compiles to one ordinary load or store. */
static inline uint32_t load_f32_bits(const float *p)
{
    uint32_t u;
    memcpy(&u, p, sizeof u);
    return u;
}

static inline void store_f32_bits(float *p, uint32_t u)
{
    memcpy(p, &u, sizeof u);
}

static inline uint16_t load_u16(const uint16_t *p)
{
    uint16_t u;
    memcpy(&u, p, sizeof u);
    return u;
}

static inline void store_u16(uint16_t *p, uint16_t u)
{
    memcpy(p, &u, sizeof u);
}

/* f32 magnitudes (bits without the sign) at the f16 range boundaries. */
#define F32_INF 0x7f800000u
#define F32_ROUNDS_TO_F16_INF 0x477ff000u /* 65520 = max f16 + half an ulp */
#define F32_MIN_F16_NORMAL 0x38800000u    /* 2^-14 */
#define F32_HALF_MIN_F16_SUB 0x33000000u  /* 2^-25: a tie, rounds to even 0 */
#define F16_REBIAS 0x38000000u            /* (127 - 15) << 23 */

static inline uint16_t f32_to_f16_bits(uint32_t x)
{
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7fffffffu;
    uint32_t h;
    if (a > F32_INF) {
        /* NumPy keeps the payload's top bits without quieting; a payload that
         * would vanish becomes 1 so the result is still a NaN. */
        h = (a >> 13) & 0x3ffu;
        h = 0x7c00u | (h ? h : 1u);
    } else if (a >= F32_ROUNDS_TO_F16_INF) {
        h = 0x7c00u;
    } else if (a >= F32_MIN_F16_NORMAL) {
        /* Rebias, then round the 13 dropped bits to nearest even; a carry out
         * of the mantissa correctly bumps the exponent (up to 0x7c00). */
        h = a - F16_REBIAS;
        h = (h + 0xfffu + ((h >> 13) & 1u)) >> 13;
    } else if (a > F32_HALF_MIN_F16_SUB) {
        /* f16 subnormal: the 24-bit significand shifted down to units of
         * 2^-24, rounded to nearest even; 2^-14 - tiny rounds up to 0x400. */
        uint32_t shift = 126u - (a >> 23); /* 14..24 */
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        h = (m + (1u << (shift - 1)) - 1u + ((m >> shift) & 1u)) >> shift;
    } else {
        h = 0;
    }
    return (uint16_t)(sign | h);
}

static inline uint32_t f16_to_f32_bits(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t a = h & 0x7fffu;
    if (a >= 0x7c00u) /* inf, or NaN with its payload unchanged (NumPy) */
        return sign | F32_INF | (a & 0x3ffu) << 13;
    if (a >= 0x0400u)
        return sign | ((a << 13) + F16_REBIAS);
    if (a == 0)
        return sign;
    /* Subnormal a * 2^-24: shift the leading 1 up to the implicit bit. */
    uint32_t exponent = 113; /* biased exponent of 2^-14 */
    do {
        a <<= 1;
        exponent--;
    } while (!(a & 0x400u));
    return sign | exponent << 23 | (a & 0x3ffu) << 13;
}

static inline uint16_t f32_to_bf16_bits(uint32_t x)
{
    /* Nearest even: add just under half an ulp, plus one if the kept part is
     * odd.  Max finite rounds up into inf; inf itself cannot carry further. */
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    /* ml_dtypes turns every NaN into the canonical quiet NaN, sign kept. */
    uint32_t quiet = ((x >> 16) & 0x8000u) | 0x7fc0u;
    /* A select, not a branch, so compilers vectorize the portable loop. */
    return (uint16_t)((x & 0x7fffffffu) > F32_INF ? quiet : rounded);
}

static inline uint32_t bf16_to_f32_bits(uint16_t b)
{
    return (uint32_t)b << 16;
}

static void f32_to_f16_portable(const void *vsrc, void *vdst, size_t n, int stream)
{
    const float *src = vsrc;
    uint16_t *dst = vdst;
    (void)stream;
    for (size_t i = 0; i < n; i++)
        store_u16(dst + i, f32_to_f16_bits(load_f32_bits(src + i)));
}

static void f16_to_f32_portable(const void *vsrc, void *vdst, size_t n, int stream)
{
    const uint16_t *src = vsrc;
    float *dst = vdst;
    (void)stream;
    for (size_t i = 0; i < n; i++)
        store_f32_bits(dst + i, f16_to_f32_bits(load_u16(src + i)));
}

static void f32_to_bf16_portable(const void *vsrc, void *vdst, size_t n, int stream)
{
    const float *src = vsrc;
    uint16_t *dst = vdst;
    (void)stream;
    for (size_t i = 0; i < n; i++)
        store_u16(dst + i, f32_to_bf16_bits(load_f32_bits(src + i)));
}

static void bf16_to_f32_portable(const void *vsrc, void *vdst, size_t n, int stream)
{
    const uint16_t *src = vsrc;
    float *dst = vdst;
    (void)stream;
    for (size_t i = 0; i < n; i++)
        store_f32_bits(dst + i, bf16_to_f32_bits(load_u16(src + i)));
}

/* ------------------------------------------------------------------------ */
/* x86-64: F16C + AVX2, 8 lanes.                                            */

#ifdef HAVE_X86_KERNELS

#define TARGET_AVX2 __attribute__((target("avx2,f16c")))
#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))
#define TARGET_AVX512_BF16 __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx2,f16c")))

/* The immediate, not MXCSR.RC, picks the rounding, so a caller that changed
 * the rounding mode still gets NumPy's bits. */
#define RNE _MM_FROUND_TO_NEAREST_INT

/* Outputs far larger than the caches are written around them: no read for
 * ownership of lines that are overwritten whole anyway, and no eviction of
 * what else is cached.  About 1.7x faster for f16 -> f32 at 64 MiB on an
 * AVX-512 Xeon, 5-10% for the narrowing directions. */
static inline TARGET_AVX2 void store_256(void *p, __m256i v, int stream)
{
    if (stream)
        _mm256_stream_si256((__m256i *)p, v);
    else
        _mm256_storeu_si256((__m256i *)p, v);
}

/* Non-temporal stores are weakly ordered: fence them before the caller (or a
 * joining thread) can look at the result. */
static inline TARGET_AVX2 void end_stream(int stream)
{
    if (stream)
        _mm_sfence();
}

/* f16 bits NumPy gives for NaN lanes (32-bit lanes, result in the low 16). */
static inline TARGET_AVX2 __m256i numpy_f16_nan_avx2(__m256i bits)
{
    __m256i payload = _mm256_and_si256(_mm256_srli_epi32(bits, 13), _mm256_set1_epi32(0x3ff));
    payload = _mm256_max_epu32(payload, _mm256_set1_epi32(1));
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x8000));
    return _mm256_or_si256(_mm256_or_si256(sign, payload), _mm256_set1_epi32(0x7c00));
}

/* Eight u32 lanes (each < 0x10000) to eight u16 in order. */
static inline TARGET_AVX2 __m128i narrow_u32_avx2(__m256i v)
{
    __m256i packed = _mm256_packus_epi32(v, v); /* works within 128-bit halves */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

/* Rare: some lane of x is a NaN, which VCVTPS2PH would have quieted. */
static COLD_NOINLINE TARGET_AVX2 __m128i f32_to_f16_fix_nan_avx2(__m256 x, __m128i h)
{
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    __m256i wide = _mm256_blendv_epi8(_mm256_cvtepu16_epi32(h),
                                      numpy_f16_nan_avx2(_mm256_castps_si256(x)), nan);
    return narrow_u32_avx2(wide);
}

static inline TARGET_AVX2 __m128i f32_to_f16_avx2_8(const float *src)
{
    __m256 x = _mm256_loadu_ps(src);
    __m128i h = _mm256_cvtps_ph(x, RNE);
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)))
        h = f32_to_f16_fix_nan_avx2(x, h);
    return h;
}

static TARGET_AVX2 void f32_to_f16_avx2(const void *vsrc, void *vdst, size_t n, int stream)
{
    const float *src = vsrc;
    uint16_t *dst = vdst;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i lo = f32_to_f16_avx2_8(src + i), hi = f32_to_f16_avx2_8(src + i + 8);
        store_256(dst + i, _mm256_set_m128i(hi, lo), stream);
    }
    end_stream(stream);
    if (i + 8 <= n) {
        _mm_storeu_si128((__m128i *)(dst + i), f32_to_f16_avx2_8(src + i));
        i += 8;
    }
    f32_to_f16_portable(src + i, dst + i, n - i, 0);
}

/* f32 bits NumPy gives for f16 NaN lanes: payload moved up, not quieted. */
static inline TARGET_AVX2 __m256i numpy_f32_nan_avx2(__m256i h32)
{
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(h32, _mm256_set1_epi32(0x8000)), 16);
    __m256i payload = _mm256_slli_epi32(_mm256_and_si256(h32, _mm256_set1_epi32(0x3ff)), 13);
    return _mm256_or_si256(_mm256_or_si256(sign, payload), _mm256_set1_epi32((int)F32_INF));
}

/* Rare: some lane of h is a NaN, which VCVTPH2PS would have quieted. */
static COLD_NOINLINE TARGET_AVX2 __m256 f16_to_f32_fix_nan_avx2(__m128i h, __m256 f, __m128i nan16)
{
    __m256i nan = _mm256_cvtepi16_epi32(nan16);
    __m256i exact = numpy_f32_nan_avx2(_mm256_cvtepu16_epi32(h));
    return _mm256_castsi256_ps(_mm256_blendv_epi8(_mm256_castps_si256(f), exact, nan));
}

static inline TARGET_AVX2 __m256 f16_to_f32_avx2_8(const uint16_t *src)
{
    __m128i h = _mm_loadu_si128((const __m128i *)src);
    __m256 f = _mm256_cvtph_ps(h);
    /* Signed 16-bit compare is fine: both sides are at most 0x7fff. */
    __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x7c00));
    if (_mm_movemask_epi8(nan))
        f = f16_to_f32_fix_nan_avx2(h, f, nan);
    return f;
}

static TARGET_AVX2 void f16_to_f32_avx2(const void *vsrc, void *vdst, size_t n, int stream)
{
    const uint16_t *src = vsrc;
    float *dst = vdst;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 lo = f16_to_f32_avx2_8(src + i), hi = f16_to_f32_avx2_8(src + i + 8);
        store_256(dst + i, _mm256_castps_si256(lo), stream);
        store_256(dst + i + 8, _mm256_castps_si256(hi), stream);
    }
    end_stream(stream);
    if (i + 8 <= n) {
        _mm256_storeu_ps(dst + i, f16_to_f32_avx2_8(src + i));
        i += 8;
    }
    f16_to_f32_portable(src + i, dst + i, n - i, 0);
}

/* The portable bf16 rounding on eight lanes; results in the low 16 bits. */
static inline TARGET_AVX2 __m256i f32_to_bf16_avx2_8(const float *src)
{
    __m256 x = _mm256_loadu_ps(src);
    __m256i bits = _mm256_castps_si256(x);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), odd);
    rounded = _mm256_srli_epi32(rounded, 16);
    __m256i quiet = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x8000)),
                                    _mm256_set1_epi32(0x7fc0));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(rounded, quiet, nan);
}

static TARGET_AVX2 void f32_to_bf16_avx2(const void *vsrc, void *vdst, size_t n, int stream)
{
    const float *src = vsrc;
    uint16_t *dst = vdst;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        /* packus interleaves 128-bit halves; one permute puts them back. */
        __m256i packed = _mm256_packus_epi32(f32_to_bf16_avx2_8(src + i), f32_to_bf16_avx2_8(src + i + 8));
        store_256(dst + i, _mm256_permute4x64_epi64(packed, 0xd8), stream);
    }
    end_stream(stream);
    if (i + 8 <= n) {
        _mm_storeu_si128((__m128i *)(dst + i), narrow_u32_avx2(f32_to_bf16_avx2_8(src + i)));
        i += 8;
    }
    f32_to_bf16_portable(src + i, dst + i, n - i, 0);
}

static TARGET_AVX2 void bf16_to_f32_avx2(const void *vsrc, void *vdst, size_t n, int stream)
{
    const uint16_t *src = vsrc;
    float *dst = vdst;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(src + i));
        __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(b)), 16);
        __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(b, 1)), 16);
        store_256(dst + i, lo, stream);
        store_256(dst + i + 8, hi, stream);
    }
    end_stream(stream);
    bf16_to_f32_portable(src + i, dst + i, n - i, 0);
}

/* ------------------------------------------------------------------------ */
/* x86-64: AVX-512, 16 lanes; masked loads and stores for the tail.         */

static inline TARGET_AVX512 __mmask16 tail_mask(size_t left)
{
    return (__mmask16)((1u << left) - 1u); /* left < 16 */
}

static inline TARGET_AVX512 void store_512(void *p, __m512i v, int stream)
{
    if (stream)
        _mm512_stream_si512(p, v);
    else
        _mm512_storeu_si512(p, v);
}

static inline TARGET_AVX512 __m512i join_256(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

static COLD_NOINLINE TARGET_AVX512 __m256i f32_to_f16_fix_nan_avx512(__m512 x, __m256i h, __mmask16 nan)
{
    __m512i bits = _mm512_castps_si512(x);
    __m512i payload = _mm512_and_si512(_mm512_srli_epi32(bits, 13), _mm512_set1_epi32(0x3ff));
    payload = _mm512_max_epu32(payload, _mm512_set1_epi32(1));
    __m512i sign = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x8000));
    __m512i exact = _mm512_or_si512(_mm512_or_si512(sign, payload), _mm512_set1_epi32(0x7c00));
    return _mm256_mask_mov_epi16(h, nan, _mm512_cvtepi32_epi16(exact));
}

static inline TARGET_AVX512 __m256i f32_to_f16_avx512_16(__m512 x)
{
    __m256i h = _mm512_cvtps_ph(x, RNE);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    if (nan)
        h = f32_to_f16_fix_nan_avx512(x, h, nan);
    return h;
}

static TARGET_AVX512 void f32_to_f16_avx512(const void *vsrc, void *vdst, size_t n, int stream)
{
    const float *src = vsrc;
    uint16_t *dst = vdst;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i lo = f32_to_f16_avx512_16(_mm512_loadu_ps(src + i));
        __m256i hi = f32_to_f16_avx512_16(_mm512_loadu_ps(src + i + 16));
        store_512(dst + i, join_256(lo, hi), stream);
    }
    end_stream(stream);
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m256i h = f32_to_f16_avx512_16(_mm512_maskz_loadu_ps(m, src + i));
        _mm256_mask_storeu_epi16(dst + i, m, h);
    }
}

static COLD_NOINLINE TARGET_AVX512 __m512 f16_to_f32_fix_nan_avx512(__m256i h, __m512 f, __mmask16 nan)
{
    __m512i h32 = _mm512_cvtepu16_epi32(h);
    __m512i sign = _mm512_slli_epi32(_mm512_and_si512(h32, _mm512_set1_epi32(0x8000)), 16);
    __m512i payload = _mm512_slli_epi32(_mm512_and_si512(h32, _mm512_set1_epi32(0x3ff)), 13);
    __m512i exact = _mm512_or_si512(_mm512_or_si512(sign, payload), _mm512_set1_epi32((int)F32_INF));
    return _mm512_mask_mov_ps(f, nan, _mm512_castsi512_ps(exact));
}

static inline TARGET_AVX512 __m512 f16_to_f32_avx512_16(__m256i h)
{
    __m512 f = _mm512_cvtph_ps(h);
    __mmask16 nan = _mm256_cmpgt_epu16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x7fff)),
                                            _mm256_set1_epi16(0x7c00));
    if (nan)
        f = f16_to_f32_fix_nan_avx512(h, f, nan);
    return f;
}

static TARGET_AVX512 void f16_to_f32_avx512(const void *vsrc, void *vdst, size_t n, int stream)
{
    const uint16_t *src = vsrc;
    float *dst = vdst;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 lo = f16_to_f32_avx512_16(_mm256_loadu_si256((const __m256i *)(src + i)));
        __m512 hi = f16_to_f32_avx512_16(_mm256_loadu_si256((const __m256i *)(src + i + 16)));
        store_512(dst + i, _mm512_castps_si512(lo), stream);
        store_512(dst + i + 16, _mm512_castps_si512(hi), stream);
    }
    end_stream(stream);
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 f = f16_to_f32_avx512_16(_mm256_maskz_loadu_epi16(m, src + i));
        _mm512_mask_storeu_ps(dst + i, m, f);
    }
}

/* The portable bf16 rounding on sixteen lanes. */
static inline TARGET_AVX512 __m256i f32_to_bf16_avx512_16(__m512 x)
{
    __m512i bits = _mm512_castps_si512(x);
    __m512i high = _mm512_srli_epi32(bits, 16);
    __m512i odd = _mm512_and_si512(high, _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), odd);
    rounded = _mm512_srli_epi32(rounded, 16);
    /* sign | 0x7fc0 in one ternary-logic op: (high & 0x8000) | 0x7fc0. */
    __m512i quiet = _mm512_ternarylogic_epi32(high, _mm512_set1_epi32(0x8000), _mm512_set1_epi32(0x7fc0), 0xea);
    rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), quiet);
    return _mm512_cvtepi32_epi16(rounded);
}

static TARGET_AVX512 void f32_to_bf16_avx512(const void *vsrc, void *vdst, size_t n, int stream)
{
    const float *src = vsrc;
    uint16_t *dst = vdst;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i lo = f32_to_bf16_avx512_16(_mm512_loadu_ps(src + i));
        __m256i hi = f32_to_bf16_avx512_16(_mm512_loadu_ps(src + i + 16));
        store_512(dst + i, join_256(lo, hi), stream);
    }
    end_stream(stream);
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m256i b = f32_to_bf16_avx512_16(_mm512_maskz_loadu_ps(m, src + i));
        _mm256_mask_storeu_epi16(dst + i, m, b);
    }
}

static TARGET_AVX512 void bf16_to_f32_avx512(const void *vsrc, void *vdst, size_t n, int stream)
{
    const uint16_t *src = vsrc;
    float *dst = vdst;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i + 16)));
        store_512(dst + i, _mm512_slli_epi32(lo, 16), stream);
        store_512(dst + i + 16, _mm512_slli_epi32(hi, 16), stream);
    }
    end_stream(stream);
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512i b = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src + i));
        _mm512_mask_storeu_epi32(dst + i, m, _mm512_slli_epi32(b, 16));
    }
}

#ifdef HAVE_AVX512_BF16_KERNEL
/* VCVTNEPS2BF16 rounds to nearest even like ml_dtypes, but treats subnormal
 * inputs as zero and keeps NaN payloads (only setting the quiet bit).  Lanes
 * that are NaN or subnormal take the integer result; zeros are right as is. */
static COLD_NOINLINE TARGET_AVX512_BF16 __m256i f32_to_bf16_fix_avx512(__m512 x, __m256i b, __mmask16 fix)
{
    return _mm256_mask_mov_epi16(b, fix, f32_to_bf16_avx512_16(x));
}

static inline TARGET_AVX512_BF16 __m256i f32_to_bf16_avx512_bf16_16(__m512 x)
{
    __m256i b = (__m256i)_mm512_cvtneps_pbh(x);
    /* |x| - 1 < 0x7fffff (unsigned) exactly when x is subnormal. */
    __m512i magnitude = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
    __mmask16 fix = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(magnitude, _mm512_set1_epi32(1)),
                                            _mm512_set1_epi32(0x7fffff));
    fix |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    if (fix)
        b = f32_to_bf16_fix_avx512(x, b, fix);
    return b;
}

static TARGET_AVX512_BF16 void f32_to_bf16_avx512_bf16(const void *vsrc, void *vdst, size_t n, int stream)
{
    const float *src = vsrc;
    uint16_t *dst = vdst;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i lo = f32_to_bf16_avx512_bf16_16(_mm512_loadu_ps(src + i));
        __m256i hi = f32_to_bf16_avx512_bf16_16(_mm512_loadu_ps(src + i + 16));
        store_512(dst + i, join_256(lo, hi), stream);
    }
    end_stream(stream);
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m256i b = f32_to_bf16_avx512_bf16_16(_mm512_maskz_loadu_ps(m, src + i));
        _mm256_mask_storeu_epi16(dst + i, m, b);
    }
}
#endif /* HAVE_AVX512_BF16_KERNEL */

/* Bit mask of the x86 paths this CPU and OS can run. */
static int x86_path_mask(unsigned int f)
{
    int mask = 0;
    const unsigned int avx2 = APR_CPU_AVX | APR_CPU_F16C | APR_CPU_AVX2;
    const unsigned int avx512 = APR_CPU_AVX512F | APR_CPU_AVX512BW | APR_CPU_AVX512VL;
    if ((f & avx2) != avx2)
        return 0;
    mask |= 1 << APR_HALF_F16C_AVX2;
    if ((f & avx512) != avx512)
        return mask;
    mask |= 1 << APR_HALF_AVX512;
#ifdef HAVE_AVX512_BF16_KERNEL
    if (f & APR_CPU_AVX512BF16)
        mask |= 1 << APR_HALF_AVX512_BF16;
#endif
    return mask;
}

#endif /* HAVE_X86_KERNELS */

/* ------------------------------------------------------------------------ */
/* AArch64: NEON, 4 lanes per conversion, 8 per step.                       */

#ifdef HAVE_NEON_KERNEL

/* FCVTN and FCVTL follow FPCR: its rounding mode, flush-to-zero bits, and AHP,
 * which swaps IEEE half for a format without inf and NaN.  The f16 kernels
 * run under the IEEE defaults and give the caller's FPCR back afterwards.
 * (DN, default NaN, does not matter: NaN lanes are recomputed anyway.)  The
 * "memory" clobbers keep the loads and stores, and so the conversions
 * between them, inside the window. */
#define FPCR_RMODE (3ull << 22)
#define FPCR_FZ16 (1ull << 19)
#define FPCR_FZ (1ull << 24)
#define FPCR_AHP (1ull << 26)
#define FPCR_NOT_IEEE (FPCR_RMODE | FPCR_FZ16 | FPCR_FZ | FPCR_AHP)

static inline uint64_t fpcr_enter_ieee(void)
{
    uint64_t saved;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(saved) : : "memory");
    if (saved & FPCR_NOT_IEEE)
        __asm__ __volatile__("msr fpcr, %0" : : "r"(saved & ~FPCR_NOT_IEEE) : "memory");
    return saved;
}

static inline void fpcr_leave(uint64_t saved)
{
    if (saved & FPCR_NOT_IEEE)
        __asm__ __volatile__("msr fpcr, %0" : : "r"(saved) : "memory");
}

static inline uint32x4_t neon_is_nan_f32(float32x4_t x)
{
    return vmvnq_u32(vceqq_f32(x, x));
}

/* Rare: a lane of x is a NaN, which FCVTN would have quieted (or replaced by
 * the default NaN under FPCR.DN); recompute those lanes from the bits. */
static COLD_NOINLINE uint16x4_t f32_to_f16_fix_nan_neon(float32x4_t x, uint16x4_t h)
{
    uint32x4_t bits = vreinterpretq_u32_f32(x);
    uint32x4_t payload = vmaxq_u32(vandq_u32(vshrq_n_u32(bits, 13), vdupq_n_u32(0x3ff)), vdupq_n_u32(1));
    uint32x4_t sign = vandq_u32(vshrq_n_u32(bits, 16), vdupq_n_u32(0x8000));
    uint32x4_t exact = vorrq_u32(vorrq_u32(sign, payload), vdupq_n_u32(0x7c00));
    return vbsl_u16(vmovn_u32(neon_is_nan_f32(x)), vmovn_u32(exact), h);
}

static inline uint16x4_t f32_to_f16_neon_4(const float *src)
{
    float32x4_t x = vld1q_f32(src);
    uint16x4_t h = vreinterpret_u16_f16(vcvt_f16_f32(x));
    if (vmaxvq_u32(neon_is_nan_f32(x)))
        h = f32_to_f16_fix_nan_neon(x, h);
    return h;
}

static void f32_to_f16_neon(const void *vsrc, void *vdst, size_t n, int stream)
{
    (void)stream;
    const float *src = vsrc;
    uint16_t *dst = vdst;
    size_t i = 0;
    uint64_t fpcr = fpcr_enter_ieee();
    for (; i + 8 <= n; i += 8)
        vst1q_u16(dst + i, vcombine_u16(f32_to_f16_neon_4(src + i), f32_to_f16_neon_4(src + i + 4)));
    fpcr_leave(fpcr);
    f32_to_f16_portable(src + i, dst + i, n - i, 0);
}

static COLD_NOINLINE float32x4_t f16_to_f32_fix_nan_neon(uint16x4_t h, float32x4_t f, uint16x4_t nan)
{
    uint32x4_t h32 = vmovl_u16(h);
    uint32x4_t sign = vshlq_n_u32(vandq_u32(h32, vdupq_n_u32(0x8000)), 16);
    uint32x4_t payload = vshlq_n_u32(vandq_u32(h32, vdupq_n_u32(0x3ff)), 13);
    uint32x4_t exact = vorrq_u32(vorrq_u32(sign, payload), vdupq_n_u32(F32_INF));
    uint32x4_t nan32 = vreinterpretq_u32_s32(vmovl_s16(vreinterpret_s16_u16(nan)));
    return vreinterpretq_f32_u32(vbslq_u32(nan32, exact, vreinterpretq_u32_f32(f)));
}

static inline float32x4_t f16_to_f32_neon_4(const uint16_t *src)
{
    uint16x4_t h = vld1_u16(src);
    float32x4_t f = vcvt_f32_f16(vreinterpret_f16_u16(h));
    uint16x4_t nan = vcgt_u16(vand_u16(h, vdup_n_u16(0x7fff)), vdup_n_u16(0x7c00));
    if (vmaxv_u16(nan))
        f = f16_to_f32_fix_nan_neon(h, f, nan);
    return f;
}

static void f16_to_f32_neon(const void *vsrc, void *vdst, size_t n, int stream)
{
    (void)stream;
    const uint16_t *src = vsrc;
    float *dst = vdst;
    size_t i = 0;
    uint64_t fpcr = fpcr_enter_ieee();
    for (; i + 8 <= n; i += 8) {
        vst1q_f32(dst + i, f16_to_f32_neon_4(src + i));
        vst1q_f32(dst + i + 4, f16_to_f32_neon_4(src + i + 4));
    }
    fpcr_leave(fpcr);
    f16_to_f32_portable(src + i, dst + i, n - i, 0);
}

/* The portable bf16 rounding on four lanes, narrowed to u16. */
static inline uint16x4_t f32_to_bf16_neon_4(const float *src)
{
    float32x4_t x = vld1q_f32(src);
    uint32x4_t bits = vreinterpretq_u32_f32(x);
    uint32x4_t odd = vandq_u32(vshrq_n_u32(bits, 16), vdupq_n_u32(1));
    uint32x4_t rounded = vaddq_u32(vaddq_u32(bits, vdupq_n_u32(0x7fff)), odd);
    uint16x4_t b = vshrn_n_u32(rounded, 16);
    uint16x4_t quiet = vorr_u16(vand_u16(vshrn_n_u32(bits, 16), vdup_n_u16(0x8000)), vdup_n_u16(0x7fc0));
    return vbsl_u16(vmovn_u32(neon_is_nan_f32(x)), quiet, b);
}

static void f32_to_bf16_neon(const void *vsrc, void *vdst, size_t n, int stream)
{
    (void)stream;
    const float *src = vsrc;
    uint16_t *dst = vdst;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        vst1q_u16(dst + i, vcombine_u16(f32_to_bf16_neon_4(src + i), f32_to_bf16_neon_4(src + i + 4)));
    f32_to_bf16_portable(src + i, dst + i, n - i, 0);
}

static void bf16_to_f32_neon(const void *vsrc, void *vdst, size_t n, int stream)
{
    (void)stream;
    const uint16_t *src = vsrc;
    float *dst = vdst;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint16x8_t b = vld1q_u16(src + i);
        vst1q_u32((uint32_t *)(dst + i), vshll_n_u16(vget_low_u16(b), 16));
        vst1q_u32((uint32_t *)(dst + i + 4), vshll_high_n_u16(b, 16));
    }
    bf16_to_f32_portable(src + i, dst + i, n - i, 0);
}

#endif /* HAVE_NEON_KERNEL */

/* ------------------------------------------------------------------------ */
/* Dispatch.                                                                */

/* Bit p set when path p can run; the CPU features behind it are cached. */
static int path_mask(void)
{
    unsigned int f = apr_cpu_features();
    int mask = 1 << APR_HALF_PORTABLE;
#ifdef HAVE_X86_KERNELS
    mask |= x86_path_mask(f);
#endif
#ifdef HAVE_NEON_KERNEL
    if (f & APR_CPU_ARM_NEON)
        mask |= 1 << APR_HALF_NEON;
#endif
    (void)f;
    return mask;
}

static int is_known_path(int path)
{
    return path >= APR_HALF_PORTABLE && path < APR_HALF_PATH_COUNT;
}

/* AVX512-BF16 differs from AVX-512 only in f32 -> bf16, where the
 * instruction (with its rare fix-ups) is 25% faster in cache and no slower
 * from memory. */
static int best_path_in(int mask)
{
    static const int fastest_first[] = {APR_HALF_AVX512_BF16, APR_HALF_AVX512, APR_HALF_F16C_AVX2,
                                        APR_HALF_NEON};
    for (size_t i = 0; i < sizeof fastest_first / sizeof fastest_first[0]; i++)
        if (mask & (1 << fastest_first[i]))
            return fastest_first[i];
    return APR_HALF_PORTABLE;
}

/* The path that will really run for a requested one. */
static int resolve_path(int path)
{
    int mask = path_mask();
    if (path == APR_HALF_AUTO)
        return best_path_in(mask);
    if (!is_known_path(path) || !(mask & (1 << path)))
        return APR_HALF_PORTABLE;
    return path;
}

static kernel_fn kernel_for(int path, enum op op)
{
    static const kernel_fn portable[OP_COUNT] = {f32_to_f16_portable, f16_to_f32_portable,
                                                 f32_to_bf16_portable, bf16_to_f32_portable};
#ifdef HAVE_X86_KERNELS
    static const kernel_fn avx2[OP_COUNT] = {f32_to_f16_avx2, f16_to_f32_avx2, f32_to_bf16_avx2,
                                             bf16_to_f32_avx2};
    static const kernel_fn avx512[OP_COUNT] = {f32_to_f16_avx512, f16_to_f32_avx512, f32_to_bf16_avx512,
                                               bf16_to_f32_avx512};
#endif
#ifdef HAVE_NEON_KERNEL
    static const kernel_fn neon[OP_COUNT] = {f32_to_f16_neon, f16_to_f32_neon, f32_to_bf16_neon,
                                             bf16_to_f32_neon};
#endif
    switch (path) {
#ifdef HAVE_X86_KERNELS
    case APR_HALF_F16C_AVX2:
        return avx2[op];
    case APR_HALF_AVX512:
        return avx512[op];
    case APR_HALF_AVX512_BF16:
#ifdef HAVE_AVX512_BF16_KERNEL
        /* Only f32 -> bf16 has an instruction of its own. */
        if (op == OP_F32_TO_BF16)
            return f32_to_bf16_avx512_bf16;
#endif
        return avx512[op];
#endif
#ifdef HAVE_NEON_KERNEL
    case APR_HALF_NEON:
        return neon[op];
#endif
    default:
        return portable[op];
    }
}

/* ------------------------------------------------------------------------ */
/* Multi-threaded driver.                                                   */

/* Creating and joining a thread costs 10-40 us, and a second core first has
 * to pull its half of the data out of the first core's cache.  On a 2-core
 * AVX-512 Xeon, two threads lost below 1 Mi elements, broke even around it
 * (0.9-1.3x) and won from 2 Mi (1.1-1.6x) and 4 Mi (1.7-1.9x) on. */
#define PARALLEL_MIN_PIECE ((size_t)1 << 20)
#define PARALLEL_MIN_ELEMENTS (2 * PARALLEL_MIN_PIECE)
#define PARALLEL_MAX_THREADS APR_PARALLEL_MAX_THREADS

/* Outputs at least this large are written with non-temporal stores: they will
 * not stay in a core's share of the cache anyway.  On an AVX-512 Xeon these
 * stores won from 2-4 MiB of output on; 8 MiB leaves the smaller results in
 * cache for whoever reads them next. */
#define STREAM_MIN_BYTES ((size_t)8 << 20)
#define STREAM_ALIGN 64

int apr_half_default_threads(void)
{
    return apr_parallel_cpu_count(PARALLEL_MAX_THREADS);
}

typedef struct {
    kernel_fn kernel;
    const uint8_t *src;
    uint8_t *dst;
    size_t n, src_size, dst_size;
    int stream;
} piece;

/* Elements to convert before dst is STREAM_ALIGN-aligned; more than any n if
 * it never will be (dst not aligned to its own element size). */
static size_t elements_to_alignment(const uint8_t *dst, size_t dst_size)
{
    size_t misalign = (size_t)((uintptr_t)dst % STREAM_ALIGN);
    if (misalign % dst_size)
        return (size_t)-1;
    return (STREAM_ALIGN - misalign) % STREAM_ALIGN / dst_size;
}

static void run_piece(void *arg)
{
    const piece *p = (const piece *)arg;
    if (!p->stream) {
        p->kernel(p->src, p->dst, p->n, 0);
        return;
    }
    /* Streaming kernels want an aligned destination: do the few elements
     * before it with ordinary stores. */
    size_t head = elements_to_alignment(p->dst, p->dst_size);
    if (head >= p->n) {
        p->kernel(p->src, p->dst, p->n, 0);
        return;
    }
    if (head)
        p->kernel(p->src, p->dst, head, 0);
    p->kernel(p->src + head * p->src_size, p->dst + head * p->dst_size, p->n - head, 1);
}

#ifdef APR_HAVE_THREADS
/* threads <= 0 (the default) takes the cores idle right now; small work never gets
 * a thread (and never pays for looking at the load). */
static int threads_for(int nthreads, size_t n)
{
    if (nthreads == 1 || n < PARALLEL_MIN_ELEMENTS)
        return 1;
    if (nthreads <= 0)
        nthreads = apr_parallel_idle_cpus(PARALLEL_MAX_THREADS);
    if (nthreads <= 1)
        return 1;
    if (nthreads > PARALLEL_MAX_THREADS)
        nthreads = PARALLEL_MAX_THREADS;
    if ((size_t)nthreads > n / PARALLEL_MIN_PIECE)
        nthreads = (int)(n / PARALLEL_MIN_PIECE);
    return nthreads < 1 ? 1 : nthreads;
}

#if defined(__GNUC__) || defined(__clang__)
/* Threads take chunks from a shared counter instead of one fixed share each: on a
 * machine whose cores other processes also use, a thread that is not scheduled for a
 * while leaves its chunks to the others instead of holding up the end (with fixed
 * halves, two threads measured 0.4-0.6x one thread at 2-16 Mi elements on a busy
 * 2-core VM).  A chunk of 256 Ki elements (a multiple of 64, so aligned buffers give
 * cache-line-aligned chunks) is 40-200 us of work: the most the caller can wait for a
 * late thread's last chunk, and many times what taking it costs. */
#define CHUNK_ELEMENTS ((size_t)1 << 18)

typedef struct {
    const piece *whole;
    size_t *next; /* the next chunk to take, shared by every worker */
} worker;

static void run_chunks(void *arg)
{
    const worker *w = (const worker *)arg;
    const piece *whole = w->whole;
    for (;;) {
        size_t first = __atomic_fetch_add(w->next, 1, __ATOMIC_RELAXED) * CHUNK_ELEMENTS;
        if (first >= whole->n)
            return;
        piece p = *whole;
        p.src = whole->src + first * whole->src_size;
        p.dst = whole->dst + first * whole->dst_size;
        p.n = whole->n - first < CHUNK_ELEMENTS ? whole->n - first : CHUNK_ELEMENTS;
        run_piece(&p);
    }
}

static void convert_threaded(const piece *whole, int nthreads)
{
    worker workers[PARALLEL_MAX_THREADS];
    size_t next = 0;
    for (int i = 0; i < nthreads; i++) {
        workers[i].whole = whole;
        workers[i].next = &next;
    }
    apr_parallel_run(workers, sizeof workers[0], nthreads, run_chunks);
}
#else
/* Without the atomic builtins: contiguous pieces of a multiple of 64 elements (the
 * last takes the rest), so aligned buffers give cache-line-aligned pieces. */
static void convert_threaded(const piece *whole, int nthreads)
{
    piece pieces[PARALLEL_MAX_THREADS];
    size_t step = whole->n / (size_t)nthreads & ~(size_t)63;
    for (int i = 0; i < nthreads; i++) {
        size_t first = (size_t)i * step;
        pieces[i] = *whole;
        pieces[i].src = whole->src + first * whole->src_size;
        pieces[i].dst = whole->dst + first * whole->dst_size;
        pieces[i].n = i == nthreads - 1 ? whole->n - first : step;
    }
    apr_parallel_run(pieces, sizeof pieces[0], nthreads, run_piece);
}
#endif
#endif /* APR_HAVE_THREADS */

static void convert(enum op op, int path, const void *src, size_t src_size, void *dst, size_t dst_size,
                    size_t n, int nthreads)
{
    if (!n)
        return;
    piece whole = {kernel_for(resolve_path(path), op), src, dst, n, src_size, dst_size,
                   n >= STREAM_MIN_BYTES / dst_size};
#ifdef APR_HAVE_THREADS
    nthreads = threads_for(nthreads, n);
    if (nthreads > 1) {
        convert_threaded(&whole, nthreads);
        return;
    }
#else
    (void)nthreads;
#endif
    run_piece(&whole);
}

/* ------------------------------------------------------------------------ */
/* Public API.                                                              */

void apr_f32_to_f16(int path, const float *src, uint16_t *dst, size_t n, int nthreads)
{
    convert(OP_F32_TO_F16, path, src, sizeof *src, dst, sizeof *dst, n, nthreads);
}

void apr_f16_to_f32(int path, const uint16_t *src, float *dst, size_t n, int nthreads)
{
    convert(OP_F16_TO_F32, path, src, sizeof *src, dst, sizeof *dst, n, nthreads);
}

void apr_f32_to_bf16(int path, const float *src, uint16_t *dst, size_t n, int nthreads)
{
    convert(OP_F32_TO_BF16, path, src, sizeof *src, dst, sizeof *dst, n, nthreads);
}

void apr_bf16_to_f32(int path, const uint16_t *src, float *dst, size_t n, int nthreads)
{
    convert(OP_BF16_TO_F32, path, src, sizeof *src, dst, sizeof *dst, n, nthreads);
}

int apr_half_path_available(int path)
{
    if (path == APR_HALF_AUTO)
        return 1;
    return is_known_path(path) && (path_mask() & (1 << path)) != 0;
}

int apr_half_best_path(void)
{
    return best_path_in(path_mask());
}

const char *apr_half_path_name(int path)
{
    switch (path) {
    case APR_HALF_AUTO:
        return "auto";
    case APR_HALF_PORTABLE:
        return "portable";
    case APR_HALF_F16C_AVX2:
        return "f16c-avx2";
    case APR_HALF_AVX512:
        return "avx512";
    case APR_HALF_AVX512_BF16:
        return "avx512-bf16";
    case APR_HALF_NEON:
        return "neon";
    default:
        return "unknown";
    }
}
