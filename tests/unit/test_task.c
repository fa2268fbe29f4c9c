/* test_task.c — the task registry of docs/DESIGN.md §3.5 / issue 5: cooperative
 * stop, guards, node deadlines, the watchdog, TTL expiry and the memory
 * bounds. Time is a plain `double` advanced by hand; hooks are recorded
 * into a `struct rec` so every event can be asserted. */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "suites.h"
#include "task.h"

#define EPS 1e-9

#define ck_assert_near(x, want)                                               \
    do {                                                                      \
        double x_ = (x), w_ = (want);                                         \
        ck_assert_msg(x_ == w_ || fabs(x_ - w_) <= EPS * fmax(1.0, fabs(w_)), \
                      "%s = %.12g, want %.12g", #x, x_, w_);                  \
    } while (0)

#define REC_MAX 64

/* Everything the hooks saw. */
struct rec {
    int states, watchdogs, after_stops, frees;
    enum task_state from[REC_MAX], to[REC_MAX];
    char watchdog_ids[REC_MAX][32];
    char watchdog_node[64]; /* t->node as the hook saw it */
    char watchdog_reason[128];
    double watchdog_now;
    char after_stop_reason[128];
    char free_ids[REC_MAX][32];
    int busy_seen; /* mutating calls refused inside hooks */
    int get_ok;    /* reads that worked inside hooks */
    bool try_mutate;
    struct task_reg *reg;
};

static void on_state(const struct task *t, enum task_state from, double now, void *ud)
{
    struct rec *r = ud;
    (void)now;
    if (r->states < REC_MAX) {
        r->from[r->states] = from;
        r->to[r->states] = t->state;
    }
    r->states++;
}

static void on_watchdog(struct task *t, double now, void *ud)
{
    struct rec *r = ud;
    if (r->watchdogs < REC_MAX)
        snprintf(r->watchdog_ids[r->watchdogs], sizeof(r->watchdog_ids[0]), "%s", t->id);
    r->watchdogs++;
    snprintf(r->watchdog_node, sizeof(r->watchdog_node), "%s", t->node ? t->node : "(none)");
    snprintf(r->watchdog_reason, sizeof(r->watchdog_reason), "%s", task_reason(t));
    r->watchdog_now = now;
    if (r->try_mutate && r->reg) {
        if (task_stop(r->reg, t->id, "x", now, NULL) == TASK_E_BUSY)
            r->busy_seen++;
        if (task_start(r->reg, "other", now, NULL) == TASK_E_BUSY)
            r->busy_seen++;
        if (task_on_timer(r->reg, now) == TASK_E_BUSY)
            r->busy_seen++;
        if (task_get(r->reg, t->id) == t)
            r->get_ok++;
    }
}

static void on_after_stop(struct task *t, double now, void *ud)
{
    struct rec *r = ud;
    (void)now;
    r->after_stops++;
    snprintf(r->after_stop_reason, sizeof(r->after_stop_reason), "%s", task_reason(t));
}

static void on_free(struct task *t, double now, void *ud)
{
    struct rec *r = ud;
    (void)now;
    if (r->frees < REC_MAX)
        snprintf(r->free_ids[r->frees], sizeof(r->free_ids[0]), "%s", t->id);
    r->frees++;
    /* The owner's slot is still readable here, right before the free. */
    if (t->ud)
        (*(int *)t->ud)++;
}

static struct task_reg *mkreg_cfg(struct rec *rec, const struct task_config *cfg)
{
    struct task_hooks h = { on_state, on_watchdog, on_after_stop, on_free, rec };
    char err[128] = "";
    struct task_reg *r;

    memset(rec, 0, sizeof(*rec));
    r = task_reg_new(cfg, &h, err, sizeof(err));
    ck_assert_msg(r != NULL, "task_reg_new: %s", err);
    rec->reg = r;
    return r;
}

/* ttl 1000 s, node_timeout_s 600, floor 1 s. */
static struct task_reg *mkreg(struct rec *rec)
{
    struct task_config cfg;
    task_config_defaults(&cfg);
    cfg.ttl_s = 1000;
    return mkreg_cfg(rec, &cfg);
}

/* One normal node run of `d` seconds on a running task, starting at *now. */
static void run_node(struct task_reg *r, const char *id, const char *node, double d, double *now)
{
    ck_assert_int_eq(task_node_begin(r, id, node, 0, *now, NULL), TASK_OK);
    *now += d;
    ck_assert_int_eq(task_node_end(r, id, node, *now, NULL), TASK_OK);
}

/* ===================================================================== */
/* Registry set-up                                                       */
/* ===================================================================== */

START_TEST(test_task__config_validation)
{
    struct task_config cfg;
    char err[128];

    task_config_defaults(&cfg);
    ck_assert_uint_eq(cfg.max_tasks, 65536);
    ck_assert_near(cfg.node_timeout_s, 600);
    struct task_reg *r = task_reg_new(&cfg, NULL, err, sizeof(err));
    ck_assert_ptr_nonnull(r);
    ck_assert_near(task_next_deadline(r, 0), INFINITY);
    task_reg_free(r, 0);
    task_reg_free(NULL, 0);

#define BAD(stmt, word)                                                             \
    do {                                                                            \
        task_config_defaults(&cfg);                                                 \
        stmt;                                                                       \
        err[0] = '\0';                                                              \
        ck_assert_ptr_null(task_reg_new(&cfg, NULL, err, sizeof(err)));             \
        ck_assert_msg(strstr(err, word) != NULL, "err '%s' lacks '%s'", err, word); \
    } while (0)
    BAD(cfg.max_tasks = 0, "max_tasks");
    BAD(cfg.ttl_s = 0, "ttl_s");
    BAD(cfg.ttl_s = INFINITY, "ttl_s");
    BAD(cfg.ttl_s = NAN, "ttl_s");
    BAD(cfg.node_timeout_s = -1, "node_timeout_s");
    BAD(cfg.learned_floor_s = -1, "learned_floor_s");
    BAD(cfg.max_node_names = 0, "max_node_names");
    BAD(cfg.hash_buckets = 3, "hash_buckets");
#undef BAD
}
END_TEST

START_TEST(test_task__names)
{
    ck_assert_str_eq(task_err_name(TASK_E_NOT_FOUND), "not_found");
    ck_assert_str_eq(task_err_name(TASK_E_RUNNING), "already_running");
    ck_assert_str_eq(task_err_name(TASK_E_STOPPED), "stopped");
    ck_assert_str_eq(task_err_name(TASK_E_WATCHDOG), "watchdog");
    ck_assert_str_eq(task_err_name(TASK_E_FULL), "full");
    ck_assert_str_eq(task_err_name(-99), "unknown");
    ck_assert_str_eq(task_state_name(TASK_RUNNING), "running");
    ck_assert_str_eq(task_state_name(TASK_SUCCEEDED), "succeeded");
    ck_assert_str_eq(task_state_name(TASK_FAILED), "failed");
    ck_assert_str_eq(task_reason_kind_name(TASK_STOPPED), "stopped");
    ck_assert_str_eq(task_reason_kind_name(TASK_WATCHDOG), "watchdog");
    ck_assert_str_eq(task_reason_kind_name(TASK_ERROR), "error");
    ck_assert_str_eq(task_timeout_src_name(TASK_TIMEOUT_LEARNED), "learned");
}
END_TEST

/* ===================================================================== */
/* start                                                                 */
/* ===================================================================== */

START_TEST(test_task__start_creates_running)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *t = NULL;

    ck_assert_int_eq(task_start(r, "job-1", 10, &t), TASK_OK);
    ck_assert_ptr_nonnull(t);
    ck_assert_str_eq(t->id, "job-1");
    ck_assert_int_eq(t->state, TASK_RUNNING);
    ck_assert_int_eq(t->reason_kind, TASK_REASON_NONE);
    ck_assert_str_eq(task_reason(t), "");
    ck_assert_near(t->started_at, 10);
    ck_assert_near(t->ended_at, 0);
    ck_assert_ptr_null(t->node);
    ck_assert_uint_eq(t->runs, 1);
    ck_assert_ptr_eq(task_get(r, "job-1"), t);
    ck_assert_ptr_null(task_get(r, "job-2"));
    ck_assert_int_eq(rec.states, 1);
    ck_assert_int_eq(rec.from[0], TASK_NEW);
    ck_assert_int_eq(rec.to[0], TASK_RUNNING);
    const struct task_stats *st = task_reg_stats(r);
    ck_assert_uint_eq(st->tasks, 1);
    ck_assert_uint_eq(st->running, 1);
    ck_assert_uint_eq(st->started, 1);
    /* A running task with no node idles out after ttl_s. */
    ck_assert_near(task_next_deadline(r, 10), 1010);
    task_reg_free(r, 20);
    ck_assert_int_eq(rec.frees, 1);
}
END_TEST

