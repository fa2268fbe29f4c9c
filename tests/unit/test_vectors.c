/*
 * test_vectors.c — replays the language-neutral protocol vectors
 * (proto/vectors/vectors.json, described in proto/vectors/README.md) through
 * the C codec: struct frame_reader, rpc_parse and rpc_bind.
 *
 * Every vector is fed whole, byte by byte, and (for small files) split in
 * two at every point; each way must yield the manifest's frames, each frame
 * must decode to the manifest's JSON rendering, and the reader must end in
 * the manifest's outcome. The manifest path is $POLYGW_VECTORS, or
 * proto/vectors/vectors.json relative to the working directory.
 */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "rpc.h"
#include "suites.h"

#define SPLIT_ALL_MAX 4096 /* files up to this size are also split at every point */

static const char *manifest_path(void)
{
    const char *p = getenv("POLYGW_VECTORS");
    return p && *p ? p : "proto/vectors/vectors.json";
}

/* The manifest, or a test failure naming the file and the JSON error. */
static json_t *manifest_load(void)
{
    json_error_t jerr;
    json_t *m = json_load_file(manifest_path(), 0, &jerr);

    ck_assert_msg(m != NULL, "%s:%d: %s (run from the repository root or set POLYGW_VECTORS)",
                  manifest_path(), jerr.line, jerr.text);
    ck_assert_msg(json_is_array(json_object_get(m, "vectors")), "%s: no \"vectors\" array",
                  manifest_path());
    return m;
}

/* --- one vector ------------------------------------------------------ */

struct vector {
    json_t *manifest; /* owned; everything below borrows from it */
    const json_t *v;
    const char *name;
    const char *error; /* NULL: the file is valid */
    int frames;
    size_t max_bytes;
    unsigned char *data; /* owned */
    size_t len;
};

static unsigned char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    size_t cap = 0, n = 0;

    ck_assert_msg(f != NULL, "cannot open %s", path);
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 4096;
            buf = realloc(buf, cap);
            ck_assert(buf != NULL);
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    ck_assert_msg(!ferror(f), "cannot read %s", path);
    fclose(f);
    *len = n;
    return buf;
}

/* Path of a vector file: next to the manifest. */
static void file_path(const char *file, char *out, size_t cap)
{
    const char *m = manifest_path();
    const char *slash = strrchr(m, '/');
    int dirlen = slash ? (int)(slash - m + 1) : 0;

    ck_assert_msg(strchr(file, '/') == NULL, "vector file %s must be a plain name", file);
    ck_assert((size_t)snprintf(out, cap, "%.*s%s", dirlen, m, file) < cap);
}

static void vector_load(int i, struct vector *vec)
{
    json_t *defaults, *limit;
    char path[4096];

    memset(vec, 0, sizeof(*vec));
    vec->manifest = manifest_load();
    vec->v = json_array_get(json_object_get(vec->manifest, "vectors"), (size_t)i);
    ck_assert(json_is_object(vec->v));
    vec->name = json_string_value(json_object_get(vec->v, "name"));
    ck_assert_msg(vec->name != NULL, "vector %d has no name", i);
    vec->error = json_string_value(json_object_get(vec->v, "error"));
    vec->frames = (int)json_integer_value(json_object_get(vec->v, "frames"));

    defaults = json_object_get(vec->manifest, "defaults");
    limit = json_object_get(vec->v, "max_message_bytes");
    if (!limit)
        limit = json_object_get(defaults, "max_message_bytes");
    ck_assert_msg(json_is_integer(limit) && json_integer_value(limit) > 0,
                  "%s: no max_message_bytes", vec->name);
    vec->max_bytes = (size_t)json_integer_value(limit);

    file_path(json_string_value(json_object_get(vec->v, "file")), path, sizeof(path));
    vec->data = read_file(path, &vec->len);
}

static void vector_free(struct vector *vec)
{
    free(vec->data);
    json_decref(vec->manifest);
}

/* --- msgpack_object vs. the JSON rendering --------------------------- */

/* The rendering (proto/vectors/README.md): nil/bool/str/array as in JSON;
 * integers as JSON integers, or {"$int": "decimal"} beyond +-(2^53-1);
 * {"$f32": x} / {"$f64": x} for floats (x a number, or "nan", "inf",
 * "-inf"); {"$bin": "hex"}; {"$ext": [type, "hex"]}; a map with only
 * string keys, none starting with '$', as a JSON object, any other map as
 * {"$map": [[key, value], ...]} in wire order. */

struct mismatch {
    char text[512];
};

static bool mis(struct mismatch *m, const char *path, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(m->text, sizeof(m->text), "at %s: ", path[0] ? path : "top");

    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(m->text))
        vsnprintf(m->text + n, sizeof(m->text) - (size_t)n, fmt, ap);
    va_end(ap);
    return false;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* True when `hex` spells exactly the n bytes at p. */
