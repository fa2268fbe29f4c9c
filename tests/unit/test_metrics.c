/*
 * test_metrics.c — the Prometheus exposition writer and the registry
 * (sidecar/metrics.c).
 *
 * The writer is checked line by line (escaping, value formatting,
 * histogram series), and a whole rendering of a real server (server_init
 * on a temporary socket, no client, no upstream) is run through
 * check_exposition(), a strict reader of text format 0.0.4: every sample
 * belongs to the family whose HELP and TYPE came just before it, label
 * values are well escaped, values parse, and every histogram's buckets are
 * cumulative, end in +Inf and agree with _count.
 */
#include <ctype.h>
#include <ev.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "internal.h"
#include "metrics.h"
#include "suites.h"
#include "upstream.h"

/* The writer's text (owned), checked to be as long as it says. */
static char *take(struct metrics_text *t)
{
    size_t len;
    char *s = metrics_text_take(t, &len);
    ck_assert_ptr_nonnull(s);
    ck_assert_uint_eq(strlen(s), len);
    return s;
}

static void assert_has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; (p = strstr(p, line)) != NULL; p++) {
        if ((p == text || p[-1] == '\n') && p[n] == '\n')
            return;
    }
    ck_abort_msg("no line '%s' in:\n%s", line, text);
}

/* ------------------------------------------------------------------
 * A strict reader of the text format, for whole renderings.
 */

static bool is_name(const char *s, size_t n)
{
    if (n == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_' || s[0] == ':'))
        return false;
    for (size_t i = 1; i < n; i++) {
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == ':'))
            return false;
    }
    return true;
}

static bool parse_value(const char *s, double *v)
{
    char *end;
    if (strcmp(s, "+Inf") == 0 || strcmp(s, "-Inf") == 0 || strcmp(s, "NaN") == 0) {
        *v = strcmp(s, "NaN") == 0 ? NAN : s[0] == '+' ? INFINITY : -INFINITY;
        return true;
    }
    *v = strtod(s, &end);
    return end != s && *end == '\0';
}

struct hist_state {
    char series[512];   /* the labels without le, of the buckets being read */
    double last_cum;
    bool saw_inf;
    double inf;
};

