/*
 * fuzz_h1_tls.c — libFuzzer target for the own HTTP/1.1 client's TLS path
 * (sidecar/upstream/h1.c over OpenSSL, with sidecar/core/tls.c): the
 * handshake, records split and coalesced anyhow, key updates and
 * renegotiation mid-answer, close_notify, bare and cut closes, plaintext
 * after the handshake, session resumption on a new connection, and a
 * server that does not speak TLS at all.
 *
 * The client runs its real code, unchanged, with its context made as the
 * daemon makes it (tls_ctx_new from a CA file, then h1_tls_ctx_setup), on
 * real connections to an abstract Unix socket this target listens on. The
 * target plays the upstream: an OpenSSL server over memory BIOs (key and
 * self-signed certificate for DNS:upstream.fuzz and IP:127.0.0.1 made once
 * per process; the client trusts it through a CA file), whose bytes it
 * moves to and from the socket itself, so it decides how the records are
 * cut into writes. Input:
 *
 *   byte 0   flags: 0x01 hostile server (below); 0x02 TLS 1.2 (else 1.3);
 *            0x04 the body hook pauses (H1_PAUSE) on new buffers, resumed
 *            from the loop; 0x08 a second request follows on the same
 *            pool; 0x10 the upstream closes the second request's
 *            connection, if it was a pooled one, before any answer; 0x20
 *            the request carries 1 MiB; 0x40 the answer comes before the
 *            upstream reads any of the request
 *   byte 1-2 with 0x08: the length of the first answer (little-endian)
 *   byte 3   seeds the write sizes, the pauses and where events fall
 *   byte 4   what the upstream does on the first connection: bits 0-1 its
 *            end once the answer is written: 0 it stays open (and is closed
 *            with a close_notify only when the client waits for more), 1 a
 *            close_notify and a close, 2 a bare close, 3 a bare close inside
 *            the answer's last record; 0x04 from a point of the answer on,
 *            the rest is written raw (plaintext after the handshake), then
 *            a bare close; 0x08 a key update (TLS 1.3) or a renegotiation
 *            (TLS 1.2) at a point of the answer; 0x10 the key update asks
 *            for the client's. Bits 5-6 the name the client checks: the
 *            certificate's DNS name, its address, another name, another
 *            address (the last two must fail verification). With 0x01:
 *            0x80 the upstream never reads the ClientHello
 *   rest     the answer(s); with 0x01, the upstream's bytes from the first
 *
 * Each input runs as a reference (the answer in whole records, no event,
 * the connection left open) and fuzzed (the pieces, pauses and events of
 * bytes 3-4); a head line "x-refuse: ..." is refused by the hook (as the
 * engine refuses a line it cannot take). Checked in both: hooks keep
 * h1.h's contract (h1_contract.h: on_end exactly once and last, a detail with every
 * failure, header lines CRLF-terminated within H1_LINE_MAX and each set
 * opened by a status line, a paused buffer offered again whole, no body
 * after a 1xx, 204 or 304 head, H1_OK only after a final status); H1_TLS
 * exactly when the handshake did not complete, with "certificate verify
 * failed" for the wrong name; the request arrives byte for byte; a
 * connection whose request was not written whole, or that the upstream
 * closed or filled with garbage, is never reused; the second request's new
 * connection resumes the first's session when the first answer was taken
 * (and no stale connection was given up since); plaintext after the
 * handshake fails a read as a TLS error (EPROTO), not as what the alert
 * OpenSSL then wrote met. Between the runs:
 *
 *   - with the whole answer sent through TLS, both tell the same. h1.c
 *     sets SSL_OP_IGNORE_UNEXPECTED_EOF and waits for no close_notify
 *     (h1.h): a bare close ends an answer exactly as a close_notify does (a
 *     close-delimited answer is taken whole after either, a cut
 *     Content-Length or chunked one is H1_TRUNCATED after either), and a
 *     key update or a renegotiation changes nothing;
 *   - with the stream cut (a bare close inside a record, or plaintext
 *     after the handshake), an answer taken (H1_OK) is exactly what the
 *     answer bytes of the records that arrived whole, ended by a
 *     close_notify, would give: nothing of a cut record or of the
 *     plaintext is ever taken.
 *
 * The hostile server (0x01) reads the ClientHello (unless 0x80) and writes
 * the rest of the input raw, in pieces, then closes: the request must end
 * with H1_TLS and a detail, nothing sent, nothing told. Each run is
 * bounded by LOOP_GUARD turns of the loop; no socket or memory is left.
 */
