/*
 * tasks.c — task methods, call cancellation by task, and the watchdog timer
 * (see tasks.h). Task semantics live in src/task.c; this file maps them to
 * the wire and to the calls in flight.
 *
 * Wire rules (PROTOCOL.md 4.4): starting a running task returns it
 * unchanged; a stopped or watchdog-failed task is refused with its error
 * (a finished one may be started again: a new run of the same id);
 * stopping an unknown or finished task is a clear error and stopping twice
 * keeps the first reason. Times on the wire are Unix seconds.
 *
 * Traces (docs/OPERATIONS.md, Tracing): a task's run is a trace of its
 * own, anchored by its task.start span (a child of the caller's context);
 * its operations are spans under that one, and calls naming the task take
 * it as their parent when they bring no traceparent of their own.
 */
#include "tasks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "dlist.h"
#include "core/log.h"
#include "metrics/figures.h"
#include "task.h"
#include "trace/trace.h"


/* Operations on the backend's record (see "the backend's record" below). */
enum tasks_op {
    TOP_START,
    TOP_STOP,
    TOP_GUARD,
    TOP_FINISH,
    TOP_GET,
    TOP_NODE_BEGIN,
    TOP_SYNC,
    TOP_WATCHDOG
};
struct tasks_req;
static struct tasks_req *tasks_req_new(struct server *srv, uint32_t msgid, enum tasks_op op,
                                       const char *id, const char *reason, bool ok);
static void tasks_send(struct server *srv, struct tasks_req *q, struct reply_outlet *o);
static void tasks_retry_later(struct server *srv, struct tasks_req *q);
static void tasks_retry_free(struct server *srv);
static void resync_free(struct server *srv);
static void resync_done(struct server *srv, unsigned gen);

static void tasks_rearm(struct server *srv)
{
    double at = task_next_deadline(srv->tasks, ev_now(srv->loop));

    ev_timer_stop(srv->loop, &srv->task_w);
    if (isfinite(at)) {
        double in = at - ev_now(srv->loop);
        ev_timer_set(&srv->task_w, in > 0 ? in : 0., 0.);
        ev_timer_start(srv->loop, &srv->task_w);
    }
}

static void tasks_on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct server *srv = w->data;
    (void)revents;
    task_on_timer(srv->tasks, ev_now(loop));
    tasks_rearm(srv);
}

/* --- owners and per-app shares ------------------------------------- */

/* The index in cfg->apps of app `name` ("" or an app this sidecar does not
 * know, from another sidecar's record: -1). Apps keep their names and
 * order across reloads, so the index names the same app throughout. */
static long app_index(const struct server *srv, const char *name)
{
    const struct config_app *a = name[0] ? config_find_app(srv->cfg, name) : NULL;
    return a ? (long)(a - srv->cfg->apps) : -1;
}

/* Task `t` belongs to app `name` from now on; the per-app counts follow. */
static void task_set_owner(struct server *srv, struct task *t, const char *name)
{
    long i = app_index(srv, t->app);

    if (strcmp(t->app, name) == 0)
        return;
    if (i >= 0)
        srv->task_app_held[i]--;
    snprintf(t->app, sizeof(t->app), "%s", name);
    if ((i = app_index(srv, t->app)) >= 0)
        srv->task_app_held[i]++;
}

/* May one more task be held here for app `name` (apps[].max_tasks)? An app
 * this sidecar does not know has no share: the registry's bound applies. */
static bool app_has_room(const struct server *srv, const char *name)
{
    long i = app_index(srv, name);
    return i < 0 || srv->task_app_held[i] < srv->cfg->apps[i].max_tasks;
}

/* --- the task's trace ------------------------------------------------ */

/* A span `name` of task `t`'s trace (a child of its task.start span) from
 * `start`, with the task's id and app; NULL when the run was not traced
 * (tracing off, not sampled, or started on another sidecar). */
static struct span *task_span(struct server *srv, const struct task *t, const char *name,
                              double start)
{
    struct trace_ctx ctx;

    if (!t || !t->trace[0] || trace_ctx_parse(&ctx, t->trace, t->trace_state) < 0)
        return NULL;
    ctx.own = true;
    struct span *s = span_start(srv->tracer, NULL, &ctx, false, name, TRACE_INTERNAL, start);
    span_set(s, &TKV_S("polygw.task_id", t->id));
    if (t->app[0])
        span_set(s, &TKV_S("polygw.app", t->app));
    return s;
}

/* A node of a task as its span tells it. */
struct task_node_seen {
    char name[TASKS_ID_BUF]; /* "" = none in progress */
    double begun_at, timeout_s;
    enum task_timeout_src src;
};

static void task_node_seen(const struct task *t, struct task_node_seen *n)
{
    n->name[0] = '\0';
    if (!t || !t->node)
        return;
    snprintf(n->name, sizeof(n->name), "%s", t->node);
    n->begun_at = t->node_begun_at;
    n->timeout_s = t->node_timeout_s;
    n->src = t->node_timeout_src;
}

/* The span of node `n` of `t`, from its begin to `now`, ended by `by`
 * ("task.node_end", "task.node_begin": a next node replaced it,
 * "task.finish", "task.stop" and "watchdog": these two are errors). */
static void task_node_span(struct server *srv, const struct task *t, const struct task_node_seen *n,
                           const char *by, double now)
{
    if (!n->name[0])
        return;
    char name[TASKS_ID_BUF + 16];
    snprintf(name, sizeof(name), "task.node %s", n->name);
    struct span *s = task_span(srv, t, name, n->begun_at);
    span_set(s, &TKV_S("polygw.node", n->name));
    span_set(s, &TKV_D("polygw.timeout_s", n->timeout_s));
    span_set(s, &TKV_S("polygw.timeout_source", task_timeout_src_name(n->src)));
    span_set(s, &TKV_D("polygw.elapsed_s", now - n->begun_at));
    span_set(s, &TKV_S("polygw.ended_by", by));
    if (strcmp(by, "watchdog") == 0) {
        span_event(s, "polygw.watchdog", now, &TKV_S("polygw.reason", task_reason(t)), 1);
        span_set_error(s, "watchdog_timeout");
    } else if (strcmp(by, "task.stop") == 0) {
        span_set_error(s, "task_stopped");
    }
    span_end(s, now);
}

/* A new run of `t` started (asked for at `at`, with the caller's context
 * and budget): its task.start span, under that context, anchors the run's
 * trace. */
