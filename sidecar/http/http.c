/*
 * http.c — the HTTP/1.1 front end (see http.h and docs/HTTP.md).
 *
 * A connection goes through these phases, each bounded by the one phase
 * timer (the call itself is bounded by its own deadlines):
 *
 *   IDLE ──first byte──> HEAD ──headers complete──> BODY ──message complete──> SERVING
 *    ^  keepalive_timeout_s   header_timeout_s (408)    body_timeout_s (408)      │
 *    │  (header_timeout_s on a new connection)                                   │
 *    └──────────── answer queued, keep-alive ────────────────────────────────────┘
 *                  answer queued, close: CLOSING (flush, bounded by a linger timer)
 *
 * While SERVING, the timer runs only when answer bytes wait for the client
 * (send_timeout_s between writes): a client that stops reading a stream is
 * closed and its call cancelled, rather than holding a paused upstream.
 *
 * Requests are read by httpreq.c. Bad input is answered and the
 * connection closed, since the byte stream can no longer be trusted: an
 * unparsable request 400, a request line and headers over
 * http.max_header_bytes 431, a URL over HTTPREQ_URL_MAX 414, a body over
 * http.max_body_bytes 413 (refused at the headers when it has a
 * Content-Length, so Expect: 100-continue clients never send it).
 * Well-formed requests that are wrong (unknown path, invalid JSON, wrong
 * content type) get their status and the connection stays usable.
 *
 * A request is admitted or refused from its head (hc_admit: the route, who
 * is calling, the content type), before any byte of its body is kept. A
 * refused request that announces a body is answered with Connection:
 * close and its connection CLOSING with `draining`: the output is ended
 * once written (shutdown) and the input read and dropped until the client
 * closes or the linger timer expires, since closing with unread input would
 * reset the connection under the answer. So are the other answers to input
 * that was not read whole (400, 408, 413, ...).
 *
 * Unfinished input — a body being read, pipelined requests not parsed —
 * counts in srv->input_bytes with the msgpack front's partial frames:
 * past listen.max_buffered_input_bytes the connection holding the most, of
 * either front, is refused (net/input.h; here 503 overloaded).
 *
 * Pipelining: the parser pauses at the end of each request; bytes after it
 * stay in the input buffer (at most HTTP_IN_MAX: reading stops above it)
 * until the answer is queued. A call's answer is queued from call.c's
 * hooks, so the next request is parsed from a zero-delay timer, never
 * inside them. Whatever the answers (a call's, /metrics, an error), a
 * connection whose queued output passes listen.max_write_queue_bytes is
 * neither parsed further nor read until it falls to half of it, as
 * conn.c does for msgpack: a client that pipelines and never reads costs
 * about that budget.
 *
 * A client that disconnects (EOF, reset, a failed write) aborts its call
 * at once: call_abort_all() cancels the attempt and closes its upstream
 * connection, as the msgpack `cancel` does.
 *
 * Freeing follows conn.c: http_conn_close() closes the fd and queues the
 * connection on the dead list; an ev_prepare pass frees it after the
 * callbacks on the stack have unwound.
 */
#include "http.h"
#include "iplit.h"
#include "jsonw.h"
#include "rpc.h"
#include "dlist.h"
#include "httpreq.h"
#include "raw.h"
#include "strbuf.h"

#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "call/call.h"
#include "call/rawcall.h"
#include "core/models.h"
#include "core/server.h"
#include "net/input.h"
#include "net/listen.h"
#include "net/peer.h"
#include "codec/jscan.h"
#include "core/log.h"
#include "metrics/metrics.h"
#include "backend/backend.h"
#include "backend/respids.h"
#include "gemroute.h"
#include "status.h"
#include "task.h"
#include "call/tasks.h"
#include "ops/cacheops.h"
#include "codec/transcode.h"
#include "upstream/upstream.h"

#define HTTP_READ_CHUNK        (64 * 1024)
#define HTTP_IN_MAX            (1024 * 1024) /* unparsed input held while a request is served */
/* Buffers larger than this are freed once empty rather than kept: a
 * connection that once carried a large answer or body must not hold its
 * size while idle. */
#define HTTP_KEEP_BUFFER_BYTES (4 * HTTP_READ_CHUNK)
#define HTTP_LINGER_S          2.0 /* how long a closing connection may take to flush */
#define HTTP_ACCEPT_BATCH      64
#define HTTP_ACCEPT_PAUSE_S    0.1

/* "Bearer " and the longest app token fit; a longer Authorization (an SDK's
 * API key, say) is no token of ours and not an error by itself. */
_Static_assert(HTTPREQ_VAL_MAX >= 7 + CONFIG_APP_TOKEN_MAX, "an app token fits a header value");

enum hc_phase { HC_IDLE, HC_HEAD, HC_BODY, HC_SERVING, HC_CLOSING };

struct http_listener {
    int fd; /* -1 once closed */
    bool is_unix;
    ev_io w;
    ev_timer retry_w; /* re-arms accept after fd exhaustion */
    struct http_server *hs;
};

struct http_conn {
    struct http_server *hs;
    struct http_conn *prev, *next;
    uint64_t id;
    int fd;
    ev_io rio, wio;
    ev_timer phase_w; /* the current phase's deadline */
    ev_timer next_w;  /* zero delay: parse pipelined input after a call */
    struct call_sink sink;
    struct upstream_budget budget; /* unsent output + replies its call is receiving */
    struct reply_outlet tasks;     /* task answers, and those waiting for the backend */
    struct strbuf task_json;       /* a task answer's JSON */
    enum hc_phase phase;
    bool reading, closed, oom;
    bool out_paused; /* not parsed further: its queued output is over budget */
    bool answered;   /* the request was answered at its head (hc_admit refused it) */
    bool cors;       /* its Origin is one of http.allowed_origins: answers say so (CORS) */
    bool draining;   /* CLOSING: its input is read and dropped until EOF (hc_close_after_flush) */
    bool write_shut; /* draining, and its output is all written: shutdown(SHUT_WR) done */
    int route;       /* routes[] row of the request being served */
    size_t input_bytes; /* its share of srv->input_bytes (hc_account_input) */
    bool keep_alive;    /* of the request being served */
    bool stream_open;   /* an SSE answer's head is sent */
    bool sdk_retry;     /* X-Polygw-SDK-Retry: true */
    bool is_unix;       /* accepted on the Unix socket: `peer` holds its credentials */
    struct peer peer;
    char app[CONFIG_NAME_MAX]; /* the request's app once hc_identify resolved it, or "" */
    uint32_t seq;              /* call ids */
    struct strbuf in;          /* its live bytes are not parsed yet */
    struct strbuf out;         /* its live bytes are not written yet */
    char *body;
    size_t body_len, body_cap;
    size_t raw_limit; /* the request's body bound when it calls a raw capability, or 0 */
    char raw_cap[CONFIG_NAME_MAX]; /* that capability */
    /* The request is a Responses API follow-up (raw.h) of response resp_id. */
    bool followup;
    bool resume; /* ... a GET of it with stream=true: its event stream */
    char resp_id[RESPIDS_ID_MAX + 1];
    struct httpreq req; /* the request being read (httpreq.h) */
};

struct http_server {
    struct server *srv;
    struct http_listener lis[2]; /* [0] Unix socket, [1] TCP */
    char *socket_path;           /* owned; the socket file we created, or NULL */
    int tcp_port;                /* the bound port (http.listen may say 0) */
    struct http_conn *conns, *dead;
    ev_prepare reap_w;
    bool stopping; /* STOPPING: answer, then close every connection */
    struct http_stats stats;
};

static void hc_process(struct http_conn *c);
static void hc_flush(struct http_conn *c);
static bool hc_admit(struct http_conn *c);
static void hc_close(struct http_conn *c, const char *why);

/* ------------------------------------------------------------------ */
/* Output: one buffer per connection, answers written straight into it */

static int out_reserve(struct http_conn *c, size_t n)
{
    if (c->oom)
        return -1;
    if (strbuf_reserve(&c->out, n) < 0) {
        c->oom = true;
        return -1;
    }
    return 0;
}

static void out_add(struct http_conn *c, const void *p, size_t n)
{
    if (out_reserve(c, n) < 0)
        return;
    memcpy(c->out.data + c->out.len, p, n);
    c->out.len += n;
    c->budget.held = strbuf_live(&c->out);
}

static void out_str(struct http_conn *c, const char *s)
{
    out_add(c, s, strlen(s));
}

__attribute__((format(printf, 2, 3))) static void out_printf(struct http_conn *c, const char *fmt,
                                                             ...)
{
    va_list ap;
    char small[256];

    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof(small)) {
        out_add(c, small, (size_t)n);
        return;
    }
    if (out_reserve(c, (size_t)n + 1) < 0)
        return;
    va_start(ap, fmt);
    vsnprintf(c->out.data + c->out.len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    c->out.len += (size_t)n;
    c->budget.held = strbuf_live(&c->out);
}

/* `v` in `base` (10 or 16, lower case): the numbers every answer carries,
 * without a printf per header. */
static void out_uint(struct http_conn *c, unsigned long long v, unsigned base)
{
    char buf[24], *p = buf + sizeof(buf);

    do {
        *--p = "0123456789abcdef"[v % base];
        v /= base;
    } while (v);
    out_add(c, p, (size_t)(buf + sizeof(buf) - p));
}

static size_t out_queued(const struct http_conn *c)
{
    return strbuf_live(&c->out);
}

static const char *status_text(int status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 409:
        return "Conflict";
    case 413:
        return "Content Too Large";
    case 414:
        return "URI Too Long";
    case 415:
        return "Unsupported Media Type";
    case 422:
        return "Unprocessable Content";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    default:
        return status < 300 ? "OK" : status < 500 ? "Client Error" : "Server Error";
    }
}

/* The status line and headers. `len` >= 0 is a Content-Length; -1 is a
 * body to the end (chunked for HTTP/1.1, close-delimited for 1.0). `ci`
 * adds the X-Polygw-* call headers; `extra` is more header lines, each
 * ending in CRLF. */
static void hc_head(struct http_conn *c, int status, const char *ctype, long long len,
                    const struct call_info *ci, const char *extra)
{
    bool http10 = c->req.parser.http_major == 1 && c->req.parser.http_minor == 0;

    if (len < 0 && http10)
        c->keep_alive = false;
    if (c->hs->stopping || c->hs->srv->state != SERVER_RUNNING)
        c->keep_alive = false;
    out_str(c, "HTTP/1.1 ");
    out_uint(c, (unsigned)status, 10); /* a status: 100..599 */
    out_str(c, " ");
    out_str(c, status_text(status));
    out_str(c, "\r\nContent-Type: ");
    out_str(c, ctype);
    out_str(c, "\r\n");
    if (len >= 0) {
        out_str(c, "Content-Length: ");
        out_uint(c, (unsigned long long)len, 10);
        out_str(c, "\r\n");
    } else if (!http10)
        out_str(c, "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n");
    if (!c->keep_alive)
        out_str(c, "Connection: close\r\n");
    else if (http10)
        out_str(c, "Connection: keep-alive\r\n");
    if (c->cors) {
        /* The value matched an allowed origin: a token without CR or LF. */
        out_str(c, "Access-Control-Allow-Origin: ");
        out_str(c, c->req.val[HRQ_ORIGIN]);
        out_str(c, "\r\nAccess-Control-Expose-Headers: *\r\nVary: Origin\r\n");
    }
    if (ci) {
        out_str(c, "X-Polygw-Source: ");
        out_str(c, ci->source);
        out_str(c, "\r\nX-Polygw-Attempts: ");
        out_uint(c, ci->attempts, 10);
        /* Nearly always nothing stalled: printf only for the rest. */
        if (ci->stalled_s == 0 && !signbit(ci->stalled_s))
            out_str(c, "\r\nX-Polygw-Stalled-S: 0.000\r\n");
        else
            out_printf(c, "\r\nX-Polygw-Stalled-S: %.3f\r\n", ci->stalled_s);
        /* Known for a plain answer from a priced source; a stream's head
         * goes out before its usage. */
        if (cost_is_known(ci->cost))
            out_printf(c, "X-Polygw-Cost: %.9g\r\n", ci->cost);
        if (ci->cache) {
            out_str(c, "X-Polygw-Cache: ");
            out_str(c, ci->cache);
            out_str(c, "\r\n");
        }
    }
    if (extra)
        out_str(c, extra);
    out_str(c, "\r\n");
    c->hs->stats.responses[status / 100 < 6 ? status / 100 : 5]++;
}

/* A complete answer with a body. */
static void hc_reply(struct http_conn *c, int status, const char *ctype, const char *body,
                     size_t len, const struct call_info *ci, const char *extra)
{
    hc_head(c, status, ctype, (long long)len, ci, extra);
    out_add(c, body, len);
}

