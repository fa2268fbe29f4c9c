/* metrics.c — see metrics.h; the families are documented in docs/METRICS.md. */
#include "metrics.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/server.h"
#include "backend/backend.h"
#include "backend/cache.h"
#include "figures.h"
#include "upstream/upstream.h"

/* Attempt outcomes: enum outcome_kind, then the ones torn down. */
enum { OUT_CANCELLED = OUTCOME_FAIL_FAST + 1, OUT_COUNT };
static const char *const outcome_names[OUT_COUNT] = { "success", "rate_limited", "transient",
                                                      "fail_fast", "cancelled" };

struct metrics_source {
    uint64_t attempts[OUT_COUNT];
    uint64_t reasons[OUTCOME_REASON_COUNT];
    uint64_t prompt_tokens, cached_tokens; /* of successful attempts */
    struct prom_hist duration, ttft;
};

struct metrics_capability {
    uint64_t calls[PGW_CODE_COUNT];
    uint64_t in_flight;
    uint64_t cache[CACHE_EVENTS]; /* by enum cache_event */
    struct prom_hist duration, ttft, stalled;
};

/* Calls of one (capability, configured model name): the names come from
 * configurations only (models.h labels), so the set is bounded. */
#define METRICS_MODELS_MAX 1024
struct metrics_model {
    size_t cap;
    char *name; /* owned */
    uint64_t calls[PGW_CODE_COUNT];
};

/* Usage of one (source, app, model label): keyed by names, so a reload
 * that reorders sources keeps every series; bounded like the model names
 * (configured names only). A series whose source was never priced has no
 * cost sample (an unpriced call costs nothing known, never 0). */
#define METRICS_USAGE_MAX 4096
struct metrics_usage {
    char *source, *app, *model; /* owned */
    uint64_t tokens[COST_CLASSES];
    double cost; /* NAN until a priced call */
};

struct metrics {
    const struct config *cfg;
    struct metrics_source *src;
    struct metrics_capability *cap;
    struct metrics_model *models; /* owned, n_models of them */
    size_t n_models;
    struct metrics_usage *usage; /* owned, n_usage of them */
    size_t n_usage;
    size_t last_len; /* of the last rendering: the next one's first size */
};

static void source_init(struct metrics_source *s)
{
    prom_hist_init(&s->duration, &prom_buckets_latency_s);
    prom_hist_init(&s->ttft, &prom_buckets_latency_s);
}

static void capability_init(struct metrics_capability *c)
{
    prom_hist_init(&c->duration, &prom_buckets_latency_s);
    prom_hist_init(&c->ttft, &prom_buckets_latency_s);
    prom_hist_init(&c->stalled, &prom_buckets_latency_s);
}

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
    for (size_t i = 0; i < cfg->n_sources; i++)
        source_init(&m->src[i]);
    for (size_t i = 0; i < cfg->n_capabilities; i++)
        capability_init(&m->cap[i]);
    return m;
}

int metrics_reconf_prepare(const struct metrics *m, const struct config *cfg, const long *from,
                           struct metrics_reconf *r)
{
    r->src = calloc(cfg->n_sources ? cfg->n_sources : 1, sizeof(*r->src));
    r->cap = calloc(cfg->n_capabilities ? cfg->n_capabilities : 1, sizeof(*r->cap));
    if (!r->src || !r->cap) {
        metrics_reconf_abort(r);
        return -1;
    }
    for (size_t j = 0; j < cfg->n_sources; j++) {
        if (from[j] >= 0 && (size_t)from[j] < m->cfg->n_sources)
            r->src[j] = m->src[from[j]];
        else
            source_init(&r->src[j]);
    }
    for (size_t i = 0; i < cfg->n_capabilities; i++) {
        if (i < m->cfg->n_capabilities)
            r->cap[i] = m->cap[i];
        else
            capability_init(&r->cap[i]);
    }
    return 0;
}

void metrics_reconf_commit(struct metrics *m, const struct config *cfg, struct metrics_reconf *r)
{
    free(m->src);
    free(m->cap);
    m->src = r->src;
    m->cap = r->cap;
    m->cfg = cfg;
    r->src = NULL;
    r->cap = NULL;
}

void metrics_reconf_abort(struct metrics_reconf *r)
{
    free(r->src);
    free(r->cap);
    r->src = NULL;
    r->cap = NULL;
}

