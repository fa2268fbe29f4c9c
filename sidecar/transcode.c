/* transcode.c — msgpack <-> JSON for upstream bodies.
 *
 * msgpack -> JSON is on every call's hot path, so it writes text straight
 * from the msgpack object into one growable buffer: no JSON tree, no
 * per-element allocation, one pass per string that validates UTF-8 and
 * escapes together. The path to the current value is kept in a fixed array
 * (one pointer store per element) and only turned into text on failure.
 *
 * JSON -> msgpack uses jansson for parsing (its tree is the price of not
 * owning a JSON parser) and walks the tree into the caller's packer. The
 * parse dominates: jansson copies strings byte by byte, about 20 ns per
 * input byte, so a 1 KB reply costs ~20 us and a 200-byte SSE chunk ~5 us. */
#include "transcode.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------
 * Buffer */

void transcode_buf_init(struct transcode_buf *b)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

void transcode_buf_fini(struct transcode_buf *b)
{
    free(b->data);
    transcode_buf_init(b);
}

void transcode_buf_reset(struct transcode_buf *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

/* Slow path of buf_room(): grows geometrically so appends are amortised O(1). */
static int buf_grow(struct transcode_buf *b, size_t extra)
{
    if (extra > SIZE_MAX / 2 - b->len)
        return TRANSCODE_ENOMEM;
    size_t need = b->len + extra + 1; /* +1: room for the closing NUL */
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < need)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p)
        return TRANSCODE_ENOMEM;
    b->data = p;
    b->cap = cap;
    return 0;
}

static inline int buf_room(struct transcode_buf *b, size_t extra)
{
    if (b->cap - b->len > extra) /* strict: keeps one byte for the NUL */
        return 0;
    return buf_grow(b, extra);
}

int transcode_buf_reserve(struct transcode_buf *b, size_t extra)
{
    return buf_room(b, extra);
}

static inline int buf_put(struct transcode_buf *b, const void *p, size_t n)
{
    if (buf_room(b, n) < 0)
        return TRANSCODE_ENOMEM;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

static inline int buf_putc(struct transcode_buf *b, char c)
{
    if (buf_room(b, 1) < 0)
        return TRANSCODE_ENOMEM;
    b->data[b->len++] = c;
    return 0;
}

#define buf_puts(b, lit) buf_put((b), (lit), sizeof(lit) - 1)

/* ------------------------------------------------------------------------
 * UTF-8 */

/* The length of the sequence a non-ASCII lead byte starts (0 when it can
 * start none: a continuation byte, C0, C1, F5..FF) and the range its second
 * byte must lie in, which rules out overlong forms (E0 80..9F, F0 80..8F),
 * surrogates (ED A0..BF) and code points above U+10FFFF (F4 90..). */
static size_t utf8_lead(unsigned char c, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c == 0xE0)
        *lo = 0xA0;
    else if (c == 0xED)
        *hi = 0x9F;
    else if (c == 0xF0)
        *lo = 0x90;
    else if (c == 0xF4)
        *hi = 0x8F;
    return c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
}

/* Length of the valid UTF-8 sequence starting with the non-ASCII byte at
 * p[0], or 0 when it is invalid (see utf8_lead) or cut short by `end`. */