/* An SSE event: `id:` when it has one, `event:` when named, then its
 * data, one `data:` line per line of it. Written as one HTTP chunk, whose
 * size counts each of the data's newlines once: it ends a `data:` line. */
static void hc_sse_id(struct http_conn *c, const char *id, const char *event, const char *data,
                      size_t len)
{
    size_t lines = 1;
    for (size_t i = 0; i < len; i++)
        lines += data[i] == '\n';
    size_t n = (id ? strlen(id) + 5 : 0) + (event ? strlen(event) + 8 : 0) + len + 6 * lines + 2;
    bool chunked = !(c->req.parser.http_major == 1 && c->req.parser.http_minor == 0);

    if (chunked) {
        out_uint(c, n, 16);
        out_str(c, "\r\n");
    }
    if (id) {
        out_str(c, "id: ");
        out_str(c, id);
        out_str(c, "\n");
    }
    if (event) {
        out_str(c, "event: ");
        out_str(c, event);
        out_str(c, "\n");
    }
    const char *p = data, *end = data + len;
    for (;;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        out_str(c, "data: ");
        out_add(c, p, (size_t)((nl ? nl : end) - p));
        out_str(c, "\n");
        if (!nl)
            break;
        p = nl + 1;
    }
    out_str(c, "\n");
    if (chunked)
        out_str(c, "\r\n");
}

static void hc_sse(struct http_conn *c, const char *event, const char *data, size_t len)
{
    hc_sse_id(c, NULL, event, data, len);
}

/* Ends a body of unknown length (chunked terminator, or the close). */
static void hc_body_end(struct http_conn *c)
{
    if (!(c->req.parser.http_major == 1 && c->req.parser.http_minor == 0))
        out_str(c, "0\r\n\r\n");
    else
        c->keep_alive = false;
}

/* ------------------------------------------------------------------ */
/* Errors                                                              */

/* The HTTP status for a polygw code (docs/HTTP.md has the table). */
static int status_of(enum pgw_code code, int upstream_status)
{
    switch (code) {
    case PGW_STALLED:
    case PGW_RETRY_EXHAUSTED:
    case PGW_BACKEND_UNAVAILABLE:
    case PGW_OVERLOADED:
    case PGW_SHUTTING_DOWN:
        return 503;
    case PGW_DEADLINE_EXCEEDED:
        return 504;
    case PGW_UPSTREAM_REJECTED:
        return upstream_status >= 400 && upstream_status <= 599 ? upstream_status : 502;
    case PGW_BAD_REQUEST:
        return 400;
    case PGW_UNKNOWN_METHOD:
    case PGW_UNKNOWN_CAPABILITY:
    case PGW_MODEL_NOT_FOUND:
    case PGW_RESPONSE_NOT_FOUND:
        return 404;
    case PGW_TOO_LARGE:
        return 413;
    case PGW_TASK_STOPPED:
    case PGW_WATCHDOG_TIMEOUT:
        return 409;
    case PGW_STREAM_INTERRUPTED:
        return 502;
    case PGW_BUDGET_EXHAUSTED:
        return 429; /* as a provider's exhausted quota */
    default:
        return 500;
    }
}

