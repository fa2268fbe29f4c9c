/* fake_backend.c — the scripted backend of the unit tests (see
 * fake_backend.h). */
#include "fake_backend.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/figures.h"
#include "task.h"

struct backend_lease {
    struct fake_backend *fb;
};

static struct fake_op *fake_push(struct fake_backend *fb, enum fake_kind kind)
{
    ck_assert_msg(fb->n_ops < FAKE_OPS_MAX, "fake backend: too many operations");
    struct fake_op *o = &fb->ops[fb->n_ops++];
    memset(o, 0, sizeof(*o));
    o->kind = kind;
    o->asked_at = ev_now(fb->loop);
    return o;
}

static int fake_admit(struct backend *be, size_t source, size_t app, double est_tokens,
                      double est_out, struct backend_lease **lease, backend_admit_cb *cb, void *ud,
                      struct backend_admit **pending)
{
    struct fake_backend *fb = (struct fake_backend *)be;
    (void)est_tokens;
    (void)est_out;
    (void)app;

    *lease = NULL;
    *pending = NULL;
    if (fb->down)
        return -1;
    struct fake_op *o = fake_push(fb, FAKE_ADMIT);
    o->source = source;
    o->admit_cb = cb;
    o->ud = ud;
    *pending = (struct backend_admit *)o;
    return 0;
}

static void fake_admit_detach(struct backend *be, struct backend_admit *a)
{
    struct fake_backend *fb = (struct fake_backend *)be;
    struct fake_op *o = (struct fake_op *)a;

    ck_assert(!o->answered && !o->detached);
    o->detached = true;
    fb->detaches++;
}

static void fake_release(struct backend *be, struct backend_lease *lease, const struct outcome *o,
                         const struct backend_usage *used)
{
    struct fake_backend *fb = (struct fake_backend *)be;
    (void)used;

    ck_assert_ptr_nonnull(lease);
    ck_assert_ptr_eq(lease->fb, fb);
    ck_assert_uint_gt(fb->leases_live, 0);
    fb->leases_live--;
    fb->releases++;
    fb->last_verdict = backend_verdict_name(o);
    free(lease);
}

static int fake_task(struct backend *be, enum backend_task_op op, const char *id,
                     const char *reason, bool ok, const char *app, bool admin, double budget,
                     struct backend_task *now_bt, backend_task_cb *cb, void *ud)
{
    struct fake_backend *fb = (struct fake_backend *)be;
    (void)budget;
    (void)now_bt;

    if (fb->down)
        return -1;
    struct fake_op *o = fake_push(fb, FAKE_TASK);
    o->op = op;
    snprintf(o->id, sizeof(o->id), "%s", id);
    snprintf(o->reason, sizeof(o->reason), "%s", reason ? reason : "");
    o->ok = ok;
    snprintf(o->app, sizeof(o->app), "%s", app ? app : "");
    o->admin = admin;
    o->task_cb = cb;
    o->ud = ud;
    return 0;
}

static void fake_retry_later(struct backend *be, bool resync)
{
    struct fake_backend *fb = (struct fake_backend *)be;
    fb->retry_laters++;
    if (resync)
        fb->retry_resyncs++;
}

static bool fake_is_closing(const struct backend *be)
{
    return ((const struct fake_backend *)be)->closing;
}

static bool fake_is_up(const struct backend *be)
{
    return !((const struct fake_backend *)be)->down;
}

static const char *fake_down_reason(const struct backend *be, const char **detail)
{
    (void)be;
    *detail = "";
    return "fake down";
}

static const char *fake_breaker_state(const struct backend *be, size_t source)
{
    (void)be;
    (void)source;
    return NULL;
}

static void fake_rebind(struct backend *be, const struct config *cfg)
{
    (void)be;
    (void)cfg;
}

static const struct gov_backend *fake_progress(struct backend *be)
{
    (void)be;
    return NULL;
}

static struct fig_val fake_kind(const void *obj, size_t row)
{
    (void)obj;
    (void)row;
    return (struct fig_val){ .s = "fake" };
}

static const struct figure fake_backend_figure_list[] = {
    { .key = "kind", .kind = FIG_STR, .get = fake_kind },
};
static const struct fig_table fake_backend_figures = FIG_TABLE(fake_backend_figure_list);
static const struct figure fake_figure_list[] = {
    { .key = "backend", .kind = FIG_MAP, .sub = &fake_backend_figures },
};
static const struct fig_table fake_figures = FIG_TABLE(fake_figure_list);