/* Checks `text`; returns the number of samples. */
static size_t check_exposition(const char *text)
{
    char family[128] = "", type[16] = "";
    size_t seen_cap = 1 << 20;
    char *seen = calloc(1, seen_cap); /* " name name ... " */
    ck_assert_ptr_nonnull(seen);
    struct hist_state h = {0};
    size_t samples = 0;
    bool expect_type = false;

    ck_assert_msg(text[0] && text[strlen(text) - 1] == '\n', "must end with a newline");
    for (const char *line = text; *line;) {
        const char *eol = strchr(line, '\n');
        char buf[2048];
        size_t n = (size_t)(eol - line);
        ck_assert_uint_lt(n, sizeof(buf));
        memcpy(buf, line, n);
        buf[n] = '\0';
        line = eol + 1;

        if (strncmp(buf, "# HELP ", 7) == 0) {
            const char *name = buf + 7, *sp = strchr(name, ' ');
            ck_assert_msg(sp && is_name(name, (size_t)(sp - name)), "bad HELP: %s", buf);
            ck_assert_msg(!expect_type, "HELP without TYPE before: %s", buf);
            snprintf(family, sizeof(family), "%.*s", (int)(sp - name), name);
            char key[140];
            snprintf(key, sizeof(key), " %s ", family);
            ck_assert_msg(strstr(seen, key) == NULL, "family %s declared twice", family);
            if (!seen[0])
                seen[0] = ' ';
            ck_assert_uint_lt(strlen(seen) + strlen(key), seen_cap);
            strcat(seen, key + 1);
            for (const char *p = sp + 1; *p; p++) /* only \\ and \n escapes in HELP */
                if (*p == '\\') {
                    ck_assert_msg(p[1] == '\\' || p[1] == 'n', "bad escape in HELP: %s", buf);
                    p++;
                }
            expect_type = true;
            continue;
        }
        if (strncmp(buf, "# TYPE ", 7) == 0) {
            char name[128];
            ck_assert_msg(expect_type, "TYPE without HELP: %s", buf);
            ck_assert_int_eq(sscanf(buf + 7, "%127s %15s", name, type), 2);
            ck_assert_str_eq(name, family);
            ck_assert_msg(strcmp(type, "counter") == 0 || strcmp(type, "gauge") == 0 ||
                              strcmp(type, "histogram") == 0,
                          "type %s", type);
            if (strcmp(type, "counter") == 0)
                ck_assert_msg(strlen(family) > 6 && strcmp(family + strlen(family) - 6, "_total") == 0,
                              "counter %s without _total", family);
            expect_type = false;
            h = (struct hist_state){0};
            continue;
        }
        ck_assert_msg(buf[0] != '#', "unexpected comment: %s", buf);
        ck_assert_msg(!expect_type && family[0], "sample outside a family: %s", buf);

        /* name{labels} value */
        char *p = buf;
        while (*p && *p != '{' && *p != ' ')
            p++;
        char name[160];
        snprintf(name, sizeof(name), "%.*s", (int)(p - buf), buf);
        ck_assert_msg(is_name(name, strlen(name)), "bad name: %s", buf);
        char labels[512] = "", le[256] = "";
        if (*p == '{') {
            p++;
            while (*p != '}') {
                char *start = p, *eq = strchr(p, '=');
                ck_assert_msg(eq && eq[1] == '"', "bad label in: %s", buf);
                ck_assert_msg(is_name(start, (size_t)(eq - start)), "bad label name: %s", buf);
                bool is_le = eq - start == 2 && strncmp(start, "le", 2) == 0;
                char value[256];
                size_t vn = 0;
                for (p = eq + 2; *p != '"'; p++) {
                    ck_assert_msg(*p, "unterminated label value: %s", buf);
                    if (*p == '\\') {
                        p++;
                        ck_assert_msg(*p == '\\' || *p == '"' || *p == 'n', "bad escape: %s", buf);
                    }
                    ck_assert_uint_lt(vn, sizeof(value) - 1);
                    value[vn++] = *p;
                }
                value[vn] = '\0';
                if (is_le) {
                    snprintf(le, sizeof(le), "%s", value);
                } else {
                    size_t at = strlen(labels);
                    snprintf(labels + at, sizeof(labels) - at, "%.*s=%s,", (int)(eq - start),
                             start, value);
                }
                p++;
                ck_assert_msg(*p == ',' || *p == '}', "bad label list: %s", buf);
                if (*p == ',')
                    p++;
            }
            p++;
        }
        ck_assert_msg(*p == ' ', "no value: %s", buf);
        double v;
        ck_assert_msg(parse_value(p + 1, &v), "bad value: %s", buf);
        samples++;

        if (strcmp(type, "histogram") != 0) {
            ck_assert_str_eq(name, family);
            continue;
        }
        size_t fl = strlen(family);
        ck_assert_msg(strncmp(name, family, fl) == 0, "%s outside %s", name, family);
        const char *suffix = name + fl;
        if (strcmp(suffix, "_bucket") == 0) {
            double bound;
            ck_assert_msg(le[0] && parse_value(le, &bound), "bucket without le: %s", buf);
            if (strcmp(h.series, labels) != 0 || h.saw_inf) {
                ck_assert_msg(!h.series[0] || h.saw_inf, "series ended before +Inf: %s", buf);
                snprintf(h.series, sizeof(h.series), "%s", labels);
                h.last_cum = 0;
                h.saw_inf = false;
            }
            ck_assert_msg(v >= h.last_cum, "buckets not cumulative: %s", buf);
            h.last_cum = v;
            if (isinf(bound)) {
                h.saw_inf = true;
                h.inf = v;
            }
        } else if (strcmp(suffix, "_count") == 0) {
            ck_assert_msg(h.saw_inf && strcmp(h.series, labels) == 0, "_count before +Inf: %s",
                          buf);
            ck_assert_msg(v == h.inf, "+Inf bucket %g != _count %g: %s", h.inf, v, buf);
        } else {
            ck_assert_msg(strcmp(suffix, "_sum") == 0, "unexpected histogram series %s", name);
        }
    }
    ck_assert_msg(!expect_type, "HELP without TYPE at the end");
    free(seen);
    return samples;
}

/* ------------------------------------------------------------------ */

