/*
 * httpreq.c — reading HTTP/1.1 requests (see httpreq.h).
 *
 * The scan of the head runs over every byte of the head before the parser
 * gets it: httpreq_execute() scans all the input it is given up to the
 * head's end, then lets http_parser parse it. So a head the scan refuses
 * never reaches the head hook, whatever the reads that brought it. The
 * scan starts again where the parser says a request ended (it pauses at
 * each request's end), so it never mistakes a body for a head.
 */
#include "httpreq.h"
#include "iplit.h"

#include <arpa/inet.h>
#include <limits.h>
#include <netinet/in.h>
#include <string.h>
#include <strings.h>

/* Each with its length, which every header line of every request is
 * compared to first. */
#define HDR(name)              \
    {                          \
        name, sizeof(name) - 1 \
    }
static const struct {
    const char *name;
    size_t len;
} hdrs[HRQ_COUNT] = {
    HDR("content-type"),
    HDR("expect"),
    HDR("x-polygw-task"),
    HDR("x-polygw-deadline"),
    HDR("x-polygw-scope"),
    HDR("x-polygw-sdk-retry"),
    HDR("x-polygw-app"),
    HDR("authorization"),
    HDR("host"),
    HDR("origin"),
    HDR("sec-fetch-site"),
    HDR("sec-fetch-mode"),
    HDR("x-polygw-budget"),
    HDR("traceparent"),
    HDR("tracestate"),
    HDR("cache-control"),
    HDR("anthropic-beta"),
};

const char *httpreq_hdr_name(enum httpreq_hdr h)
{
    return h > HRQ_NONE && h < HRQ_COUNT ? hdrs[h].name : "";
}

/* ------------------------------------------------------------------ */
/* The scan of the head                                                */

/* RFC 9110 §5.6.2 tchar. */
static bool is_tchar(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
        (ch != 0 && strchr("!#$%&'*+-.^_`|~", ch) != NULL);
}

