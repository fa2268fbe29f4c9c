/*
 * backend.h — the state backend: one table of operations with two
 * implementations (docs/DESIGN.md §2 and §6; `backend:` in docs/CONFIG.md).
 *
 *   memory (backend_memory.c)  the state is this sidecar's: admission is
 *                              the local governed loop's, the task record is
 *                              the local registry (src/task.h), progress is
 *                              the core's own store. Every answer is
 *                              immediate.
 *   redis  (backend_redis.c)   the state is the fleet's, in Redis: admission
 *                              asks admit.lua for a lease, the task record is
 *                              task.lua's, progress ages come from a cache
 *                              kept exact by pub/sub. Answers come later.
 *
 * The callers (call.c for admission and leases, tasks.c for the task
 * operations, the core for progress) never ask which one they hold: an
 * operation either answers at once (returns 1, the answer in an out
 * parameter, the callback never runs), will answer later (returns 0, the
 * callback runs exactly once from the event loop, never inside the call),
 * or cannot be sent (returns -1, the callback never runs). Operations may
 * be called from inside any callback, the backend's own answers and hooks
 * included (a call releases its lease from its admission's answer).
 *
 * Events the backend learns by itself go up through struct backend_hooks
 * (a task ended elsewhere, the channels are back after a gap, the command
 * connection is up again, a progress age is known), so no implementation
 * calls into tasks.c or the core: the server wires the hooks.
 *
 * Lifetime: the server owns the backend. It is built after the task
 * registry (the memory backend borrows it) and before the core (which takes
 * its progress interface), and freed in reverse: after the core, before the
 * registry, since the answers the Redis drain still delivers at exit bring
 * task copies in line. One event loop, one thread.
 */
#ifndef POLYGW_BACKEND_H
#define POLYGW_BACKEND_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "gov.h"
#include "outcome.h"

struct backend;
struct fig_table;
struct backend_lease; /* an attempt's fleet permit (implementation's) */
struct backend_admit; /* an admission not answered yet */
struct backend_spend; /* a fleet budget reservation not answered yet */
/* An attempt's real token counts (backend_release): < 0 = unknown. */
struct backend_usage {
    double total; /* every token (tpm, daily_tokens) */
    double in;    /* input as the source's itpm counts it (cache reads left out
                   * where its limits say they do not count) */
    double out;   /* output (otpm) */
};

/* A task run's budget the fleet keeps (spend_reserve, spend_settle). */
struct backend_spend_task {
    const char *id; /* the task's ID */
    uint64_t run;   /* the record's run (backend_task.runs) */
    double limit;   /* the run's budget in currency, > 0 */
};
struct task;
struct task_reg;

/* The task error code for "the backend could not answer" (next to the
 * TASK_E_* codes of src/task.h). */
#define BACKEND_E_UNAVAILABLE (-1000)

/* Task operations. WATCHDOG records the verdict of a node watchdog that
 * fired here (the local registry failed the task already). */
enum backend_task_op {
    BACKEND_TASK_START,
    BACKEND_TASK_STOP,
    BACKEND_TASK_GUARD,
    BACKEND_TASK_FINISH,
    BACKEND_TASK_GET,
    BACKEND_TASK_WATCHDOG
};

/* A task as the backend's record describes it, after an operation. */
struct backend_task {
    int rc;             /* TASK_OK, a TASK_E_* code, or BACKEND_E_UNAVAILABLE */
    bool exists;        /* the fields below describe the record */
    const char *state;  /* "running", "succeeded", "failed" */
    const char *kind;   /* failed: "stopped", "watchdog", "error"; else "" */
    const char *reason; /* "" when none */
    const char *node;   /* the current node when the record has one, else NULL */
    const char *owner;  /* the app the record says owns it; NULL or "": none known */
    uint64_t runs;
    double budget; /* the current run's budget in currency, 0 = none (shared records) */
    /* A shared record's run budget as the fleet spent it (`budget` > 0 and
     * the read answered: a get only): charged, and reserved in flight. */
    bool spent_known;
    double spent, reserved;
    double started_at_s; /* Unix seconds */
    double updated_at_s; /* Unix seconds */
    const char *err;     /* BACKEND_E_UNAVAILABLE: why (may be NULL) */
};

/* Admission answered later: rc 1 admitted (`lease` is the caller's until
 * backend_release), 0 refused (`retry_at` in loop time, NAN when no time is
 * known; `why` is the first failing check: breaker, concurrency, rpm, tpm,
 * daily or other), -1 the backend could not answer (`why`). */