START_TEST(test_task__invalid_ids_and_nodes)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    char id128[TASK_ID_MAX + 1], id129[TASK_ID_MAX + 2];
    struct task *t = (struct task *)&rec; /* must be reset to NULL */

    memset(id128, 'a', TASK_ID_MAX);
    id128[TASK_ID_MAX] = '\0';
    memset(id129, 'b', TASK_ID_MAX + 1);
    id129[TASK_ID_MAX + 1] = '\0';
    ck_assert_int_eq(task_start(r, NULL, 0, &t), TASK_E_INVALID);
    ck_assert_ptr_null(t);
    ck_assert_int_eq(task_start(r, "", 0, NULL), TASK_E_INVALID);
    ck_assert_int_eq(task_start(r, id129, 0, NULL), TASK_E_INVALID);
    ck_assert_int_eq(task_stop(r, id129, "x", 0, NULL), TASK_E_INVALID);
    ck_assert_int_eq(task_guard(r, "", 0, NULL), TASK_E_INVALID);
    ck_assert_ptr_null(task_get(r, id129));
    ck_assert_int_eq(task_start(r, id128, 0, &t), TASK_OK);
    ck_assert_uint_eq(strlen(t->id), TASK_ID_MAX);

    char node129[TASK_NODE_MAX + 2];
    memset(node129, 'n', TASK_NODE_MAX + 1);
    node129[TASK_NODE_MAX + 1] = '\0';
    ck_assert_int_eq(task_node_begin(r, id128, NULL, 5, 0, NULL), TASK_E_INVALID);
    ck_assert_int_eq(task_node_begin(r, id128, "", 5, 0, NULL), TASK_E_INVALID);
    ck_assert_int_eq(task_node_begin(r, id128, node129, 5, 0, NULL), TASK_E_INVALID);
    ck_assert_int_eq(task_node_begin(r, id128, "n", NAN, 0, NULL), TASK_E_INVALID);
    ck_assert_int_eq(task_node_begin(r, id128, "n", INFINITY, 0, NULL), TASK_E_INVALID);
    ck_assert_int_eq(task_node_begin(r, id128, "n", DBL_MAX, DBL_MAX / 2, NULL), TASK_E_INVALID);
    ck_assert_ptr_null(t->node);
    ck_assert_int_eq(task_node_begin(r, id128, "n", 5, 0, NULL), TASK_OK);
    ck_assert_int_eq(task_node_end(r, id128, "", 1, NULL), TASK_E_INVALID);
    ck_assert_ptr_nonnull(t->node);
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__start_running_is_refused)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *t, *t2 = NULL;

    ck_assert_int_eq(task_start(r, "job", 10, &t), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "job", "n", 50, 11, NULL), TASK_OK);
    ck_assert_int_eq(task_start(r, "job", 20, &t2), TASK_E_RUNNING);
    ck_assert_ptr_eq(t2, t);
    /* Nothing changed. */
    ck_assert_near(t->started_at, 10);
    ck_assert_str_eq(t->node, "n");
    ck_assert_uint_eq(t->runs, 1);
    ck_assert_int_eq(rec.states, 1);
    ck_assert_uint_eq(task_reg_stats(r)->started, 1);
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__restart_after_finish_is_a_new_run)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *t, *t2;
    int owner = 0;

    ck_assert_int_eq(task_start(r, "job", 10, &t), TASK_OK);
    t->ud = &owner;
    ck_assert_int_eq(task_node_begin(r, "job", "n", 50, 11, NULL), TASK_OK);
    ck_assert_int_eq(task_stop(r, "job", "user pressed stop", 12, NULL), TASK_OK);
    ck_assert_int_eq(task_start(r, "job", 20, &t2), TASK_OK);
    ck_assert_ptr_eq(t2, t); /* same record, same owner slot */
    ck_assert_ptr_eq(t->ud, &owner);
    ck_assert_int_eq(t->state, TASK_RUNNING);
    ck_assert_int_eq(t->reason_kind, TASK_REASON_NONE);
    ck_assert_ptr_null(t->reason);
    ck_assert_near(t->started_at, 20);
    ck_assert_near(t->ended_at, 0);
    ck_assert_ptr_null(t->node); /* the stopped run's node is dropped */
    ck_assert_uint_eq(t->runs, 2);
    const struct task_stats *st = task_reg_stats(r);
    ck_assert_uint_eq(st->restarted, 1);
    ck_assert_uint_eq(st->running, 1);
    ck_assert_uint_eq(st->failed[TASK_STOPPED], 0);
    ck_assert_uint_eq(st->failed_total[TASK_STOPPED], 1);
    ck_assert_uint_eq(st->nodes_abandoned, 1);
    /* The dropped node never fires. */
    ck_assert_int_eq(task_on_timer(r, 61), 0);
    ck_assert_int_eq(rec.after_stops, 0);
    ck_assert_int_eq(rec.states, 3);
    ck_assert_int_eq(rec.from[2], TASK_FAILED);
    ck_assert_int_eq(rec.to[2], TASK_RUNNING);
    /* Succeeded tasks restart too. */
    ck_assert_int_eq(task_finish(r, "job", true, NULL, 30, NULL), TASK_OK);
    ck_assert_int_eq(task_start(r, "job", 31, NULL), TASK_OK);
    ck_assert_uint_eq(t->runs, 3);
    task_reg_free(r, 40);
    ck_assert_int_eq(owner, 1);
}
END_TEST

/* ===================================================================== */
/* stop                                                                  */
/* ===================================================================== */

START_TEST(test_task__stop_marks_failed_stopped)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *t, *out = NULL;

    ck_assert_int_eq(task_start(r, "job", 10, &t), TASK_OK);
    ck_assert_int_eq(task_stop(r, "job", "user pressed stop", 15, &out), TASK_OK);
    ck_assert_ptr_eq(out, t);
    ck_assert_int_eq(t->state, TASK_FAILED);
    ck_assert_int_eq(t->reason_kind, TASK_STOPPED);
    ck_assert_str_eq(task_reason(t), "user pressed stop");
    ck_assert_near(t->ended_at, 15);
    ck_assert_int_eq(rec.to[1], TASK_FAILED);
    const struct task_stats *st = task_reg_stats(r);
    ck_assert_uint_eq(st->running, 0);
    ck_assert_uint_eq(st->failed[TASK_STOPPED], 1);
    ck_assert_uint_eq(st->failed_total[TASK_STOPPED], 1);
    /* A finished task expires ttl_s after it ended. */
    ck_assert_near(task_next_deadline(r, 15), 1015);

    /* No reason: a default one, so clients always have text to show. */
    ck_assert_int_eq(task_start(r, "b", 10, &t), TASK_OK);
    ck_assert_int_eq(task_stop(r, "b", NULL, 11, NULL), TASK_OK);
    ck_assert_str_eq(task_reason(t), "stopped");
    ck_assert_int_eq(task_start(r, "c", 10, &t), TASK_OK);
    ck_assert_int_eq(task_stop(r, "c", "", 11, NULL), TASK_OK);
    ck_assert_str_eq(task_reason(t), "stopped");
    task_reg_free(r, 20);
}
END_TEST

