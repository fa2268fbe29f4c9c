/*
 * polygw.c — libpolygw, the C client of the polygw sidecar (see polygw.h).
 *
 * Shape of a client:
 *
 *   owner thread ──pgw_send_*──▶ wlock ─▶ send(MSG_NOSIGNAL) ─▶ socket ─▶ sidecar
 *   other thread ──pgw_cancel──▶ wlock ─┘
 *   owner thread ◀─pgw_wait_*── request table ◀─ dispatch ◀─ frame_reader ◀─ recv
 *
 * The socket is non-blocking; every wait is a poll() bounded by a deadline
 * on CLOCK_MONOTONIC. Only the owner thread reads, dispatches, or touches
 * the request table; the write lock serialises whole frames so a cancel from
 * another thread can never land in the middle of a request.
 *
 * The request table holds one entry per request in flight:
 *
 *     send ──▶ WAITING ──response──▶ DONE ──wait──▶ (removed, result handed out)
 *                 │                    │
 *                 └──forget/timeout────┴──▶ (removed; a late answer finds no
 *                                             entry and is discarded)
 *
 * Chunks are delivered to the WAITING entry's handler as they are read, in
 * whichever wait happens to be reading. When the connection breaks (fatal
 * `error` notification, EOF, I/O or protocol error) the first cause is kept:
 * entries still WAITING finish with it, new sends get PGW_E_CLOSED.
 */
#include "polygw.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "jsonw.h"
#include "rpc.h"
#include "utf8.h"

#ifndef PGW_VERSION
#define PGW_VERSION "0.0.0"
#endif

#define DEFAULT_CONNECT_TIMEOUT_S 5.0
#define DEFAULT_REQUEST_TIMEOUT_S 30.0
#define DEFAULT_CALL_TIMEOUT_S    3600.0
#define DEFAULT_MAX_MESSAGE_BYTES ((size_t)64 << 20)
#define READ_CHUNK                65536
#define CONNECT_RETRY_MS          10

enum pend_state { PEND_WAITING, PEND_DONE };

struct pending {
    uint32_t msgid;
    enum pend_state state;
    bool is_call;     /* default wait is call_timeout_s */
    bool cancel_sent; /* the chunk handler asked to stop */
    pgw_chunk_fn *on_chunk;
    void *ud;
    struct pgw_result *res; /* PEND_DONE */
    uint64_t done_seq;      /* arrival order of responses, for pgw_wait_any() */
    char what[40];          /* "ping", "call 'chat'": for messages */
};

struct pgw_result {
    msgpack_unpacked frame; /* the whole response; owns the zone */
    const msgpack_object *obj;
    uint32_t msgid;
    bool is_error;
};

/* A msgpack_sbuffer that remembers allocation failure (msgpack's packers
 * return status codes that rpc_pack_* drop). */
struct wbuf {
    msgpack_sbuffer sb;
    bool oom;
};

struct pgw_client {
    int fd;
    size_t max_message_bytes;
    double connect_timeout_s;
    double request_timeout_s;
    double call_timeout_s;

    /* owner thread only */
    struct frame_reader rd;
    msgpack_unpacked frame; /* the frame being dispatched */
    struct wbuf wb;         /* packing buffer for requests */
    uint32_t next_msgid;
    struct pending *pend;
    size_t npend, cappend;
    uint64_t done_seq;
    bool in_callback;
    bool eof; /* the sidecar closed its side; seen but not yet acted on */
    bool broken;
    int broken_rc;
    struct pgw_error broken_err;

    /* under wlock: shared with pgw_cancel() from other threads */
    pthread_mutex_t wlock;
    bool wclosed; /* connection broken: refuse writes */
    bool wtorn;   /* a frame was left half-written: the stream is corrupt */
};

/* ---------------------------------------------------------------------
 * errors
 */

static void err_clear(struct pgw_error *e)
{
    if (!e)
        return;
    e->code = PGW_OK;
    snprintf(e->code_name, sizeof(e->code_name), "%s", pgw_code_name(PGW_OK));
    e->message[0] = '\0';
    e->retry_after_s = -1;
    e->attempts = 0;
    e->stalled_s = -1;
    e->status = 0;
}

__attribute__((format(printf, 3, 4))) static int err_set(struct pgw_error *e, int code,
                                                         const char *fmt, ...)
{
    if (!e)
        return code;
    err_clear(e);
    e->code = code;
    snprintf(e->code_name, sizeof(e->code_name), "%s", pgw_error_code_name(code));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    return code;
}

static const char *errno_str(int errnum, char *buf, size_t cap)
{
    return strerror_r(errnum, buf, cap); /* GNU variant: returns the text */
}

static void copy_str_trunc(const msgpack_object *o, char *buf, size_t cap)
{
    size_t n = o->via.str.size < cap - 1 ? o->via.str.size : cap - 1;
    memcpy(buf, o->via.str.ptr, n);
    buf[n] = '\0';
}

/* Fills `e` from an error map {code, message, retry_after_s?, attempts?,
 * stalled_s?, status?}. Lenient: a sidecar newer than this library may add
 * fields and codes. */
static void err_from_map(struct pgw_error *e, const msgpack_object *map)
{
    const msgpack_object *v;
    double d;

    if (!e)
        return;
    err_clear(e);
    e->code = PGW_INTERNAL;
    snprintf(e->code_name, sizeof(e->code_name), "%s", pgw_code_name(PGW_INTERNAL));
    v = rpc_map_get(map, "code");
    if (v && v->type == MSGPACK_OBJECT_STR) {
        int code = pgw_code_from_name(v->via.str.ptr, v->via.str.size);
        if (code > PGW_OK)
            e->code = code;
        copy_str_trunc(v, e->code_name, sizeof(e->code_name));
    }
    v = rpc_map_get(map, "message");
    if (v && v->type == MSGPACK_OBJECT_STR)
        copy_str_trunc(v, e->message, sizeof(e->message));
    else if (map->type != MSGPACK_OBJECT_MAP)
        snprintf(e->message, sizeof(e->message), "malformed error (%s) from the sidecar",
                 rpc_type_name(map));
    if ((v = rpc_map_get(map, "retry_after_s")) && rpc_as_double(v, &d) && d >= 0)
        e->retry_after_s = d;
    if ((v = rpc_map_get(map, "stalled_s")) && rpc_as_double(v, &d) && d >= 0)
        e->stalled_s = d;
    if ((v = rpc_map_get(map, "attempts")) && rpc_as_double(v, &d) && d >= 0 && d <= INT_MAX)
        e->attempts = (int)d;
    if ((v = rpc_map_get(map, "status")) && rpc_as_double(v, &d) && d >= 0 && d <= INT_MAX)
        e->status = (int)d;
}

const char *pgw_version(void)
{
    return PGW_VERSION;
}

const char *pgw_error_code_name(int code)
{
    switch (code) {
    case PGW_E_REMOTE:
        return "remote";
    case PGW_E_IO:
        return "io_error";
    case PGW_E_TIMEOUT:
        return "timeout";
    case PGW_E_PROTOCOL:
        return "protocol_error";
    case PGW_E_CONNECT:
        return "connect_failed";
    case PGW_E_NOMEM:
        return "out_of_memory";
    case PGW_E_INVALID:
        return "invalid_argument";
    case PGW_E_CLOSED:
        return "connection_closed";
    default:
        return code < 0 ? "unknown_error" : pgw_code_name((enum pgw_code)code);
    }
}

bool pgw_error_is_retry_later(const struct pgw_error *err)
{
    return err && err->code > PGW_OK && pgw_code_is_retry_later((enum pgw_code)err->code);
}

/* ---------------------------------------------------------------------
 * time
 */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Milliseconds to `deadline` for poll(), rounded up so that a wait never
 * ends early; 0 once it has passed. */
