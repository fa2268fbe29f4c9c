/* test_govparts.c — the primitives under the governance core, one suite per
 * module: the stall clock, the circuit breaker, the AIMD limit, the token
 * bucket and the progress store. Time is a plain `double` advanced by hand. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "aimd.h"
#include "breaker.h"
#include "bucket.h"
#include "progress.h"
#include "stallclock.h"
#include "suites.h"

#define EPS 1e-9

#define ck_assert_near(x, want)                                                                 \
    do {                                                                                        \
        double x_ = (x), w_ = (want);                                                           \
        ck_assert_msg(fabs(x_ - w_) <= EPS * fmax(1.0, fabs(w_)), "%s = %.12g, want %.12g", #x, \
                      x_, w_);                                                                  \
    } while (0)

/* ===================================================================== */
/* stallclock                                                            */
/* ===================================================================== */

START_TEST(test_stallclock__waiting_is_stalled)
{
    struct stall_clock sc;

    stall_clock_init(&sc, 100);
    ck_assert_near(stall_clock_stalled_s(&sc, 100), 0);
    ck_assert_near(stall_clock_stalled_s(&sc, 130), 30);
}
END_TEST

START_TEST(test_stallclock__attempt_is_productive)
{
    struct stall_clock sc;

    stall_clock_init(&sc, 100);
    stall_clock_attempt_begin(&sc, 110);
    /* In progress: counted as productive until it ends. */
    ck_assert_near(stall_clock_stalled_s(&sc, 300), 10);
    stall_clock_attempt_end(&sc, 410, false);
    ck_assert_near(sc.productive_s, 300);
    ck_assert_near(stall_clock_stalled_s(&sc, 420), 20);
}
END_TEST

START_TEST(test_stallclock__refund_charges_attempt_to_stall)
{
    struct stall_clock sc;

    stall_clock_init(&sc, 100);
    stall_clock_attempt_begin(&sc, 110);
    ck_assert_near(stall_clock_stalled_s(&sc, 410), 10);
    stall_clock_attempt_end(&sc, 410, true);
    ck_assert_near(sc.productive_s, 0);
    ck_assert_near(stall_clock_stalled_s(&sc, 410), 310);
}
END_TEST

START_TEST(test_stallclock__accumulates_attempts)
{
    struct stall_clock sc;

    stall_clock_init(&sc, 0);
    for (int i = 0; i < 10; i++) {
        /* 1000 s attempts separated by 1 s waits. */
        double t = i * 1001.0;
        stall_clock_attempt_begin(&sc, t + 1);
        stall_clock_attempt_end(&sc, t + 1001, false);
    }
    ck_assert_near(sc.productive_s, 10000);
    ck_assert_near(stall_clock_stalled_s(&sc, 10010), 10);
}
END_TEST

START_TEST(test_stallclock__nested_begin_and_stray_end_ignored)
{
    struct stall_clock sc;

    stall_clock_init(&sc, 0);
    stall_clock_attempt_end(&sc, 5, false); /* not attempting: no-op */
    ck_assert_near(sc.productive_s, 0);
    stall_clock_attempt_begin(&sc, 10);
    stall_clock_attempt_begin(&sc, 50); /* nested: ignored, start stays 10 */
    stall_clock_attempt_end(&sc, 60, false);
    ck_assert_near(sc.productive_s, 50);
    stall_clock_attempt_end(&sc, 90, false); /* already ended: no-op */
    ck_assert_near(sc.productive_s, 50);
    ck_assert_near(stall_clock_stalled_s(&sc, 100), 50);
}
END_TEST

START_TEST(test_stallclock__never_negative)
{
    struct stall_clock sc;

    stall_clock_init(&sc, 100);
    ck_assert_near(stall_clock_stalled_s(&sc, 50), 0);
    stall_clock_attempt_begin(&sc, 100);
    stall_clock_attempt_end(&sc, 90, false); /* a clock going backwards adds nothing */
    ck_assert_near(sc.productive_s, 0);
    ck_assert(!sc.attempting);
}
END_TEST

