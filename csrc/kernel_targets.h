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

/* Little-endian fields of the block structs, and |x| as bits (NaN above 0x7f800000). */
static inline uint16_t load_u16le(const uint8_t *p)
{
    return (uint16_t)(p[0] | (unsigned)p[1] << 8);
}

static inline uint32_t load_u32le(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void store_u16le(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void store_u32le(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static inline uint32_t abs_bits(float x)
{
    return f32_bits(x) & 0x7fffffffu;
}

#endif /* APR_KERNEL_TARGETS_H */
