/*
 * callrpc.c — `call` over msgpack-RPC (see callrpc.h). The sink packs
 * straight into its connection's write queue; a stream's chunk is flushed
 * at once, and the upstream is paused while the queue holds more than
 * max_write_queue_bytes.
 */
#include "callrpc.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "call/call.h"
#include "call/rawcall.h"
#include "task.h"

static struct conn *sink_conn(struct call_sink *s)
{
    return (struct conn *)((char *)s - offsetof(struct conn, sink));
}

/* Appends pre-packed msgpack bytes to a packer. */
static void pack_raw(msgpack_packer *pk, const char *data, size_t len)
{
    pk->callback(pk->data, data, len);
}

static int rpc_on_chunk(struct call_sink *s, uint32_t id, const struct call_info *ci,
                        const char *json, size_t json_len, const char *mp, size_t mp_len)
{
    struct conn *c = sink_conn(s);
    (void)json;
    (void)json_len;

    rpc_pack_notify_begin(&c->pk, "chunk");
    msgpack_pack_array(&c->pk, ci->event_names ? 3 : 2);
    msgpack_pack_uint32(&c->pk, id);
    pack_raw(&c->pk, mp, mp_len);
    if (ci->event_names) { /* [msgid, event, name]: asked for (PROTOCOL.md 5.1) */
        if (ci->event)
            rpc_pack_str(&c->pk, ci->event);
        else
            msgpack_pack_nil(&c->pk);
    }
    /* The flush may find the client gone: conn_close() then aborts every
     * call of the connection. `c` itself is freed later, by the reaper. */
    conn_flush(c);
    if (c->closed)
        return -1;
    return strbuf_live(&c->out) > c->srv->cfg->max_write_queue_bytes ? 1 : 0;
}

static void rpc_on_result(struct call_sink *s, uint32_t id, const struct call_info *ci,
                          const struct call_body *b)
{
    struct conn *c = sink_conn(s);
    msgpack_packer *pk = &c->pk;

    rpc_pack_result_begin(pk, id);
    bool cost = cost_is_known(ci->cost);

    msgpack_pack_map(pk,
                     4 + (b->mp ? 1 : 0) + (b->usage ? 1 : 0) + (b->raw ? 3 : 0) + (cost ? 1 : 0) +
                         (ci->cache ? 1 : 0));
    if (b->raw) {
        /* A passthrough's answer: its bytes, type and status (rawcall.h). */
        rpc_pack_str(pk, "body");
        msgpack_pack_bin(pk, b->json_len);
        msgpack_pack_bin_body(pk, b->json, b->json_len);
        rpc_pack_kv_str(pk, "content_type", b->content_type ? b->content_type : "");
        rpc_pack_str(pk, "status");
        msgpack_pack_int(pk, b->status);
    }
    if (b->mp) {
        rpc_pack_str(pk, "body");
        pack_raw(pk, b->mp, b->mp_len);
    }
    rpc_pack_kv_str(pk, "source", ci->source);
    rpc_pack_str(pk, "attempts");
    msgpack_pack_uint32(pk, ci->attempts);
    rpc_pack_kv_double(pk, "elapsed_s", ci->elapsed_s);
    rpc_pack_kv_double(pk, "stalled_s", ci->stalled_s);
    if (b->usage) {
        rpc_pack_str(pk, "usage");
        pack_raw(pk, b->usage, b->usage_len);
    }
    if (cost)
        rpc_pack_kv_double(pk, "cost", ci->cost);
    if (ci->cache)
        rpc_pack_kv_str(pk, "cache", ci->cache); /* the response cache's verdict */
    conn_response_done(c, PGW_OK);
}

static void rpc_on_error(struct call_sink *s, uint32_t id, const struct reply_error *e)
{
    conn_reply_error_of(sink_conn(s), id, e);
}

static void rpc_flush(struct call_sink *s)
{
    conn_flush(sink_conn(s));
}

static const struct call_sink_ops rpc_sink_ops = {
    .on_chunk = rpc_on_chunk,
    .on_result = rpc_on_result,
    .on_error = rpc_on_error,
    .flush = rpc_flush,
    .wants_msgpack = true,
};

void callrpc_sink_init(struct call_sink *s, struct server *srv, struct upstream_budget *budget)
{
    memset(s, 0, sizeof(*s));
    s->ops = &rpc_sink_ops;
    s->srv = srv;
    s->budget = budget;
}

/* max_tokens / max_completion_tokens (the Responses API's
 * max_output_tokens) of the body, 0 when absent. */
static uint64_t body_max_tokens(const msgpack_object *body)
{
    const msgpack_object *m = rpc_map_get(body, "max_completion_tokens");
    if (!m)
        m = rpc_map_get(body, "max_tokens");
    if (!m)
        m = rpc_map_get(body, "max_output_tokens");
    return m && m->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? m->via.u64 : 0;
}

