/*
 * call.c — the `call` method: one client request to a capability, run by
 * the governed loop (src/gov.h) over attempts on the upstream engine, and
 * answered with the result, a stream of chunk notifications, or a typed
 * error (docs/DESIGN.md §3.6).
 *
 * The loop, per call:
 *
 *   call_start ─> call_step ─┬─ ATTEMPT(source) ─> attempt_start ─> call_on_attempt_done
 *                   ^        │                                           │ gov_call_on_outcome
 *                   │        ├─ WAIT(wake_at) ─> wake_w timer ───────────┤ (DONE / WAIT)
 *                   │        │     or on_wake (a permit was released) ───┤
 *                   └────────┴───────────────────────────────────────────┘
 *                            └─ DONE ─> reply
 *
 * Governance decides; this file only acts, maps outcomes to typed errors,
 * and adds two rules the core cannot know: a stream that fails after its
 * first relayed event ends the call with `stream_interrupted` (no silent
 * replay of partial output), and the call's own deadline_s wins over it.
 *
 * Lifetime: a call belongs to its connection's list from dispatch until it
 * is answered (call_end). If the client disconnects, every call of the
 * connection is cancelled at once: the attempt is torn down (closing its
 * upstream connection), its permit released, and nothing is answered.
 * `cancel` answers the call with `cancelled` immediately, then tears it
 * down the same way.
 *
 * Streams: each SSE event is transcoded and queued to the client as
 * [2, "chunk", [msgid, event]]. When the client's write queue passes
 * max_write_queue_bytes the upstream transfer is paused (curl stops
 * reading, TCP pushes back on the upstream) and resumed when it drains, so a
 * slow client never makes us buffer an unbounded stream.
 */
#include "call.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access.h"
#include "backend.h"
#include "governor.h"
#include "log.h"
#include "metrics.h"
#include "redact.h"
#include "task.h"
#include "tasks.h"
#include "transcode.h"
#include "upstream.h"

struct call {
    struct conn *conn;
    struct call *prev, *next;        /* conn->calls */
    uint32_t msgid;
    bool stream;
    const struct config_capability *cap;
    const struct config_source *src; /* the current (or last) attempt's source */
    struct attempt *attempt;
    struct backend_admit *admit;     /* admission asked, not answered yet */
    struct backend_lease *lease;     /* the attempt's fleet permit, when the backend has one */
    char backend_why[64];            /* why the backend could not admit, for the error */
    double started;
    bool paused;
    struct gov_call g;               /* the governed loop's state */
    ev_timer wake_w;                 /* WAIT / backoff */
    msgpack_sbuffer body;            /* the client's body, packed (kept for retries) */
    struct transcode_buf json;       /* its JSON for `json_model` */
    const char *json_model;          /* model override `json` was made with */
    bool json_ready;
    msgpack_sbuffer usage;           /* last `usage` map seen in a stream, packed */
    char event_error[96];            /* why the attempt's stream was refused, or "" */
    uint32_t relayed;                /* chunks of the attempt relayed to the client */
    struct task *task;               /* the task it belongs to, or NULL */
    struct task_wait *task_wait;     /* its task is being checked by the backend */
    struct call *tprev, *tnext;      /* the task's calls (head in task->ud) */
    /* For the access log (access.h). */
    bool answered;                   /* a response was queued */
    int last_status;                 /* the last attempt's HTTP status */
    double ttft_s;                   /* NAN until a chunk is relayed */
    double tokens;                   /* usage.total_tokens of the answer, NAN */
    long long peer_pid, peer_uid;
    char task_id[TASK_ID_MAX + 1];   /* "" when the call names none */
    struct gov_source_note *reconf_notes; /* a reload in progress: the new notes */
    struct call *all_prev, *all_next; /* srv->calls_all: every call, for a reload */
    enum pgw_code code;              /* how it was answered (PGW_CANCELLED: not answered) */
};

static void call_step(struct call *k);

/* A call naming a task not held running here waits for the record's answer. */
struct task_wait {
    struct call *k;                  /* NULL once the call is gone */
    char id[TASK_ID_MAX + 1];
};
static void call_act(struct call *k, const struct gov_decision *d,
                     const struct attempt_result *last);

static void call_unlink(struct call *k)
{
    struct conn *c = k->conn;

    if (k->all_prev)
        k->all_prev->all_next = k->all_next;
    else
        c->srv->calls_all = k->all_next;
    if (k->all_next)
        k->all_next->all_prev = k->all_prev;

    if (k->prev)
        k->prev->next = k->next;
    else
        c->calls = k->next;
    if (k->next)
        k->next->prev = k->prev;
    c->in_flight--;
    c->srv->stats.in_flight--;
}

/* Ends a call whose response (if any) has been queued: releases whatever
 * the governed loop still holds (a cancelled attempt's permit and probe),
 * which may wake other waiting calls. */
/* The only place `paused` changes, so the connection's count stays exact
 * (it lets a drained connection skip scanning its calls). */
static void call_set_paused(struct call *k, bool paused)
{
    if (k->paused == paused)
        return;
    k->paused = paused;
    if (paused)
        k->conn->paused_calls++;
    else
        k->conn->paused_calls--;
}

/* The task's calls: a list headed by task->ud. */
static void call_task_link(struct call *k, struct task *t)
{
    k->task = t;
    k->tprev = NULL;
    k->tnext = t->ud;
    if (k->tnext)
        k->tnext->tprev = k;
    t->ud = k;
}

static void call_task_unlink(struct call *k)
{
    if (!k->task)
        return;
    if (k->tprev)
        k->tprev->tnext = k->tnext;
    else
        k->task->ud = k->tnext;
    if (k->tnext)
        k->tnext->tprev = k->tprev;
    k->task = NULL;
    k->tprev = k->tnext = NULL;
}

