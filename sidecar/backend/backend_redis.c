/*
 * backend_redis.c — the Redis backend (see backend.h): governance state
 * shared by a fleet of sidecars (`backend: {kind: redis}`; docs/DESIGN.md
 * §3.2, §3.5, §6; key schema and the split between shared and local state
 * in tests/redis/README.md).
 *
 *  - Admission is propose/confirm. The local step picks a source with the
 *    local rules (AIMD permits, pacer) and reserves it; admit asks
 *    admit.lua (one round trip) for the fleet's verdict: breaker, the
 *    fleet-wide max_concurrency as leases, RPM/TPM/daily buckets, and the
 *    same figures of the calling app (its own, and its own on the source's
 *    capability), checked in the same script. Admitted:
 *    the attempt runs holding a lease. Refused: the caller gives the
 *    reservation back and waits until the retry time (or re-polls). No
 *    answer within the command timeout: backend_unavailable.
 *  - Release: release.lua frees the lease, reconciles the token buckets and
 *    records the breaker verdict. Failures of these writes are logged and
 *    counted: a lease that was not released expires by its TTL.
 *  - Leases of attempts in flight are renewed every lease_ttl_s / 3 (in the
 *    sources' leases keys and the apps'), so only a dead sidecar's permits
 *    expire.
 *  - Progress ages come from a cache kept exact by pub/sub: every mark is
 *    published; an unknown scope is fetched once (the loop waits for it
 *    only when a stall verdict depends on it; hooks.on_progress_known says
 *    when it is known); the cache is dropped when the subscription is lost,
 *    and reads fail closed until it is back.
 *  - Task operations run task.lua, with the calling app and whether it is
 *    an admin app: the record keeps the app that started it as its owner,
 *    so another (non-admin) app gets "not found" on every sidecar. A stop,
 *    watchdog verdict or finish is
 *    published on P:task-end (hooks.on_task_ended on every sidecar). Lost
 *    channel messages or failed updates lead to hooks.on_resync once both
 *    connections are up; hooks.on_up asks for the verdicts not sent.
 *
 * Keys: {P:source:N}:breaker|leases|rpm|tpm|daily,
 * {P:app:A}:leases|rpm|tpm|daily, {P:app:A}:cap:C:leases|rpm|tpm|daily,
 * {P:scope:S}:progress, {P:task:ID}; channels P:task-end and P:progress.
 * Every script touches the keys of one hash tag, except admit and release
 * of an app with limits: the source's and the app's (one slot again when
 * the prefix carries a hash tag of its own).
 */
#include "backend.h"
#include "cache.h"
#include "dlist.h"
#include "strbuf.h"

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "core/log.h"
#include "redis.h"
#include "redis_cluster.h"
#include "task.h"

#define SHARED_SCOPES            4096 /* cache slots (power of two) */
#define SHARED_PROGRESS_TTL_MS   3600000
#define SHARED_RECONNECT_MIN_S   0.05
#define SHARED_RECONNECT_MAX_S   5.0
#define SHARED_KEY_MAX           512
/* A scope's progress marks are sent at most once per this interval by each
 * sidecar; a success inside it is sent when it ends. Other sidecars' view of
 * the age is then late by at most this much (stall windows are seconds to
 * minutes), and a busy scope costs one script every 100 ms instead of one per
 * call (with its pub/sub echo to every sidecar). */
#define SHARED_MARK_COALESCE_S   0.1
#define SHARED_RETRY_LATER_S     1.0 /* failed task updates are retried after */
#define SHARED_RETRY_LATER_MAX_S 60.0
/* Admissions (releases) asked in one loop turn for one source and the same
 * app groups leave as one admit.lua (release.lua) of at most this many. */
#define SHARED_ADMIT_BATCH       32

enum { CH_TASK_END, CH_PROGRESS, CH_CACHE_PURGE, CH_COUNT };

struct backend_lease {
    struct backend_lease *prev, *next; /* the source's live leases */
    size_t source;
    size_t app, cap; /* the app groups admit.lua recorded it in: indexes in
                      * sh->apps and its caps, or SIZE_MAX (none) */
    bool live;       /* linked */
    double est_tokens, est_out;
    /* Once released: the verdict and usage its release.lua carries, while it
     * waits on sh->rq (linked by `next`) for the turn's flush. */
    const char *verdict;
    struct backend_usage used;
    char id[48];
};

struct backend_admit {
    struct backend_redis *sh;
    struct backend_lease *lease;
    backend_admit_cb *cb;
    void *ud;                   /* NULL once detached */
    struct backend_admit *next; /* sh->queue, until turn_flush sends it */
    char est[24], est_out[24];
};

/* One admit.lua in flight: its attempts in ARGV order (owned). */
struct admit_batch {
    size_t n;
    struct backend_admit *a[SHARED_ADMIT_BATCH];
};

/* A scope's progress age in the cache: UNKNOWN (fetch it), FETCHING, KNOWN,
 * or FAILED (the read failed: reads fail closed until failed_at + the command
 * timeout, then fetch again — a persistent error never loops). */
enum scope_state { SCOPE_EMPTY, SCOPE_UNKNOWN, SCOPE_FETCHING, SCOPE_KNOWN, SCOPE_FAILED };

struct scope_slot {
    char *name;
    double last_at;   /* SCOPE_KNOWN: loop time, -INF = never */
    double sent_at;   /* when this sidecar last sent a mark */
    double failed_at; /* SCOPE_FAILED: when */
    unsigned char state;
    bool dirty; /* a success not sent yet (coalesced) */
};

/* The input- and output-token buckets (itpm, otpm) of a source or an app:
 * one io key of admit.lua and release.lua, under the holder's hash tag,
 * sent only when one of the two is set. */
struct io_keys {
    bool on;
    const char *label; /* admit.lua's: "" (the source's) or "app" */
    char key[SHARED_KEY_MAX];
    char a_itpm[24], a_otpm[24], a_win[24];
};

struct source_keys {
    char breaker[SHARED_KEY_MAX], leases[SHARED_KEY_MAX], rpm[SHARED_KEY_MAX], tpm[SHARED_KEY_MAX],
        daily[SHARED_KEY_MAX];
    struct io_keys io;
    struct backend_lease *live;
    size_t n_live;
    char breaker_state[12]; /* the fleet breaker as last seen */
    /* The scripts' constant arguments, formatted once. */
    char a_conc[24], a_ttl[24], a_rpm[24], a_win[24], a_tpm[24], a_daily[24], a_fails[24],
        a_cool[24], a_maxcool[24];
    size_t index; /* in sh->src: a release's context */
    struct backend_redis *sh;
};

/* One group of an app's limits as admit.lua takes it (the app's own, or
 * the app's on one capability): its keys and constant arguments. */
struct limit_keys {
    bool on;        /* some limit is set: the group is sent */
    bool leases_on; /* max_concurrency is set: admit.lua records leases there */
    const char *label;
    char leases[SHARED_KEY_MAX], rpm[SHARED_KEY_MAX], tpm[SHARED_KEY_MAX], daily[SHARED_KEY_MAX];
    char a_conc[24], a_rpm[24], a_win[24], a_tpm[24], a_daily[24];
};

struct app_keys {
    struct limit_keys own;
    struct io_keys io;       /* the app's own itpm / otpm (per_capability has none) */
    struct limit_keys *caps; /* owned, cfg->n_capabilities, or NULL (no per_capability) */
};

struct backend_redis {
    struct backend be; /* first: the table's view */
    struct ev_loop *loop;
    const struct config *cfg; /* borrowed */
    struct rds *rds;          /* one endpoint or Sentinel; or NULL with */
    struct rcl *cl;           /* a Redis Cluster (redis_cluster.h) */
    struct gov_backend progress;
    char sidecar_id[17];
    unsigned long long lease_seq;
    char *channel[CH_COUNT];
    struct source_keys *src;   /* one per configured source */
    struct app_keys *apps;     /* one per configured app */
    struct scope_slot *scopes; /* open addressing */
    size_t n_scopes;
    uint32_t epoch; /* bumped when the cache is dropped */
    size_t n_dirty; /* scopes with a coalesced mark to send */
    bool resync;    /* re-read the running tasks when up */
    unsigned long long resyncs;
    ev_timer mark_w;  /* sends them */
    ev_timer later_w; /* retry_later */
    double later_delay;
    bool closing; /* redis_free: no new work */
    /* startup_check() runs the loop before the server has wired the hooks:
     * events then go nowhere, and start_w passes the state on after. */
    bool starting;
    ev_timer start_w;
    ev_timer renew_w;
    /* The fleet's budgets as last read (budget.lua peek), for display:
     * one per configured app and source; `known` once read. */
    struct budget_view {
        struct budget b;
        bool known;
    } * view_app, *view_src;
    size_t n_view_app, n_view_src;
    unsigned view_gen; /* bumped when the arrays are remade: older answers are dropped */
    ev_timer peek_w;
    /* Admissions and releases of this loop turn, in order, sent before the
     * loop polls (turn_w, ahead of redis.c's own flush); once it ran in a
     * turn (flushed_iter), the turn's later ones are sent at once. */
    struct backend_admit *queue, **queue_tail;
    struct backend_lease *rq, **rq_tail; /* releases, the same way */
    ev_prepare turn_w;
    unsigned int flushed_iter;
    /* counters: admits = admit.lua scripts sent, admit_requests = attempts */
    unsigned long long admit_requests, admits, admitted, refused[9], admit_errors, releases,
        write_errors, leases_lost, progress_fetches, progress_read_errors, renewals, marks_sent,
        marks_coalesced;
};

/* admit.lua's reasons: the source's, then "app" for every app_… one. */
static const char *const refusal_names[9] = { "breaker", "concurrency", "rpm", "tpm",  "daily",
                                              "itpm",    "otpm",        "app", "other" };

/* --- the connector: one endpoint (redis.h) or a cluster (redis_cluster.h) */

static bool sh_up(const struct backend_redis *sh)
{
    return sh->cl ? rcl_up(sh->cl) : rds_up(sh->rds);
}

static bool sh_subscribed(const struct backend_redis *sh)
{
    return sh->cl ? rcl_subscribed(sh->cl) : rds_subscribed(sh->rds);
}

static int sh_eval(struct backend_redis *sh, enum rds_script s, int nkeys, int argc,
                   const char **argv, rds_cb *cb, void *ud)
{
    return sh->cl ? rcl_eval(sh->cl, s, nkeys, argc, argv, NULL, cb, ud)
                  : rds_eval(sh->rds, s, nkeys, argc, argv, NULL, cb, ud);
}

/* A plain command whose key is argv[key] (a cluster routes it by that). */
static int sh_command_key(struct backend_redis *sh, int key, int argc, const char **argv,
                          const size_t *argvlen, rds_cb *cb, void *ud)
{
    return sh->cl ? rcl_command(sh->cl, key, argc, argv, argvlen, cb, ud)
                  : rds_command(sh->rds, argc, argv, argvlen, cb, ud);
}

/* The same with the key at argv[1], as most commands have it. */
static int sh_command(struct backend_redis *sh, int argc, const char **argv, const size_t *argvlen,
                      rds_cb *cb, void *ud)
{
    return sh_command_key(sh, 1, argc, argv, argvlen, cb, ud);
}

static double sh_clock_offset(const struct backend_redis *sh)
{
    return sh->cl ? rcl_clock_offset(sh->cl) : rds_clock_offset(sh->rds);
}

static uint64_t sh_pending(const struct backend_redis *sh)
{
    return sh->cl ? rcl_get_stats(sh->cl)->pending : rds_get_stats(sh->rds)->pending;
}

/* --- helpers ----------------------------------------------------------- */

/* A whole number as the scripts read it (tonumber), in buf of len >= 18
 * bytes (every caller's has 24 or more). */
static void fmt_num(char *buf, size_t len, double v)
{
    if (!(fabs(v) < 9e15)) {
        snprintf(buf, len, "%.0f", v);
        return;
    }
    long long x = llround(v); /* at most 16 digits and a sign */
    if (x < 0)
        *buf++ = '-';
    *put_uint(buf, x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x) = '\0';
}

static bool reply_is_int(const redisReply *r, long long *v)
{
    if (!r)
        return false;
    if (r->type == REDIS_REPLY_INTEGER) {
        *v = r->integer;
        return true;
    }
    if (r->type == REDIS_REPLY_STRING) {
        char *end;
        *v = strtoll(r->str, &end, 10);
        return end != r->str;
    }
    return false;
}

/* A number of a script's reply (an integer, or a decimal string), NAN
 * when it is neither. */
static double reply_num(const redisReply *r)
{
    if (r && r->type == REDIS_REPLY_INTEGER)
        return (double)r->integer;
    if (r && r->type == REDIS_REPLY_STRING)
        return strtod(r->str, NULL);
    return NAN;
}

static void count_write_error(struct backend_redis *sh, const char *what, const char *err)
{
    sh->write_errors++;
    log_at(LOG_WARN, "backend write failed (counted; state self-heals by TTL)", "op", LOG_S, what,
           "error", LOG_S, err ? err : "bad reply", NULL);
}

/* --- progress cache ---------------------------------------------------- */

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static void marks_flush(struct backend_redis *sh);

static void scopes_clear(struct backend_redis *sh)
{
    marks_flush(sh); /* coalesced successes are not lost with the cache */
    for (size_t i = 0; i < SHARED_SCOPES; i++) {
        free(sh->scopes[i].name);
        sh->scopes[i] = (struct scope_slot){ 0 };
    }
    sh->n_scopes = 0;
    sh->epoch++;
}

/* The slot holding `scope`, or the empty slot where it would go (linear
 * probing; the table never fills: scope_slot clears it at 3/4). */
static struct scope_slot *scope_probe(struct backend_redis *sh, const char *scope)
{
    size_t mask = SHARED_SCOPES - 1;

    for (size_t i = (size_t)hash_str(scope) & mask;; i = (i + 1) & mask) {
        struct scope_slot *s = &sh->scopes[i];
        if (s->state == SCOPE_EMPTY || strcmp(s->name, scope) == 0)
            return s;
    }
}