/* Like a real backend at exit, the operations never answered fail now
 * (their requesters free what they hold); a lease still live is a leak of
 * the caller's. */
static void fake_free(struct backend *be)
{
    struct fake_backend *fb = (struct fake_backend *)be;

    fb->closing = true;
    for (size_t i = 0; i < fb->n_ops; i++) {
        struct fake_op *o = &fb->ops[i];
        if (o->answered || o->detached)
            continue;
        if (o->kind == FAKE_TASK)
            fake_fail_task(fb, (int)i, "closing");
        else
            fake_answer_admit(fb, (int)i, -1, NAN, "closing");
    }
    ck_assert_uint_eq(fb->leases_live, 0);
    free(be);
}

static const struct backend_ops fake_ops = {
    .name = "fake",
    .admit = fake_admit,
    .admit_detach = fake_admit_detach,
    .release = fake_release,
    .task = fake_task,
    .retry_later = fake_retry_later,
    .is_closing = fake_is_closing,
    .is_up = fake_is_up,
    .down_reason = fake_down_reason,
    .breaker_state = fake_breaker_state,
    .rebind = fake_rebind,
    .progress = fake_progress,
    .figures = &fake_figures,
    .free = fake_free,
};

struct fake_backend *fake_backend_new(struct ev_loop *loop, const struct backend_hooks *hooks)
{
    struct fake_backend *fb = calloc(1, sizeof(*fb));

    if (!fb)
        return NULL;
    fb->be.ops = &fake_ops;
    fb->be.hooks = *hooks;
    fb->loop = loop;
    fb->last_verdict = "none";
    return fb;
}

static bool fake_match(const struct fake_op *o, enum fake_kind kind, int op, const char *id)
{
    return o->kind == kind && (kind != FAKE_TASK || op < 0 || (int)o->op == op) &&
        (!id || strcmp(o->id, id) == 0);
}

int fake_find(const struct fake_backend *fb, enum fake_kind kind, int op, const char *id,
              size_t nth)
{
    for (size_t i = 0; i < fb->n_ops; i++)
        if (fake_match(&fb->ops[i], kind, op, id) && nth-- == 0)
            return (int)i;
    return -1;
}

size_t fake_count(const struct fake_backend *fb, enum fake_kind kind, int op, bool pending_only)
{
    size_t n = 0;
    for (size_t i = 0; i < fb->n_ops; i++)
        if (fake_match(&fb->ops[i], kind, op, NULL) &&
            (!pending_only || (!fb->ops[i].answered && !fb->ops[i].detached)))
            n++;
    return n;
}

void fake_answer_admit(struct fake_backend *fb, int i, int rc, double retry_at, const char *why)
{
    ck_assert_int_ge(i, 0);
    struct fake_op *o = &fb->ops[i];
    ck_assert(o->kind == FAKE_ADMIT && !o->answered);
    o->answered = true;
    struct backend_lease *l = NULL;
    if (rc == 1) {
        l = calloc(1, sizeof(*l));
        ck_assert_ptr_nonnull(l);
        l->fb = fb;
        fb->leases_live++;
    }
    if (o->detached) { /* the caller is gone: its lease goes back at once */
        if (l)
            fake_release(&fb->be, l, NULL, NULL);
        return;
    }
    o->admit_cb(o->ud, rc, l, retry_at, why ? why : "");
}

static void fake_deliver(struct fake_backend *fb, int i, const struct backend_task *bt)
{
    ck_assert_int_ge(i, 0);
    struct fake_op *o = &fb->ops[i];
    ck_assert(o->kind == FAKE_TASK && !o->answered);
    o->answered = true;
    o->task_cb(o->ud, bt);
}

void fake_answer_task(struct fake_backend *fb, int i, int rc, const char *state, const char *kind,
                      const char *reason)
{
    double now = ev_time();
    struct backend_task bt = {
        .rc = rc,
        .exists = state != NULL,
        .state = state,
        .kind = kind ? kind : "",
        .reason = reason ? reason : "",
        .runs = 1,
        .started_at_s = now,
        .updated_at_s = now,
    };
    fake_deliver(fb, i, &bt);
}

void fake_fail_task(struct fake_backend *fb, int i, const char *why)
{
    const struct backend_task bt = { .rc = BACKEND_E_UNAVAILABLE, .err = why };
    fake_deliver(fb, i, &bt);
}
