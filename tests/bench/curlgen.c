/*
 * curlgen.c — HTTP load generator on libcurl multi: the direct floor of the
 * `call` benchmark (the same chat request the sidecar would send, sent
 * straight to the upstream).
 *
 *   curlgen --url URL [--clients N] [--requests TOTAL] [--duration S]
 *           [--body-json JSON | --body-file F] [--warmup N]
 *           [--timeout-ms MS] [--max-body-bytes B] [--stream] [--json]
 *
 * Why it looks like this: the `call` benchmark asks what the sidecar adds on
 * top of a request an application could have sent itself. The fair floor is
 * therefore the request the sidecar sends, issued the way the sidecar issues
 * it: libcurl multi driven by readiness events on one thread, HTTP/1.1
 * keep-alive, the same headers (`Content-Type: application/json`,
 * `Accept: application/json`, no `Expect:` and no `Accept-Encoding`, as
 * the sidecar's own HTTP/1.1 client writes them to a plain-http address),
 * and the body re-serialised the way the sidecar's
 * transcoder writes it (compact JSON, keys in their original order). run.sh
 * checks, through the mock's request record, that both paths put the same
 * bytes on the wire.
 *
 * Design (mirrors loadgen.c, so the two kinds of rows are comparable):
 *
 *  - One thread, one multi handle, one level-triggered epoll set fed by
 *    CURLMOPT_SOCKETFUNCTION; CURLMOPT_TIMERFUNCTION only records a
 *    deadline, and the loop calls curl_multi_socket_action(CURL_SOCKET_TIMEOUT)
 *    itself once it is due (never from inside a curl callback).
 *  - N clients, each with its own easy handle, in a closed loop: when a
 *    transfer completes the handle is removed and, if the budget allows,
 *    added again at once for the next request. Connections live in the multi
 *    handle's pool (CURLMOPT_MAXCONNECTS = N), so at most N are open and every
 *    request after the first reuses one; `new_connections` counts those opened
 *    in the measured phase (0 in a healthy run with warm-up).
 *  - Latency = completion time - start time, CLOCK_MONOTONIC. The start is
 *    stamped just before curl_multi_add_handle (like loadgen's stamp before
 *    encoding), the completion once per epoll_wait() batch (like loadgen's
 *    stamp once per read()), so both include the generator's own queueing.
 *  - The histogram is loadgen's (bench_hist.h).
 *
 * Validation: a response is ok only when the transfer succeeded, the status
 * is 200 and the body is one syntactically valid JSON object (a strict,
 * allocation-free check of every body, see cg_is_json_object). Errors by kind:
 * transport (any curl error but a timeout: refused, reset, cut body),
 * timeout (no complete answer within --timeout-ms, curl's CURLOPT_TIMEOUT_MS),
 * http (status not 200), body (not a JSON object, or over --max-body-bytes).
 * The first error's text is kept. Only ok responses are timed.
 *
 * --stream: the body asks for an SSE answer (`"stream": true`, which the
 * caller puts in it), sent with `Accept: text/event-stream` as the sidecar
 * sends a streaming attempt; an answer is ok when it is status 200 and an
 * SSE body ending in `data: [DONE]`. Each ok answer also records its time
 * to the first body byte (ttft_* in the report): the floor of a streamed
 * call's time to first chunk through the sidecar (loadgen's ttft_*).
 *
 * Bounds: the run stops issuing after TOTAL requests or S seconds, whichever
 * comes first (S is capped at CG_HARD_CAP_S; with neither given, S = 5); the
 * transfers still running then finish or time out (each has its own
 * --timeout-ms). An alarm ends the process if it is still alive
 * S + timeout + 30 s after it started.
 *
 * Output: a human summary, or with --json one flat JSON object on one line
 * (keys in cg_report_json; the shared ones as in loadgen). Exit status 0 when
 * every measured request was ok, 1 when any error happened or nothing
 * completed, 2 on bad usage or set-up failure, 3 when the hard-cap alarm
 * fired.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "bench_common.h"

#define CG_HARD_CAP_S         120
#define CG_DEFAULT_DURATION_S 5.0
#define CG_MAX_CLIENTS        4096
#define CG_TICK_MS            20 /* longest epoll_wait: bounds how late a deadline is seen */
#define CG_DEFAULT_BODY                                                          \
    "{\"model\":\"gpt-4o-mini\",\"messages\":[{\"role\":\"system\",\"content\":" \
    "\"You are a helpful assistant.\"},{\"role\":\"user\",\"content\":"          \
    "\"Hello, how are you today?\"}]}"

