/*
 * test_metrics.c — the sidecar's metrics registry (sidecar/metrics/metrics.c),
 * rendered from a real server (server_init on a temporary socket, no
 * client, no upstream) and read back with the strict reader of
 * expo_check.h: every family there from the start, and each event in its
 * slot.
 */
#include <ev.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/config.h"
#include "expo_check.h"
#include "daemon.h"
#include "rpc/conn.h"
#include "metrics/metrics.h"
#include "suites.h"
#include "upstream/upstream.h"

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
    return expo_text(s, len);
}

START_TEST(test_metrics__fresh_server_renders_every_family)
{
    struct fixture f;

    fixture_start(&f);
    char *s = render(&f.srv);
    expo_check(s);
    static const char *const families[] = { "polygw_upstream_attempts_total",
                                            "polygw_source_in_flight",
                                            "polygw_source_aimd_limit",
                                            "polygw_source_concurrency_limit",
                                            "polygw_source_breaker_state",
                                            "polygw_source_bucket_level",
                                            "polygw_calls_waiting",
                                            "polygw_calls_total",
                                            "polygw_call_duration_seconds",
                                            "polygw_call_ttft_seconds",
                                            "polygw_call_stalled_seconds",
                                            "polygw_upstream_ttft_seconds",
                                            "polygw_tasks",
                                            "polygw_task_watchdog_firings_total",
                                            "polygw_tasks_stopped_total",
                                            "polygw_upstream_dns_abandoned_total",
                                            "polygw_connections_open",
                                            "polygw_connections_accepted_total",
                                            "polygw_connections_refused_total",
                                            "polygw_backend_up" };
    for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++) {
        char want[160];
        snprintf(want, sizeof(want), "# TYPE %s ", families[i]);
        ck_assert_msg(strstr(s, want) != NULL, "no family %s", families[i]);
    }
    /* Zero series exist before the first event, so rate() has a start. */
    expo_assert_line(s,
                     "polygw_upstream_attempts_total{source=\"b\",capability=\"chat\","
                     "outcome=\"success\"} 0");
    expo_assert_line(s, "polygw_calls_total{capability=\"embedding\",code=\"ok\"} 0");
    expo_assert_line(s,
                     "polygw_source_breaker_state{source=\"a\",capability=\"chat\","
                     "state=\"closed\"} 1");
    expo_assert_line(s,
                     "polygw_source_breaker_state{source=\"a\",capability=\"chat\","
                     "state=\"open\"} 0");
    /* Only the limited bucket of a is shown (full: 60 requests). */
    expo_assert_line(s,
                     "polygw_source_bucket_level{source=\"a\",capability=\"chat\","
                     "bucket=\"rpm\"} 60");
    ck_assert_ptr_null(strstr(s, "bucket=\"tpm\""));
    ck_assert_ptr_null(strstr(s, "polygw_redis_")); /* memory backend */
    expo_assert_line(s, "polygw_backend_up{kind=\"memory\"} 1");
    free(s);
    fixture_stop(&f);
}
END_TEST

START_TEST(test_metrics__events_land_in_their_slots)
{
    struct fixture f;
    struct attempt_result r = { 0 };

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
    metrics_on_attempt(m, 99, &r); /* out of range: ignored */
    metrics_on_call_start(m, 0);
    metrics_on_call_start(m, 0);
    metrics_on_call_end(m, 0, PGW_STALLED, 2.0, 1.5);
    metrics_on_call_refused(m, 0, PGW_TASK_STOPPED);
    metrics_on_call_first_event(m, 0, 0.3);
    metrics_on_call_end(m, 42, PGW_OK, 1, 0); /* out of range: ignored */

    char *s = render(&f.srv);
    expo_check(s);
    expo_assert_line(s,
                     "polygw_upstream_attempts_total{source=\"a\",capability=\"chat\","
                     "outcome=\"success\"} 1");
    expo_assert_line(s,
                     "polygw_upstream_attempts_total{source=\"a\",capability=\"chat\","
                     "outcome=\"rate_limited\"} 1");
    expo_assert_line(s,
                     "polygw_upstream_attempts_total{source=\"b\",capability=\"chat\","
                     "outcome=\"cancelled\"} 1");
    expo_assert_line(s,
                     "polygw_upstream_attempts_total{source=\"e\",capability=\"embedding\","
                     "outcome=\"transient\"} 1");
    expo_assert_line(s,
                     "polygw_upstream_attempt_failures_total{source=\"a\",capability=\"chat\","
                     "reason=\"http_429\"} 1");
    expo_assert_line(s,
                     "polygw_upstream_attempt_failures_total{source=\"e\","
                     "capability=\"embedding\",reason=\"http_5xx\"} 1");
    expo_assert_line(s,
                     "polygw_upstream_attempt_duration_seconds_count{source=\"a\","
                     "capability=\"chat\"} 2");
    expo_assert_line(s, "polygw_upstream_ttft_seconds_count{source=\"a\",capability=\"chat\"} 1");
    expo_assert_line(s,
                     "polygw_upstream_ttft_seconds_bucket{source=\"a\",capability=\"chat\","
                     "le=\"0.0025\"} 0");
    expo_assert_line(s,
                     "polygw_upstream_ttft_seconds_bucket{source=\"a\",capability=\"chat\","
                     "le=\"0.005\"} 1");
    expo_assert_line(s, "polygw_calls_total{capability=\"chat\",code=\"ok\"} 0");
    expo_assert_line(s, "polygw_calls_total{capability=\"chat\",code=\"stalled\"} 1");
    expo_assert_line(s, "polygw_calls_total{capability=\"chat\",code=\"task_stopped\"} 1");
    expo_assert_line(s, "polygw_calls_total{capability=\"chat\",code=\"retry_exhausted\"} 0");
    ck_assert_ptr_null(
        strstr(s, "polygw_calls_total{capability=\"chat\",code=\"unknown_method\"}"));
    ck_assert_ptr_null(strstr(s, "polygw_calls_total{capability=\"chat\",code=\"too_large\"}"));
    expo_assert_line(s, "polygw_calls_in_flight{capability=\"chat\"} 1");
    expo_assert_line(s, "polygw_call_duration_seconds_count{capability=\"chat\"} 2");
    expo_assert_line(s, "polygw_call_duration_seconds_sum{capability=\"chat\"} 2");
    expo_assert_line(s, "polygw_call_stalled_seconds_sum{capability=\"chat\"} 1.5");
    expo_assert_line(s, "polygw_call_ttft_seconds_count{capability=\"chat\"} 1");
    expo_assert_line(s, "polygw_call_ttft_seconds_count{capability=\"embedding\"} 0");
    free(s);
    fixture_stop(&f);
}
END_TEST

Suite *metrics_suite(void)
{
    Suite *s = suite_create("metrics");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_metrics__fresh_server_renders_every_family);
    tcase_add_test(tc, test_metrics__events_land_in_their_slots);
    suite_add_tcase(s, tc);
    return s;
}
