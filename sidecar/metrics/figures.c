/*
 * figures.c — the tables of figures.h. Each figure once: its stats key,
 * its family (name, type, help; docs/METRICS.md) and where its value is.
 */
#include "figures.h"

#include <stddef.h>

#include "core/server.h"
#include "backend/backend.h"
#include "task.h"
#include "upstream/upstream.h"
#include "trace/trace.h"

#define SRV(obj)  ((const struct server *)(obj))
#define AT(field) offsetof(struct server, field)

/* ---- the server's sections ------------------------------------------- */

static const struct figure connections[] = {
    { .key = "open",
      .metric = "polygw_connections_open",
      .type = "gauge",
      .help = "Client connections open on the socket.",
      .off = AT(stats.conns_open) },
    { .key = "accepted",
      .metric = "polygw_connections_accepted_total",
      .type = "counter",
      .help = "Client connections accepted.",
      .off = AT(stats.conns_accepted) },
    { .key = "rejected",
      .metric = "polygw_connections_refused_total",
      .type = "counter",
      .help = "Client connections closed at accept (max_connections, out of file descriptors).",
      .off = AT(stats.conns_rejected) },
    { .key = "accept_errors",
      .metric = "polygw_accept_errors_total",
      .type = "counter",
      .help = "accept() failures on the socket.",
      .off = AT(stats.accept_errors) },
    { .key = "idle_closed", .off = AT(stats.conns_idle_closed) },
    { .key = "input_refused", .off = AT(stats.input_refusals) },
};

/* The `stats` answer counts itself as served: it is answered at once. */
static struct fig_val served_with_this(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .u = SRV(obj)->stats.requests_served + 1 };
}

static const struct figure requests[] = {
    { .key = "served", .get = served_with_this },
    { .key = "in_flight",
      .metric = "polygw_requests_in_flight",
      .type = "gauge",
      .help = "Requests accepted on the socket and not answered yet (calls and task requests).",
      .off = AT(stats.in_flight) },
    { .metric = "polygw_responses_total",
      .type = "counter",
      .help = "Responses sent on the socket, successes and errors, every method.",
      .off = AT(stats.requests_served) },
    { .key = "notifications_ignored", .off = AT(stats.notifications_ignored) },
    { .key = "cancels", .off = AT(stats.cancels) },
    { .key = "chunks_relayed",
      .metric = "polygw_stream_chunks_total",
      .type = "counter",
      .help = "Stream events relayed to clients.",
      .off = AT(stats.chunks_relayed) },
};

static const char *code_name(size_t i)
{
    return pgw_code_name((enum pgw_code)i);
}

static const struct figure rejected[] = {
    { .key = "",
      .metric = "polygw_error_responses_total",
      .type = "counter",
      .help = "Error responses and notifications sent on the socket, every method, by code.",
      .label = "code",
      .off = AT(stats.rejected),
      .first = 1, /* 0 is ok */
      .n = PGW_CODE_COUNT - 1,
      .name = code_name },
};

static const struct figure io[] = {
    { .key = "bytes_in",
      .metric = "polygw_received_bytes_total",
      .type = "counter",
      .help = "Bytes read from client connections.",
      .off = AT(stats.bytes_in) },
    { .key = "bytes_out",
      .metric = "polygw_sent_bytes_total",
      .type = "counter",
      .help = "Bytes written to client connections.",
      .off = AT(stats.bytes_out) },
    { .key = "read_pauses", .off = AT(stats.read_pauses) },
};

#define UP(field) offsetof(struct upstream_stats, field)

static const char *phase_name(size_t i)
{
    return attempt_phase_name((enum attempt_phase)i);
}