static int ms_left(double deadline)
{
    double left = deadline - now_s();
    if (left <= 0)
        return 0;
    double ms = ceil(left * 1000.0);
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* 0 → `dflt`; otherwise a finite positive number. */
static int resolve_timeout(double t, double dflt, double *out, struct pgw_error *err)
{
    if (t == 0) {
        *out = dflt;
        return 0;
    }
    if (!(t > 0) || isinf(t))
        return err_set(err, PGW_E_INVALID, "timeout must be a finite number of seconds > 0, got %g",
                       t);
    *out = t;
    return 0;
}

/* ---------------------------------------------------------------------
 * connection state
 */

/* Records the first cause of breakage; later ones are consequences. */
static void conn_break(struct pgw_client *c, int rc, const struct pgw_error *why)
{
    if (c->broken)
        return;
    c->broken = true;
    c->broken_rc = rc;
    c->broken_err = *why;
    pthread_mutex_lock(&c->wlock);
    c->wclosed = true;
    pthread_mutex_unlock(&c->wlock);
    /* Wakes a pgw_cancel() blocked in another thread; the fd itself stays
     * open until pgw_close() so that no thread ever uses a recycled fd. */
    shutdown(c->fd, SHUT_RDWR);
}

__attribute__((format(printf, 3, 4))) static void conn_break_local(struct pgw_client *c, int rc,
                                                                   const char *fmt, ...)
{
    struct pgw_error e;
    va_list ap;

    if (c->broken)
        return;
    err_clear(&e);
    e.code = rc;
    snprintf(e.code_name, sizeof(e.code_name), "%s", pgw_error_code_name(rc));
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof(e.message), fmt, ap);
    va_end(ap);
    conn_break(c, rc, &e);
}

/* The error for a request that was in flight when the connection broke. */
static int report_broken(struct pgw_client *c, struct pgw_error *err)
{
    if (err)
        *err = c->broken_err;
    return c->broken_rc;
}

/* The error for a new request on a broken connection. */
static int report_closed(struct pgw_client *c, struct pgw_error *err)
{
    return err_set(err, PGW_E_CLOSED, "connection unusable after an earlier error: %s: %s",
                   c->broken_err.code_name, c->broken_err.message);
}

/* ---------------------------------------------------------------------
 * request table
 */

static struct pending *pend_find(struct pgw_client *c, uint32_t msgid)
{
    for (size_t i = 0; i < c->npend; i++) {
        if (c->pend[i].msgid == msgid)
            return &c->pend[i];
    }
    return NULL;
}

static int pend_reserve(struct pgw_client *c)
{
    if (c->npend < c->cappend)
        return 0;
    size_t cap = c->cappend ? c->cappend * 2 : 16;
    struct pending *p = realloc(c->pend, cap * sizeof(*p));
    if (!p)
        return PGW_E_NOMEM;
    c->pend = p;
    c->cappend = cap;
    return 0;
}

/* Removes an entry (its result, if still attached, is freed). Order of the
 * table does not matter: pgw_wait_any() orders by done_seq. */
static void pend_remove(struct pgw_client *c, struct pending *p)
{
    pgw_result_free(p->res);
    *p = c->pend[--c->npend];
}

static uint32_t next_msgid(struct pgw_client *c)
{
    for (;;) {
        uint32_t id = c->next_msgid++;
        if (c->next_msgid == 0)
            c->next_msgid = 1;
        if (!pend_find(c, id))
            return id;
    }
}

/* ---------------------------------------------------------------------
 * socket I/O
 */

enum { READ_AGAIN = -1, READ_ERROR = -2, READ_NOMEM = -3 };

/* One recv() into the frame reader: 1 with bytes, 0 at EOF, or READ_*
 * (errno kept for READ_ERROR). Owner thread only. */
static int sock_read_some(struct pgw_client *c)
{
    char *buf;
    size_t cap;
    ssize_t n;

    if (frame_reader_reserve(&c->rd, READ_CHUNK, &buf, &cap) < 0)
        return READ_NOMEM;
    do
        n = recv(c->fd, buf, cap, 0);
    while (n < 0 && errno == EINTR);
    if (n > 0) {
        frame_reader_commit(&c->rd, (size_t)n);
        return 1;
    }
    if (n == 0)
        return 0;
    return errno == EAGAIN || errno == EWOULDBLOCK ? READ_AGAIN : READ_ERROR;
}

/* Writes all of `buf` before `deadline`; *written says how much went out.
 * Called with wlock held. With `may_read` (owner thread only) readable bytes
 * are pulled into the frame reader meanwhile — not dispatched — so a
 * sidecar that stops reading until we read cannot deadlock a large write. */
static int sock_write_all(struct pgw_client *c, const char *buf, size_t len, double deadline,
                          bool may_read, size_t *written, struct pgw_error *err)
{
    char eb[128];
    size_t off = 0;

    while (off < len) {
        ssize_t n = send(c->fd, buf + off, len - off, MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            *written = off;
            return err_set(err, PGW_E_IO, "write to the sidecar failed: %s",
                           errno_str(errno, eb, sizeof(eb)));
        }
        struct pollfd p = { .fd = c->fd, .events = POLLOUT };
        if (may_read && !c->eof && frame_reader_pending(&c->rd) < c->max_message_bytes)
            p.events |= POLLIN;
        int ms = ms_left(deadline);
        if (ms == 0) {
            *written = off;
            return err_set(err, PGW_E_TIMEOUT,
                           "timed out writing to the sidecar (%zu of %zu bytes sent)", off, len);
        }
        int r = poll(&p, 1, ms);
        if (r < 0 && errno != EINTR) {
            *written = off;
            return err_set(err, PGW_E_IO, "poll: %s", errno_str(errno, eb, sizeof(eb)));
        }
        if (r > 0 && (p.revents & POLLIN)) {
            int rr = sock_read_some(c);
            if (rr == 0 || rr == READ_ERROR)
                c->eof = true; /* stop reading here; the wait reports it */
            else if (rr == READ_NOMEM) {
                *written = off;
                return err_set(err, PGW_E_NOMEM, "out of memory buffering the sidecar's output");
            }
        }
    }
    *written = off;
    return 0;
}

/* ---------------------------------------------------------------------
 * dispatch of incoming frames (owner thread)
 */

static int cancel_write(struct pgw_client *c, uint32_t msgid, struct pgw_error *err);

static void on_response(struct pgw_client *c, const struct rpc_msg *m)
{
    struct pending *p = pend_find(c, m->msgid);
    if (!p || p->state != PEND_WAITING)
        return; /* forgotten or timed out: a late answer, discarded */
    if (m->error->type != MSGPACK_OBJECT_NIL && m->error->type != MSGPACK_OBJECT_MAP) {
        conn_break_local(c, PGW_E_PROTOCOL, "response %" PRIu32 " has an error of type %s",
                         m->msgid, rpc_type_name(m->error));
        return;
    }
    struct pgw_result *r = malloc(sizeof(*r));
    if (!r) {
        /* The answer is lost, so its waiter could never finish: give up
         * on the connection rather than hang. */
        conn_break_local(c, PGW_E_NOMEM, "out of memory storing a response");
        return;
    }
    r->frame = c->frame; /* move: the objects live in the zone, not in the struct */
    msgpack_unpacked_init(&c->frame);
    r->msgid = m->msgid;
    r->is_error = m->error->type != MSGPACK_OBJECT_NIL;
    r->obj = r->is_error ? m->error : m->result;
    p->res = r;
    p->state = PEND_DONE;
    p->done_seq = ++c->done_seq;
}

static void on_chunk(struct pgw_client *c, const struct rpc_msg *m)
{
    const msgpack_object *pa = m->params;
    if (pa->type != MSGPACK_OBJECT_ARRAY || pa->via.array.size != 2 ||
        pa->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
        pa->via.array.ptr[0].via.u64 > UINT32_MAX) {
        conn_break_local(c, PGW_E_PROTOCOL,
                         "malformed chunk notification (expected [msgid, event])");
        return;
    }
    uint32_t id = (uint32_t)pa->via.array.ptr[0].via.u64;
    struct pending *p = pend_find(c, id);
    if (!p || p->state != PEND_WAITING || !p->on_chunk)
        return;
    c->in_callback = true;
    int stop = p->on_chunk(&pa->via.array.ptr[1], p->ud);
    c->in_callback = false;
    if (!stop)
        return;
    /* The handler may have changed the table's fields (never its shape):
     * look the entry up again. */
    p = pend_find(c, id);
    if (p && !p->cancel_sent) {
        p->cancel_sent = true;
        p->on_chunk = NULL;
        (void)cancel_write(c, id, NULL); /* failure surfaces on the next read or write */
    }
}

