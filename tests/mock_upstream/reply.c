/*
 * reply.c — what the mock answers: OpenAI-shaped chat completions (plain and
 * SSE), embeddings, OCR, and OpenAI-style errors.
 *
 * The plain chat answer is the benchmark fast path: one jansson parse of the
 * request, the answer formatted straight into reused buffers (no jansson
 * encoding), written from the read callback.
 *
 * Token accounting is a deterministic estimate: ceil(bytes / 4), at least 1,
 * for the prompt (all message text) and the completion (the reply text);
 * `usage` in a behaviour overrides any of the three numbers.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <strings.h>
#include <time.h>

#define DEFAULT_STREAM_EVENTS 4
#define DEFAULT_DIMS          8
#define MAX_EMBED_FLOATS      (4u * 1024u * 1024u)

const char *reply_reason(int status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 102:
        return "Processing";
    case 103:
        return "Early Hints";
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 202:
        return "Accepted";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 402:
        return "Payment Required";
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
    case 422:
        return "Unprocessable Content";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 505:
        return "HTTP Version Not Supported";
    case 529:
        return "Overloaded";
    default:
        return "Status";
    }
}

static long long tokens_of(size_t bytes)
{
    long long t = (long long)((bytes + 3) / 4);
    return t < 1 ? 1 : t;
}

static void apply_usage(const struct behave *b, long long *pt, long long *ct, long long *tt)
{
    json_t *v;
    *tt = -1;
    if (b->usage) {
        if ((v = json_object_get(b->usage, "prompt_tokens")))
            *pt = (long long)json_number_value(v);
        if (ct && (v = json_object_get(b->usage, "completion_tokens")))
            *ct = (long long)json_number_value(v);
        if ((v = json_object_get(b->usage, "total_tokens")))
            *tt = (long long)json_number_value(v);
    }
    if (*tt < 0)
        *tt = *pt + (ct ? *ct : 0);
}

/* Appends the head. clen >= 0: Content-Length framing; -1: length unknown
 * (chunked for HTTP/1.1, close-delimited for HTTP/1.0). no_length forces
 * close-delimited framing either way. */