static size_t utf8_seq_len(const unsigned char *p, const unsigned char *end)
{
    unsigned char lo, hi;
    size_t n = utf8_lead(p[0], &lo, &hi);

    if (n == 0 || (size_t)(end - p) < n || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if ((p[i] & 0xC0) != 0x80)
            return 0;
    return n;
}

/* Length of the maximal subpart at p[0] when it starts no valid sequence:
 * the lead byte and the continuation bytes that could still have completed
 * a sequence (so "\xE2\x82A" is one bad subpart of 2 bytes, then 'A').
 * Always at least 1. */
static size_t utf8_bad_len(const unsigned char *p, const unsigned char *end)
{
    unsigned char lo, hi;
    size_t n = utf8_lead(p[0], &lo, &hi), i;

    if (n == 0 || end - p < 2 || p[1] < lo || p[1] > hi)
        return 1;
    for (i = 2; i < n && p + i < end && (p[i] & 0xC0) == 0x80; i++)
        ;
    return i;
}

long transcode_utf8_repair(const char *s, size_t n, struct transcode_buf *out)
{
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    const unsigned char *p = (const unsigned char *)(n ? s : ""), *end = p + n, *run = p;
    size_t start = out->len;
    long bad = 0;

    if (buf_room(out, n) < 0)
        return TRANSCODE_ENOMEM;
    while (p < end) {
        if (*p < 0x80) {
            p++;
            continue;
        }
        size_t k = utf8_seq_len(p, end);
        if (k) {
            p += k;
            continue;
        }
        if (buf_put(out, run, (size_t)(p - run)) < 0 || buf_put(out, fffd, 3) < 0) {
            out->len = start;
            return TRANSCODE_ENOMEM;
        }
        bad++;
        p += utf8_bad_len(p, end);
        run = p;
    }
    if (buf_put(out, run, (size_t)(p - run)) < 0) {
        out->len = start;
        return TRANSCODE_ENOMEM;
    }
    out->data[out->len] = '\0';
    return bad;
}

size_t transcode_utf8_cut(const char *s, size_t n, size_t max)
{
    if (n <= max)
        return n;
    /* Back over continuation bytes to the start of the character that
     * would be split. */
    while (max > 0 && ((unsigned char)s[max] & 0xC0) == 0x80)
        max--;
    return max;
}

/* Byte classes for the string writer: 0 copies as is, 1 needs an escape,
 * 2 starts a multi-byte (or invalid) sequence. */
static const unsigned char str_class[256] = {
    /* 0x00..0x1F: control characters */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    /* 0x20..0x7F: '"' (0x22) and '\\' (0x5C) only */
    0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    /* 0x80..0xFF */
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
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

enum { STR_BAD_UTF8 = -100 }; /* put_json_string's own outcome, never returned further */

/* Appends `s` as a quoted JSON string. Returns 0, TRANSCODE_ENOMEM, or
 * STR_BAD_UTF8 with the offending byte offset in *bad_at. Runs of bytes that
 * need no escape are copied with one memcpy. */
static int put_json_string(struct transcode_buf *b, const char *s, size_t n, size_t *bad_at)
{
    static const char hex[] = "0123456789abcdef";
    /* msgpack-c may give an empty string a NULL ptr: NULL + 0 and
     * memcpy(.., NULL, 0) are undefined behaviour, so point at "" instead. */
    const unsigned char *p = (const unsigned char *)(n ? s : ""), *end = p + n, *run = p;

    if (buf_room(b, n + 2) < 0)
        return TRANSCODE_ENOMEM;
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
                return STR_BAD_UTF8;
            }
            p += k;
            continue;
        }
        /* An escape: flush the run, then write 2 or 6 bytes. */
        if (buf_put(b, run, (size_t)(p - run)) < 0 || buf_room(b, 6) < 0)
            return TRANSCODE_ENOMEM;
        char *w = b->data + b->len;
        w[0] = '\\';
        switch (*p) {
        case '"': w[1] = '"'; b->len += 2; break;
        case '\\': w[1] = '\\'; b->len += 2; break;
        case '\n': w[1] = 'n'; b->len += 2; break;
        case '\r': w[1] = 'r'; b->len += 2; break;
        case '\t': w[1] = 't'; b->len += 2; break;
        case '\b': w[1] = 'b'; b->len += 2; break;
        case '\f': w[1] = 'f'; b->len += 2; break;
        default:
            w[1] = 'u';
            w[2] = '0';
            w[3] = '0';
            w[4] = hex[*p >> 4];
            w[5] = hex[*p & 0xF];
            b->len += 6;
            break;
        }
        run = ++p;
    }
    if (buf_put(b, run, (size_t)(p - run)) < 0 || buf_putc(b, '"') < 0)
        return TRANSCODE_ENOMEM;
    return 0;
}

