/*
 * call.c — a call: one client request to a capability, run by the
 * governed loop (src/gov.h) over attempts on the upstream engine, and
 * answered — through the sink of whichever front end took it — with the
 * result, a stream of events, or a typed error (docs/DESIGN.md §3.6).
 *
 * The loop, per call:
 *
 *   call_begin ─> call_step ─┬─ ATTEMPT(source) ─> attempt_start ─> call_on_attempt_done
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
 * Front ends. The answer goes to a sink (call.h): the msgpack-RPC
 * connection or the HTTP one. This file builds one front-end-neutral
 * answer — the reply's JSON and msgpack forms, each stream event's, or the
 * error object of proto/PROTOCOL.md — and the sink writes it in its own
 * protocol. The body arrives as msgpack (transcoded to JSON per source
 * model) or as JSON text (sent as it is unless a source sets `model`).
 *
 * Lifetime: a call belongs to its sink's list from call_begin until it is
 * answered (call_end). If the client disconnects, every call of the sink
 * is cancelled at once: the attempt is torn down (closing its upstream
 * connection), its permit released, and nothing is answered. `cancel`
 * answers the call with `cancelled` immediately, then tears it down the
 * same way.
 *
 * Streams: each SSE event is transcoded and handed to the sink. When the
 * sink's write queue is full (it says so) the upstream transfer is paused
 * (curl stops reading, TCP pushes back on the upstream) and resumed when it
 * drains, so a slow client never makes us buffer an unbounded stream.
 */
#include "call.h"
#include "strbuf.h"
#include "dlist.h"

#include "core/server.h"
#include "rpc.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "access.h"
#include "backend/backend.h"
#include "backend/respids.h"
#include "codec/convert.h"
#include "codec/converse.h"
#include "codec/dialect.h"
#include "call/cloudsign.h"
#include "call/upath.h"
#include "call/calltrace.h"
#include "backend/cache.h"
#include "governor.h"
#include "codec/jscan.h"
#include "codec/reply.h"
#include "core/log.h"
#include "metrics/metrics.h"
#include "core/models.h"
#include "rawcall.h"
#include "redact.h"
#include "task.h"
#include "tasks.h"
#include "codec/transcode.h"
#include "upstream/upstream.h"
#include "utf8.h"

/* The API of a cloud a Messages body is remade for (call_prepare_json):
 * Bedrock's InvokeModel, Bedrock's Converse (converse.h), Vertex AI's
 * rawPredict; none for every other source. */
enum cloud_body { CLOUD_NONE, CLOUD_BEDROCK, CLOUD_CONVERSE, CLOUD_VERTEX };

/* How the client's body is sent to a source (call_prepare_json). */
enum body_form {
    BODY_AS_IS,        /* the body as the client sent it */
    BODY_STREAM_USAGE, /* + stream_options.include_usage (OpenAI dialect streams) */
    BODY_TO_ANTHROPIC, /* an OpenAI chat body converted (accepts: openai), and the
                          * answer converted back (convert.h) */
};

/* ---- The response cache (backend/cache.h, docs/CONFIG.md "cache") ------
 *
 * A hit is answered before anything is reserved, with source "cache" and
 * no attempt: no permit, no bucket, no quota, no progress. Only
 * successful, complete answers are stored: never an error, a stream cut
 * midway, a passthrough, or an answer the upstream marked no-store or
 * private. A call of a task (which must only run while its
 * task runs) and a Responses follow-up bypass the cache.
 *
 * An entry's records: a plain answer is [body, usage]; a stream is one
 * [event name, JSON data, msgpack data] record per event relayed. The
 * last record is the answer's meta: `a` holds its form ('p' plain, 's'
 * stream) and the call_info flags a replay needs (anthropic,
 * done_marker). */

struct callcache {
    struct cache_key key;
    struct cache_fill *fill; /* owned: the answer being collected, NULL: not stored */
    double ttl_s;
    const char *state; /* "hit" | "miss" | "bypass", NULL: the capability is not cached */
    /* Coalescing: a call identical to one in flight (its `leader`, which
     * lists it in `waiters`) waits for the leader's end instead of going
     * upstream; `waiting` until it wakes (call_cache_wake). */
    struct call *leader, *waiters, *wprev, *wnext;
    bool waiting;
    /* The shared tier (Redis backend): a miss here asks it before going
     * upstream; `lookup` until it answers (or the call's deadline comes).
     * `uncounted`: the miss is counted when the lookup is over. */
    struct cache_lookup_wait *lookup;
    bool uncounted;
    /* Fleet coalescing (call_cache_poll): this call holds the entry's
     * lock / waits for the next poll / has polled; the poll interval; the
     * call's deadline (ev_now time, 0: none). */
    bool fleet_leader, polling, polled;
    double poll_s, deadline_at;
    /* The entry's name in the shared tier (cache_shared_name) and, while
     * `fleet_leader`, the token its lock holds. */
    char shared[CACHE_SHARED_NAME_LEN + 1];
    char lock_token[BACKEND_LOCK_TOKEN_MAX];
};

struct cache_lookup_wait {
    struct call *k; /* NULL: the call ended or stopped waiting */
};

/* A shared-tier value: the entry's expiry (Unix seconds, a double in the
 * host's byte order: the fleet runs one build) then its records. */
#define CACHE_SHARED_HEAD sizeof(double)

static int callcache_key(const struct call_sink *s, const struct call_req *r,
                         const struct config_capability *cap, const char *app,
                         struct cache_key *key)
{
    unsigned form =
        (r->stream ? CACHE_FORM_STREAM : 0) | (s->ops->wants_msgpack ? CACHE_FORM_MSGPACK : 0);
    const char *ns = cap->cache.shared ? "" : app; /* an app name is never empty */