START_TEST(test_task__stop_unknown_is_not_found)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *out = (struct task *)&rec;

    ck_assert_int_eq(task_stop(r, "ghost", "why", 1, &out), TASK_E_NOT_FOUND);
    ck_assert_ptr_null(out);
    ck_assert_uint_eq(task_reg_stats(r)->tasks, 0);
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__stop_twice_keeps_first_reason)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *t, *out = NULL;

    ck_assert_int_eq(task_start(r, "job", 10, &t), TASK_OK);
    ck_assert_int_eq(task_stop(r, "job", "first", 11, NULL), TASK_OK);
    ck_assert_int_eq(task_stop(r, "job", "second", 12, &out), TASK_E_STOPPED);
    ck_assert_ptr_eq(out, t);
    ck_assert_str_eq(task_reason(t), "first");
    ck_assert_near(t->ended_at, 11);
    ck_assert_uint_eq(task_reg_stats(r)->failed_total[TASK_STOPPED], 1);
    ck_assert_int_eq(rec.states, 2);
    task_reg_free(r, 20);
}
END_TEST

START_TEST(test_task__stop_finished_reports_its_state)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *out = NULL;

    ck_assert_int_eq(task_start(r, "ok", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_finish(r, "ok", true, NULL, 1, NULL), TASK_OK);
    ck_assert_int_eq(task_stop(r, "ok", "late", 2, &out), TASK_E_FINISHED);
    ck_assert_int_eq(out->state, TASK_SUCCEEDED);
    ck_assert_ptr_null(out->reason);

    ck_assert_int_eq(task_start(r, "err", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_finish(r, "err", false, "boom", 1, NULL), TASK_OK);
    ck_assert_int_eq(task_stop(r, "err", "late", 2, &out), TASK_E_FINISHED);
    ck_assert_int_eq(out->state, TASK_FAILED);
    ck_assert_int_eq(out->reason_kind, TASK_ERROR);
    ck_assert_str_eq(task_reason(out), "boom");

    ck_assert_int_eq(task_start(r, "wd", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "wd", "n", 5, 0, NULL), TASK_OK);
    ck_assert_int_eq(task_on_timer(r, 5), 1);
    ck_assert_int_eq(task_stop(r, "wd", "late", 6, &out), TASK_E_WATCHDOG);
    ck_assert_int_eq(out->reason_kind, TASK_WATCHDOG);
    ck_assert_str_eq(task_reason(out), "node n exceeded 5s");
    task_reg_free(r, 10);
}
END_TEST

START_TEST(test_task__reason_is_bounded_at_utf8_boundary)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    char reason[1 + 2 * 300 + 1];
    struct task *t;

    /* "a" then 300 × "é" (C3 A9): byte 512 is a continuation byte, so the
     * cut backs up to 511 and keeps whole characters only. */
    reason[0] = 'a';
    for (int i = 0; i < 300; i++) {
        reason[1 + 2 * i] = (char)0xC3;
        reason[2 + 2 * i] = (char)0xA9;
    }
    reason[sizeof(reason) - 1] = '\0';
    ck_assert_int_eq(task_start(r, "job", 0, &t), TASK_OK);
    ck_assert_int_eq(task_stop(r, "job", reason, 1, NULL), TASK_OK);
    ck_assert_uint_eq(strlen(t->reason), 511);
    ck_assert_int_eq((unsigned char)t->reason[510], 0xA9);
    ck_assert_int_eq(memcmp(t->reason, reason, 511), 0);

    /* ASCII: exactly TASK_REASON_MAX bytes kept. */
    char longr[700];
    memset(longr, 'x', sizeof(longr) - 1);
    longr[sizeof(longr) - 1] = '\0';
    ck_assert_int_eq(task_start(r, "job2", 0, &t), TASK_OK);
    ck_assert_int_eq(task_finish(r, "job2", false, longr, 1, NULL), TASK_OK);
    ck_assert_uint_eq(strlen(t->reason), TASK_REASON_MAX);
    task_reg_free(r, 2);
}
END_TEST

/* ===================================================================== */
/* guard                                                                 */
/* ===================================================================== */

START_TEST(test_task__guard_running_ok_and_records_activity)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *t, *out = NULL;

    ck_assert_int_eq(task_start(r, "job", 10, &t), TASK_OK);
    ck_assert_int_eq(task_guard(r, "job", 500, &out), TASK_OK);
    ck_assert_ptr_eq(out, t);
    ck_assert_uint_eq(t->guards, 1);
    ck_assert_near(t->last_active_at, 500);
    ck_assert_near(task_next_deadline(r, 500), 1500);
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__guard_after_stop_fails_with_reason)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *out = NULL;

    ck_assert_int_eq(task_start(r, "job", 10, NULL), TASK_OK);
    ck_assert_int_eq(task_stop(r, "job", "operator: budget exceeded", 11, NULL), TASK_OK);
    ck_assert_int_eq(task_guard(r, "job", 12, &out), TASK_E_STOPPED);
    ck_assert_ptr_nonnull(out);
    ck_assert_str_eq(task_reason(out), "operator: budget exceeded");
    ck_assert_uint_eq(out->guards, 0);
    task_reg_free(r, 20);
}
END_TEST

