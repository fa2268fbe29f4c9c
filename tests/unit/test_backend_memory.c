/* test_backend_memory.c — the memory backend (sidecar/backend/backend_memory.c)
 * against the table's contract: every operation answers at once (returns
 * 1, never runs its callback), admission has no lease, the task record is
 * the registry it was given, and the refusals the wire rules need come
 * from it (a stopped task cannot be started again). */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/respids.h"
#include "suites.h"
#include "task.h"

struct mem_fixture {
    struct ev_loop *loop;
    struct task_reg *reg;
    struct backend *be;
};

static void fixture_init(struct mem_fixture *f)
{
    struct task_config tc;
    char err[128];

    task_config_defaults(&tc);
    tc.max_tasks = 4;
    f->loop = ev_loop_new(EVFLAG_AUTO);
    f->reg = task_reg_new(&tc, NULL, err, sizeof(err));
    ck_assert_ptr_nonnull(f->reg);
    f->be = backend_memory_new(f->loop, f->reg);
    ck_assert_ptr_nonnull(f->be);
    ck_assert_str_eq(f->be->ops->name, "memory");
}

static void fixture_fini(struct mem_fixture *f)
{
    backend_free(f->be);
    task_reg_free(f->reg, ev_now(f->loop));
    ev_loop_destroy(f->loop);
}

static void never_cb(void *ud, const struct backend_task *bt)
{
    (void)ud;
    (void)bt;
    ck_abort_msg("the memory backend answered through its callback");
}

static void never_admit_cb(void *ud, int rc, struct backend_lease *lease, double retry_at,
                           const char *why)
{
    (void)ud;
    (void)rc;
    (void)lease;
    (void)retry_at;
    (void)why;
    ck_abort_msg("the memory backend answered an admission through its callback");
}

/* Runs `op` and checks it answered at once. */
static struct backend_task op(struct mem_fixture *f, enum backend_task_op o, const char *id,
                              const char *reason, bool ok)
{
    struct backend_task bt;
    ck_assert_int_eq(backend_task(f->be, o, id, reason, ok, NULL, false, 0, &bt, never_cb, NULL),
                     1);
    return bt;
}

START_TEST(test_backend_memory__admits_at_once_without_a_lease)
{
    struct mem_fixture f;
    struct backend_lease *lease = (struct backend_lease *)&f;
    struct backend_admit *pending = (struct backend_admit *)&f;

    fixture_init(&f);
    ck_assert_int_eq(backend_admit(f.be, 0, 0, 100, 0, &lease, never_admit_cb, NULL, &pending), 1);
    ck_assert_ptr_null(lease);
    ck_assert_ptr_null(pending);
    ck_assert_ptr_null(f.be->ops->progress(f.be)); /* the core's own store */
    ck_assert(!f.be->ops->is_closing(f.be));
    fixture_fini(&f);
}
END_TEST

START_TEST(test_backend_memory__the_record_is_the_registry)
{
    struct mem_fixture f;
    struct backend_task bt;

    fixture_init(&f);
    bt = op(&f, BACKEND_TASK_GET, "t", NULL, false);
    ck_assert_int_eq(bt.rc, TASK_E_NOT_FOUND);
    ck_assert(!bt.exists);
    bt = op(&f, BACKEND_TASK_START, "t", NULL, false);
    ck_assert_int_eq(bt.rc, TASK_OK);
    ck_assert_str_eq(bt.state, "running");
    ck_assert_uint_eq(bt.runs, 1);
    ck_assert_ptr_nonnull(task_get(f.reg, "t"));
    /* Started twice: refused, the record described (start is idempotent
     * on the wire). */
    bt = op(&f, BACKEND_TASK_START, "t", NULL, false);
    ck_assert_int_eq(bt.rc, TASK_E_RUNNING);
    ck_assert(bt.exists);
    bt = op(&f, BACKEND_TASK_GUARD, "t", NULL, false);
    ck_assert_int_eq(bt.rc, TASK_OK);
    ck_assert_uint_eq(task_get(f.reg, "t")->guards, 0); /* the caller records activity */
    bt = op(&f, BACKEND_TASK_STOP, "t", "enough", false);
    ck_assert_int_eq(bt.rc, TASK_OK);
    ck_assert_str_eq(bt.state, "failed");
    ck_assert_str_eq(bt.kind, "stopped");
    ck_assert_str_eq(bt.reason, "enough");
    ck_assert_int_eq(task_get(f.reg, "t")->state, TASK_FAILED);
    ck_assert(bt.updated_at_s >= bt.started_at_s);
    fixture_fini(&f);
}
END_TEST

