/* test_gov.c — the governed loop of docs/DESIGN.md §3.1–3.4, always on a fake
 * clock and with a scripted random source.
 *
 * The simulation driver below plays the sidecar: each call has a scripted
 * upstream that decides every attempt's duration and outcome; the driver
 * follows the core's decisions (ATTEMPT -> advance to the attempt's end ->
 * on_outcome; WAIT -> advance to wake_at -> step; on_wake -> step "now", as
 * the sidecar's zero-delay timer would) in time order, ties broken in the
 * order they were scheduled, like a timer heap. Every run has a hard
 * iteration bound, asserted not to be reached, so a bug can never hang a
 * test: an endless loop fails it instead. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gov.h"
#include "outcome.h"
#include "progress.h"
#include "suites.h"

#define SIM_MAX_CALLS   16
#define SIM_MAX_SOURCES 4
#define SIM_MAX_ITERS   100000
#define SIM_LOG         64
#define REL_EPS         1e-9
#define VERDICT_EPS     1e-3 /* "the verdict lands within ε after the window" */

#define ck_assert_near(x, want)                                                                 \
    do {                                                                                        \
        double x_ = (x), w_ = (want);                                                           \
        ck_assert_msg(fabs(x_ - w_) <= REL_EPS * fmax(1.0, fabs(w_)), "%s = %.12g, want %.12g", \
                      #x, x_, w_);                                                              \
    } while (0)

/* `x` in (lo, lo + VERDICT_EPS]: just after `lo`, not before. */
#define ck_assert_just_after(x, lo)                                                              \
    do {                                                                                         \
        double x_ = (x), l_ = (lo);                                                              \
        ck_assert_msg(x_ > l_ && x_ <= l_ + VERDICT_EPS, "%s = %.12g, want in (%.12g, +%g]", #x, \
                      x_, l_, VERDICT_EPS);                                                      \
    } while (0)

/* --- the scripted upstream ------------------------------------------- */

struct reply {
    double duration_s; /* INFINITY: hangs until the call is cancelled */
    struct outcome o;
    double tokens; /* real usage, < 0 unknown */
};

static struct reply rep_http(double duration_s, int status, const char *retry_after)
{
    struct reply r = { .duration_s = duration_s, .tokens = -1 };

    outcome_from_http(&r.o, status, retry_after, 0);
    return r;
}

static struct reply rep_reason(double duration_s, enum outcome_reason reason)
{
    struct reply r = { .duration_s = duration_s, .tokens = -1 };

    outcome_from_reason(&r.o, reason);
    return r;
}

static struct reply rep_hang(void)
{
    return rep_http(INFINITY, 200, NULL);
}

struct sim_call;

/* Decides attempt `n` (1-based, as this call's upstream sees them) sent to
 * `source`. The default plays the call's script. */
typedef void upstream_fn(struct sim_call *c, size_t source, uint32_t n, struct reply *r);

/* --- the driver ------------------------------------------------------ */

enum sim_next { SIM_NONE, SIM_START, SIM_STEP, SIM_END, SIM_HUNG, SIM_FINISHED };

struct sim_call {
    struct gov_call k;
    /* set up before the call starts */
    uint32_t capability;
    const char *scope;
    struct gov_policy pol;
    double deadline_at, est_tokens;
    struct reply script[64]; /* attempt n plays script[n-1]; the last one repeats */
    size_t n_script;
    upstream_fn *up;
    const bool *use; /* its sources (gov_call_set_sources), NULL: all */
    /* driver state */
    enum sim_next next;
    double at;
    uint64_t seq;
    struct reply cur;
    struct gov_decision d;      /* the last decision */
    uint32_t seen;              /* attempts its upstream saw */
    size_t att_source[SIM_LOG]; /* the first SIM_LOG attempts: source, start */
    double att_at[SIM_LOG];
    /* result */
    bool done;
    enum gov_result result;
    double done_at, stalled_at_done, retry_after_s;
};

struct sim {
    double now;
    struct gov g;
    struct gov_source_params src[SIM_MAX_SOURCES];
    size_t n_src;
    /* the random source: seq[] first, then dflt forever */
    double rng_seq[SIM_LOG];
    size_t rng_n, rng_i;
    double rng_dflt;
    struct sim_call c[SIM_MAX_CALLS];
    size_t n;
    uint64_t seq;
    bool manual_wakes; /* log on_wake without scheduling a step */
    struct gov_call *wake_k[SIM_LOG];
    double wake_t[SIM_LOG];
    size_t n_wakes;
    struct {
        size_t source;
        enum breaker_state from, to;
        double at;
    } br[SIM_LOG];
    size_t n_br;
    uint64_t steps, step_waits;
    unsigned iters;
};

/* One per test process (Check runs each test in its own fork). */
static struct sim S;

static double sim_rand(void *ud)
{
    struct sim *s = ud;

    return s->rng_i < s->rng_n ? s->rng_seq[s->rng_i++] : s->rng_dflt;
}

static void sim_rng(struct sim *s, const double *seq, size_t n, double dflt)
{
    ck_assert_uint_le(n, SIM_LOG);
    memcpy(s->rng_seq, seq, n * sizeof(*seq));
    s->rng_n = n;
    s->rng_i = 0;
    s->rng_dflt = dflt;
}

static void sim_schedule(struct sim *s, struct sim_call *c, enum sim_next next, double at)
{
    c->next = next;
    c->at = at;
    c->seq = ++s->seq;
}

static void on_wake(struct gov_call *k, void *ud)
{
    struct sim *s = ud;
    struct sim_call *c = k->ud;

    ck_assert_uint_lt(s->n_wakes, SIM_LOG);
    s->wake_k[s->n_wakes] = k;
    s->wake_t[s->n_wakes++] = s->now;
    ck_assert_msg(k->state == GOV_CALL_WAITING, "woke a call in state %s",
                  gov_call_state_name(k->state));
    if (!s->manual_wakes && c->next == SIM_STEP && c->at > s->now)
        sim_schedule(s, c, SIM_STEP, s->now);
}

static void on_breaker(const struct gov *g, size_t source, enum breaker_state from,
                       enum breaker_state to, double now, void *ud)
{
    struct sim *s = ud;

    ck_assert_ptr_eq(g, &s->g);
    ck_assert_uint_lt(s->n_br, SIM_LOG);
    s->br[s->n_br].source = source;
    s->br[s->n_br].from = from;
    s->br[s->n_br].to = to;
    s->br[s->n_br++].at = now;
}

/* A source with every limit off but a few permits. */
static struct gov_source_params src_params(const char *name)
{
    return (struct gov_source_params){
        .name = name,
        .capability = 0,
        .priority = 0,
        .weight = 1,
        .max_concurrency = 4,
        .aimd_initial = 4,
        .aimd_min = 1,
        .aimd_increase = 1,
        .aimd_decrease = 0.5,
        .breaker_failures = 5,
        .breaker_cooldown_s = 30,
        .breaker_max_cooldown_s = 300,
    };
}

/* The chat defaults of the design: timeout = stall = 300 s, base 2 s. */
static struct gov_policy pol_chat(void)
{
    return (struct gov_policy){
        .max_attempts = 3,
        .stall_window_s = 300,
        .backoff_base_s = 2,
        .backoff_max_s = 60,
        .exempt_429 = true,
    };
}

static void sim_init(struct sim *s, const struct gov_source_params *src, size_t n, size_t n_caps)
{
    struct gov_hooks hooks = { .on_wake = on_wake, .on_breaker = on_breaker, .ud = s };

    memset(s, 0, sizeof(*s));
    ck_assert_uint_le(n, SIM_MAX_SOURCES);
    memcpy(s->src, src, n * sizeof(*src));
    s->n_src = n;
    s->rng_dflt = 0; /* backoff factor 0.5, the first candidate picked */
    ck_assert_int_eq(gov_init(&s->g, src, n, n_caps, NULL, sim_rand, s, &hooks, 0), 0);
}

static void script_upstream(struct sim_call *c, size_t source, uint32_t n, struct reply *r)
{
    (void)source;
    ck_assert_msg(c->n_script > 0, "call %td has no script", c - S.c);
    *r = c->script[n - 1 < c->n_script ? n - 1 : c->n_script - 1];
}

static void script_push(struct sim_call *c, struct reply r)
{
    ck_assert_uint_lt(c->n_script, 64);
    c->script[c->n_script++] = r;
}

/* A call of capability 0 in scope "chat" that starts at `start_at`. */
static struct sim_call *sim_add(struct sim *s, double start_at, const struct gov_policy *pol)
{
    ck_assert_uint_lt(s->n, SIM_MAX_CALLS);
    struct sim_call *c = &s->c[s->n++];

    c->scope = "chat";
    c->pol = *pol;
    c->up = script_upstream;
    sim_schedule(s, c, SIM_START, start_at);
    return c;
}

static void sim_follow(struct sim *s, struct sim_call *c, const struct gov_decision *d,
                       bool from_step)
{
    c->d = *d;
    switch (d->action) {
    case GOV_ATTEMPT:
        ck_assert_uint_lt(d->source, s->n_src);
        if (c->seen < SIM_LOG) {
            c->att_source[c->seen] = d->source;
            c->att_at[c->seen] = s->now;
        }
        c->seen++;
        c->up(c, d->source, c->seen, &c->cur);
        if (isinf(c->cur.duration_s))
            c->next = SIM_HUNG;
        else
            sim_schedule(s, c, SIM_END, s->now + c->cur.duration_s);
        break;
    case GOV_WAIT:
        if (from_step) {
            s->step_waits++;
            ck_assert_msg(d->wake_at > s->now, "WAIT at %.9g for %.9g: a busy loop", s->now,
                          d->wake_at);
        }
        ck_assert_msg(d->wake_at >= s->now, "WAIT until %.9g, in the past of %.9g", d->wake_at,
                      s->now);
        sim_schedule(s, c, SIM_STEP, d->wake_at);
        break;
    case GOV_DONE:
        c->done = true;
        c->result = d->result;
        c->done_at = s->now;
        c->retry_after_s = d->retry_after_s;
        c->stalled_at_done = gov_call_stalled_s(&c->k, s->now);
        ck_assert_msg(d->retry_after_s >= 0, "retry_after_s %g", d->retry_after_s);
        gov_call_fini(&c->k, s->now);
        c->next = SIM_FINISHED;
        break;
    }
}

static void sim_step(struct sim *s, struct sim_call *c)
{
    struct gov_decision d;

    s->steps++;
    gov_call_step(&c->k, s->now, &d);
    sim_follow(s, c, &d, true);
}

static void sim_start(struct sim *s, struct sim_call *c)
{
    int rc = gov_call_init(&c->k, &s->g, c->capability, c->scope, &c->pol, c->deadline_at,
                           c->est_tokens, s->now);

    ck_assert_int_eq(rc, 0);
    c->k.ud = c;
    if (c->use)
        gov_call_set_sources(&c->k, c->use);
    sim_step(s, c);
}

/* Runs every event due at or before `until`, in time order. */
static void sim_run(struct sim *s, double until)
{
    for (;;) {
        struct sim_call *c = NULL;

        for (size_t i = 0; i < s->n; i++) {
            struct sim_call *x = &s->c[i];
            if (x->next != SIM_START && x->next != SIM_STEP && x->next != SIM_END)
                continue;
            if (!c || x->at < c->at || (x->at == c->at && x->seq < c->seq))
                c = x;
        }
        if (!c || c->at > until)
            break;
        ck_assert_msg(++s->iters < SIM_MAX_ITERS, "no end after %u iterations (now %.9g)", s->iters,
                      s->now);
        ck_assert_msg(c->at >= s->now, "time went back: %.9g -> %.9g", s->now, c->at);
        s->now = c->at;
        switch (c->next) {
        case SIM_START:
            sim_start(s, c);
            break;
        case SIM_STEP:
            sim_step(s, c);
            break;
        default: {
            struct gov_decision d;
            gov_call_on_outcome(&c->k, s->now, &c->cur.o, c->cur.tokens, &d);
            sim_follow(s, c, &d, false);
            break;
        }
        }
    }
    if (until > s->now && isfinite(until))
        s->now = until;
}

static void sim_run_all(struct sim *s)
{
    sim_run(s, INFINITY);
}

/* Steps a waiting call at `t` (no event may be due before). */
static const struct gov_decision *sim_poke(struct sim *s, struct sim_call *c, double t)
{
    sim_run(s, t);
    ck_assert_msg(c->next == SIM_STEP, "call %td is not waiting", c - s->c);
    s->now = t;
    sim_step(s, c);
    return &c->d;
}

/* Cancels a call (gov_call_fini) at `t`, as a client or task stop would. */
static void sim_cancel(struct sim *s, struct sim_call *c, double t)
{
    sim_run(s, t);
    ck_assert(c->next != SIM_FINISHED && c->next != SIM_START);
    s->now = t;
    gov_call_fini(&c->k, t);
    c->done = true;
    c->result = GOV_CANCELLED;
    c->done_at = t;
    c->next = SIM_FINISHED;
}

static void sim_fini(struct sim *s)
{
    for (size_t i = 0; i < s->n; i++) {
        if (s->c[i].next != SIM_FINISHED && s->c[i].next != SIM_START)
            gov_call_fini(&s->c[i].k, s->now);
    }
    gov_fini(&s->g);
}

static void check_result(const struct sim_call *c, enum gov_result want)
{
    ck_assert_msg(c->done, "call %td not done (state %s)", c - S.c,
                  gov_call_state_name(c->k.state));
    ck_assert_msg(c->result == want, "call %td: %s at %.9g, want %s", c - S.c,
                  gov_result_name(c->result), c->done_at, gov_result_name(want));
}

static double scope_age(struct sim *s, const char *scope)
{
    double age = -1;

    ck_assert_int_eq(s->g.backend.progress_age(s->g.backend.ud, scope, s->now, &age), 0);
    return age;
}

/* ===================================================================== */
/* The consequences docs/DESIGN.md §3.1 says tests must pin                       */
/* ===================================================================== */

/* 1. One attempt that runs past the window and times out does not exhaust
 * the stall budget: the retry budget is used, the second attempt succeeds. */
START_TEST(test_gov__timeout_does_not_exhaust_stall_budget)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat(); /* stall_window_s == timeout_s == 300 */

    sim_init(&S, &p, 1, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    script_push(c, rep_reason(310, REASON_TOTAL_TIMEOUT));
    script_push(c, rep_http(5, 200, NULL));
    sim_run_all(&S);
    check_result(c, GOV_OK);
    ck_assert_uint_eq(c->seen, 2);
    ck_assert_near(c->att_at[1], 311); /* 310 s attempt + 1 s backoff (2 s x 0.5) */
    ck_assert_near(c->done_at, 316);
    ck_assert_near(c->stalled_at_done, 1);
    ck_assert_uint_eq(c->k.fails, 1);
    sim_fini(&S);
}
END_TEST

/* 2. Real attempt time, however long, never triggers `stalled` by itself:
 * only the backoff sleeps between the attempts are stall time. */
START_TEST(test_gov__attempt_time_alone_never_stalls)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    p.breaker_failures = 100; /* keep breaker cool-downs out of this test */
    pol.max_attempts = 20;
    sim_init(&S, &p, 1, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    for (int i = 0; i < 10; i++)
        script_push(c, rep_http(1000, 503, NULL));
    script_push(c, rep_http(1, 200, NULL));
    sim_run_all(&S);
    /* Backoffs for fails 1..10: 2 x 2^(n-1) capped at 60, x 0.5:
     * 1+2+4+8+16+30x5 = 181 s of stall against 10,000 s of attempts. */
    check_result(c, GOV_OK);
    ck_assert_uint_eq(c->seen, 11);
    ck_assert_near(c->stalled_at_done, 181);
    ck_assert_near(c->done_at, 10000 + 181 + 1);
    sim_fini(&S);

    /* The same upstream failing throughout ends in retry_exhausted, never
     * stalled, after 10,000 s. */
    pol.max_attempts = 10;
    sim_init(&S, &p, 1, 1);
    c = sim_add(&S, 0, &pol);
    script_push(c, rep_http(1000, 503, NULL));
    sim_run_all(&S);
    check_result(c, GOV_RETRY_EXHAUSTED);
    ck_assert_uint_eq(c->seen, 10);
    ck_assert_near(c->done_at, 10000 + 151);
    ck_assert_near(c->stalled_at_done, 151);
    sim_fini(&S);
}
END_TEST

/* 3. Pure waiting — nothing runnable, no progress ever — ends in `stalled`
 * once the window is spent, and not a moment before. */
START_TEST(test_gov__pure_waiting_stalls_when_window_spent)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    /* (a) No permit: the only one is held by a call whose attempt hangs. */
    p.max_concurrency = 1;
    sim_init(&S, &p, 1, 1);
    struct sim_call *h = sim_add(&S, 0, &pol);
    script_push(h, rep_hang());
    struct sim_call *w = sim_add(&S, 10, &pol);
    sim_run(&S, 10);
    ck_assert_int_eq(w->d.action, GOV_WAIT);
    ck_assert_just_after(w->d.wake_at, 310);
    ck_assert_uint_eq(S.g.waitq[0].n, 1);
    ck_assert_int_eq(sim_poke(&S, w, 200)->action, GOV_WAIT);
    ck_assert_int_eq(sim_poke(&S, w, 310 - VERDICT_EPS)->action, GOV_WAIT);
    ck_assert_just_after(w->d.wake_at, 310);
    sim_run_all(&S);
    check_result(w, GOV_STALLED);
    ck_assert_just_after(w->done_at, 310);
    ck_assert_uint_eq(w->seen, 0);
    ck_assert_uint_eq(S.g.waitq[0].n, 0);
    sim_fini(&S);

    /* (b) A breaker open longer than the window (tripped by another call
     * whose failure is no progress). */
    p = src_params("a");
    p.breaker_failures = 1;
    p.breaker_cooldown_s = p.breaker_max_cooldown_s = 1000;
    sim_init(&S, &p, 1, 1);
    struct gov_policy once = pol;
    once.max_attempts = 1;
    struct sim_call *f = sim_add(&S, 0, &once);
    script_push(f, rep_http(1, 503, NULL));
    w = sim_add(&S, 5, &pol);
    sim_run(&S, 5);
    check_result(f, GOV_RETRY_EXHAUSTED);
    ck_assert_int_eq(S.g.sources[0].breaker.state, BREAKER_OPEN);
    ck_assert_int_eq(w->d.action, GOV_WAIT);
    ck_assert_just_after(w->d.wake_at, 305);
    ck_assert_int_eq(sim_poke(&S, w, 305 - VERDICT_EPS)->action, GOV_WAIT);
    sim_run_all(&S);
    check_result(w, GOV_STALLED);
    ck_assert_just_after(w->done_at, 305);
    /* Its best estimate of when the scope can serve: the half-open time. */
    ck_assert_near(w->retry_after_s, 1001 - w->done_at);
    sim_fini(&S);
}
END_TEST

/* 4a. Saturation with the 429 exemption: every attempt refunded, every
 * backoff charged, so the stall budget ends it — never an endless loop. */
START_TEST(test_gov__all_429_exempt_ends_stalled)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    p.breaker_failures = 1;
    sim_init(&S, &p, 1, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    script_push(c, rep_http(0.5, 429, NULL));
    sim_run_all(&S);
    /* Each round: a 0.5 s attempt (refunded) + a constant 1 s backoff
     * (fails stays 0, so n = max(fails, 1) = 1): 1.5 s of stall per round,
     * stalled_s > 300 after round 201. */
    check_result(c, GOV_STALLED);
    ck_assert_uint_eq(c->seen, 201);
    ck_assert_near(c->done_at, 301.5);
    ck_assert_uint_eq(c->k.fails, 0);
    ck_assert_int_eq(S.g.sources[0].breaker.state, BREAKER_CLOSED);
    ck_assert_uint_eq(S.n_br, 0);
    ck_assert_near(S.g.sources[0].aimd.limit, 1);
    ck_assert_uint_eq(S.g.sources[0].rate_limited, 201);
    sim_fini(&S);
}
END_TEST

