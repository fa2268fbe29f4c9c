/*
 * conn.c — one client connection of the mock upstream.
 *
 * State machine (c->state):
 *
 *   accept ──(accept-hang scripted)──▶ PEEK ──(/_mock/ request or no longer
 *     │                                  │       scripted)──▶ READ
 *     │                                  └──(API request)──▶ HANG_ACCEPT
 *     ▼
 *   READ ──request complete──▶ dispatch ──▶ DELAY ──delay_ms──▶ SEND
 *     ▲                            │  └──────────────────────▶ SEND
 *     │                            └──(hang before_headers)──▶ HANG
 *     │                  SEND ──head written, hang after_headers──▶ HANG
 *     │                  SEND ──close_after_bytes reached──▶ CLOSED
 *     └──answer written, keep-alive── SEND ──Connection: close──▶ CLOSED
 *                                           └──(after a framing error)──▶ LINGER
 *   any state ──peer EOF/RST, write error──▶ CLOSED (closed_by_peer)
 *   HANG, HANG_ACCEPT ──hang_ms──▶ CLOSED
 *
 * Reading goes on while an answer is delayed or sent, so that a client that
 * gives up is seen at once (closed_by_peer / aborted_by_peer) rather than at
 * the next write; read-ahead beyond MOCK_PIPELINE_BYTES pauses reading.
 * HANG_ACCEPT never reads (the request stays in the kernel, as with a
 * listener that accepted and stalled) and polls for POLLRDHUP instead.
 *
 * The writer (conn_flush) sends head bytes freely and body bytes within two
 * limits: the trickle budget (refilled by trickle_w) and close_after_bytes.
 * "Body bytes" are the bytes after the header block as sent on the wire,
 * chunked framing included.
 *
 * A closed connection is only unlinked and has its fd closed; the memory is
 * freed by main.c's ev_prepare reaper, never under one of its own callbacks.
 */
#include "internal.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

enum { CH_SIZE, CH_DATA, CH_DATA_END, CH_TRAILER, CH_DONE };

#define HUP_POLL_S     0.02 /* HANG_ACCEPT: how often to look for the peer's close */
#define PEEK_RETRY_S   0.005
#define PEEK_MAX_TRIES 100
#define LINGER_S       1.0

static void conn_on_read(struct ev_loop *loop, ev_io *w, int revents);
static void conn_on_write(struct ev_loop *loop, ev_io *w, int revents);
static void conn_on_step(struct ev_loop *loop, ev_timer *w, int revents);
static void conn_on_trickle(struct ev_loop *loop, ev_timer *w, int revents);
static void conn_on_deadline(struct ev_loop *loop, ev_timer *w, int revents);
static void conn_drive(struct conn *c);
static void conn_read(struct conn *c);
static int conn_flush(struct conn *c);

static void timer_arm(struct conn *c, ev_timer *w, double after, double repeat)
{
    ev_timer_stop(c->m->loop, w);
    ev_timer_set(w, after, repeat);
    ev_timer_start(c->m->loop, w);
}

static void conn_reset_request(struct conn *c)
{
    c->scan = 0;
    c->head_len = 0;
    c->meth_off = c->meth_len = c->target_off = c->target_len = 0;
    c->minor = 1;
    c->content_length = -1;
    c->chunked = c->expect_continue = c->sent_continue = false;
    c->req_keep_alive = true;
    c->cpos = c->crem = 0;
    c->cstate = CH_SIZE;
    buf_trim(&c->cbody, 1u << 20);
}

void conn_new(struct mock *m, int fd)
{
    struct conn *c = mock_xrealloc(NULL, sizeof *c);
    memset(c, 0, sizeof *c);
    c->m = m;
    c->fd = fd;
    ev_io_init(&c->rw, conn_on_read, fd, EV_READ);
    ev_io_init(&c->ww, conn_on_write, fd, EV_WRITE);
    ev_init(&c->step_w, conn_on_step);
    ev_init(&c->trickle_w, conn_on_trickle);
    ev_init(&c->deadline_w, conn_on_deadline);
    c->rw.data = c->ww.data = c->step_w.data = c->trickle_w.data = c->deadline_w.data = c;
    behave_init(&c->b);
    conn_reset_request(c);
    c->next = m->conns;
    if (m->conns)
        m->conns->prev = c;
    m->conns = c;
    m->st.tcp_accepted++;
    m->st.tcp_open++;
    c->state = behave_accept_pending(m) ? CONN_PEEK : CONN_READ;
    ev_io_start(m->loop, &c->rw);
}