START_TEST(test_backend_memory__refusals)
{
    struct mem_fixture f;
    struct backend_task bt;

    fixture_init(&f);
    op(&f, BACKEND_TASK_START, "t", NULL, false);
    op(&f, BACKEND_TASK_STOP, "t", "first", false);
    /* A stop must not be undone by a worker that did not notice it. */
    bt = op(&f, BACKEND_TASK_START, "t", NULL, false);
    ck_assert_int_eq(bt.rc, TASK_E_STOPPED);
    ck_assert_str_eq(bt.reason, "first");
    bt = op(&f, BACKEND_TASK_STOP, "t", "second", false);
    ck_assert_int_eq(bt.rc, TASK_E_STOPPED);
    ck_assert_str_eq(bt.reason, "first");
    bt = op(&f, BACKEND_TASK_GUARD, "t", NULL, false);
    ck_assert_int_eq(bt.rc, TASK_E_STOPPED);
    /* A finished one may run again. */
    op(&f, BACKEND_TASK_START, "u", NULL, false);
    bt = op(&f, BACKEND_TASK_FINISH, "u", "done", true);
    ck_assert_int_eq(bt.rc, TASK_OK);
    ck_assert_str_eq(bt.state, "succeeded");
    ck_assert_str_eq(bt.kind, "");
    bt = op(&f, BACKEND_TASK_GUARD, "u", NULL, false);
    ck_assert_int_eq(bt.rc, TASK_E_FINISHED);
    bt = op(&f, BACKEND_TASK_START, "u", NULL, false);
    ck_assert_int_eq(bt.rc, TASK_OK);
    ck_assert_uint_eq(bt.runs, 2);
    /* Full: no record to describe. */
    op(&f, BACKEND_TASK_START, "v", NULL, false);
    op(&f, BACKEND_TASK_START, "w", NULL, false);
    bt = op(&f, BACKEND_TASK_START, "x", NULL, false);
    ck_assert_int_eq(bt.rc, TASK_E_FULL);
    ck_assert(!bt.exists);
    fixture_fini(&f);
}
END_TEST

START_TEST(test_backend_memory__watchdog_verdict_is_recorded_already)
{
    struct mem_fixture f;
    struct backend_task bt;
    struct task *t;

    fixture_init(&f);
    double now = ev_now(f.loop);
    op(&f, BACKEND_TASK_START, "t", NULL, false);
    ck_assert_int_eq(task_node_begin(f.reg, "t", "n", 0.5, now, &t), TASK_OK);
    task_on_timer(f.reg, now + 1);
    bt = op(&f, BACKEND_TASK_WATCHDOG, "t", task_reason(t), false);
    ck_assert_int_eq(bt.rc, TASK_OK);
    ck_assert_str_eq(bt.state, "failed");
    ck_assert_str_eq(bt.kind, "watchdog");
    ck_assert_ptr_nonnull(strstr(bt.reason, "node n"));
    fixture_fini(&f);
}
END_TEST

/* Response ids: known until their TTL, by the clock given. */
START_TEST(test_backend_memory__response_ids_expire)
{
    struct respids *r = respids_new();

    ck_assert_int_eq(respids_put(r, "resp_a", "east", 10, 100, 1000), 0);
    ck_assert_str_eq(respids_get(r, "resp_a", 1009.9), "east");
    ck_assert_ptr_null(respids_get(r, "resp_a", 1010));
    ck_assert_ptr_null(respids_get(r, "resp_b", 1000));
    /* Written again: the new source and a new TTL. */
    ck_assert_int_eq(respids_put(r, "resp_a", "west", 10, 100, 1005), 0);
    ck_assert_str_eq(respids_get(r, "resp_a", 1014), "west");
    ck_assert_uint_eq(respids_count(r), 1);
    /* An expired entry is dropped by the next write. */
    ck_assert_int_eq(respids_put(r, "resp_c", "east", 10, 100, 1020), 0);
    ck_assert_uint_eq(respids_count(r), 1);
    respids_free(r);
}
END_TEST

/* At most `max` entries: the oldest go first; ids too long are not kept. */
START_TEST(test_backend_memory__response_ids_are_bounded)
{
    struct respids *r = respids_new();
    char id[32], longid[RESPIDS_ID_MAX + 2];

    for (int i = 0; i < 1000; i++) {
        snprintf(id, sizeof(id), "resp_%d", i);
        ck_assert_int_eq(respids_put(r, id, i % 2 ? "odd" : "even", 60, 100, 0), 0);
    }
    ck_assert_uint_eq(respids_count(r), 100);
    ck_assert_ptr_null(respids_get(r, "resp_899", 1));
    ck_assert_str_eq(respids_get(r, "resp_900", 1), "even");
    ck_assert_str_eq(respids_get(r, "resp_999", 1), "odd");
    memset(longid, 'x', sizeof(longid) - 1);
    longid[sizeof(longid) - 1] = '\0';
    ck_assert_int_eq(respids_put(r, longid, "odd", 60, 100, 0), 0);
    ck_assert_ptr_null(respids_get(r, longid, 1));
    ck_assert_str_eq(respids_get(r, "resp_900", 1), "even");
    respids_free(r);
}
END_TEST

/* Through the table: remembered, then recalled at once. */
START_TEST(test_backend_memory__recalls_responses_at_once)
{
    struct mem_fixture f;
    char src[RESPIDS_SOURCE_MAX + 1];

    fixture_init(&f);
    ck_assert_int_eq(backend_recall_response(f.be, "resp_1", src, sizeof(src), NULL, NULL), 1);
    ck_assert_str_eq(src, "");
    backend_remember_response(f.be, "resp_1", "east", 60, 10);
    ck_assert_int_eq(backend_recall_response(f.be, "resp_1", src, sizeof(src), NULL, NULL), 1);
    ck_assert_str_eq(src, "east");
    fixture_fini(&f);
}
END_TEST

Suite *backend_memory_suite(void)
{
    Suite *s = suite_create("backend_memory");
    TCase *tc = tcase_create("contract");

    tcase_add_test(tc, test_backend_memory__admits_at_once_without_a_lease);
    tcase_add_test(tc, test_backend_memory__the_record_is_the_registry);
    tcase_add_test(tc, test_backend_memory__refusals);
    tcase_add_test(tc, test_backend_memory__watchdog_verdict_is_recorded_already);
    tcase_add_test(tc, test_backend_memory__response_ids_expire);
    tcase_add_test(tc, test_backend_memory__response_ids_are_bounded);
    tcase_add_test(tc, test_backend_memory__recalls_responses_at_once);
    suite_add_tcase(s, tc);
    return s;
}
