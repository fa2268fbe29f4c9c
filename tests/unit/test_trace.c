/* test_trace.c — the W3C trace context, spans and their OTLP encoding
 * (read back with the generated protobuf-c decoder), the sampler, the
 * bounded export queue and the OTEL_* environment. No receiver: the
 * export interval is far away; tests/http/tracing.test.js decodes what a
 * real export sends with the OpenTelemetry project's own definitions. */
#include <ev.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "trace/otlp.h"
#include "trace/trace.h"
#include "upstream/upstream.h"
#include "otlp.pb-c.h"
#include "suites.h"

#define TP "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

START_TEST(test_trace__ctx_parse)
{
    struct trace_ctx c;

    ck_assert_int_eq(trace_ctx_parse(&c, TP, "a=1,b=2"), 0);
    ck_assert(c.valid);
    ck_assert_int_eq(c.trace_id[0], 0x4b);
    ck_assert_int_eq(c.trace_id[15], 0x36);
    ck_assert_int_eq(c.span_id[7], 0xb7);
    ck_assert_int_eq(c.flags, 1);
    ck_assert_str_eq(c.state, "a=1,b=2");
    /* A later version may append fields; 00 may not. */
    ck_assert_int_eq(trace_ctx_parse(&c, "01" TP + 2, NULL), 0);
    ck_assert_int_eq(trace_ctx_parse(&c, TP "-x", NULL), -1);
    const char *bad[] = {
        NULL,
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", /* upper case */
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01", /* zero trace id */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", /* zero span id */
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", /* version ff */
        "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_msg(trace_ctx_parse(&c, bad[i], NULL) == -1, "accepted %s", bad[i]);
        ck_assert(!c.valid);
    }
    /* A tracestate with control characters is dropped, the parent kept. */
    ck_assert_int_eq(trace_ctx_parse(&c, TP, "a=\n1"), 0);
    ck_assert_str_eq(c.state, "");
}
END_TEST

struct fixture {
    struct ev_loop *loop;
    struct upstream *up;
    struct tracer *t;
};

static void fixture_start(struct fixture *f, uint32_t queue, double ratio)
{
    char err[200];
    struct config_tracing ct = {
        .enabled = true,
        .endpoint = (char *)"http://127.0.0.1:9/v1/traces",
        .sampler_ratio = ratio,
        .max_queue_spans = queue,
        .max_batch_spans = queue + 10, /* never a full batch: nothing leaves */
        .export_interval_s = 3600,
        .timeout_s = 1,
        .max_retries = 1,
    };
    f->loop = ev_loop_new(EVFLAG_AUTO);
    f->up = upstream_new(f->loop, 4, false, err, sizeof(err));
    ck_assert_ptr_nonnull(f->up);
    f->t = tracer_new(f->loop, f->up, &ct, err, sizeof(err));
    ck_assert_msg(f->t != NULL, "%s", err);
}

static void fixture_stop(struct fixture *f)
{
    tracer_free(f->t);
    upstream_free(f->up);
    ev_loop_destroy(f->loop);
}

static const char *kv_str(Pgwotlp__KeyValue **kv, size_t n, const char *key)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(kv[i]->key, key) == 0 &&
            kv[i]->value->value_case == PGWOTLP__ANY_VALUE__VALUE_STRING_VALUE)
            return kv[i]->value->string_value;
    return NULL;
}