void metrics_free(struct metrics *m)
{
    if (!m)
        return;
    free(m->src);
    free(m->cap);
    for (size_t i = 0; i < m->n_models; i++)
        free(m->models[i].name);
    free(m->models);
    for (size_t i = 0; i < m->n_usage; i++) {
        free(m->usage[i].source);
        free(m->usage[i].app);
        free(m->usage[i].model);
    }
    free(m->usage);
    free(m);
}

void metrics_on_model_call(struct metrics *m, size_t cap, const char *model, enum pgw_code code)
{
    struct metrics_model *x = NULL;

    for (size_t i = 0; i < m->n_models && !x; i++)
        if (m->models[i].cap == cap && strcmp(m->models[i].name, model) == 0)
            x = &m->models[i];
    if (!x && m->n_models < METRICS_MODELS_MAX) {
        struct metrics_model *grown = realloc(m->models, (m->n_models + 1) * sizeof(*grown));
        char *name = strdup(model);
        if (grown)
            m->models = grown;
        if (grown && name) {
            x = &m->models[m->n_models++];
            memset(x, 0, sizeof(*x));
            x->cap = cap;
            x->name = name;
        } else {
            free(name);
        }
    }
    if (x)
        x->calls[(unsigned)code < PGW_CODE_COUNT ? code : PGW_INTERNAL]++;
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
    prom_hist_observe(&s->duration, r->elapsed_s);
    if (r->ttft_s >= 0)
        prom_hist_observe(&s->ttft, r->ttft_s);
}

void metrics_on_prompt_tokens(struct metrics *m, size_t source, int64_t prompt, int64_t cached)
{
    if (source >= m->cfg->n_sources || prompt < 0)
        return;
    m->src[source].prompt_tokens += (uint64_t)prompt;
    if (cached >= 0)
        m->src[source].cached_tokens += (uint64_t)cached;
}

/* The series of (source, app, model), made at its first use; NULL when
 * the table is full or out of memory (the usage is then not counted by
 * series, only by source). */
static struct metrics_usage *usage_series(struct metrics *m, const char *source, const char *app,
                                          const char *model)
{
    for (size_t i = 0; i < m->n_usage; i++) {
        struct metrics_usage *u = &m->usage[i];
        if (strcmp(u->source, source) == 0 && strcmp(u->app, app) == 0 &&
            strcmp(u->model, model) == 0)
            return u;
    }
    if (m->n_usage >= METRICS_USAGE_MAX)
        return NULL;
    struct metrics_usage *grown = realloc(m->usage, (m->n_usage + 1) * sizeof(*grown));
    if (!grown)
        return NULL;
    m->usage = grown;
    struct metrics_usage *u = &m->usage[m->n_usage];
    memset(u, 0, sizeof(*u));
    u->source = strdup(source);
    u->app = strdup(app);
    u->model = strdup(model);
    if (!u->source || !u->app || !u->model) {
        free(u->source);
        free(u->app);
        free(u->model);
        return NULL;
    }
    u->cost = NAN;
    m->n_usage++;
    return u;
}

void metrics_on_usage(struct metrics *m, size_t source, const char *app, const char *model,
                      const struct cost_tokens *t, double cost)
{
    if (source >= m->cfg->n_sources)
        return;
    struct metrics_usage *u = usage_series(m, m->cfg->sources[source].name, app, model);
    if (!u)
        return;
    for (int c = 0; c < COST_CLASSES; c++)
        u->tokens[c] += (uint64_t)t->n[c];
    if (cost_is_known(cost))
        u->cost = isnan(u->cost) ? cost : u->cost + cost;
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
    prom_hist_observe(&c->duration, duration_s);
    prom_hist_observe(&c->stalled, stalled_s);
}

void metrics_on_call_refused(struct metrics *m, size_t cap, enum pgw_code code)
{
    metrics_on_call_start(m, cap);
    metrics_on_call_end(m, cap, code, 0, 0);
}

void metrics_on_cache(struct metrics *m, size_t cap, enum cache_event ev)
{
    if (cap < m->cfg->n_capabilities && (unsigned)ev < CACHE_EVENTS)
        m->cap[cap].cache[ev]++;
}

