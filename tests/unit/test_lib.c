/* test_lib.c — lib/: strbuf, dlist, utf8, jsonw. */
#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comma_locale.h"
#include "dlist.h"
#include "iplit.h"
#include "jsonw.h"
#include "strbuf.h"
#include "suites.h"
#include "utf8.h"

START_TEST(test_lib__strbuf_grows_and_keeps_room_for_a_nul)
{
    struct strbuf b = { 0 };

    for (int i = 0; i < 1000; i++)
        ck_assert_int_eq(strbuf_puts(&b, "abc"), 0);
    ck_assert_uint_eq(b.len, 3000);
    ck_assert_uint_gt(b.cap, b.len);
    strbuf_terminate(&b);
    ck_assert_uint_eq(strlen(b.data), 3000);
    /* A request that cannot be met leaves the buffer as it was. */
    char *data = b.data;
    ck_assert_int_eq(strbuf_reserve(&b, SIZE_MAX - 8), STRBUF_ENOMEM);
    ck_assert_ptr_eq(b.data, data);
    ck_assert_uint_eq(b.len, 3000);
    strbuf_reset(&b);
    ck_assert_uint_eq(b.len, 0);
    ck_assert_str_eq(b.data, "");
    strbuf_fini(&b);
    ck_assert_ptr_null(b.data);
    ck_assert_uint_eq(b.cap, 0);
}
END_TEST

START_TEST(test_lib__strbuf_fit_gives_back_the_unused_capacity)
{
    struct strbuf b = { 0 };

    ck_assert_int_eq(strbuf_fit(&b), 0); /* nothing allocated: stays so */
    ck_assert_ptr_null(b.data);
    ck_assert_int_eq(strbuf_puts(&b, "{\"a\":1}"), 0);
    ck_assert_uint_ge(malloc_usable_size(b.data), 1024);
    ck_assert_int_eq(strbuf_fit(&b), 0);
    ck_assert_uint_eq(b.cap, b.len + 1);
    ck_assert_uint_lt(malloc_usable_size(b.data), 64);
    strbuf_terminate(&b);
    ck_assert_str_eq(b.data, "{\"a\":1}");
    /* Still a buffer like any other: it grows again on the next append. */
    ck_assert_int_eq(strbuf_puts(&b, "xyz"), 0);
    strbuf_terminate(&b);
    ck_assert_str_eq(b.data, "{\"a\":1}xyz");
    strbuf_fini(&b);
}
END_TEST

START_TEST(test_lib__strbuf_set_exact_allocates_the_size_of_the_text)
{
    struct strbuf b = { 0 };

    ck_assert_int_eq(strbuf_puts(&b, "old text, replaced"), 0);
    ck_assert_int_eq(strbuf_set_exact(&b, "{\"model\":\"m\"}", 13), 0);
    ck_assert_uint_eq(b.len, 13);
    ck_assert_uint_eq(b.cap, 14);
    ck_assert_uint_lt(malloc_usable_size(b.data), 64);
    ck_assert_str_eq(b.data, "{\"model\":\"m\"}");
    ck_assert_int_eq(strbuf_puts(&b, "!"), 0); /* and grows like any buffer */
    strbuf_terminate(&b);
    ck_assert_str_eq(b.data, "{\"model\":\"m\"}!");
    ck_assert_int_eq(strbuf_set_exact(&b, NULL, 0), 0);
    ck_assert_uint_eq(b.len, 0);
    ck_assert_str_eq(b.data, "");
    strbuf_fini(&b);
}
END_TEST

struct item {
    struct item *prev, *next;
    int v;
};

START_TEST(test_lib__dlist_push_and_unlink_anywhere)
{
    struct item it[3] = { { .v = 0 }, { .v = 1 }, { .v = 2 } }, *head = NULL;

    for (int i = 0; i < 3; i++)
        DLIST_PUSH(head, &it[i], prev, next);
    ck_assert_ptr_eq(head, &it[2]); /* 2 1 0 */
    DLIST_UNLINK(head, &it[1], prev, next);
    ck_assert_ptr_eq(head, &it[2]);
    ck_assert_ptr_eq(it[2].next, &it[0]);
    ck_assert_ptr_eq(it[0].prev, &it[2]);
    ck_assert_ptr_null(it[1].prev);
    ck_assert_ptr_null(it[1].next);
    DLIST_UNLINK(head, &it[2], prev, next);
    ck_assert_ptr_eq(head, &it[0]);
    ck_assert_ptr_null(it[0].prev);
    DLIST_UNLINK(head, &it[0], prev, next);
    ck_assert_ptr_null(head);
}
END_TEST