    if (!r->json)
        return cache_key_make(key, ns, cap->name, r->model, r->model_len, form, r->mp);
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_unpacked up;
    int rc = -1;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_unpacked_init(&up);
    if (transcode_json_to_msgpack(r->json, r->json_len, &pk, NULL, NULL, 0) == 0 &&
        msgpack_unpack_next(&up, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS)
        rc = cache_key_make(key, ns, cap->name, r->model, r->model_len, form, &up.data);
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

/* Replays entry `e` to the sink. A stream's events are relayed whatever
 * the sink's write queue holds: an entry is bounded by max_entry_bytes. */
static int callcache_replay(struct call_sink *s, uint32_t id, const struct cache_entry *e,
                            bool event_names)
{
    struct cache_rec cur, next, meta = { 0 };
    size_t pos = 0, scan = 0;
    struct call_info ci = { .source = "cache", .cache = "hit", .event_names = event_names };
    struct call_body b = { 0 };

    while (cache_entry_next(e, &scan, &next))
        meta = next; /* the last record */
    ci.anthropic = meta.a_len >= 3 && meta.a[1] == '1';
    ci.done_marker = meta.a_len >= 3 && meta.a[2] == '1';
    bool stream = meta.a_len >= 3 && meta.a[0] == 's';
    for (bool more = cache_entry_next(e, &pos, &cur); more; cur = next) {
        size_t at = pos;
        if (!cache_entry_next(e, &at, &next))
            break; /* cur is the meta record */
        pos = at;
        if (stream) {
            ci.event = cur.name;
            if (s->ops->on_chunk(s, id, &ci, cur.a, cur.a_len, cur.b_len ? cur.b : NULL,
                                 cur.b_len) < 0)
                return -1; /* the client is gone: the sink tore its calls down */
        } else if (s->ops->wants_msgpack) {
            b.mp = cur.a;
            b.mp_len = cur.a_len;
            b.usage = cur.b_len ? cur.b : NULL;
            b.usage_len = cur.b_len;
        } else {
            b.json = cur.a;
            b.json_len = cur.a_len;
        }
    }
    ci.event = NULL;
    s->ops->on_result(s, id, &ci, &b);
    return 0;
}

/* Counts `ev` process-wide and for capability `ci`. */
static void callcache_count(struct server *srv, size_t ci, enum cache_event ev)
{
    cache_count(srv->cache, ev);
    metrics_on_cache(srv->metrics, ci, ev);
}

static int callcache_begin(struct call_sink *s, uint32_t id, const struct call_req *r, size_t ci,
                           const char *app, struct callcache *cc)
{
    struct server *srv = s->srv;
    const struct config_capability *cap = &srv->cfg->capabilities[ci];
    double now = ev_now(srv->loop);

    memset(cc, 0, sizeof(*cc));
    if (cap->cache.ttl_s <= 0 || !srv->cache)
        return 0;
    /* A passthrough, a follow-up and a call of a task (which must run only
     * while its task runs) are never cached. */
    if (r->raw || r->response_id || r->task_id || r->cache == CACHE_NO_STORE ||
        callcache_key(s, r, cap, app, &cc->key) < 0) {
        cc->state = "bypass";
        callcache_count(srv, ci, CACHE_BYPASS);
        return 0;
    }
    if (r->cache != CACHE_NO_CACHE) {
        const struct cache_entry *e =
            cache_get(srv->cache, &cc->key, now, r->cache_max_age ? r->cache_max_age_s : -1);
        if (e) {
            callcache_count(srv, ci, CACHE_HIT);
            bool answered = callcache_replay(s, id, e, r->event_names) == 0;
            struct access_entry ae = {
                .conn = s->conn_id,
                .msgid = id,
                .app = app,
                .capability = cap->name,
                .source = "cache",
                .peer_pid = s->peer_pid,
                .peer_uid = s->peer_uid,
                .answered = answered,
                .code = PGW_OK,
                .stream = r->stream,
                .ttft_s = r->stream ? 0 : NAN,
                .tokens = NAN,
                .cache = "hit",
            };
            access_log_write(srv->cfg, &ae);
            if (answered)
                s->ops->flush(s);
            return 1;
        }
    }
    /* With a shared tier the miss is counted once it is asked too. */
    cc->uncounted = r->cache == CACHE_USE && backend_has_cache(srv->backend);
    if (!cc->uncounted)
        callcache_count(srv, ci, CACHE_MISS);
    cc->state = "miss";
    cc->ttl_s = cap->cache.ttl_s;
    cc->fill = cache_fill_new(cap->cache.max_entry_bytes);
    if (cc->fill)
        cache_fill_tag(cc->fill, cap->name, cap->cache.shared ? "" : app);
    cache_shared_name(&cc->key, cap->name, cap->cache.shared ? "" : app, cc->shared);
    return 0;
}

static void callcache_on_chunk(struct callcache *cc, const struct call_info *ci, const char *json,
                               size_t json_len, const char *mp, size_t mp_len)
{
    if (cc->fill && cache_fill_add(cc->fill, ci->event, json, json_len, mp, mp_len) < 0) {
        cache_fill_free(cc->fill); /* too big: relayed, never stored */
        cc->fill = NULL;
    }
}

static void callcache_on_result(struct server *srv, struct callcache *cc,
                                const struct call_info *ci, const struct call_body *b,
                                const char *upstream_cc, double now)
{
    struct cache_fill *f = cc->fill;
    char meta[3];

    cc->fill = NULL;
    if (!f)
        return;
    double ttl = cache_upstream_ttl(upstream_cc, cc->ttl_s);
    if (!(ttl > 0) || b->raw) {
        cache_fill_free(f);
        return;
    }
    meta[0] = b->json || b->mp ? 'p' : 's';
    meta[1] = ci->anthropic ? '1' : '0';
    meta[2] = ci->done_marker ? '1' : '0';
    int rc = 0;
    if (b->json)
        rc = cache_fill_add(f, NULL, b->json, b->json_len, NULL, 0);
    else if (b->mp)
        rc = cache_fill_add(f, NULL, b->mp, b->mp_len, b->usage, b->usage_len);
    if (rc == 0)
        rc = cache_fill_add(f, NULL, meta, sizeof(meta), NULL, 0);
    if (rc < 0) {
        cache_fill_free(f);
        return;
    }
    size_t len;
    const char *bytes = cache_fill_bytes(f, &len);
    if (len && backend_has_cache(srv->backend)) {
        struct strbuf v = { 0 };
        double expires_at = now + ttl;
        if (strbuf_put(&v, &expires_at, sizeof(expires_at)) == 0 && strbuf_put(&v, bytes, len) == 0)
            backend_cache_put(srv->backend, cc->shared, v.data, v.len, ttl);
        strbuf_fini(&v);
    }
    cache_put(srv->cache, &cc->key, f, now, now + ttl);
}

static void callcache_fini(struct callcache *cc)
{
    cache_fill_free(cc->fill);
    cc->fill = NULL;
}

/* Why a reservation was refused: which budget, for the error. */
struct call_refusal {
    char budget[TASK_ID_MAX + 32]; /* "app:NAME:daily", "source:NAME:total", "task:ID:total" */
    bool task;                     /* the task's: the task stops */
    bool source;                   /* the source's: another source may take the call */
    struct budget_refusal r;
};

struct call {
    struct call_sink *sink;
    struct server *srv;
    struct call *prev, *next; /* sink->calls */
    uint32_t msgid;           /* the sink's id for it */
    bool stream;
    const struct config_capability *cap;
    const struct config_source *src; /* the current (or last) attempt's source */
    struct attempt *attempt;
    struct backend_admit *admit; /* admission asked, not answered yet */
    struct backend_lease *lease; /* the attempt's fleet permit, when the backend has one */
    char backend_why[64];        /* why the backend could not admit, for the error */
    double started;
    bool paused;
    struct gov_call g;    /* the governed loop's state */
    ev_timer wake_w;      /* WAIT / backoff */
    msgpack_sbuffer body; /* the client's msgpack body, packed (kept for retries) */
    struct strbuf raw;    /* or its JSON body, as it came */
    bool body_is_json;
    struct strbuf json;         /* its JSON for `json_model` and `json_form` */
    const char *json_model;     /* model override `json` was made with */
    enum body_form json_form;   /* what `json` was made for */
    enum cloud_body json_cloud; /* ... and for which cloud API (pack_for_cloud) */
    bool json_ready;
    enum body_form form;         /* the current attempt's */
    bool has_stream_options;     /* the body has a top-level stream_options */
    bool client_usage;           /* ... asking for include_usage */
    msgpack_sbuffer usage;       /* the `usage` map for the result, packed */
    struct dialect_usage tokens; /* the current attempt's token counts */
    struct convert_stream *conv; /* owned; made for the first BODY_TO_ANTHROPIC attempt */
    char event_error[96];        /* why the attempt's stream was refused, or "" */
    uint32_t relayed;            /* chunks of the attempt relayed to the client */
    struct task *task;           /* the task it belongs to, or NULL */
    struct task_wait *task_wait; /* its task is being checked by the backend */
    struct call *tprev, *tnext;  /* the task's calls (head in task->ud) */
    enum pgw_code code;          /* how it was answered (PGW_CANCELLED: not answered) */
    char app[CONFIG_NAME_MAX];   /* who is calling (call_req.app) */
    char *model_param;           /* owned: the msgpack `model` parameter, or NULL */
    char *query;                 /* owned: the client's query string (call_req.query) */
    char *beta_line;             /* owned: "anthropic-beta: ...\r\n" (call_req), or NULL */
    bool event_names;            /* call_req.event_names */
    char *model_label;           /* owned: the configured model name it matched,
                                  * "other", or NULL: it named none (models.h) */
    /* For the access log (access.h). */
    bool answered;               /* a response was queued */
    int last_status;             /* the last attempt's HTTP status */
    double ttft_s;               /* NAN until a chunk is relayed */
    double used_tokens;          /* total tokens of the answer, NAN: unknown */
    double cost;                 /* what the answer cost (cost.h), NAN: unknown */
    double est_in, est_out;      /* its worst case in tokens, for budgets */
    double reserved;             /* the attempt's reservation on budgets ... */
    unsigned reserved_on;        /* ... 1 << CALL_BUDGET_*: which ones */
    struct backend_spend *spend; /* a fleet budget reservation asked */
    bool fleet_reserved;         /* the fleet's budgets hold `fleet_amount` */
    double fleet_amount;
    /* The task run's budget among them (fleet_task.limit > 0), its ID
     * kept here: the task may be unlinked before the settling. */
    struct backend_spend_task fleet_task;
    char fleet_task_id[TASK_ID_MAX + 1];
    /* The last source whose budget refused the call (src_refused): the
     * error when no source is left to take it. */
    struct call_refusal src_refusal;
    bool src_refused;
    /* The fleet's admission, pipelined with that reservation, answered
     * first: kept until the reservation is. */
    struct {
        bool held;
        int rc;
        struct backend_lease *lease;
        double retry_at;
        char why[64];
    } early;
    char *task_id;                        /* owned; NULL when the call names none */
    struct gov_source_note *reconf_notes; /* a reload in progress: the new notes */
    struct call *all_prev, *all_next;     /* srv->calls_all: every call, for a reload */
    struct raw_call *rawc;                /* owned: a passthrough's request, or NULL */
    struct calltrace ct;                  /* its spans (calltrace.h) */
    struct resp_wait *resp_wait;          /* the source of the response it follows is
                                           * being looked up */
    bool resp_noted;                      /* its answer's response id was remembered */
    bool past_end;                        /* the attempt's stream sent its terminal event */
    struct callcache cc;                  /* its use of the response cache */
};

static void call_step(struct call *k);

/* A call naming a task not held running here waits for the record's answer. */
struct task_wait {
    struct call *k; /* NULL once the call is gone */
    char id[TASK_ID_MAX + 1];
};
static void call_act(struct call *k, const struct gov_decision *d,
                     const struct attempt_result *last);

/* A call following a Responses API response waits for the backend to say
 * which source produced it. */
struct resp_wait {
    struct call *k; /* NULL once the call is gone */
    char id[RESPIDS_ID_MAX + 1];
};

static void call_unlink(struct call *k)
{
    struct call_sink *s = k->sink;

    DLIST_UNLINK(k->srv->calls_all, k, all_prev, all_next);
    DLIST_UNLINK(s->calls, k, prev, next);
    s->n_calls--;
    k->srv->stats.in_flight--;
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
        k->sink->paused_calls++;
    else
        k->sink->paused_calls--;
}

/* The task's calls: a list headed by task->ud. */
static void call_task_link(struct call *k, struct task *t)
{
    k->task = t;
    DLIST_PUSH(t->ud, k, tprev, tnext);
}

static void call_task_unlink(struct call *k)
{
    if (!k->task)
        return;
    DLIST_UNLINK(k->task->ud, k, tprev, tnext);
    k->task = NULL;
    k->tprev = k->tnext = NULL;
}

static double call_elapsed(const struct call *k)
{
    return ev_now(k->srv->loop) - k->started;
}

/* Indexes of the call's capability and current source (metrics slots). */
static size_t call_cap(const struct call *k)
{
    return (size_t)(k->cap - k->srv->cfg->capabilities);
}

static size_t call_source(const struct call *k)
{
    return (size_t)(k->src - k->srv->cfg->sources);
}

static void call_log(const struct call *k)
{
    const struct server *srv = k->srv;
    double now = ev_now(srv->loop);
    const struct access_entry e = {
        .conn = k->sink->conn_id,
        .msgid = k->msgid,
        .app = k->app,
        .capability = k->cap->name,
        .scope = k->g.scope,
        .model = k->model_label,
        .source = k->g.attempts > 0 && k->src ? k->src->name : NULL,
        .task = k->task_id,
        .peer_pid = k->sink->peer_pid,
        .peer_uid = k->sink->peer_uid,
        .answered = k->answered,
        .code = k->code,
        .stream = k->stream,
        .attempts = k->g.attempts,
        .status = k->last_status,
        .elapsed_s = now - k->started,
        .stalled_s = gov_call_stalled_s(&k->g, now),
        .ttft_s = k->ttft_s,
        .tokens = k->used_tokens,
        .cost = k->cost,
        .cache = k->cc.state,
    };
    access_log_write(srv->cfg, &e);
}

/* Frees what a call owns, and the call: the last step of call_end, and
 * all there is to free for a call refused before it started. */
/* "Name: value\r\n", allocated; NULL when out of memory. */
static char *header_line(const char *name, const char *value)
{
    size_t n = strlen(name) + strlen(value) + 5;
    char *line = malloc(n);

    if (line)
        snprintf(line, n, "%s: %s\r\n", name, value);
    return line;
}

static void call_free_memory(struct call *k)
{
    msgpack_sbuffer_destroy(&k->usage);
    msgpack_sbuffer_destroy(&k->body);
    strbuf_fini(&k->raw);
    strbuf_fini(&k->json);
    free(k->conv);
    free(k->task_id);
    free(k->model_param);
    free(k->model_label);
    free(k->query);
    free(k->beta_line);
    raw_call_free(k->rawc);
    callcache_fini(&k->cc);
    free(k);
}

/* The miss of a call whose shared-tier lookup is over, counted once. */
static void call_cache_count_miss(struct call *k)
{
    if (k->cc.uncounted)
        callcache_count(k->srv, call_cap(k), CACHE_MISS);
    k->cc.uncounted = false;
}

static void call_cache_lookup_detach(struct call *k)
{
    if (k->cc.lookup)
        k->cc.lookup->k = NULL;
    k->cc.lookup = NULL;
}

/* Coalescing. A call that ends detaches from its leader; a leader that
 * ends (answered, failed, cancelled or torn down) wakes its waiters on the
 * next loop pass, never inside its own end: each then takes the entry the
 * leader stored, or, when there is none (the leader failed, or its answer
 * could not be stored), goes upstream itself. */
static void call_cache_release(struct call *k)
{
    struct callcache *cc = &k->cc;

    if (cc->leader)
        DLIST_UNLINK(cc->leader->cc.waiters, k, cc.wprev, cc.wnext);
    cc->leader = NULL;
    while (cc->waiters) {
        struct call *w = cc->waiters;
        DLIST_UNLINK(cc->waiters, w, cc.wprev, cc.wnext);
        w->cc.leader = NULL;
        ev_timer_stop(k->srv->loop, &w->wake_w);
        ev_timer_set(&w->wake_w, 0, 0);
        ev_timer_start(k->srv->loop, &w->wake_w);
    }
}

/* Budgets (docs/CONFIG.md §12a). A reservation is the attempt's worst
 * case at its source's prices, taken on each budget that covers it: its
 * app's, its source's and its task's run's. It is settled with the real
 * cost when the attempt ends, given back when the attempt failed before
 * relaying anything, and charged as reserved when its cost is unknown
 * although the upstream may bill it (a stream cut, an attempt torn down).
 * App and source budgets are found again by index at the settling: a
 * reload in between keeps each one's state by name (backend.h). */
enum { CALL_BUDGET_APP, CALL_BUDGET_SOURCE, CALL_BUDGET_TASK, CALL_BUDGETS };

/* The budgets covering an attempt of `k` on `source` (NULL: none). */
static void call_budgets(const struct call *k, size_t source, struct budget **b)
{
    struct backend *be = k->srv->backend;

    b[CALL_BUDGET_APP] = backend_budget(be, true, k->g.app);
    b[CALL_BUDGET_SOURCE] = backend_budget(be, false, source);
    /* A shared backend keeps the task's budget for the fleet (call_reserve_fleet). */
    b[CALL_BUDGET_TASK] =
        k->task && k->task->has_budget && !be->ops->shared ? &k->task->budget : NULL;
}

/* call_settle's `actual` for "charge what was reserved". */
#define CALL_AS_RESERVED INFINITY

/* Ends the attempt's reservations: `actual` (>= 0) charged in their
 * place, NAN given back, CALL_AS_RESERVED charged as reserved. */
static void call_settle(struct call *k, double actual)
{
    struct budget *b[CALL_BUDGETS];
    double now = ev_time();

    if (k->fleet_reserved) {
        struct backend *be = k->srv->backend;
        be->ops->spend_settle(be, k->g.app, call_source(k),
                              k->fleet_task.limit > 0 ? &k->fleet_task : NULL, k->fleet_amount,
                              actual == CALL_AS_RESERVED ? k->fleet_amount : actual);
        k->fleet_reserved = false;
    }
    if (actual == CALL_AS_RESERVED)
        actual = k->reserved;
    if (!k->reserved_on)
        return;
    call_budgets(k, call_source(k), b);
    for (int i = 0; i < CALL_BUDGETS; i++)
        if ((k->reserved_on & 1u << i) && b[i])
            budget_settle(b[i], k->reserved, actual, now);
    k->reserved_on = 0;
    k->reserved = 0;
}

/* Reserves the worst case of an attempt on `source` on every budget that
 * covers it, all or none. Returns 0, or -1 with *why. */
static int call_reserve(struct call *k, size_t source, struct call_refusal *why)
{
    static const char *const kind[CALL_BUDGETS] = { "app", "source", "task" };
    const struct config *cfg = k->srv->cfg;
    struct budget *b[CALL_BUDGETS];
    double now = ev_time();

    call_budgets(k, source, b);
    if (!b[0] && !b[1] && !b[2])
        return 0;
    double amount = cost_worst(&cfg->sources[source].prices, k->est_in, k->est_out);
    if (!cost_is_known(amount))
        amount = 0; /* unpriced: the loader lets no app or source budget cover it */
    for (int i = 0; i < CALL_BUDGETS; i++) {
        if (!b[i] || budget_reserve(b[i], amount, now, &why->r) == 0)
            continue;
        for (int j = 0; j < i; j++)
            if (b[j])
                budget_settle(b[j], amount, NAN, now);
        const char *name = i == CALL_BUDGET_APP ? k->app
            : i == CALL_BUDGET_SOURCE           ? cfg->sources[source].name
                                                : k->task->id;
        snprintf(why->budget, sizeof(why->budget), "%s:%s:%s", kind[i], name,
                 budget_window_name(why->r.window));
        why->task = i == CALL_BUDGET_TASK;
        why->source = i == CALL_BUDGET_SOURCE;
        return -1;
    }
    k->reserved = amount;
    k->reserved_on = 0;
    for (int i = 0; i < CALL_BUDGETS; i++)
        k->reserved_on |= b[i] ? 1u << i : 0;
    return 0;
}

static void call_end(struct call *k)
{
    struct server *srv = k->srv;

    call_log(k);
    if (k->task_wait)
        k->task_wait->k = NULL;
    k->task_wait = NULL;
    if (k->resp_wait)
        k->resp_wait->k = NULL;
    k->resp_wait = NULL;
    call_cache_lookup_detach(k);
    call_cache_count_miss(k);
    k->cc.polling = false;
    if (k->cc.fleet_leader) { /* after its entry, if any, was written */
        backend_cache_unlock(srv->backend, k->cc.shared, k->cc.lock_token);
        k->cc.fleet_leader = false;
    }
    if (k->admit)
        backend_admit_detach(srv->backend, k->admit);
    if (k->spend)
        srv->backend->ops->spend_detach(srv->backend, k->spend);
    k->spend = NULL;
    if (k->early.held && k->early.rc > 0 && k->early.lease)
        backend_release(srv->backend, k->early.lease, NULL, NULL);
    k->early.held = false;
    if (k->lease)
        backend_release(srv->backend, k->lease, NULL, NULL);
    k->admit = NULL;
    k->lease = NULL;
    call_settle(k, NAN); /* a reservation whose attempt never started */
    call_task_unlink(k);
    call_set_paused(k, false);
    ev_timer_stop(srv->loop, &k->wake_w);
    call_cache_release(k);
    if (k->model_label)
        metrics_on_model_call(srv->metrics, call_cap(k), k->model_label, k->code);
    metrics_on_call_end(srv->metrics, call_cap(k), k->code, call_elapsed(k),
                        gov_call_stalled_s(&k->g, ev_now(srv->loop)));
    calltrace_end(&k->ct, k->code, k->g.attempts > 0 && k->src ? k->src->name : NULL, k->g.attempts,
                  gov_call_stalled_s(&k->g, ev_now(srv->loop)), k->cost, ev_now(srv->loop));
    gov_call_fini(&k->g, ev_now(srv->loop));
    call_unlink(k);
    call_free_memory(k);
    server_on_request_done(srv);
}

/* Gives back what the buffer's growth left unused: a call keeps its body
 * for its whole life, and msgpack_sbuffer's first step is 8 KiB however
 * small the body (10,000 calls in flight would hold 80 MiB for a 200-byte
 * body). A failed shrink keeps the larger buffer. */
static void sbuffer_fit(msgpack_sbuffer *sb)
{
    if (!sb->data || sb->alloc == sb->size)
        return;
    char *p = realloc(sb->data, sb->size ? sb->size : 1);
    if (p) {
        sb->data = p;
        sb->alloc = sb->size ? sb->size : 1;
    }
}

/* Appends pre-packed msgpack bytes to a packer. */
/* Upstream bytes reach the client only through the functions below:
 * every secret the sidecar sent is scrubbed (redact.h), text is made valid
 * UTF-8, and JSON nests no deeper than the protocol lets a relayed value
 * nest (RPC_RELAYED_MAX_DEPTH), so a hostile reply can neither leak a key
 * nor make a frame the client's reader must refuse. */

/* Transcodes an upstream JSON text into `pk`, scrubbing every decoded
 * string (which also catches an echo written with JSON escapes). A parse
 * error's message may quote a short excerpt of the input: callers put it
 * only in a detail, which relay_text_inplace() scrubs. `usage` may be
 * NULL, else receives where the outermost object's `member` (NULL:
 * "usage") was packed. Returns as transcode_json_to_msgpack(). */
static int relay_json_pick(struct server *srv, const char *json, size_t len, msgpack_packer *pk,
                           struct transcode_span *usage, const char *member, char *err,
                           size_t errlen)
{
    const char *const pick[] = { member ? member : "usage", NULL };
    const struct transcode_j2m opt = { RPC_RELAYED_MAX_DEPTH, redact_on_str, srv->redact,
                                       usage ? pick : NULL, usage };

    return transcode_json_to_msgpack(json, len, pk, &opt, err, errlen);
}

static int relay_json(struct server *srv, const char *json, size_t len, msgpack_packer *pk,
                      struct transcode_span *usage, char *err, size_t errlen)
{
    return relay_json_pick(srv, json, len, pk, usage, "usage", err, errlen);
}

/* Packs upstream text as a str: scrubbed, invalid UTF-8 replaced with
 * U+FFFD, cut to at most `max` bytes on a character boundary. */
static void relay_text(struct server *srv, msgpack_packer *pk, const char *s, size_t n, size_t max)
{
    struct strbuf clean, valid;

    strbuf_init(&clean);
    strbuf_init(&valid);
    if (redact_copy(srv->redact, s, n, &clean) < 0 ||
        utf8_repair(clean.data, clean.len, &valid) < 0)
        rpc_pack_str(pk, "(upstream text dropped: out of memory)");
    else
        rpc_pack_strn(pk, valid.data, utf8_cut(valid.data, valid.len, max));
    strbuf_fini(&clean);
    strbuf_fini(&valid);
}

/* The same for a NUL-terminated text kept in buf[cap] (an error detail or
 * message that quotes upstream or curl text): rewritten in place. */
static void relay_text_inplace(struct server *srv, char *buf, size_t cap)
{
    struct strbuf clean, valid;
    size_t n = strnlen(buf, cap);

    if (n == 0)
        return;
    strbuf_init(&clean);
    strbuf_init(&valid);
    if (redact_copy(srv->redact, buf, n, &clean) < 0 ||
        utf8_repair(clean.data, clean.len, &valid) < 0) {
        snprintf(buf, cap, "(detail dropped: out of memory)");
    } else {
        n = utf8_cut(valid.data, valid.len, cap - 1);
        memcpy(buf, valid.data, n);
        buf[n] = '\0';
    }
    strbuf_fini(&clean);
    strbuf_fini(&valid);
}

/* True when some source sends a key (there is something to scrub). */
static bool secrets_configured(const struct config *cfg)
{
    for (size_t i = 0; i < cfg->n_sources; i++)
        if (cfg->sources[i].api_key)
            return true;
    return false;
}

/* For a sink that takes JSON only: upstream text as it is relayed, with
 * every secret scrubbed as relay_json() scrubs it for msgpack. A plain echo
 * is replaced in the text, which stays byte for byte otherwise. JSON that
 * could spell a secret with escapes (\u, \/) is decoded, scrubbed and
 * written again, when a key is configured at all. Text that is not JSON
 * (a stream's odd event) is also made valid UTF-8. Returns `s` itself when
 * nothing changed, else out->data (*n updated). */
static const char *relay_json_text(struct server *srv, const char *s, size_t *n, bool is_json,
                                   struct strbuf *out)
{
    struct strbuf clean;

    if (is_json && secrets_configured(srv->cfg) &&
        (memmem(s, *n, "\\u", 2) || memmem(s, *n, "\\/", 2))) {
        msgpack_sbuffer sb;
        msgpack_packer pk;
        msgpack_unpacked up;
        const struct transcode_j2m opt = { TRANSCODE_MAX_DEPTH, redact_on_str, srv->redact, NULL,
                                           NULL };
        int rc = -1;
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_unpacked_init(&up);
        if (transcode_json_to_msgpack(s, *n, &pk, &opt, NULL, 0) == 0 &&
            msgpack_unpack_next(&up, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS)
            rc = transcode_msgpack_to_json(&up.data, out, NULL, NULL, NULL, 0);
        msgpack_unpacked_destroy(&up);
        msgpack_sbuffer_destroy(&sb);
        if (rc == 0) {
            *n = out->len;
            return out->data;
        }
        strbuf_reset(out); /* not transcodable (e.g. a huge integer): as text */
    }
    if (is_json && !redact_hit(srv->redact, s, *n))
        return s;
    strbuf_init(&clean);
    long hits = redact_copy(srv->redact, s, *n, is_json ? out : &clean);
    if (hits >= 0 && !is_json)
        hits = utf8_repair(clean.data, clean.len, out) < 0 ? -1 : hits;
    strbuf_fini(&clean);
    if (hits < 0) {
        static const char dropped[] = "\"(upstream text dropped: out of memory)\"";
        *n = sizeof(dropped) - 1;
        return dropped;
    }
    *n = out->len;
    return out->data;
}

static enum pgw_code gov_code(enum gov_result r)
{
    switch (r) {
    case GOV_OK:
        return PGW_OK;
    case GOV_STALLED:
        return PGW_STALLED;
    case GOV_RETRY_EXHAUSTED:
        return PGW_RETRY_EXHAUSTED;
    case GOV_UPSTREAM_REJECTED:
        return PGW_UPSTREAM_REJECTED;
    case GOV_DEADLINE_EXCEEDED:
        return PGW_DEADLINE_EXCEEDED;
    case GOV_BACKEND_UNAVAILABLE:
        return PGW_BACKEND_UNAVAILABLE;
    case GOV_CANCELLED:
        return PGW_CANCELLED;
    case GOV_BUDGET_EXHAUSTED:
        return PGW_BUDGET_EXHAUSTED;
    }
    return PGW_INTERNAL;
}

/* Writes the `sources` list of an error: every source the call tried,
 * with its attempts and the reason of its last one. */
static void write_sources(struct writer *w, const struct call *k, const struct attempt_result *last)
{
    const struct config *cfg = k->srv->cfg;
    uint32_t n = 0;

    for (size_t i = 0; i < cfg->n_sources; i++)
        n += k->g.notes[i].tried;
    writer_array(w, n);
    for (size_t i = 0; i < cfg->n_sources; i++) {
        const struct gov_source_note *note = &k->g.notes[i];
        bool is_last = last && &cfg->sources[i] == k->src;
        if (!note->tried)
            continue;
        writer_map(w, 3 + (note->status ? 1 : 0) + (is_last ? 1 : 0));
        writer_kv_str(w, "name", cfg->sources[i].name);
        writer_kv_str(w, "reason", outcome_reason_name((enum outcome_reason)note->reason));
        writer_kv_u64(w, "attempts", note->attempts);
        if (note->status)
            writer_kv_i64(w, "status", note->status);
        if (is_last)
            writer_kv_str(w, "detail", last->detail);
    }
}

/* The error answer. `last` is the attempt that just ended, if any (it
 * carries the upstream status and body of a rejection). A verdict reached
 * at the top of the loop (stalled, deadline_exceeded after a backoff) has no
 * `last`, but the call may have made attempts: their last one is described
 * from the governed loop's note on that source, so that a call stalled by
 * a run of 429s does not claim it never attempted anything. */
static void call_error_done(struct call *k, const struct reply_error *e)
{
    k->code = e->code; /* what the call ended with, for metrics and the access log */
    k->answered = true;
    k->sink->ops->on_error(k->sink, k->msgid, e);
}

/* What a call's error carries beyond code and message (PROTOCOL.md §6.1):
 * attempts, stalled_s and sources always; the others where they apply. */
struct call_error {
    double retry_after_s;              /* < 0: absent (no estimate) */
    int http_status;                   /* 0: absent */
    const struct attempt_result *last; /* the attempt that just ended, or NULL */
    bool upstream_body;                /* relay last's body */
    const char *reason;                /* a task stop's reason, or NULL */
    const char *budget;                /* budget_exhausted: which budget, or NULL */
    double budget_left;                /* ... and what it has left */
};

/* What write_more of a call's error needs. */
struct call_error_more {
    const struct call *k;
    const struct attempt_result *last;
    const struct call_error *ce;
};

static void call_error_more(struct writer *w, const struct reply_error *e)
{
    const struct call_error_more *m = e->ud;
    writer_str(w, "sources");
    write_sources(w, m->k, m->last);
    if (m->ce->budget) {
        writer_kv_str(w, "budget", m->ce->budget);
        writer_kv_double(w, "left", m->ce->budget_left);
    }
}

/* The upstream's answer to a rejected request, as the error relays it:
 * JSON (valid, scrubbed) as it is, anything else as scrubbed UTF-8 text
 * of at most 4 KiB. */
static void call_upstream_body(struct call *k, const char *body, size_t len, struct strbuf *out,
                               struct reply_error *e)
{
    size_t n = len;
    bool json = len > 0 && jscan_check(body, len, NULL) == 0;
    const char *p = relay_json_text(k->srv, body ? body : "", &n, json, out);

    e->upstream_body = p;
    e->upstream_body_len = json ? n : utf8_cut(p, n, 4096);
    e->upstream_body_json = json;
}

/* The one maker of a call's error response. */
static void call_pack_error(struct call *k, enum pgw_code code, const char *msg,
                            const struct call_error *ce)
{
    const struct call_error_more more = { k, ce->last, ce };
    struct reply_error e = {
        .code = code,
        .message = msg,
        .app = k->app[0] ? k->app : CONFIG_DEFAULT_APP,
        .has_attempts = true,
        .attempts = k->g.attempts,
        .stalled_s = gov_call_stalled_s(&k->g, ev_now(k->srv->loop)),
        .retry_after_s = ce->retry_after_s,
        .status = ce->http_status,
        .reason = ce->reason,
        .n_more = ce->budget ? 3 : 1,
        .write_more = call_error_more,
        .ud = &more,
    };
    struct strbuf body;

    strbuf_init(&body);
    if (ce->upstream_body && ce->last)
        call_upstream_body(k, ce->last->body, ce->last->body_len, &body, &e);
    call_error_done(k, &e);
    strbuf_fini(&body);
}

/* An error that carries no retry hint and no upstream reply. */
static void call_reply_plain_error(struct call *k, enum pgw_code code, const char *message)
{
    call_pack_error(k, code, message, &(struct call_error){ .retry_after_s = -1 });
}

static void call_reply_error(struct call *k, enum pgw_code code, double retry_after_s,
                             const struct attempt_result *last)
{
    double now = ev_now(k->srv->loop);
    double stalled = gov_call_stalled_s(&k->g, now);
    const char *src = k->src ? k->src->name : "-";
    const struct gov_source_note *note =
        !last && k->g.attempts > 0 && k->src ? &k->g.notes[k->src - k->srv->cfg->sources] : NULL;
    const char *reason = last ? outcome_reason_name(last->outcome.reason)
        : note                ? outcome_reason_name((enum outcome_reason)note->reason)
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
                     k->g.scope, retry_after_s, k->g.pol.stall_window_s, stalled, k->g.attempts,
                     last || note ? src : "none", reason);
            break;
        }
        snprintf(msg, sizeof(msg),
                 "scope '%s' made no progress and this call spent %.3fs waiting, backing off "
                 "or rate-limited (stall_window_s %g); %u attempt(s), last: %s: %s",
                 k->g.scope, stalled, k->g.pol.stall_window_s, k->g.attempts,
                 last || note ? src : "none", reason);
        break;
    case PGW_RETRY_EXHAUSTED:
        snprintf(msg, sizeof(msg), "%u attempt(s) failed; last on %s: %s: %.160s", k->g.attempts,
                 src, reason, detail);
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
    relay_text_inplace(k->srv, msg, sizeof(msg)); /* %.160s may cut a character */
    const struct call_error ce = {
        .retry_after_s = retry_after_s >= 0 ? retry_after_s : 0,
        .http_status = http_status,
        .last = last,
        .upstream_body = rejected,
    };
    call_pack_error(k, code, msg, &ce);
}

/* What governance needs of a JSON reply or event of an OpenAI-dialect
 * upstream, found without a tree (for a sink that takes JSON only): its
 * usage counts (as openai_scan_usage reads them from a tree), whether a
 * choice has a finish_reason, whether it is the usage-only chunk
 * ("choices": []), and whether it reports an error. */
struct json_facts {
    struct dialect_usage usage;
    bool has_usage;
    bool terminal;
    bool empty_choices;
    bool has_error;
};

/* A JSON member's value as a count (dialect_openai_count's `count`). */
static int64_t json_count(const struct jscan_value *v)
{
    double t;
    return v->type == JSCAN_NULL ? -1
        : jscan_number(v, &t)    ? dialect_count_number(t)
                                 : DIALECT_COUNT_BOGUS;
}

static int usage_detail_member(void *ud, const char *key, const struct jscan_value *v)
{
    dialect_openai_detail(ud, key, strlen(key), json_count(v));
    return 0;
}

static int usage_member(void *ud, const char *key, const struct jscan_value *v)
{
    if (v->type == JSCAN_OBJECT &&
        (strcmp(key, "prompt_tokens_details") == 0 ||
         strcmp(key, "completion_tokens_details") == 0))
        jscan_object(v->p, v->len, usage_detail_member, ud, NULL);
    else
        dialect_openai_count(ud, key, strlen(key), json_count(v));
    return 0;
}

static int finish_member(void *ud, const char *key, const struct jscan_value *v)
{
    if (strcmp(key, "finish_reason") == 0 && v->type != JSCAN_NULL)
        *(bool *)ud = true;
    return 0;
}

static int choice_element(void *ud, const struct jscan_value *v)
{
    struct json_facts *f = ud;
    f->empty_choices = false;
    if (v->type == JSCAN_OBJECT)
        jscan_object(v->p, v->len, finish_member, &f->terminal, NULL);
    return 0;
}

/* A plain reply's members: only its usage counts, so its choices (most of
 * the text) are not walked again. */
static int reply_member(void *ud, const char *key, const struct jscan_value *v)
{
    struct json_facts *f = ud;
    if (v->type == JSCAN_OBJECT && strcmp(key, "usage") == 0) {
        f->has_usage = true;
        f->usage = DIALECT_USAGE_NONE;
        jscan_object(v->p, v->len, usage_member, &f->usage, NULL);
    }
    return 0;
}

/* A stream event's members: its usage, and whether it ends the stream or
 * reports an error. */
static int facts_member(void *ud, const char *key, const struct jscan_value *v)
{
    struct json_facts *f = ud;
    if (strcmp(key, "choices") == 0 && v->type == JSCAN_ARRAY) {
        f->empty_choices = true;
        jscan_array(v->p, v->len, choice_element, f, NULL);
    } else if (strcmp(key, "error") == 0 && v->type == JSCAN_OBJECT) {
        f->has_error = true;
    } else {
        reply_member(ud, key, v);
    }
    return 0;
}

/* The API the current source speaks at this call's capability path. */
static const struct dialect *call_dialect(const struct call *k)
{
    return dialect_for(k->src->kind, k->cap->path);
}

/* Events and replies of this attempt go through their msgpack form even
 * for a JSON-only sink: the dialect's readers and the conversion need it.
 * Only Chat Completions answers relayed as they are take the jscan path. */
static bool call_needs_tree(const struct call *k)
{
    return k->sink->ops->wants_msgpack || !call_dialect(k)->chat_facts;
}

/* Takes the counts `u` of a reply or event of the current attempt into
 * its running counts. Counts that cannot be true leave the attempt's usage
 * unknown (nothing is counted, the result has no `usage`): said once per
 * attempt. */
static void call_count_tokens(struct call *k, const struct dialect_usage *u)
{
    bool was_bogus = k->tokens.bogus;

    dialect_usage_merge(&k->tokens, u);
    if (k->tokens.bogus && !was_bogus)
        log_at(LOG_WARN, "upstream usage out of range: the attempt's tokens are not counted",
               "call", LOG_U, (unsigned long long)k->msgid, "app", LOG_S, k->app, "source", LOG_S,
               k->src->name, "attempt", LOG_U, (unsigned long long)k->g.attempts, "max", LOG_I,
               (long long)DIALECT_TOKENS_MAX, NULL);
}

/* The model label of the call's cost series: the configured name it
 * matched, else its source's public name, else "other" (bounded). */
static const char *call_cost_model(const struct call *k)
{
    return k->model_label ? k->model_label : k->src->model ? k->src->model : "other";
}

/* A success: its cost from the real usage at the source's prices (none
 * when the source is unpriced or the usage unknown, docs/CONFIG.md §7d),
 * counted by source, app and model. */
static void call_count_cost(struct call *k)
{
    struct cost_tokens t;

    if (!dialect_usage_classes(&k->tokens, &t))
        return;
    k->cost = cost_of(&k->src->prices, &t);
    if (cost_is_known(k->cost))
        gov_charge(&k->srv->gov, call_source(k), k->g.app, k->cost);
    metrics_on_usage(k->srv->metrics, call_source(k), k->app, call_cost_model(k), &t, k->cost);
}

/* A success's input and output tokens as its source's itpm and otpm count
 * them (*in, *out; < 0 unknown): prompt tokens read from the provider's
 * cache only where the source's limits say they count (docs/CONFIG.md §7). */
static void call_io_counts(const struct call *k, double *in, double *out)
{
    *in = *out = -1;
    if (!k->tokens.bogus && k->tokens.prompt >= 0) {
        int64_t cached = dialect_usage_cached(&k->tokens);
        *in = (double)k->tokens.prompt;
        if (!k->src->limits.cached_input_counts && cached > 0)
            *in -= (double)cached;
    }
    if (!k->tokens.bogus && k->tokens.completion >= 0)
        *out = (double)k->tokens.completion;
}

/* Keeps `usage` (borrowed) as the result's usage map. */
static void call_keep_usage(struct call *k, const msgpack_object *usage)
{
    msgpack_packer upk;
    msgpack_sbuffer_clear(&k->usage);
    msgpack_packer_init(&upk, &k->usage, msgpack_sbuffer_write);
    msgpack_pack_object(&upk, *usage);
}

/* The result's usage map from the running counts, in OpenAI's names, for
 * streams whose upstream spreads them over several events (Anthropic). */
static void call_keep_token_counts(struct call *k)
{
    msgpack_packer upk;
    int64_t v[3] = { k->tokens.prompt, k->tokens.completion, dialect_usage_total(&k->tokens) };
    static const char *const names[3] = { "prompt_tokens", "completion_tokens", "total_tokens" };
    uint32_t n = 0;

    for (int i = 0; i < 3; i++)
        n += v[i] >= 0;
    msgpack_sbuffer_clear(&k->usage);
    msgpack_packer_init(&upk, &k->usage, msgpack_sbuffer_write);
    msgpack_pack_map(&upk, n);
    for (int i = 0; i < 3; i++) {
        if (v[i] >= 0)
            rpc_pack_kv_u64(&upk, names[i], (uint64_t)v[i]);
    }
}

/* Replaces the Messages reply in `body` (unpacked in `up`) by the
 * chat.completion it stands for (the client sent an OpenAI body) and sets
 * *usage to the new body's usage (in `up`, NULL when it has none). Returns
 * 0, or CONVERT_EREPLY when the reply is not a Messages reply (`body`, `up`
 * unchanged). */
static int call_convert_reply(struct call *k, msgpack_sbuffer *body, msgpack_unpacked *up,
                              const msgpack_object **usage)
{
    msgpack_sbuffer conv;
    msgpack_packer cpk;
    int rc;

    *usage = NULL;
    msgpack_sbuffer_init(&conv);
    msgpack_packer_init(&cpk, &conv, msgpack_sbuffer_write);
    if ((rc = convert_chat_reply(&up->data, (int64_t)ev_now(k->srv->loop), &cpk)) < 0) {
        msgpack_sbuffer_destroy(&conv);
        return rc;
    }
    msgpack_sbuffer_destroy(body);
    *body = conv;
    msgpack_unpacked_destroy(up);
    msgpack_unpacked_init(up);
    if (msgpack_unpack_next(up, body->data, body->size, NULL) == MSGPACK_UNPACK_SUCCESS)
        *usage = rpc_map_get(&up->data, "usage");
    return 0;
}

/* The JSON text of msgpack `mp` into `out` (for a JSON-only sink, after a
 * conversion). Returns 0 or a TRANSCODE_* error. */
static int call_json_of(const msgpack_sbuffer *mp, struct strbuf *out)
{
    msgpack_unpacked up;
    int rc = -1;

    msgpack_unpacked_init(&up);
    if (msgpack_unpack_next(&up, mp->data, mp->size, NULL) == MSGPACK_UNPACK_SUCCESS)
        rc = transcode_msgpack_to_json(&up.data, out, NULL, "reply", NULL, 0);
    msgpack_unpacked_destroy(&up);
    return rc;
}

static void call_info_fill(const struct call *k, struct call_info *ci)
{
    double now = ev_now(k->srv->loop);

    ci->source = k->src && k->g.attempts > 0 ? k->src->name : "-";
    ci->attempts = k->g.attempts;
    ci->cost = k->cost;
    ci->elapsed_s = now - k->started;
    ci->stalled_s = gov_call_stalled_s(&k->g, now);
    /* Anthropic's own format reached the client (not converted). */
    ci->anthropic = k->src && dialect_is_messages(k->src->kind) && k->form != BODY_TO_ANTHROPIC;
    /* Chat Completions streams end with [DONE]; Messages and Responses
     * streams end with a named event of their own. */
    ci->done_marker = !k->src || k->form == BODY_TO_ANTHROPIC || call_dialect(k)->chat_facts;
    ci->cache = k->cc.state;
    ci->event_id = NULL;
    ci->event_names = k->event_names;
}

/* A success: the plain body (`json` as received, `body` its msgpack form)
 * or, for a stream, the summary. A converted reply reaches a JSON-only
 * sink as the JSON of `body`. */
static void call_reply_success(struct call *k, const struct attempt_result *r,
                               const msgpack_sbuffer *body, const msgpack_object *usage)
{
    struct call_info ci;
    struct call_body b = { 0 };
    msgpack_sbuffer us;
    struct strbuf scrubbed;

    call_info_fill(k, &ci);
    ci.source = k->src->name;
    msgpack_sbuffer_init(&us);
    strbuf_init(&scrubbed);
    if (k->rawc && !k->stream) {
        /* A passthrough's bytes as they came, an echo of a key scrubbed
         * (redact.h: byte for byte otherwise; dropped if that fails). */
        b.raw = true;
        b.content_type = r->content_type ? r->content_type : "";
        b.status = r->http_status;
        b.json = r->body ? r->body : "";
        b.json_len = r->body_len;
        if (redact_hit(k->srv->redact, b.json, b.json_len)) {
            b.json_len =
                redact_copy(k->srv->redact, b.json, b.json_len, &scrubbed) < 0 ? 0 : scrubbed.len;
            b.json = scrubbed.data ? scrubbed.data : "";
        }
    } else if (body && !k->sink->ops->wants_msgpack && k->form == BODY_TO_ANTHROPIC &&
               call_json_of(body, &scrubbed) == 0) {
        b.json = scrubbed.data; /* made from the scrubbed msgpack */
        b.json_len = scrubbed.len;
    } else if (body && !k->sink->ops->wants_msgpack) {
        b.json_len = r->body_len;
        b.json = relay_json_text(k->srv, r->body ? r->body : "", &b.json_len, true, &scrubbed);
    } else if (body) {
        b.mp = body->data;
        b.mp_len = body->size;
    }
    if (usage) {
        msgpack_packer upk;
        msgpack_packer_init(&upk, &us, msgpack_sbuffer_write);
        msgpack_pack_object(&upk, *usage);
        b.usage = us.data;
        b.usage_len = us.size;
    }
    k->code = PGW_OK;
    k->answered = true;
    callcache_on_result(k->srv, &k->cc, &ci, &b, r->cache_control, ev_now(k->srv->loop));
    k->sink->ops->on_result(k->sink, k->msgid, &ci, &b);
    msgpack_sbuffer_destroy(&us);
    strbuf_fini(&scrubbed);
}

/* Ends a call just answered (the response is the connection's last). */
static void call_finish(struct call *k)
{
    struct call_sink *s = k->sink;
    call_end(k);
    s->ops->flush(s);
}

/* A cacheable miss identical to a call in flight that will store its
 * answer waits for it (until the call's own deadline at most). Returns
 * true when `k` waits. */
static bool call_cache_wait(struct call *k, double deadline_s)
{
    struct call *l;

    if (!k->cc.fill)
        return false;
    for (l = k->srv->calls_all; l; l = l->all_next)
        if (l != k && l->cc.fill && !l->cc.waiting &&
            memcmp(l->cc.key.h, k->cc.key.h, CACHE_KEY_BYTES) == 0)
            break;
    if (!l)
        return false;
    k->cc.leader = l;
    k->cc.waiting = true;
    DLIST_PUSH(l->cc.waiters, k, cc.wprev, cc.wnext);
    if (deadline_s > 0) {
        ev_timer_set(&k->wake_w, deadline_s, 0);
        ev_timer_start(k->srv->loop, &k->wake_w);
    }
    return true;
}

/* A waiter woke (its leader ended, or its deadline came): answered from
 * the leader's entry when there is one (true: `k` is over), else it goes
 * upstream as any miss (false). */
static bool call_cache_answer(struct call *k, enum cache_event ev);

static bool call_cache_wake(struct call *k)
{
    call_cache_release(k);
    k->cc.waiting = false;
    return call_cache_answer(k, CACHE_COALESCED);
}

/* Answers `k` from the memory tier's entry of its key, counted `ev`
 * (true: `k` is over); false when there is none. */
static bool call_cache_answer(struct call *k, enum cache_event ev)
{
    struct server *srv = k->srv;
    struct call_sink *s = k->sink;
    const struct cache_entry *e = cache_get(srv->cache, &k->cc.key, ev_now(srv->loop), -1);
    if (!e)
        return false;
    callcache_count(srv, call_cap(k), ev);
    k->cc.state = "hit";
    k->code = PGW_OK;
    k->answered = true;
    if (callcache_replay(s, k->msgid, e, k->event_names) < 0)
        return true; /* the client is gone: the sink tore `k` down */
    call_finish(k);
    return true;
}

/* Fleet coalescing (the shared tier): a call that finds no entry takes
 * the entry's lock in Redis and goes upstream; one that finds the lock
 * held polls for the entry, from CACHE_POLL_MIN_S doubling to
 * CACHE_POLL_MAX_S, until it appears (answered from it, counted
 * coalesced), the lock is gone without it (its holder failed, or died and
 * the lock expired after the capability's cache.lock_s: it tries to take
 * the lock itself),
 * or its own deadline comes. The holder drops the lock when its call ends,
 * after its entry was written. Polling, not pub/sub: the subscriber
 * connection is the tasks', and a poll costs one MGET per waiter per
 * interval, bounded by the waiters' deadlines. */
#define CACHE_POLL_MIN_S 0.02
#define CACHE_POLL_MAX_S 0.5

static bool call_cache_look_up(struct call *k);

/* Waits the next poll interval (false: the deadline has come). */
static bool call_cache_poll(struct call *k)
{
    struct callcache *cc = &k->cc;
    double now = ev_now(k->srv->loop);

    if (cc->deadline_at > 0 && now >= cc->deadline_at)
        return false;
    cc->poll_s = cc->poll_s > 0 ? fmin(cc->poll_s * 2, CACHE_POLL_MAX_S) : CACHE_POLL_MIN_S;
    double in = cc->deadline_at > 0 ? fmin(cc->poll_s, cc->deadline_at - now) : cc->poll_s;
    cc->polling = cc->polled = true;
    ev_timer_stop(k->srv->loop, &k->wake_w);
    ev_timer_set(&k->wake_w, in, 0);
    ev_timer_start(k->srv->loop, &k->wake_w);
    return true;
}

/* Arms the wake timer at the call's deadline while a request to the
 * shared tier is out. */
static void call_cache_arm_deadline(struct call *k)
{
    double now = ev_now(k->srv->loop);
    ev_timer_stop(k->srv->loop, &k->wake_w);
    if (k->cc.deadline_at > 0) {
        ev_timer_set(&k->wake_w, fmax(k->cc.deadline_at - now, 0), 0);
        ev_timer_start(k->srv->loop, &k->wake_w);
    }
}

/* The lock was taken (k goes upstream), is held by another (k polls), or
 * could not be asked (a miss). */
static void call_on_cache_locked(void *ud, int rc, const char *data, size_t len)
{
    struct cache_lookup_wait *lw = ud;
    struct call *k = lw->k;
    (void)data;
    (void)len;

    free(lw);
    if (!k)
        return;
    k->cc.lookup = NULL;
    ev_timer_stop(k->srv->loop, &k->wake_w);
    if (rc == 1 && data && len < sizeof(k->cc.lock_token)) {
        memcpy(k->cc.lock_token, data, len);
        k->cc.lock_token[len] = '\0';
        k->cc.fleet_leader = true;
    } else if (rc == 0 && call_cache_poll(k))
        return;
    call_cache_count_miss(k);
    call_step(k);
}

static bool call_cache_lock(struct call *k)
{
    struct cache_lookup_wait *lw = calloc(1, sizeof(*lw));

    if (!lw)
        return false;
    lw->k = k;
    if (backend_cache_lock(k->srv->backend, k->cc.shared, k->cap->cache.lock_s,
                           call_on_cache_locked, lw) < 0) {
        free(lw);
        return false;
    }
    k->cc.lookup = lw;
    call_cache_arm_deadline(k);
    return true;
}

/* The shared tier answered `k`'s lookup: a value is copied into the
 * memory tier (until its own expiry) and answered from there; no value
 * takes the lock or polls (above); a value that is not well-formed or
 * expired, or a backend that could not answer, is a miss: the call goes
 * on upstream. */
static void call_on_cache_looked_up(void *ud, int rc, const char *data, size_t len)
{
    struct cache_lookup_wait *lw = ud;
    struct call *k = lw->k;

    free(lw);
    if (!k)
        return;
    k->cc.lookup = NULL;
    ev_timer_stop(k->srv->loop, &k->wake_w);
    double now = ev_now(k->srv->loop), expires_at;
    if (rc == 1 && len > CACHE_SHARED_HEAD) {
        memcpy(&expires_at, data, sizeof(expires_at));
        /* Never longer than this sidecar would keep its own answer. */
        expires_at = fmin(expires_at, now + k->cap->cache.ttl_s);
        struct cache_fill *f = expires_at > now
            ? cache_fill_from(data + CACHE_SHARED_HEAD, len - CACHE_SHARED_HEAD,
                              k->cap->cache.max_entry_bytes)
            : NULL;
        if (f) {
            cache_fill_tag(f, k->cap->name, k->cap->cache.shared ? "" : k->app);
            cache_put(k->srv->cache, &k->cc.key, f, now, expires_at);
            if (k->cc.polled)
                call_cache_count_miss(k); /* a coalesced call is a miss too */
            k->cc.uncounted = false;
            if (call_cache_answer(k, k->cc.polled ? CACHE_COALESCED : CACHE_HIT))
                return;
        }
    } else if (rc == 0 && call_cache_poll(k)) {
        return;
    } else if (rc == 2 && call_cache_lock(k)) {
        return;
    } else if (rc < 0) {
        log_at(LOG_DEBUG, "cache lookup failed: a miss", "capability", LOG_S, k->cap->name, "why",
               LOG_S, data ? data : "", NULL);
    }
    call_cache_count_miss(k);
    call_step(k);
}

/* Asks the shared tier for `k`'s entry (until the call's own deadline at
 * most). Returns true when `k` waits for it. */
static bool call_cache_look_up(struct call *k)
{
    struct cache_lookup_wait *lw;

    if (!k->cc.fill || !k->cc.uncounted || !(lw = calloc(1, sizeof(*lw)))) {
        call_cache_count_miss(k);
        return false;
    }
    lw->k = k;
    if (backend_cache_get(k->srv->backend, k->cc.shared, call_on_cache_looked_up, lw) < 0) {
        free(lw); /* Redis is down: a miss, at once */
        call_cache_count_miss(k);
        return false;
    }
    k->cc.lookup = lw;
    call_cache_arm_deadline(k);
    return true;
}

/* A budget refused the attempt the step reserved: what the step took is
 * given back and the call ends at once (retry_after_s for a window). */
static void call_refuse_budget(struct call *k, const struct call_refusal *why)
{
    struct gov_decision d;
    char msg[300];

    gov_call_abandon(&k->g, ev_now(k->srv->loop), GOV_BUDGET_EXHAUSTED, &d);
    snprintf(msg, sizeof(msg), "budget %s cannot cover this call: %.6g %s left", why->budget,
             why->r.left, k->srv->cfg->currency);
    if (why->r.retry_after_s >= 0)
        snprintf(msg + strlen(msg), sizeof(msg) - strlen(msg), ", resets in %.0fs",
                 ceil(why->r.retry_after_s));
    const struct call_error ce = {
        .retry_after_s = why->r.retry_after_s >= 0 ? ceil(why->r.retry_after_s) : -1,
        .budget = why->budget,
        .budget_left = why->r.left,
    };
    char task_id[TASK_ID_MAX + 1];
    snprintf(task_id, sizeof(task_id), "%s",
             !why->task    ? ""
                 : k->task ? k->task->id
                           : k->fleet_task_id);
    struct server *srv = k->srv;
    call_pack_error(k, PGW_BUDGET_EXHAUSTED, msg, &ce);
    call_finish(k);
    /* A task that ran out stops, as task.stop would stop it: its other
     * calls end task_stopped (reason "budget"), its worker leaves at its
     * next guard. */
    if (task_id[0])
        tasks_stop_budget(srv, task_id);
}

/* A source's budget refused the attempt the step reserved on it: the
 * source is left out of the call and the call goes on with the others of
 * its capability, as it would past a source whose breaker is open; only
 * when none is left does it end budget_exhausted, naming the last source
 * budget that refused it, with the earliest reset among those that
 * refused it (none when each refusal was a total's). */
static void call_refuse_source_budget(struct call *k, const struct call_refusal *why)
{
    struct gov_decision d;
    double ra = why->r.retry_after_s;

    if (k->src_refused && k->src_refusal.r.retry_after_s >= 0 &&
        (ra < 0 || k->src_refusal.r.retry_after_s < ra))
        ra = k->src_refusal.r.retry_after_s;
    k->src_refusal = *why;
    k->src_refusal.r.retry_after_s = ra;
    k->src_refused = true;
    log_at(LOG_DEBUG, "source budget refused the call: trying another source", "app", LOG_S, k->app,
           "budget", LOG_S, why->budget, NULL);
    gov_call_exclude(&k->g, ev_now(k->srv->loop), GOV_BUDGET_EXHAUSTED, &d);
    if (d.action == GOV_DONE && d.result == GOV_BUDGET_EXHAUSTED)
        call_refuse_budget(k, &k->src_refusal);
    else
        call_act(k, &d, NULL);
}

/* The Responses API answer of the current attempt names response `id`:
 * remembered, so that its follow-ups reach the same source
 * (docs/CONFIG.md, "responses"). Once per call. */
static void call_note_response(struct call *k, const char *id, size_t len)
{
    const struct config *cfg = k->srv->cfg;
    char buf[RESPIDS_ID_MAX + 1];

    if (k->resp_noted || cfg->responses_remember_s <= 0 || !respids_id_ok(id, len))
        return;
    memcpy(buf, id, len);
    buf[len] = '\0';
    k->resp_noted = true;
    backend_remember_response(k->srv->backend, buf, k->src->name, cfg->responses_remember_s,
                              cfg->responses_max_remembered);
}

static int reply_id_member(void *ud, const char *key, const struct jscan_value *v)
{
    if (strcmp(key, "id") == 0 && v->type == JSCAN_STRING && v->len >= 2)
        call_note_response(ud, v->p + 1, v->len - 2); /* an id needs no escape */
    return 0;
}

static void call_on_attempt_done(struct attempt *a, const struct attempt_result *r, void *ud)
{
    struct call *k = ud;
    struct attempt_result res = *r;
    double now = ev_now(k->srv->loop);
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

    /* A plain success must be JSON; if not, it is a transient failure the
     * loop may retry, not a success. A passthrough's answer is any bytes,
     * and its usage unknown. */
    if (k->rawc) {
        /* nothing read */
    } else if (res.outcome.kind == OUTCOME_SUCCESS && !k->stream && !call_needs_tree(k)) {
        struct json_facts f = { DIALECT_USAGE_NONE, false, false, false, false };
        size_t at = 0;
        if (jscan_object(res.body ? res.body : "", res.body_len, reply_member, &f, &at) == -1) {
            outcome_from_reason(&res.outcome, REASON_BAD_RESPONSE);
            res.outcome.http_status = res.http_status;
            snprintf(res.detail, sizeof(res.detail), "reply is not JSON (at byte %zu)", at);
        } else if (f.has_usage) {
            call_count_tokens(k, &f.usage);
        }
    } else if (res.outcome.kind == OUTCOME_SUCCESS && !k->stream) {
        bool convert = k->form == BODY_TO_ANTHROPIC;
        struct transcode_span us;
        struct dialect_usage counts;
        msgpack_packer_init(&bpk, &body, msgpack_sbuffer_write);
        int rc =
            relay_json_pick(k->srv, res.body ? res.body : "", res.body_len, &bpk,
                            convert ? NULL : &us, call_dialect(k)->usage_member, err, sizeof(err));
        if (rc < 0) {
            outcome_from_reason(&res.outcome, REASON_BAD_RESPONSE);
            res.outcome.http_status = res.http_status;
            if (rc == TRANSCODE_ETOO_DEEP)
                snprintf(res.detail, sizeof(res.detail),
                         "reply nests deeper than the %d levels a relayed value may have",
                         RPC_RELAYED_MAX_DEPTH);
            else
                snprintf(res.detail, sizeof(res.detail), "reply is not JSON: %.130s", err);
        } else if (!convert) {
            if (call_dialect(k)->responses)
                jscan_object(res.body ? res.body : "", res.body_len, reply_id_member, k, NULL);
            /* Only the usage member is read back, not the whole reply. */
            if (us.len > 0 &&
                msgpack_unpack_next(&up, body.data + us.off, us.len, NULL) ==
                    MSGPACK_UNPACK_SUCCESS)
                usage = &up.data;
            call_dialect(k)->scan_usage(usage, &counts);
            call_count_tokens(k, &counts);
        } else if (msgpack_unpack_next(&up, body.data, body.size, NULL) == MSGPACK_UNPACK_SUCCESS) {
            call_dialect(k)->scan_usage(rpc_map_get(&up.data, "usage"), &counts);
            if (call_convert_reply(k, &body, &up, &usage) < 0) {
                /* A 200 whose body no OpenAI client could read as a
                 * completion: the upstream misbehaved, as with a reply that
                 * is not JSON. */
                outcome_from_reason(&res.outcome, REASON_BAD_RESPONSE);
                res.outcome.http_status = res.http_status;
                snprintf(res.detail, sizeof(res.detail), "%s",
                         "reply is not an Anthropic Messages reply (an object with a "
                         "\"content\" list), so it cannot be converted");
            } else {
                call_count_tokens(k, &counts);
            }
        }
    } else if (res.outcome.kind == OUTCOME_SUCCESS && k->usage.size > 0 &&
               msgpack_unpack_next(&up, k->usage.data, k->usage.size, NULL) ==
                   MSGPACK_UNPACK_SUCCESS) {
        usage = &up.data;
    }
    relay_text_inplace(k->srv, res.detail, sizeof(res.detail));
    if (usage && (usage->type != MSGPACK_OBJECT_MAP || k->tokens.bogus))
        usage = NULL;

    log_at(res.outcome.kind == OUTCOME_SUCCESS ? LOG_DEBUG : LOG_INFO, "attempt ended", "call",
           LOG_U, (unsigned long long)k->msgid, "msgid", LOG_U, (unsigned long long)k->msgid, "app",
           LOG_S, k->app, "source", LOG_S, k->src->name, "attempt", LOG_U,
           (unsigned long long)k->g.attempts, "outcome", LOG_S, outcome_kind_name(res.outcome.kind),
           "reason", LOG_S, outcome_reason_name(res.outcome.reason), "status", LOG_I,
           (long long)res.http_status, "phase", LOG_S, attempt_phase_name(res.phase), "elapsed_s",
           LOG_F, res.elapsed_s, NULL);

    metrics_on_attempt(k->srv->metrics, call_source(k), &res);
    if (res.outcome.kind == OUTCOME_SUCCESS && !k->stream && !k->rawc)
        calltrace_response_model(&k->ct, res.body, res.body_len);
    calltrace_attempt_end(&k->ct, &res, &k->tokens, now);
    if (res.outcome.kind == OUTCOME_SUCCESS) {
        metrics_on_prompt_tokens(k->srv->metrics, call_source(k), k->tokens.prompt,
                                 dialect_usage_cached(&k->tokens));
        call_count_cost(k);
    }
    /* Budgets: the real cost; one unknown although the upstream answered
     * (or relayed part of a stream) as reserved; nothing for a failure. */
    if (k->reserved_on || k->fleet_reserved)
        call_settle(k,
                    res.outcome.kind != OUTCOME_SUCCESS && res.events == 0 ? NAN
                        : cost_is_known(k->cost)                           ? k->cost
                                                                           : CALL_AS_RESERVED);
    struct backend_usage used = { -1, -1, -1 };
    if (res.outcome.kind == OUTCOME_SUCCESS) {
        used.total = (double)dialect_usage_total(&k->tokens);
        call_io_counts(k, &used.in, &used.out);
    }
    k->last_status = res.http_status;
    k->used_tokens = used.total >= 0 ? used.total : NAN;
    if (k->lease) {
        backend_release(k->srv->backend, k->lease, &res.outcome, &used);
        k->lease = NULL;
    }
    if (res.outcome.kind == OUTCOME_SUCCESS)
        gov_call_on_io(&k->g, used.in, used.out, now);
    gov_call_on_outcome(&k->g, now, &res.outcome, used.total, &d);

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
        call_reply_success(k, &res, k->stream ? NULL : &body, usage);
        call_finish(k);
    } else {
        call_act(k, &d, &res);
    }
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&body);
}