static bool hex_equals(const char *hex, const char *p, size_t n)
{
    if (!hex || strlen(hex) != 2 * n)
        return false;
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0 || (unsigned char)p[i] != (unsigned)(hi * 16 + lo))
            return false;
    }
    return true;
}

static bool match(const msgpack_object *o, const json_t *j, const char *path, struct mismatch *m);

static bool match_int(const msgpack_object *o, bool neg, uint64_t mag, const char *path,
                      struct mismatch *m)
{
    if (neg) {
        if (o->type != MSGPACK_OBJECT_NEGATIVE_INTEGER)
            return mis(m, path, "expected negative integer, got %s", rpc_type_name(o));
        /* -(mag) as int64 without overflow: mag <= 2^63. */
        if (mag == 0 || (uint64_t)(-(o->via.i64 + 1)) + 1 != mag)
            return mis(m, path, "expected -%llu, got %lld", (unsigned long long)mag,
                       (long long)o->via.i64);
        return true;
    }
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return mis(m, path, "expected integer %llu, got %s", (unsigned long long)mag,
                   rpc_type_name(o));
    if (o->via.u64 != mag)
        return mis(m, path, "expected %llu, got %llu", (unsigned long long)mag,
                   (unsigned long long)o->via.u64);
    return true;
}

static bool match_float(const msgpack_object *o, bool f32, const json_t *x, const char *path,
                        struct mismatch *m)
{
    double want;

    if (o->type != (f32 ? MSGPACK_OBJECT_FLOAT32 : MSGPACK_OBJECT_FLOAT64))
        return mis(m, path, "expected float%d, got %s%s", f32 ? 32 : 64, rpc_type_name(o),
                   o->type == MSGPACK_OBJECT_FLOAT32       ? " (float32)"
                       : o->type == MSGPACK_OBJECT_FLOAT64 ? " (float64)"
                                                           : "");
    if (json_is_number(x)) {
        want = json_number_value(x);
    } else if (json_is_string(x)) {
        const char *s = json_string_value(x);
        if (strcmp(s, "nan") == 0) {
            if (!isnan(o->via.f64))
                return mis(m, path, "expected nan, got %.17g", o->via.f64);
            return true;
        }
        if (strcmp(s, "inf") == 0)
            want = INFINITY;
        else if (strcmp(s, "-inf") == 0)
            want = -INFINITY;
        else
            return mis(m, path, "manifest: bad float spelling '%s'", s);
    } else {
        return mis(m, path, "manifest: float tag needs a number");
    }
    if (!(o->via.f64 == want))
        return mis(m, path, "expected %.17g, got %.17g", want, o->via.f64);
    return true;
}

/* A tag object: exactly one member, whose name starts with '$'. */
static bool match_tag(const msgpack_object *o, const char *tag, const json_t *x, const char *path,
                      struct mismatch *m)
{
    char sub[512];

    if (strcmp(tag, "$int") == 0) {
        const char *s = json_string_value(x);
        bool neg = s && s[0] == '-';
        char *end;
        if (!s || !s[neg] || s[neg] < '0' || s[neg] > '9')
            return mis(m, path, "manifest: $int needs a decimal string");
        errno = 0;
        unsigned long long mag = strtoull(s + neg, &end, 10);
        if (errno || *end || (neg && mag > (1ULL << 63)))
            return mis(m, path, "manifest: bad $int '%s'", s);
        return match_int(o, neg, mag, path, m);
    }
    if (strcmp(tag, "$f32") == 0 || strcmp(tag, "$f64") == 0)
        return match_float(o, tag[2] == '3', x, path, m);
    if (strcmp(tag, "$bin") == 0) {
        if (o->type != MSGPACK_OBJECT_BIN)
            return mis(m, path, "expected binary, got %s", rpc_type_name(o));
        if (!hex_equals(json_string_value(x), o->via.bin.ptr, o->via.bin.size))
            return mis(m, path, "binary differs (%u bytes)", o->via.bin.size);
        return true;
    }
    if (strcmp(tag, "$ext") == 0) {
        if (!json_is_array(x) || json_array_size(x) != 2 || !json_is_integer(json_array_get(x, 0)))
            return mis(m, path, "manifest: $ext needs [type, \"hex\"]");
        if (o->type != MSGPACK_OBJECT_EXT)
            return mis(m, path, "expected ext, got %s", rpc_type_name(o));
        if (o->via.ext.type != json_integer_value(json_array_get(x, 0)))
            return mis(m, path, "ext type %d, expected %lld", o->via.ext.type,
                       (long long)json_integer_value(json_array_get(x, 0)));
        if (!hex_equals(json_string_value(json_array_get(x, 1)), o->via.ext.ptr, o->via.ext.size))
            return mis(m, path, "ext data differs");
        return true;
    }
    if (strcmp(tag, "$map") == 0) {
        if (!json_is_array(x))
            return mis(m, path, "manifest: $map needs an array of pairs");
        if (o->type != MSGPACK_OBJECT_MAP)
            return mis(m, path, "expected map, got %s", rpc_type_name(o));
        if (o->via.map.size != json_array_size(x))
            return mis(m, path, "map has %u pairs, expected %zu", o->via.map.size,
                       json_array_size(x));
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const json_t *pair = json_array_get(x, i);
            if (!json_is_array(pair) || json_array_size(pair) != 2)
                return mis(m, path, "manifest: $map pair %u is not [key, value]", i);
            snprintf(sub, sizeof(sub), "%s.$map[%u].key", path, i);
            if (!match(&o->via.map.ptr[i].key, json_array_get(pair, 0), sub, m))
                return false;
            snprintf(sub, sizeof(sub), "%s.$map[%u].value", path, i);
            if (!match(&o->via.map.ptr[i].val, json_array_get(pair, 1), sub, m))
                return false;
        }
        return true;
    }
    return mis(m, path, "manifest: unknown tag %s", tag);
}