START_TEST(test_lib__utf8_validates_cuts_and_repairs)
{
    const unsigned char ok[] = "\xE2\x82\xAC", overlong[] = "\xC0\xAF",
                        surrogate[] = "\xED\xA0\x80";
    struct strbuf b = { 0 };

    ck_assert_uint_eq(utf8_seq_len(ok, ok + 3), 3);
    ck_assert_uint_eq(utf8_seq_len(ok, ok + 2), 0); /* cut short */
    ck_assert_uint_eq(utf8_seq_len(overlong, overlong + 2), 0);
    ck_assert_uint_eq(utf8_seq_len(surrogate, surrogate + 3), 0);
    ck_assert_uint_eq(utf8_bad_len((const unsigned char *)"\xE2\x82"
                                                          "A",
                                   ok + 3),
                      2);
    ck_assert_uint_eq(utf8_cut("a\xE2\x82\xAC", 4, 3), 1);
    ck_assert_uint_eq(utf8_valid_prefix(NULL, 0), 0);
    ck_assert_uint_eq(utf8_valid_prefix("a\xE2\x82\xAC\0b", 6), 6);     /* NUL is valid UTF-8 */
    ck_assert_uint_eq(utf8_valid_prefix("ab\xE2\x82", 4), 2);           /* cut short */
    ck_assert_uint_eq(utf8_valid_prefix("\xC3\xA9\xED\xA0\x80", 5), 2); /* surrogate */
    ck_assert_uint_eq(utf8_valid_prefix("\xFF", 1), 0);
    ck_assert_int_eq(utf8_repair("a\xFF"
                                 "b\xE2\x82",
                                 5, &b),
                     2);
    ck_assert_str_eq(b.data,
                     "a\xEF\xBF\xBD"
                     "b\xEF\xBF\xBD");
    strbuf_fini(&b);
}
END_TEST

static const char *jsonw_text(struct strbuf *b, double d, bool f32)
{
    strbuf_reset(b);
    ck_assert_int_eq(jsonw_double(b, d, f32), 0);
    strbuf_terminate(b);
    return b->data;
}

/* Every double here needs the snprintf path (more than 6 decimals). */
static const double samples[] = { 1.0 / 3, -2.5e-7, 1e300, 123456.0000001, 0.1 + 0.2 };

START_TEST(test_lib__jsonw_floats_round_trip_with_a_point)
{
    struct strbuf b = { 0 };

    ck_assert_str_eq(jsonw_text(&b, 1.0, false), "1.0");
    ck_assert_str_eq(jsonw_text(&b, -0.0, false), "-0.0");
    ck_assert_str_eq(jsonw_text(&b, 0.1, false), "0.1");
    ck_assert_str_eq(jsonw_text(&b, 0.1f, true), "0.1");
    ck_assert_str_eq(jsonw_text(&b, 0.1 + 0.2, false), "0.30000000000000004");
    for (size_t i = 0; i < sizeof(samples) / sizeof(samples[0]); i++)
        ck_assert(strtod(jsonw_text(&b, samples[i], false), NULL) == samples[i]);
    ck_assert_int_eq(jsonw_double(&b, 1.0 / 0.0, false), JSONW_ENOTFINITE);
    strbuf_fini(&b);
}
END_TEST

/* libpolygw runs inside applications that may call setlocale(): a comma
 * decimal point must not reach the JSON. The comma locale is compiled
 * into a temporary directory with localedef from the locales package
 * (tests/deps.sh installs it); without it the test says so and checks
 * nothing more. */
START_TEST(test_lib__jsonw_floats_ignore_a_comma_locale)
{
    char dir[64], expect[8][48];
    struct strbuf b = { 0 };
    size_t n = sizeof(samples) / sizeof(samples[0]);

    for (size_t i = 0; i < n; i++)
        snprintf(expect[i], sizeof(expect[i]), "%s", jsonw_text(&b, samples[i], false));
    if (comma_locale_on("test_lib__jsonw_floats_ignore_a_comma_locale", dir, sizeof(dir)) == 0) {
        for (size_t i = 0; i < n; i++)
            ck_assert_str_eq(jsonw_text(&b, samples[i], false), expect[i]);
        ck_assert_str_eq(jsonw_text(&b, 2.5f, true), "2.5");
        ck_assert_str_eq(jsonw_text(&b, (double)(1.0f / 3), true), "0.33333334");
    }
    comma_locale_off(dir);
    strbuf_fini(&b);
}
END_TEST