/* An event of an OpenAI-dialect stream for a JSON-only sink, read with
 * jscan. Returns what call_on_event returns when the event is not relayed
 * (0 or 1), or 2 to relay it; `terminal` is set either way. */
static int call_scan_json_event(struct call *k, struct attempt *a, const char *data, size_t len,
                                bool *is_json, int *terminal)
{
    struct json_facts f = { DIALECT_USAGE_NONE, false, false, false, false };

    *is_json = jscan_object(data, len, facts_member, &f, NULL) != -1;
    *terminal = f.terminal;
    if (*is_json && f.has_usage)
        call_count_tokens(k, &f.usage);
    if (*is_json && f.has_error) {
        attempt_fail_stream(a, REASON_HTTP_5XX, true, "the upstream's stream reported an error");
        return -1;
    }
    if (*is_json && f.has_usage && f.empty_choices && k->form == BODY_STREAM_USAGE)
        return *terminal; /* polygw asked for it, the client did not */
    return 2;
}

/* An upstream's `event:` or `id:` text, quoted as a client may read it
 * into `out` (at most `max` bytes and a NUL): a key the upstream echoed
 * there, as in its data, reaches the client as "[redacted]" (scrubbed
 * before the text is cut, so no part of a long key is left). */
static void call_quote_line(const struct redact *r, const char *p, size_t n, size_t max, char *out)
{
    struct strbuf clean;

    if (!redact_hit(r, p, n)) {
        rpc_quote_client_str(p, n, max, out);
        return;
    }
    strbuf_init(&clean);
    if (redact_copy(r, p, n, &clean) < 0)
        out[0] = '\0'; /* out of memory: nothing rather than the key */
    else
        rpc_quote_client_str(clean.data, clean.len, max, out);
    strbuf_fini(&clean);
}