#define RAW_CTYPE_MAX  255  /* a passthrough's content_type, as the HTTP front's */
#define RAW_SUFFIX_MAX 2048 /* its path_suffix, as the HTTP front's request target */

/* The passthrough parameters of a call: `on` when its body is bin. */
struct raw_req {
    bool on;
    char ctype[RAW_CTYPE_MAX + 1]; /* "" = none */
    const char *method;            /* static, NULL = POST */
    char *suffix;                  /* owned, NULL = none */
};

/* Reads them (the str parameters are not NUL-terminated): -1 with `why`
 * when one is wrong, or given with a map body. */
static int raw_req_bind(struct raw_req *q, const msgpack_object *body, const msgpack_object *ctype,
                        const msgpack_object *method, const msgpack_object *suffix, char *why,
                        size_t whylen)
{
    memset(q, 0, sizeof(*q));
    q->on = body->type == MSGPACK_OBJECT_BIN;
    if (!q->on) {
        if (ctype || method || suffix)
            snprintf(why, whylen, "content_type, method and path_suffix go with a bin body only");
        return ctype || method || suffix ? -1 : 0;
    }
    if (ctype) {
        const char *s = ctype->via.str.ptr;
        size_t n = ctype->via.str.size;
        for (size_t i = 0; i < n; i++)
            if (s[i] < ' ' || s[i] > '~')
                n = SIZE_MAX;
        if (n == 0 || n > RAW_CTYPE_MAX) {
            snprintf(why, whylen, "parameter 'content_type': 1 to %d printable ASCII characters",
                     RAW_CTYPE_MAX);
            return -1;
        }
        memcpy(q->ctype, s, n);
        q->ctype[n] = '\0';
    }
    if (method && !(q->method = raw_call_method(method->via.str.ptr, method->via.str.size))) {
        snprintf(why, whylen, "parameter 'method': expected GET, POST or DELETE");
        return -1;
    }
    if (suffix) {
        const char *bad = raw_call_suffix_problem(suffix->via.str.ptr, suffix->via.str.size);
        if (bad || suffix->via.str.size > RAW_SUFFIX_MAX) {
            snprintf(why, whylen, "parameter 'path_suffix': %s",
                     bad ? bad : "longer than 2048 bytes");
            return -1;
        }
        if (!(q->suffix = strndup(suffix->via.str.ptr, suffix->via.str.size))) {
            snprintf(why, whylen, "out of memory");
            return -1;
        }
    }
    return 0;
}

int callrpc_trace_param(const msgpack_object *m, char *tp, char *ts, char *why, size_t whylen)
{
    const msgpack_object *v[2] = { rpc_map_get(m, "traceparent"), rpc_map_get(m, "tracestate") };
    char *out[2] = { tp, ts };
    size_t cap[2] = { 64, 257 };

    for (int i = 0; i < 2; i++) {
        out[i][0] = '\0';
        if (!v[i] || v[i]->type == MSGPACK_OBJECT_NIL)
            continue;
        if (v[i]->type != MSGPACK_OBJECT_STR) {
            snprintf(why, whylen, "parameter 'trace': %s must be a string",
                     i ? "tracestate" : "traceparent");
            return -1;
        }
        size_t n = v[i]->via.str.size;
        if (n < cap[i] && !memchr(v[i]->via.str.ptr, '\0', n)) {
            memcpy(out[i], v[i]->via.str.ptr, n);
            out[i][n] = '\0';
        }
    }
    return 0;
}