static void task_trace_start(struct server *srv, struct task *t, const char *traceparent,
                             const char *tracestate, double budget, double at, double now)
{
    struct trace_ctx ctx;

    t->trace[0] = '\0';
    task_set_trace_state(srv->tasks, t, NULL);
    if (!tracer_is_enabled(srv->tracer))
        return;
    trace_ctx_parse(&ctx, traceparent[0] ? traceparent : NULL, tracestate);
    struct span *s = span_start(srv->tracer, NULL, &ctx, false, "task.start", TRACE_SERVER, at);
    if (!s) {
        /* Not sampled: the run's calls follow the caller's decision. */
        if (ctx.valid) { /* its first four fields: "VV-<32>-<16>-FF" */
            memcpy(t->trace, traceparent, sizeof(t->trace) - 1);
            t->trace[sizeof(t->trace) - 1] = '\0';
            task_set_trace_state(srv->tasks, t, ctx.state);
        }
        return;
    }
    /* The run's spans and calls carry its tracestate (the caller's, unless
     * task.start is a new root that links it). */
    task_set_trace_state(srv->tasks, t, span_tracestate(s));
    span_set(s, &TKV_S("polygw.task_id", t->id));
    if (t->app[0])
        span_set(s, &TKV_S("polygw.app", t->app));
    span_set(s, &TKV_I("polygw.runs", (int64_t)t->runs));
    if (budget > 0)
        span_set(s, &TKV_D("polygw.budget", budget));
    span_traceparent(s, t->trace);
    span_end(s, now);
}

/* `t` was stopped (`by`: the app, "" = polygw itself: its budget ran out)
 * or finished: a span for it, and for node `n` (in progress before) that
 * it ended. */
static void task_trace_end(struct server *srv, struct task *t, const struct task_node_seen *n,
                           bool stop, const char *by, double at, double now)
{
    struct span *s = task_span(srv, t, stop ? "task.stop" : "task.finish", at);
    if (!s)
        return;
    if (stop) {
        span_set(s, &TKV_S("polygw.by", by[0] ? by : "polygw"));
    } else {
        span_set(s, &TKV_B("polygw.ok", t->state == TASK_SUCCEEDED));
        if (t->state != TASK_SUCCEEDED)
            span_set_error(s, "failed");
    }
    span_set(s, &TKV_S("polygw.reason", task_reason(t)));
    if (n->name[0])
        span_set(s, &TKV_S("polygw.node", n->name));
    span_end(s, now);
    task_node_span(srv, t, n, stop ? "task.stop" : "task.finish", now);
}

/* --- registry hooks -------------------------------------------------- */

static void hook_watchdog(struct task *t, double now, void *ud)
{
    struct server *srv = ud;
    char msg[TASK_REASON_MAX + TASK_ID_MAX + 64];

    log_at(LOG_ERROR, "watchdog: task failed", "task_id", LOG_S, t->id, "node", LOG_S, t->node,
           "reason", LOG_S, task_reason(t), NULL);
    snprintf(msg, sizeof(msg), "task '%s' failed by the watchdog: %s", t->id, task_reason(t));
    /* The node's span, ended by the watchdog firing. */
    struct task_node_seen n;
    task_node_seen(t, &n);
    task_node_span(srv, t, &n, "watchdog", now);
    srv->task_calls->fail(t, PGW_WATCHDOG_TIMEOUT, msg);
    /* The record learns it (a fleet, through its stop channel). */
    struct tasks_req *q = tasks_req_new(srv, 0, TOP_WATCHDOG, t->id, task_reason(t), false);
    if (q)
        tasks_send(srv, q, NULL);
    else
        log_at(LOG_ERROR, "out of memory: watchdog verdict not recorded", "task_id", LOG_S, t->id,
               NULL);
}

static void hook_watchdog_after_stop(struct task *t, double now, void *ud)
{
    (void)now;
    (void)ud;
    log_at(LOG_INFO, "watchdog: deadline passed on a stopped task (ordinary exit)", "task_id",
           LOG_S, t->id, "node", LOG_S, t->node, NULL);
}

static void hook_free(struct task *t, double now, void *ud)
{
    struct server *srv = ud;
    long i = app_index(srv, t->app);
    (void)now;
    if (i >= 0)
        srv->task_app_held[i]--;
    srv->task_calls->forget(t);
}

static void hook_state(const struct task *t, enum task_state from, double now, void *ud)
{
    (void)now;
    (void)ud;
    log_at(LOG_DEBUG, "task state", "task_id", LOG_S, t->id, "from", LOG_S, task_state_name(from),
           "to", LOG_S, task_state_name(t->state), "reason_kind", LOG_S,
           task_reason_kind_name(t->reason_kind), NULL);
}

int tasks_init(struct server *srv, const struct tasks_calls *calls, char *err, size_t errlen)
{
    struct task_config tc;
    const struct task_hooks hooks = {
        .on_state = hook_state,
        .on_watchdog = hook_watchdog,
        .on_watchdog_after_stop = hook_watchdog_after_stop,
        .on_free = hook_free,
        .ud = srv,
    };

    srv->task_calls = calls;
    task_config_defaults(&tc);
    tc.node_timeout_s = srv->cfg->defaults.node_timeout_s;
    tc.ttl_s = srv->cfg->task_ttl_s;
    tc.max_tasks = srv->cfg->max_tasks;
    tc.hash_seed = srv->rand_state ^ 0x5bd1e9955bd1e995ULL;
    srv->task_app_held = calloc(srv->cfg->n_apps, sizeof(*srv->task_app_held));
    if (!srv->task_app_held) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    srv->tasks = task_reg_new(&tc, &hooks, err, errlen);
    if (!srv->tasks) {
        free(srv->task_app_held);
        srv->task_app_held = NULL;
        return -1;
    }
    ev_init(&srv->task_w, tasks_on_timer);
    srv->task_w.data = srv;
    return 0;
}

void tasks_fini(struct server *srv)
{
    tasks_retry_free(srv);
    resync_free(srv);
    if (!srv->tasks)
        return;
    ev_timer_stop(srv->loop, &srv->task_w);
    task_reg_free(srv->tasks, ev_now(srv->loop));
    srv->tasks = NULL;
    free(srv->task_app_held);
    srv->task_app_held = NULL;
}

/* --- wire helpers ---------------------------------------------------- */

/* A run's budget on the wire: {limit, spent, reserved, left}. */
static void write_run_budget(struct writer *w, double limit, double spent, double reserved)
{
    double left = limit - spent - reserved;
    writer_str(w, "budget");
    writer_map(w, 4);
    writer_kv_double(w, "limit", limit);
    writer_kv_double(w, "spent", spent);
    writer_kv_double(w, "reserved", reserved);
    writer_kv_double(w, "left", left > 0 ? left : 0);
}