typedef void backend_admit_cb(void *ud, int rc, struct backend_lease *lease, double retry_at,
                              const char *why);
/* A fleet budget reservation answered: rc 1 reserved, 0 refused (by
 * `which` — "app", "source" or "task" — in `window`, "daily", "monthly" or
 * "total", which has `left`; `retry_after_s` until it resets, < 0 for a
 * total), -1 the backend could not answer (`which` says why). Strings
 * valid during the call only. */
typedef void backend_spend_cb(void *ud, int rc, const char *which, const char *window, double left,
                              double retry_after_s);
/* A task operation answered later. `bt` and its strings are valid during
 * the call only. */
typedef void backend_task_cb(void *ud, const struct backend_task *bt);
/* A response id looked up later: rc 1 known (`source` the name of the
 * source that produced it, borrowed for the call), 0 unknown or expired,
 * -1 the backend could not answer (`source`: why). */
typedef void backend_respid_cb(void *ud, int rc, const char *source);

/* A response cache request answered. A lookup: rc 1 with the entry's
 * value (data[0..len), borrowed for the call), 0 none while another
 * sidecar holds its lock, 2 none and no lock. A lock: 1 taken (data: the
 * holder's token for cache_unlock, NUL-terminated, at most
 * BACKEND_LOCK_TOKEN_MAX - 1 bytes), 0 held by another. Either: -1 the
 * backend could not answer (data: why, NUL-terminated). */
typedef void backend_cache_cb(void *ud, int rc, const char *data, size_t len);
#define BACKEND_LOCK_TOKEN_MAX 48

/* A shared-tier purge ended: rc 0 with `removed` entries gone from the
 * shared tier, or -1 when the backend could not finish it (`why`,
 * NUL-terminated, borrowed; `removed` those gone before). */
typedef void backend_purge_cb(void *ud, int rc, size_t removed, const char *why);

/* Events reported upward. Each runs from the event loop, never inside a
 * backend operation; any may be NULL; none runs once backend_free has begun
 * (the callbacks of operations in flight still do: the drain at exit
 * delivers their answers). */
struct backend_hooks {
    /* Task `id` was stopped, failed by a watchdog or finished on some
     * sidecar: bring a copy held here in line (a read that may import it). */
    void (*on_task_ended)(void *ud, const char *id);
    /* Task ends may have been missed (the channel was lost, or an update
     * could not be sent): re-read the running tasks held here. */
    void (*on_resync)(void *ud);
    /* The command connection is up again (or a retry is due): send the
     * watchdog verdicts that could not be sent. */
    void (*on_up)(void *ud);
    /* The progress age of `scope` is known (or failed to read): the calls
     * waiting for it look again (gov_progress_known). */
    void (*on_progress_known)(void *ud, const char *scope);
    /* Another sidecar purged the shared cache tier of `capability` and
     * app `app` (NULL: any): drop the same entries from the memory tier.
     * `missed`: purges may have been missed (the channel was lost and is
     * back; both NULL): drop every entry. */
    void (*on_cache_purged)(void *ud, const char *capability, const char *app, bool missed);
    void *ud;
};

struct backend_ops {
    const char *name; /* "memory", "redis" */

    /* Admission of the attempt the governed loop reserved on `source` for
     * app `app` (an index in cfg->apps; >= n_apps: no app limits),
     * estimated at `est_tokens`, `est_out` of them output (the rest input:
     * what itpm and otpm reserve). 1: admitted now (*lease may stay NULL: no
     * fleet permit to release); 0: *pending is the request, `cb` runs
     * later; -1: not sent (not connected): fail closed. A refusal by the
     * app's own limits has a `why` starting with "app_" (app_concurrency,
     * app_rpm, app_itpm, …; app_cap_… for its limits on the source's
     * capability). */
    int (*admit)(struct backend *be, size_t source, size_t app, double est_tokens, double est_out,
                 struct backend_lease **lease, backend_admit_cb *cb, void *ud,
                 struct backend_admit **pending);
    /* The caller is gone before the answer: `cb` will not run, and a lease
     * granted meanwhile is released at once. */
    void (*admit_detach)(struct backend *be, struct backend_admit *a);
    /* Ends the lease's attempt (takes `lease`) with the breaker verdict of
     * its outcome `o` (NULL: none — cancelled or never ran) and the real
     * token usage: all of it, then input as the source's itpm counts it
     * and output (each < 0: unknown, the estimate stands; `used` NULL:
     * nothing known, borrowed during the call). Failures are
     * counted, never reported: a lease not released expires by its TTL. */
    void (*release)(struct backend *be, struct backend_lease *lease, const struct outcome *o,
                    const struct backend_usage *used);

