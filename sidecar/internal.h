/*
 * internal.h — declarations shared between the sidecar's modules and nobody
 * else: the server (listener + lifecycle), its connections and the method
 * table. The governance core (src/) and the codec (proto/) never see these.
 */
#ifndef POLYGW_SIDECAR_INTERNAL_H
#define POLYGW_SIDECAR_INTERNAL_H

#include <ev.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdint.h>

#include "call/call.h"
#include "codec/reply.h"
#include "codes.h"
#include "gov.h"
#include "core/config.h"
#include "frame.h"
#include "net/peer.h"
#include "strbuf.h"
#include "rpc.h"
#include "core/sdnotify.h"
#include "strbuf.h"
#include "upstream/upstream.h"

struct conn;
struct call;
struct upstream;
struct task_reg;
struct backend;
struct tasks_req;
struct tasks_resync;
struct keywatch;
struct http_server;

struct metrics;

/* Counters shown by `stats`. All monotonically increasing except `*_open`
 * and `in_flight`. */
struct server_stats {
    uint64_t conns_open;
    uint64_t conns_accepted;
    uint64_t conns_rejected;    /* closed at accept: max_connections, fd exhaustion */
    uint64_t conns_idle_closed; /* closed by listen.idle_timeout_s */
    uint64_t input_refusals;    /* connections refused by max_buffered_input_bytes */
    uint64_t accept_errors;
    uint64_t requests_served; /* responses sent, success or error */
    uint64_t in_flight;       /* requests accepted and not yet answered */
    uint64_t notifications_ignored;
    uint64_t chunks_relayed; /* stream events sent to clients */
    uint64_t cancels;        /* `cancel` notifications that ended a call */
    uint64_t read_pauses;    /* times a connection stopped being read (write queue full) */
    uint64_t bytes_in, bytes_out;
    uint64_t rejected[PGW_CODE_COUNT];   /* error responses/notifications sent, by code */
    uint64_t reloads_ok, reloads_failed; /* configuration reloads (reload.h) */
};

/* Lifecycle:  RUNNING --SIGTERM/SIGINT--> DRAINING --in-flight done or grace
 * expired--> STOPPING (flush, close, ev_break) */
enum server_state { SERVER_RUNNING, SERVER_DRAINING, SERVER_STOPPING };

struct server {
    struct ev_loop *loop;
    struct config *cfg; /* main's at start; a reload replaces it (main
                                   * frees srv->cfg at exit) */
    enum server_state state;
    int listen_fd;         /* -1 once closed */
    bool owns_socket_file; /* false under socket activation */
    char *socket_path;     /* owned */
    int spare_fd;          /* kept open to survive EMFILE (see server.c) */
    size_t input_bytes;    /* partial frames buffered, all connections */
    ev_io accept_w;
    ev_timer accept_retry_w; /* re-arms accept after fd exhaustion */
    ev_tstamp fd_warned_at;  /* last fd exhaustion warning (rate-limited) */
    ev_signal sigterm_w, sigint_w;
    ev_timer grace_w;  /* DRAINING -> STOPPING deadline */
    ev_timer stop_w;   /* STOPPING: bound on flushing replies */
    ev_prepare reap_w; /* frees closed connections outside callbacks */
    ev_tstamp started_at;
    struct conn *conns; /* open connections (doubly linked) */
    struct conn *dead;  /* closed, waiting for the reaper */
    struct server_stats stats;
    struct upstream *up;      /* the HTTP engine */
    struct http_server *http; /* the HTTP front end (http.h), NULL when not configured */
    struct gov gov;           /* the governance core */
    struct backend *backend;  /* the state backend (backend.h): memory or Redis */
    uint64_t rand_state;      /* jitter generator */
    struct task_reg *tasks;   /* task states (src/task.h) */
    ev_timer task_w;          /* the watchdog / task expiry timer */
    struct tasks_req *task_retry, *task_retry_tail; /* verdicts to send when the backend is back */
    struct tasks_resync *resync;                    /* running tasks being re-read after a gap */
    size_t task_imports;       /* backend reads that may import a task, in flight */
    size_t *task_app_held;     /* per cfg->apps index: tasks held here that belong to it */
    uint64_t task_app_refused; /* task.start refused: the app held its apps[].max_tasks */
    size_t task_retry_n;
    struct metrics *metrics; /* counters and histograms (metrics.h) */
    struct redact *redact;   /* the sources' keys, scrubbed from relayed replies */
    struct sdnotify notify;  /* readiness and watchdog for the service manager */
    /* Reload (reload.h). cfg is owned by the server once a reload swapped it. */
    const char *config_path;     /* borrowed from main: the file reloads read */
    const char *socket_override; /* borrowed: --socket, applied to every reload; NULL */
    const char *http_socket_override, *http_listen_override; /* --http-socket, --http-listen */
    bool log_level_override;           /* --log-level given: reloads keep the level */
    char reload_error[CONFIG_ERR_MAX]; /* the last failed reload's reason, or "" */
    char **old_keys;                   /* owned: keys of earlier configurations, still redacted */
    size_t n_old_keys;
    ev_signal sighup_w;
    struct keywatch *keywatch; /* key-file watch, NULL when no key comes from a file */
    struct call *calls_all;    /* every call in flight, whatever its front end (call.c) */
};

