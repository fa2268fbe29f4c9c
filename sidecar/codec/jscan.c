/*
 * jscan.c — see jscan.h. Recursive descent over the text, bounded by
 * JSCAN_MAX_DEPTH; the outermost container's members are recorded while
 * checking (up to JSCAN_RECORD of them, else found again by a second,
 * shallow walk), so that a caller sees them only once all of the text is
 * known to be valid.
 */
#include "jscan.h"
#include "utf8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define JSCAN_RECORD 32

struct scan {
    const char *p, *end;
    unsigned depth;
    /* the outermost container's members (keys: spans with the quotes) */
    struct jscan_value keys[JSCAN_RECORD], vals[JSCAN_RECORD];
    bool key_esc[JSCAN_RECORD]; /* the key holds an escape */
    size_t n;
    bool overflow;
    bool esc; /* the last string scanned holds an escape */
};

static inline void skip_ws(struct scan *c)
{
    /* one compare settles the common case, a byte that is not a space */
    while (c->p < c->end && (unsigned char)*c->p <= ' ' &&
           (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

int jscan_hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* The rest of a string from p, a byte that is not plain (or end): see
 * scan_string. */
static int scan_string_rest(struct scan *c, const unsigned char *p)
{
    const unsigned char *end = (const unsigned char *)c->end;

    c->esc = false;
    while (p < end) {
        unsigned char b = *p;
        if (b == '"') {
            c->p = (const char *)p + 1;
            return 0;
        }
        if (b == '\\') {
            if (p + 1 >= end)
                goto bad;
            c->esc = true;
            switch (p[1]) {
            case '"':
            case '\\':
            case '/':
            case 'b':
            case 'f':
            case 'n':
            case 'r':
            case 't':
                p += 2;
                break;
            case 'u':
                if (end - p < 6 || jscan_hexval((char)p[2]) < 0 || jscan_hexval((char)p[3]) < 0 ||
                    jscan_hexval((char)p[4]) < 0 || jscan_hexval((char)p[5]) < 0)
                    goto bad;
                p += 6;
                break;
            default:
                goto bad;
            }
        } else if (b >= 0x80) {
            size_t n = utf8_seq_len(p, end);
            if (!n)
                goto bad;
            p += n;
            if (p < end && *p >= 0x80)
                continue; /* text that is not ASCII, character after character */
        } else {
            goto bad; /* a control character */
        }
        p = jscan_plain_run(p, end);
    }
bad:
    c->p = (const char *)p;
    return -1;
}

/* The string at c->p (its opening quote): c->p moves past the closing
 * quote, or onto the first byte in error (end when it is cut short);
 * c->esc tells whether it holds an escape. Inline, so that a string of
 * plain bytes (most strings) costs the scan and no call. */
static inline int scan_string(struct scan *c)
{
    const unsigned char *p =
        jscan_plain_run((const unsigned char *)c->p + 1, (const unsigned char *)c->end);

    if (p < (const unsigned char *)c->end && *p == '"') {
        c->esc = false;
        c->p = (const char *)p + 1;
        return 0;
    }
    return scan_string_rest(c, p);
}

static bool is_digit(const char *p, const char *end)
{
    return p < end && *p >= '0' && *p <= '9';
}

static int scan_number(struct scan *c)
{
    const char *p = c->p, *end = c->end;

    if (p < end && *p == '-')
        p++;
    if (!is_digit(p, end))
        goto bad;
    if (*p == '0')
        p++;
    else
        while (is_digit(p, end))
            p++;
    if (p < end && *p == '.') {
        p++;
        if (!is_digit(p, end))
            goto bad;
        while (is_digit(p, end))
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (!is_digit(p, end))
            goto bad;
        while (is_digit(p, end))
            p++;
    }
    c->p = p;
    return 0;
bad:
    c->p = p;
    return -1;
}

static int scan_literal(struct scan *c, const char *word, size_t n)
{
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0)
        return -1;
    c->p += n;
    return 0;
}

static int scan_value(struct scan *c, struct jscan_value *v);

/* An object or an array (c->p at its opening bracket). */
static int scan_container(struct scan *c, bool object)
{
    char close = object ? '}' : ']';
    bool top = c->depth == 0;

    if (++c->depth > JSCAN_MAX_DEPTH)
        return -1;
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        c->depth--;
        return 0;
    }
    for (;;) {
        struct jscan_value key = { JSCAN_STRING, NULL, 0 }, val;
        bool key_esc = false;
        skip_ws(c);
        if (object) {
            if (c->p >= c->end || *c->p != '"')
                return -1;
            key.p = c->p;
            if (scan_string(c) < 0)
                return -1;
            key.len = (size_t)(c->p - key.p);
            key_esc = c->esc;
            skip_ws(c);
            if (c->p >= c->end || *c->p != ':')
                return -1;
            c->p++;
            skip_ws(c);
        }
        if (c->p < c->end && *c->p == '"') { /* most values: no call */
            val.type = JSCAN_STRING;
            val.p = c->p;
            if (scan_string(c) < 0)
                return -1;
            val.len = (size_t)(c->p - val.p);
        } else if (scan_value(c, &val) < 0) {
            return -1;
        }
        if (top) {
            if (c->n < JSCAN_RECORD) {
                c->keys[c->n] = key;
                c->vals[c->n] = val;
                c->key_esc[c->n] = key_esc;
                c->n++;
            } else {
                c->overflow = true;
            }
        }
        skip_ws(c);
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            continue;
        }
        if (c->p < c->end && *c->p == close) {
            c->p++;
            c->depth--;
            return 0;
        }
        return -1;
    }
}

