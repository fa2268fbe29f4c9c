/* metrics.c — see metrics.h; the families are documented in docs/METRICS.md. */
#include "metrics.h"

#include <math.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "redis.h"
#include "shared.h"
#include "task.h"
#include "upstream.h"

/* Each bound twice, as a double and as text (the unit tests check that
 * the two agree). */
const struct metrics_buckets metrics_buckets_latency_s = {
    18,
    {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
     600},
    {"0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5",
     "10", "30", "60", "120", "300", "600"},
};

const struct metrics_buckets metrics_buckets_rtt_s = {
    14,
    {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5},
    {"0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1",
     "0.25", "0.5", "1", "2.5"},
};

/* ------------------------------------------------------------------ */

void metrics_hist_init(struct metrics_hist *h, const struct metrics_buckets *b)
{
    memset(h, 0, sizeof(*h));
    h->b = b;
}

void metrics_hist_observe(struct metrics_hist *h, double v)
{
    size_t i = 0;

    if (isnan(v))
        return;
    if (v < 0)
        v = 0;
    while (i < h->b->n && v > h->b->le[i])
        i++;
    h->bucket[i]++;
    h->count++;
    h->sum += v;
}

/* ------------------------------------------------------------------ */

void metrics_text_init(struct metrics_text *t)
{
    memset(t, 0, sizeof(*t));
}

void metrics_text_fini(struct metrics_text *t)
{
    free(t->data);
    memset(t, 0, sizeof(*t));
}

/* Room for `n` more bytes plus the NUL. */
static bool text_reserve(struct metrics_text *t, size_t n)
{
    if (t->oom)
        return false;
    if (t->len + n + 1 <= t->cap)
        return true;
    size_t cap = t->cap ? t->cap : 4096;
    while (cap < t->len + n + 1)
        cap *= 2;
    char *p = realloc(t->data, cap);
    if (!p) {
        t->oom = true;
        return false;
    }
    t->data = p;
    t->cap = cap;
    return true;
}

/* The NUL is written once, by metrics_text_take (text_reserve keeps room). */
static void text_put(struct metrics_text *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap && !text_reserve(t, n))
        return;
    memcpy(t->data + t->len, s, n);
    t->len += n;
}

static void text_puts(struct metrics_text *t, const char *s)
{
    text_put(t, s, strlen(s));
}

/* `s` with backslash and newline escaped, and the double quote too when
 * `quote` (label values; HELP text keeps its quotes). */
static void text_escaped(struct metrics_text *t, const char *s, bool quote)
{
    const char *run = s;

    if (!strpbrk(s, quote ? "\\\n\"" : "\\\n")) {
        text_puts(t, s);
        return;
    }
    for (; *s; s++) {
        const char *esc = *s == '\\'           ? "\\\\"
                          : *s == '\n'         ? "\\n"
                          : quote && *s == '"' ? "\\\""
                                               : NULL;
        if (!esc)
            continue;
        text_put(t, run, (size_t)(s - run));
        text_put(t, esc, 2);
        run = s + 1;
    }
    text_put(t, run, (size_t)(s - run));
}

/* The shortest of %.15g / %.17g that reads back as `v`. */
static void format_double(char *buf, size_t cap, double v)
{
    if (isnan(v)) {
        snprintf(buf, cap, "NaN");
    } else if (isinf(v)) {
        snprintf(buf, cap, v > 0 ? "+Inf" : "-Inf");
    } else {
        snprintf(buf, cap, "%.15g", v);
        if (strtod(buf, NULL) != v)
            snprintf(buf, cap, "%.17g", v);
    }
}

/* Decimal digits of `v` into buf (>= 21 bytes); snprintf costs more than
 * the rest of a sample line. */