/* The slot of `scope`, or NULL. */
static struct scope_slot *scope_find(struct backend_redis *sh, const char *scope)
{
    struct scope_slot *s = scope_probe(sh, scope);
    return s->state == SCOPE_EMPTY ? NULL : s;
}

/* The slot of `scope`, created when absent (NULL when out of memory). A
 * table 3/4 full is dropped whole: every scope then reads unknown and is
 * fetched again — the safe direction. */
static struct scope_slot *scope_slot(struct backend_redis *sh, const char *scope)
{
    struct scope_slot *s = scope_probe(sh, scope);

    if (s->state != SCOPE_EMPTY)
        return s;
    if (sh->n_scopes >= SHARED_SCOPES * 3 / 4) {
        scopes_clear(sh);
        s = scope_probe(sh, scope);
    }
    char *name = strdup(scope);
    if (!name)
        return NULL;
    *s = (struct scope_slot){ .name = name, .state = SCOPE_UNKNOWN, .sent_at = -INFINITY };
    sh->n_scopes++;
    return s;
}

static void progress_key(const struct backend_redis *sh, const char *scope, char *key, size_t len)
{
    snprintf(key, len, "{%s:scope:%s}:progress", sh->cfg->redis_prefix, scope);
}

struct fetch {
    struct backend_redis *sh;
    uint32_t epoch;
    char scope[];
};

static void on_progress_fetched(const redisReply *r, const char *err, void *ud)
{
    struct fetch *f = ud;
    struct backend_redis *sh = f->sh;
    long long age_ms;

    if (f->epoch == sh->epoch) {
        struct scope_slot *s = scope_find(sh, f->scope);
        if (s && s->state == SCOPE_FETCHING) {
            double now = ev_now(sh->loop);
            if (reply_is_int(r, &age_ms)) {
                s->state = SCOPE_KNOWN;
                s->last_at = age_ms < 0 ? -INFINITY : now - (double)age_ms / 1000.0;
            } else {
                s->state = SCOPE_FAILED;
                s->failed_at = now;
                sh->progress_read_errors++;
                log_at(LOG_WARN, "progress read failed (calls of the scope fail closed)", "scope",
                       LOG_S, f->scope, "error", LOG_S, err ? err : "bad reply", NULL);
            }
        }
    }
    if (!sh->closing && sh->be.hooks.on_progress_known) /* its waiters look again */
        sh->be.hooks.on_progress_known(sh->be.hooks.ud, f->scope);
    free(f);
}

static int be_progress_age(void *ud, const char *scope, double now, double *age)
{
    struct backend_redis *sh = ud;

    if (!sh_subscribed(sh) || !sh_up(sh))
        return -1; /* marks may be missed: fail closed */
    struct scope_slot *s = scope_slot(sh, scope);
    if (!s)
        return -1;
    if (s->state == SCOPE_KNOWN) {
        *age = now - s->last_at;
        if (*age < 0)
            *age = 0;
        if (*age * 1000.0 >= SHARED_PROGRESS_TTL_MS)
            *age = INFINITY; /* the key expired in Redis: "never" */
        return 0;
    }
    if (s->state == SCOPE_FETCHING)
        return 1;
    if (s->state == SCOPE_FAILED) {
        if (now - s->failed_at < sh->cfg->redis_command_timeout_s)
            return -1;
        s->state = SCOPE_UNKNOWN;
    }
    size_t n = strlen(scope);
    struct fetch *f = malloc(sizeof(*f) + n + 1);
    if (!f)
        return -1;
    f->sh = sh;
    f->epoch = sh->epoch;
    memcpy(f->scope, scope, n + 1);
    char key[SHARED_KEY_MAX];
    progress_key(sh, scope, key, sizeof(key));
    const char *argv[] = { key, "age" };
    if (sh_eval(sh, RDS_PROGRESS, 1, 2, argv, on_progress_fetched, f) < 0) {
        free(f);
        return -1;
    }
    sh->progress_fetches++;
    s->state = SCOPE_FETCHING;
    return 1;
}

static void on_mark_done(const redisReply *r, const char *err, void *ud)
{
    long long v;
    if (!reply_is_int(r, &v))
        count_write_error(ud, "progress mark", err);
}

static int send_mark(struct backend_redis *sh, const char *scope)
{
    char key[SHARED_KEY_MAX], ttl[24];

    progress_key(sh, scope, key, sizeof(key));
    fmt_num(ttl, sizeof(ttl), SHARED_PROGRESS_TTL_MS);
    const char *argv[] = { key, "mark", ttl, sh->channel[CH_PROGRESS], scope };
    sh->marks_sent++;
    if (sh_eval(sh, RDS_PROGRESS, 1, 5, argv, on_mark_done, sh) < 0) {
        count_write_error(sh, "progress mark", "not connected");
        return -1;
    }
    return 0;
}

static void marks_flush(struct backend_redis *sh)
{
    double now = ev_now(sh->loop);

    ev_timer_stop(sh->loop, &sh->mark_w);
    for (size_t i = 0; sh->n_dirty > 0 && i < SHARED_SCOPES; i++) {
        struct scope_slot *s = &sh->scopes[i];
        if (s->state == SCOPE_EMPTY || !s->dirty)
            continue;
        s->dirty = false;
        s->sent_at = now;
        sh->n_dirty--;
        send_mark(sh, s->name);
    }
    sh->n_dirty = 0;
}

static void on_mark_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    marks_flush(w->data);
}

static int be_progress_mark(void *ud, const char *scope, double now)
{
    struct backend_redis *sh = ud;
    struct scope_slot *s = scope_slot(sh, scope);

    if (!s)
        return send_mark(sh, scope);
    s->state = SCOPE_KNOWN;
    s->last_at = now;
    if (now - s->sent_at >= SHARED_MARK_COALESCE_S) {
        s->sent_at = now;
        return send_mark(sh, scope);
    }
    sh->marks_coalesced++;
    if (!s->dirty) {
        s->dirty = true;
        sh->n_dirty++;
        if (!ev_is_active(&sh->mark_w)) {
            ev_timer_set(&sh->mark_w, SHARED_MARK_COALESCE_S, 0.);
            ev_timer_start(sh->loop, &sh->mark_w);
        }
    }
    return 0;
}

/* --- leases ------------------------------------------------------------ */

static void lease_link(struct backend_redis *sh, struct backend_lease *l)
{
    struct source_keys *k = &sh->src[l->source];
    DLIST_PUSH(k->live, l, prev, next);
    k->n_live++;
    l->live = true;
}

static void lease_unlink(struct backend_redis *sh, struct backend_lease *l)
{
    struct source_keys *k = &sh->src[l->source];
    if (!l->live)
        return;
    DLIST_UNLINK(k->live, l, prev, next);
    k->n_live--;
    l->live = false;
}

/* The fleet breaker as one release left it: logged when it changed. */
static void note_breaker(struct backend_redis *sh, size_t source, const char *state)
{
    struct source_keys *k = &sh->src[source];

    if (strcmp(k->breaker_state, state) == 0)
        return;
    log_at(strcmp(state, "open") == 0 ? LOG_WARN : LOG_INFO, "fleet breaker", "source", LOG_S,
           sh->cfg->sources[source].name, "from", LOG_S, k->breaker_state, "to", LOG_S, state,
           NULL);
    snprintf(k->breaker_state, sizeof(k->breaker_state), "%s", state);
}

static void on_released(const redisReply *r, const char *err, void *ud)
{
    struct source_keys *k = ud;
    struct backend_redis *sh = k->sh;

    /* a triple per release; the last one's breaker state is the newest */
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements == 0 || r->elements % 3 != 0) {
        count_write_error(sh, "release", err);
        return;
    }
    const redisReply *state = r->element[r->elements - 2];
    if (state->type == REDIS_REPLY_STRING && state->len < 12)
        note_breaker(sh, k->index, state->str);
}

/* The app groups of lease `l` (0, 1 or 2 of them, in admit.lua's order). */
static size_t lease_groups(const struct backend_redis *sh, const struct backend_lease *l,
                           const struct limit_keys *g[2])
{
    size_t n = 0;

    if (l->app == SIZE_MAX)
        return 0;
    const struct app_keys *a = &sh->apps[l->app];
    if (a->own.on)
        g[n++] = &a->own;
    if (l->cap != SIZE_MAX)
        g[n++] = &a->caps[l->cap];
    return n;
}

/* Appends v[0..count) to argv at n; returns the new n. */
static size_t push_args(const char **argv, size_t n, const char *const *v, size_t count)
{
    for (size_t i = 0; i < count; i++)
        argv[n++] = v[i];
    return n;
}

/* The io keys of lease `l` (0, 1 or 2: the source's, then the app's). */
static size_t lease_ios(const struct backend_redis *sh, const struct backend_lease *l,
                        const struct io_keys *io[2])
{
    size_t n = 0;

    if (sh->src[l->source].io.on)
        io[n++] = &sh->src[l->source].io;
    if (l->app != SIZE_MAX && sh->apps[l->app].io.on)
        io[n++] = &sh->apps[l->app].io;
    return n;
}

/* Appends the keys of source `k`, of groups g[0..ng) and of io keys
 * io[0..nio) to argv at n: the KEYS both admit.lua and release.lua take.
 * Returns the new n. */
static size_t push_keys(const char **argv, size_t n, const struct source_keys *k,
                        const struct limit_keys *const *g, size_t ng,
                        const struct io_keys *const *io, size_t nio)
{
    const char *const keys[5] = { k->breaker, k->leases, k->rpm, k->tpm, k->daily };
    n = push_args(argv, n, keys, 5);
    for (size_t i = 0; i < ng; i++) {
        const char *const gk[4] = { g[i]->leases, g[i]->rpm, g[i]->tpm, g[i]->daily };
        n = push_args(argv, n, gk, 4);
    }
    for (size_t i = 0; i < nio; i++)
        argv[n++] = io[i]->key;
    return n;
}

/* Do the attempts of leases x and y take the same KEYS (source, app groups)? */
static bool same_groups(const struct backend_lease *x, const struct backend_lease *y)
{
    return x->source == y->source && x->app == y->app && x->cap == y->cap;
}

/* Has this loop turn's flush run (the turn's later requests go alone)? */
static bool turn_flushed(const struct backend_redis *sh)
{
    return sh->closing ||
        (ev_iteration(sh->loop) == sh->flushed_iter && !ev_is_active(&sh->turn_w));
}

/* A count as the scripts take it: a whole number, -1 when unknown (< 0). */
static void fmt_count(char *buf, size_t len, double v)
{
    fmt_num(buf, len, v < 0 ? -1 : ceil(v));
}

/* One release.lua for leases ls[0..n) (same source and groups): the keys of
 * admit.lua; 11 arguments (the first lease's among them), 4 per group, 3
 * per io key and, with io keys, the first lease's output estimate and
 * input and output counts; then lease id, verdict, estimate and usage of
 * each further lease, and its three io figures with io keys (see its
 * header). Failures are counted; the leases stay the caller's. */
static void release_send(struct backend_redis *sh, struct backend_lease *const *ls, size_t n)
{
    const struct backend_lease *l = ls[0];
    struct source_keys *k = &sh->src[l->source];
    char f[SHARED_ADMIT_BATCH][5][24]; /* est, used, est_out, used in, used out */

    for (size_t i = 0; i < n; i++) {
        const struct backend_usage *u = &ls[i]->used;
        fmt_count(f[i][0], sizeof(f[i][0]), ls[i]->est_tokens);
        fmt_count(f[i][1], sizeof(f[i][1]), u->total);
        fmt_count(f[i][2], sizeof(f[i][2]), ls[i]->est_out);
        fmt_count(f[i][3], sizeof(f[i][3]), u->in);
        fmt_count(f[i][4], sizeof(f[i][4]), u->out);
    }
    const struct limit_keys *g[2];
    const struct io_keys *io[2];
    size_t ng = lease_groups(sh, l, g), nio = lease_ios(sh, l, io);
    const char *argv[5 + 4 * 2 + 2 + 11 + 4 * 2 + 3 * 2 + 3 + 7 * (SHARED_ADMIT_BATCH - 1)];
    size_t m = push_keys(argv, 0, k, g, ng, io, nio);
    const char *const args[11] = { l->id,      l->verdict, f[0][0],     f[0][1],
                                   k->a_tpm,   k->a_win,   k->a_daily,  "86400000",
                                   k->a_fails, k->a_cool,  k->a_maxcool };
    m = push_args(argv, m, args, 11);
    for (size_t i = 0; i < ng; i++) {
        const char *const ga[4] = { g[i]->a_tpm, g[i]->a_win, g[i]->a_daily, "86400000" };
        m = push_args(argv, m, ga, 4);
    }
    for (size_t i = 0; i < nio; i++) {
        const char *const ia[3] = { io[i]->a_itpm, io[i]->a_otpm, io[i]->a_win };
        m = push_args(argv, m, ia, 3);
    }
    if (nio > 0)
        m = push_args(argv, m, (const char *const[3]){ f[0][2], f[0][3], f[0][4] }, 3);
    for (size_t i = 1; i < n; i++) {
        const char *const more[7] = { ls[i]->id, ls[i]->verdict, f[i][0], f[i][1],
                                      f[i][2],   f[i][3],        f[i][4] };
        m = push_args(argv, m, more, nio > 0 ? 7 : 4);
    }
    if (sh_eval(sh, RDS_RELEASE, (int)(5 + 4 * ng + nio), (int)m, argv, on_released, k) < 0)
        count_write_error(sh, "release", "not connected");
}

static void redis_release(struct backend *be, struct backend_lease *l, const struct outcome *o,
                          const struct backend_usage *used)
{
    struct backend_redis *sh = (struct backend_redis *)be;

    lease_unlink(sh, l);
    sh->releases++;
    l->verdict = backend_verdict_name(o);
    l->used = used ? *used : (struct backend_usage){ -1, -1, -1 };
    if (turn_flushed(sh)) {
        release_send(sh, &l, 1);
        free(l);
        return;
    }
    l->next = NULL;
    *sh->rq_tail = l;
    sh->rq_tail = &l->next;
    if (!ev_is_active(&sh->turn_w))
        ev_prepare_start(sh->loop, &sh->turn_w);
}

