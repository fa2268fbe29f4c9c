/*
 * call.c — the `call` method: one client request to a capability, driven
 * through attempts on the upstream engine, answered with the result, a
 * stream of chunk notifications, or a typed error.
 *
 * Until the governance core lands, a call makes one attempt on the first
 * source of its capability; the attempt's outcome is mapped to the typed
 * errors of DESIGN.md 3.6 here. The governed loop will replace
 * call_run_attempt()'s single shot, not the mapping.
 *
 * Lifetime: a call belongs to its connection's list from dispatch until it
 * is answered (call_end). If the client disconnects, every call of the
 * connection is cancelled at once: the attempt is torn down (closing its
 * upstream connection) and nothing is answered. `cancel` answers the call
 * with `cancelled` immediately, then tears it down the same way.
 *
 * Streams: each SSE event is transcoded and queued to the client as
 * [2, "chunk", [msgid, event]]. When the client's write queue passes
 * max_write_queue_bytes the upstream transfer is paused (curl stops
 * reading, TCP pushes back on the upstream) and resumed when it drains, so a
 * slow client never makes us buffer an unbounded stream.
 */
#include "call.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "transcode.h"
#include "upstream.h"

struct call {
    struct conn *conn;
    struct call *prev, *next;        /* conn->calls */
    uint32_t msgid;
    bool stream;
    const struct config_capability *cap;
    const struct config_source *src;
    struct attempt *attempt;
    double started;
    uint32_t attempts;
    bool paused;
    msgpack_sbuffer usage;           /* last `usage` map seen in a stream, packed */
};

static void call_unlink(struct call *k)
{
    struct conn *c = k->conn;

    if (k->prev)
        k->prev->next = k->next;
    else
        c->calls = k->next;
    if (k->next)
        k->next->prev = k->prev;
    c->in_flight--;
    c->srv->stats.in_flight--;
}

/* Ends a call whose response (if any) has been queued. */
static void call_end(struct call *k)
{
    struct server *srv = k->conn->srv;

    call_unlink(k);
    msgpack_sbuffer_destroy(&k->usage);
    free(k);
    server_on_request_done(srv);
}

static void pack_kv_str(msgpack_packer *pk, const char *k, const char *v)
{
    rpc_pack_str(pk, k);
    rpc_pack_str(pk, v);
}

static void pack_kv_double(msgpack_packer *pk, const char *k, double v)
{
    rpc_pack_str(pk, k);
    msgpack_pack_double(pk, v);
}

static double call_elapsed(const struct call *k)
{
    return ev_now(k->conn->srv->loop) - k->started;
}

/* Appends pre-packed msgpack bytes to a packer. */
static void pack_raw(msgpack_packer *pk, const char *data, size_t len)
{
    pk->callback(pk->data, data, len);
}

/* Packs a JSON text as msgpack when it parses, else as a (bounded) string. */
static void pack_upstream_body(msgpack_packer *pk, const char *body, size_t len)
{
    msgpack_sbuffer sb;
    msgpack_packer tmp;

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&tmp, &sb, msgpack_sbuffer_write);
    if (len > 0 && transcode_json_to_msgpack(body, len, &tmp, NULL, 0) == 0)
        pack_raw(pk, sb.data, sb.size);
    else
        rpc_pack_strn(pk, body ? body : "", len > 4096 ? 4096 : len);
    msgpack_sbuffer_destroy(&sb);
}

static void call_reply_failure(struct call *k, const struct attempt_result *r)
{
    msgpack_packer *pk = &k->conn->pk;
    enum pgw_code code;
    char msg[320];
    bool fail_fast = r->outcome.kind == OUTCOME_FAIL_FAST;
    const char *reason = outcome_reason_name(r->outcome.reason);

    /* The caller's own deadline_s wins over stream_interrupted: nothing
     * failed, the call ran out of the time it was given (retrying it whole,
     * as stream_interrupted suggests, would only hit the same deadline). */
    if (r->deadline_exceeded) {
        code = PGW_DEADLINE_EXCEEDED;
        snprintf(msg, sizeof(msg), "deadline_s reached after %.3fs: %s", call_elapsed(k),
                 r->detail);
    } else if (k->stream && r->events > 0) {
        code = PGW_STREAM_INTERRUPTED;
        snprintf(msg, sizeof(msg), "stream from %s interrupted after %u events: %s", k->src->name,
                 r->events, r->detail);
    } else if (fail_fast) {
        code = PGW_UPSTREAM_REJECTED;
        snprintf(msg, sizeof(msg), "%s rejected the request with HTTP %d", k->src->name,
                 r->http_status);
    } else {
        code = PGW_RETRY_EXHAUSTED;
        snprintf(msg, sizeof(msg), "%u attempt(s) failed; last on %s: %s: %s", k->attempts,
                 k->src->name, reason, r->detail);
    }
    size_t extra = 3 + (r->outcome.retry_after_s >= 0 ? 1 : 0) + (r->http_status ? 1 : 0) +
                   (fail_fast ? 1 : 0);
    rpc_pack_error_begin(pk, k->msgid, code, msg, extra);
    rpc_pack_str(pk, "attempts");
    msgpack_pack_uint32(pk, k->attempts);
    pack_kv_double(pk, "stalled_s", 0.0);
    if (r->outcome.retry_after_s >= 0)
        pack_kv_double(pk, "retry_after_s", r->outcome.retry_after_s);
    if (r->http_status) {
        rpc_pack_str(pk, "status");
        msgpack_pack_int(pk, r->http_status);
    }
    if (fail_fast) {
        rpc_pack_str(pk, "upstream_body");
        pack_upstream_body(pk, r->body, r->body_len);
    }
    rpc_pack_str(pk, "sources");
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 3);
    pack_kv_str(pk, "name", k->src->name);
    pack_kv_str(pk, "reason", reason);
    pack_kv_str(pk, "detail", r->detail);
    rpc_pack_error_end(pk);
    conn_response_done(k->conn, code);
}

