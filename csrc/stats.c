/* Tensor statistics: block kernels, the chunked drivers and the threaded
 * split (contract in stats.h). */
#include "stats.h"
#include "half.h"
#include "parallel.h"
#include "quant.h"
#include "cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Values summarised at once: small enough for L1 (16 KiB of float32), so the
 * second look for M2 costs no memory traffic. */
#define BLOCK 4096
/* Values per part: the unit of the thread split and of the ordered merge. */
#define PART ((size_t)1 << 20)

/* Sums may be reassociated here: the order of a block's additions only moves
 * the last bits, and it lets the compiler vectorize the loops.  NaN and Inf are
 * handled outside these loops. */
#if defined(__GNUC__) && !defined(__clang__)
#define FAST_LOOP __attribute__((optimize("O3", "associative-math", "no-signed-zeros", "no-trapping-math")))
/* Only for data already checked to hold no NaN or Inf. */
#define FINITE_LOOP __attribute__((optimize("O3", "finite-math-only", "no-signed-zeros", "no-trapping-math")))
#else
#define FAST_LOOP
#define FINITE_LOOP
#endif
#define MAX_OF_float 3.40282346638528859811704183484516925e+38F
#define MAX_OF_double 1.79769313486231570814527423731704357e+308

void apr_stats_init(apr_stats *s)
{
    memset(s, 0, sizeof *s);
    s->min = INFINITY;
    s->max = -INFINITY;
    s->imin = INT64_MAX;
    s->imax = INT64_MIN;
    s->umin = UINT64_MAX;
    s->umax = 0;
}

/* Chan, Golub, LeVeque: (n, mean, M2) of two disjoint sets combined. */
static void merge_moments(apr_stats *a, uint64_t nb, double mb, double m2b)
{
    if (!nb)
        return;
    if (!a->finite) {
        a->finite = nb;
        a->mean = mb;
        a->m2 = m2b;
        return;
    }
    double na = (double)a->finite, nbd = (double)nb, n = na + nbd;
    double delta = mb - a->mean;
    a->mean += delta * (nbd / n);
    a->m2 += m2b + delta * delta * (na * nbd / n);
    a->finite += nb;
}

void apr_stats_merge(apr_stats *into, const apr_stats *p)
{
    into->count += p->count;
    into->nan += p->nan;
    into->pos_inf += p->pos_inf;
    into->neg_inf += p->neg_inf;
    into->zero += p->zero;
    if (p->min < into->min)
        into->min = p->min;
    if (p->max > into->max)
        into->max = p->max;
    if (p->imin < into->imin)
        into->imin = p->imin;
    if (p->imax > into->imax)
        into->imax = p->imax;
    if (p->umin < into->umin)
        into->umin = p->umin;
    if (p->umax > into->umax)
        into->umax = p->umax;
    merge_moments(into, p->finite, p->mean, p->m2);
}

/* ------------------------------------------------------------------------ */
/* Histogram of one block of doubles-to-be.                                 */

static inline void hist_one(const apr_hist *h, uint64_t *counts, double v)
{
    if (!(v >= h->lo && v <= h->hi)) /* NaN fails both */
        return;
    double t = h->divide ? (v * 0.5 - h->lo * 0.5) / (h->hi * 0.5 - h->lo * 0.5) * (double)h->bins
                         : (v - h->lo) * h->scale;
    /* t is in [0, bins] (a few ulps over at most); the checks keep any index in
     * bounds whatever the range.  A signed conversion is one instruction. */
    if (!(t < (double)h->bins)) /* rounding past the top, or NaN from a degenerate range */
        counts[h->bins - 1]++;
    else if (!(t >= 0))
        counts[0]++;
    else
        counts[(int64_t)t]++;
}

/* Weights crowd a few bins, and one array of counters would make every
 * increment wait for the previous store to the same counter: HIST_LANES
 * sub-histograms of bins + 1 counters each (the extra one takes values outside
 * the range) are filled in turn.  The bin numbers of HIST_STEP values are
 * computed first in a loop the compiler vectorizes, then counted. */
#define HIST_LANES 4
#define HIST_STEP 256

static FAST_LOOP void hist_index_base(const double *v, size_t n, const apr_hist *h, int32_t *idx)
{
    double lo = h->lo, hi = h->hi, scale = h->scale;
    int32_t top = (int32_t)h->bins - 1, outside = (int32_t)h->bins;
    for (size_t i = 0; i < n; i++) {
        int in = v[i] >= lo && v[i] <= hi;
        /* In range, t is in [0, bins] (a few ulps over at most), so it fits an int32. */
        int32_t k = (int32_t)(in ? (v[i] - lo) * scale : 0.0);
        k = k < top ? k : top;
        idx[i] = in ? k : outside;
    }
}