    /* Which source produced a Responses API response (docs/CONFIG.md,
     * "responses"), so that its follow-ups reach it. `remember` records
     * `id` -> `source` for `ttl_s` (the memory backend keeps at most `max`
     * of them; failures are counted, never reported). `recall`: 1 answered
     * now (the name copied to source[cap], "" when unknown), 0 `cb` runs
     * later, -1 not sent. Either may be NULL: nothing is remembered. */
    void (*remember_response)(struct backend *be, const char *id, const char *source, double ttl_s,
                              size_t max);
    int (*recall_response)(struct backend *be, const char *id, char *source, size_t cap,
                           backend_respid_cb *cb, void *ud);

    /* The response cache's shared tier (docs/CONFIG.md, "cache"): `key`
     * is the entry's key in hex (NUL-terminated, borrowed). `cache_get`: 0
     * `cb` runs later (never inside the call), -1 not sent (not
     * connected). `cache_put` stores value[0..len) for `ttl_s`; failures
     * are counted, never reported. Both NULL: no shared tier.
     * `cache_lock` takes the entry's lock for `ttl_s` unless another holds
     * it (its holder goes upstream; the others wait for the entry), with a
     * token unique to this holder; `cache_unlock` drops it (fire and
     * forget) only if it still holds `token`: a lock that expired and was
     * taken by another sidecar is that one's.
     * `cache_purge` removes the entries of `capability` and app `app`
     * (NULL: any; cache_shared_pattern) without blocking the shared store,
     * then tells every sidecar (hooks.on_cache_purged, not this one's):
     * 0 `cb` runs later, exactly once (there is no detach: a caller gone
     * meanwhile only frees its `ud` there), -1 not started (not
     * connected, out of memory). */
    int (*cache_get)(struct backend *be, const char *key, backend_cache_cb *cb, void *ud);
    void (*cache_put)(struct backend *be, const char *key, const char *value, size_t len,
                      double ttl_s);
    int (*cache_lock)(struct backend *be, const char *key, double ttl_s, backend_cache_cb *cb,
                      void *ud);
    void (*cache_unlock)(struct backend *be, const char *key, const char *token);
    int (*cache_purge)(struct backend *be, const char *capability, const char *app,
                       backend_purge_cb *cb, void *ud);

    /* Task operation `op` on task `id` (borrowed, 1..TASK_ID_MAX bytes);
     * `reason` (stop, finish, watchdog) and `ok` (finish), on behalf of
     * app `app` (borrowed; NULL: no ownership rule — this sidecar's own
     * reads and verdicts), an admin app when `admin`. A shared record
     * belongs to the app that started it (an admin app too); another app
     * is answered TASK_E_NOT_FOUND, as if it did not exist, unless it is
     * an admin app; a record without an owner (written before owners were
     * kept) is an admin's (the memory backend leaves the rule to the
     * caller, which holds every task). 1: answered in *now_bt (valid until
     * the next registry change); 0: `cb` runs later; -1: not sent.
     * `budget` (start): the new run's budget in currency, 0 = none; a
     * shared record keeps it for the fleet (backend_task.budget). */
    int (*task)(struct backend *be, enum backend_task_op op, const char *id, const char *reason,
                bool ok, const char *app, bool admin, double budget, struct backend_task *now_bt,
                backend_task_cb *cb, void *ud);
    /* A task update failed while the backend may be up: hooks.on_up (and,
     * with `resync`, hooks.on_resync) in a while (backing off while it
     * keeps failing), and at the latest when the connection comes back. */
    void (*retry_later)(struct backend *be, bool resync);
    /* backend_free has begun: start no new work. */
    bool (*is_closing)(const struct backend *be);
    /* Can it answer now (readiness: READY=1, /readyz, polygw_backend_up)?
     * The memory backend always can; the Redis one while its command
     * connection is up. */
    bool (*is_up)(const struct backend *be);
    /* Why it cannot (is_up false): the short reason /readyz gives ("redis
     * unreachable"), and in *detail the backend's own last error, which
     * says what to fix ("" when none; never a secret). Both borrowed until
     * the backend's next event. */
    const char *(*down_reason)(const struct backend *be, const char **detail);

