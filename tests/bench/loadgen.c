/*
 * loadgen.c — msgpack-RPC load generator for a Unix stream socket.
 *
 *   loadgen --socket PATH [--clients N] [--requests TOTAL] [--duration S]
 *           [--method NAME] [--params-hex HEX | --params-json JSON | --params-file F]
 *           [--pipeline D] [--warmup N] [--threads T] [--timeout-ms MS]
 *           [--max-frame-bytes B] [--json]
 *
 * Design (the machine it was written for has 2 cores, shared with the
 * server under test, so the generator must cost little):
 *
 *  - N connections are opened up front, then split into T contiguous
 *    groups, one per thread (default T = 1); each thread multiplexes its connections with one
 *    level-triggered epoll set. No locks on the hot path: every thread has
 *    its own counters and histogram, merged after the run; the only shared
 *    write is one relaxed atomic add per request against the TOTAL budget.
 *  - Each connection keeps `pipeline` requests outstanding (default 1: a
 *    closed loop, one request at a time). A request occupies a slot; its
 *    msgid is `slot + pipeline * generation`, so a response finds its slot
 *    in O(1) even when a server answers out of order, and a stale or foreign
 *    msgid is detected (the slot's current msgid differs).
 *  - Latency = response read time - request encode time, both
 *    CLOCK_MONOTONIC. The send stamp is taken per request just before it is
 *    encoded and written; the receive stamp once per read() batch. With many
 *    connections per thread it therefore includes the generator's own
 *    queueing, like wrk and similar tools.
 *  - Latencies go into a log-linear histogram (128 linear sub-buckets per
 *    power of two of nanoseconds: every value is kept to within 0.4% when
 *    reported as the bucket midpoint; min, max and mean are exact).
 *  - Streamed calls (`"stream": true` in the params): the first `chunk`
 *    notification of an outstanding request, stamped like a response, is
 *    its time to first chunk, kept in a second histogram (ttft_* in the
 *    report; ttft_n = 0 when nothing was streamed).
 *
 * Validation: a response counts as ok only when it is a msgpack-RPC response
 * whose msgid is outstanding on that connection and whose error is nil.
 * Everything else is counted as an error event (so one request can be ok
 * and still leave a stray-response error behind), by kind: rpc (error not nil),
 * msgid (unknown or mismatched msgid), protocol (frame not msgpack-RPC, a
 * request from the server, an `error` notification, a broken stream),
 * timeout (no response within --timeout-ms), connection (outstanding
 * requests lost when the server closed the connection). Connections are not
 * re-opened; when all are gone the run ends. Only ok responses are timed;
 * the first error's text (an error response's code and message) is kept.
 *
 * Bounds: the run stops issuing after TOTAL requests or S seconds, whichever
 * comes first (S is capped at LG_HARD_CAP_S; with neither given, S = 5);
 * outstanding requests are then drained for at most --timeout-ms. An alarm
 * ends the process, whatever state it is in, if it is still alive
 * S + timeout + 30 s after it started (the 30 s cover connecting and warmup).
 *
 * Warmup: --warmup N sends N requests (split over the connections, not
 * counted in TOTAL) that are validated but not timed; their errors are
 * reported apart (warmup_errors). All threads drain them, then start the
 * measured phase together (a barrier).
 *
 * Output: a human summary, or with --json one flat JSON object on one line
 * (keys listed in lg_report_json). Exit status 0 when every measured request
 * was ok, 1 when any error happened or nothing completed, 2 on bad usage or
 * set-up failure, 3 when the hard-cap alarm fired.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <msgpack.h>

#include "bench_common.h"
#include "polygw.h"
#include "frame.h"
#include "rpc.h"

#define LG_HARD_CAP_S         120
#define LG_DEFAULT_DURATION_S 5.0
#define LG_MAX_CLIENTS        4096
#define LG_MAX_PIPELINE       4096
#define LG_MAX_THREADS        64
#define LG_READ_CHUNK         65536
#define LG_TICK_MS            20 /* epoll timeout: how often timeouts are checked */

/* ------------------------------------------------------------ run state */

struct lg_opts {
    const char *socket;
    unsigned clients, pipeline, threads;
    uint64_t total; /* 0: unlimited (duration bounds the run) */
    double duration_s;
    uint64_t warmup;
    const char *method;
    uint64_t timeout_ns;
    size_t max_frame_bytes;
    bool json;
};