/* The task map of the wire (PROTOCOL.md 4.4) for record `bt` of task `id`;
 * `local`, the copy held here (may be NULL), names the current node when
 * the record does not. */
static void write_task(struct writer *w, const char *id, const struct backend_task *bt,
                       const struct task *local)
{
    bool failed = strcmp(bt->state, "failed") == 0;
    bool reason = bt->reason[0] != '\0';
    const char *node = bt->node                 ? bt->node
        : local && local->state == TASK_RUNNING ? local->node
                                                : NULL;

    /* its owner: the copy's, else the record's (a task not held here) */
    const char *owner = local && local->app[0] ? local->app
        : bt->owner && bt->owner[0]            ? bt->owner
                                               : NULL;

    /* A shared record's budget is the fleet's (budget.lua): its limit, and
     * what the run spent when the backend read it (task.get). */
    bool fleet_budget = bt->budget > 0;
    bool budget = fleet_budget || (local && local->has_budget);

    writer_map(w,
               5 + (failed ? 1 : 0) + (reason ? 1 : 0) + (node ? 1 : 0) + (owner ? 1 : 0) +
                   (budget ? 1 : 0));
    writer_kv_text(w, "task_id", id);
    if (owner)
        writer_kv_text(w, "app", owner);
    writer_kv_text(w, "state", bt->state);
    if (failed)
        writer_kv_text(w, "reason_kind", bt->kind);
    if (reason)
        writer_kv_text(w, "reason", bt->reason);
    if (node)
        writer_kv_text(w, "node", node);
    writer_kv_double(w, "started_at", bt->started_at_s);
    writer_kv_double(w, "updated_at", bt->updated_at_s);
    writer_kv_u64(w, "runs", bt->runs);
    if (fleet_budget && !bt->spent_known) {
        writer_str(w, "budget");
        writer_map(w, 1);
        writer_kv_double(w, "limit", bt->budget);
    } else if (fleet_budget) {
        write_run_budget(w, bt->budget, bt->spent, bt->reserved);
    } else if (budget) {
        /* The run's budget as this sidecar keeps it (docs/CONFIG.md §12a). */
        const struct budget *b = &local->budget;
        write_run_budget(w, b->p.limit[BUDGET_TOTAL], b->spent[BUDGET_TOTAL], b->reserved);
    }
}

/* Answers a registry error for task `id`; `state`, `reason`, `kind` (may
 * be NULL) and `node` describe the task when it is known. */
/* Packs the error object for a registry error of task `id`; `state`,
 * `reason`, `kind` (may be NULL) and `node` describe the task when it is
 * known. Returns its code. */
static enum pgw_code task_error_make(struct tasks_error *te, int rc, const char *id,
                                     const char *state, const char *reason, const char *kind,
                                     const char *node)
{
    char *msg = te->msg;
    const size_t cap = sizeof(te->msg);
    enum pgw_code code = PGW_BAD_REQUEST;
    bool known = state != NULL;

    if (!reason)
        reason = "";
    switch (rc) {
    case TASK_E_STOPPED:
        code = PGW_TASK_STOPPED;
        snprintf(msg, cap, "task '%s' was stopped: %s", id, reason);
        break;
    case TASK_E_WATCHDOG:
        code = PGW_WATCHDOG_TIMEOUT;
        snprintf(msg, cap, "task '%s' failed by the watchdog: %s", id, reason);
        break;
    case TASK_E_FINISHED:
        snprintf(msg, cap, "task '%s' already %s%s%s", id, known ? state : "finished",
                 *reason ? ": " : "", reason);
        break;
    case TASK_E_NOT_FOUND:
        snprintf(msg, cap, "unknown task '%s' (never started, or expired)", id);
        break;
    case TASK_E_RUNNING:
        snprintf(msg, cap, "task '%s' is already running", id);
        break;
    case TASK_E_NO_NODE:
        snprintf(msg, cap, "task '%s' has no node in progress", id);
        break;
    case TASK_E_NODE_MISMATCH:
        snprintf(msg, cap, "task '%s' is in node '%s', not the one named", id, node ? node : "");
        break;
    case TASK_E_FULL:
        code = PGW_OVERLOADED;
        snprintf(msg, cap, "too many tasks held; retry later or let finished ones expire");
        break;
    case TASK_E_INVALID:
        snprintf(msg, cap,
                 "invalid task parameters (task_id and node: 1 to %d bytes; timeout_s > 0)",
                 TASK_ID_MAX);
        break;
    case BACKEND_E_UNAVAILABLE:
        code = PGW_BACKEND_UNAVAILABLE;
        snprintf(msg, cap, "the state backend could not answer for task '%s'%s%s", id,
                 *reason ? ": " : "", reason);
        break;
    default:
        code = PGW_INTERNAL;
        snprintf(msg, cap, "task registry error: %s", task_err_name(rc));
        break;
    }
    te->e = REPLY_ERROR(code, msg);
    if ((code == PGW_TASK_STOPPED || code == PGW_WATCHDOG_TIMEOUT) && known) {
        te->e.reason = reason;
        te->e.reason_kind = kind ? kind : "";
    }
    return code;
}

/* Answers request `msgid` of `o` with error `code`, `message`. */
static void reply_plain_error(struct reply_outlet *o, uint32_t msgid, enum pgw_code code,
                              const char *message)
{
    const struct reply_error e = REPLY_ERROR(code, message);
    o->ops->error(o, msgid, &e);
}

/* Answers request `msgid` with a registry error (see task_error_make). */
static void reply_task_error_s(struct reply_outlet *o, uint32_t msgid, int rc, const char *id,
                               const char *state, const char *reason, const char *kind,
                               const char *node)
{
    struct tasks_error te;
    task_error_make(&te, rc, id, state, reason, kind, node);
    o->ops->error(o, msgid, &te.e);
}

enum pgw_code tasks_error_of(struct tasks_error *te, const char *id, const struct backend_task *bt)
{
    if (bt->exists)
        return task_error_make(te, bt->rc, id, bt->state, bt->reason, bt->kind, NULL);
    return task_error_make(te, bt->rc, id, NULL, bt->err, NULL, NULL);
}

/* Answers request `msgid` with the error of record `bt` (bt->rc < 0). */
static void reply_record_error(struct reply_outlet *o, uint32_t msgid, const char *id,
                               const struct backend_task *bt)
{
    struct tasks_error te;
    tasks_error_of(&te, id, bt);
    o->ops->error(o, msgid, &te.e);
}

