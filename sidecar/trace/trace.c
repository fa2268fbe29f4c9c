/*
 * trace.c — spans, the sampler, the W3C trace context and the export
 * queue (trace.h has the rules; otlp.c the encoding).
 */
#include "trace/trace.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

#include "core/config.h"
#include "core/log.h"
#include "trace/otlp.h"
#include "trace/span.h"
#include "upstream/upstream.h"

#define RESOURCE_MAX      32 /* OTEL_RESOURCE_ATTRIBUTES entries kept */
#define HEADERS_MAX       32 /* OTEL_EXPORTER_OTLP_HEADERS entries kept */
#define BACKOFF_FIRST_S   1.0
#define BACKOFF_MAX_S     30.0
#define RETRY_AFTER_MAX_S 60.0
#define SPAN_TEXT_MAX     4096u /* a span's strings, all together */

/* The settings in force: the config's keys merged with the environment. */
struct trace_settings {
    char *endpoint;
    double ratio;
    uint64_t ratio_bound; /* ratio x 2^63: sampled_id's bound */
    bool parent_based, link;
    uint32_t max_queue, max_batch, max_retries;
    double interval_s, timeout_s;
    /* Resource attributes: service.name first. Owned strings. */
    char *res_keys[RESOURCE_MAX + 3], *res_vals[RESOURCE_MAX + 3];
    size_t n_res;
    /* "Name: value" lines, NULL-terminated, Content-Type first. Owned:
     * header values may be secrets (a collector's token) and are never
     * logged. */
    char *headers[HEADERS_MAX + 2];
};

struct tracer {
    struct ev_loop *loop;
    struct upstream *up;
    struct trace_settings set;
    bool enabled;
    struct trace_stats stats;
    uint64_t rng[2];
    struct span *head, *tail; /* ended, waiting */
    /* The batch being exported (or waiting for its retry). */
    struct span *batch;
    size_t batch_n;
    uint8_t *body;
    size_t body_len;
    uint32_t tries;
    struct attempt *attempt;
    ev_timer export_w; /* next export (interval, retry backoff, or soon) */
    /* tracer_flush: every batch leaves at once, none is retried, and
     * flushed(flushed_ud) is called when the queue is empty. */
    void (*flushed)(void *ud);
    void *flushed_ud;
};

/* ---- ids ------------------------------------------------------------- */

/* xoroshiro128+, seeded from getrandom(): ids need to be unique, not
 * secret. */
static uint64_t rng_next(struct tracer *t)
{
    uint64_t s0 = t->rng[0], s1 = t->rng[1], r = s0 + s1;
    s1 ^= s0;
    t->rng[0] = ((s0 << 55) | (s0 >> 9)) ^ s1 ^ (s1 << 14);
    t->rng[1] = (s1 << 36) | (s1 >> 28);
    return r;
}

static void rng_fill(struct tracer *t, uint8_t *p, size_t n)
{
    do {
        for (size_t i = 0; i < n; i += 8) {
            uint64_t v = rng_next(t);
            memcpy(p + i, &v, n - i < 8 ? n - i : 8);
        }
    } while (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0); /* never all zero */
}

/* ---- trace context --------------------------------------------------- */

static int hex_in(const char *s, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int v = 0;
        for (int j = 0; j < 2; j++) {
            char c = s[2 * i + j];
            v <<= 4;
            if (c >= '0' && c <= '9')
                v |= c - '0';
            else if (c >= 'a' && c <= 'f')
                v |= c - 'a' + 10;
            else
                return -1;
        }
        out[i] = (uint8_t)v;
    }
    return 0;
}

static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

int trace_ctx_parse(struct trace_ctx *c, const char *tp, const char *ts)
{
    uint8_t ver;

    memset(c, 0, sizeof(*c));
    if (!tp)
        return -1;
    size_t n = strlen(tp);
    /* 00-<32>-<16>-<2>; a later version may append "-..." after that. */
    if (n < 55 || tp[2] != '-' || tp[35] != '-' || tp[52] != '-' || hex_in(tp, &ver, 1) < 0 ||
        ver == 0xff || (ver == 0 && n != 55) || (n > 55 && tp[55] != '-') ||
        hex_in(tp + 3, c->trace_id, 16) < 0 || hex_in(tp + 36, c->span_id, 8) < 0 ||
        hex_in(tp + 53, &c->flags, 1) < 0 || all_zero(c->trace_id, 16) || all_zero(c->span_id, 8)) {
        memset(c, 0, sizeof(*c));
        return -1;
    }
    c->valid = true;
    if (ts && strlen(ts) < sizeof(c->state)) {
        bool ok = true;
        for (const char *p = ts; *p; p++)
            if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e)
                ok = false;
        if (ok)
            strcpy(c->state, ts);
    }
    return 0;
}

