/*
 * gov.c — admission, selection and the governed loop (see gov.h).
 */
#include "gov.h"
#include "dlist.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "progress.h"

#define GOV_EPS        1e-6 /* past a verdict time, strictly */
#define GOV_MAX_SCOPES 4096

const char *gov_result_name(enum gov_result r)
{
    switch (r) {
    case GOV_OK:
        return "ok";
    case GOV_STALLED:
        return "stalled";
    case GOV_RETRY_EXHAUSTED:
        return "retry_exhausted";
    case GOV_UPSTREAM_REJECTED:
        return "upstream_rejected";
    case GOV_DEADLINE_EXCEEDED:
        return "deadline_exceeded";
    case GOV_BACKEND_UNAVAILABLE:
        return "backend_unavailable";
    case GOV_BUDGET_EXHAUSTED:
        return "budget_exhausted";
    default:
        return "cancelled";
    }
}

const char *gov_call_state_name(enum gov_call_state s)
{
    switch (s) {
    case GOV_CALL_IDLE:
        return "idle";
    case GOV_CALL_WAITING:
        return "waiting";
    case GOV_CALL_ATTEMPTING:
        return "attempting";
    case GOV_CALL_BACKOFF:
        return "backoff";
    default:
        return "done";
    }
}

/* --- memory backend -------------------------------------------------- */

static int mem_mark(void *ud, const char *scope, double now)
{
    return progress_mark(ud, scope, now);
}

static int mem_age(void *ud, const char *scope, double now, double *age)
{
    *age = progress_age(ud, scope, now);
    return 0;
}

static double gov_rand(struct gov *g)
{
    if (!g->rand)
        return 0.5;
    double r = g->rand(g->rand_ud);
    return r < 0 ? 0 : r >= 1 ? 0.999999999 : r;
}

/* --- set-up ---------------------------------------------------------- */

static void source_init(struct gov_source *s, const struct gov_source_params *p, double now)
{
    memset(s, 0, sizeof(*s));
    s->p = *p;
    aimd_init(&s->aimd, s->p.aimd_initial, s->p.aimd_min, (double)s->p.max_concurrency,
              s->p.aimd_increase, s->p.aimd_decrease);
    breaker_init(&s->breaker, s->p.breaker_failures, s->p.breaker_cooldown_s,
                 s->p.breaker_max_cooldown_s);
    double window = s->p.window_s > 0 ? s->p.window_s : 60.0;
    bucket_init(&s->rpm, (double)s->p.rpm, window, now);
    bucket_init(&s->tpm, (double)s->p.tpm, window, now);
    bucket_init(&s->daily, (double)s->p.daily_tokens, 86400.0, now);
    bucket_init(&s->itpm, (double)s->p.itpm, window, now);
    bucket_init(&s->otpm, (double)s->p.otpm, window, now);
    s->last_start = -INFINITY;
}

int gov_init(struct gov *g, const struct gov_source_params *srcs, size_t n, size_t n_caps,
             const struct gov_backend *backend, gov_rand_fn *rand, void *rand_ud,
             const struct gov_hooks *hooks, double now)
{
    memset(g, 0, sizeof(*g));
    g->sources = calloc(n ? n : 1, sizeof(*g->sources));
    g->waitq = calloc(n_caps ? n_caps : 1, sizeof(*g->waitq));
    if (!g->sources || !g->waitq)
        goto fail;
    if (backend) {
        g->backend = *backend;
    } else {
        g->progress = progress_store_new(GOV_MAX_SCOPES);
        if (!g->progress)
            goto fail;
        g->backend.progress_mark = mem_mark;
        g->backend.progress_age = mem_age;
        g->backend.ud = g->progress;
    }
    g->n_sources = n;
    g->n_capabilities = n_caps;
    g->rand = rand;
    g->rand_ud = rand_ud;
    if (hooks)
        g->hooks = *hooks;
    for (size_t i = 0; i < n; i++)
        source_init(&g->sources[i], &srcs[i], now);
    return 0;
fail:
    free(g->sources);
    free(g->waitq);
    progress_store_free(g->progress);
    return -1;
}

int gov_set_apps(struct gov *g, const struct gov_app_params *apps, size_t n, double now)
{
    struct gov_app *w = calloc(n + 1, sizeof(*w));
    double **fin = calloc(g->n_capabilities ? g->n_capabilities : 1, sizeof(*fin));
    bool ok = w && fin;

    for (size_t c = 0; ok && c < g->n_capabilities; c++)
        ok = (fin[c] = calloc(n + 1, sizeof(**fin))) != NULL;
    /* Every app counts its attempts per capability, limited or not, so that
     * a reload may set per_capability limits with exact counts. */
    for (size_t i = 0; ok && i < n && g->n_capabilities > 0; i++) {
        w[i].n_caps = g->n_capabilities;
        ok = (w[i].caps = calloc(w[i].n_caps, sizeof(*w[i].caps))) != NULL;
    }
    if (!ok) {
        for (size_t c = 0; fin && c < g->n_capabilities; c++)
            free(fin[c]);
        for (size_t i = 0; w && i < n; i++)
            free(w[i].caps);
        free(fin);
        free(w);
        return -1;
    }
    for (size_t i = 0; i <= n; i++) {
        struct gov_app *a = &w[i];
        if (i < n)
            a->p = apps[i];
        if (!(a->p.weight > 0) || !isfinite(a->p.weight))
            a->p.weight = 1.0;
        double window = a->p.window_s > 0 ? a->p.window_s : 60.0;
        bucket_init(&a->rpm, (double)a->p.rpm, window, now);
        bucket_init(&a->tpm, (double)a->p.tpm, window, now);
        bucket_init(&a->daily, (double)a->p.daily_tokens, 86400.0, now);
        bucket_init(&a->itpm, (double)a->p.itpm, window, now);
        bucket_init(&a->otpm, (double)a->p.otpm, window, now);
        for (size_t c = 0; c < a->n_caps; c++) {
            struct gov_app_cap *ac = &a->caps[c];
            if (a->p.per_cap)
                ac->p = a->p.per_cap[c];
            double cw = ac->p.window_s > 0 ? ac->p.window_s : 60.0;
            bucket_init(&ac->rpm, (double)ac->p.rpm, cw, now);
            bucket_init(&ac->tpm, (double)ac->p.tpm, cw, now);
            bucket_init(&ac->daily, (double)ac->p.daily_tokens, 86400.0, now);
        }
        a->p.per_cap = NULL;
    }
    for (size_t c = 0; c < g->n_capabilities; c++) {
        struct gov_waitq *q = &g->waitq[c];
        for (size_t i = 0; i <= n; i++)
            fin[c][i] = q->vtime;
        free(q->app_finish);
        q->app_finish = fin[c];
    }
    free(fin);
    for (size_t i = 0; g->apps && i < g->n_apps; i++)
        free(g->apps[i].caps);
    free(g->apps);
    g->apps = w;
    g->n_apps = n;
    return 0;
}

/* Can the request, tpm and daily buckets take one request of `cost`
 * tokens now? When not, *at is raised to when they all could. */
static bool gov_buckets_admit(struct bucket *rpm, struct bucket *tpm, struct bucket *daily,
                              double cost, double now, double *at)
{
    bool ok = true;

    if (!bucket_can_take(rpm, 1, now)) {
        ok = false;
        *at = fmax(*at, bucket_available_at(rpm, 1, now));
    }
    if (!bucket_can_take(tpm, cost, now)) {
        ok = false;
        *at = fmax(*at, bucket_available_at(tpm, cost, now));
    }
    if (!bucket_can_take(daily, cost, now)) {
        ok = false;
        *at = fmax(*at, bucket_available_at(daily, cost, now));
    }
    return ok;
}

/* Can input and output buckets take `in` and `out` tokens? When
 * not, *at is raised to when they could. */