static void on_fatal(struct pgw_client *c, const struct rpc_msg *m)
{
    struct pgw_error e;
    const msgpack_object *pa = m->params;

    if (pa->type == MSGPACK_OBJECT_ARRAY && pa->via.array.size >= 1 &&
        pa->via.array.ptr[0].type == MSGPACK_OBJECT_MAP) {
        err_from_map(&e, &pa->via.array.ptr[0]);
    } else {
        err_clear(&e);
        e.code = PGW_INTERNAL;
        snprintf(e.code_name, sizeof(e.code_name), "%s", pgw_code_name(PGW_INTERNAL));
        snprintf(e.message, sizeof(e.message),
                 "the sidecar closed the connection "
                 "(malformed error notification)");
    }
    conn_break(c, PGW_E_REMOTE, &e);
}

static void dispatch_one(struct pgw_client *c)
{
    struct rpc_msg m;
    const char *why = "?";

    if (rpc_parse(&c->frame.data, &m, &why) < 0) {
        conn_break_local(c, PGW_E_PROTOCOL, "unexpected message from the sidecar: %s", why);
        return;
    }
    switch (m.type) {
    case RPC_RESPONSE:
        on_response(c, &m);
        break;
    case RPC_NOTIFY:
        if (rpc_method_is(&m, "chunk"))
            on_chunk(c, &m);
        else if (rpc_method_is(&m, "error"))
            on_fatal(c, &m);
        /* other notifications belong to newer sidecars: ignored */
        break;
    case RPC_REQUEST:
        /* the sidecar sends no requests today; ignore rather than fail */
        break;
    }
}

/* Dispatches every whole frame already buffered. */
static void dispatch_buffered(struct pgw_client *c)
{
    while (!c->broken) {
        int rc = frame_reader_next(&c->rd, &c->frame, NULL);
        if (rc == 0)
            return;
        if (rc < 0) {
            conn_break_local(c, rc == FRAME_ENOMEM ? PGW_E_NOMEM : PGW_E_PROTOCOL,
                             "bad frame from the sidecar: %s", frame_strerror(rc));
            return;
        }
        dispatch_one(c);
    }
}

/* Reads and dispatches whatever can be read without blocking (after a
 * failed write: the sidecar may have said why before it closed). */
static void drain_nonblocking(struct pgw_client *c)
{
    for (;;) {
        int rr = c->eof ? 0 : sock_read_some(c);
        if (rr == 1)
            continue;
        dispatch_buffered(c);
        if (rr == 0 || rr == READ_ERROR)
            conn_break_local(c, PGW_E_IO, "the sidecar closed the connection");
        else if (rr == READ_NOMEM)
            conn_break_local(c, PGW_E_NOMEM, "out of memory reading from the sidecar");
        return;
    }
}

static bool find_done(struct pgw_client *c, bool any, uint32_t msgid, size_t *idx)
{
    bool found = false;
    uint64_t best = UINT64_MAX;

    for (size_t i = 0; i < c->npend; i++) {
        struct pending *p = &c->pend[i];
        if (p->state != PEND_DONE)
            continue;
        if (!any && p->msgid == msgid) {
            *idx = i;
            return true;
        }
        if (any && p->done_seq < best) {
            best = p->done_seq;
            *idx = i;
            found = true;
        }
    }
    return found;
}

enum { WAIT_DONE, WAIT_TIMEOUT, WAIT_BROKEN };

/* Reads until request `msgid` (any request, with `any`) is answered, the
 * deadline passes, or the connection breaks. WAIT_DONE sets *idx. */
static int conn_wait(struct pgw_client *c, bool any, uint32_t msgid, double deadline, size_t *idx)
{
    char eb[128];

    for (;;) {
        dispatch_buffered(c);
        if (find_done(c, any, msgid, idx))
            return WAIT_DONE;
        if (c->eof)
            conn_break_local(c, PGW_E_IO, "the sidecar closed the connection");
        if (c->broken)
            return WAIT_BROKEN;
        int ms = ms_left(deadline);
        if (ms == 0)
            return WAIT_TIMEOUT;
        struct pollfd p = { .fd = c->fd, .events = POLLIN };
        int r = poll(&p, 1, ms);
        if (r < 0) {
            if (errno != EINTR)
                conn_break_local(c, PGW_E_IO, "poll: %s", errno_str(errno, eb, sizeof(eb)));
            continue;
        }
        if (r == 0)
            continue;
        int rr = sock_read_some(c);
        if (rr == 0)
            c->eof = true;
        else if (rr == READ_ERROR)
            conn_break_local(c, PGW_E_IO, "read from the sidecar failed: %s",
                             errno_str(errno, eb, sizeof(eb)));
        else if (rr == READ_NOMEM)
            conn_break_local(c, PGW_E_NOMEM, "out of memory reading from the sidecar");
    }
}

/* Hands out a finished entry's outcome and removes the entry. */
static int finish_entry(struct pgw_client *c, struct pending *p, struct pgw_result **out,
                        struct pgw_error *err)
{
    struct pgw_result *r = p->res;
    int rc = 0;

    p->res = NULL;
    if (r->is_error) {
        err_from_map(err, r->obj);
        rc = PGW_E_REMOTE;
    } else {
        err_clear(err);
    }
    if (out)
        *out = r;
    else
        pgw_result_free(r);
    pend_remove(c, p);
    return rc;
}

/* ---------------------------------------------------------------------
 * sending
 */

static int wbuf_write(void *data, const char *buf, size_t len)
{
    struct wbuf *w = data;
    if (msgpack_sbuffer_write(&w->sb, buf, len) != 0) {
        w->oom = true;
        return -1;
    }
    return 0;
}

/* The owner's frame write: serialised with pgw_cancel(); on a failed write
 * reads what the sidecar said before closing (e.g. `too_large`). */
static int conn_send(struct pgw_client *c, const char *buf, size_t len, double deadline,
                     struct pgw_error *err)
{
    struct pgw_error local;
    size_t written = 0;
    int rc = 0;

    if (!err)
        err = &local;
    pthread_mutex_lock(&c->wlock);
    bool torn = c->wtorn;
    if (!torn) {
        rc = sock_write_all(c, buf, len, deadline, true, &written, err);
        if (rc < 0 && written > 0)
            c->wtorn = true;
    }
    pthread_mutex_unlock(&c->wlock);
    if (torn) {
        conn_break_local(c, PGW_E_IO, "an earlier write was left incomplete");
        return report_closed(c, err);
    }
    if (rc == 0)
        return 0;
    if (rc == PGW_E_TIMEOUT && written == 0)
        return rc; /* nothing went out: the stream is intact */
    if (rc == PGW_E_IO) {
        drain_nonblocking(c);
        if (c->broken && c->broken_rc == PGW_E_REMOTE)
            return report_broken(c, err);
    }
    conn_break(c, rc, err);
    return rc;
}

/* Common guards of the owner-thread entry points. */
static int check_owner(struct pgw_client *c, struct pgw_error *err)
{
    if (!c)
        return err_set(err, PGW_E_INVALID, "client is NULL");
    if (c->in_callback)
        return err_set(err, PGW_E_INVALID, "not callable from a pgw callback");
    return 0;
}

static int check_params(const void *params, size_t len, struct pgw_error *err)
{
    msgpack_unpacked u;
    size_t off = 0;

    if (!params)
        return 0;
    if (len == 0)
        return err_set(err, PGW_E_INVALID, "params: empty buffer (use NULL for [])");
    msgpack_unpacked_init(&u);
    msgpack_unpack_return r = msgpack_unpack_next(&u, params, len, &off);
    bool ok = r == MSGPACK_UNPACK_SUCCESS && off == len && u.data.type == MSGPACK_OBJECT_ARRAY;
    msgpack_unpacked_destroy(&u);
    if (r == MSGPACK_UNPACK_NOMEM_ERROR)
        return err_set(err, PGW_E_NOMEM, "out of memory checking params");
    if (!ok)
        return err_set(err, PGW_E_INVALID, "params must be exactly one packed msgpack array");
    return 0;
}

/* What one request carries, besides its packed params. */
struct req {
    const char *method;
    const void *params; /* pre-packed array, or NULL... */
    size_t params_len;
    json_t *call_body; /* ...or, for `call`, the parsed body + call options */
    const char *capability;
    const struct pgw_call_options *copt;
};

