/*
 * h1.c — the plain-text HTTP/1.1 client (see h1.h for what it covers).
 *
 * A connection is in one of three states: connecting (write-watched until
 * connect(2) completes), carrying a request (write-watched while the
 * request does not fit the socket, then read-watched), or idle in its
 * origin's pool (read-watched: readable there means closed or garbage, and
 * the connection is dropped at once). A request's answer is read into the
 * pool's one buffer and parsed there; only when the owner pauses (its client
 * reads slower than the upstream writes) are the unparsed bytes, and the
 * body buffer it refused, copied out and kept by the request.
 *
 * Over TLS a new connection has a fourth state between connecting and
 * carrying: handshaking (watched for what SSL_connect last wanted). Then
 * every send and receive goes through conn_send_tls / conn_recv, which map
 * OpenSSL's WANT_READ / WANT_WRITE onto the same watcher; OpenSSL reads
 * ahead, so bytes it holds decrypted or undecrypted (SSL_has_pending), and
 * a renegotiation it put off while holding some, are read before waiting
 * on the socket again (conn_has_pending).
 */
#include "h1.h"
#include "dlist.h"
#include "core/tls.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* A reply head and a typical reply fit in one read. */
#define H1_READ_BYTES  16384
/* Reads per readiness event: a large body is not allowed to hold the loop. */
#define H1_READS_MAX   4
/* An idle connection older than this is closed rather than reused: the
 * server's keep-alive timeout is unknown; libcurl's default is 118 s. */
#define H1_IDLE_MAX_S  118.0
#define H1_KEEPALIVE_S 60

struct h1_origin {
    struct h1_origin *next;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    struct h1_conn *idle; /* doubly linked, most recently used first */
    SSL_CTX *tls;         /* borrowed; NULL: plain text */
    char *tls_name;       /* SNI and the name verified (owned) */
    SSL_SESSION *session; /* the last session its server handed out, or NULL */
    char label[128];
};

struct h1_conn {
    ev_io io; /* first: the watcher is the connection */
    struct h1_pool *pool;
    struct h1_origin *origin;
    struct h1_conn *prev, *next; /* origin->idle while idle */
    struct h1_req *req;          /* NULL while idle */
    bool connecting;
    SSL *ssl;           /* NULL: plain text */
    bool handshaking;   /* SSL_connect not done yet */
    bool tls_ok;        /* handshake done and no TLS error since: close_notify is sent */
    int write_wants;    /* over TLS, the events a blocked SSL_write waits for */
    int read_wants;     /* over TLS, the events a blocked SSL_read waits for */
    char tls_error[96]; /* why the last read failed with a TLS error (an alert), or "" */
    double idle_since;
    unsigned int idle_iter; /* ev_iteration() when it was pooled */
};

struct h1_pool {
    struct ev_loop *loop;
    int *busy;
    struct h1_origin *origins;
    uint32_t n_idle, max_idle;
    double swept_at; /* when idle connections were last checked for age */
    struct h1_stats stats;
    char rbuf[H1_READ_BYTES];
    char wbuf[H1_READ_BYTES]; /* over TLS, the request gathered into one record */
};

static void h1_on_io(struct ev_loop *loop, ev_io *w, int revents);
static void req_send(struct h1_req *r);
static void req_read(struct h1_req *r);
static void req_connected(struct h1_req *r);

struct h1_pool *h1_pool_new(struct ev_loop *loop, int *busy, uint32_t max_idle)
{
    struct h1_pool *p = calloc(1, sizeof(*p));

    if (!p)
        return NULL;
    p->loop = loop;
    p->busy = busy;
    p->max_idle = max_idle;
    return p;
}

const struct h1_stats *h1_pool_stats(const struct h1_pool *p)
{
    return &p->stats;
}

static void conn_close(struct h1_conn *c)
{
    struct h1_pool *p = c->pool;

    ev_io_stop(p->loop, &c->io);
    ev_clear_pending(p->loop, &c->io);
    if (!c->req) {
        DLIST_UNLINK(c->origin->idle, c, prev, next);
        p->n_idle--;
    } else {
        c->req->conn = NULL;
    }
    if (c->ssl) {
        /* One close_notify, written if the socket takes it; nothing waits
         * for the server's. */
        if (c->tls_ok)
            SSL_shutdown(c->ssl);
        SSL_free(c->ssl);
        ERR_clear_error();
    }
    close(c->io.fd);
    free(c);
}

