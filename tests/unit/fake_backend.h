/*
 * fake_backend.h — a third implementation of the backend table
 * (sidecar/backend/backend.h) for the unit tests of the task layer and of
 * admission: it records every operation and answers only when the test
 * says so (fake_answer_*), from outside any backend operation, as a real
 * asynchronous backend would; it refuses to send while `down`, and the
 * test raises the backend's events (hooks) by hand.
 */
#ifndef POLYGW_FAKE_BACKEND_H
#define POLYGW_FAKE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "backend/backend.h"

#define FAKE_OPS_MAX 2048

enum fake_kind { FAKE_ADMIT, FAKE_TASK };

/* One operation the fake was asked for. */
struct fake_op {
    enum fake_kind kind;
    enum backend_task_op op; /* FAKE_TASK */
    char id[160];
    char reason[600];
    bool ok;
    char app[64];    /* FAKE_TASK: on behalf of ("" = none) */
    bool admin;      /* FAKE_TASK: `app` is an admin app */
    size_t source;   /* FAKE_ADMIT */
    double asked_at; /* loop time */
    backend_admit_cb *admit_cb;
    backend_task_cb *task_cb;
    void *ud;
    bool detached; /* admit_detach */
    bool answered;
};

struct fake_backend {
    struct backend be;
    struct ev_loop *loop;
    struct fake_op ops[FAKE_OPS_MAX];
    size_t n_ops;
    bool down;    /* operations are not sent (return -1) */
    bool closing; /* backend_free has begun */
    size_t releases, leases_live, detaches, retry_laters, retry_resyncs;
    const char *last_verdict; /* of the last release: success, failure, neutral, none */
};

/* A new fake with `hooks` (copied), up; freed by backend_free. NULL when
 * out of memory. */
struct fake_backend *fake_backend_new(struct ev_loop *loop, const struct backend_hooks *hooks);

/* Index of the n-th (0-based) operation matching `kind` (and, for tasks,
 * `op` unless -1, and `id` unless NULL), or -1. */
int fake_find(const struct fake_backend *fb, enum fake_kind kind, int op, const char *id,
              size_t nth);
/* Operations of that shape asked so far / not answered yet. */
size_t fake_count(const struct fake_backend *fb, enum fake_kind kind, int op, bool pending_only);

/* Answers admission `i`: rc 1 admitted (with a lease), 0 refused at
 * `retry_at` for `why`, -1 failed (`why`). A detached one is not
 * delivered: a lease granted meanwhile is released, as the contract says. */
void fake_answer_admit(struct fake_backend *fb, int i, int rc, double retry_at, const char *why);
/* Answers task operation `i` with `rc` and, when `state` is not NULL, a
 * record in that state (kind, reason may be NULL for ""). */
void fake_answer_task(struct fake_backend *fb, int i, int rc, const char *state, const char *kind,
                      const char *reason);
/* Answers task operation `i` with BACKEND_E_UNAVAILABLE (`why`). */
void fake_fail_task(struct fake_backend *fb, int i, const char *why);

#endif /* POLYGW_FAKE_BACKEND_H */