static void conn_release_answer(struct conn *c)
{
    json_decref(c->beh_json);
    json_decref(c->req_json);
    c->beh_json = c->req_json = NULL;
    behave_init(&c->b);
    memset(&c->st, 0, sizeof c->st);
    c->req_id = 0;
}

void conn_close(struct conn *c, bool by_peer)
{
    struct mock *m = c->m;
    if (c->state == CONN_CLOSED)
        return;
    ev_io_stop(m->loop, &c->rw);
    ev_io_stop(m->loop, &c->ww);
    ev_timer_stop(m->loop, &c->step_w);
    ev_timer_stop(m->loop, &c->trickle_w);
    ev_timer_stop(m->loop, &c->deadline_w);
    close(c->fd);
    c->fd = -1;
    if (c->is_api) {
        m->st.open--;
        m->st.closed++;
        if (by_peer) {
            m->st.closed_by_peer++;
            if (c->in_progress) {
                m->st.aborted_by_peer++;
                m->st.last_abort_s = ev_time();
            }
        }
    }
    if (c->in_progress) {
        m->st.in_progress--;
        c->in_progress = false;
    }
    m->st.tcp_open--;
    conn_release_answer(c);
    /* unlink from the live list, push on the dead list */
    if (c->prev)
        c->prev->next = c->next;
    else
        m->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = NULL;
    c->next = m->dead;
    m->dead = c;
    c->state = CONN_CLOSED;
}

void conn_free(struct conn *c)
{
    buf_fini(&c->in);
    buf_fini(&c->cbody);
    buf_fini(&c->out);
    buf_fini(&c->repeated);
    free(c);
}

void conn_mark_api(struct conn *c)
{
    if (c->is_api)
        return;
    c->is_api = true;
    c->m->st.accepted++;
    c->m->st.open++;
}

/* ------------------------------------------------------------- parsing */

static bool has_word_ci(const char *v, size_t vl, const char *word)
{
    size_t wl = strlen(word);
    for (size_t i = 0; i + wl <= vl; i++)
        if (!strncasecmp(v + i, word, wl))
            return true;
    return false;
}

/* Returns 1 when the head is complete and parsed, 0 when more bytes are
 * needed, or an HTTP error status. */