/* The upstream's name for the event being delivered (its `event:` line),
 * as a client may read it, or "". */
static void call_event_name(const struct call *k, const struct attempt *a, char *out, size_t cap)
{
    const char *name;
    size_t n = attempt_event_name(a, &name);

    out[0] = '\0';
    if (n > 0)
        call_quote_line(k->srv->redact, name, n, cap - 1, out);
}

/* One stream event: transcode, count its tokens, relay it as a chunk
 * (unless it is the usage-only chunk polygw asked for itself, or an event
 * a converted stream has no chunk for). Returns 1 when it is the stream's
 * terminal event (for upstreams that send no [DONE]), 0 to go on, -1 to
 * abort (the client is gone, or an error event: attempt_fail_stream). */
/* An event after the terminal event of a dialect whose terminal event is
 * its last (Messages, Responses, Gemini), or after a Chat Completions
 * stream's `data: [DONE]`: never relayed. A well-formed one
 * is dropped; one that is not JSON, or that reports an error, means the
 * stream went wrong after the answer looked complete, so the call ends
 * stream_interrupted rather than as a success. Returns 0 or -1. */
static int call_after_end(struct call *k, struct attempt *a, const char *data, size_t len)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    struct dialect_event ev = { 0 };

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    int rc = relay_json(k->srv, data, len, &pk, NULL, NULL, 0);
    if (rc == 0) {
        msgpack_unpacked up;
        msgpack_unpacked_init(&up);
        if (msgpack_unpack_next(&up, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS)
            call_dialect(k)->scan_event(&up.data, &ev);
        msgpack_unpacked_destroy(&up);
    }
    msgpack_sbuffer_destroy(&sb);
    if (rc == 0 && !ev.error)
        return 0;
    attempt_fail_stream(a, REASON_BAD_RESPONSE, false,
                        rc == 0 ? "the upstream reported an error after its stream's terminal event"
                                : "the upstream sent an event that is not JSON after its stream's "
                                  "terminal event");
    return -1;
}