static bool gov_io_admit(struct bucket *itpm, struct bucket *otpm, double in, double out,
                         double now, double *at)
{
    bool ok = true;
    struct bucket *b[2] = { itpm, otpm };
    double cost[2] = { in, out };

    for (int i = 0; i < 2; i++) {
        if (bucket_can_take(b[i], cost[i], now))
            continue;
        ok = false;
        *at = fmax(*at, bucket_available_at(b[i], cost[i], now));
    }
    return ok;
}

/* The call's app, or NULL without gov_set_apps. */
static struct gov_app *gov_call_app(const struct gov_call *k)
{
    const struct gov *g = k->gov;
    if (!g->apps)
        return NULL;
    return &g->apps[k->app < g->n_apps ? k->app : g->n_apps];
}

/* The call's app's slot on the call's capability (its counts, and its
 * limits there when set), or NULL: no apps, the slot of unknown apps, or a
 * capability added since the apps were set. */
static struct gov_app_cap *gov_call_app_cap(const struct gov_call *k)
{
    struct gov_app *a = gov_call_app(k);
    return a && k->capability < a->n_caps ? &a->caps[k->capability] : NULL;
}

static bool gov_app_is_full(const struct gov_app *a)
{
    return a && a->p.max_concurrency > 0 && a->in_flight >= a->p.max_concurrency;
}

static bool gov_app_cap_is_full(const struct gov_app_cap *ac)
{
    return ac && ac->p.max_concurrency > 0 && ac->in_flight >= ac->p.max_concurrency;
}

/* Is the call's app (or its app on this capability) at its max_concurrency? */
static bool gov_call_app_full(const struct gov_call *k)
{
    return gov_app_is_full(gov_call_app(k)) || gov_app_cap_is_full(gov_call_app_cap(k));
}

/* Can the call's app, and its app on this capability, take one more
 * attempt of `cost` tokens now? When not, *available_at is when they could
 * (INFINITY: when one of its calls ends) and the limits that held it back
 * count it. */
static bool gov_app_runnable(const struct gov_call *k, double cost, double now,
                             double *available_at)
{
    struct gov_app *a = gov_call_app(k);
    struct gov_app_cap *ac = gov_call_app_cap(k);
    double at = now, cap_at = now;
    bool ok = true, cap_ok = true;

    if (gov_app_is_full(a)) {
        ok = false;
        at = INFINITY;
    }
    if (!gov_buckets_admit(&a->rpm, &a->tpm, &a->daily, cost, now, &at))
        ok = false;
    if (!gov_io_admit(&a->itpm, &a->otpm, k->est_in, k->est_out, now, &at))
        ok = false;
    if (ac) {
        if (gov_app_cap_is_full(ac)) {
            cap_ok = false;
            cap_at = INFINITY;
        }
        if (!gov_buckets_admit(&ac->rpm, &ac->tpm, &ac->daily, cost, now, &cap_at))
            cap_ok = false;
        if (!cap_ok) {
            ac->limited++;
            at = fmax(at, cap_at);
        }
    }
    if (!(ok && cap_ok))
        a->limited++;
    *available_at = at;
    return ok && cap_ok;
}

/* The app's buckets (and its buckets on the call's capability) take
 * `requests` requests and `tokens` tokens (negative: give them back). */
static void gov_app_adjust(struct gov_call *k, double requests, double tokens, double now)
{
    struct gov_app *a = gov_call_app(k);
    struct gov_app_cap *ac = gov_call_app_cap(k);

    if (!a)
        return;
    bucket_adjust(&a->rpm, requests, now);
    bucket_adjust(&a->tpm, tokens, now);
    bucket_adjust(&a->daily, tokens, now);
    if (ac) {
        bucket_adjust(&ac->rpm, requests, now);
        bucket_adjust(&ac->tpm, tokens, now);
        bucket_adjust(&ac->daily, tokens, now);
    }
}

void gov_call_set_app(struct gov_call *k, uint32_t app)
{
    k->app = app;
}

static void gov_free_apps(struct gov *g)
{
    for (size_t c = 0; g->waitq && c < g->n_capabilities; c++)
        free(g->waitq[c].app_finish);
    for (size_t i = 0; g->apps && i < g->n_apps; i++)
        free(g->apps[i].caps);
    free(g->apps);
}

void gov_fini(struct gov *g)
{
    free(g->affinity.e);
    free(g->affinity.bucket);
    gov_free_apps(g);
    free(g->sources);
    free(g->waitq);
    progress_store_free(g->progress);
    memset(g, 0, sizeof(*g));
}

/* --- reconfiguration -------------------------------------------------- */

/* A bucket under a new capacity/window: its level at `now`, clamped. */
static void bucket_carry(struct bucket *b, struct bucket *old, double capacity, double window_s,
                         double now)
{
    bool was_unlimited = bucket_is_unlimited(old);
    double level = was_unlimited ? INFINITY : bucket_level(old, now);

    bucket_init(b, capacity, window_s, now);
    if (!bucket_is_unlimited(b) && !was_unlimited)
        b->level = fmin(level, b->capacity);
}

int gov_apps_reconf_prepare(struct gov_apps_reconf *r, const struct gov *g,
                            const struct gov_app_params *apps, size_t n, size_t n_caps)
{
    memset(r, 0, sizeof(*r));
    if (!g->apps || n != g->n_apps || n_caps < g->n_capabilities)
        return -2;
    r->caps = calloc(n ? n : 1, sizeof(*r->caps));
    if (!r->caps)
        return -1;
    r->apps = apps;
    r->n = n;
    r->n_caps = n_caps;
    for (size_t i = 0; i < n && n_caps > 0; i++) {
        if (!(r->caps[i] = calloc(n_caps, sizeof(**r->caps)))) {
            gov_apps_reconf_abort(r);
            return -1;
        }
    }
    return 0;
}

void gov_apps_reconf_abort(struct gov_apps_reconf *r)
{
    for (size_t i = 0; r->caps && i < r->n; i++)
        free(r->caps[i]);
    free(r->caps);
    memset(r, 0, sizeof(*r));
}

/* A bucket's runtime level carried under new figures (`old` is a copy). */
static void app_buckets_carry(struct bucket *rpm, struct bucket *tpm, struct bucket *daily,
                              const struct bucket old[3], uint64_t n_rpm, uint64_t n_tpm,
                              uint64_t n_daily, double window_s, double now)
{
    struct bucket o[3] = { old[0], old[1], old[2] };
    double w = window_s > 0 ? window_s : 60.0;

    bucket_carry(rpm, &o[0], (double)n_rpm, w, now);
    bucket_carry(tpm, &o[1], (double)n_tpm, w, now);
    bucket_carry(daily, &o[2], (double)n_daily, 86400.0, now);
}

void gov_apps_reconf_commit(struct gov *g, struct gov_apps_reconf *r, double now)
{
    for (size_t i = 0; i < r->n; i++) {
        struct gov_app *a = &g->apps[i];
        const struct gov_app_params *p = &r->apps[i];
        const struct bucket own[3] = { a->rpm, a->tpm, a->daily };
        struct bucket io[2] = { a->itpm, a->otpm };
        double w = p->window_s > 0 ? p->window_s : 60.0;

        a->p = *p;
        a->p.per_cap = NULL;
        if (!(a->p.weight > 0) || !isfinite(a->p.weight))
            a->p.weight = 1.0;
        app_buckets_carry(&a->rpm, &a->tpm, &a->daily, own, p->rpm, p->tpm, p->daily_tokens,
                          p->window_s, now);
        bucket_carry(&a->itpm, &io[0], (double)p->itpm, w, now);
        bucket_carry(&a->otpm, &io[1], (double)p->otpm, w, now);
        for (size_t c = 0; c < r->n_caps; c++) {
            struct gov_app_cap *ac = &r->caps[i][c];
            struct bucket old[3];
            if (c < a->n_caps) {
                *ac = a->caps[c]; /* in_flight, limited, levels */
            } else {
                bucket_init(&ac->rpm, 0, 60, now);
                bucket_init(&ac->tpm, 0, 60, now);
                bucket_init(&ac->daily, 0, 86400, now);
            }
            old[0] = ac->rpm;
            old[1] = ac->tpm;
            old[2] = ac->daily;
            ac->p = p->per_cap ? p->per_cap[c] : (struct gov_app_cap_params){ 0 };
            app_buckets_carry(&ac->rpm, &ac->tpm, &ac->daily, old, ac->p.rpm, ac->p.tpm,
                              ac->p.daily_tokens, ac->p.window_s, now);
        }
        free(a->caps);
        a->caps = r->n_caps ? r->caps[i] : NULL;
        a->n_caps = r->n_caps;
        r->caps[i] = NULL;
    }
    free(r->caps);
    memset(r, 0, sizeof(*r));
}