#include "core/tls.h"
#include "h1_contract.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <linux/sockios.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define F_HOSTILE     0x01
#define F_TLS12       0x02
#define F_PAUSE       0x04
#define F_SECOND      0x08
#define F_CLOSE_FIRST 0x10
#define F_BIG         0x20
#define F_EARLY       0x40

#define E_ENDING    0x03
#define E_GARBAGE   0x04
#define E_REKEY     0x08
#define E_REKEY_REQ 0x10
#define E_NAME(ev)  (((ev) >> 5) & 3)
#define E_NO_READ   0x80

enum ending { END_KEEP, END_NOTIFY, END_BARE, END_CUT };

#define HEADER     5
#define BIG_BODY   (1u << 20)
#define RECORD_MAX 16384 /* one SSL_write, one record */
#define LOOP_GUARD 100000
#define GUARD(g)                                     \
    do {                                             \
        if (++(g) > LOOP_GUARD)                      \
            abort(); /* the exchange does not end */ \
    } while (0)

/* The names the client may check; the certificate holds the first two. */
static const char *const names[4] = { "upstream.fuzz", "127.0.0.1", "other.fuzz", "127.0.0.2" };

/* The input, read once. */
struct input {
    unsigned flags, events;
    uint8_t seed;
    const uint8_t *answer[2];
    size_t len[2];
};

/* How a run plays the upstream. */
struct plan {
    bool split;     /* pieces of seeded sizes, pauses */
    unsigned event; /* byte 4's event bits for the first connection, else 0 */
};

/* The upstream's end of one connection: an OpenSSL server over memory
 * BIOs (or raw bytes, hostile), its bytes moved by hand. */
struct up {
    int fd;        /* -1: closed */
    SSL *ssl;      /* NULL: hostile, raw bytes only */
    BIO *in, *out; /* ssl's */
    bool shaken;   /* its handshake completed (the first one) */
    bool failed;   /* a TLS error: it speaks no more TLS */
    bool eof;      /* the client closed its end */
    bool hold;     /* the socket is not read (an early answer) */
    int rekeying;  /* a renegotiation: 1 asked for, 2 under way, 0 none */
    int handshakes;
    size_t got;            /* request bytes received (all requests on it) */
    size_t requests;       /* requests the upstream took on it */
    struct transcript raw; /* to write to the socket, from raw_off */
    size_t raw_off;
};

/* One run. */
struct sim {
    const struct input *in;
    struct plan plan;
    uint32_t rng;
    int busy;
    struct iovec iov[2];
    size_t req_len;
    struct exchange x[2];
    size_t whole[2]; /* answer bytes sent in records that went out whole */
    bool cut[2];     /* ... and the stream was cut after them */
    bool junk[2];    /* ... by plaintext no record header starts like */
};

static struct ev_loop *loop;
static struct sockaddr_un addr;
static socklen_t addr_len;
static int listen_fd = -1;
static int sockets_at_start;
static SSL_CTX *server_ctx, *client_ctx;
static char big_body[BIG_BODY];

/* The sockets open (not every descriptor: a library may open one of its
 * own, a random device, at any time and keep it); each named if `show`. */
static int open_sockets(bool show)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    char path[300], to[64];
    int n = 0;

    if (!d)
        abort();
    while ((e = readdir(d))) {
        ssize_t k;
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        if ((k = readlink(path, to, sizeof(to) - 1)) <= 0 || strncmp(to, "socket:", 7) != 0)
            continue;
        n++;
        if (show)
            fprintf(stderr, "fuzz_h1_tls: fd %s -> %.*s\n", e->d_name, (int)k, to);
    }
    closedir(d);
    return n;
}