static int scan_value(struct scan *c, struct jscan_value *v)
{
    const char *start = c->p;
    int rc;

    if (c->p >= c->end)
        return -1;
    switch (*c->p) {
    case '{':
        v->type = JSCAN_OBJECT;
        rc = scan_container(c, true);
        break;
    case '[':
        v->type = JSCAN_ARRAY;
        rc = scan_container(c, false);
        break;
    case '"':
        v->type = JSCAN_STRING;
        rc = scan_string(c);
        break;
    case 't':
        v->type = JSCAN_TRUE;
        rc = scan_literal(c, "true", 4);
        break;
    case 'f':
        v->type = JSCAN_FALSE;
        rc = scan_literal(c, "false", 5);
        break;
    case 'n':
        v->type = JSCAN_NULL;
        rc = scan_literal(c, "null", 4);
        break;
    default:
        v->type = JSCAN_NUMBER;
        rc = scan_number(c);
        break;
    }
    v->p = start;
    v->len = (size_t)(c->p - start);
    return rc;
}

/* Checks the whole text; the outermost value in *top. */
static int scan_all(struct scan *c, const char *s, size_t len, struct jscan_value *top,
                    size_t *err_at)
{
    c->p = s;
    c->end = s + len;
    c->depth = 0;
    c->n = 0;
    c->overflow = false;
    skip_ws(c);
    int rc = scan_value(c, top);
    if (rc == 0) {
        skip_ws(c);
        if (c->p != c->end)
            rc = -1;
    }
    if (rc < 0 && err_at)
        *err_at = (size_t)(c->p - s);
    return rc;
}

int jscan_check(const char *s, size_t len, size_t *err_at)
{
    struct scan c;
    struct jscan_value top;
    return scan_all(&c, s, len, &top, err_at);
}

/* Four hex digits (already checked) as a number. */
static unsigned long hex4(const char *p)
{
    unsigned long v = 0;
    for (int i = 0; i < 4; i++)
        v = v << 4 | (unsigned long)jscan_hexval(p[i]);
    return v;
}

long jscan_string(const struct jscan_value *v, char *out, size_t max)
{
    const char *p = v->p + 1, *end = v->p + v->len - 1;
    size_t o = 0;

    while (p < end) {
        unsigned long cp;
        if (*p != '\\') {
            if (o >= max)
                return -1;
            out[o++] = *p++;
            continue;
        }
        char e = p[1];
        p += 2;
        if (e != 'u') {
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            if (o >= max)
                return -1;
            out[o++] = to[strchr(from, e) - from];
            continue;
        }
        cp = hex4(p);
        p += 4;
        if (cp >= 0xd800 && cp <= 0xdbff && end - p >= 6 && p[0] == '\\' && p[1] == 'u') {
            unsigned long lo = hex4(p + 2);
            if (lo >= 0xdc00 && lo <= 0xdfff) {
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                p += 6;
            }
        }
        if (o + 4 > max) /* room for the longest form, whatever this one needs */
            return -1;
        if (cp < 0x80) {
            out[o++] = (char)cp;
        } else if (cp < 0x800) {
            out[o++] = (char)(0xc0 | cp >> 6);
            out[o++] = (char)(0x80 | (cp & 0x3f));
        } else if (cp < 0x10000) {
            out[o++] = (char)(0xe0 | cp >> 12);
            out[o++] = (char)(0x80 | ((cp >> 6) & 0x3f));
            out[o++] = (char)(0x80 | (cp & 0x3f));
        } else {
            out[o++] = (char)(0xf0 | cp >> 18);
            out[o++] = (char)(0x80 | ((cp >> 12) & 0x3f));
            out[o++] = (char)(0x80 | ((cp >> 6) & 0x3f));
            out[o++] = (char)(0x80 | (cp & 0x3f));
        }
    }
    out[o] = '\0';
    return (long)o;
}