Suite *stallclock_suite(void)
{
    Suite *s = suite_create("stallclock");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_stallclock__waiting_is_stalled);
    tcase_add_test(tc, test_stallclock__attempt_is_productive);
    tcase_add_test(tc, test_stallclock__refund_charges_attempt_to_stall);
    tcase_add_test(tc, test_stallclock__accumulates_attempts);
    tcase_add_test(tc, test_stallclock__nested_begin_and_stray_end_ignored);
    tcase_add_test(tc, test_stallclock__never_negative);
    suite_add_tcase(s, tc);
    return s;
}

/* ===================================================================== */
/* breaker                                                               */
/* ===================================================================== */

struct transitions {
    struct {
        enum breaker_state from, to;
        double at;
    } v[32];
    size_t n;
};

static void record_transition(void *ud, const struct breaker *b, enum breaker_state from,
                              enum breaker_state to, double now)
{
    struct transitions *t = ud;

    ck_assert_int_eq(b->state, to); /* the hook sees the new state */
    ck_assert_uint_lt(t->n, 32);
    t->v[t->n].from = from;
    t->v[t->n].to = to;
    t->v[t->n].at = now;
    t->n++;
}

static void check_transition(const struct transitions *t, size_t i, enum breaker_state from,
                             enum breaker_state to, double at)
{
    ck_assert_uint_lt(i, t->n);
    ck_assert_msg(t->v[i].from == from && t->v[i].to == to,
                  "transition %zu: %s -> %s, want %s -> %s", i, breaker_state_name(t->v[i].from),
                  breaker_state_name(t->v[i].to), breaker_state_name(from), breaker_state_name(to));
    ck_assert_near(t->v[i].at, at);
}

/* Opens a fresh breaker (threshold 1) at `now`. */
static void open_breaker(struct breaker *b, double cooldown_s, double max_s, double now)
{
    breaker_init(b, 1, cooldown_s, max_s);
    ck_assert(breaker_admits(b, now, NULL, NULL));
    breaker_on_attempt(b);
    breaker_on_failure(b, false, now, NULL, NULL);
    ck_assert_int_eq(b->state, BREAKER_OPEN);
}

START_TEST(test_breaker__opens_after_consecutive_failures)
{
    struct breaker b;
    struct transitions t = { 0 };

    breaker_init(&b, 3, 10, 80);
    for (int i = 1; i <= 2; i++) {
        ck_assert(breaker_admits(&b, i, record_transition, &t));
        breaker_on_attempt(&b);
        breaker_on_failure(&b, false, i, record_transition, &t);
        ck_assert_int_eq(b.state, BREAKER_CLOSED);
    }
    ck_assert_uint_eq(t.n, 0);
    breaker_on_failure(&b, false, 3, record_transition, &t);
    ck_assert_int_eq(b.state, BREAKER_OPEN);
    ck_assert_uint_eq(b.opened_total, 1);
    ck_assert_near(b.open_until, 13);
    ck_assert_uint_eq(t.n, 1);
    check_transition(&t, 0, BREAKER_CLOSED, BREAKER_OPEN, 3);
    ck_assert(!breaker_admits(&b, 12.999, record_transition, &t));
    ck_assert_near(breaker_next_admit(&b, 5), 13);
}
END_TEST

START_TEST(test_breaker__success_resets_consecutive_count)
{
    struct breaker b;

    breaker_init(&b, 3, 10, 80);
    breaker_on_failure(&b, false, 1, NULL, NULL);
    breaker_on_failure(&b, false, 2, NULL, NULL);
    breaker_on_success(&b, false, 3, NULL, NULL);
    ck_assert_uint_eq(b.consecutive, 0);
    breaker_on_failure(&b, false, 4, NULL, NULL);
    breaker_on_failure(&b, false, 5, NULL, NULL);
    ck_assert_int_eq(b.state, BREAKER_CLOSED);
    breaker_on_failure(&b, false, 6, NULL, NULL);
    ck_assert_int_eq(b.state, BREAKER_OPEN);
}
END_TEST