static void hex_out(char *out, const uint8_t *p, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
}

void span_traceparent(const struct span *s, char *out)
{
    memcpy(out, "00-", 3);
    hex_out(out + 3, s->trace_id, 16);
    out[35] = '-';
    hex_out(out + 36, s->span_id, 8);
    out[52] = '-';
    hex_out(out + 53, &s->flags, 1);
    out[55] = '\0';
}

/* ---- spans ----------------------------------------------------------- */

static uint64_t to_ns(double t)
{
    return t > 0 ? (uint64_t)llround(t * 1e9) : 0;
}

/* Copies `s` (cut at TRACE_STR_MAX bytes, or less at the span's text
 * bound: then "") into the span's text; returns its offset. */
static uint32_t span_put(struct span *sp, const char *s)
{
    size_t n = s ? strnlen(s, TRACE_STR_MAX) : 0;
    if (n == 0)
        return 0;
    if (sp->text_len + n + 1 > SPAN_TEXT_MAX)
        return 0;
    if (sp->text_len + n + 1 > sp->text_cap) {
        uint32_t cap = sp->text_cap * 2;
        while (cap < sp->text_len + n + 1)
            cap *= 2;
        if (cap > SPAN_TEXT_MAX)
            cap = SPAN_TEXT_MAX;
        char *p = realloc(sp->text, cap);
        if (!p)
            return 0;
        sp->text = p;
        sp->text_cap = cap;
    }
    uint32_t off = sp->text_len;
    memcpy(sp->text + off, s, n);
    sp->text[off + n] = '\0';
    sp->text_len += (uint32_t)n + 1;
    return off;
}

/* span_put for an event's strings (its name, a source): one the span has
 * already is shared, so that a span's many events fit in its text bound.
 * Span attributes, set once each, do not pay for the walk. */
static uint32_t span_put_shared(struct span *sp, const char *s)
{
    size_t n = s ? strnlen(s, TRACE_STR_MAX) : 0;

    for (uint32_t off = 1; n && off < sp->text_len;) {
        size_t k = strlen(sp->text + off);
        if (k == n && memcmp(sp->text + off, s, n) == 0)
            return off;
        off += (uint32_t)k + 1;
    }
    return span_put(sp, s);
}

static void span_free(struct span *s)
{
    if (!s)
        return;
    free(s->text);
    free(s);
}

/* TraceIdRatioBased as the OpenTelemetry SDKs (Go, Java) decide it: the
 * trace id's last 8 bytes, big-endian, shifted right by one, below
 * ratio x 2^63 (`bound`, computed once: no rounding per id). */
bool trace_ratio_sampled(double ratio, uint64_t bound, const uint8_t *trace_id)
{
    if (ratio >= 1)
        return true;
    if (!(ratio > 0))
        return false;
    uint64_t v = 0;
    for (int i = 8; i < 16; i++)
        v = (v << 8) | trace_id[i];
    return (v >> 1) < bound;
}

uint64_t trace_ratio_bound(double ratio)
{
    return ratio >= 1 ? UINT64_C(1) << 63 : ratio > 0 ? (uint64_t)ldexp(ratio, 63) : 0;
}

static bool sampled(const struct tracer *t, const uint8_t *trace_id)
{
    return trace_ratio_sampled(t->set.ratio, t->set.ratio_bound, trace_id);
}

/* The caller's flags a child keeps: sampled (0x01) and W3C level 2's
 * random (0x02); the others are unused and set to 0. */
#define FLAGS_KEPT 0x03

struct span *span_start_ctx(struct tracer *t, const struct span *parent,
                            const struct trace_ctx *ctx, bool link, const char *name,
                            enum trace_kind kind, double now, struct trace_ctx *quiet)
{
    struct span *s;

