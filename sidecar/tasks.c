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
 */
#include "tasks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "log.h"
#include "task.h"

#define TASKS_ID_BUF (TASK_ID_MAX + 1)

/* Monotonic loop time -> Unix seconds. */
static double unix_time(const struct server *srv, double t)
{
    return ev_time() - (ev_now(srv->loop) - t);
}

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

/* --- registry hooks -------------------------------------------------- */

static void hook_watchdog(struct task *t, double now, void *ud)
{
    struct server *srv = ud;
    char msg[TASK_REASON_MAX + TASK_ID_MAX + 64];
    (void)now;

    log_at(LOG_ERROR, "watchdog: task failed", "task_id", LOG_S, t->id, "node", LOG_S, t->node,
           "reason", LOG_S, task_reason(t), NULL);
    snprintf(msg, sizeof(msg), "task '%s' failed by the watchdog: %s", t->id, task_reason(t));
    call_fail_task(t, PGW_WATCHDOG_TIMEOUT, msg);
    (void)srv;
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
    (void)now;
    (void)ud;
    call_forget_task(t);
}

static void hook_state(const struct task *t, enum task_state from, double now, void *ud)
{
    (void)now;
    (void)ud;
    log_at(LOG_DEBUG, "task state", "task_id", LOG_S, t->id, "from", LOG_S, task_state_name(from),
           "to", LOG_S, task_state_name(t->state), "reason_kind", LOG_S,
           task_reason_kind_name(t->reason_kind), NULL);
}

int tasks_init(struct server *srv, char *err, size_t errlen)
{
    struct task_config tc;
    const struct task_hooks hooks = {
        .on_state = hook_state,
        .on_watchdog = hook_watchdog,
        .on_watchdog_after_stop = hook_watchdog_after_stop,
        .on_free = hook_free,
        .ud = srv,
    };

    task_config_defaults(&tc);
    tc.node_timeout_s = srv->cfg->defaults.node_timeout_s;
    tc.ttl_s = srv->cfg->task_ttl_s;
    tc.max_tasks = srv->cfg->max_tasks;
    tc.hash_seed = srv->rand_state ^ 0x5bd1e9955bd1e995ULL;
    srv->tasks = task_reg_new(&tc, &hooks, err, errlen);
    if (!srv->tasks)
        return -1;
    ev_init(&srv->task_w, tasks_on_timer);
    srv->task_w.data = srv;
    return 0;
}

void tasks_fini(struct server *srv)
{
    if (!srv->tasks)
        return;
    ev_timer_stop(srv->loop, &srv->task_w);
    task_reg_free(srv->tasks, ev_now(srv->loop));
    srv->tasks = NULL;
}

/* --- wire helpers ---------------------------------------------------- */

static void pack_task(msgpack_packer *pk, const struct server *srv, const struct task *t)
{
    bool failed = t->state == TASK_FAILED;
    bool reason = t->reason && t->reason[0];
    double updated = t->ended_at > 0 ? t->ended_at : t->last_active_at;

    msgpack_pack_map(pk, 5 + (failed ? 1 : 0) + (reason ? 1 : 0) + (t->node ? 1 : 0));
    rpc_pack_kv_str(pk, "task_id", t->id);
    rpc_pack_kv_str(pk, "state", task_state_name(t->state));
    if (failed)
        rpc_pack_kv_str(pk, "reason_kind", task_reason_kind_name(t->reason_kind));
    if (reason)
        rpc_pack_kv_str(pk, "reason", t->reason);
    if (t->node)
        rpc_pack_kv_str(pk, "node", t->node);
    rpc_pack_kv_double(pk, "started_at", unix_time(srv, t->started_at));
    rpc_pack_kv_double(pk, "updated_at", unix_time(srv, updated));
    rpc_pack_str(pk, "runs");
    msgpack_pack_uint64(pk, t->runs);
}