/* 4b. Without the exemption a 429 is a transient failure: retry_exhausted
 * after exactly max_attempts — and still never trips the breaker. */
START_TEST(test_gov__all_429_not_exempt_retry_exhausted)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    p.breaker_failures = 1;
    pol.exempt_429 = false;
    sim_init(&S, &p, 1, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    script_push(c, rep_http(0.5, 429, NULL));
    sim_run_all(&S);
    check_result(c, GOV_RETRY_EXHAUSTED);
    ck_assert_uint_eq(c->seen, 3);
    ck_assert_uint_eq(c->k.fails, 3);
    ck_assert_near(c->done_at, 0.5 + 1 + 0.5 + 2 + 0.5);
    ck_assert_near(c->stalled_at_done, 3); /* only the backoffs */
    ck_assert_int_eq(S.g.sources[0].breaker.state, BREAKER_CLOSED);
    ck_assert_uint_eq(S.n_br, 0);
    sim_fini(&S);
}
END_TEST

/* 5. The queueing gateway: each attempt held the full
 * timeout_s, then 429; timeout = stall = 300 s, backoff base 2 s, rng 0.
 * The refund makes it one attempt and about 301 s, not 301 attempts and
 * 25 hours. */
START_TEST(test_gov__queueing_gateway_stalls_after_one_attempt)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    sim_init(&S, &p, 1, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    script_push(c, rep_http(300, 429, NULL));
    sim_run(&S, 299);
    ck_assert_near(gov_call_stalled_s(&c->k, 299), 0); /* in the attempt: productive */
    sim_run(&S, 300);
    ck_assert_near(gov_call_stalled_s(&c->k, 300), 300); /* refunded */
    ck_assert_int_eq(c->d.action, GOV_WAIT);
    ck_assert_near(c->d.wake_at, 301);
    sim_run_all(&S);
    check_result(c, GOV_STALLED);
    ck_assert_uint_eq(c->seen, 1);
    ck_assert_near(c->done_at, 301);
    ck_assert_near(c->stalled_at_done, 301);
    sim_fini(&S);
}
END_TEST

/* 6. The four quadrants of (local window exceeded?) x (scope progress
 * stale?). Set-up: one source with one permit. P holds it from 0 and
 * succeeds at `progress_at` — the scope's only progress, made by another
 * call through the same gov (none when progress_at < 0); H, queued behind
 * it, then takes the permit and hangs forever. W, the call under test,
 * starts at w_start and can only wait. Window 300 s. */
static struct sim_call *quad_setup(double progress_at, double w_start)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    p.max_concurrency = 1;
    sim_init(&S, &p, 1, 1);
    if (progress_at >= 0) {
        struct sim_call *pc = sim_add(&S, 0, &pol);
        script_push(pc, rep_http(progress_at, 200, NULL));
    }
    struct sim_call *h = sim_add(&S, 0, &pol);
    script_push(h, rep_hang());
    return sim_add(&S, w_start, &pol);
}

START_TEST(test_gov__quadrant_neither_exceeded_waits)
{
    struct sim_call *w = quad_setup(10, 5);

    const struct gov_decision *d = sim_poke(&S, w, 200);
    ck_assert_near(gov_call_stalled_s(&w->k, 200), 195);
    ck_assert_near(scope_age(&S, "chat"), 190);
    ck_assert_int_eq(d->action, GOV_WAIT);
    /* Next verdict possible when both have run out: max(5, 10) + 300. */
    ck_assert_just_after(d->wake_at, 310);
    sim_fini(&S);
}
END_TEST

START_TEST(test_gov__quadrant_stale_scope_only_waits)
{
    struct sim_call *w = quad_setup(10, 400);

    const struct gov_decision *d = sim_poke(&S, w, 600);
    ck_assert_near(gov_call_stalled_s(&w->k, 600), 200);
    ck_assert_near(scope_age(&S, "chat"), 590);
    ck_assert_int_eq(d->action, GOV_WAIT);
    ck_assert_just_after(d->wake_at, 700); /* the call's own window */
    sim_run_all(&S);
    check_result(w, GOV_STALLED);
    ck_assert_just_after(w->done_at, 700);
    sim_fini(&S);
}
END_TEST

/* Local window spent, but another call of the scope succeeded recently:
 * the scope is being served, so this call keeps waiting its turn. */
START_TEST(test_gov__quadrant_local_exceeded_fresh_progress_waits)
{
    struct sim_call *w = quad_setup(10, 0.5);

    /* W wakes at its own verdict time 300.5 and finds the scope alive. */
    sim_run(&S, 301);
    check_result(&S.c[0], GOV_OK);
    ck_assert(!w->done);
    ck_assert_int_eq(w->d.action, GOV_WAIT);
    ck_assert(gov_call_stalled_s(&w->k, 301) > 300);
    ck_assert_near(scope_age(&S, "chat"), 291);
    ck_assert_just_after(w->d.wake_at, 310);
    ck_assert_int_eq(sim_poke(&S, w, 309.9)->action, GOV_WAIT);
    /* Once the scope's progress is stale as well: both exceeded. */
    sim_run_all(&S);
    check_result(w, GOV_STALLED);
    ck_assert_just_after(w->done_at, 310);
    sim_fini(&S);
}
END_TEST

START_TEST(test_gov__quadrant_both_exceeded_stalls)
{
    struct sim_call *w = quad_setup(10, 200);

    ck_assert_int_eq(sim_poke(&S, w, 500 - VERDICT_EPS)->action, GOV_WAIT);
    sim_run_all(&S);
    check_result(w, GOV_STALLED);
    ck_assert_just_after(w->done_at, 500);
    ck_assert(w->stalled_at_done > 300);
    ck_assert(scope_age(&S, "chat") > 300);
    ck_assert_uint_eq(w->seen, 0);
    sim_fini(&S);
}
END_TEST

/* A scope that never succeeded has progress age +INF: stale. */
START_TEST(test_gov__quadrant_never_progressed_counts_as_stale)
{
    struct sim_call *w = quad_setup(-1, 5);

    ck_assert_int_eq(sim_poke(&S, w, 100)->action, GOV_WAIT);
    ck_assert(isinf(scope_age(&S, "chat")));
    ck_assert_int_eq(sim_poke(&S, w, 305 - VERDICT_EPS)->action, GOV_WAIT);
    sim_run_all(&S);
    check_result(w, GOV_STALLED);
    ck_assert_just_after(w->done_at, 305);
    sim_fini(&S);
}
END_TEST

/* 7. Two concurrent calls in the same scope and gov: B stalls on its own
 * 300 s while A's 1000 s attempt is in flight (a shared clock would count
 * that attempt as B's productive time), and A's clock is not charged with
 * B's waits. */
START_TEST(test_gov__concurrent_calls_separate_stall_clocks)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    p.max_concurrency = 2;
    p.aimd_initial = p.aimd_min = 2; /* B's 429s must not take A's permit away */
    sim_init(&S, &p, 1, 1);
    struct sim_call *a = sim_add(&S, 0, &pol);
    script_push(a, rep_http(1000, 503, NULL));
    script_push(a, rep_http(1, 200, NULL));
    struct sim_call *b = sim_add(&S, 50, &pol);
    script_push(b, rep_http(0.5, 429, NULL));
    sim_run_all(&S);
    check_result(b, GOV_STALLED);
    ck_assert_uint_eq(b->seen, 201);
    ck_assert_near(b->done_at, 50 + 301.5);
    check_result(a, GOV_OK);
    ck_assert_near(a->done_at, 1002);
    ck_assert_near(a->stalled_at_done, 1);
    sim_fini(&S);
}
END_TEST

/* 8. Cancelling inside an attempt (gov_call_fini while ATTEMPTING) accounts
 * the attempt and releases its permit at once: the waiter is woken and
 * admitted. */
START_TEST(test_gov__cancel_inside_attempt_releases_permit)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    p.max_concurrency = 1;
    sim_init(&S, &p, 1, 1);
    struct sim_call *a = sim_add(&S, 0, &pol);
    script_push(a, rep_hang());
    struct sim_call *w = sim_add(&S, 1, &pol);
    script_push(w, rep_http(1, 200, NULL));
    sim_run(&S, 50);
    ck_assert_int_eq(a->k.state, GOV_CALL_ATTEMPTING);
    ck_assert_int_eq(w->d.action, GOV_WAIT);
    ck_assert_uint_eq(S.g.sources[0].in_flight, 1);
    ck_assert_uint_eq(S.n_wakes, 0);

    sim_cancel(&S, a, 50);
    ck_assert_uint_eq(S.g.sources[0].in_flight, 0);
    ck_assert_near(a->k.clock.productive_s, 50); /* the attempt is accounted */
    ck_assert_near(gov_call_stalled_s(&a->k, 50), 0);
    ck_assert(!a->k.clock.attempting);
    ck_assert_uint_eq(S.n_wakes, 1);
    ck_assert_ptr_eq(S.wake_k[0], &w->k);
    ck_assert_near(S.wake_t[0], 50);
    ck_assert_uint_eq(S.g.wakes, 1);

    sim_run_all(&S);
    check_result(w, GOV_OK);
    ck_assert_near(w->att_at[0], 50);
    ck_assert_near(w->done_at, 51);
    gov_call_fini(&a->k, 60); /* idempotent */
    sim_fini(&S);
}
END_TEST

/* Cancelling the half-open probe frees the probe slot: a waiter becomes the
 * next probe. */
START_TEST(test_gov__cancel_frees_half_open_probe)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat(), once = pol_chat();

    p.breaker_failures = 1;
    p.breaker_cooldown_s = 10;
    once.max_attempts = 1;
    sim_init(&S, &p, 1, 1);
    struct sim_call *f = sim_add(&S, 0, &once);
    script_push(f, rep_http(1, 503, NULL));
    struct sim_call *probe = sim_add(&S, 11, &pol);
    script_push(probe, rep_hang());
    struct sim_call *w = sim_add(&S, 12, &pol);
    script_push(w, rep_http(1, 200, NULL));
    sim_run(&S, 20);
    ck_assert_int_eq(S.g.sources[0].breaker.state, BREAKER_HALF_OPEN);
    ck_assert(probe->k.probe);
    ck_assert(S.g.sources[0].breaker.probe_busy);
    ck_assert_int_eq(w->d.action, GOV_WAIT);

    sim_cancel(&S, probe, 20);
    ck_assert(!S.g.sources[0].breaker.probe_busy);
    ck_assert_uint_eq(S.n_wakes, 1);
    ck_assert_ptr_eq(S.wake_k[0], &w->k);
    sim_run_all(&S);
    check_result(w, GOV_OK);
    ck_assert_near(w->att_at[0], 20);
    ck_assert_int_eq(S.g.sources[0].breaker.state, BREAKER_CLOSED);
    sim_fini(&S);
}
END_TEST

/* ===================================================================== */
/* Breaker, AIMD and the other admission rules through the loop          */
/* ===================================================================== */

/* closed -> open after `failures` transient failures; half-open after the
 * cool-down with one probe; a failed probe doubles the cool-down (capped);
 * a successful probe closes it. */
START_TEST(test_gov__breaker_cycle_in_the_loop)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    p.breaker_failures = 2;
    p.breaker_cooldown_s = 10;
    p.breaker_max_cooldown_s = 30;
    pol.max_attempts = 10;
    pol.stall_window_s = 1000;
    sim_init(&S, &p, 1, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    for (int i = 0; i < 4; i++)
        script_push(c, rep_http(1, 503, NULL));
    script_push(c, rep_http(1, 200, NULL));
    sim_run_all(&S);
    check_result(c, GOV_OK);
    /* Attempts: 0-1 fail, backoff 1; 2-3 fail -> open until 13, backoff 2,
     * wait; probe 13-14 fails -> open 20 s until 34, backoff 4, wait; probe
     * 34-35 fails -> open 30 s (capped) until 65; probe 65-66 succeeds. */
    const double want_at[] = { 0, 2, 13, 34, 65 };
    ck_assert_uint_eq(c->seen, 5);
    for (size_t i = 0; i < 5; i++)
        ck_assert_near(c->att_at[i], want_at[i]);
    const struct {
        enum breaker_state from, to;
        double at;
    } want[] = {
        { BREAKER_CLOSED, BREAKER_OPEN, 3 },       { BREAKER_OPEN, BREAKER_HALF_OPEN, 13 },
        { BREAKER_HALF_OPEN, BREAKER_OPEN, 14 },   { BREAKER_OPEN, BREAKER_HALF_OPEN, 34 },
        { BREAKER_HALF_OPEN, BREAKER_OPEN, 35 },   { BREAKER_OPEN, BREAKER_HALF_OPEN, 65 },
        { BREAKER_HALF_OPEN, BREAKER_CLOSED, 66 },
    };
    ck_assert_uint_eq(S.n_br, sizeof(want) / sizeof(want[0]));
    for (size_t i = 0; i < S.n_br; i++) {
        ck_assert_uint_eq(S.br[i].source, 0);
        ck_assert_msg(S.br[i].from == want[i].from && S.br[i].to == want[i].to,
                      "transition %zu: %s -> %s", i, breaker_state_name(S.br[i].from),
                      breaker_state_name(S.br[i].to));
        ck_assert_near(S.br[i].at, want[i].at);
    }
    ck_assert_near(S.g.sources[0].breaker.cooldown_s, 10); /* reset */
    sim_fini(&S);
}
END_TEST

/* A second call during the half-open probe is not admitted as a second
 * probe; it runs when the probe has closed the breaker. */
START_TEST(test_gov__half_open_admits_exactly_one_probe)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat(), once = pol_chat();

    p.breaker_failures = 1;
    p.breaker_cooldown_s = 10;
    once.max_attempts = 1;
    sim_init(&S, &p, 1, 1);
    struct sim_call *f = sim_add(&S, 0, &once);
    script_push(f, rep_http(1, 503, NULL));
    struct sim_call *a = sim_add(&S, 11, &pol);
    script_push(a, rep_http(5, 200, NULL));
    struct sim_call *b = sim_add(&S, 12, &pol);
    script_push(b, rep_http(1, 200, NULL));
    sim_run(&S, 12);
    ck_assert_int_eq(a->k.state, GOV_CALL_ATTEMPTING);
    ck_assert(a->k.probe);
    ck_assert_int_eq(b->d.action, GOV_WAIT);
    ck_assert_uint_eq(S.g.sources[0].in_flight, 1);
    sim_run_all(&S);
    check_result(a, GOV_OK);
    check_result(b, GOV_OK);
    ck_assert_near(b->att_at[0], 16); /* woken by the probe's release */
    ck_assert(!b->k.probe);
    sim_fini(&S);
}
END_TEST

/* With a source's breaker open, calls fail over to the next one. */
static void failover_upstream(struct sim_call *c, size_t source, uint32_t n, struct reply *r)
{
    (void)c;
    (void)n;
    *r = source == 0 ? rep_http(1, 503, NULL) : rep_http(1, 200, NULL);
}

START_TEST(test_gov__failover_when_breaker_open)
{
    struct gov_source_params p[2] = { src_params("primary"), src_params("backup") };
    struct gov_policy once = pol_chat();

    p[0].breaker_failures = 2;
    p[1].priority = 1;
    once.max_attempts = 1;
    sim_init(&S, p, 2, 1);
    struct sim_call *c[3];
    for (int i = 0; i < 3; i++) {
        c[i] = sim_add(&S, i * 10, &once);
        c[i]->up = failover_upstream;
    }
    sim_run_all(&S);
    check_result(c[0], GOV_RETRY_EXHAUSTED);
    check_result(c[1], GOV_RETRY_EXHAUSTED);
    ck_assert_int_eq(S.g.sources[0].breaker.state, BREAKER_OPEN);
    check_result(c[2], GOV_OK);
    ck_assert_uint_eq(c[2]->att_source[0], 1);
    sim_fini(&S);
}
END_TEST

/* AIMD: success += increase/limit; 429 and timeouts x decrease (floored at
 * min); other failures leave the limit alone. */
START_TEST(test_gov__aimd_decrease_on_429_and_timeouts_only)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy once = pol_chat();
    p.max_concurrency = 16;
    p.aimd_initial = 8;
    p.breaker_failures = 100;
    once.max_attempts = 1;
    once.exempt_429 = false;
    struct reply r[] = {
        rep_http(1, 503, NULL),
        rep_reason(1, REASON_CONNECT_FAILED),
        rep_reason(1, REASON_CONNECTION_RESET),
        rep_http(1, 400, NULL),
        rep_reason(1, REASON_TTFT_TIMEOUT),
        rep_reason(1, REASON_TOTAL_TIMEOUT),
        rep_reason(1, REASON_IDLE_TIMEOUT),
        rep_reason(1, REASON_CONNECT_TIMEOUT),
        rep_http(1, 429, NULL),
        rep_http(1, 200, NULL),
        rep_http(1, 200, NULL),
    };
    const double want[] = { 8, 8, 8, 8, 4, 2, 1, 1, 1, 2, 2.5 };
    sim_init(&S, &p, 1, 1);
    for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++) {
        struct sim_call *c = sim_add(&S, (double)i * 10, &once);
        script_push(c, r[i]);
    }
    for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++) {
        sim_run(&S, (double)i * 10 + 5);
        ck_assert_msg(fabs(S.g.sources[0].aimd.limit - want[i]) < REL_EPS,
                      "after %s: limit %g, want %g", outcome_reason_name(r[i].o.reason),
                      S.g.sources[0].aimd.limit, want[i]);
    }
    sim_fini(&S);

    /* An exempt 429 decreases as well. */
    once.exempt_429 = true;
    sim_init(&S, &p, 1, 1);
    struct sim_call *c = sim_add(&S, 0, &once);
    script_push(c, rep_http(1, 429, NULL));
    script_push(c, rep_http(1, 200, NULL));
    sim_run_all(&S);
    check_result(c, GOV_OK);
    ck_assert_near(S.g.sources[0].aimd.limit, 4 + 1.0 / 4);
    sim_fini(&S);
}
END_TEST

/* Permits = min(max_concurrency, floor(AIMD limit)), and the AIMD limit
 * never grows beyond max_concurrency. */
START_TEST(test_gov__permits_min_of_max_concurrency_and_aimd)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    p.max_concurrency = 3;
    p.aimd_initial = 2;
    sim_init(&S, &p, 1, 1);
    struct sim_call *c[3];
    for (int i = 0; i < 3; i++) {
        c[i] = sim_add(&S, 0, &pol);
        script_push(c[i], rep_hang());
    }
    sim_run(&S, 1);
    ck_assert_uint_eq(S.g.sources[0].in_flight, 2);
    ck_assert_int_eq(c[2]->d.action, GOV_WAIT);
    double at = 0;
    ck_assert(!gov_source_runnable(&S.g, 0, 0, 1, &at));
    ck_assert(isinf(at)); /* waits for a release, not a known time */
    sim_fini(&S);

    /* Successes raise the limit 2 -> 2.5 -> 2.9 -> 3.24.. capped at 3. */
    sim_init(&S, &p, 1, 1);
    for (int i = 0; i < 8; i++) {
        struct sim_call *x = sim_add(&S, i, &pol);
        script_push(x, rep_http(0.5, 200, NULL));
    }
    sim_run_all(&S);
    ck_assert_near(S.g.sources[0].aimd.limit, 3);
    for (int i = 0; i < 4; i++) {
        struct sim_call *x = sim_add(&S, 100, &pol);
        script_push(x, rep_hang());
    }
    sim_run(&S, 100);
    ck_assert_uint_eq(S.g.sources[0].in_flight, 3);
    ck_assert_int_eq(S.c[11].d.action, GOV_WAIT);
    sim_fini(&S);

    /* An initial limit above max_concurrency is clamped to it. */
    p.max_concurrency = 2;
    p.aimd_initial = 10;
    sim_init(&S, &p, 1, 1);
    ck_assert_near(S.g.sources[0].aimd.limit, 2);
    sim_fini(&S);
}
END_TEST

