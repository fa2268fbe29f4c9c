/*
 * conn.c — one client connection: read frames, dispatch, queue replies.
 *
 * Input is bounded four ways: the frame reader caps each message at
 * max_message_bytes (claimed sizes included), a read event reads at most
 * CONN_READ_CHUNK bytes so one busy client cannot starve the others,
 * requests in flight per connection are capped, and the partial frames of
 * all connections together are capped at max_buffered_input_bytes: past
 * it, the connection holding the most is refused (`overloaded`). A reader
 * buffer that grew for a large frame is given back once it is empty.
 *
 * Output: every connection has a byte budget (upstream.h) of
 * max_write_queue_bytes, spent by its unsent replies (one contiguous
 * queue) and by the reply bodies its calls are still receiving. Transfers
 * that would overspend it are paused, and while it is spent we stop
 * reading the connection's requests (so it cannot make us produce more)
 * until it falls below half; both resume as the client reads. So what a
 * client that does not read costs is bounded by max_write_queue_bytes (2 x
 * max_message_bytes by default), however many calls it pipelines.
 *
 * Idle connections: with listen.idle_timeout_s, a connection with nothing
 * in flight that neither sent nor received a byte for that long is closed.
 *
 * Freeing: conn_close() only closes the fd and moves the connection to the
 * server's dead list; the server's ev_prepare watcher frees it after the
 * current callbacks have unwound.
 */
#include "conn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/input.h"
#include "call/tasks.h"
#include "core/log.h"
#include "ops/cacheops.h"

#define CONN_READ_CHUNK        (64 * 1024)
#define CONN_LINGER_S          2.0 /* how long a closing connection may take to flush */
/* Buffers larger than this are freed once empty rather than kept: a
 * connection that once carried a large message must not hold its size. */
#define CONN_KEEP_BUFFER_BYTES (4 * CONN_READ_CHUNK)

static void conn_on_read(struct ev_loop *loop, ev_io *w, int revents);
static void conn_on_write(struct ev_loop *loop, ev_io *w, int revents);
static void conn_on_linger(struct ev_loop *loop, ev_timer *w, int revents);
static void conn_on_idle(struct ev_loop *loop, ev_timer *w, int revents);

/* msgpack_packer write callback: append to the write queue. */
static int conn_append(void *data, const char *buf, size_t len)
{
    struct conn *c = data;

    if (c->oom)
        return -1;
    if (strbuf_put(&c->out, buf, len) < 0) {
        c->oom = true;
        return -1;
    }
    c->out_unchecked += len;
    c->budget.held = strbuf_live(&c->out);
    return 0;
}

/* The peer's app, from the credentials the kernel recorded at connect()
 * (a client cannot forge them). Without them the connection is `default`. */
static void conn_identify(struct conn *c)
{
    const struct config_app *a = peer_app(c->srv->cfg, &c->peer);

    snprintf(c->peer_app, sizeof(c->peer_app), "%s", a ? a->name : CONFIG_DEFAULT_APP);
    memcpy(c->app, c->peer_app, sizeof(c->app));
    log_at(LOG_DEBUG, "connection accepted", "conn", LOG_U, (unsigned long long)c->id, "app", LOG_S,
           c->app, "uid", LOG_I, c->peer.known ? (long long)c->peer.uid : -1LL, "pid", LOG_I,
           c->peer.known ? (long long)c->peer.pid : -1LL, NULL);
}

const struct config_app *conn_app(const struct conn *c)
{
    const struct config_app *a = config_find_app(c->srv->cfg, c->app);
    return a ? a : config_find_app(c->srv->cfg, CONFIG_DEFAULT_APP);
}

const struct config_app *conn_declare_app(const struct conn *c, const char *name, size_t len,
                                          char *why, size_t whylen)
{
    return peer_declare_app(c->srv->cfg, c->peer_app, name, len, why, whylen);
}

/* A new connection's state. */
static struct conn *conn_alloc(struct server *srv, int fd)
{
    static uint64_t next_id = 1;
    struct conn *c = calloc(1, sizeof(*c));

    if (!c)
        return NULL;
    if (frame_reader_init(&c->reader, srv->cfg->max_message_bytes, 0) < 0) {
        free(c);
        return NULL;
    }
    c->srv = srv;
    c->id = next_id++;
    c->fd = fd;
    msgpack_unpacked_init(&c->frame);
    msgpack_packer_init(&c->pk, c, conn_append);
    upstream_budget_init(&c->budget, srv->cfg->max_write_queue_bytes);
    methods_conn_init(c);
    snprintf(c->peer_app, sizeof(c->peer_app), "%s", CONFIG_DEFAULT_APP); /* until identified */
    memcpy(c->app, c->peer_app, sizeof(c->app));
    c->sink.conn_id = c->id;
    peer_read(fd, &c->peer);
    peer_ids(&c->peer, &c->sink.peer_pid, &c->sink.peer_uid);
    return c;
}

