/*
 * conn.h — the msgpack front's connections (conn.c) and its method table
 * (methods.c): framing, the write queue and its budget, the caller's app,
 * and one response per request.
 */
#ifndef POLYGW_CONN_H
#define POLYGW_CONN_H

#include <ev.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdint.h>

#include "call/call.h"
#include "codec/reply.h"
#include "codes.h"
#include "core/config.h"
#include "core/server.h"
#include "frame.h"
#include "net/peer.h"
#include "rpc.h"
#include "strbuf.h"
#include "upstream/upstream.h"

/* conn.c */
struct conn {
    struct server *srv;
    struct conn *prev, *next;
    uint64_t id;
    int fd;
    ev_io rio, wio;
    ev_timer linger_w;       /* bounds close-after-flush */
    ev_timer idle_w;         /* listen.idle_timeout_s (lazy: re-checks when it fires) */
    ev_tstamp last_activity; /* a byte read or written, a request answered */
    struct frame_reader reader;
    size_t input_bytes; /* its share of srv->input_bytes */
    msgpack_unpacked frame;
    msgpack_packer pk;             /* packs straight into `out` */
    struct strbuf out;             /* write queue: its live bytes are pending */
    size_t out_unchecked;          /* PGW_CHECK_PACKING: bytes queued since the last check */
    struct upstream_budget budget; /* unsent output + replies being received */
    uint32_t in_flight;            /* task requests in flight (calls: sink.n_calls) */
    struct call_sink sink;         /* its calls in flight (call.c, callrpc.c) */
    struct reply_outlet tasks;     /* task answers, and those waiting for the backend */
    bool reading;                  /* rio active */
    bool read_paused;              /* paused because its budget is spent */
    bool closing;                  /* no more input; close once `out` is flushed */
    bool closed;                   /* fd closed, awaiting free */
    bool oom;                      /* an append failed: close */
    /* Who is calling (docs/APPS.md): the peer's credentials, read once at
     * accept from the kernel (SO_PEERCRED), never from the client. */
    struct peer peer;               /* unknown: `default` */
    char peer_app[CONFIG_NAME_MAX]; /* the app the credentials resolve to */
    char app[CONFIG_NAME_MAX];      /* the connection's app: peer_app, or one `hello` declared */
};

struct conn *conn_new(struct server *srv, int fd);
/* Closes now (drops unsent output). Idempotent; safe inside callbacks: the
 * memory is freed later by the server's reaper. */
void conn_close(struct conn *c, const char *why);
/* Stops reading; closes once pending output is written (bounded by a linger
 * timer). Used after a fatal protocol error and at shutdown. */
void conn_close_after_flush(struct conn *c);
/* Writes as much pending output as the socket takes now, arming the write
 * watcher for the rest; applies read back-pressure and lets the
 * connection's paused transfers go on as its budget frees. */
void conn_flush(struct conn *c);
void conn_free(struct conn *c);
/* The msgpack front's side of the shared input budget (net/input.h),
 * registered by the process owner with `ud` = the server: the most one
 * connection holds, and its refusal (the `overloaded` notification, then a
 * close). */
size_t conn_input_most(void *ud);
void conn_refuse_input_most(void *ud, size_t total, size_t cap);
/* Sends an error response for `msgid` and counts it. */
void conn_reply_error(struct conn *c, uint32_t msgid, enum pgw_code code, const char *message);
/* The same for error `e` (codec/reply.h) with its fields. */
void conn_reply_error_of(struct conn *c, uint32_t msgid, const struct reply_error *e);
/* Sends the fatal error notification, counts it, and closes after flush. */
void conn_fail(struct conn *c, enum pgw_code code, const char *message);
/* Call after packing a complete response into c->pk. */
void conn_response_done(struct conn *c, enum pgw_code code);
/* The connection's app in the current config (never NULL: an app removed by
 * a reload reads as `default`). */
const struct config_app *conn_app(const struct conn *c);
/* May connection `c` act as the app named by the `len` bytes at `name`
 * (borrowed, client input)? Its own app always; another configured app only
 * when its own allows declared names, and never an admin app unless its own
 * is admin. Returns the app, or NULL with the reason in `why`. */
const struct config_app *conn_declare_app(const struct conn *c, const char *name, size_t len,
                                          char *why, size_t whylen);

/* methods.c: conn.c reaches the methods only through these (callrpc.c and
 * taskrpc.c use conn.c, never the reverse). */
/* Sets up what the methods keep in new connection `c` (c->srv and c->budget
 * set): its call sink (callrpc.c) and its task reply handle (taskrpc.c). */
void methods_conn_init(struct conn *c);
/* Handles one request. Either answers before returning (packing into
 * c->pk and calling conn_response_done) or takes ownership of completing it
 * later; in both cases exactly one response is sent. */
void methods_dispatch(struct conn *c, const struct rpc_msg *m);
/* Handles one notification (e.g. cancel). Never answers. */
void methods_notify(struct conn *c, const struct rpc_msg *m);

#endif /* POLYGW_CONN_H */