static const char *type_of(int status)
{
    switch (status) {
    case 400:
    case 413:
    case 414:
    case 415:
    case 431:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
    case 405:
        return "not_found_error";
    case 408:
        return "timeout_error";
    case 409:
        return "conflict_error";
    case 429:
        return "insufficient_quota";
    case 503:
        return "service_unavailable_error";
    case 504:
        return "timeout_error";
    default:
        return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

/* The codes after which a client may try again later (Retry-After). */
static bool code_is_retry_later(enum pgw_code code)
{
    return status_of(code, 0) == 503;
}

/* An error answer in the making: its status, headers and body. */
struct hc_err {
    int status;
    char extra[512]; /* header lines */
    const char *ctype;
    const char *body; /* into json, or the upstream's own body */
    size_t len;
    struct strbuf json;
};

static const char internal_error_json[] =
    "{\"error\":{\"message\":\"internal\",\"type\":\"server_error\",\"code\":\"internal\","
    "\"param\":null,\"polygw\":{}}}";

/* Makes the answer for error `re`: an OpenAI-shaped error, or the
 * upstream's own for a rejection. `status` 0 means the code's status.
 * Free with hc_err_fini. */
static void hc_err_make(struct http_conn *c, int status, const struct reply_error *re,
                        struct hc_err *e)
{
    enum pgw_code code = re->code;

    strbuf_init(&e->json);
    e->ctype = "application/json";
    e->body = internal_error_json;
    e->len = sizeof(internal_error_json) - 1;
    e->status = status ? status : status_of(code, re->status);

    /* polygw has retried already: the SDKs must not multiply that, unless
     * the client asked to let its SDK retry what is worth retrying. */
    bool retry = c->sdk_retry && (code_is_retry_later(code) || code == PGW_DEADLINE_EXCEEDED);
    size_t n =
        (size_t)snprintf(e->extra, sizeof(e->extra), "x-should-retry: %s\r\nX-Polygw-Code: %s\r\n",
                         retry ? "true" : "false", pgw_code_name(code));
    if (code == PGW_BUDGET_EXHAUSTED && re->retry_after_s >= 0) {
        /* A window's reset; a total or task budget gives none. */
        n += (size_t)snprintf(e->extra + n, sizeof(e->extra) - n, "Retry-After: %.0f\r\n",
                              ceil(re->retry_after_s));
    } else if (code_is_retry_later(code)) {
        double retry_after = re->retry_after_s;
        n += (size_t)snprintf(e->extra + n, sizeof(e->extra) - n, "Retry-After: %.0f\r\n",
                              retry_after > 1 ? ceil(retry_after) : 1);
    }
    if (re->has_attempts)
        n += (size_t)snprintf(e->extra + n, sizeof(e->extra) - n, "X-Polygw-Attempts: %llu\r\n",
                              (unsigned long long)re->attempts);
    if (re->stalled_s >= 0)
        n += (size_t)snprintf(e->extra + n, sizeof(e->extra) - n, "X-Polygw-Stalled-S: %.3f\r\n",
                              re->stalled_s);
    if (e->status == 401)
        snprintf(e->extra + n, sizeof(e->extra) - n,
                 "WWW-Authenticate: Bearer realm=\"polygw\"\r\n");

    if (code == PGW_UPSTREAM_REJECTED && re->upstream_body) {
        /* The upstream's own answer, as the SDK would have had it. */
        e->ctype = re->upstream_body_json ? "application/json" : "text/plain; charset=utf-8";
        e->body = re->upstream_body;
        e->len = re->upstream_body_len;
        return;
    }
    /* Everything else polygw knows (attempts, stalled_s, retry_after_s,
     * sources...) under "polygw", with who the request was taken to be. */
    struct writer w;
    writer_init_json(&w, &e->json);
    writer_map(&w, 1);
    writer_str(&w, "error");
    writer_map(&w, 5);
    writer_kv_text(&w, "message", re->message ? re->message : pgw_code_name(code));
    writer_kv_str(&w, "type", type_of(e->status));
    writer_kv_str(&w, "code", pgw_code_name(code));
    writer_str(&w, "param");
    writer_nil(&w);
    writer_str(&w, "polygw");
    const char *app = c->app[0] ? c->app : NULL;
    writer_map(&w, reply_error_n_fields(re, app));
    reply_error_write_fields(&w, re, app);
    if (w.err == 0) {
        e->body = e->json.data;
        e->len = e->json.len;
    }
}

static void hc_err_fini(struct hc_err *e)
{
    strbuf_fini(&e->json);
}

static void hc_send_error(struct http_conn *c, int status, const struct reply_error *re)
{
    struct hc_err e;
    hc_err_make(c, status, re, &e);
    hc_reply(c, e.status, e.ctype, e.body, e.len, NULL, e.extra);
    hc_err_fini(&e);
}

/* A locally made error: `status` 0 means the code's status. */
__attribute__((format(printf, 4, 5))) static void hc_error(struct http_conn *c, int status,
                                                           enum pgw_code code, const char *fmt, ...)
{
    char msg[400];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    const struct reply_error re = REPLY_ERROR(code, msg);
    hc_send_error(c, status, &re);
}

/* ------------------------------------------------------------------ */
/* Phases                                                              */

static void hc_arm(struct http_conn *c, double after_s)
{
    struct ev_loop *loop = c->hs->srv->loop;
    ev_timer_stop(loop, &c->phase_w);
    if (after_s > 0) {
        ev_timer_set(&c->phase_w, after_s, 0.);
        ev_timer_start(loop, &c->phase_w);
    }
}

static void hc_set_reading(struct http_conn *c, bool on)
{
    if (c->reading == on || c->closed)
        return;
    c->reading = on;
    if (on)
        ev_io_start(c->hs->srv->loop, &c->rio);
    else
        ev_io_stop(c->hs->srv->loop, &c->rio);
}

/* Its unfinished input: the body of a request being read and the bytes
 * not parsed yet. */
static size_t hc_input_held(const struct http_conn *c)
{
    if (c->closed || c->phase == HC_CLOSING)
        return 0;
    return (c->phase == HC_HEAD || c->phase == HC_BODY ? c->body_len : 0) + strbuf_live(&c->in);
}

/* Counts c's unfinished input in the server's total, which both front
 * ends share: past listen.max_buffered_input_bytes the connection holding
 * the most, of either, is refused (net/input.h). */
static void hc_account_input(struct http_conn *c)
{
    struct server *srv = c->hs->srv;
    size_t held = hc_input_held(c);

    srv->input_bytes = srv->input_bytes - c->input_bytes + held;
    c->input_bytes = held;
    net_enforce_input(srv);
}

static void hc_drop_body(struct http_conn *c)
{
    free(c->body);
    c->body = NULL;
    c->body_len = c->body_cap = 0;
}

/* Ends the output once it is written. */
static void hc_shut_write(struct http_conn *c)
{
    if (c->write_shut)
        return;
    c->write_shut = true;
    shutdown(c->fd, SHUT_WR);
}

/* No more requests: close once the output is written (bounded by a linger
 * timer). `drain` when the client may still be sending (a request refused
 * before its end): its input is then read and dropped until it closes,
 * the output ended first, because closing a socket with unread input
 * resets the connection and the client could lose the answer. */
static void hc_close_after_flush(struct http_conn *c, bool drain)
{
    if (c->closed)
        return;
    c->phase = HC_CLOSING;
    c->draining |= drain;
    hc_set_reading(c, c->draining);
    hc_account_input(c);
    if (out_queued(c) == 0 && !c->draining) {
        hc_close(c, "answered, closing");
        return;
    }
    if (out_queued(c) == 0)
        hc_shut_write(c);
    hc_arm(c, HTTP_LINGER_S);
}

/* The answer to the request being served is queued. */
static void hc_response_done(struct http_conn *c)
{
    struct ev_loop *loop = c->hs->srv->loop;

    c->stream_open = false;
    c->body_len = 0;
    if (c->phase == HC_CLOSING || c->closed)
        return;
    if (!c->keep_alive || c->hs->stopping) {
        hc_close_after_flush(c, false);
        return;
    }
    c->phase = HC_IDLE;
    hc_arm(c, c->hs->srv->cfg->http_keepalive_timeout_s);
    if (strbuf_live(&c->in) > 0 && !ev_is_active(&c->next_w)) {
        ev_timer_set(&c->next_w, 0., 0.);
        ev_timer_start(loop, &c->next_w);
    }
}

/* Input that cannot be parsed any further: answer and close. */
static void hc_reject_input(struct http_conn *c)
{
    const struct config *cfg = c->hs->srv->cfg;
    const struct httpreq *r = &c->req;

    c->hs->stats.bad_requests++;
    c->keep_alive = false;
    switch (r->status) {
    case 431:
        hc_error(c, 431, PGW_TOO_LARGE,
                 "request line and headers exceed http.max_header_bytes (%zu)",
                 cfg->http_max_header_bytes);
        break;
    case 413:
        if (c->raw_limit)
            hc_error(c, 413, PGW_TOO_LARGE,
                     "request body exceeds capabilities.%s.max_body_bytes (%zu)", c->raw_cap,
                     c->raw_limit);
        else if (httpraw_max_body(cfg) > cfg->http_max_body_bytes)
            hc_error(c, 413, PGW_TOO_LARGE,
                     "request body exceeds %zu bytes, the most any endpoint takes "
                     "(http.max_body_bytes, capabilities' max_body_bytes)",
                     httpraw_max_body(cfg));
        else
            hc_error(c, 413, PGW_TOO_LARGE, "request body exceeds http.max_body_bytes (%zu)",
                     cfg->http_max_body_bytes);
        break;
    case 414:
        hc_error(c, 414, PGW_BAD_REQUEST, "request target longer than %d bytes", HTTPREQ_URL_MAX);
        break;
    case 500:
        hc_error(c, 500, PGW_INTERNAL, "out of memory reading the request body");
        break;
    default:
        hc_error(c, 400, PGW_BAD_REQUEST, "malformed HTTP request: %s",
                 r->why ? r->why : "unparsable");
        break;
    }
    hc_close_after_flush(c, true);
}

static void hc_on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct http_conn *c = w->data;
    (void)loop;
    (void)revents;

    switch (c->phase) {
    case HC_HEAD:
    case HC_BODY:
        c->hs->stats.timeouts++;
        c->keep_alive = false;
        hc_error(c, 408, PGW_BAD_REQUEST, "the request %s did not arrive within %gs",
                 c->phase == HC_HEAD ? "line and headers" : "body",
                 c->phase == HC_HEAD ? c->hs->srv->cfg->http_header_timeout_s
                                     : c->hs->srv->cfg->http_body_timeout_s);
        hc_close_after_flush(c, true);
        hc_flush(c);
        break;
    case HC_IDLE:
        hc_close(c, "keep-alive timeout");
        break;
    case HC_CLOSING:
        hc_close(c, "linger timeout");
        break;
    case HC_SERVING:
        hc_close(c, "send timeout");
        break;
    }
}

static void hc_on_next(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct http_conn *c = w->data;
    (void)loop;
    (void)revents;
    hc_process(c);
    hc_flush(c);
}

/* ------------------------------------------------------------------ */
/* Parser callbacks                                                    */

static struct http_conn *req_hc(struct httpreq *r)
{
    return r->owner;
}

static void hc_on_begin(struct httpreq *r)
{
    struct http_conn *c = req_hc(r);

    c->app[0] = '\0';
    c->body_len = 0;
    c->raw_limit = 0;
    c->followup = false;
    c->resume = false;
    c->cors = false;
    c->phase = HC_HEAD;
    hc_arm(c, c->hs->srv->cfg->http_header_timeout_s);
}

/* The body bound of the admitted request: its raw capability's, else
 * http.max_body_bytes. An announced length over it is answered 413 now. */
static bool hc_body_within(struct http_conn *c)
{
    struct httpreq *r = &c->req;
    size_t limit = c->raw_limit ? c->raw_limit : c->hs->srv->cfg->http_max_body_bytes;

    r->max_body_bytes = limit;
    if ((r->parser.flags & F_CHUNKED) || r->parser.content_length == ULLONG_MAX ||
        r->parser.content_length <= limit)
        return true;
    c->hs->stats.bad_requests++;
    if (c->raw_limit)
        hc_error(c, 413, PGW_TOO_LARGE, "request body exceeds capabilities.%s.max_body_bytes (%zu)",
                 c->raw_cap, c->raw_limit);
    else
        hc_error(c, 413, PGW_TOO_LARGE, "request body exceeds http.max_body_bytes (%zu)", limit);
    return false;
}

/* The head is read: the request is admitted or refused before any byte
 * of its body is kept. A refused request without a body completes at once
 * (hc_dispatch sees it answered); one with a body stops the reading, and
 * the connection closes once the answer is written, its body read and
 * dropped meanwhile (hc_close_after_flush). */
static int hc_on_head(struct httpreq *r)
{
    struct http_conn *c = req_hc(r);
    const http_parser *p = &r->parser;
    bool body = httpreq_has_body(r);

    c->phase = HC_BODY;
    c->keep_alive = httpreq_keep_alive(r);
    /* A refusal of a request whose body is not read says it closes. */
    bool keep_alive = c->keep_alive;
    c->keep_alive = keep_alive && !body;
    c->answered = !hc_admit(c) || !hc_body_within(c);
    if (c->answered)
        return body ? 1 : 0;
    c->keep_alive = keep_alive;
    if (r->present[HRQ_EXPECT] && p->http_major == 1 && p->http_minor >= 1 &&
        strcasecmp(r->val[HRQ_EXPECT], "100-continue") == 0)
        out_str(c, "HTTP/1.1 100 Continue\r\n\r\n");
    hc_arm(c, c->hs->srv->cfg->http_body_timeout_s);
    return 0;
}

static int hc_on_body(struct httpreq *r, const char *at, size_t n)
{
    struct http_conn *c = req_hc(r);

    if (c->body_len + n + 1 > c->body_cap) {
        size_t cap = c->body_cap ? c->body_cap : 4096;
        while (cap < c->body_len + n + 1)
            cap *= 2;
        char *b = realloc(c->body, cap);
        if (!b) {
            r->status = 500;
            return -1;
        }
        c->body = b;
        c->body_cap = cap;
    }
    memcpy(c->body + c->body_len, at, n);
    c->body_len += n;
    return 0;
}

static const struct httpreq_ops hc_req_ops = {
    .begin = hc_on_begin,
    .head = hc_on_head,
    .body = hc_on_body,
};

/* ------------------------------------------------------------------ */
/* The call sink                                                       */

static struct http_conn *sink_hc(struct call_sink *s)
{
    return (struct http_conn *)((char *)s - offsetof(struct http_conn, sink));
}

static void hc_stream_head(struct http_conn *c, const struct call_info *ci)
{
    hc_head(c, 200, "text/event-stream", -1, ci, NULL);
    c->stream_open = true;
}

static int h_on_chunk(struct call_sink *s, uint32_t id, const struct call_info *ci,
                      const char *json, size_t json_len, const char *mp, size_t mp_len)
{
    struct http_conn *c = sink_hc(s);
    (void)id;
    (void)mp;
    (void)mp_len;

    if (!c->stream_open)
        hc_stream_head(c, ci);
    /* The upstream's event name before its data, as it sent it: Anthropic's
     * and the Responses API's clients dispatch on it (message_start, ...). */
    hc_sse_id(c, ci->event_id, ci->event, json, json_len);
    hc_flush(c);
    if (c->closed)
        return -1;
    return out_queued(c) > c->hs->srv->cfg->max_write_queue_bytes ? 1 : 0;
}

static void h_on_result(struct call_sink *s, uint32_t id, const struct call_info *ci,
                        const struct call_body *b)
{
    struct http_conn *c = sink_hc(s);
    (void)id;

    if (b->raw) {
        hc_reply(c, b->status >= 200 && b->status < 300 ? b->status : 200,
                 httpraw_ctype(b->content_type), b->json, b->json_len, ci, NULL);
    } else if (b->json) {
        hc_reply(c, 200, "application/json", b->json, b->json_len, ci, NULL);
    } else {
        if (!c->stream_open)
            hc_stream_head(c, ci);
        if (ci->done_marker)
            hc_sse(c, NULL, "[DONE]", 6); /* others ended with a named event */
        hc_body_end(c);
    }
    hc_response_done(c);
}

static void h_on_error(struct call_sink *s, uint32_t id, const struct reply_error *re)
{
    struct http_conn *c = sink_hc(s);
    (void)id;

    if (c->stream_open) {
        /* The status is long sent: the error becomes the stream's last
         * event, the same JSON a plain answer would carry. */
        struct hc_err e;
        hc_err_make(c, 0, re, &e);
        hc_sse(c, "error", e.body, e.len);
        hc_err_fini(&e);
        hc_body_end(c);
    } else {
        hc_send_error(c, 0, re);
    }
    hc_response_done(c);
}

static void h_flush(struct call_sink *s)
{
    hc_flush(sink_hc(s));
}

static const struct call_sink_ops http_sink_ops = {
    .on_chunk = h_on_chunk,
    .on_result = h_on_result,
    .on_error = h_on_error,
    .flush = h_flush,
};

/* ------------------------------------------------------------------ */
/* Routes                                                              */

typedef void route_fn(struct http_conn *c, const char *path, size_t len);

static bool path_is(const char *path, size_t len, const char *s)
{
    return strlen(s) == len && memcmp(path, s, len) == 0;
}

static void route_healthz(struct http_conn *c, const char *path, size_t len)
{
    (void)path;
    (void)len;
    static const char ok[] = "{\"status\":\"ok\"}";
    hc_reply(c, 200, "application/json", ok, sizeof(ok) - 1, NULL, NULL);
}

static void route_readyz(struct http_conn *c, const char *path, size_t len)
{
    struct server *srv = c->hs->srv;
    const char *why = NULL, *detail = "";
    char body[400];
    (void)path;
    (void)len;

    if (srv->state != SERVER_RUNNING)
        why = "shutting down";
    else if (srv->listen_fd < 0 || (c->hs->lis[0].fd < 0 && c->hs->lis[1].fd < 0))
        why = "not listening";
    else if (!backend_is_up(srv->backend))
        why = srv->backend->ops->down_reason(srv->backend, &detail);
    if (!why) {
        static const char ok[] = "{\"status\":\"ready\"}";
        hc_reply(c, 200, "application/json", ok, sizeof(ok) - 1, NULL, NULL);
        return;
    }
    int n = snprintf(body, sizeof(body), "{\"status\":\"not_ready\",\"reason\":\"%s\"", why);
    /* The backend's own reason (Redis: a refused TLS certificate,
     * WRONGPASS, ...) as `detail`, JSON-escaped: it says what to fix. It
     * never holds a password. */
    bool has_detail = *detail != '\0';
    if (has_detail)
        n += snprintf(body + n, sizeof(body) - (size_t)n, ",\"detail\":\"");
    for (; *detail && (size_t)n < sizeof(body) - 16; detail++) {
        size_t e = jsonw_escape((unsigned char)*detail, body + n);
        if (e == 0)
            body[n++] = *detail;
        n += (int)e;
    }
    n += snprintf(body + n, sizeof(body) - (size_t)n, has_detail ? "\"}" : "}");
    hc_reply(c, 503, "application/json", body, (size_t)n, NULL, "Retry-After: 1\r\n");
}

static const struct config_app *hc_bearer_app(struct http_conn *c);

/* Made from the configuration in force: a reload changes it. */
static void route_models(struct http_conn *c, const char *path, size_t len)
{
    struct strbuf json;
    (void)path;
    (void)len;
    strbuf_init(&json);
    /* Listed for the caller (its app's models list); never refused here. */
    const struct config *cfg = c->hs->srv->cfg;
    const struct config_app *app = c->is_unix ? peer_app(cfg, &c->peer) : hc_bearer_app(c);
    if (!app)
        app = config_find_app(cfg, CONFIG_DEFAULT_APP);
    if (status_models_json(cfg, app, &json) == 0)
        hc_reply(c, 200, "application/json", json.data, json.len, NULL, NULL);
    else
        hc_error(c, 500, PGW_INTERNAL, "out of memory");
    strbuf_fini(&json);
}

static void route_metrics(struct http_conn *c, const char *path, size_t len)
{
    size_t n;
    char *text = metrics_render(c->hs->srv, &n);
    (void)path;
    (void)len;

    if (!text) {
        hc_error(c, 500, PGW_INTERNAL, "out of memory rendering the metrics");
        return;
    }
    hc_reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, n, NULL, NULL);
    free(text);
}

/* The status page and its data (status.h): 403 for a client that may not
 * read them. */
static bool hc_status_allowed(struct http_conn *c)
{
    if (status_peer_allowed(c->hs->srv->cfg, c->fd))
        return true;
    hc_error(c, 403, PGW_BAD_REQUEST,
             "the status page is served to Unix-socket and loopback clients only "
             "(http.allow_status_remote)");
    return false;
}

static bool admit_status(struct http_conn *c, const char *path, size_t len)
{
    (void)path;
    (void)len;
    return hc_status_allowed(c);
}

static bool admit_status_page(struct http_conn *c, const char *path, size_t len)
{
    if (!path_is(path, len, "/polygw/")) {
        char quoted[129];
        rpc_quote_client_str(path, len, sizeof(quoted) - 1, quoted);
        hc_error(c, 404, PGW_UNKNOWN_METHOD, "no endpoint %s", quoted);
        return false;
    }
    return hc_status_allowed(c);
}

static void route_status_page(struct http_conn *c, const char *path, size_t len)
{
    if (!admit_status_page(c, path, len))
        return;
    hc_reply(c, 200, "text/html; charset=utf-8", (const char *)status_html, status_html_len, NULL,
             "Cache-Control: no-store\r\n");
}

/* The app whose token the request's `Authorization: Bearer` carries, or
 * NULL (none, not a bearer, too long, no app's token). */
static const struct config_app *hc_bearer_app(struct http_conn *c)
{
    const struct httpreq *r = &c->req;
    const char *v = r->val[HRQ_AUTH];
    size_t n = r->val_len[HRQ_AUTH];

    if (!r->present[HRQ_AUTH] || r->auth_over || n <= 7 || strncasecmp(v, "Bearer ", 7) != 0)
        return NULL;
    return config_app_for_token(c->hs->srv->cfg, v + 7, n - 7);
}