START_TEST(test_breaker__neutral_never_trips)
{
    struct breaker b;

    breaker_init(&b, 1, 10, 80);
    for (int i = 0; i < 100; i++) {
        ck_assert(breaker_admits(&b, i, NULL, NULL));
        breaker_on_attempt(&b);
        breaker_on_neutral(&b, false); /* a 429 */
    }
    ck_assert_int_eq(b.state, BREAKER_CLOSED);
    ck_assert_uint_eq(b.opened_total, 0);
}
END_TEST

START_TEST(test_breaker__half_open_after_cooldown_admits_one_probe)
{
    struct breaker b;
    struct transitions t = { 0 };

    open_breaker(&b, 10, 80, 0);
    ck_assert(!breaker_admits(&b, 9.999, record_transition, &t));
    ck_assert_int_eq(b.state, BREAKER_OPEN);
    ck_assert(breaker_admits(&b, 10, record_transition, &t));
    ck_assert_int_eq(b.state, BREAKER_HALF_OPEN);
    check_transition(&t, 0, BREAKER_OPEN, BREAKER_HALF_OPEN, 10);
    ck_assert_near(breaker_next_admit(&b, 10), 10);
    /* Asking again without taking the probe changes nothing. */
    ck_assert(breaker_admits(&b, 10.1, record_transition, &t));
    ck_assert_uint_eq(t.n, 1);
    breaker_on_attempt(&b);
    ck_assert(b.probe_busy);
    ck_assert(!breaker_admits(&b, 10.2, record_transition, &t));
    ck_assert(!breaker_admits(&b, 1e6, record_transition, &t));
    ck_assert(isinf(breaker_next_admit(&b, 10.2)));
}
END_TEST

START_TEST(test_breaker__failed_probe_doubles_cooldown_up_to_max)
{
    struct breaker b;
    double now = 0;
    const double want_until[] = { 10 + 20, 30 + 35, 65 + 35 };

    open_breaker(&b, 10, 35, now);
    ck_assert_near(b.open_until, 10);
    now = 10;
    for (size_t i = 0; i < 3; i++) {
        ck_assert(breaker_admits(&b, now, NULL, NULL));
        breaker_on_attempt(&b);
        breaker_on_failure(&b, true, now, NULL, NULL);
        ck_assert_int_eq(b.state, BREAKER_OPEN);
        ck_assert(!b.probe_busy);
        ck_assert_near(b.open_until, want_until[i]);
        ck_assert(!breaker_admits(&b, b.open_until - 0.001, NULL, NULL));
        now = b.open_until;
    }
    ck_assert_near(b.cooldown_s, 35);
    ck_assert_uint_eq(b.opened_total, 4);
}
END_TEST

START_TEST(test_breaker__probe_success_closes_and_resets)
{
    struct breaker b;
    struct transitions t = { 0 };

    breaker_init(&b, 2, 10, 80);
    breaker_on_failure(&b, false, 0, record_transition, &t);
    breaker_on_failure(&b, false, 0, record_transition, &t);
    ck_assert(breaker_admits(&b, 10, record_transition, &t));
    breaker_on_attempt(&b);
    breaker_on_failure(&b, true, 11, record_transition, &t); /* cooldown 20 */
    ck_assert(breaker_admits(&b, 31, record_transition, &t));
    breaker_on_attempt(&b);
    breaker_on_success(&b, true, 32, record_transition, &t);
    ck_assert_int_eq(b.state, BREAKER_CLOSED);
    ck_assert_near(b.cooldown_s, 10);
    ck_assert(!b.probe_busy);
    ck_assert_uint_eq(t.n, 5);
    check_transition(&t, 0, BREAKER_CLOSED, BREAKER_OPEN, 0);
    check_transition(&t, 1, BREAKER_OPEN, BREAKER_HALF_OPEN, 10);
    check_transition(&t, 2, BREAKER_HALF_OPEN, BREAKER_OPEN, 11);
    check_transition(&t, 3, BREAKER_OPEN, BREAKER_HALF_OPEN, 31);
    check_transition(&t, 4, BREAKER_HALF_OPEN, BREAKER_CLOSED, 32);
    /* Closed again from scratch: the threshold counts anew and the
     * cool-down is the base one. */
    breaker_on_failure(&b, false, 40, NULL, NULL);
    ck_assert_int_eq(b.state, BREAKER_CLOSED);
    breaker_on_failure(&b, false, 41, NULL, NULL);
    ck_assert_int_eq(b.state, BREAKER_OPEN);
    ck_assert_near(b.open_until, 51);
}
END_TEST