static const struct figure upstream[] = {
    { .key = "attempts_started", .off = UP(attempts_started) },
    { .key = "attempts_done", .off = UP(attempts_done) },
    { .key = "attempts_cancelled", .off = UP(attempts_cancelled) },
    { .key = "attempts_active",
      .metric = "polygw_upstream_attempts_active",
      .type = "gauge",
      .help = "Upstream HTTP requests open now.",
      .off = UP(attempts_active) },
    { .key = "dns_lookups",
      .metric = "polygw_upstream_dns_lookups_total",
      .type = "counter",
      .help = "Name lookups started (DNS cache misses).",
      .off = UP(dns_lookups) },
    { .key = "dns_abandoned",
      .metric = "polygw_upstream_dns_abandoned_total",
      .type = "counter",
      .help = "Name lookups abandoned while still running (their attempt ended first; the "
              "resolver thread was detached).",
      .off = UP(dns_abandoned) },
    { .key = "dns_busy",
      .metric = "polygw_upstream_dns_refused_total",
      .type = "counter",
      .help = "Attempts failed at once by the per-host lookup cap (the host's resolver hangs).",
      .off = UP(dns_busy) },
    { .key = "dns_waits",
      .metric = "polygw_upstream_dns_waits_total",
      .type = "counter",
      .help = "Times an attempt waited for a lookup slot of its host.",
      .off = UP(dns_waits) },
    { .key = "own_connections_opened",
      .metric = "polygw_upstream_own_connections_opened_total",
      .type = "counter",
      .help = "Connections made by the own HTTP/1.1 client.",
      .off = UP(conns_opened) },
    { .key = "own_connections_reused",
      .metric = "polygw_upstream_own_connections_reused_total",
      .type = "counter",
      .help = "Requests the own HTTP/1.1 client sent on a kept-alive connection.",
      .off = UP(conns_reused) },
    { .key = "own_stale_retries",
      .metric = "polygw_upstream_own_stale_retries_total",
      .type = "counter",
      .help = "Requests sent again on a new connection: the kept-alive one died as it was "
              "reused, before any byte of an answer.",
      .off = UP(stale_retries) },
    { .key = "own_tls_handshakes",
      .metric = "polygw_upstream_own_tls_handshakes_total",
      .type = "counter",
      .help = "TLS handshakes the own HTTP/1.1 client completed.",
      .off = UP(tls_done) },
    { .key = "own_tls_resumed",
      .metric = "polygw_upstream_own_tls_resumed_total",
      .type = "counter",
      .help = "Of those, handshakes that resumed an earlier session with the server.",
      .off = UP(tls_resumed) },
    { .key = "timeouts_",
      .metric = "polygw_upstream_timeouts_total",
      .type = "counter",
      .help = "Attempts ended by one of the sidecar's deadlines, by the phase they were in.",
      .label = "phase",
      .off = UP(timeouts),
      .first = ATTEMPT_RESOLVING,
      .n = ATTEMPT_DONE - ATTEMPT_RESOLVING,
      .name = phase_name },
};

static struct fig_val reload_error(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .s = SRV(obj)->reload_error };
}

static const struct figure reload[] = {
    { .key = "succeeded",
      .metric = "polygw_config_reloads_total",
      .type = "counter",
      .help = "Configuration reloads (SIGHUP, config.reload, a changed key file) by result; a "
              "failed one changed nothing.",
      .label = "result",
      .label_value = "succeeded",
      .off = AT(stats.reloads_ok) },
    { .key = "failed",
      .metric = "polygw_config_reloads_total",
      .label = "result",
      .label_value = "failed",
      .off = AT(stats.reloads_failed) },
    { .key = "last_error", .kind = FIG_STR, .get = reload_error },
};

#define HT(field) offsetof(struct http_stats, field)

static const char *status_class(size_t i)
{
    static const char *const names[] = { "0xx", "1xx", "2xx", "3xx", "4xx", "5xx" };
    return names[i];
}

/* The HTTP front's, when it is configured (stats only). */
static const struct figure http[] = {
    { .key = "open", .off = HT(conns_open) },
    { .key = "accepted", .off = HT(conns_accepted) },
    { .key = "rejected", .off = HT(conns_rejected) },
    { .key = "requests", .off = HT(requests) },
    { .key = "responses_", .off = HT(responses), .first = 1, .n = 5, .name = status_class },
    { .key = "timeouts", .off = HT(timeouts) },
    { .key = "bad_requests", .off = HT(bad_requests) },
};

#define TR(field) offsetof(struct trace_stats, field)