/* Sends the queued releases: the first and up to SHARED_ADMIT_BATCH - 1
 * later ones for the same source and groups in one script, until none
 * waits. Before the admissions: the permits they free count for them. */
static void release_flush(struct backend_redis *sh)
{
    struct backend_lease *q = sh->rq;

    sh->rq = NULL;
    sh->rq_tail = &sh->rq;
    while (q) {
        struct backend_lease *b[SHARED_ADMIT_BATCH];
        size_t n = 0;
        struct backend_lease *rest = NULL, **rest_tail = &rest;
        while (q) {
            struct backend_lease *l = q;
            q = l->next;
            l->next = NULL;
            if (n < SHARED_ADMIT_BATCH && (n == 0 || same_groups(b[0], l))) {
                b[n++] = l;
            } else {
                *rest_tail = l;
                rest_tail = &l->next;
            }
        }
        q = rest;
        release_send(sh, b, n);
        for (size_t i = 0; i < n; i++)
            free(b[i]);
    }
}

static int refusal_index(const char *why)
{
    for (int i = 0; i < 7; i++)
        if (strcmp(why, refusal_names[i]) == 0)
            return i;
    return strncmp(why, "app_", 4) == 0 ? 7 : 8;
}

/* The answer to attempt `a`: e[0..2] its triple of admit.lua's reply, or
 * NULL with `err` (takes a and, unless admitted, its lease). */
static void admit_answer(struct backend_admit *a, redisReply *const *e, const char *err)
{
    struct backend_redis *sh = a->sh;
    struct backend_lease *l = a->lease;
    long long ok = -1, v = 0;

    if (e)
        reply_is_int(e[0], &ok);
    if (ok == 1) {
        sh->admitted++; /* the probe flag (element 2) is release.lua's business */
        lease_link(sh, l);
        if (a->ud)
            a->cb(a->ud, 1, l, NAN, "admitted");
        else
            redis_release(&sh->be, l, NULL, NULL); /* the call is gone */
    } else if (ok == 0 && e[1]->type == REDIS_REPLY_STRING) {
        const char *why = e[1]->str;
        double retry_at = NAN, off = sh_clock_offset(sh);
        sh->refused[refusal_index(why)]++;
        if (strcmp(why, "breaker") == 0)
            note_breaker(sh, l->source, "open");
        if (reply_is_int(e[2], &v) && v > 0 && isfinite(off))
            retry_at = (double)v / 1000.0 - off;
        if (a->ud)
            a->cb(a->ud, 0, NULL, retry_at, why);
        free(l);
    } else {
        sh->admit_errors++;
        if (a->ud)
            a->cb(a->ud, -1, NULL, NAN, err ? err : "unexpected reply from admit.lua");
        free(l);
    }
    free(a);
}

/* admit.lua answers a triple per attempt, in the order sent. */
static void on_admitted(const redisReply *r, const char *err, void *ud)
{
    struct admit_batch *b = ud;
    bool whole = r && r->type == REDIS_REPLY_ARRAY && r->elements == 3 * b->n;

    for (size_t i = 0; i < b->n; i++)
        admit_answer(b->a[i], whole ? r->element + 3 * i : NULL, err);
    free(b);
}

/* One admit.lua for the attempts of `b` (same source and groups): the
 * source's 5 keys, the app groups' 4 each, the io keys; then 10 arguments
 * (the first attempt's lease id and estimate among them), 8 per group, 4
 * per io key and, with io keys, the first attempt's output estimate; then
 * the lease id and estimate of each further attempt, and its output
 * estimate with io keys (see its header). Takes b: sent, or -1 with b
 * untouched. */
static int admit_send(struct backend_redis *sh, struct admit_batch *b)
{
    const struct backend_lease *l = b->a[0]->lease;
    const struct source_keys *k = &sh->src[l->source];
    const struct limit_keys *g[2];
    const struct io_keys *io[2];
    size_t ng = lease_groups(sh, l, g), nio = lease_ios(sh, l, io);
    const char *argv[5 + 4 * 2 + 2 + 10 + 8 * 2 + 4 * 2 + 1 + 3 * (SHARED_ADMIT_BATCH - 1)];
    size_t n = push_keys(argv, 0, k, g, ng, io, nio);
    const char *const args[10] = { l->id,    k->a_conc, k->a_ttl,   k->a_rpm,   k->a_win,
                                   k->a_tpm, k->a_win,  k->a_daily, "86400000", b->a[0]->est };
    n = push_args(argv, n, args, 10);
    for (size_t i = 0; i < ng; i++) {
        const char *const ga[8] = { g[i]->label, g[i]->a_conc, g[i]->a_rpm,   g[i]->a_win,
                                    g[i]->a_tpm, g[i]->a_win,  g[i]->a_daily, "86400000" };
        n = push_args(argv, n, ga, 8);
    }
    for (size_t i = 0; i < nio; i++) {
        const char *const ia[4] = { io[i]->label, io[i]->a_itpm, io[i]->a_otpm, io[i]->a_win };
        n = push_args(argv, n, ia, 4);
    }
    if (nio > 0)
        argv[n++] = b->a[0]->est_out;
    for (size_t i = 1; i < b->n; i++) {
        argv[n++] = b->a[i]->lease->id;
        argv[n++] = b->a[i]->est;
        if (nio > 0)
            argv[n++] = b->a[i]->est_out;
    }
    if (sh_eval(sh, RDS_ADMIT, (int)(5 + 4 * ng + nio), (int)n, argv, on_admitted, b) < 0)
        return -1;
    sh->admits++;
    return 0;
}

/* Sends the turn's queued releases, then its admissions: the first still
 * waiting and up to SHARED_ADMIT_BATCH - 1 later ones for the same source
 * and groups in one script, in the order asked, until none waits. Detached
 * admissions are dropped unsent. */
static void turn_flush(struct backend_redis *sh)
{
    struct backend_admit *q = sh->queue;

    sh->queue = NULL;
    sh->queue_tail = &sh->queue;
    sh->flushed_iter = ev_iteration(sh->loop);
    release_flush(sh);
    while (q) {
        struct admit_batch *b = malloc(sizeof(*b));
        if (!b) {
            while (q) {
                struct backend_admit *a = q;
                q = a->next;
                admit_answer(a, NULL, "out of memory");
            }
            return;
        }
        b->n = 0;
        struct backend_admit *rest = NULL, **rest_tail = &rest;
        while (q) {
            struct backend_admit *a = q;
            q = a->next;
            a->next = NULL;
            if (!a->ud) {
                free(a->lease);
                free(a);
            } else if (b->n < SHARED_ADMIT_BATCH &&
                       (b->n == 0 || same_groups(b->a[0]->lease, a->lease))) {
                b->a[b->n++] = a;
            } else {
                *rest_tail = a;
                rest_tail = &a->next;
            }
        }
        q = rest;
        if (b->n > 0 && admit_send(sh, b) == 0)
            continue;
        for (size_t i = 0; i < b->n; i++) /* not sent: each fails closed */
            admit_answer(b->a[i], NULL, "not connected");
        free(b);
    }
}

static void on_turn_flush(struct ev_loop *loop, ev_prepare *w, int revents)
{
    struct backend_redis *sh = w->data;
    (void)revents;

    ev_prepare_stop(loop, w);
    turn_flush(sh);
    if (sh->cl)
        rcl_flush(sh->cl);
    else
        rds_flush(sh->rds);
}

static int redis_admit(struct backend *be, size_t source, size_t app, double est_tokens,
                       double est_out, struct backend_lease **lease, backend_admit_cb *cb, void *ud,
                       struct backend_admit **pending)
{
    struct backend_redis *sh = (struct backend_redis *)be;
    struct backend_admit *a = malloc(sizeof(*a));
    struct backend_lease *l = calloc(1, sizeof(*l));

    *lease = NULL;
    *pending = NULL;
    if (!a || !l || sh->closing || !sh_up(sh)) {
        free(a);
        free(l);
        return -1;
    }
    l->source = source;
    l->est_tokens = est_tokens;
    l->est_out = est_out > est_tokens ? est_tokens : est_out;
    l->app = l->cap = SIZE_MAX;
    if (app < sh->cfg->n_apps) {
        const struct app_keys *ak = &sh->apps[app];
        size_t cap = sh->cfg->sources[source].capability_index;
        bool cap_on = ak->caps && ak->caps[cap].on;
        if (ak->own.on || ak->io.on || cap_on) {
            l->app = app;
            l->cap = cap_on ? cap : SIZE_MAX;
        }
    }
    /* "<sidecar_id>:<seq>": 16 + 1 + at most 21 bytes */
    memcpy(l->id, sh->sidecar_id, 16);
    l->id[16] = ':';
    *put_uint(l->id + 17, ++sh->lease_seq) = '\0';
    *a = (struct backend_admit){ .sh = sh, .lease = l, .cb = cb, .ud = ud };
    fmt_num(a->est, sizeof(a->est), ceil(est_tokens));
    fmt_count(a->est_out, sizeof(a->est_out), l->est_out);
    sh->admit_requests++;
    if (turn_flushed(sh)) { /* alone, at once */
        struct admit_batch *b = malloc(sizeof(*b));
        if (!b || (b->n = 1, b->a[0] = a, admit_send(sh, b) < 0)) {
            free(b);
            free(a);
            free(l);
            return -1;
        }
    } else {
        *sh->queue_tail = a;
        sh->queue_tail = &a->next;
        if (!ev_is_active(&sh->turn_w))
            ev_prepare_start(sh->loop, &sh->turn_w);
    }
    *pending = a;
    return 0;
}

static void redis_admit_detach(struct backend *be, struct backend_admit *a)
{
    (void)be;
    a->ud = NULL;
}

/* Renewal: every lease_ttl_s / 3, one renew.lua per source with leases. */
static void on_renewed(const redisReply *r, const char *err, void *ud)
{
    struct backend_redis *sh = ud;

    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
        count_write_error(sh, "renew", err);
        return;
    }
    sh->renewals++;
    const redisReply *lost = r->element[1];
    for (size_t i = 0; lost->type == REDIS_REPLY_ARRAY && i < lost->elements; i++) {
        sh->leases_lost++;
        log_at(LOG_WARN,
               "lease expired while its attempt ran (Redis unreachable for longer "
               "than lease_ttl_s?); the attempt runs on without a fleet permit",
               "lease", LOG_S,
               lost->element[i]->type == REDIS_REPLY_STRING ? lost->element[i]->str : "?", NULL);
    }
}

/* Does lease `l` count in source `source` (SIZE_MAX: any), app `app`'s
 * own group (SIZE_MAX: no app) or its group of capability `cap`? */
static bool lease_in(const struct backend_lease *l, size_t source, size_t app, size_t cap)
{
    if (source != SIZE_MAX)
        return l->source == source;
    return l->app == app && (cap == SIZE_MAX || l->cap == cap);
}

/* One renew.lua for the leases key `key` of the live leases lease_in
 * selects (none: nothing sent). */
static void renew_key(struct backend_redis *sh, const char *key, const char *ttl, size_t source,
                      size_t app, size_t cap)
{
    size_t n = 0, live = 0;

    for (size_t i = 0; i < sh->cfg->n_sources; i++)
        for (struct backend_lease *l = sh->src[i].live; l; l = l->next)
            live += lease_in(l, source, app, cap);
    if (!live)
        return;
    const char **argv = malloc((live + 2) * sizeof(*argv));
    if (!argv)
        return;
    argv[n++] = key;
    argv[n++] = ttl;
    for (size_t i = 0; i < sh->cfg->n_sources; i++)
        for (struct backend_lease *l = sh->src[i].live; l; l = l->next)
            if (lease_in(l, source, app, cap))
                argv[n++] = l->id;
    if (sh_eval(sh, RDS_RENEW, 1, (int)n, argv, on_renewed, sh) < 0)
        count_write_error(sh, "renew", "not connected");
    free(argv);
}

/* Every leases key with live leases of this sidecar: the sources', and the
 * app groups' (an app's slot held by a live attempt must not expire). */
static void renew_all(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct backend_redis *sh = w->data;
    char ttl[32];
    (void)loop;
    (void)revents;

    if (!sh_up(sh))
        return;
    fmt_num(ttl, sizeof(ttl), sh->cfg->redis_lease_ttl_s * 1000.0);
    for (size_t i = 0; i < sh->cfg->n_sources; i++)
        if (sh->src[i].n_live)
            renew_key(sh, sh->src[i].leases, ttl, i, SIZE_MAX, SIZE_MAX);
    for (size_t a = 0; a < sh->cfg->n_apps; a++) {
        const struct app_keys *ak = &sh->apps[a];
        if (ak->own.leases_on)
            renew_key(sh, ak->own.leases, ttl, SIZE_MAX, a, SIZE_MAX);
        for (size_t c = 0; ak->caps && c < sh->cfg->n_capabilities; c++)
            if (ak->caps[c].leases_on)
                renew_key(sh, ak->caps[c].leases, ttl, SIZE_MAX, a, c);
    }
}

/* --- tasks ------------------------------------------------------------- */

static const char *const task_lua_op[] = {
    [BACKEND_TASK_START] = "start", [BACKEND_TASK_STOP] = "stop",
    [BACKEND_TASK_GUARD] = "guard", [BACKEND_TASK_FINISH] = "finish",
    [BACKEND_TASK_GET] = "get",     [BACKEND_TASK_WATCHDOG] = "watchdog",
};

struct task_op {
    backend_task_cb *cb;
    void *ud;
    struct backend_redis *sh;
    bool get;
    char id[TASK_ID_MAX + 1];
};

/* A get's record, kept while its run's budget is read (owned strings). */
struct task_get {
    struct task_op op;
    struct backend_task bt;
    char *state, *kind, *reason, *owner;
};