START_TEST(test_metrics__hist_buckets_cumulative)
{
    static const struct metrics_buckets b = {.n = 3, .le = {0.1, 1, 10}};
    struct metrics_hist h;
    struct metrics_text t;
    const double obs[] = {0.05, 0.1, 0.5, 0.7, 2, 100, 1e9};

    metrics_hist_init(&h, &b);
    for (size_t i = 0; i < sizeof(obs) / sizeof(obs[0]); i++)
        metrics_hist_observe(&h, obs[i]);
    metrics_text_init(&t);
    metrics_text_family(&t, "x_seconds", "histogram", "h");
    metrics_text_hist(&t, "x_seconds", NULL, 0, &h);
    char *s = take(&t);
    /* A bound is inclusive (le): 0.1 falls in the first bucket. */
    assert_has_line(s, "x_seconds_bucket{le=\"0.1\"} 2");
    assert_has_line(s, "x_seconds_bucket{le=\"1\"} 4");
    assert_has_line(s, "x_seconds_bucket{le=\"10\"} 5");
    assert_has_line(s, "x_seconds_bucket{le=\"+Inf\"} 7");
    assert_has_line(s, "x_seconds_count 7");
    double sum = 0;
    for (size_t i = 0; i < sizeof(obs) / sizeof(obs[0]); i++)
        sum += obs[i];
    const char *at = strstr(s, "\nx_seconds_sum ");
    ck_assert_ptr_nonnull(at);
    ck_assert_msg(strtod(at + 15, NULL) == sum, "sum %.17g in:\n%s", sum, s);
    check_exposition(s);
    free(s);
}
END_TEST

START_TEST(test_metrics__hist_ignores_nan_clamps_negative)
{
    struct metrics_hist h;

    metrics_hist_init(&h, &metrics_buckets_latency_s);
    metrics_hist_observe(&h, NAN);
    ck_assert_uint_eq(h.count, 0);
    metrics_hist_observe(&h, -0.5);
    metrics_hist_observe(&h, INFINITY);
    ck_assert_uint_eq(h.count, 2);
    ck_assert_uint_eq(h.bucket[0], 1);                            /* -0.5 counted as 0 */
    ck_assert_uint_eq(h.bucket[metrics_buckets_latency_s.n], 1); /* +Inf only */
}
END_TEST

START_TEST(test_metrics__hist_labels_and_le)
{
    static const struct metrics_buckets b = {.n = 2, .le = {0.0025, 600}};
    struct metrics_hist h;
    struct metrics_text t;
    const struct metrics_label l[] = {{"source", "a"}, {"capability", "chat"}};

    metrics_hist_init(&h, &b);
    metrics_hist_observe(&h, 0.001);
    metrics_text_init(&t);
    metrics_text_hist(&t, "y", l, 2, &h);
    char *s = take(&t);
    assert_has_line(s, "y_bucket{source=\"a\",capability=\"chat\",le=\"0.0025\"} 1");
    assert_has_line(s, "y_bucket{source=\"a\",capability=\"chat\",le=\"600\"} 1");
    assert_has_line(s, "y_bucket{source=\"a\",capability=\"chat\",le=\"+Inf\"} 1");
    assert_has_line(s, "y_sum{source=\"a\",capability=\"chat\"} 0.001");
    assert_has_line(s, "y_count{source=\"a\",capability=\"chat\"} 1");
    free(s);
}
END_TEST

/* The layouts' bound texts are the bounds, written as the writer would. */
START_TEST(test_metrics__bucket_texts_match_bounds)
{
    const struct metrics_buckets *layouts[] = {&metrics_buckets_latency_s, &metrics_buckets_rtt_s};

    for (size_t k = 0; k < 2; k++) {
        struct metrics_buckets bare = *layouts[k];
        struct metrics_hist a, b;
        struct metrics_text t;

        ck_assert_uint_le(bare.n, METRICS_HIST_MAX);
        for (size_t i = 0; i < bare.n; i++) {
            ck_assert_ptr_nonnull(bare.le_text[i]);
            ck_assert_msg(strtod(bare.le_text[i], NULL) == bare.le[i], "%s", bare.le_text[i]);
            ck_assert(i == 0 || bare.le[i - 1] < bare.le[i]);
            bare.le_text[i] = NULL;
        }
        metrics_hist_init(&a, layouts[k]);
        metrics_hist_init(&b, &bare);
        metrics_text_init(&t);
        metrics_text_hist(&t, "h", NULL, 0, &a);
        char *with = take(&t);
        metrics_text_hist(&t, "h", NULL, 0, &b);
        char *without = take(&t);
        ck_assert_str_eq(with, without);
        free(with);
        free(without);
    }
}
END_TEST