static int conn_parse_head(struct conn *c)
{
    const char *p = c->in.p;
    size_t n = c->in.len;
    size_t from = c->scan > 3 ? c->scan - 3 : 0;
    const char *e = n > from ? memmem(p + from, n - from, "\r\n\r\n", 4) : NULL;
    if (!e) {
        c->scan = n;
        return n > MOCK_MAX_HEAD_BYTES ? 431 : 0;
    }
    size_t hl = (size_t)(e - p) + 4;
    if (hl > MOCK_MAX_HEAD_BYTES)
        return 431;

    /* request line */
    const char *eol = memchr(p, '\r', hl);
    if (eol[1] != '\n')
        return 400;
    const char *sp1 = memchr(p, ' ', (size_t)(eol - p));
    if (!sp1 || sp1 == p || sp1 - p > 16)
        return 400;
    for (const char *q = p; q < sp1; q++)
        if (*q < 'A' || *q > 'Z')
            return 400;
    const char *t = sp1 + 1;
    const char *sp2 = memchr(t, ' ', (size_t)(eol - t));
    if (!sp2 || sp2 == t)
        return 400;
    if (eol - sp2 != 9 || memcmp(sp2 + 1, "HTTP/1.", 7))
        return eol - sp2 > 6 && !memcmp(sp2 + 1, "HTTP/", 5) ? 505 : 400;
    if (sp2[8] != '0' && sp2[8] != '1')
        return 505;
    c->minor = sp2[8] - '0';
    c->meth_off = 0;
    c->meth_len = (size_t)(sp1 - p);
    c->target_off = (size_t)(t - p);
    c->target_len = (size_t)(sp2 - t);

    /* header fields */
    bool want_close = false, want_keep = false;
    const char *line = eol + 2;
    const char *end = p + hl - 2; /* the final CRLF */
    while (line < end) {
        const char *le = memchr(line, '\r', (size_t)(end + 2 - line));
        if (le[1] != '\n')
            return 400; /* bare CR */
        if (*line == ' ' || *line == '\t')
            return 400; /* obsolete line folding */
        const char *colon = memchr(line, ':', (size_t)(le - line));
        if (!colon || colon == line)
            return 400;
        size_t nl = (size_t)(colon - line);
        const char *v = colon + 1, *ve = le;
        while (v < ve && (*v == ' ' || *v == '\t'))
            v++;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        size_t vl = (size_t)(ve - v);
        if (nl == 14 && !strncasecmp(line, "content-length", 14)) {
            long long val = 0;
            if (!vl)
                return 400;
            for (size_t i = 0; i < vl; i++) {
                if (v[i] < '0' || v[i] > '9')
                    return 400;
                if (val > (long long)MOCK_MAX_BODY_BYTES)
                    return 413;
                val = val * 10 + (v[i] - '0');
            }
            if (c->content_length >= 0 && c->content_length != val)
                return 400;
            c->content_length = val;
        } else if (nl == 17 && !strncasecmp(line, "transfer-encoding", 17)) {
            if (vl >= 7 && !strncasecmp(ve - 7, "chunked", 7))
                c->chunked = true;
            else if (vl)
                return 501;
        } else if (nl == 10 && !strncasecmp(line, "connection", 10)) {
            want_close |= has_word_ci(v, vl, "close");
            want_keep |= has_word_ci(v, vl, "keep-alive");
        } else if (nl == 6 && !strncasecmp(line, "expect", 6)) {
            if (vl == 12 && !strncasecmp(v, "100-continue", 12))
                c->expect_continue = true;
        }
        line = le + 2;
    }
    if (c->chunked)
        c->content_length = -1; /* RFC 9112 6.3: chunked wins */
    if (c->content_length > (long long)MOCK_MAX_BODY_BYTES)
        return 413;
    c->req_keep_alive = c->minor == 1 ? !want_close : (want_keep && !want_close);
    c->head_len = hl;
    c->cpos = hl;
    return 1;
}

/* Returns 1 when the body is complete (*total = request bytes incl. head),
 * 0 when more bytes are needed, or an HTTP error status. Chunked bodies are
 * decoded incrementally into c->cbody. */
