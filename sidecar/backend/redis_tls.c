/*
 * redis_tls.c — the TLS bridge of redis_tls.h.
 *
 *   hiredis ⇄ [socketpair] ⇄ plain_w ─ up[] ─▶ SSL_write ─▶ tcp_w ⇄ server
 *                                    ◀ down[] ─ SSL_read ◀─
 *
 * One function, rtls_pump(), moves whatever can move (each direction
 * through a fixed buffer, so memory is bounded whatever either side does),
 * then arms the two watchers for what is still blocked: the TCP socket for
 * what OpenSSL last asked (WANT_READ / WANT_WRITE of the handshake, of the
 * pending SSL_write, of SSL_read), the socketpair for reading while `up`
 * has room and for writing while `down` holds bytes. Bytes OpenSSL has
 * already decrypted but `down` had no room for (SSL_pending) are read on
 * the next pump, which the socketpair turning writable triggers.
 *
 * Life: CONNECTING (the TCP connect hiredis started; done when writable and
 * SO_ERROR is 0) -> HANDSHAKE (SSL_connect, verification) -> OPEN -> DEAD.
 * Any failure goes to DEAD through rtls_die(): the reason is kept, both
 * descriptors are closed, and hiredis reads EOF on its end.
 */
#include "redis_tls.h"
#include "iplit.h"
#include "strbuf.h"

#include "core/tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Per direction. A script upload (SCRIPT LOAD, a few KiB) or a reply moves
 * through in a few pumps; larger buffers only hold more in flight. */
#define RTLS_BUF     16384
#define RTLS_ERR_MAX 200

struct rtls_ctx {
    SSL_CTX *ssl;
    char *server_name; /* NULL = the host connected to */
};

enum rtls_state { RT_CONNECTING, RT_HANDSHAKE, RT_OPEN, RT_DEAD };

struct rtls {
    struct ev_loop *loop;
    SSL *ssl;
    int tcp, plain; /* -1 once closed */
    enum rtls_state state;
    ev_io tcp_w, plain_w;
    int want_hs, want_w, want_r; /* SSL_ERROR_WANT_* last returned, 0 = none */
    bool plain_eof;              /* hiredis closed its end */
    size_t up_len, down_len;
    unsigned char up[RTLS_BUF];   /* from hiredis, to encrypt */
    unsigned char down[RTLS_BUF]; /* decrypted, to hand to hiredis */
    char err[RTLS_ERR_MAX];
};

/* --- context --------------------------------------------------------- */

void rtls_ctx_free(struct rtls_ctx *ctx)
{
    if (!ctx)
        return;
    SSL_CTX_free(ctx->ssl);
    free(ctx->server_name);
    free(ctx);
}

struct rtls_ctx *rtls_ctx_new(const struct rtls_opts *o, char *err, size_t errlen)
{
    struct rtls_ctx *ctx = calloc(1, sizeof(*ctx));

    if (!ctx) {
        str_setf(err, errlen, "out of memory");
        return NULL;
    }
    struct tls_files f = { 0 };
    if (o)
        f = (struct tls_files){ o->ca_file, o->cert_file, o->key_file };
    ctx->ssl = tls_ctx_new(&f, err, errlen);
    if (!ctx->ssl)
        goto fail;
    if (o && o->server_name && !(ctx->server_name = strdup(o->server_name))) {
        str_setf(err, errlen, "out of memory");
        goto fail;
    }
    return ctx;
fail:
    rtls_ctx_free(ctx);
    return NULL;
}

/* --- the pump -------------------------------------------------------- */

static void rtls_close_fds(struct rtls *t)
{
    ev_io_stop(t->loop, &t->tcp_w);
    ev_io_stop(t->loop, &t->plain_w);
    /* One try at a close_notify, so the server logs a clean close rather
     * than an unexpected EOF; nothing waits for its answer. */
    if (t->state == RT_OPEN && t->tcp >= 0) {
        SSL_shutdown(t->ssl);
        ERR_clear_error();
    }
    if (t->plain >= 0)
        close(t->plain);
    if (t->tcp >= 0)
        close(t->tcp);
    t->plain = t->tcp = -1;
}

