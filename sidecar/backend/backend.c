/*
 * backend.c — what every backend implementation shares (see backend.h):
 * the choice of one from the configuration, a local task described as a
 * record, and the breaker verdict of an attempt's outcome.
 */
#include "backend.h"

#include <stdio.h>

#include "redis_url.h"
#include "task.h"

struct backend *backend_new(struct ev_loop *loop, const struct config *cfg, struct task_reg *tasks,
                            const struct backend_hooks *hooks, char *err, size_t errlen)
{
    if (cfg->backend == BACKEND_REDIS)
        return backend_redis_new(loop, cfg, hooks, err, errlen);
    struct backend *be = backend_memory_new(loop, tasks);
    if (!be)
        snprintf(err, errlen, "out of memory");
    else
        backend_rebind(be, cfg); /* its budgets */
    return be;
}

const struct config_backend_syntax *backend_config_syntax(void)
{
    return &rds_config_syntax; /* only the Redis backend has addresses */
}

void backend_describe(const struct config *cfg, char *buf, size_t len)
{
    if (cfg->backend == BACKEND_REDIS)
        backend_redis_describe(cfg, buf, len);
    else
        snprintf(buf, len, "memory backend");
}

void backend_task_describe(struct backend_task *bt, const struct task *t, struct ev_loop *loop)
{
    /* Loop time -> Unix seconds as this host sees them. */
    double off = ev_time() - ev_now(loop);
    double updated = t->ended_at > 0 ? t->ended_at : t->last_active_at;

    *bt = (struct backend_task){
        .rc = TASK_OK,
        .exists = true,
        .state = task_state_name(t->state),
        .kind = t->state == TASK_FAILED ? task_reason_kind_name(t->reason_kind) : "",
        .reason = task_reason(t),
        .node = t->node,
        .runs = t->runs,
        .started_at_s = t->started_at + off,
        .updated_at_s = updated + off,
    };
}

const char *backend_verdict_name(const struct outcome *o)
{
    if (!o || o->reason == REASON_CANCELLED)
        return "neutral";
    return o->kind == OUTCOME_SUCCESS  ? "success"
        : o->kind == OUTCOME_TRANSIENT ? "failure"
                                       : "neutral";
}