static bool match(const msgpack_object *o, const json_t *j, const char *path, struct mismatch *m)
{
    char sub[512];

    switch (json_typeof(j)) {
    case JSON_NULL:
        return o->type == MSGPACK_OBJECT_NIL
            ? true
            : mis(m, path, "expected nil, got %s", rpc_type_name(o));
    case JSON_TRUE:
    case JSON_FALSE:
        if (o->type != MSGPACK_OBJECT_BOOLEAN)
            return mis(m, path, "expected boolean, got %s", rpc_type_name(o));
        if (o->via.boolean != json_is_true(j))
            return mis(m, path, "expected %s", json_is_true(j) ? "true" : "false");
        return true;
    case JSON_INTEGER: {
        json_int_t v = json_integer_value(j);
        return v < 0 ? match_int(o, true, (uint64_t)(-(v + 1)) + 1, path, m)
                     : match_int(o, false, (uint64_t)v, path, m);
    }
    case JSON_REAL:
        return mis(m, path, "manifest: untagged real (floats are {\"$f64\": x})");
    case JSON_STRING:
        if (o->type != MSGPACK_OBJECT_STR)
            return mis(m, path, "expected string \"%s\", got %s", json_string_value(j),
                       rpc_type_name(o));
        if (o->via.str.size != json_string_length(j) ||
            memcmp(o->via.str.ptr, json_string_value(j), o->via.str.size) != 0)
            return mis(m, path, "expected \"%s\", got \"%.*s\"", json_string_value(j),
                       (int)(o->via.str.size > 80 ? 80 : o->via.str.size), o->via.str.ptr);
        return true;
    case JSON_ARRAY:
        if (o->type != MSGPACK_OBJECT_ARRAY)
            return mis(m, path, "expected array, got %s", rpc_type_name(o));
        if (o->via.array.size != json_array_size(j))
            return mis(m, path, "array has %u items, expected %zu", o->via.array.size,
                       json_array_size(j));
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            snprintf(sub, sizeof(sub), "%s[%u]", path, i);
            if (!match(&o->via.array.ptr[i], json_array_get(j, i), sub, m))
                return false;
        }
        return true;
    case JSON_OBJECT: {
        const char *key;
        json_t *val;

        if (json_object_size(j) == 1) {
            void *it = json_object_iter((json_t *)j);
            key = json_object_iter_key(it);
            if (key[0] == '$')
                return match_tag(o, key, json_object_iter_value(it), path, m);
        }
        if (o->type != MSGPACK_OBJECT_MAP)
            return mis(m, path, "expected map, got %s", rpc_type_name(o));
        if (o->via.map.size != json_object_size(j))
            return mis(m, path, "map has %u pairs, expected %zu", o->via.map.size,
                       json_object_size(j));
        /* Equal sizes and every JSON key matching exactly one wire key make
         * the keys a bijection, so duplicate wire keys cannot slip through. */
        json_object_foreach((json_t *)j, key, val)
        {
            const msgpack_object *found = NULL;
            int hits = 0;
            if (key[0] == '$')
                return mis(m, path, "manifest: key %s must be written as $map", key);
            for (uint32_t i = 0; i < o->via.map.size; i++) {
                if (rpc_str_is(&o->via.map.ptr[i].key, key)) {
                    found = &o->via.map.ptr[i].val;
                    hits++;
                }
            }
            if (hits != 1)
                return mis(m, path, "key \"%s\" found %d times", key, hits);
            snprintf(sub, sizeof(sub), "%s.%s", path, key);
            if (!match(found, val, sub, m))
                return false;
        }
        return true;
    }
    }
    return mis(m, path, "manifest: unexpected JSON type");
}

