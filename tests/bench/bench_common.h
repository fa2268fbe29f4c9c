/*
 * bench_common.h — the clock, option parsing and report helpers shared by
 * the bench programs (loadgen.c, curlgen.c, echo_server.c), so that the
 * generators accept the same common options with the same bounds and print
 * the shared report fields in the same format.
 *
 * Header-only (static inline) because the Makefile builds every
 * tests/bench/NAME.c into its own program.
 */
#ifndef POLYGW_BENCH_COMMON_H
#define POLYGW_BENCH_COMMON_H

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_hist.h"

/* ---------------------------------------------------------------- clock */

static inline uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t mono_ns(void)
{
    return clock_ns(CLOCK_MONOTONIC);
}

/* ------------------------------------------------------------- options */

/* Decimal in [lo, hi], no sign, nothing after it. 0, or -1 (out untouched). */
static inline int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!s || *s == '-' || *s == '\0')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* A finite number in [lo, hi], nothing after it. 0, or -1 (out untouched). */
static inline int parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    if (!s || *s == '\0')
        return -1;
    double v = strtod(s, &end);
    if (errno || *end || !(v >= lo && v <= hi))
        return -1;
    *out = v;
    return 0;
}

/* The options every load generator takes, with their defaults set by
 * bench_opts_init. */
struct bench_opts {
    unsigned clients;
    uint64_t total; /* 0: unlimited (duration bounds the run) */
    double duration_s;
    uint64_t warmup;
    uint64_t timeout_ms;
    bool json;
    bool have_duration;
};

static inline void bench_opts_init(struct bench_opts *b)
{
    *b = (struct bench_opts){ .clients = 1, .timeout_ms = 10000 };
}

enum { BENCH_OPT_TAKEN, BENCH_OPT_OWN, BENCH_OPT_HELP, BENCH_OPT_BAD };

/* Looks at argv[*i]. A common option is parsed into `b` (*i moves past its
 * value): BENCH_OPT_TAKEN. -h/--help: BENCH_OPT_HELP. A bad or missing
 * value, reported on stderr: BENCH_OPT_BAD. Anything else is the program's
 * own option and has a value at argv[*i + 1]: BENCH_OPT_OWN. */
static inline int bench_opts_parse(struct bench_opts *b, const char *prog, int argc, char **argv,
                                   int *i, unsigned max_clients, unsigned hard_cap_s)
{
    const char *a = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    uint64_t u = 0;
    int bad;

    if (!strcmp(a, "-h") || !strcmp(a, "--help"))
        return BENCH_OPT_HELP;
    if (!strcmp(a, "--json")) {
        b->json = true;
        return BENCH_OPT_TAKEN;
    }
    if (!v) {
        bad = -1;
    } else if (!strcmp(a, "--clients")) {
        bad = parse_u64(v, 1, max_clients, &u);
        b->clients = (unsigned)u;
    } else if (!strcmp(a, "--requests")) {
        bad = parse_u64(v, 1, UINT64_C(1) << 40, &b->total);
    } else if (!strcmp(a, "--warmup")) {
        bad = parse_u64(v, 0, UINT64_C(1) << 32, &b->warmup);
    } else if (!strcmp(a, "--timeout-ms")) {
        bad = parse_u64(v, 1, UINT64_C(1000) * hard_cap_s, &b->timeout_ms);
    } else if (!strcmp(a, "--duration")) {
        bad = parse_double(v, 0.001, 1e9, &b->duration_s);
        b->have_duration = true;
    } else {
        return BENCH_OPT_OWN;
    }
    if (bad) {
        fprintf(stderr, "%s: bad or missing value for %s\n", prog, a);
        return BENCH_OPT_BAD;
    }
    (*i)++;
    return BENCH_OPT_TAKEN;
}

/* After parsing: the default duration (the hard cap when --requests bounds
 * the run) and the cap itself, with a note on stderr when it bit. */
static inline void bench_opts_finish(struct bench_opts *b, const char *prog, double default_s,
                                     unsigned hard_cap_s)
{
    if (!b->have_duration)
        b->duration_s = b->total ? hard_cap_s : default_s;
    if (b->duration_s > hard_cap_s) {
        fprintf(stderr, "%s: --duration capped at %u s\n", prog, hard_cap_s);
        b->duration_s = hard_cap_s;
    }
}

/* ------------------------------------------------------------ hard cap */

static const char *bench_alarm_msg;

static inline void bench_on_alarm(int sig)
{
    (void)sig;
    ssize_t w = write(STDERR_FILENO, bench_alarm_msg, strlen(bench_alarm_msg));
    (void)w;
    _exit(3);
}

/* Ignores SIGPIPE and ends the process with status 3, whatever state it is
 * in (a wedged peer during warmup or drain), once it has lived
 * duration + timeout + 30 s. `msg` is static storage: it is written from
 * the signal handler. */
static inline void bench_arm_hard_cap(const char *msg, double duration_s, uint64_t timeout_ms)
{
    bench_alarm_msg = msg;
    signal(SIGPIPE, SIG_IGN);
    signal(SIGALRM, bench_on_alarm);
    alarm((unsigned)ceil(duration_s) + (unsigned)(timeout_ms / 1000) + 30u);
}