    if (quiet)
        memset(quiet, 0, sizeof(*quiet));
    if (!t && parent)
        t = parent->t;
    if (!t || !t->enabled)
        return NULL;
    if (!(s = calloc(1, sizeof(*s))) || !(s->text = malloc(256))) {
        free(s);
        return NULL;
    }
    s->t = t;
    s->text_cap = 256;
    s->text[0] = '\0';
    s->text_len = 1;
    s->kind = kind;
    s->start_ns = to_ns(now);
    rng_fill(t, s->span_id, 8);
    if (parent) {
        memcpy(s->trace_id, parent->trace_id, 16);
        memcpy(s->parent_id, parent->span_id, 8);
        s->has_parent = true;
        s->flags = parent->flags;
        s->state_off = span_put(s, span_text(parent, parent->state_off));
    } else {
        bool use_parent = ctx && ctx->valid && (ctx->own || (!link && !t->set.link));
        if (use_parent) {
            memcpy(s->trace_id, ctx->trace_id, 16);
            memcpy(s->parent_id, ctx->span_id, 8);
            s->has_parent = true;
            s->state_off = span_put(s, ctx->state);
        } else {
            rng_fill(t, s->trace_id, 16);
            if (ctx && ctx->valid) {
                s->has_link = true;
                memcpy(s->link_trace_id, ctx->trace_id, 16);
                memcpy(s->link_span_id, ctx->span_id, 8);
                s->link_flags = ctx->flags;
                s->link_state_off = span_put(s, ctx->state);
            }
        }
        bool on =
            use_parent && t->set.parent_based ? (ctx->flags & 1) != 0 : sampled(t, s->trace_id);
        uint8_t flags = use_parent ? ctx->flags & FLAGS_KEPT : 0;
        if (!on) {
            t->stats.unsampled++;
            if (quiet) {
                /* Not recorded, still passed on: the trace, not sampled. */
                quiet->valid = true;
                memcpy(quiet->trace_id, s->trace_id, 16);
                memcpy(quiet->span_id, s->span_id, 8);
                quiet->flags = flags & ~1;
                if (use_parent)
                    memcpy(quiet->state, ctx->state, sizeof(quiet->state));
            }
            span_free(s);
            return NULL;
        }
        s->flags = flags | 1;
    }
    s->name_off = span_put(s, name);
    t->stats.spans_started++;
    return s;
}

struct span *span_start(struct tracer *t, const struct span *parent, const struct trace_ctx *ctx,
                        bool link, const char *name, enum trace_kind kind, double now)
{
    return span_start_ctx(t, parent, ctx, link, name, kind, now, NULL);
}

const char *span_tracestate(const struct span *s)
{
    return s ? span_text(s, s->state_off) : "";
}

void trace_ctx_child(struct tracer *t, const struct trace_ctx *c, char *out)
{
    uint8_t id[8];
    rng_fill(t, id, 8);
    memcpy(out, "00-", 3);
    hex_out(out + 3, c->trace_id, 16);
    out[35] = '-';
    hex_out(out + 36, id, 8);
    out[52] = '-';
    hex_out(out + 53, &c->flags, 1);
    out[55] = '\0';
}

static void attr_set(struct span *s, struct span_attr *a, const struct trace_kv *kv,
                     uint32_t (*put)(struct span *, const char *))
{
    a->key = kv->key;
    a->type = kv->type;
    switch (kv->type) {
    case TRACE_STR:
        a->s_off = put(s, kv->s);
        break;
    case TRACE_INT:
        a->i = kv->i;
        break;
    case TRACE_DOUBLE:
        a->d = kv->d;
        break;
    case TRACE_BOOL:
        a->b = kv->b;
        break;
    }
}

void span_set(struct span *s, const struct trace_kv *kv)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n_attrs; i++)
        if (strcmp(s->attrs[i].key, kv->key) == 0) {
            attr_set(s, &s->attrs[i], kv, span_put);
            return;
        }
    if (s->n_attrs == TRACE_ATTRS_MAX) {
        s->dropped_attrs++;
        return;
    }
    attr_set(s, &s->attrs[s->n_attrs++], kv, span_put);
}

void span_event(struct span *s, const char *name, double at, const struct trace_kv *kv, size_t n)
{
    if (!s)
        return;
    struct span_event *e;
    if (s->n_events == TRACE_EVENTS_MAX) {
        /* Full: the oldest of the last few gives way (counted). */
        s->dropped_events++;
        e = &s->events[TRACE_EVENTS_MAX - TRACE_EVENTS_TAIL + s->tail_next];
        s->tail_next = (uint8_t)((s->tail_next + 1) % TRACE_EVENTS_TAIL);
    } else {
        e = &s->events[s->n_events++];
    }
    e->time_ns = to_ns(at);
    e->name_off = span_put_shared(s, name);
    e->n_attrs = (uint8_t)(n < TRACE_EVENT_ATTRS_MAX ? n : TRACE_EVENT_ATTRS_MAX);
    for (size_t i = 0; i < e->n_attrs; i++)
        attr_set(s, &e->attrs[i], &kv[i], span_put_shared);
}

void span_set_error(struct span *s, const char *message)
{
    if (!s)
        return;
    s->error = true;
    s->error_off = span_put(s, message);
}