void h1_pool_free(struct h1_pool *p)
{
    if (!p)
        return;
    while (p->origins) {
        struct h1_origin *o = p->origins;
        p->origins = o->next;
        while (o->idle)
            conn_close(o->idle);
        SSL_SESSION_free(o->session);
        free(o->tls_name);
        free(o);
    }
    free(p);
}

struct h1_origin *h1_origin_get_tls(struct h1_pool *p, const struct sockaddr *sa, socklen_t len,
                                    const char *label, SSL_CTX *ctx, const char *name)
{
    struct h1_origin *o;

    if (ctx && !name)
        return NULL;
    for (o = p->origins; o; o = o->next) {
        if (o->addrlen == len && memcmp(&o->addr, sa, len) == 0 && o->tls == ctx &&
            (!ctx || strcmp(o->tls_name, name) == 0))
            return o;
    }
    if (len > sizeof(o->addr) || !(o = calloc(1, sizeof(*o))))
        return NULL;
    if (ctx && !(o->tls_name = strdup(name))) {
        free(o);
        return NULL;
    }
    memcpy(&o->addr, sa, len);
    o->addrlen = len;
    o->tls = ctx;
    snprintf(o->label, sizeof(o->label), "%s", label);
    o->next = p->origins;
    p->origins = o;
    return o;
}

struct h1_origin *h1_origin_get(struct h1_pool *p, const struct sockaddr *sa, socklen_t len,
                                const char *label)
{
    return h1_origin_get_tls(p, sa, len, label, NULL, NULL);
}

/* A new session from the server (TLS 1.3 sends its tickets after the
 * handshake, read with the answer): kept for the origin's next connection. */
static int tls_on_new_session(SSL *ssl, SSL_SESSION *sess)
{
    struct h1_conn *c = SSL_get_app_data(ssl);

    if (!c)
        return 0;
    SSL_SESSION_free(c->origin->session);
    c->origin->session = sess;
    return 1; /* ours now */
}

int h1_tls_ctx_setup(SSL_CTX *ctx)
{
    static const unsigned char alpn[] = "\x08http/1.1";

    if (SSL_CTX_set_alpn_protos(ctx, alpn, sizeof(alpn) - 1) != 0)
        return -1;
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(ctx, tls_on_new_session);
    SSL_CTX_set_read_ahead(ctx, 1);
    return 0;
}

/* --- ending ---------------------------------------------------------- */

static void req_release(struct h1_req *r)
{
    free(r->held);
    free(r->rest);
    r->held = r->rest = NULL;
    r->held_len = r->rest_len = 0;
    ev_timer_stop(r->pool->loop, &r->end_w);
    r->ended = true;
}

/* Watches `c` for `events` only. The fd stays the same, so libev is not
 * told it may have changed (ev_io_set would): an unchanged watch costs no
 * epoll_ctl. */
static void conn_watch(struct h1_conn *c, int events)
{
    struct ev_loop *loop = c->pool->loop;

    if (ev_is_active(&c->io) && (c->io.events & (EV_READ | EV_WRITE)) == events)
        return;
    ev_io_stop(loop, &c->io);
    ev_io_modify(&c->io, events);
    ev_io_start(loop, &c->io);
}

/* Closes the idle connections past H1_IDLE_MAX_S, of every origin: reuse
 * takes the most recent, so after a burst the others would otherwise sit
 * open until the server closes them. At most once a second. */
static void pool_sweep(struct h1_pool *p, double now)
{
    if (now - p->swept_at < 1.0)
        return;
    p->swept_at = now;
    for (struct h1_origin *o = p->origins; o; o = o->next) {
        for (struct h1_conn *c = o->idle, *next; c; c = next) {
            next = c->next;
            if (now - c->idle_since > H1_IDLE_MAX_S)
                conn_close(c);
        }
    }
}

/* Gives the connection back to its origin's pool, or closes it. */
static void conn_done(struct h1_req *r, bool keep)
{
    struct h1_conn *c = r->conn;
    struct h1_pool *p = r->pool;

    if (!c)
        return;
    if (!keep || p->n_idle >= p->max_idle) {
        conn_close(c);
        return;
    }
    r->conn = NULL;
    c->req = NULL;
    c->idle_since = ev_now(p->loop);
    c->idle_iter = ev_iteration(p->loop);
    DLIST_PUSH(c->origin->idle, c, prev, next);
    p->n_idle++;
    conn_watch(c, EV_READ);
    pool_sweep(p, c->idle_since);
}