/* No connection left open by a run. */
static void check_sockets(void)
{
    if (open_sockets(false) != sockets_at_start) {
        open_sockets(true);
        abort();
    }
}

/* --- the upstream -------------------------------------------------------- */

/* A renegotiation asked for (rekeying 1) is under way once the client's
 * new ClientHello arrives (2), and done when its handshake is (0): sending
 * the HelloRequest alone also counts as a handshake done for OpenSSL. */
static int on_client_hello(SSL *ssl, int *al, void *arg)
{
    struct up *u = SSL_get_app_data(ssl);
    (void)al;
    (void)arg;
    if (u && u->rekeying == 1)
        u->rekeying = 2;
    return SSL_CLIENT_HELLO_SUCCESS;
}

static void on_server_info(const SSL *ssl, int where, int ret)
{
    struct up *u = SSL_get_app_data(ssl);
    (void)ret;
    if (u && (where & SSL_CB_HANDSHAKE_DONE)) {
        u->handshakes++;
        if (u->rekeying == 2)
            u->rekeying = 0;
    }
}

/* The connection the client made, if there is one to accept. */
static struct up *up_accept(const struct sim *s)
{
    int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    struct up *u;

    if (fd < 0)
        return NULL;
    if (!(u = calloc(1, sizeof(*u))))
        abort();
    u->fd = fd;
    if (s->in->flags & F_HOSTILE)
        return u;
    u->ssl = SSL_new(server_ctx);
    u->in = BIO_new(BIO_s_mem());
    u->out = BIO_new(BIO_s_mem());
    if (!u->ssl || !u->in || !u->out)
        abort();
    SSL_set_bio(u->ssl, u->in, u->out);
    SSL_set_app_data(u->ssl, u);
    if (s->in->flags & F_TLS12)
        SSL_set_max_proto_version(u->ssl, TLS1_2_VERSION);
    SSL_set_accept_state(u->ssl);
    return u;
}

/* The request bytes as the client must write them, from offset `off` of
 * its stream (requests back to back) on: equal to `p`? */
static bool request_matches(const struct sim *s, size_t off, const char *p, size_t n)
{
    while (n > 0) {
        size_t at = off % s->req_len, k;
        const struct iovec *v = &s->iov[at < s->iov[0].iov_len ? 0 : 1];
        if (v == &s->iov[1])
            at -= s->iov[0].iov_len;
        k = v->iov_len - at < n ? v->iov_len - at : n;
        if (memcmp((const char *)v->iov_base + at, p, k) != 0)
            return false;
        p += k;
        off += k;
        n -= k;
    }
    return true;
}

/* Moves what OpenSSL wrote to the bytes to send; how many. */
static size_t up_take(struct up *u)
{
    char buf[4096];
    size_t n = 0;
    int k;

    if (!u->ssl)
        return 0;
    if (u->raw_off == u->raw.len)
        u->raw_off = u->raw.len = 0;
    while ((k = BIO_read(u->out, buf, sizeof(buf))) > 0) {
        transcript_put(&u->raw, buf, (size_t)k);
        n += (size_t)k;
    }
    return n;
}

/* Reads what the client wrote and lets the server act on it: the
 * handshake, renegotiation, key updates, the request. */