/* ---- export ---------------------------------------------------------- */

static void export_arm(struct tracer *t, double in)
{
    ev_timer_stop(t->loop, &t->export_w);
    ev_timer_set(&t->export_w, in > 0 ? in : 0., 0.);
    ev_timer_start(t->loop, &t->export_w);
}

static void batch_free(struct tracer *t)
{
    for (struct span *s = t->batch, *next; s; s = next) {
        next = s->next;
        span_free(s);
    }
    t->batch = NULL;
    t->batch_n = 0;
    free(t->body);
    t->body = NULL;
    t->body_len = 0;
    t->tries = 0;
}

static void export_start(struct tracer *t);

/* A batch is done with: the next export after `in` seconds, or, while
 * flushing, the next batch at once (the flush is over when none is left). */
static void export_next(struct tracer *t, double in)
{
    if (!t->flushed) {
        export_arm(t, in);
    } else if (t->head) {
        export_arm(t, 0);
    } else {
        void (*done)(void *) = t->flushed;
        t->flushed = NULL;
        ev_timer_stop(t->loop, &t->export_w);
        done(t->flushed_ud);
    }
}

void span_end(struct span *s, double now)
{
    if (!s)
        return;
    struct tracer *t = s->t;
    if (s->tail_next) {
        /* The tail back in the order its events came. */
        struct span_event tail[TRACE_EVENTS_TAIL],
            *from = s->events + TRACE_EVENTS_MAX - TRACE_EVENTS_TAIL;
        for (size_t i = 0; i < TRACE_EVENTS_TAIL; i++)
            tail[i] = from[(s->tail_next + i) % TRACE_EVENTS_TAIL];
        memcpy(from, tail, sizeof(tail));
        s->tail_next = 0;
    }
    s->end_ns = to_ns(now);
    if (s->end_ns < s->start_ns)
        s->end_ns = s->start_ns;
    if (!t->enabled || t->stats.queued >= t->set.max_queue) {
        t->stats.dropped_queue++;
        span_free(s);
        return;
    }
    s->next = NULL;
    if (t->tail)
        t->tail->next = s;
    else
        t->head = s;
    t->tail = s;
    t->stats.queued++;
    /* A full batch leaves at once (from the timer: never inside the
     * caller's own callback), unless one is already out. */
    if (t->stats.queued == t->set.max_batch && !t->batch)
        export_arm(t, 0);
}

static void export_on_done(struct attempt *a, const struct attempt_result *r, void *ud)
{
    struct tracer *t = ud;
    (void)a;

    t->attempt = NULL;
    int st = r->http_status;
    if (st >= 200 && st < 300) {
        int64_t rejected = otlp_rejected((const uint8_t *)r->body, r->body_len);
        if (rejected < 0 || (uint64_t)rejected > t->batch_n)
            rejected = 0;
        t->stats.exports_ok++;
        t->stats.spans_exported += t->batch_n - (uint64_t)rejected;
        t->stats.dropped_export += (uint64_t)rejected;
        batch_free(t);
        export_next(t, t->stats.queued >= t->set.max_batch ? 0 : t->set.interval_s);
        return;
    }
    /* OTLP/HTTP: 429, 502, 503 and 504 are retryable, and so is no answer
     * at all; every other status drops the batch. */
    bool retry = st == 0 || st == 429 || st == 502 || st == 503 || st == 504;
    t->stats.exports_failed++;
    log_at(LOG_DEBUG, "trace export failed", "status", LOG_I, (long long)st, "try", LOG_U,
           (unsigned long long)t->tries, "detail", LOG_S, r->detail, NULL);
    if (!retry || t->tries > t->set.max_retries || t->flushed) {
        log_at(LOG_WARN, "trace export dropped a batch", "spans", LOG_U,
               (unsigned long long)t->batch_n, "status", LOG_I, (long long)st, NULL);
        t->stats.dropped_export += t->batch_n;
        batch_free(t);
        export_next(t, t->set.interval_s);
        return;
    }
    double wait = BACKOFF_FIRST_S * (double)(1u << (t->tries - 1 < 5 ? t->tries - 1 : 5));
    if (wait > BACKOFF_MAX_S)
        wait = BACKOFF_MAX_S;
    if (r->outcome.retry_after_s >= 0)
        wait = r->outcome.retry_after_s < RETRY_AFTER_MAX_S ? r->outcome.retry_after_s
                                                            : RETRY_AFTER_MAX_S;
    t->stats.export_retries++;
    export_arm(t, wait);
}

static const struct attempt_hooks export_hooks = { NULL, export_on_done };