struct lg_counts {
    uint64_t sent, ok;
    uint64_t err_rpc, err_msgid, err_proto, err_timeout, err_conn;
    uint64_t notifications;
    uint64_t resp_bytes; /* encoded size of the responses counted ok */
};

struct lg_slot {
    uint32_t msgid;
    uint32_t gen;
    bool busy;
    bool chunked; /* a `chunk` notification for this request has arrived */
    uint64_t t_send_ns;
};

struct lg_conn {
    int fd;
    bool dead;
    bool want_out; /* EPOLLOUT registered */
    struct frame_reader fr;
    msgpack_unpacked msg;
    char *out;
    size_t out_len, out_off, out_cap;
    struct lg_slot *slots;
    unsigned outstanding;
};

struct lg_shared {
    const struct lg_opts *o;
    const unsigned char *req_tail; /* method string + params, pre-encoded */
    size_t req_tail_len;
    atomic_uint_fast64_t issued; /* measured requests handed out, vs o->total */
    pthread_barrier_t barrier;
};

struct lg_thread {
    pthread_t tid;
    struct lg_shared *sh;
    int epfd;
    struct lg_conn *conns;
    unsigned n_conns, n_live;
    uint64_t warm_left;
    bool measuring;
    uint64_t deadline_ns; /* stop issuing at this time */
    uint64_t t0_ns, t_end_ns;
    uint64_t cpu_ns; /* this thread's CPU time in the measured phase */
    uint64_t warm_errors;
    struct lg_counts cnt;
    struct bench_hist hist;
    struct bench_hist ttft; /* request sent → its first `chunk` notification */
    char first_error[160];
};