/* The last thing done with `r`: on_end may free it. */
static void req_finish(struct h1_req *r, enum h1_end end, const char *detail)
{
    conn_done(r, false);
    req_release(r);
    r->hooks->on_end(r->ud, end, detail);
}

static void req_on_end_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct h1_req *r = w->data;
    (void)loop;
    (void)revents;
    req_finish(r, r->end_code, r->detail);
}

/* Ends `r`: at once, or from the loop when h1_req_start is still running
 * (its caller must get the request back before any hook says it ended). */
static void req_end(struct h1_req *r, enum h1_end end, const char *detail)
{
    if (!r->starting) {
        req_finish(r, end, detail);
        return;
    }
    conn_done(r, false);
    r->end_code = end;
    if (detail != r->detail)
        snprintf(r->detail, sizeof(r->detail), "%s", detail ? detail : "");
    ev_timer_set(&r->end_w, 0., 0.);
    ev_timer_start(r->pool->loop, &r->end_w);
}

static void req_end_errno(struct h1_req *r, enum h1_end end, const char *what, int err)
{
    char detail[H1_DETAIL_MAX];
    snprintf(detail, sizeof(detail), "%s %s: %s", what, r->origin->label, strerror(err));
    req_end(r, end, detail);
}

void h1_req_stop(struct h1_req *r)
{
    if (!r->active || r->ended)
        return;
    if (r->conn)
        conn_close(r->conn);
    req_release(r);
}

/* --- connecting and sending ----------------------------------------- */