START_TEST(test_breaker__neutral_probe_frees_the_slot)
{
    struct breaker b;

    open_breaker(&b, 10, 80, 0);
    ck_assert(breaker_admits(&b, 10, NULL, NULL));
    breaker_on_attempt(&b);
    ck_assert(!breaker_admits(&b, 10, NULL, NULL));
    breaker_on_neutral(&b, true); /* cancelled or 429: no verdict */
    ck_assert_int_eq(b.state, BREAKER_HALF_OPEN);
    ck_assert(breaker_admits(&b, 10.5, NULL, NULL));
    ck_assert_near(b.cooldown_s, 10);
}
END_TEST

START_TEST(test_breaker__stragglers_do_not_decide)
{
    struct breaker b;

    /* An attempt admitted while closed ends after the breaker opened. */
    open_breaker(&b, 10, 80, 0);
    breaker_on_failure(&b, false, 5, NULL, NULL);
    ck_assert_int_eq(b.state, BREAKER_OPEN);
    ck_assert_near(b.open_until, 10); /* not extended */
    breaker_on_success(&b, false, 6, NULL, NULL);
    ck_assert_int_eq(b.state, BREAKER_OPEN);
    /* ... or after it went half-open: only the probe decides. */
    ck_assert(breaker_admits(&b, 10, NULL, NULL));
    breaker_on_attempt(&b);
    breaker_on_failure(&b, false, 11, NULL, NULL);
    ck_assert_int_eq(b.state, BREAKER_HALF_OPEN);
    breaker_on_success(&b, false, 11, NULL, NULL);
    ck_assert_int_eq(b.state, BREAKER_HALF_OPEN);
    breaker_on_neutral(&b, false);
    ck_assert(b.probe_busy);
}
END_TEST

START_TEST(test_breaker__init_clamps_and_names)
{
    struct breaker b;

    breaker_init(&b, 0, 10, 5);
    ck_assert_uint_eq(b.failures, 1);
    ck_assert_near(b.max_cooldown_s, 10);
    ck_assert_str_eq(breaker_state_name(BREAKER_CLOSED), "closed");
    ck_assert_str_eq(breaker_state_name(BREAKER_OPEN), "open");
    ck_assert_str_eq(breaker_state_name(BREAKER_HALF_OPEN), "half_open");
}
END_TEST

Suite *breaker_suite(void)
{
    Suite *s = suite_create("breaker");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_breaker__opens_after_consecutive_failures);
    tcase_add_test(tc, test_breaker__success_resets_consecutive_count);
    tcase_add_test(tc, test_breaker__neutral_never_trips);
    tcase_add_test(tc, test_breaker__half_open_after_cooldown_admits_one_probe);
    tcase_add_test(tc, test_breaker__failed_probe_doubles_cooldown_up_to_max);
    tcase_add_test(tc, test_breaker__probe_success_closes_and_resets);
    tcase_add_test(tc, test_breaker__neutral_probe_frees_the_slot);
    tcase_add_test(tc, test_breaker__stragglers_do_not_decide);
    tcase_add_test(tc, test_breaker__init_clamps_and_names);
    suite_add_tcase(s, tc);
    return s;
}