static void rtls_die(struct rtls *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rtls_die(struct rtls *t, const char *fmt, ...)
{
    va_list ap;

    if (t->state == RT_DEAD)
        return;
    va_start(ap, fmt);
    vsnprintf(t->err, sizeof(t->err), fmt, ap);
    va_end(ap);
    t->state = RT_DEAD;
    ERR_clear_error();
    rtls_close_fds(t);
}

/* A failed SSL_connect: the verification result says most. */
static void rtls_handshake_failed(struct rtls *t, int e)
{
    char why[RTLS_ERR_MAX];

    rtls_die(t, "TLS handshake: %s", tls_handshake_error(t->ssl, e, why, sizeof(why)));
}

static void rtls_io_failed(struct rtls *t, const char *op, int e)
{
    char why[RTLS_ERR_MAX];

    if (e == SSL_ERROR_ZERO_RETURN)
        rtls_die(t, "the server closed the TLS connection");
    else if (e == SSL_ERROR_SYSCALL && ERR_peek_last_error() == 0)
        rtls_die(t, "TLS %s: %s", op, errno ? strerror(errno) : "connection closed");
    else
        rtls_die(t, "TLS %s: %s", op, tls_reason(why, sizeof(why), "failed"));
}

static int want_events(int want)
{
    return want == SSL_ERROR_WANT_READ ? EV_READ : want == SSL_ERROR_WANT_WRITE ? EV_WRITE : 0;
}

static void set_io(struct rtls *t, ev_io *w, int fd, int events)
{
    if (ev_is_active(w) && (w->events & (EV_READ | EV_WRITE)) == events)
        return;
    ev_io_stop(t->loop, w);
    if (!events)
        return;
    ev_io_set(w, fd, events);
    ev_io_start(t->loop, w);
}

static void rtls_arm(struct rtls *t)
{
    int tcp_ev = 0, plain_ev = 0;

    if (t->state == RT_DEAD)
        return;
    if (t->state == RT_CONNECTING)
        tcp_ev = EV_WRITE;
    else if (t->state == RT_HANDSHAKE)
        tcp_ev = want_events(t->want_hs);
    else {
        if (t->down_len < sizeof(t->down))
            tcp_ev |= want_events(t->want_r);
        if (t->up_len)
            tcp_ev |= want_events(t->want_w);
    }
    if (!t->plain_eof && t->up_len < sizeof(t->up))
        plain_ev |= EV_READ;
    if (t->down_len)
        plain_ev |= EV_WRITE;
    set_io(t, &t->tcp_w, t->tcp, tcp_ev);
    set_io(t, &t->plain_w, t->plain, plain_ev);
}

/* One step of each kind; true if any byte (or the handshake) moved. */
static bool rtls_step(struct rtls *t)
{
    bool moved = false;

    if (t->state == RT_HANDSHAKE) {
        t->want_hs = 0;
        ERR_clear_error();
        int rc = SSL_connect(t->ssl);
        if (rc == 1) {
            t->state = RT_OPEN;
            moved = true;
        } else {
            int e = SSL_get_error(t->ssl, rc);
            if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
                rtls_handshake_failed(t, e);
                return false;
            }
            t->want_hs = e;
        }
    }
    if (!t->plain_eof && t->up_len < sizeof(t->up)) {
        ssize_t n = read(t->plain, t->up + t->up_len, sizeof(t->up) - t->up_len);
        if (n > 0) {
            t->up_len += (size_t)n;
            moved = true;
        } else if (n == 0) {
            t->plain_eof = true;
        } else if (errno != EAGAIN && errno != EINTR) {
            rtls_die(t, "bridge read: %s", strerror(errno));
            return false;
        }
    }
    if (t->state == RT_OPEN && t->up_len) {
        t->want_w = 0;
        ERR_clear_error();
        int n = SSL_write(t->ssl, t->up, (int)t->up_len);
        if (n > 0) {
            memmove(t->up, t->up + n, t->up_len - (size_t)n);
            t->up_len -= (size_t)n;
            moved = true;
        } else {
            int e = SSL_get_error(t->ssl, n);
            if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
                rtls_io_failed(t, "write", e);
                return false;
            }
            t->want_w = e;
        }
    }
    if (t->state == RT_OPEN && t->down_len < sizeof(t->down)) {
        t->want_r = 0;
        ERR_clear_error();
        int n = SSL_read(t->ssl, t->down + t->down_len, (int)(sizeof(t->down) - t->down_len));
        if (n > 0) {
            t->down_len += (size_t)n;
            moved = true;
        } else {
            int e = SSL_get_error(t->ssl, n);
            if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
                rtls_io_failed(t, "read", e);
                return false;
            }
            t->want_r = e;
        }
    }
    if (t->down_len) {
        ssize_t n = write(t->plain, t->down, t->down_len);
        if (n > 0) {
            memmove(t->down, t->down + n, t->down_len - (size_t)n);
            t->down_len -= (size_t)n;
            moved = true;
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
            rtls_die(t, "bridge write: %s", strerror(errno));
            return false;
        }
    }
    return moved;
}