static int call_on_event(struct attempt *a, const char *data, size_t len, void *ud)
{
    struct call *k = ud;
    struct server *srv = k->srv;
    const struct dialect *d = call_dialect(k);
    bool tree = call_needs_tree(k);
    struct call_info ci;
    msgpack_sbuffer sb;
    msgpack_packer tmp;
    msgpack_unpacked up;
    struct strbuf scrubbed;
    struct dialect_event ev = { 0 };
    const char *text = data;
    size_t text_len = len;
    char event_name[64] = "";
    int terminal = 0, rc;
    bool named;

    if (k->past_end || attempt_done_seen(a))
        return call_after_end(k, a, data, len);
    calltrace_response_model(&k->ct, data, len);
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&tmp, &sb, msgpack_sbuffer_write);
    strbuf_init(&scrubbed);
    call_event_name(k, a, event_name, sizeof(event_name));
    named = event_name[0] != '\0';
    if (!tree) {
        bool is_json;
        rc = call_scan_json_event(k, a, data, len, &is_json, &terminal);
        if (rc != 2) {
            strbuf_fini(&scrubbed);
            msgpack_sbuffer_destroy(&sb);
            return rc;
        }
        text = relay_json_text(srv, data, &text_len, is_json, &scrubbed);
        rc = 0;
    } else {
        rc = relay_json(srv, data, len, &tmp, NULL, NULL, 0);
    }
    if (rc == TRANSCODE_ETOO_DEEP) {
        /* Valid JSON, but no client could read the chunk: a bad_response
         * (upstream.c ends the attempt when the hook refuses an event). */
        snprintf(k->event_error, sizeof(k->event_error),
                 "stream event nests deeper than the %d levels a relayed value may have",
                 RPC_RELAYED_MAX_DEPTH);
        msgpack_sbuffer_destroy(&sb);
        strbuf_fini(&scrubbed);
        return -1;
    }
    if (rc < 0 && k->src->kind == DIALECT_GEMINI) {
        /* Every Gemini event is a JSON object: anything else (garbage after
         * the last event, a cut) is the upstream misbehaving. */
        snprintf(k->event_error, sizeof(k->event_error), "%s",
                 "stream event is not JSON (a Gemini stream sends JSON objects only)");
        msgpack_sbuffer_destroy(&sb);
        strbuf_fini(&scrubbed);
        return -1;
    }
    if (rc < 0) {
        /* A non-JSON event is relayed as {"data": "<text>"} rather than lost. */
        msgpack_sbuffer_clear(&sb);
        msgpack_pack_map(&tmp, 1);
        rpc_pack_str(&tmp, "data");
        relay_text(srv, &tmp, data, len, SIZE_MAX);
    }
    msgpack_unpacked_init(&up);
    if (sb.size && msgpack_unpack_next(&up, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS) {
        d->scan_event(&up.data, &ev);
        terminal = ev.terminal;
        k->past_end = ev.terminal && d->last_is_terminal;
        if (d->responses && !k->resp_noted) {
            const msgpack_object *rid = rpc_map_get(rpc_map_get(&up.data, "response"), "id");
            if (rid && rid->type == MSGPACK_OBJECT_STR)
                call_note_response(k, rid->via.str.ptr, rid->via.str.size);
        }
        /* A resumed stream's usage is the original call's: not counted
         * again (docs/HTTP.md §4a). */
        if (!k->rawc)
            call_count_tokens(k, &ev.usage);
        const msgpack_object *usage = rpc_map_get(&up.data, "usage");
        if (k->rawc || k->tokens.bogus)
            msgpack_sbuffer_clear(&k->usage);
        else if (d->stream_usage && usage && usage->type == MSGPACK_OBJECT_MAP)
            call_keep_usage(k, usage);
        else if (ev.usage.prompt >= 0 || ev.usage.completion >= 0 || ev.usage.total >= 0)
            call_keep_token_counts(k);
        const msgpack_object *type = rpc_map_get(&up.data, "type");
        if (!event_name[0] && type && type->type == MSGPACK_OBJECT_STR)
            rpc_quote_client_str(type->via.str.ptr, type->via.str.size, sizeof(event_name) - 1,
                                 event_name);
    }
    msgpack_unpacked_destroy(&up);
    if (ev.error) {
        char detail[120];
        snprintf(detail, sizeof(detail), "the upstream's stream reported %s", ev.error_type);
        msgpack_sbuffer_destroy(&sb);
        strbuf_fini(&scrubbed);
        attempt_fail_stream(a, ev.transient ? REASON_HTTP_5XX : REASON_HTTP_4XX, ev.transient,
                            detail);
        return -1;
    }
    if (tree && ev.usage_only && k->form == BODY_STREAM_USAGE) {
        /* The client did not ask for it: polygw did, to count tokens. */
        msgpack_sbuffer_destroy(&sb);
        strbuf_fini(&scrubbed);
        return terminal;
    }
    if (k->form == BODY_TO_ANTHROPIC) {
        /* Relayed as the OpenAI chunk it stands for, if any. */
        msgpack_sbuffer conv;
        msgpack_packer cpk;
        msgpack_sbuffer_init(&conv);
        msgpack_packer_init(&cpk, &conv, msgpack_sbuffer_write);
        msgpack_unpacked_init(&up);
        int made = msgpack_unpack_next(&up, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS &&
            convert_chat_event(k->conv, &up.data, &cpk);
        msgpack_unpacked_destroy(&up);
        msgpack_sbuffer_destroy(&sb);
        sb = conv;
        if (!made) {
            msgpack_sbuffer_destroy(&sb);
            strbuf_fini(&scrubbed);
            return terminal;
        }
        event_name[0] = '\0';
    }
    if (tree && !k->sink->ops->wants_msgpack) {
        /* A JSON-only sink: the converted chunk's JSON, or the upstream's
         * own text, scrubbed. */
        if (k->form == BODY_TO_ANTHROPIC) {
            if (call_json_of(&sb, &scrubbed) < 0) {
                msgpack_sbuffer_destroy(&sb);
                strbuf_fini(&scrubbed);
                return -1;
            }
            text = scrubbed.data;
            text_len = scrubbed.len;
        } else {
            text = relay_json_text(srv, data, &text_len, rc == 0, &scrubbed);
        }
        msgpack_sbuffer_clear(&sb); /* the sink does not want it */
    }

    srv->stats.chunks_relayed++;
    if (k->relayed++ == 0) /* a stream is never retried after its first event */
        metrics_on_call_first_event(srv->metrics, call_cap(k), call_elapsed(k));
    if (isnan(k->ttft_s))
        k->ttft_s = call_elapsed(k);
    call_info_fill(k, &ci);
    ci.source = k->src->name;
    /* The upstream's own event name; an Anthropic client also gets the
     * event's type as its name when the upstream sent none. */
    ci.event = event_name[0] && (named || ci.anthropic) ? event_name : NULL;
    char event_id[129] = ""; /* at most 128 bytes (docs/HTTP.md §4a) */
    const char *idp;
    size_t idn = k->rawc ? attempt_event_id(a, &idp) : 0;
    if (idn > 0) {
        /* Quoted as an event name is: no control character can reach the
         * client's `id:` line, and a long one is cut. */
        call_quote_line(k->srv->redact, idp, idn, sizeof(event_id) - 1, event_id);
        ci.event_id = event_id;
    }

    /* Relay now. The sink may find the client gone: it then aborts every
     * call it holds, this one included, so `k` is freed (its attempt is
     * only marked cancelled: we are inside curl) and must not be touched. */
    callcache_on_chunk(&k->cc, &ci, text, text_len, sb.size ? sb.data : NULL, sb.size);
    rc = k->sink->ops->on_chunk(k->sink, k->msgid, &ci, text, text_len, sb.size ? sb.data : NULL,
                                sb.size);
    msgpack_sbuffer_destroy(&sb);
    strbuf_fini(&scrubbed);
    if (rc < 0)
        return -1;
    if (rc > 0 && !k->paused) {
        call_set_paused(k, true);
        attempt_pause(a);
    }
    return terminal;
}

static const struct attempt_hooks call_hooks = {
    .on_event = call_on_event,
    .on_done = call_on_attempt_done,
};

static struct call *call_find(struct call_sink *s, uint32_t msgid)
{
    for (struct call *k = s->calls; k; k = k->next) {
        if (k->msgid == msgid)
            return k;
    }
    return NULL;
}

/* How source `src` takes this call's body. */
static enum body_form call_body_form(const struct call *k, const struct config_source *src)
{
    if (k->rawc)
        return BODY_AS_IS; /* a passthrough, a resumed stream included */
    if (src->accepts_openai)
        return BODY_TO_ANTHROPIC;
    if (k->stream && src->stream_usage && dialect_for(src->kind, k->cap->path)->stream_usage &&
        !k->has_stream_options)
        return BODY_STREAM_USAGE;
    return BODY_AS_IS;
}

/* `body` (a map, borrowed) with one more top-level member,
 * "stream_options": {"include_usage": true}, packed into `out`. */
static void pack_with_stream_usage(const msgpack_object *body, msgpack_sbuffer *out)
{
    msgpack_packer pk;

    msgpack_packer_init(&pk, out, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, body->via.map.size + 1);
    for (uint32_t i = 0; i < body->via.map.size; i++) {
        msgpack_pack_object(&pk, body->via.map.ptr[i].key);
        msgpack_pack_object(&pk, body->via.map.ptr[i].val);
    }
    rpc_pack_str(&pk, "stream_options");
    msgpack_pack_map(&pk, 1);
    rpc_pack_str(&pk, "include_usage");
    msgpack_pack_true(&pk);
}

/* An Anthropic Messages body as Bedrock's InvokeModel and Vertex AI's
 * rawPredict take it: the model is in the path, so `model` goes (and on
 * Bedrock `stream` too: the method says it); `anthropic_version` names the
 * cloud's version of the API unless the caller set one. */
#define BEDROCK_ANTHROPIC_VERSION "bedrock-2023-05-31"
#define VERTEX_ANTHROPIC_VERSION  "vertex-2023-10-16"
static void pack_for_cloud(const msgpack_object *body, msgpack_sbuffer *out, const char *version,
                           bool drop_stream)
{
    msgpack_packer pk;
    uint32_t keep = 0;
    bool has_version = false;

    for (uint32_t i = 0; i < body->via.map.size; i++) {
        const msgpack_object *key = &body->via.map.ptr[i].key;
        if (key->type == MSGPACK_OBJECT_STR &&
            (rpc_str_is(key, "model") || (drop_stream && rpc_str_is(key, "stream"))))
            continue;
        has_version |= key->type == MSGPACK_OBJECT_STR && rpc_str_is(key, "anthropic_version");
        keep++;
    }
    msgpack_packer_init(&pk, out, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, keep + !has_version);
    for (uint32_t i = 0; i < body->via.map.size; i++) {
        const msgpack_object *key = &body->via.map.ptr[i].key;
        if (key->type == MSGPACK_OBJECT_STR &&
            (rpc_str_is(key, "model") || (drop_stream && rpc_str_is(key, "stream"))))
            continue;
        msgpack_pack_object(&pk, *key);
        msgpack_pack_object(&pk, body->via.map.ptr[i].val);
    }
    if (!has_version) {
        rpc_pack_str(&pk, "anthropic_version");
        rpc_pack_str(&pk, version);
    }
}

/* Which cloud API a source's body is made for. */
static enum cloud_body cloud_body_of(const struct config_source *src)
{
    if (src->kind == DIALECT_BEDROCK)
        return src->bedrock_converse ? CLOUD_CONVERSE : CLOUD_BEDROCK;
    return src->vertex.on && src->kind == DIALECT_ANTHROPIC ? CLOUD_VERTEX : CLOUD_NONE;
}

/* The JSON body for a source: made once per distinct (model override,
 * form); the common case is one transcode per call, however many
 * attempts, and none for a JSON body sent as it came. */
static int call_prepare_json(struct call *k, const struct config_source *src, char *why,
                             size_t whylen)
{
    enum cloud_body cloud = cloud_body_of(src);
    /* A Gemini body names no model (its path does) and never `stream`
     * (its method does): sent as it came. */
    bool gemini = src->kind == DIALECT_GEMINI, bedrock = src->kind == DIALECT_BEDROCK;
    bool vertex_anth = src->vertex.on && src->kind == DIALECT_ANTHROPIC;
    const char *model = gemini ? NULL : src->model ? src->model : k->model_param;
    enum body_form form = call_body_form(k, src);
    msgpack_unpacked up, alt, br;
    msgpack_sbuffer altbuf, brbuf;
    const msgpack_object *body;
    int rc;

    k->form = form;
    if (k->rawc)
        return 0; /* a passthrough's body is sent as it came (rawcall.h) */
    if (k->json_ready && k->json_form == form && k->json_cloud == cloud &&
        (k->json_model == model || (k->json_model && model && strcmp(k->json_model, model) == 0)))
        return 0;
    if (k->body_is_json && !model && form == BODY_AS_IS) {
        k->json_ready = false; /* sent as it came (call_body_text) */
        k->json_model = NULL;
        return 0;
    }
    if (k->body_is_json && k->body.size == 0) {
        /* A source rewrites the body: the one case a JSON body is re-made,
         * through the msgpack form that the override rules are written for. */
        msgpack_packer bpk;
        msgpack_packer_init(&bpk, &k->body, msgpack_sbuffer_write);
        if (transcode_json_to_msgpack(k->raw.data, k->raw.len, &bpk, NULL, why, whylen) < 0)
            return TRANSCODE_EINVALID;
        sbuffer_fit(&k->body);
    }
    msgpack_unpacked_init(&up);
    if (msgpack_unpack_next(&up, k->body.data, k->body.size, NULL) != MSGPACK_UNPACK_SUCCESS) {
        msgpack_unpacked_destroy(&up);
        snprintf(why, whylen, "internal: stored body unreadable");
        return -1;
    }
    body = &up.data;
    msgpack_sbuffer_init(&altbuf);
    msgpack_unpacked_init(&alt);
    if (form == BODY_STREAM_USAGE) {
        pack_with_stream_usage(body, &altbuf);
    } else if (form == BODY_TO_ANTHROPIC) {
        msgpack_packer apk;
        msgpack_packer_init(&apk, &altbuf, msgpack_sbuffer_write);
        if (convert_chat_request(body, &apk, why, whylen) < 0) {
            msgpack_sbuffer_destroy(&altbuf);
            msgpack_unpacked_destroy(&up);
            k->json_ready = false;
            return TRANSCODE_EINVALID;
        }
    }
    if (altbuf.size > 0 &&
        msgpack_unpack_next(&alt, altbuf.data, altbuf.size, NULL) == MSGPACK_UNPACK_SUCCESS)
        body = &alt.data;
    msgpack_sbuffer_init(&brbuf);
    msgpack_unpacked_init(&br);
    if (cloud == CLOUD_CONVERSE) {
        msgpack_packer cpk;
        msgpack_packer_init(&cpk, &brbuf, msgpack_sbuffer_write);
        if (converse_request(body, &cpk, why, whylen) < 0) {
            msgpack_sbuffer_destroy(&brbuf);
            msgpack_sbuffer_destroy(&altbuf);
            msgpack_unpacked_destroy(&alt);
            msgpack_unpacked_destroy(&up);
            k->json_ready = false;
            return TRANSCODE_EINVALID;
        }
    } else if (cloud != CLOUD_NONE && body->type == MSGPACK_OBJECT_MAP) {
        pack_for_cloud(body, &brbuf, bedrock ? BEDROCK_ANTHROPIC_VERSION : VERTEX_ANTHROPIC_VERSION,
                       bedrock);
    }
    if (brbuf.size > 0 &&
        msgpack_unpack_next(&br, brbuf.data, brbuf.size, NULL) == MSGPACK_UNPACK_SUCCESS)
        body = &br.data;
    struct transcode_override ov = {
        .model = bedrock || vertex_anth ? NULL : model,
        /* The `stream` parameter decides; a body's own "stream" key must not
         * make the upstream stream while we expect one JSON reply. */
        .stream = gemini || bedrock       ? TRANSCODE_STREAM_KEEP
            : k->stream                   ? TRANSCODE_STREAM_TRUE
            : rpc_map_get(body, "stream") ? TRANSCODE_STREAM_FALSE
                                          : TRANSCODE_STREAM_KEEP,
    };
    strbuf_reset(&k->json);
    rc = transcode_msgpack_to_json(body, &k->json, &ov, "body", why, whylen);
    (void)strbuf_fit(&k->json); /* kept for the call's retries */
    msgpack_unpacked_destroy(&br);
    msgpack_sbuffer_destroy(&brbuf);
    msgpack_unpacked_destroy(&alt);
    msgpack_sbuffer_destroy(&altbuf);
    msgpack_unpacked_destroy(&up);
    if (rc < 0) {
        k->json_ready = false;
        return rc;
    }
    k->json_model = model;
    k->json_form = form;
    k->json_cloud = cloud;
    k->json_ready = true;
    return 0;
}

static void call_on_wake_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct call *k = w->data;
    (void)loop;
    (void)revents;
    if (k->cc.waiting && call_cache_wake(k))
        return;
    if (k->cc.polling) { /* the next poll of the shared tier */
        k->cc.polling = false;
        if (call_cache_look_up(k))
            return;
    } else if (k->cc.lookup) { /* the deadline came first: no answer is waited for */
        call_cache_lookup_detach(k);
        call_cache_count_miss(k);
    }
    call_step(k);
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
/* The JSON text to send for the current source (call_prepare_json made it). */
static void call_body_text(const struct call *k, const char **text, size_t *len)
{
    if (k->body_is_json && !k->json_ready) {
        *text = k->raw.data;
        *len = k->raw.len;
    } else {
        *text = k->json.data;
        *len = k->json.len;
    }
}

static void call_run_attempt(struct call *k, size_t source)
{
    struct server *srv = k->srv;
    const struct config *cfg = srv->cfg;
    const struct config_source *src = &cfg->sources[source];
    char why[300];

    k->src = src;
    if (call_prepare_json(k, src, why, sizeof(why)) < 0) {
        /* The body was checked at call_start for the first source; another
         * source differs by its (validated) model, or takes the body
         * converted (accepts: openai), which may refuse what the first
         * took (tools, images). call_end releases the reservation. */
        call_reply_plain_error(k, PGW_BAD_REQUEST, why);
        call_finish(k);
        return;
    }
    /* Only a converted attempt needs stream conversion state (~250 bytes
     * that most of the calls in flight would carry unused). */
    if (k->form == BODY_TO_ANTHROPIC && !k->conv && !(k->conv = malloc(sizeof(*k->conv)))) {
        call_reply_plain_error(k, PGW_INTERNAL, "out of memory");
        call_finish(k);
        return;
    }
    const char *text;
    size_t text_len;
    call_body_text(k, &text, &text_len);
    char *json = malloc(text_len + 1);
    if (!json) {
        call_reply_plain_error(k, PGW_INTERNAL, "out of memory");
        call_finish(k);
        return;
    }
    memcpy(json, text ? text : "", text_len); /* NULL for a passthrough */
    json[text_len] = '\0';
    const struct upath_call uc = { k->cap, k->model_param, k->stream, k->query };
    char url_buf[512];
    size_t nu = 0;
    char *url = upath_url(src, &uc, url_buf, sizeof(url_buf), &nu, why, sizeof(why));
    if (!url) {
        free(json);
        call_reply_plain_error(
            k, strcmp(why, "out of memory") == 0 ? PGW_INTERNAL : PGW_BAD_REQUEST, why);
        call_finish(k);
        return;
    }
    struct attempt_spec as = {
        .url = url,
        .headers = (const char *const *)src->req_headers,
        .body = json,
        .body_len = text_len,
        .stream = k->stream,
        .stream_end = src->kind == DIALECT_BEDROCK && src->bedrock_converse
            ? "metadata (ConverseStream)"
            : dialect_for(src->kind, k->cap->path)->stream_end,
        .connect_timeout_s = src->connect_timeout_s,
        .ttft_timeout_s = src->ttft_timeout_s,
        .idle_timeout_s = src->idle_timeout_s,
        .timeout_s = src->timeout_s,
        .deadline_at = k->g.deadline_at,
        .max_response_bytes = cfg->max_message_bytes,
        .budget = k->sink->budget,
    };
    struct upstream_route route = {
        .id = src->route_id,
        .ca_file = src->tls.ca_file,
        .cert_file = src->tls.cert_file,
        .key_file = src->tls.key_file,
        .server_name = src->tls.server_name,
        .proxy = src->proxy,
        .no_proxy = src->no_proxy,
    };
    if (src->route_id)
        as.route = &route;
    if (k->rawc) {
        free(json);
        if (raw_call_spec(k->rawc, src, k->cap->path, &as) < 0) {
            explicit_bzero(url, nu + 1);
            if (url != url_buf)
                free(url);
            call_reply_plain_error(k, PGW_INTERNAL, "out of memory");
            call_finish(k);
            return;
        }
    }
    call_set_paused(k, false);
    msgpack_sbuffer_clear(&k->usage);
    k->tokens = DIALECT_USAGE_NONE;
    if (k->conv)
        convert_stream_init(k->conv, (int64_t)ev_now(srv->loop), k->client_usage);
    k->event_error[0] = '\0';
    k->relayed = 0;
    const char *tp = calltrace_attempt(&k->ct, &k->g, src, ev_now(srv->loop));
    if (!k->rawc)
        as.extra_header = tp; /* a passthrough's headers are its client's */
    char *signature = NULL, no_creds[240];
    int auth = cloudsign_lines(src, srv->aws_auth, srv->gcp_auth, url, json, text_len, time(NULL),
                               &signature, no_creds, sizeof(no_creds));
    if (auth < 0) {
        free(json);
        explicit_bzero(url, nu + 1);
        if (url != url_buf)
            free(url);
        call_reply_plain_error(k, PGW_INTERNAL, "cannot sign the upstream request");
        call_finish(k);
        return;
    }
    /* Nothing to sign with: the attempt fails unsent, like a source that
     * cannot be reached, and the loop goes on (another source, backoff);
     * the credentials are fetched on their own schedule. */
    as.refuse = auth > 0 ? no_creds : NULL;
    as.attempt_headers = signature;
    /* The client's betas go to Anthropic's own API only: a signed cloud
     * request names them in its body, and the other kinds know none. A
     * source's own anthropic-beta header is sent too: the two lines are
     * one list to the server. */
    if (!signature && k->beta_line && !k->rawc && src->kind == DIALECT_ANTHROPIC && !src->vertex.on)
        as.attempt_headers = k->beta_line;
    as.aws_eventstream = src->kind == DIALECT_BEDROCK && k->stream;
    as.bedrock_converse = src->kind == DIALECT_BEDROCK && src->bedrock_converse;
    k->past_end = false;
    k->attempt = attempt_start(srv->up, &as, &call_hooks, k);
    explicit_bzero(url, nu + 1); /* auth_query puts the key in it */
    if (url != url_buf)
        free(url);
    if (signature) {
        explicit_bzero(signature, strlen(signature));
        free(signature);
    }
    if (!k->attempt) {
        call_reply_plain_error(k, PGW_INTERNAL, "cannot start the upstream request");
        call_finish(k);
    }
}

/* The backend answered the admission of the reserved attempt later. */
/* What the fleet's admission said, acted on. */
static void call_admitted(struct call *k, int rc, struct backend_lease *lease, double retry_at,
                          const char *why)
{
    struct server *srv = k->srv;
    double now = ev_now(srv->loop);
    struct gov_decision d;

    if (rc > 0) {
        k->lease = lease;
        gov_call_confirmed(&k->g);
        call_run_attempt(k, k->g.source);
        return;
    }
    call_settle(k, NAN); /* not admitted: its budget reservation goes back */
    if (rc == 0) {
        log_at(LOG_DEBUG, "fleet admission refused", "app", LOG_S, k->app, "source", LOG_S,
               srv->cfg->sources[k->g.source].name, "check", LOG_S, why, NULL);
        /* A token-bucket refusal depends on this call's size, an app's
         * limit on this call's app: no gate. */
        bool gate =
            strcmp(why, "tpm") != 0 && strcmp(why, "daily") != 0 && strncmp(why, "app_", 4) != 0;
        gov_call_refused(&k->g, now, retry_at, gate, &d);
    } else {
        log_at(LOG_WARN, "backend could not admit (failing closed)", "app", LOG_S, k->app, "error",
               LOG_S, why, NULL);
        snprintf(k->backend_why, sizeof(k->backend_why), "%s", why);
        gov_call_abandon(&k->g, now, GOV_BACKEND_UNAVAILABLE, &d);
    }
    call_act(k, &d, NULL);
}

static void call_on_admit(void *ud, int rc, struct backend_lease *lease, double retry_at,
                          const char *why)
{
    struct call *k = ud;

    k->admit = NULL;
    if (k->spend) { /* the budget's answer is still out: this one waits for it */
        k->early.held = true;
        k->early.rc = rc;
        k->early.lease = lease;
        k->early.retry_at = retry_at;
        snprintf(k->early.why, sizeof(k->early.why), "%s", why ? why : "");
        return;
    }
    call_admitted(k, rc, lease, retry_at, why);
}

/* Asks the backend to admit the attempt the step reserved on `source`:
 * admitted at once (the local step decided: memory), later
 * (call_on_admit), or not sent: fail closed. */
static void call_admit(struct call *k, size_t source)
{
    struct server *srv = k->srv;
    int rc = backend_admit(srv->backend, source, k->g.app, k->g.est_tokens, k->g.est_out, &k->lease,
                           call_on_admit, k, &k->admit);
    if (rc > 0) {
        call_run_attempt(k, source);
    } else if (rc < 0) {
        struct gov_decision fail;
        if (k->spend) /* a budget reservation sent with it is void */
            srv->backend->ops->spend_detach(srv->backend, k->spend);
        k->spend = NULL;
        call_settle(k, NAN);
        gov_call_abandon(&k->g, ev_now(srv->loop), GOV_BACKEND_UNAVAILABLE, &fail);
        call_act(k, &fail, NULL);
    }
}

/* The fleet answered the reservation of the attempt's worst case on its
 * app's and source's budgets. */
static void call_on_spend(void *ud, int rc, const char *which, const char *window, double left,
                          double retry_after_s)
{
    struct call *k = ud;
    struct server *srv = k->srv;
    size_t source = k->g.source;

    k->spend = NULL;
    if (rc > 0) {
        k->fleet_reserved = true;
        if (k->early.held) {
            k->early.held = false;
            call_admitted(k, k->early.rc, k->early.lease, k->early.retry_at, k->early.why);
        } /* else the admission's answer acts when it comes */
        return;
    }
    /* Refused, or not answered: the admission sent with it is void. */
    if (k->admit)
        backend_admit_detach(srv->backend, k->admit); /* a lease granted meanwhile goes back */
    k->admit = NULL;
    if (k->early.held && k->early.rc > 0 && k->early.lease)
        backend_release(srv->backend, k->early.lease, NULL, NULL);
    k->early.held = false;
    if (rc == 0) {
        struct call_refusal why = { .r = { .left = left, .retry_after_s = retry_after_s } };
        why.source = strcmp(which, "source") == 0;
        why.task = strcmp(which, "task") == 0;
        snprintf(why.budget, sizeof(why.budget), "%s:%s:%s", which,
                 why.source     ? srv->cfg->sources[source].name
                     : why.task ? k->fleet_task_id
                                : k->app,
                 window);
        if (why.source)
            call_refuse_source_budget(k, &why);
        else
            call_refuse_budget(k, &why);
        return;
    }
    struct gov_decision d;
    snprintf(k->backend_why, sizeof(k->backend_why), "%s", which);
    gov_call_abandon(&k->g, ev_now(srv->loop), GOV_BACKEND_UNAVAILABLE, &d);
    call_act(k, &d, NULL);
}

/* Budgets the fleet keeps (the Redis backend): asks for the reservation of
 * the attempt's worst case and for its admission together (pipelined: one
 * round trip) and returns true — the call waits for both answers, and the
 * second acts on them (call_on_spend, call_on_admit) — or false when no
 * such budget covers it. A refused reservation voids the admission (its
 * lease goes back); a refused admission gives the reservation back. */
static bool call_reserve_fleet(struct call *k, size_t source)
{
    struct server *srv = k->srv;
    const struct config *cfg = srv->cfg;
    struct backend *be = srv->backend;
    size_t app = k->g.app;

    bool task = k->task && k->task->has_budget;
    if (!be->ops->spend_reserve ||
        !((app < cfg->n_apps && budget_is_set(&cfg->apps[app].budget)) ||
          budget_is_set(&cfg->sources[source].budget) || task))
        return false;
    double amount = cost_worst(&cfg->sources[source].prices, k->est_in, k->est_out);
    k->fleet_amount = cost_is_known(amount) ? amount : 0;
    k->fleet_reserved = false;
    k->fleet_task.limit = 0;
    if (task) {
        snprintf(k->fleet_task_id, sizeof(k->fleet_task_id), "%s", k->task->id);
        k->fleet_task =
            (struct backend_spend_task){ .id = k->fleet_task_id,
                                         .run = k->task->budget_run,
                                         .limit = k->task->budget.p.limit[BUDGET_TOTAL] };
    }
    if (be->ops->spend_reserve(be, app, source, task ? &k->fleet_task : NULL, k->fleet_amount,
                               call_on_spend, k, &k->spend) < 0) {
        struct gov_decision d;
        snprintf(k->backend_why, sizeof(k->backend_why), "%s", "not connected");
        gov_call_abandon(&k->g, ev_now(srv->loop), GOV_BACKEND_UNAVAILABLE, &d);
        call_act(k, &d, NULL);
        return true;
    }
    /* The admission goes with it, in the same write (one round trip);
     * whichever answer comes second acts on both. */
    call_admit(k, source);
    return true;
}

static void call_act(struct call *k, const struct gov_decision *d,
                     const struct attempt_result *last)
{
    struct server *srv = k->srv;

    switch (d->action) {
    case GOV_ATTEMPT: {
        /* The budgets first, in the same turn of the loop as the step's
         * permit and buckets (the memory backend keeps both). */
        struct call_refusal why;
        if (call_reserve(k, d->source, &why) < 0) {
            if (why.source)
                call_refuse_source_budget(k, &why);
            else
                call_refuse_budget(k, &why);
            return;
        }
        /* Budgets the fleet keeps go with the fleet's admission, in one
         * round trip (call_reserve_fleet). */
        if (call_reserve_fleet(k, d->source))
            return;
        call_admit(k, d->source);
        return;
    }
    case GOV_WAIT: {
        calltrace_wait(&k->ct, &k->g, last, ev_now(srv->loop));
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

    if (k->admit || k->attempt || k->task_wait || k->spend || k->resp_wait || k->cc.waiting ||
        k->cc.lookup || k->cc.polling)
        return; /* a late timer, or the call is waiting for the backend or its leader */
    gov_call_step(&k->g, ev_now(k->srv->loop), &d);
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
            struct tasks_error te;
            tasks_error_of(&te, tw->id, bt);
            call_error_done(k, &te.e);
            call_finish(k);
        }
    }
    free(tw);
}

/* A call refused before it reached the governed loop: logged with what is
 * known of it (the capability and task as the client wrote them, quoted). */
static void call_log_refused(struct call_sink *s, uint32_t id, const struct call_req *r,
                             enum pgw_code code)
{
    char capname[CONFIG_NAME_MAX + 8], taskname[TASK_ID_MAX + 8];
    struct access_entry e = {
        .conn = s->conn_id,
        .msgid = id,
        .app = r->app ? r->app->name : NULL,
        .peer_pid = s->peer_pid,
        .peer_uid = s->peer_uid,
        .answered = true,
        .code = code,
        .ttft_s = NAN,
        .tokens = NAN,
        .cost = NAN,
    };

    if (r->capability) {
        rpc_quote_client_str(r->capability, r->capability_len, sizeof(capname) - 1, capname);
        e.capability = capname;
    }
    if (r->task_id) {
        rpc_quote_client_str(r->task_id, strlen(r->task_id), sizeof(taskname) - 1, taskname);
        e.task = taskname;
    }
    access_log_write(s->srv->cfg, &e);
}

/* Refuses call `id` before it started (nothing is held yet). */
static void call_refuse(struct call_sink *s, uint32_t id, const struct call_req *r,
                        enum pgw_code code, const char *message)
{
    const struct reply_error e = REPLY_ERROR(code, message);

    s->ops->on_error(s, id, &e);
    call_log_refused(s, id, r, code);
}

static int include_usage_member(void *ud, const char *key, const struct jscan_value *v)
{
    if (strcmp(key, "include_usage") == 0)
        *(bool *)ud = v->type == JSCAN_TRUE;
    return 0;
}

/* The body's stream_options member, `v`. */
static void call_stream_options(struct call *k, const struct jscan_value *v)
{
    k->has_stream_options = true;
    if (v->type == JSCAN_OBJECT)
        jscan_object(v->p, v->len, include_usage_member, &k->client_usage, NULL);
}

static int stream_options_member(void *ud, const char *key, const struct jscan_value *v)
{
    if (strcmp(key, "stream_options") == 0)
        call_stream_options(ud, v);
    return 0;
}

/* Whether the body has stream_options and asks for include_usage. */
static void call_scan_stream_options(struct call *k, const struct call_req *r)
{
    if (r->json && r->members_scanned) {
        if (r->stream_options.p)
            call_stream_options(k, &r->stream_options);
        return;
    }
    if (r->json) {
        jscan_object(r->json, r->json_len, stream_options_member, k, NULL);
        return;
    }
    const msgpack_object *so = rpc_map_get(r->mp, "stream_options");
    const msgpack_object *iu = rpc_map_get(so, "include_usage");
    k->has_stream_options = so != NULL;
    k->client_usage = iu && iu->type == MSGPACK_OBJECT_BOOLEAN && iu->via.boolean;
}


/* Keeps only the kind: gemini sources of capability `ci` in *use (made
 * when NULL: every source of the capability), and in *first the first of
 * them. Returns -1 after refusing the call when none is left. */
static int call_keep_gemini(struct call_sink *s, uint32_t id, const struct call_req *r, size_t ci,
                            bool want, bool **use, const struct config_source **first)
{
    const struct config *cfg = s->srv->cfg;
    char why[400];

    if (!*use && !(*use = calloc(cfg->n_sources, sizeof(**use)))) {
        call_refuse(s, id, r, PGW_INTERNAL, "out of memory");
        return -1;
    }
    bool all = true;
    for (size_t i = 0; i < cfg->n_sources; i++)
        all = all && !(*use)[i];
    *first = NULL;
    for (size_t i = 0; i < cfg->n_sources; i++) {
        const struct config_source *src = &cfg->sources[i];
        bool in = (all || (*use)[i]) && src->capability_index == ci && !src->retired;
        (*use)[i] = in && (src->kind == DIALECT_GEMINI) == want;
        if ((*use)[i] && !*first)
            *first = src;
    }
    if (*first)
        return 0;
    free(*use);
    *use = NULL;
    if (want || !r->model) {
        snprintf(why, sizeof(why), "capability '%s' has no %skind: gemini source for this call",
                 cfg->capabilities[ci].name, want ? "" : "source but ");
        call_refuse(s, id, r, PGW_UNKNOWN_CAPABILITY, why);
    } else {
        snprintf(why, sizeof(why),
                 "no source of capability '%s' serves model '%.*s' on this route "
                 "(its kind: gemini sources are for the Gemini API's own routes)",
                 cfg->capabilities[ci].name, (int)(r->model_len > 80 ? 80 : r->model_len),
                 r->model);
        call_refuse(s, id, r, PGW_MODEL_NOT_FOUND, why);
    }
    return -1;
}

/* Restricts call `k` to the source that produced response `id`, named
 * `source` by the backend (NULL: not remembered). An id not remembered is
 * followed anyway when only one source could serve the call. 0, or -1
 * after answering response_not_found. */
static int call_follow(struct call *k, const char *id, const char *source)
{
    const struct config *cfg = k->srv->cfg;
    size_t ci = call_cap(k), n = 0, only = SIZE_MAX, pin = SIZE_MAX;
    bool configured = false;
    char why[400], quoted[RESPIDS_ID_MAX + 8];

    for (size_t i = 0; i < cfg->n_sources; i++) {
        const struct config_source *s = &cfg->sources[i];
        bool named = source && strcmp(s->name, source) == 0 && !s->retired;
        configured |= named;
        if (s->capability_index != ci || s->retired || k->g.notes[i].excluded)
            continue;
        n++;
        only = i;
        if (named)
            pin = i;
    }
    if (pin == SIZE_MAX && !source && n == 1)
        pin = only;
    if (pin == SIZE_MAX) {
        rpc_quote_client_str(id, strlen(id), sizeof(quoted) - 1, quoted);
        if (source)
            snprintf(why, sizeof(why), "response '%s' was made by source '%s', which %s", quoted,
                     source,
                     configured ? "cannot serve this call (another capability or model, or one "
                                  "this app may not use)"
                                : "is no longer configured");
        else
            snprintf(why, sizeof(why),
                     "polygw does not know which source made response '%s' (not made through "
                     "polygw, or longer ago than responses.remember_s), and %zu sources could "
                     "have made it",
                     quoted, n);
        call_reply_plain_error(k, PGW_RESPONSE_NOT_FOUND, why);
        return -1;
    }
    bool *use = calloc(cfg->n_sources, sizeof(*use));
    if (!use) {
        call_reply_plain_error(k, PGW_INTERNAL, "out of memory");
        return -1;
    }
    use[pin] = true;
    gov_call_set_sources(&k->g, use);
    free(use);
    k->src = &cfg->sources[pin];
    return 0;
}

/* The backend said which source made the response a call follows. */
static void call_on_recalled(void *ud, int rc, const char *source)
{
    struct resp_wait *rw = ud;
    struct call *k = rw->k;

    if (k) {
        k->resp_wait = NULL;
        if (rc < 0) {
            char why[300];
            snprintf(why, sizeof(why),
                     "the backend could not say which source made the response this call "
                     "follows: %.200s",
                     source ? source : "no answer");
            call_reply_plain_error(k, PGW_BACKEND_UNAVAILABLE, why);
            call_finish(k);
        } else if (call_follow(k, rw->id, rc == 1 ? source : NULL) < 0) {
            call_finish(k);
        } else {
            call_step(k);
        }
    }
    free(rw);
}

struct prev_id {
    char id[RESPIDS_ID_MAX + 1];
    int state; /* 0 none, 1 an id, 2 not an id polygw keeps */
};

static int prev_id_member(void *ud, const char *key, const struct jscan_value *v)
{
    struct prev_id *p = ud;

    if (strcmp(key, "previous_response_id") != 0 || v->type == JSCAN_NULL)
        return 0;
    long n = v->type == JSCAN_STRING ? jscan_string(v, p->id, RESPIDS_ID_MAX) : -1;
    p->state = n > 0 && respids_id_ok(p->id, (size_t)n) ? 1 : 2;
    return 0;
}

/* The response call `k` of request `r` follows: the follow-up's id, or
 * the body's previous_response_id on a Responses API capability. */
static void call_followed_id(const struct call *k, const struct call_req *r, struct prev_id *p)
{
    p->state = 0;
    if (r->response_id) {
        snprintf(p->id, sizeof(p->id), "%s", r->response_id);
        p->state = 1;
    } else if (!r->raw && dialect_for(k->src->kind, k->cap->path)->responses) {
        if (r->json) {
            jscan_object(r->json, r->json_len, prev_id_member, p, NULL);
        } else if (r->mp) {
            const msgpack_object *o = rpc_map_get(r->mp, "previous_response_id");
            if (o && o->type == MSGPACK_OBJECT_STR) {
                size_t n = o->via.str.size;
                p->state = respids_id_ok(o->via.str.ptr, n) ? 1 : 2;
                if (p->state == 1) {
                    memcpy(p->id, o->via.str.ptr, n);
                    p->id[n] = '\0';
                }
            } else if (o && o->type != MSGPACK_OBJECT_NIL) {
                p->state = 2;
            }
        }
    }
    if (p->state == 2)
        snprintf(p->id, sizeof(p->id), "%s", "(not an id: 1 to 128 of A-Z a-z 0-9 _ - . :)");
}

/* A call that follows a response asks the backend which source made it
 * (responses.remember_s 0: nothing is remembered, so nothing is asked).
 * 0: nothing to do, answered at once, or waiting (k->resp_wait); -1 after
 * answering (and ending) the call. */
static int call_look_up_response(struct call *k, const struct call_req *r)
{
    struct prev_id p;
    char source[RESPIDS_SOURCE_MAX + 1] = "";

    call_followed_id(k, r, &p);
    if (p.state == 0)
        return 0;
    int rc = 1;
    if (p.state == 1 && k->srv->cfg->responses_remember_s > 0) {
        struct resp_wait *rw = calloc(1, sizeof(*rw));
        if (!rw) {
            call_reply_plain_error(k, PGW_INTERNAL, "out of memory");
            call_finish(k);
            return -1;
        }
        snprintf(rw->id, sizeof(rw->id), "%s", p.id);
        rw->k = k;
        rc = backend_recall_response(k->srv->backend, p.id, source, sizeof(source),
                                     call_on_recalled, rw);
        if (rc == 0) {
            k->resp_wait = rw;
            return 0;
        }
        free(rw);
    }
    if (rc < 0) {
        call_reply_plain_error(k, PGW_BACKEND_UNAVAILABLE,
                               "the backend could not be asked which source made the response "
                               "this call follows (not connected)");
        call_finish(k);
        return -1;
    }
    if (call_follow(k, p.id, source[0] ? source : NULL) < 0) {
        call_finish(k);
        return -1;
    }
    return 0;
}

void call_begin(struct call_sink *s, uint32_t id, const struct call_req *r)
{
    struct server *srv = s->srv;
    const struct config *cfg = srv->cfg;
    double now = ev_now(srv->loop);
    char why[300];

    const struct config_app *app = r->app ? r->app : config_find_app(cfg, CONFIG_DEFAULT_APP);
    int ci = config_find_capability(cfg, r->capability, r->capability_len);
    if (ci >= 0 && app->capabilities && !app->capabilities[ci]) {
        snprintf(why, sizeof(why), "capability '%s' is not allowed for app '%s'",
                 cfg->capabilities[ci].name, app->name);
        call_refuse(s, id, r, PGW_UNKNOWN_CAPABILITY, why);
        return;
    }
    if (ci >= 0 && cfg->capabilities[ci].raw != r->raw && !r->response_id) {
        snprintf(why, sizeof(why),
                 r->raw ? "capability '%s' takes a JSON body (a map), not bytes"
                        : "capability '%s' passes its body through (body: raw): send the body "
                          "as bytes (bin) with its content_type",
                 cfg->capabilities[ci].name);
        call_refuse(s, id, r, PGW_BAD_REQUEST, why);
        return;
    }
    const char *method = r->method ? r->method : "POST";
    unsigned bit = method[0] == 'G' ? CONFIG_METHOD_GET
        : method[0] == 'D'          ? CONFIG_METHOD_DELETE
                                    : CONFIG_METHOD_POST;
    if (ci >= 0 && r->raw && !r->response_id && !(cfg->capabilities[ci].methods & bit)) {
        snprintf(why, sizeof(why), "capability '%s' is not served with %s",
                 cfg->capabilities[ci].name, method);
        call_refuse(s, id, r, PGW_BAD_REQUEST, why);
        return;
    }
    const struct config_source *first = NULL;
    for (size_t i = 0; ci >= 0 && i < cfg->n_sources; i++) {
        if (cfg->sources[i].capability_index == (size_t)ci && !cfg->sources[i].retired) {
            first = &cfg->sources[i];
            break;
        }
    }
    if (!first) {
        char name[65];
        rpc_quote_client_str(r->capability, r->capability_len, sizeof(name) - 1, name);
        snprintf(why, sizeof(why),
                 ci < 0 ? "unknown capability '%s'" : "capability '%s' has no source configured",
                 name);
        call_refuse(s, id, r, PGW_UNKNOWN_CAPABILITY, why);
        return;
    }
    /* Model routing (models.h): the sources that serve the model asked
     * for; none is a typed refusal, never another model. */
    bool *use = NULL;
    const char *label = NULL;
    if (r->model || app->n_models) {
        long n_use = -1;
        if (r->model && r->model_len >= MODELS_NAME_MAX) {
            call_refuse(s, id, r, PGW_BAD_REQUEST, "model: longer than 255 bytes");
            return;
        }
        if (!(use = calloc(cfg->n_sources, sizeof(*use)))) {
            call_refuse(s, id, r, PGW_INTERNAL, "out of memory");
            return;
        }
        n_use = models_select(cfg, (size_t)ci, r->model, r->model_len, app, use, &label);
        if (n_use == 0) {
            char name[MODELS_NAME_MAX + 8];
            if (r->model)
                rpc_quote_client_str(r->model, r->model_len, sizeof(name) - 1, name);
            snprintf(why, sizeof(why),
                     r->model ? "the model '%s' does not exist on capability '%s'"
                              : "%sno model of capability '%s' is allowed for this app",
                     r->model ? name : "", cfg->capabilities[ci].name);
            free(use);
            call_refuse(s, id, r, PGW_MODEL_NOT_FOUND, why);
            metrics_on_call_refused(srv->metrics, (size_t)ci, PGW_MODEL_NOT_FOUND);
            metrics_on_model_call(srv->metrics, (size_t)ci, "other", PGW_MODEL_NOT_FOUND);
            return;
        }
        if (n_use < 0) {
            free(use);
            use = NULL;
        }
        for (size_t i = 0; use && i < cfg->n_sources; i++)
            if (use[i]) {
                first = &cfg->sources[i];
                break;
            }
    }

    if ((r->gemini_only || r->gemini_never) &&
        call_keep_gemini(s, id, r, (size_t)ci, r->gemini_only, &use, &first) < 0)
        return;

    /* A call naming a task runs only while the task runs. */
    struct task *task = NULL;
    struct task_wait *tw = NULL;
    if (r->task_id) {
        if (!tasks_held_running(srv, r->task_id)) {
            /* Not held running here, or a copy that may be stale: ask the
             * record. */
            tw = calloc(1, sizeof(*tw));
            if (!tw) {
                call_refuse(s, id, r, PGW_INTERNAL, "out of memory");
                free(use);
                return;
            }
            snprintf(tw->id, sizeof(tw->id), "%s", r->task_id);
        } else {
            struct tasks_error te;
            task = tasks_admit_call(srv, r->task_id, app, &te);
            if (!task) {
                s->ops->on_error(s, id, &te.e);
                metrics_on_call_refused(srv->metrics, (size_t)ci, te.e.code);
                call_log_refused(s, id, r, te.e.code);
                free(use);
                return;
            }
        }
    }

    /* A hit is answered here, before anything is reserved (callcache.h). */
    struct callcache cc;
    if (callcache_begin(s, id, r, (size_t)ci, app->name, &cc) > 0) {
        free(tw);
        free(use);
        return;
    }
    struct call *k = calloc(1, sizeof(*k));
    if (!k) {
        call_refuse(s, id, r, PGW_INTERNAL, "out of memory");
        callcache_fini(&cc);
        free(tw);
        free(use);
        return;
    }
    k->cc = cc;
    k->sink = s;
    k->srv = srv;
    k->msgid = id;
    /* A passthrough's `stream` is not read (proto/PROTOCOL.md): only a
     * resumed Responses stream is a streamed passthrough. */
    k->stream = r->stream && (!r->raw || r->response_id);
    str_copy(k->app, sizeof(k->app), app->name);
    k->cap = &cfg->capabilities[ci];
    k->started = now;
    k->ttft_s = k->used_tokens = k->cost = NAN;
    msgpack_sbuffer_init(&k->usage);
    msgpack_sbuffer_init(&k->body);
    strbuf_init(&k->raw);
    strbuf_init(&k->json);
    ev_init(&k->wake_w, call_on_wake_timer);
    k->wake_w.data = k;
    k->event_names = r->event_names;
    if ((r->task_id && !(k->task_id = strdup(r->task_id))) ||
        (r->model && r->model_param && !(k->model_param = strndup(r->model, r->model_len))) ||
        (label && !(k->model_label = strdup(label))) ||
        (r->query && !(k->query = strndup(r->query, r->query_len))) ||
        (r->anthropic_beta && !(k->beta_line = header_line("anthropic-beta", r->anthropic_beta)))) {
        call_refuse(s, id, r, PGW_INTERNAL, "out of memory");
        call_free_memory(k);
        free(tw);
        free(use);
        return;
    }

    /* Keep the body (the request it came in dies after this call) and check
     * it can be sent at all before anything is reserved. */
    int rc;
    if (r->raw) {
        rc = (k->rawc =
                  raw_call_new(r->method, r->path_suffix, r->content_type, r->raw_body, r->raw_len))
            ? 0
            : -1;
    } else if (r->json) {
        k->body_is_json = true;
        rc = strbuf_set_exact(&k->raw, r->json, r->json_len);
    } else {
        msgpack_packer bpk;
        msgpack_packer_init(&bpk, &k->body, msgpack_sbuffer_write);
        rc = msgpack_pack_object(&bpk, *r->mp);
        sbuffer_fit(&k->body);
    }
    if (!r->raw)
        call_scan_stream_options(k, r);
    if (rc == 0)
        rc = call_prepare_json(k, first, why, sizeof(why));
    const char *text;
    size_t text_len;
    call_body_text(k, &text, &text_len);
    struct gov_policy pol;
    governor_policy(cfg, (size_t)ci, &pol);
    if (k->rawc && !raw_call_idempotent(k->rawc))
        pol.max_attempts = 1; /* the upstream may have acted on it (rawcall.h) */
    /* The default progress scope is the capability's; a call for a model
     * by a configured name is scoped to (capability, that name), so that
     * one model's progress never keeps another's stalled calls waiting
     * (docs/DESIGN.md). */
    char model_scope[CONFIG_NAME_MAX + MODELS_NAME_MAX + 2];
    const char *scope = r->scope ? r->scope : k->cap->name;
    if (!r->scope && label && strcmp(label, "other") != 0) {
        snprintf(model_scope, sizeof(model_scope), "%s:%s", k->cap->name, label);
        scope = model_scope;
    }
    k->est_in = (double)text_len / 4.0; /* as governor_estimate_tokens */
    /* A follow-up by path (a retrieve, its stream resumed, a cancel)
     * generates nothing: it reserves no output on budgets, so that it is
     * charged nothing (docs/HTTP.md §4a). */
    k->est_out = r->response_id ? 0
        : r->max_tokens         ? (double)r->max_tokens
                                : (double)k->cap->budget_output_tokens;
    if (rc == 0)
        rc = gov_call_init(&k->g, &srv->gov, (uint32_t)ci, scope, &pol,
                           r->deadline_s > 0 ? now + r->deadline_s : 0,
                           governor_estimate_tokens(text_len, r->max_tokens), now);
    if (rc == 0)
        gov_call_set_io(&k->g, k->est_in, (double)r->max_tokens);
    if (rc == 0 && use)
        gov_call_set_sources(&k->g, use);
    if (rc == 0 && k->cap->affinity != AFFINITY_NONE)
        gov_call_set_affinity(&k->g, k->cap->affinity == AFFINITY_TASK ? r->task_id : scope);
    free(use);
    if (rc < 0) {
        enum pgw_code code = rc == TRANSCODE_EINVALID ? PGW_BAD_REQUEST : PGW_INTERNAL;
        call_refuse(s, id, r, code, rc == TRANSCODE_EINVALID ? why : "out of memory");
        metrics_on_call_refused(srv->metrics, (size_t)ci, code);
        call_free_memory(k);
        free(tw);
        return;
    }
    k->g.ud = k;
    gov_call_set_app(&k->g, (uint32_t)(app - cfg->apps));
    k->src = first;
    k->code = PGW_CANCELLED;
    metrics_on_call_start(srv->metrics, (size_t)ci);
    calltrace_begin(
        &k->ct, srv->tracer,
        &(struct calltrace_start){ .traceparent = r->traceparent,
                                   .tracestate = r->tracestate,
                                   .task_trace = task && task->trace[0] ? task->trace : NULL,
                                   .task_tracestate = task ? task->trace_state : NULL,
                                   .capability = k->cap->name,
                                   .app = k->app,
                                   .task_id = k->task_id,
                                   .model = r->model,
                                   .model_len = r->model_len,
                                   .stream = k->stream,
                                   .http = !s->ops->wants_msgpack },
        now);
    if (task)
        call_task_link(k, task);
    DLIST_PUSH(s->calls, k, prev, next);
    s->n_calls++;
    DLIST_PUSH(srv->calls_all, k, all_prev, all_next);
    srv->stats.in_flight++;
    if (call_look_up_response(k, r) < 0) {
        free(tw);
        return; /* answered */
    }
    if (tw) {
        tw->k = k;
        k->task_wait = tw;
        tasks_guard_remote(srv, tw->id, app, call_on_task_checked, tw);
        return;
    }
    if (r->cache == CACHE_USE && call_cache_wait(k, r->deadline_s)) {
        call_cache_count_miss(k);
        return;
    }
    k->cc.deadline_at = r->deadline_s > 0 ? now + r->deadline_s : 0;
    if (k->cc.uncounted && call_cache_look_up(k))
        return;
    call_cache_count_miss(k);
    call_step(k);
}

/* Tears down the call's attempt and frees the call without answering. */
static void call_abort(struct call *k)
{
    if (k->attempt) {
        metrics_on_attempt_cancelled(k->srv->metrics, call_source(k));
        attempt_cancel(k->attempt);
        k->attempt = NULL;
        call_settle(k, CALL_AS_RESERVED); /* it was sent: its cost is unknown */
    }
    call_end(k);
}

bool call_is_in_flight(struct call_sink *s, uint32_t msgid)
{
    return call_find(s, msgid) != NULL;
}

int call_cancel(struct call_sink *s, uint32_t msgid)
{
    struct call *k = call_find(s, msgid);

    if (!k)
        return -1;
    char msg[96];
    snprintf(msg, sizeof(msg), "cancelled by the client after %.3fs", call_elapsed(k));
    call_pack_error(k, PGW_CANCELLED, msg, &(struct call_error){ .retry_after_s = -1 });
    calltrace_note(&k->ct, "polygw.cancel", "cancelled by the client", ev_now(k->srv->loop));
    call_abort(k);
    return 0;
}

void call_fail_all(struct call_sink *s, enum pgw_code code, const char *message)
{
    while (s->calls) {
        struct call *k = s->calls;
        call_pack_error(k, code, message, &(struct call_error){ .retry_after_s = -1 });
        call_abort(k);
    }
}

void call_abort_all(struct call_sink *s)
{
    while (s->calls) {
        calltrace_note(&s->calls->ct, "polygw.cancel", "the client went away",
                       ev_now(s->srv->loop));
        call_abort(s->calls);
    }
}

void call_on_drained(struct call_sink *s)
{
    for (struct call *k = s->calls; k; k = k->next) {
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
        struct call_sink *s = k->sink;
        call_pack_error(k, code, message,
                        &(struct call_error){ .retry_after_s = -1, .reason = task_reason(t) });
        calltrace_note(&k->ct,
                       code == PGW_WATCHDOG_TIMEOUT ? "polygw.watchdog" : "polygw.task_stop",
                       task_reason(t), ev_now(k->srv->loop));
        call_abort(k); /* unlinks k from t */
        s->ops->flush(s);
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
        if (k->g.state == GOV_CALL_WAITING && !k->admit && !k->task_wait && !k->resp_wait)
            call_on_gov_wake(&k->g, srv);
    }
}