/* The pacer: starts on one source at least min_interval apart. */
START_TEST(test_gov__pacer_min_interval)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    p.pacer_min_interval_s = 2;
    sim_init(&S, &p, 1, 1);
    struct sim_call *c[3];
    const double start[] = { 0, 0.5, 2.5 };
    for (int i = 0; i < 3; i++) {
        c[i] = sim_add(&S, start[i], &pol);
        script_push(c[i], rep_http(10, 200, NULL));
    }
    sim_run(&S, 0.5);
    ck_assert_int_eq(c[1]->d.action, GOV_WAIT);
    ck_assert_near(c[1]->d.wake_at, 2);
    sim_run_all(&S);
    ck_assert_near(c[0]->att_at[0], 0);
    ck_assert_near(c[1]->att_at[0], 2);
    ck_assert_near(c[2]->att_at[0], 4);
    for (int i = 0; i < 3; i++)
        check_result(c[i], GOV_OK);
    sim_fini(&S);
}
END_TEST

/* An RPM limit queues rather than rejects: the next call waits exactly
 * until the bucket has refilled one request. */
START_TEST(test_gov__rpm_limit_queues)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    p.rpm = 2; /* one request per 30 s */
    sim_init(&S, &p, 1, 1);
    struct sim_call *c[3];
    for (int i = 0; i < 3; i++) {
        c[i] = sim_add(&S, 0, &pol);
        script_push(c[i], rep_http(1, 200, NULL));
    }
    sim_run_all(&S);
    for (int i = 0; i < 3; i++)
        check_result(c[i], GOV_OK);
    ck_assert_near(c[0]->att_at[0], 0);
    ck_assert_near(c[1]->att_at[0], 0);
    ck_assert_near(c[2]->att_at[0], 30);
    sim_fini(&S);
}
END_TEST

/* Tokens: the estimate is taken before the attempt and reconciled with the
 * real usage after; debt delays the next admission by exactly the time
 * needed to repay it. */
static void attempt_once(struct gov *g, double est, const struct reply *r, double now)
{
    struct gov_call k;
    struct gov_decision d;
    struct gov_policy pol = pol_chat();

    ck_assert_int_eq(gov_call_init(&k, g, 0, "chat", &pol, 0, est, now), 0);
    gov_call_step(&k, now, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    gov_call_on_outcome(&k, now, &r->o, r->tokens, &d);
    ck_assert_int_eq(d.action, GOV_DONE);
    gov_call_fini(&k, now);
}

START_TEST(test_gov__tokens_reserved_and_reconciled)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();
    struct gov g;
    struct gov_call k;
    struct gov_decision d;
    struct reply ok = rep_http(0, 200, NULL);

    p.tpm = 1200;           /* 20 tokens/s */
    p.daily_tokens = 86400; /* 1 token/s */
    ck_assert_int_eq(gov_init(&g, &p, 1, 1, NULL, NULL, NULL, NULL, 0), 0);
    struct gov_source *s = &g.sources[0];

    /* Reserved before the attempt. */
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 300, 0), 0);
    gov_call_step(&k, 0, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    ck_assert_near(bucket_level(&s->tpm, 0), 900);
    ck_assert_near(bucket_level(&s->daily, 0), 86100);
    /* Reconciled: it used 100. */
    ok.tokens = 100;
    gov_call_on_outcome(&k, 0, &ok.o, ok.tokens, &d);
    ck_assert_int_eq(d.result, GOV_OK);
    gov_call_fini(&k, 0);
    ck_assert_near(bucket_level(&s->tpm, 0), 1100);
    ck_assert_near(bucket_level(&s->daily, 0), 86300);

    ok.tokens = -1; /* unknown usage: the estimate stands */
    attempt_once(&g, 300, &ok, 0);
    ck_assert_near(bucket_level(&s->tpm, 0), 800);
    ok.tokens = 1400; /* far above its estimate: debt */
    attempt_once(&g, 300, &ok, 0);
    ck_assert_near(bucket_level(&s->tpm, 0), -600);

    /* The next call (estimate 100) waits until 700 tokens have refilled. */
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 100, 0), 0);
    gov_call_step(&k, 0, &d);
    ck_assert_int_eq(d.action, GOV_WAIT);
    ck_assert_near(d.wake_at, 35);
    gov_call_step(&k, 35, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    gov_call_fini(&k, 35); /* cancelled: the estimate stays taken */
    ck_assert_near(bucket_level(&s->tpm, 35), 0);

    /* An estimate above the whole capacity is admitted when the bucket is
     * full, never refused forever. */
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 5000, 35), 0);
    gov_call_step(&k, 35, &d);
    ck_assert_int_eq(d.action, GOV_WAIT);
    ck_assert_near(d.wake_at, 35 + 60);
    gov_call_step(&k, 95, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    gov_call_fini(&k, 95);
    ck_assert_near(bucket_level(&s->tpm, 95), 1200 - 5000);
    gov_fini(&g);
}
END_TEST

/* itpm and otpm: input and output reserved apart, each reconciled with
 * its own count (the caller leaves cache reads out where they do not
 * count, docs/CONFIG.md §7). */
START_TEST(test_gov__input_and_output_tokens_apart)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();
    struct gov g;
    struct gov_call k;
    struct gov_decision d;
    struct reply ok = rep_http(0, 200, NULL);

    p.itpm = 600; /* 10 input tokens/s */
    p.otpm = 120; /* 2 output tokens/s */
    ck_assert_int_eq(gov_init(&g, &p, 1, 1, NULL, NULL, NULL, NULL, 0), 0);
    struct gov_source *s = &g.sources[0];

    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 400, 0), 0);
    gov_call_set_io(&k, 300, 100);
    gov_call_step(&k, 0, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    ck_assert_near(bucket_level(&s->itpm, 0), 300);
    ck_assert_near(bucket_level(&s->otpm, 0), 20);
    /* It read 5000 prompt tokens from the cache and sent 50 fresh ones:
     * counted as 50 where cache reads do not count; it wrote 10. */
    gov_call_on_io(&k, 50, 10, 0);
    ok.tokens = 5060;
    gov_call_on_outcome(&k, 0, &ok.o, ok.tokens, &d);
    ck_assert_int_eq(d.result, GOV_OK);
    gov_call_fini(&k, 0);
    ck_assert_near(bucket_level(&s->itpm, 0), 550);
    ck_assert_near(bucket_level(&s->otpm, 0), 110);
    /* The next call takes 100 of the 110 output tokens left; the one
     * after it finds 10 and waits for otpm alone to refill. */
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 200, 0), 0);
    gov_call_set_io(&k, 100, 100);
    gov_call_step(&k, 0, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    gov_call_on_io(&k, -1, -1, 0); /* unknown: the estimates stand */
    gov_call_on_outcome(&k, 0, &ok.o, -1, &d);
    gov_call_fini(&k, 0);
    ck_assert_near(bucket_level(&s->otpm, 0), 10);
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 200, 0), 0);
    gov_call_set_io(&k, 100, 100);
    gov_call_step(&k, 0, &d);
    ck_assert_int_eq(d.action, GOV_WAIT);
    ck_assert_near(d.wake_at, 45); /* 90 more output tokens at 2/s */
    gov_call_step(&k, 45, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    gov_call_fini(&k, 45);
    gov_fini(&g);
}
END_TEST

/* An app's own itpm and otpm (gov_app_params), on top of its sources':
 * reserved at the pick, reconciled with the counts, given back by an
 * attempt that never went out. */
START_TEST(test_gov__app_input_and_output_tokens)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();
    struct gov_app_params app = { .weight = 1, .itpm = 600, .otpm = 120 };
    struct gov g;
    struct gov_call k;
    struct gov_decision d;
    struct reply ok = rep_http(0, 200, NULL);

    ck_assert_int_eq(gov_init(&g, &p, 1, 1, NULL, NULL, NULL, NULL, 0), 0);
    ck_assert_int_eq(gov_set_apps(&g, &app, 1, 0), 0);
    struct gov_app *a = &g.apps[0];
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 400, 0), 0);
    gov_call_set_app(&k, 0);
    gov_call_set_io(&k, 300, 100);
    gov_call_step(&k, 0, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    ck_assert_near(bucket_level(&a->itpm, 0), 300);
    ck_assert_near(bucket_level(&a->otpm, 0), 20);
    gov_call_on_io(&k, 50, 10, 0);
    gov_call_on_outcome(&k, 0, &ok.o, 60, &d);
    gov_call_fini(&k, 0);
    ck_assert_near(bucket_level(&a->itpm, 0), 550);
    ck_assert_near(bucket_level(&a->otpm, 0), 110);
    /* A refused admission gives its reservation back. */
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 200, 0), 0);
    gov_call_set_app(&k, 0);
    gov_call_set_io(&k, 100, 100);
    gov_call_step(&k, 0, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    ck_assert_near(bucket_level(&a->otpm, 0), 10);
    gov_call_refused(&k, 0, 1, false, &d);
    ck_assert_near(bucket_level(&a->otpm, 0), 110);
    gov_call_fini(&k, 0);
    /* 120 output tokens wanted, 110 there: the app holds it back until
     * otpm refills (10 more at 2/s), although the source is free. */
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 200, 0), 0);
    gov_call_set_app(&k, 0);
    gov_call_set_io(&k, 10, 115);
    gov_call_step(&k, 0, &d);
    ck_assert_int_eq(d.action, GOV_WAIT);
    ck_assert_near(d.wake_at, 2.5);
    gov_call_step(&k, 2.5, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    gov_call_fini(&k, 2.5);
    gov_fini(&g);
}
END_TEST

/* gov_call_exclude: a source that cannot take the call (its budget) is
 * left out of it and the call steps on to the next source at once; with
 * none left it ends with the result given, and the reservations of the
 * excluded picks are back. */
START_TEST(test_gov__exclude_moves_to_another_source)
{
    struct gov_source_params p[2] = { src_params("a"), src_params("b") };
    struct gov_policy pol = pol_chat();
    struct gov g;
    struct gov_call k;
    struct gov_decision d;

    p[1].priority = 1;
    ck_assert_int_eq(gov_init(&g, p, 2, 1, NULL, NULL, NULL, NULL, 0), 0);
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 10, 0), 0);
    gov_call_step(&k, 0, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    ck_assert_uint_eq(d.source, 0);
    gov_call_exclude(&k, 0, GOV_BUDGET_EXHAUSTED, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    ck_assert_uint_eq(d.source, 1);
    ck_assert_uint_eq(g.sources[0].in_flight, 0);
    ck_assert_uint_eq(g.sources[1].in_flight, 1);
    gov_call_exclude(&k, 0, GOV_BUDGET_EXHAUSTED, &d);
    ck_assert_int_eq(d.action, GOV_DONE);
    ck_assert_int_eq(d.result, GOV_BUDGET_EXHAUSTED);
    ck_assert_uint_eq(g.sources[1].in_flight, 0);
    ck_assert_uint_eq(k.attempts, 0);
    gov_call_fini(&k, 0);
    gov_fini(&g);
}
END_TEST

/* ===================================================================== */
/* Selection                                                             */
/* ===================================================================== */

/* The lowest priority value is the first tier; the next tier is used when
 * the first has nothing runnable. rand = 0 would pick index 0 if tiers
 * were ignored. */
START_TEST(test_gov__selection_lower_priority_tier_first)
{
    struct gov_source_params p[2] = { src_params("backup"), src_params("primary") };
    struct gov_policy pol = pol_chat();

    p[0].priority = 1;
    p[1].priority = 0;
    p[0].max_concurrency = p[1].max_concurrency = 1;
    sim_init(&S, p, 2, 1);
    struct sim_call *a = sim_add(&S, 0, &pol);
    script_push(a, rep_hang());
    struct sim_call *b = sim_add(&S, 1, &pol);
    script_push(b, rep_hang());
    struct sim_call *c = sim_add(&S, 2, &pol);
    script_push(c, rep_hang());
    sim_run(&S, 2);
    ck_assert_uint_eq(a->att_source[0], 1);
    ck_assert_uint_eq(b->att_source[0], 0);
    ck_assert_int_eq(c->d.action, GOV_WAIT);
    sim_fini(&S);
}
END_TEST

/* Within a tier the choice is weighted by weight x free fraction of the
 * limit: A at 3/4 load has 0.25 of B's idle 1.0, so A is picked for
 * rand < 0.25 / 1.25 = 0.2 and B above. */
START_TEST(test_gov__selection_weighted_toward_less_loaded)
{
    struct gov_source_params p[2] = { src_params("a"), src_params("b") };
    struct gov_policy pol = pol_chat();
    const double rng[] = { 0, 0, 0, 0.19, 0.21 };

    sim_init(&S, p, 2, 1);
    sim_rng(&S, rng, 5, 0);
    for (int i = 0; i < 3; i++) {
        struct sim_call *x = sim_add(&S, i, &pol);
        script_push(x, rep_hang());
    }
    struct sim_call *x = sim_add(&S, 3, &pol);
    script_push(x, rep_hang());
    struct sim_call *y = sim_add(&S, 5, &pol);
    script_push(y, rep_hang());
    sim_run(&S, 3);
    for (int i = 0; i < 3; i++)
        ck_assert_uint_eq(S.c[i].att_source[0], 0);
    ck_assert_uint_eq(S.g.sources[0].in_flight, 4);
    ck_assert_uint_eq(x->att_source[0], 0); /* 0.19 x 1.25 = 0.2375 < 0.25 */
    sim_cancel(&S, x, 4);
    ck_assert_uint_eq(S.g.sources[0].in_flight, 3);
    sim_run(&S, 5);
    ck_assert_uint_eq(y->att_source[0], 1); /* 0.21 x 1.25 = 0.2625 >= 0.25 */
    sim_fini(&S);

    /* The configured weight scales the share: 3:1 when both are idle. */
    p[0].weight = 3;
    const double rng2[] = { 0.74, 0.76 };
    sim_init(&S, p, 2, 1);
    sim_rng(&S, rng2, 2, 0);
    struct gov_policy once = pol;
    for (int i = 0; i < 2; i++) {
        x = sim_add(&S, i, &once);
        script_push(x, rep_http(0.5, 200, NULL));
    }
    sim_run_all(&S);
    ck_assert_uint_eq(S.c[0].att_source[0], 0);
    ck_assert_uint_eq(S.c[1].att_source[0], 1);
    sim_fini(&S);
}
END_TEST

/* A source that failed this call is skipped when another is runnable —
 * even one of a later priority tier (failover). rand = 0 always. */
START_TEST(test_gov__selection_skips_source_failed_by_this_call)
{
    struct gov_source_params p[2] = { src_params("a"), src_params("b") };
    struct gov_policy pol = pol_chat();

    sim_init(&S, p, 2, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    c->up = failover_upstream;
    sim_run_all(&S);
    check_result(c, GOV_OK);
    ck_assert_uint_eq(c->seen, 2);
    ck_assert_uint_eq(c->att_source[0], 0);
    ck_assert_uint_eq(c->att_source[1], 1);
    sim_fini(&S);

    p[1].priority = 5;
    sim_init(&S, p, 2, 1);
    c = sim_add(&S, 0, &pol);
    c->up = failover_upstream;
    sim_run_all(&S);
    check_result(c, GOV_OK);
    ck_assert_uint_eq(c->att_source[0], 0);
    ck_assert_uint_eq(c->att_source[1], 1);
    /* Another call is not affected by this call's failure. */
    struct sim_call *d = sim_add(&S, 10, &pol);
    script_push(d, rep_http(1, 200, NULL));
    sim_run_all(&S);
    ck_assert_uint_eq(d->att_source[0], 0);
    sim_fini(&S);
}
END_TEST

/* ... but used again when it is the only runnable one. */
START_TEST(test_gov__selection_failed_source_used_when_only_one)
{
    struct gov_source_params p[2] = { src_params("a"), src_params("b") };
    struct gov_policy pol = pol_chat();

    sim_init(&S, p, 1, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    script_push(c, rep_http(1, 503, NULL));
    script_push(c, rep_http(1, 200, NULL));
    sim_run_all(&S);
    check_result(c, GOV_OK);
    ck_assert_uint_eq(c->att_source[0], 0);
    ck_assert_uint_eq(c->att_source[1], 0);
    sim_fini(&S);

    /* Two sources, the other one busy (H holds its only permit; rand 0.99
     * puts H there): the failed one is used again. */
    const double rng[] = { 0.99 };

    p[1].max_concurrency = 1;
    sim_init(&S, p, 2, 1);
    sim_rng(&S, rng, 1, 0);
    struct sim_call *h = sim_add(&S, 0, &pol);
    script_push(h, rep_hang());
    c = sim_add(&S, 0, &pol);
    script_push(c, rep_http(1, 503, NULL));
    script_push(c, rep_http(1, 200, NULL));
    sim_run_all(&S);
    ck_assert_uint_eq(h->att_source[0], 1);
    check_result(c, GOV_OK);
    ck_assert_uint_eq(c->att_source[0], 0);
    ck_assert_uint_eq(c->att_source[1], 0);
    sim_fini(&S);
}
END_TEST

/* ===================================================================== */
/* Backoff, Retry-After, deadline                                        */
/* ===================================================================== */

START_TEST(test_gov__backoff_doubles_capped_with_jitter)
{
    struct gov_policy pol = pol_chat(); /* base 2, max 60 */

    ck_assert_near(gov_backoff_s(&pol, 1, 0), 1);
    ck_assert_near(gov_backoff_s(&pol, 1, 0.5), 1.5);
    ck_assert_near(gov_backoff_s(&pol, 0, 0), 1); /* n < 1 counts as 1 */
    ck_assert_near(gov_backoff_s(&pol, 3, 0), 4);
    ck_assert_near(gov_backoff_s(&pol, 6, 0), 30); /* 64 capped at 60 */
    ck_assert_near(gov_backoff_s(&pol, 100, 0), 30);
    ck_assert_near(gov_backoff_s(&pol, UINT32_MAX, 0), 30);
    /* Jitter: [0.5, 1.0) of the capped value. */
    for (uint32_t n = 1; n <= 10; n++) {
        double full = fmin(60, 2 * pow(2, n - 1));
        for (double r = 0; r < 1; r += 0.125) {
            double b = gov_backoff_s(&pol, n, r);
            ck_assert(b >= 0.5 * full && b < full);
        }
        ck_assert(gov_backoff_s(&pol, n, 0.999999) < full);
    }

    /* In the loop: base 2, max 5; the random source is clamped into [0, 1)
     * (a -3 is 0, a 7 is just under 1). */
    struct gov_source_params p = src_params("a");
    const double rng[] = { 0, -3, 0, 7 };

    p.breaker_failures = 100;
    pol.backoff_max_s = 5;
    pol.max_attempts = 5;
    sim_init(&S, &p, 1, 1);
    sim_rng(&S, rng, 4, 0);
    struct sim_call *c = sim_add(&S, 0, &pol);
    script_push(c, rep_http(0, 503, NULL));
    sim_run_all(&S);
    check_result(c, GOV_RETRY_EXHAUSTED);
    ck_assert_uint_eq(c->seen, 5);
    /* Draws: pick 0, backoff(1) with -3 -> 2 x 0.5 = 1; pick 0, backoff(2)
     * with 7 -> just under 4; then 0: backoff(3) = min(8, 5) x 0.5 = 2.5,
     * backoff(4) = 2.5. */
    ck_assert_near(c->att_at[1], 1);
    ck_assert(c->att_at[2] - c->att_at[1] > 3.999 && c->att_at[2] - c->att_at[1] < 4);
    ck_assert_near(c->att_at[3] - c->att_at[2], 2.5);
    ck_assert_near(c->att_at[4] - c->att_at[3], 2.5);
    sim_fini(&S);
}
END_TEST

/* sleep = max(backoff, Retry-After), for exempt and counted 429s and for
 * a 5xx that carries Retry-After. */
START_TEST(test_gov__retry_after_longer_than_backoff_wins)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    sim_init(&S, &p, 1, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    script_push(c, rep_http(0.5, 429, "10")); /* exempt: backoff 1 */
    script_push(c, rep_http(0.5, 429, "7"));
    script_push(c, rep_http(0.5, 503, "20")); /* fails 1: backoff 1 */
    script_push(c, rep_http(0.5, 200, NULL));
    sim_run_all(&S);
    check_result(c, GOV_OK);
    ck_assert_near(c->att_at[1], 10.5);
    ck_assert_near(c->att_at[2], 10.5 + 0.5 + 7);
    ck_assert_near(c->att_at[3], 18 + 0.5 + 20);
    /* A Retry-After sleep is stall time like any other, and so are the
     * exempt 429 attempts (refunded); only the 503 and the success are
     * productive. */
    ck_assert_near(c->stalled_at_done, 0.5 + 10 + 0.5 + 7 + 20);
    sim_fini(&S);

    pol.exempt_429 = false;
    sim_init(&S, &p, 1, 1);
    c = sim_add(&S, 0, &pol);
    script_push(c, rep_http(0.5, 429, "7"));
    script_push(c, rep_http(0.5, 200, NULL));
    sim_run_all(&S);
    check_result(c, GOV_OK);
    ck_assert_near(c->att_at[1], 7.5);
    sim_fini(&S);
}
END_TEST

START_TEST(test_gov__backoff_longer_than_retry_after_wins)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    pol.backoff_base_s = 8; /* first backoff 4 s with rand 0 */
    sim_init(&S, &p, 1, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    script_push(c, rep_http(1, 429, "1")); /* exempt: backoff(max(0, 1)) = 4 */
    script_push(c, rep_http(1, 503, "0")); /* fails 1: backoff(1) = 4 */
    script_push(c, rep_http(1, 200, NULL));
    sim_run_all(&S);
    check_result(c, GOV_OK);
    ck_assert_near(c->att_at[1], 1 + 4);
    ck_assert_near(c->att_at[2], 6 + 4);
    sim_fini(&S);
}
END_TEST

/* The typed error's retry_after_s reflects the upstream's Retry-After. */
START_TEST(test_gov__error_carries_retry_after_estimate)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy once = pol_chat();

    once.exempt_429 = false;
    once.max_attempts = 1;
    sim_init(&S, &p, 1, 1);
    struct sim_call *c = sim_add(&S, 0, &once);
    script_push(c, rep_http(2, 429, "42"));
    sim_run_all(&S);
    check_result(c, GOV_RETRY_EXHAUSTED);
    ck_assert_near(c->done_at, 2);
    ck_assert_near(c->retry_after_s, 42);
    sim_fini(&S);
}
END_TEST

START_TEST(test_gov__deadline_exceeded_while_waiting)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    p.max_concurrency = 1;
    sim_init(&S, &p, 1, 1);
    struct sim_call *h = sim_add(&S, 0, &pol);
    script_push(h, rep_hang());
    struct sim_call *w = sim_add(&S, 0, &pol);
    w->deadline_at = 50;
    sim_run(&S, 0);
    ck_assert_int_eq(w->d.action, GOV_WAIT);
    ck_assert_near(w->d.wake_at, 50);
    sim_run_all(&S);
    check_result(w, GOV_DEADLINE_EXCEEDED);
    ck_assert_near(w->done_at, 50);
    ck_assert_uint_eq(S.g.waitq[0].n, 0);
    sim_fini(&S);
}
END_TEST

/* A backoff (or Retry-After) never sleeps past the call's deadline. */
START_TEST(test_gov__deadline_caps_backoff)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    sim_init(&S, &p, 1, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    c->deadline_at = 20;
    script_push(c, rep_http(1, 503, "100"));
    script_push(c, rep_http(1, 200, NULL));
    sim_run(&S, 1);
    ck_assert_int_eq(c->d.action, GOV_WAIT);
    ck_assert_near(c->d.wake_at, 20);
    sim_run_all(&S);
    check_result(c, GOV_DEADLINE_EXCEEDED);
    ck_assert_near(c->done_at, 20);
    ck_assert_uint_eq(c->seen, 1);
    sim_fini(&S);
}
END_TEST

/* A deadline that passed during a failed attempt ends the call at the
 * attempt's end, not with a WAIT whose wake_at lies in the past. */
START_TEST(test_gov__deadline_passed_during_attempt)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    sim_init(&S, &p, 1, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    c->deadline_at = 20;
    script_push(c, rep_http(30, 503, NULL));
    sim_run_all(&S);
    check_result(c, GOV_DEADLINE_EXCEEDED);
    ck_assert_near(c->done_at, 30);
    ck_assert_uint_eq(c->seen, 1);
    sim_fini(&S);
}
END_TEST

/* ===================================================================== */
/* Waiting: FIFO wake-ups                                                */
/* ===================================================================== */

START_TEST(test_gov__fifo_wake_order_on_release)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    p.max_concurrency = 2;
    p.aimd_initial = p.aimd_min = 2;
    sim_init(&S, &p, 1, 1);
    struct sim_call *h1 = sim_add(&S, 0, &pol), *h2 = sim_add(&S, 0, &pol);
    script_push(h1, rep_http(10, 200, NULL));
    script_push(h2, rep_http(15, 200, NULL));
    struct sim_call *w[3];
    for (int i = 0; i < 3; i++) {
        w[i] = sim_add(&S, 1 + i, &pol);
        script_push(w[i], rep_http(10, 200, NULL));
    }
    sim_run(&S, 3);
    ck_assert_uint_eq(S.g.waitq[0].n, 3);
    ck_assert_ptr_eq(S.g.waitq[0].head, &w[0]->k);
    sim_run_all(&S);
    const double want[] = { 10, 15, 20 };
    for (int i = 0; i < 3; i++) {
        check_result(w[i], GOV_OK);
        ck_assert_near(w[i]->att_at[0], want[i]);
    }
    /* Releases at 10 (h1), 15 (h2), 20 (w0), 25 (w1), 30 (w2): the first
     * three each wake the head waiter, in arrival order. */
    ck_assert_uint_eq(S.n_wakes, 3);
    for (int i = 0; i < 3; i++) {
        ck_assert_ptr_eq(S.wake_k[i], &w[i]->k);
        ck_assert_near(S.wake_t[i], want[i]);
    }
    sim_fini(&S);
}
END_TEST