/* A success: the plain body (transcoded) or, for a stream, the summary. */
static void call_reply_success(struct call *k, const struct attempt_result *r)
{
    msgpack_packer *pk = &k->conn->pk;
    msgpack_sbuffer body;
    msgpack_packer bpk;
    msgpack_unpacked up;
    const msgpack_object *usage = NULL;
    char err[200];

    msgpack_sbuffer_init(&body);
    msgpack_unpacked_init(&up);
    if (!k->stream) {
        msgpack_packer_init(&bpk, &body, msgpack_sbuffer_write);
        if (transcode_json_to_msgpack(r->body ? r->body : "", r->body_len, &bpk, err,
                                      sizeof(err)) < 0) {
            struct attempt_result bad = *r;
            bad.outcome.kind = OUTCOME_TRANSIENT;
            bad.outcome.reason = REASON_BAD_RESPONSE;
            snprintf(bad.detail, sizeof(bad.detail), "reply is not JSON: %.130s", err);
            msgpack_sbuffer_destroy(&body);
            msgpack_unpacked_destroy(&up);
            call_reply_failure(k, &bad);
            return;
        }
        if (msgpack_unpack_next(&up, body.data, body.size, NULL) == MSGPACK_UNPACK_SUCCESS)
            usage = rpc_map_get(&up.data, "usage");
    } else if (k->usage.size > 0 &&
               msgpack_unpack_next(&up, k->usage.data, k->usage.size, NULL) ==
                   MSGPACK_UNPACK_SUCCESS) {
        usage = &up.data;
    }
    if (usage && usage->type != MSGPACK_OBJECT_MAP)
        usage = NULL;

    rpc_pack_result_begin(pk, k->msgid);
    msgpack_pack_map(pk, 4 + (k->stream ? 0 : 1) + (usage ? 1 : 0));
    if (!k->stream) {
        rpc_pack_str(pk, "body");
        pack_raw(pk, body.data, body.size);
    }
    pack_kv_str(pk, "source", k->src->name);
    rpc_pack_str(pk, "attempts");
    msgpack_pack_uint32(pk, k->attempts);
    pack_kv_double(pk, "elapsed_s", call_elapsed(k));
    pack_kv_double(pk, "stalled_s", 0.0);
    if (usage) {
        rpc_pack_str(pk, "usage");
        msgpack_pack_object(pk, *usage);
    }
    conn_response_done(k->conn, PGW_OK);
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&body);
}

static void call_on_attempt_done(struct attempt *a, const struct attempt_result *r, void *ud)
{
    struct call *k = ud;
    (void)a;

    k->attempt = NULL;
    log_at(r->outcome.kind == OUTCOME_SUCCESS ? LOG_DEBUG : LOG_INFO, "attempt ended", "conn",
           LOG_U, (unsigned long long)k->conn->id, "msgid", LOG_U, (unsigned long long)k->msgid,
           "source", LOG_S, k->src->name, "outcome", LOG_S, outcome_kind_name(r->outcome.kind),
           "reason", LOG_S, outcome_reason_name(r->outcome.reason), "status", LOG_I,
           (long long)r->http_status, "phase", LOG_S, attempt_phase_name(r->phase), "elapsed_s",
           LOG_F, r->elapsed_s, NULL);
    if (r->outcome.kind == OUTCOME_SUCCESS)
        call_reply_success(k, r);
    else
        call_reply_failure(k, r);
    struct conn *c = k->conn;
    call_end(k);
    conn_flush(c);
}