/* Answers a registry error for task `id` (t: the task when known). */
static void reply_task_error(struct reply_outlet *o, uint32_t msgid, int rc, const char *id,
                             const struct task *t)
{
    if (!t) {
        reply_task_error_s(o, msgid, rc, id, NULL, NULL, NULL, NULL);
        return;
    }
    reply_task_error_s(o, msgid, rc, id, task_state_name(t->state), task_reason(t),
                       task_reason_kind_name(t->reason_kind), t->node);
}

/* --- the backend's record -----------------------------------------------
 *
 * The backend holds the task record (backend.h): with the memory backend
 * it is the local registry itself, with Redis it is task.lua's, and the
 * local registry is this sidecar's copy of the tasks it works with (it arms
 * node watchdogs and links in-flight calls). start, stop, finish, get and
 * guard go to the record first and the local copy is brought in line with
 * the answer (tasks_sync: a no-op when the copy is the record); a stop or
 * watchdog verdict then ends the local calls (tasks_end_calls, after the
 * answer). node.begin of a task not held running asks the record first (a
 * guard that imports it); node.end and list are local. A stop anywhere is
 * reported by the backend (hooks.on_task_ended): the task is re-read, and
 * the calls held here end. */

/* The backend operation of each request. */
static const enum backend_task_op top_backend[] = {
    [TOP_START] = BACKEND_TASK_START, [TOP_STOP] = BACKEND_TASK_STOP,
    [TOP_GUARD] = BACKEND_TASK_GUARD, [TOP_FINISH] = BACKEND_TASK_FINISH,
    [TOP_GET] = BACKEND_TASK_GET,     [TOP_NODE_BEGIN] = BACKEND_TASK_GUARD,
    [TOP_SYNC] = BACKEND_TASK_GET,    [TOP_WATCHDOG] = BACKEND_TASK_WATCHDOG,
};

struct tasks_req {
    struct server *srv;
    struct tasks_req *next;          /* the retry list */
    struct reply_outlet *out;        /* the client waiting for it; NULL: none, or gone */
    struct tasks_req *cprev, *cnext; /* out->waiting */
    bool resync;                     /* part of a paced resync (tasks_on_resubscribed) */
    unsigned resync_gen;             /* of which resync */
    uint32_t msgid;
    enum tasks_op op;
    bool ok;            /* finish */
    double timeout_s;   /* node.begin */
    tasks_guard_cb *cb; /* calls naming a task unknown here */
    void *cb_ud;
    char id[TASKS_ID_BUF], node[TASKS_ID_BUF], reason[TASK_REASON_MAX + 1];
    char app[CONFIG_NAME_MAX];             /* on behalf of ("": this sidecar itself) */
    bool admin;                            /* `app` may act on every app's task */
    double budget;                         /* start: the run's budget, 0 = none */
    double at;                             /* when it was asked (ev_now) */
    struct task_node_seen open_node;       /* stop, finish: the node it ends, as it was */
    char traceparent[64], tracestate[257]; /* start: the caller's, "" = none */
};

/* Does the answer to `q` import the task here (this sidecar is about to
 * work with it: start, node.begin, a call naming it)? */
static bool tasks_req_imports(const struct tasks_req *q)
{
    return q->cb || q->op == TOP_START || q->op == TOP_NODE_BEGIN;
}

/* Brings the local copy of task `id` in line with the record `bt`: a copy
 * held here that runs is restarted, or ended when the task was stopped,
 * failed by a watchdog or finished elsewhere. A task not held here is
 * imported only with `import` (this sidecar is about to work with it:
 * start, node.begin, a call naming it). */
static void tasks_sync(struct server *srv, const char *id, const struct backend_task *bt,
                       bool import)
{
    double now = ev_now(srv->loop);
    struct task *t = task_get(srv->tasks, id);

    if (!bt->exists || (!t && !import))
        return;
    if (!t && bt->owner && !app_has_room(srv, bt->owner))
        return; /* its app holds its share here already: not imported, as when full */
    if (strcmp(bt->state, "running") == 0) {
        if (!t || t->state != TASK_RUNNING) {
            if (t && t->state == TASK_FAILED && t->reason_kind != TASK_ERROR)
                return; /* a local stop is final; the record learns it from our own stop */
            task_start(srv->tasks, id, now, &t);
            /* A run started elsewhere has no trace here; this sidecar's own
             * task.start sets one (tasks_answer). */
            if (t) {
                t->trace[0] = '\0';
                task_set_trace_state(srv->tasks, t, NULL);
            }
        }
    } else if (t && t->state == TASK_RUNNING) {
        bool watchdog = strcmp(bt->kind, "watchdog") == 0;
        if (strcmp(bt->state, "failed") == 0 && (watchdog || strcmp(bt->kind, "stopped") == 0)) {
            task_stop(srv->tasks, id, bt->reason, now, &t);
            log_at(LOG_INFO, "task stopped elsewhere in the fleet", "task_id", LOG_S, id, "kind",
                   LOG_S, bt->kind, "reason", LOG_S, bt->reason, NULL);
        } else {
            task_finish(srv->tasks, id, strcmp(bt->state, "succeeded") == 0, bt->reason, now, &t);
        }
    }
    /* A shared record's run carries its budget (the fleet keeps what it
     * spent, docs/CONFIG.md §12a): the copy learns its limit and run. */
    if (t && t->state == TASK_RUNNING && srv->backend->ops->shared &&
        (t->budget_run != bt->runs || t->has_budget != (bt->budget > 0))) {
        const struct budget_limits p = { { 0, 0, bt->budget }, 0 };
        t->has_budget = bt->budget > 0;
        t->budget_run = bt->runs;
        budget_init(&t->budget, &p);
    }
    /* The record's owner is the copy's: a copy imported by an admin's
     * request (or one this sidecar held before) belongs to that app here
     * too. */
    if (t && bt->owner && bt->owner[0])
        task_set_owner(srv, t, bt->owner);
    tasks_rearm(srv);
}

/* The record says task `id` was stopped or failed by a watchdog: the calls
 * of the copy held here end at once, answered with the record's error
 * (task_stopped / watchdog_timeout) and their upstream connections closed.
 * A no-op when they ended already. */
static void tasks_end_calls(struct server *srv, const char *id, const struct backend_task *bt)
{
    char msg[TASK_REASON_MAX + TASK_ID_MAX + 64];

    if (!bt->exists || strcmp(bt->state, "failed") != 0)
        return;
    bool watchdog = strcmp(bt->kind, "watchdog") == 0;
    if (!watchdog && strcmp(bt->kind, "stopped") != 0)
        return;
    struct task *t = task_get(srv->tasks, id);
    if (!t || t->state == TASK_RUNNING || !t->ud)
        return;
    snprintf(msg, sizeof(msg),
             watchdog ? "task '%s' failed by the watchdog: %s" : "task '%s' was stopped: %s", id,
             bt->reason);
    srv->task_calls->fail(t, watchdog ? PGW_WATCHDOG_TIMEOUT : PGW_TASK_STOPPED, msg);
}

