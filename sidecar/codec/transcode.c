/* transcode.c — msgpack <-> JSON for upstream bodies.
 *
 * msgpack -> JSON is on every call's hot path, so it writes text straight
 * from the msgpack object into one growable buffer: no JSON tree, no
 * per-element allocation, one pass per string that validates UTF-8 and
 * escapes together. The path to the current value is kept in a fixed array
 * (one pointer store per element) and only turned into text on failure.
 *
 * JSON -> msgpack is on the path of every reply and stream event. It is a
 * single pass over the text (below) that packs as it lexes; the jansson
 * version it replaced (parse a tree, walk it into the packer: ~20 ns per
 * input byte) is kept under tests/ref/ as the reference it must agree
 * with. */
#include "transcode.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jscan.h"
#include "jsonw.h"
#include "utf8.h"

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

static void errw_printf(struct errw *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

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
    struct strbuf *out;
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

/* Floats as jsonw_double() writes them; NaN and infinities are rejected
 * with the path. */
static int put_float(struct m2j *cx, unsigned depth, double d, bool is_f32)
{
    if (isnan(d))
        return m2j_fail(cx, depth, "NaN cannot be sent as JSON");
    if (isinf(d))
        return m2j_fail(cx, depth, "%sInfinity cannot be sent as JSON", d < 0 ? "-" : "");
    return jsonw_double(cx->out, d, is_f32);
}

static int m2j_string(struct m2j *cx, unsigned depth, const char *s, size_t n)
{
    size_t bad_at = 0;
    int rc = jsonw_str(cx->out, s, n, &bad_at);

    if (rc == JSONW_EBADUTF8)
        return m2j_fail(cx, depth, "string is not valid UTF-8 (byte %zu of %zu)", bad_at, n);
    return rc;
}

static const char *m2j_type_name(msgpack_object_type t)
{
    switch (t) {
    case MSGPACK_OBJECT_NIL:
        return "nil";
    case MSGPACK_OBJECT_BOOLEAN:
        return "a boolean";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return "an integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return "a float";
    case MSGPACK_OBJECT_STR:
        return "a string";
    case MSGPACK_OBJECT_ARRAY:
        return "an array";
    case MSGPACK_OBJECT_MAP:
        return "a map";
    case MSGPACK_OBJECT_BIN:
        return "binary data";
    case MSGPACK_OBJECT_EXT:
        return "an ext value";
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
    struct strbuf *b = cx->out;
    int rc;

    if (strbuf_putc(b, '{') < 0)
        return TRANSCODE_ENOMEM;
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        if (kv->key.type != MSGPACK_OBJECT_STR)
            return m2j_fail(cx, depth, "map key #%u is %s; JSON object keys must be strings",
                            (unsigned)i, m2j_type_name(kv->key.type));
        if (i > 0 && strbuf_putc(b, ',') < 0)
            return TRANSCODE_ENOMEM;
        size_t bad_at = 0;
        rc = jsonw_str(b, kv->key.via.str.ptr, kv->key.via.str.size, &bad_at);
        if (rc == JSONW_EBADUTF8)
            return m2j_fail(cx, depth, "map key #%u is not valid UTF-8 (byte %zu of %u)",
                            (unsigned)i, bad_at, (unsigned)kv->key.via.str.size);
        if (rc < 0 || strbuf_putc(b, ':') < 0)
            return TRANSCODE_ENOMEM;
        cx->path[depth].key = kv->key.via.str.ptr;
        cx->path[depth].key_len = kv->key.via.str.size;
        if (ov && ov->model && str_is(&kv->key, "model", 5)) {
            seen_model = true;
            rc = m2j_string(cx, depth + 1, ov->model, strlen(ov->model));
        } else if (ov && ov->stream != TRANSCODE_STREAM_KEEP && str_is(&kv->key, "stream", 6)) {
            seen_stream = true;
            rc = ov->stream == TRANSCODE_STREAM_TRUE ? strbuf_puts(b, "true")
                                                     : strbuf_puts(b, "false");
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
        if ((o->via.map.size > 0 && strbuf_putc(b, ',') < 0) || strbuf_puts(b, "\"model\":") < 0)
            return TRANSCODE_ENOMEM;
        rc = m2j_string(cx, depth + 1, ov->model, strlen(ov->model));
        if (rc < 0)
            return rc;
    }
    if (ov && ov->stream != TRANSCODE_STREAM_KEEP && !seen_stream) {
        bool first = o->via.map.size == 0 && !(ov->model && !seen_model);
        if ((!first && strbuf_putc(b, ',') < 0) ||
            (ov->stream == TRANSCODE_STREAM_TRUE ? strbuf_puts(b, "\"stream\":true")
                                                 : strbuf_puts(b, "\"stream\":false")) < 0)
            return TRANSCODE_ENOMEM;
    }
    return strbuf_putc(b, '}');
}

/* `depth` is the number of containers around `o`; path[0..depth-1] leads to it. */
static int m2j_value(struct m2j *cx, const msgpack_object *o, unsigned depth)
{
    struct strbuf *b = cx->out;
    int rc;

    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        return strbuf_puts(b, "null");
    case MSGPACK_OBJECT_BOOLEAN:
        return o->via.boolean ? strbuf_puts(b, "true") : strbuf_puts(b, "false");
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return jsonw_u64(b, o->via.u64);
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return jsonw_i64(b, o->via.i64);
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
        if (strbuf_putc(b, '[') < 0)
            return TRANSCODE_ENOMEM;
        cx->path[depth].key = NULL;
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            if (i > 0 && strbuf_putc(b, ',') < 0)
                return TRANSCODE_ENOMEM;
            cx->path[depth].index = i;
            rc = m2j_value(cx, &o->via.array.ptr[i], depth + 1);
            if (rc < 0)
                return rc;
        }
        return strbuf_putc(b, ']');
    case MSGPACK_OBJECT_MAP:
        if (depth >= TRANSCODE_MAX_DEPTH)
            return m2j_fail(cx, depth, "nested deeper than %d levels", TRANSCODE_MAX_DEPTH);
        return m2j_map(cx, o, depth);
    }
    return m2j_fail(cx, depth, "unknown msgpack type %d", (int)o->type);
}