/* One byte of the head: NULL, or why the head is refused. */
static const char *scan_byte(struct httpreq *r, unsigned char ch)
{
    switch (r->scan) {
    case HRQ_SCAN_START: /* empty lines before a request are skipped (RFC 9112 §2.2) */
        if (ch != '\r' && ch != '\n')
            r->scan = HRQ_SCAN_LINE;
        return NULL;
    case HRQ_SCAN_LINE:
        r->scan = ch == '\r' ? HRQ_SCAN_LINE_CR : ch == '\n' ? HRQ_SCAN_BOL : HRQ_SCAN_LINE;
        return NULL;
    case HRQ_SCAN_LINE_CR:
    case HRQ_SCAN_VALUE_CR:
        if (ch != '\n')
            return "a CR not followed by LF";
        r->scan = HRQ_SCAN_BOL;
        return NULL;
    case HRQ_SCAN_BOL:
        if (ch == '\r') {
            r->scan = HRQ_SCAN_END_CR;
        } else if (ch == '\n') {
            r->scan = HRQ_SCAN_DONE;
        } else if (ch == ' ' || ch == '\t') {
            return "a header line folded onto the previous one (obs-fold)";
        } else if (is_tchar(ch)) {
            r->scan = HRQ_SCAN_NAME;
        } else {
            return ch == ':' ? "an empty header name"
                             : "a header name holds a byte that is not a token character";
        }
        return NULL;
    case HRQ_SCAN_NAME:
        if (ch == ':')
            r->scan = HRQ_SCAN_VALUE;
        else if (ch == ' ' || ch == '\t')
            return "whitespace between a header name and its colon";
        else if (ch == '\r' || ch == '\n')
            return "a header line without a colon";
        else if (!is_tchar(ch))
            return "a header name holds a byte that is not a token character";
        return NULL;
    case HRQ_SCAN_VALUE:
        r->scan = ch == '\r' ? HRQ_SCAN_VALUE_CR : ch == '\n' ? HRQ_SCAN_BOL : HRQ_SCAN_VALUE;
        return NULL;
    case HRQ_SCAN_END_CR:
        if (ch != '\n')
            return "a CR not followed by LF";
        r->scan = HRQ_SCAN_DONE;
        return NULL;
    case HRQ_SCAN_DONE:
        break;
    }
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Parser callbacks                                                    */

static int count_header(struct httpreq *r, size_t n)
{
    r->header_bytes += n;
    if (r->header_bytes > r->max_header_bytes) {
        r->status = 431;
        return -1;
    }
    return 0;
}

static int on_message_begin(http_parser *p)
{
    struct httpreq *r = p->data;

    memset(r->present, 0, sizeof(r->present));
    memset(r->val_len, 0, sizeof(r->val_len));
    memset(r->val_over, 0, sizeof(r->val_over));
    r->url_len = 0;
    r->url_over = false;
    r->field_len = 0;
    r->field_over = false;
    r->in_value = false;
    r->head_done = false;
    r->stop = false;
    r->cur = HRQ_NONE;
    r->over = HRQ_NONE;
    r->auth_over = false;
    r->header_bytes = 0;
    r->body_len = 0;
    r->status = 0;
    r->why = NULL;
    r->ops->begin(r);
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t n)
{
    struct httpreq *r = p->data;

    if (count_header(r, n) < 0)
        return -1;
    if (r->url_len + n > HTTPREQ_URL_MAX) {
        r->url_over = true;
        return 0;
    }
    memcpy(r->url + r->url_len, at, n);
    r->url_len += n;
    return 0;
}

/* The value of a header of ours is complete: its trailing spaces and tabs
 * are not part of it (RFC 9110 §5.5; http_parser skips the leading ones),
 * nor is an empty repeat of a list (its "," taken back). */
static void value_end(struct httpreq *r)
{
    r->in_value = false;
    if (r->cur == HRQ_NONE || r->val_over[r->cur])
        return;
    size_t n = r->val_len[r->cur];
    while (n > r->val_from && (r->val[r->cur][n - 1] == ' ' || r->val[r->cur][n - 1] == '\t'))
        n--;
    if (n == r->val_from && n > 0 && r->val[r->cur][n - 1] == ',')
        n--;
    r->val_len[r->cur] = n;
}

/* Trailers (header lines after a chunked body) are counted and dropped. */
static int on_header_field(http_parser *p, const char *at, size_t n)
{
    struct httpreq *r = p->data;

    if (count_header(r, n) < 0)
        return -1;
    if (r->head_done)
        return 0;
    if (r->in_value) {
        value_end(r);
        r->field_len = 0;
        r->field_over = false;
    }
    if (r->field_len + n >= sizeof(r->field)) {
        r->field_over = true;
        return 0;
    }
    memcpy(r->field + r->field_len, at, n);
    r->field_len += n;
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
    struct httpreq *r = p->data;

    if (count_header(r, n) < 0)
        return -1;
    if (r->head_done)
        return 0;
    if (!r->in_value) {
        r->in_value = true;
        r->cur = HRQ_NONE;
        for (int i = 0; !r->field_over && i < HRQ_COUNT; i++) {
            if (hdrs[i].len == r->field_len &&
                strncasecmp(r->field, hdrs[i].name, r->field_len) == 0) {
                r->cur = (enum httpreq_hdr)i;
                if (i == HRQ_TRACESTATE && r->present[i]) {
                    /* A list sent in several lines: one list, joined by
                     * "," (RFC 9110 §5.3); too long in all: none. */
                    if (!r->val_over[i] && r->val_len[i]) {
                        if (r->val_len[i] + 1 > HTTPREQ_VAL_MAX) {
                            r->val_over[i] = true;
                            r->val_len[i] = 0;
                        } else {
                            r->val[i][r->val_len[i]++] = ',';
                        }
                    }
                    r->val_from = r->val_len[i];
                    break;
                }
                /* A repeated header of ours: the last one wins, whole. */
                r->val_len[i] = 0;
                r->val_from = 0;
                r->val_over[i] = false;
                r->present[i] = true;
                break;
            }
        }
    }
    if (r->cur == HRQ_NONE || r->val_over[r->cur])
        return 0;
    if (r->val_len[r->cur] + n > HTTPREQ_VAL_MAX) {
        /* Nothing of it is kept, however the reads cut it. */
        r->val_over[r->cur] = true;
        r->val_len[r->cur] = 0;
        return 0;
    }
    memcpy(r->val[r->cur] + r->val_len[r->cur], at, n);
    r->val_len[r->cur] += n;
    return 0;
}

static int on_headers_complete(http_parser *p)
{
    struct httpreq *r = p->data;

    if (r->in_value)
        value_end(r);
    for (int i = HRQ_COUNT - 1; i >= 0; i--) {
        r->val[i][r->val_len[i]] = '\0';
        if (r->val_over[i] && i != HRQ_AUTH && i != HRQ_TRACESTATE && i != HRQ_CACHE_CONTROL)
            r->over = (enum httpreq_hdr)i;
    }
    r->auth_over = r->val_over[HRQ_AUTH];
    r->url[r->url_len] = '\0';
    r->head_done = true;
    if (r->url_over) {
        r->status = 414;
        return -1;
    }
    if (!(p->flags & F_CHUNKED) && p->content_length != ULLONG_MAX &&
        p->content_length > r->max_body_bytes) {
        r->status = 413;
        return -1;
    }
    int rc = r->ops->head(r);
    if (rc == 1)
        r->stop = true;
    return rc == 0 ? 0 : -1;
}

static int on_body(http_parser *p, const char *at, size_t n)
{
    struct httpreq *r = p->data;

    if (r->body_len + n > r->max_body_bytes) {
        r->status = 413;
        return -1;
    }
    r->body_len += n;
    return r->ops->body(r, at, n) < 0 ? -1 : 0;
}

static int on_message_complete(http_parser *p)
{
    struct httpreq *r = p->data;

    /* The next request's head starts after this byte: scan it anew. */
    r->scan = HRQ_SCAN_START;
    r->scanned = 0;
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* ------------------------------------------------------------------ */

void httpreq_init(struct httpreq *r, const struct httpreq_ops *ops, void *owner)
{
    memset(r, 0, sizeof(*r));
    http_parser_init(&r->parser, HTTP_REQUEST);
    r->parser.data = r;
    r->ops = ops;
    r->owner = owner;
    r->over = HRQ_NONE;
    r->cur = HRQ_NONE;
    r->scan = HRQ_SCAN_START;
}

enum httpreq_rc httpreq_execute(struct httpreq *r, const char *data, size_t n, size_t *used)
{
    *used = 0;
    if (r->scan != HRQ_SCAN_DONE) {
        size_t i = r->scanned;
        for (; i < n && r->scan != HRQ_SCAN_DONE; i++) {
            const char *why = scan_byte(r, (unsigned char)data[i]);
            if (why) {
                r->status = 400;
                r->why = why;
                return HTTPREQ_FAIL;
            }
        }
        r->scanned = i;
    }
    size_t k = http_parser_execute(&r->parser, &settings, data, n);
    enum http_errno e = HTTP_PARSER_ERRNO(&r->parser);

    *used = k;
    r->scanned = r->scanned > k ? r->scanned - k : 0;
    if (e == HPE_PAUSED) {
        http_parser_pause(&r->parser, 0);
        return HTTPREQ_DONE;
    }
    if (r->stop)
        return HTTPREQ_STOP;
    if (e != HPE_OK) {
        if (!r->status)
            r->status = e == HPE_HEADER_OVERFLOW ? 431 : 400;
        if (r->status == 400 && !r->why)
            r->why = http_errno_description(e);
        return HTTPREQ_FAIL;
    }
    return HTTPREQ_MORE;
}

bool httpreq_keep_alive(const struct httpreq *r)
{
    return http_should_keep_alive(&r->parser) != 0;
}

bool httpreq_has_body(const struct httpreq *r)
{
    const http_parser *p = &r->parser;
    return (p->flags & F_CHUNKED) || (p->content_length != ULLONG_MAX && p->content_length > 0);
}

bool httpreq_ctype_is_json(const struct httpreq *r)
{
    static const char json[] = "application/json";
    const char *v = r->val[HRQ_CTYPE];
    size_t n = sizeof(json) - 1;

    if (!r->present[HRQ_CTYPE])
        return false;
    while (*v == ' ' || *v == '\t')
        v++;
    return strncasecmp(v, json, n) == 0 &&
        (v[n] == '\0' || v[n] == ';' || v[n] == ' ' || v[n] == '\t');
}

/* ------------------------------------------------------------------ */
/* Where a request comes from                                          */

/* `n` bytes at `s` equal `word`, whatever the case. */
static bool word_is(const char *s, size_t n, const char *word)
{
    return strlen(word) == n && strncasecmp(s, word, n) == 0;
}

static bool in_list(const char *s, size_t n, const char *const *list, size_t count)
{
    for (size_t i = 0; i < count; i++)
        if (word_is(s, n, list[i]))
            return true;
    return false;
}

/* A Host value this front answers to: an IP address (a page can only have
 * an address as its origin when it was loaded from that address, so no
 * name was rebound), `localhost`, or a name of site->hosts; with or without
 * a port. Empty (a target without authority) is no browser's. */
static bool host_allowed(const char *v, size_t n, const struct httpreq_site *site)
{
    const char *port; /* v + n when there is none */

    if (n == 0)
        return true;
    if (v[0] == '[') {
        const char *end = memchr(v, ']', n);
        if (!end || !iplit_parse(v, (size_t)(end - v + 1), IPLIT_V6 | IPLIT_BRACKETS, NULL))
            return false;
        port = end + 1;
    } else {
        const char *colon = memchr(v, ':', n);
        size_t len = colon ? (size_t)(colon - v) : n;
        if (len == 0)
            return false;
        if (!iplit_parse(v, len, IPLIT_V4, NULL) && !word_is(v, len, "localhost") &&
            !in_list(v, len, site->hosts, site->n_hosts))
            return false;
        port = v + len;
    }
    if (port == v + n)
        return true;
    /* ":" and 1 to 5 digits. */
    size_t digits = (size_t)(v + n - port) - 1;
    if (*port != ':' || digits == 0 || digits > 5)
        return false;
    for (size_t i = 1; i <= digits; i++)
        if (port[i] < '0' || port[i] > '9')
            return false;
    return true;
}

/* The Origin is the front's own: http:// or https:// and the Host the
 * request was sent to (checked by host_allowed on TCP). */
static bool origin_is_own(const struct httpreq *r)
{
    const char *o = r->val[HRQ_ORIGIN];
    size_t n = r->val_len[HRQ_ORIGIN];
    size_t skip = n > 7 && strncasecmp(o, "http://", 7) == 0 ? 7
        : n > 8 && strncasecmp(o, "https://", 8) == 0        ? 8
                                                             : 0;

    return skip && r->present[HRQ_HOST] && r->val_len[HRQ_HOST] > 0 &&
        word_is(o + skip, n - skip, r->val[HRQ_HOST]);
}

enum httpreq_site_rc httpreq_check_site(const struct httpreq *r, const struct httpreq_site *site,
                                        const char **why)
{
    if (site->check_host && r->present[HRQ_HOST] &&
        !host_allowed(r->val[HRQ_HOST], r->val_len[HRQ_HOST], site)) {
        *why = "Host is not an IP address, localhost or a name of http.allowed_hosts";
        return HTTPREQ_SITE_REFUSED;
    }
    if (r->present[HRQ_ORIGIN]) {
        if (origin_is_own(r))
            return HTTPREQ_SITE_OWN;
        if (in_list(r->val[HRQ_ORIGIN], r->val_len[HRQ_ORIGIN], site->origins, site->n_origins))
            return HTTPREQ_SITE_ALLOWED;
        *why = "Origin is neither this front's own nor in http.allowed_origins";
        return HTTPREQ_SITE_REFUSED;
    }
    /* A browser that sends no Origin still says where the request comes
     * from. Following a link to the front (a top-level GET navigation) is
     * not a page calling it. */
    const char *site_v = r->val[HRQ_FETCH_SITE];
    size_t site_n = r->val_len[HRQ_FETCH_SITE];
    if (r->present[HRQ_FETCH_SITE] &&
        (word_is(site_v, site_n, "cross-site") || word_is(site_v, site_n, "same-site")) &&
        !(r->parser.method == HTTP_GET && r->present[HRQ_FETCH_MODE] &&
          word_is(r->val[HRQ_FETCH_MODE], r->val_len[HRQ_FETCH_MODE], "navigate"))) {
        *why = "Sec-Fetch-Site says the request comes from a page of another site";
        return HTTPREQ_SITE_REFUSED;
    }
    return HTTPREQ_SITE_OWN;
}