static void node_begin_local(struct reply_outlet *o, uint32_t msgid, const char *id,
                             const char *node, double timeout_s);

/* A client request waiting for the backend belongs to its connection, like
 * a call: it counts as in flight there, and ends with it (pending_drop). */
static void pending_link(struct tasks_req *q, struct reply_outlet *o)
{
    q->out = o;
    DLIST_PUSH(o->waiting, q, cprev, cnext);
    o->srv->stats.in_flight++;
    if (o->ops->waiting)
        o->ops->waiting(o, 1);
}

/* The request no longer waits on its connection (answered, or the
 * connection is gone): its reply, when it comes, only frees it. */
static void pending_unlink(struct tasks_req *q)
{
    struct reply_outlet *o = q->out;

    if (!o)
        return;
    DLIST_UNLINK(o->waiting, q, cprev, cnext);
    q->out = NULL;
    o->srv->stats.in_flight--;
    if (o->ops->waiting)
        o->ops->waiting(o, -1);
}

void tasks_fail_pending(struct reply_outlet *o, enum pgw_code code, const char *message)
{
    while (o->waiting) {
        struct tasks_req *q = o->waiting;
        pending_unlink(q);
        if (code != PGW_OK)
            reply_plain_error(o, q->msgid, code, message);
        server_on_request_done(o->srv);
    }
}

/* Answers the client of `q` with record `bt`. */
static void tasks_reply(struct reply_outlet *o, const struct tasks_req *q,
                        const struct backend_task *bt)
{
    bool idempotent = q->op == TOP_START && bt->rc == TASK_E_RUNNING;

    if (bt->rc != TASK_OK && !idempotent) {
        reply_record_error(o, q->msgid, q->id, bt);
        return;
    }
    struct task *local = task_get(o->srv->tasks, q->id);
    if (q->op == TOP_START && local && !local->app[0])
        task_set_owner(o->srv, local, q->app); /* its owner: the app that started it */
    if (q->op == TOP_STOP)
        log_at(LOG_INFO, "task stopped", "task_id", LOG_S, q->id, "app", LOG_S,
               local ? local->app : "", "by", LOG_S, q->app, "reason", LOG_S, bt->reason, NULL);
    if (q->op == TOP_NODE_BEGIN) {
        if (!local) /* running, but no room to hold it here (full, or its app's share) */
            reply_task_error(o, q->msgid, TASK_E_FULL, q->id, NULL);
        else
            node_begin_local(o, q->msgid, q->id, q->node, q->timeout_s);
        return;
    }
    struct writer *w = o->ops->result_begin(o, q->msgid);
    if (q->op == TOP_GUARD)
        writer_map(w, 0);
    else
        write_task(w, q->id, bt, task_get(o->srv->tasks, q->id));
    o->ops->result_end(o, q->msgid);
}

/* The record answered `q` with `bt` (`later`: from the event loop, not
 * inside tasks_send). Takes `q`. */
static void tasks_answer(struct tasks_req *q, const struct backend_task *bt, bool later)
{
    struct server *srv = q->srv;
    bool import = tasks_req_imports(q);
    bool failed = bt->rc == BACKEND_E_UNAVAILABLE;

    if (later && import && srv->task_imports > 0)
        srv->task_imports--;
    if (bt->exists)
        tasks_sync(srv, q->id, bt, import);
    if (q->op == TOP_START && bt->rc == TASK_OK) {
        /* The new run's budget (none without one): a run never inherits
         * an earlier run's spending. */
        struct task *t = task_get(srv->tasks, q->id);
        if (t) {
            const struct budget_limits p = { { 0, 0, q->budget }, 0 };
            t->has_budget = q->budget > 0;
            t->budget_run = bt->runs;
            budget_init(&t->budget, &p);
            if (!t->app[0])
                task_set_owner(srv, t, q->app); /* named on its span */
            task_trace_start(srv, t, q->traceparent, q->tracestate, q->budget, q->at,
                             ev_now(srv->loop));
        }
    }
    if ((q->op == TOP_STOP || q->op == TOP_FINISH) && bt->rc == TASK_OK && !q->resync)
        task_trace_end(srv, task_get(srv->tasks, q->id), &q->open_node, q->op == TOP_STOP, q->app,
                       q->at, ev_now(srv->loop));
    if (q->resync) {
        if (failed) /* that task may have been stopped: read them all again */
            srv->backend->ops->retry_later(srv->backend, true);
        tasks_end_calls(srv, q->id, bt);
        resync_done(srv, q->resync_gen);
        free(q);
        return;
    }
    if (q->op == TOP_WATCHDOG && failed) {
        tasks_retry_later(srv, q); /* the fleet must learn the verdict */
        srv->backend->ops->retry_later(srv->backend, false);
        return;
    }
    if (q->op == TOP_SYNC && failed)
        srv->backend->ops->retry_later(srv->backend, true);
    if (q->cb) {
        struct backend_task r = *bt;
        struct task *t = r.rc == TASK_OK ? task_get(srv->tasks, q->id) : NULL;
        if (r.rc == TASK_OK && !t)
            r.rc = TASK_E_FULL; /* running, but no room to hold it here */
        q->cb(q->cb_ud, t, &r);
    } else if (q->out) {
        struct reply_outlet *o = q->out;
        if (later)
            pending_unlink(q);
        else
            q->out = NULL; /* answered inside its dispatch: never linked */
        tasks_reply(o, q, bt);
        if (later) {
            if (o->ops->flush)
                o->ops->flush(o);
            server_on_request_done(srv);
        }
    }
    /* Answered first (a stop's client hears of it before its calls do). */
    tasks_end_calls(srv, q->id, bt);
    free(q);
}

static void tasks_on_answer(void *ud, const struct backend_task *bt)
{
    tasks_answer(ud, bt, true);
}

