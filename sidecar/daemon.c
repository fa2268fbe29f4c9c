/*
 * server.c — the Unix-socket listener and the sidecar's lifecycle.
 *
 * Socket file. The path is created with the configured mode (bind under a
 * umask that grants nothing more, then chmod), its directory is created
 * (0750) when missing. An existing path is probed with connect(): if a live
 * sidecar answers we refuse to start; a socket nobody listens on is stale
 * and replaced; anything that is not a socket is left alone and refused.
 * Under systemd socket activation (LISTEN_FDS/LISTEN_PID) the inherited fd
 * 3 is used and the file belongs to systemd.
 *
 * fd exhaustion. accept() failing with EMFILE/ENFILE leaves the connection
 * in the backlog, so a level-triggered watcher would fire again at once and
 * spin at 100% CPU, while the clients wait. We keep one spare fd open: on
 * EMFILE we close it, and on the descriptor that frees accept every waiting
 * connection in turn, send it an `overloaded` notification and close it, so
 * each client is refused at once; then the spare is reopened. Only if it
 * cannot be (another thread took the descriptor) do we pause accepting for
 * SERVER_ACCEPT_PAUSE_S rather than spin.
 *
 * Shutdown (SIGTERM/SIGINT):
 *
 *   RUNNING --signal--> DRAINING: listener closed, socket file removed,
 *      |                new requests answered `shutting_down`, in-flight
 *      |                ones may finish until shutdown_grace_s
 *      +--> STOPPING: (all answered, or grace over: the rest are answered
 *                     `shutting_down`) flush replies for at most 2 s,
 *                     close connections, send the spans still queued
 *                     (tracer_flush; within the same 2 s), ev_break.
 *
 * SIGHUP reloads the configuration while RUNNING (reload.h).
 */
#include "daemon.h"
#include "net/listen.h"
#include "rpc/conn.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cache.h"
#include "call/call.h"
#include "dlist.h"
#include "call/governor.h"
#include "http/http.h"
#include "call/tasks.h"
#include "core/log.h"
#include "metrics/metrics.h"
#include "call/redact.h"
#include "ops/keywatch.h"
#include "ops/cacheops.h"
#include "ops/reload.h"
#include "upstream/cloudauth.h"
#include "upstream/upstream.h"
#include "trace/trace.h"

static void daemon_notify_ready(struct server *srv);

/* The HTTP front's side of the input budget, read through srv->http at
 * each use (a reload may replace the front). */
static size_t daemon_http_input_most(void *ud)
{
    const struct server *srv = ud;
    return http_input_most(srv->http);
}

static void daemon_http_refuse_input_most(void *ud, size_t total, size_t cap)
{
    struct server *srv = ud;
    http_refuse_input_most(srv->http, total, cap);
}


#define SERVER_ACCEPT_PAUSE_S       0.1
#define SERVER_STOP_FLUSH_S         2.0
#define SERVER_ACCEPT_BATCH         64
#define SERVER_SHED_BATCH           1024 /* refusals per loop turn at the fd limit */
#define SERVER_FD_WARN_EVERY_S      10.0
#define SERVER_DNS_LOOKUPS_PER_HOST 4

static const char *state_name(enum server_state s)
{
    switch (s) {
    case SERVER_RUNNING:
        return "running";
    case SERVER_DRAINING:
        return "draining";
    default:
        return "stopping";
    }
}

static void server_set_state(struct server *srv, enum server_state s, const char *why)
{
    log_at(LOG_INFO, "server state", "from", LOG_S, state_name(srv->state), "to", LOG_S,
           state_name(s), "reason", LOG_S, why, NULL);
    srv->state = s;
}

/* Adopts the socket passed by systemd, if any (sd_listen_fds(3): LISTEN_PID
 * is ours and LISTEN_FDS >= 1; the first fd is 3; the variables are unset
 * and every passed fd is made close-on-exec). Returns the fd, -1 when
 * nothing was passed, or -2 (with err) when fd 3 is not a listening Unix
 * stream socket: a broken unit must fail loudly, not spin on accept() or
 * trip the event loop. */
