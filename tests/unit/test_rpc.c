/*
 * test_rpc.c — message classification, named-parameter binding, the
 * writers (proto/rpc.c) and the error-code names (proto/codes.c).
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "rpc.h"
#include "suites.h"

/* --- helpers --------------------------------------------------------- */

/* Packs a value from a tiny format string into a fresh buffer, decodes it
 * and keeps both alive in `struct obj`:
 *   [n  array of n items    {n  map of n pairs (2n items follow)
 *   i  int (int64 arg)      u  uint (uint64 arg)   d  double   f  float
 *   s  str (char * arg)     b  bin (char * arg)    n  nil      t/F  true/false
 *   x  ext type 1, 1 byte   (spaces are ignored)
 */
struct obj {
    msgpack_sbuffer sb;
    msgpack_unpacked u;
    const msgpack_object *o;
};

static const char *pack_fmt(msgpack_packer *pk, const char *f, va_list *ap)
{
    int n;

    while (*f == ' ') /* spaces are for the reader of the format */
        f++;
    char c = *f++;

    switch (c) {
    case '[':
    case '{':
        n = 0;
        while (*f >= '0' && *f <= '9')
            n = n * 10 + (*f++ - '0');
        if (c == '[')
            msgpack_pack_array(pk, (size_t)n);
        else
            msgpack_pack_map(pk, (size_t)n);
        for (int i = 0; i < (c == '[' ? n : 2 * n); i++)
            f = pack_fmt(pk, f, ap);
        return f;
    case 'i':
        msgpack_pack_int64(pk, va_arg(*ap, int64_t));
        return f;
    case 'u':
        msgpack_pack_uint64(pk, va_arg(*ap, uint64_t));
        return f;
    case 'd':
        msgpack_pack_double(pk, va_arg(*ap, double));
        return f;
    case 'f':
        msgpack_pack_float(pk, (float)va_arg(*ap, double));
        return f;
    case 's': {
        const char *s = va_arg(*ap, const char *);
        msgpack_pack_str(pk, strlen(s));
        msgpack_pack_str_body(pk, s, strlen(s));
        return f;
    }
    case 'b': {
        const char *s = va_arg(*ap, const char *);
        msgpack_pack_bin(pk, strlen(s));
        msgpack_pack_bin_body(pk, s, strlen(s));
        return f;
    }
    case 'n':
        msgpack_pack_nil(pk);
        return f;
    case 't':
        msgpack_pack_true(pk);
        return f;
    case 'F':
        msgpack_pack_false(pk);
        return f;
    case 'x':
        msgpack_pack_ext(pk, 1, 1);
        msgpack_pack_ext_body(pk, "x", 1);
        return f;
    default:
        ck_abort_msg("bad format char %c", c);
        return f;
    }
}

static void obj_make(struct obj *ob, const char *fmt, ...)
{
    msgpack_packer pk;
    va_list ap;
    size_t off = 0;

    msgpack_sbuffer_init(&ob->sb);
    msgpack_packer_init(&pk, &ob->sb, msgpack_sbuffer_write);
    va_start(ap, fmt);
    const char *end = pack_fmt(&pk, fmt, &ap);
    va_end(ap);
    while (*end == ' ')
        end++;
    ck_assert_msg(*end == '\0', "trailing format: %s", end);
    msgpack_unpacked_init(&ob->u);
    ck_assert_int_eq(msgpack_unpack_next(&ob->u, ob->sb.data, ob->sb.size, &off),
                     MSGPACK_UNPACK_SUCCESS);
    ob->o = &ob->u.data;
}

static void obj_free(struct obj *ob)
{
    msgpack_unpacked_destroy(&ob->u);
    msgpack_sbuffer_destroy(&ob->sb);
}

static void expect_not_rpc(struct obj *ob, const char *why_part)
{
    struct rpc_msg m;
    const char *why = NULL;

    ck_assert_int_eq(rpc_parse(ob->o, &m, &why), -1);
    ck_assert_msg(why && strstr(why, why_part), "reason '%s' lacks '%s'", why ? why : "(null)",
                  why_part);
    ck_assert_int_eq(rpc_parse(ob->o, &m, NULL), -1); /* why may be NULL */
    obj_free(ob);
}

/* --- rpc_parse ------------------------------------------------------- */

START_TEST(test_rpc__parse_request)
{
    struct obj ob;
    struct rpc_msg m;

    obj_make(&ob, "[4uus[1{1ss", (uint64_t)0, (uint64_t)42, "call", "capability", "chat");
    ck_assert_int_eq(rpc_parse(ob.o, &m, NULL), 0);
    ck_assert_int_eq(m.type, RPC_REQUEST);
    ck_assert_uint_eq(m.msgid, 42);
    ck_assert(rpc_method_is(&m, "call"));
    ck_assert(!rpc_method_is(&m, "cal"));
    ck_assert(!rpc_method_is(&m, "calls"));
    ck_assert_int_eq(m.params->type, MSGPACK_OBJECT_ARRAY);
    ck_assert_ptr_null(m.error);
    ck_assert_ptr_null(m.result);
    obj_free(&ob);
}
END_TEST

START_TEST(test_rpc__parse_response)
{
    struct obj ob;
    struct rpc_msg m;

    obj_make(&ob, "[4uun{1sd", (uint64_t)1, (uint64_t)UINT32_MAX, "uptime_s", 1.5);
    ck_assert_int_eq(rpc_parse(ob.o, &m, NULL), 0);
    ck_assert_int_eq(m.type, RPC_RESPONSE);
    ck_assert_uint_eq(m.msgid, UINT32_MAX);
    ck_assert_int_eq(m.error->type, MSGPACK_OBJECT_NIL);
    ck_assert_int_eq(m.result->type, MSGPACK_OBJECT_MAP);
    ck_assert_ptr_null(m.method);
    obj_free(&ob);

    obj_make(&ob, "[4uu{2ssssn", (uint64_t)1, (uint64_t)3, "code", "stalled", "message", "x");
    ck_assert_int_eq(rpc_parse(ob.o, &m, NULL), 0);
    ck_assert(rpc_str_is(rpc_map_get(m.error, "code"), "stalled"));
    ck_assert_int_eq(m.result->type, MSGPACK_OBJECT_NIL);
    obj_free(&ob);
}
END_TEST