static void reply_task(struct conn *c, uint32_t msgid, const struct task *t)
{
    rpc_pack_result_begin(&c->pk, msgid);
    pack_task(&c->pk, c->srv, t);
    conn_response_done(c, PGW_OK);
}

/* Answers a registry error for task `id` (t: the task when known). */
static void reply_task_error(struct conn *c, uint32_t msgid, int rc, const char *id,
                             const struct task *t)
{
    char msg[TASK_REASON_MAX + TASK_ID_MAX + 96];
    enum pgw_code code = PGW_BAD_REQUEST;

    switch (rc) {
    case TASK_E_STOPPED:
        code = PGW_TASK_STOPPED;
        snprintf(msg, sizeof(msg), "task '%s' was stopped: %s", id, t ? task_reason(t) : "");
        break;
    case TASK_E_WATCHDOG:
        code = PGW_WATCHDOG_TIMEOUT;
        snprintf(msg, sizeof(msg), "task '%s' failed by the watchdog: %s", id,
                 t ? task_reason(t) : "");
        break;
    case TASK_E_FINISHED:
        snprintf(msg, sizeof(msg), "task '%s' already %s%s%s", id,
                 t ? task_state_name(t->state) : "finished", t && t->reason ? ": " : "",
                 t && t->reason ? t->reason : "");
        break;
    case TASK_E_NOT_FOUND:
        snprintf(msg, sizeof(msg), "unknown task '%s' (never started, or expired)", id);
        break;
    case TASK_E_RUNNING:
        snprintf(msg, sizeof(msg), "task '%s' is already running", id);
        break;
    case TASK_E_NO_NODE:
        snprintf(msg, sizeof(msg), "task '%s' has no node in progress", id);
        break;
    case TASK_E_NODE_MISMATCH:
        snprintf(msg, sizeof(msg), "task '%s' is in node '%s', not the one named", id,
                 t && t->node ? t->node : "");
        break;
    case TASK_E_FULL:
        code = PGW_OVERLOADED;
        snprintf(msg, sizeof(msg), "too many tasks held; retry later or let finished ones expire");
        break;
    case TASK_E_INVALID:
        snprintf(msg, sizeof(msg),
                 "invalid task parameters (task_id and node: 1 to %d bytes; timeout_s > 0)",
                 TASK_ID_MAX);
        break;
    default:
        code = PGW_INTERNAL;
        snprintf(msg, sizeof(msg), "task registry error: %s", task_err_name(rc));
        break;
    }
    bool with_reason = (code == PGW_TASK_STOPPED || code == PGW_WATCHDOG_TIMEOUT) && t;
    rpc_pack_error_begin(&c->pk, msgid, code, msg, with_reason ? 2 : 0);
    if (with_reason) {
        rpc_pack_kv_str(&c->pk, "reason", task_reason(t));
        rpc_pack_kv_str(&c->pk, "reason_kind", task_reason_kind_name(t->reason_kind));
    }
    rpc_pack_error_end(&c->pk);
    conn_response_done(c, code);
}

/* Binds params; copies task_id (and node) into NUL-terminated buffers. */
static int bind_task(struct conn *c, const struct rpc_msg *m, const struct rpc_param *spec,
                     size_t n, const msgpack_object **p, char *id, char *node)
{
    char why[200];

    if (rpc_bind(m->params, spec, n, p, why, sizeof(why)) < 0) {
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST, why);
        return -1;
    }
    if (p[0]->via.str.size == 0 || rpc_str_copy(p[0], id, TASKS_ID_BUF) < 0 ||
        memchr(id, '\0', p[0]->via.str.size)) {
        snprintf(why, sizeof(why), "parameter 'task_id': expected 1 to %d bytes without NUL",
                 TASK_ID_MAX);
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST, why);
        return -1;
    }
    if (node && n > 1 && p[1] && p[1]->type == MSGPACK_OBJECT_STR &&
        (p[1]->via.str.size == 0 || rpc_str_copy(p[1], node, TASKS_ID_BUF) < 0 ||
         memchr(node, '\0', p[1]->via.str.size))) {
        snprintf(why, sizeof(why), "parameter 'node': expected 1 to %d bytes without NUL",
                 TASK_NODE_MAX);
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST, why);
        return -1;
    }
    return 0;
}