static void up_service(const struct sim *s, struct up *u)
{
    char buf[16384];

    while (u->fd >= 0 && !u->hold && !u->eof) {
        ssize_t n = recv(u->fd, buf, sizeof(buf), 0);
        if (n > 0) {
            if (u->ssl && BIO_write(u->in, buf, (int)n) != (int)n)
                abort();
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        u->eof = true; /* closed, or reset */
        if (u->ssl)
            BIO_set_mem_eof_return(u->in, 0);
    }
    if (!u->ssl || u->failed)
        return;
    ERR_clear_error();
    if (!u->shaken) {
        int rc = SSL_do_handshake(u->ssl);
        if (rc == 1) {
            u->shaken = true;
        } else {
            int e = SSL_get_error(u->ssl, rc);
            if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
                u->failed = true;
        }
    }
    while (u->shaken && !u->failed && !u->hold) {
        int n = SSL_read(u->ssl, buf, sizeof(buf));
        if (n > 0) {
            if (!request_matches(s, u->got, buf, (size_t)n))
                abort(); /* not the request, byte for byte, back to back */
            u->got += (size_t)n;
            continue;
        }
        int e = SSL_get_error(u->ssl, n);
        if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE && e != SSL_ERROR_ZERO_RETURN)
            u->failed = true;
        break;
    }
    ERR_clear_error();
    up_take(u);
}