/* ------------------------------------------------------------- msgpack */

/* The smallest msgpack encoding of an unsigned msgid, as any packer emits
 * it. Writes at most 5 bytes; returns how many. */
static inline size_t pack_msgid(unsigned char *p, uint32_t id)
{
    if (id < 0x80) {
        p[0] = (unsigned char)id;
        return 1;
    }
    if (id <= 0xff) {
        p[0] = 0xcc;
        p[1] = (unsigned char)id;
        return 2;
    }
    if (id <= 0xffff) {
        p[0] = 0xcd;
        p[1] = (unsigned char)(id >> 8);
        p[2] = (unsigned char)id;
        return 3;
    }
    p[0] = 0xce;
    p[1] = (unsigned char)(id >> 24);
    p[2] = (unsigned char)(id >> 16);
    p[3] = (unsigned char)(id >> 8);
    p[4] = (unsigned char)id;
    return 5;
}

/* ------------------------------------------------------ output buffer */

/* Makes room for n more bytes after out[len], the unsent bytes being
 * out[off..len): drops what was sent, compacts, then grows by doubling
 * (from 4 KiB). 0, or -1 when out of memory (the buffer is unchanged). */
static inline int bench_out_reserve(char **out, size_t *len, size_t *off, size_t *cap, size_t n)
{
    if (*off > 0 && *off == *len)
        *off = *len = 0;
    if (*len + n <= *cap)
        return 0;
    if (*off > 0) {
        memmove(*out, *out + *off, *len - *off);
        *len -= *off;
        *off = 0;
        if (*len + n <= *cap)
            return 0;
    }
    size_t sz = *cap ? *cap : 4096;
    while (sz < *len + n)
        sz *= 2;
    char *p = realloc(*out, sz);
    if (!p)
        return -1;
    *out = p;
    *cap = sz;
    return 0;
}

/* -------------------------------------------------------------- report */

/* `s` as a JSON string literal (control bytes escaped, UTF-8 passed). */
static inline void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static inline double bench_mean_us(const struct bench_hist *h)
{
    return h->n ? h->sum_ns / (double)h->n / 1e3 : 0.0;
}

/* The latency, throughput and response-size keys of a JSON report, each
 * preceded by a comma. */
static inline void bench_report_json_perf(FILE *f, const struct bench_hist *h, uint64_t ok,
                                          uint64_t resp_bytes, double elapsed_s, double cpu_pct)
{
    fprintf(f, ",\"rps\":%.1f", elapsed_s > 0 ? (double)ok / elapsed_s : 0.0);
    fprintf(f,
            ",\"min_us\":%.2f,\"mean_us\":%.2f,\"p50_us\":%.2f,\"p90_us\":%.2f,\"p99_us\":%.2f"
            ",\"p999_us\":%.2f,\"max_us\":%.2f",
            (double)h->min_ns / 1e3, bench_mean_us(h), hist_percentile(h, 50) / 1e3,
            hist_percentile(h, 90) / 1e3, hist_percentile(h, 99) / 1e3,
            hist_percentile(h, 99.9) / 1e3, (double)h->max_ns / 1e3);
    fprintf(f, ",\"resp_bytes_avg\":%.1f", ok ? (double)resp_bytes / (double)ok : 0.0);
    fprintf(f, ",\"cpu_pct\":%.1f", cpu_pct);
}

/* Time to the first streamed byte (curlgen: the first body byte of an SSE
 * answer; loadgen: a call's first `chunk` notification), when any was
 * measured: ttft_n, ttft_p50_us, ttft_p99_us. */
static inline void bench_report_json_ttft(FILE *f, const struct bench_hist *h)
{
    fprintf(f, ",\"ttft_n\":%" PRIu64 ",\"ttft_p50_us\":%.2f,\"ttft_p99_us\":%.2f", h->n,
            hist_percentile(h, 50) / 1e3, hist_percentile(h, 99) / 1e3);
}

static inline void bench_report_text_ttft(FILE *f, const struct bench_hist *h)
{
    if (h->n > 0)
        fprintf(f, "  ttft µs    p50 %.1f  p99 %.1f  (%" PRIu64 " streams)\n",
                hist_percentile(h, 50) / 1e3, hist_percentile(h, 99) / 1e3, h->n);
}

/* The elapsed, throughput and latency lines of a text report. */
static inline void bench_report_text_perf(FILE *f, const struct bench_hist *h, uint64_t ok,
                                          double elapsed_s)
{
    fprintf(f, "  elapsed    %.3f s\n", elapsed_s);
    fprintf(f, "  throughput %.1f req/s\n", elapsed_s > 0 ? (double)ok / elapsed_s : 0.0);
    fprintf(
        f, "  latency µs min %.1f  mean %.1f  p50 %.1f  p90 %.1f  p99 %.1f  p99.9 %.1f  max %.1f\n",
        (double)h->min_ns / 1e3, bench_mean_us(h), hist_percentile(h, 50) / 1e3,
        hist_percentile(h, 90) / 1e3, hist_percentile(h, 99) / 1e3, hist_percentile(h, 99.9) / 1e3,
        (double)h->max_ns / 1e3);
}

#endif