START_TEST(test_rpc__parse_notification)
{
    struct obj ob;
    struct rpc_msg m;

    obj_make(&ob, "[3us[1u", (uint64_t)2, "cancel", (uint64_t)7);
    ck_assert_int_eq(rpc_parse(ob.o, &m, NULL), 0);
    ck_assert_int_eq(m.type, RPC_NOTIFY);
    ck_assert(rpc_method_is(&m, "cancel"));
    ck_assert_uint_eq(m.params->via.array.ptr[0].via.u64, 7);
    ck_assert_uint_eq(m.msgid, 0);
    obj_free(&ob);
}
END_TEST

/* Integers of any width are accepted where a uint is expected: msgpack-c
 * folds a non-negative int8..int64 into POSITIVE_INTEGER. */
START_TEST(test_rpc__parse_wide_ints)
{
    static const char frame[] = "\x94\xd0\x00\xd3\x00\x00\x00\x00\x00\x00\x00\x05"
                                "\xd9\x04ping\xdc\x00\x00";
    msgpack_unpacked u;
    struct rpc_msg m;
    size_t off = 0;

    msgpack_unpacked_init(&u);
    ck_assert_int_eq(msgpack_unpack_next(&u, frame, sizeof(frame) - 1, &off),
                     MSGPACK_UNPACK_SUCCESS);
    ck_assert_int_eq(rpc_parse(&u.data, &m, NULL), 0);
    ck_assert_int_eq(m.type, RPC_REQUEST);
    ck_assert_uint_eq(m.msgid, 5);
    ck_assert(rpc_method_is(&m, "ping"));
    msgpack_unpacked_destroy(&u);
}
END_TEST

START_TEST(test_rpc__parse_rejects)
{
    struct obj ob;

    obj_make(&ob, "{1su", "type", (uint64_t)0);
    expect_not_rpc(&ob, "not an array");
    obj_make(&ob, "s", "ping");
    expect_not_rpc(&ob, "not an array");
    obj_make(&ob, "[0");
    expect_not_rpc(&ob, "type 0, 1 or 2");
    obj_make(&ob, "[2uu", (uint64_t)0, (uint64_t)1);
    expect_not_rpc(&ob, "type 0, 1 or 2");
    obj_make(&ob, "[5uusn[0", (uint64_t)0, (uint64_t)1, "ping");
    expect_not_rpc(&ob, "type 0, 1 or 2");
    obj_make(&ob, "[4uus[0", (uint64_t)3, (uint64_t)1, "ping");
    expect_not_rpc(&ob, "type 0, 1 or 2");
    obj_make(&ob, "[4ius[0", (int64_t)-1, (uint64_t)1, "ping");
    expect_not_rpc(&ob, "type 0, 1 or 2");
    obj_make(&ob, "[4sus[0", "0", (uint64_t)1, "ping");
    expect_not_rpc(&ob, "type 0, 1 or 2");
    obj_make(&ob, "[4dus[0", 0.0, (uint64_t)1, "ping");
    expect_not_rpc(&ob, "type 0, 1 or 2");
    obj_make(&ob, "[3uus", (uint64_t)0, (uint64_t)1, "ping");
    expect_not_rpc(&ob, "request must be");
    obj_make(&ob, "[3uun", (uint64_t)1, (uint64_t)1);
    expect_not_rpc(&ob, "response must be");
    obj_make(&ob, "[4us[0n", (uint64_t)2, "cancel");
    expect_not_rpc(&ob, "notification must be");
    obj_make(&ob, "[4uis[0", (uint64_t)0, (int64_t)-1, "ping");
    expect_not_rpc(&ob, "msgid");
    obj_make(&ob, "[4uus[0", (uint64_t)0, (uint64_t)UINT32_MAX + 1, "ping");
    expect_not_rpc(&ob, "msgid");
    obj_make(&ob, "[4uds[0", (uint64_t)0, 1.0, "ping");
    expect_not_rpc(&ob, "msgid");
    obj_make(&ob, "[4uns[0", (uint64_t)0, "ping");
    expect_not_rpc(&ob, "msgid");
    obj_make(&ob, "[4uss[0", (uint64_t)0, "1", "ping");
    expect_not_rpc(&ob, "msgid");
    obj_make(&ob, "[4uuu[0", (uint64_t)0, (uint64_t)1, (uint64_t)5);
    expect_not_rpc(&ob, "method must be a string");
    obj_make(&ob, "[4uub[0", (uint64_t)0, (uint64_t)1, "ping");
    expect_not_rpc(&ob, "method must be a string");
    obj_make(&ob, "[4uun[0", (uint64_t)0, (uint64_t)1);
    expect_not_rpc(&ob, "method must be a string");
    obj_make(&ob, "[3uu[0", (uint64_t)2, (uint64_t)7);
    expect_not_rpc(&ob, "notification method must be a string");
    obj_make(&ob, "[3ub[0", (uint64_t)2, "cancel");
    expect_not_rpc(&ob, "notification method must be a string");
    obj_make(&ob, "[4uuun", (uint64_t)1, (uint64_t)1, (uint64_t)3);
    expect_not_rpc(&ob, "error must be nil or a map");
    obj_make(&ob, "[4uusn", (uint64_t)1, (uint64_t)1, "oops");
    expect_not_rpc(&ob, "error must be nil or a map");
    obj_make(&ob, "[4uu[2usn", (uint64_t)1, (uint64_t)1, (uint64_t)1, "x");
    expect_not_rpc(&ob, "error must be nil or a map");
}
END_TEST