static void pack_json(msgpack_packer *pk, json_t *j)
{
    const char *key;
    size_t klen, i;
    json_t *v;

    switch (json_typeof(j)) {
    case JSON_OBJECT:
        msgpack_pack_map(pk, json_object_size(j));
        json_object_keylen_foreach(j, key, klen, v)
        {
            rpc_pack_strn(pk, key, klen);
            pack_json(pk, v);
        }
        break;
    case JSON_ARRAY:
        msgpack_pack_array(pk, json_array_size(j));
        json_array_foreach(j, i, v) pack_json(pk, v);
        break;
    case JSON_STRING:
        rpc_pack_strn(pk, json_string_value(j), json_string_length(j));
        break;
    case JSON_INTEGER:
        msgpack_pack_int64(pk, json_integer_value(j));
        break;
    case JSON_REAL:
        msgpack_pack_double(pk, json_real_value(j));
        break;
    case JSON_TRUE:
        msgpack_pack_true(pk);
        break;
    case JSON_FALSE:
        msgpack_pack_false(pk);
        break;
    case JSON_NULL:
        msgpack_pack_nil(pk);
        break;
    }
}

static int parse_json(const char *what, const char *text, size_t len, json_t **out,
                      struct pgw_error *err)
{
    json_error_t je;
    *out = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (*out)
        return 0;
    if (json_error_code(&je) == json_error_out_of_memory)
        return err_set(err, PGW_E_NOMEM, "out of memory parsing %s", what);
    return err_set(err, PGW_E_INVALID, "%s: invalid JSON: %s (line %d, column %d)", what, je.text,
                   je.line, je.column);
}

static void pack_call_params(msgpack_packer *pk, const struct req *q)
{
    const struct pgw_call_options *o = q->copt;
    size_t n = 2 + (o && o->stream) + (o && o->scope) + (o && o->task_id) +
        (o && o->deadline_s > 0) + (o && o->model) + (o && (o->traceparent || o->tracestate));

    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, n);
    rpc_pack_str(pk, "capability");
    rpc_pack_str(pk, q->capability);
    rpc_pack_str(pk, "body");
    pack_json(pk, q->call_body);
    if (o && o->stream) {
        rpc_pack_str(pk, "stream");
        msgpack_pack_true(pk);
    }
    if (o && o->scope) {
        rpc_pack_str(pk, "scope");
        rpc_pack_str(pk, o->scope);
    }
    if (o && o->task_id) {
        rpc_pack_str(pk, "task_id");
        rpc_pack_str(pk, o->task_id);
    }
    if (o && o->deadline_s > 0) {
        rpc_pack_str(pk, "deadline_s");
        msgpack_pack_double(pk, o->deadline_s);
    }
    if (o && o->model) {
        rpc_pack_str(pk, "model");
        rpc_pack_str(pk, o->model);
    }
    if (o && (o->traceparent || o->tracestate)) {
        rpc_pack_str(pk, "trace");
        msgpack_pack_map(pk, (o->traceparent != NULL) + (o->tracestate != NULL));
        if (o->traceparent) {
            rpc_pack_str(pk, "traceparent");
            rpc_pack_str(pk, o->traceparent);
        }
        if (o->tracestate) {
            rpc_pack_str(pk, "tracestate");
            rpc_pack_str(pk, o->tracestate);
        }
    }
}

/* Packs and writes one request and records it as in flight. */
static int send_req(struct pgw_client *c, const struct req *q, double deadline, uint32_t *msgid,
                    struct pgw_error *err)
{
    msgpack_packer pk;
    int rc;

    if (c->broken)
        return report_closed(c, err);
    if (pend_reserve(c) < 0)
        return err_set(err, PGW_E_NOMEM, "out of memory");
    uint32_t id = next_msgid(c);
    msgpack_sbuffer_clear(&c->wb.sb);
    c->wb.oom = false;
    msgpack_packer_init(&pk, &c->wb, wbuf_write);
    rpc_pack_request_begin(&pk, id, q->method);
    if (q->call_body)
        pack_call_params(&pk, q);
    else if (q->params)
        wbuf_write(&c->wb, q->params, q->params_len);
    else
        msgpack_pack_array(&pk, 0);
    if (c->wb.oom)
        return err_set(err, PGW_E_NOMEM, "out of memory packing the request");
    if ((rc = conn_send(c, c->wb.sb.data, c->wb.sb.size, deadline, err)) < 0)
        return rc;

    struct pending *p = &c->pend[c->npend++];
    memset(p, 0, sizeof(*p));
    p->msgid = id;
    p->state = PEND_WAITING;
    p->is_call = q->call_body != NULL || strcmp(q->method, "call") == 0;
    if (q->call_body) {
        snprintf(p->what, sizeof(p->what), "call '%s'", q->capability);
        if (q->copt) {
            p->on_chunk = q->copt->on_chunk;
            p->ud = q->copt->ud;
        }
    } else {
        snprintf(p->what, sizeof(p->what), "'%s'", q->method);
    }
    *msgid = id;
    err_clear(err);
    return 0;
}

/* Validates a call and parses its body; *body is owned by the caller. */
static int prepare_call(const char *capability, const char *body_json,
                        const struct pgw_call_options *opt, json_t **body, struct pgw_error *err)
{
    int rc;

    *body = NULL;
    if (!capability || !*capability)
        return err_set(err, PGW_E_INVALID, "capability must be a non-empty string");
    if (!body_json)
        return err_set(err, PGW_E_INVALID, "body must be a JSON object, got NULL");
    if (opt && opt->scope && !*opt->scope)
        return err_set(err, PGW_E_INVALID, "scope must be NULL or non-empty");
    if (opt && opt->task_id && !*opt->task_id)
        return err_set(err, PGW_E_INVALID, "task_id must be NULL or non-empty");
    if (opt && (opt->deadline_s < 0 || isnan(opt->deadline_s) || isinf(opt->deadline_s)))
        return err_set(err, PGW_E_INVALID, "deadline_s must be a finite number >= 0, got %g",
                       opt->deadline_s);
    if ((rc = parse_json("body", body_json, strlen(body_json), body, err)) < 0)
        return rc;
    if (!json_is_object(*body)) {
        json_decref(*body);
        *body = NULL;
        return err_set(err, PGW_E_INVALID, "body must be a JSON object");
    }
    return 0;
}

/* ---------------------------------------------------------------------
 * public API: connection
 */

int pgw_connect(const char *socket_path, const struct pgw_options *opt, struct pgw_client **out,
                struct pgw_error *err)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    struct pgw_options o = { 0 };
    struct pgw_client *c;
    char eb[128];
    int rc;

    err_clear(err);
    if (!out)
        return err_set(err, PGW_E_INVALID, "out is NULL");
    *out = NULL;
    if (opt)
        o = *opt;
    if (o.connect_timeout_s < 0 || o.request_timeout_s < 0 || o.call_timeout_s < 0 ||
        isnan(o.connect_timeout_s) || isnan(o.request_timeout_s) || isnan(o.call_timeout_s) ||
        isinf(o.connect_timeout_s) || isinf(o.request_timeout_s) || isinf(o.call_timeout_s))
        return err_set(err, PGW_E_INVALID, "timeouts must be finite and >= 0");
    if (!socket_path || !*socket_path)
        socket_path = getenv("POLYGW_SOCKET");
    if (!socket_path || !*socket_path)
        socket_path = PGW_DEFAULT_SOCKET;
    size_t plen = strlen(socket_path);
    if (plen >= sizeof(sa.sun_path))
        return err_set(err, PGW_E_CONNECT, "socket path too long (%zu bytes, at most %zu)", plen,
                       sizeof(sa.sun_path) - 1);
    memcpy(sa.sun_path, socket_path, plen + 1);

    if (!(c = calloc(1, sizeof(*c))))
        return err_set(err, PGW_E_NOMEM, "out of memory");
    c->connect_timeout_s =
        o.connect_timeout_s > 0 ? o.connect_timeout_s : DEFAULT_CONNECT_TIMEOUT_S;
    c->request_timeout_s =
        o.request_timeout_s > 0 ? o.request_timeout_s : DEFAULT_REQUEST_TIMEOUT_S;
    c->call_timeout_s = o.call_timeout_s > 0 ? o.call_timeout_s : DEFAULT_CALL_TIMEOUT_S;
    c->max_message_bytes = o.max_message_bytes ? o.max_message_bytes : DEFAULT_MAX_MESSAGE_BYTES;
    c->next_msgid = 1;
    c->fd = -1;
    msgpack_unpacked_init(&c->frame);
    msgpack_sbuffer_init(&c->wb.sb);
    if (pthread_mutex_init(&c->wlock, NULL) != 0) {
        free(c);
        return err_set(err, PGW_E_NOMEM, "cannot create a mutex");
    }
    if (frame_reader_init(&c->rd, c->max_message_bytes, READ_CHUNK) < 0) {
        pthread_mutex_destroy(&c->wlock);
        free(c);
        return err_set(err, PGW_E_NOMEM, "out of memory");
    }

    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        rc = err_set(err, PGW_E_CONNECT, "socket: %s", errno_str(errno, eb, sizeof(eb)));
        goto fail;
    }
    /* A non-blocking AF_UNIX connect() either completes at once or fails
     * with EAGAIN when the listener's backlog is full: retry until the
     * deadline. (EINPROGRESS is handled too, for completeness.) */
    double deadline = now_s() + c->connect_timeout_s;
    for (;;) {
        if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
            break;
        int e = errno;
        if (e == EINTR)
            continue;
        if (e == EAGAIN || e == EINPROGRESS) {
            int ms = ms_left(deadline);
            if (ms == 0) {
                rc = err_set(err, PGW_E_CONNECT, "%s: connect timed out after %gs (%s)",
                             socket_path, c->connect_timeout_s,
                             e == EAGAIN ? "listen backlog full" : "in progress");
                goto fail;
            }
            if (e == EAGAIN) {
                poll(NULL, 0, ms < CONNECT_RETRY_MS ? ms : CONNECT_RETRY_MS);
                continue;
            }
            struct pollfd p = { .fd = c->fd, .events = POLLOUT };
            int so = 0;
            socklen_t sl = sizeof(so);
            if (poll(&p, 1, ms) <= 0)
                continue;
            if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &so, &sl) == 0 && so == 0)
                break;
            e = so ? so : errno;
        }
        rc = err_set(err, PGW_E_CONNECT, "%s: %s", socket_path, errno_str(e, eb, sizeof(eb)));
        goto fail;
    }
    *out = c;
    return 0;

