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
    struct j2m cx = { pk, TRANSCODE_MAX_DEPTH, NULL, NULL };
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
        errw_bytes(&w, je.text, strnlen(je.text, sizeof(je.text) - 1), sizeof(je.text), 0, false);
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
