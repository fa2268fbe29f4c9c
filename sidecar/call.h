/*
 * call.h — the `call` method and the calls in flight on a connection.
 */
#ifndef POLYGW_CALL_H
#define POLYGW_CALL_H

#include "internal.h"

/* Validates a `call` request and starts it; answers bad_request /
 * unknown_capability at once when it cannot start. */
void call_start(struct conn *c, const struct rpc_msg *m);

/* True when a call with this msgid is in flight on `c`. */
bool call_is_in_flight(struct conn *c, uint32_t msgid);

/* `cancel` notification: answers the call `cancelled` and tears its attempt
 * down at once. Returns -1 when no call with that msgid is in flight. */
int call_cancel(struct conn *c, uint32_t msgid);

/* Answers every call of `c` with `code` and tears them down (shutdown). */
void call_fail_all(struct conn *c, enum pgw_code code, const char *message);

/* The client is gone: tear every call down without answering. */
void call_abort_all(struct conn *c);

/* gov hooks (see gov.h): a released permit wakes a waiting call (scheduled,
 * never stepped synchronously); breaker transitions are logged. */
void call_on_gov_wake(struct gov_call *g, void *ud);
void call_on_breaker(const struct gov *g, size_t source, enum breaker_state from,
                     enum breaker_state to, double now, void *ud);

/* A task stop or watchdog expiry: answers every call of task `t` with
 * `code` (task_stopped / watchdog_timeout) and tears them down at once. */
struct task;
void call_fail_task(struct task *t, enum pgw_code code, const char *message);

/* Task `t` is being freed: its calls forget it. */
void call_forget_task(struct task *t);

/* The connection's write queue drained: resume paused streams. */
void call_on_drained(struct conn *c);

#endif /* POLYGW_CALL_H */
