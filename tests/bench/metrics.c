/*
 * metrics.c — the cost of the sidecar's metrics (sidecar/metrics/metrics.c): one
 * attempt observation (outcome counters, duration and TTFT histograms), one
 * call start + end (counters, duration and stall histograms), and one whole
 * rendering of the text exposition, for 4 and 100 sources. The server is a
 * real one (server_init on a temporary socket, nothing connected), so the
 * rendering reads the same live state as `polygwctl metrics` does.
 *
 *   build/bench/metrics [--iterations N]
 *
 * Prints a Markdown table (best of 5 runs).
 */
#include <ev.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "rpc/conn.h"
#include "metrics/metrics.h"
#include "upstream/upstream.h"

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct bench {
    struct ev_loop *loop;
    struct config *cfg;
    struct server srv;
    char dir[32];
};

/* `n` sources, alternately chat and embedding, each with an RPM bucket. */
static void setup(struct bench *b, size_t n)
{
    size_t cap = 128 + n * 160, off;
    char *yaml = malloc(cap), err[512];

    if (!yaml)
        exit(2);
    off = (size_t)snprintf(yaml, cap, "server: { log_level: error }\nsources:\n");
    for (size_t i = 0; i < n; i++)
        off += (size_t)snprintf(yaml + off, cap - off,
                                "  - { name: source-%zu, capability: %s, base_url: "
                                "\"http://127.0.0.1:1/v1\", limits: { rpm: 600 } }\n",
                                i, i % 2 ? "embedding" : "chat");
    b->cfg = config_parse(yaml, off, "bench.yaml", err, sizeof(err));
    free(yaml);
    snprintf(b->dir, sizeof(b->dir), "/tmp/pgwbmXXXXXX");
    if (!b->cfg || !mkdtemp(b->dir)) {
        fprintf(stderr, "metrics bench: %s\n", b->cfg ? "mkdtemp failed" : err);
        exit(2);
    }
    free(b->cfg->socket_path);
    if (asprintf(&b->cfg->socket_path, "%s/s.sock", b->dir) < 0)
        exit(2);
    b->loop = ev_loop_new(EVFLAG_AUTO);
    if (server_init(&b->srv, b->loop, b->cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "metrics bench: %s\n", err);
        exit(2);
    }
}

static void teardown(struct bench *b)
{
    server_fini(&b->srv);
    ev_loop_destroy(b->loop);
    config_free(b->cfg);
    rmdir(b->dir);
}

static double attempt_ns(struct bench *b, size_t n, long iters)
{
    struct attempt_result r = { .outcome = { .kind = OUTCOME_SUCCESS }, .ttft_s = 0.02 };
    double t0 = mono();
    for (long i = 0; i < iters; i++) {
        r.elapsed_s = (double)(i & 1023) * 0.001; /* spread over the buckets */
        metrics_on_attempt(b->srv.metrics, (size_t)i % n, &r);
    }
    return (mono() - t0) / (double)iters * 1e9;
}

static double call_ns(struct bench *b, long iters)
{
    double t0 = mono();
    for (long i = 0; i < iters; i++) {
        metrics_on_call_start(b->srv.metrics, 0);
        metrics_on_call_end(b->srv.metrics, 0, PGW_OK, (double)(i & 1023) * 0.001, 0);
    }
    return (mono() - t0) / (double)iters * 1e9;
}

static double render_us(struct bench *b, int reps, size_t *len)
{
    double t0 = mono();
    for (int i = 0; i < reps; i++) {
        char *s = metrics_render(&b->srv, len);
        if (!s)
            exit(3);
        free(s);
    }
    return (mono() - t0) / reps * 1e6;
}

int main(int argc, char **argv)
{
    long iters = 2000000;
    static const size_t sizes[] = { 4, 100 };

    if (argc == 3 && strcmp(argv[1], "--iterations") == 0)
        iters = atol(argv[2]);
    if (iters < 1000 || iters > 1000000000) {
        fprintf(stderr, "usage: metrics [--iterations N (1000..1e9)]\n");
        return 2;
    }
    printf("| sources | attempt observed ns | call start + end ns | rendering µs | text bytes |\n");
    printf("|---:|---:|---:|---:|---:|\n");
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        struct bench b;
        double att = INFINITY, cal = INFINITY, ren = INFINITY;
        size_t len = 0;
        setup(&b, sizes[s]);
        for (int r = 0; r < 5; r++) {
            att = fmin(att, attempt_ns(&b, sizes[s], iters));
            cal = fmin(cal, call_ns(&b, iters));
            ren = fmin(ren, render_us(&b, sizes[s] >= 100 ? 20 : 200, &len));
        }
        printf("| %zu | %.1f | %.1f | %.0f | %zu |\n", sizes[s], att, cal, ren, len);
        teardown(&b);
    }
    return 0;
}
