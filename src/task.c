/* task.c — see task.h for the lifecycle diagram and the decisions.
 *
 * Data structures, all bounded by the config:
 *   - tasks: a chained hash table by id (buckets allocated once), a list in
 *     creation order (iteration, teardown) and a binary min-heap keyed on
 *     each task's next wake-up (node deadline or expiry), also allocated
 *     once for max_tasks. Every task is in all three, always.
 *   - node histories: a chained hash table by node name plus an LRU list;
 *     each holds a ring of the last TASK_NODE_WINDOW durations and the p99
 *     of that window, recomputed when a sample arrives (node_end is rare
 *     next to node_begin, and this keeps the read side const and O(1)). */
#include "task.h"
#include "dlist.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TASK_MAX_TASKS_LIMIT      ((size_t)1 << 24)
#define TASK_MAX_NODE_NAMES_LIMIT ((size_t)1 << 20)
#define TASK_HASH_BUCKETS_LIMIT   ((size_t)1 << 26)

struct node_hist {
    struct node_hist *hnext;         /* hash chain */
    struct node_hist *lprev, *lnext; /* LRU: head = most recently used */
    uint64_t hash;
    uint32_t n, pos; /* samples held; next slot of the ring */
    double p99;      /* of the window; valid when n >= MIN_SAMPLES */
    double samples[TASK_NODE_WINDOW];
    char name[];
};

struct task_reg {
    struct task_config cfg;
    struct task_hooks hooks;
    struct task **buckets;
    size_t bucket_mask;
    struct task **heap; /* max_tasks slots */
    size_t nheap;
    struct task *head, *tail; /* creation order */
    struct node_hist **nbuckets;
    size_t nbucket_mask;
    struct node_hist *lru_head, *lru_tail;
    struct task_stats st;
    size_t bytes, limit;
    int in_hook; /* > 0 while a hook or foreach runs */
};

/* ------------------------------------------------------------------ */
/* Names                                                               */
/* ------------------------------------------------------------------ */

const char *task_err_name(int err)
{
    switch (err) {
    case TASK_OK:
        return "ok";
    case TASK_E_INVALID:
        return "invalid";
    case TASK_E_NOT_FOUND:
        return "not_found";
    case TASK_E_RUNNING:
        return "already_running";
    case TASK_E_STOPPED:
        return "stopped";
    case TASK_E_WATCHDOG:
        return "watchdog";
    case TASK_E_FINISHED:
        return "finished";
    case TASK_E_NO_NODE:
        return "no_node";
    case TASK_E_NODE_MISMATCH:
        return "node_mismatch";
    case TASK_E_FULL:
        return "full";
    case TASK_E_NOMEM:
        return "nomem";
    case TASK_E_BUSY:
        return "busy";
    default:
        return "unknown";
    }
}

const char *task_state_name(enum task_state s)
{
    switch (s) {
    case TASK_RUNNING:
        return "running";
    case TASK_SUCCEEDED:
        return "succeeded";
    case TASK_FAILED:
        return "failed";
    default:
        return "new";
    }
}

const char *task_reason_kind_name(enum task_reason_kind k)
{
    switch (k) {
    case TASK_STOPPED:
        return "stopped";
    case TASK_WATCHDOG:
        return "watchdog";
    case TASK_ERROR:
        return "error";
    default:
        return "";
    }
}

const char *task_timeout_src_name(enum task_timeout_src s)
{
    switch (s) {
    case TASK_TIMEOUT_EXPLICIT:
        return "explicit";
    case TASK_TIMEOUT_LEARNED:
        return "learned";
    default:
        return "default";
    }
}

const char *task_reason(const struct task *t)
{
    return t->reason ? t->reason : "";
}

/* ------------------------------------------------------------------ */
/* Memory accounting: every allocation goes through these two.         */
/* ------------------------------------------------------------------ */

static void *reg_alloc(struct task_reg *r, size_t size)
{
    void *p = calloc(1, size);
    if (p)
        r->bytes += size;
    return p;
}