/* Source `o`'s runtime state under parameters `p` (see gov.h). */
static void source_carry(struct gov_source *s, const struct gov_source *o,
                         const struct gov_source_params *p, double now)
{
    struct gov_source old = *o;
    double window = p->window_s > 0 ? p->window_s : 60.0;

    *s = old;
    s->p = *p;
    s->aimd.min = p->aimd_min;
    s->aimd.max =
        (double)p->max_concurrency >= p->aimd_min ? (double)p->max_concurrency : p->aimd_min;
    s->aimd.increase = p->aimd_increase;
    s->aimd.decrease = p->aimd_decrease;
    s->aimd.limit = fmin(fmax(old.aimd.limit, s->aimd.min), s->aimd.max);
    s->breaker.failures = p->breaker_failures;
    s->breaker.base_cooldown_s = p->breaker_cooldown_s;
    s->breaker.max_cooldown_s = p->breaker_max_cooldown_s;
    s->breaker.cooldown_s =
        fmin(fmax(old.breaker.cooldown_s, p->breaker_cooldown_s), p->breaker_max_cooldown_s);
    bucket_carry(&s->rpm, &old.rpm, (double)p->rpm, window, now);
    bucket_carry(&s->tpm, &old.tpm, (double)p->tpm, window, now);
    bucket_carry(&s->daily, &old.daily, (double)p->daily_tokens, 86400.0, now);
    bucket_carry(&s->itpm, &old.itpm, (double)p->itpm, window, now);
    bucket_carry(&s->otpm, &old.otpm, (double)p->otpm, window, now);
}

int gov_reconf_prepare(struct gov_reconf *r, const struct gov *g,
                       const struct gov_source_params *srcs, const long *from, size_t n,
                       size_t n_caps, double now)
{
    memset(r, 0, sizeof(*r));
    if (n_caps < g->n_capabilities)
        return -2;
    r->n = n;
    r->n_caps = n_caps;
    r->n_old = g->n_sources;
    r->sources = calloc(n ? n : 1, sizeof(*r->sources));
    r->to = malloc((g->n_sources ? g->n_sources : 1) * sizeof(*r->to));
    if (n_caps > g->n_capabilities)
        r->waitq = calloc(n_caps, sizeof(*r->waitq));
    if (!r->sources || !r->to || (n_caps > g->n_capabilities && !r->waitq)) {
        gov_reconf_abort(r);
        return -1;
    }
    for (size_t i = 0; i < g->n_sources; i++)
        r->to[i] = -1;
    for (size_t j = 0; j < n; j++) {
        if (from[j] >= (long)g->n_sources || srcs[j].capability >= n_caps ||
            (from[j] >= 0 && r->to[from[j]] >= 0)) {
            gov_reconf_abort(r);
            return -2;
        }
        if (from[j] >= 0) {
            r->to[from[j]] = (long)j;
            source_carry(&r->sources[j], &g->sources[from[j]], &srcs[j], now);
        } else {
            source_init(&r->sources[j], &srcs[j], now);
        }
    }
    for (size_t i = 0; i < g->n_sources; i++) {
        if (r->to[i] < 0 && g->sources[i].in_flight > 0) {
            gov_reconf_abort(r);
            return -2;
        }
    }
    return 0;
}

static void affinity_remap(struct gov *g, const struct gov_reconf *r);

void gov_reconf_commit(struct gov *g, struct gov_reconf *r)
{
    free(g->sources);
    g->sources = r->sources;
    g->n_sources = r->n;
    r->sources = NULL;
    affinity_remap(g, r);
    if (r->waitq) {
        memcpy(r->waitq, g->waitq, g->n_capabilities * sizeof(*g->waitq));
        free(g->waitq);
        g->waitq = r->waitq;
        g->n_capabilities = r->n_caps;
        r->waitq = NULL;
    }
}

void gov_reconf_abort(struct gov_reconf *r)
{
    free(r->sources);
    free(r->waitq);
    gov_reconf_finish(r);
}

void gov_reconf_finish(struct gov_reconf *r)
{
    free(r->to);
    r->to = NULL;
    r->sources = NULL;
    r->waitq = NULL;
}

int gov_call_reconf_prepare(const struct gov_call *k, const struct gov_reconf *r,
                            struct gov_source_note **notes)
{
    *notes = calloc(r->n ? r->n : 1, sizeof(**notes));
    if (!*notes)
        return -1;
    /* A restricted call keeps its subset: a new source is not in it. */
    for (size_t j = 0; j < r->n; j++)
        (*notes)[j].excluded = k->subset;
    for (size_t i = 0; i < r->n_old; i++) {
        if (r->to[i] >= 0)
            (*notes)[r->to[i]] = k->notes[i];
    }
    return 0;
}

void gov_call_reconf_commit(struct gov_call *k, const struct gov_reconf *r,
                            struct gov_source_note *notes)
{
    free(k->notes);
    k->notes = notes;
    k->woken_src = SIZE_MAX; /* an index of the old order */
    if (k->source < r->n_old && r->to[k->source] >= 0)
        k->source = (size_t)r->to[k->source];
    else
        k->source = 0; /* only meaningful while attempting, and then always continued */
}

/* --- admission ------------------------------------------------------- */

static void gov_on_breaker(void *ud, const struct breaker *b, enum breaker_state from,
                           enum breaker_state to, double now)
{
    struct gov *g = ud;
    struct gov_source *s = (struct gov_source *)((char *)b - offsetof(struct gov_source, breaker));
    if (g->hooks.on_breaker)
        g->hooks.on_breaker(g, (size_t)(s - g->sources), from, to, now, g->hooks.ud);
}

static uint32_t source_limit(const struct gov_source *s)
{
    uint32_t a = aimd_permits(&s->aimd);
    return a < s->p.max_concurrency ? a : s->p.max_concurrency;
}

static bool gov_source_runnable_io(struct gov *g, size_t i, double cost, double in, double out,
                                   double now, double *available_at);

bool gov_source_runnable(struct gov *g, size_t i, double cost, double now, double *available_at)
{
    return gov_source_runnable_io(g, i, cost, cost, 0, now, available_at);
}

static bool gov_source_runnable_io(struct gov *g, size_t i, double cost, double in, double out,
                                   double now, double *available_at)
{
    struct gov_source *s = &g->sources[i];
    double at = now;
    bool ok = true;

    if (s->p.retired) {
        *available_at = INFINITY;
        return false;
    }

    if (!breaker_admits(&s->breaker, now, gov_on_breaker, g)) {
        ok = false;
        at = fmax(at, breaker_next_admit(&s->breaker, now));
    }
    if (s->in_flight >= source_limit(s)) {
        ok = false;
        at = INFINITY; /* until a permit is released */
    }
    if (!gov_buckets_admit(&s->rpm, &s->tpm, &s->daily, cost, now, &at))
        ok = false;
    if (!gov_io_admit(&s->itpm, &s->otpm, in, out, now, &at))
        ok = false;
    if (s->gate_until > now) {
        ok = false;
        at = fmax(at, s->gate_until); /* INFINITY while one call asks */
    }
    double pace = s->last_start + s->p.pacer_min_interval_s;
    if (s->p.pacer_min_interval_s > 0 && now < pace) {
        ok = false;
        at = fmax(at, pace);
    }
    if (available_at)
        *available_at = ok ? now : at;
    return ok;
}

