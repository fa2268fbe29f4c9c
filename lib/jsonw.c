/*
 * jsonw.c — jsonw.h holds the contract.
 */
#include "jsonw.h"

#include <locale.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

/* Byte classes for the string writer: 0 copies as is, 1 needs an escape,
 * 2 starts a multi-byte (or invalid) sequence. */
static const unsigned char str_class[256] = {
    /* 0x00..0x1F: control characters */
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    1,
    /* 0x20..0x7F: '"' (0x22) and '\\' (0x5C) only */
    0,
    0,
    1,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    1,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    /* 0x80..0xFF */
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
    2,
};

static inline uint64_t load_u64(const unsigned char *p)
{
    uint64_t x;

    memcpy(&x, p, sizeof(x)); /* one unaligned load on every target we build for */
    return x;
}

/* True when any byte of x is < 0x20, '"', '\\' or >= 0x80: the classic
 * "has a zero byte" test, (v - 0x01..) & ~v & 0x80.., applied to x ^ '"'..
 * and x ^ '\\'.., its "has a byte < n" variant for 0x20, and the high bits.
 * It never misses a special byte; a false alarm only sends the word to the
 * exact byte loop. */
static inline bool word_is_special(uint64_t x)
{
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    uint64_t q = x ^ (ones * '"'), bs = x ^ (ones * '\\');

    return ((x | ((x - ones * 0x20) & ~x) | ((q - ones) & ~q) | ((bs - ones) & ~bs)) & highs) != 0;
}

size_t jsonw_escape(unsigned char c, char out[6])
{
    static const char hex[] = "0123456789abcdef";
    char e;

    switch (c) {
    case '"':
        e = '"';
        break;
    case '\\':
        e = '\\';
        break;
    case '\n':
        e = 'n';
        break;
    case '\r':
        e = 'r';
        break;
    case '\t':
        e = 't';
        break;
    case '\b':
        e = 'b';
        break;
    case '\f':
        e = 'f';
        break;
    default:
        if (c >= 0x20)
            return 0;
        memcpy(out, "\\u00", 4);
        out[4] = hex[c >> 4];
        out[5] = hex[c & 0xF];
        return 6;
    }
    out[0] = '\\';
    out[1] = e;
    return 2;
}

/* Runs of bytes that need no escape are copied with one memcpy. */
int jsonw_str(struct strbuf *b, const char *s, size_t n, size_t *bad_at)
{
    /* msgpack-c may give an empty string a NULL ptr: NULL + 0 and
     * memcpy(.., NULL, 0) are undefined behaviour, so point at "" instead. */
    const unsigned char *p = (const unsigned char *)(n ? s : ""), *end = p + n, *run = p;

    if (strbuf_reserve(b, n + 2) < 0)
        return STRBUF_ENOMEM;
    b->data[b->len++] = '"';
    while (p < end) {
        /* Skip 8 plain ASCII bytes at a time (most of a prompt). */
        while (end - p >= 8 && !word_is_special(load_u64(p)))
            p += 8;
        if (p == end)
            break;
        unsigned char cls = str_class[*p];
        if (cls == 0) {
            p++;
            continue;
        }
        if (cls == 2) {
            size_t k = utf8_seq_len(p, end);
            if (k == 0) {
                *bad_at = (size_t)(p - (const unsigned char *)s);
                return JSONW_EBADUTF8;
            }
            p += k;
            continue;
        }
        /* An escape: flush the run, then write 2 or 6 bytes. */
        if (strbuf_put(b, run, (size_t)(p - run)) < 0 || strbuf_reserve(b, 6) < 0)
            return STRBUF_ENOMEM;
        b->len += jsonw_escape(*p, b->data + b->len);
        run = ++p;
    }
    if (strbuf_put(b, run, (size_t)(p - run)) < 0 || strbuf_putc(b, '"') < 0)
        return STRBUF_ENOMEM;
    return 0;
}

static int put_u64(struct strbuf *b, uint64_t v, bool neg)
{
    char tmp[21];
    char *p = tmp;

    if (neg)
        *p++ = '-';
    p = put_uint(p, v);
    return strbuf_put(b, tmp, (size_t)(p - tmp));
}

int jsonw_i64(struct strbuf *b, int64_t v)
{
    /* 0 - (uint64_t)v is exact for INT64_MIN, where -v would overflow. */
    return v < 0 ? put_u64(b, 0 - (uint64_t)v, true) : put_u64(b, (uint64_t)v, false);
}

/* Writes d as at most 6 decimals when that is exact enough: if r/10^6 (r an
 * integer below 2^53) divides back to d, then strtod of the decimal text —
 * also the correctly rounded r/10^6 — is d. Covers the temperatures and
 * top_p values of a request without snprintf/strtod. Returns the length, or
 * 0 when d needs the general path. */
static int fmt_short_decimal(char *tmp, double d)
{
    if (!(fabs(d) < 1e9))
        return 0;
    double a = fabs(d) * 1e6;
    uint64_t r = (uint64_t)(a + 0.5);
    if ((double)r / 1e6 != fabs(d))
        return 0;
    int n = 0;
    uint64_t fp = r % 1000000;
    if (signbit(d))
        tmp[n++] = '-';
    n = (int)(put_uint(tmp + n, r / 1000000) - tmp);
    tmp[n++] = '.';
    for (uint64_t div = 100000; div > 0; div /= 10) {
        tmp[n++] = (char)('0' + fp / div);
        fp %= div;
        if (fp == 0)
            break; /* trailing zeros stop here; "1.0" keeps one */
    }
    return n;
}

int jsonw_u64(struct strbuf *b, uint64_t v)
{
    return put_u64(b, v, false);
}

/* printf and strtod follow LC_NUMERIC; JSON wants '.' whatever the locale
 * of the process (the client library runs inside applications that may
 * call setlocale). The text is read back before this, in the same locale,
 * so the round trip is exact either way. */
static int fix_decimal_point(char *tmp, int n)
{
    const char *dp = localeconv()->decimal_point;

    if (!dp || (dp[0] == '.' && dp[1] == '\0') || !dp[0])
        return n;
    char *at = strstr(tmp, dp);
    if (!at)
        return n;
    size_t dl = strlen(dp);
    *at = '.';
    memmove(at + 1, at + dl, strlen(at + dl) + 1);
    return n - (int)(dl - 1);
}

int jsonw_double(struct strbuf *b, double d, bool is_f32)
{
    char tmp[48];
    int n = 0;

    if (!isfinite(d))
        return JSONW_ENOTFINITE;
    if (is_f32) {
        float f = (float)d;
        for (int prec = 6; prec <= 9; prec++) {
            n = snprintf(tmp, sizeof(tmp), "%.*g", prec, (double)f);
            if (prec == 9 || strtof(tmp, NULL) == f)
                break;
        }
    } else if ((n = fmt_short_decimal(tmp, d)) > 0) {
        return strbuf_put(b, tmp, (size_t)n);
    } else {
        for (int prec = 15; prec <= 17; prec++) {
            n = snprintf(tmp, sizeof(tmp), "%.*g", prec, d);
            if (prec == 17 || strtod(tmp, NULL) == d)
                break;
        }
    }
    n = fix_decimal_point(tmp, n);
    /* Keep it a float on the way back: "1" -> "1.0", "-0" -> "-0.0". */
    if (!memchr(tmp, '.', (size_t)n) && !memchr(tmp, 'e', (size_t)n)) {
        tmp[n++] = '.';
        tmp[n++] = '0';
    }
    return strbuf_put(b, tmp, (size_t)n);
}