/* A new connection for `r`; false when it failed at once (and ended). */
static bool req_connect(struct h1_req *r)
{
    struct h1_origin *o = r->origin;
    struct h1_pool *p = r->pool;
    int one = 1, idle = H1_KEEPALIVE_S;
    int fd = socket(o->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    if (fd < 0) {
        req_end_errno(r, H1_CONNECT_FAILED, "Failed to connect to", errno);
        return false;
    }
    struct h1_conn *c = calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        req_end_errno(r, H1_CONNECT_FAILED, "Failed to connect to", ENOMEM);
        return false;
    }
    /* As libcurl sets them: no Nagle delay on the request, keep-alive
     * probes on long silent answers. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &idle, sizeof(idle));
    c->pool = p;
    c->origin = o;
    c->req = r;
    ev_io_init(&c->io, h1_on_io, fd, 0);
    r->conn = c;
    r->reused = false;
    p->stats.connections_opened++;
    r->hooks->on_connecting(r->ud);
    if (connect(fd, (const struct sockaddr *)&o->addr, o->addrlen) == 0) {
        req_connected(r);
        return true;
    }
    if (errno == EINPROGRESS) {
        c->connecting = true;
        conn_watch(c, EV_WRITE);
        return true;
    }
    int err = errno;
    conn_close(c);
    req_end_errno(r, H1_CONNECT_FAILED, "Failed to connect to", err);
    return false;
}

/* One step of the TLS handshake on `r`'s new connection (set up on the
 * first): on to the request when it is done, else waits for what OpenSSL
 * wants, or ends the request with H1_TLS. */
static void req_handshake(struct h1_req *r)
{
    struct h1_conn *c = r->conn;
    struct h1_origin *o = r->origin;
    struct h1_pool *p = r->pool;
    char why[H1_DETAIL_MAX], detail[H1_DETAIL_MAX + 160];

    ERR_clear_error();
    if (!c->ssl) {
        if (!(c->ssl = SSL_new(o->tls)) || SSL_set_fd(c->ssl, c->io.fd) != 1 ||
            tls_set_peer(c->ssl, o->tls_name) < 0 ||
            (o->session && SSL_set_session(c->ssl, o->session) != 1)) {
            ERR_clear_error();
            req_end(r, H1_TLS, "cannot set up TLS (out of memory)");
            return;
        }
        SSL_set_app_data(c->ssl, c);
        SSL_set_options(c->ssl, SSL_OP_IGNORE_UNEXPECTED_EOF);
        SSL_set_mode(c->ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
        SSL_set_connect_state(c->ssl);
        c->handshaking = true;
    }
    errno = 0;
    int rc = SSL_connect(c->ssl);
    if (rc == 1) {
        c->handshaking = false;
        c->tls_ok = true;
        p->stats.tls_handshakes++;
        if (SSL_session_reused(c->ssl))
            p->stats.tls_resumed++;
        req_send(r);
        return;
    }
    int e = SSL_get_error(c->ssl, rc);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        conn_watch(c, e == SSL_ERROR_WANT_READ ? EV_READ : EV_WRITE);
        return;
    }
    tls_handshake_error(c->ssl, e, why, sizeof(why));
    snprintf(detail, sizeof(detail), "TLS handshake with %s: %s", o->label, why);
    req_end(r, H1_TLS, detail);
}

/* The TCP connection is made: on to TLS, or to the request. */
static void req_connected(struct h1_req *r)
{
    if (r->origin->tls)
        req_handshake(r);
    else
        req_send(r);
}

/* The request died on a connection that had served others before, with no
 * byte of an answer: the server closed it as it was taken from the pool.
 * Sent once more on a new connection; true if so. */
static bool req_retry_fresh(struct h1_req *r)
{
    if (!r->reused || r->retried || r->got_bytes ||
        (r->sent_at > 0 && ev_now(r->pool->loop) - r->sent_at > H1_STALE_RETRY_S))
        return false;
    r->retried = true;
    r->pool->stats.stale_retries++;
    if (r->conn)
        conn_close(r->conn);
    r->iov_at = 0;
    r->iov_off = 0;
    r->send_errno = 0;
    r->sent_at = 0;
    http_parser_init(&r->parser, HTTP_RESPONSE);
    r->parser.data = r;
    req_connect(r);
    return true;
}

/* Nothing more of the request is written: the server answered early (or
 * closed) and will not read the rest; what it said is read. After a failed
 * send `err` is its errno (for the detail, should no answer come; a reused
 * connection's request may then be sent again, see above). */
static void req_stop_sending(struct h1_req *r, int err)
{
    r->send_errno = err;
    r->iov_at = r->iovcnt;
    r->iov_off = 0;
    conn_watch(r->conn, EV_READ);
    if (!r->starting) /* no answer hook from inside h1_req_start: the loop reads */
        req_read(r);
}

/* Over TLS: the rest of the request, up to one record, gathered into the
 * pool's buffer and written; returns as sendmsg does. A blocked write says
 * what it waits for in write_wants, and is gathered again the same way
 * (same bytes, same length) when retried, as OpenSSL requires. */
static ssize_t conn_send_tls(struct h1_req *r)
{
    struct h1_conn *c = r->conn;
    char *w = r->pool->wbuf;
    size_t n = 0, off = r->iov_off;

    for (int i = r->iov_at; i < r->iovcnt && n < sizeof(r->pool->wbuf); i++, off = 0) {
        size_t k = r->iov[i].iov_len - off;
        if (k > sizeof(r->pool->wbuf) - n)
            k = sizeof(r->pool->wbuf) - n;
        memcpy(w + n, (const char *)r->iov[i].iov_base + off, k);
        n += k;
    }
    if (n == 0)
        return 0;
    ERR_clear_error();
    errno = 0;
    int rc = SSL_write(c->ssl, w, (int)n);
    if (rc > 0)
        return rc;
    int e = SSL_get_error(c->ssl, rc);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        c->write_wants = e == SSL_ERROR_WANT_READ ? EV_READ : EV_WRITE;
        errno = EAGAIN;
        return -1;
    }
    int err = errno ? errno : EPIPE;
    c->tls_ok = false;
    ERR_clear_error();
    errno = err;
    return -1;
}

/* Reads what the connection has: > 0 bytes, 0 when the server closed, -1
 * with errno (EAGAIN: nothing yet; over TLS, read_wants says for what; a
 * TLS error is EPROTO). */
static ssize_t conn_recv(struct h1_conn *c, char *buf, size_t cap)
{
    if (!c->ssl)
        return recv(c->io.fd, buf, cap, 0);
    ERR_clear_error();
    errno = 0;
    int n = SSL_read(c->ssl, buf, (int)cap);
    if (n > 0)
        return n;
    int e = SSL_get_error(c->ssl, n);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        c->read_wants = e == SSL_ERROR_WANT_READ ? EV_READ : EV_WRITE;
        errno = EAGAIN;
        return -1;
    }
    if (e == SSL_ERROR_ZERO_RETURN) /* close_notify, or a bare close */
        return 0;
    /* errno tells only of SSL_ERROR_SYSCALL. After a TLS error it may hold
     * what the alert OpenSSL then wrote met (EPIPE: the server had closed),
     * which is not why the read failed. */
    int err = e == SSL_ERROR_SYSCALL && errno ? errno : EPROTO;
    if (err == EPROTO) /* the server's alert, say: told rather than "Protocol error" */
        tls_handshake_error(c->ssl, e, c->tls_error, sizeof(c->tls_error));
    c->tls_ok = false;
    ERR_clear_error();
    errno = err;
    return -1;
}

