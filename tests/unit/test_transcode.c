/* test_transcode.c — msgpack <-> JSON transcoding (sidecar/transcode). */
#include <check.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "suites.h"
#include "comma_locale.h"
#include "codec/transcode.h"
#include "tests/ref/transcode_jansson.h"
#include "utf8.h"

#define ERRLEN 512

/* ---- helpers ------------------------------------------------------------ */

/* A packer writing into its own sbuffer. */
struct mp {
    msgpack_sbuffer sb;
    msgpack_packer pk;
};

static void mp_init(struct mp *m)
{
    msgpack_sbuffer_init(&m->sb);
    msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
}

static void mp_fini(struct mp *m)
{
    msgpack_sbuffer_destroy(&m->sb);
}

static void pstrn(msgpack_packer *pk, const char *s, size_t n)
{
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pstr(msgpack_packer *pk, const char *s)
{
    pstrn(pk, s, strlen(s));
}

/* Unpacks `n` bytes and transcodes them to JSON into `out` (appending). */
static int m2j(const char *data, size_t n, const struct transcode_override *ov, struct strbuf *out,
               char *err)
{
    msgpack_unpacked u;
    size_t off = 0;

    msgpack_unpacked_init(&u);
    ck_assert_int_eq(msgpack_unpack_next(&u, data, n, &off), MSGPACK_UNPACK_SUCCESS);
    ck_assert_uint_eq(off, n);
    int rc = transcode_msgpack_to_json(&u.data, out, ov, "body", err, ERRLEN);
    msgpack_unpacked_destroy(&u);
    return rc;
}

/* msgpack (m) -> JSON must equal `want`, and JSON -> msgpack must give back
 * exactly m's bytes. */
static void check_roundtrip(struct mp *m, const struct transcode_override *ov, const char *want)
{
    struct strbuf out;
    struct mp back;
    char err[ERRLEN];

    strbuf_init(&out);
    ck_assert_msg(m2j(m->sb.data, m->sb.size, ov, &out, err) == 0, "m2j failed: %s", err);
    ck_assert_str_eq(out.data, want);
    ck_assert_uint_eq(out.len, strlen(want));
    mp_init(&back);
    ck_assert_msg(transcode_json_to_msgpack(out.data, out.len, &back.pk, NULL, err, sizeof(err)) ==
                      0,
                  "j2m failed: %s", err);
    ck_assert_uint_eq(back.sb.size, m->sb.size);
    ck_assert_mem_eq(back.sb.data, m->sb.data, m->sb.size);
    mp_fini(&back);
    strbuf_fini(&out);
}

/* msgpack (m) with overrides -> JSON must equal `want`. */
static void check_m2j(struct mp *m, const struct transcode_override *ov, const char *want)
{
    struct strbuf out;
    char err[ERRLEN];

    strbuf_init(&out);
    ck_assert_msg(m2j(m->sb.data, m->sb.size, ov, &out, err) == 0, "m2j failed: %s", err);
    ck_assert_str_eq(out.data, want);
    strbuf_fini(&out);
}

/* msgpack (m) -> JSON must fail with exactly `want_err`; out left empty. */
static void check_m2j_fails(struct mp *m, const struct transcode_override *ov, const char *want_err)
{
    struct strbuf out;
    char err[ERRLEN];

    strbuf_init(&out);
    ck_assert_int_eq(m2j(m->sb.data, m->sb.size, ov, &out, err), TRANSCODE_EINVALID);
    ck_assert_str_eq(err, want_err);
    ck_assert_uint_eq(out.len, 0);
    strbuf_fini(&out);
}

/* JSON -> msgpack must give exactly `want` (n bytes). */
static void check_j2m(const char *json, const char *want, size_t n)
{
    struct mp m;
    char err[ERRLEN];

    mp_init(&m);
    ck_assert_msg(transcode_json_to_msgpack(json, strlen(json), &m.pk, NULL, err, sizeof(err)) == 0,
                  "j2m(%s) failed: %s", json, err);
    ck_assert_uint_eq(m.sb.size, n);
    ck_assert_mem_eq(m.sb.data, want, n);
    mp_fini(&m);
}

/* True when every byte is printable ASCII. */
static int is_printable_ascii(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7E)
            return 0;
    return 1;
}

/* JSON -> msgpack must fail with TRANSCODE_EINVALID; the message must start
 * with `prefix`, contain `needle` (may be NULL), stay short and printable. */
static void check_j2m_fails(const char *json, size_t len, const char *prefix, const char *needle)
{
    struct mp m;
    char err[ERRLEN];

    mp_init(&m);
    ck_assert_int_eq(transcode_json_to_msgpack(json, len, &m.pk, NULL, err, sizeof(err)),
                     TRANSCODE_EINVALID);
    ck_assert_msg(strncmp(err, prefix, strlen(prefix)) == 0, "err '%s' lacks prefix '%s'", err,
                  prefix);
    if (needle)
        ck_assert_msg(strstr(err, needle), "err '%s' lacks '%s'", err, needle);
    ck_assert_uint_lt(strlen(err), 256);
    ck_assert_msg(is_printable_ascii(err), "err not printable: %s", err);
    mp_fini(&m);
}

/* ---- buffer --------------------------------------------------------------- */

START_TEST(test_transcode__buf_lifecycle)
{
    struct strbuf b;

    strbuf_init(&b);
    ck_assert_ptr_null(b.data);
    ck_assert_int_eq(strbuf_reserve(&b, 5000), 0);
    ck_assert_uint_gt(b.cap, 5000);
    ck_assert_uint_eq(b.len, 0);
    char *before = b.data;
    size_t cap = b.cap;
    ck_assert_int_eq(strbuf_reserve(&b, SIZE_MAX - 8), TRANSCODE_ENOMEM);
    ck_assert_ptr_eq(b.data, before);
    ck_assert_uint_eq(b.cap, cap);
    strbuf_reset(&b);
    ck_assert_ptr_eq(b.data, before);
    strbuf_fini(&b);
    ck_assert_ptr_null(b.data);
    ck_assert_uint_eq(b.cap, 0);
    strbuf_fini(&b); /* idempotent */
}
END_TEST

/* ---- msgpack -> JSON -> msgpack round trips ------------------------------- */

START_TEST(test_transcode__roundtrip_chat_body)
{
    struct mp m;
    msgpack_packer *pk = &m.pk;

    mp_init(&m);
    msgpack_pack_map(pk, 9);
    pstr(pk, "model");
    pstr(pk, "gpt-4o");
    pstr(pk, "messages");
    msgpack_pack_array(pk, 2);
    msgpack_pack_map(pk, 2);
    pstr(pk, "role");
    pstr(pk, "system");
    pstr(pk, "content");
    pstr(pk, "You are terse.");
    msgpack_pack_map(pk, 2);
    pstr(pk, "role");
    pstr(pk, "user");
    pstr(pk, "content");
    pstr(pk, "Hi");
    pstr(pk, "temperature");
    msgpack_pack_double(pk, 0.7);
    pstr(pk, "max_tokens");
    msgpack_pack_int64(pk, 256);
    pstr(pk, "stream");
    msgpack_pack_false(pk);
    pstr(pk, "tools");
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 2);
    pstr(pk, "type");
    pstr(pk, "function");
    pstr(pk, "function");
    msgpack_pack_map(pk, 2);
    pstr(pk, "name");
    pstr(pk, "f");
    pstr(pk, "parameters");
    msgpack_pack_map(pk, 3);
    pstr(pk, "type");
    pstr(pk, "object");
    pstr(pk, "properties");
    msgpack_pack_map(pk, 0);
    pstr(pk, "required");
    msgpack_pack_array(pk, 0);
    pstr(pk, "user");
    msgpack_pack_nil(pk);
    pstr(pk, "logprobs");
    msgpack_pack_true(pk);
    pstr(pk, "zz");
    msgpack_pack_array(pk, 3);
    msgpack_pack_array(pk, 0);
    msgpack_pack_map(pk, 0);
    msgpack_pack_array(pk, 1);
    msgpack_pack_array(pk, 1);
    msgpack_pack_nil(pk);
    check_roundtrip(&m, NULL,
                    "{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"system\",\"content\":"
                    "\"You are terse.\"},{\"role\":\"user\",\"content\":\"Hi\"}],"
                    "\"temperature\":0.7,\"max_tokens\":256,\"stream\":false,\"tools\":"
                    "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                    "{\"type\":\"object\",\"properties\":{},\"required\":[]}}}],"
                    "\"user\":null,\"logprobs\":true,\"zz\":[[],{},[[null]]]}");
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__roundtrip_unicode_and_escapes)
{
    struct mp m;

    mp_init(&m);
    msgpack_pack_array(&m.pk, 7);
    pstr(&m.pk, "\xc3\xa9");                             /* é (2 bytes) */
    pstr(&m.pk, "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e"); /* 日本語 (3 bytes each) */
    pstr(&m.pk, "\xf0\x9f\x98\x80 ok");                  /* 😀 (4 bytes) */
    pstr(&m.pk, "q\"b\\s/\n\r\t\b\f\x01\x1f\x7f");
    pstrn(&m.pk, "a\0b", 3);
    pstr(&m.pk, "\xef\xbf\xbf\xf4\x8f\xbf\xbf"); /* U+FFFF, U+10FFFF */
    pstr(&m.pk, "");
    check_roundtrip(&m, NULL,
                    "[\"\xc3\xa9\",\"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\","
                    "\"\xf0\x9f\x98\x80 ok\","
                    "\"q\\\"b\\\\s/\\n\\r\\t\\b\\f\\u0001\\u001f\x7f\","
                    "\"a\\u0000b\",\"\xef\xbf\xbf\xf4\x8f\xbf\xbf\",\"\"]");
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__roundtrip_long_escaped_string)
{
    /* Escapes everywhere force the buffer to grow past its first guess. */
    enum { N = 100000 };
    char *s = malloc(N), *want = malloc(2 * N + 3);
    struct mp m;

    for (size_t i = 0; i < N; i++)
        s[i] = (i % 3 == 0) ? '"' : 'x';
    size_t w = 0;
    want[w++] = '"';
    for (size_t i = 0; i < N; i++) {
        if (s[i] == '"')
            want[w++] = '\\';
        want[w++] = s[i];
    }
    want[w++] = '"';
    want[w] = '\0';
    mp_init(&m);
    pstrn(&m.pk, s, N);
    check_roundtrip(&m, NULL, want);
    mp_fini(&m);
    free(s);
    free(want);
}
END_TEST