/* ===================================================================== */
/* aimd                                                                  */
/* ===================================================================== */

START_TEST(test_aimd__init_clamps)
{
    struct aimd a;

    aimd_init(&a, 0, 2, 8, 1, 0.5);
    ck_assert_near(a.limit, 2);
    aimd_init(&a, 100, 2, 8, 1, 0.5);
    ck_assert_near(a.limit, 8);
    aimd_init(&a, 4, 0, 8, 1, 0.5);
    ck_assert_near(a.min, 1);
    aimd_init(&a, 4, 6, 3, 1, 0.5); /* max below min: max = min */
    ck_assert_near(a.max, 6);
    ck_assert_near(a.limit, 6);
}
END_TEST

START_TEST(test_aimd__additive_increase)
{
    struct aimd a;

    aimd_init(&a, 4, 1, 100, 1, 0.5);
    aimd_on_success(&a);
    ck_assert_near(a.limit, 4.25);
    aimd_on_success(&a);
    ck_assert_near(a.limit, 4.25 + 1 / 4.25);
    /* increase 2 over limit 10: +0.2 per success */
    aimd_init(&a, 10, 1, 100, 2, 0.5);
    aimd_on_success(&a);
    ck_assert_near(a.limit, 10.2);
}
END_TEST

START_TEST(test_aimd__multiplicative_decrease_to_floor)
{
    struct aimd a;

    aimd_init(&a, 8, 1, 16, 1, 0.5);
    aimd_on_decrease(&a);
    ck_assert_near(a.limit, 4);
    aimd_on_decrease(&a);
    aimd_on_decrease(&a);
    ck_assert_near(a.limit, 1);
    aimd_on_decrease(&a);
    ck_assert_near(a.limit, 1);
    aimd_init(&a, 8, 3, 16, 1, 0.75);
    aimd_on_decrease(&a);
    ck_assert_near(a.limit, 6);
    aimd_on_decrease(&a);
    ck_assert_near(a.limit, 4.5);
    aimd_on_decrease(&a);
    ck_assert_near(a.limit, 3.375);
    aimd_on_decrease(&a);
    ck_assert_near(a.limit, 3);
}
END_TEST

START_TEST(test_aimd__increase_clamped_at_max)
{
    struct aimd a;

    aimd_init(&a, 2, 1, 3, 1, 0.5);
    for (int i = 0; i < 1000; i++)
        aimd_on_success(&a);
    ck_assert_near(a.limit, 3);
    ck_assert_uint_eq(aimd_permits(&a), 3);
}
END_TEST

START_TEST(test_aimd__permits_are_floor_at_least_one)
{
    struct aimd a;

    aimd_init(&a, 2.99, 1, 8, 1, 0.5);
    ck_assert_uint_eq(aimd_permits(&a), 2);
    aimd_init(&a, 1, 1, 8, 1, 0.5);
    ck_assert_uint_eq(aimd_permits(&a), 1);
    aimd_on_decrease(&a);
    ck_assert_uint_eq(aimd_permits(&a), 1);
    aimd_init(&a, 5, 1, 8, 1, 0.5);
    ck_assert_uint_eq(aimd_permits(&a), 5);
}
END_TEST

Suite *aimd_suite(void)
{
    Suite *s = suite_create("aimd");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_aimd__init_clamps);
    tcase_add_test(tc, test_aimd__additive_increase);
    tcase_add_test(tc, test_aimd__multiplicative_decrease_to_floor);
    tcase_add_test(tc, test_aimd__increase_clamped_at_max);
    tcase_add_test(tc, test_aimd__permits_are_floor_at_least_one);
    suite_add_tcase(s, tc);
    return s;
}

/* ===================================================================== */
/* bucket                                                                */
/* ===================================================================== */

