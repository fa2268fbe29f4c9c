/*
 * httpreq.h — reading HTTP/1.1 requests for the HTTP front end (http.c):
 * Node's http_parser (Debian's libhttp-parser 2.9) over the bytes a
 * connection received, made strict where that parser is lenient, keeping
 * the request target and the values of the headers the front reads. No
 * socket and no loop: http.c drives it over a connection's input, and
 * tests/fuzz/fuzz_http_request.c over arbitrary bytes.
 *
 * What it adds to http_parser:
 *   - the head (request line and header lines) is scanned as it arrives,
 *     before the parser sees it, and refused (400) when a header name is
 *     not a token directly followed by its colon (`Content-Length : 5`),
 *     a line is folded onto the previous one (obs-fold: a line starting
 *     with a space or a tab), or a CR is not followed by LF: RFC 9112
 *     §5.1, §5.2 and §2.2, which http_parser 2.9 lets through;
 *   - chunked trailers are dropped: they never become headers;
 *   - the request line and headers are bounded by max_header_bytes (431),
 *     the target by HTTPREQ_URL_MAX (414), a Content-Length or a chunked
 *     body by max_body_bytes (413, at the headers when the length is
 *     announced).
 *
 * The checks of where a request comes from (Host, Origin, Sec-Fetch-Site:
 * docs/HTTP.md section 8) read only the request's headers: they are here
 * too (httpreq_check_site).
 */
#ifndef POLYGW_HTTPREQ_H
#define POLYGW_HTTPREQ_H

#include <http_parser.h>
#include <stdbool.h>
#include <stddef.h>

#define HTTPREQ_URL_MAX 2048 /* longer request targets get 414 */
#define HTTPREQ_VAL_MAX 256  /* longest value kept of a header we read */

/* The request headers polygw reads; every other one is only counted. */
enum httpreq_hdr {
    HRQ_NONE = -1,
    HRQ_CTYPE,
    HRQ_EXPECT,
    HRQ_TASK,
    HRQ_DEADLINE,
    HRQ_SCOPE,
    HRQ_SDK_RETRY,
    HRQ_APP,
    HRQ_AUTH, /* a secret: only compared (http.c hc_identify) */
    HRQ_HOST,
    HRQ_ORIGIN,
    HRQ_FETCH_SITE,     /* Sec-Fetch-Site */
    HRQ_FETCH_MODE,     /* Sec-Fetch-Mode */
    HRQ_BUDGET,         /* X-Polygw-Budget: a task start's budget */
    HRQ_TRACEPARENT,    /* W3C trace context (calltrace.h) */
    HRQ_TRACESTATE,     /* longer than HTTPREQ_VAL_MAX: dropped, never refused */
    HRQ_CACHE_CONTROL,  /* longer than HTTPREQ_VAL_MAX: ignored, never refused */
    HRQ_ANTHROPIC_BETA, /* passed on to kind: anthropic sources (call_req) */
    HRQ_COUNT
};

struct httpreq;

/* What the owner does with a request while it is read. */
struct httpreq_ops {
    /* A request's first byte (leading empty lines skipped). */
    void (*begin)(struct httpreq *r);
    /* The head is complete and within the bounds: the target and the
     * values are set. Returns 0 to read the body, 1 to stop reading here
     * (the owner answered and closes: httpreq_execute returns
     * HTTPREQ_STOP), or -1 to refuse the input with r->status set. */
    int (*head)(struct httpreq *r);
    /* `n` bytes of the body, chunked framing removed (already counted in
     * r->body_len). Returns 0, or -1 to refuse with r->status set. */
    int (*body)(struct httpreq *r, const char *at, size_t n);
};

/* The scan of the head, ahead of the parser (httpreq.c). */
enum httpreq_scan {
    HRQ_SCAN_START,
    HRQ_SCAN_LINE,
    HRQ_SCAN_LINE_CR,
    HRQ_SCAN_BOL,
    HRQ_SCAN_NAME,
    HRQ_SCAN_VALUE,
    HRQ_SCAN_VALUE_CR,
    HRQ_SCAN_END_CR,
    HRQ_SCAN_DONE
};

