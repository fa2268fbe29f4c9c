/* test_tasks.c — the task layer (sidecar/call/tasks.c) over a fake backend
 * that answers when the test says so: the record's answers reach the
 * client and the local copy, a stop or a watchdog verdict ends the calls
 * held here, and the paths that need a backend gap — resync after a
 * reconnection (paced), a watchdog verdict that could not be written,
 * backend_unavailable — without a Redis server. */
#include <check.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "suites.h"
#include "task.h"
#include "call/tasks.h"

#define WAIT_S 2.0

/* Starts task `id` on client `cl`: the record answers running. */
static void start_task(struct harness *h, int cl, uint32_t msgid, const char *id)
{
    struct reply r;
    size_t before = fake_count(h->fb, FAKE_TASK, BACKEND_TASK_START, false);

    harness_task(h, cl, msgid, "task.start", id, NULL);
    ck_assert(harness_wait_ops(h, FAKE_TASK, BACKEND_TASK_START, before + 1, WAIT_S));
    int i = fake_find(h->fb, FAKE_TASK, BACKEND_TASK_START, id, 0);
    ck_assert_int_ge(i, 0);
    fake_answer_task(h->fb, i, TASK_OK, "running", NULL, NULL);
    ck_assert(harness_recv(h, cl, &r, WAIT_S));
    ck_assert_uint_eq(r.msgid, msgid);
    ck_assert_str_eq(r.code, "");
    ck_assert_str_eq(r.state, "running");
}

/* A sidecar with one client that started task t1 (msgid 1). */
static int start_with_task(struct harness *h)
{
    harness_start(h, NULL);
    int cl = harness_connect(h);
    start_task(h, cl, 1, "t1");
    return cl;
}

/* A call naming running task `id`, left waiting for its admission. */
static void call_in_task(struct harness *h, int cl, uint32_t msgid, const char *id)
{
    size_t before = fake_count(h->fb, FAKE_ADMIT, -1, false);

    harness_call(h, cl, msgid, id);
    ck_assert(harness_wait_ops(h, FAKE_ADMIT, -1, before + 1, WAIT_S));
}

START_TEST(test_tasks__answer_waits_for_the_record)
{
    struct harness h;
    struct reply r;

    harness_start(&h, NULL);
    int cl = harness_connect(&h);
    harness_task(&h, cl, 1, "task.start", "t1", NULL);
    ck_assert(harness_wait_ops(&h, FAKE_TASK, BACKEND_TASK_START, 1, WAIT_S));
    ck_assert(!harness_recv(&h, cl, &r, 0.05)); /* nothing until the record answers */
    ck_assert_uint_eq(h.srv.stats.in_flight, 1);
    fake_answer_task(h.fb, 0, TASK_OK, "running", NULL, NULL);
    ck_assert(harness_recv(&h, cl, &r, WAIT_S));
    ck_assert_str_eq(r.state, "running");
    ck_assert_uint_eq(h.srv.stats.in_flight, 0);
    ck_assert(tasks_held_running(&h.srv, "t1")); /* imported: a copy held here */
    harness_stop(&h);
}
END_TEST

START_TEST(test_tasks__stop_answers_then_ends_the_calls)
{
    struct harness h;
    struct reply r;
    int cl = start_with_task(&h);
    call_in_task(&h, cl, 2, "t1");
    harness_task(&h, cl, 3, "task.stop", "t1", "user abort");
    ck_assert(harness_wait_ops(&h, FAKE_TASK, BACKEND_TASK_STOP, 1, WAIT_S));
    int i = fake_find(h.fb, FAKE_TASK, BACKEND_TASK_STOP, "t1", 0);
    ck_assert_str_eq(h.fb->ops[i].reason, "user abort");
    fake_answer_task(h.fb, i, TASK_OK, "failed", "stopped", "user abort");
    /* The stop's client hears first, then the call ends task_stopped. */
    ck_assert(harness_recv(&h, cl, &r, WAIT_S));
    ck_assert_uint_eq(r.msgid, 3);
    ck_assert_str_eq(r.state, "failed");
    ck_assert_str_eq(r.reason_kind, "stopped");
    ck_assert(harness_recv(&h, cl, &r, WAIT_S));
    ck_assert_uint_eq(r.msgid, 2);
    ck_assert_str_eq(r.code, "task_stopped");
    ck_assert_str_eq(r.reason, "user abort");
    ck_assert_uint_eq(h.fb->detaches, 1); /* its admission will not be delivered */
    harness_stop(&h);
}
END_TEST