/* The status page's reader: the peer's app on the Unix socket, an app's
 * bearer token over TCP, else `default`. Unlike hc_identify it refuses no
 * one (a browser sends no token): an unknown reader gets `default`'s view. */
static const struct config_app *hc_reader_app(struct http_conn *c)
{
    const struct config *cfg = c->hs->srv->cfg;
    const struct config_app *a = NULL;

    if (c->is_unix)
        a = peer_app(cfg, &c->peer);
    else if (config_apps_have_tokens(cfg))
        a = hc_bearer_app(c);
    return a ? a : config_find_app(cfg, CONFIG_DEFAULT_APP);
}

static void route_status_stats(struct http_conn *c, const char *path, size_t len)
{
    struct strbuf json;
    char why[200];
    (void)path;
    (void)len;

    if (!hc_status_allowed(c))
        return;
    strbuf_init(&json);
    if (status_stats_json(c->hs->srv, hc_reader_app(c), &json, why, sizeof(why)) == 0)
        hc_reply(c, 200, "application/json", json.data, json.len, NULL,
                 "Cache-Control: no-store\r\n");
    else
        hc_error(c, 500, PGW_INTERNAL, "stats: %s", why);
    strbuf_fini(&json);
}

/* Checks a request's Content-Type: application/json, with or without
 * parameters (unless `optional` and the request announces no body). A
 * missing one is refused too: a page of another site can send a body
 * without a Content-Type, or with text/plain, with no CORS preflight.
 * Answers 415 and returns -1 when it is not. */
static int hc_check_json_body(struct http_conn *c, bool optional)
{
    char ct[65];

    if (httpreq_ctype_is_json(&c->req) || (optional && !httpreq_has_body(&c->req)))
        return 0;
    if (!c->req.present[HRQ_CTYPE]) {
        hc_error(c, 415, PGW_BAD_REQUEST, "Content-Type must be application/json (none was sent)");
        return -1;
    }
    rpc_quote_client_str(c->req.val[HRQ_CTYPE], c->req.val_len[HRQ_CTYPE], sizeof(ct) - 1, ct);
    hc_error(c, 415, PGW_BAD_REQUEST, "Content-Type must be application/json, got '%s'", ct);
    return -1;
}

/* What the front end reads of a request body (the rest is the upstream's). */
struct body_facts {
    bool stream, seen_stream;
    uint64_t max_tokens;
    bool completion_tokens;            /* max_completion_tokens wins over max_tokens */
    struct jscan_value stream_options; /* p NULL: absent */
    bool stream_options_twice;         /* then call_begin reads them all itself */
    struct jscan_value model;          /* p NULL: absent (or not a string) */
};

static int body_member(void *ud, const char *key, const struct jscan_value *v)
{
    struct body_facts *f = ud;
    double d;

    if (strcmp(key, "stream") == 0) {
        /* It decides how the answer is framed: one, and a boolean. */
        if (f->seen_stream ||
            (v->type != JSCAN_TRUE && v->type != JSCAN_FALSE && v->type != JSCAN_NULL))
            return 1;
        f->seen_stream = true;
        f->stream = v->type == JSCAN_TRUE;
    } else if ((strcmp(key, "max_completion_tokens") == 0 ||
                ((strcmp(key, "max_tokens") == 0 || strcmp(key, "max_output_tokens") == 0) &&
                 !f->completion_tokens)) &&
               jscan_number(v, &d) && d >= 0 && d < 1e15 && d == floor(d)) {
        f->max_tokens = (uint64_t)d;
        f->completion_tokens |= key[4] == 'c';
    } else if (strcmp(key, "stream_options") == 0) {
        f->stream_options_twice |= f->stream_options.p != NULL;
        f->stream_options = *v;
    } else if (strcmp(key, "model") == 0) {
        f->model = v->type == JSCAN_STRING ? *v : (struct jscan_value){ 0 };
    }
    return 0;
}

/* The JSON string `v` unescaped into `out` (`cap` bytes); returns its
 * length, or -1 when it does not fit or holds an escape other than
 * \", \\, \/ or a \u of plain ASCII (no model name needs one). */
static long json_model_name(const struct jscan_value *v, char *out, size_t cap)
{
    size_t n = 0;

    for (size_t i = 1; i + 1 < v->len; i++) {
        char ch = v->p[i];
        if (ch == '\\') {
            char e = v->p[++i];
            if (e == 'u' && i + 4 < v->len) {
                int h[4];
                for (int j = 0; j < 4; j++)
                    h[j] = jscan_hexval(v->p[i + 1 + j]);
                if (h[0] != 0 || h[1] != 0 || h[2] < 0 || h[3] < 0 || h[2] * 16 + h[3] < 0x20)
                    return -1;
                ch = (char)(h[2] * 16 + h[3]);
                i += 4;
            } else if (e == '"' || e == '\\' || e == '/') {
                ch = e;
            } else {
                return -1;
            }
        }
        if (n + 1 >= cap)
            return -1;
        out[n++] = ch;
    }
    out[n] = '\0';
    return (long)n;
}

/* The path (after /v1) capability i is served at: its own, except that a
 * chat capability (not raw) whose sources speak Anthropic's Messages API
 * natively (kind: anthropic without accepts: openai) is served at
 * /messages, where Anthropic's clients send. */
static const char *cap_http_path(const struct config *cfg, size_t i)
{
    const struct config_capability *cap = &cfg->capabilities[i];

    if (cap->raw || strcmp(cap->name, "chat") != 0 || strcmp(cap->path, "/chat/completions") != 0)
        return cap->path;
    for (size_t j = 0; j < cfg->n_sources; j++) {
        const struct config_source *src = &cfg->sources[j];
        if (src->capability_index == i)
            return dialect_is_messages(src->kind) && !src->accepts_openai
                ? dialect_get(DIALECT_ANTHROPIC)->chat_path
                : cap->path;
    }
    return cap->path;
}

/* The request's app (docs/APPS.md, "Over HTTP"): on the Unix socket the
 * peer's credentials; over TCP the app whose token the Authorization
 * bearer is, or `default` when no app has a token. Then X-Polygw-App may
 * declare another, by the rule `hello` follows. Returns NULL after
 * answering 401 (TCP, tokens configured, none matched) or 403 (a refused
 * declaration). The Authorization value is only compared, never logged,
 * echoed nor sent upstream (the upstream gets its source's own key). */
static const struct config_app *hc_identify(struct http_conn *c)
{
    const struct config *cfg = c->hs->srv->cfg;
    struct httpreq *r = &c->req;
    const struct config_app *a;
    char why[200];

    if (c->is_unix) {
        a = peer_app(cfg, &c->peer);
    } else if (!config_apps_have_tokens(cfg)) {
        a = config_find_app(cfg, CONFIG_DEFAULT_APP); /* any API key an SDK sends is fine */
    } else {
        a = hc_bearer_app(c);
        if (!a) {
            hc_error(c, 401, PGW_BAD_REQUEST, "%s",
                     r->present[HRQ_AUTH] ? "the bearer token is not an app's token"
                                          : "a bearer token is required (Authorization: Bearer "
                                            "<an app's token>)");
            return NULL;
        }
    }
    if (r->present[HRQ_APP]) {
        const struct config_app *d =
            peer_declare_app(cfg, a->name, r->val[HRQ_APP], r->val_len[HRQ_APP], why, sizeof(why));
        if (!d) {
            str_copy(c->app, sizeof(c->app), a->name);
            hc_error(c, 403, PGW_BAD_REQUEST, "X-Polygw-App: %s", why);
            return NULL;
        }
        a = d;
    }
    str_copy(c->app, sizeof(c->app), a->name);
    return a;
}

/* The request's query string, after its '?' (NULL: none). */
static const char *hc_query(const struct http_conn *c, size_t *qlen)
{
    const char *q = memchr(c->req.url, '?', c->req.url_len);

    *qlen = q ? c->req.url_len - (size_t)(q + 1 - c->req.url) : 0;
    return q ? q + 1 : NULL;
}

/* The capability POST `path` (/v1/...) calls, and in *app who calls:
 * decided from the head alone. NULL after answering 401 / 403 (who is
 * calling), 404 (no capability there) or 415 (not JSON). */
static const struct config_capability *call_target(struct http_conn *c, const char *path,
                                                   size_t len, const struct config_app **app)
{
    const struct config *cfg = c->hs->srv->cfg;
    const struct config_capability *cap = NULL;
    int fu = 0;
    size_t id_off = 0, id_len = 0;
    char quoted[129];

    if (!(*app = hc_identify(c)))
        return NULL;
    /* Two capabilities may share an upstream path: the first one that has
     * a source serves it. */
    for (size_t i = 0; i < cfg->n_capabilities; i++) {
        size_t o, n;
        int f = httpraw_followup(&cfg->capabilities[i], path + 3, len - 3, c->req.parser.method, &o,
                                 &n);
        if (!path_is(path + 3, len - 3, cap_http_path(cfg, i)) &&
            !httpraw_sub_path(&cfg->capabilities[i], path + 3, len - 3) && f == 0)
            continue;
        bool served = false;
        for (size_t j = 0; j < cfg->n_sources && !served; j++)
            served = cfg->sources[j].capability_index == i;
        if (!cap || served) {
            cap = &cfg->capabilities[i];
            fu = f;
            id_off = o;
            id_len = n;
        }
        if (served)
            break;
    }
    rpc_quote_client_str(path, len, sizeof(quoted) - 1, quoted);
    if (!cap) {
        hc_error(c, 404, PGW_UNKNOWN_CAPABILITY, "no capability is served at %s", quoted);
        return NULL;
    }
    if (fu == -1) {
        hc_error(c, 404, PGW_UNKNOWN_CAPABILITY,
                 "%s: below /v1%s polygw serves GET and DELETE /v1%s/{id}, POST "
                 "/v1%s/{id}/cancel and GET /v1%s/{id}/input_items",
                 quoted, cap->path, cap->path, cap->path, cap->path);
        return NULL;
    }
    if (fu == -2) {
        hc_error(c, 405, PGW_UNKNOWN_METHOD, "%s is not served with %s", quoted,
                 http_method_str((enum http_method)c->req.parser.method));
        return NULL;
    }
    if (fu > 0) {
        /* A follow-up: relayed as it came (its body, if any, is the
         * upstream's to read), to the source that made the response; a GET
         * of the response with stream=true resumes its event stream. */
        const char *sfx = c->req.url + 3 + strlen(cap->path);
        const char *bad = raw_call_suffix_problem(sfx, strlen(sfx));
        if (bad) {
            hc_error(c, 400, PGW_BAD_REQUEST, "the path after %s: %s", cap->path, bad);
            return NULL;
        }
        c->followup = true;
        size_t qlen;
        const char *q = hc_query(c, &qlen);
        c->resume = fu == 1 && c->req.parser.method == HTTP_GET && httpraw_stream_query(q, qlen);
        memcpy(c->resp_id, path + 3 + id_off, id_len);
        c->resp_id[id_len] = '\0';
        return cap;
    }
    const char *method;
    if (!(httpraw_method_bit(c->req.parser.method, &method) & cap->methods)) {
        hc_error(c, 405, PGW_UNKNOWN_METHOD,
                 "capability '%s' is not served with %s (methods:%s%s%s)", cap->name,
                 http_method_str((enum http_method)c->req.parser.method),
                 cap->methods & CONFIG_METHOD_GET ? " GET" : "",
                 cap->methods & CONFIG_METHOD_POST ? " POST" : "",
                 cap->methods & CONFIG_METHOD_DELETE ? " DELETE" : "");
        return NULL;
    }
    if (cap->raw) {
        const char *sfx = c->req.url + 3 + strlen(cap->path);
        const char *bad = raw_call_suffix_problem(sfx, strlen(sfx));
        if (bad) {
            hc_error(c, 400, PGW_BAD_REQUEST, "the path after %s: %s", cap->path, bad);
            return NULL;
        }
        /* Any content type: the body is the upstream's to read. */
        c->raw_limit = cap->max_body_bytes;
        str_copy(c->raw_cap, sizeof(c->raw_cap), cap->name);
        return cap;
    }
    return hc_check_json_body(c, false) < 0 ? NULL : cap;
}

static void hc_call_headers(struct http_conn *c, struct call_req *rq, char *scope);

/* A raw capability's call, or a Responses API follow-up (raw.h): the
 * body, its Content-Type, the method, the sub-path and the query, as they
 * came. */
static void route_raw_call(struct http_conn *c, const struct config_capability *cap,
                           const struct config_app *app)
{
    char scope[CONFIG_NAME_MAX * 4];
    const char *method;

    httpraw_method_bit(c->req.parser.method, &method);
    struct call_req r = {
        .capability = cap->name,
        .capability_len = strlen(cap->name),
        .app = app,
        .raw = true,
        .raw_body = c->body,
        .raw_len = c->body_len,
        .content_type = c->req.present[HRQ_CTYPE] ? c->req.val[HRQ_CTYPE] : NULL,
        .method = method,
        .path_suffix = c->req.url + 3 + strlen(cap->path),
        .response_id = c->followup ? c->resp_id : NULL,
        .stream = c->resume,
    };
    hc_call_headers(c, &r, scope);
}