void metrics_on_call_first_event(struct metrics *m, size_t cap, double ttft_s)
{
    if (cap < m->cfg->n_capabilities)
        prom_hist_observe(&m->cap[cap].ttft, ttft_s);
}

/* ------------------------------------------------------------------
 * Rendering
 */

#define L(n, v) ((struct prom_label){ (n), (v) })

/* A family of one unlabelled series. */
static void render_one(struct prom_text *t, const char *name, const char *type, const char *help,
                       double v)
{
    prom_text_family(t, name, type, help);
    prom_text_sample(t, name, NULL, 0, v);
}

/* A family whose series are labelled by one label taking `n` values. */
static void render_by(struct prom_text *t, const char *name, const char *type, const char *help,
                      const char *label, const char *const *values, const uint64_t *v, size_t n)
{
    prom_text_family(t, name, type, help);
    for (size_t i = 0; i < n; i++) {
        struct prom_label l = L(label, values[i]);
        prom_text_sample_u64(t, name, &l, 1, v[i]);
    }
}

/* What only /metrics shows of the process, then the figures `stats` shows
 * too (metrics/figures.h): connections, requests, errors, bytes, upstream
 * engine, reloads. */
static void render_server(struct prom_text *t, struct server *srv)
{
    struct prom_label l = L("version", PGW_VERSION);

    prom_text_family(t, "polygw_build_info", "gauge", "Always 1; the version of this sidecar.");
    prom_text_sample(t, "polygw_build_info", &l, 1, 1);
    render_one(t, "polygw_start_time_seconds", "gauge", "When the sidecar started (Unix time).",
               srv->started_at);
    figs_render(t, &figs_server, srv, 1, 0);
}

/* The response cache's memory tier (backend/cache.h). */
static void render_cache(struct prom_text *t, struct server *srv)
{
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } fams[] = {
#define CACHE_FAM(n, type, f, help) \
    { "polygw_cache_" n, type, help, offsetof(struct cache_stats, f) }
        CACHE_FAM("hits_total", "counter", hits, "Calls answered from the response cache."),
        CACHE_FAM("misses_total", "counter", misses,
                  "Cacheable calls that went upstream (no entry, or Cache-Control: no-cache)."),
        CACHE_FAM("bypasses_total", "counter", bypasses,
                  "Calls of a cached capability that neither read nor wrote the cache."),
        CACHE_FAM("coalesced_total", "counter", coalesced,
                  "Calls that waited for an identical call in flight and took its answer."),
        CACHE_FAM("stores_total", "counter", stores, "Answers stored in the response cache."),
        CACHE_FAM("evictions_total", "counter", evictions,
                  "Entries evicted (least recently used) to keep cache.max_bytes."),
        CACHE_FAM("expired_total", "counter", expired, "Entries found expired and dropped."),
        CACHE_FAM("too_big_total", "counter", too_big,
                  "Answers not stored: larger than max_entry_bytes or the whole cache."),
        CACHE_FAM("purged_total", "counter", purged,
                  "Entries dropped by a purge (polygwctl cache purge, cache.purge; with "
                  "Redis, one anywhere in the fleet)."),
#undef CACHE_FAM
    };
    struct cache_stats st;

    if (!srv->cache)
        return;
    cache_get_stats(srv->cache, &st);
    for (size_t i = 0; i < sizeof(fams) / sizeof(fams[0]); i++) {
        prom_text_family(t, fams[i].name, fams[i].type, fams[i].help);
        prom_text_sample_u64(t, fams[i].name, NULL, 0,
                             *(const uint64_t *)((const char *)&st + fams[i].off));
    }
    render_one(t, "polygw_cache_bytes", "gauge",
               "Bytes the response cache holds (entries and their bookkeeping).", (double)st.bytes);
    render_one(t, "polygw_cache_entries", "gauge", "Entries in the response cache.",
               (double)st.entries);
    render_one(t, "polygw_cache_max_bytes", "gauge", "The response cache's cap (cache.max_bytes).",
               (double)srv->cfg->cache_max_bytes);

    /* Per capability, for the capabilities that cache only: the others
     * never count, and their series would be zeros forever. */
    static const char *const results[CACHE_EVENTS] = { "hit", "miss", "bypass", "coalesced" };
    const struct config *cfg = srv->cfg;
    struct prom_label l[2];
    prom_text_family(t, "polygw_cache_calls_total", "counter",
                     "Calls of a cached capability by what the cache did: hit, miss, bypass, "
                     "coalesced.");
    for (size_t i = 0; i < cfg->n_capabilities; i++) {
        if (!(cfg->capabilities[i].cache.ttl_s > 0))
            continue;
        l[0] = L("capability", cfg->capabilities[i].name);
        for (size_t e = 0; e < CACHE_EVENTS; e++) {
            l[1] = L("result", results[e]);
            prom_text_sample_u64(t, "polygw_cache_calls_total", l, 2,
                                 srv->metrics->cap[i].cache[e]);
        }
    }
}