START_TEST(test_task__guard_other_states)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *out = NULL;

    ck_assert_int_eq(task_guard(r, "ghost", 1, &out), TASK_E_NOT_FOUND);
    ck_assert_ptr_null(out);
    ck_assert_int_eq(task_start(r, "wd", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "wd", "plan", 7, 0, NULL), TASK_OK);
    ck_assert_int_eq(task_on_timer(r, 7), 1);
    ck_assert_int_eq(task_guard(r, "wd", 8, &out), TASK_E_WATCHDOG);
    ck_assert_str_eq(task_reason(out), "node plan exceeded 7s");
    ck_assert_int_eq(task_start(r, "done", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_finish(r, "done", true, NULL, 1, NULL), TASK_OK);
    ck_assert_int_eq(task_guard(r, "done", 2, &out), TASK_E_FINISHED);
    ck_assert_int_eq(out->state, TASK_SUCCEEDED);
    ck_assert_int_eq(task_start(r, "err", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_finish(r, "err", false, NULL, 1, NULL), TASK_OK);
    ck_assert_int_eq(task_guard(r, "err", 2, &out), TASK_E_FINISHED);
    ck_assert_str_eq(task_reason(out), "error");
    task_reg_free(r, 10);
}
END_TEST

/* ===================================================================== */
/* nodes                                                                 */
/* ===================================================================== */

START_TEST(test_task__node_begin_explicit_deadline)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *t;

    ck_assert_int_eq(task_start(r, "job", 0, &t), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "job", "skeleton", 30, 100, NULL), TASK_OK);
    ck_assert_str_eq(t->node, "skeleton");
    ck_assert_near(t->node_begun_at, 100);
    ck_assert_near(t->node_deadline, 130);
    ck_assert_near(t->node_timeout_s, 30);
    ck_assert_int_eq(t->node_timeout_src, TASK_TIMEOUT_EXPLICIT);
    ck_assert_near(t->last_active_at, 100);
    /* Inside a node, the node deadline is the next thing to do (no idle
     * expiry while a node runs). */
    ck_assert_near(task_next_deadline(r, 100), 130);
    ck_assert_uint_eq(task_reg_stats(r)->nodes_begun, 1);
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__node_begin_default_before_enough_samples)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *t;
    enum task_timeout_src src;

    ck_assert_near(task_node_timeout_s(r, "fresh", &src), 600);
    ck_assert_int_eq(src, TASK_TIMEOUT_DEFAULT);
    ck_assert_int_eq(task_start(r, "job", 0, &t), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "job", "fresh", 0, 10, NULL), TASK_OK);
    ck_assert_near(t->node_deadline, 610);
    ck_assert_int_eq(t->node_timeout_src, TASK_TIMEOUT_DEFAULT);
    /* A negative timeout also means "learned or default". */
    ck_assert_int_eq(task_node_begin(r, "job", "fresh", -1, 20, NULL), TASK_OK);
    ck_assert_near(t->node_deadline, 620);
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__node_begin_needs_running_task)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *t;

    ck_assert_int_eq(task_node_begin(r, "ghost", "n", 5, 0, NULL), TASK_E_NOT_FOUND);
    ck_assert_int_eq(task_start(r, "job", 0, &t), TASK_OK);
    ck_assert_int_eq(task_stop(r, "job", "no", 1, NULL), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "job", "n", 5, 2, NULL), TASK_E_STOPPED);
    ck_assert_ptr_null(t->node);
    ck_assert_uint_eq(task_reg_stats(r)->nodes_begun, 0);
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__node_end_records_sample_and_disarms)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *t;

    ck_assert_int_eq(task_start(r, "job", 0, &t), TASK_OK);
    ck_assert_int_eq(task_node_end(r, "job", NULL, 1, NULL), TASK_E_NO_NODE);
    ck_assert_int_eq(task_node_end(r, "job", "a", 1, NULL), TASK_E_NO_NODE);
    ck_assert_int_eq(task_node_begin(r, "job", "a", 30, 10, NULL), TASK_OK);
    ck_assert_int_eq(task_node_end(r, "job", "b", 12, NULL), TASK_E_NODE_MISMATCH);
    ck_assert_str_eq(t->node, "a");
    ck_assert_uint_eq(task_node_samples(r, "a"), 0);
    ck_assert_int_eq(task_node_end(r, "job", "a", 14, NULL), TASK_OK);
    ck_assert_ptr_null(t->node);
    ck_assert_uint_eq(task_node_samples(r, "a"), 1);
    ck_assert_uint_eq(t->nodes_ended, 1);
    ck_assert_near(t->last_active_at, 14);
    /* The deadline is gone: the next thing is the idle expiry. */
    ck_assert_near(task_next_deadline(r, 14), 1014);
    ck_assert_int_eq(task_on_timer(r, 40), 0);
    ck_assert_int_eq(t->state, TASK_RUNNING);
    /* NULL ends whichever node is current. */
    ck_assert_int_eq(task_node_begin(r, "job", "b", 30, 20, NULL), TASK_OK);
    ck_assert_int_eq(task_node_end(r, "job", NULL, 21, NULL), TASK_OK);
    ck_assert_uint_eq(task_node_samples(r, "b"), 1);
    ck_assert_uint_eq(task_reg_stats(r)->nodes_ended, 2);
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__node_end_after_stop_keeps_node_armed)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *t;

    ck_assert_int_eq(task_start(r, "job", 0, &t), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "job", "a", 30, 10, NULL), TASK_OK);
    ck_assert_int_eq(task_stop(r, "job", "enough", 12, NULL), TASK_OK);
    ck_assert_int_eq(task_node_end(r, "job", "a", 13, NULL), TASK_E_STOPPED);
    ck_assert_str_eq(t->node, "a");
    ck_assert_uint_eq(task_node_samples(r, "a"), 0);
    ck_assert_near(task_next_deadline(r, 13), 40);
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__node_begin_replaces_current)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *t;

    ck_assert_int_eq(task_start(r, "job", 0, &t), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "job", "a", 30, 10, NULL), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "job", "b", 5, 11, NULL), TASK_OK);
    ck_assert_str_eq(t->node, "b");
    ck_assert_near(task_next_deadline(r, 11), 16);
    ck_assert_uint_eq(task_reg_stats(r)->nodes_abandoned, 1);
    ck_assert_uint_eq(task_node_samples(r, "a"), 0);
    /* Nesting is not supported: the outer end finds no node. */
    ck_assert_int_eq(task_node_end(r, "job", "b", 12, NULL), TASK_OK);
    ck_assert_int_eq(task_node_end(r, "job", "a", 13, NULL), TASK_E_NO_NODE);
    task_reg_free(r, 0);
}
END_TEST

/* ===================================================================== */
/* watchdog                                                              */
/* ===================================================================== */