struct conn *conn_new(struct server *srv, int fd)
{
    struct conn *c = conn_alloc(srv, fd);

    if (!c)
        return NULL;
    ev_io_init(&c->rio, conn_on_read, fd, EV_READ);
    ev_io_init(&c->wio, conn_on_write, fd, EV_WRITE);
    ev_init(&c->linger_w, conn_on_linger);
    ev_init(&c->idle_w, conn_on_idle);
    c->rio.data = c->wio.data = c->linger_w.data = c->idle_w.data = c;
    c->last_activity = ev_now(srv->loop);
    conn_identify(c);
    ev_io_start(srv->loop, &c->rio);
    c->reading = true;
    if (srv->cfg->idle_timeout_s > 0) {
        ev_timer_set(&c->idle_w, srv->cfg->idle_timeout_s, 0.);
        ev_timer_start(srv->loop, &c->idle_w);
    }
    return c;
}

void conn_free(struct conn *c)
{
    msgpack_unpacked_destroy(&c->frame);
    frame_reader_fini(&c->reader);
    strbuf_fini(&c->out);
    free(c);
}

void conn_close(struct conn *c, const char *why)
{
    struct ev_loop *loop = c->srv->loop;

    if (c->closed)
        return;
    c->closed = true;
    ev_io_stop(loop, &c->rio);
    ev_io_stop(loop, &c->wio);
    ev_timer_stop(loop, &c->linger_w);
    ev_timer_stop(loop, &c->idle_w);
    c->srv->input_bytes -= c->input_bytes;
    c->input_bytes = 0;
    /* The client is gone: nothing it asked for may keep running. */
    call_abort_all(&c->sink);
    tasks_fail_pending(&c->tasks, PGW_OK, NULL);
    cacheops_fail_pending(&c->tasks, PGW_OK, NULL);
    close(c->fd);
    c->fd = -1;
    log_at(LOG_DEBUG, "connection closed", "conn", LOG_U, (unsigned long long)c->id, "reason",
           LOG_S, why, NULL);
    server_on_conn_closed(c->srv, c);
}

static void conn_stop_reading(struct conn *c)
{
    if (c->reading) {
        ev_io_stop(c->srv->loop, &c->rio);
        c->reading = false;
    }
}

void conn_close_after_flush(struct conn *c)
{
    if (c->closed)
        return;
    c->closing = true;
    conn_stop_reading(c);
    if (strbuf_live(&c->out) == 0) {
        conn_close(c, "flushed");
        return;
    }
    if (!ev_is_active(&c->linger_w)) {
        ev_timer_set(&c->linger_w, CONN_LINGER_S, 0.);
        ev_timer_start(c->srv->loop, &c->linger_w);
    }
    conn_flush(c);
}

static void conn_on_linger(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    conn_close(w->data, "linger timeout");
}

/* Lazy: activity only moves the idle deadline later, so the timer checks
 * again when it fires. A connection with a request in flight is never
 * idle; its answer restarts the clock. */
static void conn_on_idle(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct conn *c = w->data;
    double idle_s = c->srv->cfg->idle_timeout_s;
    double left = c->last_activity + idle_s - ev_now(loop);
    (void)revents;

    if (c->in_flight > 0 || c->sink.n_calls > 0 || c->tasks.waiting)
        left = idle_s;
    if (left > 0) {
        ev_timer_set(w, left, 0.);
        ev_timer_start(loop, w);
        return;
    }
    c->srv->stats.conns_idle_closed++;
    conn_close(c, "idle timeout");
}

/* Read back-pressure: pause above the budget, resume below half of it.
 * Streams paused by their call (call.c) follow the unsent output alone. */
static void conn_apply_backpressure(struct conn *c)
{
    size_t queued = strbuf_live(&c->out);
    size_t pending = queued + c->budget.received;
    size_t limit = c->srv->cfg->max_write_queue_bytes;

    if (c->closing || c->closed)
        return;
    if (c->reading && pending > limit) {
        conn_stop_reading(c);
        c->read_paused = true;
        c->srv->stats.read_pauses++;
        log_at(LOG_DEBUG, "connection read paused", "conn", LOG_U, (unsigned long long)c->id,
               "queued_bytes", LOG_U, (unsigned long long)queued, "receiving_bytes", LOG_U,
               (unsigned long long)c->budget.received, NULL);
    } else if (pending <= limit / 2 && c->read_paused) {
        c->read_paused = false;
        c->reading = true;
        ev_io_start(c->srv->loop, &c->rio);
    }
    if (queued <= limit / 2 && c->sink.paused_calls)
        call_on_drained(&c->sink);
}

