/*
 * tasks.h — the task methods (docs/DESIGN.md §3.5, PROTOCOL.md 4.4) on top of the
 * task registry (src/task.h), and the watchdog timer.
 *
 * The registry holds task states; the sidecar adds what only it can do:
 * a stop or a watchdog expiry ends the task's in-flight calls at once
 * (they answer task_stopped / watchdog_timeout and their upstream
 * connections close), and one ev_timer follows task_next_deadline().
 */
#ifndef POLYGW_TASKS_H
#define POLYGW_TASKS_H

#include "internal.h"

struct task;

int tasks_init(struct server *srv, char *err, size_t errlen);
void tasks_fini(struct server *srv);

/* Method handlers (methods.c's table). Each answers exactly once. */
void tasks_start(struct conn *c, const struct rpc_msg *m);
void tasks_stop(struct conn *c, const struct rpc_msg *m);
void tasks_guard(struct conn *c, const struct rpc_msg *m);
void tasks_node_begin(struct conn *c, const struct rpc_msg *m);
void tasks_node_end(struct conn *c, const struct rpc_msg *m);
void tasks_finish(struct conn *c, const struct rpc_msg *m);
void tasks_get(struct conn *c, const struct rpc_msg *m);
void tasks_list(struct conn *c, const struct rpc_msg *m);

/* For `call`: checks that task `id` is running. Returns the task, or NULL
 * after answering the request with the task's error (task_stopped,
 * watchdog_timeout, bad_request for an unknown one). */
struct task *tasks_admit_call(struct conn *c, uint32_t msgid, const char *id);

/* Shared backend, for a call naming a task this sidecar does not hold:
 * asks Redis whether it runs (importing it here when it does). `cb` runs
 * once — possibly before this returns, when the backend is not connected —
 * with the local task (rc TASK_OK) or NULL, a TASK_E_* code (or the
 * backend's failure) and the task's reason and reason kind when known. */
typedef void tasks_guard_cb(void *ud, struct task *t, int rc, const char *reason,
                            const char *kind);
void tasks_guard_remote(struct server *srv, const char *id, tasks_guard_cb *cb, void *ud);
/* Answers request `msgid` with the error for `rc` from tasks_guard_cb. */
void tasks_reply_error(struct conn *c, uint32_t msgid, int rc, const char *id,
                       const char *reason, const char *kind);

/* Shared backend: task `id` was stopped, failed by a watchdog or finished
 * on some sidecar (P:task-end): bring the copy held here in line (a stop
 * ends its calls here). */
void tasks_on_task_end(struct server *srv, const char *id);
/* Shared backend: the stop channel is listened to again after a gap (or a
 * task update could not be sent); re-read the running tasks held here. */
void tasks_on_resubscribed(struct server *srv);
/* Shared backend: the command connection is up again: send the watchdog
 * verdicts that could not be sent. */
void tasks_on_backend_up(struct server *srv);
/* Shared backend, for `call`: is task `id` held here and running? (Any
 * other local state may be stale: ask Redis.) */
bool tasks_held_running(struct server *srv, const char *id);

/* Shared backend: the task requests of `c` still waiting for Redis are
 * answered with `code` (PGW_OK: not answered — the client is gone); their
 * replies are then dropped. */
void tasks_fail_pending(struct conn *c, enum pgw_code code, const char *message);

/* Is a task request with `msgid` waiting for Redis on connection `c`? */
bool tasks_is_pending(struct conn *c, uint32_t msgid);

/* The `tasks` section of `stats`. */
void tasks_pack_stats(msgpack_packer *pk, struct server *srv);

#endif /* POLYGW_TASKS_H */