/* The tracer's, when tracing is on (trace/trace.h). */
static const struct figure tracing[] = {
    { .key = "spans_started",
      .metric = "polygw_trace_spans_started_total",
      .type = "counter",
      .help = "Sampled spans begun (a call's and each of its attempts').",
      .off = TR(spans_started) },
    { .key = "spans_exported",
      .metric = "polygw_trace_spans_exported_total",
      .type = "counter",
      .help = "Spans the OTLP receiver accepted.",
      .off = TR(spans_exported) },
    { .key = "dropped_queue",
      .metric = "polygw_trace_spans_dropped_total",
      .type = "counter",
      .help = "Spans dropped: ended into a full export queue (queue_full), or in a batch the "
              "receiver never took after the retries or refused (export_failed).",
      .label = "reason",
      .label_value = "queue_full",
      .off = TR(dropped_queue) },
    { .key = "dropped_export",
      .metric = "polygw_trace_spans_dropped_total",
      .label = "reason",
      .label_value = "export_failed",
      .off = TR(dropped_export) },
    { .key = "exports_ok",
      .metric = "polygw_trace_exports_total",
      .type = "counter",
      .help = "Export requests by result (a retry of the same batch counts again).",
      .label = "result",
      .label_value = "ok",
      .off = TR(exports_ok) },
    { .key = "exports_failed",
      .metric = "polygw_trace_exports_total",
      .label = "result",
      .label_value = "failed",
      .off = TR(exports_failed) },
    { .key = "export_retries",
      .metric = "polygw_trace_export_retries_total",
      .type = "counter",
      .help = "Batches sent again after a 429, 502, 503, 504 or no answer.",
      .off = TR(export_retries) },
    { .key = "queued",
      .metric = "polygw_trace_spans_queued",
      .type = "gauge",
      .help = "Ended spans waiting for export (at most tracing.max_queue_spans).",
      .off = TR(queued) },
    { .key = "unsampled",
      .metric = "polygw_trace_unsampled_total",
      .type = "counter",
      .help = "Calls the sampler left out (no spans recorded).",
      .off = TR(unsampled) },
};

#define SECTION(name) static const struct fig_table name##_table = FIG_TABLE(name)
SECTION(connections);
SECTION(requests);
SECTION(rejected);
SECTION(io);
SECTION(upstream);
SECTION(reload);
SECTION(http);
SECTION(tracing);

static const void *trace_stats(const void *obj, size_t row)
{
    (void)row;
    return tracer_stats(SRV(obj)->tracer);
}

static bool has_tracing(const void *obj, size_t row)
{
    (void)row;
    return tracer_is_enabled(SRV(obj)->tracer);
}

static const void *upstream_stats(const void *obj, size_t row)
{
    (void)row;
    return upstream_get_stats(SRV(obj)->up);
}

static const void *http_stats(const void *obj, size_t row)
{
    (void)row;
    return SRV(obj)->http_stats;
}

static bool has_http(const void *obj, size_t row)
{
    (void)row;
    return SRV(obj)->http_stats != NULL;
}

static struct fig_val currency(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .s = SRV(obj)->cfg->currency };
}

/* A cost sum, nil while nothing priced was counted (never 0 for unknown). */
static struct fig_val cost_val(double c, uint64_t priced)
{
    return priced ? (struct fig_val){ .d = c } : (struct fig_val){ .nil = true };
}

/* A budget in `stats` (docs/CONFIG.md §12a): per window it limits,
 * {limit, spent, reserved, left, resets_in_s} (no reset for the total). */
static void write_budget(struct writer *w, struct budget *b)
{
    double now = ev_time();
    uint32_t n = 0;

    for (int i = 0; i < BUDGET_WINDOWS; i++)
        n += b->p.limit[i] > 0;
    writer_map(w, n);
    for (int i = 0; i < BUDGET_WINDOWS; i++) {
        double resets;
        if (!(b->p.limit[i] > 0))
            continue;
        double left = budget_left(b, (enum budget_window)i, now, &resets);
        writer_str(w, budget_window_name((enum budget_window)i));
        writer_map(w, resets >= 0 ? 5 : 4);
        writer_kv_double(w, "limit", b->p.limit[i]);
        writer_kv_double(w, "spent", b->spent[i]);
        writer_kv_double(w, "reserved", b->reserved);
        writer_kv_double(w, "left", left);
        if (resets >= 0)
            writer_kv_double(w, "resets_in_s", resets);
    }
}