static void lg_note_error(struct lg_thread *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void lg_note_error(struct lg_thread *t, const char *fmt, ...)
{
    if (t->first_error[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->first_error, sizeof(t->first_error), fmt, ap);
    va_end(ap);
}

static uint64_t lg_errors(const struct lg_counts *c)
{
    return c->err_rpc + c->err_msgid + c->err_proto + c->err_timeout + c->err_conn;
}

static void lg_counts_add(struct lg_counts *into, const struct lg_counts *c)
{
    into->sent += c->sent;
    into->ok += c->ok;
    into->err_rpc += c->err_rpc;
    into->err_msgid += c->err_msgid;
    into->err_proto += c->err_proto;
    into->err_timeout += c->err_timeout;
    into->err_conn += c->err_conn;
    into->notifications += c->notifications;
    into->resp_bytes += c->resp_bytes;
}

/* ---------------------------------------------------------- connection */

static int out_reserve(struct lg_conn *c, size_t n)
{
    return bench_out_reserve(&c->out, &c->out_len, &c->out_off, &c->out_cap, n);
}

static void lg_conn_kill(struct lg_thread *t, struct lg_conn *c, const char *why)
{
    if (c->dead)
        return;
    c->dead = true;
    if (c->outstanding > 0)
        lg_note_error(t, "connection lost with %u requests outstanding: %s", c->outstanding, why);
    t->cnt.err_conn += c->outstanding;
    for (unsigned i = 0; i < t->sh->o->pipeline; i++)
        c->slots[i].busy = false;
    c->outstanding = 0;
    close(c->fd); /* also removes it from the epoll set */
    c->fd = -1;
    t->n_live--;
}

static void lg_set_out_interest(struct lg_thread *t, struct lg_conn *c, bool want)
{
    if (c->want_out == want)
        return;
    struct epoll_event ev = { .events = EPOLLIN | (want ? EPOLLOUT : 0), .data.ptr = c };
    if (epoll_ctl(t->epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0)
        c->want_out = want;
}

static void lg_flush(struct lg_thread *t, struct lg_conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            lg_set_out_interest(t, c, true);
            return;
        }
        lg_conn_kill(t, c, n < 0 ? strerror(errno) : "send returned 0");
        return;
    }
    c->out_off = c->out_len = 0;
    lg_set_out_interest(t, c, false);
}

/* Hands out one request: from the warmup budget, or in the measured phase
 * while the deadline is ahead and the shared TOTAL budget lasts. */
static bool lg_may_issue(struct lg_thread *t, uint64_t now)
{
    if (!t->measuring) {
        if (t->warm_left == 0)
            return false;
        t->warm_left--;
        return true;
    }
    if (now >= t->deadline_ns)
        return false;
    if (t->sh->o->total &&
        atomic_fetch_add_explicit(&t->sh->issued, 1, memory_order_relaxed) >= t->sh->o->total)
        return false;
    return true;
}

/* Fills every free slot of `c` with a new request (encoded, not yet sent). */
static void lg_fill(struct lg_thread *t, struct lg_conn *c)
{
    const struct lg_shared *sh = t->sh;
    unsigned d = sh->o->pipeline;

    if (c->dead || c->outstanding == d)
        return;
    for (unsigned i = 0; i < d && c->outstanding < d; i++) {
        struct lg_slot *s = &c->slots[i];
        if (s->busy)
            continue;
        uint64_t now = mono_ns();
        if (!lg_may_issue(t, now))
            return;
        if (out_reserve(c, 2 + 5 + sh->req_tail_len) < 0) {
            lg_note_error(t, "out of memory");
            lg_conn_kill(t, c, "out of memory");
            return;
        }
        s->msgid = (uint32_t)(i + (uint64_t)d * s->gen);
        s->gen++;
        s->busy = true;
        s->chunked = false;
        s->t_send_ns = now;
        c->outstanding++;
        unsigned char *p = (unsigned char *)c->out + c->out_len;
        size_t n = 0;
        p[n++] = 0x94;
        p[n++] = 0x00;
        n += pack_msgid(p + n, s->msgid);
        memcpy(p + n, sh->req_tail, sh->req_tail_len);
        c->out_len += n + sh->req_tail_len;
        if (t->measuring)
            t->cnt.sent++;
    }
}

/* A streamed call's `chunk` notification, [msgid, event]: the first one of
 * an outstanding request is its time to first token. A chunk for no
 * outstanding request is a msgid error, like a stray response. */
static void lg_on_chunk(struct lg_thread *t, struct lg_conn *c, const msgpack_object *params,
                        uint64_t now)
{
    if (params->type != MSGPACK_OBJECT_ARRAY || params->via.array.size != 2 ||
        params->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
        params->via.array.ptr[0].via.u64 > UINT32_MAX) {
        t->cnt.err_proto++;
        lg_note_error(t, "chunk notification without a [msgid, event] array");
        return;
    }
    uint32_t msgid = (uint32_t)params->via.array.ptr[0].via.u64;
    struct lg_slot *s = &c->slots[msgid % t->sh->o->pipeline];
    if (!s->busy || s->msgid != msgid) {
        t->cnt.err_msgid++;
        lg_note_error(t, "chunk with unknown msgid %" PRIu32, msgid);
        return;
    }
    if (s->chunked)
        return;
    s->chunked = true;
    if (t->measuring)
        hist_record(&t->ttft, now - s->t_send_ns);
}

static void lg_on_frame(struct lg_thread *t, struct lg_conn *c, size_t bytes, uint64_t now)
{
    struct rpc_msg m;
    const char *why;
    unsigned d = t->sh->o->pipeline;

    if (rpc_parse(&c->msg.data, &m, &why) < 0) {
        t->cnt.err_proto++;
        lg_note_error(t, "not msgpack-RPC: %s", why);
        return;
    }
    if (m.type == RPC_NOTIFY) {
        t->cnt.notifications++;
        if (rpc_method_is(&m, "error")) {
            t->cnt.err_proto++;
            lg_note_error(t, "server sent an error notification");
        } else if (rpc_method_is(&m, "chunk")) {
            lg_on_chunk(t, c, m.params, now);
        }
        return;
    }
    if (m.type == RPC_REQUEST) {
        t->cnt.err_proto++;
        lg_note_error(t, "server sent a request");
        return;
    }
    struct lg_slot *s = &c->slots[m.msgid % d];
    if (!s->busy || s->msgid != m.msgid) {
        t->cnt.err_msgid++;
        lg_note_error(t, "response with unknown msgid %" PRIu32, m.msgid);
        return;
    }
    s->busy = false;
    c->outstanding--;
    if (t->measuring)
        t->t_end_ns = now;
    if (m.error->type != MSGPACK_OBJECT_NIL) {
        t->cnt.err_rpc++;
        if (!t->first_error[0]) {
            const msgpack_object *code = rpc_map_get(m.error, "code");
            const msgpack_object *msg = rpc_map_get(m.error, "message");
            int code_len = code && code->type == MSGPACK_OBJECT_STR ? (int)code->via.str.size : 0;
            int msg_len = msg && msg->type == MSGPACK_OBJECT_STR ? (int)msg->via.str.size : 0;
            lg_note_error(t, "error response: %.*s: %.*s", code_len,
                          code_len ? code->via.str.ptr : "", msg_len,
                          msg_len ? msg->via.str.ptr : "");
        }
        return;
    }
    t->cnt.ok++;
    t->cnt.resp_bytes += bytes;
    if (t->measuring)
        hist_record(&t->hist, now - s->t_send_ns);
}

static void lg_on_readable(struct lg_thread *t, struct lg_conn *c)
{
    char *buf;
    size_t cap;

    if (frame_reader_reserve(&c->fr, LG_READ_CHUNK, &buf, &cap) < 0) {
        lg_note_error(t, "out of memory");
        lg_conn_kill(t, c, "out of memory");
        return;
    }
    ssize_t n = read(c->fd, buf, cap);
    uint64_t now = mono_ns();
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n <= 0) {
        lg_conn_kill(t, c, n == 0 ? "closed by server" : strerror(errno));
        return;
    }
    frame_reader_commit(&c->fr, (size_t)n);

    int rc;
    size_t bytes;
    while ((rc = frame_reader_next(&c->fr, &c->msg, &bytes)) == 1)
        lg_on_frame(t, c, bytes, now);
    /* Release the last frame so it does not pin the unpacker's buffer. */
    msgpack_unpacked_destroy(&c->msg);
    msgpack_unpacked_init(&c->msg);
    if (rc < 0) {
        t->cnt.err_proto++;
        lg_note_error(t, "response stream broken: %s", frame_strerror(rc));
        lg_conn_kill(t, c, frame_strerror(rc));
        return;
    }
    lg_fill(t, c);
    lg_flush(t, c);
}

