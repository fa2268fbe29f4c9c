/*
 * echo_server.c — the benchmark floor: the least work any msgpack-RPC
 * server on a Unix socket must do, so that `sidecar / echo` ratios show the
 * sidecar's own overhead and nothing else.
 *
 *   echo_server --socket PATH [--max-conns N] [--version STR]
 *
 * Same shape as the sidecar on purpose: one thread, one libev loop, one
 * non-blocking stream socket per client, the shared proto/frame.h reader
 * (the same bounds the sidecar applies to untrusted input) and rpc_parse()
 * to find each request's msgid. What it leaves out is exactly what the
 * sidecar adds: method dispatch, parameter binding, governance, logging.
 *
 * Every request frame, whatever its method, is answered with
 *   [1, msgid, nil, {"version": STR, "uptime_s": <float64>}]
 * i.e. the shape and (for the default STR) the size of the sidecar's `ping`
 * reply. The reply tail after the msgid is encoded once at start-up; per
 * read batch only the 8 bytes of uptime are patched, per request only the
 * 4-byte array header + msgid are written. Notifications are ignored; a
 * frame that is not msgpack-RPC, or breaks the frame limits, closes the
 * connection (as the sidecar does after its fatal notification).
 *
 * Prints "LISTENING <path>" on stdout once it accepts connections; exits 0
 * on SIGTERM or SIGINT, closing every connection and unlinking the socket.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <ev.h>
#include <msgpack.h>

#include "bench_common.h"
#include "dlist.h"
#include "frame.h"
#include "rpc.h"

#ifndef PGW_VERSION
#define PGW_VERSION "0.1.0"
#endif

#define ECHO_MAX_FRAME_BYTES (16u << 20) /* the sidecar's default max_message_bytes */
#define ECHO_READ_CHUNK      65536
/* Stop reading from a client whose replies we cannot write out: bounds the
 * memory a client that never reads can make us hold. */
#define ECHO_OUT_HIGH_WATER  (1u << 20)

struct echo_server;

struct echo_conn {
    struct echo_server *srv;
    int fd;
    ev_io rio, wio;
    struct frame_reader fr;
    msgpack_unpacked msg;
    char *out;
    size_t out_len, out_off, out_cap;
    int closing;                   /* closed; freed by the prepare pass */
    struct echo_conn *prev, *next; /* live list, or dead list when closing */
};

struct echo_server {
    struct ev_loop *loop;
    int lfd;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    ev_io accept_io;
    ev_signal sig_term, sig_int;
    ev_prepare reap;
    ev_tstamp t_start;
    unsigned max_conns, n_conns;
    struct echo_conn *live, *dead;
    /* Pre-encoded reply tail: nil, {"version": STR, "uptime_s": float64}. */
    unsigned char *tail;
    size_t tail_len;
    size_t uptime_off; /* offset of the float64's 8 bytes in tail */
    uint64_t n_requests, n_accepted;
};

static void list_push(struct echo_conn **head, struct echo_conn *c)
{
    DLIST_PUSH(*head, c, prev, next);
}

static void list_unlink(struct echo_conn **head, struct echo_conn *c)
{
    DLIST_UNLINK(*head, c, prev, next);
}

/* Closes the socket at once but frees the struct only in the prepare pass:
 * this is usually called from one of the connection's own watchers. */
static void echo_conn_close(struct echo_conn *c)
{
    struct echo_server *s = c->srv;

    if (c->closing)
        return;
    c->closing = 1;
    ev_io_stop(s->loop, &c->rio);
    ev_io_stop(s->loop, &c->wio);
    close(c->fd);
    c->fd = -1;
    list_unlink(&s->live, c);
    list_push(&s->dead, c);
    s->n_conns--;
}

static void echo_conn_free(struct echo_conn *c)
{
    msgpack_unpacked_destroy(&c->msg);
    frame_reader_fini(&c->fr);
    free(c->out);
    free(c);
}

static void echo_on_reap(struct ev_loop *loop, ev_prepare *w, int revents)
{
    struct echo_server *s = w->data;

    (void)loop;
    (void)revents;
    while (s->dead) {
        struct echo_conn *c = s->dead;
        list_unlink(&s->dead, c);
        echo_conn_free(c);
    }
}

static int out_reserve(struct echo_conn *c, size_t n)
{
    return bench_out_reserve(&c->out, &c->out_len, &c->out_off, &c->out_cap, n);
}

