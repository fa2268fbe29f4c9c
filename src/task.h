/*
 * task.h — the task registry: cooperative stop, node guards and the
 * watchdog (docs/DESIGN.md §3.5, issue 5), the memory implementation of the task
 * half of the backend interface. No I/O and no clock reads: every input
 * carries `now` (seconds on the caller's monotonic clock), and
 * task_next_deadline() says when task_on_timer() must run next, so the
 * sidecar arms ONE timer for the whole registry.
 *
 * A task is a client-side unit of work named by a client-chosen `task_id`.
 * Its lifecycle (the only place it changes is task_set_state() in task.c):
 *
 *                    task_finish(ok)
 *            ┌──────────────────────────────────────────> SUCCEEDED
 *            │       task_stop(reason)                    ┌─────────────────┐
 *   start    │    ┌────────────────────────────────────>  │ FAILED/stopped  │
 *  ───────> RUNNING                                       │ FAILED/watchdog │
 *            │    └─ node deadline passed (on_timer) ──>  │ FAILED/error    │
 *            └─────── task_finish(!ok, reason) ────────>  └─────────────────┘
 *
 *   SUCCEEDED / FAILED ── task_start (a new run, same id) ──> RUNNING
 *   any state ── TTL (on_timer) ──> freed (hooks.on_free first)
 *
 * Decisions (each one a contract the sidecar and the tests rely on):
 *
 *  - task_start on a RUNNING task is refused with TASK_E_RUNNING: two
 *    workers silently sharing one id would share one node deadline and one
 *    stop. On a finished task it starts a new run of the same record ("resume
 *    from the checkpoint"): state RUNNING, reason cleared,
 *    started_at = now, `runs` + 1, any armed node dropped (no watchdog, no
 *    sample). The task pointer (and its `ud`) stays the same.
 *  - An operation that needs a RUNNING task and finds a finished one fails
 *    with the finished state's code and changes nothing: TASK_E_STOPPED
 *    (failed/stopped), TASK_E_WATCHDOG (failed/watchdog), TASK_E_FINISHED
 *    (succeeded, or failed/error). So stopping twice returns TASK_E_STOPPED
 *    and keeps the FIRST reason; stopping a succeeded task returns
 *    TASK_E_FINISHED; `*out` lets the caller report the state and reason.
 *    In general: on any error nothing changes.
 *  - One current node per task. node_begin while a node is current replaces
 *    it (the earlier one counts as abandoned: no duration sample). Nested
 *    scopes are therefore not supported: after begin A, begin B, end B no
 *    node is armed and end A gets TASK_E_NO_NODE.
 *  - Node deadline: explicit `timeout_s` > 0; else, once a node name has at
 *    least TASK_NODE_MIN_SAMPLES (20) samples among its last
 *    TASK_NODE_WINDOW (128) durations, 3 × their p99 (nearest rank:
 *    the ceil(0.99·n)-th smallest), but never below `learned_floor_s`;
 *    else the configured `node_timeout_s`. Samples come only from nodes
 *    that ended normally (task_node_end on a RUNNING task); a node cut by a
 *    stop, the watchdog, finish or replacement would bias the window.
 *  - Watchdog: when a RUNNING task's node deadline passes, on_timer marks it
 *    failed/watchdog with reason "node X exceeded Ys" and calls
 *    hooks.on_watchdog (error level; the sidecar cancels the task's calls
 *    with watchdog_timeout). A task stopped by a user keeps its node armed
 *    (the client cannot end it: its calls were cancelled); when that
 *    deadline passes it is an ordinary exit: counter watchdog_after_stop,
 *    hooks.on_watchdog_after_stop (info level), state unchanged.
 *    task_finish on a running task, and a restart, disarm the node.
 *  - Expiry: a finished task is freed ttl_s after it ended (guards and other
 *    reads do not extend it); a later guard gets TASK_E_NOT_FOUND. A RUNNING
 *    task with no current node is freed after ttl_s without activity
 *    (start, guard, node_begin, node_end: a crashed client must not pin its
 *    tasks forever; counted as expired_running). A RUNNING task inside a
 *    node never idles out: its node deadline bounds it (the watchdog fails
 *    it, then the finished TTL runs).
 *  - Deadlines and expiry take effect only in task_on_timer(): an operation
 *    that arrives between a deadline and the timer sees the state before
 *    it. The sidecar's timer runs within milliseconds, and tests drive
 *    on_timer at exact times.
 *  - Bounded memory: at most `max_tasks` tasks (task_start beyond it fails
 *    with TASK_E_FULL; nothing is evicted early, running tasks never are),
 *    strings bounded (id and node 1..128 bytes, reason truncated to 512
 *    bytes at a UTF-8 boundary), at most `max_node_names` node-name
 *    histories (least recently used forgotten first — a client naming
 *    nodes uniquely must not freeze learning for everyone else). The hash
 *    table and the deadline heap are allocated once, for max_tasks.
 *  - Cost: lookups by id are O(1) (chained hash, load factor <= 1 with
 *    auto-sized buckets); a deadline change is O(log n) in the heap;
 *    a node name's p99 is recomputed (a sort of <= 128 samples) when
 *    node_end adds a sample, so node_begin reads it in O(1).
 *
 * Hooks run synchronously inside task_stop/finish/start/on_timer/reg_free.
 * While one runs, the registry may be read (task_get, task_foreach, the
 * task's fields, task_reg_stats) but not changed: a mutating call returns
 * TASK_E_BUSY. The task a hook receives is valid until the hook returns
 * (on_free: it is freed right after).
 *
 * Times in struct task are on the caller's clock; the sidecar converts them
 * to wall-clock time for clients.
 */