static void call_log(const struct call *k)
{
    const struct server *srv = k->conn->srv;
    double now = ev_now(srv->loop);
    const struct access_entry e = {
        .conn = k->conn->id,
        .msgid = k->msgid,
        .capability = k->cap->name,
        .scope = k->g.scope,
        .source = k->g.attempts > 0 && k->src ? k->src->name : NULL,
        .task = k->task_id[0] ? k->task_id : NULL,
        .peer_pid = k->peer_pid,
        .peer_uid = k->peer_uid,
        .answered = k->answered,
        .code = k->code,
        .stream = k->stream,
        .attempts = k->g.attempts,
        .status = k->last_status,
        .elapsed_s = now - k->started,
        .stalled_s = gov_call_stalled_s(&k->g, now),
        .ttft_s = k->ttft_s,
        .tokens = k->tokens,
    };
    access_log_write(srv->cfg, &e);
}

/* Every answered call comes here once, right after its response was queued. */
static void call_set_answered(struct call *k, enum pgw_code code)
{
    k->answered = true;
    k->code = code;
}

static double call_elapsed(const struct call *k)
{
    return ev_now(k->conn->srv->loop) - k->started;
}

/* Indexes of the call's capability and current source (metrics slots). */
static size_t call_cap(const struct call *k)
{
    return (size_t)(k->cap - k->conn->srv->cfg->capabilities);
}

static size_t call_source(const struct call *k)
{
    return (size_t)(k->src - k->conn->srv->cfg->sources);
}

static void call_end(struct call *k)
{
    struct server *srv = k->conn->srv;

    call_log(k);
    if (k->task_wait)
        k->task_wait->k = NULL;
    k->task_wait = NULL;
    if (k->admit)
        backend_admit_detach(srv->backend, k->admit);
    if (k->lease)
        backend_release(srv->backend, k->lease, NULL, -1);
    k->admit = NULL;
    k->lease = NULL;
    call_task_unlink(k);
    call_set_paused(k, false);
    ev_timer_stop(srv->loop, &k->wake_w);
    metrics_on_call_end(srv->metrics, call_cap(k), k->code,
                        call_elapsed(k), gov_call_stalled_s(&k->g, ev_now(srv->loop)));
    gov_call_fini(&k->g, ev_now(srv->loop));
    call_unlink(k);
    msgpack_sbuffer_destroy(&k->usage);
    msgpack_sbuffer_destroy(&k->body);
    transcode_buf_fini(&k->json);
    free(k);
    server_on_request_done(srv);
}

/* Appends pre-packed msgpack bytes to a packer. */
static void pack_raw(msgpack_packer *pk, const char *data, size_t len)
{
    pk->callback(pk->data, data, len);
}

/* Upstream bytes reach the client only through the functions below:
 * every secret the sidecar sent is scrubbed (redact.h), text is made valid
 * UTF-8, and JSON nests no deeper than the protocol lets a relayed value
 * nest (RPC_RELAYED_MAX_DEPTH), so a hostile reply can neither leak a key
 * nor make a frame the client's reader must refuse. */

/* Transcodes an upstream JSON text into `pk`, scrubbing every decoded
 * string (which also catches an echo written with JSON escapes). A parse
 * error's message may quote a short excerpt of the input: callers put it
 * only in a detail, which relay_text_inplace() scrubs.
 * Returns as transcode_json_to_msgpack(). */
static int relay_json(struct server *srv, const char *json, size_t len, msgpack_packer *pk,
                      char *err, size_t errlen)
{
    const struct transcode_j2m opt = {RPC_RELAYED_MAX_DEPTH, redact_on_str, srv->redact};

    return transcode_json_to_msgpack(json, len, pk, &opt, err, errlen);
}

/* Packs upstream text as a str: scrubbed, invalid UTF-8 replaced with
 * U+FFFD, cut to at most `max` bytes on a character boundary. */
static void relay_text(struct server *srv, msgpack_packer *pk, const char *s, size_t n,
                       size_t max)
{
    struct transcode_buf clean, valid;

    transcode_buf_init(&clean);
    transcode_buf_init(&valid);
    if (redact_copy(srv->redact, s, n, &clean) < 0 ||
        transcode_utf8_repair(clean.data, clean.len, &valid) < 0)
        rpc_pack_str(pk, "(upstream text dropped: out of memory)");
    else
        rpc_pack_strn(pk, valid.data, transcode_utf8_cut(valid.data, valid.len, max));
    transcode_buf_fini(&clean);
    transcode_buf_fini(&valid);
}

/* The same for a NUL-terminated text kept in buf[cap] (an error detail or
 * message that quotes upstream or curl text): rewritten in place. */
static void relay_text_inplace(struct server *srv, char *buf, size_t cap)
{
    struct transcode_buf clean, valid;
    size_t n = strnlen(buf, cap);

    if (n == 0)
        return;
    transcode_buf_init(&clean);
    transcode_buf_init(&valid);
    if (redact_copy(srv->redact, buf, n, &clean) < 0 ||
        transcode_utf8_repair(clean.data, clean.len, &valid) < 0) {
        snprintf(buf, cap, "(detail dropped: out of memory)");
    } else {
        n = transcode_utf8_cut(valid.data, valid.len, cap - 1);
        memcpy(buf, valid.data, n);
        buf[n] = '\0';
    }
    transcode_buf_fini(&clean);
    transcode_buf_fini(&valid);
}

/* Packs an upstream error body as msgpack when it is JSON that fits, else
 * as a string of at most 4 KiB. */
