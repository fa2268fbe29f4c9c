/* test_sigv4.c — AWS Signature Version 4 against AWS's published test suite
 * ("Signature Version 4 test suite", AWS General Reference; the same
 * vectors ship in aws-sig-v4-test-suite): credentials AKIDEXAMPLE /
 * wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY, region us-east-1, service
 * "service", signed at 2015-08-30T12:36:00Z, host example.amazonaws.com.
 * Each case's expected signature is the suite's; the canonical requests
 * are the suite's .creq files where asserted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "upstream/sigv4.h"
#include "suites.h"

static const struct sigv4_creds SUITE_CREDS = { "AKIDEXAMPLE",
                                                "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", NULL };

static time_t suite_time(void)
{
    struct tm tm = { .tm_year = 115, .tm_mon = 7, .tm_mday = 30, .tm_hour = 12, .tm_min = 36 };
    return timegm(&tm);
}

static struct sigv4_request suite_req(const char *method, const char *path, const char *query)
{
    return (struct sigv4_request){ .method = method,
                                   .host = "example.amazonaws.com",
                                   .path = path,
                                   .query = query,
                                   .region = "us-east-1",
                                   .service = "service",
                                   .when = suite_time() };
}

#define SCOPE "AKIDEXAMPLE/20150830/us-east-1/service/aws4_request"

static void check_auth(const struct sigv4_request *r, const struct sigv4_creds *c,
                       const char *signed_headers, const char *signature)
{
    struct sigv4_out out;
    char want[512];

    strbuf_init(&out.authorization);
    ck_assert_int_eq(sigv4_sign(r, c, &out), 0);
    ck_assert_str_eq(out.amz_date, "20150830T123600Z");
    snprintf(want, sizeof(want),
             "AWS4-HMAC-SHA256 Credential=" SCOPE ", SignedHeaders=%s, Signature=%s",
             signed_headers, signature);
    ck_assert_str_eq(strbuf_head(&out.authorization), want);
    strbuf_fini(&out.authorization);
}

static void check_creq(const struct sigv4_request *r, const struct sigv4_creds *c, const char *want)
{
    struct strbuf creq, sh;
    strbuf_init(&creq);
    strbuf_init(&sh);
    ck_assert_int_eq(sigv4_canonical_request(r, c, &creq, &sh), 0);
    ck_assert_str_eq(strbuf_head(&creq), want);
    strbuf_fini(&creq);
    strbuf_fini(&sh);
}

#define EMPTY_HASH "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

START_TEST(get_vanilla)
{
    struct sigv4_request r = suite_req("GET", "/", NULL);
    check_creq(&r, &SUITE_CREDS,
               "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n"
               "host;x-amz-date\n" EMPTY_HASH);
    check_auth(&r, &SUITE_CREDS, "host;x-amz-date",
               "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
}
END_TEST

START_TEST(get_unreserved)
{
    struct sigv4_request r = suite_req(
        "GET", "/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", NULL);
    check_auth(&r, &SUITE_CREDS, "host;x-amz-date",
               "07ef7494c76fa4850883e2b006601f940f8a34d404d0cfa977f52a65bbf5f24f");
}
END_TEST

START_TEST(get_query_order_key_case)
{
    struct sigv4_request r = suite_req("GET", "/", "Param2=value2&Param1=value1");
    check_creq(&r, &SUITE_CREDS,
               "GET\n/\nParam1=value1&Param2=value2\nhost:example.amazonaws.com\n"
               "x-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" EMPTY_HASH);
    check_auth(&r, &SUITE_CREDS, "host;x-amz-date",
               "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500");
}
END_TEST

START_TEST(get_query_order_value)
{
    struct sigv4_request r = suite_req("GET", "/", "Param1=value2&Param1=value1");
    check_auth(&r, &SUITE_CREDS, "host;x-amz-date",
               "5772eed61e12b33fae39ee5e7012498b51d56abc0abb7c60486157bd471c4694");
}
END_TEST

START_TEST(get_utf8_query)
{
    /* The suite's request line holds the raw bytes; sent encoded, the same
     * query must sign the same. */
    struct sigv4_request raw = suite_req("GET", "/", "\xe1\x88\xb4=bar");
    struct sigv4_request enc = suite_req("GET", "/", "%E1%88%B4=bar");
    const char *sig = "2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04";
    check_auth(&raw, &SUITE_CREDS, "host;x-amz-date", sig);
    check_auth(&enc, &SUITE_CREDS, "host;x-amz-date", sig);
}
END_TEST

START_TEST(get_header_value_order)
{
    const char *h[] = { "My-Header1: value4", "My-Header1: value1", "My-Header1: value3",
                        "My-Header1: value2" };
    struct sigv4_request r = suite_req("GET", "/", NULL);
    r.headers = h;
    r.n_headers = 4;
    check_creq(&r, &SUITE_CREDS,
               "GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value4,value1,value3,value2\n"
               "x-amz-date:20150830T123600Z\n\nhost;my-header1;x-amz-date\n" EMPTY_HASH);
    check_auth(&r, &SUITE_CREDS, "host;my-header1;x-amz-date",
               "08c7e5a9acfcfeb3ab6b2185e75ce8b1deb5e634ec47601a50643f830c755c01");
}
END_TEST

START_TEST(get_header_key_duplicate)
{
    const char *h[] = { "My-Header1: value2", "My-Header1: value2", "My-Header1: value1" };
    struct sigv4_request r = suite_req("GET", "/", NULL);
    r.headers = h;
    r.n_headers = 3;
    check_auth(&r, &SUITE_CREDS, "host;my-header1;x-amz-date",
               "c9d5ea9f3f72853aea855b47ea873832890dbdd183b4468f858259531a5138ea");
}
END_TEST