static bool admit_call(struct http_conn *c, const char *path, size_t len)
{
    const struct config_app *app;
    return call_target(c, path, len, &app) != NULL;
}

/* The capability a Gemini route calls (gemroute.h), and in *app who
 * calls. NULL after answering 401 / 403, 404 (no such route, or no
 * capability by that name), 400 (a stream not asked as SSE) or 415. */
static const struct config_capability *gemini_target(struct http_conn *c, const char *path,
                                                     size_t len, const struct config_app **app,
                                                     struct gemroute *g)
{
    const struct config *cfg = c->hs->srv->cfg;
    size_t qlen;
    const char *q = hc_query(c, &qlen);
    char quoted[129];

    if (!(*app = hc_identify(c)))
        return NULL;
    rpc_quote_client_str(path, len, sizeof(quoted) - 1, quoted);
    enum gemroute_rc rc = gemroute_parse(path, len, q, qlen, g);
    if (rc == GEMROUTE_NOT_SSE) {
        hc_error(c, 400, PGW_BAD_REQUEST,
                 "%s: only the SSE stream is relayed; add ?alt=sse (Gemini's JSON-array "
                 "stream is not supported)",
                 quoted);
        return NULL;
    }
    int ci =
        rc == GEMROUTE_OK ? config_find_capability(cfg, g->capability, strlen(g->capability)) : -1;
    if (ci < 0) {
        hc_error(c, 404, PGW_UNKNOWN_CAPABILITY, "no capability is served at %s%s%s%s", quoted,
                 rc == GEMROUTE_OK ? " (configure capability " : "",
                 rc == GEMROUTE_OK ? g->capability : "", rc == GEMROUTE_OK ? ")" : "");
        return NULL;
    }
    return hc_check_json_body(c, false) < 0 ? NULL : &cfg->capabilities[ci];
}

static bool admit_gemini(struct http_conn *c, const char *path, size_t len)
{
    const struct config_app *app;
    struct gemroute g;
    return gemini_target(c, path, len, &app, &g) != NULL;
}

/* A call through POST /v1/..., or through a Gemini route (`gemini`:
 * gemroute.h): there the capability, the model and stream come from the path,
 * and only kind: gemini sources serve it. */
static void route_call_as(struct http_conn *c, const char *path, size_t len, bool gemini)
{
    char scope[CONFIG_NAME_MAX * 4];
    const struct config_app *app;
    struct gemroute g = { 0 };
    const struct config_capability *cap =
        gemini ? gemini_target(c, path, len, &app, &g) : call_target(c, path, len, &app);

    if (!cap)
        return;
    if (cap->raw || c->followup) {
        route_raw_call(c, cap, app);
        return;
    }
    struct body_facts bf = { 0 };
    size_t at = 0;
    int rc = jscan_object(c->body ? c->body : "", c->body_len, body_member, &bf, &at);
    if (rc == -1) {
        hc_error(c, 400, PGW_BAD_REQUEST, "body is not valid JSON (at byte %zu)", at);
        return;
    }
    if (rc == -2) {
        hc_error(c, 400, PGW_BAD_REQUEST, "body must be a JSON object");
        return;
    }
    if (rc > 0) {
        hc_error(c, 400, PGW_BAD_REQUEST, "'stream' must be one boolean");
        return;
    }
    struct call_req r = {
        .capability = cap->name,
        .capability_len = strlen(cap->name),
        .json = c->body,
        .json_len = c->body_len,
        .stream = bf.stream,
        .max_tokens = bf.max_tokens,
        .app = app,
        .members_scanned = !bf.stream_options_twice,
        .stream_options = bf.stream_options,
    };
    r.query = hc_query(c, &r.query_len);
    char model[MODELS_NAME_MAX];
    if (gemini) {
        r.stream = g.stream;
        r.model = g.model;
        r.model_len = g.model_len;
        r.model_param = true; /* the upstream path names it (upath.h) */
        r.gemini_only = true;
    } else {
        r.gemini_never = true;
        if (bf.model.p) {
            long n = json_model_name(&bf.model, model, sizeof(model));
            if (n < 0) {
                hc_error(c, 400, PGW_BAD_REQUEST,
                         "model: longer than 255 bytes, or an escape no model name needs");
                return;
            }
            r.model = model;
            r.model_len = (size_t)n;
        }
    }
    hc_call_headers(c, &r, scope);
}

/* The X-Polygw-* headers of a call into `r` (`scope` holds the scope's
 * copy), then the call begins; or 400. */