START_TEST(test_transcode__roundtrip_integers)
{
    static const int64_t v[] = {
        0,
        1,
        -1,
        127,
        128,
        -32,
        -33,
        255,
        256,
        65535,
        65536,
        -32768,
        -32769,
        4294967295LL,
        4294967296LL,
        9007199254740993LL, /* 2^53 + 1: not a double */
        -9007199254740993LL,
        INT64_MIN,
        INT64_MAX,
    };
    struct mp m;

    mp_init(&m);
    msgpack_pack_array(&m.pk, sizeof(v) / sizeof(v[0]) + 2);
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        msgpack_pack_int64(&m.pk, v[i]);
    /* Unsigned values up to INT64_MAX come back identical too. */
    msgpack_pack_uint64(&m.pk, (uint64_t)INT64_MAX);
    msgpack_pack_uint64(&m.pk, 9007199254740993ULL);
    check_roundtrip(&m, NULL,
                    "[0,1,-1,127,128,-32,-33,255,256,65535,65536,-32768,-32769,"
                    "4294967295,4294967296,9007199254740993,-9007199254740993,"
                    "-9223372036854775808,9223372036854775807,"
                    "9223372036854775807,9007199254740993]");
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__uint64_above_int64_is_printed_exactly)
{
    struct mp m;
    struct strbuf out;
    char err[ERRLEN];

    mp_init(&m);
    msgpack_pack_array(&m.pk, 2);
    msgpack_pack_uint64(&m.pk, UINT64_MAX);
    msgpack_pack_uint64(&m.pk, (uint64_t)INT64_MAX + 1);
    strbuf_init(&out);
    ck_assert_int_eq(m2j(m.sb.data, m.sb.size, NULL, &out, err), 0);
    ck_assert_str_eq(out.data, "[18446744073709551615,9223372036854775808]");
    /* The way back is limited to int64 (jansson): rejected, not rounded. */
    check_j2m_fails(out.data, out.len,
                    "number out of range in JSON at line 1, column 21: too big integer", "int64");
    strbuf_fini(&out);
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__roundtrip_floats)
{
    static const double v[] = { 0.1,
                                1e300,
                                -0.0,
                                0.0,
                                1.0,
                                0.5,
                                100.0,
                                1.0 / 3,
                                1e-7,
                                1e21,
                                -2.5,
                                123456.789,
                                9007199254740992.0,
                                0.7 };
    struct mp m;

    mp_init(&m);
    msgpack_pack_array(&m.pk, sizeof(v) / sizeof(v[0]));
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        msgpack_pack_double(&m.pk, v[i]);
    check_roundtrip(&m, NULL,
                    "[0.1,1e+300,-0.0,0.0,1.0,0.5,100.0,0.3333333333333333,1e-07,1e+21,"
                    "-2.5,123456.789,9007199254740992.0,0.7]");
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__floats_roundtrip_bit_exact)
{
    /* Values that need 16 or 17 digits, subnormals and the extremes: the
     * exact text is glibc's business, the bits coming back are ours. */
    static const double v[] = { DBL_MAX,
                                -DBL_MAX,
                                DBL_MIN,
                                5e-324,
                                2.2250738585072009e-308,
                                0.30000000000000004,
                                1.0 + DBL_EPSILON,
                                3.141592653589793,
                                2.718281828459045,
                                1e23,
                                5e-300,
                                123456789012345680.0 };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        struct mp m;
        struct strbuf out;
        char err[ERRLEN];

        mp_init(&m);
        msgpack_pack_double(&m.pk, v[i]);
        strbuf_init(&out);
        ck_assert_int_eq(m2j(m.sb.data, m.sb.size, NULL, &out, err), 0);
        ck_assert_msg(strchr(out.data, '.') || strchr(out.data, 'e'), "%s", out.data);
        ck_assert_uint_le(out.len, 24);
        struct mp back;
        mp_init(&back);
        ck_assert_int_eq(transcode_json_to_msgpack(out.data, out.len, &back.pk, NULL, err, ERRLEN),
                         0);
        ck_assert_uint_eq(back.sb.size, m.sb.size);
        ck_assert_msg(memcmp(back.sb.data, m.sb.data, m.sb.size) == 0, "%.17g -> %s", v[i],
                      out.data);
        mp_fini(&back);
        mp_fini(&m);
        strbuf_fini(&out);
    }
}
END_TEST

/* Deterministic pseudo-random numbers (xorshift64*). */
static uint64_t rnd(uint64_t *st)
{
    *st ^= *st >> 12;
    *st ^= *st << 25;
    *st ^= *st >> 27;
    return *st * 0x2545F4914F6CDD1DULL;
}

START_TEST(test_transcode__floats_random_roundtrip)
{
    /* Short decimals (the fast path), their neighbours, and random bit
     * patterns (the snprintf path) all parse back to the same bits. */
    uint64_t st = 0x9E3779B97F4A7C15ULL;
    struct strbuf out;
    char err[ERRLEN];

    strbuf_init(&out);
    for (int i = 0; i < 30000; i++) {
        uint64_t r = rnd(&st);
        double d;
        switch (i % 3) {
        case 0:
            d = (double)(int64_t)(r % 2000000001ULL - 1000000000) /
                pow(10, (double)((r >> 60) % 8));
            break;
        case 1:
            d = nextafter((double)(r % 100000) / 1000.0, (r >> 63) ? INFINITY : -INFINITY);
            break;
        default:
            memcpy(&d, &r, sizeof(d));
            if (!isfinite(d))
                d = (double)r;
            break;
        }
        msgpack_object o = { .type = MSGPACK_OBJECT_FLOAT64, .via.f64 = d };
        strbuf_reset(&out);
        ck_assert_int_eq(transcode_msgpack_to_json(&o, &out, NULL, "v", err, sizeof(err)), 0);
        ck_assert_msg(strchr(out.data, '.') || strchr(out.data, 'e'), "%s", out.data);
        ck_assert_uint_le(out.len, 24);
        double back = strtod(out.data, NULL);
        ck_assert_msg(memcmp(&back, &d, sizeof(d)) == 0, "%.17g printed as %s", d, out.data);
    }
    strbuf_fini(&out);
}
END_TEST

/* Reference escaper for the string writer's word-at-a-time scan. */
static size_t ref_escape(const char *s, size_t n, char *w)
{
    size_t k = 0;

    w[k++] = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"':
            k += (size_t)sprintf(w + k, "\\\"");
            break;
        case '\\':
            k += (size_t)sprintf(w + k, "\\\\");
            break;
        case '\n':
            k += (size_t)sprintf(w + k, "\\n");
            break;
        case '\r':
            k += (size_t)sprintf(w + k, "\\r");
            break;
        case '\t':
            k += (size_t)sprintf(w + k, "\\t");
            break;
        case '\b':
            k += (size_t)sprintf(w + k, "\\b");
            break;
        case '\f':
            k += (size_t)sprintf(w + k, "\\f");
            break;
        default:
            if (c < 0x20)
                k += (size_t)sprintf(w + k, "\\u%04x", c);
            else
                w[k++] = (char)c;
        }
    }
    w[k++] = '"';
    w[k] = '\0';
    return k;
}

START_TEST(test_transcode__string_special_byte_at_every_offset)
{
    static const char *const specials[] = { "\x00",     "\x01",         "\x1f",
                                            "\n",       "\"",           "\\",
                                            "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80" };
    struct strbuf out;
    char err[ERRLEN];

    strbuf_init(&out);
    for (size_t si = 0; si < sizeof(specials) / sizeof(specials[0]); si++) {
        size_t sl = si < 1 ? 1 : strlen(specials[si]);
        for (size_t pos = 0; pos + sl <= 27; pos++) {
            char s[27], want[200];
            memset(s, 'a', sizeof(s));
            memcpy(s + pos, specials[si], sl);
            ref_escape(s, sizeof(s), want);
            msgpack_object o = { .type = MSGPACK_OBJECT_STR };
            o.via.str.ptr = s;
            o.via.str.size = sizeof(s);
            strbuf_reset(&out);
            ck_assert_int_eq(transcode_msgpack_to_json(&o, &out, NULL, "v", err, sizeof(err)), 0);
            ck_assert_str_eq(out.data, want);
            /* The same byte cut short must be caught at every offset too. */
            if (sl > 1) {
                o.via.str.size = (uint32_t)(pos + sl - 1);
                strbuf_reset(&out);
                ck_assert_int_eq(transcode_msgpack_to_json(&o, &out, NULL, "v", err, sizeof(err)),
                                 TRANSCODE_EINVALID);
            }
        }
    }
    strbuf_fini(&out);
}
END_TEST

