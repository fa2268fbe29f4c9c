/* test_call.c — admission and leases of `call` (sidecar/call/call.c) over a
 * fake backend that answers when the test says so: an admission answered
 * after its call is gone, a refusal with a retry time, a backend that
 * cannot answer, and the lease's release with the attempt's verdict. */
#include <check.h>
#include <math.h>
#include <string.h>

#include "harness.h"
#include "suites.h"

#define WAIT_S 2.0

/* A sidecar with one client whose call 1 waits for its admission. */
static int start_with_call(struct harness *h)
{
    harness_start(h, NULL);
    int cl = harness_connect(h);
    harness_call(h, cl, 1, NULL);
    ck_assert(harness_wait_ops(h, FAKE_ADMIT, -1, 1, WAIT_S));
    return cl;
}

START_TEST(test_call__admission_answered_after_cancel)
{
    struct harness h;
    struct reply r;

    int cl = start_with_call(&h);
    ck_assert(!harness_recv(&h, cl, &r, 0.05)); /* waits for the backend */
    harness_cancel(&h, cl, 1);
    ck_assert(harness_recv(&h, cl, &r, WAIT_S));
    ck_assert_uint_eq(r.msgid, 1);
    ck_assert_str_eq(r.code, "cancelled");
    ck_assert_uint_eq(h.fb->detaches, 1);
    ck_assert_uint_eq(h.srv.stats.in_flight, 0);
    /* The fleet admits it anyway: the permit goes back at once, and
     * nothing reaches the client or the gone call. */
    fake_answer_admit(h.fb, 0, 1, NAN, "admitted");
    ck_assert_uint_eq(h.fb->leases_live, 0);
    ck_assert_uint_eq(h.fb->releases, 1);
    ck_assert(!harness_recv(&h, cl, &r, 0.05));
    harness_stop(&h);
}
END_TEST

START_TEST(test_call__refused_waits_for_the_retry_time)
{
    struct harness h;
    struct reply r;

    int cl = start_with_call(&h);
    double retry_at = ev_now(h.loop) + 0.3;
    fake_answer_admit(h.fb, 0, 0, retry_at, "concurrency");
    /* Asks again at the retry time (plus a jitter under poll_interval_s / 2),
     * not before (the upper bound leaves room for a loaded machine). */
    ck_assert(harness_wait_ops(&h, FAKE_ADMIT, -1, 2, WAIT_S));
    double asked = h.fb->ops[fake_find(h.fb, FAKE_ADMIT, -1, NULL, 1)].asked_at;
    ck_assert_msg(asked >= retry_at - 0.001 && asked <= retry_at + 0.025 + 0.5,
                  "asked again %.3f s after the retry time", asked - retry_at);
    ck_assert(!harness_recv(&h, cl, &r, 0.0));
    fake_answer_admit(h.fb, fake_find(h.fb, FAKE_ADMIT, -1, NULL, 1), -1, NAN, "timeout");
    ck_assert(harness_recv(&h, cl, &r, WAIT_S));
    ck_assert_str_eq(r.code, "backend_unavailable");
    harness_stop(&h);
}
END_TEST

START_TEST(test_call__backend_unavailable)
{
    struct harness h;
    struct reply r;

    int cl = start_with_call(&h);
    /* No answer within the command timeout. */
    fake_answer_admit(h.fb, 0, -1, NAN, "timeout");
    ck_assert(harness_recv(&h, cl, &r, WAIT_S));
    ck_assert_uint_eq(r.msgid, 1);
    ck_assert_str_eq(r.code, "backend_unavailable");
    ck_assert_ptr_nonnull(strstr(r.message, "timeout"));
    /* Not connected: fails closed at once. */
    h.fb->down = true;
    harness_call(&h, cl, 2, NULL);
    ck_assert(harness_recv(&h, cl, &r, WAIT_S));
    ck_assert_uint_eq(r.msgid, 2);
    ck_assert_str_eq(r.code, "backend_unavailable");
    ck_assert_uint_eq(fake_count(h.fb, FAKE_ADMIT, -1, false), 1);
    ck_assert_uint_eq(h.srv.stats.in_flight, 0);
    harness_stop(&h);
}
END_TEST

START_TEST(test_call__lease_released_with_the_verdict)
{
    struct harness h;
    struct reply r;

    int cl = start_with_call(&h);
    fake_answer_admit(h.fb, 0, 1, NAN, "admitted");
    ck_assert_uint_eq(h.fb->leases_live, 1);
    /* The upstream refuses the connection: a transient failure, which the
     * fleet breaker counts; max_attempts 1 ends the call. */
    ck_assert(harness_recv(&h, cl, &r, WAIT_S));
    ck_assert_str_eq(r.code, "retry_exhausted");
    ck_assert_uint_eq(h.fb->releases, 1);
    ck_assert_uint_eq(h.fb->leases_live, 0);
    ck_assert_str_eq(h.fb->last_verdict, "failure");
    harness_stop(&h);
}
END_TEST

Suite *call_suite(void)
{
    Suite *s = suite_create("call");
    TCase *tc = tcase_create("fake_backend");

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_call__admission_answered_after_cancel);
    tcase_add_test(tc, test_call__refused_waits_for_the_retry_time);
    tcase_add_test(tc, test_call__backend_unavailable);
    tcase_add_test(tc, test_call__lease_released_with_the_verdict);
    suite_add_tcase(s, tc);
    return s;
}