static void hc_call_headers(struct http_conn *c, struct call_req *rq, char *scope)
{
    struct call_req r = *rq;

    if (c->req.present[HRQ_DEADLINE]) {
        char *end;
        double d = strtod(c->req.val[HRQ_DEADLINE], &end);
        if (end == c->req.val[HRQ_DEADLINE] || *end || !(d > 0) || !isfinite(d)) {
            hc_error(c, 400, PGW_BAD_REQUEST,
                     "X-Polygw-Deadline: expected a positive number of seconds");
            return;
        }
        r.deadline_s = d;
    }
    char why[160];
    if ((c->req.present[HRQ_TASK] &&
         rpc_check_ident("X-Polygw-Task", c->req.val[HRQ_TASK], c->req.val_len[HRQ_TASK],
                         TASK_ID_MAX, why, sizeof(why)) < 0) ||
        (c->req.present[HRQ_SCOPE] &&
         rpc_check_ident("X-Polygw-Scope", c->req.val[HRQ_SCOPE], c->req.val_len[HRQ_SCOPE],
                         CONFIG_NAME_MAX * 4 - 1, why, sizeof(why)) < 0)) {
        hc_error(c, 400, PGW_BAD_REQUEST, "%s", why);
        return;
    }
    if (c->req.present[HRQ_TASK])
        r.task_id = c->req.val[HRQ_TASK];
    if (c->req.present[HRQ_TRACEPARENT])
        r.traceparent = c->req.val[HRQ_TRACEPARENT];
    if (c->req.present[HRQ_TRACESTATE])
        r.tracestate = c->req.val[HRQ_TRACESTATE];
    if (c->req.present[HRQ_ANTHROPIC_BETA]) {
        /* Beta names (letters, digits, '-', '.', '_'), comma-separated:
         * nothing else may reach the upstream's header block. */
        const char *v = c->req.val[HRQ_ANTHROPIC_BETA];
        if (!*v ||
            v[strspn(v,
                     "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                     "0123456789-._, ")] != '\0') {
            hc_error(c, 400, PGW_BAD_REQUEST,
                     "anthropic-beta: expected beta names separated by commas");
            return;
        }
        r.anthropic_beta = v;
    }
    if (c->req.present[HRQ_CACHE_CONTROL])
        cache_parse_mode(c->req.val[HRQ_CACHE_CONTROL], &r.cache, &r.cache_max_age,
                         &r.cache_max_age_s);
    if (c->req.present[HRQ_SCOPE]) {
        memcpy(scope, c->req.val[HRQ_SCOPE], c->req.val_len[HRQ_SCOPE] + 1);
        r.scope = scope;
    }
    c->stream_open = false;
    call_begin(&c->sink, ++c->seq, &r);
}

static void route_call(struct http_conn *c, const char *path, size_t len)
{
    route_call_as(c, path, len, false);
}

static void route_gemini(struct http_conn *c, const char *path, size_t len)
{
    route_call_as(c, path, len, true);
}

/* ------------------------------------------------------------------ */
/* Task answers (the reply handle of the task methods)                 */

static struct http_conn *outlet_hc(struct reply_outlet *o)
{
    return (struct http_conn *)((char *)o - offsetof(struct http_conn, tasks));
}

/* Still waiting for this answer? (The client may be gone, or answered.) */
static bool task_answer_wanted(struct http_conn *c)
{
    return !c->closed && c->phase == HC_SERVING;
}

/* Counted as the msgpack-RPC front counts a response. */
static void task_answered(struct http_conn *c, enum pgw_code code)
{
    struct server *srv = c->hs->srv;

    srv->stats.requests_served++;
    if (code != PGW_OK)
        srv->stats.rejected[code]++;
    hc_response_done(c);
    hc_flush(c);
}

static struct writer *hto_result_begin(struct reply_outlet *o, uint32_t id)
{
    struct http_conn *c = outlet_hc(o);
    (void)id;

    strbuf_reset(&c->task_json);
    writer_init_json(&o->w, &c->task_json);
    return &o->w;
}

static void hto_result_end(struct reply_outlet *o, uint32_t id)
{
    struct http_conn *c = outlet_hc(o);
    (void)id;

    if (!task_answer_wanted(c))
        return;
    if (o->w.err)
        hc_error(c, 500, PGW_INTERNAL, "task answer cannot be written as JSON");
    else
        hc_reply(c, 200, "application/json", c->task_json.data, c->task_json.len, NULL,
                 "Cache-Control: no-store\r\n"); /* state, never for a proxy to keep */
    strbuf_reset(&c->task_json);
    task_answered(c, PGW_OK);
}

static void hto_error(struct reply_outlet *o, uint32_t id, const struct reply_error *e)
{
    struct http_conn *c = outlet_hc(o);
    (void)id;

    if (!task_answer_wanted(c))
        return;
    hc_send_error(c, 0, e);
    task_answered(c, e->code);
}

static const struct reply_outlet_ops http_outlet_ops = {
    .result_begin = hto_result_begin,
    .result_end = hto_result_end,
    .error = hto_error,
};

typedef void task_method_fn(struct reply_outlet *o, const struct task_req *r);

/* The body's members each task endpoint takes (the task_id is the
 * path's), as the msgpack-RPC method's named parameters. */
enum { TB_NODE, TB_TIMEOUT, TB_REASON, TB_OK, TB_BUDGET, TB_N };
static const struct rpc_param task_body_params[TB_N] = {
    [TB_NODE] = { "node", RPC_T_STR | RPC_T_NIL, false },
    [TB_TIMEOUT] = { "timeout_s", RPC_T_NUMBER | RPC_T_NIL, false },
    [TB_REASON] = { "reason", RPC_T_STR | RPC_T_NIL, false },
    [TB_OK] = { "ok", RPC_T_BOOL, false },
    [TB_BUDGET] = { "budget", RPC_T_NUMBER | RPC_T_NIL, false },
};

static const struct {
    const char *op; /* the last path segment; NULL = GET on the task */
    task_method_fn *fn;
    unsigned takes;    /* 1 << TB_* */
    unsigned requires; /* of which required */
} task_routes[] = {
    { NULL, tasks_get, 0, 0 },
    { "start", tasks_start, 1 << TB_BUDGET, 0 },
    { "stop", tasks_stop, 1 << TB_REASON, 0 },
    { "guard", tasks_guard, 0, 0 },
    { "node_begin", tasks_node_begin, 1 << TB_NODE | 1 << TB_TIMEOUT, 1 << TB_NODE },
    { "node_end", tasks_node_end, 1 << TB_NODE, 0 },
    { "finish", tasks_finish, 1 << TB_OK | 1 << TB_REASON, 1 << TB_OK },
};

/* Percent-decodes s[0..n) into out (cap bytes with the NUL). -1 when
 * malformed, empty, too long, or holding a NUL or '/'. */
static int pct_decode(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned ch = (unsigned char)s[i];
        if (ch == '%') {
            int hi = i + 2 < n ? jscan_hexval(s[i + 1]) : -1;
            int lo = i + 2 < n ? jscan_hexval(s[i + 2]) : -1;
            if (hi < 0 || lo < 0)
                return -1;
            ch = (unsigned)(hi * 16 + lo);
            i += 2;
        }
        if (ch == 0 || ch == '/' || o + 1 >= cap)
            return -1;
        out[o++] = (char)ch;
    }
    out[o] = '\0';
    return o ? 0 : -1;
}

/* What a task request names: its method (task_routes[ri]), the task and
 * who calls. */
struct task_target {
    int ri;
    char id[TASK_ID_MAX + 1];
    const struct config_app *app;
};

/* /polygw/v1/tasks/{id} and /polygw/v1/tasks/{id}/{op}, decided from the
 * head alone: false after answering 401 / 403 (who is calling), 404 / 405
 * (no such task endpoint), 400 (a bad id) or 415 (not JSON). */
static bool task_target(struct http_conn *c, const char *path, size_t len, struct task_target *t)
{
    static const char prefix[] = "/polygw/v1/tasks/";
    const char *rest = path + sizeof(prefix) - 1, *end = path + len;
    const char *slash = memchr(rest, '/', (size_t)(end - rest));
    const char *op = slash ? slash + 1 : NULL;
    size_t op_len = slash ? (size_t)(end - op) : 0;
    bool get = c->req.parser.method == HTTP_GET;

    if (!(t->app = hc_identify(c)))
        return false;
    t->ri = -1;
    for (size_t i = 0; i < sizeof(task_routes) / sizeof(task_routes[0]); i++) {
        if (get ? (!op && !task_routes[i].op)
                : (op && task_routes[i].op && path_is(op, op_len, task_routes[i].op))) {
            t->ri = (int)i;
            break;
        }
    }
    if (t->ri < 0) {
        bool known = (!op && !get) || (op && get);
        char quoted[129];
        rpc_quote_client_str(path, len, sizeof(quoted) - 1, quoted);
        hc_error(c, known ? 405 : 404, PGW_UNKNOWN_METHOD, "no task endpoint %s %s",
                 http_method_str((enum http_method)c->req.parser.method), quoted);
        return false;
    }
    char why[200];
    if (pct_decode(rest, (size_t)((slash ? slash : end) - rest), t->id, sizeof(t->id)) < 0 ||
        rpc_check_ident("task id", t->id, strlen(t->id), TASK_ID_MAX, why, sizeof(why)) < 0) {
        hc_error(c, 400, PGW_BAD_REQUEST,
                 "task id: expected 1 to %d bytes of UTF-8 (percent-encoded), without NUL or '/'",
                 TASK_ID_MAX);
        return false;
    }
    return hc_check_json_body(c, true) == 0;
}

static bool admit_task(struct http_conn *c, const char *path, size_t len)
{
    struct task_target t;
    return task_target(c, path, len, &t);
}

/* A task request's JSON body, bound as rpc_bind binds the method's named
 * parameters (with the same messages). */
struct task_body {
    unsigned takes;
    bool seen[TB_N];            /* named (null included) */
    struct jscan_value v[TB_N]; /* its value */
    char why[200];
};

/* A JSON value's type as rpc_bind names it (a JSON integer is an integer,
 * -0 included; a fraction or an exponent makes a float). */
static unsigned json_type(const struct jscan_value *v, const char **name)
{
    switch (v->type) {
    case JSCAN_OBJECT:
        *name = "map";
        return RPC_T_MAP;
    case JSCAN_ARRAY:
        *name = "array";
        return RPC_T_ARRAY;
    case JSCAN_STRING:
        *name = "string";
        return RPC_T_STR;
    case JSCAN_TRUE:
    case JSCAN_FALSE:
        *name = "boolean";
        return RPC_T_BOOL;
    case JSCAN_NULL:
        *name = "nil";
        return RPC_T_NIL;
    case JSCAN_NUMBER:
        break;
    }
    if (memchr(v->p, '.', v->len) || memchr(v->p, 'e', v->len) || memchr(v->p, 'E', v->len)) {
        *name = "float";
        return RPC_T_FLOAT;
    }
    if (v->p[0] == '-' && !(v->len == 2 && v->p[1] == '0')) {
        *name = "negative integer";
        return RPC_T_INT;
    }
    *name = "integer";
    return RPC_T_UINT;
}

static int task_body_member(void *ud, const char *key, const struct jscan_value *v)
{
    struct task_body *b = ud;
    size_t i;

    if (strcmp(key, "task_id") == 0)
        return 0; /* the path names the task */
    for (i = 0; i < TB_N; i++)
        if ((b->takes & 1u << i) && strcmp(key, task_body_params[i].name) == 0)
            break;
    if (i == TB_N) {
        char name[65];
        rpc_quote_client_str(key, strlen(key), sizeof(name) - 1, name);
        snprintf(b->why, sizeof(b->why), "unknown parameter '%s'", name);
        return 1;
    }
    if (b->seen[i]) {
        snprintf(b->why, sizeof(b->why), "parameter '%s' given twice", task_body_params[i].name);
        return 1;
    }
    const char *tname;
    if (!(json_type(v, &tname) & task_body_params[i].types)) {
        snprintf(b->why, sizeof(b->why), "parameter '%s': expected %s, got %s",
                 task_body_params[i].name, rpc_types_wanted(task_body_params[i].types), tname);
        return 1;
    }
    b->seen[i] = true;
    b->v[i] = *v;
    return 0;
}

/* A string member unescaped into a new NUL-terminated buffer (free it);
 * NULL when out of memory. */
static char *json_string_dup(const struct jscan_value *v, size_t *n)
{
    char *s = malloc(v->len);
    long len = s ? jscan_string(v, s, v->len - 1) : -1;

    if (len < 0) {
        free(s);
        return NULL;
    }
    *n = (size_t)len;
    return s;
}

/* Parses the body of task request `t` into `r`: false after answering 400
 * (or 500 when out of memory). */
static bool task_body_parse(struct http_conn *c, const struct task_target *t, struct task_req *r)
{
    struct task_body b = { .takes = task_routes[t->ri].takes };
    size_t err_at = 0;
    char why[200];

    memset(r, 0, sizeof(*r));
    r->msgid = ++c->seq;
    r->app = t->app;
    memcpy(r->id, t->id, sizeof(r->id));
    /* A start's trace context: the traceparent / tracestate headers (a
     * value too long to be well-formed is dropped, as on a call). */
    if (c->req.present[HRQ_TRACEPARENT] && c->req.val_len[HRQ_TRACEPARENT] < sizeof(r->traceparent))
        memcpy(r->traceparent, c->req.val[HRQ_TRACEPARENT], c->req.val_len[HRQ_TRACEPARENT] + 1);
    if (c->req.present[HRQ_TRACESTATE] && c->req.val_len[HRQ_TRACESTATE] < sizeof(r->tracestate))
        memcpy(r->tracestate, c->req.val[HRQ_TRACESTATE], c->req.val_len[HRQ_TRACESTATE] + 1);
    if (c->body_len > 0) {
        int rc = jscan_object(c->body, c->body_len, task_body_member, &b, &err_at);
        if (rc == -1) {
            hc_error(c, 400, PGW_BAD_REQUEST, "body is not valid JSON (at byte %zu)", err_at);
            return false;
        }
        if (rc == -2) {
            hc_error(c, 400, PGW_BAD_REQUEST, "body must be a JSON object");
            return false;
        }
        if (rc != 0) {
            hc_error(c, 400, PGW_BAD_REQUEST, "%s", b.why);
            return false;
        }
    }
    for (size_t i = 0; i < TB_N; i++) {
        if (b.seen[i] && b.v[i].type == JSCAN_NULL)
            b.seen[i] = false; /* null means absent */
        if ((task_routes[t->ri].requires & 1u << i) && !b.seen[i]) {
            hc_error(c, 400, PGW_BAD_REQUEST, "missing required parameter '%s'",
                     task_body_params[i].name);
            return false;
        }
    }
    if (b.seen[TB_NODE]) {
        size_t n;
        char *s = json_string_dup(&b.v[TB_NODE], &n);
        if (!s) {
            hc_error(c, 500, PGW_INTERNAL, "out of memory");
            return false;
        }
        int rc = rpc_check_ident("parameter 'node'", s, n, TASK_NODE_MAX, why, sizeof(why));
        if (rc == 0)
            memcpy(r->node, s, n + 1);
        free(s);
        if (rc < 0) {
            hc_error(c, 400, PGW_BAD_REQUEST, "%s", why);
            return false;
        }
        r->has_node = true;
    }
    if (b.seen[TB_TIMEOUT] &&
        (!jscan_number(&b.v[TB_TIMEOUT], &r->timeout_s) || !(r->timeout_s > 0) ||
         !isfinite(r->timeout_s))) {
        hc_error(c, 400, PGW_BAD_REQUEST,
                 "parameter 'timeout_s': expected a positive number of seconds");
        return false;
    }
    if (b.seen[TB_REASON]) {
        size_t n;
        char *s = json_string_dup(&b.v[TB_REASON], &n);
        if (!s) {
            hc_error(c, 500, PGW_INTERNAL, "out of memory");
            return false;
        }
        rpc_quote_client_str(s, n, sizeof(r->reason) - 1, r->reason);
        free(s);
    }
    r->ok = b.seen[TB_OK] && b.v[TB_OK].type == JSCAN_TRUE;
    /* A start's budget: the body's `budget`, else X-Polygw-Budget. */
    bool has_budget = b.seen[TB_BUDGET], budget_ok = true;
    if (has_budget) {
        budget_ok = jscan_number(&b.v[TB_BUDGET], &r->budget);
    } else if ((task_routes[t->ri].takes & 1u << TB_BUDGET) && c->req.present[HRQ_BUDGET]) {
        char *end;
        has_budget = true;
        r->budget = strtod(c->req.val[HRQ_BUDGET], &end);
        budget_ok = end != c->req.val[HRQ_BUDGET] && !*end;
    }
    if (has_budget && (!budget_ok || !(r->budget > 0) || !isfinite(r->budget))) {
        hc_error(c, 400, PGW_BAD_REQUEST, "%s: expected a positive amount of the currency",
                 b.seen[TB_BUDGET] ? "parameter 'budget'" : "X-Polygw-Budget");
        return false;
    }
    return true;
}

static void route_task(struct http_conn *c, const char *path, size_t len)
{
    struct task_target t;
    struct task_req r;

    if (!task_target(c, path, len, &t) || !task_body_parse(c, &t, &r))
        return;
    /* It answers now or later, through c->tasks (hto_*). */
    task_routes[t.ri].fn(&c->tasks, &r);
}

/* POST /polygw/v1/cache/purge?capability=C&app=A (both optional): drops
 * cached answers (ops/cacheops.h), admin apps only; answers {"purged": n},
 * or once the shared tier is walked {"purged": n, "purged_shared": m}.
 * The filters ride in the query, percent-encoded, so the request has no
 * body to parse; a body, if any, must still be JSON (hc_check_json_body). */
static bool admit_cache_purge(struct http_conn *c, const char *path, size_t len)
{
    (void)path;
    (void)len;
    return hc_identify(c) && hc_check_json_body(c, true) == 0;
}

static void route_cache_purge(struct http_conn *c, const char *path, size_t len)
{
    char val[2][CONFIG_NAME_MAX], err[200], body[64];
    bool has[2] = { false, false };
    size_t qlen, purged;
    const char *q = hc_query(c, &qlen), *end = q ? q + qlen : NULL;
    const struct config_app *app;
    enum pgw_code code;

    (void)path;
    (void)len;
    if (!(app = hc_identify(c)) || hc_check_json_body(c, true) < 0)
        return;
    while (q && q < end) {
        const char *amp = memchr(q, '&', (size_t)(end - q)), *stop = amp ? amp : end;
        const char *eq = memchr(q, '=', (size_t)(stop - q));
        int i = !eq                                                      ? -1
            : (size_t)(eq - q) == 10 && memcmp(q, "capability", 10) == 0 ? 0
            : (size_t)(eq - q) == 3 && memcmp(q, "app", 3) == 0          ? 1
                                                                         : -1;
        if (stop == q) { /* an empty pair ("a=1&&b=2") */
            q = stop + 1;
            continue;
        }
        if (i < 0 || has[i] ||
            pct_decode(eq + 1, (size_t)(stop - eq - 1), val[i], sizeof(val[i])) < 0 ||
            rpc_check_ident(i ? "app" : "capability", val[i], strlen(val[i]), CONFIG_NAME_MAX - 1,
                            err, sizeof(err)) < 0) {
            hc_error(c, 400, PGW_BAD_REQUEST,
                     "cache purge: the query takes capability=NAME and app=NAME, each once "
                     "(percent-encoded, 1 to %d bytes)",
                     CONFIG_NAME_MAX - 1);
            return;
        }
        has[i] = true;
        q = stop + 1;
    }
    int rc = cacheops_purge(c->hs->srv, app, has[0] ? val[0] : NULL, has[1] ? val[1] : NULL,
                            &c->tasks, 0, &purged, &code, err, sizeof(err));
    if (rc == 1)
        return; /* answered once the shared tier is purged, through c->tasks (hto_*) */
    if (rc < 0) {
        hc_error(c,
                 rc == -1                             ? 403
                     : code == PGW_UNKNOWN_CAPABILITY ? 404
                     : code == PGW_BAD_REQUEST        ? 400
                                                      : 0,
                 code, "%s", err);
        return;
    }
    int n = snprintf(body, sizeof(body), "{\"purged\":%zu}", purged);
    hc_reply(c, 200, "application/json", body, (size_t)n, NULL, "Cache-Control: no-store\r\n");
}

/* The route table: `path` is matched exactly, or as a prefix (itself
 * included) when it ends in '/'. The first row whose method and path match decides; a path that
 * matches with another method only is 405, no match 404. A route answers
 * at once (hc_reply, hc_error), or starts a call or a task request that
 * answers later through the sink or the task reply handle. A new endpoint is one row
 * and one route_fn. `admit`, when set, runs on the head (hc_admit), before
 * any byte of the body is read: what it refuses (who is calling, the
 * content type, a capability or task endpoint that does not exist) is
 * answered without reading the body. The route runs it again on the whole
 * request, since the configuration may have been reloaded meanwhile. */
typedef bool admit_fn(struct http_conn *c, const char *path, size_t len);

static const struct {
    enum http_method method;
    const char *path;
    route_fn *fn;
    admit_fn *admit;
} routes[] = {
    { HTTP_GET, "/healthz", route_healthz, NULL },
    { HTTP_GET, "/readyz", route_readyz, NULL },
    { HTTP_GET, "/v1/models", route_models, NULL },
    { HTTP_GET, "/metrics", route_metrics, NULL },
    { HTTP_GET, "/polygw/v1/tasks/", route_task, admit_task },
    { HTTP_POST, "/polygw/v1/tasks/", route_task, admit_task },
    { HTTP_GET, "/polygw/v1/stats", route_status_stats, admit_status },
    { HTTP_POST, "/polygw/v1/cache/purge", route_cache_purge, admit_cache_purge },
    { HTTP_GET, "/polygw/", route_status_page, admit_status_page },
    { HTTP_POST, "/v1/", route_call, admit_call },
    { HTTP_POST, GEMROUTE_PREFIX, route_gemini, admit_gemini },
    { HTTP_GET, "/v1/", route_call, admit_call },    /* raw capabilities (raw.h) */
    { HTTP_DELETE, "/v1/", route_call, admit_call }, /* raw capabilities */
};

static bool route_matches(const char *rp, const char *path, size_t len)
{
    size_t n = strlen(rp);
    if (rp[n - 1] == '/')
        return len >= n && memcmp(path, rp, n) == 0;
    return path_is(path, len, rp);
}

/* The request's path: its target up to the query. */
static size_t hc_path_len(const struct http_conn *c)
{
    const char *q = memchr(c->req.url, '?', c->req.url_len);
    return q ? (size_t)(q - c->req.url) : c->req.url_len;
}

static bool hc_shutting_down(struct http_conn *c)
{
    if (c->hs->srv->state == SERVER_RUNNING && !c->hs->stopping)
        return false;
    c->keep_alive = false;
    hc_error(c, 503, PGW_SHUTTING_DOWN, "the sidecar is shutting down");
    return true;
}

/* Where the request comes from (docs/HTTP.md section 8): false after
 * answering 403 (a browser page of another origin, a Host that is not this
 * front's) or a CORS preflight of an allowed origin. */
static bool hc_site_allowed(struct http_conn *c)
{
    const struct config *cfg = c->hs->srv->cfg;
    const struct httpreq_site site = {
        .check_host = !c->is_unix,
        .origins = (const char *const *)cfg->http_allowed_origins,
        .n_origins = cfg->n_http_allowed_origins,
        .hosts = (const char *const *)cfg->http_allowed_hosts,
        .n_hosts = cfg->n_http_allowed_hosts,
    };
    const char *why = NULL;
    enum httpreq_site_rc rc = httpreq_check_site(&c->req, &site, &why);

    if (rc == HTTPREQ_SITE_REFUSED) {
        hc_error(c, 403, PGW_BAD_REQUEST,
                 "refused: %s (a browser page may call the front only from its own origin or "
                 "one of http.allowed_origins)",
                 why);
        return false;
    }
    c->cors = rc == HTTPREQ_SITE_ALLOWED;
    if (c->cors && c->req.parser.method == HTTP_OPTIONS) {
        /* The preflight of a call from an allowed origin. */
        hc_reply(c, 200, "text/plain; charset=utf-8", "", 0, NULL,
                 "Access-Control-Allow-Methods: GET, POST, DELETE\r\n"
                 "Access-Control-Allow-Headers: *, Authorization\r\n"
                 "Access-Control-Max-Age: 600\r\n");
        return false;
    }
    return true;
}

/* Decides a request from its head alone: an over-long header of ours, the
 * sidecar shutting down, the route (404 / 405), and the route's own
 * checks. Returns true with c->route set, or false after answering. */
static bool hc_admit(struct http_conn *c)
{
    const char *path = c->req.url;
    size_t len = hc_path_len(c);
    bool other_method = false;

    c->hs->stats.requests++;
    c->sdk_retry =
        c->req.present[HRQ_SDK_RETRY] && strcasecmp(c->req.val[HRQ_SDK_RETRY], "true") == 0;
    if (c->req.over != HRQ_NONE) {
        hc_error(c, 431, PGW_BAD_REQUEST, "header %s is longer than %d bytes",
                 httpreq_hdr_name(c->req.over), HTTPREQ_VAL_MAX);
        return false;
    }
    if (hc_shutting_down(c) || !hc_site_allowed(c))
        return false;
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        if (!route_matches(routes[i].path, path, len))
            continue;
        if (routes[i].method != (enum http_method)c->req.parser.method) {
            other_method = true;
            continue;
        }
        c->route = (int)i;
        return !routes[i].admit || routes[i].admit(c, path, len);
    }
    char quoted[129];
    rpc_quote_client_str(path, len, sizeof(quoted) - 1, quoted);
    if (other_method)
        hc_error(c, 405, PGW_UNKNOWN_METHOD, "%s is not allowed on %s",
                 http_method_str((enum http_method)c->req.parser.method), quoted);
    else
        hc_error(c, 404, PGW_UNKNOWN_METHOD, "no endpoint %s", quoted);
    return false;
}