/* params is not checked by rpc_parse: a wrong shape is a bad_request for
 * rpc_bind, on a connection that stays usable. */
START_TEST(test_rpc__parse_leaves_params_to_bind)
{
    struct obj ob;
    struct rpc_msg m;

    obj_make(&ob, "[4uus{1ss", (uint64_t)0, (uint64_t)1, "call", "capability", "chat");
    ck_assert_int_eq(rpc_parse(ob.o, &m, NULL), 0);
    ck_assert_int_eq(m.params->type, MSGPACK_OBJECT_MAP);
    obj_free(&ob);
    obj_make(&ob, "[3usn", (uint64_t)2, "cancel");
    ck_assert_int_eq(rpc_parse(ob.o, &m, NULL), 0);
    ck_assert_int_eq(m.params->type, MSGPACK_OBJECT_NIL);
    obj_free(&ob);
}
END_TEST

/* --- small readers ----------------------------------------------------- */

START_TEST(test_rpc__map_get_str_is_str_copy)
{
    struct obj ob;
    char buf[6];

    obj_make(&ob, "{3sssuun", "name", "hello", "n", (uint64_t)1, (uint64_t)5);
    ck_assert(rpc_str_is(rpc_map_get(ob.o, "name"), "hello"));
    ck_assert(!rpc_str_is(rpc_map_get(ob.o, "name"), "hell"));
    ck_assert(!rpc_str_is(rpc_map_get(ob.o, "n"), "1"));
    ck_assert(!rpc_str_is(NULL, "x"));
    ck_assert_ptr_null(rpc_map_get(ob.o, "missing"));
    ck_assert_ptr_null(rpc_map_get(ob.o, "nam"));
    ck_assert_ptr_null(rpc_map_get(NULL, "name"));
    ck_assert_ptr_null(rpc_map_get(rpc_map_get(ob.o, "name"), "x")); /* not a map */

    ck_assert_int_eq(rpc_str_copy(rpc_map_get(ob.o, "name"), buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "hello");
    ck_assert_int_eq(rpc_str_copy(rpc_map_get(ob.o, "name"), buf, 5), -1); /* no room for NUL */
    ck_assert_int_eq(rpc_str_copy(rpc_map_get(ob.o, "n"), buf, sizeof(buf)), -1);
    ck_assert_int_eq(rpc_str_copy(NULL, buf, sizeof(buf)), -1);
    obj_free(&ob);
}
END_TEST

START_TEST(test_rpc__as_double_and_type_name)
{
    static const struct {
        const char *fmt;
        const char *name;
        bool number;
        double v;
    } cases[] = {
        { "u", "integer", true, 7 }, { "i", "negative integer", true, -7 },
        { "d", "float", true, 2.5 }, { "f", "float", true, 0.5 },
        { "s", "string", false, 0 }, { "b", "binary", false, 0 },
        { "n", "nil", false, 0 },    { "t", "boolean", false, 0 },
        { "[0", "array", false, 0 }, { "{0", "map", false, 0 },
        { "x", "ext", false, 0 },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct obj ob;
        double v = -999;
        switch (cases[i].fmt[0]) {
        case 'u':
            obj_make(&ob, "u", (uint64_t)7);
            break;
        case 'i':
            obj_make(&ob, "i", (int64_t)-7);
            break;
        case 'd':
            obj_make(&ob, "d", 2.5);
            break;
        case 'f':
            obj_make(&ob, "f", 0.5);
            break;
        case 's':
            obj_make(&ob, "s", "x");
            break;
        case 'b':
            obj_make(&ob, "b", "x");
            break;
        default:
            obj_make(&ob, cases[i].fmt);
            break;
        }
        ck_assert_str_eq(rpc_type_name(ob.o), cases[i].name);
        ck_assert_int_eq(rpc_as_double(ob.o, &v), cases[i].number);
        if (cases[i].number)
            ck_assert(v == cases[i].v);
        obj_free(&ob);
    }
}
END_TEST

/* --- rpc_bind ---------------------------------------------------------- */

static const struct rpc_param call_spec[] = {
    { "capability", RPC_T_STR, true },           { "body", RPC_T_MAP, true },
    { "stream", RPC_T_BOOL | RPC_T_NIL, false }, { "scope", RPC_T_STR | RPC_T_NIL, false },
    { "task_id", RPC_T_STR | RPC_T_NIL, false }, { "deadline_s", RPC_T_NUMBER | RPC_T_NIL, false },
};
enum { C_CAP, C_BODY, C_STREAM, C_SCOPE, C_TASK, C_DEADLINE, C_N };

/* Binds `ob` (the params array) against call_spec and expects failure
 * with a reason containing `part`. */
static void expect_bind_error(struct obj *ob, const char *part)
{
    const msgpack_object *out[C_N];
    char why[200];

    memset(why, 'Z', sizeof(why));
    ck_assert_int_eq(rpc_bind(ob->o, call_spec, C_N, out, why, sizeof(why)), -1);
    ck_assert_msg(strstr(why, part) != NULL, "reason '%s' lacks '%s'", why, part);
    obj_free(ob);
}

START_TEST(test_rpc__bind_all_params)
{
    struct obj ob;
    const msgpack_object *out[C_N];
    char why[200] = "";
    double d;

    obj_make(&ob, "[1{6ss s{0 st ss ss sd", "capability", "chat", "body", "stream", "scope", "team",
             "task_id", "run-1", "deadline_s", 2.5);
    ck_assert_msg(rpc_bind(ob.o, call_spec, C_N, out, why, sizeof(why)) == 0, "%s", why);
    ck_assert(rpc_str_is(out[C_CAP], "chat"));
    ck_assert_int_eq(out[C_BODY]->type, MSGPACK_OBJECT_MAP);
    ck_assert(out[C_STREAM]->via.boolean);
    ck_assert(rpc_str_is(out[C_SCOPE], "team"));
    ck_assert(rpc_str_is(out[C_TASK], "run-1"));
    ck_assert(rpc_as_double(out[C_DEADLINE], &d) && d == 2.5);
    obj_free(&ob);

    /* Any number for a number: uint, negative int (range checks are the
     * method's business), float32. */
    obj_make(&ob, "[1{3sss{0su", "capability", "chat", "body", "deadline_s", (uint64_t)30);
    ck_assert_int_eq(rpc_bind(ob.o, call_spec, C_N, out, why, sizeof(why)), 0);
    obj_free(&ob);
    obj_make(&ob, "[1{3sss{0si", "capability", "chat", "body", "deadline_s", (int64_t)-3);
    ck_assert_int_eq(rpc_bind(ob.o, call_spec, C_N, out, why, sizeof(why)), 0);
    obj_free(&ob);
    obj_make(&ob, "[1{3sss{0sf", "capability", "chat", "body", "deadline_s", 0.25);
    ck_assert_int_eq(rpc_bind(ob.o, call_spec, C_N, out, why, sizeof(why)), 0);
    ck_assert_int_eq(out[C_DEADLINE]->type, MSGPACK_OBJECT_FLOAT32);
    obj_free(&ob);
}
END_TEST

START_TEST(test_rpc__bind_optional_absent_or_nil)
{
    struct obj ob;
    const msgpack_object *out[C_N];
    char why[200] = "";

    obj_make(&ob, "[1{6sss{0snsnsnsn", "capability", "chat", "body", "stream", "scope", "task_id",
             "deadline_s");
    ck_assert_msg(rpc_bind(ob.o, call_spec, C_N, out, why, sizeof(why)) == 0, "%s", why);
    ck_assert_ptr_nonnull(out[C_CAP]);
    ck_assert_ptr_nonnull(out[C_BODY]);
    for (int i = C_STREAM; i < C_N; i++)
        ck_assert_ptr_null(out[i]);
    obj_free(&ob);

    obj_make(&ob, "[1{2sss{0", "capability", "chat", "body");
    ck_assert_int_eq(rpc_bind(ob.o, call_spec, C_N, out, why, sizeof(why)), 0);
    for (int i = C_STREAM; i < C_N; i++)
        ck_assert_ptr_null(out[i]);
    obj_free(&ob);
}
END_TEST

/* [], [nil] and [{}] all mean "no parameters". */
START_TEST(test_rpc__bind_no_params)
{
    static const char *const fmts[] = { "[0", "[1n", "[1{0" };
    static const struct rpc_param opt[] = { { "verbose", RPC_T_BOOL, false } };
    static const msgpack_object sentinel;

    for (size_t i = 0; i < 3; i++) {
        struct obj ob;
        const msgpack_object *out[1] = { &sentinel };
        char why[100] = "";

        obj_make(&ob, fmts[i]);
        ck_assert_int_eq(rpc_bind(ob.o, NULL, 0, NULL, why, sizeof(why)), 0);
        ck_assert_int_eq(rpc_bind(ob.o, opt, 1, out, why, sizeof(why)), 0);
        ck_assert_ptr_null(out[0]);
        obj_free(&ob);
    }
    /* ...but not when something is required. */
    struct obj ob;
    obj_make(&ob, "[0");
    expect_bind_error(&ob, "missing required parameter 'capability'");
}
END_TEST

START_TEST(test_rpc__bind_params_shape)
{
    struct obj ob;

    obj_make(&ob, "{2sss{0", "capability", "chat", "body");
    expect_bind_error(&ob, "params must be an array holding one map");
    obj_make(&ob, "n");
    expect_bind_error(&ob, "params must be an array holding one map");
    obj_make(&ob, "s", "chat");
    expect_bind_error(&ob, "params must be an array holding one map");
    obj_make(&ob, "[2{2sss{0{0", "capability", "chat", "body");
    expect_bind_error(&ob, "params must be an array holding one map");
    obj_make(&ob, "[1s", "chat");
    expect_bind_error(&ob, "params[0] must be a map of named parameters, got string");
    obj_make(&ob, "[1[0");
    expect_bind_error(&ob, "params[0] must be a map of named parameters, got array");

    const msgpack_object *out[1];
    char why[100];
    ck_assert_int_eq(rpc_bind(NULL, NULL, 0, out, why, sizeof(why)), -1);
}
END_TEST

START_TEST(test_rpc__bind_unknown_param)
{
    struct obj ob;

    obj_make(&ob, "[1{3sss{0sd", "capability", "chat", "body", "temperature", 0.2);
    expect_bind_error(&ob, "unknown parameter 'temperature'");
    /* Names are matched exactly: no prefixes, no case folding. */
    obj_make(&ob, "[1{3sss{0st", "capability", "chat", "body", "Stream");
    expect_bind_error(&ob, "unknown parameter 'Stream'");
    obj_make(&ob, "[1{3sss{0st", "capability", "chat", "body", "strea");
    expect_bind_error(&ob, "unknown parameter 'strea'");
    /* ping takes nothing. */
    obj_make(&ob, "[1{1st", "verbose");
    const msgpack_object *out[1];
    char why[100];
    ck_assert_int_eq(rpc_bind(ob.o, NULL, 0, out, why, sizeof(why)), -1);
    ck_assert_str_eq(why, "unknown parameter 'verbose'");
    obj_free(&ob);
}
END_TEST

/* True when s is well-formed UTF-8. */
static bool utf8_ok(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;

    while (*p) {
        int n = *p < 0x80         ? 1
            : (*p & 0xe0) == 0xc0 ? 2
            : (*p & 0xf0) == 0xe0 ? 3
            : (*p & 0xf8) == 0xf0 ? 4
                                  : 0;
        if (n == 0 || (n == 2 && *p < 0xc2))
            return false;
        for (int i = 1; i < n; i++) {
            if ((p[i] & 0xc0) != 0x80)
                return false;
        }
        p += n;
    }
    return true;
}

/* The reason quotes the client's name; it goes back as a msgpack str that
 * clients decode as UTF-8, so it must stay valid UTF-8 however the name is
 * cut, and must not carry control characters. */
START_TEST(test_rpc__bind_unknown_param_quoted_safely)
{
    static const char *const names[] = {
        /* 30 x U+4E16 (3 bytes each): a 64-byte cut would split the 22nd. */
        "世世世世世世世世世世世世世世世世世世世世世世世世世世世世世世",
        "bad\xff\xfe utf8 \xc0\xaf overlong \xed\xa0\x80 surrogate",
        "tab\there\nnewline\x7f",
        "truncated 4-byte \xf0\x9f\x8c",
    };
    const msgpack_object *out[C_N];
    char why[200];

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        struct obj ob;
        obj_make(&ob, "[1{3sss{0st", "capability", "chat", "body", names[i]);
        ck_assert_int_eq(rpc_bind(ob.o, call_spec, C_N, out, why, sizeof(why)), -1);
        ck_assert_msg(utf8_ok(why), "case %zu: reason is not UTF-8", i);
        for (const char *p = why; *p; p++)
            ck_assert_msg((unsigned char)*p >= 0x20 && *p != 0x7f, "case %zu: control char", i);
        ck_assert(strncmp(why, "unknown parameter '", 19) == 0);
        obj_free(&ob);
    }

    struct obj ob;
    obj_make(&ob, "[1{3sss{0st", "capability", "chat", "body", names[0]);
    ck_assert_int_eq(rpc_bind(ob.o, call_spec, C_N, out, why, sizeof(why)), -1);
    /* 21 whole characters (63 bytes) fit in the 64-byte quote. */
    ck_assert_str_eq(why, "unknown parameter '世世世世世世世世世世世世世世世世世世世世世'");
    obj_free(&ob);
    obj_make(&ob, "[1{3sss{0st", "capability", "chat", "body", names[2]);
    ck_assert_int_eq(rpc_bind(ob.o, call_spec, C_N, out, why, sizeof(why)), -1);
    ck_assert_str_eq(why, "unknown parameter 'tab?here?newline?'");
    obj_free(&ob);
    obj_make(&ob, "[1{3sss{0st", "capability", "chat", "body", "café ✓ 🌍");
    ck_assert_int_eq(rpc_bind(ob.o, call_spec, C_N, out, why, sizeof(why)), -1);
    ck_assert_str_eq(why, "unknown parameter 'café ✓ 🌍'");
    obj_free(&ob);
}
END_TEST