START_TEST(test_task__watchdog_fires_exactly_at_deadline)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *t, *out = NULL;

    ck_assert_int_eq(task_start(r, "job", 0, &t), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "job", "skeleton", 30, 100, NULL), TASK_OK);
    ck_assert_near(task_next_deadline(r, 100), 130);

    ck_assert_int_eq(task_on_timer(r, 129.999), 0);
    ck_assert_int_eq(t->state, TASK_RUNNING);
    ck_assert_int_eq(rec.watchdogs, 0);

    ck_assert_int_eq(task_on_timer(r, 130), 1);
    ck_assert_int_eq(rec.watchdogs, 1);
    ck_assert_str_eq(rec.watchdog_ids[0], "job");
    ck_assert_str_eq(rec.watchdog_node, "skeleton"); /* the hook sees the node */
    ck_assert_str_eq(rec.watchdog_reason, "node skeleton exceeded 30s");
    ck_assert_near(rec.watchdog_now, 130);
    ck_assert_int_eq(t->state, TASK_FAILED);
    ck_assert_int_eq(t->reason_kind, TASK_WATCHDOG);
    ck_assert_str_eq(task_reason(t), "node skeleton exceeded 30s");
    ck_assert_near(t->ended_at, 130);
    ck_assert_ptr_null(t->node); /* disarmed after the hook */
    ck_assert_int_eq(rec.after_stops, 0);
    const struct task_stats *st = task_reg_stats(r);
    ck_assert_uint_eq(st->failed_total[TASK_WATCHDOG], 1);
    ck_assert_uint_eq(st->failed[TASK_WATCHDOG], 1);
    ck_assert_uint_eq(st->watchdog_after_stop, 0);
    ck_assert_uint_eq(st->running, 0);

    /* Fires once; the task then waits for its TTL. */
    ck_assert_int_eq(task_on_timer(r, 131), 0);
    ck_assert_int_eq(rec.watchdogs, 1);
    ck_assert_near(task_next_deadline(r, 131), 1130);
    ck_assert_int_eq(task_guard(r, "job", 131, &out), TASK_E_WATCHDOG);
    ck_assert_str_eq(task_reason(out), "node skeleton exceeded 30s");
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__watchdog_late_timer_still_fires_once)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *t;

    ck_assert_int_eq(task_start(r, "job", 0, &t), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "job", "n", 2.5, 0, NULL), TASK_OK);
    /* The timer ran late: the verdict still lands, once, with the timeout
     * (not the lateness) in the message. */
    ck_assert_int_eq(task_on_timer(r, 9), 1);
    ck_assert_str_eq(task_reason(t), "node n exceeded 2.5s");
    ck_assert_near(t->ended_at, 9);
    ck_assert_int_eq(task_on_timer(r, 10), 0);
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__stop_then_deadline_counts_as_stopped)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *t;

    ck_assert_int_eq(task_start(r, "job", 0, &t), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "job", "skeleton", 30, 100, NULL), TASK_OK);
    ck_assert_int_eq(task_stop(r, "job", "user pressed stop", 110, NULL), TASK_OK);
    /* The node stays armed: its deadline is the next event. */
    ck_assert_near(task_next_deadline(r, 110), 130);
    ck_assert_int_eq(task_on_timer(r, 129), 0);
    ck_assert_int_eq(task_on_timer(r, 130), 1);
    ck_assert_int_eq(rec.watchdogs, 0);
    ck_assert_int_eq(rec.after_stops, 1);
    ck_assert_str_eq(rec.after_stop_reason, "user pressed stop");
    ck_assert_int_eq(t->state, TASK_FAILED);
    ck_assert_int_eq(t->reason_kind, TASK_STOPPED);
    ck_assert_str_eq(task_reason(t), "user pressed stop");
    ck_assert_near(t->ended_at, 110);
    ck_assert_ptr_null(t->node);
    const struct task_stats *st = task_reg_stats(r);
    ck_assert_uint_eq(st->watchdog_after_stop, 1);
    ck_assert_uint_eq(st->failed_total[TASK_WATCHDOG], 0);
    ck_assert_uint_eq(st->failed[TASK_STOPPED], 1);
    /* Then only the TTL is left, counted from the stop. */
    ck_assert_near(task_next_deadline(r, 130), 1110);
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__stopped_task_expiring_before_its_deadline)
{
    struct rec rec;
    struct task_config cfg;
    task_config_defaults(&cfg);
    cfg.ttl_s = 10;
    struct task_reg *r = mkreg_cfg(&rec, &cfg);

    ck_assert_int_eq(task_start(r, "job", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "job", "long", 100, 0, NULL), TASK_OK);
    ck_assert_int_eq(task_stop(r, "job", "x", 1, NULL), TASK_OK);
    ck_assert_near(task_next_deadline(r, 1), 11);
    ck_assert_int_eq(task_on_timer(r, 11), 1);
    ck_assert_int_eq(rec.frees, 1);
    ck_assert_uint_eq(task_reg_stats(r)->watchdog_after_stop, 0);
    ck_assert_near(task_next_deadline(r, 11), INFINITY);
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__finish_disarms_node)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *t;

    ck_assert_int_eq(task_start(r, "job", 0, &t), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "job", "n", 5, 0, NULL), TASK_OK);
    ck_assert_int_eq(task_finish(r, "job", true, NULL, 1, NULL), TASK_OK);
    ck_assert_ptr_null(t->node);
    ck_assert_int_eq(task_on_timer(r, 5), 0);
    ck_assert_int_eq(rec.watchdogs + rec.after_stops, 0);
    ck_assert_uint_eq(task_node_samples(r, "n"), 0);
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__deadlines_fire_in_order)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    const char *ids[] = { "t5", "t1", "t4", "t2", "t3" };
    const double to[] = { 5, 1, 4, 2, 3 };

    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(task_start(r, ids[i], 0, NULL), TASK_OK);
        ck_assert_int_eq(task_node_begin(r, ids[i], "n", to[i], 0, NULL), TASK_OK);
    }
    ck_assert_near(task_next_deadline(r, 0), 1);
    ck_assert_int_eq(task_on_timer(r, 3.5), 3);
    ck_assert_int_eq(rec.watchdogs, 3);
    ck_assert_str_eq(rec.watchdog_ids[0], "t1");
    ck_assert_str_eq(rec.watchdog_ids[1], "t2");
    ck_assert_str_eq(rec.watchdog_ids[2], "t3");
    ck_assert_near(task_next_deadline(r, 3.5), 4);
    /* Ending a node moves the task's wake-up from its deadline to its idle expiry. */
    ck_assert_int_eq(task_node_end(r, "t4", "n", 3.6, NULL), TASK_OK);
    ck_assert_near(task_next_deadline(r, 3.6), 5);
    ck_assert_int_eq(task_on_timer(r, 5), 1);
    ck_assert_str_eq(rec.watchdog_ids[3], "t5");
    ck_assert_int_eq(task_get(r, "t4")->state, TASK_RUNNING);
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__hooks_cannot_mutate)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);

    rec.try_mutate = true;
    ck_assert_int_eq(task_start(r, "job", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "job", "n", 1, 0, NULL), TASK_OK);
    ck_assert_int_eq(task_on_timer(r, 1), 1);
    ck_assert_int_eq(rec.watchdogs, 1);
    ck_assert_int_eq(rec.busy_seen, 3);
    ck_assert_int_eq(rec.get_ok, 1);
    ck_assert_ptr_null(task_get(r, "other"));
    ck_assert_str_eq(task_reason(task_get(r, "job")), "node n exceeded 1s");
    task_reg_free(r, 0);
}
END_TEST

/* ===================================================================== */
/* learned timeouts                                                      */
/* ===================================================================== */

START_TEST(test_task__learned_timeout_follows_durations)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *t;
    enum task_timeout_src src;
    double now = 0;

    ck_assert_int_eq(task_start(r, "job", 0, &t), TASK_OK);
    /* 19 samples: not enough, node_timeout_s applies. */
    for (int i = 0; i < TASK_NODE_MIN_SAMPLES - 1; i++)
        run_node(r, "job", "draft", 10, &now);
    ck_assert_uint_eq(task_node_samples(r, "draft"), 19);
    ck_assert_near(task_node_timeout_s(r, "draft", &src), 600);
    ck_assert_int_eq(src, TASK_TIMEOUT_DEFAULT);
    /* The 20th sample switches to 3 × p99. */
    run_node(r, "job", "draft", 10, &now);
    ck_assert_near(task_node_timeout_s(r, "draft", &src), 30);
    ck_assert_int_eq(src, TASK_TIMEOUT_LEARNED);
    ck_assert_int_eq(task_node_begin(r, "job", "draft", 0, now, NULL), TASK_OK);
    ck_assert_int_eq(t->node_timeout_src, TASK_TIMEOUT_LEARNED);
    ck_assert_near(t->node_deadline, now + 30);
    ck_assert_int_eq(task_node_end(r, "job", "draft", now + 10, NULL), TASK_OK);
    now += 10;

    /* Another name: durations 1..100 s -> p99 (nearest rank 99 of 100) = 99. */
    for (int d = 1; d <= 100; d++)
        run_node(r, "job", "wide", d, &now);
    ck_assert_near(task_node_timeout_s(r, "wide", NULL), 3 * 99);
    /* 28 more of 1 s: window of 128, rank ceil(0.99·128) = 127 -> 99 still. */
    for (int i = 0; i < 28; i++)
        run_node(r, "job", "wide", 1, &now);
    ck_assert_uint_eq(task_node_samples(r, "wide"), TASK_NODE_WINDOW);
    ck_assert_near(task_node_timeout_s(r, "wide", NULL), 3 * 99);
    /* One more: 1 s pushes the oldest (1 s) out; still 99. Then the window
     * fills with 2 s samples and the old slow ones age out entirely. */
    run_node(r, "job", "wide", 1, &now);
    ck_assert_uint_eq(task_node_samples(r, "wide"), TASK_NODE_WINDOW);
    ck_assert_near(task_node_timeout_s(r, "wide", NULL), 3 * 99);
    for (int i = 0; i < TASK_NODE_WINDOW; i++)
        run_node(r, "job", "wide", 2, &now);
    ck_assert_near(task_node_timeout_s(r, "wide", NULL), 6);

    /* The learned deadline is what the watchdog enforces. */
    ck_assert_int_eq(task_node_begin(r, "job", "wide", 0, now, NULL), TASK_OK);
    ck_assert_near(task_next_deadline(r, now), now + 6);
    ck_assert_int_eq(task_on_timer(r, now + 5.999), 0);
    ck_assert_int_eq(task_on_timer(r, now + 6), 1);
    ck_assert_str_eq(task_reason(t), "node wide exceeded 6s");
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__learned_timeout_has_a_floor)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    double now = 0;

    ck_assert_int_eq(task_start(r, "job", 0, NULL), TASK_OK);
    for (int i = 0; i < TASK_NODE_MIN_SAMPLES; i++)
        run_node(r, "job", "fast", 0.01, &now);
    /* 3 × 0.01 = 0.03 s would kill a healthy node on a hiccup. */
    ck_assert_near(task_node_timeout_s(r, "fast", NULL), 1);
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__only_normal_ends_are_sampled)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);

    /* Cut by stop, finish, replacement and the watchdog: no samples. */
    ck_assert_int_eq(task_start(r, "a", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "a", "n", 5, 0, NULL), TASK_OK);
    ck_assert_int_eq(task_stop(r, "a", "x", 1, NULL), TASK_OK);
    ck_assert_int_eq(task_start(r, "b", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "b", "n", 5, 0, NULL), TASK_OK);
    ck_assert_int_eq(task_finish(r, "b", false, "x", 1, NULL), TASK_OK);
    ck_assert_int_eq(task_start(r, "c", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "c", "n", 5, 0, NULL), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "c", "m", 50, 1, NULL), TASK_OK);
    ck_assert_int_eq(task_start(r, "d", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_node_begin(r, "d", "n", 2, 0, NULL), TASK_OK);
    ck_assert_int_eq(task_on_timer(r, 10), 2); /* d's watchdog, a's after-stop */
    ck_assert_uint_eq(task_node_samples(r, "n"), 0);
    ck_assert_uint_eq(task_reg_stats(r)->node_names, 0);
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__node_names_bounded_lru)
{
    struct rec rec;
    struct task_config cfg;
    task_config_defaults(&cfg);
    cfg.max_node_names = 3;
    struct task_reg *r = mkreg_cfg(&rec, &cfg);
    double now = 0;

    ck_assert_int_eq(task_start(r, "job", 0, NULL), TASK_OK);
    run_node(r, "job", "a", 1, &now);
    run_node(r, "job", "b", 1, &now);
    run_node(r, "job", "c", 1, &now);
    /* Using "a" again makes "b" the least recently used. */
    run_node(r, "job", "a", 1, &now);
    run_node(r, "job", "d", 1, &now);
    const struct task_stats *st = task_reg_stats(r);
    ck_assert_uint_eq(st->node_names, 3);
    ck_assert_uint_eq(st->node_names_evicted, 1);
    ck_assert_uint_eq(task_node_samples(r, "a"), 2);
    ck_assert_uint_eq(task_node_samples(r, "b"), 0);
    ck_assert_uint_eq(task_node_samples(r, "c"), 1);
    ck_assert_uint_eq(task_node_samples(r, "d"), 1);
    /* Hundreds of unique names: still 3 histories. */
    for (int i = 0; i < 500; i++) {
        char name[32];
        snprintf(name, sizeof(name), "u%d", i);
        run_node(r, "job", name, 1, &now);
    }
    ck_assert_uint_eq(st->node_names, 3);
    ck_assert_uint_eq(st->node_names_evicted, 501);
    task_reg_free(r, 0);
}
END_TEST