static void pack_upstream_body(struct server *srv, msgpack_packer *pk, const char *body,
                               size_t len)
{
    msgpack_sbuffer sb;
    msgpack_packer tmp;

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&tmp, &sb, msgpack_sbuffer_write);
    if (len > 0 && relay_json(srv, body, len, &tmp, NULL, 0) == 0)
        pack_raw(pk, sb.data, sb.size);
    else
        relay_text(srv, pk, body ? body : "", len, 4096);
    msgpack_sbuffer_destroy(&sb);
}

static enum pgw_code gov_code(enum gov_result r)
{
    switch (r) {
    case GOV_OK: return PGW_OK;
    case GOV_STALLED: return PGW_STALLED;
    case GOV_RETRY_EXHAUSTED: return PGW_RETRY_EXHAUSTED;
    case GOV_UPSTREAM_REJECTED: return PGW_UPSTREAM_REJECTED;
    case GOV_DEADLINE_EXCEEDED: return PGW_DEADLINE_EXCEEDED;
    case GOV_BACKEND_UNAVAILABLE: return PGW_BACKEND_UNAVAILABLE;
    case GOV_CANCELLED: return PGW_CANCELLED;
    }
    return PGW_INTERNAL;
}

/* Packs the `sources` list of an error: every source the call tried, with
 * its attempts and the reason of its last one. */
static void pack_sources(msgpack_packer *pk, const struct call *k, const struct attempt_result *last)
{
    const struct config *cfg = k->conn->srv->cfg;
    uint32_t n = 0;

    for (size_t i = 0; i < cfg->n_sources; i++)
        n += k->g.notes[i].tried;
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < cfg->n_sources; i++) {
        const struct gov_source_note *note = &k->g.notes[i];
        bool is_last = last && &cfg->sources[i] == k->src;
        if (!note->tried)
            continue;
        msgpack_pack_map(pk, 3 + (note->status ? 1 : 0) + (is_last ? 1 : 0));
        rpc_pack_kv_str(pk, "name", cfg->sources[i].name);
        rpc_pack_kv_str(pk, "reason", outcome_reason_name((enum outcome_reason)note->reason));
        rpc_pack_str(pk, "attempts");
        msgpack_pack_uint32(pk, note->attempts);
        if (note->status) {
            rpc_pack_str(pk, "status");
            msgpack_pack_int(pk, note->status);
        }
        if (is_last)
            rpc_pack_kv_str(pk, "detail", last->detail);
    }
}

/* The error answer. `last` is the attempt that just ended, if any (it
 * carries the upstream status and body of a rejection). A verdict reached
 * at the top of the loop (stalled, deadline_exceeded after a backoff) has no
 * `last`, but the call may have made attempts: their last one is described
 * from the governed loop's note on that source, so that a call stalled by
 * a run of 429s does not claim it never attempted anything. */
static void call_reply_error(struct call *k, enum pgw_code code, double retry_after_s,
                             const struct attempt_result *last)
{
    msgpack_packer *pk = &k->conn->pk;
    double now = ev_now(k->conn->srv->loop);
    double stalled = gov_call_stalled_s(&k->g, now);
    const char *src = k->src ? k->src->name : "-";
    const struct gov_source_note *note =
        !last && k->g.attempts > 0 && k->src ? &k->g.notes[k->src - k->conn->srv->cfg->sources]
                                             : NULL;
    const char *reason = last   ? outcome_reason_name(last->outcome.reason)
                         : note ? outcome_reason_name((enum outcome_reason)note->reason)
                                : "none";
    int http_status = last ? last->http_status : note ? note->status : 0;
    const char *detail = last ? last->detail : "";
    bool rejected = code == PGW_UPSTREAM_REJECTED && last;
    char msg[400];

    switch (code) {
    case PGW_STALLED:
        if (stalled <= k->g.pol.stall_window_s) {
            /* Ended before its window was spent: Retry-After held back every
             * source past the verdict (gov.h). */
            snprintf(msg, sizeof(msg),
                     "scope '%s' made no progress and Retry-After holds back every source for "
                     "%.0fs, past what is left of stall_window_s %g (%.3fs spent); %u "
                     "attempt(s), last: %s: %s",
                     k->g.scope, retry_after_s, k->g.pol.stall_window_s, stalled,
                     k->g.attempts, last || note ? src : "none", reason);
            break;
        }
        snprintf(msg, sizeof(msg),
                 "scope '%s' made no progress and this call spent %.3fs waiting, backing off "
                 "or rate-limited (stall_window_s %g); %u attempt(s), last: %s: %s",
                 k->g.scope, stalled, k->g.pol.stall_window_s, k->g.attempts,
                 last || note ? src : "none", reason);
        break;
    case PGW_RETRY_EXHAUSTED:
        snprintf(msg, sizeof(msg), "%u attempt(s) failed; last on %s: %s: %.160s",
                 k->g.attempts, src, reason, detail);
        break;
    case PGW_UPSTREAM_REJECTED:
        snprintf(msg, sizeof(msg), "%s rejected the request with HTTP %d", src,
                 last ? last->http_status : 0);
        break;
    case PGW_DEADLINE_EXCEEDED:
        snprintf(msg, sizeof(msg), "deadline_s reached after %.3fs (%u attempt(s))%s%.160s",
                 now - k->started, k->g.attempts, detail[0] ? "; " : "", detail);
        break;
    case PGW_STREAM_INTERRUPTED:
        snprintf(msg, sizeof(msg), "stream from %s interrupted after %u events: %s: %.160s", src,
                 last ? last->events : 0, reason, detail);
        break;
    case PGW_BACKEND_UNAVAILABLE:
        snprintf(msg, sizeof(msg), "the state backend could not answer for scope '%s': %s",
                 k->g.scope, k->backend_why[0] ? k->backend_why : "not connected");
        break;
    default:
        snprintf(msg, sizeof(msg), "%s", pgw_code_name(code));
        break;
    }
    relay_text_inplace(k->conn->srv, msg, sizeof(msg)); /* %.160s may cut a character */
    bool status = http_status != 0;
    size_t extra = 4 + (status ? 1 : 0) + (rejected ? 1 : 0);
    rpc_pack_error_begin(pk, k->msgid, code, msg, extra);
    rpc_pack_str(pk, "attempts");
    msgpack_pack_uint32(pk, k->g.attempts);
    rpc_pack_kv_double(pk, "stalled_s", stalled);
    rpc_pack_kv_double(pk, "retry_after_s", retry_after_s >= 0 ? retry_after_s : 0);
    if (status) {
        /* The last attempt's HTTP status (per-source ones are in `sources`). */
        rpc_pack_str(pk, "status");
        msgpack_pack_int(pk, http_status);
    }
    if (rejected) {
        rpc_pack_str(pk, "upstream_body");
        pack_upstream_body(k->conn->srv, pk, last->body, last->body_len);
    }
    rpc_pack_str(pk, "sources");
    pack_sources(pk, k, last);
    rpc_pack_error_end(pk);
    conn_response_done(k->conn, code);
}