START_TEST(test_rpc__bind_duplicate_param)
{
    struct obj ob;

    obj_make(&ob, "[1{3sss{0ss", "capability", "chat", "body", "capability", "embedding");
    expect_bind_error(&ob, "parameter 'capability' given twice");
    /* The first value being nil (= absent) does not hide the duplicate. */
    obj_make(&ob, "[1{4sss{0snss", "capability", "chat", "body", "scope", "scope", "x");
    expect_bind_error(&ob, "parameter 'scope' given twice");
    obj_make(&ob, "[1{4sss{0sssn", "capability", "chat", "body", "scope", "x", "scope");
    expect_bind_error(&ob, "parameter 'scope' given twice");
}
END_TEST

START_TEST(test_rpc__bind_missing_required)
{
    struct obj ob;

    obj_make(&ob, "[1{1ss", "capability", "chat");
    expect_bind_error(&ob, "missing required parameter 'body'");
    obj_make(&ob, "[1{1s{0", "body");
    expect_bind_error(&ob, "missing required parameter 'capability'");
    /* nil is not allowed for a required string: a type error. */
    obj_make(&ob, "[1{2sns{0", "capability", "body");
    expect_bind_error(&ob, "parameter 'capability': expected string, got nil");

    /* A required parameter whose spec admits nil: nil counts as missing. */
    static const struct rpc_param spec[] = { { "node", RPC_T_STR | RPC_T_NIL, true } };
    const msgpack_object *out[1];
    char why[100];
    obj_make(&ob, "[1{1sn", "node");
    ck_assert_int_eq(rpc_bind(ob.o, spec, 1, out, why, sizeof(why)), -1);
    ck_assert_str_eq(why, "missing required parameter 'node'");
    obj_free(&ob);
}
END_TEST

