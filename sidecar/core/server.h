/*
 * server.h — the process's shared state: the loop, the configuration in
 * force, the governance core, the counters, and the parts the process owner
 * (sidecar/daemon.c) made. Every part of the daemon reads it; only the owner
 * builds and tears it down.
 *
 * Parts below the owner never call it: they report through the hooks it
 * registers here (server_on_request_done and the others below are those
 * hooks' wrappers), so the process owner is the only file that knows the
 * order of start-up, readiness, draining and stopping (docs/DESIGN.md §2).
 */
#ifndef POLYGW_SERVER_H
#define POLYGW_SERVER_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codes.h"
#include "config.h"
#include "gov.h"
#include "sdnotify.h"

struct conn;
struct call;
struct upstream;
struct task_reg;
struct tasks_calls;
struct backend;
struct tasks_req;
struct tasks_resync;
struct keywatch;
struct http_server;
struct cache;
struct metrics;
struct redact;
struct server;

/* What the parts report up to the process owner. */
struct server_hooks {
    void (*request_done)(struct server *srv);                /* a request was answered */
    void (*front_closed)(struct server *srv);                /* a connection of a front closed */
    void (*notify_ready)(struct server *srv);                /* the backend may have become ready */
    void (*conn_closed)(struct server *srv, struct conn *c); /* a msgpack connection closed */
};

/* A front end that buffers unfinished input (net/input.h): the most one of
 * its connections holds, and the refusal of that connection, which drops
 * its share from srv->input_bytes at once. */
struct server_input_front {
    size_t (*most)(void *ud);
    void (*refuse_most)(void *ud, size_t total, size_t cap);
    void *ud;
};
#define SERVER_INPUT_FRONTS 2

/* The HTTP front's counters (for stats and metrics). */
struct http_stats {
    uint64_t conns_open, conns_accepted, conns_rejected;
    uint64_t requests;     /* requests parsed */
    uint64_t responses[6]; /* by status class: [1] 1xx ... [5] 5xx */
    uint64_t timeouts;     /* header or body phase expired (408) */
    uint64_t bad_requests; /* unparsable input (400, 413, 431) */
};

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
    struct server_hooks hooks;                                   /* set by the process owner */
    struct server_input_front input_fronts[SERVER_INPUT_FRONTS]; /* registered by the owner */
    size_t n_input_fronts;
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
    struct upstream *up;        /* the HTTP engine */
    struct cloudauth *aws_auth; /* AWS keys fetched for kind: bedrock sources,
                                          * and Google tokens for kind: vertex ones
                                          * (upstream/cloudauth.h), or NULL */
    struct cloudauth *gcp_auth;
    struct tracer *tracer;               /* spans and their export (trace/trace.h); off
                                          * unless tracing.enabled */
    struct http_server *http;            /* the HTTP front end (http.h), NULL when not configured */
    const struct http_stats *http_stats; /* its counters, NULL without it */
    struct gov gov;                      /* the governance core */
    struct backend *backend;             /* the state backend (backend.h): memory or Redis */
    uint64_t rand_state;                 /* jitter generator */
    struct task_reg *tasks;              /* task states (src/task.h) */
    ev_timer task_w;                     /* the watchdog / task expiry timer */
    struct tasks_req *task_retry, *task_retry_tail; /* verdicts to send when the backend is back */
    struct tasks_resync *resync;                    /* running tasks being re-read after a gap */
    size_t task_imports;       /* backend reads that may import a task, in flight */
    size_t *task_app_held;     /* per cfg->apps index: tasks held here that belong to it */
    uint64_t task_app_refused; /* task.start refused: the app held its apps[].max_tasks */
    size_t task_retry_n;
    /* What a task's end does to its calls (call/tasks.h), from the owner. */
    const struct tasks_calls *task_calls;
    struct metrics *metrics; /* counters and histograms (metrics.h) */
    struct redact *redact;   /* the sources' keys, scrubbed from relayed replies */
    struct cache *cache;     /* the response cache's memory tier (call/cache.h) */
    struct sdnotify notify;  /* readiness and watchdog for the service manager */
    /* Reload (reload.h). cfg is owned by the server once a reload swapped it. */
    const char *config_path;     /* borrowed from main: the file reloads read */
    const char *socket_override; /* borrowed: --socket, applied to every reload; NULL */
    const char *http_socket_override, *http_listen_override; /* --http-socket, --http-listen */
    bool log_level_override;           /* --log-level given: reloads keep the level */
    char reload_error[CONFIG_ERR_MAX]; /* the last failed reload's reason, or "" */
    char **old_keys;                   /* owned: keys of earlier configurations, still redacted */
    size_t n_old_keys;
    /* Runs after each successful reload (reload_on_done, ops/reload.h). */
    void (*reloaded)(void *ud);
    void *reloaded_ud;
    ev_signal sighup_w;
    struct keywatch *keywatch; /* key-file watch, NULL when no key comes from a file */
    struct call *calls_all;    /* every call in flight, whatever its front end (call.c) */
};

/* A request was answered; lets a draining process notice when all are
 * done. */
static inline void server_on_request_done(struct server *srv)
{
    if (srv->hooks.request_done)
        srv->hooks.request_done(srv);
}

/* A front end closed a connection: a stopping process ends the loop once
 * none is left. */
static inline void server_on_front_closed(struct server *srv)
{
    if (srv->hooks.front_closed)
        srv->hooks.front_closed(srv);
}

/* READY=1 when the socket accepts and, with Redis, Redis is connected (once;
 * again after a reload). */
static inline void server_notify_ready(struct server *srv)
{
    if (srv->hooks.notify_ready)
        srv->hooks.notify_ready(srv);
}

/* A msgpack connection finished closing (fd closed): the owner unlinks it
 * and queues its free. */
static inline void server_on_conn_closed(struct server *srv, struct conn *c)
{
    if (srv->hooks.conn_closed)
        srv->hooks.conn_closed(srv, c);
}

static inline double server_uptime_s(const struct server *srv)
{
    return ev_now(srv->loop) - srv->started_at;
}

#endif /* POLYGW_SERVER_H */
