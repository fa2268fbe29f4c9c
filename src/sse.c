/* sse.c — incremental Server-Sent Events parser (see sse.h for the rules). */
#include "sse.h"

#include <stdlib.h>
#include <string.h>

#define SSE_BUF_MIN  128
/* An empty buffer larger than this is freed rather than kept: one large
 * event must not cost its size for the rest of a long stream. */
#define SSE_BUF_KEEP (64 * 1024)

static const unsigned char sse_bom[3] = { 0xEF, 0xBB, 0xBF };

int sse_parser_init(struct sse_parser *p, size_t max_event_bytes)
{
    memset(p, 0, sizeof(*p));
    p->retry_ms = -1;
    if (max_event_bytes == 0) {
        p->error = SSE_EINVAL;
        return SSE_EINVAL;
    }
    p->max_event_bytes = max_event_bytes;
    return 0;
}

void sse_parser_fini(struct sse_parser *p)
{
    free(p->line.p);
    free(p->data.p);
    free(p->event.p);
    free(p->id.p);
    memset(&p->line, 0, sizeof(p->line));
    memset(&p->data, 0, sizeof(p->data));
    memset(&p->event, 0, sizeof(p->event));
    memset(&p->id, 0, sizeof(p->id));
}

const char *sse_strerror(int err)
{
    switch (err) {
    case SSE_EINVAL:
        return "invalid argument";
    case SSE_ETOO_LARGE:
        return "event stream line or event exceeds the size limit";
    case SSE_ENOMEM:
        return "out of memory";
    case SSE_EABORTED:
        return "event stream parsing aborted by the caller";
    default:
        return "unknown sse error";
    }
}

/* Appends n bytes and keeps the buffer NUL-terminated. Callers have already
 * bounded len + n by max_event_bytes, so the sum cannot overflow. */
static int buf_append(struct sse_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : SSE_BUF_MIN;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (np == NULL)
            return SSE_ENOMEM;
        b->p = np;
        b->cap = cap;
    }
    if (n > 0)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

/* Empties the buffer, giving its memory back when it grew large. */
static void buf_clear(struct sse_buf *b)
{
    b->len = 0;
    if (b->cap > SSE_BUF_KEEP) {
        free(b->p);
        b->p = NULL;
        b->cap = 0;
    }
}

static int buf_set(struct sse_buf *b, const char *s, size_t n)
{
    b->len = 0;
    return buf_append(b, s, n);
}

static bool field_is(const char *f, size_t flen, const char *name)
{
    size_t n = strlen(name);
    return flen == n && memcmp(f, name, n) == 0;
}

/* The data_len the pending event would be dispatched with. */
static size_t pending_data_len(const struct sse_parser *p)
{
    return p->data.len ? p->data.len - 1 : 0;
}

static int dispatch(struct sse_parser *p, sse_event_fn *cb, void *ud)
{
    struct sse_event ev;
    int rc = 0;

    p->block_open = false;
    if (p->data.len == 0) {
        buf_clear(&p->event);
        return 0;
    }
    p->data.len--; /* the '\n' after the last data line */
    p->data.p[p->data.len] = '\0';
    if (p->event.len > 0) {
        ev.event = p->event.p;
        ev.event_len = p->event.len;
    } else {
        ev.event = "message";
        ev.event_len = 7;
    }
    ev.data = p->data.p;
    ev.data_len = p->data.len;
    ev.id = p->id.len > 0 ? p->id.p : "";
    ev.id_len = p->id.len;
    ev.retry_ms = p->retry_ms;
    if (cb != NULL)
        rc = cb(&ev, ud);
    buf_clear(&p->data);
    buf_clear(&p->event);
    return rc;
}

/* A `retry` value: only ASCII digits (at least one), saturating. */
static void set_retry(struct sse_parser *p, const char *v, size_t n)
{
    int64_t ms = 0;

    if (n == 0)
        return;
    for (size_t i = 0; i < n; i++)
        if (v[i] < '0' || v[i] > '9')
            return;
    for (size_t i = 0; i < n; i++) {
        int d = v[i] - '0';
        if (ms > (INT64_MAX - d) / 10) {
            ms = INT64_MAX;
            break;
        }
        ms = ms * 10 + d;
    }
    p->retry_ms = ms;
}

/* One complete line (terminator removed). Returns 0, SSE_E*, or the
 * callback's non-zero value (the caller tells them apart by p->error). */