static int conn_parse_body(struct conn *c, size_t *total)
{
    if (!c->chunked) {
        size_t cl = c->content_length > 0 ? (size_t)c->content_length : 0;
        if (c->in.len - c->head_len < cl)
            return 0;
        *total = c->head_len + cl;
        return 1;
    }
    const char *p = c->in.p;
    size_t n = c->in.len;
    if (n > c->head_len + 2 * (size_t)MOCK_MAX_BODY_BYTES)
        return 413; /* absurd framing overhead */
    for (;;) {
        switch (c->cstate) {
        case CH_SIZE: {
            const char *le = n > c->cpos ? memmem(p + c->cpos, n - c->cpos, "\r\n", 2) : NULL;
            if (!le)
                return n - c->cpos > 1024 ? 400 : 0;
            size_t sz = 0;
            int digits = 0;
            const char *q = p + c->cpos;
            for (; q < le; q++, digits++) {
                int d = buf_hexval(*q);
                if (d < 0)
                    break;
                if (sz > MOCK_MAX_BODY_BYTES)
                    return 413;
                sz = sz * 16 + (size_t)d;
            }
            if (!digits || (q < le && *q != ';' && *q != ' ' && *q != '\t'))
                return 400;
            c->cpos = (size_t)(le - p) + 2;
            if (sz == 0) {
                c->cstate = CH_TRAILER;
                break;
            }
            if (c->cbody.len + sz > MOCK_MAX_BODY_BYTES)
                return 413;
            c->crem = sz;
            c->cstate = CH_DATA;
            break;
        }
        case CH_DATA: {
            size_t avail = n - c->cpos;
            if (!avail)
                return 0;
            size_t take = avail < c->crem ? avail : c->crem;
            buf_add(&c->cbody, p + c->cpos, take);
            c->cpos += take;
            c->crem -= take;
            if (c->crem)
                return 0;
            c->cstate = CH_DATA_END;
            break;
        }
        case CH_DATA_END:
            if (n - c->cpos < 2)
                return 0;
            if (p[c->cpos] != '\r' || p[c->cpos + 1] != '\n')
                return 400;
            c->cpos += 2;
            c->cstate = CH_SIZE;
            break;
        case CH_TRAILER: {
            const char *le = n > c->cpos ? memmem(p + c->cpos, n - c->cpos, "\r\n", 2) : NULL;
            if (!le)
                return n - c->cpos > MOCK_MAX_HEAD_BYTES ? 431 : 0;
            size_t ll = (size_t)(le - (p + c->cpos));
            c->cpos += ll + 2;
            if (ll == 0)
                c->cstate = CH_DONE;
            break;
        }
        default: /* CH_DONE */
            *total = c->cpos;
            return 1;
        }
    }
}

static void conn_consume(struct conn *c, size_t n)
{
    if (n >= c->in.len) {
        c->in.len = 0;
        buf_trim(&c->in, 1u << 20);
        return;
    }
    memmove(c->in.p, c->in.p + n, c->in.len - n);
    c->in.len -= n;
}

static bool ends_with(const char *s, size_t n, const char *suffix)
{
    size_t sl = strlen(suffix);
    return n >= sl && !memcmp(s + n - sl, suffix, sl);
}

/* A request that cannot be framed: answer and close (lingering, so that the
 * unread rest of the request does not turn our FIN into an RST that would
 * destroy the answer). */
static void conn_fail(struct conn *c, int status)
{
    c->req_keep_alive = false;
    c->linger = true;
    reply_error(c, status,
                status == 413 || status == 431 ? "request_too_large" : "invalid_request_error",
                status == 431       ? "mock: request head too large"
                    : status == 413 ? "mock: request body too large"
                    : status == 501 ? "mock: unsupported transfer-encoding"
                    : status == 505 ? "mock: unsupported HTTP version"
                                    : "mock: malformed request");
}