START_TEST(test_tasks__backend_unavailable)
{
    struct harness h;
    struct reply r;

    harness_start(&h, NULL);
    int cl = harness_connect(&h);
    /* The answer does not come in time (the backend's command timeout). */
    harness_task(&h, cl, 1, "task.get", "t1", NULL);
    ck_assert(harness_wait_ops(&h, FAKE_TASK, BACKEND_TASK_GET, 1, WAIT_S));
    fake_fail_task(h.fb, 0, "timeout");
    ck_assert(harness_recv(&h, cl, &r, WAIT_S));
    ck_assert_str_eq(r.code, "backend_unavailable");
    ck_assert_ptr_nonnull(strstr(r.message, "timeout"));
    /* Not connected: answered at once, nothing sent. */
    h.fb->down = true;
    harness_task(&h, cl, 2, "task.start", "t2", NULL);
    ck_assert(harness_recv(&h, cl, &r, WAIT_S));
    ck_assert_uint_eq(r.msgid, 2);
    ck_assert_str_eq(r.code, "backend_unavailable");
    ck_assert_uint_eq(fake_count(h.fb, FAKE_TASK, -1, false), 1);
    ck_assert_uint_eq(h.srv.stats.in_flight, 0);
    harness_stop(&h);
}
END_TEST

START_TEST(test_tasks__stop_sent_during_a_gap_is_refused)
{
    struct harness h;
    struct reply r;
    int cl = start_with_task(&h);

    call_in_task(&h, cl, 2, "t1");
    /* The backend is unreachable: the stop is not recorded, so it must not
     * be half-applied here either; the client is told to retry. */
    h.fb->down = true;
    harness_task(&h, cl, 3, "task.stop", "t1", "abort");
    ck_assert(harness_recv(&h, cl, &r, WAIT_S));
    ck_assert_uint_eq(r.msgid, 3);
    ck_assert_str_eq(r.code, "backend_unavailable");
    ck_assert(tasks_held_running(&h.srv, "t1"));
    ck_assert(!harness_recv(&h, cl, &r, 0.05)); /* the call still waits */
    ck_assert_uint_eq(h.srv.stats.in_flight, 1);
    harness_stop(&h);
}
END_TEST

START_TEST(test_tasks__stop_during_a_gap_is_found_by_the_resync)
{
    struct harness h;
    struct reply r;
    int cl = start_with_task(&h);
    start_task(&h, cl, 2, "t2");
    call_in_task(&h, cl, 3, "t1");
    /* t1 was stopped on another sidecar while the channel was down: the
     * backend, back, asks for a resync; every running task is re-read. */
    h.fb->be.hooks.on_resync(h.fb->be.hooks.ud);
    ck_assert_uint_eq(fake_count(h.fb, FAKE_TASK, BACKEND_TASK_GET, true), 2);
    int i1 = fake_find(h.fb, FAKE_TASK, BACKEND_TASK_GET, "t1", 0);
    int i2 = fake_find(h.fb, FAKE_TASK, BACKEND_TASK_GET, "t2", 0);
    fake_answer_task(h.fb, i2, TASK_OK, "running", NULL, NULL);
    fake_answer_task(h.fb, i1, TASK_OK, "failed", "stopped", "stopped elsewhere");
    ck_assert(harness_recv(&h, cl, &r, WAIT_S));
    ck_assert_uint_eq(r.msgid, 3);
    ck_assert_str_eq(r.code, "task_stopped");
    ck_assert_str_eq(r.reason, "stopped elsewhere");
    ck_assert(!tasks_held_running(&h.srv, "t1"));
    ck_assert(tasks_held_running(&h.srv, "t2"));
    harness_stop(&h);
}
END_TEST

START_TEST(test_tasks__resync_is_paced)
{
    enum { N = 300, WINDOW = 128 };
    struct harness h;
    char id[32];

    harness_start(&h, NULL);
    int cl = harness_connect(&h);
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof(id), "task-%d", i);
        start_task(&h, cl, (uint32_t)(i + 1), id);
    }
    h.fb->be.hooks.on_resync(h.fb->be.hooks.ud);
    ck_assert_uint_eq(fake_count(h.fb, FAKE_TASK, BACKEND_TASK_GET, true), WINDOW);
    /* Each answer, or failure, lets one more read out: never more. */
    for (int answered = 0; answered < N; answered++) {
        int i = fake_find(h.fb, FAKE_TASK, BACKEND_TASK_GET, NULL, (size_t)answered);
        ck_assert_int_ge(i, 0);
        if (answered % 7 == 0)
            fake_fail_task(h.fb, i, "timeout");
        else
            fake_answer_task(h.fb, i, TASK_OK, "running", NULL, NULL);
        size_t left = (size_t)(N - answered - 1);
        ck_assert_uint_eq(fake_count(h.fb, FAKE_TASK, BACKEND_TASK_GET, true),
                          left < WINDOW ? left : WINDOW);
    }
    ck_assert_uint_eq(fake_count(h.fb, FAKE_TASK, BACKEND_TASK_GET, false), N);
    ck_assert_uint_eq(h.fb->retry_resyncs, (N + 6) / 7); /* a failed read asks for another */
    harness_stop(&h);
}
END_TEST