START_TEST(test_lib__jsonw_strings_escape_and_refuse_bad_utf8)
{
    struct strbuf b = { 0 };
    size_t at = 0;

    ck_assert_int_eq(jsonw_str(&b, "a\"\\\n\x01\xE2\x82\xAC", 8, &at), 0);
    strbuf_terminate(&b);
    ck_assert_str_eq(b.data, "\"a\\\"\\\\\\n\\u0001\xE2\x82\xAC\"");
    strbuf_reset(&b);
    ck_assert_int_eq(jsonw_str(&b, "abcdefghij\xC0", 11, &at), JSONW_EBADUTF8);
    ck_assert_uint_eq(at, 10);
    strbuf_reset(&b);
    ck_assert_int_eq(jsonw_i64(&b, INT64_MIN), 0);
    ck_assert_int_eq(jsonw_u64(&b, UINT64_MAX), 0);
    strbuf_terminate(&b);
    ck_assert_str_eq(b.data, "-922337203685477580818446744073709551615");
    strbuf_fini(&b);
}
END_TEST

START_TEST(test_lib__iplit_parses_literals_and_refuses_names)
{
    unsigned char a[16];
    struct sockaddr_storage ss;
    socklen_t len = 0;

    ck_assert_int_eq(iplit_parse("10.1.2.3", 8, IPLIT_ANY, a), AF_INET);
    ck_assert_int_eq(a[0], 10);
    ck_assert_int_eq(a[3], 3);
    /* The length bounds the text: "10.1.2.3x" cut at 8 is the address. */
    ck_assert_int_eq(iplit_parse("10.1.2.3x", 8, IPLIT_V4, NULL), AF_INET);
    ck_assert_int_eq(iplit_parse("10.1.2.3x", 9, IPLIT_V4, NULL), 0);
    ck_assert_int_eq(iplit_parse("::1", 3, IPLIT_ANY, a), AF_INET6);
    ck_assert_int_eq(a[15], 1);
    ck_assert_int_eq(iplit_parse("::1", 3, IPLIT_V4, NULL), 0);
    ck_assert_int_eq(iplit_parse("1.2.3.4", 7, IPLIT_V6, NULL), 0);
    /* Brackets only when asked for, and then only around IPv6. */
    ck_assert_int_eq(iplit_parse("[::1]", 5, IPLIT_V6, NULL), 0);
    ck_assert_int_eq(iplit_parse("[::1]", 5, IPLIT_V6 | IPLIT_BRACKETS, NULL), AF_INET6);
    ck_assert_int_eq(iplit_parse("::1", 3, IPLIT_V6 | IPLIT_BRACKETS, NULL), 0);
    ck_assert_int_eq(iplit_parse("[1.2.3.4]", 9, IPLIT_ANY | IPLIT_BRACKETS, NULL), 0);
    ck_assert_int_eq(iplit_parse("1.2.3.4", 7, IPLIT_ANY | IPLIT_BRACKETS, NULL), AF_INET);
    /* Names, zone ids, empty text, an embedded NUL, overlong text. */
    ck_assert_int_eq(iplit_parse("localhost", 9, IPLIT_ANY, NULL), 0);
    ck_assert_int_eq(iplit_parse("fe80::1%eth0", 12, IPLIT_ANY, NULL), 0);
    ck_assert_int_eq(iplit_parse("", 0, IPLIT_ANY, NULL), 0);
    ck_assert_int_eq(iplit_parse("[]", 2, IPLIT_ANY | IPLIT_BRACKETS, NULL), 0);
    ck_assert_int_eq(iplit_parse("1.2.3.4\0", 8, IPLIT_ANY, NULL), 0);
    char big[100];
    memset(big, '1', sizeof(big));
    ck_assert_int_eq(iplit_parse(big, sizeof(big), IPLIT_ANY, NULL), 0);
    ck_assert(iplit_is("127.0.0.1"));
    ck_assert(!iplit_is("redis.example"));

    ck_assert_int_eq(iplit_sockaddr("[::1]", 5, IPLIT_ANY | IPLIT_BRACKETS, 8080, &ss, &len), 0);
    ck_assert_int_eq(ss.ss_family, AF_INET6);
    ck_assert_int_eq(len, sizeof(struct sockaddr_in6));
    ck_assert_int_eq(ntohs(((struct sockaddr_in6 *)&ss)->sin6_port), 8080);
    ck_assert_int_eq(iplit_sockaddr("127.0.0.1", 9, IPLIT_V4, 80, &ss, &len), 0);
    ck_assert_int_eq(ss.ss_family, AF_INET);
    ck_assert_int_eq(len, sizeof(struct sockaddr_in));
    ck_assert_int_eq(ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr), 0x7f000001);
    ck_assert_int_eq(iplit_sockaddr("example.com", 11, IPLIT_ANY, 80, &ss, &len), -1);
}
END_TEST