/* total_tokens of a usage map, or -1. */
static double usage_tokens(const msgpack_object *usage)
{
    const msgpack_object *t = rpc_map_get(usage, "total_tokens");
    double v;
    return t && rpc_as_double(t, &v) && v >= 0 ? v : -1;
}

/* A success: the plain body (already transcoded into `body`) or, for a
 * stream, the summary. */
static void call_reply_success(struct call *k, const msgpack_sbuffer *body,
                               const msgpack_object *usage)
{
    msgpack_packer *pk = &k->conn->pk;
    double now = ev_now(k->conn->srv->loop);

    rpc_pack_result_begin(pk, k->msgid);
    msgpack_pack_map(pk, 4 + (body ? 1 : 0) + (usage ? 1 : 0));
    if (body) {
        rpc_pack_str(pk, "body");
        pack_raw(pk, body->data, body->size);
    }
    rpc_pack_kv_str(pk, "source", k->src->name);
    rpc_pack_str(pk, "attempts");
    msgpack_pack_uint32(pk, k->g.attempts);
    rpc_pack_kv_double(pk, "elapsed_s", now - k->started);
    rpc_pack_kv_double(pk, "stalled_s", gov_call_stalled_s(&k->g, now));
    if (usage) {
        rpc_pack_str(pk, "usage");
        msgpack_pack_object(pk, *usage);
    }
    conn_response_done(k->conn, PGW_OK);
}

/* Ends a call just answered (the response is the connection's last). */
static void call_finish(struct call *k)
{
    struct conn *c = k->conn;
    call_set_answered(k, c->last_code);
    call_end(k);
    conn_flush(c);
}