/* One stream event: transcode, remember usage, relay as a chunk. Returns 1
 * when the event carries a finish_reason (the stream's terminal event for
 * upstreams that send no [DONE]), 0 to go on, -1 to abort. */
static int call_on_event(struct attempt *a, const char *data, size_t len, void *ud)
{
    struct call *k = ud;
    struct conn *c = k->conn;
    msgpack_sbuffer sb;
    msgpack_packer tmp;
    msgpack_unpacked up;
    int terminal = 0;

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&tmp, &sb, msgpack_sbuffer_write);
    if (transcode_json_to_msgpack(data, len, &tmp, NULL, 0) < 0) {
        /* A non-JSON event is relayed as {"data": "<text>"} rather than lost. */
        msgpack_sbuffer_clear(&sb);
        msgpack_pack_map(&tmp, 1);
        rpc_pack_str(&tmp, "data");
        rpc_pack_strn(&tmp, data, len);
    }
    msgpack_unpacked_init(&up);
    if (msgpack_unpack_next(&up, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS) {
        const msgpack_object *usage = rpc_map_get(&up.data, "usage");
        const msgpack_object *choices = rpc_map_get(&up.data, "choices");
        if (usage && usage->type == MSGPACK_OBJECT_MAP) {
            msgpack_packer upk;
            msgpack_sbuffer_clear(&k->usage);
            msgpack_packer_init(&upk, &k->usage, msgpack_sbuffer_write);
            msgpack_pack_object(&upk, *usage);
        }
        if (choices && choices->type == MSGPACK_OBJECT_ARRAY) {
            for (uint32_t i = 0; i < choices->via.array.size; i++) {
                const msgpack_object *fr = rpc_map_get(&choices->via.array.ptr[i], "finish_reason");
                if (fr && fr->type != MSGPACK_OBJECT_NIL)
                    terminal = 1;
            }
        }
    }
    msgpack_unpacked_destroy(&up);

    rpc_pack_notify_begin(&c->pk, "chunk");
    msgpack_pack_array(&c->pk, 2);
    msgpack_pack_uint32(&c->pk, k->msgid);
    pack_raw(&c->pk, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    c->srv->stats.chunks_relayed++;

    /* Relay now. The flush may find the client gone: conn_close() then
     * aborts every call of the connection, this one included, so `k` is
     * freed (its attempt is only marked cancelled: we are inside curl) and
     * must not be touched. `c` itself is freed later, by the reaper. */
    conn_flush(c);
    if (c->closed)
        return -1;
    if (!k->paused && c->out_len - c->out_off > c->srv->cfg->max_write_queue_bytes) {
        k->paused = true;
        attempt_pause(a);
    }
    return terminal;
}

static const struct attempt_hooks call_hooks = {
    .on_event = call_on_event,
    .on_done = call_on_attempt_done,
};

static struct call *call_find(struct conn *c, uint32_t msgid)
{
    for (struct call *k = c->calls; k; k = k->next) {
        if (k->msgid == msgid)
            return k;
    }
    return NULL;
}

void call_start(struct conn *c, const struct rpc_msg *m)
{
    enum { P_CAP, P_BODY, P_STREAM, P_SCOPE, P_TASK, P_DEADLINE, P_N };
    static const struct rpc_param spec[P_N] = {
        [P_CAP] = {"capability", RPC_T_STR, true},
        [P_BODY] = {"body", RPC_T_MAP, true},
        [P_STREAM] = {"stream", RPC_T_BOOL | RPC_T_NIL, false},
        [P_SCOPE] = {"scope", RPC_T_STR | RPC_T_NIL, false},
        [P_TASK] = {"task_id", RPC_T_STR | RPC_T_NIL, false},
        [P_DEADLINE] = {"deadline_s", RPC_T_NUMBER | RPC_T_NIL, false},
    };
    const msgpack_object *p[P_N];
    const struct config *cfg = c->srv->cfg;
    char why[300];
    double deadline_s = 0;

    if (rpc_bind(m->params, spec, P_N, p, why, sizeof(why)) < 0) {
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST, why);
        return;
    }
    if (p[P_DEADLINE] && (!rpc_as_double(p[P_DEADLINE], &deadline_s) || !(deadline_s > 0) ||
                          !isfinite(deadline_s))) {
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST,
                         "parameter 'deadline_s': expected a positive number of seconds");
        return;
    }
    const msgpack_object *capo = p[P_CAP];
    int ci = config_find_capability(cfg, capo->via.str.ptr, capo->via.str.size);
    const struct config_source *src = NULL;
    for (size_t i = 0; ci >= 0 && i < cfg->n_sources; i++) {
        if (cfg->sources[i].capability_index == (size_t)ci) {
            src = &cfg->sources[i];
            break;
        }
    }
    if (!src) {
        char name[65];
        rpc_quote_client_str(capo->via.str.ptr, capo->via.str.size, sizeof(name) - 1, name);
        snprintf(why, sizeof(why), ci < 0 ? "unknown capability '%s'"
                                          : "capability '%s' has no source configured", name);
        conn_reply_error(c, m->msgid, PGW_UNKNOWN_CAPABILITY, why);
        return;
    }

    bool stream = p[P_STREAM] && p[P_STREAM]->via.boolean;
    struct transcode_override ov = {
        .model = src->model,
        /* The `stream` parameter decides; a body's own "stream" key must not
         * make the upstream stream while we expect one JSON reply. */
        .stream = stream                               ? TRANSCODE_STREAM_TRUE
                  : rpc_map_get(p[P_BODY], "stream") ? TRANSCODE_STREAM_FALSE
                                                     : TRANSCODE_STREAM_KEEP,
    };
    struct transcode_buf json;
    transcode_buf_init(&json);
    if (transcode_msgpack_to_json(p[P_BODY], &json, &ov, "body", why, sizeof(why)) < 0) {
        transcode_buf_fini(&json);
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST, why);
        return;
    }

    struct call *k = calloc(1, sizeof(*k));
    if (!k) {
        transcode_buf_fini(&json);
        conn_reply_error(c, m->msgid, PGW_INTERNAL, "out of memory");
        return;
    }
    k->conn = c;
    k->msgid = m->msgid;
    k->stream = stream;
    k->cap = &cfg->capabilities[ci];
    k->src = src;
    k->started = ev_now(c->srv->loop);
    msgpack_sbuffer_init(&k->usage);
    k->next = c->calls;
    if (c->calls)
        c->calls->prev = k;
    c->calls = k;
    c->in_flight++;
    c->srv->stats.in_flight++;

    char url[2048];
    snprintf(url, sizeof(url), "%s%s", src->base_url, k->cap->path);
    struct attempt_spec as = {
        .url = url,
        .api_key = src->api_key,
        .body = json.data,
        .body_len = json.len,
        .stream = stream,
        .connect_timeout_s = src->connect_timeout_s,
        .ttft_timeout_s = src->ttft_timeout_s,
        .idle_timeout_s = src->idle_timeout_s,
        .timeout_s = src->timeout_s,
        .deadline_at = deadline_s > 0 ? k->started + deadline_s : 0,
        .max_response_bytes = cfg->max_message_bytes,
    };
    k->attempts = 1;
    k->attempt = attempt_start(c->srv->up, &as, &call_hooks, k);
    if (!k->attempt) {
        conn_reply_error(c, m->msgid, PGW_INTERNAL, "cannot start the upstream request");
        call_end(k);
    }
}

