/*
 * transcode_jansson.c — the jansson reference transcoder (see its header).
 *
 * Its error messages follow transcode.c's rules: NUL-terminated, cut on a
 * whole unit, printable ASCII (the input excerpt with \xNN for other bytes).
 */
#include "transcode_jansson.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

struct errw {
    char *p;
    size_t cap; /* usable bytes, excluding the NUL */
    size_t len;
};

static void errw_init(struct errw *w, char *err, size_t errlen)
{
    w->p = errlen ? err : NULL;
    w->cap = errlen ? errlen - 1 : 0;
    w->len = 0;
    if (w->p)
        w->p[0] = '\0';
}

static void errw_printf(struct errw *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void errw_printf(struct errw *w, const char *fmt, ...)
{
    va_list ap;

    if (!w->p || w->len >= w->cap)
        return;
    va_start(ap, fmt);
    int n = vsnprintf(w->p + w->len, w->cap - w->len + 1, fmt, ap);
    va_end(ap);
    if (n > 0)
        w->len = (size_t)n > w->cap - w->len ? w->cap : w->len + (size_t)n;
}

/* jansson's excerpt: printable ASCII as is, other bytes as \xNN; a unit
 * that does not fit whole ends the message. */
static void errw_excerpt(struct errw *w, const char *s, size_t n)
{
    for (size_t i = 0; i < n && w->p; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[8];
        int k = c >= 0x20 && c < 0x7F ? snprintf(tmp, sizeof(tmp), "%c", c)
                                      : snprintf(tmp, sizeof(tmp), "\\x%02x", c);
        if ((size_t)k > w->cap - w->len)
            return;
        memcpy(w->p + w->len, tmp, (size_t)k + 1);
        w->len += (size_t)k;
    }
}

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

int transcode_json_to_msgpack_jansson(const char *json, size_t len, msgpack_packer *pk,
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
        errw_excerpt(&w, je.text, strnlen(je.text, sizeof(je.text) - 1));
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
