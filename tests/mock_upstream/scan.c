/*
 * scan.c — the benchmark fast path's request reader: one pass over a chat
 * request body, no allocation, no decoding.
 *
 * It is deliberately conservative. It accepts only what it can judge
 * exactly like jansson would — ASCII strings with simple escapes, short
 * plain numbers, nesting up to SCAN_MAX_DEPTH — and only the plain shape
 * (no "mock", no "stream": true, every message content a string or null).
 * Anything else returns -1 and the caller takes the jansson path, so the
 * two paths never disagree on what is valid or on what is answered.
 */
#include "internal.h"

#include <string.h>

#define SCAN_MAX_DEPTH 32

struct scanner {
    const char *p, *end;
};

static void ws(struct scanner *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t'))
        s->p++;
}

/* At an opening quote: the raw (still escaped) contents and their decoded
 * length. ASCII and simple escapes only. */
static int str(struct scanner *s, const char **raw, size_t *rawlen, size_t *decoded)
{
    if (s->p >= s->end || *s->p != '"')
        return -1;
    const char *start = ++s->p;
    size_t escapes = 0;
    while (s->p < s->end) {
        unsigned char ch = (unsigned char)*s->p;
        if (ch == '"') {
            *raw = start;
            *rawlen = (size_t)(s->p - start);
            *decoded = *rawlen - escapes;
            s->p++;
            return 0;
        }
        if (ch < 0x20 || ch >= 0x80)
            return -1;
        if (ch == '\\') {
            if (s->p + 1 >= s->end || !strchr("\"\\/bfnrt", s->p[1]) || !s->p[1])
                return -1; /* \u and anything odd: let jansson judge */
            escapes++;
            s->p++;
        }
        s->p++;
    }
    return -1;
}

static int num(struct scanner *s)
{
    const char *start = s->p;
    if (s->p < s->end && *s->p == '-')
        s->p++;
    if (s->p >= s->end || *s->p < '0' || *s->p > '9')
        return -1;
    if (*s->p == '0')
        s->p++;
    else
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
            s->p++;
    if (s->p < s->end && *s->p == '.') {
        s->p++;
        if (s->p >= s->end || *s->p < '0' || *s->p > '9')
            return -1;
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
            s->p++;
    }
    if (s->p < s->end && (*s->p == 'e' || *s->p == 'E'))
        return -1; /* overflow rules: jansson's call */
    return s->p - start > 15 ? -1 : 0;
}

static int lit(struct scanner *s, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n))
        return -1;
    s->p += n;
    return 0;
}

static int value(struct scanner *s, int depth)
{
    const char *raw;
    size_t rl, dl;
    if (depth > SCAN_MAX_DEPTH || s->p >= s->end)
        return -1;
    switch (*s->p) {
    case '"':
        return str(s, &raw, &rl, &dl);
    case 't':
        return lit(s, "true");
    case 'f':
        return lit(s, "false");
    case 'n':
        return lit(s, "null");
    case '{':
        s->p++;
        ws(s);
        if (s->p < s->end && *s->p == '}') {
            s->p++;
            return 0;
        }
        for (;;) {
            if (str(s, &raw, &rl, &dl))
                return -1;
            ws(s);
            if (s->p >= s->end || *s->p++ != ':')
                return -1;
            ws(s);
            if (value(s, depth + 1))
                return -1;
            ws(s);
            if (s->p >= s->end)
                return -1;
            if (*s->p == '}') {
                s->p++;
                return 0;
            }
            if (*s->p++ != ',')
                return -1;
            ws(s);
        }
    case '[':
        s->p++;
        ws(s);
        if (s->p < s->end && *s->p == ']') {
            s->p++;
            return 0;
        }
        for (;;) {
            if (value(s, depth + 1))
                return -1;
            ws(s);
            if (s->p >= s->end)
                return -1;
            if (*s->p == ']') {
                s->p++;
                return 0;
            }
            if (*s->p++ != ',')
                return -1;
            ws(s);
        }
    default:
        return num(s);
    }
}

static bool key_is(const char *raw, size_t rl, const char *k)
{
    return strlen(k) == rl && !memcmp(raw, k, rl);
}

/* One message object: records a string "content" as the latest echo. */
static int message(struct scanner *s, struct scan_chat *out)
{
    const char *raw;
    size_t rl, dl;
    if (s->p >= s->end || *s->p++ != '{')
        return -1;
    ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return 0;
    }
    for (;;) {
        if (str(s, &raw, &rl, &dl))
            return -1;
        bool content = key_is(raw, rl, "content");
        ws(s);
        if (s->p >= s->end || *s->p++ != ':')
            return -1;
        ws(s);
        if (content && s->p < s->end && *s->p == '"') {
            if (str(s, &raw, &rl, &dl))
                return -1;
            out->echo = raw;
            out->echo_len = rl;
            out->echo_decoded = dl;
            out->prompt_bytes += dl;
        } else if (content && s->p < s->end && *s->p != 'n') {
            return -1; /* content parts: jansson path */
        } else if (value(s, 3)) {
            return -1;
        }
        ws(s);
        if (s->p >= s->end)
            return -1;
        if (*s->p == '}') {
            s->p++;
            return 0;
        }
        if (*s->p++ != ',')
            return -1;
        ws(s);
    }
}

int scan_chat(const char *p, size_t n, struct scan_chat *out)
{
    struct scanner s = { p, p + n };
    const char *raw;
    size_t rl, dl;
    memset(out, 0, sizeof *out);
    ws(&s);
    if (s.p >= s.end || *s.p++ != '{')
        return -1;
    ws(&s);
    if (s.p < s.end && *s.p == '}') {
        s.p++;
        goto end;
    }
    for (;;) {
        if (str(&s, &raw, &rl, &dl))
            return -1;
        ws(&s);
        if (s.p >= s.end || *s.p++ != ':')
            return -1;
        ws(&s);
        if (key_is(raw, rl, "mock")) {
            return -1;
        } else if (key_is(raw, rl, "stream")) {
            if (lit(&s, "false") && lit(&s, "null"))
                return -1; /* true (or odd): the streaming path */
        } else if (key_is(raw, rl, "model")) {
            if (s.p >= s.end || *s.p != '"')
                return -1;
            if (str(&s, &out->model, &out->model_len, &dl))
                return -1;
        } else if (key_is(raw, rl, "messages")) {
            if (s.p >= s.end || *s.p++ != '[')
                return -1;
            out->echo = NULL; /* a repeated key: the last one wins */
            out->echo_len = out->echo_decoded = out->prompt_bytes = 0;
            ws(&s);
            if (s.p < s.end && *s.p == ']') {
                s.p++;
            } else {
                for (;;) {
                    if (message(&s, out))
                        return -1;
                    ws(&s);
                    if (s.p >= s.end)
                        return -1;
                    if (*s.p == ']') {
                        s.p++;
                        break;
                    }
                    if (*s.p++ != ',')
                        return -1;
                    ws(&s);
                }
            }
        } else if (value(&s, 1)) {
            return -1;
        }
        ws(&s);
        if (s.p >= s.end)
            return -1;
        if (*s.p == '}') {
            s.p++;
            break;
        }
        if (*s.p++ != ',')
            return -1;
        ws(&s);
    }
end:
    ws(&s);
    return s.p == s.end ? 0 : -1;
}