static void conn_dispatch(struct conn *c, const char *body, size_t blen)
{
    struct mock *m = c->m;
    const char *p = c->in.p;
    const char *meth = p + c->meth_off;
    size_t mlen = c->meth_len;
    const char *target = p + c->target_off;
    size_t tlen = c->target_len;

    if (tlen > 7 && !strncasecmp(target, "http://", 7)) { /* absolute-form */
        const char *s = memchr(target + 7, '/', tlen - 7);
        if (s) {
            tlen -= (size_t)(s - target);
            target = s;
        } else {
            target = "/";
            tlen = 1;
        }
    }
    const char *q = memchr(target, '?', tlen);
    size_t plen = q ? (size_t)(q - target) : tlen;

    if (plen >= 7 && !memcmp(target, "/_mock/", 7)) {
        m->st.control_requests++;
        control_handle(c, meth, mlen, target, plen, body, blen);
        return;
    }

    m->st.requests++;
    c->req_id = ++m->next_id;
    conn_mark_api(c);
    c->in_progress = true;
    m->st.in_progress++;
    control_count_path(m, target, plen);
    control_record(m, p, c->head_len, body, blen);

    for (size_t i = 0; i + 11 < plen; i++) {
        if (!memcmp(target + i, "/responses/", 11)) {
            const char *id = target + i + 11;
            const char *slash = memchr(id, '/', plen - (i + 11));
            size_t idlen = slash ? (size_t)(slash - id) : plen - (i + 11);
            size_t rlen = plen - (i + 11) - idlen;
            /* A streamed retrieve: the SDKs ask for stream=true as a
             * query parameter (OpenAI sends no other value). */
            bool stream = q && rlen == 0 && mlen == 3 && !memcmp(meth, "GET", 3) &&
                (memmem(q, tlen - plen, "?stream=true", 12) ||
                 memmem(q, tlen - plen, "&stream=true", 12));
            if (stream)
                reply_responses_resume(c, id, idlen, q + 1, tlen - plen - 1);
            else
                reply_responses_followup(c, meth, mlen, id, idlen, id + idlen, rlen);
            return;
        }
    }
    enum mock_endpoint ep;
    if (ends_with(target, plen, "/chat/completions"))
        ep = EP_CHAT;
    else if (ends_with(target, plen, "/embeddings"))
        ep = EP_EMBEDDINGS;
    else if (ends_with(target, plen, "/ocr"))
        ep = EP_OCR;
    else if (ends_with(target, plen, "/messages"))
        ep = EP_MESSAGES;
    else if (ends_with(target, plen, "/responses"))
        ep = EP_RESPONSES;
    else if (ends_with(target, plen, ":rawPredict") || ends_with(target, plen, ":streamRawPredict"))
        ep = EP_MESSAGES; /* Anthropic's Messages on Vertex AI ("stream" in the body) */
    else if (ends_with(target, plen, ":generateContent"))
        ep = EP_GEMINI;
    else if (ends_with(target, plen, ":streamGenerateContent"))
        ep = EP_GEMINI_STREAM;
    else if (ends_with(target, plen, ":countTokens") ||
             ends_with(target, plen, "/messages/count_tokens"))
        ep = EP_COUNT_TOKENS;
    else {
        reply_error(c, 404, "not_found_error", "mock: unknown path");
        return;
    }
    if (mlen != 4 || memcmp(meth, "POST", 4)) {
        reply_error(c, 405, "invalid_request_error", "mock: use POST");
        return;
    }
    reply_api(c, ep, body, blen);
}

/* Parses and answers requests while the connection is in READ state; an
 * answer that completes synchronously (the fast path) returns to READ and
 * the next pipelined request is handled in the same loop. */
static void conn_drive(struct conn *c)
{
    while (c->state == CONN_READ) {
        int r;
        if (!c->head_len) {
            size_t skip = 0; /* stray CRLFs between requests */
            while (skip < c->in.len && (c->in.p[skip] == '\r' || c->in.p[skip] == '\n'))
                skip++;
            if (skip)
                conn_consume(c, skip);
            if (!c->in.len)
                return;
            r = conn_parse_head(c);
            if (r == 0)
                return;
            if (r != 1) {
                conn_fail(c, r);
                return;
            }
            size_t need = c->head_len + (size_t)(c->content_length > 0 ? c->content_length : 0);
            if (need > c->in.len)
                buf_reserve(&c->in, need - c->in.len);
        }
        size_t total = 0;
        r = conn_parse_body(c, &total);
        if (r == 0) {
            if (c->expect_continue && !c->sent_continue && c->minor == 1) {
                static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
                c->sent_continue = true;
                buf_add(&c->out, cont, sizeof cont - 1);
                c->head_left += sizeof cont - 1;
                conn_flush(c);
            }
            return;
        }
        if (r != 1) {
            conn_fail(c, r);
            return;
        }
        if (c->chunked)
            conn_dispatch(c, c->cbody.p ? c->cbody.p : "", c->cbody.len);
        else
            conn_dispatch(c, c->in.p + c->head_len, total - c->head_len);
        if (c->state == CONN_CLOSED)
            return;
        conn_consume(c, total);
        conn_reset_request(c);
    }
}

/* ------------------------------------------------------------- answering */