static int task_code(const char *code)
{
    static const struct {
        const char *name;
        int rc;
    } codes[] = {
        { "ok", TASK_OK },
        { "not_found", TASK_E_NOT_FOUND },
        { "running", TASK_E_RUNNING },
        { "stopped", TASK_E_STOPPED },
        { "watchdog", TASK_E_WATCHDOG },
        { "finished", TASK_E_FINISHED },
    };
    for (size_t i = 0; i < sizeof(codes) / sizeof(*codes); i++)
        if (strcmp(code, codes[i].name) == 0)
            return codes[i].rc;
    return BACKEND_E_UNAVAILABLE;
}

/* task.lua's reply {code, state, kind, reason, runs, started_at_ms,
 * ended_at_ms, owner} (or {code} alone when there is no record; a record
 * written before owners were kept has no owner element). Redis' clock and
 * the host's are assumed close: the times are only displayed. */
static bool task_parse(const redisReply *r, struct backend_task *bt)
{
    *bt = (struct backend_task){ .rc = BACKEND_E_UNAVAILABLE };
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->type != REDIS_REPLY_STRING)
        return false;
    bt->rc = task_code(r->element[0]->str);
    if (r->elements < 7)
        return r->elements == 1;
    for (int i = 1; i <= 3; i++)
        if (r->element[i]->type != REDIS_REPLY_STRING)
            return false;
    for (int i = 4; i <= 6; i++)
        if (r->element[i]->type != REDIS_REPLY_INTEGER)
            return false;
    long long started = r->element[5]->integer, ended = r->element[6]->integer;
    bt->exists = true;
    bt->state = r->element[1]->str;
    bt->kind = r->element[2]->str;
    bt->reason = r->element[3]->str;
    bt->runs = r->element[4]->integer > 0 ? (uint64_t)r->element[4]->integer : 0;
    bt->started_at_s = (double)started / 1000.0;
    bt->updated_at_s = (double)(ended > 0 ? ended : started) / 1000.0;
    if (r->elements > 7 && r->element[7]->type == REDIS_REPLY_STRING)
        bt->owner = r->element[7]->str;
    if (r->elements > 8 && r->element[8]->type == REDIS_REPLY_STRING)
        bt->budget = strtod(r->element[8]->str, NULL);
    return true;
}

static void task_get_free(struct task_get *g)
{
    free(g->state);
    free(g->kind);
    free(g->reason);
    free(g->owner);
    free(g);
}

/* budget.lua peek of a run's budget: six numbers, spent_t the third and
 * reserved the fourth. Unread (an error, no answer): the record is
 * answered without them, its limit only. */
static void on_task_budget(const redisReply *r, const char *err, void *ud)
{
    struct task_get *g = ud;
    (void)err;

    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 6) {
        g->bt.spent = reply_num(r->element[2]);
        g->bt.reserved = reply_num(r->element[3]);
        g->bt.spent_known = isfinite(g->bt.spent) && isfinite(g->bt.reserved);
    }
    g->op.cb(g->op.ud, &g->bt);
    task_get_free(g);
}

/* A get found a run with a budget: reads what the fleet spent of it
 * ({P:task:ID}:budget:RUN, under the task's hash tag), then answers. 0
 * sent (`bt` copied), -1 not. */
static int task_read_budget(const struct task_op *op, const struct backend_task *bt)
{
    struct backend_redis *sh = op->sh;
    struct task_get *g = calloc(1, sizeof(*g));
    char key[SHARED_KEY_MAX], limit[32];

    if (!g)
        return -1;
    g->op = *op;
    g->bt = *bt;
    g->state = strdup(bt->state);
    g->kind = strdup(bt->kind);
    g->reason = strdup(bt->reason);
    g->owner = bt->owner ? strdup(bt->owner) : NULL;
    if (!g->state || !g->kind || !g->reason || (bt->owner && !g->owner) || sh->closing) {
        task_get_free(g);
        return -1;
    }
    g->bt.state = g->state;
    g->bt.kind = g->kind;
    g->bt.reason = g->reason;
    g->bt.owner = g->owner;
    snprintf(key, sizeof(key), "{%s:task:%s}:budget:%llu", sh->cfg->redis_prefix, op->id,
             (unsigned long long)bt->runs);
    snprintf(limit, sizeof(limit), "%.17g", bt->budget);
    /* peek, nothing reserved; the run's limits: a total only, UTC */
    const char *argv[] = { key, "peek", "0", "nan", "0", "0", limit, "0" };
    if (sh_eval(sh, RDS_BUDGET, 1, 8, argv, on_task_budget, g) < 0) {
        task_get_free(g);
        return -1;
    }
    return 0;
}

static void on_task_reply(const redisReply *r, const char *err, void *ud)
{
    struct task_op *op = ud;
    struct backend_task bt;

    if (!task_parse(r, &bt)) {
        /* A parsed reply with an unknown code is as good as none. */
        bt = (struct backend_task){ .rc = BACKEND_E_UNAVAILABLE, .err = err };
        if (r && r->type == REDIS_REPLY_ERROR)
            bt.err = "error reply from task.lua";
    }
    if (!(op->get && bt.exists && bt.budget > 0 && task_read_budget(op, &bt) == 0))
        op->cb(op->ud, &bt);
    free(op);
}

static int redis_task(struct backend *be, enum backend_task_op op, const char *id,
                      const char *reason, bool ok, const char *app, bool admin, double budget,
                      struct backend_task *now_bt, backend_task_cb *cb, void *ud)
{
    struct backend_redis *sh = (struct backend_redis *)be;
    char key[SHARED_KEY_MAX], ttl[32], money[32];
    struct task_op *q = malloc(sizeof(*q));
    (void)now_bt;

    if (!q || sh->closing) {
        free(q);
        return -1;
    }
    *q = (struct task_op){ .cb = cb, .ud = ud, .sh = sh, .get = op == BACKEND_TASK_GET };
    snprintf(q->id, sizeof(q->id), "%s", id);
    snprintf(key, sizeof(key), "{%s:task:%s}", sh->cfg->redis_prefix, id);
    fmt_num(ttl, sizeof(ttl), ceil(sh->cfg->task_ttl_s));
    const char *argv[] = { key,
                           task_lua_op[op],
                           id,
                           ttl,
                           reason ? reason : "",
                           ok ? "1" : "0",
                           sh->channel[CH_TASK_END],
                           app ? app : "",
                           admin ? "1" : "0",
                           money };
    snprintf(money, sizeof(money), "%.17g", budget > 0 ? budget : 0);
    if (sh_eval(sh, RDS_TASK, 1, 10, argv, on_task_reply, q) < 0) {
        free(q);
        return -1;
    }
    return 0;
}

/* --- connection events ------------------------------------------------- */

/* Task stops published while this sidecar could not listen or could not
 * act on them are lost: once both connections are up again, re-read the
 * running tasks held here. */
static void maybe_resync(struct backend_redis *sh)
{
    if (!sh->resync || sh->closing || sh->starting || !sh_up(sh) || !sh_subscribed(sh))
        return;
    sh->resync = false;
    sh->resyncs++;
    if (sh->be.hooks.on_resync)
        sh->be.hooks.on_resync(sh->be.hooks.ud);
}

/* A task update failed while the connections may still be up (a timeout
 * or an error reply): try again in a while, not at once (a persistent error
 * must not loop), and at the latest when the connections come back. */
static void on_later(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct backend_redis *sh = w->data;
    (void)loop;
    (void)revents;
    if (sh->closing || !sh_up(sh))
        return; /* on_up does it */
    /* Failing again and again (an error reply, not a lost connection)
     * backs off: 1 s doubling to 60 s, reset by a reconnection. */
    sh->later_delay = fmin(sh->later_delay * 2, SHARED_RETRY_LATER_MAX_S);
    if (sh->be.hooks.on_up)
        sh->be.hooks.on_up(sh->be.hooks.ud);
    maybe_resync(sh);
}

static void redis_retry_later(struct backend *be, bool resync)
{
    struct backend_redis *sh = (struct backend_redis *)be;

    if (sh->closing)
        return;
    if (resync)
        sh->resync = true;
    if (!ev_is_active(&sh->later_w)) {
        ev_timer_set(&sh->later_w, sh->later_delay, 0.);
        ev_timer_start(sh->loop, &sh->later_w);
    }
}

static bool redis_is_closing(const struct backend *be)
{
    return ((const struct backend_redis *)be)->closing;
}

static void on_up(struct rds *r, void *ud)
{
    struct backend_redis *sh = ud;
    (void)r;
    sh->later_delay = SHARED_RETRY_LATER_S;
    if (sh->closing || sh->starting)
        return;
    if (sh->be.hooks.on_up)
        sh->be.hooks.on_up(sh->be.hooks.ud);
    maybe_resync(sh);
}

static void on_down(struct rds *r, const char *why, void *ud)
{
    (void)r;
    (void)why;
    (void)ud;
}

static void on_subscribed(struct rds *r, void *ud)
{
    struct backend_redis *sh = ud;
    (void)r;
    sh->resync = true;
    maybe_resync(sh);
    /* Cache purges published meanwhile are lost too: the memory tier goes
     * (Redis still holds what was not purged). */
    if (sh->be.hooks.on_cache_purged)
        sh->be.hooks.on_cache_purged(sh->be.hooks.ud, NULL, NULL, true);
}

static void on_unsubscribed(struct rds *r, void *ud)
{
    struct backend_redis *sh = ud;
    (void)r;
    scopes_clear(sh); /* marks may be missed from now on */
}

static void on_cache_purge_message(struct backend_redis *sh, char *msg);

static void on_message(struct rds *r, size_t channel, const char *msg, size_t len, void *ud)
{
    struct backend_redis *sh = ud;
    char buf[SHARED_KEY_MAX];
    (void)r;

    if (sh->closing || sh->starting || len >= sizeof(buf) || memchr(msg, '\0', len))
        return;
    memcpy(buf, msg, len);
    buf[len] = '\0';
    if (channel == CH_PROGRESS) {
        /* Only scopes this sidecar works with: the cache is not the fleet's. */
        struct scope_slot *s = scope_find(sh, buf);
        if (s) { /* the freshest news: a fetch in flight is then ignored */
            bool was_fetching = s->state == SCOPE_FETCHING;
            s->state = SCOPE_KNOWN;
            s->last_at = ev_now(sh->loop);
            if (was_fetching && sh->be.hooks.on_progress_known)
                sh->be.hooks.on_progress_known(sh->be.hooks.ud, buf);
        }
    } else if (channel == CH_TASK_END) {
        if (sh->be.hooks.on_task_ended)
            sh->be.hooks.on_task_ended(sh->be.hooks.ud, buf);
    } else if (channel == CH_CACHE_PURGE) {
        on_cache_purge_message(sh, buf);
    }
}

/* A cluster runs a script only when its keys share one slot. admit.lua and
 * release.lua for an app with limits of its own take the source's and the
 * app's keys: with a prefix that has no hash tag of its own these span
 * slots (CROSSSLOT), so such a configuration is refused at start-up rather
 * than failing every such call (tests/redis/README.md, "Redis Cluster").
 * Budgets need no such thing: budget.lua takes their keys one slot at a
 * time there (spend_one_slot). */
static int cluster_check_slots(const struct backend_redis *sh, char *err, size_t errlen)
{
    const struct config *cfg = sh->cfg;
    char key[SHARED_KEY_MAX];

    for (size_t i = 0; i < cfg->n_apps; i++) {
        bool limits = sh->apps[i].own.on || sh->apps[i].caps || sh->apps[i].io.on;
        snprintf(key, sizeof(key), "{%s:app:%s}", cfg->redis_prefix, cfg->apps[i].name);
        for (size_t j = 0; limits && j < cfg->n_sources; j++) {
            const char *k = sh->src[j].breaker;
            if (rcl_keyslot(key, strlen(key)) != rcl_keyslot(k, strlen(k))) {
                snprintf(err, errlen,
                         "redis backend: app '%s' has limits of its own, and in a cluster its "
                         "keys and source '%s''s are in different hash slots; give "
                         "backend.prefix a hash tag (e.g. \"{%s}\") to keep them in one",
                         cfg->apps[i].name, cfg->sources[j].name, cfg->redis_prefix);
                return -1;
            }
        }
    }
    return 0;
}

static void startup_wait_done(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)w;
    (void)revents;
}

/* At start-up, up to command_timeout_s for the first answer of Redis, so
 * that a server of the wrong kind (a cluster node behind backend.url, a
 * seed without cluster support behind backend.cluster) stops the start
 * with the reason instead of leaving a sidecar that is never ready. A
 * Redis that does not answer in time is no error: the backend fails
 * closed until it does, as always. The loop has only the backend's
 * watchers yet. */
/* After start-up: what the hooks missed while startup_check() ran. */
static void on_started(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct backend_redis *sh = w->data;
    (void)loop;
    (void)revents;
    if (sh->closing || !sh_up(sh))
        return;
    if (sh_subscribed(sh))
        sh->resync = true;
    on_up(NULL, sh);
}

static int startup_check(struct backend_redis *sh, char *err, size_t errlen)
{
    ev_timer guard;
    const char *bad = NULL;

    sh->starting = true;

    ev_timer_init(&guard, startup_wait_done, sh->cfg->redis_command_timeout_s, 0.);
    ev_timer_start(sh->loop, &guard);
    for (;;) {
        bad = sh->cl ? rcl_mode_error(sh->cl) : rds_mode_error(sh->rds);
        if (bad || sh_up(sh) || !ev_is_active(&guard) ||
            (sh->rds && rds_get_stats(sh->rds)->connect_failures > 0))
            break;
        ev_run(sh->loop, EVRUN_ONCE);
    }
    ev_timer_stop(sh->loop, &guard);
    sh->starting = false;
    ev_timer_set(&sh->start_w, 0., 0.);
    ev_timer_start(sh->loop, &sh->start_w);
    if (!bad)
        return 0;
    snprintf(err, errlen, "redis backend: %s", bad);
    return -1;
}