START_TEST(test_trace__encode_round_trip)
{
    struct fixture f;
    struct trace_ctx c;

    fixture_start(&f, 16, -1);
    trace_ctx_parse(&c, TP, "v=1");
    struct span *call = span_start(f.t, NULL, &c, false, "chat m", TRACE_SERVER, 1000.5);
    ck_assert_ptr_nonnull(call);
    struct span *a = span_start(NULL, call, NULL, false, "chat m", TRACE_CLIENT, 1000.75);
    ck_assert_ptr_nonnull(a);
    char tp[56];
    span_traceparent(a, tp);
    ck_assert_int_eq(strncmp(tp, "00-4bf92f3577b34da6a3ce929d0e0e4736-", 36), 0);
    ck_assert_str_eq(tp + 52, "-01");
    span_set(a, &TKV_S("polygw.source", "a"));
    span_set(a, &TKV_I("http.response.status_code", 429));
    span_set(a, &TKV_I("http.response.status_code", 200)); /* replaced, not added */
    span_set(a, &TKV_D("polygw.retry_after_s", 1.5));
    span_set(a, &TKV_B("polygw.stream", true));
    span_event(call, "polygw.permit_wait", 1000.6, &TKV_D("polygw.duration_s", 0.15), 1);
    span_set_error(call, "stalled");
    span_end(a, 1001);
    span_end(call, 1001.25);
    ck_assert_uint_eq(tracer_stats(f.t)->queued, 2);

    /* What the next export would send, read back. */
    const char *keys[] = { "service.name" }, *vals[] = { "polygw-test" };
    struct otlp_resource res = { keys, vals, 1, "polygw", "0" };
    size_t len = 0;
    uint8_t *buf = otlp_encode(&res, tracer_queue_head(f.t), 2, &len);
    ck_assert_ptr_nonnull(buf);
    Pgwotlp__ExportTraceServiceRequest *r =
        pgwotlp__export_trace_service_request__unpack(NULL, len, buf);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->n_resource_spans, 1);
    Pgwotlp__ResourceSpans *rs = r->resource_spans[0];
    ck_assert_str_eq(kv_str(rs->resource->attributes, rs->resource->n_attributes, "service.name"),
                     "polygw-test");
    ck_assert_uint_eq(rs->scope_spans[0]->n_spans, 2);
    Pgwotlp__Span *sa = rs->scope_spans[0]->spans[0], *sc = rs->scope_spans[0]->spans[1];
    ck_assert_int_eq(sa->kind, PGWOTLP__SPAN__SPAN_KIND__SPAN_KIND_CLIENT);
    ck_assert_int_eq(sc->kind, PGWOTLP__SPAN__SPAN_KIND__SPAN_KIND_SERVER);
    ck_assert_uint_eq(sc->parent_span_id.len, 8);
    ck_assert_int_eq(memcmp(sc->parent_span_id.data, c.span_id, 8), 0);
    ck_assert_int_eq(memcmp(sa->parent_span_id.data, sc->span_id.data, 8), 0);
    ck_assert_int_eq(memcmp(sa->trace_id.data, c.trace_id, 16), 0);
    ck_assert_str_eq(sc->trace_state, "v=1");
    ck_assert_uint_eq(sc->start_time_unix_nano, 1000500000000ull);
    ck_assert_uint_eq(sc->end_time_unix_nano, 1001250000000ull);
    ck_assert_uint_eq(sa->n_attributes, 4);
    ck_assert_int_eq(sa->attributes[1]->value->int_value, 200);
    ck_assert(sa->attributes[2]->value->double_value == 1.5);
    ck_assert(sa->attributes[3]->value->bool_value);
    ck_assert_str_eq(kv_str(sa->attributes, sa->n_attributes, "polygw.source"), "a");
    ck_assert_uint_eq(sc->n_events, 1);
    ck_assert_str_eq(sc->events[0]->name, "polygw.permit_wait");
    ck_assert_uint_eq(sc->events[0]->time_unix_nano, 1000600000000ull);
    ck_assert_int_eq(sc->status->code, PGWOTLP__STATUS__STATUS_CODE__STATUS_CODE_ERROR);
    ck_assert_str_eq(sc->status->message, "stalled");
    ck_assert_uint_eq(sc->flags & 0x3ff, 0x301);
    pgwotlp__export_trace_service_request__free_unpacked(r, NULL);
    free(buf);
    fixture_stop(&f);
}
END_TEST