static struct budget *budget_of(const void *obj, bool of_app, size_t row)
{
    return backend_budget_view(SRV(obj)->backend, of_app, row);
}

static bool app_has_budget(const void *obj, size_t row)
{
    return budget_of(obj, true, row) != NULL;
}

static void write_app_budget(struct writer *w, const void *obj, size_t row)
{
    write_budget(w, budget_of(obj, true, row));
}

static bool src_has_budget(const void *obj, size_t row)
{
    return budget_of(obj, false, row) != NULL;
}

static void write_src_budget(struct writer *w, const void *obj, size_t row)
{
    write_budget(w, budget_of(obj, false, row));
}

static const struct figure server[] = {
    { .key = "currency", .kind = FIG_STR, .get = currency },
    { .key = "connections", .kind = FIG_MAP, .sub = &connections_table },
    { .key = "requests", .kind = FIG_MAP, .sub = &requests_table },
    { .key = "rejected", .kind = FIG_MAP, .sub = &rejected_table },
    { .key = "io", .kind = FIG_MAP, .sub = &io_table },
    { .key = "upstream", .kind = FIG_MAP, .sub = &upstream_table, .sub_obj = upstream_stats },
    { .key = "reload", .kind = FIG_MAP, .sub = &reload_table },
    { .key = "http",
      .kind = FIG_MAP,
      .sub = &http_table,
      .sub_obj = http_stats,
      .shown = has_http },
    { .key = "tracing",
      .kind = FIG_MAP,
      .sub = &tracing_table,
      .sub_obj = trace_stats,
      .shown = has_tracing },
};

const struct fig_table figs_server = FIG_TABLE(server);

/* ---- per source ------------------------------------------------------- */

static const struct gov_source *source(const void *obj, size_t row)
{
    return &SRV(obj)->gov.sources[row];
}

static size_t source_labels(const void *obj, size_t row, struct prom_label *l)
{
    const struct config *cfg = SRV(obj)->cfg;
    l[0] = (struct prom_label){ "source", cfg->sources[row].name };
    l[1] = (struct prom_label){ "capability",
                                cfg->capabilities[cfg->sources[row].capability_index].name };
    return 2;
}

static struct fig_val src_name(const void *obj, size_t row)
{
    return (struct fig_val){ .s = source(obj, row)->p.name };
}

static bool src_retired(const void *obj, size_t row)
{
    return source(obj, row)->p.retired; /* removed by a reload, still in use */
}

static struct fig_val yes(const void *obj, size_t row)
{
    (void)obj;
    (void)row;
    return (struct fig_val){ .b = true };
}

static struct fig_val src_capability(const void *obj, size_t row)
{
    return (struct fig_val){ .s =
                                 SRV(obj)->cfg->capabilities[source(obj, row)->p.capability].name };
}

static struct fig_val src_in_flight(const void *obj, size_t row)
{
    return (struct fig_val){ .u = source(obj, row)->in_flight };
}

/* min(max_concurrency, the AIMD permits) */
static struct fig_val src_limit(const void *obj, size_t row)
{
    const struct gov_source *s = source(obj, row);
    uint32_t limit = aimd_permits(&s->aimd);
    return (struct fig_val){ .u = limit < s->p.max_concurrency ? limit : s->p.max_concurrency };
}

static struct fig_val src_aimd_limit(const void *obj, size_t row)
{
    return (struct fig_val){ .d = source(obj, row)->aimd.limit };
}

static struct fig_val src_breaker(const void *obj, size_t row)
{
    return (struct fig_val){ .s = breaker_state_name(source(obj, row)->breaker.state) };
}

