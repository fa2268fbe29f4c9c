/*
 * taskrpc.c — the task methods over msgpack-RPC (taskrpc.h).
 */
#include "taskrpc.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>

#include "call/tasks.h"
#include "callrpc.h"

static struct conn *outlet_conn(struct reply_outlet *o)
{
    return (struct conn *)((char *)o - offsetof(struct conn, tasks));
}

static struct writer *out_result_begin(struct reply_outlet *o, uint32_t id)
{
    struct conn *c = outlet_conn(o);

    rpc_pack_result_begin(&c->pk, id);
    writer_init_msgpack(&o->w, &c->pk);
    return &o->w;
}

static void out_result_end(struct reply_outlet *o, uint32_t id)
{
    (void)id;
    conn_response_done(outlet_conn(o), PGW_OK);
}

static void out_error(struct reply_outlet *o, uint32_t id, const struct reply_error *e)
{
    conn_reply_error_of(outlet_conn(o), id, e);
}

static void out_waiting(struct reply_outlet *o, int delta)
{
    outlet_conn(o)->in_flight += (uint32_t)delta;
}

static void out_flush(struct reply_outlet *o)
{
    conn_flush(outlet_conn(o));
}

static const struct reply_outlet_ops rpc_outlet_ops = {
    .result_begin = out_result_begin,
    .result_end = out_result_end,
    .error = out_error,
    .waiting = out_waiting,
    .flush = out_flush,
};

void taskrpc_outlet_init(struct reply_outlet *o, struct server *srv)
{
    memset(o, 0, sizeof(*o));
    o->ops = &rpc_outlet_ops;
    o->srv = srv;
}

/* Binds the params of `m` after `spec` (task_id first, node second when
 * `node`) into `r`; answers bad_request and returns -1 when refused. */
static int bind_task(struct conn *c, const struct rpc_msg *m, const struct rpc_param *spec,
                     size_t n, const msgpack_object **p, bool node, struct task_req *r)
{
    char why[200];

    memset(r, 0, sizeof(*r));
    r->msgid = m->msgid;
    r->app = conn_app(c);
    if (rpc_bind(m->params, spec, n, p, why, sizeof(why)) < 0) {
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST, why);
        return -1;
    }
    if (rpc_ident_copy("parameter 'task_id'", p[0], r->id, sizeof(r->id), why, sizeof(why)) < 0 ||
        (node && p[1] && p[1]->type == MSGPACK_OBJECT_STR &&
         rpc_ident_copy("parameter 'node'", p[1], r->node, sizeof(r->node), why, sizeof(why)) <
             0)) {
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST, why);
        return -1;
    }
    r->has_node = node && p[1];
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

static const struct rpc_param id_only[] = { { "task_id", RPC_T_STR, true } };

void taskrpc_start(struct conn *c, const struct rpc_msg *m)
{
    static const struct rpc_param spec[] = {
        { "task_id", RPC_T_STR, true },
        { "budget", RPC_T_NUMBER | RPC_T_NIL, false },
        { "trace", RPC_T_MAP | RPC_T_NIL, false },
    };
    const msgpack_object *p[3];
    struct task_req r;
    char why[120];

    if (bind_task(c, m, spec, 3, p, false, &r) < 0)
        return;
    if (p[1] && (!rpc_as_double(p[1], &r.budget) || !(r.budget > 0) || !isfinite(r.budget))) {
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST,
                         "parameter 'budget': expected a positive amount of the currency");
        return;
    }
    if (p[2] && p[2]->type == MSGPACK_OBJECT_MAP &&
        callrpc_trace_param(p[2], r.traceparent, r.tracestate, why, sizeof(why)) < 0) {
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST, why);
        return;
    }
    tasks_start(&c->tasks, &r);
}

void taskrpc_stop(struct conn *c, const struct rpc_msg *m)
{
    static const struct rpc_param spec[] = {
        { "task_id", RPC_T_STR, true },
        { "reason", RPC_T_STR | RPC_T_NIL, false },
    };
    const msgpack_object *p[2];
    struct task_req r;

    if (bind_task(c, m, spec, 2, p, false, &r) < 0)
        return;
    copy_reason(p[1], r.reason, sizeof(r.reason));
    tasks_stop(&c->tasks, &r);
}

void taskrpc_guard(struct conn *c, const struct rpc_msg *m)
{
    const msgpack_object *p[1];
    struct task_req r;

    if (bind_task(c, m, id_only, 1, p, false, &r) == 0)
        tasks_guard(&c->tasks, &r);
}

void taskrpc_node_begin(struct conn *c, const struct rpc_msg *m)
{
    static const struct rpc_param spec[] = {
        { "task_id", RPC_T_STR, true },
        { "node", RPC_T_STR, true },
        { "timeout_s", RPC_T_NUMBER | RPC_T_NIL, false },
    };
    const msgpack_object *p[3];
    struct task_req r;

    if (bind_task(c, m, spec, 3, p, true, &r) < 0)
        return;
    if (p[2] &&
        (!rpc_as_double(p[2], &r.timeout_s) || !(r.timeout_s > 0) || !isfinite(r.timeout_s))) {
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST,
                         "parameter 'timeout_s': expected a positive number of seconds");
        return;
    }
    tasks_node_begin(&c->tasks, &r);
}

void taskrpc_node_end(struct conn *c, const struct rpc_msg *m)
{
    static const struct rpc_param spec[] = {
        { "task_id", RPC_T_STR, true },
        { "node", RPC_T_STR | RPC_T_NIL, false },
    };
    const msgpack_object *p[2];
    struct task_req r;

    if (bind_task(c, m, spec, 2, p, true, &r) == 0)
        tasks_node_end(&c->tasks, &r);
}

void taskrpc_finish(struct conn *c, const struct rpc_msg *m)
{
    static const struct rpc_param spec[] = {
        { "task_id", RPC_T_STR, true },
        { "ok", RPC_T_BOOL, true },
        { "reason", RPC_T_STR | RPC_T_NIL, false },
    };
    const msgpack_object *p[3];
    struct task_req r;

    if (bind_task(c, m, spec, 3, p, false, &r) < 0)
        return;
    r.ok = p[1]->via.boolean;
    copy_reason(p[2], r.reason, sizeof(r.reason));
    tasks_finish(&c->tasks, &r);
}

void taskrpc_get(struct conn *c, const struct rpc_msg *m)
{
    const msgpack_object *p[1];
    struct task_req r;

    if (bind_task(c, m, id_only, 1, p, false, &r) == 0)
        tasks_get(&c->tasks, &r);
}

void taskrpc_list(struct conn *c, const struct rpc_msg *m)
{
    static const struct rpc_param spec[] = { { "state", RPC_T_STR | RPC_T_NIL, false } };
    const msgpack_object *p[1];
    char why[200];
    struct task_req r;

    memset(&r, 0, sizeof(r));
    r.msgid = m->msgid;
    r.app = conn_app(c);
    r.filter = TASK_F_ALL;
    if (rpc_bind(m->params, spec, 1, p, why, sizeof(why)) < 0) {
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST, why);
        return;
    }
    if (p[0]) {
        if (rpc_str_is(p[0], "running"))
            r.filter = TASK_F_RUNNING;
        else if (rpc_str_is(p[0], "succeeded"))
            r.filter = TASK_F_SUCCEEDED;
        else if (rpc_str_is(p[0], "failed"))
            r.filter = TASK_F_FAILED;
        else {
            conn_reply_error(c, m->msgid, PGW_BAD_REQUEST,
                             "parameter 'state': expected running, succeeded or failed");
            return;
        }
    }
    tasks_list(&c->tasks, &r);
}