static void export_start(struct tracer *t)
{
    if (t->attempt)
        return;
    if (!t->batch) {
        if (!t->head) {
            export_next(t, t->set.interval_s);
            return;
        }
        /* Take up to max_batch spans off the queue. */
        struct span *last = t->head;
        size_t n = 1;
        while (n < t->set.max_batch && last->next) {
            last = last->next;
            n++;
        }
        t->batch = t->head;
        t->head = last->next;
        if (!t->head)
            t->tail = NULL;
        last->next = NULL;
        t->batch_n = n;
        t->stats.queued -= n;
        struct otlp_resource res = {
            .keys = (const char *const *)t->set.res_keys,
            .values = (const char *const *)t->set.res_vals,
            .n = t->set.n_res,
            .scope_name = "polygw",
            .scope_version = PGW_VERSION,
        };
        t->body = otlp_encode(&res, t->batch, n, &t->body_len);
        if (!t->body) {
            t->stats.dropped_export += n;
            batch_free(t);
            export_next(t, t->set.interval_s);
            return;
        }
    }
    char *copy = malloc(t->body_len);
    if (!copy) {
        export_arm(t, BACKOFF_FIRST_S);
        return;
    }
    memcpy(copy, t->body, t->body_len);
    double to = t->set.timeout_s;
    struct attempt_spec spec = {
        .url = t->set.endpoint,
        .headers = (const char *const *)t->set.headers,
        .body = copy,
        .body_len = t->body_len,
        .connect_timeout_s = to,
        .ttft_timeout_s = to,
        .idle_timeout_s = to,
        .timeout_s = to,
        .max_response_bytes = 65536,
        .raw = true,
    };
    t->tries++;
    t->attempt = attempt_start(t->up, &spec, &export_hooks, t);
    if (!t->attempt)
        export_arm(t, BACKOFF_FIRST_S);
}

static void export_on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    export_start(w->data);
}

/* ---- settings -------------------------------------------------------- */

static void settings_free(struct trace_settings *s)
{
    free(s->endpoint);
    for (size_t i = 0; i < s->n_res; i++) {
        free(s->res_keys[i]);
        free(s->res_vals[i]);
    }
    for (size_t i = 0; s->headers[i]; i++) {
        explicit_bzero(s->headers[i], strlen(s->headers[i]));
        free(s->headers[i]);
    }
    memset(s, 0, sizeof(*s));
}

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* Percent-decodes s[0..n) into a new string (W3C baggage octets, as the
 * OTEL_* lists are written), trimmed of spaces. */
static char *decode(const char *s, size_t n)
{
    while (n && isspace((unsigned char)*s))
        s++, n--;
    while (n && isspace((unsigned char)s[n - 1]))
        n--;
    char *out = malloc(n + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned b;
        if (s[i] == '%' && i + 2 < n && isxdigit((unsigned char)s[i + 1]) &&
            isxdigit((unsigned char)s[i + 2]) && sscanf(s + i + 1, "%2x", &b) == 1) {
            *o++ = (char)b;
            i += 2;
        } else {
            *o++ = s[i];
        }
    }
    *o = '\0';
    return out;
}

/* Splits "k=v,k2=v2" into the callback's pairs. Returns 0, or -1 when an
 * entry has no '=' or an empty key (`what` names the variable). An entry
 * the callback refuses (-1) is warned about by the variable's name and its
 * place in the list, never its text (a header's value is a secret). */
static int kv_list(const char *list, const char *what, char *err, size_t errlen,
                   int (*each)(void *ud, char *k, char *v), void *ud)
{
    const char *p = list;
    unsigned long long entry = 0;
    while (p && *p) {
        entry++;
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', n);
        if (n > 0 && strspn(p, " \t") < n) {
            char *k = eq ? decode(p, (size_t)(eq - p)) : NULL;
            if (!eq || !k || !*k) {
                free(k);
                snprintf(err, errlen, "%s: every entry must be key=value", what);
                return -1;
            }
            char *v = decode(eq + 1, n - (size_t)(eq + 1 - p));
            if (!v) {
                free(k);
                snprintf(err, errlen, "out of memory");
                return -1;
            }
            if (each(ud, k, v) < 0) {
                free(k);
                explicit_bzero(v, strlen(v));
                free(v);
                log_at(LOG_WARN, "OTEL_* list entry ignored (an invalid header name, or too many)",
                       "variable", LOG_S, what, "entry", LOG_U, entry, NULL);
            }
        }
        p = end ? end + 1 : NULL;
    }
    return 0;
}

/* Checks an entry only (the list is read for real if every one is well
 * formed). */