static void reg_release(struct task_reg *r, void *p, size_t size)
{
    if (!p)
        return;
    r->bytes -= size;
    free(p);
}

static char *reg_strndup(struct task_reg *r, const char *s, size_t len)
{
    char *d = reg_alloc(r, len + 1);
    if (d)
        memcpy(d, s, len);
    return d;
}

static void reg_strfree(struct task_reg *r, char *s)
{
    if (s)
        reg_release(r, s, strlen(s) + 1);
}

/* ------------------------------------------------------------------ */
/* Hashing                                                             */
/* ------------------------------------------------------------------ */

/* FNV-1a, seeded, with a splitmix64 finaliser so the low bits (the bucket
 * index) depend on every input byte. Not a keyed PRF: chains stay bounded
 * by max_tasks whatever the ids, and the clients are local. */
static uint64_t hash_str(uint64_t seed, const char *s, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ULL ^ seed;

    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ULL;
    }
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebULL;
    h ^= h >> 31;
    return h;
}

static size_t pow2_at_least(size_t n)
{
    size_t p = 1;
    while (p < n)
        p <<= 1;
    return p;
}

/* Length of a valid id / node name (1..max bytes), or 0. */
static size_t name_len(const char *s, size_t max)
{
    if (!s)
        return 0;
    size_t len = strnlen(s, max + 1);
    return len <= max ? len : 0;
}

static struct task *task_find(struct task_reg *r, const char *id, size_t len, uint64_t h)
{
    r->st.lookups++;
    for (struct task *t = r->buckets[h & r->bucket_mask]; t; t = t->hnext) {
        r->st.probes++;
        if (t->hash == h && strncmp(t->id, id, len) == 0 && t->id[len] == '\0')
            return t;
    }
    return NULL;
}

static void hash_remove(struct task_reg *r, struct task *t)
{
    struct task **pp = &r->buckets[t->hash & r->bucket_mask];

    while (*pp != t)
        pp = &(*pp)->hnext;
    *pp = t->hnext;
    t->hnext = NULL;
}

/* ------------------------------------------------------------------ */
/* The wake-up heap                                                    */
/* ------------------------------------------------------------------ */

/* When the task is freed by TTL, ignoring its node. */
static double task_expire_at(const struct task_reg *r, const struct task *t)
{
    if (t->state == TASK_RUNNING)
        return t->node ? INFINITY : t->last_active_at + r->cfg.ttl_s;
    return t->ended_at + r->cfg.ttl_s;
}

static double task_wake_at(const struct task_reg *r, const struct task *t)
{
    double at = task_expire_at(r, t);

    if (t->node && t->node_deadline < at)
        at = t->node_deadline;
    return at;
}

static void heap_put(struct task_reg *r, size_t i, struct task *t)
{
    r->heap[i] = t;
    t->heap_idx = i;
}

static void heap_up(struct task_reg *r, size_t i)
{
    struct task *t = r->heap[i];

    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (r->heap[parent]->wake_at <= t->wake_at)
            break;
        heap_put(r, i, r->heap[parent]);
        i = parent;
    }
    heap_put(r, i, t);
}

static void heap_down(struct task_reg *r, size_t i)
{
    struct task *t = r->heap[i];

    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= r->nheap)
            break;
        if (c + 1 < r->nheap && r->heap[c + 1]->wake_at < r->heap[c]->wake_at)
            c++;
        if (t->wake_at <= r->heap[c]->wake_at)
            break;
        heap_put(r, i, r->heap[c]);
        i = c;
    }
    heap_put(r, i, t);
}

static void heap_push(struct task_reg *r, struct task *t)
{
    t->wake_at = task_wake_at(r, t);
    heap_put(r, r->nheap++, t);
    heap_up(r, t->heap_idx);
}

static void heap_remove(struct task_reg *r, struct task *t)
{
    size_t i = t->heap_idx;
    struct task *last = r->heap[--r->nheap];

    if (last != t) {
        heap_put(r, i, last);
        heap_up(r, i);
        heap_down(r, last->heap_idx);
    }
}