#ifndef POLYGW_TASK_H
#define POLYGW_TASK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "budget.h"

#define TASK_ID_MAX           128 /* bytes, excluding the NUL */
#define TASK_NODE_MAX         128 /* bytes, excluding the NUL */
#define TASK_REASON_MAX       512 /* bytes kept, excluding the NUL */
#define TASK_NODE_WINDOW      128 /* durations remembered per node name */
#define TASK_NODE_MIN_SAMPLES 20  /* before that, node_timeout_s applies */
#define TASK_LEARNED_FACTOR   3.0 /* learned timeout = factor × p99 */

/* Return codes. The sidecar maps them to typed errors (docs/DESIGN.md §3.6). */
enum task_err {
    TASK_OK = 0,
    TASK_E_INVALID = -1,       /* bad id, node name, timeout or config */
    TASK_E_NOT_FOUND = -2,     /* no such task (never started, or expired) */
    TASK_E_RUNNING = -3,       /* task_start: the task is already running */
    TASK_E_STOPPED = -4,       /* the task is failed/stopped (reason in the task) */
    TASK_E_WATCHDOG = -5,      /* the task is failed/watchdog (reason in the task) */
    TASK_E_FINISHED = -6,      /* the task succeeded or is failed/error */
    TASK_E_NO_NODE = -7,       /* task_node_end: no node is current */
    TASK_E_NODE_MISMATCH = -8, /* task_node_end: another node is current */
    TASK_E_FULL = -9,          /* max_tasks reached (maps to overloaded) */
    TASK_E_NOMEM = -10,        /* out of memory (maps to internal) */
    TASK_E_BUSY = -11,         /* a mutating call from inside a hook */
};

/* TASK_NEW only ever appears as the `from` of a task's first transition. */
enum task_state { TASK_NEW = 0, TASK_RUNNING, TASK_SUCCEEDED, TASK_FAILED };

/* Why a FAILED task failed; TASK_REASON_NONE for the other states. */
enum task_reason_kind {
    TASK_REASON_NONE = 0,
    TASK_STOPPED,
    TASK_WATCHDOG,
    TASK_ERROR,
    TASK_REASON_KIND_COUNT
};

/* Where the current node's timeout came from. */
enum task_timeout_src { TASK_TIMEOUT_EXPLICIT = 0, TASK_TIMEOUT_LEARNED, TASK_TIMEOUT_DEFAULT };

/* Filter bits for task_foreach. */
#define TASK_F_RUNNING   (1u << TASK_RUNNING)
#define TASK_F_SUCCEEDED (1u << TASK_SUCCEEDED)
#define TASK_F_FAILED    (1u << TASK_FAILED)
#define TASK_F_ALL       (TASK_F_RUNNING | TASK_F_SUCCEEDED | TASK_F_FAILED)

/*
 * One task. Read-only outside task.c except `ud`. The pointer is stable
 * from task_start until hooks.on_free (expiry or task_reg_free), across
 * restarts.
 */
