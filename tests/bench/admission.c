/*
 * admission.c — the cost of one governance decision (src/gov.c) with 1, 10
 * and 100 sources on one capability: a full admitted call cycle
 * (gov_call_init, gov_call_step -> ATTEMPT, gov_call_on_outcome(success),
 * gov_call_fini) on a fake clock, and the step alone when nothing is
 * runnable (the waiting path). Every source has an RPM and a TPM bucket,
 * a breaker and an AIMD limit, so each decision checks all of them.
 *
 *   build/bench/admission [--iterations N]
 *
 * Prints a Markdown table of ns per operation (best of 5 runs).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gov.h"

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double bench_rand(void *ud)
{
    unsigned long long *s = ud;
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*s >> 11) / 9007199254740992.0;
}

static char names[100][24]; /* source names outlive every gov */

static void setup(struct gov *g, size_t n, unsigned long long *seed, double now)
{
    struct gov_source_params *p = calloc(n, sizeof(*p));
    if (!p || n > 100)
        exit(2);
    for (size_t i = 0; i < n; i++) {
        snprintf(names[i], sizeof(names[i]), "s%zu", i);
        p[i] = (struct gov_source_params){
            .name = names[i],
            .capability = 0,
            .priority = (int32_t)(i % 3),
            .weight = 1 + (double)(i % 4),
            .max_concurrency = 1000000,
            .aimd_initial = 1000000,
            .aimd_min = 1,
            .aimd_increase = 1,
            .aimd_decrease = 0.5,
            .breaker_failures = 5,
            .breaker_cooldown_s = 30,
            .breaker_max_cooldown_s = 300,
            .rpm = 1000000000,
            .tpm = 1000000000000ULL,
        };
    }
    if (gov_init(g, p, n, 1, NULL, bench_rand, seed, NULL, now) < 0)
        exit(2);
    free(p);
}

static double cycle_ns(size_t n, long iters)
{
    struct gov g;
    unsigned long long seed = 42;
    struct gov_policy pol = { .max_attempts = 3,
                              .stall_window_s = 300,
                              .backoff_base_s = 2,
                              .backoff_max_s = 60,
                              .exempt_429 = true };
    struct outcome ok = {
        .kind = OUTCOME_SUCCESS, .reason = REASON_NONE, .http_status = 200, .retry_after_s = -1
    };
    double now = 1000.0;
    setup(&g, n, &seed, now);
    double t0 = mono();
    for (long i = 0; i < iters; i++) {
        struct gov_call k;
        struct gov_decision d;
        now += 1e-6;
        if (gov_call_init(&k, &g, 0, "chat", &pol, 0, 500, now) < 0)
            exit(2);
        gov_call_step(&k, now, &d);
        if (d.action != GOV_ATTEMPT)
            exit(3);
        gov_call_on_outcome(&k, now, &ok, 480, &d);
        gov_call_fini(&k, now);
    }
    double ns = (mono() - t0) / (double)iters * 1e9;
    gov_fini(&g);
    return ns;
}

/* A step that finds nothing runnable (every permit taken): the waiting path. */
static double blocked_ns(size_t n, long iters)
{
    struct gov g;
    unsigned long long seed = 7;
    struct gov_policy pol = { .max_attempts = 3,
                              .stall_window_s = 1e9,
                              .backoff_base_s = 2,
                              .backoff_max_s = 60,
                              .exempt_429 = true };
    double now = 1000.0;
    setup(&g, n, &seed, now);
    for (size_t i = 0; i < n; i++)
        g.sources[i].in_flight = 1000000; /* saturated */
    struct gov_call k;
    struct gov_decision d;
    if (gov_call_init(&k, &g, 0, "chat", &pol, 0, 500, now) < 0)
        exit(2);
    double t0 = mono();
    for (long i = 0; i < iters; i++) {
        now += 1e-6;
        gov_call_step(&k, now, &d);
    }
    double ns = (mono() - t0) / (double)iters * 1e9;
    if (d.action != GOV_WAIT)
        exit(3);
    gov_call_fini(&k, now);
    gov_fini(&g);
    return ns;
}

int main(int argc, char **argv)
{
    long iters = 200000;
    static const size_t sizes[] = { 1, 10, 100 };

    if (argc == 3 && strcmp(argv[1], "--iterations") == 0)
        iters = atol(argv[2]);
    if (iters < 1000 || iters > 100000000) {
        fprintf(stderr, "usage: admission [--iterations N (1000..1e8)]\n");
        return 2;
    }
    printf("| sources | admitted call cycle ns | of which per source ns | blocked step ns |\n");
    printf("|---:|---:|---:|---:|\n");
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t n = sizes[s];
        long it = n >= 100 ? iters / 10 : iters;
        double best = INFINITY, bestb = INFINITY;
        for (int r = 0; r < 5; r++) {
            best = fmin(best, cycle_ns(n, it));
            bestb = fmin(bestb, blocked_ns(n, it));
        }
        printf("| %zu | %.0f | %.1f | %.0f |\n", n, best, best / (double)n, bestb);
    }
    return 0;
}