static int inherited_socket(char *err, size_t errlen)
{
    int n = sd_listen_fds(1);

    if (n < 1)
        return -1;
    int fd = SD_LISTEN_FDS_START;
    if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0) {
        snprintf(err, errlen,
                 "LISTEN_FDS is set but fd 3 is not a listening Unix stream socket; "
                 "check the .socket unit (ListenStream= a path)");
        return -2;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

/* The path a passed socket is bound to, for logs (empty when unnamed). */
static void inherited_path(int fd, char *buf, size_t cap)
{
    struct sockaddr_un sa;
    socklen_t len = sizeof(sa);

    buf[0] = '\0';
    if (getsockname(fd, (struct sockaddr *)&sa, &len) == 0 &&
        len > offsetof(struct sockaddr_un, sun_path))
        snprintf(buf, cap, "%.*s", (int)(len - offsetof(struct sockaddr_un, sun_path)),
                 sa.sun_path);
}

static int server_listen(struct server *srv, char *err, size_t errlen)
{
    const char *path = srv->cfg->socket_path;
    struct sockaddr_un sa = { .sun_family = AF_UNIX };

    int fd = inherited_socket(err, errlen);
    if (fd == -2)
        return -1;
    if (fd >= 0) {
        char real[sizeof(sa.sun_path) + 1];
        srv->listen_fd = fd;
        srv->owns_socket_file = false;
        inherited_path(fd, real, sizeof(real));
        if (real[0]) {
            char *p = strdup(real);
            if (p) {
                free(srv->socket_path);
                srv->socket_path = p;
            }
        }
        log_at(LOG_INFO, "using socket passed by systemd", "fd", LOG_I, (long long)fd, "socket",
               LOG_S, real, NULL);
        return 0;
    }
    fd = net_bind_unix(path, srv->cfg->socket_mode, err, errlen);
    if (fd < 0)
        return -1;
    srv->listen_fd = fd;
    srv->owns_socket_file = true;
    return 0;
}

static void server_stop_listening(struct server *srv)
{
    if (srv->listen_fd < 0)
        return;
    ev_io_stop(srv->loop, &srv->accept_w);
    ev_timer_stop(srv->loop, &srv->accept_retry_w);
    close(srv->listen_fd);
    srv->listen_fd = -1;
    if (srv->owns_socket_file && unlink(srv->socket_path) < 0 && errno != ENOENT)
        log_at(LOG_WARN, "cannot remove socket file", "socket", LOG_S, srv->socket_path, "error",
               LOG_S, strerror(errno), NULL);
}

static void server_on_accept_retry(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct server *srv = w->data;
    (void)revents;
    if (srv->listen_fd >= 0)
        ev_io_start(loop, &srv->accept_w);
}

/* Tells a client it cannot be served, then closes. Best effort: the
 * message is tiny and the socket buffer is empty, so one send suffices. */
static void server_reject(struct server *srv, int fd, const char *message)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    rpc_pack_fatal(&pk, PGW_OVERLOADED, message);
    ssize_t n = send(fd, sb.data, sb.size, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)n;
    msgpack_sbuffer_destroy(&sb);
    close(fd);
    srv->stats.conns_rejected++;
    srv->stats.rejected[PGW_OVERLOADED]++;
}

/* EMFILE/ENFILE: refuse the whole backlog on the spare's descriptor (see
 * the top of the file). The listener stays armed: a client arriving later
 * is refused the same way, at once. */
static void server_on_fd_exhaustion(struct server *srv)
{
    unsigned shed = 0;

    srv->stats.accept_errors++;
    if (srv->spare_fd >= 0) {
        close(srv->spare_fd);
        srv->spare_fd = -1;
        for (int i = 0; i < SERVER_SHED_BATCH; i++) {
            int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) {
                if (errno == EINTR || errno == ECONNABORTED)
                    continue;
                break;
            }
            server_reject(srv, fd, "the sidecar is out of file descriptors; retry later");
            shed++;
        }
        srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    double now = ev_now(srv->loop);
    if (srv->spare_fd >= 0) {
        if (now - srv->fd_warned_at >= SERVER_FD_WARN_EVERY_S) {
            srv->fd_warned_at = now;
            log_at(LOG_WARN, "out of file descriptors; refusing new connections", "refused", LOG_U,
                   (unsigned long long)shed, "open", LOG_U,
                   (unsigned long long)srv->stats.conns_open, NULL);
        }
        return;
    }
    log_at(LOG_WARN, "out of file descriptors and no spare; pausing accept", "pause_s", LOG_F,
           SERVER_ACCEPT_PAUSE_S, NULL);
    ev_io_stop(srv->loop, &srv->accept_w);
    ev_timer_set(&srv->accept_retry_w, SERVER_ACCEPT_PAUSE_S, 0.);
    ev_timer_start(srv->loop, &srv->accept_retry_w);
}

