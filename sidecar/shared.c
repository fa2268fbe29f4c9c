/*
 * shared.c — the Redis backend's governance glue (see shared.h).
 *
 * Keys (tests/redis/README.md): {P:source:N}:breaker|leases|rpm|tpm|daily,
 * {P:scope:S}:progress, {P:task:ID}; channels P:task-end and P:progress.
 * Every script touches the keys of one hash tag.
 */
#include "shared.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "log.h"
#include "redis.h"
#include "tasks.h"

#define SHARED_SCOPES 4096          /* cache slots (power of two) */
#define SHARED_PROGRESS_TTL_MS 3600000
#define SHARED_RECONNECT_MIN_S 0.05
#define SHARED_RECONNECT_MAX_S 5.0
#define SHARED_KEY_MAX 512
/* A scope's progress marks are sent at most once per this interval by each
 * sidecar; a success inside it is sent when it ends. Other sidecars' view of
 * the age is then late by at most this much (stall windows are seconds to
 * minutes), and a busy scope costs one script every 100 ms instead of one per
 * call (with its pub/sub echo to every sidecar). */
#define SHARED_MARK_COALESCE_S 0.1
#define SHARED_RETRY_LATER_S 1.0        /* failed task updates are retried after */
#define SHARED_RETRY_LATER_MAX_S 60.0

enum { CH_TASK_END, CH_PROGRESS, CH_COUNT };

struct shared_lease {
    struct shared_lease *prev, *next;   /* the source's live leases */
    size_t source;
    bool live;                          /* linked */
    double est_tokens;
    char id[48];
};

struct shared_admit {
    struct shared *sh;
    struct shared_lease *lease;
    shared_admit_cb *cb;
    void *ud;                           /* NULL once detached */
};

/* A scope's progress age in the cache: UNKNOWN (fetch it), FETCHING, KNOWN,
 * or FAILED (the read failed: reads fail closed until failed_at + the command
 * timeout, then fetch again — a persistent error never loops). */
enum scope_state { SCOPE_EMPTY, SCOPE_UNKNOWN, SCOPE_FETCHING, SCOPE_KNOWN, SCOPE_FAILED };

struct scope_slot {
    char *name;
    double last_at;                     /* SCOPE_KNOWN: loop time, -INF = never */
    double sent_at;                     /* when this sidecar last sent a mark */
    double failed_at;                   /* SCOPE_FAILED: when */
    unsigned char state;
    bool dirty;                         /* a success not sent yet (coalesced) */
};

struct source_keys {
    char breaker[SHARED_KEY_MAX], leases[SHARED_KEY_MAX], rpm[SHARED_KEY_MAX],
        tpm[SHARED_KEY_MAX], daily[SHARED_KEY_MAX];
    struct shared_lease *live;
    size_t n_live;
    char breaker_state[12];             /* the fleet breaker as last seen */
    /* The scripts' constant arguments, formatted once. */
    char a_conc[24], a_ttl[24], a_rpm[24], a_win[24], a_tpm[24], a_daily[24], a_fails[24],
        a_cool[24], a_maxcool[24];
    size_t index;                       /* in sh->src: a release's context */
    struct shared *sh;
};

struct shared {
    struct server *srv;
    struct rds *rds;
    struct gov_backend backend;
    char sidecar_id[17];
    unsigned long long lease_seq;
    char *channel[CH_COUNT];
    struct source_keys *src;            /* one per configured source */
    struct scope_slot *scopes;          /* open addressing */
    size_t n_scopes;
    uint32_t epoch;                     /* bumped when the cache is dropped */
    size_t n_dirty;                     /* scopes with a coalesced mark to send */
    bool resync;                        /* re-read the running tasks when up */
    unsigned long long resyncs;
    ev_timer mark_w;                    /* sends them */
    ev_timer later_w;                   /* shared_retry_later */
    double later_delay;
    bool closing;                       /* shared_fini: no new work */
    ev_timer renew_w;
    /* counters */
    unsigned long long admits, admitted, refused[6], admit_errors, releases, write_errors,
        leases_lost, progress_fetches, progress_read_errors, renewals, marks_sent,
        marks_coalesced;
};

