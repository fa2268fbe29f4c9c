/*
 * calltrace.c — a call's spans, attributes and events (calltrace.h).
 */
#include "call/calltrace.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gov.h"
#include "codec/dialect.h"
#include "codec/jscan.h"
#include "core/config.h"
#include "trace/trace.h"
#include "upstream/upstream.h"

/* gen_ai.operation.name for a capability: the GenAI conventions' names
 * for the built-in ones, else the capability's own name. */
static const char *operation(const char *capability)
{
    if (strcmp(capability, "chat") == 0 || strcmp(capability, "responses") == 0)
        return "chat";
    if (strcmp(capability, "embedding") == 0 || strcmp(capability, "embeddings") == 0)
        return "embeddings";
    return NULL;
}

/* gen_ai.provider.name by the source's kind: Vertex AI whatever model
 * family it serves (its kind is then gemini or anthropic). */
static const char *provider(const struct config_source *src)
{
    if (src->vertex.on)
        return "gcp.vertex_ai";
    switch (src->kind) {
    case DIALECT_AZURE:
        return "azure.ai.openai";
    case DIALECT_ANTHROPIC:
        return "anthropic";
    case DIALECT_GEMINI:
        return "gcp.gemini";
    case DIALECT_BEDROCK:
        return "aws.bedrock";
    default:
        return "openai";
    }
}

/* The host of `url` (server.address: without user info, port or an IPv6
 * literal's brackets) and its port (server.port: the URL's, else its
 * scheme's default; 0 when neither is known). */
static void url_host(const char *url, char *out, size_t cap, long *port)
{
    const char *p = strstr(url, "://");
    *port = p && (size_t)(p - url) == 5 && strncasecmp(url, "https", 5) == 0 ? 443
        : p && (size_t)(p - url) == 4 && strncasecmp(url, "http", 4) == 0    ? 80
                                                                             : 0;
    p = p ? p + 3 : url;
    size_t n = strcspn(p, "/?#");
    const char *at = memchr(p, '@', n);
    if (at) {
        n -= (size_t)(at + 1 - p);
        p = at + 1;
    }
    bool v6 = *p == '[';
    size_t h = v6 ? strcspn(p, "]") + 1 : strcspn(p, ":/?#");
    if (h > n)
        h = n;
    if (h < n && p[h] == ':') {
        char *end;
        long v = strtol(p + h + 1, &end, 10);
        if (end > p + h + 1 && v > 0 && v <= 65535)
            *port = v;
    }
    if (v6 && h >= 2 && p[h - 1] == ']') { /* the address alone */
        p++;
        h -= 2;
    }
    if (h >= cap)
        h = cap - 1;
    memcpy(out, p, h);
    out[h] = '\0';
}

void calltrace_begin(struct calltrace *ct, struct tracer *t, const struct calltrace_start *s,
                     double now)
{
    struct trace_ctx ctx;

    memset(ct, 0, sizeof(*ct));
    if (!tracer_is_enabled(t))
        return;
    if (trace_ctx_parse(&ctx, s->traceparent, s->tracestate) < 0 && s->task_trace &&
        trace_ctx_parse(&ctx, s->task_trace, s->task_tracestate) == 0)
        ctx.own = true; /* a child of its task's run, whatever tracing.parent says */
    const char *op = operation(s->capability);
    snprintf(ct->op, sizeof(ct->op), "%s", op ? op : s->capability);
    if (s->model && s->model_len < sizeof(ct->model)) {
        memcpy(ct->model, s->model, s->model_len);
        ct->model[s->model_len] = '\0';
    }
    char name[192];
    snprintf(name, sizeof(name), "%s%s%s", ct->op, ct->model[0] ? " " : "", ct->model);
    ct->call = span_start_ctx(t, NULL, &ctx, false, name, TRACE_SERVER, now, &ct->quiet);
    if (!ct->call) {
        ct->tracer = t;
        return;
    }
    span_set(ct->call, &TKV_S("gen_ai.operation.name", ct->op));
    if (ct->model[0])
        span_set(ct->call, &TKV_S("gen_ai.request.model", ct->model));
    span_set(ct->call, &TKV_S("polygw.capability", s->capability));
    span_set(ct->call, &TKV_S("polygw.app", s->app));
    if (s->task_id)
        span_set(ct->call, &TKV_S("polygw.task_id", s->task_id));
    span_set(ct->call, &TKV_B("polygw.stream", s->stream));
    span_set(ct->call, &TKV_S("polygw.front", s->http ? "http" : "msgpack"));
}

/* Closes the open wait as its event: at the wait's start, with how long it
 * lasted. */
static void wait_close(struct calltrace *ct, double now)
{
    if (!ct->wait)
        return;
    struct trace_kv kv[2] = { TKV_D("polygw.duration_s", now - ct->wait_from) };
    size_t n = 1;
    if (ct->wait_reason)
        kv[n++] = TKV_S("polygw.reason", ct->wait_reason);
    span_event(ct->call, ct->wait, ct->wait_from, kv, n);
    ct->wait = NULL;
    ct->wait_reason = NULL;
}