/* --- set-up ------------------------------------------------------------ */

/* Group `g` for figures `conc`, `lim` under `tag` (the app's hash tag, with
 * a key suffix: "" or ":cap:NAME"). */
static void limit_keys_init(struct limit_keys *g, const char *label, const char *tag,
                            const char *sub, uint32_t conc, const struct config_limits *lim)
{
    g->label = label;
    g->on = conc > 0 || lim->rpm > 0 || lim->tpm > 0 || lim->daily_tokens > 0;
    g->leases_on = conc > 0;
    snprintf(g->leases, sizeof(g->leases), "%s%s:leases", tag, sub);
    snprintf(g->rpm, sizeof(g->rpm), "%s%s:rpm", tag, sub);
    snprintf(g->tpm, sizeof(g->tpm), "%s%s:tpm", tag, sub);
    snprintf(g->daily, sizeof(g->daily), "%s%s:daily", tag, sub);
    fmt_num(g->a_conc, sizeof(g->a_conc), conc);
    fmt_num(g->a_rpm, sizeof(g->a_rpm), (double)lim->rpm);
    fmt_num(g->a_win, sizeof(g->a_win), lim->window_s * 1000.0);
    fmt_num(g->a_tpm, sizeof(g->a_tpm), (double)lim->tpm);
    fmt_num(g->a_daily, sizeof(g->a_daily), (double)lim->daily_tokens);
}

/* The io key of a holder's itpm / otpm (`lim`) under `tag` (its hash tag). */
static void io_keys_init(struct io_keys *io, const char *label, const char *tag,
                         const struct config_limits *lim)
{
    io->on = lim->itpm > 0 || lim->otpm > 0;
    io->label = label;
    snprintf(io->key, sizeof(io->key), "%s:io", tag);
    fmt_num(io->a_itpm, sizeof(io->a_itpm), (double)lim->itpm);
    fmt_num(io->a_otpm, sizeof(io->a_otpm), (double)lim->otpm);
    fmt_num(io->a_win, sizeof(io->a_win), lim->window_s * 1000.0);
}

/* The keys of every app's limits: {P:app:A}:leases|rpm|tpm|daily|io and
 * {P:app:A}:cap:C:leases|… (the app's hash tag: one slot per app). */
static int apps_keys_init(struct backend_redis *sh)
{
    const struct config *cfg = sh->cfg;
    char tag[SHARED_KEY_MAX / 2], sub[CONFIG_NAME_MAX + 8];

    for (size_t i = 0; i < cfg->n_apps; i++) {
        const struct config_app *a = &cfg->apps[i];
        struct app_keys *ak = &sh->apps[i];
        snprintf(tag, sizeof(tag), "{%s:app:%s}", cfg->redis_prefix, a->name);
        limit_keys_init(&ak->own, "app", tag, "", a->max_concurrency, &a->limits);
        io_keys_init(&ak->io, "app", tag, &a->limits);
        if (!a->per_capability)
            continue;
        ak->caps = calloc(cfg->n_capabilities ? cfg->n_capabilities : 1, sizeof(*ak->caps));
        if (!ak->caps)
            return -1;
        for (size_t c = 0; c < cfg->n_capabilities; c++) {
            const struct config_app_limits *pc = &a->per_capability[c];
            snprintf(sub, sizeof(sub), ":cap:%s", cfg->capabilities[c].name);
            limit_keys_init(&ak->caps[c], "app_cap", tag, sub, pc->max_concurrency, &pc->limits);
        }
    }
    return 0;
}

static void redis_free(struct backend *be);

static const struct gov_backend *redis_progress(struct backend *be)
{
    return &((struct backend_redis *)be)->progress;
}

static bool redis_is_up(const struct backend *be)
{
    const struct backend_redis *sh = (const struct backend_redis *)be;
    return !sh->closing && sh_up(sh);
}

static const char *redis_down_reason(const struct backend *be, const char **detail)
{
    const struct backend_redis *sh = (const struct backend_redis *)be;
    if (sh->cl) {
        /* The reason stays one of a few words a probe can match; the
         * cluster's own (no map, a slot without primary, a primary not
         * connected) is the detail, or its last error when it has none. */
        const char *why = rcl_down_why(sh->cl);
        *detail = why[0] ? why : rcl_last_error(sh->cl);
        return rcl_mode_error(sh->cl) ? "redis misconfigured" : "redis unreachable";
    }
    *detail = sh->rds ? rds_last_error(sh->rds) : "";
    if (sh->rds && rds_mode_error(sh->rds))
        return "redis misconfigured";
    return "redis unreachable";
}

static const char *redis_breaker_state(const struct backend *be, size_t source)
{
    return ((const struct backend_redis *)be)->src[source].breaker_state;
}

/* The display arrays for `cfg`'s apps and sources (budget_view); false
 * out of memory (then none is shown). */
static bool views_make(struct backend_redis *sh, const struct config *cfg)
{
    free(sh->view_app);
    free(sh->view_src);
    sh->view_gen++;
    sh->view_app = calloc(cfg->n_apps ? cfg->n_apps : 1, sizeof(*sh->view_app));
    sh->view_src = calloc(cfg->n_sources ? cfg->n_sources : 1, sizeof(*sh->view_src));
    sh->n_view_app = sh->view_app ? cfg->n_apps : 0;
    sh->n_view_src = sh->view_src ? cfg->n_sources : 0;
    return sh->view_app && sh->view_src;
}

static void redis_rebind(struct backend *be, const struct config *cfg)
{
    struct backend_redis *sh = (struct backend_redis *)be;

    sh->cfg = cfg;
    (void)views_make(sh, cfg); /* limits may have changed: read again */
}

/* --- budgets in currency (budget.lua, docs/CONFIG.md §12a) ------------- */

struct backend_spend {
    struct backend_redis *sh;
    backend_spend_cb *cb;
    void *ud; /* NULL once detached */
    size_t app, source;
    double amount;
    bool has_task;
    bool chained;                   /* a cluster: one key after the other (spend_one_slot) */
    int next;                       /* chained: the key being reserved */
    struct backend_spend_task task; /* task.id points at task_id */
    char task_id[TASK_ID_MAX + 1];
};

/* budget.lua's KEYS and ARGV for app `app` and source `source` (SIZE_MAX:
 * not that one) and task run `task` (NULL: none) with op `op`, `amount`
 * and `actual`: the strings in `buf`. Returns the number of keys (0: none
 * has a budget). */
#define SPEND_KEYS 3
struct spend_args {
    char keys[SPEND_KEYS][SHARED_KEY_MAX];
    char num[2 + SPEND_KEYS * 4][32];
    const char *argv[SPEND_KEYS + 3 + SPEND_KEYS * 4];
    const char *which[SPEND_KEYS];
    int nkeys, argc;
};

static int spend_args(const struct backend_redis *sh, size_t app, size_t source,
                      const struct backend_spend_task *task, const char *op, double amount,
                      double actual, struct spend_args *a)
{
    const struct config *cfg = sh->cfg;
    const struct budget_limits *lim[SPEND_KEYS];
    struct budget_limits task_lim = { { 0, 0, task ? task->limit : 0 }, 0 };
    int n = 0;

    if (app < cfg->n_apps && budget_is_set(&cfg->apps[app].budget)) {
        snprintf(a->keys[n], sizeof(a->keys[n]), "{%s:app:%s}:budget", cfg->redis_prefix,
                 cfg->apps[app].name);
        lim[n] = &cfg->apps[app].budget;
        a->which[n++] = "app";
    }
    if (source < cfg->n_sources && budget_is_set(&cfg->sources[source].budget)) {
        snprintf(a->keys[n], sizeof(a->keys[n]), "{%s:source:%s}:budget", cfg->redis_prefix,
                 cfg->sources[source].name);
        lim[n] = &cfg->sources[source].budget;
        a->which[n++] = "source";
    }
    if (task && task->limit > 0) {
        /* The task record's hash tag: one slot with it. */
        snprintf(a->keys[n], sizeof(a->keys[n]), "{%s:task:%s}:budget:%llu", cfg->redis_prefix,
                 task->id, (unsigned long long)task->run);
        lim[n] = &task_lim;
        a->which[n++] = "task";
    }
    a->nkeys = n;
    a->argc = 0;
    for (int k = 0; k < n; k++)
        a->argv[a->argc++] = a->keys[k];
    snprintf(a->num[0], sizeof(a->num[0]), "%.17g", amount);
    if (isnan(actual))
        snprintf(a->num[1], sizeof(a->num[1]), "nan");
    else
        snprintf(a->num[1], sizeof(a->num[1]), "%.17g", actual);
    a->argv[a->argc++] = op;
    a->argv[a->argc++] = a->num[0];
    a->argv[a->argc++] = a->num[1];
    for (int k = 0; k < n; k++) {
        char(*v)[32] = &a->num[2 + 4 * k];
        for (int w = 0; w < BUDGET_WINDOWS; w++) {
            snprintf(v[w], sizeof(v[w]), "%.17g", lim[k]->limit[w]);
            a->argv[a->argc++] = v[w];
        }
        snprintf(v[3], sizeof(v[3]), "%d", (int)lim[k]->utc_offset_s);
        a->argv[a->argc++] = v[3];
    }
    return n;
}

/* A cluster runs budget.lua only on keys of one slot. An app's, a
 * source's and a task run's budgets hash apart (unless the prefix has a
 * hash tag of its own), so there a reservation takes the keys one after
 * the other, each all-or-nothing, and gives back the ones it took when a
 * later one refuses: a budget is never overspent, and a refused call holds
 * another budget's reservation for one round trip at most. Settles and
 * peeks, which refuse nothing, go one key a call. */
static bool spend_one_slot(const struct backend_redis *sh, const char (*keys)[SHARED_KEY_MAX],
                           size_t n)
{
    if (!sh->cl || n < 2)
        return true;
    unsigned slot = rcl_keyslot(keys[0], strlen(keys[0]));
    for (size_t k = 1; k < n; k++)
        if (rcl_keyslot(keys[k], strlen(keys[k])) != slot)
            return false;
    return true;
}

/* budget.lua's ARGV for key `k` of `a` alone: its key, the op, the two
 * amounts, then that key's four limit figures. */
#define SPEND_ONE_ARGC 8
static void spend_args_one(const struct spend_args *a, int k, const char **argv)
{
    int n = a->nkeys;
    argv[0] = a->keys[k];
    for (int i = 0; i < 3; i++)
        argv[1 + i] = a->argv[n + i];
    for (int i = 0; i < 4; i++)
        argv[4 + i] = a->argv[n + 3 + 4 * k + i];
}

static void on_spend_settled(const redisReply *r, const char *err, void *ud)
{
    if (!r || r->type != REDIS_REPLY_ARRAY)
        count_write_error(ud, "budget settle", err);
}

/* Settles keys [0, upto) of `a` (every key: upto = a->nkeys). */
static void spend_settle_args(struct backend_redis *sh, struct spend_args *a, int upto)
{
    if (upto == a->nkeys && spend_one_slot(sh, a->keys, (size_t)a->nkeys)) {
        if (sh_eval(sh, RDS_BUDGET, a->nkeys, a->argc, a->argv, on_spend_settled, sh) < 0)
            count_write_error(sh, "budget settle", "not connected");
        return;
    }
    for (int k = 0; k < upto; k++) {
        const char *one[SPEND_ONE_ARGC];
        spend_args_one(a, k, one);
        if (sh_eval(sh, RDS_BUDGET, 1, SPEND_ONE_ARGC, one, on_spend_settled, sh) < 0)
            count_write_error(sh, "budget settle", "not connected");
    }
}

static void redis_spend_settle(struct backend *be, size_t app, size_t source,
                               const struct backend_spend_task *task, double reserved,
                               double actual)
{
    struct backend_redis *sh = (struct backend_redis *)be;
    struct spend_args a;

    if (spend_args(sh, app, source, task, "settle", reserved, actual, &a) == 0)
        return;
    spend_settle_args(sh, &a, a.nkeys);
}

/* Gives back what a chained reservation `s` took: its keys before `upto`. */
static void spend_give_back(struct backend_spend *s, int upto)
{
    struct spend_args a;

    if (upto > 0 &&
        spend_args(s->sh, s->app, s->source, s->has_task ? &s->task : NULL, "settle", s->amount,
                   NAN, &a) > 0)
        spend_settle_args(s->sh, &a, upto);
}

static void on_spend_reserved(const redisReply *r, const char *err, void *ud);

/* Sends the reservation of `s`: every key in one call, or (chained) key
 * s->next alone. -1 when it could not be sent. */
static int spend_send_reserve(struct backend_spend *s)
{
    struct spend_args a;

    if (spend_args(s->sh, s->app, s->source, s->has_task ? &s->task : NULL, "reserve", s->amount,
                   NAN, &a) == 0)
        return -1;
    if (!s->chained)
        return sh_eval(s->sh, RDS_BUDGET, a.nkeys, a.argc, a.argv, on_spend_reserved, s);
    const char *one[SPEND_ONE_ARGC];
    spend_args_one(&a, s->next, one);
    return sh_eval(s->sh, RDS_BUDGET, 1, SPEND_ONE_ARGC, one, on_spend_reserved, s);
}