/* A request for `op` on task `id`, or NULL when out of memory. */
static struct tasks_req *tasks_req_new(struct server *srv, uint32_t msgid, enum tasks_op op,
                                       const char *id, const char *reason, bool ok)
{
    struct tasks_req *q = calloc(1, sizeof(*q));

    if (!q)
        return NULL;
    *q = (struct tasks_req){
        .srv = srv, .msgid = msgid, .op = op, .ok = ok, .at = ev_now(srv->loop)
    };
    snprintf(q->id, sizeof(q->id), "%s", id);
    snprintf(q->reason, sizeof(q->reason), "%s", reason ? reason : "");
    /* Seen before the record acts (the memory backend's ends it at once). */
    task_node_seen(op == TOP_STOP || op == TOP_FINISH ? task_get(srv->tasks, id) : NULL,
                   &q->open_node);
    return q;
}

/* The request is on behalf of `app`: the record's ownership rule applies
 * to it (an admin app may act on any task), and a task it starts is its. */
static void tasks_req_by(struct tasks_req *q, const struct config_app *app)
{
    snprintf(q->app, sizeof(q->app), "%s", app->name);
    q->admin = app->admin;
}

/* Sends `q` (taken) to the backend; it completes in tasks_answer, now or
 * from the event loop, with client `c` (NULL: none) waiting on it. When it
 * cannot be sent: the client (or q->cb) gets backend_unavailable at once,
 * a watchdog verdict waits for the backend to be back, a sync asks for a
 * resync. */
static void tasks_send(struct server *srv, struct tasks_req *q, struct reply_outlet *o)
{
    struct backend_task bt;
    int rc = backend_task(srv->backend, top_backend[q->op], q->id, q->reason, q->ok,
                          q->app[0] ? q->app : NULL, q->admin, q->budget, &bt, tasks_on_answer, q);

    if (rc > 0) {
        if (o && !q->cb)
            q->out = o; /* answered before dispatch returns: not in flight */
        tasks_answer(q, &bt, false);
        return;
    }
    if (rc == 0) {
        if (tasks_req_imports(q))
            srv->task_imports++;
        if (o && !q->cb)
            pending_link(q, o);
        return;
    }
    if (q->op == TOP_WATCHDOG) {
        tasks_retry_later(srv, q);
        return;
    }
    if (q->op == TOP_SYNC)
        srv->backend->ops->retry_later(srv->backend, true);
    bt = (struct backend_task){ .rc = BACKEND_E_UNAVAILABLE, .err = "not connected" };
    if (q->cb)
        q->cb(q->cb_ud, NULL, &bt);
    else if (o)
        reply_record_error(o, q->msgid, q->id, &bt);
    free(q);
}

/* Sends `op` for the task of request `r` of client `o`; answers internal
 * when out of memory. */
static void tasks_remote(struct reply_outlet *o, const struct task_req *r, enum tasks_op op)
{
    struct tasks_req *q = tasks_req_new(o->srv, r->msgid, op, r->id, r->reason, r->ok);

    if (!q) {
        reply_plain_error(o, r->msgid, PGW_INTERNAL, "out of memory");
        return;
    }
    q->budget = r->budget;
    memcpy(q->traceparent, r->traceparent, sizeof(q->traceparent));
    memcpy(q->tracestate, r->tracestate, sizeof(q->tracestate));
    tasks_req_by(q, r->app);
    tasks_send(o->srv, q, o);
}

void tasks_stop_budget(struct server *srv, const char *id)
{
    struct tasks_req *q = tasks_req_new(srv, 0, TOP_STOP, id, TASKS_BUDGET_REASON, false);

    log_at(LOG_INFO, "task stopped: its budget ran out", "task_id", LOG_S, id, NULL);
    if (q)
        tasks_send(srv, q, NULL);
}

void tasks_on_task_ended(struct server *srv, const char *id)
{
    /* A task not held here matters only if an import of it may be in
     * flight: this read is then answered after it (one connection, replies
     * in order). */
    if (!task_get(srv->tasks, id) && srv->task_imports == 0)
        return;
    struct tasks_req *q = tasks_req_new(srv, 0, TOP_SYNC, id, NULL, false);
    if (q)
        tasks_send(srv, q, NULL);
    else
        srv->backend->ops->retry_later(srv->backend, true);
}

bool tasks_is_pending(const struct reply_outlet *o, uint32_t msgid)
{
    for (struct tasks_req *q = o->waiting; q; q = q->cnext)
        if (q->msgid == msgid)
            return true;
    return false;
}

/* Watchdog verdicts that could not reach the backend, sent again when it is
 * back (bounded: beyond TASKS_RETRY_MAX the oldest are dropped, logged). */
#define TASKS_RETRY_MAX 4096

static void tasks_retry_later(struct server *srv, struct tasks_req *q)
{
    q->next = NULL;
    if (srv->task_retry_tail)
        srv->task_retry_tail->next = q;
    else
        srv->task_retry = q;
    srv->task_retry_tail = q;
    if (++srv->task_retry_n > TASKS_RETRY_MAX) {
        struct tasks_req *old = srv->task_retry;
        srv->task_retry = old->next;
        srv->task_retry_n--;
        log_at(LOG_ERROR, "watchdog verdict dropped: the backend was unreachable too long",
               "task_id", LOG_S, old->id, NULL);
        free(old);
    }
}

static void tasks_retry_free(struct server *srv)
{
    while (srv->task_retry) {
        struct tasks_req *q = srv->task_retry;
        srv->task_retry = q->next;
        free(q);
    }
    srv->task_retry_tail = NULL;
    srv->task_retry_n = 0;
}

void tasks_on_backend_up(struct server *srv)
{
    struct tasks_req *list = srv->task_retry;

    srv->task_retry = srv->task_retry_tail = NULL;
    srv->task_retry_n = 0;
    while (list) {
        struct tasks_req *q = list;
        list = q->next;
        q->next = NULL;
        tasks_send(srv, q, NULL);
    }
}

bool tasks_held_running(struct server *srv, const char *id)
{
    struct task *t = task_get(srv->tasks, id);
    return t && t->state == TASK_RUNNING;
}

/* A resync re-reads every running task held here, at most
 * TASKS_RESYNC_WINDOW at a time: tens of thousands of reads sent at once
 * would outlast the command timeout, drop the connection, and start the
 * resync over. */
#define TASKS_RESYNC_WINDOW 128

struct tasks_resync {
    char **ids;
    size_t n, next, inflight;
    unsigned gen; /* reads of an older resync do not count */
    bool pumping; /* inside resync_pump: an answer only counts */
};

static unsigned resync_gen_counter;

static void resync_free(struct server *srv)
{
    struct tasks_resync *rs = srv->resync;

    if (!rs)
        return;
    for (size_t i = rs->next; i < rs->n; i++)
        free(rs->ids[i]);
    free(rs->ids);
    free(rs);
    srv->resync = NULL;
}