START_TEST(test_metrics__label_values_escaped)
{
    struct metrics_text t;
    const struct metrics_label l[] = {{"a", "back\\slash"}, {"b", "say \"hi\""},
                                      {"c", "two\nlines"}, {"d", NULL}, {"e", "ünï"}};

    metrics_text_init(&t);
    metrics_text_family(&t, "z_total", "counter", "With \\ and\na newline; \"quotes\" stay.");
    metrics_text_sample_u64(&t, "z_total", l, 5, 3);
    char *s = take(&t);
    assert_has_line(s, "# HELP z_total With \\\\ and\\na newline; \"quotes\" stay.");
    assert_has_line(s, "# TYPE z_total counter");
    assert_has_line(s, "z_total{a=\"back\\\\slash\",b=\"say \\\"hi\\\"\",c=\"two\\nlines\",d=\"\","
                       "e=\"ünï\"} 3");
    ck_assert_uint_eq(check_exposition(s), 1);
    free(s);
}
END_TEST

START_TEST(test_metrics__values_read_back_exactly)
{
    const double v[] = {0, 1, -2.5, 0.1, 1.0 / 3, 1e-300, 123456789.125, 9007199254740993.0,
                        INFINITY, -INFINITY};
    struct metrics_text t;

    metrics_text_init(&t);
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        metrics_text_sample(&t, "v", NULL, 0, v[i]);
    metrics_text_sample(&t, "v", NULL, 0, NAN);
    metrics_text_sample_u64(&t, "v", NULL, 0, UINT64_MAX);
    char *s = take(&t);
    const char *p = s;
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        ck_assert(strncmp(p, "v ", 2) == 0);
        char *end;
        double back = strncmp(p + 2, "+Inf", 4) == 0   ? INFINITY
                      : strncmp(p + 2, "-Inf", 4) == 0 ? -INFINITY
                                                       : strtod(p + 2, &end);
        ck_assert_msg(back == v[i], "%.17g written as %.*s", v[i], (int)(strchr(p, '\n') - p), p);
        p = strchr(p, '\n') + 1;
    }
    assert_has_line(s, "v 0.1");      /* the short form when it reads back */
    assert_has_line(s, "v +Inf");
    assert_has_line(s, "v NaN");
    assert_has_line(s, "v 18446744073709551615");
    free(s);
}
END_TEST

START_TEST(test_metrics__take_empty_and_reuse)
{
    struct metrics_text t;
    size_t len = 99;

    metrics_text_init(&t);
    char *s = metrics_text_take(&t, &len);
    ck_assert_ptr_nonnull(s);
    ck_assert_str_eq(s, "");
    ck_assert_uint_eq(len, 0);
    free(s);
    metrics_text_sample_u64(&t, "after_take", NULL, 0, 1); /* `t` is empty, usable */
    s = take(&t);
    ck_assert_str_eq(s, "after_take 1\n");
    free(s);
    metrics_text_sample_u64(&t, "x", NULL, 0, 1);
    metrics_text_fini(&t);
}
END_TEST

START_TEST(test_metrics__large_text_grows)
{
    struct metrics_text t;
    char name[32];

    metrics_text_init(&t);
    for (int i = 0; i < 5000; i++) {
        snprintf(name, sizeof(name), "family_%d_total", i);
        metrics_text_family(&t, name, "counter", "many families, to grow the buffer");
        metrics_text_sample_u64(&t, name, NULL, 0, (uint64_t)i);
    }
    char *s = take(&t);
    ck_assert_uint_eq(check_exposition(s), 5000);
    assert_has_line(s, "family_4999_total 4999");
    free(s);
}
END_TEST

/* ------------------------------------------------------------------
 * The registry, rendered from a real server.
 */

static const char server_yaml[] =
    "server: { log_level: error }\n"
    "sources:\n"
    "  - { name: a, capability: chat, base_url: \"http://127.0.0.1:1/v1\",\n"
    "      limits: { rpm: 60 } }\n"
    "  - { name: b, capability: chat, base_url: \"http://127.0.0.1:1/v1\" }\n"
    "  - { name: e, capability: embedding, base_url: \"http://127.0.0.1:1/v1\" }\n";