/* ------------------------------------------------------------ run state */

struct cg_opts {
    const char *url;
    unsigned clients;
    uint64_t total; /* 0: unlimited (duration bounds the run) */
    double duration_s;
    uint64_t warmup;
    long timeout_ms;
    size_t max_body_bytes;
    bool stream;
    bool json;
};

struct cg_counts {
    uint64_t sent, ok;
    uint64_t err_transport, err_timeout, err_http, err_body;
    uint64_t new_conns;  /* connections opened by measured transfers */
    uint64_t resp_bytes; /* body bytes of the responses counted ok */
};

struct cg_client {
    CURL *easy;
    bool busy;
    bool too_big; /* body exceeded --max-body-bytes */
    size_t max;   /* --max-body-bytes */
    uint64_t t_send_ns;
    uint64_t t_first_ns; /* first body byte of this transfer; 0 before it */
    char *buf;           /* response body */
    size_t len, cap;
};

struct cg {
    const struct cg_opts *o;
    CURLM *multi;
    int epfd;
    struct curl_slist *headers;
    const char *body;
    size_t body_len;
    struct cg_client *clients;
    unsigned outstanding;
    uint64_t timer_at_ns; /* curl's timer; UINT64_MAX = none */
    uint64_t warm_left, issued;
    bool measuring;
    uint64_t deadline_ns; /* stop issuing at this time */
    uint64_t t0_ns, t_end_ns;
    uint64_t warm_errors;
    struct cg_counts cnt;
    struct bench_hist hist;
    struct bench_hist ttft; /* --stream: start → first body byte */
    char first_error[200];
};

