/* test_jscan.c — the validating JSON scanner (sidecar/codec/jscan.h): what it
 * accepts and rejects (RFC 8259 grammar, escapes, UTF-8, depth), every
 * truncation of valid objects, and the members and elements it reports,
 * past the number it records on the way too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/jscan.h"
#include "suites.h"

static const char *const valid[] = {
    "{}",
    "[]",
    "0",
    "-0",
    "1.5e-3",
    "-12E+7",
    "\"\"",
    "true",
    "false",
    "null",
    " \t\r\n{ \"a\" : [ 1 , {\"b\":null} ] } \n",
    "{\"k\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\uD83D\\uDE00\"}",
    "\"h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80\"",
    "[1,2,3,[4,[5,[6]]],{\"x\":{\"y\":{}}}]",
    "{\"a\":1,\"a\":2}",
};

static const char *const invalid[] = {
    "",
    " ",
    "{",
    "}",
    "[1,]",
    "[,1]",
    "{\"a\"}",
    "{\"a\":}",
    "{a:1}",
    "{\"a\":1,}",
    "01",
    "1.",
    ".5",
    "-",
    "1e",
    "1e+",
    "+1",
    "0x10",
    "NaN",
    "Infinity",
    "tru",
    "nul",
    "\"abc",
    "\"\\x\"",
    "\"\\u12\"",
    "\"\\u12G4\"",
    "\"a\x01\"",
    "\"\xff\"",
    "\"\xc0\xaf\"",
    "\"\xed\xa0\x80\"",
    "\"\xf4\x90\x80\x80\"",
    "\"\xe2\x82\"",
    "{} {}",
    "[1] x",
    "{\"a\":1}}",
    "[\"a\" \"b\"]",
    "{\"a\" 1}",
    "'a'",
};

START_TEST(test_jscan__accepts_json)
{
    for (size_t i = 0; i < sizeof(valid) / sizeof(*valid); i++)
        ck_assert_msg(jscan_check(valid[i], strlen(valid[i]), NULL) == 0, "rejected: %s", valid[i]);
}
END_TEST

START_TEST(test_jscan__rejects_what_is_not_json)
{
    for (size_t i = 0; i < sizeof(invalid) / sizeof(*invalid); i++) {
        size_t at = 12345;
        ck_assert_msg(jscan_check(invalid[i], strlen(invalid[i]), &at) == -1, "accepted: %s",
                      invalid[i]);
        ck_assert_msg(at <= strlen(invalid[i]), "error offset %zu past the end of %s", at,
                      invalid[i]);
    }
    size_t at = 0;
    ck_assert_int_eq(jscan_check("{\"a\":[1,2,x]}", 13, &at), -1);
    ck_assert_uint_eq(at, 10);
    /* An embedded NUL is not JSON whitespace. */
    ck_assert_int_eq(jscan_check("{}\0", 3, NULL), -1);
}
END_TEST

START_TEST(test_jscan__every_truncation_of_an_object_is_rejected)
{
    static const char *const texts[] = {
        "{\"model\":\"m\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"h\\u00e9 "
        "\xe2\x82\xac\"}],"
        "\"n\":-1.5e3,\"x\":null,\"y\":false}",
        "{\"usage\":{\"total_tokens\":12},\"choices\":[{\"finish_reason\":\"stop\"}]}",
    };
    for (size_t t = 0; t < 2; t++) {
        size_t n = strlen(texts[t]);
        ck_assert_int_eq(jscan_object(texts[t], n, NULL, NULL, NULL), 0);
        for (size_t cut = 0; cut < n; cut++)
            ck_assert_msg(jscan_object(texts[t], cut, NULL, NULL, NULL) == -1,
                          "prefix %zu accepted", cut);
    }
}
END_TEST

static char *nested(size_t depth)
{
    char *s = malloc(2 * depth + 1);
    ck_assert_ptr_nonnull(s);
    memset(s, '[', depth);
    memset(s + depth, ']', depth);
    s[2 * depth] = '\0';
    return s;
}

START_TEST(test_jscan__depth_is_bounded)
{
    char *ok = nested(JSCAN_MAX_DEPTH), *deep = nested(JSCAN_MAX_DEPTH + 1), *huge = nested(100000);
    ck_assert_int_eq(jscan_check(ok, strlen(ok), NULL), 0);
    ck_assert_int_eq(jscan_check(deep, strlen(deep), NULL), -1);
    ck_assert_int_eq(jscan_check(huge, strlen(huge), NULL), -1); /* no stack overflow */
    free(ok);
    free(deep);
    free(huge);
}
END_TEST