START_TEST(test_transcode__float32_prints_shortest_for_float)
{
    struct mp m;
    msgpack_unpacked u;
    char err[ERRLEN];

    mp_init(&m);
    msgpack_pack_array(&m.pk, 5);
    msgpack_pack_float(&m.pk, 0.1f);
    msgpack_pack_float(&m.pk, 1.0f);
    msgpack_pack_float(&m.pk, 0.3f);
    msgpack_pack_float(&m.pk, FLT_MAX);
    msgpack_pack_float(&m.pk, 16777216.0f);
    check_m2j(&m, NULL, "[0.1,1.0,0.3,3.4028235e+38,16777216.0]");
    mp_fini(&m);

    /* ... and comes back as the float64 the digits mean. */
    mp_init(&m);
    ck_assert_int_eq(transcode_json_to_msgpack("[0.1]", 5, &m.pk, NULL, err, ERRLEN), 0);
    msgpack_unpacked_init(&u);
    ck_assert_int_eq(msgpack_unpack_next(&u, m.sb.data, m.sb.size, NULL), MSGPACK_UNPACK_SUCCESS);
    ck_assert_int_eq(u.data.via.array.ptr[0].type, MSGPACK_OBJECT_FLOAT64);
    ck_assert(u.data.via.array.ptr[0].via.f64 == 0.1);
    msgpack_unpacked_destroy(&u);
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__scalars_at_top_level)
{
    struct mp m;

    mp_init(&m);
    msgpack_pack_true(&m.pk);
    check_roundtrip(&m, NULL, "true");
    mp_fini(&m);
    mp_init(&m);
    msgpack_pack_false(&m.pk);
    check_roundtrip(&m, NULL, "false");
    mp_fini(&m);
    mp_init(&m);
    msgpack_pack_nil(&m.pk);
    check_roundtrip(&m, NULL, "null");
    mp_fini(&m);
    mp_init(&m);
    msgpack_pack_map(&m.pk, 0);
    check_roundtrip(&m, NULL, "{}");
    mp_fini(&m);
    mp_init(&m);
    msgpack_pack_array(&m.pk, 0);
    check_roundtrip(&m, NULL, "[]");
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__appends_to_existing_content)
{
    struct mp m;
    struct strbuf out;
    char err[ERRLEN];

    mp_init(&m);
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_int64(&m.pk, 7);
    strbuf_init(&out);
    ck_assert_int_eq(strbuf_reserve(&out, 3), 0);
    memcpy(out.data, "ab:", 3);
    out.len = 3;
    ck_assert_int_eq(m2j(m.sb.data, m.sb.size, NULL, &out, err), 0);
    ck_assert_str_eq(out.data, "ab:[7]");
    strbuf_reset(&out);
    ck_assert_int_eq(m2j(m.sb.data, m.sb.size, NULL, &out, err), 0);
    ck_assert_str_eq(out.data, "[7]");
    strbuf_fini(&out);
    mp_fini(&m);
}
END_TEST

/* ---- overrides ------------------------------------------------------------ */

START_TEST(test_transcode__override_model_replaces_in_place)
{
    struct transcode_override ov = { .model = "gpt-4o-mini" };
    struct mp m;

    mp_init(&m);
    msgpack_pack_map(&m.pk, 3);
    pstr(&m.pk, "a");
    msgpack_pack_int64(&m.pk, 1);
    pstr(&m.pk, "model");
    pstr(&m.pk, "client-choice");
    pstr(&m.pk, "b");
    msgpack_pack_int64(&m.pk, 2);
    check_m2j(&m, &ov, "{\"a\":1,\"model\":\"gpt-4o-mini\",\"b\":2}");
    check_m2j(&m, NULL, "{\"a\":1,\"model\":\"client-choice\",\"b\":2}");
    mp_fini(&m);

    /* A non-string model value is replaced all the same. */
    mp_init(&m);
    msgpack_pack_map(&m.pk, 1);
    pstr(&m.pk, "model");
    msgpack_pack_array(&m.pk, 0);
    check_m2j(&m, &ov, "{\"model\":\"gpt-4o-mini\"}");
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__override_model_added_when_absent)
{
    struct transcode_override ov = { .model = "m1" };
    struct mp m;

    mp_init(&m);
    msgpack_pack_map(&m.pk, 1);
    pstr(&m.pk, "a");
    msgpack_pack_int64(&m.pk, 1);
    check_m2j(&m, &ov, "{\"a\":1,\"model\":\"m1\"}");
    mp_fini(&m);
    mp_init(&m);
    msgpack_pack_map(&m.pk, 0);
    check_m2j(&m, &ov, "{\"model\":\"m1\"}");
    ov.stream = TRANSCODE_STREAM_TRUE;
    check_m2j(&m, &ov, "{\"model\":\"m1\",\"stream\":true}");
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__override_model_duplicates_and_nested)
{
    /* Every top-level "model" is replaced (an upstream might keep the last
     * duplicate); nested "model"/"stream" keys are the body's business. */
    struct transcode_override ov = { .model = "M", .stream = TRANSCODE_STREAM_FALSE };
    struct mp m;

    mp_init(&m);
    msgpack_pack_map(&m.pk, 3);
    pstr(&m.pk, "model");
    pstr(&m.pk, "a");
    pstr(&m.pk, "messages");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_map(&m.pk, 2);
    pstr(&m.pk, "model");
    pstr(&m.pk, "inner");
    pstr(&m.pk, "stream");
    msgpack_pack_true(&m.pk);
    pstr(&m.pk, "model");
    pstr(&m.pk, "b");
    check_m2j(&m, &ov,
              "{\"model\":\"M\",\"messages\":[{\"model\":\"inner\",\"stream\":true}],"
              "\"model\":\"M\",\"stream\":false}");
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__override_stream)
{
    struct transcode_override ov = { .stream = TRANSCODE_STREAM_FALSE };
    struct mp m;

    mp_init(&m);
    msgpack_pack_map(&m.pk, 2);
    pstr(&m.pk, "stream");
    msgpack_pack_true(&m.pk);
    pstr(&m.pk, "x");
    msgpack_pack_int64(&m.pk, 1);
    check_m2j(&m, &ov, "{\"stream\":false,\"x\":1}");
    ov.stream = TRANSCODE_STREAM_TRUE;
    check_m2j(&m, &ov, "{\"stream\":true,\"x\":1}");
    ov.stream = TRANSCODE_STREAM_KEEP; /* also what a zeroed struct means */
    check_m2j(&m, &ov, "{\"stream\":true,\"x\":1}");
    mp_fini(&m);

    mp_init(&m);
    msgpack_pack_map(&m.pk, 1);
    pstr(&m.pk, "x");
    msgpack_pack_int64(&m.pk, 1);
    ov.stream = TRANSCODE_STREAM_TRUE;
    check_m2j(&m, &ov, "{\"x\":1,\"stream\":true}");
    mp_fini(&m);

    mp_init(&m);
    msgpack_pack_map(&m.pk, 0);
    ov.stream = TRANSCODE_STREAM_FALSE;
    check_m2j(&m, &ov, "{\"stream\":false}");
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__override_model_is_escaped_and_validated)
{
    struct transcode_override ov = { .model = "a\"b\xc3\xa9" };
    struct mp m;

    mp_init(&m);
    msgpack_pack_map(&m.pk, 0);
    check_m2j(&m, &ov, "{\"model\":\"a\\\"b\xc3\xa9\"}");
    ov.model = "bad\xff";
    check_m2j_fails(&m, &ov, "body.model: string is not valid UTF-8 (byte 3 of 4)");
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__override_ignored_when_not_a_map)
{
    struct transcode_override ov = { .model = "m", .stream = TRANSCODE_STREAM_TRUE };
    struct mp m;

    mp_init(&m);
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_map(&m.pk, 0);
    check_m2j(&m, &ov, "[{}]");
    mp_fini(&m);
}
END_TEST

/* ---- msgpack -> JSON rejections ------------------------------------------- */