static void cg_note_error(struct cg *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void cg_note_error(struct cg *g, const char *fmt, ...)
{
    if (g->first_error[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->first_error, sizeof(g->first_error), fmt, ap);
    va_end(ap);
}

static uint64_t cg_errors(const struct cg_counts *c)
{
    return c->err_transport + c->err_timeout + c->err_http + c->err_body;
}

/* ------------------------------------------------------ curl callbacks */

/* CURLMOPT_SOCKETFUNCTION: mirror curl's interest in the epoll set. The
 * socket's `socketp` (curl_multi_assign) is non-NULL while it is in the set. */
static int cg_on_socket(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
    struct cg *g = userp;
    (void)easy;

    if (what == CURL_POLL_REMOVE) {
        if (socketp) {
            epoll_ctl(g->epfd, EPOLL_CTL_DEL, s, NULL);
            curl_multi_assign(g->multi, s, NULL);
        }
        return 0;
    }
    struct epoll_event ev = {
        .events = (what & CURL_POLL_IN ? EPOLLIN : 0u) | (what & CURL_POLL_OUT ? EPOLLOUT : 0u),
        .data.fd = s,
    };
    if (epoll_ctl(g->epfd, socketp ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, s, &ev) < 0) {
        cg_note_error(g, "epoll_ctl: %s", strerror(errno));
        return -1;
    }
    if (!socketp)
        curl_multi_assign(g->multi, s, g);
    return 0;
}

/* CURLMOPT_TIMERFUNCTION: only remember when curl wants to run. 0 means
 * "soon" (the loop handles it before sleeping again), -1 means no timer. */
static int cg_on_timer(CURLM *multi, long timeout_ms, void *userp)
{
    struct cg *g = userp;
    (void)multi;

    g->timer_at_ns =
        timeout_ms < 0 ? UINT64_MAX : mono_ns() + (uint64_t)timeout_ms * UINT64_C(1000000);
    return 0;
}

static size_t cg_on_write(char *data, size_t size, size_t nmemb, void *userp)
{
    struct cg_client *c = userp;
    size_t n = size * nmemb;

    if (c->t_first_ns == 0 && n > 0)
        c->t_first_ns = mono_ns();
    if (c->len + n > c->max) {
        c->too_big = true;
        return 0; /* CURLE_WRITE_ERROR */
    }
    if (c->len + n > c->cap) {
        size_t cap = c->cap ? c->cap : 4096;
        while (cap < c->len + n)
            cap *= 2;
        char *p = realloc(c->buf, cap);
        if (!p)
            return 0; /* CURLE_WRITE_ERROR */
        c->buf = p;
        c->cap = cap;
    }
    memcpy(c->buf + c->len, data, n);
    c->len += n;
    return n;
}

/* ------------------------------------------------------ JSON validator */

/* A strict RFC 8259 syntax check that builds nothing: the floor must
 * validate every body without paying for a DOM (jansson costs ~8 µs per
 * chat answer here, more than 10% of a libcurl round trip, and the sidecar's
 * own JSON decoding is part of what the benchmark measures, not the floor).
 * Nesting is bounded by CG_JSON_MAX_DEPTH. */
#define CG_JSON_MAX_DEPTH 64

struct jv {
    const unsigned char *p, *end;
};

static void jv_ws(struct jv *v)
{
    while (v->p < v->end && (*v->p == ' ' || *v->p == '\t' || *v->p == '\n' || *v->p == '\r'))
        v->p++;
}

static bool jv_lit(struct jv *v, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(v->end - v->p) < n || memcmp(v->p, lit, n) != 0)
        return false;
    v->p += n;
    return true;
}

static bool jv_is_hex(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static bool jv_string(struct jv *v)
{
    v->p++; /* the opening quote */
    while (v->p < v->end) {
        unsigned char c = *v->p++;
        if (c == '"')
            return true;
        if (c < 0x20)
            return false;
        if (c != '\\')
            continue;
        if (v->p >= v->end)
            return false;
        c = *v->p++;
        if (c == 'u') {
            for (int i = 0; i < 4; i++)
                if (v->p >= v->end || !jv_is_hex(*v->p++))
                    return false;
        } else if (!strchr("\"\\/bfnrt", c) || c == '\0') {
            return false;
        }
    }
    return false;
}

static bool jv_digits(struct jv *v)
{
    const unsigned char *start = v->p;
    while (v->p < v->end && *v->p >= '0' && *v->p <= '9')
        v->p++;
    return v->p > start;
}

static bool jv_number(struct jv *v)
{
    if (*v->p == '-')
        v->p++;
    if (v->p < v->end && *v->p == '0')
        v->p++;
    else if (!jv_digits(v))
        return false;
    if (v->p < v->end && *v->p == '.') {
        v->p++;
        if (!jv_digits(v))
            return false;
    }
    if (v->p < v->end && (*v->p == 'e' || *v->p == 'E')) {
        v->p++;
        if (v->p < v->end && (*v->p == '+' || *v->p == '-'))
            v->p++;
        if (!jv_digits(v))
            return false;
    }
    return true;
}

static bool jv_value(struct jv *v, int depth)
{
    jv_ws(v);
    if (v->p >= v->end)
        return false;
    switch (*v->p) {
    case '"':
        return jv_string(v);
    case 't':
        return jv_lit(v, "true");
    case 'f':
        return jv_lit(v, "false");
    case 'n':
        return jv_lit(v, "null");
    case '{':
    case '[': {
        unsigned char close = *v->p == '{' ? '}' : ']';
        bool obj = close == '}';
        if (depth >= CG_JSON_MAX_DEPTH)
            return false;
        v->p++;
        jv_ws(v);
        if (v->p < v->end && *v->p == close) {
            v->p++;
            return true;
        }
        for (;;) {
            if (obj) {
                jv_ws(v);
                if (v->p >= v->end || *v->p != '"' || !jv_string(v))
                    return false;
                jv_ws(v);
                if (v->p >= v->end || *v->p++ != ':')
                    return false;
            }
            if (!jv_value(v, depth + 1))
                return false;
            jv_ws(v);
            if (v->p >= v->end)
                return false;
            unsigned char c = *v->p++;
            if (c == close)
                return true;
            if (c != ',')
                return false;
        }
    }
    default:
        return jv_number(v);
    }
}

/* True when buf[0..len) is exactly one JSON object (whitespace around it
 * allowed). */
static bool cg_is_json_object(const char *buf, size_t len)
{
    struct jv v = { (const unsigned char *)buf, (const unsigned char *)buf + len };

    jv_ws(&v);
    if (v.p >= v.end || *v.p != '{' || !jv_value(&v, 0))
        return false;
    jv_ws(&v);
    return v.p == v.end;
}

/* --stream: an SSE body, its first event a `data:` line and its last one
 * `data: [DONE]` (the events between are the sidecar's to check, not the
 * floor's). */
static bool cg_is_sse_done(const char *buf, size_t len)
{
    static const char done[] = "data: [DONE]";
    size_t n = sizeof(done) - 1;

    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
        len--;
    return len >= n && !memcmp(buf, "data:", 5) && !memcmp(buf + len - n, done, n);
}

/* ------------------------------------------------------------ requests */

/* Hands out one request: from the warmup budget, or in the measured phase
 * while the deadline is ahead and the TOTAL budget lasts. */
static bool cg_may_issue(struct cg *g, uint64_t now)
{
    if (!g->measuring) {
        if (g->warm_left == 0)
            return false;
        g->warm_left--;
        return true;
    }
    if (now >= g->deadline_ns)
        return false;
    if (g->o->total && g->issued >= g->o->total)
        return false;
    g->issued++;
    return true;
}

static void cg_issue(struct cg *g, struct cg_client *c)
{
    uint64_t now = mono_ns();

    if (!cg_may_issue(g, now))
        return;
    c->len = 0;
    c->too_big = false;
    c->t_send_ns = now;
    c->t_first_ns = 0;
    CURLMcode mc = curl_multi_add_handle(g->multi, c->easy);
    if (mc != CURLM_OK) {
        g->cnt.err_transport++;
        cg_note_error(g, "curl_multi_add_handle: %s", curl_multi_strerror(mc));
        return;
    }
    c->busy = true;
    g->outstanding++;
    if (g->measuring)
        g->cnt.sent++;
}

/* Classifies one finished transfer and records it; `now` is the batch's
 * receive stamp. */
static void cg_on_done(struct cg *g, struct cg_client *c, CURLcode res, uint64_t now)
{
    long status = 0, conns = 0;

    curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(c->easy, CURLINFO_NUM_CONNECTS, &conns);
    if (g->measuring) {
        g->t_end_ns = now;
        g->cnt.new_conns += (uint64_t)conns;
    }
    if (res != CURLE_OK) {
        if (res == CURLE_OPERATION_TIMEDOUT) {
            g->cnt.err_timeout++;
            cg_note_error(g, "no response within %ld ms", g->o->timeout_ms);
        } else if (c->too_big) {
            g->cnt.err_body++;
            cg_note_error(g, "response body over %zu bytes", g->o->max_body_bytes);
        } else {
            g->cnt.err_transport++;
            cg_note_error(g, "transfer failed: %s", curl_easy_strerror(res));
        }
        return;
    }
    if (status != 200) {
        g->cnt.err_http++;
        cg_note_error(g, "HTTP status %ld: %.*s", status, (int)(c->len < 120 ? c->len : 120),
                      c->buf ? c->buf : "");
        return;
    }
    if (g->o->stream ? !cg_is_sse_done(c->buf, c->len) : !cg_is_json_object(c->buf, c->len)) {
        g->cnt.err_body++;
        cg_note_error(g, "response body is not %s (%zu bytes)",
                      g->o->stream ? "an SSE stream ending in data: [DONE]" : "a JSON object",
                      c->len);
        return;
    }
    g->cnt.ok++;
    g->cnt.resp_bytes += c->len;
    if (g->measuring) {
        hist_record(&g->hist, now > c->t_send_ns ? now - c->t_send_ns : 0);
        if (g->o->stream)
            hist_record(&g->ttft, c->t_first_ns > c->t_send_ns ? c->t_first_ns - c->t_send_ns : 0);
    }
}

/* Reads every finished transfer, records it and starts the client's next
 * request. Runs outside curl callbacks, so removing and re-adding handles
 * here is allowed. */
static void cg_drain(struct cg *g, uint64_t now)
{
    CURLMsg *msg;
    int left;

    while ((msg = curl_multi_info_read(g->multi, &left)) != NULL) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        CURL *e = msg->easy_handle;
        CURLcode res = msg->data.result;
        char *priv = NULL;
        curl_easy_getinfo(e, CURLINFO_PRIVATE, &priv);
        struct cg_client *c = (struct cg_client *)priv;
        curl_multi_remove_handle(g->multi, e);
        c->busy = false;
        g->outstanding--;
        cg_on_done(g, c, res, now);
        cg_issue(g, c);
    }
}

/* Runs curl's timer if it is due (the "0 = soon" case right after an
 * add_handle included), draining after each run. Bounded: curl never asks
 * for an immediate timeout forever, but the loop must not trust that. */
static void cg_run_timer(struct cg *g)
{
    int running;
    uint64_t now = mono_ns();

    for (int i = 0; i < 16 && g->timer_at_ns <= now; i++) {
        g->timer_at_ns = UINT64_MAX;
        curl_multi_socket_action(g->multi, CURL_SOCKET_TIMEOUT, 0, &running);
        /* A transfer started in this batch may complete inside this very
         * call (its answer was already there): stamp afresh. */
        now = mono_ns();
        cg_drain(g, now);
    }
}

/* One phase: issue until the budget or the deadline runs out, then let the
 * running transfers finish (each ends by its own CURLOPT_TIMEOUT_MS). */
static void cg_run_phase(struct cg *g)
{
    struct epoll_event evs[256];
    int running;

    for (unsigned i = 0; i < g->o->clients; i++)
        cg_issue(g, &g->clients[i]);
    cg_run_timer(g);
    while (g->outstanding > 0) {
        int wait_ms = CG_TICK_MS;
        if (g->timer_at_ns != UINT64_MAX) {
            uint64_t now = mono_ns();
            uint64_t d = g->timer_at_ns > now ? g->timer_at_ns - now : 0;
            /* Round up: waking before the timer is due would spin. */
            uint64_t ms = (d + 999999) / 1000000;
            if (ms < (uint64_t)wait_ms)
                wait_ms = (int)ms;
        }
        int n = epoll_wait(g->epfd, evs, (int)(sizeof(evs) / sizeof(evs[0])), wait_ms);
        uint64_t now = mono_ns();
        if (n < 0 && errno != EINTR) {
            cg_note_error(g, "epoll_wait: %s", strerror(errno));
            break;
        }
        for (int i = 0; i < n; i++) {
            int mask = 0;
            if (evs[i].events & EPOLLIN)
                mask |= CURL_CSELECT_IN;
            if (evs[i].events & EPOLLOUT)
                mask |= CURL_CSELECT_OUT;
            if (evs[i].events & (EPOLLERR | EPOLLHUP))
                mask |= CURL_CSELECT_ERR;
            curl_multi_socket_action(g->multi, evs[i].data.fd, mask, &running);
        }
        cg_drain(g, now);
        cg_run_timer(g);
    }
}

/* ------------------------------------------------------------- set-up */

static int cg_setup_client(struct cg *g, struct cg_client *c)
{
    CURL *e = c->easy = curl_easy_init();

    if (!e)
        return -1;
    c->max = g->o->max_body_bytes;
    /* The request the sidecar sends to the bench's plain-http mock, which
     * its own HTTP/1.1 client carries (sidecar/upstream/h1.c): the same head lines,
     * so no Accept-Encoding (libcurl's attempts would add one); keep-alive
     * as its pool does. */
    curl_easy_setopt(e, CURLOPT_URL, g->o->url);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, g->body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)g->body_len);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, g->headers);
    curl_easy_setopt(e, CURLOPT_PRIVATE, (char *)c);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, cg_on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, g->o->timeout_ms);
    curl_easy_setopt(e, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)g->o->max_body_bytes);
    return 0;
}

