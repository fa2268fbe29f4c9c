/*
 * buf.c — the mock's use of lib/strbuf (out of memory aborts: see main.c)
 * and its JSON string escaping.
 */
#include "internal.h"

#include "jsonw.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *mock_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "mock_upstream: out of memory (%zu bytes)\n", n);
        abort();
    }
    return q;
}

char *mock_xstrndup(const char *s, size_t n)
{
    char *d = mock_xrealloc(NULL, n + 1);
    if (n)
        memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

static void buf_oom(size_t extra)
{
    fprintf(stderr, "mock_upstream: out of memory (%zu more bytes)\n", extra);
    abort();
}

void buf_reserve(struct strbuf *b, size_t extra)
{
    if (strbuf_reserve(b, extra) < 0)
        buf_oom(extra);
}

void buf_add(struct strbuf *b, const void *p, size_t n)
{
    if (strbuf_put(b, p, n) < 0)
        buf_oom(n);
}

void buf_adds(struct strbuf *b, const char *s)
{
    buf_add(b, s, strlen(s));
}

void buf_addf(struct strbuf *b, const char *fmt, ...)
{
    va_list ap;
    buf_reserve(b, 64);
    va_start(ap, fmt);
    int n = vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= b->cap - b->len) {
        buf_reserve(b, (size_t)n + 1);
        va_start(ap, fmt);
        vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

void buf_add_ll(struct strbuf *b, long long v)
{
    if (jsonw_i64(b, v) < 0)
        buf_oom(20);
}

void buf_add_json_str(struct strbuf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    buf_reserve(b, n + 2);
    b->data[b->len++] = '"';
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x20 && ch != '"' && ch != '\\')
            continue;
        buf_add(b, s + run, i - run);
        run = i + 1;
        char esc[6] = { '\\', 0, 0, 0, 0, 0 };
        size_t elen = 2;
        switch (ch) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = hex[ch >> 4];
            esc[5] = hex[ch & 15];
            elen = 6;
        }
        buf_add(b, esc, elen);
    }
    buf_add(b, s + run, n - run);
    buf_add(b, "\"", 1);
}

void buf_trim(struct strbuf *b, size_t keep_cap)
{
    if (b->cap > keep_cap)
        strbuf_fini(b);
    b->len = 0;
}

void buf_fini(struct strbuf *b)
{
    strbuf_fini(b);
}