START_TEST(test_lib__str_setf_formats_cut_to_fit_and_skips_no_buffer)
{
    char e[8];

    str_setf(e, sizeof(e), "port %d is %s", 65535, "taken");
    ck_assert_str_eq(e, "port 65");
    str_setf(NULL, 10, "x %d", 1); /* no buffer: nothing happens */
    e[0] = 'z';
    str_setf(e, 0, "x %d", 1);
    ck_assert_int_eq(e[0], 'z');
}
END_TEST

START_TEST(test_lib__jsonw_escape_is_the_one_escape_table)
{
    char e[6];

    ck_assert_uint_eq(jsonw_escape('a', e), 0);
    ck_assert_uint_eq(jsonw_escape(0x7f, e), 0);
    ck_assert_uint_eq(jsonw_escape('"', e), 2);
    ck_assert(memcmp(e, "\\\"", 2) == 0);
    ck_assert_uint_eq(jsonw_escape('\\', e), 2);
    ck_assert(memcmp(e, "\\\\", 2) == 0);
    ck_assert_uint_eq(jsonw_escape('\b', e), 2);
    ck_assert(memcmp(e, "\\b", 2) == 0);
    ck_assert_uint_eq(jsonw_escape(0x1f, e), 6);
    ck_assert(memcmp(e, "\\u001f", 6) == 0);
}
END_TEST

START_TEST(test_lib__strbuf_cap_refuses_growth_past_the_limit)
{
    struct strbuf b;
    char big[300];

    memset(big, 'x', sizeof(big));
    strbuf_init_max(&b, 100);
    ck_assert_int_eq(strbuf_put(&b, big, 60), 0);
    ck_assert_int_eq(strbuf_put(&b, big, 40), 0); /* exactly the cap */
    ck_assert_uint_eq(b.len, 100);
    ck_assert_int_eq(strbuf_putc(&b, 'y'), STRBUF_ETOOBIG);
    ck_assert_int_eq(strbuf_put(&b, big, 1), STRBUF_ETOOBIG);
    ck_assert_uint_eq(b.len, 100); /* unchanged on failure */
    ck_assert_uint_le(b.cap, 101); /* never allocated past the cap */
    strbuf_terminate(&b);
    ck_assert_int_eq(b.data[100], '\0');
    /* Consumed bytes no longer count against the cap. */
    strbuf_consume(&b, 30);
    ck_assert_uint_eq(strbuf_live(&b), 70);
    ck_assert_int_eq(strbuf_put(&b, big, 30), 0);
    ck_assert_uint_eq(strbuf_live(&b), 100);
    ck_assert_int_eq(strbuf_put(&b, big, 1), STRBUF_ETOOBIG);
    /* A huge request is refused, not wrapped around. */
    ck_assert_int_eq(strbuf_reserve(&b, SIZE_MAX), STRBUF_ETOOBIG);
    ck_assert_int_eq(strbuf_set_exact(&b, big, 101), STRBUF_ETOOBIG);
    /* fini keeps the cap. */
    strbuf_fini(&b);
    ck_assert_uint_eq(b.max, 100);
    ck_assert_int_eq(strbuf_put(&b, big, 101), STRBUF_ETOOBIG);
    ck_assert_ptr_null(b.data);
}
END_TEST