/* A string param (reason) copied into a bounded buffer, cut at a UTF-8 boundary. */
static void copy_reason(const msgpack_object *o, char *buf, size_t cap)
{
    if (!o || o->type != MSGPACK_OBJECT_STR) {
        buf[0] = '\0';
        return;
    }
    rpc_quote_client_str(o->via.str.ptr, o->via.str.size, cap - 1, buf);
}

/* --- methods --------------------------------------------------------- */

void tasks_start(struct conn *c, const struct rpc_msg *m)
{
    static const struct rpc_param spec[] = {{"task_id", RPC_T_STR, true}};
    const msgpack_object *p[1];
    char id[TASKS_ID_BUF];
    struct server *srv = c->srv;
    struct task *t = NULL;

    if (bind_task(c, m, spec, 1, p, id, NULL) < 0)
        return;
    /* Stopped and watchdog-failed tasks stay refused: a stop must not be
     * undone by a worker that did not notice it. */
    t = task_get(srv->tasks, id);
    if (t && t->state == TASK_FAILED &&
        (t->reason_kind == TASK_STOPPED || t->reason_kind == TASK_WATCHDOG)) {
        reply_task_error(c, m->msgid, t->reason_kind == TASK_STOPPED ? TASK_E_STOPPED
                                                                     : TASK_E_WATCHDOG,
                         id, t);
        return;
    }
    int rc = task_start(srv->tasks, id, ev_now(srv->loop), &t);
    if (rc == TASK_E_RUNNING && t) {
        reply_task(c, m->msgid, t); /* idempotent */
        return;
    }
    if (rc < 0) {
        reply_task_error(c, m->msgid, rc, id, t);
        return;
    }
    tasks_rearm(srv);
    reply_task(c, m->msgid, t);
}

void tasks_stop(struct conn *c, const struct rpc_msg *m)
{
    static const struct rpc_param spec[] = {
        {"task_id", RPC_T_STR, true},
        {"reason", RPC_T_STR | RPC_T_NIL, false},
    };
    const msgpack_object *p[2];
    char id[TASKS_ID_BUF], reason[TASK_REASON_MAX + 1], msg[TASK_REASON_MAX + TASK_ID_MAX + 64];
    struct server *srv = c->srv;
    struct task *t = NULL;

    if (bind_task(c, m, spec, 2, p, id, NULL) < 0)
        return;
    copy_reason(p[1], reason, sizeof(reason));
    int rc = task_stop(srv->tasks, id, reason, ev_now(srv->loop), &t);
    if (rc < 0) {
        reply_task_error(c, m->msgid, rc, id, t);
        return;
    }
    log_at(LOG_INFO, "task stopped", "task_id", LOG_S, id, "reason", LOG_S, task_reason(t), NULL);
    /* Answer the stop first, then end its calls at once. */
    reply_task(c, m->msgid, t);
    snprintf(msg, sizeof(msg), "task '%s' was stopped: %s", id, task_reason(t));
    call_fail_task(t, PGW_TASK_STOPPED, msg);
    tasks_rearm(srv);
}

void tasks_guard(struct conn *c, const struct rpc_msg *m)
{
    static const struct rpc_param spec[] = {{"task_id", RPC_T_STR, true}};
    const msgpack_object *p[1];
    char id[TASKS_ID_BUF];
    struct task *t = NULL;

    if (bind_task(c, m, spec, 1, p, id, NULL) < 0)
        return;
    int rc = task_guard(c->srv->tasks, id, ev_now(c->srv->loop), &t);
    if (rc < 0) {
        reply_task_error(c, m->msgid, rc, id, t);
        return;
    }
    tasks_rearm(c->srv);
    rpc_pack_result_begin(&c->pk, m->msgid);
    msgpack_pack_map(&c->pk, 0);
    conn_response_done(c, PGW_OK);
}