static void reply_head(struct conn *c, int status, const char *ctype, long long clen)
{
    struct buf *o = &c->out;
    size_t start = o->len;
    bool close_framed = c->b.no_length || (clen < 0 && c->minor == 0);
    c->status = status;
    c->keep_alive = c->req_keep_alive && !close_framed && !c->b.connection_close;
    c->chunked_out = clen < 0 && !close_framed;
    for (size_t i = 0; i < c->b.n_interim; i++) {
        buf_addf(o, "HTTP/1.1 %d %s\r\n", c->b.interim[i], reply_reason(c->b.interim[i]));
        if (c->b.interim[i] == 103)
            buf_adds(o, "Link: </hint.css>; rel=preload; as=style\r\n");
        buf_add(o, "\r\n", 2);
    }
    buf_adds(o, "HTTP/1.1 ");
    buf_add_ll(o, status);
    buf_add(o, " ", 1);
    buf_adds(o, reply_reason(status));
    buf_adds(o, "\r\nContent-Type: ");
    buf_adds(o, ctype);
    if (!close_framed) {
        if (clen >= 0) {
            buf_adds(o, "\r\nContent-Length: ");
            buf_add_ll(o, clen);
        } else {
            buf_adds(o, "\r\nTransfer-Encoding: chunked");
        }
    }
    buf_add(o, "\r\n", 2);
    buf_adds(o, c->keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n");
    if (clen < 0)
        buf_adds(o, "Cache-Control: no-cache\r\n");
    if (c->b.retry_after)
        buf_addf(o, "Retry-After: %s\r\n", c->b.retry_after);
    if (c->req_id) {
        buf_adds(o, "X-Mock-Request: ");
        buf_add_ll(o, (long long)c->req_id);
        buf_add(o, "\r\n", 2);
    }
    if (c->b.headers) {
        const char *k;
        json_t *v;
        json_object_foreach(c->b.headers, k, v) buf_addf(o, "%s: %s\r\n", k, json_string_value(v));
    }
    buf_add(o, "\r\n", 2);
    c->head_left += o->len - start;
}

/* `chunked`: the body in chunks of 1, 2, 4 ... up to 16 KiB bytes, so that a
 * reader meets sizes of every hex width, most of them split across reads. */
static void add_chunked(struct buf *o, const char *body, size_t len)
{
    for (size_t off = 0, sz = 1; off < len; off += sz, sz = sz < 16384 ? sz * 2 : sz) {
        if (sz > len - off)
            sz = len - off;
        buf_addf(o, "%zx\r\n", sz);
        buf_add(o, body + off, sz);
        buf_add(o, "\r\n", 2);
    }
    buf_add(o, "0\r\n\r\n", 5);
}

static void reply_fixed(struct conn *c, int status, const char *ctype, const char *body, size_t len)
{
    reply_head(c, status, ctype, c->b.chunked ? -1 : (long long)len);
    if (c->chunked_out)
        add_chunked(&c->out, body, len);
    else
        buf_add(&c->out, body, len);
    conn_start_response(c);
}

void reply_simple(struct conn *c, int status, const char *ctype, const char *body, size_t len)
{
    reply_fixed(c, status, ctype, body, len);
}

static const char *error_type_of(int status)
{
    switch (status) {
    case 400:
    case 404:
    case 405:
    case 413:
    case 422:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 408:
        return "timeout_error";
    case 409:
        return "conflict_error";
    case 429:
        return "rate_limit_error";
    default:
        return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

static void reply_error_json(struct conn *c, int status, const char *type, const char *msg)
{
    struct buf *sc = &c->m->scratch;
    sc->len = 0;
    buf_adds(sc, "{\"error\":{\"message\":");
    buf_add_json_str(sc, msg, strlen(msg));
    buf_adds(sc, ",\"type\":");
    buf_add_json_str(sc, type, strlen(type));
    buf_adds(sc, ",\"param\":null,\"code\":");
    buf_adds(sc,
             status == 429       ? "\"rate_limit_exceeded\""
                 : status == 401 ? "\"invalid_api_key\""
                                 : "null");
    buf_adds(sc, "}}");
    reply_fixed(c, status, "application/json", sc->p, sc->len);
}

void reply_responses_followup(struct conn *c, const char *meth, size_t mlen, const char *id,
                              size_t idlen, const char *rest, size_t rlen)
{
    struct buf *sc = &c->m->scratch;
    bool get = mlen == 3 && !memcmp(meth, "GET", 3);
    bool del = mlen == 6 && !memcmp(meth, "DELETE", 6);
    bool post = mlen == 4 && !memcmp(meth, "POST", 4);

    sc->len = 0;
    if (rlen == 0 && (get || del)) {
        buf_adds(sc, "{\"id\":");
        buf_add_json_str(sc, id, idlen);
        buf_adds(sc,
                 del ? ",\"object\":\"response\",\"deleted\":true}"
                     : ",\"object\":\"response\",\"status\":\"completed\",\"output\":[]}");
    } else if (rlen == 7 && !memcmp(rest, "/cancel", 7) && post) {
        buf_adds(sc, "{\"id\":");
        buf_add_json_str(sc, id, idlen);
        buf_adds(sc, ",\"object\":\"response\",\"status\":\"cancelled\",\"output\":[]}");
    } else if (rlen == 12 && !memcmp(rest, "/input_items", 12) && get) {
        buf_adds(sc,
                 "{\"object\":\"list\",\"data\":[{\"id\":\"msg_in_1\",\"type\":\"message\","
                 "\"role\":\"user\",\"content\":[]}],\"first_id\":\"msg_in_1\","
                 "\"last_id\":\"msg_in_1\",\"has_more\":false}");
    } else {
        reply_error(c, 404, "invalid_request_error", "mock: no such Responses follow-up");
        return;
    }
    reply_fixed(c, 200, "application/json", sc->p, sc->len);
}

void reply_error(struct conn *c, int status, const char *type, const char *msg)
{
    json_decref(c->beh_json);
    c->beh_json = NULL;
    behave_init(&c->b);
    reply_error_json(c, status, type, msg);
}

/* Anthropic's error body: {"type":"error","error":{"type","message"}}. */
static const char *anthropic_error_type_of(int status)
{
    switch (status) {
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 413:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 529:
        return "overloaded_error";
    default:
        return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

static void anthropic_error_obj(struct buf *sc, const char *type, const char *msg)
{
    buf_adds(sc, "{\"type\":\"error\",\"error\":{\"type\":");
    buf_add_json_str(sc, type, strlen(type));
    buf_adds(sc, ",\"message\":");
    buf_add_json_str(sc, msg, strlen(msg));
    buf_adds(sc, "}}");
}

static void reply_anthropic_error(struct conn *c, int status, const char *type, const char *msg)
{
    struct buf *sc = &c->m->scratch;
    sc->len = 0;
    anthropic_error_obj(sc, type, msg);
    reply_fixed(c, status, "application/json", sc->p, sc->len);
}

static const char *head_get(const struct conn *c, const char *name, size_t *vlen);

/* Appends s[0..n) to b with each {{authorization}} replaced by the value of
 * the request's Authorization header, and each {{header:NAME}} by that of
 * header NAME (nothing when the request has none): a script can make the
 * mock echo the key it was sent, as some providers do. */
static void add_expanded(struct conn *c, struct buf *b, const char *s, size_t n)
{
    const char *e = s + n, *hit;

    while ((hit = memmem(s, (size_t)(e - s), "{{", 2))) {
        const char *name = hit + 2;
        const char *close = memmem(name, (size_t)(e - name), "}}", 2);
        size_t nl = close ? (size_t)(close - name) : 0;
        char hname[64];
        if (nl > 7 && !memcmp(name, "header:", 7)) {
            name += 7;
            nl -= 7;
        } else if (!(nl == 13 && !memcmp(name, "authorization", 13))) {
            nl = 0;
        }
        if (nl == 0 || nl >= sizeof(hname)) {
            buf_add(b, s, (size_t)(hit + 2 - s)); /* not a placeholder: kept as is */
            s = hit + 2;
            continue;
        }
        memcpy(hname, name, nl);
        hname[nl] = '\0';
        buf_add(b, s, (size_t)(hit - s));
        size_t vl = 0;
        const char *v = head_get(c, hname, &vl);
        if (v)
            buf_add(b, v, vl);
        s = close + 2;
    }
    buf_add(b, s, (size_t)(e - s));
}

/* A scripted error status, with the behaviour's pacing kept. */
static void reply_status(struct conn *c, int status)
{
    char msg[128];
    struct buf em = { 0 };
    snprintf(msg, sizeof msg, "mock: scripted %d %s", status, reply_reason(status));
    if (c->b.error_message) {
        add_expanded(c, &em, c->b.error_message, strlen(c->b.error_message));
        buf_add(&em, "", 1);
    }
    if (c->ep == EP_MESSAGES)
        reply_anthropic_error(c, status,
                              c->b.error_type ? c->b.error_type : anthropic_error_type_of(status),
                              c->b.error_message  ? em.p
                                  : status == 529 ? "Overloaded"
                                                  : msg);
    else
        reply_error_json(c, status, c->b.error_type ? c->b.error_type : error_type_of(status),
                         c->b.error_message ? em.p : msg);
    buf_fini(&em);
}

/* ------------------------------------------------------------------ auth */

/* The value of request header `name` (case-insensitive), or NULL. */
static const char *head_get(const struct conn *c, const char *name, size_t *vlen)
{
    const char *p = c->in.p, *end = c->in.p + c->head_len;
    size_t n = strlen(name);
    const char *line = memchr(p, '\n', (size_t)(end - p));
    while (line && ++line < end) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol)
            break;
        if ((size_t)(eol - line) > n && !strncasecmp(line, name, n) && line[n] == ':') {
            const char *v = line + n + 1, *ve = eol;
            while (v < ve && (*v == ' ' || *v == '\t'))
                v++;
            while (ve > v && (ve[-1] == '\r' || ve[-1] == ' '))
                ve--;
            *vlen = (size_t)(ve - v);
            return v;
        }
        line = eol;
    }
    return NULL;
}

/* The raw (still percent-encoded) value of query parameter `name`. */
static const char *query_get(const struct conn *c, const char *name, size_t *vlen)
{
    const char *t = c->in.p + c->target_off, *end = t + c->target_len;
    const char *q = memchr(t, '?', c->target_len);
    size_t n = strlen(name);
    while (q && q < end) {
        q++;
        const char *amp = memchr(q, '&', (size_t)(end - q));
        const char *e = amp ? amp : end;
        if ((size_t)(e - q) > n && !memcmp(q, name, n) && q[n] == '=') {
            *vlen = (size_t)(e - q - (ptrdiff_t)n - 1);
            return q + n + 1;
        }
        q = amp;
    }
    return NULL;
}

static bool same(const char *v, size_t vlen, const char *want)
{
    return v && vlen == strlen(want) && !memcmp(v, want, vlen);
}

/* Checks the request against /_mock/script's `auth` the way that provider
 * does; answers with its real error shape and returns false on a mismatch. */
static bool reply_check_auth(struct conn *c)
{
    json_t *auth = c->m->auth;
    if (!auth)
        return true;
    const char *d = json_string_value(json_object_get(auth, "dialect"));
    const char *key = json_string_value(json_object_get(auth, "key"));
    const char *name = json_string_value(json_object_get(auth, "name"));
    const char *v;
    size_t vl = 0;

    if (!strcmp(d, "openai")) {
        char want[512];
        snprintf(want, sizeof want, "Bearer %s", key);
        v = head_get(c, "authorization", &vl);
        if (same(v, vl, want))
            return true;
        reply_error_json(c, 401, "invalid_request_error",
                         v ? "Incorrect API key provided. You can find your API key at "
                             "https://platform.openai.com/account/api-keys."
                           : "You didn't provide an API key. You need to provide your API key "
                             "in an Authorization header using Bearer auth.");
        return false;
    }
    if (!strcmp(d, "azure")) {
        static const char denied[] =
            "{\"error\":{\"code\":\"401\",\"message\":\"Access denied due to invalid "
            "subscription key or wrong API endpoint. Make sure to provide a valid key for an "
            "active subscription and use a correct regional API endpoint for your resource.\"}}";
        static const char not_found[] =
            "{\"error\":{\"code\":\"404\",\"message\":\"Resource not found\"}}";
        v = head_get(c, "api-key", &vl);
        if (!same(v, vl, key)) {
            reply_fixed(c, 401, "application/json", denied, sizeof denied - 1);
            return false;
        }
        if (!query_get(c, "api-version", &vl) || !vl) {
            reply_fixed(c, 404, "application/json", not_found, sizeof not_found - 1);
            return false;
        }
        return true;
    }
    if (!strcmp(d, "anthropic")) {
        v = head_get(c, "x-api-key", &vl);
        if (!same(v, vl, key)) {
            reply_anthropic_error(c, 401, "authentication_error",
                                  v ? "invalid x-api-key" : "x-api-key header is required");
            return false;
        }
        if (!head_get(c, "anthropic-version", &vl) || !vl) {
            reply_anthropic_error(c, 400, "invalid_request_error",
                                  "anthropic-version: header is required");
            return false;
        }
        return true;
    }
    if (!strcmp(d, "gemini"))
        v = head_get(c, name ? name : "x-goog-api-key", &vl);
    else
        v = query_get(c, name ? name : "key", &vl);
    if (same(v, vl, key))
        return true;
    static const char invalid[] =
        "{\"error\":{\"code\":400,\"message\":\"API key not valid. Please pass a valid API "
        "key.\",\"status\":\"INVALID_ARGUMENT\"}}";
    reply_fixed(c, 400, "application/json", invalid, sizeof invalid - 1);
    return false;
}

/* `raw_hex`: the whole response as scripted, framing or none. The bytes up
 * to the first blank line count as the head (pacing, close_after_bytes);
 * bytes without one are all head. */
static void reply_raw_response(struct conn *c)
{
    struct buf *o = &c->out;
    size_t start = o->len;
    buf_add_hex(o, c->b.raw, c->b.raw_len);
    const char *p = o->p + start;
    size_t n = o->len - start;
    const char *blank = memmem(p, n, "\r\n\r\n", 4);
    c->head_left += blank ? (size_t)(blank + 4 - p) : n;
    c->keep_alive = c->req_keep_alive && c->b.raw_keep;
    int status = 0; /* by_status counts it only when it has a status line */
    if (n >= 12 && !memcmp(p, "HTTP/1.", 7) && p[8] == ' ')
        sscanf(p + 9, "%3d", &status);
    c->status = status;
    conn_start_response(c);
}

/* The raw `body` (or `body_hex`) of a behaviour, expanded. */
static void reply_raw(struct conn *c, int status)
{
    struct buf *sc = &c->m->scratch, raw = { 0 };
    const char *p = c->b.body;
    size_t n = c->b.body_len;

    if (c->b.body_hex) {
        buf_add_hex(&raw, p, n);
        p = raw.p;
        n = raw.len;
    }
    sc->len = 0;
    add_expanded(c, sc, p, n);
    buf_fini(&raw);
    reply_fixed(c, status, c->b.content_type ? c->b.content_type : "application/json", sc->p,
                sc->len);
}

/* ------------------------------------------------------------------ chat */

static void text_of(json_t *content, const char **text, size_t *tlen, size_t *bytes)
{
    if (json_is_string(content)) {
        *text = json_string_value(content);
        *tlen = json_string_length(content);
        *bytes += *tlen;
    } else if (json_is_array(content)) {
        size_t i;
        json_t *part;
        json_array_foreach(content, i, part)
        {
            json_t *t = json_object_get(part, "text");
            if (json_is_string(t)) {
                *text = json_string_value(t);
                *tlen = json_string_length(t);
                *bytes += *tlen;
            }
        }
    }
}

static void chunk_prefix(struct buf *sc, const struct reply_stream *s)
{
    buf_addf(sc,
             "data: {\"id\":\"chatcmpl-mock-%llu\",\"object\":\"chat.completion.chunk\","
             "\"created\":%lld,\"model\":",
             s->id, s->created);
    buf_add_json_str(sc, s->model, s->model_len);
}

static void usage_json(struct buf *sc, long long pt, long long ct, long long tt)
{
    buf_adds(sc, "\"usage\":{\"prompt_tokens\":");
    buf_add_ll(sc, pt);
    buf_adds(sc, ",\"completion_tokens\":");
    buf_add_ll(sc, ct);
    buf_adds(sc, ",\"total_tokens\":");
    buf_add_ll(sc, tt);
    buf_add(sc, "}", 1);
}

static void chat_body(struct buf *sc, unsigned long long id, long long created)
{
    buf_adds(sc, "{\"id\":\"chatcmpl-mock-");
    buf_add_ll(sc, (long long)id);
    buf_adds(sc, "\",\"object\":\"chat.completion\",\"created\":");
    buf_add_ll(sc, created);
    buf_adds(sc, ",\"model\":");
}

/* Byte offset where piece k of the reply text starts, moved forward to a
 * UTF-8 boundary so that no piece splits a character. */
static size_t piece_bound(const struct reply_stream *s, long long k)
{
    size_t pos = (size_t)((unsigned long long)k * s->text_len / (unsigned long long)s->events);
    while (pos < s->text_len && ((unsigned char)s->text[pos] & 0xC0) == 0x80)
        pos++;
    return pos;
}

static void stream_emit(struct conn *c, const char *p, size_t n)
{
    if (!n)
        return; /* an empty chunk would end the body */
    if (c->chunked_out)
        buf_addf(&c->out, "%zx\r\n", n);
    buf_add(&c->out, p, n);
    if (c->chunked_out)
        buf_add(&c->out, "\r\n", 2);
}

static void sse_event(struct buf *sc, const char *name)
{
    buf_adds(sc, "event: ");
    buf_adds(sc, name);
    buf_adds(sc, "\ndata: ");
}

/* One step of a Messages API stream: message_start and content_block_start
 * come with the first content delta; content_block_stop, message_delta
 * (with the usage) and message_stop end it. */
static void anthropic_stream_step(struct conn *c, struct buf *sc)
{
    struct reply_stream *s = &c->st;
    if (s->next == 0) {
        sse_event(sc, "message_start");
        buf_addf(sc,
                 "{\"type\":\"message_start\",\"message\":{\"id\":\"msg_mock_%llu\","
                 "\"type\":\"message\",\"role\":\"assistant\",\"model\":",
                 s->id);
        buf_add_json_str(sc, s->model, s->model_len);
        buf_addf(sc,
                 ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,"
                 "\"usage\":{\"input_tokens\":%lld,\"output_tokens\":1}}}\n\n",
                 s->prompt_tokens);
        sse_event(sc, "content_block_start");
        buf_adds(sc,
                 "{\"type\":\"content_block_start\",\"index\":0,"
                 "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
    }
    if (s->next < s->events) {
        size_t a = piece_bound(s, s->next), e = piece_bound(s, s->next + 1);
        sse_event(sc, "content_block_delta");
        buf_adds(sc,
                 "{\"type\":\"content_block_delta\",\"index\":0,"
                 "\"delta\":{\"type\":\"text_delta\",\"text\":");
        buf_add_json_str(sc, s->text + a, e - a);
        buf_adds(sc, "}}\n\n");
        s->next++;
        return;
    }
    if (c->b.stream_error) {
        sse_event(sc, "error");
        anthropic_error_obj(sc, c->b.stream_error, "Overloaded");
        buf_adds(sc, "\n\n");
    } else if (!c->b.no_done) {
        sse_event(sc, "content_block_stop");
        buf_adds(sc, "{\"type\":\"content_block_stop\",\"index\":0}\n\n");
        sse_event(sc, "message_delta");
        buf_addf(sc,
                 "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\","
                 "\"stop_sequence\":null},\"usage\":{\"output_tokens\":%lld}}\n\n",
                 s->completion_tokens);
        sse_event(sc, "message_stop");
        buf_adds(sc, "{\"type\":\"message_stop\"}\n\n");
    }
    s->done = true;
}

/* A Responses API `response` object: `status`, its one message item
 * (none while in progress) and its usage (none while in progress). */
static void responses_object(struct buf *sc, const struct reply_stream *s, const char *status,
                             bool done)
{
    if (s->resume_id[0])
        buf_addf(sc, "{\"id\":\"%s\"", s->resume_id); /* checked: no escape needed */
    else
        buf_addf(sc, "{\"id\":\"resp_mock_%d_%llu\"", (int)getpid(), s->id);
    buf_addf(sc, ",\"object\":\"response\",\"created_at\":%lld,\"status\":\"%s\",\"model\":",
             s->created, status);
    buf_add_json_str(sc, s->model, s->model_len);
    buf_adds(sc, ",\"output\":[");
    if (done) {
        buf_addf(sc,
                 "{\"id\":\"msg_mock_%llu\",\"type\":\"message\",\"status\":\"completed\","
                 "\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":",
                 s->id);
        buf_add_json_str(sc, s->text, s->text_len);
        buf_adds(sc, ",\"annotations\":[]}]}");
    }
    buf_adds(sc, "],\"usage\":");
    if (done)
        buf_addf(sc,
                 "{\"input_tokens\":%lld,\"input_tokens_details\":{\"cached_tokens\":0},"
                 "\"output_tokens\":%lld,\"output_tokens_details\":{\"reasoning_tokens\":0},"
                 "\"total_tokens\":%lld}}",
                 s->prompt_tokens, s->completion_tokens, s->total_tokens);
    else
        buf_adds(sc, "null}");
}

/* `event: <type>` and the start of its data, {"type":<type>,"sequence_number":N */
static void responses_event(struct conn *c, struct buf *sc, struct reply_stream *s,
                            const char *type)
{
    if (c->b.sse_ids)
        buf_addf(sc, "id: %lld\n", s->seq);
    sse_event(sc, type);
    buf_addf(sc, "{\"type\":\"%s\",\"sequence_number\":%lld", type, s->seq++);
    if (c->b.stamp) /* the step is written to the socket as soon as it is made */
        buf_addf(sc, ",\"mock_sent_at\":%.6f", ev_time());
}

/* The item and content-part coordinates of the one text part. */
static void responses_part_ids(struct buf *sc, const struct reply_stream *s)
{
    buf_addf(sc, ",\"item_id\":\"msg_mock_%llu\",\"output_index\":0,\"content_index\":0", s->id);
}

/* Drops from sc the events (blocks ending in a blank line) whose
 * "sequence_number" is below `below`: a resumed stream starts after the
 * client's starting_after. */
static void responses_skip(struct buf *sc, long long below)
{
    static const char key[] = "\"sequence_number\":";
    size_t in = 0, out = 0;

    while (in < sc->len) {
        const char *end = memmem(sc->p + in, sc->len - in, "\n\n", 2);
        size_t n = end ? (size_t)(end - (sc->p + in)) + 2 : sc->len - in;
        const char *k = memmem(sc->p + in, n, key, sizeof key - 1);
        bool keep = !k || strtoll(k + sizeof key - 1, NULL, 10) >= below;
        if (keep) {
            memmove(sc->p + out, sc->p + in, n);
            out += n;
        }
        in += n;
    }
    sc->len = out;
}

/* One step of a Responses API stream: response.created, in_progress,
 * output_item.added and content_part.added come with the first text
 * delta; output_text.done, content_part.done, output_item.done and
 * response.completed (with the usage) end it. */
static void responses_stream_step(struct conn *c, struct buf *sc)
{
    struct reply_stream *s = &c->st;
    if (s->next == 0) {
        responses_event(c, sc, s, "response.created");
        buf_adds(sc, ",\"response\":");
        responses_object(sc, s, "in_progress", false);
        buf_adds(sc, "}\n\n");
        responses_event(c, sc, s, "response.in_progress");
        buf_adds(sc, ",\"response\":");
        responses_object(sc, s, "in_progress", false);
        buf_adds(sc, "}\n\n");
        responses_event(c, sc, s, "response.output_item.added");
        buf_addf(sc,
                 ",\"output_index\":0,\"item\":{\"id\":\"msg_mock_%llu\",\"type\":\"message\","
                 "\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}\n\n",
                 s->id);
        responses_event(c, sc, s, "response.content_part.added");
        responses_part_ids(sc, s);
        buf_adds(sc, ",\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}}\n\n");
    }
    if (s->next < s->events) {
        size_t a = piece_bound(s, s->next), e = piece_bound(s, s->next + 1);
        responses_event(c, sc, s, "response.output_text.delta");
        responses_part_ids(sc, s);
        buf_adds(sc, ",\"delta\":");
        buf_add_json_str(sc, s->text + a, e - a);
        buf_adds(sc, ",\"logprobs\":[]}\n\n");
        s->next++;
        return;
    }
    if (c->b.stream_error) {
        responses_event(c, sc, s, "error");
        buf_adds(sc, ",\"code\":");
        buf_add_json_str(sc, c->b.stream_error, strlen(c->b.stream_error));
        buf_adds(sc, ",\"message\":\"The server had an error\",\"param\":null}\n\n");
    } else if (!c->b.no_done) {
        responses_event(c, sc, s, "response.output_text.done");
        responses_part_ids(sc, s);
        buf_adds(sc, ",\"text\":");
        buf_add_json_str(sc, s->text, s->text_len);
        buf_adds(sc, ",\"logprobs\":[]}\n\n");
        responses_event(c, sc, s, "response.content_part.done");
        responses_part_ids(sc, s);
        buf_adds(sc, ",\"part\":{\"type\":\"output_text\",\"text\":");
        buf_add_json_str(sc, s->text, s->text_len);
        buf_adds(sc, ",\"annotations\":[]}}\n\n");
        responses_event(c, sc, s, "response.output_item.done");
        buf_addf(sc,
                 ",\"output_index\":0,\"item\":{\"id\":\"msg_mock_%llu\",\"type\":\"message\","
                 "\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":"
                 "\"output_text\",\"text\":",
                 s->id);
        buf_add_json_str(sc, s->text, s->text_len);
        buf_adds(sc, ",\"annotations\":[]}]}}\n\n");
        responses_event(c, sc, s, "response.completed");
        buf_adds(sc, ",\"response\":");
        responses_object(sc, s, "completed", true);
        buf_adds(sc, "}\n\n");
    }
    s->done = true;
}

void reply_stream_fill(struct conn *c, bool all)
{
    struct reply_stream *s = &c->st;
    struct buf *sc = &c->m->scratch;
    while (!s->done && (s->anthropic || s->responses)) {
        sc->len = 0;
        if (s->responses)
            responses_stream_step(c, sc);
        else
            anthropic_stream_step(c, sc);
        if (s->skip_below > 0)
            responses_skip(sc, s->skip_below);
        stream_emit(c, sc->p, sc->len);
        if (s->done && c->chunked_out)
            buf_add(&c->out, "0\r\n\r\n", 5);
        if (!all && sc->len > 0)
            return; /* a step whose events were all skipped is no step */
    }
    while (!s->done) {
        sc->len = 0;
        if (s->next < s->events) {
            size_t a = piece_bound(s, s->next), e = piece_bound(s, s->next + 1);
            chunk_prefix(sc, s);
            buf_adds(
                sc,
                s->next == 0
                    ? ",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":"
                    : ",\"choices\":[{\"index\":0,\"delta\":{\"content\":");
            buf_add_json_str(sc, s->text + a, e - a);
            buf_adds(sc, "},\"finish_reason\":null}]}\n\n");
            s->next++;
        } else {
            if (!c->b.no_done) {
                chunk_prefix(sc, s);
                buf_adds(sc,
                         ",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]");
                if (!s->include_usage && !c->b.usage_if_asked) {
                    buf_add(sc, ",", 1);
                    usage_json(sc, s->prompt_tokens, s->completion_tokens, s->total_tokens);
                }
                buf_adds(sc, "}\n\n");
                if (s->include_usage) {
                    chunk_prefix(sc, s);
                    buf_adds(sc, ",\"choices\":[],");
                    usage_json(sc, s->prompt_tokens, s->completion_tokens, s->total_tokens);
                    buf_adds(sc, "}\n\n");
                }
                buf_adds(sc, "data: [DONE]\n\n");
            }
            s->done = true;
        }
        stream_emit(c, sc->p, sc->len);
        if (s->done && c->chunked_out)
            buf_add(&c->out, "0\r\n\r\n", 5);
        if (!all)
            break;
    }
}

static void reply_chat(struct conn *c, json_t *req, int status)
{
    json_t *model = json_object_get(req, "model");
    const char *mstr = json_is_string(model) ? json_string_value(model) : "mock-model";
    size_t mlen = json_is_string(model) ? json_string_length(model) : strlen(mstr);
    const char *echo = NULL;
    size_t echo_len = 0, prompt_bytes = 0, i;
    json_t *msg;
    if (c->ep == EP_MESSAGES) {
        /* The system prompt counts as prompt text but is never echoed. */
        const char *sys = NULL;
        size_t sys_len = 0;
        text_of(json_object_get(req, "system"), &sys, &sys_len, &prompt_bytes);
    }
    json_array_foreach(json_object_get(req, "messages"), i, msg)
        text_of(json_object_get(msg, "content"), &echo, &echo_len, &prompt_bytes);
    if (c->ep == EP_RESPONSES) {
        /* instructions count as prompt text; input is a string or a list
         * of items, each with a string or a list of parts as content. */
        const char *ins = NULL;
        size_t ins_len = 0;
        json_t *input = json_object_get(req, "input");
        text_of(json_object_get(req, "instructions"), &ins, &ins_len, &prompt_bytes);
        if (json_is_string(input))
            text_of(input, &echo, &echo_len, &prompt_bytes);
        else
            json_array_foreach(input, i, msg)
                text_of(json_object_get(msg, "content"), &echo, &echo_len, &prompt_bytes);
    }

    const char *text = "mock reply";
    size_t tlen = 10;
    if (c->b.content) {
        text = c->b.content;
        tlen = c->b.content_len;
    } else if (echo && echo_len) {
        text = echo;
        tlen = echo_len;
    }
    if (c->b.content_repeat > 0 && tlen > 0) {
        /* Large replies from a small request: the text again and again,
         * cut at exactly content_repeat bytes. */
        struct buf *r = &c->repeated;
        size_t want = (size_t)c->b.content_repeat;
        r->len = 0;
        buf_reserve(r, want);
        while (r->len + tlen <= want)
            buf_add(r, text, tlen);
        buf_add(r, text, want - r->len);
        text = r->p;
        tlen = r->len;
    }
    long long pt = tokens_of(prompt_bytes), ct = tokens_of(tlen), tt;
    apply_usage(&c->b, &pt, &ct, &tt);
    long long created = (long long)time(NULL);

    if (json_is_true(json_object_get(req, "stream"))) {
        struct reply_stream *s = &c->st;
        s->active = true;
        s->include_usage =
            json_is_true(json_object_get(json_object_get(req, "stream_options"), "include_usage"));
        s->anthropic = c->ep == EP_MESSAGES;
        s->responses = c->ep == EP_RESPONSES;
        s->seq = 0;
        s->events = c->b.stream_events >= 0 ? c->b.stream_events : DEFAULT_STREAM_EVENTS;
        s->interval_ms = c->b.stream_interval_ms;
        s->model = mstr;
        s->model_len = mlen;
        s->text = text;
        s->text_len = tlen;
        s->id = c->req_id;
        s->created = created;
        s->prompt_tokens = pt;
        s->completion_tokens = ct;
        s->total_tokens = tt;
        reply_head(c, status, "text/event-stream", -1);
        conn_start_response(c);
        return;
    }

    struct buf *sc = &c->m->scratch;
    sc->len = 0;
    if (c->ep == EP_MESSAGES) {
        buf_addf(sc,
                 "{\"id\":\"msg_mock_%llu\",\"type\":\"message\",\"role\":\"assistant\","
                 "\"model\":",
                 c->req_id);
        buf_add_json_str(sc, mstr, mlen);
        buf_adds(sc, ",\"content\":[{\"type\":\"text\",\"text\":");
        buf_add_json_str(sc, text, tlen);
        buf_addf(sc,
                 "}],\"stop_reason\":\"end_turn\",\"stop_sequence\":null,"
                 "\"usage\":{\"input_tokens\":%lld,\"output_tokens\":%lld}}",
                 pt, ct);
        reply_fixed(c, status, "application/json", sc->p, sc->len);
        return;
    }
    if (c->ep == EP_RESPONSES) {
        struct reply_stream r = { .model = mstr,
                                  .model_len = mlen,
                                  .text = text,
                                  .text_len = tlen,
                                  .id = c->req_id,
                                  .created = created,
                                  .prompt_tokens = pt,
                                  .completion_tokens = ct,
                                  .total_tokens = tt };
        responses_object(sc, &r, "completed", true);
        reply_fixed(c, status, "application/json", sc->p, sc->len);
        return;
    }
    chat_body(sc, c->req_id, created);
    buf_add_json_str(sc, mstr, mlen);
    buf_adds(sc, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
    buf_add_json_str(sc, text, tlen);
    buf_adds(sc, "},\"finish_reason\":\"stop\"}],");
    usage_json(sc, pt, ct, tt);
    buf_add(sc, "}", 1);
    reply_fixed(c, status, "application/json", sc->p, sc->len);
}

/* The benchmark fast path (see scan.c): same answer as reply_chat, built
 * from the still-escaped strings of the body. Returns false when the body
 * is not a plain chat request. */
static bool reply_chat_fast(struct conn *c, const char *body, size_t len)
{
    struct scan_chat r;
    if (scan_chat(body, len, &r) != 0)
        return false;
    struct buf *sc = &c->m->scratch;
    size_t text_bytes = r.echo_len ? r.echo_decoded : 10;
    sc->len = 0;
    chat_body(sc, c->req_id, (long long)time(NULL));
    if (r.model) {
        buf_add(sc, "\"", 1);
        buf_add(sc, r.model, r.model_len);
        buf_add(sc, "\"", 1);
    } else {
        buf_adds(sc, "\"mock-model\"");
    }
    buf_adds(sc, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"");
    if (r.echo_len)
        buf_add(sc, r.echo, r.echo_len);
    else
        buf_adds(sc, "mock reply");
    buf_adds(sc, "\"},\"finish_reason\":\"stop\"}],");
    usage_json(sc, tokens_of(r.prompt_bytes), tokens_of(text_bytes),
               tokens_of(r.prompt_bytes) + tokens_of(text_bytes));
    buf_add(sc, "}", 1);
    reply_fixed(c, 200, "application/json", sc->p, sc->len);
    return true;
}

/* ------------------------------------------------------------ embeddings */

static unsigned long long fnv1a(unsigned long long h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static unsigned long long splitmix64(unsigned long long *x)
{
    unsigned long long z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Seed and prompt bytes of one input: a string, or an array of token ids. */
static unsigned long long input_seed(json_t *in, size_t index, size_t *bytes)
{
    unsigned long long h = 1469598103934665603ULL;
    if (json_is_string(in)) {
        *bytes += json_string_length(in);
        return fnv1a(h, json_string_value(in), json_string_length(in));
    }
    if (json_is_array(in)) {
        size_t i;
        json_t *t;
        json_array_foreach(in, i, t)
        {
            long long v = json_integer_value(t);
            h = fnv1a(h, &v, sizeof v);
        }
        *bytes += 4 * json_array_size(in);
        return h;
    }
    return fnv1a(h, &index, sizeof index);
}

static void base64_add(struct buf *b, const unsigned char *p, size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    buf_reserve(b, (n + 2) / 3 * 4);
    char *o = b->p + b->len;
    size_t i = 0;
    for (; i + 2 < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (unsigned)p[i + 1] << 8 | p[i + 2];
        *o++ = tab[v >> 18];
        *o++ = tab[(v >> 12) & 63];
        *o++ = tab[(v >> 6) & 63];
        *o++ = tab[v & 63];
    }
    if (i < n) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0);
        *o++ = tab[v >> 18];
        *o++ = tab[(v >> 12) & 63];
        *o++ = i + 1 < n ? tab[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    b->len = (size_t)(o - b->p);
}

static void reply_embeddings(struct conn *c, json_t *req, int status)
{
    json_t *input = json_object_get(req, "input");
    size_t count;
    if (json_is_string(input))
        count = 1;
    else if (json_is_array(input) && json_array_size(input) > 0)
        count = json_is_integer(json_array_get(input, 0)) ? 1 : json_array_size(input);
    else {
        reply_error_json(c, 400, "invalid_request_error",
                         "mock: \"input\" must be a string or a non-empty array");
        return;
    }
    json_t *dj = json_object_get(req, "dimensions");
    long long dims = c->b.dims > 0 ? c->b.dims : DEFAULT_DIMS;
    if (json_is_integer(dj) && json_integer_value(dj) >= 1 && json_integer_value(dj) <= 65536)
        dims = json_integer_value(dj);
    if ((unsigned long long)dims * count > MAX_EMBED_FLOATS) {
        reply_error_json(c, 400, "invalid_request_error", "mock: too many embedding floats");
        return;
    }
    const char *fmt = json_string_value(json_object_get(req, "encoding_format"));
    bool b64 = fmt && !strcmp(fmt, "base64");
    json_t *model = json_object_get(req, "model");

    struct buf *sc = &c->m->scratch;
    sc->len = 0;
    buf_adds(sc, "{\"object\":\"list\",\"data\":[");
    size_t prompt_bytes = 0;
    float fv[64];
    for (size_t i = 0; i < count; i++) {
        json_t *one = json_is_string(input) || json_is_integer(json_array_get(input, 0))
            ? input
            : json_array_get(input, i);
        unsigned long long x = input_seed(one, i, &prompt_bytes);
        buf_addf(sc, "%s{\"object\":\"embedding\",\"index\":%zu,\"embedding\":", i ? "," : "", i);
        buf_add(sc, b64 ? "\"" : "[", 1);
        for (long long d = 0; d < dims;) {
            size_t k = 0;
            for (; k < 63 && d < dims; k++, d++) { /* 63 floats = 252 bytes = 84 base64 groups */
                double r = (double)(splitmix64(&x) >> 11) * (1.0 / 9007199254740992.0);
                fv[k] = (float)(r * 2.0 - 1.0);
                if (!b64)
                    buf_addf(sc, "%s%.6f", d ? "," : "", (double)fv[k]);
            }
            if (b64)
                base64_add(sc, (const unsigned char *)fv, k * sizeof(float));
        }
        buf_adds(sc, b64 ? "\"}" : "]}");
    }
    buf_adds(sc, "],\"model\":");
    if (json_is_string(model))
        buf_add_json_str(sc, json_string_value(model), json_string_length(model));
    else
        buf_adds(sc, "\"mock-embedding\"");
    long long pt = tokens_of(prompt_bytes), tt;
    apply_usage(&c->b, &pt, NULL, &tt);
    buf_addf(sc, ",\"usage\":{\"prompt_tokens\":%lld,\"total_tokens\":%lld}}", pt, tt);
    reply_fixed(c, status, "application/json", sc->p, sc->len);
}

/* ------------------------------------------------------------------- ocr */

static void reply_ocr(struct conn *c, json_t *req, int status, size_t body_len)
{
    json_t *in = json_object_get(req, "input");
    json_t *model = json_object_get(req, "model");
    const char *text = "mock ocr text";
    size_t tlen = strlen(text);
    if (c->b.content) {
        text = c->b.content;
        tlen = c->b.content_len;
    } else if (json_is_string(in)) {
        text = json_string_value(in);
        tlen = json_string_length(in);
    }
    long long pt = tokens_of(body_len), ct = tokens_of(tlen), tt;
    apply_usage(&c->b, &pt, &ct, &tt);

    struct buf *sc = &c->m->scratch;
    sc->len = 0;
    buf_addf(sc, "{\"id\":\"ocr-mock-%llu\",\"object\":\"ocr\",\"model\":", c->req_id);
    if (json_is_string(model))
        buf_add_json_str(sc, json_string_value(model), json_string_length(model));
    else
        buf_adds(sc, "\"mock-ocr\"");
    buf_adds(sc, ",\"text\":");
    buf_add_json_str(sc, text, tlen);
    buf_adds(sc, ",\"pages\":[{\"index\":0,\"markdown\":");
    buf_add_json_str(sc, text, tlen);
    buf_addf(sc,
             "}],\"usage\":{\"prompt_tokens\":%lld,\"completion_tokens\":%lld,"
             "\"total_tokens\":%lld,\"pages_processed\":1}}",
             pt, ct, tt);
    reply_fixed(c, status, "application/json", sc->p, sc->len);
}

/* ------------------------------------------------------------------ entry */

/* Takes behaviour `bj` (owned, NULL: normal) for the API request and
 * answers what it decides alone: a bad behaviour, a hang, a raw answer or
 * body, an error status. True when answered; else *status is the 2xx to
 * answer the generated reply with. */
static bool reply_behave(struct conn *c, json_t *bj, int *status)
{
    c->beh_json = bj;
    if (bj) {
        char err[256];
        if (behave_parse(&c->b, bj, err, sizeof err) != 0) {
            reply_error(c, 400, "mock_error", err);
            return true;
        }
    }
    if (c->b.hang == BEHAVE_HANG_BEFORE_HEADERS || c->b.hang == BEHAVE_HANG_ACCEPT) {
        conn_hang(c);
        return true;
    }
    if (c->b.raw) {
        reply_raw_response(c);
        return true;
    }
    *status = c->b.status ? c->b.status : 200;
    if (c->b.body) {
        reply_raw(c, *status);
        return true;
    }
    if (*status >= 300) {
        reply_status(c, *status);
        return true;
    }
    return false;
}

void reply_api(struct conn *c, enum mock_endpoint ep, const char *body, size_t len)
{
    c->ep = ep;
    if (!reply_check_auth(c))
        return;
    if (ep == EP_CHAT && !json_array_size(c->m->queue) && !c->m->dflt &&
        reply_chat_fast(c, body, len))
        return;
    json_t *bj = behave_take(c->m);
    json_t *req = len ? json_loadb(body, len, 0, NULL) : NULL;
    json_t *mk = json_object_get(req, "mock");
    c->req_json = req;
    if (mk) {
        json_decref(bj);
        bj = json_incref(mk);
    }
    int status;
    if (reply_behave(c, bj, &status))
        return;
    if (!json_is_object(req)) {
        reply_error_json(c, 400, "invalid_request_error", "mock: the body is not a JSON object");
        return;
    }
    switch (ep) {
    case EP_CHAT:
    case EP_MESSAGES:
    case EP_RESPONSES:
        reply_chat(c, req, status);
        break;
    case EP_EMBEDDINGS:
        reply_embeddings(c, req, status);
        break;
    case EP_OCR:
        reply_ocr(c, req, status, len);
        break;
    case EP_GEMINI:
    case EP_GEMINI_STREAM:
    case EP_COUNT_TOKENS:
        reply_gemini(c, req, status, len);
        break;
    }
}

/* The value of query parameter `name` in q[0..qlen), or NULL (*vlen set). */
static const char *query_param(const char *q, size_t qlen, const char *name, size_t *vlen)
{
    size_t nl = strlen(name);

    for (const char *p = q, *end = q + qlen; p < end;) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        const char *e = amp ? amp : end;
        if ((size_t)(e - p) > nl && !memcmp(p, name, nl) && p[nl] == '=') {
            *vlen = (size_t)(e - p) - nl - 1;
            return p + nl + 1;
        }
        p = e + 1;
    }
    return NULL;
}

void reply_responses_resume(struct conn *c, const char *id, size_t idlen, const char *q,
                            size_t qlen)
{
    struct reply_stream *s = &c->st;
    size_t vlen = 0;
    const char *after = query_param(q, qlen, "starting_after", &vlen);
    char num[24];

    c->ep = EP_RESPONSES;
    if (!reply_check_auth(c))
        return;
    int status;
    if (reply_behave(c, behave_take(c->m), &status))
        return;
    if (idlen >= sizeof s->resume_id ||
        strspn(id,
               "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTU"
               "VWXYZ0123456789_-") < idlen) {
        reply_error(c, 404, "invalid_request_error", "mock: no such response");
        return;
    }
    if (after && (vlen == 0 || vlen >= sizeof num || strspn(after, "0123456789") < vlen)) {
        reply_error(c, 400, "invalid_request_error", "mock: starting_after must be a number");
        return;
    }
    const char *text = c->b.content ? c->b.content : "mock reply";
    size_t tlen = c->b.content ? c->b.content_len : 10;
    long long pt = 5, ct = tokens_of(tlen), tt;
    apply_usage(&c->b, &pt, &ct, &tt);
    s->active = true;
    s->responses = true;
    s->seq = 0;
    s->events = c->b.stream_events >= 0 ? c->b.stream_events : DEFAULT_STREAM_EVENTS;
    s->interval_ms = c->b.stream_interval_ms;
    s->model = "mock-model";
    s->model_len = 10;
    s->text = text;
    s->text_len = tlen;
    s->id = c->req_id;
    s->created = (long long)time(NULL);
    s->prompt_tokens = pt;
    s->completion_tokens = ct;
    s->total_tokens = tt;
    memcpy(s->resume_id, id, idlen);
    s->resume_id[idlen] = '\0';
    if (after) {
        memcpy(num, after, vlen);
        num[vlen] = '\0';
        s->skip_below = strtoll(num, NULL, 10) + 1;
    }
    reply_head(c, status, "text/event-stream", -1);
    conn_start_response(c);
}