START_TEST(test_lib__strbuf_consume_drops_a_prefix_and_reclaims_before_growing)
{
    struct strbuf b = { 0 };
    char chunk[512];

    for (size_t i = 0; i < sizeof(chunk); i++)
        chunk[i] = (char)('a' + i % 26);
    ck_assert_int_eq(strbuf_put(&b, chunk, 512), 0);
    ck_assert_int_eq(strbuf_put(&b, chunk, 400), 0);
    size_t cap = b.cap;
    char *mem = b.data;
    ck_assert_uint_eq(cap, 1024);
    /* Consuming is O(1): nothing moves. */
    strbuf_consume(&b, 500);
    ck_assert_ptr_eq(b.data, mem);
    ck_assert_uint_eq(strbuf_live(&b), 412);
    ck_assert_int_eq(strbuf_head(&b)[0], chunk[500]);
    /* 412 live + 500 more fits in 1024 once the prefix is reclaimed: no
     * reallocation, the live bytes moved to the front, in order. */
    ck_assert_int_eq(strbuf_put(&b, chunk, 500), 0);
    ck_assert_uint_eq(b.cap, cap);
    ck_assert_uint_eq(b.off, 0);
    ck_assert_uint_eq(b.len, 912);
    ck_assert(memcmp(b.data, chunk + 500, 12) == 0);
    ck_assert(memcmp(b.data + 12, chunk, 400) == 0);
    ck_assert(memcmp(b.data + 412, chunk, 500) == 0);
    /* Consuming everything empties the buffer at once, memory kept. */
    strbuf_consume(&b, 912);
    ck_assert_uint_eq(b.len, 0);
    ck_assert_uint_eq(b.off, 0);
    ck_assert_uint_eq(b.cap, cap);
    /* Growth past the capacity still keeps the live text. */
    ck_assert_int_eq(strbuf_put(&b, chunk, 512), 0);
    strbuf_consume(&b, 12);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(strbuf_put(&b, chunk, 512), 0);
    ck_assert_uint_eq(strbuf_live(&b), 500 + 4 * 512);
    ck_assert(memcmp(strbuf_head(&b), chunk + 12, 500) == 0);
    ck_assert(memcmp(strbuf_head(&b) + 500 + 3 * 512, chunk, 512) == 0);
    /* strbuf_fit gives back the consumed prefix too. */
    strbuf_consume(&b, 100);
    ck_assert_int_eq(strbuf_fit(&b), 0);
    ck_assert_uint_eq(b.off, 0);
    ck_assert_uint_eq(b.cap, b.len + 1);
    ck_assert(memcmp(b.data, chunk + 112, 400) == 0);
    strbuf_fini(&b);
}
END_TEST

Suite *lib_suite(void)
{
    Suite *s = suite_create("lib");
    TCase *tc = tcase_create("core");
    /* Megabyte inputs (and a locale compiled by localedef) under the
     * sanitizers on a loaded machine take longer than Check's 4 s default. */
    tcase_set_timeout(tc, 60);

    tcase_add_test(tc, test_lib__strbuf_grows_and_keeps_room_for_a_nul);
    tcase_add_test(tc, test_lib__strbuf_fit_gives_back_the_unused_capacity);
    tcase_add_test(tc, test_lib__strbuf_set_exact_allocates_the_size_of_the_text);
    tcase_add_test(tc, test_lib__dlist_push_and_unlink_anywhere);
    tcase_add_test(tc, test_lib__utf8_validates_cuts_and_repairs);
    tcase_add_test(tc, test_lib__jsonw_floats_round_trip_with_a_point);
    tcase_add_test(tc, test_lib__jsonw_floats_ignore_a_comma_locale);
    tcase_add_test(tc, test_lib__jsonw_strings_escape_and_refuse_bad_utf8);
    tcase_add_test(tc, test_lib__strbuf_cap_refuses_growth_past_the_limit);
    tcase_add_test(tc, test_lib__strbuf_consume_drops_a_prefix_and_reclaims_before_growing);
    tcase_add_test(tc, test_lib__iplit_parses_literals_and_refuses_names);
    tcase_add_test(tc, test_lib__jsonw_escape_is_the_one_escape_table);
    tcase_add_test(tc, test_lib__str_setf_formats_cut_to_fit_and_skips_no_buffer);
    suite_add_tcase(s, tc);
    return s;
}