static void server_on_accept(struct ev_loop *loop, ev_io *w, int revents)
{
    struct server *srv = w->data;
    (void)loop;
    (void)revents;

    for (int i = 0; i < SERVER_ACCEPT_BATCH && srv->listen_fd >= 0; i++) {
        int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                server_on_fd_exhaustion(srv);
                return;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                /* Anything else is not going away by itself: back off
                 * rather than spin on a level-triggered watcher. */
                srv->stats.accept_errors++;
                log_at(LOG_WARN, "accept failed; pausing accept", "error", LOG_S, strerror(errno),
                       "pause_s", LOG_F, SERVER_ACCEPT_PAUSE_S, NULL);
                ev_io_stop(srv->loop, &srv->accept_w);
                ev_timer_set(&srv->accept_retry_w, SERVER_ACCEPT_PAUSE_S, 0.);
                ev_timer_start(srv->loop, &srv->accept_retry_w);
            }
            return;
        }
        if (srv->stats.conns_open >= srv->cfg->max_connections) {
            char buf[96];
            snprintf(buf, sizeof(buf), "too many connections (max_connections %u)",
                     srv->cfg->max_connections);
            server_reject(srv, fd, buf);
            continue;
        }
        struct conn *c = conn_new(srv, fd);
        if (!c) {
            close(fd);
            srv->stats.conns_rejected++;
            continue;
        }
        DLIST_PUSH(srv->conns, c, prev, next);
        srv->stats.conns_open++;
        srv->stats.conns_accepted++;
        log_at(LOG_DEBUG, "connection accepted", "conn", LOG_U, (unsigned long long)c->id, NULL);
    }
}

static void daemon_on_conn_closed(struct server *srv, struct conn *c)
{
    DLIST_UNLINK(srv->conns, c, prev, next);
    c->next = srv->dead;
    srv->dead = c;
    srv->stats.conns_open--;
    ev_prepare_start(srv->loop, &srv->reap_w);
    server_on_front_closed(srv);
}

static void daemon_on_traces_sent(void *ud)
{
    struct server *srv = ud;
    ev_break(srv->loop, EVBREAK_ALL);
}

/* Everything is closed: the loop ends once the spans still queued are sent
 * (or the stop timer, SERVER_STOP_FLUSH_S, ends it first). */
static void daemon_exit(struct server *srv)
{
    if (tracer_flush(srv->tracer, daemon_on_traces_sent, srv) == 0)
        ev_break(srv->loop, EVBREAK_ALL);
}

static void daemon_on_front_closed(struct server *srv)
{
    if (srv->state == SERVER_STOPPING && !srv->conns && !http_has_conns(srv->http))
        daemon_exit(srv);
}

static void server_on_reap(struct ev_loop *loop, ev_prepare *w, int revents)
{
    struct server *srv = w->data;
    (void)revents;
    while (srv->dead) {
        struct conn *c = srv->dead;
        srv->dead = c->next;
        conn_free(c);
    }
    ev_prepare_stop(loop, w);
}

/* DRAINING/grace -> STOPPING: flush what is queued and close everything. */
static void server_stop(struct server *srv, const char *why)
{
    if (srv->state == SERVER_STOPPING)
        return;
    server_set_state(srv, SERVER_STOPPING, why);
    ev_timer_stop(srv->loop, &srv->grace_w);
    ev_timer_start(srv->loop, &srv->stop_w);
    if (!srv->conns && !http_has_conns(srv->http)) {
        daemon_exit(srv);
        return;
    }
    http_stop(srv->http);
    for (struct conn *c = srv->conns, *next; c; c = next) {
        next = c->next;
        tasks_fail_pending(&c->tasks, PGW_SHUTTING_DOWN,
                           "the sidecar shut down before the state backend answered");
        cacheops_fail_pending(&c->tasks, PGW_SHUTTING_DOWN,
                              "the sidecar shut down before the state backend answered");
        call_fail_all(&c->sink, PGW_SHUTTING_DOWN,
                      "the sidecar shut down before the call finished");
        conn_close_after_flush(c);
    }
}