static void req_send(struct h1_req *r)
{
    struct h1_conn *c = r->conn;

    if (!r->sending_told) {
        r->sending_told = true;
        r->hooks->on_sending(r->ud);
    }
    while (r->iov_at < r->iovcnt) {
        struct iovec iov[H1_IOV_MAX];
        int n = 0;
        for (int i = r->iov_at; i < r->iovcnt; i++)
            iov[n++] = r->iov[i];
        iov[0].iov_base = (char *)iov[0].iov_base + r->iov_off;
        iov[0].iov_len -= r->iov_off;
        struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)n };
        ssize_t w = c->ssl ? conn_send_tls(r) : sendmsg(c->io.fd, &mh, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                /* Readable too: a server may answer (413, 401) before it
                 * has read the whole body. */
                conn_watch(c, EV_READ | (c->ssl ? c->write_wants : EV_WRITE));
                return;
            }
            req_stop_sending(r, errno);
            return;
        }
        size_t left = (size_t)w;
        while (r->iov_at < r->iovcnt && left >= r->iov[r->iov_at].iov_len - r->iov_off) {
            left -= r->iov[r->iov_at].iov_len - r->iov_off;
            r->iov_at++;
            r->iov_off = 0;
        }
        r->iov_off += left;
    }
    r->sent_at = ev_now(r->pool->loop);
    conn_watch(c, EV_READ);
}

void h1_req_start(struct h1_req *r, struct h1_pool *p, struct h1_origin *o, const struct iovec *iov,
                  int iovcnt, const struct h1_hooks *hooks, void *ud)
{
    double now = ev_now(p->loop);

    memset(r, 0, offsetof(struct h1_req, line));
    r->pool = p;
    r->origin = o;
    r->hooks = hooks;
    r->ud = ud;
    r->iovcnt = iovcnt < H1_IOV_MAX ? iovcnt : H1_IOV_MAX;
    memcpy(r->iov, iov, sizeof(*iov) * (size_t)r->iovcnt);
    http_parser_init(&r->parser, HTTP_RESPONSE);
    r->parser.data = r;
    ev_init(&r->end_w, req_on_end_timer);
    r->end_w.data = r;
    r->active = true;
    r->starting = true;
    /* Most recently used first: it is the least likely to have been closed
     * by the server's keep-alive timeout, and the rest age out. */
    unsigned int iter = ev_iteration(p->loop);
    for (struct h1_conn *c = o->idle, *next; c; c = next) {
        next = c->next;
        /* Readable while idle (its event may be waiting in this very loop
         * iteration): closed by the server, or bytes nobody asked for, which
         * must never be read as this request's answer. */
        if (now - c->idle_since > H1_IDLE_MAX_S || ev_is_pending(&c->io) ||
            (c->ssl && SSL_has_pending(c->ssl))) {
            conn_close(c);
            continue;
        }
        /* Pooled in this iteration: the poll that would show bytes arriving
         * after its answer has not run yet. Taken from the next one on. */
        if (c->idle_iter == iter)
            continue;
        DLIST_UNLINK(o->idle, c, prev, next);
        p->n_idle--;
        c->req = r;
        r->conn = c;
        r->reused = true;
        p->stats.connections_reused++;
        /* Written at once, no wait for writability on a warm connection; if
         * it died unseen, the send fails and the request goes again on a new
         * one (req_retry_fresh). */
        req_send(r);
        r->starting = false;
        return;
    }
    req_connect(r);
    r->starting = false;
}

/* --- the answer -------------------------------------------------------- */

static int req_tell_status(struct h1_req *r)
{
    char line[32];
    unsigned code = r->parser.status_code;
    int n = 0;

    if (r->status_told)
        return 0;
    r->status_told = true;
    memcpy(line, "HTTP/1.1 ", 9);
    line[7] = (char)('0' + (r->parser.http_minor % 10));
    line[5] = (char)('0' + (r->parser.http_major % 10));
    n = 9;
    line[n++] = (char)('0' + (code / 100) % 10);
    line[n++] = (char)('0' + (code / 10) % 10);
    line[n++] = (char)('0' + code % 10);
    line[n++] = '\r';
    line[n++] = '\n';
    return r->hooks->on_header(r->ud, line, (size_t)n);
}

