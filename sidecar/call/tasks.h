/*
 * tasks.h — the task methods (docs/DESIGN.md §3.5, PROTOCOL.md 4.4) on top
 * of the backend's task record (backend.h) and the local task registry
 * (src/task.h), and the watchdog timer.
 *
 * The record (the registry itself with the memory backend, task.lua's with
 * Redis) decides; the local registry is the copy this sidecar works with,
 * and the sidecar adds what only it can do: a stop or a watchdog expiry
 * ends the task's in-flight calls at once (they answer task_stopped /
 * watchdog_timeout and their upstream connections close), and one ev_timer
 * follows task_next_deadline().
 *
 * Needs srv->tasks (tasks_init) before srv->backend is created, and
 * srv->backend before the first request; the backend's hooks call the
 * tasks_on_* functions below (the server wires them).
 */
#ifndef POLYGW_TASKS_H
#define POLYGW_TASKS_H

#include "codec/reply.h"
#include "core/server.h"
#include "task.h"

struct task;
struct backend_task;

/* What a task's end does to the calls running under it (t->ud): the call
 * engine's call_fail_task and call_forget_task (call.h), registered by the
 * process owner. The calls use the tasks, never the reverse: the tasks
 * reach them only through these. */
struct tasks_calls {
    /* Task `t` was stopped or failed by its watchdog: its calls are answered
     * `code` and `message` and end at once. */
    void (*fail)(struct task *t, enum pgw_code code, const char *message);
    /* Task `t` is about to be freed: its calls forget it. */
    void (*forget)(struct task *t);
};

/* `calls` is kept (static storage), never NULL. */
int tasks_init(struct server *srv, const struct tasks_calls *calls, char *err, size_t errlen);
void tasks_fini(struct server *srv);

#define TASKS_ID_BUF (TASK_ID_MAX + 1)

/* A task request as a front parsed it (the msgpack-RPC front from its
 * params, the HTTP front from its path and JSON body). */
struct task_req {
    uint32_t msgid;
    const struct config_app *app; /* who asks (borrowed from the server's config) */
    char id[TASKS_ID_BUF];
    char node[TASKS_ID_BUF];          /* node.begin, node.end */
    bool has_node;                    /* node.end: a node was named */
    double timeout_s;                 /* node.begin: > 0, or 0 = the configured one */
    char reason[TASK_REASON_MAX + 1]; /* stop, finish: "" = none */
    bool ok;                          /* finish */
    unsigned filter;                  /* list: the states listed (TASK_F_*, task.h) */
    double budget;                    /* start: the run's budget in currency (> 0), 0 = none */
    /* start: the caller's W3C trace context ("" = none; a malformed one
     * is ignored: a new trace) */
    char traceparent[64], tracestate[257];
};

/* The reason of a task stopped because its budget ran out (call.c stops
 * it through tasks_stop_budget, as task.stop would). */
#define TASKS_BUDGET_REASON "budget"

/* Stops running task `id` on the sidecar's own behalf with reason
 * TASKS_BUDGET_REASON, through the path task.stop takes: the record says
 * stopped, and every call of the task in flight ends task_stopped. */
void tasks_stop_budget(struct server *srv, const char *id);

/* The task methods. Each answers request r->msgid through `o` exactly
 * once, now or from the event loop. */
void tasks_start(struct reply_outlet *o, const struct task_req *r);
void tasks_stop(struct reply_outlet *o, const struct task_req *r);
void tasks_guard(struct reply_outlet *o, const struct task_req *r);
void tasks_node_begin(struct reply_outlet *o, const struct task_req *r);
void tasks_node_end(struct reply_outlet *o, const struct task_req *r);
void tasks_finish(struct reply_outlet *o, const struct task_req *r);
void tasks_get(struct reply_outlet *o, const struct task_req *r);
/* task.list: the tasks held here in states r->filter that r->app may see
 * (its own, every app's for an admin app), in creation order; r->id unused. */
void tasks_list(struct reply_outlet *o, const struct task_req *r);

/* A task error as either front renders it: `e` (its message in `msg`). */
struct tasks_error {
    struct reply_error e;
    char msg[TASK_REASON_MAX + TASK_ID_MAX + 96];
};

/* For `call` by `app` (borrowed): checks that task `id` is running and is
 * `app`'s (or `app` is admin). Returns the task, or NULL after making the
 * task's error (task_stopped, watchdog_timeout, bad_request for an unknown
 * one or another app's, answered alike) in `err`. */
struct task *tasks_admit_call(struct server *srv, const char *id, const struct config_app *app,
                              struct tasks_error *err);

/* For a call of `app` (borrowed) naming a task not held running here: asks
 * the record whether it runs and is `app`'s (importing it here when it
 * does). `cb` runs once — possibly
 * before this returns (the memory backend answers at once; a backend that
 * cannot be reached fails at once) — with the local task (bt->rc TASK_OK)
 * or NULL and the record's answer (a TASK_E_* code or
 * BACKEND_E_UNAVAILABLE; `bt` borrowed for the call). */
typedef void tasks_guard_cb(void *ud, struct task *t, const struct backend_task *bt);
void tasks_guard_remote(struct server *srv, const char *id, const struct config_app *app,
                        tasks_guard_cb *cb, void *ud);
/* Makes the error of record `bt` (bt->rc < 0) for task `id` in `te`
 * (borrows `bt`'s text); returns its code. */
enum pgw_code tasks_error_of(struct tasks_error *te, const char *id, const struct backend_task *bt);

/* Backend hooks (backend.h), run from the event loop. Task `id` was
 * stopped, failed by a watchdog or finished on some sidecar: bring the
 * copy held here in line (a stop ends its calls here). */
void tasks_on_task_ended(struct server *srv, const char *id);
/* Task ends may have been missed: re-read the running tasks held here,
 * paced (at most 128 reads in flight). */
void tasks_on_resubscribed(struct server *srv);
/* The backend is up again (or a retry is due): send the watchdog verdicts
 * that could not be sent. */
void tasks_on_backend_up(struct server *srv);
/* For `call`: is task `id` held here and running? (Any other local state
 * may be stale: ask the record.) */
bool tasks_held_running(struct server *srv, const char *id);

/* The task requests of `c` still waiting for the backend are answered
 * with `code` (PGW_OK: not answered — the client is gone); their answers
 * are then dropped. */
void tasks_fail_pending(struct reply_outlet *o, enum pgw_code code, const char *message);

/* Is a task request with `msgid` waiting for the backend on `o`? */
bool tasks_is_pending(const struct reply_outlet *o, uint32_t msgid);

/* The `tasks` section of `stats`, whose `running_tasks` lists at most
 * TASKS_STATS_RUNNING_MAX running tasks `app` (borrowed) may see (its own,
 * every app's for an admin app), in creation order, each with its current node's
 * age against that node's watchdog timeout. */
#define TASKS_STATS_RUNNING_MAX 100
void tasks_write_stats(struct writer *w, struct server *srv, const struct config_app *app);

#endif /* POLYGW_TASKS_H */