static void daemon_on_request_done(struct server *srv)
{
    if (srv->state == SERVER_DRAINING && srv->stats.in_flight == 0)
        server_stop(srv, "all requests answered");
}

void server_begin_shutdown(struct server *srv, const char *why)
{
    if (srv->state != SERVER_RUNNING)
        return;
    sdnotify_stopping(&srv->notify, why);
    server_set_state(srv, SERVER_DRAINING, why);
    server_stop_listening(srv);
    http_stop_listening(srv->http);
    if (srv->stats.in_flight == 0) {
        server_stop(srv, "nothing in flight");
        return;
    }
    ev_timer_set(&srv->grace_w, srv->cfg->shutdown_grace_s, 0.);
    ev_timer_start(srv->loop, &srv->grace_w);
}

static void server_on_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
    struct server *srv = w->data;
    (void)loop;
    (void)revents;
    if (srv->state == SERVER_RUNNING)
        server_begin_shutdown(srv, w->signum == SIGINT ? "SIGINT" : "SIGTERM");
    else
        server_stop(srv, "second signal");
}

static void server_on_sighup(struct ev_loop *loop, ev_signal *w, int revents)
{
    char err[CONFIG_ERR_MAX];
    (void)loop;
    (void)revents;
    reload_run(w->data, "SIGHUP", NULL, NULL, NULL, err, sizeof(err)); /* it logs the outcome */
}

static void server_on_grace(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    server_stop(w->data, "shutdown grace period over");
}

static void server_on_stop_timeout(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct server *srv = w->data;
    (void)revents;
    for (struct conn *c = srv->conns, *next; c; c = next) {
        next = c->next;
        conn_close(c, "shutdown");
    }
    http_close_all(srv->http);
    ev_break(loop, EVBREAK_ALL);
}

/* Backend hooks: events the backend reports go to the task layer and the
 * governance core; the backend itself knows neither. */
static void server_on_task_ended(void *ud, const char *id)
{
    tasks_on_task_ended(ud, id);
}

static void server_on_resync(void *ud)
{
    tasks_on_resubscribed(ud);
}

static void server_on_backend_up(void *ud)
{
    tasks_on_backend_up(ud);
    server_notify_ready(ud); /* READY=1 waits for Redis */
}

static void server_on_progress_known(void *ud, const char *scope)
{
    struct server *srv = ud;
    gov_progress_known(&srv->gov, scope);
}

static void server_on_cache_purged(void *ud, const char *capability, const char *app, bool missed)
{
    cacheops_on_fleet_purge(ud, capability, app, missed);
}

static struct backend *server_backend_new(struct server *srv, const struct backend_hooks *hooks,
                                          char *err, size_t errlen)
{
    return backend_new(srv->loop, srv->cfg, srv->tasks, hooks, err, errlen);
}

/* Every key the sources send, for scrubbing replies (redact.h). */
static int server_redact_init(struct server *srv)
{
    const struct config *cfg = srv->cfg;
    size_t n = 0, max = cfg->n_sources;

    for (size_t i = 0; i < cfg->n_sources; i++)
        max += cfg->sources[i].n_headers;
    const char **keys = calloc(max ? max : 1, sizeof(*keys));
    if (!keys)
        return -1;
    for (size_t i = 0; i < cfg->n_sources; i++) {
        const struct config_source *s = &cfg->sources[i];
        keys[n++] = s->api_key;
        /* Header values read from the environment or a file are secrets
         * too (a literal `value` is in the file for anyone to read). */
        for (size_t j = 0; j < s->n_headers; j++)
            if (s->headers[j].value_env || s->headers[j].value_file)
                keys[n++] = s->headers[j].value;
    }
    srv->redact = redact_new(keys, n);
    free(keys);
    return srv->redact ? 0 : -1;
}

int server_init(struct server *srv, struct ev_loop *loop, struct config *cfg, char *err,
                size_t errlen)
{
    return server_init_with(srv, loop, cfg, server_backend_new, err, errlen);
}

/* Tears down what server_init_with set up, in reverse order. The backend
 * goes before the task registry: its last answers (the drain at exit)
 * still bring task copies in line. */