/* Tears down the call's attempt and frees the call without answering. */
static void call_abort(struct call *k)
{
    if (k->attempt) {
        attempt_cancel(k->attempt);
        k->attempt = NULL;
    }
    call_end(k);
}

bool call_is_in_flight(struct conn *c, uint32_t msgid)
{
    return call_find(c, msgid) != NULL;
}

int call_cancel(struct conn *c, uint32_t msgid)
{
    struct call *k = call_find(c, msgid);

    if (!k)
        return -1;
    char msg[96];
    snprintf(msg, sizeof(msg), "cancelled by the client after %.3fs", call_elapsed(k));
    rpc_pack_error_begin(&c->pk, msgid, PGW_CANCELLED, msg, 2);
    rpc_pack_str(&c->pk, "attempts");
    msgpack_pack_uint32(&c->pk, k->attempts);
    pack_kv_double(&c->pk, "stalled_s", 0.0);
    rpc_pack_error_end(&c->pk);
    conn_response_done(c, PGW_CANCELLED);
    call_abort(k);
    return 0;
}

void call_fail_all(struct conn *c, enum pgw_code code, const char *message)
{
    while (c->calls) {
        struct call *k = c->calls;
        rpc_pack_error_begin(&c->pk, k->msgid, code, message, 1);
        rpc_pack_str(&c->pk, "attempts");
        msgpack_pack_uint32(&c->pk, k->attempts);
        rpc_pack_error_end(&c->pk);
        conn_response_done(c, code);
        call_abort(k);
    }
}

void call_abort_all(struct conn *c)
{
    while (c->calls)
        call_abort(c->calls);
}

void call_on_drained(struct conn *c)
{
    for (struct call *k = c->calls; k; k = k->next) {
        if (k->paused && k->attempt) {
            k->paused = false;
            attempt_resume(k->attempt);
        }
    }
}