    /* The admission state is the fleet's, shared through the backend: the
     * local breakers and rate buckets are not the ones that decide, and
     * what only they count means nothing (metrics leave it out). */
    bool shared;
    /* Source `source`'s breaker as the backend last saw it ("closed",
     * "open", "half_open"), or NULL: the local breaker decides. */
    const char *(*breaker_state)(const struct backend *be, size_t source);
    /* A reload swapped the configuration: the backend borrows `cfg` from
     * now on. Only for a configuration whose backend section and sources
     * (names, order, fleet-enforced settings) are those the backend was
     * made with (reload.h refuses any other). */
    void (*rebind)(struct backend *be, const struct config *cfg);

    /* The budget in currency (docs/CONFIG.md §12a) of app `i` (`of_app`)
     * or source `i` of the configuration in force, or NULL when it has
     * none. The memory backend keeps them in this process: the caller
     * reserves and settles on the state returned (src/budget.h), borrowed
     * until the next rebind, which keeps each budget's spending by name.
     * NULL op: no budgets (the Redis backend keeps none yet; the loader
     * refuses budgets with it). */
    struct budget *(*budget)(struct backend *be, bool of_app, size_t i);

    /* What `stats`, /metrics and the status page show of the same budget:
     * the memory backend's own state; the Redis backend's last reading of
     * the fleet's (refreshed every BACKEND_BUDGET_PEEK_S while up), which
     * nobody reserves on. NULL: no such budget, or none read yet. */
    struct budget *(*budget_view)(struct backend *be, bool of_app, size_t i);

    /* Budgets kept by the fleet (NULL ops: none; the memory backend's are
     * `budget`'s): spend_reserve reserves `amount` (>= 0) on the budgets of
     * app `app` and of source `source` (indexes in the configuration;
     * SIZE_MAX: not that one) and of a task's run (`task`, NULL: none;
     * borrowed during the call), all or none, in one atomic script: 0 pending
     * (`cb` runs later, exactly once, unless detached), -1 not sent.
     * spend_detach: the caller is gone; a reservation granted meanwhile is
     * given back. spend_settle replaces a reservation of `reserved` by the
     * real cost `actual` (NAN: given back); failures are counted only. */
    int (*spend_reserve)(struct backend *be, size_t app, size_t source,
                         const struct backend_spend_task *task, double amount, backend_spend_cb *cb,
                         void *ud, struct backend_spend **pending);
    void (*spend_detach)(struct backend *be, struct backend_spend *s);
    void (*spend_settle)(struct backend *be, size_t app, size_t source,
                         const struct backend_spend_task *task, double reserved, double actual);

    /* The progress interface for gov_init (NULL: the core's own store). */
    const struct gov_backend *(*progress)(struct backend *be);

    /* Its figures (codec/figures.h, of the backend itself): the pairs it
     * adds to the top-level map of `stats` ("backend", and the
     * implementation's own section) and, in /metrics, its own families
     * after polygw_backend_up (polygw_redis_*, polygw_fleet_*;
     * docs/METRICS.md). */
    const struct fig_table *figures;

    /* Lets the writes in flight out (bounded), then frees everything;
     * pending admissions and task operations are failed or dropped. */
    void (*free)(struct backend *be);
};

/* Every implementation's instance begins with this. */
struct backend {
    const struct backend_ops *ops;
    struct backend_hooks hooks;
};

/* The backend `cfg` asks for (cfg->backend): the memory one over the task
 * registry `tasks` (borrowed; outlives the backend), or the Redis one for
 * `cfg` (borrowed, outlives it), which starts connecting in the background
 * and reports through `hooks` (copied). `loop` gives the clock. Returns
 * NULL with `err` on a bad address or out of memory. */
struct backend *backend_new(struct ev_loop *loop, const struct config *cfg, struct task_reg *tasks,
                            const struct backend_hooks *hooks, char *err, size_t errlen);

/* What `polygw --check` says of the backend `cfg` asks for, without
 * contacting it: "memory backend", "redis backend at HOST:PORT, not
 * contacted", ... Never a password. */
void backend_describe(const struct config *cfg, char *buf, size_t len);

/* The syntax of the backend section's addresses, for the loader: the
 * process owner hands it over with config_set_backend_syntax before
 * loading a configuration. */
const struct config_backend_syntax *backend_config_syntax(void);

/* The implementations' constructors, behind backend_new (the memory one
 * sets no hooks: it has no events of its own). */
