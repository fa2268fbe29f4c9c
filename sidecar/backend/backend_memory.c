/*
 * backend_memory.c — the memory backend (see backend.h): this sidecar is
 * the whole fleet. Admission is the local governed loop's (the step that
 * reserved the attempt already decided), there are no leases, progress is
 * the core's own store, and the task record is the local registry itself,
 * so every task operation applies to it and answers at once. Budgets in
 * currency are this process's too: one per app and per source that has
 * one, made at the first rebind and carried across reloads by name.
 */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/figures.h"
#include "respids.h"
#include "task.h"

/* A budget of the configuration in force, by the name it is kept under. */
struct mem_budget {
    char name[CONFIG_NAME_MAX];
    bool set;
    struct budget b;
};

struct backend_memory {
    struct backend be; /* first: the table's view */
    struct ev_loop *loop;
    struct task_reg *tasks; /* borrowed */
    struct respids *respids;
    struct mem_budget *apps; /* owned, n_apps; parallel to cfg->apps */
    struct mem_budget *srcs; /* owned, n_srcs; parallel to cfg->sources */
    size_t n_apps, n_srcs;
};

static void mem_remember_response(struct backend *be, const char *id, const char *source,
                                  double ttl_s, size_t max)
{
    struct backend_memory *m = (struct backend_memory *)be;

    respids_put(m->respids, id, source, ttl_s, max, ev_now(m->loop));
}

static int mem_recall_response(struct backend *be, const char *id, char *source, size_t cap,
                               backend_respid_cb *cb, void *ud)
{
    struct backend_memory *m = (struct backend_memory *)be;
    const char *s = respids_get(m->respids, id, ev_now(m->loop));
    (void)cb;
    (void)ud;

    snprintf(source, cap, "%s", s ? s : "");
    return 1;
}

static int mem_admit(struct backend *be, size_t source, size_t app, double est_tokens,
                     double est_out, struct backend_lease **lease, backend_admit_cb *cb, void *ud,
                     struct backend_admit **pending)
{
    (void)be;
    (void)source;
    (void)app;
    (void)est_tokens;
    (void)est_out;
    (void)cb;
    (void)ud;
    *lease = NULL;
    *pending = NULL;
    return 1;
}

static void mem_admit_detach(struct backend *be, struct backend_admit *a)
{
    (void)be;
    (void)a;
}

static void mem_release(struct backend *be, struct backend_lease *lease, const struct outcome *o,
                        const struct backend_usage *used)
{
    (void)be;
    (void)lease;
    (void)o;
    (void)used;
}

/* The code an operation needing a RUNNING task gets from `t`'s state. */
static int state_code(const struct task *t)
{
    if (!t)
        return TASK_E_NOT_FOUND;
    if (t->state == TASK_RUNNING)
        return TASK_OK;
    if (t->state == TASK_FAILED && t->reason_kind == TASK_STOPPED)
        return TASK_E_STOPPED;
    if (t->state == TASK_FAILED && t->reason_kind == TASK_WATCHDOG)
        return TASK_E_WATCHDOG;
    return TASK_E_FINISHED;
}

static int mem_task(struct backend *be, enum backend_task_op op, const char *id, const char *reason,
                    bool ok, const char *app, bool admin, double budget, struct backend_task *bt,
                    backend_task_cb *cb, void *ud)
{
    (void)budget; /* the caller keeps the run's budget with the task it holds */
    struct backend_memory *m = (struct backend_memory *)be;
    double now = ev_now(m->loop);
    struct task *t = task_get(m->tasks, id);
    int rc = TASK_OK;
    (void)app; /* the registry is the caller's: it applies ownership itself */
    (void)admin;
    (void)cb;
    (void)ud;

    switch (op) {
    case BACKEND_TASK_START:
        /* Stopped and watchdog-failed tasks stay refused: a stop must not
         * be undone by a worker that did not notice it. */
        rc = state_code(t);
        if (rc != TASK_E_STOPPED && rc != TASK_E_WATCHDOG)
            rc = task_start(m->tasks, id, now, &t);
        break;
    case BACKEND_TASK_STOP:
        rc = task_stop(m->tasks, id, reason, now, &t);
        break;
    case BACKEND_TASK_GUARD: /* the caller records the activity on its copy: this one */
        rc = state_code(t);
        break;
    case BACKEND_TASK_FINISH:
        rc = task_finish(m->tasks, id, ok, reason, now, &t);
        break;
    case BACKEND_TASK_GET:
        rc = state_code(t) == TASK_E_NOT_FOUND ? TASK_E_NOT_FOUND : TASK_OK;
        break;
    case BACKEND_TASK_WATCHDOG: /* the registry failed it already */
        break;
    }
    if (t)
        backend_task_describe(bt, t, m->loop);
    else
        *bt = (struct backend_task){ .exists = false };
    bt->rc = rc;
    return 1;
}

static void mem_retry_later(struct backend *be, bool resync)
{
    (void)be;
    (void)resync;
}