static const char *const refusal_names[6] = {"breaker", "concurrency", "rpm", "tpm", "daily",
                                             "other"};

/* --- helpers ----------------------------------------------------------- */

/* A whole number as the scripts read it (tonumber). */
static void fmt_num(char *buf, size_t len, double v)
{
    if (fabs(v) < 9e15)
        snprintf(buf, len, "%lld", llround(v));
    else
        snprintf(buf, len, "%.0f", v);
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

static void count_write_error(struct shared *sh, const char *what, const char *err)
{
    sh->write_errors++;
    log_at(LOG_WARN, "backend write failed (counted; state self-heals by TTL)", "op", LOG_S,
           what, "error", LOG_S, err ? err : "bad reply", NULL);
}

/* --- progress cache ---------------------------------------------------- */

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static void marks_flush(struct shared *sh);

static void scopes_clear(struct shared *sh)
{
    marks_flush(sh); /* coalesced successes are not lost with the cache */
    for (size_t i = 0; i < SHARED_SCOPES; i++) {
        free(sh->scopes[i].name);
        sh->scopes[i] = (struct scope_slot){0};
    }
    sh->n_scopes = 0;
    sh->epoch++;
}

/* The slot holding `scope`, or the empty slot where it would go (linear
 * probing; the table never fills: scope_slot clears it at 3/4). */
static struct scope_slot *scope_probe(struct shared *sh, const char *scope)
{
    size_t mask = SHARED_SCOPES - 1;

    for (size_t i = (size_t)hash_str(scope) & mask;; i = (i + 1) & mask) {
        struct scope_slot *s = &sh->scopes[i];
        if (s->state == SCOPE_EMPTY || strcmp(s->name, scope) == 0)
            return s;
    }
}

/* The slot of `scope`, or NULL. */
static struct scope_slot *scope_find(struct shared *sh, const char *scope)
{
    struct scope_slot *s = scope_probe(sh, scope);
    return s->state == SCOPE_EMPTY ? NULL : s;
}

/* The slot of `scope`, created when absent (NULL when out of memory). A
 * table 3/4 full is dropped whole: every scope then reads unknown and is
 * fetched again — the safe direction. */
static struct scope_slot *scope_slot(struct shared *sh, const char *scope)
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
    *s = (struct scope_slot){.name = name, .state = SCOPE_UNKNOWN, .sent_at = -INFINITY};
    sh->n_scopes++;
    return s;
}

static void progress_key(const struct shared *sh, const char *scope, char *key, size_t len)
{
    snprintf(key, len, "{%s:scope:%s}:progress", sh->srv->cfg->redis_prefix, scope);
}

struct fetch {
    struct shared *sh;
    uint32_t epoch;
    char scope[];
};