/* The request body: --body-json is re-serialised compactly with keys in
 * their original order (what the sidecar's msgpack -> JSON transcoder
 * produces); --body-file is sent byte for byte. Returns owned memory. */
static char *cg_load_body(const char *body_json, const char *body_file, size_t *len, char *err,
                          size_t errlen)
{
    if (body_file) {
        FILE *f = fopen(body_file, "rb");
        if (!f) {
            snprintf(err, errlen, "--body-file %s: %s", body_file, strerror(errno));
            return NULL;
        }
        char *p = NULL;
        size_t n = 0, cap = 0;
        for (;;) {
            if (n == cap) {
                cap = cap ? cap * 2 : 65536;
                char *q = cap <= (64u << 20) ? realloc(p, cap) : NULL;
                if (!q) {
                    snprintf(err, errlen, "--body-file %s: too large or out of memory", body_file);
                    free(p);
                    fclose(f);
                    return NULL;
                }
                p = q;
            }
            size_t r = fread(p + n, 1, cap - n, f);
            n += r;
            if (r == 0)
                break;
        }
        bool failed = ferror(f);
        fclose(f);
        if (failed) {
            snprintf(err, errlen, "--body-file %s: read error", body_file);
            free(p);
            return NULL;
        }
        *len = n;
        return p;
    }
    json_error_t je;
    json_t *j = json_loads(body_json ? body_json : CG_DEFAULT_BODY, 0, &je);
    if (!j) {
        snprintf(err, errlen, "--body-json: %s (column %d)", je.text, je.column);
        return NULL;
    }
    char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!s) {
        snprintf(err, errlen, "--body-json: cannot serialise");
        return NULL;
    }
    *len = strlen(s);
    return s;
}