void tasks_node_begin(struct conn *c, const struct rpc_msg *m)
{
    static const struct rpc_param spec[] = {
        {"task_id", RPC_T_STR, true},
        {"node", RPC_T_STR, true},
        {"timeout_s", RPC_T_NUMBER | RPC_T_NIL, false},
    };
    const msgpack_object *p[3];
    char id[TASKS_ID_BUF], node[TASKS_ID_BUF];
    double timeout_s = 0;
    struct task *t = NULL;

    if (bind_task(c, m, spec, 3, p, id, node) < 0)
        return;
    if (p[2] && (!rpc_as_double(p[2], &timeout_s) || !(timeout_s > 0) || !isfinite(timeout_s))) {
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST,
                         "parameter 'timeout_s': expected a positive number of seconds");
        return;
    }
    int rc = task_node_begin(c->srv->tasks, id, node, timeout_s, ev_now(c->srv->loop), &t);
    if (rc < 0) {
        reply_task_error(c, m->msgid, rc, id, t);
        return;
    }
    tasks_rearm(c->srv);
    rpc_pack_result_begin(&c->pk, m->msgid);
    msgpack_pack_map(&c->pk, 2);
    rpc_pack_kv_double(&c->pk, "timeout_s", t->node_timeout_s);
    rpc_pack_kv_str(&c->pk, "timeout_source", task_timeout_src_name(t->node_timeout_src));
    conn_response_done(c, PGW_OK);
}

void tasks_node_end(struct conn *c, const struct rpc_msg *m)
{
    static const struct rpc_param spec[] = {
        {"task_id", RPC_T_STR, true},
        {"node", RPC_T_STR | RPC_T_NIL, false},
    };
    const msgpack_object *p[2];
    char id[TASKS_ID_BUF], node[TASKS_ID_BUF];
    struct task *t = NULL;
    double now = ev_now(c->srv->loop);

    if (bind_task(c, m, spec, 2, p, id, node) < 0)
        return;
    t = task_get(c->srv->tasks, id);
    double begun = t && t->node ? t->node_begun_at : now;
    int rc = task_node_end(c->srv->tasks, id, p[1] ? node : NULL, now, &t);
    if (rc < 0) {
        reply_task_error(c, m->msgid, rc, id, t);
        return;
    }
    tasks_rearm(c->srv);
    rpc_pack_result_begin(&c->pk, m->msgid);
    msgpack_pack_map(&c->pk, 1);
    rpc_pack_kv_double(&c->pk, "elapsed_s", now - begun);
    conn_response_done(c, PGW_OK);
}

void tasks_finish(struct conn *c, const struct rpc_msg *m)
{
    static const struct rpc_param spec[] = {
        {"task_id", RPC_T_STR, true},
        {"ok", RPC_T_BOOL, true},
        {"reason", RPC_T_STR | RPC_T_NIL, false},
    };
    const msgpack_object *p[3];
    char id[TASKS_ID_BUF], reason[TASK_REASON_MAX + 1];
    struct task *t = NULL;

    if (bind_task(c, m, spec, 3, p, id, NULL) < 0)
        return;
    copy_reason(p[2], reason, sizeof(reason));
    int rc = task_finish(c->srv->tasks, id, p[1]->via.boolean, reason, ev_now(c->srv->loop), &t);
    if (rc < 0) {
        reply_task_error(c, m->msgid, rc, id, t);
        return;
    }
    tasks_rearm(c->srv);
    reply_task(c, m->msgid, t);
}