void calltrace_wait(struct calltrace *ct, const struct gov_call *g,
                    const struct attempt_result *last, double now)
{
    if (!ct->call)
        return;
    const char *name, *reason = NULL;
    (void)last;
    if (g->state == GOV_CALL_BACKOFF) {
        name = "polygw.backoff";
    } else if (g->waits_permit) {
        name = "polygw.permit_wait";
    } else if (g->waits_app) {
        name = "polygw.app_limit_wait";
    } else if (g->waits_age) {
        name = "polygw.progress_wait";
    } else {
        /* Rate and token buckets, the pacer, a breaker open on every
         * source, a Retry-After still held by a source. */
        name = "polygw.source_wait";
        reason = "limits";
        for (size_t i = 0; g->notes && i < g->gov->n_sources; i++)
            if (g->notes[i].retry_at > now)
                reason = "retry_after"; /* a source this call may use holds it off */
    }
    if (ct->wait == name && ct->wait_reason == reason)
        return; /* the same wait goes on (a wake-up found nothing free) */
    wait_close(ct, now);
    ct->wait = name;
    ct->wait_reason = reason;
    ct->wait_from = now;
}

/* The sources of the call's capability that their open breaker keeps out
 * of this pick, each told once. */
static void breaker_skips(struct calltrace *ct, const struct gov_call *g, double now)
{
    const struct gov *gv = g->gov;
    for (size_t i = 0; i < gv->n_sources && i < 64; i++) {
        const struct gov_source *s = &gv->sources[i];
        if (s->p.capability != g->capability || s->p.retired ||
            (g->notes && g->notes[i].excluded) || s->breaker.state != BREAKER_OPEN ||
            (ct->breaker_told & (1ull << i)))
            continue;
        ct->breaker_told |= 1ull << i;
        struct trace_kv kv[2] = { TKV_S("polygw.source", s->p.name),
                                  TKV_D("polygw.cooldown_s", s->breaker.cooldown_s) };
        span_event(ct->call, "polygw.breaker_skip", now, kv, 2);
    }
}

/* ct->tp_line (its traceparent written) with the tracestate line `state`
 * after it ("" = none): W3C asks for it to be passed on as received. */
static const char *with_state(struct calltrace *ct, const char *state)
{
    if (state[0])
        snprintf(ct->tp_line + 68, sizeof(ct->tp_line) - 68, "\r\ntracestate: %s", state);
    return ct->tp_line;
}

const char *calltrace_attempt(struct calltrace *ct, const struct gov_call *g,
                              const struct config_source *src, double now)
{
    if (!ct->call) {
        if (!ct->quiet.valid)
            return NULL;
        memcpy(ct->tp_line, "traceparent: ", 13);
        trace_ctx_child(ct->tracer, &ct->quiet, ct->tp_line + 13);
        return with_state(ct, ct->quiet.state);
    }
    uint32_t attempt_no = g->attempts;
    wait_close(ct, now);
    breaker_skips(ct, g, now);
    if (ct->last_source && strcmp(ct->last_source, src->name) != 0) {
        struct trace_kv kv[2] = { TKV_S("polygw.from", ct->last_source),
                                  TKV_S("polygw.to", src->name) };
        span_event(ct->call, "polygw.failover", now, kv, 2);
    }
    ct->last_source = src->name;
    ct->resp_model[0] = '\0';
    if (ct->attempt) /* never left open; a safeguard */
        span_end(ct->attempt, now);
    char name[192];
    const char *m = src->model ? src->model : ct->model[0] ? ct->model : NULL;
    /* "{operation} {model}", or the operation alone without a model. */
    snprintf(name, sizeof(name), "%s%s%s", ct->op, m ? " " : "", m ? m : "");
    struct span *a = ct->attempt = span_start(NULL, ct->call, NULL, false, name, TRACE_CLIENT, now);
    if (!a)
        return NULL;
    char host[256];
    long port;
    url_host(src->base_url, host, sizeof(host), &port);
    span_set(a, &TKV_S("gen_ai.operation.name", ct->op));
    /* gen_ai.system, the older name, with its older value for Azure. */
    const char *prov = provider(src);
    span_set(a, &TKV_S("gen_ai.provider.name", prov));
    span_set(a, &TKV_S("gen_ai.system", strcmp(prov, "azure.ai.openai") ? prov : "az.ai.openai"));
    if (m)
        span_set(a, &TKV_S("gen_ai.request.model", m));
    span_set(a, &TKV_S("server.address", host));
    if (port)
        span_set(a, &TKV_I("server.port", port));
    span_set(a, &TKV_S("polygw.source", src->name));
    span_set(a, &TKV_I("polygw.attempt", attempt_no));

    /* This attempt's own traceparent upstream, and the call's tracestate. */
    memcpy(ct->tp_line, "traceparent: ", 13);
    span_traceparent(a, ct->tp_line + 13);
    return with_state(ct, span_tracestate(a));
}

/* A member naming the model: copied into ct->resp_model (a name too long,
 * or holding a NUL, is left out); 1 stops the walk. */
