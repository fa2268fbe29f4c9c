/*
 * buf.c — growable byte buffers and JSON string escaping for the mock.
 */
#include "internal.h"

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

void buf_reserve(struct buf *b, size_t extra)
{
    if (b->cap - b->len >= extra && b->p)
        return;
    size_t need = b->len + extra;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap *= 2;
    b->p = mock_xrealloc(b->p, cap);
    b->cap = cap;
}

void buf_add(struct buf *b, const void *p, size_t n)
{
    if (!n)
        return;
    buf_reserve(b, n);
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

void buf_adds(struct buf *b, const char *s)
{
    buf_add(b, s, strlen(s));
}

void buf_addf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    buf_reserve(b, 64);
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= b->cap - b->len) {
        buf_reserve(b, (size_t)n + 1);
        va_start(ap, fmt);
        vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

void buf_add_ll(struct buf *b, long long v)
{
    char tmp[24];
    char *e = tmp + sizeof tmp, *q = e;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        *--q = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--q = '-';
    buf_add(b, q, (size_t)(e - q));
}

void buf_add_json_str(struct buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    buf_reserve(b, n + 2);
    b->p[b->len++] = '"';
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
        case '"':
            esc[1] = '"';
            break;
        case '\\':
            esc[1] = '\\';
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
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

int buf_hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

void buf_add_hex(struct buf *b, const char *hex, size_t n)
{
    buf_reserve(b, n / 2);
    for (size_t i = 0; i + 1 < n; i += 2)
        b->p[b->len++] = (char)(buf_hexval(hex[i]) << 4 | buf_hexval(hex[i + 1]));
}

void buf_trim(struct buf *b, size_t keep_cap)
{
    if (b->cap > keep_cap) {
        free(b->p);
        b->p = NULL;
        b->cap = 0;
    }
    b->len = 0;
}

void buf_fini(struct buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}
