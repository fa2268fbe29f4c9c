/*
 * writer.c — the msgpack and JSON implementations of writer.h.
 */
#include "writer.h"

#include <math.h>
#include <string.h>

#include "jsonw.h"
#include "rpc.h"
#include "transcode.h"
#include "utf8.h"

static void set_err(struct writer *w, int err)
{
    if (!w->err)
        w->err = err;
}

/* --- msgpack --------------------------------------------------------- */

static void m_check(struct writer *w, int rc)
{
    if (rc != 0)
        set_err(w, WRITER_ENOMEM);
}

static void m_map(struct writer *w, uint32_t n)
{
    m_check(w, msgpack_pack_map(w->pk, n));
}

static void m_array(struct writer *w, uint32_t n)
{
    m_check(w, msgpack_pack_array(w->pk, n));
}

static void m_str(struct writer *w, const char *s, size_t n)
{
    m_check(w, msgpack_pack_str_with_body(w->pk, s, n));
}

static void m_text(struct writer *w, const char *s, size_t n)
{
    if (utf8_valid_prefix(s, n) == n) {
        m_str(w, s, n);
        return;
    }
    struct strbuf b;
    strbuf_init(&b);
    if (utf8_repair(s, n, &b) < 0)
        set_err(w, WRITER_ENOMEM);
    else
        m_str(w, b.data, b.len);
    strbuf_fini(&b);
}

static void m_i64(struct writer *w, int64_t v)
{
    m_check(w, msgpack_pack_int64(w->pk, v));
}

static void m_u64(struct writer *w, uint64_t v)
{
    m_check(w, msgpack_pack_uint64(w->pk, v));
}

static void m_dbl(struct writer *w, double v)
{
    if (!isfinite(v))
        set_err(w, WRITER_EINVALID); /* what the JSON writer cannot write */
    m_check(w, msgpack_pack_double(w->pk, v));
}

static void m_bool(struct writer *w, bool v)
{
    m_check(w, v ? msgpack_pack_true(w->pk) : msgpack_pack_false(w->pk));
}

static void m_nil(struct writer *w)
{
    m_check(w, msgpack_pack_nil(w->pk));
}

static void m_raw_json(struct writer *w, const char *json, size_t n)
{
    const struct transcode_j2m opt = { .max_depth = RPC_RELAYED_MAX_DEPTH };
    int rc = transcode_json_to_msgpack(json, n, w->pk, &opt, NULL, 0);
    if (rc == TRANSCODE_ENOMEM)
        set_err(w, WRITER_ENOMEM);
    if (rc < 0)
        m_text(w, json, n); /* what msgpack cannot hold as a value travels as text */
}

static const struct writer_ops msgpack_ops = {
    .map = m_map,
    .array = m_array,
    .str = m_str,
    .text = m_text,
    .i64 = m_i64,
    .u64 = m_u64,
    .dbl = m_dbl,
    .boolean = m_bool,
    .nil = m_nil,
    .raw_json = m_raw_json,
};

void writer_init_msgpack(struct writer *w, msgpack_packer *pk)
{
    memset(w, 0, sizeof(*w));
    w->ops = &msgpack_ops;
    w->pk = pk;
}

/* --- JSON ------------------------------------------------------------ */

static void j_put(struct writer *w, int rc)
{
    if (rc < 0)
        set_err(w, rc == STRBUF_ENOMEM ? WRITER_ENOMEM : WRITER_EINVALID);
}

/* Before a value: the separator its place in the open container asks. */
static void j_before(struct writer *w)
{
    if (w->depth == 0) {
        if (w->whole)
            set_err(w, WRITER_EINVALID); /* a second value at the top */
        return;
    }
    struct writer_level *l = &w->lv[w->depth - 1];
    if (l->idx >= l->total) {
        set_err(w, WRITER_EINVALID); /* more values than the count said */
        return;
    }
    if (l->is_map && l->idx % 2)
        j_put(w, strbuf_putc(w->out, ':'));
    else if (l->idx > 0)
        j_put(w, strbuf_putc(w->out, ','));
}

/* Closes every container whose count is reached. */
static void j_settle(struct writer *w)
{
    while (w->depth > 0) {
        struct writer_level *l = &w->lv[w->depth - 1];
        if (l->idx < l->total)
            return;
        w->whole = w->depth == 1;
        j_put(w, strbuf_putc(w->out, l->is_map ? '}' : ']'));
        if (--w->depth > 0)
            w->lv[w->depth - 1].idx++;
    }
}

/* After a scalar. */
static void j_after(struct writer *w)
{
    if (w->depth > 0)
        w->lv[w->depth - 1].idx++;
    else
        w->whole = true;
    j_settle(w);
}