/* Writes what is buffered; arms the write watcher only when the kernel
 * buffer is full, and pauses reading past the high-water mark. Returns -1
 * when the connection was closed. */
static int echo_conn_flush(struct echo_conn *c)
{
    struct echo_server *s = c->srv;

    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        echo_conn_close(c);
        return -1;
    }
    size_t pending = c->out_len - c->out_off;
    if (pending == 0) {
        c->out_off = c->out_len = 0;
        ev_io_stop(s->loop, &c->wio);
        if (!ev_is_active(&c->rio))
            ev_io_start(s->loop, &c->rio);
        return 0;
    }
    if (!ev_is_active(&c->wio))
        ev_io_start(s->loop, &c->wio);
    if (pending > ECHO_OUT_HIGH_WATER)
        ev_io_stop(s->loop, &c->rio);
    return 0;
}

static void put_be64(unsigned char *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        p[i] = (unsigned char)(v & 0xff);
        v >>= 8;
    }
}

static int echo_reply(struct echo_conn *c, uint32_t msgid)
{
    struct echo_server *s = c->srv;

    if (out_reserve(c, 2 + 5 + s->tail_len) < 0)
        return -1;
    unsigned char *p = (unsigned char *)c->out + c->out_len;
    size_t n = 0;
    p[n++] = 0x94;
    p[n++] = 0x01;
    n += pack_msgid(p + n, msgid);
    memcpy(p + n, s->tail, s->tail_len);
    c->out_len += n + s->tail_len;
    s->n_requests++;
    return 0;
}

static void echo_on_read(struct ev_loop *loop, ev_io *w, int revents)
{
    struct echo_conn *c = w->data;
    struct echo_server *s = c->srv;
    char *buf;
    size_t cap;

    (void)revents;
    if (frame_reader_reserve(&c->fr, ECHO_READ_CHUNK, &buf, &cap) < 0) {
        echo_conn_close(c);
        return;
    }
    ssize_t n = read(c->fd, buf, cap);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n <= 0) {
        echo_conn_close(c);
        return;
    }
    frame_reader_commit(&c->fr, (size_t)n);

    union {
        double d;
        uint64_t u;
    } up = { .d = ev_now(loop) - s->t_start };
    put_be64(s->tail + s->uptime_off, up.u);

    int rc;
    while ((rc = frame_reader_next(&c->fr, &c->msg, NULL)) == 1) {
        struct rpc_msg m;
        if (rpc_parse(&c->msg.data, &m, NULL) < 0 || m.type == RPC_RESPONSE) {
            rc = -1;
            break;
        }
        if (m.type == RPC_REQUEST && echo_reply(c, m.msgid) < 0) {
            rc = -1;
            break;
        }
    }
    /* Drop the last frame now: while it is alive it pins the unpacker's
     * buffer, which would make the next reserve copy instead of compact. */
    msgpack_unpacked_destroy(&c->msg);
    msgpack_unpacked_init(&c->msg);
    if (rc < 0) {
        echo_conn_close(c);
        return;
    }
    echo_conn_flush(c);
}

static void echo_on_write(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    echo_conn_flush(w->data);
}

static void echo_on_accept(struct ev_loop *loop, ev_io *w, int revents)
{
    struct echo_server *s = w->data;

    (void)revents;
    for (;;) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                fprintf(stderr, "echo_server: accept: %s\n", strerror(errno));
            return;
        }
        struct echo_conn *c = calloc(1, sizeof(*c));
        if (s->n_conns >= s->max_conns || !c ||
            frame_reader_init(&c->fr, ECHO_MAX_FRAME_BYTES, 2 * ECHO_READ_CHUNK) < 0) {
            free(c);
            close(fd);
            continue;
        }
        c->srv = s;
        c->fd = fd;
        msgpack_unpacked_init(&c->msg);
        ev_io_init(&c->rio, echo_on_read, fd, EV_READ);
        ev_io_init(&c->wio, echo_on_write, fd, EV_WRITE);
        c->rio.data = c->wio.data = c;
        ev_io_start(loop, &c->rio);
        list_push(&s->live, c);
        s->n_conns++;
        s->n_accepted++;
    }
}

static void echo_on_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
    (void)w;
    (void)revents;
    ev_break(loop, EVBREAK_ALL);
}