static struct fig_val src_next_probe(const void *obj, size_t row)
{
    double now = ev_now(SRV(obj)->loop);
    double next = breaker_next_admit(&source(obj, row)->breaker, now);
    return (struct fig_val){ .d = next > now && next < 1e300 ? next - now : 0 };
}

/* A bucket's level or capacity; none when it is unlimited (with the Redis
 * backend every local bucket is: the fleet's are in Redis). */
static struct fig_val level(const struct server *srv, const struct bucket *b, bool capacity)
{
    if (bucket_is_unlimited(b))
        return (struct fig_val){ .nil = true };
    if (capacity)
        return (struct fig_val){ .d = b->capacity };
    /* bucket_level refills the bucket to now first: a read, not a use. */
    return (struct fig_val){ .d = bucket_level((struct bucket *)b, ev_now(srv->loop)) };
}

#define SRC_LEVEL(fn, bucket, capacity)                              \
    static struct fig_val fn(const void *obj, size_t row)            \
    {                                                                \
        return level(SRV(obj), &source(obj, row)->bucket, capacity); \
    }
SRC_LEVEL(src_rpm, rpm, false)
SRC_LEVEL(src_tpm, tpm, false)
SRC_LEVEL(src_daily, daily, false)
SRC_LEVEL(src_rpm_cap, rpm, true)
SRC_LEVEL(src_tpm_cap, tpm, true)
SRC_LEVEL(src_daily_cap, daily, true)

#define SRC_U64(fn, expr)                                       \
    static struct fig_val fn(const void *obj, size_t row)       \
    {                                                           \
        return (struct fig_val){ .u = source(obj, row)->expr }; \
    }
SRC_U64(src_attempts, attempts)
SRC_U64(src_successes, successes)
SRC_U64(src_failures, failures)
SRC_U64(src_rate_limited, rate_limited)
SRC_U64(src_breaker_opened, breaker.opened_total)
SRC_U64(src_tokens, tokens_used)

#define BUCKET_LEVEL    "polygw_source_bucket_level"
#define BUCKET_CAPACITY "polygw_source_bucket_capacity"

static struct fig_val src_cost(const void *obj, size_t row)
{
    return cost_val(source(obj, row)->cost, source(obj, row)->priced);
}

static const struct figure sources[] = {
    { .key = "name", .kind = FIG_STR, .get = src_name },
    { .key = "retired", .kind = FIG_BOOL, .get = yes, .shown = src_retired },
    { .key = "capability", .kind = FIG_STR, .get = src_capability },
    { .key = "in_flight",
      .metric = "polygw_source_in_flight",
      .type = "gauge",
      .help = "Attempts holding a permit of the source.",
      .get = src_in_flight },
    { .key = "limit",
      .metric = "polygw_source_concurrency_limit",
      .type = "gauge",
      .help = "Permits the source grants now: min(max_concurrency, floor(AIMD limit)).",
      .get = src_limit },
    { .key = "aimd_limit",
      .metric = "polygw_source_aimd_limit",
      .type = "gauge",
      .help = "The source's AIMD concurrency limit.",
      .kind = FIG_DOUBLE,
      .get = src_aimd_limit },
    { .key = "breaker", .kind = FIG_STR, .get = src_breaker }, /* the local one */
    { .key = "next_probe_in_s", .kind = FIG_DOUBLE, .get = src_next_probe },
    { .key = "rpm_level",
      .metric = BUCKET_LEVEL,
      .type = "gauge",
      .help = "Tokens left in the source's rate buckets (rpm: requests, tpm and daily_tokens: "
              "tokens; negative while in debt). Limited buckets only.",
      .label = "bucket",
      .label_value = "rpm",
      .kind = FIG_DOUBLE,
      .get = src_rpm },
    { .key = "tpm_level",
      .metric = BUCKET_LEVEL,
      .label = "bucket",
      .label_value = "tpm",
      .kind = FIG_DOUBLE,
      .get = src_tpm },
    { .key = "daily_tokens_level",
      .metric = BUCKET_LEVEL,
      .label = "bucket",
      .label_value = "daily_tokens",
      .kind = FIG_DOUBLE,
      .get = src_daily },
    { .metric = BUCKET_CAPACITY,
      .type = "gauge",
      .help = "Capacity of the source's rate buckets. Limited buckets only.",
      .label = "bucket",
      .label_value = "rpm",
      .kind = FIG_DOUBLE,
      .get = src_rpm_cap },
    { .metric = BUCKET_CAPACITY,
      .label = "bucket",
      .label_value = "tpm",
      .kind = FIG_DOUBLE,
      .get = src_tpm_cap },
    { .metric = BUCKET_CAPACITY,
      .label = "bucket",
      .label_value = "daily_tokens",
      .kind = FIG_DOUBLE,
      .get = src_daily_cap },
    { .key = "attempts", .get = src_attempts },
    { .key = "successes", .get = src_successes },
    { .key = "failures", .get = src_failures },
    { .key = "rate_limited", .get = src_rate_limited },
    { .key = "breaker_opened",
      .metric = "polygw_source_breaker_opened_total",
      .type = "counter",
      .help = "Times the source's breaker opened.",
      .flags = FIG_LOCAL,
      .get = src_breaker_opened },
    { .key = "tokens_used",
      .metric = "polygw_source_tokens_total",
      .type = "counter",
      .help = "Tokens the upstream reported (its real usage) for successful calls of the source.",
      .get = src_tokens },
    { .key = "cost", .kind = FIG_DOUBLE, .get = src_cost },
    { .key = "budget", .kind = FIG_CUSTOM, .write = write_src_budget, .shown = src_has_budget },
};