/* Recomputes the task's wake-up after any change of state, node or activity. */
static void task_reschedule(struct task_reg *r, struct task *t)
{
    double at = task_wake_at(r, t);

    if (at == t->wake_at)
        return;
    t->wake_at = at;
    heap_up(r, t->heap_idx);
    heap_down(r, t->heap_idx);
}

/* ------------------------------------------------------------------ */
/* The state machine                                                   */
/* ------------------------------------------------------------------ */

static void gauge_add(struct task_reg *r, enum task_state s, enum task_reason_kind k, int d)
{
    switch (s) {
    case TASK_RUNNING:
        r->st.running += (size_t)d;
        break;
    case TASK_SUCCEEDED:
        r->st.succeeded += (size_t)d;
        break;
    case TASK_FAILED:
        r->st.failed[k] += (size_t)d;
        break;
    default:
        break;
    }
}

/*
 * The only place a task's state, reason_kind and reason change (see the
 * diagram in task.h):
 *
 *   NEW ──start──> RUNNING ──finish(ok)──────> SUCCEEDED ─┐
 *                    │ ──stop──────────────> FAILED/stopped ├─start──> RUNNING
 *                    │ ──watchdog──────────> FAILED/watchdog│
 *                    └──finish(!ok)────────> FAILED/error ──┘
 *
 * Takes `reason` (owned, may be NULL). Sets the run's timestamps, keeps the
 * gauges and totals, reschedules, then reports through on_state.
 */
static void task_set_state(struct task_reg *r, struct task *t, enum task_state to,
                           enum task_reason_kind kind, char *reason, double now)
{
    enum task_state from = t->state;

    gauge_add(r, from, t->reason_kind, -1);
    t->state = to;
    t->reason_kind = to == TASK_FAILED ? kind : TASK_REASON_NONE;
    reg_strfree(r, t->reason);
    t->reason = reason;
    gauge_add(r, to, t->reason_kind, +1);
    if (to == TASK_RUNNING) {
        t->started_at = now;
        t->ended_at = 0;
        t->last_active_at = now;
    } else {
        t->ended_at = now;
    }
    if (to == TASK_SUCCEEDED)
        r->st.succeeded_total++;
    else if (to == TASK_FAILED)
        r->st.failed_total[t->reason_kind]++;
    task_reschedule(r, t);
    if (r->hooks.on_state) {
        r->in_hook++;
        r->hooks.on_state(t, from, now, r->hooks.ud);
        r->in_hook--;
    }
}

/* The code of an operation that needs a RUNNING task. */
static int task_state_err(const struct task *t)
{
    if (t->state == TASK_RUNNING)
        return TASK_OK;
    if (t->state == TASK_FAILED && t->reason_kind == TASK_STOPPED)
        return TASK_E_STOPPED;
    if (t->state == TASK_FAILED && t->reason_kind == TASK_WATCHDOG)
        return TASK_E_WATCHDOG;
    return TASK_E_FINISHED;
}

static void node_disarm(struct task_reg *r, struct task *t)
{
    reg_strfree(r, t->node);
    t->node = NULL;
    t->node_begun_at = 0;
    t->node_deadline = 0;
    t->node_timeout_s = 0;
}

/* Copies a reason, truncated to TASK_REASON_MAX bytes without splitting a
 * UTF-8 sequence; `dflt` when NULL or empty. *ok false when out of memory. */
static char *reason_copy(struct task_reg *r, const char *reason, const char *dflt, bool *ok)
{
    *ok = true;
    if (!reason || !*reason)
        reason = dflt;
    if (!reason)
        return NULL;
    size_t len = strnlen(reason, TASK_REASON_MAX + 1);
    if (len > TASK_REASON_MAX) {
        len = TASK_REASON_MAX;
        /* reason[len] is the first byte cut; if it continues a sequence,
         * back up to that sequence's lead byte and cut there instead. */
        while (len > 0 && ((unsigned char)reason[len] & 0xC0) == 0x80)
            len--;
    }
    char *c = reg_strndup(r, reason, len);
    if (!c)
        *ok = false;
    return c;
}