/* --- parameter specs: the tables of proto/PROTOCOL.md ----------------- */

#define OPT(t) ((t) | RPC_T_NIL)

static const struct rpc_param call_spec[] = {
    { "capability", RPC_T_STR, true },    { "body", RPC_T_MAP, true },
    { "stream", OPT(RPC_T_BOOL), false }, { "scope", OPT(RPC_T_STR), false },
    { "task_id", OPT(RPC_T_STR), false }, { "deadline_s", OPT(RPC_T_NUMBER), false },
};
static const struct rpc_param task_id_spec[] = { { "task_id", RPC_T_STR, true } };
static const struct rpc_param task_stop_spec[] = { { "task_id", RPC_T_STR, true },
                                                   { "reason", RPC_T_STR, true } };
static const struct rpc_param task_node_begin_spec[] = { { "task_id", RPC_T_STR, true },
                                                         { "node", RPC_T_STR, true },
                                                         { "timeout_s", OPT(RPC_T_NUMBER),
                                                           false } };
static const struct rpc_param task_node_end_spec[] = { { "task_id", RPC_T_STR, true },
                                                       { "node", RPC_T_STR, true } };
static const struct rpc_param task_finish_spec[] = { { "task_id", RPC_T_STR, true },
                                                     { "ok", RPC_T_BOOL, true },
                                                     { "reason", OPT(RPC_T_STR), false } };
static const struct rpc_param task_list_spec[] = { { "state", OPT(RPC_T_STR), false } };

#define SPEC(name, s)                     \
    {                                     \
        name, s, sizeof(s) / sizeof(s[0]) \
    }
static const struct method_spec {
    const char *method;
    const struct rpc_param *spec;
    size_t n;
} method_specs[] = {
    { "ping", NULL, 0 },
    { "stats", NULL, 0 },
    SPEC("call", call_spec),
    SPEC("task.start", task_id_spec),
    SPEC("task.stop", task_stop_spec),
    SPEC("task.guard", task_id_spec),
    SPEC("task.node_begin", task_node_begin_spec),
    SPEC("task.node_end", task_node_end_spec),
    SPEC("task.finish", task_finish_spec),
    SPEC("task.get", task_id_spec),
    SPEC("task.list", task_list_spec),
};

static const struct method_spec *spec_for(const struct rpc_msg *msg)
{
    for (size_t i = 0; i < sizeof(method_specs) / sizeof(method_specs[0]); i++) {
        if (rpc_method_is(msg, method_specs[i].method))
            return &method_specs[i];
    }
    return NULL;
}

/* --- replay ---------------------------------------------------------- */

static const char *const kind_names[] = { "request", "response", "notification" };

/* Checks frame number `idx` (0-based) against the manifest. */
static void check_frame(const struct vector *vec, int idx, const msgpack_object *o, const char *how)
{
    const json_t *decoded = json_object_get(vec->v, "decoded");
    const json_t *kind = json_object_get(vec->v, "kind");
    struct mismatch mm = { { 0 } };
    struct rpc_msg msg;
    const char *why = NULL;

    if (vec->frames > 1) {
        decoded = json_array_get(decoded, (size_t)idx);
        kind = json_array_get(kind, (size_t)idx);
    }
    ck_assert_msg(decoded != NULL, "%s: manifest has no decoded value for frame %d", vec->name,
                  idx);
    ck_assert_msg(match(o, decoded, "", &mm), "%s (%s): frame %d: %s", vec->name, how, idx,
                  mm.text);

    int rc = rpc_parse(o, &msg, &why);
    if (json_is_null(kind)) {
        ck_assert_msg(rc == -1,
                      "%s (%s): rpc_parse accepted a message the manifest calls "
                      "not msgpack-RPC",
                      vec->name, how);
        ck_assert_msg(why != NULL && why[0], "%s: rpc_parse gave no reason", vec->name);
        return;
    }
    ck_assert_msg(rc == 0, "%s (%s): rpc_parse: %s", vec->name, how, why);
    ck_assert_msg(json_is_string(kind) &&
                      strcmp(json_string_value(kind), kind_names[msg.type]) == 0,
                  "%s (%s): frame %d is a %s, manifest says %s", vec->name, how, idx,
                  kind_names[msg.type], json_is_string(kind) ? json_string_value(kind) : "?");
    if (msg.type != RPC_REQUEST)
        return;

    const struct method_spec *ms = spec_for(&msg);
    const msgpack_object *out[8];
    char bwhy[256] = "";
    bool bad = vec->error && strcmp(vec->error, "bad_params") == 0;

    if (!ms) {
        ck_assert_msg(!bad, "%s: bad_params vector for a method without a spec", vec->name);
        return;
    }
    rc = rpc_bind(msg.params, ms->spec, ms->n, out, bwhy, sizeof(bwhy));
    if (bad) {
        ck_assert_msg(rc == -1, "%s (%s): rpc_bind accepted bad params", vec->name, how);
        ck_assert_msg(bwhy[0] != '\0', "%s: rpc_bind gave no reason", vec->name);
    } else {
        ck_assert_msg(rc == 0, "%s (%s): rpc_bind: %s", vec->name, how, bwhy);
    }
}

