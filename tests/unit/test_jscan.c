/* test_jscan.c — the validating JSON scanner (sidecar/jscan.h): what it
 * accepts and rejects (RFC 8259 grammar, escapes, UTF-8, depth), every
 * truncation of valid objects, and the members and elements it reports,
 * past the number it records on the way too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jscan.h"
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
    suite_add_tcase(s, tc);
    return s;
}