START_TEST(test_transcode__reject_bin)
{
    struct mp m;

    mp_init(&m);
    msgpack_pack_map(&m.pk, 1);
    pstr(&m.pk, "messages");
    msgpack_pack_array(&m.pk, 3);
    for (int i = 0; i < 3; i++) {
        msgpack_pack_map(&m.pk, 2);
        pstr(&m.pk, "role");
        pstr(&m.pk, "user");
        pstr(&m.pk, "content");
        if (i < 2) {
            pstr(&m.pk, "text");
        } else {
            msgpack_pack_bin(&m.pk, 3);
            msgpack_pack_bin_body(&m.pk, "\x00\x01\x02", 3);
        }
    }
    check_m2j_fails(&m, NULL, "body.messages[2].content: binary data cannot be sent as JSON");
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__reject_ext)
{
    struct mp m;

    mp_init(&m);
    msgpack_pack_map(&m.pk, 1);
    pstr(&m.pk, "x");
    msgpack_pack_array(&m.pk, 2);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_ext(&m.pk, 2, 5);
    msgpack_pack_ext_body(&m.pk, "ab", 2);
    check_m2j_fails(&m, NULL, "body.x[1]: msgpack ext type 5 cannot be sent as JSON");
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__reject_nan_and_infinity)
{
    static const struct {
        double v;
        int f32;
        const char *err;
    } cases[] = {
        { NAN, 0, "body.temperature: NaN cannot be sent as JSON" },
        { INFINITY, 0, "body.temperature: Infinity cannot be sent as JSON" },
        { -INFINITY, 0, "body.temperature: -Infinity cannot be sent as JSON" },
        { NAN, 1, "body.temperature: NaN cannot be sent as JSON" },
        { -INFINITY, 1, "body.temperature: -Infinity cannot be sent as JSON" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct mp m;

        mp_init(&m);
        msgpack_pack_map(&m.pk, 1);
        pstr(&m.pk, "temperature");
        if (cases[i].f32)
            msgpack_pack_float(&m.pk, (float)cases[i].v);
        else
            msgpack_pack_double(&m.pk, cases[i].v);
        check_m2j_fails(&m, NULL, cases[i].err);
        mp_fini(&m);
    }
}
END_TEST

START_TEST(test_transcode__reject_non_string_keys)
{
    struct mp m;

    mp_init(&m);
    msgpack_pack_map(&m.pk, 1);
    pstr(&m.pk, "metadata");
    msgpack_pack_map(&m.pk, 2);
    pstr(&m.pk, "ok");
    msgpack_pack_int64(&m.pk, 1);
    msgpack_pack_int64(&m.pk, 7);
    pstr(&m.pk, "a");
    check_m2j_fails(&m, NULL,
                    "body.metadata: map key #1 is an integer; JSON object keys must be strings");
    mp_fini(&m);

    mp_init(&m);
    msgpack_pack_map(&m.pk, 1);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_nil(&m.pk);
    check_m2j_fails(&m, NULL, "body: map key #0 is nil; JSON object keys must be strings");
    mp_fini(&m);

    mp_init(&m);
    msgpack_pack_map(&m.pk, 1);
    msgpack_pack_bin(&m.pk, 1);
    msgpack_pack_bin_body(&m.pk, "k", 1);
    msgpack_pack_nil(&m.pk);
    check_m2j_fails(&m, NULL, "body: map key #0 is binary data; JSON object keys must be strings");
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__reject_invalid_utf8)
{
    static const char *const bad[] = {
        "\x80", /* stray continuation */
        "\xbf",
        "\xc0\x80",     /* overlong NUL */
        "\xc1\xbf",     /* overlong */
        "\xe0\x80\x80", /* overlong 3-byte */
        "\xe0\x9f\xbf",
        "\xed\xa0\x80",     /* surrogate U+D800 */
        "\xed\xbf\xbf",     /* surrogate U+DFFF */
        "\xf0\x80\x80\x80", /* overlong 4-byte */
        "\xf0\x8f\xbf\xbf",
        "\xf4\x90\x80\x80", /* U+110000 */
        "\xf5\x80\x80\x80",
        "\xff",
        "\xe2\x82",     /* truncated */
        "\xf0\x9f\x98", /* truncated emoji */
        "\xe2\x28\xa1", /* bad continuation */
        "\xc3",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct mp m;
        char want[128];

        mp_init(&m);
        msgpack_pack_map(&m.pk, 1);
        pstr(&m.pk, "content");
        msgpack_pack_str(&m.pk, strlen(bad[i]) + 2);
        msgpack_pack_str_body(&m.pk, "ok", 2);
        msgpack_pack_str_body(&m.pk, bad[i], strlen(bad[i]));
        snprintf(want, sizeof(want), "body.content: string is not valid UTF-8 (byte 2 of %zu)",
                 strlen(bad[i]) + 2);
        check_m2j_fails(&m, NULL, want);
        mp_fini(&m);
    }
}
END_TEST

START_TEST(test_transcode__accepts_utf8_boundaries)
{
    static const char *const good[] = {
        "\xc2\x80",         /* U+0080 */
        "\xdf\xbf",         /* U+07FF */
        "\xe0\xa0\x80",     /* U+0800 */
        "\xed\x9f\xbf",     /* U+D7FF */
        "\xee\x80\x80",     /* U+E000 */
        "\xef\xbf\xbf",     /* U+FFFF */
        "\xf0\x90\x80\x80", /* U+10000 */
        "\xf4\x8f\xbf\xbf", /* U+10FFFF */
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        struct mp m;
        char want[32];

        mp_init(&m);
        pstr(&m.pk, good[i]);
        snprintf(want, sizeof(want), "\"%s\"", good[i]);
        check_roundtrip(&m, NULL, want);
        mp_fini(&m);
    }
}
END_TEST

START_TEST(test_transcode__reject_invalid_utf8_key)
{
    struct mp m;

    mp_init(&m);
    msgpack_pack_map(&m.pk, 1);
    pstr(&m.pk, "ok");
    msgpack_pack_map(&m.pk, 1);
    pstr(&m.pk, "k\xff");
    msgpack_pack_int64(&m.pk, 1);
    check_m2j_fails(&m, NULL, "body.ok: map key #0 is not valid UTF-8 (byte 1 of 2)");
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__error_path_quotes_odd_keys)
{
    struct mp m;

    mp_init(&m);
    msgpack_pack_map(&m.pk, 1);
    pstr(&m.pk, "a b");
    msgpack_pack_map(&m.pk, 1);
    pstr(&m.pk, "x\"y\\");
    msgpack_pack_map(&m.pk, 1);
    pstr(&m.pk, "\xe6\x97\xa5\n");
    msgpack_pack_map(&m.pk, 1);
    pstr(&m.pk, "1x");
    msgpack_pack_map(&m.pk, 1);
    pstr(&m.pk, "");
    msgpack_pack_bin(&m.pk, 0);
    check_m2j_fails(&m, NULL,
                    "body[\"a b\"][\"x\\\"y\\\\\"][\"\xe6\x97\xa5\\x0a\"][\"1x\"][\"\"]: "
                    "binary data cannot be sent as JSON");
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__error_message_truncation_and_null_err)
{
    struct mp m;
    struct strbuf out;
    char err[ERRLEN];
    msgpack_unpacked u;

    mp_init(&m);
    msgpack_pack_map(&m.pk, 1);
    pstr(&m.pk, "\xe6\x97\xa5\xe6\x97\xa5");
    msgpack_pack_bin(&m.pk, 0);
    msgpack_unpacked_init(&u);
    ck_assert_int_eq(msgpack_unpack_next(&u, m.sb.data, m.sb.size, NULL), MSGPACK_UNPACK_SUCCESS);
    strbuf_init(&out);
    /* "body[\"" is 6 bytes; 日 is 3: errlen 10 leaves room for 6+3 bytes
     * only, 12 for 6+3 and a 2-byte cut of the second 日, which must go. */
    for (size_t errlen = 1; errlen < 40; errlen++) {
        memset(err, 'Z', sizeof(err));
        ck_assert_int_eq(transcode_msgpack_to_json(&u.data, &out, NULL, "body", err, errlen),
                         TRANSCODE_EINVALID);
        ck_assert_uint_lt(strlen(err), errlen);
        json_t *s = json_stringn(err, strlen(err)); /* NULL when not valid UTF-8 */
        ck_assert_ptr_nonnull(s);
        json_decref(s);
    }
    ck_assert_int_eq(transcode_msgpack_to_json(&u.data, &out, NULL, "body", err, 12),
                     TRANSCODE_EINVALID);
    ck_assert_str_eq(err, "body[\"\xe6\x97\xa5");
    ck_assert_int_eq(transcode_msgpack_to_json(&u.data, &out, NULL, NULL, NULL, 0),
                     TRANSCODE_EINVALID);
    ck_assert_int_eq(transcode_msgpack_to_json(&u.data, &out, NULL, NULL, err, sizeof(err)),
                     TRANSCODE_EINVALID);
    ck_assert_str_eq(err,
                     "value[\"\xe6\x97\xa5\xe6\x97\xa5\"]: binary data cannot be sent as JSON");
    ck_assert_uint_eq(out.len, 0);
    strbuf_fini(&out);
    msgpack_unpacked_destroy(&u);
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__failure_restores_buffer)
{
    struct mp m;
    struct strbuf out;
    char err[ERRLEN];

    mp_init(&m);
    msgpack_pack_array(&m.pk, 3);
    pstr(&m.pk, "a long enough string to have been written before the failure");
    msgpack_pack_int64(&m.pk, 1);
    msgpack_pack_double(&m.pk, NAN);
    strbuf_init(&out);
    ck_assert_int_eq(strbuf_reserve(&out, 6), 0);
    memcpy(out.data, "prefix", 6);
    out.len = 6;
    ck_assert_int_eq(m2j(m.sb.data, m.sb.size, NULL, &out, err), TRANSCODE_EINVALID);
    ck_assert_str_eq(err, "body[2]: NaN cannot be sent as JSON");
    ck_assert_uint_eq(out.len, 6);
    ck_assert_str_eq(out.data, "prefix");
    strbuf_fini(&out);
    mp_fini(&m);
}
END_TEST

/* Builds `levels` nested containers by hand (msgpack-c's unpacker stops at
 * 32 levels, so these trees cannot come from bytes). */
static msgpack_object *nested(unsigned levels, int maps)
{
    msgpack_object *o = calloc(levels + 1, sizeof(*o));
    msgpack_object_kv *kv = maps ? calloc(levels, sizeof(*kv)) : NULL;

    for (unsigned i = 0; i < levels; i++) {
        if (maps) {
            o[i].type = MSGPACK_OBJECT_MAP;
            o[i].via.map.size = 1;
            o[i].via.map.ptr = &kv[i];
            kv[i].key.type = MSGPACK_OBJECT_STR;
            kv[i].key.via.str.ptr = "a";
            kv[i].key.via.str.size = 1;
        } else {
            o[i].type = MSGPACK_OBJECT_ARRAY;
            o[i].via.array.size = 1;
            o[i].via.array.ptr = &o[i + 1];
        }
    }
    o[levels].type = MSGPACK_OBJECT_NIL;
    /* A kv holds its value by copy: link from the innermost outwards. */
    if (maps)
        for (unsigned i = levels; i-- > 0;)
            kv[i].val = o[i + 1];
    return o;
}

static void free_nested(msgpack_object *o, int maps)
{
    if (maps)
        free(o[0].via.map.ptr);
    free(o);
}

START_TEST(test_transcode__depth_limit_msgpack)
{
    for (int maps = 0; maps <= 1; maps++) {
        struct strbuf out;
        char err[ERRLEN], want[ERRLEN];
        msgpack_object *ok = nested(TRANSCODE_MAX_DEPTH, maps);
        msgpack_object *deep = nested(TRANSCODE_MAX_DEPTH + 1, maps);

        strbuf_init(&out);
        ck_assert_int_eq(transcode_msgpack_to_json(ok, &out, NULL, "body", err, sizeof(err)), 0);
        ck_assert_uint_eq(out.len, maps ? 64 * 6 + 4 : 64 * 2 + 4);
        ck_assert_int_eq(transcode_msgpack_to_json(deep, &out, NULL, "body", err, sizeof(err)),
                         TRANSCODE_EINVALID);
        ck_assert_uint_eq(out.len, maps ? 64 * 6 + 4 : 64 * 2 + 4);
        strcpy(want, "body");
        for (int i = 0; i < TRANSCODE_MAX_DEPTH; i++)
            strcat(want, maps ? ".a" : "[0]");
        strcat(want, ": nested deeper than 64 levels");
        ck_assert_str_eq(err, want);
        strbuf_fini(&out);
        free_nested(ok, maps);
        free_nested(deep, maps);
    }
}
END_TEST

/* ---- JSON -> msgpack ------------------------------------------------------ */

START_TEST(test_transcode__json_reply_roundtrip)
{
    static const char reply[] =
        "{\"id\":\"chatcmpl-123\",\"object\":\"chat.completion\",\"created\":1700000000,"
        "\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
        "\"assistant\",\"content\":\"Hello! \\u00e9\\ud83d\\ude00 \\\"q\\\"\\n\\/\","
        "\"tool_calls\":null},\"logprobs\":null,\"finish_reason\":\"stop\"}],"
        "\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21,"
        "\"cost\":0.000123,\"x\":-1.5E3},\"system_fingerprint\":\"fp_44709d6fcb\"}";
    static const char canonical[] =
        "{\"id\":\"chatcmpl-123\",\"object\":\"chat.completion\",\"created\":1700000000,"
        "\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
        "\"assistant\",\"content\":\"Hello! \xc3\xa9\xf0\x9f\x98\x80 \\\"q\\\"\\n/\","
        "\"tool_calls\":null},\"logprobs\":null,\"finish_reason\":\"stop\"}],"
        "\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21,"
        "\"cost\":0.000123,\"x\":-1500.0},\"system_fingerprint\":\"fp_44709d6fcb\"}";
    struct mp m;
    char err[ERRLEN];

    mp_init(&m);
    ck_assert_int_eq(transcode_json_to_msgpack(reply, strlen(reply), &m.pk, NULL, err, ERRLEN), 0);
    check_roundtrip(&m, NULL, canonical);
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__json_key_order_and_duplicates)
{
    check_j2m("{\"z\":1,\"a\":2,\"m\":3}",
              "\x83\xa1z\x01\xa1"
              "a\x02\xa1m\x03",
              10);
    /* Duplicates: last value, first position (documented jansson behaviour). */
    check_j2m("{\"a\":1,\"b\":2,\"a\":3}",
              "\x82\xa1"
              "a\x03\xa1"
              "b\x02",
              7);
}
END_TEST

START_TEST(test_transcode__json_scalars_and_numbers)
{
    check_j2m("42", "\x2a", 1);
    check_j2m(" \n\t7 \r\n", "\x07", 1);
    check_j2m("\"s\"", "\xa1s", 2);
    check_j2m("null", "\xc0", 1);
    check_j2m("true", "\xc3", 1);
    check_j2m("false", "\xc2", 1);
    check_j2m("1", "\x01", 1);
    check_j2m("-1", "\xff", 1);
    check_j2m("1.0", "\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00", 9);
    check_j2m("1e2", "\xcb\x40\x59\x00\x00\x00\x00\x00\x00", 9);
    check_j2m("-0.0", "\xcb\x80\x00\x00\x00\x00\x00\x00\x00", 9);
    check_j2m("9223372036854775807", "\xcf\x7f\xff\xff\xff\xff\xff\xff\xff", 9);
    check_j2m("-9223372036854775808", "\xd3\x80\x00\x00\x00\x00\x00\x00\x00", 9);
    check_j2m("\"a\\u0000b\"",
              "\xa3"
              "a\0b",
              4);
    check_j2m("\"\\ud83d\\ude00\"", "\xa4\xf0\x9f\x98\x80", 5);
}
END_TEST

START_TEST(test_transcode__json_not_nul_terminated)
{
    struct mp m;
    char err[ERRLEN];

    mp_init(&m);
    ck_assert_int_eq(transcode_json_to_msgpack("[1,2]garbage", 5, &m.pk, NULL, err, ERRLEN), 0);
    ck_assert_uint_eq(m.sb.size, 3);
    ck_assert_mem_eq(m.sb.data, "\x92\x01\x02", 3);
    mp_fini(&m);
}
END_TEST

START_TEST(test_transcode__json_big_numbers_rejected)
{
    static const char *const big[] = { "18446744073709551615", "-9223372036854775809",
                                       "{\"seed\":9223372036854775808}",
                                       "123456789012345678901234567890" };
    for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++)
        check_j2m_fails(big[i], strlen(big[i]), "number out of range in JSON at line 1, column ",
                        "(integers must fit in int64, numbers in a double)");
    check_j2m_fails("[1e400]", 7,
                    "number out of range in JSON at line 1, column 6: ", "real number overflow");
}
END_TEST