/* ------------------------------------------------------------- report */

static void cg_report_json(FILE *f, const struct cg *g, double elapsed_s, double cpu_pct)
{
    const struct cg_opts *o = g->o;
    const struct cg_counts *c = &g->cnt;
    const struct bench_hist *h = &g->hist;

    fputs("{\"url\":", f);
    json_str(f, o->url);
    fprintf(f, ",\"clients\":%u,\"req_bytes\":%zu", o->clients, g->body_len);
    fprintf(f, ",\"total_limit\":%" PRIu64 ",\"duration_limit_s\":%.3f,\"warmup\":%" PRIu64,
            o->total, o->duration_s, o->warmup);
    fprintf(f, ",\"elapsed_s\":%.6f,\"sent\":%" PRIu64 ",\"ok\":%" PRIu64 ",\"errors\":%" PRIu64,
            elapsed_s, c->sent, c->ok, cg_errors(c));
    fprintf(f,
            ",\"err_transport\":%" PRIu64 ",\"err_timeout\":%" PRIu64 ",\"err_http\":%" PRIu64
            ",\"err_body\":%" PRIu64 ",\"warmup_errors\":%" PRIu64 ",\"new_connections\":%" PRIu64,
            c->err_transport, c->err_timeout, c->err_http, c->err_body, g->warm_errors,
            c->new_conns);
    bench_report_json_perf(f, h, c->ok, c->resp_bytes, elapsed_s, cpu_pct);
    bench_report_json_ttft(f, &g->ttft);
    fputs(",\"first_error\":", f);
    json_str(f, g->first_error);
    fputs("}\n", f);
}