static int process_line(struct sse_parser *p, const char *line, size_t len, sse_event_fn *cb,
                        void *ud)
{
    const char *value = "";
    size_t flen = len, vlen = 0;
    const char *colon;

    if (len == 0)
        return dispatch(p, cb, ud);
    if (line[0] == ':')
        return 0;
    colon = memchr(line, ':', len);
    if (colon != NULL) {
        flen = (size_t)(colon - line);
        value = colon + 1;
        vlen = len - flen - 1;
        if (vlen > 0 && value[0] == ' ') {
            value++;
            vlen--;
        }
    }
    p->block_open = true;

    if (field_is(line, flen, "data")) {
        /* After this line the event would be dispatched with
         * data_len = data.len + vlen (the new '\n' is the removable one). */
        if (p->data.len + vlen + p->event.len > p->max_event_bytes)
            return SSE_ETOO_LARGE;
        if (buf_append(&p->data, value, vlen) < 0 || buf_append(&p->data, "\n", 1) < 0)
            return SSE_ENOMEM;
    } else if (field_is(line, flen, "event")) {
        if (vlen + pending_data_len(p) > p->max_event_bytes)
            return SSE_ETOO_LARGE;
        if (buf_set(&p->event, value, vlen) < 0)
            return SSE_ENOMEM;
    } else if (field_is(line, flen, "id")) {
        if (memchr(value, '\0', vlen) == NULL && buf_set(&p->id, value, vlen) < 0)
            return SSE_ENOMEM;
    } else if (field_is(line, flen, "retry")) {
        set_retry(p, value, vlen);
    }
    return 0;
}

/* Splits `s` into lines. An unterminated tail goes to p->line; a line
 * wholly inside `s` with nothing buffered before it is parsed in place. */
static int scan(struct sse_parser *p, const char *s, size_t n, sse_event_fn *cb, void *ud)
{
    size_t i = 0;

    if (p->after_cr && n > 0) {
        p->after_cr = false;
        if (s[0] == '\n')
            i = 1;
    }
    while (i < n) {
        const char *start = s + i;
        size_t rem = n - i, k = 0;
        const char *line;
        size_t llen;
        int rc;

        while (k < rem && start[k] != '\n' && start[k] != '\r')
            k++;
        if (p->line.len + k > p->max_event_bytes)
            return SSE_ETOO_LARGE;
        if (k == rem) {
            if (buf_append(&p->line, start, k) < 0)
                return SSE_ENOMEM;
            return 0;
        }
        if (p->line.len == 0) {
            line = start;
            llen = k;
        } else {
            if (buf_append(&p->line, start, k) < 0)
                return SSE_ENOMEM;
            line = p->line.p;
            llen = p->line.len;
        }
        i += k + 1;
        if (start[k] == '\r') {
            if (i < n) {
                if (s[i] == '\n')
                    i++;
            } else {
                p->after_cr = true;
            }
        }
        rc = process_line(p, line, llen, cb, ud);
        buf_clear(&p->line);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Marks the parser failed. Internal errors stick as themselves; a callback's
 * value is returned once and SSE_EABORTED sticks. */
static int fail(struct sse_parser *p, int rc)
{
    bool internal = rc == SSE_ETOO_LARGE || rc == SSE_ENOMEM;

    p->error = internal ? rc : SSE_EABORTED;
    return rc;
}

int sse_parser_feed(struct sse_parser *p, const char *data, size_t len, sse_event_fn *cb, void *ud)
{
    size_t i = 0;
    int rc;

    if (p->error != 0)
        return p->error;
    /* The stream-start BOM check may straddle feeds: matched bytes are held
     * back in bom_matched and replayed as ordinary bytes on a mismatch. */
    while (!p->bom_done && i < len) {
        if ((unsigned char)data[i] == sse_bom[p->bom_matched]) {
            i++;
            if (++p->bom_matched == sizeof(sse_bom))
                p->bom_done = true;
            continue;
        }
        p->bom_done = true;
        if (p->bom_matched > 0) {
            rc = scan(p, (const char *)sse_bom, p->bom_matched, cb, ud);
            if (rc != 0)
                return fail(p, rc);
        }
    }
    if (i < len) {
        rc = scan(p, data + i, len - i, cb, ud);
        if (rc != 0)
            return fail(p, rc);
    }
    return 0;
}

bool sse_parser_is_idle(const struct sse_parser *p)
{
    /* Held-back BOM bytes that may yet turn out to be a line's start. */
    if (!p->bom_done && p->bom_matched > 0)
        return false;
    return p->line.len == 0 && !p->block_open;
}

size_t sse_parser_buffered(const struct sse_parser *p)
{
    return p->line.len + p->data.len + p->event.len;
}

bool sse_data_is_done(const struct sse_event *ev)
{
    const char *s = ev->data;
    size_t n = ev->data_len;

    while (n > 0 && (s[0] == ' ' || s[0] == '\t')) {
        s++;
        n--;
    }
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    return n == 6 && memcmp(s, "[DONE]", 6) == 0;
}