static void conn_response_done(struct conn *c)
{
    struct mock *m = c->m;
    c->resp_active = false;
    ev_timer_stop(m->loop, &c->step_w);
    ev_timer_stop(m->loop, &c->trickle_w);
    ev_timer_stop(m->loop, &c->deadline_w);
    ev_io_stop(m->loop, &c->ww);
    if (c->in_progress) {
        m->st.in_progress--;
        c->in_progress = false;
    }
    conn_release_answer(c);
    c->out_off = 0;
    c->head_left = 0;
    buf_trim(&c->out, 1u << 20);
    if (!c->keep_alive) {
        if (c->linger && shutdown(c->fd, SHUT_WR) == 0) {
            c->state = CONN_LINGER;
            timer_arm(c, &c->deadline_w, LINGER_S, 0.);
            if (!ev_is_active(&c->rw))
                ev_io_start(m->loop, &c->rw);
            return;
        }
        conn_close(c, false);
        return;
    }
    c->state = CONN_READ;
    if (c->reading_paused) {
        c->reading_paused = false;
        ev_io_start(m->loop, &c->rw);
    }
}

static void conn_enter_hang(struct conn *c)
{
    struct mock *m = c->m;
    c->state = CONN_HANG;
    ev_timer_stop(m->loop, &c->step_w);
    ev_timer_stop(m->loop, &c->trickle_w);
    ev_io_stop(m->loop, &c->ww);
    c->out.len = c->out_off = 0;
    c->head_left = 0;
    if (c->b.hang_ms > 0)
        timer_arm(c, &c->deadline_w, (double)c->b.hang_ms / 1000.0, 0.);
    if (c->reading_paused || !ev_is_active(&c->rw)) {
        c->reading_paused = false;
        ev_io_start(m->loop, &c->rw);
    }
}

void conn_hang(struct conn *c)
{
    c->resp_active = true;
    conn_enter_hang(c);
}

/* Writes what the pacing rules allow, then applies the transitions that
 * depend on progress (head written, close_after_bytes, answer complete).
 * Returns -1 when c was closed. */
static int conn_flush(struct conn *c)
{
    bool blocked = false;
    /* trickle_headers: the head draws on the same budget as the body. */
    bool paced_head =
        c->resp_active && c->b.trickle_headers && c->b.hang != BEHAVE_HANG_AFTER_HEADERS;
    for (;;) {
        size_t avail = c->out.len - c->out_off;
        size_t n = c->head_left < avail ? c->head_left : avail;
        if (paced_head && n > c->body_budget)
            n = c->body_budget;
        if (avail > n && c->resp_active && n == c->head_left) {
            size_t allow = avail - n;
            size_t budget = paced_head ? c->body_budget - n : c->body_budget;
            if (allow > budget)
                allow = budget;
            if (c->b.close_after_bytes >= 0) {
                unsigned long long cap = (unsigned long long)c->b.close_after_bytes;
                unsigned long long left = cap > c->body_written ? cap - c->body_written : 0;
                if (allow > left)
                    allow = (size_t)left;
            }
            n += allow;
        }
        if (n == 0)
            break;
        ssize_t w = send(c->fd, c->out.p + c->out_off, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                blocked = true;
                break;
            }
            conn_close(c, true); /* EPIPE, ECONNRESET: the client went away */
            return -1;
        }
        size_t hw = (size_t)w < c->head_left ? (size_t)w : c->head_left;
        size_t bw = (size_t)w - hw;
        c->head_left -= hw;
        c->body_written += bw;
        if (c->body_budget != SIZE_MAX)
            c->body_budget -= paced_head ? (size_t)w : bw;
        c->out_off += (size_t)w;
        if ((size_t)w < n) {
            blocked = true;
            break;
        }
    }
    if (blocked) {
        if (!ev_is_active(&c->ww))
            ev_io_start(c->m->loop, &c->ww);
    } else if (ev_is_active(&c->ww)) {
        ev_io_stop(c->m->loop, &c->ww);
    }
    if (c->out_off == c->out.len)
        c->out.len = c->out_off = 0;
    if (!c->resp_active || c->state != CONN_SEND)
        return 0;
    if (!c->head_done && c->head_left == 0) {
        c->head_done = true;
        if (c->b.hang == BEHAVE_HANG_AFTER_HEADERS) {
            conn_enter_hang(c);
            return 0;
        }
    }
    if (c->head_done && c->b.close_after_bytes >= 0 &&
        c->body_written >= (unsigned long long)c->b.close_after_bytes) {
        conn_close(c, false);
        return -1;
    }
    if (c->out.len == 0 && !(c->st.active && !c->st.done)) {
        conn_response_done(c);
        if (c->state == CONN_CLOSED)
            return -1;
    }
    return 0;
}

