/*
 * taskrpc.h — the msgpack-RPC front end of the task methods
 * (proto/PROTOCOL.md 4.4): their named parameters parsed into a struct
 * task_req, and the reply handle that answers them with a response.
 */
#ifndef POLYGW_TASKRPC_H
#define POLYGW_TASKRPC_H

#include "conn.h"

/* Sets up the reply handle embedded in a connection (conn_new). */
void taskrpc_outlet_init(struct reply_outlet *o, struct server *srv);

/* The task methods (methods.c's table): parse, then call tasks.h's;
 * answer bad_request at once for a parameter they refuse. */
void taskrpc_start(struct conn *c, const struct rpc_msg *m);
void taskrpc_stop(struct conn *c, const struct rpc_msg *m);
void taskrpc_guard(struct conn *c, const struct rpc_msg *m);
void taskrpc_node_begin(struct conn *c, const struct rpc_msg *m);
void taskrpc_node_end(struct conn *c, const struct rpc_msg *m);
void taskrpc_finish(struct conn *c, const struct rpc_msg *m);
void taskrpc_get(struct conn *c, const struct rpc_msg *m);
void taskrpc_list(struct conn *c, const struct rpc_msg *m);

#endif /* POLYGW_TASKRPC_H */