static void resync_pump(struct server *srv)
{
    struct tasks_resync *rs = srv->resync;

    if (rs && srv->backend->ops->is_closing(srv->backend)) {
        resync_free(srv); /* exiting: the replies in flight only free their requests */
        return;
    }
    if (!rs)
        return;
    rs->pumping = true;
    while (rs->inflight < TASKS_RESYNC_WINDOW && rs->next < rs->n) {
        char *id = rs->ids[rs->next++];
        struct tasks_req *q = tasks_req_new(srv, 0, TOP_SYNC, id, NULL, false);
        free(id);
        if (q) {
            q->resync = true;
            q->resync_gen = rs->gen;
        }
        struct backend_task bt;
        int rc = q ? backend_task(srv->backend, BACKEND_TASK_GET, q->id, "", false, NULL, false, 0,
                                  &bt, tasks_on_answer, q)
                   : -1;
        if (rc < 0) {
            free(q);
            resync_free(srv);
            srv->backend->ops->retry_later(srv->backend, true); /* all over again, later */
            return;
        }
        rs->inflight++;
        if (rc > 0)
            tasks_answer(q, &bt, false); /* counts itself done (rs stays: pumping) */
    }
    rs->pumping = false;
    if (rs->next == rs->n && rs->inflight == 0)
        resync_free(srv);
}

/* A read of a resync came back (or failed): send the next. */
static void resync_done(struct server *srv, unsigned gen)
{
    if (!srv->resync || srv->resync->gen != gen)
        return;
    if (srv->resync->inflight > 0)
        srv->resync->inflight--;
    if (!srv->resync->pumping)
        resync_pump(srv);
}

static int resync_collect(struct task *t, void *ud)
{
    struct tasks_resync *rs = ud;
    char *id = strdup(t->id);

    if (!id)
        return -1;
    rs->ids[rs->n++] = id;
    return 0;
}

void tasks_on_resubscribed(struct server *srv)
{
    size_t running = task_reg_stats(srv->tasks)->running;
    struct tasks_resync *rs = calloc(1, sizeof(*rs));

    resync_free(srv); /* a resync in progress starts over */
    if (rs)
        rs->ids = calloc(running ? running : 1, sizeof(*rs->ids));
    if (!rs || !rs->ids) {
        free(rs);
        log_at(LOG_ERROR, "out of memory: running tasks not re-read after a backend gap", NULL);
        return;
    }
    rs->gen = ++resync_gen_counter;
    srv->resync = rs;
    task_foreach(srv->tasks, TASK_F_RUNNING, resync_collect, rs);
    log_at(LOG_INFO, "re-reading the running tasks after a backend gap", "tasks", LOG_U,
           (unsigned long long)rs->n, NULL);
    resync_pump(srv);
}

void tasks_guard_remote(struct server *srv, const char *id, const struct config_app *app,
                        tasks_guard_cb *cb, void *ud)
{
    struct tasks_req *q = tasks_req_new(srv, 0, TOP_GUARD, id, NULL, false);

    if (!q) {
        const struct backend_task bt = { .rc = BACKEND_E_UNAVAILABLE, .err = "out of memory" };
        cb(ud, NULL, &bt);
        return;
    }
    tasks_req_by(q, app);
    q->cb = cb;
    q->cb_ud = ud;
    tasks_send(srv, q, NULL);
}

/* --- methods --------------------------------------------------------- */

/* Ownership (docs/APPS.md): a task belongs to the app that started it, an
 * admin app included, and no other app ever takes it. Another app gets
 * exactly the answer for a task that does not exist, so it learns nothing
 * about it (not even that it was stopped); an admin app sees and acts on
 * every task. A copy without an owner (a record written before owners were
 * kept) is an admin's. Returns true when `app` may see `t`. */
static bool task_is_visible(const struct task *t, const struct config_app *app)
{
    return !t || app->admin || (t->app[0] && strcmp(t->app, app->name) == 0);
}

/* True (after answering "unknown task") when the task of `r` is held here
 * and belongs to another app than r->app. */
static bool task_is_foreign(struct reply_outlet *o, const struct task_req *r)
{
    if (task_is_visible(task_get(o->srv->tasks, r->id), r->app))
        return false;
    reply_task_error(o, r->msgid, TASK_E_NOT_FOUND, r->id, NULL);
    return true;
}

void tasks_start(struct reply_outlet *o, const struct task_req *r)
{
    if (task_is_foreign(o, r))
        return;
    /* A new task here takes a slot of its app's share (the registry's
     * max_tasks bounds them all): beyond it, this app waits, not the others. */
    if (!task_get(o->srv->tasks, r->id) && !app_has_room(o->srv, r->app->name)) {
        char msg[200];
        o->srv->task_app_refused++;
        snprintf(msg, sizeof(msg),
                 "app '%s' holds %u tasks, its apps[].max_tasks; retry later or let finished "
                 "ones expire",
                 r->app->name, r->app->max_tasks);
        reply_plain_error(o, r->msgid, PGW_OVERLOADED, msg);
        return;
    }
    tasks_remote(o, r, TOP_START);
}

void tasks_stop(struct reply_outlet *o, const struct task_req *r)
{
    if (!task_is_foreign(o, r))
        tasks_remote(o, r, TOP_STOP);
}

void tasks_guard(struct reply_outlet *o, const struct task_req *r)
{
    struct task *t = NULL;

    if (task_is_foreign(o, r))
        return;
    /* Activity on the copy held here, if any; the record answers (a copy
     * may be stale). */
    task_guard(o->srv->tasks, r->id, ev_now(o->srv->loop), &t);
    tasks_remote(o, r, TOP_GUARD);
}

static void node_begin_local(struct reply_outlet *o, uint32_t msgid, const char *id,
                             const char *node, double timeout_s)
{
    struct task *t = NULL;
    struct task_node_seen prev;
    task_node_seen(task_get(o->srv->tasks, id), &prev);
    int rc = task_node_begin(o->srv->tasks, id, node, timeout_s, ev_now(o->srv->loop), &t);

    if (rc < 0) {
        reply_task_error(o, msgid, rc, id, t);
        return;
    }
    task_node_span(o->srv, t, &prev, "task.node_begin", ev_now(o->srv->loop)); /* replaced */
    tasks_rearm(o->srv);
    struct writer *w = o->ops->result_begin(o, msgid);
    writer_map(w, 2);
    writer_kv_double(w, "timeout_s", t->node_timeout_s);
    writer_kv_str(w, "timeout_source", task_timeout_src_name(t->node_timeout_src));
    o->ops->result_end(o, msgid);
}