int transcode_msgpack_to_json(const msgpack_object *o, struct strbuf *out,
                              const struct transcode_override *ov, const char *root, char *err,
                              size_t errlen)
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
        out->data[out->len] = '\0'; /* strbuf always keeps a byte for it */
    return rc;
}

/* ------------------------------------------------------------------------
 * JSON -> msgpack in one pass.
 *
 * The text is lexed and packed as it is read: strings are copied (or
 * unescaped) straight into the output, containers get a one-byte header
 * that is widened in place when they close with 16 members or more, and
 * the rest of the output is moved at most once per such container. Object
 * members are recorded on a stack (the open objects' members are always
 * contiguous on it) so that a duplicated key can be found and the object
 * rebuilt when it closes, last value at the first position, as jansson
 * builds its tree. The result is the same, byte for byte, as packing
 * jansson's tree (transcode_json_to_msgpack_jansson(), the oracle the
 * differential fuzz target compares against), errors included: the lexer
 * follows jansson's, token by token, so that the first error, its line,
 * column and quoted excerpt are the ones jansson would report. */

/* jansson refuses values nested deeper than this (its JSON_PARSER_MAX_DEPTH,
 * counting scalars as one level) with "maximum parsing depth reached". */
#define J_PARSER_MAX_DEPTH 2048

/* Objects with more members than this (duplicates included) find
 * duplicates through a hash index rather than by a linear scan. */
#define J_LINEAR_KEYS 16

enum {
    T_EOF = 0,
    T_INVALID = 1,
    T_STRING = 256,
    T_INT,
    T_REAL,
    T_TRUE,
    T_FALSE,
    T_NULL,
};

/* A value's outcome, which (like jansson's walk) only counts once the whole
 * text is known to be valid JSON, and then in output order. */
enum { J_OK = 0, J_DEEP = 1, J_HOOK = 2 };

struct jmember {
    const char *raw;  /* the key between its quotes, as in the input */
    uint32_t raw_len; /* bytes of raw */
    uint32_t dlen;    /* bytes of the decoded key */
    uint32_t hash;    /* of the decoded key */
    uint32_t winner;  /* index (on the member stack) of the value that wins */
    size_t key_off;   /* output offsets: key, value, end of value */
    size_t val_off, val_end;
    uint8_t key_status, val_status;
    bool esc; /* raw holds escapes */
    bool dup; /* a later occurrence of an earlier key: dropped at close */
};

struct jframe {
    size_t hdr_off; /* the one-byte header written at open */
    size_t mbase;   /* first member on the member stack (objects) */
    uint32_t n;     /* elements, or members including duplicates */
    uint32_t unique;
    uint8_t status; /* first non-J_OK element (arrays, objects without duplicates) */
    bool obj, has_dups;
    uint32_t *ht; /* member index + 1 by hash, when there are many members */
    uint32_t ht_cap;
};

struct jlex {
    const unsigned char *s, *p, *end;
    int tok;
    const unsigned char *tok_start, *tok_end; /* the token's text */
    /* NUL bytes jansson read after a token and lost when it gave them back
     * (its stream takes a NUL for "nothing buffered"): they are skipped,
     * and do not count in the positions of later errors */
    size_t *drops, n_drops, cap_drops;
    /* T_STRING: the text between the quotes */
    const unsigned char *str;
    size_t str_len;
    bool str_esc, str_nul;
    int64_t ival;
    double dval;
    /* the first error: its message, its class, and where it happened */
    bool failed, overflow;
    size_t err_pos;
    char msg[200]; /* jansson's json_error_t.text holds 160: never reached */
};

struct jout {
    char *p;
    size_t len, cap;
    bool heap;
};

struct j1 {
    struct jlex lx;
    struct jout out;
    unsigned max_depth;
    transcode_str_fn *on_str;
    void *ud;
    const char *const *pick;
    struct transcode_span *picked;
    uint64_t seed;        /* of key_hash */
    unsigned depth;       /* open containers */
    unsigned quiet_depth; /* > 0: inside a container too deep to pack, opened at this depth */
    struct jframe frames[TRANSCODE_MAX_DEPTH];
    struct jmember *mem;
    size_t mem_n, mem_cap;
    bool mem_heap, oom;
    unsigned char kinds[J_PARSER_MAX_DEPTH]; /* '{' or '[' per open container */
};

/* ---- output ---- */

static int jout_grow(struct j1 *cx, size_t need)
{
    struct jout *o = &cx->out;
    size_t cap = o->cap * 2;
    char *np;

    if (cap < o->len + need)
        cap = o->len + need;
    if (o->heap) {
        np = realloc(o->p, cap);
    } else {
        np = malloc(cap);
        if (np)
            memcpy(np, o->p, o->len);
    }
    if (!np) {
        cx->oom = true;
        return -1;
    }
    o->p = np;
    o->cap = cap;
    o->heap = true;
    return 0;
}

/* Room for n more bytes; on failure cx->oom is set and the caller stops. */
static inline int jout_room(struct j1 *cx, size_t n)
{
    if (cx->out.cap - cx->out.len >= n)
        return 0;
    return jout_grow(cx, n);
}

static inline void put_be16(char *p, uint16_t v)
{
    p[0] = (char)(v >> 8);
    p[1] = (char)v;
}

static inline void put_be32(char *p, uint32_t v)
{
    p[0] = (char)(v >> 24);
    p[1] = (char)(v >> 16);
    p[2] = (char)(v >> 8);
    p[3] = (char)v;
}