static uint64_t fnv1a(uint64_t h, const char *s)
{
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h;
}

void gov_call_set_affinity(struct gov_call *k, const char *key)
{
    k->affinity = key && *key ? fnv1a(0xcbf29ce484222325ULL, key) | 1 : 0;
}

/* A 64-bit mix (splitmix64's finaliser). */
static uint64_t splitmix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Weighted rendezvous score of source `s` for affinity hash `key`. */
static double gov_affinity_score(uint64_t key, const struct gov_source *s)
{
    uint64_t x = splitmix(splitmix(key) ^ fnv1a(0xcbf29ce484222325ULL, s->p.name ? s->p.name : ""));
    double h = ((double)(x >> 11) + 0.5) * (1.0 / 9007199254740992.0); /* in (0, 1) */
    return s->p.weight / -log(h);
}

/* --- affinity placements (struct gov_affinity) ------------------------ */

static int32_t *affinity_head(struct gov_affinity *a, uint32_t cap, uint64_t key)
{
    return &a->bucket[splitmix(key ^ cap) & (GOV_AFFINITY_MAX - 1)];
}

/* The entry of (cap, key), or -1. */
static int32_t affinity_find(struct gov_affinity *a, uint32_t cap, uint64_t key)
{
    if (!a->e)
        return -1;
    int32_t i = *affinity_head(a, cap, key);
    while (i >= 0 && (a->e[i].key != key || a->e[i].cap != cap))
        i = a->e[i].next_hash;
    return i;
}

static void affinity_unlink_recency(struct gov_affinity *a, int32_t i)
{
    struct gov_affinity_entry *e = &a->e[i];
    if (e->newer >= 0)
        a->e[e->newer].older = e->older;
    else
        a->newest = e->older;
    if (e->older >= 0)
        a->e[e->older].newer = e->newer;
    else
        a->oldest = e->newer;
}

/* Makes entry i the most recently used, at `now`. */
static void affinity_touch(struct gov_affinity *a, int32_t i, double now)
{
    affinity_unlink_recency(a, i);
    a->e[i].used = now;
    a->e[i].older = a->newest;
    a->e[i].newer = -1;
    if (a->newest >= 0)
        a->e[a->newest].newer = i;
    a->newest = i;
    if (a->oldest < 0)
        a->oldest = i;
}

/* Drops entry i (its source's count with it). */
static void affinity_drop(struct gov *g, int32_t i)
{
    struct gov_affinity *a = &g->affinity;
    struct gov_affinity_entry *e = &a->e[i];
    int32_t *p = affinity_head(a, e->cap, e->key);

    while (*p != i)
        p = &a->e[*p].next_hash;
    *p = e->next_hash;
    affinity_unlink_recency(a, i);
    if (e->source < g->n_sources && g->sources[e->source].affinity_keys)
        g->sources[e->source].affinity_keys--;
    e->next_hash = a->free_list;
    a->free_list = i;
    a->n--;
}

/* Drops the entries idle for GOV_AFFINITY_IDLE_S (oldest first: O(1) per
 * entry dropped). */
static void affinity_expire(struct gov *g, double now)
{
    struct gov_affinity *a = &g->affinity;
    while (a->e && a->oldest >= 0 && now - a->e[a->oldest].used >= GOV_AFFINITY_IDLE_S)
        affinity_drop(g, a->oldest);
}

/* Remembers (cap, key) on source `src`; when the table is full the least
 * recently used entry makes room. -1 when the table cannot be allocated
 * (the key is placed, not remembered). */
static int affinity_add(struct gov *g, uint32_t cap, uint64_t key, size_t src, double now)
{
    struct gov_affinity *a = &g->affinity;

    if (!a->e) {
        a->e = malloc(GOV_AFFINITY_MAX * sizeof(*a->e));
        a->bucket = malloc(GOV_AFFINITY_MAX * sizeof(*a->bucket));
        if (!a->e || !a->bucket) {
            free(a->e);
            free(a->bucket);
            a->e = NULL;
            a->bucket = NULL;
            return -1;
        }
        for (int32_t i = 0; i < GOV_AFFINITY_MAX; i++) {
            a->bucket[i] = -1;
            a->e[i].next_hash = i + 1 < GOV_AFFINITY_MAX ? i + 1 : -1;
        }
        a->free_list = 0;
        a->newest = a->oldest = -1;
        a->n = 0;
    }
    if (a->free_list < 0)
        affinity_drop(g, a->oldest);
    int32_t i = a->free_list;
    struct gov_affinity_entry *e = &a->e[i];
    int32_t *head = affinity_head(a, cap, key);
    a->free_list = e->next_hash;
    *e = (struct gov_affinity_entry){ .key = key,
                                      .cap = cap,
                                      .source = (uint32_t)src,
                                      .next_hash = *head,
                                      .newer = -1,
                                      .older = -1 };
    *head = i;
    if (a->newest >= 0)
        a->e[a->newest].newer = i;
    e->older = a->newest;
    a->newest = i;
    if (a->oldest < 0)
        a->oldest = i;
    e->used = now;
    a->n++;
    g->sources[src].affinity_keys++;
    return 0;
}

/* After a reload: entries follow their source to its new index; those of
 * a removed source are dropped; the counts are made again. */
static void affinity_remap(struct gov *g, const struct gov_reconf *r)
{
    struct gov_affinity *a = &g->affinity;

    for (size_t j = 0; j < g->n_sources; j++)
        g->sources[j].affinity_keys = 0;
    for (int32_t i = a->e ? a->oldest : -1; i >= 0;) {
        int32_t newer = a->e[i].newer;
        uint32_t old = a->e[i].source;
        long to = old < r->n_old ? r->to[old] : -1;
        a->e[i].source = UINT32_MAX; /* counted by nobody while dropped */
        if (to < 0) {
            affinity_drop(g, i);
        } else {
            a->e[i].source = (uint32_t)to;
            g->sources[to].affinity_keys++;
        }
        i = newer;
    }
}

/* The affinity pick among the candidates ok[0..n) (see
 * gov_call_set_affinity), remembered. */
