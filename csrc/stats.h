/* One-pass tensor statistics: count, NaN / +Inf / -Inf / zero counts, min and
 * max, mean and M2 (sum of squared deviations) over the finite values, and an
 * optional histogram; for float32/64, float16, bfloat16 (raw 16-bit patterns),
 * the integer types, and the packed quantized types of quant.h (decoded a
 * small chunk at a time, never the whole tensor).
 *
 * Numerics: each block of 4096 values is summed (double), its own mean taken,
 * its M2 summed around that mean while the block is still in L1, and blocks
 * are merged with Chan et al.'s pairwise update.  Work is split into fixed
 * parts of about 1 Mi values whatever the thread count, and the parts are
 * merged in order on the calling thread, so every thread count gives the same
 * bits.
 *
 * Histogram: value v (as a double) is counted when it is finite and lo <= v
 * <= hi, in bin t = (v - lo) * scale truncated, where scale = bins / (hi - lo)
 * and a t of bins or more goes to the last bin; with `divide` set (a range so
 * wide or narrow that hi - lo or scale overflows) t is (v/2 - lo/2) /
 * (hi/2 - lo/2) * bins instead.  The glue (_stats.pyx) derives scale and
 * divide from lo and hi itself, so every bin number stays in bounds.  The
 * NumPy twin computes the same doubles, so counts agree exactly. */
#ifndef APRFAST_STATS_H
#define APRFAST_STATS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum apr_stats_kind {
    APR_SK_F32 = 0, APR_SK_F64, APR_SK_F16, APR_SK_BF16,
    APR_SK_I8, APR_SK_I16, APR_SK_I32, APR_SK_I64,
    APR_SK_U8, APR_SK_U16, APR_SK_U32, APR_SK_U64
};
#define APR_SK_COUNT 12

#define APR_STATS_MOMENTS 1 /* counts, min/max, mean/M2 */
#define APR_STATS_HIST 2    /* histogram only */

#define APR_STATS_OK 0
#define APR_STATS_EKIND (-1)  /* unknown kind or quant type */
#define APR_STATS_ESIZE (-2)  /* byte count does not match the element count */
#define APR_STATS_ENOMEM (-3)
#define APR_STATS_EQUANT (-4) /* the dequantizer refused a chunk */

typedef struct {
    uint64_t count, nan, pos_inf, neg_inf, zero, finite;
    double min, max;      /* over finite values (float kinds); +inf/-inf when none */
    int64_t imin, imax;   /* signed integer kinds, exact */
    uint64_t umin, umax;  /* unsigned integer kinds, exact */
    double mean, m2;      /* over finite values */
} apr_stats;

typedef struct {
    uint64_t *counts; /* bins counters, added to (not cleared) */
    size_t bins;
    double lo, hi, scale;
    int divide;
} apr_hist;

void apr_stats_init(apr_stats *s);

/* Fold part into into (Chan's merge for the moments). */
void apr_stats_merge(apr_stats *into, const apr_stats *part);

/* Statistics of n elements of kind at data (little-endian, any alignment).
 * want: APR_STATS_MOMENTS and/or APR_STATS_HIST (hist may be NULL without
 * it).  nthreads <= 0: every online core; large inputs only. */
int apr_stats_compute(int kind, const void *data, size_t n, int want, const apr_hist *hist, int nthreads,
                      apr_stats *out);

/* The same for a packed quantized tensor of quant.h's type qtype: rows rows
 * of row elements each.  Types whose blocks never span rows and whose row is
 * not a whole number of blocks store each row padded to whole blocks (the
 * padding is decoded and ignored); pass rows = 1, row = n otherwise.  nbytes
 * must be what quant.h's layout gives. */
int apr_stats_quant(int qtype, const uint8_t *data, size_t nbytes, size_t rows, size_t row, int want,
                    const apr_hist *hist, int nthreads, apr_stats *out);

/* 1 when every value of that packed tensor is finite, known without decoding
 * it: a GGML type whose values are its blocks' float16 scales times bounded
 * factors of its codes, every one of those scales finite.  0 when that is not
 * known: another type, a non-finite scale, or bytes that do not fit the layout
 * (apr_stats_quant then says what is wrong).  Reads one or two halves a block,
 * allocates nothing; the values' NaN and Inf counts are 0 whenever it says 1. */
int apr_stats_quant_finite(int qtype, const uint8_t *data, size_t nbytes, size_t rows, size_t row);

/* Threads used for nthreads <= 0. */
int apr_stats_default_threads(void);

#ifdef __cplusplus
}
#endif
#endif
