/*
 * metrics.h — the sidecar's Prometheus metrics: counters and fixed-bucket
 * histograms updated where events happen, gauges read from the live state
 * at render time, and a writer for the text exposition format 0.0.4.
 * Every family is listed, with its labels and meaning, in docs/METRICS.md.
 *
 * Hot path. Every label set is resolved to a slot when the registry is
 * built from the configuration (one slot per source, one per capability,
 * indexed like cfg->sources and cfg->capabilities), so an observation is an
 * array index and an add: no lookup, no allocation, no lock (the daemon is
 * single-threaded; all functions here run on the loop thread). A histogram
 * observation scans at most METRICS_HIST_MAX bounds.
 *
 * Rendering allocates one growing buffer and returns it; it is the only
 * part that allocates after metrics_new().
 */
#ifndef POLYGW_METRICS_H
#define POLYGW_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codes.h"
#include "config.h"

struct server;
struct attempt_result;

/* ------------------------------------------------------------------
 * Histograms
 */

#define METRICS_HIST_MAX 20

/* Upper bounds of a histogram's buckets (`le`), ascending and finite; the
 * +Inf bucket is implicit. Static tables, shared by every histogram of a
 * family. `le_text`, when given, is each bound as written (the shortest
 * form that reads back as the double; saves formatting every bucket of
 * every series at each rendering); NULL entries are formatted. */
struct metrics_buckets {
    size_t n;
    double le[METRICS_HIST_MAX];
    const char *le_text[METRICS_HIST_MAX];
};

/* 1 ms .. 600 s: call and attempt durations, TTFT, stall time. */
extern const struct metrics_buckets metrics_buckets_latency_s;
/* 100 µs .. 2.5 s: Redis round trips. */
extern const struct metrics_buckets metrics_buckets_rtt_s;

/* Counts are kept per bucket (not cumulative; bucket[b->n] is above the
 * last bound) and made cumulative when written. */
struct metrics_hist {
    const struct metrics_buckets *b; /* borrowed, static */
    uint64_t bucket[METRICS_HIST_MAX + 1];
    uint64_t count;
    double sum;
};

/* Empties `h` with bucket layout `b` (borrowed for h's life). */
void metrics_hist_init(struct metrics_hist *h, const struct metrics_buckets *b);
/* Counts `v` in the first bucket whose bound is >= v (Prometheus' `le`).
 * NaN is ignored; negative values count as 0 (durations measured on a
 * clock that may be adjusted by a hair). */
void metrics_hist_observe(struct metrics_hist *h, double v);

/* ------------------------------------------------------------------
 * Text exposition writer (format 0.0.4)
 */

struct metrics_text {
    char *data;          /* owned; NUL-terminated by metrics_text_take */
    size_t len, cap;
    bool oom;            /* an append failed: the text is incomplete */
};

struct metrics_label {
    const char *name;    /* [a-zA-Z_][a-zA-Z0-9_]*, never "le" (written by _hist) */
    const char *value;   /* any UTF-8; escaped when written; NULL = "" */
};

void metrics_text_init(struct metrics_text *t);
void metrics_text_fini(struct metrics_text *t);

/* "# HELP name help" (help escaped: backslash and newline) and
 * "# TYPE name type" (counter, gauge, histogram). Call once per family,
 * before its samples. */
void metrics_text_family(struct metrics_text *t, const char *name, const char *type,
                         const char *help);
/* One sample line: name{labels} value. Values are written so that they
 * parse back to the same double ("+Inf", "-Inf", "NaN" for non-finite). */
void metrics_text_sample(struct metrics_text *t, const char *name,
                         const struct metrics_label *labels, size_t n_labels, double v);
void metrics_text_sample_u64(struct metrics_text *t, const char *name,
                             const struct metrics_label *labels, size_t n_labels, uint64_t v);
/* A histogram's series: name_bucket{labels,le="…"} cumulative up to
 * le="+Inf" (== count), name_sum, name_count. */
void metrics_text_hist(struct metrics_text *t, const char *name,
                       const struct metrics_label *labels, size_t n_labels,
                       const struct metrics_hist *h);
/* Hands the text over: returns it (owned, NUL-terminated) with *len set,
 * or NULL when an append failed; `t` is empty afterwards either way. */
char *metrics_text_take(struct metrics_text *t, size_t *len);

/* ------------------------------------------------------------------
 * The registry
 */

struct metrics;

/* A registry with one slot per source and capability of `cfg` (borrowed:
 * it must outlive the registry). NULL when out of memory. */
struct metrics *metrics_new(const struct config *cfg);
void metrics_free(struct metrics *m);

/* An attempt on source `source` ended with `r` (its outcome, duration and
 * time to first byte or event). */
void metrics_on_attempt(struct metrics *m, size_t source, const struct attempt_result *r);
/* An attempt on `source` was torn down before it ended (cancel, task stop,
 * client gone, shutdown). */
void metrics_on_attempt_cancelled(struct metrics *m, size_t source);

/* A call of capability `cap` entered the governed loop / ended with `code`
 * after `duration_s`, of which `stalled_s` charged to the stall budget. A
 * call refused before entering the loop (its task is not running) is only
 * ended, with duration 0. */
void metrics_on_call_start(struct metrics *m, size_t cap);
void metrics_on_call_end(struct metrics *m, size_t cap, enum pgw_code code, double duration_s,
                         double stalled_s);
void metrics_on_call_refused(struct metrics *m, size_t cap, enum pgw_code code);
/* A streaming call relayed its first event `ttft_s` after it arrived. */
void metrics_on_call_first_event(struct metrics *m, size_t cap, double ttft_s);

/* The Prometheus text exposition of everything `srv` (borrowed) holds:
 * the registry's counters and histograms plus gauges read now from the
 * governance core, the task registry, the upstream engine, the connection
 * layer and (with the Redis backend) the Redis adapter. Returns an owned,
 * NUL-terminated string with *len set to its length (without the NUL), or
 * NULL when out of memory. Never blocks. Any front end may call it. */
char *metrics_render(struct server *srv, size_t *len);

#endif /* POLYGW_METRICS_H */