/* server.c */
struct backend_hooks;
int server_init(struct server *srv, struct ev_loop *loop, struct config *cfg, char *err,
                size_t errlen);
/* Builds the state backend of `srv` once srv->tasks exists, with `hooks`
 * (copied; the backend reports its events through them). Returns the
 * backend, or NULL with `err`. */
typedef struct backend *server_backend_fn(struct server *srv, const struct backend_hooks *hooks,
                                          char *err, size_t errlen);
/* server_init with the backend `backend_new` builds instead of the one
 * cfg->backend names (the unit tests' fake backend). */
int server_init_with(struct server *srv, struct ev_loop *loop, struct config *cfg,
                     server_backend_fn *backend_new, char *err, size_t errlen);
void server_start(struct server *srv);
void server_fini(struct server *srv);
void server_begin_shutdown(struct server *srv, const char *why);
/* A connection finished closing (fd closed): unlink it and queue its free. */
void server_on_conn_closed(struct server *srv, struct conn *c);
/* READY=1 when the socket accepts and, with Redis, Redis is connected (once;
 * again after a reload). */
void server_notify_ready(struct server *srv);
/* A front end closed a connection: a stopping server ends the loop once
 * none is left. */
void server_on_front_closed(struct server *srv);
/* Creates the Unix socket `path` (its parent directory when missing, a
 * stale socket replaced, a live one refused) with permission bits `mode`
 * and listens on it. Returns the non-blocking fd, or -1 with err. */
int server_bind_unix(const char *path, uint32_t mode, char *err, size_t errlen);
/* A request was answered; lets a draining server notice when all are done. */
void server_on_request_done(struct server *srv);
double server_uptime_s(const struct server *srv);

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
/* Past listen.max_buffered_input_bytes of unfinished input across all
 * connections of both front ends (srv->input_bytes), refuses the
 * connection holding the most (msgpack: the `overloaded` notification;
 * HTTP: 503, http.h) until the total fits; each refusal drops its share
 * from the total at once. */
void conn_enforce_input(struct server *srv);
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

/* methods.c */
/* Handles one request. Either answers before returning (packing into
 * c->pk and calling conn_response_done) or takes ownership of completing it
 * later; in both cases exactly one response is sent. */
/* Who asks for `stats`: its app (borrowed from the config), the app its
 * credentials resolve to, and its peer (NULL: unknown). */
struct stats_caller {
    const struct config_app *app;
    const char *peer_app;
    const struct peer *peer;
};
/* Writes the `stats` result (PROTOCOL.md) as `who` sees it. Counts this
 * request as served: the caller answers it at once. */
void methods_write_stats(struct writer *w, struct server *srv, const struct stats_caller *who);
void methods_dispatch(struct conn *c, const struct rpc_msg *m);
/* Handles one notification (e.g. cancel). Never answers. */
void methods_notify(struct conn *c, const struct rpc_msg *m);

#endif /* POLYGW_SIDECAR_INTERNAL_H */