/* ===================================================================== */
/* finish, get, list                                                     */
/* ===================================================================== */

START_TEST(test_task__finish_ok_and_error)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct task *t, *u, *out = NULL;

    ck_assert_int_eq(task_finish(r, "ghost", true, NULL, 0, NULL), TASK_E_NOT_FOUND);
    ck_assert_int_eq(task_start(r, "ok", 0, &t), TASK_OK);
    ck_assert_int_eq(task_finish(r, "ok", true, "all good", 5, NULL), TASK_OK);
    ck_assert_int_eq(t->state, TASK_SUCCEEDED);
    ck_assert_int_eq(t->reason_kind, TASK_REASON_NONE);
    ck_assert_str_eq(task_reason(t), "all good");
    ck_assert_near(t->ended_at, 5);
    ck_assert_int_eq(task_finish(r, "ok", false, "again", 6, &out), TASK_E_FINISHED);
    ck_assert_ptr_eq(out, t);
    ck_assert_int_eq(t->state, TASK_SUCCEEDED);

    ck_assert_int_eq(task_start(r, "bad", 0, &u), TASK_OK);
    ck_assert_int_eq(task_finish(r, "bad", false, NULL, 7, NULL), TASK_OK);
    ck_assert_int_eq(u->state, TASK_FAILED);
    ck_assert_int_eq(u->reason_kind, TASK_ERROR);
    ck_assert_str_eq(task_reason(u), "error");
    /* A stopped task keeps its stop when the client's cleanup finishes it. */
    ck_assert_int_eq(task_start(r, "st", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_stop(r, "st", "halt", 1, NULL), TASK_OK);
    ck_assert_int_eq(task_finish(r, "st", false, "cleanup", 2, &out), TASK_E_STOPPED);
    ck_assert_str_eq(task_reason(out), "halt");

    const struct task_stats *st = task_reg_stats(r);
    ck_assert_uint_eq(st->succeeded, 1);
    ck_assert_uint_eq(st->succeeded_total, 1);
    ck_assert_uint_eq(st->failed[TASK_ERROR], 1);
    ck_assert_uint_eq(st->failed[TASK_STOPPED], 1);
    ck_assert_uint_eq(st->running, 0);
    task_reg_free(r, 0);
}
END_TEST

struct list_acc {
    int n;
    char ids[16][8];
    int stop_after;
    struct task_reg *reg;
    int busy;
};

static int list_fn(struct task *t, void *ud)
{
    struct list_acc *a = ud;
    if (task_stop(a->reg, t->id, "from foreach", 0, NULL) == TASK_E_BUSY)
        a->busy++;
    snprintf(a->ids[a->n], sizeof(a->ids[0]), "%s", t->id);
    a->n++;
    return a->stop_after && a->n >= a->stop_after ? 42 : 0;
}