/* Writes up to `max` of the bytes to send, as the socket takes them. */
static void up_flush(struct up *u, size_t max)
{
    while (u->fd >= 0 && max > 0 && u->raw_off < u->raw.len) {
        size_t k = u->raw.len - u->raw_off;
        if (k > max)
            k = max;
        ssize_t w = send(u->fd, u->raw.p + u->raw_off, k, MSG_NOSIGNAL);
        if (w > 0) {
            u->raw_off += (size_t)w;
            max -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        u->raw_off = u->raw.len; /* the client closed: it goes nowhere */
        u->eof = true;
        return;
    }
}

static bool up_pending(const struct up *u)
{
    return u->fd >= 0 && !u->eof && u->raw_off < u->raw.len;
}

/* Whether the client has read every byte sent on `u`. */
static bool up_drained(const struct up *u)
{
    int queued = 0;
    return !up_pending(u) && ioctl(u->fd, SIOCOUTQ, &queued) == 0 && queued == 0;
}

/* Closes the upstream's end: after a close_notify if `notify`, after
 * reading what the client sent if `drain` (else, with bytes unread, the
 * client's reads fail with ECONNRESET). */
static void up_close(struct up *u, bool notify, bool drain)
{
    char buf[16384];

    if (u->fd < 0)
        return;
    if (notify && u->ssl && u->shaken && !u->failed) {
        ERR_clear_error();
        SSL_shutdown(u->ssl);
        ERR_clear_error();
        up_take(u);
        up_flush(u, SIZE_MAX);
    }
    while (drain && recv(u->fd, buf, sizeof(buf), 0) > 0)
        ;
    close(u->fd);
    u->fd = -1;
}

static void up_free(struct up *u)
{
    if (!u)
        return;
    up_close(u, false, true);
    SSL_free(u->ssl);
    free(u->raw.p);
    free(u);
}

/* --- the loop ------------------------------------------------------------ */

/* One turn of the client's loop (the paused request resumed from outside
 * its hooks, as h1.h asks), then of the upstream: it reads, acts, and
 * writes a piece of what it has to send (all of it in the reference). */
static void tick(struct sim *s, struct exchange *x, struct up *u)
{
    exchange_turn(loop, x);
    if (u) {
        up_service(s, u);
        up_flush(u, s->plan.split ? rng_piece(&s->rng) : SIZE_MAX);
    }
}

/* Sends everything queued on `u`, as the client reads it. */
static void flush_all(struct sim *s, struct exchange *x, struct up *u)
{
    for (int guard = 0; up_pending(u);) {
        GUARD(guard);
        up_flush(u, SIZE_MAX);
        if (up_pending(u))
            tick(s, x, u);
    }
}

/* Everything sent and no renegotiation in the middle (a server closes only
 * after it): what a close must wait for. */
static void settle(struct sim *s, struct exchange *x, struct up *u)
{
    flush_all(s, x, u);
    for (int guard = 0; u->rekeying && u->fd >= 0 && !u->eof && !u->failed;) {
        GUARD(guard);
        tick(s, x, u);
        flush_all(s, x, u);
    }
}

/* One SSL_write of the answer, retried (same bytes) while a renegotiation
 * waits for the client; the bytes of the record it made. */
static size_t tls_write(struct sim *s, struct exchange *x, struct up *u, const uint8_t *p, size_t n)
{
    for (int guard = 0;;) {
        GUARD(guard);
        ERR_clear_error();
        int rc = SSL_write(u->ssl, p, (int)n);
        if (rc > 0)
            return up_take(u);
        int e = SSL_get_error(u->ssl, rc);
        ERR_clear_error();
        if ((e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) || u->eof || u->fd < 0) {
            u->failed = true;
            return 0;
        }
        up_take(u);
        tick(s, x, u);
    }
}

/* A key update (TLS 1.3) or a renegotiation (TLS 1.2), sent at once. */
static void rekey(struct up *u, unsigned event)
{
    ERR_clear_error();
    if (SSL_version(u->ssl) == TLS1_3_VERSION) {
        if (SSL_key_update(u->ssl,
                           (event & E_REKEY_REQ) ? SSL_KEY_UPDATE_REQUESTED
                                                 : SSL_KEY_UPDATE_NOT_REQUESTED) != 1)
            abort();
    } else {
        if (SSL_renegotiate(u->ssl) != 1)
            abort();
        u->rekeying = 1;
    }
    SSL_do_handshake(u->ssl);
    ERR_clear_error();
    up_take(u);
}

/* Answers request `i` on `u` with `a` (TLS): handshake if new, reads the
 * request (not first if early), writes the answer in records, then ends
 * as `event` says. The request has ended on return; `u` may be closed. */
static void serve(struct sim *s, int i, struct up *u, const uint8_t *a, size_t n, unsigned event)
{
    struct exchange *x = &s->x[i];
    unsigned flags = s->in->flags;
    int ending = (int)(event & E_ENDING), guard = 0;
    size_t off = 0, cut = n, rekey_at = SIZE_MAX, k = 0;

    while (!u->shaken && !u->failed && !u->eof && !x->ended) {
        GUARD(guard);
        tick(s, x, u);
    }
    u->requests++;
    if (u->shaken && (flags & F_EARLY))
        u->hold = true;
    while (u->shaken && !u->hold && u->got < u->requests * s->req_len && !u->failed && !u->eof &&
           !x->ended) {
        GUARD(guard);
        tick(s, x, u);
    }
    if (event & E_GARBAGE)
        cut = rng_next(&s->rng) % (n + 1);
    if ((event & E_REKEY) && !(flags & F_EARLY) && n > 0)
        rekey_at = rng_next(&s->rng) % n;
    while (u->shaken && off < cut && !x->ended && !u->failed && !u->eof && u->fd >= 0) {
        k = s->plan.split ? rng_piece(&s->rng) : RECORD_MAX;
        k = k > RECORD_MAX ? RECORD_MAX : k;
        k = k > cut - off ? cut - off : k;
        if (ending == END_CUT && !(event & E_GARBAGE) && off + k == n)
            break; /* the last record: written and cut below */
        if (off <= rekey_at && rekey_at < off + k) {
            rekey(u, event);
            rekey_at = SIZE_MAX;
        }
        tls_write(s, x, u, a + off, k);
        if (u->failed)
            break;
        off += k;
        tick(s, x, u);
    }
    s->whole[i] = off;
    u->hold = false;
    if (event & E_GARBAGE) {
        /* The rest of the answer in plaintext, then a bare close. */
        flush_all(s, x, u);
        transcript_put(&u->raw, a + off, n - off);
        flush_all(s, x, u);
        up_close(u, false, true);
        s->cut[i] = true;
        s->junk[i] = n - off >= 5 && (a[off] < 20 || a[off] > 24); /* not a content type */
    } else if (ending == END_CUT) {
        if (u->shaken && !u->failed && !u->eof && u->fd >= 0 && off < n) {
            size_t rec = tls_write(s, x, u, a + off, n - off > RECORD_MAX ? RECORD_MAX : n - off);
            if (rec > 0)
                u->raw.len -= 1 + rng_next(&s->rng) % rec; /* 1 byte to all of it */
        }
        flush_all(s, x, u);
        up_close(u, false, true);
        s->cut[i] = true;
    } else if (ending == END_NOTIFY || ending == END_BARE) {
        settle(s, x, u);
        up_close(u, ending == END_NOTIFY, true);
    }
    /* The client waits for more of an answer that will not come once it
     * has read everything: the upstream closes (END_KEEP). */
    for (guard = 0; !x->ended;) {
        GUARD(guard);
        if (u->fd >= 0 && !x->paused && up_drained(u)) {
            settle(s, x, u);
            if (!x->ended && !x->paused && up_drained(u))
                up_close(u, true, true);
        }
        tick(s, x, u);
    }
}

/* The hostile upstream: the input raw from its first byte. */
static void serve_hostile(struct sim *s, struct up *u, const uint8_t *a, size_t n)
{
    struct exchange *x = &s->x[0];

    u->hold = (s->in->events & E_NO_READ) != 0;
    up_service(s, u); /* the ClientHello, unless held */
    transcript_put(&u->raw, a, n);
    for (int guard = 0; !x->ended;) {
        GUARD(guard);
        if (u->fd >= 0 && !up_pending(u) && !x->paused)
            up_close(u, false, !u->hold);
        tick(s, x, u);
    }
}

/* --- a run ----------------------------------------------------------------- */

static struct up *accept_for(struct sim *s, struct exchange *x)
{
    struct up *u = NULL;

    for (int guard = 0; !(u = up_accept(s)) && !x->ended;) {
        GUARD(guard);
        tick(s, x, NULL);
    }
    return u;
}

/* Waits for `x` to end (it must), with no upstream. */
static void wait_end(struct sim *s, struct exchange *x)
{
    for (int guard = 0; !x->ended;) {
        GUARD(guard);
        tick(s, x, NULL);
    }
}

static void run(const struct input *in, const struct plan *pl, struct told out[2], struct sim *s)
{
    static const char head_small[] = "POST /v1/chat/completions HTTP/1.1\r\nHost: upstream.fuzz\r\n"
                                     "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n";
    static const char head_big[] =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: upstream.fuzz\r\n"
        "Content-Type: application/json\r\nContent-Length: 1048576\r\n\r\n";
    bool big = (in->flags & F_BIG) != 0;
    struct h1_pool *pool;
    struct h1_origin *origin;
    struct up *u;

    memset(s, 0, sizeof(*s));
    s->in = in;
    s->plan = *pl;
    s->rng = in->seed * 2654435761u + 1;
    s->iov[0].iov_base = (void *)(big ? head_big : head_small);
    s->iov[0].iov_len = big ? sizeof(head_big) - 1 : sizeof(head_small) - 1;
    s->iov[1].iov_base = big ? big_body : (char *)"{}";
    s->iov[1].iov_len = big ? BIG_BODY : 2;
    s->req_len = s->iov[0].iov_len + s->iov[1].iov_len;
    if (!(pool = h1_pool_new(loop, &s->busy, 8)))
        abort();
    origin = h1_origin_get_tls(pool, (struct sockaddr *)&addr, addr_len, "fuzz", client_ctx,
                               names[E_NAME(in->events)]);
    if (!origin)
        abort();
    for (int i = 0; i < 2; i++) {
        s->x[i].busy = &s->busy;
        s->x[i].rng = &s->rng;
        s->x[i].tls = true;
        s->x[i].pauses = pl->split && (in->flags & F_PAUSE);
        s->x[i].told = &out[i];
        out[i].end = -1;
    }

    h1_req_start(&s->x[0].req, pool, origin, s->iov, 2, &exchange_hooks, &s->x[0]);
    if (!(u = accept_for(s, &s->x[0])))
        abort(); /* connect(2) to the listening socket completes at once */
    if (in->flags & F_HOSTILE) {
        serve_hostile(s, u, in->answer[0], in->len[0]);
    } else {
        serve(s, 0, u, in->answer[0], in->len[0], pl->event);
    }
    if (in->flags & F_SECOND) {
        const struct h1_stats *st = h1_pool_stats(pool);
        uint64_t reused = st->connections_reused, resumed = st->tls_resumed;
        struct exchange *x = &s->x[1];

        tick(s, &s->x[0], u); /* a connection pooled in this turn is taken from the next */
        bool closed = u->fd < 0 || u->eof || u->failed;
        bool whole = u->got >= u->requests * s->req_len;
        h1_req_start(&x->req, pool, origin, s->iov, 2, &exchange_hooks, x);
        if (st->connections_reused > reused) {
            /* On the pooled connection: one the upstream kept, and whose
             * request it had whole. */
            if (closed || !whole)
                abort();
            if (in->flags & F_CLOSE_FIRST) {
                up_close(u, false, false); /* closed unanswered */
                up_free(u);
                u = accept_for(s, x); /* the client sends it once more */
            }
        } else {
            up_free(u);
            u = accept_for(s, x);
        }
        if (u) {
            bool fresh = u->requests == 0;
            serve(s, 1, u, in->answer[1], in->len[1], 0);
            /* A new connection after a first answer taken on a connection
             * that ended cleanly: the session it was handed is resumed
             * (not after a stale one: OpenSSL spoils the session of a
             * connection freed without its close_notify). */
            if (fresh && u->shaken && out[0].end == H1_OK && !s->cut[0] && st->stale_retries == 0 &&
                (!SSL_session_reused(u->ssl) || st->tls_resumed == resumed))
                abort();
        } else {
            wait_end(s, x);
        }
    }
    up_free(u);
    for (int i = 0; i < 8; i++)
        ev_run(loop, EVRUN_NOWAIT); /* pooled connections see the close */
    h1_pool_free(pool);
    for (int i = 0; i < 2; i++)
        exchange_free(&s->x[i]);
    /* Nothing the client left behind: every connection was accepted. */
    while ((u = up_accept(s)))
        up_free(u);
}

/* --- the process ------------------------------------------------------------ */

static void make_tls(void)
{
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *cert = X509_new();
    X509V3_CTX v3;
    char path[64], err[256];

    if (!key || !cert)
        abort();
    ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert), 30L * 86400);
    X509_set_pubkey(cert, key);
    X509_NAME *name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"upstream.fuzz", -1,
                               -1, 0);
    X509_set_issuer_name(cert, name);
    X509V3_set_ctx_nodb(&v3);
    X509V3_set_ctx(&v3, cert, cert, NULL, NULL, 0);
    X509_EXTENSION *ext =
        X509V3_EXT_conf_nid(NULL, &v3, NID_subject_alt_name, "DNS:upstream.fuzz,IP:127.0.0.1");
    if (!ext || X509_add_ext(cert, ext, -1) != 1 || X509_sign(cert, key, EVP_sha256()) <= 0)
        abort();
    X509_EXTENSION_free(ext);

    server_ctx = SSL_CTX_new(TLS_server_method());
    if (!server_ctx || SSL_CTX_use_certificate(server_ctx, cert) != 1 ||
        SSL_CTX_use_PrivateKey(server_ctx, key) != 1)
        abort();
    SSL_CTX_set_min_proto_version(server_ctx, TLS1_2_VERSION);
    /* Tickets only: no session state carried from one input to the next. */
    SSL_CTX_set_session_cache_mode(server_ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_info_callback(server_ctx, on_server_info);
    SSL_CTX_set_client_hello_cb(server_ctx, on_client_hello, NULL);

    /* The client's, as the daemon makes it: the CA file read by
     * tls_ctx_new (here a memory file), then h1_tls_ctx_setup. */
    int fd = memfd_create("fuzz-h1-tls-ca", MFD_CLOEXEC);
    BIO *b = fd >= 0 ? BIO_new_fd(fd, BIO_NOCLOSE) : NULL;
    if (!b || PEM_write_bio_X509(b, cert) != 1)
        abort();
    BIO_free(b);
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    struct tls_files files = { .ca_file = path };
    client_ctx = tls_ctx_new(&files, err, sizeof(err));
    close(fd);
    if (!client_ctx || h1_tls_ctx_setup(client_ctx) < 0) {
        fprintf(stderr, "fuzz_h1_tls: %s\n", client_ctx ? "h1_tls_ctx_setup failed" : err);
        abort();
    }
    X509_free(cert);
    EVP_PKEY_free(key);
}