static void j_open(struct writer *w, uint32_t total, bool is_map)
{
    j_before(w);
    if (w->depth == WRITER_MAX_DEPTH) {
        set_err(w, WRITER_ETOO_DEEP);
        return;
    }
    j_put(w, strbuf_putc(w->out, is_map ? '{' : '['));
    w->lv[w->depth++] = (struct writer_level){ .idx = 0, .total = total, .is_map = is_map };
    j_settle(w);
}

static void j_map(struct writer *w, uint32_t n)
{
    j_open(w, n * 2, true);
}

static void j_array(struct writer *w, uint32_t n)
{
    j_open(w, n, false);
}

static void j_str(struct writer *w, const char *s, size_t n)
{
    j_before(w);
    j_put(w, jsonw_str(w->out, s, n, NULL));
    j_after(w);
}

static void j_text(struct writer *w, const char *s, size_t n)
{
    if (utf8_valid_prefix(s, n) == n) {
        j_str(w, s, n);
        return;
    }
    struct strbuf b;
    strbuf_init(&b);
    if (utf8_repair(s, n, &b) < 0) {
        set_err(w, WRITER_ENOMEM);
        j_before(w);
        j_after(w);
    } else {
        j_str(w, b.data, b.len);
    }
    strbuf_fini(&b);
}

static void j_i64(struct writer *w, int64_t v)
{
    j_before(w);
    j_put(w, jsonw_i64(w->out, v));
    j_after(w);
}

static void j_u64(struct writer *w, uint64_t v)
{
    j_before(w);
    j_put(w, jsonw_u64(w->out, v));
    j_after(w);
}

static void j_dbl(struct writer *w, double v)
{
    j_before(w);
    j_put(w, jsonw_double(w->out, v, false));
    j_after(w);
}

static void j_lit(struct writer *w, const char *s)
{
    j_before(w);
    j_put(w, strbuf_put(w->out, s, strlen(s)));
    j_after(w);
}

static void j_bool(struct writer *w, bool v)
{
    j_lit(w, v ? "true" : "false");
}

static void j_nil(struct writer *w)
{
    j_lit(w, "null");
}

static void j_raw_json(struct writer *w, const char *json, size_t n)
{
    j_before(w);
    j_put(w, n ? strbuf_put(w->out, json, n) : WRITER_EINVALID);
    j_after(w);
}

static const struct writer_ops json_ops = {
    .map = j_map,
    .array = j_array,
    .str = j_str,
    .text = j_text,
    .i64 = j_i64,
    .u64 = j_u64,
    .dbl = j_dbl,
    .boolean = j_bool,
    .nil = j_nil,
    .raw_json = j_raw_json,
};

void writer_init_json(struct writer *w, struct strbuf *out)
{
    memset(w, 0, sizeof(*w));
    w->ops = &json_ops;
    w->out = out;
}

void writer_raw_json_members(struct writer *w, const char *obj, size_t n, uint32_t pairs)
{
    struct writer_level *l = w->depth ? &w->lv[w->depth - 1] : NULL;

    if (w->pk || !l || !l->is_map || l->idx % 2 || l->total - l->idx < 2 * pairs) {
        set_err(w, WRITER_EINVALID); /* JSON writers only, where `pairs` keys may go */
        return;
    }
    if (pairs == 0)
        return;
    /* The members between the object's braces. */
    while (n > 0 && obj[n - 1] != '}')
        n--;
    size_t b = 0;
    while (b < n && obj[b] != '{')
        b++;
    if (b + 1 >= n) {
        set_err(w, WRITER_EINVALID);
        return;
    }
    if (l->idx > 0)
        j_put(w, strbuf_putc(w->out, ','));
    j_put(w, strbuf_put(w->out, obj + b + 1, n - b - 2));
    l->idx += 2 * pairs;
    j_settle(w);
}

/* --- shorthands ------------------------------------------------------ */

void writer_str(struct writer *w, const char *s)
{
    w->ops->str(w, s, strlen(s));
}

void writer_text(struct writer *w, const char *s)
{
    w->ops->text(w, s, strlen(s));
}

void writer_kv_str(struct writer *w, const char *key, const char *val)
{
    writer_str(w, key);
    writer_str(w, val);
}

void writer_kv_text(struct writer *w, const char *key, const char *val)
{
    writer_str(w, key);
    writer_text(w, val);
}

void writer_kv_u64(struct writer *w, const char *key, uint64_t v)
{
    writer_str(w, key);
    w->ops->u64(w, v);
}

void writer_kv_i64(struct writer *w, const char *key, int64_t v)
{
    writer_str(w, key);
    w->ops->i64(w, v);
}

void writer_kv_double(struct writer *w, const char *key, double v)
{
    writer_str(w, key);
    w->ops->dbl(w, v);
}

void writer_kv_bool(struct writer *w, const char *key, bool v)
{
    writer_str(w, key);
    w->ops->boolean(w, v);
}