static int frame_error_code(const char *error)
{
    if (!error)
        return 0;
    if (strcmp(error, "malformed") == 0)
        return FRAME_EMALFORMED;
    if (strcmp(error, "too_large") == 0)
        return FRAME_ETOO_LARGE;
    if (strcmp(error, "too_deep") == 0)
        return FRAME_ETOO_DEEP;
    return 0; /* incomplete, not_rpc, bad_params: not a reader error */
}

/* Feeds the vector: the first `first` bytes (0: one piece of `step`), then
 * pieces of `step` bytes (0: all the rest at once), draining the reader
 * after each piece; then checks the outcome. */
static void replay(const struct vector *vec, size_t first, size_t step, const char *how)
{
    struct frame_reader r;
    msgpack_unpacked u;
    int want_err = frame_error_code(vec->error);
    bool incomplete = vec->error && strcmp(vec->error, "incomplete") == 0;
    int nframes = 0, rc = 0;
    size_t off = 0, total = 0, fb = 0;

    ck_assert_int_eq(frame_reader_init(&r, vec->max_bytes, 0), 0);
    msgpack_unpacked_init(&u);
    while (off < vec->len && rc >= 0) {
        size_t n = off == 0 && first ? first : step ? step : vec->len - off;
        if (n > vec->len - off)
            n = vec->len - off;
        ck_assert_int_eq(frame_reader_feed(&r, vec->data + off, n), 0);
        off += n;
        while ((rc = frame_reader_next(&r, &u, &fb)) == 1) {
            ck_assert_msg(nframes < vec->frames, "%s (%s): reader yields more than %d frames",
                          vec->name, how, vec->frames);
            ck_assert_msg(fb > 0 && fb <= vec->max_bytes, "%s: frame_bytes %zu", vec->name, fb);
            total += fb;
            check_frame(vec, nframes, &u.data, how);
            nframes++;
        }
    }
    ck_assert_msg(nframes == vec->frames, "%s (%s): reader yields %d frames, manifest %d",
                  vec->name, how, nframes, vec->frames);
    if (want_err) {
        ck_assert_msg(rc == want_err, "%s (%s): reader ends with %d (%s), expected %s", vec->name,
                      how, rc, rc < 0 ? frame_strerror(rc) : "no error", vec->error);
        /* Sticky: more calls and more bytes do not revive the reader. */
        ck_assert_int_eq(frame_reader_next(&r, &u, NULL), want_err);
        ck_assert_int_eq(frame_reader_feed(&r, "\x94\x00\x01\xa4ping\x90", 9), 0);
        ck_assert_int_eq(frame_reader_next(&r, &u, NULL), want_err);
    } else {
        ck_assert_msg(rc == 0, "%s (%s): reader ends with %d (%s)", vec->name, how, rc,
                      rc < 0 ? frame_strerror(rc) : "");
        if (incomplete) {
            ck_assert_msg(frame_reader_pending(&r) > 0 &&
                              total + frame_reader_pending(&r) == vec->len,
                          "%s (%s): incomplete frame not held", vec->name, how);
            for (int i = 0; i < 3; i++)
                ck_assert_int_eq(frame_reader_next(&r, &u, NULL), 0);
        } else {
            ck_assert_msg(frame_reader_pending(&r) == 0 && total == vec->len,
                          "%s (%s): %zu bytes left over", vec->name, how, frame_reader_pending(&r));
        }
    }
    msgpack_unpacked_destroy(&u);
    frame_reader_fini(&r);
}

START_TEST(test_vectors__replay)
{
    struct vector vec;
    char how[64];

    vector_load(_i, &vec);
    replay(&vec, 0, 0, "whole");
    replay(&vec, 0, 1, "byte by byte");
    replay(&vec, 0, 7, "7-byte pieces");
    if (vec.len <= SPLIT_ALL_MAX) {
        for (size_t k = 1; k < vec.len; k++) {
            snprintf(how, sizeof(how), "split at %zu", k);
            replay(&vec, k, 0, how);
        }
    }
    vector_free(&vec);
}
END_TEST

/* --- the manifest itself --------------------------------------------- */

static bool in_list(const char *s, const char *const *list)
{
    for (; *list; list++) {
        if (s && strcmp(s, *list) == 0)
            return true;
    }
    return false;
}