static void cg_report_text(FILE *f, const struct cg *g, double elapsed_s, double cpu_pct)
{
    const struct cg_counts *c = &g->cnt;
    const struct bench_hist *h = &g->hist;

    fprintf(f, "curlgen: POST %s clients=%u body=%zu bytes\n", g->o->url, g->o->clients,
            g->body_len);
    fprintf(f,
            "  requests   %" PRIu64 " sent, %" PRIu64 " ok, %" PRIu64 " errors"
            " (transport %" PRIu64 ", timeout %" PRIu64 ", http %" PRIu64 ", body %" PRIu64
            "; warmup %" PRIu64 ")\n",
            c->sent, c->ok, cg_errors(c), c->err_transport, c->err_timeout, c->err_http,
            c->err_body, g->warm_errors);
    if (g->first_error[0])
        fprintf(f, "  first err  %s\n", g->first_error);
    bench_report_text_perf(f, h, c->ok, elapsed_s);
    bench_report_text_ttft(f, &g->ttft);
    fprintf(f, "  response   %.1f body bytes on average\n",
            c->ok ? (double)c->resp_bytes / (double)c->ok : 0.0);
    fprintf(f, "  conns      %" PRIu64 " opened while measuring (0 = every request reused one)\n",
            c->new_conns);
    fprintf(f, "  curlgen    %.0f%% CPU (near 100: the generator is the bottleneck)\n", cpu_pct);
}