static void on_spend_reserved(const redisReply *r, const char *err, void *ud)
{
    struct backend_spend *s = ud;
    struct backend_redis *sh = s->sh;
    long long ok = -1;
    int rc = -1;
    const char *which = err ? err : "bad reply", *window = "";
    double left = 0, retry_s = -1;

    if (r && r->type == REDIS_REPLY_ARRAY && r->elements >= 1 && reply_is_int(r->element[0], &ok)) {
        rc = ok == 1 ? 1 : 0;
        if (rc == 0 && r->elements == 5) {
            struct spend_args a;
            long long k = 0;
            int n = spend_args(sh, s->app, s->source, s->has_task ? &s->task : NULL, "reserve", 0,
                               NAN, &a);
            reply_is_int(r->element[1], &k);
            if (s->chained) /* one key was asked: the one refusing */
                k = k == 1 ? s->next + 1 : 0;
            which = k >= 1 && k <= n ? a.which[k - 1] : "app";
            window = r->element[2]->type == REDIS_REPLY_STRING ? r->element[2]->str : "total";
            left = reply_num(r->element[3]);
            double ms = reply_num(r->element[4]);
            retry_s = ms >= 0 ? ms / 1000.0 : -1;
        } else if (rc == 0) {
            rc = -1;
        }
    }
    if (s->chained) {
        struct spend_args a;
        int n =
            spend_args(sh, s->app, s->source, s->has_task ? &s->task : NULL, "reserve", 0, NAN, &a);
        int held = s->next + (rc == 1); /* keys reserved so far */
        if (rc == 1 && held < n && s->ud && !sh->closing) {
            s->next++; /* on to the next key */
            if (spend_send_reserve(s) == 0)
                return;
            s->next--;
            rc = -1;
            which = "not connected";
        }
        if (!(rc == 1 && held == n && s->ud)) {
            /* Refused, failed, or the caller gone: give back what is held. */
            spend_give_back(s, held);
            if (rc == 1) {
                rc = -1;
                which = "closing";
            }
        }
    } else if (!s->ud) {
        if (rc == 1) /* the caller is gone: give it back */
            redis_spend_settle(&sh->be, s->app, s->source, s->has_task ? &s->task : NULL, s->amount,
                               NAN);
    }
    if (s->ud)
        s->cb(s->ud, rc, which, window, left, retry_s);
    free(s);
}

static int redis_spend_reserve(struct backend *be, size_t app, size_t source,
                               const struct backend_spend_task *task, double amount,
                               backend_spend_cb *cb, void *ud, struct backend_spend **pending)
{
    struct backend_redis *sh = (struct backend_redis *)be;
    struct spend_args a;
    struct backend_spend *s;

    *pending = NULL;
    if (sh->closing || !sh_up(sh) ||
        spend_args(sh, app, source, task, "reserve", amount, NAN, &a) == 0 ||
        !(s = malloc(sizeof(*s))))
        return -1;
    *s = (struct backend_spend){ .sh = sh,
                                 .cb = cb,
                                 .ud = ud,
                                 .app = app,
                                 .source = source,
                                 .amount = amount,
                                 .has_task = task != NULL,
                                 .chained = !spend_one_slot(sh, a.keys, (size_t)a.nkeys) };
    if (task) {
        snprintf(s->task_id, sizeof(s->task_id), "%s", task->id);
        s->task = *task;
        s->task.id = s->task_id;
    }
    if (spend_send_reserve(s) < 0) {
        free(s);
        return -1;
    }
    *pending = s;
    return 0;
}

static void redis_spend_detach(struct backend *be, struct backend_spend *s)
{
    (void)be;
    s->ud = NULL;
}

/* --- the fleet's budgets for display (budget.lua peek) ------------------ */

/* One peek: the budgets it read, in KEYS' order (index, or ~index for a
 * source), and the arrays' generation it was sent for. */
struct budget_peek {
    struct backend_redis *sh;
    unsigned gen;
    size_t n;
    size_t who[]; /* app i: i; source i: SIZE_MAX - i */
};

static void on_budget_peek(const redisReply *r, const char *err, void *ud)
{
    struct budget_peek *p = ud;
    struct backend_redis *sh = p->sh;
    const struct config *cfg = sh->cfg;

    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 6 * p->n) {
        /* Shown as last read; the next peek tries again. */
        log_at(LOG_DEBUG, "backend could not read the budgets", "error", LOG_S,
               err ? err : "bad reply", NULL);
    } else if (p->gen == sh->view_gen) {
        for (size_t k = 0; k < p->n; k++) {
            bool app = p->who[k] < SIZE_MAX / 2;
            size_t i = app ? p->who[k] : SIZE_MAX - p->who[k];
            struct budget_view *v = app ? &sh->view_app[i] : &sh->view_src[i];
            const redisReply *const *e = (const redisReply *const *)&r->element[6 * k];
            v->b.p = app ? cfg->apps[i].budget : cfg->sources[i].budget;
            for (int w = 0; w < BUDGET_WINDOWS; w++)
                v->b.spent[w] = reply_num(e[w]);
            v->b.reserved = reply_num(e[3]);
            v->b.ends_at[0] = reply_num(e[4]) / 1000.0;
            v->b.ends_at[1] = reply_num(e[5]) / 1000.0;
            v->known = true;
        }
    }
    free(p);
}

/* Reads every app's and source's budget of the fleet in one script call. */
static void peek_budgets(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct backend_redis *sh = w->data;
    const struct config *cfg = sh->cfg;
    size_t n = 0, na = sh->n_view_app, ns = sh->n_view_src;
    (void)loop;
    (void)revents;

    if (sh->closing || !sh_up(sh))
        return;
    for (size_t i = 0; i < na; i++)
        n += budget_is_set(&cfg->apps[i].budget);
    for (size_t i = 0; i < ns; i++)
        n += budget_is_set(&cfg->sources[i].budget);
    if (n == 0)
        return;
    struct budget_peek *p = malloc(sizeof(*p) + n * sizeof(size_t));
    char(*keys)[SHARED_KEY_MAX] = malloc(n * sizeof(*keys));
    char(*num)[32] = malloc(4 * n * sizeof(*num));
    const char **argv = malloc((n + 3 + 4 * n) * sizeof(*argv));
    if (!p || !keys || !num || !argv) {
        free(p);
        goto out;
    }
    *p = (struct budget_peek){ .sh = sh, .gen = sh->view_gen, .n = n };
    size_t k = 0;
    for (size_t i = 0; i < na + ns; i++) {
        bool app = i < na;
        size_t j = app ? i : i - na;
        const struct budget_limits *lim = app ? &cfg->apps[j].budget : &cfg->sources[j].budget;
        if (!budget_is_set(lim))
            continue;
        snprintf(keys[k], sizeof(keys[k]), "{%s:%s:%s}:budget", cfg->redis_prefix,
                 app ? "app" : "source", app ? cfg->apps[j].name : cfg->sources[j].name);
        for (int x = 0; x < BUDGET_WINDOWS; x++)
            snprintf(num[4 * k + (size_t)x], sizeof(num[0]), "%.17g", lim->limit[x]);
        snprintf(num[4 * k + 3], sizeof(num[0]), "%d", (int)lim->utc_offset_s);
        p->who[k++] = app ? j : SIZE_MAX - j;
    }
    if (!spend_one_slot(sh, keys, n)) {
        /* A cluster, keys of several slots: a peek of each alone. */
        for (k = 0; k < n; k++) {
            struct budget_peek *one = malloc(sizeof(*one) + sizeof(size_t));
            if (!one)
                break;
            *one = (struct budget_peek){ .sh = sh, .gen = sh->view_gen, .n = 1 };
            one->who[0] = p->who[k];
            const char *a1[SPEND_ONE_ARGC] = { keys[k],        "peek",        "0",
                                               "nan",          num[4 * k],    num[4 * k + 1],
                                               num[4 * k + 2], num[4 * k + 3] };
            if (sh_eval(sh, RDS_BUDGET, 1, SPEND_ONE_ARGC, a1, on_budget_peek, one) < 0)
                free(one);
        }
        free(p);
        goto out;
    }
    int argc = 0;
    for (k = 0; k < n; k++)
        argv[argc++] = keys[k];
    argv[argc++] = "peek";
    argv[argc++] = "0";
    argv[argc++] = "nan";
    for (k = 0; k < 4 * n; k++)
        argv[argc++] = num[k];
    if (sh_eval(sh, RDS_BUDGET, (int)n, argc, argv, on_budget_peek, p) < 0)
        free(p);
out:
    free(keys);
    free(num);
    free(argv);
}

static struct budget *redis_budget_view(struct backend *be, bool of_app, size_t i)
{
    struct backend_redis *sh = (struct backend_redis *)be;
    struct budget_view *v = of_app ? sh->view_app : sh->view_src;

    if (i >= (of_app ? sh->n_view_app : sh->n_view_src) || !v[i].known ||
        !budget_is_set(of_app ? &sh->cfg->apps[i].budget : &sh->cfg->sources[i].budget))
        return NULL;
    return &v[i].b;
}


/* --- response ids ------------------------------------------------------ */

/* {P:resp:ID}: the name of the source that produced response ID, with
 * the TTL of responses.remember_s. One key per id: SET and GET, no script. */
static void resp_key(const struct backend_redis *sh, const char *id, char *key, size_t len)
{
    snprintf(key, len, "{%s:resp:%s}", sh->cfg->redis_prefix, id);
}

static void on_remembered(const redisReply *r, const char *err, void *ud)
{
    if (!r || r->type != REDIS_REPLY_STATUS)
        count_write_error(ud, "remember response", err);
}

static void redis_remember_response(struct backend *be, const char *id, const char *source,
                                    double ttl_s, size_t max)
{
    struct backend_redis *sh = (struct backend_redis *)be;
    char key[SHARED_KEY_MAX], ttl[32];
    (void)max; /* Redis evicts by TTL (and its own maxmemory policy) */

    if (sh->closing)
        return;
    resp_key(sh, id, key, sizeof(key));
    fmt_num(ttl, sizeof(ttl), ttl_s * 1000.0 >= 1 ? ttl_s * 1000.0 : 1);
    const char *argv[] = { "SET", key, source, "PX", ttl };
    if (sh_command(sh, 5, argv, NULL, on_remembered, sh) < 0)
        count_write_error(sh, "remember response", "not connected");
}

struct recall {
    backend_respid_cb *cb;
    void *ud;
};

static void on_recalled(const redisReply *r, const char *err, void *ud)
{
    struct recall q = *(struct recall *)ud;

    free(ud);
    if (r && r->type == REDIS_REPLY_STRING)
        q.cb(q.ud, 1, r->str);
    else if (r && r->type == REDIS_REPLY_NIL)
        q.cb(q.ud, 0, NULL);
    else
        q.cb(q.ud, -1, err ? err : "bad reply");
}

static int redis_recall_response(struct backend *be, const char *id, char *source, size_t cap,
                                 backend_respid_cb *cb, void *ud)
{
    struct backend_redis *sh = (struct backend_redis *)be;
    char key[SHARED_KEY_MAX];
    struct recall *q;
    (void)source;
    (void)cap;

    if (sh->closing || !(q = malloc(sizeof(*q))))
        return -1;
    q->cb = cb;
    q->ud = ud;
    resp_key(sh, id, key, sizeof(key));
    const char *argv[] = { "GET", key };
    if (sh_command(sh, 2, argv, NULL, on_recalled, q) < 0) {
        free(q);
        return -1;
    }
    return 0;
}

/* --- response cache ---------------------------------------------------- */

/* {P:cache:HEX}: one cached answer (the bytes call.c made of it), with the
 * entry's TTL. One key per entry, its own hash slot: SET PX and GET. */
static void cache_rkey(const struct backend_redis *sh, const char *hex, char *key, size_t len)
{
    snprintf(key, len, "{%s:cache:%s}", sh->cfg->redis_prefix, hex);
}

/* {P:cache:HEX}:lock: held (SET NX PX) by the sidecar whose call is
 * upstream for the entry; the same hash slot as the entry. */
static void cache_lock_key(const struct backend_redis *sh, const char *hex, char *key, size_t len)
{
    snprintf(key, len, "{%s:cache:%s}:lock", sh->cfg->redis_prefix, hex);
}

static void on_cache_unlocked(const redisReply *r, const char *err, void *ud)
{
    if (!r || r->type != REDIS_REPLY_INTEGER)
        count_write_error(ud, "cache unlock", err);
}

static void on_cache_stored(const redisReply *r, const char *err, void *ud)
{
    if (!r || r->type != REDIS_REPLY_STATUS)
        count_write_error(ud, "cache store", err);
}

static void redis_cache_put(struct backend *be, const char *hex, const char *value, size_t len,
                            double ttl_s)
{
    struct backend_redis *sh = (struct backend_redis *)be;
    char key[SHARED_KEY_MAX], ttl[32];

    if (sh->closing)
        return;
    cache_rkey(sh, hex, key, sizeof(key));
    fmt_num(ttl, sizeof(ttl), ttl_s * 1000.0 >= 1 ? ttl_s * 1000.0 : 1);
    const char *argv[] = { "SET", key, value, "PX", ttl };
    const size_t argvlen[] = { 3, strlen(key), len, 2, strlen(ttl) };
    if (sh_command(sh, 5, argv, argvlen, on_cache_stored, sh) < 0)
        count_write_error(sh, "cache store", "not connected");
}

struct cache_lookup {
    backend_cache_cb *cb;
    void *ud;
    char token[BACKEND_LOCK_TOKEN_MAX]; /* a lock's */
};

/* MGET entry lock: [value or nil, holder or nil]. */
static void on_cache_got(const redisReply *r, const char *err, void *ud)
{
    struct cache_lookup q = *(struct cache_lookup *)ud;

    free(ud);
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2)
        q.cb(q.ud, -1, err ? err : "bad reply", 0);
    else if (r->element[0]->type == REDIS_REPLY_STRING)
        q.cb(q.ud, 1, r->element[0]->str, r->element[0]->len);
    else
        q.cb(q.ud, r->element[1]->type == REDIS_REPLY_STRING ? 0 : 2, NULL, 0);
}

static void on_cache_locked(const redisReply *r, const char *err, void *ud)
{
    struct cache_lookup *q = ud;

    if (r && r->type == REDIS_REPLY_STATUS)
        q->cb(q->ud, 1, q->token, strlen(q->token));
    else if (r && r->type == REDIS_REPLY_NIL)
        q->cb(q->ud, 0, NULL, 0);
    else
        q->cb(q->ud, -1, err ? err : "bad reply", 0);
    free(q);
}

/* The lock's value is this holder's own token (the sidecar's id and a
 * counter, unique across the fleet), so that its release can tell its
 * own lock from the one another sidecar took after it expired. */