struct task {
    const char *id; /* points into this allocation */
    enum task_state state;
    enum task_reason_kind reason_kind;
    char *reason;          /* NULL or NUL-terminated, <= TASK_REASON_MAX bytes */
    double started_at;     /* of the current run */
    double ended_at;       /* 0 while running */
    double last_active_at; /* last start/guard/node_begin/node_end */
    /* Current node; node == NULL when none is armed. */
    char *node;
    double node_begun_at;
    double node_deadline; /* absolute; valid when node != NULL */
    double node_timeout_s;
    enum task_timeout_src node_timeout_src;
    /* Per-task counters. */
    uint64_t runs; /* task_start successes for this id */
    uint64_t guards, nodes_begun, nodes_ended;
    void *ud; /* the owner's (the sidecar's call list) */
    /* The current run's budget in currency (budget.h), set by the owner
     * when the run starts (task.start's `budget`); has_budget false: none. */
    bool has_budget;
    struct budget budget;
    uint64_t budget_run; /* a shared record's run the budget is for (the fleet's key) */
    char app[64];        /* the application it belongs to ("" = not
                                     * claimed yet); the registry only stores it */
    /* The current run's trace context as a W3C traceparent ("" = none):
     * its task.start span, set by the owner; the registry only stores it. */
    char trace[56];
    /* ... and its tracestate (NULL = none): task_set_trace_state. */
    char *trace_state;
    /* Private. */
    struct task *hnext;       /* hash chain */
    struct task *prev, *next; /* all tasks, in creation order */
    uint64_t hash;
    size_t heap_idx;
    double wake_at; /* heap key */
};

struct task_config {
    size_t max_tasks;       /* >= 1; default 65536 */
    double ttl_s;           /* > 0, finite; default 86400 */
    double node_timeout_s;  /* > 0, finite; default 600 (defaults.node_timeout_s) */
    double learned_floor_s; /* >= 0; default 1 */
    size_t max_node_names;  /* >= 1; default 1024 */
    size_t hash_buckets;    /* 0 = auto (power of two >= max_tasks); else a power of two */
    uint64_t hash_seed;     /* the sidecar passes a random one */
};

/* Hooks; any may be NULL. See the re-entrancy rule above. */
struct task_hooks {
    /* Every state change, after it happened (t->state is `to`). */
    void (*on_state)(const struct task *t, enum task_state from, double now, void *ud);
    /* A RUNNING task's node deadline passed; t is now failed/watchdog. */
    void (*on_watchdog)(struct task *t, double now, void *ud);
    /* A stopped task's node deadline passed: an ordinary exit. */
    void (*on_watchdog_after_stop)(struct task *t, double now, void *ud);
    /* t is about to be freed (expiry or task_reg_free): drop t->ud. */
    void (*on_free)(struct task *t, double now, void *ud);
    void *ud;
};

/* Counters for `stats`. Gauges describe the registry now; totals only grow. */
struct task_stats {
    size_t tasks;                          /* gauge: all tasks held */
    size_t running, succeeded;             /* gauges */
    size_t failed[TASK_REASON_KIND_COUNT]; /* gauges, by reason_kind */
    uint64_t started, restarted;           /* totals: task_start successes */
    uint64_t succeeded_total;
    uint64_t failed_total[TASK_REASON_KIND_COUNT]; /* [TASK_WATCHDOG] = watchdog fires */
    uint64_t watchdog_after_stop;
    uint64_t expired;         /* finished tasks freed by TTL */
    uint64_t expired_running; /* running tasks idle for ttl_s */
    uint64_t rejected_full;   /* task_start refused: TASK_E_FULL */
    uint64_t nodes_begun, nodes_ended, nodes_abandoned;
    size_t node_names; /* gauge: histories held */
    uint64_t node_names_evicted;
    uint64_t lookups, probes; /* hash lookups and chain entries visited */
};

struct task_reg;

/* Fills `cfg` with the defaults above. */
void task_config_defaults(struct task_config *cfg);

/* A new registry; `cfg` and `hooks` (may be NULL) are copied. Returns NULL
 * on an invalid config (reason in err) or out of memory ("out of memory"). */
struct task_reg *task_reg_new(const struct task_config *cfg, const struct task_hooks *hooks,
                              char *err, size_t errlen);

/* Calls hooks.on_free for every task, then frees everything. NULL is a
 * no-op. Not from inside a hook. */
void task_reg_free(struct task_reg *r, double now);

/*
 * Operations. `id` (borrowed, NUL-terminated, 1..TASK_ID_MAX bytes) names
 * the task; strings are copied. `out` may be NULL; otherwise it receives
 * the task whenever one exists under `id` after the call (also on the
 * TASK_E_RUNNING/STOPPED/WATCHDOG/FINISHED errors, so the caller can
 * report state and reason), else NULL. All return TASK_OK or a negative
 * enum task_err, and change nothing on error.
 */

/* Starts (or restarts, see above) a task. TASK_E_RUNNING, TASK_E_FULL,
 * TASK_E_INVALID, TASK_E_NOMEM. */
int task_start(struct task_reg *r, const char *id, double now, struct task **out);

/* Marks a RUNNING task failed/stopped with `reason` (NULL or "" means
 * "stopped"; truncated to TASK_REASON_MAX). The sidecar then cancels the
 * task's calls. The current node stays armed (see watchdog_after_stop).
 * TASK_E_NOT_FOUND, TASK_E_STOPPED (stopped before: the first reason
 * stays), TASK_E_WATCHDOG, TASK_E_FINISHED. */
