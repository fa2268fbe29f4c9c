/*
 * strbuf.c — the slow paths of strbuf.h.
 */
#include "strbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

void strbuf_init(struct strbuf *b)
{
    strbuf_init_max(b, 0);
}

void strbuf_init_max(struct strbuf *b, size_t max)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->off = 0;
    b->max = max;
}

void strbuf_fini(struct strbuf *b)
{
    free(b->data);
    strbuf_init_max(b, b->max);
}

void strbuf_reset(struct strbuf *b)
{
    b->len = 0;
    b->off = 0;
    if (b->data)
        b->data[0] = '\0';
}

/* Moves the live text to the front of data (the consumed prefix back). */
static void reclaim(struct strbuf *b)
{
    if (b->off == 0)
        return;
    memmove(b->data, b->data + b->off, b->len - b->off);
    b->len -= b->off;
    b->off = 0;
}

int strbuf_fit(struct strbuf *b)
{
    reclaim(b);
    if (!b->data || b->cap == b->len + 1)
        return 0;
    char *p = realloc(b->data, b->len + 1);
    if (!p)
        return STRBUF_ENOMEM;
    b->data = p;
    b->cap = b->len + 1;
    return 0;
}

int strbuf_set_exact(struct strbuf *b, const void *p, size_t n)
{
    if (n >= SIZE_MAX)
        return STRBUF_ENOMEM;
    if (b->max && n > b->max)
        return STRBUF_ETOOBIG;
    char *d = malloc(n + 1);
    if (!d)
        return STRBUF_ENOMEM;
    if (n)
        memcpy(d, p, n);
    d[n] = '\0';
    free(b->data);
    b->data = d;
    b->len = n;
    b->cap = n + 1;
    b->off = 0;
    return 0;
}

int strbuf_grow(struct strbuf *b, size_t extra)
{
    if (b->max && extra > b->max - (b->len - b->off))
        return STRBUF_ETOOBIG;
    reclaim(b);
    if (b->cap - b->len > extra) /* the consumed prefix made the room */
        return 0;
    if (extra > SIZE_MAX / 2 - b->len)
        return STRBUF_ENOMEM;
    size_t need = b->len + extra + 1; /* +1: room for the closing NUL */
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < need)
        cap *= 2;
    if (b->max && cap > b->max + 1) /* never room past the cap */
        cap = b->max + 1;
    char *p = realloc(b->data, cap);
    if (!p)
        return STRBUF_ENOMEM;
    b->data = p;
    b->cap = cap;
    return 0;
}

void str_setf(char *dst, size_t cap, const char *fmt, ...)
{
    va_list ap;

    if (!dst || cap == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(dst, cap, fmt, ap);
    va_end(ap);
}