struct seen {
    char keys[80][64];
    struct jscan_value vals[80];
    size_t n;
    size_t stop_at; /* return 7 at this member (1-based), 0: never */
};

static int on_member(void *ud, const char *key, const struct jscan_value *v)
{
    struct seen *s = ud;
    ck_assert_uint_lt(s->n, 80);
    snprintf(s->keys[s->n], 64, "%s", key);
    s->vals[s->n++] = *v;
    return s->stop_at && s->n == s->stop_at ? 7 : 0;
}

static int on_element(void *ud, const struct jscan_value *v)
{
    return on_member(ud, "", v);
}

START_TEST(test_jscan__members_in_order_with_unescaped_keys)
{
    const char *t = "{\"\\u0073tream\":true, \"model\":\"m\\\"x\",\"n\":[1,{\"a\":2}],"
                    "\"\\u00e9\":-2.5,\"\\ud83d\\ude00\":null,\"nul\\u0000\":1}";
    struct seen s = { 0 };
    ck_assert_int_eq(jscan_object(t, strlen(t), on_member, &s, NULL), 0);
    ck_assert_uint_eq(s.n, 6);
    ck_assert_str_eq(s.keys[0], "stream");
    ck_assert_int_eq(s.vals[0].type, JSCAN_TRUE);
    ck_assert_str_eq(s.keys[1], "model");
    ck_assert_int_eq(s.vals[1].type, JSCAN_STRING);
    ck_assert_uint_eq(s.vals[1].len, 6); /* "m\"x" with its quotes */
    ck_assert_int_eq(memcmp(s.vals[1].p, "\"m\\\"x\"", 6), 0);
    ck_assert_str_eq(s.keys[2], "n");
    ck_assert_int_eq(s.vals[2].type, JSCAN_ARRAY);
    ck_assert_int_eq(memcmp(s.vals[2].p, "[1,{\"a\":2}]", s.vals[2].len), 0);
    ck_assert_str_eq(s.keys[3], "\xc3\xa9");
    double d = 0;
    ck_assert(jscan_number(&s.vals[3], &d));
    ck_assert(d == -2.5);
    ck_assert_str_eq(s.keys[4], "\xf0\x9f\x98\x80");
    ck_assert_int_eq(s.vals[4].type, JSCAN_NULL);
    ck_assert_str_eq(s.keys[5], ""); /* holds a NUL: matches nothing */
    ck_assert(!jscan_number(&s.vals[4], &d));

    struct seen stop = { .stop_at = 2 };
    ck_assert_int_eq(jscan_object(t, strlen(t), on_member, &stop, NULL), 7);
    ck_assert_uint_eq(stop.n, 2);
    /* Not an object; not JSON: the callback never runs. */
    struct seen none = { 0 };
    ck_assert_int_eq(jscan_object("[1]", 3, on_member, &none, NULL), -2);
    ck_assert_int_eq(jscan_object("{\"a\":1,\"b\":}", 12, on_member, &none, NULL), -1);
    ck_assert_uint_eq(none.n, 0);
}
END_TEST

START_TEST(test_jscan__more_members_than_recorded)
{
    char t[4096];
    size_t o = 0;
    t[o++] = '{';
    for (int i = 0; i < 70; i++)
        o += (size_t)snprintf(t + o, sizeof(t) - o, "%s\"k%d\":[%d,{\"z\":\"%d\"}]", i ? "," : "",
                              i, i, i);
    t[o++] = '}';
    struct seen s = { 0 };
    ck_assert_int_eq(jscan_object(t, o, on_member, &s, NULL), 0);
    ck_assert_uint_eq(s.n, 70);
    for (int i = 0; i < 70; i++) {
        char key[16], val[64];
        snprintf(key, sizeof(key), "k%d", i);
        int n = snprintf(val, sizeof(val), "[%d,{\"z\":\"%d\"}]", i, i);
        ck_assert_str_eq(s.keys[i], key);
        ck_assert_uint_eq(s.vals[i].len, (size_t)n);
        ck_assert_int_eq(memcmp(s.vals[i].p, val, (size_t)n), 0);
    }
    /* Arrays too. */
    o = 0;
    t[o++] = '[';
    for (int i = 0; i < 50; i++)
        o += (size_t)snprintf(t + o, sizeof(t) - o, "%s%d", i ? " , " : "", i);
    t[o++] = ']';
    struct seen a = { 0 };
    ck_assert_int_eq(jscan_array(t, o, on_element, &a, NULL), 0);
    ck_assert_uint_eq(a.n, 50);
    double d;
    ck_assert(jscan_number(&a.vals[49], &d) && d == 49);
    ck_assert_int_eq(jscan_array("{}", 2, on_element, &a, NULL), -2);
}
END_TEST