static long affinity_pick(struct gov *g, const struct gov_call *k, const unsigned char *ok,
                          double now)
{
    struct gov_affinity *a = &g->affinity;
    size_t n = g->n_sources;
    double keys = 0, weight = 0, best = -1;
    long pick = -1, any = -1;

    affinity_expire(g, now);
    int32_t at = affinity_find(a, k->capability, k->affinity);
    if (at >= 0 && a->e[at].source < n && ok[a->e[at].source]) {
        affinity_touch(a, at, now);
        return (long)a->e[at].source;
    }
    if (at >= 0)
        affinity_drop(g, at);
    for (size_t i = 0; i < n; i++) {
        if (ok[i]) {
            keys += g->sources[i].affinity_keys;
            weight += g->sources[i].p.weight;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (!ok[i])
            continue;
        const struct gov_source *s = &g->sources[i];
        double sc = gov_affinity_score(k->affinity, s);
        double bound = weight > 0
            ? ceil((1.0 + GOV_AFFINITY_SLACK) * (keys + 1) * s->p.weight / weight)
            : INFINITY;
        if (any < 0 || sc > gov_affinity_score(k->affinity, &g->sources[any]))
            any = (long)i;
        if ((double)s->affinity_keys < bound && sc > best) {
            best = sc;
            pick = (long)i;
        }
    }
    if (pick < 0) /* cannot be (the bounds sum above keys), but never none */
        pick = any;
    if (pick >= 0)
        (void)affinity_add(g, k->capability, k->affinity, (size_t)pick, now);
    return pick;
}

/* May call `k` use source i (its capability, and its subset)? */
static bool gov_call_may_use(const struct gov_call *k, size_t i)
{
    return k->gov->sources[i].p.capability == k->capability && !k->notes[i].excluded;
}

/* pick_runnable: lowest priority tier first; within it a weighted choice
 * preferring the less loaded (weight x free fraction of the limit); a source
 * that already failed this call is skipped when another is runnable.
 * Returns the index or -1, with the earliest availability in *next_at. */
static long gov_pick(struct gov *g, const struct gov_call *k, double now, double *next_at)
{
    size_t n = g->n_sources;
    bool any_fresh = false;
    int32_t best_prio = INT32_MAX;
    double next = INFINITY;
    /* Runnable flags on the stack for the common case. */
    unsigned char small[64];
    unsigned char *ok = n <= sizeof(small) ? small : malloc(n);

    if (!ok) {
        *next_at = now + 0.01;
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        double at, hint_at = k->notes[i].retry_at;
        ok[i] = 0;
        if (!gov_call_may_use(k, i))
            continue;
        bool run = gov_source_runnable_io(g, i, k->est_tokens, k->est_in, k->est_out, now, &at);
        if (hint_at > now) {
            /* Its Retry-After holds it back for this call (not for others:
             * a hint answers one request, and may be pessimistic). */
            at = run ? hint_at : fmax(at, hint_at);
            run = false;
        }
        if (!run) {
            if (at < next)
                next = at;
            continue;
        }
        ok[i] = 1;
        if (!k->notes[i].tried || k->notes[i].reason == REASON_NONE)
            any_fresh = true;
    }
    /* Restrict to sources not failed by this call, when there are any. */
    for (size_t i = 0; i < n; i++) {
        if (ok[i] && any_fresh && k->notes[i].tried && k->notes[i].reason != REASON_NONE)
            ok[i] = 0;
        if (ok[i] && g->sources[i].p.priority < best_prio)
            best_prio = g->sources[i].p.priority;
    }
    double total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!ok[i] || g->sources[i].p.priority != best_prio) {
            ok[i] = 0;
            continue;
        }
        const struct gov_source *s = &g->sources[i];
        total += s->p.weight * (1.0 - (double)s->in_flight / (double)source_limit(s));
    }
    long pick = -1;
    if (k->affinity) {
        pick = affinity_pick(g, k, ok, now);
        total = 0; /* decided */
    }
    if (total > 0) {
        double r = gov_rand(g) * total;
        for (size_t i = 0; i < n; i++) {
            if (!ok[i])
                continue;
            const struct gov_source *s = &g->sources[i];
            double w = s->p.weight * (1.0 - (double)s->in_flight / (double)source_limit(s));
            pick = (long)i;
            if (r < w)
                break;
            r -= w;
        }
    }
    if (ok != small)
        free(ok);
    *next_at = next;
    return pick;
}

/* --- waiting --------------------------------------------------------- */

/* Enters the queue at its start tag (see the header): after every waiter
 * tagged at or before it. The scan runs from the tail, so an app's own
 * arrivals (tagged last) cost O(1) and another app's call passes at most
 * the waiters it overtakes. */
static void waitq_push(struct gov_call *k)
{
    struct gov *g = k->gov;
    struct gov_waitq *q = &g->waitq[k->capability];
    if (k->queued)
        return;
    if (q->app_finish) {
        size_t a = k->app < g->n_apps ? k->app : g->n_apps;
        k->vstart = fmax(q->vtime, q->app_finish[a]);
        q->app_finish[a] = k->vstart + 1.0 / g->apps[a].p.weight;
    } else {
        k->vstart = q->vtime; /* one app: FIFO */
    }
    struct gov_call *after = q->tail;
    while (after && after->vstart > k->vstart)
        after = after->wq_prev;
    k->wq_prev = after;
    k->wq_next = after ? after->wq_next : q->head;
    if (k->wq_next)
        k->wq_next->wq_prev = k;
    else
        q->tail = k;
    if (after)
        after->wq_next = k;
    else
        q->head = k;
    q->n++;
    k->queued = true;
}

static void waitq_remove(struct gov_call *k)
{
    struct gov_waitq *q = &k->gov->waitq[k->capability];
    if (!k->queued)
        return;
    DLIST_UNLINK_HT(q->head, q->tail, k, wq_prev, wq_next);
    q->n--;
    k->queued = false;
}

/* `src`: the source whose permit wakes it, or SIZE_MAX. */
static void gov_wake_call(struct gov *g, struct gov_call *k, size_t src)
{
    if (!g->hooks.on_wake)
        return;
    k->woken = true;
    k->woken_src = src;
    g->wakes++;
    g->hooks.on_wake(k, g->hooks.ud);
}

/* The first waiter of `cap` not already woken (and, with `permit_only`,
 * waiting for a permit) that may use source `src` (SIZE_MAX: any), or
 * NULL. */
static struct gov_call *gov_first_waiter(struct gov *g, uint32_t cap, bool permit_only, size_t src)
{
    struct gov_call *k = g->waitq[cap].head;

    while (k &&
           (k->woken || (permit_only && !k->waits_permit) || k->waits_app || gov_call_app_full(k) ||
            (src < g->n_sources && k->notes[src].excluded)))
        k = k->wq_next;
    return k;
}

/* An app dropped below its max_concurrency (in every capability, or in
 * capability `only` when that is < n_capabilities): its first waiter there
 * that its limits let run may run again. */
static void gov_wake_app(struct gov *g, uint32_t app, size_t only)
{
    for (size_t c = 0; c < g->n_capabilities; c++) {
        if (only < g->n_capabilities && c != only)
            continue;
        for (struct gov_call *k = g->waitq[c].head; k; k = k->wq_next) {
            if (!k->woken && !k->waits_app && k->app == app && !gov_call_app_full(k)) {
                gov_wake_call(g, k, SIZE_MAX);
                return;
            }
        }
    }
}

/* A permit of capability `cap` was released: wake the first waiter that is
 * not already woken. Waking the head every time would lose wake-ups when
 * several permits are released before any waiter runs (two attempts ending
 * in the same loop iteration): the head would get both and the next waiter
 * would sleep until its stall verdict with a permit free. */
static void gov_wake(struct gov *g, uint32_t cap, size_t src)
{
    struct gov_call *k = gov_first_waiter(g, cap, false, src);
    if (k)
        gov_wake_call(g, k, src);
}

/* A permit a refused call reserved went back: wake the first waiter that
 * waits for a permit (not one that waits for the backend, which a refusal
 * would only refuse again: a chain of refusals must not spin). */
static void gov_wake_permit(struct gov *g, uint32_t cap, size_t src)
{
    struct gov_call *k = gov_first_waiter(g, cap, true, src);
    if (k)
        gov_wake_call(g, k, src);
}

void gov_progress_known(struct gov *g, const char *scope)
{
    for (size_t c = 0; c < g->n_capabilities; c++) {
        for (struct gov_call *k = g->waitq[c].head; k; k = k->wq_next) {
            if (k->waits_age && !k->woken && strcmp(k->scope, scope) == 0) {
                k->waits_age = false;
                gov_wake_call(g, k, SIZE_MAX);
            }
        }
    }
}

/* The call leaves the FIFO for good (done or cancelled). A wake-up it got
 * and never used goes to the next waiter, for the same reason. */
static void waitq_leave(struct gov_call *k)
{
    bool pass = k->queued && k->woken;

    waitq_remove(k);
    k->woken = false;
    if (pass)
        gov_wake(k->gov, k->capability, k->woken_src);
}

/* --- the call -------------------------------------------------------- */