START_TEST(test_rpc__bind_type_errors)
{
    struct obj ob;

    obj_make(&ob, "[1{2sus{0", "capability", (uint64_t)1, "body");
    expect_bind_error(&ob, "parameter 'capability': expected string, got integer");
    obj_make(&ob, "[1{2sbs{0", "capability", "chat", "body");
    expect_bind_error(&ob, "parameter 'capability': expected string, got binary");
    obj_make(&ob, "[1{2sss[0", "capability", "chat", "body");
    expect_bind_error(&ob, "parameter 'body': expected map, got array");
    obj_make(&ob, "[1{2ssss", "capability", "chat", "body", "{}");
    expect_bind_error(&ob, "parameter 'body': expected map, got string");
    obj_make(&ob, "[1{3sss{0su", "capability", "chat", "body", "stream", (uint64_t)1);
    expect_bind_error(&ob, "parameter 'stream': expected boolean, got integer");
    obj_make(&ob, "[1{3sss{0ss", "capability", "chat", "body", "deadline_s", "30");
    expect_bind_error(&ob, "parameter 'deadline_s': expected number, got string");
    obj_make(&ob, "[1{3sss{0st", "capability", "chat", "body", "deadline_s");
    expect_bind_error(&ob, "parameter 'deadline_s': expected number, got boolean");
    obj_make(&ob, "[1{3sss{0sx", "capability", "chat", "body", "scope");
    expect_bind_error(&ob, "parameter 'scope': expected string, got ext");

    /* The remaining descriptions of types_wanted(). */
    static const struct rpc_param spec[] = {
        { "n", RPC_T_UINT, false },
        { "q", RPC_T_UINT | RPC_T_FLOAT, false },
        { "a", RPC_T_ARRAY, false },
    };
    const msgpack_object *out[3];
    char why[100];
    obj_make(&ob, "[1{1si", "n", (int64_t)-1);
    ck_assert_int_eq(rpc_bind(ob.o, spec, 3, out, why, sizeof(why)), -1);
    ck_assert_str_eq(why, "parameter 'n': expected non-negative integer, got negative integer");
    obj_free(&ob);
    obj_make(&ob, "[1{1si", "q", (int64_t)-1);
    ck_assert_int_eq(rpc_bind(ob.o, spec, 3, out, why, sizeof(why)), -1);
    ck_assert_str_eq(why, "parameter 'q': expected non-negative number, got negative integer");
    obj_free(&ob);
    obj_make(&ob, "[1{1s{0", "a");
    ck_assert_int_eq(rpc_bind(ob.o, spec, 3, out, why, sizeof(why)), -1);
    ck_assert_str_eq(why, "parameter 'a': expected array, got map");
    obj_free(&ob);
    obj_make(&ob, "[1{1sn", "a"); /* nil without RPC_T_NIL in the mask */
    ck_assert_int_eq(rpc_bind(ob.o, spec, 3, out, why, sizeof(why)), -1);
    ck_assert_str_eq(why, "parameter 'a': expected array, got nil");
    obj_free(&ob);
}
END_TEST