/* A copy of s[0..n) in a block of exactly n bytes, so that the sanitizers
 * catch a read past the end of the text. */
static char *exact(const char *s, size_t n)
{
    char *b = malloc(n ? n : 1);
    ck_assert_ptr_nonnull(b);
    memcpy(b, s, n);
    return b;
}

static bool is_plain(unsigned char b)
{
    return b >= 0x20 && b < 0x80 && b != '"' && b != '\\';
}

typedef const unsigned char *plain_run_fn(const unsigned char *, const unsigned char *);

/* Every byte value at every offset 0..17 of runs of up to 40 bytes, at four
 * alignments, that end at the end of their block (or right after the byte). */
static void check_plain_run(plain_run_fn *run, const char *name)
{
    for (size_t len = 0; len <= 40; len++) {
        for (size_t align = 0; align < 4; align++) {
            unsigned char *blk = malloc(align + len + 1);
            ck_assert_ptr_nonnull(blk);
            unsigned char *p = blk + align, *end = p + len;
            memset(p, 'a', len);
            ck_assert_msg(run(p, end) == end, "%s: plain run of %zu at +%zu", name, len, align);
            for (size_t at = 0; at < len && at <= 17; at++) {
                for (unsigned b = 0; b < 256; b++) {
                    p[at] = (unsigned char)b;
                    bool plain = is_plain((unsigned char)b);
                    if (run(p, end) != (plain ? end : p + at))
                        ck_abort_msg("%s: byte 0x%02x at %zu of %zu (+%zu): stops at %td", name, b,
                                     at, len, align, run(p, end) - p);
                    /* the same byte last in its block */
                    if (run(p, p + at + 1) != p + at + !!plain)
                        ck_abort_msg("%s: byte 0x%02x ending a run of %zu", name, b, at + 1);
                }
                p[at] = 'a';
            }
            /* two stops: the first one wins */
            if (len >= 2) {
                p[len - 1] = '"';
                p[len / 2] = '\\';
                ck_assert(run(p, end) == p + len / 2);
            }
            free(blk);
        }
    }
}

START_TEST(test_jscan__plain_run_stops_at_the_first_special_byte)
{
    check_plain_run(jscan_plain_run, "jscan_plain_run");
    check_plain_run(jscan_plain_run_swar, "jscan_plain_run_swar");
}
END_TEST

/* "<k plain bytes><x><tail>" as one JSON text in a block of its own size:
 * jscan_check's result and error offset. */
static int check_string(size_t k, const char *x, size_t xn, const char *tail, size_t *at)
{
    char t[128];
    size_t n = 0;
    t[n++] = '"';
    memset(t + n, 'a', k);
    n += k;
    memcpy(t + n, x, xn);
    n += xn;
    memcpy(t + n, tail, strlen(tail));
    n += strlen(tail);
    char *b = exact(t, n);
    *at = 9999;
    int rc = jscan_check(b, n, at);
    free(b);
    return rc;
}