/* Ends when nothing moves: each step either moves bytes through a bounded
 * buffer or stops on a full buffer or a socket that would block. */
static void rtls_pump(struct rtls *t)
{
    while (t->state != RT_DEAD && rtls_step(t))
        ;
    if (t->state != RT_DEAD && t->plain_eof && t->up_len == 0) {
        /* The owner hung up and everything it sent is out; the owner frees
         * us next (it always frees the bridge with its context). */
        rtls_close_fds(t);
        t->state = RT_DEAD;
        return;
    }
    rtls_arm(t);
}

static void rtls_on_tcp(struct ev_loop *loop, ev_io *w, int revents)
{
    struct rtls *t = w->data;

    (void)loop;
    (void)revents;
    if (t->state == RT_CONNECTING) {
        int soerr = 0;
        socklen_t len = sizeof(soerr);
        if (getsockopt(t->tcp, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0)
            soerr = errno;
        if (soerr) {
            rtls_die(t, "connect: %s", strerror(soerr));
            return;
        }
        t->state = RT_HANDSHAKE;
    }
    rtls_pump(t);
}

static void rtls_on_plain(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    rtls_pump(w->data);
}

/* --- public ---------------------------------------------------------- */

struct rtls *rtls_new(struct ev_loop *loop, struct rtls_ctx *ctx, int *fd, const char *host,
                      char *err, size_t errlen)
{
    char why[RTLS_ERR_MAX];
    int sp[2] = { -1, -1 };
    const char *name = ctx->server_name ? ctx->server_name : host;
    struct rtls *t = calloc(1, sizeof(*t));

    if (!t) {
        str_setf(err, errlen, "out of memory");
        return NULL;
    }
    t->loop = loop;
    t->tcp = t->plain = -1;
    ERR_clear_error();
    if (!name || !*name) {
        str_setf(err, errlen, "TLS: no server name to verify");
        goto fail;
    }
    t->ssl = SSL_new(ctx->ssl);
    if (!t->ssl) {
        str_setf(err, errlen, "TLS: %s", tls_reason(why, sizeof(why), "out of memory"));
        goto fail;
    }
    SSL_set_mode(t->ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_set_connect_state(t->ssl);
    if (tls_set_peer(t->ssl, name) < 0) {
        str_setf(err, errlen, "TLS: cannot set the server name");
        goto fail;
    }
    t->tcp = fcntl(*fd, F_DUPFD_CLOEXEC, 0);
    if (t->tcp < 0 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sp) < 0) {
        str_setf(err, errlen, "TLS: %s", strerror(errno));
        goto fail;
    }
    if (SSL_set_fd(t->ssl, t->tcp) != 1) {
        str_setf(err, errlen, "TLS: %s", tls_reason(why, sizeof(why), "cannot attach the socket"));
        goto fail;
    }
    /* The same number now names our end of the pair; the TCP socket lives
     * on in t->tcp. */
    if (dup3(sp[0], *fd, O_CLOEXEC) < 0) {
        str_setf(err, errlen, "TLS: %s", strerror(errno));
        goto fail;
    }
    close(sp[0]);
    t->plain = sp[1];

    /* hiredis' keep-alive cannot reach a TCP socket it no longer holds. */
    int on = 1, idle = 15, intvl = 5, cnt = 3;
    setsockopt(t->tcp, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
    setsockopt(t->tcp, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(t->tcp, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(t->tcp, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));

    ev_io_init(&t->tcp_w, rtls_on_tcp, t->tcp, EV_WRITE);
    t->tcp_w.data = t;
    ev_io_init(&t->plain_w, rtls_on_plain, t->plain, EV_READ);
    t->plain_w.data = t;
    t->state = RT_CONNECTING;
    rtls_arm(t);
    return t;

fail:
    if (sp[0] >= 0)
        close(sp[0]);
    if (sp[1] >= 0)
        close(sp[1]);
    if (t->tcp >= 0)
        close(t->tcp);
    SSL_free(t->ssl);
    ERR_clear_error();
    free(t);
    return NULL;
}

void rtls_free(struct rtls *t)
{
    if (!t)
        return;
    rtls_close_fds(t);
    SSL_free(t->ssl);
    free(t);
}

bool rtls_is_open(const struct rtls *t)
{
    return t && t->state == RT_OPEN;
}

const char *rtls_error(const struct rtls *t)
{
    return t && t->err[0] ? t->err : NULL;
}