static void conn_begin_send(struct conn *c)
{
    struct mock *m = c->m;
    c->state = CONN_SEND;
    if (c->in_progress && c->status > 0 && c->status < MOCK_MAX_STATUS)
        m->by_status[c->status]++;
    c->body_budget = SIZE_MAX;
    if (c->b.hang == BEHAVE_HANG_AFTER_HEADERS) {
        c->body_budget = 0;
    } else if (c->b.trickle_ms > 0) {
        double iv = (double)c->b.trickle_ms / 1000.0;
        c->body_budget = (size_t)c->b.trickle_bytes;
        timer_arm(c, &c->trickle_w, iv, iv);
    }
    if (c->st.active && c->b.hang != BEHAVE_HANG_AFTER_HEADERS) {
        reply_stream_fill(c, c->st.interval_ms <= 0);
        if (!c->st.done) {
            double iv = (double)c->st.interval_ms / 1000.0;
            timer_arm(c, &c->step_w, iv, iv);
        }
    }
    conn_flush(c);
}

void conn_start_response(struct conn *c)
{
    c->resp_active = true;
    c->head_done = false;
    c->body_written = 0;
    if (c->b.delay_ms > 0) {
        c->state = CONN_DELAY;
        timer_arm(c, &c->step_w, (double)c->b.delay_ms / 1000.0, 0.);
        return;
    }
    conn_begin_send(c);
}

/* ------------------------------------------------------------- callbacks */

/* HANG / LINGER: read and drop, only to notice the peer's close. */
static void conn_discard(struct conn *c)
{
    char junk[4096];
    for (int i = 0; i < 16; i++) {
        ssize_t r = recv(c->fd, junk, sizeof junk, 0);
        if (r > 0)
            continue;
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        conn_close(c, c->state != CONN_LINGER);
        return;
    }
}

/* PEEK: decide from the request line, without consuming it, whether this
 * connection is the scripted accept-hang or a control request. */
static void conn_peek(struct conn *c)
{
    struct mock *m = c->m;
    char pb[512];
    ssize_t r = recv(c->fd, pb, sizeof pb, MSG_PEEK);
    if (r == 0) {
        conn_close(c, true);
        return;
    }
    if (r < 0) {
        if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
            conn_close(c, true);
        return;
    }
    const char *sp = memchr(pb, ' ', (size_t)r);
    size_t rest = sp ? (size_t)(pb + r - (sp + 1)) : 0;
    if (!memchr(pb, '\n', (size_t)r) && (size_t)r < sizeof pb && c->peek_tries < PEEK_MAX_TRIES) {
        c->peek_tries++; /* wait for the whole request line: look again soon */
        ev_io_stop(m->loop, &c->rw);
        timer_arm(c, &c->step_w, PEEK_RETRY_S, 0.);
        return;
    }
    bool control = sp && rest >= 7 && !memcmp(sp + 1, "/_mock/", 7);
    if (control || !behave_accept_pending(m)) {
        c->state = CONN_READ;
        if (!ev_is_active(&c->rw))
            ev_io_start(m->loop, &c->rw);
        conn_read(c);
        return;
    }
    char err[256];
    c->beh_json = behave_take(m);
    if (behave_parse(&c->b, c->beh_json, err, sizeof err) != 0)
        behave_init(&c->b); /* cannot happen: validated when scripted */
    m->st.requests++;
    c->req_id = ++m->next_id;
    conn_mark_api(c);
    c->in_progress = true;
    m->st.in_progress++;
    if (sp) {
        size_t plen = 0;
        while (plen < rest && sp[1 + plen] != ' ' && sp[1 + plen] != '?' && sp[1 + plen] != '\r')
            plen++;
        control_count_path(m, sp + 1, plen);
    }
    c->resp_active = true;
    c->state = CONN_HANG_ACCEPT;
    ev_io_stop(m->loop, &c->rw);
    timer_arm(c, &c->step_w, HUP_POLL_S, HUP_POLL_S);
    if (c->b.hang_ms > 0)
        timer_arm(c, &c->deadline_w, (double)c->b.hang_ms / 1000.0, 0.);
}