int task_stop(struct task_reg *r, const char *id, const char *reason, double now,
              struct task **out);

/* TASK_OK when the task is RUNNING (and records activity), else
 * TASK_E_NOT_FOUND / TASK_E_STOPPED / TASK_E_WATCHDOG / TASK_E_FINISHED.
 * The sidecar also guards each call that names a task. */
int task_guard(struct task_reg *r, const char *id, double now, struct task **out);

/* Arms the watchdog for `node` (1..TASK_NODE_MAX bytes) of a RUNNING task:
 * deadline = now + timeout_s when timeout_s > 0, else the learned or
 * default timeout (see above). timeout_s and now + timeout_s must be
 * finite (else TASK_E_INVALID). Replaces a current node. Errors as task_guard, plus
 * TASK_E_INVALID, TASK_E_NOMEM. */
int task_node_begin(struct task_reg *r, const char *id, const char *node, double timeout_s,
                    double now, struct task **out);

/* Ends the current node of a RUNNING task: records now - begun_at as a
 * sample of that node name, disarms the deadline. `node` NULL means
 * whichever is current. TASK_E_NO_NODE, TASK_E_NODE_MISMATCH, errors as
 * task_guard (a stopped task's node stays armed), TASK_E_NOMEM (a new
 * history could not be allocated: then nothing changed either). */
int task_node_end(struct task_reg *r, const char *id, const char *node, double now,
                  struct task **out);

/* Finishes a RUNNING task: ok -> SUCCEEDED (reason kept if given), else
 * FAILED/error with `reason` (NULL or "" means "error"). Disarms the node
 * without a sample. Errors as task_stop. */
int task_finish(struct task_reg *r, const char *id, bool ok, const char *reason, double now,
                struct task **out);

/* The task named `id`, or NULL (unknown, expired or an invalid id). A read:
 * no activity recorded. */
struct task *task_get(struct task_reg *r, const char *id);

/* Sets t->trace_state to a copy of `state` (NULL or "" = none; longer than
 * TASK_TRACE_STATE_MAX bytes: none). Returns 0, or -1 when out of memory
 * (then none). */
#define TASK_TRACE_STATE_MAX 256
int task_set_trace_state(struct task_reg *r, struct task *t, const char *state);

/* Calls fn for each task whose state is in `filter` (TASK_F_* bits), in
 * creation order, until fn returns non-zero (that value is returned; else
 * 0). fn must not change the registry. */
int task_foreach(struct task_reg *r, unsigned filter, int (*fn)(struct task *t, void *ud),
                 void *ud);

/* When task_on_timer must run next: the earliest node deadline or expiry,
 * absolute on the caller's clock (<= now: run it now); INFINITY when the
 * registry is empty. */
double task_next_deadline(const struct task_reg *r, double now);

/* Applies every node deadline and expiry due at `now` (deadline <= now), in
 * deadline order, calling the hooks: on_watchdog / on_watchdog_after_stop
 * run while the expired node is still in t->node (it is disarmed right
 * after), on_free right before the free. Returns the number of actions
 * (watchdog fires + after-stop exits + expiries), or TASK_E_BUSY from
 * inside a hook. */
int task_on_timer(struct task_reg *r, double now);

/* The timeout node_begin would use for `node` without an explicit one, and
 * where it comes from (src may be NULL). A read. */
double task_node_timeout_s(const struct task_reg *r, const char *node, enum task_timeout_src *src);

/* Samples held for `node` (0..TASK_NODE_WINDOW). */
size_t task_node_samples(const struct task_reg *r, const char *node);

const struct task_stats *task_reg_stats(const struct task_reg *r);

/* Bytes the registry has allocated now (tables, tasks, strings, node
 * histories; requested sizes, not counting the allocator's overhead). */
size_t task_reg_memory_bytes(const struct task_reg *r);

/* The upper bound task_reg_memory_bytes can reach with this config. */
size_t task_reg_memory_limit(const struct task_reg *r);

/* Reason text of a task: "" when it has none. Never NULL. */
const char *task_reason(const struct task *t);

const char *task_err_name(int err);             /* "not_found", ...; "unknown" otherwise */
const char *task_state_name(enum task_state s); /* "running", "succeeded", "failed", "new" */
const char *task_reason_kind_name(enum task_reason_kind k); /* "stopped", ... "" for NONE */
const char *task_timeout_src_name(enum task_timeout_src s); /* "explicit", "learned", "default" */

#endif /* POLYGW_TASK_H */