/* Frees the slots of requests older than the timeout (counted as errors)
 * and refills them. A late answer to such a request is then a msgid error. */
static void lg_expire(struct lg_thread *t, uint64_t now)
{
    unsigned d = t->sh->o->pipeline;

    for (unsigned k = 0; k < t->n_conns; k++) {
        struct lg_conn *c = &t->conns[k];
        if (c->dead || c->outstanding == 0)
            continue;
        bool freed = false;
        for (unsigned i = 0; i < d; i++) {
            struct lg_slot *s = &c->slots[i];
            if (s->busy && now - s->t_send_ns > t->sh->o->timeout_ns) {
                s->busy = false;
                c->outstanding--;
                t->cnt.err_timeout++;
                lg_note_error(t, "no response within %" PRIu64 " ms",
                              t->sh->o->timeout_ns / 1000000u);
                freed = true;
            }
        }
        if (freed) {
            lg_fill(t, c);
            lg_flush(t, c);
        }
    }
}

static unsigned lg_outstanding(const struct lg_thread *t)
{
    unsigned n = 0;
    for (unsigned k = 0; k < t->n_conns; k++)
        n += t->conns[k].outstanding;
    return n;
}

/* One phase: issue until the budget or the deadline runs out, then drain.
 * Returns when nothing is outstanding or no connection is left. */
static void lg_run_phase(struct lg_thread *t)
{
    struct epoll_event evs[256];
    uint64_t last_expire = mono_ns();

    for (unsigned k = 0; k < t->n_conns; k++) {
        lg_fill(t, &t->conns[k]);
        if (!t->conns[k].dead)
            lg_flush(t, &t->conns[k]);
    }
    while (t->n_live > 0 && lg_outstanding(t) > 0) {
        int n = epoll_wait(t->epfd, evs, (int)(sizeof(evs) / sizeof(evs[0])), LG_TICK_MS);
        if (n < 0 && errno != EINTR) {
            lg_note_error(t, "epoll_wait: %s", strerror(errno));
            break;
        }
        for (int i = 0; i < n; i++) {
            struct lg_conn *c = evs[i].data.ptr;
            if (c->dead)
                continue;
            if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
                lg_on_readable(t, c);
            if (!c->dead && (evs[i].events & EPOLLOUT))
                lg_flush(t, c);
        }
        uint64_t now = mono_ns();
        if (now - last_expire >= LG_TICK_MS * UINT64_C(1000000)) {
            last_expire = now;
            lg_expire(t, now);
        }
    }
}

static void *lg_thread_main(void *arg)
{
    struct lg_thread *t = arg;

    if (t->warm_left > 0) {
        t->measuring = false;
        lg_run_phase(t);
        t->warm_errors = lg_errors(&t->cnt);
        memset(&t->cnt, 0, sizeof(t->cnt));
    }
    pthread_barrier_wait(&t->sh->barrier);
    t->measuring = true;
    uint64_t cpu0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    t->t0_ns = t->t_end_ns = mono_ns();
    t->deadline_ns = t->t0_ns + (uint64_t)(t->sh->o->duration_s * 1e9);
    lg_run_phase(t);
    if (t->t_end_ns == t->t0_ns)
        t->t_end_ns = mono_ns();
    t->cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    return NULL;
}