START_TEST(test_jscan__string_special_at_every_offset)
{
    /* accepted wherever they are */
    static const char *const ok[] = {
        "\\n", "\\\"", "\\\\",     "\\/",          "\\u00e9",         "\\uD83D\\uDE00",
        " ",   "\x7f", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"
    };
    /* rejected at their first byte */
    static const char *const bad[] = {
        "\x01", "\x1f",     "\n",        "\t",           "\x80",
        "\xbf", "\xc0\xaf", "\xe2\x82z", "\xed\xa0\x80", "\xf4\x90\x80\x80",
        "\xff", "\\x",      "\\u12G4",   "\\u00eZ",      "\\'"
    };
    size_t at;

    for (size_t k = 0; k <= 40; k++) {
        for (size_t tail = 0; tail <= 17; tail += 17) {
            const char *rest = tail ? "bbbbbbbbbbbbbbbbb\"" : "\"";
            for (size_t i = 0; i < sizeof(ok) / sizeof(*ok); i++)
                ck_assert_msg(check_string(k, ok[i], strlen(ok[i]), rest, &at) == 0,
                              "ok[%zu] at %zu rejected at %zu", i, k, at);
            for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
                ck_assert_msg(check_string(k, bad[i], strlen(bad[i]), rest, &at) == -1,
                              "bad[%zu] at %zu accepted", i, k);
                ck_assert_msg(at == 1 + k, "bad[%zu] at %zu: error at %zu", i, k, at);
            }
            ck_assert_int_eq(check_string(k, "\0", 1, rest, &at), -1); /* a raw NUL */
            ck_assert_uint_eq(at, 1 + k);
            /* characters back to back, the last one bad */
            ck_assert_int_eq(check_string(k, "\xe2\x82\xac\xc3\xa9\xf0\x9f\x98\x80", 9, rest, &at),
                             0);
            ck_assert_int_eq(check_string(k, "\xc3\xa9\xe2\x82\xac\x80", 6, rest, &at), -1);
            ck_assert_uint_eq(at, 6 + k);
            /* a quote ends the string early: what follows it is garbage */
            if (tail) {
                ck_assert_int_eq(check_string(k, "\"", 1, rest, &at), -1);
                ck_assert_uint_eq(at, 2 + k);
            }
        }
        /* cut short: at the end, or at the escape or sequence it cuts */
        ck_assert_int_eq(check_string(k, "", 0, "", &at), -1);
        ck_assert_uint_eq(at, 1 + k);
        static const char *const cut[] = { "\\",   "\\u",      "\\u00",       "\\u00e",
                                           "\xc3", "\xe2\x82", "\xf0\x9f\x98" };
        for (size_t i = 0; i < sizeof(cut) / sizeof(*cut); i++) {
            ck_assert_msg(check_string(k, cut[i], strlen(cut[i]), "", &at) == -1,
                          "cut[%zu] at %zu accepted", i, k);
            ck_assert_msg(at == 1 + k, "cut[%zu] at %zu: error at %zu", i, k, at);
        }
        ck_assert_int_eq(check_string(k, "\xc3\xa9", 2, "", &at), -1);
        ck_assert_uint_eq(at, 3 + k);
        /* ends exactly at the end of the buffer */
        ck_assert_int_eq(check_string(k, "", 0, "\"", &at), 0);
        ck_assert_int_eq(check_string(k, "\\t", 2, "\"", &at), 0);
    }
}
END_TEST

static int on_first_key(void *ud, const char *key, const struct jscan_value *v)
{
    (void)v;
    snprintf(ud, 80, "%s", key);
    return 1;
}

/* Keys as the callback sees them: up to 63 bytes as they are, escaped or
 * not, longer ones as "". */
START_TEST(test_jscan__key_lengths_with_and_without_escapes)
{
    for (size_t n = 0; n <= 70; n++) {
        for (int esc = 0; esc < 3; esc++) {
            char t[200], want[80], got[80] = "?";
            size_t o = 0;
            memset(want, 'k', n);
            want[n] = '\0';
            t[o++] = '{';
            t[o++] = '"';
            memset(t + o, 'k', n);
            /* an escape for the last byte: \u006b or \/ (then the key ends in '/') */
            if (esc == 1 && n) {
                o += n - 1;
                memcpy(t + o, "\\u006b", 6);
                o += 6;
            } else if (esc == 2 && n) {
                o += n - 1;
                memcpy(t + o, "\\/", 2);
                o += 2;
                want[n - 1] = '/';
            } else {
                o += n;
            }
            memcpy(t + o, "\":1}", 4);
            o += 4;
            char *b = exact(t, o);
            ck_assert_int_eq(jscan_object(b, o, on_first_key, got, NULL), 1);
            free(b);
            /* (a \u escape is decoded only with room for four bytes
             * left: keys of 61..63 bytes ending in one come out as "") */
            bool fits = esc == 1 ? n <= 60 : n <= 63;
            ck_assert_msg(strcmp(got, fits ? want : "") == 0, "key of %zu (escape %d): \"%s\"", n,
                          esc, got);
        }
    }
}
END_TEST

Suite *jscan_suite(void)
{
    Suite *s = suite_create("jscan");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_jscan__accepts_json);
    tcase_add_test(tc, test_jscan__rejects_what_is_not_json);
    tcase_add_test(tc, test_jscan__every_truncation_of_an_object_is_rejected);
    tcase_add_test(tc, test_jscan__depth_is_bounded);
    tcase_add_test(tc, test_jscan__members_in_order_with_unescaped_keys);
    tcase_add_test(tc, test_jscan__more_members_than_recorded);
    tcase_add_test(tc, test_jscan__plain_run_stops_at_the_first_special_byte);
    tcase_add_test(tc, test_jscan__string_special_at_every_offset);
    tcase_add_test(tc, test_jscan__key_lengths_with_and_without_escapes);
    suite_add_tcase(s, tc);
    return s;
}