#ifdef APR_CPU_X86
static FAST_LOOP __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2"))) void
hist_index_avx512(const double *v, size_t n, const apr_hist *h, int32_t *idx)
{
    double lo = h->lo, hi = h->hi, scale = h->scale;
    int32_t top = (int32_t)h->bins - 1, outside = (int32_t)h->bins;
    for (size_t i = 0; i < n; i++) {
        int in = v[i] >= lo && v[i] <= hi;
        int32_t k = (int32_t)(in ? (v[i] - lo) * scale : 0.0);
        k = k < top ? k : top;
        idx[i] = in ? k : outside;
    }
}

static FAST_LOOP __attribute__((target("avx2"))) void
hist_index_avx2(const double *v, size_t n, const apr_hist *h, int32_t *idx)
{
    double lo = h->lo, hi = h->hi, scale = h->scale;
    int32_t top = (int32_t)h->bins - 1, outside = (int32_t)h->bins;
    for (size_t i = 0; i < n; i++) {
        int in = v[i] >= lo && v[i] <= hi;
        int32_t k = (int32_t)(in ? (v[i] - lo) * scale : 0.0);
        k = k < top ? k : top;
        idx[i] = in ? k : outside;
    }
}
#endif

static int vector_level(void);

static void hist_index(const double *v, size_t n, const apr_hist *h, int32_t *idx)
{
#ifdef APR_CPU_X86
    int level = vector_level();
    if (level == 2) {
        hist_index_avx512(v, n, h, idx);
        return;
    }
    if (level == 1) {
        hist_index_avx2(v, n, h, idx);
        return;
    }
#endif
    hist_index_base(v, n, h, idx);
}

static void hist_count(const int32_t *idx, size_t n, size_t stride, uint64_t *counts)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        counts[idx[i]]++;
        counts[stride + idx[i + 1]]++;
        counts[2 * stride + idx[i + 2]]++;
        counts[3 * stride + idx[i + 3]]++;
    }
    for (; i < n; i++)
        counts[idx[i]]++;
}

#define DEFINE_HIST(name, type)                                                                \
    static void name(const type *x, size_t n, const apr_hist *h, uint64_t *counts)             \
    {                                                                                          \
        if (h->divide) { /* a degenerate range: the careful scalar form */                    \
            for (size_t i = 0; i < n; i++)                                                     \
                hist_one(h, counts, (double)x[i]);                                             \
            return;                                                                            \
        }                                                                                      \
        double v[HIST_STEP];                                                                   \
        int32_t idx[HIST_STEP];                                                                \
        for (size_t i = 0; i < n; i += HIST_STEP) {                                            \
            size_t k = n - i < HIST_STEP ? n - i : HIST_STEP;                                  \
            for (size_t j = 0; j < k; j++)                                                     \
                v[j] = (double)x[i + j];                                                       \
            hist_index(v, k, h, idx);                                                          \
            hist_count(idx, k, h->bins + 1, counts);                                           \
        }                                                                                      \
    }
DEFINE_HIST(hist_f32, float)
DEFINE_HIST(hist_f64, double)
DEFINE_HIST(hist_i8, int8_t)
DEFINE_HIST(hist_i16, int16_t)
DEFINE_HIST(hist_i32, int32_t)
DEFINE_HIST(hist_i64, int64_t)
DEFINE_HIST(hist_u8, uint8_t)
DEFINE_HIST(hist_u16, uint16_t)
DEFINE_HIST(hist_u32, uint32_t)
DEFINE_HIST(hist_u64, uint64_t)

/* ------------------------------------------------------------------------ */
/* Float blocks: a fast pass that assumes every value is finite (and says if  */
/* one was not), then, only for blocks holding NaN or Inf, a careful pass.    */

typedef struct {
    uint64_t zero, nonfinite;
    double sum, min, max;
} fast_sums;

/* Three small loops, each one the compiler vectorizes: sums, zero and
 * non-finite counts (32-bit counters: a block is at most 4096 values); then,
 * only for blocks without NaN or Inf, min/max (compiled assuming finite
 * values, which this block has just been shown to hold) and M2. */