static void conn_read(struct conn *c)
{
    for (int round = 0; round < 64; round++) {
        if (c->state != CONN_READ && c->in.len >= MOCK_PIPELINE_BYTES) {
            ev_io_stop(c->m->loop, &c->rw);
            c->reading_paused = true;
            return;
        }
        buf_reserve(&c->in, 16384);
        size_t space = c->in.cap - c->in.len;
        ssize_t r = recv(c->fd, c->in.p + c->in.len, space, 0);
        if (r == 0) {
            conn_close(c, true);
            return;
        }
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                conn_close(c, true);
            return;
        }
        c->in.len += (size_t)r;
        if (c->state == CONN_READ) {
            conn_drive(c);
            if (c->state == CONN_CLOSED)
                return;
        }
        if (c->state == CONN_HANG || c->state == CONN_LINGER)
            return; /* the next readiness goes to conn_discard */
        if ((size_t)r < space)
            return; /* drained (level-triggered: more wakes us) */
    }
}

static void conn_on_read(struct ev_loop *loop, ev_io *w, int revents)
{
    struct conn *c = w->data;
    (void)loop;
    (void)revents;
    switch (c->state) {
    case CONN_PEEK:
        conn_peek(c);
        break;
    case CONN_HANG:
    case CONN_LINGER:
        conn_discard(c);
        break;
    case CONN_READ:
    case CONN_DELAY:
    case CONN_SEND:
        conn_read(c);
        break;
    default:
        ev_io_stop(c->m->loop, &c->rw);
        break;
    }
}

static void conn_on_write(struct ev_loop *loop, ev_io *w, int revents)
{
    struct conn *c = w->data;
    (void)revents;
    if (c->state != CONN_SEND && c->state != CONN_READ) {
        ev_io_stop(loop, w); /* DELAY: the answer goes out at begin_send */
        return;
    }
    if (conn_flush(c) < 0)
        return;
    if (c->state == CONN_READ)
        conn_drive(c);
}

static void conn_on_step(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct conn *c = w->data;
    (void)revents;
    switch (c->state) {
    case CONN_PEEK:
        conn_peek(c);
        return;
    case CONN_DELAY:
        conn_begin_send(c);
        break;
    case CONN_SEND:
        if (!c->st.active || c->st.done) {
            ev_timer_stop(loop, w);
            return;
        }
        reply_stream_fill(c, false);
        if (c->st.done)
            ev_timer_stop(loop, w);
        if (conn_flush(c) < 0)
            return;
        break;
    case CONN_HANG_ACCEPT: {
        struct pollfd pfd = { .fd = c->fd, .events = POLLRDHUP, .revents = 0 };
        if (poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)))
            conn_close(c, true);
        return;
    }
    default:
        ev_timer_stop(loop, w);
        return;
    }
    if (c->state == CONN_READ)
        conn_drive(c);
}

static void conn_on_trickle(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct conn *c = w->data;
    (void)revents;
    if (c->state != CONN_SEND) {
        ev_timer_stop(loop, w);
        return;
    }
    c->body_budget = (size_t)c->b.trickle_bytes;
    if (conn_flush(c) < 0)
        return;
    if (c->state == CONN_READ)
        conn_drive(c);
}

static void conn_on_deadline(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct conn *c = w->data;
    (void)loop;
    (void)w;
    (void)revents;
    conn_close(c, false); /* hang_ms over, or lingering close done */
}