static int kv_check(void *ud, char *k, char *v)
{
    (void)ud;
    free(k);
    free(v);
    return 0;
}

static int add_resource(void *ud, char *k, char *v)
{
    struct trace_settings *s = ud;
    for (size_t i = 0; i < s->n_res; i++)
        if (strcmp(s->res_keys[i], k) == 0) {
            free(s->res_vals[i]);
            s->res_vals[i] = v;
            free(k);
            return 0;
        }
    if (s->n_res >= RESOURCE_MAX + 2)
        return -1;
    s->res_keys[s->n_res] = k;
    s->res_vals[s->n_res++] = v;
    return 0;
}

static int add_header(void *ud, char *k, char *v)
{
    struct trace_settings *s = ud;
    size_t i = 0;
    while (s->headers[i])
        i++;
    /* A name is an RFC 9110 token; a value has no line break. */
    static const char tchar[] = "!#$%&'*+-.^_`|~0123456789"
                                "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    if (i >= HEADERS_MAX + 1 || k[strspn(k, tchar)] || strpbrk(v, "\r\n"))
        return -1;
    size_t n = strlen(k) + strlen(v) + 3;
    char *line = malloc(n);
    if (!line)
        return -1;
    snprintf(line, n, "%s: %s", k, v);
    s->headers[i] = line;
    free(k);
    explicit_bzero(v, strlen(v));
    free(v);
    return 0;
}

/* Calls each(ud, entry) for every entry of the comma-separated `list`,
 * trimmed (an empty one skipped), in `buf` of `cap` bytes (a longer entry
 * is cut). */
static void list_each(const char *list, char *buf, size_t cap, void (*each)(void *ud, char *e),
                      void *ud)
{
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        while (n && isspace((unsigned char)*p))
            p++, n--;
        while (n && isspace((unsigned char)p[n - 1]))
            n--;
        if (n) {
            snprintf(buf, cap, "%.*s", (int)n, p);
            each(ud, buf);
        }
        p = end ? end + 1 : NULL;
    }
}

/* OTEL_TRACES_EXPORTER's entries: otlp, none, or another (warned about,
 * ignored: only OTLP is exported). */
struct exporters {
    int otlp, none;
};

static void exporter_each(void *ud, char *e)
{
    struct exporters *x = ud;
    if (strcasecmp(e, "otlp") == 0)
        x->otlp++;
    else if (strcasecmp(e, "none") == 0)
        x->none++;
    else
        log_at(LOG_WARN, "trace exporter not supported, ignored: polygw exports OTLP only",
               "variable", LOG_S, "OTEL_TRACES_EXPORTER", "exporter", LOG_S, e, NULL);
}

/* A boolean OTEL_* variable: "true" in any case, around spaces. */
static bool env_true(const char *name)
{
    const char *v = env(name);
    if (!v)
        return false;
    v += strspn(v, " \t");
    size_t n = strcspn(v, " \t");
    return n == 4 && strncasecmp(v, "true", 4) == 0 && v[n + strspn(v + n, " \t")] == '\0';
}

/* The variable of the environment that turns trace export off, or NULL:
 * OTEL_SDK_DISABLED=true, or OTEL_TRACES_EXPORTER naming none (and not
 * otlp). Warns about an exporter other than these. */
static const char *env_turns_off(void)
{
    if (env_true("OTEL_SDK_DISABLED"))
        return "OTEL_SDK_DISABLED";
    struct exporters x = { 0, 0 };
    char buf[64];
    list_each(env("OTEL_TRACES_EXPORTER"), buf, sizeof(buf), exporter_each, &x);
    return x.none && !x.otlp ? "OTEL_TRACES_EXPORTER" : NULL;
}

/* Warns about an OTLP protocol other than http/protobuf (the only one
 * sent): the traces variable wins over the general one. */
static void protocol_check(void)
{
    const char *name = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", *v = env(name);
    if (!v)
        v = env(name = "OTEL_EXPORTER_OTLP_PROTOCOL");
    if (v && strcmp(v, "http/protobuf") != 0)
        log_at(LOG_WARN, "OTLP protocol not supported, ignored: polygw sends http/protobuf",
               "variable", LOG_S, name, "protocol", LOG_S, v, NULL);
}

static bool is_http_url(const char *u)
{
    return strncasecmp(u, "http://", 7) == 0 || strncasecmp(u, "https://", 8) == 0;
}