/* The header line assembled so far, handed to on_header. */
static int req_tell_line(struct h1_req *r)
{
    int rc = 0;

    if (r->line_len > 0) {
        if (r->line_len > sizeof(r->line) - 2)
            r->line_len = sizeof(r->line) - 2;
        r->line[r->line_len++] = '\r';
        r->line[r->line_len++] = '\n';
        /* An answer the engine could only misread: a content coding nobody
         * asked for (no Accept-Encoding is sent). */
        if (r->line_len > 17 && strncasecmp(r->line, "content-encoding:", 17) == 0) {
            const char *v = r->line + 17;
            while (*v == ' ' || *v == '\t')
                v++;
            if (strncasecmp(v, "identity\r", 9) != 0) {
                snprintf(r->detail, sizeof(r->detail),
                         "upstream sent a Content-Encoding that was not asked for");
                rc = -1;
            }
        }
        if (rc == 0)
            rc = r->hooks->on_header(r->ud, r->line, r->line_len);
    }
    r->line_len = 0;
    r->in_value = false;
    return rc;
}

static void line_add(struct h1_req *r, const char *p, size_t n)
{
    size_t room = sizeof(r->line) - 2 - r->line_len; /* CRLF */
    if (n > room)
        n = room;
    memcpy(r->line + r->line_len, p, n);
    r->line_len += n;
}

static int on_status(http_parser *hp, const char *p, size_t n)
{
    (void)p;
    (void)n;
    return req_tell_status(hp->data);
}

static int on_header_field(http_parser *hp, const char *p, size_t n)
{
    struct h1_req *r = hp->data;

    if (req_tell_status(r) != 0)
        return -1;
    if (r->headers_done)
        return 0; /* a chunked body's trailer: not looked at */
    if (r->in_value && req_tell_line(r) != 0)
        return -1;
    line_add(r, p, n);
    return 0;
}

static int on_header_value(http_parser *hp, const char *p, size_t n)
{
    struct h1_req *r = hp->data;

    if (r->headers_done)
        return 0;
    if (!r->in_value) {
        r->in_value = true;
        line_add(r, ": ", 2);
    }
    line_add(r, p, n);
    return 0;
}

/* Whether an answer of status `code` is the head alone, whatever its header
 * fields announce (RFC 9112 §6.3): every 1xx, 204 and 304. */
static bool status_has_no_body(unsigned code)
{
    return code / 100 == 1 || code == 204 || code == 304;
}

static int on_headers_complete(http_parser *hp)
{
    struct h1_req *r = hp->data;

    if (req_tell_status(r) != 0 || req_tell_line(r) != 0)
        return -1;
    r->headers_done = true;
    /* 1: the parser reads no body (the bytes after the head are the next
     * answer's, or garbage), as libcurl does. */
    return status_has_no_body(hp->status_code) ? 1 : 0;
}

static int on_body(http_parser *hp, const char *p, size_t n)
{
    struct h1_req *r = hp->data;

    switch (r->hooks->on_body(r->ud, p, n)) {
    case H1_TAKEN:
        return 0;
    case H1_PAUSE:
        if (!(r->held = malloc(n)))
            return -1;
        memcpy(r->held, p, n);
        r->held_len = n;
        r->paused = true;
        http_parser_pause(hp, 1);
        return 0;
    case H1_ABORT:
    default:
        return -1;
    }
}

static int on_message_complete(http_parser *hp)
{
    struct h1_req *r = hp->data;

    /* 100 Continue, 103 Early Hints: the final answer follows. Not 101:
     * nothing asked to switch protocols, so it ends the request as its
     * status (the engine refuses it, as with libcurl). */
    if (hp->status_code / 100 == 1 && hp->status_code != 101) {
        r->status_told = false;
        r->headers_done = false;
        return 0;
    }
    r->msg_done = true;
    http_parser_pause(hp, 1);
    return 0;
}

