/*
 * bench_hist.h — the latency histogram shared by the load generators
 * (loadgen.c, curlgen.c), so that their percentiles are computed the same
 * way and rows from both can be compared cell by cell.
 *
 * Log-linear: 128 linear sub-buckets per power of two of nanoseconds, so a
 * value reported as its bucket's midpoint is within 0.4% of the truth; min,
 * max and mean are exact. Values clamp at 2^40 ns (about 18 minutes).
 * A histogram is about 34 KiB; zero it (calloc or `= {0}`) before use.
 *
 * Header-only (static inline) because the Makefile builds every
 * tests/bench/NAME.c into its own program.
 */
#ifndef POLYGW_BENCH_HIST_H
#define POLYGW_BENCH_HIST_H

#include <math.h>
#include <stdint.h>

#define HIST_SUB_BITS 7
#define HIST_SUB      (1u << HIST_SUB_BITS)
#define HIST_MAX_BITS 40 /* values clamp at 2^40 ns, about 18 minutes */
#define HIST_BUCKETS  ((HIST_MAX_BITS - HIST_SUB_BITS + 1) * HIST_SUB)

struct bench_hist {
    uint64_t counts[HIST_BUCKETS];
    uint64_t n;
    uint64_t min_ns, max_ns;
    double sum_ns;
};

static inline unsigned hist_index(uint64_t v)
{
    if (v >= (UINT64_C(1) << HIST_MAX_BITS))
        v = (UINT64_C(1) << HIST_MAX_BITS) - 1;
    if (v < HIST_SUB)
        return (unsigned)v;
    unsigned msb = 63u - (unsigned)__builtin_clzll(v);
    unsigned shift = msb - HIST_SUB_BITS;
    return (shift + 1) * HIST_SUB + (unsigned)((v >> shift) - HIST_SUB);
}

/* Midpoint of bucket `i`, in ns. */
static inline double hist_value(unsigned i)
{
    if (i < HIST_SUB)
        return (double)i;
    unsigned shift = i / HIST_SUB - 1;
    uint64_t lo = (uint64_t)(HIST_SUB + i % HIST_SUB) << shift;
    return (double)lo + (double)((UINT64_C(1) << shift) - 1) / 2.0;
}

static inline void hist_record(struct bench_hist *h, uint64_t v)
{
    h->counts[hist_index(v)]++;
    if (h->n == 0 || v < h->min_ns)
        h->min_ns = v;
    if (v > h->max_ns)
        h->max_ns = v;
    h->n++;
    h->sum_ns += (double)v;
}

static inline void hist_merge(struct bench_hist *into, const struct bench_hist *h)
{
    if (h->n == 0)
        return;
    for (unsigned i = 0; i < HIST_BUCKETS; i++)
        into->counts[i] += h->counts[i];
    if (into->n == 0 || h->min_ns < into->min_ns)
        into->min_ns = h->min_ns;
    if (h->max_ns > into->max_ns)
        into->max_ns = h->max_ns;
    into->n += h->n;
    into->sum_ns += h->sum_ns;
}

/* The value at percentile `p` (0 < p <= 100) in ns, clamped to [min, max]. */
static inline double hist_percentile(const struct bench_hist *h, double p)
{
    if (h->n == 0)
        return 0.0;
    uint64_t rank = (uint64_t)ceil(p / 100.0 * (double)h->n);
    if (rank < 1)
        rank = 1;
    uint64_t seen = 0;
    for (unsigned i = 0; i < HIST_BUCKETS; i++) {
        seen += h->counts[i];
        if (seen >= rank) {
            double v = hist_value(i);
            if (v < (double)h->min_ns)
                v = (double)h->min_ns;
            if (v > (double)h->max_ns)
                v = (double)h->max_ns;
            return v;
        }
    }
    return (double)h->max_ns;
}

#endif