struct fixture {
    struct ev_loop *loop;
    struct config *cfg;
    struct server srv;
    char dir[64];
};

static void fixture_start(struct fixture *f)
{
    char err[512];

    snprintf(f->dir, sizeof(f->dir), "/tmp/pgwmXXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(f->dir));
    f->cfg = config_parse(server_yaml, strlen(server_yaml), "t.yaml", err, sizeof(err));
    ck_assert_msg(f->cfg != NULL, "%s", err);
    free(f->cfg->socket_path);
    ck_assert_int_ge(asprintf(&f->cfg->socket_path, "%s/s.sock", f->dir), 0);
    f->loop = ev_loop_new(EVFLAG_AUTO);
    ck_assert_msg(server_init(&f->srv, f->loop, f->cfg, err, sizeof(err)) == 0, "%s", err);
}

static void fixture_stop(struct fixture *f)
{
    server_fini(&f->srv);
    ev_loop_destroy(f->loop);
    config_free(f->cfg);
    rmdir(f->dir);
}

static char *render(struct server *srv)
{
    size_t len;
    char *s = metrics_render(srv, &len);
    ck_assert_ptr_nonnull(s);
    ck_assert_uint_eq(strlen(s), len);
    return s;
}

START_TEST(test_metrics__fresh_server_renders_every_family)
{
    struct fixture f;

    fixture_start(&f);
    char *s = render(&f.srv);
    check_exposition(s);
    static const char *const families[] = {
        "polygw_upstream_attempts_total", "polygw_source_in_flight", "polygw_source_aimd_limit",
        "polygw_source_concurrency_limit", "polygw_source_breaker_state",
        "polygw_source_bucket_level", "polygw_calls_waiting", "polygw_calls_total",
        "polygw_call_duration_seconds", "polygw_call_ttft_seconds", "polygw_call_stalled_seconds",
        "polygw_upstream_ttft_seconds", "polygw_tasks", "polygw_task_watchdog_firings_total",
        "polygw_tasks_stopped_total", "polygw_upstream_dns_abandoned_total",
        "polygw_connections_open", "polygw_connections_accepted_total",
        "polygw_connections_refused_total", "polygw_backend_up"};
    for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++) {
        char want[160];
        snprintf(want, sizeof(want), "# TYPE %s ", families[i]);
        ck_assert_msg(strstr(s, want) != NULL, "no family %s", families[i]);
    }
    /* Zero series exist before the first event, so rate() has a start. */
    assert_has_line(s, "polygw_upstream_attempts_total{source=\"b\",capability=\"chat\","
                       "outcome=\"success\"} 0");
    assert_has_line(s, "polygw_calls_total{capability=\"embedding\",code=\"ok\"} 0");
    assert_has_line(s, "polygw_source_breaker_state{source=\"a\",capability=\"chat\","
                       "state=\"closed\"} 1");
    assert_has_line(s, "polygw_source_breaker_state{source=\"a\",capability=\"chat\","
                       "state=\"open\"} 0");
    /* Only the limited bucket of a is shown (full: 60 requests). */
    assert_has_line(s, "polygw_source_bucket_level{source=\"a\",capability=\"chat\","
                       "bucket=\"rpm\"} 60");
    ck_assert_ptr_null(strstr(s, "bucket=\"tpm\""));
    ck_assert_ptr_null(strstr(s, "polygw_redis_")); /* memory backend */
    assert_has_line(s, "polygw_backend_up{kind=\"memory\"} 1");
    free(s);
    fixture_stop(&f);
}
END_TEST