/* ---- one series (or histogram) per source, labelled source and capability */

static void source_labels(const struct config *cfg, size_t i, struct prom_label *l)
{
    l[0] = L("source", cfg->sources[i].name);
    l[1] = L("capability", cfg->capabilities[cfg->sources[i].capability_index].name);
}

static double src_prompt_tokens(const struct metrics_source *s)
{
    return (double)s->prompt_tokens;
}

static double src_cached_prompt_tokens(const struct metrics_source *s)
{
    return (double)s->cached_tokens;
}

/* Counted by the registry: not in `stats`. */
static const struct {
    const char *name, *help;
    double (*fn)(const struct metrics_source *s);
} source_families[] = {
    { "polygw_source_prompt_tokens_total",
      "Prompt tokens the upstream reported for successful attempts on the source.",
      src_prompt_tokens },
    { "polygw_source_cached_prompt_tokens_total",
      "Of those, the prompt tokens the upstream reported read from its prompt cache "
      "(prompt_tokens_details.cached_tokens, cache_read_input_tokens).",
      src_cached_prompt_tokens },
};

static void render_source_hist(struct prom_text *t, struct server *srv, const char *name,
                               const char *help, size_t offset)
{
    struct prom_label l[2];

    prom_text_family(t, name, "histogram", help);
    for (size_t i = 0; i < srv->cfg->n_sources; i++) {
        source_labels(srv->cfg, i, l);
        prom_text_hist(t, name, l, 2,
                       (const struct prom_hist *)((const char *)&srv->metrics->src[i] + offset));
    }
}