static int settings_make(struct trace_settings *s, const struct config_tracing *ct, char *err,
                         size_t errlen)
{
    memset(s, 0, sizeof(*s));
    protocol_check();
    s->max_queue = ct->max_queue_spans;
    s->max_batch =
        ct->max_batch_spans < ct->max_queue_spans ? ct->max_batch_spans : ct->max_queue_spans;
    s->max_retries = ct->max_retries;
    s->interval_s = ct->export_interval_s;
    s->timeout_s = ct->timeout_s;
    s->link = ct->parent && strcmp(ct->parent, "link") == 0;
    s->parent_based = true;
    s->ratio = 1;

    /* The endpoint: the config's, else the traces variable (as is), else
     * the general one + /v1/traces. */
    const char *e, *from = "tracing.endpoint"; /* where it came from, for the error */
    if (ct->endpoint) {
        s->endpoint = strdup(ct->endpoint);
    } else if ((e = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))) {
        s->endpoint = strdup(e);
        from = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
    } else {
        e = env("OTEL_EXPORTER_OTLP_ENDPOINT");
        from = "OTEL_EXPORTER_OTLP_ENDPOINT";
        const char *base = e ? e : "http://localhost:4318";
        size_t n = strlen(base);
        while (n && base[n - 1] == '/')
            n--;
        if ((s->endpoint = malloc(n + sizeof("/v1/traces"))))
            snprintf(s->endpoint, n + sizeof("/v1/traces"), "%.*s/v1/traces", (int)n, base);
    }
    if (!s->endpoint) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (!is_http_url(s->endpoint) || strpbrk(s->endpoint, " \t\r\n")) {
        snprintf(err, errlen, "%s: the OTLP traces endpoint must be an http:// or https:// URL",
                 from);
        return -1;
    }
    s->timeout_s = ct->timeout_s > 0 ? ct->timeout_s : 10;
    if (!(ct->timeout_s > 0)) {
        const char *to = env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT");
        if (!to)
            to = env("OTEL_EXPORTER_OTLP_TIMEOUT");
        char *end;
        double ms = to ? strtod(to, &end) : 0;
        if (to && *end == '\0' && ms > 0 && ms <= 3600000)
            s->timeout_s = ms / 1000;
    }

    /* The sampler: OTEL_TRACES_SAMPLER's parent-based or not, its ratio;
     * the config's sampler_ratio wins over _ARG. */
    const char *smp = env("OTEL_TRACES_SAMPLER"), *arg = env("OTEL_TRACES_SAMPLER_ARG");
    double ratio = 1;
    if (smp) {
        const char *name = smp;
        if (strncmp(smp, "parentbased_", 12) == 0)
            smp += 12;
        else
            s->parent_based = false;
        if (strcmp(smp, "always_off") == 0) {
            ratio = 0;
        } else if (strcmp(smp, "traceidratio") == 0 && arg) {
            char *end;
            double r = strtod(arg, &end);
            if (*end == '\0' && r >= 0 && r <= 1)
                ratio = r;
            else
                log_at(LOG_WARN, "OTEL_TRACES_SAMPLER_ARG is not a ratio from 0 to 1, ignored: 1",
                       "value", LOG_S, arg, NULL);
        } else if (strcmp(smp, "always_on") != 0 && strcmp(smp, "traceidratio") != 0) {
            s->parent_based = true; /* an unknown sampler: the default */
            log_at(LOG_WARN, "OTEL_TRACES_SAMPLER unknown, ignored: parentbased_always_on", "value",
                   LOG_S, name, NULL);
        }
    }
    s->ratio = ct->sampler_ratio >= 0 ? ct->sampler_ratio : ratio;
    s->ratio_bound = trace_ratio_bound(s->ratio);

    /* The resource: service.name, then OTEL_RESOURCE_ATTRIBUTES (which may
     * not rename the service when the config or OTEL_SERVICE_NAME does). */
    const char *svc = ct->service_name ? ct->service_name : env("OTEL_SERVICE_NAME");
    char *k = strdup("service.name"), *v = strdup(svc ? svc : "polygw");
    char *k2 = strdup("service.version"), *v2 = strdup(PGW_VERSION);
    if (!k || !v || !k2 || !v2) {
        free(k), free(v), free(k2), free(v2);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    add_resource(s, k, v);
    add_resource(s, k2, v2);
    /* A malformed list is discarded whole, with a warning (the resource
     * spec): often set pod-wide, it never stops the start. */
    const char *ra = env("OTEL_RESOURCE_ATTRIBUTES");
    char why[128];
    if (ra && kv_list(ra, "OTEL_RESOURCE_ATTRIBUTES", why, sizeof(why), kv_check, NULL) < 0)
        log_at(LOG_WARN, "OTEL_RESOURCE_ATTRIBUTES discarded", "error", LOG_S, why, NULL);
    else if (ra && kv_list(ra, "OTEL_RESOURCE_ATTRIBUTES", err, errlen, add_resource, s) < 0)
        return -1;
    if (svc && s->n_res && strcmp(s->res_vals[0], svc) != 0) {
        free(s->res_vals[0]);
        if (!(s->res_vals[0] = strdup(svc))) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    }

    if (!(s->headers[0] = strdup("Content-Type: application/x-protobuf"))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const char *hname = "OTEL_EXPORTER_OTLP_TRACES_HEADERS", *h = env(hname);
    if (!h)
        h = env(hname = "OTEL_EXPORTER_OTLP_HEADERS");
    if (h && kv_list(h, hname, err, errlen, add_header, s) < 0)
        return -1;
    return 0;
}

/* The settings in force for `ct` into *s (zeroed when off); *on: tracing
 * is on (the config's enabled, unless the environment turns it off).
 * Returns 0, or -1 with `err` (a malformed variable). */
static int settings_load(struct trace_settings *s, const struct config_tracing *ct, bool *on,
                         char *err, size_t errlen)
{
    const char *off = ct->enabled ? env_turns_off() : NULL;
    memset(s, 0, sizeof(*s));
    *on = ct->enabled && !off;
    if (off)
        log_at(LOG_INFO, "tracing is off: the environment turns trace export off", "variable",
               LOG_S, off, NULL);
    if (*on && settings_make(s, ct, err, errlen) < 0) {
        settings_free(s);
        return -1;
    }
    return 0;
}

/* ---- the tracer ------------------------------------------------------ */

static void tracer_apply(struct tracer *t, struct trace_settings *s, bool enabled)
{
    if (t->attempt) {
        /* Sent again, at once, with the new settings. */
        attempt_cancel(t->attempt);
        t->attempt = NULL;
        if (t->tries)
            t->tries--;
    }
    settings_free(&t->set);
    t->set = *s;
    t->enabled = enabled;
    if (!enabled) {
        /* Off: what was waiting is dropped, counted. */
        t->stats.dropped_queue += t->stats.queued + t->batch_n;
        for (struct span *p = t->head, *next; p; p = next) {
            next = p->next;
            span_free(p);
        }
        t->head = t->tail = NULL;
        t->stats.queued = 0;
        batch_free(t);
        ev_timer_stop(t->loop, &t->export_w);
        return;
    }
    export_arm(t, t->batch ? 0 : t->set.interval_s);
}

struct tracer *tracer_new(struct ev_loop *loop, struct upstream *up,
                          const struct config_tracing *ct, char *err, size_t errlen)
{
    struct tracer *t = calloc(1, sizeof(*t));
    struct trace_settings s;

    bool on;

    if (!t) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (settings_load(&s, ct, &on, err, errlen) < 0) {
        free(t);
        return NULL;
    }
    t->loop = loop;
    t->up = up;
    if (getrandom(t->rng, sizeof(t->rng), 0) != (ssize_t)sizeof(t->rng) ||
        (t->rng[0] | t->rng[1]) == 0) {
        t->rng[0] = (uint64_t)(ev_time() * 1e9) ^ 0x9e3779b97f4a7c15ull;
        t->rng[1] = (uint64_t)getpid() * 0xbf58476d1ce4e5b9ull | 1;
    }
    ev_init(&t->export_w, export_on_timer);
    t->export_w.data = t;
    tracer_apply(t, &s, on);
    return t;
}

int tracer_reconf(struct tracer *t, const struct config_tracing *ct, char *err, size_t errlen)
{
    struct trace_settings s;
    bool on;

    if (settings_load(&s, ct, &on, err, errlen) < 0)
        return -1;
    tracer_apply(t, &s, on);
    return 0;
}

void tracer_free(struct tracer *t)
{
    if (!t)
        return;
    struct trace_settings none;
    memset(&none, 0, sizeof(none));
    tracer_apply(t, &none, false);
    free(t);
}

int tracer_flush(struct tracer *t, void (*done)(void *ud), void *ud)
{
    if (!t || !t->enabled || (!t->head && !t->batch && !t->attempt))
        return 0;
    t->flushed = done;
    t->flushed_ud = ud;
    if (!t->attempt)
        export_arm(t, 0); /* a batch waiting for its retry goes now */
    return 1;
}

const struct trace_stats *tracer_stats(const struct tracer *t)
{
    return &t->stats;
}

bool tracer_is_enabled(const struct tracer *t)
{
    return t && t->enabled;
}

const struct span *tracer_queue_head(const struct tracer *t)
{
    return t->head;
}