int gov_call_init(struct gov_call *k, struct gov *g, uint32_t capability, const char *scope,
                  const struct gov_policy *pol, double deadline_at, double est_tokens, double now)
{
    memset(k, 0, sizeof(*k));
    if (capability >= g->n_capabilities)
        return -1; /* it has no wait queue */
    k->notes = calloc(g->n_sources ? g->n_sources : 1, sizeof(*k->notes));
    k->scope = strdup(scope ? scope : "");
    if (!k->notes || !k->scope) {
        free(k->notes);
        free(k->scope);
        return -1;
    }
    k->gov = g;
    k->capability = capability;
    k->pol = *pol;
    if (k->pol.max_attempts < 1)
        k->pol.max_attempts = 1;
    k->deadline_at = deadline_at;
    k->est_tokens = est_tokens > 0 ? est_tokens : 0;
    k->est_in = k->est_tokens;
    k->est_out = 0;
    k->state = GOV_CALL_IDLE;
    k->woken_src = SIZE_MAX;
    stall_clock_init(&k->clock, now);
    return 0;
}

void gov_call_set_sources(struct gov_call *k, const bool *use)
{
    k->subset = true;
    for (size_t i = 0; i < k->gov->n_sources; i++)
        k->notes[i].excluded = !use[i];
}

double gov_call_stalled_s(const struct gov_call *k, double now)
{
    return stall_clock_stalled_s(&k->clock, now);
}

double gov_backoff_s(const struct gov_policy *pol, uint32_t n, double r)
{
    if (n < 1)
        n = 1;
    double d = pol->backoff_base_s * pow(2.0, (double)(n - 1));
    if (d > pol->backoff_max_s)
        d = pol->backoff_max_s;
    return d * (0.5 + 0.5 * r);
}

/* Releases what an attempt holds. */
static void gov_call_release(struct gov_call *k)
{
    struct gov_source *s = &k->gov->sources[k->source];
    struct gov_app *a = gov_call_app(k);
    struct gov_app_cap *ac = gov_call_app_cap(k);
    if (s->in_flight > 0)
        s->in_flight--;
    if (a && k->holds_app) {
        bool was_full = gov_app_is_full(a), cap_was_full = gov_app_cap_is_full(ac);
        k->holds_app = false;
        if (a->in_flight > 0)
            a->in_flight--;
        if (ac && k->holds_cap && ac->in_flight > 0)
            ac->in_flight--;
        k->holds_cap = false;
        if (was_full)
            gov_wake_app(k->gov, k->app, SIZE_MAX);
        else if (cap_was_full)
            gov_wake_app(k->gov, k->app, k->capability);
    }
}

/* Best estimate of when the capability can serve the call again, in
 * seconds: the earliest source, each at the latest of its admission gates
 * (breaker, buckets, pacer; a permit wait counts as one base backoff), its
 * last Retry-After and the call's own Retry-After from it. */
static double gov_retry_after(struct gov_call *k, double now)
{
    struct gov *g = k->gov;
    double best = INFINITY;

    for (size_t i = 0; i < g->n_sources; i++) {
        struct gov_source *s = &g->sources[i];
        double at;
        if (!gov_call_may_use(k, i))
            continue;
        gov_source_runnable_io(g, i, k->est_tokens, k->est_in, k->est_out, now, &at);
        if (!isfinite(at))
            at = now + k->pol.backoff_base_s; /* waiting for a permit: soon */
        at = fmax(at, fmax(s->retry_after_until, k->notes[i].retry_at));
        if (at < best)
            best = at;
    }
    if (!isfinite(best))
        return k->pol.backoff_base_s;
    double ra = best - now;
    return ra > 0 ? ra : 0;
}

/* The results a client should retry later (pgw_code_is_retry_later()). */
static bool gov_result_is_retry_later(enum gov_result r)
{
    return r == GOV_STALLED || r == GOV_RETRY_EXHAUSTED || r == GOV_BACKEND_UNAVAILABLE;
}

static void gov_call_done(struct gov_call *k, double now, enum gov_result r, struct gov_decision *d)
{
    waitq_leave(k);
    k->state = GOV_CALL_DONE;
    d->action = GOV_DONE;
    d->result = r;
    d->retry_after_s = r == GOV_OK ? 0 : gov_retry_after(k, now);
    if (gov_result_is_retry_later(r) && !(d->retry_after_s > 0)) {
        /* Nothing gates the sources: the hint is the backoff this call
         * would have slept next, never "at once" into the same overload. */
        d->retry_after_s = gov_backoff_s(&k->pol, k->fails > 0 ? k->fails : 1, gov_rand(k->gov));
    }
}

/* When the stall verdict lands if the scope makes no new progress: both
 * the call's stalled time and the scope's progress age (NAN: not known,
 * only the former counts) past the window, strictly. */
static double gov_call_verdict_at(const struct gov_call *k, double now, double stalled, double age)
{
    double window = k->pol.stall_window_s;
    double at = now + (window - stalled);

    if (isfinite(age))
        at = fmax(at, now + (window - age));
    return at + GOV_EPS;
}

/* The earliest time this call's Retry-After hints let it try a source of
 * its capability (`now` when one of them holds none). */
static double gov_call_hint_until(const struct gov_call *k, double now)
{
    const struct gov *g = k->gov;
    double until = INFINITY;

    for (size_t i = 0; i < g->n_sources; i++) {
        if (!gov_call_may_use(k, i))
            continue;
        double at = k->notes[i].retry_at;
        until = fmin(until, at > now ? at : now);
    }
    return isfinite(until) ? until : now;
}

/* Is the stall verdict certain already? It is when the call's Retry-After
 * hints hold back every source until after the verdict would land, and the
 * scope shows no progress within the window that could postpone it (an
 * unknown age never ends a call). Waiting could then only end in the same
 * `stalled`, later. */
static bool gov_call_hint_outlives(const struct gov_call *k, double now, double stalled, double age)
{
    if (!(age > k->pol.stall_window_s))
        return false;
    return gov_call_hint_until(k, now) > gov_call_verdict_at(k, now, stalled, age);
}

/* Nothing runnable: wait in FIFO order, holding nothing, until `next_at`
 * (the earliest known availability), the stall verdict, or the deadline.
 * `age` is the scope's progress age, or NAN when not known yet. */
static void gov_call_park(struct gov_call *k, double now, double stalled, double age,
                          double next_at, struct gov_decision *d)
{
    double verdict_at = gov_call_verdict_at(k, now, stalled, age);

    if (verdict_at <= now && isnan(age))
        verdict_at = INFINITY; /* due, but the age is not known: next_at rechecks */
    double wake = fmin(next_at, verdict_at);
    if (k->deadline_at > 0)
        wake = fmin(wake, k->deadline_at);
    if (wake <= now)
        wake = now + GOV_EPS;
    waitq_push(k);
    k->woken = false; /* it looked: the next release wakes it again */
    k->waits_permit = isinf(next_at) && next_at > 0;
    k->waits_age = false;
    k->waits_app = false;
    k->gov->waits++;
    k->state = GOV_CALL_WAITING;
    k->wake_at = wake;
    d->action = GOV_WAIT;
    d->wake_at = wake;
}

/* The verdicts at the top of the loop: deadline, backend, stall. Returns
 * true when one ended the call (d is DONE) or the call must wait for the
 * progress age (d is WAIT); else *stalled and *age (NAN = not known yet)
 * are set for the rest of the step. */
static bool gov_call_verdicts(struct gov_call *k, double now, double *stalled, double *age,
                              struct gov_decision *d)
{
    struct gov *g = k->gov;