/* A member name (a string span with its quotes, holding an escape when
 * `esc`) unescaped into out[64]; "" when it does not fit or holds a NUL. */
static void unescape_key(const struct jscan_value *k, bool esc, char *out)
{
    if (!esc) { /* as it is: a valid string without escapes holds no NUL */
        size_t n = k->len - 2;
        if (n > 63)
            n = 0;
        memcpy(out, k->p + 1, n);
        out[n] = '\0';
        return;
    }
    long n = jscan_string(k, out, 63);
    if (n < 0 || memchr(out, '\0', (size_t)n))
        out[0] = '\0';
}

/* Calls fn / efn for each member of the checked outermost container. */
static int emit(struct scan *c, const struct jscan_value *top, jscan_member_fn *fn,
                jscan_element_fn *efn, void *ud)
{
    bool object = top->type == JSCAN_OBJECT;
    char key[64];
    int rc;

    if (!c->overflow) {
        for (size_t i = 0; i < c->n; i++) {
            if (object) {
                unescape_key(&c->keys[i], c->key_esc[i], key);
                rc = fn(ud, key, &c->vals[i]);
            } else {
                rc = efn(ud, &c->vals[i]);
            }
            if (rc)
                return rc;
        }
        return 0;
    }
    /* More members than recorded: walk the (valid) text again, shallowly. */
    struct scan w;
    w.p = top->p + 1;
    w.end = top->p + top->len - 1;
    w.depth = 1; /* nothing below is recorded */
    for (;;) {
        struct jscan_value k = { JSCAN_STRING, NULL, 0 }, v;
        bool k_esc = false;
        skip_ws(&w);
        if (w.p >= w.end)
            return 0;
        if (object) {
            k.p = w.p;
            scan_string(&w);
            k.len = (size_t)(w.p - k.p);
            k_esc = w.esc;
            skip_ws(&w);
            w.p++; /* ':' */
            skip_ws(&w);
        }
        scan_value(&w, &v);
        if (object) {
            unescape_key(&k, k_esc, key);
            rc = fn(ud, key, &v);
        } else {
            rc = efn(ud, &v);
        }
        if (rc)
            return rc;
        skip_ws(&w);
        if (w.p < w.end && *w.p == ',')
            w.p++;
    }
}

int jscan_object(const char *s, size_t len, jscan_member_fn *fn, void *ud, size_t *err_at)
{
    struct scan c;
    struct jscan_value top;

    if (scan_all(&c, s, len, &top, err_at) < 0)
        return -1;
    if (top.type != JSCAN_OBJECT)
        return -2;
    return fn ? emit(&c, &top, fn, NULL, ud) : 0;
}

int jscan_array(const char *s, size_t len, jscan_element_fn *fn, void *ud, size_t *err_at)
{
    struct scan c;
    struct jscan_value top;

    if (scan_all(&c, s, len, &top, err_at) < 0)
        return -1;
    if (top.type != JSCAN_ARRAY)
        return -2;
    return fn ? emit(&c, &top, NULL, fn, ud) : 0;
}

bool jscan_number(const struct jscan_value *v, double *out)
{
    char buf[64];

    if (v->type != JSCAN_NUMBER || v->len >= sizeof(buf))
        return false;
    memcpy(buf, v->p, v->len);
    buf[v->len] = '\0';
    *out = strtod(buf, NULL);
    return true;
}

char *jscan_strdup(const struct jscan_value *v)
{
    if (!v->p)
        return NULL;
    char *s = malloc(v->len + 1);
    if (s && jscan_string(v, s, v->len) < 0) {
        free(s);
        return NULL;
    }
    return s;
}