const struct fig_table figs_source = { sources, sizeof(sources) / sizeof(sources[0]),
                                       source_labels };

/* ---- per app ---------------------------------------------------------- */

static const struct gov_app *app(const void *obj, size_t row)
{
    return &SRV(obj)->gov.apps[row];
}

static size_t app_labels(const void *obj, size_t row, struct prom_label *l)
{
    l[0] = (struct prom_label){ "app", SRV(obj)->cfg->apps[row].name };
    return 1;
}

static struct fig_val app_name(const void *obj, size_t row)
{
    return (struct fig_val){ .s = SRV(obj)->cfg->apps[row].name };
}

static struct fig_val app_cost(const void *obj, size_t row)
{
    return cost_val(app(obj, row)->cost, app(obj, row)->priced);
}

static struct fig_val app_weight(const void *obj, size_t row)
{
    return (struct fig_val){ .d = app(obj, row)->p.weight };
}

static struct fig_val app_in_flight(const void *obj, size_t row)
{
    return (struct fig_val){ .u = app(obj, row)->in_flight };
}

static struct fig_val app_admitted(const void *obj, size_t row)
{
    return (struct fig_val){ .u = app(obj, row)->admitted };
}

static struct fig_val app_limited(const void *obj, size_t row)
{
    return (struct fig_val){ .u = app(obj, row)->limited };
}

#define APP_LEVEL(fn, bucket)                                  \
    static struct fig_val fn(const void *obj, size_t row)      \
    {                                                          \
        return level(SRV(obj), &app(obj, row)->bucket, false); \
    }
APP_LEVEL(app_rpm, rpm)
APP_LEVEL(app_tpm, tpm)
APP_LEVEL(app_daily, daily)

/* per_capability: the app's limits on the capabilities it has some for. */
static size_t app_caps_set(const struct server *srv, size_t row)
{
    const struct config_app_limits *pc = srv->cfg->apps[row].per_capability;
    const struct gov_app *a = &srv->gov.apps[row];
    size_t n = 0;

    for (size_t ci = 0; pc && ci < a->n_caps && ci < srv->cfg->n_capabilities; ci++)
        n += pc[ci].set;
    return n;
}

static bool app_has_caps(const void *obj, size_t row)
{
    return app_caps_set(SRV(obj), row) > 0;
}

/* One capability of one app: its figures' object. */
struct app_cap {
    const struct server *srv;
    const struct gov_app_cap *c;
};

#define CAP(obj) (((const struct app_cap *)(obj))->c)

static struct fig_val cap_in_flight(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .u = CAP(obj)->in_flight };
}