#ifdef PGW_CHECK_PACKING
/* Parses back what was queued since the last flush and aborts on a
 * malformed message (a miscounted map, say), so the sanitizer build fails
 * the test that packed it, instead of desynchronising a client. Debug builds
 * only (the sanitizer build), like an assert. */
static void conn_check_packing(struct conn *c)
{
    char why[128];
    size_t n = c->out_unchecked;

    c->out_unchecked = 0;
    if (c->oom || n == 0 || n > strbuf_live(&c->out))
        return;
    if (rpc_check_messages(c->out.data + c->out.len - n, n, why, sizeof(why)) < 0) {
        fprintf(stderr, "polygw: conn %llu packed a malformed message: %s\n",
                (unsigned long long)c->id, why);
        abort();
    }
}
#else
static void conn_check_packing(struct conn *c)
{
    c->out_unchecked = 0;
}
#endif

void conn_flush(struct conn *c)
{
    if (c->closed)
        return;
    conn_check_packing(c);
    if (c->oom) {
        conn_close(c, "out of memory queueing a reply");
        return;
    }
    while (strbuf_live(&c->out) > 0) {
        ssize_t n = send(c->fd, strbuf_head(&c->out), strbuf_live(&c->out), MSG_NOSIGNAL);
        if (n > 0) {
            strbuf_consume(&c->out, (size_t)n);
            c->srv->stats.bytes_out += (uint64_t)n;
            c->last_activity = ev_now(c->srv->loop);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        conn_close(c, "write failed");
        return;
    }
    if (strbuf_live(&c->out) == 0) {
        if (c->out.cap > CONN_KEEP_BUFFER_BYTES)
            strbuf_fini(&c->out);
        ev_io_stop(c->srv->loop, &c->wio);
        if (c->closing) {
            conn_close(c, "flushed");
            return;
        }
    } else if (!ev_is_active(&c->wio)) {
        ev_io_start(c->srv->loop, &c->wio);
    }
    c->budget.held = strbuf_live(&c->out);
    upstream_budget_on_drained(&c->budget);
    conn_apply_backpressure(c);
}

static void conn_on_write(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    conn_flush(w->data);
}

void conn_response_done(struct conn *c, enum pgw_code code)
{
    struct server *srv = c->srv;

    c->last_activity = ev_now(srv->loop);
    srv->stats.requests_served++;
    if (code != PGW_OK)
        srv->stats.rejected[code]++;
}

void conn_reply_error(struct conn *c, uint32_t msgid, enum pgw_code code, const char *message)
{
    rpc_pack_error(&c->pk, msgid, code, message);
    conn_response_done(c, code);
}

void conn_reply_error_of(struct conn *c, uint32_t msgid, const struct reply_error *e)
{
    struct writer w;

    msgpack_pack_array(&c->pk, 4);
    msgpack_pack_uint8(&c->pk, RPC_RESPONSE);
    msgpack_pack_uint32(&c->pk, msgid);
    writer_init_msgpack(&w, &c->pk);
    reply_error_write(&w, e);
    rpc_pack_error_end(&c->pk);
    conn_response_done(c, e->code);
}

void conn_fail(struct conn *c, enum pgw_code code, const char *message)
{
    c->srv->stats.rejected[code]++;
    log_at(LOG_INFO, "closing connection after protocol error", "conn", LOG_U,
           (unsigned long long)c->id, "code", LOG_S, pgw_code_name(code), "reason", LOG_S, message,
           NULL);
    rpc_pack_fatal(&c->pk, code, message);
    conn_close_after_flush(c);
}

/* Handles one decoded frame. */
static void conn_on_frame(struct conn *c, const msgpack_object *o)
{
    struct rpc_msg m;
    const char *why;
    char buf[160];

    if (rpc_parse(o, &m, &why) < 0) {
        snprintf(buf, sizeof(buf), "not a msgpack-RPC message: %s", why);
        conn_fail(c, PGW_BAD_REQUEST, buf);
        return;
    }
    switch (m.type) {
    case RPC_RESPONSE:
        conn_fail(c, PGW_BAD_REQUEST, "unexpected response message: the sidecar sends no requests");
        return;
    case RPC_NOTIFY:
        methods_notify(c, &m);
        return;
    case RPC_REQUEST:
        break;
    }
    if (c->srv->state != SERVER_RUNNING) {
        conn_reply_error(c, m.msgid, PGW_SHUTTING_DOWN, "the sidecar is shutting down");
        return;
    }
    if (call_is_in_flight(&c->sink, m.msgid) || tasks_is_pending(&c->tasks, m.msgid) ||
        cacheops_is_pending(&c->tasks, m.msgid)) {
        /* Two responses with one msgid could not be told apart by any
         * client: the stream of this connection can no longer be trusted. */
        snprintf(buf, sizeof(buf), "msgid %u is already in flight on this connection", m.msgid);
        conn_fail(c, PGW_BAD_REQUEST, buf);
        return;
    }
    if (c->in_flight + c->sink.n_calls >= c->srv->cfg->max_inflight_per_connection) {
        snprintf(buf, sizeof(buf), "too many requests in flight on this connection (limit %u)",
                 c->srv->cfg->max_inflight_per_connection);
        conn_reply_error(c, m.msgid, PGW_OVERLOADED, buf);
        return;
    }
    methods_dispatch(c, &m);
}

static struct conn *conn_input_holder(struct server *srv)
{
    struct conn *v = NULL;
    for (struct conn *o = srv->conns; o; o = o->next) {
        if (!o->closing && (!v || o->input_bytes > v->input_bytes))
            v = o;
    }
    return v;
}

size_t conn_input_most(void *ud)
{
    struct conn *v = conn_input_holder(ud);
    return v ? v->input_bytes : 0;
}

void conn_refuse_input_most(void *ud, size_t total, size_t cap)
{
    struct server *srv = ud;
    struct conn *v = conn_input_holder(srv);
    if (!v)
        return;
    char msg[200];
    snprintf(msg, sizeof(msg),
             "the sidecar holds %zu bytes of unfinished messages (max_buffered_input_bytes "
             "%zu); this connection held the most, %zu: retry later",
             total, cap, v->input_bytes);
    srv->input_bytes -= v->input_bytes;
    v->input_bytes = 0;
    conn_fail(v, PGW_OVERLOADED, msg);
}

/* Counts c's partial frame in the server's total (net/input.h). */
static void conn_account_input(struct conn *c)
{
    struct server *srv = c->srv;
    size_t held = c->closing || c->closed ? 0 : frame_reader_pending(&c->reader);

    srv->input_bytes = srv->input_bytes - c->input_bytes + held;
    c->input_bytes = held;
    net_enforce_input(srv);
}

static void conn_on_read(struct ev_loop *loop, ev_io *w, int revents)
{
    struct conn *c = w->data;
    char *buf;
    size_t cap;
    ssize_t n;
    int rc = 0;

    (void)loop;
    (void)revents;
    if (frame_reader_reserve(&c->reader, CONN_READ_CHUNK, &buf, &cap) < 0) {
        conn_close(c, "out of memory reading");
        return;
    }
    if (cap > CONN_READ_CHUNK)
        cap = CONN_READ_CHUNK;
    n = recv(c->fd, buf, cap, 0);
    if (n == 0) {
        conn_close(c, "peer closed");
        return;
    }
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            conn_close(c, "read failed");
        return;
    }
    frame_reader_commit(&c->reader, (size_t)n);
    c->srv->stats.bytes_in += (uint64_t)n;
    c->last_activity = ev_now(loop);

    while (!c->closing && !c->closed && (rc = frame_reader_next(&c->reader, &c->frame, NULL)) == 1)
        conn_on_frame(c, &c->frame.data);
    if (!c->closing && !c->closed && rc < 0) {
        char msg[160];
        if (rc == FRAME_ETOO_LARGE)
            snprintf(msg, sizeof(msg), "message exceeds max_message_bytes (%zu)",
                     c->srv->cfg->max_message_bytes);
        else if (rc == FRAME_ETOO_DEEP)
            snprintf(msg, sizeof(msg), "message nests more than %d containers", FRAME_MAX_DEPTH);
        else
            snprintf(msg, sizeof(msg), "%s", frame_strerror(rc));
        conn_fail(c,
                  rc == FRAME_ETOO_LARGE   ? PGW_TOO_LARGE
                      : rc == FRAME_ENOMEM ? PGW_INTERNAL
                                           : PGW_BAD_REQUEST,
                  msg);
    }
    /* Drop the last frame's zone now rather than holding it until the next read. */
    msgpack_unpacked_destroy(&c->frame);
    msgpack_unpacked_init(&c->frame);
    conn_account_input(c);
    if (!c->closed && frame_reader_trim(&c->reader, CONN_KEEP_BUFFER_BYTES) < 0) {
        conn_close(c, "out of memory reading");
        return;
    }
    conn_flush(c);
}
