/* Run-time CPU feature detection shared by the C kernels.
 *
 * apr_cpu_features() returns a bit mask of APR_CPU_* features that this CPU
 * has AND this OS can run: a vector feature whose register state the OS does
 * not save on a context switch (XCR0, read with xgetbv) is reported absent.
 * Each kernel file keeps its own mapping from these features to its paths.
 *
 * Header-only: every function is static inline, so each translation unit has
 * its own copy and its own cache. */
#ifndef APR_CPU_H
#define APR_CPU_H

#ifdef __cplusplus
extern "C" {
#endif

/* x86-64 */
#define APR_CPU_SSE41 (1u << 0)
#define APR_CPU_PCLMUL (1u << 1)
#define APR_CPU_AVX (1u << 2)
#define APR_CPU_AVX2 (1u << 3)
#define APR_CPU_F16C (1u << 4)
#define APR_CPU_FMA (1u << 5)
#define APR_CPU_AVX512F (1u << 6)
#define APR_CPU_AVX512DQ (1u << 7)
#define APR_CPU_AVX512BW (1u << 8)
#define APR_CPU_AVX512VL (1u << 9)
#define APR_CPU_AVX512BF16 (1u << 10)
#define APR_CPU_VPCLMULQDQ (1u << 11)
/* AArch64 */
#define APR_CPU_ARM_CRC32 (1u << 16)
#define APR_CPU_ARM_NEON (1u << 17)

/* Set in the cached value so that 0 means "not detected yet". */
#define APR_CPU_DETECTED (1u << 31)

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define APR_CPU_X86 1
#include <cpuid.h>
#include <stddef.h>
#endif

#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#endif

#if defined(__GNUC__) || defined(__clang__)
#define APR_LOAD_RELAXED(ptr) __atomic_load_n((ptr), __ATOMIC_RELAXED)
#define APR_STORE_RELAXED(ptr, v) __atomic_store_n((ptr), (v), __ATOMIC_RELAXED)
#else
#define APR_LOAD_RELAXED(ptr) (*(volatile unsigned int *)(ptr))
#define APR_STORE_RELAXED(ptr, v) (*(volatile unsigned int *)(ptr) = (v))
#endif

#ifdef APR_CPU_X86
static inline unsigned int apr_cpu_xgetbv0(void)
{
    unsigned int lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return lo;
}

/* Plain cpuid rather than __builtin_cpu_supports, which older compilers lack
 * for "vpclmulqdq" and "avx512bf16". */
static inline unsigned int apr_cpu_detect_x86(void)
{
    unsigned int eax, ebx, ecx, edx;
    unsigned int max_leaf = (unsigned int)__get_cpuid_max(0, NULL);
    unsigned int f = 0;

    if (max_leaf < 1)
        return 0;
    __cpuid(1, eax, ebx, ecx, edx);
    /* SSE state is saved by FXSAVE on every x86-64 OS: no XCR0 check. */
    if ((ecx >> 19) & 1)
        f |= APR_CPU_SSE41;
    if ((ecx >> 1) & 1)
        f |= APR_CPU_PCLMUL;
    unsigned int osxsave = (ecx >> 27) & 1;
    unsigned int xcr0 = osxsave ? apr_cpu_xgetbv0() : 0;
    /* The OS must save XMM and YMM (XCR0 bits 1, 2) for VEX-encoded code ... */
    int ymm = (xcr0 & 0x06) == 0x06;
    /* ... and opmask plus all of ZMM0-31 (bits 5, 6, 7) for AVX-512. */
    int zmm = (xcr0 & 0xe6) == 0xe6;
    if (ymm) {
        if ((ecx >> 28) & 1)
            f |= APR_CPU_AVX;
        if ((ecx >> 29) & 1)
            f |= APR_CPU_F16C;
        if ((ecx >> 12) & 1)
            f |= APR_CPU_FMA;
    }

    if (max_leaf < 7)
        return f;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    unsigned int max_subleaf = eax;
    if (ymm) {
        if ((ebx >> 5) & 1)
            f |= APR_CPU_AVX2;
        if ((ecx >> 10) & 1)
            f |= APR_CPU_VPCLMULQDQ;
    }
    if (zmm) {
        if ((ebx >> 16) & 1)
            f |= APR_CPU_AVX512F;
        if ((ebx >> 17) & 1)
            f |= APR_CPU_AVX512DQ;
        if ((ebx >> 30) & 1)
            f |= APR_CPU_AVX512BW;
        if ((ebx >> 31) & 1)
            f |= APR_CPU_AVX512VL;
        if (max_subleaf >= 1) {
            __cpuid_count(7, 1, eax, ebx, ecx, edx);
            if ((eax >> 5) & 1)
                f |= APR_CPU_AVX512BF16;
        }
    }
    return f;
}
#endif /* APR_CPU_X86 */

static inline unsigned int apr_cpu_detect(void)
{
    unsigned int f = APR_CPU_DETECTED;
#ifdef APR_CPU_X86
    f |= apr_cpu_detect_x86();
#endif
#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#if defined(__ARM_NEON)
    /* Every AArch64 CPU has Advanced SIMD. */
    f |= APR_CPU_ARM_NEON;
#endif
#if defined(__ARM_FEATURE_CRC32)
    f |= APR_CPU_ARM_CRC32;
#elif defined(__linux__)
    if (getauxval(AT_HWCAP) & HWCAP_CRC32)
        f |= APR_CPU_ARM_CRC32;
#endif
    /* Elsewhere only a compile-time guarantee (e.g. Apple M-series targets,
     * where the compiler defines __ARM_FEATURE_CRC32) is trusted. */
#endif
    return f;
}

/* Bit mask of APR_CPU_* features, detected on first use.  Detection always
 * gives the same answer, so threads that race here all store the same value
 * and nothing else is published through it. */
static inline unsigned int apr_cpu_features(void)
{
    static unsigned int cached;
    unsigned int f = APR_LOAD_RELAXED(&cached);
    if (!f) {
        f = apr_cpu_detect();
        APR_STORE_RELAXED(&cached, f);
    }
    return f & ~APR_CPU_DETECTED;
}

/* Nonzero when every feature in want is present. */
static inline int apr_cpu_has(unsigned int want)
{
    return (apr_cpu_features() & want) == want;
}

#ifdef __cplusplus
}
#endif

#endif /* APR_CPU_H */