static const http_parser_settings h1_settings = {
    .on_status = on_status,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* Parses `n` bytes of the answer (0 = the server closed); true while the
 * request goes on (not ended, not paused). */
static bool req_parse(struct h1_req *r, const char *p, size_t n)
{
    size_t done;

    (*r->pool->busy)++;
    done = http_parser_execute(&r->parser, &h1_settings, p, n);
    (*r->pool->busy)--;
    enum http_errno e = HTTP_PARSER_ERRNO(&r->parser);
    if (r->msg_done) {
        /* Reused only when the request was written whole (after an early
         * answer the server would take the next request for the rest of
         * this one's body), nothing follows the answer and both sides keep
         * the connection open; never after a 101, whose server now speaks
         * another protocol on it. */
        bool keep = r->sent_at > 0 && n > 0 && done == n && http_should_keep_alive(&r->parser) &&
            r->parser.status_code != 101 &&
            !(r->conn && r->conn->ssl && SSL_has_pending(r->conn->ssl));
        conn_done(r, keep);
        req_end(r, H1_OK, NULL);
        return false;
    }
    if (e == HPE_PAUSED) {
        size_t left = n - done;
        if (left > 0) {
            char *rest = malloc(left);
            if (!rest) {
                req_end(r, H1_ABORTED, "out of memory keeping a paused answer");
                return false;
            }
            memcpy(rest, p + done, left);
            free(r->rest);
            r->rest = rest;
            r->rest_len = left;
        }
        if (r->conn)
            ev_io_stop(r->pool->loop, &r->conn->io);
        return false;
    }
    if (e == HPE_CB_body || e == HPE_CB_header_field || e == HPE_CB_headers_complete ||
        e == HPE_CB_status) {
        req_end(r, r->detail[0] ? H1_MALFORMED : H1_ABORTED,
                r->detail[0] ? r->detail : "the answer was refused");
        return false;
    }
    if (e != HPE_OK) {
        char detail[H1_DETAIL_MAX];
        if (n == 0 && e == HPE_INVALID_EOF_STATE && r->headers_done) {
            req_end(r, H1_TRUNCATED, "transfer closed with outstanding read data remaining");
            return false;
        }
        if (n == 0 && e == HPE_INVALID_EOF_STATE) {
            req_end(r, H1_CONNECTION_LOST, "connection closed in the middle of the answer's head");
            return false;
        }
        snprintf(detail, sizeof(detail), "malformed HTTP answer from %s: %s", r->origin->label,
                 http_errno_description(e));
        req_end(r, H1_MALFORMED, detail);
        return false;
    }
    return true; /* a 101 (the only answer with `upgrade`) ended above */
}

static void req_on_eof(struct h1_req *r, int err)
{
    char detail[H1_DETAIL_MAX + 256]; /* req_end keeps what fits */
    const char *tls_error = err == EPROTO && r->conn ? r->conn->tls_error : "";

    if (!r->got_bytes) {
        if (req_retry_fresh(r))
            return;
        if (tls_error[0])
            /* A server that refuses the session after the handshake (TLS
             * 1.3's "certificate required" for a missing client
             * certificate) says why in its alert, as libcurl tells it. */
            snprintf(detail, sizeof(detail), "TLS error from %s: %s", r->origin->label, tls_error);
        else if (r->send_errno)
            snprintf(detail, sizeof(detail), "Send failure: %s", strerror(r->send_errno));
        else if (err)
            snprintf(detail, sizeof(detail), "Recv failure: %s", strerror(err));
        else
            snprintf(detail, sizeof(detail), "Empty reply from server");
        req_end(r, H1_CONNECTION_LOST, detail);
        return;
    }
    if (err) {
        if (tls_error[0])
            snprintf(detail, sizeof(detail), "TLS error from %s: %s", r->origin->label, tls_error);
        else
            snprintf(detail, sizeof(detail), "Recv failure: %s", strerror(err));
        req_end(r, r->headers_done ? H1_TRUNCATED : H1_CONNECTION_LOST, detail);
        return;
    }
    /* The parser ends a close-delimited answer here, or reports a cut one;
     * in the state an interim answer (100 Continue) leaves it in, it does
     * neither, and the closed socket would be read again and again. */
    if (req_parse(r, NULL, 0))
        req_end(r, H1_CONNECTION_LOST,
                "connection closed after an interim answer, before the final one");
}

/* Whether OpenSSL has work on `c` that no readiness event will announce:
 * bytes it already read from the socket, or a renegotiation the server
 * asked for (a TLS 1.2 HelloRequest). OpenSSL starts that one only from
 * an SSL_read or SSL_write, and not one that finds read-ahead bytes left:
 * read after the HelloRequest was, it waits for the next call, and the
 * server, waiting for it, sends nothing that would make one. */
static bool conn_has_pending(const struct h1_conn *c)
{
    return c->ssl && (SSL_has_pending(c->ssl) || SSL_renegotiate_pending(c->ssl));
}

static void req_read(struct h1_req *r)
{
    struct h1_pool *p = r->pool;

    /* Past H1_READS_MAX only to empty what OpenSSL already holds (at most
     * its read-ahead buffer) or to start a renegotiation: nothing would
     * wake the request for them. A read that only waits (WANT_READ) ends
     * the loop. */
    for (int i = 0; i < H1_READS_MAX || conn_has_pending(r->conn); i++) {
        struct h1_conn *c = r->conn;
        ssize_t n = conn_recv(c, p->rbuf, sizeof(p->rbuf));
        if (n > 0) {
            r->got_bytes = true;
            if (!req_parse(r, p->rbuf, (size_t)n))
                return;
            /* A short read emptied the socket; over TLS, what OpenSSL has
             * not read yet is still announced by the socket. */
            if (c->ssl ? !conn_has_pending(c) : (size_t)n < sizeof(p->rbuf))
                return;
            continue;
        }
        if (n == 0) {
            req_on_eof(r, 0);
            return;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            req_on_eof(r, errno);
        else if (c->ssl)
            conn_watch(c, c->read_wants);
        return;
    }
}

/* Over TLS, readable while the request is still being written: an early
 * answer (the server will not read the rest), a close, or only TLS's own
 * records (session tickets), after which writing goes on (true). */
static bool req_probe_tls(struct h1_req *r)
{
    struct h1_conn *c = r->conn;
    ssize_t n = conn_recv(c, r->pool->rbuf, sizeof(r->pool->rbuf));

    if (n < 0 && errno == EAGAIN)
        return true;
    r->iov_at = r->iovcnt;
    r->iov_off = 0;
    conn_watch(c, EV_READ);
    if (n > 0) {
        r->got_bytes = true;
        if (req_parse(r, r->pool->rbuf, (size_t)n) && conn_has_pending(r->conn))
            req_read(r);
    } else {
        req_on_eof(r, n == 0 ? 0 : errno);
    }
    return false;
}

void h1_req_resume(struct h1_req *r)
{
    if (!r->active || r->ended || !r->paused)
        return;
    if (r->held) {
        (*r->pool->busy)++;
        enum h1_take t = r->hooks->on_body(r->ud, r->held, r->held_len);
        (*r->pool->busy)--;
        if (t == H1_PAUSE)
            return;
        free(r->held);
        r->held = NULL;
        r->held_len = 0;
        if (t != H1_TAKEN) {
            req_end(r, H1_ABORTED, "the answer was refused");
            return;
        }
    }
    r->paused = false;
    http_parser_pause(&r->parser, 0);
    if (r->rest) {
        char *rest = r->rest;
        size_t n = r->rest_len;
        r->rest = NULL;
        r->rest_len = 0;
        bool go_on = req_parse(r, rest, n);
        free(rest);
        if (!go_on)
            return;
    }
    if (r->conn) {
        conn_watch(r->conn, EV_READ);
        if (conn_has_pending(r->conn))
            req_read(r);
    }
}

static void h1_on_io(struct ev_loop *loop, ev_io *w, int revents)
{
    struct h1_conn *c = (struct h1_conn *)w;
    struct h1_req *r = c->req;
    (void)loop;

    if (!r) {
        /* Idle and readable: closed by the server, or bytes nobody asked
         * for. Either way it cannot carry a request any more. */
        conn_close(c);
        return;
    }
    if (c->connecting) {
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(w->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
            err = errno;
        if (err) {
            req_end_errno(r, H1_CONNECT_FAILED, "Failed to connect to", err);
            return;
        }
        c->connecting = false;
        req_connected(r);
        return;
    }
    if (c->handshaking) {
        req_handshake(r);
        return;
    }
    if (c->ssl && r->iov_at < r->iovcnt) {
        if ((revents & EV_READ) && c->write_wants != EV_READ && !req_probe_tls(r))
            return;
        if (revents & c->write_wants)
            req_send(r);
        return;
    }
    if ((revents & EV_READ) && r->iov_at < r->iovcnt) {
        req_stop_sending(r, 0); /* an answer, or a close, while still writing */
        return;
    }
    if ((revents & EV_WRITE) && r->iov_at < r->iovcnt) {
        req_send(r);
        return;
    }
    /* Over TLS a read may wait for writability (OpenSSL's WANT_WRITE). */
    if (revents & (EV_READ | EV_WRITE))
        req_read(r);
}