/* Two permits released before any waiter could run wake two distinct
 * waiters, not the head twice (a lost wake-up would leave the second one
 * asleep until its stall verdict with a permit free). */
START_TEST(test_gov__simultaneous_releases_wake_distinct_waiters)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    p.max_concurrency = 2;
    p.aimd_initial = p.aimd_min = 2;
    sim_init(&S, &p, 1, 1);
    struct sim_call *h1 = sim_add(&S, 0, &pol), *h2 = sim_add(&S, 0, &pol);
    script_push(h1, rep_http(10, 200, NULL));
    script_push(h2, rep_http(10, 200, NULL));
    struct sim_call *w[3];
    for (int i = 0; i < 3; i++) {
        w[i] = sim_add(&S, 1 + i, &pol);
        script_push(w[i], rep_http(10, 200, NULL));
    }
    sim_run_all(&S);
    const double want[] = { 10, 10, 20 };
    for (int i = 0; i < 3; i++) {
        check_result(w[i], GOV_OK);
        ck_assert_near(w[i]->att_at[0], want[i]);
    }
    ck_assert_ptr_eq(S.wake_k[0], &w[0]->k);
    ck_assert_ptr_eq(S.wake_k[1], &w[1]->k);
    sim_fini(&S);
}
END_TEST

/* A woken waiter that leaves before using its wake-up (cancelled) hands it
 * to the next waiter. */
START_TEST(test_gov__woken_waiter_leaving_passes_wake_on)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    p.max_concurrency = 1;
    sim_init(&S, &p, 1, 1);
    S.manual_wakes = true;
    struct sim_call *h = sim_add(&S, 0, &pol);
    script_push(h, rep_hang());
    struct sim_call *w1 = sim_add(&S, 1, &pol), *w2 = sim_add(&S, 2, &pol);
    script_push(w2, rep_http(1, 200, NULL));
    sim_cancel(&S, h, 5);
    ck_assert_uint_eq(S.n_wakes, 1);
    ck_assert_ptr_eq(S.wake_k[0], &w1->k);
    sim_cancel(&S, w1, 6);
    ck_assert_uint_eq(S.n_wakes, 2);
    ck_assert_ptr_eq(S.wake_k[1], &w2->k);
    ck_assert_int_eq(sim_poke(&S, w2, 6)->action, GOV_ATTEMPT);
    sim_fini(&S);
}
END_TEST

START_TEST(test_gov__fini_while_waiting_leaves_the_queue)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    p.max_concurrency = 1;
    sim_init(&S, &p, 1, 1);
    struct sim_call *h = sim_add(&S, 0, &pol);
    script_push(h, rep_hang());
    struct sim_call *w[3];
    for (int i = 0; i < 3; i++)
        w[i] = sim_add(&S, 1 + i, &pol);
    sim_run(&S, 5);
    ck_assert_uint_eq(S.g.waitq[0].n, 3);
    sim_cancel(&S, w[1], 5);
    ck_assert_uint_eq(S.g.waitq[0].n, 2);
    ck_assert_ptr_eq(S.g.waitq[0].head, &w[0]->k);
    ck_assert_ptr_eq(S.g.waitq[0].head->wq_next, &w[2]->k);
    ck_assert_ptr_eq(S.g.waitq[0].tail, &w[2]->k);
    sim_cancel(&S, w[0], 5);
    sim_cancel(&S, w[2], 5);
    ck_assert_uint_eq(S.g.waitq[0].n, 0);
    ck_assert_ptr_null(S.g.waitq[0].head);
    ck_assert_ptr_null(S.g.waitq[0].tail);
    ck_assert_uint_eq(S.n_wakes, 0); /* none was woken: nothing to hand on */
    gov_call_fini(&w[0]->k, 6);      /* idempotent */
    sim_fini(&S);
}
END_TEST

/* ===================================================================== */
/* Per-call source subsets (gov_call_set_sources)                        */
/* ===================================================================== */

/* Two sources of one permit each; returns their params in p[0..1]. */
static void subset_sources(struct gov_source_params p[2])
{
    p[0] = src_params("a");
    p[1] = src_params("b");
    for (int i = 0; i < 2; i++) {
        p[i].max_concurrency = 1;
        p[i].aimd_initial = p[i].aimd_min = 1;
    }
}

static const bool USE_A[2] = { true, false }, USE_B[2] = { false, true };

/* A call restricted to b never runs on a, even when a is free and the
 * random draw would pick it; it fails over within its subset only. */