START_TEST(test_vectors__manifest_well_formed)
{
    static const char *const errors[] = { "incomplete", "malformed",  "too_large", "too_deep",
                                          "not_rpc",    "bad_params", NULL };
    static const char *const kinds[] = { "request", "response", "notification", NULL };
    json_t *m = manifest_load();
    json_t *vectors = json_object_get(m, "vectors");
    const char *names[256];
    size_t i;
    json_t *v;

    ck_assert_int_eq(json_integer_value(json_object_get(m, "format")), 1);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(m, "defaults"), "max_depth")),
        FRAME_MAX_DEPTH);
    ck_assert(json_array_size(vectors) < sizeof(names) / sizeof(names[0]));
    json_array_foreach(vectors, i, v)
    {
        const char *name = json_string_value(json_object_get(v, "name"));
        const char *file = json_string_value(json_object_get(v, "file"));
        const json_t *err = json_object_get(v, "error");
        const json_t *kind = json_object_get(v, "kind");
        const json_t *frames = json_object_get(v, "frames");
        char want_file[300];

        ck_assert_msg(name && file, "vector %zu: name and file are required", i);
        for (size_t k = 0; k < i; k++)
            ck_assert_msg(strcmp(names[k], name) != 0, "%s: duplicate name", name);
        names[i] = name;
        snprintf(want_file, sizeof(want_file), "%s.msgpack", name);
        ck_assert_str_eq(file, want_file);
        ck_assert_msg(json_is_boolean(json_object_get(v, "valid")), "%s: valid", name);
        ck_assert_msg(json_is_null(err) || in_list(json_string_value(err), errors),
                      "%s: unknown error class", name);
        ck_assert_msg(json_is_true(json_object_get(v, "valid")) == json_is_null(err),
                      "%s: valid must be true exactly when error is null", name);
        ck_assert_msg(json_is_string(json_object_get(v, "why")), "%s: why", name);
        ck_assert_msg(json_is_integer(frames) && json_integer_value(frames) >= 0, "%s: frames",
                      name);
        json_int_t nf = json_integer_value(frames);
        if (nf == 0) {
            ck_assert_msg(json_is_null(kind) && json_is_null(json_object_get(v, "decoded")),
                          "%s: no frames, so kind and decoded are null", name);
        } else if (nf == 1) {
            ck_assert_msg(json_is_null(kind) || in_list(json_string_value(kind), kinds), "%s: kind",
                          name);
            ck_assert_msg(json_object_get(v, "decoded") != NULL, "%s: decoded", name);
        } else {
            ck_assert_msg(json_is_array(kind) && (json_int_t)json_array_size(kind) == nf &&
                              json_is_array(json_object_get(v, "decoded")) &&
                              (json_int_t)json_array_size(json_object_get(v, "decoded")) == nf,
                          "%s: kind and decoded list one entry per frame", name);
        }
        const char *e = json_string_value(err);
        if (e && (strcmp(e, "not_rpc") == 0 || strcmp(e, "bad_params") == 0)) {
            ck_assert_msg(nf == 1, "%s: %s applies to exactly one frame", name, e);
            ck_assert_msg(strcmp(e, "not_rpc") == 0
                              ? json_is_null(kind)
                              : json_is_string(kind) && !strcmp(json_string_value(kind), "request"),
                          "%s: kind does not fit error %s", name, e);
        }
        json_t *limit = json_object_get(v, "max_message_bytes");
        ck_assert_msg(!limit || (json_is_integer(limit) && json_integer_value(limit) > 0),
                      "%s: max_message_bytes", name);
    }
    json_decref(m);
}
END_TEST

/* Every .msgpack file in the folder is listed (a stale file would go
 * unreplayed), and the manifest keeps covering every outcome and kind. */
START_TEST(test_vectors__coverage)
{
    static const char *const need[] = { "incomplete",   "malformed",  "too_large", "too_deep",
                                        "not_rpc",      "bad_params", "request",   "response",
                                        "notification", NULL };
    json_t *m = manifest_load();
    json_t *vectors = json_object_get(m, "vectors");
    char dir[4096];
    size_t i;
    json_t *v;

    for (const char *const *n = need; *n; n++) {
        bool seen = false;
        json_array_foreach(vectors, i, v)
        {
            const char *e = json_string_value(json_object_get(v, "error"));
            const char *k = json_string_value(json_object_get(v, "kind"));
            seen |= (e && strcmp(e, *n) == 0) || (k && strcmp(k, *n) == 0);
        }
        ck_assert_msg(seen, "no vector covers %s", *n);
    }

    file_path("", dir, sizeof(dir));
    DIR *d = opendir(dir[0] ? dir : ".");
    ck_assert_msg(d != NULL, "cannot list %s", dir);
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        size_t len = strlen(de->d_name);
        bool listed = false;
        if (len < 8 || strcmp(de->d_name + len - 8, ".msgpack") != 0)
            continue;
        json_array_foreach(vectors, i, v)
        {
            listed |= strcmp(json_string_value(json_object_get(v, "file")), de->d_name) == 0;
        }
        ck_assert_msg(listed, "%s%s is not in the manifest", dir, de->d_name);
    }
    closedir(d);
    json_decref(m);
}
END_TEST