START_TEST(test_transcode__json_invalid_input)
{
    static const char html[] =
        "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n"
        "<body><center><h1>502 Bad Gateway</h1></center><hr><center>nginx</center>"
        "<p>Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor "
        "incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud "
        "exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat.</p></body></html>";
    struct mp m;
    char err[ERRLEN];

    check_j2m_fails("{\"a\":1", 6, "invalid JSON at line 1, column 6: ", "expected");
    check_j2m_fails("{\"a\":1} x", 9,
                    "invalid JSON at line 1, column 9: ", "end of file expected near 'x'");
    check_j2m_fails(html, strlen(html), "invalid JSON at line 1, column 1: ", "near '<'");
    check_j2m_fails("", 0, "invalid JSON at line 1, column 0: ", NULL);
    check_j2m_fails("[DONE]", 6, "invalid JSON at line 1, column 5: ", "DONE");
    check_j2m_fails("{'a': 1}", 8, "invalid JSON at line 1, column ", NULL);
    check_j2m_fails("NaN", 3, "invalid JSON at line 1, column ", NULL);
    check_j2m_fails("{\"x\":\n tru}", 11, "invalid JSON at line 2, column ", "tru");
    check_j2m_fails("\"\xff\xfe\"", 4, "invalid JSON at line 1, column ", NULL);
    check_j2m_fails("\"a\x01\"", 4, "invalid JSON at line 1, column ", "control character");
    check_j2m_fails("\"\\ud800\"", 8, "invalid JSON at line 1, column ", NULL);
    check_j2m_fails("{\"a\\u0000b\":1}", 14, "invalid JSON at line 1, column ", "NUL byte");
    /* A tiny err buffer, and none at all. */
    mp_init(&m);
    ck_assert_int_eq(transcode_json_to_msgpack("x", 1, &m.pk, NULL, err, 8), TRANSCODE_EINVALID);
    ck_assert_str_eq(err, "invalid");
    ck_assert_int_eq(transcode_json_to_msgpack("x", 1, &m.pk, NULL, NULL, 0), TRANSCODE_EINVALID);
    mp_fini(&m);
}
END_TEST

static char *nested_json(unsigned levels)
{
    char *s = malloc(2 * levels + 1);

    memset(s, '[', levels);
    memset(s + levels, ']', levels);
    s[2 * levels] = '\0';
    return s;
}

START_TEST(test_transcode__depth_limit_json)
{
    char *ok = nested_json(TRANSCODE_MAX_DEPTH);
    char *deep = nested_json(TRANSCODE_MAX_DEPTH + 1);
    char *very = nested_json(5000); /* past jansson's own limit (2048) */
    char want[TRANSCODE_MAX_DEPTH];
    struct mp m;
    char err[ERRLEN];

    memset(want, 0x91, sizeof(want) - 1);
    want[sizeof(want) - 1] = (char)0x90;
    check_j2m(ok, want, sizeof(want));
    mp_init(&m);
    ck_assert_int_eq(transcode_json_to_msgpack(deep, strlen(deep), &m.pk, NULL, err, ERRLEN),
                     TRANSCODE_ETOO_DEEP);
    ck_assert_str_eq(err, "JSON nested deeper than 64 levels");
    mp_fini(&m);
    check_j2m_fails(very, strlen(very), "invalid JSON at line 1, column ", "depth");
    free(ok);
    free(deep);
    free(very);
}
END_TEST

static int failing_write(void *data, const char *buf, size_t len)
{
    size_t *left = data;

    (void)buf;
    if (len > *left)
        return -1;
    *left -= len;
    return 0;
}

START_TEST(test_transcode__json_packer_failure)
{
    static const char json[] = "{\"a\":[1,2,3],\"b\":\"hello\",\"c\":{\"d\":1.5}}";
    char err[ERRLEN];

    /* Fail at every byte budget short of the full 29-byte output. */
    for (size_t budget = 0; budget < 29; budget++) {
        msgpack_packer pk;
        size_t left = budget;

        msgpack_packer_init(&pk, &left, failing_write);
        ck_assert_int_eq(transcode_json_to_msgpack(json, strlen(json), &pk, NULL, err, ERRLEN),
                         TRANSCODE_ENOMEM);
        ck_assert_str_eq(err, "out of memory (msgpack write failed)");
    }
    msgpack_packer pk;
    size_t left = 29;
    msgpack_packer_init(&pk, &left, failing_write);
    ck_assert_int_eq(transcode_json_to_msgpack(json, strlen(json), &pk, NULL, err, ERRLEN), 0);
    ck_assert_uint_eq(left, 0);
}
END_TEST

/* ---- UTF-8 repair, caller depth, string hook ---------------------------- */