START_TEST(test_gov__subset_picks_only_its_sources)
{
    struct gov_source_params p[2];
    struct gov_policy pol = pol_chat();

    subset_sources(p);
    p[0].max_concurrency = p[1].max_concurrency = 4;
    sim_init(&S, p, 2, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    c->use = USE_B;
    script_push(c, rep_http(1, 500, NULL));
    script_push(c, rep_http(1, 500, NULL));
    script_push(c, rep_http(1, 200, NULL));
    sim_run_all(&S);
    check_result(c, GOV_OK);
    ck_assert_uint_eq(c->seen, 3);
    for (uint32_t i = 0; i < c->seen; i++)
        ck_assert_uint_eq(c->att_source[i], 1);
    ck_assert_uint_eq(S.g.sources[0].attempts, 0);
    sim_fini(&S);
}
END_TEST

/* A permit released on a wakes the first waiter that may use a, not an
 * earlier waiter restricted to b (that one would find b still busy and
 * the permit of a would be wasted until the next release). */
START_TEST(test_gov__subset_release_wakes_a_waiter_that_can_use_it)
{
    struct gov_source_params p[2];
    struct gov_policy pol = pol_chat();

    subset_sources(p);
    sim_init(&S, p, 2, 1);
    struct sim_call *ha = sim_add(&S, 0, &pol), *hb = sim_add(&S, 0, &pol);
    ha->use = USE_A;
    hb->use = USE_B;
    script_push(ha, rep_http(10, 200, NULL));
    script_push(hb, rep_http(15, 200, NULL));
    struct sim_call *wb = sim_add(&S, 1, &pol), *wa = sim_add(&S, 2, &pol);
    wb->use = USE_B;
    wa->use = USE_A;
    script_push(wb, rep_http(1, 200, NULL));
    script_push(wa, rep_http(1, 200, NULL));
    sim_run(&S, 3);
    ck_assert_uint_eq(S.g.waitq[0].n, 2);
    ck_assert_ptr_eq(S.g.waitq[0].head, &wb->k);
    sim_run_all(&S);
    check_result(wa, GOV_OK);
    check_result(wb, GOV_OK);
    ck_assert_near(wa->att_at[0], 10);
    ck_assert_uint_eq(wa->att_source[0], 0);
    ck_assert_near(wb->att_at[0], 15);
    ck_assert_uint_eq(wb->att_source[0], 1);
    /* Exactly one wake-up each, at its own source's release. */
    ck_assert_uint_eq(S.n_wakes, 2);
    ck_assert_ptr_eq(S.wake_k[0], &wa->k);
    ck_assert_near(S.wake_t[0], 10);
    ck_assert_ptr_eq(S.wake_k[1], &wb->k);
    ck_assert_near(S.wake_t[1], 15);
    sim_fini(&S);
}
END_TEST

/* A woken waiter leaving without using its wake-up hands it to the next
 * waiter that may use the released source, skipping one that may not. */
START_TEST(test_gov__subset_wake_handed_on_within_the_subset)
{
    struct gov_source_params p[2];
    struct gov_policy pol = pol_chat();

    subset_sources(p);
    sim_init(&S, p, 2, 1);
    S.manual_wakes = true;
    struct sim_call *ha = sim_add(&S, 0, &pol), *hb = sim_add(&S, 0, &pol);
    ha->use = USE_A;
    hb->use = USE_B;
    script_push(ha, rep_hang());
    script_push(hb, rep_hang());
    struct sim_call *w1 = sim_add(&S, 1, &pol), *w2 = sim_add(&S, 2, &pol),
                    *w3 = sim_add(&S, 3, &pol);
    w1->use = USE_A;
    w2->use = USE_B;
    w3->use = USE_A;
    script_push(w3, rep_http(1, 200, NULL));
    sim_cancel(&S, ha, 5);
    ck_assert_uint_eq(S.n_wakes, 1);
    ck_assert_ptr_eq(S.wake_k[0], &w1->k);
    sim_cancel(&S, w1, 6);
    ck_assert_uint_eq(S.n_wakes, 2);
    ck_assert_ptr_eq(S.wake_k[1], &w3->k);
    const struct gov_decision *d = sim_poke(&S, w3, 6);
    ck_assert_int_eq(d->action, GOV_ATTEMPT);
    ck_assert_uint_eq(d->source, 0);
    sim_fini(&S);
}
END_TEST

/* Retry-After on the one source of its subset decides the call's wait and
 * its error's retry_after_s: another source of the capability, free but
 * not the call's, neither shortens the wait nor the hint. */
START_TEST(test_gov__subset_retry_after_counts_its_sources_only)
{
    struct gov_source_params p[2];
    struct gov_policy pol = pol_chat();

    subset_sources(p);
    pol.max_attempts = 1;
    sim_init(&S, p, 2, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    c->use = USE_A;
    script_push(c, rep_http(1, 503, "40"));
    sim_run_all(&S);
    check_result(c, GOV_RETRY_EXHAUSTED);
    ck_assert_near(c->retry_after_s, 40);
    sim_fini(&S);
}
END_TEST

/* A reload keeps a restricted call's subset, in the new order, and a
 * source the reload adds is not in it. */
START_TEST(test_gov__subset_kept_across_reconf)
{
    struct gov_source_params p[2], np[3];
    struct gov_policy pol = pol_chat();
    struct gov_reconf r;
    struct gov_source_note *notes;
    const long from[3] = { 1, -1, 0 }; /* b, new, a */

    subset_sources(p);
    sim_init(&S, p, 2, 1);
    struct sim_call *c = sim_add(&S, 0, &pol), *all = sim_add(&S, 0, &pol);
    c->use = USE_B;
    script_push(c, rep_hang());
    script_push(all, rep_hang());
    sim_run(&S, 0);
    np[0] = p[1];
    np[1] = src_params("new");
    np[2] = p[0];
    ck_assert_int_eq(gov_reconf_prepare(&r, &S.g, np, from, 3, 1, 0), 0);
    ck_assert_int_eq(gov_call_reconf_prepare(&c->k, &r, &notes), 0);
    struct gov_source_note *notes_all;
    ck_assert_int_eq(gov_call_reconf_prepare(&all->k, &r, &notes_all), 0);
    gov_reconf_commit(&S.g, &r);
    gov_call_reconf_commit(&c->k, &r, notes);
    gov_call_reconf_commit(&all->k, &r, notes_all);
    gov_reconf_finish(&r);
    ck_assert(!c->k.notes[0].excluded); /* b */
    ck_assert(c->k.notes[1].excluded);  /* new */
    ck_assert(c->k.notes[2].excluded);  /* a */
    for (int i = 0; i < 3; i++)
        ck_assert(!all->k.notes[i].excluded);
    sim_fini(&S);
}
END_TEST

/* ===================================================================== */
/* Prompt-cache affinity (gov_call_set_affinity)                         */
/* ===================================================================== */

/* The source a call with affinity `key` is given now (the call is
 * started and released at once). */
static size_t affinity_pick(struct gov *g, const char *key, double now)
{
    struct gov_call k;
    struct gov_decision d;
    struct gov_policy pol = pol_chat();

    ck_assert_int_eq(gov_call_init(&k, g, 0, "chat", &pol, 0, 0, now), 0);
    gov_call_set_affinity(&k, key);
    gov_call_step(&k, now, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    size_t src = d.source;
    gov_call_fini(&k, now);
    return src;
}

/* Key `i` of name pattern `pattern`: "task-%d", "conv-%d", or (2 and up)
 * random letters, a fixed sequence for each pattern. */
static void affinity_key(char *key, size_t size, int pattern, int i)
{
    if (pattern == 0) {
        snprintf(key, size, "task-%d", i);
    } else if (pattern == 1) {
        snprintf(key, size, "conv-%d", i);
    } else {
        uint64_t x = 0x2545f4914f6cdd1dULL * (uint64_t)(i + 1) + (uint64_t)pattern;
        size_t len = 4 + (size_t)(x % 20);
        for (size_t j = 0; j < len && j + 1 < size; j++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            key[j] = (char)('a' + x % 26);
        }
        key[len < size ? len : size - 1] = '\0';
    }
}

/* 200 keys of several name patterns over 4 equal sources: each source
 * within 20 % of an even share (by construction, bounded loads); every call
 * of a key on one source; a source made unrunnable loses exactly its keys,
 * at once, spread over the others within the bound; they stay where they
 * moved when it is runnable again, and new keys fill it. */
START_TEST(test_gov__affinity_spreads_sticks_and_moves)
{
    struct gov_source_params p[4] = { src_params("s0"), src_params("s1"), src_params("s2"),
                                      src_params("s3") };
    size_t first[200], count[4] = { 0 }, moved[4] = { 0 };
    char key[32];
    int pattern = _i;

    sim_init(&S, p, 4, 1);
    for (int i = 0; i < 200; i++) {
        affinity_key(key, sizeof(key), pattern, i);
        first[i] = affinity_pick(&S.g, key, 0);
        count[first[i]]++;
        ck_assert_uint_eq(affinity_pick(&S.g, key, 0), first[i]);
    }
    for (int j = 0; j < 4; j++) {
        /* 200 - 3 * 53 .. ceil(1.05 * 200 / 4): within 20 % of 50 */
        ck_assert_msg(count[j] >= 41 && count[j] <= 53, "pattern %d: source %d has %zu keys",
                      pattern, j, count[j]);
        ck_assert_uint_eq(S.g.sources[j].affinity_keys, count[j]);
    }
    /* Source 1's breaker opens. */
    for (int f = 0; f < 5; f++)
        breaker_on_failure(&S.g.sources[1].breaker, false, 1, NULL, NULL);
    for (int i = 0; i < 200; i++) {
        affinity_key(key, sizeof(key), pattern, i);
        size_t now_at = affinity_pick(&S.g, key, 1);
        if (first[i] == 1) {
            ck_assert_uint_ne(now_at, 1);
            moved[now_at]++;
            first[i] = now_at;
        } else {
            ck_assert_uint_eq(now_at, first[i]);
        }
    }
    for (int j = 0; j < 4; j++)
        if (j != 1)
            ck_assert_msg(count[j] + moved[j] <= 200 * 1.05 / 3 + 1, "source %d holds %zu", j,
                          count[j] + moved[j]);
    /* Its breaker closes again: every key stays where it is now. */
    S.g.sources[1].breaker = (struct breaker){ 0 };
    breaker_init(&S.g.sources[1].breaker, 5, 30, 300);
    for (int i = 0; i < 200; i++) {
        affinity_key(key, sizeof(key), pattern, i);
        ck_assert_uint_eq(affinity_pick(&S.g, key, 100), first[i]);
    }
    /* New keys go to the emptied source until it holds its share. */
    size_t to_1 = 0;
    for (int i = 200; i < 250; i++) {
        affinity_key(key, sizeof(key), pattern, i);
        to_1 += affinity_pick(&S.g, key, 100) == 1;
    }
    ck_assert_msg(to_1 >= 40, "the emptied source got %zu of 50 new keys", to_1);
    sim_fini(&S);
}
END_TEST

/* Every key set, not most: 40 sets of 200 random names over 4 equal
 * sources, each source within the bound (a plain hash leaves about a
 * third of such sets outside 20 % of even). */
START_TEST(test_gov__affinity_every_key_set_within_bound)
{
    struct gov_source_params p[4] = { src_params("gpt-a"), src_params("gpt-b"),
                                      src_params("claude-a"), src_params("claude-b") };
    char key[32];

    for (int set = 0; set < 40; set++) {
        size_t count[4] = { 0 };
        sim_init(&S, p, 4, 1);
        for (int i = 0; i < 200; i++) {
            affinity_key(key, sizeof(key), 2 + set, i);
            count[affinity_pick(&S.g, key, 0)]++;
        }
        for (int j = 0; j < 4; j++)
            ck_assert_msg(count[j] >= 41 && count[j] <= 53, "set %d: source %d has %zu keys", set,
                          j, count[j]);
        sim_fini(&S);
    }
}
END_TEST

/* Placements are a bounded table: an entry unused for GOV_AFFINITY_IDLE_S
 * is forgotten (its source's count with it), and at GOV_AFFINITY_MAX
 * entries the least recently used makes room. */
START_TEST(test_gov__affinity_table_expires_and_is_capped)
{
    struct gov_source_params p[2] = { src_params("a"), src_params("b") };
    char key[32];

    sim_init(&S, p, 2, 1);
    affinity_pick(&S.g, "old", 0);
    size_t kept = affinity_pick(&S.g, "kept", 0);
    ck_assert_uint_eq(S.g.affinity.n, 2);
    affinity_pick(&S.g, "kept", GOV_AFFINITY_IDLE_S - 1); /* used: stays */
    affinity_pick(&S.g, "new", GOV_AFFINITY_IDLE_S);      /* "old" expires */
    ck_assert_uint_eq(S.g.affinity.n, 2);
    ck_assert_uint_eq(S.g.sources[0].affinity_keys + S.g.sources[1].affinity_keys, 2);
    ck_assert_uint_eq(affinity_pick(&S.g, "kept", GOV_AFFINITY_IDLE_S), kept);
    for (int i = 0; i < GOV_AFFINITY_MAX + 10; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        affinity_pick(&S.g, key, GOV_AFFINITY_IDLE_S + 1);
    }
    ck_assert_uint_eq(S.g.affinity.n, GOV_AFFINITY_MAX);
    ck_assert_uint_eq(S.g.sources[0].affinity_keys + S.g.sources[1].affinity_keys,
                      GOV_AFFINITY_MAX);
    /* Equal sources stay even within the bound. */
    ck_assert_int_le(labs((long)S.g.sources[0].affinity_keys - (long)S.g.sources[1].affinity_keys),
                     (long)(GOV_AFFINITY_MAX * GOV_AFFINITY_SLACK) + 2);
    sim_fini(&S);
}
END_TEST

/* Weights hold across keys: a source of weight 3 gets 3/4 of them, within
 * the bound. */
START_TEST(test_gov__affinity_respects_weights)
{
    struct gov_source_params p[2] = { src_params("heavy"), src_params("light") };
    size_t heavy = 0;
    char key[32];

    p[0].weight = 3;
    sim_init(&S, p, 2, 1);
    for (int i = 0; i < 400; i++) {
        snprintf(key, sizeof(key), "scope-%d", i);
        heavy += affinity_pick(&S.g, key, 0) == 0;
    }
    /* 400 - ceil(1.05 * 400 / 4) .. ceil(1.05 * 400 * 3 / 4) */
    ck_assert_msg(heavy >= 295 && heavy <= 315, "heavy got %zu of 400", heavy);
    sim_fini(&S);
}
END_TEST

/* ===================================================================== */
/* Outcomes, backend, counters                                           */
/* ===================================================================== */

START_TEST(test_gov__fail_fast_rejected_at_once)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    p.breaker_failures = 1;
    sim_init(&S, &p, 1, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    script_push(c, rep_http(1, 401, NULL));
    sim_run_all(&S);
    check_result(c, GOV_UPSTREAM_REJECTED);
    ck_assert_uint_eq(c->seen, 1);
    ck_assert_uint_eq(c->k.fails, 0);
    ck_assert_int_eq(S.g.sources[0].breaker.state, BREAKER_CLOSED);
    ck_assert_uint_eq(S.g.sources[0].in_flight, 0);
    sim_fini(&S);
}
END_TEST

/* An attempt that ended because the call was cancelled reports
 * `cancelled`, not upstream_rejected (outcome.h), is not the source's
 * failure, and frees a half-open probe. */
START_TEST(test_gov__cancelled_outcome_reports_cancelled)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    sim_init(&S, &p, 1, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    script_push(c, rep_reason(3, REASON_CANCELLED));
    sim_run_all(&S);
    check_result(c, GOV_CANCELLED);
    ck_assert_uint_eq(c->seen, 1);
    ck_assert_uint_eq(S.g.sources[0].failures, 0);
    ck_assert_uint_eq(S.g.sources[0].in_flight, 0);
    ck_assert_near(c->stalled_at_done, 0);
    sim_fini(&S);

    /* As the half-open probe. */
    struct gov_policy once = pol;
    once.max_attempts = 1;
    p.breaker_failures = 1;
    p.breaker_cooldown_s = 10;
    sim_init(&S, &p, 1, 1);
    struct sim_call *f = sim_add(&S, 0, &once);
    script_push(f, rep_http(1, 503, NULL));
    c = sim_add(&S, 11, &pol);
    script_push(c, rep_reason(1, REASON_CANCELLED));
    sim_run_all(&S);
    check_result(c, GOV_CANCELLED);
    ck_assert_int_eq(S.g.sources[0].breaker.state, BREAKER_HALF_OPEN);
    ck_assert(!S.g.sources[0].breaker.probe_busy);
    sim_fini(&S);
}
END_TEST

struct fake_backend {
    int age_rc, mark_rc;
    unsigned marks, reads;
};

static int fake_mark(void *ud, const char *scope, double now)
{
    struct fake_backend *b = ud;

    (void)scope;
    (void)now;
    b->marks++;
    return b->mark_rc;
}

static int fake_age(void *ud, const char *scope, double now, double *age_s)
{
    struct fake_backend *b = ud;

    (void)scope;
    (void)now;
    b->reads++;
    *age_s = INFINITY;
    return b->age_rc;
}

/* Progress reads fail closed; progress writes only count their failures. */
START_TEST(test_gov__backend_read_fails_closed_write_counted)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();
    struct fake_backend fb = { .age_rc = -1 };
    struct gov_backend be = { .progress_mark = fake_mark, .progress_age = fake_age, .ud = &fb };
    struct gov g;
    struct gov_call k;
    struct gov_decision d;
    struct outcome ok;

    ck_assert_int_eq(gov_init(&g, &p, 1, 1, &be, NULL, NULL, NULL, 0), 0);
    ck_assert_ptr_null(g.progress);
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 0, 0), 0);
    gov_call_step(&k, 0, &d);
    ck_assert_int_eq(d.action, GOV_DONE);
    ck_assert_int_eq(d.result, GOV_BACKEND_UNAVAILABLE);
    ck_assert_uint_eq(g.sources[0].in_flight, 0);
    ck_assert_uint_eq(g.sources[0].attempts, 0);
    gov_call_fini(&k, 0);

    fb.age_rc = 0;
    fb.mark_rc = -1;
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 0, 0), 0);
    gov_call_step(&k, 0, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    outcome_from_http(&ok, 200, NULL, 0);
    gov_call_on_outcome(&k, 1, &ok, -1, &d);
    ck_assert_int_eq(d.result, GOV_OK);
    ck_assert_uint_eq(fb.marks, 1);
    ck_assert_uint_eq(g.backend_write_errors, 1);
    gov_call_fini(&k, 1);
    gov_fini(&g);
}
END_TEST

/* --- Retry-After against the stall budget ---------------------------- */

/* Unix time 2026-12-01, for HTTP-date hints. */
#define NOW_UNIX 1796083200.0

/* The call ended with `want` after `seen` attempts, at `done_at`, saying
 * to come back in `retry_after_s`. */
static void check_ended(const struct sim_call *c, enum gov_result want, uint32_t seen,
                        double done_at, double retry_after_s)
{
    check_result(c, want);
    ck_assert_uint_eq(c->seen, seen);
    ck_assert_near(c->done_at, done_at);
    ck_assert_near(c->retry_after_s, retry_after_s);
}

/* A long Retry-After (delta seconds, the clamp's worth of delta, an
 * HTTP-date in 2099), on an exempt and on a counted capability, from a
 * 429 and from a 503: with one source and a scope that never made
 * progress, no attempt can happen before the verdict, so the call ends
 * `stalled` as the attempt ends, carrying the hint (clamped to a day). */
START_TEST(test_gov__long_retry_after_stalls_at_once)
{
    static const struct {
        int status;
        const char *hint;
        double want;
    } cases[] = {
        { 429, "3600", 3600 },
        { 429, "31536000", OUTCOME_RETRY_AFTER_MAX_S },
        { 429, "Thu, 01 Jan 2099 00:00:00 GMT", OUTCOME_RETRY_AFTER_MAX_S },
        { 503, "3600", 3600 },
        { 503, "Thu, 01 Jan 2099 00:00:00 GMT", OUTCOME_RETRY_AFTER_MAX_S },
    };
    struct gov_source_params p = src_params("a");

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int exempt = 0; exempt <= 1; exempt++) {
            struct gov_policy pol = pol_chat();
            pol.stall_window_s = 2;
            pol.exempt_429 = exempt;
            sim_init(&S, &p, 1, 1);
            struct sim_call *c = sim_add(&S, 0, &pol);
            struct reply r = { .duration_s = 0.25, .tokens = -1 };
            outcome_from_http(&r.o, cases[i].status, cases[i].hint, NOW_UNIX);
            script_push(c, r);
            script_push(c, rep_http(0.25, 200, NULL));
            sim_run_all(&S);
            check_ended(c, GOV_STALLED, 1, 0.25, cases[i].want);
            sim_fini(&S);
        }
    }
}
END_TEST

/* A counted 429 that also spends the last attempt is retry_exhausted, at
 * once, with the hint. */
START_TEST(test_gov__long_retry_after_last_attempt_exhausted)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    pol.stall_window_s = 2;
    pol.exempt_429 = false;
    pol.max_attempts = 2;
    sim_init(&S, &p, 1, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    script_push(c, rep_http(0.25, 503, NULL)); /* fails 1, backoff 1 s */
    script_push(c, rep_http(0.25, 429, "3600"));
    sim_run_all(&S);
    check_ended(c, GOV_RETRY_EXHAUSTED, 2, 1.5, 3600);
    sim_fini(&S);
}
END_TEST

/* The hint exceeds what is left of the window, but the scope made progress
 * within it: the call waits (the scope is being served), though only until
 * its verdict, re-checked then — never until the hint itself. */
START_TEST(test_gov__long_retry_after_recent_progress_waits_until_verdict)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    pol.stall_window_s = 10;
    sim_init(&S, &p, 1, 1);
    struct sim_call *pc = sim_add(&S, 0, &pol);
    script_push(pc, rep_http(1, 200, NULL)); /* progress at 1 */
    struct sim_call *w = sim_add(&S, 1.5, &pol);
    script_push(w, rep_http(0.5, 429, "3600")); /* at 2: stalled 0.5, age 1 */
    sim_run(&S, 2);
    ck_assert(!w->done);
    ck_assert_int_eq(w->d.action, GOV_WAIT);
    /* Verdict time: 2 + max(10 - 0.5, 10 - 1). */
    ck_assert_just_after(w->d.wake_at, 11.5);
    sim_run_all(&S);
    check_result(w, GOV_STALLED);
    ck_assert_just_after(w->done_at, 11.5);
    ck_assert_uint_eq(w->seen, 1);
    ck_assert(fabs(w->retry_after_s - (3602 - w->done_at)) < 1e-6);
    sim_fini(&S);
}
END_TEST

/* Progress that goes on keeps the call waiting, verdict by verdict, up to
 * the hint: then it attempts again. */
START_TEST(test_gov__retry_after_with_ongoing_progress_waits_for_hint)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    pol.stall_window_s = 10;
    sim_init(&S, &p, 1, 1);
    struct sim_call *p1 = sim_add(&S, 0, &pol);
    script_push(p1, rep_http(1, 200, NULL)); /* progress at 1 */
    struct sim_call *p2 = sim_add(&S, 9, &pol);
    script_push(p2, rep_http(1, 200, NULL)); /* and at 10 */
    struct sim_call *w = sim_add(&S, 1.5, &pol);
    script_push(w, rep_http(0.5, 429, "15")); /* held back until 17 */
    script_push(w, rep_http(0.5, 200, NULL));
    sim_run(&S, 2);
    ck_assert_just_after(w->d.wake_at, 11.5);
    sim_run(&S, 12);
    ck_assert(!w->done);
    ck_assert_int_eq(w->d.action, GOV_WAIT);
    ck_assert_near(w->d.wake_at, 17); /* the hint, before the verdict at 20 */
    sim_run_all(&S);
    check_result(w, GOV_OK);
    ck_assert_uint_eq(w->seen, 2);
    ck_assert_near(w->att_at[1], 17);
    sim_fini(&S);
}
END_TEST

/* A hint shorter than what is left of the window is honoured as before. */
START_TEST(test_gov__retry_after_within_window_is_waited)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    pol.stall_window_s = 10;
    sim_init(&S, &p, 1, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    script_push(c, rep_http(0.5, 429, "8")); /* stalled 0.5 + 8 < 10 */
    script_push(c, rep_http(0.5, 200, NULL));
    sim_run_all(&S);
    check_result(c, GOV_OK);
    ck_assert_near(c->att_at[1], 8.5);
    sim_fini(&S);
}
END_TEST

/* The hint holds back only the source that sent it: the call goes on to
 * another source after its backoff, and does not stall while one serves. */
START_TEST(test_gov__retry_after_holds_back_only_its_source)
{
    struct gov_source_params p[2] = { src_params("a"), src_params("b") };
    struct gov_policy pol = pol_chat();

    pol.stall_window_s = 2;
    sim_init(&S, p, 2, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    script_push(c, rep_http(0.25, 429, "3600"));
    script_push(c, rep_http(0.25, 200, NULL));
    sim_run_all(&S);
    check_result(c, GOV_OK);
    ck_assert_uint_eq(c->seen, 2);
    ck_assert_uint_eq(c->att_source[0], 0);
    ck_assert_uint_eq(c->att_source[1], 1);
    ck_assert_near(c->att_at[1], 1.25); /* the 1 s backoff only */
    sim_fini(&S);

    /* Both answer with a long hint: stalled at the second, with the
     * earliest of the two. */
    sim_init(&S, p, 2, 1);
    c = sim_add(&S, 0, &pol);
    script_push(c, rep_http(0.25, 429, "3600"));
    script_push(c, rep_http(0.25, 429, "600"));
    sim_run_all(&S);
    check_ended(c, GOV_STALLED, 2, 1.5, 600);
    sim_fini(&S);
}
END_TEST

/* An unknown progress age (a shared backend still fetching it) never ends
 * a call: the long hint makes it wait for the age, not stall on a guess. */
START_TEST(test_gov__long_retry_after_unknown_age_waits)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();
    struct fake_backend fb = { .age_rc = 0 };
    struct gov_backend be = { .progress_mark = fake_mark, .progress_age = fake_age, .ud = &fb };
    struct gov g;
    struct gov_call k;
    struct gov_decision d;
    struct outcome o;

    pol.stall_window_s = 2;
    ck_assert_int_eq(gov_init(&g, &p, 1, 1, &be, NULL, NULL, NULL, 0), 0);
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 0, 0), 0);
    gov_call_step(&k, 0, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    fb.age_rc = 1;
    outcome_from_http(&o, 429, "3600", 0);
    gov_call_on_outcome(&k, 0.25, &o, -1, &d);
    ck_assert_int_eq(d.action, GOV_WAIT);
    ck_assert(d.wake_at > 0.25 && d.wake_at <= 2.25 + VERDICT_EPS);
    gov_call_step(&k, d.wake_at, &d);
    ck_assert_int_eq(d.action, GOV_WAIT); /* still not known */
    fb.age_rc = 0;                        /* known: +INF */
    gov_call_step(&k, d.wake_at, &d);
    ck_assert_int_eq(d.action, GOV_DONE);
    ck_assert_int_eq(d.result, GOV_STALLED);
    ck_assert(d.retry_after_s > 3597 && d.retry_after_s < 3600);
    gov_call_fini(&k, 3);
    gov_fini(&g);
}
END_TEST