/* Serves a request read whole: admitted at its head (hc_admit), or
 * answered already. */
static void hc_dispatch(struct http_conn *c)
{
    if (c->answered || hc_shutting_down(c)) {
        hc_response_done(c);
        return;
    }
    routes[c->route].fn(c, c->req.url, hc_path_len(c));
    /* The body went into the call or the task request: a large buffer is
     * not kept for the next request. */
    if (c->body_cap > HTTP_KEEP_BUFFER_BYTES)
        hc_drop_body(c);
    /* Answered at once, unless a call, a task request or a cache purge is
     * in flight (those answer through the sink / the task reply handle). */
    if (c->phase == HC_SERVING && c->sink.n_calls == 0 && !c->tasks.waiting && !c->tasks.purges)
        hc_response_done(c);
}

/* ------------------------------------------------------------------ */
/* Connection I/O                                                      */

/* Output the connection has pending: its queued answer bytes and what its
 * call is still receiving for it. */
static size_t hc_pending_out(const struct http_conn *c)
{
    return out_queued(c) + c->budget.received;
}

/* Read back-pressure. Over the output budget a connection is paused (no
 * parsing, no reading) until its output falls to half of it; otherwise it
 * is read while its unparsed input is under HTTP_IN_MAX. */
static void hc_backpressure(struct http_conn *c)
{
    struct server *srv = c->hs->srv;
    size_t limit = srv->cfg->max_write_queue_bytes;
    size_t pending = hc_pending_out(c);

    if (c->closed || c->phase == HC_CLOSING)
        return;
    if (!c->out_paused && pending > limit) {
        c->out_paused = true;
        srv->stats.read_pauses++;
        log_at(LOG_DEBUG, "http connection read paused", "conn", LOG_U, (unsigned long long)c->id,
               "queued_bytes", LOG_U, (unsigned long long)out_queued(c), NULL);
    } else if (c->out_paused && pending <= limit / 2) {
        c->out_paused = false;
        /* Requests it pipelined meanwhile are parsed from the loop. */
        if (c->phase != HC_SERVING && strbuf_live(&c->in) > 0 && !ev_is_active(&c->next_w)) {
            ev_timer_set(&c->next_w, 0., 0.);
            ev_timer_start(srv->loop, &c->next_w);
        }
    }
    hc_set_reading(c, !c->out_paused && strbuf_live(&c->in) < HTTP_IN_MAX);
}

static void hc_process(struct http_conn *c)
{
    size_t limit = c->hs->srv->cfg->max_write_queue_bytes;

    while (!c->closed && (c->phase == HC_IDLE || c->phase == HC_HEAD || c->phase == HC_BODY) &&
           strbuf_live(&c->in) > 0 && !c->out_paused && hc_pending_out(c) <= limit) {
        const struct config *cfg = c->hs->srv->cfg;
        size_t n;
        c->req.max_header_bytes = cfg->http_max_header_bytes;
        /* Before the route is known, the largest bound of any (raw.h). */
        c->req.max_body_bytes = c->phase != HC_BODY ? httpraw_max_body(cfg)
            : c->raw_limit                          ? c->raw_limit
                                                    : cfg->http_max_body_bytes;
        enum httpreq_rc rc = httpreq_execute(&c->req, strbuf_head(&c->in), strbuf_live(&c->in), &n);
        strbuf_consume(&c->in, n);
        if (rc == HTTPREQ_DONE) {
            c->phase = HC_SERVING;
            hc_arm(c, 0);
            c->keep_alive = c->keep_alive && httpreq_keep_alive(&c->req);
            hc_dispatch(c);
        } else if (rc == HTTPREQ_STOP) {
            hc_close_after_flush(c, true); /* answered at its head (hc_on_head) */
            break;
        } else if (rc == HTTPREQ_FAIL) {
            hc_reject_input(c);
            break;
        }
    }
    if (strbuf_live(&c->in) == 0) {
        if (c->in.cap > HTTP_KEEP_BUFFER_BYTES)
            strbuf_fini(&c->in);
    }
    hc_backpressure(c);
    hc_account_input(c);
}

/* A closing connection's input, read and dropped until the client closes
 * (or the linger timer closes it). */
static void hc_drain(struct http_conn *c)
{
    static char sink[HTTP_READ_CHUNK];
    ssize_t n = recv(c->fd, sink, sizeof(sink), 0);

    if (n == 0)
        hc_close(c, "peer closed");
    else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        hc_close(c, "read failed");
}

static void hc_on_read(struct ev_loop *loop, ev_io *w, int revents)
{
    struct http_conn *c = w->data;
    (void)loop;
    (void)revents;

    if (c->phase == HC_CLOSING) {
        hc_drain(c);
        return;
    }
    /* Room for a chunk (less strbuf's byte for a NUL, so that an empty
     * buffer is exactly HTTP_READ_CHUNK); the parsed prefix is reclaimed
     * first. */
    if (strbuf_reserve(&c->in, HTTP_READ_CHUNK - 1) < 0) {
        hc_close(c, "out of memory reading");
        return;
    }
    ssize_t n = recv(c->fd, c->in.data + c->in.len, HTTP_READ_CHUNK - 1, 0);
    if (n == 0) {
        hc_close(c, "peer closed");
        return;
    }
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            hc_close(c, "read failed");
        return;
    }
    c->in.len += (size_t)n;
    if (strbuf_live(&c->in) >= HTTP_IN_MAX)
        hc_set_reading(c, false);
    hc_process(c);
    hc_flush(c);
}