fail:
    pgw_close(c);
    return rc;
}

void pgw_close(struct pgw_client *c)
{
    if (!c)
        return;
    if (c->fd >= 0)
        close(c->fd);
    for (size_t i = 0; i < c->npend; i++)
        pgw_result_free(c->pend[i].res);
    free(c->pend);
    frame_reader_fini(&c->rd);
    msgpack_unpacked_destroy(&c->frame);
    msgpack_sbuffer_destroy(&c->wb.sb);
    pthread_mutex_destroy(&c->wlock);
    free(c);
}

bool pgw_is_broken(const struct pgw_client *c)
{
    return !c || c->broken;
}

size_t pgw_in_flight(const struct pgw_client *c)
{
    return c ? c->npend : 0;
}

/* ---------------------------------------------------------------------
 * public API: requests
 */

static int check_method(const char *method, struct pgw_error *err)
{
    if (!method || !*method)
        return err_set(err, PGW_E_INVALID, "method must be a non-empty string");
    return 0;
}

/* Waits for `msgid` until `deadline`; on timeout forgets it (and cancels it
 * first when `cancel`). */
static int wait_or_forget(struct pgw_client *c, uint32_t msgid, double deadline, double timeout_s,
                          bool cancel, struct pgw_result **out, struct pgw_error *err)
{
    size_t idx;
    struct pending *p;

    switch (conn_wait(c, false, msgid, deadline, &idx)) {
    case WAIT_DONE:
        return finish_entry(c, &c->pend[idx], out, err);
    case WAIT_BROKEN:
        p = pend_find(c, msgid);
        if (p)
            pend_remove(c, p);
        return report_broken(c, err);
    default:
        p = pend_find(c, msgid);
        int rc = err_set(err, PGW_E_TIMEOUT, "no answer to %s within %gs%s",
                         p ? p->what : "request", timeout_s, cancel ? " (cancel sent)" : "");
        if (cancel)
            (void)cancel_write(c, msgid, NULL);
        if (p)
            pend_remove(c, p);
        return rc;
    }
}

int pgw_request(struct pgw_client *c, const char *method, const void *params, size_t params_len,
                double timeout_s, struct pgw_result **out, struct pgw_error *err)
{
    struct req q = { .method = method, .params = params, .params_len = params_len };
    uint32_t id;
    double t = 0;
    int rc;

    if (out)
        *out = NULL;
    err_clear(err);
    if ((rc = check_owner(c, err)) < 0 || (rc = check_method(method, err)) < 0)
        return rc;
    /* A hand-packed `call` is still a call: its defaults and its cancel. */
    bool is_call = strcmp(method, "call") == 0;
    if ((rc = resolve_timeout(timeout_s, is_call ? c->call_timeout_s : c->request_timeout_s, &t,
                              err)) < 0 ||
        (rc = check_params(params, params_len, err)) < 0)
        return rc;
    double deadline = now_s() + t;
    if ((rc = send_req(c, &q, deadline, &id, err)) < 0)
        return rc;
    return wait_or_forget(c, id, deadline, t, is_call, out, err);
}

int pgw_ping(struct pgw_client *c, double timeout_s, char *version, size_t vlen, double *uptime_s,
             struct pgw_error *err)
{
    struct pgw_result *r;
    const msgpack_object *v;

    if (version && vlen)
        version[0] = '\0';
    if (uptime_s)
        *uptime_s = -1;
    int rc = pgw_request(c, "ping", NULL, 0, timeout_s, &r, err);
    if (rc < 0) {
        pgw_result_free(r);
        return rc;
    }
    if (r->obj->type != MSGPACK_OBJECT_MAP) {
        rc = err_set(err, PGW_E_PROTOCOL, "ping result is a %s, not a map", rpc_type_name(r->obj));
        pgw_result_free(r);
        return rc;
    }
    v = rpc_map_get(r->obj, "version");
    if (version && vlen && v && v->type == MSGPACK_OBJECT_STR)
        copy_str_trunc(v, version, vlen);
    v = rpc_map_get(r->obj, "uptime_s");
    if (uptime_s && v)
        rpc_as_double(v, uptime_s);
    pgw_result_free(r);
    return 0;
}

int pgw_stats(struct pgw_client *c, double timeout_s, struct pgw_result **out,
              struct pgw_error *err)
{
    return pgw_request(c, "stats", NULL, 0, timeout_s, out, err);
}

int pgw_call(struct pgw_client *c, const char *capability, const char *body_json,
             const struct pgw_call_options *opt, struct pgw_result **out, struct pgw_error *err)
{
    struct req q = { .method = "call", .capability = capability, .copt = opt };
    uint32_t id;
    double t = 0;
    int rc;

    if (out)
        *out = NULL;
    err_clear(err);
    if ((rc = check_owner(c, err)) < 0 ||
        (rc = resolve_timeout(opt ? opt->timeout_s : 0, c->call_timeout_s, &t, err)) < 0 ||
        (rc = prepare_call(capability, body_json, opt, &q.call_body, err)) < 0)
        return rc;
    double deadline = now_s() + t;
    rc = send_req(c, &q, deadline, &id, err);
    json_decref(q.call_body);
    if (rc < 0)
        return rc;
    if (opt && opt->on_start) {
        c->in_callback = true;
        opt->on_start(id, opt->ud);
        c->in_callback = false;
    }
    return wait_or_forget(c, id, deadline, t, true, out, err);
}

int pgw_send_request(struct pgw_client *c, const char *method, const void *params,
                     size_t params_len, uint32_t *msgid, struct pgw_error *err)
{
    struct req q = { .method = method, .params = params, .params_len = params_len };
    int rc;

    err_clear(err);
    if ((rc = check_owner(c, err)) < 0 || (rc = check_method(method, err)) < 0 ||
        (rc = check_params(params, params_len, err)) < 0)
        return rc;
    if (!msgid)
        return err_set(err, PGW_E_INVALID, "msgid is NULL");
    return send_req(c, &q, now_s() + c->request_timeout_s, msgid, err);
}