static void server_fini_parts(struct server *srv)
{
    gov_fini(&srv->gov);
    backend_free(srv->backend);
    srv->backend = NULL;
    tasks_fini(srv);
    tracer_free(srv->tracer); /* before the engine its export runs on */
    srv->tracer = NULL;
    cloudauth_free(srv->aws_auth); /* likewise */
    srv->aws_auth = NULL;
    cloudauth_free(srv->gcp_auth);
    srv->gcp_auth = NULL;
    upstream_free(srv->up);
    srv->up = NULL;
    metrics_free(srv->metrics); /* last: the parts above count into it until freed */
    srv->metrics = NULL;
    redact_free(srv->redact);
    srv->redact = NULL;
    cache_free(srv->cache);
    srv->cache = NULL;
    free(srv->socket_path);
    srv->socket_path = NULL;
}

int server_init_with(struct server *srv, struct ev_loop *loop, struct config *cfg,
                     server_backend_fn *make_backend, char *err, size_t errlen)
{
    memset(srv, 0, sizeof(*srv));
    srv->hooks = (struct server_hooks){ .request_done = daemon_on_request_done,
                                        .front_closed = daemon_on_front_closed,
                                        .notify_ready = daemon_notify_ready,
                                        .conn_closed = daemon_on_conn_closed };
    srv->input_fronts[0] =
        (struct server_input_front){ conn_input_most, conn_refuse_input_most, srv };
    srv->input_fronts[1] =
        (struct server_input_front){ daemon_http_input_most, daemon_http_refuse_input_most, srv };
    srv->n_input_fronts = 2;
    srv->loop = loop;
    srv->cfg = cfg;
    srv->listen_fd = -1;
    srv->spare_fd = -1;
    sdnotify_init(&srv->notify, loop);
    governor_seed(&srv->rand_state); /* before tasks_init draws its hash seed */
    const struct gov_hooks hooks = {
        .on_wake = call_on_gov_wake,
        .on_breaker = call_on_breaker,
        .ud = srv,
    };
    const struct backend_hooks be_hooks = {
        .on_task_ended = server_on_task_ended,
        .on_resync = server_on_resync,
        .on_up = server_on_backend_up,
        .on_progress_known = server_on_progress_known,
        .on_cache_purged = server_on_cache_purged,
        .ud = srv,
    };
    /* Set up in dependency order; server_fini_parts unwinds in reverse
     * (each part's fini accepts a part never set up). */
    srv->socket_path = strdup(cfg->socket_path);
    srv->metrics = metrics_new(cfg);
    srv->cache = cache_new(cfg->cache_max_bytes);
    if (!srv->socket_path || !srv->metrics || !srv->cache) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (server_redact_init(srv) < 0) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    srv->up = upstream_new(loop, SERVER_DNS_LOOKUPS_PER_HOST,
                           cfg->upstream_client == UPSTREAM_CLIENT_AUTO, err, errlen);
    static const struct tasks_calls task_calls = { .fail = call_fail_task,
                                                   .forget = call_forget_task };
    if (!srv->up || tasks_init(srv, &task_calls, err, errlen) < 0)
        goto fail;
    upstream_set_dns_ttl(srv->up, cfg->dns_ttl_s);
    if (!(srv->tracer = tracer_new(loop, srv->up, &cfg->tracing, err, errlen)))
        goto fail;
    cloudauth_ensure(&srv->aws_auth, &srv->gcp_auth, loop, srv->up, cfg);
    srv->backend = make_backend(srv, &be_hooks, err, errlen);
    if (!srv->backend)
        goto fail;
    if (governor_init(&srv->gov, cfg, srv->backend->ops->progress(srv->backend), &hooks,
                      &srv->rand_state, ev_now(loop), err, errlen) < 0)
        goto fail;
    /* Armed before the socket exists: a client that can connect may also
     * send SIGTERM, and that must be a clean shutdown, never the default
     * kill that leaves the socket file behind. */
    ev_signal_init(&srv->sigterm_w, server_on_signal, SIGTERM);
    ev_signal_init(&srv->sigint_w, server_on_signal, SIGINT);
    ev_signal_init(&srv->sighup_w, server_on_sighup, SIGHUP); /* a reload, never a kill */
    srv->sigterm_w.data = srv->sigint_w.data = srv->sighup_w.data = srv;
    ev_signal_start(loop, &srv->sigterm_w);
    ev_signal_start(loop, &srv->sigint_w);
    ev_signal_start(loop, &srv->sighup_w);
    /* The HTTP front binds first: a client that finds the main socket
     * (the usual readiness check) finds every door already open. */
    srv->http = http_new(srv, err, errlen);
    srv->http_stats = http_get_stats(srv->http);
    if (!srv->http && (cfg->http_socket || cfg->http_listen))
        goto fail;
    if (server_listen(srv, err, errlen) < 0) {
        http_free(srv->http);
        srv->http = NULL;
        srv->http_stats = NULL;
        goto fail;
    }
    srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    srv->started_at = ev_now(loop);

    ev_io_init(&srv->accept_w, server_on_accept, srv->listen_fd, EV_READ);
    ev_init(&srv->accept_retry_w, server_on_accept_retry);
    ev_init(&srv->grace_w, server_on_grace);
    ev_timer_init(&srv->stop_w, server_on_stop_timeout, SERVER_STOP_FLUSH_S, 0.);
    ev_prepare_init(&srv->reap_w, server_on_reap);
    srv->accept_w.data = srv->accept_retry_w.data = srv;
    srv->grace_w.data = srv->stop_w.data = srv->reap_w.data = srv;
    return 0;
fail:
    ev_signal_stop(loop, &srv->sigterm_w); /* a no-op when never started */
    ev_signal_stop(loop, &srv->sigint_w);
    ev_signal_stop(loop, &srv->sighup_w);
    server_fini_parts(srv);
    return -1;
}