static void hc_flush(struct http_conn *c)
{
    if (c->closed)
        return;
    if (c->oom) {
        hc_close(c, "out of memory queueing an answer");
        return;
    }
    bool progress = false;
    while (strbuf_live(&c->out) > 0) {
        ssize_t n = send(c->fd, strbuf_head(&c->out), strbuf_live(&c->out), MSG_NOSIGNAL);
        if (n > 0) {
            strbuf_consume(&c->out, (size_t)n);
            progress = true;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        hc_close(c, "write failed");
        return;
    }
    size_t limit = c->hs->srv->cfg->max_write_queue_bytes;
    if (strbuf_live(&c->out) == 0) {
        if (c->out.cap > HTTP_KEEP_BUFFER_BYTES)
            strbuf_fini(&c->out);
        ev_io_stop(c->hs->srv->loop, &c->wio);
        if (c->phase == HC_CLOSING && c->draining) {
            hc_shut_write(c);
        } else if (c->phase == HC_CLOSING) {
            hc_close(c, "answered, closing");
            return;
        }
        if (c->phase == HC_SERVING)
            hc_arm(c, 0);
    } else {
        if (!ev_is_active(&c->wio))
            ev_io_start(c->hs->srv->loop, &c->wio);
        /* A client that takes nothing of an answer for send_timeout_s is
         * gone in all but name (the timer runs between writes, as nginx's
         * send_timeout). */
        if (c->phase == HC_SERVING && (progress || !ev_is_active(&c->phase_w)))
            hc_arm(c, c->hs->srv->cfg->http_send_timeout_s);
    }
    c->budget.held = out_queued(c);
    upstream_budget_on_drained(&c->budget);
    if (out_queued(c) <= limit / 2 && c->sink.paused_calls)
        call_on_drained(&c->sink);
    hc_backpressure(c);
}

static void hc_on_write(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    hc_flush(w->data);
}

static void hc_close(struct http_conn *c, const char *why)
{
    struct http_server *hs = c->hs;
    struct ev_loop *loop = hs->srv->loop;

    if (c->closed)
        return;
    c->closed = true;
    ev_io_stop(loop, &c->rio);
    ev_io_stop(loop, &c->wio);
    ev_timer_stop(loop, &c->phase_w);
    ev_timer_stop(loop, &c->next_w);
    /* The client is gone: nothing it asked for may keep running. */
    call_abort_all(&c->sink);
    tasks_fail_pending(&c->tasks, PGW_OK, NULL);
    cacheops_fail_pending(&c->tasks, PGW_OK, NULL);
    hs->srv->input_bytes -= c->input_bytes;
    c->input_bytes = 0;
    close(c->fd);
    c->fd = -1;
    log_at(LOG_DEBUG, "http connection closed", "conn", LOG_U, (unsigned long long)c->id, "reason",
           LOG_S, why, NULL);
    DLIST_UNLINK(hs->conns, c, prev, next);
    c->next = hs->dead;
    hs->dead = c;
    hs->stats.conns_open--;
    ev_prepare_start(loop, &hs->reap_w);
    server_on_front_closed(hs->srv);
}

static void hc_free(struct http_conn *c)
{
    strbuf_fini(&c->task_json);
    strbuf_fini(&c->in);
    strbuf_fini(&c->out);
    free(c->body);
    free(c);
}

static void http_on_reap(struct ev_loop *loop, ev_prepare *w, int revents)
{
    struct http_server *hs = w->data;
    (void)revents;
    while (hs->dead) {
        struct http_conn *c = hs->dead;
        hs->dead = c->next;
        hc_free(c);
    }
    ev_prepare_stop(loop, w);
}

/* ------------------------------------------------------------------ */
/* Listeners                                                           */

/* Over http.max_connections: say why, then close. Best effort: the socket
 * buffer of a new connection is empty, so one send suffices. */
static void http_reject(struct http_server *hs, int fd)
{
    static const char body[] =
        "{\"error\":{\"message\":\"too many HTTP connections (http.max_connections)\","
        "\"type\":\"service_unavailable_error\",\"code\":\"overloaded\",\"param\":null,"
        "\"polygw\":{}}}";
    char buf[512];
    int n = snprintf(buf, sizeof(buf),
                     "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\nx-should-retry: false\r\n"
                     "X-Polygw-Code: overloaded\r\nRetry-After: 1\r\n\r\n%s",
                     sizeof(body) - 1, body);
    ssize_t w = send(fd, buf, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
    close(fd);
    hs->stats.conns_rejected++;
    hs->srv->stats.rejected[PGW_OVERLOADED]++;
}

static void http_on_accept_retry(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct http_listener *l = w->data;
    (void)revents;
    if (l->fd >= 0)
        ev_io_start(loop, &l->w);
}

static void http_pause_accept(struct http_listener *l, const char *why)
{
    struct ev_loop *loop = l->hs->srv->loop;
    log_at(LOG_WARN, "http accept failed; pausing accept", "error", LOG_S, why, "pause_s", LOG_F,
           HTTP_ACCEPT_PAUSE_S, NULL);
    ev_io_stop(loop, &l->w);
    ev_timer_set(&l->retry_w, HTTP_ACCEPT_PAUSE_S, 0.);
    ev_timer_start(loop, &l->retry_w);
}

static void http_on_accept(struct ev_loop *loop, ev_io *w, int revents)
{
    static uint64_t next_id = 1;
    struct http_listener *l = w->data;
    struct http_server *hs = l->hs;
    const struct config *cfg = hs->srv->cfg;
    (void)revents;

    for (int i = 0; i < HTTP_ACCEPT_BATCH && l->fd >= 0; i++) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                http_pause_accept(l, strerror(errno));
            return;
        }
        if (hs->stats.conns_open >= cfg->http_max_connections) {
            http_reject(hs, fd);
            continue;
        }
        struct http_conn *c = calloc(1, sizeof(*c));
        if (!c) {
            close(fd);
            hs->stats.conns_rejected++;
            continue;
        }
        if (!l->is_unix) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        }
        c->hs = hs;
        c->tasks.ops = &http_outlet_ops;
        c->tasks.srv = hs->srv;
        c->id = next_id++;
        c->fd = fd;
        c->is_unix = l->is_unix;
        peer_read(l->is_unix ? fd : -1, &c->peer);
        peer_ids(&c->peer, &c->sink.peer_pid, &c->sink.peer_uid);
        httpreq_init(&c->req, &hc_req_ops, c);
        c->sink.ops = &http_sink_ops;
        c->sink.srv = hs->srv;
        c->sink.budget = &c->budget;
        upstream_budget_init(&c->budget, cfg->max_write_queue_bytes);
        ev_io_init(&c->rio, hc_on_read, fd, EV_READ);
        ev_io_init(&c->wio, hc_on_write, fd, EV_WRITE);
        ev_init(&c->phase_w, hc_on_timer);
        ev_init(&c->next_w, hc_on_next);
        c->rio.data = c->wio.data = c->phase_w.data = c->next_w.data = c;
        DLIST_PUSH(hs->conns, c, prev, next);
        hs->stats.conns_open++;
        hs->stats.conns_accepted++;
        hc_set_reading(c, true);
        hc_arm(c, cfg->http_header_timeout_s);
        (void)loop;
    }
}

static int http_listen_tcp(struct http_server *hs, char *err, size_t errlen)
{
    struct config_addr a;
    char why[160];
    struct sockaddr_storage ss;
    socklen_t sl;

    if (config_parse_addr(hs->srv->cfg->http_listen, &a, why, sizeof(why)) < 0) {
        snprintf(err, errlen, "http.listen: %s", why);
        return -1;
    }
    /* config_parse_addr() checked the literal. */
    iplit_sockaddr(a.host, strlen(a.host), a.ipv6 ? IPLIT_V6 : IPLIT_V4, a.port, &ss, &sl);
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0) {
        snprintf(err, errlen, "http.listen: socket: %s", strerror(errno));
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (a.ipv6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&ss, sl) < 0 || listen(fd, 511) < 0) {
        snprintf(err, errlen, "http.listen %s: %s", hs->srv->cfg->http_listen, strerror(errno));
        close(fd);
        return -1;
    }
    sl = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        hs->tcp_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                      : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

static void http_listener_close(struct http_server *hs, struct http_listener *l)
{
    if (l->fd < 0)
        return;
    ev_io_stop(hs->srv->loop, &l->w);
    ev_timer_stop(hs->srv->loop, &l->retry_w);
    close(l->fd);
    l->fd = -1;
    if (l->is_unix && hs->socket_path && unlink(hs->socket_path) < 0 && errno != ENOENT)
        log_at(LOG_WARN, "cannot remove socket file", "socket", LOG_S, hs->socket_path, "error",
               LOG_S, strerror(errno), NULL);
}

struct http_server *http_new(struct server *srv, char *err, size_t errlen)
{
    const struct config *cfg = srv->cfg;

    if (errlen)
        err[0] = '\0';
    if (!cfg->http_socket && !cfg->http_listen)
        return NULL;
    struct http_server *hs = calloc(1, sizeof(*hs));
    if (!hs) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    hs->srv = srv;
    ev_prepare_init(&hs->reap_w, http_on_reap);
    hs->reap_w.data = hs;
    for (int i = 0; i < 2; i++) {
        hs->lis[i].fd = -1;
        hs->lis[i].hs = hs;
        hs->lis[i].is_unix = i == 0;
    }
    if (cfg->http_socket) {
        hs->lis[0].fd = net_bind_unix(cfg->http_socket, cfg->socket_mode, err, errlen);
        if (hs->lis[0].fd < 0)
            goto fail;
        hs->socket_path = strdup(cfg->http_socket);
        if (!hs->socket_path) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
    }
    if (cfg->http_listen && (hs->lis[1].fd = http_listen_tcp(hs, err, errlen)) < 0)
        goto fail;
    for (int i = 0; i < 2; i++) {
        ev_io_init(&hs->lis[i].w, http_on_accept, hs->lis[i].fd, EV_READ);
        ev_init(&hs->lis[i].retry_w, http_on_accept_retry);
        hs->lis[i].w.data = hs->lis[i].retry_w.data = &hs->lis[i];
    }
    return hs;
fail:
    if (hs->lis[0].fd >= 0) {
        close(hs->lis[0].fd);
        if (hs->socket_path)
            unlink(hs->socket_path);
        else
            unlink(cfg->http_socket);
    }
    free(hs->socket_path);
    free(hs);
    return NULL;
}

void http_start(struct http_server *hs)
{
    if (!hs)
        return;
    const struct config *cfg = hs->srv->cfg;
    for (int i = 0; i < 2; i++)
        if (hs->lis[i].fd >= 0)
            ev_io_start(hs->srv->loop, &hs->lis[i].w);
    char port[16];
    snprintf(port, sizeof(port), "%d", hs->tcp_port);
    log_at(LOG_INFO, "http listening", "socket", LOG_S, hs->socket_path ? hs->socket_path : "-",
           "listen", LOG_S, cfg->http_listen ? cfg->http_listen : "-", "port", LOG_S,
           cfg->http_listen ? port : "-", "max_body_bytes", LOG_U,
           (unsigned long long)cfg->http_max_body_bytes, NULL);
}

void http_stop_listening(struct http_server *hs)
{
    if (!hs)
        return;
    for (int i = 0; i < 2; i++)
        http_listener_close(hs, &hs->lis[i]);
}

void http_stop(struct http_server *hs)
{
    if (!hs)
        return;
    hs->stopping = true;
    for (struct http_conn *c = hs->conns, *next; c; c = next) {
        next = c->next;
        call_fail_all(&c->sink, PGW_SHUTTING_DOWN,
                      "the sidecar shut down before the call finished");
        tasks_fail_pending(&c->tasks, PGW_SHUTTING_DOWN,
                           "the sidecar shut down before the state backend answered");
        cacheops_fail_pending(&c->tasks, PGW_SHUTTING_DOWN,
                              "the sidecar shut down before the state backend answered");
        if (!c->closed) {
            c->keep_alive = false;
            hc_close_after_flush(c, false);
            hc_flush(c);
        }
    }
}

void http_close_all(struct http_server *hs)
{
    if (!hs)
        return;
    while (hs->conns)
        hc_close(hs->conns, "shutdown");
}

/* The open connection holding the most unfinished input, or NULL. */
static struct http_conn *http_input_hog(const struct http_server *hs)
{
    struct http_conn *v = NULL;

    for (struct http_conn *c = hs ? hs->conns : NULL; c; c = c->next)
        if (!c->closed && c->phase != HC_CLOSING && (!v || c->input_bytes > v->input_bytes))
            v = c;
    return v;
}

size_t http_input_most(const struct http_server *hs)
{
    const struct http_conn *v = http_input_hog(hs);
    return v ? v->input_bytes : 0;
}

void http_refuse_input_most(struct http_server *hs, size_t total, size_t cap)
{
    struct http_conn *c = http_input_hog(hs);
    char msg[240];

    if (!c)
        return;
    snprintf(msg, sizeof(msg),
             "the sidecar holds %zu bytes of unfinished requests (max_buffered_input_bytes %zu); "
             "this connection held the most, %zu: retry later",
             total, cap, c->input_bytes);
    log_at(LOG_INFO, "http connection refused: unfinished input over budget", "conn", LOG_U,
           (unsigned long long)c->id, "held_bytes", LOG_U, (unsigned long long)c->input_bytes,
           NULL);
    hs->srv->input_bytes -= c->input_bytes;
    c->input_bytes = 0;
    strbuf_reset(&c->in);
    hc_drop_body(c);
    if (c->phase == HC_SERVING) {
        /* Its request is answered here, whatever was running for it. */
        call_abort_all(&c->sink);
        tasks_fail_pending(&c->tasks, PGW_OK, NULL);
        cacheops_fail_pending(&c->tasks, PGW_OK, NULL);
    }
    if (c->stream_open) {
        hc_close(c, "unfinished input over max_buffered_input_bytes");
        return;
    }
    c->keep_alive = false;
    hc_error(c, 503, PGW_OVERLOADED, "%s", msg);
    hc_close_after_flush(c, true);
    hc_flush(c);
}

bool http_has_conns(const struct http_server *hs)
{
    return hs && hs->conns;
}

const struct http_stats *http_get_stats(const struct http_server *hs)
{
    return hs ? &hs->stats : NULL;
}

void http_free(struct http_server *hs)
{
    if (!hs)
        return;
    http_stop_listening(hs);
    http_close_all(hs);
    while (hs->dead) {
        struct http_conn *c = hs->dead;
        hs->dead = c->next;
        hc_free(c);
    }
    ev_prepare_stop(hs->srv->loop, &hs->reap_w);
    free(hs->socket_path);
    free(hs);
}