START_TEST(test_transcode__utf8_repair)
{
    /* Expected outputs are what Python's bytes.decode("utf-8", "replace")
     * gives: one U+FFFD per maximal invalid subpart. */
    static const struct {
        const char *in;
        size_t len;
        const char *want;
        long bad;
    } cases[] = {
        { "plain ascii", 11, "plain ascii", 0 },
        { "", 0, "", 0 },
        { "a\0b", 3, "a\0b", 0 },
        { "\xf0\x9f\x98\x80 \xc3\xa9", 7, "\xf0\x9f\x98\x80 \xc3\xa9", 0 },
        { "\xff\xfe", 2, "\xef\xbf\xbd\xef\xbf\xbd", 2 },
        { "x\xffy", 3, "x\xef\xbf\xbdy", 1 },
        { "a\xe2\x82", 3, "a\xef\xbf\xbd", 1 }, /* cut short at the end */
        { "\xe2\x82"
          "A",
          3,
          "\xef\xbf\xbd"
          "A",
          1 },                                                            /* cut short by ASCII */
        { "\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 3 }, /* surrogate */
        { "\xc0\xaf", 2, "\xef\xbf\xbd\xef\xbf\xbd", 2 },                 /* overlong */
        { "\xf4\x90\x80\x80", 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 4 },
        { "\xf0\x9f\x98x", 4, "\xef\xbf\xbdx", 1 },
        { "\x80\x80", 2, "\xef\xbf\xbd\xef\xbf\xbd", 2 }, /* stray continuations */
    };
    struct strbuf out;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        /* Only the NUL case has a NUL inside: its length is its input's. */
        size_t wlen =
            memchr(cases[i].in, '\0', cases[i].len) ? cases[i].len : strlen(cases[i].want);
        strbuf_init(&out);
        ck_assert_int_eq(utf8_repair(cases[i].in, cases[i].len, &out), cases[i].bad);
        ck_assert_msg(out.len == wlen && memcmp(out.data, cases[i].want, wlen) == 0,
                      "case %zu: got %zu bytes", i, out.len);
        ck_assert_int_eq(out.data[out.len], '\0');
        /* Repairing repaired text changes nothing. */
        struct strbuf again;
        strbuf_init(&again);
        ck_assert_int_eq(utf8_repair(out.data, out.len, &again), 0);
        ck_assert_uint_eq(again.len, out.len);
        strbuf_fini(&again);
        strbuf_fini(&out);
    }
    /* Appends to what the buffer holds. */
    strbuf_init(&out);
    utf8_repair("ab", 2, &out);
    utf8_repair("\xff", 1, &out);
    ck_assert_str_eq(out.data, "ab\xef\xbf\xbd");
    strbuf_fini(&out);
}
END_TEST

START_TEST(test_transcode__utf8_cut)
{
    static const char s[] = "ab\xc3\xa9\xf0\x9f\x98\x80"; /* a b é 😀 */

    ck_assert_uint_eq(utf8_cut(s, 8, 100), 8);
    ck_assert_uint_eq(utf8_cut(s, 8, 8), 8);
    ck_assert_uint_eq(utf8_cut(s, 8, 7), 4);
    ck_assert_uint_eq(utf8_cut(s, 8, 5), 4);
    ck_assert_uint_eq(utf8_cut(s, 8, 4), 4);
    ck_assert_uint_eq(utf8_cut(s, 8, 3), 2);
    ck_assert_uint_eq(utf8_cut(s, 8, 0), 0);
}
END_TEST

static char *nested_objects(unsigned levels)
{
    char *s = malloc(6 * levels + 2);
    size_t n = 0;

    for (unsigned i = 0; i < levels; i++)
        n += (size_t)sprintf(s + n, "{\"a\":");
    s[n++] = '1';
    for (unsigned i = 0; i < levels; i++)
        s[n++] = '}';
    s[n] = '\0';
    return s;
}

START_TEST(test_transcode__depth_limit_from_caller)
{
    const struct transcode_j2m opt = { .max_depth = 30 };
    char err[ERRLEN];

    for (int maps = 0; maps <= 1; maps++) {
        char *ok = maps ? nested_objects(30) : nested_json(30);
        char *deep = maps ? nested_objects(31) : nested_json(31);
        struct mp m;
        msgpack_unpacked u;

        mp_init(&m);
        ck_assert_int_eq(transcode_json_to_msgpack(ok, strlen(ok), &m.pk, &opt, err, ERRLEN), 0);
        /* What was packed is readable by msgpack-c's 32-level unpacker
         * even inside two more containers. */
        msgpack_unpacked_init(&u);
        ck_assert_int_eq(msgpack_unpack_next(&u, m.sb.data, m.sb.size, NULL),
                         MSGPACK_UNPACK_SUCCESS);
        msgpack_unpacked_destroy(&u);
        mp_fini(&m);
        mp_init(&m);
        ck_assert_int_eq(transcode_json_to_msgpack(deep, strlen(deep), &m.pk, &opt, err, ERRLEN),
                         TRANSCODE_ETOO_DEEP);
        ck_assert_str_eq(err, "JSON nested deeper than 30 levels");
        mp_fini(&m);
        free(ok);
        free(deep);
    }
    /* 0, and anything above the transcoder's own bound, mean that bound. */
    char *j = nested_json(TRANSCODE_MAX_DEPTH + 1);
    const struct transcode_j2m zero = { 0 }, big = { .max_depth = 1000 };
    struct mp m;
    mp_init(&m);
    ck_assert_int_eq(transcode_json_to_msgpack(j, strlen(j), &m.pk, &zero, err, ERRLEN),
                     TRANSCODE_ETOO_DEEP);
    ck_assert_int_eq(transcode_json_to_msgpack(j, strlen(j), &m.pk, &big, err, ERRLEN),
                     TRANSCODE_ETOO_DEEP);
    mp_fini(&m);
    free(j);
}
END_TEST

/* Upper-cases every string; counts calls; fails on "boom". */
static int upper_hook(void *ud, const char **s, size_t *n)
{
    static char buf[64];
    int *calls = ud;

    (*calls)++;
    if (*n == 4 && memcmp(*s, "boom", 4) == 0)
        return TRANSCODE_ENOMEM;
    ck_assert_uint_lt(*n, sizeof(buf));
    for (size_t i = 0; i < *n; i++)
        buf[i] = (char)((*s)[i] >= 'a' && (*s)[i] <= 'z' ? (*s)[i] - 32 : (*s)[i]);
    *s = buf;
    return 0;
}

START_TEST(test_transcode__string_hook_sees_keys_and_values)
{
    static const char json[] = "{\"key\":[\"value\",1,{\"k2\":\"v\\u0032\"}]}";
    int calls = 0;
    const struct transcode_j2m opt = { .on_str = upper_hook, .ud = &calls };
    struct mp m, want;
    char err[ERRLEN];

    mp_init(&m);
    ck_assert_int_eq(transcode_json_to_msgpack(json, strlen(json), &m.pk, &opt, err, ERRLEN), 0);
    ck_assert_int_eq(calls, 4);
    mp_init(&want);
    msgpack_pack_map(&want.pk, 1);
    pstr(&want.pk, "KEY");
    msgpack_pack_array(&want.pk, 3);
    pstr(&want.pk, "VALUE");
    msgpack_pack_int(&want.pk, 1);
    msgpack_pack_map(&want.pk, 1);
    pstr(&want.pk, "K2");
    pstr(&want.pk, "V2"); /* the hook sees the decoded string */
    ck_assert_uint_eq(m.sb.size, want.sb.size);
    ck_assert_mem_eq(m.sb.data, want.sb.data, want.sb.size);
    mp_fini(&m);
    mp_fini(&want);

    mp_init(&m);
    ck_assert_int_eq(transcode_json_to_msgpack("[\"ok\",\"boom\"]", 13, &m.pk, &opt, err, ERRLEN),
                     TRANSCODE_ENOMEM);
    mp_fini(&m);
}
END_TEST

/* ---- the single-pass transcoder against jansson's tree ------------------- */

/* Both transcoders on the same text, with `opt`: the same code, the same
 * message, and on success the same bytes; the single pass writes nothing
 * on failure. Returns the code. */
static int check_same_as_jansson(const char *json, size_t len, const struct transcode_j2m *opt)
{
    struct mp a, b;
    char ea[ERRLEN], eb[ERRLEN];

    mp_init(&a);
    mp_init(&b);
    int ra = transcode_json_to_msgpack(json, len, &a.pk, opt, ea, ERRLEN);
    int rb = transcode_json_to_msgpack_jansson(json, len, &b.pk, opt, eb, ERRLEN);
    ck_assert_msg(ra == rb, "%.60s: rc %d, jansson %d (%s | %s)", json, ra, rb, ea, eb);
    if (ra == 0) {
        ck_assert_uint_eq(a.sb.size, b.sb.size);
        ck_assert_mem_eq(a.sb.data, b.sb.data, a.sb.size);
    } else {
        ck_assert_str_eq(ea, eb);
        ck_assert_uint_eq(a.sb.size, 0);
    }
    mp_fini(&a);
    mp_fini(&b);
    return ra;
}

/* The transcoder reads numbers as JSON does whatever LC_NUMERIC the
 * process is in (the comma locale is compiled as in the lib suite; without
 * localedef the test says so and checks the C locale only). */
START_TEST(test_transcode__json_reals_ignore_a_comma_locale)
{
    /* [1.5, -0.25]: fixarray 2, float64 1.5, float64 -0.25 */
    static const char want[] = "\x92\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00"
                               "\xcb\xbf\xd0\x00\x00\x00\x00\x00\x00";
    char dir[64];

    check_j2m("[1.5,-0.25]", want, sizeof(want) - 1);
    if (comma_locale_on("test_transcode__json_reals_ignore_a_comma_locale", dir, sizeof(dir)) == 0)
        check_j2m("[1.5,-0.25]", want, sizeof(want) - 1);
    comma_locale_off(dir);
}
END_TEST

