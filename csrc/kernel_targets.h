/* What quant.c, quant_ggml.c and quantize_ggml.c share to compile their kernels several ways
 * and pick one at run time (cpu.h says which the CPU has): function-level target attributes
 * for AVX2 and AVX-512, an always-inline marker, no FMA contraction, and a float's bits. */
#ifndef APR_KERNEL_TARGETS_H
#define APR_KERNEL_TARGETS_H

#if defined(__clang__)
/* clang contracts a*b+c into an FMA by default (GCC in ISO C mode does not);
 * the oracles round the product first. */
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__GNUC__) || defined(__clang__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_X86_KERNELS 1
#define TARGET_AVX2 __attribute__((target("avx2")))
#if defined(__clang__)
#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#else
/* GCC's generic tuning would auto-vectorize the dequantize bodies 256 bits wide. */
#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512")))
#endif
#endif

#include <stdint.h>
#include <string.h>

/* A float's bits and back (memcpy: no aliasing of a float through an integer pointer). */
static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif /* APR_KERNEL_TARGETS_H */