START_TEST(test_task__list_filters_by_state)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    struct list_acc a;

    ck_assert_int_eq(task_start(r, "r1", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_start(r, "s1", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_start(r, "f1", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_start(r, "r2", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_finish(r, "s1", true, NULL, 1, NULL), TASK_OK);
    ck_assert_int_eq(task_stop(r, "f1", "x", 1, NULL), TASK_OK);

    memset(&a, 0, sizeof(a));
    a.reg = r;
    ck_assert_int_eq(task_foreach(r, TASK_F_ALL, list_fn, &a), 0);
    ck_assert_int_eq(a.n, 4);
    ck_assert_str_eq(a.ids[0], "r1"); /* creation order */
    ck_assert_str_eq(a.ids[3], "r2");
    ck_assert_int_eq(a.busy, 4); /* the callback cannot change the registry */

    memset(&a, 0, sizeof(a));
    a.reg = r;
    ck_assert_int_eq(task_foreach(r, TASK_F_RUNNING, list_fn, &a), 0);
    ck_assert_int_eq(a.n, 2);
    ck_assert_str_eq(a.ids[0], "r1");
    ck_assert_str_eq(a.ids[1], "r2");

    memset(&a, 0, sizeof(a));
    a.reg = r;
    ck_assert_int_eq(task_foreach(r, TASK_F_FAILED | TASK_F_SUCCEEDED, list_fn, &a), 0);
    ck_assert_int_eq(a.n, 2);
    ck_assert_str_eq(a.ids[0], "s1");
    ck_assert_str_eq(a.ids[1], "f1");

    memset(&a, 0, sizeof(a));
    a.reg = r;
    a.stop_after = 1;
    ck_assert_int_eq(task_foreach(r, TASK_F_ALL, list_fn, &a), 42);
    ck_assert_int_eq(a.n, 1);
    /* After foreach the registry is writable again. */
    ck_assert_int_eq(task_stop(r, "r1", "x", 2, NULL), TASK_OK);
    task_reg_free(r, 0);
}
END_TEST

/* ===================================================================== */
/* TTL expiry                                                            */
/* ===================================================================== */

START_TEST(test_task__ttl_expires_finished_tasks)
{
    struct rec rec;
    struct task_config cfg;
    task_config_defaults(&cfg);
    cfg.ttl_s = 100;
    struct task_reg *r = mkreg_cfg(&rec, &cfg);
    struct task *t;
    int owner = 0;

    ck_assert_int_eq(task_start(r, "job", 0, &t), TASK_OK);
    t->ud = &owner;
    ck_assert_int_eq(task_stop(r, "job", "x", 10, NULL), TASK_OK);
    /* Reads of a finished task do not extend its TTL. */
    ck_assert_int_eq(task_guard(r, "job", 50, NULL), TASK_E_STOPPED);
    ck_assert_near(task_next_deadline(r, 50), 110);
    ck_assert_int_eq(task_on_timer(r, 109.9), 0);
    ck_assert_ptr_nonnull(task_get(r, "job"));
    ck_assert_int_eq(task_on_timer(r, 110), 1);
    ck_assert_int_eq(rec.frees, 1);
    ck_assert_str_eq(rec.free_ids[0], "job");
    ck_assert_int_eq(owner, 1); /* on_free saw the owner's slot */
    ck_assert_ptr_null(task_get(r, "job"));
    ck_assert_int_eq(task_guard(r, "job", 111, NULL), TASK_E_NOT_FOUND);
    ck_assert_int_eq(task_stop(r, "job", "x", 111, NULL), TASK_E_NOT_FOUND);
    const struct task_stats *st = task_reg_stats(r);
    ck_assert_uint_eq(st->expired, 1);
    ck_assert_uint_eq(st->tasks, 0);
    ck_assert_uint_eq(st->failed[TASK_STOPPED], 0);
    ck_assert_uint_eq(st->failed_total[TASK_STOPPED], 1);
    ck_assert_near(task_next_deadline(r, 111), INFINITY);
    /* The id can be started afresh. */
    ck_assert_int_eq(task_start(r, "job", 120, &t), TASK_OK);
    ck_assert_uint_eq(t->runs, 1);
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__running_task_idles_out)
{
    struct rec rec;
    struct task_config cfg;
    task_config_defaults(&cfg);
    cfg.ttl_s = 100;
    cfg.node_timeout_s = 1000;
    struct task_reg *r = mkreg_cfg(&rec, &cfg);

    ck_assert_int_eq(task_start(r, "idle", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_start(r, "busy", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_start(r, "innode", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_guard(r, "busy", 60, NULL), TASK_OK);                   /* activity */
    ck_assert_int_eq(task_node_begin(r, "innode", "long", 0, 50, NULL), TASK_OK); /* 1000 s */
    ck_assert_int_eq(task_on_timer(r, 100), 1);
    ck_assert_ptr_null(task_get(r, "idle"));
    ck_assert_ptr_nonnull(task_get(r, "busy"));
    ck_assert_uint_eq(task_reg_stats(r)->expired_running, 1);
    ck_assert_uint_eq(task_reg_stats(r)->running, 2);
    ck_assert_int_eq(task_on_timer(r, 160), 1);
    ck_assert_ptr_null(task_get(r, "busy"));
    /* Inside a node a task never idles out; the watchdog bounds it. */
    ck_assert_int_eq(task_on_timer(r, 1049), 0);
    ck_assert_int_eq(task_get(r, "innode")->state, TASK_RUNNING);
    ck_assert_int_eq(task_on_timer(r, 1050), 1);
    ck_assert_int_eq(task_get(r, "innode")->reason_kind, TASK_WATCHDOG);
    ck_assert_int_eq(task_on_timer(r, 1150), 1);
    ck_assert_uint_eq(task_reg_stats(r)->tasks, 0);
    ck_assert_uint_eq(task_reg_stats(r)->expired, 1);
    ck_assert_uint_eq(task_reg_stats(r)->expired_running, 2);
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__reg_free_tells_owner)
{
    struct rec rec;
    struct task_reg *r = mkreg(&rec);
    int owner[3] = { 0, 0, 0 };
    struct task *t;

    for (int i = 0; i < 3; i++) {
        char id[16];
        snprintf(id, sizeof(id), "t%d", i);
        ck_assert_int_eq(task_start(r, id, 0, &t), TASK_OK);
        t->ud = &owner[i];
        ck_assert_int_eq(task_node_begin(r, id, "n", 5, 0, NULL), TASK_OK);
    }
    ck_assert_int_eq(task_stop(r, "t1", "why", 1, NULL), TASK_OK);
    task_reg_free(r, 2);
    ck_assert_int_eq(rec.frees, 3);
    ck_assert_int_eq(owner[0] + owner[1] + owner[2], 3);
}
END_TEST

/* ===================================================================== */
/* bounds                                                                */
/* ===================================================================== */

START_TEST(test_task__max_tasks_refusal)
{
    struct rec rec;
    struct task_config cfg;
    task_config_defaults(&cfg);
    cfg.max_tasks = 3;
    cfg.ttl_s = 10;
    struct task_reg *r = mkreg_cfg(&rec, &cfg);
    struct task *out = (struct task *)&rec;

    ck_assert_int_eq(task_start(r, "a", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_start(r, "b", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_start(r, "c", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_start(r, "d", 0, &out), TASK_E_FULL);
    ck_assert_ptr_null(out);
    ck_assert_ptr_null(task_get(r, "d"));
    ck_assert_uint_eq(task_reg_stats(r)->rejected_full, 1);
    ck_assert_uint_eq(task_reg_stats(r)->tasks, 3);
    /* Finished tasks still hold their slot (no early eviction), but a
     * restart of one needs no new slot. */
    ck_assert_int_eq(task_finish(r, "a", true, NULL, 1, NULL), TASK_OK);
    ck_assert_int_eq(task_start(r, "d", 1, NULL), TASK_E_FULL);
    ck_assert_int_eq(task_start(r, "a", 2, NULL), TASK_OK);
    ck_assert_int_eq(task_finish(r, "a", true, NULL, 3, NULL), TASK_OK);
    /* Expiry frees the slot: b and c idle out at 10, a at 13. */
    ck_assert_int_eq(task_on_timer(r, 10), 2);
    ck_assert_int_eq(task_start(r, "d", 10, NULL), TASK_OK);
    ck_assert_int_eq(task_start(r, "e", 10, NULL), TASK_OK);
    ck_assert_int_eq(task_start(r, "f", 10, NULL), TASK_E_FULL);
    task_reg_free(r, 0);
}
END_TEST

START_TEST(test_task__hash_collisions_single_bucket)
{
    struct rec rec;
    struct task_config cfg;
    task_config_defaults(&cfg);
    cfg.hash_buckets = 1; /* every id collides */
    cfg.ttl_s = 100;
    struct task_reg *r = mkreg_cfg(&rec, &cfg);
    char id[16];

    /* Prefix-related ids must stay distinct. */
    ck_assert_int_eq(task_start(r, "a", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_start(r, "ab", 0, NULL), TASK_OK);
    ck_assert_int_eq(task_start(r, "abc", 0, NULL), TASK_OK);
    ck_assert_str_eq(task_get(r, "ab")->id, "ab");
    ck_assert_ptr_null(task_get(r, "abcd"));
    for (int i = 0; i < 200; i++) {
        snprintf(id, sizeof(id), "t%03d", i);
        ck_assert_int_eq(task_start(r, id, 0, NULL), TASK_OK);
    }
    /* Finish every third one early so that they expire from the middle of
     * the chain. */
    for (int i = 0; i < 200; i += 3) {
        snprintf(id, sizeof(id), "t%03d", i);
        ck_assert_int_eq(task_finish(r, id, true, NULL, 1, NULL), TASK_OK);
    }
    ck_assert_int_eq(task_stop(r, "ab", "mid-chain", 1, NULL), TASK_OK);
    ck_assert_int_eq(task_guard(r, "a", 50, NULL), TASK_OK);
    ck_assert_int_eq(task_guard(r, "abc", 50, NULL), TASK_OK);
    for (int i = 0; i < 200; i++) {
        if (i % 3) {
            snprintf(id, sizeof(id), "t%03d", i);
            ck_assert_int_eq(task_guard(r, id, 50, NULL), TASK_OK);
        }
    }
    ck_assert_int_eq(task_on_timer(r, 101), 67 + 1);
    ck_assert_ptr_null(task_get(r, "ab"));
    ck_assert_str_eq(task_get(r, "a")->id, "a");
    ck_assert_str_eq(task_get(r, "abc")->id, "abc");
    for (int i = 0; i < 200; i++) {
        snprintf(id, sizeof(id), "t%03d", i);
        struct task *t = task_get(r, id);
        if (i % 3 == 0) {
            ck_assert_ptr_null(t);
        } else {
            ck_assert_ptr_nonnull(t);
            ck_assert_str_eq(t->id, id);
        }
    }
    /* One bucket really means long chains: the probe counter shows it. */
    const struct task_stats *st = task_reg_stats(r);
    ck_assert_uint_gt(st->probes, 50 * st->lookups);
    task_reg_free(r, 0);
}
END_TEST

struct owner_count {
    int frees;
};

static void count_free(struct task *t, double now, void *ud)
{
    (void)t;
    (void)now;
    ((struct owner_count *)ud)->frees++;
}

START_TEST(test_task__ten_thousand_tasks_bounded)
{
    enum { N = 10000 };
    struct task_config cfg;
    task_config_defaults(&cfg);
    cfg.max_tasks = N;
    cfg.ttl_s = 3600;
    cfg.hash_seed = 0x5eed;
    struct owner_count oc = { 0 };
    struct task_hooks h = { .on_free = count_free, .ud = &oc };
    char err[128];
    struct task_reg *r = task_reg_new(&cfg, &h, err, sizeof(err));
    char id[48], reason[TASK_REASON_MAX + 100];
    const size_t base = task_reg_memory_bytes(r);
    const size_t limit = task_reg_memory_limit(r);

    ck_assert_ptr_nonnull(r);
    ck_assert_uint_le(base, limit);
    memset(reason, 'r', sizeof(reason) - 1);
    reason[sizeof(reason) - 1] = '\0';
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof(id), "agent-run-%08d-%08x", i, (unsigned)(i * 2654435761u));
        ck_assert_int_eq(task_start(r, id, i * 0.001, NULL), TASK_OK);
        ck_assert_int_eq(task_node_begin(r, id, "a-node-with-a-longish-name", 60, i * 0.001, NULL),
                         TASK_OK);
        if (i % 2)
            ck_assert_int_eq(task_stop(r, id, reason, i * 0.001 + 1, NULL), TASK_OK);
    }
    ck_assert_int_eq(task_start(r, "one-too-many", 20, NULL), TASK_E_FULL);
    size_t full = task_reg_memory_bytes(r);
    /* Bounded: under the computed limit, and a little over 1 KiB a task
     * with the longest reason. */
    ck_assert_uint_le(full, limit);
    ck_assert_uint_lt(full - base, (size_t)N * 1100);

    /* O(1) lookups: with auto-sized buckets the chains stay short. */
    const struct task_stats *st = task_reg_stats(r);
    uint64_t l0 = st->lookups, p0 = st->probes;
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof(id), "agent-run-%08d-%08x", i, (unsigned)(i * 2654435761u));
        int rc = task_guard(r, id, 30, NULL);
        ck_assert_int_eq(rc, i % 2 ? TASK_E_STOPPED : TASK_OK);
    }
    double per = (double)(st->probes - p0) / (double)(st->lookups - l0);
    ck_assert_msg(per < 2.0, "%.2f probes per lookup", per);

    /* The watchdog takes the running half at 60 s (+ their start), the
     * stopped half's deadlines pass as ordinary exits. */
    ck_assert_int_eq(task_on_timer(r, 100), N);
    ck_assert_uint_eq(st->failed_total[TASK_WATCHDOG], N / 2);
    ck_assert_uint_eq(st->watchdog_after_stop, N / 2);
    /* Everything expires after the TTL; memory returns to the fixed tables. */
    ck_assert_int_eq(task_on_timer(r, 3600 + 100), N);
    ck_assert_uint_eq(st->tasks, 0);
    ck_assert_uint_eq(st->expired, N);
    ck_assert_int_eq(oc.frees, N);
    ck_assert_near(task_next_deadline(r, 4000), INFINITY);
    /* The history of the one node name never ended normally: none kept. */
    ck_assert_uint_eq(task_reg_memory_bytes(r), base);
    task_reg_free(r, 0);
}
END_TEST

Suite *task_suite(void)
{
    Suite *s = suite_create("task");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_task__config_validation);
    tcase_add_test(tc, test_task__names);
    tcase_add_test(tc, test_task__start_creates_running);
    tcase_add_test(tc, test_task__invalid_ids_and_nodes);
    tcase_add_test(tc, test_task__start_running_is_refused);
    tcase_add_test(tc, test_task__restart_after_finish_is_a_new_run);
    tcase_add_test(tc, test_task__stop_marks_failed_stopped);
    tcase_add_test(tc, test_task__stop_unknown_is_not_found);
    tcase_add_test(tc, test_task__stop_twice_keeps_first_reason);
    tcase_add_test(tc, test_task__stop_finished_reports_its_state);
    tcase_add_test(tc, test_task__reason_is_bounded_at_utf8_boundary);
    tcase_add_test(tc, test_task__guard_running_ok_and_records_activity);
    tcase_add_test(tc, test_task__guard_after_stop_fails_with_reason);
    tcase_add_test(tc, test_task__guard_other_states);
    tcase_add_test(tc, test_task__node_begin_explicit_deadline);
    tcase_add_test(tc, test_task__node_begin_default_before_enough_samples);
    tcase_add_test(tc, test_task__node_begin_needs_running_task);
    tcase_add_test(tc, test_task__node_end_records_sample_and_disarms);
    tcase_add_test(tc, test_task__node_end_after_stop_keeps_node_armed);
    tcase_add_test(tc, test_task__node_begin_replaces_current);
    tcase_add_test(tc, test_task__watchdog_fires_exactly_at_deadline);
    tcase_add_test(tc, test_task__watchdog_late_timer_still_fires_once);
    tcase_add_test(tc, test_task__stop_then_deadline_counts_as_stopped);
    tcase_add_test(tc, test_task__stopped_task_expiring_before_its_deadline);
    tcase_add_test(tc, test_task__finish_disarms_node);
    tcase_add_test(tc, test_task__deadlines_fire_in_order);
    tcase_add_test(tc, test_task__hooks_cannot_mutate);
    tcase_add_test(tc, test_task__learned_timeout_follows_durations);
    tcase_add_test(tc, test_task__learned_timeout_has_a_floor);
    tcase_add_test(tc, test_task__only_normal_ends_are_sampled);
    tcase_add_test(tc, test_task__node_names_bounded_lru);
    tcase_add_test(tc, test_task__finish_ok_and_error);
    tcase_add_test(tc, test_task__list_filters_by_state);
    tcase_add_test(tc, test_task__ttl_expires_finished_tasks);
    tcase_add_test(tc, test_task__running_task_idles_out);
    tcase_add_test(tc, test_task__reg_free_tells_owner);
    tcase_add_test(tc, test_task__max_tasks_refusal);
    tcase_add_test(tc, test_task__hash_collisions_single_bucket);
    tcase_add_test(tc, test_task__ten_thousand_tasks_bounded);
    suite_add_tcase(s, tc);
    return s;
}