    if (k->deadline_at > 0 && now >= k->deadline_at) {
        gov_call_done(k, now, GOV_DEADLINE_EXCEEDED, d);
        return true;
    }
    /* The stall verdict: both the call's own non-productive time and the
     * scope's progress age beyond the window. */
    *stalled = stall_clock_stalled_s(&k->clock, now);
    int rc = g->backend.progress_age(g->backend.ud, k->scope, now, age);
    if (rc < 0) {
        gov_call_done(k, now, GOV_BACKEND_UNAVAILABLE, d);
        return true;
    }
    double window = k->pol.stall_window_s;
    if (rc > 0) {
        *age = NAN;
        if (*stalled > window) {
            /* Due, but the age is being fetched: never stall on a guess. */
            gov_call_park(k, now, *stalled, NAN, now + GOV_PENDING_RECHECK_S, d);
            k->waits_age = true;
            return true;
        }
        return false;
    }
    if ((*stalled > window && *age > window) || gov_call_hint_outlives(k, now, *stalled, *age)) {
        gov_call_done(k, now, GOV_STALLED, d);
        return true;
    }
    return false;
}

void gov_call_step(struct gov_call *k, double now, struct gov_decision *d)
{
    struct gov *g = k->gov;
    double stalled, age, next_at;

    memset(d, 0, sizeof(*d));
    g->decisions++;
    if (k->state == GOV_CALL_DONE || k->state == GOV_CALL_ATTEMPTING) {
        /* Nothing to decide: DONE stays done; an attempt is in progress. */
        d->action = k->state == GOV_CALL_DONE ? GOV_DONE : GOV_ATTEMPT;
        d->source = k->source;
        return;
    }
    if (gov_call_verdicts(k, now, &stalled, &age, d))
        return;

    struct gov_app *app = gov_call_app(k);
    double app_at;
    if (app && !gov_app_runnable(k, k->est_tokens, now, &app_at)) {
        /* Its app's own limits hold it back, whatever the sources say. */
        gov_call_park(k, now, stalled, age, app_at, d);
        k->waits_app = isfinite(app_at);
        return;
    }
    long pick = gov_pick(g, k, now, &next_at);
    if (pick >= 0) {
        struct gov_source *s = &g->sources[pick];
        if (app) {
            struct gov_app_cap *ac = gov_call_app_cap(k);
            app->in_flight++;
            app->admitted++;
            if (ac)
                ac->in_flight++;
            k->holds_app = true;
            k->holds_cap = ac != NULL;
            gov_app_adjust(k, 1, k->est_tokens, now);
            bucket_take(&app->itpm, k->est_in, now);
            bucket_take(&app->otpm, k->est_out, now);
        }
        if (k->queued && k->vstart > g->waitq[k->capability].vtime)
            g->waitq[k->capability].vtime = k->vstart;
        waitq_remove(k);
        k->woken = false;
        k->source = (size_t)pick;
        k->probe = s->breaker.state == BREAKER_HALF_OPEN;
        breaker_on_attempt(&s->breaker);
        s->in_flight++;
        s->attempts++;
        bucket_take(&s->rpm, 1, now);
        bucket_take(&s->tpm, k->est_tokens, now);
        bucket_take(&s->daily, k->est_tokens, now);
        bucket_take(&s->itpm, k->est_in, now);
        bucket_take(&s->otpm, k->est_out, now);
        if (s->gate_until > 0) {
            s->gate_until = INFINITY; /* the gate's time came: this call asks alone */
            s->gate_holder = k;
        }
        k->prev_last_start = s->last_start;
        k->picked_at = now;
        s->last_start = now;
        k->attempts++;
        k->notes[pick].tried = true;
        k->notes[pick].attempts++;
        stall_clock_attempt_begin(&k->clock, now);
        k->state = GOV_CALL_ATTEMPTING;
        d->action = GOV_ATTEMPT;
        d->source = (size_t)pick;
        return;
    }
    gov_call_park(k, now, stalled, age, next_at, d);
}

/* Opens the source's gate if `k` holds it, waking the next waiter. */
static void gov_gate_open(struct gov_call *k)
{
    struct gov_source *s = &k->gov->sources[k->source];

    if (s->gate_holder != k)
        return;
    s->gate_holder = NULL;
    s->gate_until = 0;
    gov_wake_permit(k->gov, k->capability, k->source); /* those parked behind the gate */
}

void gov_call_confirmed(struct gov_call *k)
{
    if (!k->gov || k->state != GOV_CALL_ATTEMPTING)
        return;
    /* Each admission lets the next call parked behind the gate ask (not a
     * call waiting for its own retry time: it would only be refused again). */
    if (k->gov->sources[k->source].gate_holder == k)
        gov_gate_open(k);
    else
        gov_wake_permit(k->gov, k->capability, k->source);
}

/* Gives back what the last step reserved for an attempt that was never
 * sent (gov_call_refused, gov_call_abandon). Its time is stalled time. */
static void gov_call_unreserve(struct gov_call *k, double now)
{
    struct gov_source *s = &k->gov->sources[k->source];
    struct gov_source_note *note = &k->notes[k->source];

    stall_clock_attempt_end(&k->clock, now, true);
    gov_call_release(k);
    breaker_on_neutral(&s->breaker, k->probe);
    k->probe = false;
    if (s->attempts > 0)
        s->attempts--;
    bucket_adjust(&s->rpm, -1, now);
    bucket_adjust(&s->tpm, -k->est_tokens, now);
    bucket_adjust(&s->daily, -k->est_tokens, now);
    bucket_adjust(&s->itpm, -k->est_in, now);
    bucket_adjust(&s->otpm, -k->est_out, now);
    struct gov_app *app = gov_call_app(k);
    if (app) {
        gov_app_adjust(k, -1, -k->est_tokens, now);
        bucket_adjust(&app->itpm, -k->est_in, now);
        bucket_adjust(&app->otpm, -k->est_out, now);
        if (app->admitted > 0)
            app->admitted--;
    }
    if (s->last_start == k->picked_at)
        s->last_start = k->prev_last_start; /* unless another call started since */
    if (k->attempts > 0)
        k->attempts--;
    if (note->attempts > 0)
        note->attempts--;
    if (note->attempts == 0 && note->reason == REASON_NONE && note->status == 0)
        note->tried = false;
    k->state = GOV_CALL_BACKOFF;
    gov_wake_permit(k->gov, k->capability, k->source);
}

void gov_call_refused(struct gov_call *k, double now, double retry_at, bool gate,
                      struct gov_decision *d)
{
    double stalled, age;

    memset(d, 0, sizeof(*d));
    if (k->state != GOV_CALL_ATTEMPTING) {
        gov_call_step(k, now, d);
        return;
    }
    struct gov_source *s = &k->gov->sources[k->source];
    double p = k->pol.poll_interval_s > 0 ? k->pol.poll_interval_s : 1.0;
    if (!(retry_at > now) || !isfinite(retry_at)) {
        retry_at = now + p * (0.5 + 0.5 * gov_rand(k->gov));
    } else {
        if (retry_at > s->retry_after_until)
            s->retry_after_until = retry_at; /* for the error's retry_after_s */
        /* Every sidecar got the same time: spread them, or each refill
         * wakes the whole fleet for one token. */
        retry_at += 0.5 * p * gov_rand(k->gov);
    }
    if (gate) {
        /* Gate the source until then: one local call asks at a time. */
        s->gate_until = retry_at;
        s->gate_holder = NULL;
    } else if (s->gate_holder == k) {
        gov_gate_open(k); /* this refusal says nothing about smaller calls */
    }
    gov_call_unreserve(k, now);
    k->gov->decisions++;
    if (gov_call_verdicts(k, now, &stalled, &age, d))
        return;
    gov_call_park(k, now, stalled, age, retry_at, d);
}

void gov_call_abandon(struct gov_call *k, double now, enum gov_result r, struct gov_decision *d)
{
    memset(d, 0, sizeof(*d));
    if (k->state == GOV_CALL_ATTEMPTING) {
        gov_gate_open(k);
        gov_call_unreserve(k, now);
    }
    if (k->state != GOV_CALL_DONE)
        gov_call_done(k, now, r, d);
    else {
        d->action = GOV_DONE;
        d->result = r;
    }
}