START_TEST(test_rpc__bind_key_not_string)
{
    struct obj ob;

    obj_make(&ob, "[1{3sss{0us", "capability", "chat", "body", (uint64_t)1, "x");
    expect_bind_error(&ob, "parameter names must be strings, got integer");
    obj_make(&ob, "[1{3sss{0bs", "capability", "chat", "body", "scope", "x");
    expect_bind_error(&ob, "parameter names must be strings, got binary");
}
END_TEST

/* A short reason buffer is truncated, NUL-terminated, never overrun. */
START_TEST(test_rpc__bind_short_why)
{
    struct obj ob;
    const msgpack_object *out[C_N];
    char why[12];

    memset(why, 'Z', sizeof(why));
    obj_make(&ob, "[1{1ss", "capability", "chat");
    ck_assert_int_eq(rpc_bind(ob.o, call_spec, C_N, out, why, 8), -1);
    ck_assert_str_eq(why, "missing");
    ck_assert_int_eq(why[8], 'Z');
    ck_assert_int_eq(rpc_bind(ob.o, call_spec, C_N, out, NULL, 0), -1);
    obj_free(&ob);
}
END_TEST

/* --- writers, read back through the frame reader ----------------------- */

struct wire {
    msgpack_sbuffer sb;
    msgpack_packer pk;
    struct frame_reader r;
    msgpack_unpacked u;
    struct rpc_msg m;
};

static void wire_init(struct wire *w)
{
    msgpack_sbuffer_init(&w->sb);
    msgpack_packer_init(&w->pk, &w->sb, msgpack_sbuffer_write);
    ck_assert_int_eq(frame_reader_init(&w->r, 1 << 20, 0), 0);
    msgpack_unpacked_init(&w->u);
}

/* Feeds what was packed since the last call; expects one frame that parses. */
static const struct rpc_msg *wire_read(struct wire *w)
{
    size_t fb = 0;

    ck_assert_int_eq(frame_reader_feed(&w->r, w->sb.data, w->sb.size), 0);
    ck_assert_int_eq(frame_reader_next(&w->r, &w->u, &fb), 1);
    ck_assert_uint_eq(fb, w->sb.size);
    ck_assert_uint_eq(frame_reader_pending(&w->r), 0);
    ck_assert_int_eq(rpc_parse(&w->u.data, &w->m, NULL), 0);
    msgpack_sbuffer_clear(&w->sb);
    return &w->m;
}

static void wire_fini(struct wire *w)
{
    msgpack_unpacked_destroy(&w->u);
    frame_reader_fini(&w->r);
    msgpack_sbuffer_destroy(&w->sb);
}