void tasks_get(struct conn *c, const struct rpc_msg *m)
{
    static const struct rpc_param spec[] = {{"task_id", RPC_T_STR, true}};
    const msgpack_object *p[1];
    char id[TASKS_ID_BUF];

    if (bind_task(c, m, spec, 1, p, id, NULL) < 0)
        return;
    struct task *t = task_get(c->srv->tasks, id);
    if (!t) {
        reply_task_error(c, m->msgid, TASK_E_NOT_FOUND, id, NULL);
        return;
    }
    reply_task(c, m->msgid, t);
}

struct list_ctx {
    struct server *srv;
    msgpack_packer *pk;
    size_t n;
    bool counting;
};

static int list_one(struct task *t, void *ud)
{
    struct list_ctx *lc = ud;
    if (lc->counting)
        lc->n++;
    else
        pack_task(lc->pk, lc->srv, t);
    return 0;
}

void tasks_list(struct conn *c, const struct rpc_msg *m)
{
    static const struct rpc_param spec[] = {{"state", RPC_T_STR | RPC_T_NIL, false}};
    const msgpack_object *p[1];
    char why[200];
    unsigned filter = TASK_F_ALL;

    if (rpc_bind(m->params, spec, 1, p, why, sizeof(why)) < 0) {
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST, why);
        return;
    }
    if (p[0]) {
        if (rpc_str_is(p[0], "running"))
            filter = TASK_F_RUNNING;
        else if (rpc_str_is(p[0], "succeeded"))
            filter = TASK_F_SUCCEEDED;
        else if (rpc_str_is(p[0], "failed"))
            filter = TASK_F_FAILED;
        else {
            conn_reply_error(c, m->msgid, PGW_BAD_REQUEST,
                             "parameter 'state': expected running, succeeded or failed");
            return;
        }
    }
    struct list_ctx lc = {c->srv, &c->pk, 0, true};
    task_foreach(c->srv->tasks, filter, list_one, &lc);
    rpc_pack_result_begin(&c->pk, m->msgid);
    msgpack_pack_map(&c->pk, 1);
    rpc_pack_str(&c->pk, "tasks");
    msgpack_pack_array(&c->pk, (uint32_t)lc.n);
    lc.counting = false;
    task_foreach(c->srv->tasks, filter, list_one, &lc);
    conn_response_done(c, PGW_OK);
}

struct task *tasks_admit_call(struct conn *c, uint32_t msgid, const char *id)
{
    struct task *t = NULL;
    int rc = task_guard(c->srv->tasks, id, ev_now(c->srv->loop), &t);

    if (rc < 0) {
        reply_task_error(c, msgid, rc, id, t);
        return NULL;
    }
    return t;
}

void tasks_pack_stats(msgpack_packer *pk, struct server *srv)
{
    const struct task_stats *ts = task_reg_stats(srv->tasks);

    rpc_pack_str(pk, "tasks");
    msgpack_pack_map(pk, 12);
#define KV(k, v)                                                                                   \
    do {                                                                                           \
        rpc_pack_str(pk, k);                                                                       \
        msgpack_pack_uint64(pk, (uint64_t)(v));                                                    \
    } while (0)
    KV("held", ts->tasks);
    KV("running", ts->running);
    KV("succeeded", ts->succeeded);
    KV("failed_stopped", ts->failed[TASK_STOPPED]);
    KV("failed_watchdog", ts->failed[TASK_WATCHDOG]);
    KV("failed_error", ts->failed[TASK_ERROR]);
    KV("watchdog_fired", ts->failed_total[TASK_WATCHDOG]);
    KV("watchdog_after_stop", ts->watchdog_after_stop);
    KV("expired", ts->expired + ts->expired_running);
    KV("rejected_full", ts->rejected_full);
    KV("memory_bytes", task_reg_memory_bytes(srv->tasks));
    KV("memory_limit_bytes", task_reg_memory_limit(srv->tasks));
#undef KV
}