/* ------------------------------------------------------------------------
 * Error messages: always NUL-terminated, truncated on a character boundary,
 * valid UTF-8 and free of control characters (they end up in logs and in
 * msgpack str fields that clients decode strictly). */

struct errw {
    char *p;
    size_t cap; /* usable bytes, excluding the NUL */
    size_t len;
    bool full;
};

static void errw_init(struct errw *w, char *err, size_t errlen)
{
    w->p = errlen ? err : NULL;
    w->cap = errlen ? errlen - 1 : 0;
    w->len = 0;
    w->full = !w->p;
    if (w->p)
        w->p[0] = '\0';
}

/* Appends one unit (a whole character or escape) or nothing. */
static void errw_put(struct errw *w, const char *s, size_t n)
{
    if (w->full)
        return;
    if (n > w->cap - w->len) {
        w->full = true;
        return;
    }
    memcpy(w->p + w->len, s, n);
    w->len += n;
    w->p[w->len] = '\0';
}

static void errw_printf(struct errw *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Our formats only produce ASCII, so byte truncation is safe here. */
static void errw_printf(struct errw *w, const char *fmt, ...)
{
    va_list ap;

    if (w->full)
        return;
    va_start(ap, fmt);
    int n = vsnprintf(w->p + w->len, w->cap - w->len + 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n > w->cap - w->len) {
        w->len = w->cap;
        w->full = true;
    } else {
        w->len += (size_t)n;
    }
}

/* Appends untrusted bytes: printable ASCII as is (with a `quote`, that
 * quote and '\\' get a backslash), valid multi-byte UTF-8 as is when
 * `keep_utf8`, anything else as \xNN. At most `max` input bytes, then "...". */
static void errw_bytes(struct errw *w, const char *s, size_t n, size_t max, char quote,
                       bool keep_utf8)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    char tmp[8];

    while (p < end && !w->full) {
        if ((size_t)(p - (const unsigned char *)s) >= max) {
            errw_put(w, "...", 3);
            return;
        }
        if (*p >= 0x20 && *p < 0x7F) {
            if (quote && (*p == '\\' || *p == quote)) {
                tmp[0] = '\\';
                tmp[1] = (char)*p;
                errw_put(w, tmp, 2);
            } else {
                errw_put(w, (const char *)p, 1);
            }
            p++;
            continue;
        }
        size_t k = *p >= 0x80 && keep_utf8 ? utf8_seq_len(p, end) : 0;
        if (k) {
            errw_put(w, (const char *)p, k);
            p += k;
        } else {
            snprintf(tmp, sizeof(tmp), "\\x%02x", *p);
            errw_put(w, tmp, 4);
            p++;
        }
    }
}

/* ------------------------------------------------------------------------
 * msgpack -> JSON */

/* How a value was reached from its container: key (map member) or index. */
struct m2j_seg {
    const char *key; /* NULL for an array element */
    uint32_t key_len;
    uint32_t index;
};

struct m2j {
    struct transcode_buf *out;
    const struct transcode_override *ov; /* NULL when there is nothing to override */
    const char *root;
    char *err;
    size_t errlen;
    struct m2j_seg path[TRANSCODE_MAX_DEPTH]; /* path[d]: step from level d to d+1 */
};

static bool key_is_identifier(const char *k, size_t n)
{
    if (n == 0 || (k[0] >= '0' && k[0] <= '9'))
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = k[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_'))
            return false;
    }
    return true;
}

/* Writes "<root><path up to depth>: <message>" into err and returns
 * TRANSCODE_EINVALID. Keys print as .name when they are identifiers and as
 * ["any key"] otherwise. */