START_TEST(test_transcode__json_single_pass_matches_jansson)
{
    static const struct {
        const char *json;
        size_t len; /* 0: strlen */
        int rc;
    } cases[] = {
        /* numbers: int vs float, -0, limits, overflow, underflow */
        { "[0,-0,1,-1,31,-32,-33,127,128,255,256,65535,65536,4294967295,4294967296]", 0, 0 },
        { "[-128,-129,-32768,-32769,-2147483648,-2147483649]", 0, 0 },
        { "[9223372036854775807,-9223372036854775808,-0.0,0.0,1e-400,-1e-400,4.9e-324]", 0, 0 },
        { "[1E2,1e+2,1e-2,0.1,123456789012345678901234567890.5]", 0, 0 },
        { "9223372036854775808", 0, TRANSCODE_EINVALID },
        { "-9223372036854775809", 0, TRANSCODE_EINVALID },
        { "[1e400]", 0, TRANSCODE_EINVALID },
        { "[-1e400]", 0, TRANSCODE_EINVALID },
        { "[01]", 0, TRANSCODE_EINVALID },
        { "[1.]", 0, TRANSCODE_EINVALID },
        { "[1e]", 0, TRANSCODE_EINVALID },
        { "[1e+]", 0, TRANSCODE_EINVALID },
        { "[-]", 0, TRANSCODE_EINVALID },
        { "[.5]", 0, TRANSCODE_EINVALID },
        /* duplicates, plain and spelled with escapes, nested */
        { "{\"a\":1,\"b\":2,\"a\":3}", 0, 0 },
        { "{\"a\":1,\"\\u0061\":[2],\"a\\/\":3,\"a/\":4}", 0, 0 },
        { "{\"x\":{\"k\":1,\"k\":{\"k\":2,\"k\":3}},\"x\":{\"k\":4,\"j\":5,\"k\":6}}", 0, 0 },
        { "{\"\":1,\"\":2}", 0, 0 },
        /* escapes and UTF-8 */
        { "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u0041\\u00e9\\u20AC\\ud83d\\ude00\\u0000\"", 0, 0 },
        { "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"", 0, 0 },
        { "\"\\ud800\"", 0, TRANSCODE_EINVALID },
        { "\"\\udc00\"", 0, TRANSCODE_EINVALID },
        { "\"\\ud800\\u0041\"", 0, TRANSCODE_EINVALID },
        { "\"\\ud800\\u0000\"", 0, TRANSCODE_EINVALID },
        { "\"\\ud800\\n\"", 0, TRANSCODE_EINVALID },
        { "\"\\ud800\\uZZZZ\"", 0, TRANSCODE_EINVALID },
        { "\"\\x\"", 0, TRANSCODE_EINVALID },
        { "\"\\u12\"", 0, TRANSCODE_EINVALID },
        { "\"a\nb\"", 0, TRANSCODE_EINVALID },
        { "\"\xc0\xaf\"", 0, TRANSCODE_EINVALID },
        { "\"\xed\xa0\x80\"", 0, TRANSCODE_EINVALID },
        { "\"\xf4\x90\x80\x80\"", 0, TRANSCODE_EINVALID },
        { "\"\xe2\x82\"", 0, TRANSCODE_EINVALID },
        { "[1,\xff]", 0, TRANSCODE_EINVALID },
        { "[1\xff]", 0, TRANSCODE_EINVALID },
        { "[\xc3\xa9]", 0, TRANSCODE_EINVALID },
        { "{\"a\\u0000\":1}", 0, TRANSCODE_EINVALID },
        { "\"abcdefghijklmnopqrstuvwxyz", 0, TRANSCODE_EINVALID }, /* no excerpt past 20 */
        /* grammar */
        { "", 0, TRANSCODE_EINVALID },
        { " ", 0, TRANSCODE_EINVALID },
        { "[1,]", 0, TRANSCODE_EINVALID },
        { "[1,", 0, TRANSCODE_EINVALID },
        { "{\"a\":1,}", 0, TRANSCODE_EINVALID },
        { "{\"a\" 1}", 0, TRANSCODE_EINVALID },
        { "{1:1}", 0, TRANSCODE_EINVALID },
        { "[1 2]", 0, TRANSCODE_EINVALID },
        { "[true,false,null,nul]", 0, TRANSCODE_EINVALID },
        { "{\"a\":1}\n\n  ]", 0, TRANSCODE_EINVALID },
        /* a NUL after a number or literal: jansson's stream loses it */
        { "null\0", 5, 0 },
        { "[1\0,2.5\0,true\0]", 15, 0 },
        { "[1\0,2.5\0,true\0]", 16, TRANSCODE_EINVALID }, /* the NUL after ] counts */
        { "1\0x", 3, TRANSCODE_EINVALID },
        { "1\0\0", 3, TRANSCODE_EINVALID },
        { "\"a\0\"", 4, TRANSCODE_EINVALID },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t len = cases[i].len ? cases[i].len : strlen(cases[i].json);
        ck_assert_msg(check_same_as_jansson(cases[i].json, len, NULL) == cases[i].rc, "case %zu",
                      i);
    }
}
END_TEST

/* "<k plain bytes><x><tail>" after `pre` and before `post`, in a block of
 * its own size: checked against jansson; returns the code. */
static int check_string_as_jansson(const char *pre, size_t k, const char *x, const char *tail,
                                   const char *post)
{
    char t[160];
    size_t n = (size_t)snprintf(t, sizeof(t), "%s\"", pre);
    memset(t + n, 'a', k);
    n += k;
    n += (size_t)snprintf(t + n, sizeof(t) - n, "%s%s%s", x, tail, post);
    char *b = malloc(n);
    ck_assert_ptr_nonnull(b);
    memcpy(b, t, n);
    int rc = check_same_as_jansson(b, n, NULL);
    free(b);
    return rc;
}

/* The lexer's string scan stops at each kind of special byte wherever it
 * lies (it reads up to 16 bytes at a time), in values and keys, and a
 * string cut short by the end of the text is an error there too. */
START_TEST(test_transcode__json_string_special_at_every_offset)
{
    static const char *const ok[] = { "\\n",
                                      "\\\"",
                                      "\\\\",
                                      "\\u00e9",
                                      "\\uD83D\\uDE00",
                                      " ",
                                      "\x7f",
                                      "\xc3\xa9",
                                      "\xe2\x82\xac",
                                      "\xf0\x9f\x98\x80",
                                      "\xe2\x82\xac\xc3\xa9\xf0\x9f\x98\x80" };
    static const char *const bad[] = { "\xc3\xa9\xe2\x82\xac\x80",
                                       "\x01",
                                       "\x1f",
                                       "\n",
                                       "\t",
                                       "\x80",
                                       "\xc0\xaf",
                                       "\xe2\x82z",
                                       "\xed\xa0\x80",
                                       "\xff",
                                       "\\x",
                                       "\\u12G4",
                                       "\\ud800z" };
    static const char *const cut[] = { "", "\\", "\\u00", "\xc3", "\xe2\x82" };

    for (size_t k = 0; k <= 40; k++) {
        for (int key = 0; key < 2; key++) {
            const char *pre = key ? "{" : "", *post = key ? ":1}" : "";
            for (size_t i = 0; i < sizeof(ok) / sizeof(*ok); i++) {
                ck_assert_int_eq(check_string_as_jansson(pre, k, ok[i], "\"", post), 0);
                ck_assert_int_eq(
                    check_string_as_jansson(pre, k, ok[i], "bbbbbbbbbbbbbbbbb\"", post), 0);
            }
            for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
                ck_assert_int_eq(check_string_as_jansson(pre, k, bad[i], "\"", post),
                                 TRANSCODE_EINVALID);
                ck_assert_int_eq(
                    check_string_as_jansson(pre, k, bad[i], "bbbbbbbbbbbbbbbbb\"", post),
                    TRANSCODE_EINVALID);
            }
            for (size_t i = 0; i < sizeof(cut) / sizeof(*cut); i++)
                ck_assert_int_eq(check_string_as_jansson(pre, k, cut[i], "", ""),
                                 TRANSCODE_EINVALID);
        }
    }
}
END_TEST

/* A JSON array or object of n members, in a malloc'd string. */
static char *wide_json(size_t n, bool object, size_t dup_every)
{
    char *s = malloc(n * 24 + 3), *p = s;

    *p++ = object ? '{' : '[';
    for (size_t i = 0; i < n; i++) {
        if (i)
            *p++ = ',';
        if (object)
            p += sprintf(p, "\"k%zu\":%zu", dup_every ? i % dup_every : i, i);
        else
            p += sprintf(p, "%zu", i);
    }
    *p++ = object ? '}' : ']';
    *p = '\0';
    return s;
}

START_TEST(test_transcode__json_wide_containers_and_many_keys)
{
    static const size_t sizes[] = { 15, 16, 17, 100, 65535, 65536, 70000 };

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        for (int object = 0; object <= 1; object++) {
            char *j = wide_json(sizes[i], object, 0);
            ck_assert_int_eq(check_same_as_jansson(j, strlen(j), NULL), 0);
            free(j);
        }
        /* duplicates found by the hash index: 40 distinct keys, repeated */
        char *j = wide_json(sizes[i], true, 40);
        ck_assert_int_eq(check_same_as_jansson(j, strlen(j), NULL), 0);
        free(j);
    }
    /* a key repeated 100,000 times, then another as often: the index, not
     * a scan past the duplicates, finds the second (quadratic otherwise) */
    size_t n = 200000;
    char *many = malloc(n * 6 + 64), *q = many;
    *q++ = '{';
    for (size_t i = 0; i < n; i++)
        q += sprintf(q, "%s\"%c\":%zu", i ? "," : "", i < n / 2 ? 'a' : 'b', i % 10);
    strcpy(q, ",\"b\":1,\"a\":\"last\",\"c\":2}");
    ck_assert_int_eq(check_same_as_jansson(many, strlen(many), NULL), 0);
    free(many);
    /* headers: fixarray up to 15, array16 from 16, array32 from 65536 */
    struct mp m;
    char *j = wide_json(16, false, 0);
    mp_init(&m);
    ck_assert_int_eq(transcode_json_to_msgpack(j, strlen(j), &m.pk, NULL, NULL, 0), 0);
    ck_assert_mem_eq(m.sb.data, "\xdc\x00\x10\x00\x01", 5);
    mp_fini(&m);
    free(j);
    j = wide_json(65536, true, 0);
    mp_init(&m);
    ck_assert_int_eq(transcode_json_to_msgpack(j, strlen(j), &m.pk, NULL, NULL, 0), 0);
    ck_assert_mem_eq(m.sb.data, "\xdf\x00\x01\x00\x00\xa2k0\x00", 9);
    mp_fini(&m);
    free(j);
}
END_TEST

/* Nesting: the caller's bound, jansson's own (2048 values deep, scalars
 * counted), and a deep value that a duplicate key replaces. */