/* A retry-later answer never says "at once": 429s without Retry-After end
 * `stalled` (or `retry_exhausted`) with the next backoff as the hint, and
 * a backend that cannot answer says the same. */
START_TEST(test_gov__retry_later_hint_never_zero)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    pol.stall_window_s = 5;
    sim_init(&S, &p, 1, 1);
    struct sim_call *c = sim_add(&S, 0, &pol);
    script_push(c, rep_http(0.5, 429, NULL));
    sim_run_all(&S);
    check_result(c, GOV_STALLED);
    ck_assert_near(c->retry_after_s, 1); /* backoff(1) x 0.5 */
    sim_fini(&S);

    pol.exempt_429 = false;
    sim_init(&S, &p, 1, 1);
    c = sim_add(&S, 0, &pol);
    script_push(c, rep_http(0.5, 429, NULL));
    sim_run_all(&S);
    check_result(c, GOV_RETRY_EXHAUSTED);
    ck_assert_near(c->retry_after_s, 4); /* backoff(3) x 0.5 */
    sim_fini(&S);

    struct fake_backend fb = { .age_rc = -1 };
    struct gov_backend be = { .progress_mark = fake_mark, .progress_age = fake_age, .ud = &fb };
    struct gov g;
    struct gov_call k;
    struct gov_decision d;
    ck_assert_int_eq(gov_init(&g, &p, 1, 1, &be, NULL, NULL, NULL, 0), 0);
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 0, 0), 0);
    gov_call_step(&k, 0, &d);
    ck_assert_int_eq(d.result, GOV_BACKEND_UNAVAILABLE);
    ck_assert(d.retry_after_s > 0);
    gov_call_fini(&k, 0);
    gov_fini(&g);
}
END_TEST


/* --- shared admission (propose/confirm) ----------------------------- */

struct shared_fake {
    int age_rc;
    double age;
};

static int shared_fake_age(void *ud, const char *scope, double now, double *age_s)
{
    struct shared_fake *b = ud;

    (void)scope;
    (void)now;
    *age_s = b->age;
    return b->age_rc;
}

static int shared_fake_mark(void *ud, const char *scope, double now)
{
    (void)ud;
    (void)scope;
    (void)now;
    return 0;
}

/* A refusal gives back everything the step reserved, charges the time
 * since the step to the stall budget, and waits until the retry time. */
START_TEST(test_gov__refused_gives_back_and_waits)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();
    struct gov g;
    struct gov_call k;
    struct gov_decision d;

    p.rpm = 10;
    p.pacer_min_interval_s = 10;
    ck_assert_int_eq(gov_init(&g, &p, 1, 1, NULL, NULL, NULL, NULL, 0), 0);
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 100, 0), 0);
    gov_call_step(&k, 0, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    ck_assert_uint_eq(g.sources[0].in_flight, 1);
    ck_assert_near(bucket_level(&g.sources[0].rpm, 0), 9);

    gov_call_refused(&k, 0.5, 3.0, true, &d);
    ck_assert_int_eq(d.action, GOV_WAIT);
    ck_assert_near(d.wake_at,
                   3.0 + 0.5 * 1.0 * 0.5); /* + jitter: poll_interval (1) / 2 x rand (0.5) */
    ck_assert_int_eq(k.state, GOV_CALL_WAITING);
    ck_assert_uint_eq(g.sources[0].in_flight, 0);
    ck_assert_uint_eq(g.sources[0].attempts, 0);
    ck_assert_uint_eq(k.attempts, 0);
    ck_assert(!k.notes[0].tried);
    ck_assert_near(bucket_level(&g.sources[0].rpm, 0.5), 10);
    ck_assert_near(gov_call_stalled_s(&k, 0.5), 0.5); /* the wait for the verdict */
    ck_assert_uint_eq(g.waitq[0].n, 1);

    /* The pacer was given back too: at the retry time it picks at once. */
    double at = d.wake_at;
    gov_call_step(&k, at, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    ck_assert_uint_eq(k.attempts, 1);
    ck_assert_uint_eq(g.waitq[0].n, 0);
    gov_call_fini(&k, at);
    ck_assert_uint_eq(g.sources[0].in_flight, 0);
    gov_fini(&g);
}
END_TEST

/* With no retry time known, the call re-polls after poll_interval_s scaled
 * by the jitter in [0.5, 1.0). */
START_TEST(test_gov__refused_without_time_polls_with_jitter)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();
    struct gov g;
    struct gov_call k;
    struct gov_decision d;

    pol.poll_interval_s = 2;
    ck_assert_int_eq(gov_init(&g, &p, 1, 1, NULL, NULL, NULL, NULL, 0), 0); /* rand: 0.5 */
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 0, 0), 0);
    gov_call_step(&k, 1, &d);
    gov_call_refused(&k, 1, NAN, true, &d);
    ck_assert_int_eq(d.action, GOV_WAIT);
    ck_assert_near(d.wake_at, 1 + 2 * 0.75);
    gov_call_step(&k, d.wake_at, &d);
    gov_call_refused(&k, k.wake_at, 0 /* in the past: unknown */, true, &d);
    ck_assert_near(d.wake_at, 2.5 + 1.5);
    gov_call_fini(&k, 4);
    gov_fini(&g);
}
END_TEST

/* A refusal past the stall window ends the call stalled (the scope never
 * progressed); past the deadline, deadline_exceeded. */
START_TEST(test_gov__refused_reaches_verdicts)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();
    struct gov g;
    struct gov_call k;
    struct gov_decision d;

    pol.stall_window_s = 1;
    ck_assert_int_eq(gov_init(&g, &p, 1, 1, NULL, NULL, NULL, NULL, 0), 0);
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 0, 0), 0);
    gov_call_step(&k, 0, &d);
    gov_call_refused(&k, 1.5, 5, true, &d);
    ck_assert_int_eq(d.action, GOV_DONE);
    ck_assert_int_eq(d.result, GOV_STALLED);
    ck_assert_uint_eq(g.sources[0].in_flight, 0);
    gov_call_fini(&k, 1.5);

    pol.stall_window_s = 300;
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 2, 0, 0), 0);
    gov_call_step(&k, 0, &d);
    gov_call_refused(&k, 1, 5, true, &d);
    ck_assert_int_eq(d.action, GOV_WAIT);
    ck_assert_near(d.wake_at, 2); /* the deadline comes first */
    gov_call_step(&k, 2, &d);
    ck_assert_int_eq(d.result, GOV_DEADLINE_EXCEEDED);
    gov_call_fini(&k, 2);
    gov_fini(&g);
}
END_TEST

/* The backend could not answer: the reservation is given back and the
 * call ends backend_unavailable. */
START_TEST(test_gov__abandon_fails_closed)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();
    struct gov g;
    struct gov_call k;
    struct gov_decision d;

    ck_assert_int_eq(gov_init(&g, &p, 1, 1, NULL, NULL, NULL, NULL, 0), 0);
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 0, 0), 0);
    gov_call_step(&k, 0, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    gov_call_abandon(&k, 0.2, GOV_BACKEND_UNAVAILABLE, &d);
    ck_assert_int_eq(d.action, GOV_DONE);
    ck_assert_int_eq(d.result, GOV_BACKEND_UNAVAILABLE);
    ck_assert_uint_eq(g.sources[0].in_flight, 0);
    ck_assert_uint_eq(k.attempts, 0);
    gov_call_fini(&k, 0.2);
    ck_assert_uint_eq(g.sources[0].in_flight, 0);
    gov_fini(&g);
}
END_TEST

/* An age not known yet (a shared backend fetching it) never stalls a call:
 * it proceeds while no verdict depends on it, and waits a recheck when one
 * does; once known, the verdict is the usual one. */
START_TEST(test_gov__pending_age_never_stalls)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();
    struct shared_fake fb = { .age_rc = 1 };
    struct gov_backend be = { .progress_mark = shared_fake_mark,
                              .progress_age = shared_fake_age,
                              .ud = &fb };
    struct gov g;
    struct gov_call k;
    struct gov_decision d;

    pol.stall_window_s = 1;
    ck_assert_int_eq(gov_init(&g, &p, 1, 1, &be, NULL, NULL, NULL, 0), 0);
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 0, 0), 0);
    gov_call_step(&k, 0, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT); /* not due: the age does not matter */
    gov_call_refused(&k, 0.5, 10, true, &d);
    ck_assert_int_eq(d.action, GOV_WAIT);
    ck_assert_just_after(d.wake_at, 1.0); /* the earliest possible verdict */
    double due = d.wake_at;
    gov_call_step(&k, due, &d);
    ck_assert_int_eq(d.action, GOV_WAIT); /* due, age unknown: recheck, never spin */
    ck_assert_near(d.wake_at, due + GOV_PENDING_RECHECK_S);
    ck_assert(k.waits_age);
    gov_progress_known(&g, "other"); /* another scope: not woken */
    ck_assert(k.waits_age);
    gov_call_step(&k, d.wake_at, &d); /* the safety net: still unknown, waits again */
    ck_assert_near(d.wake_at, due + 2 * GOV_PENDING_RECHECK_S);
    gov_progress_known(&g, "chat"); /* the backend has it: the call looks again */
    ck_assert(!k.waits_age);
    fb.age_rc = 0;
    fb.age = 0.2; /* fresh progress elsewhere: not stalled, waits for the retry time */
    double t = d.wake_at;
    gov_call_step(&k, t, &d);
    ck_assert_int_eq(d.action, GOV_WAIT);
    ck_assert_just_after(d.wake_at, t + 0.8); /* when that progress is a window old */
    fb.age = INFINITY;
    gov_call_step(&k, d.wake_at, &d);
    ck_assert_int_eq(d.action, GOV_DONE);
    ck_assert_int_eq(d.result, GOV_STALLED);
    gov_call_fini(&k, d.wake_at);
    gov_fini(&g);
}
END_TEST


struct wake_log {
    struct gov_call *woken[8];
    size_t n;
};

static void log_wake(struct gov_call *k, void *ud)
{
    struct wake_log *w = ud;
    if (w->n < 8)
        w->woken[w->n++] = k;
}

/* The permit a refused call gives back wakes a call waiting for a permit,
 * not one waiting after a refusal; the pacer is given back only when no
 * other call started since. */