/* ------------------------------------------------------------- set-up */

static int lg_connect(const char *path, char *err, size_t errlen)
{
    struct sockaddr_un sa;

    if (strlen(path) >= sizeof(sa.sun_path)) {
        snprintf(err, errlen, "socket path too long");
        return -1;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    /* A full listen backlog answers EAGAIN on Unix sockets: retry briefly. */
    for (int attempt = 0; attempt < 2000; attempt++) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            snprintf(err, errlen, "socket: %s", strerror(errno));
            return -1;
        }
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
            int fl = fcntl(fd, F_GETFL);
            if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
                snprintf(err, errlen, "fcntl: %s", strerror(errno));
                close(fd);
                return -1;
            }
            return fd;
        }
        int e = errno;
        close(fd);
        if (e != EAGAIN && e != EINTR) {
            snprintf(err, errlen, "connect %s: %s", path, strerror(e));
            return -1;
        }
        usleep(1000);
    }
    snprintf(err, errlen, "connect %s: listen backlog stayed full", path);
    return -1;
}

static int hex_decode(const char *hex, unsigned char **out, size_t *len)
{
    size_t n = strlen(hex);
    if (n == 0 || n % 2)
        return -1;
    unsigned char *p = malloc(n / 2);
    if (!p)
        return -1;
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v = 0;
        for (int k = 0; k < 2; k++) {
            char ch = hex[2 * i + (size_t)k];
            unsigned d;
            if (ch >= '0' && ch <= '9')
                d = (unsigned)(ch - '0');
            else if (ch >= 'a' && ch <= 'f')
                d = (unsigned)(ch - 'a' + 10);
            else if (ch >= 'A' && ch <= 'F')
                d = (unsigned)(ch - 'A' + 10);
            else {
                free(p);
                return -1;
            }
            v = v * 16 + d;
        }
        p[i] = (unsigned char)v;
    }
    *out = p;
    *len = n / 2;
    return 0;
}

/* Builds the constant part of every request: the method string followed by
 * the params (`[]` when neither option is given). Exactly one complete
 * msgpack value is accepted as params. Returns 0, or -1 with `err` filled. */
static int lg_build_tail(const char *method, const char *params_hex, const char *params_json,
                         const char *params_file, msgpack_sbuffer *sb, char *err, size_t errlen)
{
    msgpack_packer pk;
    size_t before;

    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    rpc_pack_str(&pk, method);
    before = sb->size;
    if (params_hex) {
        unsigned char *bytes;
        size_t len;
        if (hex_decode(params_hex, &bytes, &len) < 0) {
            snprintf(err, errlen, "--params-hex: not an even-length hex string");
            return -1;
        }
        int wrc = msgpack_sbuffer_write(sb, (const char *)bytes, len);
        free(bytes);
        if (wrc != 0) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    } else if (params_file) {
        FILE *f = fopen(params_file, "rb");
        if (!f) {
            snprintf(err, errlen, "--params-file %s: %s", params_file, strerror(errno));
            return -1;
        }
        char chunk[65536];
        size_t n;
        bool failed = false;
        while (!failed && (n = fread(chunk, 1, sizeof(chunk), f)) > 0)
            failed = msgpack_sbuffer_write(sb, chunk, n) != 0;
        failed = failed || ferror(f);
        fclose(f);
        if (failed) {
            snprintf(err, errlen, "--params-file %s: read error", params_file);
            return -1;
        }
    } else if (params_json) {
        struct pgw_error pe;
        void *mp;
        size_t mp_len;
        if (pgw_json_to_msgpack(params_json, (size_t)-1, &mp, &mp_len, &pe) != 0) {
            snprintf(err, errlen, "--params-json: %.200s", pe.message);
            return -1;
        }
        bool failed = msgpack_sbuffer_write(sb, mp, mp_len) != 0;
        free(mp);
        if (failed) {
            snprintf(err, errlen, "--params-json: out of memory");
            return -1;
        }
    } else {
        msgpack_pack_array(&pk, 0);
    }

    msgpack_unpacked u;
    size_t off = 0;
    msgpack_unpacked_init(&u);
    msgpack_unpack_return ret = msgpack_unpack_next(&u, sb->data + before, sb->size - before, &off);
    bool is_array = ret == MSGPACK_UNPACK_SUCCESS && u.data.type == MSGPACK_OBJECT_ARRAY;
    msgpack_unpacked_destroy(&u);
    if (ret != MSGPACK_UNPACK_SUCCESS || off != sb->size - before) {
        snprintf(err, errlen, "params: not exactly one msgpack value");
        return -1;
    }
    if (!is_array)
        fprintf(stderr,
                "loadgen: warning: params is not an array (the protocol wants [] or [map])\n");
    return 0;
}