START_TEST(test_rpc__writers_roundtrip)
{
    struct wire w;
    const struct rpc_msg *m;
    const msgpack_object *out[C_N];
    char why[100];

    wire_init(&w);

    rpc_pack_request_begin(&w.pk, UINT32_MAX, "call");
    msgpack_pack_array(&w.pk, 1);
    msgpack_pack_map(&w.pk, 2);
    rpc_pack_str(&w.pk, "capability");
    rpc_pack_strn(&w.pk, "chat-and-more", 4);
    rpc_pack_str(&w.pk, "body");
    msgpack_pack_map(&w.pk, 0);
    m = wire_read(&w);
    ck_assert_int_eq(m->type, RPC_REQUEST);
    ck_assert_uint_eq(m->msgid, UINT32_MAX);
    ck_assert(rpc_method_is(m, "call"));
    ck_assert_int_eq(rpc_bind(m->params, call_spec, C_N, out, why, sizeof(why)), 0);
    ck_assert(rpc_str_is(out[C_CAP], "chat"));

    rpc_pack_result_begin(&w.pk, 9);
    msgpack_pack_map(&w.pk, 1);
    rpc_pack_str(&w.pk, "version");
    rpc_pack_str(&w.pk, "0.1.0");
    m = wire_read(&w);
    ck_assert_int_eq(m->type, RPC_RESPONSE);
    ck_assert_uint_eq(m->msgid, 9);
    ck_assert_int_eq(m->error->type, MSGPACK_OBJECT_NIL);
    ck_assert(rpc_str_is(rpc_map_get(m->result, "version"), "0.1.0"));

    rpc_pack_error(&w.pk, 10, PGW_UNKNOWN_METHOD, "unknown method 'x'");
    m = wire_read(&w);
    ck_assert_int_eq(m->type, RPC_RESPONSE);
    ck_assert_uint_eq(m->msgid, 10);
    ck_assert_uint_eq(m->error->via.map.size, 2);
    ck_assert(rpc_str_is(rpc_map_get(m->error, "code"), "unknown_method"));
    ck_assert(rpc_str_is(rpc_map_get(m->error, "message"), "unknown method 'x'"));
    ck_assert_int_eq(m->result->type, MSGPACK_OBJECT_NIL);

    rpc_pack_error_begin(&w.pk, 11, PGW_STALLED, "no progress", 2);
    rpc_pack_str(&w.pk, "retry_after_s");
    msgpack_pack_double(&w.pk, 30.0);
    rpc_pack_str(&w.pk, "attempts");
    msgpack_pack_uint32(&w.pk, 3);
    rpc_pack_error_end(&w.pk);
    m = wire_read(&w);
    ck_assert_uint_eq(m->error->via.map.size, 4);
    ck_assert(rpc_str_is(rpc_map_get(m->error, "code"), "stalled"));
    ck_assert_uint_eq(rpc_map_get(m->error, "attempts")->via.u64, 3);
    ck_assert(rpc_map_get(m->error, "retry_after_s")->via.f64 == 30.0);

    rpc_pack_notify_begin(&w.pk, "chunk");
    msgpack_pack_array(&w.pk, 2);
    msgpack_pack_uint32(&w.pk, 11);
    msgpack_pack_map(&w.pk, 0);
    m = wire_read(&w);
    ck_assert_int_eq(m->type, RPC_NOTIFY);
    ck_assert(rpc_method_is(m, "chunk"));
    ck_assert_uint_eq(m->params->via.array.size, 2);

    rpc_pack_fatal(&w.pk, PGW_TOO_LARGE, "message exceeds max_message_bytes");
    m = wire_read(&w);
    ck_assert_int_eq(m->type, RPC_NOTIFY);
    ck_assert(rpc_method_is(m, "error"));
    ck_assert_uint_eq(m->params->via.array.size, 1);
    ck_assert(rpc_str_is(rpc_map_get(&m->params->via.array.ptr[0], "code"), "too_large"));
    ck_assert(rpc_str_is(rpc_map_get(&m->params->via.array.ptr[0], "message"),
                         "message exceeds max_message_bytes"));
    wire_fini(&w);
}
END_TEST

/* Identifiers: 1..max bytes of UTF-8 without NUL, one message shape. */
START_TEST(test_rpc__check_ident)
{
    char why[120];

    ck_assert_int_eq(rpc_check_ident("scope", "a", 1, 3, why, sizeof(why)), 0);
    ck_assert_int_eq(rpc_check_ident("scope", "\xE2\x82\xAC", 3, 3, why, sizeof(why)), 0);
    ck_assert_int_eq(rpc_check_ident("scope", "", 0, 3, why, sizeof(why)), -1);
    ck_assert_str_eq(why, "scope: expected 1 to 3 bytes of UTF-8 without NUL");
    ck_assert_int_eq(rpc_check_ident("scope", "abcd", 4, 3, why, sizeof(why)), -1);
    ck_assert_int_eq(rpc_check_ident("scope", "a\0b", 3, 3, why, sizeof(why)), -1);
    ck_assert_int_eq(rpc_check_ident("scope", "\xFF\xFE", 2, 3, why, sizeof(why)), -1);
    ck_assert_int_eq(rpc_check_ident("scope", "\xED\xA0\x80", 3, 3, why, sizeof(why)), -1);
    ck_assert_int_eq(rpc_check_ident("scope", "\xC0\xAF", 2, 3, why, sizeof(why)), -1);
    ck_assert_int_eq(rpc_check_ident("scope", "a\xE2\x82", 3, 3, why, sizeof(why)), -1);

    msgpack_object o = { .type = MSGPACK_OBJECT_STR, .via.str = { .size = 2, .ptr = "\xFF\xFE" } };
    char buf[4] = "zzz";
    ck_assert_int_eq(rpc_ident_copy("task_id", &o, buf, sizeof(buf), why, sizeof(why)), -1);
    ck_assert_str_eq(why, "task_id: expected 1 to 3 bytes of UTF-8 without NUL");
    o.via.str.ptr = "ok";
    ck_assert_int_eq(rpc_ident_copy("task_id", &o, buf, sizeof(buf), why, sizeof(why)), 0);
    ck_assert_str_eq(buf, "ok");
}
END_TEST

/* Text packs valid UTF-8 unchanged and replaces what is not with U+FFFD,
 * an error message included. */
START_TEST(test_rpc__pack_text_stays_utf8)
{
    struct wire w;

    wire_init(&w);
    rpc_pack_result_begin(&w.pk, 1);
    msgpack_pack_map(&w.pk, 3);
    rpc_pack_kv_text(&w.pk, "ok", "\xE2\x82\xAC x");
    rpc_pack_kv_text(&w.pk, "bad",
                     "a\xFF\xFE"
                     "b\xE2\x82");
    rpc_pack_kv_text(&w.pk, "empty", "");
    const struct rpc_msg *m = wire_read(&w);
    ck_assert(rpc_str_is(rpc_map_get(m->result, "ok"), "\xE2\x82\xAC x"));
    ck_assert(rpc_str_is(rpc_map_get(m->result, "bad"),
                         "a\xEF\xBF\xBD\xEF\xBF\xBD"
                         "b\xEF\xBF\xBD"));
    ck_assert(rpc_str_is(rpc_map_get(m->result, "empty"), ""));

    rpc_pack_error(&w.pk, 2, PGW_BAD_REQUEST, "unknown task '\xFF'");
    m = wire_read(&w);
    ck_assert(rpc_str_is(rpc_map_get(m->error, "message"), "unknown task '\xEF\xBF\xBD'"));
    wire_fini(&w);
}
END_TEST