START_TEST(test_trace__bounds)
{
    struct fixture f;

    fixture_start(&f, 4, -1);
    struct span *s = span_start(f.t, NULL, NULL, false, "x", TRACE_SERVER, 1);
    char big[1000];
    memset(big, 'z', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    for (int i = 0; i < 40; i++)
        span_set(s, &(struct trace_kv){ .key = i % 2 ? "k1" : "k2", .type = TRACE_STR, .s = big });
    static const char *keys[30] = { "a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9",
                                    "b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8", "b9",
                                    "c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9" };
    for (int i = 0; i < 30; i++)
        span_set(s, &TKV_I(keys[i], i));
    for (int i = 0; i < 40; i++)
        span_event(s, "e", 1, &TKV_S("k", big), 1);
    span_end(s, 2);
    /* The queue holds 4; the fifth and later are dropped and counted. */
    for (int i = 0; i < 6; i++)
        span_end(span_start(f.t, NULL, NULL, false, "y", TRACE_SERVER, 1), 2);
    ck_assert_uint_eq(tracer_stats(f.t)->queued, 4);
    ck_assert_uint_eq(tracer_stats(f.t)->dropped_queue, 3);
    ck_assert_uint_eq(tracer_stats(f.t)->spans_started, 7);
    fixture_stop(&f);
}
END_TEST

/* A span full of events keeps its first ones and its latest (a call's
 * verdict), in order; the middle ones are dropped and counted. */
START_TEST(test_trace__events_keep_the_latest)
{
    struct fixture f;

    fixture_start(&f, 4, -1);
    struct span *s = span_start(f.t, NULL, NULL, false, "x", TRACE_SERVER, 1);
    for (int i = 0; i < 200; i++) {
        const char *name = i == 199 ? "polygw.stall_verdict" : "polygw.backoff";
        span_event(s, name, 1 + i * 0.01, &TKV_I("i", i), 1);
        span_event(NULL, name, 1, NULL, 0);
    }
    span_end(s, 10);
    size_t len = 0;
    const char *keys[] = { "service.name" }, *vals[] = { "t" };
    struct otlp_resource res = { keys, vals, 1, "polygw", "0" };
    uint8_t *buf = otlp_encode(&res, tracer_queue_head(f.t), 1, &len);
    Pgwotlp__ExportTraceServiceRequest *r =
        pgwotlp__export_trace_service_request__unpack(NULL, len, buf);
    ck_assert_ptr_nonnull(r);
    Pgwotlp__Span *p = r->resource_spans[0]->scope_spans[0]->spans[0];
    ck_assert_uint_eq(p->n_events, TRACE_EVENTS_MAX);
    ck_assert_uint_eq(p->dropped_events_count, 200 - TRACE_EVENTS_MAX);
    const size_t head = TRACE_EVENTS_MAX - TRACE_EVENTS_TAIL;
    for (size_t i = 0; i < TRACE_EVENTS_MAX; i++) {
        int want = i < head ? (int)i : 200 - TRACE_EVENTS_MAX + (int)i;
        ck_assert_int_eq(p->events[i]->attributes[0]->value->int_value, want);
        ck_assert_str_eq(p->events[i]->name,
                         want == 199 ? "polygw.stall_verdict" : "polygw.backoff");
    }
    pgwotlp__export_trace_service_request__free_unpacked(r, NULL);
    free(buf);
    fixture_stop(&f);
}
END_TEST

START_TEST(test_trace__sampler)
{
    struct fixture f;
    struct trace_ctx c;

    fixture_start(&f, 16, 0);
    /* Ratio 0: no root; a sampled parent still decides for its child. */
    ck_assert_ptr_null(span_start(f.t, NULL, NULL, false, "x", TRACE_SERVER, 1));
    trace_ctx_parse(&c, TP, NULL);
    struct span *s = span_start(f.t, NULL, &c, false, "x", TRACE_SERVER, 1);
    ck_assert_ptr_nonnull(s);
    span_end(s, 1);
    c.flags = 0;
    ck_assert_ptr_null(span_start(f.t, NULL, &c, false, "x", TRACE_SERVER, 1));
    ck_assert_uint_eq(tracer_stats(f.t)->unsampled, 2);
    /* NULL spans are accepted everywhere. */
    span_set(NULL, &TKV_I("k", 1));
    span_event(NULL, "e", 1, NULL, 0);
    span_set_error(NULL, "x");
    span_end(NULL, 1);
    fixture_stop(&f);
}
END_TEST

static bool ratio_says(double ratio, const char *hex)
{
    uint8_t id[16];
    for (int i = 0; i < 16; i++)
        sscanf(hex + 2 * i, "%2hhx", &id[i]);
    return trace_ratio_sampled(ratio, trace_ratio_bound(ratio), id);
}

/* The ratio sampler decides on the trace id's last 8 bytes, as the
 * OpenTelemetry SDKs do. */
START_TEST(test_trace__ratio_sampler)
{
    ck_assert(ratio_says(0.5, "ffffffffffffffff0000000000000000"));
    ck_assert(!ratio_says(0.5, "0000000000000001ffffffffffffffff"));
    ck_assert(!ratio_says(0.5, "7fffffffffffffffffffffffffffffff"));
    ck_assert(ratio_says(0.5, "80000000000000000000000000000001"));
    /* The bound exactly: (low >> 1) < 2^62. */
    ck_assert(ratio_says(0.5, "00000000000000007ffffffffffffffe"));
    ck_assert(ratio_says(0.5, "00000000000000007fffffffffffffff"));
    ck_assert(!ratio_says(0.5, "00000000000000008000000000000000"));
    ck_assert_uint_eq(trace_ratio_bound(0.5), UINT64_C(1) << 62);
    ck_assert_uint_eq(trace_ratio_bound(0.25), UINT64_C(1) << 61);
    ck_assert_uint_eq(trace_ratio_bound(1), UINT64_C(1) << 63);
    ck_assert_uint_eq(trace_ratio_bound(0), 0);
    /* 1 samples all (the highest id too), 0 none (the lowest too). */
    ck_assert(ratio_says(1, "ffffffffffffffffffffffffffffffff"));
    ck_assert(!ratio_says(0, "00000000000000000000000000000001"));
    ck_assert(ratio_says(1e-9, "00000000000000010000000000000001"));
    /* Roughly the ratio over many ids. */
    int n = 0;
    for (uint32_t i = 0; i < 4096; i++) {
        char hex[33];
        snprintf(hex, sizeof(hex), "0000000000000000%08x%08x", i * 2654435761u, i * 40503u);
        n += ratio_says(0.25, hex);
    }
    ck_assert_msg(n > 4096 / 4 - 200 && n < 4096 / 4 + 200, "%d", n);
}
END_TEST

/* A child keeps the caller's sampled and random flags (the others are
 * zeroed); an unsampled one gives the context it passes on. */
START_TEST(test_trace__flags_and_quiet_context)
{
    struct fixture f;
    struct trace_ctx c, q;
    char tp[56];

    fixture_start(&f, 16, 1);
    trace_ctx_parse(&c, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-07", "k=v");
    struct span *s = span_start_ctx(f.t, NULL, &c, false, "x", TRACE_SERVER, 1, &q);
    ck_assert_ptr_nonnull(s);
    ck_assert(!q.valid);
    span_traceparent(s, tp);
    ck_assert_str_eq(tp + 53, "03");
    ck_assert_str_eq(span_tracestate(s), "k=v");
    span_end(s, 1);

    c.flags = 0x06; /* not sampled, random */
    ck_assert_ptr_null(span_start_ctx(f.t, NULL, &c, false, "x", TRACE_SERVER, 1, &q));
    ck_assert(q.valid);
    ck_assert_int_eq(q.flags, 0x02);
    ck_assert_str_eq(q.state, "k=v");
    char a[56], b[56];
    trace_ctx_child(f.t, &q, a);
    trace_ctx_child(f.t, &q, b);
    ck_assert_str_eq(a + 53, "02");
    ck_assert_int_eq(strncmp(a, "00-4bf92f3577b34da6a3ce929d0e0e4736-", 36), 0);
    ck_assert_str_ne(a, b); /* a span id each */
    ck_assert_int_ne(strncmp(a + 36, "00f067aa0ba902b7", 16), 0);
    fixture_stop(&f);

    /* A root the sampler leaves out: a new trace id, flag 00, no state. */
    fixture_start(&f, 16, 0);
    ck_assert_ptr_null(span_start_ctx(f.t, NULL, NULL, false, "x", TRACE_SERVER, 1, &q));
    ck_assert(q.valid);
    ck_assert_int_eq(q.flags, 0);
    ck_assert_str_eq(q.state, "");
    fixture_stop(&f);
}
END_TEST

/* polygw's own context (a task's run) is the parent even where the
 * caller's would be a link; tracer_flush sends every batch at once, drops
 * a failed one without retrying, and says when the queue is empty. */
static void on_flushed(void *ud)
{
    *(int *)ud += 1;
}

static void on_guard(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)w;
    (void)revents;
    ev_break(loop, EVBREAK_ALL);
}

START_TEST(test_trace__own_context_and_flush)
{
    struct fixture f;
    struct trace_ctx c;
    char tp[56];
    int flushed = 0;

    fixture_start(&f, 16, 1);
    ck_assert_int_eq(tracer_flush(f.t, on_flushed, &flushed), 0); /* nothing queued */
    trace_ctx_parse(&c, TP, NULL);
    struct span *l = span_start(f.t, NULL, &c, true, "linked", TRACE_SERVER, 1);
    ck_assert(!l->has_parent && l->has_link);
    c.own = true;
    struct span *o = span_start(f.t, NULL, &c, true, "own", TRACE_SERVER, 1);
    ck_assert(o->has_parent && !o->has_link);
    ck_assert_mem_eq(o->parent_id, c.span_id, 8);
    span_traceparent(o, tp);
    ck_assert_mem_eq(tp, TP, 36); /* "00-" and the caller's trace id */
    span_end(l, 2);
    span_end(o, 2);
    ck_assert_uint_eq(tracer_stats(f.t)->queued, 2);
    /* The receiver (port 9) refuses: the batch is dropped, not retried. */
    ck_assert_int_eq(tracer_flush(f.t, on_flushed, &flushed), 1);
    ev_timer guard;
    ev_timer_init(&guard, on_guard, 10, 0);
    ev_timer_start(f.loop, &guard);
    while (!flushed && ev_is_active(&guard))
        ev_run(f.loop, EVRUN_ONCE);
    ev_timer_stop(f.loop, &guard);
    ck_assert_int_eq(flushed, 1);
    ck_assert_uint_eq(tracer_stats(f.t)->queued, 0);
    ck_assert_uint_eq(tracer_stats(f.t)->dropped_export, 2);
    ck_assert_uint_eq(tracer_stats(f.t)->export_retries, 0);
    ck_assert_ptr_null(tracer_queue_head(f.t));
    fixture_stop(&f);
}
END_TEST

START_TEST(test_trace__environment)
{
    char err[200];
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    struct upstream *up = upstream_new(loop, 4, false, err, sizeof(err));
    struct config_tracing ct = { .enabled = true,
                                 .sampler_ratio = -1,
                                 .max_queue_spans = 8,
                                 .max_batch_spans = 8,
                                 .export_interval_s = 3600,
                                 .timeout_s = 10 };

    setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://collector", 1);
    ck_assert_ptr_null(tracer_new(loop, up, &ct, err, sizeof(err)));
    ck_assert_msg(strstr(err, "http://") != NULL, "%s", err);
    setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/", 1);
    setenv("OTEL_EXPORTER_OTLP_HEADERS", "novalue", 1);
    ck_assert_ptr_null(tracer_new(loop, up, &ct, err, sizeof(err)));
    ck_assert_msg(strstr(err, "OTEL_EXPORTER_OTLP_HEADERS") != NULL, "%s", err);
    /* The message names the variable, never its value (a token). */
    setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20tok, x=1", 1);
    setenv("OTEL_TRACES_SAMPLER", "always_off", 1);
    struct tracer *t = tracer_new(loop, up, &ct, err, sizeof(err));
    ck_assert_msg(t != NULL, "%s", err);
    ck_assert_ptr_null(span_start(t, NULL, NULL, false, "x", TRACE_SERVER, 1));
    tracer_free(t);
    unsetenv("OTEL_EXPORTER_OTLP_ENDPOINT");
    unsetenv("OTEL_EXPORTER_OTLP_HEADERS");
    unsetenv("OTEL_TRACES_SAMPLER");
    upstream_free(up);
    ev_loop_destroy(loop);
}
END_TEST

/* Tracing on, exporting nowhere, for the environment's tests. */
static struct config_tracing env_config(double ratio)
{
    return (struct config_tracing){ .enabled = true,
                                    .endpoint = (char *)"http://127.0.0.1:9/v1/traces",
                                    .sampler_ratio = ratio,
                                    .max_queue_spans = 8,
                                    .max_batch_spans = 8,
                                    .export_interval_s = 3600,
                                    .timeout_s = 10 };
}

/* OTEL_SDK_DISABLED=true and OTEL_TRACES_EXPORTER=none turn tracing off;
 * another exporter or protocol is only warned about. */
START_TEST(test_trace__environment_turns_off)
{
    char err[200];
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    struct upstream *up = upstream_new(loop, 4, false, err, sizeof(err));
    struct config_tracing ct = env_config(1);
    static const struct {
        const char *name, *value;
        bool on;
    } cases[] = {
        { "OTEL_SDK_DISABLED", "true", false },
        { "OTEL_SDK_DISABLED", " TRUE ", false },
        { "OTEL_SDK_DISABLED", "false", true },
        { "OTEL_SDK_DISABLED", "yes", true },
        { "OTEL_TRACES_EXPORTER", "none", false },
        { "OTEL_TRACES_EXPORTER", " None ", false },
        { "OTEL_TRACES_EXPORTER", "otlp", true },
        { "OTEL_TRACES_EXPORTER", "zipkin", true },       /* warned, still OTLP */
        { "OTEL_TRACES_EXPORTER", "otlp,console", true }, /* console warned */
        { "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", true },  /* warned */
        { "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json", true },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        setenv(cases[i].name, cases[i].value, 1);
        struct tracer *t = tracer_new(loop, up, &ct, err, sizeof(err));
        ck_assert_msg(t != NULL, "%s", err);
        ck_assert_msg(tracer_is_enabled(t) == cases[i].on, "%s=%s", cases[i].name, cases[i].value);
        /* A reload reads it again. */
        unsetenv(cases[i].name);
        ck_assert_int_eq(tracer_reconf(t, &ct, err, sizeof(err)), 0);
        ck_assert(tracer_is_enabled(t));
        setenv(cases[i].name, cases[i].value, 1);
        ck_assert_int_eq(tracer_reconf(t, &ct, err, sizeof(err)), 0);
        ck_assert(tracer_is_enabled(t) == cases[i].on);
        unsetenv(cases[i].name);
        tracer_free(t);
    }
    upstream_free(up);
    ev_loop_destroy(loop);
}
END_TEST

/* A malformed list is refused by its own variable's name; a malformed
 * resource list is discarded, never a start failure; a bad sampler or
 * ratio is ignored. */
START_TEST(test_trace__environment_errors)
{
    char err[200];
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    struct upstream *up = upstream_new(loop, 4, false, err, sizeof(err));
    struct config_tracing ct = env_config(-1);

    setenv("OTEL_EXPORTER_OTLP_HEADERS", "ok=1", 1);
    setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "tokenSECRET", 1);
    ck_assert_ptr_null(tracer_new(loop, up, &ct, err, sizeof(err)));
    ck_assert_msg(strstr(err, "OTEL_EXPORTER_OTLP_TRACES_HEADERS: ") == err, "%s", err);
    ck_assert_ptr_null(strstr(err, "SECRET"));
    unsetenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS");
    unsetenv("OTEL_EXPORTER_OTLP_HEADERS");

    static const char *const ok[][2] = {
        { "OTEL_RESOURCE_ATTRIBUTES", "team,env=x" },
        { "OTEL_RESOURCE_ATTRIBUTES", "=x" },
        { "OTEL_EXPORTER_OTLP_HEADERS", "x bad=v,ok=1" },
        { "OTEL_EXPORTER_OTLP_HEADERS", "x(y)=v" },
        { "OTEL_TRACES_SAMPLER", "bogus_sampler" },
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        setenv(ok[i][0], ok[i][1], 1);
        struct tracer *t = tracer_new(loop, up, &ct, err, sizeof(err));
        ck_assert_msg(t != NULL, "%s=%s: %s", ok[i][0], ok[i][1], err);
        ck_assert(tracer_is_enabled(t));
        tracer_free(t);
        unsetenv(ok[i][0]);
    }
    /* A ratio out of range or not a number: ignored (1, all sampled). */
    setenv("OTEL_TRACES_SAMPLER", "traceidratio", 1);
    static const char *const bad_ratio[] = { "abc", "1.5", "-0.1" };
    for (size_t i = 0; i < 3; i++) {
        setenv("OTEL_TRACES_SAMPLER_ARG", bad_ratio[i], 1);
        struct tracer *t = tracer_new(loop, up, &ct, err, sizeof(err));
        ck_assert_ptr_nonnull(t);
        struct span *s = span_start(t, NULL, NULL, false, "x", TRACE_SERVER, 1);
        ck_assert_ptr_nonnull(s);
        span_end(s, 1);
        tracer_free(t);
    }
    unsetenv("OTEL_TRACES_SAMPLER");
    unsetenv("OTEL_TRACES_SAMPLER_ARG");
    upstream_free(up);
    ev_loop_destroy(loop);
}
END_TEST

Suite *trace_suite(void)
{
    Suite *s = suite_create("trace");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_trace__ctx_parse);
    tcase_add_test(tc, test_trace__encode_round_trip);
    tcase_add_test(tc, test_trace__bounds);
    tcase_add_test(tc, test_trace__events_keep_the_latest);
    tcase_add_test(tc, test_trace__sampler);
    tcase_add_test(tc, test_trace__ratio_sampler);
    tcase_add_test(tc, test_trace__flags_and_quiet_context);
    tcase_add_test(tc, test_trace__own_context_and_flush);
    tcase_add_test(tc, test_trace__environment);
    tcase_add_test(tc, test_trace__environment_turns_off);
    tcase_add_test(tc, test_trace__environment_errors);
    suite_add_tcase(s, tc);
    return s;
}