static int m2j_fail(struct m2j *cx, unsigned depth, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int m2j_fail(struct m2j *cx, unsigned depth, const char *fmt, ...)
{
    struct errw w;
    char tmp[256];
    va_list ap;

    errw_init(&w, cx->err, cx->errlen);
    errw_put(&w, cx->root, strlen(cx->root));
    for (unsigned d = 0; d < depth; d++) {
        const struct m2j_seg *s = &cx->path[d];
        if (!s->key) {
            errw_printf(&w, "[%u]", (unsigned)s->index);
        } else if (key_is_identifier(s->key, s->key_len)) {
            errw_put(&w, ".", 1);
            errw_bytes(&w, s->key, s->key_len, 64, 0, false);
        } else {
            errw_put(&w, "[\"", 2);
            errw_bytes(&w, s->key, s->key_len, 64, '"', true);
            errw_put(&w, "\"]", 2);
        }
    }
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    errw_put(&w, ": ", 2);
    errw_bytes(&w, tmp, strlen(tmp), sizeof(tmp), 0, false);
    return TRANSCODE_EINVALID;
}

static int put_u64(struct transcode_buf *b, uint64_t v, bool neg)
{
    char tmp[21];
    char *p = tmp + sizeof(tmp);

    do {
        *--p = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    if (neg)
        *--p = '-';
    return buf_put(b, p, (size_t)(tmp + sizeof(tmp) - p));
}

static int put_i64(struct transcode_buf *b, int64_t v)
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
    char digits[24];
    int n = 0, i = 0;
    uint64_t ip = r / 1000000, fp = r % 1000000;
    do {
        digits[i++] = (char)('0' + ip % 10);
        ip /= 10;
    } while (ip);
    if (signbit(d))
        tmp[n++] = '-';
    while (i > 0)
        tmp[n++] = digits[--i];
    tmp[n++] = '.';
    for (uint64_t div = 100000; div > 0; div /= 10) {
        tmp[n++] = (char)('0' + fp / div);
        fp %= div;
        if (fp == 0)
            break; /* trailing zeros stop here; "1.0" keeps one */
    }
    return n;
}

/* The fewest of a few precisions whose text parses back to the same value.
 * %g already drops trailing zeros, so 0.1 prints as "0.1" at the first try;
 * most values stop there (one snprintf + one strtod). */
static int put_float(struct m2j *cx, unsigned depth, double d, bool is_f32)
{
    char tmp[40];
    int n = 0;

    if (isnan(d))
        return m2j_fail(cx, depth, "NaN cannot be sent as JSON");
    if (isinf(d))
        return m2j_fail(cx, depth, "%sInfinity cannot be sent as JSON", d < 0 ? "-" : "");
    if (is_f32) {
        float f = (float)d;
        for (int prec = 6; prec <= 9; prec++) {
            n = snprintf(tmp, sizeof(tmp), "%.*g", prec, (double)f);
            if (prec == 9 || strtof(tmp, NULL) == f)
                break;
        }
    } else if ((n = fmt_short_decimal(tmp, d)) > 0) {
        return buf_put(cx->out, tmp, (size_t)n);
    } else {
        for (int prec = 15; prec <= 17; prec++) {
            n = snprintf(tmp, sizeof(tmp), "%.*g", prec, d);
            if (prec == 17 || strtod(tmp, NULL) == d)
                break;
        }
    }
    /* Keep it a float on the way back: "1" -> "1.0", "-0" -> "-0.0". */
    if (!memchr(tmp, '.', (size_t)n) && !memchr(tmp, 'e', (size_t)n)) {
        tmp[n++] = '.';
        tmp[n++] = '0';
    }
    return buf_put(cx->out, tmp, (size_t)n);
}

static int m2j_string(struct m2j *cx, unsigned depth, const char *s, size_t n)
{
    size_t bad_at = 0;
    int rc = put_json_string(cx->out, s, n, &bad_at);

    if (rc == STR_BAD_UTF8)
        return m2j_fail(cx, depth, "string is not valid UTF-8 (byte %zu of %zu)", bad_at, n);
    return rc;
}

static const char *m2j_type_name(msgpack_object_type t)
{
    switch (t) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "a boolean";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "an integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return "a float";
    case MSGPACK_OBJECT_STR: return "a string";
    case MSGPACK_OBJECT_ARRAY: return "an array";
    case MSGPACK_OBJECT_MAP: return "a map";
    case MSGPACK_OBJECT_BIN: return "binary data";
    case MSGPACK_OBJECT_EXT: return "an ext value";
    }
    return "an unknown type";
}