/* READY=1 once the socket accepts and the backend can answer (with the
 * Redis backend, Redis is connected): a unit ordered After= this one may
 * start using it at once. */
static void daemon_notify_ready(struct server *srv)
{
    char status[160];

    if (srv->state != SERVER_RUNNING || srv->listen_fd < 0 || !ev_is_active(&srv->accept_w))
        return;
    if (!backend_is_up(srv->backend))
        return;
    snprintf(status, sizeof(status), "serving %zu sources (%s backend)", srv->cfg->n_sources,
             srv->backend->ops->name);
    sdnotify_ready(&srv->notify, status);
}

void server_start(struct server *srv)
{
    /* Before anything can call: a key file changed from the moment the
     * socket accepts (the kernel queues connections before the loop runs)
     * is seen. */
    srv->keywatch = keywatch_new(srv);
    ev_io_start(srv->loop, &srv->accept_w);
    http_start(srv->http);
    char mode[8];
    snprintf(mode, sizeof(mode), "%04o", (unsigned)srv->cfg->socket_mode);
    log_at(LOG_INFO, "listening", "socket", LOG_S, srv->socket_path, "mode", LOG_S,
           srv->owns_socket_file ? mode : "systemd", "max_message_bytes", LOG_U,
           (unsigned long long)srv->cfg->max_message_bytes, "pid", LOG_I, (long long)getpid(),
           NULL);
    sdnotify_start(&srv->notify);
    /* The Redis link connects from the loop: its on_up hook says when. */
    server_notify_ready(srv);
}

void server_fini(struct server *srv)
{
    server_stop_listening(srv);
    http_free(srv->http);
    srv->http = NULL;
    for (struct conn *c = srv->conns, *next; c; c = next) {
        next = c->next;
        conn_close(c, "exit");
    }
    while (srv->dead) {
        struct conn *c = srv->dead;
        srv->dead = c->next;
        conn_free(c);
    }
    ev_timer_stop(srv->loop, &srv->grace_w);
    ev_timer_stop(srv->loop, &srv->stop_w);
    ev_prepare_stop(srv->loop, &srv->reap_w);
    sdnotify_stop(&srv->notify);
    ev_signal_stop(srv->loop, &srv->sigterm_w);
    ev_signal_stop(srv->loop, &srv->sigint_w);
    ev_signal_stop(srv->loop, &srv->sighup_w);
    keywatch_free(srv->keywatch);
    srv->keywatch = NULL;
    reload_fini(srv);
    if (srv->spare_fd >= 0)
        close(srv->spare_fd);
    server_fini_parts(srv);
}