/* ------------------------------------------------------------------ */
/* Node histories                                                      */
/* ------------------------------------------------------------------ */

static struct node_hist *hist_find(const struct task_reg *r, const char *name, size_t len,
                                   uint64_t h)
{
    for (struct node_hist *n = r->nbuckets[h & r->nbucket_mask]; n; n = n->hnext) {
        if (n->hash == h && strncmp(n->name, name, len) == 0 && n->name[len] == '\0')
            return n;
    }
    return NULL;
}

static void lru_unlink(struct task_reg *r, struct node_hist *n)
{
    DLIST_UNLINK_HT(r->lru_head, r->lru_tail, n, lprev, lnext);
}

static void lru_push_front(struct task_reg *r, struct node_hist *n)
{
    n->lprev = NULL;
    n->lnext = r->lru_head;
    if (r->lru_head)
        r->lru_head->lprev = n;
    r->lru_head = n;
    if (!r->lru_tail)
        r->lru_tail = n;
}

static size_t hist_size(const struct node_hist *n)
{
    return sizeof(*n) + strlen(n->name) + 1;
}

static void hist_free(struct task_reg *r, struct node_hist *n)
{
    struct node_hist **pp = &r->nbuckets[n->hash & r->nbucket_mask];

    while (*pp != n)
        pp = &(*pp)->hnext;
    *pp = n->hnext;
    lru_unlink(r, n);
    r->st.node_names--;
    reg_release(r, n, hist_size(n));
}

/* The history of `name`, created when missing (forgetting the least
 * recently used one at the cap), moved to the LRU front. NULL when out of
 * memory — then nothing was forgotten. */
static struct node_hist *hist_get(struct task_reg *r, const char *name)
{
    size_t len = strlen(name);
    uint64_t h = hash_str(r->cfg.hash_seed, name, len);
    struct node_hist *n = hist_find(r, name, len, h);