static bool str_is(const msgpack_object *o, const char *lit, size_t n)
{
    return o->via.str.size == n && memcmp(o->via.str.ptr, lit, n) == 0;
}

static int m2j_value(struct m2j *cx, const msgpack_object *o, unsigned depth);

/* A map's members. At depth 0 with overrides, the values of "model" and
 * "stream" are replaced, and appended when absent. */
static int m2j_map(struct m2j *cx, const msgpack_object *o, unsigned depth)
{
    const struct transcode_override *ov = depth == 0 ? cx->ov : NULL;
    bool seen_model = false, seen_stream = false;
    struct transcode_buf *b = cx->out;
    int rc;

    if (buf_putc(b, '{') < 0)
        return TRANSCODE_ENOMEM;
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        if (kv->key.type != MSGPACK_OBJECT_STR)
            return m2j_fail(cx, depth, "map key #%u is %s; JSON object keys must be strings",
                            (unsigned)i, m2j_type_name(kv->key.type));
        if (i > 0 && buf_putc(b, ',') < 0)
            return TRANSCODE_ENOMEM;
        size_t bad_at = 0;
        rc = put_json_string(b, kv->key.via.str.ptr, kv->key.via.str.size, &bad_at);
        if (rc == STR_BAD_UTF8)
            return m2j_fail(cx, depth, "map key #%u is not valid UTF-8 (byte %zu of %u)",
                            (unsigned)i, bad_at, (unsigned)kv->key.via.str.size);
        if (rc < 0 || buf_putc(b, ':') < 0)
            return TRANSCODE_ENOMEM;
        cx->path[depth].key = kv->key.via.str.ptr;
        cx->path[depth].key_len = kv->key.via.str.size;
        if (ov && ov->model && str_is(&kv->key, "model", 5)) {
            seen_model = true;
            rc = m2j_string(cx, depth + 1, ov->model, strlen(ov->model));
        } else if (ov && ov->stream != TRANSCODE_STREAM_KEEP && str_is(&kv->key, "stream", 6)) {
            seen_stream = true;
            rc = ov->stream == TRANSCODE_STREAM_TRUE ? buf_puts(b, "true") : buf_puts(b, "false");
        } else {
            rc = m2j_value(cx, &kv->val, depth + 1);
        }
        if (rc < 0)
            return rc;
    }
    if (ov && ov->model && !seen_model) {
        static const char k[] = "model";
        cx->path[depth].key = k;
        cx->path[depth].key_len = sizeof(k) - 1;
        if ((o->via.map.size > 0 && buf_putc(b, ',') < 0) || buf_puts(b, "\"model\":") < 0)
            return TRANSCODE_ENOMEM;
        rc = m2j_string(cx, depth + 1, ov->model, strlen(ov->model));
        if (rc < 0)
            return rc;
    }
    if (ov && ov->stream != TRANSCODE_STREAM_KEEP && !seen_stream) {
        bool first = o->via.map.size == 0 && !(ov->model && !seen_model);
        if ((!first && buf_putc(b, ',') < 0) ||
            (ov->stream == TRANSCODE_STREAM_TRUE ? buf_puts(b, "\"stream\":true")
                                                 : buf_puts(b, "\"stream\":false")) < 0)
            return TRANSCODE_ENOMEM;
    }
    return buf_putc(b, '}');
}