void gov_call_exclude(struct gov_call *k, double now, enum gov_result r, struct gov_decision *d)
{
    memset(d, 0, sizeof(*d));
    if (k->state != GOV_CALL_ATTEMPTING) {
        gov_call_abandon(k, now, r, d);
        return;
    }
    size_t left_out = k->source;
    gov_gate_open(k);
    gov_call_unreserve(k, now);
    k->notes[left_out].excluded = true;
    k->subset = true;
    for (size_t i = 0; i < k->gov->n_sources; i++)
        if (gov_call_may_use(k, i) && !k->gov->sources[i].p.retired) {
            gov_call_step(k, now, d);
            return;
        }
    gov_call_done(k, now, r, d);
}

static bool reason_is_timeout(enum outcome_reason r)
{
    return r == REASON_TTFT_TIMEOUT || r == REASON_IDLE_TIMEOUT || r == REASON_TOTAL_TIMEOUT ||
        r == REASON_CONNECT_TIMEOUT;
}

void gov_call_set_io(struct gov_call *k, double est_in, double est_out)
{
    k->est_in = est_in > 0 ? est_in : 0;
    k->est_out = est_out > 0 ? est_out : 0;
}

void gov_call_on_io(struct gov_call *k, double in, double out, double now)
{
    if (k->state != GOV_CALL_ATTEMPTING)
        return;
    struct gov_source *s = &k->gov->sources[k->source];
    struct gov_app *a = k->holds_app ? gov_call_app(k) : NULL;
    if (in >= 0) {
        bucket_adjust(&s->itpm, in - k->est_in, now);
        if (a)
            bucket_adjust(&a->itpm, in - k->est_in, now);
    }
    if (out >= 0) {
        bucket_adjust(&s->otpm, out - k->est_out, now);
        if (a)
            bucket_adjust(&a->otpm, out - k->est_out, now);
    }
}

void gov_charge(struct gov *g, size_t source, uint32_t app, double cost)
{
    if (source < g->n_sources) {
        g->sources[source].cost += cost;
        g->sources[source].priced++;
    }
    if (g->apps) {
        struct gov_app *a = &g->apps[app < g->n_apps ? app : g->n_apps];
        a->cost += cost;
        a->priced++;
    }
}

void gov_call_on_outcome(struct gov_call *k, double now, const struct outcome *o,
                         double actual_tokens, struct gov_decision *d)
{
    struct gov *g = k->gov;
    struct gov_source *s = &g->sources[k->source];
    bool exempt = o->kind == OUTCOME_RATE_LIMITED && k->pol.exempt_429;

    memset(d, 0, sizeof(*d));
    if (k->state != GOV_CALL_ATTEMPTING) {
        gov_call_step(k, now, d);
        return;
    }
    gov_gate_open(k); /* only if it was never confirmed */
    /* Account the attempt: an exempt 429 consumed no retry budget, so all
     * of its time goes back to the stall budget (the refund rule). */
    stall_clock_attempt_end(&k->clock, now, exempt);
    gov_call_release(k);
    if (actual_tokens >= 0) {
        s->tokens_used += (uint64_t)actual_tokens;
        bucket_adjust(&s->tpm, actual_tokens - k->est_tokens, now);
        bucket_adjust(&s->daily, actual_tokens - k->est_tokens, now);
        gov_app_adjust(k, 0, actual_tokens - k->est_tokens, now);
    }
    k->notes[k->source].reason = (uint8_t)o->reason;
    k->notes[k->source].status = o->http_status;
    k->state = GOV_CALL_BACKOFF;

    if (o->reason == REASON_CANCELLED) {
        /* The call was cancelled (outcome.h): never retried, reported as
         * `cancelled`, and no verdict on the source. */
        breaker_on_neutral(&s->breaker, k->probe);
        gov_wake(g, k->capability, k->source);
        gov_call_done(k, now, GOV_CANCELLED, d);
        return;
    }
    switch (o->kind) {
    case OUTCOME_SUCCESS:
        s->successes++;
        aimd_on_success(&s->aimd);
        breaker_on_success(&s->breaker, k->probe, now, gov_on_breaker, g);
        if (g->backend.progress_mark(g->backend.ud, k->scope, now) < 0)
            g->backend_write_errors++;
        gov_wake(g, k->capability, k->source);
        gov_call_done(k, now, GOV_OK, d);
        return;
    case OUTCOME_FAIL_FAST:
        s->failures++;
        breaker_on_neutral(&s->breaker, k->probe);
        gov_wake(g, k->capability, k->source);
        gov_call_done(k, now, GOV_UPSTREAM_REJECTED, d);
        return;
    case OUTCOME_RATE_LIMITED:
        s->rate_limited++;
        aimd_on_decrease(&s->aimd);
        breaker_on_neutral(&s->breaker, k->probe); /* a 429 never trips the breaker */
        if (o->retry_after_s >= 0)
            s->retry_after_until = now + o->retry_after_s;
        if (!exempt)
            k->fails++;
        break;
    case OUTCOME_TRANSIENT:
        s->failures++;
        if (reason_is_timeout((enum outcome_reason)o->reason))
            aimd_on_decrease(&s->aimd);
        breaker_on_failure(&s->breaker, k->probe, now, gov_on_breaker, g);
        k->fails++;
        break;
    }
    if (o->retry_after_s >= 0)
        k->notes[k->source].retry_at = now + o->retry_after_s;
    gov_wake(g, k->capability, k->source);
    if (!exempt && k->fails >= k->pol.max_attempts) {
        gov_call_done(k, now, GOV_RETRY_EXHAUSTED, d);
        return;
    }
    if (k->deadline_at > 0 && now >= k->deadline_at) {
        /* It passed during the attempt: no WAIT into the past. */
        gov_call_done(k, now, GOV_DEADLINE_EXCEEDED, d);
        return;
    }
    double wake = now + gov_backoff_s(&k->pol, k->fails > 0 ? k->fails : 1, gov_rand(g));
    double hint_at = gov_call_hint_until(k, now);
    if (hint_at > wake) {
        /* Retry-After holds back every source beyond the backoff. That
         * wait is stall time like any other: it never outlasts the
         * verdict (re-checked then), and it does not begin when the
         * verdict is certain already. */
        double stalled = stall_clock_stalled_s(&k->clock, now), age;
        if (g->backend.progress_age(g->backend.ud, k->scope, now, &age) != 0)
            age = NAN; /* the step at wake time reads it again, and fails closed */
        if (gov_call_hint_outlives(k, now, stalled, age)) {
            gov_call_done(k, now, GOV_STALLED, d);
            return;
        }
        wake = fmax(wake, fmin(hint_at, gov_call_verdict_at(k, now, stalled, age)));
    }
    if (k->deadline_at > 0 && wake > k->deadline_at)
        wake = k->deadline_at;
    k->wake_at = wake;
    d->action = GOV_WAIT;
    d->wake_at = wake;
}

void gov_call_fini(struct gov_call *k, double now)
{
    if (!k->gov)
        return;
    waitq_leave(k);
    if (k->state == GOV_CALL_ATTEMPTING) {
        /* Cancelled inside an attempt: its time is accounted as productive
         * and its permit (and probe) released at once. */
        struct gov_source *s = &k->gov->sources[k->source];
        gov_gate_open(k);
        stall_clock_attempt_end(&k->clock, now, false);
        gov_call_release(k);
        breaker_on_neutral(&s->breaker, k->probe);
        gov_wake(k->gov, k->capability, k->source);
    }
    k->state = GOV_CALL_DONE;
    free(k->notes);
    free(k->scope);
    k->notes = NULL;
    k->scope = NULL;
    k->gov = NULL;
}