/* Every code round-trips through an error response by name. */
START_TEST(test_rpc__error_codes_roundtrip)
{
    struct wire w;

    wire_init(&w);
    for (int c = PGW_STALLED; c < PGW_CODE_COUNT; c++) {
        const char *name = pgw_code_name((enum pgw_code)c);
        rpc_pack_error(&w.pk, (uint32_t)c, (enum pgw_code)c, name);
        const struct rpc_msg *m = wire_read(&w);
        const msgpack_object *code = rpc_map_get(m->error, "code");
        ck_assert(rpc_str_is(code, name));
        ck_assert_int_eq(pgw_code_from_name(code->via.str.ptr, code->via.str.size), c);
    }
    wire_fini(&w);
}
END_TEST

START_TEST(test_rpc__code_names)
{
    static const char *const wire_names[] = {
        "stalled",
        "retry_exhausted",
        "upstream_rejected",
        "deadline_exceeded",
        "cancelled",
        "task_stopped",
        "watchdog_timeout",
        "stream_interrupted",
        "backend_unavailable",
        "budget_exhausted",
        "bad_request",
        "unknown_method",
        "unknown_capability",
        "model_not_found",
        "response_not_found",
        "too_large",
        "overloaded",
        "shutting_down",
        "internal",
    };

    ck_assert_int_eq(sizeof(wire_names) / sizeof(wire_names[0]), PGW_CODE_COUNT - 1);
    for (int c = 1; c < PGW_CODE_COUNT; c++) {
        ck_assert_str_eq(pgw_code_name((enum pgw_code)c), wire_names[c - 1]);
        ck_assert_int_eq(pgw_code_from_name(wire_names[c - 1], strlen(wire_names[c - 1])), c);
    }
    ck_assert_str_eq(pgw_code_name((enum pgw_code) - 1), "internal");
    ck_assert_str_eq(pgw_code_name(PGW_CODE_COUNT), "internal");
    ck_assert_int_eq(pgw_code_from_name("stall", 5), -1);
    ck_assert_int_eq(pgw_code_from_name("stalledx", 8), -1);
    ck_assert_int_eq(pgw_code_from_name("STALLED", 7), -1);
    ck_assert_int_eq(pgw_code_from_name("stalled", 7), PGW_STALLED); /* no NUL needed */

    for (int c = 1; c < PGW_CODE_COUNT; c++) {
        bool later = c == PGW_STALLED || c == PGW_RETRY_EXHAUSTED || c == PGW_BACKEND_UNAVAILABLE ||
            c == PGW_OVERLOADED || c == PGW_SHUTTING_DOWN;
        ck_assert_int_eq(pgw_code_is_retry_later((enum pgw_code)c), later);
    }
}
END_TEST

/* An error packed with its declared extra-field count checks clean; one
 * that declares a pair too many or too few does not, wherever it sits in
 * the queue. */
START_TEST(test_rpc__check_messages_catches_miscounted_maps)
{
    char why[128];

    for (int delta = -1; delta <= 1; delta++) {
        msgpack_sbuffer sb;
        msgpack_packer pk;
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        rpc_pack_error(&pk, 1, PGW_INTERNAL, "first");
        rpc_pack_error_begin(&pk, 2, PGW_STALLED, "second", (size_t)(2 + delta));
        rpc_pack_kv_u64(&pk, "attempts", 3);
        rpc_pack_kv_double(&pk, "stalled_s", 1.5);
        rpc_pack_error_end(&pk);
        rpc_pack_result_begin(&pk, 3);
        msgpack_pack_nil(&pk);
        int rc = rpc_check_messages(sb.data, sb.size, why, sizeof(why));
        if (delta == 0)
            ck_assert_msg(rc == 0, "%s", why);
        else
            ck_assert_msg(rc == -1, "miscount by %d not caught", delta);
        msgpack_sbuffer_destroy(&sb);
    }
    ck_assert_int_eq(rpc_check_messages("\x93\x01", 2, NULL, 0), -1); /* truncated */
    ck_assert_int_eq(rpc_check_messages("", 0, why, sizeof(why)), 0);
}
END_TEST

Suite *rpc_suite(void)
{
    Suite *s = suite_create("rpc");
    TCase *tc = tcase_create("rpc");

    tcase_add_test(tc, test_rpc__parse_request);
    tcase_add_test(tc, test_rpc__parse_response);
    tcase_add_test(tc, test_rpc__parse_notification);
    tcase_add_test(tc, test_rpc__parse_wide_ints);
    tcase_add_test(tc, test_rpc__parse_rejects);
    tcase_add_test(tc, test_rpc__parse_leaves_params_to_bind);
    tcase_add_test(tc, test_rpc__map_get_str_is_str_copy);
    tcase_add_test(tc, test_rpc__as_double_and_type_name);
    tcase_add_test(tc, test_rpc__bind_all_params);
    tcase_add_test(tc, test_rpc__bind_optional_absent_or_nil);
    tcase_add_test(tc, test_rpc__bind_no_params);
    tcase_add_test(tc, test_rpc__bind_params_shape);
    tcase_add_test(tc, test_rpc__bind_unknown_param);
    tcase_add_test(tc, test_rpc__bind_unknown_param_quoted_safely);
    tcase_add_test(tc, test_rpc__bind_duplicate_param);
    tcase_add_test(tc, test_rpc__bind_missing_required);
    tcase_add_test(tc, test_rpc__bind_type_errors);
    tcase_add_test(tc, test_rpc__bind_key_not_string);
    tcase_add_test(tc, test_rpc__bind_short_why);
    tcase_add_test(tc, test_rpc__writers_roundtrip);
    tcase_add_test(tc, test_rpc__error_codes_roundtrip);
    tcase_add_test(tc, test_rpc__check_ident);
    tcase_add_test(tc, test_rpc__pack_text_stays_utf8);
    tcase_add_test(tc, test_rpc__code_names);
    tcase_add_test(tc, test_rpc__check_messages_catches_miscounted_maps);
    suite_add_tcase(s, tc);
    return s;
}
