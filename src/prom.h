/*
 * prom.h — the Prometheus text exposition format 0.0.4, written directly
 * (no client library), and fixed-bucket histograms: what sidecar/metrics/metrics.c
 * renders its counters, gauges and histograms with.
 *
 * Pure: no I/O, no clock, no global state; a histogram observation neither
 * allocates nor looks anything up (it scans at most PROM_HIST_MAX bounds),
 * so it is cheap enough for every attempt and call. Not thread-safe (the
 * daemon is single-threaded).
 */
#ifndef POLYGW_PROM_H
#define POLYGW_PROM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------
 * Histograms
 */

#define PROM_HIST_MAX 20

/* Upper bounds of a histogram's buckets (`le`), ascending and finite; the
 * +Inf bucket is implicit. Static tables, shared by every histogram of a
 * family. `le_text`, when given, is each bound as written (the shortest
 * form that reads back as the double; saves formatting every bucket of
 * every series at each rendering); NULL entries are formatted. */
struct prom_buckets {
    size_t n;
    double le[PROM_HIST_MAX];
    const char *le_text[PROM_HIST_MAX];
};

/* 1 ms .. 600 s: call and attempt durations, TTFT, stall time. */
extern const struct prom_buckets prom_buckets_latency_s;
/* 100 µs .. 2.5 s: Redis round trips. */
extern const struct prom_buckets prom_buckets_rtt_s;

/* Counts are kept per bucket (not cumulative; bucket[b->n] is above the
 * last bound) and made cumulative when written. */
struct prom_hist {
    const struct prom_buckets *b; /* borrowed, static */
    uint64_t bucket[PROM_HIST_MAX + 1];
    uint64_t count;
    double sum;
};

/* Empties `h` with bucket layout `b` (borrowed for h's life). */
void prom_hist_init(struct prom_hist *h, const struct prom_buckets *b);
/* Counts `v` in the first bucket whose bound is >= v (Prometheus' `le`).
 * NaN is ignored; negative values count as 0 (durations measured on a
 * clock that may be adjusted by a hair). */
void prom_hist_observe(struct prom_hist *h, double v);

/* ------------------------------------------------------------------
 * Text exposition writer (format 0.0.4)
 */

struct prom_text {
    char *data; /* owned; NUL-terminated by prom_text_take */
    size_t len, cap;
    bool oom; /* an append failed: the text is incomplete */
};

struct prom_label {
    const char *name;  /* [a-zA-Z_][a-zA-Z0-9_]*, never "le" (written by _hist) */
    const char *value; /* any UTF-8; escaped when written; NULL = "" */
};

void prom_text_init(struct prom_text *t);
void prom_text_fini(struct prom_text *t);
/* Makes room for `n` more bytes (a size hint: appends grow the buffer by
 * themselves). false when out of memory (the text is then incomplete). */
bool prom_text_reserve(struct prom_text *t, size_t n);

/* "# HELP name help" (help escaped: backslash and newline) and
 * "# TYPE name type" (counter, gauge, histogram). Call once per family,
 * before its samples. */
void prom_text_family(struct prom_text *t, const char *name, const char *type, const char *help);
/* One sample line: name{labels} value. Values are written so that they
 * parse back to the same double ("+Inf", "-Inf", "NaN" for non-finite). */
void prom_text_sample(struct prom_text *t, const char *name, const struct prom_label *labels,
                      size_t n_labels, double v);
void prom_text_sample_u64(struct prom_text *t, const char *name, const struct prom_label *labels,
                          size_t n_labels, uint64_t v);
/* A histogram's series: name_bucket{labels,le="…"} cumulative up to
 * le="+Inf" (== count), name_sum, name_count. */
void prom_text_hist(struct prom_text *t, const char *name, const struct prom_label *labels,
                    size_t n_labels, const struct prom_hist *h);
/* Hands the text over: returns it (owned, NUL-terminated) with *len set,
 * or NULL when an append failed; `t` is empty afterwards either way. */
char *prom_text_take(struct prom_text *t, size_t *len);

#endif /* POLYGW_PROM_H */