    if (n) {
        lru_unlink(r, n);
        lru_push_front(r, n);
        return n;
    }
    n = reg_alloc(r, sizeof(*n) + len + 1);
    if (!n)
        return NULL;
    memcpy(n->name, name, len);
    n->hash = h;
    if (r->st.node_names >= r->cfg.max_node_names) {
        hist_free(r, r->lru_tail);
        r->st.node_names_evicted++;
    }
    n->hnext = r->nbuckets[h & r->nbucket_mask];
    r->nbuckets[h & r->nbucket_mask] = n;
    lru_push_front(r, n);
    r->st.node_names++;
    return n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void hist_add(struct node_hist *n, double d)
{
    n->samples[n->pos] = d;
    n->pos = (n->pos + 1) % TASK_NODE_WINDOW;
    if (n->n < TASK_NODE_WINDOW)
        n->n++;
    if (n->n < TASK_NODE_MIN_SAMPLES)
        return;
    /* p99, nearest rank: the ceil(0.99 n)-th smallest, in integers so that
     * n = 100 gives rank 99 exactly. */
    double sorted[TASK_NODE_WINDOW];
    memcpy(sorted, n->samples, n->n * sizeof(double));
    qsort(sorted, n->n, sizeof(double), cmp_double);
    size_t rank = (99 * (size_t)n->n + 99) / 100;
    n->p99 = sorted[rank - 1];
}

double task_node_timeout_s(const struct task_reg *r, const char *node, enum task_timeout_src *src)
{
    size_t len = name_len(node, TASK_NODE_MAX);
    const struct node_hist *n =
        len ? hist_find(r, node, len, hash_str(r->cfg.hash_seed, node, len)) : NULL;

    if (n && n->n >= TASK_NODE_MIN_SAMPLES) {
        if (src)
            *src = TASK_TIMEOUT_LEARNED;
        return fmax(TASK_LEARNED_FACTOR * n->p99, r->cfg.learned_floor_s);
    }
    if (src)
        *src = TASK_TIMEOUT_DEFAULT;
    return r->cfg.node_timeout_s;
}

size_t task_node_samples(const struct task_reg *r, const char *node)
{
    size_t len = name_len(node, TASK_NODE_MAX);
    const struct node_hist *n =
        len ? hist_find(r, node, len, hash_str(r->cfg.hash_seed, node, len)) : NULL;
    return n ? n->n : 0;
}

/* ------------------------------------------------------------------ */
/* Registry                                                            */
/* ------------------------------------------------------------------ */

void task_config_defaults(struct task_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->max_tasks = 65536;
    cfg->ttl_s = 86400;
    cfg->node_timeout_s = 600;
    cfg->learned_floor_s = 1;
    cfg->max_node_names = 1024;
}

static int config_check(const struct task_config *c, char *err, size_t errlen)
{
    const char *why = NULL;

    if (c->max_tasks < 1 || c->max_tasks > TASK_MAX_TASKS_LIMIT)
        why = "max_tasks must be in 1..16777216";
    else if (!(c->ttl_s > 0) || !isfinite(c->ttl_s))
        why = "ttl_s must be a positive finite number";
    else if (!(c->node_timeout_s > 0) || !isfinite(c->node_timeout_s))
        why = "node_timeout_s must be a positive finite number";
    else if (!(c->learned_floor_s >= 0) || !isfinite(c->learned_floor_s))
        why = "learned_floor_s must be a finite number >= 0";
    else if (c->max_node_names < 1 || c->max_node_names > TASK_MAX_NODE_NAMES_LIMIT)
        why = "max_node_names must be in 1..1048576";
    else if (c->hash_buckets > TASK_HASH_BUCKETS_LIMIT ||
             (c->hash_buckets & (c->hash_buckets - 1)) != 0)
        why = "hash_buckets must be 0 (auto) or a power of two <= 67108864";
    if (why && err && errlen)
        snprintf(err, errlen, "%s", why);
    return why ? -1 : 0;
}

/* The largest single task: struct + id, plus its reason and node strings. */
static size_t task_max_bytes(void)
{
    return sizeof(struct task) + (TASK_ID_MAX + 1) + (TASK_REASON_MAX + 1) + (TASK_NODE_MAX + 1) +
        (TASK_TRACE_STATE_MAX + 1);
}

int task_set_trace_state(struct task_reg *r, struct task *t, const char *state)
{
    reg_strfree(r, t->trace_state);
    t->trace_state = NULL;
    size_t n = state ? strlen(state) : 0;
    if (n == 0 || n > TASK_TRACE_STATE_MAX)
        return 0;
    t->trace_state = reg_strndup(r, state, n);
    return t->trace_state ? 0 : -1;
}

struct task_reg *task_reg_new(const struct task_config *cfg, const struct task_hooks *hooks,
                              char *err, size_t errlen)
{
    if (config_check(cfg, err, errlen) != 0)
        return NULL;

    struct task_reg *r = calloc(1, sizeof(*r));
    if (!r)
        goto oom;
    r->cfg = *cfg;
    if (hooks)
        r->hooks = *hooks;
    r->bytes = sizeof(*r);

    size_t nb = cfg->hash_buckets ? cfg->hash_buckets : pow2_at_least(cfg->max_tasks);
    size_t nnb = pow2_at_least(cfg->max_node_names);
    r->buckets = reg_alloc(r, nb * sizeof(*r->buckets));
    r->heap = reg_alloc(r, cfg->max_tasks * sizeof(*r->heap));
    r->nbuckets = reg_alloc(r, nnb * sizeof(*r->nbuckets));
    if (!r->buckets || !r->heap || !r->nbuckets) {
        free(r->buckets);
        free(r->heap);
        free(r->nbuckets);
        free(r);
        goto oom;
    }
    r->bucket_mask = nb - 1;
    r->nbucket_mask = nnb - 1;
    r->limit = r->bytes + cfg->max_tasks * task_max_bytes() +
        cfg->max_node_names * (sizeof(struct node_hist) + TASK_NODE_MAX + 1);
    return r;
oom:
    if (err && errlen)
        snprintf(err, errlen, "out of memory");
    return NULL;
}

static void task_release(struct task_reg *r, struct task *t)
{
    reg_strfree(r, t->trace_state);
    reg_strfree(r, t->reason);
    reg_strfree(r, t->node);
    reg_release(r, t, sizeof(*t) + strlen(t->id) + 1);
}

static void call_on_free(struct task_reg *r, struct task *t, double now)
{
    if (r->hooks.on_free) {
        r->in_hook++;
        r->hooks.on_free(t, now, r->hooks.ud);
        r->in_hook--;
    }
}

void task_reg_free(struct task_reg *r, double now)
{
    if (!r)
        return;
    /* Tell the owner about every task first, while the registry is whole. */
    for (struct task *t = r->head; t; t = t->next)
        call_on_free(r, t, now);
    for (struct task *t = r->head, *next; t; t = next) {
        next = t->next;
        task_release(r, t);
    }
    while (r->lru_head)
        hist_free(r, r->lru_head);
    free(r->buckets);
    free(r->heap);
    free(r->nbuckets);
    free(r);
}

const struct task_stats *task_reg_stats(const struct task_reg *r)
{
    return &r->st;
}

size_t task_reg_memory_bytes(const struct task_reg *r)
{
    return r->bytes;
}

size_t task_reg_memory_limit(const struct task_reg *r)
{
    return r->limit;
}

/* ------------------------------------------------------------------ */
/* Operations                                                          */
/* ------------------------------------------------------------------ */

/* Common prologue: re-entrancy, id validation, lookup. Returns TASK_OK with
 * *tp set (possibly NULL: not found), or an error. */
static int lookup(struct task_reg *r, const char *id, struct task **tp, size_t *lenp, uint64_t *hp,
                  struct task **out)
{
    if (out)
        *out = NULL;
    if (r->in_hook)
        return TASK_E_BUSY;
    size_t len = name_len(id, TASK_ID_MAX);
    if (!len)
        return TASK_E_INVALID;
    uint64_t h = hash_str(r->cfg.hash_seed, id, len);
    *tp = task_find(r, id, len, h);
    if (lenp)
        *lenp = len;
    if (hp)
        *hp = h;
    if (out)
        *out = *tp;
    return TASK_OK;
}

/* Lookup of a task that must exist and be RUNNING. */
static int lookup_running(struct task_reg *r, const char *id, struct task **tp, struct task **out)
{
    int rc = lookup(r, id, tp, NULL, NULL, out);
    if (rc != TASK_OK)
        return rc;
    if (!*tp)
        return TASK_E_NOT_FOUND;
    return task_state_err(*tp);
}

int task_start(struct task_reg *r, const char *id, double now, struct task **out)
{
    struct task *t;
    size_t len;
    uint64_t h;
    int rc = lookup(r, id, &t, &len, &h, out);

    if (rc != TASK_OK)
        return rc;
    if (t) {
        if (t->state == TASK_RUNNING)
            return TASK_E_RUNNING;
        /* A new run of a finished task: its old node (a stopped task's) is
         * dropped silently — the new run starts clean. */
        if (t->node) {
            node_disarm(r, t);
            r->st.nodes_abandoned++;
        }
        t->runs++;
        r->st.started++;
        r->st.restarted++;
        task_set_state(r, t, TASK_RUNNING, TASK_REASON_NONE, NULL, now);
        return TASK_OK;
    }
    if (r->st.tasks >= r->cfg.max_tasks) {
        r->st.rejected_full++;
        return TASK_E_FULL;
    }
    t = reg_alloc(r, sizeof(*t) + len + 1);
    if (!t)
        return TASK_E_NOMEM;
    char *idbuf = (char *)(t + 1);
    memcpy(idbuf, id, len);
    t->id = idbuf;
    t->hash = h;
    t->state = TASK_NEW;
    t->runs = 1;
    /* Link everywhere before the transition, so on_state sees a task that
     * task_get finds. */
    t->hnext = r->buckets[h & r->bucket_mask];
    r->buckets[h & r->bucket_mask] = t;
    t->prev = r->tail;
    if (r->tail)
        r->tail->next = t;
    else
        r->head = t;
    r->tail = t;
    heap_push(r, t);
    r->st.tasks++;
    r->st.started++;
    if (out)
        *out = t;
    task_set_state(r, t, TASK_RUNNING, TASK_REASON_NONE, NULL, now);
    return TASK_OK;
}

int task_stop(struct task_reg *r, const char *id, const char *reason, double now, struct task **out)
{
    struct task *t;
    int rc = lookup_running(r, id, &t, out);
    bool ok;

    if (rc != TASK_OK)
        return rc;
    char *why = reason_copy(r, reason, "stopped", &ok);
    if (!ok)
        return TASK_E_NOMEM;
    /* The node stays armed: the client cannot end it (its calls are being
     * cancelled), and its deadline passing is the "ordinary exit". */
    task_set_state(r, t, TASK_FAILED, TASK_STOPPED, why, now);
    return TASK_OK;
}

int task_guard(struct task_reg *r, const char *id, double now, struct task **out)
{
    struct task *t;
    int rc = lookup_running(r, id, &t, out);

    if (rc != TASK_OK)
        return rc;
    t->guards++;
    t->last_active_at = now;
    task_reschedule(r, t);
    return TASK_OK;
}

int task_node_begin(struct task_reg *r, const char *id, const char *node, double timeout_s,
                    double now, struct task **out)
{
    struct task *t;
    int rc = lookup_running(r, id, &t, out);

    if (rc != TASK_OK)
        return rc;
    size_t len = name_len(node, TASK_NODE_MAX);
    if (!len || !isfinite(timeout_s))
        return TASK_E_INVALID;

    enum task_timeout_src src = TASK_TIMEOUT_EXPLICIT;
    if (!(timeout_s > 0))
        timeout_s = task_node_timeout_s(r, node, &src);
    if (!isfinite(now + timeout_s))
        return TASK_E_INVALID; /* a deadline that can never pass is no deadline */
    char *copy = reg_strndup(r, node, len);
    if (!copy)
        return TASK_E_NOMEM;
    if (t->node) {
        node_disarm(r, t);
        r->st.nodes_abandoned++;
    }
    t->node = copy;
    t->node_begun_at = now;
    t->node_timeout_s = timeout_s;
    t->node_timeout_src = src;
    t->node_deadline = now + timeout_s;
    t->nodes_begun++;
    r->st.nodes_begun++;
    t->last_active_at = now;
    task_reschedule(r, t);
    return TASK_OK;
}

int task_node_end(struct task_reg *r, const char *id, const char *node, double now,
                  struct task **out)
{
    struct task *t;
    int rc = lookup_running(r, id, &t, out);