/* `depth` is the number of containers around `o`; path[0..depth-1] leads to it. */
static int m2j_value(struct m2j *cx, const msgpack_object *o, unsigned depth)
{
    struct transcode_buf *b = cx->out;
    int rc;

    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        return buf_puts(b, "null");
    case MSGPACK_OBJECT_BOOLEAN:
        return o->via.boolean ? buf_puts(b, "true") : buf_puts(b, "false");
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return put_u64(b, o->via.u64, false);
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return put_i64(b, o->via.i64);
    case MSGPACK_OBJECT_FLOAT32:
        return put_float(cx, depth, o->via.f64, true);
    case MSGPACK_OBJECT_FLOAT64:
        return put_float(cx, depth, o->via.f64, false);
    case MSGPACK_OBJECT_STR:
        return m2j_string(cx, depth, o->via.str.ptr, o->via.str.size);
    case MSGPACK_OBJECT_BIN:
        return m2j_fail(cx, depth, "binary data cannot be sent as JSON");
    case MSGPACK_OBJECT_EXT:
        return m2j_fail(cx, depth, "msgpack ext type %d cannot be sent as JSON",
                        (int)o->via.ext.type);
    case MSGPACK_OBJECT_ARRAY:
        if (depth >= TRANSCODE_MAX_DEPTH)
            return m2j_fail(cx, depth, "nested deeper than %d levels", TRANSCODE_MAX_DEPTH);
        if (buf_putc(b, '[') < 0)
            return TRANSCODE_ENOMEM;
        cx->path[depth].key = NULL;
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            if (i > 0 && buf_putc(b, ',') < 0)
                return TRANSCODE_ENOMEM;
            cx->path[depth].index = i;
            rc = m2j_value(cx, &o->via.array.ptr[i], depth + 1);
            if (rc < 0)
                return rc;
        }
        return buf_putc(b, ']');
    case MSGPACK_OBJECT_MAP:
        if (depth >= TRANSCODE_MAX_DEPTH)
            return m2j_fail(cx, depth, "nested deeper than %d levels", TRANSCODE_MAX_DEPTH);
        return m2j_map(cx, o, depth);
    }
    return m2j_fail(cx, depth, "unknown msgpack type %d", (int)o->type);
}

int transcode_msgpack_to_json(const msgpack_object *o, struct transcode_buf *out,
                              const struct transcode_override *ov, const char *root,
                              char *err, size_t errlen)
{
    struct m2j cx;
    size_t start = out->len;

    cx.out = out;
    cx.ov = ov && (ov->model || ov->stream != TRANSCODE_STREAM_KEEP) ? ov : NULL;
    cx.root = root ? root : "value";
    cx.err = err;
    cx.errlen = errlen;
    if (err && errlen)
        err[0] = '\0';
    int rc = m2j_value(&cx, o, 0);
    if (rc == TRANSCODE_ENOMEM && err && errlen)
        snprintf(err, errlen, "out of memory");
    if (rc < 0)
        out->len = start;
    if (out->data)
        out->data[out->len] = '\0'; /* buf_room always keeps a byte for it */
    return rc;
}

/* ------------------------------------------------------------------------
 * JSON -> msgpack */

struct j2m {
    msgpack_packer *pk;
    unsigned max_depth;
    transcode_str_fn *on_str;
    void *ud;
};

static int j2m_str(const struct j2m *cx, const char *s, size_t n)
{
    if (cx->on_str && cx->on_str(cx->ud, &s, &n) < 0)
        return TRANSCODE_ENOMEM;
    return msgpack_pack_str(cx->pk, n) || msgpack_pack_str_body(cx->pk, s, n) ? TRANSCODE_ENOMEM
                                                                              : 0;
}

