/*
 * harness.h — a real sidecar (server, connections, methods, task layer,
 * calls, governance core) on one event loop inside a unit test, with the
 * fake backend (fake_backend.h) in place of memory or Redis, and raw
 * msgpack-RPC clients on its Unix socket. Every wait is bounded in loop
 * iterations and wall time.
 */
#ifndef POLYGW_TEST_HARNESS_H
#define POLYGW_TEST_HARNESS_H

#include <msgpack.h>
#include <stdbool.h>
#include <stdint.h>

#include "fake_backend.h"
#include "daemon.h"
#include "rpc/conn.h"

#define HARNESS_CLIENTS 4

struct harness {
    struct ev_loop *loop;
    struct config *cfg;
    struct server srv;
    struct fake_backend *fb; /* srv.backend */
    char dir[64];
    int fds[HARNESS_CLIENTS];
    msgpack_unpacker up[HARNESS_CLIENTS];
    size_t n_clients;
};

/* One message a client received. */
struct reply {
    int type;       /* 1 response, 2 notification */
    uint32_t msgid; /* response; chunk: the call's */
    char code[40];  /* the error's code; "" on success */
    char message[700];
    char state[32];   /* result (or error) field `state`, "" if absent */
    char reason[700]; /* field `reason` of the result or the error */
    char reason_kind[32];
};

/* Starts a sidecar (config: one chat source whose upstream refuses
 * connections, then `extra_yaml` appended; may be NULL). */
void harness_start(struct harness *h, const char *extra_yaml);
void harness_stop(struct harness *h);

/* A new client; returns its index. */
int harness_connect(struct harness *h);

/* Runs the loop for `seconds` (at least one iteration). */
void harness_run(struct harness *h, double seconds);

/* Requests: a task method with `task_id` and, when not NULL, `reason`;
 * task.finish; task.node_begin; call on capability chat (naming `task_id`
 * when not NULL); the cancel notification. */
void harness_task(struct harness *h, int cl, uint32_t msgid, const char *method, const char *id,
                  const char *reason);
void harness_finish(struct harness *h, int cl, uint32_t msgid, const char *id, bool ok);
void harness_node_begin(struct harness *h, int cl, uint32_t msgid, const char *id, const char *node,
                        double timeout_s);
void harness_call(struct harness *h, int cl, uint32_t msgid, const char *task_id);
void harness_cancel(struct harness *h, int cl, uint32_t msgid);

/* Runs the loop until client `cl` receives a message (true) or
 * `timeout_s` passes (false). */
bool harness_recv(struct harness *h, int cl, struct reply *r, double timeout_s);

/* Runs the loop until the fake was asked for at least `n` operations of
 * that shape (fake_count; `op` -1: any) (true) or `timeout_s` passes. */
bool harness_wait_ops(struct harness *h, enum fake_kind kind, int op, size_t n, double timeout_s);

#endif