/* --------------------------------------------------------------- main */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: curlgen --url URL [options]\n"
            "  --clients N          concurrent clients, one transfer each (default 1, max %d)\n"
            "  --requests TOTAL     stop after TOTAL measured requests\n"
            "  --duration S         stop after S seconds (default %.0f when --requests is not\n"
            "                       given; always capped at %d)\n"
            "  --body-json JSON     request body; re-serialised compactly, key order kept\n"
            "                       (default: a two-message chat request)\n"
            "  --body-file FILE     request body sent byte for byte\n"
            "  --warmup N           untimed requests before measuring (default 0)\n"
            "  --timeout-ms MS      per-request timeout, counted as an error (default 10000)\n"
            "  --max-body-bytes B   largest response body accepted (default 16777216)\n"
            "  --stream             expect an SSE answer (put \"stream\":true in the body);\n"
            "                       also reports the time to its first byte (ttft_*)\n"
            "  --json               one-line JSON result instead of text\n"
            "Every request: POST URL, Content-Type/Accept: application/json, keep-alive.\n"
            "exit: 0 all ok, 1 errors or nothing completed, 2 usage/set-up, 3 hard cap hit\n",
            CG_MAX_CLIENTS, CG_DEFAULT_DURATION_S, CG_HARD_CAP_S);
}