START_TEST(get_header_value_trim)
{
    const char *h[] = { "My-Header1:  value1", "My-Header2: \"a   b   c\"" };
    struct sigv4_request r = suite_req("GET", "/", NULL);
    r.headers = h;
    r.n_headers = 2;
    check_creq(&r, &SUITE_CREDS,
               "GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value1\nmy-header2:\"a b c\"\n"
               "x-amz-date:20150830T123600Z\n\nhost;my-header1;my-header2;x-amz-date\n" EMPTY_HASH);
    check_auth(&r, &SUITE_CREDS, "host;my-header1;my-header2;x-amz-date",
               "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736");
}
END_TEST

START_TEST(post_x_www_form_urlencoded)
{
    const char *h[] = { "Content-Type: application/x-www-form-urlencoded" };
    struct sigv4_request r = suite_req("POST", "/", NULL);
    r.headers = h;
    r.n_headers = 1;
    r.body = "Param1=value1";
    r.body_len = 13;
    check_creq(&r, &SUITE_CREDS,
               "POST\n/\n\ncontent-type:application/x-www-form-urlencoded\n"
               "host:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n"
               "content-type;host;x-amz-date\n"
               "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e");
    struct strbuf sts;
    strbuf_init(&sts);
    ck_assert_int_eq(sigv4_string_to_sign(&r, &SUITE_CREDS, &sts), 0);
    ck_assert_str_eq(strbuf_head(&sts),
                     "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
                     "42a5e5bb34198acb3e84da4f085bb7927f2bc277ca766e6d19c73c2154021281");
    strbuf_fini(&sts);
    check_auth(&r, &SUITE_CREDS, "content-type;host;x-amz-date",
               "ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a");
}
END_TEST

START_TEST(session_token)
{
    struct sigv4_creds c = SUITE_CREDS;
    c.session_token = "6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267";
    struct sigv4_request r = suite_req("GET", "/", NULL);
    check_auth(&r, &c, "host;x-amz-date;x-amz-security-token",
               "07ec1639c89043aa0e3e2de82b96708f198cceab042d4a97044c66dd9f74e7f8");
}
END_TEST

START_TEST(path_is_encoded_once_more)
{
    /* Not S3: the path as sent is encoded again, so a model id's %3A signs
     * as %253A, and a raw space as %20. */
    struct sigv4_request r =
        suite_req("POST", "/model/anthropic.claude-3-haiku-20240307-v1%3A0/invoke", NULL);
    struct strbuf creq, sh;
    strbuf_init(&creq);
    strbuf_init(&sh);
    ck_assert_int_eq(sigv4_canonical_request(&r, &SUITE_CREDS, &creq, &sh), 0);
    ck_assert_ptr_nonnull(
        strstr(strbuf_head(&creq), "\n/model/anthropic.claude-3-haiku-20240307-v1%253A0/invoke\n"));
    strbuf_fini(&creq);
    strbuf_fini(&sh);
}
END_TEST

START_TEST(query_edge_cases)
{
    static const struct {
        const char *q, *want;
    } cases[] = {
        { "a=10&a=9", "a=10&a=9" }, { "x=a.b&x=a%2Fb", "x=a%2Fb&x=a.b" },
        { "a=1&a=1", "a=1&a=1" },   { "q=a+b", "q=a%2Bb" },
        { "q=a%20b", "q=a%20b" },   { "b&a=1", "a=1&b=" },
        { "a=1=2", "a=1%3D2" },     { "&&a=1&", "a=1" },
        { "p=%zz", "p=%25zz" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sigv4_request r = suite_req("GET", "/", cases[i].q);
        struct strbuf creq, sh;
        strbuf_init(&creq);
        strbuf_init(&sh);
        ck_assert_int_eq(sigv4_canonical_request(&r, &SUITE_CREDS, &creq, &sh), 0);
        const char *line = strchr(strchr(strbuf_head(&creq), '\n') + 1, '\n') + 1;
        ck_assert_msg(strncmp(line, cases[i].want, strlen(cases[i].want)) == 0 &&
                          line[strlen(cases[i].want)] == '\n',
                      "query %s: got %.40s", cases[i].q, line);
        strbuf_fini(&creq);
        strbuf_fini(&sh);
    }
}
END_TEST

START_TEST(header_without_colon_refused)
{
    const char *h[] = { "no colon here" };
    struct sigv4_request r = suite_req("GET", "/", NULL);
    r.headers = h;
    r.n_headers = 1;
    struct sigv4_out out;
    strbuf_init(&out.authorization);
    ck_assert_int_eq(sigv4_sign(&r, &SUITE_CREDS, &out), -1);
    strbuf_fini(&out.authorization);
}
END_TEST

Suite *sigv4_suite(void)
{
    Suite *s = suite_create("sigv4");
    TCase *tc = tcase_create("suite");
    tcase_add_test(tc, get_vanilla);
    tcase_add_test(tc, get_unreserved);
    tcase_add_test(tc, get_query_order_key_case);
    tcase_add_test(tc, get_query_order_value);
    tcase_add_test(tc, get_utf8_query);
    tcase_add_test(tc, get_header_value_order);
    tcase_add_test(tc, get_header_key_duplicate);
    tcase_add_test(tc, get_header_value_trim);
    tcase_add_test(tc, post_x_www_form_urlencoded);
    tcase_add_test(tc, session_token);
    suite_add_tcase(s, tc);
    tc = tcase_create("rules");
    tcase_add_test(tc, path_is_encoded_once_more);
    tcase_add_test(tc, query_edge_cases);
    tcase_add_test(tc, header_without_colon_refused);
    suite_add_tcase(s, tc);
    return s;
}