START_TEST(test_bucket__rpm_refill_rate)
{
    struct bucket b;

    bucket_init(&b, 60, 60, 100); /* 60 rpm: one token per second */
    ck_assert_near(b.rate, 1);
    ck_assert_near(bucket_level(&b, 100), 60);
    for (int i = 0; i < 60; i++) {
        ck_assert(bucket_can_take(&b, 1, 100));
        bucket_take(&b, 1, 100);
    }
    ck_assert(!bucket_can_take(&b, 1, 100));
    ck_assert_near(bucket_level(&b, 100.5), 0.5);
    ck_assert(!bucket_can_take(&b, 1, 100.999));
    ck_assert(bucket_can_take(&b, 1, 101));
    ck_assert_near(bucket_level(&b, 130), 30);
    /* Refill stops at capacity. */
    ck_assert_near(bucket_level(&b, 10000), 60);
}
END_TEST

START_TEST(test_bucket__available_at_exact)
{
    struct bucket b;

    bucket_init(&b, 600, 60, 0); /* 10 tokens/s */
    bucket_take(&b, 600, 0);
    ck_assert_near(bucket_available_at(&b, 1, 0), 0.1);
    ck_assert_near(bucket_available_at(&b, 300, 0), 30);
    ck_assert_near(bucket_available_at(&b, 300, 10), 30); /* after a partial refill */
    ck_assert_near(bucket_available_at(&b, 50, 10), 10);  /* 100 there: now */
    /* The computed time is enough: can_take holds exactly then. */
    double at = bucket_available_at(&b, 123.4, 10);
    ck_assert(!bucket_can_take(&b, 123.4, at - 1e-3));
    ck_assert(bucket_can_take(&b, 123.4, at));
}
END_TEST

START_TEST(test_bucket__reconcile_with_debt)
{
    struct bucket b;

    bucket_init(&b, 600, 60, 0); /* 10 tokens/s */
    bucket_take(&b, 100, 0);     /* estimate */
    ck_assert_near(bucket_level(&b, 0), 500);
    bucket_adjust(&b, 300, 0); /* real usage 400 */
    ck_assert_near(bucket_level(&b, 0), 200);
    bucket_adjust(&b, 400, 0); /* estimate far too low: debt */
    ck_assert_near(bucket_level(&b, 0), -200);
    ck_assert(!bucket_can_take(&b, 0, 0)); /* even a zero cost waits for the debt */
    ck_assert_near(bucket_available_at(&b, 50, 0), 25);
    ck_assert_near(bucket_level(&b, 25), 50);
    bucket_adjust(&b, -1000, 25); /* giving back never overfills */
    ck_assert_near(bucket_level(&b, 25), 600);
    bucket_adjust(&b, -10, 30);
    ck_assert_near(bucket_level(&b, 30), 600);
}
END_TEST

START_TEST(test_bucket__oversized_cost_admitted_when_full)
{
    struct bucket b;

    bucket_init(&b, 100, 60, 0);
    ck_assert(bucket_can_take(&b, 150, 0));
    bucket_take(&b, 150, 0);
    ck_assert_near(bucket_level(&b, 0), -50);
    /* Next oversized request: the bucket must be full again. */
    ck_assert_near(bucket_available_at(&b, 150, 0), 150 * 60.0 / 100);
    ck_assert(!bucket_can_take(&b, 150, 89));
    ck_assert(bucket_can_take(&b, 150, 90));
    /* Not full: refused even though it could never be more than full. */
    bucket_take(&b, 1, 90);
    ck_assert(!bucket_can_take(&b, 150, 90));
}
END_TEST

START_TEST(test_bucket__unlimited)
{
    struct bucket b;

    bucket_init(&b, 0, 60, 0);
    ck_assert(bucket_is_unlimited(&b));
    ck_assert(bucket_can_take(&b, 1e12, 0));
    bucket_take(&b, 1e12, 0);
    bucket_adjust(&b, 1e12, 0);
    ck_assert(isinf(bucket_level(&b, 1)));
    ck_assert_near(bucket_available_at(&b, 1e12, 5), 5);
}
END_TEST