static int model_member(void *ud, const char *key, const struct jscan_value *v)
{
    struct calltrace *ct = ud;
    if (v->type == JSCAN_OBJECT && (strcmp(key, "message") == 0 || strcmp(key, "response") == 0))
        return jscan_object(v->p, v->len, model_member, ct, NULL) == 1;
    if (v->type != JSCAN_STRING || (strcmp(key, "model") != 0 && strcmp(key, "modelVersion") != 0))
        return 0;
    long n = jscan_string(v, ct->resp_model, sizeof(ct->resp_model) - 1);
    if (n <= 0 || memchr(ct->resp_model, '\0', (size_t)n)) {
        ct->resp_model[0] = '\0';
        return 0;
    }
    return 1;
}

void calltrace_response_model(struct calltrace *ct, const char *p, size_t len)
{
    if (!ct->attempt || ct->resp_model[0] || !p)
        return;
    jscan_object(p, len, model_member, ct, NULL);
}

void calltrace_attempt_end(struct calltrace *ct, const struct attempt_result *r,
                           const struct dialect_usage *u, double now)
{
    struct span *a = ct->attempt;
    if (!a)
        return;
    ct->attempt = NULL;
    double start = now - r->elapsed_s;
    if (r->ttft_s >= 0)
        span_event(a, "polygw.first_byte", start + r->ttft_s, &TKV_D("polygw.ttft_s", r->ttft_s),
                   1);
    if (r->http_status)
        span_set(a, &TKV_I("http.response.status_code", r->http_status));
    if (ct->resp_model[0]) {
        span_set(a, &TKV_S("gen_ai.response.model", ct->resp_model));
        if (r->outcome.kind == OUTCOME_SUCCESS)
            memcpy(ct->call_model, ct->resp_model, sizeof(ct->call_model));
    }
    span_set(a, &TKV_S("polygw.outcome", outcome_kind_name(r->outcome.kind)));
    if (r->outcome.retry_after_s >= 0) {
        /* Honoured: the source is held off this long (docs/DESIGN.md §3.4). */
        span_set(a, &TKV_D("polygw.retry_after_s", r->outcome.retry_after_s));
        struct trace_kv kv[2] = { TKV_D("polygw.retry_after_s", r->outcome.retry_after_s),
                                  TKV_S("polygw.source", ct->last_source) };
        span_event(ct->call, "polygw.retry_after", now, kv, 2);
    }
    if (u && r->outcome.kind == OUTCOME_SUCCESS && !u->bogus) {
        if (u->prompt >= 0)
            span_set(a, &TKV_I("gen_ai.usage.input_tokens", u->prompt));
        if (u->completion >= 0)
            span_set(a, &TKV_I("gen_ai.usage.output_tokens", u->completion));
        if (u->cached >= 0)
            span_set(a, &TKV_I("gen_ai.usage.cache_read.input_tokens", u->cached));
        if (u->cache_write >= 0)
            span_set(a, &TKV_I("gen_ai.usage.cache_creation.input_tokens", u->cache_write));
        if (u->reasoning >= 0)
            span_set(a, &TKV_I("gen_ai.usage.reasoning.output_tokens", u->reasoning));
    }
    if (r->outcome.kind != OUTCOME_SUCCESS) {
        const char *why = outcome_reason_name(r->outcome.reason);
        span_set(a, &TKV_S("error.type", why));
        span_set(a, &TKV_S("polygw.phase", attempt_phase_name(r->phase)));
        span_set_error(a, why);
    }
    span_end(a, now);
}

void calltrace_note(struct calltrace *ct, const char *event, const char *reason, double now)
{
    if (!ct->call)
        return;
    wait_close(ct, now);
    span_event(ct->call, event, now, &TKV_S("polygw.reason", reason ? reason : ""), reason ? 1 : 0);
}

void calltrace_end(struct calltrace *ct, enum pgw_code code, const char *source, uint32_t attempts,
                   double stalled_s, double cost, double now)
{
    if (ct->call) {
        wait_close(ct, now);
        if (ct->attempt) {
            /* The call ended while its attempt ran: cancelled with it. */
            span_set(ct->attempt, &TKV_S("error.type", "cancelled"));
            span_set_error(ct->attempt, "cancelled");
            span_end(ct->attempt, now);
            ct->attempt = NULL;
        }
        const char *name = pgw_code_name(code);
        if (code == PGW_STALLED)
            span_event(ct->call, "polygw.stall_verdict", now, &TKV_D("polygw.stalled_s", stalled_s),
                       1);
        span_set(ct->call, &TKV_S("polygw.code", name));
        span_set(ct->call, &TKV_I("polygw.attempts", attempts));
        span_set(ct->call, &TKV_D("polygw.stalled_s", stalled_s));
        if (source)
            span_set(ct->call, &TKV_S("polygw.source", source));
        if (ct->call_model[0])
            span_set(ct->call, &TKV_S("gen_ai.response.model", ct->call_model));
        if (isfinite(cost))
            span_set(ct->call, &TKV_D("polygw.cost", cost));
        if (code != PGW_OK) {
            span_set(ct->call, &TKV_S("error.type", name));
            span_set_error(ct->call, name);
        }
        span_end(ct->call, now);
        ct->call = NULL;
    }
}