static struct fig_val cap_limited(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .u = CAP(obj)->limited };
}

#define CAP_LEVEL(fn, bucket)                                                       \
    static struct fig_val fn(const void *obj, size_t row)                           \
    {                                                                               \
        (void)row;                                                                  \
        return level(((const struct app_cap *)obj)->srv, &CAP(obj)->bucket, false); \
    }
CAP_LEVEL(cap_rpm, rpm)
CAP_LEVEL(cap_tpm, tpm)
CAP_LEVEL(cap_daily, daily)

static const struct figure app_cap_figures[] = {
    { .key = "in_flight", .get = cap_in_flight },
    { .key = "limited", .get = cap_limited },
    { .key = "rpm_level", .kind = FIG_DOUBLE, .get = cap_rpm },
    { .key = "tpm_level", .kind = FIG_DOUBLE, .get = cap_tpm },
    { .key = "daily_tokens_level", .kind = FIG_DOUBLE, .get = cap_daily },
};
static const struct fig_table app_cap_table = FIG_TABLE(app_cap_figures);

static void write_app_caps(struct writer *w, const void *obj, size_t row)
{
    const struct server *srv = SRV(obj);
    const struct config_app_limits *pc = srv->cfg->apps[row].per_capability;
    const struct gov_app *a = app(obj, row);

    writer_map(w, (uint32_t)app_caps_set(srv, row));
    for (size_t ci = 0; pc && ci < a->n_caps && ci < srv->cfg->n_capabilities; ci++) {
        if (!pc[ci].set)
            continue;
        const struct app_cap ac = { srv, &a->caps[ci] };
        writer_str(w, srv->cfg->capabilities[ci].name);
        figs_write_map(w, &app_cap_table, &ac, 0);
    }
}

static const struct figure apps[] = {
    { .key = "name", .kind = FIG_STR, .get = app_name },
    { .key = "weight", .kind = FIG_DOUBLE, .get = app_weight },
    { .key = "in_flight",
      .metric = "polygw_app_in_flight",
      .type = "gauge",
      .help = "Attempts of the app holding a permit now.",
      .get = app_in_flight },
    { .key = "admitted",
      .metric = "polygw_app_attempts_admitted_total",
      .type = "counter",
      .help = "Attempts admitted for the app (its limits and a source's).",
      .get = app_admitted },
    { .key = "limited",
      .metric = "polygw_app_limited_total",
      .type = "counter",
      .help = "Times the app's own limits (max_concurrency, rpm, tpm, daily_tokens) held a call "
              "back.",
      .get = app_limited },
    { .key = "rpm_level", .kind = FIG_DOUBLE, .get = app_rpm },
    { .key = "tpm_level", .kind = FIG_DOUBLE, .get = app_tpm },
    { .key = "daily_tokens_level", .kind = FIG_DOUBLE, .get = app_daily },
    { .key = "per_capability", .kind = FIG_CUSTOM, .write = write_app_caps, .shown = app_has_caps },
    { .key = "cost", .kind = FIG_DOUBLE, .get = app_cost },
    { .key = "budget", .kind = FIG_CUSTOM, .write = write_app_budget, .shown = app_has_budget },
};

const struct fig_table figs_app = { apps, sizeof(apps) / sizeof(apps[0]), app_labels };

/* ---- the task registry ------------------------------------------------ */

#define TS(obj) task_reg_stats(SRV(obj)->tasks)

#define TASK_U64(fn, expr)                                \
    static struct fig_val fn(const void *obj, size_t row) \
    {                                                     \
        (void)row;                                        \
        return (struct fig_val){ .u = (uint64_t)(expr) }; \
    }