static int j2m_value(const struct j2m *cx, const json_t *v, unsigned depth, struct errw *w)
{
    msgpack_packer *pk = cx->pk;
    int rc = 0;

    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        if (depth >= cx->max_depth)
            goto too_deep;
        if (msgpack_pack_map(pk, json_object_size(v)) != 0)
            return TRANSCODE_ENOMEM;
        /* json_object_iter walks members in insertion order (jansson >= 2.8). */
        for (void *it = json_object_iter((json_t *)v); it;
             it = json_object_iter_next((json_t *)v, it)) {
            rc = j2m_str(cx, json_object_iter_key(it), json_object_iter_key_len(it));
            if (rc < 0)
                return rc;
            rc = j2m_value(cx, json_object_iter_value(it), depth + 1, w);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    case JSON_ARRAY: {
        if (depth >= cx->max_depth)
            goto too_deep;
        size_t n = json_array_size(v);
        if (msgpack_pack_array(pk, n) != 0)
            return TRANSCODE_ENOMEM;
        for (size_t i = 0; i < n; i++) {
            rc = j2m_value(cx, json_array_get(v, i), depth + 1, w);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    case JSON_STRING:
        return j2m_str(cx, json_string_value(v), json_string_length(v));
    case JSON_INTEGER:
        rc = msgpack_pack_int64(pk, (int64_t)json_integer_value(v));
        break;
    case JSON_REAL:
        rc = msgpack_pack_double(pk, json_real_value(v));
        break;
    case JSON_TRUE:
        rc = msgpack_pack_true(pk);
        break;
    case JSON_FALSE:
        rc = msgpack_pack_false(pk);
        break;
    case JSON_NULL:
        rc = msgpack_pack_nil(pk);
        break;
    }
    return rc ? TRANSCODE_ENOMEM : 0;

too_deep:
    errw_printf(w, "JSON nested deeper than %u levels", cx->max_depth);
    return TRANSCODE_ETOO_DEEP;
}

int transcode_json_to_msgpack(const char *json, size_t len, msgpack_packer *pk,
                              const struct transcode_j2m *opt, char *err, size_t errlen)
{
    struct j2m cx = {pk, TRANSCODE_MAX_DEPTH, NULL, NULL};
    struct errw w;
    json_error_t je;

    if (opt) {
        if (opt->max_depth > 0 && opt->max_depth < TRANSCODE_MAX_DEPTH)
            cx.max_depth = opt->max_depth;
        cx.on_str = opt->on_str;
        cx.ud = opt->ud;
    }

    errw_init(&w, err, errlen);
    /* DECODE_ANY: SSE data and replies are objects, but nothing here needs
     * to insist. ALLOW_NUL: "\u0000" in a string is valid JSON and fits a
     * msgpack str (jansson still refuses it inside object keys). */
    json_t *root = json_loadb(json, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!root) {
        int code = json_error_code(&je);
        if (code == json_error_out_of_memory) {
            errw_printf(&w, "out of memory");
            return TRANSCODE_ENOMEM;
        }
        errw_printf(&w, "%s at line %d, column %d: ",
                    code == json_error_numeric_overflow ? "number out of range in JSON"
                                                        : "invalid JSON",
                    je.line, je.column);
        /* je.text holds at most a 20-byte excerpt of the input; keep it
         * printable ASCII. */
        errw_bytes(&w, je.text, strnlen(je.text, sizeof(je.text) - 1), sizeof(je.text), 0,
                   false);
        if (code == json_error_numeric_overflow)
            errw_printf(&w, " (integers must fit in int64, numbers in a double)");
        return TRANSCODE_EINVALID;
    }
    int rc = j2m_value(&cx, root, 0, &w);
    if (rc == TRANSCODE_ENOMEM)
        errw_printf(&w, "out of memory (msgpack write failed)");
    json_decref(root);
    return rc;
}