static void setup(void)
{
    signal(SIGPIPE, SIG_IGN); /* as the daemon: OpenSSL writes with write(2) */
    listen_fd = upstream_listen("polygw-fuzz-h1-tls", &addr, &addr_len);
    loop = ev_loop_new(EVFLAG_AUTO);
    if (!loop)
        abort();
    for (size_t i = 0; i < sizeof(big_body); i++)
        big_body[i] = (char)('a' + i % 23);
    make_tls();
    sockets_at_start = open_sockets(false);
}

/* The end any run must have: H1_TLS for a hostile upstream or a name the
 * certificate does not hold, with the reason. */
static void check_tls_end(const struct input *in, const struct told *t)
{
    bool wrong_name = E_NAME(in->events) >= 2;

    if (!(in->flags & F_HOSTILE) && !wrong_name) {
        if (t->end == H1_TLS)
            abort(); /* our own certificate, refused */
        return;
    }
    if (t->end != H1_TLS || strncmp(t->detail, "TLS handshake with fuzz: ", 25) != 0)
        abort();
    if (wrong_name && !(in->flags & F_HOSTILE) && !strstr(t->detail, "certificate verify failed"))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct told ref[2], fuzzed[2], alone[2];
    struct sim s_ref, s_fuzz, s_alone;
    struct input in;

    if (size < HEADER)
        return 0;
    if (listen_fd < 0)
        setup();
    memset(&in, 0, sizeof(in));
    in.flags = data[0];
    in.seed = data[3];
    in.events = data[4];
    in.answer[0] = data + HEADER;
    in.len[0] = size - HEADER;
    if (in.flags & F_HOSTILE)
        in.flags &= ~(unsigned)F_SECOND;
    if (in.flags & F_SECOND) {
        size_t want = (size_t)data[1] | (size_t)data[2] << 8;
        if (want < in.len[0])
            in.len[0] = want;
        in.answer[1] = data + HEADER + in.len[0];
        in.len[1] = size - HEADER - in.len[0];
    }
    memset(ref, 0, sizeof(ref));
    memset(fuzzed, 0, sizeof(fuzzed));
    run(&in, &(struct plan){ .split = false }, ref, &s_ref);
    run(&in, &(struct plan){ .split = true, .event = in.events }, fuzzed, &s_fuzz);
    check_sockets();
    check_tls_end(&in, &ref[0]);
    check_tls_end(&in, &fuzzed[0]);
    if (!(in.flags & F_HOSTILE)) {
        if (!s_fuzz.cut[0]) {
            told_compare(&ref[0], &fuzzed[0]);
        } else if (fuzzed[0].end == H1_OK) {
            /* Taken from a cut stream: what the records that arrived whole
             * tell, alone and ended by a close_notify. */
            struct input part = in;
            part.flags &= ~(unsigned)(F_SECOND | F_CLOSE_FIRST);
            part.len[0] = s_fuzz.whole[0];
            memset(alone, 0, sizeof(alone));
            run(&part, &(struct plan){ .split = false }, alone, &s_alone);
            check_sockets();
            told_compare(&alone[0], &fuzzed[0]);
            told_free(alone);
        }
        /* Plaintext after the handshake fails a read as a TLS error,
         * whatever the alert OpenSSL then sent met (a failed send, told
         * first when no answer came, is another matter). */
        if (s_fuzz.junk[0] && strncmp(fuzzed[0].detail, "Recv failure: ", 14) == 0 &&
            strcmp(fuzzed[0].detail, "Recv failure: Protocol error") != 0)
            abort();
        if (in.flags & F_SECOND)
            told_compare(&ref[1], &fuzzed[1]);
    }
    told_free(ref);
    told_free(fuzzed);
    return 0;
}