TASK_U64(tasks_held, TS(obj)->tasks)
TASK_U64(tasks_running, TS(obj)->running)
TASK_U64(tasks_succeeded, TS(obj)->succeeded)
TASK_U64(tasks_failed_stopped, TS(obj)->failed[TASK_STOPPED])
TASK_U64(tasks_failed_watchdog, TS(obj)->failed[TASK_WATCHDOG])
TASK_U64(tasks_failed_error, TS(obj)->failed[TASK_ERROR])
TASK_U64(tasks_started, TS(obj)->started)
TASK_U64(tasks_succeeded_total, TS(obj)->succeeded_total)
TASK_U64(tasks_stopped_total, TS(obj)->failed_total[TASK_STOPPED])
TASK_U64(tasks_watchdog_fired, TS(obj)->failed_total[TASK_WATCHDOG])
TASK_U64(tasks_watchdog_after_stop, TS(obj)->watchdog_after_stop)
TASK_U64(tasks_client_failed, TS(obj)->failed_total[TASK_ERROR])
TASK_U64(tasks_expired, TS(obj)->expired + TS(obj)->expired_running)
TASK_U64(tasks_rejected_full, TS(obj)->rejected_full)
TASK_U64(tasks_rejected_app, SRV(obj)->task_app_refused)
TASK_U64(tasks_memory, task_reg_memory_bytes(SRV(obj)->tasks))
TASK_U64(tasks_memory_limit, task_reg_memory_limit(SRV(obj)->tasks))

#define TASKS "polygw_tasks"
/* Failed tasks of one reason_kind (task_reason_kind_name). */
#define TASKS_FAILED(kind, fn)                                                             \
    {                                                                                      \
        .key = "failed_" kind, .metric = TASKS, .label = "state", .label_value = "failed", \
        .label2 = "reason_kind", .label2_value = kind, .get = fn                           \
    }

static const struct figure tasks[] = {
    { .key = "held", .get = tasks_held },
    { .key = "running",
      .metric = TASKS,
      .type = "gauge",
      .help = "Tasks held, by state (running, succeeded, failed) and, when failed, reason_kind "
              "(stopped, watchdog, error).",
      .label = "state",
      .label_value = "running",
      .get = tasks_running },
    { .key = "succeeded",
      .metric = TASKS,
      .label = "state",
      .label_value = "succeeded",
      .get = tasks_succeeded },
    TASKS_FAILED("stopped", tasks_failed_stopped),
    TASKS_FAILED("watchdog", tasks_failed_watchdog),
    TASKS_FAILED("error", tasks_failed_error),
    { .metric = "polygw_tasks_started_total",
      .type = "counter",
      .help = "task.start that started a task.",
      .get = tasks_started },
    { .metric = "polygw_tasks_succeeded_total",
      .type = "counter",
      .help = "Tasks finished ok.",
      .get = tasks_succeeded_total },
    { .metric = "polygw_tasks_stopped_total",
      .type = "counter",
      .help = "Tasks stopped by a user (task.stop): ordinary exits, not hangs.",
      .get = tasks_stopped_total },
    { .key = "watchdog_fired",
      .metric = "polygw_task_watchdog_firings_total",
      .type = "counter",
      .help = "Tasks failed by a node watchdog (a node ran past its timeout).",
      .get = tasks_watchdog_fired },
    { .key = "watchdog_after_stop",
      .metric = "polygw_task_watchdog_after_stop_total",
      .type = "counter",
      .help = "Node deadlines that passed on a task already stopped (not firings).",
      .get = tasks_watchdog_after_stop },
    { .metric = "polygw_tasks_client_failed_total",
      .type = "counter",
      .help = "Tasks finished failed by their client.",
      .get = tasks_client_failed },
    { .key = "expired",
      .metric = "polygw_tasks_expired_total",
      .type = "counter",
      .help = "Tasks forgotten after task_ttl_s (finished, or running and idle).",
      .get = tasks_expired },
    { .key = "rejected_full",
      .metric = "polygw_tasks_rejected_total",
      .type = "counter",
      .help = "task.start refused: max_tasks held.",
      .get = tasks_rejected_full },
    { .key = "rejected_app",
      .metric = "polygw_tasks_app_rejected_total",
      .type = "counter",
      .help = "task.start refused: the app held its apps[].max_tasks.",
      .get = tasks_rejected_app },
    { .key = "memory_bytes", .get = tasks_memory },
    { .key = "memory_limit_bytes", .get = tasks_memory_limit },
};

const struct fig_table figs_tasks = FIG_TABLE(tasks);