    if (rc != TASK_OK)
        return rc;
    if (node && !name_len(node, TASK_NODE_MAX))
        return TASK_E_INVALID;
    if (!t->node)
        return TASK_E_NO_NODE;
    if (node && strcmp(node, t->node) != 0)
        return TASK_E_NODE_MISMATCH;

    struct node_hist *n = hist_get(r, t->node);
    if (!n)
        return TASK_E_NOMEM;
    hist_add(n, now > t->node_begun_at ? now - t->node_begun_at : 0);
    node_disarm(r, t);
    t->nodes_ended++;
    r->st.nodes_ended++;
    t->last_active_at = now;
    task_reschedule(r, t);
    return TASK_OK;
}

int task_finish(struct task_reg *r, const char *id, bool ok, const char *reason, double now,
                struct task **out)
{
    struct task *t;
    int rc = lookup_running(r, id, &t, out);
    bool copied;

    if (rc != TASK_OK)
        return rc;
    char *why = reason_copy(r, reason, ok ? NULL : "error", &copied);
    if (!copied)
        return TASK_E_NOMEM;
    if (t->node) {
        node_disarm(r, t);
        r->st.nodes_abandoned++;
    }
    task_set_state(r, t, ok ? TASK_SUCCEEDED : TASK_FAILED, ok ? TASK_REASON_NONE : TASK_ERROR, why,
                   now);
    return TASK_OK;
}

struct task *task_get(struct task_reg *r, const char *id)
{
    size_t len = name_len(id, TASK_ID_MAX);
    if (!len)
        return NULL;
    return task_find(r, id, len, hash_str(r->cfg.hash_seed, id, len));
}

int task_foreach(struct task_reg *r, unsigned filter, int (*fn)(struct task *t, void *ud), void *ud)
{
    int rc = 0;

    r->in_hook++;
    for (struct task *t = r->head; t && rc == 0; t = t->next) {
        if (filter & (1u << t->state))
            rc = fn(t, ud);
    }
    r->in_hook--;
    return rc;
}

/* ------------------------------------------------------------------ */
/* Watchdog and expiry                                                 */
/* ------------------------------------------------------------------ */

double task_next_deadline(const struct task_reg *r, double now)
{
    (void)now; /* deadlines are absolute; kept for the x_next_deadline contract */
    return r->nheap ? r->heap[0]->wake_at : INFINITY;
}

static void task_expire(struct task_reg *r, struct task *t, double now)
{
    if (t->state == TASK_RUNNING)
        r->st.expired_running++;
    else
        r->st.expired++;
    heap_remove(r, t);
    hash_remove(r, t);
    DLIST_UNLINK_HT(r->head, r->tail, t, prev, next);
    gauge_add(r, t->state, t->reason_kind, -1);
    r->st.tasks--;
    call_on_free(r, t, now);
    task_release(r, t);
}

/* The node deadline of `t` passed at `now`. */
static void node_expired(struct task_reg *r, struct task *t, double now)
{
    if (t->state == TASK_RUNNING) {
        char buf[TASK_NODE_MAX + 64];
        snprintf(buf, sizeof(buf), "node %s exceeded %gs", t->node, t->node_timeout_s);
        bool ok;
        char *why = reason_copy(r, buf, NULL, &ok);
        /* Out of memory must not keep a hung task running: fail it
         * without the text (task_reason() then reads ""). */
        task_set_state(r, t, TASK_FAILED, TASK_WATCHDOG, why, now);
        if (r->hooks.on_watchdog) {
            r->in_hook++;
            r->hooks.on_watchdog(t, now, r->hooks.ud);
            r->in_hook--;
        }
    } else {
        /* Only a stopped task keeps its node armed past its end. */
        r->st.watchdog_after_stop++;
        if (r->hooks.on_watchdog_after_stop) {
            r->in_hook++;
            r->hooks.on_watchdog_after_stop(t, now, r->hooks.ud);
            r->in_hook--;
        }
    }
    node_disarm(r, t);
    task_reschedule(r, t);
}

int task_on_timer(struct task_reg *r, double now)
{
    int actions = 0;

    if (r->in_hook)
        return TASK_E_BUSY;
    while (r->nheap && r->heap[0]->wake_at <= now) {
        struct task *t = r->heap[0];
        if (t->node && t->node_deadline <= now) {
            node_expired(r, t, now);
        } else if (task_expire_at(r, t) <= now) {
            task_expire(r, t, now);
        } else {
            /* wake_at is the minimum of the two, so this is unreachable
             * unless a key went stale: resynchronise, and never spin. */
            t->wake_at = task_wake_at(r, t);
            heap_down(r, 0);
            if (t->wake_at <= now)
                break;
            continue;
        }
        actions++;
    }
    return actions;
}
