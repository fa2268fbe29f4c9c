/*
 * writer.h — one reply API, two wire formats.
 *
 * A handler writes its answer once through a struct writer: a map or an
 * array opened with its count, then that many values (a map: key, value,
 * key, value...), strings, integers, doubles, booleans, nil, or a JSON
 * text passed through whole. The msgpack writer packs into a
 * msgpack_packer (the msgpack-RPC front); the JSON writer appends to a
 * strbuf (the HTTP front), placing commas, colons and closing brackets
 * from the counts. The same writes decode to the same value in both.
 *
 * Errors are sticky: the first failure (out of memory, a NaN, nesting
 * deeper than WRITER_MAX_DEPTH) is
 * kept in w->err and later writes do nothing more to be trusted; the
 * caller checks w->err once at the end and answers an internal error.
 * Pure computation: no I/O, no globals.
 */
#ifndef POLYGW_WRITER_H
#define POLYGW_WRITER_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strbuf.h"

#define WRITER_MAX_DEPTH 32

enum {
    WRITER_ENOMEM = -2,
    WRITER_EINVALID = -3, /* NaN / infinity, bad raw JSON, a count overrun */
    WRITER_ETOO_DEEP = -4,
};

struct writer;

struct writer_ops {
    void (*map)(struct writer *w, uint32_t n); /* n pairs follow */
    void (*array)(struct writer *w, uint32_t n);
    void (*str)(struct writer *w, const char *s, size_t n);  /* bytes as they are */
    void (*text)(struct writer *w, const char *s, size_t n); /* invalid UTF-8 -> U+FFFD */
    void (*i64)(struct writer *w, int64_t v);
    void (*u64)(struct writer *w, uint64_t v);
    void (*dbl)(struct writer *w, double v);
    void (*boolean)(struct writer *w, bool v);
    void (*nil)(struct writer *w);
    /* One JSON value, relayed: the JSON writer copies it as it is; the
     * msgpack writer transcodes it, or packs it as a string when msgpack-RPC
     * cannot carry it (nested deeper than RPC_RELAYED_MAX_DEPTH, an
     * integer beyond int64, not JSON). */
    void (*raw_json)(struct writer *w, const char *json, size_t n);
};

struct writer_level {
    uint32_t idx, total; /* values written so far / expected (a map: 2 per pair) */
    bool is_map;
};

struct writer {
    const struct writer_ops *ops;
    int err;            /* 0, or the first WRITER_E* */
    msgpack_packer *pk; /* the msgpack writer's */
    struct strbuf *out; /* the JSON writer's */
    uint32_t depth;
    bool whole; /* the JSON writer's top-level value is complete */
    struct writer_level lv[WRITER_MAX_DEPTH];
};

/* Writes into `pk` (borrowed) as msgpack. */
void writer_init_msgpack(struct writer *w, msgpack_packer *pk);
/* Appends to `out` (borrowed) as JSON text. */
void writer_init_json(struct writer *w, struct strbuf *out);

/* Shorthands over w->ops. */
static inline void writer_map(struct writer *w, uint32_t n)
{
    w->ops->map(w, n);
}
static inline void writer_array(struct writer *w, uint32_t n)
{
    w->ops->array(w, n);
}
static inline void writer_nil(struct writer *w)
{
    w->ops->nil(w);
}
static inline void writer_bool(struct writer *w, bool v)
{
    w->ops->boolean(w, v);
}
static inline void writer_u64(struct writer *w, uint64_t v)
{
    w->ops->u64(w, v);
}
static inline void writer_i64(struct writer *w, int64_t v)
{
    w->ops->i64(w, v);
}
static inline void writer_double(struct writer *w, double v)
{
    w->ops->dbl(w, v);
}
static inline void writer_raw_json(struct writer *w, const char *json, size_t n)
{
    w->ops->raw_json(w, json, n);
}
/* JSON writer only, inside a map: `pairs` members given as the JSON text
 * of an object holding exactly them (obj[0..n)), spliced in as they are;
 * NULL (or not an object) sets w->err. */
void writer_raw_json_members(struct writer *w, const char *obj, size_t n, uint32_t pairs);

/* A NUL-terminated string as it is (names the daemon chose). */
void writer_str(struct writer *w, const char *s);
/* A NUL-terminated text a client chose (repaired to UTF-8 if need be). */
void writer_text(struct writer *w, const char *s);
/* A key and its value, inside a map. */
void writer_kv_str(struct writer *w, const char *key, const char *val);
void writer_kv_text(struct writer *w, const char *key, const char *val);
void writer_kv_u64(struct writer *w, const char *key, uint64_t v);
void writer_kv_i64(struct writer *w, const char *key, int64_t v);
void writer_kv_double(struct writer *w, const char *key, double v);
void writer_kv_bool(struct writer *w, const char *key, bool v);

#endif /* POLYGW_WRITER_H */