static const char *format_u64(char *buf, size_t cap, uint64_t v)
{
    char *p = buf + cap - 1;
    *p = '\0';
    do {
        *--p = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return p;
}

/* {a="x",b="y"[,extra="z"]}, nothing when there is no label at all. */
static void text_labels(struct metrics_text *t, const struct metrics_label *l, size_t n,
                        const char *extra_name, const char *extra_value)
{
    if (n == 0 && !extra_name)
        return;
    text_put(t, "{", 1);
    for (size_t i = 0; i < n; i++) {
        if (i)
            text_put(t, ",", 1);
        text_puts(t, l[i].name);
        text_put(t, "=\"", 2);
        text_escaped(t, l[i].value ? l[i].value : "", true);
        text_put(t, "\"", 1);
    }
    if (extra_name) {
        if (n)
            text_put(t, ",", 1);
        text_puts(t, extra_name);
        text_put(t, "=\"", 2);
        text_escaped(t, extra_value, true);
        text_put(t, "\"", 1);
    }
    text_put(t, "}", 1);
}

static void text_line(struct metrics_text *t, const char *name, const char *suffix,
                      const struct metrics_label *l, size_t n, const char *extra_name,
                      const char *extra_value, const char *value)
{
    text_puts(t, name);
    text_puts(t, suffix);
    text_labels(t, l, n, extra_name, extra_value);
    text_put(t, " ", 1);
    text_puts(t, value);
    text_put(t, "\n", 1);
}

void metrics_text_family(struct metrics_text *t, const char *name, const char *type,
                         const char *help)
{
    text_puts(t, "# HELP ");
    text_puts(t, name);
    text_put(t, " ", 1);
    text_escaped(t, help, false);
    text_puts(t, "\n# TYPE ");
    text_puts(t, name);
    text_put(t, " ", 1);
    text_puts(t, type);
    text_put(t, "\n", 1);
}

void metrics_text_sample(struct metrics_text *t, const char *name,
                         const struct metrics_label *labels, size_t n_labels, double v)
{
    char buf[40];
    format_double(buf, sizeof(buf), v);
    text_line(t, name, "", labels, n_labels, NULL, NULL, buf);
}

void metrics_text_sample_u64(struct metrics_text *t, const char *name,
                             const struct metrics_label *labels, size_t n_labels, uint64_t v)
{
    char buf[24];
    text_line(t, name, "", labels, n_labels, NULL, NULL, format_u64(buf, sizeof(buf), v));
}

void metrics_text_hist(struct metrics_text *t, const char *name,
                       const struct metrics_label *labels, size_t n_labels,
                       const struct metrics_hist *h)
{
    char le[40], val[40];
    uint64_t cum = 0;

    for (size_t i = 0; i <= h->b->n; i++) {
        const char *bound = i == h->b->n ? "+Inf" : h->b->le_text[i];
        cum += h->bucket[i];
        if (!bound) {
            format_double(le, sizeof(le), h->b->le[i]);
            bound = le;
        }
        text_line(t, name, "_bucket", labels, n_labels, "le", bound,
                  format_u64(val, sizeof(val), cum));
    }
    format_double(val, sizeof(val), h->sum);
    text_line(t, name, "_sum", labels, n_labels, NULL, NULL, val);
    text_line(t, name, "_count", labels, n_labels, NULL, NULL,
              format_u64(val, sizeof(val), h->count));
}

char *metrics_text_take(struct metrics_text *t, size_t *len)
{
    char *out = t->data;

    if (t->oom) {
        free(out);
        out = NULL;
    } else if (!out) {
        out = strdup("");
    } else {
        out[t->len] = '\0';
    }
    *len = out ? t->len : 0;
    memset(t, 0, sizeof(*t));
    return out;
}

/* ------------------------------------------------------------------
 * The registry
 */

/* Attempt outcomes: enum outcome_kind, then the ones torn down. */
enum { OUT_CANCELLED = OUTCOME_FAIL_FAST + 1, OUT_COUNT };
static const char *const outcome_names[OUT_COUNT] = {"success", "rate_limited", "transient",
                                                     "fail_fast", "cancelled"};

struct metrics_source {
    uint64_t attempts[OUT_COUNT];
    uint64_t reasons[OUTCOME_REASON_COUNT];
    struct metrics_hist duration, ttft;
};

struct metrics_capability {
    uint64_t calls[PGW_CODE_COUNT];
    uint64_t in_flight;
    struct metrics_hist duration, ttft, stalled;
};

struct metrics {
    const struct config *cfg;
    struct metrics_source *src;
    struct metrics_capability *cap;
    size_t last_len;               /* of the last rendering: the next one's first size */
};

struct metrics *metrics_new(const struct config *cfg)
{
    struct metrics *m = calloc(1, sizeof(*m));

    if (!m)
        return NULL;
    m->cfg = cfg;
    m->src = calloc(cfg->n_sources ? cfg->n_sources : 1, sizeof(*m->src));
    m->cap = calloc(cfg->n_capabilities ? cfg->n_capabilities : 1, sizeof(*m->cap));
    if (!m->src || !m->cap) {
        metrics_free(m);
        return NULL;
    }
    for (size_t i = 0; i < cfg->n_sources; i++) {
        metrics_hist_init(&m->src[i].duration, &metrics_buckets_latency_s);
        metrics_hist_init(&m->src[i].ttft, &metrics_buckets_latency_s);
    }
    for (size_t i = 0; i < cfg->n_capabilities; i++) {
        metrics_hist_init(&m->cap[i].duration, &metrics_buckets_latency_s);
        metrics_hist_init(&m->cap[i].ttft, &metrics_buckets_latency_s);
        metrics_hist_init(&m->cap[i].stalled, &metrics_buckets_latency_s);
    }
    return m;
}

void metrics_free(struct metrics *m)
{
    if (!m)
        return;
    free(m->src);
    free(m->cap);
    free(m);
}

void metrics_on_attempt(struct metrics *m, size_t source, const struct attempt_result *r)
{
    if (source >= m->cfg->n_sources)
        return;
    struct metrics_source *s = &m->src[source];
    enum outcome_reason reason = r->outcome.reason;
    s->attempts[reason == REASON_CANCELLED ? (int)OUT_CANCELLED : (int)r->outcome.kind]++;
    if (reason != REASON_NONE && reason != REASON_CANCELLED && (int)reason < OUTCOME_REASON_COUNT)
        s->reasons[reason]++;
    metrics_hist_observe(&s->duration, r->elapsed_s);
    if (r->ttft_s >= 0)
        metrics_hist_observe(&s->ttft, r->ttft_s);
}

void metrics_on_attempt_cancelled(struct metrics *m, size_t source)
{
    if (source < m->cfg->n_sources)
        m->src[source].attempts[OUT_CANCELLED]++;
}

void metrics_on_call_start(struct metrics *m, size_t cap)
{
    if (cap < m->cfg->n_capabilities)
        m->cap[cap].in_flight++;
}

void metrics_on_call_end(struct metrics *m, size_t cap, enum pgw_code code, double duration_s,
                         double stalled_s)
{
    if (cap >= m->cfg->n_capabilities)
        return;
    struct metrics_capability *c = &m->cap[cap];
    if (c->in_flight)
        c->in_flight--;
    c->calls[(unsigned)code < PGW_CODE_COUNT ? code : PGW_INTERNAL]++;
    metrics_hist_observe(&c->duration, duration_s);
    metrics_hist_observe(&c->stalled, stalled_s);
}

void metrics_on_call_refused(struct metrics *m, size_t cap, enum pgw_code code)
{
    metrics_on_call_start(m, cap);
    metrics_on_call_end(m, cap, code, 0, 0);
}

void metrics_on_call_first_event(struct metrics *m, size_t cap, double ttft_s)
{
    if (cap < m->cfg->n_capabilities)
        metrics_hist_observe(&m->cap[cap].ttft, ttft_s);
}

/* ------------------------------------------------------------------
 * Rendering
 */

#define L(n, v) ((struct metrics_label){(n), (v)})

/* A family of one unlabelled series. */
static void render_one(struct metrics_text *t, const char *name, const char *type,
                       const char *help, double v)
{
    metrics_text_family(t, name, type, help);
    metrics_text_sample(t, name, NULL, 0, v);
}

static void render_one_u64(struct metrics_text *t, const char *name, const char *type,
                           const char *help, uint64_t v)
{
    metrics_text_family(t, name, type, help);
    metrics_text_sample_u64(t, name, NULL, 0, v);
}

/* A family whose series are labelled by one label taking `n` values. */
static void render_by(struct metrics_text *t, const char *name, const char *type,
                      const char *help, const char *label, const char *const *values,
                      const uint64_t *v, size_t n)
{
    metrics_text_family(t, name, type, help);
    for (size_t i = 0; i < n; i++) {
        struct metrics_label l = L(label, values[i]);
        metrics_text_sample_u64(t, name, &l, 1, v[i]);
    }
}

static void render_server(struct metrics_text *t, struct server *srv)
{
    const struct server_stats *st = &srv->stats;
    const char *codes[PGW_CODE_COUNT];
    struct metrics_label l = L("version", PGW_VERSION);

    metrics_text_family(t, "polygw_build_info", "gauge", "Always 1; the version of this sidecar.");
    metrics_text_sample(t, "polygw_build_info", &l, 1, 1);
    render_one(t, "polygw_start_time_seconds", "gauge", "When the sidecar started (Unix time).",
               srv->started_at);
    render_one_u64(t, "polygw_connections_open", "gauge", "Client connections open on the socket.",
                   st->conns_open);
    render_one_u64(t, "polygw_connections_accepted_total", "counter",
                   "Client connections accepted.", st->conns_accepted);
    render_one_u64(t, "polygw_connections_refused_total", "counter",
                   "Client connections closed at accept (max_connections, out of file "
                   "descriptors).", st->conns_rejected);
    render_one_u64(t, "polygw_accept_errors_total", "counter", "accept() failures on the socket.",
                   st->accept_errors);
    render_one_u64(t, "polygw_requests_in_flight", "gauge",
                   "Requests accepted on the socket and not answered yet (calls and task "
                   "requests).", st->in_flight);
    render_one_u64(t, "polygw_responses_total", "counter",
                   "Responses sent on the socket, successes and errors, every method.",
                   st->requests_served);
    for (int i = 1; i < PGW_CODE_COUNT; i++)
        codes[i] = pgw_code_name((enum pgw_code)i);
    render_by(t, "polygw_error_responses_total", "counter",
              "Error responses and notifications sent on the socket, every method, by code.",
              "code", codes + 1, st->rejected + 1, PGW_CODE_COUNT - 1);
    render_one_u64(t, "polygw_stream_chunks_total", "counter", "Stream events relayed to clients.",
                   st->chunks_relayed);
    render_one_u64(t, "polygw_received_bytes_total", "counter",
                   "Bytes read from client connections.", st->bytes_in);
    render_one_u64(t, "polygw_sent_bytes_total", "counter", "Bytes written to client connections.",
                   st->bytes_out);
}

/* ---- one series (or histogram) per source, labelled source and capability */

static void source_labels(const struct config *cfg, size_t i, struct metrics_label *l)
{
    l[0] = L("source", cfg->sources[i].name);
    l[1] = L("capability", cfg->capabilities[cfg->sources[i].capability_index].name);
}

typedef double source_value_fn(struct server *srv, size_t i);

static double src_in_flight(struct server *srv, size_t i)
{
    return srv->gov.sources[i].in_flight;
}

static double src_concurrency_limit(struct server *srv, size_t i)
{
    const struct gov_source *s = &srv->gov.sources[i];
    uint32_t limit = aimd_permits(&s->aimd);
    return limit < s->p.max_concurrency ? limit : s->p.max_concurrency;
}

static double src_aimd_limit(struct server *srv, size_t i)
{
    return srv->gov.sources[i].aimd.limit;
}

static double src_breaker_opened(struct server *srv, size_t i)
{
    return (double)srv->gov.sources[i].breaker.opened_total;
}

static const struct {
    const char *name, *type, *help;
    source_value_fn *fn;
    bool local_only; /* meaningless with the Redis backend (the fleet's) */
} source_families[] = {
    {"polygw_source_in_flight", "gauge", "Attempts holding a permit of the source.",
     src_in_flight, false},
    {"polygw_source_concurrency_limit", "gauge",
     "Permits the source grants now: min(max_concurrency, floor(AIMD limit)).",
     src_concurrency_limit, false},
    {"polygw_source_aimd_limit", "gauge", "The source's AIMD concurrency limit.", src_aimd_limit,
     false},
    {"polygw_source_breaker_opened_total", "counter", "Times the source's breaker opened.",
     src_breaker_opened, true},
};

static void render_source_hist(struct metrics_text *t, struct server *srv, const char *name,
                               const char *help, size_t offset)
{
    struct metrics_label l[2];

    metrics_text_family(t, name, "histogram", help);
    for (size_t i = 0; i < srv->cfg->n_sources; i++) {
        source_labels(srv->cfg, i, l);
        metrics_text_hist(t, name, l, 2,
                          (const struct metrics_hist *)((const char *)&srv->metrics->src[i] +
                                                        offset));
    }
}

/* The rate buckets that are limited (with the Redis backend the buckets
 * are the fleet's, in Redis, and none is local). */
static void render_buckets(struct metrics_text *t, struct server *srv, const char *name,
                           const char *help, bool capacity)
{
    static const char *const names[] = {"rpm", "tpm", "daily_tokens"};
    double now = ev_now(srv->loop);
    struct metrics_label l[3];

    metrics_text_family(t, name, "gauge", help);
    for (size_t i = 0; i < srv->cfg->n_sources; i++) {
        struct gov_source *s = &srv->gov.sources[i];
        struct bucket *b[] = {&s->rpm, &s->tpm, &s->daily};
        source_labels(srv->cfg, i, l);
        for (int k = 0; k < 3; k++) {
            if (bucket_is_unlimited(b[k]))
                continue;
            l[2] = L("bucket", names[k]);
            metrics_text_sample(t, name, l, 3, capacity ? b[k]->capacity : bucket_level(b[k], now));
        }
    }
}

static void render_sources(struct metrics_text *t, struct server *srv)
{
    const struct config *cfg = srv->cfg;
    const struct metrics *m = srv->metrics;
    struct metrics_label l[3];

    metrics_text_family(t, "polygw_upstream_attempts_total", "counter",
                        "Upstream attempts by source and outcome (success, rate_limited, "
                        "transient, fail_fast, cancelled).");
    for (size_t i = 0; i < cfg->n_sources; i++) {
        source_labels(cfg, i, l);
        for (int o = 0; o < OUT_COUNT; o++) {
            l[2] = L("outcome", outcome_names[o]);
            metrics_text_sample_u64(t, "polygw_upstream_attempts_total", l, 3,
                                    m->src[i].attempts[o]);
        }
    }
    metrics_text_family(t, "polygw_upstream_attempt_failures_total", "counter",
                        "Upstream attempts that did not succeed, by source and reason (series "
                        "appear with their first failure).");
    for (size_t i = 0; i < cfg->n_sources; i++) {
        source_labels(cfg, i, l);
        for (int r = 1; r < OUTCOME_REASON_COUNT; r++) {
            if (!m->src[i].reasons[r])
                continue;
            l[2] = L("reason", outcome_reason_name((enum outcome_reason)r));
            metrics_text_sample_u64(t, "polygw_upstream_attempt_failures_total", l, 3,
                                    m->src[i].reasons[r]);
        }
    }
    render_source_hist(t, srv, "polygw_upstream_attempt_duration_seconds",
                       "Duration of upstream attempts that ended (not torn down), by source.",
                       offsetof(struct metrics_source, duration));
    render_source_hist(t, srv, "polygw_upstream_ttft_seconds",
                       "From request sent to the first response byte (plain) or first event "
                       "(stream), by source.",
                       offsetof(struct metrics_source, ttft));

    for (size_t f = 0; f < sizeof(source_families) / sizeof(source_families[0]); f++) {
        if (source_families[f].local_only && srv->shared)
            continue;
        metrics_text_family(t, source_families[f].name, source_families[f].type,
                            source_families[f].help);
        for (size_t i = 0; i < cfg->n_sources; i++) {
            source_labels(cfg, i, l);
            metrics_text_sample(t, source_families[f].name, l, 2, source_families[f].fn(srv, i));
        }
    }
    metrics_text_family(t, "polygw_source_breaker_state", "gauge",
                        "1 for the breaker's current state (closed, open, half_open), 0 for the "
                        "others; with the Redis backend, the fleet breaker as last seen.");
    for (size_t i = 0; i < cfg->n_sources; i++) {
        const char *cur = srv->shared ? shared_breaker_state(srv->shared, i)
                                      : breaker_state_name(srv->gov.sources[i].breaker.state);
        source_labels(cfg, i, l);
        for (int s = BREAKER_CLOSED; s <= BREAKER_HALF_OPEN; s++) {
            const char *name = breaker_state_name((enum breaker_state)s);
            l[2] = L("state", name);
            metrics_text_sample_u64(t, "polygw_source_breaker_state", l, 3,
                                    strcmp(cur, name) == 0);
        }
    }
    render_buckets(t, srv, "polygw_source_bucket_level",
                   "Tokens left in the source's rate buckets (rpm: requests, tpm and "
                   "daily_tokens: tokens; negative while in debt). Limited buckets only.",
                   false);
    render_buckets(t, srv, "polygw_source_bucket_capacity",
                   "Capacity of the source's rate buckets. Limited buckets only.", true);
}

/* ---- one series (or histogram) per capability */

static void render_cap_hist(struct metrics_text *t, struct server *srv, const char *name,
                            const char *help, size_t offset)
{
    struct metrics_label l;

    metrics_text_family(t, name, "histogram", help);
    for (size_t i = 0; i < srv->cfg->n_capabilities; i++) {
        l = L("capability", srv->cfg->capabilities[i].name);
        metrics_text_hist(t, name, &l, 1,
                          (const struct metrics_hist *)((const char *)&srv->metrics->cap[i] +
                                                        offset));
    }
}

static void render_capabilities(struct metrics_text *t, struct server *srv)
{
    const struct config *cfg = srv->cfg;
    const struct metrics *m = srv->metrics;
    const char *caps[cfg->n_capabilities ? cfg->n_capabilities : 1];
    uint64_t v[cfg->n_capabilities ? cfg->n_capabilities : 1];
    struct metrics_label l[2];

    /* Every code a call of a known capability can end with is shown from
     * the start, so that rate() and increase() see its first call. */
    metrics_text_family(t, "polygw_calls_total", "counter",
                        "Calls answered, by capability and result code (ok, or the error code).");
    for (size_t i = 0; i < cfg->n_capabilities; i++) {
        l[0] = L("capability", cfg->capabilities[i].name);
        for (int c = 0; c < PGW_CODE_COUNT; c++) {
            if ((c == PGW_UNKNOWN_METHOD || c == PGW_UNKNOWN_CAPABILITY || c == PGW_TOO_LARGE) &&
                !m->cap[i].calls[c])
                continue;
            l[1] = L("code", pgw_code_name((enum pgw_code)c));
            metrics_text_sample_u64(t, "polygw_calls_total", l, 2, m->cap[i].calls[c]);
        }
    }
    for (size_t i = 0; i < cfg->n_capabilities; i++) {
        caps[i] = cfg->capabilities[i].name;
        v[i] = m->cap[i].in_flight;
    }
    render_by(t, "polygw_calls_in_flight", "gauge", "Calls in the governed loop, by capability.",
              "capability", caps, v, cfg->n_capabilities);
    for (size_t i = 0; i < cfg->n_capabilities; i++)
        v[i] = i < srv->gov.n_capabilities ? srv->gov.waitq[i].n : 0;
    render_by(t, "polygw_calls_waiting", "gauge",
              "Calls waiting for a permit (nothing runnable), by capability.", "capability", caps,
              v, cfg->n_capabilities);
    render_cap_hist(t, srv, "polygw_call_duration_seconds",
                    "From a call's arrival to its answer, every result, by capability.",
                    offsetof(struct metrics_capability, duration));
    render_cap_hist(t, srv, "polygw_call_ttft_seconds",
                    "Streaming calls: from the call's arrival to its first event relayed to the "
                    "client (waiting and retries included), by capability.",
                    offsetof(struct metrics_capability, ttft));
    render_cap_hist(t, srv, "polygw_call_stalled_seconds",
                    "Time each answered call spent charged to the stall budget (waiting for a "
                    "permit, rate limits, backoff, exempt 429 attempts), by capability.",
                    offsetof(struct metrics_capability, stalled));
}

static void render_upstream(struct metrics_text *t, struct server *srv)
{
    const struct upstream_stats *us = upstream_get_stats(srv->up);
    const char *phases[ATTEMPT_DONE];

    render_one_u64(t, "polygw_upstream_attempts_active", "gauge",
                   "Upstream HTTP requests open now.", us->attempts_active);
    render_one_u64(t, "polygw_upstream_dns_lookups_total", "counter",
                   "Name lookups started (DNS cache misses).", us->dns_lookups);
    render_one_u64(t, "polygw_upstream_dns_abandoned_total", "counter",
                   "Name lookups abandoned while still running (their attempt ended first; "
                   "the resolver thread was detached).", us->dns_abandoned);
    render_one_u64(t, "polygw_upstream_dns_refused_total", "counter",
                   "Attempts failed at once by the per-host lookup cap (the host's resolver "
                   "hangs).", us->dns_busy);
    render_one_u64(t, "polygw_upstream_dns_waits_total", "counter",
                   "Times an attempt waited for a lookup slot of its host.", us->dns_waits);
    for (int i = ATTEMPT_RESOLVING; i < ATTEMPT_DONE; i++)
        phases[i] = attempt_phase_name((enum attempt_phase)i);
    render_by(t, "polygw_upstream_timeouts_total", "counter",
              "Attempts ended by one of the sidecar's deadlines, by the phase they were in.",
              "phase", phases, us->timeouts, ATTEMPT_DONE);
}

static void render_tasks(struct metrics_text *t, struct server *srv)
{
    const struct task_stats *ts = task_reg_stats(srv->tasks);
    struct metrics_label l[2];

    metrics_text_family(t, "polygw_tasks", "gauge",
                        "Tasks held, by state (running, succeeded, failed) and, when failed, "
                        "reason_kind (stopped, watchdog, error).");
    l[0] = L("state", "running");
    metrics_text_sample_u64(t, "polygw_tasks", l, 1, ts->running);
    l[0] = L("state", "succeeded");
    metrics_text_sample_u64(t, "polygw_tasks", l, 1, ts->succeeded);
    l[0] = L("state", "failed");
    for (int k = TASK_STOPPED; k < TASK_REASON_KIND_COUNT; k++) {
        l[1] = L("reason_kind", task_reason_kind_name((enum task_reason_kind)k));
        metrics_text_sample_u64(t, "polygw_tasks", l, 2, ts->failed[k]);
    }
    render_one_u64(t, "polygw_tasks_started_total", "counter", "task.start that started a task.",
                   ts->started);
    render_one_u64(t, "polygw_tasks_succeeded_total", "counter", "Tasks finished ok.",
                   ts->succeeded_total);
    render_one_u64(t, "polygw_tasks_stopped_total", "counter",
                   "Tasks stopped by a user (task.stop): ordinary exits, not hangs.",
                   ts->failed_total[TASK_STOPPED]);
    render_one_u64(t, "polygw_task_watchdog_firings_total", "counter",
                   "Tasks failed by a node watchdog (a node ran past its timeout).",
                   ts->failed_total[TASK_WATCHDOG]);
    render_one_u64(t, "polygw_task_watchdog_after_stop_total", "counter",
                   "Node deadlines that passed on a task already stopped (not firings).",
                   ts->watchdog_after_stop);
    render_one_u64(t, "polygw_tasks_client_failed_total", "counter",
                   "Tasks finished failed by their client.", ts->failed_total[TASK_ERROR]);
    render_one_u64(t, "polygw_tasks_expired_total", "counter",
                   "Tasks forgotten after task_ttl_s (finished, or running and idle).",
                   ts->expired + ts->expired_running);
    render_one_u64(t, "polygw_tasks_rejected_total", "counter",
                   "task.start refused: max_tasks held.", ts->rejected_full);
}

static void render_backend(struct metrics_text *t, struct server *srv)
{
    const struct rds *r = srv->shared ? shared_rds(srv->shared) : NULL;
    static const char *const kinds[] = {"reply", "timeout", "connection_lost", "not_connected"};
    static const char *const results[] = {"admitted", "refused", "error"};
    const char *kind = r ? "redis" : "memory";
    uint64_t up = r ? rds_up(r) : 1;

    render_by(t, "polygw_backend_up", "gauge",
              "1 when the state backend can answer (memory: always; Redis: the command "
              "connection is ready).", "kind", &kind, &up, 1);
    if (!r)
        return;
    const struct rds_stats *s = rds_get_stats(r);
    const uint64_t failures[] = {s->errors, s->timeouts, s->lost, s->rejected_not_connected};
    struct shared_counts sc;
    shared_get_counts(srv->shared, &sc);
    const uint64_t admissions[] = {sc.admitted, sc.refused, sc.admit_errors};
    render_one_u64(t, "polygw_redis_commands_total", "counter", "Redis commands sent.",
                   s->commands);
    metrics_text_family(t, "polygw_redis_round_trip_seconds", "histogram",
                        "Round trips of answered Redis commands (error replies included).");
    metrics_text_hist(t, "polygw_redis_round_trip_seconds", NULL, 0, &s->rtt);
    render_by(t, "polygw_redis_failures_total", "counter",
              "Redis commands that failed, by kind: reply (an error reply), timeout "
              "(command_timeout_s), connection_lost (their connection dropped first), "
              "not_connected (refused at once).", "kind", kinds, failures, 4);
    render_one_u64(t, "polygw_redis_pending_commands", "gauge",
                   "Redis commands sent, not answered.", s->pending);
    render_one_u64(t, "polygw_redis_connects_total", "counter", "Redis connections made.",
                   s->connects);
    render_one_u64(t, "polygw_redis_disconnects_total", "counter", "Redis connections lost.",
                   s->disconnects);
    render_one_u64(t, "polygw_redis_connect_failures_total", "counter",
                   "Redis connects that failed.", s->connect_failures);
    render_one_u64(t, "polygw_redis_subscribed", "gauge",
                   "1 while the pub/sub connection listens to every channel.", rds_subscribed(r));
    render_by(t, "polygw_fleet_admissions_total", "counter",
              "Fleet admissions (admit.lua) answered, by result: admitted, refused (a fleet "
              "limit or breaker), error (no verdict: the call failed closed).", "result",
              results, admissions, 3);
    render_one_u64(t, "polygw_fleet_write_errors_total", "counter",
                   "Writes to the fleet state that failed (release, progress mark, lease "
                   "renewal): logged and counted, never surfaced to calls.", sc.write_errors);
    render_one_u64(t, "polygw_fleet_leases_lost_total", "counter",
                   "Leases of attempts in flight found expired in Redis at renewal.",
                   sc.leases_lost);
}

char *metrics_render(struct server *srv, size_t *len)
{
    struct metrics_text t;

    metrics_text_init(&t);
    text_reserve(&t, srv->metrics->last_len + srv->metrics->last_len / 8);
    render_server(&t, srv);
    render_sources(&t, srv);
    render_capabilities(&t, srv);
    render_upstream(&t, srv);
    render_tasks(&t, srv);
    render_backend(&t, srv);
    srv->metrics->last_len = t.len;
    return metrics_text_take(&t, len);
}