int pgw_send_call(struct pgw_client *c, const char *capability, const char *body_json,
                  const struct pgw_call_options *opt, uint32_t *msgid, struct pgw_error *err)
{
    struct req q = { .method = "call", .capability = capability, .copt = opt };
    double t = 0;
    int rc;

    err_clear(err);
    if ((rc = check_owner(c, err)) < 0)
        return rc;
    if (!msgid)
        return err_set(err, PGW_E_INVALID, "msgid is NULL");
    if ((rc = resolve_timeout(opt ? opt->timeout_s : 0, c->call_timeout_s, &t, err)) < 0 ||
        (rc = prepare_call(capability, body_json, opt, &q.call_body, err)) < 0)
        return rc;
    rc = send_req(c, &q, now_s() + t, msgid, err);
    json_decref(q.call_body);
    return rc;
}

int pgw_set_chunk_handler(struct pgw_client *c, uint32_t msgid, pgw_chunk_fn *fn, void *ud)
{
    struct pending *p = c ? pend_find(c, msgid) : NULL;
    if (!p)
        return PGW_E_INVALID;
    p->on_chunk = fn;
    p->ud = ud;
    return 0;
}

int pgw_wait_response(struct pgw_client *c, uint32_t msgid, double timeout_s,
                      struct pgw_result **out, struct pgw_error *err)
{
    struct pending *p;
    size_t idx;
    double t = 0;
    int rc;

    if (out)
        *out = NULL;
    err_clear(err);
    if ((rc = check_owner(c, err)) < 0)
        return rc;
    if (!(p = pend_find(c, msgid)))
        return err_set(err, PGW_E_INVALID, "msgid %" PRIu32 " is not in flight", msgid);
    if ((rc = resolve_timeout(timeout_s, p->is_call ? c->call_timeout_s : c->request_timeout_s, &t,
                              err)) < 0)
        return rc;
    switch (conn_wait(c, false, msgid, now_s() + t, &idx)) {
    case WAIT_DONE:
        return finish_entry(c, &c->pend[idx], out, err);
    case WAIT_BROKEN:
        if ((p = pend_find(c, msgid)))
            pend_remove(c, p);
        return report_broken(c, err);
    default:
        p = pend_find(c, msgid);
        return err_set(err, PGW_E_TIMEOUT, "no answer to %s within %gs", p ? p->what : "request",
                       t);
    }
}

int pgw_wait_any(struct pgw_client *c, double timeout_s, uint32_t *msgid, struct pgw_result **out,
                 struct pgw_error *err)
{
    size_t idx;
    double t = 0;
    int rc;

    if (out)
        *out = NULL;
    if (msgid)
        *msgid = 0;
    err_clear(err);
    if ((rc = check_owner(c, err)) < 0)
        return rc;
    if (!msgid)
        return err_set(err, PGW_E_INVALID, "msgid is NULL");
    if (c->npend == 0)
        return err_set(err, PGW_E_INVALID, "no request in flight");
    for (size_t i = 0; i < c->npend; i++) {
        double d = c->pend[i].is_call ? c->call_timeout_s : c->request_timeout_s;
        t = d > t ? d : t;
    }
    if ((rc = resolve_timeout(timeout_s, t, &t, err)) < 0)
        return rc;
    switch (conn_wait(c, true, 0, now_s() + t, &idx)) {
    case WAIT_DONE:
        *msgid = c->pend[idx].msgid;
        return finish_entry(c, &c->pend[idx], out, err);
    case WAIT_BROKEN:
        /* Finish one request per call, so a drain loop terminates. */
        *msgid = c->pend[0].msgid;
        pend_remove(c, &c->pend[0]);
        return report_broken(c, err);
    default:
        return err_set(err, PGW_E_TIMEOUT, "no answer to any of %zu requests within %gs", c->npend,
                       t);
    }
}

int pgw_forget(struct pgw_client *c, uint32_t msgid)
{
    struct pending *p;

    if (!c || c->in_callback || !(p = pend_find(c, msgid)))
        return PGW_E_INVALID;
    pend_remove(c, p);
    return 0;
}

/* A tiny fixed buffer for the cancel notification, so that pgw_cancel()
 * allocates nothing and shares no buffer with the owner thread. */
struct fixbuf {
    char b[32];
    size_t n;
};

static int fixbuf_write(void *data, const char *buf, size_t len)
{
    struct fixbuf *f = data;
    if (len > sizeof(f->b) - f->n)
        return -1;
    memcpy(f->b + f->n, buf, len);
    f->n += len;
    return 0;
}

/* Writes [2, "cancel", [msgid]] under the write lock. Touches no owner
 * state, so it is safe from any thread and from dispatch. */
static int cancel_write(struct pgw_client *c, uint32_t msgid, struct pgw_error *err)
{
    struct fixbuf f = { .n = 0 };
    msgpack_packer pk;
    size_t written = 0;
    int rc;

    msgpack_packer_init(&pk, &f, fixbuf_write);
    rpc_pack_notify_begin(&pk, "cancel");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_uint32(&pk, msgid);

    pthread_mutex_lock(&c->wlock);
    if (c->wclosed || c->wtorn) {
        pthread_mutex_unlock(&c->wlock);
        return err_set(err, PGW_E_CLOSED, "connection unusable after an earlier error");
    }
    rc = sock_write_all(c, f.b, f.n, now_s() + c->request_timeout_s, false, &written, err);
    if (rc < 0 && written > 0)
        c->wtorn = true;
    pthread_mutex_unlock(&c->wlock);
    return rc;
}

int pgw_cancel(struct pgw_client *c, uint32_t msgid, struct pgw_error *err)
{
    err_clear(err);
    if (!c)
        return err_set(err, PGW_E_INVALID, "client is NULL");
    return cancel_write(c, msgid, err);
}

/* ---------------------------------------------------------------------
 * results and helpers
 */

const msgpack_object *pgw_result_object(const struct pgw_result *r)
{
    return r ? r->obj : NULL;
}

bool pgw_result_is_error(const struct pgw_result *r)
{
    return r && r->is_error;
}

uint32_t pgw_result_msgid(const struct pgw_result *r)
{
    return r ? r->msgid : 0;
}

void pgw_result_free(struct pgw_result *r)
{
    if (!r)
        return;
    msgpack_unpacked_destroy(&r->frame);
    free(r);
}

const msgpack_object *pgw_object_get(const msgpack_object *map, const char *key)
{
    return key ? rpc_map_get(map, key) : NULL;
}

bool pgw_object_number(const msgpack_object *o, double *v)
{
    return o && v && rpc_as_double(o, v);
}

int pgw_json_to_msgpack(const char *json, size_t len, void **out, size_t *out_len,
                        struct pgw_error *err)
{
    struct wbuf w = { .oom = false };
    msgpack_packer pk;
    json_t *j;
    int rc;

    err_clear(err);
    if (!json || !out || !out_len)
        return err_set(err, PGW_E_INVALID, "json, out and out_len must not be NULL");
    *out = NULL;
    *out_len = 0;
    if ((rc = parse_json("JSON", json, len == (size_t)-1 ? strlen(json) : len, &j, err)) < 0)
        return rc;
    msgpack_sbuffer_init(&w.sb);
    msgpack_packer_init(&pk, &w, wbuf_write);
    pack_json(&pk, j);
    json_decref(j);
    if (w.oom) {
        msgpack_sbuffer_destroy(&w.sb);
        return err_set(err, PGW_E_NOMEM, "out of memory packing JSON");
    }
    *out_len = w.sb.size;
    *out = msgpack_sbuffer_release(&w.sb);
    return 0;
}

/* --- msgpack → JSON --------------------------------------------------- */

/* The JSON text being built; the first failed append sticks in `oom`. */
struct jbuf {
    struct strbuf b;
    bool oom;
};

static void jb_put(struct jbuf *b, const char *s, size_t n)
{
    if (!b->oom && strbuf_put(&b->b, s, n) < 0)
        b->oom = true;
}

static void jb_puts(struct jbuf *b, const char *s)
{
    jb_put(b, s, strlen(s));
}

static void jb_newline(struct jbuf *b, int depth)
{
    jb_put(b, "\n", 1);
    for (int i = 0; i < depth; i++)
        jb_put(b, "  ", 2);
}

/* A sidecar only sends valid UTF-8; anything else is still shown, each
 * invalid subpart as U+FFFD, rather than failing the whole conversion. */