static int redis_cache_lock(struct backend *be, const char *hex, double ttl_s, backend_cache_cb *cb,
                            void *ud)
{
    struct backend_redis *sh = (struct backend_redis *)be;
    char key[SHARED_KEY_MAX + 8], ttl[32];
    struct cache_lookup *q;

    if (sh->closing || !(q = malloc(sizeof(*q))))
        return -1;
    q->cb = cb;
    q->ud = ud;
    snprintf(q->token, sizeof(q->token), "%s:%llu", sh->sidecar_id, ++sh->lease_seq);
    cache_lock_key(sh, hex, key, sizeof(key));
    fmt_num(ttl, sizeof(ttl), ttl_s * 1000.0 >= 1 ? ttl_s * 1000.0 : 1);
    const char *argv[] = { "SET", key, q->token, "NX", "PX", ttl };
    if (sh_command(sh, 6, argv, NULL, on_cache_locked, q) < 0) {
        free(q);
        return -1;
    }
    return 0;
}

/* Compare and delete, in one step on the server: a plain DEL by a holder
 * whose lock expired would drop the lock of the sidecar that took it
 * since. One key, so one hash slot; tiny enough to send whole (Redis
 * keeps the compiled script by its digest). */
static const char cache_unlock_lua[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end "
    "return 0";

static void redis_cache_unlock(struct backend *be, const char *hex, const char *token)
{
    struct backend_redis *sh = (struct backend_redis *)be;
    char key[SHARED_KEY_MAX + 8];

    if (sh->closing)
        return;
    cache_lock_key(sh, hex, key, sizeof(key));
    const char *argv[] = { "EVAL", cache_unlock_lua, "1", key, token };
    if (sh_command_key(sh, 3, 5, argv, NULL, on_cache_unlocked, sh) < 0)
        count_write_error(sh, "cache unlock", "not connected");
}

static int redis_cache_get(struct backend *be, const char *hex, backend_cache_cb *cb, void *ud)
{
    struct backend_redis *sh = (struct backend_redis *)be;
    char key[SHARED_KEY_MAX], lock[SHARED_KEY_MAX + 8];
    struct cache_lookup *q;

    if (sh->closing || !(q = malloc(sizeof(*q))))
        return -1;
    q->cb = cb;
    q->ud = ud;
    cache_rkey(sh, hex, key, sizeof(key));
    cache_lock_key(sh, hex, lock, sizeof(lock));
    const char *argv[] = { "MGET", key, lock };
    if (sh_command(sh, 3, argv, NULL, on_cache_got, q) < 0) {
        free(q);
        return -1;
    }
    return 0;
}

/* A purge of the shared tier: SCAN ... MATCH {P:cache:PATTERN} COUNT,
 * one batch at a time, each batch's keys dropped with UNLINK (their
 * memory is freed off Redis' main thread) before the next SCAN; then one
 * PUBLISH on P:cache-purge (this sidecar's id, the capability, the app;
 * "" = any) so every sidecar drops the same entries from its memory.
 * Never KEYS: each step is one short command, bounded by
 * command_timeout_s. The pattern ends in '}', so it never matches a
 * lock (`…}:lock`): a call upstream keeps its lock. A standalone server
 * holds every key; a cluster runs the same walk on each primary, its
 * UNLINKs split by hash slot (every entry is a slot of its own). */
#define CACHE_PURGE_COUNT "1000"

struct cache_purge_walk {
    struct backend_redis *sh;
    backend_purge_cb *cb;
    void *ud;
    size_t removed;
    size_t node;      /* a cluster: the primary walked (rcl_command_on) */
    size_t unlinking; /* a cluster: UNLINKs of one key each still out */
    const char *why;  /* a cluster: the first UNLINK that failed */
    char cursor[24];
    char match[SHARED_KEY_MAX];
    char msg[2 * CONFIG_NAME_MAX + 24];
};

static void purge_end(struct cache_purge_walk *w, int rc, const char *why)
{
    w->cb(w->ud, rc, w->removed, why);
    free(w);
}

static void on_purge_published(const redisReply *r, const char *err, void *ud)
{
    struct cache_purge_walk *w = ud;

    if (!r || r->type != REDIS_REPLY_INTEGER)
        purge_end(w, -1, err ? err : "bad reply to PUBLISH");
    else
        purge_end(w, 0, NULL);
}

static void purge_scan(struct cache_purge_walk *w);
static void on_purge_scanned(const redisReply *r, const char *err, void *ud);

/* SCAN from `cursor` on the server, or on the walk's primary. */
static int purge_send_scan(struct cache_purge_walk *w, const char *cursor)
{
    const char *argv[] = { "SCAN", cursor, "MATCH", w->match, "COUNT", CACHE_PURGE_COUNT };

    if (w->sh->cl)
        return rcl_command_on(w->sh->cl, w->node, 6, argv, NULL, on_purge_scanned, w);
    return rds_command(w->sh->rds, 6, argv, NULL, on_purge_scanned, w);
}

/* A cluster's UNLINK of one key (each entry is a slot of its own). */
static void on_purge_unlinked_one(const redisReply *r, const char *err, void *ud)
{
    struct cache_purge_walk *w = ud;

    if (!r || r->type != REDIS_REPLY_INTEGER)
        w->why = w->why ? w->why : err ? "an UNLINK failed" : "bad reply to UNLINK";
    else
        w->removed += r->integer > 0 ? (size_t)r->integer : 0;
    if (--w->unlinking > 0)
        return;
    if (w->why)
        purge_end(w, -1, w->why);
    else
        purge_scan(w);
}

static void on_purge_unlinked(const redisReply *r, const char *err, void *ud)
{
    struct cache_purge_walk *w = ud;

    if (!r || r->type != REDIS_REPLY_INTEGER) {
        purge_end(w, -1, err ? err : "bad reply to UNLINK");
        return;
    }
    w->removed += r->integer > 0 ? (size_t)r->integer : 0;
    purge_scan(w);
}

static void on_purge_scanned(const redisReply *r, const char *err, void *ud)
{
    struct cache_purge_walk *w = ud;

    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[0]->len >= sizeof(w->cursor) ||
        r->element[1]->type != REDIS_REPLY_ARRAY) {
        purge_end(w, -1, err ? err : "bad reply to SCAN");
        return;
    }
    memcpy(w->cursor, r->element[0]->str, r->element[0]->len);
    w->cursor[r->element[0]->len] = '\0';
    const redisReply *keys = r->element[1];
    if (keys->elements == 0) {
        purge_scan(w);
        return;
    }
    if (w->sh->cl) {
        for (size_t i = 0; i < keys->elements; i++) {
            if (keys->element[i]->type != REDIS_REPLY_STRING)
                continue;
            const char *argv[] = { "UNLINK", keys->element[i]->str };
            const size_t argvlen[] = { 6, keys->element[i]->len };
            if (sh_command(w->sh, 2, argv, argvlen, on_purge_unlinked_one, w) == 0)
                w->unlinking++;
            else if (!w->why)
                w->why = "not connected";
        }
        if (w->unlinking == 0)
            purge_end(w, -1, w->why ? w->why : "no key to unlink");
        return;
    }
    const char **argv = malloc((keys->elements + 1) * sizeof(*argv));
    size_t *argvlen = malloc((keys->elements + 1) * sizeof(*argvlen));
    int rc = -1;
    if (argv && argvlen) {
        argv[0] = "UNLINK";
        argvlen[0] = 6;
        size_t n = 1;
        for (size_t i = 0; i < keys->elements; i++) {
            if (keys->element[i]->type != REDIS_REPLY_STRING)
                continue;
            argv[n] = keys->element[i]->str;
            argvlen[n++] = keys->element[i]->len;
        }
        rc = rds_command(w->sh->rds, (int)n, argv, argvlen, on_purge_unlinked, w);
    }
    free(argv);
    free(argvlen);
    if (rc < 0)
        purge_end(w, -1, argv && argvlen ? "not connected" : "out of memory");
}

/* The next batch, or the end: the cursor is back at "0". */
static void purge_scan(struct cache_purge_walk *w)
{
    struct backend_redis *sh = w->sh;
    int rc;

    if (sh->closing) {
        purge_end(w, -1, "closed");
        return;
    }
    if (strcmp(w->cursor, "0") == 0 && sh->cl && ++w->node < rcl_primaries(sh->cl)) {
        rc = purge_send_scan(w, "0"); /* the next primary's keys */
    } else if (strcmp(w->cursor, "0") == 0) {
        const char *argv[] = { "PUBLISH", sh->channel[CH_CACHE_PURGE], w->msg };
        rc = sh_command(sh, 3, argv, NULL, on_purge_published, w);
    } else {
        rc = purge_send_scan(w, w->cursor);
    }
    if (rc < 0)
        purge_end(w, -1, "not connected");
}

static int redis_cache_purge(struct backend *be, const char *capability, const char *app,
                             backend_purge_cb *cb, void *ud)
{
    struct backend_redis *sh = (struct backend_redis *)be;
    char pattern[CACHE_SHARED_NAME_LEN + 1];
    struct cache_purge_walk *w;

    if (sh->closing || !sh_up(sh) || !(w = calloc(1, sizeof(*w))))
        return -1;
    w->sh = sh;
    w->cb = cb;
    w->ud = ud;
    /* The prefix holds no glob character (config.c, check_prefix). */
    cache_shared_pattern(capability, app, pattern);
    snprintf(w->match, sizeof(w->match), "{%s:cache:%s}", sh->cfg->redis_prefix, pattern);
    snprintf(w->msg, sizeof(w->msg), "%s\n%s\n%s", sh->sidecar_id, capability ? capability : "",
             app ? app : "");
    if (purge_send_scan(w, "0") < 0) {
        free(w);
        return -1;
    }
    return 0;
}

/* A purge message (redis_cache_purge): another sidecar's purge reaches
 * this one's memory tier. */
static void on_cache_purge_message(struct backend_redis *sh, char *msg)
{
    char *cap = strchr(msg, '\n'), *app = cap ? strchr(cap + 1, '\n') : NULL;

    if (!app)
        return;
    *cap++ = '\0';
    *app++ = '\0';
    if (strcmp(msg, sh->sidecar_id) == 0 || !sh->be.hooks.on_cache_purged)
        return; /* its own: the purging sidecar dropped them itself */
    sh->be.hooks.on_cache_purged(sh->be.hooks.ud, *cap ? cap : NULL, *app ? app : NULL, false);
}

static const struct fig_table redis_figures;

static const struct backend_ops redis_ops = {
    .name = "redis",
    .admit = redis_admit,
    .admit_detach = redis_admit_detach,
    .release = redis_release,
    .task = redis_task,
    .remember_response = redis_remember_response,
    .recall_response = redis_recall_response,
    .cache_get = redis_cache_get,
    .cache_put = redis_cache_put,
    .cache_lock = redis_cache_lock,
    .cache_unlock = redis_cache_unlock,
    .cache_purge = redis_cache_purge,
    .retry_later = redis_retry_later,
    .is_closing = redis_is_closing,
    .is_up = redis_is_up,
    .down_reason = redis_down_reason,
    .shared = true,
    .breaker_state = redis_breaker_state,
    .rebind = redis_rebind,
    .budget_view = redis_budget_view,
    .spend_reserve = redis_spend_reserve,
    .spend_detach = redis_spend_detach,
    .spend_settle = redis_spend_settle,
    .progress = redis_progress,
    .figures = &redis_figures,
    .free = redis_free,
};