static void on_progress_fetched(const redisReply *r, const char *err, void *ud)
{
    struct fetch *f = ud;
    struct shared *sh = f->sh;
    long long age_ms;

    if (f->epoch == sh->epoch) {
        struct scope_slot *s = scope_find(sh, f->scope);
        if (s && s->state == SCOPE_FETCHING) {
            double now = ev_now(sh->srv->loop);
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
    gov_progress_known(&sh->srv->gov, f->scope); /* its waiters look again */
    free(f);
}

static int be_progress_age(void *ud, const char *scope, double now, double *age)
{
    struct shared *sh = ud;

    if (!rds_subscribed(sh->rds) || !rds_up(sh->rds))
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
        if (now - s->failed_at < sh->srv->cfg->redis_command_timeout_s)
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
    const char *argv[] = {key, "age"};
    if (rds_eval(sh->rds, RDS_PROGRESS, 1, 2, argv, NULL, on_progress_fetched, f) < 0) {
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

static int send_mark(struct shared *sh, const char *scope)
{
    char key[SHARED_KEY_MAX], ttl[24];

    progress_key(sh, scope, key, sizeof(key));
    fmt_num(ttl, sizeof(ttl), SHARED_PROGRESS_TTL_MS);
    const char *argv[] = {key, "mark", ttl, sh->channel[CH_PROGRESS], scope};
    sh->marks_sent++;
    if (rds_eval(sh->rds, RDS_PROGRESS, 1, 5, argv, NULL, on_mark_done, sh) < 0) {
        count_write_error(sh, "progress mark", "not connected");
        return -1;
    }
    return 0;
}

static void marks_flush(struct shared *sh)
{
    double now = ev_now(sh->srv->loop);

    ev_timer_stop(sh->srv->loop, &sh->mark_w);
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
    struct shared *sh = ud;
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
            ev_timer_start(sh->srv->loop, &sh->mark_w);
        }
    }
    return 0;
}

/* --- leases ------------------------------------------------------------ */

static void lease_link(struct shared *sh, struct shared_lease *l)
{
    struct source_keys *k = &sh->src[l->source];
    l->prev = NULL;
    l->next = k->live;
    if (k->live)
        k->live->prev = l;
    k->live = l;
    k->n_live++;
    l->live = true;
}

static void lease_unlink(struct shared *sh, struct shared_lease *l)
{
    struct source_keys *k = &sh->src[l->source];
    if (!l->live)
        return;
    if (l->prev)
        l->prev->next = l->next;
    else
        k->live = l->next;
    if (l->next)
        l->next->prev = l->prev;
    k->n_live--;
    l->live = false;
}

/* The fleet breaker as one release left it: logged when it changed. */
static void note_breaker(struct shared *sh, size_t source, const char *state)
{
    struct source_keys *k = &sh->src[source];

    if (strcmp(k->breaker_state, state) == 0)
        return;
    log_at(strcmp(state, "open") == 0 ? LOG_WARN : LOG_INFO, "fleet breaker", "source", LOG_S,
           sh->srv->cfg->sources[source].name, "from", LOG_S, k->breaker_state, "to", LOG_S,
           state, NULL);
    snprintf(k->breaker_state, sizeof(k->breaker_state), "%s", state);
}

static void on_released(const redisReply *r, const char *err, void *ud)
{
    struct source_keys *k = ud;
    struct shared *sh = k->sh;

    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 3)
        count_write_error(sh, "release", err);
    else if (r->element[1]->type == REDIS_REPLY_STRING && r->element[1]->len < 12)
        note_breaker(sh, k->index, r->element[1]->str);
}

/* release.lua's verdict: a transient failure counts for the breaker; a
 * 429, a rejection or a cancel does not (src/breaker.h). */
static const char *verdict_name(const struct outcome *o)
{
    if (!o || o->reason == REASON_CANCELLED)
        return "neutral";
    return o->kind == OUTCOME_SUCCESS ? "success" : o->kind == OUTCOME_TRANSIENT ? "failure"
                                                                                 : "neutral";
}

void shared_release(struct shared *sh, struct shared_lease *l, const struct outcome *o,
                    double used_tokens)
{
    struct source_keys *k = &sh->src[l->source];
    char est[32], used[32];

    lease_unlink(sh, l);
    sh->releases++;
    fmt_num(est, sizeof(est), ceil(l->est_tokens));
    fmt_num(used, sizeof(used), used_tokens < 0 ? -1 : ceil(used_tokens));
    const char *argv[] = {k->breaker, k->leases, k->rpm,     k->tpm,    k->daily, l->id,
                          verdict_name(o), est,  used,       k->a_tpm,  k->a_win, k->a_daily,
                          "86400000", k->a_fails, k->a_cool, k->a_maxcool};
    if (rds_eval(sh->rds, RDS_RELEASE, 5, 16, argv, NULL, on_released, k) < 0)
        count_write_error(sh, "release", "not connected");
    free(l);
}

static int refusal_index(const char *why)
{
    for (int i = 0; i < 5; i++)
        if (strcmp(why, refusal_names[i]) == 0)
            return i;
    return 5;
}

static void on_admitted(const redisReply *r, const char *err, void *ud)
{
    struct shared_admit *a = ud;
    struct shared *sh = a->sh;
    struct shared_lease *l = a->lease;
    long long ok = -1, v = 0;

    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 3)
        reply_is_int(r->element[0], &ok);
    if (ok == 1) {
        sh->admitted++; /* the probe flag (element 2) is release.lua's business */
        lease_link(sh, l);
        if (a->ud)
            a->cb(a->ud, 1, l, NAN, "admitted");
        else
            shared_release(sh, l, NULL, -1); /* the call is gone */
    } else if (ok == 0 && r->element[1]->type == REDIS_REPLY_STRING) {
        const char *why = r->element[1]->str;
        double retry_at = NAN, off = rds_clock_offset(sh->rds);
        sh->refused[refusal_index(why)]++;
        if (strcmp(why, "breaker") == 0)
            note_breaker(sh, l->source, "open");
        if (reply_is_int(r->element[2], &v) && v > 0 && isfinite(off))
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

struct shared_admit *shared_admit(struct shared *sh, size_t source, double est_tokens,
                                  shared_admit_cb *cb, void *ud)
{
    struct source_keys *k = &sh->src[source];
    char est[32];
    struct shared_admit *a = malloc(sizeof(*a));
    struct shared_lease *l = calloc(1, sizeof(*l));

    if (!a || !l || !rds_up(sh->rds)) {
        free(a);
        free(l);
        return NULL;
    }
    l->source = source;
    l->est_tokens = est_tokens;
    snprintf(l->id, sizeof(l->id), "%s:%llu", sh->sidecar_id, ++sh->lease_seq);
    *a = (struct shared_admit){.sh = sh, .lease = l, .cb = cb, .ud = ud};
    fmt_num(est, sizeof(est), ceil(est_tokens));
    const char *argv[] = {k->breaker, k->leases, k->rpm,   k->tpm,     k->daily,
                          l->id,      k->a_conc, k->a_ttl, k->a_rpm,   k->a_win,
                          k->a_tpm,   k->a_win,  k->a_daily, "86400000", est};
    sh->admits++;
    if (rds_eval(sh->rds, RDS_ADMIT, 5, 15, argv, NULL, on_admitted, a) < 0) {
        free(a);
        free(l);
        return NULL;
    }
    return a;
}

void shared_admit_detach(struct shared_admit *a)
{
    a->ud = NULL;
}

/* Renewal: every lease_ttl_s / 3, one renew.lua per source with leases. */
static void on_renewed(const redisReply *r, const char *err, void *ud)
{
    struct shared *sh = ud;

    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
        count_write_error(sh, "renew", err);
        return;
    }
    sh->renewals++;
    const redisReply *lost = r->element[1];
    for (size_t i = 0; lost->type == REDIS_REPLY_ARRAY && i < lost->elements; i++) {
        sh->leases_lost++;
        log_at(LOG_WARN, "lease expired while its attempt ran (Redis unreachable for longer "
               "than lease_ttl_s?); the attempt runs on without a fleet permit",
               "lease", LOG_S, lost->element[i]->type == REDIS_REPLY_STRING
                                   ? lost->element[i]->str : "?", NULL);
    }
}

static void renew_all(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct shared *sh = w->data;
    char ttl[32];
    (void)loop;
    (void)revents;

    if (!rds_up(sh->rds))
        return;
    fmt_num(ttl, sizeof(ttl), sh->srv->cfg->redis_lease_ttl_s * 1000.0);
    for (size_t i = 0; i < sh->srv->cfg->n_sources; i++) {
        struct source_keys *k = &sh->src[i];
        if (!k->n_live)
            continue;
        const char **argv = malloc((k->n_live + 2) * sizeof(*argv));
        if (!argv)
            continue;
        size_t n = 0;
        argv[n++] = k->leases;
        argv[n++] = ttl;
        for (struct shared_lease *l = k->live; l; l = l->next)
            argv[n++] = l->id;
        if (rds_eval(sh->rds, RDS_RENEW, 1, (int)n, argv, NULL, on_renewed, sh) < 0)
            count_write_error(sh, "renew", "not connected");
        free(argv);
    }
}

/* --- tasks ------------------------------------------------------------- */

int shared_task(struct shared *sh, const char *op, const char *id, const char *reason, bool ok,
                shared_task_cb *cb, void *ud)
{
    char key[SHARED_KEY_MAX], ttl[32];

    snprintf(key, sizeof(key), "{%s:task:%s}", sh->srv->cfg->redis_prefix, id);
    fmt_num(ttl, sizeof(ttl), ceil(sh->srv->cfg->task_ttl_s));
    const char *argv[] = {key, op, id, ttl, reason ? reason : "", ok ? "1" : "0",
                          sh->channel[CH_TASK_END]};
    return rds_eval(sh->rds, RDS_TASK, 1, 7, argv, NULL, cb, ud);
}

double shared_unix_s(long long ms)
{
    return (double)ms / 1000.0;
}

/* --- connection events ------------------------------------------------- */

/* Task stops published while this sidecar could not listen or could not
 * act on them are lost: once both connections are up again, re-read the
 * running tasks held here. */
static void maybe_resync(struct shared *sh)
{
    if (!sh->resync || !rds_up(sh->rds) || !rds_subscribed(sh->rds))
        return;
    sh->resync = false;
    sh->resyncs++;
    tasks_on_resubscribed(sh->srv);
}

void shared_request_resync(struct shared *sh)
{
    sh->resync = true;
    maybe_resync(sh);
}

/* A task update failed while the connections may still be up (a timeout
 * or an error reply): try again in a while, not at once (a persistent error
 * must not loop), and at the latest when the connections come back. */
static void on_later(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct shared *sh = w->data;
    (void)loop;
    (void)revents;
    if (sh->closing || !rds_up(sh->rds))
        return; /* on_up does it */
    /* Failing again and again (an error reply, not a lost connection)
     * backs off: 1 s doubling to 60 s, reset by a reconnection. */
    sh->later_delay = fmin(sh->later_delay * 2, SHARED_RETRY_LATER_MAX_S);
    tasks_on_backend_up(sh->srv);
    maybe_resync(sh);
    server_on_backend_up(sh->srv);
}

void shared_retry_later(struct shared *sh, bool resync)
{
    if (sh->closing)
        return;
    if (resync)
        sh->resync = true;
    if (!ev_is_active(&sh->later_w)) {
        ev_timer_set(&sh->later_w, sh->later_delay, 0.);
        ev_timer_start(sh->srv->loop, &sh->later_w);
    }
}

bool shared_closing(const struct shared *sh)
{
    return sh->closing;
}

bool shared_is_up(const struct shared *sh)
{
    return sh->rds && rds_up(sh->rds);
}

static void on_up(struct rds *r, void *ud)
{
    struct shared *sh = ud;
    (void)r;
    sh->later_delay = SHARED_RETRY_LATER_S;
    tasks_on_backend_up(sh->srv);
    maybe_resync(sh);
    server_on_backend_up(sh->srv);
}

static void on_down(struct rds *r, const char *why, void *ud)
{
    (void)r;
    (void)why;
    (void)ud;
}

static void on_subscribed(struct rds *r, void *ud)
{
    (void)r;
    shared_request_resync(ud);
}

static void on_unsubscribed(struct rds *r, void *ud)
{
    struct shared *sh = ud;
    (void)r;
    scopes_clear(sh); /* marks may be missed from now on */
}

static void on_message(struct rds *r, size_t channel, const char *msg, size_t len, void *ud)
{
    struct shared *sh = ud;
    char buf[SHARED_KEY_MAX];
    (void)r;

    if (len >= sizeof(buf) || memchr(msg, '\0', len))
        return;
    memcpy(buf, msg, len);
    buf[len] = '\0';
    if (channel == CH_PROGRESS) {
        /* Only scopes this sidecar works with: the cache is not the fleet's. */
        struct scope_slot *s = scope_find(sh, buf);
        if (s) { /* the freshest news: a fetch in flight is then ignored */
            bool was_fetching = s->state == SCOPE_FETCHING;
            s->state = SCOPE_KNOWN;
            s->last_at = ev_now(sh->srv->loop);
            if (was_fetching)
                gov_progress_known(&sh->srv->gov, buf);
        }
    } else if (channel == CH_TASK_END) {
        tasks_on_task_end(sh->srv, buf);
    }
}

/* --- set-up ------------------------------------------------------------ */

int shared_init(struct server *srv, char *err, size_t errlen)
{
    const struct config *cfg = srv->cfg;
    unsigned char rnd[8];

    srv->shared = NULL;
    if (cfg->backend != BACKEND_REDIS)
        return 0;
    struct shared *sh = calloc(1, sizeof(*sh));
    if (!sh)
        goto oom;
    srv->shared = sh;
    sh->srv = srv;
    sh->src = calloc(cfg->n_sources ? cfg->n_sources : 1, sizeof(*sh->src));
    sh->scopes = calloc(SHARED_SCOPES, sizeof(*sh->scopes));
    if (!sh->src || !sh->scopes)
        goto oom;
    for (size_t i = 0; i < CH_COUNT; i++) {
        static const char *const names[CH_COUNT] = {"task-end", "progress"};
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
    sh->backend = (struct gov_backend){
        .progress_mark = be_progress_mark,
        .progress_age = be_progress_age,
        .ud = sh,
    };
    const struct rds_opts opts = {
        .url = cfg->redis_url,
        .command_timeout_s = cfg->redis_command_timeout_s,
        .reconnect_min_s = SHARED_RECONNECT_MIN_S,
        .reconnect_max_s = SHARED_RECONNECT_MAX_S,
        .channels = (const char *const *)sh->channel,
        .n_channels = CH_COUNT,
    };
    const struct rds_hooks hooks = {
        .on_up = on_up,
        .on_down = on_down,
        .on_subscribed = on_subscribed,
        .on_unsubscribed = on_unsubscribed,
        .on_message = on_message,
        .ud = sh,
    };
    sh->rds = rds_new(srv->loop, &opts, &hooks, err, errlen);
    if (!sh->rds) {
        shared_fini(srv);
        return -1;
    }
    ev_init(&sh->mark_w, on_mark_timer);
    sh->mark_w.data = sh;
    ev_init(&sh->later_w, on_later);
    sh->later_w.data = sh;
    sh->later_delay = SHARED_RETRY_LATER_S;
    ev_timer_init(&sh->renew_w, renew_all, cfg->redis_lease_ttl_s / 3,
                  cfg->redis_lease_ttl_s / 3);
    sh->renew_w.data = sh;
    ev_timer_start(srv->loop, &sh->renew_w);
    log_at(LOG_INFO, "redis backend", "prefix", LOG_S, cfg->redis_prefix, "sidecar_id", LOG_S,
           sh->sidecar_id, NULL);
    return 0;
oom:
    snprintf(err, errlen, "out of memory");
    shared_fini(srv);
    return -1;
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
static void shared_drain(struct shared *sh)
{
    struct ev_loop *loop = sh->srv->loop;
    ev_timer guard;

    if (!sh->rds || !rds_up(sh->rds) || rds_get_stats(sh->rds)->pending == 0)
        return;
    ev_timer_init(&guard, drain_timeout, sh->srv->cfg->redis_command_timeout_s, 0.);
    ev_timer_start(loop, &guard);
    while (ev_is_active(&guard) && rds_up(sh->rds) && rds_get_stats(sh->rds)->pending > 0)
        ev_run(loop, EVRUN_ONCE);
    ev_timer_stop(loop, &guard);
}

void shared_fini(struct server *srv)
{
    struct shared *sh = srv->shared;

    if (!sh)
        return;
    ev_timer_stop(srv->loop, &sh->renew_w);
    ev_timer_stop(srv->loop, &sh->mark_w);
    ev_timer_stop(srv->loop, &sh->later_w);
    sh->closing = true; /* the drain below lets writes out; it starts nothing new */
    sh->n_dirty = 0; /* a coalesced mark (< 100 ms old) is not worth a write at exit */
    shared_drain(sh);
    rds_free(sh->rds); /* fails what is pending (admissions: their leases are freed) */
    sh->rds = NULL;
    ev_timer_stop(srv->loop, &sh->later_w);
    ev_timer_stop(srv->loop, &sh->mark_w); /* fails pending admits: their leases are freed */
    for (size_t i = 0; sh->src && i < srv->cfg->n_sources; i++) {
        while (sh->src[i].live) {
            struct shared_lease *l = sh->src[i].live;
            lease_unlink(sh, l);
            free(l);
        }
    }
    if (sh->scopes)
        scopes_clear(sh);
    free(sh->scopes);
    free(sh->src);
    for (size_t i = 0; i < CH_COUNT; i++)
        free(sh->channel[i]);
    free(sh);
    srv->shared = NULL;
}

const struct gov_backend *shared_gov_backend(struct shared *sh)
{
    return &sh->backend;
}

const struct rds *shared_rds(const struct shared *sh)
{
    return sh->rds;
}

const char *shared_breaker_state(const struct shared *sh, size_t source)
{
    return sh->src[source].breaker_state;
}

void shared_get_counts(const struct shared *sh, struct shared_counts *out)
{
    *out = (struct shared_counts){.admitted = sh->admitted,
                                  .admit_errors = sh->admit_errors,
                                  .write_errors = sh->write_errors,
                                  .leases_lost = sh->leases_lost};
    for (size_t i = 0; i < sizeof(sh->refused) / sizeof(sh->refused[0]); i++)
        out->refused += sh->refused[i];
}

void shared_pack_stats(struct shared *sh, msgpack_packer *pk)
{
    size_t live = 0;

    for (size_t i = 0; i < sh->srv->cfg->n_sources; i++)
        live += sh->src[i].n_live;
    rpc_pack_str(pk, "backend");
    rds_pack_stats(sh->rds, pk);
    rpc_pack_str(pk, "shared");
    msgpack_pack_map(pk, 17);
    rpc_pack_kv_str(pk, "sidecar_id", sh->sidecar_id);
    rpc_pack_kv_u64(pk, "resyncs", sh->resyncs);
    rpc_pack_kv_u64(pk, "progress_read_errors", sh->progress_read_errors);
    rpc_pack_kv_u64(pk, "marks_sent", sh->marks_sent);
    rpc_pack_kv_u64(pk, "marks_coalesced", sh->marks_coalesced);
    rpc_pack_str(pk, "sources");
    msgpack_pack_map(pk, sh->srv->cfg->n_sources);
    for (size_t i = 0; i < sh->srv->cfg->n_sources; i++) {
        rpc_pack_str(pk, sh->srv->cfg->sources[i].name);
        msgpack_pack_map(pk, 2);
        rpc_pack_kv_str(pk, "breaker", sh->src[i].breaker_state);
        rpc_pack_kv_u64(pk, "leases_live", sh->src[i].n_live);
    }
    rpc_pack_kv_u64(pk, "admits", sh->admits);
    rpc_pack_kv_u64(pk, "admitted", sh->admitted);
    rpc_pack_str(pk, "refused");
    msgpack_pack_map(pk, 6);
    for (int i = 0; i < 6; i++)
        rpc_pack_kv_u64(pk, refusal_names[i], sh->refused[i]);
    rpc_pack_kv_u64(pk, "admit_errors", sh->admit_errors);
    rpc_pack_kv_u64(pk, "releases", sh->releases);
    rpc_pack_kv_u64(pk, "write_errors", sh->write_errors);
    rpc_pack_kv_u64(pk, "leases_live", live);
    rpc_pack_kv_u64(pk, "leases_lost", sh->leases_lost);
    rpc_pack_kv_u64(pk, "renewals", sh->renewals);
    rpc_pack_kv_u64(pk, "progress_fetches", sh->progress_fetches);
    rpc_pack_kv_u64(pk, "scopes_cached", sh->n_scopes);
}