/* --- our writers produce the vectors' exact bytes -------------------- */

static json_t *find_vector(json_t *m, const char *name)
{
    size_t i;
    json_t *v;

    json_array_foreach(json_object_get(m, "vectors"), i, v)
    {
        if (strcmp(json_string_value(json_object_get(v, "name")), name) == 0)
            return v;
    }
    ck_abort_msg("no vector %s", name);
    return NULL;
}

static void expect_bytes(json_t *m, const char *name, const msgpack_sbuffer *sb)
{
    char path[4096];
    size_t len;
    unsigned char *data;

    file_path(json_string_value(json_object_get(find_vector(m, name), "file")), path, sizeof(path));
    data = read_file(path, &len);
    ck_assert_msg(len == sb->size && memcmp(data, sb->data, len) == 0,
                  "%s: the C writer produces different bytes (%zu vs %zu)", name, sb->size, len);
    free(data);
}

START_TEST(test_vectors__writers_match_vectors)
{
    json_t *m = manifest_load();
    msgpack_sbuffer sb;
    msgpack_packer pk;

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);

    rpc_pack_request_begin(&pk, 1, "ping");
    msgpack_pack_array(&pk, 0);
    expect_bytes(m, "request_ping", &sb);

    msgpack_sbuffer_clear(&sb);
    rpc_pack_result_begin(&pk, 1);
    msgpack_pack_map(&pk, 2);
    rpc_pack_str(&pk, "version");
    rpc_pack_str(&pk, "0.1.0");
    rpc_pack_str(&pk, "uptime_s");
    msgpack_pack_double(&pk, 12.5);
    expect_bytes(m, "response_ping", &sb);

    msgpack_sbuffer_clear(&sb);
    rpc_pack_error(&pk, 16, PGW_UNKNOWN_METHOD, "unknown method 'echo'");
    expect_bytes(m, "response_error", &sb);

    msgpack_sbuffer_clear(&sb);
    rpc_pack_error_begin(&pk, 7, PGW_STALLED, "scope 'chat' made no progress for 300 s", 4);
    rpc_pack_str(&pk, "retry_after_s");
    msgpack_pack_double(&pk, 30.0);
    rpc_pack_str(&pk, "attempts");
    msgpack_pack_uint32(&pk, 0);
    rpc_pack_str(&pk, "stalled_s");
    msgpack_pack_double(&pk, 300.5);
    rpc_pack_str(&pk, "sources");
    msgpack_pack_array(&pk, 2);
    msgpack_pack_map(&pk, 2);
    rpc_pack_str(&pk, "name");
    rpc_pack_str(&pk, "openai-a");
    rpc_pack_str(&pk, "reason");
    rpc_pack_str(&pk, "breaker_open");
    msgpack_pack_map(&pk, 3);
    rpc_pack_str(&pk, "name");
    rpc_pack_str(&pk, "openai-b");
    rpc_pack_str(&pk, "reason");
    rpc_pack_str(&pk, "http_429");
    rpc_pack_str(&pk, "detail");
    rpc_pack_str(&pk, "Retry-After: 30");
    rpc_pack_error_end(&pk);
    expect_bytes(m, "response_error_extras", &sb);

    msgpack_sbuffer_clear(&sb);
    rpc_pack_notify_begin(&pk, "cancel");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_uint32(&pk, 7);
    expect_bytes(m, "notification_cancel", &sb);

    msgpack_sbuffer_clear(&sb);
    rpc_pack_fatal(&pk, PGW_BAD_REQUEST, frame_strerror(FRAME_EMALFORMED));
    expect_bytes(m, "notification_fatal_error", &sb);

    msgpack_sbuffer_clear(&sb);
    rpc_pack_fatal(&pk, PGW_TOO_LARGE, frame_strerror(FRAME_ETOO_LARGE));
    expect_bytes(m, "notification_fatal_too_large", &sb);

    msgpack_sbuffer_destroy(&sb);
    json_decref(m);
}
END_TEST

/* --- the comparator itself (a lenient one would pass every vector) --- */