START_TEST(test_tasks__resync_read_failed_asks_again)
{
    struct harness h;

    start_with_task(&h);
    h.fb->be.hooks.on_resync(h.fb->be.hooks.ud);
    int i = fake_find(h.fb, FAKE_TASK, BACKEND_TASK_GET, "t1", 0);
    fake_fail_task(h.fb, i, "timeout");
    ck_assert_uint_eq(h.fb->retry_resyncs, 1); /* that task may have been stopped */
    /* A resync that cannot even be sent is asked for again, later. */
    h.fb->down = true;
    h.fb->be.hooks.on_resync(h.fb->be.hooks.ud);
    ck_assert_uint_eq(h.fb->retry_resyncs, 2);
    ck_assert(tasks_held_running(&h.srv, "t1"));
    harness_stop(&h);
}
END_TEST

START_TEST(test_tasks__watchdog_verdict_retried)
{
    struct harness h;
    struct reply r;
    int cl = start_with_task(&h);
    harness_node_begin(&h, cl, 2, "t1", "n1", 0.05);
    ck_assert(harness_recv(&h, cl, &r, WAIT_S)); /* held running: no backend round trip */
    ck_assert_str_eq(r.code, "");
    call_in_task(&h, cl, 3, "t1");
    /* The watchdog fires here: the call ends at once, the verdict goes to
     * the record. */
    ck_assert(harness_recv(&h, cl, &r, WAIT_S));
    ck_assert_uint_eq(r.msgid, 3);
    ck_assert_str_eq(r.code, "watchdog_timeout");
    ck_assert(harness_wait_ops(&h, FAKE_TASK, BACKEND_TASK_WATCHDOG, 1, WAIT_S));
    int i = fake_find(h.fb, FAKE_TASK, BACKEND_TASK_WATCHDOG, "t1", 0);
    ck_assert_ptr_nonnull(strstr(h.fb->ops[i].reason, "n1"));
    /* The write fails: retried later, when the backend says so. */
    fake_fail_task(h.fb, i, "error reply from task.lua");
    ck_assert_uint_eq(h.fb->retry_laters, 1);
    ck_assert_uint_eq(fake_count(h.fb, FAKE_TASK, BACKEND_TASK_WATCHDOG, false), 1);
    /* Down: the resend cannot go out and stays queued. */
    h.fb->down = true;
    h.fb->be.hooks.on_up(h.fb->be.hooks.ud);
    ck_assert_uint_eq(fake_count(h.fb, FAKE_TASK, BACKEND_TASK_WATCHDOG, false), 1);
    h.fb->down = false;
    h.fb->be.hooks.on_up(h.fb->be.hooks.ud);
    ck_assert_uint_eq(fake_count(h.fb, FAKE_TASK, BACKEND_TASK_WATCHDOG, false), 2);
    i = fake_find(h.fb, FAKE_TASK, BACKEND_TASK_WATCHDOG, "t1", 1);
    fake_answer_task(h.fb, i, TASK_OK, "failed", "watchdog", h.fb->ops[i].reason);
    h.fb->be.hooks.on_up(h.fb->be.hooks.ud); /* sent: nothing left to send */
    ck_assert_uint_eq(fake_count(h.fb, FAKE_TASK, BACKEND_TASK_WATCHDOG, false), 2);
    harness_stop(&h);
}
END_TEST