/* ------------------------------------------------------------- report */

struct lg_result {
    struct lg_counts cnt;
    struct bench_hist hist;
    struct bench_hist ttft;
    uint64_t warm_errors;
    double elapsed_s;
    double cpu_pct; /* generator CPU, % of one core per thread */
    char first_error[160];
};

static void lg_report_json(FILE *f, const struct lg_opts *o, const struct lg_result *r)
{
    const struct lg_counts *c = &r->cnt;
    const struct bench_hist *h = &r->hist;

    fputs("{\"socket\":", f);
    json_str(f, o->socket);
    fputs(",\"method\":", f);
    json_str(f, o->method);
    fprintf(f, ",\"clients\":%u,\"pipeline\":%u,\"threads\":%u", o->clients, o->pipeline,
            o->threads);
    fprintf(f, ",\"total_limit\":%" PRIu64 ",\"duration_limit_s\":%.3f,\"warmup\":%" PRIu64,
            o->total, o->duration_s, o->warmup);
    fprintf(f, ",\"elapsed_s\":%.6f,\"sent\":%" PRIu64 ",\"ok\":%" PRIu64 ",\"errors\":%" PRIu64,
            r->elapsed_s, c->sent, c->ok, lg_errors(c));
    fprintf(f,
            ",\"err_rpc\":%" PRIu64 ",\"err_msgid\":%" PRIu64 ",\"err_proto\":%" PRIu64
            ",\"err_timeout\":%" PRIu64 ",\"err_conn\":%" PRIu64 ",\"warmup_errors\":%" PRIu64
            ",\"notifications\":%" PRIu64,
            c->err_rpc, c->err_msgid, c->err_proto, c->err_timeout, c->err_conn, r->warm_errors,
            c->notifications);
    bench_report_json_perf(f, h, c->ok, c->resp_bytes, r->elapsed_s, r->cpu_pct);
    bench_report_json_ttft(f, &r->ttft);
    fputs(",\"first_error\":", f);
    json_str(f, r->first_error);
    fputs("}\n", f);
}

static void lg_report_text(FILE *f, const struct lg_opts *o, const struct lg_result *r)
{
    const struct lg_counts *c = &r->cnt;
    const struct bench_hist *h = &r->hist;

    fprintf(f, "loadgen: %s method=%s clients=%u pipeline=%u threads=%u\n", o->socket, o->method,
            o->clients, o->pipeline, o->threads);
    fprintf(f,
            "  requests   %" PRIu64 " sent, %" PRIu64 " ok, %" PRIu64 " errors"
            " (rpc %" PRIu64 ", msgid %" PRIu64 ", protocol %" PRIu64 ", timeout %" PRIu64
            ", connection %" PRIu64 "; warmup %" PRIu64 ")\n",
            c->sent, c->ok, lg_errors(c), c->err_rpc, c->err_msgid, c->err_proto, c->err_timeout,
            c->err_conn, r->warm_errors);
    if (r->first_error[0])
        fprintf(f, "  first err  %s\n", r->first_error);
    bench_report_text_perf(f, h, c->ok, r->elapsed_s);
    bench_report_text_ttft(f, &r->ttft);
    fprintf(f, "  response   %.1f bytes on average\n",
            c->ok ? (double)c->resp_bytes / (double)c->ok : 0.0);
    fprintf(f, "  loadgen    %.0f%% CPU per thread (near 100: the generator is the bottleneck)\n",
            r->cpu_pct);
}