struct backend *backend_redis_new(struct ev_loop *loop, const struct config *cfg,
                                  const struct backend_hooks *hooks, char *err, size_t errlen)
{
    unsigned char rnd[8];
    struct backend_redis *sh = calloc(1, sizeof(*sh));

    if (!sh) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    sh->be.ops = &redis_ops;
    sh->be.hooks = *hooks;
    sh->loop = loop;
    sh->queue_tail = &sh->queue;
    sh->rq_tail = &sh->rq;
    sh->flushed_iter = UINT_MAX;
    ev_prepare_init(&sh->turn_w, on_turn_flush);
    ev_set_priority(&sh->turn_w, EV_MAXPRI); /* before redis.c's write of the turn */
    sh->turn_w.data = sh;
    sh->cfg = cfg;
    ev_init(&sh->mark_w, on_mark_timer);
    sh->mark_w.data = sh;
    ev_init(&sh->later_w, on_later);
    ev_init(&sh->start_w, on_started);
    sh->start_w.data = sh;
    sh->later_w.data = sh;
    ev_init(&sh->renew_w, renew_all);
    sh->renew_w.data = sh;
    ev_init(&sh->peek_w, peek_budgets);
    sh->peek_w.data = sh;
    sh->src = calloc(cfg->n_sources ? cfg->n_sources : 1, sizeof(*sh->src));
    sh->apps = calloc(cfg->n_apps ? cfg->n_apps : 1, sizeof(*sh->apps));
    sh->scopes = calloc(SHARED_SCOPES, sizeof(*sh->scopes));
    if (!sh->src || !sh->apps || !sh->scopes || apps_keys_init(sh) < 0)
        goto oom;
    for (size_t i = 0; i < CH_COUNT; i++) {
        static const char *const names[CH_COUNT] = { "task-end", "progress", "cache-purge" };
        size_t n = strlen(cfg->redis_prefix) + strlen(names[i]) + 2;
        sh->channel[i] = malloc(n);
        if (!sh->channel[i])
            goto oom;
        snprintf(sh->channel[i], n, "%s:%s", cfg->redis_prefix, names[i]);
    }
    for (size_t i = 0; i < cfg->n_sources; i++) {
        struct source_keys *k = &sh->src[i];
        const char *p = cfg->redis_prefix, *n = cfg->sources[i].name;
        snprintf(k->breaker, sizeof(k->breaker), "{%s:source:%s}:breaker", p, n);
        snprintf(k->leases, sizeof(k->leases), "{%s:source:%s}:leases", p, n);
        snprintf(k->rpm, sizeof(k->rpm), "{%s:source:%s}:rpm", p, n);
        snprintf(k->tpm, sizeof(k->tpm), "{%s:source:%s}:tpm", p, n);
        snprintf(k->daily, sizeof(k->daily), "{%s:source:%s}:daily", p, n);
        snprintf(k->breaker_state, sizeof(k->breaker_state), "closed");
        const struct config_source *src = &cfg->sources[i];
        char tag[SHARED_KEY_MAX / 2];
        snprintf(tag, sizeof(tag), "{%s:source:%s}", p, n);
        io_keys_init(&k->io, "", tag, &src->limits);
        k->index = i;
        k->sh = sh;
        fmt_num(k->a_conc, sizeof(k->a_conc), src->max_concurrency);
        fmt_num(k->a_ttl, sizeof(k->a_ttl), cfg->redis_lease_ttl_s * 1000.0);
        fmt_num(k->a_rpm, sizeof(k->a_rpm), (double)src->limits.rpm);
        fmt_num(k->a_win, sizeof(k->a_win), src->limits.window_s * 1000.0);
        fmt_num(k->a_tpm, sizeof(k->a_tpm), (double)src->limits.tpm);
        fmt_num(k->a_daily, sizeof(k->a_daily), (double)src->limits.daily_tokens);
        fmt_num(k->a_fails, sizeof(k->a_fails), src->breaker.failures);
        fmt_num(k->a_cool, sizeof(k->a_cool), src->breaker.cooldown_s * 1000.0);
        fmt_num(k->a_maxcool, sizeof(k->a_maxcool), src->breaker.max_cooldown_s * 1000.0);
    }
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
        unsigned long long x = (unsigned long long)getpid() ^ (unsigned long long)(ev_time() * 1e6);
        memcpy(rnd, &x, sizeof(rnd));
    }
    for (size_t i = 0; i < sizeof(rnd); i++)
        snprintf(sh->sidecar_id + 2 * i, 3, "%02x", rnd[i]);
    sh->progress = (struct gov_backend){
        .progress_mark = be_progress_mark,
        .progress_age = be_progress_age,
        .ud = sh,
    };
    const struct rtls_opts tls = {
        .ca_file = cfg->redis_tls_ca_file,
        .cert_file = cfg->redis_tls_cert_file,
        .key_file = cfg->redis_tls_key_file,
        .server_name = cfg->redis_tls_server_name,
    };
    const struct rds_opts opts = {
        .url = cfg->redis_url,
        .sentinels = (const char *const *)cfg->redis_sentinels,
        .n_sentinels = cfg->n_redis_sentinels,
        .master_name = cfg->redis_master_name,
        .db = (int)cfg->redis_db,
        .username = cfg->redis_username,
        .password = cfg->redis_password,
        .sentinel_username = cfg->redis_sentinel_username,
        .sentinel_password = cfg->redis_sentinel_password,
        .tls = cfg->redis_tls ? &tls : NULL,
        .command_timeout_s = cfg->redis_command_timeout_s,
        .reconnect_min_s = SHARED_RECONNECT_MIN_S,
        .reconnect_max_s = SHARED_RECONNECT_MAX_S,
        .channels = (const char *const *)sh->channel,
        .n_channels = CH_COUNT,
    };
    const struct rds_hooks rhooks = {
        .on_up = on_up,
        .on_down = on_down,
        .on_subscribed = on_subscribed,
        .on_unsubscribed = on_unsubscribed,
        .on_message = on_message,
        .ud = sh,
    };
    if (cfg->n_redis_cluster) {
        const struct rcl_opts copts = {
            .seeds = (const char *const *)cfg->redis_cluster,
            .n_seeds = cfg->n_redis_cluster,
            .node = opts,
        };
        sh->cl = rcl_new(loop, &copts, &rhooks, err, errlen);
    } else {
        sh->rds = rds_new(loop, &opts, &rhooks, err, errlen);
    }
    if ((!sh->rds && !sh->cl) || (sh->cl && cluster_check_slots(sh, err, errlen) < 0) ||
        startup_check(sh, err, errlen) < 0) {
        redis_free(&sh->be);
        return NULL;
    }
    sh->later_delay = SHARED_RETRY_LATER_S;
    ev_timer_set(&sh->renew_w, cfg->redis_lease_ttl_s / 3, cfg->redis_lease_ttl_s / 3);
    ev_timer_start(loop, &sh->renew_w);
    if (!views_make(sh, cfg))
        goto oom;
    ev_timer_set(&sh->peek_w, BACKEND_BUDGET_PEEK_S, BACKEND_BUDGET_PEEK_S);
    ev_timer_start(loop, &sh->peek_w);
    log_at(LOG_INFO, "redis backend", "prefix", LOG_S, cfg->redis_prefix, "sidecar_id", LOG_S,
           sh->sidecar_id, NULL);
    return &sh->be;
oom:
    snprintf(err, errlen, "out of memory");
    redis_free(&sh->be);
    return NULL;
}

static void drain_timeout(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)w;
    (void)revents;
}

/* At exit: the releases of the calls just ended (and any other write) are
 * only queued in hiredis; let them out, bounded by the command timeout, so
 * a restart does not hold the fleet's permits (or its half-open probe) for
 * lease_ttl_s. */
static void redis_drain(struct backend_redis *sh)
{
    struct ev_loop *loop = sh->loop;
    ev_timer guard;

    if ((!sh->rds && !sh->cl) || !sh_up(sh) || sh_pending(sh) == 0)
        return;
    ev_timer_init(&guard, drain_timeout, sh->cfg->redis_command_timeout_s, 0.);
    ev_timer_start(loop, &guard);
    while (ev_is_active(&guard) && sh_up(sh) && sh_pending(sh) > 0)
        ev_run(loop, EVRUN_ONCE);
    ev_timer_stop(loop, &guard);
}

static void redis_free(struct backend *be)
{
    struct backend_redis *sh = (struct backend_redis *)be;
    const struct config *cfg = sh->cfg;

    ev_timer_stop(sh->loop, &sh->renew_w);
    ev_timer_stop(sh->loop, &sh->start_w);
    ev_timer_stop(sh->loop, &sh->peek_w);
    ev_timer_stop(sh->loop, &sh->mark_w);
    ev_timer_stop(sh->loop, &sh->later_w);
    ev_prepare_stop(sh->loop, &sh->turn_w);
    turn_flush(sh);     /* answered like those in flight */
    sh->closing = true; /* the drain below lets writes out; it starts nothing new */
    sh->n_dirty = 0;    /* a coalesced mark (< 100 ms old) is not worth a write at exit */
    redis_drain(sh);
    rds_free(sh->rds); /* fails what is pending (admissions: their leases are freed) */
    sh->rds = NULL;
    rcl_free(sh->cl);
    sh->cl = NULL;
    ev_timer_stop(sh->loop, &sh->later_w);
    ev_timer_stop(sh->loop, &sh->mark_w);
    for (size_t i = 0; sh->src && i < cfg->n_sources; i++) {
        while (sh->src[i].live) {
            struct backend_lease *l = sh->src[i].live;
            lease_unlink(sh, l);
            free(l);
        }
    }
    if (sh->scopes)
        scopes_clear(sh);
    free(sh->scopes);
    free(sh->src);
    for (size_t i = 0; sh->apps && i < cfg->n_apps; i++)
        free(sh->apps[i].caps);
    free(sh->apps);
    free(sh->view_app);
    free(sh->view_src);
    for (size_t i = 0; i < CH_COUNT; i++)
        free(sh->channel[i]);
    free(sh);
}

void backend_redis_describe(const struct config *cfg, char *buf, size_t len)
{
    struct rds_addr a;

    if (cfg->redis_url && rds_parse_url(cfg->redis_url, &a, NULL, 0) == 0) {
        if (a.path[0])
            snprintf(buf, len, "redis backend at %s, not contacted", a.path);
        else
            snprintf(buf, len, "redis backend at %s:%d, not contacted", a.host, a.port);
    } else if (cfg->n_redis_cluster) {
        snprintf(buf, len, "redis backend: a cluster from %zu seeds, not contacted",
                 cfg->n_redis_cluster);
    } else if (cfg->n_redis_sentinels) {
        snprintf(buf, len, "redis backend: primary '%s' from %zu sentinels, not contacted",
                 cfg->redis_master_name, cfg->n_redis_sentinels);
    } else {
        snprintf(buf, len, "redis backend, not contacted");
    }
    explicit_bzero(&a, sizeof(a)); /* it held the password */
}

/* --- figures (backend.h) ---------------------------------------------- */

#define SH(obj)  ((const struct backend_redis *)(obj))
#define CNT(f)   offsetof(struct backend_redis, f)
#define ADMITTED "polygw_fleet_admissions_total"
_Static_assert(sizeof(unsigned long long) == sizeof(uint64_t), "counters are read as uint64_t");

static struct fig_val sidecar_id(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .s = SH(obj)->sidecar_id };
}

static struct fig_val src_breaker(const void *obj, size_t row)
{
    return (struct fig_val){ .s = SH(obj)->src[row].breaker_state };
}

static struct fig_val src_leases_live(const void *obj, size_t row)
{
    return (struct fig_val){ .u = SH(obj)->src[row].n_live };
}

/* One source of `shared.sources`. */
static const struct figure source_figure_list[] = {
    { .key = "breaker", .kind = FIG_STR, .get = src_breaker },
    { .key = "leases_live", .get = src_leases_live },
};
static const struct fig_table source_figures = FIG_TABLE(source_figure_list);

static void write_sources(struct writer *w, const void *obj, size_t row)
{
    const struct backend_redis *sh = SH(obj);
    (void)row;

    writer_map(w, (uint32_t)sh->cfg->n_sources);
    for (size_t i = 0; i < sh->cfg->n_sources; i++) {
        writer_str(w, sh->cfg->sources[i].name);
        figs_write_map(w, &source_figures, sh, i);
    }
}

static struct fig_val refused_total(const void *obj, size_t row)
{
    uint64_t n = 0;
    (void)row;

    for (size_t i = 0; i < sizeof(SH(obj)->refused) / sizeof(SH(obj)->refused[0]); i++)
        n += SH(obj)->refused[i];
    return (struct fig_val){ .u = n };
}

static const char *refusal_name(size_t i)
{
    return refusal_names[i];
}

static const struct figure refused_figure_list[] = {
    { .key = "", .off = CNT(refused), .n = 9, .name = refusal_name },
};
static const struct fig_table refused_figures = FIG_TABLE(refused_figure_list);

static struct fig_val leases_live(const void *obj, size_t row)
{
    uint64_t n = 0;
    (void)row;

    for (size_t i = 0; i < SH(obj)->cfg->n_sources; i++)
        n += SH(obj)->src[i].n_live;
    return (struct fig_val){ .u = n };
}

static struct fig_val scopes_cached(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .u = SH(obj)->n_scopes };
}

static const struct figure shared_figure_list[] = {
    { .key = "sidecar_id", .kind = FIG_STR, .get = sidecar_id },
    { .key = "resyncs", .off = CNT(resyncs) },
    { .key = "progress_read_errors", .off = CNT(progress_read_errors) },
    { .key = "marks_sent", .off = CNT(marks_sent) },
    { .key = "marks_coalesced", .off = CNT(marks_coalesced) },
    { .key = "sources", .kind = FIG_CUSTOM, .write = write_sources },
    { .key = "admit_requests", .off = CNT(admit_requests) },
    { .key = "admits", .off = CNT(admits) },
    { .key = "admitted",
      .metric = ADMITTED,
      .type = "counter",
      .help = "Fleet admissions (admit.lua) answered, by result: admitted, refused (a fleet "
              "limit or breaker), error (no verdict: the call failed closed).",
      .label = "result",
      .label_value = "admitted",
      .off = CNT(admitted) },
    { .metric = ADMITTED, .label = "result", .label_value = "refused", .get = refused_total },
    { .key = "refused", .kind = FIG_MAP, .sub = &refused_figures }, /* by check */
    { .key = "admit_errors",
      .metric = ADMITTED,
      .label = "result",
      .label_value = "error",
      .off = CNT(admit_errors) },
    { .key = "releases", .off = CNT(releases) },
    { .key = "write_errors",
      .metric = "polygw_fleet_write_errors_total",
      .type = "counter",
      .help = "Writes to the fleet state that failed (release, progress mark, lease renewal): "
              "logged and counted, never surfaced to calls.",
      .off = CNT(write_errors) },
    { .key = "leases_live", .get = leases_live },
    { .key = "leases_lost",
      .metric = "polygw_fleet_leases_lost_total",
      .type = "counter",
      .help = "Leases of attempts in flight found expired in Redis at renewal.",
      .off = CNT(leases_lost) },
    { .key = "renewals", .off = CNT(renewals) },
    { .key = "progress_fetches", .off = CNT(progress_fetches) },
    { .key = "scopes_cached", .get = scopes_cached },
};
static const struct fig_table shared_figures = FIG_TABLE(shared_figure_list);

static const void *rds_of(const void *obj, size_t row)
{
    (void)row;
    return SH(obj)->rds;
}

static const void *rcl_of(const void *obj, size_t row)
{
    (void)row;
    return SH(obj)->cl;
}

static bool is_single(const void *obj, size_t row)
{
    (void)row;
    return SH(obj)->rds != NULL;
}

static bool is_cluster(const void *obj, size_t row)
{
    (void)row;
    return SH(obj)->cl != NULL;
}

/* `backend`: the connector's (redis.h); `shared`: this backend's. */
static const struct figure redis_figure_list[] = {
    { .key = "backend",
      .kind = FIG_MAP,
      .sub = &rds_figures,
      .sub_obj = rds_of,
      .shown = is_single },
    { .key = "backend",
      .kind = FIG_MAP,
      .sub = &rcl_figures,
      .sub_obj = rcl_of,
      .shown = is_cluster },
    { .key = "shared", .kind = FIG_MAP, .sub = &shared_figures },
};
static const struct fig_table redis_figures = FIG_TABLE(redis_figure_list);
