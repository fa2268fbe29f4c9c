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

/* Reload (reload.c): every live call moves to the new configuration at
 * one point of the loop. call_uses_source: does some call still name
 * cfg->sources[i] as its last source? call_reconf_prepare allocates each
 * call's notes in the new source order (-1: out of memory, nothing kept);
 * call_reconf_abort undoes it; call_reconf_commit (after gov_reconf_commit,
 * cannot fail) installs them and repoints each call's capability and
 * source into `cfg` (the new one, not yet srv->cfg) by `r`'s index map.
 * Capabilities keep their indices across a reload. */
bool call_uses_source(const struct server *srv, size_t i);
struct gov_reconf;
int call_reconf_prepare(struct server *srv, const struct gov_reconf *r);
void call_reconf_abort(struct server *srv);
void call_reconf_commit(struct server *srv, const struct gov_reconf *r, const struct config *cfg);

#endif /* POLYGW_CALL_H */