static bool mem_is_closing(const struct backend *be)
{
    (void)be;
    return false;
}

static const struct gov_backend *mem_progress(struct backend *be)
{
    (void)be;
    return NULL;
}

static struct fig_val mem_kind(const void *obj, size_t row)
{
    (void)obj;
    (void)row;
    return (struct fig_val){ .s = "memory" };
}

static struct fig_val mem_state(const void *obj, size_t row)
{
    (void)obj;
    (void)row;
    return (struct fig_val){ .s = "up" }; /* always */
}

static const struct figure backend_figure_list[] = {
    { .key = "kind", .kind = FIG_STR, .get = mem_kind },
    { .key = "state", .kind = FIG_STR, .get = mem_state },
};
static const struct fig_table backend_figures = FIG_TABLE(backend_figure_list);

/* `backend`; no families of its own. */
static const struct figure memory_figure_list[] = {
    { .key = "backend", .kind = FIG_MAP, .sub = &backend_figures },
};
static const struct fig_table memory_figures = FIG_TABLE(memory_figure_list);

static void mem_free(struct backend *be)
{
    struct backend_memory *m = (struct backend_memory *)be;
    respids_free(m->respids);
    free(m->apps);
    free(m->srcs);
    free(be);
}

static bool mem_is_up(const struct backend *be)
{
    (void)be;
    return true;
}

static const char *mem_down_reason(const struct backend *be, const char **detail)
{
    (void)be;
    *detail = "";
    return "backend down"; /* never: it is always up */
}

static const char *mem_breaker_state(const struct backend *be, size_t source)
{
    (void)be;
    (void)source;
    return NULL; /* the local breaker decides */
}

/* The budgets of `n` names (`name(i)`, `limits(i)`) in a new array, each
 * keeping the spending of the budget it had under that name in `old`.
 * NULL when out of memory. */
static struct mem_budget *mem_budgets(const struct config *cfg, bool apps, size_t n,
                                      const struct mem_budget *old, size_t n_old)
{
    struct mem_budget *v = calloc(n ? n : 1, sizeof(*v));

    if (!v)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        const char *name = apps ? cfg->apps[i].name : cfg->sources[i].name;
        const struct budget_limits *p = apps ? &cfg->apps[i].budget : &cfg->sources[i].budget;
        snprintf(v[i].name, sizeof(v[i].name), "%s", name);
        v[i].set = budget_is_set(p);
        budget_init(&v[i].b, p);
        for (size_t j = 0; j < n_old; j++)
            if (strcmp(old[j].name, name) == 0) {
                v[i].b = old[j].b;
                budget_set_limits(&v[i].b, p);
                break;
            }
    }
    return v;
}

/* Takes the new configuration's budgets. Out of memory, the old arrays
 * stay: every index past them then has no budget. */
static void mem_rebind(struct backend *be, const struct config *cfg)
{
    struct backend_memory *m = (struct backend_memory *)be;
    struct mem_budget *apps = mem_budgets(cfg, true, cfg->n_apps, m->apps, m->n_apps);
    struct mem_budget *srcs = mem_budgets(cfg, false, cfg->n_sources, m->srcs, m->n_srcs);

    if (!apps || !srcs) {
        free(apps);
        free(srcs);
        return;
    }
    free(m->apps);
    free(m->srcs);
    m->apps = apps;
    m->srcs = srcs;
    m->n_apps = cfg->n_apps;
    m->n_srcs = cfg->n_sources;
}

static struct budget *mem_budget(struct backend *be, bool of_app, size_t i)
{
    struct backend_memory *m = (struct backend_memory *)be;
    struct mem_budget *v = of_app ? m->apps : m->srcs;

    if (i >= (of_app ? m->n_apps : m->n_srcs) || !v[i].set)
        return NULL;
    return &v[i].b;
}

static const struct backend_ops memory_ops = {
    .name = "memory",
    .admit = mem_admit,
    .admit_detach = mem_admit_detach,
    .release = mem_release,
    .task = mem_task,
    .remember_response = mem_remember_response,
    .recall_response = mem_recall_response,
    .retry_later = mem_retry_later,
    .is_closing = mem_is_closing,
    .is_up = mem_is_up,
    .down_reason = mem_down_reason,
    .shared = false,
    .breaker_state = mem_breaker_state,
    .rebind = mem_rebind,
    .budget = mem_budget,
    .budget_view = mem_budget,
    .progress = mem_progress,
    .figures = &memory_figures,
    .free = mem_free,
};

struct backend *backend_memory_new(struct ev_loop *loop, struct task_reg *tasks)
{
    struct backend_memory *m = calloc(1, sizeof(*m));

    if (!m)
        return NULL;
    m->be.ops = &memory_ops;
    m->loop = loop;
    m->tasks = tasks;
    if (!(m->respids = respids_new())) {
        free(m);
        return NULL;
    }
    return &m->be;
}