START_TEST(test_bucket__time_going_backwards_ignored)
{
    struct bucket b;

    bucket_init(&b, 60, 60, 100);
    bucket_take(&b, 60, 100);
    ck_assert_near(bucket_level(&b, 90), 0);
    ck_assert_near(bucket_level(&b, 110), 10);
    ck_assert_near(bucket_level(&b, 105), 10);
    ck_assert_near(bucket_level(&b, 111), 11);
}
END_TEST

Suite *bucket_suite(void)
{
    Suite *s = suite_create("bucket");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_bucket__rpm_refill_rate);
    tcase_add_test(tc, test_bucket__available_at_exact);
    tcase_add_test(tc, test_bucket__reconcile_with_debt);
    tcase_add_test(tc, test_bucket__oversized_cost_admitted_when_full);
    tcase_add_test(tc, test_bucket__unlimited);
    tcase_add_test(tc, test_bucket__time_going_backwards_ignored);
    suite_add_tcase(s, tc);
    return s;
}

/* ===================================================================== */
/* progress                                                              */
/* ===================================================================== */

struct seen_scopes {
    char names[8][16];
    double at[8];
    size_t n;
};

static void collect_scope(const char *scope, double last_at, void *ud)
{
    struct seen_scopes *s = ud;

    ck_assert_uint_lt(s->n, 8);
    strncpy(s->names[s->n], scope, sizeof(s->names[0]) - 1);
    s->at[s->n++] = last_at;
}

START_TEST(test_progress__never_succeeded_is_infinite)
{
    struct progress_store *ps = progress_store_new(4);

    ck_assert_ptr_nonnull(ps);
    ck_assert(isinf(progress_age(ps, "chat", 1000)));
    ck_assert_int_eq(progress_mark(ps, "chat", 100), 0);
    ck_assert_near(progress_age(ps, "chat", 130), 30);
    ck_assert(isinf(progress_age(ps, "embedding", 130)));
    ck_assert_near(progress_age(ps, "chat", 50), 0); /* never negative */
    progress_store_free(ps);
}
END_TEST

START_TEST(test_progress__mark_keeps_the_latest)
{
    struct progress_store *ps = progress_store_new(4);

    ck_assert_int_eq(progress_mark(ps, "chat", 100), 0);
    ck_assert_int_eq(progress_mark(ps, "chat", 90), 0); /* a late report of an older success */
    ck_assert_near(progress_age(ps, "chat", 110), 10);
    ck_assert_int_eq(progress_mark(ps, "chat", 200), 0);
    ck_assert_near(progress_age(ps, "chat", 210), 10);
    ck_assert_uint_eq(progress_count(ps), 1);
    progress_store_free(ps);
}
END_TEST

START_TEST(test_progress__bounded_forgets_the_stalest)
{
    struct progress_store *ps = progress_store_new(3);
    struct seen_scopes seen = { 0 };

    progress_mark(ps, "a", 10);
    progress_mark(ps, "b", 5);
    progress_mark(ps, "c", 20);
    progress_mark(ps, "d", 30); /* full: "b" (oldest progress) is forgotten */
    ck_assert_uint_eq(progress_count(ps), 3);
    ck_assert(isinf(progress_age(ps, "b", 40)));
    ck_assert_near(progress_age(ps, "a", 40), 30);
    ck_assert_near(progress_age(ps, "d", 40), 10);
    progress_foreach(ps, collect_scope, &seen);
    ck_assert_uint_eq(seen.n, 3);
    for (size_t i = 0; i < seen.n; i++)
        ck_assert_str_ne(seen.names[i], "b");
    progress_store_free(ps);
    progress_store_free(NULL);
}
END_TEST

Suite *progress_suite(void)
{
    Suite *s = suite_create("progress");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_progress__never_succeeded_is_infinite);
    tcase_add_test(tc, test_progress__mark_keeps_the_latest);
    tcase_add_test(tc, test_progress__bounded_forgets_the_stalest);
    suite_add_tcase(s, tc);
    return s;
}