void callrpc_start(struct conn *c, const struct rpc_msg *m)
{
    enum {
        P_CAP,
        P_BODY,
        P_STREAM,
        P_SCOPE,
        P_TASK,
        P_DEADLINE,
        P_APP,
        P_MODEL,
        P_CTYPE,
        P_METHOD,
        P_SUFFIX,
        P_TRACE,
        P_CACHE,
        P_EVENT_NAMES,
        P_N
    };
    static const struct rpc_param spec[P_N] = {
        [P_CAP] = { "capability", RPC_T_STR, true },
        [P_BODY] = { "body", RPC_T_MAP | RPC_T_BIN, true },
        /* A passthrough (body: bin, rawcall.h). */
        [P_CTYPE] = { "content_type", RPC_T_STR | RPC_T_NIL, false },
        [P_METHOD] = { "method", RPC_T_STR | RPC_T_NIL, false },
        [P_SUFFIX] = { "path_suffix", RPC_T_STR | RPC_T_NIL, false },
        [P_STREAM] = { "stream", RPC_T_BOOL | RPC_T_NIL, false },
        [P_SCOPE] = { "scope", RPC_T_STR | RPC_T_NIL, false },
        [P_TASK] = { "task_id", RPC_T_STR | RPC_T_NIL, false },
        [P_DEADLINE] = { "deadline_s", RPC_T_NUMBER | RPC_T_NIL, false },
        [P_APP] = { "app", RPC_T_STR | RPC_T_NIL, false },
        [P_MODEL] = { "model", RPC_T_STR | RPC_T_NIL, false },
        /* The W3C trace context carrier {traceparent, tracestate}. */
        [P_TRACE] = { "trace", RPC_T_MAP | RPC_T_NIL, false },
        [P_CACHE] = { "cache", RPC_T_STR | RPC_T_NIL, false },
        [P_EVENT_NAMES] = { "event_names", RPC_T_BOOL | RPC_T_NIL, false },
    };
    const msgpack_object *p[P_N];
    char why[300], scope[CONFIG_NAME_MAX * 4], id[TASK_ID_MAX + 1];
    double deadline_s = 0;

    if (rpc_bind(m->params, spec, P_N, p, why, sizeof(why)) < 0) {
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST, why);
        return;
    }
    if (p[P_DEADLINE] &&
        (!rpc_as_double(p[P_DEADLINE], &deadline_s) || !(deadline_s > 0) ||
         !isfinite(deadline_s))) {
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST,
                         "parameter 'deadline_s': expected a positive number of seconds");
        return;
    }
    /* The identifiers, checked as the HTTP front checks its own. */
    if (rpc_check_ident("parameter 'capability'", p[P_CAP]->via.str.ptr, p[P_CAP]->via.str.size,
                        CONFIG_NAME_MAX - 1, why, sizeof(why)) < 0 ||
        (p[P_SCOPE] &&
         rpc_ident_copy("parameter 'scope'", p[P_SCOPE], scope, sizeof(scope), why, sizeof(why)) <
             0) ||
        (p[P_TASK] &&
         rpc_ident_copy("parameter 'task_id'", p[P_TASK], id, sizeof(id), why, sizeof(why)) < 0)) {
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST, why);
        return;
    }
    const struct config_app *app = conn_app(c);
    if (p[P_APP] &&
        !(app = conn_declare_app(c, p[P_APP]->via.str.ptr, p[P_APP]->via.str.size, why,
                                 sizeof(why)))) {
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST, why);
        return;
    }
    char tp[64], ts[257];
    if (p[P_TRACE] && callrpc_trace_param(p[P_TRACE], tp, ts, why, sizeof(why)) < 0) {
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST, why);
        return;
    }
    struct raw_req raw;
    if (raw_req_bind(&raw, p[P_BODY], p[P_CTYPE], p[P_METHOD], p[P_SUFFIX], why, sizeof(why)) < 0) {
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST, why);
        free(raw.suffix);
        return;
    }
    struct call_req r = {
        .app = app,
        .raw = raw.on,
        .raw_body = raw.on ? p[P_BODY]->via.bin.ptr : NULL,
        .raw_len = raw.on ? p[P_BODY]->via.bin.size : 0,
        .content_type = raw.ctype[0] ? raw.ctype : NULL,
        .method = raw.method,
        .path_suffix = raw.suffix,
        .capability = p[P_CAP]->via.str.ptr,
        .capability_len = p[P_CAP]->via.str.size,
        .mp = raw.on ? NULL : p[P_BODY],
        .stream = p[P_STREAM] && p[P_STREAM]->via.boolean,
        .scope = p[P_SCOPE] ? scope : NULL,
        .task_id = p[P_TASK] ? id : NULL,
        .deadline_s = deadline_s,
        .max_tokens = raw.on ? 0 : body_max_tokens(p[P_BODY]),
        .traceparent = p[P_TRACE] && tp[0] ? tp : NULL,
        .tracestate = p[P_TRACE] && ts[0] ? ts : NULL,
        .event_names = p[P_EVENT_NAMES] && p[P_EVENT_NAMES]->via.boolean,
    };
    /* The model asked for: the parameter, else the body's. */
    const msgpack_object *model = p[P_MODEL] ? p[P_MODEL]
        : raw.on                             ? NULL
                                             : rpc_map_get(p[P_BODY], "model");
    if (model && model->type == MSGPACK_OBJECT_STR) {
        r.model = model->via.str.ptr;
        r.model_len = model->via.str.size;
        r.model_param = p[P_MODEL] != NULL;
    }
    if (p[P_CACHE]) {
        char v[64];
        size_t n = p[P_CACHE]->via.str.size;
        memcpy(v, p[P_CACHE]->via.str.ptr, n < sizeof(v) ? n : 0);
        v[n < sizeof(v) ? n : 0] = '\0';
        if (cache_parse_mode(v, &r.cache, &r.cache_max_age, &r.cache_max_age_s) < 0) {
            conn_reply_error(c, m->msgid, PGW_BAD_REQUEST,
                             "parameter 'cache': expected \"no-store\", \"no-cache\" or "
                             "\"max-age=N\"");
            free(raw.suffix);
            return;
        }
    }
    call_begin(&c->sink, m->msgid, &r);
    free(raw.suffix);
}