START_TEST(test_gov__refusal_wakes_permit_waiters_only)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();
    struct wake_log wl = { 0 };
    struct gov_hooks hooks = { .on_wake = log_wake, .ud = &wl };
    struct gov g;
    struct gov_call a, b, c;
    struct gov_decision d;

    p.max_concurrency = 1;
    p.aimd_initial = 1;
    ck_assert_int_eq(gov_init(&g, &p, 1, 1, NULL, NULL, NULL, &hooks, 0), 0);
    ck_assert_int_eq(gov_call_init(&a, &g, 0, "chat", &pol, 0, 0, 0), 0);
    ck_assert_int_eq(gov_call_init(&b, &g, 0, "chat", &pol, 0, 0, 0), 0);
    ck_assert_int_eq(gov_call_init(&c, &g, 0, "chat", &pol, 0, 0, 0), 0);
    gov_call_step(&a, 0, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    gov_call_step(&b, 0, &d); /* no permit: waits for one */
    ck_assert_int_eq(d.action, GOV_WAIT);
    ck_assert(b.waits_permit);
    gov_call_refused(&a, 0.1, 5, true, &d); /* a waits for the backend now */
    ck_assert(!a.waits_permit);
    ck_assert_uint_eq(wl.n, 1);
    ck_assert_ptr_eq(wl.woken[0], &b);
    gov_call_step(&b, 0.1, &d); /* woken: it now waits for the gate, on a timer */
    ck_assert_int_eq(d.action, GOV_WAIT);
    ck_assert_near(d.wake_at, 5.25);
    ck_assert(!b.waits_permit);
    gov_call_step(&b, 5.25, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    gov_call_step(&c, 5.25, &d); /* b asks alone: c waits, without a timer */
    ck_assert(c.waits_permit);
    gov_call_refused(&b, 5.3, 9, true, &d); /* wakes c, never a */
    ck_assert_uint_eq(wl.n, 2);
    ck_assert_ptr_eq(wl.woken[1], &c);
    gov_call_step(&c, 9.25, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    gov_call_refused(&c, 9.3, 12, true, &d); /* nobody waits for a permit */
    ck_assert_uint_eq(wl.n, 2);
    gov_call_fini(&a, 1);
    gov_call_fini(&b, 1);
    gov_call_fini(&c, 1);
    gov_fini(&g);

    /* The pacer: a refused pick gives its start back only if it is still
     * the last one. */
    p = src_params("a");
    p.pacer_min_interval_s = 10;
    ck_assert_int_eq(gov_init(&g, &p, 1, 1, NULL, NULL, NULL, NULL, 0), 0);
    ck_assert_int_eq(gov_call_init(&a, &g, 0, "chat", &pol, 0, 0, 0), 0);
    ck_assert_int_eq(gov_call_init(&b, &g, 0, "chat", &pol, 0, 0, 0), 0);
    gov_call_step(&a, 20, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    gov_call_refused(&a, 20.1, 25, true, &d); /* gated until 25.25 */
    gov_call_step(&b, 25.25, &d);             /* the pacer was given back (else: until 30) */
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    gov_call_confirmed(&b);
    ck_assert_near(g.sources[0].last_start, 25.25);
    gov_call_step(&a, 36, &d); /* a picks while b's attempt runs */
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    gov_call_fini(&b, 46.5);
    ck_assert_int_eq(gov_call_init(&b, &g, 0, "chat", &pol, 0, 0, 46.5), 0);
    gov_call_step(&b, 46.5, &d); /* another start during a's admission */
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    gov_call_refused(&a, 47, 60, true, &d);
    ck_assert_near(g.sources[0].last_start, 46.5); /* b's start stands */
    gov_call_fini(&b, 47);
    gov_call_fini(&a, 32);
    gov_fini(&g);
}
END_TEST


/* After a refusal the source is gated: until the retry time nobody picks
 * it; then one call asks alone; its confirmation opens the gate and wakes
 * the next waiter. */
START_TEST(test_gov__refusal_gates_the_source_one_asks_at_a_time)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();
    struct wake_log wl = { 0 };
    struct gov_hooks hooks = { .on_wake = log_wake, .ud = &wl };
    struct gov g;
    struct gov_call a, b;
    struct gov_decision d;

    pol.poll_interval_s = 0.2;
    ck_assert_int_eq(gov_init(&g, &p, 1, 1, NULL, NULL, NULL, &hooks, 0), 0); /* rand 0.5 */
    ck_assert_int_eq(gov_call_init(&a, &g, 0, "chat", &pol, 0, 0, 0), 0);
    ck_assert_int_eq(gov_call_init(&b, &g, 0, "chat", &pol, 0, 0, 0), 0);
    gov_call_step(&a, 0, &d);
    gov_call_refused(&a, 0.1, 2.0, true, &d);
    double gate = 2.0 + 0.5 * 0.2 * 0.5;
    ck_assert_near(d.wake_at, gate);
    gov_call_step(&b, 0.5, &d); /* gated: waits for the same time */
    ck_assert_int_eq(d.action, GOV_WAIT);
    ck_assert_near(d.wake_at, gate);
    gov_call_step(&b, gate, &d); /* b is first at the gate: it asks alone */
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    ck_assert(isinf(g.sources[0].gate_until));
    gov_call_step(&a, gate, &d); /* a waits for b's answer, no timer */
    ck_assert_int_eq(d.action, GOV_WAIT);
    ck_assert(isinf(d.wake_at) || d.wake_at > 100);
    size_t n = wl.n;
    gov_call_confirmed(&b); /* admitted: the gate opens, a is woken */
    ck_assert_near(g.sources[0].gate_until, 0);
    ck_assert_uint_eq(wl.n, n + 1);
    ck_assert_ptr_eq(wl.woken[n], &a);
    gov_call_step(&a, gate, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    gov_call_fini(&a, 3);
    gov_call_fini(&b, 3);
    gov_fini(&g);
}
END_TEST


/* Each admission lets the next waiter ask (a chain, not one wake-up per
 * gate); a refusal that depends on the call's size gates nothing. */
START_TEST(test_gov__gate_chain_and_size_refusals)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();
    struct wake_log wl = { 0 };
    struct gov_hooks hooks = { .on_wake = log_wake, .ud = &wl };
    struct gov g;
    struct gov_call k[4];
    struct gov_decision d;

    p.max_concurrency = 16;
    p.aimd_initial = 16;
    ck_assert_int_eq(gov_init(&g, &p, 1, 1, NULL, NULL, NULL, &hooks, 0), 0);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(gov_call_init(&k[i], &g, 0, "chat", &pol, 0, 0, 0), 0);
    gov_call_step(&k[0], 0, &d);
    gov_call_refused(&k[0], 0, 1, true, &d); /* gate at 1.25 */
    gov_call_step(&k[0], 1.25, &d);          /* k0 holds the gate */
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    for (int i = 1; i < 4; i++) {
        gov_call_step(&k[i], 1.25, &d); /* parked behind it, no timer */
        ck_assert_int_eq(d.action, GOV_WAIT);
    }
    wl.n = 0;
    size_t n;
    gov_call_confirmed(&k[0]); /* wakes k1 */
    ck_assert_uint_eq(wl.n, 1);
    ck_assert_ptr_eq(wl.woken[0], &k[1]);
    gov_call_step(&k[1], 1.3, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    gov_call_confirmed(&k[1]); /* not the holder: still wakes k2 */
    ck_assert_uint_eq(wl.n, 2);
    ck_assert_ptr_eq(wl.woken[1], &k[2]);
    gov_call_step(&k[2], 1.3, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    /* A token-bucket refusal of k2 (its size) does not gate: k3 asks. */
    gov_call_refused(&k[2], 1.4, 30, false, &d);
    ck_assert_near(g.sources[0].gate_until, 0);
    gov_call_step(&k[3], 1.4, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    /* k3's admission does not wake k2, which waits for its own retry time
     * (it would only be refused again). */
    n = wl.n;
    gov_call_confirmed(&k[3]);
    ck_assert_uint_eq(wl.n, n);
    for (int i = 0; i < 4; i++)
        gov_call_fini(&k[i], 2);
    gov_fini(&g);
}
END_TEST

START_TEST(test_gov__stats_counters)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();

    p.max_concurrency = 1;
    sim_init(&S, &p, 1, 1);
    struct sim_call *a = sim_add(&S, 0, &pol);
    script_push(a, rep_http(1, 429, NULL));
    script_push(a, rep_http(1, 503, NULL));
    script_push(a, rep_http(1, 200, NULL));
    struct sim_call *b = sim_add(&S, 0.5, &pol);
    script_push(b, rep_http(1, 401, NULL));
    sim_run(&S, 0.5);
    ck_assert_uint_eq(S.g.waitq[0].n, 1); /* calls waiting */
    sim_run_all(&S);
    check_result(a, GOV_OK);
    check_result(b, GOV_UPSTREAM_REJECTED);
    ck_assert_near(b->att_at[0], 1); /* woken by the release of A's 429 */
    const struct gov_source *s = &S.g.sources[0];
    ck_assert_uint_eq(s->attempts, 4);
    ck_assert_uint_eq(s->successes, 1);
    ck_assert_uint_eq(s->failures, 2); /* the 503 and the 401 */
    ck_assert_uint_eq(s->rate_limited, 1);
    ck_assert_uint_eq(s->in_flight, 0);
    ck_assert_uint_eq(S.g.decisions, S.steps);
    ck_assert_uint_eq(S.g.waits, S.step_waits);
    ck_assert_uint_ge(S.g.waits, 1);
    ck_assert_uint_eq(S.g.wakes, S.n_wakes);
    ck_assert_uint_ge(S.g.wakes, 1);
    ck_assert_uint_eq(S.g.backend_write_errors, 0);
    ck_assert_uint_eq(S.g.waitq[0].n, 0);
    ck_assert_uint_eq(progress_count(S.g.progress), 1);
    sim_fini(&S);
}
END_TEST

START_TEST(test_gov__call_init_rejects_unknown_capability)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();
    struct gov g;
    struct gov_call k;

    ck_assert_int_eq(gov_init(&g, &p, 1, 2, NULL, NULL, NULL, NULL, 0), 0);
    ck_assert_int_eq(gov_call_init(&k, &g, 2, "x", &pol, 0, 0, 0), -1);
    gov_call_fini(&k, 0); /* safe on a call whose init failed */
    ck_assert_int_eq(gov_call_init(&k, &g, 1, "x", &pol, 0, 0, 0), 0);
    gov_call_fini(&k, 0);
    gov_fini(&g);
}
END_TEST

START_TEST(test_gov__names_stable)
{
    ck_assert_str_eq(gov_result_name(GOV_OK), "ok");
    ck_assert_str_eq(gov_result_name(GOV_STALLED), "stalled");
    ck_assert_str_eq(gov_result_name(GOV_RETRY_EXHAUSTED), "retry_exhausted");
    ck_assert_str_eq(gov_result_name(GOV_UPSTREAM_REJECTED), "upstream_rejected");
    ck_assert_str_eq(gov_result_name(GOV_DEADLINE_EXCEEDED), "deadline_exceeded");
    ck_assert_str_eq(gov_result_name(GOV_BACKEND_UNAVAILABLE), "backend_unavailable");
    ck_assert_str_eq(gov_result_name(GOV_CANCELLED), "cancelled");
    ck_assert_str_eq(gov_call_state_name(GOV_CALL_IDLE), "idle");
    ck_assert_str_eq(gov_call_state_name(GOV_CALL_WAITING), "waiting");
    ck_assert_str_eq(gov_call_state_name(GOV_CALL_ATTEMPTING), "attempting");
    ck_assert_str_eq(gov_call_state_name(GOV_CALL_BACKOFF), "backoff");
    ck_assert_str_eq(gov_call_state_name(GOV_CALL_DONE), "done");
}
END_TEST

/* --- fair queueing across apps --------------------------------------- */

/* A driver of its own for hundreds of calls on one source with 2 permits:
 * every service time the oldest attempt succeeds, its permit wakes the next
 * waiter, and the woken calls step "now" (as the sidecar's zero-delay timer
 * would). Admissions are logged by app. */
#define FQ_MAX 640

struct fq {
    struct gov g;
    struct gov_call k[FQ_MAX];
    uint32_t app[FQ_MAX];
    size_t n;
    struct gov_call *woken[FQ_MAX];
    size_t n_woken;
    struct gov_call *running[4]; /* oldest first */
    size_t n_running;
    uint32_t admitted_app[FQ_MAX];
    size_t admitted_idx[FQ_MAX];
    size_t n_admitted;
    double now;
};

static void fq_on_wake(struct gov_call *k, void *ud)
{
    struct fq *f = ud;
    ck_assert_uint_lt(f->n_woken, FQ_MAX);
    f->woken[f->n_woken++] = k;
}

/* One source of 2 permits per capability (source c serves capability c). */
static void fq_init_caps(struct fq *f, const struct gov_app_params *apps, size_t n_apps,
                         size_t n_caps)
{
    static const char *const names[2] = { "a", "b" };
    struct gov_source_params p[2];
    struct gov_hooks h = { .on_wake = fq_on_wake, .ud = f };

    memset(f, 0, sizeof(*f));
    ck_assert_uint_le(n_caps, 2);
    for (size_t c = 0; c < n_caps; c++) {
        p[c] = src_params(names[c]);
        p[c].capability = (uint32_t)c;
        p[c].max_concurrency = 2;
        p[c].aimd_initial = p[c].aimd_min = 2;
    }
    ck_assert_int_eq(gov_init(&f->g, p, n_caps, n_caps, NULL, NULL, NULL, &h, 0), 0);
    ck_assert_int_eq(gov_set_apps(&f->g, apps, n_apps, 0), 0);
}

static void fq_init_apps(struct fq *f, const struct gov_app_params *apps, size_t n_apps)
{
    fq_init_caps(f, apps, n_apps, 1);
}

static void fq_init(struct fq *f, const double *weights, size_t n_apps)
{
    struct gov_app_params a[4] = { { 0 } };

    for (size_t i = 0; i < n_apps; i++)
        a[i].weight = weights[i];
    fq_init_apps(f, a, n_apps);
}

static void fq_admit(struct fq *f, struct gov_call *k)
{
    ck_assert_uint_lt(f->n_running, 4);
    f->running[f->n_running++] = k;
    size_t i = (size_t)(k - f->k);
    f->admitted_app[f->n_admitted] = f->app[i];
    f->admitted_idx[f->n_admitted++] = i;
}

/* A new call of `app` on capability `cap` steps: admitted or parked. */
static void fq_arrive_cap(struct fq *f, uint32_t app, uint32_t cap)
{
    struct gov_policy pol = pol_chat();
    struct gov_decision d;
    struct gov_call *k = &f->k[f->n];

    ck_assert_uint_lt(f->n, FQ_MAX);
    pol.stall_window_s = 1e9; /* waiting never ends these calls */
    f->app[f->n++] = app;
    ck_assert_int_eq(gov_call_init(k, &f->g, cap, "s", &pol, 0, 0, f->now), 0);
    gov_call_set_app(k, app);
    gov_call_step(k, f->now, &d);
    if (d.action == GOV_ATTEMPT)
        fq_admit(f, k);
    else
        ck_assert_int_eq(d.action, GOV_WAIT);
}

static void fq_arrive(struct fq *f, uint32_t app)
{
    fq_arrive_cap(f, app, 0);
}

/* One service time passes: the oldest attempt succeeds and the woken
 * waiters step. */
static void fq_serve_one(struct fq *f)
{
    struct outcome o;
    struct gov_decision d;

    ck_assert_uint_gt(f->n_running, 0);
    f->now += 1;
    struct gov_call *done = f->running[0];
    memmove(&f->running[0], &f->running[1], (f->n_running - 1) * sizeof(f->running[0]));
    f->n_running--;
    outcome_from_http(&o, 200, NULL, 0);
    gov_call_on_outcome(done, f->now, &o, -1, &d);
    ck_assert_int_eq(d.action, GOV_DONE);
    gov_call_fini(done, f->now);
    for (size_t i = 0; i < f->n_woken; i++) {
        gov_call_step(f->woken[i], f->now, &d);
        if (d.action == GOV_ATTEMPT)
            fq_admit(f, f->woken[i]);
    }
    f->n_woken = 0;
}

static void fq_fini(struct fq *f)
{
    for (size_t i = 0; i < f->n; i++)
        gov_call_fini(&f->k[i], f->now);
    gov_fini(&f->g);
}

START_TEST(test_gov__fair_queue_weights_3_to_1)
{
    static struct fq f;
    const double w[2] = { 3, 1 };

    fq_init(&f, w, 2);
    /* The worst order for a FIFO: every call of app 0 ahead of app 1's. */
    for (int i = 0; i < 320; i++)
        fq_arrive(&f, 0);
    for (int i = 0; i < 320; i++)
        fq_arrive(&f, 1);
    while (f.n_admitted < 402)
        fq_serve_one(&f);
    size_t per_app[2] = { 0, 0 };
    for (size_t i = 2; i < 402; i++) /* the 400 admitted from the queue */
        per_app[f.admitted_app[i]]++;
    double ratio = (double)per_app[0] / (double)per_app[1];
    ck_assert_msg(fabs(ratio - 3.0) <= 0.3, "admitted %zu:%zu (ratio %.3f)", per_app[0], per_app[1],
                  ratio);
    /* FIFO within each app. */
    size_t last[2] = { 0, 0 };
    bool seen[2] = { false, false };
    for (size_t i = 0; i < f.n_admitted; i++) {
        uint32_t a = f.admitted_app[i];
        ck_assert_msg(!seen[a] || f.admitted_idx[i] > last[a], "app %u out of order", a);
        seen[a] = true;
        last[a] = f.admitted_idx[i];
    }
    fq_fini(&f);
}
END_TEST

START_TEST(test_gov__fair_queue_single_call_not_behind_backlog)
{
    static struct fq f;
    const double w[2] = { 1, 1 };

    fq_init(&f, w, 2);
    for (int i = 0; i < 202; i++) /* 2 running, 200 waiting */
        fq_arrive(&f, 0);
    for (int i = 0; i < 10; i++)
        fq_serve_one(&f);
    for (int i = 0; i < 10; i++) /* app 0 keeps its 200 waiting */
        fq_arrive(&f, 0);
    size_t before = f.n_admitted;
    double arrived = f.now;
    fq_arrive(&f, 1);
    ck_assert_uint_eq(f.n_admitted, before); /* no permit free: it waits */
    while (f.n_admitted == before || f.admitted_app[f.n_admitted - 1] != 1) {
        ck_assert_uint_lt(f.n_admitted, before + 3);
        fq_serve_one(&f);
    }
    /* Admitted at the very next release: within one service time. */
    ck_assert_uint_eq(f.n_admitted, before + 1);
    ck_assert_double_le(f.now - arrived, 1.0);
    fq_fini(&f);
}
END_TEST

START_TEST(test_gov__fair_queue_without_apps_is_fifo)
{
    static struct fq f;
    struct gov_source_params p = src_params("a");
    struct gov_hooks h = { .on_wake = fq_on_wake, .ud = &f };

    memset(&f, 0, sizeof(f));
    p.max_concurrency = 2;
    p.aimd_initial = p.aimd_min = 2;
    ck_assert_int_eq(gov_init(&f.g, &p, 1, 1, NULL, NULL, NULL, &h, 0), 0);
    for (int i = 0; i < 40; i++)
        fq_arrive(&f, (uint32_t)(i % 3)); /* apps are ignored without gov_set_apps */
    while (f.n_admitted < 40)
        fq_serve_one(&f);
    for (size_t i = 0; i < 40; i++)
        ck_assert_uint_eq(f.admitted_idx[i], i);
    fq_fini(&f);
}
END_TEST

/* An app at its max_concurrency waits while another app's calls use the
 * source's free permit; its own calls resume as its attempts end. */
START_TEST(test_gov__app_max_concurrency_holds)
{
    static struct fq f;
    const struct gov_app_params apps[2] = { { .weight = 1, .max_concurrency = 1 },
                                            { .weight = 1 } };

    fq_init_apps(&f, apps, 2);
    for (int i = 0; i < 20; i++)
        fq_arrive(&f, 0);
    ck_assert_uint_eq(f.n_admitted, 1); /* the source has 2 permits: the app allows 1 */
    ck_assert_uint_eq(f.g.apps[0].in_flight, 1);
    fq_arrive(&f, 1); /* the free permit goes to app 1 at once */
    ck_assert_uint_eq(f.n_admitted, 2);
    ck_assert_uint_eq(f.admitted_app[1], 1);
    while (f.n_admitted < 21) {
        ck_assert_uint_le(f.g.apps[0].in_flight, 1);
        fq_serve_one(&f);
    }
    ck_assert_uint_le(f.g.apps[0].in_flight, 1);
    fq_fini(&f);
}
END_TEST

/* An app's rpm: its 4th call within the window waits for the refill (on
 * the fake clock), while another app is not held back. */
START_TEST(test_gov__app_rpm_holds)
{
    static struct fq f;
    const struct gov_app_params apps[2] = { { .weight = 1, .rpm = 3, .window_s = 60 },
                                            { .weight = 1 } };
    struct gov_decision d;

    fq_init_apps(&f, apps, 2);
    for (int i = 0; i < 3; i++) {
        fq_arrive(&f, 0);
        while (f.n_running)
            fq_serve_one(&f);
    }
    ck_assert_uint_eq(f.n_admitted, 3);
    fq_arrive(&f, 0);
    struct gov_call *held = &f.k[f.n - 1];
    ck_assert_uint_eq(f.n_admitted, 3); /* over its rpm: waits */
    ck_assert(held->waits_app);
    double wake = held->wake_at;
    ck_assert_double_gt(wake, f.now);
    ck_assert_double_le(wake, f.now + 60.0 / 3 + 1e-9);
    fq_arrive(&f, 1); /* another app is not limited */
    ck_assert_uint_eq(f.n_admitted, 4);
    while (f.n_running)
        fq_serve_one(&f); /* the release does not wake the held call */
    ck_assert(!held->woken);
    f.now = wake;
    gov_call_step(held, f.now, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    fq_fini(&f);
}
END_TEST

/* An app's max_concurrency on one capability holds its calls of that
 * capability only: its calls of another capability run meanwhile, and the
 * end of one of its attempts there wakes its next waiter there. */
START_TEST(test_gov__app_per_capability_max_concurrency)
{
    static struct fq f;
    const struct gov_app_cap_params caps[2] = { { .max_concurrency = 1 }, { 0 } };
    const struct gov_app_params apps[2] = { { .weight = 1, .per_cap = caps }, { .weight = 1 } };

    fq_init_caps(&f, apps, 2, 2);
    fq_arrive_cap(&f, 0, 0);
    fq_arrive_cap(&f, 0, 0);
    ck_assert_uint_eq(f.n_admitted, 1); /* the source has 2 permits: the app allows 1 here */
    ck_assert_uint_eq(f.g.apps[0].caps[0].in_flight, 1);
    ck_assert(f.g.apps[0].caps[0].limited > 0);
    struct gov_call *held = &f.k[1];
    ck_assert_int_eq(held->state, GOV_CALL_WAITING);
    fq_arrive_cap(&f, 0, 1); /* the other capability: not limited */
    fq_arrive_cap(&f, 0, 1);
    ck_assert_uint_eq(f.n_admitted, 3);
    fq_arrive_cap(&f, 1, 0); /* another app takes the free permit of capability 0 */
    ck_assert_uint_eq(f.n_admitted, 4);
    ck_assert_uint_eq(f.admitted_app[3], 1);
    fq_serve_one(&f); /* app 0's capability-0 attempt ends: its waiter runs */
    ck_assert_uint_eq(f.n_admitted, 5);
    ck_assert_ptr_eq(f.running[f.n_running - 1], held);
    ck_assert_uint_eq(f.g.apps[0].caps[0].in_flight, 1);
    ck_assert_uint_eq(f.g.apps[0].in_flight, 3);
    fq_fini(&f);
}
END_TEST

/* An app's rpm on one capability, on the fake clock: its 3rd call of that
 * capability in the window waits for the refill; its calls of the other
 * capability, and the app's own rpm on top, still count. */
START_TEST(test_gov__app_per_capability_rpm)
{
    static struct fq f;
    const struct gov_app_cap_params caps[2] = { { .rpm = 2, .window_s = 60 }, { 0 } };
    const struct gov_app_params apps[1] = { { .weight = 1, .rpm = 4, .per_cap = caps } };
    struct gov_decision d;

    fq_init_caps(&f, apps, 1, 2);
    for (int i = 0; i < 2; i++) {
        fq_arrive_cap(&f, 0, 0);
        while (f.n_running)
            fq_serve_one(&f);
    }
    ck_assert_uint_eq(f.n_admitted, 2);
    fq_arrive_cap(&f, 0, 0);
    struct gov_call *held = &f.k[f.n - 1];
    ck_assert_uint_eq(f.n_admitted, 2);
    ck_assert(held->waits_app);
    double wake = held->wake_at; /* one request back: 60 / 2 s after the first */
    ck_assert_double_gt(wake, f.now);
    ck_assert_double_le(wake, 30.0 + 1e-6);
    fq_arrive_cap(&f, 0, 1); /* capability 1: only the app's rpm (4) counts */
    fq_arrive_cap(&f, 0, 1);
    ck_assert_uint_eq(f.n_admitted, 4);
    while (f.n_running)
        fq_serve_one(&f);
    fq_arrive_cap(&f, 0, 1); /* the app's 5th request in the window: held */
    ck_assert_uint_eq(f.n_admitted, 4);
    ck_assert(f.k[f.n - 1].waits_app);
    ck_assert(!held->woken); /* releases do not wake a call waiting for a refill */
    f.now = wake;
    gov_call_step(held, f.now, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    fq_admit(&f, held);
    ck_assert_uint_eq(f.g.apps[0].admitted, 5);
    fq_fini(&f);
}
END_TEST

/* A refused shared admission gives back what the capability's limits took. */
START_TEST(test_gov__app_per_capability_refusal_gives_back)
{
    static struct fq f;
    const struct gov_app_cap_params caps[1] = {
        { .max_concurrency = 1, .rpm = 1, .window_s = 60 }
    };
    const struct gov_app_params apps[1] = { { .weight = 1, .per_cap = caps } };
    struct gov_decision d;

    fq_init_caps(&f, apps, 1, 1);
    fq_arrive_cap(&f, 0, 0);
    ck_assert_uint_eq(f.n_admitted, 1);
    struct gov_call *k = f.running[0];
    ck_assert_uint_eq(f.g.apps[0].caps[0].in_flight, 1);
    ck_assert_double_lt(bucket_level(&f.g.apps[0].caps[0].rpm, f.now), 0.5);
    f.n_running = 0;
    gov_call_refused(k, f.now, f.now + 5, false, &d);
    ck_assert_int_eq(d.action, GOV_WAIT);
    ck_assert_uint_eq(f.g.apps[0].caps[0].in_flight, 0);
    ck_assert_double_eq_tol(bucket_level(&f.g.apps[0].caps[0].rpm, f.now), 1.0, 1e-9);
    fq_fini(&f);
}
END_TEST

/* A reload of the apps' figures keeps their runtime state: an attempt in
 * flight before per_capability limits existed counts toward them, and a
 * bucket keeps its level (clamped) under its new capacity. */
START_TEST(test_gov__apps_reconf_keeps_counts_and_levels)
{
    static struct fq f;
    struct gov_app_params apps[1] = { { .weight = 1, .rpm = 3, .window_s = 60 } };
    struct gov_apps_reconf r;

    fq_init_caps(&f, apps, 1, 2);
    fq_arrive_cap(&f, 0, 0); /* runs: counted on capability 0 without a limit there */
    fq_arrive_cap(&f, 0, 1);
    fq_arrive_cap(&f, 0, 1);
    ck_assert_uint_eq(f.n_admitted, 3);
    ck_assert_uint_eq(f.g.apps[0].caps[0].in_flight, 1);
    /* rpm 3 -> 6, and at most 1 at once on capability 0 */
    const struct gov_app_cap_params caps[2] = { { .max_concurrency = 1 }, { 0 } };
    apps[0] = (struct gov_app_params){ .weight = 2, .rpm = 6, .window_s = 60, .per_cap = caps };
    ck_assert_int_eq(gov_apps_reconf_prepare(&r, &f.g, apps, 2, 2), -2); /* one app, not 2 */
    ck_assert_int_eq(gov_apps_reconf_prepare(&r, &f.g, apps, 1, 2), 0);
    gov_apps_reconf_commit(&f.g, &r, f.now);
    ck_assert_double_eq(f.g.apps[0].p.weight, 2);
    ck_assert_uint_eq(f.g.apps[0].caps[0].in_flight, 1);
    ck_assert_uint_eq(f.g.apps[0].in_flight, 3);
    /* the level (0 of 3) is kept, not refilled to the new capacity */
    ck_assert_double_eq_tol(bucket_level(&f.g.apps[0].rpm, f.now), 0, 1e-9);
    ck_assert_double_eq(f.g.apps[0].rpm.capacity, 6);
    f.now += 10; /* 1 request back at 6 per 60 s */
    fq_arrive_cap(&f, 0, 0);
    struct gov_call *held = &f.k[f.n - 1];
    ck_assert_uint_eq(f.n_admitted, 3); /* the capability-0 attempt from before holds the 1 */
    ck_assert_int_eq(held->state, GOV_CALL_WAITING);
    fq_serve_one(&f); /* the oldest (capability 0) ends: the held call runs */
    ck_assert_uint_eq(f.n_admitted, 4);
    ck_assert_ptr_eq(f.running[f.n_running - 1], held);
    ck_assert_uint_eq(f.g.apps[0].caps[0].in_flight, 1);
    /* back to no per_capability limits: nothing waits on capability 0 */
    apps[0].per_cap = NULL;
    apps[0].rpm = 0;
    ck_assert_int_eq(gov_apps_reconf_prepare(&r, &f.g, apps, 1, 2), 0);
    gov_apps_reconf_commit(&f.g, &r, f.now);
    fq_arrive_cap(&f, 0, 0);
    ck_assert_uint_eq(f.n_admitted, 5);
    ck_assert_uint_eq(f.g.apps[0].caps[0].in_flight, 2);
    fq_fini(&f);
}
END_TEST

/* --- reconfiguration (a reload) ---------------------------------------- */

/* Applies srcs/from to g and to the live calls ks[0..nk). */
static int reconf(struct gov *g, const struct gov_source_params *srcs, const long *from, size_t n,
                  size_t n_caps, struct gov_call **ks, size_t nk, double now)
{
    struct gov_reconf r;
    struct gov_source_note *notes[8];
    int rc = gov_reconf_prepare(&r, g, srcs, from, n, n_caps, now);

    if (rc < 0)
        return rc;
    for (size_t i = 0; i < nk; i++)
        ck_assert_int_eq(gov_call_reconf_prepare(ks[i], &r, &notes[i]), 0);
    gov_reconf_commit(g, &r);
    for (size_t i = 0; i < nk; i++)
        gov_call_reconf_commit(ks[i], &r, notes[i]);
    gov_reconf_finish(&r);
    return 0;
}

/* A reload keeps the affinity placements of the sources it keeps (under
 * their new indices) and forgets those of a removed source, whose keys are
 * placed again. */
START_TEST(test_gov__reconf_keeps_affinity_placements)
{
    struct gov_source_params p[3] = { src_params("a"), src_params("b"), src_params("c") };
    struct gov_source_params np[2] = { src_params("c"), src_params("a") };
    const long from[2] = { 2, 0 };
    const size_t to[3] = { 1, SIZE_MAX, 0 };
    size_t first[30], before[3] = { 0 };
    char key[32];

    sim_init(&S, p, 3, 1);
    for (int i = 0; i < 30; i++) {
        snprintf(key, sizeof(key), "conv-%d", i);
        first[i] = affinity_pick(&S.g, key, 0);
        before[first[i]]++;
    }
    ck_assert_int_eq(reconf(&S.g, np, from, 2, 1, NULL, 0, 1), 0);
    ck_assert_uint_eq(S.g.sources[0].affinity_keys, before[2]);
    ck_assert_uint_eq(S.g.sources[1].affinity_keys, before[0]);
    ck_assert_uint_eq(S.g.affinity.n, before[0] + before[2]);
    for (int i = 0; i < 30; i++) {
        snprintf(key, sizeof(key), "conv-%d", i);
        size_t now_at = affinity_pick(&S.g, key, 2);
        if (to[first[i]] != SIZE_MAX)
            ck_assert_uint_eq(now_at, to[first[i]]);
    }
    ck_assert_uint_eq(S.g.affinity.n, 30);
    ck_assert_uint_eq(S.g.sources[0].affinity_keys + S.g.sources[1].affinity_keys, 30);
    sim_fini(&S);
}
END_TEST

START_TEST(test_gov__reconf_bucket_keeps_level_clamped_to_new_capacity)
{
    struct gov_source_params p = src_params("a");
    struct gov g;
    struct reply ok = rep_http(0, 200, NULL);
    const long same[1] = { 0 };

    p.rpm = 100; /* window 60 s: 100/60 per second */
    ck_assert_int_eq(gov_init(&g, &p, 1, 1, NULL, NULL, NULL, NULL, 0), 0);
    for (int i = 0; i < 30; i++)
        attempt_once(&g, 0, &ok, 0);
    ck_assert_near(bucket_level(&g.sources[0].rpm, 0), 70);
    /* Raised: the level is kept, not refilled. */
    p.rpm = 200;
    ck_assert_int_eq(reconf(&g, &p, same, 1, 1, NULL, 0, 0), 0);
    ck_assert_near(bucket_level(&g.sources[0].rpm, 0), 70);
    ck_assert_near(g.sources[0].rpm.capacity, 200);
    /* Lowered below the level: clamped to the new capacity; refills at the
     * new rate (10 per 60 s). */
    p.rpm = 10;
    ck_assert_int_eq(reconf(&g, &p, same, 1, 1, NULL, 0, 0), 0);
    ck_assert_near(bucket_level(&g.sources[0].rpm, 0), 10);
    for (int i = 0; i < 10; i++)
        attempt_once(&g, 0, &ok, 0);
    double at;
    ck_assert(!gov_source_runnable(&g, 0, 1, 0, &at));
    ck_assert_near(at, 6);
    /* Unlimited -> limited starts full; limited -> unlimited is unlimited. */
    p.rpm = 0;
    ck_assert_int_eq(reconf(&g, &p, same, 1, 1, NULL, 0, 0), 0);
    ck_assert(bucket_is_unlimited(&g.sources[0].rpm));
    p.rpm = 5;
    ck_assert_int_eq(reconf(&g, &p, same, 1, 1, NULL, 0, 0), 0);
    ck_assert_near(bucket_level(&g.sources[0].rpm, 0), 5);
    gov_fini(&g);
}
END_TEST

START_TEST(test_gov__reconf_aimd_and_breaker_keep_state_clamped)
{
    struct gov_source_params p = src_params("a");
    struct gov g;
    const long same[1] = { 0 };

    p.max_concurrency = 40;
    p.aimd_initial = 30;
    p.breaker_failures = 2;
    ck_assert_int_eq(gov_init(&g, &p, 1, 1, NULL, NULL, NULL, NULL, 0), 0);
    struct gov_source *s = &g.sources[0];
    ck_assert_near(s->aimd.limit, 30);
    s->attempts = 7;
    breaker_on_failure(&s->breaker, false, 0, NULL, NULL);
    breaker_on_failure(&s->breaker, false, 0, NULL, NULL);
    ck_assert_int_eq(s->breaker.state, BREAKER_OPEN);
    double open_until = s->breaker.open_until;
    uint64_t attempts = s->attempts;
    /* max_concurrency 10: the limit is clamped down; the open breaker stays
     * open (same deadline), its cool-down clamped into the new range. */
    p.max_concurrency = 10;
    p.breaker_cooldown_s = 60;
    p.breaker_max_cooldown_s = 120;
    ck_assert_int_eq(reconf(&g, &p, same, 1, 1, NULL, 0, 1), 0);
    s = &g.sources[0];
    ck_assert_near(s->aimd.limit, 10);
    ck_assert_near(s->aimd.max, 10);
    ck_assert_int_eq(s->breaker.state, BREAKER_OPEN);
    ck_assert_near(s->breaker.open_until, open_until);
    ck_assert_near(s->breaker.cooldown_s, 60);
    ck_assert_int_eq(s->attempts, attempts);
    /* min above the limit: clamped up. */
    p.max_concurrency = 40;
    p.aimd_min = 20;
    ck_assert_int_eq(reconf(&g, &p, same, 1, 1, NULL, 0, 1), 0);
    ck_assert_near(g.sources[0].aimd.limit, 20);
    gov_fini(&g);
}
END_TEST

START_TEST(test_gov__reconf_retired_source_finishes_attempt_and_is_never_picked)
{
    struct gov_source_params p[2] = { src_params("a"), src_params("b") };
    struct gov_policy pol = pol_chat();
    struct gov g;
    struct gov_call k, w;
    struct gov_decision d;
    struct reply ok = rep_http(0, 200, NULL);

    p[1].priority = 1;
    ck_assert_int_eq(gov_init(&g, p, 2, 1, NULL, NULL, NULL, NULL, 0), 0);
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 1, 0), 0);
    gov_call_step(&k, 0, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    ck_assert_uint_eq(d.source, 0);
    /* "a" is removed while k attempts on it: without continuing it, refused. */
    const long only_b[1] = { 1 };
    struct gov_call *ks[1] = { &k };
    ck_assert_int_eq(reconf(&g, &p[1], only_b, 1, 1, ks, 1, 0), -2);
    ck_assert_uint_eq(g.n_sources, 2); /* nothing changed */
    /* New order: b, a (retired), and a new c. */
    struct gov_source_params q[3] = { p[1], p[0], src_params("c") };
    q[1].retired = true;
    q[2].priority = 2;
    const long from[3] = { 1, 0, -1 };
    ck_assert_int_eq(reconf(&g, q, from, 3, 1, ks, 1, 0), 0);
    ck_assert_uint_eq(k.source, 1);
    ck_assert(k.notes[1].tried && k.notes[1].attempts == 1 && !k.notes[0].tried);
    ck_assert_uint_eq(g.sources[1].in_flight, 1);
    /* A new call never goes to the retired source, even with a permit free. */
    ck_assert_int_eq(gov_call_init(&w, &g, 0, "chat", &pol, 0, 1, 0), 0);
    gov_call_step(&w, 0, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    ck_assert_uint_eq(d.source, 0);
    gov_call_on_outcome(&w, 0, &ok.o, -1, &d);
    gov_call_fini(&w, 0);
    /* The retired attempt ends normally; its permit comes back. */
    gov_call_on_outcome(&k, 0, &ok.o, -1, &d);
    ck_assert_int_eq(d.result, GOV_OK);
    gov_call_fini(&k, 0);
    ck_assert_uint_eq(g.sources[1].in_flight, 0);
    ck_assert_uint_eq(g.sources[1].successes, 1);
    ck_assert_uint_eq(g.sources[2].attempts, 0); /* fresh state for "c" */
    gov_fini(&g);
}
END_TEST

START_TEST(test_gov__reconf_appends_capabilities_keeps_waiters)
{
    struct gov_source_params p = src_params("a");
    struct gov_policy pol = pol_chat();
    struct gov g;
    struct gov_call k, w;
    struct gov_decision d;
    const long same[2] = { 0, -1 };

    p.max_concurrency = 1;
    p.aimd_initial = 1;
    ck_assert_int_eq(gov_init(&g, &p, 1, 1, NULL, NULL, NULL, NULL, 0), 0);
    ck_assert_int_eq(gov_call_init(&k, &g, 0, "chat", &pol, 0, 1, 0), 0);
    gov_call_step(&k, 0, &d);
    ck_assert_int_eq(gov_call_init(&w, &g, 0, "chat", &pol, 0, 1, 0), 0);
    gov_call_step(&w, 0, &d);
    ck_assert_int_eq(d.action, GOV_WAIT); /* queued for the permit */
    ck_assert_uint_eq(g.waitq[0].n, 1);
    struct gov_source_params q[2] = { p, src_params("x") };
    q[1].capability = 1;
    struct gov_call *ks[2] = { &k, &w };
    ck_assert_int_eq(reconf(&g, q, same, 2, 0, ks, 2, 0), -2); /* capabilities never shrink */
    ck_assert_int_eq(reconf(&g, q, same, 2, 2, ks, 2, 0), 0);
    ck_assert_uint_eq(g.n_capabilities, 2);
    ck_assert_uint_eq(g.waitq[0].n, 1);
    ck_assert_ptr_eq(g.waitq[0].head, &w);
    gov_call_fini(&k, 0); /* the release wakes the waiter, as before */
    gov_call_step(&w, 0, &d);
    ck_assert_int_eq(d.action, GOV_ATTEMPT);
    ck_assert_uint_eq(d.source, 0);
    gov_call_fini(&w, 0);
    gov_fini(&g);
}
END_TEST

Suite *gov_suite(void)
{
    Suite *s = suite_create("gov");
    TCase *tc = tcase_create("core");

    /* docs/DESIGN.md §3.1 consequences 1-8 */
    tcase_add_test(tc, test_gov__timeout_does_not_exhaust_stall_budget);
    tcase_add_test(tc, test_gov__attempt_time_alone_never_stalls);
    tcase_add_test(tc, test_gov__pure_waiting_stalls_when_window_spent);
    tcase_add_test(tc, test_gov__all_429_exempt_ends_stalled);
    tcase_add_test(tc, test_gov__all_429_not_exempt_retry_exhausted);
    tcase_add_test(tc, test_gov__queueing_gateway_stalls_after_one_attempt);
    tcase_add_test(tc, test_gov__quadrant_neither_exceeded_waits);
    tcase_add_test(tc, test_gov__quadrant_stale_scope_only_waits);
    tcase_add_test(tc, test_gov__quadrant_local_exceeded_fresh_progress_waits);
    tcase_add_test(tc, test_gov__quadrant_both_exceeded_stalls);
    tcase_add_test(tc, test_gov__quadrant_never_progressed_counts_as_stale);
    tcase_add_test(tc, test_gov__concurrent_calls_separate_stall_clocks);
    tcase_add_test(tc, test_gov__cancel_inside_attempt_releases_permit);
    tcase_add_test(tc, test_gov__cancel_frees_half_open_probe);
    /* admission */
    tcase_add_test(tc, test_gov__breaker_cycle_in_the_loop);
    tcase_add_test(tc, test_gov__half_open_admits_exactly_one_probe);
    tcase_add_test(tc, test_gov__failover_when_breaker_open);
    tcase_add_test(tc, test_gov__aimd_decrease_on_429_and_timeouts_only);
    tcase_add_test(tc, test_gov__permits_min_of_max_concurrency_and_aimd);
    tcase_add_test(tc, test_gov__pacer_min_interval);
    tcase_add_test(tc, test_gov__rpm_limit_queues);
    tcase_add_test(tc, test_gov__tokens_reserved_and_reconciled);
    tcase_add_test(tc, test_gov__input_and_output_tokens_apart);
    tcase_add_test(tc, test_gov__app_input_and_output_tokens);
    tcase_add_test(tc, test_gov__exclude_moves_to_another_source);
    /* selection */
    tcase_add_test(tc, test_gov__selection_lower_priority_tier_first);
    tcase_add_test(tc, test_gov__selection_weighted_toward_less_loaded);
    tcase_add_test(tc, test_gov__selection_skips_source_failed_by_this_call);
    tcase_add_test(tc, test_gov__selection_failed_source_used_when_only_one);
    /* backoff, Retry-After, deadline */
    tcase_add_test(tc, test_gov__backoff_doubles_capped_with_jitter);
    tcase_add_test(tc, test_gov__retry_after_longer_than_backoff_wins);
    tcase_add_test(tc, test_gov__backoff_longer_than_retry_after_wins);
    tcase_add_test(tc, test_gov__error_carries_retry_after_estimate);
    tcase_add_test(tc, test_gov__deadline_exceeded_while_waiting);
    tcase_add_test(tc, test_gov__deadline_caps_backoff);
    tcase_add_test(tc, test_gov__deadline_passed_during_attempt);
    tcase_add_test(tc, test_gov__long_retry_after_stalls_at_once);
    tcase_add_test(tc, test_gov__long_retry_after_last_attempt_exhausted);
    tcase_add_test(tc, test_gov__long_retry_after_recent_progress_waits_until_verdict);
    tcase_add_test(tc, test_gov__retry_after_with_ongoing_progress_waits_for_hint);
    tcase_add_test(tc, test_gov__retry_after_within_window_is_waited);
    tcase_add_test(tc, test_gov__retry_after_holds_back_only_its_source);
    tcase_add_test(tc, test_gov__long_retry_after_unknown_age_waits);
    tcase_add_test(tc, test_gov__retry_later_hint_never_zero);
    /* waiting */
    tcase_add_test(tc, test_gov__fifo_wake_order_on_release);
    tcase_add_test(tc, test_gov__simultaneous_releases_wake_distinct_waiters);
    tcase_add_test(tc, test_gov__woken_waiter_leaving_passes_wake_on);
    tcase_add_test(tc, test_gov__fini_while_waiting_leaves_the_queue);
    /* outcomes, backend, counters */
    tcase_add_test(tc, test_gov__fail_fast_rejected_at_once);
    tcase_add_test(tc, test_gov__cancelled_outcome_reports_cancelled);
    tcase_add_test(tc, test_gov__backend_read_fails_closed_write_counted);
    tcase_add_test(tc, test_gov__stats_counters);
    tcase_add_test(tc, test_gov__refused_gives_back_and_waits);
    tcase_add_test(tc, test_gov__refused_without_time_polls_with_jitter);
    tcase_add_test(tc, test_gov__refused_reaches_verdicts);
    tcase_add_test(tc, test_gov__abandon_fails_closed);
    tcase_add_test(tc, test_gov__pending_age_never_stalls);
    tcase_add_test(tc, test_gov__refusal_wakes_permit_waiters_only);
    tcase_add_test(tc, test_gov__refusal_gates_the_source_one_asks_at_a_time);
    tcase_add_test(tc, test_gov__gate_chain_and_size_refusals);
    tcase_add_test(tc, test_gov__call_init_rejects_unknown_capability);
    tcase_add_test(tc, test_gov__names_stable);
    tcase_add_test(tc, test_gov__subset_picks_only_its_sources);
    tcase_add_test(tc, test_gov__subset_release_wakes_a_waiter_that_can_use_it);
    tcase_add_test(tc, test_gov__subset_wake_handed_on_within_the_subset);
    tcase_add_test(tc, test_gov__subset_retry_after_counts_its_sources_only);
    tcase_add_test(tc, test_gov__subset_kept_across_reconf);
    tcase_add_loop_test(tc, test_gov__affinity_spreads_sticks_and_moves, 0, 3);
    tcase_add_test(tc, test_gov__affinity_every_key_set_within_bound);
    tcase_add_test(tc, test_gov__affinity_table_expires_and_is_capped);
    tcase_add_test(tc, test_gov__affinity_respects_weights);
    tcase_add_test(tc, test_gov__fair_queue_weights_3_to_1);
    tcase_add_test(tc, test_gov__fair_queue_single_call_not_behind_backlog);
    tcase_add_test(tc, test_gov__fair_queue_without_apps_is_fifo);
    tcase_add_test(tc, test_gov__app_max_concurrency_holds);
    tcase_add_test(tc, test_gov__app_rpm_holds);
    tcase_add_test(tc, test_gov__app_per_capability_max_concurrency);
    tcase_add_test(tc, test_gov__app_per_capability_rpm);
    tcase_add_test(tc, test_gov__app_per_capability_refusal_gives_back);
    tcase_add_test(tc, test_gov__apps_reconf_keeps_counts_and_levels);
    /* reconfiguration */
    tcase_add_test(tc, test_gov__reconf_bucket_keeps_level_clamped_to_new_capacity);
    tcase_add_test(tc, test_gov__reconf_keeps_affinity_placements);
    tcase_add_test(tc, test_gov__reconf_aimd_and_breaker_keep_state_clamped);
    tcase_add_test(tc, test_gov__reconf_retired_source_finishes_attempt_and_is_never_picked);
    tcase_add_test(tc, test_gov__reconf_appends_capabilities_keeps_waiters);
    suite_add_tcase(s, tc);
    return s;
}