static void render_sources(struct prom_text *t, struct server *srv)
{
    const struct config *cfg = srv->cfg;
    const struct metrics *m = srv->metrics;
    struct prom_label l[3];

    prom_text_family(t, "polygw_upstream_attempts_total", "counter",
                     "Upstream attempts by source and outcome (success, rate_limited, "
                     "transient, fail_fast, cancelled).");
    for (size_t i = 0; i < cfg->n_sources; i++) {
        source_labels(cfg, i, l);
        for (int o = 0; o < OUT_COUNT; o++) {
            l[2] = L("outcome", outcome_names[o]);
            prom_text_sample_u64(t, "polygw_upstream_attempts_total", l, 3, m->src[i].attempts[o]);
        }
    }
    prom_text_family(t, "polygw_upstream_attempt_failures_total", "counter",
                     "Upstream attempts that did not succeed, by source and reason (series "
                     "appear with their first failure).");
    for (size_t i = 0; i < cfg->n_sources; i++) {
        source_labels(cfg, i, l);
        for (int r = 1; r < OUTCOME_REASON_COUNT; r++) {
            if (!m->src[i].reasons[r])
                continue;
            l[2] = L("reason", outcome_reason_name((enum outcome_reason)r));
            prom_text_sample_u64(t, "polygw_upstream_attempt_failures_total", l, 3,
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

    /* The governance state `stats` shows too (metrics/figures.h); what
     * only the local breaker counts means nothing with a shared backend. */
    figs_render(t, &figs_source, srv, cfg->n_sources, srv->backend->ops->shared ? FIG_LOCAL : 0);
    for (size_t f = 0; f < sizeof(source_families) / sizeof(source_families[0]); f++) {
        prom_text_family(t, source_families[f].name, "counter", source_families[f].help);
        for (size_t i = 0; i < cfg->n_sources; i++) {
            source_labels(cfg, i, l);
            prom_text_sample(t, source_families[f].name, l, 2, source_families[f].fn(&m->src[i]));
        }
    }
    prom_text_family(t, "polygw_source_breaker_state", "gauge",
                     "1 for the breaker's current state (closed, open, half_open), 0 for the "
                     "others; with the Redis backend, the fleet breaker as last seen.");
    for (size_t i = 0; i < cfg->n_sources; i++) {
        const char *cur = srv->backend->ops->breaker_state(srv->backend, i);
        if (!cur)
            cur = breaker_state_name(srv->gov.sources[i].breaker.state);
        source_labels(cfg, i, l);
        for (int s = BREAKER_CLOSED; s <= BREAKER_HALF_OPEN; s++) {
            const char *name = breaker_state_name((enum breaker_state)s);
            l[2] = L("state", name);
            prom_text_sample_u64(t, "polygw_source_breaker_state", l, 3, strcmp(cur, name) == 0);
        }
    }
}

/* ---- one series (or histogram) per capability */

static void render_cap_hist(struct prom_text *t, struct server *srv, const char *name,
                            const char *help, size_t offset)
{
    struct prom_label l;

    prom_text_family(t, name, "histogram", help);
    for (size_t i = 0; i < srv->cfg->n_capabilities; i++) {
        l = L("capability", srv->cfg->capabilities[i].name);
        prom_text_hist(t, name, &l, 1,
                       (const struct prom_hist *)((const char *)&srv->metrics->cap[i] + offset));
    }
}

static void render_capabilities(struct prom_text *t, struct server *srv)
{
    const struct config *cfg = srv->cfg;
    const struct metrics *m = srv->metrics;
    const char *caps[cfg->n_capabilities ? cfg->n_capabilities : 1];
    uint64_t v[cfg->n_capabilities ? cfg->n_capabilities : 1];
    struct prom_label l[2];

    /* Every code a call of a known capability can end with is shown from
     * the start, so that rate() and increase() see its first call. */
    prom_text_family(t, "polygw_calls_total", "counter",
                     "Calls answered, by capability and result code (ok, or the error code).");
    for (size_t i = 0; i < cfg->n_capabilities; i++) {
        l[0] = L("capability", cfg->capabilities[i].name);
        for (int c = 0; c < PGW_CODE_COUNT; c++) {
            if ((c == PGW_UNKNOWN_METHOD || c == PGW_UNKNOWN_CAPABILITY || c == PGW_TOO_LARGE ||
                 c == PGW_MODEL_NOT_FOUND || c == PGW_RESPONSE_NOT_FOUND) &&
                !m->cap[i].calls[c])
                continue;
            l[1] = L("code", pgw_code_name((enum pgw_code)c));
            prom_text_sample_u64(t, "polygw_calls_total", l, 2, m->cap[i].calls[c]);
        }
    }
    for (size_t i = 0; i < cfg->n_capabilities; i++) {
        caps[i] = cfg->capabilities[i].name;
        v[i] = m->cap[i].in_flight;
    }
    prom_text_family(t, "polygw_model_calls_total", "counter",
                     "Calls that asked for a model, by capability, configured model name (the "
                     "exact name or glob that matched; other: passed through or unknown) and "
                     "result code.");
    for (size_t i = 0; i < m->n_models; i++) {
        struct prom_label ml[3] = { L("capability",
                                      m->models[i].cap < cfg->n_capabilities
                                          ? cfg->capabilities[m->models[i].cap].name
                                          : "-"),
                                    L("model", m->models[i].name) };
        for (int c = 0; c < PGW_CODE_COUNT; c++) {
            if (!m->models[i].calls[c])
                continue;
            ml[2] = L("code", pgw_code_name((enum pgw_code)c));
            prom_text_sample_u64(t, "polygw_model_calls_total", ml, 3, m->models[i].calls[c]);
        }
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

/* Tokens by class and cost, by (source, app, model); the currency is a
 * label of the cost family, the deployment's one (server.currency). */
static void usage_labels(const struct metrics_usage *u, struct prom_label *l)
{
    l[0] = L("source", u->source);
    l[1] = L("app", u->app);
    l[2] = L("model", u->model);
}

static void render_usage(struct prom_text *t, struct server *srv)
{
    const struct metrics *m = srv->metrics;
    struct prom_label l[4];

    prom_text_family(t, "polygw_tokens_total", "counter",
                     "Tokens the upstream reported for successful attempts, by source, app, "
                     "model and class (input, cached_input, cache_write, output, reasoning; "
                     "disjoint: their sum is the total).");
    for (size_t i = 0; i < m->n_usage; i++) {
        const struct metrics_usage *u = &m->usage[i];
        usage_labels(u, l);
        for (int c = 0; c < COST_CLASSES; c++) {
            l[3] = L("class", cost_class_name((enum cost_class)c));
            prom_text_sample_u64(t, "polygw_tokens_total", l, 4, u->tokens[c]);
        }
    }
    prom_text_family(t, "polygw_cost_total", "counter",
                     "What successful attempts cost at the source's prices (docs/CONFIG.md), in "
                     "the deployment's currency, by source, app and model; no series for "
                     "unpriced sources.");
    for (size_t i = 0; i < m->n_usage; i++) {
        const struct metrics_usage *u = &m->usage[i];
        if (isnan(u->cost))
            continue;
        usage_labels(u, l);
        l[3] = L("currency", srv->cfg->currency);
        prom_text_sample(t, "polygw_cost_total", l, 4, u->cost);
    }
}

/* The budgets in currency (docs/CONFIG.md §12a) of the apps and sources
 * that have one, per window: what it has left now, and its limit. */
static void render_budgets(struct prom_text *t, struct server *srv)
{
    static const char *const names[2] = { "polygw_budget_left", "polygw_budget_limit" };
    static const char *const help[2] = {
        "What a budget has left now (limit - spent - reserved by calls in flight), in the "
        "deployment's currency, by app or source, and window.",
        "A budget's limit, by app or source, and window.",
    };
    const struct config *cfg = srv->cfg;
    double now = ev_time();
    struct prom_label l[2];

    for (int f = 0; f < 2; f++) {
        prom_text_family(t, names[f], "gauge", help[f]);
        for (int of_app = 1; of_app >= 0; of_app--) {
            size_t n = of_app ? cfg->n_apps : cfg->n_sources;
            for (size_t i = 0; i < n; i++) {
                struct budget *b = backend_budget_view(srv->backend, of_app, i);
                if (!b)
                    continue;
                l[0] = of_app ? L("app", cfg->apps[i].name) : L("source", cfg->sources[i].name);
                for (int w = 0; w < BUDGET_WINDOWS; w++) {
                    if (!(b->p.limit[w] > 0))
                        continue;
                    l[1] = L("window", budget_window_name((enum budget_window)w));
                    prom_text_sample(t, names[f], l, 2,
                                     f == 0 ? budget_left(b, (enum budget_window)w, now, NULL)
                                            : b->p.limit[w]);
                }
            }
        }
    }
}

/* The backend's kind and whether it can answer, then its own figures. */
static void render_backend(struct prom_text *t, struct server *srv)
{
    const struct backend *be = srv->backend;
    struct prom_label l = L("kind", be->ops->name);

    prom_text_family(t, "polygw_backend_up", "gauge",
                     "1 when the state backend can answer (memory: always; Redis: the command "
                     "connection is ready).");
    prom_text_sample_u64(t, "polygw_backend_up", &l, 1, backend_is_up(be));
    figs_render(t, be->ops->figures, be, 1, 0);
}

/* Per app (labels resolved from cfg->apps, the governance core's slots):
 * read at render time, nothing is counted on the hot path. */
static void render_apps(struct prom_text *t, struct server *srv)
{
    const struct gov *g = &srv->gov;

    figs_render(t, &figs_app, srv, g->apps && g->n_apps <= srv->cfg->n_apps ? g->n_apps : 0, 0);
}

char *metrics_render(struct server *srv, size_t *len)
{
    struct prom_text t;

    prom_text_init(&t);
    prom_text_reserve(&t, srv->metrics->last_len + srv->metrics->last_len / 8);
    render_server(&t, srv);
    render_cache(&t, srv);
    render_sources(&t, srv);
    render_capabilities(&t, srv);
    figs_render(&t, &figs_tasks, srv, 1, 0);
    render_apps(&t, srv);
    render_usage(&t, srv);
    render_budgets(&t, srv);
    render_backend(&t, srv);
    srv->metrics->last_len = t.len;
    return prom_text_take(&t, len);
}
