/* test_redis_resolve.c — host-name lookups off the loop. */
#include <ev.h>
#include <stdio.h>
#include <string.h>

#include "backend/redis_resolve.h"
#include "suites.h"

struct answer {
    int calls, rc;
    char addr[64];
};

static void on_resolved(int rc, const char *addr, void *ud)
{
    struct answer *a = ud;

    a->calls++;
    a->rc = rc;
    snprintf(a->addr, sizeof(a->addr), "%s", addr);
}

static void on_give_up(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)w;
    (void)revents;
    ev_break(loop, EVBREAK_ALL);
}

/* Runs the loop until the answer came (or 5 s passed). */
static void run_until_answered(struct ev_loop *loop, struct answer *a)
{
    ev_timer give_up;

    ev_timer_init(&give_up, on_give_up, 5.0, 0.);
    ev_timer_start(loop, &give_up);
    while (a->calls == 0 && ev_is_active(&give_up))
        ev_run(loop, EVRUN_ONCE);
    ev_timer_stop(loop, &give_up);
}

START_TEST(test_redis_resolve__answers_on_the_loop_once)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    struct answer a = { 0 };
    struct rds_resolve *res = NULL;

    ck_assert_int_eq(rds_resolve_start(loop, "localhost", on_resolved, &a, &res), 0);
    ck_assert_ptr_nonnull(res);
    ck_assert_int_eq(a.calls, 0); /* never inside the call that started it */
    run_until_answered(loop, &a);
    ck_assert_int_eq(a.calls, 1);
    ck_assert_int_eq(a.rc, 0);
    ck_assert_msg(strcmp(a.addr, "127.0.0.1") == 0 || strcmp(a.addr, "::1") == 0, "%s", a.addr);
    ev_loop_destroy(loop);
}
END_TEST

START_TEST(test_redis_resolve__abandoned_lookup_never_calls_back)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    struct answer a = { 0 }, after = { 0 };
    struct rds_resolve *res = NULL;

    ck_assert_int_eq(rds_resolve_start(loop, "localhost", on_resolved, &a, &res), 0);
    rds_resolve_abandon(res);
    /* A second lookup finishing proves the loop ran past the first one's. */
    ck_assert_int_eq(rds_resolve_start(loop, "localhost", on_resolved, &after, &res), 0);
    run_until_answered(loop, &after);
    ck_assert_int_eq(after.calls, 1);
    ev_run(loop, EVRUN_NOWAIT);
    ck_assert_int_eq(a.calls, 0);
    ev_loop_destroy(loop);
}
END_TEST

Suite *redis_resolve_suite(void)
{
    Suite *s = suite_create("redis_resolve");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_redis_resolve__answers_on_the_loop_once);
    tcase_add_test(tc, test_redis_resolve__abandoned_lookup_never_calls_back);
    suite_add_tcase(s, tc);
    return s;
}