static inline void put_be64(char *p, uint64_t v)
{
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

/* Bytes of a str header for n bytes (as msgpack_pack_str writes it). */
static inline size_t str_hdr_len(size_t n)
{
    return n < 32 ? 1 : n < 256 ? 2 : n < 65536 ? 3 : 5;
}

static inline void str_hdr(char *p, size_t n)
{
    if (n < 32) {
        p[0] = (char)(0xa0 | n);
    } else if (n < 256) {
        p[0] = (char)0xd9;
        p[1] = (char)n;
    } else if (n < 65536) {
        p[0] = (char)0xda;
        put_be16(p + 1, (uint16_t)n);
    } else {
        p[0] = (char)0xdb;
        put_be32(p + 1, (uint32_t)n);
    }
}

static int jout_byte(struct j1 *cx, unsigned char b)
{
    if (jout_room(cx, 1) < 0)
        return -1;
    cx->out.p[cx->out.len++] = (char)b;
    return 0;
}

/* A tag byte and the low `bytes` bytes of v, big-endian; returns the length. */
static size_t put_tagged(char *p, unsigned char tag, uint64_t v, size_t bytes)
{
    p[0] = (char)tag;
    for (size_t i = 0; i < bytes; i++)
        p[1 + i] = (char)(v >> (8 * (bytes - 1 - i)));
    return 1 + bytes;
}

/* An int64 in the smallest encoding, as msgpack_pack_int64 writes it. */
static int jout_int(struct j1 *cx, int64_t d)
{
    uint64_t u = (uint64_t)d;
    char *p;

    if (jout_room(cx, 9) < 0)
        return -1;
    p = cx->out.p + cx->out.len;
    if (d >= -(1LL << 5) && d < (1 << 7)) {
        p[0] = (char)d; /* a fixint */
        cx->out.len += 1;
    } else if (d < 0) {
        cx->out.len += d >= -(1 << 7) ? put_tagged(p, 0xd0, u, 1)
            : d >= -(1 << 15)         ? put_tagged(p, 0xd1, u, 2)
            : d >= -(1LL << 31)       ? put_tagged(p, 0xd2, u, 4)
                                      : put_tagged(p, 0xd3, u, 8);
    } else {
        cx->out.len += d < (1 << 8) ? put_tagged(p, 0xcc, u, 1)
            : d < (1 << 16)         ? put_tagged(p, 0xcd, u, 2)
            : d < (1LL << 32)       ? put_tagged(p, 0xce, u, 4)
                                    : put_tagged(p, 0xcf, u, 8);
    }
    return 0;
}

static int jout_double(struct j1 *cx, double d)
{
    uint64_t bits;

    if (jout_room(cx, 9) < 0)
        return -1;
    memcpy(&bits, &d, sizeof(bits));
    cx->out.p[cx->out.len] = (char)0xcb;
    put_be64(cx->out.p + cx->out.len + 1, bits);
    cx->out.len += 9;
    return 0;
}

/* ---- lexer (jansson's, on spans) ---- */

static inline bool l_isdigit(int c)
{
    return c >= '0' && c <= '9';
}

static inline bool l_isalpha(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* Nonzero for a byte jansson counts as a column (utf8_check_first). */
static bool counts_column(unsigned char c)
{
    return c < 0x80 || (c >= 0xc2 && c <= 0xf4);
}

static void lex_fail(struct jlex *lx, const unsigned char *at, bool utf8, bool overflow,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Records the first error as jansson's error_set() words it: the message,
 * then the token read so far ("near '...'", when it is 1..20 bytes), or
 * "near end of file" when nothing of it was read (not after a UTF-8
 * error). `at` is jansson's stream position at that point. */
static void lex_fail(struct jlex *lx, const unsigned char *at, bool utf8, bool overflow,
                     const char *fmt, ...)
{
    char text[120];
    va_list ap;

    if (lx->failed)
        return;
    lx->failed = true;
    lx->overflow = overflow;
    lx->err_pos = (size_t)(at - lx->s);
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    size_t saved = (size_t)(at - lx->tok_start);
    size_t shown = strnlen((const char *)lx->tok_start, saved);
    if (saved > 0 && shown > 0) {
        if (saved <= 20)
            snprintf(lx->msg, sizeof(lx->msg), "%s near '%.*s'", text, (int)shown,
                     (const char *)lx->tok_start);
        else
            snprintf(lx->msg, sizeof(lx->msg), "%s", text);
    } else if (utf8) {
        snprintf(lx->msg, sizeof(lx->msg), "%s", text);
    } else {
        snprintf(lx->msg, sizeof(lx->msg), "%s near end of file", text);
    }
}

/* A byte >= 0x80 that jansson reads at p: the length of the UTF-8
 * sequence it starts, or 0 (and the error) when it starts none. */
static size_t lex_utf8_len(struct jlex *lx, const unsigned char *p)
{
    size_t n = utf8_seq_len(p, lx->end);

    if (!n)
        lex_fail(lx, p, true, false, "unable to decode byte 0x%x", *p);
    return n;
}

static bool lex_utf8_ok(struct jlex *lx, const unsigned char *p)
{
    return lex_utf8_len(lx, p) > 0;
}

/* Reads the byte after a number or a word, as jansson does (and gives back). */
static bool lex_lookahead_ok(struct jlex *lx, const unsigned char *p)
{
    return p >= lx->end || *p < 0x80 || lex_utf8_ok(lx, p);
}

/* The end of a number or word at p: a NUL after it is skipped (see
 * struct jlex). Returns where the next token starts, or NULL (oom). */
static const unsigned char *lex_token_end(struct jlex *lx, const unsigned char *p)
{
    lx->tok_end = p;
    if (p >= lx->end || *p != '\0')
        return p;
    if (lx->n_drops == lx->cap_drops) {
        size_t cap = lx->cap_drops ? lx->cap_drops * 2 : 16;
        size_t *nd = realloc(lx->drops, cap * sizeof(*nd));
        if (!nd)
            return NULL;
        lx->drops = nd;
        lx->cap_drops = cap;
    }
    lx->drops[lx->n_drops++] = (size_t)(p - lx->s);
    return p + 1;
}

static uint32_t hex4(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v = v << 4 | (uint32_t)jscan_hexval((char)p[i]);
    return v;
}

/* The string at lx->p (its opening quote). Two passes as in jansson: the
 * syntax (escapes, control characters, UTF-8) up to the closing quote,
 * then the pairing of \u surrogates, whose first error is reported only
 * once the first pass succeeded. */
static void lex_string(struct jlex *lx)
{
    const unsigned char *p = lx->p + 1, *end = lx->end;
    uint32_t bad1 = 0, bad2 = 0; /* the first unpaired surrogate (and what followed it) */
    bool bad = false, pair = false, esc = false, nul = false;
    uint32_t hi = 0;

    lx->tok = T_INVALID;
    for (;;) {
        p = jscan_plain_run(p, end);
        if (p >= end) {
            lex_fail(lx, end, false, false, "premature end of input");
            return;
        }
        unsigned char c = *p;
        if (c == '"')
            break;
        if (c < 0x20) {
            if (c == '\n')
                lex_fail(lx, p, false, false, "unexpected newline");
            else
                lex_fail(lx, p, false, false, "control character 0x%x", c);
            return;
        }
        if (c >= 0x80) {
            size_t n = lex_utf8_len(lx, p);
            if (!n)
                return;
            p += n;
            if (hi && !bad) {
                bad = true;
                bad1 = hi;
            }
            hi = 0;
            continue;
        }
        /* a backslash */
        esc = true;
        if (p + 1 >= end) {
            lex_fail(lx, end, false, false, "invalid escape");
            return;
        }
        unsigned char e = p[1];
        if (e >= 0x80 && !lex_utf8_ok(lx, p + 1))
            return;
        if (e == 'u') {
            for (int i = 0; i < 4; i++) {
                const unsigned char *h = p + 2 + i;
                if (h >= end) {
                    lex_fail(lx, end, false, false, "invalid escape");
                    return;
                }
                if (*h >= 0x80 && !lex_utf8_ok(lx, h))
                    return;
                if (jscan_hexval((char)*h) < 0) {
                    lex_fail(lx, h + 1, false, false, "invalid escape");
                    return;
                }
            }
            uint32_t v = hex4(p + 2);
            if (v == 0)
                nul = true;
            if (hi) {
                if ((v < 0xdc00 || v > 0xdfff) && !bad) {
                    bad = true;
                    pair = true;
                    bad1 = hi;
                    bad2 = v;
                }
                hi = 0;
            } else if (v >= 0xd800 && v <= 0xdbff) {
                if (end - p >= 8 && p[6] == '\\' && p[7] == 'u')
                    hi = v;
                else if (!bad) {
                    bad = true;
                    bad1 = v;
                }
            } else if (v >= 0xdc00 && v <= 0xdfff && !bad) {
                bad = true;
                bad1 = v;
            }
            p += 6;
            continue;
        }
        if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' ||
            e == 't') {
            if (hi && !bad) {
                bad = true;
                bad1 = hi;
            }
            hi = 0;
            p += 2;
            continue;
        }
        lex_fail(lx, p + 2, false, false, "invalid escape");
        return;
    }
    lx->p = p + 1;
    if (bad) {
        if (pair)
            lex_fail(lx, lx->p, false, false, "invalid Unicode '\\u%04X\\u%04X'", (unsigned)bad1,
                     (unsigned)bad2);
        else
            lex_fail(lx, lx->p, false, false, "invalid Unicode '\\u%04X'", (unsigned)bad1);
        return;
    }
    lx->tok = T_STRING;
    lx->str = lx->tok_start + 1;
    lx->str_len = (size_t)(p - lx->str);
    lx->str_esc = esc;
    lx->str_nul = nul;
}

/* Unescapes a string that lex_string() accepted into dst (room for n
 * bytes: the result is never longer); returns its length. */
static size_t unescape(const unsigned char *s, size_t n, char *dst)
{
    const unsigned char *p = s, *end = s + n;
    char *t = dst;

    while (p < end) {
        const unsigned char *run = p;
        while (p < end && *p != '\\')
            p++;
        memcpy(t, run, (size_t)(p - run));
        t += p - run;
        if (p >= end)
            break;
        unsigned char e = p[1];
        if (e != 'u') {
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            *t++ = to[strchr(from, e) - from];
            p += 2;
            continue;
        }
        uint32_t cp = hex4(p + 2);
        p += 6;
        if (cp >= 0xd800 && cp <= 0xdbff) {
            cp = 0x10000 + ((cp - 0xd800) << 10) + (hex4(p + 2) - 0xdc00);
            p += 6;
        }
        if (cp < 0x80) {
            *t++ = (char)cp;
        } else if (cp < 0x800) {
            *t++ = (char)(0xc0 | cp >> 6);
            *t++ = (char)(0x80 | (cp & 0x3f));
        } else if (cp < 0x10000) {
            *t++ = (char)(0xe0 | cp >> 12);
            *t++ = (char)(0x80 | ((cp >> 6) & 0x3f));
            *t++ = (char)(0x80 | (cp & 0x3f));
        } else {
            *t++ = (char)(0xf0 | cp >> 18);
            *t++ = (char)(0x80 | ((cp >> 12) & 0x3f));
            *t++ = (char)(0x80 | ((cp >> 6) & 0x3f));
            *t++ = (char)(0x80 | (cp & 0x3f));
        }
    }
    return (size_t)(t - dst);
}

/* A run of digits at p, read as jansson's number lexer reads it: the byte
 * after the run is read too (and must be valid UTF-8). Returns the end of
 * the run (p itself when there is no digit), or NULL after an error. */
static const unsigned char *lex_digits(struct jlex *lx, const unsigned char *p)
{
    const unsigned char *q = p;

    if (p < lx->end && *p >= 0x80 && !lex_utf8_ok(lx, p))
        return NULL;
    while (q < lx->end && l_isdigit(*q))
        q++;
    if (q != p && !lex_lookahead_ok(lx, q))
        return NULL;
    return q;
}

/* A number at lx->p (a digit or '-'), as jansson's lex_scan_number: an
 * integer must fit in int64 (strtoll), a real is strtod's (overflow to
 * infinity is an error, underflow is not). */
/* strtod in the C locale: JSON's decimal point is '.' whatever LC_NUMERIC
 * the process runs in (jansson rewrites the text for the same reason). */
static double c_strtod(const char *text)
{
    static locale_t c_loc;

    if (!c_loc)
        c_loc = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    return c_loc ? strtod_l(text, NULL, c_loc) : strtod(text, NULL);
}

static void lex_number(struct jlex *lx, bool *oom)
{
    const unsigned char *p = lx->p, *end = lx->end;
    bool neg = false;

    lx->tok = T_INVALID;
    if (*p == '-') {
        neg = true;
        p++;
    }
    if (p < end && *p >= 0x80 && !lex_utf8_ok(lx, p))
        return;
    const unsigned char *digits = p;
    if (p < end && *p == '0') {
        p++;
        if (!lex_lookahead_ok(lx, p))
            return;
        if (p < end && l_isdigit(*p)) {
            lx->p = p;
            return;
        }
    } else if (p < end && l_isdigit(*p)) {
        p = lex_digits(lx, p);
        if (!p)
            return;
    } else {
        lx->p = p;
        return;
    }
    if (p >= end || (*p != '.' && *p != 'e' && *p != 'E')) {
        uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        bool range = false;
        for (const unsigned char *d = digits; d < p; d++) {
            unsigned dig = (unsigned)(*d - '0');
            if (v > (lim - dig) / 10) {
                range = true;
                break;
            }
            v = v * 10 + dig;
        }
        lx->p = p;
        if (range) {
            lex_fail(lx, p, false, true, neg ? "too big negative integer" : "too big integer");
            return;
        }
        lx->tok = T_INT;
        lx->ival = neg ? (int64_t)(0 - v) : (int64_t)v;
        return;
    }
    if (*p == '.') {
        const unsigned char *q = lex_digits(lx, p + 1);
        if (!q)
            return;
        if (q == p + 1) {
            lx->p = q;
            return;
        }
        p = q;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && *p >= 0x80 && !lex_utf8_ok(lx, p))
            return;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        const unsigned char *q = lex_digits(lx, p);
        if (!q)
            return;
        if (q == p) {
            lx->p = p;
            return;
        }
        p = q;
    }
    lx->p = p;

    char small[64], *buf = small;
    size_t n = (size_t)(p - lx->tok_start);
    if (n >= sizeof(small)) {
        buf = malloc(n + 1);
        if (!buf) {
            *oom = true;
            return;
        }
    }
    memcpy(buf, lx->tok_start, n);
    buf[n] = '\0';
    errno = 0;
    double d = c_strtod(buf);
    bool over = (d == HUGE_VAL || d == -HUGE_VAL) && errno == ERANGE;
    if (buf != small)
        free(buf);
    if (over) {
        lex_fail(lx, p, false, true, "real number overflow");
        return;
    }
    lx->tok = T_REAL;
    lx->dval = d;
}

static void lex_scan(struct jlex *lx, bool *oom)
{
    const unsigned char *p = lx->p, *end = lx->end;

    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    lx->p = p;
    lx->tok_start = p;
    if (p >= end) {
        lx->tok = T_EOF;
        return;
    }
    unsigned char c = *p;
    switch (c) {
    case '{':
    case '}':
    case '[':
    case ']':
    case ':':
    case ',':
        lx->tok = c;
        lx->p = p + 1;
        return;
    case '"':
        lex_string(lx);
        return;
    default:
        break;
    }
    if (l_isdigit(c) || c == '-') {
        lex_number(lx, oom);
        return;
    }
    lx->tok = T_INVALID;
    if (l_isalpha(c)) {
        while (p < end && l_isalpha(*p))
            p++;
        if (!lex_lookahead_ok(lx, p))
            return;
        lx->p = p;
        size_t n = (size_t)(p - lx->tok_start);
        if (n == 4 && memcmp(lx->tok_start, "true", 4) == 0)
            lx->tok = T_TRUE;
        else if (n == 5 && memcmp(lx->tok_start, "false", 5) == 0)
            lx->tok = T_FALSE;
        else if (n == 4 && memcmp(lx->tok_start, "null", 4) == 0)
            lx->tok = T_NULL;
        return;
    }
    if (c >= 0x80) {
        size_t n = lex_utf8_len(lx, p);
        if (n)
            lx->p = p + n;
        return;
    }
    lx->p = p + 1;
}

/* The next token into lx->tok (T_INVALID after an error, recorded once). */
static void lex_next(struct jlex *lx, bool *oom)
{
    lex_scan(lx, oom);
    lx->tok_end = lx->p;
    if (lx->tok == T_INT || lx->tok == T_REAL || lx->tok == T_TRUE || lx->tok == T_FALSE ||
        lx->tok == T_NULL) {
        const unsigned char *next = lex_token_end(lx, lx->p);
        if (!next)
            *oom = true;
        else
            lx->p = next;
    }
}

/* ---- strings and keys ---- */

/* A hash of a decoded key, eight bytes at a time. `seed` differs between
 * processes (it comes from an address), so that a sender cannot easily
 * choose keys that all collide in the index. */
static uint32_t key_hash(uint64_t seed, const char *s, size_t n)
{
    uint64_t h = seed ^ (n * 0x9e3779b97f4a7c15ull), w;

    for (; n >= 8; s += 8, n -= 8) {
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    return (uint32_t)(h ^ (h >> 29));
}

/* Packs the current T_STRING, decoded, through the hook. For a key, *hash
 * and *dlen receive the hash and length of the decoded text the hook saw
 * (hash may be NULL). Returns J_OK or J_HOOK, or -1 when out of memory. */
static int j1_string(struct j1 *cx, uint32_t *hash, size_t *dlen)
{
    struct jlex *lx = &cx->lx;
    const char *s = (const char *)lx->str;
    size_t n = lx->str_len, start = cx->out.len;
    int status = J_OK;

    if (lx->str_esc) {
        /* Unescaped after room for the widest header, moved down after. */
        if (jout_room(cx, 5 + n) < 0)
            return -1;
        n = unescape(lx->str, lx->str_len, cx->out.p + start + 5);
        s = cx->out.p + start + 5;
    }
    if (hash) {
        *hash = key_hash(cx->seed, s, n);
        *dlen = n;
    }
    const char *hs = s;
    size_t hn = n;
    if (cx->on_str && cx->on_str(cx->ud, &hs, &hn) < 0) {
        status = J_HOOK;
        hs = s;
        hn = n;
    }
    size_t h = str_hdr_len(hn);
    char *base = cx->out.p;
    if (hs >= base && hs < base + cx->out.cap) {
        /* our own unescaped copy (or part of it): moved into place */
        size_t off = (size_t)(hs - base);
        memmove(base + start + h, base + off, hn);
    } else {
        if (jout_room(cx, h + hn) < 0)
            return -1;
        memcpy(cx->out.p + start + h, hs, hn);
    }
    str_hdr(cx->out.p + start, hn);
    cx->out.len = start + h + hn;
    return status;
}

/* Whether two keys (raw spans of the input) decode to the same bytes. */
static bool keys_equal(const struct jmember *a, const struct jmember *b, bool *oom)
{
    if (a->dlen != b->dlen || a->hash != b->hash)
        return false;
    if (!a->esc && !b->esc)
        return memcmp(a->raw, b->raw, a->dlen) == 0;
    char *da = malloc(a->raw_len + 1), *db = malloc(b->raw_len + 1);
    bool eq = false;
    if (!da || !db) {
        *oom = true;
    } else {
        size_t na = unescape((const unsigned char *)a->raw, a->raw_len, da);
        size_t nb = unescape((const unsigned char *)b->raw, b->raw_len, db);
        eq = na == nb && memcmp(da, db, na) == 0;
    }
    free(da);
    free(db);
    return eq;
}

static int ht_insert(struct jframe *f, const struct jmember *mem, uint32_t idx)
{
    if ((f->unique + 1) * 2 > f->ht_cap) {
        uint32_t cap = f->ht_cap ? f->ht_cap * 2 : 64;
        uint32_t *ht = calloc(cap, sizeof(*ht));
        if (!ht)
            return -1;
        for (uint32_t i = 0; i < f->ht_cap; i++) {
            if (!f->ht[i])
                continue;
            uint32_t j = mem[f->mbase + f->ht[i] - 1].hash & (cap - 1);
            while (ht[j])
                j = (j + 1) & (cap - 1);
            ht[j] = f->ht[i];
        }
        free(f->ht);
        f->ht = ht;
        f->ht_cap = cap;
    }
    uint32_t j = mem[f->mbase + idx].hash & (f->ht_cap - 1);
    while (f->ht[j])
        j = (j + 1) & (f->ht_cap - 1);
    f->ht[j] = idx + 1;
    return 0;
}

/* The earlier member with the same key as member `idx` (relative to
 * f->mbase), or -1. */
static long find_key(struct j1 *cx, struct jframe *f, uint32_t idx)
{
    const struct jmember *m = &cx->mem[f->mbase + idx];

    if (f->ht) {
        uint32_t j = m->hash & (f->ht_cap - 1);
        while (f->ht[j]) {
            const struct jmember *o = &cx->mem[f->mbase + f->ht[j] - 1];
            if (keys_equal(o, m, &cx->oom))
                return (long)f->ht[j] - 1;
            j = (j + 1) & (f->ht_cap - 1);
        }
        return -1;
    }
    for (uint32_t i = 0; i < idx; i++) {
        const struct jmember *o = &cx->mem[f->mbase + i];
        if (!o->dup && keys_equal(o, m, &cx->oom))
            return (long)i;
    }
    return -1;
}

/* A member's key (the current T_STRING) in the innermost object. */
static int j1_key(struct j1 *cx)
{
    struct jframe *f = &cx->frames[cx->depth - 1];
    struct jlex *lx = &cx->lx;
    struct jmember *m;
    uint32_t hash;
    size_t dlen;

    if (cx->mem_n == cx->mem_cap) {
        size_t cap = cx->mem_cap * 2;
        struct jmember *nm =
            cx->mem_heap ? realloc(cx->mem, cap * sizeof(*nm)) : malloc(cap * sizeof(*nm));
        if (!nm)
            return -1;
        if (!cx->mem_heap)
            memcpy(nm, cx->mem, cx->mem_n * sizeof(*nm));
        cx->mem = nm;
        cx->mem_cap = cap;
        cx->mem_heap = true;
    }
    m = &cx->mem[cx->mem_n];
    m->key_off = cx->out.len;
    int st = j1_string(cx, &hash, &dlen);
    if (st < 0)
        return -1;
    m->raw = (const char *)lx->str;
    m->raw_len = (uint32_t)lx->str_len;
    m->esc = lx->str_esc;
    m->dlen = (uint32_t)dlen;
    m->hash = hash;
    m->key_status = (uint8_t)st;
    m->val_status = J_OK;
    m->val_off = cx->out.len;
    m->val_end = cx->out.len;
    m->dup = false;
    m->winner = (uint32_t)cx->mem_n;
    cx->mem_n++;
    uint32_t idx = f->n++;
    long prev = find_key(cx, f, idx);
    if (cx->oom)
        return -1;
    if (prev >= 0) {
        m->dup = true;
        cx->mem[f->mbase + (size_t)prev].winner = (uint32_t)(f->mbase + idx);
        f->has_dups = true;
        return 0;
    }
    if (f->ht || f->n > J_LINEAR_KEYS) { /* n, not unique: duplicates make the scan long too */
        if (!f->ht) {
            f->unique = 0;
            for (uint32_t i = 0; i < idx; i++) {
                if (cx->mem[f->mbase + i].dup)
                    continue;
                if (ht_insert(f, cx->mem, i) < 0)
                    return -1;
                f->unique++;
            }
        }
        if (ht_insert(f, cx->mem, idx) < 0)
            return -1;
    }
    f->unique++;
    return 0;
}

/* ---- containers ---- */

static int j1_open(struct j1 *cx, bool obj)
{
    struct jframe *f = &cx->frames[cx->depth];

    if (jout_byte(cx, 0) < 0)
        return -1;
    f->hdr_off = cx->out.len - 1;
    f->mbase = cx->mem_n;
    f->n = f->unique = 0;
    f->status = J_OK;
    f->obj = obj;
    f->has_dups = false;
    f->ht = NULL;
    f->ht_cap = 0;
    cx->depth++;
    return 0;
}

/* Rebuilds an object whose keys repeat: each key once, at its first
 * position, with the last value given for it. Returns the first status. */
static int j1_dedupe(struct j1 *cx, struct jframe *f, uint8_t *status)
{
    size_t start = f->hdr_off + 1, n = cx->out.len - start, o = 0;
    char *tmp = malloc(n ? n : 1);

    if (!tmp)
        return -1;
    *status = J_OK;
    for (size_t i = f->mbase; i < cx->mem_n; i++) {
        const struct jmember *m = &cx->mem[i];
        if (m->dup)
            continue;
        const struct jmember *w = &cx->mem[m->winner];
        memcpy(tmp + o, cx->out.p + m->key_off, m->val_off - m->key_off);
        o += m->val_off - m->key_off;
        memcpy(tmp + o, cx->out.p + w->val_off, w->val_end - w->val_off);
        o += w->val_end - w->val_off;
        if (*status == J_OK)
            *status = m->key_status ? m->key_status : w->val_status;
    }
    memcpy(cx->out.p + start, tmp, o);
    cx->out.len = start + o;
    free(tmp);
    return 0;
}

/* Whether member m's decoded name is `name`. */
static int key_is(const struct jmember *m, const char *name, bool *is)
{
    size_t n = strlen(name);

    *is = false;
    if (m->dlen != n)
        return 0;
    if (!m->esc) {
        *is = memcmp(m->raw, name, n) == 0;
        return 0;
    }
    char *tmp = malloc(m->raw_len + 1);
    if (!tmp)
        return -1;
    *is =
        unescape((const unsigned char *)m->raw, m->raw_len, tmp) == n && memcmp(tmp, name, n) == 0;
    free(tmp);
    return 0;
}

/* Fills cx->picked from the outermost object's members as they will lie
 * once it is closed: duplicates dropped, header widened by `extra`. */
static int j1_pick(struct j1 *cx, const struct jframe *f, size_t extra)
{
    size_t o = f->hdr_off + 1 + extra;

    for (size_t i = f->mbase; i < cx->mem_n; i++) {
        const struct jmember *m = &cx->mem[i];
        if (m->dup)
            continue;
        const struct jmember *w = &cx->mem[m->winner];
        o += m->val_off - m->key_off;
        for (size_t k = 0; cx->pick[k]; k++) {
            bool is;
            if (key_is(m, cx->pick[k], &is) < 0)
                return -1;
            if (is)
                cx->picked[k] = (struct transcode_span){ o, w->val_end - w->val_off };
        }
        o += w->val_end - w->val_off;
    }
    return 0;
}

/* Closes the innermost container: its header gets the final count (and
 * grows in place to 3 or 5 bytes past 15 members). */
static int j1_close(struct j1 *cx, uint8_t *status)
{
    struct jframe *f = &cx->frames[cx->depth - 1];
    uint32_t n = f->obj ? f->unique : f->n;
    int rc = 0;

    *status = f->status;
    size_t extra = n < 16 ? 0 : n < 65536 ? 2 : 4;
    if (cx->depth == 1 && f->obj && cx->pick && j1_pick(cx, f, extra) < 0)
        rc = -1;
    if (rc == 0 && f->has_dups && j1_dedupe(cx, f, status) < 0)
        rc = -1;
    free(f->ht);
    f->ht = NULL;
    cx->mem_n = f->mbase;
    cx->depth--;
    if (rc < 0)
        return -1;
    if (n < 16) {
        cx->out.p[f->hdr_off] = (char)((f->obj ? 0x80 : 0x90) | n);
        return 0;
    }
    if (jout_room(cx, extra) < 0)
        return -1;
    char *h = cx->out.p + f->hdr_off;
    memmove(h + 1 + extra, h + 1, cx->out.len - f->hdr_off - 1);
    cx->out.len += extra;
    if (extra == 2) {
        h[0] = (char)(f->obj ? 0xde : 0xdc);
        put_be16(h + 1, (uint16_t)n);
    } else {
        h[0] = (char)(f->obj ? 0xdf : 0xdd);
        put_be32(h + 1, n);
    }
    return 0;
}

/* A value just packed at the current depth, with its status. */
static void j1_value_done(struct j1 *cx, uint8_t status)
{
    if (cx->depth == 0)
        return;
    struct jframe *f = &cx->frames[cx->depth - 1];
    if (f->obj) {
        struct jmember *m = &cx->mem[cx->mem_n - 1];
        m->val_end = cx->out.len;
        m->val_status = status;
        if (f->status == J_OK && !m->dup)
            f->status = m->key_status ? m->key_status : status;
    } else {
        f->n++;
        if (f->status == J_OK)
            f->status = status;
    }
}

/* ---- parser (jansson's grammar and messages, without recursion) ---- */

/* The top value's status, or -1 for an error (lx.failed, or cx->oom). */
static int j1_parse(struct j1 *cx)
{
    struct jlex *lx = &cx->lx;
    unsigned vdepth = 0; /* open containers, packed or not */
    uint8_t st = J_OK, top = J_OK;
    bool quiet = false;

    lex_next(lx, &cx->oom);
value:
    if (lx->failed || cx->oom)
        return -1;
    if (vdepth + 1 > J_PARSER_MAX_DEPTH) {
        lex_fail(lx, lx->tok_end, false, false, "maximum parsing depth reached");
        return -1;
    }
    switch (lx->tok) {
    case '{':
    case '[':
        cx->kinds[vdepth++] = (unsigned char)lx->tok;
        if (!quiet && cx->depth >= cx->max_depth) {
            quiet = true;
            cx->quiet_depth = vdepth;
        } else if (!quiet && j1_open(cx, lx->tok == '{') < 0) {
            return -1;
        }
        if (lx->tok == '{') {
            lex_next(lx, &cx->oom);
            if (lx->tok == '}')
                goto close;
            goto key;
        }
        lex_next(lx, &cx->oom);
        if (lx->tok == ']')
            goto close;
        if (lx->tok == T_EOF) {
            lex_fail(lx, lx->tok_end, false, false, "']' expected");
            return -1;
        }
        goto value;
    case T_STRING:
        st = J_OK;
        if (!quiet) {
            int r = j1_string(cx, NULL, NULL);
            if (r < 0)
                return -1;
            st = (uint8_t)r;
        }
        break;
    case T_INT:
        if (!quiet && jout_int(cx, lx->ival) < 0)
            return -1;
        st = J_OK;
        break;
    case T_REAL:
        if (!quiet && jout_double(cx, lx->dval) < 0)
            return -1;
        st = J_OK;
        break;
    case T_TRUE:
    case T_FALSE:
    case T_NULL:
        if (!quiet &&
            jout_byte(cx,
                      lx->tok == T_TRUE        ? 0xc3
                          : lx->tok == T_FALSE ? 0xc2
                                               : 0xc0) < 0)
            return -1;
        st = J_OK;
        break;
    case T_INVALID:
        lex_fail(lx, lx->tok_end, false, false, "invalid token");
        return -1;
    default:
        lex_fail(lx, lx->tok_end, false, false, "unexpected token");
        return -1;
    }
done:
    /* st: the status of the value just read */
    if (!quiet)
        j1_value_done(cx, st);
    if (vdepth == 0) {
        top = st;
        lex_next(lx, &cx->oom);
        if (lx->failed || cx->oom)
            return -1;
        if (lx->tok != T_EOF) {
            lex_fail(lx, lx->tok_end, false, false, "end of file expected");
            return -1;
        }
        return top;
    }
    lex_next(lx, &cx->oom);
    if (lx->failed || cx->oom)
        return -1;
    if (lx->tok == ',') {
        lex_next(lx, &cx->oom);
        if (cx->kinds[vdepth - 1] == '{')
            goto key;
        if (lx->tok == T_EOF) {
            lex_fail(lx, lx->tok_end, false, false, "']' expected");
            return -1;
        }
        goto value;
    }
    if (cx->kinds[vdepth - 1] == '{' ? lx->tok != '}' : lx->tok != ']') {
        lex_fail(lx, lx->tok_end, false, false,
                 cx->kinds[vdepth - 1] == '{' ? "'}' expected" : "']' expected");
        return -1;
    }
close:
    vdepth--;
    if (quiet) {
        if (vdepth + 1 > cx->quiet_depth)
            goto done_quiet;
        /* the container too deep to pack ends: a placeholder stands for it */
        quiet = false;
        cx->quiet_depth = 0;
        if (jout_byte(cx, 0xc0) < 0)
            return -1;
        st = J_DEEP;
        goto done;
    }
    if (j1_close(cx, &st) < 0)
        return -1;
    goto done;
done_quiet:
    st = J_OK;
    goto done;
key:
    if (lx->failed || cx->oom)
        return -1;
    if (lx->tok != T_STRING) {
        lex_fail(lx, lx->tok_end, false, false, "string or '}' expected");
        return -1;
    }
    if (lx->str_nul) {
        lex_fail(lx, lx->tok_end, false, false, "NUL byte in object key not supported");
        return -1;
    }
    if (!quiet && j1_key(cx) < 0) {
        cx->oom = true;
        return -1;
    }
    lex_next(lx, &cx->oom);
    if (lx->failed || cx->oom)
        return -1;
    if (lx->tok != ':') {
        lex_fail(lx, lx->tok_end, false, false, "':' expected");
        return -1;
    }
    lex_next(lx, &cx->oom);
    goto value;
}

/* Line and column of byte `pos`, counted as jansson counts them (a column
 * per character on the line, 0 before the first). */
static void line_col(const struct jlex *lx, size_t pos, int *line, int *col)
{
    int l = 1, c = 0;
    size_t d = 0;
    for (size_t i = 0; i < pos; i++) {
        if (d < lx->n_drops && lx->drops[d] == i) {
            d++; /* jansson never counted it */
        } else if (lx->s[i] == '\n') {
            l++;
            c = 0;
        } else if (counts_column(lx->s[i])) {
            c++;
        }
    }
    *line = l;
    *col = c;
}

int transcode_json_to_msgpack(const char *json, size_t len, msgpack_packer *pk,
                              const struct transcode_j2m *opt, char *err, size_t errlen)
{
    struct j1 *cx;
    struct errw w;
    char small[4096];
    struct jmember mem[64];
    int rc;

    errw_init(&w, err, errlen);
    cx = malloc(sizeof(*cx));
    if (!cx) {
        errw_printf(&w, "out of memory");
        return TRANSCODE_ENOMEM;
    }
    cx->max_depth = TRANSCODE_MAX_DEPTH;
    cx->on_str = NULL;
    cx->ud = NULL;
    cx->pick = NULL;
    cx->picked = NULL;
    cx->seed = (uint64_t)(uintptr_t)cx * 0x9e3779b97f4a7c15ull;
    if (opt) {
        if (opt->max_depth > 0 && opt->max_depth < TRANSCODE_MAX_DEPTH)
            cx->max_depth = opt->max_depth;
        cx->on_str = opt->on_str;
        cx->ud = opt->ud;
        cx->pick = opt->pick;
        cx->picked = opt->picked;
    }
    for (size_t i = 0; cx->pick && cx->pick[i]; i++)
        cx->picked[i] = (struct transcode_span){ 0, 0 };
    memset(&cx->lx, 0, sizeof(cx->lx));
    cx->lx.s = cx->lx.p = cx->lx.tok_start = (const unsigned char *)(json ? json : "");
    cx->lx.end = cx->lx.s + len;
    cx->out.p = small;
    cx->out.len = 0;
    cx->out.cap = sizeof(small);
    cx->out.heap = false;
    cx->depth = cx->quiet_depth = 0;
    cx->mem = mem;
    cx->mem_n = 0;
    cx->mem_cap = sizeof(mem) / sizeof(mem[0]);
    cx->mem_heap = false;
    cx->oom = false;

    rc = j1_parse(cx);
    while (cx->depth > 0) {
        free(cx->frames[cx->depth - 1].ht);
        cx->depth--;
    }
    if (rc < 0 && !cx->lx.failed) {
        errw_printf(&w, "out of memory");
        rc = TRANSCODE_ENOMEM;
    } else if (rc < 0) {
        int line, col;
        line_col(&cx->lx, cx->lx.err_pos, &line, &col);
        errw_printf(&w, "%s at line %d, column %d: ",
                    cx->lx.overflow ? "number out of range in JSON" : "invalid JSON", line, col);
        errw_bytes(&w, cx->lx.msg, strlen(cx->lx.msg), 160, 0, false);
        if (cx->lx.overflow)
            errw_printf(&w, " (integers must fit in int64, numbers in a double)");
        rc = TRANSCODE_EINVALID;
    } else if (rc == J_DEEP) {
        errw_printf(&w, "JSON nested deeper than %u levels", cx->max_depth);
        rc = TRANSCODE_ETOO_DEEP;
    } else if (rc == J_HOOK || pk->callback(pk->data, cx->out.p, cx->out.len) != 0) {
        errw_printf(&w, "out of memory (msgpack write failed)");
        rc = TRANSCODE_ENOMEM;
    }
    if (cx->mem_heap)
        free(cx->mem);
    free(cx->lx.drops);
    if (cx->out.heap)
        free(cx->out.p);
    free(cx);
    return rc;
}