static void json_str(struct jbuf *b, const char *s, size_t n)
{
    size_t start = b->b.len, bad_at;

    if (b->oom)
        return;
    int rc = jsonw_str(&b->b, s, n, &bad_at);
    if (rc == JSONW_EBADUTF8) {
        struct strbuf fixed = { 0 };
        b->b.len = start;
        rc = utf8_repair(s, n, &fixed) < 0 ? STRBUF_ENOMEM
                                           : jsonw_str(&b->b, fixed.data, fixed.len, &bad_at);
        strbuf_fini(&fixed);
    }
    if (rc < 0)
        b->oom = true;
}

static void json_double(struct jbuf *b, double v, bool f32)
{
    if (b->oom)
        return;
    int rc = jsonw_double(&b->b, v, f32);
    if (rc == JSONW_ENOTFINITE)
        jb_puts(b, "null");
    else if (rc < 0)
        b->oom = true;
}

static void json_base64(struct jbuf *b, const char *s, size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *u = (const unsigned char *)s;
    char q[4];

    jb_put(b, "\"", 1);
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)u[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)u[i + 1] << 8;
        if (i + 2 < n)
            v |= u[i + 2];
        q[0] = tab[(v >> 18) & 63];
        q[1] = tab[(v >> 12) & 63];
        q[2] = i + 1 < n ? tab[(v >> 6) & 63] : '=';
        q[3] = i + 2 < n ? tab[v & 63] : '=';
        jb_put(b, q, 4);
    }
    jb_put(b, "\"", 1);
}

static void json_value(struct jbuf *b, const msgpack_object *o, int flags, int depth)
{
    char tmp[32];
    bool pretty = flags & PGW_JSON_PRETTY;

    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        jb_puts(b, "null");
        break;
    case MSGPACK_OBJECT_BOOLEAN:
        jb_puts(b, o->via.boolean ? "true" : "false");
        break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        if (!b->oom && jsonw_u64(&b->b, o->via.u64) < 0)
            b->oom = true;
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        if (!b->oom && jsonw_i64(&b->b, o->via.i64) < 0)
            b->oom = true;
        break;
    case MSGPACK_OBJECT_FLOAT32:
        json_double(b, o->via.f64, true);
        break;
    case MSGPACK_OBJECT_FLOAT64:
        json_double(b, o->via.f64, false);
        break;
    case MSGPACK_OBJECT_STR:
        json_str(b, o->via.str.ptr, o->via.str.size);
        break;
    case MSGPACK_OBJECT_BIN:
        json_base64(b, o->via.bin.ptr, o->via.bin.size);
        break;
    case MSGPACK_OBJECT_EXT:
        snprintf(tmp, sizeof(tmp), "{\"ext\":%d,\"data\":", (int)o->via.ext.type);
        jb_puts(b, tmp);
        json_base64(b, o->via.ext.ptr, o->via.ext.size);
        jb_puts(b, "}");
        break;
    case MSGPACK_OBJECT_ARRAY:
        if (o->via.array.size == 0) {
            jb_puts(b, "[]");
            break;
        }
        jb_puts(b, "[");
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            if (i)
                jb_puts(b, ",");
            if (pretty)
                jb_newline(b, depth + 1);
            json_value(b, &o->via.array.ptr[i], flags, depth + 1);
        }
        if (pretty)
            jb_newline(b, depth);
        jb_puts(b, "]");
        break;
    case MSGPACK_OBJECT_MAP:
        if (o->via.map.size == 0) {
            jb_puts(b, "{}");
            break;
        }
        jb_puts(b, "{");
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            if (i)
                jb_puts(b, ",");
            if (pretty)
                jb_newline(b, depth + 1);
            if (k->type == MSGPACK_OBJECT_STR) {
                json_str(b, k->via.str.ptr, k->via.str.size);
            } else {
                struct jbuf kb = { 0 };
                json_value(&kb, k, 0, 0);
                if (kb.oom)
                    b->oom = true;
                else
                    json_str(b, kb.b.data, kb.b.len);
                strbuf_fini(&kb.b);
            }
            jb_puts(b, pretty ? ": " : ":");
            json_value(b, &o->via.map.ptr[i].val, flags, depth + 1);
        }
        if (pretty)
            jb_newline(b, depth);
        jb_puts(b, "}");
        break;
    default:
        jb_puts(b, "null");
        break;
    }
}

char *pgw_object_to_json(const msgpack_object *o, int flags)
{
    struct jbuf b = { 0 };

    if (!o)
        jb_puts(&b, "null");
    else
        json_value(&b, o, flags, 0);
    if (b.oom) {
        strbuf_fini(&b.b);
        return NULL;
    }
    strbuf_terminate(&b.b);
    return b.b.data;
}

/* ---------------------------------------------------------------------
 * public API: tasks (PROTOCOL.md §4.4)
 *
 * Thin wrappers over pgw_request(): each packs its named parameters and
 * reads what it needs from the answer. No state is kept in the client:
 * the task lives in the sidecar, so a task may be driven from several
 * connections (or processes) at once.
 */

/* One named parameter of a task request. Optional ones are left out by the
 * caller, never sent as nil or as a default (PROTOCOL.md §2.2). */
struct tparam {
    const char *name;
    enum { TP_STR, TP_BOOL, TP_NUM, TP_TRACE } type; /* TP_TRACE: {traceparent: s} */
    const char *s;
    bool b;
    double d;
};

static int check_name(const char *what, const char *s, struct pgw_error *err)
{
    if (!s || !*s)
        return err_set(err, PGW_E_INVALID, "%s must be a non-empty string", what);
    return 0;
}

/* Sends `method` with params [{p...}] and waits (request_timeout_s). A
 * sidecar without the task methods says unknown_method: say so plainly. */
static int task_request(struct pgw_client *c, const char *method, const struct tparam *p, size_t n,
                        struct pgw_result **out, struct pgw_error *err)
{
    struct wbuf w = { .oom = false };
    msgpack_packer pk;
    int rc;

    msgpack_sbuffer_init(&w.sb);
    msgpack_packer_init(&pk, &w, wbuf_write);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, n);
    for (size_t i = 0; i < n; i++) {
        rpc_pack_str(&pk, p[i].name);
        switch (p[i].type) {
        case TP_STR:
            rpc_pack_str(&pk, p[i].s);
            break;
        case TP_BOOL:
            p[i].b ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk);
            break;
        case TP_NUM:
            msgpack_pack_double(&pk, p[i].d);
            break;
        case TP_TRACE:
            msgpack_pack_map(&pk, 1);
            rpc_pack_str(&pk, "traceparent");
            rpc_pack_str(&pk, p[i].s);
            break;
        }
    }
    if (w.oom) {
        msgpack_sbuffer_destroy(&w.sb);
        if (out)
            *out = NULL;
        return err_set(err, PGW_E_NOMEM, "out of memory packing %s", method);
    }
    rc = pgw_request(c, method, w.sb.data, w.sb.size, 0, out, err);
    msgpack_sbuffer_destroy(&w.sb);
    if (rc == PGW_E_REMOTE && err && err->code == PGW_UNKNOWN_METHOD) {
        char was[sizeof(err->message)];
        memcpy(was, err->message, sizeof(was));
        snprintf(err->message, sizeof(err->message),
                 "tasks are not supported by this sidecar (%s: %.400s)", method, was);
    }
    return rc;
}

/* task_request() for methods whose result must be a map; *out as there. */
static int task_request_map(struct pgw_client *c, const char *method, const struct tparam *p,
                            size_t n, struct pgw_result **out, struct pgw_error *err)
{
    struct pgw_result *r = NULL;
    int rc = task_request(c, method, p, n, &r, err);

    if (rc == 0 && r->obj->type != MSGPACK_OBJECT_MAP) {
        rc = err_set(err, PGW_E_PROTOCOL, "%s result is a %s, not a map", method,
                     rpc_type_name(r->obj));
        pgw_result_free(r);
        r = NULL;
    }
    if (out)
        *out = r;
    else
        pgw_result_free(r);
    return rc;
}

/* A task request whose one parameter is task_id, checked here first. With
 * want_map the result must be a map (task_request_map), else any result is
 * accepted (task_request). *out is NULL on every failure. */
static int task_id_request(struct pgw_client *c, const char *method, const char *task_id,
                           bool want_map, struct pgw_result **out, struct pgw_error *err)
{
    struct tparam p[] = { { .name = "task_id", .type = TP_STR, .s = task_id } };
    int rc;

    if (out)
        *out = NULL;
    err_clear(err);
    if ((rc = check_name("task_id", task_id, err)) < 0)
        return rc;
    if (want_map)
        return task_request_map(c, method, p, 1, out, err);
    return task_request(c, method, p, 1, out, err);
}