static int echo_build_tail(struct echo_server *s, const char *version)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_nil(&pk);
    msgpack_pack_map(&pk, 2);
    rpc_pack_str(&pk, "version");
    rpc_pack_str(&pk, version);
    rpc_pack_str(&pk, "uptime_s");
    msgpack_pack_double(&pk, 0.0);
    /* The float64 is last: 0xcb followed by its 8 bytes. */
    s->tail_len = sb.size;
    s->uptime_off = sb.size - 8;
    s->tail = (unsigned char *)msgpack_sbuffer_release(&sb);
    msgpack_sbuffer_destroy(&sb);
    return s->tail ? 0 : -1;
}

static int echo_listen(struct echo_server *s, const char *path)
{
    struct sockaddr_un sa;
    struct stat st;

    if (strlen(path) >= sizeof(sa.sun_path)) {
        fprintf(stderr, "echo_server: socket path too long: %s\n", path);
        return -1;
    }
    /* A stale socket from a killed run would make bind fail; remove it,
     * but never anything that is not a socket. */
    if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
        unlink(path);
    s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->lfd < 0) {
        fprintf(stderr, "echo_server: socket: %s\n", strerror(errno));
        return -1;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    if (bind(s->lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(s->lfd, 1024) < 0) {
        fprintf(stderr, "echo_server: bind/listen %s: %s\n", path, strerror(errno));
        close(s->lfd);
        s->lfd = -1;
        return -1;
    }
    snprintf(s->path, sizeof(s->path), "%s", path);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: echo_server --socket PATH [--max-conns N] [--version STR]\n"
            "  Answers every msgpack-RPC request with a ping-shaped reply\n"
            "  [1, msgid, nil, {version, uptime_s}]; exits 0 on SIGTERM/SIGINT.\n");
}

int main(int argc, char **argv)
{
    struct echo_server s;
    const char *path = NULL;
    const char *version = PGW_VERSION;

    memset(&s, 0, sizeof(s));
    s.lfd = -1;
    s.max_conns = 4096;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--socket") && v) {
            path = v;
            i++;
        } else if (!strcmp(a, "--version") && v) {
            version = v;
            i++;
        } else if (!strcmp(a, "--max-conns") && v) {
            char *end;
            unsigned long n = strtoul(v, &end, 10);
            if (*end || n == 0 || n > 65536) {
                fprintf(stderr, "echo_server: --max-conns: expected 1..65536, got %s\n", v);
                return 2;
            }
            s.max_conns = (unsigned)n;
            i++;
        } else {
            fprintf(stderr, "echo_server: unknown or incomplete option: %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }

    signal(SIGPIPE, SIG_IGN);
    s.loop = ev_default_loop(EVFLAG_AUTO);
    if (!s.loop) {
        fprintf(stderr, "echo_server: cannot initialise libev\n");
        return 1;
    }
    if (echo_build_tail(&s, version) < 0 || echo_listen(&s, path) < 0)
        return 1;
    s.t_start = ev_time();

    ev_io_init(&s.accept_io, echo_on_accept, s.lfd, EV_READ);
    s.accept_io.data = &s;
    ev_io_start(s.loop, &s.accept_io);
    ev_signal_init(&s.sig_term, echo_on_signal, SIGTERM);
    ev_signal_init(&s.sig_int, echo_on_signal, SIGINT);
    ev_signal_start(s.loop, &s.sig_term);
    ev_signal_start(s.loop, &s.sig_int);
    ev_prepare_init(&s.reap, echo_on_reap);
    s.reap.data = &s;
    ev_prepare_start(s.loop, &s.reap);

    printf("LISTENING %s\n", s.path);
    fflush(stdout);

    ev_run(s.loop, 0);

    while (s.live)
        echo_conn_close(s.live);
    echo_on_reap(s.loop, &s.reap, 0);
    ev_io_stop(s.loop, &s.accept_io);
    ev_signal_stop(s.loop, &s.sig_term);
    ev_signal_stop(s.loop, &s.sig_int);
    ev_prepare_stop(s.loop, &s.reap);
    close(s.lfd);
    unlink(s.path);
    free(s.tail);
    ev_loop_destroy(s.loop);
    fprintf(stderr, "echo_server: %" PRIu64 " requests on %" PRIu64 " connections\n", s.n_requests,
            s.n_accepted);
    return 0;
}