int main(int argc, char **argv)
{
    struct cg_opts o = { .max_body_bytes = 16u << 20 };
    const char *body_json = NULL, *body_file = NULL;
    struct bench_opts b;
    char err[256];

    bench_opts_init(&b);
    for (int i = 1; i < argc; i++) {
        /* The one option without a value: before the common parser, which
         * wants one after every option it does not know. */
        if (!strcmp(argv[i], "--stream")) {
            o.stream = true;
            continue;
        }
        int r = bench_opts_parse(&b, "curlgen", argc, argv, &i, CG_MAX_CLIENTS, CG_HARD_CAP_S);
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

        if (!strcmp(a, "--url")) {
            o.url = v;
        } else if (!strcmp(a, "--body-json")) {
            body_json = v;
        } else if (!strcmp(a, "--body-file")) {
            body_file = v;
        } else if (!strcmp(a, "--max-body-bytes")) {
            bad = parse_u64(v, 64, UINT64_C(1) << 30, &u);
            o.max_body_bytes = (size_t)u;
        } else {
            fprintf(stderr, "curlgen: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "curlgen: bad or missing value for %s\n", a);
            return 2;
        }
        i++;
    }
    if (!o.url) {
        usage(stderr);
        return 2;
    }
    if (body_json && body_file) {
        fprintf(stderr, "curlgen: --body-json and --body-file are exclusive\n");
        return 2;
    }
    bench_opts_finish(&b, "curlgen", CG_DEFAULT_DURATION_S, CG_HARD_CAP_S);
    o.clients = b.clients;
    o.total = b.total;
    o.duration_s = b.duration_s;
    o.warmup = b.warmup;
    o.timeout_ms = (long)b.timeout_ms;
    o.json = b.json;

    bench_arm_hard_cap("curlgen: hard time cap reached, aborting\n", o.duration_s, b.timeout_ms);

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "curlgen: curl_global_init failed\n");
        return 2;
    }
    int rc = 2;
    struct cg *g = calloc(1, sizeof(*g));
    char *body = NULL;
    if (!g) {
        fprintf(stderr, "curlgen: out of memory\n");
        goto out;
    }
    g->o = &o;
    g->epfd = -1;
    g->timer_at_ns = UINT64_MAX;
    g->warm_left = o.warmup;
    body = cg_load_body(body_json, body_file, &g->body_len, err, sizeof(err));
    if (!body) {
        fprintf(stderr, "curlgen: %s\n", err);
        goto out;
    }
    g->body = body;
    g->epfd = epoll_create1(EPOLL_CLOEXEC);
    g->multi = curl_multi_init();
    g->clients = calloc(o.clients, sizeof(*g->clients));
    /* The sidecar's headers for a call, in its order. */
    const char *const hdrs[] = { "Content-Type: application/json",
                                 o.stream ? "Accept: text/event-stream"
                                          : "Accept: application/json",
                                 "Expect:" };
    bool hdr_ok = true;
    for (size_t i = 0; hdr_ok && i < sizeof(hdrs) / sizeof(hdrs[0]); i++) {
        struct curl_slist *h = curl_slist_append(g->headers, hdrs[i]);
        if (h)
            g->headers = h;
        hdr_ok = h != NULL;
    }
    if (g->epfd < 0 || !g->multi || !g->clients || !hdr_ok) {
        fprintf(stderr, "curlgen: set-up failed (epoll, curl multi or memory)\n");
        goto out;
    }
    curl_multi_setopt(g->multi, CURLMOPT_SOCKETFUNCTION, cg_on_socket);
    curl_multi_setopt(g->multi, CURLMOPT_SOCKETDATA, g);
    curl_multi_setopt(g->multi, CURLMOPT_TIMERFUNCTION, cg_on_timer);
    curl_multi_setopt(g->multi, CURLMOPT_TIMERDATA, g);
    curl_multi_setopt(g->multi, CURLMOPT_MAXCONNECTS, (long)o.clients);
    for (unsigned i = 0; i < o.clients; i++) {
        if (cg_setup_client(g, &g->clients[i]) < 0) {
            fprintf(stderr, "curlgen: curl_easy_init failed\n");
            goto out;
        }
    }

    if (o.warmup > 0) {
        g->measuring = false;
        cg_run_phase(g);
        g->warm_errors = cg_errors(&g->cnt);
        memset(&g->cnt, 0, sizeof(g->cnt));
    }
    g->measuring = true;
    uint64_t cpu0 = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
    g->t0_ns = g->t_end_ns = mono_ns();
    g->deadline_ns = g->t0_ns + (uint64_t)(o.duration_s * 1e9);
    cg_run_phase(g);
    if (g->t_end_ns == g->t0_ns)
        g->t_end_ns = mono_ns();
    double elapsed_s = (double)(g->t_end_ns - g->t0_ns) / 1e9;
    double cpu_pct = elapsed_s > 0
        ? (double)(clock_ns(CLOCK_PROCESS_CPUTIME_ID) - cpu0) / 1e9 / elapsed_s * 100.0
        : 0.0;
    if (o.json)
        cg_report_json(stdout, g, elapsed_s, cpu_pct);
    else
        cg_report_text(stdout, g, elapsed_s, cpu_pct);
    rc = (cg_errors(&g->cnt) == 0 && g->warm_errors == 0 && g->cnt.ok > 0) ? 0 : 1;

out:
    if (g) {
        for (unsigned i = 0; g->clients && i < o.clients; i++) {
            struct cg_client *c = &g->clients[i];
            if (c->easy) {
                if (c->busy)
                    curl_multi_remove_handle(g->multi, c->easy);
                curl_easy_cleanup(c->easy);
            }
            free(c->buf);
        }
        if (g->multi)
            curl_multi_cleanup(g->multi);
        if (g->epfd >= 0)
            close(g->epfd);
        curl_slist_free_all(g->headers);
        free(g->clients);
        free(g);
    }
    free(body);
    curl_global_cleanup();
    return rc;
}