START_TEST(test_transcode__json_depth_edges_match_jansson)
{
    const struct transcode_j2m three = { .max_depth = 3 };
    static const unsigned levels[] = { 2047, 2048, 2049 };
    char *s = malloc(2 * 2049 + 2);

    for (size_t i = 0; i < 3; i++) {
        unsigned n = levels[i];
        for (int scalar = 0; scalar <= 1; scalar++) {
            size_t k = 0;
            memset(s, '[', n);
            k = n;
            if (scalar)
                s[k++] = '1';
            memset(s + k, ']', n);
            k += n;
            int rc = check_same_as_jansson(s, k, NULL);
            ck_assert_int_eq(
                rc, n + (unsigned)scalar > 2048 ? TRANSCODE_EINVALID : TRANSCODE_ETOO_DEEP);
        }
    }
    free(s);
    /* too deep, yet replaced by a later duplicate: jansson's tree never
     * had it */
    static const char replaced[] = "{\"a\":[[[[1]]]],\"b\":2,\"a\":[1]}";
    ck_assert_int_eq(check_same_as_jansson(replaced, strlen(replaced), &three), 0);
    static const char kept[] = "{\"a\":[1],\"b\":[[[[1]]]],\"a\":[[[[2]]]]}";
    ck_assert_int_eq(check_same_as_jansson(kept, strlen(kept), &three), TRANSCODE_ETOO_DEEP);
    /* a syntax error after the deep part still wins */
    static const char bad[] = "[[[[[1]]]]],";
    ck_assert_int_eq(check_same_as_jansson(bad, strlen(bad), &three), TRANSCODE_EINVALID);
}
END_TEST

/* Exact messages, as jansson words them (line, column in characters, the
 * token read so far). */
START_TEST(test_transcode__json_error_messages)
{
    static const struct {
        const char *json, *err;
    } cases[] = {
        { "{\"a\":1", "invalid JSON at line 1, column 6: '}' expected near end of file" },
        { "[DONE]", "invalid JSON at line 1, column 5: invalid token near 'DONE'" },
        { "{\"x\":\n tru}", "invalid JSON at line 2, column 4: invalid token near 'tru'" },
        { "\"\xc3\xa9\xc3\xa9\\q\"",
          "invalid JSON at line 1, column 5: invalid escape near '\"\\xc3\\xa9\\xc3\\xa9\\q'" },
        { "[1,\xff]", "invalid JSON at line 1, column 3: unable to decode byte 0xff" },
        { "\"\\ud800x\"",
          "invalid JSON at line 1, column 9: invalid Unicode '\\uD800' near "
          "'\"\\ud800x\"'" },
        { "[12345678901234567890]",
          "number out of range in JSON at line 1, column 21: too big "
          "integer near '12345678901234567890' (integers must fit in "
          "int64, numbers in a double)" },
    };
    char err[ERRLEN];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct mp m;
        mp_init(&m);
        ck_assert_int_eq(transcode_json_to_msgpack(cases[i].json, strlen(cases[i].json), &m.pk,
                                                   NULL, err, ERRLEN),
                         TRANSCODE_EINVALID);
        ck_assert_str_eq(err, cases[i].err);
        mp_fini(&m);
        check_same_as_jansson(cases[i].json, strlen(cases[i].json), NULL);
    }
}
END_TEST

static int sk_hook(void *ud, const char **s, size_t *n)
{
    (void)ud;
    if (*n >= 2 && memcmp(*s, "sk", 2) == 0) {
        *s = "[redacted]";
        *n = 10;
    }
    return 0;
}

START_TEST(test_transcode__json_pick_finds_members_in_one_pass)
{
    static const char *const pick[] = { "usage", "type", "absent", NULL };
    static const char reply[] =
        "{\"type\":\"x\",\"usage\":{\"total_tokens\":5},\"sk-key\":[1,2,3],\"\\u0075sage\":"
        "{\"total_tokens\":7,\"n\":\"sk-1\"},\"z\":1}";
    struct transcode_span picked[3];
    const struct transcode_j2m opt = { .on_str = sk_hook, .pick = pick, .picked = picked };
    struct mp m, want;
    msgpack_unpacked u;

    mp_init(&m);
    ck_assert_int_eq(transcode_json_to_msgpack(reply, strlen(reply), &m.pk, &opt, NULL, 0), 0);
    /* the duplicate's value at the first position, scrubbed */
    mp_init(&want);
    msgpack_pack_map(&want.pk, 2);
    pstr(&want.pk, "total_tokens");
    msgpack_pack_int(&want.pk, 7);
    pstr(&want.pk, "n");
    pstr(&want.pk, "[redacted]");
    ck_assert_uint_eq(picked[0].len, want.sb.size);
    ck_assert_mem_eq(m.sb.data + picked[0].off, want.sb.data, want.sb.size);
    ck_assert_uint_eq(picked[1].len, 2);
    ck_assert_mem_eq(m.sb.data + picked[1].off, "\xa1x", 2);
    ck_assert_uint_eq(picked[2].len, 0);
    /* and the whole agrees with an unpack of the output */
    msgpack_unpacked_init(&u);
    ck_assert_int_eq(msgpack_unpack_next(&u, m.sb.data, m.sb.size, NULL), MSGPACK_UNPACK_SUCCESS);
    ck_assert_uint_eq(u.data.via.map.size, 4);
    msgpack_unpacked_destroy(&u);
    mp_fini(&want);
    mp_fini(&m);

    /* wide outermost object (header widened after the spans were taken) */
    char *wide = wide_json(300, true, 0);
    size_t wl = strlen(wide);
    char *j = malloc(wl + 40);
    memcpy(j, wide, wl - 1);
    strcpy(j + wl - 1, ",\"usage\":{\"t\":1}}");
    mp_init(&m);
    ck_assert_int_eq(transcode_json_to_msgpack(j, strlen(j), &m.pk, &opt, NULL, 0), 0);
    ck_assert_uint_eq(picked[0].len, 4);
    ck_assert_mem_eq(m.sb.data + picked[0].off, "\x81\xa1t\x01", 4);
    mp_fini(&m);
    free(j);
    free(wide);

    /* not an object: nothing picked */
    mp_init(&m);
    ck_assert_int_eq(transcode_json_to_msgpack("[{\"usage\":1}]", 13, &m.pk, &opt, NULL, 0), 0);
    ck_assert_uint_eq(picked[0].len, 0);
    mp_fini(&m);
}
END_TEST

Suite *transcode_suite(void)
{
    Suite *s = suite_create("transcode");
    TCase *tc = tcase_create("core");

    /* localedef builds the comma locale: seconds on a loaded machine. */
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_transcode__buf_lifecycle);
    tcase_add_test(tc, test_transcode__json_single_pass_matches_jansson);
    tcase_add_test(tc, test_transcode__json_string_special_at_every_offset);
    tcase_add_test(tc, test_transcode__json_reals_ignore_a_comma_locale);
    tcase_add_test(tc, test_transcode__json_wide_containers_and_many_keys);
    tcase_add_test(tc, test_transcode__json_depth_edges_match_jansson);
    tcase_add_test(tc, test_transcode__json_error_messages);
    tcase_add_test(tc, test_transcode__json_pick_finds_members_in_one_pass);
    tcase_add_test(tc, test_transcode__roundtrip_chat_body);
    tcase_add_test(tc, test_transcode__roundtrip_unicode_and_escapes);
    tcase_add_test(tc, test_transcode__roundtrip_long_escaped_string);
    tcase_add_test(tc, test_transcode__roundtrip_integers);
    tcase_add_test(tc, test_transcode__uint64_above_int64_is_printed_exactly);
    tcase_add_test(tc, test_transcode__roundtrip_floats);
    tcase_add_test(tc, test_transcode__floats_roundtrip_bit_exact);
    tcase_add_test(tc, test_transcode__floats_random_roundtrip);
    tcase_add_test(tc, test_transcode__string_special_byte_at_every_offset);
    tcase_add_test(tc, test_transcode__float32_prints_shortest_for_float);
    tcase_add_test(tc, test_transcode__scalars_at_top_level);
    tcase_add_test(tc, test_transcode__appends_to_existing_content);
    tcase_add_test(tc, test_transcode__override_model_replaces_in_place);
    tcase_add_test(tc, test_transcode__override_model_added_when_absent);
    tcase_add_test(tc, test_transcode__override_model_duplicates_and_nested);
    tcase_add_test(tc, test_transcode__override_stream);
    tcase_add_test(tc, test_transcode__override_model_is_escaped_and_validated);
    tcase_add_test(tc, test_transcode__override_ignored_when_not_a_map);
    tcase_add_test(tc, test_transcode__reject_bin);
    tcase_add_test(tc, test_transcode__reject_ext);
    tcase_add_test(tc, test_transcode__reject_nan_and_infinity);
    tcase_add_test(tc, test_transcode__reject_non_string_keys);
    tcase_add_test(tc, test_transcode__reject_invalid_utf8);
    tcase_add_test(tc, test_transcode__accepts_utf8_boundaries);
    tcase_add_test(tc, test_transcode__reject_invalid_utf8_key);
    tcase_add_test(tc, test_transcode__error_path_quotes_odd_keys);
    tcase_add_test(tc, test_transcode__error_message_truncation_and_null_err);
    tcase_add_test(tc, test_transcode__failure_restores_buffer);
    tcase_add_test(tc, test_transcode__depth_limit_msgpack);
    tcase_add_test(tc, test_transcode__json_reply_roundtrip);
    tcase_add_test(tc, test_transcode__json_key_order_and_duplicates);
    tcase_add_test(tc, test_transcode__json_scalars_and_numbers);
    tcase_add_test(tc, test_transcode__json_not_nul_terminated);
    tcase_add_test(tc, test_transcode__json_big_numbers_rejected);
    tcase_add_test(tc, test_transcode__json_invalid_input);
    tcase_add_test(tc, test_transcode__depth_limit_json);
    tcase_add_test(tc, test_transcode__json_packer_failure);
    tcase_add_test(tc, test_transcode__utf8_repair);
    tcase_add_test(tc, test_transcode__utf8_cut);
    tcase_add_test(tc, test_transcode__depth_limit_from_caller);
    tcase_add_test(tc, test_transcode__string_hook_sees_keys_and_values);
    suite_add_tcase(s, tc);
    return s;
}
