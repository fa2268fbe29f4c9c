/*
 * callrpc.h — the msgpack-RPC front end of `call` (proto/PROTOCOL.md): the
 * `call` method's parameters, and the sink that answers with a response,
 * [2, "chunk", [msgid, event]] notifications ([msgid, event, name] when the
 * call asked for event_names), or an error response.
 */
#ifndef POLYGW_CALLRPC_H
#define POLYGW_CALLRPC_H

#include "conn.h"

/* Sets up the sink embedded in a connection (conn_new); `budget` is the
 * connection's (borrowed). */
void callrpc_sink_init(struct call_sink *s, struct server *srv, struct upstream_budget *budget);

/* The `call` method: validates its parameters and starts the call;
 * answers bad_request / unknown_capability at once when it cannot start. */
void callrpc_start(struct conn *c, const struct rpc_msg *m);

/* A `trace` parameter (`call`, `task.start`): a W3C carrier map whose
 * `traceparent` and `tracestate` (strings, both optional) are copied into
 * tp (64 bytes) and ts (257) ("" when absent; a value too long is dropped,
 * as on the HTTP front). Other keys (baggage) are ignored; a malformed
 * traceparent is too, by the tracer (a new trace). Returns 0, or -1 with
 * `why`. */
int callrpc_trace_param(const msgpack_object *m, char *tp, char *ts, char *why, size_t whylen);

#endif /* POLYGW_CALLRPC_H */