START_TEST(test_vectors__comparator_rejects_mismatches)
{
    static const struct {
        const char *json;
        const char *msgpack;
        size_t len;
    } bad[] = {
        { "1", "\x02", 1 },
        { "1", "\xcb\x3f\xf0\0\0\0\0\0\0", 9 }, /* 1.0 is not 1 */
        { "{\"$f64\": 1.0}", "\x01", 1 },
        { "{\"$f64\": 0.5}", "\xca\x3f\0\0\0", 5 }, /* float32 is not float64 */
        { "{\"$f32\": 0.5}", "\xcb\x3f\xe0\0\0\0\0\0\0", 9 },
        { "-1", "\x01", 1 },
        { "{\"$int\": \"18446744073709551615\"}", "\xcf\xff\xff\xff\xff\xff\xff\xff\xfe", 9 },
        { "{\"$int\": \"-9223372036854775808\"}", "\xd3\x80\0\0\0\0\0\0\x01", 9 },
        { "\"ab\"",
          "\xa2"
          "ac",
          3 },
        { "\"ab\"",
          "\xc4\x02"
          "ab",
          4 }, /* bin is not str */
        { "{\"$bin\": \"6162\"}",
          "\xa2"
          "ab",
          3 },
        { "{\"$ext\": [5, \"01\"]}", "\xd4\x06\x01", 3 },
        { "[1]", "\x92\x01\x01", 3 },
        { "{\"a\": 1, \"b\": 2}",
          "\x82\xa1"
          "a\x01\xa1"
          "a\x01",
          7 }, /* duplicate key */
        { "{\"$map\": [[1, 2]]}", "\x81\x01\x03", 3 },
        { "null", "\xc2", 1 },
        { "true", "\xc2", 1 },
        { "1.5", "\xcb\x3f\xf8\0\0\0\0\0\0", 9 }, /* untagged real */
    };
    static const struct {
        const char *json;
        const char *msgpack;
        size_t len;
    } good[] = {
        { "{\"$int\": \"18446744073709551615\"}", "\xcf\xff\xff\xff\xff\xff\xff\xff\xff", 9 },
        { "{\"$int\": \"-9223372036854775808\"}", "\xd3\x80\0\0\0\0\0\0\0", 9 },
        { "-32", "\xe0", 1 },
        { "{\"$f64\": \"nan\"}", "\xcb\x7f\xf8\0\0\0\0\0\0", 9 },
        { "{\"$f32\": \"-inf\"}", "\xca\xff\x80\0\0", 5 },
        { "{\"$ext\": [5, \"01\"]}", "\xd4\x05\x01", 3 },
        { "{\"$map\": [[1, 2]]}", "\x81\x01\x02", 3 },
        { "{\"b\": 2, \"a\": 1}",
          "\x82\xa1"
          "a\x01\xa1"
          "b\x02",
          7 }, /* order-free */
    };
    struct mismatch mm;

    for (size_t k = 0; k < 2; k++) {
        size_t n = k == 0 ? sizeof(bad) / sizeof(bad[0]) : sizeof(good) / sizeof(good[0]);
        for (size_t i = 0; i < n; i++) {
            const char *js = k == 0 ? bad[i].json : good[i].json;
            const char *mp = k == 0 ? bad[i].msgpack : good[i].msgpack;
            size_t len = k == 0 ? bad[i].len : good[i].len;
            json_error_t jerr;
            json_t *j = json_loads(js, JSON_DECODE_ANY, &jerr);
            msgpack_unpacked u;
            size_t off = 0;

            ck_assert_msg(j != NULL, "%s: %s", js, jerr.text);
            msgpack_unpacked_init(&u);
            ck_assert_int_eq(msgpack_unpack_next(&u, mp, len, &off), MSGPACK_UNPACK_SUCCESS);
            memset(&mm, 0, sizeof(mm));
            ck_assert_msg(match(&u.data, j, "", &mm) == (k == 1), "%s: comparator %s", js,
                          k == 0 ? "accepted a mismatch" : mm.text);
            msgpack_unpacked_destroy(&u);
            json_decref(j);
        }
    }
}
END_TEST

/* Reports a manifest that cannot be loaded as one clear failure (the loop
 * test then has no iterations). */
START_TEST(test_vectors__manifest_loads)
{
    json_decref(manifest_load());
}
END_TEST

Suite *vectors_suite(void)
{
    Suite *s = suite_create("vectors");
    TCase *tc = tcase_create("vectors");
    json_t *m = json_load_file(manifest_path(), 0, NULL);
    int n = (int)json_array_size(json_object_get(m, "vectors"));

    json_decref(m);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_vectors__manifest_loads);
    tcase_add_test(tc, test_vectors__manifest_well_formed);
    tcase_add_test(tc, test_vectors__coverage);
    tcase_add_test(tc, test_vectors__comparator_rejects_mismatches);
    tcase_add_test(tc, test_vectors__writers_match_vectors);
    tcase_add_loop_test(tc, test_vectors__replay, 0, n);
    suite_add_tcase(s, tc);
    return s;
}