struct backend *backend_memory_new(struct ev_loop *loop, struct task_reg *tasks);
struct backend *backend_redis_new(struct ev_loop *loop, const struct config *cfg,
                                  const struct backend_hooks *hooks, char *err, size_t errlen);
void backend_redis_describe(const struct config *cfg, char *buf, size_t len);

/* `t` described as a record (the memory backend's view; the tasks layer
 * packs its own copies with it): wall-clock times from the loop's `loop`.
 * Strings borrow from `t`. */
void backend_task_describe(struct backend_task *bt, const struct task *t, struct ev_loop *loop);

/* release.lua's breaker verdict of an attempt's outcome `o` (NULL: none):
 * "success", "failure" for a transient failure, "neutral" for a 429, a
 * rejection or a cancel, which the breaker does not count (src/breaker.h). */
const char *backend_verdict_name(const struct outcome *o);

/* Dispatch helpers: the caller's view of the table. */
static inline int backend_admit(struct backend *be, size_t source, size_t app, double est_tokens,
                                double est_out, struct backend_lease **lease, backend_admit_cb *cb,
                                void *ud, struct backend_admit **pending)
{
    return be->ops->admit(be, source, app, est_tokens, est_out, lease, cb, ud, pending);
}

static inline void backend_admit_detach(struct backend *be, struct backend_admit *a)
{
    be->ops->admit_detach(be, a);
}

static inline void backend_release(struct backend *be, struct backend_lease *lease,
                                   const struct outcome *o, const struct backend_usage *used)
{
    be->ops->release(be, lease, o, used);
}

static inline int backend_task(struct backend *be, enum backend_task_op op, const char *id,
                               const char *reason, bool ok, const char *app, bool admin,
                               double budget, struct backend_task *now_bt, backend_task_cb *cb,
                               void *ud)
{
    return be->ops->task(be, op, id, reason, ok, app, admin, budget, now_bt, cb, ud);
}

static inline void backend_remember_response(struct backend *be, const char *id, const char *source,
                                             double ttl_s, size_t max)
{
    if (be->ops->remember_response)
        be->ops->remember_response(be, id, source, ttl_s, max);
}

static inline int backend_recall_response(struct backend *be, const char *id, char *source,
                                          size_t cap, backend_respid_cb *cb, void *ud)
{
    if (!be->ops->recall_response) {
        source[0] = '\0';
        return 1;
    }
    return be->ops->recall_response(be, id, source, cap, cb, ud);
}

static inline bool backend_has_cache(const struct backend *be)
{
    return be->ops->cache_get && be->ops->cache_put;
}

static inline int backend_cache_get(struct backend *be, const char *key, backend_cache_cb *cb,
                                    void *ud)
{
    return be->ops->cache_get ? be->ops->cache_get(be, key, cb, ud) : -1;
}

static inline void backend_cache_put(struct backend *be, const char *key, const char *value,
                                     size_t len, double ttl_s)
{
    if (be->ops->cache_put)
        be->ops->cache_put(be, key, value, len, ttl_s);
}

static inline int backend_cache_lock(struct backend *be, const char *key, double ttl_s,
                                     backend_cache_cb *cb, void *ud)
{
    return be->ops->cache_lock ? be->ops->cache_lock(be, key, ttl_s, cb, ud) : -1;
}

static inline void backend_cache_unlock(struct backend *be, const char *key, const char *token)
{
    if (be->ops->cache_unlock)
        be->ops->cache_unlock(be, key, token);
}

static inline int backend_cache_purge(struct backend *be, const char *capability, const char *app,
                                      backend_purge_cb *cb, void *ud)
{
    return be->ops->cache_purge ? be->ops->cache_purge(be, capability, app, cb, ud) : -1;
}

static inline bool backend_is_up(const struct backend *be)
{
    return be->ops->is_up(be);
}

static inline void backend_rebind(struct backend *be, const struct config *cfg)
{
    be->ops->rebind(be, cfg);
}

static inline struct budget *backend_budget(struct backend *be, bool of_app, size_t i)
{
    return be->ops->budget ? be->ops->budget(be, of_app, i) : NULL;
}

/* How often the Redis backend reads the fleet's budgets for display. */
#define BACKEND_BUDGET_PEEK_S 0.5

static inline struct budget *backend_budget_view(struct backend *be, bool of_app, size_t i)
{
    return be->ops->budget_view ? be->ops->budget_view(be, of_app, i) : NULL;
}

static inline void backend_free(struct backend *be)
{
    if (be)
        be->ops->free(be);
}

#endif /* POLYGW_BACKEND_H */