/* --------------------------------------------------------------- main */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: loadgen --socket PATH [options]\n"
            "  --clients N          concurrent connections (default 1, max %d)\n"
            "  --requests TOTAL     stop after TOTAL measured requests\n"
            "  --duration S         stop after S seconds (default %.0f when --requests is not\n"
            "                       given; always capped at %d)\n"
            "  --method NAME        RPC method (default ping)\n"
            "  --params-hex HEX     params as raw msgpack, hex-encoded (default: [] = 90)\n"
            "  --params-json JSON   params as JSON, converted to msgpack\n"
            "  --params-file FILE   params as raw msgpack read from FILE (large bodies)\n"
            "  --pipeline D         requests outstanding per connection (default 1, max %d)\n"
            "  --warmup N           untimed requests before measuring (default 0)\n"
            "  --threads T          generator threads (default 1, at most --clients)\n"
            "  --timeout-ms MS      per-request timeout, counted as an error (default 10000)\n"
            "  --max-frame-bytes B  largest response accepted (default 16777216)\n"
            "  --json               one-line JSON result instead of text\n"
            "exit: 0 all ok, 1 errors or nothing completed, 2 usage/set-up, 3 hard cap hit\n",
            LG_MAX_CLIENTS, LG_DEFAULT_DURATION_S, LG_HARD_CAP_S, LG_MAX_PIPELINE);
}