#define DEFINE_FAST(name, type, abs_fn, target)                                                \
    static FAST_LOOP target fast_sums name(const type *x, size_t n)                            \
    {                                                                                          \
        double sum = 0;                                                                        \
        uint32_t zero = 0, bad = 0;                                                            \
        for (size_t i = 0; i < n; i++) {                                                       \
            type v = x[i];                                                                     \
            sum += (double)v;                                                                  \
            zero += v == 0;                                                                    \
            bad += !(abs_fn(v) <= (type)MAX_OF_##type);                                        \
        }                                                                                      \
        fast_sums r = {zero, bad, sum, 0, 0};                                                  \
        return r;                                                                              \
    }                                                                                          \
    static FINITE_LOOP target void name##_minmax(const type *x, size_t n, double *lo, double *hi) \
    {                                                                                          \
        type mn = x[0], mx = x[0];                                                             \
        for (size_t i = 0; i < n; i++) {                                                       \
            type v = x[i];                                                                     \
            mn = v < mn ? v : mn;                                                              \
            mx = v > mx ? v : mx;                                                              \
        }                                                                                      \
        *lo = (double)mn;                                                                      \
        *hi = (double)mx;                                                                      \
    }                                                                                          \
    static FAST_LOOP target double name##_m2(const type *x, size_t n, double mean)             \
    {                                                                                          \
        double m2 = 0;                                                                         \
        for (size_t i = 0; i < n; i++) {                                                       \
            double d = (double)x[i] - mean;                                                    \
            m2 += d * d;                                                                       \
        }                                                                                      \
        return m2;                                                                             \
    }
#define NO_TARGET
DEFINE_FAST(fast_f32_base, float, fabsf, NO_TARGET)
DEFINE_FAST(fast_f64_base, double, fabs, NO_TARGET)
#ifdef APR_CPU_X86
/* Same C, compiled for wider vectors; picked at run time.  No FMA: a fused
 * multiply-add would give other bits than the base path. */
#define TARGET_AVX2 __attribute__((target("avx2")))
#define TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2")))
DEFINE_FAST(fast_f32_avx2, float, fabsf, TARGET_AVX2)
DEFINE_FAST(fast_f64_avx2, double, fabs, TARGET_AVX2)
DEFINE_FAST(fast_f32_avx512, float, fabsf, TARGET_AVX512)
DEFINE_FAST(fast_f64_avx512, double, fabs, TARGET_AVX512)
#endif

/* 0 base, 1 AVX2, 2 AVX-512. */
static int vector_level(void)
{
#ifdef APR_CPU_X86
    if (apr_cpu_has(APR_CPU_AVX512F | APR_CPU_AVX512VL | APR_CPU_AVX512BW | APR_CPU_AVX512DQ))
        return 2;
    if (apr_cpu_has(APR_CPU_AVX2))
        return 1;
#endif
    return 0;
}

#ifdef APR_CPU_X86
#define DISPATCH(base, ret, args, call)                                                        \
    static ret base args                                                                       \
    {                                                                                          \
        switch (vector_level()) {                                                              \
        case 2: return base##_avx512 call;                                                     \
        case 1: return base##_avx2 call;                                                       \
        default: return base##_base call;                                                      \
        }                                                                                      \
    }
#else
#define DISPATCH(base, ret, args, call) static ret base args { return base##_base call; }
#endif
DISPATCH(fast_f32, fast_sums, (const float *x, size_t n), (x, n))
DISPATCH(fast_f64, fast_sums, (const double *x, size_t n), (x, n))

#define DEFINE_M2_DISPATCH(base, type)                                                         \
    static double base##_m2(const type *x, size_t n, double mean)                              \
    {                                                                                          \
        M2_SWITCH(base, x, n, mean)                                                            \
    }
#ifdef APR_CPU_X86
#define M2_SWITCH(base, x, n, mean)                                                            \
    switch (vector_level()) {                                                                  \
    case 2: return base##_avx512_m2(x, n, mean);                                               \
    case 1: return base##_avx2_m2(x, n, mean);                                                 \
    default: return base##_base_m2(x, n, mean);                                                \
    }
#else
#define M2_SWITCH(base, x, n, mean) return base##_base_m2(x, n, mean);
#endif
DEFINE_M2_DISPATCH(fast_f32, float)
DEFINE_M2_DISPATCH(fast_f64, double)

#ifdef APR_CPU_X86
#define DEFINE_MINMAX_DISPATCH(base, type)                                                     \
    static void base##_minmax(const type *x, size_t n, double *lo, double *hi)                 \
    {                                                                                          \
        switch (vector_level()) {                                                              \
        case 2: base##_avx512_minmax(x, n, lo, hi); return;                                    \
        case 1: base##_avx2_minmax(x, n, lo, hi); return;                                      \
        default: base##_base_minmax(x, n, lo, hi); return;                                     \
        }                                                                                      \
    }
#else
#define DEFINE_MINMAX_DISPATCH(base, type)                                                     \
    static void base##_minmax(const type *x, size_t n, double *lo, double *hi)                 \
    {                                                                                          \
        base##_base_minmax(x, n, lo, hi);                                                      \
    }
#endif
DEFINE_MINMAX_DISPATCH(fast_f32, float)
DEFINE_MINMAX_DISPATCH(fast_f64, double)


#define DEFINE_FLOAT_BLOCK(name, type, fast, hist)                                             \
    static void name(const type *x, size_t n, int want, const apr_hist *h, uint64_t *counts,  \
                     apr_stats *s)                                                             \
    {                                                                                          \
        if (!n)                                                                                \
            return;                                                                            \
        if (want & APR_STATS_HIST)                                                             \
            hist(x, n, h, counts);                                                             \
        if (!(want & APR_STATS_MOMENTS))                                                       \
            return;                                                                            \
        s->count += n;                                                                         \
        fast_sums f = fast(x, n);                                                              \
        if (!f.nonfinite) {                                                                    \
            double mean = f.sum / (double)n;                                                   \
            fast##_minmax(x, n, &f.min, &f.max);                                               \
            s->zero += f.zero;                                                                 \
            if (f.min < s->min)                                                                \
                s->min = f.min;                                                                \
            if (f.max > s->max)                                                                \
                s->max = f.max;                                                                \
            merge_moments(s, n, mean, fast##_m2(x, n, mean));                                  \
            return;                                                                            \
        }                                                                                      \
        /* Rare: NaN or Inf in this block.  Plain loops, one value at a time. */               \
        uint64_t fin = 0;                                                                      \
        double sum = 0;                                                                        \
        for (size_t i = 0; i < n; i++) {                                                       \
            double v = (double)x[i];                                                           \
            if (v != v) {                                                                      \
                s->nan++;                                                                      \
            } else if (v == INFINITY) {                                                        \
                s->pos_inf++;                                                                  \
            } else if (v == -INFINITY) {                                                       \
                s->neg_inf++;                                                                  \
            } else {                                                                           \
                fin++;                                                                         \
                sum += v;                                                                      \
                s->zero += v == 0;                                                             \
                if (v < s->min)                                                                \
                    s->min = v;                                                                \
                if (v > s->max)                                                                \
                    s->max = v;                                                                \
            }                                                                                  \
        }                                                                                      \
        if (!fin)                                                                              \
            return;                                                                            \
        double mean = sum / (double)fin, m2 = 0;                                               \
        for (size_t i = 0; i < n; i++) {                                                       \
            double v = (double)x[i];                                                           \
            if (isfinite(v))                                                                   \
                m2 += (v - mean) * (v - mean);                                                 \
        }                                                                                      \
        merge_moments(s, fin, mean, m2);                                                       \
    }
DEFINE_FLOAT_BLOCK(block_f32, float, fast_f32, hist_f32)
DEFINE_FLOAT_BLOCK(block_f64, double, fast_f64, hist_f64)

/* ------------------------------------------------------------------------ */
/* Integer blocks: exact min/max in the type's own width, exact sums for up   */
/* to 32 bits (a block of 4096 cannot overflow int64), doubles for 64 bits.   */

#define DEFINE_INT_BLOCK(name, type, acc, lo_field, hi_field, wide, hist)                      \
    static FAST_LOOP void name##_sums(const type *x, size_t n, acc *sum, type *mn, type *mx,   \
                                      uint64_t *zero)                                          \
    {                                                                                          \
        acc s = 0;                                                                             \
        type a = x[0], b = x[0];                                                               \
        uint64_t z = 0;                                                                        \
        for (size_t i = 0; i < n; i++) {                                                       \
            type v = x[i];                                                                     \
            s += (acc)v;                                                                       \
            a = v < a ? v : a;                                                                 \
            b = v > b ? v : b;                                                                 \
            z += v == 0;                                                                       \
        }                                                                                      \
        *sum = s;                                                                              \
        *mn = a;                                                                               \
        *mx = b;                                                                               \
        *zero = z;                                                                             \
    }                                                                                          \
    static FAST_LOOP double name##_m2(const type *x, size_t n, double mean)                    \
    {                                                                                          \
        double m2 = 0;                                                                         \
        for (size_t i = 0; i < n; i++) {                                                       \
            double d = (double)x[i] - mean;                                                    \
            m2 += d * d;                                                                       \
        }                                                                                      \
        return m2;                                                                             \
    }                                                                                          \
    static void name(const type *x, size_t n, int want, const apr_hist *h, uint64_t *counts,  \
                     apr_stats *s)                                                             \
    {                                                                                          \
        if (!n)                                                                                \
            return;                                                                            \
        if (want & APR_STATS_HIST)                                                             \
            hist(x, n, h, counts);                                                             \
        if (!(want & APR_STATS_MOMENTS))                                                       \
            return;                                                                            \
        acc sum;                                                                               \
        type mn, mx;                                                                           \
        uint64_t zero;                                                                         \
        name##_sums(x, n, &sum, &mn, &mx, &zero);                                              \
        s->count += n;                                                                         \
        s->zero += zero;                                                                       \
        if ((wide)mn < s->lo_field)                                                            \
            s->lo_field = (wide)mn;                                                            \
        if ((wide)mx > s->hi_field)                                                            \
            s->hi_field = (wide)mx;                                                            \
        if ((double)mn < s->min)                                                               \
            s->min = (double)mn;                                                               \
        if ((double)mx > s->max)                                                               \
            s->max = (double)mx;                                                               \
        double mean = (double)sum / (double)n;                                                 \
        merge_moments(s, n, mean, name##_m2(x, n, mean));                                      \
    }
DEFINE_INT_BLOCK(block_i8, int8_t, int64_t, imin, imax, int64_t, hist_i8)
DEFINE_INT_BLOCK(block_i16, int16_t, int64_t, imin, imax, int64_t, hist_i16)
DEFINE_INT_BLOCK(block_i32, int32_t, int64_t, imin, imax, int64_t, hist_i32)
DEFINE_INT_BLOCK(block_i64, int64_t, double, imin, imax, int64_t, hist_i64)
DEFINE_INT_BLOCK(block_u8, uint8_t, int64_t, umin, umax, uint64_t, hist_u8)
DEFINE_INT_BLOCK(block_u16, uint16_t, int64_t, umin, umax, uint64_t, hist_u16)
DEFINE_INT_BLOCK(block_u32, uint32_t, int64_t, umin, umax, uint64_t, hist_u32)
DEFINE_INT_BLOCK(block_u64, uint64_t, double, umin, umax, uint64_t, hist_u64)

typedef void (*block_fn)(const void *x, size_t n, int want, const apr_hist *h, uint64_t *counts, apr_stats *s);

static const size_t ITEM_SIZE[APR_SK_COUNT] = {4, 8, 2, 2, 1, 2, 4, 8, 1, 2, 4, 8};

static block_fn block_for(int kind)
{
    switch (kind) {
    case APR_SK_F32: return (block_fn)block_f32;
    case APR_SK_F64: return (block_fn)block_f64;
    case APR_SK_I8: return (block_fn)block_i8;
    case APR_SK_I16: return (block_fn)block_i16;
    case APR_SK_I32: return (block_fn)block_i32;
    case APR_SK_I64: return (block_fn)block_i64;
    case APR_SK_U8: return (block_fn)block_u8;
    case APR_SK_U16: return (block_fn)block_u16;
    case APR_SK_U32: return (block_fn)block_u32;
    case APR_SK_U64: return (block_fn)block_u64;
    default: return NULL;
    }
}

/* ------------------------------------------------------------------------ */
/* Parts: each thread summarises whole parts into its slot of an array and    */
/* its own histogram; the caller merges the slots in order.                   */

typedef struct job job;
/* Returns 0, or nonzero when the dequantizer refused a chunk. */
typedef int (*part_fn)(const job *j, size_t part, apr_stats *s, uint64_t *counts);

struct job {
    part_fn run;
    int want;
    const apr_hist *hist;
    /* plain kinds */
    int kind;
    const uint8_t *data;
    size_t n;
    /* quantized */
    int qtype;
    size_t rows, row, row_bytes, header, block_elems, block_bytes, chunks_per_row, chunks;
    int partial_ok;
};

typedef struct {
    const job *j;
    size_t first, last;
    apr_stats *parts;
    uint64_t *counts;
    int failed; /* this piece's own flag: no two threads write one */
} piece;

static int plain_part(const job *j, size_t part, apr_stats *s, uint64_t *counts)
{
    size_t start = part * PART, end = start + PART < j->n ? start + PART : j->n;
    size_t item = ITEM_SIZE[j->kind];
    /* A view at an odd offset of a file (a fuzzed or foreign GGUF tensor): the kernels load
     * whole elements, which C allows only at their alignment (UBSan: misaligned load), so
     * such blocks are copied into aligned scratch first.  Aligned data, the normal case,
     * is read in place. */
    int misaligned = item > 1 && ((uintptr_t)(const void *)j->data % item) != 0;
    uint64_t scratch[BLOCK]; /* BLOCK elements of at most 8 bytes */
    if (j->kind == APR_SK_F16 || j->kind == APR_SK_BF16) {
        /* memcpy-free widening into a float block; the half kernels are exact. */
        float buf[BLOCK];
        for (size_t i = start; i < end; i += BLOCK) {
            size_t k = end - i < BLOCK ? end - i : BLOCK;
            const uint16_t *src = (const uint16_t *)(const void *)(j->data + i * item);
            if (misaligned) {
                memcpy(scratch, j->data + i * item, k * item);
                src = (const uint16_t *)(const void *)scratch;
            }
            if (j->kind == APR_SK_F16)
                apr_f16_to_f32(APR_HALF_AUTO, src, buf, k, 1);
            else
                apr_bf16_to_f32(APR_HALF_AUTO, src, buf, k, 1);
            block_f32(buf, k, j->want, j->hist, counts, s);
        }
        return 0;
    }
    block_fn block = block_for(j->kind);
    for (size_t i = start; i < end; i += BLOCK) {
        size_t k = end - i < BLOCK ? end - i : BLOCK;
        if (misaligned) {
            memcpy(scratch, j->data + i * item, k * item);
            block((const uint8_t *)scratch, k, j->want, j->hist, counts, s);
        } else {
            block(j->data + i * item, k, j->want, j->hist, counts, s);
        }
    }
    return 0;
}

/* Chunks of quantized values: chunk c is row c / chunks_per_row, values
 * [off, off + BLOCK) of it.  BLOCK is a multiple of every block size. */
#define QPART_CHUNKS (PART / BLOCK)

static int quant_part(const job *j, size_t part, apr_stats *s, uint64_t *counts)
{
    float buf[BLOCK];
    uint8_t scratch[8 + BLOCK]; /* per-tensor types: their header, then the chunk */
    size_t first = part * QPART_CHUNKS, last = first + QPART_CHUNKS < j->chunks ? first + QPART_CHUNKS : j->chunks;
    for (size_t c = first; c < last; c++) {
        size_t r = c / j->chunks_per_row, off = (c % j->chunks_per_row) * BLOCK;
        size_t keep = j->row - off < BLOCK ? j->row - off : BLOCK;
        size_t decode = j->partial_ok ? keep : (keep + j->block_elems - 1) / j->block_elems * j->block_elems;
        const uint8_t *src = j->data + j->header + r * j->row_bytes + off / j->block_elems * j->block_bytes;
        if (j->header) {
            /* One scale (and zero point) for the whole tensor: put it before this
             * chunk's bytes so the dequantizer sees a tensor of `decode` values. */
            memcpy(scratch, j->data, j->header);
            memcpy(scratch + j->header, src, decode);
            src = scratch;
        }
        if (apr_dequantize(j->qtype, src, decode, buf, 1, -1) != APR_QUANT_OK)
            return 1;
        block_f32(buf, keep, j->want, j->hist, counts, s);
    }
    return 0;
}

static void run_piece(void *arg)
{
    piece *p = (piece *)arg;
    p->failed = 0;
    for (size_t i = p->first; i < p->last && !p->failed; i++) {
        apr_stats_init(&p->parts[i]);
        p->failed = p->j->run(p->j, i, &p->parts[i], p->counts);
    }
}

int apr_stats_default_threads(void)
{
    return apr_parallel_cpu_count(APR_PARALLEL_MAX_THREADS);
}

static int run_job(const job *j, size_t nparts, int nthreads, apr_stats *out)
{
    apr_stats_init(out);
    if (!nparts)
        return APR_STATS_OK;
    if (nthreads <= 0)
        nthreads = apr_stats_default_threads();
    /* A second thread pays for itself only from a couple of parts on (see
     * half.c's measurements for the same 2-core machine). */
    if ((size_t)nthreads > nparts / 2)
        nthreads = (int)(nparts / 2);
    if (nthreads < 1)
        nthreads = 1;
    if (nthreads > APR_PARALLEL_MAX_THREADS)
        nthreads = APR_PARALLEL_MAX_THREADS;
    int hist = (j->want & APR_STATS_HIST) && j->hist && j->hist->bins;
    size_t bins = hist ? j->hist->bins : 0, per_thread = HIST_LANES * (bins + 1);
    apr_stats *parts = malloc(nparts * sizeof *parts);
    uint64_t *counts = hist ? calloc((size_t)nthreads * per_thread, sizeof *counts) : NULL;
    if (!parts || (hist && !counts)) {
        free(parts);
        free(counts);
        return APR_STATS_ENOMEM;
    }
    piece pieces[APR_PARALLEL_MAX_THREADS];
    for (int t = 0; t < nthreads; t++) {
        pieces[t].j = j;
        pieces[t].first = nparts * (size_t)t / (size_t)nthreads;
        pieces[t].last = nparts * (size_t)(t + 1) / (size_t)nthreads;
        pieces[t].parts = parts;
        pieces[t].counts = hist ? counts + (size_t)t * per_thread : NULL;
    }
    apr_parallel_run(pieces, sizeof pieces[0], nthreads, run_piece);
    int failed = 0;
    for (int t = 0; t < nthreads; t++)
        failed |= pieces[t].failed;
    if (failed) { /* a piece stopped early: some parts were never filled in */
        free(parts);
        free(counts);
        return APR_STATS_EQUANT;
    }
    for (size_t i = 0; i < nparts; i++)
        apr_stats_merge(out, &parts[i]);
    for (size_t k = 0; k < (size_t)nthreads * HIST_LANES; k++)
        for (size_t b = 0; b < bins; b++) /* counter `bins` of each lane: values outside */
            j->hist->counts[b] += counts[k * (bins + 1) + b];
    free(parts);
    free(counts);
    return APR_STATS_OK;
}

int apr_stats_compute(int kind, const void *data, size_t n, int want, const apr_hist *hist, int nthreads,
                      apr_stats *out)
{
    if (kind < 0 || kind >= APR_SK_COUNT)
        return APR_STATS_EKIND;
    job j;
    memset(&j, 0, sizeof j);
    j.run = plain_part;
    j.want = want;
    j.hist = hist;
    j.kind = kind;
    j.data = (const uint8_t *)data;
    j.n = n;
    return run_job(&j, (n + PART - 1) / PART, nthreads, out);
}

/* The layout checks of a packed tensor (stats.h): fills j's layout fields and
 * returns APR_STATS_OK, APR_STATS_EKIND or APR_STATS_ESIZE; *empty is set for a
 * tensor of no values (OK only when it also has no bytes). */
static int quant_layout(job *j, int qtype, size_t nbytes, size_t rows, size_t row, int *empty)
{
    size_t be = 0, bb = 0;
    *empty = 0;
    if (qtype < 0 || qtype >= APR_QT_COUNT || apr_quant_block_info(qtype, &be, &bb) != APR_QUANT_OK || !be)
        return APR_STATS_EKIND;
    if (BLOCK % be)
        return APR_STATS_EKIND;
    if (rows && row > SIZE_MAX / rows)
        return APR_STATS_ESIZE;
    size_t n = rows * row;
    if (!n) {
        *empty = 1;
        return nbytes ? APR_STATS_ESIZE : APR_STATS_OK;
    }
    j->qtype = qtype;
    j->data = NULL;
    j->rows = rows;
    j->row = row;
    j->block_elems = be;
    j->block_bytes = bb;
    j->header = apr_quant_header_bytes(qtype, n);
    j->partial_ok = apr_quant_allows_partial_block(qtype) && rows == 1;
    size_t blocks_per_row = (row + be - 1) / be;
    if (blocks_per_row > SIZE_MAX / bb || (rows > 1 && blocks_per_row * bb > (SIZE_MAX - j->header) / rows))
        return APR_STATS_ESIZE;
    j->row_bytes = blocks_per_row * bb;
    size_t expect = j->header + (j->partial_ok ? apr_quant_nbytes(qtype, n) - j->header : rows * j->row_bytes);
    if (j->partial_ok && apr_quant_nbytes(qtype, n) == SIZE_MAX)
        return APR_STATS_ESIZE;
    if (expect != nbytes)
        return APR_STATS_ESIZE;
    j->chunks_per_row = (row + BLOCK - 1) / BLOCK;
    j->chunks = rows * j->chunks_per_row;
    return APR_STATS_OK;
}

int apr_stats_quant(int qtype, const uint8_t *data, size_t nbytes, size_t rows, size_t row, int want,
                    const apr_hist *hist, int nthreads, apr_stats *out)
{
    apr_stats_init(out);
    job j;
    memset(&j, 0, sizeof j);
    int empty, rc = quant_layout(&j, qtype, nbytes, rows, row, &empty);
    if (rc != APR_STATS_OK || empty)
        return rc;
    j.run = quant_part;
    j.want = want;
    j.hist = hist;
    j.data = data;
    return run_job(&j, (j.chunks + QPART_CHUNKS - 1) / QPART_CHUNKS, nthreads, out);
}

/* The float16 fields of each block of the GGML types whose every value is
 * finite when these are (stats.h): the value is (f16 scale) x (a factor below
 * 2^20 made of the block's integer codes, grid and sub-block scales), plus or
 * minus a second f16 times such a factor, so with |f16| <= 65504 no product or
 * sum comes near FLT_MAX and nothing makes an Inf or a NaN.  Offsets from
 * ggml's block structs (gguf-py's dequantize_blocks split the same bytes).
 * Types not listed (a float32 or per-tensor scale that can overflow, E8M0 or
 * FP8 scales, IQ1_M's scale spread over its sub-block scales) are never proven. */
static const struct {
    int qtype;
    uint8_t count, offset[2];
} FINITE_F16[] = {
    {APR_QT_Q8_0, 1, {0, 0}},     {APR_QT_Q4_0, 1, {0, 0}},     {APR_QT_Q4_1, 2, {0, 2}},
    {APR_QT_Q5_0, 1, {0, 0}},     {APR_QT_Q5_1, 2, {0, 2}},     {APR_QT_Q4_K, 2, {0, 2}},
    {APR_QT_Q6_K, 1, {208, 0}},   {APR_QT_Q8_1, 1, {0, 0}},     {APR_QT_Q2_K, 2, {80, 82}},
    {APR_QT_Q3_K, 1, {108, 0}},   {APR_QT_Q5_K, 2, {0, 2}},     {APR_QT_IQ2_XXS, 1, {0, 0}},
    {APR_QT_IQ2_XS, 1, {0, 0}},   {APR_QT_IQ3_XXS, 1, {0, 0}},  {APR_QT_IQ1_S, 1, {0, 0}},
    {APR_QT_IQ4_NL, 1, {0, 0}},   {APR_QT_IQ3_S, 1, {0, 0}},    {APR_QT_IQ2_S, 1, {0, 0}},
    {APR_QT_IQ4_XS, 1, {0, 0}},   {APR_QT_TQ1_0, 1, {52, 0}},   {APR_QT_TQ2_0, 1, {64, 0}},
};

int apr_stats_quant_finite(int qtype, const uint8_t *data, size_t nbytes, size_t rows, size_t row)
{
    job j;
    memset(&j, 0, sizeof j);
    int empty;
    if (quant_layout(&j, qtype, nbytes, rows, row, &empty) != APR_STATS_OK)
        return 0; /* not proven: the statistics engine says what is wrong */
    if (empty)
        return 1;
    size_t k = 0, rules = sizeof FINITE_F16 / sizeof FINITE_F16[0];
    while (k < rules && FINITE_F16[k].qtype != qtype)
        k++;
    if (k == rules || j.header || j.partial_ok)
        return 0;
    size_t bb = j.block_bytes, blocks = nbytes / bb;
    if (blocks * bb != nbytes)
        return 0;
    /* Exponent bits all ones: Inf or NaN.  Padding blocks are looked at too: a
     * non-finite scale there only sends the tensor to the full statistics. */
    for (unsigned f = 0; f < FINITE_F16[k].count; f++) {
        size_t off = FINITE_F16[k].offset[f];
        if (off + 2 > bb)
            return 0;
        const uint8_t *p = data + off + 1;
        unsigned bad = 0;
        for (size_t b = 0; b < blocks; b++, p += bb)
            bad |= (*p & 0x7Cu) == 0x7Cu;
        if (bad)
            return 0;
    }
    return 1;
}