/* Copies a str object into buf (cap >= 1), cut at a UTF-8 boundary. */
static void copy_str_utf8(const msgpack_object *o, char *buf, size_t cap)
{
    size_t n = utf8_cut(o->via.str.ptr, o->via.str.size, cap - 1);

    if (n)
        memcpy(buf, o->via.str.ptr, n);
    buf[n] = '\0';
}

static bool get_str(const msgpack_object *map, const char *key, char *buf, size_t cap)
{
    const msgpack_object *v = rpc_map_get(map, key);
    if (!v || v->type != MSGPACK_OBJECT_STR)
        return false;
    copy_str_utf8(v, buf, cap);
    return true;
}

bool pgw_task_from_object(const msgpack_object *o, struct pgw_task *t)
{
    static const char *const states[] = { NULL, "running", "succeeded", "failed" };
    const msgpack_object *v;
    double d;

    if (!t)
        return false;
    memset(t, 0, sizeof(*t));
    t->started_at = t->updated_at = -1;
    t->runs = -1;
    if (!o || o->type != MSGPACK_OBJECT_MAP ||
        !get_str(o, "task_id", t->task_id, sizeof(t->task_id)) ||
        !get_str(o, "state", t->state_name, sizeof(t->state_name))) {
        memset(t, 0, sizeof(*t));
        t->started_at = t->updated_at = -1;
        t->runs = -1;
        return false;
    }
    t->state = PGW_TASK_STATE_OTHER;
    for (int i = PGW_TASK_RUNNING; i <= PGW_TASK_FAILED; i++) {
        if (strcmp(t->state_name, states[i]) == 0)
            t->state = (enum pgw_task_state)i;
    }
    get_str(o, "reason_kind", t->reason_kind, sizeof(t->reason_kind));
    get_str(o, "reason", t->reason, sizeof(t->reason));
    get_str(o, "node", t->node, sizeof(t->node));
    if ((v = rpc_map_get(o, "started_at")) && rpc_as_double(v, &d) && isfinite(d))
        t->started_at = d;
    if ((v = rpc_map_get(o, "updated_at")) && rpc_as_double(v, &d) && isfinite(d))
        t->updated_at = d;
    if ((v = rpc_map_get(o, "runs")) && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
        v->via.u64 <= INT64_MAX)
        t->runs = (int64_t)v->via.u64;
    return true;
}

int pgw_task_start(struct pgw_client *c, const char *task_id, struct pgw_result **out,
                   struct pgw_error *err)
{
    return task_id_request(c, "task.start", task_id, true, out, err);
}

int pgw_task_start_traced(struct pgw_client *c, const char *task_id, const char *traceparent,
                          struct pgw_result **out, struct pgw_error *err)
{
    struct tparam p[] = { { .name = "task_id", .type = TP_STR, .s = task_id },
                          { .name = "trace", .type = TP_TRACE, .s = traceparent } };
    int rc;

    if (!traceparent)
        return pgw_task_start(c, task_id, out, err);
    if (out)
        *out = NULL;
    err_clear(err);
    if ((rc = check_name("task_id", task_id, err)) < 0)
        return rc;
    return task_request_map(c, "task.start", p, 2, out, err);
}

int pgw_task_stop(struct pgw_client *c, const char *task_id, const char *reason,
                  struct pgw_error *err)
{
    struct tparam p[] = {
        { .name = "task_id", .type = TP_STR, .s = task_id },
        { .name = "reason", .type = TP_STR, .s = reason },
    };
    int rc;

    err_clear(err);
    if ((rc = check_name("task_id", task_id, err)) < 0)
        return rc;
    if (!reason)
        return err_set(err, PGW_E_INVALID, "reason must not be NULL");
    return task_request(c, "task.stop", p, 2, NULL, err);
}

int pgw_task_guard(struct pgw_client *c, const char *task_id, struct pgw_error *err)
{
    return task_id_request(c, "task.guard", task_id, false, NULL, err);
}

int pgw_task_node_begin(struct pgw_client *c, const char *task_id, const char *node,
                        double timeout_s, double *armed_timeout_s, struct pgw_error *err)
{
    struct tparam p[] = {
        { .name = "task_id", .type = TP_STR, .s = task_id },
        { .name = "node", .type = TP_STR, .s = node },
        { .name = "timeout_s", .type = TP_NUM, .d = timeout_s },
    };
    struct pgw_result *r = NULL;
    int rc;

    if (armed_timeout_s)
        *armed_timeout_s = -1;
    err_clear(err);
    if ((rc = check_name("task_id", task_id, err)) < 0 || (rc = check_name("node", node, err)) < 0)
        return rc;
    if (isnan(timeout_s) || isinf(timeout_s))
        return err_set(err, PGW_E_INVALID, "timeout_s must be finite, got %g", timeout_s);
    rc = task_request_map(c, "task.node_begin", p, timeout_s > 0 ? 3 : 2, &r, err);
    if (rc == 0 && armed_timeout_s) {
        const msgpack_object *v = rpc_map_get(r->obj, "timeout_s");
        double d;
        if (v && rpc_as_double(v, &d) && d >= 0)
            *armed_timeout_s = d;
    }
    pgw_result_free(r);
    return rc;
}

int pgw_task_node_end(struct pgw_client *c, const char *task_id, const char *node,
                      struct pgw_error *err)
{
    struct tparam p[] = {
        { .name = "task_id", .type = TP_STR, .s = task_id },
        { .name = "node", .type = TP_STR, .s = node },
    };
    int rc;

    err_clear(err);
    if ((rc = check_name("task_id", task_id, err)) < 0 || (rc = check_name("node", node, err)) < 0)
        return rc;
    return task_request(c, "task.node_end", p, 2, NULL, err);
}

int pgw_task_finish(struct pgw_client *c, const char *task_id, bool ok, const char *reason,
                    struct pgw_error *err)
{
    struct tparam p[] = {
        { .name = "task_id", .type = TP_STR, .s = task_id },
        { .name = "ok", .type = TP_BOOL, .b = ok },
        { .name = "reason", .type = TP_STR, .s = reason },
    };
    int rc;

    err_clear(err);
    if ((rc = check_name("task_id", task_id, err)) < 0)
        return rc;
    return task_request(c, "task.finish", p, reason ? 3 : 2, NULL, err);
}

int pgw_task_get(struct pgw_client *c, const char *task_id, struct pgw_result **out,
                 struct pgw_error *err)
{
    return task_id_request(c, "task.get", task_id, true, out, err);
}

int pgw_task_list(struct pgw_client *c, const char *state, struct pgw_result **out,
                  struct pgw_error *err)
{
    struct tparam p[] = { { .name = "state", .type = TP_STR, .s = state } };
    int rc;

    if (out)
        *out = NULL;
    err_clear(err);
    if (state && (rc = check_name("state", state, err)) < 0)
        return rc;
    return task_request_map(c, "task.list", p, state ? 1 : 0, out, err);
}

int pgw_task_node(struct pgw_client *c, const char *task_id, const char *node, double timeout_s,
                  pgw_task_node_fn *fn, void *ud, struct pgw_error *err)
{
    struct pgw_error local, end_err;
    int rc;

    if (!err)
        err = &local; /* fn always gets somewhere to say why */
    err_clear(err);
    if (!fn)
        return err_set(err, PGW_E_INVALID, "fn must not be NULL");
    if ((rc = check_name("task_id", task_id, err)) < 0 || (rc = check_name("node", node, err)) < 0)
        return rc;
    if ((rc = pgw_task_guard(c, task_id, err)) < 0 ||
        (rc = pgw_task_node_begin(c, task_id, node, timeout_s, NULL, err)) < 0)
        return rc;

    err_clear(err);
    int frc = fn(ud, err);
    if (frc != 0) {
        /* The first failure wins. After a stop or a watchdog expiry the
         * sidecar refuses node_end anyway: skip the round trip. */
        bool over = err->code == PGW_TASK_STOPPED || err->code == PGW_WATCHDOG_TIMEOUT;
        if (!over && !pgw_is_broken(c))
            (void)pgw_task_node_end(c, task_id, node, &end_err);
        return frc;
    }
    return pgw_task_node_end(c, task_id, node, err);
}