struct httpreq {
    http_parser parser; /* method, version, flags, content_length */
    const struct httpreq_ops *ops;
    void *owner;
    size_t max_header_bytes; /* the owner sets both (they may change between requests) */
    size_t max_body_bytes;
    /* The request being read: set when the head hook runs, until the next
     * request begins. Values are NUL-terminated, without the spaces and
     * tabs around them; a repeated header of ours
     * keeps its last value, but for tracestate's lines, joined by ",". */
    char url[HTTPREQ_URL_MAX + 1];
    size_t url_len;
    char val[HRQ_COUNT][HTTPREQ_VAL_MAX + 1];
    size_t val_len[HRQ_COUNT];
    bool present[HRQ_COUNT];
    enum httpreq_hdr over; /* a header of ours longer than HTTPREQ_VAL_MAX (its value
                            * is empty), or HRQ_NONE; an Authorization that long
                            * only sets auth_over */
    bool auth_over;
    size_t body_len; /* body bytes read so far */
    int status;      /* HTTPREQ_FAIL: 400, 413, 414, 431, or what a hook set */
    const char *why; /* HTTPREQ_FAIL with 400: what was wrong (static text) */
    /* Private. */
    bool url_over;
    char field[24]; /* the header name being read (longer names are not ours) */
    size_t field_len;
    bool field_over, in_value, head_done, stop;
    enum httpreq_hdr cur;
    size_t val_from;          /* where the current line's value starts in val[cur] */
    bool val_over[HRQ_COUNT]; /* longer than HTTPREQ_VAL_MAX: nothing of it is kept */
    size_t header_bytes;
    enum httpreq_scan scan;
    size_t scanned; /* bytes of the pending input the scan has seen already */
};

enum httpreq_rc {
    HTTPREQ_MORE, /* all the bytes used; the request is not complete */
    HTTPREQ_DONE, /* a request is complete */
    HTTPREQ_STOP, /* the head hook stopped the reading */
    HTTPREQ_FAIL  /* the input is refused (r->status): nothing more can be read */
};

void httpreq_init(struct httpreq *r, const struct httpreq_ops *ops, void *owner);

/* Reads data[0..n), calling the hooks, and says how many bytes it used in
 * *used. After HTTPREQ_DONE the next request starts at data[*used]: call
 * again from there (once the request is answered). Bytes not used must be
 * given again, first, in the next call. */
enum httpreq_rc httpreq_execute(struct httpreq *r, const char *data, size_t n, size_t *used);

/* The name of header `h`, lower case. */
const char *httpreq_hdr_name(enum httpreq_hdr h);

/* Once the head is read: may the connection carry another request after
 * this one? Does the request announce a body (a Content-Length above 0,
 * or chunked)? */
bool httpreq_keep_alive(const struct httpreq *r);
bool httpreq_has_body(const struct httpreq *r);

/* True for a Content-Type of application/json, with or without
 * parameters (`; charset=utf-8`). */
bool httpreq_ctype_is_json(const struct httpreq *r);

/* Where requests may come from (docs/HTTP.md section 8). */
struct httpreq_site {
    bool check_host;            /* a TCP listener: Host is checked */
    const char *const *origins; /* http.allowed_origins */
    size_t n_origins;
    const char *const *hosts; /* http.allowed_hosts */
    size_t n_hosts;
};

enum httpreq_site_rc {
    HTTPREQ_SITE_OWN = 0,     /* from no other origin: no Origin, or the front's own */
    HTTPREQ_SITE_ALLOWED = 1, /* from an origin of site->origins: answers carry CORS headers */
    HTTPREQ_SITE_REFUSED = -1 /* from a browser page of another origin, or a Host that is
                               * not this front's: refuse with 403 */
};

/* Checks a request's Host, Origin and Sec-Fetch-* headers against `site`.
 * HTTPREQ_SITE_REFUSED comes with the reason in *why (static text, which
 * names the header; the owner may quote its value). */
enum httpreq_site_rc httpreq_check_site(const struct httpreq *r, const struct httpreq_site *site,
                                        const char **why);

#endif /* POLYGW_HTTPREQ_H */