START_TEST(test_metrics__events_land_in_their_slots)
{
    struct fixture f;
    struct attempt_result r = {0};

    fixture_start(&f);
    struct metrics *m = f.srv.metrics;
    r.outcome.kind = OUTCOME_SUCCESS;
    r.elapsed_s = 0.02;
    r.ttft_s = 0.004;
    metrics_on_attempt(m, 0, &r);
    r.outcome.kind = OUTCOME_RATE_LIMITED;
    r.outcome.reason = REASON_HTTP_429;
    r.ttft_s = -1; /* none: not observed */
    metrics_on_attempt(m, 0, &r);
    r.outcome.kind = OUTCOME_TRANSIENT;
    r.outcome.reason = REASON_HTTP_5XX;
    metrics_on_attempt(m, 2, &r);
    metrics_on_attempt_cancelled(m, 1);
    metrics_on_attempt(m, 99, &r);            /* out of range: ignored */
    metrics_on_call_start(m, 0);
    metrics_on_call_start(m, 0);
    metrics_on_call_end(m, 0, PGW_STALLED, 2.0, 1.5);
    metrics_on_call_refused(m, 0, PGW_TASK_STOPPED);
    metrics_on_call_first_event(m, 0, 0.3);
    metrics_on_call_end(m, 42, PGW_OK, 1, 0); /* out of range: ignored */

    char *s = render(&f.srv);
    check_exposition(s);
    assert_has_line(s, "polygw_upstream_attempts_total{source=\"a\",capability=\"chat\","
                       "outcome=\"success\"} 1");
    assert_has_line(s, "polygw_upstream_attempts_total{source=\"a\",capability=\"chat\","
                       "outcome=\"rate_limited\"} 1");
    assert_has_line(s, "polygw_upstream_attempts_total{source=\"b\",capability=\"chat\","
                       "outcome=\"cancelled\"} 1");
    assert_has_line(s, "polygw_upstream_attempts_total{source=\"e\",capability=\"embedding\","
                       "outcome=\"transient\"} 1");
    assert_has_line(s, "polygw_upstream_attempt_failures_total{source=\"a\",capability=\"chat\","
                       "reason=\"http_429\"} 1");
    assert_has_line(s, "polygw_upstream_attempt_failures_total{source=\"e\","
                       "capability=\"embedding\",reason=\"http_5xx\"} 1");
    assert_has_line(s, "polygw_upstream_attempt_duration_seconds_count{source=\"a\","
                       "capability=\"chat\"} 2");
    assert_has_line(s, "polygw_upstream_ttft_seconds_count{source=\"a\",capability=\"chat\"} 1");
    assert_has_line(s, "polygw_upstream_ttft_seconds_bucket{source=\"a\",capability=\"chat\","
                       "le=\"0.0025\"} 0");
    assert_has_line(s, "polygw_upstream_ttft_seconds_bucket{source=\"a\",capability=\"chat\","
                       "le=\"0.005\"} 1");
    assert_has_line(s, "polygw_calls_total{capability=\"chat\",code=\"ok\"} 0");
    assert_has_line(s, "polygw_calls_total{capability=\"chat\",code=\"stalled\"} 1");
    assert_has_line(s, "polygw_calls_total{capability=\"chat\",code=\"task_stopped\"} 1");
    assert_has_line(s, "polygw_calls_total{capability=\"chat\",code=\"retry_exhausted\"} 0");
    ck_assert_ptr_null(strstr(s, "polygw_calls_total{capability=\"chat\",code=\"unknown_method\"}"));
    ck_assert_ptr_null(strstr(s, "polygw_calls_total{capability=\"chat\",code=\"too_large\"}"));
    assert_has_line(s, "polygw_calls_in_flight{capability=\"chat\"} 1");
    assert_has_line(s, "polygw_call_duration_seconds_count{capability=\"chat\"} 2");
    assert_has_line(s, "polygw_call_duration_seconds_sum{capability=\"chat\"} 2");
    assert_has_line(s, "polygw_call_stalled_seconds_sum{capability=\"chat\"} 1.5");
    assert_has_line(s, "polygw_call_ttft_seconds_count{capability=\"chat\"} 1");
    assert_has_line(s, "polygw_call_ttft_seconds_count{capability=\"embedding\"} 0");
    free(s);
    fixture_stop(&f);
}
END_TEST

Suite *metrics_suite(void)
{
    Suite *s = suite_create("metrics");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_metrics__hist_buckets_cumulative);
    tcase_add_test(tc, test_metrics__hist_ignores_nan_clamps_negative);
    tcase_add_test(tc, test_metrics__hist_labels_and_le);
    tcase_add_test(tc, test_metrics__bucket_texts_match_bounds);
    tcase_add_test(tc, test_metrics__label_values_escaped);
    tcase_add_test(tc, test_metrics__values_read_back_exactly);
    tcase_add_test(tc, test_metrics__take_empty_and_reuse);
    tcase_add_test(tc, test_metrics__large_text_grows);
    tcase_add_test(tc, test_metrics__fresh_server_renders_every_family);
    tcase_add_test(tc, test_metrics__events_land_in_their_slots);
    suite_add_tcase(s, tc);
    return s;
}