int main(int argc, char **argv)
{
    struct lg_opts o = {
        .pipeline = 1,
        .threads = 1,
        .method = "ping",
        .max_frame_bytes = 16u << 20,
    };
    const char *params_hex = NULL, *params_json = NULL, *params_file = NULL;
    struct bench_opts b;
    char err[256];

    bench_opts_init(&b);
    for (int i = 1; i < argc; i++) {
        int r = bench_opts_parse(&b, "loadgen", argc, argv, &i, LG_MAX_CLIENTS, LG_HARD_CAP_S);
        if (r == BENCH_OPT_HELP) {
            usage(stdout);
            return 0;
        }
        if (r != BENCH_OPT_OWN) {
            if (r == BENCH_OPT_BAD)
                return 2;
            continue;
        }
        const char *a = argv[i], *v = argv[i + 1];
        uint64_t u = 0;
        int bad = 0;

        if (!strcmp(a, "--socket")) {
            o.socket = v;
        } else if (!strcmp(a, "--method")) {
            o.method = v;
        } else if (!strcmp(a, "--params-hex")) {
            params_hex = v;
        } else if (!strcmp(a, "--params-file")) {
            params_file = v;
        } else if (!strcmp(a, "--params-json")) {
            params_json = v;
        } else if (!strcmp(a, "--pipeline")) {
            bad = parse_u64(v, 1, LG_MAX_PIPELINE, &u);
            o.pipeline = (unsigned)u;
        } else if (!strcmp(a, "--threads")) {
            bad = parse_u64(v, 1, LG_MAX_THREADS, &u);
            o.threads = (unsigned)u;
        } else if (!strcmp(a, "--max-frame-bytes")) {
            bad = parse_u64(v, 64, UINT64_C(1) << 30, &u);
            o.max_frame_bytes = (size_t)u;
        } else {
            fprintf(stderr, "loadgen: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "loadgen: bad or missing value for %s\n", a);
            return 2;
        }
        i++;
    }
    if (!o.socket) {
        usage(stderr);
        return 2;
    }
    if ((params_hex != NULL) + (params_json != NULL) + (params_file != NULL) > 1) {
        fprintf(stderr, "loadgen: --params-hex, --params-json and --params-file are exclusive\n");
        return 2;
    }
    bench_opts_finish(&b, "loadgen", LG_DEFAULT_DURATION_S, LG_HARD_CAP_S);
    o.clients = b.clients;
    o.total = b.total;
    o.duration_s = b.duration_s;
    o.warmup = b.warmup;
    o.timeout_ns = b.timeout_ms * 1000000u;
    o.json = b.json;
    if (o.threads > o.clients)
        o.threads = o.clients;

    msgpack_sbuffer tail;
    msgpack_sbuffer_init(&tail);
    if (lg_build_tail(o.method, params_hex, params_json, params_file, &tail, err, sizeof(err)) <
        0) {
        fprintf(stderr, "loadgen: %s\n", err);
        msgpack_sbuffer_destroy(&tail);
        return 2;
    }

    bench_arm_hard_cap("loadgen: hard time cap reached, aborting\n", o.duration_s, b.timeout_ms);

    struct lg_shared sh = { .o = &o,
                            .req_tail = (const unsigned char *)tail.data,
                            .req_tail_len = tail.size };
    atomic_init(&sh.issued, 0);
    pthread_barrier_init(&sh.barrier, NULL, o.threads);

    struct lg_conn *conns = calloc(o.clients, sizeof(*conns));
    struct lg_thread *th = calloc(o.threads, sizeof(*th));
    struct lg_slot *slots = calloc((size_t)o.clients * o.pipeline, sizeof(*slots));
    int rc = 2;
    unsigned n_open = 0, n_started = 0;
    if (!conns || !th || !slots) {
        fprintf(stderr, "loadgen: out of memory\n");
        goto out;
    }
    for (unsigned k = 0; k < o.threads; k++)
        th[k].epfd = -1;

    /* Connections are split into contiguous runs, one per thread. */
    for (unsigned k = 0; k < o.threads; k++) {
        struct lg_thread *t = &th[k];
        unsigned first = (unsigned)((uint64_t)o.clients * k / o.threads);
        unsigned last = (unsigned)((uint64_t)o.clients * (k + 1) / o.threads);
        t->sh = &sh;
        t->conns = conns + first;
        t->n_conns = last - first;
        t->warm_left = o.warmup * last / o.clients - o.warmup * first / o.clients;
    }
    for (unsigned i = 0; i < o.clients; i++) {
        struct lg_conn *c = &conns[i];
        c->fd = -1;
        c->slots = slots + (size_t)i * o.pipeline;
        msgpack_unpacked_init(&c->msg);
        if (frame_reader_init(&c->fr, o.max_frame_bytes, 2 * LG_READ_CHUNK) < 0) {
            fprintf(stderr, "loadgen: out of memory\n");
            goto out;
        }
        n_open++;
        c->fd = lg_connect(o.socket, err, sizeof(err));
        if (c->fd < 0) {
            fprintf(stderr, "loadgen: %s\n", err);
            goto out;
        }
    }
    for (unsigned k = 0; k < o.threads; k++) {
        struct lg_thread *t = &th[k];
        t->epfd = epoll_create1(EPOLL_CLOEXEC);
        if (t->epfd < 0) {
            fprintf(stderr, "loadgen: epoll_create1: %s\n", strerror(errno));
            goto out;
        }
        for (unsigned i = 0; i < t->n_conns; i++) {
            struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &t->conns[i] };
            if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->conns[i].fd, &ev) < 0) {
                fprintf(stderr, "loadgen: epoll_ctl: %s\n", strerror(errno));
                goto out;
            }
        }
        t->n_live = t->n_conns;
    }
    for (; n_started < o.threads; n_started++) {
        int e = pthread_create(&th[n_started].tid, NULL, lg_thread_main, &th[n_started]);
        if (e) {
            /* The barrier counts o.threads parties: with fewer threads the
             * started ones would wait forever, so give up at once. */
            fprintf(stderr, "loadgen: pthread_create: %s\n", strerror(e));
            _exit(2);
        }
    }
    for (unsigned k = 0; k < o.threads; k++)
        pthread_join(th[k].tid, NULL);

    struct lg_result *r = calloc(1, sizeof(*r));
    if (!r) {
        fprintf(stderr, "loadgen: out of memory\n");
        goto out;
    }
    uint64_t t0 = UINT64_MAX, t1 = 0, cpu = 0;
    for (unsigned k = 0; k < o.threads; k++) {
        struct lg_thread *t = &th[k];
        lg_counts_add(&r->cnt, &t->cnt);
        hist_merge(&r->hist, &t->hist);
        hist_merge(&r->ttft, &t->ttft);
        r->warm_errors += t->warm_errors;
        cpu += t->cpu_ns;
        if (t->t0_ns < t0)
            t0 = t->t0_ns;
        if (t->t_end_ns > t1)
            t1 = t->t_end_ns;
        if (!r->first_error[0] && t->first_error[0])
            memcpy(r->first_error, t->first_error, sizeof(r->first_error));
    }
    r->elapsed_s = t1 > t0 ? (double)(t1 - t0) / 1e9 : 0.0;
    if (r->elapsed_s > 0)
        r->cpu_pct = (double)cpu / 1e9 / r->elapsed_s / o.threads * 100.0;
    if (o.json)
        lg_report_json(stdout, &o, r);
    else
        lg_report_text(stdout, &o, r);
    rc = (lg_errors(&r->cnt) == 0 && r->warm_errors == 0 && r->cnt.ok > 0) ? 0 : 1;
    free(r);

out:
    for (unsigned k = 0; k < o.threads && th; k++)
        if (th[k].epfd >= 0)
            close(th[k].epfd);
    for (unsigned i = 0; i < n_open; i++) {
        if (conns[i].fd >= 0)
            close(conns[i].fd);
        msgpack_unpacked_destroy(&conns[i].msg);
        frame_reader_fini(&conns[i].fr);
        free(conns[i].out);
    }
    pthread_barrier_destroy(&sh.barrier);
    free(slots);
    free(th);
    free(conns);
    msgpack_sbuffer_destroy(&tail);
    return rc;
}