START_TEST(test_tasks__ended_elsewhere)
{
    struct harness h;
    struct reply r;
    int cl = start_with_task(&h);
    call_in_task(&h, cl, 2, "t1");
    /* Not held here, no import in flight: not worth a read. */
    h.fb->be.hooks.on_task_ended(h.fb->be.hooks.ud, "other");
    ck_assert_uint_eq(fake_count(h.fb, FAKE_TASK, BACKEND_TASK_GET, false), 0);
    /* A watchdog on another sidecar failed t1: re-read, the call ends with
     * the record's verdict. */
    h.fb->be.hooks.on_task_ended(h.fb->be.hooks.ud, "t1");
    int i = fake_find(h.fb, FAKE_TASK, BACKEND_TASK_GET, "t1", 0);
    ck_assert_int_ge(i, 0);
    fake_answer_task(h.fb, i, TASK_OK, "failed", "watchdog", "node x exceeded 5s");
    ck_assert(harness_recv(&h, cl, &r, WAIT_S));
    ck_assert_uint_eq(r.msgid, 2);
    ck_assert_str_eq(r.code, "watchdog_timeout");
    ck_assert_str_eq(r.reason, "node x exceeded 5s");
    harness_stop(&h);
}
END_TEST

START_TEST(test_tasks__call_naming_a_task_not_held)
{
    struct harness h;
    struct reply r;

    harness_start(&h, NULL);
    int cl = harness_connect(&h);
    /* Started on another sidecar: the record is asked, the task imported,
     * and the call goes on to its admission. */
    harness_call(&h, cl, 1, "remote");
    ck_assert(harness_wait_ops(&h, FAKE_TASK, BACKEND_TASK_GUARD, 1, WAIT_S));
    ck_assert_uint_eq(fake_count(h.fb, FAKE_ADMIT, -1, false), 0);
    fake_answer_task(h.fb, 0, TASK_OK, "running", NULL, NULL);
    ck_assert(harness_wait_ops(&h, FAKE_ADMIT, -1, 1, WAIT_S));
    ck_assert(tasks_held_running(&h.srv, "remote"));
    fake_answer_admit(h.fb, fake_find(h.fb, FAKE_ADMIT, -1, NULL, 0), -1, NAN, "timeout");
    ck_assert(harness_recv(&h, cl, &r, WAIT_S));
    ck_assert_str_eq(r.code, "backend_unavailable");
    /* A stopped one: the call is refused with the record's reason. */
    harness_call(&h, cl, 2, "gone");
    ck_assert(harness_wait_ops(&h, FAKE_TASK, BACKEND_TASK_GUARD, 2, WAIT_S));
    fake_answer_task(h.fb, fake_find(h.fb, FAKE_TASK, BACKEND_TASK_GUARD, "gone", 0),
                     TASK_E_STOPPED, "failed", "stopped", "no more");
    ck_assert(harness_recv(&h, cl, &r, WAIT_S));
    ck_assert_uint_eq(r.msgid, 2);
    ck_assert_str_eq(r.code, "task_stopped");
    ck_assert_str_eq(r.reason, "no more");
    ck_assert_uint_eq(h.srv.stats.in_flight, 0);
    harness_stop(&h);
}
END_TEST

START_TEST(test_tasks__client_gone_before_the_answer)
{
    struct harness h;

    harness_start(&h, NULL);
    int cl = harness_connect(&h);
    harness_finish(&h, cl, 1, "t1", true);
    ck_assert(harness_wait_ops(&h, FAKE_TASK, BACKEND_TASK_FINISH, 1, WAIT_S));
    ck_assert(h.fb->ops[0].ok);
    close(h.fds[cl]);
    h.fds[cl] = -1;
    harness_run(&h, 0.02);
    ck_assert_uint_eq(h.srv.stats.in_flight, 0);
    /* The late answer only frees the request (ASan checks it). */
    fake_answer_task(h.fb, 0, TASK_OK, "succeeded", NULL, NULL);
    harness_stop(&h);
}
END_TEST

Suite *tasks_suite(void)
{
    Suite *s = suite_create("tasks");
    TCase *tc = tcase_create("fake_backend");

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_tasks__answer_waits_for_the_record);
    tcase_add_test(tc, test_tasks__stop_answers_then_ends_the_calls);
    tcase_add_test(tc, test_tasks__backend_unavailable);
    tcase_add_test(tc, test_tasks__stop_sent_during_a_gap_is_refused);
    tcase_add_test(tc, test_tasks__stop_during_a_gap_is_found_by_the_resync);
    tcase_add_test(tc, test_tasks__resync_is_paced);
    tcase_add_test(tc, test_tasks__resync_read_failed_asks_again);
    tcase_add_test(tc, test_tasks__watchdog_verdict_retried);
    tcase_add_test(tc, test_tasks__ended_elsewhere);
    tcase_add_test(tc, test_tasks__call_naming_a_task_not_held);
    tcase_add_test(tc, test_tasks__client_gone_before_the_answer);
    suite_add_tcase(s, tc);
    return s;
}