static void call_on_attempt_done(struct attempt *a, const struct attempt_result *r, void *ud)
{
    struct call *k = ud;
    struct attempt_result res = *r;
    double now = ev_now(k->conn->srv->loop);
    msgpack_sbuffer body;
    msgpack_packer bpk;
    msgpack_unpacked up;
    const msgpack_object *usage = NULL;
    struct gov_decision d;
    char err[200];
    (void)a;

    k->attempt = NULL;
    msgpack_sbuffer_init(&body);
    msgpack_unpacked_init(&up);
    if (k->event_error[0] && res.outcome.reason == REASON_BAD_RESPONSE)
        snprintf(res.detail, sizeof(res.detail), "%s", k->event_error);
    res.events = k->relayed; /* the engine also counts an event the hook refused */

    /* A plain success must be JSON that fits in a response frame; if not,
     * it is a transient failure the loop may retry, not a success. */
    if (res.outcome.kind == OUTCOME_SUCCESS && !k->stream) {
        msgpack_packer_init(&bpk, &body, msgpack_sbuffer_write);
        int rc = relay_json(k->conn->srv, res.body ? res.body : "", res.body_len, &bpk, err,
                            sizeof(err));
        if (rc < 0) {
            outcome_from_reason(&res.outcome, REASON_BAD_RESPONSE);
            res.outcome.http_status = res.http_status;
            if (rc == TRANSCODE_ETOO_DEEP)
                snprintf(res.detail, sizeof(res.detail),
                         "reply nests deeper than the %d levels a relayed value may have",
                         RPC_RELAYED_MAX_DEPTH);
            else
                snprintf(res.detail, sizeof(res.detail), "reply is not JSON: %.130s", err);
        } else if (msgpack_unpack_next(&up, body.data, body.size, NULL) == MSGPACK_UNPACK_SUCCESS) {
            usage = rpc_map_get(&up.data, "usage");
        }
    } else if (res.outcome.kind == OUTCOME_SUCCESS && k->usage.size > 0 &&
               msgpack_unpack_next(&up, k->usage.data, k->usage.size, NULL) ==
                   MSGPACK_UNPACK_SUCCESS) {
        usage = &up.data;
    }
    relay_text_inplace(k->conn->srv, res.detail, sizeof(res.detail));
    if (usage && usage->type != MSGPACK_OBJECT_MAP)
        usage = NULL;

    log_at(res.outcome.kind == OUTCOME_SUCCESS ? LOG_DEBUG : LOG_INFO, "attempt ended", "conn",
           LOG_U, (unsigned long long)k->conn->id, "msgid", LOG_U, (unsigned long long)k->msgid,
           "source", LOG_S, k->src->name, "attempt", LOG_U, (unsigned long long)k->g.attempts,
           "outcome", LOG_S, outcome_kind_name(res.outcome.kind), "reason", LOG_S,
           outcome_reason_name(res.outcome.reason), "status", LOG_I, (long long)res.http_status,
           "phase", LOG_S, attempt_phase_name(res.phase), "elapsed_s", LOG_F, res.elapsed_s, NULL);

    metrics_on_attempt(k->conn->srv->metrics, call_source(k), &res);
    double used = usage ? usage_tokens(usage) : -1;
    k->last_status = res.http_status;
    k->tokens = used >= 0 ? used : NAN;
    if (k->lease) {
        backend_release(k->conn->srv->backend, k->lease, &res.outcome, used);
        k->lease = NULL;
    }
    gov_call_on_outcome(&k->g, now, &res.outcome, used, &d);

    if (res.outcome.kind != OUTCOME_SUCCESS && res.deadline_exceeded) {
        /* The caller's own deadline_s wins over stream_interrupted: nothing
         * failed, the call ran out of the time it was given. */
        call_reply_error(k, PGW_DEADLINE_EXCEEDED, d.retry_after_s, &res);
        call_finish(k);
    } else if (res.outcome.kind != OUTCOME_SUCCESS && k->stream && res.events > 0) {
        /* Partial output was relayed: never replay it silently. */
        call_reply_error(k, PGW_STREAM_INTERRUPTED, d.retry_after_s, &res);
        call_finish(k);
    } else if (d.action == GOV_DONE && d.result == GOV_OK) {
        call_reply_success(k, k->stream ? NULL : &body, usage);
        call_finish(k);
    } else {
        call_act(k, &d, &res);
    }
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&body);
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
    int rc = relay_json(c->srv, data, len, &tmp, NULL, 0);
    if (rc == TRANSCODE_ETOO_DEEP) {
        /* Valid JSON, but no client could read the chunk: a bad_response
         * (upstream.c ends the attempt when the hook refuses an event). */
        snprintf(k->event_error, sizeof(k->event_error),
                 "stream event nests deeper than the %d levels a relayed value may have",
                 RPC_RELAYED_MAX_DEPTH);
        msgpack_sbuffer_destroy(&sb);
        return -1;
    }
    if (rc < 0) {
        /* A non-JSON event is relayed as {"data": "<text>"} rather than lost. */
        msgpack_sbuffer_clear(&sb);
        msgpack_pack_map(&tmp, 1);
        rpc_pack_str(&tmp, "data");
        relay_text(c->srv, &tmp, data, len, SIZE_MAX);
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
    if (k->relayed++ == 0) /* a stream is never retried after its first event */
        metrics_on_call_first_event(c->srv->metrics, call_cap(k), call_elapsed(k));
    if (isnan(k->ttft_s))
        k->ttft_s = ev_now(c->srv->loop) - k->started;

    /* Relay now. The flush may find the client gone: conn_close() then
     * aborts every call of the connection, this one included, so `k` is
     * freed (its attempt is only marked cancelled: we are inside curl) and
     * must not be touched. `c` itself is freed later, by the reaper. */
    conn_flush(c);
    if (c->closed)
        return -1;
    if (!k->paused && c->out_len - c->out_off > c->srv->cfg->max_write_queue_bytes) {
        call_set_paused(k, true);
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

/* The JSON body for a source: made once per distinct model override (the
 * common case is one transcode per call, however many attempts). */
static int call_prepare_json(struct call *k, const char *model, char *why, size_t whylen)
{
    msgpack_unpacked up;
    int rc;

    if (k->json_ready && (k->json_model == model ||
                          (k->json_model && model && strcmp(k->json_model, model) == 0)))
        return 0;
    msgpack_unpacked_init(&up);
    if (msgpack_unpack_next(&up, k->body.data, k->body.size, NULL) != MSGPACK_UNPACK_SUCCESS) {
        msgpack_unpacked_destroy(&up);
        snprintf(why, whylen, "internal: stored body unreadable");
        return -1;
    }
    struct transcode_override ov = {
        .model = model,
        /* The `stream` parameter decides; a body's own "stream" key must not
         * make the upstream stream while we expect one JSON reply. */
        .stream = k->stream                          ? TRANSCODE_STREAM_TRUE
                  : rpc_map_get(&up.data, "stream") ? TRANSCODE_STREAM_FALSE
                                                    : TRANSCODE_STREAM_KEEP,
    };
    transcode_buf_reset(&k->json);
    rc = transcode_msgpack_to_json(&up.data, &k->json, &ov, "body", why, whylen);
    msgpack_unpacked_destroy(&up);
    if (rc < 0)
        return rc;
    k->json_model = model;
    k->json_ready = true;
    return 0;
}

static void call_on_wake_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    call_step(w->data);
}

void call_on_gov_wake(struct gov_call *g, void *ud)
{
    struct call *k = g->ud;
    struct server *srv = ud;

    /* Never step inside the core's own call: schedule for this loop turn. */
    ev_timer_stop(srv->loop, &k->wake_w);
    ev_timer_set(&k->wake_w, 0., 0.);
    ev_timer_start(srv->loop, &k->wake_w);
}

void call_on_breaker(const struct gov *g, size_t source, enum breaker_state from,
                     enum breaker_state to, double now, void *ud)
{
    (void)ud;
    (void)now;
    log_at(to == BREAKER_OPEN ? LOG_WARN : LOG_INFO, "breaker", "source", LOG_S,
           g->sources[source].p.name, "from", LOG_S, breaker_state_name(from), "to", LOG_S,
           breaker_state_name(to), "cooldown_s", LOG_F, g->sources[source].breaker.cooldown_s,
           NULL);
}

/* Starts the attempt the loop chose. */
static void call_run_attempt(struct call *k, size_t source)
{
    struct server *srv = k->conn->srv;
    const struct config *cfg = srv->cfg;
    const struct config_source *src = &cfg->sources[source];
    char why[300], url[CONFIG_URL_MAX + 256 + 1];

    k->src = src;
    if (call_prepare_json(k, src->model, why, sizeof(why)) < 0) {
        /* The body was checked at call_start and only the (validated)
         * model differs between sources; call_end releases the reservation. */
        conn_reply_error(k->conn, k->msgid, PGW_BAD_REQUEST, why);
        call_finish(k);
        return;
    }
    char *json = malloc(k->json.len + 1);
    if (!json) {
        conn_reply_error(k->conn, k->msgid, PGW_INTERNAL, "out of memory");
        call_finish(k);
        return;
    }
    memcpy(json, k->json.data, k->json.len + 1);
    snprintf(url, sizeof(url), "%s%s", src->base_url, k->cap->path);
    struct attempt_spec as = {
        .url = url,
        .api_key = src->api_key,
        .body = json,
        .body_len = k->json.len,
        .stream = k->stream,
        .connect_timeout_s = src->connect_timeout_s,
        .ttft_timeout_s = src->ttft_timeout_s,
        .idle_timeout_s = src->idle_timeout_s,
        .timeout_s = src->timeout_s,
        .deadline_at = k->g.deadline_at,
        .max_response_bytes = cfg->max_message_bytes,
        .budget = &k->conn->budget,
    };
    call_set_paused(k, false);
    msgpack_sbuffer_clear(&k->usage);
    k->event_error[0] = '\0';
    k->relayed = 0;
    k->attempt = attempt_start(srv->up, &as, &call_hooks, k);
    if (!k->attempt) {
        conn_reply_error(k->conn, k->msgid, PGW_INTERNAL, "cannot start the upstream request");
        call_finish(k);
    }
}

/* The backend answered the admission of the reserved attempt later. */
static void call_on_admit(void *ud, int rc, struct backend_lease *lease, double retry_at,
                          const char *why)
{
    struct call *k = ud;
    struct server *srv = k->conn->srv;
    double now = ev_now(srv->loop);
    struct gov_decision d;

    k->admit = NULL;
    if (rc > 0) {
        k->lease = lease;
        gov_call_confirmed(&k->g);
        call_run_attempt(k, k->g.source);
        return;
    }
    if (rc == 0) {
        log_at(LOG_DEBUG, "fleet admission refused", "source", LOG_S,
               srv->cfg->sources[k->g.source].name, "check", LOG_S, why, NULL);
        /* A token-bucket refusal depends on this call's size: no gate. */
        bool gate = strcmp(why, "tpm") != 0 && strcmp(why, "daily") != 0;
        gov_call_refused(&k->g, now, retry_at, gate, &d);
    } else {
        log_at(LOG_WARN, "backend could not admit (failing closed)", "error", LOG_S, why, NULL);
        snprintf(k->backend_why, sizeof(k->backend_why), "%s", why);
        gov_call_abandon(&k->g, now, GOV_BACKEND_UNAVAILABLE, &d);
    }
    call_act(k, &d, NULL);
}

static void call_act(struct call *k, const struct gov_decision *d, const struct attempt_result *last)
{
    struct server *srv = k->conn->srv;

    switch (d->action) {
    case GOV_ATTEMPT: {
        /* Admitted at once (the local step decided: memory), later
         * (call_on_admit), or not sent: fail closed. */
        int rc = backend_admit(srv->backend, d->source, k->g.est_tokens, &k->lease,
                               call_on_admit, k, &k->admit);
        if (rc > 0) {
            call_run_attempt(k, d->source);
        } else if (rc < 0) {
            struct gov_decision fail;
            gov_call_abandon(&k->g, ev_now(srv->loop), GOV_BACKEND_UNAVAILABLE, &fail);
            call_act(k, &fail, NULL);
        }
        return;
    }
    case GOV_WAIT: {
        double in = d->wake_at - ev_now(srv->loop);
        ev_timer_stop(srv->loop, &k->wake_w);
        ev_timer_set(&k->wake_w, in > 0 ? in : 0., 0.);
        ev_timer_start(srv->loop, &k->wake_w);
        return;
    }
    case GOV_DONE:
        call_reply_error(k, gov_code(d->result), d->retry_after_s, last);
        call_finish(k);
        return;
    }
}

static void call_step(struct call *k)
{
    struct gov_decision d;

    if (k->admit || k->attempt || k->task_wait)
        return; /* a late timer, or the call is waiting for the backend */
    gov_call_step(&k->g, ev_now(k->conn->srv->loop), &d);
    call_act(k, &d, NULL);
}

/* The record answered whether the task of a call runs. */
static void call_on_task_checked(void *ud, struct task *t, const struct backend_task *bt)
{
    struct task_wait *tw = ud;
    struct call *k = tw->k;

    if (k) {
        k->task_wait = NULL;
        if (t) {
            call_task_link(k, t);
            call_step(k);
        } else {
            tasks_reply_error(k->conn, k->msgid, tw->id, bt);
            call_finish(k);
        }
    }
    free(tw);
}

/* max_tokens / max_completion_tokens of the body, 0 when absent. */
static uint64_t body_max_tokens(const msgpack_object *body)
{
    const msgpack_object *m = rpc_map_get(body, "max_completion_tokens");
    if (!m)
        m = rpc_map_get(body, "max_tokens");
    return m && m->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? m->via.u64 : 0;
}

/* A call refused before it reached the governed loop: logged with what is
 * known of it (the capability and task as the client wrote them, quoted). */
static void call_log_refused(struct conn *c, const struct rpc_msg *m, const msgpack_object *cap,
                             const msgpack_object *task, enum pgw_code code)
{
    char capname[CONFIG_NAME_MAX + 8], taskname[TASK_ID_MAX + 8];
    struct access_entry e = {
        .conn = c->id,
        .msgid = m->msgid,
        .answered = true,
        .code = code,
        .elapsed_s = 0,
        .stalled_s = 0,
        .ttft_s = NAN,
        .tokens = NAN,
    };

    if (cap && cap->type == MSGPACK_OBJECT_STR) {
        rpc_quote_client_str(cap->via.str.ptr, cap->via.str.size, sizeof(capname) - 1, capname);
        e.capability = capname;
    }
    if (task && task->type == MSGPACK_OBJECT_STR) {
        rpc_quote_client_str(task->via.str.ptr, task->via.str.size, sizeof(taskname) - 1,
                             taskname);
        e.task = taskname;
    }
    access_peer(c->fd, &e.peer_pid, &e.peer_uid);
    access_log_write(c->srv->cfg, &e);
}

static void call_refuse(struct conn *c, const struct rpc_msg *m, const msgpack_object *cap,
                        const msgpack_object *task, enum pgw_code code, const char *why)
{
    conn_reply_error(c, m->msgid, code, why);
    call_log_refused(c, m, cap, task, code);
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
    struct server *srv = c->srv;
    const struct config *cfg = srv->cfg;
    double now = ev_now(srv->loop);
    char why[300], scope[CONFIG_NAME_MAX * 4];
    double deadline_s = 0;

    if (rpc_bind(m->params, spec, P_N, p, why, sizeof(why)) < 0) {
        call_refuse(c, m, NULL, NULL, PGW_BAD_REQUEST, why);
        return;
    }
    if (p[P_DEADLINE] && (!rpc_as_double(p[P_DEADLINE], &deadline_s) || !(deadline_s > 0) ||
                          !isfinite(deadline_s))) {
        call_refuse(c, m, p[P_CAP], p[P_TASK], PGW_BAD_REQUEST,
                         "parameter 'deadline_s': expected a positive number of seconds");
        return;
    }
    if (p[P_SCOPE] && (p[P_SCOPE]->via.str.size == 0 ||
                       rpc_str_copy(p[P_SCOPE], scope, sizeof(scope)) < 0 ||
                       memchr(scope, '\0', p[P_SCOPE]->via.str.size))) {
        snprintf(why, sizeof(why), "parameter 'scope': expected 1 to %zu bytes without NUL",
                 sizeof(scope) - 1);
        call_refuse(c, m, p[P_CAP], p[P_TASK], PGW_BAD_REQUEST, why);
        return;
    }
    const msgpack_object *capo = p[P_CAP];
    int ci = config_find_capability(cfg, capo->via.str.ptr, capo->via.str.size);
    const struct config_source *first = NULL;
    for (size_t i = 0; ci >= 0 && i < cfg->n_sources; i++) {
        if (cfg->sources[i].capability_index == (size_t)ci && !cfg->sources[i].retired) {
            first = &cfg->sources[i];
            break;
        }
    }
    if (!first) {
        char name[65];
        rpc_quote_client_str(capo->via.str.ptr, capo->via.str.size, sizeof(name) - 1, name);
        snprintf(why, sizeof(why), ci < 0 ? "unknown capability '%s'"
                                          : "capability '%s' has no source configured", name);
        call_refuse(c, m, p[P_CAP], p[P_TASK], PGW_UNKNOWN_CAPABILITY, why);
        return;
    }

    /* A call naming a task runs only while the task runs. */
    struct task *task = NULL;
    struct task_wait *tw = NULL;
    if (p[P_TASK]) {
        char id[TASK_ID_MAX + 1];
        if (p[P_TASK]->via.str.size == 0 || rpc_str_copy(p[P_TASK], id, sizeof(id)) < 0 ||
            memchr(id, '\0', p[P_TASK]->via.str.size)) {
            snprintf(why, sizeof(why), "parameter 'task_id': expected 1 to %d bytes without NUL",
                     TASK_ID_MAX);
            call_refuse(c, m, p[P_CAP], p[P_TASK], PGW_BAD_REQUEST, why);
            return;
        }
        if (!tasks_held_running(srv, id)) {
            /* Not held running here, or a copy that may be stale: ask the
             * record. */
            tw = calloc(1, sizeof(*tw));
            if (!tw) {
                call_refuse(c, m, p[P_CAP], p[P_TASK], PGW_INTERNAL, "out of memory");
                return;
            }
            memcpy(tw->id, id, sizeof(tw->id));
        } else {
            task = tasks_admit_call(c, m->msgid, id);
            if (!task) {
                call_log_refused(c, m, p[P_CAP], p[P_TASK], c->last_code);
                metrics_on_call_refused(srv->metrics, (size_t)ci, c->last_code);
                return;
            }
        }
    }

    struct call *k = calloc(1, sizeof(*k));
    if (!k) {
        call_refuse(c, m, p[P_CAP], p[P_TASK], PGW_INTERNAL, "out of memory");
        free(tw);
        return;
    }
    k->conn = c;
    k->msgid = m->msgid;
    k->stream = p[P_STREAM] && p[P_STREAM]->via.boolean;
    k->cap = &cfg->capabilities[ci];
    k->started = now;
    k->ttft_s = k->tokens = NAN;
    access_peer(c->fd, &k->peer_pid, &k->peer_uid);
    if (p[P_TASK])
        rpc_str_copy(p[P_TASK], k->task_id, sizeof(k->task_id));
    msgpack_sbuffer_init(&k->usage);
    msgpack_sbuffer_init(&k->body);
    transcode_buf_init(&k->json);
    ev_init(&k->wake_w, call_on_wake_timer);
    k->wake_w.data = k;

    /* Keep the body (the frame it came in dies after dispatch) and check it
     * can be sent at all before anything is reserved. */
    msgpack_packer bpk;
    msgpack_packer_init(&bpk, &k->body, msgpack_sbuffer_write);
    int rc = msgpack_pack_object(&bpk, *p[P_BODY]);
    if (rc == 0)
        rc = call_prepare_json(k, first->model, why, sizeof(why));
    struct gov_policy pol;
    governor_policy(cfg, (size_t)ci, &pol);
    if (rc == 0)
        rc = gov_call_init(&k->g, &srv->gov, (uint32_t)ci, p[P_SCOPE] ? scope : k->cap->name,
                           &pol, deadline_s > 0 ? now + deadline_s : 0,
                           governor_estimate_tokens(k->json.len, body_max_tokens(p[P_BODY])), now);
    if (rc < 0) {
        call_refuse(c, m, p[P_CAP], p[P_TASK],
                    rc == TRANSCODE_EINVALID ? PGW_BAD_REQUEST : PGW_INTERNAL,
                    rc == TRANSCODE_EINVALID ? why : "out of memory");
        metrics_on_call_refused(srv->metrics, (size_t)ci, c->last_code);
        msgpack_sbuffer_destroy(&k->usage);
        msgpack_sbuffer_destroy(&k->body);
        transcode_buf_fini(&k->json);
        free(k);
        free(tw);
        return;
    }
    k->g.ud = k;
    k->src = first;
    k->code = PGW_CANCELLED;
    metrics_on_call_start(srv->metrics, (size_t)ci);
    if (task)
        call_task_link(k, task);
    k->next = c->calls;
    if (c->calls)
        c->calls->prev = k;
    c->calls = k;
    k->all_next = srv->calls_all;
    if (srv->calls_all)
        srv->calls_all->all_prev = k;
    srv->calls_all = k;
    c->in_flight++;
    srv->stats.in_flight++;
    if (tw) {
        tw->k = k;
        k->task_wait = tw;
        tasks_guard_remote(srv, tw->id, call_on_task_checked, tw);
        return;
    }
    call_step(k);
}

/* Tears down the call's attempt and frees the call without answering. */
static void call_abort(struct call *k)
{
    if (k->attempt) {
        metrics_on_attempt_cancelled(k->conn->srv->metrics, call_source(k));
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
    msgpack_pack_uint32(&c->pk, k->g.attempts);
    rpc_pack_kv_double(&c->pk, "stalled_s", gov_call_stalled_s(&k->g, ev_now(c->srv->loop)));
    rpc_pack_error_end(&c->pk);
    conn_response_done(c, PGW_CANCELLED);
    call_set_answered(k, PGW_CANCELLED);
    call_abort(k);
    return 0;
}

void call_fail_all(struct conn *c, enum pgw_code code, const char *message)
{
    while (c->calls) {
        struct call *k = c->calls;
        rpc_pack_error_begin(&c->pk, k->msgid, code, message, 1);
        rpc_pack_str(&c->pk, "attempts");
        msgpack_pack_uint32(&c->pk, k->g.attempts);
        rpc_pack_error_end(&c->pk);
        conn_response_done(c, code);
        call_set_answered(k, code);
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
            call_set_paused(k, false);
            attempt_resume(k->attempt);
        }
    }
}

void call_fail_task(struct task *t, enum pgw_code code, const char *message)
{
    while (t->ud) {
        struct call *k = t->ud;
        struct conn *c = k->conn;
        rpc_pack_error_begin(&c->pk, k->msgid, code, message, 3);
        rpc_pack_str(&c->pk, "attempts");
        msgpack_pack_uint32(&c->pk, k->g.attempts);
        rpc_pack_kv_double(&c->pk, "stalled_s", gov_call_stalled_s(&k->g, ev_now(c->srv->loop)));
        rpc_pack_kv_str(&c->pk, "reason", task_reason(t));
        rpc_pack_error_end(&c->pk);
        conn_response_done(c, code);
        call_set_answered(k, code);
        call_abort(k); /* unlinks k from t */
        conn_flush(c);
    }
}

void call_forget_task(struct task *t)
{
    while (t->ud)
        call_task_unlink(t->ud);
}

bool call_uses_source(const struct server *srv, size_t i)
{
    const struct config_source *src = &srv->cfg->sources[i];

    for (const struct call *k = srv->calls_all; k; k = k->all_next)
        if (k->src == src)
            return true;
    return false;
}

void call_reconf_abort(struct server *srv)
{
    for (struct call *k = srv->calls_all; k; k = k->all_next) {
        free(k->reconf_notes);
        k->reconf_notes = NULL;
    }
}

int call_reconf_prepare(struct server *srv, const struct gov_reconf *r)
{
    for (struct call *k = srv->calls_all; k; k = k->all_next)
        if (gov_call_reconf_prepare(&k->g, r, &k->reconf_notes) < 0) {
            call_reconf_abort(srv);
            return -1;
        }
    return 0;
}

void call_reconf_commit(struct server *srv, const struct gov_reconf *r, const struct config *cfg)
{
    const struct config *old = srv->cfg;

    for (struct call *k = srv->calls_all; k; k = k->all_next) {
        gov_call_reconf_commit(&k->g, r, k->reconf_notes);
        k->reconf_notes = NULL;
        k->cap = &cfg->capabilities[k->cap - old->capabilities];
        size_t i = (size_t)(k->src - old->sources);
        k->src = i < r->n_old && r->to[i] >= 0 ? &cfg->sources[r->to[i]] : NULL;
        /* json_model pointed into the old configuration's strings. */
        k->json_ready = false;
        k->json_model = NULL;
        /* A call waiting for a source may now have a new one: let it look
         * (one in backoff keeps its backoff). */
        if (k->g.state == GOV_CALL_WAITING && !k->admit && !k->task_wait)
            call_on_gov_wake(&k->g, srv);
    }
}