void tasks_node_begin(struct reply_outlet *o, const struct task_req *r)
{
    if (task_is_foreign(o, r))
        return;
    if (!tasks_held_running(o->srv, r->id)) {
        /* Started on another sidecar (or before a restart), or a copy here
         * that may be stale: the record decides, and a running task is
         * imported; then the node begins here (tasks_reply). */
        struct tasks_req *q = tasks_req_new(o->srv, r->msgid, TOP_NODE_BEGIN, r->id, NULL, false);
        if (!q) {
            reply_plain_error(o, r->msgid, PGW_INTERNAL, "out of memory");
            return;
        }
        snprintf(q->node, sizeof(q->node), "%s", r->node);
        q->timeout_s = r->timeout_s;
        tasks_req_by(q, r->app);
        tasks_send(o->srv, q, o);
        return;
    }
    node_begin_local(o, r->msgid, r->id, r->node, r->timeout_s);
}

void tasks_node_end(struct reply_outlet *o, const struct task_req *r)
{
    struct task *t = NULL;
    double now = ev_now(o->srv->loop);

    if (task_is_foreign(o, r))
        return;
    t = task_get(o->srv->tasks, r->id);
    double begun = t && t->node ? t->node_begun_at : now;
    struct task_node_seen n;
    task_node_seen(t, &n);
    int rc = task_node_end(o->srv->tasks, r->id, r->has_node ? r->node : NULL, now, &t);
    if (rc < 0) {
        reply_task_error(o, r->msgid, rc, r->id, t);
        return;
    }
    task_node_span(o->srv, t, &n, "task.node_end", now);
    tasks_rearm(o->srv);
    struct writer *w = o->ops->result_begin(o, r->msgid);
    writer_map(w, 1);
    writer_kv_double(w, "elapsed_s", now - begun);
    o->ops->result_end(o, r->msgid);
}

void tasks_finish(struct reply_outlet *o, const struct task_req *r)
{
    if (!task_is_foreign(o, r))
        tasks_remote(o, r, TOP_FINISH);
}

void tasks_get(struct reply_outlet *o, const struct task_req *r)
{
    if (!task_is_foreign(o, r))
        tasks_remote(o, r, TOP_GET);
}

struct list_ctx {
    struct server *srv;
    struct writer *w;
    const struct config_app *app; /* lists only what it may see */
    size_t n;
    bool counting;
};

static int list_one(struct task *t, void *ud)
{
    struct list_ctx *lc = ud;
    struct backend_task bt;

    if (!lc->app->admin && strcmp(t->app, lc->app->name) != 0)
        return 0;
    if (lc->counting) {
        lc->n++;
        return 0;
    }
    backend_task_describe(&bt, t, lc->srv->loop);
    write_task(lc->w, t->id, &bt, t);
    return 0;
}

void tasks_list(struct reply_outlet *o, const struct task_req *r)
{
    struct list_ctx lc = { o->srv, NULL, r->app, 0, true };

    task_foreach(o->srv->tasks, r->filter, list_one, &lc);
    lc.w = o->ops->result_begin(o, r->msgid);
    writer_map(lc.w, 1);
    writer_str(lc.w, "tasks");
    writer_array(lc.w, (uint32_t)lc.n);
    lc.counting = false;
    task_foreach(o->srv->tasks, r->filter, list_one, &lc);
    o->ops->result_end(o, r->msgid);
}

struct task *tasks_admit_call(struct server *srv, const char *id, const struct config_app *app,
                              struct tasks_error *err)
{
    struct task *t = NULL;
    if (!task_is_visible(task_get(srv->tasks, id), app)) {
        task_error_make(err, TASK_E_NOT_FOUND, id, NULL, NULL, NULL, NULL);
        return NULL;
    }
    int rc = task_guard(srv->tasks, id, ev_now(srv->loop), &t);

    if (rc < 0) {
        if (t)
            task_error_make(err, rc, id, task_state_name(t->state), task_reason(t),
                            task_reason_kind_name(t->reason_kind), t->node);
        else
            task_error_make(err, rc, id, NULL, NULL, NULL, NULL);
        return NULL;
    }
    return t;
}

struct running_ctx {
    struct writer *w;
    const struct config_app *app; /* lists only what it may see */
    double now;
    size_t n, max;
};

static int running_one(struct task *t, void *ud)
{
    struct running_ctx *rc = ud;

    if (!rc->app->admin && strcmp(t->app, rc->app->name) != 0)
        return 0;
    if (rc->n == rc->max)
        return 1;
    rc->n++;
    if (!rc->w)
        return 0;
    struct writer *w = rc->w;
    writer_map(w, 2 + (t->app[0] ? 1 : 0) + (t->node ? 3 : 0));
    writer_kv_text(w, "task_id", t->id);
    if (t->app[0]) /* as in task.get: a record written before owners were kept has none */
        writer_kv_text(w, "app", t->app);
    writer_kv_double(w, "age_s", rc->now - t->started_at);
    if (t->node) {
        writer_kv_text(w, "node", t->node);
        writer_kv_double(w, "node_age_s", rc->now - t->node_begun_at);
        writer_kv_double(w, "node_timeout_s", t->node_timeout_s);
    }
    return 0;
}

/* What `running_tasks` reads: the server, and the app that asks (its own
 * tasks, every app's for an admin app). */
struct stats_view {
    struct server *srv;
    const struct config_app *app;
};

static void write_running(struct writer *w, const void *obj, size_t row)
{
    const struct stats_view *v = obj;
    struct running_ctx rc = { NULL, v->app, ev_now(v->srv->loop), 0, TASKS_STATS_RUNNING_MAX };
    (void)row;

    /* Two passes, as task.list: the count first, then the entries. */
    task_foreach(v->srv->tasks, TASK_F_RUNNING, running_one, &rc);
    writer_array(w, (uint32_t)rc.n);
    rc.w = w;
    rc.n = 0;
    task_foreach(v->srv->tasks, TASK_F_RUNNING, running_one, &rc);
}

static const struct figure running[] = {
    { .key = "running_tasks", .kind = FIG_CUSTOM, .write = write_running },
};
static const struct fig_table running_table = FIG_TABLE(running);

void tasks_write_stats(struct writer *w, struct server *srv, const struct config_app *app)
{
    const struct stats_view v = { srv, app };
    /* The registry's figures are /metrics' too (metrics/figures.c). */
    const struct fig_part parts[] = { { &running_table, &v }, { &figs_tasks, srv } };

    writer_str(w, "tasks");
    figs_write_parts(w, parts, sizeof(parts) / sizeof(parts[0]));
}
